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
