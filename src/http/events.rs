//! `GET /status/events`: the status page's live feed, as server-sent events.
//!
//! The stream is served here, on the runtime, not by a worker: an open page holds a task and
//! a connection, never one of the bounded API workers. Each stream checks the database's
//! change counter every `STATUS_EVENTS_CHECK_MS` and builds the snapshot again (on the
//! runtime's blocking threads) when it changed, or every `STATUS_EVENTS_REFRESH_MS` for the
//! parts that live in memory (health, receivers); it sends the snapshot when it differs from
//! the last one sent. The caller's credentials are checked with each snapshot: a user
//! disabled or a token replaced ends the stream. While the database cannot be read (the
//! credentials not checked, the snapshot not built) the stream stays open and sends the last
//! snapshot with the gateway's time and health as they are, which say what is wrong. At most `STATUS_STREAMS_MAX` streams are
//! open at once (503 beyond); each has a queue of `STATUS_EVENTS_QUEUE_MAX` (a client that
//! does not read skips snapshots instead of holding memory). Shutdown ends every stream.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::{mpsc, watch};

use super::{ResponseBody, Shared, to_hyper};
use crate::api::{self, StatusFailure};
use crate::limits;

/// True for the stream's path (with or without a trailing slash).
pub fn is_events_path(path: &str) -> bool {
    path.trim_end_matches('/') == "/status/events"
}

/// The body of an event stream: what the stream's task queues, as it comes.
pub struct EventBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// Open streams, bounded: in all, and per user (so that one user, of any organisation,
/// cannot take every stream of the site).
#[derive(Default)]
pub struct Streams(Arc<AtomicUsize>, Arc<super::Holders<i64>>);

struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Streams {
    fn take_for(&self, user_id: i64) -> Option<super::Held<i64>> {
        self.1.take(user_id, limits::STATUS_STREAMS_PER_USER_MAX)
    }

    fn take(&self) -> Option<StreamSlot> {
        let taken = self.0.fetch_add(1, Ordering::AcqRel);
        if taken >= limits::STATUS_STREAMS_MAX {
            self.0.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(StreamSlot(Arc::clone(&self.0)))
    }
}

fn event(json: &str) -> Bytes {
    // A snapshot is one line of JSON: one `data:` line.
    Bytes::from(format!("event: snapshot\ndata: {json}\n\n"))
}

/// Answers `GET /status/events`.
pub async fn respond(
    request: api::Request,
    shared: &Shared,
    mut shutdown: watch::Receiver<bool>,
) -> hyper::Response<ResponseBody> {
    let app = Arc::clone(&shared.app);
    if request.method != http::Method::GET {
        let answer = app.method_not_allowed(&request.headers, &["GET"]);
        return to_hyper(answer);
    }
    let Some(slot) = shared.streams.take() else {
        return to_hyper(app.busy(&request.headers));
    };
    let request = Arc::new(request);
    let first = tokio::task::spawn_blocking({
        let (app, request) = (Arc::clone(&app), Arc::clone(&request));
        move || {
            // The version before the event: a write between the two is sent at the next check.
            let version = app.store.data_version().unwrap_or(0);
            let event = app.status_event(&request);
            // Every answer carries the caller's call count (the stream itself does not count).
            let quota = if event.is_ok() { app.quota_of(&request) } else { String::new() };
            (version, event, quota)
        }
    })
    .await;
    let (mut version, user_id, first, quota) = match first {
        Ok((v, Ok((user_id, json)), quota)) => (v, user_id, json, quota),
        Ok((_, Err(StatusFailure::Refused(answer)), _)) => return to_hyper(answer),
        Ok((_, Err(StatusFailure::Unreadable), _)) => return to_hyper(app.status_unreadable(&request.headers)),
        Err(_) => return to_hyper(app.busy(&request.headers)),
    };
    let Some(user_slot) = shared.streams.take_for(user_id) else {
        return to_hyper(app.busy(&request.headers));
    };
    let (tx, rx) = mpsc::channel::<Bytes>(limits::STATUS_EVENTS_QUEUE_MAX);
    // Reconnect after 3 s when the connection drops.
    let _ = tx.try_send(Bytes::from_static(b"retry: 3000\n\n"));
    let _ = tx.try_send(event(&first));
    let fallback = Arc::clone(&app);
    let headers = request.headers.clone();
    tokio::spawn(async move {
        let _slots = (slot, user_slot);
        let mut good: Arc<str> = Arc::from(first.as_str());
        let mut patched = false;
        let mut last = first;
        let mut site = site_of(&app);
        let mut built = Instant::now();
        let mut sent = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(limits::STATUS_EVENTS_CHECK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            if *shutdown.borrow() {
                break;
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
                _ = tx.closed() => break,
            }
            let (app_c, request_c) = (Arc::clone(&app), Arc::clone(&request));
            // The site map is not in the database: a reload is seen by its new map.
            let site_now = site_of(&app);
            let changed = {
                let now_version = tokio::task::spawn_blocking(move || app_c.store.data_version().unwrap_or(0)).await;
                let now_version = now_version.unwrap_or(version);
                let changed = now_version != version || site_now != site;
                (version, site) = (now_version, site_now);
                changed
            };
            let chunk = if changed || built.elapsed() >= Duration::from_millis(limits::STATUS_EVENTS_REFRESH_MS) {
                built = Instant::now();
                let app_c = Arc::clone(&app);
                let good_c = Arc::clone(&good);
                let patched_before = patched;
                let outcome = tokio::task::spawn_blocking(move || {
                    // The database cannot be read: the last snapshot, with the gateway's
                    // health as it is now (which says why), keeps the page showing it. Once
                    // so, the snapshot is tried again when the storage check passes (each try
                    // that fails is logged).
                    let patch = || Built::Patched(over(&good_c, app_c.status_unread_parts()));
                    if patched_before && app_c.storage_check().is_err() {
                        return patch();
                    }
                    match app_c.status_event(&request_c) {
                        Ok((_, json)) => Built::Fresh(json),
                        Err(StatusFailure::Unreadable) => patch(),
                        Err(StatusFailure::Refused(_)) => Built::Refused,
                    }
                })
                .await;
                patched = matches!(outcome, Ok(Built::Patched(_)));
                let json = match outcome {
                    Ok(Built::Fresh(json)) => {
                        good = Arc::from(json.as_str());
                        json
                    }
                    Ok(Built::Patched(json)) => json,
                    // Credentials no longer accepted, or a bug: the page reconnects and
                    // sees why.
                    Ok(Built::Refused) | Err(_) => break,
                };
                (json != last).then(|| {
                    let chunk = event(&json);
                    last = json;
                    chunk
                })
            } else {
                None
            };
            let chunk = chunk.or_else(|| {
                (sent.elapsed() >= Duration::from_millis(limits::STATUS_EVENTS_KEEPALIVE_MS))
                    .then(|| Bytes::from_static(b": keep-alive\n\n"))
            });
            if let Some(chunk) = chunk {
                match tx.try_send(chunk) {
                    Ok(()) => sent = Instant::now(),
                    // A client that does not read misses this one; the next change sends anew.
                    Err(mpsc::error::TrySendError::Full(_)) => last.clear(),
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                }
            }
        }
    });
    hyper::Response::builder()
        .status(200)
        .header("Content-Type", "text/event-stream; charset=utf-8")
        .header("Cache-Control", "no-cache")
        .header("X-Content-Type-Options", "nosniff")
        .header(crate::api::QUOTA_HEADER, quota)
        .body(http_body_util::Either::Right(EventBody { rx }))
        .unwrap_or_else(|_| to_hyper(fallback.busy(&headers)))
}

/// A snapshot built anew, or the last one with what needs no reads put over it.
enum Built {
    Fresh(String),
    Patched(String),
    Refused,
}

/// The snapshot `last` with `parts` put over its own.
fn over(last: &str, parts: serde_json::Map<String, serde_json::Value>) -> String {
    let mut snapshot = match serde_json::from_str::<serde_json::Value>(last) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    snapshot.extend(parts);
    serde_json::Value::Object(snapshot).to_string()
}

/// Which site map is in force (its address: a reload puts a new one in place).
fn site_of(app: &crate::api::App) -> usize {
    let state = app.site.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    Arc::as_ptr(&state.site) as usize
}
