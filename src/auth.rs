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

/// Credentials verified since the database last changed: a request with the same
/// Authorization header skips the lookup and the hash. Any commit (a CLI command disabling a
/// user or replacing a token included) empties it, so a change applies to the next request.
#[derive(Default)]
pub struct Verified {
    inner: std::sync::Mutex<VerifiedInner>,
}

#[derive(Default)]
struct VerifiedInner {
    data_version: i64,
    viewers: std::collections::HashMap<String, Viewer>,
}

impl Verified {
    /// Resolves an Authorization header to the user it authenticates.
    pub fn authenticate(&self, store: &Store, header: Option<&str>) -> Result<Viewer, AuthError> {
        let Some(header) = header else { return Err(AuthError::Refused) };
        let version = store.data_version().map_err(AuthError::Store)?;
        {
            let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if inner.data_version != version {
                inner.viewers.clear();
                inner.data_version = version;
            }
            if let Some(v) = inner.viewers.get(header) {
                return Ok(v.clone());
            }
        }
        let viewer = authenticate(store, Some(header))?;
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Kept only if nothing was committed since the version was read (else it may be stale).
        if inner.data_version == version {
            if inner.viewers.len() >= limits::AUTH_VERIFIED_ENTRIES_MAX {
                inner.viewers.clear();
            }
            inner.viewers.insert(header.to_string(), viewer.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

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
