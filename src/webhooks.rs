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

use std::collections::HashSet;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::config::WebhooksConfig;
use crate::limits;
use crate::metrics::Metrics;
use crate::store::{Outgoing, Store};
use crate::timefmt::now_secs;

/// Lowercase hex HMAC-SHA256 of the body, keyed by the secret.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

pub struct Deliverer {
    wake_tx: crossbeam_channel::Sender<()>,
    stop_tx: crossbeam_channel::Sender<()>,
    dispatcher: JoinHandle<()>,
}

/// What a sender reports back: the hook is free again.
struct Done {
    hook_id: i64,
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
        let (job_tx, job_rx) = crossbeam_channel::bounded::<Outgoing>(config.workers);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Done>(config.workers);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_millis(config.connect_timeout_ms)))
            .timeout_global(Some(Duration::from_millis(config.timeout_ms)))
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(format!("sitegate/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let mut senders = Vec::with_capacity(config.workers);
        for i in 0..config.workers {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            let (store, agent, metrics, delays) =
                (Arc::clone(&store), agent.clone(), Arc::clone(&metrics), config.retry_delays_s.clone());
            senders.push(std::thread::Builder::new().name(format!("webhook-send-{i}")).spawn(move || {
                for job in job_rx.iter() {
                    let hook_id = job.hook_id;
                    deliver(&store, &agent, &metrics, &delays, job);
                    let _ = done_tx.send(Done { hook_id });
                }
            })?);
        }
        drop(done_tx);
        let dispatcher = std::thread::Builder::new().name("webhook-dispatch".into()).spawn(move || {
            dispatch(&store, &config, &metrics, &wake_rx, &stop_rx, job_tx, &done_rx);
            for s in senders {
                let _ = s.join();
            }
        })?;
        Ok(Deliverer { wake_tx, stop_tx, dispatcher })
    }

    pub fn wake(&self) {
        let _ = self.wake_tx.try_send(());
    }

    /// Stops taking new deliveries, lets the ones being sent finish, joins the threads. What is
    /// still pending stays in the outbox for the next start.
    pub fn stop(self) {
        let _ = self.stop_tx.send(());
        let _ = self.dispatcher.join();
    }
}

fn dispatch(
    store: &Store,
    config: &WebhooksConfig,
    metrics: &Metrics,
    wake_rx: &crossbeam_channel::Receiver<()>,
    stop_rx: &crossbeam_channel::Receiver<()>,
    job_tx: crossbeam_channel::Sender<Outgoing>,
    done_rx: &crossbeam_channel::Receiver<Done>,
) {
    let mut busy: HashSet<i64> = HashSet::new();
    let mut last_purge: Option<Instant> = None;
    let poll = Duration::from_millis(limits::WEBHOOK_POLL_INTERVAL_MS);
    loop {
        // Hand out what is due, to free senders, one delivery per hook.
        let free = config.workers.saturating_sub(busy.len());
        if free > 0 {
            let busy_ids: Vec<i64> = busy.iter().copied().collect();
            match store.due_deliveries(now_secs(), &busy_ids, free as u32) {
                Ok(due) => {
                    for job in due {
                        busy.insert(job.hook_id);
                        if job_tx.send(job).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => log::warn!("webhooks: cannot read the outbox: {e}"),
            }
        }
        if last_purge.is_none_or(|t| t.elapsed() > Duration::from_secs(3600)) {
            let before = now_secs() - i64::try_from(config.retention_days * 86_400).unwrap_or(i64::MAX);
            match store.purge_deliveries(before) {
                Ok(n) if n > 0 => log::info!("webhooks: forgot {n} finished deliveries older than the retention"),
                Ok(_) => {}
                Err(e) => log::warn!("webhooks: cannot purge old deliveries: {e}"),
            }
            last_purge = Some(Instant::now());
        }
        if let Ok((pending, failed, _)) = store.delivery_summary() {
            metrics.webhook_pending.set(pending);
            metrics.webhook_failed.set(failed);
        }
        // Sleep until woken (a new delivery, a free sender), the next due time, or the poll.
        let wait = match store.next_delivery_in(now_secs()) {
            Ok(Some(s)) => poll.min(Duration::from_secs(u64::try_from(s).unwrap_or(0)).max(Duration::from_millis(50))),
            _ => poll,
        };
        crossbeam_channel::select! {
            recv(stop_rx) -> _ => break,
            recv(wake_rx) -> _ => {}
            recv(done_rx) -> done => {
                if let Ok(d) = done {
                    busy.remove(&d.hook_id);
                }
            }
            default(wait) => {}
        }
        for d in done_rx.try_iter() {
            busy.remove(&d.hook_id);
        }
    }
    // Stop: no new jobs; senders finish theirs and end when the job channel closes.
    drop(job_tx);
}

/// Sends one delivery and records the outcome.
fn deliver(store: &Store, agent: &ureq::Agent, metrics: &Metrics, delays: &[u64], job: Outgoing) {
    let mut request = agent
        .post(&job.url)
        .header("Content-Type", job.contenttype.mime())
        .header("X-Sitegate-Delivery", &job.id.to_string())
        .header("X-Sitegate-Event", &job.event);
    if !job.secret.is_empty() {
        request = request.header("X-Service-Hmac-Sha256", &signature(&job.secret, &job.body));
    }
    let (delivered, status, error) = match request.send(&job.body[..]) {
        Ok(mut response) => {
            let status = response.status().as_u16();
            if (200..300).contains(&status) {
                (true, Some(status), String::new())
            } else {
                let text = response
                    .body_mut()
                    .with_config()
                    .limit(limits::WEBHOOK_RESPONSE_BYTES_MAX)
                    .read_to_string()
                    .unwrap_or_default();
                (false, Some(status), format!("HTTP {status}: {}", text.trim()))
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
            .map(|d| now_secs() + i64::try_from(*d).unwrap_or(i64::MAX / 2))
    };
    let outcome = if delivered {
        "delivered"
    } else if retry_at.is_some() {
        "retry"
    } else {
        "failed"
    };
    metrics.webhook_attempts.get_or_create(&crate::metrics::OutcomeLabels { outcome }).inc();
    if !delivered {
        log::info!("webhook delivery {} to {} not accepted ({outcome}): {error}", job.id, job.url);
    }
    if let Err(e) = store.record_attempt(job.id, delivered, status, &error, retry_at) {
        log::warn!("webhooks: cannot record delivery {}: {e}", job.id);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn signature_is_lowercase_hex_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature("Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
