//! The operator status page over HTTP: the embedded page behind Basic auth, its snapshot,
//! the server-sent events that keep it live (without holding a worker), and the refusal of
//! changes requested by pages of other origins. `browser.rs` drives it in Chromium.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// An open event stream, read as raw bytes.
pub struct Events {
    stream: TcpStream,
    buf: Vec<u8>,
    pub head: String,
}

impl Events {
    pub fn open(addr: std::net::SocketAddr, auth: &str) -> Events {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        write!(
            stream,
            "GET /status/events HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        let mut events = Events { stream, buf: Vec::new(), head: String::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !events.buf.windows(4).any(|w| w == b"\r\n\r\n") {
            assert!(Instant::now() < deadline, "no response head");
            events.fill();
        }
        let end = events.buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        events.head = String::from_utf8_lossy(&events.buf[..end]).into_owned();
        events.buf.drain(..end);
        events
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => true,
        }
    }

    /// The next snapshot that satisfies `want`, within 30 s.
    pub fn next_where(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let marker = b"event: snapshot\ndata: ";
            if let Some(start) = self.buf.windows(marker.len()).position(|w| w == marker) {
                let from = start + marker.len();
                if let Some(len) = self.buf[from..].windows(2).position(|w| w == b"\n\n") {
                    let json: Value = serde_json::from_slice(&self.buf[from..from + len]).expect("a JSON snapshot");
                    self.buf.drain(..from + len + 2);
                    if want(&json) {
                        return json;
                    }
                    continue;
                }
            }
            assert!(Instant::now() < deadline, "timed out waiting for a snapshot with {what}");
            if !self.fill() {
                panic!("the stream ended while waiting for {what}");
            }
        }
    }

    /// True when the server ended the stream (its last chunk, or a closed connection)
    /// within `wait`.
    pub fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if !self.fill() || self.buf.windows(7).any(|w| w == b"\r\n0\r\n\r\n") || self.buf.starts_with(b"0\r\n\r\n")
            {
                return true;
            }
        }
        false
    }
}

#[test]
fn the_page_is_embedded_small_and_behind_basic_auth() {
    let s = Service::start("the_page_is_embedded_small_and_behind_basic_auth");
    let r = s.anonymous().get("/");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("WWW-Authenticate"), Some("Basic realm=\"sitegate\", charset=\"UTF-8\""));
    let c = s.admin_client();
    let outside =
        regex::Regex::new(r#"(?i)(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import"#).unwrap();
    let mut total = 0;
    for (path, kind) in [("/", "text/html"), ("/status/page.js", "text/javascript"), ("/status/page.css", "text/css")] {
        let r = c.get(path);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("Content-Type").unwrap().starts_with(kind), "{path}: {:?}", r.header("Content-Type"));
        assert!(r.header("Content-Security-Policy").unwrap().contains("default-src 'self'"), "{path}");
        assert_eq!(r.header("X-Frame-Options"), Some("DENY"));
        // Nothing is fetched from elsewhere: no absolute URLs in src/href/url().
        assert!(!outside.is_match(&r.body), "{path} refers to another site");
        total += r.body.len();
        s.anonymous().get(path).assert_status(401);
    }
    assert!(total < 150 * 1024, "the page weighs {total} bytes");
    eprintln!("status page: {total} bytes (html, js, css)");
    c.call(Req::new("POST", "/")).assert_status(405);
}

#[test]
fn events_stream_snapshots_without_holding_a_worker() {
    let config = crate::mqtt::site_config("").replace("workers = 2", "workers = 1");
    let s = Service::start_with(
        "events_stream_snapshots_without_holding_a_worker",
        Options { config: &config, env: vec![] },
    );
    let c = s.admin_client();
    let auth = basic(&s.admin.email, &s.admin.token);
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let mut first = Events::open(s.addr, &auth);
    assert!(first.head.starts_with("HTTP/1.1 200"), "{}", first.head);
    assert!(first.head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{}", first.head);
    // The caller's call count, as on every answer (the stream itself does not count: one
    // call, the contact, so far).
    assert!(first.head.contains("Http-X-Service-Api-Call-Limit: 1/"), "{}", first.head);
    let snap = first.next_where("the site map", |v| v["floors"].as_array().is_some_and(|f| !f.is_empty()));
    let zones: Vec<&str> =
        snap["floors"][0]["zones"].as_array().unwrap().iter().map(|z| z["name"].as_str().unwrap()).collect();
    assert_eq!(zones, ["Kitchen", "Office"], "{snap}");
    assert_eq!(snap["health"]["version"], env!("CARGO_PKG_VERSION"));
    // More open pages than workers, and the API still answers.
    let mut others: Vec<Events> = (0..3).map(|_| Events::open(s.addr, &auth)).collect();
    for e in &mut others {
        e.next_where("a first snapshot", |_| true);
    }
    c.get("/contacts").assert_status(200);
    // A change shows up on every open page.
    crate::mqtt::add_badge(&c, &format!(r#", "label": "Badge 22", "contactid": {ann}"#));
    let snap = first.next_where("the new badge", |v| v["devices"].as_array().is_some_and(|d| !d.is_empty()));
    assert_eq!(snap["devices"][0]["label"], "Badge 22", "{snap}");
    assert_eq!(snap["devices"][0]["contactname"], "Ann Lee", "{snap}");
    for e in &mut others {
        e.next_where("the new badge", |v| v["devices"].as_array().is_some_and(|d| !d.is_empty()));
    }
    // The same snapshot as a document.
    let doc = c.get_json("/status/snapshot").json();
    assert_eq!(doc["devices"][0]["deviceaddress"], "5/1/22", "{doc}");
    // Without credentials: 401, no stream.
    let refused = Events::open(s.addr, "Basic bm9ib2R5Om5vdGhpbmc=");
    assert!(refused.head.starts_with("HTTP/1.1 401"), "{}", refused.head);
    // A user who may not see Ann's contact sees the badge without her name.
    let bob = s.add_user("bob@acme.test", "Bob", &[]);
    let mut bobs = Events::open(s.addr, &basic(&bob.email, &bob.token));
    let snap = bobs.next_where("the badge", |v| v["devices"].as_array().is_some_and(|d| !d.is_empty()));
    assert_eq!(snap["devices"][0]["contactname"], "", "{snap}");
    // Disabling the user ends the user's stream.
    assert!(s.cli(&["user", "disable", "--email", "bob@acme.test"]).status.success());
    assert!(bobs.closed_within(Duration::from_secs(30)), "the stream of a disabled user stayed open");
    // Shutdown ends the open streams and the service stops.
    assert_eq!(s.terminate(), Some(0));
    assert!(first.closed_within(Duration::from_secs(5)));
}

/// At most 32 status pages at once, at most four of them one user's (one user of any
/// organisation held all 32 and locked everyone else out).
/// The page's health says when the database takes no writes (its folder moved away here; a
/// full disk does the same), as `/health` does, and when it takes them again.
#[test]
fn the_page_shows_when_the_database_takes_no_writes() {
    let s = Service::start("the_page_shows_when_the_database_takes_no_writes");
    let mut events = Events::open(s.addr, &basic(&s.admin.email, &s.admin.token));
    let snap = events.next_where("a first snapshot", |_| true);
    assert_eq!(snap["health"]["storage"], "", "{snap}");
    assert!(snap["health"]["diskfreebytes"].as_i64().unwrap() > 0, "{snap}");
    assert!(snap["health"]["disklow"] == 0 || snap["health"]["disklow"] == 1, "{snap}");
    std::fs::rename(s.dir.join("data"), s.dir.join("data.moved")).unwrap();
    let snap = events.next_where("the storage problem", |v| v["health"]["storage"] != "");
    let storage = snap["health"]["storage"].as_str().unwrap();
    assert!(storage.contains("sitegate.db"), "{storage}");
    assert_eq!(s.anonymous().get_json("/health").status, 503);
    std::fs::rename(s.dir.join("data.moved"), s.dir.join("data")).unwrap();
    events.next_where("the storage back", |v| v["health"]["storage"] == "");
}

/// While the database cannot be read (moved away, and every pooled read connection taken by
/// slow reads, so that the snapshot needs a new connection, which cannot be opened), an open
/// page keeps its stream and is sent its last snapshot with the gateway's health, which says
/// what is wrong; the full snapshots come back with the database. The stream used to end
/// there, and the page, reconnecting, could not be served either.
#[test]
fn the_page_stays_open_while_the_database_cannot_be_read() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 8\nread_time_max_ms = 10000");
    let s = Service::start_with(
        "the_page_stays_open_while_the_database_cannot_be_read",
        Options { config: &config, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    let c = s.admin_client();
    c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    let mut events = Events::open(s.addr, &basic(&s.admin.email, &s.admin.token));
    let first = events.next_where("a first snapshot", |_| true);
    assert_eq!(first["health"]["storage"], "", "{first}");
    std::fs::rename(s.dir.join("data"), s.dir.join("data.moved")).unwrap();
    let slow: Vec<_> = (0..8)
        .map(|_| {
            let c = s.admin_client();
            std::thread::spawn(move || c.get_json("/_fault/slowread").status)
        })
        .collect();
    let snap = events.next_where("the storage problem", |v| v["health"]["storage"] != "");
    assert!(snap["health"]["storage"].as_str().unwrap().contains("sitegate.db"), "{snap}");
    // What the page showed is still there.
    assert_eq!(snap["floors"], first["floors"], "{snap}");
    assert_eq!(snap["devices"], first["devices"], "{snap}");
    // A page opened now is either served (a read connection was free) or told the service
    // is unavailable (503), never a fault of the service (500).
    let other = Events::open(s.addr, &basic(&s.admin.email, &s.admin.token));
    assert!(other.head.starts_with("HTTP/1.1 200") || other.head.starts_with("HTTP/1.1 503"), "{}", other.head);
    drop(other);
    for t in slow {
        assert_ne!(t.join().unwrap(), 200);
    }
    std::fs::rename(s.dir.join("data.moved"), s.dir.join("data")).unwrap();
    events.next_where("the storage back", |v| v["health"]["storage"] == "");
    assert_eq!(s.anonymous().get_json("/health").status, 200);
}

#[test]
fn open_pages_are_bounded() {
    let s = Service::start("open_pages_are_bounded");
    let auth = basic(&s.admin.email, &s.admin.token);
    // Four of one user's: a fifth is refused, others' are not.
    let mut open: Vec<Events> = (0..4).map(|_| Events::open(s.addr, &auth)).collect();
    assert!(open.iter().all(|e| e.head.starts_with("HTTP/1.1 200")));
    let over = Events::open(s.addr, &auth);
    assert!(over.head.starts_with("HTTP/1.1 503"), "{}", over.head);
    // 32 in all.
    let users: Vec<String> = (0..8)
        .map(|i| {
            let u = s.add_user(&format!("viewer{i}@acme.test"), &format!("Viewer {i}"), &[]);
            basic(&u.email, &u.token)
        })
        .collect();
    for auth in &users[..7] {
        open.extend((0..4).map(|_| Events::open(s.addr, auth)));
    }
    assert!(open.iter().all(|e| e.head.starts_with("HTTP/1.1 200")));
    assert_eq!(open.len(), 32);
    let over = Events::open(s.addr, &users[7]);
    assert!(over.head.starts_with("HTTP/1.1 503"), "{}", over.head);
    drop(open);
    wait_for("a stream slot to come back", || {
        Events::open(s.addr, &auth).head.starts_with("HTTP/1.1 200").then_some(())
    });
}

#[test]
fn changes_from_pages_of_other_origins_are_refused() {
    let s = Service::start("changes_from_pages_of_other_origins_are_refused");
    let c = s.admin_client();
    let host = s.addr.to_string();
    let create = |headers: &[(&str, &str)]| {
        let mut req = Req::new("POST", "/contacts").json().json_body(r#"{"firstname": "Forged"}"#);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        c.call(req)
    };
    for headers in [
        vec![("Origin", "http://evil.example")],
        vec![("Origin", "null")],
        vec![("Origin", "http://127.0.0.1:1")],
        vec![("Sec-Fetch-Site", "cross-site")],
    ] {
        let r = create(&headers);
        assert_eq!(r.status, 403, "{headers:?}: {}", r.body);
        assert!(r.json()["errors"]["accessdenied"].is_string(), "{}", r.body);
    }
    let batch = "--b\r\nContent-Type: application/http\r\n\r\nPOST /contacts HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{\"firstname\": \"Forged\"}\r\n--b--\r\n";
    let r = c.call(
        Req::new("POST", "/batch").header("Origin", "http://evil.example").body("multipart/mixed; boundary=b", batch),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(c.list_ids("/contacts").is_empty(), "a forged request changed something");
    // The page's own origin, and clients that send no Origin, may change things; reading is
    // not refused either way.
    create(&[("Origin", &format!("http://{host}")), ("Sec-Fetch-Site", "same-origin")]).assert_status(201);
    create(&[]).assert_status(201);
    c.call(Req::new("GET", "/contacts").header("Origin", "http://evil.example")).assert_status(200);
    // JSONP, the one answer another site's page can read (through a script tag that carries
    // the credentials the browser holds), is refused to such pages, as JSON it cannot read.
    let jsonp = |headers: &[(&str, &str)]| {
        let mut req = Req::new("GET", "/contacts?callback=steal");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        c.call(req)
    };
    for headers in [
        vec![("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Dest", "script")],
        vec![("Sec-Fetch-Site", "same-site")],
        vec![("Origin", "http://evil.example")],
    ] {
        let r = jsonp(&headers);
        assert_eq!(r.status, 403, "{headers:?}: {}", r.body);
        assert!(!r.body.contains("steal") && !r.body.contains("Forged"), "{}", r.body);
        assert!(r.json()["errors"]["accessdenied"].is_string(), "{}", r.body);
    }
    for headers in [vec![("Sec-Fetch-Site", "same-origin")], vec![("Sec-Fetch-Site", "none")], vec![]] {
        let r = jsonp(&headers);
        assert_eq!(r.status, 200, "{headers:?}: {}", r.body);
        assert!(r.body.starts_with("steal(") && r.body.contains("Forged"), "{}", r.body);
    }
}
