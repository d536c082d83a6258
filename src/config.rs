//! Configuration: the raw mirror of config.toml (`Raw*`, serde types) and the validated,
//! resolved form (`Config`) the rest of the program uses.
//!
//! Resolution turns relative paths into paths relative to the config file's folder, checks
//! every value against the bounds in `limits`, and reports the first problem as a
//! [`ConfigError`] naming the key. `main` maps that error to exit status 78.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::limits;
use crate::location::site::{
    LocationConfig, RawArea, RawBuilding, RawFloor, RawLocation, RawReceiver, RawSiteMap, RawTagType, RawZone, Site,
};
use crate::model::{CustomField, CustomFieldKind, RecordType};

/// A configuration problem, naming the key it is about.
#[derive(Debug)]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError { key: key.into(), message: message.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() { write!(f, "{}", self.message) } else { write!(f, "`{}`: {}", self.key, self.message) }
    }
}

// ---------------------------------------------------------------------------------------------
// Raw mirror of config.toml

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub http: RawHttp,
    pub store: RawStore,
    pub api: RawApi,
    pub site: RawSite,
    pub log: RawLog,
    pub webhooks: RawWebhooks,
    pub organizations: Vec<RawOrganization>,
    pub fields: Vec<RawField>,
    pub location: RawLocation,
    pub mqtt: crate::mqtt::config::RawMqtt,
    pub areas: Vec<RawArea>,
    pub buildings: Vec<RawBuilding>,
    pub floors: Vec<RawFloor>,
    pub zones: Vec<RawZone>,
    pub receivers: Vec<RawReceiver>,
    pub tag_types: Vec<RawTagType>,
    pub alert_rules: Vec<crate::alerts::rules::RawAlertRule>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHttp {
    pub listen: Option<String>,
    pub workers: Option<usize>,
    pub heavy_workers: Option<usize>,
    pub queue_depth_max: Option<usize>,
    pub connections_max: Option<usize>,
    pub connections_per_address_max: Option<usize>,
    pub body_bytes_max: Option<usize>,
    pub upload_bytes_max: Option<usize>,
    pub batch_bytes_max: Option<usize>,
    pub header_read_timeout_ms: Option<u64>,
    pub body_read_timeout_ms: Option<u64>,
    pub send_timeout_ms: Option<u64>,
    pub read_time_max_ms: Option<u64>,
    pub tls_listen: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub metrics_token: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub path: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawApi {
    pub quota_calls_per_hour: Option<u32>,
    pub login_failures_max: Option<u32>,
    pub login_lockout_s: Option<u64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSite {
    pub timezone: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawWebhooks {
    pub retry_delays_s: Option<Vec<u64>>,
    pub connect_timeout_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub workers: Option<usize>,
    pub backlog_max: Option<u64>,
    pub retention_days: Option<u64>,
    pub ca: Option<String>,
    pub local_targets: Option<bool>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    pub level: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawOrganization {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawField {
    pub id: i64,
    pub label: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub record_types: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Resolved configuration

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this configuration was read from; `None` for the built-in defaults.
    pub source: Option<PathBuf>,
    pub http: HttpConfig,
    pub store: StoreConfig,
    pub api: ApiConfig,
    pub site: SiteConfig,
    pub log: LogConfig,
    pub webhooks: WebhooksConfig,
    pub organizations: Vec<Organization>,
    pub fields: Arc<Vec<CustomField>>,
    pub location: LocationConfig,
    pub mqtt: crate::mqtt::config::MqttConfig,
    pub alert_rules: Arc<Vec<crate::alerts::rules::Rule>>,
    /// The site map: areas, buildings, floors, zones, receivers, tag types.
    pub site_map: Arc<Site>,
}

#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    pub workers: usize,
    /// Of the workers, those that take requests whose cost grows with the data (at most
    /// `workers`).
    pub heavy_workers: usize,
    pub queue_depth_max: usize,
    pub connections_max: usize,
    /// Open connections from one client address (IPv6: one /64).
    pub connections_per_address_max: usize,
    pub body_bytes_max: usize,
    /// The body limit of multipart/form-data requests (file uploads).
    pub upload_bytes_max: usize,
    /// The body limit of `POST /batch` (multipart/mixed).
    pub batch_bytes_max: usize,
    pub header_read_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
    pub send_timeout_ms: u64,
    /// How long one request's reads may run before they stop (503).
    pub read_time_max_ms: u64,
    pub tls: Option<TlsConfig>,
    /// When set, `/metrics` answers only `Authorization: Bearer <token>`.
    pub metrics_token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub quota_calls_per_hour: u32,
    /// Failed logins from one client address that lock it out, and for how long.
    pub login_failures_max: u32,
    pub login_lockout_s: u64,
}

#[derive(Debug, Clone)]
pub struct SiteConfig {
    pub timezone_name: String,
    pub timezone: jiff::tz::TimeZone,
}

#[derive(Debug, Clone)]
pub struct WebhooksConfig {
    pub retry_delays_s: Vec<u64>,
    pub connect_timeout_ms: u64,
    pub timeout_ms: u64,
    pub workers: usize,
    pub backlog_max: u64,
    pub retention_days: u64,
    /// The CA certificates https receivers' certificates must chain to, instead of the
    /// public CAs built in.
    pub ca: Option<WebhookCa>,
    /// Deliveries may go to loopback and link-local addresses (the gateway itself, a cloud's
    /// metadata service); refused unless set.
    pub local_targets: bool,
}

#[derive(Debug, Clone)]
pub struct WebhookCa {
    pub path: PathBuf,
    /// The certificates of the file, DER-encoded, each one a valid trust anchor.
    pub certs: Arc<Vec<Vec<u8>>>,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub level: log::LevelFilter,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Organization {
    pub id: String,
    pub name: String,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_TLS_LISTEN: &str = "127.0.0.1:8443";
pub const DEFAULT_STORE_PATH: &str = "data/sitegate.db";
pub const DEFAULT_ORG_ID: &str = "main";
pub const DEFAULT_ORG_NAME: &str = "Main organisation";

/// Where the configuration comes from, as the command line says.
pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
    match explicit {
        Some(path) => {
            if path.is_dir() {
                return Err(ConfigError::new("", format!("{} is a folder, not a configuration file", path.display())));
            }
            if !path.is_file() {
                return Err(ConfigError::new("", format!("configuration file {} does not exist", path.display())));
            }
            load_file(path)
        }
        None => {
            let local = Path::new("config.toml");
            if local.is_file() { load_file(local) } else { resolve(RawConfig::default(), None) }
        }
    }
}

fn load_file(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| ConfigError::new("", format!("cannot read configuration file {}: {err}", path.display())))?;
    let raw = parse(&text).map_err(|mut err| {
        err.message = format!("in {}: {}", path.display(), err.message);
        err
    })?;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    resolve(raw, Some(&absolute))
}

/// Parses config.toml text; the error names the offending key where toml tells it.
pub fn parse(text: &str) -> Result<RawConfig, ConfigError> {
    toml::from_str::<RawConfig>(text).map_err(|err| {
        let key = key_at(text, err.span());
        let message = match err.span() {
            Some(span) => {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!("line {line}, column {column}: {}", err.message())
            }
            None => err.message().to_string(),
        };
        ConfigError::new(key, message)
    })
}

/// Best effort: the dotted key whose value or name sits at `span` in the TOML text.
fn key_at(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return String::new();
    };
    let start = span.start.min(text.len());
    let mut table = String::new();
    let mut key = String::new();
    let mut offset = 0;
    // How many of each array of tables (`[[name]]`) came before: its index.
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in text.split_inclusive('\n') {
        let line_end = offset + line.len();
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let header = trimmed.split('#').next().unwrap_or("").trim();
            table = header.trim_matches(|c| c == '[' || c == ']').trim().to_string();
            if header.starts_with("[[") {
                let seen = arrays.entry(table.clone()).or_default();
                table = format!("{table}[{seen}]");
                *seen += 1;
            }
            key.clear();
        } else if let Some((name, _)) = trimmed.split_once('=')
            && !trimmed.starts_with('#')
        {
            key = name.trim().to_string();
        } else if start < line_end {
            // A line that is neither a table nor a key (a syntax error): the key before it
            // is not the one at fault.
            key.clear();
        }
        if start < line_end {
            if trimmed.starts_with('[') {
                return table;
            }
            break;
        }
        offset = line_end;
    }
    match (table.is_empty(), key.is_empty()) {
        (true, _) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}

/// The certificates of a PEM file of CA certificates: at least one, and each usable as a
/// trust anchor.
pub(crate) fn ca_certificates(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
        rustls::RootCertStore::empty()
            .add(cert.clone())
            .map_err(|e| format!("{}: certificate {}: {e}", path.display(), certs.len() + 1))?;
        certs.push(cert.to_vec());
    }
    if certs.is_empty() {
        return Err(format!("{} has no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display()));
    }
    Ok(certs)
}

/// Validates a raw configuration and resolves it. `source` is the config file (absolute), if
/// any: relative paths are relative to its folder, else to the current directory.
pub fn resolve(raw: RawConfig, source: Option<&Path>) -> Result<Config, ConfigError> {
    let base = source.and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let relative = |value: &str| -> PathBuf {
        let path = Path::new(value);
        if path.is_absolute() { path.to_path_buf() } else { base.join(path) }
    };

    // [http]
    let h = &raw.http;
    let listen = socket_addr("http.listen", h.listen.as_deref().unwrap_or(DEFAULT_LISTEN))?;
    let workers = bounded("http.workers", h.workers, limits::HTTP_WORKERS_DEFAULT, 1, limits::HTTP_WORKERS_CEILING)?;
    // Left out, at most all the workers (a site of one or two workers has none kept for
    // requests of one item); set, within them.
    let heavy_workers =
        bounded("http.heavy_workers", h.heavy_workers, limits::HTTP_HEAVY_WORKERS_DEFAULT.min(workers), 1, workers)?;
    let queue_depth_max = bounded(
        "http.queue_depth_max",
        h.queue_depth_max,
        limits::HTTP_QUEUE_DEPTH_MAX_DEFAULT,
        1,
        limits::HTTP_QUEUE_DEPTH_MAX_CEILING,
    )?;
    let connections_max = bounded(
        "http.connections_max",
        h.connections_max,
        limits::HTTP_CONNECTIONS_MAX_DEFAULT,
        1,
        limits::HTTP_CONNECTIONS_MAX_CEILING,
    )?;
    let connections_per_address_max = bounded(
        "http.connections_per_address_max",
        h.connections_per_address_max,
        limits::HTTP_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT.min(connections_max),
        1,
        connections_max,
    )?;
    let body_bytes_max = bounded(
        "http.body_bytes_max",
        h.body_bytes_max,
        limits::HTTP_BODY_BYTES_MAX_DEFAULT,
        1024,
        limits::HTTP_BODY_BYTES_MAX_CEILING,
    )?;
    let upload_bytes_max = bounded(
        "http.upload_bytes_max",
        h.upload_bytes_max,
        limits::HTTP_UPLOAD_BYTES_MAX_DEFAULT,
        1024,
        limits::HTTP_UPLOAD_BYTES_MAX_CEILING,
    )?;
    let batch_bytes_max = bounded(
        "http.batch_bytes_max",
        h.batch_bytes_max,
        limits::HTTP_BATCH_BYTES_MAX_DEFAULT,
        1024,
        limits::HTTP_BATCH_BYTES_MAX_CEILING,
    )?;
    let header_read_timeout_ms = bounded(
        "http.header_read_timeout_ms",
        h.header_read_timeout_ms,
        limits::HTTP_HEADER_READ_TIMEOUT_MS_DEFAULT,
        limits::HTTP_TIMEOUT_MS_FLOOR,
        limits::HTTP_TIMEOUT_MS_CEILING,
    )?;
    let body_read_timeout_ms = bounded(
        "http.body_read_timeout_ms",
        h.body_read_timeout_ms,
        limits::HTTP_BODY_READ_TIMEOUT_MS_DEFAULT,
        limits::HTTP_TIMEOUT_MS_FLOOR,
        limits::HTTP_TIMEOUT_MS_CEILING,
    )?;
    let read_time_max_ms = bounded(
        "http.read_time_max_ms",
        h.read_time_max_ms,
        limits::HTTP_READ_TIME_MAX_MS_DEFAULT,
        limits::HTTP_TIMEOUT_MS_FLOOR,
        limits::HTTP_TIMEOUT_MS_CEILING,
    )?;
    let send_timeout_ms = bounded(
        "http.send_timeout_ms",
        h.send_timeout_ms,
        limits::HTTP_SEND_TIMEOUT_MS_DEFAULT,
        limits::HTTP_TIMEOUT_MS_FLOOR,
        limits::HTTP_TIMEOUT_MS_CEILING,
    )?;
    let tls = match (&h.tls_cert, &h.tls_key) {
        (None, None) => {
            if h.tls_listen.is_some() {
                return Err(ConfigError::new("http.tls_listen", "needs http.tls_cert and http.tls_key"));
            }
            None
        }
        (Some(_), None) => {
            return Err(ConfigError::new("http.tls_key", "is required with http.tls_cert"));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new("http.tls_cert", "is required with http.tls_key"));
        }
        (Some(cert), Some(key)) => {
            let listen = socket_addr("http.tls_listen", h.tls_listen.as_deref().unwrap_or(DEFAULT_TLS_LISTEN))?;
            let (cert, key) = (relative(cert), relative(key));
            crate::http::tls::check_files(&cert, &key)
                .map_err(|(which, message)| ConfigError::new(format!("http.{which}"), message))?;
            Some(TlsConfig { listen, cert, key })
        }
    };

    let metrics_token = match &h.metrics_token {
        Some(t) if t.chars().count() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            return Err(ConfigError::new("http.metrics_token", "must be at least 16 characters without spaces"));
        }
        other => other.clone(),
    };

    // [store]
    let store_path = raw.store.path.as_deref().unwrap_or(DEFAULT_STORE_PATH);
    if store_path.trim().is_empty() {
        return Err(ConfigError::new("store.path", "must not be empty"));
    }
    if store_path.ends_with('/') {
        return Err(ConfigError::new(
            "store.path",
            "names a folder: give the database file (such as data/sitegate.db)",
        ));
    }

    // [api]
    let quota_calls_per_hour = bounded(
        "api.quota_calls_per_hour",
        raw.api.quota_calls_per_hour,
        limits::QUOTA_CALLS_PER_HOUR_DEFAULT,
        1,
        limits::QUOTA_CALLS_PER_HOUR_CEILING,
    )?;
    let login_failures_max = bounded(
        "api.login_failures_max",
        raw.api.login_failures_max,
        limits::AUTH_LOGIN_FAILURES_MAX_DEFAULT,
        1,
        limits::AUTH_LOGIN_FAILURES_MAX_CEILING,
    )?;
    let login_lockout_s = bounded(
        "api.login_lockout_s",
        raw.api.login_lockout_s,
        limits::AUTH_LOGIN_LOCKOUT_S_DEFAULT,
        1,
        limits::AUTH_LOGIN_LOCKOUT_S_CEILING,
    )?;

    // [site]
    let timezone_name = raw.site.timezone.clone().unwrap_or_else(|| "UTC".to_string());
    let timezone = jiff::tz::TimeZone::get(&timezone_name)
        .map_err(|_| ConfigError::new("site.timezone", format!("unknown IANA time zone {timezone_name:?}")))?;

    // [log]
    let level_name = raw.log.level.clone().unwrap_or_else(|| "info".to_string());
    let level = level_name
        .parse::<log::LevelFilter>()
        .map_err(|_| ConfigError::new("log.level", "must be one of off, error, warn, info, debug, trace"))?;

    // [webhooks]
    let w = &raw.webhooks;
    let retry_delays_s = w.retry_delays_s.clone().unwrap_or_else(|| limits::WEBHOOK_RETRY_DELAYS_S_DEFAULT.to_vec());
    if retry_delays_s.len() > limits::WEBHOOK_RETRIES_MAX
        || retry_delays_s.iter().any(|d| *d == 0 || *d > limits::WEBHOOK_RETRY_DELAY_S_MAX)
    {
        return Err(ConfigError::new(
            "webhooks.retry_delays_s",
            format!(
                "at most {} delays, each from 1 to {} seconds",
                limits::WEBHOOK_RETRIES_MAX,
                limits::WEBHOOK_RETRY_DELAY_S_MAX
            ),
        ));
    }
    let webhooks = WebhooksConfig {
        retry_delays_s,
        connect_timeout_ms: bounded(
            "webhooks.connect_timeout_ms",
            w.connect_timeout_ms,
            limits::WEBHOOK_CONNECT_TIMEOUT_MS_DEFAULT,
            limits::HTTP_TIMEOUT_MS_FLOOR,
            limits::HTTP_TIMEOUT_MS_CEILING,
        )?,
        timeout_ms: bounded(
            "webhooks.timeout_ms",
            w.timeout_ms,
            limits::WEBHOOK_TIMEOUT_MS_DEFAULT,
            limits::HTTP_TIMEOUT_MS_FLOOR,
            limits::HTTP_TIMEOUT_MS_CEILING,
        )?,
        workers: bounded(
            "webhooks.workers",
            w.workers,
            limits::WEBHOOK_WORKERS_DEFAULT,
            1,
            limits::WEBHOOK_WORKERS_CEILING,
        )?,
        backlog_max: bounded(
            "webhooks.backlog_max",
            w.backlog_max,
            limits::WEBHOOK_BACKLOG_MAX_DEFAULT,
            1,
            limits::WEBHOOK_BACKLOG_MAX_CEILING,
        )?,
        retention_days: bounded(
            "webhooks.retention_days",
            w.retention_days,
            limits::WEBHOOK_RETENTION_DAYS_DEFAULT,
            1,
            limits::WEBHOOK_RETENTION_DAYS_CEILING,
        )?,
        ca: match &w.ca {
            None => None,
            Some(p) => {
                let path = relative(p);
                let certs = ca_certificates(&path).map_err(|m| ConfigError::new("webhooks.ca", m))?;
                Some(WebhookCa { path, certs: Arc::new(certs) })
            }
        },
        local_targets: w.local_targets.unwrap_or(false),
    };

    // [[organizations]]
    let mut organizations = Vec::new();
    for (i, org) in raw.organizations.iter().enumerate() {
        if org.id.is_empty() || org.id.len() > 64 || !org.id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(ConfigError::new(format!("organizations[{i}].id"), "must be 1 to 64 ASCII letters and digits"));
        }
        if organizations.iter().any(|o: &Organization| o.id == org.id) {
            return Err(ConfigError::new(format!("organizations[{i}].id"), format!("{:?} appears twice", org.id)));
        }
        if org.name.trim().is_empty() || org.name.len() > limits::NAME_BYTES_MAX {
            return Err(ConfigError::new(format!("organizations[{i}].name"), "must be 1 to 255 bytes"));
        }
        organizations.push(Organization { id: org.id.clone(), name: org.name.clone() });
    }
    if organizations.is_empty() {
        organizations.push(Organization { id: DEFAULT_ORG_ID.into(), name: DEFAULT_ORG_NAME.into() });
    }

    // [[fields]]
    let mut fields: Vec<CustomField> = Vec::new();
    for (i, f) in raw.fields.iter().enumerate() {
        let key = |name: &str| format!("fields[{i}].{name}");
        if !(crate::model::CUSTOM_FIELD_ID_MIN..=crate::model::CUSTOM_FIELD_ID_MAX).contains(&f.id) {
            return Err(ConfigError::new(key("id"), "must be an integer from 1000 to 999999999"));
        }
        if fields.iter().any(|g| g.id == f.id) {
            return Err(ConfigError::new(key("id"), format!("{} appears twice", f.id)));
        }
        if f.label.trim().is_empty() || f.label.len() > limits::NAME_BYTES_MAX {
            return Err(ConfigError::new(key("label"), "must be 1 to 255 bytes"));
        }
        let kind = CustomFieldKind::parse(&f.kind)
            .ok_or_else(|| ConfigError::new(key("type"), "must be one of text, select, date, number"))?;
        if kind == CustomFieldKind::Select && f.options.is_empty() {
            return Err(ConfigError::new(key("options"), "a select field needs at least one option"));
        }
        if kind != CustomFieldKind::Select && !f.options.is_empty() {
            return Err(ConfigError::new(key("options"), "only select fields have options"));
        }
        let mut record_types = Vec::new();
        for segment in &f.record_types {
            let t = RecordType::from_segment(segment).ok_or_else(|| {
                ConfigError::new(
                    key("record_types"),
                    format!("{segment:?} is not one of contacts, companies, projectblogs, tickets"),
                )
            })?;
            if !record_types.contains(&t) {
                record_types.push(t);
            }
        }
        if record_types.is_empty() {
            record_types = RecordType::ALL.to_vec();
        }
        fields.push(CustomField { id: f.id, label: f.label.clone(), kind, options: f.options.clone(), record_types });
    }

    let location = crate::location::site::resolve_location(&raw.location)?;
    let mqtt = crate::mqtt::config::resolve_mqtt(&raw.mqtt, &|v: &str| relative(v))?;
    let site_map = crate::location::site::resolve_site(RawSiteMap {
        areas: &raw.areas,
        buildings: &raw.buildings,
        floors: &raw.floors,
        zones: &raw.zones,
        receivers: &raw.receivers,
        tag_types: &raw.tag_types,
    })?;
    let alert_rules = crate::alerts::rules::resolve_rules(&raw.alert_rules, &site_map)?;

    // The listeners: no two on one port of one address (the second could not start).
    let mut listeners: Vec<(&str, SocketAddr)> = vec![("http.listen", listen)];
    if let Some(t) = &tls {
        listeners.push(("http.tls_listen", t.listen));
    }
    if mqtt.enabled {
        listeners.push(("mqtt.listen", mqtt.broker.listen));
        if let Some(t) = &mqtt.broker.tls {
            listeners.push(("mqtt.tls_listen", t.listen));
            if let Some((addr, _)) = &t.client_cert {
                listeners.push(("mqtt.client_cert_listen", *addr));
            }
        }
    }
    for (i, (key, a)) in listeners.iter().enumerate() {
        for (other, b) in &listeners[..i] {
            let overlap = if a.is_ipv4() == b.is_ipv4() {
                a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified()
            } else {
                // `[::]` takes IPv4 too (Linux's default, net.ipv6.bindv6only = 0).
                [a, b].iter().any(|x| x.is_ipv6() && x.ip().is_unspecified())
            };
            if a.port() != 0 && a.port() == b.port() && overlap {
                return Err(ConfigError::new(
                    *key,
                    format!("{a} is also {other}'s address: each listener needs its own port"),
                ));
            }
        }
    }
    let store_file = relative(store_path);
    if store_file.is_dir() {
        return Err(ConfigError::new(
            "store.path",
            format!("{} is a folder: name the database file in it (e.g. data/sitegate.db)", store_file.display()),
        ));
    }

    Ok(Config {
        source: source.map(Path::to_path_buf),
        http: HttpConfig {
            listen,
            workers,
            heavy_workers,
            queue_depth_max,
            connections_max,
            connections_per_address_max,
            body_bytes_max,
            upload_bytes_max,
            batch_bytes_max,
            header_read_timeout_ms,
            body_read_timeout_ms,
            send_timeout_ms,
            read_time_max_ms,
            tls,
            metrics_token,
        },
        store: StoreConfig { path: store_file },
        api: ApiConfig { quota_calls_per_hour, login_failures_max, login_lockout_s },
        site: SiteConfig { timezone_name, timezone },
        log: LogConfig { level },
        webhooks,
        organizations,
        fields: Arc::new(fields),
        location,
        mqtt,
        alert_rules: Arc::new(alert_rules),
        site_map: Arc::new(site_map),
    })
}

pub fn socket_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse::<SocketAddr>().map_err(|_| ConfigError::new(key, format!("{value:?} is not an IP:PORT address")))
}

pub fn bounded<T>(key: &str, value: Option<T>, default: T, min: T, max: T) -> Result<T, ConfigError>
where
    T: PartialOrd + Copy + fmt::Display,
{
    let value = value.unwrap_or(default);
    if value < min || value > max {
        return Err(ConfigError::new(key, format!("{value} is outside {min}..={max}")));
    }
    Ok(value)
}

impl Config {
    /// The built-in defaults, as `serve` uses them without a config file.
    #[cfg(test)]
    pub fn defaults() -> Config {
        resolve(RawConfig::default(), None).expect("built-in defaults are valid")
    }

    /// The resolved configuration as TOML, every key explicit (for `check-config`).
    pub fn to_toml(&self) -> String {
        let path = |p: &Path| p.display().to_string();
        let raw = RawConfig {
            http: RawHttp {
                listen: Some(self.http.listen.to_string()),
                workers: Some(self.http.workers),
                heavy_workers: Some(self.http.heavy_workers),
                queue_depth_max: Some(self.http.queue_depth_max),
                connections_max: Some(self.http.connections_max),
                connections_per_address_max: Some(self.http.connections_per_address_max),
                body_bytes_max: Some(self.http.body_bytes_max),
                upload_bytes_max: Some(self.http.upload_bytes_max),
                batch_bytes_max: Some(self.http.batch_bytes_max),
                header_read_timeout_ms: Some(self.http.header_read_timeout_ms),
                body_read_timeout_ms: Some(self.http.body_read_timeout_ms),
                send_timeout_ms: Some(self.http.send_timeout_ms),
                read_time_max_ms: Some(self.http.read_time_max_ms),
                tls_listen: self.http.tls.as_ref().map(|t| t.listen.to_string()),
                tls_cert: self.http.tls.as_ref().map(|t| path(&t.cert)),
                tls_key: self.http.tls.as_ref().map(|t| path(&t.key)),
                metrics_token: self.http.metrics_token.as_ref().map(|_| "(set)".to_string()),
            },
            store: RawStore { path: Some(path(&self.store.path)) },
            api: RawApi {
                quota_calls_per_hour: Some(self.api.quota_calls_per_hour),
                login_failures_max: Some(self.api.login_failures_max),
                login_lockout_s: Some(self.api.login_lockout_s),
            },
            site: RawSite { timezone: Some(self.site.timezone_name.clone()) },
            log: RawLog { level: Some(self.log.level.to_string().to_lowercase()) },
            webhooks: RawWebhooks {
                retry_delays_s: Some(self.webhooks.retry_delays_s.clone()),
                connect_timeout_ms: Some(self.webhooks.connect_timeout_ms),
                timeout_ms: Some(self.webhooks.timeout_ms),
                workers: Some(self.webhooks.workers),
                backlog_max: Some(self.webhooks.backlog_max),
                retention_days: Some(self.webhooks.retention_days),
                ca: self.webhooks.ca.as_ref().map(|c| path(&c.path)),
                local_targets: Some(self.webhooks.local_targets),
            },
            organizations: self
                .organizations
                .iter()
                .map(|o| RawOrganization { id: o.id.clone(), name: o.name.clone() })
                .collect(),
            fields: self
                .fields
                .iter()
                .map(|f| RawField {
                    id: f.id,
                    label: f.label.clone(),
                    kind: f.kind.as_str().to_string(),
                    options: f.options.clone(),
                    record_types: f.record_types.iter().map(|t| t.segment().to_string()).collect(),
                })
                .collect(),
            location: self.location.to_raw(),
            mqtt: self.mqtt.to_raw(),
            areas: self.site_map.areas.iter().map(|a| RawArea { id: a.id, name: a.name.clone() }).collect(),
            buildings: self
                .site_map
                .buildings
                .iter()
                .map(|b| RawBuilding { id: b.id, name: b.name.clone(), area: self.site_map.areas[b.area].id })
                .collect(),
            floors: self
                .site_map
                .floors
                .iter()
                .map(|f| RawFloor {
                    id: f.id,
                    label: f.label.clone(),
                    level: f.level,
                    building: self.site_map.buildings[f.building].id,
                })
                .collect(),
            zones: self
                .site_map
                .zones
                .iter()
                .map(|z| RawZone {
                    id: z.id,
                    name: z.name.clone(),
                    floor: self.site_map.floors[z.floor].id,
                    transit: z.transit,
                    adjacent: z.adjacent.iter().map(|&a| self.site_map.zones[a].id).collect(),
                    fingerprints: z
                        .fingerprints
                        .iter()
                        .map(|f| f.iter().map(|&(r, dbm)| (self.site_map.receivers[r].id.clone(), dbm)).collect())
                        .collect(),
                })
                .collect(),
            receivers: self
                .site_map
                .receivers
                .iter()
                .map(|r| RawReceiver {
                    id: r.id.clone(),
                    zone: self.site_map.zones[r.zone].id,
                    position: format!("{},{}", r.lat, r.lon),
                    rssi_offset_db: r.rssi_offset_db,
                })
                .collect(),
            tag_types: self
                .site_map
                .tag_types
                .iter()
                .map(|t| RawTagType { id: t.id, title: t.title.clone(), alarm: t.alarm.map(|a| a.to_text()) })
                .collect(),
            alert_rules: self.alert_rules.iter().map(crate::alerts::rules::Rule::to_raw).collect(),
        };
        let mut out = String::new();
        match &self.source {
            Some(p) => out.push_str(&format!("# resolved from {}\n", p.display())),
            None => out.push_str("# built-in defaults (no configuration file)\n"),
        }
        out.push_str(&toml::to_string_pretty(&raw).unwrap_or_else(|e| format!("# cannot render: {e}\n")));
        out
    }

    pub fn default_org(&self) -> &Organization {
        &self.organizations[0]
    }

    pub fn org(&self, id: &str) -> Option<&Organization> {
        self.organizations.iter().find(|o| o.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_err(text: &str, key: &str) {
        let err = parse(text).and_then(|raw| resolve(raw, None)).unwrap_err();
        assert_eq!(err.key, key, "message: {}", err.message);
    }

    #[test]
    fn errors_name_the_key() {
        check_err("[http]\nworkers = 0\n", "http.workers");
        check_err("[http]\nworkers = \"x\"\n", "http.workers");
        check_err("[http]\nlisten = \"nope\"\n", "http.listen");
        check_err("[http]\nbogus = 1\n", "http.bogus");
        check_err("[site]\ntimezone = \"Mars/Base\"\n", "site.timezone");
        check_err("[store]\npath = \"newdir/\"\n", "store.path");
        check_err("[http]\nlisten = \"0.0.0.0:28690\"\n[mqtt]\nlisten = \"[::]:28690\"\n", "mqtt.listen");
        check_err("[http]\nmetrics_token = \"ééééééééé\"\n", "http.metrics_token");
        check_err("[mqtt]\nenabled = false\nbridge_url = \"mqtt://127.0.0.1:1884\"\n", "mqtt.bridge_url");
        check_err("[mqtt]\nbridge_password = \"x\"\n", "mqtt.bridge_url");
        check_err("[mqtt]\nbridge_url = \"mqtt://h?x=1\"\n", "mqtt.bridge_url");
        check_err("[mqtt]\nbridge_url = \"mqtt://h\"\nbridge_prefix = \"site-a\"\n", "mqtt.bridge_prefix");
        check_err("[mqtt]\nbridge_url = \"mqtt://h\"\nbridge_prefix = \"$SYS/\"\n", "mqtt.bridge_prefix");
        // A CA file must hold a certificate, not merely be readable.
        let junk = std::env::temp_dir().join(format!("sitegate-junk-ca-{}", std::process::id()));
        std::fs::write(&junk, [0x8a, 0x01, 0xff, 0x00, 0x42]).unwrap();
        check_err(
            &format!("[mqtt]\nbridge_url = \"mqtts://h\"\nbridge_ca = {:?}\n", junk.display().to_string()),
            "mqtt.bridge_ca",
        );
        let _ = std::fs::remove_file(&junk);
        check_err("[[organizations]]\nid = \"a-b\"\nname = \"x\"\n", "organizations[0].id");
        // Alert rules: settings of another kind of rule are refused, a missing one named.
        let rule = "[[alert_rules]]\nid = \"r\"\ntype = \"warn\"\n";
        check_err(&format!("{rule}when = \"not_seen\"\nminutes = 5\nzones = [22]\n"), "alert_rules[0].zones");
        check_err(&format!("{rule}when = \"not_seen\"\n"), "alert_rules[0].minutes");
        check_err(&format!("{rule}when = \"alarm\"\nbattery_v = 2.0\n"), "alert_rules[0].battery_v");
        check_err(&format!("{rule}when = \"battery_low\"\nbattery_v = 2.4\nminutes = 3\n"), "alert_rules[0].minutes");
        check_err(
            &format!("[[tag_types]]\nid = 2\ntitle = \"Visitor\"\n{rule}when = \"alarm\"\ntag_types = [2]\n"),
            "alert_rules[0].tag_types",
        );
        // Unknown keys and wrong types in an array of tables name the entry too.
        check_err(
            "[[organizations]]\nid = \"a\"\nname = \"x\"\n[[organizations]] # b\nid = \"b\"\nnam = \"y\"\n",
            "organizations[1].nam",
        );
        check_err("[[organizations]]\nid = 7\nname = \"x\"\n", "organizations[0].id");
        check_err("[[fields]]\nid = 1\nlabel = \"x\"\ntype = \"text\"\n", "fields[0].id");
        check_err("[[fields]]\nid = 1001\nlabel = \"x\"\ntype = \"blob\"\n", "fields[0].type");
        check_err("[[fields]]\nid = 1001\nlabel = \"x\"\ntype = \"select\"\n", "fields[0].options");
        check_err("[http]\ntls_cert = \"a.pem\"\n", "http.tls_key");
        check_err("[api]\nquota_calls_per_hour = 0\n", "api.quota_calls_per_hour");
        check_err("[http]\nheavy_workers = 17\n", "http.heavy_workers");
        check_err("[http]\nworkers = 2\nheavy_workers = 3\n", "http.heavy_workers");
    }

    /// A syntax error is placed by line and column, and blames no key it is not on.
    #[test]
    fn syntax_errors_say_where() {
        let err = parse("[http]\nworkers = 4\n\noops\n[store]\n").unwrap_err();
        assert_eq!(err.key, "http", "{err}");
        assert!(err.message.starts_with("line 4, column "), "{err}");
        let err = parse("[http]\nworkers = \"x\"\n").unwrap_err();
        assert_eq!(err.key, "http.workers", "{err}");
        assert!(err.message.starts_with("line 2, column 11: "), "{err}");
    }

    #[test]
    fn heavy_workers_left_out_are_at_most_the_workers() {
        let c = resolve(parse("[http]\nworkers = 2\n").unwrap(), None).unwrap();
        assert_eq!(c.http.heavy_workers, 2);
        let c = resolve(parse("[http]\nworkers = 16\n").unwrap(), None).unwrap();
        assert_eq!(c.http.heavy_workers, crate::limits::HTTP_HEAVY_WORKERS_DEFAULT);
    }

    #[test]
    fn defaults_resolve() {
        let c = Config::defaults();
        assert_eq!(c.http.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.organizations.len(), 1);
        assert_eq!(c.store.path, PathBuf::from(DEFAULT_STORE_PATH));
    }

    #[test]
    fn relative_paths_follow_the_file() {
        let raw = parse("[store]\npath = \"db/x.db\"\n").unwrap();
        let c = resolve(raw, Some(Path::new("/etc/sitegate/config.toml"))).unwrap();
        assert_eq!(c.store.path, PathBuf::from("/etc/sitegate/db/x.db"));
    }
}
