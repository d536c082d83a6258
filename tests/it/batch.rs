//! `POST /batch`: nested requests in one multipart/mixed call, through the same router, auth,
//! quota and events as top-level requests.

use expect_test::expect_file;

use crate::support::*;

const BOUNDARY: &str = "====1340674896===";

/// A part of a batch: its Content-ID (None: no header) and the nested request's bytes.
struct Part {
    content_id: Option<&'static str>,
    request: Vec<u8>,
}

fn part(request: &str) -> Part {
    Part { content_id: None, request: request.as_bytes().to_vec() }
}

fn part_id(id: &'static str, request: &str) -> Part {
    Part { content_id: Some(id), request: request.as_bytes().to_vec() }
}

fn body(boundary: &str, parts: &[Part]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(format!("--{boundary}\r\nContent-Type: application/http\r\n").as_bytes());
        out.extend_from_slice(b"Content-Transfer-Encoding: binary\r\n");
        if let Some(id) = p.content_id {
            out.extend_from_slice(format!("Content-ID: {id}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&p.request);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

fn batch_req(parts: &[Part]) -> Req {
    Req::new("POST", "/batch").body(&format!("multipart/mixed; boundary={BOUNDARY}"), body(BOUNDARY, parts))
}

/// One part of a batch reply: its part headers, and the nested response.
#[derive(Debug)]
struct Answer {
    content_id: Option<String>,
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Reads a batch reply: multipart/mixed of application/http parts, every line CRLF.
#[track_caller]
fn answers(resp: &Resp) -> Vec<Answer> {
    assert_eq!(resp.status, 200, "{}", resp.body);
    let ct = resp.header("Content-Type").expect("a content type");
    let boundary = ct.strip_prefix("multipart/mixed; boundary=").unwrap_or_else(|| panic!("not multipart: {ct}"));
    let body = resp.body.as_str();
    let closing = format!("--{boundary}--\r\n");
    assert!(body.ends_with(&closing), "no closing delimiter: {body}");
    let inner = &body[..body.len() - closing.len()];
    let delimiter = format!("--{boundary}\r\n");
    assert!(inner.starts_with(&delimiter) || inner.is_empty(), "{body}");
    let mut out = Vec::new();
    for chunk in inner.split(&delimiter).skip(1) {
        let chunk = chunk.strip_suffix("\r\n").expect("a part ends with CRLF before the delimiter");
        let (part_head, http) = chunk.split_once("\r\n\r\n").expect("part headers");
        let mut content_id = None;
        for line in part_head.split("\r\n") {
            let (k, v) = line.split_once(':').unwrap();
            match k {
                "Content-Type" => assert_eq!(v.trim(), "application/http"),
                "Content-ID" => content_id = Some(v.trim().to_string()),
                other => panic!("unexpected part header {other}"),
            }
        }
        let (head, body) = http.split_once("\r\n\r\n").expect("a nested response head");
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
        let status: u16 = status_line[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (k, v) = l.split_once(": ").unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let length: usize = headers.iter().find(|(k, _)| k == "Content-Length").unwrap().1.parse().unwrap();
        assert_eq!(length, body.len(), "Content-Length of a nested response");
        out.push(Answer { content_id, status, headers, body: body.to_string() });
    }
    out
}

/// Bytes as a transcript shows them: CRLF as `␍` and a line break, so that bare LF shows.
fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes).replace("\r\n", "␍\n");
    let text = regex::Regex::new("batch_[0-9a-f]{24}").unwrap().replace_all(&text, "batch_[BOUNDARY]").into_owned();
    redact(&text)
}

/// Sends a batch and records it, and its reply, byte for byte.
fn step(t: &mut Transcript, c: &Client, title: &str, req: Req) -> Resp {
    t.text.push_str(&format!("### {title}\n{} {}\n", req.method, req.path));
    for (k, v) in &req.headers {
        t.text.push_str(&format!("{k}: {v}\n"));
    }
    t.text.push('\n');
    t.text.push_str(&show(&req.body));
    let resp = c.call(req);
    t.text.push_str("\n--- response\n");
    t.text.push_str(&format!("{}\n", resp.status));
    for name in ["Content-Type", "Http-X-Service-Api-Call-Limit", "Allow"] {
        if let Some(v) = resp.header(name) {
            t.text.push_str(&format!("{name}: {}\n", show(v.as_bytes())));
        }
    }
    t.text.push('\n');
    t.text.push_str(&show(resp.body.as_bytes()));
    t.text.push_str("\n\n");
    resp
}

#[test]
fn batch_golden() {
    let s = Service::start("batch_golden");
    let c = s.admin_client();
    let mut t = Transcript::new();

    let r = step(
        &mut t,
        &c,
        "create, show, 404, update, list, and a bare request line; Content-ID as sent",
        batch_req(&[
            part_id(
                "<create@x>",
                "POST /contacts HTTP/1.1\r\nContent-Type: application/xml\r\n\r\n<request><firstname>Ann</firstname><lastname>Lee</lastname></request>",
            ),
            part_id("", "GET /contacts/1 HTTP/1.1\r\nAccept: application/json\r\n\r\n"),
            part("GET /contacts/999 HTTP/1.1\r\n\r\n"),
            part(
                "PUT /contacts/1/ HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 28\r\n\r\n{\"jobtitle\": \"Electrician\"}\r\n",
            ),
            part("GET /contacts?fields=jobtitle&limit=1 HTTP/1.1\r\nAccept: application/json\r\n\r\n"),
            part("GET /contacts/1"),
        ]),
    );
    let a = answers(&r);
    assert_eq!(a.iter().map(|a| a.status).collect::<Vec<_>>(), [201, 200, 404, 200, 200, 200]);
    assert_eq!(a[0].header("Location"), Some("/contacts/1"));
    assert_eq!(
        (a[0].content_id.as_deref(), a[1].content_id.as_deref(), a[2].content_id.as_deref()),
        (Some("<create@x>"), Some(""), None)
    );

    let r = step(
        &mut t,
        &c,
        "bad parts answer 400 each; the others run",
        batch_req(&[
            part("GET /contacts/1 HTTP/1.1\nAccept: application/json\n\n"),
            part("FETCH"),
            part("POST /batch HTTP/1.1\r\n\r\n"),
            part("PUT /contacts/1 HTTP/1.1\r\nContent-Length: 99\r\n\r\n{}"),
            part("DELETE /contacts/1 HTTP/1.1\r\nAccept: application/json\r\n\r\n"),
        ]),
    );
    assert_eq!(answers(&r).iter().map(|a| a.status).collect::<Vec<_>>(), [400, 400, 400, 400, 200]);
    c.get("/contacts/1").assert_status(404);

    let parts: Vec<Part> = (0..101)
        .map(|_| part("POST /contacts HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{\"firstname\": \"X\"}"))
        .collect();
    let mut req = batch_req(&parts);
    let big = std::mem::take(&mut req.body);
    t.text.push_str("### 101 parts: refused whole, nothing runs\nPOST /batch (101 parts of POST /contacts)\n");
    let r = c.call(req.body(&format!("multipart/mixed; boundary={BOUNDARY}"), big));
    t.text.push_str(&format!("--- response\n{}", r.golden()));
    t.text.push('\n');
    r.assert_status(400);
    assert!(c.list_ids("/contacts?filtermode=archived").len() == 1 && c.list_ids("/contacts").is_empty());

    step(
        &mut t,
        &c,
        "a quoted boundary; JSON errors for a JSON client",
        Req::new("POST", "/batch")
            .header("Accept", "application/json")
            .body("multipart/mixed; boundary=\"b 1\"", body("b 1", &[part("GET /contacts/1")])),
    );
    step(&mut t, &c, "not multipart", Req::new("POST", "/batch").json_body("{}"));
    step(
        &mut t,
        &c,
        "not a multipart body",
        Req::new("POST", "/batch").body(&format!("multipart/mixed; boundary={BOUNDARY}"), "GET /contacts/1\r\n"),
    );
    step(&mut t, &c, "GET", Req::new("GET", "/batch"));
    expect_file!["golden/batch.txt"].assert_eq(&t.text);
}

#[test]
fn one_hundred_parts_run_in_order() {
    let s = Service::start("one_hundred_parts_run_in_order");
    let c = s.admin_client();
    let parts: Vec<Part> = (0..100)
        .map(|i| {
            let json = format!("{{\"firstname\": \"P{i:03}\"}}");
            Part {
                content_id: None,
                request: format!("POST /contacts HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json\r\n\r\n{json}")
                    .into_bytes(),
            }
        })
        .collect();
    let a = answers(&c.call(batch_req(&parts)));
    assert_eq!(a.len(), 100);
    let mut ids = Vec::new();
    for (i, answer) in a.iter().enumerate() {
        assert_eq!(answer.status, 201, "{}", answer.body);
        let v: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(v["item"]["fields"]["firstname"], format!("P{i:03}"));
        ids.push(v["item"]["id"].as_i64().unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "in request order: {ids:?}");
    assert_eq!(c.list_ids("/contacts?limit=500").len(), 100);
}

#[test]
fn nested_requests_use_outer_headers_unless_they_send_their_own() {
    let s = Service::start("nested_requests_use_outer_headers_unless_they_send_their_own");
    let admin = s.admin_client();
    let ann = s.add_user("ann@example.com", "Ann Lee", &[]);
    let ann_auth = basic(&ann.email, &ann.token);
    let mine = admin.create("contacts", r#"{"firstname": "Admin's"}"#);

    let create = "POST /contacts HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json\r\n\r\n{\"firstname\": \"By Ann\"}";
    let r = admin.call(Req::new("POST", "/batch").header("Accept", "application/json").body(
        &format!("multipart/mixed; boundary={BOUNDARY}"),
        body(
            BOUNDARY,
            &[
                part(&format!("GET /contacts/{mine} HTTP/1.1\r\n\r\n")),
                part(&create.replace(
                    "POST /contacts HTTP/1.1\r\n",
                    &format!("POST /contacts HTTP/1.1\r\nAuthorization: {ann_auth}\r\n"),
                )),
                part(&format!("GET /contacts/{mine} HTTP/1.1\r\nAuthorization: {ann_auth}\r\n\r\n")),
                part(&format!("GET /contacts/{mine} HTTP/1.1\r\nAuthorization: Basic bm9ib2R5Om5vdGhpbmc=\r\n\r\n")),
                part(&format!("GET /contacts/{mine} HTTP/1.1\r\nAccept: application/xml\r\n\r\n")),
            ],
        ),
    ));
    let a = answers(&r);
    assert_eq!(a.iter().map(|a| a.status).collect::<Vec<_>>(), [200, 201, 404, 401, 200]);
    // The outer Accept applies, unless the part sends its own.
    assert!(a[0].header("Content-Type").unwrap().contains("json"));
    assert!(a[4].header("Content-Type").unwrap().contains("xml"));
    assert_eq!(a[3].header("WWW-Authenticate").map(|v| v.starts_with("Basic")), Some(true));
    let created: serde_json::Value = serde_json::from_str(&a[1].body).unwrap();
    let by_ann = created["item"]["id"].as_i64().unwrap();
    s.client(&ann).get(&format!("/contacts/{by_ann}")).assert_status(200);
    assert_ne!(created["item"]["ownership"], serde_json::json!(1), "the nested credentials own it, not the outer");

    // `Accepts` (as some clients spell it) outside, `Accept` inside, and the other way: the
    // part's own wins.
    for (outer, inner, want) in [("Accepts", "Accept", "xml"), ("Accept", "Accepts", "xml")] {
        let r = admin.call(Req::new("POST", "/batch").header(outer, "application/json").body(
            &format!("multipart/mixed; boundary={BOUNDARY}"),
            body(BOUNDARY, &[part(&format!("GET /contacts/{mine} HTTP/1.1\r\n{inner}: application/xml\r\n\r\n"))]),
        ));
        let a = answers(&r);
        assert!(a[0].header("Content-Type").unwrap().contains(want), "{outer} outside, {inner} inside: {a:?}");
    }

    // No outer credentials: each part authenticates for itself.
    let r = s.anonymous().call(batch_req(&[
        part("GET /contacts/1"),
        part(&format!("GET /contacts/{mine} HTTP/1.1\r\nAuthorization: {}\r\n\r\n", admin.auth.clone().unwrap())),
    ]));
    assert_eq!(r.header("Http-X-Service-Api-Call-Limit"), Some("0/10000"));
    assert_eq!(answers(&r).iter().map(|a| a.status).collect::<Vec<_>>(), [401, 200]);
}

#[test]
fn each_nested_request_counts_against_the_quota_and_the_batch_does_not() {
    let config = BASE_CONFIG.replace("[site]", "[api]\nquota_calls_per_hour = 5\n\n[site]");
    let s =
        Service::start_with("each_nested_request_counts_against_the_quota", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Q"}"#); // 1 of 5
    let get = format!("GET /contacts/{id}");
    let parts: Vec<Part> = (0..6).map(|_| part(&get)).collect();
    let r = c.call(batch_req(&parts));
    assert_eq!(r.header("Http-X-Service-Api-Call-Limit"), Some("5/5"), "the batch reports, and is not counted");
    let a = answers(&r);
    assert_eq!(a.iter().map(|a| a.status).collect::<Vec<_>>(), [200, 200, 200, 200, 429, 429]);
    let limits: Vec<_> = a.iter().map(|a| a.header("Http-X-Service-Api-Call-Limit").unwrap().to_string()).collect();
    assert_eq!(limits, ["2/5", "3/5", "4/5", "5/5", "5/5", "5/5"]);
    assert!(a[4].header("Retry-After").is_some());
    // Used up: a batch still answers 200 with a 429 per part.
    let r = c.call(batch_req(&[part(&get)]));
    assert_eq!(answers(&r)[0].status, 429);
}

#[test]
fn nested_writes_emit_events_and_a_panicking_part_answers_500() {
    let s = Service::start_with(
        "nested_writes_emit_events_and_a_panicking_part_answers_500",
        Options { config: BASE_CONFIG, env: vec![("SITEGATE_FAULT_INJECTION", "1")] },
    );
    let c = s.admin_client();
    let receiver = Receiver::start();
    let hook = format!(r#"{{"event": "items.create", "url": "{}", "contenttype": "json"}}"#, receiver.url("/in"));
    c.post_json("/hooks", &hook).assert_status(201);
    let create = |name: &str| {
        format!("POST /contacts HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{{\"firstname\": \"{name}\"}}")
    };
    let r = c.call(batch_req(&[part(&create("Before")), part("GET /_fault/panic"), part(&create("After"))]));
    let a = answers(&r);
    assert_eq!(a.iter().map(|a| a.status).collect::<Vec<_>>(), [201, 500, 201]);
    assert!(a[1].body.contains("internalerror"));
    let got = receiver.wait_accepted(2);
    let names: Vec<String> =
        got.iter().map(|r| r.json()["content"]["item"]["fields"]["firstname"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["Before", "After"]);
    c.get("/contacts").assert_status(200);
}

#[test]
fn batch_bodies_and_nested_bodies_have_limits() {
    let config = BASE_CONFIG.replace("workers = 2", "workers = 2\nbody_bytes_max = 1024\nbatch_bytes_max = 4096");
    let s = Service::start_with("batch_bodies_and_nested_bodies_have_limits", Options { config: &config, env: vec![] });
    let c = s.admin_client();
    let big = format!(
        "POST /contacts HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{{\"firstname\": \"{}\"}}",
        "x".repeat(2000)
    );
    let r = c.call(batch_req(&[part(&big), part("GET /contacts")]));
    let a = answers(&r);
    assert_eq!((a[0].status, a[1].status), (413, 200));
    assert!(c.list_ids("/contacts").is_empty());
    // Over the batch limit: the whole batch is refused.
    let parts: Vec<Part> = (0..3).map(|_| part(&big)).collect();
    let r = c.call(batch_req(&parts));
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.body.contains("requesttoolarge"));
    assert!(c.list_ids("/contacts").is_empty());
}

/// A nested HEAD is answered as on a connection of its own: the GET's status and headers,
/// its Content-Length, and no body.
#[test]
fn a_nested_head_is_answered_as_get_without_its_body() {
    let s = Service::start("a_nested_head_is_answered_as_get_without_its_body");
    let c = s.admin_client();
    let id = c.create("contacts", r#"{"firstname": "Ann"}"#);
    let r = c.call(batch_req(&[part_id("<h>", &format!("HEAD /contacts/{id}")), part(&format!("GET /contacts/{id}"))]));
    assert_eq!(r.status, 200, "{}", r.body);
    let get = r.body.split("HTTP/1.1 ").nth(2).expect("the GET's answer");
    let length: usize =
        get.lines().find_map(|l| l.strip_prefix("Content-Length: ")).expect("the GET's length").trim().parse().unwrap();
    assert!(length > 100, "{get}");
    let head = r.body.split("HTTP/1.1 ").nth(1).expect("the HEAD's answer");
    assert!(head.starts_with("200 OK\r\n"), "{head}");
    assert!(!head.contains("Allow:"), "{head}");
    let ends = format!("Content-Length: {length}\r\n\r\n\r\n--");
    assert!(head.contains(&ends), "the GET's length, no body: {head}");
}
