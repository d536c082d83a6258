//! Bad input: each case gets a clear 4xx in the API's error shape, and the data stays intact.

use crate::support::{Req, Service, q};

struct Case {
    what: &'static str,
    method: &'static str,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    status: u16,
    element: &'static str,
}

fn case(
    what: &'static str,
    method: &'static str,
    path: &str,
    ct: &'static str,
    body: &str,
    status: u16,
    element: &'static str,
) -> Case {
    Case { what, method, path: path.into(), content_type: ct, body: body.as_bytes().to_vec(), status, element }
}

const XML: &str = "application/xml";
const JSON: &str = "application/json";
const FORM: &str = "application/x-www-form-urlencoded";

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = Service::start("bad_input_is_refused_and_changes_nothing");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Keep", "lastname": "Me", "custom1002": "Gold"}"#);
    let tag = c.post_json("/contacts/categories", r#"{"name": "VIP"}"#).json()["id"].as_i64().unwrap();
    let before_show = c.get_json(&format!("/contacts/{id}")).json()["item"]["fields"].clone();
    let rec = format!("/contacts/{id}");

    let deep_json = format!("{}1{}", "{\"a\":".repeat(300), "}".repeat(300));
    let many_values = |n: usize| {
        let members: Vec<String> = (0..n).map(|i| format!("\"x{i}\": 1")).collect();
        format!("{{{}}}", members.join(", "))
    };
    let laughs = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]><request><firstname>&lol2;</firstname></request>"#;
    let mut cases = vec![
        case("malformed XML", "POST", "/contacts", XML, "<request><firstname>Ann</request>", 400, "invalidrequest"),
        case("XML text at the root", "POST", "/contacts", XML, "<request>Ann</request>", 400, "invalidrequest"),
        case("entity expansion", "POST", "/contacts", XML, laughs, 400, "invalidrequest"),
        case("malformed JSON", "POST", "/contacts", JSON, r#"{"firstname": "#, 400, "invalidrequest"),
        case("JSON array body", "PUT", &rec, JSON, r#"["firstname", "x"]"#, 400, "invalidrequest"),
        case("JSON scalar body", "PUT", &rec, JSON, "42", 400, "invalidrequest"),
        case("deeply nested JSON", "PUT", &rec, JSON, &deep_json, 400, "invalidrequest"),
        case("20,001 values", "GET", "/contacts", JSON, &many_values(20_001), 400, "invalidrequest"),
        case("object as a field value", "PUT", &rec, JSON, r#"{"firstname": {"a": 1}}"#, 400, "invalidvalue"),
        case("list as a field value", "PUT", &rec, JSON, r#"{"firstname": ["a", "b"]}"#, 400, "invalidvalue"),
        case("control characters", "PUT", &rec, JSON, r#"{"firstname": "a\u0001b"}"#, 400, "invalidvalue"),
        case("ownership not a number", "PUT", &rec, JSON, r#"{"ownership": "abc"}"#, 400, "invalidvalue"),
        case("flagged 2", "PUT", &rec, JSON, r#"{"flagged": 2}"#, 400, "invalidvalue"),
        case("select value not an option", "PUT", &rec, JSON, r#"{"custom1002": "Bronze"}"#, 400, "invalidvalue"),
        case("date in another format", "PUT", &rec, JSON, r#"{"custom1003": "31/12/2024"}"#, 400, "invalidvalue"),
        case("impossible date", "PUT", &rec, JSON, r#"{"custom1003": "2024-02-30"}"#, 400, "invalidvalue"),
        case("not an e-mail", "PUT", &rec, JSON, r#"{"businessemail": "not an email"}"#, 400, "invalidvalue"),
        case("assignedto not an id", "PUT", &rec, JSON, r#"{"assignedto": "Ann"}"#, 400, "invalidvalue"),
        case("assignedto unknown", "PUT", &rec, JSON, r#"{"assignedto": 999}"#, 400, "invalidreference"),
        case("categories not add/remove", "PUT", &rec, JSON, r#"{"categories": "5"}"#, 400, "invalidvalue"),
        case("category id not a number", "PUT", &rec, JSON, r#"{"categories": {"add": ["x"]}}"#, 400, "invalidvalue"),
        case("unknown category", "PUT", &rec, JSON, r#"{"categories": {"add": [999]}}"#, 400, "invalidreference"),
        case("unknown related item", "PUT", &rec, JSON, r#"{"relateditems": {"add": [999]}}"#, 400, "invalidreference"),
        case(
            "related to itself",
            "PUT",
            &rec,
            XML,
            "<request><relateditems><add><relatedto><id>1</id></relatedto></add></relateditems></request>",
            400,
            "invalidreference",
        ),
        case("unknown field", "PUT", &rec, JSON, r#"{"nickname": "x"}"#, 400, "incorrectfield"),
        case("field of another type", "PUT", &rec, FORM, "mainaddress=x", 400, "incorrectfield"),
        case("form key clash", "PUT", &rec, FORM, "firstname[a]=1&firstname=2", 400, "invalidvalue"),
        case("unknown record type", "GET", "/people", "", "", 404, "resourcenotfound"),
        case("unknown path", "GET", "/contacts/1/2/3/4", "", "", 404, "resourcenotfound"),
        case("id out of range", "GET", "/contacts/99999999999999999999", "", "", 404, "itemisnotfound"),
        case("negative id", "DELETE", "/contacts/-1", "", "", 404, "itemisnotfound"),
        case("negative hook id", "GET", "/hooks/-3", "", "", 404, "itemisnotfound"),
        case(
            "activity id out of range",
            "PUT",
            "/contacts/task/123456789012345678901",
            JSON,
            "{}",
            404,
            "itemisnotfound",
        ),
        case("id with a sign only", "GET", "/contacts/-", "", "", 404, "resourcenotfound"),
        case("id of 19 digits", "GET", "/contacts/1000000000000000000/locations", "", "", 404, "itemisnotfound"),
        case("negative contact id", "DELETE", "/contacts/-5/locations", "", "", 404, "itemisnotfound"),
        case("no such contact's locations", "GET", "/contacts/999999/locations", "", "", 404, "itemisnotfound"),
        case("forgetting no such contact", "DELETE", "/contacts/999999/locations", "", "", 404, "itemisnotfound"),
        case(
            "tag name too long as sent",
            "POST",
            "/companies/categories",
            JSON,
            &format!(r#"{{"name": "!{}"}}"#, " ".repeat(300)),
            400,
            "invalidvalue",
        ),
        // Blanks only count as no value, but not past the length the description allows.
        case(
            "filter value of 1,100 line ends",
            "GET",
            &format!("/projectblogs?filtervalue={}", "%0D".repeat(1100)),
            "",
            "",
            400,
            "invalidparameter",
        ),
        case(
            "search value of 1,100 blanks",
            "GET",
            &format!("/contacts?searchvalue={}", "%20".repeat(1100)),
            "",
            "",
            400,
            "invalidparameter",
        ),
        case(
            "locate by 1,100 tabs",
            "GET",
            &format!("/locate?searchvalue={}", "%09".repeat(1100)),
            "",
            "",
            400,
            "invalidparameter",
        ),
        case("U+FFFF in a value", "PUT", &rec, JSON, r#"{"firstname": "a\uffffb"}"#, 400, "invalidvalue"),
        case("missing record", "PUT", "/contacts/424242", JSON, r#"{"firstname": "x"}"#, 404, "itemisnotfound"),
        case("limit -1", "GET", "/contacts?limit=-1", "", "", 400, "invalidparameter"),
        case("negative start", "GET", "/contacts?start=-5", "", "", 400, "invalidparameter"),
        case(
            "SQL in a filter value",
            "GET",
            &format!("/contacts?filtermode=category&filtervalue={}", q("1); DROP TABLE items; --")),
            "",
            "",
            400,
            "invalidparameter",
        ),
        case("empty category name", "POST", "/contacts/categories", JSON, r#"{"name": "  "}"#, 400, "invalidvalue"),
        case(
            "long category name",
            "POST",
            "/contacts/categories",
            JSON,
            &format!(r#"{{"name": "{}"}}"#, "x".repeat(300)),
            400,
            "invalidvalue",
        ),
        case(
            "duplicate category name",
            "POST",
            "/contacts/categories",
            JSON,
            r#"{"name": "vip"}"#,
            409,
            "alreadyexists",
        ),
        case(
            "activity parent not a number",
            "POST",
            "/contacts/note",
            JSON,
            r#"{"parent": "abc", "data": {"details": "x"}}"#,
            400,
            "invalidvalue",
        ),
        case(
            "activity data not an object",
            "POST",
            "/contacts/note",
            JSON,
            &format!(r#"{{"parent": {id}, "data": "x"}}"#),
            400,
            "invalidvalue",
        ),
        case(
            "activity after and before",
            "POST",
            "/contacts/note",
            JSON,
            &format!(r#"{{"parent": {id}, "after": 1, "before": 2}}"#),
            400,
            "invalidvalue",
        ),
        case("wrong method", "PATCH", "/contacts", "", "", 405, "methodnotallowed"),
        // Only ASCII blanks are trimmed: a no-break space is content, so not an id or a number.
        case("no-break space as an id", "GET", "/report/opportunities?filter=%C2%A0", "", "", 400, "invalidparameter"),
        case("no-break space in a number", "GET", "/contacts?limit=%C2%A05", "", "", 400, "invalidparameter"),
        case(
            "due with a time",
            "GET",
            "/report/opportunities?due=2024-01-01T10:00:00,2024-01-02",
            "",
            "",
            400,
            "invalidparameter",
        ),
        case(
            "no-break space in a date",
            "PUT",
            &rec,
            JSON,
            r#"{"custom1003": "2024-02-01\u00a0"}"#,
            400,
            "invalidvalue",
        ),
    ];
    cases.push(Case {
        what: "invalid UTF-8",
        method: "PUT",
        path: rec.clone(),
        content_type: JSON,
        body: b"{\"firstname\": \"\xff\xfe\"}".to_vec(),
        status: 400,
        element: "invalidrequest",
    });
    let big = format!(r#"{{"background": "{}"}}"#, "x".repeat(2 * 1024 * 1024));
    cases.push(case("body over the limit", "PUT", &rec, JSON, &big, 413, "requesttoolarge"));

    for accept_json in [false, true] {
        for k in &cases {
            let mut req = Req::new(k.method, &k.path);
            if !k.content_type.is_empty() {
                req = req.body(k.content_type, k.body.clone());
            }
            if accept_json {
                req = req.json();
            }
            let r = c.call(req);
            assert_eq!(r.status, k.status, "{} ({}): {}", k.what, if accept_json { "JSON" } else { "XML" }, r.body);
            if accept_json {
                let v = r.json();
                assert_eq!(v["status"], "failed", "{}", k.what);
                let msg = v["errors"][k.element].as_str().unwrap_or_else(|| panic!("{}: {}", k.what, r.body));
                assert!(!msg.is_empty());
            } else {
                assert!(r.body.contains(&format!("<{}>", k.element)), "{}: {}", k.what, r.body);
                assert!(r.body.contains("<status>failed</status>"), "{}: {}", k.what, r.body);
            }
        }
    }
    // Nothing changed.
    let after = c.get_json(&format!("/contacts/{id}")).json();
    assert_eq!(after["item"]["fields"], before_show);
    assert_eq!(after["categories"], serde_json::json!([]));
    assert_eq!(c.list_ids("/contacts"), vec![id]);
    assert_eq!(c.get_json("/contacts/categories").json()["categories"].as_array().unwrap().len(), 1);
    assert_eq!(tag, 1);
    // 20,000 values is the limit, not one past it.
    c.call(Req::new("GET", "/contacts").body(JSON, many_values(20_000).into_bytes()).json()).assert_status(200);
    let xml = format!("<request>{}</request>", "<x>1</x>".repeat(20_000));
    c.call(Req::new("GET", "/contacts").body(XML, xml.into_bytes()).json()).assert_status(200);
    // Quotes and SQL in a search value are just text.
    for v in ["' OR '1'='1", "\"; DELETE FROM items; --", "%' --", "\\"] {
        assert!(c.list_ids(&format!("/contacts?searchmode=Cany&searchvalue={}", q(v))).is_empty(), "{v}");
    }
    assert_eq!(c.list_ids("/contacts"), vec![id]);
}

#[test]
fn blanks_around_values_are_trimmed_and_other_white_space_is_kept() {
    let s = Service::start("blanks_around_values_are_trimmed_and_other_white_space_is_kept");
    let c = s.admin_client();
    // Space, tab, line feed, carriage return, form feed and vertical tab around a value go.
    let id = c.create("contacts", r#"{"firstname": " \t\n\r\f\u000bAnn \u000b", "custom1003": "\f2024-02-01\t"}"#);
    let fields = c.get_json(&format!("/contacts/{id}")).json()["item"]["fields"].clone();
    assert_eq!(fields["firstname"], "Ann", "{fields}");
    assert_eq!(fields["custom1003"], "2024-02-01", "{fields}");
    assert_eq!(
        c.list_ids(&format!("/contacts?limit=%0B5%0C&searchmode=%20Sfirstname%09&searchvalue={}", q(" Ann\t"))),
        [id]
    );
    // Keywords in any case, and dates, with blanks around them.
    for due in ["%20NoW%09", "%0C2024-01-01%20,%202024-01-31%0B"] {
        let r = c.get_json(&format!("/report/opportunities?due={due}"));
        assert_eq!(r.status, 200, "{due}: {}", r.body);
    }
    // A no-break space is part of the text.
    let nbsp = c.create("contacts", r#"{"firstname": "\u00a0Bo\u00a0"}"#);
    let fields = c.get_json(&format!("/contacts/{nbsp}")).json()["item"]["fields"].clone();
    assert_eq!(fields["firstname"], "\u{a0}Bo\u{a0}", "{fields}");
}

/// Windows tools write a byte-order mark before JSON and XML, and older systems send XML in
/// the encoding its declaration or Content-Type names: all read as the same text.
#[test]
fn bodies_with_a_byte_order_mark_or_another_encoding_are_read() {
    let s = Service::start("bodies_with_a_byte_order_mark_or_another_encoding_are_read");
    let c = s.admin_client();
    let created = |req: Req| -> i64 {
        let r = c.call(req.json());
        assert_eq!(r.status, 201, "{}", r.body);
        r.json()["item"]["id"].as_i64().expect("item id")
    };
    let bom_json = created(Req::new("POST", "/contacts").body(JSON, "\u{feff}{\"firstname\": \"Bom\"}"));
    let bom_xml =
        created(Req::new("POST", "/contacts").body(XML, "\u{feff}<request><firstname>Bomx</firstname></request>"));
    // "Zoë" in ISO-8859-1: ë is the one byte 0xEB.
    let mut latin1 = b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><request><firstname>Zo".to_vec();
    latin1.extend_from_slice(b"\xeb</firstname></request>");
    let declared = created(Req::new("POST", "/contacts").body(XML, latin1));
    // windows-1252 named by the Content-Type: the euro sign is 0x80 there.
    let euro =
        created(Req::new("POST", "/contacts").body(
            "application/xml; charset=windows-1252",
            b"<request><firstname>\x80uro</firstname></request>".to_vec(),
        ));
    for (id, name) in [(bom_json, "Bom"), (bom_xml, "Bomx"), (declared, "Zoë"), (euro, "€uro")] {
        let fields = c.get_json(&format!("/contacts/{id}")).json()["item"]["fields"].clone();
        assert_eq!(fields["firstname"], name, "{fields}");
    }
    // An encoding nobody knows, or bytes its encoding does not have, are refused; nothing made.
    for (ct, body) in [
        (XML, b"<?xml version=\"1.0\" encoding=\"klingon\"?><request><firstname>x</firstname></request>".to_vec()),
        ("application/xml; charset=utf-8", b"<request><firstname>\xeb</firstname></request>".to_vec()),
        ("application/xml; charset=shift_jis", b"<request><firstname>\x81</firstname></request>".to_vec()),
    ] {
        let r = c.call(Req::new("POST", "/contacts").body(ct, body).json());
        assert_eq!(r.status, 400, "{ct}: {}", r.body);
        assert!(r.json()["errors"]["invalidrequest"].is_string(), "{}", r.body);
    }
    assert_eq!(c.list_ids("/contacts").len(), 4);
}

/// JSON true and false are flags (`flagged`, a hook's `active`), never ids: `true` as a
/// parent was taken as record 1, someone else's.
#[test]
fn json_booleans_are_flags_and_never_ids() {
    let s = Service::start("json_booleans_are_flags_and_never_ids");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Flag", "flagged": true}"#);
    assert_eq!(c.get_json(&format!("/contacts/{id}")).json()["item"]["flagged"], "1");
    c.put_json(&format!("/contacts/{id}"), r#"{"flagged": false}"#).assert_status(200);
    assert_eq!(c.get_json(&format!("/contacts/{id}")).json()["item"]["flagged"], "");
    let hook = c.post_json("/hooks", r#"{"event": "items.create", "url": "http://192.0.2.1/in", "active": false}"#);
    assert_eq!(hook.status, 201, "{}", hook.body);
    let note = c.post_json("/contacts/note", r#"{"parent": true, "data": {"details": "x"}}"#);
    assert_eq!(note.status, 400, "{}", note.body);
    let tag = c.put_json(&format!("/contacts/{id}"), r#"{"categories": {"add": [true]}}"#);
    assert_eq!(tag.status, 400, "{}", tag.body);
}
