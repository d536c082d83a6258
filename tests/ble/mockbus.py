#!/usr/bin/env python3
"""A private D-Bus system bus with a BlueZ mock on it, driven by JSON lines on stdin.

Run with the venv made by tests/ble/setup.sh:

    target/ble-venv/bin/python tests/ble/mockbus.py --dir DIR

It starts dbus-daemon (a bus of type "system" with a permissive policy, listening on
DIR/system_bus_socket), starts python-dbusmock with tests/ble/bluez_adverts.py on it, adds
the adapter (hci0, powered), then prints

    address unix:path=DIR/system_bus_socket
    ready

and answers each command line on stdin with one line, "ok" or "error: ...". Point the
program under test at the bus with DBUS_SYSTEM_BUS_ADDRESS=<address>. See README.md for the
commands. Everything started here is stopped on {"quit": true}, when stdin closes, and on
SIGTERM, SIGINT or SIGHUP; the children also get SIGTERM if this process dies.
"""

import argparse
import ctypes
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import dbus
import dbus.bus

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "bluez_adverts.py")
BLUEZ = "org.bluez"
MOCK_IFACE = "org.bluez.Mock"
ADAPTER_IFACE = "org.bluez.Adapter1"
PROPS_IFACE = "org.freedesktop.DBus.Properties"
BASE_UUID_TAIL = "-0000-1000-8000-00805f9b34fb"
MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
UUID128_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ADVERT_KEYS = {"mac", "rssi", "mfg", "svc", "uuids", "name", "tx_power", "address_type", "flags"}
ADVERT_SIG = "(sna{qay}a{say}a{sv})"
CALL_TIMEOUT = 60.0

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow send_type="signal"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
    <allow eavesdrop="true"/>
  </policy>
  <limit name="max_incoming_bytes">1000000000</limit>
  <limit name="max_outgoing_bytes">1000000000</limit>
  <limit name="max_message_size">134217728</limit>
  <limit name="max_replies_per_connection">50000</limit>
  <limit name="max_match_rules_per_connection">50000</limit>
  <limit name="reply_timeout">300000</limit>
</busconfig>
"""


class CommandError(Exception):
    pass


def log(msg):
    sys.stderr.write(f"mockbus: {msg}\n")
    sys.stderr.flush()


def _die_with_parent():
    """In the child before exec: get SIGTERM when the parent (this script) dies."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _relay_daemon_stderr(stream):
    """Copy dbus-daemon's stderr to ours, without its complaint that an unprivileged (or
    capability-less) user cannot raise the fd limit as a system bus would."""
    for raw in stream:
        line = raw.decode(errors="replace")
        if "Failed to set fd limit" not in line:
            sys.stderr.write(line)
            sys.stderr.flush()


def _stop(proc, name, grace=3.0):
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        log(f"{name} ignored SIGTERM; killing it")
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


# --- advert conversion ---------------------------------------------------------------


def _hex_bytes(value, what):
    if not isinstance(value, str):
        raise CommandError(f"{what}: expected a hex string, got {json.dumps(value)}")
    try:
        return bytes.fromhex(value.replace(":", " "))
    except ValueError:
        raise CommandError(f"{what}: not hex: {value!r}") from None


def _uuid(key, what):
    if not isinstance(key, str):
        raise CommandError(f"{what}: expected a UUID string")
    k = key.lower()
    if k.startswith("0x"):
        k = k[2:]
    if re.fullmatch(r"[0-9a-f]{4}", k):
        return "0000" + k + BASE_UUID_TAIL
    if re.fullmatch(r"[0-9a-f]{8}", k):
        return k + BASE_UUID_TAIL
    if UUID128_RE.match(k):
        return k
    raise CommandError(f"{what}: {key!r} is not a 16-bit (4 hex), 32-bit (8 hex) or 128-bit UUID")


def _int(value, lo, hi, what):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CommandError(f"{what}: expected an integer in {lo}..{hi}, got {json.dumps(value)}")
    return value


def convert_advert(adv, where="advert"):
    """JSON advert -> the D-Bus struct (sna{qay}a{say}a{sv}) of org.bluez.Mock.AdvertiseMany."""
    if not isinstance(adv, dict):
        raise CommandError(f"{where}: expected an object")
    unknown = set(adv) - ADVERT_KEYS
    if unknown:
        raise CommandError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    mac = adv.get("mac")
    if not isinstance(mac, str) or not MAC_RE.match(mac):
        raise CommandError(f"{where}.mac: expected AA:BB:CC:DD:EE:FF, got {json.dumps(mac)}")
    if "rssi" not in adv:
        raise CommandError(f"{where}.rssi: missing")
    rssi = _int(adv["rssi"], -128, 127, f"{where}.rssi")

    mfg = {}
    for key, value in (adv.get("mfg") or {}).items():
        k = key.lower()[2:] if key.lower().startswith("0x") else key
        if not re.fullmatch(r"[0-9A-Fa-f]{1,4}", k):
            raise CommandError(f"{where}.mfg: key {key!r} is not a 16-bit company id in hex")
        mfg[dbus.UInt16(int(k, 16))] = dbus.ByteArray(_hex_bytes(value, f"{where}.mfg.{key}"))

    svc = {}
    for key, value in (adv.get("svc") or {}).items():
        svc[dbus.String(_uuid(key, f"{where}.svc"))] = dbus.ByteArray(_hex_bytes(value, f"{where}.svc.{key}"))

    extra = {}
    if "uuids" in adv:
        if not isinstance(adv["uuids"], list):
            raise CommandError(f"{where}.uuids: expected a list")
        extra["uuids"] = dbus.Array([_uuid(u, f"{where}.uuids") for u in adv["uuids"]], signature="s")
    elif svc:
        # Beacons that send service data list the same UUID among their services
        # (Eddystone does), and bluetoothd's UUID filter looks at that list.
        extra["uuids"] = dbus.Array(list(svc), signature="s")
    if "name" in adv:
        if not isinstance(adv["name"], str):
            raise CommandError(f"{where}.name: expected a string")
        extra["name"] = dbus.String(adv["name"])
    if "tx_power" in adv:
        extra["tx_power"] = dbus.Int16(_int(adv["tx_power"], -127, 127, f"{where}.tx_power"))
    if "address_type" in adv:
        if adv["address_type"] not in ("random", "public"):
            raise CommandError(f"{where}.address_type: expected \"random\" or \"public\"")
        extra["address_type"] = dbus.String(adv["address_type"])
    if "flags" in adv:
        extra["flags"] = dbus.Byte(_int(adv["flags"], 0, 255, f"{where}.flags"))

    return (
        dbus.String(mac.upper()),
        dbus.Int16(rssi),
        dbus.Dictionary(mfg, signature="qay"),
        dbus.Dictionary(svc, signature="say"),
        dbus.Dictionary(extra, signature="sv"),
    )


# --- the harness -------------------------------------------------------------------------


class Harness:
    def __init__(self, args):
        self.args = args
        self.own_dir = args.dir is None
        self.dir = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(prefix="sitegate-ble-")
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "system_bus_socket")
        self.config = os.path.join(self.dir, "bus.conf")
        self.mock_log_path = os.path.join(self.dir, "bluez-mock.log")
        self.address = "unix:path=" + self.socket
        self.daemon = None
        self.mock = None
        self.mock_log = None
        self.conn = None
        self.adapter = args.adapter
        self.adapter_path = "/org/bluez/" + args.adapter

    # processes

    def start_bus(self):
        if len(self.socket.encode()) > 107:
            raise CommandError(f"socket path too long for a unix socket ({len(self.socket)} bytes): use a shorter --dir")
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        with open(self.config, "w", encoding="utf-8") as f:
            f.write(BUS_CONFIG.format(socket=self.socket))
        daemon = shutil.which(self.args.dbus_daemon) or self.args.dbus_daemon
        self.daemon = subprocess.Popen(
            [daemon, "--config-file=" + self.config, "--nofork", "--nopidfile", "--nosyslog", "--print-address=1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        threading.Thread(target=_relay_daemon_stderr, args=(self.daemon.stderr,), daemon=True).start()
        ready, _, _ = select.select([self.daemon.stdout], [], [], 15)
        line = self.daemon.stdout.readline().decode().strip() if ready else ""
        if not line:
            raise CommandError(f"dbus-daemon did not start (exit code {self.daemon.poll()})")
        self.conn = dbus.bus.BusConnection(self.address)

    def start_mock(self):
        if self.mock_log is None:
            # dbusmock logs to stdout without --logfile; appending here keeps the log of
            # every mock generation across restarts (--logfile would truncate it).
            self.mock_log = open(self.mock_log_path, "ab")  # noqa: SIM115
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=self.address)
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        params = {"changed_on_first_sight": self.args.changed_on_first_sight}
        self.mock = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dbusmock",
                "--system",
                "--template",
                TEMPLATE,
                "--parameters",
                json.dumps(params),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.mock_log,
            stderr=sys.stderr,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while not self.conn.name_has_owner(BLUEZ):
            if self.mock.poll() is not None:
                raise CommandError(f"the BlueZ mock exited with code {self.mock.returncode}; see {self.mock_log_path}")
            if time.monotonic() > deadline:
                raise CommandError("the BlueZ mock did not claim org.bluez within 20 s")
            time.sleep(0.01)
        self.call_mock("AddAdapter", "ss", [self.adapter, self.args.system_name])

    def stop(self):
        _stop(self.mock, "the BlueZ mock")
        _stop(self.daemon, "dbus-daemon")
        if self.daemon is not None and self.daemon.stdout is not None:
            self.daemon.stdout.close()
        if self.mock_log is not None:
            self.mock_log.close()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            for path in (self.socket, self.config):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def check_alive(self):
        if self.daemon.poll() is not None:
            raise SystemExit(f"mockbus: dbus-daemon exited with code {self.daemon.returncode}")
        if self.mock is None or self.mock.poll() is not None:
            code = None if self.mock is None else self.mock.returncode
            raise CommandError(f"the BlueZ mock is not running (exit code {code}); see {self.mock_log_path}")

    # D-Bus

    def call(self, path, iface, method, sig, args, timeout=CALL_TIMEOUT):
        try:
            return self.conn.call_blocking(BLUEZ, path, iface, method, sig, args, timeout=timeout)
        except dbus.exceptions.DBusException as e:
            raise CommandError(f"{e.get_dbus_name()}: {e.get_dbus_message()}") from None

    def call_mock(self, method, sig, args, timeout=CALL_TIMEOUT):
        return self.call("/", MOCK_IFACE, method, sig, args, timeout)

    def adapter_prop(self, name):
        return self.call(self.adapter_path, PROPS_IFACE, "Get", "ss", [ADAPTER_IFACE, name])

    # commands

    def cmd_advert(self, adv):
        mac, rssi, mfg, svc, extra = convert_advert(adv)
        self.call_mock("Advertise", "ssna{qay}a{say}a{sv}", [self.adapter, mac, rssi, mfg, svc, extra])
        return None

    def cmd_adverts(self, adverts):
        if not isinstance(adverts, list):
            raise CommandError("adverts: expected a list")
        items = [convert_advert(a, f"adverts[{i}]") for i, a in enumerate(adverts)]
        if not items:
            return None
        timeout = max(CALL_TIMEOUT, len(items) / 200.0)
        self.call_mock("AdvertiseMany", "sa" + ADVERT_SIG, [self.adapter, items], timeout=timeout)
        return None

    def cmd_power(self, value):
        if not isinstance(value, bool):
            raise CommandError("power: expected true or false")
        self.call_mock("SetPowered", "sb", [self.adapter, value])
        return None

    def cmd_remove(self, mac):
        if not isinstance(mac, str) or not MAC_RE.match(mac):
            raise CommandError("remove: expected a MAC address")
        path = self.adapter_path + "/dev_" + mac.upper().replace(":", "_")
        self.call(self.adapter_path, ADAPTER_IFACE, "RemoveDevice", "o", [path])
        return None

    def cmd_restart(self, value):
        if value is True:
            opts = {}
        elif isinstance(value, dict):
            opts = value
        else:
            raise CommandError('restart: expected true or {"mode": "graceful"|"crash", "down_ms": N}')
        unknown = set(opts) - {"mode", "down_ms"}
        if unknown:
            raise CommandError(f"restart: unknown field(s) {', '.join(sorted(unknown))}")
        mode = opts.get("mode", "graceful")
        if mode not in ("graceful", "crash"):
            raise CommandError('restart.mode: expected "graceful" or "crash"')
        down_ms = _int(opts.get("down_ms", 0), 0, 600000, "restart.down_ms")

        if self.mock is not None and self.mock.poll() is None:
            if mode == "graceful":
                try:
                    self.call_mock("SimulateShutdown", "s", [self.adapter], timeout=10)
                except CommandError as e:
                    log(f"restart: SimulateShutdown failed: {e}")
                self.mock.terminate()
            else:
                self.mock.kill()
            try:
                self.mock.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.mock.kill()
                self.mock.wait()
        deadline = time.monotonic() + 10
        while self.conn.name_has_owner(BLUEZ):
            if time.monotonic() > deadline:
                raise CommandError("org.bluez is still owned after stopping the mock")
            time.sleep(0.005)
        if down_ms:
            time.sleep(down_ms / 1000.0)
        self.start_mock()
        return None

    def cmd_wait(self, value):
        if not isinstance(value, dict):
            raise CommandError('wait: expected {"discovering": bool} and/or {"powered": bool}, "timeout": s')
        timeout = value.get("timeout", 10)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise CommandError("wait.timeout: expected seconds")
        want = {}
        for key, prop in (("discovering", "Discovering"), ("powered", "Powered")):
            if key in value:
                if not isinstance(value[key], bool):
                    raise CommandError(f"wait.{key}: expected true or false")
                want[prop] = value[key]
        unknown = set(value) - {"discovering", "powered", "timeout"}
        if unknown or not want:
            raise CommandError("wait: give discovering and/or powered (and optionally timeout)")
        deadline = time.monotonic() + timeout
        while True:
            got = {prop: bool(self.adapter_prop(prop)) for prop in want}
            if got == want:
                return None
            if time.monotonic() >= deadline:
                have = ", ".join(f"{k}={str(v).lower()}" for k, v in got.items())
                raise CommandError(f"wait: timed out after {timeout} s ({have})")
            time.sleep(0.01)

    def cmd_status(self, _value):
        state = json.loads(str(self.call_mock("GetState", "s", [self.adapter])))
        state["address"] = self.address
        state["mock_pid"] = self.mock.pid
        return json.dumps(state, separators=(",", ":"))

    COMMANDS = ("advert", "adverts", "power", "remove", "restart", "wait", "status", "quit")

    def handle(self, line):
        try:
            cmd = json.loads(line)
        except ValueError as e:
            raise CommandError(f"not JSON: {e}") from None
        if not isinstance(cmd, dict):
            raise CommandError("expected a JSON object")
        keys = [k for k in cmd if k in self.COMMANDS]
        if len(keys) != 1 or len(cmd) != 1:
            raise CommandError(f"expected exactly one of {', '.join(self.COMMANDS)}; got {', '.join(cmd) or 'nothing'}")
        name = keys[0]
        if name == "quit":
            raise SystemExit(0)
        if name != "restart":
            self.check_alive()
        elif self.daemon.poll() is not None:
            raise SystemExit(f"mockbus: dbus-daemon exited with code {self.daemon.returncode}")
        return getattr(self, "cmd_" + name)(cmd[name])


def reply(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="directory for the bus socket, config and mock log (default: a new temp dir)")
    parser.add_argument("--adapter", default="hci0", help="adapter to add (default hci0)")
    parser.add_argument("--system-name", default="gateway", help="adapter Name/Alias (default gateway)")
    parser.add_argument(
        "--changed-on-first-sight",
        action="store_true",
        help="also send PropertiesChanged for a device's first advert (bluetoothd sends only InterfacesAdded)",
    )
    parser.add_argument("--dbus-daemon", default="dbus-daemon", help="dbus-daemon binary")
    args = parser.parse_args()

    def on_signal(signum, _frame):
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    harness = Harness(args)
    try:
        try:
            harness.start_bus()
            harness.start_mock()
        except CommandError as e:
            log(str(e))
            return 1
        reply("address " + harness.address)
        reply("ready")
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                result = harness.handle(line)
                reply("ok" if result is None else "ok " + result)
            except CommandError as e:
                msg = " ".join(str(e).split())
                log(msg)
                reply("error: " + msg)
        return 0
    except BrokenPipeError:
        return 0
    finally:
        harness.stop()


if __name__ == "__main__":
    sys.exit(main())
