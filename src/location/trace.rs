//! Advert traces: JSON Lines, one advert per line, as `sitegate record` writes them and
//! `sitegate replay` reads them:
//!
//! `{"t_ms":1763700000000,"receiver":"hci0","mac":"AA:BB:CC:DD:EE:01","rssi":-67,"mfg":{"004c":"0215..."},"svc":{"feaa":"20..."}}`

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::sync::Arc;

use serde::Deserialize;

use super::beacon::{Advert, Mac};
use crate::limits;

/// One advert line: the trace format, also what remote receivers publish over MQTT (where
/// `t_ms` and `receiver` may be left out).
#[derive(Deserialize)]
pub struct Line<'a> {
    pub t_ms: Option<i64>,
    #[serde(default, borrow)]
    pub receiver: Option<&'a str>,
    #[serde(borrow)]
    mac: &'a str,
    rssi: i16,
    #[serde(default, borrow)]
    mfg: BTreeMap<&'a str, &'a str>,
    #[serde(default, borrow)]
    svc: BTreeMap<&'a str, &'a str>,
}

impl<'a> Line<'a> {
    pub fn parse(text: &'a str) -> Result<Line<'a>, String> {
        serde_json::from_str(text.trim_end()).map_err(|e| e.to_string())
    }

    /// The advert of this line, heard by `receiver` at `t_ms`.
    pub fn advert(&self, t_ms: i64, receiver: Arc<str>) -> Result<Advert, String> {
        let mac = Mac::parse(self.mac).ok_or_else(|| format!("{:?} is not a MAC address", self.mac))?;
        let mfg = hex_map(&self.mfg).ok_or("mfg: keys are 4 hex digits, values hex")?;
        let svc = hex_map(&self.svc).ok_or("svc: keys are 4 hex digits, values hex")?;
        Ok(Advert { t_ms, receiver, mac, rssi: self.rssi, mfg, svc })
    }
}

/// Reads a trace line by line. Receiver names are shared between adverts.
pub struct TraceReader<R> {
    input: R,
    line: String,
    number: u64,
    receivers: Vec<Arc<str>>,
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R) -> TraceReader<R> {
        TraceReader { input, line: String::new(), number: 0, receivers: Vec::new() }
    }

    /// The next advert; `None` at the end. A malformed line is an error naming its number;
    /// blank lines are skipped.
    pub fn next_advert(&mut self) -> io::Result<Option<Advert>> {
        loop {
            self.line.clear();
            let n = io::Read::take(&mut self.input, limits::TRACE_LINE_BYTES_MAX as u64 + 1)
                .read_line(&mut self.line)
                .map_err(|e| match e.kind() {
                    // Not UTF-8: a binary file, or a line cut by a crash.
                    io::ErrorKind::InvalidData => {
                        io::Error::new(io::ErrorKind::InvalidData, format!("trace line {}: {e}", self.number + 1))
                    }
                    _ => e,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.number += 1;
            if n > limits::TRACE_LINE_BYTES_MAX {
                return Err(self.bad(format!("longer than {} bytes", limits::TRACE_LINE_BYTES_MAX)));
            }
            if self.line.trim().is_empty() {
                continue;
            }
            let parsed = Line::parse(&self.line).map_err(|e| self.bad(e))?;
            let t_ms = parsed.t_ms.ok_or_else(|| self.bad("missing field `t_ms`"))?;
            let name = parsed.receiver.ok_or_else(|| self.bad("missing field `receiver`"))?;
            let receiver = match self.receivers.iter().find(|r| r.as_ref() == name) {
                Some(r) => r.clone(),
                None => {
                    let r: Arc<str> = name.into();
                    if self.receivers.len() < limits::TRACE_RECEIVERS_MAX {
                        self.receivers.push(r.clone());
                    }
                    r
                }
            };
            return parsed.advert(t_ms, receiver).map(Some).map_err(|e| self.bad(e));
        }
    }

    fn bad(&self, why: impl std::fmt::Display) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, format!("trace line {}: {why}", self.number))
    }
}

fn hex_map(map: &BTreeMap<&str, &str>) -> Option<Vec<(u16, Vec<u8>)>> {
    map.iter()
        .map(|(k, v)| {
            if k.len() != 4 {
                return None;
            }
            Some((u16::from_str_radix(k, 16).ok()?, hex::decode(v).ok()?))
        })
        .collect()
}

/// Writes one advert as a trace line.
pub fn write_advert(out: &mut impl Write, a: &Advert) -> io::Result<()> {
    write!(
        out,
        "{{\"t_ms\":{},\"receiver\":{},\"mac\":\"{}\",\"rssi\":{}",
        a.t_ms,
        json_str(&a.receiver),
        a.mac,
        a.rssi
    )?;
    for (name, map) in [("mfg", &a.mfg), ("svc", &a.svc)] {
        if map.is_empty() {
            continue;
        }
        write!(out, ",\"{name}\":{{")?;
        for (i, (key, data)) in map.iter().enumerate() {
            let comma = if i > 0 { "," } else { "" };
            write!(out, "{comma}\"{key:04x}\":\"{}\"", hex::encode(data))?;
        }
        write!(out, "}}")?;
    }
    writeln!(out, "}}")
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let text = concat!(
            "{\"t_ms\":1763700000000,\"receiver\":\"hci0\",\"mac\":\"AA:BB:CC:DD:EE:01\",\"rssi\":-67,",
            "\"mfg\":{\"004c\":\"0215f7826da64fa24e988024bc5b71e0893e00050016c5\"}}\n",
            "\n",
            "{\"t_ms\":1763700000100,\"receiver\":\"rx-2\",\"mac\":\"AA:BB:CC:DD:EE:02\",\"rssi\":-80,",
            "\"svc\":{\"feaa\":\"20000bb8\"}}\n",
        );
        let mut r = TraceReader::new(text.as_bytes());
        let a = r.next_advert().unwrap().unwrap();
        assert_eq!((a.t_ms, a.receiver.as_ref(), a.rssi, a.mfg[0].0), (1763700000000, "hci0", -67, 0x004c));
        let b = r.next_advert().unwrap().unwrap();
        assert_eq!(b.svc, [(0xfeaa, vec![0x20, 0, 0x0b, 0xb8])]);
        assert!(r.next_advert().unwrap().is_none());
        let mut out = Vec::new();
        write_advert(&mut out, &a).unwrap();
        write_advert(&mut out, &b).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(String::from_utf8(out).unwrap(), format!("{}\n{}\n", lines[0], lines[1]));
    }

    #[test]
    fn bad_lines_name_their_number() {
        for bad in [
            "{\"t_ms\":1,\"receiver\":\"h\",\"mac\":\"zz\",\"rssi\":-1}",
            "{\"t_ms\":1,\"receiver\":\"h\",\"mac\":\"AA:BB:CC:DD:EE:01\",\"rssi\":-1,\"mfg\":{\"4c\":\"00\"}}",
            "{\"t_ms\":1,\"receiver\":\"h\",\"mac\":\"AA:BB:CC:DD:EE:01\",\"rssi\":-1,\"svc\":{\"feaa\":\"0\"}}",
            "not json",
        ] {
            let text = format!("\n{bad}\n");
            let err = TraceReader::new(text.as_bytes()).next_advert().unwrap_err();
            assert!(err.to_string().starts_with("trace line 2:"), "{err}");
        }
        // Bytes that are not UTF-8 (a binary file given as a trace).
        let err = TraceReader::new(&b"\n\xff\xfe\x00\n"[..]).next_advert().unwrap_err();
        assert!(err.to_string().starts_with("trace line 2:"), "{err}");
    }
}
