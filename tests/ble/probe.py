#!/usr/bin/env python3
"""Self-check of the BLE mock harness, from a client's side of the bus.

Run with the venv made by tests/ble/setup.sh:

    target/ble-venv/bin/python tests/ble/probe.py [--burst N]

It starts mockbus.py as a test would, connects to the private system bus with dbus-python
the way bluez-async (btleplug's BlueZ backend) does: GetManagedObjects on org.bluez "/",
match rules for InterfacesAdded and PropertiesChanged from org.bluez, Powered=true,
SetDiscoveryFilter, StartDiscovery; then sends adverts and checks the signals and the
properties, down to their D-Bus types (RSSI n, ManufacturerData a{qv} holding ay,
ServiceData a{sv} holding ay). It also checks power off/on, both kinds of restart,
discovery-session rules, filters, and measures burst throughput. Prints one line per
check and "N passed, N failed" at the end; exits 1 if any check failed.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import dbus
import dbus.bus
import dbus.mainloop.glib
from gi.repository import GLib

HERE = os.path.dirname(os.path.abspath(__file__))
BLUEZ = "org.bluez"
ADAPTER = "/org/bluez/hci0"
ADAPTER_IFACE = "org.bluez.Adapter1"
DEVICE_IFACE = "org.bluez.Device1"
PROPS_IFACE = "org.freedesktop.DBus.Properties"
OM_IFACE = "org.freedesktop.DBus.ObjectManager"
EDDYSTONE = "0000feaa-0000-1000-8000-00805f9b34fb"
IBEACON = "0215" + "f7826da64fa24e988024bc5b71e0893e" + "0001" + "0002" + "c5"
EDDY_UID = "00e8" + "00112233445566778899" + "aabbccddeeff" + "0000"


def dev_path(mac):
    return ADAPTER + "/dev_" + mac.replace(":", "_")


class Probe:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.signals = []  # (monotonic time, message)
        self.on_signal = None

    # reporting

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {what}")
        else:
            self.failed += 1
            print(f"FAIL {what}" + (f": {detail}" if detail else ""))
        sys.stdout.flush()
        return ok

    # mockbus

    def start_mockbus(self, workdir, extra_args=()):
        self.mb = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "mockbus.py"), "--dir", workdir, *extra_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        first = self.mb.stdout.readline().strip()
        second = self.mb.stdout.readline().strip()
        self.check(first.startswith("address unix:path=") and second == "ready", "mockbus prints address and ready",
                   f"{first!r} {second!r}")
        self.address = first.split(" ", 1)[1]

    def cmd(self, obj):
        self.mb.stdin.write(json.dumps(obj) + "\n")
        self.mb.stdin.flush()
        return self.mb.stdout.readline().strip()

    # client side

    def connect(self):
        self.conn = dbus.bus.BusConnection(self.address, mainloop=dbus.mainloop.glib.DBusGMainLoop())
        # bluez-async's match rules: InterfacesAdded and PropertiesChanged (namespace) from org.bluez.
        self.conn.add_match_string(f"type='signal',sender='{BLUEZ}',interface='{OM_IFACE}',member='InterfacesAdded'")
        self.conn.add_match_string(f"type='signal',sender='{BLUEZ}',interface='{OM_IFACE}',member='InterfacesRemoved'")
        self.conn.add_match_string(
            f"type='signal',sender='{BLUEZ}',interface='{PROPS_IFACE}',member='PropertiesChanged',path_namespace='/org/bluez'"
        )
        self.conn.add_match_string(
            "type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged',arg0='org.bluez'"
        )
        self.conn.add_message_filter(self._filter)

    def _filter(self, _conn, msg):
        if msg.get_type() == 4:  # signal
            self.signals.append((time.monotonic(), msg))
            if self.on_signal is not None:
                self.on_signal(msg)
        return None

    def pump(self, until=lambda: False, timeout=1.0):
        ctx = GLib.MainContext.default()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while ctx.pending():
                ctx.iteration(False)
            if until():
                return True
            ctx.iteration(False) or time.sleep(0.001)
        return until()

    def take(self, member=None, path=None, timeout=1.0, settle=0.05):
        """Signals received so far plus any arriving within `settle`/`timeout`, filtered."""

        def matching():
            return [
                m for _, m in self.signals
                if (member is None or m.get_member() == member) and (path is None or m.get_path() == path)
            ]

        self.pump(lambda: bool(matching()), timeout)
        self.pump(timeout=settle)
        got = matching()
        self.signals = []
        return got

    def call(self, path, iface, method, sig="", args=(), **kw):
        return self.conn.call_blocking(BLUEZ, path, iface, method, sig, list(args), **kw)

    def error_of(self, fn):
        try:
            fn()
        except dbus.exceptions.DBusException as e:
            return e.get_dbus_name()
        return None

    def start_scan(self, flt=None):
        """What btleplug's start_scan does: Powered=true, SetDiscoveryFilter, StartDiscovery."""
        self.call(ADAPTER, PROPS_IFACE, "Set", "ssv", [ADAPTER_IFACE, "Powered", dbus.Boolean(True, variant_level=1)])
        if flt is None:
            flt = {"DuplicateData": dbus.Boolean(True), "Transport": dbus.String("auto")}
        self.call(ADAPTER, ADAPTER_IFACE, "SetDiscoveryFilter", "a{sv}", [flt])
        self.call(ADAPTER, ADAPTER_IFACE, "StartDiscovery")


def is_bytes(v):
    return (isinstance(v, dbus.Array) and v.signature == "y" and all(isinstance(b, dbus.Byte) for b in v))


def check_mfg(p, value, expect, what):
    ok = isinstance(value, dbus.Dictionary) and value.signature == "qv"
    ok = ok and all(isinstance(k, dbus.UInt16) and is_bytes(v) and v.variant_level == 1 for k, v in value.items())
    p.check(ok, f"{what}: ManufacturerData is a{{qv}} with ay values", repr(value))
    p.check({int(k): bytes(v).hex() for k, v in value.items()} == expect, f"{what}: ManufacturerData bytes intact",
            repr(value))


def check_svc(p, value, expect, what):
    ok = isinstance(value, dbus.Dictionary) and value.signature == "sv"
    ok = ok and all(isinstance(k, dbus.String) and is_bytes(v) and v.variant_level == 1 for k, v in value.items())
    p.check(ok, f"{what}: ServiceData is a{{sv}} with ay values", repr(value))
    p.check({str(k): bytes(v).hex() for k, v in value.items()} == expect, f"{what}: ServiceData bytes intact",
            repr(value))


def run(p, args, workdir):
    p.start_mockbus(workdir)
    p.connect()

    objs = p.call("/", OM_IFACE, "GetManagedObjects")
    adapter = objs.get(ADAPTER, {}).get(ADAPTER_IFACE)
    p.check(adapter is not None and bool(adapter["Powered"]) and not bool(adapter["Discovering"]),
            "GetManagedObjects: hci0 is there, powered, not discovering")
    p.check(all(k in adapter for k in ("Address", "AddressType", "Modalias", "Name", "Alias")),
            "adapter has the properties bluez-async requires")

    p.check(p.cmd({"advert": {"mac": "AA:BB:CC:DD:EE:01", "rssi": -60}}).startswith(
        "error: org.bluez.Mock.Error.NotDiscovering"), "advert before StartDiscovery is refused")

    p.start_scan()
    got = p.take("PropertiesChanged", ADAPTER)
    changed = [dict(m.get_args_list()[1]) for m in got]
    p.check(changed == [{"Discovering": True}], "start_scan: one PropertiesChanged Discovering=true, none for Powered",
            repr(changed))
    p.check(p.error_of(lambda: p.call(ADAPTER, ADAPTER_IFACE, "StartDiscovery")) == "org.bluez.Error.InProgress",
            "second StartDiscovery from the same client: org.bluez.Error.InProgress")
    p.check(p.cmd({"wait": {"discovering": True, "timeout": 5}}) == "ok", "wait discovering")

    # first sighting: InterfacesAdded only, fully typed
    mac1 = "AA:BB:CC:DD:EE:01"
    r = p.cmd({"advert": {"mac": mac1, "rssi": -60, "mfg": {"004c": IBEACON}, "tx_power": -59}})
    p.check(r == "ok", "advert (iBeacon) ok", r)
    added = p.take("InterfacesAdded")
    p.check(len(added) == 1 and added[0].get_signature() == "oa{sa{sv}}", "one InterfacesAdded oa{sa{sv}}")
    path, ifaces = added[0].get_args_list()
    p.check(path == dev_path(mac1) and DEVICE_IFACE in ifaces, "InterfacesAdded for " + dev_path(mac1), path)
    props = ifaces[DEVICE_IFACE]
    p.check(isinstance(props["RSSI"], dbus.Int16) and props["RSSI"] == -60, "InterfacesAdded: RSSI is n = -60")
    p.check(isinstance(props["TxPower"], dbus.Int16) and props["TxPower"] == -59, "InterfacesAdded: TxPower is n")
    check_mfg(p, props["ManufacturerData"], {0x004C: IBEACON}, "InterfacesAdded")
    p.check(props["AddressType"] == "random" and props["Address"] == mac1 and isinstance(props["Adapter"], dbus.ObjectPath),
            "InterfacesAdded: Address, AddressType random, Adapter o")
    required = ["Address", "AddressType", "Paired", "Connected", "ServicesResolved", "Trusted", "Blocked", "LegacyPairing",
                "Alias", "UUIDs"]
    p.check(all(k in props for k in required), "InterfacesAdded: properties bluez-async requires are present")
    p.check(p.take("PropertiesChanged", dev_path(mac1), timeout=0.1) == [],
            "first sighting sends no PropertiesChanged (as bluetoothd)")

    # second advert: one PropertiesChanged with RSSI + ManufacturerData
    p.cmd({"advert": {"mac": mac1, "rssi": -61, "mfg": {"004c": IBEACON}, "tx_power": -59}})
    got = p.take("PropertiesChanged", dev_path(mac1))
    p.check(len(got) == 1 and got[0].get_signature() == "sa{sv}as", "second advert: one PropertiesChanged sa{sv}as")
    iface, changed, _ = got[0].get_args_list()
    p.check(iface == DEVICE_IFACE and set(changed) == {"RSSI", "ManufacturerData"},
            "PropertiesChanged holds RSSI and ManufacturerData only", repr(set(changed)))
    p.check(isinstance(changed["RSSI"], dbus.Int16) and changed["RSSI"] == -61, "PropertiesChanged: RSSI n = -61")
    check_mfg(p, changed["ManufacturerData"], {0x004C: IBEACON}, "PropertiesChanged")

    p.cmd({"advert": {"mac": mac1, "rssi": -61, "mfg": {"004c": IBEACON}}})
    got = p.take("PropertiesChanged", dev_path(mac1))
    p.check(len(got) == 1 and set(got[0].get_args_list()[1]) == {"RSSI", "ManufacturerData"},
            "same RSSI and data again: still reported (filter with DuplicateData)")

    # Eddystone: ServiceData keyed by the full UUID, UUIDs list derived from it
    mac2 = "AA:BB:CC:DD:EE:02"
    p.cmd({"advert": {"mac": mac2, "rssi": -70, "svc": {"feaa": EDDY_UID}, "address_type": "public"}})
    added = p.take("InterfacesAdded")
    props = added[0].get_args_list()[1][DEVICE_IFACE] if added else {}
    check_svc(p, props.get("ServiceData"), {EDDYSTONE: EDDY_UID}, "Eddystone InterfacesAdded")
    p.check(list(props.get("UUIDs", [])) == [EDDYSTONE] and props.get("AddressType") == "public",
            "Eddystone: UUIDs lists feaa, AddressType public")
    p.cmd({"advert": {"mac": mac2, "rssi": -72, "svc": {"feaa": EDDY_UID}}})
    got = p.take("PropertiesChanged", dev_path(mac2))
    changed = got[0].get_args_list()[1] if got else {}
    p.check(len(got) == 1 and set(changed) == {"RSSI", "ServiceData"}, "Eddystone again: RSSI + ServiceData",
            repr(set(changed)))
    if "ServiceData" in changed:
        check_svc(p, changed["ServiceData"], {EDDYSTONE: EDDY_UID}, "Eddystone PropertiesChanged")

    # GetAll as btleplug's get_device_info does
    props = p.call(dev_path(mac1), PROPS_IFACE, "GetAll", "s", [DEVICE_IFACE])
    p.check(isinstance(props["RSSI"], dbus.Int16) and props["RSSI"] == -61, "GetAll: RSSI n = -61")
    check_mfg(p, props["ManufacturerData"], {0x004C: IBEACON}, "GetAll")
    p.check("ServiceData" not in props and "Name" not in props, "GetAll: absent ServiceData/Name are left out")

    # busctl's view of the same
    busctl = shutil.which("busctl")
    if busctl:
        out = subprocess.run([busctl, "--address=" + p.address, "introspect", BLUEZ, dev_path(mac1), DEVICE_IFACE],
                             capture_output=True, text=True, timeout=10).stdout
        p.check(any(line.split()[:3] == [".ManufacturerData", "property", "a{qv}"] for line in out.splitlines()),
                "busctl introspect: ManufacturerData a{qv}", out)
        p.check(any(line.split()[:3] == [".RSSI", "property", "n"] for line in out.splitlines()),
                "busctl introspect: RSSI n")
        out = subprocess.run([busctl, "--address=" + p.address, "get-property", BLUEZ, dev_path(mac1), DEVICE_IFACE,
                              "ManufacturerData"], capture_output=True, text=True, timeout=10).stdout.strip()
        p.check(out.startswith("a{qv} 1 76 ay 23 2 21 247 130 109"), "busctl get-property ManufacturerData", out)
        out = subprocess.run([busctl, "--address=" + p.address, "get-property", BLUEZ, dev_path(mac2), DEVICE_IFACE,
                              "ServiceData"], capture_output=True, text=True, timeout=10).stdout.strip()
        p.check(out.startswith(f'a{{sv}} 1 "{EDDYSTONE}" ay 20 0 232'), "busctl get-property ServiceData", out)
    else:
        print("skip busctl checks (no busctl)")

    # burst throughput: signals only
    n = args.burst
    macs = [f"AA:BB:CC:00:{i // 256:02X}:{i % 256:02X}" for i in range(50)]
    adverts = [{"mac": macs[i % 50], "rssi": -40 - i % 50, "mfg": {"004c": IBEACON}} for i in range(n)]
    p.signals = []
    t0 = time.monotonic()
    p.mb.stdin.write(json.dumps({"adverts": adverts}) + "\n")
    p.mb.stdin.flush()
    p.pump(lambda: len(p.signals) >= n, timeout=60)
    t1 = time.monotonic()
    reply = p.mb.stdout.readline().strip()
    got = p.take(timeout=0.05)
    kinds = {"InterfacesAdded": 0, "PropertiesChanged": 0}
    for m in got:
        kinds[m.get_member()] = kinds.get(m.get_member(), 0) + 1
    p.check(reply == "ok" and kinds == {"InterfacesAdded": 50, "PropertiesChanged": n - 50},
            f"burst of {n}: 50 InterfacesAdded + {n - 50} PropertiesChanged", f"{reply} {kinds}")
    print(f"     burst of {n} adverts: {n / (t1 - t0):.0f} adverts/s delivered to a client")

    # burst again, with a GetAll per device signal, as btleplug does for each event
    n2 = min(n, 2000)
    adverts = [{"mac": macs[i % 50], "rssi": -40 - i % 50, "mfg": {"004c": IBEACON}} for i in range(n2)]
    done = []

    def get_all(msg):
        if msg.get_member() == "PropertiesChanged" and msg.get_path().startswith(ADAPTER + "/dev_"):
            p.call(msg.get_path(), PROPS_IFACE, "GetAll", "s", [DEVICE_IFACE])
            done.append(1)

    p.on_signal = get_all
    t0 = time.monotonic()
    p.mb.stdin.write(json.dumps({"adverts": adverts}) + "\n")
    p.mb.stdin.flush()
    p.pump(lambda: len(done) >= n2, timeout=120)
    t1 = time.monotonic()
    p.on_signal = None
    reply = p.mb.stdout.readline().strip()
    p.take(timeout=0.05)
    p.check(reply == "ok" and len(done) == n2, f"burst of {n2} with a GetAll per signal", f"{reply} {len(done)}")
    print(f"     burst of {n2} adverts with GetAll per advert: {n2 / (t1 - t0):.0f} adverts/s")

    # unfiltered discovery: RSSI only past 8 dBm, data only when changed
    p.call(ADAPTER, ADAPTER_IFACE, "StopDiscovery")
    p.call(ADAPTER, ADAPTER_IFACE, "SetDiscoveryFilter", "a{sv}", [dbus.Dictionary({}, signature="sv")])
    p.call(ADAPTER, ADAPTER_IFACE, "StartDiscovery")
    p.take(timeout=0.1)
    p.cmd({"advert": {"mac": mac1, "rssi": -63, "mfg": {"004c": IBEACON}}})
    p.check(p.take("PropertiesChanged", dev_path(mac1), timeout=0.1) == [],
            "no filter: same data and RSSI within 8 dBm are not reported")
    p.cmd({"advert": {"mac": mac1, "rssi": -75, "mfg": {"004c": IBEACON[:-2] + "c4"}}})
    got = p.take("PropertiesChanged", dev_path(mac1))
    p.check(len(got) == 1 and set(got[0].get_args_list()[1]) == {"RSSI", "ManufacturerData"},
            "no filter: RSSI past 8 dBm and changed data are reported")

    # UUID filter: an iBeacon (no service UUIDs) is dropped, Eddystone passes
    p.call(ADAPTER, ADAPTER_IFACE, "StopDiscovery")
    p.start_scan({"UUIDs": dbus.Array([EDDYSTONE], signature="s"), "DuplicateData": dbus.Boolean(True)})
    p.take(timeout=0.1)
    p.cmd({"adverts": [{"mac": mac1, "rssi": -50, "mfg": {"004c": IBEACON}},
                       {"mac": mac2, "rssi": -50, "svc": {"feaa": EDDY_UID}}]})
    got = p.take("PropertiesChanged")
    paths = [m.get_path() for m in got]
    p.check(paths == [dev_path(mac2)], "UUIDs filter: iBeacon dropped, Eddystone reported", repr(paths))
    state = json.loads(p.cmd({"status": True})[3:])
    p.check(state["dropped"] == 1 and state["uuid_filter"] == [EDDYSTONE], "status shows the drop and the filter")
    p.call(ADAPTER, ADAPTER_IFACE, "StopDiscovery")
    p.start_scan()
    p.take(timeout=0.1)

    # power off / on
    p.check(p.cmd({"power": False}) == "ok", "power false ok")
    got = p.take(timeout=0.5, settle=0.1)
    removed = [m for m in got if m.get_member() == "InterfacesRemoved"]
    pc = [dict(m.get_args_list()[1]) for m in got if m.get_member() == "PropertiesChanged"]
    p.check(len(removed) == 52, "power off removes the devices (InterfacesRemoved)", str(len(removed)))
    p.check(len(pc) == 1 and pc[0].get("Powered") is not None and not pc[0]["Powered"] and not pc[0]["Discovering"],
            "power off: one PropertiesChanged Powered=false Discovering=false", repr(pc))
    p.check(p.cmd({"advert": {"mac": mac1, "rssi": -60}}).startswith("error: org.bluez.Error.NotReady"),
            "advert while powered off is refused")
    p.check(p.error_of(lambda: p.call(ADAPTER, ADAPTER_IFACE, "StartDiscovery")) == "org.bluez.Error.NotReady",
            "StartDiscovery while off: NotReady")
    p.cmd({"power": True})
    pc = [dict(m.get_args_list()[1]) for m in p.take("PropertiesChanged", ADAPTER)]
    p.check(pc == [{"Powered": True, "PowerState": "on"}], "power on: PropertiesChanged Powered=true", repr(pc))
    p.check(p.cmd({"advert": {"mac": mac1, "rssi": -60}}).startswith("error: org.bluez.Mock.Error.NotDiscovering"),
            "after power on, discovery is not resumed by itself")
    p.start_scan()
    p.cmd({"advert": {"mac": mac1, "rssi": -60, "mfg": {"004c": IBEACON}}})
    p.check(len(p.take("InterfacesAdded")) == 1, "after start_scan again, the device is discovered anew")

    # graceful restart
    p.check(p.cmd({"restart": True}) == "ok", "restart (graceful) ok")
    got = p.take(timeout=0.5, settle=0.2)
    seq = [m.get_member() for m in got]
    owners = [m.get_args_list()[1:] for m in got if m.get_member() == "NameOwnerChanged"]
    p.check(seq[0] == "PropertiesChanged" and not dict(got[0].get_args_list()[1])["Powered"],
            "graceful restart: Powered=false first", repr(seq))
    p.check(len(owners) == 2 and owners[0][1] == "" and owners[1][0] == "" and owners[1][1] != "",
            "graceful restart: org.bluez leaves and comes back", repr(owners))
    p.check(seq[-1] == "InterfacesAdded" and got[-1].get_args_list()[0] == ADAPTER,
            "graceful restart: adapter re-added (InterfacesAdded)", repr(seq))
    objs = p.call("/", OM_IFACE, "GetManagedObjects")
    p.check(sorted(objs) == ["/org/bluez", ADAPTER], "after restart: no devices", repr(sorted(objs)))
    p.start_scan()
    p.cmd({"advert": {"mac": mac1, "rssi": -60}})
    p.check(len(p.take("InterfacesAdded")) == 1, "after restart and start_scan, adverts flow again")

    # crash restart
    p.check(p.cmd({"restart": {"mode": "crash", "down_ms": 100}}) == "ok", "restart (crash) ok")
    got = p.take(timeout=0.5, settle=0.2)
    seq = [m.get_member() for m in got]
    p.check(seq == ["NameOwnerChanged", "NameOwnerChanged", "InterfacesAdded"],
            "crash restart: no signals from the dying daemon, name leaves and comes back", repr(seq))
    p.check(p.cmd({"advert": {"mac": mac1, "rssi": -60}}).startswith("error: org.bluez.Mock.Error.NotDiscovering"),
            "after restart, the old discovery session is gone")

    # a client that leaves the bus loses its session
    other = dbus.bus.BusConnection(p.address)
    other.call_blocking(BLUEZ, ADAPTER, ADAPTER_IFACE, "StartDiscovery", "", [])
    p.take(timeout=0.1)
    other.close()
    pc = [dict(m.get_args_list()[1]) for m in p.take("PropertiesChanged", ADAPTER, timeout=1)]
    p.check(pc == [{"Discovering": False}], "a discovering client disconnects: Discovering=false", repr(pc))

    # protocol errors
    p.check(p.cmd({"advert": {"mac": "nope", "rssi": -1}}).startswith("error: advert.mac"), "bad MAC rejected")
    p.check(p.cmd({"adverts": [{"mac": mac1, "rssi": -1, "mfg": {"004c": "zz"}}]}).startswith("error: adverts[0].mfg"),
            "bad hex rejected with its index")

    pids = [json.loads(p.cmd({"status": True})[3:])["mock_pid"]]
    pids += [int(x) for x in subprocess.run(["pgrep", "-f", "config-file=" + workdir], capture_output=True,
                                            text=True).stdout.split()]
    r = p.cmd({"quit": True})
    code = p.mb.wait(timeout=10)
    p.check(r == "" and code == 0, "quit: exits 0", f"{r!r} {code}")
    p.check(len(pids) == 2 and not [pid for pid in pids if alive(pid)], "quit: mock and dbus-daemon are gone",
            repr(pids))


def alive(pid):
    """True if pid runs (a zombie waiting for init to reap it does not count)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main():
    parser = argparse.ArgumentParser(description="self-check of the BLE mock harness")
    parser.add_argument("--burst", type=int, default=5000, help="adverts in the throughput burst (default 5000)")
    args = parser.parse_args()
    p = Probe()
    workdir = tempfile.mkdtemp(prefix="ble-probe-")
    try:
        run(p, args, workdir)
    finally:
        if getattr(p, "mb", None) is not None and p.mb.poll() is None:
            p.mb.terminate()
            p.mb.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{p.passed} passed, {p.failed} failed")
    return 1 if p.failed else 0


if __name__ == "__main__":
    sys.exit(main())
