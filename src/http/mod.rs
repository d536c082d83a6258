//! The HTTP(S) server: hyper (HTTP/1.1) on the process's tokio runtime.
//!
//! Per listener: at most `connections_max` open connections (accepting pauses at the bound),
//! a header read timeout that also closes idle kept-alive connections, a TLS handshake bound
//! by the same timeout, bodies limited in size (413) and in time (408), answers the client
//! stops reading limited in time (`send_timeout_ms`). A complete request is handed to the
//! worker [`pool`]; its response always carries a Content-Length.
//!
//! Shutdown: stop accepting, let each connection finish the request in flight (graceful
//! close), wait for the connections up to a grace period.

pub mod events;
pub mod pool;
pub mod tls;

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::api::{self, error::ApiError};
use crate::config::HttpConfig;
use crate::limits;
use pool::{Pool, Refused};

/// A response's body: complete (every API answer), or the status page's event stream.
pub type ResponseBody = http_body_util::Either<Full<Bytes>, events::EventBody>;

/// What every connection of a listener shares.
pub struct Shared {
    pub pool: Arc<Pool>,
    /// For the paths served here rather than by a worker (the status page's events).
    pub app: Arc<api::App>,
    pub streams: events::Streams,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub body_bytes_max: usize,
    pub upload_bytes_max: usize,
    pub batch_bytes_max: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub send_timeout: Duration,
    pub quota_allowed: u32,
    pub connections_per_address_max: usize,
    /// Requests with a body over `body_bytes_max` allowed (uploads, batches) in flight at once.
    pub large_bodies: Arc<tokio::sync::Semaphore>,
    /// ... per client address.
    large_bodies_per_address: Arc<PerAddress>,
}

impl Shared {
    pub fn new(
        config: &HttpConfig,
        pool: Arc<Pool>,
        app: Arc<api::App>,
        metrics: Arc<crate::metrics::Metrics>,
        quota_allowed: u32,
    ) -> Shared {
        Shared {
            pool,
            app,
            streams: events::Streams::default(),
            metrics,
            body_bytes_max: config.body_bytes_max,
            upload_bytes_max: config.upload_bytes_max,
            batch_bytes_max: config.batch_bytes_max,
            header_read_timeout: Duration::from_millis(config.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(config.body_read_timeout_ms),
            send_timeout: Duration::from_millis(config.send_timeout_ms),
            quota_allowed,
            connections_per_address_max: config.connections_per_address_max,
            large_bodies: Arc::new(tokio::sync::Semaphore::new(limits::HTTP_LARGE_BODIES_MAX)),
            large_bodies_per_address: Arc::new(PerAddress::default()),
        }
    }
}

/// Accepts connections until `shutdown` turns true, then waits for open connections to
/// finish (up to the grace period).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
    connections_max: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = if tls.is_some() { "https" } else { "http" };
    let open =
        shared.metrics.connections_open.get_or_create(&crate::metrics::ListenerLabels { listener: name }).clone();
    let slots = Arc::new(Semaphore::new(connections_max));
    let per_address = Arc::new(PerAddress::default());
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&slots).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.changed() => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                log::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(address_slot) = per_address.take_for(peer.ip(), shared.connections_per_address_max) else {
            shared.metrics.connections_refused_per_address.inc();
            log::debug!("closed a connection from {peer}: connections_per_address_max reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // A write that makes no progress for send_timeout fails, and hyper closes the
        // connection: a client that stops reading gives back its answer and its slot.
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(shared.send_timeout));
        let stream = Box::pin(stream);
        let shared = Arc::clone(&shared);
        let shutdown = shutdown.clone();
        let acceptor = acceptor.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _address_slot = address_slot;
            open.inc();
            let _open = gauge_guard(open);
            match acceptor {
                None => connection(TokioIo::new(stream), peer, shared, shutdown).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(shared.header_read_timeout, acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(tls_stream)) => connection(TokioIo::new(tls_stream), peer, shared, shutdown).await,
                        Ok(Err(e)) => log::debug!("TLS handshake with {peer} failed: {e}"),
                        Err(_) => log::debug!("TLS handshake with {peer} timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    // Every connection holds a slot: all slots back means all connections closed.
    let all = u32::try_from(connections_max).unwrap_or(u32::MAX);
    let grace = Duration::from_millis(limits::HTTP_SHUTDOWN_GRACE_MS);
    if tokio::time::timeout(grace, slots.acquire_many(all)).await.is_err() {
        log::warn!("connections still open after the shutdown grace period; closing them");
    }
}

/// Places held per key (a client address, a user), each key bounded, with a slot that gives
/// its place back when dropped (the connection, the request or the stream ends).
pub(crate) struct Holders<K>(std::sync::Mutex<std::collections::HashMap<K, usize>>);

/// Places held per client address (IPv6 by /64).
type PerAddress = Holders<crate::auth::AddressKey>;

/// One place held in [`Holders`], given back when dropped.
pub(crate) struct Held<K: std::hash::Hash + Eq + Copy>(Arc<Holders<K>>, K);

impl<K: std::hash::Hash + Eq + Copy> Default for Holders<K> {
    fn default() -> Self {
        Holders(std::sync::Mutex::new(std::collections::HashMap::new()))
    }
}

impl<K: std::hash::Hash + Eq + Copy> Holders<K> {
    /// One more place for `key`, unless it holds `max` already.
    pub(crate) fn take(self: &Arc<Self>, key: K, max: usize) -> Option<Held<K>> {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let open = map.entry(key).or_insert(0);
        if *open >= max {
            return None;
        }
        *open += 1;
        Some(Held(Arc::clone(self), key))
    }
}

impl PerAddress {
    fn take_for(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<Held<crate::auth::AddressKey>> {
        self.take(crate::auth::AddressKey::of(ip), max)
    }
}

impl<K: std::hash::Hash + Eq + Copy> Drop for Held<K> {
    fn drop(&mut self) {
        let mut map = self.0.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(open) = map.get_mut(&self.1) {
            *open -= 1;
            if *open == 0 {
                map.remove(&self.1);
            }
        }
    }
}

async fn connection<I>(io: TokioIo<I>, peer: SocketAddr, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc_shared = Arc::clone(&shared);
    let svc_shutdown = shutdown.clone();
    let service = service_fn(move |req| {
        let shared = Arc::clone(&svc_shared);
        let shutdown = svc_shutdown.clone();
        async move { Ok::<_, Infallible>(respond(req, peer, &shared, shutdown).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.header_read_timeout)
        .max_buf_size(limits::HTTP_HEAD_BYTES_MAX.max(8192))
        .keep_alive(true)
        // Clients that scan raw header text look for `Http-X-Service-Api-Call-Limit` as written.
        .title_case_headers(true)
        .serve_connection(io, service);
    tokio::pin!(conn);
    if *shutdown.borrow() {
        conn.as_mut().graceful_shutdown();
    }
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                log::debug!("connection from {peer}: {e}");
            }
        }
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Answers one request, and counts it: every answer, the ones this layer gives itself (a body
/// too large, a timeout, no room) and the event streams' too.
async fn respond(
    req: hyper::Request<Incoming>,
    peer: SocketAddr,
    shared: &Shared,
    shutdown: watch::Receiver<bool>,
) -> hyper::Response<ResponseBody> {
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let response = answer(req, peer, shared, shutdown).await;
    let status = response.status().as_u16();
    shared.metrics.request_seconds.observe(started.elapsed().as_secs_f64());
    shared
        .metrics
        .requests
        .get_or_create(&crate::metrics::RequestLabels { method: method_label(&method), status })
        .inc();
    response
}

async fn answer(
    req: hyper::Request<Incoming>,
    peer: SocketAddr,
    shared: &Shared,
    shutdown: watch::Receiver<bool>,
) -> hyper::Response<ResponseBody> {
    shared.metrics.requests_in_flight.inc();
    let _in_flight = gauge_guard(shared.metrics.requests_in_flight.clone());
    let (mut parts, body) = req.into_parts();
    let query = parts.uri.query().unwrap_or("").to_string();
    let early_with = |headers: &http::HeaderMap, err: ApiError, close: bool| {
        let mut resp = api::early_error(headers, &query, err, shared.quota_allowed);
        if close {
            resp.headers.push(("Connection", "close".into()));
        }
        to_hyper(resp)
    };
    let early = |err: ApiError, close: bool| early_with(&parts.headers, err, close);

    // File uploads (multipart/form-data) and batches have their own, larger limits.
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|ct| ct.trim_start().to_ascii_lowercase())
        .unwrap_or_default();
    let limit = if content_type.starts_with("multipart/form-data") && api::takes_uploads(parts.uri.path()) {
        shared.upload_bytes_max
    } else if content_type.starts_with("multipart/mixed") && api::is_batch_path(parts.uri.path()) {
        shared.batch_bytes_max
    } else {
        shared.body_bytes_max
    };
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit.max(limits::HTTP_DRAIN_BYTES_MAX) as u64) {
        // Too large to be worth reading: answer at once and close.
        return early(ApiError::too_large(limit), true);
    }
    // What may be larger than the usual body limit is held by few requests at once, from
    // before it is read until it is answered: memory stays bounded whoever sends them
    // (credentials are checked only after the body is read), and one client address holds
    // only some of them.
    let _large = if limit > shared.body_bytes_max {
        let Some(mine) = shared.large_bodies_per_address.take_for(peer.ip(), limits::HTTP_LARGE_BODIES_PER_ADDRESS_MAX)
        else {
            return early(ApiError::busy(), true);
        };
        match Arc::clone(&shared.large_bodies).try_acquire_owned() {
            Ok(permit) => Some((permit, mine)),
            Err(_) => return early(ApiError::busy(), true),
        }
    } else {
        None
    };
    let read = tokio::time::timeout(shared.body_read_timeout, read_body(body, limit)).await;
    let body = match read {
        Ok(BodyRead::Complete(bytes)) => bytes,
        Ok(BodyRead::TooLarge) => return early(ApiError::too_large(limit), true),
        Ok(BodyRead::Failed(e)) => {
            return early(ApiError::invalid_request(format!("the body could not be read: {e}")), true);
        }
        Err(_) => return early(ApiError::request_timeout(), true),
    };

    if events::is_events_path(parts.uri.path()) {
        let request = api::Request {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: query.clone(),
            headers: parts.headers.clone(),
            body: Bytes::new(),
            peer: Some(peer.ip()),
            gone: None,
        };
        let response = events::respond(request, shared, shutdown).await;
        log::debug!("{peer} {} {} -> {} (event stream)", parts.method, parts.uri.path(), response.status());
        return response;
    }

    // Set when this future is dropped: hyper drops it when the client goes away before its
    // answer, and the worker then stops the request's reads (or does not start a GET).
    let gone = GoneOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    // The request's headers move to the worker (cloning them was a tenth of the HTTP path).
    // HEAD is answered as GET; hyper leaves the body out and keeps its Content-Length.
    let request = api::Request {
        method: if parts.method == http::Method::HEAD { http::Method::GET } else { parts.method.clone() },
        path: parts.uri.path().to_string(),
        query: query.clone(),
        headers: std::mem::take(&mut parts.headers),
        body,
        peer: Some(peer.ip()),
        gone: Some(Arc::clone(&gone.0)),
    };
    let method = parts.method.clone();
    let response = match shared.pool.submit(request) {
        Ok(rx) => match rx.await {
            Ok(resp) => to_hyper(resp),
            // Never expected (a handler's panic is answered by the worker); the headers went
            // with the request, so the error is in the default encoding.
            Err(_) => early_with(&http::HeaderMap::new(), ApiError::internal("a worker dropped a request"), false),
        },
        Err(Refused(request)) => early_with(&request.headers, ApiError::busy(), false),
    };
    log::debug!("{peer} {method} {} -> {}", parts.uri.path(), response.status().as_u16());
    response
}

/// Sets its flag when dropped: the request it belongs to is over, answered or not.
struct GoneOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The method as a metrics label: the standard ones by name, anything else as `other`.
fn method_label(method: &http::Method) -> String {
    match *method {
        http::Method::GET | http::Method::POST | http::Method::PUT | http::Method::DELETE | http::Method::HEAD => {
            method.as_str().to_string()
        }
        _ => "other".to_string(),
    }
}

/// Decrements a gauge when dropped: when the connection task or request ends, however it ends.
fn gauge_guard(gauge: prometheus_client::metrics::gauge::Gauge<i64, std::sync::atomic::AtomicI64>) -> impl Drop {
    struct Dec(prometheus_client::metrics::gauge::Gauge<i64, std::sync::atomic::AtomicI64>);
    impl Drop for Dec {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    Dec(gauge)
}

enum BodyRead {
    Complete(Bytes),
    /// Over the limit; the rest was read and discarded (up to `HTTP_DRAIN_BYTES_MAX`).
    TooLarge,
    Failed(hyper::Error),
}

/// Reads a body of at most `max` bytes. A larger one is drained (discarded) up to
/// `HTTP_DRAIN_BYTES_MAX` so that the client reads the 413 rather than a reset.
async fn read_body(mut body: Incoming, max: usize) -> BodyRead {
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(_) if seen > max => return BodyRead::TooLarge,
            Err(e) => return BodyRead::Failed(e),
        };
        if let Ok(data) = frame.into_data() {
            seen = seen.saturating_add(data.len());
            if seen > max {
                buf.clear();
                if seen > max.max(limits::HTTP_DRAIN_BYTES_MAX) {
                    return BodyRead::TooLarge;
                }
            } else {
                buf.extend_from_slice(&data);
            }
        }
    }
    if seen > max { BodyRead::TooLarge } else { BodyRead::Complete(buf.freeze()) }
}

fn to_hyper(resp: api::Response) -> hyper::Response<ResponseBody> {
    use hyper::header::{self, HeaderName, HeaderValue};
    static QUOTA: HeaderName = HeaderName::from_static("http-x-service-api-call-limit");
    let failed = |e: &dyn std::fmt::Display| {
        log::error!("cannot build a response: {e}");
        let mut r = hyper::Response::new(http_body_util::Either::Left(Full::new(Bytes::new())));
        *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        r
    };
    let Ok(status) = hyper::StatusCode::from_u16(resp.status) else {
        return failed(&format_args!("status {}", resp.status));
    };
    // Room for Content-Length and Date, which hyper adds.
    let mut headers = hyper::HeaderMap::with_capacity(resp.headers.len() + 2);
    for (name, value) in resp.headers {
        // The names every answer has are ready-made; others are parsed.
        let name = match name {
            "Content-Type" => header::CONTENT_TYPE,
            api::QUOTA_HEADER => QUOTA.clone(),
            other => match HeaderName::from_bytes(other.as_bytes()) {
                Ok(n) => n,
                Err(e) => return failed(&e),
            },
        };
        // The value's bytes become the header's without a copy.
        let bytes = match value {
            Cow::Borrowed(s) => Bytes::from_static(s.as_bytes()),
            Cow::Owned(s) => Bytes::from(s),
        };
        match HeaderValue::from_maybe_shared(bytes) {
            Ok(v) => {
                headers.append(name, v);
            }
            Err(e) => return failed(&e),
        }
    }
    let mut r = hyper::Response::new(http_body_util::Either::Left(Full::new(Bytes::from(resp.body))));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}
