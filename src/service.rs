//! `sitegate serve`: wires the store, the API, the worker pool and the listeners together,
//! prints the ready line, and shuts everything down in order on SIGTERM or SIGINT.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::api::App;
use crate::auth;
use crate::config::Config;
use crate::http::{self, pool::Pool};
use crate::limits;
use crate::store::{NewUser, Store};

/// Why the service could not start or stopped badly.
#[derive(Debug)]
pub enum ServeError {
    Store(crate::store::StoreError),
    Io(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Store(e) => write!(f, "{e}"),
            ServeError::Io(m) => write!(f, "{m}"),
        }
    }
}

impl From<crate::store::StoreError> for ServeError {
    fn from(e: crate::store::StoreError) -> Self {
        ServeError::Store(e)
    }
}

pub const FIRST_ADMIN_EMAIL: &str = "admin@sitegate.local";

/// Opens the store and makes its organisations match the configuration.
pub fn open_store(config: &Config) -> Result<Arc<Store>, crate::store::StoreError> {
    let store = Store::open(&config.store.path)?;
    store.sync_organizations(&config.organizations)?;
    Ok(Arc::new(store))
}

pub fn serve(config: Config) -> Result<(), ServeError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = open_store(&config)?;
    bootstrap_admin(&config, &store)?;
    let app = Arc::new(App::new(config.clone(), Arc::clone(&store))?);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sitegate-rt")
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io(format!("cannot start the runtime: {e}")))?;

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
        Pool::start(Arc::clone(&app), config.http.workers, config.http.queue_depth_max)
            .map_err(|e| ServeError::Io(format!("cannot start workers: {e}")))?,
    );
    let shared = Arc::new(http::Shared::new(&config.http, Arc::clone(&pool), app.quota.allowed()));
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);

    let mut servers = Vec::new();
    {
        let _guard = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(http_listener).map_err(|e| ServeError::Io(e.to_string()))?;
        servers.push(runtime.spawn(http::serve(
            listener,
            None,
            Arc::clone(&shared),
            config.http.connections_max,
            shutdown_rx.clone(),
        )));
        if let Some((l, _, server_config)) = tls_listener {
            let listener = tokio::net::TcpListener::from_std(l).map_err(|e| ServeError::Io(e.to_string()))?;
            servers.push(runtime.spawn(http::serve(
                listener,
                Some(server_config),
                Arc::clone(&shared),
                config.http.connections_max,
                shutdown_rx.clone(),
            )));
        }
    }

    let flusher = Flusher::start(Arc::clone(&app))?;

    let mut ready = format!("ready http={http_addr}");
    if let Some(addr) = tls_addr {
        ready.push_str(&format!(" https={addr}"));
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{ready}");
        let _ = out.flush();
    }
    log::info!("sitegate {} serving ({ready}), database {}", env!("CARGO_PKG_VERSION"), store.path().display());

    runtime.block_on(wait_for_signal());
    log::info!("shutting down");
    let _ = shutdown_tx.send(true);
    runtime.block_on(async {
        for s in servers {
            let _ = s.await;
        }
    });
    drop(shared);
    match Arc::try_unwrap(pool) {
        Ok(pool) => pool.shutdown(),
        Err(_) => log::warn!("worker pool still referenced at shutdown"),
    }
    flusher.stop();
    runtime.shutdown_timeout(Duration::from_millis(limits::HTTP_SHUTDOWN_GRACE_MS));
    log::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// On an empty database: creates the first administrator and prints the credentials once.
fn bootstrap_admin(config: &Config, store: &Store) -> Result<(), ServeError> {
    if store.user_count()? > 0 {
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
                loop {
                    let stopping = !matches!(
                        stopped.recv_timeout(viewed_every),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout)
                    );
                    if let Err(e) = app.store.flush_viewed() {
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
