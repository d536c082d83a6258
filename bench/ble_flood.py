#!/usr/bin/env python3
"""How fast the live BLE path reads a flood of adverts (the BlueZ mock of tests/ble).

    bash tests/ble/setup.sh && cargo build --release
    python3 bench/ble_flood.py [--bin target/release/sitegate] [--adverts 20000] [--devices 500]
                               [--batch 500] [--rounds 3]

Starts the BlueZ mock on a private system bus (tests/ble/mockbus.py) and `sitegate record`
against it, then sends the adverts as fast as the mock takes them (batches of `--batch`, each
one D-Bus call; every advert a PropertiesChanged signal with RSSI and manufacturer data, as
bluetoothd sends with DuplicateData), from `--devices` iBeacons the adapter has seen before.
Reports, per round: the mock's sending rate, the rate at which `record` wrote them (first
advert sent to last advert written), how many arrived, and how many device property reads
(`GetAll` on org.bluez.Device1) the mock answered meanwhile. The service reads adverts through
the same code as `record`. Python standard library only, besides the venv of tests/ble.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
UUID = "f7826da64fa24e988024bc5b71e0893e"


def mac(i):
    return "C1:00:00:00:%02X:%02X" % (i // 256, i % 256)


def advert(i, rssi):
    return {"mac": mac(i), "rssi": rssi, "mfg": {"004c": "0215%s0005%04xc5" % (UUID, i)}}


class Mock:
    def __init__(self, python, directory):
        self.proc = subprocess.Popen(
            [python, os.path.join(ROOT, "tests/ble/mockbus.py"), "--dir", directory],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.address = self.proc.stdout.readline().strip().split(" ", 1)[1]
        assert self.proc.stdout.readline().strip() == "ready"

    def send(self, command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise SystemExit("mock: %s -> %s" % (list(command)[0], answer))
        return answer

    def quit(self):
        try:
            self.send({"quit": True})
        except (BrokenPipeError, SystemExit):
            pass
        self.proc.wait(timeout=10)


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def device_reads(mock):
    return json.loads(mock.send({"status": True})[3:])["device_reads"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/sitegate"))
    p.add_argument("--python", default=os.path.join(ROOT, "target/ble-venv/bin/python"))
    p.add_argument("--adverts", type=int, default=20000)
    p.add_argument("--devices", type=int, default=500)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a round may take at most")
    args = p.parse_args()
    args.bin = os.path.abspath(args.bin)
    work = tempfile.mkdtemp(prefix="sgflood-")
    mock = Mock(args.python, os.path.join(work, "bus"))
    out = os.path.join(work, "trace.jsonl")
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=mock.address, RUST_LOG="warn")
    rec = subprocess.Popen([args.bin, "record", "--out", out, "--seconds", "3600"],
                           cwd=work, env=env)
    try:
        mock.send({"wait": {"discovering": True, "timeout": 60}})
        # Every device seen once first: the flood is of devices the adapter knows.
        for start in range(0, args.devices, args.batch):
            mock.send({"adverts": [advert(i, -50) for i in range(start, min(args.devices, start + args.batch))]})
        end = time.time() + 60
        while count_lines(out) < args.devices and time.time() < end:
            time.sleep(0.05)
        print("| round | adverts | sent/s (mock) | recorded/s | recorded | device property reads |")
        print("|---|---|---|---|---|---|")
        for r in range(args.rounds):
            before, reads_before = count_lines(out), device_reads(mock)
            t0 = time.time()
            for start in range(0, args.adverts, args.batch):
                mock.send({"adverts": [advert((start + k) % args.devices, -60 - (start + k) % 30)
                                       for k in range(min(args.batch, args.adverts - start))]})
            sent = time.time()
            end, last, last_change = t0 + args.timeout, before, time.time()
            while time.time() < end:
                n = count_lines(out)
                if n != last:
                    last, last_change = n, time.time()
                if n - before >= args.adverts or time.time() - last_change > 10:
                    break
                time.sleep(0.02)
            got = last - before
            print("| %d | %d | %.0f | %.0f | %d | %d |" % (
                r + 1, args.adverts, args.adverts / (sent - t0), got / (last_change - t0), got,
                device_reads(mock) - reads_before))
            sys.stdout.flush()
    finally:
        rec.terminate()
        rec.wait(timeout=20)
        mock.quit()


if __name__ == "__main__":
    main()
