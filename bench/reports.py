#!/usr/bin/env python3
"""Report latency with many activities: seeds a fresh sitegate through its API (10,000
contacts, 100,000 activities by default), then times each activity report.

    cargo build --release
    python3 bench/reports.py [--bin target/release/sitegate] [--records 10000] [--runs 50]

Prints a Markdown table of p50/p99 latency per report (sequential requests, keep-alive, one
client), the seeding rate, and the database size. Python standard library only.
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date, timedelta


def start(binary, workdir, extra_config=""):
    with open(os.path.join(workdir, "config.toml"), "w") as f:
        f.write('[http]\nlisten = "127.0.0.1:0"\nworkers = 4\n[api]\nquota_calls_per_hour = 100000000\n'
                '[log]\nlevel = "warn"\n' + extra_config)
    proc = subprocess.Popen([binary, "serve", "--config", "config.toml"], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = proc.stdout.readline()
    port = int(re.search(r"http=127\.0\.0\.1:(\d+)", ready).group(1))
    token = None
    deadline = time.time() + 30
    while token is None and time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"admin token: (\w+)", line)
        if m:
            token = m.group(1)
    threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
    auth = "Basic " + base64.b64encode(f"admin@sitegate.local:{token}".encode()).decode()
    return proc, port, auth


class Client:
    def __init__(self, port, auth):
        self.conn = http.client.HTTPConnection("127.0.0.1", port)
        self.auth = auth

    def call(self, method, path, body=None):
        return json.loads(self.raw(method, path, body))

    def raw(self, method, path, body=None):
        headers = {"Authorization": self.auth, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, data, headers)
        r = self.conn.getresponse()
        payload = r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {payload[:200]}")
        return payload


def seed_record(client, i, today):
    """One contact with ten activities."""
    d = lambda n: (today + timedelta(days=n)).isoformat()
    rid = client.call("POST", "/contacts", {"firstname": f"F{i}", "lastname": f"L{i}"})["item"]["id"]
    act = lambda seg, parent, data: client.call("POST", f"/contacts/{seg}", {"parent": parent, "data": data})["id"]
    lst = act("tasklist", rid, {"title": "List", "milestonedate": d(i % 60)})
    for k in range(3):
        act("task", lst, {"title": f"T{k}", "duedate": d((i + k * 7) % 90 - 30), "assignedto": 1 if k == 0 else ""})
    act("note", rid, {"details": f"note {i}"})
    act("followup", rid, {"details": "call", "duedate": d(i % 40 - 10)})
    act("opportunity", rid, {"description": "deal", "status": ["Pending", "Won", "Lost"][i % 3],
                             "closingdate": d(i % 120 - 60), "responsible": 1})
    call = act("call", rid, {"details": "visit"})
    act("timerecord", call, {"date": d(-(i % 60)), "hours": 1, "billable": i % 2})
    act("comment", lst, {"post": "ok"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sitegate")
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the database directory")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="sitegate-bench-")
    proc, port, auth = start(os.path.abspath(args.bin), workdir)
    try:
        today = date.today()
        started = time.time()
        local = threading.local()

        def work(i):
            if not hasattr(local, "client"):
                local.client = Client(port, auth)
            seed_record(local.client, i, today)

        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(work, range(args.records)))
        seeded = time.time() - started
        items = args.records * 11
        print(f"seeded {args.records} records and {args.records * 10} activities in {seeded:.1f} s "
              f"({items / seeded:.0f} creates/s, {args.threads} clients)")
        db = os.path.join(workdir, "data", "sitegate.db")
        size = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
        print(f"database: {size / 1e6:.1f} MB")

        t0, t1 = today - timedelta(days=7), today
        reports = [
            ("nextactions", "/report/nextactions"),
            ("nextactions due=next7", "/report/nextactions?due=next7"),
            ("nextactions filter=1 due=now", "/report/nextactions?filter=1&due=now"),
            ("followups due=next7", "/report/followups?due=next7"),
            ("opportunities status=won", "/report/opportunities?status=won"),
            ("activities (last 7 days)", f"/report/activities?start={t0}&end={t1}&limit=500"),
            ("activities types=3 itemsdata=1", f"/report/activities?types=3&start={t0}&end={t1}&itemsdata=1&limit=100"),
            ("timetracking (last 7 days)", f"/report/timetracking?start={t0}&end={t1}"),
            ("calendar (next 30 days)", "/report/calendar"),
        ]
        client = Client(port, auth)
        print()
        print("| report | rows (page / matching) | p50 ms | p99 ms |")
        print("|---|---|---|---|")
        for name, path in reports:
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                payload = client.raw("GET", path)
                times.append((time.perf_counter() - t) * 1000)
            v = json.loads(payload)
            key = next(k for k in v if k not in ("count", "status"))
            times.sort()
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(f"| {name} | {len(v[key])} / {v['count']} | {statistics.median(times):.1f} | {p99:.1f} |")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
