//! Adverts and the beacon formats in them: iBeacon, Eddystone-UID and Eddystone-TLM.
//!
//! An [`Advert`] is what any source (BlueZ, a trace, a remote receiver) delivers: one
//! advertisement heard by one receiver at one time. Everything after the source works on it.

use std::fmt;
use std::sync::Arc;

/// Apple's company id, under which iBeacon frames travel.
pub const COMPANY_APPLE: u16 = 0x004c;
/// The 16-bit service UUID of Eddystone frames.
pub const SERVICE_EDDYSTONE: u16 = 0xfeaa;

/// One advertisement as a receiver heard it.
#[derive(Clone, Debug, PartialEq)]
pub struct Advert {
    /// Unix milliseconds: when it arrived (live) or the trace's time (replay).
    pub t_ms: i64,
    /// The receiver that heard it (`hci0`, or a remote scanner's name).
    pub receiver: Arc<str>,
    pub mac: Mac,
    /// dBm as the receiver reported it (before the receiver's calibration offset).
    pub rssi: i16,
    /// Manufacturer data: company id and the bytes after it.
    pub mfg: Vec<(u16, Vec<u8>)>,
    /// Service data: 16-bit service UUID and its bytes.
    pub svc: Vec<(u16, Vec<u8>)>,
}

/// A Bluetooth device address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// `AA:BB:CC:DD:EE:FF` (either case).
    pub fn parse(s: &str) -> Option<Mac> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let p = parts.next()?;
            if p.len() != 2 {
                return None;
            }
            *byte = u8::from_str_radix(p, 16).ok()?;
        }
        parts.next().is_none().then_some(Mac(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02X}:{:02X}:{:02X}:{:02X}:{:02X}:{:02X}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

/// What identifies a tag: the identity a device is registered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BeaconId {
    IBeacon { uuid: [u8; 16], major: u16, minor: u16 },
    Eddystone { namespace: [u8; 10], instance: [u8; 6] },
    Mac(Mac),
}

impl BeaconId {
    /// `ibeacon:<uuid>/<major>/<minor>`, `eddystone:<namespace hex>/<instance hex>` or
    /// `mac:AA:BB:CC:DD:EE:FF`. The uuid may have dashes or not; hex in either case.
    pub fn parse(s: &str) -> Option<BeaconId> {
        let (scheme, rest) = s.trim().split_once(':')?;
        match scheme.to_ascii_lowercase().as_str() {
            "ibeacon" => {
                let mut parts = rest.split('/');
                let uuid: String = parts.next()?.chars().filter(|c| *c != '-').collect();
                let uuid: [u8; 16] = hex::decode(uuid).ok()?.try_into().ok()?;
                let major = parts.next()?.trim().parse().ok()?;
                let minor = parts.next()?.trim().parse().ok()?;
                parts.next().is_none().then_some(BeaconId::IBeacon { uuid, major, minor })
            }
            "eddystone" => {
                let (ns, inst) = rest.split_once('/')?;
                let namespace = hex::decode(ns).ok()?.try_into().ok()?;
                let instance = hex::decode(inst).ok()?.try_into().ok()?;
                Some(BeaconId::Eddystone { namespace, instance })
            }
            "mac" => Mac::parse(rest).map(BeaconId::Mac),
            _ => None,
        }
    }
}

impl fmt::Display for BeaconId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BeaconId::IBeacon { uuid, major, minor } => {
                let h = hex::encode(uuid);
                write!(
                    f,
                    "ibeacon:{}-{}-{}-{}-{}/{major}/{minor}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            }
            BeaconId::Eddystone { namespace, instance } => {
                write!(f, "eddystone:{}/{}", hex::encode(namespace), hex::encode(instance))
            }
            BeaconId::Mac(mac) => write!(f, "mac:{mac}"),
        }
    }
}

/// What an advert says, for the beacon formats sitegate reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Frame {
    /// iBeacon: identity and the measured power (RSSI at 1 m, dBm).
    IBeacon { id: BeaconId, measured_power: i8 },
    /// Eddystone-UID: identity and the transmit power at 0 m (dBm; +41 gives 1 m roughly).
    EddystoneUid { id: BeaconId, tx_power_0m: i8 },
    /// Eddystone-TLM: battery in millivolts (None: the beacon does not say).
    EddystoneTlm { battery_mv: Option<u16> },
}

/// The beacon frames in an advert (usually one; none for a phone or an unknown beacon).
pub fn frames(advert: &Advert) -> impl Iterator<Item = Frame> + '_ {
    let ibeacons = advert.mfg.iter().filter_map(|(company, data)| ibeacon(*company, data));
    let eddystones = advert.svc.iter().filter_map(|(uuid, data)| eddystone(*uuid, data));
    ibeacons.chain(eddystones)
}

/// iBeacon: company 0x004C, bytes `02 15`, UUID (16), major (u16 BE), minor (u16 BE), measured
/// power (i8).
pub fn ibeacon(company: u16, data: &[u8]) -> Option<Frame> {
    if company != COMPANY_APPLE || data.len() < 23 || data[0] != 0x02 || data[1] != 0x15 {
        return None;
    }
    let uuid: [u8; 16] = data[2..18].try_into().ok()?;
    let major = u16::from_be_bytes([data[18], data[19]]);
    let minor = u16::from_be_bytes([data[20], data[21]]);
    Some(Frame::IBeacon { id: BeaconId::IBeacon { uuid, major, minor }, measured_power: data[22] as i8 })
}

/// Eddystone under service 0xFEAA: frame 0x00 UID (tx power, namespace 10, instance 6), frame
/// 0x20 TLM (version, battery mV u16 BE, ...).
pub fn eddystone(uuid: u16, data: &[u8]) -> Option<Frame> {
    if uuid != SERVICE_EDDYSTONE {
        return None;
    }
    match data.first()? {
        0x00 if data.len() >= 18 => {
            let namespace: [u8; 10] = data[2..12].try_into().ok()?;
            let instance: [u8; 6] = data[12..18].try_into().ok()?;
            Some(Frame::EddystoneUid { id: BeaconId::Eddystone { namespace, instance }, tx_power_0m: data[1] as i8 })
        }
        0x20 if data.len() >= 4 => {
            let mv = u16::from_be_bytes([data[2], data[3]]);
            Some(Frame::EddystoneTlm { battery_mv: (mv != 0).then_some(mv) })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(mfg: Vec<(u16, Vec<u8>)>, svc: Vec<(u16, Vec<u8>)>) -> Advert {
        Advert { t_ms: 0, receiver: "hci0".into(), mac: Mac([1, 2, 3, 4, 5, 6]), rssi: -60, mfg, svc }
    }

    #[test]
    fn ibeacon_frames() {
        let data = hex::decode("0215f7826da64fa24e988024bc5b71e0893e00050016c5").unwrap();
        let f: Vec<_> = frames(&advert(vec![(0x004c, data.clone())], vec![])).collect();
        let id = BeaconId::parse("ibeacon:f7826da6-4fa2-4e98-8024-bc5b71e0893e/5/22").unwrap();
        assert_eq!(f, [Frame::IBeacon { id, measured_power: -59 }]);
        assert_eq!(id.to_string(), "ibeacon:f7826da6-4fa2-4e98-8024-bc5b71e0893e/5/22");
        // Another company, a continuity frame, a short frame: none.
        assert!(ibeacon(0x0006, &data).is_none());
        assert!(ibeacon(0x004c, &hex::decode("1005031c0e3b51").unwrap()).is_none());
        assert!(ibeacon(0x004c, &data[..22]).is_none());
    }

    #[test]
    fn eddystone_frames() {
        let uid = hex::decode("00e7edd5f3b6f0e1a40c9b2a0001020304050000").unwrap();
        let Some(Frame::EddystoneUid { id, tx_power_0m }) = eddystone(0xfeaa, &uid) else { panic!() };
        assert_eq!(tx_power_0m, -25);
        assert_eq!(id.to_string(), "eddystone:edd5f3b6f0e1a40c9b2a/000102030405");
        assert_eq!(BeaconId::parse(&id.to_string()), Some(id));
        let tlm = hex::decode("20000bb8170000000a000000ff").unwrap();
        assert_eq!(eddystone(0xfeaa, &tlm), Some(Frame::EddystoneTlm { battery_mv: Some(3000) }));
        assert_eq!(
            eddystone(0xfeaa, &hex::decode("20000000").unwrap()),
            Some(Frame::EddystoneTlm { battery_mv: None })
        );
        assert!(eddystone(0xfeab, &uid).is_none());
        assert!(eddystone(0xfeaa, &uid[..10]).is_none());
        assert!(eddystone(0xfeaa, &[]).is_none());
    }

    #[test]
    fn identities_parse_and_print() {
        let mac = BeaconId::parse("mac:aa:bb:cc:dd:ee:01").unwrap();
        assert_eq!(mac.to_string(), "mac:AA:BB:CC:DD:EE:01");
        for bad in ["", "mac:aa:bb", "ibeacon:00/1/2", "ibeacon:f7826da64fa24e988024bc5b71e0893e/70000/1", "x:y"] {
            assert_eq!(BeaconId::parse(bad), None, "{bad}");
        }
        assert!(BeaconId::parse("IBEACON:F7826DA64FA24E988024BC5B71E0893E/1/2").is_some());
    }
}
