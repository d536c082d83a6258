//! The live source: BLE adverts from BlueZ through btleplug, on the process's tokio runtime.
//!
//! btleplug turns one advertisement into an RSSI event followed by a data event for the same
//! device, and when the data did not change (a beacon repeats itself), into the RSSI event
//! alone. Both become one [`Advert`] here: an RSSI event waits briefly for its data event, and
//! otherwise goes out with the device's last known data. Events carry no time: each advert is
//! stamped on arrival.
//!
//! BlueZ is not always there: the adapter may be missing or powered off, and a restart of
//! bluetoothd is silent (the event stream just stops). So the source runs in rounds: connect,
//! find the adapter, scan; when the adapter goes away, powers off, or nothing arrives for
//! `scan_watchdog_s`, it tears the round down and starts another after a pause.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use btleplug::api::{Central, CentralEvent, CentralState, Manager as _, Peripheral as _, ScanFilter};
use btleplug::platform::{Adapter, Manager, PeripheralId};
use futures_util::StreamExt;

use super::beacon::{Advert, Mac};
use crate::limits;
use crate::timefmt::now_ms;

/// How the live source is doing (for /health and the status page).
#[derive(Default)]
pub struct ScanState {
    /// Scanning now.
    pub scanning: AtomicBool,
    pub adverts: AtomicU64,
    /// Adverts dropped because the engine's queue was full.
    pub dropped: AtomicU64,
    /// Rounds started (1 + restarts).
    pub rounds: AtomicU64,
    /// Unix ms of the newest advert.
    pub last_advert_ms: AtomicU64,
}

/// Where adverts go: a bounded queue (a full queue drops and counts).
pub trait Sink: Send + 'static {
    /// Returns false when the advert was dropped.
    fn put(&mut self, advert: Advert) -> bool;
}

/// Settings of the live source.
#[derive(Clone, Debug)]
pub struct BleSettings {
    pub adapter: String,
    pub watchdog: Duration,
}

/// Runs rounds of scanning until `stop` is set.
pub async fn run(settings: BleSettings, mut sink: impl Sink, state: Arc<ScanState>, stop: Arc<AtomicBool>) {
    let receiver: Arc<str> = settings.adapter.as_str().into();
    let mut fruitless = 0u32;
    let mut last_error = String::new();
    while !stop.load(Ordering::SeqCst) {
        state.rounds.fetch_add(1, Ordering::Relaxed);
        let heard_before = state.adverts.load(Ordering::Relaxed);
        match round(&settings, &receiver, &mut sink, &state, &stop).await {
            Ok(why) => {
                log::info!("BLE scan on {} ended ({why}); starting again", settings.adapter);
                last_error.clear();
            }
            // The same failure again and again is said once (then at debug level).
            Err(e) if e == last_error => log::debug!("BLE scan on {}: {e}", settings.adapter),
            Err(e) => {
                log::warn!(
                    "BLE scan on {}: {e}; trying again every {} s at most",
                    settings.adapter,
                    limits::BLE_RETRY_MAX_MS / 1000
                );
                last_error = e;
            }
        }
        state.scanning.store(false, Ordering::SeqCst);
        let heard = state.adverts.load(Ordering::Relaxed) > heard_before;
        fruitless = if heard { 0 } else { fruitless.saturating_add(1) };
        let deadline = tokio::time::Instant::now() + retry_pause(fruitless);
        while tokio::time::Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The pause before the next round after `fruitless` rounds in a row that heard nothing: a
/// round that heard adverts worked (a bluetoothd restart ends those too), so the next one
/// starts after the shortest pause; rounds that hear nothing back off, doubling, to the
/// longest.
fn retry_pause(fruitless: u32) -> Duration {
    let doubled = limits::BLE_RETRY_MIN_MS.saturating_mul(1 << fruitless.saturating_sub(1).min(20));
    Duration::from_millis(doubled.min(limits::BLE_RETRY_MAX_MS))
}

async fn find_adapter(name: &str) -> Result<Adapter, String> {
    let manager = Manager::new().await.map_err(|e| format!("cannot reach BlueZ on the system bus: {e}"))?;
    let adapters = manager.adapters().await.map_err(|e| format!("cannot list adapters: {e}"))?;
    let mut names = Vec::new();
    for adapter in adapters {
        let info = adapter.adapter_info().await.unwrap_or_default();
        if info.split_whitespace().next() == Some(name) {
            return Ok(adapter);
        }
        names.push(info);
    }
    Err(format!("no adapter {name} (found: {})", if names.is_empty() { "none".into() } else { names.join(", ") }))
}

/// What btleplug last said about a device's advertising data.
struct Known {
    mac: Mac,
    mfg: Vec<(u16, Vec<u8>)>,
    svc: Vec<(u16, Vec<u8>)>,
}

/// One round: adapter, events, scan, until something ends it.
async fn round(
    settings: &BleSettings,
    receiver: &Arc<str>,
    sink: &mut impl Sink,
    state: &ScanState,
    stop: &AtomicBool,
) -> Result<&'static str, String> {
    let adapter = find_adapter(&settings.adapter).await?;
    let mut events = adapter.events().await.map_err(|e| format!("cannot subscribe to events: {e}"))?;
    // The devices BlueZ knows already: the stream starts with a made-up discovery of each,
    // whose properties (RSSI included) are what BlueZ last heard, maybe long ago. Those are no
    // adverts; the device's data is read when it is heard again.
    let mut cached: std::collections::HashSet<PeripheralId> = match adapter.peripherals().await {
        Ok(list) => list.iter().map(|p| p.id()).collect(),
        Err(_) => Default::default(),
    };
    let mut powered = adapter.adapter_state().await.map(|s| s == CentralState::PoweredOn).unwrap_or(false);
    if powered {
        adapter.start_scan(ScanFilter::default()).await.map_err(|e| format!("cannot start scanning: {e}"))?;
        state.scanning.store(true, Ordering::SeqCst);
        log::info!("BLE: scanning on {}", settings.adapter);
    } else {
        log::warn!("BLE: adapter {} is powered off; waiting for it", settings.adapter);
    }
    let mut known: HashMap<PeripheralId, Known> = HashMap::new();
    // An RSSI event waiting for the data event of the same advertisement.
    let mut pending: Option<(PeripheralId, i16, i64)> = None;
    let mut quiet_since = tokio::time::Instant::now();
    let join_wait = Duration::from_millis(limits::BLE_JOIN_WAIT_MS);
    let tick = Duration::from_millis(250);
    loop {
        if stop.load(Ordering::SeqCst) {
            let _ = adapter.stop_scan().await;
            return Ok("stopping");
        }
        let wait = if pending.is_some() { join_wait } else { tick };
        let event = match tokio::time::timeout(wait, events.next()).await {
            Ok(Some(event)) => Some(event),
            Ok(None) => return Ok("the event stream ended"),
            Err(_) => None,
        };
        let Some(event) = event else {
            // Nothing within the wait: a pending RSSI goes out alone.
            if let Some((id, rssi, t)) = pending.take() {
                emit(&known, &id, rssi, t, receiver, sink, state);
            }
            // Silence: BlueZ may have restarted (its adapter gone, or back without scanning);
            // a new round finds out. Powered off, the same: the adapter may come back as a new
            // object whose power-on is never reported on this stream.
            if quiet_since.elapsed() >= settings.watchdog {
                let _ = adapter.stop_scan().await;
                return Ok(if powered { "no adverts within the watchdog time" } else { "the adapter stayed off" });
            }
            continue;
        };
        quiet_since = tokio::time::Instant::now();
        let now = now_ms();
        match event {
            CentralEvent::RssiUpdate { id, rssi } => {
                if let Some((pid, prssi, pt)) = pending.take() {
                    emit(&known, &pid, prssi, pt, receiver, sink, state);
                }
                if !known.contains_key(&id) {
                    // Known to BlueZ before this round, or forgotten since: a beacon that
                    // repeats itself sends no data events, so read its data once.
                    learn(&adapter, &id, &mut known).await;
                }
                pending = Some((id, rssi, now));
            }
            CentralEvent::ManufacturerDataAdvertisement { id, manufacturer_data } => {
                let entry = remember(&mut known, &id);
                entry.mfg = sorted(manufacturer_data.into_iter().collect());
                flush_joined(&mut pending, &known, receiver, sink, state);
            }
            CentralEvent::ServiceDataAdvertisement { id, service_data } => {
                let entry = remember(&mut known, &id);
                entry.svc = sorted(
                    service_data.into_iter().filter_map(|(uuid, data)| short_uuid(&uuid).map(|u| (u, data))).collect(),
                );
                flush_joined(&mut pending, &known, receiver, sink, state);
            }
            CentralEvent::DeviceDiscovered(id) => {
                if let Some((pid, prssi, pt)) = pending.take() {
                    emit(&known, &pid, prssi, pt, receiver, sink, state);
                }
                if cached.remove(&id) {
                    continue; // made up for a device BlueZ knew already: not heard now
                }
                // A device's first advertisement arrives with its discovery, as properties
                // rather than events: read them once.
                if let Some(rssi) = learn(&adapter, &id, &mut known).await {
                    emit(&known, &id, rssi, now, receiver, sink, state);
                }
            }
            CentralEvent::DeviceUpdated(id) => {
                remember(&mut known, &id);
            }
            CentralEvent::StateUpdate(s) => {
                let on = s == CentralState::PoweredOn;
                if on && !powered {
                    log::info!("BLE: adapter {} powered on; scanning", settings.adapter);
                    adapter
                        .start_scan(ScanFilter::default())
                        .await
                        .map_err(|e| format!("cannot start scanning: {e}"))?;
                    state.scanning.store(true, Ordering::SeqCst);
                } else if !on && powered {
                    log::warn!("BLE: adapter {} powered off", settings.adapter);
                    state.scanning.store(false, Ordering::SeqCst);
                }
                powered = on;
            }
            _ => {}
        }
        if known.len() > limits::BLE_KNOWN_DEVICES_MAX {
            // Phones rotate their addresses: forget everyone rather than grow.
            known.clear();
        }
    }
}

/// Reads a device's advertising data from its properties into `known`; returns the RSSI they
/// carry.
async fn learn(adapter: &Adapter, id: &PeripheralId, known: &mut HashMap<PeripheralId, Known>) -> Option<i16> {
    let properties = match adapter.peripheral(id).await {
        Ok(p) => p.properties().await.ok().flatten(),
        Err(_) => None,
    };
    let entry = remember(known, id);
    let p = properties?;
    entry.mfg = sorted(p.manufacturer_data.into_iter().collect());
    entry.svc =
        sorted(p.service_data.into_iter().filter_map(|(uuid, data)| short_uuid(&uuid).map(|u| (u, data))).collect());
    p.rssi
}

fn remember<'a>(known: &'a mut HashMap<PeripheralId, Known>, id: &PeripheralId) -> &'a mut Known {
    known.entry(id.clone()).or_insert_with(|| Known { mac: mac_of(id), mfg: Vec::new(), svc: Vec::new() })
}

/// A data event right after its RSSI event: they are one advertisement. The pending RSSI goes
/// out with the data now known: its own advertisement's data when the data event is for the
/// same device, the device's last data otherwise.
fn flush_joined(
    pending: &mut Option<(PeripheralId, i16, i64)>,
    known: &HashMap<PeripheralId, Known>,
    receiver: &Arc<str>,
    sink: &mut impl Sink,
    state: &ScanState,
) {
    if let Some((pid, rssi, t)) = pending.take() {
        emit(known, &pid, rssi, t, receiver, sink, state);
    }
}

fn emit(
    known: &HashMap<PeripheralId, Known>,
    id: &PeripheralId,
    rssi: i16,
    t_ms: i64,
    receiver: &Arc<str>,
    sink: &mut impl Sink,
    state: &ScanState,
) {
    let (mac, mfg, svc) = match known.get(id) {
        Some(k) => (k.mac, k.mfg.clone(), k.svc.clone()),
        None => (mac_of(id), Vec::new(), Vec::new()),
    };
    let advert = Advert { t_ms, receiver: receiver.clone(), mac, rssi, mfg, svc };
    state.adverts.fetch_add(1, Ordering::Relaxed);
    state.last_advert_ms.store(u64::try_from(t_ms).unwrap_or(0), Ordering::Relaxed);
    if !sink.put(advert) {
        state.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

fn sorted<T: Ord, U>(mut v: Vec<(T, U)>) -> Vec<(T, U)> {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// `0000feaa-0000-1000-8000-00805f9b34fb` is the 16-bit UUID 0xFEAA.
fn short_uuid(uuid: &uuid::Uuid) -> Option<u16> {
    let b = uuid.as_bytes();
    let base = [0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0x80, 0x5f, 0x9b, 0x34, 0xfb];
    (b[0] == 0 && b[1] == 0 && b[4..] == base).then(|| u16::from_be_bytes([b[2], b[3]]))
}

/// The MAC in a BlueZ device id (`hci0/dev_AA_BB_CC_DD_EE_FF`).
fn mac_of(id: &PeripheralId) -> Mac {
    let text = id.to_string();
    text.rsplit("dev_").next().and_then(|m| Mac::parse(&m.replace('_', ":"))).unwrap_or(Mac([0; 6]))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rounds_that_heard_adverts_restart_at_once() {
        use super::retry_pause;
        let min = std::time::Duration::from_millis(crate::limits::BLE_RETRY_MIN_MS);
        assert_eq!(retry_pause(0), min);
        assert_eq!(retry_pause(1), min);
        assert_eq!(retry_pause(2), min * 2);
        assert_eq!(retry_pause(3), min * 4);
        assert_eq!(retry_pause(u32::MAX), std::time::Duration::from_millis(crate::limits::BLE_RETRY_MAX_MS));
    }

    #[test]
    fn short_uuids() {
        let u: uuid::Uuid = "0000feaa-0000-1000-8000-00805f9b34fb".parse().unwrap();
        assert_eq!(super::short_uuid(&u), Some(0xfeaa));
        let u: uuid::Uuid = "f7826da6-4fa2-4e98-8024-bc5b71e0893e".parse().unwrap();
        assert_eq!(super::short_uuid(&u), None);
    }
}
