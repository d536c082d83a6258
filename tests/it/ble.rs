//! The live BLE path end to end: the real binary scans through btleplug, bluez-async and
//! libdbus against a BlueZ mock on a private D-Bus system bus (tests/ble), and the location API
//! shows what it heard. `tests/ble/setup.sh` installs what the mock needs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, OnceLock};

use expect_test::expect_file;
use serde_json::{Value, json};

use crate::location::SITE;
use crate::support::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs tests/ble/setup.sh once; returns the venv's python.
fn python() -> PathBuf {
    static READY: OnceLock<PathBuf> = OnceLock::new();
    READY
        .get_or_init(|| {
            let out = Command::new("bash").arg(repo().join("tests/ble/setup.sh")).output().expect("run setup.sh");
            assert!(out.status.success(), "tests/ble/setup.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
            let venv = std::env::var("SITEGATE_BLE_VENV")
                .map(PathBuf::from)
                .unwrap_or_else(|_| repo().join("target/ble-venv"));
            let venv = if venv.is_absolute() { venv } else { repo().join(venv) };
            venv.join("bin/python")
        })
        .clone()
}

/// The BlueZ mock on its own bus, driven line by line.
struct MockBus {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    address: String,
    _dir: PathBuf,
}

impl MockBus {
    fn start(name: &str) -> MockBus {
        // A short directory: unix socket paths are limited to 107 bytes.
        let dir = std::env::temp_dir().join(format!("sgble-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(python())
            .arg(repo().join("tests/ble/mockbus.py"))
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mockbus.py");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let address =
            line.trim().strip_prefix("address ").unwrap_or_else(|| panic!("mockbus said {line:?}")).to_string();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        MockBus { child, stdin, stdout, address, _dir: dir }
    }

    /// Sends one command; returns the answer line.
    fn send(&mut self, command: Value) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    #[track_caller]
    fn ok(&mut self, command: Value) {
        let answer = self.send(command.clone());
        assert!(answer.starts_with("ok"), "{command} -> {answer}");
    }

    fn wait_discovering(&mut self) {
        self.ok(json!({"wait": {"discovering": true, "timeout": 60}}));
    }
}

impl Drop for MockBus {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"quit": true}));
        let _ = self.child.wait();
    }
}

const UUID: &str = "f7826da64fa24e988024bc5b71e0893e";

fn ibeacon(mac: &str, minor: u16, rssi: i32) -> Value {
    json!({"mac": mac, "rssi": rssi, "mfg": {"004c": format!("0215{UUID}0005{minor:04x}c5")}})
}

fn config() -> String {
    let site = SITE.replace("id = \"rx-a\"", "id = \"hci0\"");
    format!("{BASE_CONFIG}\n[location]\nscan_watchdog_s = 5\naway_timeout_ms = 4000\nupdate_interval_ms = 1000\n{site}")
}

#[test]
fn adverts_from_bluez_locate_devices() {
    let mut bus = MockBus::start("locate");
    let config = config();
    let s = Service::start_with(
        "adverts_from_bluez_locate_devices",
        Options { config: &config, env: vec![("DBUS_SYSTEM_BUS_ADDRESS", bus.address.as_str())] },
    );
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let badge = format!(
        r#"{{"deviceaddress": "5/1/22", "label": "Badge", "tagtype": 1, "beacon": "ibeacon:{UUID}/5/22", "contactid": {ann}}}"#
    );
    c.post_json("/devices", &badge).assert_status(201);
    let eddy =
        r#"{"deviceaddress": "5/1/23", "label": "Eddy", "beacon": "eddystone:edd5f3b6f0e1a40c9b2a/000102030405"}"#;
    c.post_json("/devices", eddy).assert_status(201);
    bus.wait_discovering();

    // The badge, an Eddystone tag (identity and battery frames in turn), and a phone nobody
    // registered, a round every 300 ms until the engine (which picks new devices up within
    // a second) has located them. The Eddystone tag only once the badge is placed, so that
    // the badge's visit is always the first.
    let uid = "00e7edd5f3b6f0e1a40c9b2a0001020304050000";
    let tlm = "20000b8617000000000a00000064";
    let mut round = 0;
    let mut pump = |bus: &mut MockBus, eddy: bool| {
        round += 1;
        let mut adverts = vec![
            ibeacon("C0:00:00:00:00:22", 22, -58 - round % 4),
            json!({"mac": "5A:11:22:33:44:55", "rssi": -40, "mfg": {"004c": "1005031c0e3b51"}}),
        ];
        if eddy {
            adverts.push(json!({"mac": "C0:00:00:00:00:23", "rssi": -66, "svc": {"feaa": if round % 2 == 0 { uid } else { tlm }}}));
        }
        bus.ok(json!({ "adverts": adverts }));
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    let located = wait_for("the badge located in the kitchen", || {
        pump(&mut bus, false);
        let v = c.get_json("/locate?searchvalue=ann").json();
        (v["count"] == 1 && v["records"][0]["location"]["zoneid"] == 21).then_some(v)
    });
    // Its battery, and the tag placed (once heard for a second).
    wait_for("the Eddystone tag's battery", || {
        pump(&mut bus, true);
        let v = c.get_json("/report/battery").json();
        let rec = v["battery"]["records"].as_array()?.iter().find(|r| r["deviceaddress"] == "5/1/23")?.clone();
        let placed = c.get_json("/devices/2").json()["device"]["zoneid"] == 21;
        (rec["battery"] == "2.95" && rec["unit"] == "V" && placed).then_some(())
    });
    let record = &located["records"][0];
    assert_eq!((record["contactid"].as_i64(), record["deviceaddress"].as_str()), (Some(ann), Some("5/1/22")));
    assert_eq!(record["location"]["zonename"], "Kitchen");
    assert_eq!(record["location"]["source"], "ble");
    assert_eq!(record["location"]["position"], "42.500000,-90.730000");
    assert!(record["distancemeters"].is_null(), "every record has it; null with nothing to measure from: {record}");
    // By tag type title, and by contact id, the same device.
    assert_eq!(c.get_json("/locate?searchvalue=Staff%20badge").json()["count"], 1);
    assert_eq!(
        c.get_json(&format!("/locate?searchvalue={ann}&historyminutes=10")).json()["records"][0]["history"][0]["zoneid"],
        21
    );
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(health["location"]["scan"], "scanning", "{health}");
    assert!(health["location"]["adverts"].as_i64().unwrap() >= 3, "{health}");
    let metrics = s.anonymous().get("/metrics").body;
    assert!(metrics.contains("sitegate_ble_scanning 1"), "{metrics}");
    let seen = c.get_json("/lastseen").json();
    assert_eq!(seen["lastseen"]["count"], 2);
    assert!(
        seen["lastseen"]["records"].as_array().unwrap().iter().all(|r| !r["timestamp"].as_str().unwrap().is_empty())
    );

    // Silence: after the away timeout the badge has left; its visit is closed and counted.
    wait_for("the badge gone", || {
        let v = c.get_json("/devices/1").json();
        v["device"]["zoneid"].is_null().then_some(())
    });
    let v = c.post_json("/report/timebydevice", r#"{"deviceaddress": "5/1/22", "detailed": 1}"#).json();
    let t = &v["timebydevice"];
    assert_eq!((t["contactid"].as_i64(), t["count"].as_i64()), (Some(ann), Some(1)), "{v}");
    assert_eq!(t["records"][0]["zoneid"], 21);
    assert!(!t["records"][0]["exit"].as_str().unwrap().is_empty());
    // Time by tag type in some zones: ids comma-separated in a query or a body, or an array.
    let kitchen_minutes =
        |v: serde_json::Value| v["timesummary"]["records"][0]["minutesinzone"].get("Kitchen").cloned();
    assert!(kitchen_minutes(c.get_json("/report/timesummary?type=1&zones=22,%2021").json()).is_some());
    assert!(kitchen_minutes(c.post_json("/report/timesummary", r#"{"type": 1, "zones": "21,22"}"#).json()).is_some());
    assert!(kitchen_minutes(c.post_json("/report/timesummary", r#"{"type": 1, "zones": [21]}"#).json()).is_some());
    assert!(kitchen_minutes(c.get_json("/report/timesummary?type=1&zones=22").json()).is_none());
    assert_eq!(c.get_json("/report/timesummary?zones=21,x").status, 400);

    // The shapes of the location API, golden (local times redacted).
    let local = regex::Regex::new(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d").unwrap();
    let mut t = Transcript::new();
    t.step(
        &c,
        Req::new("GET", "/locate?searchvalue=Ann%20L&relativedeviceaddress=5/1/22&lastreportedwithin=60").json(),
    );
    t.step(&c, Req::new("POST", "/report/timebydevice").json().json_body(r#"{"deviceaddress": "5/1/22"}"#));
    t.step(&c, Req::new("POST", "/report/timebyzone").json().json_body(r#"{"zoneid": 21, "detailed": 1}"#));
    t.step(&c, Req::new("POST", "/report/timesummary").json().json_body(r#"{"type": 1}"#));
    t.step(
        &c,
        Req::new("POST", "/report/timebyzone").xml_body("<request><range>2026-11-22,2026-11-21</range></request>"),
    );
    t.step(&c, Req::new("GET", "/report/lastseen"));
    t.step(&c, Req::new("GET", "/battery").json());
    // The quota counts depend on how long the waits above took.
    let calls = regex::Regex::new(r"Api-Call-Limit: \d+/").unwrap();
    let text = local.replace_all(&t.text, "[LOCAL]");
    expect_file!["golden/location.txt"].assert_eq(&calls.replace_all(&text, "Api-Call-Limit: [N]/"));

    // A person's location data: exported, then forgotten.
    let export = c.get_json(&format!("/contacts/{ann}/locations")).json();
    assert!(!export["devices"][0]["history"].as_array().unwrap().is_empty(), "{export}");
    assert_eq!(export["devices"][0]["visits"].as_array().unwrap().len(), 1);
    let purged = c.delete(&format!("/contacts/{ann}/locations"));
    assert_eq!(purged.status, 200);
    let export = c.get_json(&format!("/contacts/{ann}/locations")).json();
    assert_eq!(export["devices"][0]["history"], json!([]));
    assert_eq!(export["devices"][0]["visits"], json!([]));
    assert_eq!(c.get_json("/locate?searchvalue=ann").json()["count"], 0);

    // The adapter is switched off and on: scanning starts again by itself.
    bus.ok(json!({"power": false}));
    bus.ok(json!({"power": true}));
    bus.wait_discovering();
    wait_for("the badge back after a power cycle", || {
        // Heard for a moment, as a badge is, before it is placed.
        bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -55)}));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let v = c.get_json("/devices/1").json();
        (v["device"]["zoneid"] == 21).then_some(())
    });

    // bluetoothd dies and comes back: the scan watchdog notices the silence and scans again.
    bus.ok(json!({"restart": {"mode": "crash", "down_ms": 500}}));
    bus.wait_discovering();
    bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -57)}));
    let before = c.get_json("/devices/1").json()["device"]["lastseen"].as_str().unwrap().to_string();
    wait_for("adverts after a bluetoothd restart", || {
        bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -57)}));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let v = c.get_json("/devices/1").json();
        (v["device"]["lastseen"].as_str() != Some(before.as_str())).then_some(())
    });
    drop(s);
}

#[test]
fn record_writes_what_the_adapter_hears() {
    let mut bus = MockBus::start("record");
    let dir = test_dir("record_writes_what_the_adapter_hears");
    std::fs::write(dir.join("config.toml"), BASE_CONFIG).unwrap();
    let mut child = sitegate()
        .current_dir(&dir)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .args(["record", "--config", "config.toml", "--out", "trace.jsonl", "--seconds", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    bus.wait_discovering();
    let uid = "00e7edd5f3b6f0e1a40c9b2a0001020304050000";
    for i in 0..5 {
        bus.ok(json!({"adverts": [
            ibeacon("C0:00:00:00:00:22", 22, -60 - i),
            {"mac": "C0:00:00:00:00:23", "rssi": -70, "svc": {"feaa": uid}},
        ]}));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Each advert is a line as it arrives (the file is line-buffered).
    let lines = wait_for("ten recorded adverts", || {
        let text = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default();
        (text.lines().count() >= 10).then_some(text)
    });
    let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let adverts: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let badge: Vec<&Value> = adverts.iter().filter(|a| a["mac"] == "C0:00:00:00:00:22").collect();
    assert_eq!(badge.len(), 5, "{lines}");
    assert!(badge.iter().all(|a| a["receiver"] == "hci0" && a["mfg"]["004c"] == format!("0215{UUID}00050016c5")));
    assert_eq!(badge.iter().map(|a| a["rssi"].as_i64().unwrap()).collect::<Vec<_>>(), [-60, -61, -62, -63, -64]);
    let eddy = adverts.iter().find(|a| a["mac"] == "C0:00:00:00:00:23").unwrap();
    assert_eq!(eddy["svc"]["feaa"], uid);
    let times: Vec<i64> = adverts.iter().map(|a| a["t_ms"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "stamped on arrival, in order: {times:?}");
}

/// Device property reads (`GetAll` on a device) the mock has answered so far.
fn device_reads(bus: &mut MockBus) -> i64 {
    let answer = bus.send(json!({"status": true}));
    let state: Value = serde_json::from_str(answer.strip_prefix("ok ").unwrap_or(&answer)).unwrap();
    state["device_reads"].as_i64().unwrap_or_else(|| panic!("status: {answer}"))
}

/// Adverts of devices the adapter knows are read from BlueZ's signals alone: no D-Bus round
/// trip for each (which set the pace of a busy site and let a flood fall behind), each advert
/// still whole, with its own RSSI and data, in the order heard.
#[test]
fn adverts_of_known_devices_are_read_without_a_round_trip_each() {
    let mut bus = MockBus::start("signals");
    let dir = test_dir("adverts_of_known_devices_are_read_without_a_round_trip_each");
    let mut child = sitegate()
        .current_dir(&dir)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .args(["record", "--out", "trace.jsonl", "--seconds", "120"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    bus.wait_discovering();
    let macs: Vec<String> = (0..20).map(|i| format!("C2:00:00:00:00:{i:02X}")).collect();
    let recorded = |n: usize| {
        wait_for(&format!("{n} recorded adverts"), || {
            let text = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default();
            (text.lines().count() >= n).then_some(text)
        })
    };
    // First sight of each: its properties are read once.
    bus.ok(json!({"adverts": macs.iter().enumerate().map(|(i, m)| ibeacon(m, i as u16, -50)).collect::<Vec<_>>()}));
    recorded(macs.len());
    let reads_at_first_sight = device_reads(&mut bus);
    assert!(reads_at_first_sight >= 1, "the first sight of a device reads its properties");
    for round in 0..10 {
        bus.ok(json!({"adverts": macs.iter().enumerate().map(|(i, m)| ibeacon(m, i as u16, -60 - round)).collect::<Vec<_>>()}));
    }
    let text = recorded(macs.len() * 11);
    let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    assert!(child.wait().unwrap().success());
    assert_eq!(device_reads(&mut bus) - reads_at_first_sight, 0, "property reads for 200 adverts of known devices");
    let adverts: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(adverts.len(), macs.len() * 11, "{text}");
    for (i, mac) in macs.iter().enumerate() {
        let heard: Vec<&Value> = adverts.iter().filter(|a| a["mac"] == mac.as_str()).collect();
        let rssi: Vec<i64> = heard.iter().map(|a| a["rssi"].as_i64().unwrap()).collect();
        assert_eq!(rssi, [-50, -60, -61, -62, -63, -64, -65, -66, -67, -68, -69], "{mac}");
        let data = format!("0215{UUID}0005{i:04x}c5");
        assert!(heard.iter().all(|a| a["mfg"]["004c"] == data.as_str() && a["receiver"] == "hci0"), "{mac}: {heard:?}");
    }
}

/// A new scan round (here after the watchdog's silence) does not take the devices BlueZ
/// knew already for adverts heard now; a known device heard again is recorded with its data
/// (a beacon that repeats itself sends only its RSSI).
#[test]
fn a_new_scan_round_records_only_what_is_heard() {
    let mut bus = MockBus::start("rounds");
    let dir = test_dir("a_new_scan_round_records_only_what_is_heard");
    std::fs::write(dir.join("config.toml"), format!("{BASE_CONFIG}\n[location]\nscan_watchdog_s = 5\n")).unwrap();
    let mut child = sitegate()
        .current_dir(&dir)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .args(["record", "--config", "config.toml", "--out", "trace.jsonl", "--seconds", "120"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rounds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn({
        let rounds = Arc::clone(&rounds);
        move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("BLE: scanning on hci0")
                    || line.contains("ended (no adverts within the watchdog time)")
                {
                    rounds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    });
    let lines = |n: usize| {
        wait_for(&format!("{n} recorded adverts"), || {
            let text = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default();
            (text.lines().count() >= n).then_some(text)
        })
    };
    bus.wait_discovering();
    for i in 0..3 {
        bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -60 - i)}));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    lines(3);
    // Silence: the watchdog ends the round and starts another, which finds the badge cached.
    wait_for("a second scan round", || (rounds.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(()));
    bus.wait_discovering();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let text = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap();
    assert_eq!(text.lines().count(), 3, "nothing heard since, nothing recorded:\n{text}");
    // Heard again, with the same data (only its RSSI changes on the bus).
    bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -75)}));
    let text = lines(4);
    let last: Value = serde_json::from_str(text.lines().nth(3).unwrap()).unwrap();
    assert_eq!(last["rssi"], -75, "{text}");
    assert_eq!(last["mfg"]["004c"], format!("0215{UUID}00050016c5"), "{text}");
    let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    assert!(child.wait().unwrap().success());
}

/// A site where nothing is heard: the watchdog ends a round every few seconds and the next
/// starts at once (no growing pause in which a returning badge or a panic press goes unheard),
/// on the one D-Bus connection (each new one was kept open for good, until the bus refused
/// more and scanning stopped for ever). An advert with manufacturer and service data is
/// recorded with both of its own (its service data was the advert before's).
#[test]
fn a_quiet_adapter_keeps_scanning_on_one_connection() {
    let mut bus = MockBus::start("quiet");
    let dir = test_dir("a_quiet_adapter_keeps_scanning_on_one_connection");
    std::fs::write(dir.join("config.toml"), format!("{BASE_CONFIG}\n[location]\nscan_watchdog_s = 5\n")).unwrap();
    let mut child = sitegate()
        .current_dir(&dir)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .args(["record", "--config", "config.toml", "--out", "trace.jsonl", "--seconds", "120"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let fds = |pid: u32| std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    bus.wait_discovering();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let fds_at_start = fds(child.id());
    // Four watchdog periods and more: each ends a round.
    let started = std::time::Instant::now();
    let (mut longest_off, mut off_since) = (std::time::Duration::ZERO, None::<std::time::Instant>);
    while started.elapsed() < std::time::Duration::from_secs(24) {
        let status = bus.send(json!({"status": true}));
        let v: Value = serde_json::from_str(status.strip_prefix("ok ").unwrap()).unwrap();
        match (v["discovering"].as_bool().unwrap(), off_since) {
            (false, None) => off_since = Some(std::time::Instant::now()),
            (true, Some(t)) => {
                longest_off = longest_off.max(t.elapsed());
                off_since = None;
            }
            _ => {}
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if let Some(t) = off_since {
        longest_off = longest_off.max(t.elapsed());
    }
    assert!(longest_off < std::time::Duration::from_secs(3), "not scanning for {longest_off:?} in a row");
    let fds_at_end = fds(child.id());
    assert!(fds_at_end <= fds_at_start + 1, "{fds_at_start} open files, then {fds_at_end}: a connection a round");

    // Manufacturer and service data in one advert, both changing from advert to advert.
    bus.wait_discovering();
    for (i, mv) in [3000u16, 2900, 2800, 2700].into_iter().enumerate() {
        let tlm = format!("2000{mv:04x}17000000000a00000064");
        bus.ok(json!({"advert": {"mac": "C0:00:00:00:00:33", "rssi": -60, "mfg": {"0059": format!("0{i}")}, "svc": {"feaa": tlm}}}));
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let text = wait_for("four recorded adverts", || {
        let text = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default();
        (text.lines().count() >= 4).then_some(text)
    });
    for (i, line) in text.lines().enumerate() {
        let a: Value = serde_json::from_str(line).unwrap();
        let mv = [3000u16, 2900, 2800, 2700][i];
        assert_eq!(a["mfg"]["0059"], format!("0{i}"), "{text}");
        assert_eq!(a["svc"]["feaa"], format!("2000{mv:04x}17000000000a00000064"), "{text}");
    }
    let _ = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    assert!(child.wait().unwrap().success());
}

/// The match rules a process holds on the bus (its connections' subscriptions to signals).
fn match_rules(address: &str, pid: u32) -> i64 {
    let script = r#"
import sys, dbus
bus = dbus.bus.BusConnection(sys.argv[1])
obj = bus.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus")
daemon = dbus.Interface(obj, "org.freedesktop.DBus")
stats = dbus.Interface(obj, "org.freedesktop.DBus.Debug.Stats")
total = 0
for name in daemon.ListNames():
    if name.startswith(":"):
        try:
            if int(daemon.GetConnectionUnixProcessID(name)) == int(sys.argv[2]):
                total += int(stats.GetConnectionStats(name)["MatchRules"])
        except dbus.exceptions.DBusException:
            pass
print(total)
"#;
    let out = Command::new(python()).args(["-c", script, address, &pid.to_string()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// A quiet site ends a scan round every `scan_watchdog_s`; the rounds leave no subscription
/// behind on the bus (a stream dropped at each round's end left its match rule there when the
/// adapter's own "not discovering" signal came after it, until the bus refused the service
/// more and scanning stopped for good).
#[test]
fn quiet_rounds_leave_no_match_rules_behind() {
    let mut bus = MockBus::start("rules");
    let config = config();
    let bus_address = bus.address.clone();
    let env = vec![("DBUS_SYSTEM_BUS_ADDRESS", bus_address.as_str())];
    let s = Service::start_with("quiet_rounds_leave_no_match_rules_behind", Options { config: &config, env });
    bus.wait_discovering();
    bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -60)}));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let at_start = match_rules(&bus.address, s.pid());
    // Five watchdog periods of silence: each ends a round and starts another.
    std::thread::sleep(std::time::Duration::from_secs(27));
    bus.wait_discovering();
    let at_end = match_rules(&bus.address, s.pid());
    assert!(at_start > 0, "the service subscribes to BlueZ's signals");
    assert!(at_end <= at_start, "{at_start} match rules, then {at_end} after five quiet rounds");
}

/// The MQTT feed from the live engine: a data message at the zone change, the retained state
/// online then offline, and the last state published again after a restart.
#[test]
fn the_feed_publishes_zone_changes_and_retained_states() {
    use crate::mqtt::{connect, mqtt_addr, mqtt_user};
    use std::time::Duration;

    let mut bus = MockBus::start("feed");
    let config = config();
    let bus_address = bus.address.clone();
    let env = vec![("DBUS_SYSTEM_BUS_ADDRESS", bus_address.as_str())];
    let s = Service::start_with("the_feed_publishes", Options { config: &config, env: env.clone() });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let badge = format!(r#"{{"deviceaddress": "5/1/22", "beacon": "ibeacon:{UUID}/5/22", "contactid": {ann}}}"#);
    c.post_json("/devices", &badge).assert_status(201);
    let password = mqtt_user(&s, "acme", "intercom", false);
    let sub = connect(mqtt_addr(&s), "intercom-1", "intercom", &password).unwrap();
    assert_eq!(sub.subscribe("acme/+/+"), rumqttc::SubscribeReasonCode::Success(rumqttc::QoS::AtLeastOnce));
    bus.wait_discovering();

    // Adverts until the engine places the badge: the data message and the state arrive.
    let mut data = None;
    let mut state = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while (data.is_none() || state.is_none()) && std::time::Instant::now() < deadline {
        bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -60)}));
        while let Some(p) = sub.next_publish(Duration::from_millis(300)) {
            let v: Value = serde_json::from_slice(&p.payload).unwrap();
            match p.topic.as_str() {
                "acme/5.1.22/data" => data = data.or(Some(v)),
                "acme/5.1.22/state" => state = state.or(Some(v)),
                other => panic!("unexpected topic {other}"),
            }
        }
    }
    let (data, state) = (data.expect("a data message"), state.expect("a state message"));
    assert_eq!(state["data"]["state"], "online");
    assert_eq!((data["contactId"].as_i64(), data["contactName"].as_str()), (Some(ann), Some("Ann Lee")));

    // The shapes, golden (local times and the seconds in the zone redacted).
    let local = regex::Regex::new(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d").unwrap();
    let mut data = data;
    data["data"]["travelTime"]["value"] = json!("[S]");
    let text = format!(
        "data:\n{}\nstate:\n{}\n",
        serde_json::to_string_pretty(&data).unwrap(),
        serde_json::to_string_pretty(&state).unwrap()
    );
    expect_file!["golden/feed.txt"].assert_eq(&local.replace_all(&text, "[LOCAL]"));

    // A subscriber arriving later gets the state at once, retained.
    let late = connect(mqtt_addr(&s), "late-1", "intercom", &password).unwrap();
    late.subscribe("acme/+/state");
    let p = late.next_publish(Duration::from_secs(10)).expect("the retained state");
    assert!(p.retain);
    assert_eq!(serde_json::from_slice::<Value>(&p.payload).unwrap()["data"]["state"], "online");

    // A restart while the badge is online: the state is published again (retained), and with
    // no adverts the badge goes offline after the away timeout.
    drop((sub, late));
    let (dir, config_file) = (s.dir.clone(), s.config.clone());
    s.terminate();
    let s = Service::launch(dir, config_file, &env);
    let sub = connect(mqtt_addr(&s), "intercom-2", "intercom", &password).unwrap();
    sub.subscribe("acme/+/state");
    let p = sub.next_publish(Duration::from_secs(10)).expect("the state restored");
    assert!(p.retain);
    assert_eq!(serde_json::from_slice::<Value>(&p.payload).unwrap()["data"]["state"], "online");
    let p = sub.next_publish(Duration::from_secs(30)).expect("offline after the away timeout");
    assert_eq!(serde_json::from_slice::<Value>(&p.payload).unwrap()["data"]["state"], "offline");
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(health["mqtt"]["connections"], 1, "{health}");
}

/// Devices changed while they are heard: a new contact is named in the retained state at once;
/// a purge of the contact's location data leaves the device placed (its visit starting at the
/// purge); a deleted device has nothing more written or published and its retained state is
/// cleared.
#[test]
fn devices_changed_while_heard() {
    use crate::mqtt::{connect, mqtt_addr, mqtt_user};
    use std::time::Duration;

    let mut bus = MockBus::start("changed");
    let config = config();
    let bus_address = bus.address.clone();
    let env = vec![("DBUS_SYSTEM_BUS_ADDRESS", bus_address.as_str())];
    let s = Service::start_with("devices_changed_while_heard", Options { config: &config, env });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let bob = c.create("contacts", r#"{"firstname": "Bob", "lastname": "Roe"}"#);
    let badge = format!(r#"{{"deviceaddress": "5/1/22", "beacon": "ibeacon:{UUID}/5/22", "contactid": {ann}}}"#);
    let device = c.post_json("/devices", &badge).json()["device"]["id"].as_i64().unwrap();
    let password = mqtt_user(&s, "acme", "intercom", false);
    let sub = connect(mqtt_addr(&s), "intercom-1", "intercom", &password).unwrap();
    sub.subscribe("acme/+/state");
    bus.wait_discovering();
    // The badge is heard every 300 ms from here on, by a thread of its own.
    let heard = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let pump = std::thread::spawn({
        let heard = Arc::clone(&heard);
        move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while heard.load(std::sync::atomic::Ordering::SeqCst) && std::time::Instant::now() < deadline {
                bus.ok(json!({"advert": ibeacon("C0:00:00:00:00:22", 22, -60)}));
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    });
    // An empty payload (a cleared retained message) is null.
    let state_of = |p: &rumqttc::Publish| serde_json::from_slice::<Value>(&p.payload).unwrap_or(Value::Null);
    let next_state = |what: &str, ok: &dyn Fn(&Value) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Some(p) = sub.next_publish(Duration::from_millis(500))
                && p.topic == "acme/5.1.22/state"
                && ok(&state_of(&p))
            {
                return p;
            }
        }
        panic!("no state message: {what}");
    };
    next_state("online", &|v| v["data"]["state"] == "online" && v["contactName"] == "Ann Lee");

    // Given to Bob: the state says so again, also to a later subscriber.
    c.put_json(&format!("/devices/{device}"), &format!(r#"{{"contactid": {bob}}}"#)).assert_status(200);
    let p = next_state("Bob named", &|v| v["contactName"] == "Bob Roe");
    assert_eq!(state_of(&p)["contactId"], bob);
    assert_eq!(state_of(&p)["data"]["state"], "online");
    let late = connect(mqtt_addr(&s), "late-1", "intercom", &password).unwrap();
    late.subscribe("acme/+/state");
    let p = late.next_publish(Duration::from_secs(10)).expect("the retained state");
    assert_eq!(state_of(&p)["contactName"], "Bob Roe");
    drop(late);

    // Bob's location data forgotten while he is in the kitchen: he stays placed there, and
    // what follows is recorded from the purge on.
    let purged_at = jiff::Timestamp::now();
    c.delete(&format!("/contacts/{bob}/locations")).assert_status(200);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(c.get_json(&format!("/devices/{device}")).json()["device"]["zoneid"], 21);
    let export = c.get_json(&format!("/contacts/{bob}/locations")).json();
    let visits = export["devices"][0]["visits"].as_array().unwrap().clone();
    assert_eq!(visits.len(), 1, "{export}");
    assert_eq!((visits[0]["zoneid"].as_i64(), visits[0]["exit"].as_str()), (Some(21), Some("")), "{export}");
    let v = c.post_json("/report/timebydevice", r#"{"deviceaddress": "5/1/22"}"#).json();
    assert_eq!(v["timebydevice"]["count"], 1, "the open visit counts: {v}");

    // Deleted while heard: nothing of it is written after the delete, and its retained
    // state is cleared.
    c.delete(&format!("/devices/{device}")).assert_status(200);
    let p = next_state("cleared", &|_| true);
    assert!(p.payload.is_empty(), "{:?}", p.payload);
    std::thread::sleep(Duration::from_millis(2500));
    heard.store(false, std::sync::atomic::Ordering::SeqCst);
    pump.join().unwrap();
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    let count = |sql: &str| db.query_row(sql, [device], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT count(*) FROM locations WHERE device_id = ?1"), 0);
    assert_eq!(count("SELECT count(*) FROM visits WHERE device_id = ?1"), 0);
    let later = connect(mqtt_addr(&s), "later-1", "intercom", &password).unwrap();
    later.subscribe("acme/+/state");
    assert!(later.next_publish(Duration::from_secs(2)).is_none(), "no retained state of a deleted device");
    let _ = purged_at;
}
