//! Test support: start the real `sitegate` binary on 127.0.0.1:0 in its own directory, talk
//! HTTP to it as a client would, run its CLI, compare responses with golden files.
//!
//! Each test's directory is `target/tmp/it/<test>`; it is emptied when the test starts and
//! left behind afterwards, so a failed run can be inspected and the service restarted by hand
//! (`target/debug/sitegate serve --config target/tmp/it/<test>/config.toml`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_sitegate");

/// A command running sitegate: the binary cargo built, or `$SITEGATE_BIN` (another build, such
/// as the aarch64 one) run through `$SITEGATE_RUNNER` (such as `qemu-aarch64-static -cpu
/// cortex-a53`) when set.
pub fn sitegate() -> Command {
    let bin = std::env::var("SITEGATE_BIN").unwrap_or_else(|_| BIN.to_string());
    match std::env::var("SITEGATE_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut cmd = Command::new(words.next().unwrap());
            cmd.args(words).arg(bin);
            cmd
        }
        _ => Command::new(bin),
    }
}

/// Generous: the service starts in well under a second, but CI machines stall.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// The configuration every test service gets unless a test adds to it.
pub const BASE_CONFIG: &str = r#"
[http]
listen = "127.0.0.1:0"
workers = 2

[store]
path = "data/sitegate.db"

[mqtt]
listen = "127.0.0.1:0"

[webhooks]
# The tests' receivers are on loopback.
local_targets = true

[site]
timezone = "UTC"

[[organizations]]
id = "acme"
name = "Acme Facilities"

[[organizations]]
id = "globex"
name = "Globex Buildings"

[[fields]]
id = 1001
label = "Customer number"
type = "text"
record_types = ["contacts", "companies"]

[[fields]]
id = 1002
label = "Tier"
type = "select"
options = ["Gold", "Silver"]
record_types = ["contacts"]

[[fields]]
id = 1003
label = "Contract end"
type = "date"

[[fields]]
id = 1004
label = "Seats"
type = "number"
record_types = ["companies"]
"#;

/// A fresh directory for one test: under cargo's target tmp dir, or `$SITEGATE_TEST_TMPDIR`
/// (for long runs that should not share directories with other test runs).
pub fn test_dir(name: &str) -> PathBuf {
    let root = std::env::var_os("SITEGATE_TEST_TMPDIR")
        .map_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("it"), PathBuf::from);
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

#[derive(Clone, Debug)]
pub struct Account {
    pub email: String,
    pub token: String,
}

pub struct Service {
    child: Child,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub addr: SocketAddr,
    pub ready_line: String,
    pub admin: Account,
    stderr: Arc<Mutex<String>>,
}

pub struct Options<'a> {
    pub config: &'a str,
    pub env: Vec<(&'a str, &'a str)>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options { config: BASE_CONFIG, env: Vec::new() }
    }
}

impl Service {
    pub fn start(name: &str) -> Service {
        Service::start_with(name, Options::default())
    }

    pub fn start_with(name: &str, options: Options<'_>) -> Service {
        let dir = test_dir(name);
        let config = dir.join("config.toml");
        std::fs::write(&config, options.config).expect("write config");
        Service::launch(dir, config, &options.env)
    }

    /// Starts the binary on an existing directory and configuration (a restart).
    pub fn launch(dir: PathBuf, config: PathBuf, env: &[(&str, &str)]) -> Service {
        let mut cmd = sitegate();
        cmd.arg("serve").arg("--config").arg(&config);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Service::launch_command(dir, config, cmd)
    }

    /// Starts `cmd`, which runs `sitegate serve` on `dir` and `config` (in a wrapper).
    pub fn launch_command(dir: PathBuf, config: PathBuf, mut cmd: Command) -> Service {
        let fresh = !dir.join("data").join("sitegate.db").exists();
        cmd.current_dir(&dir);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().expect("spawn sitegate");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let ready_line = match rx.recv_timeout(START_DEADLINE) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("sitegate did not print its ready line; stderr:\n{}", log.lock().unwrap());
            }
        };
        assert!(ready_line.starts_with("ready http="), "unexpected first line: {ready_line}");
        let addr: SocketAddr = ready_line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .and_then(|a| a.parse().ok())
            .expect("http address in the ready line");
        // The first start prints the administrator's token on stderr (read by another thread).
        let admin = if fresh {
            let token = wait_for("the administrator's token on stderr", || {
                let text = log.lock().unwrap().clone();
                text.lines().find_map(|l| l.strip_prefix("sitegate: admin token: ")).map(str::to_string)
            });
            Account { email: "admin@sitegate.local".into(), token }
        } else {
            Account { email: "admin@sitegate.local".into(), token: String::new() }
        };
        Service { child, dir, config, addr, ready_line, admin, stderr: log }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Runs a CLI command against this service's configuration.
    pub fn cli(&self, args: &[&str]) -> Output {
        cli_with_config(&self.config, args)
    }

    /// `sitegate user add`, returning the new account.
    pub fn add_user(&self, email: &str, name: &str, extra: &[&str]) -> Account {
        let mut args = vec!["user", "add", "--email", email, "--name", name];
        args.extend_from_slice(extra);
        let out = self.cli(&args);
        assert!(out.status.success(), "user add failed: {}", String::from_utf8_lossy(&out.stderr));
        let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert_eq!(token.len(), 64, "token: {token}");
        Account { email: email.into(), token }
    }

    /// `sitegate group add`, returning the new group id.
    pub fn add_group(&self, name: &str, extra: &[&str]) -> i64 {
        let mut args = vec!["group", "add", "--name", name];
        args.extend_from_slice(extra);
        let out = self.cli(&args);
        assert!(out.status.success(), "group add failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().parse().expect("group id")
    }

    pub fn client(&self, account: &Account) -> Client {
        Client { addr: self.addr, auth: Some(basic(&account.email, &account.token)) }
    }

    pub fn admin_client(&self) -> Client {
        self.client(&self.admin)
    }

    pub fn anonymous(&self) -> Client {
        Client { addr: self.addr, auth: None }
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status code.
    pub fn terminate(mut self) -> Option<i32> {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("sitegate did not stop after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // A failing test shows what the service said (its last 8 KB), to tell why.
        if std::thread::panicking() {
            let said = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
            let from = said.len().saturating_sub(8_192);
            let from = (from..said.len()).find(|&i| said.is_char_boundary(i)).unwrap_or(said.len());
            eprintln!("--- the service's stderr (last 8 KB) ---\n{}", &said[from..]);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn cli_with_config(config: &Path, args: &[&str]) -> Output {
    let mut full: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    // `--config` goes after the subcommand path (`user add --config ...`).
    let insert_at = full.iter().position(|a| a.starts_with("--")).unwrap_or(full.len());
    full.insert(insert_at, config.display().to_string());
    full.insert(insert_at, "--config".into());
    sitegate().args(&full).output().expect("run sitegate")
}

pub fn basic(email: &str, token: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{email}:{token}")))
}

/// Where libfaketime is (Debian's `faketime` package; the test script installs it).
pub fn libfaketime() -> String {
    for dir in ["/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime", "/usr/lib/faketime"] {
        let p = Path::new(dir).join("libfaketimeMT.so.1");
        if p.exists() {
            return p.display().to_string();
        }
    }
    panic!("libfaketime is missing: install Debian's `faketime` package (scripts/test does)");
}

/// A wall clock a test can step: the service runs under libfaketime (without its thread-safe
/// locking, which does not read the file again), which reads the offset from `offset` at
/// every look; the monotonic clock runs as it does.
pub struct SteppedClock {
    pub offset: PathBuf,
    lib: String,
    file: String,
}

impl SteppedClock {
    pub fn new(name: &str) -> SteppedClock {
        let offset = test_dir(name).join("offset");
        std::fs::write(&offset, "+0").unwrap();
        let file = offset.display().to_string();
        SteppedClock { offset, lib: libfaketime().replace("libfaketimeMT", "libfaketime"), file }
    }

    /// The service's environment for it.
    pub fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("LD_PRELOAD", self.lib.as_str()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.as_str()),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ]
    }
}

/// Polls `f` until it returns `Some`, failing after a generous deadline.
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// A request as a client writes it.
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn new(method: &str, path: &str) -> Req {
        Req { method: method.into(), path: path.into(), headers: Vec::new(), body: Vec::new() }
    }

    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn json(self) -> Req {
        self.header("Accept", "application/json")
    }

    pub fn body(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Req {
        self.body = body.into();
        self.header("Content-Type", content_type)
    }

    pub fn xml_body(self, body: &str) -> Req {
        self.body("application/xml", body)
    }

    pub fn json_body(self, body: &str) -> Req {
        self.body("application/json", body)
    }

    pub fn form_body(self, body: &str) -> Req {
        self.body("application/x-www-form-urlencoded", body)
    }
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The text of the first `<name>` element in an XML body.
    pub fn xml_text(&self, name: &str) -> Option<String> {
        let open = format!("<{name}>");
        let start = self.body.find(&open)? + open.len();
        let end = self.body[start..].find(&format!("</{name}>"))? + start;
        Some(self.body[start..end].to_string())
    }

    /// The response as a golden file holds it: status, the headers that matter, body; times
    /// redacted.
    pub fn golden(&self) -> String {
        let mut out = format!("{}\n", self.status);
        for name in ["Content-Type", "Location", "Http-X-Service-Api-Call-Limit", "WWW-Authenticate", "Allow"] {
            if let Some(v) = self.header(name) {
                out.push_str(&format!("{name}: {v}\n"));
            }
        }
        out.push('\n');
        let is_json = self.header("Content-Type").is_some_and(|ct| ct.contains("json"));
        let body = match serde_json::from_str::<Value>(&self.body) {
            // Pretty-printed for review; key order is kept as sent.
            Ok(v) if is_json => serde_json::to_string_pretty(&v).unwrap(),
            _ => self.body.clone(),
        };
        out.push_str(&redact(&body));
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out
    }

    #[track_caller]
    pub fn assert_status(&self, status: u16) -> &Resp {
        assert_eq!(self.status, status, "body: {}", self.body);
        self
    }
}

/// Replaces what changes from run to run: ISO times, Unix times, `Mon D, YYYY HH:MM:SS` times.
pub fn redact(text: &str) -> String {
    use std::sync::OnceLock;
    static RULES: OnceLock<Vec<(regex::Regex, &'static str)>> = OnceLock::new();
    let rules = RULES.get_or_init(|| {
        vec![
            (regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\+|%2B)00:00").unwrap(), "[TIME]"),
            (regex::Regex::new(r"date\]=1[6-9]\d{8}").unwrap(), "date]=[UNIX]"),
            (regex::Regex::new(r"(>|: ?\x22)1[6-9]\d{8}(<|\x22)").unwrap(), "${1}[UNIX]${2}"),
            (regex::Regex::new(r"[A-Z][a-z]{2} \d{1,2}, \d{4} \d\d:\d\d:\d\d").unwrap(), "[DATE]"),
        ]
    });
    let mut out = text.to_string();
    for (re, with) in rules {
        out = re.replace_all(&out, *with).into_owned();
    }
    out
}

/// A minimal HTTP/1.1 client over one TCP connection per request. The tests use it instead
/// of a client library so that they control every byte (misspelt headers, GET bodies, no
/// redirects, no retries) and see framing as sent (Content-Length, no chunking).
pub struct Client {
    pub addr: SocketAddr,
    pub auth: Option<String>,
}

impl Client {
    pub fn call(&self, req: Req) -> Resp {
        raw_exchange(self.addr, &self.request_bytes(req))
    }

    /// Like `call`, but a refused or broken connection is an error, not a panic (for tests
    /// that stop the service under load).
    pub fn try_call(&self, req: Req) -> std::io::Result<Resp> {
        let bytes = self.request_bytes(req);
        let mut stream = TcpStream::connect(self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.write_all(&bytes)?;
        try_read_response(&mut stream)
    }

    fn request_bytes(&self, req: Req) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", req.method, req.path, self.addr);
        if let Some(auth) = &self.auth
            && !req.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        {
            head.push_str(&format!("Authorization: {auth}\r\n"));
        }
        for (k, v) in &req.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !req.body.is_empty() || matches!(req.method.as_str(), "POST" | "PUT") {
            head.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&req.body);
        bytes
    }

    pub fn get(&self, path: &str) -> Resp {
        self.call(Req::new("GET", path))
    }

    pub fn get_json(&self, path: &str) -> Resp {
        self.call(Req::new("GET", path).json())
    }

    pub fn post_xml(&self, path: &str, body: &str) -> Resp {
        self.call(Req::new("POST", path).xml_body(body))
    }

    pub fn post_json(&self, path: &str, body: &str) -> Resp {
        self.call(Req::new("POST", path).json_body(body).json())
    }

    pub fn put_xml(&self, path: &str, body: &str) -> Resp {
        self.call(Req::new("PUT", path).xml_body(body))
    }

    pub fn put_json(&self, path: &str, body: &str) -> Resp {
        self.call(Req::new("PUT", path).json_body(body).json())
    }

    pub fn delete(&self, path: &str) -> Resp {
        self.call(Req::new("DELETE", path))
    }

    /// Creates a record from JSON fields; returns its id.
    #[track_caller]
    pub fn create(&self, segment: &str, body: &str) -> i64 {
        let r = self.post_json(&format!("/{segment}"), body);
        assert_eq!(r.status, 201, "create {segment} {body}: {}", r.body);
        r.json()["item"]["id"].as_i64().expect("item id")
    }

    /// Creates an activity from a JSON body; returns its id.
    #[track_caller]
    pub fn create_activity(&self, segment: &str, body: &str) -> i64 {
        let r = self.post_json(&format!("/contacts/{segment}"), body);
        assert_eq!(r.status, 201, "create {segment} {body}: {}", r.body);
        r.json()["id"].as_i64().expect("activity id")
    }

    /// The ids a JSON list answers, in order.
    #[track_caller]
    pub fn list_ids(&self, path: &str) -> Vec<i64> {
        let r = self.get_json(path);
        assert_eq!(r.status, 200, "list {path}: {}", r.body);
        let v = r.json();
        v.as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.bytes().all(|b| b.is_ascii_digit()))
            .map(|(k, _)| k.parse().unwrap())
            .collect()
    }
}

/// Writes raw bytes, reads one response (by Content-Length; fails on chunked encoding).
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Resp {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    stream.write_all(bytes).expect("write request");
    read_response(&mut stream)
}

pub fn read_response(stream: &mut TcpStream) -> Resp {
    try_read_response(stream).expect("a complete response")
}

pub fn try_read_response(stream: &mut TcpStream) -> std::io::Result<Resp> {
    use std::io::{Error, ErrorKind};
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::new(ErrorKind::InvalidData, format!("bad status line: {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').ok_or_else(|| Error::new(ErrorKind::InvalidData, "bad header"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let find = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone());
    assert!(find("Transfer-Encoding").is_none(), "a chunked response");
    let length: usize = find("Content-Length").expect("every response has a Content-Length").parse().unwrap();
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    Ok(Resp { status, headers, body: String::from_utf8(body).expect("UTF-8 body") })
}

/// Percent-encodes a query value.
pub fn q(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A golden transcript: each step's request (method, path, body) and response (status,
/// headers that matter, body with times redacted), compared as a whole with a golden file.
#[derive(Default)]
pub struct Transcript {
    pub text: String,
}

impl Transcript {
    pub fn new() -> Transcript {
        Transcript::default()
    }

    /// Sends the request, records it and its response, returns the response.
    pub fn step(&mut self, client: &Client, req: Req) -> Resp {
        let mut title = format!("### {} {}", req.method, req.path);
        for (k, v) in &req.headers {
            title.push_str(&format!("\n{k}: {v}"));
        }
        self.text.push_str(&title);
        self.text.push('\n');
        if !req.body.is_empty() {
            self.text.push_str(&String::from_utf8_lossy(&req.body));
            self.text.push('\n');
        }
        let resp = client.call(req);
        self.text.push_str("--- response\n");
        self.text.push_str(&resp.golden());
        self.text.push('\n');
        resp
    }
}

/// A webhook receiver inside the test process: an HTTP server on 127.0.0.1 that records what
/// it is sent and answers with the status it is told. It can be taken down (connections
/// refused) and brought up again on the same port, or stall (read requests, never answer).
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
}

#[derive(Default)]
struct ReceiverState {
    received: Mutex<Vec<Received>>,
    status: std::sync::atomic::AtomicU16,
    down: std::sync::atomic::AtomicBool,
    stall: std::sync::atomic::AtomicBool,
    /// Requests held unanswered now, and the most at once since the last reset.
    stalled_now: std::sync::atomic::AtomicUsize,
    stalled_max: std::sync::atomic::AtomicUsize,
    /// How long it takes to answer (a slow receiver), in milliseconds.
    delay_ms: std::sync::atomic::AtomicU64,
}

#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The status the receiver answered.
    pub answered: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind receiver");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ReceiverState::default());
        state.status.store(200, std::sync::atomic::Ordering::SeqCst);
        Receiver::serve(listener, Arc::clone(&state));
        Receiver { addr, state }
    }

    fn serve(listener: std::net::TcpListener, state: Arc<ReceiverState>) {
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            loop {
                if state.down.load(std::sync::atomic::Ordering::SeqCst) {
                    return; // drops the listener: connections are refused
                }
                match listener.accept() {
                    Ok((stream, _)) => {
                        let state = Arc::clone(&state);
                        std::thread::spawn(move || Receiver::handle(stream, &state));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
    }

    fn handle(mut stream: TcpStream, state: &ReceiverState) {
        stream.set_nonblocking(false).ok();
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 {
                    return;
                }
                let h = h.trim_end().to_string();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_string(), v.trim().to_string()));
                }
            }
            let length: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            if state.stall.load(std::sync::atomic::Ordering::SeqCst) {
                Receiver::hold(&stream, state, Received { path, headers, body, answered: 0 });
                return;
            }
            let status = state.status.load(std::sync::atomic::Ordering::SeqCst);
            state.received.lock().unwrap().push(Received { path, headers, body, answered: status });
            std::thread::sleep(Duration::from_millis(state.delay_ms.load(std::sync::atomic::Ordering::SeqCst)));
            let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok");
            if stream.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    }

    /// Holds a request unanswered while stalling, until the client gives up; then closes.
    fn hold(stream: &TcpStream, state: &ReceiverState, request: Received) {
        use std::sync::atomic::Ordering::SeqCst;
        state.received.lock().unwrap().push(request);
        let now = state.stalled_now.fetch_add(1, SeqCst) + 1;
        state.stalled_max.fetch_max(now, SeqCst);
        stream.set_read_timeout(Some(Duration::from_millis(20))).ok();
        while state.stall.load(SeqCst) {
            match stream.peek(&mut [0u8; 1]) {
                Ok(0) => break, // the client closed the connection
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        state.stalled_now.fetch_sub(1, SeqCst);
    }

    /// Answers each request only after this long (a slow receiver).
    pub fn answer_after(&self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stalls: from now on requests are read and never answered (or answers again).
    pub fn stall(&self, on: bool) {
        self.state.stall.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// The most requests held unanswered at once since the last call.
    pub fn take_stalled_max(&self) -> usize {
        use std::sync::atomic::Ordering::SeqCst;
        self.state.stalled_max.swap(self.state.stalled_now.load(SeqCst), SeqCst)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answers every following request with this status.
    pub fn answer(&self, status: u16) {
        self.state.status.store(status, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// The requests it accepted (answered 2xx).
    pub fn accepted(&self) -> Vec<Received> {
        self.received().into_iter().filter(|r| (200..300).contains(&r.answered)).collect()
    }

    /// Waits until `n` requests were accepted; returns them.
    pub fn wait_accepted(&self, n: usize) -> Vec<Received> {
        wait_for(&format!("{n} accepted deliveries"), || {
            let got = self.accepted();
            (got.len() >= n).then_some(got)
        })
    }

    /// Takes the receiver down: new connections are refused.
    pub fn take_down(&self) {
        self.state.down.store(true, std::sync::atomic::Ordering::SeqCst);
        wait_for("the receiver to go down", || TcpStream::connect(self.addr).is_err().then_some(()));
    }

    /// Brings it up again on the same port.
    pub fn bring_up(&self) {
        self.state.down.store(false, std::sync::atomic::Ordering::SeqCst);
        let listener = wait_for("the receiver's port", || std::net::TcpListener::bind(self.addr).ok());
        Receiver::serve(listener, Arc::clone(&self.state));
    }
}
