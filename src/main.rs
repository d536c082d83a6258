//! sitegate: one process and one SQLite file serving a customer-records REST API (and, as the
//! product grows, BLE location, an MQTT feed and webhooks) on a site gateway.
//!
//! `main` parses the command line, runs the subcommand, and maps every failure to an exit
//! status in one place (78 for a configuration error, as systemd's RestartPreventExitStatus
//! expects).

mod alerts;
mod api;
mod auth;
mod certs;
mod cli;
mod config;
#[cfg(test)]
mod fuzz;
mod http;
mod limits;
mod location;
mod metrics;
mod model;
mod mqtt;
mod quota;
mod service;
mod store;
mod systemd;
mod timefmt;
mod webhooks;

use std::process::ExitCode;

use cli::{Cli, Command, GroupCommand, UserCommand};
use config::{Config, ConfigError};
use model::PrincipalKind;
use store::{NewUser, StoreError};

/// mimalloc for every Rust allocation: musl's allocator (in the static builds) cost a fifth
/// of a request's instructions and returned memory to the kernel on each burst (BENCHMARKS.md).
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The unit tests run on mimalloc too, through a wrapper that counts each thread's bytes (the
/// fuzz tests bound what one input may take).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: fuzz::Counting = fuzz::Counting;

/// Gives the memory this thread has freed back to the system. mimalloc keeps a thread's freed
/// pages for its next allocations: a worker that made a large answer and then waits held the
/// answer's memory for good (a burst of them: 140 MB, 53 MB with this; BENCHMARKS.md). Forced
/// (the gentle collect returned nothing) and so a matter of milliseconds: idle workers only.
pub fn release_freed_memory() {
    // SAFETY: mi_collect takes no pointers; it frees what this thread's heap no longer uses.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// musl's x86_64 memcpy has no short path and its memcmp compares a byte at a time: the
/// static builds take `memcpy` and `memmove` (x86_64) and `memcmp` and `bcmp` (x86_64,
/// aarch64) from `crates/fastmem` instead (BENCHMARKS.md, "Copies").
#[cfg(all(any(target_arch = "x86_64", target_arch = "aarch64"), target_env = "musl"))]
use fastmem as _;

/// Exit statuses (sysexits.h names).
const EX_USAGE: u8 = 64;
const EX_CONFIG: u8 = 78;
const EX_DATAERR: u8 = 65;

enum Failure {
    Config(ConfigError),
    Usage(String),
    Store(StoreError),
    Serve(service::ServeError),
    /// Input that cannot be used (a malformed trace or device list).
    Data(String),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

fn main() -> ExitCode {
    let cli = match parse_args() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if cli.version {
        println!("sitegate {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let Some(command) = cli.command else {
        fatal("no command given; `sitegate --help` lists them");
        return ExitCode::from(EX_USAGE);
    };
    if !matches!(command, Command::Serve(_)) {
        // A command whose output goes to a reader that stops early (`| head`) ends quietly, as
        // other commands do, instead of panicking on the write. The service keeps SIGPIPE
        // ignored: a client gone is an error on its socket, not the end of the process.
        // SAFETY: sets a signal's disposition to its default before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let (message, code) = match run(command) {
        Ok(()) => return ExitCode::SUCCESS,
        Err(Failure::Config(e)) => (format!("configuration error: {e}"), EX_CONFIG),
        Err(Failure::Usage(m)) => (m, EX_USAGE),
        // The database cannot be used as it is: starting again would fail the same way.
        Err(Failure::Store(e @ StoreError::Unusable(_)))
        | Err(Failure::Serve(service::ServeError::Store(e @ StoreError::Unusable(_)))) => (e.to_string(), EX_DATAERR),
        Err(Failure::Store(e)) => (e.to_string(), 1),
        Err(Failure::Serve(e)) => (e.to_string(), 1),
        Err(Failure::Data(m)) => (m, EX_DATAERR),
    };
    fatal(&message);
    ExitCode::from(code)
}

/// The command line, parsed as `argh::from_env` does, but a mistake in it exits 64 (usage),
/// as the other command-line mistakes do; `--help` prints to stdout and exits 0.
fn parse_args() -> Result<Cli, ExitCode> {
    let mut args = Vec::new();
    for arg in std::env::args_os() {
        match arg.into_string() {
            Ok(a) => args.push(a),
            Err(a) => {
                fatal(&format!("{} is not UTF-8 text", a.to_string_lossy()));
                return Err(ExitCode::from(EX_USAGE));
            }
        }
    }
    let name = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("sitegate")
        .to_string();
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    match <Cli as argh::FromArgs>::from_args(&[&name], &rest) {
        Ok(cli) => Ok(cli),
        Err(argh::EarlyExit { output, status: Ok(()) }) => {
            // `--help | head`: a reader gone early is no failure.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), format!("{output}\n").as_bytes());
            Err(ExitCode::SUCCESS)
        }
        Err(argh::EarlyExit { output, status: Err(()) }) => {
            fatal(output.trim_end());
            eprintln!("`{name} --help` lists the commands, `{name} COMMAND --help` their options");
            Err(ExitCode::from(EX_USAGE))
        }
    }
}

/// A message that ends the command, on stderr; under systemd with the journal's error
/// priority (`<3>`), as the log's errors have.
fn fatal(message: &str) {
    let priority = if systemd::logging_to_journal() { "<3>" } else { "" };
    eprintln!("{priority}sitegate: {message}");
}

fn init_logging(level: log::LevelFilter) {
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    // The broker's per-connection lines (every refused CONNECT, every dropped connection) at
    // info would flood the journal; sitegate logs what an operator acts on itself.
    builder.filter_module("rmqtt", level.min(log::LevelFilter::Warn));
    builder.filter_module("rmqtt_net", level.min(log::LevelFilter::Warn));
    // A session's refused subscriptions (too many, a bad filter) are the client's mistakes,
    // answered in its SUBACK: one line each would let one packet write thousands.
    builder.filter_module("rmqtt::session", level.min(log::LevelFilter::Error));
    // rustls warns of what clients send (an IP address as the server name, from every client
    // that connects by address, as the docs advise); the handshake's failure is what matters.
    builder.filter_module("rustls", level.min(log::LevelFilter::Error));
    // Under systemd the journal stamps each line and reads its priority from a `<N>` prefix
    // (sd-daemon(3)); on a terminal, lines carry their UTC time and level.
    let journal = systemd::logging_to_journal();
    builder.format(move |buf, record| {
        use std::io::Write;
        if journal {
            let priority = match record.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            writeln!(buf, "<{priority}>{}: {}", record.target(), record.args())
        } else {
            let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ");
            writeln!(buf, "{now} {} {}: {}", record.level(), record.target(), record.args())
        }
    });
    builder.parse_env("SITEGATE_LOG");
    let _ = builder.try_init();
}

fn load(path: Option<&std::path::Path>) -> Result<Config, Failure> {
    Ok(config::load(path)?)
}

fn org_of(config: &Config, org: Option<&str>) -> Result<String, Failure> {
    match org {
        None => Ok(config.default_org().id.clone()),
        Some(id) => config
            .org(id)
            .map(|o| o.id.clone())
            .ok_or_else(|| Failure::Usage(format!("no organisation {id:?} in the configuration"))),
    }
}

fn check_email(email: &str) -> Result<(), Failure> {
    let ok =
        model::looks_like_email(email) && email.len() <= limits::NAME_BYTES_MAX && !email.chars().any(char::is_control);
    if !ok {
        return Err(Failure::Usage(format!("{email:?} is not an e-mail address")));
    }
    // Basic authentication ends the user name at the first colon: such a user could never
    // log in.
    if email.contains(':') {
        return Err(Failure::Usage(format!(
            "{email:?}: a user's e-mail address cannot hold ':' (it could not log in)"
        )));
    }
    Ok(())
}

/// A user's or group's name: one line of text (`user list` and `group list` print a line
/// each, their columns separated by tabs).
fn check_name(name: &str) -> Result<(), Failure> {
    if name.trim().is_empty()
        || name.len() > limits::NAME_BYTES_MAX
        || model::check_text(name).is_err()
        || name.chars().any(char::is_control)
    {
        return Err(Failure::Usage("a name is 1 to 255 bytes of text on one line, without tabs".into()));
    }
    Ok(())
}

fn not_found(what: String) -> impl FnOnce(StoreError) -> Failure {
    move |e| match e {
        StoreError::NotFound => Failure::Usage(what),
        other => Failure::Store(other),
    }
}

/// The instance lock, for a command that needs the service stopped (`doing`: "restoring").
/// Another instance on the database is a runtime failure (exit 1), as for `serve`.
fn lock_stopped(config: &Config, doing: &str) -> Result<service::InstanceLock, Failure> {
    service::InstanceLock::acquire(&config.store.path).map_err(|e| match e {
        service::ServeError::AlreadyRunning(_) => Failure::Serve(service::ServeError::Io(format!(
            "the service is running on this database: stop it before {doing}"
        ))),
        other => Failure::Serve(other),
    })
}

/// A user command's failure: "no user", or that the user was deleted.
fn no_user<'a>(store: &'a store::Store, email: &'a str) -> impl FnOnce(StoreError) -> Failure + 'a {
    move |e| match e {
        StoreError::NotFound if store.user_deleted(email).unwrap_or(false) => Failure::Usage(format!(
            "user {email} is deleted (`sitegate user undelete --email {email}` brings them back)"
        )),
        StoreError::NotFound => Failure::Usage(format!("no user with e-mail {email}")),
        // The last administrator of an organisation, kept.
        StoreError::BadReference(m) => Failure::Usage(m),
        other => Failure::Store(other),
    }
}

/// For the user and group commands: the configuration, quiet logging, the store.
fn open_admin(path: Option<&std::path::Path>) -> Result<(Config, std::sync::Arc<store::Store>), Failure> {
    open_config(load(path)?)
}

fn open_config(config: Config) -> Result<(Config, std::sync::Arc<store::Store>), Failure> {
    init_logging(log::LevelFilter::Warn);
    let new = !config.store.path.exists();
    let store = service::open_store_current(&config)?;
    if new {
        // Said, so that a command run in the wrong folder (without --config) does not seem
        // to change the site while it made a database of its own.
        eprintln!(
            "sitegate: made a new database at {} ({})",
            config.store.path.display(),
            config.source.as_ref().map_or(
                "built-in defaults: no --config given, no ./config.toml".to_string(),
                |p| format!("from {}", p.display())
            )
        );
    }
    Ok((config, store))
}

/// As [`open_admin`], for commands that read or change what is there: where there is no
/// database yet, they say so rather than create an empty one (a wrong `--config`, or a
/// data folder gone, would otherwise look like a site without users or devices).
fn open_existing(path: Option<&std::path::Path>) -> Result<(Config, std::sync::Arc<store::Store>), Failure> {
    let config = load(path)?;
    no_database(&config)?;
    open_config(config)
}

/// The failure of a command that needs the database when there is none yet.
fn no_database(config: &Config) -> Result<(), Failure> {
    if let Some(why) = store::interrupted_restore(&config.store.path) {
        return Err(Failure::Store(StoreError::Unusable(why)));
    }
    if config.store.path.exists() {
        return Ok(());
    }
    Err(Failure::Store(StoreError::Internal(format!(
        "no database at {} (the service makes it at its first start; is this the right --config?)",
        config.store.path.display()
    ))))
}

/// Store errors a command-line user can fix are usage errors (exit 64).
fn usage(e: StoreError) -> Failure {
    match e {
        StoreError::Duplicate(m) | StoreError::BadReference(m) => Failure::Usage(m),
        other => Failure::Store(other),
    }
}

fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Serve(s) => {
            let config = load(s.config.as_deref())?;
            init_logging(config.log.level);
            service::serve(config).map_err(Failure::Serve)
        }
        Command::CheckConfig(c) => {
            let config = load(c.config.as_deref())?;
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Backup(b) => {
            let config = load(b.config.as_deref())?;
            init_logging(log::LevelFilter::Warn);
            no_database(&config)?;
            let copied = store::backup(&config.store.path, &b.out).map_err(usage)?;
            println!("backed up {} ({} bytes, schema {})", copied.path.display(), copied.bytes, copied.schema_version);
            Ok(())
        }
        Command::Restore(r) => {
            let config = load(r.config.as_deref())?;
            init_logging(log::LevelFilter::Warn);
            let _lock = lock_stopped(&config, "restoring")?;
            let kept = service::kept_path(&config.store.path, "before-restore");
            let (copied, kept) = store::restore(&config.store.path, &r.from, &kept).map_err(usage)?;
            if let Some(kept) = kept {
                println!("kept the previous database as {}", kept.display());
            }
            println!("restored {} ({} bytes, schema {})", copied.path.display(), copied.bytes, copied.schema_version);
            Ok(())
        }
        Command::Compact(c) => {
            let config = load(c.config.as_deref())?;
            init_logging(log::LevelFilter::Warn);
            // Before the lock, which would make the folder and the lock file of a database
            // that is not there (a wrong --config).
            no_database(&config)?;
            let _lock = lock_stopped(&config, "compacting")?;
            let (before, after) = store::compact(&config.store.path).map_err(Failure::Store)?;
            println!("compacted {}: {before} bytes -> {after} bytes", config.store.path.display());
            Ok(())
        }
        Command::Replay(r) => run_replay(r),
        Command::Survey(s) => run_survey(s),
        Command::Record(r) => run_record(r),
        Command::Device(d) => run_device(d.command),
        Command::Locations(l) => run_locations(l),
        Command::Erase(e) => {
            let rt = model::RecordType::from_segment(&e.record_type).ok_or_else(|| {
                Failure::Usage(format!(
                    "--type {}: not a record type (contacts, companies, projectblogs or tickets)",
                    e.record_type
                ))
            })?;
            let (_, store) = open_existing(e.config.as_deref())?;
            let erased = store.erase_record(rt, e.id).map_err(|err| match err {
                StoreError::NotFound => Failure::Usage(format!("no {} {}", e.record_type, e.id)),
                other => usage(other),
            })?;
            println!("erased {} {} ({} rows)", e.record_type, e.id, erased.rows);
            match erased.unsent_deliveries {
                0 => {}
                1 => println!(
                    "1 webhook delivery about it was not sent yet and went with it: its receiver will not hear \
                     of that change"
                ),
                n => println!(
                    "{n} webhook deliveries about it were not sent yet and went with it: their receivers will \
                     not hear of those changes"
                ),
            }
            Ok(())
        }
        Command::User(u) => run_user(u.command),
        Command::Group(g) => run_group(g.command),
        Command::MqttUser(m) => run_mqtt_user(m.command),
        Command::Cert(c) => run_cert(c.command),
    }
}

fn run_cert(command: cli::CertCommand) -> Result<(), Failure> {
    // The certificates' directory: --dir, else `certs/` beside the configuration file.
    let dir_of = |config: &Config, dir: Option<std::path::PathBuf>| {
        dir.unwrap_or_else(|| {
            config.source.as_deref().and_then(std::path::Path::parent).unwrap_or(std::path::Path::new("")).join("certs")
        })
    };
    let written = match command {
        cli::CertCommand::Init(i) => {
            // Only where the configuration file is: it is not checked, since it may name the
            // very files this makes (a check would refuse them as missing).
            let source = i.config.clone().or_else(|| {
                let local = std::path::Path::new("config.toml");
                local.is_file().then(|| local.to_path_buf())
            });
            if let Some(path) = &source
                && !path.is_file()
            {
                return Err(Failure::Usage(format!("configuration file {} does not exist", path.display())));
            }
            let dir = i.dir.unwrap_or_else(|| {
                let base = source.as_deref().map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
                base.as_deref().and_then(std::path::Path::parent).unwrap_or(std::path::Path::new("")).join("certs")
            });
            let mut hosts = i.host;
            if hosts.is_empty() {
                hosts = vec!["localhost".into(), "127.0.0.1".into()];
                let node = rustix::system::uname().nodename().to_string_lossy().into_owned();
                if !node.is_empty() && node != "localhost" {
                    hosts.push(node);
                }
            }
            mqtt::certs::init(&dir, &hosts, i.force).map_err(Failure::Usage)?
        }
        cli::CertCommand::Client(c) => {
            let config = load(c.config.as_deref())?;
            init_logging(log::LevelFilter::Warn);
            let name_ok = !c.name.is_empty()
                && c.name.len() <= 64
                && c.name.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-' | '_'))
                && !c.name.starts_with('.');
            if !name_ok {
                return Err(Failure::Usage("--name is 1..64 letters, digits, '.', '-' or '_'".into()));
            }
            if !config.organizations.iter().any(|o| o.id == c.org) {
                return Err(Failure::Usage(format!("no organisation {:?}", c.org)));
            }
            let dir = dir_of(&config, c.dir);
            let out = c.out.unwrap_or_else(|| dir.clone());
            mqtt::certs::client(&dir, &c.org, &c.name, c.receiver, &out).map_err(Failure::Usage)?
        }
    };
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

fn run_mqtt_user(command: cli::MqttUserCommand) -> Result<(), Failure> {
    match command {
        cli::MqttUserCommand::Add(a) => {
            let (_, store) = open_admin(a.config.as_deref())?;
            let name_ok = !a.username.is_empty()
                && a.username.chars().count() <= limits::MQTT_USERNAME_CHARS_MAX
                && !a.username.chars().any(char::is_control);
            if !name_ok {
                return Err(Failure::Usage(format!(
                    "a username is 1..={} characters without control characters",
                    limits::MQTT_USERNAME_CHARS_MAX
                )));
            }
            let password = auth::new_token();
            store
                .create_mqtt_user(&store::MqttUser {
                    username: a.username,
                    org: a.org,
                    receiver: a.receiver,
                    password_sha256: auth::token_hash(&password),
                    created: 0,
                })
                .map_err(usage)?;
            println!("{password}");
        }
        cli::MqttUserCommand::List(l) => {
            let (_, store) = open_existing(l.config.as_deref())?;
            for u in store.mqtt_users()? {
                println!("{}\t{}\t{}", u.username, u.org, if u.receiver { "receiver" } else { "" });
            }
        }
        cli::MqttUserCommand::Delete(d) => {
            let (_, store) = open_existing(d.config.as_deref())?;
            store
                .delete_mqtt_user(&d.username)
                .map_err(not_found(format!("no MQTT credentials with username {}", d.username)))?;
        }
    }
    Ok(())
}

/// A trace file (or standard input for `-`), buffered.
fn open_trace(path: &std::path::Path) -> Result<Box<dyn std::io::BufRead>, Failure> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(std::io::stdin().lock()));
    }
    let file = std::fs::File::open(path).map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))?;
    Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, file)))
}

/// The devices of a CSV file, or else of the database (then also the store).
fn replay_devices(
    config: &config::Config,
    devices: Option<&std::path::Path>,
) -> Result<(location::devices::Registry, Option<std::sync::Arc<store::Store>>), Failure> {
    Ok(match devices {
        Some(path) => {
            let file = std::fs::File::open(path)
                .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))?;
            let devices =
                location::devices::read_csv(file).map_err(|e| Failure::Data(format!("{}: {e}", path.display())))?;
            (location::devices::Registry::new((0..).zip(devices.into_iter().map(|(_, d)| d)).collect()), None)
        }
        None => {
            no_database(config)?;
            let store = service::open_store_current(config)?;
            let devices = store.devices(None)?.into_iter().map(|d| (d.id, d.device)).collect();
            (location::devices::Registry::new(devices), Some(store))
        }
    })
}

fn run_survey(s: cli::Survey) -> Result<(), Failure> {
    let config = load(s.config.as_deref())?;
    init_logging(log::LevelFilter::Warn);
    let marks = std::fs::File::open(&s.marks)
        .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", s.marks.display())))
        .and_then(|f| {
            location::survey::read_marks(std::io::BufReader::new(f), &config.site_map, &config.site.timezone)
                .map_err(|e| Failure::Data(format!("{}: {e}", s.marks.display())))
        })?;
    let (registry, _) = replay_devices(&config, s.devices.as_deref())?;
    let device = registry
        .slot_of_address(&s.device)
        .ok_or_else(|| Failure::Usage(format!("no device {:?} is registered", s.device)))?;
    let mut pipeline =
        location::replay::Pipeline::new(config.site_map.clone(), registry, config.location.engine.clone());
    let zones = location::survey::survey(open_trace(&s.trace)?, &mut pipeline, device, &marks)
        .map_err(|e| Failure::Data(format!("{}: {e}", s.trace.display())))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let missing = location::survey::write_fingerprints(&config.site_map, &zones, &mut out)
        .and_then(|missing| std::io::Write::flush(&mut out).map(|()| missing))
        .map_err(|e| Failure::Data(format!("standard output: {e}")))?;
    if missing == config.site_map.zones.len() {
        return Err(Failure::Data(format!(
            "no zone got a fingerprint: no receiver heard the tag {} during the marks (times without an offset are \
             local times of the site, {})",
            s.device,
            config.site.timezone.iana_name().unwrap_or("UTC")
        )));
    }
    if missing > 0 {
        eprintln!(
            "sitegate: {missing} zones have no fingerprint; the engine uses fingerprints only when every zone has one"
        );
    }
    Ok(())
}

fn run_replay(r: cli::Replay) -> Result<(), Failure> {
    let config = load(r.config.as_deref())?;
    init_logging(log::LevelFilter::Warn);
    let trace_error = |e: std::io::Error| Failure::Data(format!("{}: {e}", r.trace.display()));
    if r.store && r.devices.is_some() {
        return Err(Failure::Usage("--store uses the database's devices: leave out --devices".into()));
    }
    let (registry, store) = replay_devices(&config, r.devices.as_deref())?;
    let mut pipeline =
        location::replay::Pipeline::new(config.site_map.clone(), registry, config.location.engine.clone());
    let started = std::time::Instant::now();
    if r.store {
        let _lock = service::InstanceLock::acquire(&config.store.path).map_err(|e| match e {
            // As for `restore`: a state of the machine, not a mistake in the command line.
            service::ServeError::AlreadyRunning(_) => Failure::Serve(service::ServeError::Io(
                "the service is running on this database: stop it before replaying into it".into(),
            )),
            other => Failure::Serve(other),
        })?;
        let store = store.ok_or_else(|| Failure::Usage("no database".into()))?;
        let decisions =
            location::replay::replay_into_store(open_trace(&r.trace)?, &mut pipeline, &store).map_err(trace_error)?;
        eprintln!("sitegate: wrote {decisions} zone decisions into {}", config.store.path.display());
    } else {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        location::replay::replay(open_trace(&r.trace)?, &mut pipeline, &mut out)
            .and_then(|()| std::io::Write::flush(&mut out))
            .map_err(trace_error)?;
    }
    let c = pipeline.counts;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "sitegate: replayed {} adverts in {secs:.2} s ({:.0}/s; {} from receivers not in the site map, {} from unregistered devices)",
        c.adverts,
        c.adverts as f64 / secs.max(1e-9),
        c.unknown_receiver,
        c.unknown_device
    );
    Ok(())
}

fn run_device(command: cli::DeviceCommand) -> Result<(), Failure> {
    use location::devices::{Device, check_address, check_deviceid, default_deviceid, read_csv};
    match command {
        cli::DeviceCommand::Add(a) => {
            let (config, store) = open_admin(a.config.as_deref())?;
            let org = org_of(&config, a.org.as_deref())?;
            let address = check_address(&a.address).map_err(Failure::Usage)?;
            let deviceid = a.deviceid.unwrap_or_else(|| default_deviceid(&address));
            check_deviceid(&deviceid).map_err(Failure::Usage)?;
            let beacon = location::beacon::BeaconId::parse(&a.beacon).ok_or_else(|| {
                Failure::Usage(format!(
                    "{:?} is not ibeacon:UUID/MAJOR/MINOR, eddystone:NAMESPACE/INSTANCE or mac:AA:BB:CC:DD:EE:FF",
                    a.beacon
                ))
            })?;
            if let Some(t) = a.tagtype
                && config.site_map.tag_type(t).is_none()
            {
                return Err(Failure::Usage(format!("{t} is not a tag type of the site map")));
            }
            let device = Device {
                deviceaddress: address,
                deviceid,
                label: a.label,
                tagtype: a.tagtype,
                beacon,
                contactid: a.contact,
            };
            let stored = store.create_device(&org, &device).map_err(usage)?;
            println!("{}", stored.id);
        }
        cli::DeviceCommand::Import(i) => {
            let (config, store) = open_admin(i.config.as_deref())?;
            let org = org_of(&config, i.org.as_deref())?;
            let file = std::fs::File::open(&i.file)
                .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", i.file.display())))?;
            let refused = |lines: String| {
                Failure::Data(format!("{}: nothing imported; lines that cannot be:\n{lines}", i.file.display()))
            };
            let devices = read_csv(file).map_err(refused)?;
            let known_tag_type = |d: &Device| match d.tagtype {
                Some(t) if config.site_map.tag_type(t).is_none() => {
                    Err(format!("tagtype {t} is not a tag type of the site map"))
                }
                _ => Ok(()),
            };
            let n = store.import_devices(&org, &devices, known_tag_type).map_err(|e| match e {
                StoreError::BadReference(m) => refused(m),
                other => Failure::Store(other),
            })?;
            println!("imported {n} devices");
        }
        cli::DeviceCommand::List(l) => {
            let (_, store) = open_existing(l.config.as_deref())?;
            let mut out = csv::Writer::from_writer(std::io::stdout().lock());
            let io = |e: csv::Error| Failure::Data(e.to_string());
            out.write_record(["id", "org", "deviceaddress", "deviceid", "label", "tagtype", "beacon", "contactid"])
                .map_err(io)?;
            for d in store.devices(None)? {
                let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
                out.write_record([
                    d.id.to_string(),
                    d.org,
                    d.device.deviceaddress,
                    d.device.deviceid,
                    d.device.label,
                    opt(d.device.tagtype),
                    d.device.beacon.to_string(),
                    opt(d.device.contactid),
                ])
                .map_err(io)?;
            }
            out.flush().map_err(|e| Failure::Data(e.to_string()))?;
        }
        cli::DeviceCommand::Delete(d) => {
            let (config, store) = open_existing(d.config.as_deref())?;
            let org = org_of(&config, d.org.as_deref())?;
            store.delete_device(&org, d.id).map_err(not_found(format!("no device {} in {org}", d.id)))?;
        }
    }
    Ok(())
}

fn run_locations(l: cli::Locations) -> Result<(), Failure> {
    let (config, store) = open_existing(l.config.as_deref())?;
    let org = org_of(&config, l.org.as_deref())?;
    if l.purge {
        let n = store
            .purge_contact_locations(&org, l.contact)
            .map_err(not_found(format!("no contact {} in organisation {org}", l.contact)))?;
        println!(
            "forgot {n} rows of location data of contact {} (a device in a zone now stays placed there, as entered now)",
            l.contact
        );
        return Ok(());
    }
    let data = store
        .contact_locations(&org, l.contact)
        .map_err(not_found(format!("no contact {} in organisation {org}", l.contact)))?;
    let doc = api::location::contact_locations_out(&config.site_map, &config.site.timezone, l.contact, &data);
    println!("{}", api::output::to_json(&api::members(doc)));
    Ok(())
}

/// Writes adverts as trace lines.
struct TraceSink {
    out: Box<dyn std::io::Write + Send>,
    failed: bool,
}

impl location::ble::Sink for TraceSink {
    fn put(&mut self, advert: location::beacon::Advert) -> bool {
        if !self.failed && location::trace::write_advert(&mut self.out, &advert).is_err() {
            self.failed = true;
        }
        !self.failed
    }
}

fn run_record(r: cli::Record) -> Result<(), Failure> {
    let config = load(r.config.as_deref())?;
    init_logging(config.log.level);
    let out: Box<dyn std::io::Write + Send> = if r.out.as_os_str() == "-" {
        Box::new(std::io::LineWriter::new(std::io::stdout()))
    } else {
        let file = std::fs::File::create(&r.out)
            .map_err(|e| Failure::Usage(format!("cannot write {}: {e}", r.out.display())))?;
        Box::new(std::io::LineWriter::new(file))
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Data(format!("cannot start the runtime: {e}")))?;
    let state = std::sync::Arc::new(location::ble::ScanState::default());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let settings = location::ble::BleSettings {
        adapter: config.location.adapter.clone(),
        watchdog: std::time::Duration::from_secs(config.location.scan_watchdog_s),
    };
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(t), Ok(i)) => (t, i),
            _ => return,
        };
        let scan =
            tokio::spawn(location::ble::run(settings, TraceSink { out, failed: false }, state.clone(), stop.clone()));
        let limit = async {
            match r.seconds {
                Some(s) => tokio::time::sleep(std::time::Duration::from_secs(s)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
            _ = limit => {},
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), scan).await;
    });
    eprintln!("sitegate: recorded {} adverts", state.adverts.load(std::sync::atomic::Ordering::Relaxed));
    Ok(())
}

fn run_user(command: UserCommand) -> Result<(), Failure> {
    match command {
        UserCommand::Add(a) => {
            let (config, store) = open_admin(a.config.as_deref())?;
            check_email(&a.email)?;
            check_name(&a.name)?;
            let org = org_of(&config, a.org.as_deref())?;
            let token = auth::new_token();
            store
                .create_user(&NewUser {
                    org: &org,
                    email: &a.email,
                    name: a.name.trim(),
                    admin: a.admin,
                    prevent_private: a.prevent_private_data,
                    groups: &a.group,
                    token_sha256: &auth::token_hash(&token),
                })
                .map_err(usage)?;
            println!("{token}");
        }
        UserCommand::Token(t) => {
            let (_, store) = open_existing(t.config.as_deref())?;
            let token = auth::new_token();
            store.set_token(&t.email, &auth::token_hash(&token)).map_err(no_user(&store, &t.email))?;
            println!("{token}");
        }
        UserCommand::List(l) => {
            let (_, store) = open_existing(l.config.as_deref())?;
            println!("id\torg\temail\tname\tflags");
            for p in store.all_principals()?.iter().filter(|p| p.kind == PrincipalKind::User) {
                let flags: Vec<&str> = [
                    (p.admin, "admin"),
                    (p.prevent_login, "disabled"),
                    (p.prevent_private, "no-private-data"),
                    (p.deleted, "deleted"),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, name)| *name)
                .collect();
                println!("{}\t{}\t{}\t{}\t{}", p.id, p.org, p.email, p.name, flags.join(","));
            }
        }
        UserCommand::Disable(d) => {
            let (_, store) = open_existing(d.config.as_deref())?;
            store.disable_user(&d.email, true).map_err(no_user(&store, &d.email))?;
        }
        UserCommand::Admin(a) => {
            let (_, store) = open_existing(a.config.as_deref())?;
            store.set_admin(&a.email, !a.revoke).map_err(|e| match e {
                StoreError::BadReference(m) => Failure::Usage(m),
                other => no_user(&store, &a.email)(other),
            })?;
        }
        UserCommand::Enable(d) => {
            let (_, store) = open_existing(d.config.as_deref())?;
            store.disable_user(&d.email, false).map_err(no_user(&store, &d.email))?;
        }
        UserCommand::Delete(d) => {
            let (_, store) = open_existing(d.config.as_deref())?;
            store.delete_user(&d.email).map_err(no_user(&store, &d.email))?;
        }
        UserCommand::Undelete(u) => {
            let (_, store) = open_existing(u.config.as_deref())?;
            let token = auth::new_token();
            store.undelete_user(&u.email, &auth::token_hash(&token)).map_err(|e| match e {
                StoreError::NotFound => Failure::Usage(format!("no deleted user with e-mail {}", u.email)),
                other => Failure::Store(other),
            })?;
            println!("{token}");
        }
    }
    Ok(())
}

fn run_group(command: GroupCommand) -> Result<(), Failure> {
    match command {
        GroupCommand::Add(a) => {
            let (config, store) = open_admin(a.config.as_deref())?;
            check_name(&a.name)?;
            if let Some(email) = &a.email {
                check_email(email)?;
            }
            let org = org_of(&config, a.org.as_deref())?;
            let id = store.create_group(&org, a.name.trim(), a.email.as_deref().unwrap_or("")).map_err(usage)?;
            println!("{id}");
        }
        GroupCommand::Member(m) => {
            let (_, store) = open_existing(m.config.as_deref())?;
            if m.remove {
                store.remove_member(m.group, &m.email).map_err(usage)?;
            } else {
                store.add_member(m.group, &m.email).map_err(usage)?;
            }
        }
        GroupCommand::List(l) => {
            let (_, store) = open_existing(l.config.as_deref())?;
            println!("id\torg\tname\temail\tflags");
            for p in store.all_principals()?.iter().filter(|p| p.kind == PrincipalKind::Group) {
                println!("{}\t{}\t{}\t{}\t{}", p.id, p.org, p.name, p.email, if p.deleted { "deleted" } else { "" });
            }
        }
        GroupCommand::Delete(d) => {
            let (_, store) = open_existing(d.config.as_deref())?;
            let (records, members) = store.delete_group(d.group).map_err(|e| match e {
                StoreError::BadReference(m) => Failure::Usage(m),
                other => not_found(format!("no group {}", d.group))(other),
            })?;
            eprintln!(
                "sitegate: group {} deleted: it owns {records} records, which its {members} members no longer see \
                 through it (`sitegate group undelete --group {}` brings it back)",
                d.group, d.group
            );
        }
        GroupCommand::Undelete(u) => {
            let (_, store) = open_existing(u.config.as_deref())?;
            store.undelete_group(u.group).map_err(|e| match e {
                StoreError::BadReference(m) | StoreError::Duplicate(m) => Failure::Usage(m),
                other => not_found(format!("no group {}", u.group))(other),
            })?;
        }
    }
    Ok(())
}
