#!/usr/bin/env python3
"""One batch of 100 GETs against 100 separate keep-alive GETs, in the same run.

    cargo build --release
    python3 bench/batch.py [--bin target/release/sitegate] [--seconds 10] [--connections 1 8]

Seeds 100 contacts, then loads the service with wrk (pinned to CPU 1; the service pinned to
CPU 0) twice per connection count: GET /contacts/{id} over kept-alive connections (cycling
through the 100 ids), and POST /batch holding the same 100 GETs. Prints GETs answered per
second both ways, their ratio, and wrk's mean latency (per request; per batch = per 100 GETs).
Needs wrk and taskset; Python standard library otherwise.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reports import Client, start  # noqa: E402

BOUNDARY = "====1340674896==="

SEPARATE = """
local ids = {%s}
local i = 0
request = function()
  i = i %% #ids + 1
  return wrk.format("GET", "/contacts/" .. ids[i], {["Authorization"] = "%s", ["Accept"] = "application/json"})
end
"""

BATCH = """
wrk.method = "POST"
wrk.body = %s
wrk.headers["Content-Type"] = "multipart/mixed; boundary=%s"
wrk.headers["Authorization"] = "%s"
wrk.headers["Accept"] = "application/json"
"""


def batch_body(ids):
    parts = []
    for i in ids:
        parts.append(f"--{BOUNDARY}\r\nContent-Type: application/http\r\n\r\nGET /contacts/{i} HTTP/1.1\r\n\r\n")
    return "".join(parts) + f"--{BOUNDARY}--\r\n"


def lua_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n") + '"'


def wrk(port, script, seconds, connections, path):
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds:.0f}s",
                          "--latency", "-s", script, f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"failed requests under wrk:\n{out}")
    rate = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))
    m = re.search(r"Latency\s+([\d.]+)(us|ms|s)\b", out)
    mean_ms = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    return rate, mean_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sitegate")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="sitegate-bench-")
    proc, port, auth = start(os.path.abspath(args.bin), workdir)
    try:
        subprocess.run(["taskset", "-a", "-p", "-c", "0", str(proc.pid)], check=True, capture_output=True)
        client = Client(port, auth)
        ids = [client.call("POST", "/contacts", {"firstname": f"B{i}", "lastname": "Batch"})["item"]["id"]
               for i in range(100)]
        # One batch answered as it should: 100 parts of 200.
        client.conn.request("POST", "/batch", batch_body(ids),
                            {"Authorization": auth, "Content-Type": f"multipart/mixed; boundary={BOUNDARY}"})
        reply = client.conn.getresponse().read().decode()
        assert reply.count("HTTP/1.1 200 OK") == 100, reply[:500]
        separate = os.path.join(workdir, "separate.lua")
        with open(separate, "w") as f:
            f.write(SEPARATE % (", ".join(map(str, ids)), auth))
        batched = os.path.join(workdir, "batch.lua")
        with open(batched, "w") as f:
            f.write(BATCH % (lua_string(batch_body(ids)), BOUNDARY, auth))
        print("| connections | separate GETs/s | mean latency per GET | batched GETs/s | mean latency per batch of 100 | ratio |")
        print("|---|---|---|---|---|---|")
        for c in args.connections:
            rate_s, lat_s = wrk(port, separate, args.seconds, c, "/")
            rate_b, lat_b = wrk(port, batched, args.seconds, c, "/batch")
            print(f"| {c} | {rate_s:,.0f} | {lat_s:.3f} ms | {rate_b * 100:,.0f} | {lat_b:.2f} ms | "
                  f"{rate_b * 100 / rate_s:.2f} |")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
