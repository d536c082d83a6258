//! HTTP behaviour as clients meet it: paths with and without a slash, no redirects, framing,
//! keep-alive, limits and timeouts, panics, quota, HTTPS, shutdown.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::{BASE_CONFIG, Options, Req, Service, basic, read_response};

#[test]
fn paths_work_with_and_without_a_trailing_slash() {
    let s = Service::start("paths_work_with_and_without_a_trailing_slash");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Ann"}"#);
    for path in [
        "/contacts".to_string(),
        "/contacts/".to_string(),
        format!("/contacts/{id}"),
        format!("/contacts/{id}/"),
        "/ownership".into(),
        "/ownership/".into(),
        "/contacts/categories".into(),
        "/contacts/categories/".into(),
        "/contacts/fields".into(),
        "/contacts/fields/".into(),
    ] {
        let r = c.get(&path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    // POST to the slashed form creates; it is never redirected.
    let r = c.post_json("/contacts/", r#"{"firstname": "Bob"}"#);
    assert_eq!(r.status, 201);
    assert!(r.header("Location").is_some_and(|l| l.starts_with("/contacts/")));
}

#[test]
fn errors_have_the_api_shape() {
    let s = Service::start("errors_have_the_api_shape");
    let c = s.admin_client();
    let r = c.get("/nothing/here");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("<resourcenotfound>"), "{}", r.body);
    let r = c.call(Req::new("PATCH", "/contacts/1"));
    assert_eq!(r.status, 405);
    // HEAD is answered wherever GET is.
    assert_eq!(r.header("Allow"), Some("GET, HEAD, PUT, DELETE"));
    let r = c.call(Req::new("DELETE", "/contacts").json());
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["errors"]["methodnotallowed"].as_str().map(|s| s.contains("GET, HEAD, POST")), Some(true));
    assert_eq!(r.header("Http-X-Service-Api-Call-Limit"), Some("3/10000"));
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let s = Service::start("keep_alive_serves_many_requests_on_one_connection");
    let auth = basic(&s.admin.email, &s.admin.token);
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    for i in 0..5 {
        let body = format!(r#"{{"firstname": "P{i}"}}"#);
        let req = format!(
            "POST /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).unwrap();
        let r = read_response(&mut stream);
        assert_eq!(r.status, 201, "{}", r.body);
    }
    // A GET with a body (list parameters) on the same connection.
    let body = "<request><limit>2</limit></request>";
    let req = format!(
        "GET /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).unwrap();
    let r = read_response(&mut stream);
    assert_eq!(r.xml_text("count").as_deref(), Some("5"));
    assert_eq!(r.body.matches("<firstname>").count(), 2);
}

#[test]
fn a_panicking_handler_fails_that_request_only() {
    let s = Service::start_with(
        "a_panicking_handler_fails_that_request_only",
        Options { config: BASE_CONFIG, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    let c = s.admin_client();
    for _ in 0..3 {
        let r = c.get_json("/_fault/panic");
        assert_eq!(r.status, 500);
        let msg = r.json()["errors"]["internalerror"].as_str().unwrap().to_string();
        assert!(msg.contains("reference"), "{msg}");
        // The next request is served, by the same workers.
        c.get("/contacts").assert_status(200);
    }
    // Without the switch the path does not exist.
    let plain = Service::start("a_panicking_handler_fails_that_request_only_off");
    plain.admin_client().get("/_fault/panic").assert_status(404);
}

/// With every worker busy and the queue full, a request is answered 503 at once, in the
/// encoding it asked for; the held requests are still served.
#[test]
fn a_full_queue_answers_503_in_the_asked_encoding() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 1\nqueue_depth_max = 1");
    let s = Service::start_with(
        "a_full_queue_answers_503_in_the_asked_encoding",
        Options { config: &config, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    // One request holds the worker, one waits in the queue; the rest find it full. Tried
    // again (up to the deadline) when a slow machine let the timing come out otherwise.
    let c = s.admin_client();
    let (json, xml) = crate::support::wait_for("503 answers while the queue is full", || {
        let hold = || {
            let c = s.admin_client();
            let held = std::thread::spawn(move || c.get("/_fault/hold").status);
            std::thread::sleep(Duration::from_millis(100));
            held
        };
        let held = [hold(), hold()];
        let json = c.get_json("/contacts");
        let xml = c.get("/contacts");
        let served = held.into_iter().all(|h| h.join().unwrap() == 200);
        (served && json.status == 503 && xml.status == 503).then_some((json, xml))
    });
    assert!(json.header("Content-Type").unwrap().starts_with("application/json"), "{json:?}");
    assert!(json.json()["errors"].is_object(), "{}", json.body);
    assert!(xml.header("Content-Type").unwrap().starts_with("application/xml"), "{xml:?}");
    assert!(xml.body.contains("<errors>"), "{}", xml.body);
    // Once the queue drains the service answers again.
    c.get("/contacts").assert_status(200);
}

#[test]
fn bodies_over_the_limit_get_413_and_slow_bodies_408() {
    let config = format!("{BASE_CONFIG}\n").replace(
        "workers = 2",
        "workers = 2\nbody_bytes_max = 4096\nbody_read_timeout_ms = 500\nheader_read_timeout_ms = 500",
    );
    let s = Service::start_with(
        "bodies_over_the_limit_get_413_and_slow_bodies_408",
        Options { config: &config, env: vec![] },
    );
    let c = s.admin_client();
    // Declared too large.
    let r = c.post_json("/contacts", &format!(r#"{{"background": "{}"}}"#, "x".repeat(5000)));
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.json()["errors"]["requesttoolarge"].is_string());
    // Chunked, found too large while reading.
    let auth = basic(&s.admin.email, &s.admin.token);
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let chunk = "y".repeat(3000);
    let req = format!(
        "POST /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    stream.write_all(req.as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream).status, 413);
    // Just under the limit is fine.
    let ok = format!(r#"{{"background": "{}"}}"#, "x".repeat(3000));
    c.post_json("/contacts", &ok).assert_status(201);
    // A body that stops arriving: 408 after the body timeout.
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "POST /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"first"
    );
    stream.write_all(req.as_bytes()).unwrap();
    let r = read_response(&mut stream);
    assert_eq!(r.status, 408, "{}", r.body);
    // An idle connection is closed after the header timeout.
    let mut idle = TcpStream::connect(s.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = idle.read(&mut buf).unwrap_or(0);
    assert!(n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"), "idle connection got data");
    assert!(started.elapsed() < Duration::from_secs(25), "idle connection was not closed");
    // The service still answers.
    c.get("/contacts").assert_status(200);
}

#[test]
fn oversized_headers_are_refused() {
    let s = Service::start("oversized_headers_are_refused");
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!("GET /contacts HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
    let _ = stream.write_all(req.as_bytes());
    let mut head = String::new();
    let _ = stream.read_to_string(&mut head);
    assert!(head.is_empty() || head.starts_with("HTTP/1.1 431"), "{head}");
    s.admin_client().get("/contacts").assert_status(200);
}

#[test]
fn quota_counts_calls_per_user_and_survives_a_restart() {
    let config = BASE_CONFIG.to_string() + "\n[api]\nquota_calls_per_hour = 5\n";
    let s = Service::start_with(
        "quota_counts_calls_per_user_and_survives_a_restart",
        Options { config: &config, env: vec![] },
    );
    let bob = s.add_user("bob@acme.test", "Bob", &[]);
    let c = s.admin_client();
    for i in 1..=5 {
        let r = c.get("/contacts");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("Http-X-Service-Api-Call-Limit"), Some(format!("{i}/5").as_str()));
    }
    let r = c.get_json("/contacts");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("Http-X-Service-Api-Call-Limit"), Some("5/5"));
    let retry: u64 = r.header("Retry-After").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry));
    assert!(r.json()["errors"]["quotaexceeded"].is_string());
    // Another user has their own quota.
    let b = s.client(&bob);
    assert_eq!(b.get("/contacts").header("Http-X-Service-Api-Call-Limit"), Some("1/5"));
    // Counters are kept across a restart (written at shutdown).
    let admin = s.admin.clone();
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    // Near the top of the hour the window could roll over: then the counter starts at zero.
    let hour_before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 3600;
    assert_eq!(s.terminate(), Some(0));
    let s = Service::launch(dir, cfg, &[]);
    let hour_after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 3600;
    if hour_before == hour_after {
        s.client(&admin).get("/contacts").assert_status(429);
        assert_eq!(s.client(&bob).get("/contacts").header("Http-X-Service-Api-Call-Limit"), Some("2/5"));
    }
}

#[test]
fn sigterm_stops_the_service_cleanly() {
    let s = Service::start("sigterm_stops_the_service_cleanly");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Durable"}"#);
    c.get(&format!("/contacts/{id}")).assert_status(200);
    let admin = s.admin.clone();
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    let started = Instant::now();
    assert_eq!(s.terminate(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(20));
    let s = Service::launch(dir, cfg, &[]);
    // The record is there, and the viewed stamp of the show before shutdown was written.
    let v = s.client(&admin).get_json("/contacts").json();
    assert_eq!(v[id.to_string()]["name"], "Durable");
    assert_ne!(v[id.to_string()]["viewed"], "", "{v}");
}

#[test]
fn https_serves_the_same_api() {
    let dir = crate::support::test_dir("https_serves_the_same_api_certs");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let config = https_config(&dir, &ck.cert.pem(), &ck.signing_key.serialize_pem());
    let s = Service::start_with("https_serves_the_same_api", Options { config: &config, env: vec![] });
    let https: std::net::SocketAddr = s
        .ready_line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("https="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no https= in {:?}", s.ready_line));
    assert!(s.ready_line.starts_with(&format!("ready http={} https=", s.addr)), "{}", s.ready_line);

    let get = |path: &str| -> String {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ck.cert.der().clone()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let client_config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(std::sync::Arc::new(client_config), name).unwrap();
        let tcp = TcpStream::connect(https).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let auth = basic(&s.admin.email, &s.admin.token);
        write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        let _ = tls.read_to_string(&mut text);
        text
    };
    let text = get("/ownership");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("admin@sitegate.local"), "{text}");
    // A client that connects and says nothing does not hold up the others.
    let _silent = TcpStream::connect(https).unwrap();
    assert!(get("/contacts").starts_with("HTTP/1.1 200"));
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let s = Service::start("acknowledged_writes_survive_kill_9");
    let c = s.admin_client();
    let ids: Vec<i64> = (0..20).map(|i| c.create("contacts", &format!(r#"{{"firstname": "K{i}"}}"#))).collect();
    c.put_json(&format!("/contacts/{}", ids[0]), r#"{"jobtitle": "Kept"}"#).assert_status(200);
    let admin = s.admin.clone();
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    let _ = std::process::Command::new("kill").arg("-KILL").arg(s.pid().to_string()).status();
    drop(s);
    let s = Service::launch(dir, cfg, &[]);
    let c = s.client(&admin);
    assert_eq!(c.list_ids("/contacts?sortfield=created&limit=100"), ids);
    assert_eq!(c.get_json(&format!("/contacts/{}", ids[0])).json()["item"]["fields"]["jobtitle"], "Kept");
}

#[test]
fn the_api_description_is_served_without_credentials() {
    let s = Service::start("the_api_description_is_served_without_credentials");
    let r = s.anonymous().get("/openapi.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    let doc: serde_json::Value = serde_json::from_str(&r.body).expect("JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
    for path in ["/contacts", "/contacts/{id}", "/hooks", "/batch", "/locate", "/alerts", "/health", "/status/events"] {
        assert!(doc["paths"][path].is_object(), "{path} is not described");
    }
    s.anonymous().call(Req::new("POST", "/openapi.json")).assert_status(405);
}

/// HEAD is answered as GET without the body (RFC 9110: every general-purpose server supports
/// GET and HEAD): the same status and Content-Length, then the next answer on the connection.
#[test]
fn head_answers_as_get_without_the_body() {
    let s = Service::start("head_answers_as_get_without_the_body");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let get = c.get(&format!("/contacts/{id}"));
    let auth = basic(&s.admin.email, &s.admin.token);
    let mut stream = std::net::TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(
        stream,
        "HEAD /contacts/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n\
         GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let length = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).unwrap();
    assert_eq!(length, get.body.len().to_string(), "{head}");
    assert!(rest.starts_with("HTTP/1.1 200"), "no body after the HEAD answer: {rest:?}");
    assert!(rest.contains("<health>ok</health>"), "{rest}");
}

/// A request's reads stop after `[http] read_time_max_ms` with 503 `serverbusy` saying so, and
/// its worker (the only one) serves the next request: a read that would run for minutes
/// held the worker, and every request behind it, for as long.
#[test]
fn reads_that_run_too_long_stop() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 1\nread_time_max_ms = 200");
    let s = Service::start_with(
        "reads_that_run_too_long_stop",
        Options { config: &config, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    let c = s.admin_client();
    let r = c.get_json("/_fault/slowread");
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("serverbusy") && r.body.contains("longer than 200 ms"), "{}", r.body);
    c.get_json("/contacts").assert_status(200);
}

/// A client that goes away while its request runs: the request's reads stop, and a batch runs
/// none of its parts after it; the worker (the only one) is free again. A plain read that
/// ran for minutes kept the worker for as long, though nobody would take the answer.
#[test]
fn reads_stop_when_their_client_goes_away() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 1");
    let s = Service::start_with(
        "reads_stop_when_their_client_goes_away",
        Options { config: &config, env: vec![("SITEGATE_FAULT_INJECTION", "1"), ("SITEGATE_LOG", "debug")] },
    );
    let c = s.admin_client();
    let part = "--b\r\nContent-Type: application/http\r\n\r\nGET /_fault/slowread HTTP/1.1\r\n\r\n\r\n";
    let body = format!("{part}{part}{part}--b--\r\n");
    let mut stream = TcpStream::connect(s.addr).unwrap();
    write!(
        stream,
        "POST /batch HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: multipart/mixed; boundary=b\r\nContent-Length: {}\r\n\r\n{body}",
        basic(&s.admin.email, &s.admin.token),
        body.len()
    )
    .unwrap();
    // Time for the first part to start (on a slow machine the batch may not have, and then
    // runs none of its parts).
    std::thread::sleep(Duration::from_millis(500));
    drop(stream);
    let log = crate::support::wait_for("the batch stopped", || {
        let log = s.stderr();
        (log.contains("batch: the client has gone;")
            && log.contains("POST /batch: its client had gone before the answer"))
        .then_some(log)
    });
    if log.contains("2 of 3 parts not run") {
        assert!(log.contains("batch part GET /_fault/slowread -> 503"), "{log}");
    } else {
        assert!(log.contains("3 of 3 parts not run"), "{log}");
    }
    c.get_json("/contacts").assert_status(200);
}

/// Requests of one item are not queued behind expensive ones: with the one worker that takes
/// expensive requests held by a read and another such read waiting, a show and a create are
/// answered at once by the other worker, and the waiting read runs after the first. With one
/// queue for all, both workers were held and the show waited for the reads' end.
#[test]
fn requests_of_one_item_pass_expensive_ones() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nheavy_workers = 1\nread_time_max_ms = 5000");
    let s = Service::start_with(
        "requests_of_one_item_pass_expensive_ones",
        Options { config: &config, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    let c = s.admin_client();
    let id = c.post_json("/contacts", r#"{"firstname": "Ada"}"#).json()["item"]["id"].as_i64().unwrap();
    let (done, held) = two_slow_reads(&s);
    let shown = c.get_json(&format!("/contacts/{id}"));
    let made = c.post_json("/contacts", r#"{"firstname": "Grace"}"#);
    let done_then = done.load(std::sync::atomic::Ordering::SeqCst);
    shown.assert_status(200);
    made.assert_status(201);
    assert_eq!(done_then, 0, "the show and the create waited for the expensive reads");
    // Both expensive reads ran, one after the other, each to its own time limit.
    for h in held {
        let r = h.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(r.body.contains("longer than 5000 ms"), "{}", r.body);
    }
}

/// A certificate that has expired, or expires within 30 days, is named in the journal at
/// start: every client of its listener would otherwise find out first.
#[test]
fn an_expired_or_expiring_certificate_is_warned_of() {
    let dir = crate::support::test_dir("an_expired_or_expiring_certificate_is_warned_of_certs");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2019, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    let config = https_config(&dir, &params.self_signed(&key).unwrap().pem(), &key.serialize_pem());
    let s = Service::start_with(
        "an_expired_or_expiring_certificate_is_warned_of",
        Options { config: &config, env: vec![] },
    );
    crate::support::wait_for("the expired certificate in the log", || {
        let log = s.stderr();
        (log.contains("`http.tls_cert`") && log.contains("expired on 2020-01-01")).then_some(())
    });
}

/// With no worker kept for requests of one item (here the only one), the worker takes the
/// lanes in turn: a request of one item waiting behind an expensive one runs before the
/// next expensive one, and a stream of those cannot hold it back for good.
#[test]
fn with_one_worker_the_lanes_take_turns() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 1\nread_time_max_ms = 3000");
    let s = Service::start_with(
        "with_one_worker_the_lanes_take_turns",
        Options { config: &config, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    let c = s.admin_client();
    let (done, held) = two_slow_reads(&s);
    c.get_json("/health").assert_status(200);
    let done_then = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(done_then < 2, "the request of one item waited for both expensive ones");
    for h in held {
        assert_eq!(h.join().unwrap().status, 503);
    }
}

/// The configuration of a service that also serves HTTPS, with this certificate and key.
fn https_config(dir: &std::path::Path, cert_pem: &str, key_pem: &str) -> String {
    std::fs::write(dir.join("server.crt"), cert_pem).unwrap();
    std::fs::write(dir.join("server.key"), key_pem).unwrap();
    BASE_CONFIG.replace(
        "workers = 2",
        &format!(
            "workers = 2\ntls_listen = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"",
            dir.join("server.crt").display(),
            dir.join("server.key").display()
        ),
    )
}

/// Two `/_fault/slowread` requests, each from its own client, the second sent 200 ms after the
/// first; how many have been answered, and their threads.
fn two_slow_reads(
    s: &Service,
) -> (std::sync::Arc<std::sync::atomic::AtomicUsize>, [std::thread::JoinHandle<crate::support::Resp>; 2]) {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let slow = || {
        let (c, done) = (s.admin_client(), std::sync::Arc::clone(&done));
        let held = std::thread::spawn(move || {
            let r = c.get_json("/_fault/slowread");
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(200));
        held
    };
    let held = [slow(), slow()];
    (done, held)
}
