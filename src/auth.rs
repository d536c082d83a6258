//! API tokens and HTTP Basic authentication.
//!
//! A token is 256 random bits written as 64 hex digits; the store keeps only its SHA-256.
//! Checking compares hashes in constant time, and an unknown e-mail is checked against a
//! dummy hash so that it costs the same as a wrong token.

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::limits;
use crate::model::Viewer;
use crate::store::{Store, StoreError};

pub fn new_token() -> String {
    let mut bytes = [0u8; limits::TOKEN_BYTES];
    getrandom::fill(&mut bytes).expect("the operating system's random source works");
    hex::encode(bytes)
}

pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// E-mail and token from an `Authorization: Basic ...` header value.
pub fn parse_basic(header: &str) -> Option<(String, String)> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (email, token) = text.split_once(':')?;
    Some((email.trim().to_string(), token.to_string()))
}

#[derive(Debug)]
pub enum AuthError {
    /// Missing or malformed header, unknown user, wrong token, disabled or deleted user.
    Refused,
    Store(StoreError),
}

/// Credentials verified since users, groups or memberships last changed: a request with the
/// same Authorization header skips the lookup and the hash. Other writes (records, locations)
/// leave it be. A change by the service itself empties it before the next request; a change by
/// another process (a CLI command disabling a user or replacing a token) empties it within
/// `AUTH_OTHER_PROCESS_CHECK_MS`: `Store::credentials_version`, which sees those, costs more
/// than the rest of a cache hit and is asked at most that often.
pub struct Verified {
    inner: std::sync::Mutex<VerifiedInner>,
    /// How often other processes' commits are looked for.
    check_every: std::time::Duration,
}

impl Default for Verified {
    fn default() -> Verified {
        Verified::checking_every(std::time::Duration::from_millis(limits::AUTH_OTHER_PROCESS_CHECK_MS))
    }
}

#[derive(Default)]
struct VerifiedInner {
    /// `Store::local_credential_writes` when the entries were verified.
    local_writes: u64,
    /// `Store::credentials_version` when last read.
    version: i64,
    /// When `version` was last read.
    version_read: Option<std::time::Instant>,
    /// Times the entries were forgotten: what was verified across one of them is not kept.
    expired: u64,
    /// Keyed by the header's bytes (a hit needs no text check of the header), foldhash rather
    /// than SipHash: looked up on every request, bounded, and only verified headers get in.
    viewers: foldhash::HashMap<Box<[u8]>, Viewer>,
}

impl VerifiedInner {
    /// Forgets every entry unless the credentials are still as `local_writes` (and `version`,
    /// when read) say. False when `local_writes` is older than the entries (read before a
    /// write another request has seen): they are not for this request.
    fn expire(&mut self, local_writes: u64, version: Option<i64>) -> bool {
        if local_writes > self.local_writes {
            self.viewers.clear();
            self.expired += 1;
            self.local_writes = local_writes;
        }
        if let Some(version) = version {
            if self.version != version {
                self.viewers.clear();
                self.expired += 1;
                self.version = version;
            }
            self.version_read = Some(std::time::Instant::now());
        }
        local_writes == self.local_writes
    }
}

impl Verified {
    fn checking_every(check_every: std::time::Duration) -> Verified {
        Verified { inner: Default::default(), check_every }
    }

    /// Times the entries were forgotten.
    #[cfg(test)]
    fn expired(&self) -> u64 {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).expired
    }

    /// Resolves an Authorization header to the user it authenticates.
    pub fn authenticate(&self, store: &Store, header: &http::HeaderValue) -> Result<Viewer, AuthError> {
        let lock = || self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Read before the entries are looked at: a commit after this read empties them again.
        let local = store.local_credential_writes();
        let due = lock().version_read.is_none_or(|at| at.elapsed() >= self.check_every);
        let version = if due { Some(store.credentials_version().map_err(AuthError::Store)?) } else { None };
        let expired = {
            let mut inner = lock();
            if inner.expire(local, version)
                && let Some(v) = inner.viewers.get(header.as_bytes())
            {
                return Ok(v.clone());
            }
            inner.expired
        };
        // A header that is not visible ASCII authenticates nobody.
        let viewer = authenticate(store, Some(header.to_str().unwrap_or_default()))?;
        let mut inner = lock();
        // Kept only if the entries were not forgotten and no credentials were written here since
        // the lookup began (else it may be stale); another process's write meanwhile empties
        // the entries at the next check.
        if inner.expired == expired && store.local_credential_writes() == local {
            if inner.viewers.len() >= limits::AUTH_VERIFIED_ENTRIES_MAX {
                inner.viewers.clear();
            }
            inner.viewers.insert(header.as_bytes().into(), viewer.clone());
        }
        Ok(viewer)
    }
}

/// Resolves an Authorization header to the user it authenticates.
pub fn authenticate(store: &Store, header: Option<&str>) -> Result<Viewer, AuthError> {
    let Some((email, token)) = header.and_then(parse_basic) else {
        return Err(AuthError::Refused);
    };
    let presented = token_hash(&token);
    let found = store.credentials(&email).map_err(AuthError::Store)?;
    let (expected, refused) = match &found {
        Some(c) if c.token_sha256.len() == presented.len() => (c.token_sha256.as_slice(), c.refused),
        // Unknown user (or no token set): compare against a dummy so the time is the same.
        _ => (&[0u8; 32][..], true),
    };
    let matches: bool = presented.ct_eq(expected).into();
    match found {
        Some(c) if matches && !refused => Ok(c.viewer),
        _ => Err(AuthError::Refused),
    }
}

/// The part of a client's address failed logins are counted by: the address itself, or for
/// IPv6 its /64 network (one host usually holds a whole /64).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AddressKey(u128);

impl AddressKey {
    pub fn of(ip: std::net::IpAddr) -> AddressKey {
        match ip {
            std::net::IpAddr::V4(v4) => AddressKey(u128::from(u32::from(v4))),
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey(u128::from(u32::from(v4))),
                None => AddressKey((u128::from(v6) >> 64 << 64) | 1 << 32),
            },
        }
    }
}

/// Failed-login throttling per client address, shared by the API and the MQTT broker.
///
/// A failure is a presented credential that does not authenticate (a missing one is not: many
/// clients ask without credentials first). The `failures_max`-th failure from an address
/// within `lockout` locks the address out for `lockout`: every credential it presents that
/// fails is refused (API 429 with Retry-After, MQTT "not authorized") until then, and the
/// metrics token is refused unchecked. Tokens and MQTT passwords that verify are still
/// accepted (they are random 256-bit secrets: the lockout is against noise, and must not
/// lock out the other systems behind one address). A right credential does not reset the
/// count, so an attacker holding one account cannot use it to keep guessing at others.
pub struct Throttle {
    failures_max: u32,
    lockout_ms: u64,
    /// Its clock: monotonic, so that no step of the wall clock lengthens or ends a lockout.
    started: std::time::Instant,
    inner: std::sync::Mutex<std::collections::HashMap<AddressKey, Failures>>,
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    /// When the first failure counted was seen.
    first_ms: u64,
    /// Locked out until then (0: not locked).
    locked_until_ms: u64,
}

/// What the throttle says about an address about to present credentials.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    Open,
    /// Locked out for this many more milliseconds.
    Locked(u64),
}

impl Throttle {
    pub fn new(failures_max: u32, lockout_s: u64) -> Throttle {
        Throttle {
            failures_max,
            lockout_ms: lockout_s.saturating_mul(1000),
            started: std::time::Instant::now(),
            inner: Default::default(),
        }
    }

    /// Now, for [`Throttle::gate`] and [`Throttle::failed`]: milliseconds on the monotonic
    /// clock (the times they take are only compared with each other).
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<AddressKey, Failures>> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether credentials from `ip` may be checked now.
    pub fn gate(&self, ip: Option<std::net::IpAddr>, now_ms: u64) -> Gate {
        let Some(ip) = ip else { return Gate::Open };
        match self.lock().get(&AddressKey::of(ip)) {
            Some(f) if f.locked_until_ms > now_ms => Gate::Locked(f.locked_until_ms - now_ms),
            _ => Gate::Open,
        }
    }

    /// Counts a failed login from `ip`; true when this failure locked the address out.
    pub fn failed(&self, ip: Option<std::net::IpAddr>, now_ms: u64) -> bool {
        let Some(ip) = ip else { return false };
        let key = AddressKey::of(ip);
        let mut map = self.lock();
        if !map.contains_key(&key) && map.len() >= limits::AUTH_THROTTLE_ADDRESSES_MAX {
            // Forget what has expired; if every entry is live, forget the oldest.
            let lockout = self.lockout_ms;
            map.retain(|_, f| f.locked_until_ms > now_ms || now_ms.saturating_sub(f.first_ms) < lockout);
            if map.len() >= limits::AUTH_THROTTLE_ADDRESSES_MAX
                && let Some(oldest) = map.iter().min_by_key(|(_, f)| f.first_ms.max(f.locked_until_ms)).map(|(k, _)| *k)
            {
                map.remove(&oldest);
            }
        }
        let f = map.entry(key).or_insert(Failures { count: 0, first_ms: now_ms, locked_until_ms: 0 });
        if f.locked_until_ms > now_ms {
            return false;
        }
        if now_ms.saturating_sub(f.first_ms) >= self.lockout_ms || f.count == 0 {
            f.count = 0;
            f.first_ms = now_ms;
        }
        f.count += 1;
        if f.count >= self.failures_max {
            f.count = 0;
            f.locked_until_ms = now_ms.saturating_add(self.lockout_ms);
            return true;
        }
        false
    }

    /// Addresses with failures or a lockout remembered.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The service's own changes to a user apply to the very next request; another process's
    /// (the CLI's) once `AUTH_OTHER_PROCESS_CHECK_MS` has passed.
    #[test]
    fn verified_credentials_follow_changes_of_this_and_other_processes() {
        let dir = std::env::temp_dir().join(format!("sitegate-verified-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("site.db");
        let store = Store::open(&path).unwrap();
        let org = crate::config::Organization { id: "acme".into(), name: "Acme".into() };
        store.sync_organizations(&[org]).unwrap();
        let old = token_hash("old");
        let ann = crate::store::NewUser {
            org: "acme",
            email: "ann@acme.test",
            name: "Ann",
            admin: false,
            prevent_private: false,
            groups: &[],
            token_sha256: &old,
        };
        store.create_user(&ann).unwrap();
        let header = |token: &str| {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("ann@acme.test:{token}"));
            http::HeaderValue::from_str(&format!("Basic {basic}")).unwrap()
        };
        // This process: disabled, enabled, a new token, each seen by the next request (with
        // other processes' commits looked for only once an hour).
        let verified = Verified::checking_every(std::time::Duration::from_secs(3600));
        let accepted = |token: &str| verified.authenticate(&store, &header(token)).is_ok();
        assert!(accepted("old"));
        assert!(accepted("old"), "a cached hit");
        assert!(!accepted("wrong"));
        store.disable_user("ann@acme.test", true).unwrap();
        assert!(!accepted("old"));
        store.disable_user("ann@acme.test", false).unwrap();
        assert!(accepted("old"));
        store.set_token("ann@acme.test", &token_hash("mid")).unwrap();
        assert!(!accepted("old"));
        assert!(accepted("mid"));

        // Another process (its own connection and writer): seen after the check interval.
        let verified = Verified::default();
        let accepted = |token: &str| verified.authenticate(&store, &header(token)).is_ok();
        assert!(accepted("mid"));
        let other = Store::open(&path).unwrap();
        // Other writes, of either process, leave the entries be.
        let expired = verified.expired();
        let beta = crate::config::Organization { id: "beta".into(), name: "Beta".into() };
        other.sync_organizations(&[beta]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5 * limits::AUTH_OTHER_PROCESS_CHECK_MS + 5));
        assert!(accepted("mid"));
        let gamma = crate::config::Organization { id: "gamma".into(), name: "Gamma".into() };
        store.sync_organizations(&[gamma]).unwrap();
        assert!(accepted("mid"));
        assert_eq!(verified.expired(), expired, "emptied by a write of something else");
        other.set_token("ann@acme.test", &token_hash("new")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5 * limits::AUTH_OTHER_PROCESS_CHECK_MS + 5));
        assert!(!accepted("mid"));
        assert!(accepted("new"));
        other.disable_user("ann@acme.test", true).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5 * limits::AUTH_OTHER_PROCESS_CHECK_MS + 5));
        assert!(!accepted("new"));
        drop((other, store));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_nth_failure_locks_the_address_out_for_the_lockout() {
        let t = Throttle::new(3, 60);
        let a: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let b: std::net::IpAddr = "192.0.2.8".parse().unwrap();
        assert!(!t.failed(Some(a), 1_000));
        assert!(!t.failed(Some(a), 2_000));
        assert_eq!(t.gate(Some(a), 2_500), Gate::Open);
        assert!(t.failed(Some(a), 3_000));
        assert_eq!(t.gate(Some(a), 3_000), Gate::Locked(60_000));
        assert_eq!(t.gate(Some(b), 3_000), Gate::Open);
        // Failures while locked do not extend the lockout.
        assert!(!t.failed(Some(a), 10_000));
        assert_eq!(t.gate(Some(a), 62_999), Gate::Locked(1));
        assert_eq!(t.gate(Some(a), 63_000), Gate::Open);
        // Failures further apart than the lockout do not add up.
        assert!(!t.failed(Some(b), 0));
        assert!(!t.failed(Some(b), 30_000));
        assert!(!t.failed(Some(b), 61_000));
        assert!(!t.failed(Some(b), 62_000));
        assert!(t.failed(Some(b), 63_000));
        // No address (a process-internal caller): never throttled.
        assert!(!t.failed(None, 0));
        assert_eq!(t.gate(None, 0), Gate::Open);
    }

    #[test]
    fn ipv6_is_counted_per_64_and_mapped_ipv4_as_ipv4() {
        let k = |s: &str| AddressKey::of(s.parse().unwrap());
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("::ffff:192.0.2.1"), k("192.0.2.1"));
        assert_ne!(k("::"), k("0.0.0.0"));
    }

    #[test]
    fn the_table_of_addresses_is_bounded() {
        let t = Throttle::new(1_000, 60);
        for i in 0..(limits::AUTH_THROTTLE_ADDRESSES_MAX as u32 + 50) {
            t.failed(Some(std::net::IpAddr::V4(i.into())), u64::from(i));
        }
        assert!(t.tracked() <= limits::AUTH_THROTTLE_ADDRESSES_MAX);
    }

    #[test]
    fn basic_header() {
        let h = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("ann@example.com:abc:def"));
        assert_eq!(parse_basic(&h), Some(("ann@example.com".into(), "abc:def".into())));
        assert_eq!(parse_basic("Bearer x"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
        let t = new_token();
        assert_eq!(t.len(), 64);
        assert_ne!(t, new_token());
    }
}
