//! The zone engine: readings (device, receiver, RSSI, time) in; zone enter and exit decisions
//! and location updates out. No IO and no clock of its own: time is what the readings and
//! [`Engine::tick`] say, so a trace replays exactly as it ran.
//!
//! Per device and receiver the engine keeps the readings of the last `window_ms`, corrected by
//! the receiver's calibration offset, and estimates the signal as their mean in dBm, weighted
//! by age with the time constant `smoothing_ms` (recent readings count most; on simulated
//! traces this beat the plain mean in dB or in milliwatts and the maximum, see BENCHMARKS.md).
//! A zone's signal is its strongest receiver's. Only receivers heard within `stale_ms` count.
//!
//! Decision: a device stays in its zone until a challenger zone builds up enough evidence: the
//! challenger's lead over the current zone, less `hysteresis_db`, integrated over time (a CUSUM
//! that never goes below its floor, slower for a challenger heard little lately) must reach
//! `dwell_db_s`, more for a device settled in its zone
//! (up to three times after two minutes; not in transit zones). Zones marked `transit`
//! (corridors, halls, stairs) are where people pass: leaving one for a room needs no
//! hysteresis, entering one from a room one and a half times the hysteresis. A clear lead wins
//! fast, a marginal one slowly, noise around the boundary never. When the site map says which
//! zones are `adjacent` (a door, an opening, stairs), a challenger the device cannot walk into
//! straight away starts below zero, by `WALK_HOP_DB_S` per step further: the room behind a
//! wall must lead longer than the corridor both open onto. When the current zone's receivers
//! are all silent (no advert from any device, registered or not: the receiver, not the tag,
//! may be gone), the device is held where it is, less firmly the longer they stay silent. No reading from the device for `away_timeout_ms`: it has left
//! (exit, no zone). A device in a zone is decided on at most every `DECIDE_INTERVAL_MS`
//! (several receivers report one advert within tens of milliseconds); one without a zone once
//! it has been heard for `ARRIVAL_SETTLE_MS`, on what every receiver heard of it by then.
//!
//! Fingerprints: when every zone of the site map has survey fingerprints (`sitegate survey`),
//! a zone's signal is instead how well what all receivers hear of the device matches the
//! zone's best fingerprint (minus the RMS difference in dB, scaled), and the same decision
//! rule runs on that. Zones without a receiver of their own can then be chosen, and a device
//! by a door is placed by the whole picture rather than by the nearest receiver.

use std::collections::VecDeque;

use super::site::{EngineSettings, Site};
use crate::limits;

/// A decision or an update, in time order.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Enter { t_ms: i64, device: usize, zone: usize },
    Exit { t_ms: i64, device: usize, zone: usize },
    Update(LocationUpdate),
}

/// Where a device is, as stored in the location history.
#[derive(Clone, Debug, PartialEq)]
pub struct LocationUpdate {
    pub t_ms: i64,
    pub device: usize,
    pub zone: usize,
    /// Latitude and longitude, estimated from the receivers that hear the device.
    pub lat: f64,
    pub lon: f64,
    /// The strongest receiver and its signal (calibrated dBm).
    pub receiver: usize,
    pub rssi_dbm: f64,
}

/// The largest lead (dB) one instant may add to a challenger's evidence: one absurd reading
/// cannot decide alone.
const LEAD_CAP_DB: f64 = 25.0;
/// When the current zone's receivers are all silent, the device is taken to be this much
/// weaker there than when last heard: a challenger must be clearly stronger to win.
const DARK_PENALTY_DB: f64 = 6.0;
/// ... growing by this much for every second its receivers stay dark, up to the most: a
/// zone dark for a minute no longer holds a device that another zone hears as well as it was
/// heard there (a guard walking alone at night, whose old room's receiver hears nobody now),
/// while one heard through a wall, 20 dB weaker, stays held.
const DARK_PENALTY_DB_PER_S: f64 = 0.2;
const DARK_PENALTY_MAX_DB: f64 = 20.0;
/// The evidence a challenger needs grows with the time the device has been in its zone: by
/// `dwell_db_s` per minute, up to this many times `dwell_db_s`. People settled in a room stay
/// more often than not; a passing fluctuation should not take them out of it.
const SETTLED_FACTOR_MAX: f64 = 3.0;
/// A challenger's lead counts in full once its receiver's recent readings weigh this much (the
/// sum of their age weights: about two fresh readings); less, in proportion. Sparse or lossy
/// tags then need longer to switch, rather than switching on a single lucky reading.
const FULL_EVIDENCE_WEIGHT: f64 = 2.0;
/// Into a transit zone from a room, the hysteresis counts this many times (2 before the walking
/// graph; 1.5 with it on the tune traces: 3.2 -> 3.5 false switches per hour, median delay 5.3
/// -> 5.0 s).
const TRANSIT_HYSTERESIS_FACTOR: f64 = 1.5;
/// A device that has no zone is placed once it has been heard for this long, on what all
/// receivers heard of it by then.
const ARRIVAL_SETTLE_MS: i64 = 1_000;
/// Evidence is integrated over at most this much time between two evaluations.
const STEP_CAP_MS: i64 = 2_000;
/// A device in a zone is decided on again at most this often: the receivers that hear one
/// advert report it within a few tens of milliseconds, and deciding after each report would
/// weigh all of them again each time.
const DECIDE_INTERVAL_MS: i64 = 250;
/// Fingerprint matching: a receiver heard on one side only counts as this much weaker on the
/// other (a little below where receivers stop hearing tags; -100 and -110 did worse on the
/// tune traces).
pub const FINGERPRINT_FLOOR_DBM: f64 = -105.0;
/// Fingerprint matching: a tag sending stronger or weaker than the survey tag (or worn
/// differently) shifts every receiver alike; up to this much (dB) of a common shift is not
/// counted as a difference.
const FINGERPRINT_SHIFT_MAX_DB: f64 = 6.0;
/// Fingerprint matching: zone signals are minus the RMS difference times this, so that the
/// hysteresis and dwell settings mean about as much as with strongest receivers (RMS
/// differences between zones are some 3-4 times smaller than signal differences).
const FINGERPRINT_LEAD_SCALE: f64 = 3.5;
/// Fingerprint matching: no one receiver's difference counts for more than this (dB).
const FINGERPRINT_GAP_CAP_DB: f64 = 25.0;

fn squared_gap(gap_db: f64) -> f64 {
    let g = gap_db.abs().min(FINGERPRINT_GAP_CAP_DB);
    g * g
}

/// The squared gap between a signal and [`FINGERPRINT_FLOOR_DBM`].
fn excess(dbm: f64) -> f64 {
    squared_gap((dbm - FINGERPRINT_FLOOR_DBM).max(0.0))
}

/// Evidence a challenger starts with per step of the walking graph beyond the first between
/// it and the device's zone (dB s, negative): a room two doors away (through the corridor)
/// must build up this much more to win than the corridor itself. People walk through doors,
/// not walls; a lead for the room behind the wall is more often the signal than the person.
/// (8 on the tune traces: 4.2 -> 3.5 false switches per hour at the same share in zone; 16
/// cut them to 2.8 but put the median delay over 5 s.)
const WALK_HOP_DB_S: f64 = 8.0;
/// Zones further apart than this many steps (or not connected at all) count as this far.
const WALK_HOPS_MAX: u8 = 3;

/// The site map's walking graph (zones' `adjacent`), when it has one.
struct Walking {
    /// `hops[a * zones + b]`: the fewest steps from zone a to zone b, 0 to [`WALK_HOPS_MAX`].
    hops: Vec<u8>,
    zones: usize,
}

impl Walking {
    /// `None` when no zone lists another as adjacent. A zone that lists none and that no zone
    /// lists is one step from every zone.
    fn new(site: &Site) -> Option<Walking> {
        let zones = site.zones.len();
        if site.zones.iter().all(|z| z.adjacent.is_empty()) {
            return None;
        }
        let mut hops = vec![WALK_HOPS_MAX; zones * zones];
        let mut queue = VecDeque::new();
        for from in 0..zones {
            let row = &mut hops[from * zones..(from + 1) * zones];
            row[from] = 0;
            queue.clear();
            queue.push_back(from);
            while let Some(z) = queue.pop_front() {
                let next = row[z] + 1;
                if next >= WALK_HOPS_MAX {
                    continue;
                }
                for &n in &site.zones[z].adjacent {
                    if row[n] > next {
                        row[n] = next;
                        queue.push_back(n);
                    }
                }
            }
        }
        for z in (0..zones).filter(|&z| site.zones[z].adjacent.is_empty()) {
            for other in (0..zones).filter(|&o| o != z) {
                hops[z * zones + other] = 1;
                hops[other * zones + z] = 1;
            }
        }
        Some(Walking { hops, zones })
    }

    /// The evidence a challenger starts from and never goes below: none for a zone next to
    /// the device's (or any zone, without a walking graph), less for every further step.
    fn floor(walking: Option<&Walking>, from: usize, to: usize) -> f64 {
        walking.map_or(0.0, |w| -WALK_HOP_DB_S * f64::from(w.hops[from * w.zones + to].saturating_sub(1)))
    }
}

#[derive(Clone)]
struct Link {
    /// (time, calibrated dBm), oldest first, within the window.
    readings: VecDeque<(i64, f32)>,
}

#[derive(Default)]
struct DeviceState {
    /// Per receiver, created on the first reading.
    links: Vec<Option<Link>>,
    last_ms: Option<i64>,
    zone: Option<usize>,
    challenger: Option<usize>,
    evidence: f64,
    last_eval_ms: i64,
    last_update_ms: Option<i64>,
    /// The current zone's signal when it was last heard (for when its receivers go silent).
    zone_last_signal: Option<f64>,
    zone_since_ms: i64,
}

pub struct Engine {
    settings: EngineSettings,
    receiver_zone: Vec<usize>,
    receiver_offset: Vec<f64>,
    receiver_position: Vec<(f64, f64)>,
    zone_receivers: Vec<Vec<usize>>,
    zone_transit: Vec<bool>,
    walking: Option<Walking>,
    /// The newest reading of any device, per receiver: is the receiver alive?
    receiver_last_ms: Vec<Option<i64>>,
    devices: Vec<DeviceState>,
    /// Scratch: signal per zone of the device being decided.
    zone_signal: Vec<Option<f64>>,
    /// Scratch: the largest evidence weight of a receiver per zone (see `link_stats`).
    zone_weight: Vec<f64>,
    /// Per zone, its survey fingerprint (receiver, calibrated dBm); all empty when the site
    /// map has none, and zones are then compared by their strongest receiver.
    zone_fingerprints: Vec<Vec<Vec<(usize, f64)>>>,
    fingerprinted: bool,
    /// Scratch: the device's signal per receiver (fingerprint matching).
    heard: Vec<Option<f64>>,
}

impl Engine {
    pub fn new(site: &Site, settings: EngineSettings) -> Engine {
        Engine {
            settings,
            receiver_zone: site.receivers.iter().map(|r| r.zone).collect(),
            receiver_offset: site.receivers.iter().map(|r| r.rssi_offset_db).collect(),
            receiver_position: site.receivers.iter().map(|r| (r.lat, r.lon)).collect(),
            zone_receivers: site.zones.iter().map(|z| z.receivers.clone()).collect(),
            zone_transit: site.zones.iter().map(|z| z.transit).collect(),
            walking: Walking::new(site),
            receiver_last_ms: vec![None; site.receivers.len()],
            devices: Vec::new(),
            zone_signal: vec![None; site.zones.len()],
            zone_weight: vec![0.0; site.zones.len()],
            zone_fingerprints: site.zones.iter().map(|z| z.fingerprints.clone()).collect(),
            fingerprinted: site.fingerprinted(),
            heard: vec![None; site.receivers.len()],
        }
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Moves every time the engine holds by `by_ms`: the wall clock its readings are stamped
    /// with was stepped by that much (NTP setting a gateway's clock), and what was heard before
    /// the step is as old as it was. Without it a step back holds every decision for as long as
    /// the step (readings would be older than the newest), and a step forward makes every
    /// device leave at once.
    pub fn shift(&mut self, by_ms: i64) {
        let at = |t: &mut i64| *t = t.saturating_add(by_ms);
        self.receiver_last_ms.iter_mut().flatten().for_each(at);
        for d in &mut self.devices {
            for link in d.links.iter_mut().flatten() {
                link.readings.iter_mut().for_each(|(t, _)| at(t));
            }
            d.last_ms.iter_mut().for_each(at);
            at(&mut d.last_eval_ms);
            d.last_update_ms.iter_mut().for_each(at);
            at(&mut d.zone_since_ms);
        }
    }

    /// Takes over what `old` (the engine of the site map before a reload) knew of each device
    /// it had placed in a zone that is still on the map: the zone, since when, and the
    /// readings of receivers still on it (`zone_map`, `receiver_map`: old index to new). No
    /// `enter` follows; the zone is kept until another is clearly better for long enough, as
    /// any current zone is. (A fresh engine placed a device in whichever zone it heard first
    /// and moved it a moment later: false `enter` alerts.) Returns (device, new zone).
    pub fn carry(
        &mut self,
        old: &Engine,
        zone_map: &[Option<usize>],
        receiver_map: &[Option<usize>],
    ) -> Vec<(usize, usize)> {
        let receivers = self.receiver_zone.len();
        // Which receivers are working, as the old engine heard them.
        for (i, seen) in old.receiver_last_ms.iter().enumerate() {
            if let Some(Some(j)) = receiver_map.get(i) {
                self.receiver_last_ms[*j] = *seen;
            }
        }
        let mut carried = Vec::new();
        for (device, d) in old.devices.iter().enumerate().take(limits::LOCATION_DEVICES_MAX) {
            let Some(zone) = d.zone.and_then(|z| zone_map.get(z).copied().flatten()) else { continue };
            let mut links: Vec<Option<Link>> = vec![None; receivers];
            for (i, link) in d.links.iter().enumerate() {
                if let (Some(link), Some(Some(j))) = (link, receiver_map.get(i)) {
                    links[*j] = Some(link.clone());
                }
            }
            let challenger = d.challenger.and_then(|c| zone_map.get(c).copied().flatten());
            if device >= self.devices.len() {
                self.devices.resize_with(device + 1, DeviceState::default);
            }
            self.devices[device] = DeviceState {
                links,
                last_ms: d.last_ms,
                zone: Some(zone),
                challenger,
                evidence: if challenger.is_some() { d.evidence } else { 0.0 },
                last_eval_ms: d.last_eval_ms,
                last_update_ms: d.last_update_ms,
                zone_last_signal: d.zone_last_signal,
                zone_since_ms: d.zone_since_ms,
            };
            carried.push((device, zone));
        }
        carried
    }

    /// Forgets a device (its slot is given to another device later).
    /// At start: a device the last run had in `zone` since `since_ms` and heard at `last_ms`
    /// (within the away timeout) is there still, until another zone is clearly better for long
    /// enough, as any current zone is; not heard again in time, it leaves. No `enter` follows.
    /// (A fresh engine placed it in whichever zone it heard first, and moved it a moment
    /// later: false `enter` alerts at every restart.)
    pub fn seed(&mut self, device: usize, zone: usize, last_ms: i64, since_ms: i64, now_ms: i64) {
        if device >= limits::LOCATION_DEVICES_MAX || zone >= self.zone_receivers.len() {
            return;
        }
        if device >= self.devices.len() {
            self.devices.resize_with(device + 1, DeviceState::default);
        }
        self.devices[device] = DeviceState {
            links: Vec::new(),
            last_ms: Some(last_ms),
            zone: Some(zone),
            challenger: None,
            evidence: 0.0,
            last_eval_ms: now_ms,
            last_update_ms: None,
            zone_last_signal: None,
            zone_since_ms: since_ms.min(now_ms),
        };
    }

    pub fn forget(&mut self, device: usize) {
        if let Some(state) = self.devices.get_mut(device) {
            *state = DeviceState::default();
        }
    }

    /// One reading of a device by a receiver. Readings must come in time order (a reading
    /// older than the device's newest is taken as of that newest time).
    pub fn reading(&mut self, t_ms: i64, device: usize, receiver: usize, rssi_dbm: i16, out: &mut Vec<Output>) {
        let Some(&offset) = self.receiver_offset.get(receiver) else { return };
        if device >= self.devices.len() {
            if device >= limits::LOCATION_DEVICES_MAX {
                return;
            }
            self.devices.resize_with(device + 1, DeviceState::default);
        }
        let receivers = self.receiver_zone.len();
        let window = self.settings.window_ms as i64;
        let state = &mut self.devices[device];
        let t_ms = state.last_ms.map_or(t_ms, |last| t_ms.max(last));
        if state.links.len() < receivers {
            state.links.resize_with(receivers, || None);
        }
        let link = state.links[receiver].get_or_insert_with(|| Link { readings: VecDeque::new() });
        while link.readings.front().is_some_and(|(t, _)| *t <= t_ms - window)
            || link.readings.len() >= limits::LOCATION_READINGS_PER_LINK_MAX
        {
            link.readings.pop_front();
        }
        link.readings.push_back((t_ms, f32::from(rssi_dbm) + offset as f32));
        if state.last_ms.is_none() {
            state.last_eval_ms = t_ms;
        }
        state.last_ms = Some(t_ms);
        let due = state.zone.is_none() || t_ms - state.last_eval_ms >= DECIDE_INTERVAL_MS;
        let seen = &mut self.receiver_last_ms[receiver];
        *seen = Some(seen.map_or(t_ms, |s| s.max(t_ms)));
        if due {
            self.decide(t_ms, device, out);
        }
    }

    /// An advert from `receiver` at `t_ms`, of any device, registered or not: it is working.
    pub fn receiver_heard(&mut self, t_ms: i64, receiver: usize) {
        if let Some(seen) = self.receiver_last_ms.get_mut(receiver) {
            *seen = Some(seen.map_or(t_ms, |s| s.max(t_ms)));
        }
    }

    /// Time passes with no reading: devices not heard for `away_timeout_ms` leave their zone.
    pub fn tick(&mut self, t_ms: i64, out: &mut Vec<Output>) {
        let away = self.settings.away_timeout_ms as i64;
        for (device, state) in self.devices.iter_mut().enumerate() {
            let Some(last) = state.last_ms else { continue };
            if t_ms - last < away {
                continue;
            }
            if let Some(zone) = state.zone.take() {
                out.push(Output::Exit { t_ms: last + away, device, zone });
            }
            state.links.iter_mut().for_each(|l| *l = None);
            state.last_ms = None;
            state.challenger = None;
            state.evidence = 0.0;
            state.last_update_ms = None;
        }
    }

    /// The signal (calibrated dBm) of one receiver for a device at `t_ms`: the age-weighted
    /// mean of its readings in the window, if its newest is not stale.
    fn link_signal(&self, device: usize, receiver: usize, t_ms: i64) -> Option<f64> {
        self.link_stats(device, receiver, t_ms).0
    }

    /// A link's signal (as [`Self::link_signal`]) and how much recent evidence it has: the
    /// sum of its readings' age weights in the window (stale or not).
    fn link_stats(&self, device: usize, receiver: usize, t_ms: i64) -> (Option<f64>, f64) {
        let (mean, weights, fresh) = self.window_stats(device, receiver, t_ms);
        (mean.filter(|_| fresh), weights)
    }

    /// The age-weighted mean of a link's readings in the window (stale or not), the sum of
    /// their weights, and whether the newest is fresh.
    fn window_stats(&self, device: usize, receiver: usize, t_ms: i64) -> (Option<f64>, f64, bool) {
        let Some(Some(link)) = self.devices.get(device).and_then(|d| d.links.get(receiver)) else {
            return (None, 0.0, false);
        };
        let from = t_ms - self.settings.window_ms as i64;
        let tau = self.settings.smoothing_ms.max(1) as f64;
        let (mut sum, mut weights) = (0.0f64, 0.0f64);
        for (t, dbm) in link.readings.iter().rev() {
            if *t <= from {
                break;
            }
            let w = (-((t_ms - t) as f64) / tau).exp();
            sum += f64::from(*dbm) * w;
            weights += w;
        }
        let fresh = link.readings.back().is_some_and(|(newest, _)| t_ms - newest <= self.settings.stale_ms as i64);
        ((weights > 0.0).then(|| sum / weights), weights, fresh)
    }

    /// Whether a receiver has heard any device within the window.
    fn receiver_alive(&self, receiver: usize, t_ms: i64) -> bool {
        self.receiver_last_ms[receiver].is_some_and(|s| t_ms - s < self.settings.window_ms as i64)
    }

    /// The device's signal per receiver as a survey sees it: the age-weighted mean of the
    /// readings in the window, stale or not; `None` where there are none.
    pub fn link_vector(&self, device: usize, t_ms: i64) -> Vec<Option<f64>> {
        (0..self.receiver_zone.len()).map(|r| self.window_stats(device, r, t_ms).0).collect()
    }

    /// Fingerprint matching: each zone's signal is minus the root-mean-square difference (dB)
    /// between what the receivers hear of the device now and what they heard of the survey
    /// tag in that zone, over the receivers either side hears. A receiver heard on one side
    /// only counts as its signal's height above [`FINGERPRINT_FLOOR_DBM`]; receivers that
    /// hear no device at all (gone silent) are left out on both sides.
    fn match_fingerprints(&mut self, device: usize, t_ms: i64) -> Option<(usize, f64)> {
        let mut strongest: Option<(usize, f64)> = None;
        let (mut heard_sum, mut heard_n, mut weight) = (0.0f64, 0usize, 0.0f64);
        for r in 0..self.heard.len() {
            let (signal, w, _) = self.window_stats(device, r, t_ms);
            self.heard[r] = signal;
            if let Some(s) = signal {
                weight = weight.max(w);
                heard_sum += excess(s);
                heard_n += 1;
                if strongest.is_none_or(|(_, v)| s > v) {
                    strongest = Some((r, s));
                }
            }
        }
        for zone in 0..self.zone_signal.len() {
            self.zone_weight[zone] = weight;
            if heard_n == 0 {
                self.zone_signal[zone] = None;
                continue;
            }
            let mut best = f64::MAX;
            for fingerprint in &self.zone_fingerprints[zone] {
                let (mut acc, mut common) = (0.0f64, 0usize);
                for &(r, dbm) in fingerprint {
                    if let Some(s) = self.heard[r] {
                        acc += s - dbm;
                        common += 1;
                    }
                }
                let shift = if common >= 2 {
                    (acc / common as f64).clamp(-FINGERPRINT_SHIFT_MAX_DB, FINGERPRINT_SHIFT_MAX_DB)
                } else {
                    0.0
                };
                let (mut sum, mut n) = (heard_sum, heard_n);
                if shift != 0.0 {
                    sum = self.heard.iter().flatten().map(|s| excess(s - shift)).sum();
                }
                for &(r, dbm) in fingerprint {
                    match self.heard[r] {
                        Some(s) => sum += squared_gap(s - shift - dbm) - excess(s - shift),
                        None if self.receiver_alive(r, t_ms) => {
                            sum += excess(dbm);
                            n += 1;
                        }
                        None => {}
                    }
                }
                best = best.min(sum / n as f64);
            }
            self.zone_signal[zone] = Some(-best.max(0.0).sqrt() * FINGERPRINT_LEAD_SCALE);
        }
        strongest
    }

    fn decide(&mut self, t_ms: i64, device: usize, out: &mut Vec<Output>) {
        if self.fingerprinted {
            let strongest = self.match_fingerprints(device, t_ms);
            let best = self
                .zone_signal
                .iter()
                .enumerate()
                .filter_map(|(z, s)| s.map(|s| (z, s)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            self.choose(t_ms, device, best, strongest, out);
            return;
        }
        // Each zone's signal: its strongest receiver.
        let mut best: Option<(usize, f64)> = None;
        let mut strongest: Option<(usize, f64)> = None;
        for zone in 0..self.zone_signal.len() {
            let mut signal: Option<f64> = None;
            let mut weight = 0.0f64;
            for &r in &self.zone_receivers[zone] {
                let (link, w) = self.link_stats(device, r, t_ms);
                weight = weight.max(w);
                if let Some(s) = link {
                    signal = Some(signal.map_or(s, |v| v.max(s)));
                    if strongest.is_none_or(|(_, v)| s > v) {
                        strongest = Some((r, s));
                    }
                }
            }
            self.zone_signal[zone] = signal;
            self.zone_weight[zone] = weight;
            if let Some(s) = signal
                && best.is_none_or(|(_, b)| s > b)
            {
                best = Some((zone, s));
            }
        }
        self.choose(t_ms, device, best, strongest, out);
    }

    /// The decision, from each zone's signal (`zone_signal`, `zone_weight`) and the best zone.
    fn choose(
        &mut self,
        t_ms: i64,
        device: usize,
        best: Option<(usize, f64)>,
        strongest: Option<(usize, f64)>,
        out: &mut Vec<Output>,
    ) {
        let settings = &self.settings;
        let current = self.devices[device].zone;
        match current {
            None => {
                // Until it has been heard for a moment (`last_eval_ms` is its first reading
                // while it has no zone): the receivers' copies of its first adverts arrive
                // one by one, and the first of them, a far receiver's weak one as likely as
                // any, placed it in a zone it never was in, with an `enter` alert.
                if t_ms - self.devices[device].last_eval_ms < ARRIVAL_SETTLE_MS {
                    return;
                }
                if let Some((zone, signal)) = best {
                    let state = &mut self.devices[device];
                    state.last_eval_ms = t_ms;
                    state.zone = Some(zone);
                    state.zone_since_ms = t_ms;
                    state.zone_last_signal = Some(signal);
                    state.challenger = None;
                    state.evidence = 0.0;
                    out.push(Output::Enter { t_ms, device, zone });
                }
            }
            Some(zone) => {
                // A zone without receivers (a reload took its last one away) is not dark: it
                // holds nobody on the strength of what it once heard.
                let receivers = &self.zone_receivers[zone];
                let dark = !receivers.is_empty() && receivers.iter().all(|&r| !self.receiver_alive(r, t_ms));
                let current_signal = match self.zone_signal[zone] {
                    Some(s) => {
                        self.devices[device].zone_last_signal = Some(s);
                        Some(s)
                    }
                    None if dark => {
                        // Held, but less and less: a zone whose receivers hear nothing at all
                        // may have a dead receiver, or nobody left near it.
                        let last_heard =
                            self.zone_receivers[zone].iter().filter_map(|&r| self.receiver_last_ms[r]).max();
                        // Receivers not heard since the start are dark since the device's stay.
                        let since = last_heard.unwrap_or(self.devices[device].zone_since_ms);
                        let dark_s = (t_ms - since).max(0) as f64 / 1000.0;
                        let penalty = (DARK_PENALTY_DB + DARK_PENALTY_DB_PER_S * dark_s).min(DARK_PENALTY_MAX_DB);
                        self.devices[device].zone_last_signal.map(|s| s - penalty)
                    }
                    None => None,
                };
                // The strongest other zone.
                let challenger = self
                    .zone_signal
                    .iter()
                    .enumerate()
                    .filter(|(z, s)| *z != zone && s.is_some())
                    .map(|(z, s)| (z, s.unwrap_or(f64::MIN)))
                    .max_by(|a, b| a.1.total_cmp(&b.1));
                let state = &mut self.devices[device];
                let step_s = (t_ms - state.last_eval_ms).clamp(0, STEP_CAP_MS) as f64 / 1000.0;
                state.last_eval_ms = t_ms;
                match challenger {
                    Some((other, signal)) => {
                        let floor = Walking::floor(self.walking.as_ref(), zone, other);
                        if state.challenger != Some(other) {
                            state.challenger = Some(other);
                            state.evidence = floor;
                        }
                        let lead = match current_signal {
                            Some(c) => (signal - c).min(LEAD_CAP_DB),
                            None => LEAD_CAP_DB,
                        };
                        // A challenger heard little lately gains ground more slowly.
                        let conf = (self.zone_weight[other] / FULL_EVIDENCE_WEIGHT).min(1.0);
                        let state = &mut self.devices[device];
                        // People pass through transit zones (corridors) and stay in rooms: out
                        // of a corridor into a room needs no hysteresis, into a corridor one
                        // and a half times.
                        let from_transit = self.zone_transit[zone];
                        let to_transit = self.zone_transit[other];
                        let threshold = match (from_transit, to_transit) {
                            (true, false) => 0.0,
                            (false, true) => TRANSIT_HYSTERESIS_FACTOR * settings.hysteresis_db,
                            _ => settings.hysteresis_db,
                        };
                        state.evidence = (state.evidence + (lead - threshold) * conf * step_s).max(floor);
                        // A device settled in its zone needs more to be pulled out of it.
                        let stay_min = (t_ms - state.zone_since_ms) as f64 / 60_000.0;
                        let need = if from_transit {
                            settings.dwell_db_s
                        } else {
                            settings.dwell_db_s * (1.0 + stay_min).min(SETTLED_FACTOR_MAX)
                        };
                        if state.evidence >= need {
                            state.zone_since_ms = t_ms;
                            state.zone = Some(other);
                            state.zone_last_signal = Some(signal);
                            state.challenger = None;
                            state.evidence = 0.0;
                            out.push(Output::Exit { t_ms, device, zone });
                            out.push(Output::Enter { t_ms, device, zone: other });
                        }
                    }
                    _ => {
                        state.challenger = None;
                        state.evidence = 0.0;
                    }
                }
            }
        }
        self.maybe_update(t_ms, device, current, strongest, out);
    }

    /// A location update at a zone change, else at most every `update_interval_ms`.
    fn maybe_update(
        &mut self,
        t_ms: i64,
        device: usize,
        before: Option<usize>,
        strongest: Option<(usize, f64)>,
        out: &mut Vec<Output>,
    ) {
        let (Some(zone), Some((receiver, rssi_dbm))) = (self.devices[device].zone, strongest) else { return };
        let due = self.devices[device]
            .last_update_ms
            .is_none_or(|last| t_ms - last >= self.settings.update_interval_ms as i64);
        if before == Some(zone) && !due {
            return;
        }
        let (lat, lon) = self.position(device, t_ms);
        self.devices[device].last_update_ms = Some(t_ms);
        out.push(Output::Update(LocationUpdate { t_ms, device, zone, lat, lon, receiver, rssi_dbm }));
    }

    /// A weighted centre of the (up to three) strongest receivers: weights in linear
    /// amplitude, so the nearest dominates.
    fn position(&self, device: usize, t_ms: i64) -> (f64, f64) {
        let mut heard: Vec<(usize, f64)> =
            (0..self.receiver_zone.len()).filter_map(|r| self.link_signal(device, r, t_ms).map(|s| (r, s))).collect();
        heard.sort_by(|a, b| b.1.total_cmp(&a.1));
        heard.truncate(3);
        let (mut lat, mut lon, mut total) = (0.0, 0.0, 0.0);
        for (r, s) in &heard {
            let w = 10f64.powf(s / 20.0);
            lat += self.receiver_position[*r].0 * w;
            lon += self.receiver_position[*r].1 * w;
            total += w;
        }
        if total > 0.0 { (lat / total, lon / total) } else { (0.0, 0.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::site::{RawArea, RawBuilding, RawFloor, RawReceiver, RawSiteMap, RawZone, resolve_site};

    /// A receiver in `zone`, placed by the zone's id.
    fn rx(id: &str, zone: i64) -> RawReceiver {
        RawReceiver { id: id.into(), zone, position: format!("42.5,-90.{zone}"), rssi_offset_db: 0.0 }
    }

    /// One area, building and floor holding `zones` and `receivers`.
    fn site_of(zones: &[RawZone], receivers: &[RawReceiver]) -> Site {
        resolve_site(RawSiteMap {
            areas: &[RawArea { id: 1, name: "A".into() }],
            buildings: &[RawBuilding { id: 1, name: "B".into(), area: 1 }],
            floors: &[RawFloor { id: 1, label: "F".into(), level: 0, building: 1 }],
            zones,
            receivers,
            tag_types: &[],
        })
        .unwrap()
    }

    /// Two zones (1 and 2) with a receiver each, "a" and "b"; a third zone with "c".
    fn site() -> Site {
        three_zones(&[rx("a", 1), rx("b", 2), rx("c", 3)])
    }

    /// Zones 1, 2 and 3 with these receivers.
    fn three_zones(receivers: &[RawReceiver]) -> Site {
        let zone = |id: i64| RawZone {
            id,
            name: format!("Z{id}"),
            floor: 1,
            transit: false,
            adjacent: Vec::new(),
            fingerprints: Vec::new(),
        };
        site_of(&[zone(1), zone(2), zone(3)], receivers)
    }

    fn decisions(out: &[Output]) -> Vec<(i64, &'static str, usize)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Enter { t_ms, zone, .. } => Some((*t_ms, "enter", *zone)),
                Output::Exit { t_ms, zone, .. } => Some((*t_ms, "exit", *zone)),
                Output::Update(_) => None,
            })
            .collect()
    }

    /// Feeds one reading per receiver every 500 ms from `from` to `to`.
    fn feed(e: &mut Engine, out: &mut Vec<Output>, from: i64, to: i64, rssi: [i16; 3]) {
        let mut t = from;
        while t < to {
            e.tick(t, out);
            for (r, v) in rssi.iter().enumerate() {
                if *v > -127 {
                    e.reading(t, 0, r, *v, out);
                }
            }
            t += 500;
        }
    }

    #[test]
    fn enters_the_strongest_zone_and_switches_only_on_a_lasting_lead() {
        let mut e = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 10_000, [-60, -75, -127]);
        assert_eq!(decisions(&out), [(ARRIVAL_SETTLE_MS, "enter", 0)]);
        // A lead of 2 dB for a minute: within the hysteresis, no switch.
        feed(&mut e, &mut out, 10_000, 70_000, [-70, -68, -127]);
        assert_eq!(decisions(&out).len(), 1);
        // A clear lead: a switch within seconds.
        out.clear();
        feed(&mut e, &mut out, 70_000, 90_000, [-80, -58, -127]);
        let d = decisions(&out);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!((d[0].1, d[0].2, d[1].1, d[1].2), ("exit", 0, "enter", 1));
        assert!(d[0].0 > 70_000 && d[0].0 <= 80_000, "{d:?}");
    }

    #[test]
    fn the_reports_of_one_advert_are_decided_on_once() {
        let mut e = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 10_000, [-60, -75, -127]);
        let decided = e.devices[0].last_eval_ms;
        assert_eq!(decided, 9_500);
        // Three receivers report the next advert within 40 ms: the first report decides (a
        // quarter of a second has passed), the other two wait for the next quarter.
        for (r, dt) in [(0, 20), (1, 40), (2, 60)] {
            e.reading(10_000 + dt, 0, r, -60, &mut out);
            assert_eq!(e.devices[0].last_eval_ms, 10_020, "report {r}");
        }
        e.reading(10_020 + DECIDE_INTERVAL_MS, 0, 1, -75, &mut out);
        assert_eq!(e.devices[0].last_eval_ms, 10_020 + DECIDE_INTERVAL_MS);
        // A device without a zone is placed once it has been heard for a moment.
        let placed = decisions(&out).len();
        e.reading(10_300, 1, 1, -60, &mut out);
        e.reading(10_300 + ARRIVAL_SETTLE_MS - 1, 1, 1, -60, &mut out);
        assert_eq!(decisions(&out).len(), placed);
        e.reading(10_300 + ARRIVAL_SETTLE_MS, 1, 1, -60, &mut out);
        assert_eq!(decisions(&out).last(), Some(&(10_300 + ARRIVAL_SETTLE_MS, "enter", 1)));
    }

    #[test]
    fn people_leave_corridors_for_rooms_easily_and_rooms_for_corridors_hardly() {
        let mut site = site();
        site.zones[0].transit = true; // zone 1, receiver "a": a corridor
        let mut e = Engine::new(&site, EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 5_000, [-60, -80, -127]);
        // The room is a little stronger than the corridor: out of the corridor within seconds.
        feed(&mut e, &mut out, 5_000, 20_000, [-66, -63, -127]);
        assert_eq!(
            decisions(&out).iter().map(|d| (d.1, d.2)).collect::<Vec<_>>(),
            [("enter", 0), ("exit", 0), ("enter", 1)]
        );
        // Back into the corridor only with a lead of more than one and a half times the
        // hysteresis.
        out.clear();
        feed(&mut e, &mut out, 20_000, 80_000, [-58, -66, -127]);
        assert!(decisions(&out).is_empty(), "{out:?}");
        feed(&mut e, &mut out, 80_000, 100_000, [-50, -70, -127]);
        assert_eq!(decisions(&out).iter().map(|d| (d.1, d.2)).collect::<Vec<_>>(), [("exit", 1), ("enter", 0)]);
    }

    /// When zone 3 ("c") takes a 10 dB lead over zone 2 ("b"), where the device has been for
    /// five seconds: the time of the switch to zone 3.
    fn switch_time(site: &Site) -> i64 {
        let mut e = Engine::new(site, EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 5_000, [-127, -60, -80]);
        feed(&mut e, &mut out, 5_000, 40_000, [-80, -70, -60]);
        let d = decisions(&out);
        assert_eq!(d.iter().map(|(_, e, z)| (*e, *z)).collect::<Vec<_>>(), [("enter", 1), ("exit", 1), ("enter", 2)]);
        d[2].0
    }

    #[test]
    fn a_zone_behind_a_wall_needs_a_longer_lead_than_one_through_a_door() {
        // Zones 2 and 3 both open onto zone 1 (a corridor), not onto each other.
        let mut walled = site();
        walled.zones[0].adjacent = vec![1, 2];
        walled.zones[1].adjacent = vec![0];
        walled.zones[2].adjacent = vec![0];
        // ... or a door between them as well.
        let mut door = walled.clone();
        door.zones[1].adjacent.push(2);
        door.zones[2].adjacent.push(1);
        let (plain, through_door, through_wall) = (switch_time(&site()), switch_time(&door), switch_time(&walled));
        assert_eq!(plain, through_door);
        // 4 dB/s over the hysteresis: the missing step of 8 dB s takes two seconds more.
        assert!(through_wall >= plain + 1_500, "door {through_door} ms, wall {through_wall} ms");
    }

    #[test]
    fn leaves_after_the_away_timeout_and_comes_back() {
        let settings = EngineSettings::default();
        let away = settings.away_timeout_ms as i64;
        let mut e = Engine::new(&site(), settings);
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 5_000, [-127, -127, -60]);
        feed(&mut e, &mut out, 5_000, 5_000 + away + 1_000, [-127, -127, -127]);
        assert_eq!(decisions(&out), [(ARRIVAL_SETTLE_MS, "enter", 2), (4_500 + away, "exit", 2)]);
        out.clear();
        feed(&mut e, &mut out, 100_000, 101_500, [-65, -127, -127]);
        assert_eq!(decisions(&out), [(100_000 + ARRIVAL_SETTLE_MS, "enter", 0)]);
    }

    /// Seeded at start where the last run had it: the first adverts, heard first by another
    /// zone's receiver, do not move it (a fresh engine waits a moment, then enters the
    /// stronger zone); its own zone heard after, it stays; not heard for the away timeout
    /// from its last time, it leaves.
    #[test]
    fn a_device_seeded_at_start_stays_until_another_zone_wins() {
        let settings = EngineSettings::default();
        let away = settings.away_timeout_ms as i64;
        let mut fresh = Engine::new(&site(), settings.clone());
        let mut e = Engine::new(&site(), settings);
        e.seed(0, 0, 9_000, 1_000, 10_000);
        let (mut out, mut fresh_out) = (Vec::new(), Vec::new());
        for (e, out) in [(&mut e, &mut out), (&mut fresh, &mut fresh_out)] {
            e.reading(10_000, 0, 1, -70, out);
            feed(e, out, 10_500, 20_000, [-60, -75, -127]);
        }
        // (Before it waited, the fresh engine entered zone 2, heard first, and left it soon.)
        assert_eq!(decisions(&fresh_out)[0], (10_000 + ARRIVAL_SETTLE_MS, "enter", 0));
        assert_eq!(decisions(&out), []);
        assert!(out.iter().any(|o| matches!(o, Output::Update(u) if u.zone == 0)), "location updates in zone 0");
        // Silent from 19,500 on: it leaves at the away timeout.
        out.clear();
        let mut t = 20_000;
        while t <= 19_500 + away + 1_000 {
            e.tick(t, &mut out);
            t += 500;
        }
        assert_eq!(decisions(&out), [(19_500 + away, "exit", 0)]);
        // Seeded and never heard: it leaves at its last time plus the away timeout.
        let mut gone = Engine::new(&site(), EngineSettings::default());
        gone.seed(0, 2, 9_000, 1_000, 10_000);
        out.clear();
        gone.tick(9_000 + away, &mut out);
        assert_eq!(decisions(&out), [(9_000 + away, "exit", 2)]);
    }

    /// The wall clock set back an hour, then forward a day: the engine goes on deciding as if
    /// time had run on (without `shift` it holds every decision until the clock is back where
    /// it was, and lets the device leave at the step forward).
    #[test]
    fn clock_steps_change_nothing_once_shifted() {
        let mut e = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 10_000, [-60, -80, -127]);
        let back = -3_600_000;
        e.shift(back);
        feed(&mut e, &mut out, 10_000 + back, 30_000 + back, [-80, -58, -127]);
        let d = decisions(&out);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!((d[1].1, d[1].2, d[2].1, d[2].2), ("exit", 0, "enter", 1));
        assert!(d[2].0 > 10_000 + back && d[2].0 <= 20_000 + back, "{d:?}");
        out.clear();
        let forward = 86_400_000;
        e.shift(forward);
        feed(&mut e, &mut out, 30_000 + back + forward, 60_000 + back + forward, [-80, -58, -127]);
        assert_eq!(decisions(&out), [], "still there: no exit, no enter");
    }

    #[test]
    fn a_silent_receiver_holds_its_zone() {
        let mut e = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 10_000, [-60, -80, -127]);
        // Receiver "a" dies: the device is heard only, weakly, by "b" for two minutes.
        feed(&mut e, &mut out, 10_000, 130_000, [-127, -80, -127]);
        assert_eq!(decisions(&out), [(ARRIVAL_SETTLE_MS, "enter", 0)]);
    }

    #[test]
    fn a_zone_dark_for_long_lets_go_of_a_device_heard_as_well_elsewhere() {
        let mut e = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 10_000, [-60, -80, -127]);
        // Nobody is left near "a" (it hears nothing at all); "b" hears the device as "a" did.
        feed(&mut e, &mut out, 10_000, 130_000, [-127, -60, -127]);
        let d = decisions(&out);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!((d[1].1, d[1].2, d[2].1, d[2].2), ("exit", 0, "enter", 1));
        assert!(d[2].0 < 90_000, "within a minute or so of the silence: {d:?}");
    }

    /// A reload moves zone 1's only receiver to zone 2: the device it hears goes with it.
    #[test]
    fn a_zone_left_without_receivers_lets_go_of_its_devices() {
        let mut old = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut old, &mut out, 0, 10_000, [-60, -127, -127]);
        assert_eq!(decisions(&out), [(ARRIVAL_SETTLE_MS, "enter", 0)]);
        let moved = three_zones(&[rx("a", 2), rx("b", 2), rx("c", 3)]);
        let mut e = Engine::new(&moved, EngineSettings::default());
        let same = [Some(0), Some(1), Some(2)];
        assert_eq!(e.carry(&old, &same, &same), [(0, 0)]);
        out.clear();
        feed(&mut e, &mut out, 10_000, 40_000, [-60, -127, -127]);
        let d = decisions(&out);
        assert_eq!(d.iter().map(|(_, e, z)| (*e, *z)).collect::<Vec<_>>(), [("exit", 0), ("enter", 1)], "{d:?}");
        assert!(d[1].0 <= 20_000, "switched at {} ms", d[1].0);
    }

    #[test]
    fn updates_carry_a_position_between_the_receivers() {
        let settings = EngineSettings { update_interval_ms: 400, ..EngineSettings::default() };
        let mut e = Engine::new(&site(), settings);
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 2_000, [-60, -66, -127]);
        let Some(Output::Update(u)) = out.iter().rev().find(|o| matches!(o, Output::Update(_))) else {
            panic!("{out:?}")
        };
        assert_eq!((u.zone, u.receiver), (0, 0));
        assert!(u.lon < -90.1 && u.lon > -90.2, "{u:?}");
    }

    /// Three zones and two receivers ("a" in zone 1, "b" in zone 2); zone 3, between them,
    /// has none. Each zone has a fingerprint.
    fn fingerprinted_site() -> Site {
        let print = |a: f64, b: f64| vec![[("a".to_string(), a), ("b".to_string(), b)].into_iter().collect()];
        let zone = |id: i64, fingerprints| RawZone {
            id,
            name: format!("Z{id}"),
            floor: 1,
            transit: false,
            adjacent: Vec::new(),
            fingerprints,
        };
        site_of(
            &[zone(1, print(-60.0, -85.0)), zone(2, print(-85.0, -60.0)), zone(3, print(-76.0, -70.0))],
            &[rx("a", 1), rx("b", 2)],
        )
    }

    #[test]
    fn fingerprints_place_a_device_where_no_receiver_is_and_forgive_a_stronger_tag() {
        let mut e = Engine::new(&fingerprinted_site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut e, &mut out, 0, 10_000, [-61, -84, -127]);
        assert_eq!(decisions(&out), [(ARRIVAL_SETTLE_MS, "enter", 0)]);
        // Between the two: "b" is the stronger, but the signals are zone 3's fingerprint.
        out.clear();
        feed(&mut e, &mut out, 10_000, 40_000, [-75, -71, -127]);
        let d = decisions(&out);
        assert_eq!(d.iter().map(|(_, e, z)| (*e, *z)).collect::<Vec<_>>(), [("exit", 0), ("enter", 2)], "{d:?}");
        assert!(d[1].0 <= 20_000, "switched at {} ms", d[1].0);
        // A tag 5 dB stronger than the survey tag in zone 2 is still in zone 2.
        out.clear();
        feed(&mut e, &mut out, 40_000, 70_000, [-80, -55, -127]);
        let d = decisions(&out);
        assert_eq!(d.iter().map(|(_, e, z)| (*e, *z)).collect::<Vec<_>>(), [("exit", 2), ("enter", 1)], "{d:?}");
        // Without fingerprints the same device would never be placed in zone 3.
        let mut plain = Engine::new(&site(), EngineSettings::default());
        let mut out = Vec::new();
        feed(&mut plain, &mut out, 0, 40_000, [-75, -71, -127]);
        assert!(decisions(&out).iter().all(|(_, _, z)| *z != 2), "{out:?}");
    }
}
