//! The embedded MQTT broker as clients see it: credentials made with the CLI, CONNACK
//! refusals, and isolation between organisations (subscriptions, publishes, will messages,
//! client ids). Real MQTT 3.1.1 clients (rumqttc) over loopback.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use rumqttc::{
    Client, ConnectReturnCode, ConnectionError, Event, LastWill, MqttOptions, Packet, QoS, SubscribeReasonCode,
};

use crate::support::*;

pub fn mqtt_addr(s: &Service) -> SocketAddr {
    s.ready_line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mqtt="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no mqtt= in the ready line {:?}", s.ready_line))
}

/// Creates MQTT credentials with the CLI; returns the password.
pub fn mqtt_user(s: &Service, org: &str, username: &str, receiver: bool) -> String {
    let mut args = vec!["mqtt-user", "add", "--org", org, "--username", username];
    if receiver {
        args.push("--receiver");
    }
    let out = s.cli(&args);
    assert!(out.status.success(), "mqtt-user add: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A connected client; what it receives arrives on `events`.
pub struct Mqtt {
    pub client: Client,
    pub events: mpsc::Receiver<Packet>,
}

/// How a connection attempt ended.
#[derive(Debug, PartialEq)]
pub enum Refused {
    Code(ConnectReturnCode),
    Closed(String),
}

pub fn connect(addr: SocketAddr, client_id: &str, user: &str, password: &str) -> Result<Mqtt, Refused> {
    connect_with(addr, client_id, user, password, |_| {})
}

pub fn connect_with(
    addr: SocketAddr,
    client_id: &str,
    user: &str,
    password: &str,
    tweak: impl FnOnce(&mut MqttOptions),
) -> Result<Mqtt, Refused> {
    let mut options = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(30));
    connect_options(options, user, password, tweak)
}

pub fn connect_options(
    mut options: MqttOptions,
    user: &str,
    password: &str,
    tweak: impl FnOnce(&mut MqttOptions),
) -> Result<Mqtt, Refused> {
    if !user.is_empty() {
        options.set_credentials(user, password);
    }
    // Alert messages carry a WAV of some 40 KB: more than rumqttc's 10 KiB default.
    options.set_max_packet_size(1 << 20, 1 << 20);
    tweak(&mut options);
    let (client, mut connection) = Client::new(options, 100);
    let (tx, rx) = mpsc::channel();
    let (ack_tx, ack_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut acked = false;
        for event in connection.iter() {
            match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) if !acked => {
                    acked = true;
                    let _ = ack_tx.send(Ok(()));
                }
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                // After its DISCONNECT a client closes the connection (MQTT-3.14.4-1).
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return,
                Ok(Event::Outgoing(_)) => {}
                Err(e) => {
                    if !acked {
                        let _ = ack_tx.send(Err(match e {
                            ConnectionError::ConnectionRefused(code) => Refused::Code(code),
                            other => Refused::Closed(other.to_string()),
                        }));
                    }
                    return;
                }
            }
        }
    });
    match ack_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(())) => Ok(Mqtt { client, events: rx }),
        Ok(Err(r)) => Err(r),
        Err(_) => Err(Refused::Closed("no CONNACK within 30 s".into())),
    }
}

impl Mqtt {
    /// Subscribes and returns the SUBACK's return code.
    pub fn subscribe(&self, filter: &str) -> SubscribeReasonCode {
        self.client.subscribe(filter, QoS::AtLeastOnce).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Packet::SubAck(ack)) => return ack.return_codes[0],
                Ok(_) => {}
                Err(_) => panic!("no SUBACK for {filter}"),
            }
        }
    }

    /// The next PUBLISH within `wait`, if any.
    pub fn next_publish(&self, wait: Duration) -> Option<rumqttc::Publish> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Packet::Publish(p)) => return Some(p),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    pub fn publish(&self, topic: &str, payload: &str) {
        self.client.publish(topic, QoS::AtLeastOnce, false, payload.as_bytes().to_vec()).unwrap();
    }
}

/// The badge the MQTT tests place: iBeacon `BADGE_UUID`/5/22, device 5/1/22 ("5.1.22").
pub const BADGE_UUID: &str = "f7826da6-4fa2-4e98-8024-bc5b71e0893e";

/// BASE_CONFIG with `mqtt_extra` lines added under `[mqtt]`, no BLE scanning, a quick away
/// timeout and heartbeat, and the location tests' site map (rx-a in zone 21, rx-b in 22).
pub fn site_config(mqtt_extra: &str) -> String {
    let base = BASE_CONFIG
        .replace("[mqtt]\nlisten = \"127.0.0.1:0\"\n", &format!("[mqtt]\nlisten = \"127.0.0.1:0\"\n{mqtt_extra}"));
    format!(
        "{base}\n[location]\nscan = \"off\"\naway_timeout_ms = 4000\nupdate_interval_ms = 1000\n{}",
        crate::location::SITE
    )
}

/// Registers the badge (with `extra` JSON keys, e.g. `, "tagtype": 1`).
pub fn add_badge(c: &crate::support::Client, extra: &str) {
    let body = format!(r#"{{"deviceaddress": "5/1/22", "beacon": "ibeacon:{BADGE_UUID}/5/22"{extra}}}"#);
    c.post_json("/devices", &body).assert_status(201);
}

/// One advert line of the badge as a remote receiver reports it; `more_mfg` adds
/// manufacturer data entries (`,"0059":"01"`).
pub fn badge_advert(rssi: i32, t_ms: Option<i64>, more_mfg: &str) -> String {
    let frame = format!("0215{}00050016c5", BADGE_UUID.replace('-', ""));
    let t = t_ms.map(|t| format!("\"t_ms\":{t},")).unwrap_or_default();
    format!("{{{t}\"mac\":\"C0:00:00:00:00:22\",\"rssi\":{rssi},\"mfg\":{{\"004c\":\"{frame}\"{more_mfg}}}}}\n")
}

/// The office receiver reporting the badge every `every` on a thread of its own, until
/// [`Hearing::stop`].
pub struct Hearing {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Hearing {
    pub fn start(scanner: &Mqtt, every: Duration) -> Hearing {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (client, flag) = (scanner.client.clone(), std::sync::Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let advert = badge_advert(-60, None, "");
                let _ = client.try_publish("acme/receivers/rx-b/adverts", QoS::AtLeastOnce, false, advert);
                std::thread::sleep(every);
            }
        });
        Hearing { stop, thread }
    }

    pub fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap();
    }
}

#[test]
fn credentials_are_checked_and_refused_with_a_connack() {
    let s = Service::start_with("mqtt_credentials", Options { config: BASE_CONFIG, ..Default::default() });
    let addr = mqtt_addr(&s);
    let password = mqtt_user(&s, "acme", "intercom-1", false);
    assert_eq!(password.len(), 64, "a random password is printed once: {password:?}");

    assert_eq!(
        connect(addr, "c1", "intercom-1", "wrong").err(),
        Some(Refused::Code(ConnectReturnCode::BadUserNamePassword))
    );
    assert_eq!(
        connect(addr, "c2", "nobody", &password).err(),
        Some(Refused::Code(ConnectReturnCode::BadUserNamePassword))
    );
    assert!(connect(addr, "c3", "intercom-1", &password).is_ok());

    // Bad input to the CLI: an unknown organisation, a duplicate username.
    let out = s.cli(&["mqtt-user", "add", "--org", "nowhere", "--username", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = s.cli(&["mqtt-user", "add", "--org", "acme", "--username", "intercom-1"]);
    assert!(!out.status.success());
    // Listing shows the users, never a password or its hash.
    let out = s.cli(&["mqtt-user", "list"]);
    let list = String::from_utf8(out.stdout).unwrap();
    assert_eq!(list, "intercom-1\tacme\t\n");
    // A deleted user cannot connect any more.
    assert!(s.cli(&["mqtt-user", "delete", "--username", "intercom-1"]).status.success());
    assert_eq!(
        connect(addr, "c4", "intercom-1", &password).err(),
        Some(Refused::Code(ConnectReturnCode::BadUserNamePassword))
    );
    // Refusals are counted for the operator.
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(health["mqtt"]["refused"], 3, "{health}");
    assert!(s.anonymous().get("/metrics").body.contains("sitegate_mqtt_refused 3"));
}

#[test]
fn organisations_cannot_see_or_write_each_others_topics() {
    let s = Service::start_with("mqtt_isolation", Options { config: BASE_CONFIG, ..Default::default() });
    let addr = mqtt_addr(&s);
    let acme_pw = mqtt_user(&s, "acme", "acme-app", false);
    let globex_pw = mqtt_user(&s, "globex", "globex-app", false);
    let acme = connect(addr, "acme-sub", "acme-app", &acme_pw).unwrap();
    let globex = connect(addr, "globex-sub", "globex-app", &globex_pw).unwrap();

    // Subscriptions: only under one's own organisation, naming it literally.
    assert_eq!(acme.subscribe("acme/#"), SubscribeReasonCode::Success(QoS::AtLeastOnce));
    for filter in ["acme/#", "#", "+/+/data", "$SYS/#"] {
        assert_eq!(globex.subscribe(filter), SubscribeReasonCode::Failure, "{filter}");
    }
    assert_eq!(globex.subscribe("globex/#"), SubscribeReasonCode::Success(QoS::AtLeastOnce));

    // Publishes: into another organisation, or onto the gateway's feed topics, are dropped
    // (MQTT 3.1.1 has no way to say no); a free topic of one's own goes through.
    globex.publish("acme/notes", "from globex");
    acme.publish("acme/5.1.22/alert", "forged alert");
    acme.publish("acme/receivers/r1/adverts", "not a receiver");
    acme.publish("acme/notes", "hello");
    let got = acme.next_publish(Duration::from_secs(10)).expect("acme's own message");
    assert_eq!((got.topic.as_str(), &got.payload[..]), ("acme/notes", &b"hello"[..]));
    assert!(acme.next_publish(Duration::from_secs(2)).is_none(), "nothing else reaches acme");
    assert!(globex.next_publish(Duration::from_millis(500)).is_none(), "nothing of acme reaches globex");

    // A will message obeys the same rules: a will on another organisation's topic is refused.
    let will = connect_with(addr, "globex-will", "globex-app", &globex_pw, |o| {
        o.set_last_will(LastWill::new("acme/notes", "gone", QoS::AtLeastOnce, false));
    });
    assert_eq!(will.err(), Some(Refused::Code(ConnectReturnCode::NotAuthorized)));

    // A client id in use by one organisation is not taken over by another (its session,
    // subscriptions and queue would change hands); the owner may reconnect with it.
    assert_eq!(
        connect(addr, "acme-sub", "globex-app", &globex_pw).err(),
        Some(Refused::Code(ConnectReturnCode::NotAuthorized))
    );
    acme.publish("acme/notes", "still mine");
    let got = acme.next_publish(Duration::from_secs(10)).expect("acme's session is intact");
    assert_eq!(&got.payload[..], b"still mine");
    drop(acme);
    assert!(connect(addr, "acme-sub", "acme-app", &acme_pw).is_ok());
}

/// Remote receivers publish what they hear; it feeds the same engine as the local adapter:
/// our advert lines on `{org}/receivers/{id}/adverts`, and ESPresense's topics unchanged.
#[test]
fn remote_receivers_feed_the_engine() {
    let config = site_config("");
    let s = Service::start_with("mqtt_remote_receivers", Options { config: &config, ..Default::default() });
    add_badge(&s.admin_client(), "");
    let addr = mqtt_addr(&s);
    let scanner_pw = mqtt_user(&s, "acme", "scanner", true);
    let app_pw = mqtt_user(&s, "acme", "app", false);
    let scanner = connect(addr, "scanner-1", "scanner", &scanner_pw).unwrap();
    let app = connect(addr, "app-1", "app", &app_pw).unwrap();
    app.subscribe("acme/+/data");
    // A subscriber to all of the organisation's topics gets the feed, never the raw adverts.
    let everything = connect(addr, "app-2", "app", &app_pw).unwrap();
    everything.subscribe("acme/#");

    // Our advert lines from the receiver in the office (rx-b, zone 22): two lines a message.
    let lines = badge_advert(-61, Some(2), "") + &badge_advert(-60, Some(1), "");
    let zone_of = |p: &rumqttc::Publish| -> i64 {
        let v: serde_json::Value = serde_json::from_slice(&p.payload).unwrap();
        v["data"]["proximity"]["value"]["zoneId"].as_i64().unwrap()
    };
    let mut seen = None;
    for _ in 0..200 {
        scanner.publish("acme/receivers/rx-b/adverts", &lines);
        if let Some(p) = app.next_publish(Duration::from_millis(300)) {
            seen = Some(zone_of(&p));
            break;
        }
    }
    assert_eq!(seen, Some(22), "the office receiver placed the badge in the office");

    // An ESPresense node in the kitchen (room "rx-a") hears it much better from now on.
    let topic = format!("espresense/devices/iBeacon:{BADGE_UUID}-5-22/rx-a");
    let report = r#"{"id":"iBeacon:x","rssi@1m":-59,"rssi":-45,"raw":0.3,"distance":0.3}"#;
    let mut moved = false;
    for _ in 0..200 {
        scanner.publish(&topic, report);
        while let Some(p) = app.next_publish(Duration::from_millis(100)) {
            moved |= zone_of(&p) == 21;
        }
        if moved {
            break;
        }
    }
    assert!(moved, "the ESPresense report moved the badge to the kitchen");

    // Both receivers are reported heard; adverts for receivers the site map does not know
    // are not taken.
    scanner.publish("acme/receivers/nowhere/adverts", &lines);
    let health = s.anonymous().get_json("/health").json();
    let receivers = health["location"]["receivers"].as_array().cloned().unwrap_or_default();
    assert_eq!(receivers.len(), 2, "{health}");
    for r in &receivers {
        assert!(!r["lastadvert"].as_str().unwrap().is_empty(), "{r}");
        assert_eq!(r["silent"], 0, "{r}");
    }
    // Counted apart from the gateway's own adapter (which heard nothing), the unknown
    // receiver's among those not taken.
    assert_eq!(health["location"]["adverts"], 0, "{health}");
    assert!(health["location"]["remoteadverts"].as_i64().unwrap() > 0, "{health}");
    let refused = crate::support::wait_for("the unknown receiver's adverts counted", || {
        let h = s.anonymous().get_json("/health").json();
        (h["location"]["remotedropped"].as_i64().unwrap_or(0) > 0).then_some(h)
    });
    let metrics = s.anonymous().get("/metrics").body;
    assert!(metrics.contains("sitegate_ble_remote_adverts "), "{metrics}");
    assert!(refused["location"]["remotedropped"].as_i64().unwrap() > 0);
    let mut topics = Vec::new();
    while let Some(p) = everything.next_publish(Duration::from_secs(1)) {
        topics.push(p.topic);
    }
    assert!(topics.iter().any(|t| t == "acme/5.1.22/data"), "the feed reached acme/#: {topics:?}");
    assert!(topics.iter().all(|t| !t.starts_with("acme/receivers/")), "no raw adverts: {topics:?}");
    // The receiver's QoS 1 publishes were acknowledged, and nothing counts as dropped.
    let acks = scanner.events.try_iter().filter(|p| matches!(p, Packet::PubAck(_))).count();
    assert!(acks >= 3, "PUBACKs for the receiver: {acks}");
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(health["mqtt"]["dropped"], 0, "{health}");
}

/// MQTT over TLS: `sitegate cert init` and `cert client` make the certificates; one listener
/// takes username and password, the other a client certificate whose O is the organisation.
#[test]
fn tls_with_passwords_and_with_client_certificates() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let dir = test_dir("mqtt_tls");
    let config = dir.join("config.toml");
    // The configuration names the files before they are made: `cert init` makes them all
    // the same (it does not check the file it reads its folder from).
    let tls_config = BASE_CONFIG.replace(
        "[mqtt]\nlisten = \"127.0.0.1:0\"\n",
        "[mqtt]\nlisten = \"127.0.0.1:0\"\ntls_listen = \"127.0.0.1:0\"\ntls_cert = \"certs/server.pem\"\n\
         tls_key = \"certs/server.key\"\nclient_ca = \"certs/ca.pem\"\nclient_cert_listen = \"127.0.0.1:0\"\n",
    );
    std::fs::write(&config, tls_config).unwrap();
    let cli = |args: &[&str]| cli_with_config(&config, args);
    let out = cli(&["cert", "init", "--host", "localhost", "--host", "127.0.0.1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = cli(&["cert", "init"]);
    assert!(!again.status.success(), "an existing CA is not replaced without --force");
    let out = cli(&["cert", "client", "--org", "acme", "--name", "intercom-7"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!cli(&["cert", "client", "--org", "nowhere", "--name", "x"]).status.success());
    assert!(!cli(&["cert", "client", "--org", "acme", "--name", "../x"]).status.success());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("certs/intercom-7.key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "private keys are for the owner only");

    let s = Service::launch(dir.clone(), config.clone(), &[]);
    let port = |key: &str| -> u16 {
        let w = s.ready_line.split_whitespace().find_map(|w| w.strip_prefix(key)).expect(key);
        w.parse::<std::net::SocketAddr>().unwrap().port()
    };
    let (tls_port, cert_port) = (port("mqtts="), port("mqtts-cert="));
    let ca = std::fs::read(dir.join("certs/ca.pem")).unwrap();
    let read = |name: &str| std::fs::read(dir.join("certs").join(name)).unwrap();
    let tls = |client_auth: Option<(Vec<u8>, Vec<u8>)>| {
        let ca = ca.clone();
        move |o: &mut MqttOptions| {
            o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Simple {
                ca,
                alpn: None,
                client_auth,
            }));
        }
    };
    let connect_tls = |port: u16, id: &str, user: &str, pw: &str, auth: Option<(Vec<u8>, Vec<u8>)>| {
        let mut options = MqttOptions::new(id, "localhost", port);
        options.set_keep_alive(Duration::from_secs(30));
        connect_options(options, user, pw, tls(auth))
    };

    // Username and password over TLS.
    let pw = mqtt_user(&s, "acme", "app", false);
    let app = connect_tls(tls_port, "app-tls", "app", &pw, None).expect("password over TLS");
    assert_eq!(app.subscribe("acme/#"), SubscribeReasonCode::Success(QoS::AtLeastOnce));
    assert_eq!(
        connect_tls(tls_port, "bad-tls", "app", "wrong", None).err(),
        Some(Refused::Code(ConnectReturnCode::BadUserNamePassword))
    );

    // A client certificate: no password, the organisation from the certificate.
    let auth = Some((read("intercom-7.pem"), read("intercom-7.key")));
    let intercom = connect_tls(cert_port, "intercom-7", "", "", auth.clone()).expect("client certificate");
    assert_eq!(intercom.subscribe("globex/#"), SubscribeReasonCode::Failure);
    intercom.publish("acme/intercom/7", "hello over mTLS");
    let got = app.next_publish(Duration::from_secs(10)).expect("the intercom's message");
    assert_eq!(&got.payload[..], b"hello over mTLS");

    // The certificate listener refuses a client without a certificate, or with one of
    // another CA.
    assert!(matches!(connect_tls(cert_port, "nocert", "app", &pw, None), Err(Refused::Closed(_))));
    let other_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "acme");
    let other = params.self_signed(&other_key).unwrap();
    let forged = Some((other.pem().into_bytes(), other_key.serialize_pem().into_bytes()));
    assert!(matches!(connect_tls(cert_port, "forged", "", "", forged), Err(Refused::Closed(_))));
}

/// An upstream mosquitto on loopback, on a port of its own; killed when dropped.
struct Upstream {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Upstream {
    fn start(dir: &std::path::Path, port: u16) -> Upstream {
        Upstream::start_with(dir, port, "")
    }

    /// With `extra` lines of mosquitto.conf.
    fn start_with(dir: &std::path::Path, port: u16, extra: &str) -> Upstream {
        let conf = dir.join("mosquitto.conf");
        // Persistence: a subscriber's session (and its queued messages) outlives a restart.
        std::fs::write(
            &conf,
            format!(
                // As root, mosquitto would switch to its own user, who cannot write here.
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nuser {}\n{extra}",
                dir.display(),
                std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "root".into())
            ),
        )
        .unwrap();
        let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"].into_iter().find(|p| std::path::Path::new(p).exists());
        let child = std::process::Command::new(bin.expect("mosquitto installed (scripts/test installs it)"))
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start mosquitto");
        wait_for("mosquitto listening", || std::net::TcpStream::connect(("127.0.0.1", port)).ok().map(|_| ()));
        Upstream { child, port, dir: dir.to_path_buf() }
    }

    fn restart(mut self) -> Upstream {
        self.stop();
        Upstream::start(&self.dir.clone(), self.port)
    }

    /// SIGTERM: mosquitto saves its sessions on the way out.
    fn stop(&mut self) {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The feed forwarded to an upstream broker (Debian's mosquitto), with the bridge's queue on
/// disk carrying it over an outage of the upstream.
#[test]
fn the_feed_reaches_an_upstream_broker_and_outlasts_its_outage() {
    let dir = test_dir("mqtt_bridge");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut upstream = Upstream::start(&dir, port);
    let config = site_config(&format!("bridge_url = \"mqtt://127.0.0.1:{port}\"\nbridge_prefix = \"site-a/\"\n"));
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let s = Service::launch(dir.clone(), config_path, &[]);
    add_badge(&s.admin_client(), "");
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let advert = badge_advert(-60, None, "");
    // The central system's subscriber keeps its session at the upstream broker.
    let central = || {
        let mut options = MqttOptions::new("central", "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(30)).set_clean_session(false);
        connect_options(options, "", "", |_| {}).expect("mosquitto")
    };

    // Up: the data messages and the (retained) state arrive upstream under the prefix.
    let sub = central();
    assert_eq!(sub.subscribe("site-a/#"), SubscribeReasonCode::Success(QoS::AtLeastOnce));
    let mut topics = std::collections::BTreeSet::new();
    for _ in 0..200 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert);
        while let Some(p) = sub.next_publish(Duration::from_millis(100)) {
            topics.insert(p.topic.clone());
        }
        if topics.len() >= 2 {
            break;
        }
    }
    let want: std::collections::BTreeSet<String> =
        ["site-a/acme/5.1.22/data", "site-a/acme/5.1.22/state"].map(String::from).into();
    assert_eq!(topics, want);

    // Down: the feed goes on; the bridge queues it on disk.
    drop(sub);
    upstream.stop();
    let queued_during_outage = wait_for("messages queued while upstream is down", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert);
        std::thread::sleep(Duration::from_millis(200));
        let h = s.anonymous().get_json("/health").json();
        let b = &h["mqtt"]["bridge"];
        (b["connected"] == 0 && b["queued"].as_i64().unwrap_or(0) >= 3).then(|| b["queued"].as_i64().unwrap())
    });
    assert!(queued_during_outage >= 3);

    // Back: what was queued is delivered, in order, and the queue empties.
    let upstream = upstream.restart();
    wait_for("the queue drained upstream", || {
        let h = s.anonymous().get_json("/health").json();
        (h["mqtt"]["bridge"]["connected"] == 1 && h["mqtt"]["bridge"]["queued"] == 0).then_some(())
    });
    let sub = central();
    let mut data = 0;
    wait_for("the queue delivered upstream", || {
        while let Some(p) = sub.next_publish(Duration::from_millis(200)) {
            if p.topic == "site-a/acme/5.1.22/data" {
                data += 1;
            }
        }
        (data >= queued_during_outage).then_some(())
    });
    drop(upstream);
}

/// After an outage of the upstream, an alert goes up ahead of the data and state messages
/// queued before it: an alarm raised while a long queue drains does not wait behind it.
#[test]
fn an_alarm_goes_upstream_ahead_of_the_queue() {
    let dir = test_dir("an_alarm_goes_upstream_ahead_of_the_queue");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut upstream = Upstream::start(&dir, port);
    let config = crate::alerts::config().replace(
        "[mqtt]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[mqtt]\nlisten = \"127.0.0.1:0\"\nbridge_url = \"mqtt://127.0.0.1:{port}\"\n"),
    );
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let s = Service::launch(dir.clone(), config_path, &[]);
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "tagtype": 1, "contactid": {ann}"#));
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let central = || {
        let mut options = MqttOptions::new("central", "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(30)).set_clean_session(false);
        connect_options(options, "", "", |_| {}).expect("mosquitto")
    };
    let sub = central();
    assert_eq!(sub.subscribe("acme/#"), SubscribeReasonCode::Success(QoS::AtLeastOnce));
    wait_for("a data message upstream", || {
        scanner.publish("acme/receivers/rx-b/adverts", &crate::alerts::advert(false));
        let p = sub.next_publish(Duration::from_millis(300))?;
        (p.topic == "acme/5.1.22/data").then_some(())
    });

    // Down: data messages queue up, then the panic button is pressed.
    upstream.stop();
    while sub.next_publish(Duration::from_millis(200)).is_some() {}
    drop(sub);
    let queued = || s.anonymous().get_json("/health").json()["mqtt"]["bridge"]["queued"].as_i64().unwrap();
    let before_press = wait_for("data messages queued while upstream is down", || {
        scanner.publish("acme/receivers/rx-b/adverts", &crate::alerts::advert(false));
        std::thread::sleep(Duration::from_millis(200));
        let n = queued();
        (n >= 8).then_some(n)
    });
    wait_for("the alarm recorded", || {
        scanner.publish("acme/receivers/rx-b/adverts", &crate::alerts::advert(true));
        std::thread::sleep(Duration::from_millis(200));
        let alarms = c.get_json("/alerts?all=1&type=Alarm").json()["alerts"]["count"].as_i64();
        (alarms == Some(1)).then_some(())
    });

    // Back: the alarm comes ahead of what was queued before it.
    let _upstream = upstream.restart();
    let sub = central();
    // Each message as its topic, an alert as its type.
    let mut got = Vec::new();
    wait_for("the alarm upstream", || {
        while let Some(p) = sub.next_publish(Duration::from_millis(200)) {
            let alert = (p.topic == "acme/5.1.22/alert")
                .then(|| {
                    serde_json::from_slice::<serde_json::Value>(&p.payload).ok()?["type"].as_str().map(String::from)
                })
                .flatten();
            got.push(alert.unwrap_or_else(|| p.topic.clone()));
        }
        got.iter().any(|t| t == "Alarm").then_some(())
    });
    let at = got.iter().position(|t| t == "Alarm").unwrap();
    let data_before = got[..at].iter().filter(|t| t.ends_with("/data")).count();
    assert!(
        data_before < 2,
        "{data_before} data messages came before the alarm ({before_press} queued before it): {got:?}"
    );
}

/// Stock clients: mosquitto_sub (MQTT 3.1.1 and 5) reads the feed; mosquitto_pub over MQTT 5
/// is told "not authorised" (0x87) for another organisation's topic and for a feed topic.
#[test]
fn stock_mosquitto_clients_read_the_feed_and_hear_refusals() {
    let config = site_config("");
    let s = Service::start_with("mqtt_stock_clients", Options { config: &config, ..Default::default() });
    add_badge(&s.admin_client(), "");
    let addr = mqtt_addr(&s);
    let port = addr.port().to_string();
    let pw = mqtt_user(&s, "acme", "intercom", false);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let sub = |version: &str| {
        std::process::Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "intercom", "-P", &pw, "-V", version])
            .args(["-t", "acme/+/data", "-C", "1", "-W", "60", "-v"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("mosquitto_sub (scripts/test installs mosquitto-clients)")
    };
    let subs = [sub("mqttv311"), sub("mqttv5")];
    let advert = badge_advert(-60, None, "");
    for _ in 0..20 {
        scanner.publish("acme/receivers/rx-b/adverts", &advert);
        std::thread::sleep(Duration::from_millis(300));
    }
    for child in subs {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("acme/5.1.22/data {\"deviceId\":\"5.1.22\""),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for topic in ["globex/notes", "acme/5.1.22/alert"] {
        let out = std::process::Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "intercom", "-P", &pw, "-V", "mqttv5", "-q", "1"])
            .args(["-t", topic, "-m", "x"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Not authorized"), "{topic}: {err}");
    }
    // A wrong password over MQTT 5: CONNACK 0x86.
    let out = std::process::Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-u",
            "intercom",
            "-P",
            "wrong",
            "-V",
            "mqttv5",
            "-t",
            "acme/x",
            "-m",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).to_lowercase().contains("bad user name or password"), "{:?}", out);
}

/// `$share/{group}/...` within the organisation: each message to one member of the group, in
/// turn; another organisation's filter is refused even inside a share.
#[test]
fn shared_subscriptions_split_messages_within_the_organisation() {
    let s = Service::start_with("mqtt_shared", Options { config: BASE_CONFIG, ..Default::default() });
    let addr = mqtt_addr(&s);
    let pw = mqtt_user(&s, "acme", "worker", false);
    let a = connect(addr, "worker-a", "worker", &pw).unwrap();
    let b = connect(addr, "worker-b", "worker", &pw).unwrap();
    for m in [&a, &b] {
        assert_eq!(m.subscribe("$share/alarms/acme/jobs"), SubscribeReasonCode::Success(QoS::AtLeastOnce));
    }
    assert_eq!(a.subscribe("$share/alarms/globex/jobs"), SubscribeReasonCode::Failure);
    let publisher = connect(addr, "dispatcher", "worker", &pw).unwrap();
    for i in 0..10 {
        publisher.publish("acme/jobs", &format!("job {i}"));
    }
    let count = |m: &Mqtt| std::iter::from_fn(|| m.next_publish(Duration::from_secs(2))).count();
    let (na, nb) = (count(&a), count(&b));
    assert_eq!(na + nb, 10, "every job once: {na} + {nb}");
    assert!(na > 0 && nb > 0, "both members get some: {na} + {nb}");
}

/// MQTT 5 clients asking for a long keepalive are told 60 s (Server Keep Alive); MQTT 3.1.1
/// clients keep theirs.
#[test]
fn mqtt5_keepalive_is_capped_and_311_keeps_its_own() {
    use rumqttc::v5::{Client as Client5, Event as Event5, MqttOptions as Options5, mqttbytes::v5::Packet as Packet5};
    let s = Service::start_with("mqtt_keepalive", Options { config: BASE_CONFIG, ..Default::default() });
    let addr = mqtt_addr(&s);
    let pw = mqtt_user(&s, "acme", "app", false);
    let mut options = Options5::new("v5-client", addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(120)).set_credentials("app", pw.clone());
    let (_client, mut connection) = Client5::new(options, 10);
    let connack = connection
        .iter()
        .find_map(|e| match e {
            Ok(Event5::Incoming(Packet5::ConnAck(ack))) => Some(Ok(ack)),
            Err(e) => Some(Err(e.to_string())),
            _ => None,
        })
        .expect("a CONNACK")
        .expect("accepted");
    assert_eq!(connack.properties.and_then(|p| p.server_keep_alive), Some(60));
    let v311 = connect_with(addr, "v311-client", "app", &pw, |o| {
        o.set_keep_alive(Duration::from_secs(120));
    });
    assert!(v311.is_ok(), "a 3.1.1 client asking for 120 s is accepted");
}

/// A subscriber that stops reading fills its own queue only: the broker drops its oldest
/// messages (counted), while the engine, the feed and the other subscribers go on.
#[test]
fn a_subscriber_that_stops_reading_holds_up_nobody() {
    use std::io::Write;
    let config = site_config("client_queue_max = 10\n");
    let s = Service::start_with("mqtt_slow_subscriber", Options { config: &config, ..Default::default() });
    let c = s.admin_client();
    add_badge(&c, "");
    let addr = mqtt_addr(&s);
    let pw = mqtt_user(&s, "acme", "app", false);

    // The stalled subscriber: CONNECT and SUBSCRIBE acme/# by hand, then never read again.
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    let field = |b: &[u8]| [&(b.len() as u16).to_be_bytes()[..], b].concat();
    let mut hello = vec![0x00, 0x04, b'M', b'Q', b'T', b'T', 4, 0xC2, 0, 60];
    hello.extend(field(b"stalled"));
    hello.extend(field(b"app"));
    hello.extend(field(pw.as_bytes()));
    let mut packet = vec![0x10, hello.len() as u8];
    packet.extend(hello);
    let mut subscribe = vec![0, 1];
    subscribe.extend(field(b"acme/#"));
    subscribe.push(1);
    packet.extend([0x82, subscribe.len() as u8]);
    packet.extend(subscribe);
    stalled.write_all(&packet).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    // A busy publisher (a megabyte a second and more) and the live feed.
    let healthy = connect(addr, "healthy", "app", &pw).unwrap();
    healthy.subscribe("acme/+/data");
    let scanner = connect(addr, "scanner", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let noisy = connect(addr, "noisy", "app", &pw).unwrap();
    let advert = badge_advert(-60, None, "");
    let blob = "x".repeat(8 * 1024);
    let mut data = 0;
    for _ in 0..40 {
        for _ in 0..40 {
            noisy.publish("acme/noise", &blob);
        }
        scanner.publish("acme/receivers/rx-b/adverts", &advert);
        while let Some(p) = healthy.next_publish(Duration::from_millis(150)) {
            data += usize::from(p.topic == "acme/5.1.22/data");
        }
    }
    assert!(data >= 3, "the healthy subscriber kept getting the feed: {data}");
    let health = wait_for("drops counted for the stalled subscriber", || {
        let h = s.anonymous().get_json("/health").json();
        (h["mqtt"]["dropped"].as_i64().unwrap_or(0) > 0).then_some(h)
    });
    assert_eq!(health["mqtt"]["feeddropped"], 0, "the engine's feed never waited: {health}");
    let device = c.get_json("/devices/1").json();
    assert_eq!(device["device"]["zoneid"], 22, "the engine kept placing the badge: {device}");
    drop(stalled);
}

/// Sessions of clients that are gone (clean session off) count towards `connections_max`: a
/// client connecting with ever new client ids must not lock everyone else out. With the
/// broker full, the session gone longest is ended to let a new client in.
#[test]
fn persistent_sessions_of_clients_gone_do_not_lock_others_out() {
    let config = BASE_CONFIG.replace("[mqtt]\n", "[mqtt]\nconnections_max = 5\n");
    let s = Service::start_with("persistent_sessions_of_clients_gone", Options { config: &config, env: vec![] });
    let password = mqtt_user(&s, "acme", "intercom", false);
    for i in 0..8 {
        let m = connect_with(mqtt_addr(&s), &format!("sess-{i}"), "intercom", &password, |o| {
            o.set_clean_session(false);
        })
        .unwrap_or_else(|e| panic!("persistent session {i}: {e:?}"));
        m.subscribe("acme/x/#");
        let _ = m.client.disconnect();
        drop(m);
        // Gone, and known to be gone, before the next one connects.
        std::thread::sleep(Duration::from_millis(200));
    }
    // `/health` shows the sessions held for clients that are away.
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(
        (health["mqtt"]["connections"].as_i64(), health["mqtt"]["sessions"].as_i64()),
        (Some(0), Some(5)),
        "{health}"
    );
    let fresh = connect(mqtt_addr(&s), "fresh", "intercom", &password).expect("a new client gets in");
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(
        (health["mqtt"]["connections"].as_i64(), health["mqtt"]["sessions"].as_i64()),
        (Some(1), Some(5)),
        "{health}"
    );
    drop(fresh);
    assert!(s.stderr().contains("disconnected longest, ended to let"), "{}", s.stderr());
}

/// `/health` counts a session that ended as soon as it ended, not once the next client came.
#[test]
fn health_stops_counting_a_session_once_it_ends() {
    let s = Service::start("health_stops_counting_a_session_once_it_ends");
    let password = mqtt_user(&s, "acme", "intercom", false);
    let counts = || {
        let health = s.anonymous().get_json("/health").json();
        (health["mqtt"]["connections"].as_i64().unwrap(), health["mqtt"]["sessions"].as_i64().unwrap())
    };
    let m = connect(mqtt_addr(&s), "short-lived", "intercom", &password).unwrap();
    wait_for("one connection and its session", || (counts() == (1, 1)).then_some(()));
    let _ = m.client.disconnect();
    drop(m);
    wait_for("no connection and no session", || (counts() == (0, 0)).then_some(()));
}

/// Subscriptions refused in a SUBACK (beyond the 100 a client may hold) are the client's
/// business: they do not write a log line each, which one packet could make thousands of.
#[test]
fn refused_subscriptions_do_not_flood_the_log() {
    let s = Service::start("refused_subscriptions_do_not_flood_the_log");
    let password = mqtt_user(&s, "acme", "intercom", false);
    let m = connect(mqtt_addr(&s), "many-filters", "intercom", &password).unwrap();
    let filters: Vec<rumqttc::SubscribeFilter> =
        (0..600).map(|i| rumqttc::SubscribeFilter::new(format!("acme/f/{i}"), QoS::AtMostOnce)).collect();
    m.client.subscribe_many(filters).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let codes = loop {
        match m.events.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(Packet::SubAck(ack)) => break ack.return_codes,
            Ok(_) => {}
            Err(_) => panic!("no SUBACK"),
        }
    };
    assert_eq!(codes.iter().filter(|c| matches!(c, SubscribeReasonCode::Success(_))).count(), 100);
    assert_eq!(codes.len(), 600);
    let lines = s.stderr().lines().count();
    assert!(lines < 50, "{lines} log lines:\n{}", s.stderr());
}

/// Retained messages are bounded in bytes as well as in number: a client publishing large
/// retained messages on ever new topics fills at most 64 MiB; a cleared one makes room.
#[test]
fn retained_messages_are_bounded_in_bytes() {
    let s = Service::start("retained_messages_are_bounded_in_bytes");
    let password = mqtt_user(&s, "acme", "intercom", false);
    let publisher = connect(mqtt_addr(&s), "big-retainer", "intercom", &password).unwrap();
    let payload = vec![b'r'; 250_000];
    for i in 0..300 {
        publisher.client.publish(format!("acme/ret/{i}"), QoS::AtLeastOnce, true, payload.clone()).unwrap();
    }
    // The last one has been handled once the broker answers a later message.
    let check = connect(mqtt_addr(&s), "checker", "intercom", &password).unwrap();
    check.subscribe("acme/done");
    publisher.publish("acme/done", "x");
    check.next_publish(Duration::from_secs(60)).expect("the marker after the retained messages");
    let count_retained = |id: &str| {
        let late = connect(mqtt_addr(&s), id, "intercom", &password).unwrap();
        late.subscribe("acme/ret/#");
        let mut n = 0;
        while late.next_publish(Duration::from_secs(3)).is_some() {
            n += 1;
        }
        n
    };
    let kept = count_retained("late-1");
    assert!((200..=268).contains(&kept), "{kept} of 300 retained messages of 250,000 bytes kept");
    assert_eq!(s.stderr().matches("not retained").count(), 1, "{}", s.stderr());
    // Clearing one (an empty retained message) makes room for another.
    publisher.client.publish("acme/ret/0", QoS::AtLeastOnce, true, Vec::new()).unwrap();
    publisher.client.publish("acme/ret/new", QoS::AtLeastOnce, true, payload.clone()).unwrap();
    publisher.publish("acme/done", "y");
    check.next_publish(Duration::from_secs(60)).expect("the second marker");
    assert_eq!(count_retained("late-2"), kept);
    // A retained message with a long topic (which the broker holds several times over) is
    // delivered to those subscribed but not kept.
    let long = format!("acme/long/{}", "t".repeat(2_000));
    check.subscribe("acme/long/#");
    publisher.client.publish(long.clone(), QoS::AtLeastOnce, true, b"small".to_vec()).unwrap();
    let got = check.next_publish(Duration::from_secs(60)).expect("the long topic delivered");
    assert_eq!(got.topic, long);
    let late = connect(mqtt_addr(&s), "late-3", "intercom", &password).unwrap();
    late.subscribe("acme/long/#");
    assert!(late.next_publish(Duration::from_secs(3)).is_none(), "a long topic was retained");
}

/// A message the upstream refuses (here: larger than its packet limit, an alert with its
/// sound) does not hold up the feed behind it for good: after a few connections in a row end
/// with it, it is dropped, counted and named, and what follows goes up.
#[test]
fn a_message_the_upstream_refuses_does_not_block_the_bridge() {
    let dir = test_dir("a_message_the_upstream_refuses_does_not_block_the_bridge");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _upstream = Upstream::start_with(&dir, port, "max_packet_size 20000\n");
    let config = format!(
        "{}\n[[alert_rules]]\nid = \"office-entry\"\ntype = \"warn\"\nwhen = \"enter\"\nzones = [22]\n",
        site_config(&format!("bridge_url = \"mqtt://127.0.0.1:{port}\"\n"))
    );
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let s = Service::launch(dir.clone(), config_path, &[]);
    add_badge(&s.admin_client(), "");
    let scanner = connect(mqtt_addr(&s), "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let central = {
        let mut options = MqttOptions::new("central", "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(30));
        connect_options(options, "", "", |_| {}).expect("mosquitto")
    };
    central.subscribe("#");
    // Into the office (the alert goes out, too large upstream), then data keeps coming.
    let mut got = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut data_after_drop = 0;
    while std::time::Instant::now() < deadline && data_after_drop < 3 {
        scanner.publish("acme/receivers/rx-b/adverts", &badge_advert(-60, None, ""));
        while let Some(p) = central.next_publish(Duration::from_millis(300)) {
            got.insert(p.topic.clone());
            if p.topic == "acme/5.1.22/data" && s.stderr().contains("was on its way: dropped") {
                data_after_drop += 1;
            }
        }
    }
    assert!(data_after_drop >= 3, "data upstream after the refused alert was dropped: {got:?}\n{}", s.stderr());
    assert!(!got.contains("acme/5.1.22/alert"), "{got:?}");
    let health = s.anonymous().get_json("/health").json();
    assert!(health["mqtt"]["bridge"]["dropped"].as_i64() >= Some(1), "{health}");
}

/// After an outage, a refused alert queued behind older data is the one dropped: the alerts
/// go first, so the oldest message unacknowledged when the upstream ends the connection is
/// not the one it refused (the data before it was dropped, one message every half minute).
#[test]
fn a_refused_alert_sent_ahead_is_the_one_dropped() {
    let dir = test_dir("a_refused_alert_sent_ahead_is_the_one_dropped");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, site_config(&format!("bridge_url = \"mqtt://127.0.0.1:{port}\"\n"))).unwrap();
    let s = Service::launch(dir.clone(), config_path.clone(), &[]);
    assert_eq!(s.terminate(), Some(0));
    // The queue an outage left: data, an alert too large for the upstream, more data.
    let db = rusqlite::Connection::open(dir.join("data/sitegate.db")).unwrap();
    let queue = |topic: &str, payload: Vec<u8>| {
        db.execute("INSERT INTO bridge_queue (topic, payload, retain) VALUES (?1, ?2, 0)", (topic, payload)).unwrap();
    };
    for i in 0..5 {
        queue("acme/dev0/data", format!("{{\"n\":{i}}}").into_bytes());
    }
    queue("acme/dev0/alert", vec![b'x'; 34_000]);
    for i in 5..10 {
        queue("acme/dev0/data", format!("{{\"n\":{i}}}").into_bytes());
    }
    drop(db);
    let _upstream = Upstream::start_with(&dir, port, "max_packet_size 20000\n");
    let central = {
        let mut options = MqttOptions::new("central", "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(30));
        connect_options(options, "", "", |_| {}).expect("mosquitto")
    };
    central.subscribe("#");
    let s = Service::launch(dir.clone(), config_path, &[]);
    let mut data = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while data.len() < 10 && std::time::Instant::now() < deadline {
        while let Some(p) = central.next_publish(Duration::from_millis(300)) {
            if p.topic == "acme/dev0/data" {
                data.insert(String::from_utf8_lossy(&p.payload).to_string());
            }
        }
    }
    let stderr = s.stderr();
    assert_eq!(data.len(), 10, "the data before and after the refused alert: {data:?}\n{stderr}");
    assert!(stderr.contains("while \"acme/dev0/alert\" (34000 bytes) was on its way: dropped"), "{stderr}");
    assert!(!stderr.contains("while \"acme/dev0/data\""), "{stderr}");
}

/// A client that fills the retained messages' budget (64 MiB) cannot crowd out the feed's
/// device states: a badge heard afterwards has its state retained for a new subscriber, as
/// the feed promises. They shared the budget, and one client of any organisation could take it.
#[test]
fn a_client_filling_the_retained_budget_leaves_the_device_states_retained() {
    let config = site_config("");
    let s = Service::start_with(
        "a_client_filling_the_retained_budget_leaves_the_device_states_retained",
        Options { config: &config, env: vec![] },
    );
    add_badge(&s.admin_client(), "");
    let addr = mqtt_addr(&s);
    let password = mqtt_user(&s, "acme", "intercom", false);
    let publisher = connect(addr, "big-retainer", "intercom", &password).unwrap();
    let payload = vec![b'r'; 250_000];
    for i in 0..300 {
        publisher.client.publish(format!("acme/ret/{i}"), QoS::AtLeastOnce, true, payload.clone()).unwrap();
    }
    // Then small ones, until what is left is less than one of them (some 300 bytes).
    for i in 0..1_500 {
        publisher.client.publish(format!("acme/small/{i}"), QoS::AtLeastOnce, true, b"s".to_vec()).unwrap();
    }
    let check = connect(addr, "checker", "intercom", &password).unwrap();
    check.subscribe("acme/done");
    publisher.publish("acme/done", "x");
    check.next_publish(Duration::from_secs(60)).expect("the marker after the retained messages");
    assert!(s.stderr().contains("not retained"), "{}", s.stderr());
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let watcher = connect(addr, "watcher", "intercom", &password).unwrap();
    watcher.subscribe("acme/5.1.22/state");
    let advert = badge_advert(-60, None, "");
    wait_for("the badge's state", || {
        scanner.publish("acme/receivers/rx-b/adverts", &advert);
        watcher.next_publish(Duration::from_millis(500))
    });
    // What a new subscriber gets at once is the retained state (the flag set); the feed's
    // live messages come without it.
    let late = connect(addr, "late", "intercom", &password).unwrap();
    late.subscribe("acme/5.1.22/state");
    let retained = std::iter::from_fn(|| late.next_publish(Duration::from_secs(3))).take(20).find(|p| p.retain);
    assert!(retained.is_some_and(|p| p.topic == "acme/5.1.22/state"), "the badge's state was not retained");
}

/// A restart publishes every device's stored state again, retained, before the broker takes
/// clients: a subscriber that connects as soon as the service is ready gets all of them, each
/// with the retained flag. Many devices (more than the feed's queue of 10,000 holds) make the
/// start's publishing long enough to be seen: the broker took clients while it went on, so
/// such a subscriber got some states live, and states beyond the queue were dropped.
#[test]
fn a_restart_publishes_every_device_state_before_it_takes_clients() {
    const DEVICES: usize = 12_000;
    let config =
        site_config("client_queue_max = 20000\n").replace("away_timeout_ms = 4000", "away_timeout_ms = 600000");
    let s = Service::start_with(
        "a_restart_publishes_every_device_state_before_it_takes_clients",
        Options { config: &config, env: vec![] },
    );
    let csv = s.dir.join("tags.csv");
    let mut text = String::from("deviceaddress,beacon\n");
    for i in 0..DEVICES {
        text.push_str(&format!("9/1/{i},ibeacon:{BADGE_UUID}/9/{i}\n"));
    }
    std::fs::write(&csv, &text).unwrap();
    let out = s.cli(&["device", "import", csv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let addr = mqtt_addr(&s);
    let password = mqtt_user(&s, "acme", "intercom", false);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();
    let watcher = connect(addr, "watcher", "intercom", &password).unwrap();
    watcher.subscribe("acme/+/state");
    // Every badge heard by the office's receiver, 1,000 to a message, 2,000 a second (the
    // feed's queue takes what one second of them publishes).
    let uuid = BADGE_UUID.replace('-', "");
    let lines: Vec<String> = (0..DEVICES)
        .map(|i| format!("{{\"mac\":\"C0:00:00:00:{:02X}:{:02X}\",\"rssi\":-60,\"mfg\":{{\"004c\":\"0215{uuid}0009{i:04x}c5\"}}}}\n", i >> 8, i & 0xff))
        .collect();
    let mut online = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while online.len() < DEVICES {
        assert!(std::time::Instant::now() < deadline, "{} of {DEVICES} devices placed\n{}", online.len(), s.stderr());
        for chunk in lines.chunks(1_000) {
            if online.len() < DEVICES {
                scanner.publish("acme/receivers/rx-b/adverts", &chunk.concat());
            }
            while let Some(p) = watcher.next_publish(Duration::from_millis(1)) {
                online.insert(p.topic);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));

    let s = Service::launch(dir, cfg, &[]);
    let late = connect(mqtt_addr(&s), "late", "intercom", &password).unwrap();
    late.subscribe("acme/+/state");
    let mut retained = std::collections::HashSet::new();
    let mut live = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while retained.len() + live.len() < DEVICES && std::time::Instant::now() < deadline {
        if let Some(p) = late.next_publish(Duration::from_millis(500)) {
            let state: serde_json::Value = serde_json::from_slice(&p.payload).unwrap();
            assert_eq!(state["data"]["state"], "online", "{state}");
            if p.retain {
                retained.insert(p.topic);
            } else {
                live.push(p.topic);
            }
        }
    }
    assert!(live.is_empty(), "{} states came live, not retained (first {:?})", live.len(), live.first());
    assert_eq!(retained.len(), DEVICES, "states retained after the restart");
    let health = s.anonymous().get_json("/health").json();
    assert_eq!(health["mqtt"]["feeddropped"], 0, "{health}");
}
