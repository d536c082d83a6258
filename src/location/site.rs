//! The site map (areas, buildings, floors, zones, receivers, tag types) and the location
//! settings, as config.toml describes them.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::limits;

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLocation {
    pub scan: Option<String>,
    pub adapter: Option<String>,
    pub scan_watchdog_s: Option<u64>,
    pub window_ms: Option<u64>,
    pub smoothing_ms: Option<u64>,
    pub stale_ms: Option<u64>,
    pub hysteresis_db: Option<f64>,
    pub dwell_db_s: Option<f64>,
    pub away_timeout_ms: Option<u64>,
    pub update_interval_ms: Option<u64>,
    pub retention_days: Option<u64>,
    pub receiver_silent_s: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawArea {
    pub id: i64,
    pub name: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBuilding {
    pub id: i64,
    pub name: String,
    pub area: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawFloor {
    pub id: i64,
    pub label: String,
    pub level: i64,
    pub building: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawZone {
    pub id: i64,
    pub name: String,
    pub floor: i64,
    /// A corridor, hall or stairway: people pass through rather than stay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transit: bool,
    /// Zones a person can walk into straight from this one (through a door, an opening or
    /// stairs), by id; it is enough that one of the two zones lists the other.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adjacent: Vec<i64>,
    /// What the receivers hear of a tag in parts of this zone (calibrated dBm per receiver
    /// id), as `sitegate survey` measured it; receivers left out did not hear it there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprints: Vec<BTreeMap<String, f64>>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawReceiver {
    pub id: String,
    pub zone: i64,
    pub position: String,
    #[serde(default)]
    pub rssi_offset_db: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTagType {
    pub id: i64,
    pub title: String,
    /// `mfg:CCCC:BYTE:MASK` or `svc:UUUU:BYTE:MASK`: the tag's alarm (panic button) flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
}

/// Whether sitegate scans for adverts itself (BlueZ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// Scan when an adapter is there; keep looking for one when it is not.
    Auto,
    Off,
}

/// How the zone engine decides (see `engine.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSettings {
    /// Readings older than this no longer count towards a receiver's signal.
    pub window_ms: u64,
    /// Time constant of the age weighting of readings within the window.
    pub smoothing_ms: u64,
    /// A receiver whose newest reading is older than this cannot make its zone win.
    pub stale_ms: u64,
    /// A challenger zone must be this much stronger (dB) than the current one to gain ground.
    pub hysteresis_db: f64,
    /// Evidence (dB above the hysteresis, times seconds) a challenger needs to win.
    pub dwell_db_s: f64,
    /// No reading at all for this long: the device has left.
    pub away_timeout_ms: u64,
    /// A stored location update per device at most this often (and at every zone change).
    pub update_interval_ms: u64,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            window_ms: limits::LOCATION_WINDOW_MS_DEFAULT,
            smoothing_ms: limits::LOCATION_SMOOTHING_MS_DEFAULT,
            stale_ms: limits::LOCATION_STALE_MS_DEFAULT,
            hysteresis_db: limits::LOCATION_HYSTERESIS_DB_DEFAULT,
            dwell_db_s: limits::LOCATION_DWELL_DB_S_DEFAULT,
            away_timeout_ms: limits::LOCATION_AWAY_TIMEOUT_MS_DEFAULT,
            update_interval_ms: limits::LOCATION_UPDATE_INTERVAL_MS_DEFAULT,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LocationConfig {
    pub scan: Scan,
    /// The BlueZ adapter to scan with (`hci0`).
    pub adapter: String,
    /// Seconds without any advert after which the scan is restarted.
    pub scan_watchdog_s: u64,
    pub engine: EngineSettings,
    pub retention_days: u64,
    /// A remote receiver not heard for this long is reported in /health.
    pub receiver_silent_s: u64,
}

impl LocationConfig {
    pub fn to_raw(&self) -> RawLocation {
        let e = &self.engine;
        RawLocation {
            scan: Some(match self.scan {
                Scan::Auto => "auto".into(),
                Scan::Off => "off".into(),
            }),
            adapter: Some(self.adapter.clone()),
            scan_watchdog_s: Some(self.scan_watchdog_s),
            window_ms: Some(e.window_ms),
            smoothing_ms: Some(e.smoothing_ms),
            stale_ms: Some(e.stale_ms),
            hysteresis_db: Some(e.hysteresis_db),
            dwell_db_s: Some(e.dwell_db_s),
            away_timeout_ms: Some(e.away_timeout_ms),
            update_interval_ms: Some(e.update_interval_ms),
            retention_days: Some(self.retention_days),
            receiver_silent_s: Some(self.receiver_silent_s),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Area {
    pub id: i64,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Building {
    pub id: i64,
    pub name: String,
    pub area: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Floor {
    pub id: i64,
    pub label: String,
    pub level: i64,
    pub building: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Zone {
    pub id: i64,
    pub name: String,
    pub floor: usize,
    pub transit: bool,
    /// Indexes of the zones a person can walk into straight from this one (both ways).
    pub adjacent: Vec<usize>,
    /// Indexes of the receivers in this zone.
    pub receivers: Vec<usize>,
    /// The zone's survey fingerprints, each (receiver index, calibrated dBm) by receiver
    /// index; none when the site map has none.
    pub fingerprints: Vec<Vec<(usize, f64)>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Receiver {
    pub id: String,
    pub zone: usize,
    pub lat: f64,
    pub lon: f64,
    pub rssi_offset_db: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TagType {
    pub id: i64,
    pub title: String,
    pub alarm: Option<AlarmFlag>,
}

/// Where a tag type's advertisement carries its alarm flag: a byte of its manufacturer data
/// (after the company id) or service data (after the UUID), and the bits that mean "alarm".
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlarmFlag {
    pub service: bool,
    pub key: u16,
    pub byte: usize,
    pub mask: u8,
}

impl AlarmFlag {
    pub fn parse(s: &str) -> Option<AlarmFlag> {
        let mut parts = s.split(':');
        let service = match parts.next()? {
            "mfg" => false,
            "svc" => true,
            _ => return None,
        };
        let key = parts.next().filter(|k| k.len() == 4).and_then(|k| u16::from_str_radix(k, 16).ok())?;
        let byte = parts.next()?.parse::<usize>().ok().filter(|b| *b < 64)?;
        let mask =
            parts.next().filter(|m| m.len() == 2).and_then(|m| u8::from_str_radix(m, 16).ok()).filter(|m| *m != 0)?;
        parts.next().is_none().then_some(AlarmFlag { service, key, byte, mask })
    }

    /// Whether the advert says the flag is raised; `None` when it does not carry the flag's
    /// byte (a tag's other frames).
    pub fn raised(&self, a: &super::beacon::Advert) -> Option<bool> {
        let data = if self.service { &a.svc } else { &a.mfg };
        data.iter()
            .filter(|(k, _)| *k == self.key)
            .find_map(|(_, bytes)| bytes.get(self.byte))
            .map(|b| b & self.mask != 0)
    }

    pub fn to_text(self) -> String {
        format!("{}:{:04x}:{}:{:02x}", if self.service { "svc" } else { "mfg" }, self.key, self.byte, self.mask)
    }
}

/// The validated site map. Zones, floors and so on refer to each other by index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Site {
    pub areas: Vec<Area>,
    pub buildings: Vec<Building>,
    pub floors: Vec<Floor>,
    pub zones: Vec<Zone>,
    pub receivers: Vec<Receiver>,
    pub tag_types: Vec<TagType>,
    receiver_by_id: HashMap<String, usize>,
    zone_by_id: HashMap<i64, usize>,
}

impl Site {
    /// Whether zones are told apart by their survey fingerprints (every zone has one).
    pub fn fingerprinted(&self) -> bool {
        !self.zones.is_empty() && self.zones.iter().all(|z| !z.fingerprints.is_empty())
    }

    pub fn receiver(&self, id: &str) -> Option<usize> {
        self.receiver_by_id.get(id).copied()
    }

    pub fn zone(&self, id: i64) -> Option<usize> {
        self.zone_by_id.get(&id).copied()
    }

    pub fn tag_type(&self, id: i64) -> Option<&TagType> {
        self.tag_types.iter().find(|t| t.id == id)
    }
}

/// The raw site sections of config.toml.
pub struct RawSiteMap<'a> {
    pub areas: &'a [RawArea],
    pub buildings: &'a [RawBuilding],
    pub floors: &'a [RawFloor],
    pub zones: &'a [RawZone],
    pub receivers: &'a [RawReceiver],
    pub tag_types: &'a [RawTagType],
}

fn name_ok(s: &str) -> bool {
    !s.trim().is_empty() && s.len() <= limits::NAME_BYTES_MAX && !s.chars().any(char::is_control)
}

/// Checks the site map: unique positive ids, references that resolve, names, positions.
pub fn resolve_site(raw: RawSiteMap<'_>) -> Result<Site, ConfigError> {
    let err = |key: String, m: &str| ConfigError::new(key, m.to_string());
    let mut site = Site::default();
    for (i, a) in raw.areas.iter().enumerate() {
        check_id("areas", i, a.id, site.areas.iter().map(|x| x.id))?;
        if !name_ok(&a.name) {
            return Err(err(format!("areas[{i}].name"), "must be 1 to 255 bytes of text"));
        }
        site.areas.push(Area { id: a.id, name: a.name.clone() });
    }
    for (i, b) in raw.buildings.iter().enumerate() {
        check_id("buildings", i, b.id, site.buildings.iter().map(|x| x.id))?;
        if !name_ok(&b.name) {
            return Err(err(format!("buildings[{i}].name"), "must be 1 to 255 bytes of text"));
        }
        let area = site
            .areas
            .iter()
            .position(|a| a.id == b.area)
            .ok_or_else(|| err(format!("buildings[{i}].area"), "is not the id of an [[areas]] entry"))?;
        site.buildings.push(Building { id: b.id, name: b.name.clone(), area });
    }
    for (i, f) in raw.floors.iter().enumerate() {
        check_id("floors", i, f.id, site.floors.iter().map(|x| x.id))?;
        if !name_ok(&f.label) {
            return Err(err(format!("floors[{i}].label"), "must be 1 to 255 bytes of text"));
        }
        let building = site
            .buildings
            .iter()
            .position(|b| b.id == f.building)
            .ok_or_else(|| err(format!("floors[{i}].building"), "is not the id of a [[buildings]] entry"))?;
        site.floors.push(Floor { id: f.id, label: f.label.clone(), level: f.level, building });
    }
    if raw.zones.len() > limits::LOCATION_ZONES_MAX {
        return Err(err("zones".into(), &format!("at most {} zones", limits::LOCATION_ZONES_MAX)));
    }
    for (i, z) in raw.zones.iter().enumerate() {
        check_id("zones", i, z.id, site.zones.iter().map(|x| x.id))?;
        if !name_ok(&z.name) {
            return Err(err(format!("zones[{i}].name"), "must be 1 to 255 bytes of text"));
        }
        let floor = site
            .floors
            .iter()
            .position(|f| f.id == z.floor)
            .ok_or_else(|| err(format!("zones[{i}].floor"), "is not the id of a [[floors]] entry"))?;
        site.zone_by_id.insert(z.id, site.zones.len());
        site.zones.push(Zone {
            id: z.id,
            name: z.name.clone(),
            floor,
            transit: z.transit,
            adjacent: Vec::new(),
            receivers: Vec::new(),
            fingerprints: Vec::new(),
        });
    }
    if raw.receivers.len() > limits::LOCATION_RECEIVERS_MAX {
        return Err(err("receivers".into(), &format!("at most {} receivers", limits::LOCATION_RECEIVERS_MAX)));
    }
    for (i, r) in raw.receivers.iter().enumerate() {
        let key = |k: &str| format!("receivers[{i}].{k}");
        if r.id.is_empty()
            || r.id.len() > 64
            || !r.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(err(key("id"), "must be 1 to 64 letters, digits, '-', '_' or '.'"));
        }
        if site.receiver_by_id.contains_key(&r.id) {
            return Err(err(key("id"), "appears twice"));
        }
        let zone = site.zone(r.zone).ok_or_else(|| err(key("zone"), "is not the id of a [[zones]] entry"))?;
        let (lat, lon) = parse_position(&r.position)
            .ok_or_else(|| err(key("position"), "must be \"latitude,longitude\" in degrees"))?;
        if !r.rssi_offset_db.is_finite() || r.rssi_offset_db.abs() > 40.0 {
            return Err(err(key("rssi_offset_db"), "must be from -40 to 40"));
        }
        let index = site.receivers.len();
        site.receiver_by_id.insert(r.id.clone(), index);
        site.zones[zone].receivers.push(index);
        site.receivers.push(Receiver { id: r.id.clone(), zone, lat, lon, rssi_offset_db: r.rssi_offset_db });
    }
    resolve_adjacency(raw.zones, &mut site)?;
    resolve_fingerprints(raw.zones, &mut site)?;
    for (i, t) in raw.tag_types.iter().enumerate() {
        check_id("tag_types", i, t.id, site.tag_types.iter().map(|x| x.id))?;
        if !name_ok(&t.title) {
            return Err(err(format!("tag_types[{i}].title"), "must be 1 to 255 bytes of text"));
        }
        let alarm = match &t.alarm {
            None => None,
            Some(text) => Some(AlarmFlag::parse(text).ok_or_else(|| {
                err(
                    format!("tag_types[{i}].alarm"),
                    "must be mfg:CCCC:BYTE:MASK or svc:UUUU:BYTE:MASK (hex, byte < 64)",
                )
            })?),
        };
        site.tag_types.push(TagType { id: t.id, title: t.title.clone(), alarm });
    }
    Ok(site)
}

/// The walking graph: each `adjacent` entry links two zones both ways.
fn resolve_adjacency(raw: &[RawZone], site: &mut Site) -> Result<(), ConfigError> {
    for (i, z) in raw.iter().enumerate() {
        if z.adjacent.len() > limits::LOCATION_ADJACENT_ZONES_MAX {
            return Err(ConfigError::new(
                format!("zones[{i}].adjacent"),
                format!("at most {}", limits::LOCATION_ADJACENT_ZONES_MAX),
            ));
        }
        for (j, id) in z.adjacent.iter().enumerate() {
            let key = format!("zones[{i}].adjacent[{j}]");
            let other =
                site.zone(*id).ok_or_else(|| ConfigError::new(key.clone(), "is not the id of a [[zones]] entry"))?;
            if other == i {
                return Err(ConfigError::new(key, "is the zone itself"));
            }
            for (a, b) in [(i, other), (other, i)] {
                if !site.zones[a].adjacent.contains(&b) {
                    site.zones[a].adjacent.push(b);
                }
            }
        }
    }
    Ok(())
}

/// Zone fingerprints: receivers of the site map, plausible signals, and every zone or none
/// (the engine compares zones by one measure or the other, not both).
fn resolve_fingerprints(raw: &[RawZone], site: &mut Site) -> Result<(), ConfigError> {
    let with = raw.iter().filter(|z| !z.fingerprints.is_empty()).count();
    if with == 0 {
        return Ok(());
    }
    for (i, z) in raw.iter().enumerate() {
        let key = format!("zones[{i}].fingerprints");
        if z.fingerprints.is_empty() {
            return Err(ConfigError::new(
                key,
                format!("are missing: {with} other zones have them, and then every zone needs them (sitegate survey)"),
            ));
        }
        if z.fingerprints.len() > limits::LOCATION_FINGERPRINTS_PER_ZONE_MAX {
            return Err(ConfigError::new(key, format!("at most {}", limits::LOCATION_FINGERPRINTS_PER_ZONE_MAX)));
        }
        let mut fingerprints = Vec::with_capacity(z.fingerprints.len());
        for (j, raw_fingerprint) in z.fingerprints.iter().enumerate() {
            let key = format!("{key}[{j}]");
            if raw_fingerprint.is_empty() {
                return Err(ConfigError::new(key, "is empty: give at least one receiver's signal".to_string()));
            }
            let mut fingerprint = Vec::with_capacity(raw_fingerprint.len());
            for (id, &dbm) in raw_fingerprint {
                let receiver = site.receiver(id).ok_or_else(|| {
                    ConfigError::new(key.clone(), format!("{id:?} is not the id of a [[receivers]] entry"))
                })?;
                if !dbm.is_finite() || !(FINGERPRINT_DBM_MIN..=0.0).contains(&dbm) {
                    return Err(ConfigError::new(
                        key,
                        format!("{id:?}: {dbm} is not a signal from {FINGERPRINT_DBM_MIN} to 0 dBm"),
                    ));
                }
                fingerprint.push((receiver, dbm));
            }
            fingerprint.sort_by_key(|(r, _)| *r);
            fingerprints.push(fingerprint);
        }
        site.zones[i].fingerprints = fingerprints;
    }
    Ok(())
}

/// The weakest signal a fingerprint may hold (dBm).
pub const FINGERPRINT_DBM_MIN: f64 = -130.0;

fn check_id(section: &str, i: usize, id: i64, seen: impl Iterator<Item = i64>) -> Result<(), ConfigError> {
    let key = format!("{section}[{i}].id");
    if !(1..=limits::LOCATION_ID_MAX).contains(&id) {
        return Err(ConfigError::new(key, format!("must be from 1 to {}", limits::LOCATION_ID_MAX)));
    }
    let mut seen = seen;
    if seen.any(|s| s == id) {
        return Err(ConfigError::new(key, format!("{id} appears twice")));
    }
    Ok(())
}

/// `"42.50042,-90.733624"`: latitude and longitude in degrees.
pub fn parse_position(s: &str) -> Option<(f64, f64)> {
    let (lat, lon) = s.split_once(',')?;
    let lat: f64 = lat.trim().parse().ok()?;
    let lon: f64 = lon.trim().parse().ok()?;
    ((-90.0..=90.0).contains(&lat) && (-180.0..=180.0).contains(&lon)).then_some((lat, lon))
}

/// Checks `[location]`.
pub fn resolve_location(raw: &RawLocation) -> Result<LocationConfig, ConfigError> {
    use crate::config::bounded;
    let scan = match raw.scan.as_deref().unwrap_or("auto") {
        "auto" => Scan::Auto,
        "off" => Scan::Off,
        _ => return Err(ConfigError::new("location.scan", "must be auto or off")),
    };
    let adapter = raw.adapter.clone().unwrap_or_else(|| "hci0".into());
    if adapter.is_empty() || adapter.len() > 32 || !adapter.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(ConfigError::new("location.adapter", "must be an adapter name such as hci0"));
    }
    let float = |key: &str, v: Option<f64>, default: f64, min: f64, max: f64| -> Result<f64, ConfigError> {
        let v = v.unwrap_or(default);
        if v.is_finite() && (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(ConfigError::new(key, format!("must be from {min} to {max}")))
        }
    };
    let engine = EngineSettings {
        window_ms: bounded("location.window_ms", raw.window_ms, limits::LOCATION_WINDOW_MS_DEFAULT, 500, 120_000)?,
        smoothing_ms: bounded(
            "location.smoothing_ms",
            raw.smoothing_ms,
            limits::LOCATION_SMOOTHING_MS_DEFAULT,
            100,
            60_000,
        )?,
        stale_ms: bounded("location.stale_ms", raw.stale_ms, limits::LOCATION_STALE_MS_DEFAULT, 500, 600_000)?,
        hysteresis_db: float(
            "location.hysteresis_db",
            raw.hysteresis_db,
            limits::LOCATION_HYSTERESIS_DB_DEFAULT,
            0.0,
            30.0,
        )?,
        dwell_db_s: float("location.dwell_db_s", raw.dwell_db_s, limits::LOCATION_DWELL_DB_S_DEFAULT, 0.0, 1000.0)?,
        away_timeout_ms: bounded(
            "location.away_timeout_ms",
            raw.away_timeout_ms,
            limits::LOCATION_AWAY_TIMEOUT_MS_DEFAULT,
            1_000,
            3_600_000,
        )?,
        update_interval_ms: bounded(
            "location.update_interval_ms",
            raw.update_interval_ms,
            limits::LOCATION_UPDATE_INTERVAL_MS_DEFAULT,
            1_000,
            3_600_000,
        )?,
    };
    Ok(LocationConfig {
        scan,
        adapter,
        scan_watchdog_s: bounded("location.scan_watchdog_s", raw.scan_watchdog_s, 30, 5, 3600)?,
        engine,
        retention_days: bounded(
            "location.retention_days",
            raw.retention_days,
            limits::LOCATION_RETENTION_DAYS_DEFAULT,
            1,
            3650,
        )?,
        receiver_silent_s: bounded(
            "location.receiver_silent_s",
            raw.receiver_silent_s,
            limits::LOCATION_RECEIVER_SILENT_S_DEFAULT,
            10,
            86_400,
        )?,
    })
}
