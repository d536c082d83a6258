//! Upgrades: the database of an earlier sitegate (schema 6, made by
//! `tests/fixtures/upgrade/make.py`) opened by this one, as an operator's upgrade does.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::*;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/upgrade");

/// The schema version the fixture was written at.
const FIXTURE_SCHEMA: i64 = 6;

fn user_version(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

/// Every table, index, view and trigger with its SQL (SQLite's statistics left out).
fn schema_of(db: &Path) -> Vec<(String, String, String, Option<String>)> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut stmt = conn
        .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_stat%' ORDER BY name")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// The fixture's database and configuration copied into a fresh test directory.
fn upgraded_dir(name: &str) -> (PathBuf, PathBuf) {
    let dir = test_dir(name);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let db = dir.join("data").join("sitegate.db");
    std::fs::copy(Path::new(FIXTURE).join("sitegate.db"), &db).unwrap();
    std::fs::copy(Path::new(FIXTURE).join("config.toml"), dir.join("config.toml")).unwrap();
    assert_eq!(user_version(&db), FIXTURE_SCHEMA, "the fixture is a database of the earlier schema");
    (dir, db)
}

fn accounts() -> Value {
    serde_json::from_str(&std::fs::read_to_string(Path::new(FIXTURE).join("accounts.json")).unwrap()).unwrap()
}

fn account(accounts: &Value, email: &str) -> Account {
    Account { email: email.into(), token: accounts[email].as_str().unwrap().into() }
}

/// Commands other than `serve` do not migrate an earlier database: the earlier version's
/// service may still be running on it (a new binary installed, not yet restarted), and would
/// go on with a schema it does not know. They say what to do, and change nothing.
#[test]
fn commands_leave_an_earlier_database_to_the_service() {
    let (dir, db) = upgraded_dir("upgrade_commands_leave_it");
    let before = std::fs::read(&db).unwrap();
    for args in
        [&["user", "list"][..], &["user", "add", "--email", "new@acme.test", "--name", "New"], &["device", "list"]]
    {
        let out = crate::support::cli_with_config(&dir.join("config.toml"), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&format!("has schema version {FIXTURE_SCHEMA}, older than")), "{args:?}: {err}");
        assert!(err.contains("start the service"), "{args:?}: {err}");
    }
    assert_eq!(user_version(&db), FIXTURE_SCHEMA);
    assert_eq!(std::fs::read(&db).unwrap(), before, "a command changed the earlier database");
    let kept = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".bak"));
    assert_eq!(kept.count(), 0);
    // The service migrates it; then the commands work.
    let s = Service::launch(dir.clone(), dir.join("config.toml"), &[]);
    assert!(s.cli(&["user", "list"]).status.success());
}

/// A database of a newer sitegate (a downgrade) is refused before anything is written to it:
/// the switch to the write-ahead log rewrote its header and made its log beside it.
#[test]
fn a_newer_database_is_refused_untouched() {
    let (dir, db) = upgraded_dir("upgrade_newer_refused_untouched");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let out = crate::support::cli_with_config(&dir.join("config.toml"), &["serve"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(err.contains("newer than this sitegate knows"), "{err}");
    assert_eq!(std::fs::read(&db).unwrap(), before, "the newer database was changed");
    assert!(!dir.join("data/sitegate.db-wal").exists());
}

#[test]
fn an_earlier_database_is_backed_up_migrated_and_served_as_before() {
    let (dir, _) = upgraded_dir("upgrade");
    // What a start stopped during its backup left: removed, not kept for ever.
    let unfinished = [
        dir.join(format!("data/sitegate.db.schema{FIXTURE_SCHEMA}-20261101T000000Z.bak.partial")),
        dir.join(format!("data/sitegate.db.schema{FIXTURE_SCHEMA}-20261101T000000Z.bak.partial-journal")),
    ];
    for file in &unfinished {
        std::fs::write(file, b"half a copy").unwrap();
    }
    let accounts = accounts();
    let id = |name: &str| accounts["ids"][name].as_i64().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let db = dir.join("data/sitegate.db");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let s = Service::launch(dir.clone(), dir.join("config.toml"), &[]);
    for file in &unfinished {
        assert!(!file.exists(), "{} is left", file.display());
    }
    {
        use std::os::unix::fs::PermissionsExt;
        for file in ["sitegate.db", "sitegate.db-wal", "sitegate.db-shm"] {
            let mode = std::fs::metadata(dir.join("data").join(file)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file}: an earlier database readable by others stays so");
        }
    }
    let admin = s.client(&account(&accounts, "admin@sitegate.local"));

    // The way back is kept: a backup of the earlier schema, beside the database.
    let backups: Vec<PathBuf> = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with(&format!("sitegate.db.schema{FIXTURE_SCHEMA}-")) && name.ends_with(".bak")
        })
        .collect();
    assert_eq!(backups.len(), 1, "one kept backup: {backups:?}");
    assert_eq!(user_version(&backups[0]), FIXTURE_SCHEMA);

    // Records with their custom fields, tags and links, as the earlier version stored them.
    let ann = admin.get_json(&format!("/contacts/{}", id("ann")));
    assert_eq!(ann.status, 200, "{}", ann.body);
    let ann = ann.json();
    assert_eq!(ann["item"]["fields"]["firstname"], "Ann");
    assert_eq!(ann["item"]["fields"]["custom1001"], "C-0042");
    assert_eq!(ann["item"]["fields"]["custom1002"], "Gold");
    assert_eq!(ann["categories"][0]["name"], "VIP", "{ann}");
    assert_eq!(ann["relateditems"][0]["id"], id("initech"), "{ann}");
    let activities = ann["activities"].to_string();
    assert!(activities.contains("Prefers mornings.") && activities.contains("Quote"), "{activities}");

    // A "starts with" search on a field: the index of field values came with the upgrade.
    let engineers = admin.list_ids("/contacts?searchmode=S11&searchvalue=engin&limit=50");
    assert_eq!(engineers.len(), 6, "Ann and five of the ten others are engineers: {engineers:?}");
    assert!(engineers.contains(&id("ann")));

    // A record deleted before the upgrade comes back.
    admin.call(Req::new("POST", &format!("/contacts/{}/restore", id("gone"))).json()).assert_status(200);
    admin.get_json(&format!("/contacts/{}", id("gone"))).assert_status(200);

    // A user's token and group membership: the group's record is theirs to see and change.
    let ben = s.client(&account(&accounts, "ben@acme.test"));
    let path = format!("/contacts/{}", id("ben_contact"));
    ben.get_json(&path).assert_status(200);
    ben.put_json(&path, r#"{"jobtitle": "Surveyor"}"#).assert_status(200);
    assert_eq!(admin.get_json(&path).json()["item"]["fields"]["jobtitle"], "Surveyor");

    // The webhook and its deliveries waiting for a receiver that was down.
    let hooks = admin.get_json("/hooks").json();
    let hooks = hooks["hooks"].as_array().cloned().unwrap_or_default();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0]["title"], "CRM sync");
    assert!(hooks[0]["pending"].as_i64().unwrap_or(0) + hooks[0]["failed"].as_i64().unwrap_or(0) >= 1, "{hooks:?}");

    // The badge, where it was last seen, its visits and the alert its entry raised.
    let devices = admin.get_json("/devices").body;
    assert!(devices.contains("5/1/22") && devices.contains("Badge 22"), "{devices}");
    let located = admin.get_json("/locate?searchvalue=Ann").body;
    assert!(located.contains("Office"), "{located}");
    // The fixture was made on 2026-11-25.
    let report = admin.post_json("/report/timebyzone", r#"{"range": "2026-11-20,2026-11-30"}"#);
    assert_eq!(report.status, 200, "{}", report.body);
    assert!(report.body.contains("Kitchen") && report.body.contains("Office"), "{}", report.body);
    let alerts = admin.get_json("/alerts?all=1").body;
    assert!(alerts.contains("office-entry"), "{alerts}");
    // The alert names the device it was raised for, now from its own record.
    assert!(alerts.contains("5/1/22"), "{alerts}");

    // The command line on the upgraded database: MQTT credentials kept, a new token works.
    let listed = s.cli(&["mqtt-user", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.contains("intercom-1") && listed.contains("scanner-1"), "{listed}");
    let out = s.cli(&["user", "token", "--email", "ben@acme.test"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .expect("a new token")
        .to_string();
    let ben = s.client(&Account { email: "ben@acme.test".into(), token });
    wait_for("the new token to work", || (ben.get_json(&path).status == 200).then_some(()));

    // New writes on the upgraded database.
    let new = admin.create("contacts", r#"{"firstname": "Eve", "lastname": "After", "jobtitle": "Engineer"}"#);
    assert!(admin.list_ids("/contacts?searchmode=S11&searchvalue=engin&limit=50").contains(&new));

    assert_eq!(s.terminate(), Some(0));
}

/// A new database made by this sitegate with the fixture's configuration (started, stopped).
fn fresh_database(name: &str) -> PathBuf {
    let dir = test_dir(name);
    std::fs::copy(Path::new(FIXTURE).join("config.toml"), dir.join("config.toml")).unwrap();
    let s = Service::launch(dir.clone(), dir.join("config.toml"), &[]);
    assert_eq!(s.terminate(), Some(0));
    dir.join("data").join("sitegate.db")
}

/// Migrations are only ever added, never changed: a database upgraded from the earlier schema
/// has exactly the tables, indexes and triggers of a new one.
#[test]
fn an_upgraded_database_has_the_schema_of_a_new_one() {
    let (dir, db) = upgraded_dir("upgrade_schema");
    let s = Service::launch(dir.clone(), dir.join("config.toml"), &[]);
    assert_eq!(s.terminate(), Some(0));
    let fresh = fresh_database("upgrade_schema_fresh");
    assert!(user_version(&db) > FIXTURE_SCHEMA);
    assert_eq!(user_version(&db), user_version(&fresh));
    let (upgraded, new) = (schema_of(&db), schema_of(&fresh));
    for (a, b) in upgraded.iter().zip(&new) {
        assert_eq!(a, b, "the upgraded database differs from a new one");
    }
    assert_eq!(upgraded.len(), new.len(), "upgraded {upgraded:#?}\nnew {new:#?}");
}
