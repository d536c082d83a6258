//! The live feed: what the location engine decided, as the interface's MQTT messages on
//! `{organizationId}/{deviceId}/{data|state|alert}`.
//!
//! The location thread hands every written batch to [`Feed::batch`], which renders the
//! messages and queues them for the broker without waiting (a full queue drops and counts:
//! the engine never stalls on the feed). A data message goes out at every zone change and at
//! every stored update (the heartbeat, `[location] update_interval_ms`); a device's state is a
//! retained message, published when it changes and kept in the database so that a restart
//! publishes it again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::broker::BrokerStats;
use crate::limits;
use crate::location::site::Site;
use crate::store::{LocationEvent, Store, StoredDevice};
use crate::timefmt::local_ms;

/// One message for the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedMessage {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
}

/// Device states published on `{org}/{deviceId}/state` (`data.state`).
pub const STATE_ONLINE: &str = "online";
pub const STATE_OFFLINE: &str = "offline";
/// An alarm rule fired for the device (its panic button).
pub const STATE_ALARM: &str = "alarm";
/// A battery rule fired for the device.
pub const STATE_LOW_BATTERY: &str = "lowbattery";

/// A device's new state: device id, state, Unix ms since.
type Change = (i64, &'static str, i64);
/// A device whose open alarm is its state again: device id, the alarm's text, when raised.
type Alarmed = (i64, String, i64);

/// What the feed needs to know of a device.
#[derive(Debug, Clone)]
pub struct FeedDevice {
    pub org: String,
    pub deviceid: String,
    pub contact_id: Option<i64>,
    pub contact_name: Option<String>,
    pub battery_mv: Option<i64>,
    pub zone_since_ms: Option<i64>,
}

impl From<&StoredDevice> for FeedDevice {
    fn from(d: &StoredDevice) -> FeedDevice {
        FeedDevice {
            org: d.org.clone(),
            deviceid: d.device.deviceid.clone(),
            // A contact deleted since it was assigned is no one (its name is not read).
            contact_id: d.device.contactid.filter(|_| d.contact_name.is_some()),
            contact_name: d.contact_name.clone(),
            battery_mv: d.status.battery_mv,
            zone_since_ms: d.status.zone_since_ms,
        }
    }
}

pub fn topic(d: &FeedDevice, stream: &str) -> String {
    format!("{}/{}/{stream}", d.org, d.deviceid)
}

/// A location update as it was stored.
pub struct Placed<'a> {
    pub t_ms: i64,
    pub zone_id: i64,
    pub lat: f64,
    pub lon: f64,
    pub receiver: &'a str,
    pub rssi: f64,
}

/// The data message: where the device is, through which receiver, its battery, and how long
/// it has been in its zone (`travelTime`, seconds since it entered).
pub fn data_message(site: &Site, d: &FeedDevice, at: &Placed, tz: &jiff::tz::TimeZone) -> Value {
    let zone = site.zone(at.zone_id).map(|z| &site.zones[z]);
    let floor = zone.map(|z| &site.floors[z.floor]);
    let building_id = floor.map(|f| site.buildings[f.building].id);
    let floor_id = floor.map(|f| f.id);
    let receiver = site.receiver(at.receiver).map(|r| &site.receivers[r]);
    let locality = receiver.map(|r| site.zones[r.zone].name.clone());
    let rssi = at.rssi.round() as i64;
    let since = d.zone_since_ms.filter(|s| *s <= at.t_ms).unwrap_or(at.t_ms);
    let mut data = serde_json::Map::new();
    data.insert(
        "proximity".into(),
        json!({
            "label": "Proximity",
            "value": {
                "zoneId": at.zone_id,
                "zoneIds": [at.zone_id],
                "buildingId": building_id,
                "floorId": floor_id,
                "anchorId": at.receiver,
                "anchorIds": [{"deviceId": at.receiver, "rssi": rssi, "locality": locality, "registered": receiver.is_some()}],
            }
        }),
    );
    data.insert(
        "position".into(),
        json!({
            "label": "Position",
            "value": {
                "coordinates": [at.lat, at.lon],
                "src": "ble",
                "zoneId": at.zone_id,
                "zoneIds": [at.zone_id],
                "buildingId": building_id,
                "floorId": floor_id,
            }
        }),
    );
    if let Some(mv) = d.battery_mv {
        data.insert(
            "batteryVoltage".into(),
            json!({"label": "Battery voltage", "value": format!("{:.2}", mv as f64 / 1000.0), "unit": "V"}),
        );
    }
    data.insert(
        "travelTime".into(),
        json!({"label": "Travel time", "value": ((at.t_ms - since) / 1000).to_string(), "unit": "s"}),
    );
    json!({
        "deviceId": d.deviceid,
        "contactId": d.contact_id,
        "contactName": d.contact_name,
        "timeStamp": local_ms(at.t_ms, tz),
        "data": data,
    })
}

/// The state message (retained); `alarm` is the text of the alarm that set it, if any.
pub fn state_message(d: &FeedDevice, state: &str, alarm: Option<&str>, t_ms: i64, tz: &jiff::tz::TimeZone) -> Value {
    json!({
        "deviceId": d.deviceid,
        "contactId": d.contact_id,
        "contactName": d.contact_name,
        "data": {
            "state": state,
            "alarmEvent": {"label": "Alarm event", "value": alarm.unwrap_or("none")},
            "timeStamp": local_ms(t_ms, tz),
        },
    })
}

/// The alert message.
pub struct AlertInfo<'a> {
    /// The recorded alert (`POST /alerts/{id}/ack`); none while the database refuses it.
    pub id: Option<i64>,
    pub kind: crate::alerts::rules::AlertType,
    /// What the rule watches: enter, not_seen, battery_low or alarm.
    pub channel: &'a str,
    pub text: &'a str,
    pub value: &'a str,
    pub units: &'a str,
    pub t_ms: i64,
}

pub fn alert_message(d: &FeedDevice, a: &AlertInfo, tz: &jiff::tz::TimeZone) -> Value {
    json!({
        "text": a.text,
        "deviceId": d.deviceid,
        "alertId": a.id,
        "type": a.kind.as_str(),
        "timeStamp": local_ms(a.t_ms, tz),
        "data": {
            "contactId": d.contact_id,
            "contactName": d.contact_name,
            "channel": a.channel,
            "value": a.value,
            "units": a.units,
        },
        "audio": crate::alerts::audio::base64_wav(a.kind),
    })
}

/// The feed as the location thread drives it.
pub struct Feed {
    tx: tokio::sync::mpsc::Sender<FeedMessage>,
    tz: jiff::tz::TimeZone,
    devices: HashMap<i64, FeedDevice>,
    /// Devices whose published state is online.
    online: HashSet<i64>,
    /// Devices whose published state is an alert's (`alarm`, `lowbattery`), and which.
    alerted: HashMap<i64, &'static str>,
    /// Devices restored as online at start (or online at a site reload) that the engine has
    /// not placed yet, and when they count as gone (start + away timeout).
    restored: Option<(i64, HashSet<i64>)>,
    /// The stored states were published ([`Feed::restore`]): later device changes are
    /// published as they come.
    published: bool,
    /// Until when a full queue is waited for instead of dropping: while the start publishes
    /// every device's state (more than the queue holds on a large site), before clients come.
    patient_until: Option<std::time::Instant>,
    stats: Arc<BrokerStats>,
}

impl Feed {
    pub fn new(tx: tokio::sync::mpsc::Sender<FeedMessage>, tz: jiff::tz::TimeZone, stats: Arc<BrokerStats>) -> Feed {
        Feed {
            tx,
            tz,
            devices: HashMap::new(),
            online: HashSet::new(),
            alerted: HashMap::new(),
            restored: None,
            published: false,
            patient_until: None,
            stats,
        }
    }

    /// Takes the devices (at start, when they change, and now and then for contact names).
    /// Once the states are published ([`Feed::restore`]), a deleted device's retained state is
    /// cleared (an empty retained message), and a device whose topic, contact or contact's
    /// name changed has its state published again, so that the retained state names who
    /// carries it now.
    pub fn set_devices(&mut self, store: &Store, devices: &[StoredDevice]) {
        let new: HashMap<i64, FeedDevice> = devices.iter().map(|d| (d.id, FeedDevice::from(d))).collect();
        let old = std::mem::replace(&mut self.devices, new);
        if !self.published {
            return;
        }
        let mut again = HashSet::new();
        for (id, was) in &old {
            match self.devices.get(id) {
                None => {
                    self.clear(topic(was, "state"));
                    self.online.remove(id);
                    self.alerted.remove(id);
                    if let Some((_, pending)) = &mut self.restored {
                        pending.remove(id);
                    }
                }
                Some(d) if d.org != was.org || d.deviceid != was.deviceid => {
                    self.clear(topic(was, "state"));
                    again.insert(*id);
                }
                Some(d) if d.contact_id != was.contact_id || d.contact_name != was.contact_name => {
                    again.insert(*id);
                }
                Some(_) => {}
            }
        }
        if !again.is_empty() {
            self.publish_states(store, |id| again.contains(&id));
        }
    }

    /// Publishes the stored state of the devices `which` chooses (retained); returns those
    /// not offline.
    fn publish_states(&mut self, store: &Store, which: impl Fn(i64) -> bool) -> HashSet<i64> {
        let states = match store.device_states() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("mqtt: cannot read the device states: {e}");
                return HashSet::new();
            }
        };
        let mut present = HashSet::new();
        let mut given_way = Vec::new();
        for (id, mut state, mut t_ms) in states {
            let Some(d) = self.devices.get(&id).filter(|_| which(id)) else { continue };
            // An alarm acknowledged just before a stop, before its state gave way (within a
            // second): online, not the alarm again until the device leaves.
            if state == STATE_ALARM && matches!(store.open_alarm(id), Ok(None)) {
                (state, t_ms) = (STATE_ONLINE.to_string(), crate::timefmt::now_ms());
                given_way.push((id, STATE_ONLINE, t_ms));
            }
            // An alarm state says again which alarm (its alert holds the text).
            let alarm = if state == STATE_ALARM { store.alarm_text_at(id, t_ms).ok().flatten() } else { None };
            let msg = state_message(d, &state, alarm.as_deref(), t_ms, &self.tz);
            self.send(topic(d, "state"), &msg, true);
            self.note(id, &state);
            if state != STATE_OFFLINE {
                present.insert(id);
            }
        }
        if !given_way.is_empty()
            && let Err(e) = store.set_device_states(&given_way)
        {
            log::warn!("mqtt: cannot store the states of acknowledged alarms: {e}");
        }
        present
    }

    /// Removes a topic's retained message (subscribers get the empty message).
    fn clear(&self, topic: String) {
        self.queue(FeedMessage { topic, payload: Vec::new(), retain: true });
    }

    /// At start: publishes every device's last state again (retained), and remembers which
    /// were online so that they go offline if the engine does not place them in time.
    pub fn restore(&mut self, store: &Store, now_ms: i64, away_timeout_ms: i64) {
        self.published = true;
        // An alarm or low battery is set on a device that is there: placed again, it keeps
        // that state (as without the restart); not placed in time, it goes offline.
        self.patient_until =
            Some(std::time::Instant::now() + std::time::Duration::from_millis(limits::MQTT_FEED_RESTORE_WAIT_MS));
        let pending = self.publish_states(store, |_| true);
        self.patient_until = None;
        self.online.extend(pending.iter().copied());
        self.restored = Some((now_ms + away_timeout_ms, pending));
    }

    /// After a start or a site reload, when the engine starts over: devices online now go
    /// offline if the new engine does not place them within the away timeout; those `kept`
    /// in their zones (placed by the new engine as they were) are online.
    pub fn resume(&mut self, store: &Store, now_ms: i64, away_timeout_ms: i64, kept: &HashSet<i64>) {
        // Those still waiting from the start are online too: they wait anew.
        let pending = self.online.iter().filter(|id| !kept.contains(id)).copied().collect();
        self.restored = Some((now_ms.saturating_add(away_timeout_ms), pending));
        // Kept in a zone with its state stored `offline`: the last run stopped between the
        // write that placed it and the one that stored its state (a power cut). It entered no
        // zone since, so nothing else would publish it online while it stays.
        let (mut changes, mut alarms) = (Vec::new(), Vec::new());
        let mut arrived: Vec<i64> =
            kept.iter().filter(|id| !self.online.contains(id) && self.devices.contains_key(id)).copied().collect();
        arrived.sort_unstable();
        for id in arrived {
            self.arrive(store, id, now_ms, &mut changes, &mut alarms);
        }
        self.publish_changes(store, changes, alarms);
    }

    /// A device now in a zone that was not online: online, or its alarm again if one is open
    /// (an alert's state it has already stays).
    fn arrive(&mut self, store: &Store, id: i64, t_ms: i64, changes: &mut Vec<Change>, alarms: &mut Vec<Alarmed>) {
        self.online.insert(id);
        // Pressed on its way in (an alarm is published as its advert arrives, before the
        // batch that places it): the alarm stays, as does a low battery.
        if self.alerted.contains_key(&id) {
            return;
        }
        // Back with an alarm nobody has acknowledged (it went offline since): the alarm
        // again, as of when it was raised, not `online`.
        match store.open_alarm(id) {
            Ok(Some((text, alarm_ms))) => alarms.push((id, text, alarm_ms)),
            _ => changes.push((id, STATE_ONLINE, t_ms)),
        }
    }

    /// The wall clock was stepped by `by_ms`: the deadline for devices to be placed again
    /// moves with it.
    pub fn shift(&mut self, by_ms: i64) {
        if let Some((until, _)) = &mut self.restored {
            *until = until.saturating_add(by_ms);
        }
    }

    /// Renders and queues what one written batch means for the feed; state changes are
    /// stored (in one write) so that a restart can publish them again.
    pub fn batch(&mut self, store: &Store, site: &Site, events: &[LocationEvent], now_ms: i64) {
        let mut last_zone_event: HashMap<i64, (bool, i64)> = HashMap::new();
        // The batch's battery reports first: its data messages carry the battery it reported
        // (a report without a reading, 0 mV, leaves the last one, as the store does).
        for e in events {
            if let LocationEvent::Battery { device_id, mv: Some(mv), .. } = e
                && let Some(d) = self.devices.get_mut(device_id)
            {
                d.battery_mv = Some(i64::from(*mv));
            }
        }
        for e in events {
            match e {
                LocationEvent::Battery { .. } => {}
                LocationEvent::Enter { device_id, t_ms, .. } => {
                    if let Some(d) = self.devices.get_mut(device_id) {
                        d.zone_since_ms = Some(*t_ms);
                    }
                    last_zone_event.insert(*device_id, (true, *t_ms));
                }
                LocationEvent::Exit { device_id, t_ms, .. } => {
                    last_zone_event.insert(*device_id, (false, *t_ms));
                }
                LocationEvent::Update { device_id, t_ms, zone_id, lat, lon, receiver, rssi } => {
                    if let Some(d) = self.devices.get(device_id) {
                        let at = Placed { t_ms: *t_ms, zone_id: *zone_id, lat: *lat, lon: *lon, receiver, rssi: *rssi };
                        let msg = data_message(site, d, &at, &self.tz);
                        self.send(topic(d, "data"), &msg, false);
                    }
                }
                LocationEvent::Seen { .. } => {}
            }
        }
        let mut changes = Vec::new();
        let mut alarms = Vec::new();
        for (id, (inside, t_ms)) in last_zone_event {
            if let Some((_, pending)) = &mut self.restored {
                pending.remove(&id);
            }
            let was_online = self.online.contains(&id);
            if inside && !was_online {
                self.arrive(store, id, t_ms, &mut changes, &mut alarms);
            } else if !inside && was_online {
                self.online.remove(&id);
                changes.push((id, STATE_OFFLINE, t_ms));
            }
        }
        if let Some((deadline, pending)) = &mut self.restored
            && now_ms >= *deadline
        {
            for id in pending.drain() {
                if self.online.remove(&id) {
                    changes.push((id, STATE_OFFLINE, now_ms));
                }
            }
            self.restored = None;
        }
        self.publish_changes(store, changes, alarms);
    }

    /// Publishes and stores (in one write) state changes, and alarms' states again.
    fn publish_changes(&mut self, store: &Store, mut changes: Vec<Change>, alarms: Vec<Alarmed>) {
        if changes.is_empty() && alarms.is_empty() {
            return;
        }
        changes.sort_by_key(|c| (c.2, c.0));
        for (id, state, t_ms) in &changes {
            if let Some(d) = self.devices.get(id) {
                let msg = state_message(d, state, None, *t_ms, &self.tz);
                self.send(topic(d, "state"), &msg, true);
            }
            self.note(*id, state);
        }
        for (id, text, alarm_ms) in &alarms {
            if let Some(d) = self.devices.get(id) {
                let msg = state_message(d, STATE_ALARM, Some(text), *alarm_ms, &self.tz);
                self.send(topic(d, "state"), &msg, true);
            }
            self.note(*id, STATE_ALARM);
        }
        changes.extend(alarms.iter().map(|(id, _, alarm_ms)| (*id, STATE_ALARM, *alarm_ms)));
        if let Err(e) = store.set_device_states(&changes) {
            log::warn!("mqtt: cannot store the device states: {e}");
        }
    }

    /// Publishes an alert (Warn and Alarm) and, for alarm buttons and low batteries, the
    /// device's new state (stored like every state). False when the queue stayed full for
    /// `MQTT_FEED_ALERT_WAIT_MS`: nothing was published (the device unknown to the feed is
    /// no such case: there is nothing to publish it as).
    pub fn alert(&mut self, store: &Store, device_id: i64, a: &AlertInfo, state: Option<&str>) -> bool {
        let Some(d) = self.devices.get(&device_id) else { return true };
        let msg = alert_message(d, a, &self.tz);
        let m = FeedMessage { topic: topic(d, "alert"), payload: msg.to_string().into_bytes(), retain: false };
        let wait = std::time::Duration::from_millis(limits::MQTT_FEED_ALERT_WAIT_MS);
        if !self.queue_until(m, Some(std::time::Instant::now() + wait)) {
            return false;
        }
        // The state is published when it changes: a rule firing again (a battery still low
        // after `repeat_s`, the button pressed again) keeps the state and when it began.
        if let Some(state) = state.filter(|s| self.alerted.get(&device_id) != Some(s)) {
            let alarm = (state == STATE_ALARM).then_some(a.text);
            let msg = state_message(d, state, alarm, a.t_ms, &self.tz);
            self.send(topic(d, "state"), &msg, true);
            self.note(device_id, state);
            if let Err(e) = store.set_device_states(&[(device_id, state, a.t_ms)]) {
                log::warn!("mqtt: cannot store the device state: {e}");
            }
        }
        true
    }

    /// Keeps track of the devices whose state is an alert's.
    fn note(&mut self, device_id: i64, state: &str) {
        match [STATE_ALARM, STATE_LOW_BATTERY].into_iter().find(|s| *s == state) {
            Some(s) => self.alerted.insert(device_id, s),
            None => self.alerted.remove(&device_id),
        };
    }

    /// A device's battery is back above the battery rules (replaced or recharged): its
    /// `lowbattery` state gives way to where it is, online or offline.
    pub fn battery_ok(&mut self, store: &Store, device_id: i64) {
        if self.alerted.get(&device_id) == Some(&STATE_LOW_BATTERY) {
            self.give_way(store, device_id, STATE_LOW_BATTERY, crate::timefmt::now_ms());
        }
    }

    /// A device's alarms are all acknowledged: its `alarm` state gives way to where it is,
    /// online or offline (stored like every state). Another state (it went offline since,
    /// or a low battery came after) stays.
    pub fn alarm_acked(&mut self, store: &Store, device_id: i64, t_ms: i64) {
        self.give_way(store, device_id, STATE_ALARM, t_ms);
    }

    /// A device's state `was` (an alert's) ends, if it is still the device's: online or
    /// offline instead, as it stands.
    fn give_way(&mut self, store: &Store, device_id: i64, was: &str, t_ms: i64) {
        if self.alerted.get(&device_id) != Some(&was) {
            return;
        }
        let Some(d) = self.devices.get(&device_id) else { return };
        let state = if self.online.contains(&device_id) { STATE_ONLINE } else { STATE_OFFLINE };
        let msg = state_message(d, state, None, t_ms, &self.tz);
        self.send(topic(d, "state"), &msg, true);
        self.note(device_id, state);
        if let Err(e) = store.set_device_states(&[(device_id, state, t_ms)]) {
            log::warn!("mqtt: cannot store the device state: {e}");
        }
    }

    fn send(&self, topic: String, msg: &Value, retain: bool) {
        self.queue(FeedMessage { topic, payload: msg.to_string().into_bytes(), retain });
    }

    /// Room in the queue now, in messages.
    pub fn room(&self) -> usize {
        self.tx.capacity()
    }

    /// Queues a message for the broker; a full queue drops it (counted), or while the feed is
    /// patient waits for room.
    fn queue(&self, m: FeedMessage) {
        self.queue_until(m, self.patient_until);
    }

    /// Queues a message, waiting for room in a full queue until `until` (if any); false when
    /// it was dropped (counted).
    fn queue_until(&self, mut m: FeedMessage, until: Option<std::time::Instant>) -> bool {
        loop {
            match self.tx.try_send(m) {
                Ok(()) => return true,
                Err(tokio::sync::mpsc::error::TrySendError::Full(back))
                    if until.is_some_and(|until| std::time::Instant::now() < until) =>
                {
                    m = back;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(_) => {
                    self.stats.feed_dropped.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::beacon::{BeaconId, Mac};
    use crate::location::devices::Device;

    /// Device `n`: address 1/1/n, deviceid 1.1.n, heard by its MAC.
    fn device(n: u8) -> Device {
        Device {
            deviceaddress: format!("1/1/{n}"),
            deviceid: format!("1.1.{n}"),
            label: String::new(),
            tagtype: None,
            beacon: BeaconId::Mac(Mac([0, 0, 0, 0, 0, n])),
            contactid: None,
        }
    }

    /// A device the start keeps in its zone whose stored state is `offline` (the last run
    /// stopped between the write that placed it and the one that stored its state) is
    /// published and stored online: it enters no zone, so nothing else would.
    #[test]
    fn a_device_kept_in_its_zone_with_its_state_stored_offline_comes_online() {
        let (dir, store) = crate::store::testing::store_with_org("feed-kept", "o");
        let kept = store.create_device("o", &device(1)).unwrap().id;
        let away = store.create_device("o", &device(2)).unwrap().id;
        store.set_device_states(&[(kept, STATE_OFFLINE, 1_000), (away, STATE_OFFLINE, 1_000)]).unwrap();

        let (tx, mut rx) = tokio::sync::mpsc::channel(100);
        let mut feed = Feed::new(tx, jiff::tz::TimeZone::UTC, Arc::new(BrokerStats::default()));
        feed.set_devices(&store, &store.devices(None).unwrap());
        feed.restore(&store, 5_000, 30_000);
        feed.resume(&store, 5_000, 30_000, &HashSet::from([kept]));

        let mut last = HashMap::new();
        while let Ok(m) = rx.try_recv() {
            let v: Value = serde_json::from_slice(&m.payload).unwrap();
            assert!(m.retain, "{} {v}", m.topic);
            last.insert(m.topic, v["data"]["state"].as_str().unwrap_or_default().to_string());
        }
        assert_eq!(last.get("o/1.1.1/state").map(String::as_str), Some(STATE_ONLINE), "{last:?}");
        assert_eq!(last.get("o/1.1.2/state").map(String::as_str), Some(STATE_OFFLINE), "{last:?}");
        let stored: Vec<(i64, String)> = store.device_states().unwrap().into_iter().map(|(id, s, _)| (id, s)).collect();
        assert_eq!(stored, vec![(kept, STATE_ONLINE.to_string()), (away, STATE_OFFLINE.to_string())]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An alarm acknowledged just before a stop, its `alarm` state stored still: the start
    /// publishes the device online, and one with its alarm open as the alarm.
    #[test]
    fn a_start_gives_an_acknowledged_alarms_state_way() {
        let (dir, store) = crate::store::testing::store_with_org("feed-acked", "o");
        let (acked, open) =
            (store.create_device("o", &device(1)).unwrap().id, store.create_device("o", &device(2)).unwrap().id);
        let alarm = |device_id| crate::store::NewAlert {
            org: "o",
            rule: "panic",
            kind: "Alarm",
            device_id,
            contact_id: None,
            text: "Alarm button pressed",
            value: "1",
            units: "",
            channel: "alarm",
            t_ms: 1_000,
            published: true,
        };
        let (id, _) = store.create_alert(&alarm(acked), None).unwrap();
        store.create_alert(&alarm(open), None).unwrap();
        store.ack_alert("o", id, 1, 2_000).unwrap();
        store.set_device_states(&[(acked, STATE_ALARM, 1_000), (open, STATE_ALARM, 1_000)]).unwrap();

        let (tx, mut rx) = tokio::sync::mpsc::channel(100);
        let mut feed = Feed::new(tx, jiff::tz::TimeZone::UTC, Arc::new(BrokerStats::default()));
        feed.set_devices(&store, &store.devices(None).unwrap());
        feed.restore(&store, 5_000, 30_000);
        let mut last = HashMap::new();
        while let Ok(m) = rx.try_recv() {
            let v: Value = serde_json::from_slice(&m.payload).unwrap();
            last.insert(m.topic, (v["data"]["state"].clone(), v["data"]["alarmEvent"]["value"].clone()));
        }
        assert_eq!(last["o/1.1.1/state"], (json!(STATE_ONLINE), json!("none")), "{last:?}");
        assert_eq!(last["o/1.1.2/state"], (json!(STATE_ALARM), json!("Alarm button pressed")), "{last:?}");
        let stored: Vec<(i64, String)> = store.device_states().unwrap().into_iter().map(|(id, s, _)| (id, s)).collect();
        assert_eq!(stored, vec![(acked, STATE_ONLINE.to_string()), (open, STATE_ALARM.to_string())]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A tag's first adverts carry its battery: the data message of that moment says it (the
    /// engine's events come before the battery reports of their batch).
    #[test]
    fn a_data_message_carries_the_battery_reported_with_it() {
        let (dir, store) = crate::store::testing::store_with_org("feed-battery", "o");
        let id = store.create_device("o", &device(1)).unwrap().id;
        let (tx, mut rx) = tokio::sync::mpsc::channel(100);
        let mut feed = Feed::new(tx, jiff::tz::TimeZone::UTC, Arc::new(BrokerStats::default()));
        feed.set_devices(&store, &store.devices(None).unwrap());
        let update = |t_ms| LocationEvent::Update {
            device_id: id,
            t_ms,
            zone_id: 21,
            lat: 42.5,
            lon: -90.7,
            receiver: "rx-a".into(),
            rssi: -60.0,
        };
        let events = [
            LocationEvent::Enter { device_id: id, t_ms: 1_000, zone_id: 21 },
            update(1_000),
            LocationEvent::Battery { device_id: id, t_ms: 1_000, mv: Some(2_500) },
        ];
        feed.batch(&store, &Site::default(), &events, 1_000);
        // A later report without a reading leaves the last one.
        feed.batch(
            &store,
            &Site::default(),
            &[update(2_000), LocationEvent::Battery { device_id: id, t_ms: 2_000, mv: None }],
            2_000,
        );
        let mut volts = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if m.topic == "o/1.1.1/data" {
                let v: Value = serde_json::from_slice(&m.payload).unwrap();
                volts.push(v["data"]["batteryVoltage"]["value"].clone());
            }
        }
        assert_eq!(volts, [json!("2.50"), json!("2.50")]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
