//! Alerts: rules (`rules`) evaluated by the location thread on what the engine reports, and
//! what a fired rule does (for an alarm flag, as its advert arrives; for the rest, after each
//! batch the engine writes). Monitor: recorded. Warn: recorded and published on
//! `{org}/{deviceId}/alert` (with a short WAV tone for intercoms). Alarm: as Warn, and a
//! ticket is created for the contact. `GET /alerts` lists them, `POST /alerts/{id}/ack`
//! acknowledges one. An alarm (a rule on a panic button's flag) stays open until then: the
//! location thread looks for acknowledgements once a second while one is open, then gives the
//! device's feed state back and lets the next press through at once.

pub mod audio;
pub mod rules;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rules::{AlertType, CHANNEL_ALARM, Condition, DeviceFacts, Evaluator, Fired, Rule};

use crate::location::beacon::Advert;
use crate::location::site::Site;
use crate::mqtt::feed::{AlertInfo, Feed};
use crate::store::{LocationEvent, NewAlert, Store, StoredDevice};

struct Known {
    org: String,
    tagtype: Option<i64>,
    contact_id: Option<i64>,
    contact_name: Option<String>,
    last_seen_ms: Option<i64>,
    /// The zone the engine has it in (from its enter and exit decisions; at start, the zone
    /// of its last location update).
    zone: Option<i64>,
    /// After a restart or a site reload the engine places everyone again: a device placed
    /// back in this zone before this time (Unix ms) has not entered it, it never left.
    resumed: Option<(i64, i64)>,
}

/// An alert raised and published that the database did not take: recorded later, as it was.
struct Unrecorded {
    org: String,
    rule: String,
    kind: AlertType,
    device_id: i64,
    contact_id: Option<i64>,
    text: String,
    value: String,
    units: String,
    channel: &'static str,
    t_ms: i64,
    ticket_title: Option<String>,
    /// Published already, or never to be.
    published: bool,
}

impl Unrecorded {
    fn record(&self, store: &Store) -> crate::store::Result<i64> {
        let new = NewAlert {
            org: &self.org,
            rule: &self.rule,
            kind: self.kind.as_str(),
            device_id: self.device_id,
            contact_id: self.contact_id,
            text: &self.text,
            value: &self.value,
            units: &self.units,
            channel: self.channel,
            t_ms: self.t_ms,
            published: self.published,
        };
        store.create_alert(&new, self.ticket_title.as_deref()).map(|(id, _)| id)
    }
}

/// The alerts side of the location thread.
pub struct Alerts {
    eval: Evaluator,
    devices: HashMap<i64, Known>,
    /// Oldest first, up to `ALERT_UNRECORDED_MAX`.
    unrecorded: Vec<Unrecorded>,
    /// Devices with an alarm nobody has acknowledged (as the database said at the last look,
    /// and those raised since).
    open_alarms: HashSet<i64>,
    /// When each device's alarm flag was last seen raised, while it is (a lowered flag
    /// removes it).
    flag_ms: HashMap<i64, i64>,
    /// When each device's latest press began: its flag raised after it was seen lowered, or
    /// after `ALERT_ALARM_RELEASE_MS` without a raised flag. Kept after the release.
    press_began: HashMap<i64, i64>,
    /// Devices whose alarm was acknowledged while their flag was still raised, and when that
    /// press began: it raises nothing more; a press that began later raises an alarm.
    held: HashMap<i64, i64>,
    /// When each device's newest frame with the flag's byte (raised or lowered) arrived. An
    /// older frame that comes after it says nothing of the button: with the advert queue full,
    /// frames with a raised flag go ahead of those waiting (and remote receivers deliver late).
    button_ms: HashMap<i64, i64>,
    /// An alert found the feed's queue full: it and those after it are recorded unpublished,
    /// and published in order from the database when there is room ([`Alerts::publish_unpublished`]).
    feed_behind: bool,
    /// When this run began to listen (its first [`Alerts::resume`]): a device last heard
    /// before it counts as unheard only from then on.
    listening_since_ms: Option<i64>,
    /// Devices whose battery reports are back above the battery rules, since the last
    /// [`Alerts::act`].
    recovered: Vec<i64>,
}

impl Alerts {
    pub fn new(rules: Arc<Vec<Rule>>) -> Alerts {
        Alerts {
            eval: Evaluator::new(rules.as_ref().clone()),
            devices: HashMap::new(),
            unrecorded: Vec::new(),
            open_alarms: HashSet::new(),
            flag_ms: HashMap::new(),
            press_began: HashMap::new(),
            held: HashMap::new(),
            button_ms: HashMap::new(),
            feed_behind: false,
            listening_since_ms: None,
            recovered: Vec::new(),
        }
    }

    pub fn set_rules(&mut self, rules: &[Rule]) {
        if self.eval.rules != rules {
            let mut eval = Evaluator::new(rules.to_vec());
            // A rule kept across the reload keeps its repeat windows and absences.
            for (rule, device, t_ms) in self.eval.fired() {
                eval.remember(rule, device, t_ms);
            }
            self.eval = eval;
        }
    }

    /// At start: when each rule last fired for each device, from the recorded alerts, so that
    /// a restart raises no alert again within its `repeat_s` or for the same absence.
    pub fn restore(&mut self, store: &Store) {
        match store.alerts_last_fired(crate::limits::ALERT_STATE_ENTRIES_MAX) {
            Ok(rows) => {
                for (rule, device, t_ms) in rows {
                    self.eval.remember(&rule, device, t_ms);
                }
            }
            Err(e) => log::warn!("alerts: cannot read when rules last fired: {e}"),
        }
        // An alarm acknowledged before the stop holds back no press after the start.
        match store.open_alarm_devices() {
            Ok(open) => {
                let alarmed: HashSet<i64> = self
                    .eval
                    .fired()
                    .filter(|(rule, _, _)| {
                        self.eval.rules.iter().any(|r| r.id == *rule && r.condition == Condition::AlarmEvent)
                    })
                    .map(|(_, device, _)| device)
                    .collect();
                for device in alarmed.difference(&open) {
                    self.eval.forget_alarms(*device);
                }
                self.open_alarms = open;
            }
            Err(e) => log::warn!("alerts: cannot read the open alarms: {e}"),
        }
    }

    /// Looks for acknowledged alarms (while any is open): the device's alarm state on the feed
    /// goes back to online (offline if it is not placed), and its next press raises an alarm
    /// however soon it comes: one that began after the acknowledgement, before this look, is
    /// raised now (`out`).
    pub fn acks(&mut self, store: &Store, mut feed: Option<&mut Feed>, now_ms: i64, out: &mut Vec<Fired>) {
        if self.open_alarms.is_empty() {
            return;
        }
        let open = match store.open_alarm_devices() {
            Ok(open) => open,
            Err(e) => {
                if !e.logged_once() {
                    log::warn!("alerts: cannot look for acknowledged alarms: {e}");
                }
                return;
            }
        };
        // An alarm waiting to be recorded is open too.
        let waiting: HashSet<i64> =
            self.unrecorded.iter().filter(|u| u.channel == CHANNEL_ALARM).map(|u| u.device_id).collect();
        let acked: Vec<i64> =
            self.open_alarms.iter().filter(|d| !open.contains(d) && !waiting.contains(d)).copied().collect();
        self.open_alarms = open;
        self.open_alarms.extend(waiting);
        for device in acked {
            self.eval.forget_alarms(device);
            log::info!("alerts: the alarms of device {device} are acknowledged");
            if let Some(feed) = feed.as_deref_mut() {
                feed.alarm_acked(store, device, now_ms);
            }
            let Some(&began) = self.press_began.get(&device) else { continue };
            // Looked for once a flush: a press may have begun between the acknowledgement and
            // this look (the repeat window of the alarm acknowledged held it back).
            let acked_ms = store.alarm_acked_ms(device).ok().flatten().unwrap_or(now_ms);
            if began > acked_ms {
                if let Some(f) = self.facts(device) {
                    self.eval.alarm_event(f, began, out);
                }
                continue;
            }
            // Still pressed (raised in an advert within the release time): that press is
            // the one acknowledged.
            let pressed = self
                .flag_ms
                .get(&device)
                .is_some_and(|t| now_ms.saturating_sub(*t) < crate::limits::ALERT_ALARM_RELEASE_MS);
            if pressed {
                self.held.insert(device, began);
            }
        }
    }

    pub fn set_devices(&mut self, devices: &[StoredDevice]) {
        let old = std::mem::take(&mut self.devices);
        self.devices = devices
            .iter()
            .map(|d| {
                let before = old.get(&d.id);
                // What this thread heard is the newest (and moved with any clock step); the
                // stored time is for devices it has not heard since it started.
                let seen = before.and_then(|k| k.last_seen_ms).or(d.status.last_seen_ms);
                (
                    d.id,
                    Known {
                        org: d.org.clone(),
                        tagtype: d.device.tagtype,
                        contact_id: d.device.contactid,
                        contact_name: d.contact_name.clone(),
                        last_seen_ms: seen,
                        zone: before.map_or(d.status.position_zone_id, |k| k.zone),
                        resumed: before.and_then(|k| k.resumed),
                    },
                )
            })
            .collect();
        self.flag_ms.retain(|id, _| self.devices.contains_key(id));
        self.press_began.retain(|id, _| self.devices.contains_key(id));
        self.held.retain(|id, _| self.devices.contains_key(id));
        self.button_ms.retain(|id, _| self.devices.contains_key(id));
    }

    /// At start and after a site reload, when the engine starts over: a device heard within
    /// the away timeout and placed back in its zone within the away timeout from now raises
    /// no `enter` alert (it did not come in; the engine only placed it again).
    /// Devices `kept` in their zones (carried across a reload, no `enter` coming) stay as they are.
    pub fn resume(&mut self, now_ms: i64, away_timeout_ms: i64, kept: &std::collections::HashSet<i64>) {
        self.listening_since_ms.get_or_insert(now_ms);
        for (id, k) in self.devices.iter_mut() {
            if kept.contains(id) {
                continue;
            }
            let present = k.last_seen_ms.is_some_and(|s| now_ms.saturating_sub(s) <= away_timeout_ms);
            k.resumed = k.zone.take().filter(|_| present).map(|z| (z, now_ms.saturating_add(away_timeout_ms)));
        }
    }

    /// The wall clock was stepped by `by_ms` (see [`crate::location::engine::Engine::shift`]):
    /// repeat windows, absences and the devices' last times move with it.
    pub fn shift(&mut self, by_ms: i64) {
        self.eval.shift(by_ms);
        if let Some(t) = &mut self.listening_since_ms {
            *t = t.saturating_add(by_ms);
        }
        for k in self.devices.values_mut() {
            if let Some(t) = &mut k.last_seen_ms {
                *t = t.saturating_add(by_ms);
            }
            if let Some((_, until)) = &mut k.resumed {
                *until = until.saturating_add(by_ms);
            }
        }
        for t in self
            .flag_ms
            .values_mut()
            .chain(self.press_began.values_mut())
            .chain(self.held.values_mut())
            .chain(self.button_ms.values_mut())
        {
            *t = t.saturating_add(by_ms);
        }
    }

    fn facts(&self, device_id: i64) -> Option<DeviceFacts> {
        self.devices.get(&device_id).map(|k| DeviceFacts { device_id, tagtype: k.tagtype })
    }

    /// An advert of a known device: its tag type's alarm flag, if raised, fires alarm rules.
    pub fn advert(&mut self, site: &Site, device_id: i64, a: &Advert, out: &mut Vec<Fired>) {
        if !self.eval.rules.iter().any(|r| r.condition == Condition::AlarmEvent) {
            return;
        }
        let Some(f) = self.facts(device_id) else { return };
        let Some(flag) = f.tagtype.and_then(|t| site.tag_type(t)).and_then(|t| t.alarm) else { return };
        let raised = flag.raised(a);
        if raised.is_some() {
            match self.button_ms.get_mut(&device_id) {
                Some(newest) if a.t_ms < *newest => return,
                Some(newest) => *newest = a.t_ms,
                None => {
                    self.button_ms.insert(device_id, a.t_ms);
                }
            }
        }
        match raised {
            Some(true) => {}
            Some(false) => {
                self.flag_ms.remove(&device_id);
                self.held.remove(&device_id);
                return;
            }
            // A frame without the flag (a tag's other frames) says nothing of the button: a
            // press held down goes on.
            None => return,
        }
        let last = self.flag_ms.insert(device_id, a.t_ms);
        let goes_on = last.is_some_and(|t| (0..crate::limits::ALERT_ALARM_RELEASE_MS).contains(&(a.t_ms - t)));
        let began = match self.press_began.get(&device_id) {
            Some(&began) if goes_on => began,
            _ => {
                self.press_began.insert(device_id, a.t_ms);
                a.t_ms
            }
        };
        // The acknowledged press, still held down (or its adverts still coming).
        if self.held.get(&device_id) == Some(&began) {
            return;
        }
        self.held.remove(&device_id);
        self.eval.alarm_event(f, a.t_ms, out);
    }

    /// What a written batch means for the rules, and who has not been heard for too long.
    pub fn batch(&mut self, events: &[LocationEvent], now_ms: i64, out: &mut Vec<Fired>) {
        for e in events {
            match e {
                LocationEvent::Enter { device_id, t_ms, zone_id } => {
                    let Some(k) = self.devices.get_mut(device_id) else { continue };
                    let placed_again = k.resumed.take().is_some_and(|(z, until)| z == *zone_id && *t_ms <= until);
                    k.zone = Some(*zone_id);
                    if !placed_again && let Some(f) = self.facts(*device_id) {
                        self.eval.entered(f, *zone_id, *t_ms, out);
                    }
                }
                LocationEvent::Exit { device_id, zone_id, .. } => {
                    if let Some(k) = self.devices.get_mut(device_id) {
                        k.resumed = None;
                        if k.zone == Some(*zone_id) {
                            k.zone = None;
                        }
                    }
                }
                LocationEvent::Battery { device_id, t_ms, mv: Some(mv) } => {
                    if let Some(f) = self.facts(*device_id) {
                        self.eval.battery(f, i64::from(*mv), *t_ms, out);
                        if self.eval.battery_ok(f, i64::from(*mv)) {
                            self.recovered.push(*device_id);
                        }
                    }
                }
                LocationEvent::Seen { device_id, t_ms } => {
                    if let Some(k) = self.devices.get_mut(device_id) {
                        k.last_seen_ms = k.last_seen_ms.max(Some(*t_ms));
                    }
                }
                _ => {}
            }
        }
        // A last time ahead of now was stored before the clock was set back (and a restart):
        // from now on it counts as now, so that absences are measured and newer times win.
        for k in self.devices.values_mut() {
            if k.last_seen_ms.is_some_and(|s| s > now_ms) {
                k.last_seen_ms = Some(now_ms);
            }
        }
        if self.eval.rules.iter().any(|r| matches!(r.condition, Condition::NotSeen { .. })) {
            let watched = (self.listening_since_ms.unwrap_or(i64::MIN), now_ms);
            for (id, k) in &self.devices {
                self.eval.unseen(DeviceFacts { device_id: *id, tagtype: k.tagtype }, k.last_seen_ms, watched, out);
            }
        }
    }

    /// Records the alerts the database refused before, oldest first, as far as it takes them.
    fn record_unrecorded(&mut self, store: &Store) {
        let mut recorded = 0;
        for alert in &self.unrecorded {
            match alert.record(store) {
                Ok(id) => {
                    log::info!(
                        "alert {id}: {} {} (device {}), recorded late",
                        alert.kind.as_str(),
                        alert.text,
                        alert.device_id
                    );
                    recorded += 1;
                }
                Err(_) => break,
            }
        }
        self.unrecorded.drain(..recorded);
    }

    /// Records what fired, creates the tickets of alarms, and publishes Warn and Alarm on
    /// the feed (with the device's state for alarm buttons and low batteries).
    pub fn act(&mut self, store: &Store, mut feed: Option<&mut Feed>, fired: &mut Vec<Fired>) {
        self.record_unrecorded(store);
        for device in self.recovered.drain(..) {
            if let Some(feed) = feed.as_deref_mut() {
                feed.battery_ok(store, device);
            }
        }
        for f in fired.drain(..) {
            let rule = &self.eval.rules[f.rule];
            let Some(k) = self.devices.get(&f.device_id) else { continue };
            let to_publish = rule.kind != AlertType::Monitor && feed.is_some();
            let alert = Unrecorded {
                org: k.org.clone(),
                rule: rule.id.clone(),
                kind: rule.kind,
                device_id: f.device_id,
                contact_id: k.contact_id,
                text: rule.text.clone(),
                value: f.value.clone(),
                units: f.units.clone(),
                channel: rule.condition.channel(),
                t_ms: f.t_ms,
                ticket_title: (rule.kind == AlertType::Alarm).then(|| match &k.contact_name {
                    Some(name) => format!("Alarm: {} ({name})", rule.text),
                    None => format!("Alarm: {}", rule.text),
                }),
                published: !to_publish,
            };
            // Later alerts wait behind earlier ones that the database refused.
            let mut recorded = None;
            match self.unrecorded.is_empty().then(|| alert.record(store)) {
                Some(Ok(id)) => {
                    log::info!("alert {id}: {} {} (device {})", rule.kind.as_str(), rule.text, f.device_id);
                    recorded = Some(id);
                }
                Some(Err(e)) if self.unrecorded.len() < crate::limits::ALERT_UNRECORDED_MAX => {
                    log::warn!(
                        "alerts: cannot record {} for device {} yet (kept to record later): {e}",
                        rule.id,
                        f.device_id
                    );
                    self.unrecorded.push(alert);
                }
                None if self.unrecorded.len() < crate::limits::ALERT_UNRECORDED_MAX => self.unrecorded.push(alert),
                Some(Err(e)) => log::error!("alerts: cannot record {} for device {}: {e}", rule.id, f.device_id),
                None => log::error!(
                    "alerts: cannot record {} for device {}: {} alerts wait for the database",
                    rule.id,
                    f.device_id,
                    self.unrecorded.len()
                ),
            }
            if rule.condition == Condition::AlarmEvent {
                self.open_alarms.insert(f.device_id);
            }
            if !to_publish {
                continue;
            }
            if let Some(feed) = feed.as_deref_mut() {
                let info = AlertInfo {
                    id: recorded,
                    kind: rule.kind,
                    channel: "",
                    text: &rule.text,
                    value: &f.value,
                    units: &f.units,
                    t_ms: f.t_ms,
                };
                // Behind an alert the queue had no room for, it waits its turn (in the
                // database; one waiting to be recorded is published when it is recorded, at
                // the next start).
                if self.feed_behind || !publish(feed, store, f.device_id, info, Some(&rule.condition)) {
                    if !self.feed_behind {
                        log::error!(
                            "alerts: the MQTT feed's queue stayed full for {} ms: {} for device {} and the alerts after it are published when there is room",
                            crate::limits::MQTT_FEED_ALERT_WAIT_MS,
                            rule.id,
                            f.device_id
                        );
                    }
                    self.feed_behind = true;
                    continue;
                }
                // Recorded: marked, so that the next start does not publish it again. Waiting
                // to be recorded: it will be recorded as published.
                match recorded {
                    Some(id) => {
                        if let Err(e) = store.alert_published(id) {
                            log::warn!(
                                "alerts: cannot note alert {id} as published (the next start publishes it again): {e}"
                            );
                        }
                    }
                    None => {
                        if let Some(last) = self.unrecorded.last_mut() {
                            last.published = true;
                        }
                    }
                }
            }
        }
    }

    /// Whether alerts wait for room in the feed's queue.
    pub fn feed_behind(&self) -> bool {
        self.feed_behind
    }

    /// Publishes the alerts recorded and not published, at most `ALERT_REPUBLISH_WINDOW_MS`
    /// old, as they were: at start, those of a stop between the two (a kill), and those the
    /// feed's queue had no room for, when it has.
    pub fn publish_unpublished(&mut self, store: &Store, feed: &mut Feed, now_ms: i64) {
        let since = now_ms.saturating_sub(crate::limits::ALERT_REPUBLISH_WINDOW_MS);
        let alerts = match store.unpublished_alerts(since, crate::limits::ALERT_REPUBLISH_MAX) {
            Ok(alerts) => alerts,
            Err(e) => {
                log::warn!("alerts: cannot read the alerts not published yet: {e}");
                return;
            }
        };
        self.feed_behind = false;
        for a in alerts {
            let info = AlertInfo {
                id: Some(a.id),
                kind: AlertType::parse(&a.kind).unwrap_or(AlertType::Warn),
                channel: "",
                text: &a.text,
                value: &a.value,
                units: &a.units,
                t_ms: a.t_ms,
            };
            // As its rule would publish it; a rule gone since publishes it with no channel
            // and no state.
            let condition = self.eval.rules.iter().find(|r| r.id == a.rule).map(|r| &r.condition);
            if !publish(feed, store, a.device_id, info, condition) {
                self.feed_behind = true;
                return;
            }
            log::info!("alert {}: {} {} (device {}), published late", a.id, a.kind, a.text, a.device_id);
            if let Err(e) = store.alert_published(a.id) {
                log::warn!("alerts: cannot note alert {} as published: {e}", a.id);
            }
        }
    }
}

/// Publishes an alert on the feed, its channel that of the rule's condition, with the
/// device's state for alarm buttons and low batteries. False when the feed's queue had no
/// room for it.
fn publish(feed: &mut Feed, store: &Store, device_id: i64, info: AlertInfo<'_>, condition: Option<&Condition>) -> bool {
    let state = match condition {
        Some(Condition::BatteryBelow { .. }) => Some(crate::mqtt::feed::STATE_LOW_BATTERY),
        Some(Condition::AlarmEvent) => Some(crate::mqtt::feed::STATE_ALARM),
        _ => None,
    };
    let channel = condition.map_or("", Condition::channel);
    feed.alert(store, device_id, &AlertInfo { channel, ..info }, state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::beacon::{BeaconId, Mac};
    use crate::location::devices::Device;
    use crate::location::site::{AlarmFlag, TagType};

    /// Ann's badge, of tag type 1 (whose flag is the panic button).
    fn badge() -> Device {
        Device {
            deviceaddress: "5/1/22".into(),
            deviceid: "5.1.22".into(),
            label: "Ann".into(),
            tagtype: Some(1),
            beacon: BeaconId::Mac(Mac([1; 6])),
            contactid: None,
        }
    }

    fn badge_with_button() -> (Alerts, Site) {
        let rule = Rule {
            id: "panic".into(),
            kind: AlertType::Alarm,
            condition: Condition::AlarmEvent,
            tag_types: vec![],
            text: "Panic button".into(),
            repeat_ms: 300_000,
        };
        let mut alerts = Alerts::new(Arc::new(vec![rule]));
        alerts.set_devices(&[StoredDevice {
            id: 1,
            org: "acme".into(),
            device: badge(),
            contact_name: None,
            created: 0,
            updated: 0,
            status: Default::default(),
        }]);
        let mut site = Site::default();
        site.tag_types.push(TagType { id: 1, title: "Staff".into(), alarm: AlarmFlag::parse("mfg:0059:0:01") });
        (alerts, site)
    }

    fn frame(t_ms: i64, raised: bool) -> Advert {
        Advert {
            t_ms,
            receiver: Arc::from("hci0"),
            mac: Mac([1; 6]),
            rssi: -60,
            mfg: vec![(0x0059, vec![u8::from(raised)])],
            svc: Vec::new(),
        }
    }

    /// With the advert queue full, a raised flag goes ahead of the frames waiting: the older
    /// frames that follow it (raised or lowered) neither end the press nor begin another one.
    #[test]
    fn frames_older_than_the_newest_say_nothing_of_the_button() {
        let (mut alerts, site) = badge_with_button();
        let mut fired = Vec::new();
        alerts.advert(&site, 1, &frame(10_000, true), &mut fired);
        assert_eq!(fired.iter().map(|f| f.t_ms).collect::<Vec<_>>(), [10_000]);
        fired.clear();
        for t in [9_000, 9_500] {
            alerts.advert(&site, 1, &frame(t, false), &mut fired);
        }
        alerts.advert(&site, 1, &frame(9_800, true), &mut fired);
        assert!(
            fired.is_empty(),
            "an older frame raised a second alarm: {:?}",
            fired.iter().map(|f| f.t_ms).collect::<Vec<_>>()
        );
        alerts.advert(&site, 1, &frame(10_100, true), &mut fired);
        assert!(fired.is_empty(), "the press held down raised a second alarm");
        assert_eq!(alerts.press_began.get(&1), Some(&10_000));
    }

    /// An alarm whose message finds the feed's queue full (the broker behind) is recorded
    /// unpublished, and so is the alert after it; both go out, in order, once the queue has
    /// room. They were dropped from the queue and noted as published.
    #[test]
    fn alerts_the_full_feed_had_no_room_for_go_out_when_it_has() {
        let (dir, store) = crate::store::testing::store_with_org("alerts-feed-full", "acme");
        let (mut alerts, _) = badge_with_button();
        let id = store.create_device("acme", &badge()).unwrap().id;
        let devices = store.devices(None).unwrap();
        alerts.set_devices(&devices);
        let stats = Arc::new(crate::mqtt::broker::BrokerStats::default());
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let mut feed = Feed::new(tx, jiff::tz::TimeZone::UTC, Arc::clone(&stats));
        feed.set_devices(&store, &devices);
        feed.restore(&store, 0, 30_000);
        while rx.try_recv().is_ok() {}
        // The broker takes nothing: the queue fills.
        let other =
            AlertInfo { id: None, kind: AlertType::Warn, channel: "", text: "x", value: "", units: "", t_ms: 1 };
        while feed.room() > 0 {
            assert!(feed.alert(&store, id, &other, None));
        }

        let now = crate::timefmt::now_ms();
        for t_ms in [now, now + 1] {
            let mut fired = vec![Fired { rule: 0, device_id: id, t_ms, value: "1".into(), units: String::new() }];
            alerts.act(&store, Some(&mut feed), &mut fired);
            assert!(alerts.feed_behind());
        }
        assert_eq!(store.unpublished_alerts(0, 10).unwrap().len(), 2, "the alerts were noted as published");

        while rx.try_recv().is_ok() {}
        alerts.publish_unpublished(&store, &mut feed, now);
        assert!(!alerts.feed_behind());
        let mut got = Vec::new();
        while let Ok(m) = rx.try_recv() {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            got.push((m.topic, v["alertId"].as_i64().or_else(|| v["data"]["state"].as_str().map(|_| 0))));
        }
        let ids: Vec<i64> = store.unpublished_alerts(0, 10).unwrap().iter().map(|a| a.id).collect();
        assert!(ids.is_empty(), "still unpublished: {ids:?}");
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].0, "acme/5.1.22/alert");
        assert_eq!(got[1].0, "acme/5.1.22/state");
        assert!(got[0].1.is_some_and(|a| got[2].1.is_some_and(|b| a < b)), "out of order: {got:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
