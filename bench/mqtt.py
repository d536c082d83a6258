#!/usr/bin/env python3
"""The embedded MQTT broker against mosquitto (Debian's), same machine, same run, loopback.

    cargo build --release && cargo build --release --example mqtt_bench
    python3 bench/mqtt.py [--bin target/release/sitegate] [--client target/release/examples/mqtt_bench]
                          [--seconds 10] [--churn-rounds 5] [--smoke]

Each broker runs pinned to CPU 0 (taskset), the load (examples/mqtt_bench.rs, rumqttc on one
tokio thread) to CPU 1. Runs: one publisher to 1 and to 10 subscribers, 200-byte payloads,
QoS 0 and 1, at fixed rates and flat out; one-way latency as measured (p50/p99, no
correction). Memory (measured first, on the fresh broker): RSS of the broker process idle, with 1,000 idle
subscribed connections, after they disconnect, and after five rounds of 1,000 connects and
disconnects (churn); then again after the message runs. For
sitegate the RSS is the whole appliance (HTTP API, SQLite, location engine) with the broker.
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

    def __init__(self, work):
        self.port = free_port()
        conf = os.path.join(work, "mosquitto.conf")
        user = os.environ.get("USER") or "root"
        with open(conf, "w") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    f"max_queued_messages 100000\nuser {user}\n")
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "-c", conf],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        self.user, self.password = "bench", "bench"

    def version(self):
        out = subprocess.run([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-h"], capture_output=True, text=True)
        return (out.stdout.splitlines() or [""])[0]

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


def pubsub(args, broker, subs, rate, qos):
    out = client(args, broker, "pubsub", subs, rate, args.seconds, qos)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"mqtt_bench failed: {out.stderr[-500:]}")
    return json.loads(lines[-1])


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
    args = ap.parse_args()
    # The last two are flat out: offered above what either broker carries on this machine
    # (mosquitto about 370,000/s at QoS 0 and 133,000/s at QoS 1 on a fast day), so the
    # publisher is held back by the broker, not by its own pace.
    runs = [(1, 10000, 0), (10, 5000, 0), (1, 10000, 1), (10, 2000, 1), (1, 1000000, 0), (1, 400000, 1)]
    conns = 1000
    if args.smoke:
        args.seconds, args.churn_rounds = 1, 1
        runs = [(1, 1000, 0), (2, 500, 1)]
        conns = 50
    results = {}
    for kind in ("mosquitto", "sitegate"):
        work = tempfile.mkdtemp(prefix=f"mqttbench-{kind}-")
        broker = Mosquitto(work) if kind == "mosquitto" else Sitegate(work, args.bin)
        try:
            time.sleep(2)
            r = {"version": broker.version(), "runs": []}
            # Memory first, on the fresh broker; then the message runs.
            r["memory"] = idle_memory(args, broker, conns, 10 if not args.smoke else 1)
            print(kind, json.dumps(r["memory"]), file=sys.stderr, flush=True)
            for subs, rate, qos in runs:
                res = pubsub(args, broker, subs, rate, qos)
                res.update({"subs": subs, "rate": rate, "qos": qos})
                r["runs"].append(res)
                print(kind, json.dumps(res), file=sys.stderr, flush=True)
            r["after_runs_kb"] = rss_kb(broker.proc.pid)
            results[kind] = r
        finally:
            broker.stop()
            shutil.rmtree(work, ignore_errors=True)

    m, s = results["mosquitto"], results["sitegate"]
    print(f"\n{s['version']} vs {m['version']}, {args.seconds} s per run, broker on CPU 0, load on CPU 1\n")
    print("| run | delivered/s sitegate | mosquitto | ratio | p50 µs sitegate / mosquitto | p99 µs sitegate / mosquitto | lost sitegate / mosquitto |")
    print("|---|---|---|---|---|---|---|")
    for a, b in zip(s["runs"], m["runs"]):
        label = f"QoS {a['qos']}, 1 → {a['subs']}, {a['rate']:,}/s offered"
        ratio = a["delivered_per_s"] / b["delivered_per_s"] if b["delivered_per_s"] else 0
        print(f"| {label} | {a['delivered_per_s']:,.0f} | {b['delivered_per_s']:,.0f} | {ratio:.2f} | "
              f"{a['p50_us']:,.0f} / {b['p50_us']:,.0f} | {a['p99_us']:,.0f} / {b['p99_us']:,.0f} | "
              f"{a['expected'] - a['received']:,} / {b['expected'] - b['received']:,} |")
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
