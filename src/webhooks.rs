//! Delivering webhooks: a dispatcher thread picks, for each hook, its oldest pending delivery
//! once its time has come, and hands it to one of a few sender threads. One hook's deliveries
//! go out in order, one at a time; different hooks in parallel, so a slow or dead receiver
//! holds up only its own hook. The API never waits for any of this: it writes deliveries into
//! the outbox in its own transaction and wakes the dispatcher.
//!
//! A delivery the receiver does not accept (no 2xx answer in time) is tried again after the
//! configured delays, then marked failed and kept. Delivery is at least once: a receiver may
//! see a delivery twice after a crash between sending and recording; `X-Sitegate-Delivery`
//! carries the delivery id for deduplication.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::config::WebhooksConfig;
use crate::limits;
use crate::metrics::Metrics;
use crate::store::{Attempt, Outgoing, Store};
use crate::timefmt::now_secs;

/// Lowercase hex HMAC-SHA256 of the body, keyed by the secret.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// One hook's next deliveries for a sender, and `Store::hook_changes` as it was before they
/// were read.
struct Job {
    changes: u64,
    batch: Vec<Outgoing>,
}

pub struct Deliverer {
    wake_tx: crossbeam_channel::Sender<()>,
    stop_tx: crossbeam_channel::Sender<()>,
    /// Senders check it between deliveries, so a stop waits for one attempt at most.
    stopping: Arc<AtomicBool>,
    dispatcher: JoinHandle<()>,
}

/// What a sender reports back: the attempts it made for one hook. A long batch is reported
/// in parts, each at most `WEBHOOK_RECORD_INTERVAL_MS` of attempts, so a crash repeats only
/// what was sent since the last part; the hook is free again with its `last` part.
struct Done {
    hook_id: i64,
    attempts: Vec<Attempt>,
    last: bool,
}

impl Deliverer {
    /// The wake-up signal, before the threads start (the outbox needs it first).
    pub fn channel() -> (crossbeam_channel::Sender<()>, crossbeam_channel::Receiver<()>) {
        crossbeam_channel::bounded(1)
    }

    pub fn start(
        store: Arc<Store>,
        config: WebhooksConfig,
        metrics: Arc<Metrics>,
        wake: (crossbeam_channel::Sender<()>, crossbeam_channel::Receiver<()>),
    ) -> std::io::Result<Deliverer> {
        let (wake_tx, wake_rx) = wake;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let (job_tx, job_rx) = crossbeam_channel::bounded::<Job>(config.workers);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Done>(config.workers);
        let agent_config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_millis(config.connect_timeout_ms)))
            .timeout_global(Some(Duration::from_millis(config.timeout_ms)))
            .http_status_as_error(false)
            .max_redirects(0)
            // Every sender may hold a kept-alive connection to every receiver.
            .max_idle_connections_per_host(config.workers)
            .max_idle_connections(limits::WEBHOOK_IDLE_CONNECTIONS_MAX)
            .user_agent(format!("sitegate/{}", env!("CARGO_PKG_VERSION")))
            .tls_config(tls_config(config.ca.as_ref()))
            .build();
        let agent = ureq::Agent::with_parts(
            agent_config,
            ureq::unversioned::transport::DefaultConnector::default(),
            GuardedResolver { local_targets: config.local_targets, inner: Default::default() },
        );
        let stopping = Arc::new(AtomicBool::new(false));
        let mut senders = Vec::with_capacity(config.workers);
        for i in 0..config.workers {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            let (agent, metrics, delays) = (agent.clone(), Arc::clone(&metrics), config.retry_delays_s.clone());
            let (stopping, store) = (Arc::clone(&stopping), Arc::clone(&store));
            senders.push(std::thread::Builder::new().name(format!("webhook-send-{i}")).spawn(move || {
                lower_priority();
                for Job { changes, batch } in job_rx.iter() {
                    let Some(hook_id) = batch.first().map(|o| o.hook_id) else { continue };
                    // In order; the first one not accepted ends the batch (the rest keep their turn),
                    // and so does a change of any hook since the batch was read, the first
                    // delivery included (the rest go with its new settings).
                    let mut attempts = Vec::with_capacity(batch.len());
                    let mut reported = Instant::now();
                    let every = Duration::from_millis(limits::WEBHOOK_RECORD_INTERVAL_MS);
                    for job in batch {
                        if stopping.load(Ordering::Relaxed) || store.hook_changes() != changes {
                            break;
                        }
                        // Erased meanwhile (`sitegate erase`, another process): not sent, and
                        // the rest handed back to be read again.
                        if !store.delivery_pending(job.id) {
                            break;
                        }
                        if !attempts.is_empty() && reported.elapsed() >= every {
                            let part = std::mem::take(&mut attempts);
                            let _ = done_tx.send(Done { hook_id, attempts: part, last: false });
                            reported = Instant::now();
                        }
                        let attempt = deliver(&agent, &metrics, &delays, job);
                        let accepted = attempt.delivered;
                        attempts.push(attempt);
                        if !accepted {
                            break;
                        }
                    }
                    let _ = done_tx.send(Done { hook_id, attempts, last: true });
                }
            })?);
        }
        drop(done_tx);
        let dispatcher = std::thread::Builder::new().name("webhook-dispatch".into()).spawn(move || {
            // Senders still waiting for a receiver at the end are left behind (the process
            // ends; their deliveries go again after the restart).
            if dispatch(&store, &config, &metrics, &wake_rx, &stop_rx, job_tx, &done_rx) {
                for s in senders {
                    let _ = s.join();
                }
            }
        })?;
        Ok(Deliverer { wake_tx, stop_tx, stopping, dispatcher })
    }

    pub fn wake(&self) {
        let _ = self.wake_tx.try_send(());
    }

    /// Stops taking new deliveries; the attempts under way finish. What is still pending stays
    /// in the outbox for the next start.
    pub fn begin_stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.stop_tx.try_send(());
    }

    /// Waits for the threads (after `begin_stop`).
    pub fn join(self) {
        self.begin_stop();
        let _ = self.dispatcher.join();
    }
}

/// What the senders are busy with. A hook whose last batch failed or took longer than
/// `WEBHOOK_SLOW_BATCH_MS` is slow, and slow hooks get at most half the senders: receivers that
/// stall can hold up their own hooks, not the others (beyond one timeout when they first stall).
/// The senders as the dispatcher hands out work. Slowness belongs to a receiver (the URL's
/// scheme, host and port), not to one hook: hooks that send to a receiver that failed or was slow
/// lately, or whose oldest delivery failed before (so also after a restart), count as slow,
/// and slow ones share at most half of the senders. So a dead receiver behind many hooks
/// costs at most one timeout per sender before its hooks are held to their half.
struct Senders {
    workers: usize,
    /// Busy hooks: since when, their receiver, and whether they were taken as slow.
    busy: HashMap<i64, (Instant, String, bool)>,
    slow: HashSet<String>,
}

/// A URL's receiver: its scheme, host and port as written (`http://10.0.0.5:8080`).
/// Parsed as `api::webhooks::check_url` validated it; credentials are no part of it.
fn receiver_of(url: &str) -> String {
    let Ok(uri) = url.trim().parse::<http::Uri>() else { return url.to_ascii_lowercase() };
    let (scheme, host) = (uri.scheme_str().unwrap_or(""), uri.host().unwrap_or(""));
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{scheme}://{host}{port}").to_ascii_lowercase()
}

impl Senders {
    fn new(workers: usize) -> Senders {
        Senders { workers, busy: HashMap::new(), slow: HashSet::new() }
    }

    fn free(&self) -> usize {
        self.workers.saturating_sub(self.busy.len())
    }

    fn idle(&self) -> bool {
        self.busy.is_empty()
    }

    fn busy_hooks(&self) -> Vec<i64> {
        self.busy.keys().copied().collect()
    }

    /// Whether a hook to `url` (its oldest delivery `tried` before) counts as slow.
    fn is_slow(&self, url: &str, tried: bool) -> bool {
        tried || self.slow.contains(&receiver_of(url))
    }

    /// Whether a sender may take a hook, with `also` slow ones taken in this round besides the
    /// busy ones: slow hooks share at most half of the senders.
    fn may_take(&self, slow: bool, also_slow: usize) -> bool {
        if !slow {
            return true;
        }
        // A hook taken before its receiver was known slow counts as slow from then on: its
        // sender is held as long as the others would be.
        let slow_busy =
            self.busy.values().filter(|(_, receiver, s)| *s || self.slow.contains(receiver)).count() + also_slow;
        slow_busy < (self.workers / 2).max(1)
    }

    fn take(&mut self, hook_id: i64, url: &str, slow: bool) {
        self.busy.insert(hook_id, (Instant::now(), receiver_of(url), slow));
    }

    /// A sender's report: with its last part, the hook is free again and its receiver judged.
    fn done(&mut self, d: &Done) {
        if !d.last {
            return;
        }
        let Some((since, receiver, _)) = self.busy.remove(&d.hook_id) else { return };
        if d.attempts.iter().any(|a| !a.delivered)
            || since.elapsed() > Duration::from_millis(limits::WEBHOOK_SLOW_BATCH_MS)
        {
            // Receivers used once and failed are not remembered for ever: past the bound the
            // set starts over (they are learned again from their next batch).
            if self.slow.len() >= limits::WEBHOOK_SLOW_RECEIVERS_MAX && !self.slow.contains(&receiver) {
                self.slow.clear();
            }
            self.slow.insert(receiver);
        } else {
            self.slow.remove(&receiver);
        }
    }
}

/// Attempts the store could not record (a full disk): kept here and recorded again each poll,
/// and their hooks get nothing more meanwhile. Without this the deliveries would still be due,
/// and be sent again at once, over and over, whatever the retry delays.
#[derive(Default)]
struct Unrecorded {
    attempts: Vec<Attempt>,
    hooks: HashSet<i64>,
    last_try: Option<Instant>,
    /// Recording failed since the last success (said once, then at debug level).
    failing: bool,
}

impl Unrecorded {
    /// Records `attempts` (after any still waiting, in order), or keeps them.
    fn record(&mut self, store: &Store, attempts: &[Attempt]) {
        if attempts.is_empty() {
            return;
        }
        self.attempts.extend_from_slice(attempts);
        self.hooks.extend(attempts.iter().map(|a| a.hook_id));
        if !self.failing {
            self.retry(store, true);
        }
    }

    /// Tries to record what waits (at most once a poll interval unless `now`).
    fn retry(&mut self, store: &Store, now: bool) {
        let every = Duration::from_millis(limits::WEBHOOK_POLL_INTERVAL_MS);
        if self.attempts.is_empty() || (!now && self.last_try.is_some_and(|t| t.elapsed() < every)) {
            return;
        }
        self.last_try = Some(Instant::now());
        match store.record_attempts(&self.attempts) {
            Ok(()) => {
                if self.failing {
                    log::info!("webhooks: recorded the {} attempts that waited", self.attempts.len());
                }
                self.failing = false;
                self.attempts.clear();
                self.hooks.clear();
            }
            Err(e) if !self.failing => {
                self.failing = true;
                log::warn!("webhooks: cannot record attempts; their hooks wait until they are: {e}");
            }
            Err(e) => log::debug!("webhooks: still cannot record {} attempts: {e}", self.attempts.len()),
        }
    }
}

fn dispatch(
    store: &Store,
    config: &WebhooksConfig,
    metrics: &Metrics,
    wake_rx: &crossbeam_channel::Receiver<()>,
    stop_rx: &crossbeam_channel::Receiver<()>,
    job_tx: crossbeam_channel::Sender<Job>,
    done_rx: &crossbeam_channel::Receiver<Done>,
) -> bool {
    let mut senders = Senders::new(config.workers);
    let mut stopping_since: Option<Instant> = None;
    let mut last_purge: Option<Instant> = None;
    let mut purge_clock = crate::store::PurgeClock::new("webhook deliveries");
    let mut purged = 0usize;
    let mut last_summary: Option<Instant> = None;
    let poll = Duration::from_millis(limits::WEBHOOK_POLL_INTERVAL_MS);
    let spacing = Duration::from_millis(limits::WEBHOOK_READ_SPACING_MS);
    let mut last_read = Instant::now();
    let mut stopping = false;
    let mut unrecorded = Unrecorded::default();
    loop {
        // Record what the senders did, all in one transaction; their hooks are free again.
        let done: Vec<Done> = done_rx.try_iter().collect();
        if !done.is_empty() {
            let attempts: Vec<Attempt> = done.iter().flat_map(|d| d.attempts.iter().cloned()).collect();
            unrecorded.record(store, &attempts);
            for d in &done {
                senders.done(d);
            }
        }
        unrecorded.retry(store, false);
        if stopping {
            let since = *stopping_since.get_or_insert_with(Instant::now);
            if !senders.idle() && since.elapsed() >= Duration::from_millis(limits::WEBHOOK_SHUTDOWN_WAIT_MS) {
                unrecorded.retry(store, true);
                log::warn!(
                    "webhooks: {} deliveries still in flight at shutdown are left: they go again after the restart",
                    senders.busy.len()
                );
                return false;
            }
            if senders.idle() {
                unrecorded.retry(store, true);
                if !unrecorded.attempts.is_empty() {
                    log::warn!(
                        "webhooks: {} attempts not recorded at shutdown: those deliveries go again after the restart",
                        unrecorded.attempts.len()
                    );
                }
                break;
            }
            // Wait for the batches in flight (each sender stops after its current attempt).
            if let Ok(d) = done_rx.recv_timeout(poll) {
                unrecorded.record(store, &d.attempts);
                senders.done(&d);
            }
            continue;
        }
        // Hand out what is due: per free sender, one hook's next deliveries in order.
        let mut next_due = None;
        if senders.free() > 0 {
            last_read = Instant::now();
            // Only the hooks a sender takes now are read (their bodies are held until sent).
            let mut busy = senders.busy_hooks();
            busy.extend(unrecorded.hooks.iter().copied());
            let mut taken: HashMap<i64, bool> = HashMap::new();
            let take = |hook_id: i64, url: &str, tried: bool| {
                let slow = senders.is_slow(url, tried);
                let also_slow = taken.values().filter(|s| **s).count();
                let ok = senders.free() > taken.len() && senders.may_take(slow, also_slow);
                if ok {
                    taken.insert(hook_id, slow);
                }
                ok
            };
            let now = now_secs();
            // Before the read: a hook changed after it (its URL and secret read old) stops
            // its batch before the first delivery. Taken when a sender began it, a change
            // between the read and then was not seen, and the batch went with the old URL
            // and secret.
            let changes = store.hook_changes();
            match store.due_deliveries(now, &config.retry_delays_s, &busy, limits::WEBHOOK_BATCH_PER_HOOK, take) {
                Ok((batches, next)) => {
                    next_due = next;
                    for batch in batches {
                        let Some(first) = batch.first() else { continue };
                        let (hook_id, url) = (first.hook_id, first.url.clone());
                        senders.take(hook_id, &url, taken.get(&hook_id).copied().unwrap_or(false));
                        if job_tx.send(Job { changes, batch }).is_err() {
                            return true; // no sender left
                        }
                    }
                }
                Err(e) => log::warn!("webhooks: cannot read the outbox: {e}"),
            }
        }
        if last_purge.is_none_or(|t| t.elapsed() > Duration::from_secs(limits::WEBHOOK_PURGE_INTERVAL_S)) {
            let now = now_secs();
            let retention = i64::try_from(config.retention_days * 86_400).unwrap_or(i64::MAX);
            // One batch per round, so the purge never holds the writer for long; a full batch
            // means more to do in the next round.
            let more = match purge_clock.now_ms(store, now.saturating_mul(1000)).and_then(|purge_now_ms| {
                store.purge_deliveries(now, purge_now_ms / 1000 - retention, limits::WEBHOOK_PURGE_ROWS_MAX)
            }) {
                Ok(n) => {
                    purged += n;
                    n == limits::WEBHOOK_PURGE_ROWS_MAX as usize
                }
                Err(e) => {
                    log::warn!("webhooks: cannot purge old deliveries: {e}");
                    false
                }
            };
            if !more {
                if purged > 0 {
                    log::info!("webhooks: forgot {purged} finished deliveries older than the retention");
                }
                purged = 0;
                last_purge = Some(Instant::now());
            }
        }
        if last_summary.is_none_or(|t| t.elapsed() >= poll) {
            if let Ok((pending, failed, _)) = store.delivery_summary() {
                metrics.webhook_pending.set(pending);
                metrics.webhook_failed.set(failed);
            }
            last_summary = Some(Instant::now());
        }
        // Sleep until woken (a new delivery, a sender done), the next due time, or the poll.
        let wait = match next_due {
            Some(at) => {
                let secs = u64::try_from((at - now_secs()).max(0)).unwrap_or(0);
                poll.min(Duration::from_secs(secs)).max(Duration::from_millis(20))
            }
            None => poll,
        };
        crossbeam_channel::select! {
            recv(stop_rx) -> _ => stopping = true,
            recv(wake_rx) -> _ => {
                // New deliveries. Under a stream of writes, let them gather for a moment
                // rather than read the outbox once per write; a lone one goes at once.
                let since = last_read.elapsed();
                if since < spacing && stop_rx.recv_timeout(spacing - since).is_ok() {
                    stopping = true;
                }
            }
            recv(done_rx) -> done => {
                if let Ok(d) = done {
                    unrecorded.record(store, &d.attempts);
                    senders.done(&d);
                }
            }
            default(wait) => {}
        }
    }
    // No new jobs; the senders end when the job channel closes.
    drop(job_tx);
    true
}

/// Makes the calling thread yield the CPU to the rest of the service: sending is background
/// work that catches up when the API, the location engine and the broker leave time for it.
/// (On Linux the nice value belongs to the thread.) The dispatcher keeps the normal priority:
/// it takes the store's write lock, which the API waits for.
fn lower_priority() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), limits::WEBHOOK_SENDER_NICE) {
        log::info!("webhooks: cannot lower a sender's priority to nice {}: {e}", limits::WEBHOOK_SENDER_NICE);
    }
}

/// The URL as it goes on the wire: characters a request line cannot carry (non-ASCII, space,
/// controls) percent-encoded as UTF-8; what is already ASCII stays as the hook gives it.
fn wire_url(url: &str) -> std::borrow::Cow<'_, str> {
    const UNSAFE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ');
    percent_encoding::utf8_percent_encode(url, UNSAFE).into()
}

/// A URL's credentials (`http://user:pass@host/`) as an `Authorization: Basic` value, decoded
/// from the percent-encoding a URL carries them in (`p%40ss` is `p@ss`), and the URL without
/// them. A URL without credentials comes back as it is.
fn credentials(url: &str) -> (std::borrow::Cow<'_, str>, Option<String>) {
    use base64::Engine;
    let Some((scheme, rest)) = url.split_once("://") else { return (url.into(), None) };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else { return (url.into(), None) };
    let bare = format!("{scheme}://{host}{tail}").into();
    if userinfo.is_empty() {
        return (bare, None);
    }
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |t: &str| percent_encoding::percent_decode_str(t).decode_utf8_lossy().into_owned();
    let pair = format!("{}:{}", decode(user), decode(password));
    (bare, Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))))
}

/// The public CAs built in, or instead the site's from `[webhooks] ca`.
fn tls_config(ca: Option<&crate::config::WebhookCa>) -> ureq::tls::TlsConfig {
    let builder = ureq::tls::TlsConfig::builder().unversioned_rustls_crypto_provider(crate::http::tls::provider());
    match ca {
        None => builder.build(),
        Some(ca) => builder
            .root_certs(ureq::tls::RootCerts::new_with_certs(
                &ca.certs.iter().map(|der| ureq::tls::Certificate::from_der(der).to_owned()).collect::<Vec<_>>(),
            ))
            .build(),
    }
}

/// Resolves receivers' hosts as ureq does, without the addresses a hook must not reach:
/// loopback, link-local (a cloud's metadata service), unspecified, multicast and broadcast,
/// unless `[webhooks] local_targets` allows loopback and link-local. Judged on the resolved
/// addresses, those connected to, so a name that resolves to one (or comes to) is refused too.
#[derive(Debug)]
struct GuardedResolver {
    local_targets: bool,
    inner: ureq::unversioned::resolver::DefaultResolver,
}

impl ureq::unversioned::resolver::Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let resolved = self.inner.resolve(uri, config, timeout)?;
        let mut addrs = self.empty();
        for a in resolved.iter().filter(|a| destination_allowed(a.ip(), self.local_targets)) {
            addrs.push(*a);
        }
        if addrs.is_empty() {
            return Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                if self.local_targets {
                    "the receiver's address is not one a webhook may reach (unspecified, multicast or broadcast)"
                } else {
                    "the receiver's address is loopback or link-local: refused unless [webhooks] local_targets = true"
                },
            )));
        }
        Ok(addrs)
    }
}

/// Whether a webhook may be delivered to `ip` (see [`GuardedResolver`]).
pub fn destination_allowed(ip: std::net::IpAddr, local_targets: bool) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let (never, local) = match ip {
        IpAddr::V4(v4) => {
            (v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast(), v4.is_loopback() || v4.is_link_local())
        }
        IpAddr::V6(v6) => (v6.is_unspecified() || v6.is_multicast(), v6.is_loopback() || v6.is_unicast_link_local()),
    };
    !never && (local_targets || !local)
}

/// Sends one delivery; returns the attempt to record.
fn deliver(agent: &ureq::Agent, metrics: &Metrics, delays: &[u64], job: Outgoing) -> Attempt {
    let (url, authorization) = credentials(&job.url);
    let mut request = agent
        .post(wire_url(&url).as_ref())
        .header("Content-Type", job.contenttype.mime())
        .header("X-Sitegate-Delivery", &job.id.to_string())
        .header("X-Sitegate-Event", &job.event);
    if let Some(value) = &authorization {
        request = request.header("Authorization", value);
    }
    if !job.secret.is_empty() {
        request = request.header("X-Service-Hmac-Sha256", &signature(&job.secret, &job.body));
    }
    let (delivered, status, error) = match request.send(&job.body[..]) {
        Ok(mut response) => {
            let status = response.status().as_u16();
            if (200..300).contains(&status) {
                (true, Some(status), String::new())
            } else {
                // The answer's start, whatever its length or encoding (not UTF-8: shown lossily).
                let mut text = Vec::new();
                let _ = std::io::Read::read_to_end(
                    &mut std::io::Read::take(response.body_mut().as_reader(), limits::WEBHOOK_RESPONSE_BYTES_MAX),
                    &mut text,
                );
                (false, Some(status), format!("HTTP {status}: {}", String::from_utf8_lossy(&text).trim()))
            }
        }
        Err(e) => (false, None, e.to_string()),
    };
    let error: String = error.chars().take(limits::WEBHOOK_ERROR_CHARS_MAX).collect();
    // `attempts` counts earlier attempts; this one is attempt number attempts + 1.
    let retry_at = if delivered {
        None
    } else {
        usize::try_from(job.attempts)
            .ok()
            .and_then(|n| delays.get(n))
            // Due times are whole seconds: rounded up, so a retry never comes before its delay.
            .map(|d| (crate::timefmt::now_ms() + i64::try_from(*d).unwrap_or(i64::MAX / 4_000) * 1000 + 999) / 1000)
    };
    let outcome = if delivered {
        "delivered"
    } else if retry_at.is_some() {
        "retry"
    } else {
        "failed"
    };
    metrics.webhook_attempts.get_or_create(&crate::metrics::OutcomeLabels { outcome }).inc();
    // One that will not be sent again is a warning: a receiver that never got it.
    if !delivered && retry_at.is_none() {
        log::warn!("webhook delivery {} to {} not accepted, not sent again (failed): {error}", job.id, job.url);
    } else if !delivered {
        log::info!("webhook delivery {} to {} not accepted ({outcome}): {error}", job.id, job.url);
    }
    Attempt { delivery: job.id, hook_id: job.hook_id, delivered, status, error, retry_at }
}

#[cfg(test)]
mod tests {
    use super::destination_allowed;
    #[test]
    fn local_destinations_need_local_targets() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        for local in ["127.0.0.1", "127.1.2.3", "::1", "169.254.169.254", "fe80::1", "::ffff:127.0.0.1"] {
            assert!(!destination_allowed(ip(local), false), "{local}");
            assert!(destination_allowed(ip(local), true), "{local}");
        }
        for never in ["0.0.0.0", "::", "224.0.0.1", "255.255.255.255", "ff02::1"] {
            assert!(!destination_allowed(ip(never), true), "{never}");
        }
        for lan in ["10.1.2.3", "192.168.1.20", "172.16.0.5", "fd00::5", "203.0.113.7", "2001:db8::1"] {
            assert!(destination_allowed(ip(lan), false), "{lan}");
        }
    }

    /// Two senders, both on hooks of one receiver before anything was known of it: once one
    /// fails, the other (still on the wire) counts as on a slow hook, and no sender takes a
    /// third hook of it meanwhile.
    #[test]
    fn a_hook_taken_before_its_receiver_failed_counts_as_slow() {
        let mut senders = super::Senders::new(2);
        senders.take(1, "http://10.0.0.1/a", false);
        senders.take(2, "http://10.0.0.1/b", false);
        let attempt = crate::store::Attempt {
            delivery: 1,
            hook_id: 1,
            delivered: false,
            status: None,
            error: String::new(),
            retry_at: None,
        };
        senders.done(&super::Done { hook_id: 1, attempts: vec![attempt], last: true });
        let slow = senders.is_slow("http://10.0.0.1/c", false);
        assert!(slow);
        assert!(!senders.may_take(slow, 0), "hook 2 holds the slow receivers' half");
        assert!(senders.may_take(senders.is_slow("http://10.0.0.2/", false), 0), "another receiver");
    }
    /// Receivers that failed are remembered as slow, and a receiver that then answers in time
    /// is not; so many different ones that failed once do not grow the set without bound.
    #[test]
    fn slow_receivers_are_bounded() {
        fn batch(senders: &mut super::Senders, n: usize, delivered: bool) {
            let url = format!("http://10.0.{}.{}:80/in", n / 256, n % 256);
            senders.take(n as i64, &url, false);
            let attempt = crate::store::Attempt {
                delivery: 1,
                hook_id: n as i64,
                delivered,
                status: None,
                error: String::new(),
                retry_at: None,
            };
            senders.done(&super::Done { hook_id: n as i64, attempts: vec![attempt], last: true });
        }
        let mut senders = super::Senders::new(4);
        batch(&mut senders, 0, false);
        assert!(senders.is_slow("http://10.0.0.0:80/x", false));
        batch(&mut senders, 0, true);
        assert!(!senders.is_slow("http://10.0.0.0:80/x", false));
        for n in 0..5_000 {
            batch(&mut senders, n, false);
        }
        assert!(senders.slow.len() <= crate::limits::WEBHOOK_SLOW_RECEIVERS_MAX, "{}", senders.slow.len());
        assert!(senders.is_slow("http://10.0.19.135:80/x", false), "the newest failure is remembered");
    }

    #[test]
    fn urls_go_on_the_wire_in_ascii() {
        assert_eq!(super::wire_url("http://127.0.0.1:9/h?a=1&b=%20x#f"), "http://127.0.0.1:9/h?a=1&b=%20x#f");
        assert_eq!(super::wire_url("http://h/n?e=é😀\u{2028} x"), "http://h/n?e=%C3%A9%F0%9F%98%80%E2%80%A8%20x");
    }

    #[test]
    fn a_receiver_is_its_scheme_host_and_port() {
        assert_eq!(super::receiver_of("http://10.0.0.5:8080/a/b?c#d"), "http://10.0.0.5:8080");
        assert_eq!(super::receiver_of("https://u:p@host/x"), "https://host");
        assert_eq!(super::receiver_of("http://[::1]:9"), "http://[::1]:9");
    }

    #[test]
    fn credentials_in_a_url_are_sent_decoded_as_basic_authorization() {
        let (url, auth) = super::credentials("http://user:p%40ss@127.0.0.1:8080/in?x=a@b#f");
        assert_eq!(url, "http://127.0.0.1:8080/in?x=a@b#f");
        assert_eq!(auth.as_deref(), Some("Basic dXNlcjpwQHNz"), "user:p@ss");
        assert_eq!(super::credentials("https://host/a@b"), ("https://host/a@b".into(), None));
        assert_eq!(super::credentials("http://@host/"), ("http://host/".into(), None));
    }

    #[test]
    fn signature_is_lowercase_hex_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature("Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
