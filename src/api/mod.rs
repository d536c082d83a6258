//! The REST API: one synchronous entry point, [`App::handle`], from a parsed HTTP request to
//! a complete response. The HTTP server calls it on a worker thread; the batch endpoint calls
//! it again for each nested request, so both go through the same authentication, quota,
//! routing and rendering.

mod activities;
mod alerts;
pub mod batch;
pub mod error;
pub mod input;
pub mod location;
pub mod output;
mod records;
mod reports;
pub mod status;
pub mod webhooks;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde_json::Value;

pub use batch::is_batch_path;

use crate::auth::{self, AuthError};
use crate::config::Config;
use crate::limits;
use crate::metrics::Metrics;
use crate::model::activity::ActivityType;
use crate::model::{RecordType, Viewer};
use crate::quota::Quota;
use crate::store::Store;
use crate::timefmt::now_secs;
use error::ApiError;
use output::{Member, Out};

/// The OpenAPI 3 description of the JSON API, served at `/openapi.json`.
const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

/// Name of the quota header, as the deployed service spells it.
pub const QUOTA_HEADER: &str = "Http-X-Service-Api-Call-Limit";
pub const REALM: &str = "sitegate";

/// Why a status event could not be built.
pub enum StatusFailure {
    /// The caller's credentials are not (or no longer) accepted: the answer that says so.
    Refused(Response),
    /// The database could not be read (the credentials could not be checked, or the
    /// snapshot not built).
    Unreadable,
}

/// Why a request's credentials were not accepted.
enum Denied {
    Refused,
    /// The client's address is locked out for this many more milliseconds.
    Locked(u64),
    Store(crate::store::StoreError),
}

/// Everything a handler may use.
pub struct App {
    pub config: Config,
    pub store: Arc<Store>,
    pub quota: Quota,
    /// Credentials verified since the database last changed.
    pub verified: auth::Verified,
    /// Failed logins per client address (shared with the MQTT broker).
    pub throttle: Arc<auth::Throttle>,
    /// `SITEGATE_FAULT_INJECTION=1` at start: `/_fault/panic` panics, `/_fault/hold` holds
    /// its worker for half a second, `/_fault/slowread` reads for minutes unless stopped (for
    /// tests).
    pub fault_injection: bool,
    pub metrics: Arc<Metrics>,
    /// The site map and location settings in force (replaced on SIGHUP).
    pub site: crate::location::service::SiteHandle,
    /// How the live BLE source is doing (shared with it).
    pub scan: Arc<crate::location::ble::ScanState>,
    /// The broker's counters (zero while it is off).
    pub mqtt: Arc<crate::mqtt::broker::BrokerStats>,
    /// Remote receivers (set once the location engine runs).
    pub ingest: std::sync::OnceLock<Arc<crate::mqtt::ingest::Ingest>>,
    /// The upstream bridge, when configured.
    pub bridge: std::sync::OnceLock<Arc<crate::mqtt::bridge::BridgeStats>>,
}

/// An HTTP request as the API sees it, whether it came from a socket or from a batch part.
pub struct Request {
    pub method: Method,
    /// The path, percent-decoding not applied (ids and segments are ASCII).
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The client's address (failed logins are throttled by it); none for requests the
    /// process makes itself.
    pub peer: Option<std::net::IpAddr>,
    /// Set once the client has gone (the HTTP layer dropped the request): its reads stop.
    pub gone: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// A complete response: always a known length, never chunked.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Values that are constants are borrowed (a show's Content-Type is one).
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
    pub body: Vec<u8>,
}

/// How the response is encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Format {
    Xml,
    Json,
    /// JSON wrapped as `callback(...)`.
    Jsonp(String),
}

impl Format {
    /// JSONP when a `callback` query parameter survives sanitising (JavaScript names of
    /// letters, digits, `_` and `$`, not starting with a digit, joined by dots as namespaced
    /// callbacks are: `jQuery.cb_1`, `angular.callbacks._0`), JSON when `Accept` (or the
    /// misspelt `Accepts`) asks for it, else XML.
    pub fn negotiate(headers: &HeaderMap, query: &Value) -> Format {
        if let Some(cb) = query.get("callback").and_then(input::scalar_text) {
            let parts: Vec<String> = cb
                .split('.')
                .map(|part| {
                    part.chars()
                        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$'))
                        .skip_while(char::is_ascii_digit)
                        .collect::<String>()
                })
                .filter(|part| !part.is_empty())
                .collect();
            let clean: String = parts.join(".").chars().take(limits::JSONP_CALLBACK_CHARS_MAX).collect();
            let clean = clean.trim_end_matches('.');
            if !clean.is_empty() {
                return Format::Jsonp(clean.to_string());
            }
        }
        let wants_json = ["accept", "accepts"].iter().any(|name| {
            headers
                .get_all(*name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| v.as_bytes().windows(4).any(|w| w.eq_ignore_ascii_case(b"json")))
        });
        if wants_json { Format::Json } else { Format::Xml }
    }
}

/// A successful handler result.
pub struct Reply {
    pub status: u16,
    /// Members of `<response>`, before `<status>`.
    pub doc: Out,
    /// For 201: the new resource's path.
    pub location: Option<String>,
}

impl Reply {
    pub fn ok(doc: Out) -> Reply {
        Reply { status: 200, doc, location: None }
    }

    pub fn created(doc: Out, location: String) -> Reply {
        Reply { status: 201, doc, location: Some(location) }
    }
}

/// A stored file to send as it is.
pub struct Download {
    pub name: String,
    pub content_type: String,
    pub content: Vec<u8>,
}

/// What a route answers: a document (XML or JSON) or a file.
enum Answer {
    Doc(Reply),
    File(Download),
    /// A page or asset of the status page: content type and body (embedded).
    Page(&'static str, &'static str),
}

/// What a handler gets: who asks, and the request's parameters.
pub struct Ctx<'a> {
    pub app: &'a App,
    pub viewer: Viewer,
    /// Query string parameters.
    pub query: Value,
    /// Body parameters (XML, JSON or form).
    pub body: Value,
    /// Files the body carried, by form key.
    pub uploads: Vec<(String, crate::model::Upload)>,
    pub now: i64,
}

impl Ctx<'_> {
    /// Query and body parameters together; the body wins on a clash.
    pub fn params(&self) -> Value {
        let mut merged = self.query.clone();
        input::merge(&mut merged, self.body.clone());
        merged
    }
}

impl App {
    /// Answers one request; a panic in a handler becomes a 500 for this request only.
    pub fn handle_isolated(&self, req: &Request) -> Response {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(req))) {
            Ok(response) => response,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                let err = ApiError::internal(&format!("handler panicked on {} {}: {what}", req.method, req.path));
                early_error(&req.headers, &req.query, err, self.quota.allowed())
            }
        }
    }

    /// The quota header's value for a request that does not count: the caller's calls this
    /// hour if its credentials are good, else none.
    pub fn quota_of(&self, req: &Request) -> String {
        let used = match self.authenticate(req) {
            Ok(viewer) => self.quota.used(viewer.user_id, now_secs()),
            Err(_) => 0,
        };
        format!("{used}/{}", self.quota.allowed())
    }

    /// The user a request's credentials authenticate, through the failed-login throttle: a
    /// presented credential that fails counts, and from a locked-out address one that fails is
    /// answered 429 until the lockout ends. Credentials that verify are accepted from a
    /// locked-out address too: tokens are random 256-bit secrets nobody guesses, and the
    /// other systems behind one address (a NAT, an integration server) must not be locked
    /// out with a misconfigured one.
    fn authenticate(&self, req: &Request) -> Result<Viewer, Denied> {
        let Some(header) = req.headers.get(http::header::AUTHORIZATION) else {
            return Err(Denied::Refused);
        };
        let now_ms = self.throttle.now_ms();
        let locked = match self.throttle.gate(req.peer, now_ms) {
            auth::Gate::Locked(ms) => Some(ms),
            auth::Gate::Open => None,
        };
        match (self.verified.authenticate(&self.store, header), locked) {
            (Ok(viewer), _) => Ok(viewer),
            (Err(AuthError::Refused), Some(ms)) => {
                self.metrics.login_refusals.inc();
                Err(Denied::Locked(ms))
            }
            (Err(AuthError::Refused), None) => {
                self.login_failed(req.peer, now_ms);
                Err(Denied::Refused)
            }
            (Err(AuthError::Store(e)), _) => Err(Denied::Store(e)),
        }
    }

    /// Counts a failed login from `peer`; the journal says when it locks the address out.
    fn login_failed(&self, peer: Option<std::net::IpAddr>, now_ms: u64) {
        self.metrics.login_failures.inc();
        if self.throttle.failed(peer, now_ms) {
            log::warn!(
                "{} failed logins from {}: refused for {} s",
                self.config.api.login_failures_max,
                peer.map_or_else(String::new, |p| p.to_string()),
                self.config.api.login_lockout_s
            );
        }
    }

    /// The answer to a request whose credentials were not accepted.
    fn denied(&self, format: &Format, denied: Denied) -> Response {
        let quota = format!("0/{}", self.quota.allowed());
        match denied {
            Denied::Refused => {
                let mut resp = render_error(format, ApiError::unauthorized(), quota);
                resp.headers.push(("WWW-Authenticate", format!("Basic realm=\"{REALM}\", charset=\"UTF-8\"").into()));
                resp
            }
            Denied::Locked(ms) => render_error(format, ApiError::login_locked(ms.div_ceil(1000)), quota),
            Denied::Store(e) => render_error(format, e.into(), quota),
        }
    }

    /// One event of the status page's stream (`http::events`): the snapshot for the
    /// request's caller as JSON, checked against the credentials each time; or why not, with
    /// the answer that says so.
    pub fn status_event(&self, req: &Request) -> Result<(i64, String), StatusFailure> {
        let format = Format::Json;
        let viewer = self.authenticate(req).map_err(|denied| match denied {
            Denied::Store(_) => StatusFailure::Unreadable,
            _ => StatusFailure::Refused(self.denied(&format, denied)),
        })?;
        match status::snapshot(self, &viewer) {
            Ok(doc) => Ok((viewer.user_id, output::to_json(&members(doc)))),
            Err(_) => Err(StatusFailure::Unreadable),
        }
    }

    /// The answer to a status stream asked for while the database cannot be read.
    pub fn status_unreadable(&self, headers: &HeaderMap) -> Response {
        early_error(
            headers,
            "",
            ApiError::unavailable("it cannot be read now (GET /health says why)"),
            self.quota.allowed(),
        )
    }

    /// The parts of a status snapshot that need no reads of the database (the gateway's
    /// time and its health, with the storage problem), as JSON members: what an open page
    /// is sent while the database cannot be read.
    pub fn status_unread_parts(&self) -> serde_json::Map<String, serde_json::Value> {
        match output::members_to_json(&members(status::unread_parts(self))) {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// The answer to a method a path does not take, for the HTTP layer's own paths.
    pub fn method_not_allowed(&self, headers: &HeaderMap, allow: &[&str]) -> Response {
        early_error(headers, "", ApiError::method_not_allowed(allow), self.quota.allowed())
    }

    /// The answer for a status stream the service has no room for.
    pub fn busy(&self, headers: &HeaderMap) -> Response {
        early_error(headers, "", ApiError::busy(), self.quota.allowed())
    }

    pub fn new(config: Config, store: Arc<Store>, metrics: Arc<Metrics>) -> Result<App, crate::store::StoreError> {
        let now = now_secs();
        let hour = crate::quota::hour_of(now);
        let saved = store.load_quota(hour)?;
        let quota = Quota::new(config.api.quota_calls_per_hour, hour, saved);
        let fault_injection = std::env::var("SITEGATE_FAULT_INJECTION").is_ok_and(|v| v == "1");
        let site = crate::location::service::site_handle(
            Arc::clone(&config.site_map),
            config.location.engine.clone(),
            Arc::clone(&config.alert_rules),
        );
        let scan = Arc::new(crate::location::ble::ScanState::default());
        let mqtt = Arc::default();
        let throttle = Arc::new(auth::Throttle::new(config.api.login_failures_max, config.api.login_lockout_s));
        Ok(App {
            config,
            store,
            quota,
            verified: Default::default(),
            throttle,
            fault_injection,
            metrics,
            site,
            scan,
            mqtt,
            ingest: Default::default(),
            bridge: Default::default(),
        })
    }

    /// Answers one request. Never panics on bad input; a panic from a bug is caught by the
    /// caller (the worker pool) and answered with 500.
    pub fn handle(&self, req: &Request) -> Response {
        let _budget = crate::store::ReplyBudget::start(crate::limits::REPLY_DATA_BYTES_MAX);
        let _stop = crate::store::ReadStop::start(
            std::time::Duration::from_millis(self.config.http.read_time_max_ms),
            req.gone.clone(),
        );
        let query = input::parse_form(&req.query);
        let empty = Value::Object(Default::default());
        let format = Format::negotiate(&req.headers, query.as_ref().unwrap_or(&empty));
        let allowed = self.quota.allowed();

        // A browser that holds credentials for the gateway sends them with requests other
        // sites make it send: a change from another origin is refused.
        if !matches!(req.method, Method::GET | Method::HEAD | Method::OPTIONS) && cross_origin(&req.headers) {
            return render_error(
                &format,
                ApiError::forbidden("a change requested by a page of another origin is refused"),
                format!("0/{allowed}"),
            );
        }
        // JSONP is the one answer a page of another site can read (a script tag, sent with the
        // credentials the browser holds for the gateway): not for such pages. Answered as
        // JSON, which such a page cannot read, so its callback learns nothing.
        if matches!(format, Format::Jsonp(_)) && (cross_origin(&req.headers) || fetched_by_another_site(&req.headers)) {
            return render_error(
                &Format::Json,
                ApiError::forbidden("JSONP for a page of another origin is refused"),
                format!("0/{allowed}"),
            );
        }

        // Unauthenticated paths for monitoring.
        let segs = segments(&req.path);
        match segs.as_slice() {
            ["health"] => return self.health(&req.method, &format),
            ["metrics"] => return self.metrics(req),
            // The API's description is documentation: no credentials needed.
            ["openapi.json"] => {
                return match req.method {
                    Method::GET => Response {
                        status: 200,
                        headers: vec![
                            ("Content-Type", "application/json".into()),
                            ("Cache-Control", "no-cache".into()),
                            (QUOTA_HEADER, format!("0/{allowed}").into()),
                        ],
                        body: OPENAPI_JSON.as_bytes().to_vec(),
                    },
                    _ => render_error(&format, ApiError::method_not_allowed(&["GET"]), format!("0/{allowed}")),
                };
            }
            // The outer call authenticates nothing and counts nothing; each nested request does.
            ["batch"] => return self.batch(req, &format),
            _ => {}
        }

        let viewer = match self.authenticate(req) {
            Ok(v) => v,
            Err(denied) => return self.denied(&format, denied),
        };
        let now = now_secs();
        let used = match self.quota.take(viewer.user_id, now) {
            Ok(used) => used,
            Err(used) => {
                let retry = 3600 - now.rem_euclid(3600);
                return render_error(&format, ApiError::quota_exceeded(allowed, retry), quota_text(used, allowed));
            }
        };
        let quota_value = quota_text(used, allowed);

        let result = (|| {
            let query = query?;
            let content_type = req.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
            let body = input::parse_body(content_type, &req.body)?;
            let ctx = Ctx { app: self, viewer, query, body: body.params, uploads: body.uploads, now };
            route(&ctx, &req.method, &req.path, &segs)
        })();
        match result {
            Ok(Answer::Doc(reply)) => render_reply(&format, reply, quota_value),
            Ok(Answer::File(file)) => render_download(&format, file, &req.headers, quota_value),
            Ok(Answer::Page(content_type, body)) => render_page(content_type, body, quota_value),
            Err(err) => render_error(&format, err, quota_value),
        }
    }
}

impl App {
    /// `GET /health`: no authentication; 200 while the database answers, else 503.
    fn health(&self, method: &Method, format: &Format) -> Response {
        let quota = format!("0/{}", self.quota.allowed());
        if *method != Method::GET {
            return render_error(format, ApiError::method_not_allowed(&["GET"]), quota);
        }
        let uptime = i64::try_from(self.metrics.uptime_secs()).unwrap_or(i64::MAX);
        match self.storage_check() {
            Ok(()) => {
                let (pending, failed, paused) = self.store.delivery_summary().unwrap_or((0, 0, 0));
                let doc = Out::map()
                    .with("health", Out::text("ok"))
                    .with("version", Out::text(env!("CARGO_PKG_VERSION")))
                    .with("uptime_s", Out::Int(uptime))
                    .with(
                        "webhooks",
                        Out::map()
                            .with("pending", Out::Int(pending))
                            .with("failed", Out::Int(failed))
                            .with("paused", Out::Int(paused)),
                    )
                    .with("disk", self.disk_out())
                    .with("location", self.scan_out())
                    .with("mqtt", self.mqtt_out());
                render_reply(format, Reply::ok(doc), quota)
            }
            Err(e) => render_error(format, ApiError::unavailable(&e.to_string()), quota),
        }
    }

    /// Whether the database answers and takes writes: not when a read fails, when its file
    /// was moved away, or while writes fail for a full disk (`/health` and the status page).
    pub fn storage_check(&self) -> Result<(), crate::store::StoreError> {
        self.store.ping()?;
        if let Some(why) = self.store.moved() {
            return Err(crate::store::StoreError::Moved(why));
        }
        match self.store.full_since() {
            Some(t) => Err(crate::store::StoreError::StorageFull(format!(
                "writes fail since {}",
                crate::timefmt::local_ms(t.saturating_mul(1000), &self.config.site.timezone)
            ))),
            None => Ok(()),
        }
    }

    pub fn set_ingest(&self, ingest: Arc<crate::mqtt::ingest::Ingest>) {
        let _ = self.ingest.set(ingest);
    }

    pub fn set_bridge(&self, stats: Arc<crate::mqtt::bridge::BridgeStats>) {
        let _ = self.bridge.set(stats);
    }

    /// The remote receivers of the site map for /health: when each was last heard, and
    /// whether it has been silent longer than `[location] receiver_silent_s`.
    fn receivers_out(&self) -> Out {
        let Some(ingest) = self.ingest.get() else {
            return Out::list("receiver", Vec::new());
        };
        let now = crate::timefmt::now_ms();
        let started = now - i64::try_from(self.metrics.uptime_secs() * 1000).unwrap_or(0);
        let silent_ms = i64::try_from(self.config.location.receiver_silent_s * 1000).unwrap_or(i64::MAX);
        let known = ingest.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let heard = ingest.last_heard_ms.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let items = known
            .iter()
            .filter(|r| r.as_ref() != self.config.location.adapter)
            .map(|r| {
                let last = heard.get(r).copied();
                let silent = crate::mqtt::ingest::silent(now, last.unwrap_or(started), silent_ms);
                Out::map()
                    .with("id", Out::text(r.as_ref()))
                    .with(
                        "lastadvert",
                        Out::text(
                            last.map(|t| crate::timefmt::local_ms(t, &self.config.site.timezone)).unwrap_or_default(),
                        ),
                    )
                    .with("silent", Out::Int(i64::from(silent)))
            })
            .collect();
        Out::list("receiver", items)
    }

    /// Free space where the database is, for /health: a disk filling up is seen before writes
    /// fail (and after a restart on a full disk, before the first write tries).
    fn disk_out(&self) -> Out {
        match self.store.disk_free_bytes() {
            Some(free) => Out::map()
                .with("freebytes", Out::Int(i64::try_from(free).unwrap_or(i64::MAX)))
                .with("low", Out::Int(i64::from(free < crate::limits::DISK_FREE_LOW_BYTES))),
            None => Out::map(),
        }
    }

    /// Remote receivers' adverts taken and not taken since start.
    fn remote_adverts(&self) -> (i64, i64) {
        use std::sync::atomic::Ordering::Relaxed;
        let n = |v: &std::sync::atomic::AtomicU64| i64::try_from(v.load(Relaxed)).unwrap_or(i64::MAX);
        self.ingest.get().map_or((0, 0), |i| (n(&i.accepted), n(&i.rejected)))
    }

    /// The broker's state for /health.
    fn mqtt_out(&self) -> Out {
        use std::sync::atomic::Ordering::Relaxed;
        let n = |v: &std::sync::atomic::AtomicU64| Out::Int(i64::try_from(v.load(Relaxed)).unwrap_or(i64::MAX));
        let m = &self.mqtt;
        Out::map()
            .with("enabled", Out::Int(i64::from(self.config.mqtt.enabled)))
            .with("connections", Out::Int(m.connections.load(Relaxed)))
            .with("sessions", Out::Int(m.sessions()))
            .with("refused", n(&m.auth_refused))
            .with("published", n(&m.published))
            .with("dropped", n(&m.dropped))
            .with("feeddropped", n(&m.feed_dropped))
            .with("bridge", self.bridge_out())
    }

    /// The upstream bridge for /health (empty when there is none).
    fn bridge_out(&self) -> Out {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(b) = self.bridge.get() else { return Out::map() };
        let queued = self.store.bridge_queued().unwrap_or(-1);
        Out::map()
            .with("connected", Out::Int(i64::from(b.connected.load(Relaxed))))
            .with("queued", Out::Int(queued))
            .with("sent", Out::Int(i64::try_from(b.sent.load(Relaxed)).unwrap_or(i64::MAX)))
            .with("dropped", Out::Int(i64::try_from(b.dropped.load(Relaxed)).unwrap_or(i64::MAX)))
    }

    /// The live BLE source's state for /health.
    fn scan_out(&self) -> Out {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.scan;
        let last = s.last_advert_ms.load(Relaxed);
        let remote = self.remote_adverts();
        Out::map()
            .with(
                "scan",
                Out::text(match self.config.location.scan {
                    crate::location::site::Scan::Off => "off",
                    _ if s.scanning.load(Relaxed) => "scanning",
                    _ => "waiting",
                }),
            )
            .with("adverts", Out::Int(i64::try_from(s.adverts.load(Relaxed)).unwrap_or(i64::MAX)))
            .with("remoteadverts", Out::Int(remote.0))
            .with("remotedropped", Out::Int(remote.1))
            .with("receivers", self.receivers_out())
            .with("dropped", Out::Int(i64::try_from(s.dropped.load(Relaxed)).unwrap_or(i64::MAX)))
            .with(
                "lastadvert",
                Out::text(if last == 0 {
                    String::new()
                } else {
                    crate::timefmt::local_ms(i64::try_from(last).unwrap_or(0), &self.config.site.timezone)
                }),
            )
    }

    /// `GET /metrics`: the Prometheus text exposition; with `[http] metrics_token` set, only
    /// for `Authorization: Bearer <token>`.
    fn metrics(&self, req: &Request) -> Response {
        let quota = format!("0/{}", self.quota.allowed());
        if let Some(expected) = &self.config.http.metrics_token {
            // The token is the operator's words, which may be guessed: a locked-out address
            // is refused unchecked here, and a wrong token counts as a failed login.
            let now_ms = self.throttle.now_ms();
            if let auth::Gate::Locked(ms) = self.throttle.gate(req.peer, now_ms) {
                self.metrics.login_refusals.inc();
                return render_error(&Format::Xml, ApiError::login_locked(ms.div_ceil(1000)), quota);
            }
            let presented = req
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                // The scheme in any case, blanks around the token (RFC 9110, 11.1).
                .and_then(|v| v.trim().split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
                .map_or("", |(_, token)| token.trim());
            let ok: bool = subtle::ConstantTimeEq::ct_eq(
                auth::token_hash(presented).as_slice(),
                auth::token_hash(expected).as_slice(),
            )
            .into();
            if !ok {
                self.login_failed(req.peer, now_ms);
                let mut resp = render_error(&Format::Xml, ApiError::unauthorized(), quota);
                resp.headers.push(("WWW-Authenticate", format!("Bearer realm=\"{REALM}\"").into()));
                return resp;
            }
        }
        if req.method != Method::GET {
            return render_error(&Format::Xml, ApiError::method_not_allowed(&["GET"]), quota);
        }
        self.metrics.database_bytes.set(i64::try_from(self.store.size_bytes()).unwrap_or(i64::MAX));
        if let Some(free) = self.store.disk_free_bytes() {
            self.metrics.disk_free_bytes.set(i64::try_from(free).unwrap_or(i64::MAX));
        }
        self.metrics.writes_failing.set(i64::from(self.store.full_since().is_some() || self.store.moved().is_some()));
        {
            use std::sync::atomic::Ordering::Relaxed;
            let s = &self.scan;
            self.metrics.ble_scanning.set(i64::from(s.scanning.load(Relaxed)));
            self.metrics.ble_adverts.set(i64::try_from(s.adverts.load(Relaxed)).unwrap_or(i64::MAX));
            self.metrics.ble_dropped.set(i64::try_from(s.dropped.load(Relaxed)).unwrap_or(i64::MAX));
            self.metrics.ble_rounds.set(i64::try_from(s.rounds.load(Relaxed)).unwrap_or(i64::MAX));
            let (remote, remote_dropped) = self.remote_adverts();
            self.metrics.ble_remote_adverts.set(remote);
            self.metrics.ble_remote_dropped.set(remote_dropped);
            let m = &self.mqtt;
            let n = |v: &std::sync::atomic::AtomicU64| i64::try_from(v.load(Relaxed)).unwrap_or(i64::MAX);
            self.metrics.mqtt_connections.set(m.connections.load(Relaxed));
            self.metrics.mqtt_refused.set(n(&m.auth_refused));
            self.metrics.mqtt_published.set(n(&m.published));
            self.metrics.mqtt_dropped.set(n(&m.dropped));
            self.metrics.mqtt_feed_dropped.set(n(&m.feed_dropped));
        }
        self.metrics.viewed_dropped.set(i64::try_from(self.store.viewed_dropped()).unwrap_or(i64::MAX));
        Response {
            status: 200,
            headers: vec![("Content-Type", crate::metrics::CONTENT_TYPE.into()), (QUOTA_HEADER, quota.into())],
            body: self.metrics.render().into_bytes(),
        }
    }
}

/// True when a browser says the request comes from a page of another origin: an `Origin`
/// whose host and port differ from `Host` (or the opaque `null`), or `Sec-Fetch-Site:
/// cross-site`. Clients other than browsers send neither.
fn cross_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if text("sec-fetch-site").is_some_and(|v| v.eq_ignore_ascii_case("cross-site")) {
        return true;
    }
    let Some(origin) = headers.get(http::header::ORIGIN) else { return false };
    let Ok(origin) = origin.to_str() else { return true };
    let Some((scheme, authority)) = origin.trim().split_once("://") else { return true };
    let host = text("host").unwrap_or("");
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return true,
    };
    let strip = |a: &str| a.strip_suffix(default_port).unwrap_or(a).to_ascii_lowercase();
    strip(authority.trim_end_matches('/')) != strip(host)
}

/// Whether a browser says the request comes from a page that is not the gateway's
/// (`Sec-Fetch-Site` other than `same-origin`, or `none`: typed in, a bookmark).
fn fetched_by_another_site(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .is_some_and(|v| !v.eq_ignore_ascii_case("same-origin") && !v.eq_ignore_ascii_case("none"))
}

/// Path segments without empty ones: `/contacts/131/` and `/contacts/131` are the same.
fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

/// An id segment ([`is_id`]) as an id: 0 to [`limits::PATH_ID_MAX`], else no item.
fn parse_id(s: &str) -> Result<i64, ApiError> {
    s.parse().ok().filter(|id| (0..=limits::PATH_ID_MAX).contains(id)).ok_or_else(ApiError::item_not_found)
}

/// Whether a path segment is written as an item id: digits, perhaps after a minus. One out of
/// range or not positive names no item (404 `itemisnotfound`, as for any missing item), not an
/// unknown path.
fn is_id(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a request's cost grows with the data rather than being that of one item: lists,
/// searches, reports, exports, downloads, batches, and any path not known to name one item.
/// The worker pool runs at most `[http] heavy_workers` of these at once, so a show, a create or
/// a change finds a worker however many of them wait.
pub fn is_heavy(method: &Method, path: &str) -> bool {
    let one_item = match segments(path).as_slice() {
        [] | ["health" | "metrics" | "openapi.json"] | ["status", "page.js" | "page.css"] => true,
        ["_fault", "panic" | "hold"] => true,
        // Bounded (`ALERT_LIST_MAX`), and what an alert panel polls: never behind a report.
        ["alerts"] => true,
        ["hooks" | "devices"] => *method == Method::POST,
        ["hooks" | "devices", id] => is_id(id),
        ["alerts", id, "ack"] => is_id(id),
        ["hooks", id, "deliveries", delivery, "retry"] => is_id(id) && is_id(delivery),
        [segment, rest @ ..] if RecordType::from_segment(segment).is_some() => match rest {
            [] => *method == Method::POST,
            ["fields" | "categories"] => true,
            [id] | [id, "restore"] if is_id(id) => true,
            [activity] => ActivityType::from_segment(activity).is_some(),
            [activity, id] | [activity, id, "restore"] => ActivityType::from_segment(activity).is_some() && is_id(id),
            _ => false,
        },
        _ => false,
    };
    !one_item
}

/// Whether a path takes file uploads (`multipart/form-data` up to `upload_bytes_max`): a
/// record type's paths, where files and attachments go. Elsewhere such a body has the usual
/// limit, and takes none of the few places for large bodies.
pub fn takes_uploads(path: &str) -> bool {
    segments(path).first().is_some_and(|s| RecordType::from_segment(s).is_some())
}

/// `segs`: the path's [`segments`].
fn route(ctx: &Ctx<'_>, method: &Method, path: &str, segs: &[&str]) -> Result<Answer, ApiError> {
    let page = match segs {
        [] => Some(("text/html; charset=utf-8", status::PAGE_HTML)),
        ["status", "page.js"] => Some(("text/javascript; charset=utf-8", status::PAGE_JS)),
        ["status", "page.css"] => Some(("text/css; charset=utf-8", status::PAGE_CSS)),
        _ => None,
    };
    if let Some((content_type, body)) = page {
        return match *method {
            Method::GET => Ok(Answer::Page(content_type, body)),
            _ => Err(ApiError::method_not_allowed(&["GET"])),
        };
    }
    if let [segment, activity, id, "file"] = segs
        && let (Some(_), Some(kind), true) =
            (RecordType::from_segment(segment), ActivityType::from_segment(activity), is_id(id))
    {
        let id = parse_id(id)?;
        return match *method {
            Method::GET => activities::download(ctx, kind, id).map(Answer::File),
            _ => Err(ApiError::method_not_allowed(&["GET"])),
        };
    }
    route_doc(ctx, method, path, segs).map(Answer::Doc)
}

fn route_doc(ctx: &Ctx<'_>, method: &Method, path: &str, segs: &[&str]) -> Result<Reply, ApiError> {
    let allow = |methods: &[&str]| -> Result<Reply, ApiError> { Err(ApiError::method_not_allowed(methods)) };
    match segs {
        // Fault injection for the tests of panic isolation; off unless the service was started
        // with SITEGATE_FAULT_INJECTION=1.
        ["_fault", "panic"] if ctx.app.fault_injection => panic!("fault injection: a handler panics"),
        ["_fault", "hold"] if ctx.app.fault_injection => {
            std::thread::sleep(std::time::Duration::from_millis(500));
            Ok(Reply::ok(Out::map()))
        }
        ["_fault", "slowread"] if ctx.app.fault_injection => {
            Ok(Reply::ok(Out::map().with("n", Out::Int(ctx.app.store.slow_read()?))))
        }
        ["status", "snapshot"] => match *method {
            Method::GET => status::show(ctx),
            _ => allow(&["GET"]),
        },
        ["ownership"] => match *method {
            Method::GET => records::ownership(ctx),
            _ => allow(&["GET"]),
        },
        ["hooks"] => match *method {
            Method::GET => webhooks::list(ctx),
            Method::POST => webhooks::create(ctx),
            _ => allow(&["GET", "POST"]),
        },
        ["hooks", id] if is_id(id) => {
            let id = parse_id(id)?;
            match *method {
                Method::GET => webhooks::show(ctx, id),
                Method::PUT => webhooks::update(ctx, id),
                Method::DELETE => webhooks::delete(ctx, id),
                _ => allow(&["GET", "PUT", "DELETE"]),
            }
        }
        ["hooks", id, "deliveries"] if is_id(id) => match *method {
            Method::GET => webhooks::deliveries(ctx, parse_id(id)?),
            _ => allow(&["GET"]),
        },
        ["hooks", id, "deliveries", delivery, "retry"] if is_id(id) && is_id(delivery) => match *method {
            Method::POST => webhooks::retry(ctx, parse_id(id)?, parse_id(delivery)?),
            _ => allow(&["POST"]),
        },
        ["devices"] => match *method {
            Method::GET => location::devices_list(ctx),
            Method::POST => location::device_create(ctx),
            _ => allow(&["GET", "POST"]),
        },
        ["devices", id] if is_id(id) => {
            let id = parse_id(id)?;
            match *method {
                Method::GET => location::device_show(ctx, id),
                Method::PUT => location::device_update(ctx, id),
                Method::DELETE => location::device_delete(ctx, id),
                _ => allow(&["GET", "PUT", "DELETE"]),
            }
        }
        ["alerts"] => match *method {
            Method::GET => alerts::list(ctx),
            _ => allow(&["GET"]),
        },
        ["alerts", id, "ack"] if is_id(id) => match *method {
            Method::POST => alerts::ack(ctx, parse_id(id)?),
            _ => allow(&["POST"]),
        },
        ["locate"] => match *method {
            Method::GET | Method::POST => location::locate(ctx),
            _ => allow(&["GET", "POST"]),
        },
        ["report", "lastseen"] | ["lastseen"] => match *method {
            Method::GET => location::lastseen(ctx),
            _ => allow(&["GET"]),
        },
        ["report", "battery"] | ["battery"] => match *method {
            Method::GET => location::battery(ctx),
            _ => allow(&["GET"]),
        },
        ["report", name @ ("timebydevice" | "timebyzone" | "timesummary")] => {
            let report = match *name {
                "timebydevice" => location::timebydevice,
                "timebyzone" => location::timebyzone,
                _ => location::timesummary,
            };
            match *method {
                Method::GET | Method::POST => report(ctx),
                _ => allow(&["GET", "POST"]),
            }
        }
        ["contacts", id, "locations"] if is_id(id) => match *method {
            Method::GET => location::contact_export(ctx, parse_id(id)?),
            Method::DELETE => location::contact_purge(ctx, parse_id(id)?),
            _ => allow(&["GET", "DELETE"]),
        },
        ["report", name] => {
            let report = match *name {
                "nextactions" => reports::nextactions,
                "followups" => reports::followups,
                "opportunities" => reports::opportunities,
                "activities" => reports::activities,
                "timetracking" => reports::timetracking,
                "calendar" => reports::calendar,
                _ => return Err(ApiError::no_such_path(path)),
            };
            match *method {
                Method::GET => report(ctx),
                _ => allow(&["GET"]),
            }
        }
        [segment, rest @ ..] => {
            let Some(rt) = RecordType::from_segment(segment) else {
                return Err(ApiError::no_such_path(path));
            };
            match rest {
                [] => match *method {
                    Method::GET => records::list(ctx, rt),
                    Method::POST => records::create(ctx, rt),
                    _ => allow(&["GET", "POST"]),
                },
                ["categories"] => match *method {
                    Method::GET => records::list_categories(ctx, rt),
                    Method::POST => records::create_category(ctx, rt),
                    _ => allow(&["GET", "POST"]),
                },
                ["fields"] => match *method {
                    Method::GET => records::list_fields(ctx, rt),
                    _ => allow(&["GET"]),
                },
                [id] if is_id(id) => {
                    let id = parse_id(id)?;
                    match *method {
                        Method::GET => records::show(ctx, rt, id),
                        Method::PUT => records::update(ctx, rt, id),
                        Method::DELETE => records::delete(ctx, rt, id),
                        _ => allow(&["GET", "PUT", "DELETE"]),
                    }
                }
                [activity] if ActivityType::from_segment(activity).is_some() => {
                    let kind = ActivityType::from_segment(activity).ok_or_else(|| ApiError::no_such_path(path))?;
                    match *method {
                        Method::POST => activities::create(ctx, kind),
                        _ => allow(&["POST"]),
                    }
                }
                [id, "restore"] if is_id(id) => match *method {
                    Method::POST => records::restore(ctx, rt, parse_id(id)?),
                    _ => allow(&["POST"]),
                },
                [activity, id, "restore"] if ActivityType::from_segment(activity).is_some() && is_id(id) => {
                    let kind = ActivityType::from_segment(activity).ok_or_else(|| ApiError::no_such_path(path))?;
                    match *method {
                        Method::POST => activities::restore(ctx, kind, parse_id(id)?),
                        _ => allow(&["POST"]),
                    }
                }
                [activity, id] if ActivityType::from_segment(activity).is_some() && is_id(id) => {
                    let kind = ActivityType::from_segment(activity).ok_or_else(|| ApiError::no_such_path(path))?;
                    let id = parse_id(id)?;
                    match *method {
                        Method::PUT => activities::update(ctx, kind, id),
                        Method::DELETE => activities::delete(ctx, kind, id),
                        _ => allow(&["PUT", "DELETE"]),
                    }
                }
                _ => Err(ApiError::no_such_path(path)),
            }
        }
        [] => Err(ApiError::no_such_path(path)),
    }
}

pub(crate) fn members(doc: Out) -> Vec<Member> {
    match doc {
        Out::Map(m) => m,
        other => vec![Member::new("result", other)],
    }
}

fn render(format: &Format, mut members: Vec<Member>, status_text: &'static str) -> (Vec<u8>, &'static str) {
    members.push(Member::new("status", Out::text(status_text)));
    match format {
        Format::Xml => (output::to_xml(&members).into_bytes(), "application/xml; charset=utf-8"),
        Format::Json => (output::to_json_bytes(&members), "application/json; charset=utf-8"),
        Format::Jsonp(cb) => {
            (format!("{cb}({});", output::to_json(&members)).into_bytes(), "application/javascript; charset=utf-8")
        }
    }
}

pub fn render_reply(format: &Format, reply: Reply, quota_value: String) -> Response {
    let (body, content_type) = render(format, members(reply.doc), "success");
    let mut headers = vec![("Content-Type", content_type.into()), (QUOTA_HEADER, quota_value.into())];
    if let Some(location) = reply.location {
        headers.push(("Location", location.into()));
    }
    Response { status: reply.status, headers, body }
}

/// The status page and its assets: never framed, no other origin's scripts, not cached.
fn render_page(content_type: &'static str, body: &'static str, quota_value: String) -> Response {
    Response {
        status: 200,
        headers: vec![
            ("Content-Type", content_type.into()),
            ("Cache-Control", "no-cache".into()),
            ("X-Content-Type-Options", "nosniff".into()),
            ("X-Frame-Options", "DENY".into()),
            (
                "Content-Security-Policy",
                "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'".into(),
            ),
            ("Referrer-Policy", "no-referrer".into()),
            (QUOTA_HEADER, quota_value.into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// A stored file: whole (200), or the one byte range a `Range` header asks for (206; a client
/// resuming a download). A range past the end is 416; a header that does not parse, several
/// ranges, or an `If-Range` (the file has no validators to compare) get the whole file, as
/// RFC 9110 allows.
fn render_download(format: &Format, file: Download, request: &HeaderMap, quota_value: String) -> Response {
    let len = file.content.len();
    let mut part = None;
    if let Some(range) = request.get(http::header::RANGE).and_then(|v| v.to_str().ok())
        && !request.contains_key(http::header::IF_RANGE)
        && let Ok(parsed) = http_range_header::parse_range_header(range)
    {
        match parsed.validate(len as u64) {
            Ok(ranges) if ranges.len() == 1 => {
                let (start, end) = (*ranges[0].start(), *ranges[0].end());
                // Both within the file: validate() keeps them below its length.
                if let (Ok(s), Ok(e)) = (usize::try_from(start), usize::try_from(end)) {
                    part = Some((s, e));
                }
            }
            Err(http_range_header::RangeUnsatisfiableError::Unsatisfiable) => {
                return render_error(format, ApiError::range_not_satisfiable(len), quota_value);
            }
            _ => {}
        }
    }
    // The name as a plain-ASCII fallback and in RFC 5987 form for everything else.
    let ascii: String = file
        .name
        .chars()
        .map(|c| if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' { c } else { '_' })
        .collect();
    let encoded = percent_encoding::utf8_percent_encode(&file.name, percent_encoding::NON_ALPHANUMERIC).to_string();
    let mut headers = vec![
        ("Content-Type", file.content_type.into()),
        ("Content-Disposition", format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{encoded}").into()),
        ("Accept-Ranges", "bytes".into()),
        ("X-Content-Type-Options", "nosniff".into()),
        (QUOTA_HEADER, quota_value.into()),
    ];
    match part {
        Some((start, end)) => {
            headers.push(("Content-Range", format!("bytes {start}-{end}/{len}").into()));
            let mut body = file.content;
            body.truncate(end + 1);
            body.drain(..start);
            Response { status: 206, headers, body }
        }
        None => Response { status: 200, headers, body: file.content },
    }
}

pub fn render_error(format: &Format, err: ApiError, quota_value: String) -> Response {
    let errors = Out::map().with(err.element.clone(), Out::text(err.message.clone()));
    let (body, content_type) = render(format, members(Out::map().with("errors", errors)), "failed");
    let mut headers = vec![("Content-Type", content_type.into()), (QUOTA_HEADER, quota_value.into())];
    headers.extend(err.headers);
    // A JSONP caller cannot read the status line: answer 200 so the script runs and sees
    // `"status": "failed"`.
    let status = if matches!(format, Format::Jsonp(_)) && err.status != 401 { 200 } else { err.status };
    Response { status, headers, body }
}

/// Answers requests that never reach a handler (body too large, overload, a handler panic),
/// in the API's error shape.
pub fn early_error(headers: &HeaderMap, query: &str, err: ApiError, quota_allowed: u32) -> Response {
    let query = input::parse_form(query).unwrap_or_else(|_| Value::Object(Default::default()));
    let format = Format::negotiate(headers, &query);
    render_error(&format, err, format!("0/{quota_allowed}"))
}

/// The quota header's value, `used/allowed` (on every answer: written without the formatting
/// machinery).
fn quota_text(used: impl itoa::Integer, allowed: impl itoa::Integer) -> String {
    let mut text = String::with_capacity(24);
    text.push_str(itoa::Buffer::new().format(used));
    text.push('/');
    text.push_str(itoa::Buffer::new().format(allowed));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_of_one_item_and_expensive_ones_are_told_apart() {
        let one_item = [
            (Method::GET, "/contacts/131"),
            (Method::GET, "/contacts/131/"),
            (Method::PUT, "/companies/7"),
            (Method::DELETE, "/projectblogs/7"),
            (Method::POST, "/contacts"),
            (Method::POST, "/contacts/note"),
            (Method::PUT, "/contacts/note/5"),
            (Method::POST, "/contacts/131/restore"),
            (Method::GET, "/contacts/fields"),
            (Method::POST, "/hooks"),
            (Method::PUT, "/devices/3"),
            (Method::POST, "/alerts/9/ack"),
            (Method::GET, "/health"),
            (Method::GET, "/metrics"),
            (Method::GET, "/alerts"),
        ];
        for (method, path) in one_item {
            assert!(!is_heavy(&method, path), "{method} {path}");
        }
        let heavy = [
            (Method::GET, "/contacts"),
            (Method::GET, "/contacts?byphone=555"),
            (Method::GET, "/report/activities"),
            (Method::POST, "/report/timebyzone"),
            (Method::GET, "/locate"),
            (Method::POST, "/batch"),
            (Method::GET, "/ownership"),
            (Method::GET, "/hooks"),
            (Method::GET, "/hooks/4/deliveries"),
            (Method::GET, "/devices"),
            (Method::GET, "/contacts/131/locations"),
            (Method::DELETE, "/contacts/131/locations"),
            (Method::GET, "/contacts/attachment/5/file"),
            (Method::GET, "/status/snapshot"),
            (Method::GET, "/no/such/path"),
        ];
        for (method, path) in heavy {
            assert!(is_heavy(&method, path), "{method} {path}");
        }
    }
}
