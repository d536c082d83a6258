#!/usr/bin/env python3
"""Latency from an advert to its stored effect, through the live path: BlueZ mock (tests/ble)
-> D-Bus -> btleplug -> engine -> SQLite.

    bash tests/ble/setup.sh && cargo build --release
    python3 bench/location/latency.py [--bin target/release/sitegate] [--adverts 200]

Registers one tag, starts the service against the mock's private bus, then sends adverts one
at a time (at random pauses of 50 ms to 1 s) and polls the database read-only every 2 ms for the device's
`last_seen_ms`. Reports, per advert: send -> arrival (the service stamps each advert on
arrival from D-Bus: the bus, btleplug and the event join) and arrival -> stored (the engine's
queue and its batched write, once a second), p50/p99/max. Python standard library only.
"""

import argparse
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UUID = "f7826da64fa24e988024bc5b71e0893e"
SITE = """
[http]
listen = "127.0.0.1:0"
[log]
level = "warn"
[[areas]]
id = 1
name = "Site"
[[buildings]]
id = 1
name = "Main"
area = 1
[[floors]]
id = 1
label = "Ground"
level = 0
building = 1
[[zones]]
id = 21
name = "Kitchen"
floor = 1
[[receivers]]
id = "hci0"
zone = 21
position = "42.5,-90.73"
"""


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sitegate")
    ap.add_argument("--adverts", type=int, default=200)
    args = ap.parse_args()
    venv = os.environ.get("SITEGATE_BLE_VENV", os.path.join(REPO, "target", "ble-venv"))
    python = os.path.join(venv, "bin", "python")
    work = tempfile.mkdtemp(prefix="sglat-")
    with open(os.path.join(work, "config.toml"), "w") as f:
        f.write(SITE)
    binary = os.path.abspath(args.bin)
    subprocess.run([binary, "device", "add", "--config", "config.toml", "--address", "5/1/22", "--beacon",
                    f"ibeacon:{UUID}/5/22"], cwd=work, check=True, capture_output=True)
    bus = subprocess.Popen([python, os.path.join(REPO, "tests", "ble", "mockbus.py"), "--dir", os.path.join(work, "b")],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    address = bus.stdout.readline().split(" ", 1)[1].strip()
    assert bus.stdout.readline().strip() == "ready"

    def send(cmd):
        bus.stdin.write(json.dumps(cmd) + "\n")
        bus.stdin.flush()
        answer = bus.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"{cmd}: {answer}")

    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=address)
    service = subprocess.Popen([binary, "serve", "--config", "config.toml"], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert re.match(r"ready http=", service.stdout.readline())
        send({"wait": {"discovering": True, "timeout": 60}})
        db = sqlite3.connect(f"file:{os.path.join(work, 'data', 'sitegate.db')}?mode=ro", uri=True)
        data = f"0215{UUID}00050016c5"
        to_arrival, to_stored = [], []
        last = None
        for i in range(args.adverts + 5):
            sent = time.time() * 1000
            send({"advert": {"mac": "C0:00:00:00:00:22", "rssi": -60 - i % 5, "mfg": {"004c": data}}})
            deadline = time.time() + 5
            while time.time() < deadline:
                row = db.execute("SELECT last_seen_ms FROM devices").fetchone()
                if row and row[0] is not None and row[0] != last:
                    stored = time.time() * 1000
                    last = row[0]
                    if i >= 5:  # the first ones warm up the path (device discovery)
                        to_arrival.append(row[0] - sent)
                        to_stored.append(stored - row[0])
                    break
                time.sleep(0.002)
            # A random pause, so that adverts fall at every point of the engine's write cycle.
            time.sleep(random.uniform(0.05, 1.0))
        print(f"{len(to_arrival)} adverts; milliseconds p50 / p99 / max")
        for name, values in (("send -> arrival (D-Bus, btleplug, join)", to_arrival),
                             ("arrival -> stored (queue, engine, batched write)", to_stored),
                             ("send -> stored", [a + b for a, b in zip(to_arrival, to_stored)])):
            print(f"{name}: {pct(values, 50):.0f} / {pct(values, 99):.0f} / {max(values):.0f} "
                  f"(mean {statistics.mean(values):.0f})")
    finally:
        service.terminate()
        service.wait(timeout=30)
        bus.stdin.close()
        bus.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
