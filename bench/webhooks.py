#!/usr/bin/env python3
"""API write throughput with 0 and with 10 active webhooks, and the delivery rate to a fast
local receiver.

    cargo build --release
    python3 bench/webhooks.py [--bin target/release/sitegate] [--seconds 10] [--clients 8]
                              [--dead-receiver [--wrk]]

Creates contacts from N keep-alive clients for a fixed time, first with no hooks, then with
10 active items.create hooks (JSON, signed) pointing at a local receiver that answers 200 at
once; then waits until the outbox is drained, and times the drain of a batch written while the
receiver held its answers (the delivery rate with no API load beside it). With
--dead-receiver the hooks point at a closed port: the second phase measures writing the outbox
alone. --wrk takes the load from wrk on CPU 1 with the service pinned to CPU 0. Prints the CPU
time the service and the receiver used in each phase. Python standard library only; the
receiver runs in a separate process so it does not share the GIL with the load generator.
"""

import argparse
import http.client
import http.server
import json
import multiprocessing
import os
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from reports import start  # noqa: E402


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    release = None  # multiprocessing.Event: answers wait until it is set

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.release.wait()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def receive(port_queue, release):
    Receiver.release = release
    server = ThreadingServer(("127.0.0.1", 0), Receiver)
    port_queue.put(server.server_address[1])
    server.serve_forever()


def load(port, auth, seconds, clients):
    """Creates contacts from `clients` threads for `seconds`; returns creates per second."""
    stop = time.time() + seconds
    counts = [0] * clients

    def run(i):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        body = json.dumps({"firstname": "Load", "lastname": f"T{i}"})
        while time.time() < stop:
            conn.request("POST", "/contacts", body, {"Authorization": auth, "Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 201:
                raise RuntimeError(f"create: {r.status}")
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.time() - started), sum(counts)


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '{"firstname": "Load", "lastname": "W"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "%s"
"""


def load_wrk(port, auth, seconds, clients, workdir):
    """The same load from wrk (one thread, `clients` connections) pinned to CPU 1."""
    script = os.path.join(workdir, "create.lua")
    with open(script, "w") as f:
        f.write(WRK_SCRIPT % auth)
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{clients}", f"-d{seconds:.0f}s", "-s", script,
                          f"http://127.0.0.1:{port}/contacts"], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"create failed under wrk:\n{out}")
    total = int(re.search(r"(\d+) requests in", out).group(1))
    return float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1)), total


def cpu_seconds(pid):
    """User plus system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health(port):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", "/health", headers={"Accept": "application/json"})
    return json.loads(conn.getresponse().read())["webhooks"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sitegate")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--hooks", type=int, default=10)
    ap.add_argument("--wrk", action="store_true",
                    help="load from wrk pinned to CPU 1, the service pinned to CPU 0 (with --dead-receiver)")
    ap.add_argument("--dead-receiver", action="store_true",
                    help="point the hooks at a closed port: measures writing the outbox alone")
    args = ap.parse_args()
    ports = multiprocessing.Queue()
    release = multiprocessing.Event()
    release.set()
    receiver = multiprocessing.Process(target=receive, args=(ports, release), daemon=True)
    receiver.start()
    rport = ports.get(timeout=10)
    workdir = tempfile.mkdtemp(prefix="sitegate-bench-")
    # A backlog limit above anything the run queues, so that no hook is paused mid-run.
    proc, port, auth = start(os.path.abspath(args.bin), workdir, "[webhooks]\nbacklog_max = 10000000\nlocal_targets = true\n")
    try:
        if args.wrk:
            subprocess.run(["taskset", "-a", "-p", "-c", "0", str(proc.pid)], check=True, capture_output=True)
            run_load = lambda: load_wrk(port, auth, args.seconds, args.clients, workdir)  # noqa: E731
        else:
            run_load = lambda: load(port, auth, args.seconds, args.clients)  # noqa: E731
        cpu = cpu_seconds(proc.pid)
        rate0, n0 = run_load()
        cpu0 = cpu_seconds(proc.pid) - cpu
        print(f"no hooks: {rate0:.0f} creates/s ({n0} in {args.seconds:.0f} s, {args.clients} clients); "
              f"service CPU {cpu0:.1f} s")
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for i in range(args.hooks):
            target = 9 if args.dead_receiver else rport
            hook = {"title": f"h{i}", "event": "items.create", "url": f"http://127.0.0.1:{target}/in/{i}",
                    "contenttype": "json", "secret": "benchmark-secret"}
            conn.request("POST", "/hooks", json.dumps(hook),
                         {"Authorization": auth, "Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == 201, r.status
        cpu, rcpu = cpu_seconds(proc.pid), cpu_seconds(receiver.pid)
        rate1, n1 = run_load()
        cpu1, rcpu1 = cpu_seconds(proc.pid) - cpu, cpu_seconds(receiver.pid) - rcpu
        h = health(port)
        print(f"{args.hooks} hooks: {rate1:.0f} creates/s ({n1} creates, {n1 * args.hooks} deliveries queued); "
              f"ratio {rate1 / rate0:.2f}; service CPU {cpu1:.1f} s, receiver CPU {rcpu1:.1f} s; "
              f"pending {h['pending']}, paused hooks {h['paused']}")
        if args.dead_receiver:
            return
        started = time.time()
        while True:
            h = health(port)
            if h["pending"] == 0:
                break
            time.sleep(0.2)
        drained = time.time() - started
        print(f"outbox drained {drained:.1f} s after the load; failed {h['failed']}")
        # Delivery rate on its own: the receiver holds its answers while a batch is written, so
        # the batch waits in the outbox; then it answers and the drain is timed with no API load.
        release.clear()
        _, n2 = load(port, auth, 2, 2)
        queued = health(port)["pending"]
        cpu, rcpu = cpu_seconds(proc.pid), cpu_seconds(receiver.pid)
        started = time.time()
        release.set()
        while health(port)["pending"] > 0:
            time.sleep(0.02)
        took = time.time() - started
        cpu2, rcpu2 = cpu_seconds(proc.pid) - cpu, cpu_seconds(receiver.pid) - rcpu
        print(f"delivery: {queued} queued deliveries (of {n2 * args.hooks}) drained in {took:.1f} s "
              f"(~{queued / max(took, 0.001):.0f} deliveries/s); service CPU {cpu2:.1f} s, receiver CPU {rcpu2:.1f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        receiver.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
