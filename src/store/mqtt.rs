//! MQTT credentials: a username, its organisation, whether it belongs to a receiver, and the
//! SHA-256 of its password (passwords are random and long, like API tokens).

use rusqlite::OptionalExtension;

use super::{ExecCached, Result, Store, StoreError};
use crate::timefmt::now_secs;

#[derive(Clone, Debug, PartialEq)]
pub struct MqttUser {
    pub username: String,
    pub org: String,
    /// May also publish to the ingest topics (remote BLE receivers).
    pub receiver: bool,
    pub password_sha256: Vec<u8>,
    pub created: i64,
}

impl Store {
    pub fn create_mqtt_user(&self, user: &MqttUser) -> Result<()> {
        self.write(|tx| {
            let org: Option<String> =
                tx.query_row("SELECT id FROM organizations WHERE id = ?1", [&user.org], |r| r.get(0)).optional()?;
            if org.is_none() {
                return Err(StoreError::BadReference(format!("no organisation {:?}", user.org)));
            }
            let taken: Option<i64> =
                tx.query_row("SELECT 1 FROM mqtt_users WHERE username = ?1", [&user.username], |r| r.get(0)).optional()?;
            if taken.is_some() {
                return Err(StoreError::Duplicate(format!("an MQTT user {:?} already exists", user.username)));
            }
            tx.exec(
                "INSERT INTO mqtt_users (username, org, receiver, password_sha256, created) VALUES (?1, ?2, ?3, ?4, ?5)",
                (&user.username, &user.org, user.receiver, &user.password_sha256, now_secs()),
            )?;
            Ok(())
        })
    }

    pub fn mqtt_user(&self, username: &str) -> Result<Option<MqttUser>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT username, org, receiver, password_sha256, created FROM mqtt_users WHERE username = ?1",
                )?
                .query_row([username], user_from_row)
                .optional()?)
        })
    }

    pub fn mqtt_users(&self) -> Result<Vec<MqttUser>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT username, org, receiver, password_sha256, created FROM mqtt_users ORDER BY org, username",
            )?;
            let rows = stmt.query_map([], user_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    pub fn delete_mqtt_user(&self, username: &str) -> Result<()> {
        self.write(|tx| match tx.exec("DELETE FROM mqtt_users WHERE username = ?1", [username])? {
            0 => Err(StoreError::NotFound),
            _ => Ok(()),
        })
    }
}

fn user_from_row(r: &rusqlite::Row) -> rusqlite::Result<MqttUser> {
    Ok(MqttUser {
        username: r.get(0)?,
        org: r.get(1)?,
        receiver: r.get(2)?,
        password_sha256: r.get(3)?,
        created: r.get(4)?,
    })
}

impl Store {
    /// The last published state of every device: (device id, state, Unix ms).
    pub fn device_states(&self) -> Result<Vec<(i64, String, i64)>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached("SELECT device_id, state, t_ms FROM device_states ORDER BY device_id")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Records published states (device id, state, Unix ms), in one transaction; devices
    /// deleted meanwhile are skipped.
    pub fn set_device_states(&self, states: &[(i64, &str, i64)]) -> Result<()> {
        self.write(|tx| {
            for (id, state, t_ms) in states {
                tx.exec(
                    "INSERT INTO device_states (device_id, state, t_ms)
                     SELECT id, ?2, ?3 FROM devices WHERE id = ?1
                     ON CONFLICT (device_id) DO UPDATE SET state = excluded.state, t_ms = excluded.t_ms",
                    (id, state, t_ms),
                )?;
            }
            Ok(())
        })
    }
}

impl Store {
    pub fn organization_exists(&self, org: &str) -> Result<bool> {
        self.read(|tx| {
            Ok(tx.query_row("SELECT 1 FROM organizations WHERE id = ?1", [org], |_| Ok(())).optional()?.is_some())
        })
    }
}

/// A message waiting for the upstream broker.
#[derive(Clone, Debug, PartialEq)]
pub struct Queued {
    pub id: i64,
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
}

impl Store {
    /// Appends messages to the bridge's queue; beyond `rows_max` the oldest are dropped.
    /// Returns how many were dropped.
    pub fn bridge_enqueue(&self, messages: &[(String, Vec<u8>, bool)], rows_max: u64) -> Result<u64> {
        self.write(|tx| {
            for (topic, payload, retain) in messages {
                tx.exec(
                    "INSERT INTO bridge_queue (topic, payload, retain) VALUES (?1, ?2, ?3)",
                    (topic, payload, retain),
                )?;
            }
            let count: i64 = tx.query_row("SELECT count(*) FROM bridge_queue", [], |r| r.get(0))?;
            let over = count - i64::try_from(rows_max).unwrap_or(i64::MAX);
            if over > 0 {
                // The oldest data and state messages go first: an alert (a panic button) only
                // when the queue holds nothing else.
                let mut n = tx.exec(
                    "DELETE FROM bridge_queue WHERE id IN
                         (SELECT id FROM bridge_queue WHERE topic NOT LIKE '%/alert' ORDER BY id LIMIT ?1)",
                    [over],
                )?;
                if (n as i64) < over {
                    n += tx.exec(
                        "DELETE FROM bridge_queue WHERE id IN (SELECT id FROM bridge_queue ORDER BY id LIMIT ?1)",
                        [over - n as i64],
                    )?;
                }
                return Ok(n as u64);
            }
            Ok(0)
        })
    }

    /// Up to `limit` queued messages after `after_id`, oldest first.
    pub fn bridge_peek(&self, after_id: i64, limit: u32) -> Result<Vec<Queued>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT id, topic, payload, retain FROM bridge_queue WHERE id > ?1 ORDER BY id LIMIT ?2",
            )?;
            let rows = stmt.query_map((after_id, limit), |r| {
                Ok(Queued { id: r.get(0)?, topic: r.get(1)?, payload: r.get(2)?, retain: r.get(3)? })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Up to `limit` queued alert messages after `after_id`, oldest first (they go upstream
    /// ahead of the rest).
    pub fn bridge_peek_alerts(&self, after_id: i64, limit: u32) -> Result<Vec<Queued>> {
        self.read(|tx| {
            // The same condition as the partial index's, which it reads.
            let mut stmt = tx.prepare_cached(
                "SELECT id, topic, payload, retain FROM bridge_queue WHERE topic LIKE '%/alert' AND id > ?1
                 ORDER BY id LIMIT ?2",
            )?;
            let rows = stmt.query_map((after_id, limit), |r| {
                Ok(Queued { id: r.get(0)?, topic: r.get(1)?, payload: r.get(2)?, retain: r.get(3)? })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Removes delivered messages.
    pub fn bridge_delivered(&self, ids: &[i64]) -> Result<()> {
        self.write(|tx| {
            for id in ids {
                tx.exec("DELETE FROM bridge_queue WHERE id = ?1", [id])?;
            }
            Ok(())
        })
    }

    pub fn bridge_queued(&self) -> Result<i64> {
        self.read(|tx| Ok(tx.query_row("SELECT count(*) FROM bridge_queue", [], |r| r.get(0))?))
    }
}

#[cfg(test)]
mod tests {
    /// A full bridge queue drops its oldest data and state messages, and an alert only when
    /// it holds nothing else.
    #[test]
    fn a_full_bridge_queue_keeps_alerts() {
        let (dir, store) = super::super::testing::store_with_org("bridge-queue", "o");
        let msg = |topic: &str| (topic.to_string(), b"{}".to_vec(), false);
        let queued = [msg("o/1/alert"), msg("o/1/data"), msg("o/1/state"), msg("o/2/data")];
        assert_eq!(store.bridge_enqueue(&queued, 4).unwrap(), 0);
        // Two more: the two oldest that are no alerts go.
        assert_eq!(store.bridge_enqueue(&[msg("o/2/alert"), msg("o/3/data")], 4).unwrap(), 2);
        let topics = |store: &super::Store| -> Vec<String> {
            store.bridge_peek(0, 10).unwrap().into_iter().map(|q| q.topic).collect()
        };
        assert_eq!(topics(&store), ["o/1/alert", "o/2/data", "o/2/alert", "o/3/data"]);
        // Only alerts left beyond the bound: the oldest of them goes.
        assert_eq!(store.bridge_enqueue(&[msg("o/3/alert")], 2).unwrap(), 3);
        assert_eq!(topics(&store), ["o/2/alert", "o/3/alert"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
