//! Alerts: what the rules raised, their tickets (Alarm) and acknowledgements.

use rusqlite::OptionalExtension;

use super::hooks::Target;
use super::{ExecCached, Result, Store, StoreError};
use crate::model::hook::Event;
use crate::model::{RecordType, Viewer};

/// An alert to record.
pub struct NewAlert<'a> {
    pub org: &'a str,
    pub rule: &'a str,
    pub kind: &'a str,
    pub device_id: i64,
    pub contact_id: Option<i64>,
    pub text: &'a str,
    pub value: &'a str,
    pub units: &'a str,
    /// What its rule watches: enter, not_seen, battery_low or alarm.
    pub channel: &'a str,
    pub t_ms: i64,
    /// Whether it is published already (or never will be: a Monitor, no feed); else it
    /// waits for [`Store::alert_published`] or, after a stop, the next start.
    pub published: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StoredAlert {
    pub id: i64,
    pub rule: String,
    pub kind: String,
    pub device_id: i64,
    pub deviceaddress: String,
    pub deviceid: String,
    pub contact_id: Option<i64>,
    pub contact_name: Option<String>,
    pub text: String,
    pub value: String,
    pub units: String,
    /// What its rule watches: enter, not_seen, battery_low or alarm ('' for alerts recorded
    /// before this was kept).
    pub channel: String,
    pub t_ms: i64,
    pub ticket_id: Option<i64>,
    pub acked_ms: Option<i64>,
    pub acked_by: Option<i64>,
}

/// The order of [`Store::alerts`]: newest first, or Alarms, then Warns, then Monitors (each
/// newest first) for the status page, where an Alarm must not scroll away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertOrder {
    Newest,
    MostSevere,
}

const ALERT_COLUMNS: &str = "a.id, a.rule, a.type, a.device_id, a.deviceaddress, a.deviceid,
     a.contact_id, c.name, a.text, a.value, a.units, a.t_ms, a.ticket_id, a.acked_ms, a.acked_by, a.channel";

fn alert_from_row(r: &rusqlite::Row) -> rusqlite::Result<StoredAlert> {
    Ok(StoredAlert {
        id: r.get(0)?,
        rule: r.get(1)?,
        kind: r.get(2)?,
        device_id: r.get(3)?,
        deviceaddress: r.get(4)?,
        deviceid: r.get(5)?,
        contact_id: r.get(6)?,
        contact_name: r.get(7)?,
        text: r.get(8)?,
        value: r.get(9)?,
        units: r.get(10)?,
        t_ms: r.get(11)?,
        ticket_id: r.get(12)?,
        acked_ms: r.get(13)?,
        acked_by: r.get(14)?,
        channel: r.get(15)?,
    })
}

pub(super) fn alert_in(tx: &rusqlite::Connection, org: &str, id: i64) -> Result<StoredAlert> {
    let sql = format!(
        "SELECT {ALERT_COLUMNS} FROM alerts a
         LEFT JOIN items c ON c.id = a.contact_id WHERE a.org = ?1 AND a.id = ?2"
    );
    tx.query_row(&sql, (org, id), alert_from_row).optional()?.ok_or(StoreError::NotFound)
}

impl Store {
    /// Records an alert; for an Alarm, with a ticket for the contact (created by the
    /// organisation's first administrator, flagged, urgent, related to the contact) through
    /// the usual record path, so `items.create` fires for it. Both in one write: one made in
    /// a write of its own before the alert's left, killed between the two, a ticket for an
    /// Alarm that was never recorded. Returns the alert id and the ticket id.
    pub fn create_alert(&self, a: &NewAlert<'_>, ticket_title: Option<&str>) -> Result<(i64, Option<i64>)> {
        let author = if ticket_title.is_some() { self.alarm_author(a.org)? } else { None };
        // Warn and Alarm reach `alerts.create` webhooks, written with the alert.
        let notify = a.kind != "Monitor";
        self.write_emitting(|tx| {
            let mut wrote = false;
            let ticket = match (ticket_title, &author) {
                (Some(title), Some(author)) => {
                    let new = |related: Vec<(i64, String)>| {
                        let mut fields = crate::model::FieldValues::new();
                        fields.insert("title".into(), title.to_string());
                        fields.insert("priority".into(), "urgent".into());
                        fields.insert("status".into(), "open".into());
                        super::NewRecord {
                            record_type: RecordType::Ticket,
                            fields,
                            ownership: None,
                            flagged: true,
                            categories_add: Vec::new(),
                            related_add: related,
                        }
                    };
                    let related = a.contact_id.map(|c| vec![(c, "alert".to_string())]).unwrap_or_default();
                    tx.execute_batch("SAVEPOINT ticket")?;
                    let made = match self.insert_record(tx, author, new(related)) {
                        Ok(made) => {
                            tx.execute_batch("RELEASE ticket")?;
                            made
                        }
                        // A contact deleted meanwhile: the ticket without it.
                        Err(StoreError::BadReference(_)) => {
                            tx.execute_batch("ROLLBACK TO ticket; RELEASE ticket")?;
                            self.insert_record(tx, author, new(Vec::new()))?
                        }
                        Err(e) => return Err(e),
                    };
                    wrote |= made.1;
                    Some(made.0)
                }
                _ => None,
            };
            tx.exec(
                "INSERT INTO alerts (org, rule, type, device_id, deviceaddress, deviceid, contact_id, text, value,
                                     units, t_ms, ticket_id, published, channel)
                 SELECT ?1, ?2, ?3, ?4, coalesce(d.deviceaddress, ''), coalesce(d.deviceid, ''), ?5, ?6, ?7,
                        ?8, ?9, ?10, ?11, ?12
                 FROM (SELECT 1) LEFT JOIN devices d ON d.id = ?4",
                (
                    a.org,
                    a.rule,
                    a.kind,
                    a.device_id,
                    a.contact_id,
                    a.text,
                    a.value,
                    a.units,
                    a.t_ms,
                    ticket,
                    a.published,
                    a.channel,
                ),
            )?;
            let id = tx.last_insert_rowid();
            wrote |= notify && self.emit(tx, a.org, &[Event::AlertsCreate], Target::Alert(id))?;
            Ok(((id, ticket), wrote))
        })
    }

    /// The organisation's first live administrator, as the author of alarm tickets.
    fn alarm_author(&self, org: &str) -> Result<Option<Viewer>> {
        let id: Option<i64> = self.read(|tx| {
            Ok(tx
                .query_row(
                    "SELECT id FROM principals WHERE org = ?1 AND kind = 1 AND admin = 1 AND deleted = 0
                     ORDER BY id LIMIT 1",
                    [org],
                    |r| r.get(0),
                )
                .optional()?)
        })?;
        Ok(id.map(|user_id| Viewer {
            user_id,
            org: org.to_string(),
            admin: true,
            prevent_private: false,
            groups: Vec::new(),
        }))
    }

    /// Alerts of an organisation: open ones only unless `all`, of one type (`Monitor`, `Warn`,
    /// `Alarm`) if `kind` is given, older than alert `before` if given, at most `limit` (the
    /// type is chosen before the limit, so many newer alerts of another type cannot hide an
    /// Alarm). In `order`.
    /// How many alerts of an organisation are open (not acknowledged).
    pub fn open_alerts_count(&self, org: &str) -> Result<i64> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached("SELECT count(*) FROM alerts WHERE org = ?1 AND acked_ms IS NULL")?
                .query_row([org], |r| r.get(0))?)
        })
    }

    pub fn alerts(
        &self,
        org: &str,
        all: bool,
        kind: Option<&str>,
        order: AlertOrder,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<StoredAlert>> {
        self.read(|tx| {
            let order = match order {
                AlertOrder::Newest => "a.id DESC",
                AlertOrder::MostSevere => "CASE a.type WHEN 'Alarm' THEN 0 WHEN 'Warn' THEN 1 ELSE 2 END, a.id DESC",
            };
            let sql = format!(
                "SELECT {ALERT_COLUMNS} FROM alerts a
                 LEFT JOIN items c ON c.id = a.contact_id
                 WHERE a.org = ?1 AND (?2 OR a.acked_ms IS NULL) AND (?3 IS NULL OR a.type = ?3)
                   AND (?5 IS NULL OR a.id < ?5)
                 ORDER BY {order} LIMIT ?4"
            );
            let mut stmt = tx.prepare_cached(&sql)?;
            let rows = stmt.query_map((org, all, kind, limit, before), alert_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The alert went out on the feed.
    pub fn alert_published(&self, id: i64) -> Result<()> {
        self.write(|tx| {
            tx.exec("UPDATE alerts SET published = 1 WHERE id = ?1", [id])?;
            Ok(())
        })
    }

    /// Alerts recorded and not published (the service stopped between the two), oldest
    /// first: those since `since_ms`, at most `limit`; older ones count as published from now
    /// on (news too old to sound now).
    pub fn unpublished_alerts(&self, since_ms: i64, limit: u32) -> Result<Vec<StoredAlert>> {
        self.write(|tx| {
            let sql = format!(
                "SELECT {ALERT_COLUMNS} FROM alerts a LEFT JOIN items c ON c.id = a.contact_id
                 WHERE a.published = 0 AND a.t_ms >= ?1 ORDER BY a.id LIMIT ?2"
            );
            let rows = tx
                .prepare(&sql)?
                .query_map((since_ms, limit), alert_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.exec("UPDATE alerts SET published = 1 WHERE published = 0 AND t_ms < ?1", [since_ms])?;
            Ok(rows)
        })
    }

    /// When each rule last fired for each device, newest first, at most `rows_max`: (rule id,
    /// device id, Unix ms). A restart starts the rules' repeat windows and absences from it.
    pub fn alerts_last_fired(&self, rows_max: usize) -> Result<Vec<(String, i64, i64)>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT rule, device_id, max(t_ms) AS t FROM alerts GROUP BY rule, device_id ORDER BY t DESC LIMIT ?1",
            )?;
            let rows = stmt
                .query_map([i64::try_from(rows_max).unwrap_or(i64::MAX)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The devices with an alarm (an alert of a rule on the alarm flag) nobody has
    /// acknowledged.
    pub fn open_alarm_devices(&self) -> Result<std::collections::HashSet<i64>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT DISTINCT device_id FROM alerts INDEXED BY alerts_open_alarms
                 WHERE channel = 'alarm' AND acked_ms IS NULL AND type <> 'Monitor'",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// When a device's alarms were last acknowledged (Unix ms), if ever.
    pub fn alarm_acked_ms(&self, device_id: i64) -> Result<Option<i64>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached("SELECT MAX(acked_ms) FROM alerts WHERE device_id = ?1 AND channel = 'alarm'")?
                .query_row([device_id], |r| r.get(0))?)
        })
    }

    /// A device's newest alarm nobody has acknowledged: its text and time.
    pub fn open_alarm(&self, device_id: i64) -> Result<Option<(String, i64)>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT text, t_ms FROM alerts INDEXED BY alerts_open_alarms
                     WHERE device_id = ?1 AND channel = 'alarm' AND acked_ms IS NULL AND type <> 'Monitor'
                     ORDER BY id DESC LIMIT 1",
                )?
                .query_row([device_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?)
        })
    }

    /// The text of the alarm a device's `alarm` state began with, if any (not that of an
    /// `enter` alert raised in the same moment).
    pub fn alarm_text_at(&self, device_id: i64, t_ms: i64) -> Result<Option<String>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT text FROM alerts WHERE device_id = ?1 AND t_ms = ?2 AND channel = 'alarm' AND type <> 'Monitor'
                     ORDER BY id DESC LIMIT 1",
                )?
                .query_row((device_id, t_ms), |r| r.get(0))
                .optional()?)
        })
    }

    pub fn alert(&self, org: &str, id: i64) -> Result<StoredAlert> {
        self.read(|tx| alert_in(tx, org, id))
    }

    /// Acknowledges an alert (once: a second acknowledgement keeps the first). The first
    /// acknowledgement of a Warn or Alarm reaches `alerts.ack` webhooks, written with it.
    pub fn ack_alert(&self, org: &str, id: i64, user_id: i64, t_ms: i64) -> Result<StoredAlert> {
        self.write_emitting(|tx| {
            let kind: Option<String> = tx
                .prepare_cached(
                    "UPDATE alerts SET acked_ms = ?3, acked_by = ?4
                     WHERE org = ?1 AND id = ?2 AND acked_ms IS NULL RETURNING type",
                )?
                .query_row((org, id, t_ms, user_id), |r| r.get(0))
                .optional()?;
            let wrote = match kind {
                Some(kind) => kind != "Monitor" && self.emit(tx, org, &[Event::AlertsAck], Target::Alert(id))?,
                // Acknowledged before, or none such.
                None => {
                    alert_in(tx, org, id)?;
                    false
                }
            };
            Ok(((), wrote))
        })?;
        self.alert(org, id)
    }

    /// Forgets alerts older than `before_ms` (at most `rows_max` in one write).
    /// Forgets alerts raised before `before_ms`, up to `rows_max` of them, but not an Alarm
    /// nobody has acknowledged: however old (or however far the clock jumped), it stays open
    /// until someone has seen it.
    pub fn purge_alerts(&self, before_ms: i64, rows_max: u32) -> Result<usize> {
        self.write(|tx| {
            Ok(tx.exec(
                "DELETE FROM alerts WHERE id IN (SELECT id FROM alerts WHERE t_ms < ?1
                 AND (type <> 'Alarm' OR acked_ms IS NOT NULL) ORDER BY id LIMIT ?2)",
                (before_ms, rows_max),
            )?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new store in a temporary folder (returned, to remove) with organisation `o`.
    fn store_with_org(name: &str) -> (std::path::PathBuf, Store) {
        super::super::testing::store_with_org(name, "o")
    }

    /// An alert of organisation `o`'s device 1.
    fn alert(kind: &'static str, t_ms: i64) -> NewAlert<'static> {
        NewAlert {
            org: "o",
            rule: "r",
            kind,
            device_id: 1,
            contact_id: None,
            text: "t",
            value: "",
            units: "",
            channel: "",
            t_ms,
            published: true,
        }
    }

    /// An open Alarm stays listed however many newer alerts of other types there are: by type
    /// (the type chosen before the limit) and first in the status page's order.
    #[test]
    fn newer_alerts_of_other_types_do_not_hide_an_alarm() {
        let (dir, store) = store_with_org("alert-order");
        let (alarm, _) = store.create_alert(&alert("Alarm", 1), None).unwrap();
        for t in 2..22 {
            store.create_alert(&alert(if t % 2 == 0 { "Monitor" } else { "Warn" }, t), None).unwrap();
        }
        let ids = |kind, order, limit| -> Vec<i64> {
            store.alerts("o", false, kind, order, None, limit).unwrap().iter().map(|a| a.id).collect()
        };
        assert!(!ids(None, AlertOrder::Newest, 10).contains(&alarm), "newest first, the Alarm is older");
        assert_eq!(ids(Some("Alarm"), AlertOrder::Newest, 10), vec![alarm]);
        let severe = store.alerts("o", false, None, AlertOrder::MostSevere, None, 10).unwrap();
        assert_eq!(severe[0].id, alarm);
        assert!(severe[1..].iter().all(|a| a.kind == "Warn"), "then the Warns, newest first");
        assert!(severe[1..].windows(2).all(|w| w[0].id > w[1].id));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A device's alarm state is its Alarm's: not a Monitor rule's press (recorded only), and
    /// not the text of an `enter` alert raised in the same moment.
    #[test]
    fn an_alarm_state_is_the_alarms_alone() {
        let (dir, store) = store_with_org("alarm-state");
        let press = |kind, channel, text| NewAlert { channel, text, ..alert(kind, 7) };
        store.create_alert(&press("Monitor", "alarm", "Visitor pressed"), None).unwrap();
        assert_eq!(store.open_alarm(1).unwrap(), None);
        assert!(store.open_alarm_devices().unwrap().is_empty());
        assert_eq!(store.alarm_text_at(1, 7).unwrap(), None);
        store.create_alert(&press("Alarm", "alarm", "Alarm button pressed"), None).unwrap();
        store.create_alert(&press("Warn", "enter", "Entered Office"), None).unwrap();
        assert_eq!(store.alarm_text_at(1, 7).unwrap().as_deref(), Some("Alarm button pressed"));
        assert_eq!(store.open_alarm(1).unwrap(), Some(("Alarm button pressed".to_string(), 7)));
        assert_eq!(store.open_alarm_devices().unwrap(), [1].into_iter().collect());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Old alerts go, but an open Alarm stays until acknowledged.
    #[test]
    fn purging_keeps_alarms_nobody_acknowledged() {
        let (dir, store) = store_with_org("alert-purge");
        let (open_alarm, _) = store.create_alert(&alert("Alarm", 1), None).unwrap();
        let (seen_alarm, _) = store.create_alert(&alert("Alarm", 2), None).unwrap();
        store.ack_alert("o", seen_alarm, 1, 3).unwrap();
        store.create_alert(&alert("Warn", 4), None).unwrap();
        store.create_alert(&alert("Monitor", 5), None).unwrap();
        let (newer, _) = store.create_alert(&alert("Warn", 1_000), None).unwrap();
        assert_eq!(store.purge_alerts(500, 100).unwrap(), 3);
        let mut left: Vec<i64> =
            store.alerts("o", true, None, AlertOrder::Newest, None, 10).unwrap().iter().map(|a| a.id).collect();
        left.sort_unstable();
        assert_eq!(left, vec![open_alarm, newer]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
