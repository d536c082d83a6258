//! The command line: version, configuration loading and errors (exit 78 naming the key),
//! user and group commands.

use crate::support::{BASE_CONFIG, Service, cli_with_config, sitegate, test_dir, wait_for};

fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    sitegate().args(args).current_dir(dir).output().expect("run sitegate")
}

#[test]
fn version_prints_the_version() {
    let out = sitegate().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), format!("sitegate {}", env!("CARGO_PKG_VERSION")));
}

/// A mistake on the command line exits 64 (as sysexits' EX_USAGE), help exits 0.
#[test]
fn command_line_mistakes_exit_64() {
    for args in [
        &["--bogus"][..],
        &["user", "add", "--email", "b@example.com"],
        &["user", "frob"],
        &["group", "delete", "--group", "abc"],
    ] {
        let out = sitegate().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--help"));
    }
    let out = sitegate().args(["user", "add", "--help"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--email"));
}

/// Under systemd, the message a command fails with carries the journal's error priority.
#[test]
fn failures_carry_the_journal_error_priority() {
    let dir = test_dir("failures_carry_the_journal_error_priority");
    let out = sitegate()
        .args(["check-config", "--config", "nope.toml"])
        .current_dir(&dir)
        .env("JOURNAL_STREAM", "8:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("<3>sitegate: configuration error"), "{err}");
    let out = sitegate()
        .args(["check-config", "--config", "nope.toml"])
        .current_dir(&dir)
        .env_remove("JOURNAL_STREAM")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("sitegate: configuration error"));
}

#[test]
fn configuration_errors_exit_78_and_name_the_key() {
    let dir = test_dir("configuration_errors_exit_78_and_name_the_key");
    let cases = [
        ("[http]\nworkers = 0\n", "http.workers"),
        ("[http]\nlisten = \"localhost\"\n", "http.listen"),
        ("[http]\nworkers = \"four\"\n", "http.workers"),
        ("[htttp]\nlisten = \"127.0.0.1:0\"\n", "htttp"),
        ("[site]\ntimezone = \"Europe/Nowhere\"\n", "site.timezone"),
        ("[[organizations]]\nid = \"has space\"\nname = \"x\"\n", "organizations[0].id"),
        ("[http]\ntls_cert = \"missing.crt\"\ntls_key = \"missing.key\"\n", "http.tls_cert"),
        ("[webhooks]\nca = \"missing.pem\"\n", "webhooks.ca"),
        ("[mqtt]\nbridge_url = \"mqtt://127.0.0.1:18790x\"\n", "mqtt.bridge_url"),
        ("[mqtt]\nbridge_url = \"mqtts://127.0.0.1:70000\"\n", "mqtt.bridge_url"),
        ("[mqtt]\nbridge_url = \"mqtt://user:pw@127.0.0.1:1883\"\n", "mqtt.bridge_url"),
        ("[mqtt]\nbridge_url = \"mqtt://127.0.0.1:\"\n", "mqtt.bridge_url"),
        ("[webhooks]\nca = \"no-certificate.pem\"\n", "webhooks.ca"),
        ("[http]\nlisten = \"127.0.0.1:18080\"\n[mqtt]\nlisten = \"127.0.0.1:18080\"\n", "mqtt.listen"),
        ("[http]\nlisten = \"0.0.0.0:18080\"\n[mqtt]\nlisten = \"127.0.0.1:18080\"\n", "mqtt.listen"),
        ("[store]\npath = \"a-folder\"\n", "store.path"),
        ("[http\nbroken", ""),
    ];
    std::fs::write(dir.join("no-certificate.pem"), "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
        .unwrap();
    std::fs::create_dir_all(dir.join("a-folder")).unwrap();
    for (text, key) in cases {
        let path = dir.join("config.toml");
        std::fs::write(&path, text).unwrap();
        for sub in [&["serve"][..], &["check-config"], &["user", "list"]] {
            let out = cli_with_config(&path, sub);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{sub:?} with {text:?}: {err}");
            assert!(err.contains("configuration error"), "{err}");
            assert!(err.contains(&format!("`{key}`")) || key.is_empty(), "{text:?} should name {key}: {err}");
        }
    }
    // An explicit --config that does not exist is an error too, and a folder is no file.
    let out = cli_with_config(&dir.join("nope.toml"), &["serve"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    let out = cli_with_config(&dir, &["serve"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a folder, not a configuration file"));
}

/// A database file that is not one (damaged, or something else): refused, named, unchanged.
#[test]
fn serve_refuses_a_file_that_is_not_a_database_and_names_it() {
    let dir = test_dir("serve_refuses_a_file_that_is_not_a_database");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let junk: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(dir.join("data/sitegate.db"), &junk).unwrap();
    std::fs::write(dir.join("config.toml"), BASE_CONFIG).unwrap();
    let out = cli_with_config(&dir.join("config.toml"), &["serve"]);
    // Not 1: systemd would start it again every 2 s, to fail the same way.
    assert_eq!(out.status.code(), Some(65));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("data/sitegate.db: file is not a database"), "{err}");
    assert_eq!(std::fs::read(dir.join("data/sitegate.db")).unwrap(), junk);
}

/// Another program's SQLite database at `[store] path` (a wrong path) is left as it is, by
/// the service and by commands alike; an empty file there becomes the site's database,
/// readable by the service only.
#[test]
fn another_programs_database_is_left_alone() {
    let dir = test_dir("another_programs_database_is_left_alone");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let db = dir.join("data/sitegate.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("CREATE TABLE customers (name TEXT); INSERT INTO customers VALUES ('x');").unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    std::fs::write(dir.join("config.toml"), BASE_CONFIG).unwrap();
    for args in [&["serve"][..], &["user", "add", "--email", "a@example.com", "--name", "A"]] {
        let out = cli_with_config(&dir.join("config.toml"), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(65), "{args:?}: {err}");
        assert!(err.contains("an SQLite database of something else"), "{args:?}: {err}");
        assert!(std::fs::read(&db).unwrap() == before, "{args:?} changed it");
    }
    std::fs::write(&db, b"").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cli_with_config(&dir.join("config.toml"), &["user", "add", "--email", "a@example.com", "--name", "A"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn check_config_resolves_paths_relative_to_the_file() {
    let dir = test_dir("check_config_resolves_paths_relative_to_the_file");
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/config.toml"), "[store]\npath = \"db/site.db\"\n").unwrap();
    let out = cli_with_config(&dir.join("etc/config.toml"), &["check-config"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = dir.join("etc/db/site.db");
    assert!(text.contains(&format!("path = \"{}\"", expected.display())), "{text}");
    assert!(text.contains("listen = \"127.0.0.1:8080\""), "{text}");
    assert!(text.contains("quota_calls_per_hour = 10000"), "{text}");
    // Without --config: ./config.toml when present, else the built-in defaults.
    let out = run_in(&dir.join("etc"), &["check-config"]);
    assert!(String::from_utf8(out.stdout).unwrap().contains("db/site.db"));
    let out = run_in(&dir, &["check-config"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("built-in defaults") && text.contains("data/sitegate.db"), "{text}");
}

#[test]
fn the_shipped_config_is_valid_and_matches_the_defaults() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let out = cli_with_config(&shipped, &["check-config"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_file = String::from_utf8(out.stdout).unwrap();
    let dir = test_dir("the_shipped_config_is_valid_and_matches_the_defaults");
    let defaults = String::from_utf8(run_in(&dir, &["check-config"]).stdout).unwrap();
    // Same settings; only the first line (the source) and the store path's folder differ.
    let strip = |t: &str| -> Vec<String> {
        t.lines().skip(1).filter(|l| !l.starts_with("path = ")).map(str::to_string).collect()
    };
    assert_eq!(strip(&from_file), strip(&defaults));
}

#[test]
fn user_and_group_commands() {
    let s = Service::start("user_and_group_commands");
    let group = s.add_group("Night shift", &["--email", "night@acme.test"]);
    let gone_group = s.add_group("Day shift", &[]).to_string();
    assert!(s.cli(&["group", "delete", "--group", &gone_group]).status.success());
    let ann = s.add_user("ann@acme.test", "Ann Lee", &["--admin", "--group", &group.to_string()]);
    assert_eq!(ann.token.len(), 64);
    // A deleted user is no user for the other commands either.
    s.add_user("gone@acme.test", "Gone", &[]);
    assert!(s.cli(&["user", "delete", "--email", "gone@acme.test"]).status.success());
    // Duplicates, unknown organisations, bad addresses, unknown groups: exit 64 with a reason.
    for (args, reason) in [
        (vec!["user", "add", "--email", "ann@acme.test", "--name", "Again"], "already exists"),
        (vec!["user", "add", "--email", "x@acme.test", "--name", "X", "--org", "nowhere"], "no organisation"),
        (vec!["user", "add", "--email", "not-an-address", "--name", "X"], "not an e-mail"),
        (vec!["user", "add", "--email", "y@acme.test", "--name", "Y", "--group", "999"], "no group"),
        (vec!["user", "token", "--email", "nobody@acme.test"], "no user"),
        (vec!["group", "member", "--group", "999", "--email", "ann@acme.test"], "no group"),
        (vec!["group", "add", "--name", "Night shift"], "already exists"),
        (vec!["group", "delete", "--group", &gone_group], "already deleted"),
        (vec!["group", "delete", "--group", "999"], "no group 999"),
        (vec!["user", "enable", "--email", "gone@acme.test"], "user gone@acme.test is deleted"),
        (vec!["user", "disable", "--email", "gone@acme.test"], "user gone@acme.test is deleted"),
        (vec!["user", "token", "--email", "gone@acme.test"], "user undelete --email gone@acme.test"),
        (vec!["user", "add", "--email", "Gone@acme.test", "--name", "Gone"], "a deleted user has e-mail"),
        (vec!["user", "undelete", "--email", "ann@acme.test"], "no deleted user"),
        (vec!["mqtt-user", "delete", "--username", "nobody"], "no MQTT credentials with username nobody"),
        (vec!["locations", "--contact", "999999"], "no contact 999999"),
        (vec!["locations", "--contact", "999999", "--purge"], "no contact 999999"),
    ] {
        let out = s.cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(reason), "{args:?}: {err}");
    }
    let list = String::from_utf8(s.cli(&["user", "list"]).stdout).unwrap();
    assert!(list.contains("ann@acme.test\tAnn Lee\tadmin"), "{list}");
    assert!(list.contains("admin@sitegate.local"), "{list}");
    let groups = String::from_utf8(s.cli(&["group", "list"]).stdout).unwrap();
    assert!(groups.contains("Night shift\tnight@acme.test"), "{groups}");
    // The new administrator works at once, while the service runs.
    s.client(&ann).get("/contacts").assert_status(200);
    // A deleted user brought back logs in with the new token.
    let out = s.cli(&["user", "undelete", "--email", "gone@acme.test"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let gone = crate::support::Account { email: "gone@acme.test".into(), token };
    s.client(&gone).get("/contacts").assert_status(200);
    // Administrators made and unmade, at once for the running service; the last one who can
    // log in stays one.
    s.client(&gone).get("/devices").assert_status(403);
    let run = |args: &[&str]| {
        let out = s.cli(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["user", "admin", "--email", "gone@acme.test"]);
    s.client(&gone).get("/devices").assert_status(200);
    run(&["user", "admin", "--email", "gone@acme.test", "--revoke"]);
    s.client(&gone).get("/devices").assert_status(403);
    run(&["user", "admin", "--email", "ann@acme.test", "--revoke"]);
    let out = s.cli(&["user", "admin", "--email", "admin@sitegate.local", "--revoke"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("last administrator"));
    // Members taken out of a group.
    run(&["group", "member", "--group", &group.to_string(), "--email", "ann@acme.test", "--remove"]);
    let out = s.cli(&["group", "member", "--group", &group.to_string(), "--email", "ann@acme.test", "--remove"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a member"));
}

#[test]
fn serve_fails_clearly_when_the_port_is_taken() {
    let s = Service::start("serve_fails_clearly_when_the_port_is_taken");
    let dir = test_dir("serve_fails_clearly_when_the_port_is_taken_2");
    // The HTTP listener's address only (the first `listen`): the other service holds it.
    let config = BASE_CONFIG.replacen("listen = \"127.0.0.1:0\"", &format!("listen = \"{}\"", s.addr), 1);
    std::fs::write(dir.join("config.toml"), config).unwrap();
    let out = cli_with_config(&dir.join("config.toml"), &["serve"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {}", s.addr)), "{err}");
    // No administrator was made whose token, printed once, went with the failed start: the
    // first start that serves makes it.
    assert!(!err.contains("admin token"), "{err}");
    let free = BASE_CONFIG.to_string();
    std::fs::write(dir.join("config.toml"), free).unwrap();
    let started = Service::launch(dir.clone(), dir.join("config.toml"), &[]);
    wait_for("the administrator's token", || started.stderr().contains("admin token: ").then_some(()));
}

/// Commands that read or change what is there do not make an empty database where there is
/// none (a wrong --config, or a data folder gone, would look like a site with nothing in it).
#[test]
fn list_commands_do_not_create_a_database() {
    let dir = test_dir("list_commands_do_not_create_a_database");
    std::fs::write(dir.join("config.toml"), BASE_CONFIG).unwrap();
    std::fs::write(dir.join("empty.jsonl"), "").unwrap();
    let trace = dir.join("empty.jsonl");
    let trace = trace.to_str().unwrap();
    for args in [
        &["user", "list"][..],
        &["device", "list"],
        &["group", "list"],
        &["mqtt-user", "list"],
        &["replay", "--trace", trace],
        &["compact"],
        &["backup", "--out", "copy.db"],
    ] {
        let out = cli_with_config(&dir.join("config.toml"), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("no database at"), "{args:?}: {err}");
        assert!(!dir.join("data/sitegate.db").exists(), "{args:?} made a database");
    }
    // A client certificate needs no database either (it did make an empty one).
    let out = cli_with_config(&dir.join("config.toml"), &["cert", "client", "--org", "acme", "--name", "x"]);
    assert!(!out.status.success());
    assert!(!dir.join("data/sitegate.db").exists(), "cert client made a database");
    // Adding a user is how a site may begin: that makes the database.
    let out = cli_with_config(&dir.join("config.toml"), &["user", "add", "--email", "a@example.com", "--name", "A"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(cli_with_config(&dir.join("config.toml"), &["user", "list"]).status.success());
}

/// Commands run as root (a user added before the first start, a restore) leave the database
/// to the service's user, who owns its folder; a database that user cannot open is named with
/// its owner and stops the start for good (65: systemd does not start it again every 2 s).
/// Acting as two users needs root: skipped otherwise.
#[test]
fn databases_made_by_root_are_left_to_the_service_user() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    if std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    const SERVICE_USER: u32 = 65534;
    let dir = test_dir("databases_made_by_root_are_left_to_the_service_user");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::chown(&data, Some(SERVICE_USER), Some(SERVICE_USER)).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(&config, BASE_CONFIG).unwrap();
    let db = data.join("sitegate.db");
    let owner = || std::fs::metadata(&db).unwrap().uid();
    let as_service_user = |args: &[&str]| {
        let mut cmd = crate::support::sitegate();
        cmd.args(args).arg("--config").arg(&config).uid(SERVICE_USER).gid(SERVICE_USER);
        cmd.output().unwrap()
    };
    let ok = |out: std::process::Output| assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    ok(cli_with_config(&config, &["user", "add", "--email", "a@example.com", "--name", "A"]));
    assert_eq!(owner(), SERVICE_USER, "made by root before the first start");
    ok(as_service_user(&["user", "list"]));

    let copy = dir.join("copy.db");
    ok(cli_with_config(&config, &["backup", "--out", copy.to_str().unwrap()]));
    ok(cli_with_config(&config, &["restore", "--from", copy.to_str().unwrap()]));
    assert_eq!(owner(), SERVICE_USER, "restored by root");
    let listed = as_service_user(&["user", "list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("a@example.com"), "{listed:?}");

    std::os::unix::fs::chown(&db, Some(0), Some(0)).unwrap();
    let out = as_service_user(&["serve"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(err.contains("belongs to user 0") && err.contains("chown"), "{err}");
}

/// A command that makes the database (there was none) says where, and from which
/// configuration: run in the wrong folder, it would otherwise seem to have changed the site.
/// The first start then warns that no administrator of the organisation can log in, when
/// none of its users made that way is one.
#[test]
fn a_command_that_makes_the_database_says_so() {
    let dir = test_dir("a_command_that_makes_the_database_says_so");
    let config = dir.join("config.toml");
    std::fs::write(&config, BASE_CONFIG).unwrap();
    let out = cli_with_config(&config, &["user", "add", "--email", "a@example.com", "--name", "A"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("made a new database at") && err.contains(&config.display().to_string()), "{err}");
    let out = cli_with_config(&config, &["user", "add", "--email", "b@example.com", "--name", "B"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("made a new database"), "{out:?}");
    // Another organisation's administrator does not stand in for acme's.
    let out = cli_with_config(
        &config,
        &["user", "add", "--email", "g@globex.test", "--name", "G", "--org", "globex", "--admin"],
    );
    assert!(out.status.success(), "{out:?}");
    let s = Service::launch(dir.clone(), config, &[]);
    crate::support::wait_for("the warning of no administrator", || {
        s.stderr().contains("no administrator of organisation acme can log in").then_some(())
    });
    assert!(!s.stderr().contains("organisation globex can"), "{}", s.stderr());
}

/// Each organisation keeps an administrator who can log in: the last one is not revoked,
/// disabled or deleted, whatever other organisations have. A deleted group's members lose its
/// records, as the command says, and an undelete gives them back. E-mails that could never
/// log in and names that would break the lists are refused.
#[test]
fn each_organisation_keeps_an_administrator_and_groups_come_back() {
    let s = Service::start("each_organisation_keeps_an_administrator_and_groups_come_back");
    let boss = s.add_user("boss@globex.test", "Globex Boss", &["--org", "globex", "--admin"]);
    let refused = |args: &[&str]| {
        let out = s.cli(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Acme's administrator does not stand in for globex's, nor the other way.
    for args in [
        &["user", "admin", "--email", "boss@globex.test", "--revoke"][..],
        &["user", "disable", "--email", "boss@globex.test"],
        &["user", "delete", "--email", "boss@globex.test"],
        &["user", "disable", "--email", "admin@sitegate.local"],
        &["user", "delete", "--email", "admin@sitegate.local"],
    ] {
        let err = refused(args);
        assert!(err.contains("last administrator of organisation"), "{args:?}: {err}");
    }
    s.client(&boss).get("/devices").assert_status(200);
    // With a second one, the first may go.
    s.add_user("deputy@globex.test", "Deputy", &["--org", "globex", "--admin"]);
    let out = s.cli(&["user", "disable", "--email", "boss@globex.test"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    s.client(&boss).get("/contacts").assert_status(401);

    // A group deleted and brought back.
    let team = s.add_group("Team", &[]);
    let pat = s.add_user("pat@acme.test", "Pat", &["--group", &team.to_string()]);
    let shared = s.admin_client().create("contacts", &format!(r#"{{"firstname": "Shared", "ownership": {team}}}"#));
    let c = s.client(&pat);
    c.get(&format!("/contacts/{shared}")).assert_status(200);
    let out = s.cli(&["group", "delete", "--group", &team.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("it owns 1 records, which its 1 members no longer see"), "{said}");
    c.get(&format!("/contacts/{shared}")).assert_status(404);
    let again = s.add_group("team", &[]);
    let err = refused(&["group", "undelete", "--group", &team.to_string()]);
    assert!(err.contains(&format!("group {again} has the name")), "{err}");
    let out = s.cli(&["group", "delete", "--group", &again.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = s.cli(&["group", "undelete", "--group", &team.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.get(&format!("/contacts/{shared}")).assert_status(200);
    let err = refused(&["group", "undelete", "--group", &team.to_string()]);
    assert!(err.contains("is not deleted"), "{err}");

    let err = refused(&["user", "add", "--email", "a:b@acme.test", "--name", "Colon"]);
    assert!(err.contains("cannot hold ':'"), "{err}");
    for name in ["Eve\n2\tacme\troot@acme.test", "Tab\tName"] {
        let err = refused(&["user", "add", "--email", "eve@acme.test", "--name", name]);
        assert!(err.contains("one line"), "{err}");
        let err = refused(&["group", "add", "--name", name]);
        assert!(err.contains("one line"), "{err}");
    }
}

/// A command whose reader stops early (`sitegate user list | head -1`) ends quietly, as other
/// commands do: no panic about a broken pipe.
#[test]
fn a_reader_gone_early_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let s = Service::start("a_reader_gone_early_ends_a_command_quietly");
    for args in [&["user", "list"][..], &["--help"][..]] {
        let mut cmd = sitegate();
        cmd.args(args);
        if args[0] != "--help" {
            cmd.arg("--config").arg(&s.config);
        }
        let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take()); // the reader is gone before the first line
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert!(out.status.success() || out.status.signal() == Some(13), "{args:?}: {:?}", out.status);
    }
}
