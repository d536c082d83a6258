//! The store: the only module that touches SQLite.
//!
//! One SQLite file in WAL mode. Writes go through one writer connection (a mutex orders them
//! inside the process; `busy_timeout` orders them against CLI commands writing at the same
//! time). Reads use pooled connections and never wait for the writer. `synchronous = FULL`: a
//! commit is on disk (WAL fsynced) before the API answers 2xx, so an acknowledged write
//! survives kill -9 and power loss.
//!
//! Group commit: each write runs in a savepoint of the writer's open `BEGIN IMMEDIATE`
//! transaction; the write that finds no other write waiting (or the batch full or old, see
//! `limits`) commits the batch, and every write of it returns once that commit is on disk.
//! A write that fails rolls back to its savepoint alone; a commit that fails fails every write
//! of its batch (none was acknowledged).
//!
//! Callers see domain types and [`StoreError`], never rusqlite types.

mod activities;
mod alerts;
mod budget;
mod hooks;
mod location;
mod maintenance;
mod mqtt;
mod principals;
mod quota;
mod records;
mod reports;
mod schema;
#[cfg(test)]
pub(crate) mod testing;

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::limits;
use crate::model::FieldValues;

pub use activities::{ActivityChanges, NewActivity, Place};
pub use alerts::{AlertOrder, NewAlert, StoredAlert};
pub use budget::{ReadStop, ReplyBudget, charge as charge_reply, take_charged};
pub use hooks::{Attempt, Content, DeliveryInfo, Hook, HookSettings, Notification, Outbox, Outgoing, Render};
pub use location::{ContactLocations, LocationBatch, LocationEvent, Placement, StoredDevice, Visit, VisitFilter};
pub use maintenance::{
    PurgeClock, access_hint, backup, compact, give_to_owner_of, interrupted_restore, remove_partial_restore, restore,
    write_whole,
};
pub use mqtt::{MqttUser, Queued};
pub use principals::NewUser;
pub use records::{
    ActivityRow, CategoryRef, Filter, ListEntry, ListQuery, NewRecord, RecordChanges, RecordDetail, RecordRow,
    RelatedItem, Search, SearchMode, SortField,
};
pub use reports::{Assignee, Billing, DateCondition, ReportOrder, ReportQuery, ReportRow, Stamp};

/// What went wrong in the store, in terms a caller can act on.
#[derive(Clone, Debug)]
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
    /// A bounded collection is full (webhooks of an organisation, devices of the site).
    LimitReached(String),
    /// Another process held the write lock for longer than the busy timeout.
    Busy,
    /// The disk is full: nothing was written.
    StorageFull(String),
    /// The database's path no longer names the open database file (its folder was removed or
    /// renamed): nothing is written, since after a restart it would be gone.
    Moved(String),
    /// The answer would read more than its budget of bytes of records and activities (the
    /// budget, in bytes): nothing more was read.
    TooLarge(usize),
    /// The request's reads stopped (why): it ran too long, or its client has gone.
    Stopped(String),
    /// The database file cannot be used as it is: another program's, of a newer schema (or,
    /// for a command, an older one), damaged, or not this user's to open. Trying again does
    /// not help; the message says what would.
    Unusable(String),
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
            | StoreError::Duplicate(m)
            | StoreError::LimitReached(m) => {
                write!(f, "{m}")
            }
            StoreError::Busy => write!(f, "the database is busy"),
            StoreError::StorageFull(m) => write!(f, "the disk is full: {m}"),
            StoreError::Moved(m) => write!(f, "{m}"),
            StoreError::TooLarge(limit) => write!(f, "the answer would hold more than {limit} bytes of records"),
            StoreError::Stopped(why) => write!(f, "the request's reads stopped: {why}"),
            StoreError::Internal(m) | StoreError::Unusable(m) => write!(f, "database error: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl StoreError {
    /// A condition the store logs itself, once when it begins and once when it ends (a full
    /// disk, a database file moved away): loops that retry writes need not log each failure.
    pub fn logged_once(&self) -> bool {
        matches!(self, StoreError::StorageFull(_) | StoreError::Moved(_))
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> StoreError {
        // A row reader stopped by the answer's budget (budget::charge_row).
        if let rusqlite::Error::UserFunctionError(e) = &err
            && let Some(StoreError::TooLarge(limit)) = e.downcast_ref::<StoreError>()
        {
            return StoreError::TooLarge(*limit);
        }
        match err.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy,
            // The read connections' progress handler (budget::read_should_stop).
            Some(ErrorCode::OperationInterrupted) => budget::stopped(),
            Some(ErrorCode::DiskFull) => StoreError::StorageFull(err.to_string()),
            // The WAL index (`-shm`) could not be grown: on a full disk, that is how SQLite
            // says so when it opens or reads.
            Some(ErrorCode::SystemIoFailure) if matches!(&err, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE) => {
                StoreError::StorageFull(err.to_string())
            }
            _ => StoreError::Internal(err.to_string()),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The writer connection and the batch of writes open on it.
struct Writer {
    conn: Connection,
    open: Option<Batch>,
    next_batch: u64,
}

/// Writes run in one open transaction, not yet committed.
struct Batch {
    id: u64,
    writes: usize,
    opened: Instant,
    /// Writes of the batch waiting for its commit (other writes' threads).
    waiting: usize,
}

/// How batches ended, for the writes that wait on them.
struct Commits {
    /// The last batch that ended (committed or failed); batches end in id order.
    done: u64,
    /// Batches whose commit failed while writes waited on them: the batch, how many of those
    /// writes have yet to learn it, the error. Each goes once the last has: at most one entry
    /// per waiting write, and none forgotten while a write would take its absence for success.
    failed: Vec<(u64, usize, StoreError)>,
}

pub struct Store {
    path: PathBuf,
    writer: Mutex<Writer>,
    /// Threads waiting for the writer: while there are any, a finished write leaves its
    /// batch open for them.
    writers_waiting: AtomicUsize,
    commits: Mutex<Commits>,
    committed: Condvar,
    /// Writes of users, groups and memberships this process ended: see
    /// [`Store::local_credential_writes`].
    local_credential_writes: AtomicU64,
    /// Changes of hooks' settings and deletions made by this process (`Store::hook_changes`).
    hook_changes: AtomicU64,
    /// A connection for one-number queries outside a transaction ([`Store::data_version`],
    /// [`Store::credentials_version`], [`Store::devices_version`]).
    watcher: Mutex<Option<Connection>>,
    readers: Mutex<Vec<Connection>>,
    /// "Viewed" stamps not yet written: item id -> Unix seconds.
    /// foldhash rather than SipHash: two lookups per show, keys are ids, bounded.
    viewed_pending: Mutex<foldhash::HashMap<i64, i64>>,
    viewed_dropped: AtomicU64,
    /// Set at service start: changes then write webhook deliveries.
    outbox: std::sync::OnceLock<hooks::Outbox>,
    /// Unix seconds of the first write that failed for a full disk since the last that
    /// succeeded; 0 while writes succeed.
    full_since: std::sync::atomic::AtomicI64,
    /// The database file's device and inode when opened (see [`Store::moved`]).
    file_id: Option<(u64, u64)>,
    /// The move was logged (once, and once more when it is back).
    moved_said: AtomicBool,
}

impl Store {
    /// Opens (creating if needed) the database and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Store> {
        Store::open_with(path, true)
    }

    /// As [`Store::open`], for the commands other than `serve`: a database of an earlier
    /// schema is refused rather than migrated (the service of the earlier version may be
    /// running on it; the new version's first start migrates it, with a backup).
    pub fn open_current(path: &Path) -> Result<Store> {
        Store::open_with(path, false)
    }

    fn open_with(path: &Path, migrate_existing: bool) -> Result<Store> {
        if let Some(why) = maintenance::interrupted_restore(path) {
            return Err(StoreError::Unusable(why));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Internal(format!("cannot create {}: {e}", dir.display())))?;
        }
        let new = !path.exists();
        let writer = Connection::open(path).map_err(|e| {
            StoreError::Unusable(format!("cannot open {}: {e}{}", path.display(), maintenance::access_hint(path)))
        })?;
        // A damaged or foreign file fails here: the message names it.
        let named = |e: StoreError| match e {
            StoreError::Internal(m) if !m.contains(&*path.to_string_lossy()) => {
                StoreError::Internal(format!("{}: {m}", path.display()))
            }
            other => other,
        };
        // Looked at before anything is written (the switch to WAL rewrites the header).
        writer.busy_timeout(Duration::from_millis(limits::STORE_BUSY_TIMEOUT_MS))?;
        let version: i64 = writer.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| {
            match StoreError::from(e) {
                // Not a database, or not this user's to read: the same file fails the same way.
                StoreError::Internal(m) => {
                    StoreError::Unusable(format!("{}: {m}{}", path.display(), maintenance::access_hint(path)))
                }
                other => other,
            }
        })?;
        let known = schema::MIGRATIONS.len() as i64;
        if version > known {
            // Refused before anything is written to it (the switch to WAL below would be).
            return Err(StoreError::Unusable(format!(
                "{} has schema version {version}, newer than this sitegate knows ({known}); run the newer \
                 sitegate or restore a backup",
                path.display()
            )));
        }
        if version == 0 {
            // A new database (or an empty file): sitegate's, readable by the service only. A
            // file with tables of its own is some other program's: left as it is.
            let objects: i64 = writer
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(|e| named(e.into()))?;
            if objects > 0 {
                return Err(StoreError::Unusable(format!(
                    "{} is an SQLite database of something else (it has {objects} tables and other objects, and no \
                     sitegate schema): left as it is; set [store] path to a new file, or restore a sitegate backup",
                    path.display()
                )));
            }
            restrict_permissions(path);
            if new {
                // Made by root (a command run before the first start): the service's user,
                // who owns the folder, must be able to open it.
                maintenance::give_to_owner_of(path, path.parent().filter(|d| !d.as_os_str().is_empty()));
            }
        } else if !migrate_existing && version < known {
            // Not for good: the service's next start migrates it.
            return Err(StoreError::Internal(format!(
                "{} has schema version {version}, older than this sitegate's ({}): start the service of this \
                 version (`sitegate serve`, or restart the unit) to migrate it first; commands do not migrate, \
                 since the earlier version's service may be running on it",
                path.display(),
                schema::MIGRATIONS.len()
            )));
        }
        if version > 0 {
            // Made readable to others by an earlier version or by hand: the database holds
            // tokens' hashes and where people were.
            restrict_existing_permissions(path);
        }
        configure(&writer, true).map_err(named)?;
        migrate(&writer, path, schema::MIGRATIONS).map_err(named)?;
        let file_id = std::fs::metadata(path).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        });
        Ok(Store {
            file_id,
            moved_said: AtomicBool::new(false),
            path: path.to_path_buf(),
            writer: Mutex::new(Writer { conn: writer, open: None, next_batch: 1 }),
            writers_waiting: AtomicUsize::new(0),
            commits: Mutex::new(Commits { done: 0, failed: Vec::new() }),
            committed: Condvar::new(),
            local_credential_writes: AtomicU64::new(0),
            hook_changes: AtomicU64::new(0),
            watcher: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            viewed_pending: Mutex::new(foldhash::HashMap::default()),
            viewed_dropped: AtomicU64::new(0),
            outbox: std::sync::OnceLock::new(),
            full_since: std::sync::atomic::AtomicI64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a read connection inside one read transaction (a consistent snapshot).
    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.reader()?;
        exec_cached(&conn, "BEGIN")?;
        let out = catch_unwind(AssertUnwindSafe(|| f(&conn)));
        // A read transaction has nothing to commit; ending it releases the snapshot. A
        // connection whose transaction could not be ended is not used again.
        if exec_cached(&conn, "ROLLBACK").is_ok() {
            self.give_back(conn);
        }
        out.unwrap_or_else(|panic| resume_unwind(panic))
    }

    /// Runs `f`, which runs one statement, on a read connection without a transaction around
    /// it: one statement is its own snapshot, and a BEGIN and ROLLBACK cost about what a point
    /// query does.
    fn read_one_statement<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.reader()?;
        let out = catch_unwind(AssertUnwindSafe(|| f(&conn)));
        // A connection left inside a transaction (had `f` begun one) is not used again.
        if conn.is_autocommit() {
            self.give_back(conn);
        }
        out.unwrap_or_else(|panic| resume_unwind(panic))
    }

    /// An idle read connection, or a new one.
    fn reader(&self) -> Result<Connection> {
        let pooled = self.readers.lock().unwrap_or_else(PoisonError::into_inner).pop();
        match pooled {
            Some(c) => Ok(c),
            None => {
                let c = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                configure(&c, false)?;
                let mut c = c;
                c.progress_handler(limits::STORE_PROGRESS_OPS, Some(budget::read_should_stop))?;
                Ok(c)
            }
        }
    }

    /// Returns a read connection to the pool (within its bound).
    fn give_back(&self, conn: Connection) {
        let mut pool = self.readers.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < limits::STORE_READERS_IDLE_MAX {
            pool.push(conn);
        }
    }

    /// A number that changes whenever a transaction commits to the database, from this process
    /// or another one (a CLI command): what was read before it changed may be stale. Cheap
    /// (no transaction); for caches of what rarely changes.
    pub fn data_version(&self) -> Result<i64> {
        self.watch("PRAGMA data_version")
    }

    /// A number that changes whenever a commit of this process or another one (a CLI command)
    /// changed users, groups or memberships (schema 8's triggers keep it). One row read
    /// outside a transaction.
    pub fn credentials_version(&self) -> Result<i64> {
        self.watch("SELECT version FROM credentials_version WHERE id = 1")
    }

    /// Runs a one-number query on the watcher connection, opened on first use and again after
    /// an error.
    fn watch(&self, sql: &str) -> Result<i64> {
        let mut watcher = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if watcher.is_none() {
            let c = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            configure(&c, false)?;
            *watcher = Some(c);
        }
        let conn = watcher.as_ref().ok_or_else(|| StoreError::Internal("no watcher connection".into()))?;
        let value = conn.prepare_cached(sql)?.query_row([], |r| r.get(0));
        if value.is_err() {
            *watcher = None;
        }
        Ok(value?)
    }

    /// A number that changes whenever this process has written users, groups or memberships,
    /// by the time the write returns. An atomic read: unlike [`Store::credentials_version`] it
    /// does not see other processes' writes.
    pub fn local_credential_writes(&self) -> u64 {
        self.local_credential_writes.load(Ordering::Acquire)
    }

    /// Runs `f` as one write on the writer, all or nothing, and returns once it is committed
    /// (group commit: see the module documentation).
    /// Why the database's path no longer names the open file, if it does not: it (or its
    /// folder) was deleted or renamed while the service runs. Writes would then go where a
    /// restart no longer looks, so they are refused until it is back.
    pub fn moved(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let (dev, ino) = self.file_id?;
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == (dev, ino) => None,
            Ok(_) => Some(format!("{} is no longer the database file this service opened", self.path.display())),
            Err(e) => Some(format!("the database file {} is gone ({e})", self.path.display())),
        }
    }

    fn write<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        match self.moved() {
            Some(why) => {
                if !self.moved_said.swap(true, Ordering::SeqCst) {
                    log::error!("database: {why}: writes are refused until it is back");
                }
                return Err(StoreError::Moved(why));
            }
            None => {
                if self.moved_said.swap(false, Ordering::SeqCst) {
                    log::info!("database: {} is in place again; writes go on", self.path.display());
                }
            }
        }
        let result = self.write_batched(f);
        match &result {
            Err(StoreError::StorageFull(m)) => {
                let now = crate::timefmt::now_secs();
                if self.full_since.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    log::error!("database: the disk is full; writes fail until there is room ({m})");
                }
            }
            Ok(_) => {
                if self.full_since.swap(0, Ordering::SeqCst) != 0 {
                    log::info!("database: writes succeed again");
                }
            }
            Err(_) => {}
        }
        result
    }

    /// Since when (Unix seconds) writes fail for a full disk, if they do.
    pub fn full_since(&self) -> Option<i64> {
        Some(self.full_since.load(Ordering::SeqCst)).filter(|t| *t != 0)
    }

    fn write_batched<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let mut w = self.lock_writer();
        let batch = match &w.open {
            Some(b) => b.id,
            None => {
                exec_cached(&w.conn, "BEGIN IMMEDIATE")?;
                let id = w.next_batch;
                w.next_batch += 1;
                w.open = Some(Batch { id, writes: 0, opened: Instant::now(), waiting: 0 });
                id
            }
        };
        let outcome = match exec_cached(&w.conn, "SAVEPOINT write") {
            Ok(()) => {
                let outcome = {
                    let _uncharged = budget::ReplyBudget::suspend();
                    catch_unwind(AssertUnwindSafe(|| f(&w.conn)))
                };
                let ended = if matches!(outcome, Ok(Ok(_))) {
                    exec_cached(&w.conn, "RELEASE write")
                } else {
                    exec_cached(&w.conn, "ROLLBACK TO write").and_then(|()| exec_cached(&w.conn, "RELEASE write"))
                };
                match (ended, outcome) {
                    (Ok(()), outcome) => outcome,
                    // The write failed and took its savepoint with it (SQLite rolled the whole
                    // transaction back on a full disk): its own error says why.
                    (Err(_), Ok(Err(e))) => Ok(Err(e)),
                    (Err(_), Err(panic)) => Err(panic),
                    (Err(e), Ok(Ok(_))) => Ok(Err(e.into())),
                }
            }
            Err(e) => Ok(Err(e.into())),
        };
        if w.conn.is_autocommit() {
            // SQLite rolled the whole transaction back (an I/O error, a full disk): the batch
            // is lost, and with it every write before this one.
            let lost = match &outcome {
                Ok(Err(e @ StoreError::StorageFull(_))) => e.clone(),
                _ => StoreError::Internal("the write transaction was rolled back".into()),
            };
            let _ = self.end_batch(&mut w, Err(lost.clone()));
            drop(w);
            return match outcome {
                Ok(Ok(_)) => Err(lost),
                Ok(Err(e)) => Err(e),
                Err(panic) => resume_unwind(panic),
            };
        }
        let commit_now = match &mut w.open {
            Some(b) => {
                b.writes += 1;
                self.writers_waiting.load(Ordering::SeqCst) == 0
                    || b.writes >= limits::STORE_BATCH_WRITES_MAX
                    || b.opened.elapsed() >= Duration::from_millis(limits::STORE_BATCH_OPEN_MS_MAX)
            }
            None => true,
        };
        let committed = if commit_now {
            let result = exec_cached(&w.conn, "COMMIT").map_err(StoreError::from);
            let result = self.end_batch(&mut w, result);
            drop(w);
            result
        } else {
            // A write that failed has nothing in the batch to wait for.
            let wait = matches!(outcome, Ok(Ok(_)));
            if let (true, Some(b)) = (wait, &mut w.open) {
                b.waiting += 1;
            }
            drop(w);
            if wait { self.wait_for(batch) } else { Ok(()) }
        };
        match outcome {
            Ok(Ok(out)) => committed.map(|()| out),
            Ok(Err(e)) => Err(e),
            Err(panic) => resume_unwind(panic),
        }
    }

    /// The writer, counted as waiting while it waits. A batch may be open on it: the caller
    /// continues it or ends it.
    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        self.writers_waiting.fetch_add(1, Ordering::SeqCst);
        let w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.writers_waiting.fetch_sub(1, Ordering::SeqCst);
        w
    }

    /// Commits the open batch, if any (before work on the writer outside a write).
    fn commit_open(&self, w: &mut Writer) -> Result<()> {
        if w.open.is_none() {
            return Ok(());
        }
        let result = exec_cached(&w.conn, "COMMIT").map_err(StoreError::from);
        self.end_batch(w, result)
    }

    /// Ends the open batch with the result of its commit and tells the writes waiting on it.
    fn end_batch(&self, w: &mut Writer, result: Result<()>) -> Result<()> {
        let Some(batch) = w.open.take() else { return result };
        if result.is_err() && !w.conn.is_autocommit() {
            let _ = exec_cached(&w.conn, "ROLLBACK");
        }
        let mut commits = self.commits.lock().unwrap_or_else(PoisonError::into_inner);
        commits.done = batch.id;
        if let (Err(e), 1..) = (&result, batch.waiting) {
            commits.failed.push((batch.id, batch.waiting, e.clone()));
        }
        drop(commits);
        self.committed.notify_all();
        result
    }

    /// Waits until `batch` has ended; its commit's result.
    fn wait_for(&self, batch: u64) -> Result<()> {
        let mut commits = self.commits.lock().unwrap_or_else(PoisonError::into_inner);
        while commits.done < batch {
            commits = self.committed.wait(commits).unwrap_or_else(PoisonError::into_inner);
        }
        let Some(at) = commits.failed.iter().position(|(id, _, _)| *id == batch) else { return Ok(()) };
        let entry = &mut commits.failed[at];
        entry.1 -= 1;
        let e = if entry.1 == 0 { commits.failed.swap_remove(at).2 } else { entry.2.clone() };
        Err(match e {
            // What the caller can act on (503 and come back) stays itself.
            e @ (StoreError::StorageFull(_) | StoreError::Busy | StoreError::Moved(_)) => e,
            e => StoreError::Internal(format!("commit failed: {e}")),
        })
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

/// Runs one statement without results from the connection's statement cache (a transaction's
/// BEGIN and COMMIT are run on every request: parsing them each time was measurable).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn configure(conn: &Connection, writer: bool) -> Result<()> {
    conn.busy_timeout(Duration::from_millis(limits::STORE_BUSY_TIMEOUT_MS))?;
    if writer {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Internal(format!("cannot switch to WAL (journal_mode is {mode})")));
        }
        // A large write (an upload) or a long read (a backup) grows the log; once it is
        // checkpointed, the next write cuts it back to this size instead of keeping the most
        // it ever held.
        conn.execute_batch(&format!("PRAGMA journal_size_limit = {}", limits::STORE_WAL_BYTES_KEPT_MAX))?;
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
/// `search` column is; `sg_field_key(text)` is `field_key`.
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
        "sg_field_key",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let text: Option<String> = ctx.get(0)?;
            Ok(text.map(|t| field_key(&t)))
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
        return Err(StoreError::Unusable(format!(
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
                // Each migration is all or nothing: say where the database stands, keeping what
                // kind of failure it was (a full disk is the operator's to clear).
                let stands = format!(
                    "migration to schema {} failed, the database is intact at schema {i} and the next start goes on from there",
                    i + 1
                );
                match StoreError::from(e) {
                    StoreError::StorageFull(m) => StoreError::StorageFull(format!("{m} ({stands})")),
                    other => StoreError::Internal(format!("{stands}: {other}")),
                }
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

/// The database and its write-ahead log and index as the service's own (mode 0600), where they
/// are readable or writable by others; said once in the log.
#[cfg(unix)]
fn restrict_existing_permissions(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = std::path::PathBuf::from(file);
        let Ok(meta) = std::fs::metadata(&file) else { continue };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 == 0 {
            continue;
        }
        match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode & 0o700)) {
            Ok(()) => log::info!("{} was mode {mode:o}: now readable by its owner only", file.display()),
            // Not this user's file (a command run by another user): the service's start does it.
            Err(e) => log::debug!("cannot restrict permissions of {}: {e}", file.display()),
        }
    }
}

#[cfg(not(unix))]
fn restrict_existing_permissions(_path: &Path) {}

/// Field values as stored: a JSON object of text.
fn fields_json(fields: &FieldValues) -> String {
    serde_json::to_string(fields).unwrap_or_else(|_| "{}".into())
}

fn parse_fields(text: &str) -> FieldValues {
    serde_json::from_str(text).unwrap_or_default()
}

/// The fields of a row read for an answer, charged to its budget ([`budget`]).
fn answer_fields(text: &str) -> rusqlite::Result<FieldValues> {
    budget::charge_row(text.len())?;
    Ok(parse_fields(text))
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

/// Characters of a value that `field_values` keeps: a "starts with" search for up to this many
/// characters is answered by that index alone; a longer one also reads the record's value.
const FIELD_KEY_CHARS: usize = 64;

/// A value as `field_values` holds it: lower-cased, its first `FIELD_KEY_CHARS` characters.
fn field_key(value: &str) -> String {
    value.to_lowercase().chars().take(FIELD_KEY_CHARS).collect()
}

/// Keeps `field_values` in step with a record's fields, from `old` to `new` (both empty-free
/// maps; a record being created has no old values), for the fields in `indexed_fields`.
fn index_fields(tx: &Connection, item: i64, old: &FieldValues, new: &FieldValues) -> Result<()> {
    let indexed: Vec<String> = tx
        .prepare_cached("SELECT field FROM indexed_fields")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if indexed.is_empty() {
        return Ok(());
    }
    let old: FieldValues =
        old.iter().filter(|(f, _)| indexed.contains(f)).map(|(f, v)| (f.clone(), v.clone())).collect();
    let new: FieldValues =
        new.iter().filter(|(f, _)| indexed.contains(f)).map(|(f, v)| (f.clone(), v.clone())).collect();
    for (field, value) in &old {
        let before = field_key(value);
        if new.get(field).map(|v| field_key(v)).as_ref() != Some(&before) {
            tx.exec("DELETE FROM field_values WHERE field = ?1 AND value = ?2 AND item = ?3", (field, &before, item))?;
        }
    }
    for (field, value) in &new {
        let after = field_key(value);
        if !after.is_empty() && old.get(field).map(|v| field_key(v)).as_ref() != Some(&after) {
            tx.exec(
                "INSERT OR IGNORE INTO field_values (field, value, item) VALUES (?1, ?2, ?3)",
                (field, &after, item),
            )?;
        }
    }
    Ok(())
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

    /// A write waiting on a batch whose commit failed learns it, however many batches fail
    /// after (on a full disk every one does, within microseconds) before it wakes: it must
    /// never take a failure it missed for success.
    #[test]
    fn a_write_waiting_on_a_failed_commit_learns_it_however_many_fail_after() {
        let dir = std::env::temp_dir().join(format!("sitegate-commit-failures-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir.join("site.db")).unwrap();
        let full = || Err(StoreError::StorageFull("no room".into()));
        let mut w = store.lock_writer();
        for id in 1..200u64 {
            w.open = Some(Batch { id, writes: 2, opened: Instant::now(), waiting: 1 });
            let _ = store.end_batch(&mut w, if id % 2 == 1 { full() } else { Ok(()) });
        }
        drop(w);
        for id in 1..200u64 {
            match store.wait_for(id) {
                Err(StoreError::StorageFull(_)) => assert!(id % 2 == 1, "batch {id} committed"),
                Ok(()) => assert!(id % 2 == 0, "batch {id} failed"),
                Err(e) => panic!("batch {id}: {e}"),
            }
        }
        assert!(store.commits.lock().unwrap().failed.is_empty(), "each failure goes with its last waiter");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A database at schema 1 in a new temporary folder: the folder, the file, the writer.
    fn at_first_schema(name: &str) -> (PathBuf, PathBuf, Connection) {
        let dir = std::env::temp_dir().join(format!("sitegate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("site.db");
        let conn = Connection::open(&path).unwrap();
        configure(&conn, true).unwrap();
        migrate(&conn, &path, &schema::MIGRATIONS[..1]).unwrap();
        (dir, path, conn)
    }

    #[test]
    fn an_existing_database_is_backed_up_before_a_migration() {
        let (dir, path, conn) = at_first_schema("migrate");
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

    /// Two backups before migration within one second (a gateway whose clock starts at the
    /// same time at every boot) are two files: the second never replaces the first.
    #[test]
    fn backups_before_migration_never_replace_each_other() {
        let (dir, path, conn) = at_first_schema("migrate-names");
        let first = maintenance::backup_before_migration(&conn, &path, 1).unwrap();
        let second = maintenance::backup_before_migration(&conn, &path, 1).unwrap();
        assert_ne!(first, second);
        assert!(first.exists() && second.exists());
        assert!(second.to_string_lossy().ends_with(".bak"), "{second:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A migration that runs out of room (the page limit stands in for a full disk) leaves the
    /// database at the schema before it, says so, and stays a full-disk error; the next run
    /// with room goes on from there.
    #[test]
    fn a_migration_out_of_room_says_where_the_database_stands() {
        let (dir, path, conn) = at_first_schema("migrate-full");
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        let _: i64 = conn.query_row(&format!("PRAGMA max_page_count = {}", pages + 2), [], |r| r.get(0)).unwrap();
        let grow = "CREATE TABLE later (x BLOB); \
                    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) \
                    INSERT INTO later SELECT zeroblob(4096) FROM n;";
        let next = [schema::MIGRATIONS[0], "CREATE TABLE fits (x INTEGER);", grow];
        let err = migrate(&conn, &path, &next).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, StoreError::StorageFull(_)), "{err:?}");
        assert!(text.contains("intact at schema 2"), "{text}");
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 2);

        let _: i64 = conn.query_row("PRAGMA max_page_count = 1073741823", [], |r| r.get(0)).unwrap();
        migrate(&conn, &path, &next).unwrap();
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A field is indexed when it is first searched, from the records already there (keyed as
    /// writes key them; activities left out); from then on writes keep it, and only it, up.
    #[test]
    fn a_field_is_indexed_from_its_first_search() {
        let dir = std::env::temp_dir().join(format!("sitegate-field-index-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir.join("site.db")).unwrap();
        let long = format!("Ä{}", "x".repeat(80));
        let mut fields = FieldValues::new();
        fields.insert("lastname".into(), "Ünal".into());
        fields.insert("jobtitle".into(), long.clone());
        let rows = |store: &Store| -> Vec<(String, String, i64)> {
            store
                .read(|tx| {
                    let mut stmt = tx.prepare("SELECT field, value, item FROM field_values ORDER BY field, item")?;
                    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                    Ok(rows.collect::<rusqlite::Result<_>>()?)
                })
                .unwrap()
        };
        store
            .write(|tx| {
                tx.execute_batch(
                    "INSERT INTO organizations (id, name) VALUES ('o', 'O');
                     INSERT INTO principals (org, kind, name, created) VALUES ('o', 1, 'A', 0);",
                )?;
                let insert = "INSERT INTO items (org, typeid, parent, ownership, name, fields, created, updated, creator, modificator)
                              VALUES ('o', 1, ?1, 1, 'x', ?2, 0, 0, 1, 1)";
                tx.execute(insert, (None::<i64>, fields_json(&fields)))?;
                // An activity's fields are not indexed.
                tx.execute(insert, (Some(1i64), r#"{"jobtitle": "note"}"#))?;
                index_fields(tx, 1, &FieldValues::new(), &fields)?;
                Ok(())
            })
            .unwrap();
        assert_eq!(rows(&store), vec![], "nothing is indexed before a search");
        store.index_field("jobtitle").unwrap();
        store.index_field("jobtitle").unwrap();
        assert_eq!(rows(&store), vec![("jobtitle".into(), field_key(&long), 1)]);
        assert_eq!(field_key(&long).chars().count(), FIELD_KEY_CHARS);
        assert!(field_key(&long).starts_with('ä'));
        // Writes keep the indexed field up, and only it.
        let mut changed = fields.clone();
        changed.insert("jobtitle".into(), "Manager".into());
        changed.insert("lastname".into(), "Lee".into());
        store.write(|tx| index_fields(tx, 1, &fields, &changed)).unwrap();
        assert_eq!(rows(&store), vec![("jobtitle".into(), "manager".into(), 1)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Organisations the configuration no longer names are found, with their users who can
    /// still log in.
    #[test]
    fn organizations_left_out_of_the_configuration_are_named() {
        use crate::config::Organization;
        let dir = std::env::temp_dir().join(format!("sitegate-orgs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir.join("site.db")).unwrap();
        let org = |id: &str| Organization { id: id.into(), name: id.to_uppercase() };
        store.sync_organizations(&[org("a"), org("b")]).unwrap();
        for (email, org) in [("x@a.test", "a"), ("y@b.test", "b"), ("z@b.test", "b")] {
            let user = NewUser {
                org,
                email,
                name: email,
                admin: false,
                prevent_private: false,
                groups: &[],
                token_sha256: &[0; 32],
            };
            store.create_user(&user).unwrap();
        }
        assert_eq!(store.organizations_left_out(&[org("a"), org("b")]).unwrap(), vec![]);
        assert_eq!(store.organizations_left_out(&[org("a")]).unwrap(), vec![("b".to_string(), 2)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A field's index is filled in steps of a few items, each its own write; records made,
    /// changed and emptied between the steps, before and after the point reached, end up
    /// keyed as they are, as if the index had been filled at once.
    #[test]
    fn a_field_index_filled_in_steps_keeps_up_with_writes_between_them() {
        let dir = std::env::temp_dir().join(format!("sitegate-field-steps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir.join("site.db")).unwrap();
        let fields = |v: &str| {
            let mut f = FieldValues::new();
            f.insert("jobtitle".into(), v.into());
            f
        };
        // Made, changed and emptied as the records API does: the item and its index rows.
        let make = |store: &Store, v: &str| -> i64 {
            store
                .write(|tx| {
                    tx.execute(
                        "INSERT INTO items (org, typeid, parent, ownership, name, fields, created, updated, creator, modificator)
                         VALUES ('o', 1, NULL, 1, 'x', ?1, 0, 0, 1, 1)",
                        [fields_json(&fields(v))],
                    )?;
                    let id = tx.last_insert_rowid();
                    index_fields(tx, id, &FieldValues::new(), &fields(v))?;
                    Ok(id)
                })
                .unwrap()
        };
        let change = |store: &Store, id: i64, from: &str, to: &str| {
            let new = if to.is_empty() { FieldValues::new() } else { fields(to) };
            store
                .write(|tx| {
                    tx.execute("UPDATE items SET fields = ?2 WHERE id = ?1", (id, fields_json(&new)))?;
                    index_fields(tx, id, &fields(from), &new)
                })
                .unwrap();
        };
        store
            .write(|tx| {
                Ok(tx.execute_batch(
                    "INSERT INTO organizations (id, name) VALUES ('o', 'O');
                     INSERT INTO principals (org, kind, name, created) VALUES ('o', 1, 'A', 0);",
                )?)
            })
            .unwrap();
        let ids: Vec<i64> = (0..9).map(|i| make(&store, &format!("Title {i}"))).collect();
        let keyed = |store: &Store| -> Vec<(String, i64)> {
            store
                .read(|tx| {
                    let mut stmt =
                        tx.prepare("SELECT value, item FROM field_values WHERE field = 'jobtitle' ORDER BY item")?;
                    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                    Ok(rows.collect::<rusqlite::Result<_>>()?)
                })
                .unwrap()
        };
        // The first step only, as a request that stopped after it would leave it.
        store
            .write(|tx| Ok(tx.exec("INSERT INTO indexed_fields (field, filled_to) VALUES ('jobtitle', 0)", [])?))
            .unwrap();
        assert!(!store.fill_field_step("jobtitle", 4).unwrap());
        assert_eq!(keyed(&store).len(), 4);
        change(&store, ids[1], "Title 1", "Boss");
        change(&store, ids[2], "Title 2", "");
        change(&store, ids[6], "Title 6", "Chief");
        change(&store, ids[7], "Title 7", "");
        let late = make(&store, "Late");
        // The rest, as the next search on the field does.
        store.index_field_in_steps("jobtitle", 4).unwrap();
        let filled: Option<i64> =
            store.read(|tx| Ok(tx.query_row("SELECT filled_to FROM indexed_fields", [], |r| r.get(0))?)).unwrap();
        assert_eq!(filled, None, "filled");
        let mut expected: Vec<(String, i64)> = ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| match i {
                1 => Some(("boss".to_string(), *id)),
                6 => Some(("chief".to_string(), *id)),
                2 | 7 => None,
                _ => Some((format!("title {i}"), *id)),
            })
            .collect();
        expected.push(("late".into(), late));
        assert_eq!(keyed(&store), expected);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Many threads write at once: writes share batches (fewer commits than writes), a write
    /// that fails or panics leaves the others of its batch committed, and each write that
    /// returned Ok is in the database.
    #[test]
    fn writes_at_once_share_commits_and_fail_alone() {
        let dir = std::env::temp_dir().join(format!("sitegate-group-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = std::sync::Arc::new(Store::open(&dir.join("site.db")).unwrap());
        store.write(|tx| Ok(tx.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)")?)).unwrap();
        let before = store.commits.lock().unwrap().done;
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = std::sync::Arc::clone(&store);
                std::thread::spawn(move || {
                    let mut ok = Vec::new();
                    for i in 0..200i64 {
                        let n = t * 1000 + i;
                        let result = catch_unwind(AssertUnwindSafe(|| {
                            store.write(|tx| {
                                tx.execute("INSERT INTO t (n) VALUES (?1)", [n])?;
                                match i % 50 {
                                    7 => Err(StoreError::BadReference("refused".into())),
                                    9 => panic!("a write panics"),
                                    _ => Ok(()),
                                }
                            })
                        }));
                        if let Ok(Ok(())) = result {
                            ok.push(n);
                        }
                    }
                    ok
                })
            })
            .collect();
        let ok: Vec<i64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(ok.len(), 8 * 192);
        let stored: Vec<i64> = store
            .read(|tx| {
                let mut stmt = tx.prepare("SELECT n FROM t ORDER BY n")?;
                let rows = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?;
                Ok(rows)
            })
            .unwrap();
        let mut expected = ok.clone();
        expected.sort();
        assert_eq!(stored, expected, "exactly the writes that returned Ok are stored");
        let batches = store.commits.lock().unwrap().done - before;
        assert!(batches < 8 * 200, "{batches} commits for 1,600 writes");
        let w = store.writer.lock().unwrap();
        assert!(w.open.is_none() && w.conn.is_autocommit(), "no batch is left open");
        drop(w);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
