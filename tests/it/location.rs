//! Location: devices through the API and the command line, `sitegate replay` on a trace.

use expect_test::expect_file;
use serde_json::Value;

use crate::support::*;

/// A small site: one building, one floor, two zones with a receiver each, two tag types.
pub const SITE: &str = r#"
[[areas]]
id = 1
name = "Campus"

[[buildings]]
id = 10
name = "Main building"
area = 1

[[floors]]
id = 100
label = "Ground floor"
level = 0
building = 10

[[zones]]
id = 21
name = "Kitchen"
floor = 100

[[zones]]
id = 22
name = "Office"
floor = 100

[[receivers]]
id = "rx-a"
zone = 21
position = "42.500000,-90.730000"

[[receivers]]
id = "rx-b"
zone = 22
position = "42.500000,-90.729800"
rssi_offset_db = 2

[[tag_types]]
id = 1
title = "Staff badge"

[[tag_types]]
id = 2
title = "Visitor"
"#;

pub fn site_config() -> String {
    format!("{BASE_CONFIG}{SITE}")
}

const UUID: &str = "f7826da6-4fa2-4e98-8024-bc5b71e0893e";

#[test]
fn devices_through_the_api() {
    let config = site_config();
    let s = Service::start_with("devices_through_the_api", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let mut t = Transcript::new();
    let create = |t: &mut Transcript, body: &str| t.step(&c, Req::new("POST", "/devices").json().json_body(body));
    create(
        &mut t,
        &format!(r#"{{"deviceaddress": "5/1/22", "label": "Badge 22", "tagtype": 1, "beacon": "ibeacon:{UUID}/5/22", "contactid": {ann}}}"#),
    )
    .assert_status(201);
    t.step(
        &c,
        Req::new("POST", "/devices").xml_body(
            "<request><deviceaddress>5/1/23</deviceaddress><deviceid>visitor-23</deviceid><beacon>mac:aa:bb:cc:dd:ee:23</beacon></request>",
        ),
    )
    .assert_status(201);
    // Refused: each with its reason, nothing stored.
    for body in [
        r#"{"deviceaddress": "5/1", "beacon": "mac:AA:BB:CC:DD:EE:01"}"#,
        r#"{"deviceaddress": "5/1/24", "beacon": "ibeacon:nothex/1/2"}"#,
        r#"{"deviceaddress": "5/1/24", "beacon": "mac:AA:BB:CC:DD:EE:24", "tagtype": 9}"#,
        r#"{"deviceaddress": "5/1/24", "beacon": "mac:AA:BB:CC:DD:EE:24", "deviceid": "a/b"}"#,
        r#"{"deviceaddress": "5/1/24", "beacon": "mac:AA:BB:CC:DD:EE:23"}"#,
        r#"{"deviceaddress": "5/1/24", "beacon": "mac:AA:BB:CC:DD:EE:24", "contactid": 999}"#,
        r#"{"deviceaddress": "5/1/24", "beacon": "mac:AA:BB:CC:DD:EE:24", "colour": "red"}"#,
    ] {
        create(&mut t, body);
    }
    t.step(&c, Req::new("PUT", "/devices/2").json().json_body(r#"{"label": "Visitor 23", "tagtype": 2}"#))
        .assert_status(200);
    t.step(&c, Req::new("GET", "/devices").json()).assert_status(200);
    t.step(&c, Req::new("GET", "/devices/1")).assert_status(200);
    t.step(&c, Req::new("DELETE", "/devices/2").json()).assert_status(200);
    t.step(&c, Req::new("GET", "/devices/2").json()).assert_status(404);
    expect_file!["golden/devices.txt"].assert_eq(&t.text);

    // Users who are not administrators do not manage devices; other organisations see none.
    let bob = s.add_user("bob@example.com", "Bob", &[]);
    s.client(&bob).get_json("/devices").assert_status(403);
    let other = s.add_user("gus@example.com", "Gus", &["--admin", "--org", "globex"]);
    let v = s.client(&other).get_json("/devices").json();
    assert_eq!(v["count"], 0);
    s.client(&other).get_json("/devices/1").assert_status(404);

    // An address is three integers, written one way: `05/1/22` is 5/1/22, taken already.
    let r = c.post_json("/devices", r#"{"deviceaddress": "05/1/22", "beacon": "mac:AA:BB:CC:DD:EE:05"}"#);
    assert_eq!(r.status, 409, "{}", r.body);
    let r = c.post_json("/devices", r#"{"deviceaddress": "007/01/2", "beacon": "mac:AA:BB:CC:DD:EE:07"}"#);
    assert_eq!(r.json()["device"]["deviceaddress"], "7/1/2", "{}", r.body);
    let v = c.post_json("/report/timebydevice", r#"{"deviceaddress": "5/01/22"}"#).json();
    assert_eq!(v["timebydevice"]["contactid"], ann, "{v}");
}

#[test]
fn devices_from_the_command_line() {
    let config = site_config();
    let s = Service::start_with("devices_from_the_command_line", Options { config: &config, env: vec![] });
    let csv = s.dir.join("tags.csv");
    let mut text = String::from("deviceaddress,deviceid,label,tagtype,beacon,contactid\n");
    for i in 0..300 {
        text.push_str(&format!("7/1/{i},,Tag {i},1,ibeacon:{UUID}/7/{i},\n"));
    }
    std::fs::write(&csv, &text).unwrap();
    let out = s.cli(&["device", "import", csv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "imported 300 devices");
    // All or none: a file with one bad line (a duplicate) imports nothing.
    std::fs::write(
        &csv,
        "deviceaddress,beacon\n8/1/1,mac:AA:BB:CC:DD:EE:81\n\n8/1/2,ibeacon:f7826da6-4fa2-4e98-8024-bc5b71e0893e/7/5\n",
    )
    .unwrap();
    let out = s.cli(&["device", "import", csv.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    // The line in the file, blank lines counted.
    assert!(err.contains("line 4: a device with beacon") && err.contains("nothing imported"), "{err}");
    // Every line that cannot go in is named in one run, whatever is wrong with it.
    std::fs::write(
        &csv,
        format!(
            "deviceaddress,beacon,tagtype,contactid\n8/1/1,mac:AA:BB:CC:DD:EE:81,,\n8/1/2,ibeacon:{UUID}/7/5,,\n\
             8/1/3,mac:AA:BB:CC:DD:EE:83,9,\n8/1/4,mac:AA:BB:CC:DD:EE:84,,999999\n"
        ),
    )
    .unwrap();
    let out = s.cli(&["device", "import", csv.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    for line in ["line 3: a device with beacon", "line 4: tagtype 9 is not a tag type", "line 5: contactid 999999"] {
        assert!(err.contains(line), "{line}: {err}");
    }
    assert!(!err.contains("line 2:"), "{err}");
    // A column the import does not know is refused, not ignored.
    std::fs::write(&csv, "deviceaddress,beacon,contact_id\n8/1/1,mac:AA:BB:CC:DD:EE:81,1\n").unwrap();
    let out = s.cli(&["device", "import", csv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(65), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown column \"contact_id\""));
    std::fs::write(&csv, "deviceaddress,beacon\n8/1/1,mac:zz\n").unwrap();
    let out = s.cli(&["device", "import", csv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2: beacon"));
    let out = s.cli(&["device", "add", "--address", "9/9/9", "--beacon", "mac:AA:BB:CC:DD:EE:99", "--label", "Spare"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let v = s.admin_client().get_json(&format!("/devices/{id}")).json();
    assert_eq!((v["device"]["deviceid"].as_str(), v["device"]["label"].as_str()), (Some("9.9.9"), Some("Spare")));
    let list = s.cli(&["device", "list"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert_eq!(listed.lines().count(), 302, "{listed}");
    assert!(listed.contains(",acme,9/9/9,9.9.9,Spare,,mac:AA:BB:CC:DD:EE:99,"));
    let out = s.cli(&["device", "delete", "--id", &id]);
    assert!(out.status.success());
    s.admin_client().get_json(&format!("/devices/{id}")).assert_status(404);
}

/// An iBeacon advert line of the trace format.
fn advert(t_ms: i64, receiver: &str, minor: u16, rssi: i32) -> String {
    let data = format!("0215{}0005{minor:04x}c5", UUID.replace('-', ""));
    format!(
        r#"{{"t_ms":{t_ms},"receiver":"{receiver}","mac":"C0:00:00:00:00:{:02X}","rssi":{rssi},"mfg":{{"004c":"{data}"}}}}"#,
        minor & 0xff
    )
}

#[test]
fn replay_prints_zone_decisions() {
    let dir = test_dir("replay_prints_zone_decisions");
    std::fs::write(dir.join("site.toml"), SITE).unwrap();
    std::fs::write(
        dir.join("devices.csv"),
        format!("deviceaddress,deviceid,label,tagtype,beacon,contactid\n5/1/22,,Badge,1,ibeacon:{UUID}/5/22,\n"),
    )
    .unwrap();
    // In the kitchen for 30 s, in the office for 30 s, then gone. A phone and a foreign
    // beacon are heard all along; an unknown receiver too.
    let t0 = 1_763_700_000_000i64;
    let mut lines = Vec::new();
    for i in 0..120 {
        let t = t0 + i * 500;
        let (a, b) = if i < 60 { (-60, -80) } else { (-82, -61) };
        lines.push(advert(t, "rx-a", 22, a));
        lines.push(advert(t + 1, "rx-b", 22, b));
        lines.push(advert(t + 2, "rx-a", 99, -50));
        lines.push(format!(
            r#"{{"t_ms":{},"receiver":"rx-b","mac":"5A:00:00:00:00:01","rssi":-40,"mfg":{{"004c":"1005031c0e3b51"}}}}"#,
            t + 3
        ));
        lines.push(advert(t + 4, "rx-elsewhere", 22, -30));
    }
    std::fs::write(dir.join("trace.jsonl"), lines.join("\n") + "\n").unwrap();
    let out = sitegate()
        .current_dir(&dir)
        .args(["replay", "--config", "site.toml", "--trace", "trace.jsonl", "--devices", "devices.csv"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let decisions: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary: Vec<(String, i64)> =
        decisions.iter().map(|d| (d["event"].as_str().unwrap().to_string(), d["zoneid"].as_i64().unwrap())).collect();
    assert_eq!(
        summary,
        [("enter".into(), 21), ("exit".into(), 21), ("enter".into(), 22), ("exit".into(), 22)],
        "{decisions:?}"
    );
    assert!(decisions.iter().all(|d| d["deviceaddress"] == "5/1/22"));
    let t = |i: usize| decisions[i]["t_ms"].as_i64().unwrap() - t0;
    // Placed once heard for a second (adverts every 500 ms).
    assert_eq!(t(0), 1_000);
    assert!((30_000..=36_000).contains(&t(2)) && t(1) == t(2), "switch at {} ms", t(2));
    // Away: its last reading (59.501 s, by rx-b) plus the 30 s away timeout.
    assert_eq!(t(3), 59_501 + 30_000);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("replayed 600 adverts in "), "{stderr}");
    assert!(stderr.contains("120 from receivers not in the site map, 240 from unregistered devices"), "{stderr}");

    // A malformed trace names its line; exit status 65.
    std::fs::write(dir.join("bad.jsonl"), format!("{}\n{{\"t_ms\": 1}}\n", lines[0])).unwrap();
    let out = sitegate()
        .current_dir(&dir)
        .args(["replay", "--config", "site.toml", "--trace", "bad.jsonl", "--devices", "devices.csv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trace line 2"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sighup_reloads_the_site_map() {
    let config = site_config();
    let s = Service::start_with("sighup_reloads_the_site_map", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    c.post_json("/devices", &format!(r#"{{"deviceaddress": "1/1/1", "tagtype": 1, "beacon": "ibeacon:{UUID}/1/1"}}"#))
        .assert_status(201);
    let title = |c: &Client| c.get_json("/devices/1").json()["device"]["tagtypetitle"].as_str().unwrap().to_string();
    assert_eq!(title(&c), "Staff badge");
    let hup = |s: &Service| {
        let out = std::process::Command::new("kill").args(["-HUP", &s.pid().to_string()]).output().unwrap();
        assert!(out.status.success());
    };
    // A file that does not load changes nothing, and the service stays up.
    std::fs::write(&s.config, format!("{config}\n[[zones]]\nid = 21\nname = \"Twice\"\nfloor = 100\n")).unwrap();
    hup(&s);
    wait_for("the refusal in the log", || s.stderr().contains("not reloaded").then_some(()));
    assert_eq!(title(&c), "Staff badge");
    // Nor does an empty file (one half written as the signal came): it would take every zone.
    std::fs::write(&s.config, "").unwrap();
    hup(&s);
    wait_for("the refusal of an empty file", || s.stderr().contains("it has no zones").then_some(()));
    assert_eq!(title(&c), "Staff badge");
    // The same file again changes nothing, and says so: the engine goes on as it was.
    std::fs::write(&s.config, &config).unwrap();
    hup(&s);
    wait_for("the unchanged reload", || s.stderr().contains("alert rules are unchanged").then_some(()));
    assert!(!s.stderr().contains("location: the site map changed"), "{}", s.stderr());
    std::fs::write(&s.config, config.replace("Staff badge", "Employee badge")).unwrap();
    hup(&s);
    wait_for("the new tag type title", || (title(&c) == "Employee badge").then_some(()));
    wait_for("the engine started over", || s.stderr().contains("location: the site map changed").then_some(()));
    assert!(!s.stderr().contains("take effect at the next restart"), "{}", s.stderr());
    // Settings a reload does not put in force are named in the log.
    let later = format!(
        "{}\n[location]\nreceiver_silent_s = 60\n",
        config.replace("Staff badge", "Employee badge").replace("workers = 2", "workers = 3")
    );
    assert_ne!(later, config.replace("Staff badge", "Employee badge"));
    std::fs::write(&s.config, later).unwrap();
    hup(&s);
    let warning = wait_for("the settings left for a restart", || {
        s.stderr().lines().find(|l| l.contains("take effect at the next restart")).map(str::to_string)
    });
    assert!(warning.contains("http.workers, location.receiver_silent_s changed"), "{warning}");
    // Connections and data are untouched.
    assert_eq!(c.get_json("/devices").json()["count"], 1);
    // A device whose tag type the map no longer has can still be changed otherwise.
    let without = config.replace("Staff badge", "Employee badge").replace("id = 1\ntitle", "id = 7\ntitle");
    assert_ne!(without, config.replace("Staff badge", "Employee badge"));
    std::fs::write(&s.config, without).unwrap();
    hup(&s);
    wait_for("tag type 1 gone", || title(&c).is_empty().then_some(()));
    c.put_json("/devices/1", r#"{"label": "Renamed"}"#).assert_status(200);
    assert_eq!(c.put_json("/devices/1", r#"{"tagtype": 3}"#).status, 400);
}

#[test]
fn replay_into_the_database() {
    let dir = test_dir("replay_into_the_database");
    let config = dir.join("config.toml");
    // A zone's name is free text: not an XML name, and not unique.
    let hostile = "name = \"2nd Kitchen & Bar <A>\"";
    let site = site_config().replace("name = \"Kitchen\"", hostile).replace("name = \"Office\"", hostile);
    std::fs::write(&config, site).unwrap();
    let out = cli_with_config(
        &config,
        &["device", "add", "--address", "5/1/22", "--beacon", &format!("ibeacon:{UUID}/5/22")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t0 = 1_763_700_000_000i64; // 2025-11-21 04:40:00 UTC
    let mut lines = Vec::new();
    for i in 0..240 {
        let t = t0 + i * 500;
        let (a, b) = if i < 120 { (-60, -80) } else { (-82, -61) };
        lines.push(advert(t, "rx-a", 22, a));
        lines.push(advert(t + 1, "rx-b", 22, b));
    }
    std::fs::write(dir.join("trace.jsonl"), lines.join("\n") + "\n").unwrap();
    let trace = dir.join("trace.jsonl");
    let out = cli_with_config(&config, &["replay", "--trace", trace.to_str().unwrap(), "--store"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("wrote 4 zone decisions"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The service then answers from what the replay stored.
    let out = cli_with_config(
        &config,
        &["user", "add", "--email", "op@example.com", "--name", "Op", "--admin", "--org", "acme"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let account =
        Account { email: "op@example.com".into(), token: String::from_utf8_lossy(&out.stdout).trim().to_string() };
    let s = Service::launch(dir.clone(), config.clone(), &[]);
    let c = s.client(&account);
    let v =
        c.post_json("/report/timebydevice", r#"{"deviceaddress": "5/1/22", "range": "2025-11-21,2025-11-21"}"#).json();
    let minutes: Vec<(i64, i64)> = v["timebydevice"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["zoneid"].as_i64().unwrap(),
                r["minutesinzone"].as_object().unwrap().values().next().unwrap().as_i64().unwrap(),
            )
        })
        .collect();
    // Kitchen 0 to ~62 s; office to the last reading (119.5 s) plus the away timeout (30 s).
    assert_eq!(minutes, [(21, 1), (22, 1)], "{v}");
    assert_eq!(v["timebydevice"]["records"][0]["minutesinzone"]["2nd Kitchen & Bar <A> (21)"], 1, "{v}");
    let summary = c.post_json("/report/timesummary", r#"{"range": "2025-11-21,2025-11-21"}"#).json();
    let both = &summary["timesummary"]["records"][0]["minutesinzone"];
    assert_eq!(
        (both["2nd Kitchen & Bar <A> (21)"].as_i64(), both["2nd Kitchen & Bar <A> (22)"].as_i64()),
        (Some(1), Some(1)),
        "{summary}"
    );
    // In XML the zone's name is an attribute: every time-in-zone reply is well-formed XML.
    let range = r#""range": "2025-11-21,2025-11-21""#;
    for (path, body) in [
        ("/report/timebydevice", format!(r#"{{"deviceaddress": "5/1/22", {range}}}"#)),
        ("/report/timebydevice", format!(r#"{{"deviceaddress": "5/1/22", "detailed": 1, {range}}}"#)),
        ("/report/timebyzone", format!(r#"{{"zoneid": 21, {range}}}"#)),
        ("/report/timesummary", format!(r#"{{{range}}}"#)),
    ] {
        let xml = c.call(Req::new("POST", path).json_body(&body));
        assert_eq!(xml.status, 200, "{path} {body}: {}", xml.body);
        let names = zone_names_in_xml(&xml.body);
        assert!(names.iter().any(|n| n == "2nd Kitchen & Bar <A> (21)"), "{path} {body}: {names:?} in {}", xml.body);
    }
    let located = c.get_json("/locate").json();
    assert_eq!(located["records"][0]["location"]["zoneid"], 22, "{located}");
    // A zone dropped from the site map keeps its visits, shown as `zone<id>`, and can still be
    // asked for; a zone neither in the map nor in the visits is a mistake.
    let site = std::fs::read_to_string(&config).unwrap();
    let office = format!("[[zones]]\nid = 22\n{hostile}\nfloor = 100\n");
    let rx_b = "[[receivers]]\nid = \"rx-b\"\nzone = 22\nposition = \"42.500000,-90.729800\"\nrssi_offset_db = 2\n";
    assert!(site.contains(&office) && site.contains(rx_b));
    std::fs::write(&config, site.replace(&office, "").replace(rx_b, "")).unwrap();
    let out = std::process::Command::new("kill").args(["-HUP", &s.pid().to_string()]).output().unwrap();
    assert!(out.status.success());
    wait_for("the office dropped", || {
        let v = c.post_json("/report/timesummary", r#"{"range": "2025-11-21,2025-11-21"}"#).json();
        v["timesummary"]["records"][0]["minutesinzone"]["zone22"].as_i64()
    });
    let office = c.post_json("/report/timebyzone", &format!(r#"{{"zoneid": 22, {range}}}"#));
    assert_eq!(office.status, 200, "{}", office.body);
    assert_eq!(office.json()["timebyzone"]["count"], 1, "{}", office.body);
    for path in ["/report/timebyzone", "/report/timebydevice"] {
        let r = c.post_json(path, &format!(r#"{{"zoneid": 99, {range}}}"#));
        assert_eq!(r.status, 400, "{path}: {}", r.body);
    }
    // Not while the service runs on the database.
    let out = cli_with_config(&config, &["replay", "--trace", trace.to_str().unwrap(), "--store"]);
    assert_eq!(out.status.code(), Some(1), "as for restore: a state of the machine, not a wrong command line");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it before replaying"));
}

/// The site of `SITE` with a third zone between the two, without a receiver of its own,
/// and the fingerprint lines `sitegate survey` printed put into each zone.
/// The `name` attributes of the `<zone>` elements of a reply, which must be well-formed XML.
fn zone_names_in_xml(xml: &str) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut names = Vec::new();
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => return names,
            Ok(quick_xml::events::Event::Start(e)) if e.name().into_inner() == "zone" => {
                let name = e.try_get_attribute("name").unwrap().expect("a name attribute");
                names.push(name.normalized_value(quick_xml::XmlVersion::Implicit1_0).unwrap().into_owned());
            }
            Ok(_) => {}
            Err(e) => panic!("not well-formed XML at {}: {e}\n{xml}", reader.buffer_position()),
        }
    }
}

fn site_with_storage(fingerprints: &std::collections::HashMap<i64, String>) -> String {
    let storage = "\n[[zones]]\nid = 23\nname = \"Storage\"\nfloor = 100\n\n[[receivers]]";
    let mut site = SITE.replacen("\n[[receivers]]", storage, 1);
    for (zone, lines) in fingerprints {
        let at = format!("[[zones]]\nid = {zone}\n");
        site = site.replacen(&at, &format!("{at}{lines}\n"), 1);
    }
    site
}

#[test]
fn a_survey_gives_zones_fingerprints_that_place_people_where_no_receiver_is() {
    let dir = test_dir("a_survey_gives_zones_fingerprints_that_place_people_where_no_receiver_is");
    std::fs::write(dir.join("site.toml"), site_with_storage(&Default::default())).unwrap();
    std::fs::write(
        dir.join("devices.csv"),
        format!(
            "deviceaddress,deviceid,label,tagtype,beacon,contactid\n9/9/1,,Survey tag,1,ibeacon:{UUID}/5/90,\n\
             5/1/22,,Badge,1,ibeacon:{UUID}/5/22,\n"
        ),
    )
    .unwrap();
    // The survey: a minute in the kitchen, the office and the storage room, where rx-a and
    // rx-b hear the tag about equally (rx-b a little louder). Marks in both time formats.
    let t0 = 1_763_700_000_000i64;
    let levels = [(21, -60, -84), (22, -84, -60), (23, -75, -71)];
    let mut lines = Vec::new();
    for (k, (_, a, b)) in levels.iter().enumerate() {
        for i in 0..120 {
            let t = t0 + (k as i64 * 60 + i / 2) * 1_000 + (i % 2) * 500;
            let wobble = [0, 2, -1, 1, -2][(i % 5) as usize];
            lines.push(advert(t, "rx-a", 90, a + wobble));
            lines.push(advert(t + 7, "rx-b", 90, b - wobble));
        }
    }
    std::fs::write(dir.join("survey.jsonl"), lines.join("\n") + "\n").unwrap();
    std::fs::write(
        dir.join("marks.csv"),
        format!(
            "zoneid,from,until\n# the kitchen (also noted, wrongly, before the recording began), then the office\n\
             21,{},{}\n21,{t0},{}\n22,2025-11-21T04:41:00Z,2025-11-21T04:41:59Z\n23,{},{}\n",
            t0 - 600_000,
            t0 - 500_000,
            t0 + 59_999,
            t0 + 120_000,
            t0 + 179_999
        ),
    )
    .unwrap();
    let survey = |marks: &str| {
        sitegate()
            .current_dir(&dir)
            .args(["survey", "--config", "site.toml", "--trace", "survey.jsonl", "--marks", marks])
            .args(["--device", "9/9/1", "--devices", "devices.csv"])
            .output()
            .unwrap()
    };
    let out = survey("marks.csv");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    // Each zone's fingerprints, as lines to paste into its [[zones]] entry.
    let mut fingerprints = std::collections::HashMap::new();
    let mut zone = None;
    for line in printed.lines() {
        if let Some(rest) = line.strip_prefix("# zone ") {
            zone = rest.split_whitespace().next().and_then(|z| z.parse::<i64>().ok());
        } else if let Some(z) = zone.filter(|_| !line.starts_with('#')) {
            let lines: &mut String = fingerprints.entry(z).or_default();
            lines.push_str(line);
            lines.push('\n');
        }
    }
    assert_eq!(fingerprints.len(), 3, "{printed}");
    // 52 s of each one-minute mark are sampled (from one 8 s window after its start): 20 s
    // stretches (a last one under 10 s would join the one before), each a fingerprint.
    assert!(printed.contains("# zone 23 \"Storage\": 52 s sampled, 3 fingerprints"), "{printed}");
    let storage = &fingerprints[&23];
    let value = |rx: &str| -> f64 {
        let at = storage.find(&format!("\"{rx}\" = ")).unwrap_or_else(|| panic!("{storage}")) + rx.len() + 5;
        storage[at..].split([',', ' ']).next().unwrap().parse().unwrap()
    };
    // rx-b's offset (2 dB) is part of the calibrated signal.
    assert!((value("rx-a") + 75.0).abs() <= 1.0 && (value("rx-b") + 69.0).abs() <= 1.0, "{storage}");

    // A badge walks kitchen, storage, office. With the fingerprints the engine places it in the
    // storage room; with only receivers it cannot (the office's rx-b is the strongest there).
    let mut walk = Vec::new();
    for i in 0..240 {
        let t = t0 + 1_000_000 + i * 500;
        let (a, b) = match i {
            0..60 => (-61, -83),
            60..180 => (-74, -72),
            _ => (-83, -61),
        };
        walk.push(advert(t, "rx-a", 22, a));
        walk.push(advert(t + 3, "rx-b", 22, b));
    }
    std::fs::write(dir.join("walk.jsonl"), walk.join("\n") + "\n").unwrap();
    let zones_entered = |site: &str| -> Vec<i64> {
        let out = sitegate()
            .current_dir(&dir)
            .args(["replay", "--config", site, "--trace", "walk.jsonl", "--devices", "devices.csv"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|d| d["event"] == "enter")
            .map(|d| d["zoneid"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(zones_entered("site.toml"), [21, 22]);
    std::fs::write(dir.join("surveyed.toml"), site_with_storage(&fingerprints)).unwrap();
    assert_eq!(zones_entered("surveyed.toml"), [21, 23, 22]);
    // check-config accepts the surveyed site map and writes it back whole.
    let out = sitegate().current_dir(&dir).args(["check-config", "--config", "surveyed.toml"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(dir.join("rewritten.toml"), &out.stdout).unwrap();
    assert_eq!(zones_entered("rewritten.toml"), [21, 23, 22]);

    // Fingerprints for some zones only: refused, naming the zone that has none.
    let mut partial = fingerprints.clone();
    partial.remove(&22);
    std::fs::write(dir.join("partial.toml"), site_with_storage(&partial)).unwrap();
    let out = sitegate().current_dir(&dir).args(["check-config", "--config", "partial.toml"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("zones[1].fingerprints"), "{stderr}");
    // A fingerprint naming a receiver the site map does not have: refused.
    std::fs::write(dir.join("unknown.toml"), site_with_storage(&fingerprints).replacen("\"rx-a\" =", "\"rx-z\" =", 1))
        .unwrap();
    let out = sitegate().current_dir(&dir).args(["check-config", "--config", "unknown.toml"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("\"rx-z\" is not the id of a [[receivers]] entry"), "{stderr}");
    // Marks naming a zone the site map does not have: refused with the line, status 65.
    std::fs::write(dir.join("bad-marks.csv"), format!("21,{t0},{}\n99,{t0},{}\n", t0 + 1_000, t0 + 1_000)).unwrap();
    let out = survey("bad-marks.csv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{stderr}");
    assert!(stderr.contains("line 2: \"99\" is not the id of a zone"), "{stderr}");

    // Marks in local time of the site (Berlin: an hour ahead of UTC in November) give the same
    // fingerprints; taken as local times of a UTC site they miss the walk by an hour: refused.
    let berlin = site_with_storage(&Default::default()) + "\n[site]\ntimezone = \"Europe/Berlin\"\n";
    std::fs::write(dir.join("berlin.toml"), berlin).unwrap();
    std::fs::write(
        dir.join("local-marks.csv"),
        "21,2025-11-21 05:40:00,2025-11-21 05:40:59\n22,2025-11-21 05:41:00,2025-11-21 05:41:59\n\
         23,2025-11-21 05:42:00,2025-11-21 05:42:59\n",
    )
    .unwrap();
    let survey_with = |site: &str, marks: &str| {
        sitegate()
            .current_dir(&dir)
            .args(["survey", "--config", site, "--trace", "survey.jsonl", "--marks", marks])
            .args(["--device", "9/9/1", "--devices", "devices.csv"])
            .output()
            .unwrap()
    };
    let out = survey_with("berlin.toml", "local-marks.csv");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(local.contains("# zone 23 \"Storage\": 52 s sampled, 3 fingerprints"), "{local}");
    let out = survey_with("site.toml", "local-marks.csv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{stderr}");
    assert!(
        stderr.contains("no zone got a fingerprint") && stderr.contains("local times of the site, UTC"),
        "{stderr}"
    );
}

#[test]
fn check_config_keeps_the_walking_graph_and_refuses_a_broken_one() {
    let dir = test_dir("check_config_keeps_the_walking_graph_and_refuses_a_broken_one");
    let check = |name: &str, site: String| {
        std::fs::write(dir.join(name), site).unwrap();
        sitegate().current_dir(&dir).args(["check-config", "--config", name]).output().unwrap()
    };
    let kitchen = "[[zones]]\nid = 21\nname = \"Kitchen\"\nfloor = 100\n";
    // The kitchen opens onto the office and the storage room; the office lists nothing.
    let out = check(
        "graph.toml",
        site_with_storage(&Default::default()).replacen(kitchen, &format!("{kitchen}adjacent = [22, 23]\n"), 1),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Written back resolved: every zone lists its neighbours, both ways.
    let written = String::from_utf8_lossy(&out.stdout);
    let written: toml::Table = toml::from_str(&written).unwrap();
    let zone_adjacent = |id: i64| -> Vec<i64> {
        let zones = written["zones"].as_array().unwrap();
        let zone = zones.iter().find(|z| z["id"].as_integer() == Some(id)).unwrap();
        zone.get("adjacent")
            .and_then(|a| a.as_array())
            .map_or(Vec::new(), |a| a.iter().filter_map(|v| v.as_integer()).collect())
    };
    assert_eq!(zone_adjacent(21), [22, 23]);
    assert_eq!(zone_adjacent(22), [21]);
    assert_eq!(zone_adjacent(23), [21]);
    // An unknown zone, and the zone itself: refused, naming the entry.
    for (list, error) in [
        ("[22, 99]", "`zones[0].adjacent[1]`: is not the id of a [[zones]] entry"),
        ("[21]", "`zones[0].adjacent[0]`: is the zone itself"),
    ] {
        let out = check("bad.toml", SITE.replacen(kitchen, &format!("{kitchen}adjacent = {list}\n"), 1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(error), "{list}: {stderr}");
    }
}

/// Four administrators change different keys of one device at once (its label, the person
/// it is given to, its tag type, its topic id): all four answer 200 and every change stays.
/// The keys a PUT leaves out used to be written back as they were read, so one change undid
/// another (a badge went back to its former holder); later, with more than two at once, most
/// answered 503 (each re-read the device without the change still in the open commit).
#[test]
fn concurrent_changes_of_one_device_keep_each_other() {
    let config = site_config().replace("workers = 2", "workers = 8");
    let s = Service::start_with("concurrent_device_changes", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let ben = c.create("contacts", r#"{"firstname": "Ben"}"#);
    c.post_json("/devices", &format!(r#"{{"deviceaddress": "5/1/22", "beacon": "ibeacon:{UUID}/5/22"}}"#))
        .assert_status(201);
    for round in 0..40 {
        let contact = if round % 2 == 0 { ann } else { ben };
        let tagtype = 1 + round % 2;
        let changes = [
            format!(r#"{{"label": "Badge {round}"}}"#),
            format!(r#"{{"contactid": {contact}}}"#),
            format!(r#"{{"tagtype": {tagtype}}}"#),
            format!(r#"{{"deviceid": "badge-{round}"}}"#),
        ];
        std::thread::scope(|scope| {
            for change in &changes {
                let c = s.admin_client();
                scope.spawn(move || c.put_json("/devices/1", change).assert_status(200).status);
            }
        });
        let d = c.get_json("/devices/1").json();
        assert_eq!(d["device"]["label"], format!("Badge {round}"), "round {round}: {d}");
        assert_eq!(d["device"]["contactid"], contact, "round {round}: {d}");
        assert_eq!(d["device"]["tagtype"], tagtype, "round {round}: {d}");
        assert_eq!(d["device"]["deviceid"], format!("badge-{round}"), "round {round}: {d}");
    }
}

/// What is older than `retention_days` goes, however much of it there is: location history,
/// visits and alerts, in short batches until none is left (alerts went at most 2,000 an
/// hour, fewer than a site with many tags and a short `repeat_s` raises).
#[test]
fn old_location_data_and_alerts_are_purged_at_any_volume() {
    let config = site_config();
    let s = Service::start_with("old_location_data_purged", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    c.post_json("/devices", &format!(r#"{{"deviceaddress": "5/1/22", "beacon": "ibeacon:{UUID}/5/22"}}"#))
        .assert_status(201);
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));
    let db = dir.join("data/sitegate.db");
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let old = now_ms - 40 * 86_400_000;
    {
        let mut conn = rusqlite::Connection::open(&db).unwrap();
        let tx = conn.transaction().unwrap();
        for i in 0..12_000i64 {
            let t = if i < 11_990 { old + i } else { now_ms - i };
            tx.execute(
                "INSERT INTO alerts (org, rule, type, device_id, text, value, units, t_ms)
                 VALUES ('acme', 'battery', 'Monitor', 1, 'Battery low', '2.1', 'V', ?1)",
                [t],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO locations (device_id, t_ms, zone_id, lat, lon, receiver, rssi)
                 VALUES (1, ?1, 21, 0, 0, 'rx-a', -60)",
                [t],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let s = Service::launch(dir, cfg, &[]);
    let count = |sql: &str| -> i64 {
        let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    };
    wait_for("old alerts and history purged", || {
        (count("SELECT count(*) FROM alerts") == 10 && count("SELECT count(*) FROM locations") == 10).then_some(())
    });
    wait_for("the purge logged", || s.stderr().contains("forgot 11990 history rows and 11990 alerts").then_some(()));
}

/// The service with the MQTT tests' site map, Ann Lee and her badge, which a remote receiver
/// hears every 100 ms, placed in the office for two seconds: (service, Ann's id, the receiver,
/// its hearing).
fn ann_heard_in_the_office(name: &str) -> (Service, i64, crate::mqtt::Mqtt, crate::mqtt::Hearing) {
    use crate::mqtt::{add_badge, connect, mqtt_addr, mqtt_user};
    let config = crate::mqtt::site_config("");
    let s = Service::start_with(name, Options { config: &config, env: vec![] });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "contactid": {ann}"#));
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let hearing = crate::mqtt::Hearing::start(&scanner, std::time::Duration::from_millis(100));
    wait_for("the badge in the office", || (c.get_json("/devices/1").json()["device"]["zoneid"] == 22).then_some(()));
    std::thread::sleep(std::time::Duration::from_secs(2));
    (s, ann, scanner, hearing)
}

/// Forgetting a contact's location data while her badge is heard leaves nothing from before
/// the purge: what the location thread decided just before it, written after it in the
/// once-a-second batch, brought history rows (and visits) from before the purge back.
#[test]
fn a_purge_while_the_badge_is_heard_leaves_nothing_from_before_it() {
    use std::time::Duration;

    let (s, ann, _scanner, hearing) =
        ann_heard_in_the_office("a_purge_while_the_badge_is_heard_leaves_nothing_from_before_it");
    let c = s.admin_client();
    let db = s.dir.join("data/sitegate.db");
    let now_ms = || {
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
    };
    let mut failed = Vec::new();
    for i in 0..10 {
        let purge_ms = now_ms();
        c.delete(&format!("/contacts/{ann}/locations")).assert_status(200);
        std::thread::sleep(Duration::from_millis(2500));
        let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let count = |sql: &str| -> i64 { conn.query_row(sql, [purge_ms], |r| r.get(0)).unwrap() };
        let rows = count("SELECT count(*) FROM locations WHERE t_ms < ?1");
        let visits = count("SELECT count(*) FROM visits WHERE enter_ms < ?1");
        if rows + visits > 0 {
            failed.push((i, rows, visits));
        }
    }
    hearing.stop();
    assert!(failed.is_empty(), "purges after which history (rows, visits) from before them came back: {failed:?}");
    // The badge is still placed and recorded from the last purge on.
    let history = c.get_json(&format!("/contacts/{ann}/locations")).json();
    assert_eq!(c.get_json("/devices/1").json()["device"]["zoneid"], 22, "{history}");
}

/// A badge handed from one person to another takes no one's past with it: what was recorded
/// while Ann held it stays hers (her export, her purge, the reports under her name), and
/// Carl's starts when he is given it. Erasing a person takes where she was with her; a device
/// whose contact was deleted can still be changed.
#[test]
fn a_badge_handed_on_keeps_each_holders_history_apart() {
    use std::time::Duration;

    let (s, ann, _scanner, hearing) = ann_heard_in_the_office("a_badge_handed_on_keeps_each_holders_history_apart");
    let c = s.admin_client();
    let carl = c.create("contacts", r#"{"firstname": "Carl", "lastname": "Berg"}"#);
    let export = |contact: i64| -> (usize, usize) {
        let v = c.get_json(&format!("/contacts/{contact}/locations")).json();
        let devices = v["devices"].as_array().cloned().unwrap_or_default();
        let n = |key: &str| devices.iter().map(|d| d[key].as_array().map_or(0, Vec::len)).sum();
        (n("history"), n("visits"))
    };
    let (ann_rows, ann_visits) = export(ann);
    assert!(
        ann_rows > 0 && ann_visits == 1,
        "Ann's history while she holds the badge: {ann_rows} rows, {ann_visits} visits"
    );

    c.put_json("/devices/1", &format!(r#"{{"contactid": {carl}}}"#)).assert_status(200);
    std::thread::sleep(Duration::from_secs(2));
    let (carl_rows, carl_visits) = export(carl);
    assert!(carl_visits == 1 && carl_rows > 0, "Carl's own: {carl_rows} rows, {carl_visits} visits");
    let (rows, visits) = export(ann);
    assert!(rows >= ann_rows && visits == 1, "Ann's stays hers: {rows} rows, {visits} visits");

    // The report: one entry per holder; the device asked for by address is its holder's now.
    let report = c.post_json("/report/timebydevice", "{}").json();
    let holders: Vec<i64> = report["timebydevice"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"))
        .iter()
        .filter_map(|d| d["contactid"].as_i64())
        .collect();
    assert_eq!(holders, [ann, carl], "{report}");
    let one = c.post_json("/report/timebydevice", r#"{"deviceaddress": "5/1/22", "detailed": 1}"#).json();
    assert_eq!(one["timebydevice"]["contactid"], carl, "{one}");
    assert_eq!(one["timebydevice"]["count"], 1, "Carl's visit only: {one}");

    // Ann's data forgotten: Carl's stays.
    c.delete(&format!("/contacts/{ann}/locations")).assert_status(200);
    assert_eq!(export(ann), (0, 0));
    assert!(export(carl).1 == 1);

    // Carl deleted: his badge can still be relabelled. Erased: where he was goes with him.
    c.delete(&format!("/contacts/{carl}")).assert_status(200);
    c.put_json("/devices/1", r#"{"label": "spare badge"}"#).assert_status(200);
    let out = s.cli(&["erase", "--type", "contacts", "--id", &carl.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_secs(2));
    hearing.stop();
    let db = rusqlite::Connection::open_with_flags(
        s.dir.join("data/sitegate.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let left: (i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM visits WHERE contact_id = ?1), (SELECT count(*) FROM locations WHERE contact_id = ?1)",
            [carl],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(left, (0, 0), "Carl's visits and history after his erase");
    let open: i64 = db.query_row("SELECT count(*) FROM visits WHERE exit_ms IS NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(open, 1, "the badge's stay goes on as no one's");
    assert_eq!(c.get_json("/devices/1").json()["device"]["zoneid"], 22);
}

/// Reports over stored visits (written into the database while the service is stopped, at
/// the times they are about): a plain end date is the whole local day, 25 hours on the day
/// the clocks go back; a report that would read more visits than it may is refused, not cut
/// short, and one narrowed to a device reads that device's only; groups that `min` leaves
/// empty are not listed.
#[test]
fn reports_count_local_days_and_refuse_rather_than_cut() {
    let dir = test_dir("reports_count_local_days_and_refuse_rather_than_cut");
    let config = dir.join("config.toml");
    let berlin = site_config().replace("timezone = \"UTC\"", "timezone = \"Europe/Berlin\"");
    // Kept as long as may be: the visits are of earlier this year.
    std::fs::write(&config, format!("{berlin}\n[location]\nretention_days = 3650\n")).unwrap();
    for (address, minor) in [("5/1/22", 22), ("5/1/23", 23)] {
        let beacon = format!("ibeacon:{UUID}/5/{minor}");
        let out = cli_with_config(&config, &["device", "add", "--address", address, "--beacon", &beacon]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = cli_with_config(
        &config,
        &["user", "add", "--email", "op@example.com", "--name", "Op", "--admin", "--org", "acme"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let account =
        Account { email: "op@example.com".into(), token: String::from_utf8_lossy(&out.stdout).trim().to_string() };
    {
        let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
        db.execute_batch("BEGIN").unwrap();
        // 5/1/22 in zone 21 from 22:00 to midnight (CET) on 2026-10-25, when the clocks went back.
        db.execute(
            "INSERT INTO visits (device_id, zone_id, enter_ms, exit_ms) VALUES (1, 21, ?1, ?2)",
            [1_792_962_000_000i64, 1_792_969_200_000],
        )
        .unwrap();
        // 5/1/23: more short visits in January than a report may read.
        let mut insert =
            db.prepare("INSERT INTO visits (device_id, zone_id, enter_ms, exit_ms) VALUES (2, 22, ?1, ?2)").unwrap();
        let jan = 1_767_261_600_000i64; // 2026-01-01 10:00 UTC
        for i in 0..200_001i64 {
            insert.execute([jan + i * 10_000, jan + i * 10_000 + 5_000]).unwrap();
        }
        drop(insert);
        db.execute_batch("COMMIT").unwrap();
    }
    let s = Service::launch(dir, config, &[]);
    let c = s.client(&account);
    let day = c.post_json("/report/timebydevice", r#"{"deviceaddress": "5/1/22", "range": "2026-10-25,2026-10-25"}"#);
    let v = day.json();
    assert_eq!(v["timebydevice"]["records"][0]["minutesinzone"]["Kitchen"], 120, "{v}");
    // The year: too many visits of 5/1/23 for one report; 5/1/22's own are read.
    let year = r#""range": "2026-01-01,2026-12-31""#;
    let all = c.post_json("/report/timebyzone", &format!("{{{year}}}"));
    assert_eq!(all.status, 413, "{}", all.body);
    assert!(all.body.contains("replytoolarge"), "{}", all.body);
    let one = c.post_json("/report/timebydevice", &format!(r#"{{"deviceaddress": "5/1/22", {year}}}"#)).json();
    assert_eq!(one["timebydevice"]["records"][0]["minutesinzone"]["Kitchen"], 120, "{one}");
    let zone = c.post_json("/report/timebyzone", &format!(r#"{{"zoneid": 21, {year}}}"#)).json();
    assert_eq!(zone["timebyzone"]["count"], 1, "{zone}");
    // October: 5/1/22's two hours; a `min` above them leaves no group.
    let october = r#""range": "2026-10-01,2026-10-31""#;
    let listed = c.post_json("/report/timebyzone", &format!("{{{october}}}")).json();
    assert_eq!(listed["timebyzone"].as_array().map(Vec::len), Some(1), "{listed}");
    let none = c.post_json("/report/timebyzone", &format!(r#"{{"min": 121, {october}}}"#)).json();
    assert_eq!(none["timebyzone"].as_array().map(Vec::len), Some(0), "{none}");
    let none = c.post_json("/report/timebydevice", &format!(r#"{{"min": 121, {october}}}"#)).json();
    assert_eq!(none["timebydevice"].as_array().map(Vec::len), Some(0), "{none}");
}
