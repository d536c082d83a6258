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
