//! Keeping the database file: health probe, checkpoint at shutdown, online backups, restore.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::{ExecCached, Result, Store, StoreError, schema};

/// The clock of one retention purge (data older than its time less the retention goes): the
/// wall clock, kept from running far ahead of the time the last purge stored when the wall
/// clock is set wrongly ahead. It moves past that by at most `PURGE_CLOCK_LEAD_MS` at a start,
/// and from one purge to the next by at most `PURGE_CLOCK_CATCH_UP_RATE` times the time that
/// passed on the monotonic clock. A clock behind leaves the stored time where it is; a shorter
/// retention applies at once.
pub struct PurgeClock {
    name: &'static str,
    /// When this run last purged, and the time it purged by.
    last: Option<(Instant, i64)>,
    held_said: bool,
}

impl PurgeClock {
    pub fn new(name: &'static str) -> PurgeClock {
        PurgeClock { name, last: None, held_said: false }
    }

    /// The time to purge by for the wall clock's `now_ms`, stored.
    pub fn now_ms(&mut self, store: &Store, now_ms: i64) -> Result<i64> {
        use crate::limits::{PURGE_CLOCK_CATCH_UP_RATE, PURGE_CLOCK_LEAD_MS};
        let most = match self.last {
            Some((at, last)) => {
                let ran_ms = i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX);
                last.saturating_add(ran_ms.saturating_mul(PURGE_CLOCK_CATCH_UP_RATE))
            }
            // Nothing stored: a new database (schema 20 started those of earlier versions from
            // the newest time of their data).
            None => store.purge_clock(self.name)?.map_or(now_ms, |t| t.saturating_add(PURGE_CLOCK_LEAD_MS)),
        };
        let purge_now = now_ms.min(most).max(self.last.map_or(i64::MIN, |(_, t)| t));
        let behind_h = (now_ms - purge_now) / 3_600_000;
        if purge_now < now_ms && !self.held_said {
            let say = format!(
                "{} purge: the clock is {behind_h} h past the time the service last purged by (it was off \
                 that long, or the clock is set ahead): it purges as of that time, catching up a day an hour \
                 (if the clock is wrong, set it: what is within the retention is kept meanwhile, but for a \
                 day of the oldest each hour)",
                self.name
            );
            if behind_h >= 24 { log::warn!("{say}") } else { log::info!("{say}") }
        }
        self.held_said = purge_now < now_ms;
        self.last = Some((Instant::now(), purge_now));
        store.set_purge_clock(self.name, purge_now)?;
        Ok(purge_now)
    }
}

/// What a backup or restore wrote.
#[derive(Debug)]
pub struct Copied {
    pub path: PathBuf,
    pub bytes: u64,
    pub schema_version: i64,
}

impl Store {
    /// The time the retention purge `name` last purged by.
    fn purge_clock(&self, name: &str) -> Result<Option<i64>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached("SELECT now_ms FROM purge_clocks WHERE name = ?1")?
                .query_row([name], |r| r.get(0))
                .optional()?)
        })
    }

    /// Stores the time the retention purge `name` purged by; never one before the stored one.
    fn set_purge_clock(&self, name: &str, now_ms: i64) -> Result<()> {
        self.write(|tx| {
            tx.exec(
                "INSERT INTO purge_clocks (name, now_ms) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET now_ms = max(now_ms, excluded.now_ms)",
                (name, now_ms),
            )?;
            Ok(())
        })
    }

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

    /// A read that runs for minutes unless its request's reads are stopped (fault injection).
    pub fn slow_read(&self) -> Result<i64> {
        self.read_one_statement(|c| {
            Ok(c.query_row(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000000000)
                 SELECT count(*) FROM n",
                [],
                |r| r.get(0),
            )?)
        })
    }

    /// Bytes the service may still write on the file system holding the database (what an
    /// unprivileged process may use), or None where the file system does not say.
    pub fn disk_free_bytes(&self) -> Option<u64> {
        let dir = self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        rustix::fs::statvfs(dir).ok().map(|s| s.f_bavail.saturating_mul(s.f_frsize))
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

fn journal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-journal");
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
/// taken while the service reads and writes. Written to `out.partial` (mode 0600: it holds
/// what the database holds), checked, synced, then renamed, so `out` is either absent or a
/// complete, checked copy; a failed backup leaves nothing behind. `out` may not be the
/// database or one of its companions.
pub fn backup(db: &Path, out: &Path) -> Result<Copied> {
    if same_file_as_database(db, out) {
        return Err(StoreError::BadReference(format!(
            "{} is the database itself (or its -wal, -shm, -journal or .lock file): back up to another file",
            out.display()
        )));
    }
    let src = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| StoreError::Unusable(format!("cannot open {}: {e}{}", db.display(), access_hint(db))))?;
    src.busy_timeout(Duration::from_millis(crate::limits::STORE_BUSY_TIMEOUT_MS))?;
    // Said of the database, not of the copy the check would find it in.
    let version: i64 = src
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| StoreError::Unusable(format!("{}: {}{}", db.display(), StoreError::from(e), access_hint(db))))?;
    let known = schema::MIGRATIONS.len() as i64;
    if version > known {
        return Err(StoreError::Unusable(format!(
            "{} has schema version {version}, newer than this sitegate knows ({known}): back it up with the newer sitegate",
            db.display()
        )));
    }
    if version < 1 {
        return Err(StoreError::Unusable(format!(
            "{} is not a sitegate database (schema version {version}): is [store] path right?",
            db.display()
        )));
    }
    // The copy's check finds what is wrong with the database: said of the database.
    backup_connection(&src, out).map_err(|e| match e {
        StoreError::Unusable(m) => {
            StoreError::Unusable(format!("the database {} failed the check of its copy (removed): {m}", db.display()))
        }
        other => other,
    })
}

/// Whether `path` names the database at `db` or one of the files SQLite and sitegate keep
/// beside it (compared by where they resolve to, so `./x.db` and `x.db` are the same).
fn same_file_as_database(db: &Path, path: &Path) -> bool {
    let Some(target) = resolved(path) else { return false };
    let Some(db) = resolved(db) else { return false };
    ["", "-wal", "-shm", "-journal", ".lock", ".partial"].iter().any(|suffix| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        name == target.as_os_str()
    })
}

/// A path with its folder resolved (the file itself need not exist).
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(full) = path.canonicalize() {
        return Some(full);
    }
    let name = path.file_name()?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Some(parent.canonicalize().ok()?.join(name))
}

fn backup_connection(src: &Connection, out: &Path) -> Result<Copied> {
    let partial = partial_path(out);
    let _ = std::fs::remove_file(&partial);
    let written = write_backup(src, &partial).and_then(|()| {
        let checked = check_file(&partial)?;
        sync_file(&partial)?;
        std::fs::rename(&partial, out).map_err(|e| {
            StoreError::Internal(format!("cannot rename {} to {}: {e}", partial.display(), out.display()))
        })?;
        Ok(checked)
    });
    let checked = match written {
        Ok(checked) => checked,
        Err(e) => {
            // With what SQLite made beside it: the copy is a WAL database until it is not.
            remove_with_companions(&partial);
            // The copy's side failed for a full disk: name where it was written.
            return Err(match e {
                StoreError::StorageFull(m) => StoreError::StorageFull(format!("writing {}: {m}", out.display())),
                other => other,
            });
        }
    };
    sync_parent(out);
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(Copied { path: out.to_path_buf(), bytes, schema_version: checked })
}

/// The snapshot of `src` into a new file at `partial`, readable by its owner only.
fn write_backup(src: &Connection, partial: &Path) -> Result<()> {
    create_private(partial)?;
    let mut dst = Connection::open(partial)
        .map_err(|e| StoreError::Internal(format!("cannot create {}: {e}", partial.display())))?;
    let backup = rusqlite::backup::Backup::new(src, &mut dst)?;
    // One step: the whole database under one read transaction, so the copy is one snapshot.
    backup.step(-1)?;
    drop(backup);
    // A backup is one self-contained file, not a WAL database.
    dst.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))?;
    Ok(())
}

/// Removes what an earlier start left of its backup before migration when it was stopped
/// during it (`<database>.schema<N>-<time>.bak.partial` and SQLite's journal of it): they
/// are never finished, and each such start left another.
fn remove_unfinished_backups(db: &Path) {
    let (Some(folder), Some(name)) = (db.parent(), db.file_name().and_then(|n| n.to_str())) else { return };
    let folder = if folder.as_os_str().is_empty() { Path::new(".") } else { folder };
    let Ok(entries) = std::fs::read_dir(folder) else { return };
    let prefix = format!("{name}.schema");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        if file.starts_with(&prefix) && (file.ends_with(".bak.partial") || file.ends_with(".bak.partial-journal")) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => log::info!("removed {}, left by a start stopped while it backed up", entry.path().display()),
                Err(e) => log::warn!("cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

/// Gives `path` (a database this process made) to the owner of `like` (the file it replaces,
/// or its folder) when they differ: a command run as root would otherwise leave a file the
/// service's user cannot open. Only root can; anyone else made a file of their own.
#[cfg(unix)]
pub fn give_to_owner_of(path: &Path, like: Option<&Path>) {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let (Some(like), Ok(file)) = (like.and_then(|l| std::fs::metadata(l).ok()), std::fs::metadata(path)) else {
        return;
    };
    if (file.uid(), file.gid()) == (like.uid(), like.gid()) {
        return;
    }
    match std::os::unix::fs::chown(path, Some(like.uid()), Some(like.gid())) {
        Ok(()) => log::info!("{} given to user {} (the owner of what it replaces)", path.display(), like.uid()),
        Err(e) => log::warn!("cannot give {} to user {}: {e}", path.display(), like.uid()),
    }
}

#[cfg(not(unix))]
pub fn give_to_owner_of(_path: &Path, _like: Option<&Path>) {}

/// Why this process may not be able to open the database at `path`, if its files are not
/// its user's to read and write: what to say after "cannot open", else nothing.
#[cfg(unix)]
pub fn access_hint(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid();
    if me.is_root() {
        return String::new();
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let folder = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    for file in [path, Path::new(&wal), folder] {
        let Ok(meta) = std::fs::metadata(file) else { continue };
        let rw = rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK;
        if rustix::fs::access(file, rw).is_err() {
            return format!(
                " ({} belongs to user {} and this process runs as user {}: give it to the service's user, \
                 e.g. `chown -R sitegate: {}`)",
                file.display(),
                meta.uid(),
                me.as_raw(),
                folder.display()
            );
        }
    }
    String::new()
}

#[cfg(not(unix))]
pub fn access_hint(_path: &Path) -> String {
    String::new()
}

/// Creates an empty file at `path` with mode 0600 (SQLite then writes into it as it is).
fn create_private(path: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map(drop).map_err(|e| StoreError::Internal(format!("cannot create {}: {e}", path.display())))
}

/// Replaces the database at `db` with the backup `from` (the service must be stopped). The
/// backup is checked first. The current database, whatever its state (damaged, or of a newer
/// schema, the cases a restore is for), is kept as it is: its file (and write-ahead log) is
/// renamed to `kept` (or `kept-2`, ... if that exists). Returns what was restored and where the
/// current database went.
pub fn restore(db: &Path, from: &Path, kept: &Path) -> Result<(Copied, Option<PathBuf>)> {
    if same_file_as_database(db, from) {
        return Err(StoreError::BadReference(format!(
            "{} is the database itself: restore from a backup",
            from.display()
        )));
    }
    let version = check_file(from)?;
    let partial = partial_path(db);
    remove_with_companions(&partial);
    // Through SQLite, not as a file: a backup with a write-ahead log beside it (a database
    // kept by an earlier restore, a copy of one left by a crash) holds what its log holds.
    let copied = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| StoreError::Unusable(format!("cannot open {}: {e}{}", from.display(), access_hint(from))))
        .and_then(|src| write_backup(&src, &partial))
        .and_then(|()| check_file(&partial))
        .and_then(|_| sync_file(&partial));
    if let Err(e) = copied {
        remove_with_companions(&partial);
        return Err(e);
    }
    // The current database goes with its log or journal: left beside the restored file, SQLite
    // would take them for its own and write the old database's pages into it. The renames
    // are not one step: a marker names where the database goes before the first, so that a
    // restore interrupted between them (a kill, a power cut) is finished by the next one, to
    // the same name (the log and its database together), and nothing opens the folder
    // meanwhile (`interrupted_restore`): a start there made a new, empty database.
    let companions = [wal_path(db), journal_path(db)];
    let marker = restore_marker(db);
    let begun = restore_begun(db);
    let kept = if db.exists() || companions.iter().any(|c| c.exists()) {
        let to = match begun {
            // Cut off before the database itself was moved there: its move is finished.
            Some(to) if !to.exists() => to,
            // Cut off after the restored copy was put in place (the database is that copy):
            // it is kept like any other, under a name of its own.
            _ => free_kept_name(kept)?,
        };
        write_marker(&marker, &to)?;
        Some(keep_current(db, &to)?)
    } else {
        begun
    };
    if let Some(left) = companions.iter().find(|c| c.exists()) {
        remove_with_companions(&partial);
        return Err(StoreError::Internal(format!(
            "{} is still beside the database: move it away and restore again",
            left.display()
        )));
    }
    let _ = std::fs::remove_file(shm_path(db));
    std::fs::rename(&partial, db).map_err(|e| StoreError::Internal(format!("cannot replace {}: {e}", db.display())))?;
    // Restored by root, the copy is root's: the service's user must be able to open it.
    give_to_owner_of(db, kept.as_deref().or(db.parent().filter(|d| !d.as_os_str().is_empty())));
    sync_parent(db);
    fault_stop("restore-in-place");
    let _ = std::fs::remove_file(&marker);
    sync_parent(db);
    let bytes = std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
    Ok((Copied { path: db.to_path_buf(), bytes, schema_version: version }, kept))
}

/// Removes `path` and what SQLite may have made beside it.
fn remove_with_companions(path: &Path) {
    let _ = std::fs::remove_file(path);
    for side in [wal_path(path), shm_path(path), journal_path(path)] {
        let _ = std::fs::remove_file(side);
    }
}

/// For the tests of an interrupted restore: the process dies at `point` when
/// `SITEGATE_FAULT_STOP` names it.
fn fault_stop(point: &str) {
    if std::env::var_os("SITEGATE_FAULT_STOP").is_some_and(|v| v == point) {
        std::process::abort();
    }
}

/// The file that says a restore of `db` is under way, and where the database it replaces goes.
fn restore_marker(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".restoring");
    PathBuf::from(p)
}

/// Where the database went (or was going) in a restore of `db` that began and did not finish
/// (its marker is there), or None.
fn restore_begun(db: &Path) -> Option<PathBuf> {
    let name = std::fs::read_to_string(restore_marker(db)).ok()?;
    let name = name.strip_suffix('\n').unwrap_or(&name);
    (!name.is_empty()).then(|| PathBuf::from(name))
}

/// Why `db` must not be opened: a restore of it was interrupted (its database may be half
/// moved aside); None when none was, or when it was cut off only after the restored copy was
/// in place (the database is there, and so is the one it replaced).
pub fn interrupted_restore(db: &Path) -> Option<String> {
    let kept = restore_begun(db)?;
    if db.exists() && kept.exists() {
        return None;
    }
    Some(format!(
        "a restore of {} was interrupted: run `sitegate restore --from BACKUP` again to finish it (the \
         database it replaces is kept as {}, with its log)",
        db.display(),
        kept.display()
    ))
}

/// Removes what a restore of `db` interrupted while it copied left (its partial copy), when
/// none is under way (the service holds the database's lock).
pub fn remove_partial_restore(db: &Path) {
    let partial = partial_path(db);
    if partial.exists() && !restore_marker(db).exists() {
        log::warn!("removed {}, the copy of a restore that was interrupted", partial.display());
        remove_with_companions(&partial);
    }
    // A restore cut off after the restored copy was in place left only its marker.
    if restore_marker(db).exists() && interrupted_restore(db).is_none() {
        let _ = std::fs::remove_file(restore_marker(db));
    }
}

/// Writes `bytes` to `path` whole or not at all: beside it first (mode 0600 when `private`),
/// synced, then renamed over it, with its folder entry made durable.
pub fn write_whole(path: &Path, bytes: &[u8], private: bool) -> std::io::Result<()> {
    let partial = partial_path(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    let mut f = options.open(&partial)?;
    std::io::Write::write_all(&mut f, bytes)?;
    f.sync_all()?;
    std::fs::rename(&partial, path)?;
    sync_parent(path);
    Ok(())
}

/// Writes the restore marker `file`, naming `path`.
fn write_marker(file: &Path, path: &Path) -> Result<()> {
    write_whole(file, format!("{}\n", path.display()).as_bytes(), true)
        .map_err(|e| StoreError::Internal(format!("cannot write {}: {e}", file.display())))
}

/// `kept`, or `kept-2`, `kept-3`, ... where that name is taken.
fn free_kept_name(kept: &Path) -> Result<PathBuf> {
    (1..=crate::limits::KEPT_DATABASE_NAMES_MAX)
        .map(|n| {
            if n == 1 {
                kept.to_path_buf()
            } else {
                let mut name = kept.as_os_str().to_owned();
                name.push(format!("-{n}"));
                PathBuf::from(name)
            }
        })
        .find(|p| !p.exists() && !wal_path(p).exists() && !journal_path(p).exists())
        .ok_or_else(|| StoreError::Internal(format!("{} and the names after it are taken", kept.display())))
}

/// Renames the database at `db`, with its write-ahead log or rollback journal, to `free`:
/// the files as they were, which SQLite opens together again.
fn keep_current(db: &Path, free: &Path) -> Result<PathBuf> {
    if free.exists() {
        return Err(StoreError::Internal(format!("{} exists: it is not replaced", free.display())));
    }
    for (side, to) in [(wal_path(db), wal_path(free)), (journal_path(db), journal_path(free))] {
        if side.exists() && to.exists() {
            return Err(StoreError::Internal(format!("{} exists: it is not replaced", to.display())));
        }
        if side.exists() {
            std::fs::rename(&side, to)
                .map_err(|e| StoreError::Internal(format!("cannot keep {}: {e}", side.display())))?;
        }
    }
    fault_stop("restore-log-kept");
    if db.exists() {
        std::fs::rename(db, free).map_err(|e| StoreError::Internal(format!("cannot keep {}: {e}", db.display())))?;
    }
    Ok(free.to_path_buf())
}

/// Rewrites the database at `db` without the free space purges left in it (SQLite's VACUUM),
/// so that the file gives that space back to the disk (the service must be stopped). Needs
/// room for two more copies while it runs (VACUUM's in the temporary folder, and the
/// database written again into the log). Returns the bytes of the file and its log before
/// and after.
pub fn compact(db: &Path) -> Result<(u64, u64)> {
    let size = || {
        [db.to_path_buf(), wal_path(db)].iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum::<u64>()
    };
    let before = size();
    let version = check_file(db)?;
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| StoreError::Internal(format!("cannot open {}: {e}", db.display())))?;
    conn.busy_timeout(Duration::from_millis(crate::limits::STORE_BUSY_TIMEOUT_MS))?;
    conn.execute_batch("VACUUM")?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    drop(conn);
    let after_version = check_file(db)?;
    if after_version != version {
        return Err(StoreError::Internal(format!("schema version {version} became {after_version}")));
    }
    Ok((before, size()))
}

/// Checks that a file is an intact sitegate database this version can open; returns its
/// schema version.
pub fn check_file(path: &Path) -> Result<i64> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| StoreError::Unusable(format!("cannot open {}: {e}{}", path.display(), access_hint(path))))?;
    let bad =
        |what: String| StoreError::Unusable(format!("{} is not a usable sitegate database: {what}", path.display()));
    // A full disk is not a bad database (reading a WAL database may need room for its index).
    let integrity: String =
        conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).map_err(|e| match StoreError::from(e) {
            full @ StoreError::StorageFull(_) => full,
            e => bad(e.to_string()),
        })?;
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
    remove_unfinished_backups(db);
    let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    // Never over an earlier one: a gateway without a set clock starts at the same time again.
    let out = (1..=crate::limits::KEPT_DATABASE_NAMES_MAX)
        .map(|n| {
            let mut name = db.as_os_str().to_owned();
            match n {
                1 => name.push(format!(".schema{version}-{stamp}.bak")),
                n => name.push(format!(".schema{version}-{stamp}-{n}.bak")),
            }
            PathBuf::from(name)
        })
        .find(|p| !p.exists())
        .ok_or_else(|| {
            StoreError::Internal(format!("{}: the names of backups before migration are taken", db.display()))
        })?;
    backup_connection(conn, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: i64 = 86_400_000;

    /// A wall clock stepped 40 days ahead, at a start or while the service runs: the purges'
    /// clock moves an hour past the stored time at a start, and from one purge to the next no
    /// more than 24 times the time that passed; a clock set back leaves it where it was.
    #[test]
    fn a_purge_clock_is_not_moved_far_by_a_wall_clock_set_ahead() {
        let (dir, store) = super::super::testing::store_with_org("purge_clock", "o");
        let t = 1_800_000_000_000;
        let mut clock = PurgeClock::new("test");
        assert_eq!(clock.now_ms(&store, t).unwrap(), t, "nothing stored: the wall clock");
        // Purges as the clock runs (it follows), then one with the clock stepped: what it may
        // move is counted from the last purge, not from the first of the run.
        let started = Instant::now();
        let mut last = t;
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(250));
            let wall = t + i64::try_from(started.elapsed().as_millis()).unwrap();
            last = clock.now_ms(&store, wall).unwrap();
            assert_eq!(last, wall);
        }
        let stepped = clock.now_ms(&store, t + 40 * DAY_MS).unwrap();
        // (From the first: 24 s and more.)
        assert!(stepped - last < 10_000, "moved {} ms", stepped - last);
        // Set back: not before the time it purged by.
        assert_eq!(clock.now_ms(&store, t - DAY_MS).unwrap(), stepped);
        // A start with the clock ahead: an hour past what was stored.
        let mut restarted = PurgeClock::new("test");
        let at_start = restarted.now_ms(&store, t + 40 * DAY_MS).unwrap();
        assert_eq!(at_start, stepped + crate::limits::PURGE_CLOCK_LEAD_MS);
        // Another purge's clock is its own.
        assert_eq!(PurgeClock::new("other").now_ms(&store, t + DAY_MS).unwrap(), t + DAY_MS);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
