//! Activity reports against hand-built fixtures: the right activities in, the wrong ones out,
//! for every filter; shapes against golden transcripts.

use std::collections::{BTreeMap, BTreeSet};

use expect_test::expect_file;

use crate::support::{BASE_CONFIG, Client, Options, Req, Service, Transcript, libfaketime, q};

/// The ids a JSON report lists (under `list`).
fn ids(c: &Client, list: &str, path: &str) -> BTreeSet<i64> {
    let r = c.get_json(path);
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    let v = r.json();
    let entries = v[list].as_array().unwrap_or_else(|| panic!("{path}: no {list} in {}", r.body));
    assert_eq!(v["count"].as_u64().unwrap() as usize, entries.len(), "{path}: count");
    entries.iter().map(|e| e["id"].as_i64().unwrap()).collect()
}

#[track_caller]
fn check(c: &Client, list: &str, path: &str, expected: &[i64]) {
    assert_eq!(ids(c, list, path), expected.iter().copied().collect::<BTreeSet<_>>(), "{path}");
}

fn day(days: i64) -> String {
    let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    today.checked_add(jiff::Span::new().days(days)).unwrap().to_string()
}

struct Fixture {
    s: Service,
    admin: Client,
    ann: Client,
    // Records
    ada: i64,
    initech: i64,
    // Next actions
    milestone: i64,
    t_today: i64,
    t_soon: i64,
    t_later: i64,
    t_overdue: i64,
    t_done: i64,
    t_undated: i64,
    t_bobs: i64,
    // Follow-ups
    f_soon: i64,
    f_late: i64,
    f_undated: i64,
    f_done: i64,
    // Deals
    o_pending: i64,
    o_won: i64,
    o_discussion: i64,
    // Time records
    tr_call: i64,
    tr_task: i64,
    tr_old: i64,
}

/// Principals: admin 1, group Ops 2, ann 3 (in Ops), bob 4. Dates relative to today (UTC).
fn fixture(name: &str) -> Fixture {
    let s = Service::start(name);
    assert_eq!(s.add_group("Ops", &[]), 2);
    let ann = s.add_user("ann@acme.test", "Ann Lee", &["--group", "2"]);
    let bob = s.add_user("bob@acme.test", "Bob Stone", &[]);
    let admin = s.admin_client();
    let (ann_c, bob_c) = (s.client(&ann), s.client(&bob));
    admin.post_json("/contacts/categories", r#"{"name": "VIP"}"#).assert_status(201);
    let ada = admin.create("contacts", r#"{"firstname": "Ada", "ownership": 2, "categories": {"add": [1]}}"#);
    let initech = admin.create("companies", r#"{"name": "Initech", "ownership": 2}"#);
    let bobs = bob_c.create("contacts", r#"{"firstname": "Bob's own"}"#);
    let act = |c: &Client, seg: &str, parent: i64, data: String| -> i64 {
        c.create_activity(seg, &format!(r#"{{"parent": {parent}, "data": {data}}}"#))
    };
    let milestone = act(&admin, "tasklist", ada, format!(r#"{{"title": "Phase 1", "milestonedate": "{}"}}"#, day(5)));
    let undated_list = act(&admin, "tasklist", ada, r#"{"title": "Backlog"}"#.into());
    let task = |title: &str, due: Option<i64>, who: Option<i64>| {
        let mut data = format!(r#"{{"title": "{title}""#);
        if let Some(d) = due {
            data.push_str(&format!(r#", "duedate": "{}""#, day(d)));
        }
        if let Some(w) = who {
            data.push_str(&format!(r#", "assignedto": {w}"#));
        }
        data.push('}');
        act(&admin, "task", milestone, data)
    };
    let t_today = task("Today", Some(0), Some(3));
    let t_soon = task("Soon", Some(5), Some(2));
    let t_later = task("Later", Some(20), None);
    let t_overdue = task("Overdue", Some(-3), Some(1));
    let t_done = task("Done", Some(0), Some(3));
    admin.put_json(&format!("/contacts/task/{t_done}"), r#"{"data": {"completed": 1}}"#).assert_status(200);
    let t_undated = act(&admin, "task", undated_list, r#"{"title": "Someday", "nodate": 1, "assignedto": 3}"#.into());
    let bobs_list = act(&bob_c, "tasklist", bobs, r#"{"title": "Bob's"}"#.into());
    let t_bobs = act(
        &bob_c,
        "task",
        bobs_list,
        format!(r#"{{"title": "Bob's task", "duedate": "{}", "assignedto": 4}}"#, day(1)),
    );

    let f_soon =
        act(&admin, "followup", ada, format!(r#"{{"details": "Call", "duedate": "{}", "assignedto": 3}}"#, day(2)));
    let f_late = act(&admin, "followup", initech, format!(r#"{{"details": "Mail", "duedate": "{}"}}"#, day(-1)));
    let f_undated = act(&admin, "followup", ada, r#"{"details": "Some time", "nodate": 1}"#.into());
    let f_done = act(&admin, "followup", ada, format!(r#"{{"details": "Done", "duedate": "{}"}}"#, day(0)));
    admin.put_json(&format!("/contacts/followup/{f_done}"), r#"{"data": {"completed": 1}}"#).assert_status(200);

    let o_pending = act(
        &admin,
        "opportunity",
        ada,
        format!(
            r#"{{"description": "Readers", "status": "Pending", "responsible": 3, "closingdate": "{}", "valueunit": 900}}"#,
            day(10)
        ),
    );
    let o_won = act(
        &admin,
        "opportunity",
        initech,
        format!(r#"{{"description": "Audit", "status": "Won", "responsible": 1, "closingdate": "{}"}}"#, day(-5)),
    );
    let o_discussion = act(
        &admin,
        "opportunity",
        ada,
        r#"{"description": "Cameras", "status": "Discussion", "responsible": 2}"#.into(),
    );

    let call = act(&admin, "call", initech, r#"{"details": "Visit"}"#.into());
    let tr_call = act(
        &admin,
        "timerecord",
        call,
        format!(r#"{{"date": "{}", "hours": 1.5, "billable": 1, "person": 3}}"#, day(-2)),
    );
    let tr_task = act(
        &admin,
        "timerecord",
        t_today,
        format!(r#"{{"date": "{}", "hours": 2, "billable": 0, "invoiced": "INV-7"}}"#, day(-1)),
    );
    let tr_old = act(&admin, "timerecord", t_soon, format!(r#"{{"date": "{}", "hours": 1, "billable": 1}}"#, day(-40)));
    let _ = ann_c;
    Fixture {
        admin,
        ann: s.client(&ann),
        s,
        ada,
        initech,
        milestone,
        t_today,
        t_soon,
        t_later,
        t_overdue,
        t_done,
        t_undated,
        t_bobs,
        f_soon,
        f_late,
        f_undated,
        f_done,
        o_pending,
        o_won,
        o_discussion,
        tr_call,
        tr_task,
        tr_old,
    }
}

#[test]
fn report_filters() {
    // Near midnight the date could change under the fixture; build it again then.
    for _attempt in 0..2 {
        let before = day(0);
        let f = fixture("report_filters");
        if day(0) != before {
            continue;
        }
        let c = &f.admin;
        let na = "/report/nextactions";
        // Everything open: tasks (dated or not) and the dated task list (a milestone).
        check(c, "nextactions", na, &[f.milestone, f.t_today, f.t_soon, f.t_later, f.t_overdue, f.t_undated, f.t_bobs]);
        check(c, "nextactions", &format!("{na}?due=now"), &[f.t_today, f.t_overdue]);
        check(c, "nextactions", &format!("{na}?due=next7"), &[f.milestone, f.t_today, f.t_soon, f.t_overdue, f.t_bobs]);
        check(
            c,
            "nextactions",
            &format!("{na}?due=next30"),
            &[f.milestone, f.t_today, f.t_soon, f.t_later, f.t_overdue, f.t_bobs],
        );
        check(c, "nextactions", &format!("{na}?due=nodate"), &[f.t_undated]);
        check(c, "nextactions", &format!("{na}?due={},{}", day(1), day(5)), &[f.milestone, f.t_soon, f.t_bobs]);
        check(c, "nextactions", &format!("{na}?filter=3"), &[f.t_today, f.t_undated]);
        check(c, "nextactions", &format!("{na}?filter=2,1"), &[f.t_soon, f.t_overdue]);
        check(c, "nextactions", &format!("{na}?filter=0"), &[f.milestone, f.t_later]);
        check(
            c,
            "nextactions",
            &format!("{na}?filter="),
            &[f.milestone, f.t_today, f.t_soon, f.t_later, f.t_overdue, f.t_undated, f.t_bobs],
        );
        check(c, "nextactions", &format!("{na}?filter=3&due=now"), &[f.t_today]);
        // Parameters in a body on a GET.
        let r = c.call(Req::new("GET", na).xml_body("<request><filter>3</filter><due>nodate</due></request>").json());
        assert_eq!(r.json()["nextactions"][0]["id"], f.t_undated, "{}", r.body);
        // What Ann may see: records of her group, not Bob's.
        check(&f.ann, "nextactions", &format!("{na}?due=next7"), &[f.milestone, f.t_today, f.t_soon, f.t_overdue]);

        let fu = "/report/followups";
        check(c, "followups", fu, &[f.f_soon, f.f_late, f.f_undated]);
        check(c, "followups", &format!("{fu}?due=now"), &[f.f_late]);
        check(c, "followups", &format!("{fu}?due=next7"), &[f.f_soon, f.f_late]);
        check(c, "followups", &format!("{fu}?due=nodate"), &[f.f_undated]);
        check(c, "followups", &format!("{fu}?responsible=3"), &[f.f_soon]);
        check(c, "followups", &format!("{fu}?responsible=0"), &[f.f_late, f.f_undated]);

        let op = "/report/opportunities";
        check(c, "opportunities", op, &[f.o_pending, f.o_won, f.o_discussion]);
        check(c, "opportunities", &format!("{op}?status=won"), &[f.o_won]);
        check(c, "opportunities", &format!("{op}?status=pending,discussion"), &[f.o_pending, f.o_discussion]);
        check(c, "opportunities", &format!("{op}?filter=3"), &[f.o_pending]);
        check(c, "opportunities", &format!("{op}?filter=2"), &[f.o_discussion]);
        check(c, "opportunities", &format!("{op}?due=next30"), &[f.o_pending, f.o_won]);
        check(c, "opportunities", &format!("{op}?due=nodate"), &[f.o_discussion]);

        let tt = "/report/timetracking";
        check(c, "timerecords", tt, &[f.tr_call, f.tr_task]);
        check(c, "timerecords", &format!("{tt}?start={}&end={}", day(-60), day(0)), &[f.tr_call, f.tr_task, f.tr_old]);
        check(c, "timerecords", &format!("{tt}?filter=billable"), &[f.tr_call]);
        check(c, "timerecords", &format!("{tt}?filter=non-billable"), &[f.tr_task]);
        check(c, "timerecords", &format!("{tt}?filter=invoiced"), &[f.tr_task]);
        check(c, "timerecords", &format!("{tt}?itemtypes=40"), &[f.tr_call]);
        check(c, "timerecords", &format!("{tt}?itemtypes=1,2"), &[f.tr_task]);

        let cal = "/report/calendar";
        check(
            c,
            "calendar",
            &format!("{cal}?start={}&end={}", day(-3), day(0)),
            &[f.t_today, f.t_overdue, f.t_done, f.f_late, f.f_done],
        );
        check(
            c,
            "calendar",
            &format!("{cal}?start={}&end={}", day(1), day(30)),
            &[f.t_soon, f.t_later, f.t_bobs, f.f_soon],
        );
        // One person's calendar (a group stands for itself), no one's.
        check(c, "calendar", &format!("{cal}?start={}&end={}&filter=3", day(-3), day(0)), &[f.t_today, f.t_done]);
        check(c, "calendar", &format!("{cal}?start={}&end={}&filter=0", day(-3), day(0)), &[f.f_late, f.f_done]);
        check(c, "calendar", &format!("{cal}?start={}&end={}&filter=3", day(1), day(30)), &[f.f_soon]);

        // Bad parameters are refused.
        for (path, element) in [
            (format!("{na}?due=soon"), "invalidparameter"),
            (format!("{na}?due={},{}", day(5), day(1)), "invalidparameter"),
            (format!("{na}?filter=abc"), "invalidparameter"),
            (format!("{op}?status=closed"), "invalidparameter"),
            (format!("{tt}?filter=free"), "invalidparameter"),
            (format!("{tt}?itemtypes=7"), "invalidparameter"),
            (format!("{tt}?start={}&end={}", day(0), day(-1)), "invalidparameter"),
            (format!("{cal}?start=tomorrow"), "invalidparameter"),
            ("/report/activities?last=viewed".to_string(), "invalidparameter"),
            ("/report/activities?types=99".to_string(), "invalidparameter"),
            ("/report/nextactions?limit=-1".to_string(), "invalidparameter"),
            ("/report/unknown".to_string(), "resourcenotfound"),
        ] {
            let r = c.get_json(&path);
            assert!(r.status == 400 || r.status == 404, "{path}: {}", r.body);
            assert!(r.json()["errors"][element].is_string(), "{path}: {}", r.body);
        }
        assert_eq!(c.call(Req::new("POST", na)).status, 405);
        let _ = (f.ada, f.initech, f.t_done, &f.s);
        return;
    }
    panic!("the date changed twice during the test");
}

#[test]
fn activities_report_by_time_user_type_and_record() {
    // Ten days ago: a record with a note and a task.
    let lib = libfaketime();
    let env = vec![("LD_PRELOAD", lib.as_str()), ("FAKETIME", "-10d"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
    let s = Service::start_with("activities_report_by_time_user_type_and_record", Options { config: BASE_CONFIG, env });
    let ann = s.add_user("ann@acme.test", "Ann Lee", &[]);
    let admin = s.admin.clone();
    let c = s.admin_client();
    c.post_json("/contacts/categories", r#"{"name": "VIP"}"#).assert_status(201);
    let ada = c.create("contacts", r#"{"firstname": "Ada", "categories": {"add": [1]}}"#);
    let note_old = c.create_activity("note", &format!(r#"{{"parent": {ada}, "data": {{"details": "old"}}}}"#));
    let list = c.create_activity("tasklist", &format!(r#"{{"parent": {ada}, "data": {{"title": "L"}}}}"#));
    let task_old = c.create_activity("task", &format!(r#"{{"parent": {list}, "data": {{"title": "T"}}}}"#));
    let (dir, cfg) = (s.dir.clone(), s.config.clone());
    assert_eq!(s.terminate(), Some(0));

    // Now: Ann writes on her own company; the admin changes the old note and completes the task.
    let s = Service::launch(dir, cfg, &[]);
    let (c, a) = (s.client(&admin), s.client(&ann));
    let initech = a.create("companies", r#"{"name": "Initech"}"#);
    let note_new = a.create_activity("note", &format!(r#"{{"parent": {initech}, "data": {{"details": "new"}}}}"#));
    let comment = c.create_activity("comment", &format!(r#"{{"parent": {note_old}, "data": {{"post": "re"}}}}"#));
    c.put_json(&format!("/contacts/note/{note_old}"), r#"{"data": {"details": "old, changed"}}"#).assert_status(200);
    c.put_json(&format!("/contacts/task/{task_old}"), r#"{"data": {"completed": 1}}"#).assert_status(200);

    let r = "/report/activities";
    let (today, old_from, old_to) = (day(0), day(-11), day(-9));
    check(&c, "activities", &format!("{r}?last=created&start={today}&end={today}"), &[note_new, comment]);
    check(&c, "activities", &format!("{r}?last=updated&start={today}&end={today}"), &[note_old, task_old]);
    check(
        &c,
        "activities",
        &format!("{r}?last=changed&start={today}&end={today}"),
        &[note_new, comment, note_old, task_old],
    );
    check(&c, "activities", &format!("{r}?start={today}&end={today}"), &[note_new, comment, note_old, task_old]);
    // `types` and `users` sent empty, as clients that send every parameter do: as left out.
    check(
        &c,
        "activities",
        &format!("{r}?start={today}&end={today}&types=&users="),
        &[note_new, comment, note_old, task_old],
    );
    for body in ["<request><types/><users/></request>", "<request><types></types></request>"] {
        let got = c.call(Req::new("GET", &format!("{r}?start={today}&end={today}")).xml_body(body).json());
        assert_eq!(got.json()["count"], 4, "{body}: {}", got.body);
    }
    check(&c, "activities", &format!("{r}?last=completed&types=14&start={today}&end={today}"), &[task_old]);
    check(&c, "activities", &format!("{r}?last=completed&start={old_from}&end={old_to}"), &[]);
    check(&c, "activities", &format!("{r}?last=created&start={old_from}&end={old_to}"), &[note_old, list, task_old]);
    check(&c, "activities", &format!("{r}?start={old_from}&end={today}&types=3"), &[note_old, note_new]);
    check(&c, "activities", &format!("{r}?start={old_from}&end={today}&types=3,91"), &[note_old, note_new, comment]);
    check(&c, "activities", &format!("{r}?start={old_from}&end={today}&types=4,88"), &[]);
    check(&c, "activities", &format!("{r}?last=created&start={old_from}&end={today}&users=2"), &[note_new]);
    check(
        &c,
        "activities",
        &format!("{r}?last=created&start={old_from}&end={today}&users=1"),
        &[note_old, list, task_old, comment],
    );
    check(
        &c,
        "activities",
        &format!("{r}?start={old_from}&end={today}&categories=1"),
        &[note_old, list, task_old, comment],
    );
    check(&c, "activities", &format!("{r}?start={old_from}&end={today}&itemtypes=40"), &[note_new]);
    // The default range is the last 30 days; Ann sees only her company's activity.
    check(&c, "activities", r, &[note_old, list, task_old, note_new, comment]);
    check(&a, "activities", r, &[note_new]);
    // "No end" as clients write it, and one bound alone.
    let all = [note_old, list, task_old, note_new, comment];
    check(&c, "activities", &format!("{r}?start={old_from}&end=9999-12-31"), &all);
    check(&c, "activities", &format!("{r}?start={old_from}"), &all);
    check(&c, "activities", &format!("{r}?start={}", day(40)), &[]);
    check(&c, "activities", &format!("{r}?end={}", day(-40)), &[]);
    check(&c, "activities", &format!("{r}?end={old_to}&last=created"), &[note_old, list, task_old]);
    // A bound with an offset is an instant, taken as its day in the site's time zone (UTC
    // here): late today in New York is tomorrow; early today east of here is yesterday. One
    // without an offset is the date as written; a zone nobody knows is refused.
    let created_today = [note_new, comment];
    let (late, early) = (format!("{today}T23:30:00-05:00"), format!("{today}T00:30:00%2B05:00"));
    check(&c, "activities", &format!("{r}?last=created&start={late}"), &[]);
    check(&c, "activities", &format!("{r}?last=created&start={}&end={early}", day(-1)), &[]);
    check(&c, "activities", &format!("{r}?last=created&start={today}%2000:00:00&end={today}"), &created_today);
    check(&c, "activities", &format!("{r}?last=created&start={today}T12:00:00[UTC]&end={today}"), &created_today);
    let refused = c.get_json(&format!("{r}?start={today}T12:00:00[Nowhere/Land]"));
    assert_eq!(refused.status, 400, "{}", refused.body);
    // Paged by `start` as record lists are, in the reports where it is no date.
    for title in ["A", "B"] {
        c.create_activity("task", &format!(r#"{{"parent": {list}, "data": {{"title": "{title}"}}}}"#));
    }
    let page = |path: &str| {
        let v = c.get_json(path).json();
        assert_eq!(v["count"], 2, "{v}");
        v["nextactions"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect::<Vec<_>>()
    };
    let (first, second) = (page("/report/nextactions?limit=1"), page("/report/nextactions?limit=1&start=1"));
    assert!(first.len() == 1 && second.len() == 1 && first != second, "{first:?} {second:?}");
    assert_eq!(page("/report/nextactions?limit=1&offset=1"), second);
    // The comment count of the old note.
    let v = c.get_json(&format!("{r}?types=3&start={old_from}&end={today}")).json();
    let old = v["activities"].as_array().unwrap().iter().find(|e| e["id"] == note_old).unwrap().clone();
    assert_eq!(old["comments"], 1);
    let _ = q("");
}

/// An interaction's report `date` is the day it occurred in the site's time zone: in Tokyo
/// (UTC+9) a call at 23:30 UTC was the next morning.
#[test]
fn an_interaction_is_dated_by_the_day_of_the_site() {
    let config = BASE_CONFIG.replace("timezone = \"UTC\"", "timezone = \"Asia/Tokyo\"");
    let s =
        Service::start_with("an_interaction_is_dated_by_the_day_of_the_site", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    let ada = c.create("contacts", r#"{"firstname": "Ada"}"#);
    let call = |at: &str| {
        c.create_activity("call", &format!(r#"{{"parent": {ada}, "data": {{"details": "x", "dateoccured": "{at}"}}}}"#))
    };
    let (night, evening) = (call("2026-11-27T23:30:00+00:00"), call("2026-11-27T10:00:00+00:00"));
    let v = c.get_json("/report/activities?types=73&start=2000-01-01&end=2099-12-31").json();
    let dates: BTreeMap<i64, String> = v["activities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_i64().unwrap(), e["date"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(dates, BTreeMap::from([(night, "2026-11-28".to_string()), (evening, "2026-11-27".to_string())]), "{v}");
}

/// Shapes, with fixed dates far from today.
#[test]
fn reports_golden() {
    let s = Service::start("reports_golden");
    s.add_group("Ops", &[]);
    s.add_user("ann@acme.test", "Ann Lee", &["--group", "2"]);
    let c = s.admin_client();
    let ada = c.create("contacts", r#"{"firstname": "Ada", "lastname": "Byron", "businessemail": "ada@example.com"}"#);
    let initech = c.create("companies", r#"{"name": "Initech"}"#);
    let list = c.create_activity(
        "tasklist",
        &format!(r#"{{"parent": {ada}, "data": {{"title": "Install", "milestonedate": "2030-01-20"}}}}"#),
    );
    let task = c.create_activity("task", &format!(r#"{{"parent": {list}, "data": {{"title": "Mount readers", "duedate": "2030-01-10", "assignedto": 3, "priority": 2}}}}"#));
    c.create_activity("comment", &format!(r#"{{"parent": {task}, "data": {{"post": "Parts ordered"}}}}"#));
    c.create_activity(
        "followup",
        &format!(
            r#"{{"parent": {initech}, "data": {{"details": "Call Bill", "duedate": "2030-01-12", "assignedto": 2}}}}"#
        ),
    );
    c.create_activity("opportunity", &format!(r#"{{"parent": {initech}, "data": {{"description": "Audit", "status": "Won", "stage": 100, "probability": 100, "valueunit": "5000", "valuecurrency": "USD", "closingdate": "2030-01-15", "responsible": 3}}}}"#));
    c.create_activity("timerecord", &format!(r#"{{"parent": {task}, "data": {{"date": "2030-01-09", "person": 3, "hours": 2.5, "billable": 1, "details": "Drilling", "invoiced": "INV-1"}}}}"#));
    let call = c.create_activity(
        "call",
        &format!(r#"{{"parent": {initech}, "data": {{"details": "Visit", "dateoccured": "2030-01-08 10:00:00"}}}}"#),
    );
    c.create_activity("timerecord", &format!(r#"{{"parent": {call}, "data": {{"date": "2030-01-08", "hours": 1}}}}"#));
    let range = "2030-01-01,2030-01-31";
    let mut t = Transcript::new();
    t.step(&c, Req::new("GET", &format!("/report/nextactions?due={range}")));
    t.step(&c, Req::new("GET", &format!("/report/nextactions?due={range}&itemsdata=1")).json());
    t.step(&c, Req::new("GET", &format!("/report/followups?due={range}")).json());
    t.step(&c, Req::new("GET", &format!("/report/opportunities?due={range}")));
    t.step(&c, Req::new("GET", &format!("/report/opportunities?due={range}")).json());
    t.step(&c, Req::new("GET", "/report/activities?types=14,91&start=2000-01-01&end=2099-12-31"));
    t.step(&c, Req::new("GET", "/report/activities?types=14&start=2000-01-01&end=2099-12-31").json());
    t.step(&c, Req::new("GET", "/report/timetracking?start=2030-01-01&end=2030-01-31"));
    t.step(&c, Req::new("GET", "/report/timetracking?start=2030-01-01&end=2030-01-31&itemsdata=1").json());
    t.step(&c, Req::new("GET", "/report/calendar?start=2030-01-01&end=2030-01-31").json());
    expect_file!["golden/reports.txt"].assert_eq(&t.text);
}

/// An answer reads at most `REPLY_DATA_BYTES_MAX` (64 MiB) of records: a report whose rows
/// each carry their record (`itemsdata`), 250 rows of one record holding 300 KB, answers 413
/// `replytoolarge` with what to ask instead, having read no more than that (each such report
/// of 5,000 rows took gigabytes of memory, BENCHMARKS.md); fewer rows, or
/// the same rows without the record, answer as before; so does a batch holding it.
#[test]
fn an_answer_too_large_is_refused_before_it_is_read() {
    let s = Service::start("an_answer_too_large_is_refused_before_it_is_read");
    let c = s.admin_client();
    let text = "x".repeat(60_000);
    let fields: Vec<String> = ["lastname", "businessaddress", "jobtitle", "background", "website"]
        .iter()
        .map(|f| format!(r#""{f}": "{text}""#))
        .collect();
    let big = c.create("contacts", &format!(r#"{{"firstname": "Big", {}}}"#, fields.join(", ")));
    for i in 0..250 {
        c.create_activity(
            "followup",
            &format!(r#"{{"parent": {big}, "data": {{"details": "f{i}", "duedate": "2026-06-01"}}}}"#),
        );
    }
    let path = "/report/followups?due=2026-01-01,2026-12-31";
    let r = c.get_json(&format!("{path}&itemsdata=1"));
    assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(300)]);
    assert!(r.body.contains("replytoolarge") && r.body.contains("itemsdata"), "{}", r.body);

    let some = c.get_json(&format!("{path}&itemsdata=1&limit=10"));
    assert_eq!(some.status, 200);
    assert_eq!(some.json()["followups"].as_array().map(Vec::len), Some(10), "{}", &some.body[..300]);
    let all = c.get_json(path);
    assert_eq!(all.status, 200);
    assert_eq!(all.json()["count"], 250);
    // The total whatever the page: full, short, empty, past the end, of none.
    for (start, limit) in [(0, 10), (240, 10), (245, 10), (249, 1), (250, 10), (300, 10), (0, 0), (7, 0)] {
        let page = c.get_json(&format!("{path}&offset={start}&limit={limit}")).json();
        assert_eq!(page["count"], 250, "start {start} limit {limit}");
        let rows = page["followups"].as_array().map_or(0, Vec::len);
        assert_eq!(rows, limit.min(250usize.saturating_sub(start)), "start {start} limit {limit}");
    }

    // In a batch: the part is refused, the rest runs.
    let part = |target: &str| {
        format!(
            "--b\r\nContent-Type: application/http\r\n\r\nGET {target} HTTP/1.1\r\nAccept: application/json\r\n\r\n\r\n"
        )
    };
    let body = format!("{}{}--b--\r\n", part(&format!("{path}&itemsdata=1")), part(&format!("/contacts/{big}")));
    let r = c.call(Req::new("POST", "/batch").body("multipart/mixed; boundary=b", body));
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
    let statuses: Vec<&str> = r.body.lines().filter(|l| l.starts_with("HTTP/1.1 ")).collect();
    assert_eq!(statuses, ["HTTP/1.1 413 Payload Too Large", "HTTP/1.1 200 OK"], "{}", &r.body[..r.body.len().min(600)]);
}
