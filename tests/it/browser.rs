//! The status page in a real browser: Debian's headless Chromium driven through its
//! chromium-driver (WebDriver). A badge enters the office on adverts from a remote receiver,
//! the page shows who is there and the alerts the rules raised, and an operator acknowledges
//! them with the mouse and with the keyboard only. Screenshots (desktop and phone) are saved
//! under `target/tmp/artifacts/status/`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::mqtt::{add_badge, connect, mqtt_addr, mqtt_user};
use crate::support::*;

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn artifacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artifacts").join("status");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls `f` (a browser query) until it gives a value, for up to 30 s.
fn eventually<T>(rt: &tokio::runtime::Runtime, what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = rt.block_on(f()) {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for the page to show {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn text_of(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

fn screenshot(rt: &tokio::runtime::Runtime, c: &Client, name: &str) {
    let png = rt.block_on(c.screenshot()).expect("a screenshot");
    let path = artifacts().join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

#[test]
fn the_status_page_shows_a_badge_entering_a_zone_and_alerts_an_operator_acknowledges() {
    let config = crate::alerts::config();
    let s = Service::start_with("status_page_in_chromium", Options { config: &config, ..Default::default() });
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    add_badge(&c, &format!(r#", "tagtype": 1, "label": "Badge 22", "contactid": {ann}"#));
    let addr = mqtt_addr(&s);
    let scanner = connect(addr, "scanner-1", "scanner", &mqtt_user(&s, "acme", "scanner", true)).unwrap();

    let chromedriver =
        which("chromedriver").expect("chromedriver (Debian's chromium-driver; bash scripts/test installs it)");
    let port = free_port();
    let profile = test_dir("status_page_in_chromium_profile");
    let driver = Driver(
        Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mut options = json!({
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1100", format!("--user-data-dir={}", profile.display())],
    });
    if let Some(chromium) = which("chromium") {
        options["binary"] = json!(chromium.display().to_string());
    }
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    caps.insert("goog:chromeOptions".into(), options);
    let webdriver = format!("http://127.0.0.1:{port}");
    let browser = wait_for("chromedriver to take a session", || {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        rt.block_on(ClientBuilder::new(connector).capabilities(caps.clone()).connect(&webdriver)).ok()
    });

    // Basic credentials in the URL: the browser keeps them for the page's own requests
    // (script, style, the event stream, the acknowledgement).
    let user = s.admin.email.replace('@', "%40");
    rt.block_on(browser.goto(&format!("http://{user}:{}@{}/", s.admin.token, s.addr))).expect("open the page");
    eventually(&rt, "a live connection", async || text_of(&browser, "#conn").await.filter(|t| t == "Live"));
    let storage = eventually(&rt, "the storage row", async || text_of(&browser, "[data-health=\"Storage\"]").await);
    assert!(storage.starts_with("ok · ") && storage.ends_with(" free"), "{storage}");
    let empty = eventually(&rt, "the office zone", async || text_of(&browser, "[data-zone=\"22\"]").await);
    assert!(empty.contains("Office") && empty.contains("empty"), "{empty}");

    // The badge is heard in the office (rx-b): the page shows Ann there.
    let lines = crate::mqtt::badge_advert(-60, None, "") + &crate::mqtt::badge_advert(-61, None, "");
    let in_office = eventually(&rt, "Ann in the office", async || {
        scanner.publish("acme/receivers/rx-b/adverts", &lines);
        text_of(&browser, "[data-zone=\"22\"] [data-device=\"5/1/22\"]").await.filter(|t| t.contains("Ann Lee"))
    });
    assert!(in_office.contains("Badge 22") && in_office.contains("since"), "{in_office}");
    let row = eventually(&rt, "the device row", async || {
        text_of(&browser, "tr[data-device=\"5/1/22\"]").await.filter(|t| t.contains("Office"))
    });
    assert!(row.contains("rx-b") && row.contains("dBm"), "{row}");
    screenshot(&rt, &browser, "1-badge-in-office.png");

    // Entering the office raised a Warn (and a Monitor); the panic button raises an Alarm.
    eventually(&rt, "the Warn alert", async || text_of(&browser, ".alert-group.Warn").await);
    let alarm = eventually(&rt, "the Alarm alert", async || {
        scanner.publish("acme/receivers/rx-b/adverts", &crate::alerts::advert(true));
        text_of(&browser, ".alert-group.Alarm").await
    });
    assert!(alarm.contains("Ann Lee"), "{alarm}");
    assert_eq!(rt.block_on(text_of(&browser, "#alert-count")).as_deref(), Some("3"));
    screenshot(&rt, &browser, "2-alerts.png");

    // Acknowledge the Alarm with the mouse.
    let alarm_id: i64 = eventually(&rt, "the Alarm's button", async || {
        let b = browser.find(Locator::Css(".alert-group.Alarm button")).await.ok()?;
        let id = b.attr("data-alert").await.ok()??.parse().ok()?;
        b.click().await.ok()?;
        Some(id)
    });
    eventually(&rt, "the Alarm gone", async || {
        browser.find(Locator::Css(".alert-group.Alarm")).await.is_err().then_some(())
    });
    let listed = c.get_json("/alerts?all=1&type=Alarm").json();
    assert_eq!(listed["alerts"]["records"][0]["id"], alarm_id, "{listed}");
    assert_eq!(listed["alerts"]["records"][0]["acked"], 1, "{listed}");
    screenshot(&rt, &browser, "3-alarm-acknowledged.png");

    // Acknowledge the Warn with the keyboard only: Tab to its button, press Enter.
    rt.block_on(
        browser.execute("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);", vec![]),
    )
    .unwrap();
    let body = rt.block_on(browser.find(Locator::Css("body"))).unwrap();
    let mut reached = false;
    for _ in 0..40 {
        rt.block_on(body.send_keys("\u{e004}")).unwrap(); // Tab
        let active = rt.block_on(browser.execute(
            "const a = document.activeElement; return a && a.closest('.alert-group') ? a.closest('.alert-group').dataset.type : null;",
            vec![],
        ))
        .unwrap();
        if active == json!("Warn") {
            reached = true;
            break;
        }
    }
    assert!(reached, "Tab never reached the Warn alert's button");
    // Enter on the focused button. A snapshot may re-render the alerts in between: the page
    // moves focus to the new button, so the element is asked for again.
    let mut pressed = Err(String::new());
    for _ in 0..5 {
        let active = rt.block_on(browser.active_element()).unwrap();
        pressed = rt.block_on(active.send_keys("\u{e007}")).map_err(|e| e.to_string()); // Enter
        if pressed.is_ok() {
            break;
        }
    }
    pressed.unwrap();
    eventually(&rt, "the Warn gone", async || {
        browser.find(Locator::Css(".alert-group.Warn")).await.is_err().then_some(())
    });
    let warn = c.get_json("/alerts?all=1&type=Warn").json();
    assert_eq!(warn["alerts"]["records"][0]["acked"], 1, "{warn}");

    // Readable: text and the alert tags have a contrast of at least 4.5:1.
    let worst: Value = rt
        .block_on(browser.execute(
            r#"
            const lum = (c) => { const v = c.match(/[\d.]+/g).slice(0, 3).map(Number).map((x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); }); return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
            const bg = (e) => { while (e) { const b = getComputedStyle(e).backgroundColor; if (b && !b.startsWith('rgba(0, 0, 0, 0)') && b !== 'transparent') return b; e = e.parentElement; } return 'rgb(255, 255, 255)'; };
            let worst = 99, where = '';
            for (const e of document.querySelectorAll('h1, h2, h3, p, td, th, dt, dd, li, .tag, button, a')) {
              if (!e.offsetParent || !e.textContent.trim()) continue;
              const a = lum(getComputedStyle(e).color), b = lum(bg(e));
              const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
              if (ratio < worst) { worst = ratio; where = e.tagName + '.' + e.className + ': ' + e.textContent.trim().slice(0, 30); }
            }
            return [worst, where];"#,
            vec![],
        ))
        .unwrap();
    assert!(worst[0].as_f64().unwrap() >= 4.5, "low contrast: {worst}");

    // A phone: nothing wider than the screen, the sections still there.
    rt.block_on(browser.set_window_size(390, 844)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let fits = rt
        .block_on(browser.execute("return document.documentElement.scrollWidth <= window.innerWidth + 1;", vec![]))
        .unwrap();
    assert_eq!(fits, json!(true), "the page scrolls sideways on a phone");
    screenshot(&rt, &browser, "4-phone.png");

    rt.block_on(browser.close()).unwrap();
    drop(driver);
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}
