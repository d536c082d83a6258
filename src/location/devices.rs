//! Tracked devices (tags) and how an advert is matched to one.

use std::collections::HashMap;
use std::io::Read;

use super::beacon::{Advert, BeaconId, Frame, Mac, frames};
use crate::limits;

/// A tag as registered: what it is called and how it is recognised.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    /// Three integers `a/b/c`.
    pub deviceaddress: String,
    /// Topic-safe name used in MQTT topics and messages (no `/`, `+`, `#`).
    pub deviceid: String,
    pub label: String,
    pub tagtype: Option<i64>,
    pub beacon: BeaconId,
    pub contactid: Option<i64>,
}

/// `a/b/c` with three non-negative integers.
pub fn check_address(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split('/').collect();
    let numbers: Vec<u32> = parts
        .iter()
        .filter(|p| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|p| p.parse().ok())
        .collect();
    match (parts.len(), numbers.as_slice()) {
        // Written the one way (`05/1/22` is `5/1/22`), so that an address names one device.
        (3, [a, b, c]) => Ok(format!("{a}/{b}/{c}")),
        _ => Err(format!("{s:?} is not three integers a/b/c")),
    }
}

/// An address as given in a query: its canonical form when it is one, else as given (it then
/// names no device).
pub fn lookup_address(s: &str) -> String {
    check_address(s).unwrap_or_else(|_| s.to_string())
}

/// Topic-safe: 1 to 64 printable ASCII characters without `/`, `+`, `#` or spaces.
pub fn check_deviceid(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'+' | b'#' | b'"' | b'\'' | b'\\'));
    if ok { Ok(()) } else { Err(format!("{s:?} must be 1 to 64 characters without / + # \" ' \\ or spaces")) }
}

/// The default deviceid of an address: `5/1/22` becomes `5.1.22`.
pub fn default_deviceid(address: &str) -> String {
    address.replace('/', ".")
}

/// Reads devices from CSV with the header
/// `deviceaddress,deviceid,label,tagtype,beacon,contactid` (deviceid, tagtype and contactid may
/// be empty; column names in any case). Each device comes with its line in the file (of its
/// first line, for a quoted value over several); errors name the line.
pub fn read_csv(input: impl std::io::Read) -> Result<Vec<(u64, Device)>, String> {
    let max = limits::DEVICE_IMPORT_BYTES_MAX;
    let mut text = Vec::new();
    input.take(max + 1).read_to_end(&mut text).map_err(|e| format!("cannot read it: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    // A record's line: the csv reader's position is where it began to look, before the blank
    // lines it skipped.
    // (Newlines found once: counted from the start for each record, a file of 20,000 took 37 s.)
    let newlines: Vec<usize> = text.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i).collect();
    let line_of = |byte: u64| -> u64 {
        let start = (byte as usize).min(text.len());
        let blank = text[start..].iter().take_while(|b| matches!(b, b'\n' | b'\r')).count();
        1 + newlines.partition_point(|&i| i < start + blank) as u64
    };
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(text.as_slice());
    let headers: Vec<String> =
        reader.headers().map_err(|e| format!("the header line: {e}"))?.iter().map(str::to_ascii_lowercase).collect();
    let column = |name: &str| headers.iter().position(|h| h == name);
    const COLUMNS: [&str; 6] = ["deviceaddress", "deviceid", "label", "tagtype", "beacon", "contactid"];
    if let Some(unknown) = headers.iter().find(|h| !COLUMNS.contains(&h.as_str())) {
        return Err(format!("the header line: unknown column {unknown:?} (columns: {})", COLUMNS.join(",")));
    }
    if let Some(twice) = headers.iter().enumerate().find(|(i, h)| headers[..*i].contains(h)).map(|(_, h)| h) {
        return Err(format!("the header line: column {twice:?} twice"));
    }
    let (Some(address), Some(beacon)) = (column("deviceaddress"), column("beacon")) else {
        return Err("the header line must name at least deviceaddress and beacon".into());
    };
    let (deviceid, label, tagtype, contactid) =
        (column("deviceid"), column("label"), column("tagtype"), column("contactid"));
    let mut out = Vec::new();
    // Every line's mistakes at once: fixing a file of hundreds one run at a time is slow.
    let mut errors = Vec::new();
    for (i, record) in reader.records().enumerate() {
        // The line in the file: blank lines and quoted line breaks count too.
        let position = match &record {
            Ok(r) => r.position(),
            Err(e) => e.position(),
        };
        let line = position.map_or(i as u64 + 2, |p| line_of(p.byte()));
        if i >= limits::LOCATION_DEVICES_MAX {
            errors.push(format!("line {line}: more than {} devices", limits::LOCATION_DEVICES_MAX));
            break;
        }
        match read_row(record, line, address, beacon, (deviceid, label, tagtype, contactid)) {
            Ok(device) => out.push((line, device)),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(out) } else { Err(line_errors(&errors)) }
}

/// The mistakes of a file's lines, one per line of text: at most
/// `DEVICE_IMPORT_ERRORS_SHOWN_MAX`, then how many more there are.
pub fn line_errors(errors: &[String]) -> String {
    let shown = limits::DEVICE_IMPORT_ERRORS_SHOWN_MAX;
    let mut text = errors.iter().take(shown).cloned().collect::<Vec<_>>().join("\n");
    if errors.len() > shown {
        text.push_str(&format!("\n(and {} more)", errors.len() - shown));
    }
    text
}

/// One line of a device list (`line`: its number in the file).
fn read_row(
    record: Result<csv::StringRecord, csv::Error>,
    line: u64,
    address: usize,
    beacon: usize,
    (deviceid, label, tagtype, contactid): (Option<usize>, Option<usize>, Option<usize>, Option<usize>),
) -> Result<Device, String> {
    let record = record.map_err(|e| format!("line {line}: {e}"))?;
    let field = |c: Option<usize>| c.and_then(|c| record.get(c)).unwrap_or("").to_string();
    let deviceaddress = check_address(&field(Some(address))).map_err(|e| format!("line {line}: deviceaddress {e}"))?;
    let id = field(deviceid);
    let id = if id.is_empty() { default_deviceid(&deviceaddress) } else { id };
    check_deviceid(&id).map_err(|e| format!("line {line}: deviceid {e}"))?;
    let beacon_text = field(Some(beacon));
    let beacon = BeaconId::parse(&beacon_text).ok_or_else(|| {
        format!("line {line}: beacon {beacon_text:?} is not ibeacon:UUID/MAJOR/MINOR, eddystone:NAMESPACE/INSTANCE or mac:AA:BB:CC:DD:EE:FF")
    })?;
    let int = |c: Option<usize>, name: &str| -> Result<Option<i64>, String> {
        let v = field(c);
        if v.is_empty() {
            return Ok(None);
        }
        v.parse::<i64>().map(Some).map_err(|_| format!("line {line}: {name} {v:?} is not an integer"))
    };
    Ok(Device {
        deviceaddress,
        deviceid: id,
        label: field(label),
        tagtype: int(tagtype, "tagtype")?,
        beacon,
        contactid: int(contactid, "contactid")?,
    })
}

/// What a reload changed that the engine must follow.
#[derive(Debug, Default, PartialEq)]
pub struct Reloaded {
    /// Slots whose device is gone: their engine state is to be forgotten now (they go to new
    /// devices from the next reload on, so nothing the old device left behind reaches them).
    pub freed: Vec<usize>,
    /// New devices beyond `LOCATION_DEVICES_MAX`, not followed.
    pub skipped: usize,
}

/// What an advert is, once matched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Identified {
    pub device: usize,
    /// From an Eddystone-TLM frame of the device.
    pub battery_mv: Option<u16>,
}

/// Matches adverts to devices: by iBeacon or Eddystone-UID identity, or by MAC. Eddystone-TLM
/// frames carry no identity: they belong to the device whose UID frames came from the same
/// MAC.
///
/// Each device has a slot (the engine's device index) that stays the same across reloads, so
/// the engine's state survives devices being added or changed. The slot of a device that is
/// gone is given to a new device from the next reload on (its engine state forgotten first:
/// see [`Reloaded`]), so that slots are bounded by the devices there are, not by every
/// device there ever was.
pub struct Registry {
    slots: Vec<Option<Device>>,
    /// The key (database id) of each slot.
    keys: Vec<i64>,
    slot_of_key: HashMap<i64, usize>,
    /// Slots freed by an earlier reload, to be given to new devices.
    free: Vec<usize>,
    by_beacon: HashMap<BeaconId, usize>,
    /// MACs seen sending a registered Eddystone-UID (for pairing TLM frames).
    uid_macs: HashMap<Mac, usize>,
}

impl Registry {
    /// Devices by key. Devices with the same identity: the first wins.
    pub fn new(devices: Vec<(i64, Device)>) -> Registry {
        let mut r = Registry {
            slots: Vec::new(),
            keys: Vec::new(),
            slot_of_key: HashMap::new(),
            free: Vec::new(),
            by_beacon: HashMap::new(),
            uid_macs: HashMap::new(),
        };
        r.reload(devices);
        r
    }

    /// Replaces the devices; known keys keep their slots.
    pub fn reload(&mut self, devices: Vec<(i64, Device)>) -> Reloaded {
        // TLM frames carry no identity: a MAC's pairing with its Eddystone-UID stays while its
        // slot holds the same beacon (else a tag's battery went unheard after every change to
        // any device, until its next UID frame).
        let old_beacons: Vec<Option<BeaconId>> = self.slots.iter_mut().map(|s| s.take().map(|d| d.beacon)).collect();
        self.by_beacon.clear();
        let present: std::collections::HashSet<i64> = devices.iter().map(|(k, _)| *k).collect();
        let mut freed: Vec<usize> = Vec::new();
        self.slot_of_key.retain(|key, slot| {
            let keep = present.contains(key);
            if !keep {
                freed.push(*slot);
            }
            keep
        });
        freed.sort_unstable();
        let mut skipped = 0;
        for (key, device) in devices {
            let slot = match self.slot_of_key.get(&key) {
                Some(&slot) => slot,
                None => {
                    let slot = if let Some(slot) = self.free.pop() {
                        self.keys[slot] = key;
                        slot
                    } else if self.slots.len() < limits::LOCATION_DEVICES_MAX {
                        self.slots.push(None);
                        self.keys.push(key);
                        self.slots.len() - 1
                    } else {
                        skipped += 1;
                        continue;
                    };
                    self.slot_of_key.insert(key, slot);
                    slot
                }
            };
            self.by_beacon.entry(device.beacon).or_insert(slot);
            self.slots[slot] = Some(device);
        }
        self.free.extend_from_slice(&freed);
        let slots = &self.slots;
        self.uid_macs.retain(|_, slot| {
            let now = slots.get(*slot).and_then(Option::as_ref).map(|d| &d.beacon);
            now.is_some() && now == old_beacons.get(*slot).and_then(Option::as_ref)
        });
        Reloaded { freed, skipped }
    }

    /// The device in a slot (None: removed since).
    pub fn device(&self, slot: usize) -> Option<&Device> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    /// The slot of the device with this deviceaddress.
    pub fn slot_of_address(&self, address: &str) -> Option<usize> {
        self.slots.iter().position(|d| d.as_ref().is_some_and(|d| d.deviceaddress == address))
    }

    /// The slot of the device with this key (database id).
    pub fn slot(&self, key: i64) -> Option<usize> {
        self.slot_of_key.get(&key).copied()
    }

    pub fn key(&self, slot: usize) -> Option<i64> {
        self.keys.get(slot).copied()
    }

    /// The device an advert comes from, if it is a registered one. Cheap for the rest: a
    /// frame parse and a hash lookup or two.
    pub fn identify(&mut self, advert: &Advert) -> Option<Identified> {
        let mut device = None;
        let mut battery_mv = None;
        let mut tlm = false;
        for frame in frames(advert) {
            match frame {
                Frame::IBeacon { id, .. } => device = device.or_else(|| self.by_beacon.get(&id).copied()),
                Frame::EddystoneUid { id, .. } => {
                    if let Some(&d) = self.by_beacon.get(&id) {
                        device = device.or(Some(d));
                        if self.uid_macs.len() < limits::LOCATION_DEVICES_MAX || self.uid_macs.contains_key(&advert.mac)
                        {
                            self.uid_macs.insert(advert.mac, d);
                        }
                    }
                }
                Frame::EddystoneTlm { battery_mv: mv } => {
                    tlm = true;
                    battery_mv = mv;
                }
            }
        }
        let device = device
            .or_else(|| self.by_beacon.get(&BeaconId::Mac(advert.mac)).copied())
            .or_else(|| if tlm { self.uid_macs.get(&advert.mac).copied() } else { None })?;
        Some(Identified { device, battery_mv })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_devices() {
        let text = "deviceaddress,deviceid,label,tagtype,beacon,contactid\n\
                    5/1/22,,Badge 22,1,ibeacon:f7826da6-4fa2-4e98-8024-bc5b71e0893e/5/22,\n\
                    5/1/23,tag-23,\"Badge, 23\",,mac:AA:BB:CC:DD:EE:23,7\n";
        let d: Vec<Device> = read_csv(text.as_bytes()).unwrap().into_iter().map(|(_, d)| d).collect();
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].deviceid.as_str(), d[0].tagtype, d[0].contactid), ("5.1.22", Some(1), None));
        assert_eq!((d[1].label.as_str(), d[1].contactid), ("Badge, 23", Some(7)));
        for (bad, why) in [
            ("deviceaddress,beacon\n5/1,mac:AA:BB:CC:DD:EE:01\n", "line 2: deviceaddress"),
            ("deviceaddress,beacon\n5/1/2,mac:zz\n", "line 2: beacon"),
            ("deviceaddress,deviceid,beacon\n5/1/2,a/b,mac:AA:BB:CC:DD:EE:01\n", "line 2: deviceid"),
            ("label,beacon\nx,mac:AA:BB:CC:DD:EE:01\n", "the header line"),
            (
                "deviceaddress,beacon,contact_id\n5/1/2,mac:AA:BB:CC:DD:EE:01,1\n",
                "the header line: unknown column \"contact_id\"",
            ),
        ] {
            let err = read_csv(bad.as_bytes()).unwrap_err();
            assert!(err.starts_with(why), "{err}");
        }
        // Every bad line is named in one go, the good ones too are not imported.
        let err = read_csv(
            "deviceaddress,beacon\n5/1/1,mac:AA:BB:CC:DD:EE:01\n5/1,mac:AA:BB:CC:DD:EE:02\n5/1/3,mac:zz\n".as_bytes(),
        )
        .unwrap_err();
        assert_eq!(err.lines().count(), 2, "{err}");
        assert!(err.starts_with("line 3: deviceaddress") && err.contains("\nline 4: beacon"), "{err}");
        // Lines are the file's: blank lines and a quoted line break count. Column names in any
        // case; a column named twice is refused.
        let err = read_csv(
            "DeviceAddress,Beacon,label\n\n5/1/1,mac:AA:BB:CC:DD:EE:01,\"two\nlines\"\n\n5/1/2,mac:zz,\n".as_bytes(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "line 6: beacon \"mac:zz\" is not ibeacon:UUID/MAJOR/MINOR, eddystone:NAMESPACE/INSTANCE or mac:AA:BB:CC:DD:EE:FF"
        );
        let ok = read_csv(
            "deviceaddress,beacon\r\n\r\n\r\n5/1/1,mac:AA:BB:CC:DD:EE:01\r\n\r\n5/1/2,mac:AA:BB:CC:DD:EE:02\r\n5/1/3,mac:AA:BB:CC:DD:EE:03"
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(ok.iter().map(|(line, _)| *line).collect::<Vec<_>>(), [4, 6, 7]);
        let err = read_csv("deviceaddress,beacon,beacon\n5/1/1,mac:AA:BB:CC:DD:EE:01,x\n".as_bytes()).unwrap_err();
        assert_eq!(err, "the header line: column \"beacon\" twice");
    }

    #[test]
    fn adverts_are_matched_and_tlm_is_paired_by_mac() {
        let uid = BeaconId::parse("eddystone:edd5f3b6f0e1a40c9b2a/000102030405").unwrap();
        let device = |addr: &str, beacon| Device {
            deviceaddress: addr.into(),
            deviceid: default_deviceid(addr),
            label: String::new(),
            tagtype: None,
            beacon,
            contactid: None,
        };
        let mut r = Registry::new(vec![
            (10, device("1/1/1", uid)),
            (20, device("1/1/2", BeaconId::parse("mac:AA:BB:CC:DD:EE:02").unwrap())),
        ]);
        let mac = Mac([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x01]);
        let advert = |mac: Mac, svc: Vec<(u16, Vec<u8>)>| Advert {
            t_ms: 0,
            receiver: "hci0".into(),
            mac,
            rssi: -60,
            mfg: vec![],
            svc,
        };
        let tlm = hex::decode("20000bb8").unwrap();
        // TLM before any UID from that MAC: unknown.
        assert_eq!(r.identify(&advert(mac, vec![(0xfeaa, tlm.clone())])), None);
        let uid_frame = hex::decode("00e7edd5f3b6f0e1a40c9b2a000102030405").unwrap();
        assert_eq!(
            r.identify(&advert(mac, vec![(0xfeaa, uid_frame)])),
            Some(Identified { device: 0, battery_mv: None })
        );
        assert_eq!(
            r.identify(&advert(mac, vec![(0xfeaa, tlm.clone())])),
            Some(Identified { device: 0, battery_mv: Some(3000) })
        );
        // A change to another device keeps the pairing; a change of this device's beacon ends it.
        let other = (20, device("1/1/2", BeaconId::parse("mac:AA:BB:CC:DD:EE:02").unwrap()));
        r.reload(vec![(10, device("1/1/1", uid)), other.clone()]);
        assert_eq!(r.identify(&advert(mac, vec![(0xfeaa, tlm.clone())])).map(|i| i.device), Some(0));
        let uid2 = BeaconId::parse("eddystone:edd5f3b6f0e1a40c9b2a/000102030406").unwrap();
        r.reload(vec![(10, device("1/1/1", uid2)), other.clone()]);
        assert_eq!(r.identify(&advert(mac, vec![(0xfeaa, tlm)])), None);
        r.reload(vec![(10, device("1/1/1", uid)), other]);
        let mac2 = Mac([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x02]);
        assert_eq!(r.identify(&advert(mac2, vec![])).map(|i| i.device), Some(1));
        assert_eq!(r.identify(&advert(Mac([9; 6]), vec![])), None);
        // A reload keeps slots by key, and a removed device is no longer matched.
        let reloaded = r.reload(vec![(20, device("1/1/2", BeaconId::parse("mac:AA:BB:CC:DD:EE:02").unwrap()))]);
        assert_eq!(reloaded, Reloaded { freed: vec![0], skipped: 0 });
        assert_eq!(r.identify(&advert(mac2, vec![])).map(|i| i.device), Some(1));
        assert_eq!((r.key(1), r.device(0)), (Some(20), None));
        // The freed slot goes to the next new device, from the next reload on.
        let mac3 = BeaconId::parse("mac:AA:BB:CC:DD:EE:03").unwrap();
        r.reload(vec![
            (20, device("1/1/2", BeaconId::parse("mac:AA:BB:CC:DD:EE:02").unwrap())),
            (30, device("1/1/3", mac3)),
        ]);
        assert_eq!((r.key(0), r.device(0).map(|d| d.deviceaddress.as_str())), (Some(30), Some("1/1/3")));
    }

    /// A deviceid goes into MQTT topics and JSON: nothing that would need quoting there.
    #[test]
    fn deviceids_are_topic_safe() {
        for ok in ["5.1.22", "visitor-23", "A_b~c"] {
            assert!(check_deviceid(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a+b", "a#b", "a\"b", "a'b", "a\\b", "a b", "a\tb", "é", &"x".repeat(65)] {
            assert!(check_deviceid(bad).is_err(), "{bad:?}");
        }
    }

    /// Devices added and deleted one after another, far more of them over time than
    /// `LOCATION_DEVICES_MAX`: each new one is still followed (slots were never given back,
    /// and past the bound new devices were silently not located until a restart).
    #[test]
    fn slots_of_deleted_devices_are_reused() {
        let device = |n: u32| Device {
            deviceaddress: format!("1/{}/{}", n / 1000, n % 1000),
            deviceid: format!("d{n}"),
            label: String::new(),
            tagtype: None,
            beacon: BeaconId::Mac(Mac([0, 0, (n >> 16) as u8, (n >> 8) as u8, n as u8, 1])),
            contactid: None,
        };
        let mut r = Registry::new(Vec::new());
        let rounds = u32::try_from(limits::LOCATION_DEVICES_MAX).unwrap() + 10;
        for n in 0..rounds {
            let reloaded = r.reload(vec![(i64::from(n), device(n))]);
            assert_eq!(reloaded.skipped, 0, "device {n} not followed");
        }
        assert!(r.slots.len() <= 2, "{} slots", r.slots.len());
        let last = rounds - 1;
        let advert = Advert {
            t_ms: 0,
            receiver: "hci0".into(),
            mac: Mac([0, 0, (last >> 16) as u8, (last >> 8) as u8, last as u8, 1]),
            rssi: -60,
            mfg: vec![],
            svc: vec![],
        };
        let slot = r.identify(&advert).expect("the newest device is matched").device;
        assert_eq!(r.key(slot), Some(i64::from(last)));
    }
}
