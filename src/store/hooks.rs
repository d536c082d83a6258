//! Webhooks: management, the outbox (deliveries written in the transaction of the change that
//! caused them), and what the delivery worker reads and records.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, Row};

use super::ExecCached;
use super::records::{ActivityRow, RecordDetail, State, activity_by_id, detail_of};
use super::{Result, Store, StoreError, json_ids};
use crate::limits;
use crate::model::activity::ActivityType;
use crate::model::hook::{ContentType, Event, Subject, constraint_matches};
use crate::model::{RecordType, Viewer};
use crate::timefmt::now_secs;

/// Why the deliveries a deleted hook had pending failed.
const HOOK_DELETED: &str = "the hook was deleted";

/// A webhook as stored.
#[derive(Clone, Debug)]
pub struct Hook {
    pub id: i64,
    pub owner: i64,
    pub title: String,
    pub active: bool,
    pub event: Event,
    pub constrainttype: String,
    pub url: String,
    pub contenttype: ContentType,
    pub secret: String,
    /// Its backlog passed the limit: no new deliveries until it is set active again.
    pub paused: bool,
    pub pending: i64,
    pub failed: i64,
}

/// A hook's settings, as created or replaced.
#[derive(Clone, Debug)]
pub struct HookSettings {
    pub title: String,
    pub active: bool,
    pub event: Event,
    pub constrainttype: String,
    pub url: String,
    pub contenttype: ContentType,
    pub secret: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    Pending,
    Delivered,
    Failed,
}

impl DeliveryState {
    fn from_i64(v: i64) -> DeliveryState {
        match v {
            1 => DeliveryState::Delivered,
            2 => DeliveryState::Failed,
            _ => DeliveryState::Pending,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }
}

/// A delivery as `/hooks/{id}/deliveries` lists it.
#[derive(Clone, Debug)]
pub struct DeliveryInfo {
    pub id: i64,
    pub event: String,
    pub object_id: i64,
    pub state: DeliveryState,
    pub attempts: i64,
    pub created: i64,
    pub next_at: i64,
    pub last_status: Option<i64>,
    pub last_error: String,
    pub finished: Option<i64>,
}

/// The outcome of one attempt.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub delivery: i64,
    pub hook_id: i64,
    pub delivered: bool,
    pub status: Option<u16>,
    pub error: String,
    /// When to try again; `None` with `delivered` false: failed for good.
    pub retry_at: Option<i64>,
}

/// A delivery ready to be sent (the head of its hook's queue).
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub id: i64,
    pub hook_id: i64,
    pub url: String,
    pub secret: String,
    pub contenttype: ContentType,
    pub event: String,
    pub body: Vec<u8>,
    pub attempts: i64,
}

/// What a webhook carries about the thing that changed.
pub enum Content<'a> {
    Record(&'a RecordDetail),
    Activity { activity: &'a ActivityRow, record_id: i64, record_type: RecordType },
    Alert(&'a super::StoredAlert),
}

pub struct Notification<'a> {
    pub event: Event,
    pub object_id: i64,
    pub content: Content<'a>,
}

/// Renders a notification in a content type (the API's shapes; given to the store at start).
pub trait Render: Send + Sync {
    fn render(&self, notification: &Notification<'_>, contenttype: ContentType) -> Vec<u8>;
}

/// How the store writes deliveries.
pub struct Outbox {
    pub render: Arc<dyn Render>,
    /// Pending deliveries of one hook above which it is paused.
    pub backlog_max: i64,
    /// Largest delivery body; a larger one is sent without the activities, or not at all.
    pub body_bytes_max: usize,
    /// Called after a commit that wrote deliveries (wakes the delivery worker).
    pub wake: Arc<dyn Fn() + Send + Sync>,
}

/// The thing an event is about.
#[derive(Clone, Copy, Debug)]
pub(super) enum Target {
    Record(RecordType, i64),
    Activity(ActivityType, i64),
    Alert(i64),
}

const HOOK_COLUMNS: &str = "h.id, h.owner, h.title, h.active, h.event, h.constrainttype, h.url, h.contenttype, \
     h.secret, h.paused, h.pending, \
     (SELECT count(*) FROM deliveries d WHERE d.hook_id = h.id AND d.state = 2)";

fn hook_from_row(r: &Row<'_>) -> rusqlite::Result<Hook> {
    let event: String = r.get(4)?;
    let ct: String = r.get(7)?;
    Ok(Hook {
        id: r.get(0)?,
        owner: r.get(1)?,
        title: r.get(2)?,
        active: r.get(3)?,
        event: Event::parse(&event).unwrap_or(Event::ItemsUpdate),
        constrainttype: r.get(5)?,
        url: r.get(6)?,
        contenttype: ContentType::parse(&ct).unwrap_or(ContentType::Xml),
        secret: r.get(8)?,
        paused: r.get(9)?,
        pending: r.get(10)?,
        failed: r.get(11)?,
    })
}

/// Hooks the viewer may see and change: their own; administrators all of the organisation.
fn hook_visible(viewer: &Viewer) -> &'static str {
    if viewer.admin { "1" } else { "h.owner = :user" }
}

fn load_hook(tx: &Connection, viewer: &Viewer, id: i64) -> Result<Hook> {
    let sql = format!(
        "SELECT {HOOK_COLUMNS} FROM hooks h WHERE h.id = :id AND h.org = :org AND h.deleted = 0 AND {}",
        hook_visible(viewer)
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut params: Vec<(&str, &dyn rusqlite::ToSql)> = vec![(":id", &id), (":org", &viewer.org)];
    if !viewer.admin {
        params.push((":user", &viewer.user_id));
    }
    stmt.query_row(params.as_slice(), hook_from_row).optional()?.ok_or(StoreError::NotFound)
}

impl Store {
    /// Installs the outbox: from now on changes write deliveries.
    pub fn set_outbox(&self, outbox: Outbox) {
        let _ = self.outbox.set(outbox);
    }

    pub fn create_hook(&self, viewer: &Viewer, s: &HookSettings) -> Result<Hook> {
        self.write(|tx| {
            let count: i64 =
                tx.query_row("SELECT count(*) FROM hooks WHERE org = ?1 AND deleted = 0", [&viewer.org], |r| r.get(0))?;
            if count >= limits::WEBHOOKS_PER_ORG_MAX {
                return Err(StoreError::LimitReached(format!(
                    "the organisation has {count} webhooks, the most it may have ({}); delete one first",
                    limits::WEBHOOKS_PER_ORG_MAX
                )));
            }
            let now = now_secs();
            tx.exec(
                "INSERT INTO hooks (org, owner, title, active, event, constrainttype, url, contenttype, secret, created, updated)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
                (
                    &viewer.org,
                    viewer.user_id,
                    &s.title,
                    s.active,
                    s.event.as_str(),
                    &s.constrainttype,
                    &s.url,
                    s.contenttype.as_str(),
                    &s.secret,
                    now,
                ),
            )?;
            load_hook(tx, viewer, tx.last_insert_rowid())
        })
    }

    pub fn hooks(&self, viewer: &Viewer) -> Result<Vec<Hook>> {
        self.read(|tx| {
            let sql = format!(
                "SELECT {HOOK_COLUMNS} FROM hooks h WHERE h.org = :org AND h.deleted = 0 AND {} ORDER BY h.id",
                hook_visible(viewer)
            );
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut params: Vec<(&str, &dyn rusqlite::ToSql)> = vec![(":org", &viewer.org)];
            if !viewer.admin {
                params.push((":user", &viewer.user_id));
            }
            Ok(stmt.query_map(params.as_slice(), hook_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    pub fn hook(&self, viewer: &Viewer, id: i64) -> Result<Hook> {
        self.read(|tx| load_hook(tx, viewer, id))
    }

    /// Replaces a hook's settings with what `make` makes of them as they are, read in the same
    /// write: the keys a request leaves out keep their values, also while other requests
    /// change the hook (nothing written in between; `make`'s refusal is handed back).
    /// `resume` (the request set `active` to 1) also lifts a pause; other changes leave it paused.
    pub fn update_hook<E>(
        &self,
        viewer: &Viewer,
        id: i64,
        resume: bool,
        make: impl FnOnce(&Hook) -> Result<HookSettings, E>,
    ) -> Result<Result<(), E>> {
        let _changed = HookChanged(self);
        self.write(|tx| {
            let current = load_hook(tx, viewer, id)?;
            let s = match make(&current) {
                Ok(s) => s,
                Err(refused) => return Ok(Err(refused)),
            };
            let paused = current.paused && !resume;
            tx.exec(
                "UPDATE hooks SET title = ?2, active = ?3, event = ?4, constrainttype = ?5, url = ?6, contenttype = ?7,
                                  secret = ?8, paused = ?9, updated = ?10 WHERE id = ?1",
                (
                    id,
                    &s.title,
                    s.active,
                    s.event.as_str(),
                    &s.constrainttype,
                    &s.url,
                    s.contenttype.as_str(),
                    &s.secret,
                    paused,
                    now_secs(),
                ),
            )?;
            Ok(Ok(()))
        })
    }

    /// Deletes a hook; its pending deliveries end as failed ("the hook was deleted").
    pub fn delete_hook(&self, viewer: &Viewer, id: i64) -> Result<()> {
        let _changed = HookChanged(self);
        self.write(|tx| {
            load_hook(tx, viewer, id)?;
            let now = now_secs();
            let start = queue_start(tx, id)?;
            tx.exec(
                "UPDATE hooks SET deleted = 1, active = 0, pending = 0, secret = '', updated = ?2 WHERE id = ?1",
                (id, now),
            )?;
            tx.exec(
                "UPDATE deliveries SET state = 2, finished = ?2, last_error = ?4
                 WHERE id >= ?3 AND hook_id = ?1 AND state = 0",
                (id, now, start, HOOK_DELETED),
            )?;
            Ok(())
        })
    }

    /// The newest deliveries of a hook, at most `limit`.
    pub fn deliveries(&self, viewer: &Viewer, hook_id: i64, limit: u32) -> Result<Vec<DeliveryInfo>> {
        self.read(|tx| {
            load_hook(tx, viewer, hook_id)?;
            // The pending ones from the queue's head, the finished ones from their index.
            let mut stmt = tx.prepare_cached(
                "SELECT * FROM (
                    SELECT * FROM (SELECT id, event, object_id, state, attempts, created, next_at, last_status,
                                          last_error, finished
                                   FROM deliveries WHERE id >= ?3 AND hook_id = ?1 AND state = 0
                                   ORDER BY id DESC LIMIT ?2)
                    UNION ALL
                    SELECT * FROM (SELECT id, event, object_id, state, attempts, created, next_at, last_status,
                                          last_error, finished
                                   FROM deliveries WHERE hook_id = ?1 AND state <> 0 ORDER BY id DESC LIMIT ?2))
                 ORDER BY id DESC LIMIT ?2",
            )?;
            let rows = stmt.query_map((hook_id, limit, queue_start(tx, hook_id)?), |r| {
                Ok(DeliveryInfo {
                    id: r.get(0)?,
                    event: r.get(1)?,
                    object_id: r.get(2)?,
                    state: DeliveryState::from_i64(r.get(3)?),
                    attempts: r.get(4)?,
                    created: r.get(5)?,
                    next_at: r.get(6)?,
                    last_status: r.get(7)?,
                    last_error: r.get(8)?,
                    finished: r.get(9)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Sends a failed delivery again (a fresh round of attempts); only failed ones.
    pub fn retry_delivery(&self, viewer: &Viewer, hook_id: i64, delivery: i64) -> Result<()> {
        let done = self.write(|tx| {
            let hook = load_hook(tx, viewer, hook_id)?;
            let state: i64 = tx
                .query_row("SELECT state FROM deliveries WHERE id = ?1 AND hook_id = ?2", (delivery, hook.id), |r| {
                    r.get(0)
                })
                .optional()?
                .ok_or(StoreError::NotFound)?;
            if DeliveryState::from_i64(state) != DeliveryState::Failed {
                return Err(StoreError::Duplicate(format!(
                    "delivery {delivery} is {}; only failed deliveries are sent again",
                    DeliveryState::from_i64(state).as_str()
                )));
            }
            tx.exec(
                "UPDATE deliveries SET state = 0, attempts = 0, next_at = ?2, finished = NULL WHERE id = ?1",
                (delivery, now_secs()),
            )?;
            // It joins the queue: at its head if it is older than the rest.
            tx.exec(
                "UPDATE hooks SET pending = pending + 1,
                                  head = CASE WHEN pending = 0 OR ?2 < head THEN ?2 ELSE head END
                 WHERE id = ?1",
                (hook.id, delivery),
            )?;
            Ok(())
        });
        if done.is_ok() {
            self.wake_deliveries();
        }
        done
    }

    /// How many times hooks' settings changed or hooks were deleted since start. A sender
    /// compares it between the deliveries of its batch and hands the rest back when it moved,
    /// so that they go with the hook's new settings (or not at all, for a deleted hook).
    pub fn hook_changes(&self) -> u64 {
        self.hook_changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a delivery is still waiting to be sent: a sender asks before each delivery of
    /// the batch it holds, since `sitegate erase` (another process) may have taken it away.
    /// True when the database cannot say (the delivery goes, as it would have).
    pub fn delivery_pending(&self, delivery: i64) -> bool {
        self.read(|tx| {
            Ok(tx
                .prepare_cached("SELECT 1 FROM deliveries WHERE id = ?1 AND state = 0")?
                .query_row([delivery], |_| Ok(()))
                .optional()?
                .is_some())
        })
        .unwrap_or(true)
    }

    fn wake_deliveries(&self) {
        if let Some(outbox) = self.outbox.get() {
            (outbox.wake)();
        }
    }

    /// The heads of the hooks' queues: for each hook with pending deliveries (not in `busy`)
    /// whose oldest is due by `now` (see `due`; `retry_delays_s` as configured) and that
    /// `take` accepts (a free sender for it), up to `per_hook` of its oldest, in order. `take`
    /// is told the hook, its URL and whether its oldest delivery was tried before (its receiver
    /// failed it). Only accepted hooks' deliveries are read, so what is held in memory is
    /// bounded by the senders, not by the hooks with a backlog. Also when the next not-yet-due
    /// head is due (Unix seconds), if any.
    pub fn due_deliveries(
        &self,
        now: i64,
        retry_delays_s: &[u64],
        busy: &[i64],
        per_hook: u32,
        mut take: impl FnMut(i64, &str, bool) -> bool,
    ) -> Result<(Vec<Vec<Outgoing>>, Option<i64>)> {
        self.read(|tx| {
            let mut heads = tx.prepare_cached(
                "SELECT h.id, d.next_at, h.url, d.attempts FROM hooks h JOIN deliveries d ON d.id = h.head
                 WHERE h.pending > 0 AND h.id NOT IN (SELECT value FROM json_each(?1))",
            )?;
            let heads = heads
                .query_map([json_ids(busy)], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let next = heads
                .iter()
                .filter(|(_, at, _, attempts)| !due(*at, *attempts, now, retry_delays_s))
                .map(|(_, at, _, _)| *at)
                .min();
            let mut batches = Vec::new();
            let mut stmt = tx.prepare_cached(
                "SELECT d.id, d.hook_id, h.url, h.secret, d.contenttype, d.event, p.body, d.attempts, d.next_at
                 FROM hooks h JOIN deliveries d ON d.id >= h.head AND d.hook_id = h.id AND d.state = 0
                      JOIN payloads p ON p.id = d.payload_id
                 WHERE h.id = ?1 ORDER BY d.id LIMIT ?2",
            )?;
            for (hook, at, url, attempts) in heads {
                if !due(at, attempts, now, retry_delays_s) || !take(hook, &url, attempts > 0) {
                    continue;
                }
                let batch = stmt
                    .query_map((hook, per_hook), |r| {
                        let ct: String = r.get(4)?;
                        Ok((
                            Outgoing {
                                id: r.get(0)?,
                                hook_id: r.get(1)?,
                                url: r.get(2)?,
                                secret: r.get(3)?,
                                contenttype: ContentType::parse(&ct).unwrap_or(ContentType::Xml),
                                event: r.get(5)?,
                                body: r.get(6)?,
                                attempts: r.get(7)?,
                            },
                            r.get::<_, i64>(8)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                // Only the deliveries already due; a later one waits for its time.
                batches.push(
                    batch
                        .into_iter()
                        .take_while(|(o, at)| due(*at, o.attempts, now, retry_delays_s))
                        .map(|(o, _)| o)
                        .collect(),
                );
            }
            Ok((batches, next))
        })
    }

    /// Records attempts, in one transaction: delivered, retry at a time, or failed for good.
    pub fn record_attempts(&self, attempts: &[Attempt]) -> Result<()> {
        if attempts.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let now = now_secs();
            let mut update = tx.prepare_cached(
                "UPDATE deliveries SET state = ?2, attempts = attempts + 1, next_at = ?3, finished = ?4,
                                       last_status = ?5, last_error = ?6
                 WHERE id = ?1 AND state = 0",
            )?;
            let mut leave = tx.prepare_cached("UPDATE hooks SET pending = max(pending - 1, 0) WHERE id = ?1")?;
            // A delivery the receiver took while its hook was being deleted was delivered.
            let mut delivered_late = tx.prepare_cached(
                "UPDATE deliveries SET state = 1, attempts = attempts + 1, finished = ?2, last_status = ?3,
                                       last_error = ''
                 WHERE id = ?1 AND state = 2 AND last_error = ?4",
            )?;
            for a in attempts {
                let (state, next_at, finished) = match (a.delivered, a.retry_at) {
                    (true, _) => (1, now, Some(now)),
                    (false, Some(at)) => (0, at, None),
                    (false, None) => (2, now, Some(now)),
                };
                let n = update.execute((a.delivery, state, next_at, finished, a.status.map(i64::from), &a.error))?;
                if n == 0 && a.delivered {
                    delivered_late.execute((a.delivery, now, a.status.map(i64::from), HOOK_DELETED))?;
                }
                if n > 0 && state != 0 {
                    leave.execute([a.hook_id])?;
                }
            }
            // Each hook's head moves on to its oldest delivery still pending.
            let mut advance = tx.prepare_cached(ADVANCE_HEAD)?;
            let mut hooks: Vec<i64> = attempts.iter().map(|a| a.hook_id).collect();
            hooks.sort_unstable();
            hooks.dedup();
            for hook in hooks {
                advance.execute([hook])?;
            }
            Ok(())
        })
    }

    /// Forgets up to `rows_max` delivered and failed deliveries that finished before `before`
    /// (Unix seconds), the payloads no delivery refers to any more, and deleted hooks with no
    /// delivery left. Returns how many deliveries it forgot: `rows_max` means there may be more
    /// (each call is one short write).
    ///
    /// A finish time ahead of `now` comes from a wall clock stepped back since: up to `rows_max`
    /// such deliveries are taken as finished `now`, so they are kept the retention from here,
    /// not for as long as the step besides.
    pub fn purge_deliveries(&self, now: i64, before: i64, rows_max: u32) -> Result<usize> {
        self.write(|tx| {
            tx.exec(
                "UPDATE deliveries SET finished = ?1
                 WHERE id IN (SELECT id FROM deliveries WHERE state <> 0 AND finished > ?1 LIMIT ?2)",
                (now, rows_max),
            )?;
            let gone: Vec<(i64, i64)> = tx
                .prepare_cached(
                    "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE state <> 0 AND finished < ?1
                                                         ORDER BY finished LIMIT ?2)
                     RETURNING id, payload_id",
                )?
                .query_map((before, rows_max), |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let n = gone.len();
            // A payload is shared only by the deliveries of one change, which are consecutive
            // and at most one per hook of an organisation: one no delivery that near refers to
            // is no longer referenced (a hook whose queue is stuck holds its own payloads only).
            let mut unreferenced = tx.prepare_cached(FORGET_PAYLOAD)?;
            for (delivery, payload) in gone {
                unreferenced.execute((delivery, payload, limits::WEBHOOKS_PER_ORG_MAX))?;
            }
            // A deleted hook goes with its last delivery (its settings, the secret among them,
            // are of no more use).
            tx.exec(
                "DELETE FROM hooks WHERE deleted = 1 AND pending = 0
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.hook_id = hooks.id AND d.state <> 0)
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id >= hooks.head AND d.hook_id = hooks.id
                                   AND d.state = 0)",
                [],
            )?;
            // Payloads are written with their deliveries, a change's after every earlier change's,
            // and a change's deliveries are consecutive: those below the least payload of the
            // first remaining change are no longer referenced. Within a change the payload ids
            // need not rise with the delivery ids (hooks of one owner share one payload, and
            // another owner's hook may come between them), so the least is taken over the first
            // remaining change's deliveries, at most one per hook of an organisation.
            tx.exec(
                "DELETE FROM payloads WHERE id IN (
                    SELECT id FROM payloads
                    WHERE id < coalesce((SELECT min(payload_id) FROM (SELECT payload_id FROM deliveries
                                                                       ORDER BY id LIMIT ?2)),
                                        (SELECT max(id) + 1 FROM payloads))
                    ORDER BY id LIMIT ?1)",
                (rows_max, limits::WEBHOOKS_PER_ORG_MAX),
            )?;
            Ok(n)
        })
    }

    /// Pending and failed deliveries, and paused hooks, of the whole service (for /health).
    pub fn delivery_summary(&self) -> Result<(i64, i64, i64)> {
        self.read(|tx| {
            Ok(tx.query_row(
                "SELECT (SELECT coalesce(sum(pending), 0) FROM hooks),
                        (SELECT count(*) FROM deliveries WHERE state = 2),
                        (SELECT count(*) FROM hooks WHERE paused = 1 AND deleted = 0)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?)
        })
    }

    /// Writes the deliveries the events cause, inside the caller's transaction. Returns whether
    /// any were written (the caller wakes the worker after committing).
    pub(super) fn emit(&self, tx: &Connection, org: &str, events: &[Event], target: Target) -> Result<bool> {
        let Some(outbox) = self.outbox.get() else { return Ok(false) };
        if events.is_empty() {
            return Ok(false);
        }
        let mut stmt = tx.prepare_cached(
            "SELECT h.id, h.owner, h.event, h.constrainttype, h.contenttype, h.pending
             FROM hooks h JOIN principals u ON u.id = h.owner
             WHERE h.org = ?1 AND h.deleted = 0 AND h.active = 1 AND h.paused = 0 AND u.deleted = 0
               AND u.prevent_login = 0",
        )?;
        // The organisation's hooks, of every event, filtered and sorted by id here: a few rows.
        // In SQL, the event list (`IN`) and the `ORDER BY` made SQLite build an ephemeral
        // table and set up a sorter on every run, rows or not: most writes' whole cost here.
        let mut hooks = stmt
            .query_map([org], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        hooks.retain(|h| events.iter().any(|e| e.as_str() == h.2));
        hooks.sort_unstable_by_key(|h| h.0);
        let subject = match target {
            Target::Record(rt, _) => Subject::Record(rt),
            Target::Activity(kind, _) => Subject::Activity(kind),
            Target::Alert(_) => Subject::Alert,
        };
        let now = now_secs();
        let mut wrote = false;
        // What each hook owner may see, and the bodies already rendered for them.
        let mut seen: HashMap<i64, Option<Rendered>> = HashMap::new();
        // Payload rows already written, by (owner, event, content type); 0: too large to send.
        let mut payloads: HashMap<(i64, &'static str, &'static str), i64> = HashMap::new();
        for (hook_id, owner, event, constraint, ct, pending) in hooks {
            if !constraint_matches(&constraint, subject) {
                continue;
            }
            let Some(event) = Event::parse(&event) else { continue };
            let Some(ct) = ContentType::parse(&ct) else { continue };
            let view = match seen.entry(owner) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(owner_view(tx, owner, target)?),
            };
            let Some(view) = view else { continue };
            let key = (owner, event.as_str(), ct.as_str());
            let payload = match payloads.get(&key) {
                Some(id) => *id,
                None => {
                    let body = render_bounded(outbox, view, event, target, ct);
                    let id = if body.is_empty() {
                        log::warn!("the {} notification for {target:?} is too large; not sent", event.as_str());
                        0
                    } else {
                        tx.prepare_cached("INSERT INTO payloads (body) VALUES (?1)")?.execute([&body])?;
                        tx.last_insert_rowid()
                    };
                    payloads.insert(key, id);
                    id
                }
            };
            if payload == 0 {
                continue;
            }
            tx.prepare_cached(
                "INSERT INTO deliveries (hook_id, event, object_id, contenttype, payload_id, next_at, created)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
            )?
            .execute((hook_id, event.as_str(), target_id(target), ct.as_str(), payload, now))?;
            let delivery = tx.last_insert_rowid();
            wrote = true;
            // One delivery per hook and event: the count read above, plus this one. (A statement
            // per row: one statement for many rows, or RETURNING, needs a statement journal,
            // which costs more than the rows.)
            let pending = pending + 1;
            let pause = pending >= outbox.backlog_max;
            // An empty queue starts at this delivery; otherwise its head stays.
            tx.prepare_cached(
                "UPDATE hooks SET pending = ?2, paused = ?3, head = CASE WHEN ?2 = 1 THEN ?4 ELSE head END
                 WHERE id = ?1",
            )?
            .execute((hook_id, pending, pause, delivery))?;
            if pause {
                log::warn!("webhook {hook_id} paused: {pending} deliveries are pending; set it active again to resume");
            }
        }
        Ok(wrote)
    }

    /// Runs a write that may emit events, and wakes the delivery worker if it wrote any.
    pub(super) fn write_emitting<T>(&self, f: impl FnOnce(&Connection) -> Result<(T, bool)>) -> Result<T> {
        let (out, wrote) = self.write(f)?;
        if wrote {
            self.wake_deliveries();
        }
        Ok(out)
    }
}

/// Moves hook `?1`'s head on to its oldest delivery still pending.
const ADVANCE_HEAD: &str = "UPDATE hooks SET head = coalesce(
        (SELECT d.id FROM deliveries d WHERE d.id >= hooks.head AND d.hook_id = hooks.id AND d.state = 0
         ORDER BY d.id LIMIT 1), head)
    WHERE id = ?1 AND pending > 0";

/// Deletes payload `?2` of the delivery `?1` just removed, unless a delivery near it (within
/// `?3`, `WEBHOOKS_PER_ORG_MAX`) still refers to it: a payload is shared only by the
/// deliveries of one change, which are consecutive and at most one per hook of an organisation.
const FORGET_PAYLOAD: &str = "DELETE FROM payloads WHERE id = ?2 AND NOT EXISTS (
        SELECT 1 FROM deliveries WHERE id BETWEEN ?1 - ?3 AND ?1 + ?3 AND payload_id = ?2)";

/// Forgets the webhook deliveries about record `record_id` and its activities, sent or not,
/// and those sent of alerts that named it as their contact, with their bodies (for an erase:
/// the bodies hold what is erased, a failed delivery could be sent again, and one not yet sent
/// would send it now). Call it before the alerts let go of the record. Each hook's pending
/// count and head follow. Returns the rows removed, and how many of the deliveries were not
/// sent yet (their receivers will not hear of those changes). A delivery a sender is sending
/// goes out; senders skip the rest (`Store::delivery_pending`).
pub(super) fn forget_deliveries_of(tx: &Connection, record_id: i64) -> Result<(usize, usize)> {
    // Alerts that named the record as their contact keep their deliveries not yet sent: an
    // alarm goes out whatever is erased.
    let gone: Vec<(i64, i64, i64, i64)> = tx
        .prepare(
            "DELETE FROM deliveries
             WHERE (event LIKE 'items.%' OR event LIKE 'activities.%')
               AND object_id IN (SELECT id FROM items WHERE id = ?1 OR record_id = ?1)
                OR event LIKE 'alerts.%' AND state <> 0
               AND object_id IN (SELECT id FROM alerts WHERE contact_id = ?1)
             RETURNING id, hook_id, payload_id, state",
        )?
        .query_map([record_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut pending: HashMap<i64, i64> = HashMap::new();
    for (_, hook, _, state) in &gone {
        if *state == 0 {
            *pending.entry(*hook).or_default() += 1;
        }
    }
    let unsent = pending.values().sum::<i64>() as usize;
    for (hook, n) in pending {
        tx.exec("UPDATE hooks SET pending = max(pending - ?2, 0) WHERE id = ?1", (hook, n))?;
        tx.exec(ADVANCE_HEAD, [hook])?;
    }
    // A payload is shared only by the deliveries of one change (one record or activity), all
    // of them among those just removed; the check near them is for safety, as in the purge.
    let mut rows = gone.len();
    let mut unreferenced = tx.prepare_cached(FORGET_PAYLOAD)?;
    for (delivery, _, payload, _) in gone {
        rows += unreferenced.execute((delivery, payload, limits::WEBHOOKS_PER_ORG_MAX))?;
    }
    Ok((rows, unsent))
}

/// Whether a pending delivery, `attempts` tried and due at `next_at`, is due at `now`: its
/// time has come, or it lies further ahead than the delay that set it. Due times are taken
/// from the wall clock, and one stepped back (NTP correcting a clock that ran ahead, a gateway
/// without a battery-backed clock) leaves them ahead by the step: the hook's queue would wait
/// that long behind its head. So a due time ahead of now by more than its delay (none for a
/// delivery never tried, written due at once; a retry's configured delay for its attempt, or
/// the longest if the configuration has none for it any more), plus the second a retry's due
/// time is rounded up by, counts as due now.
fn due(next_at: i64, attempts: i64, now: i64, retry_delays_s: &[u64]) -> bool {
    let delay_s = match usize::try_from(attempts - 1) {
        Ok(n) => retry_delays_s.get(n).or(retry_delays_s.iter().max()).copied().unwrap_or(0),
        Err(_) => 0,
    };
    let ahead_s = next_at.saturating_sub(now);
    ahead_s <= 0 || ahead_s > i64::try_from(delay_s).unwrap_or(i64::MAX).saturating_add(1)
}

/// Where a hook's pending deliveries start (past the end when it has none).
fn queue_start(tx: &Connection, hook_id: i64) -> Result<i64> {
    Ok(tx.query_row(
        "SELECT CASE WHEN pending > 0 THEN head ELSE 9223372036854775807 END FROM hooks WHERE id = ?1",
        [hook_id],
        |r| r.get(0),
    )?)
}

fn target_id(target: Target) -> i64 {
    match target {
        Target::Record(_, id) | Target::Activity(_, id) | Target::Alert(id) => id,
    }
}

/// What a hook owner sees of the target (None: nothing, so no delivery).
enum Rendered {
    Record(RecordDetail),
    Activity(ActivityRow, i64, RecordType),
    Alert(super::StoredAlert),
}

fn owner_view(tx: &Connection, owner: i64, target: Target) -> Result<Option<Rendered>> {
    let Some(viewer) = super::principals::viewer_of(tx, owner)? else { return Ok(None) };
    match target {
        Target::Record(rt, id) => match detail_of(tx, &viewer, rt, id, State::Any) {
            Ok(d) => Ok(Some(Rendered::Record(d))),
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        },
        Target::Activity(_, id) => {
            let activity = activity_by_id(tx, id)?;
            let (record_id, typeid, ownership): (i64, i64, i64) = tx.query_row(
                "SELECT r.id, r.typeid, r.ownership FROM items a JOIN items r ON r.id = a.record_id WHERE a.id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            if !viewer.admin && !viewer.owner_ids().contains(&ownership) {
                return Ok(None);
            }
            let rt = RecordType::from_typeid(typeid).unwrap_or(RecordType::Contact);
            Ok(Some(Rendered::Activity(activity, record_id, rt)))
        }
        // Every user of the organisation sees its alerts (the hooks are of that organisation);
        // the contact is named only to an owner who may see that record, as `GET /alerts` does.
        Target::Alert(id) => match super::alerts::alert_in(tx, &viewer.org, id) {
            Ok(mut a) => {
                if let Some(contact) = a.contact_id.filter(|_| !viewer.admin)
                    && !super::records::visible_ids_in(tx, &viewer, &[contact])?.contains(&contact)
                {
                    a.contact_id = None;
                    a.contact_name = None;
                }
                Ok(Some(Rendered::Alert(a)))
            }
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        },
    }
}

/// The body, within the size limit: a record without its activities if need be; empty if even
/// that is too large.
fn render_bounded(outbox: &Outbox, view: &Rendered, event: Event, target: Target, ct: ContentType) -> Vec<u8> {
    let object_id = target_id(target);
    let body = match view {
        Rendered::Record(detail) => {
            let full = outbox.render.render(&Notification { event, object_id, content: Content::Record(detail) }, ct);
            if full.len() <= outbox.body_bytes_max {
                return full;
            }
            let slim = RecordDetail {
                record: detail.record.clone(),
                activities: Vec::new(),
                categories: detail.categories.clone(),
                related: detail.related.clone(),
            };
            outbox.render.render(&Notification { event, object_id, content: Content::Record(&slim) }, ct)
        }
        Rendered::Activity(activity, record_id, record_type) => outbox.render.render(
            &Notification {
                event,
                object_id,
                content: Content::Activity { activity, record_id: *record_id, record_type: *record_type },
            },
            ct,
        ),
        Rendered::Alert(alert) => {
            outbox.render.render(&Notification { event, object_id, content: Content::Alert(alert) }, ct)
        }
    };
    if body.len() <= outbox.body_bytes_max { body } else { Vec::new() }
}

/// Counts a change of a hook when dropped: after its write committed (or failed, which only
/// makes a sender hand back its batch early).
struct HookChanged<'a>(&'a Store);

impl Drop for HookChanged<'_> {
    fn drop(&mut self) {
        self.0.hook_changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Store;

    /// A fresh store in a folder of its own, and a second connection to write rows as they
    /// would be found (foreign keys off: rows of any age, in any order).
    fn fixture(name: &str) -> (std::path::PathBuf, Store, rusqlite::Connection) {
        let dir = std::env::temp_dir().join(format!("sitegate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("site.db");
        let store = Store::open(&path).unwrap();
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        (dir, store, raw)
    }

    /// Finished deliveries past the retention go in bounded batches, with the payloads only they
    /// used; pending ones and what they refer to stay.
    #[test]
    fn purging_is_batched_and_keeps_pending_deliveries() {
        let (dir, store, raw) = fixture("purge");
        // Five old finished deliveries (payloads 1..=5), then one pending (payload 6) and one
        // finished recently (payload 7).
        for p in 1..=7 {
            raw.execute("INSERT INTO payloads (id, body) VALUES (?1, x'00')", [p]).unwrap();
            let (state, finished) = match p {
                6 => (0, None),
                7 => (1, Some(2_000)),
                _ => (if p % 2 == 0 { 2 } else { 1 }, Some(100 + p)),
            };
            raw.execute(
                "INSERT INTO deliveries (id, hook_id, event, object_id, contenttype, payload_id, state, next_at, created,
                                         finished)
                 VALUES (?1, 1, 'items.create', 1, 'xml', ?1, ?2, 0, 0, ?3)",
                (p, state, finished),
            )
            .unwrap();
        }
        let count = |sql: &str| -> i64 { raw.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(store.purge_deliveries(10_000, 1_000, 2).unwrap(), 2);
        assert_eq!(count("SELECT count(*) FROM deliveries"), 5);
        assert_eq!(count("SELECT min(id) FROM payloads"), 3);
        assert_eq!(store.purge_deliveries(10_000, 1_000, 2).unwrap(), 2);
        assert_eq!(store.purge_deliveries(10_000, 1_000, 2).unwrap(), 1);
        assert_eq!(store.purge_deliveries(10_000, 1_000, 2).unwrap(), 0);
        let ids = |table: &str| -> String {
            raw.query_row(&format!("SELECT group_concat(id) FROM (SELECT id FROM {table} ORDER BY id)"), [], |r| {
                r.get(0)
            })
            .unwrap()
        };
        assert_eq!(ids("deliveries"), "6,7");
        assert_eq!(ids("payloads"), "6,7");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// One change to hooks of two owners, the first owner's hooks on either side of the
    /// other's: they share a payload whose id is below the other owner's. Purging the first
    /// delivery must keep the shared payload (it failed the whole purge on a foreign key).
    #[test]
    fn purging_keeps_a_payload_shared_across_another_owners_delivery() {
        let (dir, store, raw) = fixture("purge-shared");
        for p in [1, 2] {
            raw.execute("INSERT INTO payloads (id, body) VALUES (?1, x'00')", [p]).unwrap();
        }
        // Delivery 1 (owner A, payload 1) finished long ago; 2 (owner B, payload 2) and 3
        // (owner A again, payload 1) are pending.
        for (id, payload, state, finished) in [(1, 1, 1, Some(100)), (2, 2, 0, None), (3, 1, 0, None)] {
            raw.execute(
                "INSERT INTO deliveries (id, hook_id, event, object_id, contenttype, payload_id, state, next_at, created,
                                         finished)
                 VALUES (?1, ?1, 'items.update', 1, 'xml', ?2, ?3, 0, 0, ?4)",
                (id, payload, state, finished),
            )
            .unwrap();
        }
        assert_eq!(store.purge_deliveries(10_000, 1_000, 100).unwrap(), 1);
        let count = |sql: &str| -> i64 { raw.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(count("SELECT count(*) FROM deliveries"), 2);
        assert_eq!(count("SELECT count(*) FROM payloads"), 2, "the shared payload stays");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A finish time ahead of now (the delivery finished while the clock ran ahead) ages from
    /// now: the delivery is kept the retention from here, not for as long as the clock was
    /// ahead besides.
    #[test]
    fn a_finish_time_ahead_of_now_ages_from_now() {
        let (dir, store, raw) = fixture("purge-ahead");
        let (now, kept_s) = (1_000_000_000, 7 * 86_400);
        // Delivery 1 finished a year ahead of now, 2 before the retention.
        for (id, finished) in [(1, now + 365 * 86_400), (2, now - kept_s - 1)] {
            raw.execute("INSERT INTO payloads (id, body) VALUES (?1, x'00')", [id]).unwrap();
            raw.execute(
                "INSERT INTO deliveries (id, hook_id, event, object_id, contenttype, payload_id, state, next_at, created,
                                         finished)
                 VALUES (?1, 1, 'items.create', 1, 'xml', ?1, 1, 0, 0, ?2)",
                (id, finished),
            )
            .unwrap();
        }
        let finished = || -> Vec<i64> {
            let mut stmt = raw.prepare("SELECT finished FROM deliveries ORDER BY id").unwrap();
            stmt.query_map([], |r| r.get(0)).unwrap().collect::<rusqlite::Result<_>>().unwrap()
        };
        assert_eq!(store.purge_deliveries(now, now - kept_s, 100).unwrap(), 1);
        assert_eq!(finished(), [now], "taken as finished now");
        assert_eq!(store.purge_deliveries(now + kept_s, now, 100).unwrap(), 0, "kept the retention");
        assert_eq!(store.purge_deliveries(now + kept_s + 1, now + 1, 100).unwrap(), 1, "and no longer");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// When a pending delivery is due, by how far its due time lies ahead of now and how often
    /// it was tried, with the default delays (60, 300, 1800, 7200 s): ahead by more than the
    /// delay that set it (and the second it is rounded up by), only a clock stepped back since
    /// can have put it there, and it is due now; within its delay it waits.
    #[test]
    fn a_due_time_ahead_by_more_than_its_delay_is_due() {
        let delays = crate::limits::WEBHOOK_RETRY_DELAYS_S_DEFAULT;
        let now = 1_000_000_000;
        // (seconds ahead of now, attempts, due)
        let rows = [
            // Never tried: due when written.
            (-5, 0, true),
            (0, 0, true),
            (1, 0, false),
            (2, 0, true),
            (3_600, 0, true),
            // The first retry, 60 s after the first attempt.
            (-1, 1, true),
            (60, 1, false),
            (61, 1, false),
            (62, 1, true),
            (3_660, 1, true),
            (5 * 365 * 86_400, 1, true),
            (i64::MAX - now, 1, true),
            // The second, 300 s; the fourth, 7200 s.
            (301, 2, false),
            (302, 2, true),
            (7_201, 4, false),
            (7_202, 4, true),
            // Tried more often than there are delays now (fewer configured since): the longest.
            (7_201, 9, false),
            (7_202, 9, true),
        ];
        for (ahead_s, attempts, expected) in rows {
            assert_eq!(
                super::due(now + ahead_s, attempts, now, &delays),
                expected,
                "{ahead_s} s ahead, {attempts} attempts"
            );
        }
    }

    /// After the clock was stepped back, deliveries whose due times now lie far ahead are handed
    /// out at once, each hook's in order; a retry within its delay still waits, and its hook's
    /// queue behind it, and is the next due time.
    #[test]
    fn deliveries_ahead_after_a_clock_step_back_are_handed_out_in_order() {
        let (dir, store, raw) = fixture("due-ahead");
        let now = 1_000_000_000;
        // (delivery, hook, attempts, due time ahead of now), the hooks' deliveries interleaved.
        // Hook 1: a retry set 60 s ahead, then the clock stepped back an hour, and deliveries
        // written before the step. Hook 2: written while the clock ran five years ahead.
        // Hook 3: a retry due in 30 s, and a delivery written before a step behind it.
        // Hook 4: due ones, and one written before a step.
        let rows = [
            (1, 1, 1, 3_660),
            (2, 2, 0, 5 * 365 * 86_400),
            (3, 3, 1, 30),
            (4, 4, 0, -10),
            (5, 1, 0, 3_590),
            (6, 2, 0, 5 * 365 * 86_400 + 1),
            (7, 3, 0, 3_600),
            (8, 4, 0, -5),
            (9, 1, 0, 3_600),
            (10, 2, 0, 5 * 365 * 86_400 + 1),
            (11, 4, 0, 3_600),
            (12, 1, 0, 3_600),
        ];
        for hook in 1..=4 {
            let ids: Vec<i64> = rows.iter().filter(|r| r.1 == hook).map(|r| r.0).collect();
            raw.execute(
                "INSERT INTO hooks (id, org, owner, title, active, event, constrainttype, url, contenttype, secret,
                                    pending, head, created, updated)
                 VALUES (?1, 'acme', 1, 'h', 1, 'items.create', 'all', 'http://x', 'json', 's', ?2, ?3, 0, 0)",
                (hook, ids.len() as i64, ids[0]),
            )
            .unwrap();
        }
        for (id, hook, attempts, ahead_s) in rows {
            raw.execute("INSERT INTO payloads (id, body) VALUES (?1, x'00')", [id]).unwrap();
            raw.execute(
                "INSERT INTO deliveries (id, hook_id, event, object_id, contenttype, payload_id, attempts, next_at,
                                         created)
                 VALUES (?1, ?2, 'items.create', 1, 'json', ?1, ?3, ?4, 0)",
                (id, hook, attempts, now + ahead_s),
            )
            .unwrap();
        }
        let delays = crate::limits::WEBHOOK_RETRY_DELAYS_S_DEFAULT;
        let mut taken = Vec::new();
        let (batches, next) = store
            .due_deliveries(now, &delays, &[], 32, |hook, _, tried| {
                taken.push((hook, tried));
                true
            })
            .unwrap();
        let mut handed: Vec<(i64, Vec<i64>)> =
            batches.iter().map(|b| (b[0].hook_id, b.iter().map(|o| o.id).collect())).collect();
        handed.sort();
        taken.sort();
        assert_eq!(handed, [(1, vec![1, 5, 9, 12]), (2, vec![2, 6, 10]), (4, vec![4, 8, 11])]);
        assert_eq!(taken, [(1, true), (2, false), (4, false)], "hooks taken, and whether tried before");
        assert_eq!(next, Some(now + 30));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A hook whose oldest delivery stays pending (a receiver gone for good) holds back only
    /// its own payloads: the other hooks' old deliveries go with theirs. A deleted hook goes
    /// with its last delivery.
    #[test]
    fn a_stuck_hook_holds_back_only_its_own_payloads() {
        let (dir, store, raw) = fixture("purge-stuck");
        raw.execute_batch(
            "INSERT INTO hooks (id, org, owner, title, active, event, constrainttype, url, contenttype, secret,
                                created, updated, deleted)
             VALUES (1, 'acme', 1, 'stuck', 1, 'items.create', 'all', 'http://x', 'json', 's', 0, 0, 0),
                    (2, 'acme', 1, 'gone', 0, 'items.create', 'all', 'http://y', 'json', '', 0, 0, 1);",
        )
        .unwrap();
        // Delivery 1 (hook 1) is pending; 2..=300 (hook 2, deleted since) finished long ago.
        for id in 1..=300 {
            raw.execute("INSERT INTO payloads (id, body) VALUES (?1, x'00')", [id]).unwrap();
            let (hook, state, finished) = if id == 1 { (1, 0, None) } else { (2, 2, Some(100)) };
            raw.execute(
                "INSERT INTO deliveries (id, hook_id, event, object_id, contenttype, payload_id, state, next_at, created,
                                         finished)
                 VALUES (?1, ?2, 'items.create', 1, 'json', ?1, ?3, 0, 0, ?4)",
                (id, hook, state, finished),
            )
            .unwrap();
        }
        assert_eq!(store.purge_deliveries(10_000, 1_000, 1_000).unwrap(), 299);
        let count = |sql: &str| -> i64 { raw.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(count("SELECT count(*) FROM payloads"), 1, "only the pending delivery's payload stays");
        assert_eq!(count("SELECT count(*) FROM hooks WHERE id <> 1"), 0, "the deleted hook went with its deliveries");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
