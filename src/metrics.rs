//! Service metrics in the Prometheus (OpenMetrics) text format, served at `/metrics`.
//!
//! One registry for the process; each part of the service updates its own metrics through the
//! shared [`Metrics`]. Label values come from small fixed sets (methods, status codes), never
//! from request data.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: &'static str,
}

pub struct Metrics {
    registry: Registry,
    started: Instant,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Histogram,
    pub queue_depth: Gauge<i64, AtomicI64>,
    pub workers_busy: Gauge<i64, AtomicI64>,
    pub requests_in_flight: Gauge<i64, AtomicI64>,
    pub connections_open: Family<ListenerLabels, Gauge<i64, AtomicI64>>,
    pub rejected_busy: Counter<u64, AtomicU64>,
    pub uptime_seconds: Gauge<i64, AtomicI64>,
    pub database_bytes: Gauge<i64, AtomicI64>,
    pub viewed_dropped: Gauge<i64, AtomicI64>,
    pub writes_failing: Gauge<i64, AtomicI64>,
    pub disk_free_bytes: Gauge<i64, AtomicI64>,
    pub webhook_attempts: Family<OutcomeLabels, Counter>,
    pub webhook_pending: Gauge<i64, AtomicI64>,
    pub webhook_failed: Gauge<i64, AtomicI64>,
    pub ble_scanning: Gauge<i64, AtomicI64>,
    pub ble_adverts: Gauge<i64, AtomicI64>,
    pub ble_remote_adverts: Gauge<i64, AtomicI64>,
    pub ble_remote_dropped: Gauge<i64, AtomicI64>,
    pub ble_dropped: Gauge<i64, AtomicI64>,
    pub ble_rounds: Gauge<i64, AtomicI64>,
    pub mqtt_connections: Gauge<i64, AtomicI64>,
    pub mqtt_refused: Gauge<i64, AtomicI64>,
    pub mqtt_published: Gauge<i64, AtomicI64>,
    pub mqtt_dropped: Gauge<i64, AtomicI64>,
    pub mqtt_feed_dropped: Gauge<i64, AtomicI64>,
    pub login_failures: Counter<u64, AtomicU64>,
    pub login_refusals: Counter<u64, AtomicU64>,
    pub connections_refused_per_address: Counter<u64, AtomicU64>,
}

/// Request latency buckets, seconds: 0.25 ms to ~4 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.000_25, 2.0, 15)
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sitegate");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests answered, by method and status", requests.clone());
        let request_seconds = Histogram::new(latency_buckets());
        registry.register(
            "http_request_duration_seconds",
            "Time from a complete request to its response",
            request_seconds.clone(),
        );
        let queue_depth = Gauge::<i64, AtomicI64>::default();
        registry.register("http_queue_depth", "Requests waiting for a worker", queue_depth.clone());
        let workers_busy = Gauge::<i64, AtomicI64>::default();
        registry.register("http_workers_busy", "Workers running a request", workers_busy.clone());
        let requests_in_flight = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "http_requests_in_flight",
            "Requests whose headers arrived and whose response is not sent yet",
            requests_in_flight.clone(),
        );
        let connections_open = Family::<ListenerLabels, Gauge<i64, AtomicI64>>::default();
        registry.register("http_connections_open", "Open client connections, by listener", connections_open.clone());
        let rejected_busy = Counter::<u64, AtomicU64>::default();
        registry.register(
            "http_rejected_busy",
            "Requests answered 503 because the queue was full",
            rejected_busy.clone(),
        );
        let uptime_seconds = Gauge::<i64, AtomicI64>::default();
        registry.register("uptime_seconds", "Seconds since the service started", uptime_seconds.clone());
        let database_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "database_bytes",
            "Size of the database file and its write-ahead log",
            database_bytes.clone(),
        );
        let viewed_dropped = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "viewed_stamps_dropped",
            "Viewed stamps dropped since start because their buffer was full",
            viewed_dropped.clone(),
        );
        let writes_failing = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "database_writes_failing",
            "1 while writes fail for a full disk or a database file moved away, else 0",
            writes_failing.clone(),
        );
        let disk_free_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "disk_free_bytes",
            "Bytes the service may still write on the file system holding the database",
            disk_free_bytes.clone(),
        );
        let webhook_attempts = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_attempts",
            "Webhook delivery attempts, by outcome (delivered, retry, failed)",
            webhook_attempts.clone(),
        );
        // Every outcome is exported from the start (at 0), not from its first attempt on.
        for outcome in ["delivered", "retry", "failed"] {
            drop(webhook_attempts.get_or_create(&OutcomeLabels { outcome }));
        }
        let webhook_pending = Gauge::<i64, AtomicI64>::default();
        registry.register("webhook_pending", "Webhook deliveries waiting to be sent", webhook_pending.clone());
        let ble_scanning = Gauge::<i64, AtomicI64>::default();
        registry.register("ble_scanning", "1 while the BLE adapter is scanning", ble_scanning.clone());
        let ble_adverts = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "ble_adverts",
            "BLE adverts received since start (this gateway's adapter)",
            ble_adverts.clone(),
        );
        let ble_remote_adverts = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "ble_remote_adverts",
            "Adverts taken from remote receivers (MQTT) since start",
            ble_remote_adverts.clone(),
        );
        let ble_remote_dropped = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "ble_remote_adverts_dropped",
            "Adverts of remote receivers not taken since start (engine queue full, or malformed)",
            ble_remote_dropped.clone(),
        );
        let ble_dropped = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "ble_adverts_dropped",
            "BLE adverts dropped since start (engine queue full)",
            ble_dropped.clone(),
        );
        let ble_rounds = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "ble_scan_rounds",
            "BLE scan rounds begun or tried (1 + restarts; rising while scan is waiting for BlueZ or the adapter)",
            ble_rounds.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::<i64, AtomicI64>::default();
            registry.register(name, help, g.clone());
            g
        };
        let mqtt_connections = gauge(&mut registry, "mqtt_connections", "MQTT clients connected now");
        let mqtt_refused =
            gauge(&mut registry, "mqtt_refused", "MQTT connections refused since start (credentials, will topic)");
        let mqtt_published = gauge(&mut registry, "mqtt_published", "Feed messages published since start");
        let mqtt_dropped =
            gauge(&mut registry, "mqtt_dropped", "MQTT messages dropped for subscribers that did not keep up");
        let mqtt_feed_dropped =
            gauge(&mut registry, "mqtt_feed_dropped", "Feed messages dropped because the broker's queue was full");
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let c = Counter::<u64, AtomicU64>::default();
            registry.register(name, help, c.clone());
            c
        };
        let login_failures =
            counter(&mut registry, "login_failures", "API requests whose credentials did not authenticate");
        let login_refusals = counter(
            &mut registry,
            "login_refusals",
            "API requests refused because their address was locked out after failed logins",
        );
        let connections_refused_per_address = counter(
            &mut registry,
            "http_connections_refused_per_address",
            "Connections closed at accept because their address had connections_per_address_max open",
        );
        let webhook_failed = Gauge::<i64, AtomicI64>::default();
        registry.register("webhook_failed", "Webhook deliveries that failed for good (kept)", webhook_failed.clone());
        Metrics {
            registry,
            webhook_attempts,
            webhook_pending,
            webhook_failed,
            ble_scanning,
            ble_adverts,
            ble_remote_adverts,
            ble_remote_dropped,
            ble_dropped,
            ble_rounds,
            mqtt_connections,
            mqtt_refused,
            mqtt_published,
            mqtt_dropped,
            mqtt_feed_dropped,
            started: Instant::now(),
            requests,
            request_seconds,
            queue_depth,
            workers_busy,
            requests_in_flight,
            connections_open,
            rejected_busy,
            uptime_seconds,
            database_bytes,
            viewed_dropped,
            writes_failing,
            disk_free_bytes,
            login_failures,
            login_refusals,
            connections_refused_per_address,
        }
    }

    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The text exposition; gauges read at this moment are set by the caller first.
    pub fn render(&self) -> String {
        self.uptime_seconds.set(i64::try_from(self.uptime_secs()).unwrap_or(i64::MAX));
        let mut out = String::with_capacity(4096);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            log::error!("cannot encode metrics: {e}");
        }
        out
    }
}

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
