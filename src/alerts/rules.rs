//! Alert rules (`[[alert_rules]]` in config.toml) and the evaluator that decides, from what
//! the location engine reports, when a rule fires for a device. Pure: no IO, no clock.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, bounded};
use crate::limits;

/// The interface's alert types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertType {
    /// Recorded only.
    Monitor,
    /// Recorded, published on the alert topic, delivered to webhooks.
    Warn,
    /// As Warn, and a ticket is created for the contact.
    Alarm,
}

impl AlertType {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertType::Monitor => "Monitor",
            AlertType::Warn => "Warn",
            AlertType::Alarm => "Alarm",
        }
    }

    pub fn parse(s: &str) -> Option<AlertType> {
        match s.to_ascii_lowercase().as_str() {
            "monitor" => Some(AlertType::Monitor),
            "warn" => Some(AlertType::Warn),
            "alarm" => Some(AlertType::Alarm),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    /// The device enters one of these zones (ids of the site map).
    Enter(Vec<i64>),
    /// The device has not been heard for this long (it was heard before).
    NotSeen { ms: i64 },
    /// The tag reports a battery below this (millivolts).
    BatteryBelow { mv: i64 },
    /// The tag's advertisement carries its tag type's alarm flag (a panic button).
    AlarmEvent,
}

impl Condition {
    /// What the condition watches, as the alert message's `channel` says (the `when` of
    /// config.toml).
    pub fn channel(&self) -> &'static str {
        match self {
            Condition::Enter(_) => "enter",
            Condition::NotSeen { .. } => "not_seen",
            Condition::BatteryBelow { .. } => "battery_low",
            Condition::AlarmEvent => CHANNEL_ALARM,
        }
    }
}

/// The channel of alarm rules: their alerts stay open until acknowledged, and hold the
/// device's `alarm` state on the feed until then.
pub const CHANNEL_ALARM: &str = "alarm";

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub id: String,
    pub kind: AlertType,
    pub condition: Condition,
    /// Only devices of these tag types (empty: all).
    pub tag_types: Vec<i64>,
    pub text: String,
    /// A rule fires at most once per device in this many milliseconds.
    pub repeat_ms: i64,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlertRule {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub when: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tag_types: Vec<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minutes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub battery_v: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_s: Option<u64>,
}

pub fn resolve_rules(raw: &[RawAlertRule], site: &crate::location::site::Site) -> Result<Vec<Rule>, ConfigError> {
    let mut rules: Vec<Rule> = Vec::new();
    if raw.len() > limits::ALERT_RULES_MAX {
        return Err(ConfigError::new("alert_rules", format!("at most {} rules", limits::ALERT_RULES_MAX)));
    }
    for (i, r) in raw.iter().enumerate() {
        let key = |k: &str| format!("alert_rules[{i}].{k}");
        let id_ok = !r.id.is_empty()
            && r.id.len() <= 64
            && r.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !id_ok {
            return Err(ConfigError::new(key("id"), "must be 1..64 ASCII letters, digits, - or _"));
        }
        if rules.iter().any(|x| x.id == r.id) {
            return Err(ConfigError::new(key("id"), format!("{:?} is used twice", r.id)));
        }
        let kind =
            AlertType::parse(&r.kind).ok_or_else(|| ConfigError::new(key("type"), "must be monitor, warn or alarm"))?;
        // Keys of another kind of rule are refused, not dropped: a `not_seen` rule with
        // `zones` would otherwise watch the whole site.
        let applies: &[&str] = match r.when.as_str() {
            "enter" => &["zones"],
            "not_seen" => &["minutes"],
            "battery_low" => &["battery_v"],
            _ => &[],
        };
        for (name, given) in
            [("zones", !r.zones.is_empty()), ("minutes", r.minutes.is_some()), ("battery_v", r.battery_v.is_some())]
        {
            if given && !applies.contains(&name) {
                return Err(ConfigError::new(key(name), format!("is not a setting of a {:?} rule", r.when)));
            }
        }
        let condition = match r.when.as_str() {
            "enter" => {
                if r.zones.is_empty() {
                    return Err(ConfigError::new(key("zones"), "an enter rule names its zones"));
                }
                if let Some(z) = r.zones.iter().find(|z| site.zone(**z).is_none()) {
                    return Err(ConfigError::new(key("zones"), format!("{z} is not a zone of the site map")));
                }
                Condition::Enter(r.zones.clone())
            }
            "not_seen" => {
                if r.minutes.is_none() {
                    return Err(ConfigError::new(key("minutes"), "a not_seen rule needs minutes (1..=10080)"));
                }
                let minutes = bounded(&key("minutes"), r.minutes, 0, 1, 7 * 24 * 60)?;
                Condition::NotSeen { ms: i64::try_from(minutes * 60_000).unwrap_or(i64::MAX) }
            }
            "battery_low" => {
                let v = r
                    .battery_v
                    .ok_or_else(|| ConfigError::new(key("battery_v"), "a battery_low rule needs battery_v"))?;
                if !(0.5..=12.0).contains(&v) {
                    return Err(ConfigError::new(key("battery_v"), "must be 0.5..=12 volts"));
                }
                Condition::BatteryBelow { mv: (v * 1000.0).round() as i64 }
            }
            "alarm" => Condition::AlarmEvent,
            _ => return Err(ConfigError::new(key("when"), "must be enter, not_seen, battery_low or alarm")),
        };
        if let Some(t) = r.tag_types.iter().find(|t| site.tag_type(**t).is_none()) {
            return Err(ConfigError::new(key("tag_types"), format!("{t} is not a tag type of the site map")));
        }
        if matches!(condition, Condition::AlarmEvent)
            && let Some(t) = r.tag_types.iter().find(|t| site.tag_type(**t).is_some_and(|tt| tt.alarm.is_none()))
        {
            return Err(ConfigError::new(
                key("tag_types"),
                format!("tag type {t} has no alarm button (its `alarm` in [[tag_types]]): the rule could never fire"),
            ));
        }
        let text = match &r.text {
            Some(t) if !t.trim().is_empty() && t.len() <= 255 && !t.chars().any(char::is_control) => t.clone(),
            Some(_) => return Err(ConfigError::new(key("text"), "must be 1 to 255 bytes of text")),
            None => default_text(&condition, site),
        };
        let repeat_s = bounded(&key("repeat_s"), r.repeat_s, limits::ALERT_REPEAT_S_DEFAULT, 1, 86_400)?;
        rules.push(Rule {
            id: r.id.clone(),
            kind,
            condition,
            tag_types: r.tag_types.clone(),
            text,
            repeat_ms: i64::try_from(repeat_s * 1000).unwrap_or(i64::MAX),
        });
    }
    Ok(rules)
}

fn default_text(c: &Condition, site: &crate::location::site::Site) -> String {
    match c {
        Condition::Enter(zones) => {
            let names: Vec<&str> =
                zones.iter().filter_map(|z| site.zone(*z)).map(|z| site.zones[z].name.as_str()).collect();
            format!("Entered {}", names.join(", "))
        }
        Condition::NotSeen { ms: 60_000 } => "Not seen for 1 minute".to_string(),
        Condition::NotSeen { ms } => format!("Not seen for {} minutes", ms / 60_000),
        Condition::BatteryBelow { .. } => "Battery low".into(),
        Condition::AlarmEvent => "Alarm button pressed".into(),
    }
}

impl Rule {
    pub fn to_raw(&self) -> RawAlertRule {
        let (when, zones, minutes, battery_v) = match &self.condition {
            Condition::Enter(z) => ("enter", z.clone(), None, None),
            Condition::NotSeen { ms } => ("not_seen", Vec::new(), Some(u64::try_from(ms / 60_000).unwrap_or(0)), None),
            Condition::BatteryBelow { mv } => ("battery_low", Vec::new(), None, Some(*mv as f64 / 1000.0)),
            Condition::AlarmEvent => ("alarm", Vec::new(), None, None),
        };
        RawAlertRule {
            id: self.id.clone(),
            kind: self.kind.as_str().to_ascii_lowercase(),
            when: when.into(),
            zones,
            tag_types: self.tag_types.clone(),
            minutes,
            battery_v,
            text: Some(self.text.clone()),
            repeat_s: Some(u64::try_from(self.repeat_ms / 1000).unwrap_or(0)),
        }
    }
}

/// A rule that fired for a device.
#[derive(Clone, Debug, PartialEq)]
pub struct Fired {
    pub rule: usize,
    pub device_id: i64,
    pub t_ms: i64,
    /// What triggered it, with its unit: the zone id, minutes unseen, volts, or the flag.
    pub value: String,
    pub units: String,
}

/// What the evaluator knows of a device.
#[derive(Clone, Copy, Debug)]
pub struct DeviceFacts {
    pub device_id: i64,
    pub tagtype: Option<i64>,
}

/// Decides when rules fire; remembers when each (rule, device) last fired.
#[derive(Default)]
pub struct Evaluator {
    pub rules: Vec<Rule>,
    last: HashMap<(usize, i64), i64>,
}

impl Evaluator {
    pub fn new(rules: Vec<Rule>) -> Evaluator {
        Evaluator { rules, last: HashMap::new() }
    }

    /// Takes when a rule (by id) last fired for a device, as recorded before a restart or a
    /// reload: its repeat window and the absence it fired for go on from there.
    pub fn remember(&mut self, rule_id: &str, device_id: i64, t_ms: i64) {
        let Some(rule) = self.rules.iter().position(|r| r.id == rule_id) else { return };
        if self.last.len() >= limits::ALERT_STATE_ENTRIES_MAX {
            return;
        }
        let t = self.last.entry((rule, device_id)).or_insert(t_ms);
        *t = (*t).max(t_ms);
    }

    /// Moves every remembered time by `by_ms`: the wall clock was stepped by that much, and
    /// what fired before the step is as long ago as it was.
    pub fn shift(&mut self, by_ms: i64) {
        for t in self.last.values_mut() {
            *t = t.saturating_add(by_ms);
        }
    }

    /// Forgets when the alarm rules last fired for a device: its alarm was acknowledged, and
    /// a new press is news however soon it comes.
    pub fn forget_alarms(&mut self, device_id: i64) {
        let rules = &self.rules;
        self.last.retain(|&(rule, device), _| device != device_id || rules[rule].condition != Condition::AlarmEvent);
    }

    /// When each rule (by id) last fired for each device.
    pub fn fired(&self) -> impl Iterator<Item = (&str, i64, i64)> + '_ {
        self.last.iter().map(|(&(rule, device), &t)| (self.rules[rule].id.as_str(), device, t))
    }

    fn applies(rule: &Rule, d: DeviceFacts) -> bool {
        rule.tag_types.is_empty() || d.tagtype.is_some_and(|t| rule.tag_types.contains(&t))
    }

    fn fire(&mut self, rule: usize, d: DeviceFacts, t_ms: i64, value: String, units: &str, out: &mut Vec<Fired>) {
        let key = (rule, d.device_id);
        // Within the repeat window of the last time it fired. A last time ahead of this one
        // (the clock was set back since) is no window: an alarm is never held back by the
        // clock.
        if self.last.get(&key).is_some_and(|last| (0..self.rules[rule].repeat_ms).contains(&(t_ms - last))) {
            return;
        }
        if self.last.len() >= limits::ALERT_STATE_ENTRIES_MAX && !self.last.contains_key(&key) {
            // Forget the oldest half rather than grow without bound.
            let mut times: Vec<i64> = self.last.values().copied().collect();
            times.sort_unstable();
            let cut = times[times.len() / 2];
            self.last.retain(|_, t| *t > cut);
        }
        self.last.insert(key, t_ms);
        out.push(Fired { rule, device_id: d.device_id, t_ms, value, units: units.into() });
    }

    pub fn entered(&mut self, d: DeviceFacts, zone_id: i64, t_ms: i64, out: &mut Vec<Fired>) {
        for i in 0..self.rules.len() {
            if let Condition::Enter(zones) = &self.rules[i].condition
                && zones.contains(&zone_id)
                && Self::applies(&self.rules[i], d)
            {
                self.fire(i, d, t_ms, zone_id.to_string(), "zone", out);
            }
        }
    }

    pub fn battery(&mut self, d: DeviceFacts, mv: i64, t_ms: i64, out: &mut Vec<Fired>) {
        for i in 0..self.rules.len() {
            if let Condition::BatteryBelow { mv: below } = self.rules[i].condition
                && mv < below
                && Self::applies(&self.rules[i], d)
            {
                self.fire(i, d, t_ms, format!("{:.2}", mv as f64 / 1000.0), "V", out);
            }
        }
    }

    /// Whether a battery report is well above every battery rule for the device
    /// (`ALERT_BATTERY_RECOVERED_MARGIN_MV` over each threshold): a low battery was replaced
    /// or recharged.
    pub fn battery_ok(&self, d: DeviceFacts, mv: i64) -> bool {
        self.rules.iter().all(|r| match r.condition {
            Condition::BatteryBelow { mv: below } if Self::applies(r, d) => {
                mv >= below.saturating_add(limits::ALERT_BATTERY_RECOVERED_MARGIN_MV)
            }
            _ => true,
        })
    }

    pub fn alarm_event(&mut self, d: DeviceFacts, t_ms: i64, out: &mut Vec<Fired>) {
        for i in 0..self.rules.len() {
            if self.rules[i].condition == Condition::AlarmEvent && Self::applies(&self.rules[i], d) {
                self.fire(i, d, t_ms, "1".into(), "", out);
            }
        }
    }

    /// Devices not heard for long enough; `last_seen_ms` None: never heard (no alert). Only
    /// the time since `watched_from_ms` counts (when the service began to listen: a device
    /// last heard before a restart may have been there all along); the alert says how long
    /// since it was last heard.
    pub fn unseen(
        &mut self,
        d: DeviceFacts,
        last_seen_ms: Option<i64>,
        (watched_from_ms, now_ms): (i64, i64),
        out: &mut Vec<Fired>,
    ) {
        let Some(seen) = last_seen_ms else { return };
        for i in 0..self.rules.len() {
            if let Condition::NotSeen { ms } = self.rules[i].condition
                && now_ms - seen.max(watched_from_ms) >= ms
                && Self::applies(&self.rules[i], d)
            {
                // Once per absence: a new absence is one that began after the last alert (an
                // alert dated ahead of now, from before the clock was set back, says nothing).
                if self.last.get(&(i, d.device_id)).is_some_and(|t| (seen..=now_ms).contains(t)) {
                    continue;
                }
                self.fire(i, d, now_ms, ((now_ms - seen) / 60_000).to_string(), "min", out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(condition: Condition, tag_types: Vec<i64>) -> Rule {
        Rule { id: "r".into(), kind: AlertType::Warn, condition, tag_types, text: "t".into(), repeat_ms: 60_000 }
    }

    #[test]
    fn rules_fire_once_per_repeat_window_and_only_for_their_tag_types() {
        let mut e =
            Evaluator::new(vec![rule(Condition::Enter(vec![22]), vec![1]), rule(Condition::AlarmEvent, vec![])]);
        let staff = DeviceFacts { device_id: 1, tagtype: Some(1) };
        let visitor = DeviceFacts { device_id: 2, tagtype: Some(2) };
        let mut out = Vec::new();
        e.entered(staff, 22, 1_000, &mut out);
        e.entered(staff, 22, 30_000, &mut out);
        e.entered(staff, 21, 40_000, &mut out);
        e.entered(visitor, 22, 1_000, &mut out);
        e.entered(staff, 22, 61_000, &mut out);
        assert_eq!(out.iter().map(|f| (f.device_id, f.t_ms)).collect::<Vec<_>>(), [(1, 1_000), (1, 61_000)]);
        out.clear();
        e.alarm_event(visitor, 5, &mut out);
        assert_eq!((out[0].rule, out[0].device_id), (1, 2));
    }

    /// After a restart (or a start with the clock ahead), a device last heard before it is
    /// unheard only from when the service began to listen: no alert while it may simply not
    /// have been heard yet; one, saying the whole absence, once the rule's time has passed.
    /// Every badge raised "not seen" at a start that came longer than the rule's time after
    /// the stop (an upgrade, a reboot), before its first advert arrived.
    #[test]
    fn unseen_counts_from_when_the_service_began_to_listen() {
        let mut e = Evaluator::new(vec![rule(Condition::NotSeen { ms: 600_000 }, vec![])]);
        let d = DeviceFacts { device_id: 7, tagtype: None };
        let mut out = Vec::new();
        let started = 3_600_000;
        e.unseen(d, Some(1_000_000), (started, started + 1_000), &mut out);
        e.unseen(d, Some(1_000_000), (started, started + 599_999), &mut out);
        assert!(out.is_empty(), "fired {} ms after the start", out[0].t_ms - started);
        e.unseen(d, Some(1_000_000), (started, started + 600_000), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value, ((started + 600_000 - 1_000_000) / 60_000).to_string());
    }

    #[test]
    fn unseen_fires_once_per_absence_and_battery_below_its_threshold() {
        let mut e = Evaluator::new(vec![
            rule(Condition::NotSeen { ms: 600_000 }, vec![]),
            rule(Condition::BatteryBelow { mv: 2500 }, vec![]),
        ]);
        let d = DeviceFacts { device_id: 7, tagtype: None };
        let mut out = Vec::new();
        e.unseen(d, None, (i64::MIN, 10_000_000), &mut out);
        e.unseen(d, Some(0), (i64::MIN, 599_999), &mut out);
        assert!(out.is_empty());
        e.unseen(d, Some(0), (i64::MIN, 600_000), &mut out);
        e.unseen(d, Some(0), (i64::MIN, 9_000_000), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].value.as_str(), out[0].units.as_str()), ("10", "min"));
        // Seen again, then gone again: a new alert.
        e.unseen(d, Some(9_500_000), (i64::MIN, 10_200_000), &mut out);
        assert_eq!(out.len(), 2);
        out.clear();
        e.battery(d, 2600, 1, &mut out);
        e.battery(d, 2400, 2, &mut out);
        assert_eq!((out.len(), out[0].value.as_str(), out[0].units.as_str()), (1, "2.40", "V"));
        // Back to normal only well above the threshold (the readings jitter).
        assert!(!e.battery_ok(d, 2550));
        assert!(e.battery_ok(d, 2600));
    }

    /// An acknowledged alarm's repeat window is forgotten: the next press fires at once;
    /// other rules' windows, and other devices', stay.
    #[test]
    fn forgetting_alarms_lets_the_next_press_through() {
        let mut e = Evaluator::new(vec![
            rule(Condition::AlarmEvent, vec![]),
            rule(Condition::BatteryBelow { mv: 2500 }, vec![]),
        ]);
        let (d, other) = (DeviceFacts { device_id: 7, tagtype: None }, DeviceFacts { device_id: 8, tagtype: None });
        let mut out = Vec::new();
        for x in [d, other] {
            e.alarm_event(x, 1_000, &mut out);
            e.battery(x, 2_000, 1_000, &mut out);
        }
        assert_eq!(out.len(), 4);
        e.forget_alarms(7);
        out.clear();
        for x in [d, other] {
            e.alarm_event(x, 2_000, &mut out);
            e.battery(x, 2_000, 2_000, &mut out);
        }
        assert_eq!(out.iter().map(|f| (f.rule, f.device_id)).collect::<Vec<_>>(), [(0, 7)]);
    }

    /// A last firing dated ahead (the clock was set back since) holds nothing back: the alarm
    /// fires, a new absence is alerted; moved with the clock (`shift`), the repeat window
    /// holds as before.
    #[test]
    fn a_clock_set_back_holds_no_alert_back() {
        let mut alarm = rule(Condition::AlarmEvent, vec![]);
        alarm.id = "panic".into();
        let mut gone = rule(Condition::NotSeen { ms: 600_000 }, vec![]);
        gone.id = "gone".into();
        let mut e = Evaluator::new(vec![alarm, gone]);
        let d = DeviceFacts { device_id: 7, tagtype: None };
        let mut out = Vec::new();
        e.alarm_event(d, 10_000_000, &mut out);
        e.unseen(d, Some(9_000_000), (i64::MIN, 10_000_000), &mut out);
        assert_eq!(out.len(), 2);
        // An hour back: pressed again a minute and a half later, by the clock's new time.
        out.clear();
        e.alarm_event(d, 10_000_000 - 3_600_000 + 90_000, &mut out);
        assert_eq!(out.len(), 1, "the alarm fires");
        // Seen by the new clock, then silent ten minutes: the alert of the last absence,
        // dated ahead, is not this absence's.
        out.clear();
        e.unseen(d, Some(6_500_000), (i64::MIN, 7_100_000), &mut out);
        assert_eq!(out.len(), 1, "a new absence");
        // Moved with the clock: the window of the last firing holds.
        let mut e = Evaluator::new(vec![rule(Condition::AlarmEvent, vec![])]);
        out.clear();
        e.alarm_event(d, 10_000_000, &mut out);
        e.shift(-3_600_000);
        e.alarm_event(d, 10_000_000 - 3_600_000 + 30_000, &mut out);
        assert_eq!(out.len(), 1, "within the repeat window");
    }

    /// What fired before a restart or a reload, remembered by rule id, holds the same.
    #[test]
    fn remembered_firings_hold_the_repeat_window_and_the_absence() {
        let mut alarm = rule(Condition::AlarmEvent, vec![]);
        alarm.id = "panic".into();
        let mut gone = rule(Condition::NotSeen { ms: 600_000 }, vec![]);
        gone.id = "gone".into();
        let mut e = Evaluator::new(vec![alarm.clone(), gone.clone()]);
        let d = DeviceFacts { device_id: 7, tagtype: None };
        e.remember("panic", 7, 1_000);
        e.remember("gone", 7, 700_000);
        e.remember("no such rule", 7, 1_000);
        let mut out = Vec::new();
        e.alarm_event(d, 60_999, &mut out);
        e.unseen(d, Some(0), (i64::MIN, 900_000), &mut out);
        assert!(out.is_empty(), "{:?}", out.iter().map(|f| f.rule).collect::<Vec<_>>());
        e.alarm_event(d, 61_000, &mut out);
        assert_eq!(out.len(), 1);
        // Rules in another order after a reload: carried over by id.
        let mut reloaded = Evaluator::new(vec![gone, alarm]);
        for (rule, device, t) in e.fired() {
            reloaded.remember(rule, device, t);
        }
        out.clear();
        reloaded.alarm_event(d, 62_000, &mut out);
        reloaded.unseen(d, Some(0), (i64::MIN, 1_000_000), &mut out);
        assert!(out.is_empty());
    }
}
