//! The path every advert takes after its source, live or replayed: receiver lookup, device
//! match, engine. And `sitegate replay`, which runs a trace through it offline.

use std::io::{self, BufRead, Write};

use super::beacon::Advert;
use super::devices::Registry;
use super::engine::{Engine, Output};
use super::site::{EngineSettings, Site};
use super::trace::TraceReader;

/// Ticks (away checks) at least this often in trace time.
const TICK_MS: i64 = 1_000;

/// Counters of what came through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub adverts: u64,
    /// From a receiver not in the site map.
    pub unknown_receiver: u64,
    /// From no registered device (phones, foreign beacons).
    pub unknown_device: u64,
}

pub struct Pipeline {
    pub site: std::sync::Arc<Site>,
    pub registry: Registry,
    pub engine: Engine,
    pub counts: Counts,
    next_tick_ms: Option<i64>,
}

/// What one advert produced besides engine outputs.
pub struct Heard {
    pub device: usize,
    pub battery_mv: Option<u16>,
}

impl Pipeline {
    pub fn new(site: std::sync::Arc<Site>, registry: Registry, settings: EngineSettings) -> Pipeline {
        let engine = Engine::new(&site, settings);
        Pipeline { site, registry, engine, counts: Counts::default(), next_tick_ms: None }
    }

    /// Keeps the devices `old` (the pipeline of the site map before a reload) had placed in
    /// the same zones of this one's map, matched by zone and receiver id; returns the device
    /// keys kept, with their zone ids.
    pub fn carry_placements(&mut self, old: &Pipeline) -> Vec<(i64, i64)> {
        let zone_map: Vec<Option<usize>> =
            old.site.zones.iter().map(|z| self.site.zones.iter().position(|n| n.id == z.id)).collect();
        let receiver_map: Vec<Option<usize>> =
            old.site.receivers.iter().map(|r| self.site.receivers.iter().position(|n| n.id == r.id)).collect();
        let mut kept = Vec::new();
        for (device, zone) in self.engine.carry(&old.engine, &zone_map, &receiver_map) {
            if let (Some(key), Some(z)) = (self.registry.key(device), self.site.zones.get(zone)) {
                kept.push((key, z.id));
            }
        }
        kept
    }

    /// At start: places the devices the last run had in zones still on the map, as
    /// [`Engine::seed`] says, as if heard at the start: each has the whole away timeout to be
    /// heard again (the scanners start too), as a device restored online on the feed has.
    /// Returns those placed (device key, zone id).
    pub fn seed_placements(&mut self, placements: &[crate::store::Placement], now_ms: i64) -> Vec<(i64, i64)> {
        let mut kept = Vec::new();
        for p in placements {
            let (Some(device), Some(zone)) = (self.registry.slot(p.device_id), self.site.zone(p.zone_id)) else {
                continue;
            };
            self.engine.seed(device, zone, now_ms, p.since_ms, now_ms);
            kept.push((p.device_id, p.zone_id));
        }
        kept
    }

    /// One advert through the engine; returns what device it was, if any.
    pub fn advert(&mut self, a: &Advert, out: &mut Vec<Output>) -> Option<Heard> {
        self.counts.adverts += 1;
        self.tick_until(a.t_ms, out);
        let Some(receiver) = self.site.receiver(&a.receiver) else {
            self.counts.unknown_receiver += 1;
            return None;
        };
        // Whatever it hears (a phone, someone else's tag) says the receiver is working: a zone
        // whose receiver hears nothing at all is dark, one that hears only strangers is not.
        self.engine.receiver_heard(a.t_ms, receiver);
        let Some(id) = self.registry.identify(a) else {
            self.counts.unknown_device += 1;
            return None;
        };
        self.engine.reading(a.t_ms, id.device, receiver, a.rssi, out);
        Some(Heard { device: id.device, battery_mv: id.battery_mv })
    }

    /// The wall clock was stepped by `by_ms`: the engine's times move with it.
    pub fn shift(&mut self, by_ms: i64) {
        self.engine.shift(by_ms);
        if let Some(t) = &mut self.next_tick_ms {
            *t = t.saturating_add(by_ms);
        }
    }

    /// Lets time pass to `t_ms` (ticks once per second of it).
    pub fn tick_until(&mut self, t_ms: i64, out: &mut Vec<Output>) {
        let next = *self.next_tick_ms.get_or_insert(t_ms);
        if t_ms >= next {
            self.engine.tick(t_ms, out);
            self.next_tick_ms = Some(t_ms + TICK_MS);
        }
    }
}

/// Runs a trace and writes one JSON line per zone decision:
/// `{"t_ms":...,"deviceaddress":"5/1/22","zoneid":22,"event":"enter"}` (and `"exit"`).
pub fn replay(input: impl BufRead, pipeline: &mut Pipeline, out: &mut impl Write) -> io::Result<()> {
    let mut reader = TraceReader::new(input);
    let mut outputs = Vec::new();
    let mut last_t = None;
    while let Some(advert) = reader.next_advert()? {
        pipeline.advert(&advert, &mut outputs);
        last_t = Some(advert.t_ms);
        write_decisions(pipeline, &mut outputs, out)?;
    }
    // Let the away timeout run out after the last advert.
    if let Some(t) = last_t {
        let away = pipeline.engine.settings().away_timeout_ms as i64;
        pipeline.tick_until(t + away, &mut outputs);
        write_decisions(pipeline, &mut outputs, out)?;
    }
    Ok(())
}

/// Runs a trace and writes what the engine decides into the store, batched as the service
/// does (one transaction per second of trace time).
pub fn replay_into_store(input: impl BufRead, pipeline: &mut Pipeline, store: &crate::store::Store) -> io::Result<u64> {
    use super::service::Pending;
    let fail = |e: crate::store::StoreError| io::Error::other(e.to_string());
    let mut reader = TraceReader::new(input);
    let mut outputs = Vec::new();
    let mut pending = Pending::default();
    let mut last_t = None;
    let mut next_flush = None;
    let mut decisions = 0u64;
    while let Some(advert) = reader.next_advert()? {
        if let Some(heard) = pipeline.advert(&advert, &mut outputs)
            && let Some(key) = pipeline.registry.key(heard.device)
        {
            pending.seen.insert(key, advert.t_ms);
            if let Some(mv) = heard.battery_mv {
                pending.battery.insert(key, (advert.t_ms, Some(mv)));
            }
        }
        decisions += outputs.iter().filter(|o| !matches!(o, Output::Update(_))).count() as u64;
        pending.outputs(pipeline, &mut outputs);
        last_t = Some(advert.t_ms);
        let due = *next_flush.get_or_insert(advert.t_ms);
        if advert.t_ms >= due {
            store.write_location_batch(&pending.take()).map_err(fail)?;
            next_flush = Some(advert.t_ms + crate::limits::LOCATION_FLUSH_MS as i64);
        }
    }
    if let Some(t) = last_t {
        let away = pipeline.engine.settings().away_timeout_ms as i64;
        pipeline.tick_until(t + away, &mut outputs);
        decisions += outputs.iter().filter(|o| !matches!(o, Output::Update(_))).count() as u64;
        pending.outputs(pipeline, &mut outputs);
    }
    store.write_location_batch(&pending.take()).map_err(fail)?;
    Ok(decisions)
}

fn write_decisions(pipeline: &Pipeline, outputs: &mut Vec<Output>, out: &mut impl Write) -> io::Result<()> {
    for o in outputs.drain(..) {
        let (t_ms, device, zone, event) = match o {
            Output::Enter { t_ms, device, zone } => (t_ms, device, zone, "enter"),
            Output::Exit { t_ms, device, zone } => (t_ms, device, zone, "exit"),
            Output::Update(_) => continue,
        };
        let Some(d) = pipeline.registry.device(device) else { continue };
        let address = &d.deviceaddress;
        let zoneid = pipeline.site.zones[zone].id;
        writeln!(out, "{{\"t_ms\":{t_ms},\"deviceaddress\":\"{address}\",\"zoneid\":{zoneid},\"event\":\"{event}\"}}")?;
    }
    Ok(())
}
