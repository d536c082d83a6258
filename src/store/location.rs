//! Devices (tags), their status, location history and zone visits.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Row};

use super::{ExecCached, Result, Store, StoreError};
use crate::location::beacon::BeaconId;
use crate::location::devices::Device;
use crate::timefmt::now_secs;

/// A device as stored, with its status.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredDevice {
    pub id: i64,
    pub org: String,
    pub device: Device,
    /// The contact's name, when a contact is assigned.
    pub contact_name: Option<String>,
    pub created: i64,
    pub updated: i64,
    pub status: DeviceStatus,
}

/// What the engine last said about a device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceStatus {
    pub last_seen_ms: Option<i64>,
    pub battery_mv: Option<i64>,
    pub battery_ms: Option<i64>,
    /// The zone id (of the site map) it is in now.
    pub zone_id: Option<i64>,
    pub zone_since_ms: Option<i64>,
    /// The zone of the last location update (kept after the device left).
    pub position_zone_id: Option<i64>,
    pub lat: Option<f64>,
    pub lon: Option<f64>,
    pub receiver: Option<String>,
    pub rssi: Option<f64>,
    pub position_ms: Option<i64>,
}

/// What the engine wrote since the last batch, in time order per device.
#[derive(Debug, Default)]
pub struct LocationBatch {
    pub events: Vec<LocationEvent>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LocationEvent {
    Seen { device_id: i64, t_ms: i64 },
    Battery { device_id: i64, t_ms: i64, mv: Option<u16> },
    Enter { device_id: i64, t_ms: i64, zone_id: i64 },
    Exit { device_id: i64, t_ms: i64, zone_id: i64 },
    Update { device_id: i64, t_ms: i64, zone_id: i64, lat: f64, lon: f64, receiver: String, rssi: f64 },
}

impl LocationBatch {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// Where the last run had a device ([`Store::placements_to_resume`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub device_id: i64,
    pub zone_id: i64,
    /// When it entered the zone.
    pub since_ms: i64,
    pub visit_id: i64,
}

/// Which visits a report reads (each None: all).
#[derive(Clone, Debug, Default)]
pub struct VisitFilter {
    pub device_id: Option<i64>,
    pub tagtype: Option<i64>,
    pub zones: Option<Vec<i64>>,
}

/// A stored location update.
#[derive(Clone, Debug, PartialEq)]
pub struct LocationRow {
    pub t_ms: i64,
    pub zone_id: i64,
    pub lat: f64,
    pub lon: f64,
    pub receiver: String,
    pub rssi: f64,
}

/// A contact's devices, each with its history and visits.
pub type ContactLocations = Vec<(StoredDevice, Vec<LocationRow>, Vec<Visit>)>;

/// A visit of a device to a zone.
#[derive(Clone, Debug, PartialEq)]
pub struct Visit {
    pub device_id: i64,
    pub zone_id: i64,
    pub enter_ms: i64,
    /// None: still there.
    pub exit_ms: Option<i64>,
    /// Whose it is: the device's contact when it was written.
    pub contact_id: Option<i64>,
}

const DEVICE_COLUMNS: &str = "d.id, d.org, d.deviceaddress, d.deviceid, d.label, d.tagtype, d.beacon, d.contact_id, \
     d.created, d.updated, d.last_seen_ms, d.battery_mv, d.battery_ms, d.zone_id, d.zone_since_ms, d.lat, d.lon, \
     d.receiver, d.rssi, d.position_ms, c.name, d.position_zone_id";

fn device_from_row(r: &Row<'_>) -> rusqlite::Result<StoredDevice> {
    let beacon: String = r.get(6)?;
    Ok(StoredDevice {
        id: r.get(0)?,
        org: r.get(1)?,
        device: Device {
            deviceaddress: r.get(2)?,
            deviceid: r.get(3)?,
            label: r.get(4)?,
            tagtype: r.get(5)?,
            beacon: BeaconId::parse(&beacon).unwrap_or(BeaconId::Mac(crate::location::beacon::Mac([0; 6]))),
            contactid: r.get(7)?,
        },
        created: r.get(8)?,
        updated: r.get(9)?,
        status: DeviceStatus {
            last_seen_ms: r.get(10)?,
            battery_mv: r.get(11)?,
            battery_ms: r.get(12)?,
            zone_id: r.get(13)?,
            zone_since_ms: r.get(14)?,
            lat: r.get(15)?,
            lon: r.get(16)?,
            receiver: r.get(17)?,
            rssi: r.get(18)?,
            position_ms: r.get(19)?,
            position_zone_id: r.get(21)?,
        },
        contact_name: r.get(20)?,
    })
}

fn visit_from_row(r: &Row<'_>) -> rusqlite::Result<Visit> {
    Ok(Visit {
        device_id: r.get(0)?,
        zone_id: r.get(1)?,
        enter_ms: r.get(2)?,
        exit_ms: r.get(3)?,
        contact_id: r.get(4)?,
    })
}

/// Registers one device, after checking it (unique identities, a real contact, the bound).
fn insert_device(tx: &Connection, org: &str, d: &Device, now: i64) -> Result<i64> {
    check_unique(tx, d, 0)?;
    check_contact(tx, org, d.contactid)?;
    let count: i64 = tx.query_row("SELECT count(*) FROM devices", [], |r| r.get(0))?;
    if count >= crate::limits::LOCATION_DEVICES_MAX as i64 {
        return Err(StoreError::LimitReached(format!(
            "at most {} devices can be registered",
            crate::limits::LOCATION_DEVICES_MAX
        )));
    }
    tx.exec(
        "INSERT INTO devices (org, deviceaddress, deviceid, label, tagtype, beacon, contact_id, created, updated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
        (org, &d.deviceaddress, &d.deviceid, &d.label, d.tagtype, d.beacon.to_string(), d.contactid, now),
    )?;
    Ok(tx.last_insert_rowid())
}

/// The contact must be a live contact record of the organisation.
fn check_contact(tx: &Connection, org: &str, contact: Option<i64>) -> Result<()> {
    let Some(id) = contact else { return Ok(()) };
    let found: Option<i64> = tx
        .query_row(
            "SELECT id FROM items WHERE id = ?1 AND org = ?2 AND typeid = 1 AND parent IS NULL AND archived IS NULL",
            (id, org),
            |r| r.get(0),
        )
        .optional()?;
    found.map(|_| ()).ok_or_else(|| StoreError::BadReference(format!("contactid {id} is not a contact")))
}

/// Which unique column a new or changed device collides with, if any.
fn check_unique(tx: &Connection, d: &Device, except: i64) -> Result<()> {
    for (column, value, what) in [
        ("deviceaddress", d.deviceaddress.clone(), "deviceaddress"),
        ("deviceid", d.deviceid.clone(), "deviceid"),
        ("beacon", d.beacon.to_string(), "beacon"),
    ] {
        let sql = format!("SELECT id FROM devices WHERE {column} = ?1 AND id <> ?2");
        let other: Option<i64> = tx.query_row(&sql, (&value, except), |r| r.get(0)).optional()?;
        if other.is_some() {
            return Err(StoreError::Duplicate(format!("a device with {what} {value} already exists")));
        }
    }
    Ok(())
}

impl Store {
    pub fn create_device(&self, org: &str, d: &Device) -> Result<StoredDevice> {
        let id = self.write(|tx| insert_device(tx, org, d, now_secs()))?;
        self.device(Some(org), id)
    }

    /// Devices of a file, each with its line there, all or none: a refusal names the lines.
    /// `check` says what is wrong with one besides what the store checks (a tag type the site
    /// map lacks).
    pub fn import_devices(
        &self,
        org: &str,
        devices: &[(u64, Device)],
        check: impl Fn(&Device) -> std::result::Result<(), String>,
    ) -> Result<usize> {
        self.write(|tx| {
            let now = now_secs();
            // Every line that cannot go in is named; then none goes in.
            let mut refused = Vec::new();
            for (line, d) in devices {
                if let Err(m) = check(d) {
                    refused.push(format!("line {line}: {m}"));
                    continue;
                }
                match insert_device(tx, org, d, now) {
                    Ok(_) => {}
                    Err(StoreError::Duplicate(m) | StoreError::BadReference(m)) => {
                        refused.push(format!("line {line}: {m}"))
                    }
                    Err(other) => return Err(other),
                }
            }
            if !refused.is_empty() {
                return Err(StoreError::BadReference(crate::location::devices::line_errors(&refused)));
            }
            Ok(devices.len())
        })
    }

    /// Replaces a device with what `make` makes of it as it is, read in the same write (as
    /// [`Store::update_hook`]: the keys a request leaves out keep their values).
    pub fn update_device<E>(
        &self,
        org: &str,
        id: i64,
        make: impl FnOnce(&Device) -> Result<Device, E>,
    ) -> Result<Result<(), E>> {
        self.write(|tx| {
            let sql = format!(
                "SELECT {DEVICE_COLUMNS} FROM devices d LEFT JOIN items c ON c.id = d.contact_id AND c.archived IS NULL
                 WHERE d.id = ?1 AND d.org = ?2"
            );
            let current = tx.query_row(&sql, (id, org), device_from_row).optional()?.ok_or(StoreError::NotFound)?;
            let d = &match make(&current.device) {
                Ok(d) => d,
                Err(refused) => return Ok(Err(refused)),
            };
            check_unique(tx, d, id)?;
            // Only a new contact is checked: one deleted since it was assigned does not keep
            // the device from being changed otherwise.
            if d.contactid != current.device.contactid {
                check_contact(tx, org, d.contactid)?;
            }
            tx.exec(
                "UPDATE devices SET deviceaddress = ?2, deviceid = ?3, label = ?4, tagtype = ?5, beacon = ?6,
                                    contact_id = ?7, updated = ?8 WHERE id = ?1",
                (id, &d.deviceaddress, &d.deviceid, &d.label, d.tagtype, d.beacon.to_string(), d.contactid, now_secs()),
            )?;
            Ok(Ok(()))
        })
    }

    /// Deletes a device with its location history and visits.
    pub fn delete_device(&self, org: &str, id: i64) -> Result<()> {
        self.write(|tx| {
            let found = tx
                .prepare_cached("SELECT 1 FROM devices WHERE id = ?1 AND org = ?2")?
                .query_row((id, org), |_| Ok(()))
                .optional()?;
            if found.is_none() {
                return Err(StoreError::NotFound);
            }
            // What refers to the device goes first (device_states references devices).
            tx.exec("DELETE FROM locations WHERE device_id = ?1", [id])?;
            tx.exec("DELETE FROM visits WHERE device_id = ?1", [id])?;
            tx.exec("DELETE FROM device_states WHERE device_id = ?1", [id])?;
            tx.exec("DELETE FROM devices WHERE id = ?1 AND org = ?2", (id, org))?;
            Ok(())
        })
    }

    /// Devices of an organisation (all organisations: `None`), by id.
    pub fn devices(&self, org: Option<&str>) -> Result<Vec<StoredDevice>> {
        self.read(|tx| {
            let sql = format!(
                "SELECT {DEVICE_COLUMNS} FROM devices d LEFT JOIN items c ON c.id = d.contact_id AND c.archived IS NULL
                 WHERE ?1 IS NULL OR d.org = ?1 ORDER BY d.id"
            );
            let mut stmt = tx.prepare_cached(&sql)?;
            let rows = stmt.query_map([org], device_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    pub fn device(&self, org: Option<&str>, id: i64) -> Result<StoredDevice> {
        self.read(|tx| {
            let sql = format!(
                "SELECT {DEVICE_COLUMNS} FROM devices d LEFT JOIN items c ON c.id = d.contact_id AND c.archived IS NULL
                 WHERE d.id = ?2 AND (?1 IS NULL OR d.org = ?1)"
            );
            tx.query_row(&sql, (org, id), device_from_row).optional()?.ok_or(StoreError::NotFound)
        })
    }

    /// Changes whenever a device is added, changed or removed (by any process). One row read
    /// outside a transaction, like [`Store::credentials_version`].
    pub fn devices_version(&self) -> Result<i64> {
        self.watch("SELECT version FROM devices_version WHERE id = 1")
    }

    /// Writes what the engine decided, in one transaction: history rows, visits, status.
    /// What it decided before a device's data was forgotten (a purge while the batch waited)
    /// is not written as of then: no history row, and a visit from the purge on (a purge
    /// time ahead of now is not heeded: the clock was set back since).
    pub fn write_location_batch(&self, batch: &LocationBatch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let now = crate::timefmt::now_ms();
        self.write(|tx| {
            for e in &batch.events {
                match e {
                    // Never back to an older time (a batch written late), unless the stored
                    // one lies ahead of now: the clock was set back since.
                    LocationEvent::Seen { device_id, t_ms } => {
                        tx.exec(
                            "UPDATE devices SET last_seen_ms = CASE WHEN last_seen_ms > ?3 THEN ?2
                             ELSE max(coalesce(last_seen_ms, 0), ?2) END WHERE id = ?1",
                            (device_id, t_ms, now),
                        )?;
                    }
                    LocationEvent::Battery { device_id, t_ms, mv } => {
                        tx.exec(
                            "UPDATE devices SET battery_mv = ?2, battery_ms = ?3 WHERE id = ?1",
                            (device_id, mv.map(i64::from), t_ms),
                        )?;
                    }
                    LocationEvent::Enter { device_id, t_ms, zone_id } => {
                        // A device deleted since the engine decided has nothing written; one
                        // whose data was forgotten since entered at that moment.
                        tx.exec(
                            "INSERT INTO visits (device_id, zone_id, enter_ms, contact_id)
                             SELECT id, ?2, CASE WHEN purged_ms > ?3 AND purged_ms <= ?4 THEN purged_ms ELSE ?3 END,
                                    contact_id
                             FROM devices WHERE id = ?1",
                            (device_id, zone_id, t_ms, now),
                        )?;
                        tx.exec(
                            "UPDATE devices SET zone_id = ?2,
                                 zone_since_ms = CASE WHEN purged_ms > ?3 AND purged_ms <= ?4 THEN purged_ms ELSE ?3 END
                             WHERE id = ?1",
                            (device_id, zone_id, t_ms, now),
                        )?;
                    }
                    LocationEvent::Exit { device_id, t_ms, zone_id } => {
                        // Left before its data was forgotten: the visit the purge moved to its
                        // time goes, rather than stay as a visit of no length at the purge.
                        tx.exec(
                            "DELETE FROM visits WHERE id = (SELECT id FROM visits WHERE device_id = ?1 AND zone_id = ?2
                                                            AND exit_ms IS NULL ORDER BY enter_ms DESC LIMIT 1)
                             AND enter_ms = (SELECT purged_ms FROM devices WHERE id = ?1) AND ?3 < enter_ms
                             AND enter_ms <= ?4",
                            (device_id, zone_id, t_ms, now),
                        )?;
                        tx.exec(
                            // Never before its entry (one dated before the clock was set back).
                            "UPDATE visits SET exit_ms = max(?3, enter_ms)
                             WHERE id = (SELECT id FROM visits WHERE device_id = ?1 AND zone_id = ?2 AND exit_ms IS NULL
                                         ORDER BY enter_ms DESC LIMIT 1)",
                            (device_id, zone_id, t_ms),
                        )?;
                        tx.exec(
                            "UPDATE devices SET zone_id = NULL, zone_since_ms = ?3 WHERE id = ?1 AND zone_id = ?2",
                            (device_id, zone_id, t_ms),
                        )?;
                    }
                    LocationEvent::Update { device_id, t_ms, zone_id, lat, lon, receiver, rssi } => {
                        // Not of a device deleted since, nor from before its data was forgotten.
                        tx.exec(
                            "INSERT OR REPLACE INTO locations (device_id, t_ms, zone_id, lat, lon, receiver, rssi,
                                                               contact_id)
                             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, contact_id FROM devices
                             WHERE id = ?1 AND NOT (coalesce(purged_ms, 0) > ?2 AND purged_ms <= ?8)",
                            (device_id, t_ms, zone_id, lat, lon, receiver, rssi, now),
                        )?;
                        tx.exec(
                            "UPDATE devices SET lat = ?2, lon = ?3, receiver = ?4, rssi = ?5, position_ms = ?6,
                                                position_zone_id = ?7
                             WHERE id = ?1 AND NOT (coalesce(purged_ms, 0) > ?6 AND purged_ms <= ?8)",
                            (device_id, lat, lon, receiver, rssi, t_ms, zone_id, now),
                        )?;
                    }
                }
            }
            Ok(())
        })
    }

    /// The wall clock was stepped by `by_ms`: the visits in progress and the times devices
    /// came into their zones move with it, as the engine's times do.
    pub fn shift_stays_in_progress(&self, by_ms: i64) -> Result<()> {
        self.write(|tx| {
            tx.exec("UPDATE visits SET enter_ms = enter_ms + ?1 WHERE exit_ms IS NULL", [by_ms])?;
            tx.exec("UPDATE devices SET zone_since_ms = zone_since_ms + ?1 WHERE zone_id IS NOT NULL", [by_ms])?;
            Ok(())
        })
    }

    /// Ends the visits still open at each device's last sighting (at start: the service
    /// stopped or crashed while devices were in zones; at shutdown).
    pub fn close_open_visits(&self) -> Result<usize> {
        self.close_open_visits_except(&[])
    }

    /// As [`Store::close_open_visits`], but for the devices `kept` in their zones (device id,
    /// zone id): placed again in the same zone across a site reload, their visits go on.
    pub fn close_open_visits_except(&self, kept: &[(i64, i64)]) -> Result<usize> {
        self.write(|tx| close_open_visits_in(tx, kept))
    }

    /// At start: the devices heard since `since_ms` (within the away timeout) and not after
    /// `now_ms` whose newest visit was going on when they were last heard (open, or closed by
    /// the stop at that time): where the last run had them. One heard after now (the clock is
    /// behind the last run's: a gateway without a real-time clock before NTP sets it) may have
    /// been gone for any time, and is placed anew when heard.
    pub fn placements_to_resume(&self, since_ms: i64, now_ms: i64) -> Result<Vec<Placement>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT d.id, v.zone_id, v.enter_ms, v.id FROM devices d
                 JOIN visits v ON v.id = (SELECT id FROM visits WHERE device_id = d.id ORDER BY enter_ms DESC, id DESC LIMIT 1)
                 WHERE d.last_seen_ms >= ?1 AND d.last_seen_ms <= ?2
                   AND (v.exit_ms IS NULL OR v.exit_ms >= d.last_seen_ms)",
            )?;
            let rows = stmt.query_map([since_ms, now_ms], |r| {
                Ok(Placement {
                    device_id: r.get(0)?,
                    zone_id: r.get(1)?,
                    since_ms: r.get(2)?,
                    visit_id: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// At start: the devices placed again where the last run had them ([`Store::placements_to_resume`])
    /// go on with their visits (one the stop closed is open again: they never left), and
    /// every other open visit is closed, as [`Store::close_open_visits_except`] does.
    pub fn resume_visits(&self, placements: &[Placement], kept: &[(i64, i64)]) -> Result<usize> {
        self.write(|tx| {
            for p in placements.iter().filter(|p| kept.contains(&(p.device_id, p.zone_id))) {
                tx.exec("UPDATE visits SET exit_ms = NULL WHERE id = ?1", [p.visit_id])?;
                tx.exec(
                    "UPDATE devices SET zone_id = ?2, zone_since_ms = ?3 WHERE id = ?1",
                    (p.device_id, p.zone_id, p.since_ms),
                )?;
            }
            close_open_visits_in(tx, kept)
        })
    }

    /// A device's location updates from `since_ms` to `until_ms` while its contact now held it
    /// (not those of someone it was assigned to before), oldest first: the newest `limit` of
    /// them. (Rows after now, written while the clock was ahead, are not the past minutes.)
    pub fn location_history(
        &self,
        device_id: i64,
        (since_ms, until_ms): (i64, i64),
        limit: u32,
    ) -> Result<Vec<LocationRow>> {
        self.read(|tx| {
            let holder: Option<i64> = tx
                .prepare_cached("SELECT contact_id FROM devices WHERE id = ?1")?
                .query_row([device_id], |r| r.get(0))
                .optional()?
                .flatten();
            location_history_in(tx, device_id, holder, (since_ms, until_ms), limit)
        })
    }

    /// Visits of an organisation's devices overlapping [from_ms, to_ms) that pass `only`,
    /// oldest first, at most `limit`.
    pub fn visits(&self, org: &str, from_ms: i64, to_ms: i64, only: &VisitFilter, limit: u32) -> Result<Vec<Visit>> {
        let zones = only.zones.as_ref().map(|z| serde_json::to_string(z).unwrap_or_else(|_| "[]".into()));
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT v.device_id, v.zone_id, v.enter_ms, v.exit_ms, v.contact_id FROM visits v
                 JOIN devices d ON d.id = v.device_id
                 WHERE d.org = ?1 AND v.enter_ms < ?3 AND coalesce(v.exit_ms, ?3) > ?2
                   AND (?5 IS NULL OR v.device_id = ?5) AND (?6 IS NULL OR d.tagtype = ?6)
                   AND (?7 IS NULL OR v.zone_id IN (SELECT value FROM json_each(?7)))
                 ORDER BY v.enter_ms, v.id LIMIT ?4",
            )?;
            let rows =
                stmt.query_map((org, from_ms, to_ms, limit, only.device_id, only.tagtype, zones), visit_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Forgets location history and visits that ended before `before_ms`, at most `rows_max`
    /// rows per call (each call one short write); returns how many went.
    pub fn purge_locations(&self, before_ms: i64, rows_max: u32) -> Result<usize> {
        self.write(|tx| {
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare_cached("SELECT id FROM devices")?;
                stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?
            };
            let mut n = 0;
            for id in ids {
                let left = i64::from(rows_max).saturating_sub(n as i64);
                if left <= 0 {
                    break;
                }
                n += tx.exec(
                    "DELETE FROM locations WHERE device_id = ?1 AND t_ms IN
                        (SELECT t_ms FROM locations WHERE device_id = ?1 AND t_ms < ?2 ORDER BY t_ms LIMIT ?3)",
                    (id, before_ms, left),
                )?;
            }
            let left = i64::from(rows_max).saturating_sub(n as i64);
            if left > 0 {
                n += tx.exec(
                    "DELETE FROM visits WHERE id IN (SELECT id FROM visits WHERE enter_ms < ?1 AND exit_ms < ?1
                                                     ORDER BY enter_ms LIMIT ?2)",
                    (before_ms, left),
                )?;
            }
            Ok(n)
        })
    }

    /// Everything stored about where a contact was, by the devices she held: (device, her
    /// history with it, her visits with it).
    pub fn contact_locations(&self, org: &str, contact: i64) -> Result<ContactLocations> {
        self.read(|tx| {
            contact_exists(tx, org, contact)?;
            let held = devices_held_by(tx, org, contact)?;
            let mut out = Vec::new();
            let sql = format!(
                "SELECT {DEVICE_COLUMNS} FROM devices d LEFT JOIN items c ON c.id = d.contact_id AND c.archived IS NULL WHERE d.id = ?1"
            );
            for id in held {
                let Some(d) = tx.prepare_cached(&sql)?.query_row([id], device_from_row).optional()? else { continue };
                let history =
                    location_history_in(tx, id, Some(contact), (0, i64::MAX), crate::limits::LOCATION_EXPORT_ROWS_MAX)?;
                let visits = {
                    let mut stmt = tx.prepare_cached(
                        "SELECT device_id, zone_id, enter_ms, exit_ms, contact_id FROM visits
                         WHERE device_id = ?1 AND contact_id = ?2 ORDER BY enter_ms",
                    )?;
                    let rows = stmt.query_map((id, contact), visit_from_row)?;
                    rows.collect::<rusqlite::Result<Vec<_>>>()?
                };
                out.push((d, history, visits));
            }
            Ok(out)
        })
    }

    /// Forgets where a contact was: her history and visits with every device she held, and
    /// the last position of those she holds now. A device of hers in a zone now (its visit
    /// still open) stays there, as if it had entered at the purge, so that the engine's next
    /// decisions about it still fit what is stored. Returns the rows removed.
    pub fn purge_contact_locations(&self, org: &str, contact: i64) -> Result<usize> {
        self.write(|tx| {
            contact_exists(tx, org, contact)?;
            purge_contact_in(tx, org, contact, crate::timefmt::now_ms())
        })
    }
}

impl Store {
    /// The names of the organisation's live contacts among `ids` (a deleted one has none).
    pub fn contact_names(&self, org: &str, ids: &[i64]) -> Result<HashMap<i64, String>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let ids = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT id, name FROM items WHERE id IN (SELECT value FROM json_each(?2)) AND org = ?1
                 AND typeid = 1 AND parent IS NULL AND archived IS NULL",
            )?;
            let rows = stmt.query_map((org, &ids), |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<HashMap<i64, String>>>()?)
        })
    }
}

/// The devices of the organisation that `contact` holds or held (by her visits), by id.
fn devices_held_by(tx: &Connection, org: &str, contact: i64) -> Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(
        "SELECT id FROM devices WHERE org = ?1 AND (contact_id = ?2
             OR id IN (SELECT DISTINCT device_id FROM visits WHERE contact_id = ?2))
         ORDER BY id",
    )?;
    let ids = stmt.query_map((org, contact), |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
    Ok(ids)
}

/// [`Store::purge_contact_locations`] inside a write (also an erase's).
pub(super) fn purge_contact_in(tx: &Connection, org: &str, contact: i64, now: i64) -> Result<usize> {
    let mut n = 0;
    for id in devices_held_by(tx, org, contact)? {
        n += tx.exec("DELETE FROM locations WHERE device_id = ?1 AND contact_id = ?2", (id, contact))?;
        n += tx.exec(
            "DELETE FROM visits WHERE device_id = ?1 AND contact_id = ?2 AND exit_ms IS NOT NULL",
            (id, contact),
        )?;
        tx.exec(
            "UPDATE visits SET enter_ms = ?3 WHERE device_id = ?1 AND contact_id = ?2 AND exit_ms IS NULL",
            (id, contact, now),
        )?;
        tx.exec(
            "UPDATE devices SET lat = NULL, lon = NULL, receiver = NULL, rssi = NULL, position_ms = NULL,
                                position_zone_id = NULL, purged_ms = ?3,
                                zone_since_ms = CASE WHEN zone_id IS NULL THEN NULL ELSE ?3 END
             WHERE id = ?1 AND contact_id = ?2",
            (id, contact, now),
        )?;
    }
    Ok(n)
}

/// A device's history rows since `since_ms` while `contact` held it, oldest first: the newest
/// `limit` of them.
fn location_history_in(
    tx: &Connection,
    device_id: i64,
    contact: Option<i64>,
    (since_ms, until_ms): (i64, i64),
    limit: u32,
) -> Result<Vec<LocationRow>> {
    let mut stmt = tx.prepare_cached(
        "SELECT * FROM (SELECT t_ms, zone_id, lat, lon, receiver, rssi FROM locations
                        WHERE device_id = ?1 AND t_ms >= ?2 AND t_ms <= ?5 AND contact_id IS ?4
                        ORDER BY t_ms DESC LIMIT ?3)
         ORDER BY t_ms",
    )?;
    let rows = stmt.query_map((device_id, since_ms, limit, contact, until_ms), |r| {
        Ok(LocationRow {
            t_ms: r.get(0)?,
            zone_id: r.get(1)?,
            lat: r.get(2)?,
            lon: r.get(3)?,
            receiver: r.get(4)?,
            rssi: r.get(5)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The contact record exists in the organisation (deleted or not: a deleted contact's
/// location data can still be exported and forgotten); else `NotFound`.
fn contact_exists(tx: &Connection, org: &str, contact: i64) -> Result<()> {
    tx.prepare_cached("SELECT 1 FROM items WHERE id = ?1 AND org = ?2 AND typeid = 1 AND parent IS NULL")?
        .query_row((contact, org), |_| Ok(()))
        .optional()?
        .ok_or(StoreError::NotFound)
}

/// Closes the open visits but those of the devices `kept` in their zones (device id, zone
/// id), each where its device was last heard, and takes the others out of their zones.
fn close_open_visits_in(tx: &rusqlite::Connection, kept: &[(i64, i64)]) -> Result<usize> {
    let kept = serde_json::to_string(kept).unwrap_or_else(|_| "[]".into());
    let n = tx.exec(
        "UPDATE visits SET exit_ms = (SELECT max(visits.enter_ms, coalesce(d.last_seen_ms, visits.enter_ms))
                                      FROM devices d WHERE d.id = visits.device_id)
         WHERE exit_ms IS NULL AND (device_id, zone_id) NOT IN
            (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1))",
        [&kept],
    )?;
    tx.exec(
        "UPDATE devices SET zone_id = NULL, zone_since_ms = last_seen_ms WHERE zone_id IS NOT NULL
         AND (id, zone_id) NOT IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1))",
        [&kept],
    )?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FieldValues, RecordType};

    /// What the location thread decided before a purge and writes after it is not written as
    /// of then: no history row, the zone it entered from the purge on, and the visit it left
    /// (moved to the purge by it) gone rather than kept as a visit of no length at the purge.
    #[test]
    fn a_batch_written_after_a_purge_writes_nothing_from_before_it() {
        let (dir, store) = super::super::testing::store_with_org("purge-batch", "acme");
        let viewer = super::super::testing::admin_of(&store, "acme");
        let contact = store
            .create_record(
                &viewer,
                super::super::NewRecord {
                    record_type: RecordType::Contact,
                    fields: FieldValues::from([("lastname".to_string(), "Lee".to_string())]),
                    ownership: None,
                    flagged: false,
                    categories_add: Vec::new(),
                    related_add: Vec::new(),
                },
            )
            .unwrap();
        let device = Device {
            deviceaddress: "1/1/1".into(),
            deviceid: "1.1.1".into(),
            label: String::new(),
            tagtype: None,
            beacon: BeaconId::Mac(crate::location::beacon::Mac([0, 0, 0, 0, 0, 1])),
            contactid: Some(contact),
        };
        let id = store.create_device("acme", &device).unwrap().id;
        let update = |t_ms: i64, zone_id: i64| LocationEvent::Update {
            device_id: id,
            t_ms,
            zone_id,
            lat: 1.0,
            lon: 2.0,
            receiver: "rx".into(),
            rssi: -60.0,
        };
        let t0 = crate::timefmt::now_ms() - 60_000;
        let events = vec![LocationEvent::Enter { device_id: id, t_ms: t0, zone_id: 21 }, update(t0, 21)];
        store.write_location_batch(&LocationBatch { events }).unwrap();

        let before = crate::timefmt::now_ms() - 1;
        store.purge_contact_locations("acme", contact).unwrap();
        let after = crate::timefmt::now_ms();
        let events = vec![
            LocationEvent::Exit { device_id: id, t_ms: before - 200, zone_id: 21 },
            LocationEvent::Enter { device_id: id, t_ms: before - 100, zone_id: 22 },
            update(before - 100, 22),
            update(after + 1_000, 22),
        ];
        store.write_location_batch(&LocationBatch { events }).unwrap();

        let (visits, rows) = store
            .read(|tx| {
                let visits: Vec<(i64, i64, Option<i64>)> = tx
                    .prepare("SELECT zone_id, enter_ms, exit_ms FROM visits ORDER BY id")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<rusqlite::Result<_>>()?;
                let rows: Vec<i64> = tx
                    .prepare("SELECT t_ms FROM locations ORDER BY t_ms")?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                Ok((visits, rows))
            })
            .unwrap();
        assert_eq!(visits.len(), 1, "{visits:?}");
        let (zone, enter, exit) = visits[0];
        assert!(zone == 22 && (before..=after).contains(&enter) && exit.is_none(), "{visits:?}");
        assert_eq!(rows, vec![after + 1_000], "only the row from after the purge");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
