//! The location engine inside the service: one thread ("location") takes adverts from the
//! live sources through a bounded queue, runs them through the [`Pipeline`], and writes what
//! it decides to the store in batches (one transaction per `LOCATION_FLUSH_MS`), so a busy
//! site never becomes a write per advert.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ble::ScanState;
use super::devices::Registry;
use super::engine::Output;
use super::queue::{AdvertReceiver, AdvertSender};
use super::replay::Pipeline;
use super::site::{EngineSettings, Site};
use crate::limits;
use crate::mqtt::feed::Feed;
use crate::store::{LocationBatch, LocationEvent, Store};
use crate::timefmt::now_ms;

/// The site map and engine settings in force; replaced on SIGHUP.
#[derive(Clone)]
pub struct SiteState {
    pub site: Arc<Site>,
    pub engine: EngineSettings,
    pub rules: Arc<Vec<crate::alerts::rules::Rule>>,
}

pub type SiteHandle = Arc<RwLock<SiteState>>;

pub fn site_handle(site: Arc<Site>, engine: EngineSettings, rules: Arc<Vec<crate::alerts::rules::Rule>>) -> SiteHandle {
    Arc::new(RwLock::new(SiteState { site, engine, rules }))
}

pub fn current(handle: &SiteHandle) -> SiteState {
    handle.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

pub struct LocationService {
    pub adverts: AdvertSender,
    pub scan: Arc<ScanState>,
    stop: Arc<AtomicBool>,
    /// Set when the site map changed: the engine starts over with it.
    reload: Arc<AtomicBool>,
    /// Sent once the engine has loaded: devices, placements kept from the last run, and the
    /// feed's restored states queued.
    pub started: Option<tokio::sync::oneshot::Receiver<()>>,
    thread: JoinHandle<()>,
}

impl LocationService {
    pub fn start(
        store: Arc<Store>,
        site: SiteHandle,
        scan: Arc<ScanState>,
        retention_days: u64,
        feed: Option<Feed>,
    ) -> std::io::Result<LocationService> {
        let (tx, rx) = super::queue::bounded(Arc::clone(&site));
        let stop = Arc::new(AtomicBool::new(false));
        let reload = Arc::new(AtomicBool::new(false));
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let thread = {
            let (stop, reload) = (Arc::clone(&stop), Arc::clone(&reload));
            std::thread::Builder::new().name("location".into()).spawn(move || {
                run(&store, &site, retention_days, feed, &rx, Control { stop, reload, started: started_tx })
            })?
        };
        Ok(LocationService { adverts: tx, scan, stop, reload, started: Some(started), thread })
    }

    /// The site map changed (SIGHUP): zone state starts over with the new map.
    pub fn site_changed(&self) {
        self.reload.store(true, Ordering::SeqCst);
    }

    /// Writes what is pending, closes the visits in progress, and joins the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        drop(self.adverts);
        let _ = self.thread.join();
    }
}

fn refresh_devices(store: &Store, feed: Option<&mut Feed>, alerts: &mut crate::alerts::Alerts) {
    match store.devices(None) {
        Ok(devices) => {
            if let Some(feed) = feed {
                feed.set_devices(store, &devices);
            }
            alerts.set_devices(&devices);
        }
        Err(e) => log::warn!("location: cannot read the devices for the feed and alerts: {e}"),
    }
}

fn load_registry(store: &Store) -> Vec<(i64, super::devices::Device)> {
    match store.devices(None) {
        Ok(devices) => devices.into_iter().map(|d| (d.id, d.device)).collect(),
        Err(e) => {
            log::warn!("location: cannot read the devices: {e}");
            Vec::new()
        }
    }
}

/// What the engine said since the last write, ready for the store.
#[derive(Default)]
pub struct Pending {
    events: Vec<LocationEvent>,
    /// Events dropped because too many were waiting (the database would not take them).
    dropped: u64,
    pub seen: HashMap<i64, i64>,
    pub battery: HashMap<i64, (i64, Option<u16>)>,
}

impl Pending {
    /// Takes the engine's outputs (decisions, updates) as store events.
    pub fn outputs(&mut self, pipeline: &Pipeline, outputs: &mut Vec<Output>) {
        for o in outputs.drain(..) {
            let zone_id = |z: usize| pipeline.site.zones[z].id;
            let key = |d: usize| pipeline.registry.key(d);
            let event = match o {
                Output::Enter { t_ms, device, zone } => {
                    key(device).map(|device_id| LocationEvent::Enter { device_id, t_ms, zone_id: zone_id(zone) })
                }
                Output::Exit { t_ms, device, zone } => {
                    key(device).map(|device_id| LocationEvent::Exit { device_id, t_ms, zone_id: zone_id(zone) })
                }
                Output::Update(u) => key(u.device).map(|device_id| LocationEvent::Update {
                    device_id,
                    t_ms: u.t_ms,
                    zone_id: zone_id(u.zone),
                    lat: u.lat,
                    lon: u.lon,
                    receiver: pipeline.site.receivers[u.receiver].id.clone(),
                    rssi: u.rssi_dbm,
                }),
            };
            if let Some(e) = event {
                if self.events.len() < limits::LOCATION_BATCH_EVENTS_MAX {
                    self.events.push(e);
                } else {
                    self.dropped += 1;
                }
            }
        }
    }

    /// A batch the store refused goes back in front, to be written with the next one (as far
    /// as the bound allows; what does not fit is counted and logged).
    pub fn put_back(&mut self, batch: LocationBatch) {
        let mut events = batch.events;
        let room = limits::LOCATION_BATCH_EVENTS_MAX.saturating_sub(self.events.len());
        if events.len() > room {
            self.dropped += (events.len() - room) as u64;
            events.truncate(room);
        }
        events.append(&mut self.events);
        self.events = events;
    }

    /// Events dropped since the last call.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// Everything pending as one batch for the store.
    pub fn take(&mut self) -> LocationBatch {
        let mut events = std::mem::take(&mut self.events);
        events.extend(self.seen.drain().map(|(device_id, t_ms)| LocationEvent::Seen { device_id, t_ms }));
        events.extend(self.battery.drain().map(|(device_id, (t_ms, mv))| LocationEvent::Battery {
            device_id,
            t_ms,
            mv,
        }));
        LocationBatch { events }
    }
}

/// Tells a step of the wall clock (NTP setting it, an operator's `date`) from time passing:
/// between two looks, the wall clock should move as the monotonic one does.
struct ClockSteps {
    wall_ms: i64,
    at: Instant,
}

impl ClockSteps {
    fn new() -> ClockSteps {
        ClockSteps { wall_ms: now_ms(), at: Instant::now() }
    }

    /// The wall clock now, and how far it was stepped since the last look, if it was (the
    /// caller follows the step: the next look does not see it again).
    fn look(&mut self) -> (i64, Option<i64>) {
        let (wall_ms, at) = (now_ms(), Instant::now());
        let passed = i64::try_from(at.duration_since(self.at).as_millis()).unwrap_or(i64::MAX);
        let step = wall_ms.saturating_sub(self.wall_ms).saturating_sub(passed);
        (self.wall_ms, self.at) = (wall_ms, at);
        (wall_ms, (step.abs() >= limits::LOCATION_CLOCK_STEP_MS_MIN).then_some(step))
    }
}

/// The wall clock was stepped by `step` ms: the engine's, the alerts' and the feed's times
/// move with it.
fn follow_step(
    step: i64,
    store: &Store,
    pipeline: &mut Pipeline,
    alerts: &mut crate::alerts::Alerts,
    feed: Option<&mut Feed>,
) {
    log::warn!("location: the system clock was set {step:+} ms; the engine's and the alerts' times follow");
    // The stays in progress too: set back, a stay would have begun after now, and be stored
    // as lasting nothing when the device leaves.
    if let Err(e) = store.shift_stays_in_progress(step) {
        log::warn!("location: cannot move the stays in progress with the clock: {e}");
    }
    pipeline.shift(step);
    alerts.shift(step);
    if let Some(feed) = feed {
        feed.shift(step);
    }
}

/// What the location thread reuses between adverts and batches.
#[derive(Default)]
struct Scratch {
    fired: Vec<crate::alerts::rules::Fired>,
    outputs: Vec<super::engine::Output>,
}

/// Writes what the engine decided up to now, then publishes it and gives it to the rules
/// (what the database refused is kept for the next write), and acts on what fired.
fn flush(
    store: &Store,
    clock: &mut ClockSteps,
    pipeline: &mut Pipeline,
    pending: &mut Pending,
    mut feed: Option<&mut Feed>,
    alerts: &mut crate::alerts::Alerts,
    scratch: &mut Scratch,
) {
    let (wall_ms, step) = clock.look();
    if let Some(step) = step {
        follow_step(step, store, pipeline, alerts, feed.as_deref_mut());
    }
    pipeline.tick_until(wall_ms, &mut scratch.outputs);
    pending.outputs(pipeline, &mut scratch.outputs);
    let batch = pending.take();
    let written = store.write_location_batch(&batch);
    // The write may wait (other writers, slow storage). A step of the clock meanwhile is
    // followed after the batch, which is judged in the times it was decided in: judged with
    // the stepped clock, an hour's step made everyone heard all along "not seen for an hour".
    let (wall_ms, step) = clock.look();
    let now = wall_ms.saturating_sub(step.unwrap_or(0));
    match written {
        Ok(()) => {
            if let Some(feed) = feed.as_deref_mut() {
                feed.batch(store, &pipeline.site, &batch.events, now);
            }
            alerts.batch(&batch.events, now, &mut scratch.fired);
        }
        Err(e) => {
            if !e.logged_once() {
                log::warn!("location: cannot write what the engine decided (kept for the next write): {e}");
            }
            pending.put_back(batch);
        }
    }
    alerts.acks(store, feed.as_deref_mut(), now, &mut scratch.fired);
    if let Some(step) = step {
        follow_step(step, store, pipeline, alerts, feed.as_deref_mut());
    }
    alerts.act(store, feed, &mut scratch.fired);
}

/// How the service steers the location thread.
struct Control {
    stop: Arc<AtomicBool>,
    reload: Arc<AtomicBool>,
    /// Told once the engine has loaded.
    started: tokio::sync::oneshot::Sender<()>,
}

fn run(
    store: &Store,
    site: &SiteHandle,
    retention_days: u64,
    mut feed: Option<Feed>,
    rx: &AdvertReceiver,
    control: Control,
) {
    let Control { stop, reload, started } = control;
    let state = current(site);
    let away_timeout_ms = i64::try_from(state.engine.away_timeout_ms).unwrap_or(i64::MAX);
    // The version before the devices: one added between the two reads is seen as a change at
    // the first flush (read after them, it was taken as followed and never was).
    let mut version = store.devices_version().unwrap_or(-1);
    let mut pipeline = Pipeline::new(state.site, Registry::new(load_registry(store)), state.engine);
    // Devices heard within the away timeout stay in the zones the last run had them in, with
    // their visits; the others' visits end where they were last heard.
    let start_ms = now_ms();
    let placements =
        store.placements_to_resume(start_ms.saturating_sub(away_timeout_ms), start_ms).unwrap_or_else(|e| {
            log::warn!("location: cannot read where the last run had the devices: {e}");
            Vec::new()
        });
    let resumed = pipeline.seed_placements(&placements, now_ms());
    if let Err(e) = store.resume_visits(&placements, &resumed) {
        log::warn!("location: cannot close the visits of the last run: {e}");
    }
    if !resumed.is_empty() {
        log::info!("location: {} devices heard before the start stay in their zones", resumed.len());
    }
    let kept: std::collections::HashSet<i64> = resumed.iter().map(|(id, _)| *id).collect();
    let mut alerts = crate::alerts::Alerts::new(Arc::clone(&state.rules));
    alerts.restore(store);
    refresh_devices(store, feed.as_mut(), &mut alerts);
    alerts.resume(now_ms(), away_timeout_ms, &kept);
    if let Some(feed) = &mut feed {
        feed.restore(store, now_ms(), away_timeout_ms);
        feed.resume(store, now_ms(), away_timeout_ms, &kept);
    }
    let _ = started.send(());
    let mut last_feed_refresh = Instant::now();
    let mut pending = Pending::default();
    let mut scratch = Scratch::default();
    let flush_every = Duration::from_millis(limits::LOCATION_FLUSH_MS);
    let mut last_flush = Instant::now();
    let mut last_purge: Option<Instant> = None;
    let mut purge_clock = crate::store::PurgeClock::new("location");
    let (mut purged_history, mut purged_alerts) = (0usize, 0usize);
    let mut clock = ClockSteps::new();
    // Alerts recorded and not published before the stop go out a moment after the start,
    // when subscribers that lost their connection with it have had time to come back.
    let mut publish_unpublished_at = Some(Instant::now() + Duration::from_millis(limits::ALERT_REPUBLISH_DELAY_MS));
    loop {
        if let (Some(feed), Some(at)) = (&mut feed, publish_unpublished_at)
            && Instant::now() >= at
        {
            alerts.publish_unpublished(store, feed, now_ms());
            publish_unpublished_at = None;
        }
        // Alerts the feed's queue had no room for go out once it has (a tenth of it).
        if let Some(feed) = &mut feed
            && publish_unpublished_at.is_none()
            && alerts.feed_behind()
            && feed.room() >= limits::MQTT_FEED_QUEUE_MAX / 10
        {
            alerts.publish_unpublished(store, feed, now_ms());
        }
        let received = rx.recv_timeout(flush_every / 4);
        // Looked for after the wait, before what arrived is taken: an advert stamped after a
        // step meets the engine's times moved by it.
        if let (_, Some(step)) = clock.look() {
            follow_step(step, store, &mut pipeline, &mut alerts, feed.as_mut());
        }
        match received {
            Ok(mut advert) => {
                // Stamped before the clock was set back (it waited in the queue across the
                // step): it is as of now, not of a time the engine's have moved away from.
                advert.t_ms = advert.t_ms.min(now_ms());
                if let Some(heard) = pipeline.advert(&advert, &mut scratch.outputs)
                    && let Some(key) = pipeline.registry.key(heard.device)
                {
                    pending.seen.insert(key, advert.t_ms);
                    alerts.advert(&pipeline.site, key, &advert, &mut scratch.fired);
                    if !scratch.fired.is_empty() {
                        // A raised alarm (a panic button) is recorded and published at once,
                        // not with the next batch up to LOCATION_FLUSH_MS later.
                        alerts.act(store, feed.as_mut(), &mut scratch.fired);
                    }
                    if let Some(mv) = heard.battery_mv {
                        pending.battery.insert(key, (advert.t_ms, Some(mv)));
                    }
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            // No source left (stopping): time still passes for the engine.
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => std::thread::sleep(flush_every / 4),
        }
        // Before every write: what is written and published is for the devices as they are
        // now (added, changed or deleted through the API or by another process).
        if last_flush.elapsed() >= flush_every {
            if let Ok(v) = store.devices_version()
                && v != version
            {
                version = v;
                let reloaded = pipeline.registry.reload(load_registry(store));
                for slot in reloaded.freed {
                    pipeline.engine.forget(slot);
                }
                if reloaded.skipped > 0 {
                    log::warn!(
                        "location: {} devices beyond {} are not followed",
                        reloaded.skipped,
                        limits::LOCATION_DEVICES_MAX
                    );
                }
                log::info!("location: devices changed; the engine follows");
                refresh_devices(store, feed.as_mut(), &mut alerts);
                last_feed_refresh = Instant::now();
            }
            // Contact names change without the devices changing.
            if last_feed_refresh.elapsed() >= Duration::from_millis(limits::MQTT_FEED_DEVICES_REFRESH_MS) {
                refresh_devices(store, feed.as_mut(), &mut alerts);
                last_feed_refresh = Instant::now();
            }
        }
        // Stopping: once the adverts already taken (acknowledged to their receivers) have
        // been through the engine.
        let stopping = stop.load(Ordering::SeqCst) && rx.is_empty();
        if last_flush.elapsed() >= flush_every || stopping {
            flush(store, &mut clock, &mut pipeline, &mut pending, feed.as_mut(), &mut alerts, &mut scratch);
            let dropped = pending.take_dropped();
            if dropped > 0 {
                log::warn!("location: {dropped} decisions and updates dropped: too many waiting for the database");
            }
            let urgent = rx.take_urgent_taken();
            if urgent > 0 {
                log::warn!(
                    "location: the advert queue was full; {urgent} adverts with a raised alarm flag were taken beside it"
                );
            }
            last_flush = Instant::now();
        }
        if stopping {
            break;
        }
        if reload.swap(false, Ordering::SeqCst) {
            // What the old engine decided is written, published and given to the rules as
            // any batch is (a battery report in it raised nothing when it was only written).
            flush(store, &mut clock, &mut pipeline, &mut pending, feed.as_mut(), &mut alerts, &mut scratch);
            let state = current(site);
            alerts.set_rules(&state.rules);
            // The new engine starts with each device in the zone it was in, where that zone
            // is still on the map (it placed them by whichever receiver it heard first, and
            // moved them a moment later: false `enter` alerts, wrong `data` messages). Their
            // visits go on; the others' end now, and they enter their zones again.
            let registry = std::mem::replace(&mut pipeline.registry, Registry::new(Vec::new()));
            let old = std::mem::replace(&mut pipeline, Pipeline::new(state.site, registry, state.engine));
            let carried = pipeline.carry_placements(&old);
            if let Err(e) = store.close_open_visits_except(&carried) {
                log::warn!("location: cannot close the visits of devices not placed again: {e}");
            }
            // Those not carried over are placed again by the new engine: no `enter` alerts
            // for them, and those it does not place in time go offline on the feed.
            let kept: std::collections::HashSet<i64> = carried.iter().map(|(id, _)| *id).collect();
            let away_timeout_ms = i64::try_from(pipeline.engine.settings().away_timeout_ms).unwrap_or(i64::MAX);
            alerts.resume(now_ms(), away_timeout_ms, &kept);
            if let Some(feed) = &mut feed {
                feed.resume(store, now_ms(), away_timeout_ms, &kept);
            }
            log::info!(
                "location: the site map changed; {} devices stay in their zones, the others are placed again",
                kept.len()
            );
        }
        if last_purge.is_none_or(|t| t.elapsed() >= Duration::from_secs(limits::LOCATION_PURGE_INTERVAL_S)) {
            let before = match purge_clock.now_ms(store, now_ms()) {
                Ok(now) => now - i64::try_from(retention_days * 86_400_000).unwrap_or(i64::MAX),
                Err(e) => {
                    log::warn!("location: cannot purge old history and alerts: {e}");
                    last_purge = Some(Instant::now());
                    continue;
                }
            };
            // A full batch of either: more next round (each round short writes), until both
            // come back short.
            let alerts_more = match store.purge_alerts(before, limits::ALERT_PURGE_ROWS_MAX) {
                Ok(n) => {
                    purged_alerts += n;
                    n == limits::ALERT_PURGE_ROWS_MAX as usize
                }
                Err(e) => {
                    log::warn!("location: cannot purge old alerts: {e}");
                    false
                }
            };
            let history_more = match store.purge_locations(before, limits::LOCATION_PURGE_ROWS_MAX) {
                Ok(n) => {
                    purged_history += n;
                    n == limits::LOCATION_PURGE_ROWS_MAX as usize
                }
                Err(e) => {
                    log::warn!("location: cannot purge old history: {e}");
                    false
                }
            };
            if !alerts_more && !history_more {
                if purged_history > 0 || purged_alerts > 0 {
                    log::info!(
                        "location: forgot {purged_history} history rows and {purged_alerts} alerts older than the retention"
                    );
                }
                (purged_history, purged_alerts) = (0, 0);
                last_purge = Some(Instant::now());
            }
        }
    }
    if let Err(e) = store.close_open_visits() {
        log::warn!("location: cannot close the visits at shutdown: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(t_ms: i64) -> LocationEvent {
        LocationEvent::Seen { device_id: 1, t_ms }
    }

    #[test]
    fn a_refused_batch_is_written_with_the_next_one_within_the_bound() {
        let mut pending = Pending::default();
        pending.put_back(LocationBatch { events: vec![seen(1), seen(2)] });
        pending.events.push(seen(3));
        assert_eq!(pending.take().events, [seen(1), seen(2), seen(3)]);
        // Beyond the bound, the refused batch's tail is dropped and counted.
        pending.events = (0..10).map(seen).collect();
        let big = LocationBatch { events: (100..100 + limits::LOCATION_BATCH_EVENTS_MAX as i64).map(seen).collect() };
        pending.put_back(big);
        assert_eq!(pending.events.len(), limits::LOCATION_BATCH_EVENTS_MAX);
        assert_eq!(pending.events[0], seen(100));
        assert_eq!(pending.events.last(), Some(&seen(9)));
        assert_eq!(pending.take_dropped(), 10);
        assert_eq!(pending.take_dropped(), 0);
    }
}
