//! The operator status page: `GET /` (the page; its script and style at `/status/page.js`
//! and `/status/page.css`, all embedded in the binary), `GET /status/snapshot` (what the page
//! shows, as a document) and the snapshot the HTTP layer streams at `/status/events`
//! (server-sent events, `http::events`).
//!
//! A snapshot is what one caller may see: the site map by floor with who is in each zone, the
//! devices with their last sighting, battery and signal, the open alerts, and the gateway's
//! health. Contacts the caller may not see are left out, as everywhere in the API.

use std::collections::HashMap;

use super::error::ApiError;
use super::output::Out;
use super::{App, Ctx, Reply};
use crate::limits;
use crate::location::service::current;
use crate::location::site::Site;
use crate::model::Viewer;
use crate::timefmt::{local_ms, now_ms};

/// The page and its assets: (content type, body).
pub const PAGE_HTML: &str = include_str!("status/page.html");
pub const PAGE_JS: &str = include_str!("status/page.js");
pub const PAGE_CSS: &str = include_str!("status/page.css");

/// `GET /status/snapshot`.
pub fn show(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    Ok(Reply::ok(snapshot(ctx.app, &ctx.viewer)?))
}

/// Everything the page shows, for `viewer`.
pub fn snapshot(app: &App, viewer: &Viewer) -> Result<Out, ApiError> {
    let tz = &app.config.site.timezone;
    let site = current(&app.site).site;
    let now = now_ms();
    let devices = super::location::visible_devices(app, viewer)?;
    let mut alerts = app.store.alerts(
        &viewer.org,
        false,
        None,
        crate::store::AlertOrder::MostSevere,
        None,
        limits::STATUS_ALERTS_MAX,
    )?;
    // The page lists the most severe; it says how many more there are.
    let open_alerts = if alerts.len() < limits::STATUS_ALERTS_MAX as usize {
        alerts.len() as i64
    } else {
        app.store.open_alerts_count(&viewer.org)?
    };
    super::alerts::hide_invisible_contacts(app, viewer, &mut alerts)?;
    let time = |t: Option<i64>| t.map(|t| local_ms(t, tz)).unwrap_or_default();
    let opt_int = |v: Option<i64>| v.map_or(Out::Null, Out::Int);

    // Devices, and who is in each zone.
    let mut in_zone: HashMap<i64, Vec<Out>> = HashMap::new();
    let mut device_list = Vec::with_capacity(devices.len());
    for d in &devices {
        let st = &d.status;
        let zone_name = st.zone_id.and_then(|z| site.zone(z)).map(|z| site.zones[z].name.clone()).unwrap_or_default();
        let contact = d.contact_name.clone().unwrap_or_default();
        if let Some(zone) = st.zone_id {
            in_zone.entry(zone).or_default().push(
                Out::map()
                    .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
                    .with("label", Out::text(d.device.label.clone()))
                    .with("contactname", Out::text(contact.clone()))
                    .with("since", Out::text(time(st.zone_since_ms)))
                    .with("sincems", opt_int(st.zone_since_ms)),
            );
        }
        // Low as shown: 2,497 mV shows as 2.50 V, which is not below 2.50 V.
        let shown_mv = |mv: i64| {
            super::location::battery_text(Some(mv)).parse::<f64>().map_or(mv, |v| (v * 1000.0).round() as i64)
        };
        let low = st.battery_mv.is_some_and(|mv| shown_mv(mv) < limits::STATUS_BATTERY_LOW_MV);
        device_list.push(
            Out::map()
                .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
                .with("deviceid", Out::text(d.device.deviceid.clone()))
                .with("label", Out::text(d.device.label.clone()))
                .with("contactname", Out::text(contact))
                .with("zoneid", opt_int(st.zone_id))
                .with("zonename", Out::text(zone_name))
                .with("lastseen", Out::text(time(st.last_seen_ms)))
                .with("lastseenms", opt_int(st.last_seen_ms))
                .with(
                    "battery",
                    Out::text(st.battery_mv.map(|mv| format!("{:.2}", mv as f64 / 1000.0)).unwrap_or_default()),
                )
                .with("batterylow", Out::Int(i64::from(low)))
                .with("receiver", Out::text(st.receiver.clone().unwrap_or_default()))
                .with("rssi", st.rssi.map_or(Out::Null, |r| Out::Int(r.round() as i64))),
        );
    }

    let heard = receivers_heard(app, now);
    let mut silent_receivers = Vec::new();

    let mut floors = Vec::new();
    for (fi, floor) in site.floors.iter().enumerate() {
        let layout = Layout::of(&site, fi);
        let zones: Vec<Out> = site
            .zones
            .iter()
            .enumerate()
            .filter(|(_, z)| z.floor == fi)
            .map(|(zi, z)| {
                let (x, y) = layout.zone(zi);
                Out::map()
                    .with("id", Out::Int(z.id))
                    .with("name", Out::text(z.name.clone()))
                    .with("transit", Out::Int(i64::from(z.transit)))
                    .with("x", Out::text(format!("{x:.3}")))
                    .with("y", Out::text(format!("{y:.3}")))
                    .with("people", Out::list("person", in_zone.remove(&z.id).unwrap_or_default()))
            })
            .collect();
        let receivers: Vec<Out> = site
            .receivers
            .iter()
            .enumerate()
            .filter(|(_, r)| site.zones[r.zone].floor == fi)
            .map(|(ri, r)| {
                let (x, y) = layout.receiver(ri);
                let (last, silent) = heard(&r.id);
                if silent {
                    silent_receivers.push(Out::text(r.id.clone()));
                }
                Out::map()
                    .with("id", Out::text(r.id.clone()))
                    .with("zoneid", Out::Int(site.zones[r.zone].id))
                    .with("x", Out::text(format!("{x:.3}")))
                    .with("y", Out::text(format!("{y:.3}")))
                    .with("lastadvert", Out::text(time(last)))
                    .with("silent", Out::Int(i64::from(silent)))
            })
            .collect();
        let building = site.buildings.get(floor.building).map(|b| b.name.clone()).unwrap_or_default();
        floors.push(
            Out::map()
                .with("id", Out::Int(floor.id))
                .with("label", Out::text(floor.label.clone()))
                .with("level", Out::Int(floor.level))
                .with("building", Out::text(building))
                .with("zones", Out::list("zone", zones))
                .with("receivers", Out::list("receiver", receivers)),
        );
    }

    let alert_list: Vec<Out> = alerts
        .iter()
        .map(|a| {
            Out::map()
                .with("id", Out::Int(a.id))
                .with("type", Out::text(a.kind.clone()))
                .with("text", Out::text(a.text.clone()))
                .with("deviceaddress", Out::text(a.deviceaddress.clone()))
                .with("contactname", Out::text(a.contact_name.clone().unwrap_or_default()))
                .with("timestamp", Out::text(local_ms(a.t_ms, tz)))
        })
        .collect();

    Ok(Out::map()
        .with("now", Out::text(local_ms(now, tz)))
        .with("nowms", Out::Int(now))
        .with("floors", Out::list("floor", floors))
        .with("devices", Out::list("device", device_list))
        .with("alerts", Out::list("alert", alert_list))
        .with("openalerts", Out::Int(open_alerts))
        .with("health", health(app, silent_receivers)))
}

/// What a snapshot holds that is not read from the database (the webhook counts are, and
/// are -1 when they cannot be): the gateway's time and health. An open page is sent these
/// over its last snapshot while the database cannot be read, so that it shows why.
pub fn unread_parts(app: &App) -> Out {
    let now = now_ms();
    let site = current(&app.site).site;
    let silent = silent_receivers(app, &site, now);
    Out::map()
        .with("now", Out::text(local_ms(now, &app.config.site.timezone)))
        .with("nowms", Out::Int(now))
        .with("health", health(app, silent))
}

/// The ids of the site map's receivers that are silent, in the order the floors list them.
fn silent_receivers(app: &App, site: &Site, now: i64) -> Vec<Out> {
    let heard = receivers_heard(app, now);
    (0..site.floors.len())
        .flat_map(|fi| site.receivers.iter().filter(move |r| site.zones[r.zone].floor == fi))
        .filter(|r| heard(&r.id).1)
        .map(|r| Out::text(r.id.clone()))
        .collect()
}

/// When each receiver was last heard (the local adapter from the scan, the others over
/// MQTT), and whether it is silent at `now` (longer than `[location] receiver_silent_s`,
/// counted from the start for one not heard since).
fn receivers_heard(app: &App, now: i64) -> impl Fn(&str) -> (Option<i64>, bool) + '_ {
    let heard: HashMap<String, i64> = app
        .ingest
        .get()
        .map(|i| {
            i.last_heard_ms
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect()
        })
        .unwrap_or_default();
    let local_last = app.scan.last_advert_ms.load(std::sync::atomic::Ordering::Relaxed);
    let started = now - i64::try_from(app.metrics.uptime_secs() * 1000).unwrap_or(0);
    let silent_ms = i64::try_from(app.config.location.receiver_silent_s * 1000).unwrap_or(i64::MAX);
    move |id: &str| {
        let last = if id == app.config.location.adapter && local_last > 0 {
            i64::try_from(local_last).ok()
        } else {
            heard.get(id).copied()
        };
        (last, crate::mqtt::ingest::silent(now, last.unwrap_or(started), silent_ms))
    }
}

fn health(app: &App, silent_receivers: Vec<Out>) -> Out {
    let time = |t: Option<i64>| t.map(|t| local_ms(t, &app.config.site.timezone)).unwrap_or_default();
    let local_last = app.scan.last_advert_ms.load(std::sync::atomic::Ordering::Relaxed);
    let (pending, failed, paused) = app.store.delivery_summary().unwrap_or((-1, -1, -1));
    let scan = match app.config.location.scan {
        crate::location::site::Scan::Off => "off",
        _ if app.scan.scanning.load(std::sync::atomic::Ordering::Relaxed) => "scanning",
        _ => "waiting",
    };
    Out::map()
        .with("version", Out::text(env!("CARGO_PKG_VERSION")))
        .with("uptimes", Out::Int(i64::try_from(app.metrics.uptime_secs()).unwrap_or(i64::MAX)))
        .with("scan", Out::text(scan))
        .with("lastadvert", Out::text(time((local_last > 0).then(|| i64::try_from(local_last).unwrap_or(0)))))
        .with("silentreceivers", Out::list("receiver", silent_receivers))
        .with(
            "webhooks",
            Out::map()
                .with("pending", Out::Int(pending))
                .with("failed", Out::Int(failed))
                .with("paused", Out::Int(paused)),
        )
        .with("databasebytes", Out::Int(i64::try_from(app.store.size_bytes()).unwrap_or(i64::MAX)))
        .with("storage", Out::text(app.storage_check().err().map(|e| e.to_string()).unwrap_or_default()))
        .with(
            "diskfreebytes",
            Out::Int(app.store.disk_free_bytes().map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX))),
        )
        .with(
            "disklow",
            Out::Int(i64::from(app.store.disk_free_bytes().is_some_and(|b| b < crate::limits::DISK_FREE_LOW_BYTES))),
        )
        .with("mqttconnections", Out::Int(app.mqtt.connections.load(std::sync::atomic::Ordering::Relaxed)))
}

/// Where receivers and zones go on a floor's plan: the receivers' positions scaled into the
/// unit square (with a margin), north up; a zone sits at the middle of its receivers. Without
/// usable positions (all the same, or none), zones are laid out in a row.
struct Layout {
    receivers: HashMap<usize, (f64, f64)>,
    zones: HashMap<usize, (f64, f64)>,
}

impl Layout {
    fn of(site: &Site, floor: usize) -> Layout {
        let on_floor: Vec<usize> =
            (0..site.receivers.len()).filter(|r| site.zones[site.receivers[*r].zone].floor == floor).collect();
        let zones_on_floor: Vec<usize> = (0..site.zones.len()).filter(|z| site.zones[*z].floor == floor).collect();
        let (mut min_lat, mut max_lat, mut min_lon, mut max_lon) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for r in &on_floor {
            let rec = &site.receivers[*r];
            min_lat = min_lat.min(rec.lat);
            max_lat = max_lat.max(rec.lat);
            min_lon = min_lon.min(rec.lon);
            max_lon = max_lon.max(rec.lon);
        }
        let spread = (max_lat - min_lat).max(max_lon - min_lon);
        let mut receivers = HashMap::new();
        let mut zones = HashMap::new();
        if on_floor.len() >= 2 && spread > 1e-9 {
            // One scale for both axes keeps the plan's proportions.
            let margin = 0.12;
            let scale = (1.0 - 2.0 * margin) / spread;
            for r in &on_floor {
                let rec = &site.receivers[*r];
                let x = margin + (rec.lon - min_lon) * scale;
                let y = margin + (max_lat - rec.lat) * scale;
                receivers.insert(*r, (x, y));
            }
            for z in &zones_on_floor {
                let points: Vec<(f64, f64)> =
                    site.zones[*z].receivers.iter().filter_map(|r| receivers.get(r).copied()).collect();
                if !points.is_empty() {
                    let n = points.len() as f64;
                    zones.insert(
                        *z,
                        (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n),
                    );
                }
            }
        }
        // Zones without a receiver position: a row along the bottom.
        let missing: Vec<usize> = zones_on_floor.iter().copied().filter(|z| !zones.contains_key(z)).collect();
        for (i, z) in missing.iter().enumerate() {
            let x = (i as f64 + 0.5) / missing.len() as f64;
            zones.insert(*z, (x, if zones.is_empty() || receivers.is_empty() { 0.5 } else { 0.92 }));
        }
        for r in &on_floor {
            if !receivers.contains_key(r) {
                let (x, y) = zones.get(&site.receivers[*r].zone).copied().unwrap_or((0.5, 0.5));
                receivers.insert(*r, (x, (y - 0.08).max(0.0)));
            }
        }
        Layout { receivers, zones }
    }

    fn zone(&self, z: usize) -> (f64, f64) {
        self.zones.get(&z).copied().unwrap_or((0.5, 0.5))
    }

    fn receiver(&self, r: usize) -> (f64, f64) {
        self.receivers.get(&r).copied().unwrap_or((0.5, 0.5))
    }
}
