//! `sitegate survey`: zone fingerprints from a walk with a tag. An operator records a trace
//! (`sitegate record`) while carrying a tag through each zone in turn, noting when they were
//! in which zone (the marks); the survey replays the trace through the engine's own signal
//! smoothing and writes, per zone, the signal each receiver had of the tag there. With a
//! fingerprint for every zone the engine compares what it hears of a device with each zone's
//! fingerprint instead of asking which zone's receiver is the strongest, which also places
//! people in zones without a receiver of their own.

use std::io::{self, BufRead, Write};

use super::engine::Output;
use super::replay::Pipeline;
use super::site::{FINGERPRINT_DBM_MIN, Site};
use super::trace::TraceReader;
use crate::limits;

/// A span of time the survey tag spent in one zone.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub zone: usize,
    pub from_ms: i64,
    pub until_ms: i64,
}

/// Reads marks as CSV: `zoneid,from,until`, the times Unix milliseconds, RFC 3339
/// (`2026-11-23T10:15:00Z`), or local times of the site (`2026-11-23 11:15:00`, in `tz`).
/// Blank lines, `#` comments and a `zoneid,...` header are skipped.
pub fn read_marks(input: impl BufRead, site: &Site, tz: &jiff::tz::TimeZone) -> Result<Vec<Mark>, String> {
    let mut marks = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("zoneid") {
            continue;
        }
        let at = |m: String| format!("line {}: {m}", n + 1);
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [zone, from, until] = fields[..] else {
            return Err(at(format!("expected zoneid,from,until, found {} fields", fields.len())));
        };
        let zone = zone
            .parse::<i64>()
            .ok()
            .and_then(|id| site.zone(id))
            .ok_or_else(|| at(format!("{zone:?} is not the id of a zone of the site map")))?;
        let time = |s: &str| {
            s.parse::<i64>().ok().or_else(|| crate::timefmt::parse_local_ms(s, tz)).ok_or_else(|| {
                at(format!("{s:?} is neither Unix milliseconds, an RFC 3339 time nor a local time of the site"))
            })
        };
        let (from_ms, until_ms) = (time(from)?, time(until)?);
        if until_ms <= from_ms {
            return Err(at("the span ends before it starts".into()));
        }
        if marks.len() >= limits::SURVEY_MARKS_MAX {
            return Err(at(format!("more than {} marks", limits::SURVEY_MARKS_MAX)));
        }
        marks.push(Mark { zone, from_ms, until_ms });
    }
    if marks.is_empty() {
        return Err("no marks".into());
    }
    Ok(marks)
}

/// What the receivers heard of the survey tag in one stretch of a zone's survey.
#[derive(Clone, Debug, Default)]
pub struct Stretch {
    /// Seconds sampled.
    pub samples: u32,
    /// Per receiver: samples in which it heard the tag, and the sum of its signal then.
    pub heard: Vec<u32>,
    pub sum_dbm: Vec<f64>,
}

impl Stretch {
    fn new(receivers: usize) -> Stretch {
        Stretch { samples: 0, heard: vec![0; receivers], sum_dbm: vec![0.0; receivers] }
    }

    /// The fingerprint: each receiver that heard the tag in at least
    /// `SURVEY_HEARD_SHARE_MIN` of the samples, with its mean signal.
    pub fn fingerprint(&self) -> Vec<(usize, f64)> {
        if self.samples == 0 {
            return Vec::new();
        }
        (0..self.heard.len())
            .filter(|&r| {
                self.heard[r] > 0
                    && f64::from(self.heard[r]) >= limits::SURVEY_HEARD_SHARE_MIN * f64::from(self.samples)
            })
            .map(|r| (r, (self.sum_dbm[r] / f64::from(self.heard[r])).max(FINGERPRINT_DBM_MIN)))
            .collect()
    }
}

/// The survey of one zone: a stretch per `SURVEY_FINGERPRINT_S` seconds sampled.
#[derive(Clone, Debug, Default)]
pub struct ZoneSurvey {
    pub stretches: Vec<Stretch>,
}

impl ZoneSurvey {
    pub fn samples(&self) -> u32 {
        self.stretches.iter().map(|s| s.samples).sum()
    }

    /// One fingerprint per stretch (those where some receiver heard the tag), at most
    /// `LOCATION_FINGERPRINTS_PER_ZONE_MAX`, evenly chosen.
    pub fn fingerprints(&self) -> Vec<Vec<(usize, f64)>> {
        let all: Vec<_> = self.stretches.iter().map(Stretch::fingerprint).filter(|f| !f.is_empty()).collect();
        let keep = limits::LOCATION_FINGERPRINTS_PER_ZONE_MAX;
        if all.len() <= keep {
            return all;
        }
        (0..keep).map(|i| all[i * all.len() / keep].clone()).collect()
    }
}

/// Replays the survey trace; samples the tag's signals once a second within each mark (from
/// one smoothing window after its start, so that the zone before it has left the window).
/// Each mark's samples are cut into stretches of `SURVEY_FINGERPRINT_S` seconds (a short last
/// one joins the one before), each a fingerprint of the part of the zone walked then.
pub fn survey(
    input: impl BufRead,
    pipeline: &mut Pipeline,
    device: usize,
    marks: &[Mark],
) -> io::Result<Vec<ZoneSurvey>> {
    let receivers = pipeline.site.receivers.len();
    let mut zones = vec![ZoneSurvey::default(); pipeline.site.zones.len()];
    let window = pipeline.engine.settings().window_ms as i64;
    let stretch_s = i64::from(limits::SURVEY_FINGERPRINT_S);
    // (time, zone, stretch of the zone)
    let mut samples: Vec<(i64, usize, usize)> = Vec::new();
    for m in marks {
        let first = m.from_ms + window;
        let seconds = (m.until_ms - first).div_euclid(1_000) + 1;
        if seconds <= 0 {
            continue;
        }
        let stretches = ((seconds + stretch_s / 2) / stretch_s).max(1);
        let base = zones[m.zone].stretches.len();
        zones[m.zone].stretches.extend((0..stretches).map(|_| Stretch::new(receivers)));
        for i in 0..seconds {
            if samples.len() >= limits::SURVEY_SAMPLES_MAX {
                break;
            }
            let stretch = base + usize::try_from((i / stretch_s).min(stretches - 1)).unwrap_or(0);
            samples.push((first + i * 1_000, m.zone, stretch));
        }
    }
    samples.sort_unstable();
    let mut next = 0;
    let mut take = |pipeline: &Pipeline, until_ms: i64, zones: &mut Vec<ZoneSurvey>| {
        while let Some(&(t, zone, stretch)) = samples.get(next).filter(|(t, _, _)| *t < until_ms) {
            next += 1;
            let z = &mut zones[zone].stretches[stretch];
            z.samples += 1;
            for (r, signal) in pipeline.engine.link_vector(device, t).into_iter().enumerate() {
                if let Some(s) = signal {
                    z.heard[r] += 1;
                    z.sum_dbm[r] += s;
                }
            }
        }
    };
    let mut reader = TraceReader::new(input);
    let mut outputs: Vec<Output> = Vec::new();
    while let Some(advert) = reader.next_advert()? {
        take(pipeline, advert.t_ms, &mut zones);
        pipeline.advert(&advert, &mut outputs);
        outputs.clear();
    }
    take(pipeline, i64::MAX, &mut zones);
    Ok(zones)
}

/// Writes the fingerprints as lines for the site map's `[[zones]]` entries; returns how many
/// zones got none.
pub fn write_fingerprints(site: &Site, zones: &[ZoneSurvey], out: &mut impl Write) -> io::Result<usize> {
    writeln!(out, "# sitegate survey: put the fingerprints of each zone into its [[zones]] entry.")?;
    let mut missing = 0;
    for (z, survey) in site.zones.iter().zip(zones) {
        let fingerprints = survey.fingerprints();
        writeln!(
            out,
            "# zone {} {:?}: {} s sampled, {} fingerprints",
            z.id,
            z.name,
            survey.samples(),
            fingerprints.len()
        )?;
        if fingerprints.is_empty() {
            writeln!(out, "# (none: not surveyed, or no receiver heard the tag there)")?;
            missing += 1;
            continue;
        }
        writeln!(out, "fingerprints = [")?;
        for fingerprint in fingerprints {
            let cells: Vec<String> =
                fingerprint.iter().map(|&(r, dbm)| format!("{:?} = {dbm:.1}", site.receivers[r].id)).collect();
            writeln!(out, "  {{ {} }},", cells.join(", "))?;
        }
        writeln!(out, "]")?;
    }
    Ok(missing)
}
