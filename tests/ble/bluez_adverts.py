"""BlueZ mock template for beacon advertisements (python-dbusmock).

Load with ``python -m dbusmock --system --template tests/ble/bluez_adverts.py``.

It serves org.bluez the way bluetoothd 5.6x does for an LE scanning client such as
btleplug (bluez-async):

* ``/`` is the ObjectManager (GetManagedObjects, InterfacesAdded, InterfacesRemoved);
  ``/org/bluez`` has AgentManager1 and ProfileManager1 (from the stock bluez5 template).
* Adapters (``/org/bluez/hciN``, org.bluez.Adapter1) keep per-client discovery sessions:
  SetDiscoveryFilter, StartDiscovery, StopDiscovery, GetDiscoveryFilters, RemoveDevice.
  As in bluetoothd: StartDiscovery/SetDiscoveryFilter need the adapter powered
  (org.bluez.Error.NotReady), a second StartDiscovery from the same client fails with
  org.bluez.Error.InProgress, StopDiscovery without a session fails with
  org.bluez.Error.Failed, a client that leaves the bus loses its session, and Discovering
  is true while any session exists. Setting Powered emits PropertiesChanged only when the
  value changes; powering off removes the (unpaired) devices and ends every discovery
  session, so clients must StartDiscovery again after power comes back.
* Devices (``/org/bluez/hciN/dev_AA_BB_CC_DD_EE_FF``, org.bluez.Device1) carry correctly
  typed properties: RSSI and TxPower ``n``, ManufacturerData ``a{qv}`` and ServiceData
  ``a{sv}`` (keys are full 128-bit UUID strings) whose variants hold ``ay``.

Advertisements are injected through org.bluez.Mock (methods below). An advertisement for
an unknown address creates the device and announces it with one InterfacesAdded carrying
all its properties; like bluetoothd, no PropertiesChanged is sent for that first sighting
unless the template parameter ``changed_on_first_sight`` is true. Later advertisements
send at most one PropertiesChanged each, holding what changed, by bluetoothd's rules:

* RSSI: always when every discovering client has set a discovery filter (btleplug does);
  otherwise only when it moved by 8 dBm or more.
* ManufacturerData / ServiceData: with DuplicateData true in some client's filter (btleplug
  sets it), the advertisement's data replace the old and are sent every time; otherwise
  entries are merged and only changes are sent. The property holds every entry.
* UUIDs, Name, TxPower, AdvertisingFlags: when they change.

Discovery filters are honoured as bluetoothd merges them: adverts below the lowest RSSI
filter, or lacking every UUID of the filters, are not reported (UUIDs are matched against
the advertised service UUID list, not against service data keys). Pathloss is ignored.

org.bluez.Mock methods (on ``/``):

* ``AddAdapter(s name, s system_name) -> o``: add ``/org/bluez/<name>``, powered, not
  discovering.
* ``RemoveAdapter(s name)``: remove it and its devices (InterfacesRemoved).
* ``Advertise(s adapter, s address, n rssi, a{qay} manufacturer_data,
  a{say} service_data, a{sv} extra) -> b``: one advertisement; returns whether it was
  reported (false when a discovery filter dropped it). ``extra`` may hold ``name`` (s),
  ``tx_power`` (n), ``address_type`` (s, "random" by default), ``uuids`` (as, full UUIDs)
  and ``flags`` (y). Fails with org.bluez.Error.NotReady if the adapter is off and with
  org.bluez.Mock.Error.NotDiscovering if no client is discovering.
* ``AdvertiseMany(s adapter, a(sna{qay}a{say}a{sv}) adverts) -> (uu)``: many, in order;
  returns (reported, dropped by filters).
* ``SetPowered(s adapter, b powered)``: the adapter is switched on or off from outside
  (as ``bluetoothctl power off`` or rfkill would), with the effects described above.
* ``SimulateShutdown(s adapter)``: what a graceful bluetoothd stop shows before its name
  leaves the bus: adapter powered off (PropertiesChanged Powered/Discovering false), then
  InterfacesRemoved for its devices and the adapter.
* ``GetState(s adapter) -> s``: JSON with powered, discovering, clients, devices, counters.
"""

import json

import dbus
import dbus.service

from dbusmock import OBJECT_MANAGER_IFACE, mockobject
from dbusmock.templates import bluez5

BUS_NAME = "org.bluez"
MAIN_OBJ = "/"
SYSTEM_BUS = True
IS_OBJECT_MANAGER = True

MOCK_IFACE = "org.bluez.Mock"
ADAPTER_IFACE = "org.bluez.Adapter1"
DEVICE_IFACE = "org.bluez.Device1"
PROPS_IFACE = dbus.PROPERTIES_IFACE
DBUS_IFACE = "org.freedesktop.DBus"

# bluetoothd reports an RSSI change without a discovery filter only past this delta.
RSSI_THRESHOLD = 8
DISCOVERY_FILTERS = ["UUIDs", "RSSI", "Pathloss", "Transport", "DuplicateData", "Discoverable", "Pattern"]
ADAPTER_WRITABLE = {"Powered", "Discoverable", "Pairable", "Alias", "DiscoverableTimeout", "PairableTimeout"}

_settings = {"changed_on_first_sight": False, "connection": None}


def _error(name, message):
    return dbus.exceptions.DBusException(message, name=name)


def _not_ready():
    return _error("org.bluez.Error.NotReady", "Resource Not Ready")


def _emit(path, interface, member, signature, *args):
    """Send one signal straight on the mock's connection (no per-signal logging)."""
    msg = dbus.lowlevel.SignalMessage(path, interface, member)
    msg.append(*args, signature=signature)
    _settings["connection"].send_message(msg)


def _properties_changed(path, interface, changed):
    _emit(
        path,
        PROPS_IFACE,
        "PropertiesChanged",
        "sa{sv}as",
        interface,
        dbus.Dictionary(changed, signature="sv"),
        dbus.Array([], signature="s"),
    )


def _interfaces_added(path, interface, props):
    _emit(
        MAIN_OBJ,
        OBJECT_MANAGER_IFACE,
        "InterfacesAdded",
        "oa{sa{sv}}",
        dbus.ObjectPath(path),
        dbus.Dictionary({interface: dbus.Dictionary(props, signature="sv")}, signature="sa{sv}"),
    )


def _interfaces_removed(path, interfaces):
    _emit(
        MAIN_OBJ,
        OBJECT_MANAGER_IFACE,
        "InterfacesRemoved",
        "oas",
        dbus.ObjectPath(path),
        dbus.Array(interfaces, signature="s"),
    )


def _mfg_value(entries):
    return dbus.Dictionary(
        {dbus.UInt16(k): dbus.ByteArray(bytes(v)) for k, v in entries.items()}, signature="qv"
    )


def _svc_value(entries):
    return dbus.Dictionary({dbus.String(k): dbus.ByteArray(bytes(v)) for k, v in entries.items()}, signature="sv")


def _device_path(adapter_path, address):
    return adapter_path + "/dev_" + address.replace(":", "_").upper()


def _adapter(name):
    path = "/org/bluez/" + name
    obj = mockobject.objects.get(path)
    if not isinstance(obj, Adapter):
        raise _error(MOCK_IFACE + ".NoSuchAdapter", f"Adapter {name} does not exist.")
    return obj


class Adapter(mockobject.DBusMockObject):
    """org.bluez.Adapter1 with bluetoothd's discovery-session and power semantics."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sessions = {}  # client unique name -> filter dict or None, for discovering clients
        self.preset = {}  # client unique name -> filter dict set before StartDiscovery
        self.watches = {}  # client unique name -> signal match
        self.devices = {}  # object path -> DeviceState
        self.reported = 0
        self.dropped = 0

    # --- helpers -------------------------------------------------------------

    @property
    def adapter_props(self):
        return self.props[ADAPTER_IFACE]

    def powered(self):
        return bool(self.adapter_props["Powered"])

    def discovering(self):
        return bool(self.adapter_props["Discovering"])

    def _set_discovering(self, value, changed):
        if bool(self.adapter_props["Discovering"]) != value:
            self.adapter_props["Discovering"] = dbus.Boolean(value)
            changed["Discovering"] = dbus.Boolean(value)

    def _watch(self, client):
        if client in self.watches:
            return

        def gone(name, _old, new):
            if name == client and not new:
                self._client_left(client)

        self.watches[client] = self.connection.add_signal_receiver(
            gone,
            signal_name="NameOwnerChanged",
            dbus_interface=DBUS_IFACE,
            bus_name=DBUS_IFACE,
            path="/org/freedesktop/DBus",
            arg0=client,
        )

    def _unwatch(self, client):
        match = self.watches.pop(client, None)
        if match is not None:
            match.remove()

    def _client_left(self, client):
        self.preset.pop(client, None)
        was = client in self.sessions
        self.sessions.pop(client, None)
        self._unwatch(client)
        if was and not self.sessions:
            changed = {}
            self._set_discovering(False, changed)
            if changed:
                _properties_changed(self.path, ADAPTER_IFACE, changed)

    def merged_filter(self):
        """The effective filter, merged over discovering clients as bluetoothd does."""
        filters = list(self.sessions.values())
        filtered = bool(filters) and all(f is not None for f in filters)
        duplicate = any(f is not None and bool(f.get("DuplicateData", False)) for f in filters)
        rssi = None
        uuids = None
        if filtered:
            if all("RSSI" in f for f in filters):
                rssi = min(int(f["RSSI"]) for f in filters)
            if all(f.get("UUIDs") for f in filters):
                uuids = {str(u).lower() for f in filters for u in f["UUIDs"]}
        return filtered, duplicate, rssi, uuids

    def remove_device(self, path):
        self.devices.pop(path, None)
        if path in mockobject.objects:
            mockobject.objects[path].remove_from_connection()
            del mockobject.objects[path]
            _interfaces_removed(path, [DEVICE_IFACE])

    def remove_all_devices(self):
        for path in list(self.devices):
            self.remove_device(path)

    def set_powered(self, value):
        """Power the adapter on or off; returns the changed properties (already emitted)."""
        if self.powered() == value:
            return {}
        changed = {}
        if not value:
            # property_set_mode(): temporary (unpaired) devices go; adapter_stop(): every
            # discovery session and pre-set filter goes and Discovering drops.
            self.remove_all_devices()
            for client in list(self.watches):
                self._unwatch(client)
            self.sessions.clear()
            self.preset.clear()
            self._set_discovering(False, changed)
        self.adapter_props["Powered"] = dbus.Boolean(value)
        self.adapter_props["PowerState"] = dbus.String("on" if value else "off")
        changed["Powered"] = dbus.Boolean(value)
        changed["PowerState"] = dbus.String("on" if value else "off")
        _properties_changed(self.path, ADAPTER_IFACE, changed)
        return changed

    # --- org.bluez.Adapter1 --------------------------------------------------

    @dbus.service.method(ADAPTER_IFACE, in_signature="a{sv}", out_signature="", sender_keyword="sender")
    def SetDiscoveryFilter(self, discovery_filter, sender=None):
        if not self.powered():
            raise _not_ready()
        flt = dict(discovery_filter) if len(discovery_filter) else None
        if flt is not None:
            unknown = set(flt) - set(DISCOVERY_FILTERS)
            if unknown or ("RSSI" in flt and "Pathloss" in flt):
                raise _error("org.bluez.Error.InvalidArguments", "Invalid arguments in method call")
        if sender in self.sessions:
            self.sessions[sender] = flt
        elif flt is None:
            self.preset.pop(sender, None)
        else:
            self.preset[sender] = flt
            self._watch(sender)

    @dbus.service.method(ADAPTER_IFACE, in_signature="", out_signature="", sender_keyword="sender")
    def StartDiscovery(self, sender=None):
        if not self.powered():
            raise _not_ready()
        if sender in self.sessions:
            raise _error("org.bluez.Error.InProgress", "Operation already in progress")
        self.sessions[sender] = self.preset.pop(sender, None)
        self._watch(sender)
        changed = {}
        self._set_discovering(True, changed)
        if changed:
            _properties_changed(self.path, ADAPTER_IFACE, changed)

    @dbus.service.method(ADAPTER_IFACE, in_signature="", out_signature="", sender_keyword="sender")
    def StopDiscovery(self, sender=None):
        if not self.powered():
            raise _not_ready()
        if sender not in self.sessions:
            raise _error("org.bluez.Error.Failed", "No discovery started")
        del self.sessions[sender]
        self._unwatch(sender)
        changed = {}
        if not self.sessions:
            self._set_discovering(False, changed)
        if changed:
            _properties_changed(self.path, ADAPTER_IFACE, changed)

    @dbus.service.method(ADAPTER_IFACE, in_signature="", out_signature="as")
    def GetDiscoveryFilters(self):
        return dbus.Array(DISCOVERY_FILTERS, signature="s")

    @dbus.service.method(ADAPTER_IFACE, in_signature="o", out_signature="")
    def RemoveDevice(self, path):
        if str(path) not in self.devices:
            raise _error("org.bluez.Error.DoesNotExist", "Does Not Exist")
        self.remove_device(str(path))

    # --- org.freedesktop.DBus.Properties.Set ----------------------------------

    @dbus.service.method(PROPS_IFACE, in_signature="ssv", out_signature="")
    def Set(self, interface_name, property_name, value, *_, **__):
        if interface_name != ADAPTER_IFACE:
            raise _error("org.freedesktop.DBus.Error.UnknownInterface", "No such interface " + interface_name)
        if property_name not in self.adapter_props:
            raise _error("org.freedesktop.DBus.Error.UnknownProperty", "No such property " + property_name)
        if property_name not in ADAPTER_WRITABLE:
            raise _error("org.freedesktop.DBus.Error.PropertyReadOnly", "Property " + property_name + " is read-only")
        if property_name == "Powered":
            self.set_powered(bool(value))
            return
        old = self.adapter_props[property_name]
        new = type(old)(value)
        if old != new:
            self.adapter_props[property_name] = new
            _properties_changed(self.path, ADAPTER_IFACE, {property_name: new})


class Device(mockobject.DBusMockObject):
    """org.bluez.Device1. GetAll skips dbusmock's per-call log line (a client that reads a
    device for every event would grow the log by megabytes per second at burst rates); it is
    counted instead (``device_reads`` in the state)."""

    @dbus.service.method(PROPS_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface_name, *_, **__):
        _settings["device_reads"] = _settings.get("device_reads", 0) + 1
        try:
            return self.props[interface_name or self.interface]
        except KeyError:
            raise _error("org.freedesktop.DBus.Error.UnknownInterface", "No such interface " + interface_name) from None


class DeviceState:
    """What bluetoothd remembers of a device between advertisements."""

    __slots__ = ("mfg", "svc", "uuids")

    def __init__(self):
        self.mfg = {}
        self.svc = {}
        self.uuids = []


def _advertise(adapter, address, rssi, mfg, svc, extra):
    """Apply one advertisement; returns True if it was reported, False if filtered out."""
    filtered, duplicate, rssi_min, uuid_filter = adapter.merged_filter()
    rssi = int(rssi)
    uuids = [str(u).lower() for u in extra.get("uuids", [])]
    if rssi_min is not None and rssi < rssi_min:
        adapter.dropped += 1
        return False
    if uuid_filter is not None and not uuid_filter.intersection(uuids):
        adapter.dropped += 1
        return False
    adapter.reported += 1

    path = _device_path(adapter.path, address)
    mfg = {int(k): bytes(v) for k, v in mfg.items()}
    svc = {str(k).lower(): bytes(v) for k, v in svc.items()}
    state = adapter.devices.get(path)

    if state is None:
        state = DeviceState()
        state.mfg = dict(mfg)
        state.svc = dict(svc)
        state.uuids = list(dict.fromkeys(uuids))
        name = extra.get("name")
        props = {
            "Address": dbus.String(address),
            "AddressType": dbus.String(extra.get("address_type", "random")),
            "Alias": dbus.String(name if name else address.replace(":", "-")),
            "Paired": dbus.Boolean(False),
            "Bonded": dbus.Boolean(False),
            "Trusted": dbus.Boolean(False),
            "Blocked": dbus.Boolean(False),
            "LegacyPairing": dbus.Boolean(False),
            "Connected": dbus.Boolean(False),
            "UUIDs": dbus.Array(state.uuids, signature="s"),
            "Adapter": dbus.ObjectPath(adapter.path),
            "ServicesResolved": dbus.Boolean(False),
        }
        if name:
            props["Name"] = dbus.String(name)
        if rssi != 0:
            props["RSSI"] = dbus.Int16(rssi)
        if "tx_power" in extra:
            props["TxPower"] = dbus.Int16(int(extra["tx_power"]))
        if state.mfg:
            props["ManufacturerData"] = _mfg_value(state.mfg)
        if state.svc:
            props["ServiceData"] = _svc_value(state.svc)
        if "flags" in extra:
            props["AdvertisingFlags"] = dbus.ByteArray(bytes([int(extra["flags"]) & 0xFF]))
        adapter.AddObject(path, DEVICE_IFACE, props, [], mock_class=Device)
        adapter.devices[path] = state
        _interfaces_added(path, DEVICE_IFACE, props)
        if _settings["changed_on_first_sight"]:
            changed = {k: props[k] for k in ("RSSI", "ManufacturerData", "ServiceData") if k in props}
            if changed:
                _properties_changed(path, DEVICE_IFACE, changed)
        return True

    props = mockobject.objects[path].props[DEVICE_IFACE]
    changed = {}

    old_rssi = int(props.get("RSSI", 0))
    if rssi == 0 or old_rssi == 0:
        report_rssi = rssi != old_rssi
    else:
        report_rssi = abs(rssi - old_rssi) >= (0 if filtered else RSSI_THRESHOLD)
    if report_rssi:
        if rssi == 0:
            props.pop("RSSI", None)
        else:
            props["RSSI"] = dbus.Int16(rssi)
        changed["RSSI"] = dbus.Int16(rssi)

    for key, new, current, make in (
        ("ManufacturerData", mfg, state.mfg, _mfg_value),
        ("ServiceData", svc, state.svc, _svc_value),
    ):
        if not new:
            continue
        if duplicate:
            current.clear()
            current.update(new)
            emit = True
        else:
            emit = any(current.get(k) != v for k, v in new.items())
            current.update(new)
        if emit:
            props[key] = make(current)
            changed[key] = props[key]

    added = [u for u in dict.fromkeys(uuids) if u not in state.uuids]
    if added:
        state.uuids.extend(added)
        props["UUIDs"] = dbus.Array(state.uuids, signature="s")
        changed["UUIDs"] = props["UUIDs"]

    name = extra.get("name")
    if name and props.get("Name") != name:
        # Nobody sets an alias on a beacon, so Alias follows Name as in bluetoothd.
        props["Name"] = dbus.String(name)
        props["Alias"] = dbus.String(name)
        changed["Name"] = props["Name"]
        changed["Alias"] = props["Alias"]

    if "tx_power" in extra and props.get("TxPower") != int(extra["tx_power"]):
        props["TxPower"] = dbus.Int16(int(extra["tx_power"]))
        changed["TxPower"] = props["TxPower"]

    if "flags" in extra:
        flags = dbus.ByteArray(bytes([int(extra["flags"]) & 0xFF]))
        if bytes(props.get("AdvertisingFlags", b"")) != bytes(flags):
            props["AdvertisingFlags"] = flags
            changed["AdvertisingFlags"] = flags

    if changed:
        _properties_changed(path, DEVICE_IFACE, changed)
    return True


def _remove_adapter(adapter):
    adapter.remove_all_devices()
    for client in list(adapter.watches):
        adapter._unwatch(client)
    adapter.remove_from_connection()
    del mockobject.objects[adapter.path]
    _interfaces_removed(adapter.path, [ADAPTER_IFACE])


def _check_scanning(adapter):
    if not adapter.powered():
        raise _not_ready()
    if not adapter.discovering():
        raise _error(
            MOCK_IFACE + ".Error.NotDiscovering",
            f"No client is discovering on {adapter.path} (StartDiscovery not called, or ended by power off)",
        )


# The org.bluez.Mock methods live in a class namespace so that dbusmock's AddTemplate does
# not wrap them in its call logger (which re-broadcasts every argument as a MethodCalled
# signal: far too slow for bursts). load() registers them on the main object.
class _MockMethods:
    @dbus.service.method(MOCK_IFACE, in_signature="ss", out_signature="o")
    def AddAdapter(self, device_name, system_name):
        path = "/org/bluez/" + device_name
        if path in mockobject.objects:
            raise _error(MOCK_IFACE + ".AdapterExists", f"Adapter {device_name} already exists.")
        index = int("".join(c for c in device_name if c.isdigit()) or 0)
        props = {
            "Address": dbus.String(f"00:1A:7D:DA:71:{index & 0xFF:02X}"),
            "AddressType": dbus.String("public"),
            "Name": dbus.String(system_name),
            "Alias": dbus.String(system_name),
            "Class": dbus.UInt32(0x6C010C),
            "Powered": dbus.Boolean(True),
            "PowerState": dbus.String("on"),
            "Discoverable": dbus.Boolean(False),
            "DiscoverableTimeout": dbus.UInt32(180),
            "Pairable": dbus.Boolean(True),
            "PairableTimeout": dbus.UInt32(0),
            "Discovering": dbus.Boolean(False),
            "UUIDs": dbus.Array(
                [
                    "00001800-0000-1000-8000-00805f9b34fb",
                    "00001801-0000-1000-8000-00805f9b34fb",
                    "0000110e-0000-1000-8000-00805f9b34fb",
                    "0000110c-0000-1000-8000-00805f9b34fb",
                    "00001200-0000-1000-8000-00805f9b34fb",
                ],
                signature="s",
            ),
            "Modalias": dbus.String("usb:v1D6Bp0246d0548"),
            "Roles": dbus.Array(["central", "peripheral"], signature="s"),
        }
        self.AddObject(path, ADAPTER_IFACE, props, [], mock_class=Adapter)
        _interfaces_added(path, ADAPTER_IFACE, props)
        return dbus.ObjectPath(path)

    @dbus.service.method(MOCK_IFACE, in_signature="s", out_signature="")
    def RemoveAdapter(self, device_name):
        _remove_adapter(_adapter(device_name))

    @dbus.service.method(
        MOCK_IFACE, in_signature="ssna{qay}a{say}a{sv}", out_signature="b", byte_arrays=True
    )
    def Advertise(self, adapter_name, address, rssi, mfg, svc, extra):
        adapter = _adapter(adapter_name)
        _check_scanning(adapter)
        return dbus.Boolean(_advertise(adapter, str(address).upper(), rssi, mfg, svc, extra))

    @dbus.service.method(
        MOCK_IFACE, in_signature="sa(sna{qay}a{say}a{sv})", out_signature="uu", byte_arrays=True
    )
    def AdvertiseMany(self, adapter_name, adverts):
        adapter = _adapter(adapter_name)
        _check_scanning(adapter)
        reported = 0
        for address, rssi, mfg, svc, extra in adverts:
            if _advertise(adapter, str(address).upper(), rssi, mfg, svc, extra):
                reported += 1
        return (dbus.UInt32(reported), dbus.UInt32(len(adverts) - reported))

    @dbus.service.method(MOCK_IFACE, in_signature="sb", out_signature="")
    def SetPowered(self, adapter_name, powered):
        _adapter(adapter_name).set_powered(bool(powered))

    @dbus.service.method(MOCK_IFACE, in_signature="s", out_signature="")
    def SimulateShutdown(self, adapter_name):
        adapter = _adapter(adapter_name)
        # adapter_shutdown() powers the controller down through mgmt, which ends in
        # adapter_stop(): Discovering and Powered go false. Devices are not removed by
        # that path; they (and the adapter) go when bluetoothd unregisters its objects.
        changed = {}
        adapter.sessions.clear()
        adapter.preset.clear()
        for client in list(adapter.watches):
            adapter._unwatch(client)
        adapter._set_discovering(False, changed)
        if adapter.powered():
            adapter.adapter_props["Powered"] = dbus.Boolean(False)
            adapter.adapter_props["PowerState"] = dbus.String("off")
            changed["Powered"] = dbus.Boolean(False)
            changed["PowerState"] = dbus.String("off")
        if changed:
            _properties_changed(adapter.path, ADAPTER_IFACE, changed)
        _remove_adapter(adapter)

    @dbus.service.method(MOCK_IFACE, in_signature="s", out_signature="s")
    def GetState(self, adapter_name):
        adapter = _adapter(adapter_name)
        filtered, duplicate, rssi_min, uuids = adapter.merged_filter()
        return json.dumps(
            {
                "powered": adapter.powered(),
                "discovering": adapter.discovering(),
                "clients": sorted(adapter.sessions),
                "filtered": filtered,
                "duplicate_data": duplicate,
                "rssi_filter": rssi_min,
                "uuid_filter": sorted(uuids) if uuids is not None else None,
                "devices": sorted(str(mockobject.objects[p].props[DEVICE_IFACE]["Address"]) for p in adapter.devices),
                "reported": adapter.reported,
                "dropped": adapter.dropped,
                "device_reads": _settings.get("device_reads", 0),
            }
        )


def load(mock, parameters):
    # /org/bluez with AgentManager1 and ProfileManager1, as in the stock template.
    bluez5.load(mock, parameters)
    _settings["changed_on_first_sight"] = bool(parameters.get("changed_on_first_sight", False))
    _settings["connection"] = mock.connection
    for fn in vars(_MockMethods).values():
        if hasattr(fn, "_dbus_interface"):
            mock.methods.setdefault(fn._dbus_interface, {})[fn.__name__] = (
                fn._dbus_in_signature,
                fn._dbus_out_signature,
                "",
                fn,
            )
