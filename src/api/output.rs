//! Response documents: one tree (`Out`) rendered as XML (`<response>...`) or JSON.
//!
//! The tree carries what the two encodings need beyond plain data: the element name of list
//! items in XML (`<categories><category>`), keys that differ by encoding (`<id131>` in XML,
//! `"131"` in JSON) and attributes (`<assignedto cn="Ann">12</assignedto>` in XML, a sibling
//! `"assignedto_cn"` in JSON).

use std::borrow::Cow;
use std::fmt::Write;

use serde_json::{Map, Value};

use crate::limits;
use crate::model::xml_char;
use crate::timefmt;

#[derive(Clone, Debug)]
pub enum Out {
    Text(String),
    Int(i64),
    /// An integer written as text: `"12"` in JSON where `Int` writes `12`.
    IntText(i64),
    /// Unix seconds written as an ISO time ([`timefmt::iso`]), without allocating a string.
    Time(i64),
    /// A decimal number, as text in JSON's grammar (see [`Out::decimal`]): bare in JSON, its
    /// text in XML.
    Number(String),
    /// JSON null; an empty element in XML.
    Null,
    Map(Vec<Member>),
    /// A list; in XML each item is an element named `item`.
    List {
        item: &'static str,
        items: Vec<Out>,
    },
}

#[derive(Clone, Debug)]
pub struct Member {
    pub xml: Cow<'static, str>,
    /// What few members have (a JSON key of its own, attributes), boxed: a record's document
    /// has some forty members, each built, copied and dropped with every show.
    pub extra: Option<Box<MemberExtra>>,
    pub value: Out,
}

#[derive(Clone, Debug, Default)]
pub struct MemberExtra {
    /// The key in JSON when it is not `xml`.
    pub json: Option<String>,
    pub attrs: Vec<(&'static str, String)>,
    /// Whether JSON has the attributes too, as siblings `key_attr`; otherwise they are XML's
    /// only (a name that is the JSON key already, see [`Out::push_named`]).
    pub attrs_in_json: bool,
}

impl Member {
    pub fn new(xml: impl Into<Cow<'static, str>>, value: Out) -> Member {
        Member { xml: xml.into(), extra: None, value }
    }

    fn json(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|e| e.json.as_deref())
    }

    fn attrs(&self) -> &[(&'static str, String)] {
        self.extra.as_ref().map_or(&[], |e| &e.attrs)
    }

    /// The attributes JSON writes as sibling members.
    fn json_attrs(&self) -> &[(&'static str, String)] {
        self.extra.as_ref().filter(|e| e.attrs_in_json).map_or(&[], |e| &e.attrs)
    }
}

impl Out {
    pub fn map() -> Out {
        Out::Map(Vec::new())
    }

    /// A map with room for `members` members (no reallocation while it is filled).
    pub fn map_with_capacity(members: usize) -> Out {
        Out::Map(Vec::with_capacity(members))
    }

    pub fn text(s: impl Into<String>) -> Out {
        Out::Text(s.into())
    }

    pub fn list(item: &'static str, items: Vec<Out>) -> Out {
        Out::List { item, items }
    }

    /// Adds a member (on a map; anything else is returned unchanged).
    pub fn with(mut self, name: impl Into<Cow<'static, str>>, value: Out) -> Out {
        self.push(name, value);
        self
    }

    pub fn push(&mut self, name: impl Into<Cow<'static, str>>, value: Out) {
        if let Out::Map(members) = self {
            members.push(Member::new(name, value));
        }
    }

    /// Adds a member keyed by id: element `id<id>` in XML, key `"<id>"` in JSON.
    pub fn push_keyed(&mut self, id: i64, value: Out) {
        if let Out::Map(members) = self {
            members.push(Member {
                xml: format!("id{id}").into(),
                extra: Some(Box::new(MemberExtra { json: Some(id.to_string()), ..MemberExtra::default() })),
                value,
            });
        }
    }

    /// Adds a member with one attribute: `<name attr="..">value</name>` in XML, `name` and a
    /// sibling `name_attr` in JSON.
    pub fn push_attr(
        &mut self,
        name: impl Into<Cow<'static, str>>,
        attr: &'static str,
        attr_value: String,
        value: Out,
    ) {
        if let Out::Map(members) = self {
            let extra = MemberExtra { json: None, attrs: vec![(attr, attr_value)], attrs_in_json: true };
            members.push(Member { xml: name.into(), extra: Some(Box::new(extra)), value });
        }
    }

    /// Adds a member keyed by a name that need not be an XML name (a zone's label, written by
    /// people): `<element name="..">value</element>` in XML, key `name` in JSON.
    pub fn push_named(&mut self, element: &'static str, name: String, value: Out) {
        if let Out::Map(members) = self {
            let extra = MemberExtra { json: Some(name.clone()), attrs: vec![("name", name)], attrs_in_json: false };
            members.push(Member { xml: element.into(), extra: Some(Box::new(extra)), value });
        }
    }

    /// A stored decimal (a time record's hours) as a number: its text where that is already a
    /// JSON number (`2.5` stays `2.5`), else the value written anew (`.5` becomes `0.5`);
    /// empty or not a finite number: null.
    pub fn decimal(text: &str) -> Out {
        match text.parse::<f64>() {
            Ok(n) if !n.is_finite() => Out::Null,
            Ok(_) if is_json_number(text) => Out::Number(text.to_string()),
            Ok(n) => Out::Number(n.to_string()),
            Err(_) => Out::Null,
        }
    }

    /// `1` or empty, the interface's way of writing a flag.
    pub fn flag(on: bool) -> Out {
        Out::Text(if on { "1".into() } else { String::new() })
    }
}

/// Whether `text` is a number as JSON writes one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(text: &str) -> bool {
    fn digits(b: &[u8]) -> usize {
        b.iter().take_while(|c| c.is_ascii_digit()).count()
    }
    let b = text.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i += digits(&b[i..]),
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        let n = digits(&b[i + 1..]);
        if n == 0 {
            return false;
        }
        i += 1 + n;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digits(&b[i..]);
        if n == 0 {
            return false;
        }
        i += n;
    }
    i == b.len()
}

// ---------------------------------------------------------------------------------------------
// XML

/// `<?xml ...?><response>members</response>`, indented by two spaces.
pub fn to_xml(members: &[Member]) -> String {
    to_xml_root("response", members)
}

/// The members inside a root element of the given name.
pub fn to_xml_root(root: &str, members: &[Member]) -> String {
    let mut out = String::with_capacity(limits::RENDER_BUFFER_BYTES);
    out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<");
    out.push_str(root);
    out.push_str(">\n");
    for m in members {
        write_member(&mut out, m, 1);
    }
    out.push_str("</");
    out.push_str(root);
    out.push_str(">\n");
    out
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_member(out: &mut String, m: &Member, depth: usize) {
    write_element(out, &m.xml, m.attrs(), &m.value, depth);
}

fn write_element(out: &mut String, name: &str, attrs: &[(&'static str, String)], value: &Out, depth: usize) {
    indent(out, depth);
    out.push('<');
    out.push_str(name);
    for (k, v) in attrs {
        let _ = write!(out, " {k}=\"{}\"", escape_attr(v));
    }
    match value {
        Out::Text(s) if s.is_empty() => out.push_str("/>\n"),
        Out::Null => out.push_str("/>\n"),
        Out::Text(s) => {
            out.push('>');
            out.push_str(&escape_text(s));
            close(out, name);
        }
        Out::Int(n) | Out::IntText(n) => {
            out.push('>');
            out.push_str(itoa::Buffer::new().format(*n));
            close(out, name);
        }
        Out::Number(text) => {
            out.push('>');
            out.push_str(text);
            close(out, name);
        }
        Out::Time(t) => timefmt::with_iso(*t, |text| {
            if text.is_empty() {
                out.push_str("/>\n");
            } else {
                out.push('>');
                out.push_str(text);
                close(out, name);
            }
        }),
        Out::Map(members) if members.is_empty() => out.push_str("/>\n"),
        Out::Map(members) => {
            out.push_str(">\n");
            for m in members {
                write_member(out, m, depth + 1);
            }
            indent(out, depth);
            close(out, name);
        }
        Out::List { items, .. } if items.is_empty() => out.push_str("/>\n"),
        Out::List { item, items } => {
            out.push_str(">\n");
            for i in items {
                write_element(out, item, &[], i, depth + 1);
            }
            indent(out, depth);
            close(out, name);
        }
    }
}

fn close(out: &mut String, name: &str) {
    out.push_str("</");
    out.push_str(name);
    out.push_str(">\n");
}

/// Escapes text for XML; characters XML 1.0 cannot carry become U+FFFD.
fn escape_text(s: &str) -> Cow<'_, str> {
    let clean = xml_chars(s);
    match quick_xml::escape::partial_escape(clean.as_ref()) {
        Cow::Borrowed(_) => clean,
        Cow::Owned(o) => Cow::Owned(o),
    }
}

/// Escapes an attribute value; tab, LF and CR as character references, which a parser would
/// otherwise read back as spaces.
fn escape_attr(s: &str) -> String {
    let escaped = quick_xml::escape::escape(xml_chars(s).as_ref()).into_owned();
    if escaped.contains(['\t', '\n', '\r']) {
        escaped.replace('\t', "&#9;").replace('\n', "&#10;").replace('\r', "&#13;")
    } else {
        escaped
    }
}

fn xml_chars(s: &str) -> Cow<'_, str> {
    let ok = xml_char;
    if s.chars().all(ok) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.chars().map(|c| if ok(c) { c } else { '\u{FFFD}' }).collect())
    }
}

// ---------------------------------------------------------------------------------------------
// JSON

/// The members as one JSON object.
pub fn to_json(members: &[Member]) -> String {
    String::from_utf8(to_json_bytes(members)).unwrap_or_else(|_| "{}".into())
}

/// [`to_json`] as bytes, for a response body. Written straight from the tree into a buffer
/// the size of a typical record: building a `Value` first cost more than the query, and
/// serde_json's serializer escaped strings a byte at a time (a third of a show's JSON).
/// Strings are escaped by `json_escape_simd` (sonic-rs's kernel), as serde_json escapes them.
pub fn to_json_bytes(members: &[Member]) -> Vec<u8> {
    let mut out = Vec::with_capacity(limits::RENDER_BUFFER_BYTES);
    write_json_members(&mut out, members);
    out
}

/// Whether two keys are the same. Most maps are small (a record has some twenty members) and
/// go through a 64-slot table of their keys (a key's slot from its length and three of its
/// bytes; keys compared only where slots meet); larger ones are sorted.
fn has_repeated_key(keys: &mut [&str]) -> bool {
    if keys.len() <= SMALL_MAP_MEMBERS {
        const SLOTS: usize = 2 * SMALL_MAP_MEMBERS;
        let mut table = [u8::MAX; SLOTS];
        for (i, key) in keys.iter().enumerate() {
            let b = key.as_bytes();
            let mut h = b.len() as u32;
            if let (Some(first), Some(last)) = (b.first(), b.last()) {
                h = (h.wrapping_mul(31) ^ u32::from(*first)).wrapping_mul(31) ^ u32::from(*last);
                h = h.wrapping_mul(31) ^ u32::from(b[b.len() / 2]);
            }
            let mut slot = (h.wrapping_mul(0x9E37_79B1) >> 26) as usize % SLOTS;
            loop {
                match table[slot] {
                    u8::MAX => {
                        table[slot] = i as u8;
                        break;
                    }
                    j if keys[usize::from(j)] == *key => return true,
                    _ => slot = (slot + 1) % SLOTS,
                }
            }
        }
        false
    } else {
        keys.sort_unstable();
        keys.windows(2).any(|w| w[0] == w[1])
    }
}

/// Maps of up to this many members are checked for a repeated key through a table, larger
/// ones by sorting their keys.
const SMALL_MAP_MEMBERS: usize = 32;

/// A member's JSON key, and the key of each of its attributes (`name_attr`).
fn json_key(m: &Member) -> &str {
    m.json().unwrap_or(&m.xml)
}

/// Whether a map has a key twice, counting its attributes' keys (`name_attr`).
fn members_repeat_a_key(members: &[Member]) -> bool {
    if members.iter().any(|m| !m.json_attrs().is_empty()) {
        let mut owned: Vec<String> = Vec::new();
        for m in members {
            owned.push(json_key(m).to_string());
            owned.extend(m.json_attrs().iter().map(|(a, _)| format!("{}_{a}", json_key(m))));
        }
        let mut keys: Vec<&str> = owned.iter().map(String::as_str).collect();
        has_repeated_key(&mut keys)
    } else if members.len() <= SMALL_MAP_MEMBERS {
        let mut keys = [""; SMALL_MAP_MEMBERS];
        for (slot, m) in keys.iter_mut().zip(members) {
            *slot = json_key(m);
        }
        has_repeated_key(&mut keys[..members.len()])
    } else {
        let mut keys: Vec<&str> = members.iter().map(json_key).collect();
        has_repeated_key(&mut keys)
    }
}

/// Members as a JSON object, as [`members_to_json`] builds it: a key given twice keeps its
/// first place and its last value (such maps take that path).
fn write_json_members(out: &mut Vec<u8>, members: &[Member]) {
    if members_repeat_a_key(members) {
        // serde_json writes into a Vec without failing; an empty object is the fallback.
        if serde_json::to_writer(&mut *out, &members_to_json(members)).is_err() {
            out.extend_from_slice(b"{}");
        }
        return;
    }
    out.push(b'{');
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let key = json_key(m);
        json_escape_simd::escape_into(key, out);
        out.push(b':');
        write_json(out, &m.value);
        for (attr, v) in m.json_attrs() {
            out.push(b',');
            json_escape_simd::escape_into(format!("{key}_{attr}"), out);
            out.push(b':');
            json_escape_simd::escape_into(v, out);
        }
    }
    out.push(b'}');
}

fn write_json(out: &mut Vec<u8>, value: &Out) {
    match value {
        Out::Text(t) => json_escape_simd::escape_into(t, out),
        Out::Int(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
        Out::IntText(n) => {
            out.push(b'"');
            out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes());
            out.push(b'"');
        }
        // An ISO time or the empty string: nothing to escape.
        Out::Time(t) => timefmt::with_iso(*t, |text| {
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
        }),
        Out::Number(text) => out.extend_from_slice(text.as_bytes()),
        Out::Null => out.extend_from_slice(b"null"),
        Out::Map(members) => write_json_members(out, members),
        Out::List { items, .. } => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(out, item);
            }
            out.push(b']');
        }
    }
}

/// The members as form data with nested keys (`content[item][fields][firstname]=Ann`).
pub fn to_form(members: &[Member]) -> String {
    serde_qs::to_string(&members_to_json(members)).unwrap_or_default()
}

pub fn members_to_json(members: &[Member]) -> Value {
    let mut map = Map::with_capacity(members.len());
    for m in members {
        let key = m.json().map_or_else(|| m.xml.to_string(), str::to_string);
        map.insert(key.clone(), to_value(&m.value));
        for (attr, v) in m.json_attrs() {
            map.insert(format!("{key}_{attr}"), Value::String(v.clone()));
        }
    }
    Value::Object(map)
}

fn to_value(out: &Out) -> Value {
    match out {
        Out::Text(s) => Value::String(s.clone()),
        Out::Int(n) => Value::Number((*n).into()),
        Out::IntText(n) => Value::String(n.to_string()),
        Out::Number(text) => serde_json::from_str(text).unwrap_or(Value::Null),
        Out::Time(t) => Value::String(timefmt::iso(*t)),
        Out::Null => Value::Null,
        Out::Map(members) => members_to_json(members),
        Out::List { items, .. } => Value::Array(items.iter().map(to_value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tree_two_encodings() {
        let mut entries = Out::map();
        entries.push_keyed(131, Out::map().with("name", Out::text("A & B")));
        let doc = Out::map()
            .with("categories", Out::list("category", vec![Out::map().with("id", Out::Int(5))]))
            .with("empty", Out::text(""));
        let Out::Map(mut members) = doc else { unreachable!() };
        let mut assigned = Member::new("assignedto", Out::text("12"));
        assigned.extra =
            Some(Box::new(MemberExtra { json: None, attrs: vec![("cn", "Ann <Lee>".into())], attrs_in_json: true }));
        members.push(assigned);
        let Out::Map(e) = entries else { unreachable!() };
        members.extend(e);
        let xml = to_xml(&members);
        assert_eq!(
            xml,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<response>\n  <categories>\n    <category>\n      <id>5</id>\n    </category>\n  </categories>\n  <empty/>\n  <assignedto cn=\"Ann &lt;Lee&gt;\">12</assignedto>\n  <id131>\n    <name>A &amp; B</name>\n  </id131>\n</response>\n"
        );
        assert_eq!(
            to_json(&members),
            r#"{"categories":[{"id":5}],"empty":"","assignedto":"12","assignedto_cn":"Ann <Lee>","131":{"name":"A & B"}}"#
        );
        let bad = to_xml(&[Member::new("x", Out::text("a\u{1}b"))]);
        assert!(bad.contains("<x>a\u{FFFD}b</x>"));
    }

    /// The streamed JSON is the document the map-building path gives, for repeated keys too
    /// (first place, last value).
    #[test]
    fn streamed_json_matches_the_built_value() {
        let plain = Out::map()
            .with("a", Out::Int(-3))
            .with("b", Out::Null)
            .with("c", Out::list("x", vec![Out::text("q\"\n"), Out::map()]))
            .with("d", Out::map().with("e", Out::text("é")));
        let repeated = Out::map().with("k", Out::text("1")).with("j", Out::Int(2)).with("k", Out::text("3"));
        let mut with_attr = Out::map();
        with_attr.push_attr("o", "cn", "Ann".into(), Out::text("5"));
        with_attr.push("o_cn", Out::text("later"));
        // Past SMALL_MAP_MEMBERS the keys are sorted to find a repeat, not compared pair by pair.
        let mut large = Out::map();
        for i in 0..(SMALL_MAP_MEMBERS as i64 + 8) {
            large.push(format!("m{i}"), Out::Int(i));
        }
        let mut large_repeated = large.clone();
        large_repeated.push("m3", Out::text("again"));
        for doc in [plain, repeated, with_attr, large, large_repeated] {
            let Out::Map(members) = doc else { unreachable!() };
            let built = serde_json::to_string(&members_to_json(&members)).unwrap();
            assert_eq!(to_json(&members), built);
        }
        let Out::Map(members) = Out::map().with("k", Out::text("1")).with("j", Out::Int(2)).with("k", Out::text("3"))
        else {
            unreachable!()
        };
        assert_eq!(to_json(&members), r#"{"k":"3","j":2}"#);
    }

    /// Numbers and times written at render time read as the same text built beforehand, in
    /// both encodings and in the built JSON value.
    #[test]
    fn lazy_text_renders_as_its_text() {
        let cases = [
            (Out::IntText(-42), Out::text("-42")),
            (Out::IntText(i64::MAX), Out::text(i64::MAX.to_string())),
            (Out::Time(1_795_474_706), Out::text(timefmt::iso(1_795_474_706))),
            (Out::Time(-62_135_596_800), Out::text(timefmt::iso(-62_135_596_800))),
            (Out::Time(i64::MAX), Out::text("")),
        ];
        for (lazy, text) in cases {
            let one = |value: Out| vec![Member::new("v", value)];
            let (lazy, text) = (one(lazy), one(text));
            assert_eq!(to_xml(&lazy), to_xml(&text));
            assert_eq!(to_json(&lazy), to_json(&text));
            assert_eq!(members_to_json(&lazy), members_to_json(&text));
        }
        assert!(to_json(&[Member::new("v", Out::Time(0))]).contains("1970-01-01T00:00:00+00:00"));
    }

    /// Strings are escaped as serde_json escapes them: every ASCII character, multi-byte
    /// ones, and a character to escape at every place of strings up to 100 bytes (the kernel
    /// works in blocks of 16 to 64).
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut texts: Vec<String> = (0u8..=0x7f).map(|b| format!("a{}b", char::from(b))).collect();
        texts.push("é ü — 日本 \u{1F600} \u{2028}\u{2029} \u{7f}".into());
        for len in 0..100 {
            for at in 0..len {
                for special in ['"', '\\', '\n', '\u{1}', '\u{1f}', 'é'] {
                    let mut t: String = "x".repeat(len);
                    t.replace_range(at..at + 1, &special.to_string());
                    texts.push(t);
                }
            }
            texts.push("y".repeat(len));
        }
        for t in texts {
            let mut member =
                Member::new("v", Out::list("x", vec![Out::text(t.clone()), Out::map().with(t.clone(), Out::Null)]));
            member.extra =
                Some(Box::new(MemberExtra { json: None, attrs: vec![("cn", t.clone())], attrs_in_json: true }));
            let members = vec![member];
            let expected = serde_json::to_string(&members_to_json(&members)).unwrap();
            assert_eq!(to_json(&members), expected, "{t:?}");
        }
    }

    /// Whatever the text, the XML parses and reads back the same (or U+FFFD where XML 1.0
    /// cannot carry a character), in element text and in attributes.
    #[test]
    fn any_text_makes_well_formed_xml() {
        let hostile = "a & b <x> ]]> \"q' \t\n\r 2nd \u{0}\u{1}\u{7f}\u{85} \u{2028} \u{FFFE}\u{FFFF}\u{FDD0} 😀";
        let mut m = Out::map();
        m.push_attr("who", "cn", hostile.to_string(), Out::text(hostile));
        m.push_named("zone", hostile.to_string(), Out::Int(1));
        let xml = to_xml(&[Member::new("doc", m)]);
        let expected: String = hostile.chars().map(|c| if xml_char(c) { c } else { '\u{FFFD}' }).collect();
        let mut reader = quick_xml::Reader::from_str(&xml);
        let mut attrs = Vec::new();
        loop {
            match reader.read_event().unwrap_or_else(|e| panic!("{e}: {xml}")) {
                quick_xml::events::Event::Eof => break,
                quick_xml::events::Event::Start(e) => {
                    for a in e.attributes() {
                        let a = a.unwrap();
                        attrs.push(a.normalized_value(quick_xml::XmlVersion::Implicit1_0).unwrap().into_owned());
                    }
                }
                _ => {}
            }
        }
        assert_eq!(attrs, [expected.clone(), expected.clone()], "{xml}");
        let text = xml.split_once("\">").unwrap().1.split_once("</who>").unwrap().0;
        assert_eq!(quick_xml::escape::unescape(text).unwrap(), expected, "{xml}");
    }

    #[test]
    fn decimals_are_json_numbers() {
        for ok in ["0", "-0", "2", "2.5", "-10.25", "1e3", "1E-3", "0.5e+2"] {
            assert!(is_json_number(ok), "{ok}");
            assert!(matches!(Out::decimal(ok), Out::Number(t) if t == ok), "{ok}");
        }
        for bad in ["", "-", "01", ".5", "5.", "+2", "1e", "1.e3", "0x10", "1 ", "NaN", "inf", "١"] {
            assert!(!is_json_number(bad), "{bad}");
        }
        for (stored, number) in [(".5", "0.5"), ("5.", "5"), ("+2", "2"), ("007", "7"), ("1.50e1", "1.50e1")] {
            assert!(matches!(Out::decimal(stored), Out::Number(t) if t == number), "{stored}");
        }
        for nothing in ["", "x", "inf", "NaN", "1e400"] {
            assert!(matches!(Out::decimal(nothing), Out::Null), "{nothing}");
        }
        let members = vec![Member::new("hours", Out::decimal("2.5")), Member::new("none", Out::decimal(""))];
        assert_eq!(to_json(&members), r#"{"hours":2.5,"none":null}"#);
        assert!(to_xml(&members).contains("<hours>2.5</hours>"));
        let Value::Object(value) = members_to_json(&members) else { unreachable!() };
        assert_eq!(value["hours"], serde_json::json!(2.5));
    }

    #[test]
    fn repeated_keys_are_found_in_small_and_large_maps() {
        assert!(!has_repeated_key(&mut []));
        assert!(!has_repeated_key(&mut ["a", "b", "ab"]));
        assert!(has_repeated_key(&mut ["a", "b", "a"]));
        // Keys alike in length and in the bytes the table looks at, repeated or not.
        assert!(!has_repeated_key(&mut ["axxb", "ayxb", "azxb", "", "axyb"]));
        assert!(has_repeated_key(&mut ["axxb", "ayxb", "", "azxb", "", "q"]));
        assert!(has_repeated_key(&mut ["axxb", "ayxb", "azxb", "ayxb"]));
        let full: Vec<String> = (0..SMALL_MAP_MEMBERS).map(|i| format!("c{i:02}x")).collect();
        let mut keys: Vec<&str> = full.iter().map(String::as_str).collect();
        assert!(!has_repeated_key(&mut keys));
        keys[SMALL_MAP_MEMBERS - 1] = keys[0];
        assert!(has_repeated_key(&mut keys));
        let names: Vec<String> = (0..SMALL_MAP_MEMBERS + 8).map(|i| format!("k{i}")).collect();
        let mut keys: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(!has_repeated_key(&mut keys));
        keys.push("k7");
        assert!(has_repeated_key(&mut keys));
    }
}
