//! The embedded MQTT broker: rmqtt (pinned in Cargo.toml) behind this one module. Nothing
//! else imports rmqtt. It binds the listener itself (so bind errors come back as errors and
//! port 0 works), authenticates against the store, enforces the per-organisation topic rules
//! of [`super::acl`] on subscriptions, publishes and will messages, keeps retained messages
//! (device states) until they are replaced, and takes the gateway's own publishes in process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rmqtt::codec::types::QoS;
use rmqtt::codec::v5::{PublishProperties, SubscribeAckReason};
use rmqtt::context::ServerContext;
use rmqtt::hook::{Handler, HookResult, Parameter, ReturnType, Type};
use rmqtt::net::Builder;
use rmqtt::retain::{DefaultRetainStorage, RetainStorage};
use rmqtt::server::MqttServer;
use rmqtt::session::SessionState;
use rmqtt::types::{
    AuthResult, ClientId, CodecPublish, From, Id, LastWill, Publish, PublishAclResult, Retain, SubscribeAclResult,
    TopicFilter, TopicName, UserName,
};
use subtle::ConstantTimeEq;

use super::acl::{self, Principal};
use super::ingest::{Ingest, IngestError};
use crate::limits;
use crate::store::Store;

/// What the broker is asked to be (from `[mqtt]`).
#[derive(Clone, Debug)]
pub struct BrokerSettings {
    pub listen: SocketAddr,
    pub connections_max: usize,
    pub packet_bytes_max: u32,
    pub client_queue_max: usize,
    pub handshake_timeout_ms: u64,
    /// Interoperability testing only: every authenticated client may use every topic.
    pub open_topics: bool,
    pub tls: Option<TlsSettings>,
}

/// MQTT over TLS: a listener for username and password, and optionally one that requires a
/// client certificate of the site CA (`client_cert`: its address and the CA file).
#[derive(Clone, Debug)]
pub struct TlsSettings {
    pub listen: SocketAddr,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_cert: Option<(SocketAddr, std::path::PathBuf)>,
}

/// Counters the broker keeps for /metrics and /health.
#[derive(Default)]
pub struct BrokerStats {
    /// Clients connected now.
    pub connections: std::sync::atomic::AtomicI64,
    /// The broker's context, for the sessions it holds (see [`BrokerStats::sessions`]).
    scx: Mutex<Option<ServerContext>>,
    pub auth_refused: AtomicU64,
    pub subscribe_refused: AtomicU64,
    pub publish_refused: AtomicU64,
    pub dropped: AtomicU64,
    pub published: AtomicU64,
    /// Feed messages the engine could not queue for the broker (queue full).
    pub feed_dropped: AtomicU64,
}

impl BrokerStats {
    /// Sessions held: those connected, and persistent ones whose client is away (each holds
    /// memory, queued messages and an open file until it ends). Read from the broker when
    /// asked: it forgets a session after the hook that says it ended has run.
    pub fn sessions(&self) -> i64 {
        let scx = self.scx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        scx.as_ref().map_or(0, |scx| i64::try_from(scx.sessions.count()).unwrap_or(i64::MAX))
    }
}

/// A running broker. Dropping it does not stop it: call [`Broker::stop`].
pub struct Broker {
    scx: ServerContext,
    /// Opens the listeners to clients ([`Broker::open`]); until then they wait in the backlog.
    gate: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
    /// Closes connections that never send a CONNECT (`super::reaper`).
    reaper: tokio::task::JoinHandle<()>,
    pub addr: SocketAddr,
    /// The TLS listener's address, and the client-certificate listener's.
    pub tls_addr: Option<SocketAddr>,
    pub client_cert_addr: Option<SocketAddr>,
    pub stats: Arc<BrokerStats>,
}

/// The gateway's own way into the broker (no loopback client, no ACL: it is the gateway).
#[derive(Clone)]
pub struct Publisher {
    scx: ServerContext,
    from: From,
    stats: Arc<BrokerStats>,
}

impl Broker {
    /// Binds the listeners and starts the broker on the current tokio runtime; clients are
    /// served from [`Broker::open`] on (the gateway publishes what it restored first).
    pub async fn start(
        settings: &BrokerSettings,
        store: Arc<Store>,
        stats: Arc<BrokerStats>,
        ingest: Arc<Ingest>,
        throttle: Arc<crate::auth::Throttle>,
    ) -> Result<Broker, String> {
        let scx = ServerContext::new()
            // The busy check refuses CONNECTs when the load average is high: a small gateway
            // under load must still take its intercoms.
            .busy_check_enable(false)
            .mqtt_max_sessions(isize::try_from(settings.connections_max).unwrap_or(isize::MAX))
            .build()
            .await;
        *stats.scx.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(scx.clone());
        *scx.extends.retain_mut().await = Box::new(RetainStore::default());
        *scx.extends.shared_subscription_mut().await = Box::new(SharedRoundRobin::default());
        *scx.extends.fitter_mgr_mut().await = Box::new(KeepAliveCap);
        let greeted = Arc::new(super::reaper::Greeted::default());
        let hooks = Arc::new(Hooks {
            store,
            open_topics: settings.open_topics,
            principals: Mutex::new(HashMap::new()),
            sessions_max: settings.connections_max,
            scx: scx.clone(),
            stats: Arc::clone(&stats),
            ingest,
            throttle,
            greeted: Arc::clone(&greeted),
        });
        let register = scx.extends.hook_mgr().register();
        for typ in [
            Type::ClientConnect,
            Type::ClientAuthenticate,
            Type::ClientSubscribeCheckAcl,
            Type::MessagePublishCheckAcl,
            Type::SessionTerminated,
            Type::MessageDropped,
            Type::ClientConnected,
            Type::ClientDisconnected,
        ] {
            register.add(typ, Box::new(HookHandler(Arc::clone(&hooks)))).await;
        }
        register.start().await;

        let inflight = NonZeroU16::new(limits::MQTT_INFLIGHT_MAX).unwrap_or(NonZeroU16::MIN);
        let builder = |name: &str, addr: SocketAddr| {
            Builder::new()
                .name(name)
                .laddr(addr)
                .reuseaddr(Some(true))
                // Written at once: with Nagle's algorithm an alert could wait for the ACK of
                // the message before it (docs/dev/decisions.md).
                .nodelay(true)
                .allow_anonymous(false)
                .max_connections(settings.connections_max)
                .max_handshaking_limit(limits::MQTT_CONNECTIONS_MAX_DEFAULT.min(settings.connections_max))
                .max_packet_size(settings.packet_bytes_max)
                .max_mqueue_len(settings.client_queue_max)
                .max_inflight(inflight)
                .handshake_timeout(Duration::from_millis(settings.handshake_timeout_ms))
                .session_expiry_interval(Duration::from_secs(limits::MQTT_SESSION_EXPIRY_S))
                .max_session_expiry_interval(Duration::from_secs(limits::MQTT_SESSION_EXPIRY_S))
                .max_subscriptions(limits::MQTT_SUBSCRIPTIONS_PER_CLIENT_MAX)
                .max_topic_levels(limits::MQTT_TOPIC_LEVELS_MAX)
                .max_clientid_len(limits::MQTT_CLIENT_ID_BYTES_MAX)
                // Messages queued for an offline persistent session wait as long as the
                // session (its expiry runs on the monotonic clock), unless their publisher set
                // an MQTT 5 expiry: rmqtt ages a message by the wall clock, so a step of the
                // clock forward (NTP setting it) let a session's queued alarms go unsent.
                .message_expiry_interval(Duration::ZERO)
        };
        let bound = |l: rmqtt::Result<rmqtt::net::Listener>, addr: SocketAddr| {
            l.map_err(|e| format!("cannot listen for MQTT on {addr}: {e}"))
        };
        let tcp = bound(builder("mqtt", settings.listen).bind().and_then(|l| l.tcp()), settings.listen)?;
        let addr = tcp.local_addr().map_err(|e| format!("MQTT listener: {e}"))?;
        let mut server = MqttServer::new(scx.clone()).listener_by_id(tcp, 1);
        let (mut tls_addr, mut client_cert_addr) = (None, None);
        if let Some(t) = &settings.tls {
            let path = |p: &std::path::Path| Some(p.display().to_string());
            let tls = builder("mqtts", t.listen).tls_cert(path(&t.cert)).tls_key(path(&t.key));
            let tls = bound(tls.bind().and_then(|l| l.tls()), t.listen)?;
            tls_addr = Some(tls.local_addr().map_err(|e| format!("MQTT TLS listener: {e}"))?);
            server = server.listener_by_id(tls, 2);
            if let Some((listen, ca)) = &t.client_cert {
                let mtls = builder("mqtts-client-cert", *listen)
                    .tls_cert(path(&t.cert))
                    .tls_key(path(&t.key))
                    .tls_cross_certificate(true)
                    .tls_client_ca_certs(path(ca))
                    .collect_cert_info(true);
                let mtls = bound(mtls.bind().and_then(|l| l.tls()), *listen)?;
                client_cert_addr = Some(mtls.local_addr().map_err(|e| format!("MQTT TLS listener: {e}"))?);
                server = server.listener_by_id(mtls, 3);
            }
        }
        // Started with `run`, not `start`: rmqtt's `start` exits the process when running fails.
        let server = server.build();
        let (gate, opened) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            // Not opened (the start failed after this): never served.
            if opened.await.is_ok()
                && let Err(e) = server.run().await
            {
                log::error!("MQTT broker stopped: {e}");
            }
        });
        let ports = [Some(addr), tls_addr, client_cert_addr].into_iter().flatten().map(|a| a.port()).collect();
        let timeout = Duration::from_millis(settings.handshake_timeout_ms);
        let reaper = tokio::spawn(super::reaper::run(ports, timeout, greeted));
        Ok(Broker { scx, gate: Some(gate), server, reaper, addr, tls_addr, client_cert_addr, stats })
    }

    /// Serves clients from now on.
    pub fn open(&mut self) {
        if let Some(gate) = self.gate.take() {
            let _ = gate.send(());
        }
    }

    pub fn publisher(&self) -> Publisher {
        let id = Id::new(
            self.scx.node.id(),
            0,
            None,
            None,
            ClientId::from_static("sitegate"),
            Some(UserName::from("sitegate")),
        );
        Publisher { scx: self.scx.clone(), from: From::from_system(id), stats: Arc::clone(&self.stats) }
    }

    /// Stops accepting; open connections end with the runtime.
    pub fn stop(self) {
        self.reaper.abort();
        self.server.abort();
        // The context holds the hooks, which hold the counters: let go of it.
        self.stats.scx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    }
}

impl Publisher {
    /// Publishes one message to every matching subscriber (QoS 1), and keeps it as the
    /// topic's retained message when `retain` is set.
    pub async fn publish(&self, topic: String, payload: Vec<u8>, retain: bool) {
        let p = CodecPublish {
            dup: false,
            retain,
            qos: QoS::AtLeastOnce,
            topic: TopicName::from(topic),
            packet_id: None,
            payload: bytes::Bytes::from(payload),
            properties: Some(PublishProperties::default()),
        };
        let p = Publish::from(p).create_time(rmqtt::utils::timestamp_millis());
        match SessionState::forwards(&self.scx, self.from.clone(), p, false, None).await {
            Ok(()) => {
                self.stats.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => log::warn!("mqtt: cannot publish: {e}"),
        }
    }
}

struct Hooks {
    store: Arc<Store>,
    open_topics: bool,
    /// The principal of each client id with a session, and the connection that made it.
    principals: Mutex<HashMap<String, Held>>,
    /// Sessions the broker keeps at most (bounds the entries with a session).
    sessions_max: usize,
    scx: ServerContext,
    stats: Arc<BrokerStats>,
    ingest: Arc<Ingest>,
    /// Failed logins per client address, shared with the API.
    throttle: Arc<crate::auth::Throttle>,
    /// Peers that sent a CONNECT (the others are closed after the handshake timeout).
    greeted: Arc<super::reaper::Greeted>,
}

struct HookHandler(Arc<Hooks>);

/// The principal of a client id, from the CONNECT that authenticated it (its `create_time`);
/// `live` once that connection got its session.
struct Held {
    /// Shared: every PUBLISH looks it up (a clone is a count, not a copy of the org's name).
    principal: Arc<Principal>,
    create_time: i64,
    live: bool,
}

impl Hooks {
    fn principal(&self, client_id: &str) -> Option<Arc<Principal>> {
        self.principals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(client_id)
            .map(|h| Arc::clone(&h.principal))
    }

    /// Username and password against the store (off the runtime's threads).
    async fn check_password(&self, username: &str, password: &[u8]) -> Option<Principal> {
        let store = Arc::clone(&self.store);
        let name = username.to_string();
        let found = tokio::task::spawn_blocking(move || store.mqtt_user(&name)).await;
        let presented = crate::auth::token_hash(std::str::from_utf8(password).unwrap_or(""));
        let user = match found {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => {
                log::warn!("mqtt: cannot read the credentials of {username:?}: {e}");
                None
            }
            Err(_) => None,
        };
        // Unknown users are compared against a dummy: the same work either way.
        let expected = user.as_ref().map_or(&[0u8; 32][..], |u| u.password_sha256.as_slice());
        let equal: bool = expected.ct_eq(&presented).into();
        match user {
            Some(u) if equal => Some(Principal { org: u.org, receiver: u.receiver, unrestricted: self.open_topics }),
            _ => None,
        }
    }

    /// A client certificate of the site CA (the TLS layer verified it): its subject's O is
    /// the organisation, OU `receiver` marks a receiver.
    async fn check_certificate(&self, cert: &rmqtt::codec::cert::CertInfo) -> Option<Principal> {
        let org = cert.organization.clone()?;
        let store = Arc::clone(&self.store);
        let known = {
            let org = org.clone();
            tokio::task::spawn_blocking(move || store.organization_exists(&org)).await
        };
        if !matches!(known, Ok(Ok(true))) {
            log::info!("mqtt: refused a client certificate of unknown organisation {org:?}");
            return None;
        }
        let receiver = cert.subject.split(',').any(|part| part.trim() == format!("OU={}", super::certs::RECEIVER_OU));
        Some(Principal { org, receiver, unrestricted: self.open_topics })
    }

    /// With as many sessions as the broker may hold, a client new to it would be refused:
    /// sessions of clients that are gone (persistent ones, kept for their return) count too,
    /// so a client that connects with ever new client ids and clean session off would lock
    /// everyone out. The session gone longest is ended instead (its queued messages with it).
    async fn make_room(&self, id: &rmqtt::types::Id) {
        let max = isize::try_from(self.sessions_max).unwrap_or(isize::MAX);
        if self.scx.sessions.count() < max || self.scx.extends.shared().await.exist(&id.client_id) {
            return;
        }
        let mut oldest: Option<(i64, rmqtt::types::Id)> = None;
        {
            let shared = self.scx.extends.shared().await;
            for entry in shared.iter() {
                let Some(session) = entry.session() else { continue };
                if session.connected().await.unwrap_or(true) {
                    continue;
                }
                let gone = session.disconnected_at().await.unwrap_or(0);
                if oldest.as_ref().is_none_or(|(t, _)| gone < *t) {
                    oldest = Some((gone, entry.id()));
                }
            }
        }
        let Some((_, gone)) = oldest else { return };
        let entry = self.scx.extends.shared().await.entry(gone.clone());
        if let Ok(mut locked) = entry.try_lock().await {
            let _ = locked.kick(true, true, false).await;
        }
        for _ in 0..limits::MQTT_RECONNECT_WAIT_STEPS {
            if self.scx.sessions.count() < max {
                break;
            }
            tokio::time::sleep(Duration::from_millis(limits::MQTT_RECONNECT_WAIT_STEP_MS)).await;
        }
        log::warn!(
            "mqtt: {} sessions held (connections_max); the one of {:?}, disconnected longest, ended to let {:?} in",
            self.sessions_max,
            gone.client_id,
            id.client_id
        );
    }

    async fn authenticate(&self, ci: &rmqtt::types::ConnectInfo) -> AuthResult {
        let username = ci.username().map(|u| u.to_string()).unwrap_or_default();
        let principal = if let Some(cert) = ci.cert() {
            match self.check_certificate(cert).await {
                Some(p) => p,
                None => return AuthResult::NotAuthorized,
            }
        } else {
            let (Some(_), Some(password)) = (ci.username(), ci.password()) else {
                return AuthResult::BadUsernameOrPassword;
            };
            let peer = ci.ipaddress().map(|a| a.ip());
            let from = peer.map_or_else(|| "an unknown address".to_string(), |p| p.to_string());
            let now_ms = self.throttle.now_ms();
            // As for the API: from a locked-out address only a password that fails is refused
            // (passwords are random), the lockout said once, not at every retry.
            let locked = matches!(self.throttle.gate(peer, now_ms), crate::auth::Gate::Locked(_));
            match self.check_password(&username, password).await {
                Some(p) => p,
                None if locked => {
                    log::debug!("mqtt: refused {username:?} from {from}: locked out after failed logins");
                    return AuthResult::NotAuthorized;
                }
                None => {
                    log::info!("mqtt: refused {username:?} from {from}: bad username or password");
                    if self.throttle.failed(peer, now_ms) {
                        log::warn!("mqtt: failed logins from {from}: address locked out");
                    }
                    return AuthResult::BadUsernameOrPassword;
                }
            }
        };
        // A will message is published later on the client's behalf: its topic obeys the same
        // rules as the client's own publishes.
        if let Some(will) = ci.last_will() {
            let topic = match will {
                LastWill::V3(w) => &w.topic,
                LastWill::V5(w) => &w.topic,
            };
            if !acl::may_publish(&principal, topic) {
                log::info!("mqtt: refused {username:?}: will topic {topic:?} is not its own");
                return AuthResult::NotAuthorized;
            }
        }
        let client_id = ci.client_id().to_string();
        // A client id whose session belongs to another organisation is not taken over (its
        // subscriptions and queued messages would change hands).
        let held = self.principal(&client_id).map(|p| p.org.clone());
        if held.is_some_and(|org| org != principal.org) && self.scx.extends.shared().await.exist(&client_id) {
            log::info!("mqtt: refused {username:?}: client id {client_id:?} is in use by another organisation");
            return AuthResult::NotAuthorized;
        }
        // A client that reconnects at once finds its old session still closing, and the
        // broker would answer "server unavailable": give the closing a moment (bounded).
        for _ in 0..limits::MQTT_RECONNECT_WAIT_STEPS {
            let entry = self.scx.extends.shared().await.entry(ci.id().clone());
            if entry.try_lock().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(limits::MQTT_RECONNECT_WAIT_STEP_MS)).await;
        }
        let mut map = self.principals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A CONNECT refused after this point never gets a session (nor SessionTerminated):
        // beyond the sessions the broker may hold, such entries older than a handshake go.
        if map.len() >= self.sessions_max {
            let before = rmqtt::utils::timestamp_millis() - limits::MQTT_HANDSHAKE_TIMEOUT_MS_CEILING as i64;
            map.retain(|_, h| h.live || h.create_time > before);
        }
        map.insert(client_id, Held { principal: Arc::new(principal), create_time: ci.id().create_time, live: false });
        AuthResult::Allow(false, None)
    }
}

#[async_trait]
impl Handler for HookHandler {
    async fn hook(&self, param: &Parameter, acc: Option<HookResult>) -> ReturnType {
        let h = &self.0;
        match param {
            Parameter::ClientConnect(ci) => {
                if let Some(peer) = ci.id().remote_addr {
                    h.greeted.insert(peer);
                }
                h.make_room(ci.id()).await;
                (true, acc)
            }
            Parameter::ClientAuthenticate(ci) => {
                let result = h.authenticate(ci).await;
                if !matches!(result, AuthResult::Allow(..)) {
                    h.stats.auth_refused.fetch_add(1, Ordering::Relaxed);
                }
                (false, Some(HookResult::AuthResult(result)))
            }
            Parameter::ClientSubscribeCheckAcl(session, subscribe) => {
                let allowed =
                    h.principal(&session.id.client_id).is_some_and(|p| acl::may_subscribe(&p, &subscribe.topic_filter));
                let result = if allowed {
                    SubscribeAclResult::new_success(subscribe.opts.qos(), None)
                } else {
                    h.stats.subscribe_refused.fetch_add(1, Ordering::Relaxed);
                    SubscribeAclResult::new_failure(SubscribeAckReason::NotAuthorized)
                };
                (false, Some(HookResult::SubscribeAclResult(result)))
            }
            Parameter::MessagePublishCheckAcl(session, publish) => {
                let principal = h.principal(&session.id.client_id);
                let allowed = principal.as_ref().is_some_and(|p| acl::may_publish(p, &publish.topic));
                let result = if allowed {
                    // A receiver's adverts go to the engine once the ACL has let them through
                    // (only receivers, and `open_topics` test setups, may publish there). Taken
                    // here rather than in a `MessagePublish` hook, which would cost every message
                    // a second call into the hook manager.
                    if acl::is_ingest(&publish.topic) && h.ingest.closed.load(Ordering::SeqCst) {
                        // Stopping: not acknowledged, and the receiver disconnected, rather than
                        // acknowledged and never taken (a panic press lost at a restart).
                        return (false, Some(HookResult::PublishAclResult(PublishAclResult::rejected(true, None))));
                    }
                    if let Some(p) = principal.filter(|_| acl::is_ingest(&publish.topic)) {
                        // ... and to no subscriber: raw adverts carry the addresses of every phone
                        // that passes, and an `{org}/#` subscriber (an intercom) would have its
                        // queue flooded with them, alerts and all. Not routed, still acknowledged
                        // (MQTT 5: 0x10, accepted with no matching subscribers).
                        let taken = PublishAclResult(rmqtt::types::PublishResult::reason_code(
                            rmqtt::codec::v5::PublishAckReason::NoMatchingSubscribers,
                            None,
                            false,
                        ));
                        match h.ingest.publish(&p.org, &publish.topic, &publish.payload, crate::timefmt::now_ms()) {
                            Ok(_) => {}
                            // ESPresense nodes also publish their rooms' telemetry and settings.
                            Err(IngestError::NotIngest) if publish.topic.starts_with("espresense/") => {}
                            Err(e) => {
                                h.ingest.rejected.fetch_add(1, Ordering::Relaxed);
                                log::debug!("mqtt: {:?} on {:?} not taken: {e:?}", session.id.client_id, publish.topic);
                            }
                        }
                        return (false, Some(HookResult::PublishAclResult(taken)));
                    }
                    PublishAclResult::allow()
                } else {
                    h.stats.publish_refused.fetch_add(1, Ordering::Relaxed);
                    PublishAclResult::rejected(false, None)
                };
                (false, Some(HookResult::PublishAclResult(result)))
            }
            Parameter::SessionTerminated(session, _) => {
                let mut map = h.principals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let client_id: &str = &session.id.client_id;
                // Only if no newer connection with the same client id took the entry over.
                if map.get(client_id).is_some_and(|h| h.create_time == session.id.create_time) {
                    map.remove(client_id);
                }
                drop(map);
                (true, acc)
            }
            Parameter::ClientConnected(session) => {
                h.stats.connections.fetch_add(1, Ordering::Relaxed);
                let mut map = h.principals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(held) = map.get_mut::<str>(&session.id.client_id)
                    && held.create_time == session.id.create_time
                {
                    held.live = true;
                }
                (true, acc)
            }
            Parameter::ClientDisconnected(..) => {
                h.stats.connections.fetch_sub(1, Ordering::Relaxed);
                (true, acc)
            }
            // Refused and ingested publishes are not routed, which rmqtt reports as dropped:
            // counted elsewhere (publish_refused) or not lost at all.
            Parameter::MessageDropped(_, _, _, rmqtt::types::Reason::PublishResult(_)) => (true, acc),
            Parameter::MessageDropped(..) => {
                h.stats.dropped.fetch_add(1, Ordering::Relaxed);
                (true, acc)
            }
            _ => (true, acc),
        }
    }
}

/// Retained messages in memory, kept until replaced (or until their own MQTT 5 expiry): the
/// broker's default forgets them after five minutes. Device states are published again from
/// the database at start, so a restart restores them.
#[derive(Default)]
struct RetainStore {
    inner: DefaultRetainStorage,
    /// What each retained topic is counted as (`MQTT_RETAINED_BYTES_MAX`) and when it
    /// expires, and their sum: bounded by `MQTT_RETAINED_BYTES_MAX` as their number is by
    /// `MQTT_RETAINED_MAX`.
    sizes: Mutex<Sizes>,
    /// When a refusal was last logged (one line a minute at most).
    refused_said: Mutex<Option<std::time::Instant>>,
}

#[derive(Default)]
/// The retained messages clients published (the feed's device states are not counted: one per
/// device, bounded by the device table, and a client must not be able to crowd them out).
struct Sizes {
    topics: HashMap<String, (usize, Option<std::time::Instant>)>,
    total: usize,
    /// When messages past their expiry were last let go.
    swept: Option<std::time::Instant>,
}

/// What a retained message counts against `MQTT_RETAINED_BYTES_MAX`.
fn retained_bytes(topic: &str, payload: usize) -> usize {
    payload + 4 * topic.len() + limits::MQTT_RETAINED_OVERHEAD_BYTES
}

impl RetainStore {
    /// Lets go of the messages past their own expiry, at most every
    /// `MQTT_RETAINED_SWEEP_INTERVAL_MS` (the broker stops delivering them at once, but
    /// keeps them until then).
    async fn sweep(&self) {
        let now = std::time::Instant::now();
        {
            let mut sizes = self.sizes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let every = Duration::from_millis(limits::MQTT_RETAINED_SWEEP_INTERVAL_MS);
            if sizes.swept.is_some_and(|t| now.duration_since(t) < every) {
                return;
            }
            sizes.swept = Some(now);
            let Sizes { topics, total, .. } = &mut *sizes;
            topics.retain(|_, (size, expires)| {
                let keep = expires.is_none_or(|at| at > now);
                if !keep {
                    *total -= *size;
                }
                keep
            });
        }
        self.inner.remove_expired_messages().await;
    }

    fn say_refused(&self, why: std::fmt::Arguments<'_>) {
        let mut said = self.refused_said.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            *said = Some(std::time::Instant::now());
            log::warn!("mqtt: {why}");
        }
    }
}

#[async_trait]
impl RetainStorage for RetainStore {
    fn enable(&self) -> bool {
        true
    }

    async fn set(&self, topic: &TopicName, retain: Retain, _default_expiry: Option<Duration>) -> rmqtt::Result<()> {
        let own_expiry = retain
            .publish
            .properties
            .as_ref()
            .and_then(|p| p.message_expiry_interval)
            .map(|s| Duration::from_secs(u64::from(s.get())));
        self.sweep().await;
        if super::acl::is_feed_topic(topic) {
            // The gateway's own device state: always kept.
            return self.inner.set_with_timeout(topic, retain, own_expiry).await;
        }
        let payload = retain.publish.payload.len();
        if payload > 0 && topic.len() > limits::MQTT_RETAINED_TOPIC_BYTES_MAX {
            self.say_refused(format_args!(
                "a retained message's topic of {} bytes is longer than {}; not retained",
                topic.len(),
                limits::MQTT_RETAINED_TOPIC_BYTES_MAX
            ));
            return Ok(());
        }
        let size = if payload == 0 { 0 } else { retained_bytes(topic, payload) };
        {
            let mut sizes = self.sizes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let Sizes { topics, total, .. } = &mut *sizes;
            if topics.len() >= limits::MQTT_RETAINED_MAX && size > 0 && !topics.contains_key(&**topic) {
                drop(sizes);
                self.say_refused(format_args!(
                    "{} retained messages kept already; {topic:?} (and others) not retained",
                    limits::MQTT_RETAINED_MAX
                ));
                return Ok(());
            }
            let old = topics.get(&**topic).map_or(0, |t| t.0);
            if size > old && *total - old + size > limits::MQTT_RETAINED_BYTES_MAX {
                drop(sizes);
                self.say_refused(format_args!(
                    "retained messages hold {} bytes already; {:?} (and others) not retained",
                    limits::MQTT_RETAINED_BYTES_MAX,
                    topic.chars().take(100).collect::<String>()
                ));
                return Ok(());
            }
            *total = *total - old + size;
            if size == 0 {
                topics.remove(&**topic);
            } else {
                let expires = own_expiry.map(|e| std::time::Instant::now() + e);
                topics.insert(topic.to_string(), (size, expires));
            }
        }
        self.inner.set_with_timeout(topic, retain, own_expiry).await
    }

    async fn get(&self, topic_filter: &TopicFilter) -> rmqtt::Result<Vec<(TopicName, Retain)>> {
        self.inner.get_message(topic_filter).await
    }

    async fn count(&self) -> isize {
        self.inner.count().await
    }

    async fn max(&self) -> isize {
        self.inner.max().await
    }
}

/// `$share/{group}/{filter}`: each message to one subscriber of the group, in turn, preferring
/// those online (the broker's default has no shared subscriptions).
#[derive(Default)]
struct SharedRoundRobin {
    next: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl rmqtt::subscribe::SharedSubscription for SharedRoundRobin {
    fn is_supported(&self) -> bool {
        true
    }

    async fn choice(
        &self,
        _scx: &ServerContext,
        _group: &rmqtt::types::SharedGroup,
        _publisher: &Id,
        _topic: &TopicName,
        members: &[(
            rmqtt::types::NodeId,
            ClientId,
            rmqtt::types::SubscriptionOptions,
            Option<Vec<rmqtt::types::SubscriptionIdentifier>>,
            Option<rmqtt::types::IsOnline>,
        )],
    ) -> Option<(usize, rmqtt::types::IsOnline)> {
        if members.is_empty() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = members.len();
        (0..n)
            .map(|k| (start + k) % n)
            .find(|i| members[*i].4.unwrap_or(true))
            .map(|i| (i, true))
            .or(Some((start % n, false)))
    }
}

/// MQTT 5 clients are told to keep alive at most every `MQTT_KEEPALIVE_MAX_S` (the CONNACK's
/// Server Keep Alive), so a dead intercom is noticed within a minute and a half; MQTT 3.1.1
/// has no way to say so, and its clients keep the interval they asked for. The rest is the
/// broker's default.
struct KeepAliveCap;

impl rmqtt::fitter::FitterManager for KeepAliveCap {
    fn create(
        &self,
        conn_info: Arc<rmqtt::types::ConnectInfo>,
        id: Id,
        cfg: rmqtt::types::ListenerConfig,
    ) -> rmqtt::types::FitterType {
        let v5 = conn_info.proto_ver() == rmqtt::codec::types::MQTT_LEVEL_5;
        Arc::new(CappedFitter { v5, inner: rmqtt::fitter::DefaultFitter::new(conn_info, id, cfg) })
    }
}

struct CappedFitter {
    v5: bool,
    inner: rmqtt::fitter::DefaultFitter,
}

#[async_trait]
impl rmqtt::fitter::Fitter for CappedFitter {
    fn keep_alive(&self, keep_alive: &mut u16) -> rmqtt::Result<u16> {
        if self.v5 && *keep_alive > limits::MQTT_KEEPALIVE_MAX_S {
            *keep_alive = limits::MQTT_KEEPALIVE_MAX_S;
        }
        self.inner.keep_alive(keep_alive)
    }

    fn max_mqueue_len(&self) -> usize {
        self.inner.max_mqueue_len()
    }

    fn mqueue_rate_limit(&self) -> (std::num::NonZeroU32, Duration) {
        self.inner.mqueue_rate_limit()
    }

    fn max_inflight(&self) -> NonZeroU16 {
        self.inner.max_inflight()
    }

    fn session_expiry_interval(&self, d: Option<&rmqtt::types::Disconnect>) -> Duration {
        self.inner.session_expiry_interval(d)
    }

    fn message_expiry_interval(&self, publish: &rmqtt::codec::types::Publish) -> Duration {
        self.inner.message_expiry_interval(publish)
    }

    fn max_client_topic_aliases(&self) -> u16 {
        self.inner.max_client_topic_aliases()
    }

    fn max_server_topic_aliases(&self) -> u16 {
        self.inner.max_server_topic_aliases()
    }
}
