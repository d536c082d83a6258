//! Who sees and changes what: two users, a group, an administrator, two organisations.

use crate::support::{Client, Receiver, Req, Service, wait_for};

#[test]
fn users_see_their_own_and_their_groups_records() {
    let s = Service::start("users_see_their_own_and_their_groups_records");
    let team = s.add_group("Site team", &[]);
    let ann = s.add_user("ann@acme.test", "Ann Lee", &["--group", &team.to_string()]);
    let bob = s.add_user("bob@acme.test", "Bob Stone", &[]);
    let carl = s.add_user("carl@acme.test", "Carl Day", &[]);
    assert!(s.cli(&["group", "member", "--group", &team.to_string(), "--email", "carl@acme.test"]).status.success());
    let (ann_c, bob_c, carl_c, admin) = (s.client(&ann), s.client(&bob), s.client(&carl), s.admin_client());

    let private = ann_c.create("contacts", r#"{"firstname": "Ann's private"}"#);
    let shared = ann_c.create("contacts", &format!(r#"{{"firstname": "Team shared", "ownership": {team}}}"#));
    let bobs = bob_c.create("contacts", r#"{"firstname": "Bob's own"}"#);

    // Lists.
    assert_eq!(ann_c.list_ids("/contacts"), vec![private, shared]);
    assert_eq!(carl_c.list_ids("/contacts"), vec![shared]);
    assert_eq!(bob_c.list_ids("/contacts"), vec![bobs]);
    assert_eq!(admin.list_ids("/contacts"), vec![private, bobs, shared]);

    // Show, update, delete of someone else's private record: not found, and nothing changes.
    for path in [format!("/contacts/{private}"), format!("/contacts/{private}/")] {
        bob_c.get(&path).assert_status(404);
        bob_c.put_json(&path, r#"{"firstname": "hacked"}"#).assert_status(404);
        bob_c.delete(&path).assert_status(404);
    }
    assert_eq!(ann_c.get_json(&format!("/contacts/{private}")).json()["item"]["name"], "Ann's private");
    // A group member may change the group's record.
    carl_c.put_json(&format!("/contacts/{shared}"), r#"{"jobtitle": "Lead"}"#).assert_status(200);
    // Activities under an invisible record cannot be created.
    bob_c
        .post_json("/contacts/note", &format!(r#"{{"parent": {private}, "data": {{"details": "x"}}}}"#))
        .assert_status(404);
    let note = ann_c.create_activity("note", &format!(r#"{{"parent": {private}, "data": {{"details": "mine"}}}}"#));
    bob_c.put_json(&format!("/contacts/note/{note}"), r#"{"data": {"details": "hacked"}}"#).assert_status(404);
    bob_c.delete(&format!("/contacts/note/{note}")).assert_status(404);
    // Relating to an invisible record is refused, and does not reveal it.
    let r = bob_c.put_json(&format!("/contacts/{bobs}"), &format!(r#"{{"relateditems": {{"add": [{private}]}}}}"#));
    r.assert_status(400);
    assert!(r.body.contains("does not exist"), "{}", r.body);
    // Searching does not find invisible records.
    assert!(bob_c.list_ids("/contacts?searchvalue=Ann").is_empty());

    // Ownership: one's own id or one's groups; administrators any in the organisation.
    let r = bob_c.post_json("/contacts", &format!(r#"{{"firstname": "x", "ownership": {team}}}"#));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.json()["errors"]["accessdenied"].is_string());
    ann_c.put_json(&format!("/contacts/{private}"), r#"{"ownership": 1}"#).assert_status(403);
    admin.put_json(&format!("/contacts/{bobs}"), &format!(r#"{{"ownership": {team}}}"#)).assert_status(200);
    assert!(carl_c.list_ids("/contacts").contains(&bobs));
    assert!(bob_c.list_ids("/contacts").is_empty());
    admin.post_json("/contacts", r#"{"firstname": "x", "ownership": 999}"#).assert_status(400);
}

#[test]
fn organisations_are_isolated() {
    let s = Service::start("organisations_are_isolated");
    let globex_admin = s.add_user("boss@globex.test", "Globex Boss", &["--org", "globex", "--admin"]);
    let g = s.client(&globex_admin);
    let a = s.admin_client();
    let acme_contact = a.create("contacts", r#"{"firstname": "Acme person"}"#);
    let acme_tag = a.post_json("/contacts/categories", r#"{"name": "VIP"}"#).json()["id"].as_i64().unwrap();
    // An administrator of another organisation sees nothing of it.
    assert!(g.list_ids("/contacts").is_empty());
    g.get(&format!("/contacts/{acme_contact}")).assert_status(404);
    g.put_json(&format!("/contacts/{acme_contact}"), r#"{"firstname": "x"}"#).assert_status(404);
    g.delete(&format!("/contacts/{acme_contact}")).assert_status(404);
    assert_eq!(g.get_json("/contacts/categories").json()["categories"], serde_json::json!([]));
    // Same tag name is fine in the other organisation; the other's tag id cannot be used.
    g.post_json("/contacts/categories", r#"{"name": "VIP"}"#).assert_status(201);
    g.post_json("/contacts", &format!(r#"{{"firstname": "x", "categories": {{"add": [{acme_tag}]}}}}"#))
        .assert_status(400);
    g.post_json("/contacts", r#"{"firstname": "x", "ownership": 1}"#).assert_status(400);
    g.post_json("/contacts", r#"{"firstname": "x", "assignedto": 1}"#).assert_status(400);
    g.post_json("/contacts/note", &format!(r#"{{"parent": {acme_contact}, "data": {{"details": "x"}}}}"#))
        .assert_status(404);
    let users = g.get_json("/ownership").json();
    let emails: Vec<&str> = users["users"].as_array().unwrap().iter().map(|u| u["email"].as_str().unwrap()).collect();
    assert_eq!(emails, vec!["boss@globex.test"]);
    // And the first organisation is unchanged.
    assert_eq!(a.get_json(&format!("/contacts/{acme_contact}")).json()["item"]["name"], "Acme person");
}

#[test]
fn credentials_tokens_and_disabled_users() {
    let s = Service::start("credentials_tokens_and_disabled_users");
    let ann = s.add_user("ann@acme.test", "Ann Lee", &[]);
    let c = s.client(&ann);
    c.get("/contacts").assert_status(200);
    // E-mail is matched ignoring case; a wrong token, an unknown user, no header: 401.
    let upper = crate::support::Account { email: "ANN@acme.test".into(), token: ann.token.clone() };
    s.client(&upper).get("/contacts").assert_status(200);
    for auth in [
        crate::support::basic(&ann.email, "0".repeat(64).as_str()),
        crate::support::basic("nobody@acme.test", &ann.token),
        crate::support::basic(&ann.email, ""),
        "Basic not-base64".to_string(),
        format!("Bearer {}", ann.token),
    ] {
        let r = s.anonymous().call(Req::new("GET", "/contacts").header("Authorization", &auth));
        assert_eq!(r.status, 401, "{auth}");
        assert_eq!(r.header("WWW-Authenticate"), Some("Basic realm=\"sitegate\", charset=\"UTF-8\""));
        assert!(r.body.contains("<authenticationfailed>"), "{}", r.body);
    }
    let r = s.anonymous().get("/contacts");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("Http-X-Service-Api-Call-Limit"), Some("0/10000"));

    // A new token replaces the old one, while the service runs.
    let out = s.cli(&["user", "token", "--email", "ann@acme.test"]);
    assert!(out.status.success());
    let fresh = String::from_utf8(out.stdout).unwrap().trim().to_string();
    c.get("/contacts").assert_status(401);
    let c2 = s.client(&crate::support::Account { email: ann.email.clone(), token: fresh });
    c2.get("/contacts").assert_status(200);
    // Disabled: refused; enabled again: accepted; deleted: refused for good.
    assert!(s.cli(&["user", "disable", "--email", "ann@acme.test"]).status.success());
    c2.get("/contacts").assert_status(401);
    assert!(s.cli(&["user", "enable", "--email", "ann@acme.test"]).status.success());
    c2.get("/contacts").assert_status(200);
    assert!(s.cli(&["user", "delete", "--email", "ann@acme.test"]).status.success());
    c2.get("/contacts").assert_status(401);
    // The database holds no token in the clear.
    let db = std::fs::read(s.dir.join("data/sitegate.db")).unwrap();
    let needle = ann.token.as_bytes();
    assert!(!db.windows(needle.len()).any(|w| w == needle), "a token is stored in the clear");
}

#[test]
fn users_without_private_data_must_share() {
    let s = Service::start("users_without_private_data_must_share");
    let team = s.add_group("Team", &[]);
    let pat = s.add_user("pat@acme.test", "Pat", &["--prevent-private-data", "--group", &team.to_string()]);
    let c = s.client(&pat);
    // With one group, a record without ownership is the group's.
    let r = c.post_json("/contacts", r#"{"firstname": "x"}"#);
    assert_eq!((r.status, r.json()["item"]["ownership"].as_i64()), (201, Some(team)), "{}", r.body);
    let own = user_id(&s, "pat@acme.test");
    let r = c.post_json("/contacts", &format!(r#"{{"firstname": "x", "ownership": {own}}}"#));
    assert_eq!(r.status, 403, "never the user's own: {}", r.body);
    // Nor given by an administrator, on create or update.
    let admin = s.admin_client();
    let r = admin.post_json("/contacts", &format!(r#"{{"firstname": "x", "ownership": {own}}}"#));
    assert_eq!(r.status, 403, "{}", r.body);
    let mine = admin.create("contacts", r#"{"firstname": "z"}"#);
    let r = admin.put_json(&format!("/contacts/{mine}"), &format!(r#"{{"ownership": {own}}}"#));
    assert_eq!(r.status, 403, "{}", r.body);
    // With two, the caller chooses.
    let other = s.add_group("Other", &[]);
    let lee = s.add_user(
        "lee@acme.test",
        "Lee",
        &["--prevent-private-data", "--group", &team.to_string(), "--group", &other.to_string()],
    );
    let c = s.client(&lee);
    let r = c.post_json("/contacts", r#"{"firstname": "y"}"#);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("give one of their groups"), "{}", r.body);
    c.post_json("/contacts", &format!(r#"{{"firstname": "y", "ownership": {other}}}"#)).assert_status(201);
    // An administrator without private records and with one group gets it too.
    let ada = s.add_user("ada@acme.test", "Ada", &["--admin", "--prevent-private-data", "--group", &team.to_string()]);
    let r = s.client(&ada).post_json("/contacts", r#"{"firstname": "w"}"#);
    assert_eq!((r.status, r.json()["item"]["ownership"].as_i64()), (201, Some(team)), "{}", r.body);
    let me = s.admin_client().get_json("/ownership").json();
    let pat_entry = me["users"].as_array().unwrap().iter().find(|u| u["email"] == "pat@acme.test").unwrap().clone();
    assert_eq!(pat_entry["preventprivatedata"], 1);
}

/// A record and a follow-up assigned to a user who is deleted since can still be saved with the
/// values they hold (a client sending back what it read); a deleted user is still refused as
/// a new assignee.
#[test]
fn an_assignee_deleted_since_does_not_block_saving_what_was_read() {
    let s = Service::start("an_assignee_deleted_since_does_not_block_saving_what_was_read");
    s.add_user("gone@acme.test", "Gone", &[]);
    let gone = user_id(&s, "gone@acme.test");
    let c = s.admin_client();
    let contact = c.create("contacts", &format!(r#"{{"firstname": "Assigned", "assignedto": {gone}}}"#));
    let task = c.create_activity(
        "followup",
        &format!(r#"{{"parent": {contact}, "data": {{"details": "Call", "assignedto": {gone}}}}}"#),
    );
    let out = s.cli(&["user", "delete", "--email", "gone@acme.test"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = c.get_json(&format!("/contacts/{contact}")).json();
    let mut fields = read["item"]["fields"].clone();
    fields["jobtitle"] = "Engineer".into();
    assert_eq!(fields["assignedto"], gone.to_string());
    c.put_json(&format!("/contacts/{contact}"), &fields.to_string()).assert_status(200);
    let body = format!(r#"{{"data": {{"details": "Call back", "assignedto": "{gone}"}}}}"#);
    c.put_json(&format!("/contacts/followup/{task}"), &body).assert_status(200);
    // A new assignee must still be someone.
    let other = c.create("contacts", r#"{"firstname": "Other"}"#);
    let r = c.put_json(&format!("/contacts/{other}"), &format!(r#"{{"assignedto": {gone}}}"#));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("invalidreference"), "{}", r.body);
    let second = c.create_activity("followup", &format!(r#"{{"parent": {contact}, "data": {{"details": "Other"}}}}"#));
    let r = c.put_json(&format!("/contacts/followup/{second}"), &format!(r#"{{"data": {{"assignedto": {gone}}}}}"#));
    assert_eq!(r.status, 400, "{}", r.body);
}

/// A user's id, from the ownership list.
fn user_id(s: &Service, email: &str) -> i64 {
    let list = s.admin_client().get_json("/ownership").json();
    list["users"].as_array().unwrap().iter().find(|u| u["email"] == email).unwrap()["id"].as_i64().unwrap()
}

/// Every other path to a record: reports, batch, hooks and their deliveries, the location API.
#[test]
fn private_records_stay_private_on_every_path() {
    let s = Service::start("private_records_stay_private_on_every_path");
    let ann = s.add_user("ann@acme.test", "Ann Lee", &[]);
    let bob = s.add_user("bob@acme.test", "Bob Stone", &[]);
    let (ann_c, bob_c, admin) = (s.client(&ann), s.client(&bob), s.admin_client());
    let private = ann_c.create("contacts", r#"{"firstname": "Secretname", "lastname": "Private"}"#);
    let list =
        ann_c.create_activity("tasklist", &format!(r#"{{"parent": {private}, "data": {{"title": "Hidden plan"}}}}"#));
    ann_c.create_activity("task", &format!(r#"{{"parent": {list}, "data": {{"title": "Hidden task"}}}}"#));
    let bobs = bob_c.create("contacts", r#"{"firstname": "Bobs own"}"#);
    bob_c.create_activity("note", &format!(r#"{{"parent": {bobs}, "data": {{"details": "Bobs note"}}}}"#));

    // Reports list activities of records the caller may see only.
    for report in ["/report/activities", "/report/nextactions", "/report/calendar"] {
        let mine = ann_c.get_json(report);
        let theirs = bob_c.get_json(report);
        assert_eq!(theirs.status, 200, "{report}: {}", theirs.body);
        assert!(!theirs.body.contains("Hidden") && !theirs.body.contains("Secretname"), "{report}: {}", theirs.body);
        if report == "/report/activities" {
            assert!(mine.body.contains("Hidden plan"), "{report} (the owner sees it): {}", mine.body);
            assert!(theirs.body.contains("Bobs note"), "{report}: {}", theirs.body);
        }
    }

    // A batch runs each nested request as its caller: the same 404s.
    let batch = format!(
        "--b\r\nContent-Type: application/http\r\n\r\nGET /contacts/{private} HTTP/1.1\r\nAccept: application/json\r\n\r\n\r\n\
         --b\r\nContent-Type: application/http\r\n\r\nPUT /contacts/{private} HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json\r\n\r\n{{\"firstname\": \"hacked\"}}\r\n\
         --b\r\nContent-Type: application/http\r\n\r\nDELETE /contacts/{private} HTTP/1.1\r\nAccept: application/json\r\n\r\n\r\n--b--\r\n"
    );
    let r = bob_c.call(Req::new("POST", "/batch").body("multipart/mixed; boundary=b", batch));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body.matches("HTTP/1.1 404").count(), 3, "{}", r.body);
    assert!(!r.body.contains("Secretname"), "{}", r.body);
    let v = ann_c.get_json(&format!("/contacts/{private}")).json();
    assert_eq!(v["item"]["fields"]["firstname"], "Secretname", "{v}");

    // Hooks: another user's hook is not there for Bob, and Bob's hook hears nothing of Ann's
    // private records.
    let rx = Receiver::start();
    let hook = |c: &Client, url: &str| -> i64 {
        let r = c.post_json(
            "/hooks",
            &format!(r#"{{"event": "items.update", "constrainttype": "all", "contenttype": "json", "url": "{url}", "secret": "k"}}"#),
        );
        assert_eq!(r.status, 201, "{}", r.body);
        r.json()["id"].as_i64().unwrap()
    };
    let anns_hook = hook(&ann_c, &rx.url("/ann"));
    hook(&bob_c, &rx.url("/bob"));
    bob_c.get(&format!("/hooks/{anns_hook}")).assert_status(404);
    bob_c.put_json(&format!("/hooks/{anns_hook}"), r#"{"url": "http://127.0.0.1:9/stolen"}"#).assert_status(404);
    bob_c.delete(&format!("/hooks/{anns_hook}")).assert_status(404);
    bob_c.get(&format!("/hooks/{anns_hook}/deliveries")).assert_status(404);
    assert!(!bob_c.get_json("/hooks").body.contains("/ann"));
    ann_c.put_json(&format!("/contacts/{private}"), r#"{"jobtitle": "Secret job"}"#).assert_status(200);
    bob_c.put_json(&format!("/contacts/{bobs}"), r#"{"jobtitle": "Public job"}"#).assert_status(200);
    // Deliveries of one hook go out in order: Bob's own change arrives after anything before it.
    wait_for("Bob's own update at his hook", || rx.accepted().iter().any(|r| r.path == "/bob").then_some(()));
    wait_for("Ann's update at her hook", || rx.accepted().iter().any(|r| r.path == "/ann").then_some(()));
    for r in rx.accepted().iter().filter(|r| r.path == "/bob") {
        assert_eq!(r.json()["objectid"], bobs, "{}", r.text());
        assert!(!r.text().contains("Secret"), "{}", r.text());
    }

    // Location: a badge assigned to Ann's private contact is an anonymous badge to Bob.
    let r = admin.post_json(
        "/devices",
        &format!(r#"{{"deviceaddress": "5/1/22", "label": "Badge 22", "beacon": "mac:aa:bb:cc:dd:ee:22", "contactid": {private}}}"#),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    for path in
        ["/report/lastseen", "/report/battery", &format!("/locate?searchvalue={private}"), "/locate?searchvalue=Secret"]
    {
        let mine = ann_c.get_json(path);
        let theirs = bob_c.get_json(path);
        assert_eq!(theirs.status, 200, "{path}: {}", theirs.body);
        assert!(!theirs.body.contains("Secretname"), "{path}: {}", theirs.body);
        assert!(!theirs.body.contains(&format!("\"contactid\":{private}")), "{path}: {}", theirs.body);
        if path.starts_with("/report/") {
            assert!(theirs.body.contains("Badge 22"), "{path}: the badge itself is listed: {}", theirs.body);
            assert!(mine.body.contains("Secretname"), "{path} (the owner sees the name): {}", mine.body);
        }
    }
    bob_c.get_json(&format!("/contacts/{private}/locations")).assert_status(403);
}
