//! Crash safety: a concurrent write load (creates, updates, activities, category changes, with
//! a webhook on every create) while the service is killed with SIGKILL at random moments and
//! started again. Every write answered 2xx must be there afterwards, the database must pass
//! `PRAGMA integrity_check`, and every create must reach the webhook receiver.
//!
//! `SITEGATE_CRASH_CYCLES` sets the number of kills (CI: 3); `SITEGATE_CRASH_SEED` repeats a
//! run's kill moments (each run prints its seed).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

/// What the service acknowledged (2xx) before a kill.
#[derive(Default)]
struct Acked {
    /// Contact id -> its first name.
    contacts: BTreeMap<i64, String>,
    /// Contact id -> the job title of its acknowledged update.
    titles: BTreeMap<i64, String>,
    /// Note id -> its contact.
    notes: BTreeMap<i64, i64>,
    /// Contact id -> the category tag added to it.
    tags: BTreeMap<i64, i64>,
}

/// A small deterministic generator (xorshift64*), so a failing run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One writer: create a contact, update it, add a note to it and tag it, over and over,
/// until the service goes away. Each acknowledged step is recorded.
fn writer(
    client: Client,
    worker: usize,
    cycle: usize,
    tags: Vec<i64>,
    acked: Arc<Mutex<Acked>>,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let name = format!("C{cycle}w{worker}n{n}");
        let call = |req: Req| client.try_call(req.json()).ok();
        let Some(r) = call(Req::new("POST", "/contacts").json_body(&format!(r#"{{"firstname": "{name}"}}"#))) else {
            return;
        };
        if r.status != 201 {
            // 503 when the queue is full is fine; anything else is a failure of the test.
            assert_eq!(r.status, 503, "create: {}", r.body);
            continue;
        }
        let id = r.json()["item"]["id"].as_i64().expect("id");
        acked.lock().unwrap().contacts.insert(id, name.clone());
        let title = format!("T{n}");
        let Some(r) =
            call(Req::new("PUT", &format!("/contacts/{id}")).json_body(&format!(r#"{{"jobtitle": "{title}"}}"#)))
        else {
            return;
        };
        if r.status == 200 {
            acked.lock().unwrap().titles.insert(id, title);
        }
        let note = format!(r#"{{"parent": {id}, "data": {{"details": "{name}"}}}}"#);
        let Some(r) = call(Req::new("POST", "/contacts/note").json_body(&note)) else { return };
        if r.status == 201 {
            let note_id = r.json()["id"].as_i64().expect("note id");
            acked.lock().unwrap().notes.insert(note_id, id);
        }
        let tag = tags[n % tags.len()];
        let body = format!(r#"{{"categories": {{"add": [{tag}]}}}}"#);
        let Some(r) = call(Req::new("PUT", &format!("/contacts/{id}")).json_body(&body)) else { return };
        if r.status == 200 {
            acked.lock().unwrap().tags.insert(id, tag);
        }
    }
}

/// Checks that every acknowledged write in `acked` is stored.
fn verify(c: &Client, acked: &Acked) {
    for (id, name) in &acked.contacts {
        let r = c.get_json(&format!("/contacts/{id}"));
        assert_eq!(r.status, 200, "acknowledged contact {id} ({name}) is missing: {}", r.body);
        let v = r.json();
        assert_eq!(v["item"]["fields"]["firstname"], name.as_str(), "contact {id}");
        if let Some(title) = acked.titles.get(id) {
            assert_eq!(v["item"]["fields"]["jobtitle"], title.as_str(), "contact {id}");
        }
        if let Some(tag) = acked.tags.get(id) {
            let has = v["categories"].as_array().is_some_and(|a| a.iter().any(|t| t["id"] == *tag));
            assert!(has, "contact {id} lost its acknowledged tag {tag}: {v}");
        }
        for (note, _) in acked.notes.iter().filter(|(_, contact)| *contact == id) {
            assert_eq!(v["activities"][note.to_string()]["typeid"], 3, "acknowledged note {note} of contact {id}: {v}");
        }
    }
}

#[derive(Default)]
struct Totals {
    creates: usize,
    updates: usize,
    notes: usize,
    tags: usize,
}

impl Totals {
    fn add(&mut self, a: &Acked) {
        self.creates += a.contacts.len();
        self.updates += a.titles.len();
        self.notes += a.notes.len();
        self.tags += a.tags.len();
    }
}

fn integrity_check(dir: &std::path::Path) -> String {
    let conn = rusqlite::Connection::open(dir.join("data").join("sitegate.db")).expect("open the database");
    conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0)).expect("integrity_check")
}

#[test]
fn acknowledged_writes_and_webhooks_survive_sigkill_at_random_moments() {
    let cycles: usize = std::env::var("SITEGATE_CRASH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let seed: u64 = std::env::var("SITEGATE_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("crash cycles: {cycles}, SITEGATE_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    // The receiver may fall behind over thousands of cycles: no pause at the default backlog.
    let config = BASE_CONFIG
        .replace(
            "[webhooks]\n",
            "[webhooks]\nretry_delays_s = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\nbacklog_max = 10000000\n",
        )
        .replace("workers = 2", "workers = 4");
    let s = Service::start_with(
        "acknowledged_writes_and_webhooks_survive_sigkill_at_random_moments",
        Options { config: &config, env: vec![] },
    );
    let rx = Receiver::start();
    let admin = s.admin.clone();
    let c = s.admin_client();
    let r = c.post_json(
        "/hooks",
        &format!(r#"{{"event": "items.create", "constrainttype": "contact", "contenttype": "json", "url": "{}", "secret": "k"}}"#, rx.url("/in")),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let tags: Vec<i64> = ["Kept", "Killed", "Restarted"]
        .iter()
        .map(|name| {
            let r = c.post_json("/contacts/categories", &format!(r#"{{"name": "{name}"}}"#));
            assert_eq!(r.status, 201, "{}", r.body);
            r.json()["id"].as_i64().or_else(|| r.json()["item"]["id"].as_i64()).expect("tag id")
        })
        .collect();
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut totals = Totals::default();
    let mut service = Some(s);
    for cycle in 0..cycles {
        let s = match service.take() {
            Some(s) => s,
            None => {
                // The writes acknowledged before the last kill are all there.
                let s = Service::launch(dir.clone(), cfg.clone(), &[]);
                let before = std::mem::take(&mut *acked.lock().unwrap());
                verify(&s.client(&admin), &before);
                totals.add(&before);
                s
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let client = s.client(&admin);
                let (tags, acked, stop) = (tags.clone(), Arc::clone(&acked), Arc::clone(&stop));
                std::thread::Builder::new()
                    .name(format!("writer-{w}"))
                    .spawn(move || writer(client, w, cycle, tags, acked, stop))
                    .unwrap()
            })
            .collect();
        // Let the load run a random while, then kill the service in the middle of it.
        std::thread::sleep(Duration::from_millis(100 + rng.below(1_400)));
        let _ = std::process::Command::new("kill").arg("-KILL").arg(s.pid().to_string()).status();
        drop(s);
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().expect("a writer failed");
        }
        let integrity = integrity_check(&dir);
        assert_eq!(integrity, "ok", "cycle {cycle}");
        if (cycle + 1) % 100 == 0 {
            eprintln!("{} kills survived so far", cycle + 1);
        }
    }
    // Back up: every acknowledged write of the last cycle is there.
    let s = Service::launch(dir.clone(), cfg.clone(), &[]);
    let c = s.client(&admin);
    let last = std::mem::take(&mut *acked.lock().unwrap());
    verify(&c, &last);
    totals.add(&last);
    assert!(totals.creates >= cycles, "the load acknowledged only {} creates", totals.creates);
    let mut listed = BTreeSet::new();
    loop {
        let page = c.list_ids(&format!("/contacts?limit=5000&start={}", listed.len()));
        let last = page.len() < 5000;
        listed.extend(page);
        if last {
            break;
        }
    }
    // Every contact in the database (acknowledged or committed just before a kill) reaches
    // the receiver: at least once, in order per hook.
    let started = Instant::now();
    // (wait_for's deadline is for one condition: waiting for many deliveries gets its own.)
    let deadline = Instant::now() + Duration::from_secs(120 + listed.len() as u64 / 20);
    // Only the deliveries that arrived since the last look are read (long runs have many).
    let mut delivered = BTreeSet::new();
    let mut read = 0;
    loop {
        let accepted = rx.accepted();
        delivered.extend(accepted[read..].iter().filter_map(|r| r.json()["objectid"].as_i64()));
        read = accepted.len();
        if listed.is_subset(&delivered) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} contacts have no webhook",
            listed.difference(&delivered).count(),
            listed.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "{cycles} kills survived: {} creates, {} updates, {} notes, {} tags acknowledged; {} contacts stored; \
         {} distinct webhooks delivered ({} attempts) within {:.1} s of the last start",
        totals.creates,
        totals.updates,
        totals.notes,
        totals.tags,
        listed.len(),
        delivered.len(),
        read,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(s.terminate(), Some(0));
    assert_eq!(integrity_check(&dir), "ok");
}
