//! `[mqtt]` in config.toml: the raw keys and their validated form.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::bridge::BridgeSettings;
use super::broker::{BrokerSettings, TlsSettings};
use crate::config::{ConfigError, bounded, socket_addr};
use crate::limits;

pub const DEFAULT_MQTT_LISTEN: &str = "127.0.0.1:1883";
pub const DEFAULT_MQTTS_LISTEN: &str = "127.0.0.1:8883";
pub const DEFAULT_MQTTS_CLIENT_CERT_LISTEN: &str = "127.0.0.1:8884";

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawMqtt {
    pub enabled: Option<bool>,
    pub listen: Option<String>,
    pub connections_max: Option<usize>,
    pub packet_bytes_max: Option<u32>,
    pub client_queue_max: Option<usize>,
    pub handshake_timeout_ms: Option<u64>,
    pub open_topics: Option<bool>,
    pub tls_listen: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub client_ca: Option<String>,
    pub client_cert_listen: Option<String>,
    pub bridge_url: Option<String>,
    pub bridge_username: Option<String>,
    pub bridge_password: Option<String>,
    pub bridge_ca: Option<String>,
    pub bridge_client_id: Option<String>,
    pub bridge_prefix: Option<String>,
    pub bridge_queue_max: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct MqttConfig {
    pub enabled: bool,
    pub broker: BrokerSettings,
    pub bridge: Option<BridgeSettings>,
}

/// `relative` resolves a path of the file against the configuration's folder.
pub fn resolve_mqtt(raw: &RawMqtt, relative: &dyn Fn(&str) -> PathBuf) -> Result<MqttConfig, ConfigError> {
    let listen = socket_addr("mqtt.listen", raw.listen.as_deref().unwrap_or(DEFAULT_MQTT_LISTEN))?;
    let tls = match (&raw.tls_cert, &raw.tls_key) {
        (None, None) => {
            for (key, set) in [
                ("mqtt.tls_listen", raw.tls_listen.is_some()),
                ("mqtt.client_ca", raw.client_ca.is_some()),
                ("mqtt.client_cert_listen", raw.client_cert_listen.is_some()),
            ] {
                if set {
                    return Err(ConfigError::new(key, "needs mqtt.tls_cert and mqtt.tls_key"));
                }
            }
            None
        }
        (Some(_), None) => return Err(ConfigError::new("mqtt.tls_key", "is required with mqtt.tls_cert")),
        (None, Some(_)) => return Err(ConfigError::new("mqtt.tls_cert", "is required with mqtt.tls_key")),
        (Some(cert), Some(key)) => {
            let (cert, key) = (relative(cert), relative(key));
            crate::http::tls::check_files(&cert, &key)
                .map_err(|(which, message)| ConfigError::new(format!("mqtt.{which}"), message))?;
            let client_ca = match &raw.client_ca {
                None => {
                    if raw.client_cert_listen.is_some() {
                        return Err(ConfigError::new("mqtt.client_cert_listen", "needs mqtt.client_ca"));
                    }
                    None
                }
                Some(ca) => {
                    let ca = relative(ca);
                    crate::config::ca_certificates(&ca).map_err(|m| ConfigError::new("mqtt.client_ca", m))?;
                    let listen = socket_addr(
                        "mqtt.client_cert_listen",
                        raw.client_cert_listen.as_deref().unwrap_or(DEFAULT_MQTTS_CLIENT_CERT_LISTEN),
                    )?;
                    Some((listen, ca))
                }
            };
            Some(TlsSettings {
                listen: socket_addr("mqtt.tls_listen", raw.tls_listen.as_deref().unwrap_or(DEFAULT_MQTTS_LISTEN))?,
                cert,
                key,
                client_cert: client_ca,
            })
        }
    };
    let bridge = match &raw.bridge_url {
        None => {
            let others = [
                raw.bridge_username.is_some(),
                raw.bridge_password.is_some(),
                raw.bridge_ca.is_some(),
                raw.bridge_prefix.is_some(),
                raw.bridge_client_id.is_some(),
                raw.bridge_queue_max.is_some(),
            ];
            if others.into_iter().any(|set| set) {
                return Err(ConfigError::new("mqtt.bridge_url", "is required by the other bridge_ keys"));
            }
            None
        }
        // The bridge forwards the embedded broker's feed: without the broker it would never run.
        Some(_) if raw.enabled == Some(false) => {
            return Err(ConfigError::new("mqtt.bridge_url", "needs the broker (mqtt.enabled = true)"));
        }
        Some(url) => Some(resolve_bridge(raw, url, relative)?),
    };
    Ok(MqttConfig {
        bridge,
        enabled: raw.enabled.unwrap_or(true),
        broker: BrokerSettings {
            listen,
            connections_max: bounded(
                "mqtt.connections_max",
                raw.connections_max,
                limits::MQTT_CONNECTIONS_MAX_DEFAULT,
                1,
                limits::MQTT_CONNECTIONS_MAX_CEILING,
            )?,
            packet_bytes_max: bounded(
                "mqtt.packet_bytes_max",
                raw.packet_bytes_max,
                limits::MQTT_PACKET_BYTES_MAX_DEFAULT,
                1024,
                limits::MQTT_PACKET_BYTES_MAX_CEILING,
            )?,
            client_queue_max: bounded(
                "mqtt.client_queue_max",
                raw.client_queue_max,
                limits::MQTT_CLIENT_QUEUE_MAX_DEFAULT,
                1,
                limits::MQTT_CLIENT_QUEUE_MAX_CEILING,
            )?,
            handshake_timeout_ms: bounded(
                "mqtt.handshake_timeout_ms",
                raw.handshake_timeout_ms,
                limits::MQTT_HANDSHAKE_TIMEOUT_MS_DEFAULT,
                100,
                limits::MQTT_HANDSHAKE_TIMEOUT_MS_CEILING,
            )?,
            open_topics: raw.open_topics.unwrap_or(false),
            tls,
        },
    })
}

fn resolve_bridge(raw: &RawMqtt, url: &str, relative: &dyn Fn(&str) -> PathBuf) -> Result<BridgeSettings, ConfigError> {
    let bad = |m: &str| ConfigError::new("mqtt.bridge_url", format!("{url:?}: {m}"));
    let uri = url.parse::<http::Uri>().map_err(|_| bad("is not mqtt://HOST[:PORT] or mqtts://HOST[:PORT]"))?;
    let tls = match uri.scheme_str() {
        Some("mqtt") => false,
        Some("mqtts") => true,
        _ => return Err(bad("the scheme is mqtt or mqtts")),
    };
    let host = uri.host().filter(|h| !h.is_empty()).ok_or_else(|| bad("has no host"))?;
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(bad("has a path"));
    }
    if uri.query().is_some() {
        return Err(bad("has a query"));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if authority.contains('@') {
        return Err(bad("has credentials: give them as bridge_username and bridge_password"));
    }
    // The port as written (the URI parser gives none for `:18790x` or `:99999`).
    let port_text = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once("]:").map(|(_, p)| p),
        None => authority.split_once(':').map(|(_, p)| p),
    };
    let port = match port_text {
        None => {
            if tls {
                8883
            } else {
                1883
            }
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(bad("has a port that is not 1..65535")),
        },
    };
    let ca = match &raw.bridge_ca {
        None => None,
        Some(p) => {
            if !tls {
                return Err(ConfigError::new("mqtt.bridge_ca", "is for an mqtts:// bridge_url"));
            }
            let p = relative(p);
            crate::config::ca_certificates(&p).map_err(|m| ConfigError::new("mqtt.bridge_ca", m))?;
            Some(p)
        }
    };
    let prefix = raw.bridge_prefix.clone().unwrap_or_default();
    if prefix.contains(['+', '#']) || prefix.len() > 128 {
        return Err(ConfigError::new("mqtt.bridge_prefix", "is up to 128 bytes without + or #"));
    }
    // Topics are the prefix and then `{org}/...`: without its `/`, "site-a" made "site-aacme/...".
    if !prefix.is_empty() && !prefix.ends_with('/') {
        return Err(ConfigError::new("mqtt.bridge_prefix", format!("ends with / (\"{prefix}/\")")));
    }
    if prefix.starts_with('$') {
        return Err(ConfigError::new("mqtt.bridge_prefix", "must not start with $ (the broker's own topics)"));
    }
    let client_id = match &raw.bridge_client_id {
        Some(id) if !id.is_empty() && id.len() <= 64 => id.clone(),
        Some(_) => return Err(ConfigError::new("mqtt.bridge_client_id", "is 1..64 bytes")),
        None => {
            let node = rustix::system::uname().nodename().to_string_lossy().into_owned();
            format!("sitegate-{node}").chars().take(64).collect()
        }
    };
    Ok(BridgeSettings {
        host,
        port,
        tls,
        username: raw.bridge_username.clone(),
        password: raw.bridge_password.clone(),
        ca,
        client_id,
        prefix,
        queue_max: bounded(
            "mqtt.bridge_queue_max",
            raw.bridge_queue_max,
            limits::MQTT_BRIDGE_QUEUE_MAX_DEFAULT,
            1,
            limits::MQTT_BRIDGE_QUEUE_MAX_CEILING,
        )?,
    })
}

impl MqttConfig {
    pub fn to_raw(&self) -> RawMqtt {
        let b = &self.broker;
        RawMqtt {
            enabled: Some(self.enabled),
            listen: Some(b.listen.to_string()),
            connections_max: Some(b.connections_max),
            packet_bytes_max: Some(b.packet_bytes_max),
            client_queue_max: Some(b.client_queue_max),
            handshake_timeout_ms: Some(b.handshake_timeout_ms),
            open_topics: Some(b.open_topics),
            tls_listen: b.tls.as_ref().map(|t| t.listen.to_string()),
            tls_cert: b.tls.as_ref().map(|t| t.cert.display().to_string()),
            tls_key: b.tls.as_ref().map(|t| t.key.display().to_string()),
            client_ca: b.tls.as_ref().and_then(|t| t.client_cert.as_ref()).map(|(_, ca)| ca.display().to_string()),
            client_cert_listen: b.tls.as_ref().and_then(|t| t.client_cert.as_ref()).map(|(l, _)| l.to_string()),
            bridge_url: self.bridge.as_ref().map(|g| {
                let host = if g.host.contains(':') { format!("[{}]", g.host) } else { g.host.clone() };
                format!("{}://{host}:{}", if g.tls { "mqtts" } else { "mqtt" }, g.port)
            }),
            bridge_username: self.bridge.as_ref().and_then(|g| g.username.clone()),
            bridge_password: self.bridge.as_ref().and_then(|g| g.password.as_ref().map(|_| "(set)".to_string())),
            bridge_ca: self.bridge.as_ref().and_then(|g| g.ca.as_ref().map(|p| p.display().to_string())),
            bridge_client_id: self.bridge.as_ref().map(|g| g.client_id.clone()),
            bridge_prefix: self.bridge.as_ref().map(|g| g.prefix.clone()),
            bridge_queue_max: self.bridge.as_ref().map(|g| g.queue_max),
        }
    }
}
