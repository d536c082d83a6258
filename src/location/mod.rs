//! Location: adverts from BLE receivers, beacon identities, the zone engine, and the site map.

pub mod beacon;
pub mod ble;
pub mod devices;
pub mod engine;
pub mod queue;
pub mod replay;
pub mod service;
pub mod site;
pub mod survey;
pub mod trace;
