//! `[mqtt]` in config.toml: the raw keys and their validated form.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::broker::BrokerSettings;
use crate::config::{ConfigError, bounded};
use crate::limits;

pub const DEFAULT_MQTT_LISTEN: &str = "127.0.0.1:1883";

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
}

#[derive(Debug, Clone)]
pub struct MqttConfig {
    pub enabled: bool,
    pub broker: BrokerSettings,
}

pub fn resolve_mqtt(raw: &RawMqtt) -> Result<MqttConfig, ConfigError> {
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_MQTT_LISTEN);
    let listen = listen_text
        .parse::<SocketAddr>()
        .map_err(|_| ConfigError::new("mqtt.listen", format!("{listen_text:?} is not an IP:PORT address")))?;
    Ok(MqttConfig {
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
        },
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
        }
    }
}
