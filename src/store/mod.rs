//! The store: the only module that touches SQLite.
//!
//! One SQLite file in WAL mode. Writes go through one writer connection (a mutex orders them
//! inside the process; `busy_timeout` orders them against CLI commands writing at the same
//! time), each in a `BEGIN IMMEDIATE` transaction. Reads use pooled connections and never wait
//! for the writer. `synchronous = FULL`: a commit is on disk (WAL fsynced) before the API answers
//! 2xx, so an acknowledged write survives kill -9 and power loss.
//!
//! Callers see domain types and [`StoreError`], never rusqlite types.

mod activities;
mod alerts;
mod hooks;
mod location;
mod maintenance;
mod mqtt;
mod principals;
mod quota;
mod records;
mod reports;
mod schema;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use crate::limits;
use crate::model::FieldValues;

pub use activities::{ActivityChanges, NewActivity, Place};
pub use alerts::{NewAlert, StoredAlert};
pub use hooks::{Attempt, Content, DeliveryInfo, Hook, HookSettings, Notification, Outbox, Outgoing, Render};
pub use location::{ContactLocations, LocationBatch, LocationEvent, StoredDevice, Visit};
pub use maintenance::{backup, restore};
pub use mqtt::MqttUser;
pub use principals::NewUser;
pub use records::{
    ActivityRow, CategoryRef, Filter, ListEntry, ListQuery, NewRecord, RecordChanges, RecordDetail, RecordRow,
    RelatedItem, Search, SearchMode, SortField,
};
pub use reports::{Assignee, Billing, DateCondition, ReportOrder, ReportQuery, ReportRow, Stamp};

/// What went wrong in the store, in terms a caller can act on.
#[derive(Debug)]
pub enum StoreError {
    /// The addressed item does not exist or is not visible to the caller.
    NotFound,
    /// The request names something that does not exist or cannot be used (a category tag of
    /// another record type, an unknown related item, an unknown user or group id).
    BadReference(String),
    /// The caller may not do this (ownership by someone else's group).
    Forbidden(String),
    /// An activity may not sit under that parent (the message names the allowed parents).
    WrongParent(String),
    /// A unique name or e-mail already exists.
    Duplicate(String),
    /// Another process held the write lock for longer than the busy timeout.
    Busy,
    /// The database itself failed (I/O error, corruption, full disk).
    Internal(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::NotFound => write!(f, "not found"),
            StoreError::BadReference(m)
            | StoreError::Forbidden(m)
            | StoreError::WrongParent(m)
            | StoreError::Duplicate(m) => {
                write!(f, "{m}")
            }
            StoreError::Busy => write!(f, "the database is busy"),
            StoreError::Internal(m) => write!(f, "database error: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> StoreError {
        match err.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy,
            _ => StoreError::Internal(err.to_string()),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub struct Store {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// "Viewed" stamps not yet written: item id -> Unix seconds.
    viewed_pending: Mutex<HashMap<i64, i64>>,
    viewed_dropped: AtomicU64,
    /// Set at service start: changes then write webhook deliveries.
    outbox: std::sync::OnceLock<hooks::Outbox>,
}

impl Store {
    /// Opens (creating if needed) the database and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Internal(format!("cannot create {}: {e}", dir.display())))?;
        }
        let created = !path.exists();
        let writer =
            Connection::open(path).map_err(|e| StoreError::Internal(format!("cannot open {}: {e}", path.display())))?;
        if created {
            restrict_permissions(path);
        }
        configure(&writer, true)?;
        migrate(&writer, path, schema::MIGRATIONS)?;
        Ok(Store {
            path: path.to_path_buf(),
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            viewed_pending: Mutex::new(HashMap::new()),
            viewed_dropped: AtomicU64::new(0),
            outbox: std::sync::OnceLock::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a read connection inside one read transaction (a consistent snapshot).
    fn read<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let pooled = self.readers.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                configure(&c, false)?;
                c
            }
        };
        let out = {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let out = f(&tx);
            // A read transaction has nothing to commit; finishing it releases the snapshot.
            tx.finish()?;
            out
        };
        let mut pool = self.readers.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < limits::STORE_READERS_IDLE_MAX {
            pool.push(conn);
        }
        out
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer; commits if `f` succeeds.
    fn write<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// Notes that an item was shown. Stamps are written in batches by [`Store::flush_viewed`]
    /// (a show must not cost a synced write); until then reads overlay them. When the buffer is
    /// full the stamp is dropped and counted.
    pub fn note_viewed(&self, item: i64, at: i64) {
        let mut pending = self.viewed_pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.len() >= limits::STORE_VIEWED_QUEUE_DEPTH_MAX && !pending.contains_key(&item) {
            self.viewed_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let slot = pending.entry(item).or_insert(at);
        *slot = (*slot).max(at);
    }

    /// The pending "viewed" stamp of an item, newer than what the database holds.
    fn viewed_overlay(&self, item: i64, stored: Option<i64>) -> Option<i64> {
        let pending = self.viewed_pending.lock().unwrap_or_else(PoisonError::into_inner);
        match (pending.get(&item), stored) {
            (Some(p), Some(s)) => Some((*p).max(s)),
            (Some(p), None) => Some(*p),
            (None, s) => s,
        }
    }

    /// Stamps dropped because the queue was full, since start.
    pub fn viewed_dropped(&self) -> u64 {
        self.viewed_dropped.load(Ordering::Relaxed)
    }

    /// Writes the pending "viewed" stamps in one transaction; returns how many.
    pub fn flush_viewed(&self) -> Result<usize> {
        let stamps: Vec<(i64, i64)> = {
            let pending = self.viewed_pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending.iter().map(|(k, v)| (*k, *v)).collect()
        };
        if stamps.is_empty() {
            return Ok(0);
        }
        let written = self.write(|tx| {
            let mut stmt = tx.prepare_cached("UPDATE items SET viewed = max(coalesce(viewed, 0), ?2) WHERE id = ?1")?;
            for (id, at) in &stamps {
                stmt.execute((id, at))?;
            }
            Ok(stamps.len())
        })?;
        // Forget what was written, unless a newer stamp came in meanwhile.
        let mut pending = self.viewed_pending.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, at) in &stamps {
            if pending.get(id) == Some(at) {
                pending.remove(id);
            }
        }
        Ok(written)
    }
}

fn configure(conn: &Connection, writer: bool) -> Result<()> {
    conn.busy_timeout(Duration::from_millis(limits::STORE_BUSY_TIMEOUT_MS))?;
    if writer {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Internal(format!("cannot switch to WAL (journal_mode is {mode})")));
        }
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
    if !writer {
        conn.execute_batch("PRAGMA query_only = ON;")?;
    }
    // Plans must not depend on bound values: otherwise SQLite marks every parameter of a
    // join as plan-relevant, and the statement cache's clear_bindings then forces a full
    // re-prepare on each use (measured: a quarter of the CPU time of a record write).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.set_prepared_statement_cache_capacity(64);
    register_functions(conn)?;
    Ok(())
}

/// SQL functions the queries use: `sg_digits(text)` keeps only the ASCII digits;
/// `sg_lower(text)` lower-cases all of Unicode (SQLite's `lower` does ASCII only), as the
/// `search` column is.
fn register_functions(conn: &Connection) -> Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "sg_digits",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let text: Option<String> = ctx.get(0)?;
            Ok(text.map(|t| t.chars().filter(char::is_ascii_digit).collect::<String>()))
        },
    )?;
    conn.create_scalar_function(
        "sg_lower",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let text: Option<String> = ctx.get(0)?;
            Ok(text.map(|t| t.to_lowercase()))
        },
    )?;
    Ok(())
}

/// Applies the migrations the database has not had; an existing database is backed up first.
fn migrate(conn: &Connection, path: &Path, migrations: &[&str]) -> Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = migrations.len() as i64;
    if version > known {
        return Err(StoreError::Internal(format!(
            "the database has schema version {version}, newer than this sitegate knows ({known}); \
             run the newer sitegate or restore a backup"
        )));
    }
    if version > 0 && version < known {
        let kept = maintenance::backup_before_migration(conn, path, version)?;
        log::info!("database backed up to {} before migrating from schema {version}", kept.display());
    }
    for (i, sql) in migrations.iter().enumerate().skip(version as usize) {
        conn.execute_batch(&format!("BEGIN IMMEDIATE;\n{sql}\nPRAGMA user_version = {};\nCOMMIT;", i + 1)).map_err(
            |e| {
                let _ = conn.execute_batch("ROLLBACK");
                StoreError::Internal(format!("migration {} failed: {e}", i + 1))
            },
        )?;
        log::info!("database schema migrated to version {}", i + 1);
    }
    Ok(())
}

#[cfg(unix)]
fn restrict_permissions(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        log::warn!("cannot restrict permissions of {}: {e}", path.display());
    }
}

#[cfg(not(unix))]
fn restrict_permissions(_path: &Path) {}

/// Field values as stored: a JSON object of text.
fn fields_json(fields: &FieldValues) -> String {
    serde_json::to_string(fields).unwrap_or_else(|_| "{}".into())
}

fn parse_fields(text: &str) -> FieldValues {
    serde_json::from_str(text).unwrap_or_default()
}

/// Applies changed fields to current ones: an empty value removes the field.
fn merge_fields(current: &mut FieldValues, changes: &FieldValues) {
    for (k, v) in changes {
        if v.is_empty() {
            current.remove(k);
        } else {
            current.insert(k.clone(), v.clone());
        }
    }
}

/// Separates the values in the `search` column, so that "starts with" is "contains 0x1F + text".
const SEARCH_SEPARATOR: char = '\u{1f}';

/// The `search` column: the name and every value, lower-cased, each after a separator.
/// Values never hold control characters (`model::check_text`), so the separator is unambiguous.
fn search_text(name: &str, fields: &FieldValues) -> String {
    let mut out = String::with_capacity(name.len() + fields.values().map(|v| v.len() + 1).sum::<usize>() + 2);
    for value in std::iter::once(name).chain(fields.values().map(String::as_str)) {
        if !value.is_empty() {
            out.push(SEARCH_SEPARATOR);
            out.push_str(&value.to_lowercase());
        }
    }
    out.push(SEARCH_SEPARATOR);
    out
}

/// `execute` through the connection's statement cache, for the fixed statements of the write
/// paths (the cache holds them prepared; a plain `execute` compiles the SQL every time).
trait ExecCached {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
}

impl ExecCached for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }
}

/// A JSON array of integers, for `IN (SELECT value FROM json_each(?))`.
fn json_ids(ids: &[i64]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_database_is_backed_up_before_a_migration() {
        let dir = std::env::temp_dir().join(format!("sitegate-migrate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("site.db");
        let conn = Connection::open(&path).unwrap();
        configure(&conn, true).unwrap();
        migrate(&conn, &path, &schema::MIGRATIONS[..1]).unwrap();
        conn.execute("INSERT INTO organizations (id, name) VALUES ('o', 'O')", []).unwrap();
        let no_backups = |d: &Path| {
            std::fs::read_dir(d)
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".bak"))
                .count()
        };
        assert_eq!(no_backups(&dir), 0, "a new database needs no backup");

        let next = [schema::MIGRATIONS[0], "CREATE TABLE later (x INTEGER);"];
        migrate(&conn, &path, &next).unwrap();
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 2);
        let backups: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains(".schema1-") && p.to_string_lossy().ends_with(".bak"))
            .collect();
        assert_eq!(backups.len(), 1, "{backups:?}");
        assert_eq!(maintenance::check_file(&backups[0]).unwrap(), 1);
        let kept = Connection::open(&backups[0]).unwrap();
        let orgs: i64 = kept.query_row("SELECT count(*) FROM organizations", [], |r| r.get(0)).unwrap();
        assert_eq!(orgs, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
