//! Keeping the database file: health probe, checkpoint at shutdown, online backups, restore.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{Result, Store, StoreError, schema};

/// What a backup or restore wrote.
#[derive(Debug)]
pub struct Copied {
    pub path: PathBuf,
    pub bytes: u64,
    pub schema_version: i64,
}

impl Store {
    /// A read answers: the database is usable (for health checks and the watchdog).
    pub fn ping(&self) -> Result<()> {
        self.read(|tx| {
            tx.query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
    }

    /// Moves the write-ahead log into the database file and empties it (at shutdown).
    pub fn checkpoint(&self) -> Result<()> {
        let mut w = self.lock_writer();
        self.commit_open(&mut w)?;
        w.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// Size of the database file and its write-ahead log, in bytes.
    pub fn size_bytes(&self) -> u64 {
        let wal = wal_path(&self.path);
        [self.path.as_path(), wal.as_path()].iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
    }
}

fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

fn shm_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-shm");
    PathBuf::from(p)
}

fn partial_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Copies the database at `db` to `out` with SQLite's online backup: a consistent snapshot,
/// taken while the service reads and writes. Written to `out.partial`, checked, synced, then
/// renamed, so `out` is either absent or a complete, checked copy.
pub fn backup(db: &Path, out: &Path) -> Result<Copied> {
    let src = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| StoreError::Internal(format!("cannot open {}: {e}", db.display())))?;
    src.busy_timeout(Duration::from_millis(crate::limits::STORE_BUSY_TIMEOUT_MS))?;
    backup_connection(&src, out)
}

fn backup_connection(src: &Connection, out: &Path) -> Result<Copied> {
    let partial = partial_path(out);
    let _ = std::fs::remove_file(&partial);
    {
        let mut dst = Connection::open(&partial)
            .map_err(|e| StoreError::Internal(format!("cannot create {}: {e}", partial.display())))?;
        let backup = rusqlite::backup::Backup::new(src, &mut dst)?;
        // One step: the whole database under one read transaction, so the copy is one snapshot.
        backup.step(-1)?;
        drop(backup);
        // A backup is one self-contained file, not a WAL database.
        dst.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))?;
    }
    let checked = check_file(&partial)?;
    sync_file(&partial)?;
    std::fs::rename(&partial, out)
        .map_err(|e| StoreError::Internal(format!("cannot rename {} to {}: {e}", partial.display(), out.display())))?;
    sync_parent(out);
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(Copied { path: out.to_path_buf(), bytes, schema_version: checked })
}

/// Replaces the database at `db` with the backup `from` (the service must be stopped). The
/// backup is checked first; the current database is kept beside it as `kept`.
pub fn restore(db: &Path, from: &Path, kept: &Path) -> Result<Copied> {
    let version = check_file(from)?;
    if db.exists() {
        // Take a consistent copy of what is there now (it may hold a WAL).
        let current = Connection::open(db)?;
        backup_connection(&current, kept)?;
    }
    let partial = partial_path(db);
    std::fs::copy(from, &partial).map_err(|e| StoreError::Internal(format!("cannot copy {}: {e}", from.display())))?;
    sync_file(&partial)?;
    for stale in [wal_path(db), shm_path(db)] {
        let _ = std::fs::remove_file(stale);
    }
    std::fs::rename(&partial, db).map_err(|e| StoreError::Internal(format!("cannot replace {}: {e}", db.display())))?;
    sync_parent(db);
    let bytes = std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
    Ok(Copied { path: db.to_path_buf(), bytes, schema_version: version })
}

/// Checks that a file is an intact sitegate database this version can open; returns its
/// schema version.
pub fn check_file(path: &Path) -> Result<i64> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| StoreError::Internal(format!("cannot open {}: {e}", path.display())))?;
    let bad =
        |what: String| StoreError::Internal(format!("{} is not a usable sitegate database: {what}", path.display()));
    let integrity: String =
        conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).map_err(|e| bad(e.to_string()))?;
    if integrity != "ok" {
        return Err(bad(format!("integrity check says {integrity}")));
    }
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = schema::MIGRATIONS.len() as i64;
    if version < 1 || version > known {
        return Err(bad(format!("schema version {version}; this sitegate reads 1 to {known}")));
    }
    let has_items: bool =
        conn.query_row("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'items'", [], |r| {
            r.get(0)
        })?;
    if !has_items {
        return Err(bad("no items table".into()));
    }
    Ok(version)
}

fn sync_file(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::Internal(format!("cannot sync {}: {e}", path.display())))
}

fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
}

/// Before migrating an existing database: a backup beside it, named after its schema version,
/// kept after the migration.
pub(super) fn backup_before_migration(conn: &Connection, db: &Path, version: i64) -> Result<PathBuf> {
    let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    let mut name = db.as_os_str().to_owned();
    name.push(format!(".schema{version}-{stamp}.bak"));
    let out = PathBuf::from(name);
    backup_connection(conn, &out)?;
    Ok(out)
}
