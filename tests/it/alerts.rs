//! Alert rules end to end: adverts from a remote receiver (MQTT) move a badge and press its
//! panic button; the rules record Monitor, publish Warn and Alarm on the alert topic with a
//! playable tone, create a ticket for an Alarm, and `/alerts` lists and acknowledges them.

use std::time::Duration;

use base64::Engine;
use expect_test::expect_file;
use serde_json::Value;

use crate::mqtt::{add_badge, badge_advert, connect, mqtt_addr, mqtt_user, site_config};
use crate::support::*;

pub fn config() -> String {
    let config =
        site_config("").replace("title = \"Staff badge\"", "title = \"Staff badge\"\nalarm = \"mfg:0059:0:01\"");
    format!(
        r#"{config}
[[alert_rules]]
id = "office-entry"
type = "warn"
when = "enter"
zones = [22]

[[alert_rules]]
id = "office-log"
type = "monitor"
when = "enter"
zones = [22]

[[alert_rules]]
id = "panic"
type = "alarm"
when = "alarm"
tag_types = [1]
"#
    )
}

/// The badge's advert with its panic button pressed or not.
pub fn advert(panic: bool) -> String {
    badge_advert(-60, None, if panic { r#","0059":"01""# } else { r#","0059":"00""# })
}

/// The service with the rules of [`config`], Ann Lee and her staff badge (tag type 1); returns
/// it with Ann's contact id.
fn start_with_badge(name: &str) -> (Service, i64) {
    start_with_badge_in(name, &config())
}

/// [`start_with_badge`] with another configuration.
fn start_with_badge_in(name: &str, config: &str) -> (Service, i64) {
    start_with_badge_env(name, config, Vec::new())
}

/// [`start_with_badge_in`] with more environment (a stepped clock's).
fn start_with_badge_env(name: &str, config: &str, env: Vec<(&str, &str)>) -> (Service, i64) {
    let s = Service::start_with(name, Options { config, env });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "tagtype": 1, "contactid": {ann}"#));
    (s, ann)
}

/// MQTT options for a persistent session (clean session off).
fn persistent(o: &mut rumqttc::MqttOptions) {
    o.set_clean_session(false);
}

/// The office's receiver, connected; the intercoms' password; and intercom-1, on a persistent
/// session, subscribed to the alerts.
fn scanner_and_intercom(s: &Service) -> (crate::mqtt::Mqtt, String, crate::mqtt::Mqtt) {
    let addr = mqtt_addr(s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(s, "acme", "scanner", true)).unwrap();
    let pw = mqtt_user(s, "acme", "intercom", false);
    let intercom = crate::mqtt::connect_with(addr, "intercom-1", "intercom", &pw, persistent).unwrap();
    intercom.subscribe("acme/+/alert");
    (scanner, pw, intercom)
}

/// How many alerts of a type (Monitor, Warn, Alarm) the organisation has recorded.
fn recorded(c: &Client, kind: &str) -> i64 {
    c.get_json(&format!("/alerts?all=1&type={kind}")).json()["alerts"]["count"].as_i64().unwrap_or(-1)
}

/// The office receiver reports the badge (its button pressed or not) until `n` alerts of
/// `kind` are recorded.
fn report_until(scanner: &crate::mqtt::Mqtt, c: &Client, panic: bool, kind: &str, n: i64) {
    wait_for(kind, || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(panic));
        std::thread::sleep(Duration::from_millis(200));
        (recorded(c, kind) == n).then_some(())
    });
}

#[test]
fn rules_raise_record_publish_and_ticket_alerts() {
    let (s, ann) = start_with_badge("alerts_end_to_end");
    let c = s.admin_client();
    // Webhooks: alerts.create (Warn and Alarm), items.create for tickets (the Alarm's).
    let rx = Receiver::start();
    let hook = |event: &str, constraint: &str| {
        let body = format!(
            r#"{{"event": "{event}", "constrainttype": "{constraint}", "url": "{}", "contenttype": "json", "secret": "s"}}"#,
            rx.url(&format!("/{event}"))
        );
        c.post_json("/hooks", &body).assert_status(201);
    };
    hook("alerts.create", "all");
    hook("items.create", "ticket");
    let bad = format!(r#"{{"event": "alerts.create", "constrainttype": "contact", "url": "{}"}}"#, rx.url("/x"));
    let refused = c.post_json("/hooks", &bad);
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("for alerts.create must be one of: all\""), "{}", refused.body);
    // A user who may not see Ann's record hears of the alerts without her name.
    let bob = s.add_user("viewer@acme.test", "Vic", &[]);
    let bobs = Receiver::start();
    let body = format!(r#"{{"event": "alerts.create", "url": "{}", "contenttype": "json"}}"#, bobs.url("/bob"));
    s.client(&bob).post_json("/hooks", &body).assert_status(201);
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let app = connect(addr, "app-1", "app", &mqtt_user(&s, "acme", "app", false)).unwrap();
    app.subscribe("acme/+/alert");

    // Into the office: the Warn rule publishes, the Monitor rule only records.
    let mut warn = None;
    for _ in 0..200 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        if let Some(p) = app.next_publish(Duration::from_millis(300)) {
            warn = Some(p);
            break;
        }
    }
    let warn = warn.unwrap_or_else(|| panic!("the Warn alert on the alert topic; stderr:\n{}", s.stderr()));
    assert_eq!(warn.topic, "acme/5.1.22/alert");
    let mut warn: Value = serde_json::from_slice(&warn.payload).unwrap();
    let wav = base64::engine::general_purpose::STANDARD.decode(warn["audio"].as_str().unwrap()).unwrap();
    assert!(wav.starts_with(b"RIFF") && &wav[8..12] == b"WAVE", "a WAV file");
    warn["audio"] = Value::from(format!("[{} bytes of WAV]", wav.len()));

    // The panic button: an Alarm, and a ticket for Ann.
    let mut alarm = None;
    for _ in 0..100 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        if let Some(p) = app.next_publish(Duration::from_millis(300)) {
            alarm = Some(serde_json::from_slice::<Value>(&p.payload).unwrap());
            break;
        }
    }
    let mut alarm = alarm.expect("the Alarm alert");
    assert_ne!(alarm["audio"], warn["audio"], "Warn and Alarm sound different");
    alarm["audio"] = Value::from("[WAV]");
    assert!(app.next_publish(Duration::from_secs(2)).is_none(), "Monitor is not published; repeats are held back");

    let list = c.get_json("/alerts").json();
    let records = list["alerts"]["records"].as_array().unwrap().clone();
    let kinds: Vec<&str> = records.iter().map(|r| r["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Alarm", "Monitor", "Warn"], "{list}");
    let ticket = records[0]["ticketid"].as_i64().expect("a ticket for the alarm");
    let t = c.get_json(&format!("/tickets/{ticket}")).json();
    assert_eq!(t["item"]["fields"]["title"], "Alarm: Alarm button pressed (Ann Lee)", "{t}");
    assert_eq!(
        (t["item"]["fields"]["priority"].as_str(), t["relateditems"][0]["id"].as_i64()),
        (Some("urgent"), Some(ann))
    );

    // Acknowledging: once (a second time keeps the first), then the open list omits it.
    let alarm_id = records[0]["id"].as_i64().unwrap();
    let acked = c.post_json(&format!("/alerts/{alarm_id}/ack"), "{}").json();
    assert_eq!(acked["alert"]["acked"], 1);
    let again = c.post_json(&format!("/alerts/{alarm_id}/ack"), "{}").json();
    assert_eq!(again["alert"]["ackedat"], acked["alert"]["ackedat"]);
    assert_eq!(c.get_json("/alerts").json()["alerts"]["count"], 2);
    assert_eq!(c.get_json("/alerts?all=1&type=Alarm").json()["alerts"]["count"], 1);
    c.post_json("/alerts/999999/ack", "{}").assert_status(404);
    c.get_json("/alerts?type=Loud").assert_status(400);
    // Pages: `limit` newest, then those `before` the last one.
    let ids = |path: &str| -> Vec<i64> {
        let list = c.get_json(path).json();
        list["alerts"]["records"].as_array().unwrap().iter().map(|r| r["id"].as_i64().unwrap()).collect()
    };
    let first = ids("/alerts?all=1&limit=2");
    assert_eq!(first.len(), 2);
    let next = ids(&format!("/alerts?all=1&limit=2&before={}", first[1]));
    assert_eq!([first, next].concat(), ids("/alerts?all=1"));
    for bad in ["limit=0", "limit=1001", "before=0", "before=x"] {
        c.get_json(&format!("/alerts?{bad}")).assert_status(400);
    }
    // Another organisation sees none of it.
    let out = s.cli(&["user", "add", "--email", "g@globex.test", "--name", "G", "--org", "globex"]);
    let g = Account { email: "g@globex.test".into(), token: String::from_utf8(out.stdout).unwrap().trim().into() };
    assert_eq!(s.client(&g).get_json("/alerts?all=1").json()["alerts"]["count"], 0);
    s.client(&g).post_json(&format!("/alerts/{alarm_id}/ack"), "{}").assert_status(404);
    // A user of the organisation who may not see Ann's contact record sees the alerts without
    // her name.
    let bob = s.add_user("bob@acme.test", "Bob", &[]);
    let theirs = s.client(&bob).get_json("/alerts?all=1");
    assert_eq!(theirs.json()["alerts"]["count"], 3, "{}", theirs.body);
    assert!(!theirs.body.contains("Ann") && !theirs.body.contains(&format!("\"contactid\":{ann}")), "{}", theirs.body);
    assert!(c.get_json("/alerts?all=1").body.contains("Ann Lee"));

    // The webhooks: two alerts.create (Warn, Alarm; not Monitor), then the ticket's
    // items.create, in order.
    let got = rx.wait_accepted(3);
    let seen: Vec<(String, String)> = got
        .iter()
        .map(|r| {
            let v = r.json();
            let kind = v["content"]["alert"]["type"].as_str().map(str::to_string);
            (r.path.clone(), kind.unwrap_or_else(|| v["type"].as_str().unwrap_or("").to_string()))
        })
        .collect();
    let want = [("/alerts.create", "Warn"), ("/alerts.create", "Alarm"), ("/items.create", "items.create")];
    assert_eq!(seen.len(), 3, "{seen:?}");
    for w in want {
        assert!(seen.iter().any(|(p, k)| p == w.0 && k == w.1), "{w:?} in {seen:?}");
    }
    let alert_hook = got.iter().find(|r| r.path == "/alerts.create").unwrap().json();
    assert_eq!(alert_hook["type"], "alerts.create");
    assert_eq!(alert_hook["objectid"], alert_hook["content"]["alert"]["id"]);
    assert_eq!(alert_hook["content"]["alert"]["contactid"], ann);
    for r in bobs.wait_accepted(2) {
        let alert = &r.json()["content"]["alert"];
        assert_eq!((alert["contactid"].is_null(), alert["contactname"].is_null()), (true, true), "{alert}");
    }

    // The shapes, golden (local times redacted).
    let local = regex::Regex::new(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d").unwrap();
    let listed = c.get_json("/alerts?all=1").json();
    let text = format!(
        "warn message:\n{}\nalarm message:\n{}\nGET /alerts?all=1:\n{}\n",
        serde_json::to_string_pretty(&warn).unwrap(),
        serde_json::to_string_pretty(&alarm).unwrap(),
        serde_json::to_string_pretty(&listed).unwrap()
    );
    expect_file!["golden/alerts.txt"].assert_eq(&local.replace_all(&text, "[LOCAL]"));
}

/// An intercom with a persistent session (clean session off) that is away when an Alarm is
/// raised gets it when it comes back, without subscribing again; one that asked for a clean
/// session does not (it reads `/alerts` instead).
#[test]
fn an_intercom_away_for_a_moment_gets_the_alarm_raised_meanwhile() {
    use crate::mqtt::connect_with;
    let (s, _) = start_with_badge("alerts_persistent_session");
    let c = s.admin_client();
    let addr = mqtt_addr(&s);
    let (scanner, pw, intercom) = scanner_and_intercom(&s);
    let forgetful = connect(addr, "intercom-2", "intercom", &pw).unwrap();
    forgetful.subscribe("acme/+/alert");
    // The badge walks into the office (a Warn) while both listen.
    let mut warn = None;
    for _ in 0..200 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        if let Some(p) = intercom.next_publish(Duration::from_millis(300)) {
            warn = Some(serde_json::from_slice::<Value>(&p.payload).unwrap());
            break;
        }
    }
    assert_eq!(warn.expect("the Warn")["type"], "Warn");
    let connections = || s.anonymous().get_json("/health").json()["mqtt"]["connections"].as_i64();
    let before = connections().expect("mqtt.connections in /health");
    intercom.client.disconnect().unwrap();
    forgetful.client.disconnect().unwrap();
    wait_for("both intercoms gone", || (connections() == Some(before - 2)).then_some(()));

    // The panic button while they are away.
    report_until(&scanner, &c, true, "Alarm", 1);

    let back = connect_with(addr, "intercom-1", "intercom", &pw, persistent).unwrap();
    let mut alerts = Vec::new();
    while let Some(p) = back.next_publish(Duration::from_secs(3)) {
        alerts.push(serde_json::from_slice::<Value>(&p.payload).unwrap());
    }
    let types: Vec<&str> = alerts.iter().filter_map(|a| a["type"].as_str()).collect();
    assert_eq!(types, ["Alarm"], "the alarm raised while it was away, once: {alerts:?}");
    assert_eq!(alerts[0]["deviceId"], "5.1.22");

    let fresh = connect(addr, "intercom-2", "intercom", &pw).unwrap();
    assert!(fresh.next_publish(Duration::from_secs(2)).is_none(), "a clean session starts empty");
}

/// A restart remembers when each rule last fired: the badge that keeps its panic button
/// pressed raises no second Alarm (and no second ticket) within `repeat_s`, and its retained
/// state still names the alarm.
#[test]
fn a_restart_raises_no_alarm_again_within_its_repeat_window() {
    // The office's Warn may repeat after a second: the restart takes longer, and the badge,
    // placed in the office again, did not enter it again.
    let config = config().replacen("zones = [22]\n", "zones = [22]\nrepeat_s = 1\n", 1);
    let (s, _) = start_with_badge_in("alerts_restart", &config);
    let c = s.admin_client();
    let scanner_pw = mqtt_user(&s, "acme", "scanner", true);
    let app_pw = mqtt_user(&s, "acme", "app", false);
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    // Into the office (a Warn), then the button (an Alarm: the device's state).
    report_until(&scanner, &c, false, "Warn", 1);
    report_until(&scanner, &c, true, "Alarm", 1);
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop(scanner);
    assert_eq!(s.terminate(), Some(0));
    // Both were published, and noted so: the start does not publish them again.
    let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
    let waiting: i64 = db.query_row("SELECT count(*) FROM alerts WHERE published = 0", [], |r| r.get(0)).unwrap();
    assert_eq!(waiting, 0, "published alerts noted as published");
    drop(db);

    let s = Service::launch(dir, cfg, &[]);
    let c = s.client(&admin);
    let addr = mqtt_addr(&s);
    let app = connect(addr, "app-1", "app", &app_pw).unwrap();
    app.subscribe("acme/+/state");
    let state = app.next_publish(Duration::from_secs(10)).expect("the retained state");
    let state: Value = serde_json::from_slice(&state.payload).unwrap();
    assert_eq!(state["data"]["state"], "alarm", "{state}");
    assert_eq!(state["data"]["alarmEvent"]["value"], "Alarm button pressed", "{state}");

    // The button still pressed, and the badge back in the office.
    let scanner = connect(addr, "scanner-1", "scanner", &scanner_pw).unwrap();
    wait_for("the badge placed again", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        std::thread::sleep(Duration::from_millis(200));
        let d = c.get_json("/devices/1").json();
        (d["device"]["zoneid"] == 22).then_some(())
    });
    for _ in 0..10 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!((recorded(&c, "Alarm"), recorded(&c, "Warn")), (1, 1), "no alert raised twice");
    let tickets = c.get_json("/tickets").json();
    assert_eq!(tickets["count"], 1, "one ticket for the one alarm: {tickets}");
    // Placed again, the badge keeps its alarm state (a zone change would end it).
    let late = connect(addr, "app-2", "app", &app_pw).unwrap();
    late.subscribe("acme/+/state");
    let state = late.next_publish(Duration::from_secs(10)).expect("the retained state");
    let state: Value = serde_json::from_slice(&state.payload).unwrap();
    assert_eq!(state["data"]["state"], "alarm", "{state}");
}

/// A restart keeps a badge heard just before it in its zone: the kitchen's receiver hearing it
/// first after the start (a fresh engine placed it there, then moved it back to the office: an
/// `enter` alert for an office it never left, and two made-up visits) moves it nowhere, its
/// office visit goes on, and `/devices` has it in the office from the start.
#[test]
fn a_restart_keeps_a_badge_in_its_zone_and_raises_no_enter() {
    let config = config()
        .replacen("zones = [22]\n", "zones = [22]\nrepeat_s = 1\n", 1)
        .replace("away_timeout_ms = 4000", "away_timeout_ms = 30000");
    let (s, _) = start_with_badge_in("alerts_restart_placement", &config);
    let c = s.admin_client();
    let scanner_pw = mqtt_user(&s, "acme", "scanner", true);
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    report_until(&scanner, &c, false, "Warn", 1);
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop(scanner);
    assert_eq!(s.terminate(), Some(0));

    let s = Service::launch(dir.clone(), cfg, &[]);
    let c = s.client(&admin);
    // In the office once the engine has started, before it hears anything.
    wait_for("the badge in the office", || (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(()));
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    // The kitchen's receiver hears it first, a little louder; then the office's, for a while.
    for _ in 0..2 {
        scanner.publish("acme/receivers/rx-a/adverts", &badge_advert(-58, None, ""));
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..20 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(150));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(recorded(&c, "Warn"), 1, "no enter alert for the office it never left");
    let device = c.get_json("/devices/1").json();
    assert_eq!(device["device"]["zoneid"], 22, "{device}");
    assert_eq!(s.terminate(), Some(0));
    let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
    let visits: Vec<i64> = db
        .prepare("SELECT zone_id FROM visits ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(visits, [22], "one office visit, going on across the restart");
}

/// An Alarm raised while the database refuses writes (its file moved away here; a full disk
/// does the same) is published at once, and recorded with its ticket once writes go on.
#[test]
fn an_alarm_the_database_refused_is_recorded_when_it_takes_writes_again() {
    let (s, _) = start_with_badge("alerts_recorded_late");
    let c = s.admin_client();
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let app = connect(addr, "app-1", "app", &mqtt_user(&s, "acme", "app", false)).unwrap();
    app.subscribe("acme/+/alert");
    report_until(&scanner, &c, false, "Warn", 1);
    let db = s.dir.join("data").join("sitegate.db");
    let away = s.dir.join("data").join("sitegate.db.away");
    std::fs::rename(&db, &away).unwrap();
    let published = wait_for("the Alarm on the alert topic", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        let p = app.next_publish(Duration::from_millis(300))?;
        let alert: Value = serde_json::from_slice(&p.payload).unwrap();
        (alert["type"] == "Alarm").then_some(alert)
    });
    assert_eq!(published["data"]["channel"], "alarm");
    assert_eq!(recorded(&c, "Alarm"), 0, "not recorded while the database refuses writes");
    let metrics = s.anonymous().get("/metrics").body;
    assert!(metrics.contains("\nsitegate_database_writes_failing 1\n"), "{metrics}");
    std::fs::rename(&away, &db).unwrap();
    wait_for("the Alarm recorded", || (recorded(&c, "Alarm") == 1).then_some(()));
    let tickets = c.get_json("/tickets").json();
    assert_eq!(tickets["count"], 1, "its ticket too: {tickets}");
    assert!(s.stderr().contains("recorded late"), "{}", s.stderr());
}

/// The gateway's clock set back an hour (NTP correcting it) while a badge is in the office:
/// its panic button still raises an Alarm once the repeat window has passed, and the engine
/// still follows the badge into the kitchen. The service runs under libfaketime, which reads
/// the clock's offset from a file at every look; the monotonic clock runs as it does.
#[test]
fn a_clock_set_back_holds_back_neither_alarms_nor_the_engine() {
    let stepped = crate::support::SteppedClock::new("alerts_clock_step_offset");
    let (clock, env) = (&stepped.offset, stepped.env());
    let config = config().replacen(
        "when = \"alarm\"\ntag_types = [1]\n",
        "when = \"alarm\"\ntag_types = [1]\nrepeat_s = 2\n",
        1,
    );
    assert!(config.contains("repeat_s = 2"));
    let s = Service::start_with("alerts_clock_step", Options { config: &config, env });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "tagtype": 1, "contactid": {ann}"#));
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    report_until(&scanner, &c, true, "Alarm", 1);
    wait_for("the badge in the office", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(200));
        (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(())
    });

    std::fs::write(clock, "-3600").unwrap();
    // The step as the service measured it (to the millisecond: the two clocks are read
    // one after the other).
    let step_ms = |log: &str| -> Option<i64> {
        let at = log.find("the system clock was set ")? + "the system clock was set ".len();
        log[at..].split_whitespace().next()?.parse().ok()
    };
    let step = wait_for("the step in the journal", || step_ms(&s.stderr()));
    assert!((step + 3_600_000).abs() < 1_000, "{step} ms");
    report_until(&scanner, &c, true, "Alarm", 2);
    wait_for("the badge in the kitchen", || {
        scanner.publish("acme/receivers/rx-a/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(200));
        (c.get_json("/devices/1").json()["device"]["zoneid"] == 21).then_some(())
    });
    // The office visit, entered before the step and left after it, lasts the seconds it
    // lasted: its entry moved with the clock (it was left as stored, after the new now, and
    // the visit ended where it began, lasting nothing).
    let export = c.get_json(&format!("/contacts/{ann}/locations")).json();
    let mut visits = Vec::new();
    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        match v {
            Value::Object(m) if m.contains_key("enter") => out.push(v),
            Value::Object(m) => m.values().for_each(|v| walk(v, out)),
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&export, &mut visits);
    let closed: Vec<_> = visits.iter().filter(|v| v["exit"] != "").collect();
    assert!(!closed.is_empty(), "{export}");
    for v in closed {
        assert!(v["exit"].as_str() > v["enter"].as_str(), "{v}");
    }
}

/// A site reload starts the zone engine over: the badge, placed again where it stood, raises
/// no `enter` alert again, and when it then falls silent it goes offline on the feed.
#[test]
fn a_reload_raises_no_enter_alert_again_and_still_sees_a_badge_leave() {
    let config = config().replacen("zones = [22]\n", "zones = [22]\nrepeat_s = 1\n", 1);
    let (s, _) = start_with_badge_in("alerts_reload", &config);
    let c = s.admin_client();
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let app = connect(addr, "app-1", "app", &mqtt_user(&s, "acme", "app", false)).unwrap();
    app.subscribe("acme/+/state");
    report_until(&scanner, &c, false, "Warn", 1);
    std::thread::sleep(Duration::from_millis(1500));
    // A reload that changes the map (a tag type's title) starts the engine over.
    std::fs::write(&s.config, config.replace("Staff badge", "Employee badge")).unwrap();
    let out = std::process::Command::new("kill").args(["-HUP", &s.pid().to_string()]).output().unwrap();
    assert!(out.status.success());
    wait_for("the reload", || s.stderr().contains("location: the site map changed").then_some(()));
    // The badge stays in the office through the reload, kept there by the new engine: the
    // kitchen's receiver hearing it faintly first does not move it (a fresh engine placed
    // it in the kitchen, then back in the office: a false `enter`), and its visit goes on.
    scanner.publish("acme/receivers/rx-a/adverts", &badge_advert(-85, None, r#","0059":"00""#));
    std::thread::sleep(Duration::from_millis(300));
    let placed = || c.get_json("/devices/1").json()["device"]["zoneid"] == 22;
    wait_for("the badge placed again", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(200));
        placed().then_some(())
    });
    for _ in 0..10 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(recorded(&c, "Warn"), 1, "the reload raised the office's Warn again: {}", s.stderr());
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    let visits: Vec<(i64, Option<i64>)> = db
        .prepare("SELECT zone_id, exit_ms FROM visits WHERE device_id = 1 ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(visits, vec![(22, None)], "one visit to the office, going on through the reload");
    // Silent now: offline after the away timeout (4 s), as without the reload.
    let offline = wait_for("offline on the feed", || {
        let p = app.next_publish(Duration::from_millis(500))?;
        let state: Value = serde_json::from_slice(&p.payload).unwrap();
        (state["data"]["state"] == "offline").then_some(state)
    });
    assert_eq!(offline["deviceId"], "5.1.22", "{offline}");
}

/// A badge that was heard (with a location history and a published state, here an alarm)
/// can be deleted, a lost badge for instance; its history goes with it.
#[test]
fn a_badge_that_was_heard_can_be_deleted() {
    let (s, ann) = start_with_badge("alerts_delete_heard_badge");
    let c = s.admin_client();
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    report_until(&scanner, &c, true, "Alarm", 1);
    drop(scanner);
    let history = c.get_json(&format!("/contacts/{ann}/locations")).body;
    assert!(history.contains("5/1/22"), "{history}");
    c.delete("/devices/1").assert_status(200);
    c.get_json("/devices/1").assert_status(404);
    let history = c.get_json(&format!("/contacts/{ann}/locations")).body;
    assert!(!history.contains("5/1/22"), "{history}");
    assert_eq!(recorded(&c, "Alarm"), 1, "the alerts stay on record");
    let alarm = c.get_json("/alerts?all=1&type=Alarm").json();
    let alarm = &alarm["alerts"]["records"][0];
    assert_eq!(alarm["deviceaddress"], "5/1/22", "the alert still names its badge: {alarm}");
    assert_eq!(alarm["deviceid"], "5.1.22", "{alarm}");
}

/// A contact renamed is named by the feed and by her next alarm (and its ticket) as she is
/// called now, not as the devices were last read.
#[test]
fn an_alarm_names_the_contact_as_she_is_called_now() {
    let (s, ann) = start_with_badge("alerts_renamed_contact");
    let c = s.admin_client();
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let app = connect(addr, "app-1", "app", &mqtt_user(&s, "acme", "app", false)).unwrap();
    app.subscribe("acme/+/data");
    report_until(&scanner, &c, false, "Warn", 1);
    c.put_json(&format!("/contacts/{ann}"), r#"{"firstname": "Anna", "lastname": "Berg"}"#).assert_status(200);
    wait_for("the new name on the feed", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        let p = app.next_publish(Duration::from_millis(300))?;
        let data: Value = serde_json::from_slice(&p.payload).ok()?;
        (data["contactName"] == "Anna Berg").then_some(())
    });
    report_until(&scanner, &c, true, "Alarm", 1);
    let tickets = c.get_json("/tickets").body;
    assert!(tickets.contains("Alarm: Alarm button pressed (Anna Berg)"), "{tickets}");
    // Deleted, she is no one's: on the feed at once, and on the device as in the list.
    c.delete(&format!("/contacts/{ann}")).assert_status(200);
    wait_for("no contact on the feed", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        let p = app.next_publish(Duration::from_millis(300))?;
        let data: Value = serde_json::from_slice(&p.payload).ok()?;
        (data["contactId"].is_null() && data["contactName"].is_null()).then_some(())
    });
    let device = c.get_json("/devices").json()["devices"][0].clone();
    assert!(device["contactid"].is_null(), "{device}");
    let shown = c.get_json(&format!("/devices/{}", device["id"])).json();
    assert!(shown["device"]["contactid"].is_null(), "{shown}");
}

/// Erasing a contact forgets the webhook deliveries sent of the alerts that named her (their
/// bodies hold her name); the alerts stay, naming no one.
#[test]
fn erasing_a_contact_forgets_the_sent_deliveries_of_her_alerts() {
    let (s, ann) = start_with_badge("alerts_erased_contact");
    let c = s.admin_client();
    let rx = Receiver::start();
    let body = format!(r#"{{"event": "alerts.create", "url": "{}", "contenttype": "json"}}"#, rx.url("/in"));
    let hook = c.post_json("/hooks", &body).json()["id"].as_i64().unwrap();
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    report_until(&scanner, &c, false, "Warn", 1);
    let got = rx.wait_accepted(1);
    assert_eq!(got[0].json()["content"]["alert"]["contactname"], "Ann Lee", "{}", got[0].text());
    let deliveries = || c.get_json(&format!("/hooks/{hook}/deliveries")).json()["deliveries"].clone();
    wait_for("the delivery recorded", || (deliveries()[0]["state"] == "delivered").then_some(()));
    c.delete(&format!("/contacts/{ann}")).assert_status(200);
    let out = s.cli(&["erase", "--type", "contacts", "--id", &ann.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(deliveries(), serde_json::json!([]));
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    let named: i64 = db
        .query_row("SELECT count(*) FROM payloads WHERE CAST(body AS TEXT) LIKE '%Ann Lee%'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(named, 0, "bodies that hold her name");
    let alert = c.get_json("/alerts?all=1&type=Warn").json()["alerts"]["alerts"][0].clone();
    assert!(alert["contactid"].is_null() && alert["contactname"].is_null(), "{alert}");
}

/// A battery still low when its rule fires again (every `repeat_s`) raises the alert again but
/// keeps the device's state: `lowbattery` is published once, with the time it began (it was
/// published again at every repeat, each time with a new `timeStamp`).
#[test]
fn a_low_battery_state_is_published_once_while_it_lasts() {
    let config = format!(
        "{}\n[[alert_rules]]\nid = \"battery\"\ntype = \"warn\"\nwhen = \"battery_low\"\nbattery_v = 2.6\nrepeat_s = 1\n",
        crate::mqtt::site_config("")
    );
    let s =
        Service::start_with("a_low_battery_state_is_published_once", Options { config: &config, ..Default::default() });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    c.post_json(
        "/devices",
        &format!(r#"{{"deviceaddress": "5/1/40", "beacon": "eddystone:edd5f3b6f0e1a40c9b2a/000102030405", "contactid": {ann}}}"#),
    )
    .assert_status(201);
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let app = connect(addr, "app-1", "app", &mqtt_user(&s, "acme", "app", false)).unwrap();
    app.subscribe("acme/+/state");
    // UID and TLM frames from one MAC: 2,500 mV, below the rule's 2.6 V.
    let uid = r#"{"mac":"C0:00:00:00:00:40","rssi":-60,"svc":{"feaa":"00e7edd5f3b6f0e1a40c9b2a000102030405"}}"#;
    let tlm = r#"{"mac":"C0:00:00:00:00:40","rssi":-60,"svc":{"feaa":"200009c4000000000000000000000000"}}"#;
    let mut low = Vec::new();
    wait_for("the battery alert raised three times", || {
        scanner.publish("acme/receivers/rx-b/adverts", &format!("{uid}\n"));
        scanner.publish("acme/receivers/rx-b/adverts", &format!("{tlm}\n"));
        while let Some(p) = app.next_publish(Duration::from_millis(200)) {
            let state: Value = serde_json::from_slice(&p.payload).unwrap_or_default();
            if state["data"]["state"] == "lowbattery" {
                low.push(state);
            }
        }
        (recorded(&c, "Warn") >= 3).then_some(())
    });
    while let Some(p) = app.next_publish(Duration::from_millis(500)) {
        let state: Value = serde_json::from_slice(&p.payload).unwrap_or_default();
        if state["data"]["state"] == "lowbattery" {
            low.push(state);
        }
    }
    assert_eq!(low.len(), 1, "{low:?}");

    // A new battery (3,000 mV, well above 2.6 V): the state is `online` again.
    let fresh = tlm.replace("200009c4", "20000bb8");
    let mut back = None;
    wait_for("the state online again", || {
        scanner.publish("acme/receivers/rx-b/adverts", &format!("{uid}\n"));
        scanner.publish("acme/receivers/rx-b/adverts", &format!("{fresh}\n"));
        while let Some(p) = app.next_publish(Duration::from_millis(200)) {
            let state: Value = serde_json::from_slice(&p.payload).unwrap_or_default();
            back = Some(state);
        }
        back.as_ref().filter(|s| s["data"]["state"] == "online").map(|_| ())
    });
}

/// An alert recorded but not published (the service was killed between the two) goes out
/// on the feed a moment after the next start, for the subscribers that came back; one that
/// was published does not go out again.
#[test]
fn an_alert_recorded_and_not_published_goes_out_after_the_restart() {
    let (s, _) = start_with_badge_in("alerts_unpublished", &config());
    let password = mqtt_user(&s, "acme", "desk", false);
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    {
        let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
        let insert = "INSERT INTO alerts (org, rule, type, device_id, text, value, units, t_ms, published)
                      VALUES ('acme', 'panic', 'Alarm', 1, ?1, '', '', ?2, ?3)";
        db.execute(insert, ("Old news", now - 2_000, 1)).unwrap();
        db.execute(insert, ("Never heard", now - 1_000, 0)).unwrap();
    }
    let s = Service::launch(dir.clone(), cfg, &[]);
    let desk = connect(mqtt_addr(&s), "desk-1", "desk", &password).unwrap();
    desk.subscribe("acme/+/alert");
    let message = wait_for("the alert not published before the stop", || {
        let p = desk.next_publish(Duration::from_millis(500))?;
        serde_json::from_slice::<Value>(&p.payload).ok()
    });
    assert_eq!(message["text"], "Never heard", "{message}");
    assert_eq!(message["type"], "Alarm", "{message}");
    assert_eq!(message["deviceId"], "5.1.22", "{message}");
    assert!(desk.next_publish(Duration::from_secs(1)).is_none(), "a published alert went out again");
    let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
    let waiting: i64 = db.query_row("SELECT count(*) FROM alerts WHERE published = 0", [], |r| r.get(0)).unwrap();
    assert_eq!(waiting, 0);
}

/// A badge pressed on its way in keeps its `alarm` state when it is placed, and gets it back
/// when it returns after going offline with its alarm still open. Acknowledging the alarm gives its retained state back (`online`: it is in the office) within a flush, and lets its next press through at once, however soon within
/// `repeat_s`; the press that was acknowledged, still held down, raises nothing more. After a
/// restart too, an acknowledged alarm holds back no press. Alert messages carry the alert's
/// id, for acknowledging it.
#[test]
fn an_acknowledged_alarm_gives_the_state_back_and_lets_the_next_press_through() {
    let (s, _) = start_with_badge("alerts_acknowledged");
    let c = s.admin_client();
    let rx = Receiver::start();
    let hook = format!(r#"{{"event": "alerts.ack", "url": "{}", "contenttype": "json"}}"#, rx.url("/ack"));
    c.post_json("/hooks", &hook).assert_status(201);
    let addr = mqtt_addr(&s);
    let scanner_pw = mqtt_user(&s, "acme", "scanner", true);
    let app_pw = mqtt_user(&s, "acme", "app", false);
    let scanner = connect(addr, "scanner-1", "scanner", &scanner_pw).unwrap();
    let app = connect(addr, "app-1", "app", &app_pw).unwrap();
    app.subscribe("acme/+/state");
    app.subscribe("acme/+/alert");
    let mut heard: Vec<(String, Value)> = Vec::new();
    // Takes what the app hears until it has been quiet for a moment; returns the last state.
    fn listen(app: &crate::mqtt::Mqtt, heard: &mut Vec<(String, Value)>) -> Option<String> {
        while let Some(p) = app.next_publish(Duration::from_millis(200)) {
            heard.push((p.topic.to_string(), serde_json::from_slice(&p.payload).unwrap_or_default()));
        }
        let state = heard.iter().rev().find(|(t, _)| t.ends_with("/state"));
        state.and_then(|(_, v)| v["data"]["state"].as_str().map(str::to_string))
    }
    report_until(&scanner, &c, true, "Alarm", 1);
    let first = c.get_json("/alerts?type=Alarm").json()["alerts"]["records"][0].clone();
    assert_eq!(first["channel"], "alarm", "{first}");
    let first_id = first["id"].as_i64().unwrap();
    wait_for("the alarm state", || (listen(&app, &mut heard).as_deref() == Some("alarm")).then_some(()));
    // Pressed on its way in, the button held while the engine places it (once heard for a
    // moment): the batch that placed it (a flush later) keeps the alarm.
    for _ in 0..8 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for("the badge placed", || c.get_json("/devices").json()["devices"][0]["zoneid"].as_i64());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(listen(&app, &mut heard).as_deref(), Some("alarm"), "{heard:?}");
    // Out of range (the away timeout, 4 s): offline. Back, the alarm still open: `alarm`
    // again, naming it, not `online`.
    wait_for("the badge offline", || (listen(&app, &mut heard).as_deref() == Some("offline")).then_some(()));
    wait_for("the alarm state once it is back", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        (listen(&app, &mut heard).as_deref() == Some("alarm")).then_some(())
    });
    let back = heard.iter().rev().find(|(t, _)| t.ends_with("/state")).map(|(_, v)| v.clone()).unwrap_or_default();
    assert_eq!(back["data"]["alarmEvent"]["value"], "Alarm button pressed", "{back}");
    let alarm_message = heard.iter().find(|(t, v)| t.ends_with("/alert") && v["type"] == "Alarm").map(|(_, v)| v);
    assert_eq!(alarm_message.map(|v| v["alertId"].as_i64()), Some(Some(first_id)), "{heard:?}");

    // Pressed again while the alarm is open (nothing new), and acknowledged while the button
    // is still held: the state goes back, no second alarm. Acknowledged twice: one
    // `alerts.ack` delivery.
    for _ in 0..5 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(200));
    c.post_json(&format!("/alerts/{first_id}/ack"), "{}").assert_status(200);
    c.post_json(&format!("/alerts/{first_id}/ack"), "{}").assert_status(200);
    let got = rx.wait_accepted(1);
    let delivered = got[0].json();
    assert_eq!(
        (
            delivered["type"].as_str(),
            delivered["content"]["alert"]["id"].as_i64(),
            delivered["content"]["alert"]["acked"].as_i64()
        ),
        (Some("alerts.ack"), Some(first_id), Some(1)),
        "{delivered}"
    );
    wait_for("the state back to online", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        (listen(&app, &mut heard).as_deref() == Some("online")).then_some(())
    });
    for _ in 0..10 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(recorded(&c, "Alarm"), 1, "the acknowledged press, held down, raises no second alarm");

    // Released, then pressed again well within repeat_s (300 s): a new alarm, and the state.
    for _ in 0..3 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(100));
    }
    report_until(&scanner, &c, true, "Alarm", 2);
    wait_for("the alarm state again", || (listen(&app, &mut heard).as_deref() == Some("alarm")).then_some(()));
    let second = c.get_json("/alerts?type=Alarm").json()["alerts"]["records"][0]["id"].as_i64().unwrap();
    assert_ne!(second, first_id);
    c.post_json(&format!("/alerts/{second}/ack"), "{}").assert_status(200);
    wait_for("the state back to online again", || {
        (listen(&app, &mut heard).as_deref() == Some("online")).then_some(())
    });
    let acks: Vec<i64> =
        rx.wait_accepted(2).iter().map(|r| r.json()["content"]["alert"]["id"].as_i64().unwrap_or(0)).collect();
    assert_eq!(acks, [first_id, second], "one delivery per alert acknowledged");

    // Across a restart: the acknowledged alarm holds back no press.
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop((scanner, app));
    assert_eq!(s.terminate(), Some(0));
    let s = Service::launch(dir, cfg, &[]);
    let c = s.client(&admin);
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    report_until(&scanner, &c, true, "Alarm", 3);
}

/// A press that begins in the moment after an acknowledgement, before the location thread
/// looks for it (once a flush), raises an alarm: the repeat window of the alarm acknowledged
/// held it back, and the look then took it for that press still held down, so nothing was
/// raised for as long as it was held (and a quick press and release was lost too).
#[test]
fn a_press_just_after_an_acknowledgement_raises_an_alarm() {
    let (s, _) = start_with_badge("a_press_just_after_an_acknowledgement_raises_an_alarm");
    let c = s.admin_client();
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let send = |panic: bool, ms: u64| {
        let end = std::time::Instant::now() + Duration::from_millis(ms);
        while std::time::Instant::now() < end {
            scanner.publish("acme/receivers/rx-b/adverts", &advert(panic));
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    send(false, 2000);
    report_until(&scanner, &c, true, "Alarm", 1);
    send(false, 1500);
    let first = c.get_json("/alerts?type=Alarm").json()["alerts"]["records"][0]["id"].as_i64().unwrap();
    c.post_json(&format!("/alerts/{first}/ack"), "{}").assert_status(200);
    // Pressed at once (released in between), held 3 s: a second alarm.
    send(true, 3000);
    send(false, 1500);
    assert_eq!(recorded(&c, "Alarm"), 2, "the press right after the acknowledgement raised no alarm");
    // A quick press and release right after the next acknowledgement: a third.
    let second = c.get_json("/alerts?type=Alarm").json()["alerts"]["records"][0]["id"].as_i64().unwrap();
    c.post_json(&format!("/alerts/{second}/ack"), "{}").assert_status(200);
    send(true, 200);
    send(false, 2500);
    assert_eq!(recorded(&c, "Alarm"), 3, "the quick press right after the acknowledgement raised no alarm");
}

/// A step of the clock while the location thread writes its batch (here the write waits for
/// another process's write lock, as behind a command-line import or on slow storage) is
/// followed like any other: the batch is judged in the times it was decided in. Judged with
/// the stepped clock, a badge heard five times a second was "not seen for 60 minutes".
#[test]
fn a_clock_step_during_a_batch_write_raises_no_not_seen_alert() {
    let stepped = SteppedClock::new("a_clock_step_during_a_batch_write_offset");
    let config = format!(
        "{}\n[[alert_rules]]\nid = \"gone\"\ntype = \"warn\"\nwhen = \"not_seen\"\nminutes = 10\n",
        site_config("")
    );
    let s = Service::start_with(
        "a_clock_step_during_a_batch_write_raises_no_not_seen_alert",
        Options { config: &config, env: stepped.env() },
    );
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "contactid": {ann}"#));
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let hearing = crate::mqtt::Hearing::start(&scanner, Duration::from_millis(200));
    wait_for("the badge in the office", || (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(()));
    std::thread::sleep(Duration::from_secs(2));
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    std::fs::write(&stepped.offset, "+3600").unwrap();
    std::thread::sleep(Duration::from_millis(800));
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    std::thread::sleep(Duration::from_millis(2500));
    hearing.stop();
    assert!(s.stderr().contains("the system clock was set"), "the step was not seen:\n{}", s.stderr());
    let warns = c.get_json("/alerts?all=1&type=Warn").json();
    assert_eq!(warns["alerts"]["count"], 0, "a badge heard all along was reported unseen: {warns}");
}

/// A tag that sends frames without its button's flag between those with it (another beacon
/// format) is not taken as released by them: its press, held down while it is acknowledged,
/// raises no second alarm; a frame with the flag lowered is a release, and the next press
/// raises one.
#[test]
fn frames_without_the_flag_do_not_end_a_press() {
    let (s, _) = start_with_badge("frames_without_the_flag_do_not_end_a_press");
    let c = s.admin_client();
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    report_until(&scanner, &c, true, "Alarm", 1);
    let pressed_for = |ms: u64| {
        let end = std::time::Instant::now() + Duration::from_millis(ms);
        while std::time::Instant::now() < end {
            scanner.publish("acme/receivers/rx-b/adverts", &advert(true));
            std::thread::sleep(Duration::from_millis(50));
            scanner.publish("acme/receivers/rx-b/adverts", &badge_advert(-60, None, ""));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    pressed_for(1000);
    let first = c.get_json("/alerts?type=Alarm").json()["alerts"]["records"][0]["id"].as_i64().unwrap();
    c.post_json(&format!("/alerts/{first}/ack"), "{}").assert_status(200);
    pressed_for(3000);
    assert_eq!(recorded(&c, "Alarm"), 1, "the acknowledged press, held down, raised another alarm");
    for _ in 0..3 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(100));
    }
    report_until(&scanner, &c, true, "Alarm", 2);
}

/// A panic press while the advert queue is full (the location thread waits for the database:
/// here another process's write lock, as behind a command-line import or on slow storage, while
/// receivers report thousands of other adverts) raises its alarm once the database is back:
/// the queue dropped the press's frames with the rest, and the alarm was lost.
#[test]
fn a_panic_press_while_the_advert_queue_is_full_raises_an_alarm() {
    let (s, _) = start_with_badge("a_panic_press_while_the_advert_queue_is_full");
    let c = s.admin_client();
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let hearing = crate::mqtt::Hearing::start(&scanner, Duration::from_millis(200));
    wait_for("the badge in the office", || (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(()));
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let locked = std::time::Instant::now();
    // The location thread's next batch write (within a second) waits for the lock.
    std::thread::sleep(Duration::from_millis(1500));
    // Phones and other beacons, more than the queue holds; then the press, and its release.
    let others: String = (0..1000)
        .map(|i| format!("{{\"mac\":\"AA:00:00:00:{:02X}:{:02X}\",\"rssi\":-80}}\n", i / 256, i % 256))
        .collect();
    for _ in 0..12 {
        scanner.publish("acme/receivers/rx-a/adverts", &others);
    }
    for panic in [true, true, true, false, false] {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(panic));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Held for less than the service's busy timeout: its batch write goes through after.
    std::thread::sleep(Duration::from_millis(4000).saturating_sub(locked.elapsed()));
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    wait_for("the alarm of the press", || (recorded(&c, "Alarm") == 1).then_some(()));
    hearing.stop();
    assert!(s.stderr().contains("with a raised alarm flag were taken beside it"), "{}", s.stderr());
    let health = c.get_json("/health").json();
    assert!(health["location"]["remotedropped"].as_i64().unwrap_or(0) > 0, "the queue was never full: {health}");
}

/// A gateway that starts with its clock 40 days ahead (an operator's typo, a bad clock chip)
/// keeps the location history, alerts and webhook deliveries of the past days: the purges'
/// cut-off moves ahead of the last one stored by an hour at most at a start (then a day an
/// hour), and the journal says why. They were all deleted within a second of the start.
#[test]
fn a_start_with_the_clock_ahead_keeps_what_is_within_the_retention() {
    let stepped = crate::support::SteppedClock::new("alerts_clock_ahead_offset");
    let env = stepped.env();
    let (s, ann) = start_with_badge_env("alerts_clock_ahead", &config(), env.clone());
    let c = s.admin_client();
    let rx = Receiver::start();
    let body = format!(r#"{{"event": "alerts.create", "url": "{}", "contenttype": "json"}}"#, rx.url("/in"));
    let hook = c.post_json("/hooks", &body).json()["id"].as_i64().unwrap();
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    report_until(&scanner, &c, false, "Warn", 1);
    rx.wait_accepted(1);
    let deliveries = |c: &Client| c.get_json(&format!("/hooks/{hook}/deliveries")).json()["deliveries"].clone();
    wait_for("the delivery recorded", || (deliveries(&c)[0]["state"] == "delivered").then_some(()));
    let history = |c: &Client| {
        let export = c.get_json(&format!("/contacts/{ann}/locations")).json().to_string();
        export.matches("\"receiver\"").count()
    };
    wait_for("history stored", || (history(&c) > 0).then_some(()));
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop(scanner);
    assert_eq!(s.terminate(), Some(0));
    let (rows, alerts) = {
        let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
        let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
        (count("SELECT count(*) FROM locations"), count("SELECT count(*) FROM alerts"))
    };
    assert!(rows > 0 && alerts >= 2, "{rows} rows, {alerts} alerts");

    std::fs::write(&stepped.offset, format!("+{}", 40 * 86_400)).unwrap();
    let s = Service::launch(dir.clone(), cfg, &env);
    let c = s.client(&admin);
    // Both purges have run (held back, or deleting).
    wait_for("the purges", || {
        let log = s.stderr();
        let ran = |what: &str| {
            log.contains(&format!("{what} purge: the clock is")) || log.contains(&format!("{what}: forgot"))
        };
        (ran("location") && (ran("webhook deliveries") || log.contains("webhooks: forgot"))).then_some(())
    });
    assert_eq!(recorded(&c, "Warn"), 1);
    assert_eq!(recorded(&c, "Monitor"), 1);
    assert_eq!(deliveries(&c).as_array().map(Vec::len), Some(1), "{}", deliveries(&c));
    let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
    let kept: i64 = db.query_row("SELECT count(*) FROM locations", [], |r| r.get(0)).unwrap();
    assert_eq!(kept, rows, "history rows kept");
    assert!(s.stderr().contains("location purge: the clock is 959 h past"), "{}", s.stderr());
}

/// An intercom away while NTP steps the clock two hours forward still gets the alarm raised
/// meanwhile when it comes back: its session's queue is kept as long as the session, on the
/// monotonic clock. The broker aged queued messages by the wall clock, and the step expired
/// them (the session itself was kept, so the intercom had no reason to ask `GET /alerts`).
#[test]
fn an_intercom_away_while_the_clock_steps_forward_gets_the_alarm() {
    use crate::mqtt::connect_with;
    let stepped = crate::support::SteppedClock::new("alerts_queue_clock_offset");
    let (s, _) = start_with_badge_env("alerts_queue_clock", &config(), stepped.env());
    let c = s.admin_client();
    let addr = mqtt_addr(&s);
    let (scanner, pw, intercom) = scanner_and_intercom(&s);
    let connections = || s.anonymous().get_json("/health").json()["mqtt"]["connections"].as_i64();
    wait_for("the intercom subscribed", || (connections() == Some(2)).then_some(()));
    intercom.client.disconnect().unwrap();
    wait_for("the intercom gone", || (connections() == Some(1)).then_some(()));
    report_until(&scanner, &c, true, "Alarm", 1);
    std::fs::write(&stepped.offset, "+7200").unwrap();
    wait_for("the step in the journal", || s.stderr().contains("the system clock was set").then_some(()));

    let back = connect_with(addr, "intercom-1", "intercom", &pw, persistent).unwrap();
    let mut types = Vec::new();
    while let Some(p) = back.next_publish(Duration::from_secs(3)) {
        types.push(serde_json::from_slice::<Value>(&p.payload).unwrap()["type"].as_str().unwrap_or("").to_string());
    }
    assert!(types.contains(&"Alarm".to_string()), "the alarm raised while it was away: {types:?}");
}

/// A restart with the clock a day behind the last run's (a gateway without a real-time clock
/// before NTP sets it): the badge's visit of the last run keeps its length and ends; it is not
/// taken up again as if the badge had been heard a moment ago (its last sighting is after
/// "now"), which made it end where it began, lasting nothing.
#[test]
fn a_restart_with_the_clock_behind_leaves_the_last_visits_as_they_were() {
    let stepped = crate::support::SteppedClock::new("alerts_restart_behind_offset");
    let env = stepped.env();
    let (s, _) = start_with_badge_env("alerts_restart_behind", &config(), env.clone());
    let c = s.admin_client();
    let scanner_pw = mqtt_user(&s, "acme", "scanner", true);
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    report_until(&scanner, &c, false, "Warn", 1);
    // A few seconds in the office.
    for _ in 0..10 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(300));
    }
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop(scanner);
    assert_eq!(s.terminate(), Some(0));
    let db_path = dir.join("data/sitegate.db");
    let visit = |db: &rusqlite::Connection| -> (i64, Option<i64>) {
        db.query_row("SELECT enter_ms, exit_ms FROM visits ORDER BY id LIMIT 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
    };
    let (enter, exit) = visit(&rusqlite::Connection::open(&db_path).unwrap());
    let exit = exit.expect("the stop ends the visit");
    assert!(exit - enter >= 2_000, "{enter}..{exit}");

    std::fs::write(&stepped.offset, "-86400").unwrap();
    let s = Service::launch(dir, cfg, &env);
    let c = s.client(&admin);
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    wait_for("the badge in the office again", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert(false));
        std::thread::sleep(Duration::from_millis(200));
        (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(())
    });
    let db = rusqlite::Connection::open(&db_path).unwrap();
    assert_eq!(visit(&db), (enter, Some(exit)), "the last run's visit as it was");
    let open: i64 = db.query_row("SELECT count(*) FROM visits WHERE exit_ms IS NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(open, 1, "a visit of its own for the stay after the start");
}

/// A retention shortened in config.toml applies at the next start: what is older than the new
/// one goes at once (the guard against a clock set ahead holds back the clock, not the
/// retention).
#[test]
fn a_shorter_retention_applies_at_once() {
    let (s, _) = start_with_badge("alerts_shorter_retention");
    let c = s.admin_client();
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    report_until(&scanner, &c, false, "Warn", 1);
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop(scanner);
    assert_eq!(s.terminate(), Some(0));
    let db_path = dir.join("data/sitegate.db");
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let purged_by: i64 =
        db.query_row("SELECT count(*) FROM purge_clocks WHERE name = 'location'", [], |r| r.get(0)).unwrap();
    assert_eq!(purged_by, 1, "the first purge stored its time");
    // Three days of history before this one.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for h in 0..72 {
        db.execute(
            "INSERT INTO locations (device_id, t_ms, zone_id, lat, lon, receiver, rssi) VALUES (1, ?1, 22, 0, 0, 'rx-b', -60)",
            [now_ms - 3 * 86_400_000 + h * 3_600_000],
        )
        .unwrap();
    }
    drop(db);
    let config = std::fs::read_to_string(&cfg).unwrap();
    assert!(!config.contains("retention_days"), "the default, 30");
    std::fs::write(&cfg, config.replacen("[location]\n", "[location]\nretention_days = 1\n", 1)).unwrap();
    let s = Service::launch(dir, cfg, &[]);
    let _c = s.client(&admin);
    wait_for("the purge", || s.stderr().contains("location: forgot").then_some(()));
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let old: i64 =
        db.query_row("SELECT count(*) FROM locations WHERE t_ms < ?1", [now_ms - 86_400_000], |r| r.get(0)).unwrap();
    assert_eq!(old, 0, "history older than a day");
    let kept: i64 = db.query_row("SELECT count(*) FROM locations", [], |r| r.get(0)).unwrap();
    assert!(kept > 0, "this day's history kept");
}

/// A restart three minutes after the stop (an upgrade, a reboot) with a rule for badges not
/// seen for a minute: the badge, heard again as soon as its receiver is back (seconds after
/// the service), raises no "not seen" alert. Every badge last heard before the stop raised one at the start, before its
/// first advert came in.
#[test]
fn a_restart_after_minutes_raises_no_not_seen_alert() {
    let stepped = SteppedClock::new("a_restart_after_minutes_offset");
    let env = stepped.env();
    let config = format!(
        "{}\n[[alert_rules]]\nid = \"gone\"\ntype = \"warn\"\nwhen = \"not_seen\"\nminutes = 1\n",
        site_config("")
    );
    let s = Service::start_with("a_restart_after_minutes", Options { config: &config, env: env.clone() });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "contactid": {ann}"#));
    let scanner_pw = mqtt_user(&s, "acme", "scanner", true);
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    let hearing = crate::mqtt::Hearing::start(&scanner, Duration::from_millis(200));
    wait_for("the badge in the office", || (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(()));
    hearing.stop();
    let (admin, dir, cfg) = (s.admin.clone(), s.dir.clone(), s.config.clone());
    drop(scanner);
    assert_eq!(s.terminate(), Some(0));

    std::fs::write(&stepped.offset, "+180").unwrap();
    let s = Service::launch(dir, cfg, &env);
    let c = s.client(&admin);
    // The receiver comes back a few seconds after the service (its reconnect delay).
    std::thread::sleep(Duration::from_secs(3));
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &scanner_pw).unwrap();
    let hearing = crate::mqtt::Hearing::start(&scanner, Duration::from_millis(200));
    wait_for("the badge heard again", || {
        let seen = c.get_json("/devices/1").json()["device"]["lastseen"].as_str()?.to_string();
        (seen.as_str() > "").then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    hearing.stop();
    let warns = c.get_json("/alerts?all=1&type=Warn").json();
    assert_eq!(warns["alerts"]["count"], 0, "a badge heard again at once was reported unseen: {warns}");
}
