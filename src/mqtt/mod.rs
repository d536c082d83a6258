//! The MQTT side of the gateway: the embedded broker (`broker`, the only user of rmqtt), the
//! topic rules (`acl`) and the feed the location engine publishes (`feed`).

pub mod acl;
pub mod bridge;
pub mod broker;
pub mod certs;
pub mod config;
pub mod feed;
pub mod ingest;
pub mod reaper;
