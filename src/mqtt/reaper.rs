//! Closes connections to the broker's ports that never sent a CONNECT.
//!
//! rmqtt reads the first bytes of a connection (to tell MQTT 3.1.1 from 5) without a time
//! limit, and only then starts its handshake timeout; a connection that sends nothing, or a
//! packet header and no more, is held for good. Enough of them use up the process's file
//! descriptors, and then the HTTP API cannot accept either. This task looks at the process's
//! own TCP sockets (`/proc/self/net/tcp*` for the ports and peers, `/proc/self/fd` for which
//! descriptors are sockets) every `MQTT_REAP_INTERVAL_MS`, and shuts down those on a broker
//! port whose peer has not sent a CONNECT within the handshake timeout: rmqtt's read then ends
//! and it closes the connection as for any client gone.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::limits;

/// Peers whose CONNECT the broker received (filled by the broker's connect hook), and when.
#[derive(Default)]
pub struct Greeted(Mutex<HashMap<SocketAddr, Instant>>);

impl Greeted {
    pub fn insert(&self, peer: SocketAddr) {
        let peer = match peer.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, |v4| SocketAddr::new(IpAddr::V4(v4), peer.port())),
            IpAddr::V4(_) => peer,
        };
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(peer, Instant::now());
    }

    fn contains(&self, peer: &SocketAddr) -> bool {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(peer)
    }

    /// Forgets the peers that had no connection at the look taken at `looked` (those greeted
    /// since connected after it).
    fn keep_only(&self, open: &HashSet<SocketAddr>, looked: Instant) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|p, at| open.contains(p) || *at >= looked);
    }
}

/// One established TCP connection of this network namespace.
struct Conn {
    local_port: u16,
    peer: SocketAddr,
    inode: u64,
}

/// Runs until the runtime ends: closes silent connections to `ports` after `timeout`.
pub async fn run(ports: Vec<u16>, timeout: Duration, greeted: Arc<Greeted>) {
    let mut first_seen: HashMap<u64, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(limits::MQTT_REAP_INTERVAL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ports = ports.clone();
        let greeted = Arc::clone(&greeted);
        let seen = std::mem::take(&mut first_seen);
        let Ok((seen, closed)) =
            tokio::task::spawn_blocking(move || sweep(&ports, timeout, &greeted, seen, Instant::now())).await
        else {
            return;
        };
        first_seen = seen;
        if closed > 0 {
            log::info!("mqtt: closed {closed} connections that sent no CONNECT within the handshake timeout");
        }
    }
}

/// One look: returns the first-seen times to keep and how many connections were shut down.
fn sweep(
    ports: &[u16],
    timeout: Duration,
    greeted: &Greeted,
    mut first_seen: HashMap<u64, Instant>,
    now: Instant,
) -> (HashMap<u64, Instant>, usize) {
    let mut conns = Vec::new();
    let looked = Instant::now();
    for file in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(file) {
            conns.extend(text.lines().skip(1).filter_map(parse_line).filter(|c| ports.contains(&c.local_port)));
        }
    }
    let open: HashSet<SocketAddr> = conns.iter().map(|c| c.peer).collect();
    greeted.keep_only(&open, looked);
    let inodes: HashSet<u64> = conns.iter().map(|c| c.inode).collect();
    first_seen.retain(|inode, _| inodes.contains(inode));
    let mut silent = HashSet::new();
    for c in &conns {
        let since = *first_seen.entry(c.inode).or_insert(now);
        if now.duration_since(since) > timeout && !greeted.contains(&c.peer) {
            silent.insert(c.inode);
        }
    }
    if silent.is_empty() {
        return (first_seen, 0);
    }
    let mut closed = 0;
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for entry in dir.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Ok(target) = std::fs::read_link(entry.path()) else { continue };
            let Some(inode) = socket_inode(&target.to_string_lossy()) else { continue };
            if silent.contains(&inode) && shutdown_if(fd, inode) {
                closed += 1;
                first_seen.remove(&inode);
            }
        }
    }
    (first_seen, closed)
}

/// `socket:[12345]` → 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Shuts down descriptor `fd` if it still is the socket `inode` (it may have been closed and
/// its number reused since the look).
fn shutdown_if(fd: i32, inode: u64) -> bool {
    // SAFETY: the descriptor is only borrowed for the two calls; if it was closed meanwhile
    // they fail, and if its number was reused the inode check leaves it alone.
    let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    match rustix::fs::fstat(fd) {
        Ok(st) if st.st_ino == inode => rustix::net::shutdown(fd, rustix::net::Shutdown::Both).is_ok(),
        _ => false,
    }
}

/// A line of `/proc/net/tcp` or `tcp6` in state ESTABLISHED (01) or CLOSE_WAIT (08).
fn parse_line(line: &str) -> Option<Conn> {
    let mut fields = line.split_whitespace();
    let _slot = fields.next()?;
    let local = fields.next()?;
    let remote = fields.next()?;
    let state = fields.next()?;
    if state != "01" && state != "08" {
        return None;
    }
    let inode = fields.nth(5)?.parse().ok()?;
    let (_, local_port) = parse_addr(local)?;
    let (ip, port) = parse_addr(remote)?;
    Some(Conn { local_port, peer: SocketAddr::new(ip, port), inode })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits (IPv6), each 32-bit word in host byte order.
fn parse_addr(text: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok().map(|w| w.to_ne_bytes());
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            // Peers of a dual-stack listener, as the broker sees them.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    #[test]
    fn proc_net_tcp_lines() {
        let line = "   3: 0100007F:9C40 0200007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 424242 1 0000000000000000 20 4 30 10 -1";
        let c = super::parse_line(line).unwrap();
        assert_eq!(c.local_port, 0x9c40);
        assert_eq!(c.peer, "127.0.0.2:54321".parse().unwrap());
        assert_eq!(c.inode, 424242);
        // Listening sockets (0A) are not connections.
        assert!(super::parse_line(&line.replace(" 01 ", " 0A ")).is_none());
        let v6 = "   0: 00000000000000000000000001000000:075B 0000000000000000FFFF00000200007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 7 1";
        let c = super::parse_line(v6).unwrap();
        assert_eq!((c.local_port, c.peer), (1883, "127.0.0.2:54321".parse().unwrap()));
        assert_eq!(super::socket_inode("socket:[77]"), Some(77));
        assert_eq!(super::socket_inode("pipe:[77]"), None);
    }
}
