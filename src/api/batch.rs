//! `POST /batch`: many HTTP requests in one `multipart/mixed` call.
//!
//! Each part (`Content-Type: application/http`) holds one whole HTTP request. Every nested
//! request goes through [`App::handle`] like a request from a socket (authentication, quota,
//! routing, events), one after the other, each in its own transaction. The reply is
//! `multipart/mixed` with one `application/http` part per nested request, in order.
//!
//! Parsing is in two steps that never run anything: the multipart body is split into parts
//! (multer), then each part's bytes are read as a request ([`nested_request`]). A part that is
//! not a valid request gets its own 400 part; a body that is not a valid multipart, or holds
//! more than `BATCH_PARTS_MAX` parts, is refused as a whole before anything runs.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};

use super::error::ApiError;
use super::{App, Format, Request, Response};
use crate::limits;

/// One part of a batch, before it runs.
pub struct Part {
    /// The part's `Content-ID`, as sent (echoed in the reply).
    pub content_id: Option<HeaderValue>,
    /// The nested request, or why the part is not one.
    pub request: Result<Nested, String>,
}

/// A nested request as read from a part (outer headers not yet applied).
#[derive(Debug, PartialEq, Eq)]
pub struct Nested {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The boundary of a `multipart/mixed` content type. Read here rather than by a MIME parser:
/// clients send unquoted boundaries with `=` in them (`boundary=====1340674896===`), which
/// are not tokens.
pub fn boundary(content_type: &str) -> Result<String, ApiError> {
    let bad = |why: &str| {
        ApiError::invalid_request(format!("a batch needs Content-Type multipart/mixed; boundary=...: {why}"))
    };
    let (essence, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !essence.trim().eq_ignore_ascii_case("multipart/mixed") {
        return Err(bad("the content type is not multipart/mixed"));
    }
    let mut rest = params;
    while !rest.trim().is_empty() {
        let (name, after) = rest.split_once('=').ok_or_else(|| bad("a parameter has no value"))?;
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            // A quoted string, with backslash escapes.
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let end = end.ok_or_else(|| bad("a quoted parameter is not closed"))?;
            let next = quoted[end..].split_once(';').map_or("", |(_, n)| n);
            (value, next)
        } else {
            let (v, n) = after.split_once(';').unwrap_or((after, ""));
            (v.trim().to_string(), n)
        };
        if name.trim().eq_ignore_ascii_case("boundary") {
            // RFC 2046: 1 to 70 characters.
            if value.is_empty() || value.len() > 70 {
                return Err(bad("the boundary must be 1 to 70 characters"));
            }
            return Ok(value);
        }
        rest = next;
    }
    Err(bad("there is no boundary parameter"))
}

/// Splits a batch body into its parts. Refuses (400) a body that is not a well-formed
/// multipart, and one with more than `BATCH_PARTS_MAX` parts.
pub fn parse(content_type: &str, body: &[u8]) -> Result<Vec<Part>, ApiError> {
    let boundary = boundary(content_type)?;
    let body = with_part_headers(body, &boundary);
    let stream = futures_util::stream::once(std::future::ready(Ok::<_, std::io::Error>(Bytes::from(body))));
    let mut multipart = multer::Multipart::new(stream, boundary);
    let bad = |e: multer::Error| {
        let hint = match e {
            multer::Error::IncompleteStream | multer::Error::IncompleteHeaders => {
                ": each part's headers end with an empty line (CRLF CRLF), and the body with the closing boundary"
            }
            _ => "",
        };
        ApiError::invalid_request(format!("the batch is not a valid multipart/mixed body: {e}{hint}"))
    };
    // The whole body is in memory: every poll completes at once.
    futures_executor::block_on(async {
        let mut parts = Vec::new();
        while let Some(field) = multipart.next_field().await.map_err(bad)? {
            if parts.len() == limits::BATCH_PARTS_MAX {
                return Err(ApiError::invalid_request(format!(
                    "a batch holds at most {} requests; this one holds more, and none of them ran",
                    limits::BATCH_PARTS_MAX
                )));
            }
            let content_id = field.headers().get("content-id").cloned();
            let kind =
                field.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
            let encoding =
                field.headers().get("content-transfer-encoding").and_then(|v| v.to_str().ok()).map(str::to_string);
            let bytes = field.bytes().await.map_err(bad)?;
            let request = check_part(kind.as_deref(), encoding.as_deref()).and_then(|()| nested_request(&bytes));
            parts.push(Part { content_id, request });
        }
        Ok(parts)
    })
}

/// The body with a `Content-Type: application/http` header given to each part that has no
/// headers at all (its delimiter line followed by the empty line at once, as MIME allows):
/// the multipart parser reads a part's headers up to an empty line, and finds none there.
fn with_part_headers(body: &[u8], boundary: &str) -> Vec<u8> {
    let bare = format!("--{boundary}\r\n\r\n");
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut rest = body;
    while let Some(at) = find(rest, bare.as_bytes()) {
        // A delimiter opens the body or a line of its own.
        let line_start = at == 0 && rest.len() == body.len() || at >= 2 && &rest[at - 2..at] == b"\r\n";
        let end = at + bare.len() - 2;
        out.extend_from_slice(&rest[..end]);
        if line_start {
            out.extend_from_slice(b"Content-Type: application/http\r\n");
        }
        rest = &rest[end..];
    }
    out.extend_from_slice(rest);
    out
}

/// A part must hold `application/http` (or say nothing) in a binary encoding.
fn check_part(kind: Option<&str>, encoding: Option<&str>) -> Result<(), String> {
    if let Some(kind) = kind {
        let essence = kind.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/http") {
            return Err(format!("the part's Content-Type is {essence:?}, not application/http"));
        }
    }
    if let Some(encoding) = encoding {
        let encoding = encoding.trim();
        if !["binary", "8bit", "7bit"].iter().any(|e| encoding.eq_ignore_ascii_case(e)) {
            return Err(format!("Content-Transfer-Encoding {encoding:?} is not supported (use binary)"));
        }
    }
    Ok(())
}

/// Reads one nested request: request line (`METHOD TARGET [HTTP/1.x]`), headers, blank line,
/// body. Lines end with CRLF; a bare `GET /contacts/131` is a whole request.
pub fn nested_request(part: &[u8]) -> Result<Nested, String> {
    let (head, body) = match find(part, b"\r\n\r\n") {
        Some(i) => (&part[..i], &part[i + 4..]),
        None => (part.strip_suffix(b"\r\n").unwrap_or(part), &b""[..]),
    };
    for (i, b) in head.iter().enumerate() {
        let crlf = match b {
            b'\n' => i > 0 && head[i - 1] == b'\r',
            b'\r' => head.get(i + 1) == Some(&b'\n'),
            _ => true,
        };
        if !crlf {
            return Err("lines must end with CRLF".into());
        }
    }
    let (line, header_lines) = match find(head, b"\r\n") {
        Some(i) => (&head[..i], &head[i + 2..]),
        None => (head, &b""[..]),
    };
    let line = std::str::from_utf8(line).map_err(|_| "the request line is not text".to_string())?;
    let mut words = line.split(' ');
    let (method, target, version) = (words.next().unwrap_or(""), words.next().unwrap_or(""), words.next());
    if words.next().is_some() || method.is_empty() || target.is_empty() {
        return Err(format!("the request line {line:?} is not METHOD TARGET [HTTP/1.1]"));
    }
    if version.is_some_and(|v| v != "HTTP/1.1" && v != "HTTP/1.0") {
        return Err(format!("the HTTP version {:?} is not supported", version.unwrap_or("")));
    }
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| format!("{method:?} is not a method"))?;
    let target = target_path(target).ok_or_else(|| format!("the target {target:?} is not a path"))?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));

    let mut headers = HeaderMap::new();
    if !header_lines.is_empty() {
        let mut buf = header_lines.to_vec();
        buf.extend_from_slice(b"\r\n\r\n");
        let mut parsed = [httparse::EMPTY_HEADER; limits::BATCH_PART_HEADERS_MAX];
        match httparse::parse_headers(&buf, &mut parsed) {
            Ok(httparse::Status::Complete((_, list))) => {
                for h in list {
                    let name = HeaderName::from_bytes(h.name.as_bytes())
                        .map_err(|_| format!("bad header name {:?}", h.name))?;
                    let value =
                        HeaderValue::from_bytes(h.value).map_err(|_| format!("bad value of header {}", h.name))?;
                    headers.append(name, value);
                }
            }
            Ok(httparse::Status::Partial) => return Err("the headers are incomplete".into()),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(format!("more than {} headers", limits::BATCH_PART_HEADERS_MAX));
            }
            Err(e) => return Err(format!("the headers are not valid: {e}")),
        }
    }
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return Err("Transfer-Encoding is not supported in a nested request (send the body as it is)".into());
    }
    let mut body = body;
    let lengths: Vec<&HeaderValue> = headers.get_all(http::header::CONTENT_LENGTH).iter().collect();
    if let Some(value) = lengths.first() {
        let n: usize = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|_| lengths.iter().all(|other| other == value))
            .ok_or_else(|| "Content-Length is not one number".to_string())?;
        if n > body.len() {
            return Err(format!("Content-Length is {n} but the part holds {} bytes of body", body.len()));
        }
        body = &body[..n];
    }
    Ok(Nested { method, path: path.to_string(), query: query.to_string(), headers, body: Bytes::copy_from_slice(body) })
}

/// The path and query of a request target: origin form (`/contacts?x=1`) or absolute form
/// (`https://host/contacts`).
fn target_path(target: &str) -> Option<&str> {
    if target.starts_with('/') {
        return Some(target);
    }
    let rest = target.strip_prefix("http://").or_else(|| target.strip_prefix("https://"))?;
    rest.find('/').map(|i| &rest[i..])
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether a path is the batch endpoint as the router sees it (its segments, so `//batch`
/// and `/batch//` too): a batch inside a batch must never reach the router, whose every
/// level of nesting takes stack.
pub fn is_batch_path(path: &str) -> bool {
    super::segments(path) == ["batch"]
}

/// Reply boundaries drawn at most (each of 96 random bits; a second is practically never needed).
const BOUNDARY_DRAWS_MAX: usize = 8;

/// Room for a reply part's own lines (boundary, part headers, status line, response headers).
const PART_OVERHEAD_BYTES: usize = 1024;

/// Outer headers that describe the outer message itself and never pass to nested requests.
const OWN_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "content-transfer-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "host",
    "expect",
    "te",
    "trailer",
    "upgrade",
];

impl App {
    /// `POST /batch`: runs every part's request in order and answers them all.
    pub(super) fn batch(&self, req: &Request, format: &Format) -> Response {
        if req.method != Method::POST {
            return super::render_error(format, ApiError::method_not_allowed(&["POST"]), self.quota_of(req));
        }
        let content_type = req.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let parts = match parse(content_type, &req.body) {
            Ok(parts) => parts,
            Err(e) => return super::render_error(format, e, self.quota_of(req)),
        };
        let total = parts.len();
        // Each answer with the Content-Length it declares (a HEAD's is its GET's, without the body).
        let mut answers: Vec<(Option<HeaderValue>, Response, usize)> = Vec::with_capacity(total);
        let mut reply_bytes = 0usize;
        for part in parts {
            // Nobody waits for the rest: the parts not yet run are not run.
            if req.gone.as_ref().is_some_and(|g| g.load(std::sync::atomic::Ordering::Relaxed)) {
                log::debug!("batch: the client has gone; {} of {total} parts not run", total - answers.len());
                break;
            }
            // A nested answer reads no more records than the reply has room for.
            let room = limits::BATCH_REPLY_BYTES_MAX.saturating_sub(reply_bytes + PART_OVERHEAD_BYTES);
            let _budget = crate::store::ReplyBudget::start(room);
            let head = matches!(&part.request, Ok(n) if n.method == http::Method::HEAD);
            let response = match part.request {
                Ok(nested) => self.run_nested(req, nested),
                Err(why) => self.refuse(req, ApiError::invalid_request(format!("invalid nested HTTP request: {why}"))),
            };
            // The request ran; only its answer is left out if the reply would grow too large.
            let response = if reply_bytes + response.body.len() + PART_OVERHEAD_BYTES > limits::BATCH_REPLY_BYTES_MAX {
                self.refuse(req, ApiError::reply_too_large(response.body.len(), limits::BATCH_REPLY_BYTES_MAX))
            } else {
                response
            };
            let mut response = response;
            let length = response.body.len();
            if head {
                response.body = Vec::new();
            }
            reply_bytes += response.body.len() + PART_OVERHEAD_BYTES;
            answers.push((part.content_id, response, length));
        }
        // The boundary must not occur in what it separates: a random one practically never
        // does, but an answer could quote one; then another is drawn.
        let mut boundary = fresh_boundary();
        for _ in 0..BOUNDARY_DRAWS_MAX {
            if !answers.iter().any(|(_, r, _)| find(&r.body, boundary.as_bytes()).is_some()) {
                break;
            }
            boundary = fresh_boundary();
        }
        let mut out = Vec::with_capacity(reply_bytes);
        for (content_id, response, length) in &answers {
            write_part(&mut out, &boundary, content_id.as_ref(), response, *length);
        }
        out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        Response {
            status: 200,
            headers: vec![
                ("Content-Type", format!("multipart/mixed; boundary={boundary}").into()),
                (super::QUOTA_HEADER, self.quota_of(req).into()),
            ],
            body: out,
        }
    }

    /// An error answer for a request that does not run (and so does not count).
    fn refuse(&self, req: &Request, err: ApiError) -> Response {
        let mut response = super::early_error(&req.headers, &req.query, err, self.quota.allowed());
        let used = self.quota_of(req);
        for (name, value) in &mut response.headers {
            if *name == super::QUOTA_HEADER {
                *value = used.clone().into();
            }
        }
        response
    }

    /// One nested request: the outer headers fill in what it does not send itself.
    fn run_nested(&self, outer: &Request, nested: Nested) -> Response {
        let mut headers = nested.headers;
        // `Accept` and the `Accepts` some clients send are one header to the format choice: a
        // nested request that sends either keeps both of the outer request's out.
        let sends_accept = headers.contains_key("accept") || headers.contains_key("accepts");
        for name in outer.headers.keys() {
            if OWN_HEADERS.contains(&name.as_str())
                || headers.contains_key(name)
                || (sends_accept && matches!(name.as_str(), "accept" | "accepts"))
            {
                continue;
            }
            for value in outer.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let request = Request {
            // HEAD is answered as GET, as on a connection of its own (the caller leaves the
            // body out and keeps its length).
            method: if nested.method == http::Method::HEAD { http::Method::GET } else { nested.method },
            path: nested.path,
            query: nested.query,
            headers,
            body: nested.body,
            peer: outer.peer,
            // The outer request's client, and its deadline, hold for the nested one.
            gone: None,
        };
        if is_batch_path(&request.path) {
            return self.refuse(
                &request,
                ApiError::invalid_request("invalid nested HTTP request: a batch cannot hold another batch"),
            );
        }
        let content_type = request
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim_start()
            .to_ascii_lowercase();
        let limit = if content_type.starts_with("multipart/form-data") {
            self.config.http.upload_bytes_max
        } else {
            self.config.http.body_bytes_max
        };
        if request.body.len() > limit {
            return self.refuse(&request, ApiError::too_large(limit));
        }
        let response = self.handle_isolated(&request);
        log::debug!("batch part {} {} -> {}", request.method, request.path, response.status);
        response
    }
}

/// A boundary for the reply: `batch_` and 24 random hex digits.
fn fresh_boundary() -> String {
    let mut bytes = [0u8; 12];
    if getrandom::fill(&mut bytes).is_err() {
        // Unique enough within one process when the system cannot give randomness.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        bytes.copy_from_slice(&nanos.to_le_bytes()[..12]);
    }
    format!("batch_{}", hex::encode(bytes))
}

/// One reply part: the part's headers, then the nested response as HTTP/1.1 text, declaring
/// `length` (its body's, or for a HEAD the GET's it stands for).
fn write_part(out: &mut Vec<u8>, boundary: &str, content_id: Option<&HeaderValue>, response: &Response, length: usize) {
    out.extend_from_slice(format!("--{boundary}\r\nContent-Type: application/http\r\n").as_bytes());
    if let Some(id) = content_id {
        out.extend_from_slice(b"Content-ID: ");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let reason = http::StatusCode::from_u16(response.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    out.extend_from_slice(format!("\r\nHTTP/1.1 {} {reason}\r\n", response.status).as_bytes());
    for (name, value) in &response.headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("Content-Length: {length}\r\n\r\n").as_bytes());
    out.extend_from_slice(&response.body);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    use super::*;

    const BOUNDARY: &str = "====1340674896===";

    fn content_type() -> String {
        format!("multipart/mixed; boundary={BOUNDARY}")
    }

    /// A batch body of raw parts, each `application/http`, with an optional Content-ID.
    fn batch_body(parts: &[(Option<String>, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"preamble, ignored\r\n".to_vec();
        for (id, part) in parts {
            out.extend_from_slice(format!("--{BOUNDARY}\r\nContent-Type: application/http\r\n").as_bytes());
            out.extend_from_slice(b"Content-Transfer-Encoding: binary\r\n");
            if let Some(id) = id {
                out.extend_from_slice(format!("Content-ID: {id}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("--{BOUNDARY}--\r\nepilogue, ignored").as_bytes());
        out
    }

    fn one(part: &[u8]) -> Result<Nested, String> {
        let mut parts = parse(&content_type(), &batch_body(&[(None, part.to_vec())])).unwrap();
        assert_eq!(parts.len(), 1);
        parts.remove(0).request
    }

    #[test]
    fn boundaries_quoted_unquoted_and_with_equals_signs() {
        assert_eq!(boundary("multipart/mixed; boundary=====1340674896===").unwrap(), "====1340674896===");
        assert_eq!(boundary("Multipart/Mixed;charset=x; BOUNDARY=\"a b;c\\\"d\"").unwrap(), "a b;c\"d");
        assert_eq!(boundary("multipart/mixed;boundary=abc ; x=y").unwrap(), "abc");
        for bad in [
            "multipart/form-data; boundary=x",
            "multipart/mixed",
            "multipart/mixed; boundary=",
            "multipart/mixed; boundary=\"open",
            "multipart/mixed; charset",
            "application/json",
            "",
        ] {
            assert!(boundary(bad).is_err(), "{bad}");
        }
        assert!(boundary(&format!("multipart/mixed; boundary={}", "b".repeat(71))).is_err());
    }

    #[test]
    fn a_part_without_headers_is_a_part() {
        let ct = "multipart/mixed; boundary=b1";
        let parts = parse(ct, b"--b1\r\n\r\nGET /contacts/5\r\n--b1\r\n\r\nGET /contacts/6\r\n--b1--\r\n").unwrap();
        let paths: Vec<String> = parts.iter().map(|p| p.request.as_ref().unwrap().path.clone()).collect();
        assert_eq!(paths, ["/contacts/5", "/contacts/6"]);
        // Beside parts with headers, after a preamble; the content is left as it is.
        let body = b"pre\r\n--b1\r\nContent-ID: <1>\r\n\r\nPUT /contacts/5\r\n\r\n--b1\r\n\r\n\r\n--b1--";
        let parts = parse(ct, body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].content_id.as_ref().unwrap(), "<1>");
        assert_eq!(parts[0].request.as_ref().unwrap().method, Method::PUT);
        // A part whose headers end in LF only is still refused, and the message says why.
        let Err(err) = parse(ct, b"--b1\r\nContent-Type: application/http\n\nGET /contacts/5\r\n--b1--\r\n") else {
            panic!("LF-only part headers were taken");
        };
        assert!(err.message.contains("CRLF CRLF"), "{}", err.message);
    }

    #[test]
    fn a_bare_request_line_is_a_whole_request() {
        let n = one(b"GET /contacts/131").unwrap();
        assert_eq!((n.method, n.path.as_str(), n.query.as_str(), n.body.len()), (Method::GET, "/contacts/131", "", 0));
        let n =
            one(b"GET http://crm.example.com/contacts?limit=5 HTTP/1.1\r\nAccept: application/json\r\n\r\n").unwrap();
        assert_eq!((n.path.as_str(), n.query.as_str()), ("/contacts", "limit=5"));
        assert_eq!(n.headers.get("accept").unwrap(), "application/json");
    }

    #[test]
    fn lines_must_end_with_crlf_in_the_head_but_the_body_is_free() {
        assert_eq!(
            one(b"GET /contacts/1 HTTP/1.1\nAccept: application/json\n\n").unwrap_err(),
            "lines must end with CRLF"
        );
        assert_eq!(one(b"GET /contacts/1 HTTP/1.1\r\nAccept: x\n\r\n").unwrap_err(), "lines must end with CRLF");
        assert_eq!(one(b"GET /contacts/1\rHTTP/1.1").unwrap_err(), "lines must end with CRLF");
        let n = one(b"POST /contacts HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{\"a\":\n\"b\"}").unwrap();
        assert_eq!(&n.body[..], b"{\"a\":\n\"b\"}");
    }

    #[test]
    fn content_length_ends_the_body_and_may_not_pass_the_part() {
        let n = one(b"PUT /contacts/1 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcdef").unwrap();
        assert_eq!(&n.body[..], b"abc");
        assert!(
            one(b"PUT /contacts/1 HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc").unwrap_err().contains("Content-Length")
        );
        assert!(one(b"PUT /contacts/1 HTTP/1.1\r\nContent-Length: x\r\n\r\nabc").is_err());
        assert!(one(b"PUT /contacts/1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n").is_err());
    }

    #[test]
    fn bad_request_lines_and_parts() {
        for bad in [&b""[..], b"GET", b"GET  /x", b"GET /x HTTP/2", b"GET x", b"G(T /x", b"GET /x HTTP/1.1 more"] {
            assert!(one(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let body = format!("--{BOUNDARY}\r\nContent-Type: text/plain\r\n\r\nGET /x\r\n--{BOUNDARY}--\r\n");
        let parts = parse(&content_type(), body.as_bytes()).unwrap();
        assert!(parts[0].request.as_ref().unwrap_err().contains("application/http"));
        let body = format!("--{BOUNDARY}\r\nContent-Transfer-Encoding: base64\r\n\r\nR0VUIC94\r\n--{BOUNDARY}--\r\n");
        let parts = parse(&content_type(), body.as_bytes()).unwrap();
        assert!(parts[0].request.as_ref().unwrap_err().contains("base64"));
    }

    #[test]
    fn at_most_100_parts() {
        let parts: Vec<_> = (0..100).map(|i| (Some(i.to_string()), b"GET /contacts".to_vec())).collect();
        let parsed = parse(&content_type(), &batch_body(&parts)).unwrap();
        assert_eq!(parsed.len(), 100);
        assert_eq!(parsed[99].content_id.as_ref().unwrap(), "99");
        let parts: Vec<_> = (0..101).map(|_| (None, b"GET /contacts".to_vec())).collect();
        let err = parse(&content_type(), &batch_body(&parts)).err().unwrap();
        assert_eq!((err.status, err.element.as_ref()), (400, "invalidrequest"));
    }

    #[test]
    fn a_body_that_is_not_multipart_is_refused() {
        assert!(parse(&content_type(), b"GET /contacts/1\r\n").is_err());
        assert!(
            parse(&content_type(), format!("--{BOUNDARY}\r\nContent-Type: application/http\r\n\r\nGET /x").as_bytes())
                .is_err()
        );
    }

    fn token(chars: &'static str, len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
        vec(select(chars.chars().collect::<Vec<_>>()), len).prop_map(|c| c.into_iter().collect())
    }

    #[derive(Debug, Clone)]
    struct Generated {
        content_id: Option<String>,
        method: &'static str,
        path: String,
        query: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        with_length: bool,
    }

    impl Generated {
        fn bytes(&self) -> Vec<u8> {
            let target =
                if self.query.is_empty() { self.path.clone() } else { format!("{}?{}", self.path, self.query) };
            let mut out = format!("{} {target} HTTP/1.1\r\n", self.method).into_bytes();
            for (k, v) in &self.headers {
                out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
            }
            if self.with_length {
                out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&self.body);
            out
        }
    }

    fn generated() -> impl Strategy<Value = Generated> {
        const ALNUM: &str = "abcdefghijklmnopqrstuvwxyz0123456789";
        (
            proptest::option::of(token(ALNUM, 0..12)),
            select(vec!["GET", "POST", "PUT", "DELETE"]),
            vec(token(ALNUM, 1..8), 1..4).prop_map(|s| format!("/{}", s.join("/"))),
            token("abcxyz019=&%+", 0..16),
            vec(
                (
                    select(vec!["Accept", "Authorization", "Content-Type", "X-Custom", "Accepts"]),
                    token("abcdefghijklmnopqrstuvwxyzABC0123456789 /;=+:.,-", 1..40),
                ),
                0..5,
            ),
            vec(any::<u8>(), 0..300),
            any::<bool>(),
        )
            .prop_map(|(content_id, method, path, query, headers, body, with_length)| Generated {
                content_id,
                method,
                path,
                query,
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                    .filter(|(_, v)| !v.is_empty())
                    .collect(),
                body,
                with_length,
            })
    }

    /// 256 cases each; `SITEGATE_FUZZ_CASES=N` asks for a longer run.
    fn fuzz_config() -> ProptestConfig {
        let cases = std::env::var("SITEGATE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
        ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
    }

    proptest! {
        #![proptest_config(fuzz_config())]

        /// What is written as a batch is read back as the same requests, in order.
        #[test]
        fn batches_round_trip(requests in vec(generated(), 1..12)) {
            let parts: Vec<_> = requests.iter().map(|r| (r.content_id.clone(), r.bytes())).collect();
            let parsed = parse(&content_type(), &batch_body(&parts)).map_err(|e| TestCaseError::fail(e.message))?;
            prop_assert_eq!(parsed.len(), requests.len());
            for (r, p) in requests.iter().zip(parsed) {
                prop_assert_eq!(p.content_id.as_ref().map(|v| v.to_str().unwrap().to_string()), r.content_id.clone());
                let n = p.request.map_err(TestCaseError::fail)?;
                prop_assert_eq!(n.method.as_str(), r.method);
                prop_assert_eq!(&n.path, &r.path);
                prop_assert_eq!(&n.query, &r.query);
                prop_assert_eq!(&n.body[..], &r.body[..]);
                for (k, v) in &r.headers {
                    prop_assert!(n.headers.get_all(k.as_str()).iter().any(|x| x == v.as_str()), "{} lost", k);
                }
            }
        }

        /// A valid batch with bytes changed, cut or inserted anywhere: parsing never panics, and
        /// whatever it reads comes from the body.
        #[test]
        fn damaged_batches_never_panic(
            requests in vec(generated(), 1..6),
            edits in vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
        ) {
            let parts: Vec<_> = requests.iter().map(|r| (r.content_id.clone(), r.bytes())).collect();
            let mut body = batch_body(&parts);
            for (at, byte, kind) in edits {
                let i = at.index(body.len());
                match kind {
                    0 => body[i] = byte,
                    1 => { body.truncate(i); }
                    _ => body.insert(i, byte),
                }
                if body.is_empty() { break; }
            }
            if let Ok(parsed) = parse(&content_type(), &body) {
                prop_assert!(parsed.len() <= limits::BATCH_PARTS_MAX);
                for p in parsed {
                    if let Ok(n) = p.request {
                        prop_assert!(n.body.is_empty() || find(&body, &n.body).is_some());
                        prop_assert!(find(&body, n.path.as_bytes()).is_some());
                    }
                }
            }
        }

        /// Any bytes as a part, any bytes as a batch: an answer, never a panic.
        #[test]
        fn any_bytes_never_panic(bytes in vec(any::<u8>(), 0..1024)) {
            if let Ok(n) = nested_request(&bytes) {
                prop_assert!(n.body.is_empty() || find(&bytes, &n.body).is_some());
            }
            let _ = parse(&content_type(), &bytes);
        }
    }
}
