//! Request input: the XML, JSON and form bodies and the query string, all read into one tree
//! (`serde_json::Value`: objects, arrays and strings; JSON numbers and booleans kept), and the
//! typed accessors handlers use on it.
//!
//! XML `<request><a><b>1</b><b>2</b></a></request>` becomes `{"a": {"b": ["1", "2"]}}` (the
//! root element is dropped, repeated elements become arrays, attributes are ignored); form
//! `a[b][]=1&a[b][]=2` and JSON `{"a": {"b": [1, 2]}}` read the same way.

use quick_xml::events::Event;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::limits;
use crate::model::{Upload, trim_blank};

/// Which parser a body gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    Xml,
    Json,
    Form,
    /// multipart/form-data: form fields and files.
    Multipart,
}

/// A parsed request body: its parameters, and the files it carried (by form key, such as
/// `data[file]`).
#[derive(Debug, Default)]
pub struct Body {
    pub params: Value,
    pub uploads: Uploads,
}

/// Files a body carried, by form key.
pub type Uploads = Vec<(String, Upload)>;

/// Form keys whose value is a file's content, and the keys that may name that file.
const FILE_KEYS: &[&str] = &["data[file]", "file"];
const FILE_NAME_KEYS: &[&str] = &["data[filename]", "filename"];

/// Picks the parser from the Content-Type; without a usable one, from the first byte.
pub fn body_kind(content_type: Option<&str>, body: &[u8]) -> BodyKind {
    if let Some(kind) = declared_kind(content_type) {
        return kind;
    }
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | Some(b'[') => BodyKind::Json,
        Some(b'<') | None => BodyKind::Xml,
        Some(_) => BodyKind::Form,
    }
}

/// The parser a Content-Type names, if it names one.
fn declared_kind(content_type: Option<&str>) -> Option<BodyKind> {
    let ct = content_type.unwrap_or("").to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence == "application/json" || essence.ends_with("+json") || essence == "text/json" {
        Some(BodyKind::Json)
    } else if essence == "application/x-www-form-urlencoded" {
        Some(BodyKind::Form)
    } else if essence == "multipart/form-data" {
        Some(BodyKind::Multipart)
    } else if essence.contains("xml") {
        Some(BodyKind::Xml)
    } else {
        None
    }
}

/// Parses a request body; an empty body is an empty object. So is one of white space only,
/// unless its Content-Type says JSON or XML, which white space alone is not.
pub fn parse_body(content_type: Option<&str>, raw: &[u8]) -> Result<Body, ApiError> {
    // A UTF-8 byte-order mark, which some Windows tools write before JSON and XML, is not
    // content (a multipart body is read as it came).
    let body = raw.strip_prefix(UTF8_BOM).unwrap_or(raw);
    let blank = body.iter().all(u8::is_ascii_whitespace);
    if body.is_empty() || (blank && !matches!(declared_kind(content_type), Some(BodyKind::Json) | Some(BodyKind::Xml)))
    {
        return Ok(Body { params: Value::Object(Map::new()), uploads: Vec::new() });
    }
    let kind = body_kind(content_type, body);
    let (params, uploads) = match kind {
        BodyKind::Multipart => parse_multipart(content_type.unwrap_or(""), raw)?,
        BodyKind::Form => {
            let (rest, uploads) = take_form_files(body)?;
            let text = std::str::from_utf8(&rest).map_err(|_| ApiError::invalid_request("the body is not UTF-8"))?;
            (parse_form(text)?, uploads)
        }
        BodyKind::Json => {
            let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid_request("the body is not UTF-8"))?;
            // JSON needs no `<request>` wrapper; a client that turned its XML into JSON sends
            // one anyway: `{"request": {...}}` alone is read as what it wraps.
            let json = match parse_json(text)? {
                Value::Object(mut m) if m.len() == 1 && m.get("request").is_some_and(Value::is_object) => {
                    m.remove("request").unwrap_or_default()
                }
                other => other,
            };
            (json, Vec::new())
        }
        BodyKind::Xml => (parse_xml(&xml_text(content_type, body)?)?, Vec::new()),
    };
    if !params.is_object() {
        return Err(ApiError::invalid_request("the body must be an object (JSON) or a <request> element (XML)"));
    }
    check_shape(&params)?;
    Ok(Body { params, uploads })
}

/// multipart/form-data: text parts become form parameters (with nested keys, as form data),
/// parts with a file name become uploads.
fn parse_multipart(content_type: &str, body: &[u8]) -> Result<(Value, Uploads), ApiError> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| ApiError::invalid_request(format!("multipart/form-data without a usable boundary: {e}")))?;
    let bytes = bytes::Bytes::copy_from_slice(body);
    let stream = one_chunk(bytes);
    let mut multipart = multer::Multipart::new(stream, boundary);
    let bad = |e: multer::Error| ApiError::invalid_request(format!("malformed multipart/form-data: {e}"));
    // The whole body is already in memory: every poll completes at once.
    futures_executor::block_on(async {
        let mut form = form_urlencoded::Serializer::new(String::new());
        let mut uploads = Vec::new();
        let mut parts = 0usize;
        while let Some(field) = multipart.next_field().await.map_err(bad)? {
            parts += 1;
            if parts > limits::INPUT_NODES_MAX {
                return Err(ApiError::invalid_request("too many parts in the multipart body"));
            }
            let name = field.name().unwrap_or("").to_string();
            // multer reads a plain UTF-8 `filename` only: a part with another (Latin-1 bytes,
            // `filename*=`) is a file all the same, never its content taken as text.
            let file_name = field.file_name().map(str::to_string).or_else(|| {
                field.headers().get(http::header::CONTENT_DISPOSITION).and_then(|v| raw_file_name(v.as_bytes()))
            });
            match file_name {
                // A browser's file input left empty: no file.
                Some(file_name) if file_name.is_empty() => {
                    let bytes = field.bytes().await.map_err(bad)?;
                    if !bytes.is_empty() {
                        return Err(ApiError::invalid_value(&name, "a file without a name"));
                    }
                }
                Some(file_name) => {
                    if uploads.len() == limits::UPLOADS_PER_REQUEST_MAX {
                        return Err(too_many_files());
                    }
                    if file_name.len() > limits::NAME_BYTES_MAX {
                        return Err(ApiError::invalid_value(
                            &name,
                            format!("its file name is longer than {} bytes", limits::NAME_BYTES_MAX),
                        ));
                    }
                    let content_type = field
                        .content_type()
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "application/octet-stream".into());
                    let bytes = field.bytes().await.map_err(bad)?;
                    uploads.push((name, Upload { name: file_name, content_type, bytes: bytes.to_vec() }));
                }
                None => {
                    let bytes = field.bytes().await.map_err(bad)?;
                    let text = std::str::from_utf8(&bytes)
                        .map_err(|_| ApiError::invalid_request(format!("form field {name:?} is not UTF-8")))?;
                    form.append_pair(&name, text);
                }
            }
        }
        Ok((parse_form(&form.finish())?, uploads))
    })
}

/// The file name of a part's Content-Disposition that multer does not read: `filename*=`
/// (RFC 5987: `UTF-8''Kunden%20M%C3%BCller.csv`, or another charset) or a `filename="..."`
/// that is not UTF-8 (read as Windows-1252, what such clients send).
fn raw_file_name(header: &[u8]) -> Option<String> {
    let params = header.split(|b| *b == b';').skip(1).map(|p| p.trim_ascii());
    let mut plain = None;
    for param in params {
        let Some(eq) = param.iter().position(|b| *b == b'=') else { continue };
        let (key, value) = (param[..eq].trim_ascii(), param[eq + 1..].trim_ascii());
        if key.eq_ignore_ascii_case(b"filename*") {
            let text = std::str::from_utf8(value).ok()?;
            let mut parts = text.splitn(3, '\'');
            let (charset, _lang, encoded) = (parts.next()?, parts.next()?, parts.next()?);
            let bytes: Vec<u8> = percent_encoding::percent_decode_str(encoded).collect();
            let encoding = encoding_rs::Encoding::for_label(charset.as_bytes())?;
            return Some(encoding.decode_without_bom_handling(&bytes).0.into_owned());
        }
        if key.eq_ignore_ascii_case(b"filename") {
            let value = value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value);
            plain = Some(match std::str::from_utf8(value) {
                Ok(text) => text.to_string(),
                Err(_) => encoding_rs::WINDOWS_1252.decode_without_bom_handling(value).0.into_owned(),
            });
        }
    }
    plain
}

fn too_many_files() -> ApiError {
    ApiError::invalid_request(format!("a request carries at most {} files", limits::UPLOADS_PER_REQUEST_MAX))
}

/// A stream of one chunk, for multer.
fn one_chunk(bytes: bytes::Bytes) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures_util::stream::once(async move { Ok(bytes) })
}

/// Form data: the values of `data[file]` (or `file`) are file contents, as bytes (they need not
/// be UTF-8); `data[filename]` names them. Returns the remaining form text and the files.
fn take_form_files(body: &[u8]) -> Result<(Vec<u8>, Uploads), ApiError> {
    let decode_key = |raw: &[u8]| -> String {
        form_urlencoded::parse(&[raw, b"=".as_slice()].concat()).next().map(|(k, _)| k.into_owned()).unwrap_or_default()
    };
    let mut rest = Vec::with_capacity(body.len());
    let mut contents = Vec::new();
    let mut name = None;
    for pair in body.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
        let (raw_key, raw_value) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        let key = decode_key(raw_key);
        if FILE_KEYS.contains(&key.as_str()) {
            let plus_as_space: Vec<u8> = raw_value.iter().map(|b| if *b == b'+' { b' ' } else { *b }).collect();
            let bytes: Vec<u8> = percent_encoding::percent_decode(&plus_as_space).collect();
            if contents.len() == limits::UPLOADS_PER_REQUEST_MAX {
                return Err(too_many_files());
            }
            contents.push((key, bytes));
        } else if FILE_NAME_KEYS.contains(&key.as_str()) {
            let value = form_urlencoded::parse(pair).next().map(|(_, v)| v.into_owned()).unwrap_or_default();
            if value.len() > limits::NAME_BYTES_MAX {
                return Err(ApiError::invalid_value(&key, format!("is longer than {} bytes", limits::NAME_BYTES_MAX)));
            }
            name = Some(value);
        } else {
            if !rest.is_empty() {
                rest.push(b'&');
            }
            rest.extend_from_slice(pair);
        }
    }
    let uploads = contents
        .into_iter()
        .map(|(key, bytes)| {
            let upload = Upload {
                name: name.clone().unwrap_or_else(|| "file".into()),
                content_type: "application/octet-stream".into(),
                bytes,
            };
            (key, upload)
        })
        .collect();
    Ok((rest, uploads))
}

fn parse_json(text: &str) -> Result<Value, ApiError> {
    serde_json::from_str(text).map_err(|e| ApiError::invalid_request(format!("malformed JSON: {e}")))
}

/// Parses form data or a query string with nested keys (`categories[add][]=5`).
pub fn parse_form(text: &str) -> Result<Value, ApiError> {
    if text.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let config = serde_qs::Config::new().max_depth(limits::INPUT_DEPTH_MAX).use_form_encoding(true);
    let value: Value =
        config.deserialize_str(text).map_err(|e| ApiError::invalid_request(format!("malformed form data: {e}")))?;
    check_shape(&value)?;
    Ok(value)
}

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// An XML body as text: in the encoding its Content-Type's `charset` names, else the one its
/// XML declaration names (`<?xml version="1.0" encoding="ISO-8859-1"?>`), else UTF-8.
fn xml_text<'a>(content_type: Option<&str>, body: &'a [u8]) -> Result<std::borrow::Cow<'a, str>, ApiError> {
    let label = charset(content_type).map(|c| c.as_bytes().to_vec()).or_else(|| declared_encoding(body));
    let encoding = match label {
        None => encoding_rs::UTF_8,
        Some(label) => encoding_rs::Encoding::for_label(&label).ok_or_else(|| {
            ApiError::invalid_request(format!(
                "the body's encoding {:?} is not one this service reads",
                String::from_utf8_lossy(&label)
            ))
        })?,
    };
    if encoding == encoding_rs::UTF_8 {
        return std::str::from_utf8(body)
            .map(std::borrow::Cow::Borrowed)
            .map_err(|_| ApiError::invalid_request("the body is not UTF-8"));
    }
    encoding
        .decode_without_bom_handling_and_without_replacement(body)
        .ok_or_else(|| ApiError::invalid_request(format!("the body is not valid {}", encoding.name())))
}

/// The `charset` parameter of a Content-Type.
fn charset(content_type: Option<&str>) -> Option<&str> {
    content_type?.split(';').skip(1).find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim().eq_ignore_ascii_case("charset").then(|| value.trim().trim_matches('"'))
    })
}

/// The encoding an XML declaration names, read by quick-xml from the first event.
fn declared_encoding(body: &[u8]) -> Option<Vec<u8>> {
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut buf = Vec::new();
    match reader.read_event_into(&mut buf) {
        Ok(Event::Decl(decl)) => decl.encoding()?.ok().map(|e| e.as_bytes().to_vec()),
        _ => None,
    }
}

fn parse_xml(text: &str) -> Result<Value, ApiError> {
    struct Frame {
        name: String,
        children: Map<String, Value>,
        text: String,
    }
    fn bad(e: impl std::fmt::Display) -> ApiError {
        ApiError::invalid_request(format!("malformed XML: {e}"))
    }
    fn attach(parent: &mut Frame, name: String, value: Value) {
        match parent.children.get_mut(&name) {
            None => {
                parent.children.insert(name, value);
            }
            Some(Value::Array(items)) => items.push(value),
            Some(existing) => {
                let first = existing.take();
                *existing = Value::Array(vec![first, value]);
            }
        }
    }
    fn element_name(raw: &str) -> Result<String, ApiError> {
        Ok(raw.to_string())
    }
    fn close(frame: Frame) -> Value {
        if frame.children.is_empty() { Value::String(frame.text) } else { Value::Object(frame.children) }
    }

    let mut reader = quick_xml::Reader::from_str(text);
    // Text is trimmed once per element when it closes, not per event: an entity reference
    // splits text into several events, and the spaces around it belong to the value.
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Value> = None;
    let mut nodes = 0usize;
    loop {
        let event = reader.read_event().map_err(bad)?;
        match event {
            Event::Start(e) => {
                if root.is_some() {
                    return Err(bad("content after the root element"));
                }
                // Values are counted below the root element.
                nodes += usize::from(!stack.is_empty());
                if stack.len() >= limits::INPUT_DEPTH_MAX || nodes > limits::INPUT_NODES_MAX {
                    return Err(ApiError::invalid_request("the XML body is nested too deeply or too large"));
                }
                let name = element_name(e.local_name().as_ref())?;
                stack.push(Frame { name, children: Map::new(), text: String::new() });
            }
            Event::Empty(e) => {
                nodes += usize::from(!stack.is_empty());
                if nodes > limits::INPUT_NODES_MAX {
                    return Err(ApiError::invalid_request("the XML body is too large"));
                }
                let name = element_name(e.local_name().as_ref())?;
                match stack.last_mut() {
                    Some(parent) => attach(parent, name, Value::String(String::new())),
                    None if root.is_none() => root = Some(Value::Object(Map::new())),
                    None => return Err(bad("content after the root element")),
                }
            }
            Event::End(_) => {
                let frame = stack.pop().ok_or_else(|| bad("unexpected end tag"))?;
                let name = frame.name.clone();
                let value = close(frame);
                match stack.last_mut() {
                    Some(parent) => attach(parent, name, value),
                    None => {
                        root = Some(match value {
                            Value::String(s) if s.is_empty() => Value::Object(Map::new()),
                            Value::String(_) => {
                                return Err(bad("the root element holds text, not elements"));
                            }
                            other => other,
                        })
                    }
                }
            }
            Event::Text(t) => match stack.last_mut() {
                Some(frame) => frame.text.push_str(&t.xml10_content()),
                None if t.trim().is_empty() => {}
                None => return Err(bad("text outside the root element")),
            },
            Event::CData(c) => match stack.last_mut() {
                Some(frame) => frame.text.push_str(&c.xml10_content()),
                None => return Err(bad("text outside the root element")),
            },
            Event::GeneralRef(r) => {
                let resolved = quick_xml::escape::unescape(&format!("&{};", &*r)).map_err(bad)?.into_owned();
                match stack.last_mut() {
                    Some(frame) => frame.text.push_str(&resolved),
                    None => return Err(bad("text outside the root element")),
                }
            }
            Event::Eof => break,
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
    if !stack.is_empty() {
        return Err(bad("unclosed element"));
    }
    root.ok_or_else(|| bad("no root element"))
}

/// Refuses trees deeper or larger than the limits (JSON is parsed before this check, within
/// serde_json's own recursion limit and the body size limit).
fn check_shape(value: &Value) -> Result<(), ApiError> {
    fn walk(v: &Value, depth: usize, nodes: &mut usize) -> bool {
        // Values are counted below the root; a list (an XML element repeated) is its values
        // (an empty one is one value).
        let list = matches!(v, Value::Array(a) if !a.is_empty());
        *nodes += usize::from(depth > 0 && !list);
        if depth > limits::INPUT_DEPTH_MAX || *nodes > limits::INPUT_NODES_MAX {
            return false;
        }
        match v {
            Value::Object(m) => m.values().all(|c| walk(c, depth + 1, nodes)),
            Value::Array(a) => a.iter().all(|c| walk(c, depth + 1, nodes)),
            _ => true,
        }
    }
    let mut nodes = 0;
    if walk(value, 0, &mut nodes) {
        Ok(())
    } else {
        Err(ApiError::invalid_request("the body is nested too deeply or has too many values"))
    }
}

/// Merges `extra` into `base` (keys of `extra` win).
pub fn merge(base: &mut Value, extra: Value) {
    if let (Value::Object(b), Value::Object(e)) = (base, extra) {
        for (k, v) in e {
            // A blank parameter is one left out: it does not hide the other's value.
            let blank = matches!(&v, Value::String(s) if crate::model::trim_blank(s).is_empty());
            if blank && b.contains_key(&k) {
                continue;
            }
            b.insert(k, v);
        }
    }
}

/// A scalar as text: strings as they are, numbers and booleans written out. `None` for
/// objects, arrays and null.
pub fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "1".into() } else { "0".into() }),
        _ => None,
    }
}

/// Refuses a body with a key outside `allowed` (`incorrectfield`, naming it).
pub fn only_keys(body: &Value, allowed: &[&str]) -> Result<(), ApiError> {
    if let Value::Object(m) = body
        && let Some(other) = m.keys().find(|k| !allowed.contains(&k.as_str()))
    {
        return Err(ApiError::incorrect_field(other));
    }
    Ok(())
}

/// Typed access to the parameters of one request (query string merged with the body).
pub struct Params<'a> {
    pub root: &'a Value,
}

impl<'a> Params<'a> {
    pub fn new(root: &'a Value) -> Params<'a> {
        Params { root }
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.root.get(key)
    }

    /// A text parameter; a missing one is `None`. An object or array is an error.
    pub fn text(&self, key: &str) -> Result<Option<String>, ApiError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => scalar_text(v)
                .map(|s| Some(trim_blank(&s).to_string()))
                .ok_or_else(|| ApiError::invalid_parameter(key, "must be a single value")),
        }
    }

    /// The bytes of a text parameter as sent, blanks around it included (0 when absent): the
    /// length limits hold for it, as the description's `maxLength` counts them.
    pub fn sent_bytes(&self, key: &str) -> usize {
        self.get(key).and_then(scalar_text).map_or(0, |s| s.len())
    }

    /// A non-empty text parameter, trimmed: empty or white space only counts as missing.
    pub fn nonempty(&self, key: &str) -> Result<Option<String>, ApiError> {
        Ok(self.text(key)?.filter(|s| !s.is_empty()))
    }

    /// An integer parameter (a JSON number or a string of digits); empty counts as missing.
    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        // JSON true is no id: taken as 1, it named someone else's record.
        if let Some(Value::Bool(b)) = self.get(key) {
            return Err(ApiError::invalid_parameter(key, format!("{b} is not an integer")));
        }
        match self.nonempty(key)? {
            None => Ok(None),
            Some(s) => s
                .parse::<i64>()
                .map(Some)
                .map_err(|_| ApiError::invalid_parameter(key, format!("{s:?} is not an integer"))),
        }
    }

    /// An integer parameter within `lo..=hi`, `default` when missing (400 naming the range
    /// beyond it).
    pub fn int_within(&self, key: &str, lo: i64, hi: i64, default: i64) -> Result<i64, ApiError> {
        match self.int(key)? {
            None => Ok(default),
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::invalid_parameter(key, format!("{n} is outside {lo}..={hi}"))),
        }
    }

    /// A page size: `lo` or more, cut to `hi` (a client asking for everything it counted gets
    /// the largest page, as the deployed service answers it, and pages on by `count`).
    pub fn page_size(&self, key: &str, lo: i64, hi: i64, default: i64) -> Result<i64, ApiError> {
        match self.int(key)? {
            None => Ok(default),
            Some(n) if n >= lo => Ok(n.min(hi)),
            Some(n) => Err(ApiError::invalid_parameter(key, format!("{n} is below {lo}"))),
        }
    }

    /// A 0/1 flag.
    pub fn flag(&self, key: &str) -> Result<Option<bool>, ApiError> {
        // JSON true and false are flags (not ids: `int` refuses them).
        if let Some(Value::Bool(b)) = self.get(key) {
            return Ok(Some(*b));
        }
        match self.int(key)? {
            None => Ok(None),
            Some(0) => Ok(Some(false)),
            Some(1) => Ok(Some(true)),
            Some(n) => Err(ApiError::invalid_parameter(key, format!("{n} is not 0 or 1"))),
        }
    }
}

/// Every integer id found under `v`, however it is nested: `5`, `"5"`, `[5, 6]`,
/// `{"category": ["5", "6"]}` all work, as the XML, JSON and form shapes differ.
pub fn ids_under(v: &Value, what: &str) -> Result<Vec<i64>, ApiError> {
    fn walk(v: &Value, what: &str, out: &mut Vec<i64>) -> Result<(), ApiError> {
        match v {
            Value::Null => Ok(()),
            Value::Array(items) => items.iter().try_for_each(|i| walk(i, what, out)),
            Value::Object(m) => m.values().try_for_each(|i| walk(i, what, out)),
            Value::Bool(b) => Err(ApiError::invalid_value(what, format!("{b} is not an id"))),
            other => {
                let text = scalar_text(other).unwrap_or_default();
                let text = trim_blank(&text);
                if text.is_empty() {
                    return Ok(());
                }
                let id = text
                    .parse::<i64>()
                    .ok()
                    .filter(|i| *i > 0)
                    .ok_or_else(|| ApiError::invalid_value(what, format!("{text:?} is not an id")))?;
                if out.len() >= limits::REFERENCES_PER_REQUEST_MAX {
                    return Err(ApiError::invalid_value(
                        what,
                        format!("more than {} ids in one request", limits::REFERENCES_PER_REQUEST_MAX),
                    ));
                }
                if !out.contains(&id) {
                    out.push(id);
                }
                Ok(())
            }
        }
    }
    let mut out = Vec::new();
    walk(v, what, &mut out)?;
    Ok(out)
}

/// Field names from `a,b`, an array, or XML's wrapped list (`<fields><field>a</field>
/// <field>b</field></fields>`, an object holding them), as the interface writes its other
/// lists.
pub fn name_list(v: &Value, what: &str) -> Result<Vec<String>, ApiError> {
    fn walk(v: &Value, what: &str, out: &mut Vec<String>) -> Result<(), ApiError> {
        match v {
            Value::Array(items) => items.iter().try_for_each(|i| walk(i, what, out)),
            Value::Object(m) => m.values().try_for_each(|i| walk(i, what, out)),
            other => {
                let text =
                    scalar_text(other).ok_or_else(|| ApiError::invalid_parameter(what, "must be names or ids"))?;
                out.extend(text.split(',').map(trim_blank).filter(|s| !s.is_empty()).map(str::to_string));
                Ok(())
            }
        }
    }
    let mut out = Vec::new();
    walk(v, what, &mut out)?;
    Ok(out)
}

/// Integer ids from `1,2,3`, a number or an array.
pub fn id_list(v: &Value, what: &str) -> Result<Vec<i64>, ApiError> {
    let names = name_list(v, what)?;
    names
        .iter()
        .map(|s| {
            s.parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| ApiError::invalid_parameter(what, format!("{s:?} is not an id")))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|ids| {
            if ids.len() > limits::REFERENCES_PER_REQUEST_MAX {
                Err(ApiError::invalid_parameter(what, "too many ids"))
            } else {
                Ok(ids)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(ct: Option<&str>, body: &str, expected: Value) {
        assert_eq!(parse_body(ct, body.as_bytes()).unwrap().params, expected, "body: {body}");
    }

    #[test]
    fn blank_bodies_and_parameters() {
        // No body, or white space where nothing declares a format: no parameters.
        check(None, "", json!({}));
        check(None, " \r\n", json!({}));
        check(Some("application/x-www-form-urlencoded"), "\n", json!({}));
        // White space is not a JSON or XML document.
        assert!(parse_body(Some("application/json"), b" ").is_err());
        assert!(parse_body(Some("text/xml"), b"\n").is_err());
        // An empty parameter, or one of white space only, is a missing one.
        let v = json!({"empty": "", "blank": "\r", "padded": " 5 ", "null": null, "word": "x"});
        let p = Params::new(&v);
        assert_eq!(p.int("empty").unwrap(), None);
        assert_eq!(p.int("null").unwrap(), None);
        assert_eq!(p.int("blank").unwrap(), None);
        assert_eq!(p.int("padded").unwrap(), Some(5));
        assert!(p.int("word").is_err());
        // JSON true is no id (it was taken as 1), but a flag.
        let v = json!({"parent": true, "categories": {"add": [true]}, "active": false});
        assert!(Params::new(&v).int("parent").is_err());
        assert_eq!(Params::new(&v).flag("parent").unwrap(), Some(true));
        assert_eq!(Params::new(&v).flag("active").unwrap(), Some(false));
        assert!(ids_under(&v["categories"], "categories").is_err());
        assert_eq!(p.nonempty("missing").unwrap(), None);
    }

    #[test]
    fn three_encodings_read_alike() {
        let expected = json!({"firstname": "Ann", "categories": {"add": {"category": ["5", "6"]}}});
        check(
            Some("application/xml"),
            "<?xml version=\"1.0\"?><request><firstname>Ann</firstname><categories><add><category>5</category><category>6</category></add></categories></request>",
            expected.clone(),
        );
        check(
            Some("application/x-www-form-urlencoded"),
            "firstname=Ann&categories[add][category][]=5&categories[add][category][]=6",
            expected,
        );
        check(Some("application/json"), r#"{"firstname":"Ann","n":5}"#, json!({"firstname": "Ann", "n": 5}));
        check(
            None,
            "<request><a>x &amp; y&#33;</a><b/><c><![CDATA[<z>]]></c></request>",
            json!({"a": "x & y!", "b": "", "c": "<z>"}),
        );
        check(None, "   ", json!({}));
        check(Some("text/plain"), "a=1", json!({"a": "1"}));
    }

    /// A file part is a file whatever its name's encoding; a browser's empty file input is no
    /// file at all.
    #[test]
    fn multipart_file_names_in_any_encoding() {
        let ct = "multipart/form-data; boundary=XyZ";
        let body = |disposition: &[u8], content: &[u8]| -> Vec<u8> {
            let mut b = b"--XyZ\r\nContent-Disposition: form-data; name=\"parent\"\r\n\r\n1\r\n--XyZ\r\n".to_vec();
            b.extend_from_slice(b"Content-Disposition: form-data; name=\"data[file]\"; ");
            b.extend_from_slice(disposition);
            b.extend_from_slice(b"\r\nContent-Type: text/csv\r\n\r\n");
            b.extend_from_slice(content);
            b.extend_from_slice(b"\r\n--XyZ--\r\n");
            b
        };
        for (disposition, name) in [
            (&b"filename=\"Kunden_M\xfcller.csv\""[..], "Kunden_Müller.csv"),
            (&b"filename*=UTF-8''Kunden_M%C3%BCller.csv"[..], "Kunden_Müller.csv"),
            (&b"filename=\"plain.csv\""[..], "plain.csv"),
        ] {
            let parsed = parse_body(Some(ct), &body(disposition, b"a;b\n")).unwrap();
            assert_eq!(parsed.params, json!({"parent": "1"}), "{name}");
            assert_eq!(parsed.uploads.len(), 1, "{name}");
            assert_eq!((parsed.uploads[0].0.as_str(), parsed.uploads[0].1.name.as_str()), ("data[file]", name));
            assert_eq!(parsed.uploads[0].1.bytes, b"a;b\n");
        }
        let empty = parse_body(Some(ct), &body(b"filename=\"\"", b"")).unwrap();
        assert_eq!((empty.params, empty.uploads.len()), (json!({"parent": "1"}), 0));
        assert!(parse_body(Some(ct), &body(b"filename=\"\"", b"data")).is_err());
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for (ct, body) in [
            (Some("application/xml"), "<request><a></request>"),
            (Some("application/xml"), "<request>text</request>"),
            (Some("application/xml"), "<request/><again/>"),
            (Some("application/xml"), "<request>&bogus;</request>"),
            (Some("application/json"), "{\"a\": "),
            (Some("application/json"), "[1, 2]"),
            (Some("application/json"), "42"),
        ] {
            assert!(parse_body(ct, body.as_bytes()).is_err(), "accepted: {body}");
        }
        let deep = format!("{}{}", "<a>".repeat(100), "</a>".repeat(100));
        assert!(parse_body(None, deep.as_bytes()).is_err());
    }

    #[test]
    fn form_files_are_bytes() {
        let body = parse_body(
            Some("application/x-www-form-urlencoded"),
            b"parent=5&data%5Bfile%5D=%00%FF+x&data%5Bfilename%5D=a%20b.bin&data%5Bcaption%5D=c",
        )
        .unwrap();
        assert_eq!(body.params, json!({"parent": "5", "data": {"caption": "c"}}));
        assert_eq!(body.uploads.len(), 1);
        assert_eq!(body.uploads[0].0, "data[file]");
        assert_eq!(body.uploads[0].1.bytes, vec![0, 0xff, b' ', b'x']);
        assert_eq!(body.uploads[0].1.name, "a b.bin");
    }

    #[test]
    fn ids_in_every_shape() {
        assert_eq!(ids_under(&json!({"category": ["5", "6"]}), "x").unwrap(), vec![5, 6]);
        assert_eq!(ids_under(&json!([5, "6", 5]), "x").unwrap(), vec![5, 6]);
        assert_eq!(ids_under(&json!("7"), "x").unwrap(), vec![7]);
        assert!(ids_under(&json!(["x"]), "x").is_err());
        assert!(ids_under(&json!([-1]), "x").is_err());
    }
}
