//! Activities under records: create in each encoding, the hierarchy, order, update, delete.

use expect_test::expect_file;

use crate::support::{Req, Service, Transcript};

#[test]
fn activities_golden() {
    let s = Service::start("activities_golden");
    let c = s.admin_client();
    let mut t = Transcript::new();
    t.step(&c, Req::new("POST", "/contacts").json_body(r#"{"firstname": "Ann", "lastname": "Lee"}"#));
    t.step(
        &c,
        Req::new("POST", "/contacts/note/").xml_body(
            "<request><parent>1</parent><data><details>Met at the lobby.\nWants a quote.</details></data></request>",
        ),
    );
    t.step(
        &c,
        Req::new("POST", "/contacts/tasklist").json_body(r#"{"parent": 1, "data": {"title": "Install"}}"#).json(),
    );
    t.step(
        &c,
        Req::new("POST", "/contacts/task").form_body(
            "parent=3&data[title]=Mount+readers&data[duedate]=2026-12-01&data[priority]=2&data[assignedto]=1",
        ),
    );
    t.step(
        &c,
        Req::new("POST", "/contacts/task").json_body(r#"{"parent": 3, "before": 4, "data": {"title": "Survey"}}"#),
    );
    t.step(&c, Req::new("POST", "/contacts/comment").json_body(r#"{"parent": 4, "data": {"post": "Parts ordered"}}"#));
    t.step(&c, Req::new("GET", "/contacts/1"));
    t.step(&c, Req::new("GET", "/contacts/1").json());
    // Wrong parents, unknown fields, bad values, a completed new task.
    t.step(&c, Req::new("POST", "/contacts/task").json_body(r#"{"parent": 1, "data": {"title": "x"}}"#));
    t.step(&c, Req::new("POST", "/contacts/photo").json_body(r#"{"parent": 3, "data": {"caption": "x"}}"#));
    t.step(&c, Req::new("POST", "/contacts/note").json_body(r#"{"parent": 1, "data": {"colour": "red"}}"#));
    t.step(&c, Req::new("POST", "/contacts/task").json_body(r#"{"parent": 3, "data": {"priority": 7}}"#));
    t.step(&c, Req::new("POST", "/contacts/task").json_body(r#"{"parent": 3, "data": {"completed": 1}}"#));
    t.step(&c, Req::new("POST", "/contacts/note").json_body(r#"{"data": {"details": "orphan"}}"#));
    t.step(&c, Req::new("POST", "/contacts/note").json_body(r#"{"parent": 999, "data": {"details": "x"}}"#));
    // Update: complete the task, move the note under another record, delete the task list.
    t.step(&c, Req::new("PUT", "/contacts/task/4").json_body(r#"{"data": {"completed": 1}}"#));
    t.step(&c, Req::new("POST", "/companies").json_body(r#"{"name": "Initech"}"#));
    t.step(&c, Req::new("PUT", "/contacts/note/2").json_body(r#"{"parent": 7}"#));
    t.step(&c, Req::new("DELETE", "/contacts/tasklist/3/"));
    t.step(&c, Req::new("GET", "/contacts/1"));
    t.step(&c, Req::new("GET", "/companies/7").json());
    expect_file!["golden/activities.txt"].assert_eq(&t.text);
}

/// Every activity type, created where the hierarchy allows it, then shown in XML and JSON.
#[test]
fn every_activity_type_golden() {
    let s = Service::start("every_activity_type_golden");
    let c = s.admin_client();
    let mut t = Transcript::new();
    let contact = c.create("contacts", r#"{"firstname": "Ann", "lastname": "Lee"}"#);
    assert_eq!(contact, 1);
    let mut step = |segment: &str, body: &str| -> i64 {
        let r = t.step(&c, Req::new("POST", &format!("/contacts/{segment}/")).json_body(body));
        assert_eq!(r.status, 201, "{segment}: {}", r.body);
        r.xml_text("id").unwrap().parse().unwrap()
    };
    let deal = step(
        "opportunity",
        r#"{"parent": 1, "data": {"description": "Access control", "valueunit": "1250.50", "valuecurrency": "eur",
            "valueinterval": "Per Month", "valueduration": 12, "stage": 40, "probability": 60,
            "closingdate": "2026-12-15", "responsible": 1, "status": "pending"}}"#,
    );
    step("comment", &format!(r#"{{"parent": {deal}, "data": {{"post": "Sent the offer"}}}}"#));
    step(
        "followup",
        r#"{"parent": 1, "data": {"details": "Call back", "assignedto": 1, "nodate": 0, "duedate": "2026-12-01", "sendnotification": 1, "remindtime": 30}}"#,
    );
    step("onlinedoc", r#"{"parent": 1, "data": {"title": "Floor plan", "url": "https://example.com/plan"}}"#);
    let call = step(
        "call",
        r#"{"parent": 1, "data": {"details": "Site visit", "dateoccured": "2026-11-20 09:30:00", "duration": 45}}"#,
    );
    step(
        "timerecord",
        &format!(
            r#"{{"parent": {call}, "data": {{"date": "2026-11-20", "person": 1, "hours": 1.5, "billable": 1, "details": "Visit"}}}}"#
        ),
    );
    step(
        "linkedemails",
        r#"{"parent": 1, "data": {"fields": "businessemail", "keywords": "quote, offer", "exceptions": "newsletter"}}"#,
    );
    let note = step("note", r#"{"parent": 1, "data": {"details": "Prefers mornings"}}"#);
    let comment = step("comment", &format!(r#"{{"parent": {note}, "data": {{"post": "Noted"}}}}"#));
    step("attachment", &format!(r#"{{"parent": {comment}, "data": {{"file": "minutes.txt"}}}}"#));
    step("attachment", r#"{"parent": 1, "data": {"file": "contract.pdf"}}"#);
    let album = step("photolist", r#"{"parent": 1, "data": {"title": "Lobby"}}"#);
    step("photo", &format!(r#"{{"parent": {album}, "data": {{"caption": "Door 3", "file": "door3.jpg"}}}}"#));
    let list = step(
        "tasklist",
        r#"{"parent": 1, "data": {"title": "Install", "description": "Phase 1", "nodate": 0, "milestonedate": "2026-12-20"}}"#,
    );
    let task = step(
        "task",
        &format!(
            r#"{{"parent": {list}, "data": {{"title": "Mount readers", "details": "Doors 1-4", "assignedto": 1,
                "duedate": "2026-12-10", "priority": 3, "billed": 0, "ignoreweekends": 1, "timespent": 2,
                "timespentmeasure": "hours", "timeremains": 1, "timeremainsmeasure": "days", "invoiced": "",
                "notifyoncomplete": "ops@example.com,lead@example.com"}}}}"#
        ),
    );
    step("file", &format!(r#"{{"parent": {task}, "data": {{"caption": "Wiring", "file": "wiring.png"}}}}"#));
    step(
        "onlinedoc",
        &format!(r#"{{"parent": {task}, "data": {{"title": "Manual", "url": "https://example.com/m"}}}}"#),
    );
    step(
        "timerecord",
        &format!(r#"{{"parent": {task}, "data": {{"date": "2026-11-21", "hours": 3, "billable": 0}}}}"#),
    );
    step("website", r#"{"parent": 1, "data": {"caption": "Home", "url": "https://example.com"}}"#);
    step("accountingwidget", r#"{"parent": 1, "data": {"contactid": 4711}}"#);
    step("helpdeskwidget", r#"{"parent": 1, "data": {"userid": 815}}"#);
    step("file", r#"{"parent": 1, "data": {"caption": "Quote"}}"#);
    t.step(&c, Req::new("GET", "/contacts/1"));
    t.step(&c, Req::new("GET", "/contacts/1").json());
    // The same chains under a company and a ticket.
    let company = c.create("companies", r#"{"name": "Initech"}"#);
    let list = c.create_activity("tasklist", &format!(r#"{{"parent": {company}, "data": {{"title": "Audit"}}}}"#));
    t.step(
        &c,
        Req::new("POST", "/companies/task")
            .json_body(&format!(r#"{{"parent": {list}, "data": {{"title": "Check"}}}}"#)),
    );
    let ticket = c.create("tickets", r#"{"title": "Door 3 sticks"}"#);
    t.step(
        &c,
        Req::new("POST", "/tickets/note")
            .json_body(&format!(r#"{{"parent": {ticket}, "data": {{"details": "Seen"}}}}"#)),
    );
    t.step(&c, Req::new("GET", &format!("/companies/{company}")).json());
    expect_file!["golden/activity_types.txt"].assert_eq(&t.text);
}

struct Bad {
    what: &'static str,
    method: &'static str,
    path: String,
    body: String,
    status: u16,
    element: &'static str,
    message: &'static str,
}

/// Invalid activities: each refused with its error, and nothing changes.
#[test]
fn invalid_activities_are_refused() {
    let s = Service::start("invalid_activities_are_refused");
    let c = s.admin_client();
    let contact = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let note = c.create_activity("note", &format!(r#"{{"parent": {contact}, "data": {{"details": "n"}}}}"#));
    let list = c.create_activity("tasklist", &format!(r#"{{"parent": {contact}, "data": {{"title": "l"}}}}"#));
    let task = c.create_activity("task", &format!(r#"{{"parent": {list}, "data": {{"title": "t"}}}}"#));
    let child = c.create_activity("comment", &format!(r#"{{"parent": {task}, "data": {{"post": "c"}}}}"#));
    c.create_activity("linkedemails", &format!(r#"{{"parent": {contact}, "data": {{"keywords": "k"}}}}"#));
    let before = c.get_json(&format!("/contacts/{contact}")).json();

    let post = |what, segment: &str, body: String, status, element, message| Bad {
        what,
        method: "POST",
        path: format!("/contacts/{segment}"),
        body,
        status,
        element,
        message,
    };
    let with = |parent: i64, data: &str| format!(r#"{{"parent": {parent}, "data": {data}}}"#);
    let cases = vec![
        post(
            "task under a record",
            "task",
            with(contact, r#"{"title": "x"}"#),
            400,
            "invalidparent",
            "under a tasklist only",
        ),
        post(
            "photo under a task list",
            "photo",
            with(list, r#"{"caption": "x"}"#),
            400,
            "invalidparent",
            "under a photolist only",
        ),
        post(
            "time record under a note",
            "timerecord",
            with(note, r#"{"hours": 1}"#),
            400,
            "invalidparent",
            "under a call or a task only",
        ),
        post(
            "comment under a record",
            "comment",
            with(contact, r#"{"post": "x"}"#),
            400,
            "invalidparent",
            "a comment can be placed under",
        ),
        post("note under a note", "note", with(note, r#"{"details": "x"}"#), 400, "invalidparent", "under a record"),
        post(
            "tasklist under a task",
            "tasklist",
            with(task, r#"{"title": "x"}"#),
            400,
            "invalidparent",
            "under a record",
        ),
        post(
            "second linked emails",
            "linkedemails",
            with(contact, r#"{"keywords": "x"}"#),
            409,
            "alreadyexists",
            "one per parent",
        ),
        post(
            "unknown currency",
            "opportunity",
            with(contact, r#"{"valuecurrency": "XYZ"}"#),
            400,
            "invalidvalue",
            "valuecurrency: must be one of",
        ),
        post(
            "unknown interval",
            "opportunity",
            with(contact, r#"{"valueinterval": "per decade"}"#),
            400,
            "invalidvalue",
            "valueinterval",
        ),
        post(
            "unknown deal status",
            "opportunity",
            with(contact, r#"{"status": "Maybe"}"#),
            400,
            "invalidvalue",
            "Discussion, Pending, Won, Lost, On-hold",
        ),
        post(
            "stage 101",
            "opportunity",
            with(contact, r#"{"stage": 101}"#),
            400,
            "invalidvalue",
            "stage: must be from 0 to 100",
        ),
        post(
            "probability -1",
            "opportunity",
            with(contact, r#"{"probability": -1}"#),
            400,
            "invalidvalue",
            "probability: must be from 0 to 100",
        ),
        post(
            "value not a number",
            "opportunity",
            with(contact, r#"{"valueunit": "lots"}"#),
            400,
            "invalidvalue",
            "valueunit: must be a number",
        ),
        post(
            "responsible unknown",
            "opportunity",
            with(contact, r#"{"responsible": 999}"#),
            400,
            "invalidreference",
            "responsible 999",
        ),
        post(
            "priority 7",
            "task",
            with(list, r#"{"priority": 7}"#),
            400,
            "invalidvalue",
            "priority: must be from 0 to 6",
        ),
        post(
            "bad due date",
            "task",
            with(list, r#"{"duedate": "next week"}"#),
            400,
            "invalidvalue",
            "duedate: must be a date",
        ),
        post(
            "bad measure",
            "task",
            with(list, r#"{"timespentmeasure": "months"}"#),
            400,
            "invalidvalue",
            "days, hours, weeks",
        ),
        post(
            "bad notify list",
            "task",
            with(list, r#"{"notifyoncomplete": "ops, not an address"}"#),
            400,
            "invalidvalue",
            "e-mail addresses",
        ),
        post(
            "task created completed",
            "task",
            with(list, r#"{"title": "x", "completed": 1}"#),
            400,
            "invalidvalue",
            "a new task cannot be created completed",
        ),
        post(
            "follow-up created completed",
            "followup",
            with(contact, r#"{"completed": "1"}"#),
            400,
            "invalidvalue",
            "a new followup cannot be created completed",
        ),
        post("flag 2", "followup", with(contact, r#"{"nodate": 2}"#), 400, "invalidvalue", "nodate: must be 0 or 1"),
        post(
            "negative reminder",
            "followup",
            with(contact, r#"{"remindtime": -5}"#),
            400,
            "invalidvalue",
            "must not be negative",
        ),
        post(
            "bad date and time",
            "call",
            with(contact, r#"{"dateoccured": "yesterday"}"#),
            400,
            "invalidvalue",
            "dateoccured: must be a date and time",
        ),
        post("attachment without a file", "attachment", with(contact, "{}"), 400, "invalidvalue", "file: is required"),
        post("unknown field", "note", with(contact, r#"{"colour": "red"}"#), 400, "incorrectfield", "colour"),
        post("field of another type", "note", with(contact, r#"{"title": "x"}"#), 400, "incorrectfield", "title"),
        post(
            "unknown top-level key",
            "note",
            format!(r#"{{"parent": {contact}, "position": 3}}"#),
            400,
            "incorrectfield",
            "position",
        ),
        post("no parent", "note", r#"{"data": {"details": "x"}}"#.into(), 400, "invalidvalue", "parent: is required"),
        post("missing parent", "note", with(999, r#"{"details": "x"}"#), 404, "itemisnotfound", "Item is not found"),
        post(
            "before a non-sibling",
            "comment",
            format!(r#"{{"parent": {note}, "before": {task}, "data": {{"post": "x"}}}}"#),
            400,
            "invalidreference",
            "not under the same parent",
        ),
        post("unknown activity type", "meeting", with(contact, "{}"), 404, "resourcenotfound", "No such resource"),
        Bad {
            what: "wrong type in the path",
            method: "PUT",
            path: format!("/contacts/note/{task}"),
            body: r#"{"data": {"details": "x"}}"#.into(),
            status: 404,
            element: "itemisnotfound",
            message: "Item is not found",
        },
        Bad {
            what: "move under its own child",
            method: "PUT",
            path: format!("/contacts/task/{task}"),
            body: format!(r#"{{"parent": {child}}}"#),
            status: 400,
            element: "invalidparent",
            message: "under a tasklist only",
        },
        Bad {
            what: "move a task to a record",
            method: "PUT",
            path: format!("/contacts/task/{task}"),
            body: format!(r#"{{"parent": {contact}}}"#),
            status: 400,
            element: "invalidparent",
            message: "under a tasklist only",
        },
        Bad {
            what: "move a list under itself",
            method: "PUT",
            path: format!("/contacts/tasklist/{list}"),
            body: format!(r#"{{"parent": {task}}}"#),
            status: 400,
            element: "invalidparent",
            message: "under a record",
        },
        Bad {
            what: "update with a bad value",
            method: "PUT",
            path: format!("/contacts/task/{task}"),
            body: r#"{"data": {"priority": "high"}}"#.into(),
            status: 400,
            element: "invalidvalue",
            message: "priority: must be an integer",
        },
        Bad {
            what: "delete a missing one",
            method: "DELETE",
            path: "/contacts/note/999".into(),
            body: String::new(),
            status: 404,
            element: "itemisnotfound",
            message: "Item is not found",
        },
        Bad {
            what: "GET an activity path",
            method: "GET",
            path: "/contacts/note".into(),
            body: String::new(),
            status: 405,
            element: "methodnotallowed",
            message: "POST",
        },
    ];
    for k in &cases {
        let mut req = Req::new(k.method, &k.path).json();
        if !k.body.is_empty() {
            req = req.json_body(&k.body);
        }
        let r = c.call(req);
        assert_eq!(r.status, k.status, "{}: {}", k.what, r.body);
        let msg = r.json()["errors"][k.element].as_str().map(str::to_string);
        let msg = msg.unwrap_or_else(|| panic!("{}: no {} in {}", k.what, k.element, r.body));
        if k.element == "incorrectfield" {
            // The deployed service's words; the field is named in a header.
            assert_eq!(msg, "Incorrect field specified", "{}", k.what);
            assert_eq!(r.header("X-Sitegate-Field"), Some(k.message), "{}", k.what);
        } else {
            assert!(msg.contains(k.message), "{}: {msg:?} lacks {:?}", k.what, k.message);
        }
    }
    // The deployed service's words exactly (clients may compare them); the field is named in
    // a header of its own.
    let r = c.call(Req::new("POST", "/contacts/note").json_body(&with(contact, r#"{"colour": "red"}"#)).json());
    assert_eq!(r.json()["errors"]["incorrectfield"], "Incorrect field specified", "{}", r.body);
    assert_eq!(r.header("X-Sitegate-Field"), Some("colour"));
    let after = c.get_json(&format!("/contacts/{contact}")).json();
    assert_eq!(before["activities"], after["activities"], "a refused request changed something");
}

#[test]
fn order_and_moves_keep_the_tree() {
    let s = Service::start("order_and_moves_keep_the_tree");
    let c = s.admin_client();
    let a = c.create("contacts", r#"{"firstname": "A"}"#);
    let b = c.create("contacts", r#"{"firstname": "B"}"#);
    let n1 = c.create_activity("note", &format!(r#"{{"parent": {a}, "data": {{"details": "one"}}}}"#));
    let n3 = c.create_activity("note", &format!(r#"{{"parent": {a}, "data": {{"details": "three"}}}}"#));
    let n2 = c.create_activity("note", &format!(r#"{{"parent": {a}, "after": {n1}, "data": {{"details": "two"}}}}"#));
    let n0 = c.create_activity("note", &format!(r#"{{"parent": {a}, "before": {n1}, "data": {{"details": "zero"}}}}"#));
    let list = c.create_activity("tasklist", &format!(r#"{{"parent": {a}, "data": {{"title": "L"}}}}"#));
    let task = c.create_activity("task", &format!(r#"{{"parent": {list}, "data": {{"title": "T"}}}}"#));
    let comment = c.create_activity("comment", &format!(r#"{{"parent": {task}, "data": {{"post": "C"}}}}"#));
    let order = |record: i64| -> Vec<(i64, i64, i64)> {
        let v = c.get_json(&format!("/contacts/{record}")).json();
        v["activities"]
            .as_object()
            .unwrap()
            .values()
            .map(|x| (x["id"].as_i64().unwrap(), x["level"].as_i64().unwrap(), x["position"].as_i64().unwrap()))
            .collect()
    };
    assert_eq!(
        order(a),
        vec![(n0, 1, 1), (n1, 1, 2), (n2, 1, 3), (n3, 1, 4), (list, 1, 5), (task, 2, 1), (comment, 3, 1)]
    );
    // Reorder: three first.
    c.put_json(&format!("/contacts/note/{n3}"), &format!(r#"{{"before": {n0}}}"#)).assert_status(200);
    let ids: Vec<i64> = order(a).iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![n3, n0, n1, n2, list, task, comment]);
    // Move the task list with its subtree to the other record: levels stay, the first record loses them.
    c.put_json(&format!("/contacts/tasklist/{list}"), &format!(r#"{{"parent": {b}}}"#)).assert_status(200);
    assert_eq!(order(b), vec![(list, 1, 1), (task, 2, 1), (comment, 3, 1)]);
    assert_eq!(order(a).len(), 4);
    // Move a comment one level up (under the task list): its level follows.
    c.put_json(&format!("/contacts/comment/{comment}"), &format!(r#"{{"parent": {list}}}"#)).assert_status(200);
    assert_eq!(order(b), vec![(list, 1, 1), (task, 2, 1), (comment, 2, 2)]);
    // Deleting the list archives its subtree; the record stays.
    c.delete(&format!("/contacts/tasklist/{list}")).assert_status(200);
    assert!(order(b).is_empty());
    c.put_json(&format!("/contacts/task/{task}"), r#"{"data": {"title": "x"}}"#).assert_status(404);
    // A deleted note restored comes back at its place; the note made there meanwhile moves on,
    // and no two share a position (a note placed after one of them went after both).
    c.delete(&format!("/contacts/note/{n2}")).assert_status(200);
    let n4 = c.create_activity("note", &format!(r#"{{"parent": {a}, "after": {n1}, "data": {{"details": "four"}}}}"#));
    c.post_json(&format!("/contacts/note/{n2}/restore"), "{}").assert_status(200);
    let n5 = c.create_activity("note", &format!(r#"{{"parent": {a}, "after": {n2}, "data": {{"details": "five"}}}}"#));
    let now = order(a);
    let ids: Vec<i64> = now.iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![n3, n0, n1, n2, n5, n4], "{now:?}");
    let positions: Vec<i64> = now.iter().map(|x| x.2).collect();
    assert_eq!(positions, vec![1, 2, 3, 4, 5, 6], "{now:?}");
}

/// A record holds one linked-emails activity however a second would get there: made there,
/// moved there from another record, or restored after another was made in its place. Each
/// refusal is 409 `alreadyexists` and changes nothing.
#[test]
fn one_linked_emails_per_record_made_moved_or_restored() {
    let s = Service::start("one_linked_emails_per_record_made_moved_or_restored");
    let c = s.admin_client();
    let ann = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let bob = c.create("contacts", r#"{"firstname": "Bob"}"#);
    let linked = |parent: i64| {
        c.create_activity("linkedemails", &format!(r#"{{"parent": {parent}, "data": {{"keywords": "k"}}}}"#))
    };
    let ids_under = |record: i64| -> Vec<i64> {
        let v = c.get_json(&format!("/contacts/{record}")).json();
        v["activities"].as_object().unwrap().values().map(|x| x["id"].as_i64().unwrap()).collect()
    };
    let refused = |r: &crate::support::Resp| {
        assert_eq!(r.status, 409, "{}", r.body);
        assert!(r.body.contains("alreadyexists") && r.body.contains("one per parent"), "{}", r.body);
    };
    let of_ann = linked(ann);
    let of_bob = linked(bob);

    refused(&c.put_json(&format!("/contacts/linkedemails/{of_bob}"), &format!(r#"{{"parent": {ann}}}"#)));
    assert_eq!((ids_under(ann), ids_under(bob)), (vec![of_ann], vec![of_bob]));

    c.delete(&format!("/contacts/linkedemails/{of_ann}")).assert_status(200);
    let again = linked(ann);
    refused(&c.call(Req::new("POST", &format!("/contacts/linkedemails/{of_ann}/restore")).json()));
    assert_eq!(ids_under(ann), vec![again]);

    // With the newer one gone, the older comes back; moving one to a record without one works.
    c.delete(&format!("/contacts/linkedemails/{again}")).assert_status(200);
    c.call(Req::new("POST", &format!("/contacts/linkedemails/{of_ann}/restore")).json()).assert_status(200);
    let carol = c.create("contacts", r#"{"firstname": "Carol"}"#);
    c.put_json(&format!("/contacts/linkedemails/{of_bob}"), &format!(r#"{{"parent": {carol}}}"#)).assert_status(200);
    assert_eq!((ids_under(ann), ids_under(bob), ids_under(carol)), (vec![of_ann], vec![], vec![of_bob]));
}
