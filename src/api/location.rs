//! The location API: devices (`/devices`), `/locate`, the time-in-zone reports
//! (`/report/timebydevice`, `/report/timebyzone`, `/report/timesummary`), device status
//! (`/report/lastseen`, `/report/battery`), and a contact's location data (export, purge).
//!
//! Everything is scoped to the caller's organisation; devices are managed by administrators.
//! Times are `YYYY-MM-DD HH:MM:SS` in the site's time zone.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::error::ApiError;
use super::input::{Params, only_keys};
use super::output::Out;
use super::{Ctx, Reply};
use crate::limits;
use crate::location::beacon::BeaconId;
use crate::location::devices::{Device, check_address, check_deviceid, default_deviceid};
use crate::location::service::{SiteState, current};
use crate::location::site::Site;
use crate::model::trim_blank;
use crate::store::{StoredDevice, Visit};
use crate::timefmt::{local_ms, now_ms, parse_local_ms};

fn site(ctx: &Ctx<'_>) -> SiteState {
    current(&ctx.app.site)
}

fn tz<'a>(ctx: &'a Ctx<'_>) -> &'a jiff::tz::TimeZone {
    &ctx.app.config.site.timezone
}

fn admin_only(ctx: &Ctx<'_>) -> Result<(), ApiError> {
    if ctx.viewer.admin { Ok(()) } else { Err(ApiError::forbidden("only administrators manage devices")) }
}

fn opt_int(v: Option<i64>) -> Out {
    v.map_or(Out::Null, Out::Int)
}

fn opt_text(v: Option<String>) -> Out {
    v.map_or(Out::Null, Out::text)
}

fn zone_name(site: &Site, zone_id: i64) -> String {
    site.zone(zone_id).map(|z| site.zones[z].name.clone()).unwrap_or_default()
}

/// Battery as the interface writes it: volts with two decimals, or `None`.
pub fn battery_text(mv: Option<i64>) -> String {
    match mv {
        Some(mv) => format!("{:.2}", mv as f64 / 1000.0),
        None => "None".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Devices

fn device_out(ctx: &Ctx<'_>, site: &Site, d: &StoredDevice) -> Out {
    let s = &d.status;
    Out::map()
        .with("id", Out::Int(d.id))
        .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
        .with("deviceid", Out::text(d.device.deviceid.clone()))
        .with("label", Out::text(d.device.label.clone()))
        .with("tagtype", opt_int(d.device.tagtype))
        .with(
            "tagtypetitle",
            Out::text(d.device.tagtype.and_then(|t| site.tag_type(t)).map(|t| t.title.clone()).unwrap_or_default()),
        )
        .with("beacon", Out::text(d.device.beacon.to_string()))
        // A contact deleted since it was assigned is no one, as in the list.
        .with("contactid", opt_int(d.device.contactid.filter(|_| d.contact_name.is_some())))
        .with("contactname", opt_text(d.contact_name.clone()))
        .with("lastseen", Out::text(s.last_seen_ms.map(|t| local_ms(t, tz(ctx))).unwrap_or_default()))
        .with("battery", Out::text(if s.battery_mv.is_some() { battery_text(s.battery_mv) } else { String::new() }))
        .with("zoneid", opt_int(s.zone_id))
        .with("zonename", Out::text(s.zone_id.map(|z| zone_name(site, z)).unwrap_or_default()))
}

const DEVICE_KEYS: &[&str] = &["deviceaddress", "deviceid", "label", "tagtype", "beacon", "contactid"];

/// A device from a body, over `base` (update) or from nothing (create).
fn device_input(body: &Value, base: Option<&Device>, site: &Site) -> Result<Device, ApiError> {
    only_keys(body, DEVICE_KEYS)?;
    let p = Params::new(body);
    let text = |key: &str| -> Result<Option<String>, ApiError> {
        let v = p.text(key).map_err(|_| ApiError::invalid_value(key, "must be text"))?;
        if let Some(v) = &v {
            if p.sent_bytes(key) > limits::NAME_BYTES_MAX {
                return Err(ApiError::invalid_value(key, "is longer than 255 bytes"));
            }
            crate::model::check_text(v).map_err(|e| ApiError::invalid_value(key, e))?;
        }
        Ok(v)
    };
    let deviceaddress = match text("deviceaddress")? {
        Some(a) => a,
        None => base
            .map(|b| b.deviceaddress.clone())
            .ok_or_else(|| ApiError::invalid_value("deviceaddress", "is required"))?,
    };
    let deviceaddress = check_address(&deviceaddress).map_err(|e| ApiError::invalid_value("deviceaddress", e))?;
    let deviceid = match text("deviceid")?.filter(|s| !s.is_empty()) {
        Some(id) => id,
        None => match base {
            // A changed address changes a derived deviceid with it.
            Some(b) if b.deviceid != default_deviceid(&b.deviceaddress) => b.deviceid.clone(),
            _ => default_deviceid(&deviceaddress),
        },
    };
    check_deviceid(&deviceid).map_err(|e| ApiError::invalid_value("deviceid", e))?;
    let beacon = match text("beacon")? {
        Some(b) => BeaconId::parse(&b).ok_or_else(|| {
            ApiError::invalid_value(
                "beacon",
                "must be ibeacon:UUID/MAJOR/MINOR, eddystone:NAMESPACE/INSTANCE (hex) or mac:AA:BB:CC:DD:EE:FF",
            )
        })?,
        None => base.map(|b| b.beacon).ok_or_else(|| ApiError::invalid_value("beacon", "is required"))?,
    };
    let int_or_clear = |key: &str, current: Option<i64>| -> Result<Option<i64>, ApiError> {
        match p.get(key) {
            None => Ok(current),
            Some(_) => p.int(key).map_err(|_| ApiError::invalid_value(key, "must be an integer or empty")),
        }
    };
    let tagtype = int_or_clear("tagtype", base.and_then(|b| b.tagtype))?;
    // Checked when given: a tag type the site map dropped since does not block other changes.
    if let Some(t) = tagtype
        && tagtype != base.and_then(|b| b.tagtype)
        && site.tag_type(t).is_none()
    {
        let known: Vec<String> = site.tag_types.iter().map(|t| t.id.to_string()).collect();
        return Err(ApiError::invalid_value(
            "tagtype",
            format!(
                "{t} is not a tag type of the site (known: {})",
                if known.is_empty() { "none".into() } else { known.join(", ") }
            ),
        ));
    }
    Ok(Device {
        deviceaddress,
        deviceid,
        label: text("label")?.or_else(|| base.map(|b| b.label.clone())).unwrap_or_default(),
        tagtype,
        beacon,
        contactid: int_or_clear("contactid", base.and_then(|b| b.contactid))?,
    })
}

pub fn devices_list(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    let site = site(ctx).site;
    let devices = devices_seen_by(ctx)?;
    let items: Vec<Out> = devices.iter().map(|d| device_out(ctx, &site, d)).collect();
    Ok(Reply::ok(Out::map().with("count", Out::Int(items.len() as i64)).with("devices", Out::list("device", items))))
}

pub fn device_create(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    let site = site(ctx).site;
    let device = device_input(&ctx.body, None, &site)?;
    let stored = ctx.app.store.create_device(&ctx.viewer.org, &device)?;
    let location = format!("/devices/{}", stored.id);
    Ok(Reply::created(Out::map().with("device", device_out(ctx, &site, &stored)), location))
}

pub fn device_show(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    let site = site(ctx).site;
    let d = ctx.app.store.device(Some(&ctx.viewer.org), id)?;
    Ok(Reply::ok(Out::map().with("device", device_out(ctx, &site, &d))))
}

pub fn device_update(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    let site = site(ctx).site;
    // The keys left out keep their values, read in the write itself.
    ctx.app.store.update_device(&ctx.viewer.org, id, |current| device_input(&ctx.body, Some(current), &site))??;
    Ok(Reply::ok(Out::map()))
}

pub fn device_delete(ctx: &Ctx<'_>, id: i64) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    ctx.app.store.delete_device(&ctx.viewer.org, id)?;
    Ok(Reply::ok(Out::map()))
}

// ---------------------------------------------------------------------------------------------
// Locate

/// The place of a zone: area, building, floor, zone (empty where unknown; a zone the site
/// map no longer has keeps its id, as in exports and reports).
fn place(site: &Site, zone_id: Option<i64>, out: Out) -> Out {
    let zone = zone_id.and_then(|z| site.zone(z)).map(|z| &site.zones[z]);
    let floor = zone.map(|z| &site.floors[z.floor]);
    let building = floor.map(|f| &site.buildings[f.building]);
    let area = building.map(|b| &site.areas[b.area]);
    out.with("areaid", opt_int(area.map(|a| a.id)))
        .with("areaname", Out::text(area.map(|a| a.name.clone()).unwrap_or_default()))
        .with("buildingid", opt_int(building.map(|b| b.id)))
        .with("buildingname", Out::text(building.map(|b| b.name.clone()).unwrap_or_default()))
        .with("floorid", opt_int(floor.map(|f| f.id)))
        .with("floorlabel", Out::text(floor.map(|f| f.label.clone()).unwrap_or_default()))
        .with("floorlevel", opt_int(floor.map(|f| f.level)))
        .with("zoneid", opt_int(zone.map(|z| z.id).or(zone_id)))
        .with("zonename", Out::text(zone.map(|z| z.name.clone()).unwrap_or_default()))
}

fn position_text(lat: Option<f64>, lon: Option<f64>) -> String {
    match (lat, lon) {
        (Some(lat), Some(lon)) => format!("{lat:.6},{lon:.6}"),
        _ => String::new(),
    }
}

/// Great-circle distance in metres.
fn distance_m(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (lat1, lat2) = (a.0.to_radians(), b.0.to_radians());
    let (dlat, dlon) = ((b.0 - a.0).to_radians(), (b.1 - a.1).to_radians());
    let h = (dlat / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * 6_371_000.0 * h.sqrt().asin()
}

/// Whether a device answers `searchvalue`: the start of its contact's name (first name, or
/// first and last name), a tag type's title, or a contact id.
fn matches_search(d: &StoredDevice, site: &Site, search: &str) -> bool {
    if search.is_empty() {
        return true;
    }
    if let Ok(id) = search.parse::<i64>() {
        return d.device.contactid == Some(id);
    }
    let needle = search.to_lowercase();
    if let Some(name) = &d.contact_name
        && name.to_lowercase().starts_with(&needle)
    {
        return true;
    }
    d.device.tagtype.and_then(|t| site.tag_type(t)).is_some_and(|t| t.title.to_lowercase() == needle)
}

/// The organisation's devices as the caller may see them: a device's contact (its id and
/// name) only when the caller may see that contact record; else the device is anonymous.
fn devices_seen_by(ctx: &Ctx<'_>) -> Result<Vec<StoredDevice>, ApiError> {
    visible_devices(ctx.app, &ctx.viewer)
}

/// [`devices_seen_by`] for callers outside a request (the status page's events).
pub fn visible_devices(app: &super::App, viewer: &crate::model::Viewer) -> Result<Vec<StoredDevice>, ApiError> {
    let mut devices = app.store.devices(Some(&viewer.org))?;
    // A contact deleted since it was assigned is no one's to show (its name is not read).
    for d in &mut devices {
        if d.contact_name.is_none() {
            d.device.contactid = None;
        }
    }
    if viewer.admin {
        return Ok(devices);
    }
    let contacts: Vec<i64> = devices.iter().filter_map(|d| d.device.contactid).collect();
    let visible = app.store.visible_ids(viewer, &contacts)?;
    for d in &mut devices {
        if d.device.contactid.is_some_and(|id| !visible.contains(&id)) {
            d.device.contactid = None;
            d.contact_name = None;
        }
    }
    Ok(devices)
}

pub fn locate(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let params = ctx.params();
    let p = Params::new(&params);
    let search = p.text("searchvalue")?.unwrap_or_default();
    if p.sent_bytes("searchvalue") > limits::SEARCH_VALUE_BYTES_MAX {
        return Err(ApiError::invalid_parameter("searchvalue", "is too long"));
    }
    let within = minutes(&p, "lastreportedwithin")?;
    let history = minutes(&p, "historyminutes")?;
    let relative = p.nonempty("relativedeviceaddress")?.map(|a| crate::location::devices::lookup_address(&a));
    let site = site(ctx).site;
    let devices = devices_seen_by(ctx)?;
    let now = now_ms();
    let origin = match &relative {
        None => None,
        Some(address) => {
            let d = devices
                .iter()
                .find(|d| &d.device.deviceaddress == address)
                .ok_or_else(|| ApiError::invalid_parameter("relativedeviceaddress", format!("no device {address}")))?;
            match (d.status.lat, d.status.lon) {
                (Some(lat), Some(lon)) => Some((lat, lon)),
                _ => None,
            }
        }
    };
    let found: Vec<&StoredDevice> = devices
        .iter()
        .filter(|d| d.status.position_ms.is_some())
        .filter(|d| matches_search(d, &site, &search))
        .filter(|d| within.is_none_or(|m| d.status.last_seen_ms.is_some_and(|t| now - t <= m * 60_000)))
        .collect();
    let mut records = Vec::with_capacity(found.len());
    for d in &found {
        let s = &d.status;
        let location = place(
            &site,
            s.position_zone_id,
            Out::map().with("timestamp", Out::text(local_ms(s.position_ms.unwrap_or(0), tz(ctx)))),
        )
        .with("position", Out::text(position_text(s.lat, s.lon)))
        .with("source", Out::text("ble"));
        let mut record = Out::map()
            .with("contactid", opt_int(d.device.contactid))
            .with("contactname", opt_text(d.contact_name.clone()))
            .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
            .with("location", location);
        // Every locate record has it (the interface lists it); null without a device to
        // measure from, or a position.
        let distance = match (origin, s.lat, s.lon) {
            (Some(o), Some(lat), Some(lon)) => Out::Int(distance_m(o, (lat, lon)).round() as i64),
            _ => Out::Null,
        };
        record.push("distancemeters", distance);
        if let Some(m) = history
            && found.len() == 1
        {
            let rows =
                ctx.app.store.location_history(d.id, (now - m * 60_000, now), limits::LOCATE_HISTORY_ROWS_MAX)?;
            let items = rows
                .iter()
                .map(|r| {
                    place(&site, Some(r.zone_id), Out::map().with("timestamp", Out::text(local_ms(r.t_ms, tz(ctx)))))
                        .with("position", Out::text(position_text(Some(r.lat), Some(r.lon))))
                        .with("receiver", Out::text(r.receiver.clone()))
                        .with("rssi", Out::Int(r.rssi.round() as i64))
                })
                .collect();
            record.push("history", Out::list("location", items));
        }
        records.push(record);
    }
    Ok(Reply::ok(
        Out::map().with("count", Out::Int(records.len() as i64)).with("records", Out::list("record", records)),
    ))
}

fn minutes(p: &Params<'_>, key: &str) -> Result<Option<i64>, ApiError> {
    match p.int(key)? {
        None => Ok(None),
        Some(m) if (0..=limits::LOCATION_MINUTES_MAX).contains(&m) => Ok(Some(m)),
        Some(m) => {
            Err(ApiError::invalid_parameter(key, format!("{m} is outside 0..={}", limits::LOCATION_MINUTES_MAX)))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Device status

pub fn lastseen(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let devices = devices_seen_by(ctx)?;
    let records: Vec<Out> = devices
        .iter()
        .map(|d| {
            Out::map()
                .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
                .with("timestamp", Out::text(d.status.last_seen_ms.map(|t| local_ms(t, tz(ctx))).unwrap_or_default()))
                .with("devicelabel", Out::text(d.device.label.clone()))
                .with("contactid", opt_int(d.device.contactid))
                .with("contactname", opt_text(d.contact_name.clone()))
        })
        .collect();
    let inner = Out::map().with("count", Out::Int(records.len() as i64)).with("records", Out::list("record", records));
    Ok(Reply::ok(Out::map().with("lastseen", inner)))
}

pub fn battery(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let devices = devices_seen_by(ctx)?;
    let records: Vec<Out> = devices
        .iter()
        .map(|d| {
            let mv = d.status.battery_mv;
            Out::map()
                .with("unit", Out::text(if mv.is_some() { "V" } else { "" }))
                .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
                .with("battery", Out::text(battery_text(mv)))
                .with("devicelabel", Out::text(d.device.label.clone()))
                .with("contactid", opt_int(d.device.contactid))
                .with("contactname", opt_text(d.contact_name.clone()))
        })
        .collect();
    let inner = Out::map().with("count", Out::Int(records.len() as i64)).with("records", Out::list("record", records));
    Ok(Reply::ok(Out::map().with("battery", inner)))
}

// ---------------------------------------------------------------------------------------------
// Time-in-zone reports

/// The common parameters of the time-in-zone reports.
struct TimeQuery {
    from_ms: i64,
    to_ms: i64,
    tagtype: Option<i64>,
    min: Option<i64>,
    max: Option<i64>,
    deviceaddress: Option<String>,
    zone: Option<i64>,
    zones: Vec<i64>,
    detailed: bool,
    page: i64,
    sort_exit: bool,
    descending: bool,
}

fn time_query(ctx: &Ctx<'_>) -> Result<TimeQuery, ApiError> {
    let params = ctx.params();
    let p = Params::new(&params);
    let now = now_ms();
    let (from_ms, to_ms) = match p.nonempty("range")? {
        None => (now - limits::LOCATION_REPORT_DEFAULT_DAYS * 86_400_000, now),
        Some(range) => {
            let (a, b) = range
                .split_once(',')
                .ok_or_else(|| ApiError::invalid_parameter("range", "must be two dates or date-times: start,end"))?;
            let parse = |s: &str| {
                parse_local_ms(s, tz(ctx)).ok_or_else(|| {
                    ApiError::invalid_parameter("range", format!("{:?} is not a date or date-time", trim_blank(s)))
                })
            };
            // A plain end date includes that whole day (in the site's time zone: 23 or 25
            // hours on the days the clocks change).
            let from = parse(a)?;
            let to = match crate::timefmt::local_day_end_ms(b, tz(ctx)) {
                Some(end) => end,
                None => parse(b)?,
            };
            if to <= from {
                return Err(ApiError::invalid_parameter("range", "the end must be after the start"));
            }
            // Days as the site counts them: a year with the autumn change is an hour longer.
            if to - from > limits::LOCATION_REPORT_RANGE_DAYS_MAX * 86_400_000 + 3_600_000 {
                return Err(ApiError::invalid_parameter(
                    "range",
                    format!("at most {} days", limits::LOCATION_REPORT_RANGE_DAYS_MAX),
                ));
            }
            (from, to)
        }
    };
    let sort_exit = match p.nonempty("sortby")?.as_deref() {
        None | Some("enter") => false,
        Some("exit") => true,
        Some(other) => return Err(ApiError::invalid_parameter("sortby", format!("{other:?} is not enter or exit"))),
    };
    let descending = match p.nonempty("sortorder")?.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(other) => return Err(ApiError::invalid_parameter("sortorder", format!("{other:?} is not asc or desc"))),
    };
    let page = p.int("page")?.unwrap_or(1);
    if !(1..=1_000_000).contains(&page) {
        return Err(ApiError::invalid_parameter("page", "must be 1 or more"));
    }
    let zones = match p.get("zones") {
        None => Vec::new(),
        // `1,2` in a query or a form; an array, or elements, in a body.
        Some(v @ Value::String(_)) => super::input::id_list(v, "zones")?,
        Some(v) => super::input::ids_under(v, "zones")?,
    };
    Ok(TimeQuery {
        from_ms,
        to_ms,
        tagtype: p.int("type")?,
        min: p.int("min")?,
        max: p.int("max")?,
        deviceaddress: p.nonempty("deviceaddress")?.map(|a| crate::location::devices::lookup_address(&a)),
        zone: p.int("zoneid")?,
        zones,
        detailed: p.flag("detailed")?.unwrap_or(false),
        page,
        sort_exit,
        descending,
    })
}

/// One visit cut to the report's range.
struct Stay<'a> {
    device: &'a StoredDevice,
    /// The device's contact at the time (the visit's, not the device's now).
    holder: Option<i64>,
    zone_id: i64,
    enter_ms: i64,
    exit_ms: i64,
    /// Still there (the exit is the end of the range or now).
    open: bool,
}

fn stays<'a>(q: &TimeQuery, visits: &[Visit], devices: &'a HashMap<i64, &'a StoredDevice>) -> Vec<Stay<'a>> {
    let now = now_ms();
    visits
        .iter()
        .filter_map(|v| {
            let device = devices.get(&v.device_id)?;
            if q.tagtype.is_some() && device.device.tagtype != q.tagtype {
                return None;
            }
            if q.deviceaddress.as_ref().is_some_and(|a| a != &device.device.deviceaddress) {
                return None;
            }
            if q.zone.is_some_and(|z| z != v.zone_id) || (!q.zones.is_empty() && !q.zones.contains(&v.zone_id)) {
                return None;
            }
            let exit = v.exit_ms.unwrap_or(now.min(q.to_ms));
            let (enter_ms, exit_ms) = (v.enter_ms.max(q.from_ms), exit.min(q.to_ms));
            (exit_ms > enter_ms).then_some(Stay {
                device,
                holder: v.contact_id,
                zone_id: v.zone_id,
                enter_ms,
                exit_ms,
                open: v.exit_ms.is_none(),
            })
        })
        .collect()
}

fn minutes_of(ms: i64) -> i64 {
    (ms + 30_000) / 60_000
}

fn within(q: &TimeQuery, minutes: i64) -> bool {
    q.min.is_none_or(|m| minutes >= m) && q.max.is_none_or(|m| minutes <= m)
}

/// A zone's name as a key of `minutesinzone`: `zone<id>` for a zone the site map does not
/// name, and `Name (id)` for a name that several zones share (else their minutes would
/// merge under one key in JSON).
fn zone_label(site: &Site, zone_id: i64) -> String {
    let label = zone_name(site, zone_id);
    if label.is_empty() {
        format!("zone{zone_id}")
    } else if site.zones.iter().filter(|z| z.name == label).nth(1).is_some() {
        format!("{label} ({zone_id})")
    } else {
        label
    }
}

fn minutes_map(site: &Site, zone_id: i64, minutes: i64) -> Out {
    let mut m = Out::map();
    m.push_named("zone", zone_label(site, zone_id), Out::Int(minutes));
    m
}

/// The records of one device or zone: per zone totals, or (detailed) one per visit; sorted,
/// filtered by min/max minutes, one page.
fn visit_records(
    ctx: &Ctx<'_>,
    site: &Site,
    q: &TimeQuery,
    stays: &[&Stay<'_>],
    by_device: bool,
    names: &Names,
) -> (i64, Vec<Out>) {
    let mut rows: Vec<(i64, i64, Out)> = Vec::new(); // (sort key, minutes, record)
    if q.detailed {
        for s in stays {
            let minutes = minutes_of(s.exit_ms - s.enter_ms);
            let mut r = Out::map();
            if by_device {
                r.push("zoneid", Out::Int(s.zone_id));
                r.push("zonename", Out::text(zone_name(site, s.zone_id)));
            } else {
                push_device(&mut r, s.device, s.holder, names);
            }
            r.push("enter", Out::text(local_ms(s.enter_ms, tz(ctx))));
            r.push("exit", Out::text(if s.open { String::new() } else { local_ms(s.exit_ms, tz(ctx)) }));
            r.push("minutesinzone", minutes_map(site, s.zone_id, minutes));
            rows.push((if q.sort_exit { s.exit_ms } else { s.enter_ms }, minutes, r));
        }
    } else {
        // Totals per zone (by device) or per device and its holder (by zone), in first-enter
        // order.
        type Total<'a> = ((i64, Option<i64>), i64, i64, i64, &'a StoredDevice); // key, first enter, last exit, ms
        let mut totals: Vec<Total<'_>> = Vec::new();
        for s in stays {
            let key = if by_device { (s.zone_id, None) } else { (s.device.id, s.holder) };
            match totals.iter_mut().find(|t| t.0 == key) {
                Some(t) => {
                    t.1 = t.1.min(s.enter_ms);
                    t.2 = t.2.max(s.exit_ms);
                    t.3 += s.exit_ms - s.enter_ms;
                }
                None => totals.push((key, s.enter_ms, s.exit_ms, s.exit_ms - s.enter_ms, s.device)),
            }
        }
        for ((key, holder), first, last, ms, device) in totals {
            let minutes = minutes_of(ms);
            let mut r = Out::map();
            if by_device {
                r.push("zoneid", Out::Int(key));
                r.push("zonename", Out::text(zone_name(site, key)));
                r.push("minutesinzone", minutes_map(site, key, minutes));
            } else {
                push_device(&mut r, device, holder, names);
                let zone = stays.first().map(|s| s.zone_id).unwrap_or_default();
                r.push("minutesinzone", minutes_map(site, zone, minutes));
            }
            rows.push((if q.sort_exit { last } else { first }, minutes, r));
        }
    }
    rows.retain(|(_, minutes, _)| within(q, *minutes));
    rows.sort_by_key(|(k, _, _)| *k);
    if q.descending {
        rows.reverse();
    }
    let count = rows.len() as i64;
    let size = limits::LOCATION_REPORT_PAGE_ROWS;
    let page =
        rows.into_iter().skip(((q.page - 1) as usize).saturating_mul(size)).take(size).map(|(_, _, r)| r).collect();
    (count, page)
}

/// The names of the contacts the caller may see (live ones), by id.
type Names = HashMap<i64, String>;

/// A device in a report, with `holder` as its contact when the caller may see her.
fn push_device(r: &mut Out, d: &StoredDevice, holder: Option<i64>, names: &Names) {
    let holder = holder.filter(|id| names.contains_key(id));
    r.push("contactid", opt_int(holder));
    r.push("contactname", opt_text(holder.and_then(|id| names.get(&id).cloned())));
    r.push("deviceid", Out::text(d.device.deviceid.clone()));
    r.push("devicename", Out::text(d.device.label.clone()));
    r.push("deviceaddress", Out::text(d.device.deviceaddress.clone()));
}

/// The organisation's devices (with their contacts now), the visits of the range (each with
/// its contact then), and the names of those contacts the caller may see.
struct ReportData {
    devices: Vec<StoredDevice>,
    visits: Vec<Visit>,
    names: Names,
}

fn report_data(ctx: &Ctx<'_>, site: &Site, q: &TimeQuery) -> Result<ReportData, ApiError> {
    let devices = ctx.app.store.devices(Some(&ctx.viewer.org))?;
    if let Some(a) = &q.deviceaddress
        && !devices.iter().any(|d| &d.device.deviceaddress == a)
    {
        return Err(ApiError::invalid_parameter("deviceaddress", format!("no device {a}")));
    }
    // What the report asks for is read, and no more than the bound: a report that would need
    // more is refused, not cut short.
    let only = crate::store::VisitFilter {
        device_id: q
            .deviceaddress
            .as_ref()
            .and_then(|a| devices.iter().find(|d| &d.device.deviceaddress == a))
            .map(|d| d.id),
        tagtype: q.tagtype,
        zones: match (q.zone, q.zones.is_empty()) {
            (Some(z), _) => Some(vec![z]),
            (None, false) => Some(q.zones.clone()),
            (None, true) => None,
        },
    };
    let max = limits::LOCATION_REPORT_VISITS_MAX;
    let visits = ctx.app.store.visits(&ctx.viewer.org, q.from_ms, q.to_ms, &only, max + 1)?;
    if visits.len() > max as usize {
        return Err(ApiError::report_too_large(max));
    }
    // A zone since dropped from the site map still has its visits; one neither there nor in
    // the range's visits is a mistake worth saying.
    if let Some(z) = q.zone
        && site.zone(z).is_none()
        && visits.is_empty()
    {
        return Err(ApiError::invalid_parameter(
            "zoneid",
            format!("no zone {z} in the site map or in the range's visits"),
        ));
    }
    let mut contacts: Vec<i64> =
        visits.iter().filter_map(|v| v.contact_id).chain(devices.iter().filter_map(|d| d.device.contactid)).collect();
    contacts.sort_unstable();
    contacts.dedup();
    let mut names = ctx.app.store.contact_names(&ctx.viewer.org, &contacts)?;
    if !ctx.viewer.admin {
        let keys: Vec<i64> = names.keys().copied().collect();
        let visible = ctx.app.store.visible_ids(&ctx.viewer, &keys)?;
        names.retain(|id, _| visible.contains(id));
    }
    Ok(ReportData { devices, visits, names })
}

pub fn timebydevice(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let q = time_query(ctx)?;
    let site = site(ctx).site;
    let data = report_data(ctx, &site, &q)?;
    let by_id: HashMap<i64, &StoredDevice> = data.devices.iter().map(|d| (d.id, d)).collect();
    let stays = stays(&q, &data.visits, &by_id);
    // By device and the contact who held it: a badge handed on is one entry per holder.
    let mut groups: BTreeMap<(i64, Option<i64>), Vec<&Stay<'_>>> = BTreeMap::new();
    for s in &stays {
        groups.entry((s.device.id, s.holder)).or_default().push(s);
    }
    let entry = |d: &StoredDevice, holder: Option<i64>, stays: &[&Stay<'_>]| {
        let (count, records) = visit_records(ctx, &site, &q, stays, true, &data.names);
        let mut e = Out::map();
        push_device(&mut e, d, holder, &data.names);
        (count, e.with("count", Out::Int(count)).with("records", Out::list("record", records)))
    };
    // One device asked for: the object itself, with the time of its contact now; otherwise one
    // per device and holder with visits that pass min and max.
    let doc = match &q.deviceaddress {
        Some(a) => {
            let d = data.devices.iter().find(|d| &d.device.deviceaddress == a).ok_or_else(ApiError::item_not_found)?;
            let holder = d.device.contactid;
            entry(d, holder, groups.get(&(d.id, holder)).map(Vec::as_slice).unwrap_or(&[])).1
        }
        None => Out::list(
            "device",
            groups
                .iter()
                .filter_map(|((id, holder), s)| by_id.get(id).map(|d| entry(d, *holder, s)))
                .filter(|(count, _)| *count > 0)
                .map(|(_, e)| e)
                .collect(),
        ),
    };
    Ok(Reply::ok(Out::map().with("timebydevice", doc)))
}

pub fn timebyzone(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let q = time_query(ctx)?;
    let site = site(ctx).site;
    let data = report_data(ctx, &site, &q)?;
    let by_id: HashMap<i64, &StoredDevice> = data.devices.iter().map(|d| (d.id, d)).collect();
    let stays = stays(&q, &data.visits, &by_id);
    let mut groups: BTreeMap<i64, Vec<&Stay<'_>>> = BTreeMap::new();
    for s in &stays {
        groups.entry(s.zone_id).or_default().push(s);
    }
    let entry = |zone_id: i64, stays: &[&Stay<'_>]| {
        let (count, records) = visit_records(ctx, &site, &q, stays, false, &data.names);
        let e = Out::map()
            .with("zoneid", Out::Int(zone_id))
            .with("zonename", Out::text(zone_name(&site, zone_id)))
            .with("count", Out::Int(count))
            .with("records", Out::list("record", records));
        (count, e)
    };
    // One zone asked for: the object itself; otherwise one per zone with visits that pass
    // min and max.
    let doc = match q.zone {
        Some(z) => entry(z, groups.get(&z).map(Vec::as_slice).unwrap_or(&[])).1,
        None => Out::list(
            "zone",
            groups.iter().map(|(z, s)| entry(*z, s)).filter(|(count, _)| *count > 0).map(|(_, e)| e).collect(),
        ),
    };
    Ok(Reply::ok(Out::map().with("timebyzone", doc)))
}

pub fn timesummary(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let q = time_query(ctx)?;
    let site = site(ctx).site;
    let data = report_data(ctx, &site, &q)?;
    let by_id: HashMap<i64, &StoredDevice> = data.devices.iter().map(|d| (d.id, d)).collect();
    let stays = stays(&q, &data.visits, &by_id);
    // Minutes per tag type and zone.
    let mut totals: BTreeMap<Option<i64>, BTreeMap<i64, i64>> = BTreeMap::new();
    for s in &stays {
        *totals.entry(s.device.device.tagtype).or_default().entry(s.zone_id).or_default() += s.exit_ms - s.enter_ms;
    }
    let mut records = Vec::new();
    for (tagtype, zones) in totals {
        let mut minutes = Out::map();
        let mut total = 0;
        for (zone_id, ms) in zones {
            let m = minutes_of(ms);
            total += m;
            minutes.push_named("zone", zone_label(&site, zone_id), Out::Int(m));
        }
        if !within(&q, total) {
            continue;
        }
        records.push(
            Out::map()
                .with("type", opt_int(tagtype))
                .with(
                    "typetitle",
                    Out::text(tagtype.and_then(|t| site.tag_type(t)).map(|t| t.title.clone()).unwrap_or_default()),
                )
                .with("minutesinzone", minutes)
                .with("minutes", Out::Int(total)),
        );
    }
    let inner = Out::map().with("count", Out::Int(records.len() as i64)).with("records", Out::list("record", records));
    Ok(Reply::ok(Out::map().with("timesummary", inner)))
}

// ---------------------------------------------------------------------------------------------
// A contact's location data

/// `GET /contacts/{id}/locations`: everything stored about where the contact's devices were.
pub fn contact_export(ctx: &Ctx<'_>, contact: i64) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    let site = site(ctx).site;
    let data = ctx.app.store.contact_locations(&ctx.viewer.org, contact)?;
    Ok(Reply::ok(contact_locations_out(&site, tz(ctx), contact, &data)))
}

/// A contact's devices with their history and visits (the API's export, and the command
/// line's).
pub fn contact_locations_out(
    site: &Site,
    tz: &jiff::tz::TimeZone,
    contact: i64,
    data: &crate::store::ContactLocations,
) -> Out {
    let devices = data
        .iter()
        .map(|(d, history, visits)| {
            let history = history
                .iter()
                .map(|r| {
                    Out::map()
                        .with("timestamp", Out::text(local_ms(r.t_ms, tz)))
                        .with("zoneid", Out::Int(r.zone_id))
                        .with("zonename", Out::text(zone_name(site, r.zone_id)))
                        .with("position", Out::text(position_text(Some(r.lat), Some(r.lon))))
                        .with("receiver", Out::text(r.receiver.clone()))
                        .with("rssi", Out::Int(r.rssi.round() as i64))
                })
                .collect();
            let visits = visits
                .iter()
                .map(|v| {
                    Out::map()
                        .with("zoneid", Out::Int(v.zone_id))
                        .with("zonename", Out::text(zone_name(site, v.zone_id)))
                        .with("enter", Out::text(local_ms(v.enter_ms, tz)))
                        .with("exit", Out::text(v.exit_ms.map(|t| local_ms(t, tz)).unwrap_or_default()))
                })
                .collect();
            Out::map()
                .with("id", Out::Int(d.id))
                .with("deviceaddress", Out::text(d.device.deviceaddress.clone()))
                .with("deviceid", Out::text(d.device.deviceid.clone()))
                .with("label", Out::text(d.device.label.clone()))
                .with("history", Out::list("location", history))
                .with("visits", Out::list("visit", visits))
        })
        .collect();
    Out::map().with("contactid", Out::Int(contact)).with("devices", Out::list("device", devices))
}

/// `DELETE /contacts/{id}/locations`: forgets the history, visits and current position of the
/// contact's devices (the devices stay assigned).
pub fn contact_purge(ctx: &Ctx<'_>, contact: i64) -> Result<Reply, ApiError> {
    admin_only(ctx)?;
    let n = ctx.app.store.purge_contact_locations(&ctx.viewer.org, contact)?;
    Ok(Reply::ok(Out::map().with("removed", Out::Int(n as i64))))
}
