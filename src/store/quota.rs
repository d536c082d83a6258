//! Persistence of the per-user hourly call counters (the counting itself is in memory).

use super::ExecCached;
use super::{Result, Store};

impl Store {
    /// The counters of one clock hour, as last written.
    pub fn load_quota(&self, hour: i64) -> Result<Vec<(i64, u32)>> {
        self.read(|tx| {
            let mut stmt = tx.prepare("SELECT user_id, used FROM quota WHERE hour = ?1")?;
            let rows = stmt.query_map([hour], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Writes counters of one hour and forgets hours older than a day.
    pub fn save_quota(&self, hour: i64, counters: &[(i64, u32)]) -> Result<()> {
        self.write(|tx| {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO quota (user_id, hour, used) VALUES (?1, ?2, ?3)
                 ON CONFLICT (user_id, hour) DO UPDATE SET used = max(used, excluded.used)",
            )?;
            for (user, used) in counters {
                stmt.execute((user, hour, used))?;
            }
            tx.exec("DELETE FROM quota WHERE hour < ?1", [hour - 24])?;
            Ok(())
        })
    }
}
