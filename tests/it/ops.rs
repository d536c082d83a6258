//! Operations: systemd notification and watchdog, health and metrics, shutdown under load,
//! backup and restore, one service per database, journald logs.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{BASE_CONFIG, Client, Options, Req, Service, basic, read_response, test_dir, wait_for};

/// Receives sd_notify datagrams until one contains `what`.
fn expect_message(sock: &UnixDatagram, what: &str) -> String {
    let mut buf = [0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("no {what} from the service: {e}"));
        let msg = String::from_utf8_lossy(&buf[..n]).to_string();
        if msg.lines().any(|l| l == what) {
            return msg;
        }
    }
}

#[test]
fn notifies_systemd_ready_watchdog_and_stopping() {
    let dir = test_dir("notifies_systemd_ready_watchdog_and_stopping_sock");
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let path_text = path.display().to_string();
    let s = Service::start_with(
        "notifies_systemd_ready_watchdog_and_stopping",
        Options { config: BASE_CONFIG, env: vec![("NOTIFY_SOCKET", &path_text), ("WATCHDOG_USEC", "200000")] },
    );
    let ready = expect_message(&sock, "READY=1");
    assert!(ready.contains(&format!("STATUS=ready http={}", s.addr)), "{ready}");
    for _ in 0..3 {
        expect_message(&sock, "WATCHDOG=1");
    }
    assert_eq!(s.terminate(), Some(0));
    expect_message(&sock, "STOPPING=1");
}

#[test]
fn notifies_on_an_abstract_socket_and_skips_a_watchdog_for_another_pid() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("sitegate-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let sock = UnixDatagram::bind_addr(&addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let socket_env = format!("@{name}");
    let s = Service::start_with(
        "notifies_on_an_abstract_socket",
        Options {
            config: BASE_CONFIG,
            env: vec![("NOTIFY_SOCKET", &socket_env), ("WATCHDOG_USEC", "100000"), ("WATCHDOG_PID", "1")],
        },
    );
    expect_message(&sock, "READY=1");
    // The watchdog belongs to another process: no pings (checked for ten would-be intervals).
    sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 512];
    if let Ok(n) = sock.recv(&mut buf) {
        panic!("unexpected message: {}", String::from_utf8_lossy(&buf[..n]));
    }
    drop(s);
}

#[test]
fn health_and_metrics() {
    let s = Service::start("health_and_metrics");
    let anon = s.anonymous();
    let r = anon.get_json("/health");
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["health"], "ok");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["uptime_s"].is_number());
    assert!(v["disk"]["freebytes"].as_i64().is_some_and(|b| b > 0), "{}", r.body);
    assert_eq!(anon.get("/health/").xml_text("health").as_deref(), Some("ok"));
    assert_eq!(anon.call(Req::new("POST", "/health")).status, 405);

    let c = s.admin_client();
    for _ in 0..3 {
        c.get("/contacts").assert_status(200);
    }
    c.get("/contacts/999").assert_status(404);
    // An answer the HTTP layer gives itself (a body too large to read) is counted too.
    let too_large =
        crate::support::raw_exchange(s.addr, b"POST /contacts HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n");
    assert_eq!(too_large.status, 413);
    let m = anon.get("/metrics");
    assert_eq!(m.status, 200);
    assert!(m.header("Content-Type").unwrap().starts_with("application/openmetrics-text"), "{:?}", m.headers);
    let text = &m.body;
    let value = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
    };
    // Two health checks and three lists.
    assert_eq!(value("sitegate_http_requests_total{method=\"GET\",status=\"200\"}"), 5.0);
    assert_eq!(value("sitegate_http_requests_total{method=\"GET\",status=\"404\"}"), 1.0);
    assert_eq!(value("sitegate_http_requests_total{method=\"POST\",status=\"413\"}"), 1.0);
    assert!(value("sitegate_http_request_duration_seconds_count") >= 4.0);
    assert!(value("sitegate_database_bytes") > 0.0);
    assert!(value("sitegate_disk_free_bytes") > 0.0);
    assert_eq!(value("sitegate_database_writes_failing"), 0.0);
    assert!(value("sitegate_http_connections_open{listener=\"http\"}") >= 1.0);
    // Every webhook outcome is there before the first delivery, at 0.
    for outcome in ["delivered", "retry", "failed"] {
        assert_eq!(value(&format!("sitegate_webhook_attempts_total{{outcome=\"{outcome}\"}}")), 0.0);
    }
    for name in [
        "sitegate_http_queue_depth",
        "sitegate_http_workers_busy",
        "sitegate_uptime_seconds",
        "sitegate_http_rejected_busy_total",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    assert!(text.trim_end().ends_with("# EOF"));

    // With a token, /metrics answers only to it.
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nmetrics_token = \"scrape-me-please-0123\"");
    let s = Service::start_with("health_and_metrics_token", Options { config: &config, env: vec![] });
    let anon = s.anonymous();
    assert_eq!(anon.get("/metrics").status, 401);
    let wrong = anon.call(Req::new("GET", "/metrics").header("Authorization", "Bearer nope"));
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.header("WWW-Authenticate"), Some("Bearer realm=\"sitegate\""));
    let right = anon.call(Req::new("GET", "/metrics").header("Authorization", "Bearer scrape-me-please-0123"));
    assert_eq!(right.status, 200);
    // The scheme in any case, blanks around the token.
    let lower = anon.call(Req::new("GET", "/metrics").header("Authorization", "bearer  scrape-me-please-0123 "));
    assert_eq!(lower.status, 200);
    assert_eq!(anon.get("/health").status, 200);
}

#[test]
fn one_service_per_database() {
    let s = Service::start("one_service_per_database");
    let out = crate::support::cli_with_config(&s.config, &["serve"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another sitegate serves this database"));
    // Another instance running is a runtime failure (1), for `restore` as for `serve`.
    let out = s.cli(&["restore", "--from", "/dev/null"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it before restoring"));
    // The same database through a symbolic link (to the file, or to its folder) is the same.
    let other = s.dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(s.dir.join("data/sitegate.db"), other.join("linked.db")).unwrap();
    std::os::unix::fs::symlink(s.dir.join("data"), other.join("data-link")).unwrap();
    for path in ["linked.db", "data-link/sitegate.db"] {
        let config = other.join(format!("{}.toml", path.replace('/', "-")));
        let text = BASE_CONFIG.replace("path = \"data/sitegate.db\"", &format!("path = \"{path}\""));
        std::fs::write(&config, text).unwrap();
        let out = crate::support::cli_with_config(&config, &["serve"]);
        assert_eq!(out.status.code(), Some(1), "{path}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("another sitegate serves this database"));
    }
    // A hard link is a name the lock cannot follow: refused (two services through two names
    // both answered 201, and only one's writes were kept).
    std::fs::hard_link(s.dir.join("data/sitegate.db"), other.join("hard.db")).unwrap();
    let config = other.join("hard.toml");
    std::fs::write(&config, BASE_CONFIG.replace("path = \"data/sitegate.db\"", "path = \"hard.db\"")).unwrap();
    let out = crate::support::cli_with_config(&config, &["serve"]);
    // Lasting until an operator removes the link: 65, which the unit does not restart on.
    assert_eq!(out.status.code(), Some(65), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has 2 hard links"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.admin_client().get("/contacts").assert_status(200);
}

/// Creates contacts from `threads` clients until `stop` is set or the service goes away;
/// returns the ids acknowledged with 201.
fn write_load(client: &Client, threads: usize, stop: &AtomicBool, acked: &Mutex<Vec<i64>>) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < 100_000 {
                    i += 1;
                    let req = Req::new("POST", "/contacts")
                        .json_body(&format!(r#"{{"firstname": "T{t}", "lastname": "N{i}"}}"#))
                        .json();
                    match client.try_call(req) {
                        Ok(r) if r.status == 201 => {
                            acked.lock().unwrap().push(r.json()["item"]["id"].as_i64().unwrap());
                        }
                        Ok(r) if r.status == 503 => {}
                        Ok(r) => panic!("unexpected answer {}: {}", r.status, r.body),
                        Err(_) => return, // the service stopped
                    }
                }
            });
        }
    });
}

fn all_ids(c: &Client) -> BTreeSet<i64> {
    let mut ids = BTreeSet::new();
    let mut start = 0;
    loop {
        let page = c.list_ids(&format!("/contacts?limit=5000&start={start}&sortfield=created"));
        if page.is_empty() {
            return ids;
        }
        start += page.len();
        ids.extend(page);
    }
}

#[test]
fn sigterm_under_write_load_loses_no_acknowledged_write() {
    let s = Service::start("sigterm_under_write_load_loses_no_acknowledged_write");
    let admin = s.admin.clone();
    let client = s.admin_client();
    let stop = AtomicBool::new(false);
    let acked = Mutex::new(Vec::new());
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    let pid = s.pid();
    std::thread::scope(|scope| {
        scope.spawn(|| write_load(&client, 4, &stop, &acked));
        wait_for("100 acknowledged writes", || (acked.lock().unwrap().len() >= 100).then_some(()));
        let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        // Writers stop by themselves when the service closes its socket; this is the backstop.
        wait_for("the service to stop", || TcpStream::connect(s.addr).is_err().then_some(()));
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(s.terminate(), Some(0), "exit status after SIGTERM");
    // A clean stop leaves the write-ahead log checkpointed (empty or gone).
    let wal = dir.join("data/sitegate.db-wal");
    assert!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) == 0, "WAL not checkpointed");
    let acked: BTreeSet<i64> = acked.into_inner().unwrap().into_iter().collect();
    let s = Service::launch(dir, cfg, &[]);
    let present = all_ids(&s.client(&admin));
    let missing: Vec<_> = acked.difference(&present).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
}

#[test]
fn a_request_in_flight_finishes_during_shutdown() {
    let s = Service::start("a_request_in_flight_finishes_during_shutdown");
    let auth = basic(&s.admin.email, &s.admin.token);
    let body = r#"{"firstname": "Slow", "lastname": "Upload"}"#;
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body.as_bytes()[..10]).unwrap();
    // Wait until the service is reading this request (it and the metrics request in flight).
    wait_for("the request to be in flight", || {
        let m = s.anonymous().get("/metrics").body;
        let n: f64 = m
            .lines()
            .find(|l| l.starts_with("sitegate_http_requests_in_flight "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        (n >= 2.0).then_some(())
    });
    let _ = std::process::Command::new("kill").arg("-TERM").arg(s.pid().to_string()).status();
    // Once new connections are refused, the shutdown has begun; then the rest of the body.
    wait_for("the listener to close", || TcpStream::connect(s.addr).is_err().then_some(()));
    stream.write_all(&body.as_bytes()[10..]).unwrap();
    let r = read_response(&mut stream);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(s.terminate(), Some(0));
}

#[test]
fn backup_under_write_load_restores_to_a_consistent_database() {
    let s = Service::start("backup_under_write_load_restores_to_a_consistent_database");
    let admin = s.admin.clone();
    let client = s.admin_client();
    let stop = AtomicBool::new(false);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let backup = s.dir.join("backup.db");
    let mut acked_before = BTreeSet::new();
    std::thread::scope(|scope| {
        scope.spawn(|| write_load(&client, 2, &stop, &acked));
        wait_for("50 acknowledged writes", || (acked.lock().unwrap().len() >= 50).then_some(()));
        acked_before = acked.lock().unwrap().iter().copied().collect();
        let out = s.cli(&["backup", "--out", backup.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("backed up"));
        wait_for("more writes after the backup", || {
            (acked.lock().unwrap().len() >= acked_before.len() + 20).then_some(())
        });
        stop.store(true, Ordering::Relaxed);
    });
    let acked_all: BTreeSet<i64> = acked.lock().unwrap().iter().copied().collect();
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));

    // A file that is not a database is refused and changes nothing.
    let junk = dir.join("junk.db");
    std::fs::write(&junk, b"not a database at all").unwrap();
    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(65), "an input file that cannot be used");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a usable sitegate database"));

    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", backup.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("kept the previous database as"), "{stdout}");
    let s = Service::launch(dir, cfg, &[]);
    let restored = all_ids(&s.client(&admin));
    assert!(acked_before.is_subset(&restored), "writes acknowledged before the backup are missing");
    assert!(restored.is_subset(&acked_all), "the backup holds records nobody wrote");
    assert!(restored.len() < acked_all.len(), "the backup should not hold the writes made after it");
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn leftovers(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().chain(std::fs::read_dir(dir.join("data")).unwrap()) {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if name.contains(".partial") {
            found.push(name);
        }
    }
    found
}

/// What a restore is for: the database is damaged (or of a newer sitegate). It is kept as it
/// was, byte for byte, and two restores in a row keep both databases they replaced. Backups
/// and the restored database are readable by their owner only; a backup onto the live
/// database is refused; nothing half-written is left behind.
#[test]
fn restore_replaces_a_damaged_database_and_keeps_it_as_it_was() {
    let s = Service::start("restore_replaces_a_damaged_database");
    let client = s.admin_client();
    let admin = s.admin.clone();
    let first = client.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let backup = s.dir.join("backup.db");
    let out = s.cli(&["backup", "--out", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&backup), 0o600, "a backup holds what the database holds");

    // The live database as the backup's target: refused, and the service's data stays.
    let db = s.dir.join("data").join("sitegate.db");
    let same = format!("{}/data/./sitegate.db", s.dir.display());
    let out = s.cli(&["backup", "--out", &same]);
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is the database itself"));
    let out = s.cli(&["backup", "--out", s.dir.join("data").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "a folder is no backup file");
    let second = client.create("contacts", r#"{"firstname": "Bo", "lastname": "Lin"}"#);
    assert_eq!(all_ids(&client), BTreeSet::from([first, second]));
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));
    assert_eq!(leftovers(&dir), Vec::<String>::new());

    // Damaged: pages overwritten in the middle of the file.
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 16_384, "a database of several pages");
    for b in &mut bytes[8_192..16_384] {
        *b = 0xA5;
    }
    std::fs::write(&db, &bytes).unwrap();
    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let kept = stdout
        .lines()
        .find_map(|l| l.strip_prefix("kept the previous database as "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_string();
    assert_eq!(std::fs::read(&kept).unwrap(), bytes, "the damaged database is kept as it was");
    assert_eq!(mode(&db), 0o600);

    // Restored again at once (the same second): both replaced databases are kept.
    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let kept_again = stdout.lines().find_map(|l| l.strip_prefix("kept the previous database as ")).unwrap().to_string();
    assert_ne!(kept_again, kept);
    assert!(std::path::Path::new(&kept).exists() && std::path::Path::new(&kept_again).exists());

    // A database of a newer schema (a downgrade's case) is replaced and kept the same way.
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
    }
    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(leftovers(&dir), Vec::<String>::new());

    let s = Service::launch(dir, cfg, &[]);
    assert_eq!(all_ids(&s.client(&admin)), BTreeSet::from([first]), "the backup's data");
}

#[test]
fn logs_for_the_journal_carry_priorities() {
    let s = Service::start_with(
        "logs_for_the_journal_carry_priorities",
        Options { config: BASE_CONFIG, env: vec![("JOURNAL_STREAM", "8:12345")] },
    );
    let line = wait_for("the serving log line", || {
        s.stderr().lines().find(|l| l.contains("serving (ready")).map(str::to_string)
    });
    assert!(line.starts_with("<6>sitegate::service: "), "{line}");
    let plain = Service::start("logs_on_a_terminal_carry_times");
    let line = wait_for("the serving log line", || {
        plain.stderr().lines().find(|l| l.contains("serving (ready")).map(str::to_string)
    });
    assert!(line.contains("Z INFO sitegate::service: "), "{line}");
}

/// The data folder on a small file system of its own (tmpfs, in a private mount namespace of
/// the service: `unshare`), with a filler file the service's shell removes when `free` appears.
/// None where this system does not allow it.
fn start_on_a_small_disk(name: &str, config: &str) -> Option<Service> {
    let dir = test_dir(name);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let script = r#"mount -t tmpfs -o size=4m tmpfs "$1/data" || exit 99
dd if=/dev/zero of="$1/data/filler" bs=1024 count=2600 2>/dev/null
(while [ ! -e "$1/free" ]; do sleep 0.2; done; rm -f "$1/data/filler") &
exec "$2" serve --config "$1/config.toml""#;
    let bin = env!("CARGO_BIN_EXE_sitegate");
    for flags in ["-Urm", "-m"] {
        let probe = std::process::Command::new("unshare").args([flags, "true"]).status();
        if !probe.is_ok_and(|s| s.success()) {
            continue;
        }
        let mut cmd = std::process::Command::new("unshare");
        cmd.args([flags, "sh", "-c", script, "sh"]).arg(&dir).arg(bin);
        return Some(Service::launch_command(dir, config_path, cmd));
    }
    eprintln!("{name}: this system allows no private mount namespace (unshare); not run");
    None
}

/// A full disk: writes answer 503 `storagefull` and change nothing, `/health` says so, reads
/// go on, webhook deliveries are not sent again and again while their attempts cannot be
/// recorded, and once there is room everything works again without a restart.
#[test]
fn a_full_disk_refuses_writes_clearly_and_recovers() {
    let config = BASE_CONFIG.replace("[webhooks]\n", "[webhooks]\nretry_delays_s = [1, 1, 1, 1]\n");
    let Some(s) = start_on_a_small_disk("a_full_disk_refuses_writes_clearly_and_recovers", &config) else { return };
    let c = s.admin_client();
    let rx = crate::support::Receiver::start();
    let hook = format!(
        r#"{{"title": "t", "event": "items.create", "constrainttype": "all", "url": "{}", "contenttype": "json", "secret": "k"}}"#,
        rx.url("/in")
    );
    c.post_json("/hooks", &hook).assert_status(201);
    // Before it is full: health is ok, and says the disk (4 MB, 1.4 free) is low, as the log does.
    let health = s.anonymous().get_json("/health");
    assert_eq!(health.status, 200, "{}", health.body);
    let disk = &health.json()["disk"];
    assert_eq!(disk["low"], 1, "{}", health.body);
    assert!(disk["freebytes"].as_i64().is_some_and(|b| b > 0 && b < 4 << 20), "{}", health.body);
    wait_for("the low disk in the log", || s.stderr().contains("MiB free (below 64 MiB)").then_some(()));
    rx.take_down();
    let background = "x".repeat(60_000);
    let mut created = Vec::new();
    let full = (0..200)
        .find_map(|i| {
            let r = c.post_json("/contacts", &format!(r#"{{"firstname": "F{i}", "background": "{background}"}}"#));
            match r.status {
                201 => {
                    created.push(r.json()["item"]["id"].as_i64().unwrap());
                    None
                }
                _ => Some(r),
            }
        })
        .expect("the disk fills up");
    assert_eq!(full.status, 503, "{}", full.body);
    assert!(full.body.contains("storagefull"), "{}", full.body);
    assert_eq!(full.header("Retry-After"), Some("30"));
    assert!(!created.is_empty());
    let health = s.anonymous().get_json("/health");
    assert_eq!(health.status, 503, "{}", health.body);
    assert!(health.body.contains("disk is full"), "{}", health.body);
    c.get_json(&format!("/contacts/{}", created[0])).assert_status(200);

    // The receiver is back while attempts cannot be recorded: nothing goes out twice.
    rx.bring_up();
    std::thread::sleep(Duration::from_secs(6));
    let twice = |got: &[crate::support::Received]| {
        let mut ids: Vec<&str> = got.iter().map(|r| r.header("X-Sitegate-Delivery").unwrap()).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        n - ids.len()
    };
    assert_eq!(twice(&rx.received()), 0, "a delivery sent again while the disk was full");

    // Room again: writes work, health is ok, every creation is delivered, once.
    std::fs::write(s.dir.join("free"), "").unwrap();
    wait_for("health ok again", || (s.anonymous().get_json("/health").status == 200).then_some(()));
    // The room is shared with what was waiting (the checkpoint of the log, the deliveries'
    // records): a write may still be refused a moment, as its 503 says (Retry-After).
    wait_for("a write taken again", || {
        let r = c.post_json("/contacts", r#"{"firstname": "After"}"#);
        assert!(matches!(r.status, 201 | 503), "{}", r.body);
        (r.status == 201).then_some(())
    });
    let got = rx.wait_accepted(created.len() + 1);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(twice(&rx.received()), 0, "a delivery sent twice: {} received", got.len());
    assert!(s.stderr().contains("the disk is full"), "{}", s.stderr());
}

/// The data folder renamed (or removed) under a running service: writes are refused (they
/// would go where a restart no longer looks), `/health` says why, reads go on; back in place,
/// writes go on.
#[test]
fn writes_stop_while_the_database_file_is_not_where_it_was() {
    let s = Service::start("writes_stop_while_the_database_file_is_not_where_it_was");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Before"}"#);
    std::fs::rename(s.dir.join("data"), s.dir.join("data.moved")).unwrap();
    let r = c.post_json("/contacts", r#"{"firstname": "Lost"}"#);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("unavailable") && r.body.contains("sitegate.db"), "{}", r.body);
    let health = s.anonymous().get_json("/health");
    assert_eq!(health.status, 503, "{}", health.body);
    c.get_json(&format!("/contacts/{id}")).assert_status(200);
    std::fs::rename(s.dir.join("data.moved"), s.dir.join("data")).unwrap();
    c.create("contacts", r#"{"firstname": "After"}"#);
    assert_eq!(s.anonymous().get_json("/health").status, 200);
    assert_eq!(c.list_ids("/contacts").len(), 2, "Before and After, not Lost");
    assert!(s.stderr().contains("no longer") || s.stderr().contains("is gone"), "{}", s.stderr());
}

/// `sitegate compact` gives the space of purged rows back to the disk: refused while the
/// service runs, then the file shrinks and the data is all there.
#[test]
fn compact_gives_the_space_of_purged_rows_back() {
    let s = Service::start("compact_gives_space_back");
    let admin = s.admin.clone();
    let kept = s.admin_client().create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let out = s.cli(&["compact"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it before compacting"));
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));
    // 40,000 history rows written and purged, as the retention does: their pages stay free.
    let db = dir.join("data/sitegate.db");
    {
        let mut conn = rusqlite::Connection::open(&db).unwrap();
        let tx = conn.transaction().unwrap();
        for t in 0..40_000i64 {
            tx.execute(
                "INSERT INTO locations (device_id, t_ms, zone_id, lat, lon, receiver, rssi)
                 VALUES (1, ?1, 21, 0, 0, 'a-receiver-with-a-long-name', -60)",
                [t],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        conn.execute("DELETE FROM locations", []).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
    let before = std::fs::metadata(&db).unwrap().len();
    let out = crate::support::cli_with_config(&cfg, &["compact"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("compacted"));
    let after = std::fs::metadata(&db).unwrap().len();
    assert!(after * 2 < before, "{before} bytes -> {after} bytes");
    let s = Service::launch(dir, cfg, &[]);
    s.client(&admin).get_json(&format!("/contacts/{kept}")).assert_status(200);
}

/// The service under `prlimit` open-file limits: it raises its soft limit to what the
/// connections it allows need, as far as the hard limit goes, and says in the journal when
/// that is not enough (clients beyond would take the descriptors the API needs to accept).
#[test]
fn the_open_files_limit_is_raised_for_the_connections_allowed() {
    let bin = env!("CARGO_BIN_EXE_sitegate");
    let start = |name: &str, config: &str, soft: u32, hard: u32| -> Service {
        let dir = test_dir(name);
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", r#"ulimit -Sn "$2" && ulimit -Hn "$1" && exec "$3" serve --config "$4""#, "sh"])
            .arg(hard.to_string())
            .arg(soft.to_string())
            .arg(bin)
            .arg(&config_path);
        Service::launch_command(dir, config_path, cmd)
    };
    let soft_limit = |s: &Service| -> u64 {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.pid())).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    // 100 + 100 connections and 256 for the rest: 456, within the hard limit.
    let small = BASE_CONFIG
        .replace("workers = 2", "workers = 2\nconnections_max = 100")
        .replace("[mqtt]\n", "[mqtt]\nconnections_max = 100\n");
    let s = start("open_files_raised", &small, 300, 1024);
    assert_eq!(soft_limit(&s), 456, "{}", s.stderr());
    assert!(s.stderr().contains("raised to 456"), "{}", s.stderr());
    // The defaults (1024 HTTP and 1000 MQTT connections) under a hard limit of 1024: raised as
    // far as it goes, and said.
    let s = start("open_files_short", BASE_CONFIG, 512, 1024);
    assert_eq!(soft_limit(&s), 1024);
    let warning = wait_for("the warning", || {
        s.stderr().lines().find(|l| l.contains("open files: the limit is")).map(str::to_string)
    });
    assert!(warning.contains("raise LimitNOFILE or lower connections_max"), "{warning}");
}

/// A restore reads its backup through SQLite: a database with its write-ahead log beside it
/// (one kept by an earlier restore, or copied as a crash left it) is restored with what the
/// log holds; copied as a file, the writes in the log were lost. And the database it replaces
/// goes with its rollback journal (left hot by an interrupted `compact` of a restored
/// database): left beside the restored file, SQLite rolled the old database's pages into it.
#[test]
fn restore_takes_a_backups_log_and_keeps_the_replaced_databases_journal() {
    let Killed { admin, dir, cfg, backup, first, ids } = killed_after_a_backup("restore_takes_a_backups_log");
    let db = dir.join("data").join("sitegate.db");
    // The two files as the crash left them.
    let crashed = dir.join("crashed.db");
    std::fs::copy(&db, &crashed).unwrap();
    std::fs::copy(dir.join("data").join("sitegate.db-wal"), dir.join("crashed.db-wal")).unwrap();
    assert!(std::fs::metadata(dir.join("crashed.db-wal")).unwrap().len() > 0, "the writes are in the log");
    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", crashed.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = Service::launch(dir.clone(), cfg.clone(), &[]);
    assert_eq!(all_ids(&s.client(&admin)), ids, "what the backup's log held");
    assert_eq!(s.terminate(), Some(0));

    // The current database in rollback mode, a transaction cut off: its journal is hot.
    let python = r#"
import os, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode = DELETE")
c.execute("PRAGMA cache_size = 2")
c.execute("BEGIN")
c.execute("CREATE TABLE filler (x)")
c.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO filler SELECT randomblob(3000) FROM n")
c.execute("DELETE FROM items WHERE id > 0")
os._exit(0)
"#;
    let cut = std::process::Command::new("python3").args(["-c", python, db.to_str().unwrap()]).status().unwrap();
    assert!(cut.success());
    assert!(dir.join("data").join("sitegate.db-journal").exists(), "a hot journal to begin with");
    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let kept = stdout.lines().find_map(|l| l.strip_prefix("kept the previous database as ")).unwrap().to_string();
    assert!(std::path::Path::new(&format!("{kept}-journal")).exists(), "the journal went with its database");
    let check = |path: &std::path::Path| -> (String, i64) {
        let conn = rusqlite::Connection::open(path).unwrap();
        let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        let contacts: i64 = conn.query_row("SELECT count(*) FROM items WHERE id > 0", [], |r| r.get(0)).unwrap_or(-1);
        (ok, contacts)
    };
    // The kept database, opened with its journal, is as it was before the cut transaction.
    assert_eq!(check(std::path::Path::new(&kept)).0, "ok");
    assert!(check(std::path::Path::new(&kept)).1 > 0);
    assert_eq!(check(&db).0, "ok", "the restored database");
    let s = Service::launch(dir, cfg, &[]);
    assert_eq!(all_ids(&s.client(&admin)), BTreeSet::from([first]), "the backup's data");
}

/// Signals in the first moments of a start (a reload sent while it migrates a fresh database)
/// are taken once it serves: they no longer end the process with the signal's default action.
#[test]
fn a_reload_during_the_start_is_taken_once_it_serves() {
    let dir = test_dir("a_reload_during_the_start_is_taken_once_it_serves");
    let config = dir.join("config.toml");
    std::fs::write(&config, BASE_CONFIG).unwrap();
    let base = crate::support::sitegate();
    let mut words: Vec<String> =
        std::iter::once(base.get_program()).chain(base.get_args()).map(|w| w.to_string_lossy().into_owned()).collect();
    words.extend(["serve".into(), "--config".into(), config.display().to_string()]);
    // The shell becomes the service (exec): `$$` is its pid. SIGHUP every few milliseconds
    // from 20 ms on, through the start.
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(r#"( sleep 0.02; i=0; while [ $i -lt 100 ]; do kill -HUP $$ 2>/dev/null; sleep 0.004; i=$((i+1)); done ) & exec "$@""#)
        .arg("sh")
        .args(&words);
    let s = Service::launch_command(dir, config, cmd);
    wait_for("a reload in the log", || s.stderr().contains("SIGHUP").then_some(()));
    s.admin_client().get("/contacts").assert_status(200);
}

/// A restore cut off between its renames (a kill, a power cut: here the process dies after it
/// moved the database's write-ahead log aside and before the database): nothing opens the
/// folder until a restore is run again, which finishes it and keeps the replaced database
/// under one name with its log, so nothing it held is lost. A start there used to serve the
/// database without its log (the last writes gone), or, cut a step later, a new empty one.
#[test]
fn an_interrupted_restore_is_finished_by_the_next_one() {
    let Killed { admin, dir, cfg, backup, first, ids } =
        killed_after_a_backup("an_interrupted_restore_is_finished_by_the_next_one");

    let cut = crate::support::sitegate()
        .args(["restore", "--config", cfg.to_str().unwrap(), "--from", backup.to_str().unwrap()])
        .env("SITEGATE_FAULT_STOP", "restore-log-kept")
        .output()
        .unwrap();
    assert!(!cut.status.success(), "the restore was cut off");
    assert!(dir.join("data/sitegate.db").exists() && !dir.join("data/sitegate.db-wal").exists());

    // The service refuses the folder, and says what to do.
    let mut serve = crate::support::sitegate()
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = serve.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = serve.kill();
            let _ = serve.wait();
            panic!("sitegate serve started on a folder with an interrupted restore");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut said = String::new();
    std::io::Read::read_to_string(serve.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert!(!status.success(), "{said}");
    assert!(said.contains("was interrupted") && said.contains("sitegate restore --from"), "{said}");
    let out = crate::support::cli_with_config(&cfg, &["user", "list"]);
    assert!(!out.status.success(), "nor does another command open it");

    let out = crate::support::cli_with_config(&cfg, &["restore", "--from", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let kept = stdout.lines().find_map(|l| l.strip_prefix("kept the previous database as ")).unwrap().to_string();
    let conn = rusqlite::Connection::open(&kept).unwrap();
    let contacts: i64 = conn.query_row("SELECT count(*) FROM items WHERE typeid = 1", [], |r| r.get(0)).unwrap();
    assert_eq!(contacts, ids.len() as i64, "the replaced database kept with its log");
    drop(conn);
    // What a restore killed while it copied leaves (a partial copy, no marker): the start
    // removes it.
    std::fs::write(dir.join("data/sitegate.db.partial"), vec![0u8; 65_536]).unwrap();
    let s = Service::launch(dir.clone(), cfg, &[]);
    assert_eq!(all_ids(&s.client(&admin)), BTreeSet::from([first]), "the backup's data");
    let names: Vec<String> = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".restoring") || n.ends_with(".partial")), "{names:?}");
}

/// A restore cut off after the restored copy was in place, before it removed its marker: the
/// service starts on the restored database, and the next restore keeps the database it
/// replaces under a name of its own; the copy the first kept is not written over (it was,
/// by the next restore, with the data only it held).
#[test]
fn a_restore_cut_off_at_its_end_loses_no_kept_copy() {
    let Killed { admin, dir, cfg, backup, first, ids } =
        killed_after_a_backup("a_restore_cut_off_at_its_end_loses_no_kept_copy");

    let restore = |fault: Option<&str>| {
        let mut cmd = crate::support::sitegate();
        cmd.args(["restore", "--config", cfg.to_str().unwrap(), "--from", backup.to_str().unwrap()]);
        if let Some(point) = fault {
            cmd.env("SITEGATE_FAULT_STOP", point);
        }
        cmd.output().unwrap()
    };
    let cut = restore(Some("restore-in-place"));
    assert!(!cut.status.success(), "the restore was cut off");
    let kept: Vec<_> = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("before-restore") && !p.to_string_lossy().ends_with("-wal"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let kept = kept[0].clone();
    let contacts = |path: &std::path::Path| -> i64 {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row("SELECT count(*) FROM items WHERE typeid = 1", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(contacts(&kept), ids.len() as i64, "kept with its log");

    let s = Service::launch(dir.clone(), cfg.clone(), &[]);
    assert_eq!(all_ids(&s.client(&admin)), BTreeSet::from([first]), "the backup's data");
    assert_eq!(s.terminate(), Some(0));
    let out = restore(None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(contacts(&kept), ids.len() as i64, "the first kept copy");
}

/// A service killed after a backup and 30 contacts more: their writes are in the database's
/// log only.
struct Killed {
    admin: crate::support::Account,
    dir: std::path::PathBuf,
    cfg: std::path::PathBuf,
    backup: std::path::PathBuf,
    /// The contact the backup holds, and every contact.
    first: i64,
    ids: BTreeSet<i64>,
}

fn killed_after_a_backup(name: &str) -> Killed {
    let s = Service::start(name);
    let client = s.admin_client();
    let first = client.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let backup = s.dir.join("backup.db");
    let out = s.cli(&["backup", "--out", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut ids = BTreeSet::from([first]);
    for i in 0..30 {
        ids.insert(client.create("contacts", &format!(r#"{{"firstname": "N{i}", "lastname": "Lin"}}"#)));
    }
    let killed = Killed { admin: s.admin.clone(), dir: s.dir.clone(), cfg: s.config.clone(), backup, first, ids };
    drop(s);
    let wal = killed.dir.join("data/sitegate.db-wal");
    assert!(std::fs::metadata(wal).unwrap().len() > 0, "the writes are in the log");
    killed
}
