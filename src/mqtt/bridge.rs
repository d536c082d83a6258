//! The upstream bridge: the gateway's feed (data, state and alert messages) forwarded to a
//! central MQTT broker (mosquitto, EMQX, HiveMQ), so that a site's gateways feed one system.
//!
//! Every feed message is first written to a queue in the database (`bridge_queue`, bounded by
//! `bridge_queue_max`: beyond it the oldest are dropped and counted), then sent upstream at
//! QoS 1 (retained states stay retained) and removed once the upstream broker acknowledged it.
//! While upstream is down the queue grows; when it is back, the queue drains in order, except
//! that alert messages go ahead of the data and state messages queued before them (an alarm
//! raised while a long queue drains would otherwise wait behind it). A message may arrive twice
//! after a reconnect (at least once); within a connection, alerts arrive in order among
//! themselves and the rest in order among itself. One tokio task writes the queue, one talks
//! to upstream (rumqttc, on the process's runtime).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS, Transport};
use tokio::sync::{Notify, mpsc, watch};

use super::feed::FeedMessage;
use crate::limits;
use crate::store::Store;

#[derive(Clone, Debug)]
pub struct BridgeSettings {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub username: Option<String>,
    pub password: Option<String>,
    /// PEM file of the upstream's CA (default: the system's roots).
    pub ca: Option<std::path::PathBuf>,
    pub client_id: String,
    /// Put before every topic upstream (`site-a/`).
    pub prefix: String,
    pub queue_max: u64,
}

/// What /health shows of the bridge.
#[derive(Default)]
pub struct BridgeStats {
    pub connected: AtomicBool,
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
}

pub struct Bridge {
    pub tx: mpsc::Sender<FeedMessage>,
    pub stats: Arc<BridgeStats>,
    writer: tokio::task::JoinHandle<()>,
    sender: tokio::task::JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Bridge {
    pub fn start(settings: BridgeSettings, store: Arc<Store>) -> Result<Bridge, String> {
        let transport = transport(&settings)?;
        let (tx, rx) = mpsc::channel(limits::MQTT_FEED_QUEUE_MAX);
        let stats = Arc::new(BridgeStats::default());
        let queued = Arc::new(Notify::new());
        let (stop, stopped) = watch::channel(false);
        let writer = tokio::spawn(write_queue(
            rx,
            Arc::clone(&store),
            settings.queue_max,
            Arc::clone(&queued),
            Arc::clone(&stats),
        ));
        let sender = tokio::spawn(send_upstream(settings, transport, store, queued, Arc::clone(&stats), stopped));
        Ok(Bridge { tx, stats, writer, sender, stop })
    }

    /// Writes what is still in memory to the queue and stops (what is queued waits there for
    /// the next start).
    pub async fn stop(self) {
        drop(self.tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.writer).await;
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.sender).await;
    }
}

fn transport(s: &BridgeSettings) -> Result<Transport, String> {
    if !s.tls {
        return Ok(Transport::tcp());
    }
    let mut roots = rustls::RootCertStore::empty();
    match &s.ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            for cert in
                <rustls::pki_types::CertificateDer<'_> as rustls::pki_types::pem::PemObject>::pem_slice_iter(&pem)
            {
                let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
                roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(crate::http::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(config))))
}

/// Feed messages into the database queue, in batches.
async fn write_queue(
    mut rx: mpsc::Receiver<FeedMessage>,
    store: Arc<Store>,
    queue_max: u64,
    queued: Arc<Notify>,
    stats: Arc<BridgeStats>,
) {
    let mut full_said: Option<std::time::Instant> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![(first.topic, first.payload, first.retain)];
        while batch.len() < limits::MQTT_BRIDGE_BATCH_MAX {
            match rx.try_recv() {
                Ok(m) => batch.push((m.topic, m.payload, m.retain)),
                Err(_) => break,
            }
        }
        let store = Arc::clone(&store);
        let messages = batch.len() as u64;
        match tokio::task::spawn_blocking(move || store.bridge_enqueue(&batch, queue_max)).await {
            Ok(Ok(dropped)) => {
                if dropped > 0 {
                    stats.dropped.fetch_add(dropped, Ordering::Relaxed);
                    // Said once a minute at most: while upstream is away, every write drops.
                    if full_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        full_said = Some(std::time::Instant::now());
                        log::warn!(
                            "mqtt bridge: queue full ({queue_max} messages): the oldest are dropped (counted in /health)"
                        );
                    }
                }
            }
            // Not queued (a full disk): lost for upstream, and counted as such.
            Ok(Err(e)) => {
                stats.dropped.fetch_add(messages, Ordering::Relaxed);
                if !e.logged_once() {
                    log::warn!("mqtt bridge: cannot queue {messages} messages (dropped, counted in /health): {e}");
                }
            }
            Err(e) => log::warn!("mqtt bridge: queue writer failed: {e}"),
        }
        queued.notify_one();
    }
}

/// Connects, sends the queue in order, removes what upstream acknowledged; on any error starts
/// over with a new connection after a pause (1 s, doubling to 30 s).
async fn send_upstream(
    s: BridgeSettings,
    transport: Transport,
    store: Arc<Store>,
    queued: Arc<Notify>,
    stats: Arc<BridgeStats>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_secs(1);
    let mut failures = 0u64;
    // The oldest message unacknowledged when connections failed, and how many times in a row.
    let mut suspect: Option<(i64, u32)> = None;
    loop {
        let mut options = MqttOptions::new(&s.client_id, &s.host, s.port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_clean_session(true)
            .set_inflight(limits::MQTT_BRIDGE_INFLIGHT_MAX)
            .set_max_packet_size(
                limits::MQTT_PACKET_BYTES_MAX_CEILING as usize,
                limits::MQTT_PACKET_BYTES_MAX_CEILING as usize,
            )
            .set_transport(transport.clone());
        if let Some(user) = &s.username {
            options.set_credentials(user, s.password.clone().unwrap_or_default());
        }
        let (client, mut eventloop) = AsyncClient::new(options, usize::from(limits::MQTT_BRIDGE_INFLIGHT_MAX) * 2);
        let (ev_tx, mut events) = mpsc::channel(256);
        let poller = tokio::spawn(async move {
            loop {
                let ev = eventloop.poll().await;
                let failed = ev.is_err();
                if ev_tx.send(ev).await.is_err() || failed {
                    return;
                }
            }
        });
        let began = std::time::Instant::now();
        let outcome = session(&s, &client, &mut events, &store, &queued, &stats, &mut stopped).await;
        poller.abort();
        stats.connected.store(false, Ordering::Relaxed);
        match outcome {
            Session::Stopped => return,
            Session::Failed { why, connected, oldest_unacked } => {
                // A connection that held a while: the next outage starts over at 1 s (it
                // waited 30 s after any earlier long outage). One taken away within seconds,
                // again and again, is most often another client with the same id upstream:
                // that keeps backing off, and is said.
                let held = began.elapsed() >= Duration::from_millis(limits::MQTT_BRIDGE_CONNECTION_HELD_MS);
                if connected && held {
                    failures = 0;
                    backoff = Duration::from_secs(1);
                }
                // Each outage is said: its first failure and then every 20th (a long outage
                // is not a log flood).
                failures += 1;
                if failures == 1 || failures.is_multiple_of(20) {
                    let hint = if connected && !held {
                        format!(
                            " after a connection of {} ms: is another client connected upstream with the client id {:?}? (mqtt.bridge_client_id)",
                            began.elapsed().as_millis(),
                            s.client_id
                        )
                    } else {
                        String::new()
                    };
                    log::warn!("mqtt bridge: upstream {}:{} unavailable ({why}){hint}; retrying", s.host, s.port);
                }
                // A message the upstream refuses (too large for it, say) ends every connection
                // that sends it, and would hold everything behind it for good: after
                // MQTT_BRIDGE_REFUSALS_MAX connections in a row ended with it the oldest one
                // unacknowledged, it is dropped (counted, and named in the journal).
                if connected && let Some(id) = oldest_unacked {
                    let strikes = match suspect {
                        Some((same, n)) if same == id => n + 1,
                        _ => 1,
                    };
                    suspect = Some((id, strikes));
                    if strikes >= limits::MQTT_BRIDGE_REFUSALS_MAX {
                        drop_refused(&store, id, &stats).await;
                        suspect = None;
                        backoff = Duration::from_secs(1);
                    }
                }
            }
            Session::Ended => backoff = Duration::from_secs(1),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

enum Session {
    Stopped,
    Failed {
        why: String,
        /// The connection had been accepted (CONNACK) before it failed.
        connected: bool,
        /// The message sent first in the connection and not acknowledged when it failed (with
        /// alerts sent ahead, not always the oldest in the queue).
        oldest_unacked: Option<i64>,
    },
    Ended,
}

/// Removes a message the upstream keeps refusing from the queue.
async fn drop_refused(store: &Arc<Store>, id: i64, stats: &BridgeStats) {
    let store = Arc::clone(store);
    let removed = tokio::task::spawn_blocking(move || {
        let about = store.bridge_peek(id - 1, 1).ok().and_then(|m| m.into_iter().next()).filter(|m| m.id == id);
        store.bridge_delivered(&[id]).map(|()| about)
    })
    .await;
    if let Ok(Ok(about)) = removed {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        let (topic, bytes) = about.map(|m| (m.topic, m.payload.len())).unwrap_or_default();
        log::warn!(
            "mqtt bridge: upstream ended {} connections in a row while {topic:?} ({bytes} bytes) was on its way: dropped \
             (does the upstream refuse messages that large?)",
            limits::MQTT_BRIDGE_REFUSALS_MAX
        );
    }
}

async fn session(
    s: &BridgeSettings,
    client: &AsyncClient,
    events: &mut mpsc::Receiver<Result<Event, rumqttc::ConnectionError>>,
    store: &Arc<Store>,
    queued: &Notify,
    stats: &BridgeStats,
    stopped: &mut watch::Receiver<bool>,
) -> Session {
    let mut connected = false;
    // Row ids published and not yet given a packet id, in order; packet id -> row id.
    let mut unassigned: VecDeque<i64> = VecDeque::new();
    let mut in_flight: HashMap<u16, i64> = HashMap::new();
    let mut acked: Vec<i64> = Vec::new();
    // Everything up to `after` was published in order; alerts beyond it were published ahead
    // (`ahead`, up to `alerts_after`), and are skipped when the rest reaches them.
    let mut after = 0i64;
    let mut alerts_after = 0i64;
    let mut ahead: std::collections::BTreeSet<i64> = std::collections::BTreeSet::new();
    // The order in which messages not yet acknowledged were published.
    let mut sent = Sent::default();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                    connected = true;
                    stats.connected.store(true, Ordering::Relaxed);
                    log::info!("mqtt bridge: connected to {}:{}", s.host, s.port);
                }
                Some(Ok(Event::Outgoing(Outgoing::Publish(pkid)))) => {
                    if let Some(id) = unassigned.pop_front() {
                        in_flight.insert(pkid, id);
                    }
                }
                Some(Ok(Event::Incoming(Packet::PubAck(ack)))) => {
                    if let Some(id) = in_flight.remove(&ack.pkid) {
                        acked.push(id);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let oldest_unacked =
                        in_flight.values().copied().chain(unassigned.iter().copied()).min_by_key(|id| sent.order(*id));
                    return Session::Failed { why: e.to_string(), connected, oldest_unacked };
                }
                None => return Session::Ended,
            },
            _ = queued.notified() => {}
            _ = tick.tick() => {}
            _ = stopped.changed() => {
                let _ = client.disconnect().await;
                return Session::Stopped;
            }
        }
        if !acked.is_empty() {
            let ids = std::mem::take(&mut acked);
            let n = ids.len() as u64;
            let store = Arc::clone(store);
            if let Ok(Ok(ids)) = tokio::task::spawn_blocking(move || store.bridge_delivered(&ids).map(|()| ids)).await {
                stats.sent.fetch_add(n, Ordering::Relaxed);
                // Gone from the queue: an alert sent ahead is not met by the rest any more.
                for id in ids {
                    ahead.remove(&id);
                    sent.forget(id);
                }
            }
        }
        let busy = unassigned.len() + in_flight.len();
        let room = usize::from(limits::MQTT_BRIDGE_INFLIGHT_MAX).saturating_sub(busy);
        if !connected || room == 0 {
            continue;
        }
        let store2 = Arc::clone(store);
        let (from, skip) = (after.max(alerts_after), ahead.len());
        let peeked = tokio::task::spawn_blocking(move || {
            let alerts = store2.bridge_peek_alerts(from, room as u32)?;
            let rest = store2.bridge_peek(after, (room.saturating_sub(alerts.len()) + skip) as u32)?;
            Ok::<_, crate::store::StoreError>((alerts, rest))
        })
        .await;
        let Ok(Ok((alerts, rest))) = peeked else { continue };
        // The alerts take their room first (they were asked for at most `room`).
        let mut room = room.saturating_sub(alerts.len());
        for m in alerts {
            alerts_after = m.id;
            ahead.insert(m.id);
            if let Err(why) = publish(s, client, m, &mut unassigned, &mut sent).await {
                return Session::Failed { why, connected, oldest_unacked: None };
            }
        }
        for m in rest {
            if ahead.remove(&m.id) {
                after = m.id;
                continue;
            }
            if room == 0 {
                break;
            }
            room -= 1;
            after = m.id;
            if let Err(why) = publish(s, client, m, &mut unassigned, &mut sent).await {
                return Session::Failed { why, connected, oldest_unacked: None };
            }
        }
    }
}

async fn publish(
    s: &BridgeSettings,
    client: &AsyncClient,
    m: crate::store::Queued,
    unassigned: &mut VecDeque<i64>,
    sent: &mut Sent,
) -> Result<(), String> {
    let topic = format!("{}{}", s.prefix, m.topic);
    sent.note(m.id);
    client.publish(topic, QoS::AtLeastOnce, m.retain, m.payload).await.map_err(|e| e.to_string())?;
    unassigned.push_back(m.id);
    Ok(())
}

/// The order in which a connection published the messages it has not had acknowledged.
#[derive(Default)]
struct Sent {
    next: u64,
    order: HashMap<i64, u64>,
}

impl Sent {
    fn note(&mut self, id: i64) {
        self.order.insert(id, self.next);
        self.next += 1;
    }

    fn forget(&mut self, id: i64) {
        self.order.remove(&id);
    }

    /// Unknown ids (not published in this connection) come last.
    fn order(&self, id: i64) -> u64 {
        self.order.get(&id).copied().unwrap_or(u64::MAX)
    }
}
