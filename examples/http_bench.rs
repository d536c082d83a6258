//! HTTP load for bench/peers.py: keep-alive connections sending one request template as fast as
//! the server answers; every latency is recorded as measured (no correction, no invented
//! samples). Prints one JSON line: requests, requests/s, p50/p99/p99.9/max in microseconds,
//! statuses, and the client's own CPU use (to show it was not the bottleneck).
//!
//!   cargo run --release --example http_bench -- --addr 127.0.0.1:8080 --connections 32 \
//!       --seconds 10 --method GET --path '/contacts/{id}' --ids ids.txt \
//!       --header 'Authorization: Basic ...' [--body '{"name":"n{n}"}'] [--once]
//!
//! In the path and body, `{n}` becomes a number unique in the run (`{n15}` the same, 15 digits
//! with leading zeros) and `{id}` the next id of
//! `--ids` (one per line, taken in turn; with `--once` each id is used once and the run ends
//! when they are used up). hyper's HTTP/1.1 client on one tokio thread; bounded in time
//! (`--seconds`) and count (`--max-requests`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

#[derive(argh::FromArgs, Clone)]
/// HTTP keep-alive load with latencies as measured.
struct Args {
    /// server address, host:port
    #[argh(option)]
    addr: String,
    /// keep-alive connections
    #[argh(option, default = "1")]
    connections: usize,
    /// how long to send, seconds (after the warm-up)
    #[argh(option, default = "10.0")]
    seconds: f64,
    /// warm-up before measuring, seconds
    #[argh(option, default = "1.0")]
    warmup: f64,
    /// request method
    #[argh(option, default = "String::from(\"GET\")")]
    method: String,
    /// request path, with `{n}` and `{id}` substituted
    #[argh(option)]
    path: String,
    /// a request header, `Name: value` (repeatable)
    #[argh(option)]
    header: Vec<String>,
    /// request body template, with `{n}` and `{id}` substituted
    #[argh(option)]
    body: Option<String>,
    /// file of ids, one per line, for `{id}`
    #[argh(option)]
    ids: Option<String>,
    /// use each id once; stop when they are used up
    #[argh(switch)]
    once: bool,
    /// stop after this many requests in all (warm-up included)
    #[argh(option, default = "100_000_000")]
    max_requests: u64,
    /// the first number `{n}` takes (runs against one server use separate ranges)
    #[argh(option, default = "0")]
    n_base: u64,
    /// write the last path segment of each 201's Location header here, one per line
    #[argh(option)]
    locations_out: Option<String>,
}

/// What all connections share (one thread: no locks).
struct Shared {
    next: u64,
    ids: Vec<String>,
    once: bool,
    max_requests: u64,
}

impl Shared {
    /// The next request number and its id, or None when the run has used up its requests.
    fn take(&mut self) -> Option<(u64, String)> {
        let n = self.next;
        if n >= self.max_requests || (self.once && n as usize >= self.ids.len()) {
            return None;
        }
        self.next += 1;
        let id = if self.ids.is_empty() { String::new() } else { self.ids[n as usize % self.ids.len()].clone() };
        Some((n, id))
    }
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    locations: Vec<String>,
}

fn fill(template: &str, n: u64, id: &str) -> String {
    template.replace("{n15}", &format!("{n:015}")).replace("{n}", &n.to_string()).replace("{id}", id)
}

/// CPU seconds (user + system) this process has used.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

async fn connection(
    args: Rc<Args>,
    shared: Rc<RefCell<Shared>>,
    tally: Rc<RefCell<Tally>>,
    measure_from: Instant,
    end: Instant,
) {
    let stream = match tokio::net::TcpStream::connect(&args.addr).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("connect {}: {e}", args.addr);
            tally.borrow_mut().errors += 1;
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("handshake: {e}");
            tally.borrow_mut().errors += 1;
            return;
        }
    };
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    let headers: Vec<(String, String)> = args
        .header
        .iter()
        .filter_map(|h| h.split_once(':').map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
        .collect();
    loop {
        if Instant::now() >= end {
            return;
        }
        let Some((n, id)) = shared.borrow_mut().take() else { return };
        let path = fill(&args.path, args.n_base + n, &id);
        let body = args.body.as_deref().map(|b| fill(b, args.n_base + n, &id)).unwrap_or_default();
        let mut req = hyper::Request::builder().method(args.method.as_str()).uri(path).header("host", &args.addr);
        for (k, v) in &headers {
            req = req.header(k, v);
        }
        let req = match req.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("bad request template: {e}");
                return;
            }
        };
        if sender.ready().await.is_err() {
            tally.borrow_mut().errors += 1;
            return;
        }
        let started = Instant::now();
        let outcome = match sender.send_request(req).await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                if status == 201
                    && args.locations_out.is_some()
                    && let Some(id) =
                        resp.headers().get("location").and_then(|l| l.to_str().ok()).and_then(|l| l.rsplit('/').next())
                {
                    tally.borrow_mut().locations.push(id.to_string());
                }
                match resp.into_body().collect().await {
                    Ok(_) => Ok(status),
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        let done = Instant::now();
        let mut t = tally.borrow_mut();
        match outcome {
            Ok(status) if started >= measure_from => {
                t.latencies_us.push((done - started).as_micros().min(u32::MAX as u128) as u32);
                *t.statuses.entry(status).or_default() += 1;
            }
            Ok(_) => {}
            Err(e) => {
                t.errors += 1;
                if t.errors <= 3 {
                    eprintln!("request failed: {e}");
                }
                return;
            }
        }
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    let args: Args = argh::from_env();
    let ids = match &args.ids {
        Some(path) => std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        None => Vec::new(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let local = tokio::task::LocalSet::new();
    let args = Rc::new(args);
    let shared = Rc::new(RefCell::new(Shared { next: 0, ids, once: args.once, max_requests: args.max_requests }));
    let tally = Rc::new(RefCell::new(Tally::default()));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.seconds);
    let cpu_before = cpu_seconds();
    local.block_on(&runtime, async {
        let mut tasks = Vec::new();
        for _ in 0..args.connections {
            tasks.push(tokio::task::spawn_local(connection(
                Rc::clone(&args),
                Rc::clone(&shared),
                Rc::clone(&tally),
                measure_from,
                end,
            )));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let finished = Instant::now();
    let cpu = cpu_seconds() - cpu_before;
    let mut t = tally.take();
    t.latencies_us.sort_unstable();
    if let Some(path) = &args.locations_out {
        let text: String = t.locations.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    }
    let measured = finished.saturating_duration_since(measure_from).as_secs_f64().max(1e-9);
    let wall = finished.duration_since(start).as_secs_f64();
    let statuses: serde_json::Map<String, serde_json::Value> =
        t.statuses.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
    let out = serde_json::json!({
        "requests": t.latencies_us.len(),
        "issued": shared.borrow().next,
        "seconds": measured,
        "rps": t.latencies_us.len() as f64 / measured,
        "p50_us": percentile(&t.latencies_us, 50.0),
        "p99_us": percentile(&t.latencies_us, 99.0),
        "p999_us": percentile(&t.latencies_us, 99.9),
        "max_us": t.latencies_us.last().copied().unwrap_or(0),
        "statuses": statuses,
        "errors": t.errors,
        "client_cpu_share": cpu / wall.max(1e-9),
    });
    println!("{out}");
}
