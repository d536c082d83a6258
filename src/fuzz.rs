//! Fuzzing of everything that parses outside input: request bodies (XML, JSON, form,
//! multipart/form-data, and the sniffing between them), query strings, `POST /batch` bodies
//! and their nested requests, beacon frames, advert trace lines, and what remote receivers
//! publish over MQTT.
//!
//! It runs on stable Rust as unit tests (proptest drives the inputs): random bytes, and the
//! corpus in `tests/fuzz/corpus/{target}/` mutated (bytes flipped, inserted, deleted, chunks
//! repeated, target-specific tokens inserted). For every input: no panic, no more memory at
//! once than a bound proportional to the input (measured by a counting allocator, which is the
//! global allocator of the test build), and no hang (a generous deadline per input). Inputs in
//! `tests/fuzz/crashers/{target}/` (ones that once failed) run every time.
//!
//! `SITEGATE_FUZZ_CASES` sets the cases per target and strategy (default 1,000; long runs
//! use millions). A failing input is written to `target/fuzz-crashers/{target}/`; once it is
//! fixed, move it to `tests/fuzz/crashers/{target}/`.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

// --- The counting allocator ----------------------------------------------------------------

/// mimalloc, counting each thread's live bytes and their peak.
pub struct Counting;

thread_local! {
    static LIVE_BYTES: Cell<usize> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = LIVE_BYTES.try_with(|live| {
        let now = live.get().saturating_add(n);
        live.set(now);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(n: usize) {
    let _ = LIVE_BYTES.try_with(|live| live.set(live.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to mimalloc unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the pointer came from mimalloc with this layout.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the pointer came from mimalloc with this layout.
        let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

/// Runs `f` on this thread; returns the most memory it held at once beyond what was live
/// before, in bytes, and the time it took.
fn measured(f: impl FnOnce()) -> (usize, Duration) {
    let base = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|p| p.set(base));
    let started = Instant::now();
    f();
    let took = started.elapsed();
    let peak = PEAK_BYTES.with(Cell::get);
    (peak.saturating_sub(base), took)
}

// --- Targets ---------------------------------------------------------------------------------

/// One fuzz target: a name (its corpus folder), the parser call, and tokens worth inserting.
struct Target {
    name: &'static str,
    run: fn(&[u8]),
    tokens: &'static [&'static str],
}

const XML_TOKENS: &[&str] = &[
    "<request>",
    "</request>",
    "<a>",
    "</a>",
    "<a/>",
    "<![CDATA[",
    "]]>",
    "<!--",
    "-->",
    "<?xml version=\"1.0\"?>",
    "<!DOCTYPE r [<!ENTITY e \"xxxxxxxxxx\">]>",
    "&e;",
    "&amp;",
    "&#x1F600;",
    "&#0;",
    "&lt;",
    "<a b=\"c\">",
    "\u{0}",
    "<categories><add><category>1</category></add></categories>",
];
const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\\u0000",
    "\\ud800",
    "1e999",
    "-0",
    "18446744073709551616",
    "null",
    "true",
    "{\"a\":",
    "[[[[[[[[",
    "\"categories\":{\"add\":[1]}",
    "\"data\":{\"details\":\"x\"}",
];
const FORM_TOKENS: &[&str] =
    &["&", "=", "%", "%00", "%zz", "[", "]", "[]", "a[b][c][d]=", "categories[add][]=1", "data[file]=", "+", "%ff"];
const MULTIPART_TOKENS: &[&str] = &[
    "--X\r\n",
    "--X--\r\n",
    "\r\n\r\n",
    "Content-Disposition: form-data; name=\"",
    "\"; filename=\"",
    "Content-Type: text/plain\r\n",
    "data[file]",
    "parent",
    "\r\n",
];
const BATCH_TOKENS: &[&str] = &[
    "--b\r\n",
    "--b--\r\n",
    "\r\n\r\n",
    "Content-Type: application/http\r\n",
    "Content-Transfer-Encoding: binary\r\n",
    "Content-ID: <1>\r\n",
    "GET /contacts HTTP/1.1\r\n",
    "POST /contacts HTTP/1.1\r\n",
    "Content-Length: ",
    "Transfer-Encoding: chunked\r\n",
    "Host: x\r\n",
    "POST /batch HTTP/1.1\r\n",
];
const ADVERT_TOKENS: &[&str] = &[
    "{\"mac\":\"AA:BB:CC:DD:EE:01\",\"rssi\":-60",
    "\"mfg\":{\"004c\":\"0215",
    "\"svc\":{\"feaa\":\"",
    "\"t_ms\":",
    "}",
    "\n",
    "\"receiver\":\"hci0\"",
    "00",
    "ff",
    "\"rssi\":32767",
];

fn targets() -> Vec<Target> {
    fn body(ct: Option<&str>, bytes: &[u8]) {
        let _ = crate::api::input::parse_body(ct, bytes);
    }
    vec![
        Target { name: "xml", run: |b| body(Some("application/xml"), b), tokens: XML_TOKENS },
        Target { name: "json", run: |b| body(Some("application/json"), b), tokens: JSON_TOKENS },
        Target {
            name: "form",
            run: |b| {
                body(Some("application/x-www-form-urlencoded"), b);
                if let Ok(text) = std::str::from_utf8(b) {
                    let _ = crate::api::input::parse_form(text);
                }
            },
            tokens: FORM_TOKENS,
        },
        Target { name: "sniffed", run: |b| body(None, b), tokens: JSON_TOKENS },
        Target { name: "upload", run: |b| body(Some("multipart/form-data; boundary=X"), b), tokens: MULTIPART_TOKENS },
        Target {
            name: "batch",
            run: |b| {
                if let Ok(parts) = crate::api::batch::parse("multipart/mixed; boundary=b", b) {
                    std::hint::black_box(parts);
                }
                let _ = crate::api::batch::nested_request(b);
            },
            tokens: BATCH_TOKENS,
        },
        Target {
            name: "beacon",
            run: |b| {
                // The first byte picks where the rest goes: manufacturer or service data.
                let (first, rest) = b.split_first().unwrap_or((&0, &[]));
                let key = u16::from(*first) << 8 | u16::from(rest.first().copied().unwrap_or(0));
                let advert = crate::location::beacon::Advert {
                    t_ms: 0,
                    receiver: Arc::from("hci0"),
                    mac: crate::location::beacon::Mac([0; 6]),
                    rssi: -60,
                    mfg: vec![(0x004c, rest.to_vec()), (key, rest.to_vec())],
                    svc: vec![(0xfeaa, rest.to_vec()), (key, rest.to_vec())],
                };
                std::hint::black_box(crate::location::beacon::frames(&advert).count());
                if let Ok(text) = std::str::from_utf8(b) {
                    std::hint::black_box(crate::location::beacon::Mac::parse(text));
                    std::hint::black_box(crate::location::beacon::BeaconId::parse(text));
                }
            },
            tokens: &["\x02\x15", "\x00", "\x10", "\x20", "\x7f"],
        },
        Target {
            name: "ingest",
            run: |b| {
                let receiver: Arc<str> = Arc::from("gate-1");
                let _ = crate::mqtt::ingest::parse_adverts(&receiver, b, 1);
                let _ = crate::mqtt::ingest::parse_espresense(
                    "iBeacon:e2c56db5-dffb-48d2-b060-d0f5a71096e0-1-2",
                    &receiver,
                    b,
                    1,
                );
                if let Some(split) = b.iter().position(|c| *c == b'|') {
                    let id = String::from_utf8_lossy(&b[..split]);
                    let _ = crate::mqtt::ingest::parse_espresense(&id, &receiver, &b[split + 1..], 1);
                }
            },
            tokens: ADVERT_TOKENS,
        },
        Target {
            name: "trace",
            run: |b| {
                let mut reader = crate::location::trace::TraceReader::new(b);
                for _ in 0..10_000 {
                    match reader.next_advert() {
                        Ok(Some(a)) => {
                            std::hint::black_box(a);
                        }
                        _ => break,
                    }
                }
            },
            tokens: ADVERT_TOKENS,
        },
    ]
}

// --- The harness -----------------------------------------------------------------------------

/// Memory one input may hold at once: proportional to its size, plus a fixed allowance (the
/// parsers' node and depth limits bound what a small input can make).
fn memory_bound_bytes(input_len: usize) -> usize {
    64 * input_len + 8 * 1024 * 1024
}

/// Inputs are cut to this size: the default body limit (1 MiB) plus room to cross it.
const INPUT_BYTES_MAX: usize = 2 * 1024 * 1024;

/// An input that takes longer than this hangs (debug build, busy CI machine).
const INPUT_DEADLINE: Duration = Duration::from_secs(10);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn files_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().is_file())
                .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).ok()?)))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Runs one input; an error says what went wrong (and the input is saved).
fn check(target: &Target, input: &[u8]) -> Result<(), String> {
    let run = target.run;
    let outcome = std::panic::catch_unwind(|| measured(|| run(input)));
    let problem = match outcome {
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Some(format!("panicked: {what}"))
        }
        Ok((bytes, _)) if bytes > memory_bound_bytes(input.len()) => {
            Some(format!("held {bytes} bytes at once for a {}-byte input", input.len()))
        }
        Ok((_, took)) if took > INPUT_DEADLINE => Some(format!("took {took:?}")),
        Ok(_) => None,
    };
    match problem {
        None => Ok(()),
        Some(problem) => {
            let dir = root().join("target").join("fuzz-crashers").join(target.name);
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{:016x}", fnv1a(input)));
            let _ = std::fs::write(&file, input);
            Err(format!("{}: {problem} (input saved as {})", target.name, file.display()))
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// One change to an input; positions are taken modulo the input's length.
#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Token(usize, usize),
    Delete(usize, usize),
    Repeat(usize, usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, t)| Mutation::Token(i, t)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<usize>(), 1usize..64, 2usize..2_000).prop_map(|(i, n, k)| Mutation::Repeat(i, n, k)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(mut input: Vec<u8>, mutations: &[Mutation], tokens: &[&str]) -> Vec<u8> {
    for m in mutations {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match m {
            Mutation::Set(i, b) => {
                if !input.is_empty() {
                    let n = input.len();
                    input[i % n] = *b;
                }
            }
            Mutation::Insert(i, bytes) => {
                let p = at(*i, input.len());
                input.splice(p..p, bytes.iter().copied());
            }
            Mutation::Token(i, t) => {
                if !tokens.is_empty() {
                    let p = at(*i, input.len());
                    input.splice(p..p, tokens[t % tokens.len()].bytes());
                }
            }
            Mutation::Delete(i, n) => {
                let p = at(*i, input.len());
                let end = (p + n).min(input.len());
                input.drain(p..end);
            }
            Mutation::Repeat(i, n, k) => {
                // A chunk repeated: deep nesting, many parts, long runs (bounded to 1 MiB).
                let p = at(*i, input.len());
                let end = (p + n).min(input.len());
                let chunk = input[p..end].to_vec();
                let times = (*k).min((1 << 20) / chunk.len().max(1));
                let repeated: Vec<u8> = chunk.iter().copied().cycle().take(chunk.len() * times).collect();
                input.splice(end..end, repeated);
            }
            Mutation::Truncate(i) => {
                let p = at(*i, input.len());
                input.truncate(p);
            }
        }
    }
    // Larger bodies are refused before any parser sees them (413).
    input.truncate(INPUT_BYTES_MAX);
    input
}

fn cases() -> u32 {
    std::env::var("SITEGATE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        // Shrinking finds a small failing input; each step reruns the parser.
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Seeds, crashers, random bytes and mutated seeds through one target; returns the inputs run.
fn fuzz(target: &Target) -> u64 {
    let mut ran = 0u64;
    let corpus = files_in(&root().join("tests").join("fuzz").join("corpus").join(target.name));
    assert!(!corpus.is_empty(), "{}: no corpus", target.name);
    let crashers = files_in(&root().join("tests").join("fuzz").join("crashers").join(target.name));
    for (name, input) in corpus.iter().chain(&crashers) {
        if let Err(e) = check(target, input) {
            panic!("{e} ({name})");
        }
        ran += 1;
    }
    let counter = std::sync::atomic::AtomicU64::new(0);
    let random = prop::collection::vec(any::<u8>(), 0..4_096);
    runner()
        .run(&random, |input| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            check(target, &input).map_err(TestCaseError::fail)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let seeds: Vec<Vec<u8>> = corpus.into_iter().map(|(_, b)| b).collect();
    let mutated = (0..seeds.len(), prop::collection::vec(mutation(), 1..8));
    runner()
        .run(&mutated, |(seed, mutations)| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let input = apply(seeds[seed].clone(), &mutations, target.tokens);
            check(target, &input).map_err(TestCaseError::fail)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    ran + counter.into_inner()
}

macro_rules! fuzz_test {
    ($name:ident, $target:literal) => {
        #[test]
        fn $name() {
            let target = targets().into_iter().find(|t| t.name == $target).expect("a target");
            let started = Instant::now();
            let ran = fuzz(&target);
            eprintln!("fuzz {}: {ran} inputs in {:.1} s", target.name, started.elapsed().as_secs_f64());
        }
    };
}

fuzz_test!(xml_bodies, "xml");
fuzz_test!(json_bodies, "json");
fuzz_test!(form_bodies_and_query_strings, "form");
fuzz_test!(bodies_without_a_content_type, "sniffed");
fuzz_test!(multipart_uploads, "upload");
fuzz_test!(batch_bodies_and_nested_requests, "batch");
fuzz_test!(beacon_frames, "beacon");
fuzz_test!(mqtt_ingest_payloads, "ingest");
fuzz_test!(advert_traces, "trace");

#[test]
fn the_harness_catches_a_panic_a_memory_blowup_and_records_the_input() {
    let panics = Target { name: "selftest-panic", run: |b| assert!(b.len() < 3, "too long"), tokens: &[] };
    assert!(check(&panics, b"ab").is_ok());
    let e = check(&panics, b"abcd").unwrap_err();
    assert!(e.contains("panicked: too long"), "{e}");
    let hungry = Target {
        name: "selftest-memory",
        run: |b| {
            std::hint::black_box(vec![0u8; memory_bound_bytes(b.len()) + 1]);
        },
        tokens: &[],
    };
    let e = check(&hungry, b"x").unwrap_err();
    assert!(e.contains("bytes at once"), "{e}");
    let _ = std::fs::remove_dir_all(root().join("target").join("fuzz-crashers").join("selftest-panic"));
    let _ = std::fs::remove_dir_all(root().join("target").join("fuzz-crashers").join("selftest-memory"));
}

#[test]
fn mutations_stay_within_bounds() {
    let m = vec![
        Mutation::Repeat(0, 3, 1_000_000),
        Mutation::Delete(5, 10),
        Mutation::Token(usize::MAX, 7),
        Mutation::Set(usize::MAX, 0),
        Mutation::Truncate(usize::MAX),
    ];
    let out = apply(b"{\"a\":[1]}".to_vec(), &m, JSON_TOKENS);
    assert!(out.len() <= INPUT_BYTES_MAX, "{}", out.len());
    assert!(apply(Vec::new(), &m, &[]).is_empty() || apply(Vec::new(), &m, &[]).len() < 64);
}
