//! Remote BLE receivers over MQTT: other scanners in the building publish what they hear, and
//! it feeds the same engine as the local adapter.
//!
//! - `{org}/receivers/{receiverId}/adverts`: one advert per line in the trace format
//!   (`{"t_ms":...,"mac":"AA:..","rssi":-67,"mfg":{..},"svc":{..}}`, one line or several).
//!   The topic's receiverId wins over a `receiver` key; every advert is stamped with the
//!   gateway's arrival time, the sender's `t_ms` only orders the lines of one message.
//! - `espresense/devices/{id}/{room}`: what ESPresense nodes publish (`{"rssi":-70,
//!   "rssi@1m":-59,"mac":"..",..}`); `{room}` is the receiver id, `{id}` such as
//!   `iBeacon:UUID-MAJOR-MINOR` becomes that iBeacon's advert, a 12-hex-digit id a MAC.
//!
//! Only receiver credentials may publish there (see `acl`), and only for receivers of the
//! site map: anything else is counted and dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::limits;
use crate::location::beacon::{Advert, Mac};
use crate::location::trace::Line;

#[derive(Deserialize)]
struct EspresenseReport<'a> {
    rssi: f64,
    #[serde(rename = "rssi@1m", default)]
    rssi_1m: Option<f64>,
    #[serde(default, borrow)]
    mac: Option<&'a str>,
}

/// Why a message was not (fully) taken.
#[derive(Debug, PartialEq)]
pub enum IngestError {
    NotIngest,
    Malformed(String),
    TooManyLines,
}

/// The signal strengths a receiver can report.
const RSSI_MIN_DBM: i16 = -127;
const RSSI_MAX_DBM: i16 = 20;

/// The adverts of one `.../adverts` message, in the sender's order, stamped `now_ms`.
pub fn parse_adverts(receiver: &Arc<str>, payload: &[u8], now_ms: i64) -> Result<Vec<Advert>, IngestError> {
    let text = std::str::from_utf8(payload).map_err(|_| IngestError::Malformed("not UTF-8".into()))?;
    let mut out: Vec<(i64, Advert)> = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        if out.len() >= limits::MQTT_INGEST_ADVERTS_PER_MESSAGE_MAX {
            return Err(IngestError::TooManyLines);
        }
        let bad = |why: String| IngestError::Malformed(format!("line {}: {why}", n + 1));
        // The topic's receiver wins over a `receiver` key; the arrival time over `t_ms`.
        let l = Line::parse(line.trim()).map_err(bad)?;
        let advert = l.advert(now_ms, receiver.clone()).map_err(bad)?;
        // What a radio can report, as for ESPresense's reports.
        if !(RSSI_MIN_DBM..=RSSI_MAX_DBM).contains(&advert.rssi) {
            return Err(bad(format!("rssi {} out of range ({RSSI_MIN_DBM} to {RSSI_MAX_DBM} dBm)", advert.rssi)));
        }
        out.push((l.t_ms.unwrap_or(0), advert));
    }
    out.sort_by_key(|(t, _)| *t);
    Ok(out.into_iter().map(|(_, a)| a).collect())
}

/// An ESPresense report as an advert (`id` and `room` from the topic).
pub fn parse_espresense(id: &str, receiver: &Arc<str>, payload: &[u8], now_ms: i64) -> Result<Advert, IngestError> {
    let r: EspresenseReport<'_> = serde_json::from_slice(payload).map_err(|e| IngestError::Malformed(e.to_string()))?;
    if !(f64::from(RSSI_MIN_DBM)..=f64::from(RSSI_MAX_DBM)).contains(&r.rssi) {
        return Err(IngestError::Malformed(format!("rssi {} out of range", r.rssi)));
    }
    let rssi = r.rssi.round() as i16;
    let mac_of = |s: &str| -> Option<Mac> {
        let hex: String = s.chars().filter(|c| *c != ':').collect();
        let bytes = hex::decode(hex).ok()?;
        Some(Mac(bytes.try_into().ok()?))
    };
    let mac = r.mac.and_then(mac_of);
    let mut mfg = Vec::new();
    let lower = id.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("ibeacon:") {
        // UUID (with its hyphens) - major - minor
        let mut parts = rest.rsplitn(3, '-');
        let (minor, major, uuid) = (parts.next(), parts.next(), parts.next());
        let (Some(minor), Some(major), Some(uuid)) = (minor, major, uuid) else {
            return Err(IngestError::Malformed(format!("{id:?} is not iBeacon:UUID-MAJOR-MINOR")));
        };
        let uuid = hex::decode(uuid.replace('-', "")).ok().filter(|u| u.len() == 16);
        let (Some(uuid), Ok(major), Ok(minor)) = (uuid, major.parse::<u16>(), minor.parse::<u16>()) else {
            return Err(IngestError::Malformed(format!("{id:?} is not iBeacon:UUID-MAJOR-MINOR")));
        };
        let power = r.rssi_1m.map_or(-59, |p| p.round().clamp(-127.0, 20.0) as i8);
        let mut frame = vec![0x02, 0x15];
        frame.extend_from_slice(&uuid);
        frame.extend_from_slice(&major.to_be_bytes());
        frame.extend_from_slice(&minor.to_be_bytes());
        frame.push(power as u8);
        mfg.push((0x004c, frame));
        let mac = mac.unwrap_or(Mac([0; 6]));
        return Ok(Advert { t_ms: now_ms, receiver: receiver.clone(), mac, rssi, mfg, svc: Vec::new() });
    }
    let mac = mac_of(&lower).or(mac).ok_or_else(|| IngestError::Malformed(format!("{id:?}: no beacon identity")))?;
    Ok(Advert { t_ms: now_ms, receiver: receiver.clone(), mac, rssi, mfg, svc: Vec::new() })
}

/// The remote receivers' side of the location engine: where their adverts go and when each
/// was last heard (for /health).
pub struct Ingest {
    pub adverts: crate::location::queue::AdvertSender,
    /// Receiver ids of the site map (replaced on SIGHUP).
    pub known: Mutex<Vec<Arc<str>>>,
    pub last_heard_ms: Mutex<HashMap<Arc<str>, i64>>,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    /// Set when the service stops: receivers' adverts are refused from then on (their
    /// clients are disconnected, so a QoS 1 advert is sent again to the next start), since
    /// the engine would not take them.
    pub closed: std::sync::atomic::AtomicBool,
}

impl Ingest {
    pub fn new(adverts: crate::location::queue::AdvertSender, receivers: Vec<Arc<str>>) -> Ingest {
        Ingest {
            adverts,
            known: Mutex::new(receivers),
            last_heard_ms: Mutex::new(HashMap::new()),
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn receiver(&self, id: &str) -> Option<Arc<str>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().find(|r| r.as_ref() == id).cloned()
    }

    /// Takes one publish of a receiver client (org already checked by the ACL).
    pub fn publish(&self, org: &str, topic: &str, payload: &[u8], now_ms: i64) -> Result<usize, IngestError> {
        let levels: Vec<&str> = topic.split('/').collect();
        let adverts = match levels.as_slice() {
            [o, "receivers", rid, "adverts"] if *o == org => {
                let r =
                    self.receiver(rid).ok_or_else(|| IngestError::Malformed(format!("unknown receiver {rid:?}")))?;
                parse_adverts(&r, payload, now_ms)?
            }
            ["espresense", "devices", id, room] => {
                let r =
                    self.receiver(room).ok_or_else(|| IngestError::Malformed(format!("unknown receiver {room:?}")))?;
                vec![parse_espresense(id, &r, payload, now_ms)?]
            }
            _ => return Err(IngestError::NotIngest),
        };
        let n = adverts.len();
        if let Some(a) = adverts.first() {
            self.last_heard_ms
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(a.receiver.clone(), now_ms);
        }
        for a in adverts {
            if !self.adverts.send(a) {
                self.rejected.fetch_add(1, Ordering::Relaxed);
            } else {
                self.accepted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(n)
    }
}

/// Whether a receiver last heard at `last_ms` (or, never heard, since the service started) is
/// silent at `now_ms`: not heard for `silent_ms`. A time further ahead than that was taken
/// before the clock was set back: nothing says the receiver was heard since.
pub fn silent(now_ms: i64, last_ms: i64, silent_ms: i64) -> bool {
    now_ms.abs_diff(last_ms) > silent_ms.unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_heard_before_the_clock_was_set_back_is_silent_once_it_is_not_heard() {
        assert!(!silent(100_000, 95_000, 10_000));
        assert!(silent(100_000, 89_999, 10_000));
        // Heard "an hour from now": the clock went back an hour since.
        assert!(silent(100_000, 3_700_000, 10_000));
        assert!(!silent(100_000, 105_000, 10_000), "clocks differ by a little");
    }

    #[test]
    fn lines_are_ordered_by_the_sender_and_stamped_on_arrival() {
        let rx: Arc<str> = "lobby".into();
        let payload = br#"{"t_ms":20,"mac":"AA:BB:CC:DD:EE:02","rssi":-70,"receiver":"ignored"}

{"t_ms":10,"mac":"AA:BB:CC:DD:EE:01","rssi":-60,"mfg":{"004c":"0215"}}"#;
        let a = parse_adverts(&rx, payload, 5000).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(
            (a[0].mac, a[0].rssi, a[0].t_ms, a[0].receiver.as_ref()),
            (Mac([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 1]), -60, 5000, "lobby")
        );
        assert_eq!(a[0].mfg, vec![(0x004c, vec![0x02, 0x15])]);
        assert!(
            matches!(parse_adverts(&rx, b"{\"mac\":\"nope\",\"rssi\":1}", 0), Err(IngestError::Malformed(m)) if m.contains("line 1"))
        );
        assert!(
            matches!(parse_adverts(&rx, b"{\"mac\":\"AA:BB:CC:DD:EE:01\",\"rssi\":500}", 0), Err(IngestError::Malformed(m)) if m.contains("rssi 500 out of range"))
        );
        assert!(matches!(parse_adverts(&rx, b"\xff", 0), Err(IngestError::Malformed(_))));
        let many =
            "{\"mac\":\"AA:BB:CC:DD:EE:01\",\"rssi\":-1}\n".repeat(limits::MQTT_INGEST_ADVERTS_PER_MESSAGE_MAX + 1);
        assert_eq!(parse_adverts(&rx, many.as_bytes(), 0).err(), Some(IngestError::TooManyLines));
    }

    #[test]
    fn espresense_reports_become_adverts() {
        let rx: Arc<str> = "kitchen".into();
        let a = parse_espresense(
            "iBeacon:f7826da6-4fa2-4e98-8024-bc5b71e0893e-5-22",
            &rx,
            br#"{"id":"x","rssi@1m":-61,"rssi":-72.4,"raw":3.1,"distance":2.9,"mac":"c0:00:00:00:00:22"}"#,
            7,
        )
        .unwrap();
        assert_eq!((a.rssi, a.t_ms, a.mac), (-72, 7, Mac([0xc0, 0, 0, 0, 0, 0x22])));
        assert_eq!(hex::encode(&a.mfg[0].1), "0215f7826da64fa24e988024bc5b71e0893e00050016c3");
        let m = parse_espresense("c00000000023", &rx, br#"{"rssi":-80}"#, 0).unwrap();
        assert_eq!((m.mac, m.mfg.len()), (Mac([0xc0, 0, 0, 0, 0, 0x23]), 0));
        assert!(parse_espresense("iBeacon:nope", &rx, br#"{"rssi":-80}"#, 0).is_err());
        assert!(parse_espresense("c00000000023", &rx, br#"{"rssi":-900}"#, 0).is_err());
        assert!(parse_espresense("c00000000023", &rx, b"[]", 0).is_err());
    }
}
