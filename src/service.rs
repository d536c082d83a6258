//! `sitegate serve`: wires the store, the API, the worker pool and the listeners together,
//! prints the ready line, and shuts everything down in order on SIGTERM or SIGINT.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::api::App;
use crate::auth;
use crate::config::Config;
use crate::http::{self, pool::Pool};
use crate::limits;
use crate::metrics::Metrics;
use crate::store::{NewUser, Store};
use crate::systemd;

/// Why the service could not start or stopped badly.
#[derive(Debug)]
pub enum ServeError {
    Store(crate::store::StoreError),
    Io(String),
    /// Another `sitegate serve` holds the database's lock file (its path).
    AlreadyRunning(PathBuf),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Store(e) => write!(f, "{e}"),
            ServeError::Io(m) => write!(f, "{m}"),
            ServeError::AlreadyRunning(p) => {
                write!(f, "another sitegate serves this database (lock {} is held)", p.display())
            }
        }
    }
}

impl From<crate::store::StoreError> for ServeError {
    fn from(e: crate::store::StoreError) -> Self {
        ServeError::Store(e)
    }
}

pub const FIRST_ADMIN_EMAIL: &str = "admin@sitegate.local";

/// An exclusive lock on `<database>.lock`, held while the service runs: a second `serve` on the
/// same database, or a `restore` under a running service, is refused. The kernel releases it
/// when the process ends, however it ends.
pub struct InstanceLock {
    _file: std::fs::File,
}

impl InstanceLock {
    pub fn acquire(db: &Path) -> Result<InstanceLock, ServeError> {
        // The same database under another name (a symbolic link to it, or to its folder)
        // takes the same lock.
        let real = std::fs::canonicalize(db).ok().or_else(|| {
            let dir = db.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            Some(std::fs::canonicalize(dir).ok()?.join(db.file_name()?))
        });
        let db = real.as_deref().unwrap_or(db);
        // A hard link is another name the lock cannot see: two services through two names
        // would each acknowledge writes that only one file keeps.
        if let Ok(m) = std::fs::metadata(db) {
            use std::os::unix::fs::MetadataExt;
            if m.nlink() > 1 {
                return Err(ServeError::Store(crate::store::StoreError::Unusable(format!(
                    "{} has {} hard links: it must have one name (a second service through another name would \
                     lose writes); remove the other links",
                    db.display(),
                    m.nlink()
                ))));
            }
        }
        let mut name = db.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                let message =
                    format!("cannot create {}: {e} (check [store] path and who may write there)", dir.display());
                match e.kind() {
                    // Lasting until an operator acts: a start again fails the same way.
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                        ServeError::Store(crate::store::StoreError::Unusable(message))
                    }
                    _ => ServeError::Io(message),
                }
            })?;
        }
        let new = !path.exists();
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(|e| {
            let message = format!("cannot open {}: {e}{}", path.display(), crate::store::access_hint(&path));
            match e.kind() {
                // Left by a command run as another user: the next start fails the same way.
                std::io::ErrorKind::PermissionDenied => ServeError::Store(crate::store::StoreError::Unusable(message)),
                _ => ServeError::Io(message),
            }
        })?;
        if new {
            // Made by root (a command run before the service): the service's user must open it too.
            crate::store::give_to_owner_of(&path, path.parent().filter(|d| !d.as_os_str().is_empty()));
        }
        match file.try_lock() {
            Ok(()) => Ok(InstanceLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(ServeError::AlreadyRunning(path)),
            Err(std::fs::TryLockError::Error(e)) => Err(ServeError::Io(format!("cannot lock {}: {e}", path.display()))),
        }
    }
}

/// `<database>.<what>-<UTC time>`: where a replaced database is kept.
pub fn kept_path(db: &Path, what: &str) -> PathBuf {
    let stamp = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    let mut name = db.as_os_str().to_owned();
    name.push(format!(".{what}-{stamp}"));
    PathBuf::from(name)
}

/// Opens the store (migrating an earlier schema) and makes its organisations match the
/// configuration.
pub fn open_store(config: &Config) -> Result<Arc<Store>, crate::store::StoreError> {
    let store = Store::open(&config.store.path)?;
    store.sync_organizations(&config.organizations)?;
    // An organisation taken out of config.toml keeps its data and its users' access: said,
    // so that taking it out is not mistaken for closing it.
    for (org, users) in store.organizations_left_out(&config.organizations)? {
        log::warn!(
            "organisation {org:?} is in the database but not in the configuration: its {users} users who can log in \
             still can (`sitegate user disable` stops one); its records, devices and MQTT users stay"
        );
    }
    Ok(Arc::new(store))
}

/// As [`open_store`] for the commands other than `serve`: an earlier schema is refused, not
/// migrated ([`Store::open_current`]).
pub fn open_store_current(config: &Config) -> Result<Arc<Store>, crate::store::StoreError> {
    let store = Store::open_current(&config.store.path)?;
    store.sync_organizations(&config.organizations)?;
    Ok(Arc::new(store))
}

/// Makes room for the connections the configuration allows: each holds a file descriptor
/// (an MQTT persistent session even while its client is away), and when they run out the
/// HTTP API can no longer accept. Raises the soft limit as far as the hard one allows; says
/// so when that is not enough.
fn open_files_for(config: &Config) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let listeners = 1 + usize::from(config.http.tls.is_some());
    let mqtt = if config.mqtt.enabled { config.mqtt.broker.connections_max } else { 0 };
    let needed = u64::try_from(config.http.connections_max * listeners + mqtt + limits::PROCESS_FILES_RESERVED)
        .unwrap_or(u64::MAX);
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    if soft >= needed {
        return;
    }
    let raised = limit.maximum.map_or(needed, |hard| hard.min(needed));
    if raised > soft && setrlimit(Resource::Nofile, Rlimit { current: Some(raised), maximum: limit.maximum }).is_ok() {
        log::info!("open files: the limit was {soft}; raised to {raised} for the connections allowed");
        if raised >= needed {
            return;
        }
    }
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    log::warn!(
        "open files: the limit is {now}, below the {needed} that http.connections_max ({}{}), \
         mqtt.connections_max ({mqtt}) and {} for the database and the rest need: with that many clients, \
         new connections (the API's too) are refused; raise LimitNOFILE or lower connections_max",
        config.http.connections_max,
        if listeners > 1 { " on each of 2 listeners" } else { "" },
        limits::PROCESS_FILES_RESERVED
    );
}

/// A clock before 1970 (an RTC kept in local time east of Greenwich, just after it was reset)
/// cannot be served from: the broker and HTTP's `Date` need a later time. Exits, and systemd
/// starts the service again until the clock is set. A clock that has not been set since is
/// served from, with a warning: what is recorded meanwhile is dated wrong.
fn check_clock() -> Result<(), ServeError> {
    let now = jiff::Timestamp::now();
    if now.as_second() < 0 {
        return Err(ServeError::Io(format!("the system clock says {now}, before 1970: set it (NTP, or `date`)")));
    }
    if now.as_second() < limits::CLOCK_PLAUSIBLE_FROM_UNIX_S {
        log::warn!("the system clock says {now}: what is recorded is dated wrong until it is set (NTP)");
    }
    Ok(())
}

pub fn serve(config: Config) -> Result<(), ServeError> {
    let _ = std::sync::Arc::unwrap_or_clone(crate::http::tls::provider()).install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(limits::RUNTIME_WORKER_THREADS)
        .max_blocking_threads(limits::RUNTIME_BLOCKING_THREADS_MAX)
        .thread_name("sitegate-rt")
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io(format!("cannot start the runtime: {e}")))?;
    // Signal handlers first: a SIGTERM or SIGHUP from now on, during a migration too, is
    // taken once the service serves (it stops it in order, or reloads), instead of ending
    // the process at once with the signal's default action.
    let mut signals = runtime.block_on(async { Signals::new() }).map_err(|e| ServeError::Io(e.to_string()))?;
    check_clock()?;
    let _lock = InstanceLock::acquire(&config.store.path)?;
    crate::store::remove_partial_restore(&config.store.path);
    open_files_for(&config);
    let notifier = Arc::new(systemd::Notifier::from_env());
    let store = {
        // Migrating a large database (and backing it up first) on a gateway's storage may
        // outlast the unit's start timeout: systemd then killed the start and began again,
        // leaving another partial backup each time.
        let waiting = systemd::StartExtender::start(Arc::clone(&notifier))
            .map_err(|e| ServeError::Io(format!("cannot start a thread: {e}")))?;
        let store = open_store(&config);
        waiting.stop();
        store?
    };
    let metrics = Arc::new(Metrics::new());
    let app = Arc::new(App::new(config.clone(), Arc::clone(&store), Arc::clone(&metrics))?);

    let bind = |addr: SocketAddr| -> Result<std::net::TcpListener, ServeError> {
        let l =
            std::net::TcpListener::bind(addr).map_err(|e| ServeError::Io(format!("cannot listen on {addr}: {e}")))?;
        l.set_nonblocking(true).map_err(|e| ServeError::Io(e.to_string()))?;
        Ok(l)
    };
    let http_listener = bind(config.http.listen)?;
    let http_addr = http_listener.local_addr().map_err(|e| ServeError::Io(e.to_string()))?;
    let tls_listener = match &config.http.tls {
        Some(t) => {
            let server_config = http::tls::server_config(&t.cert, &t.key).map_err(|(_, m)| ServeError::Io(m))?;
            let l = bind(t.listen)?;
            let addr = l.local_addr().map_err(|e| ServeError::Io(e.to_string()))?;
            Some((l, addr, server_config))
        }
        None => None,
    };
    let tls_addr = tls_listener.as_ref().map(|(_, addr, _)| *addr);

    let pool = Arc::new(
        Pool::start(Arc::clone(&app), config.http.workers, config.http.heavy_workers, config.http.queue_depth_max)
            .map_err(|e| ServeError::Io(format!("cannot start workers: {e}")))?,
    );
    let shared = Arc::new(http::Shared::new(
        &config.http,
        Arc::clone(&pool),
        Arc::clone(&app),
        Arc::clone(&metrics),
        app.quota.allowed(),
    ));
    // Before the API serves: a write from then on queues its webhooks.
    let wake = crate::webhooks::Deliverer::channel();
    let wake_tx = wake.0.clone();
    store.set_outbox(crate::store::Outbox {
        render: Arc::new(crate::api::webhooks::Payloads {
            fields: Arc::clone(&config.fields),
            timezone: config.site.timezone.clone(),
        }),
        backlog_max: i64::try_from(config.webhooks.backlog_max).unwrap_or(i64::MAX),
        body_bytes_max: limits::WEBHOOK_BODY_BYTES_MAX,
        wake: Arc::new(move || {
            let _ = wake_tx.try_send(());
        }),
    });
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    {
        let _guard = runtime.enter();
        let listeners = std::iter::once((http_listener, None))
            .chain(tls_listener.map(|(l, _, server_config)| (l, Some(server_config))));
        for (listener, tls) in listeners {
            let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| ServeError::Io(e.to_string()))?;
            servers.push(runtime.spawn(http::serve(
                listener,
                tls,
                Arc::clone(&shared),
                config.http.connections_max,
                shutdown_rx.clone(),
            )));
        }
    }
    drop(shared);

    let deliverer =
        crate::webhooks::Deliverer::start(Arc::clone(&store), config.webhooks.clone(), Arc::clone(&metrics), wake)
            .map_err(|e| ServeError::Io(format!("cannot start webhook delivery: {e}")))?;
    deliverer.wake();

    // The location engine, the feed from it into the MQTT broker, and the broker (whose
    // remote receivers feed the engine).
    let (feed_tx, mut feed_rx) =
        tokio::sync::mpsc::channel::<crate::mqtt::feed::FeedMessage>(limits::MQTT_FEED_QUEUE_MAX);
    let feed = config
        .mqtt
        .enabled
        .then(|| crate::mqtt::feed::Feed::new(feed_tx, config.site.timezone.clone(), Arc::clone(&app.mqtt)));
    let mut location = crate::location::service::LocationService::start(
        Arc::clone(&store),
        Arc::clone(&app.site),
        Arc::clone(&app.scan),
        config.location.retention_days,
        feed,
    )
    .map_err(|e| ServeError::Io(format!("cannot start the location engine: {e}")))?;
    let ingest = Arc::new(crate::mqtt::ingest::Ingest::new(location.adverts.clone(), receiver_ids(&config.site_map)));
    app.set_ingest(Arc::clone(&ingest));
    let (mut broker, mut forward, mut feed_task) = (None, None, None);
    if config.mqtt.enabled {
        let started = runtime.block_on(crate::mqtt::broker::Broker::start(
            &config.mqtt.broker,
            Arc::clone(&store),
            Arc::clone(&app.mqtt),
            Arc::clone(&ingest),
            Arc::clone(&app.throttle),
        ));
        let b = match started {
            Ok(b) => b,
            Err(e) => {
                // The engine's start may wait for room in the feed's queue: it has no reader now.
                drop(feed_rx);
                location.stop();
                return Err(ServeError::Io(e));
            }
        };
        let publisher = b.publisher();
        // The upstream bridge gets every feed message too (through its queue on disk).
        let upstream = match &config.mqtt.bridge {
            Some(settings) => {
                let _guard = runtime.enter();
                let started = crate::mqtt::bridge::Bridge::start(settings.clone(), Arc::clone(&store));
                match started {
                    Ok(bridge) => {
                        app.set_bridge(Arc::clone(&bridge.stats));
                        Some(bridge)
                    }
                    Err(e) => {
                        drop(feed_rx);
                        b.stop();
                        location.stop();
                        return Err(ServeError::Io(format!("MQTT bridge: {e}")));
                    }
                }
            }
            None => None,
        };
        forward = Some(FeedForward { publisher, upstream });
        broker = Some(b);
    }
    // Clients come once the engine has loaded and the devices' restored states are in the
    // broker: a subscriber then gets each one retained, not some live as the start publishes
    // them. Without the broker it is waited for all the same: `ready` means the engine
    // follows the devices.
    if let Some(started) = location.started.take() {
        wait_for_location(&runtime, started, &mut feed_rx, forward.as_ref());
    }
    if let (Some(b), Some(forward)) = (&mut broker, forward) {
        b.open();
        feed_task = Some(runtime.spawn(async move {
            while let Some(m) = feed_rx.recv().await {
                forward.send(m).await;
            }
            if let Some(bridge) = forward.upstream {
                bridge.stop().await;
            }
        }));
    }
    let ble_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ble = (config.location.scan == crate::location::site::Scan::Auto).then(|| {
        runtime.spawn(crate::location::ble::run(
            crate::location::ble::BleSettings {
                adapter: config.location.adapter.clone(),
                watchdog: Duration::from_secs(config.location.scan_watchdog_s),
            },
            location.adverts.clone(),
            Arc::clone(&location.scan),
            Arc::clone(&ble_stop),
        ))
    });

    let flusher = Flusher::start(Arc::clone(&app))?;
    if let Some(every) = systemd::watchdog_interval() {
        runtime.spawn(watchdog(every, Arc::clone(&store), Arc::clone(&notifier)));
    }

    // Last before serving: a start that fails (a port taken) creates no administrator whose
    // token, printed once, would be lost with it.
    bootstrap_admin(&config, &store)?;

    let mut ready = format!("ready http={http_addr}");
    if let Some(addr) = tls_addr {
        ready.push_str(&format!(" https={addr}"));
    }
    if let Some(b) = &broker {
        ready.push_str(&format!(" mqtt={}", b.addr));
        if let Some(addr) = b.tls_addr {
            ready.push_str(&format!(" mqtts={addr}"));
        }
        if let Some(addr) = b.client_cert_addr {
            ready.push_str(&format!(" mqtts-cert={addr}"));
        }
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{ready}");
        let _ = out.flush();
    }
    notifier.notify(&format!("READY=1\nSTATUS={ready}"));
    log::info!("sitegate {} serving ({ready}), database {}", env!("CARGO_PKG_VERSION"), store.path().display());

    while let Signal::Reload = runtime.block_on(signals.recv()) {
        reload_site(&config, &app, &location);
    }
    log::info!("shutting down");
    notifier.notify("STOPPING=1\nSTATUS=shutting down");
    // Receivers' adverts are refused from now on; those taken go through the engine before
    // it stops (below).
    if let Some(ingest) = app.ingest.get() {
        ingest.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    deliverer.begin_stop();
    // 1. Stop accepting; let each connection finish its request in flight (bounded grace).
    let _ = shutdown_tx.send(true);
    runtime.block_on(async {
        for s in servers {
            let _ = s.await;
        }
    });
    // 2. Workers finish what is queued, then stop; webhook senders finish their attempts
    //    (what is still pending waits in the outbox for the next start).
    pool.shutdown();
    deliverer.join();
    // The BLE source stops scanning; the engine writes what it decided and closes the visits.
    ble_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(task) = ble {
        let _ = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(5), task).await });
    }
    location.stop();
    // The feed's last messages reach the broker (and the bridge's queue), then the broker stops.
    if let Some(task) = feed_task {
        let _ = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(15), task).await });
    }
    if let Some(b) = broker {
        b.stop();
    }
    // 3. Buffered state (viewed stamps, quota counters) is written.
    flusher.stop();
    // 4. The write-ahead log goes into the database file.
    if let Err(e) = store.checkpoint() {
        log::warn!("checkpoint at shutdown failed: {e}");
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    log::info!("stopped");
    Ok(())
}

/// Waits at most `LOCATION_START_WAIT_MS` for the location engine to load, passing what the
/// feed queues meanwhile (the devices' restored states) on to `forward`, if any.
fn wait_for_location(
    runtime: &tokio::runtime::Runtime,
    mut started: tokio::sync::oneshot::Receiver<()>,
    feed_rx: &mut tokio::sync::mpsc::Receiver<crate::mqtt::feed::FeedMessage>,
    forward: Option<&FeedForward>,
) {
    let send = |m| async move {
        if let Some(forward) = forward {
            forward.send(m).await;
        }
    };
    runtime.block_on(async {
        let deadline = tokio::time::sleep(Duration::from_millis(limits::LOCATION_START_WAIT_MS));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                biased;
                Some(m) = feed_rx.recv() => send(m).await,
                _ = &mut started => {
                    while let Ok(m) = feed_rx.try_recv() {
                        send(m).await;
                    }
                    return;
                }
                () = &mut deadline => {
                    log::warn!(
                        "the location engine has not loaded within {} s; serving anyway",
                        limits::LOCATION_START_WAIT_MS / 1000
                    );
                    return;
                }
            }
        }
    });
}

/// Where the feed's messages go: the broker, and the upstream bridge's queue if there is one.
struct FeedForward {
    publisher: crate::mqtt::broker::Publisher,
    upstream: Option<crate::mqtt::bridge::Bridge>,
}

impl FeedForward {
    async fn send(&self, m: crate::mqtt::feed::FeedMessage) {
        if let Some(bridge) = &self.upstream
            && bridge.tx.try_send(m.clone()).is_err()
        {
            bridge.stats.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.publisher.publish(m.topic, m.payload, m.retain).await;
    }
}

/// SIGTERM and SIGINT (stop), SIGHUP (reload the site map), registered once at start.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

enum Signal {
    Stop,
    Reload,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::Stop,
            _ = self.int.recv() => Signal::Stop,
            _ = self.hup.recv() => Signal::Reload,
        }
    }
}

/// SIGHUP: reads the configuration file again and puts its site map and location settings in
/// force. Other settings need a restart; a file that does not load changes nothing.
fn reload_site(config: &Config, app: &App, location: &crate::location::service::LocationService) {
    let Some(path) = &config.source else {
        log::info!("SIGHUP: no configuration file to reload (built-in defaults)");
        return;
    };
    match crate::config::load(Some(path)) {
        Ok(new)
            if new.site_map.zones.is_empty()
                && !app.site.read().unwrap_or_else(std::sync::PoisonError::into_inner).site.zones.is_empty() =>
        {
            // An empty or truncated file (one being written as the signal came) would take
            // every zone and every alert rule away.
            log::warn!(
                "SIGHUP: {} not reloaded: it has no zones, and the running site map has;                  restart to run without a site map",
                path.display()
            );
        }
        Ok(new) => {
            let changed = {
                let mut state = app.site.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                let changed = *state.site != *new.site_map
                    || state.engine != new.location.engine
                    || *state.rules != *new.alert_rules;
                if changed {
                    state.site = Arc::clone(&new.site_map);
                    state.engine = new.location.engine.clone();
                    state.rules = Arc::clone(&new.alert_rules);
                }
                changed
            };
            if changed {
                // The engine starts over from the new map (each device kept in its zone where
                // that zone is still on it): only when something it reads changed.
                location.site_changed();
                if let Some(ingest) = app.ingest.get() {
                    *ingest.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        receiver_ids(&new.site_map);
                }
                log::info!(
                    "SIGHUP: site map reloaded from {} ({} zones, {} receivers)",
                    path.display(),
                    new.site_map.zones.len(),
                    new.site_map.receivers.len()
                );
            } else {
                log::info!(
                    "SIGHUP: {}: the site map, the zone engine's settings and the alert rules are unchanged",
                    path.display()
                );
            }
            let later = changed_for_restart(config, &new);
            if !later.is_empty() {
                log::warn!(
                    "SIGHUP: {} changed in {}: these take effect at the next restart (a reload puts only \
                     the site map, the zone engine's settings and the alert rules in force)",
                    later.join(", "),
                    path.display()
                );
            }
        }
        Err(e) => log::warn!("SIGHUP: {} not reloaded: {e}", path.display()),
    }
}

/// The settings of `new` that differ from the running ones and that a reload does not put in
/// force (everything but the site map, the engine's settings and the alert rules), as
/// `section.key` names.
fn changed_for_restart(running: &Config, new: &Config) -> Vec<String> {
    let mut comparable = new.clone();
    comparable.site_map = Arc::clone(&running.site_map);
    comparable.location.engine = running.location.engine.clone();
    comparable.alert_rules = Arc::clone(&running.alert_rules);
    let parse = |c: &Config| c.to_toml().parse::<toml::Table>().unwrap_or_default();
    let (before, after) = (parse(running), parse(&comparable));
    let mut changed = Vec::new();
    let sections: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for section in sections {
        match (before.get(section), after.get(section)) {
            (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => {
                let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                changed.extend(keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).map(|k| format!("{section}.{k}")));
            }
            (a, b) if a != b => changed.push(section.clone()),
            _ => {}
        }
    }
    // Secrets are written as "(set)" above: a rotated one compares equal there.
    let bridge_password = |c: &Config| c.mqtt.bridge.as_ref().and_then(|b| b.password.clone());
    for (key, differs) in [
        ("http.metrics_token", running.http.metrics_token != new.http.metrics_token),
        ("mqtt.bridge_password", bridge_password(running) != bridge_password(new)),
    ] {
        if differs && !changed.iter().any(|c| c == key) {
            changed.push(key.to_string());
        }
    }
    changed
}

/// The receiver ids of the site map (remote receivers may speak for these).
fn receiver_ids(site: &crate::location::site::Site) -> Vec<Arc<str>> {
    site.receivers.iter().map(|r| Arc::from(r.id.as_str())).collect()
}

/// Pings systemd's watchdog while the runtime runs and the database answers a read in time.
async fn watchdog(every: Duration, store: Arc<Store>, notifier: Arc<systemd::Notifier>) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let probe = tokio::task::spawn_blocking({
            let store = Arc::clone(&store);
            move || store.ping()
        });
        match tokio::time::timeout(every, probe).await {
            Ok(Ok(Ok(()))) => notifier.notify("WATCHDOG=1"),
            Ok(Ok(Err(e))) => log::warn!("watchdog: the database does not answer: {e}"),
            Ok(Err(e)) => log::warn!("watchdog: the probe failed: {e}"),
            Err(_) => log::warn!("watchdog: the database did not answer within {every:?}"),
        }
    }
}

/// On an empty database: creates the first administrator and prints the credentials once.
fn bootstrap_admin(config: &Config, store: &Store) -> Result<(), ServeError> {
    if store.user_count()? > 0 {
        // Users made with `sitegate user add` before the first start, none of them an
        // administrator of their organisation: nobody there can manage hooks, devices or users
        // through the API, nor see all its records, and its Alarms get no ticket.
        for org in store.orgs_without_admin()? {
            log::warn!(
                "no administrator of organisation {org} can log in: `sitegate user add --admin --org {org}` makes one \
                 (`user enable` and `user undelete` bring one back)"
            );
        }
        return Ok(());
    }
    let token = auth::new_token();
    store.create_user(&NewUser {
        org: &config.default_org().id,
        email: FIRST_ADMIN_EMAIL,
        name: "Administrator",
        admin: true,
        prevent_private: false,
        groups: &[],
        token_sha256: &auth::token_hash(&token),
    })?;
    eprintln!(
        "sitegate: created the first administrator (shown once; `sitegate user token --email {FIRST_ADMIN_EMAIL}` issues a new token)"
    );
    eprintln!("sitegate: admin email: {FIRST_ADMIN_EMAIL}");
    eprintln!("sitegate: admin token: {token}");
    Ok(())
}

/// The background thread that writes batched state: "viewed" stamps every second, quota
/// counters every `QUOTA_FLUSH_INTERVAL_MS`; both once more when stopping.
struct Flusher {
    stop: crossbeam_channel::Sender<()>,
    thread: JoinHandle<()>,
}

impl Flusher {
    fn start(app: Arc<App>) -> Result<Flusher, ServeError> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("store-flusher".into())
            .spawn(move || {
                let viewed_every = Duration::from_millis(limits::STORE_VIEWED_FLUSH_INTERVAL_MS);
                let quota_every = Duration::from_millis(limits::QUOTA_FLUSH_INTERVAL_MS);
                let mut last_quota = Instant::now();
                let mut dropped_reported = 0;
                let mut disk_low = false;
                let mut certs = Vec::new();
                let mut certs_checked: Option<Instant> = None;
                loop {
                    if certs_checked.is_none_or(|at| at.elapsed().as_secs() >= limits::CERT_CHECK_INTERVAL_S) {
                        crate::certs::check(&app.config, crate::timefmt::now_secs(), &mut certs);
                        certs_checked = Some(Instant::now());
                    }
                    if let Some(free) = app.store.disk_free_bytes() {
                        let low = free < limits::DISK_FREE_LOW_BYTES;
                        if low && !disk_low {
                            log::warn!(
                                "the disk holding the database has {} MiB free (below {} MiB); writes fail when it is full",
                                free / (1 << 20),
                                limits::DISK_FREE_LOW_BYTES / (1 << 20)
                            );
                        } else if !low && disk_low {
                            log::info!("the disk holding the database has {} MiB free again", free / (1 << 20));
                        }
                        disk_low = low;
                    }
                    let stopping = !matches!(
                        stopped.recv_timeout(viewed_every),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout)
                    );
                    if let Err(e) = app.store.flush_viewed()
                        && !e.logged_once()
                    {
                        log::warn!("cannot write viewed stamps: {e}");
                    }
                    let dropped = app.store.viewed_dropped();
                    if dropped > dropped_reported {
                        log::warn!("{} viewed stamps dropped (buffer full)", dropped - dropped_reported);
                        dropped_reported = dropped;
                    }
                    if stopping || last_quota.elapsed() >= quota_every {
                        let (hour, counters) = app.quota.snapshot();
                        if let Err(e) = app.store.save_quota(hour, &counters) {
                            log::warn!("cannot write quota counters: {e}");
                        }
                        last_quota = Instant::now();
                    }
                    if stopping {
                        break;
                    }
                }
            })
            .map_err(|e| ServeError::Io(format!("cannot start the flusher: {e}")))?;
        Ok(Flusher { stop, thread })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        crate::config::resolve(crate::config::parse(text).unwrap(), None).unwrap()
    }

    /// A rotated secret (written "(set)" in the settings' text) is named as waiting for a
    /// restart, as any other setting a reload does not put in force.
    #[test]
    fn a_rotated_secret_is_named_for_the_restart() {
        let with = |token: &str, password: &str| {
            config(&format!(
                "[http]\nmetrics_token = \"{token}\"\n[mqtt]\nbridge_url = \"mqtt://127.0.0.1:1884\"\nbridge_password = \"{password}\"\n"
            ))
        };
        let running = with("aaaaaaaaaaaaaaaaaaaa", "p1");
        assert!(changed_for_restart(&running, &with("aaaaaaaaaaaaaaaaaaaa", "p1")).is_empty());
        assert_eq!(changed_for_restart(&running, &with("bbbbbbbbbbbbbbbbbbbb", "p1")), ["http.metrics_token"]);
        assert_eq!(changed_for_restart(&running, &with("aaaaaaaaaaaaaaaaaaaa", "p2")), ["mqtt.bridge_password"]);
        let unset = config("");
        let set = changed_for_restart(&unset, &with("aaaaaaaaaaaaaaaaaaaa", "p1"));
        for key in ["http.metrics_token", "mqtt.bridge_url", "mqtt.bridge_password"] {
            assert_eq!(set.iter().filter(|c| *c == key).count(), 1, "{key} in {set:?}");
        }
    }
}
