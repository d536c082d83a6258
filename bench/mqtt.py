#!/usr/bin/env python3
"""The embedded MQTT broker against mosquitto (Debian's), same machine, same run, loopback.

    cargo build --release && cargo build --release --example mqtt_bench
    python3 bench/mqtt.py [--bin target/release/sitegate] [--client target/release/examples/mqtt_bench]
                          [--seconds 10] [--repeat 1] [--churn-rounds 5] [--smoke]

Each broker runs pinned to CPU 0 (taskset), the load (examples/mqtt_bench.rs, rumqttc on one
tokio thread, TCP_NODELAY set) to CPU 1. Runs: one publisher to 1 and to 10 subscribers,
200-byte payloads, QoS 0 and 1, at fixed rates and flat out (the flat-out runs again with the
client's Nagle algorithm on); one-way latency as measured (p50/p99, no correction). Memory
(measured first, on the fresh broker): RSS of the broker process idle, with 1,000 idle
subscribed connections, after they disconnect, and after five rounds of 1,000 connects and
disconnects (churn); then again after the message runs. For sitegate the RSS is the whole
appliance (HTTP API, SQLite, location engine) with the broker.
mosquitto runs twice: as Debian configures it, and with `set_tcp_nodelay true`, which sitegate's
broker always does (better latency, a lower rate flat out: the two show what each side of that
trade gives). With --repeat N every message run is made N times, the brokers taking turns
(each round starts with the next one), and each cell is the median of the N with the range
beside it; latency percentiles of single 5-10 s runs move by tens of percent from run to run
on this machine, so one round does not tell a p99 apart. Memory is measured in the first
round only.
Prints Markdown tables with sitegate / mosquitto ratios. Python standard library only.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Mosquitto:
    name = "mosquitto"

    def __init__(self, work, nodelay=False):
        self.port = free_port()
        self.nodelay = nodelay
        conf = os.path.join(work, "mosquitto.conf")
        user = os.environ.get("USER") or "root"
        with open(conf, "w") as f:
            # set_tcp_nodelay is off by default: mosquitto then lets Nagle's algorithm hold a
            # subscriber's small messages back while an earlier one waits for its ACK.
            f.write(f"set_tcp_nodelay {'true' if nodelay else 'false'}\n"
                    f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    f"max_queued_messages 100000\nuser {user}\n")
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "-c", conf],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        self.user, self.password = "bench", "bench"

    def version(self):
        out = subprocess.run([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-h"], capture_output=True, text=True)
        v = (out.stdout.splitlines() or [""])[0]
        return f"{v} (set_tcp_nodelay true)" if self.nodelay else v

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Sitegate:
    name = "sitegate"

    def __init__(self, work, binary):
        self.port = free_port()
        http = free_port()
        conf = os.path.join(work, "config.toml")
        with open(conf, "w") as f:
            f.write(f'[http]\nlisten = "127.0.0.1:{http}"\n[store]\npath = "{work}/sitegate.db"\n'
                    f'[log]\nlevel = "warn"\n[location]\nscan = "off"\n'
                    f'[mqtt]\nlisten = "127.0.0.1:{self.port}"\nconnections_max = 10000\nclient_queue_max = 100000\n'
                    f'[[organizations]]\nid = "acme"\nname = "Acme"\n')
        self.user = "bench"
        self.password = subprocess.run([binary, "mqtt-user", "add", "--config", conf, "--org", "acme",
                                        "--username", "bench"], capture_output=True, text=True,
                                       check=True).stdout.strip()
        self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", conf],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if "mqtt=" not in line:
            raise RuntimeError(f"sitegate did not start: {line!r}")
        wait_port(self.port)

    def version(self):
        return "sitegate (rmqtt 0.24.0 embedded)"

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def client(args, broker, *rest, timeout=400):
    cmd = ["taskset", "-c", "1", args.client, rest[0], "127.0.0.1", str(broker.port), broker.user,
           broker.password, "acme/bench"] + [str(x) for x in rest[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def pubsub(args, broker, subs, rate, qos, nagle):
    extra = ["nagle"] if nagle else []
    out = client(args, broker, "pubsub", subs, rate, args.seconds, qos, *extra)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"mqtt_bench failed: {out.stderr[-500:]}")
    return json.loads(lines[-1])


def median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def cell(runs, key):
    """The median of one figure over the rounds, with its range when there is more than one."""
    xs = [r[key] for r in runs]
    if len(xs) == 1:
        return f"{xs[0]:,.0f}"
    return f"{median(xs):,.0f} [{min(xs):,.0f}–{max(xs):,.0f}]"


def idle_memory(args, broker, n, hold_s):
    """RSS idle, with n idle subscribed connections, after they left, after churn rounds."""
    pid = broker.proc.pid
    idle = rss_kb(pid)
    proc = subprocess.Popen(["taskset", "-c", "1", args.client, "idle", "127.0.0.1", str(broker.port), broker.user,
                             broker.password, "acme/bench", str(n), str(hold_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    proc.stdout.readline()  # connected
    time.sleep(2)
    loaded = rss_kb(pid)
    proc.wait(timeout=hold_s + 120)
    time.sleep(3)
    after = rss_kb(pid)
    churn = []
    for _ in range(args.churn_rounds):
        client(args, broker, "idle", n, 1, timeout=300)
        time.sleep(2)
        churn.append(rss_kb(pid))
    return {"idle_kb": idle, "loaded_kb": loaded, "after_kb": after, "churn_kb": churn}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/sitegate"))
    ap.add_argument("--client", default=os.path.join(ROOT, "target/release/examples/mqtt_bench"))
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny runs: checks that the harness works")
    ap.add_argument("--churn-rounds", type=int, default=5, help="rounds of 1,000 connects and disconnects")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the message runs, brokers taking turns")
    args = ap.parse_args()
    # The last four are flat out: offered above what either broker carries on this machine
    # (mosquitto about 370,000/s at QoS 0 and 133,000/s at QoS 1 on a fast day), so the
    # publisher is held back by the broker, not by its own pace.
    # The client sets TCP_NODELAY, as a latency-minded client does; the flat-out runs are made
    # again with Nagle's algorithm on (rumqttc's default), which batches a QoS 1 subscriber's
    # PUBACKs and so changes how fast a broker can deliver to it.
    runs = [(1, 10000, 0, False), (10, 5000, 0, False), (1, 10000, 1, False), (10, 2000, 1, False),
            (1, 1000000, 0, False), (1, 400000, 1, False), (1, 1000000, 0, True), (1, 400000, 1, True)]
    conns = 1000
    if args.smoke:
        args.seconds, args.churn_rounds = 1, 1
        runs = [(1, 1000, 0, False), (2, 500, 1, True)]
        conns = 50
    results = {}
    for round_no in range(args.repeat):
        kinds = ("mosquitto", "mosquitto-nodelay", "sitegate")
        kinds = kinds[round_no % 3:] + kinds[:round_no % 3]
        for kind in kinds:
            work = tempfile.mkdtemp(prefix=f"mqttbench-{kind}-")
            if kind == "sitegate":
                broker = Sitegate(work, args.bin)
            else:
                broker = Mosquitto(work, nodelay=kind == "mosquitto-nodelay")
            try:
                time.sleep(2)
                r = results.setdefault(kind, {"version": broker.version(), "rounds": []})
                if round_no == 0 and kind != "mosquitto-nodelay":
                    # Memory first, on the fresh broker; then the message runs.
                    r["memory"] = idle_memory(args, broker, conns, 10 if not args.smoke else 1)
                    print(kind, json.dumps(r["memory"]), file=sys.stderr, flush=True)
                runs_done = []
                for subs, rate, qos, nagle in runs:
                    res = pubsub(args, broker, subs, rate, qos, nagle)
                    res.update({"subs": subs, "rate": rate, "qos": qos, "nagle": nagle})
                    runs_done.append(res)
                    print(kind, round_no, json.dumps(res), file=sys.stderr, flush=True)
                r["rounds"].append(runs_done)
                if round_no == 0:
                    r["after_runs_kb"] = rss_kb(broker.proc.pid)
            finally:
                broker.stop()
                shutil.rmtree(work, ignore_errors=True)

    m, s, nd = results["mosquitto"], results["sitegate"], results["mosquitto-nodelay"]
    n = args.repeat
    each = f"median of {n} runs each, the range in brackets, " if n > 1 else ""
    print(f"\n{s['version']} vs {m['version']}, by default and with set_tcp_nodelay true (\"nodelay\"; "
          f"sitegate always sets TCP_NODELAY), {args.seconds} s per run, {each}broker on CPU 0, load on CPU 1\n")
    print("| run | delivered/s sitegate | mosquitto | mosquitto nodelay | ratio to mosquitto / nodelay "
          "| p50 µs sitegate / mosquitto / nodelay | p99 µs sitegate / mosquitto / nodelay "
          "| lost sitegate / mosquitto / nodelay (most in one run) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (subs, rate, qos, nagle) in enumerate(runs):
        a, b, c = ([rnd[i] for rnd in r["rounds"]] for r in (s, m, nd))
        label = f"QoS {qos}, 1 → {subs}, {rate:,}/s offered" + (", client with Nagle" if nagle else "")
        da, db, dc = (median([x["delivered_per_s"] for x in xs]) for xs in (a, b, c))
        ratio = lambda peer: f"{da / peer:.2f}" if peer else "-"
        lost = lambda xs: max(x["expected"] - x["received"] for x in xs)
        print(f"| {label} | {cell(a, 'delivered_per_s')} | {cell(b, 'delivered_per_s')} | "
              f"{cell(c, 'delivered_per_s')} | {ratio(db)} / {ratio(dc)} | "
              f"{cell(a, 'p50_us')} / {cell(b, 'p50_us')} / {cell(c, 'p50_us')} | "
              f"{cell(a, 'p99_us')} / {cell(b, 'p99_us')} / {cell(c, 'p99_us')} | "
              f"{lost(a):,} / {lost(b):,} / {lost(c):,} |")
    print()
    print(f"| RSS (MB) | sitegate | mosquitto |")
    print("|---|---|---|")
    for key, label in (("idle_kb", "idle"), ("loaded_kb", f"{conns} idle connections"), ("after_kb", "after they left")):
        print(f"| {label} | {s['memory'][key] / 1024:.1f} | {m['memory'][key] / 1024:.1f} |")
    churn = lambda r: " → ".join(f"{v / 1024:.1f}" for v in r["memory"]["churn_kb"])
    print(f"| after each round of {conns} connects and disconnects | {churn(s)} | {churn(m)} |")
    print(f"| after the message runs above | {s['after_runs_kb'] / 1024:.1f} | {m['after_runs_kb'] / 1024:.1f} |")
    per = lambda r: (r["memory"]["loaded_kb"] - r["memory"]["idle_kb"]) / conns
    print(f"\nPer idle connection: sitegate {per(s):.1f} KB, mosquitto {per(m):.1f} KB.")


if __name__ == "__main__":
    main()
