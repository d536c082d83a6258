//! The live source: BLE adverts from BlueZ, on the process's tokio runtime.
//!
//! btleplug drives the adapter: finds it, watches its power, starts and stops scanning. The
//! adverts themselves are read from bluez-async's event stream (the library btleplug itself
//! reads BlueZ with on Linux), on a D-Bus connection of their own: btleplug's own event stream
//! asks bluetoothd for the whole device (a D-Bus round trip) before it passes on each RSSI or
//! data event, so a busy site (hundreds of tags, phones) is read at the pace of those round
//! trips and falls behind, while the signals themselves carry all an advert needs
//! (BENCHMARKS.md, "The live BLE path under a flood").
//!
//! BlueZ turns one advertisement into one PropertiesChanged signal, which bluez-async splits
//! into an RSSI event followed by a data event for each kind of data, and when the data did
//! not change and no scan asked for duplicates, into the RSSI event alone. They become one
//! [`Advert`] here: an RSSI event waits briefly for its data events, and otherwise goes out
//! with the device's last known data. Events carry no time: each advert is stamped on arrival.
//!
//! BlueZ is not always there: the adapter may be missing or powered off, and a restart of
//! bluetoothd is silent (the event stream just stops). So the source runs in rounds: find the
//! adapter, scan; when the adapter goes away, or nothing arrives for `scan_watchdog_s`, it
//! tears the round down and starts another: at once after a round that scanned (a quiet
//! site), after a pause that grows while rounds fail (BlueZ or the adapter missing). A
//! powered-off adapter is watched within the round and scanned again once it is back.
//!
//! The D-Bus connections (btleplug's `Manager`, bluez-async's session) are kept from round to
//! round: each one made holds its connection for as long as the bus keeps it open, whatever
//! becomes of the `Manager`, and the bus allows a user some 256. New ones are made only once
//! the old ones' connection is lost (the bus restarted).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bluez_async::{AdapterEvent, AdapterId, BluetoothEvent, BluetoothSession, DeviceEvent, DeviceId};
use btleplug::api::{Central, CentralState, Manager as _, ScanFilter};
use btleplug::platform::{Adapter, Manager};
use futures_util::{FutureExt as _, StreamExt};

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

/// How a round ended without failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Stopping,
    /// Scanning, nothing heard for the watchdog's time (a quiet site, or bluetoothd gone).
    Quiet,
    /// The adapter stayed off for the watchdog's time.
    StayedOff,
    NoMoreEvents,
}

impl Ended {
    fn text(self) -> &'static str {
        match self {
            Ended::Stopping => "stopping",
            Ended::Quiet => "no adverts within the watchdog time",
            Ended::StayedOff => "the adapter stayed off",
            Ended::NoMoreEvents => "the event stream ended",
        }
    }
}

/// Runs rounds of scanning until `stop` is set.
pub async fn run(settings: BleSettings, mut sink: impl Sink, state: Arc<ScanState>, stop: Arc<AtomicBool>) {
    let receiver: Arc<str> = settings.adapter.as_str().into();
    let mut bus = Bus::default();
    let mut fruitless = 0u32;
    let mut last_error = String::new();
    let mut last_ended = None;
    while !stop.load(Ordering::SeqCst) {
        state.rounds.fetch_add(1, Ordering::Relaxed);
        let heard_before = state.adverts.load(Ordering::Relaxed);
        let result = round(&settings, &mut bus, last_ended, &receiver, &mut sink, &state, &stop).await;
        let heard = state.adverts.load(Ordering::Relaxed) > heard_before;
        match &result {
            Ok(Ended::Stopping) => log::info!("BLE scan on {} stopped", settings.adapter),
            // A quiet site ends a round each watchdog period: said once, then at debug level.
            Ok(why) if Some(*why) == last_ended && !heard => {
                log::debug!("BLE scan on {} ended ({}); starting again", settings.adapter, why.text())
            }
            Ok(why) => log::info!("BLE scan on {} ended ({}); starting again", settings.adapter, why.text()),
            // The same failure again and again is said once (then at debug level).
            Err(e) if *e == last_error => log::debug!("BLE scan on {}: {e}", settings.adapter),
            Err(e) => {
                log::warn!(
                    "BLE scan on {}: {e}; trying again every {} s at most",
                    settings.adapter,
                    limits::BLE_RETRY_MAX_MS / 1000
                );
            }
        }
        state.scanning.store(false, Ordering::SeqCst);
        // A round that scanned worked, whether it heard anything or not (a quiet site): the
        // next starts at once. Rounds that fail back off, doubling, to the longest pause.
        // An adapter that stayed off is looked at every tick within the round: the next round
        // starts at once too, so that it is scanned with within a second of its power-on.
        let pause = match &result {
            Ok(Ended::Quiet | Ended::StayedOff | Ended::Stopping) => {
                fruitless = 0;
                Duration::ZERO
            }
            _ if heard => {
                fruitless = 0;
                retry_pause(0)
            }
            _ => {
                fruitless = fruitless.saturating_add(1);
                retry_pause(fruitless)
            }
        };
        match result {
            Ok(why) => {
                last_ended = Some(why);
                last_error.clear();
            }
            Err(e) => {
                last_ended = None;
                // A connection the bus has dropped (it restarted) fails every call at once:
                // the next round makes a new one.
                if e.contains("Failed to send message") || e.contains("Disconnected") {
                    bus = Bus::default();
                }
                last_error = e;
            }
        }
        let deadline = tokio::time::Instant::now() + pause;
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

type Events = std::pin::Pin<Box<dyn futures_util::Stream<Item = BluetoothEvent> + Send>>;

/// The two connections to the system bus, btleplug's for the adapter and bluez-async's for
/// the adverts, each made once and kept (a connection made stays open as long as the bus
/// keeps it, whatever becomes of its owner), and the adapter's event stream.
#[derive(Default)]
struct Bus {
    manager: Option<Manager>,
    session: Option<BluetoothSession>,
    /// Subscribed once per adapter and kept from round to round: a stream dropped while BlueZ
    /// still signals on it (the adapter's `Discovering` going false after the round's own
    /// stop) leaves its match rule on the bus (bluez-async cannot remove it), and the bus
    /// refuses a connection more rules after a few hundred: one stream a round left scanning
    /// dead after some hours of quiet.
    events: Option<(AdapterId, Events)>,
    /// Ready once bluez-async's connection is lost (the bus went away).
    lost: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

/// Connects what is not connected yet.
async fn connect(bus: &mut Bus) -> Result<(&Manager, &BluetoothSession), String> {
    let unreachable = |e: &dyn std::fmt::Display| format!("cannot reach BlueZ on the system bus: {e}");
    if bus.manager.is_none() {
        bus.manager = Some(Manager::new().await.map_err(|e| unreachable(&e))?);
    }
    if bus.session.is_none() {
        // The connection's own task is spawned by bluez-async; what it returns tells when the
        // connection is lost (the rounds look at every tick).
        let (lost, session) = BluetoothSession::new().await.map_err(|e| unreachable(&e))?;
        bus.session = Some(session);
        bus.lost = Some(Box::pin(lost.map(|_| ())));
    }
    match (&bus.manager, &bus.session) {
        (Some(manager), Some(session)) => Ok((manager, session)),
        _ => Err("no connection to the system bus".into()),
    }
}

/// The adapter named `name`, as btleplug and bluez-async know it.
async fn find_adapter(bus: &mut Bus, name: &str) -> Result<(Adapter, AdapterId), String> {
    let (manager, session) = connect(bus).await?;
    let timeout = Duration::from_millis(limits::BLE_CALL_TIMEOUT_MS);
    let late = |_| format!("BlueZ did not list the adapters within {} ms", limits::BLE_CALL_TIMEOUT_MS);
    let adapters = tokio::time::timeout(timeout, manager.adapters())
        .await
        .map_err(late)?
        .map_err(|e| format!("cannot list adapters: {e}"))?;
    let mut names = Vec::new();
    let mut found = None;
    for adapter in adapters {
        let info = adapter.adapter_info().await.unwrap_or_default();
        if info.split_whitespace().next() == Some(name) {
            found = Some(adapter);
            break;
        }
        names.push(info);
    }
    let Some(adapter) = found else {
        return Err(format!(
            "no adapter {name} (found: {})",
            if names.is_empty() { "none".into() } else { names.join(", ") }
        ));
    };
    let infos = tokio::time::timeout(timeout, session.get_adapters())
        .await
        .map_err(late)?
        .map_err(|e| format!("cannot list adapters: {e}"))?;
    // `hci0` is how an adapter id shows itself.
    let id = infos.into_iter().map(|a| a.id).find(|id| id.to_string() == name);
    let id = id.ok_or_else(|| format!("no adapter {name} (it went as it was looked up)"))?;
    Ok((adapter, id))
}

/// What BlueZ last said about a device's advertising data.
struct Known {
    mac: Mac,
    mfg: Vec<(u16, Vec<u8>)>,
    svc: Vec<(u16, Vec<u8>)>,
    /// Unix ms of its last event (the least recently heard are forgotten first).
    heard_ms: i64,
}

/// One round: adapter, events, scan, until something ends it.
async fn round(
    settings: &BleSettings,
    bus: &mut Bus,
    last_ended: Option<Ended>,
    receiver: &Arc<str>,
    sink: &mut impl Sink,
    state: &ScanState,
    stop: &AtomicBool,
) -> Result<Ended, String> {
    let (adapter, adapter_id) = find_adapter(bus, &settings.adapter).await?;
    let session = bus.session.clone().ok_or("no connection to the system bus")?;
    // The adapter's signals only (the bus filters them by path), and every device's arrival.
    // The devices BlueZ knew before are not in it: their properties (RSSI included) are what
    // BlueZ last heard, maybe long ago, and no adverts; a device's data is read when it is
    // heard again.
    if bus.events.as_ref().is_none_or(|(id, _)| *id != adapter_id) {
        let stream =
            session.adapter_event_stream(&adapter_id).await.map_err(|e| format!("cannot subscribe to events: {e}"))?;
        bus.events = Some((adapter_id.clone(), Box::pin(stream)));
    }
    let Some((_, events)) = bus.events.as_mut() else { return Err("no event stream".into()) };
    // What came since the last round (its own stop, the pause) was not heard in this one
    // (bounded: another program may keep the adapter scanning meanwhile).
    for _ in 0..limits::BLE_KNOWN_DEVICES_MAX {
        if !matches!(events.next().now_or_never(), Some(Some(_))) {
            break;
        }
    }
    let mut powered = adapter.adapter_state().await.map(|s| s == CentralState::PoweredOn).unwrap_or(false);
    if powered {
        adapter.start_scan(ScanFilter::default()).await.map_err(|e| format!("cannot start scanning: {e}"))?;
        state.scanning.store(true, Ordering::SeqCst);
        // Scanning again after a quiet round, or finding the adapter still off, is not news.
        if !matches!(last_ended, Some(Ended::Quiet | Ended::StayedOff)) {
            log::info!("BLE: scanning on {}", settings.adapter);
        } else {
            log::debug!("BLE: scanning on {}", settings.adapter);
        }
    } else if last_ended != Some(Ended::StayedOff) {
        log::warn!("BLE: adapter {} is powered off; waiting for it", settings.adapter);
    } else {
        log::debug!("BLE: adapter {} is powered off; waiting for it", settings.adapter);
    }
    let mut known: HashMap<DeviceId, Known> = HashMap::new();
    // An RSSI event waiting for the data event of the same advertisement.
    let mut pending: Option<(DeviceId, i16, i64)> = None;
    let mut quiet_since = tokio::time::Instant::now();
    let join_wait = Duration::from_millis(limits::BLE_JOIN_WAIT_MS);
    let tick = Duration::from_millis(250);
    loop {
        if stop.load(Ordering::SeqCst) {
            stop_scan(&adapter).await;
            return Ok(Ended::Stopping);
        }
        let wait = if pending.is_some() { join_wait } else { tick };
        let event = match tokio::time::timeout(wait, events.next()).await {
            Ok(Some(event)) => Some(event),
            Ok(None) => {
                bus.events = None;
                return Ok(Ended::NoMoreEvents);
            }
            Err(_) => None,
        };
        let Some(event) = event else {
            // Nothing within the wait: a pending RSSI goes out alone.
            if let Some((id, rssi, t)) = pending.take() {
                emit(&known, &id, rssi, t, receiver, sink, state);
            }
            // The bus went away (it restarted): new connections, in the next round.
            if bus.lost.as_mut().is_some_and(|lost| lost.as_mut().now_or_never().is_some()) {
                bus.lost = None;
                return Err("Disconnected: the connection to the system bus was lost".into());
            }
            // Powered off: look again every tick (a power-on after a bluetoothd restart is
            // not reported on this stream), and scan once it is on.
            if !powered
                && let Ok(Ok(CentralState::PoweredOn)) =
                    tokio::time::timeout(Duration::from_millis(limits::BLE_CALL_TIMEOUT_MS), adapter.adapter_state())
                        .await
            {
                log::info!("BLE: adapter {} powered on; scanning", settings.adapter);
                adapter.start_scan(ScanFilter::default()).await.map_err(|e| format!("cannot start scanning: {e}"))?;
                state.scanning.store(true, Ordering::SeqCst);
                powered = true;
                quiet_since = tokio::time::Instant::now();
                continue;
            }
            // Silence: BlueZ may have restarted (its adapter gone, or back without scanning);
            // a new round finds out. Powered off, the same: the adapter may come back as a new
            // object.
            if quiet_since.elapsed() >= settings.watchdog {
                stop_scan(&adapter).await;
                return Ok(if powered { Ended::Quiet } else { Ended::StayedOff });
            }
            continue;
        };
        let now = now_ms();
        let (id, event) = match event {
            BluetoothEvent::Device { id, event } => (id, event),
            BluetoothEvent::Adapter { id, event: AdapterEvent::Powered { powered: on } } if id == adapter_id => {
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
                quiet_since = tokio::time::Instant::now();
                continue;
            }
            _ => continue,
        };
        // Only adverts this adapter heard keep the watchdog off: other signals (another
        // adapter's devices arriving, discovery switched by another program, connections) go
        // on when bluetoothd has stopped scanning here.
        let advert = match &event {
            DeviceEvent::Rssi { .. } | DeviceEvent::ManufacturerData { .. } | DeviceEvent::ServiceData { .. } => true,
            DeviceEvent::Discovered => id.adapter() == adapter_id,
            _ => false,
        };
        if !advert {
            continue;
        }
        quiet_since = tokio::time::Instant::now();
        match event {
            DeviceEvent::Rssi { rssi } => {
                if let Some((pid, prssi, pt)) = pending.take() {
                    emit(&known, &pid, prssi, pt, receiver, sink, state);
                }
                if known.contains_key(&id) {
                    remember(&mut known, &id, now);
                } else {
                    // Known to BlueZ before this round, or forgotten since: a beacon that
                    // repeats itself sends no data events, so read its data once.
                    learn(&session, &id, &mut known, now).await;
                }
                pending = Some((id, rssi, now));
            }
            DeviceEvent::ManufacturerData { manufacturer_data } => {
                flush_other(&mut pending, &id, &known, receiver, sink, state);
                let entry = remember(&mut known, &id, now);
                entry.mfg = sorted(manufacturer_data.into_iter().collect());
            }
            DeviceEvent::ServiceData { service_data } => {
                flush_other(&mut pending, &id, &known, receiver, sink, state);
                let entry = remember(&mut known, &id, now);
                entry.svc = sorted(
                    service_data.into_iter().filter_map(|(uuid, data)| short_uuid(&uuid).map(|u| (u, data))).collect(),
                );
            }
            DeviceEvent::Discovered => {
                if let Some((pid, prssi, pt)) = pending.take() {
                    emit(&known, &pid, prssi, pt, receiver, sink, state);
                }
                // A device's first advertisement arrives with its discovery, as properties
                // rather than events: read them once.
                if let Some(rssi) = learn(&session, &id, &mut known, now).await {
                    emit(&known, &id, rssi, now, receiver, sink, state);
                }
            }
            _ => {}
        }
        if known.len() > limits::BLE_KNOWN_DEVICES_MAX {
            forget_older_half(&mut known);
        }
    }
}

/// Reads a device's advertising data from its properties into `known` (one D-Bus round trip);
/// returns the RSSI they carry.
async fn learn(
    session: &BluetoothSession,
    id: &DeviceId,
    known: &mut HashMap<DeviceId, Known>,
    now: i64,
) -> Option<i16> {
    let timeout = Duration::from_millis(limits::BLE_CALL_TIMEOUT_MS);
    let properties = tokio::time::timeout(timeout, session.get_device_info(id)).await.ok().and_then(Result::ok);
    let entry = remember(known, id, now);
    let p = properties?;
    entry.mfg = sorted(p.manufacturer_data.into_iter().collect());
    entry.svc =
        sorted(p.service_data.into_iter().filter_map(|(uuid, data)| short_uuid(&uuid).map(|u| (u, data))).collect());
    p.rssi
}

fn remember<'a>(known: &'a mut HashMap<DeviceId, Known>, id: &DeviceId, now: i64) -> &'a mut Known {
    let entry = known.entry(id.clone()).or_insert_with(|| Known {
        mac: mac_of(id),
        mfg: Vec::new(),
        svc: Vec::new(),
        heard_ms: now,
    });
    entry.heard_ms = now;
    entry
}

/// Phones rotate their addresses, so the devices heard grow without end: beyond
/// `BLE_KNOWN_DEVICES_MAX` the half heard least recently is forgotten (their data is read
/// again if they are heard again), the devices heard now kept.
fn forget_older_half(known: &mut HashMap<DeviceId, Known>) {
    let mut times: Vec<i64> = known.values().map(|k| k.heard_ms).collect();
    let middle = times.len() / 2;
    let (_, cut, _) = times.select_nth_unstable(middle);
    let cut = *cut;
    known.retain(|_, k| k.heard_ms > cut);
}

/// A data event for another device than the pending RSSI's: the pending advert goes out with
/// its device's last data. Data events of the same device stay with it: one advertisement
/// comes as its RSSI event and then a data event for each kind of data it carries
/// (manufacturer data, service data), and goes out once the next device's event arrives or
/// nothing more comes within `BLE_JOIN_WAIT_MS`.
fn flush_other(
    pending: &mut Option<(DeviceId, i16, i64)>,
    id: &DeviceId,
    known: &HashMap<DeviceId, Known>,
    receiver: &Arc<str>,
    sink: &mut impl Sink,
    state: &ScanState,
) {
    if pending.as_ref().is_some_and(|(pid, _, _)| pid != id)
        && let Some((pid, rssi, t)) = pending.take()
    {
        emit(known, &pid, rssi, t, receiver, sink, state);
    }
}

/// Stops scanning, waiting at most `BLE_CALL_TIMEOUT_MS` (a connection the bus dropped, or a
/// hung bluetoothd, answers nothing for the bus's 25 s).
async fn stop_scan(adapter: &Adapter) {
    let _ = tokio::time::timeout(Duration::from_millis(limits::BLE_CALL_TIMEOUT_MS), adapter.stop_scan()).await;
}

fn emit(
    known: &HashMap<DeviceId, Known>,
    id: &DeviceId,
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
fn mac_of(id: &DeviceId) -> Mac {
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
