//! systemd integration without libsystemd: the sd_notify protocol (one datagram per message
//! to the unix socket named by `$NOTIFY_SOCKET`, a path or an abstract name starting with `@`)
//! and the watchdog interval from `$WATCHDOG_USEC`.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends state changes to systemd; does nothing when not started by systemd.
pub struct Notifier {
    target: Option<Target>,
}

enum Target {
    Path(std::path::PathBuf),
    #[cfg(target_os = "linux")]
    Abstract(Vec<u8>),
}

impl Notifier {
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|v| {
            let bytes = v.as_encoded_bytes();
            match bytes.first() {
                #[cfg(target_os = "linux")]
                Some(b'@') => Some(Target::Abstract(bytes[1..].to_vec())),
                Some(b'/') => Some(Target::Path(std::path::PathBuf::from(v))),
                _ => None,
            }
        });
        Notifier { target }
    }

    /// Sends one message, e.g. `READY=1\nSTATUS=serving`. Failures are logged, not fatal.
    pub fn notify(&self, state: &str) {
        let Some(target) = &self.target else { return };
        let result = UnixDatagram::unbound().and_then(|sock| match target {
            Target::Path(p) => sock.send_to(state.as_bytes(), p).map(|_| ()),
            #[cfg(target_os = "linux")]
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr).map(|_| ())
            }
        });
        if let Err(e) = result {
            log::warn!("cannot notify systemd ({state:?}): {e}");
        }
    }
}

/// While the database opens (migrations, with their backup, may take minutes on a large one):
/// asks systemd every `SYSTEMD_START_EXTEND_EVERY_MS` for `SYSTEMD_START_EXTEND_BY_MS` more
/// start time, for at most `SYSTEMD_START_EXTEND_MAX_MS` in all.
pub struct StartExtender {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl StartExtender {
    pub fn start(notifier: std::sync::Arc<Notifier>) -> std::io::Result<StartExtender> {
        use crate::limits::{SYSTEMD_START_EXTEND_EVERY_MS, SYSTEMD_START_EXTEND_MAX_MS};
        StartExtender::start_every(
            notifier,
            Duration::from_millis(SYSTEMD_START_EXTEND_EVERY_MS),
            Duration::from_millis(SYSTEMD_START_EXTEND_MAX_MS),
        )
    }

    fn start_every(
        notifier: std::sync::Arc<Notifier>,
        every: Duration,
        max: Duration,
    ) -> std::io::Result<StartExtender> {
        use crate::limits::SYSTEMD_START_EXTEND_BY_MS;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("start-extender".into()).spawn(move || {
            let began = std::time::Instant::now();
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                if began.elapsed() >= max {
                    log::warn!(
                        "the database has been opening for {} s; systemd is not asked to wait longer",
                        began.elapsed().as_secs()
                    );
                    return;
                }
                log::info!("the database is still opening (migrating) after {} s", began.elapsed().as_secs());
                notifier.notify(&format!(
                    "EXTEND_TIMEOUT_USEC={}\nSTATUS=opening the database (migrating)",
                    SYSTEMD_START_EXTEND_BY_MS * 1000
                ));
            }
        })?;
        Ok(StartExtender { stop, thread })
    }

    pub fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, when the watchdog is meant for
/// this process (`$WATCHDOG_PID` absent or ours).
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok()? != std::process::id()
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Whether stderr goes to the journal (systemd sets `$JOURNAL_STREAM` for the service).
pub fn logging_to_journal() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While the database opens, systemd hears that more start time is needed, and hears no
    /// more of it once the opening is over.
    #[test]
    fn a_long_start_asks_for_more_time_until_it_is_over() {
        let dir = std::env::temp_dir().join(format!("sitegate-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("notify");
        let listener = UnixDatagram::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let notifier = std::sync::Arc::new(Notifier { target: Some(Target::Path(socket)) });
        let waiting = StartExtender::start_every(notifier, Duration::from_millis(20), Duration::from_secs(60)).unwrap();
        let mut buf = [0u8; 256];
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let first = loop {
            if let Ok(n) = listener.recv(&mut buf) {
                break String::from_utf8_lossy(&buf[..n]).to_string();
            }
            assert!(std::time::Instant::now() < deadline, "no EXTEND_TIMEOUT_USEC");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(first.starts_with("EXTEND_TIMEOUT_USEC=60000000\n"), "{first}");
        waiting.stop();
        while listener.recv(&mut buf).is_ok() {}
        std::thread::sleep(Duration::from_millis(100));
        assert!(listener.recv(&mut buf).is_err(), "asked for more time after the start");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
