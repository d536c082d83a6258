//! Records: every endpoint in XML, JSON and form encoding, against golden transcripts.
//! Goldens are written by `UPDATE_EXPECT=1 cargo test`; ids are stable because every test
//! starts from an empty database.

use expect_test::expect_file;

use crate::support::{Client, Req, Service, Transcript, q};

#[test]
fn contacts_in_xml() {
    let s = Service::start("contacts_in_xml");
    let c = s.admin_client();
    let mut t = Transcript::new();
    t.step(&c, Req::new("POST", "/contacts/categories/").xml_body("<request><name>VIP</name></request>"));
    t.step(&c, Req::new("POST", "/contacts/categories").xml_body("<request><name>Supplier</name></request>"));
    t.step(&c, Req::new("GET", "/contacts/categories/"));
    t.step(&c, Req::new("POST", "/companies").xml_body("<request><name>Workplate Ltd</name></request>"));
    t.step(
        &c,
        Req::new("POST", "/contacts").xml_body(
            "<request><firstname>Aaron</firstname><lastname>Baileys</lastname>\
             <businessemail>aaron@workplate.com</businessemail><cellularphone>(382) 853-8544</cellularphone>\
             <custom1001>C-7731</custom1001><custom1002>gold</custom1002>\
             <categories><add><category>1</category></add></categories>\
             <relateditems><add><relatedto><id>1</id><note>employer</note></relatedto></add></relateditems>\
             </request>",
        ),
    );
    t.step(&c, Req::new("GET", "/contacts/2/"));
    t.step(
        &c,
        Req::new("PUT", "/contacts/2/").xml_body(
            "<request><jobtitle>Facilities manager</jobtitle><cellularphone></cellularphone>\
             <categories><add><category>2</category></add><remove><category>1</category></remove></categories></request>",
        ),
    );
    t.step(&c, Req::new("GET", "/contacts/2"));
    t.step(&c, Req::new("GET", "/contacts"));
    t.step(&c, Req::new("GET", "/contacts/?layout=1&fieldlist=firstname,jobtitle&categories=1"));
    t.step(&c, Req::new("DELETE", "/contacts/2/"));
    t.step(&c, Req::new("GET", "/contacts/2/"));
    t.step(&c, Req::new("GET", "/contacts?filtermode=archived"));
    expect_file!["golden/contacts_xml.txt"].assert_eq(&t.text);
}

#[test]
fn contacts_in_json() {
    let s = Service::start("contacts_in_json");
    let c = s.admin_client();
    let mut t = Transcript::new();
    let json = |r: Req| r.header("Accept", "application/json");
    t.step(&c, json(Req::new("POST", "/contacts/categories").json_body(r#"{"name": "VIP"}"#)));
    t.step(&c, json(Req::new("POST", "/companies/").json_body(r#"{"name": "Workplate Ltd", "custom1004": 40}"#)));
    t.step(
        &c,
        json(Req::new("POST", "/contacts").json_body(
            r#"{"firstname": "Aaron", "lastname": "Baileys", "businessemail": "aaron@workplate.com",
                "categories": {"add": [1]},
                "relateditems": {"add": {"relatedto": [{"id": "1", "note": "employer"}]}}}"#,
        )),
    );
    t.step(&c, json(Req::new("GET", "/contacts/2")));
    t.step(
        &c,
        json(
            Req::new("PUT", "/contacts/2")
                .json_body(r#"{"jobtitle": "Facilities manager", "flagged": 1, "relateditems": {"remove": [1]}}"#),
        ),
    );
    t.step(&c, json(Req::new("GET", "/contacts/2/")));
    t.step(&c, json(Req::new("GET", "/contacts?layout=1&categories=1")));
    t.step(&c, json(Req::new("GET", "/companies")));
    t.step(&c, json(Req::new("GET", "/contacts/categories/")));
    t.step(&c, json(Req::new("DELETE", "/contacts/2")));
    t.step(&c, json(Req::new("GET", "/contacts/2")));
    expect_file!["golden/contacts_json.txt"].assert_eq(&t.text);
}

#[test]
fn contacts_in_form_encoding() {
    let s = Service::start("contacts_in_form_encoding");
    let c = s.admin_client();
    let mut t = Transcript::new();
    t.step(&c, Req::new("POST", "/contacts/categories/").form_body("name=Key+account"));
    t.step(&c, Req::new("POST", "/companies").form_body("name=Workplate%20Ltd"));
    t.step(
        &c,
        Req::new("POST", "/contacts/").form_body(
            "firstname=Ann&lastname=Lee&businessemail=ann%40example.com&categories[add][]=1\
             &relateditems[add][relatedto][0][id]=1&relateditems[add][relatedto][0][note]=site+lead",
        ),
    );
    t.step(&c, Req::new("PUT", "/contacts/2").form_body("jobtitle=Engineer&categories[remove][]=1"));
    t.step(&c, Req::new("GET", "/contacts/2"));
    t.step(&c, Req::new("GET", "/contacts").form_body("limit=1&sortfield=created&sortdir=DESC"));
    expect_file!["golden/contacts_form.txt"].assert_eq(&t.text);
}

#[test]
fn every_record_type() {
    let s = Service::start("every_record_type");
    let c = s.admin_client();
    let mut t = Transcript::new();
    t.step(
        &c,
        Req::new("POST", "/companies").json_body(r#"{"name": "Initech", "phone": "555-0100", "custom1001": "C-1"}"#),
    );
    t.step(&c, Req::new("POST", "/projectblogs").json_body(r#"{"title": "Lobby refit", "description": "Phase 1"}"#));
    t.step(
        &c,
        Req::new("POST", "/tickets").json_body(
            r#"{"title": "Door 3 sticks", "status": "Open", "priority": "high", "requesteremail": "ops@initech.com", "duedate": "2026-12-01"}"#,
        ),
    );
    t.step(&c, Req::new("GET", "/companies/1"));
    t.step(&c, Req::new("GET", "/projectblogs/2").json());
    t.step(&c, Req::new("GET", "/tickets/3"));
    t.step(&c, Req::new("GET", "/tickets?layout=1").json());
    t.step(&c, Req::new("GET", "/companies/fields"));
    t.step(&c, Req::new("GET", "/tickets/fields/").json());
    t.step(&c, Req::new("GET", "/contacts/fields").json());
    // A ticket is not a contact: the wrong segment does not find it.
    t.step(&c, Req::new("GET", "/contacts/3"));
    expect_file!["golden/record_types.txt"].assert_eq(&t.text);
}

#[test]
fn ownership_lists_users_and_groups() {
    let s = Service::start("ownership_lists_users_and_groups");
    let group = s.add_group("Site team", &["--email", "site@acme.test"]);
    s.add_user("ann@acme.test", "Ann Lee", &["--group", &group.to_string()]);
    s.add_user("bob@acme.test", "Bob Stone", &["--prevent-private-data"]);
    s.add_user("gus@globex.test", "Gus Other", &["--org", "globex"]);
    let gone = s.add_user("old@acme.test", "Old Timer", &[]);
    assert!(s.cli(&["user", "delete", "--email", &gone.email]).status.success());
    let c = s.admin_client();
    let mut t = Transcript::new();
    t.step(&c, Req::new("GET", "/ownership"));
    t.step(&c, Req::new("GET", "/ownership/?deleted=1").json());
    expect_file!["golden/ownership.txt"].assert_eq(&t.text);
}

#[test]
fn jsonp_and_accept_variants() {
    let s = Service::start("jsonp_and_accept_variants");
    let c = s.admin_client();
    let mut t = Transcript::new();
    c.create("contacts", r#"{"firstname": "Ann"}"#);
    t.step(&c, Req::new("GET", "/contacts/1?callback=show_it"));
    t.step(&c, Req::new("GET", "/contacts/1?callback=bad%3Calert%3E(1)"));
    t.step(&c, Req::new("GET", "/contacts/99?callback=cb"));
    t.step(&c, Req::new("GET", "/contacts/1?callback=2nd$cb"));
    t.step(&c, Req::new("GET", "/contacts/99?callback=angular.callbacks._0"));
    t.step(&c, Req::new("GET", "/contacts/99?callback=.jQuery..1cb%5B0%5D."));
    t.step(&c, Req::new("GET", "/contacts?limit=1").header("Accepts", "application/json"));
    t.step(&c, Req::new("GET", "/contacts?limit=1").header("Accept", "text/html, application/json;q=0.9"));
    t.step(&c, Req::new("GET", "/contacts?limit=1").header("Accept", "*/*"));
    expect_file!["golden/jsonp_accept.txt"].assert_eq(&t.text);
}

/// A tag name already used is refused whatever its case, in every script: `école` is
/// `ÉCOLE` (only ASCII letters were compared without case).
#[test]
fn tag_names_are_unique_ignoring_case_in_all_of_unicode() {
    let s = Service::start("tag_names_unique_ignoring_case");
    let c = s.admin_client();
    c.post_json("/contacts/categories", r#"{"name": "ÉCOLE"}"#).assert_status(201);
    for name in ["école", "École", "ÉCOLE"] {
        let r = c.post_json("/contacts/categories", &format!(r#"{{"name": "{name}"}}"#));
        assert_eq!(r.status, 409, "{name}: {}", r.body);
    }
    c.post_json("/contacts/categories", r#"{"name": "Ecole"}"#).assert_status(201);
    c.post_json("/companies/categories", r#"{"name": "école"}"#).assert_status(201);
}

/// A create answers with the record it made, as it made it: other clients deleting or
/// changing the next records the moment they exist neither turn its 201 into a 404 (its
/// client would create it again) nor put their change into it.
#[test]
fn a_create_answers_with_its_own_record_while_others_change_it() {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::{Duration, Instant};
    // Many calls in a few seconds: the hourly quota raised; each client's loop bounded too.
    let config = format!(
        "{}\n[api]\nquota_calls_per_hour = 100000000\n",
        crate::support::BASE_CONFIG.replace("workers = 2", "workers = 8")
    );
    let s = Service::start_with(
        "a_create_answers_with_its_own_record_while_others_change_it",
        crate::support::Options { config: &config, env: vec![] },
    );
    let c = s.admin_client();
    let newest = AtomicI64::new(c.create("contacts", r#"{"firstname": "Seed"}"#));
    let deadline = Instant::now() + Duration::from_secs(4);
    const CALLS_MAX: usize = 5_000;
    let answers = std::sync::Mutex::new((0, Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                for _ in 0..CALLS_MAX {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let r = c.post_json("/contacts", r#"{"firstname": "Mine"}"#);
                    let mut answers = answers.lock().unwrap();
                    if r.status == 201 && r.json()["item"]["fields"]["firstname"] == "Mine" {
                        answers.0 += 1;
                        newest.fetch_max(r.json()["item"]["id"].as_i64().unwrap(), Ordering::SeqCst);
                    } else {
                        answers.1.push(format!("{} {}", r.status, r.body));
                    }
                }
            });
        }
        for other in 0..3 {
            let (c, newest) = (&c, &newest);
            scope.spawn(move || {
                for _ in 0..CALLS_MAX {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let next = newest.load(Ordering::SeqCst) + 1 + other % 2;
                    if other == 0 {
                        c.delete(&format!("/contacts/{next}"));
                    } else {
                        c.put_json(&format!("/contacts/{next}"), r#"{"firstname": "Theirs"}"#);
                    }
                }
            });
        }
    });
    let (created, wrong) = answers.into_inner().unwrap();
    assert!(created > 0);
    assert!(
        wrong.is_empty(),
        "{} of {} creates answered otherwise: {:?}",
        wrong.len(),
        created + wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
}

/// A deleted record is erased for good with its activities, tags, links and indexed values
/// (personal data); a record not deleted is refused, and nothing of another record goes.
#[test]
fn a_deleted_record_is_erased_for_good() {
    let s = crate::support::Service::start("a_deleted_record_is_erased_for_good");
    let c = s.admin_client();
    let company = c.create("companies", r#"{"name": "Initech"}"#);
    let tag = c.post_json("/contacts/categories", r#"{"name": "VIP"}"#).json()["id"].as_i64().unwrap();
    let body = format!(
        r#"{{"firstname": "Ann", "lastname": "Erased", "jobtitle": "Engineer", "categories": {{"add": [{tag}]}},
            "relateditems": {{"add": [{company}]}}}}"#
    );
    let ann = c.create("contacts", &body);
    let bob =
        c.create("contacts", &format!(r#"{{"firstname": "Bob", "relateditems": {{"add": [{ann}, {company}]}}}}"#));
    c.create_activity("note", &format!(r#"{{"parent": {ann}, "data": {{"details": "private"}}}}"#));
    // The job title joins the index of field values.
    assert_eq!(c.list_ids("/contacts?searchmode=Sjobtitle&searchvalue=engin"), vec![ann]);

    let related = |id: i64| -> Vec<i64> {
        let r = c.get_json(&format!("/contacts/{id}")).json();
        let mut ids: Vec<i64> =
            r["relateditems"].as_array().map_or(vec![], |a| a.iter().filter_map(|i| i["id"].as_i64()).collect());
        ids.sort();
        ids
    };
    let mut before = vec![ann, company];
    before.sort();
    assert_eq!(related(bob), before);

    let erase = |id: i64| s.cli(&["erase", "--type", "contacts", "--id", &id.to_string()]);
    let out = erase(ann);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not deleted"), "{out:?}");
    c.call(crate::support::Req::new("DELETE", &format!("/contacts/{ann}")).json()).assert_status(200);
    let out = erase(ann);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("erased contacts {ann}")));

    c.get_json(&format!("/contacts/{ann}")).assert_status(404);
    c.call(crate::support::Req::new("POST", &format!("/contacts/{ann}/restore")).json()).assert_status(404);
    assert_eq!(related(bob), vec![company], "Bob's link to Ann went with her");
    c.get_json(&format!("/companies/{company}")).assert_status(200);
    let db = rusqlite::Connection::open(s.dir.join("data/sitegate.db")).unwrap();
    let left: i64 = db
        .query_row(
            "SELECT (SELECT count(*) FROM items WHERE id = ?1 OR record_id = ?1)
                  + (SELECT count(*) FROM item_categories WHERE item_id = ?1)
                  + (SELECT count(*) FROM relations WHERE item = ?1 OR related = ?1)
                  + (SELECT count(*) FROM field_values WHERE item = ?1)",
            [ann],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
    assert_eq!(erase(ann).status.code(), Some(64), "erased twice");
}

/// What Show writes can be sent back: an empty `flagged` unflags (Show writes "not flagged"
/// so); a client syncing by `updated` with `filtermode=updatedafter` misses no record changed
/// in the same second as the last it saw; a custom field is known by the name Show gives it
/// only (`custom01001` is no field).
#[test]
fn what_show_writes_can_be_sent_back() {
    let s = Service::start("what_show_writes_can_be_sent_back");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Ann", "flagged": 1}"#);
    let flagged = |c: &Client| c.get_json(&format!("/contacts/{id}")).json()["item"]["flagged"].clone();
    assert_eq!(flagged(&c), "1");
    c.put_json(&format!("/contacts/{id}"), r#"{"flagged": ""}"#).assert_status(200);
    assert_eq!(flagged(&c), "");
    c.put_json(&format!("/contacts/{id}"), r#"{"flagged": 1}"#).assert_status(200);
    c.call(Req::new("PUT", &format!("/contacts/{id}")).xml_body("<request><flagged/></request>")).assert_status(200);
    assert_eq!(flagged(&c), "");
    c.put_json(&format!("/contacts/{id}"), r#"{"flagged": "1"}"#).assert_status(200);
    c.put_json(&format!("/contacts/{id}"), r#"{"flagged": null}"#).assert_status(200);
    assert_eq!(flagged(&c), "");
    assert_eq!(c.put_json(&format!("/contacts/{id}"), r#"{"flagged": "yes"}"#).status, 400);

    // Records changed in the second of the last `updated` a client saw are listed again.
    let updated = c.get_json(&format!("/contacts/{id}")).json()["item"]["updated"].as_str().unwrap().to_string();
    let since = |c: &Client, t: &str| c.list_ids(&format!("/contacts?filtermode=updatedafter&filtervalue={}", q(t)));
    assert!(since(&c, &updated).contains(&id), "{updated}");
    let later = c.create("contacts", r#"{"firstname": "Bea"}"#);
    let t = c.get_json(&format!("/contacts/{later}")).json()["item"]["updated"].as_str().unwrap().to_string();
    assert!(since(&c, &t).contains(&later), "at or after {t}");

    // Custom fields by their names only.
    c.put_json(&format!("/contacts/{id}"), r#"{"custom1001": "C-7"}"#).assert_status(200);
    for name in ["custom01001", "custom+1001", "custom", "custom1001x"] {
        let r = c.put_json(&format!("/contacts/{id}"), &format!(r#"{{"{name}": "zero"}}"#));
        assert_eq!(r.status, 400, "{name}: {}", r.body);
        assert!(r.body.contains("incorrectfield"), "{name}: {}", r.body);
        let r = c.get_json(&format!("/contacts?layout=1&fields={}", q(name)));
        assert_eq!(r.status, 400, "{name}: {}", r.body);
    }
    let show = c.get_json(&format!("/contacts/{id}")).json();
    assert_eq!(show["item"]["fields"]["custom1001"], "C-7");

    // The fields as read, audit fields and all, with one change: the change is made, the
    // audit fields are the service's (a made-up creator is ignored).
    let mut fields = show["item"]["fields"].clone();
    fields["jobtitle"] = "Engineer".into();
    fields["creatorid"] = "99".into();
    fields["creatorname"] = "Someone".into();
    c.put_json(&format!("/contacts/{id}"), &fields.to_string()).assert_status(200);
    let after = c.get_json(&format!("/contacts/{id}")).json();
    assert_eq!(after["item"]["fields"]["jobtitle"], "Engineer");
    assert_eq!(after["item"]["fields"]["creatorid"], show["item"]["fields"]["creatorid"]);
    assert_eq!(after["item"]["fields"]["creatorname"], "Administrator");
    let r = c.post_json("/contacts", r#"{"firstname": "Cy", "creatorid": "7", "modificatordate": "1"}"#);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["item"]["fields"]["creatorid"], "1");
}
