//! Hostile clients: idle and slow connections by the thousand, oversized and garbage input on
//! the wire, guessed credentials. Each case checks that other clients are still answered.
//! Attackers connect from other loopback addresses (127.0.0.2, ...) than the honest client
//! (127.0.0.1), as they would from other hosts.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::support::*;

/// A TCP connection to `to` from the loopback address `from`.
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    connect_from_with(from, to, None)
}

/// [`connect_from`], with a receive buffer of `recv_buffer` bytes if given (fixed: the
/// kernel's autotuning would otherwise grow it to `tcp_rmem`'s maximum, 32 MiB on some hosts).
fn connect_from_with(from: &str, to: SocketAddr, recv_buffer: Option<u32>) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let from: IpAddr = from.parse().map_err(std::io::Error::other)?;
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        if let Some(bytes) = recv_buffer {
            socket.set_recv_buffer_size(bytes)?;
        }
        socket.bind(SocketAddr::new(from, 0))?;
        socket.connect(to).await
    })?;
    let stream = rt.block_on(async { stream.into_std() })?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// One request on a connection from `from`; the response.
fn call_from(from: &str, to: SocketAddr, auth: &str, path: &str) -> Resp {
    let mut stream = connect_from(from, to).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    read_response(&mut stream)
}

/// True when the peer closed the connection (or reset it) within `wait`.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // A 408 on the way out is a close too.
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn thousands_of_idle_and_slow_connections_do_not_lock_out_others() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nheader_read_timeout_ms = 30000");
    let s = Service::start_with(
        "thousands_of_idle_and_slow_connections_do_not_lock_out_others",
        Options { config: &config, env: vec![] },
    );
    let c = s.admin_client();
    // 2,000 idle connections from one address: 256 (connections_per_address_max) are held,
    // the rest are closed at once; the honest client is answered all the while.
    let mut idle = Vec::new();
    for _ in 0..2_000 {
        match connect_from("127.0.0.2", s.addr) {
            Ok(stream) => idle.push(stream),
            Err(e) => panic!("connect: {e}"),
        }
    }
    c.get("/contacts").assert_status(200);
    // ...before the header read timeout freed any slot: the first idle connections are open.
    for stream in idle.iter_mut().take(10) {
        assert!(!closed_within(stream, Duration::from_millis(1)), "an idle connection was closed early");
    }
    // The last 100 are over the bound: each is closed as soon as it is accepted.
    let mut open: Vec<&mut TcpStream> = idle.iter_mut().rev().take(100).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !open.is_empty() && Instant::now() < deadline {
        open.retain_mut(|stream| !closed_within(stream, Duration::from_millis(20)));
    }
    assert!(open.is_empty(), "{} of the last 100 connections over the per-address bound stayed open", open.len());
    // Slowloris from four more addresses: headers one byte at a time, never finished.
    let mut slow = Vec::new();
    for n in 3..=6 {
        for _ in 0..100 {
            let mut stream = connect_from(&format!("127.0.0.{n}"), s.addr).expect("connect");
            stream.write_all(b"GET /contacts HTTP/1.1\r\nHost: x\r\n").unwrap();
            slow.push(stream);
        }
    }
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(2) {
        for stream in slow.iter_mut().step_by(10) {
            let _ = stream.write_all(b"X");
        }
        c.get("/contacts").assert_status(200);
        answered += 1;
    }
    assert!(answered > 0);
    // The header read timeout (30 s here, long enough for 2,000 connects on a busy machine)
    // closes them all, idle and slow alike.
    let deadline = Instant::now() + Duration::from_secs(90);
    for stream in slow.iter_mut().chain(idle.iter_mut().take(256)) {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        assert!(closed_within(stream, left), "a slow or idle connection was still open after 90 s");
    }
    let metrics = c.get("/metrics").body;
    let refused: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sitegate_http_connections_refused_per_address_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no per-address refusal counter in {metrics}"));
    assert!(refused >= 1_700.0, "{refused}");
    c.get("/contacts").assert_status(200);
}

#[test]
fn garbage_on_the_wire_gets_400_and_a_close_and_others_are_answered() {
    let s = Service::start("garbage_on_the_wire_gets_400_and_a_close_and_others_are_answered");
    let c = s.admin_client();
    let auth = basic(&s.admin.email, &s.admin.token);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("binary", vec![0u8, 0xff, 0xfe, 0x01, b'\r', b'\n', b'\r', b'\n']),
        ("no version", b"GET /contacts\r\n\r\n".to_vec()),
        ("bad header line", b"GET /contacts HTTP/1.1\r\nHost x\r\n\r\n".to_vec()),
        ("bad content-length", b"POST /contacts HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec()),
        (
            "two content-lengths",
            b"POST /contacts HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!".to_vec(),
        ),
        ("bad chunk", b"POST /contacts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec()),
        ("many headers", {
            let mut r = b"GET /contacts HTTP/1.1\r\n".to_vec();
            for i in 0..500 {
                r.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
            }
            r.extend_from_slice(b"\r\n");
            r
        }),
        ("long request line", format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(100_000)).into_bytes()),
    ];
    for (name, bytes) in &cases {
        let mut stream = TcpStream::connect(s.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = stream.write_all(bytes);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.1 431"),
            "{name}: {text}"
        );
        c.get("/contacts").assert_status(200);
    }
    // A good request followed by garbage on one connection: the first is answered, then the
    // connection is closed.
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut pipelined =
        format!("GET /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nAccept: application/json\r\n\r\n")
            .into_bytes();
    pipelined.extend_from_slice(b"\x16\x03\x01\x02\x00garbage\r\n\r\n");
    stream.write_all(&pipelined).unwrap();
    let first = read_response(&mut stream);
    assert_eq!(first.status, 200, "{}", first.body);
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.is_empty() || rest.starts_with("HTTP/1.1 400"), "{rest}");
    c.get("/contacts").assert_status(200);
}

/// The wall clock set back an hour during a lockout (NTP correcting it) neither ends the
/// lockout nor makes it last the hour: it runs on the monotonic clock. Under libfaketime,
/// which reads the clock's offset from a file at every look.
#[test]
fn a_clock_set_back_neither_ends_nor_lengthens_a_lockout() {
    let stepped = crate::support::SteppedClock::new("lockout_clock_step_offset");
    let (clock, env) = (&stepped.offset, stepped.env());
    let config = BASE_CONFIG.to_string() + "\n[api]\nlogin_failures_max = 3\nlogin_lockout_s = 3\n";
    let s = Service::start_with("lockout_clock_step", Options { config: &config, env });
    let wrong = basic("nobody@acme.test", &"0".repeat(64));
    for _ in 0..3 {
        call_from("127.0.0.2", s.addr, &wrong, "/contacts").assert_status(401);
    }
    call_from("127.0.0.2", s.addr, &wrong, "/contacts").assert_status(429);
    std::fs::write(clock, "-3600").unwrap();
    call_from("127.0.0.2", s.addr, &wrong, "/contacts").assert_status(429);
    std::thread::sleep(Duration::from_secs(4));
    call_from("127.0.0.2", s.addr, &wrong, "/contacts").assert_status(401);
}

#[test]
fn failed_logins_lock_out_the_address_not_the_others() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nmetrics_token = \"scrape-me-please-0123\"")
        + "\n[api]\nlogin_failures_max = 5\nlogin_lockout_s = 3\n";
    let scrape = "Bearer scrape-me-please-0123";
    let s = Service::start_with(
        "failed_logins_lock_out_the_address_not_the_others",
        Options { config: &config, env: vec![] },
    );
    let ann = s.add_user("ann@acme.test", "Ann", &[]);
    let good = basic(&ann.email, &ann.token);
    let wrong_token = basic(&ann.email, &"0".repeat(64));
    let unknown_user = basic("nobody@acme.test", &"0".repeat(64));
    // No credentials at all is not a failure (clients ask without them first).
    for _ in 0..10 {
        s.anonymous().get("/contacts").assert_status(401);
    }
    call_from("127.0.0.2", s.addr, &good, "/contacts").assert_status(200);
    // Four guesses are answered 401; the fifth locks the address out.
    for i in 0..5 {
        let auth = if i % 2 == 0 { &wrong_token } else { &unknown_user };
        call_from("127.0.0.2", s.addr, auth, "/contacts").assert_status(401);
    }
    let locked = call_from("127.0.0.2", s.addr, &wrong_token, "/contacts");
    assert_eq!(locked.status, 429, "{}", locked.body);
    assert!(locked.json()["errors"]["toomanyfailedlogins"].is_string(), "{}", locked.body);
    let retry: u64 = locked.header("Retry-After").expect("Retry-After").parse().unwrap();
    assert!((1..=3).contains(&retry), "{retry}");
    // Through a batch too: its nested requests are refused the same way.
    let batch = "--b\r\nContent-Type: application/http\r\n\r\nGET /contacts HTTP/1.1\r\nAccept: application/json\r\n\r\n\r\n--b--\r\n";
    let mut stream = connect_from("127.0.0.2", s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        stream,
        "POST /batch HTTP/1.1\r\nHost: x\r\nAuthorization: {wrong_token}\r\nContent-Type: multipart/mixed; boundary=b\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{batch}",
        batch.len()
    )
    .unwrap();
    let answer = read_response(&mut stream);
    assert!(answer.body.contains("429"), "{}", answer.body);
    assert!(!answer.body.contains("\"item\""), "{}", answer.body);
    // Credentials that verify are still accepted from the locked-out address: the other
    // systems behind it (a NAT, an integration server) are not locked out with the one
    // that keeps failing. The metrics token, the operator's own words, is not let through.
    call_from("127.0.0.2", s.addr, &good, "/contacts").assert_status(200);
    assert_eq!(call_from("127.0.0.2", s.addr, scrape, "/metrics").status, 429);
    // Other addresses are not affected.
    s.client(&ann).get("/contacts").assert_status(200);
    call_from("127.0.0.3", s.addr, &good, "/contacts").assert_status(200);
    // The lockout ends.
    wait_for("the lockout to end", || {
        (call_from("127.0.0.2", s.addr, &wrong_token, "/contacts").status == 401).then_some(())
    });
    let metrics = call_from("127.0.0.3", s.addr, scrape, "/metrics").body;
    // Five, and the one that found the lockout over.
    assert!(metrics.contains("sitegate_login_failures_total 6"), "{metrics}");
    // Wrong metrics tokens count as failed logins (the token may be a guessable phrase).
    for _ in 0..5 {
        call_from("127.0.0.4", s.addr, "Bearer a-guess-of-the-phrase", "/metrics").assert_status(401);
    }
    assert_eq!(call_from("127.0.0.4", s.addr, scrape, "/metrics").status, 429);
}

#[test]
fn failed_mqtt_logins_count_towards_the_same_lockout() {
    let config = BASE_CONFIG.to_string() + "\n[api]\nlogin_failures_max = 3\nlogin_lockout_s = 600\n";
    let s = Service::start_with(
        "failed_mqtt_logins_count_towards_the_same_lockout",
        Options { config: &config, env: vec![] },
    );
    let addr = crate::mqtt::mqtt_addr(&s);
    let password = crate::mqtt::mqtt_user(&s, "acme", "intercom-1", false);
    for i in 0..3 {
        let refused = crate::mqtt::connect(addr, &format!("guess-{i}"), "intercom-1", "wrong").err();
        assert!(refused.is_some(), "a wrong password was accepted");
    }
    // 127.0.0.1 is locked out now: a wrong password, and a wrong API token, get no further
    // (429 for the API); the right ones are still let in.
    for i in 0..5 {
        let refused = crate::mqtt::connect(addr, &format!("again-{i}"), "intercom-1", "wrong").err();
        assert!(refused.is_some(), "a wrong password was accepted");
    }
    let wrong = crate::support::Account { email: s.admin.email.clone(), token: "0".repeat(64) };
    s.client(&wrong).get("/contacts").assert_status(429);
    assert!(crate::mqtt::connect(addr, "right", "intercom-1", &password).is_ok(), "the right password was refused");
    s.admin_client().get("/contacts").assert_status(200);
    // The journal names the address once for the lockout, not once for each refused retry.
    let log = s.stderr();
    assert_eq!(log.matches("failed logins from 127.0.0.1: address locked out").count(), 1, "{log}");
    assert_eq!(log.matches("mqtt: refused").count(), 3, "{log}");
}

#[test]
fn unknown_users_and_wrong_tokens_look_the_same() {
    let config = BASE_CONFIG.to_string() + "\n[api]\nlogin_failures_max = 100000\n";
    let s =
        Service::start_with("unknown_users_and_wrong_tokens_look_the_same", Options { config: &config, env: vec![] });
    let ann = s.add_user("ann@acme.test", "Ann", &[]);
    let wrong_token = Client { addr: s.addr, auth: Some(basic(&ann.email, &"0".repeat(64))) };
    let unknown_user = Client { addr: s.addr, auth: Some(basic("nobody@acme.test", &"0".repeat(64))) };
    for path in ["/contacts", "/contacts/1", "/hooks", "/locate", "/nosuchpath"] {
        for json in [false, true] {
            let req = |c: &Client| {
                let r = if json { c.get_json(path) } else { c.get(path) };
                let mut headers: Vec<_> =
                    r.headers.iter().filter(|(k, _)| !k.eq_ignore_ascii_case("date")).cloned().collect();
                headers.sort();
                (r.status, headers, r.body)
            };
            let a = req(&wrong_token);
            let b = req(&unknown_user);
            assert_eq!(a, b, "{path} json={json}");
            assert_eq!(a.0, 401);
        }
    }
    // Similar time: medians of alternating requests within a factor of two of each other.
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..200 {
        for (i, c) in [&wrong_token, &unknown_user].iter().enumerate() {
            let started = Instant::now();
            c.get("/contacts").assert_status(401);
            times[i].push(started.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64()
    };
    let (wrong, unknown) = (median(&mut times[0]), median(&mut times[1]));
    eprintln!("median time to 401: wrong token {:.0} µs, unknown user {:.0} µs", wrong * 1e6, unknown * 1e6);
    assert!(wrong / unknown < 2.0 && unknown / wrong < 2.0, "wrong token {wrong} s, unknown user {unknown} s");
}

#[test]
fn tokens_never_reach_the_log() {
    let config = BASE_CONFIG.to_string() + "\n[log]\nlevel = \"trace\"\n";
    let s = Service::start_with("tokens_never_reach_the_log", Options { config: &config, env: vec![] });
    let ann = s.add_user("ann@acme.test", "Ann", &[]);
    let guess = "f00dfeed".repeat(8);
    let c = s.client(&ann);
    c.get("/contacts").assert_status(200);
    c.post_json("/contacts", r#"{"firstname": "Logged"}"#).assert_status(201);
    Client { addr: s.addr, auth: Some(basic(&ann.email, &guess)) }.get("/contacts").assert_status(401);
    let addr = crate::mqtt::mqtt_addr(&s);
    let password = crate::mqtt::mqtt_user(&s, "acme", "intercom-1", false);
    let _ = crate::mqtt::connect(addr, "log-1", "intercom-1", &password).expect("connect");
    let _ = crate::mqtt::connect(addr, "log-2", "intercom-1", &guess).err().expect("refused");
    let admin_token = s.admin.token.clone();
    // The token and MQTT password as written and as sent (Basic).
    let secrets = [ann.token.clone(), guess.clone(), password.clone(), basic(&ann.email, &ann.token)];
    let log = wait_for("the refused MQTT login in the log", || {
        let log = s.stderr();
        log.contains("mqtt: refused").then_some(log)
    });
    // The first administrator's token is shown once, on the first start, by design; nothing
    // else is.
    assert!(log.contains("DEBUG") || log.contains("TRACE"), "the log level did not apply: {log}");
    assert_eq!(log.matches(&admin_token).count(), 1, "the admin token was logged again");
    for secret in &secrets {
        let secret = secret.trim_start_matches("Basic ");
        assert!(!log.contains(secret), "a secret reached the log:\n{log}");
    }
    assert_eq!(s.terminate(), Some(0));
}

#[test]
fn garbage_to_the_mqtt_port_is_dropped_and_others_connect() {
    let s = Service::start("garbage_to_the_mqtt_port_is_dropped_and_others_connect");
    let addr = crate::mqtt::mqtt_addr(&s);
    let password = crate::mqtt::mqtt_user(&s, "acme", "intercom-1", false);
    let mut cases: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![0xff; 64],
        // CONNECT with a remaining length of 268,435,455 (the largest) and nothing after it.
        vec![0x10, 0xff, 0xff, 0xff, 0x7f],
        // A remaining length that never ends.
        vec![0x10, 0xff, 0xff, 0xff, 0xff, 0xff],
        // PUBLISH before CONNECT.
        vec![0x30, 0x05, 0x00, 0x01, b'a', b'x', b'y'],
        // CONNECT with a bad protocol name.
        vec![0x10, 0x0c, 0x00, 0x04, b'X', b'Q', b'T', b'T', 0x04, 0x02, 0x00, 0x3c, 0x00, 0x00],
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..50 {
        let len = (seed % 300) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        cases.push(bytes);
    }
    for bytes in &cases {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
    }
    let m = crate::mqtt::connect(addr, "after-garbage", "intercom-1", &password).expect("a client still connects");
    let _ = m.client.disconnect();
    s.admin_client().get("/contacts").assert_status(200);
}

/// Bodies that may exceed the usual limit (uploads, batches) are held by few requests at once,
/// whoever sends them (credentials are checked after the body): more are answered 503 at
/// once, and once those go, uploads are taken again. One client address holds at most two of
/// the four, and only paths that take uploads get one (four slow uploads to `/health` held
/// them all, without credentials).
#[test]
fn few_large_bodies_at_once() {
    let s = Service::start("few_large_bodies_at_once");
    let slow_upload = |from: &str, path: &str| {
        let mut stream = connect_from(from, s.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=zz\r\n\
             Content-Length: 4000000\r\n\r\n--zz\r\n"
        )
        .unwrap();
        stream
    };
    // Not an upload path: read with the usual limit, holding none of the four.
    let health = slow_upload("127.0.0.7", "/health");
    // A third from one address: 503 at once.
    let mut started =
        vec![health, slow_upload("127.0.0.2", "/contacts/file"), slow_upload("127.0.0.2", "/contacts/file")];
    let in_flight = |n: usize| {
        wait_for(&format!("{n} requests in flight"), || {
            let text = s.anonymous().get("/metrics").body;
            let line = format!(" {n}");
            text.lines().any(|l| l.starts_with("sitegate_http_requests_in_flight") && l.ends_with(&line)).then_some(())
        })
    };
    // (The metrics request itself is one more in flight.)
    in_flight(4);
    let third = read_response(&mut slow_upload("127.0.0.2", "/contacts/file"));
    assert_eq!(third.status, 503, "{}", third.body);
    assert!(third.body.contains("busy"), "{}", third.body);
    started.push(slow_upload("127.0.0.3", "/contacts/file"));
    started.push(slow_upload("127.0.0.4", "/tickets/file"));
    // All four are being read, and the one to /health.
    in_flight(6);
    // The fifth, even with credentials, waits for none of them: 503 now.
    let busy = wait_for("a fifth large body refused", || {
        let mut stream = connect_from("127.0.0.9", s.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            stream,
            "POST /contacts/1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
             Content-Type: multipart/form-data; boundary=zz\r\nContent-Length: 8\r\nConnection: close\r\n\r\n--zz--\r\n",
            basic(&s.admin.email, &s.admin.token)
        )
        .unwrap();
        let r = read_response(&mut stream);
        (r.status == 503).then_some(r)
    });
    assert!(busy.body.contains("busy"), "{}", busy.body);
    // Small bodies are not held up.
    s.admin_client().post_json("/contacts", r#"{"firstname": "Small"}"#).assert_status(201);
    drop(started);
    wait_for("large bodies taken again", || {
        let r = s
            .admin_client()
            .call(Req::new("POST", "/contacts").body("multipart/form-data; boundary=zz", b"--zz--\r\n".to_vec()));
        (r.status != 503).then_some(())
    });
}

/// Connections to the MQTT port that never send a CONNECT (nothing at all, or a packet's first
/// byte and no more) are closed after the handshake timeout: they would otherwise hold their
/// descriptors for good, and enough of them stop the HTTP API from accepting too.
#[test]
fn silent_mqtt_connections_are_closed_after_the_handshake_timeout() {
    let config = BASE_CONFIG.replace("[mqtt]\n", "[mqtt]\nhandshake_timeout_ms = 1000\n");
    let s = Service::start_with("silent_mqtt_connections_are_closed", Options { config: &config, env: vec![] });
    let addr = crate::mqtt::mqtt_addr(&s);
    let password = crate::mqtt::mqtt_user(&s, "acme", "intercom-1", false);
    let client = crate::mqtt::connect(addr, "intercom-1", "intercom-1", &password).expect("a client connects");
    assert_eq!(client.subscribe("acme/#"), rumqttc::SubscribeReasonCode::Success(rumqttc::QoS::AtLeastOnce));
    let mut silent: Vec<TcpStream> = (0..40)
        .map(|i| {
            let mut stream = connect_from("127.0.0.3", addr).unwrap();
            if i % 2 == 1 {
                stream.write_all(&[0x10]).unwrap(); // a CONNECT's first byte, and no more
            }
            stream
        })
        .collect();
    for stream in &mut silent {
        assert!(closed_within(stream, Duration::from_secs(30)), "a silent connection was kept");
    }
    // The client that did connect keeps its connection, however long ago it connected.
    let publisher = crate::mqtt::connect(addr, "intercom-2", "intercom-1", &password).expect("another client");
    publisher.publish("acme/intercom/2", "still there?");
    let got = client.next_publish(Duration::from_secs(10)).expect("the connected client still gets messages");
    assert_eq!(&got.payload[..], b"still there?");
    // Said once the sweep that closed them has ended (after the sockets closed).
    wait_for("the journal line", || s.stderr().contains("sent no CONNECT within the handshake timeout").then_some(()));
}

/// A client that asks for a large answer and stops reading is disconnected after
/// `send_timeout_ms`: it would otherwise hold the answer's memory and its connection for as
/// long as it liked (100 such clients held 72 MB). The rest of the answer is never sent.
#[test]
fn a_client_that_stops_reading_is_disconnected() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nsend_timeout_ms = 1000");
    let s = Service::start_with("a_client_that_stops_reading", Options { config: &config, ..Default::default() });
    let c = s.admin_client();
    let contact = c.create("contacts", r#"{"firstname": "Ann"}"#);
    // An 8 MB file: far more than the sockets buffer while nobody reads.
    let file: Vec<u8> = (0..8_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut body = format!(
        "--zz\r\nContent-Disposition: form-data; name=\"parent\"\r\n\r\n{contact}\r\n\
         --zz\r\nContent-Disposition: form-data; name=\"data[file]\"; filename=\"big.bin\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&file);
    body.extend_from_slice(b"\r\n--zz--\r\n");
    let r = c.call(Req::new("POST", "/contacts/file").body("multipart/form-data; boundary=zz", body).json());
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.json()["id"].as_i64().unwrap();

    // A small receive window, so that the sockets cannot take the whole answer (this host's
    // receive buffers grow to 32 MiB).
    let mut stream = connect_from_with("127.0.0.2", s.addr, Some(64 * 1024)).unwrap();
    write!(
        stream,
        "GET /contacts/file/{id}/file HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\r\n",
        basic(&s.admin.email, &s.admin.token)
    )
    .unwrap();
    // The server gives the connection up (the metrics request is the one left open).
    wait_for("the stalled connection closed", || {
        let text = s.anonymous().get("/metrics").body;
        text.lines()
            .any(|l| l.starts_with("sitegate_http_connections_open{listener=\"http\"}") && l.ends_with(" 1"))
            .then_some(())
    });
    // What was in the sockets' buffers is all the client gets: then the connection ends.
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got[..got.len().min(200)]));
    assert!(got.len() < file.len(), "the whole answer was sent: {} bytes", got.len());
    // Others are served as before.
    c.get_json(&format!("/contacts/{contact}")).assert_status(200);
}

/// A batch inside a batch is refused however its path is spelled (`//batch` reached the
/// router, which takes it as `/batch`): nested a thousand deep, without credentials, it
/// overflowed a worker's stack and aborted the whole process.
#[test]
fn a_batch_nested_in_a_batch_is_refused_however_spelled() {
    let s = Service::start("a_batch_nested_in_a_batch_is_refused");
    let wrap = |request: &str, level: usize| -> (String, String) {
        let b = format!("b{level}");
        (format!("--{b}\r\nContent-Type: application/http\r\n\r\n{request}\r\n--{b}--\r\n"), b)
    };
    for spelling in ["//batch", "/batch//", "///batch/", "/batch"] {
        let (mut body, mut boundary) = wrap("GET /health HTTP/1.1\r\n\r\n", 0);
        for level in 1..1000 {
            let request = format!(
                "POST {spelling} HTTP/1.1\r\nContent-Type: multipart/mixed; boundary={boundary}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            (body, boundary) = wrap(&request, level);
        }
        let r = s
            .anonymous()
            .call(Req::new("POST", "/batch").body(&format!("multipart/mixed; boundary={boundary}"), body.into_bytes()));
        assert_eq!(r.status, 200, "{spelling}: {}", r.body.chars().take(300).collect::<String>());
        assert!(
            r.body.contains("a batch cannot hold another batch"),
            "{spelling}: {}",
            r.body.chars().take(600).collect::<String>()
        );
        s.anonymous().get("/health").assert_status(200);
    }
}
