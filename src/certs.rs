//! The expiry of the certificates the service presents (HTTPS, MQTT over TLS) and trusts
//! (the client CA): a certificate that expires takes every client of its listener with it, so
//! the journal warns before it does, and when it has.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::limits;

/// Where a certificate stands on a day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not valid before a time still to come (or the clock is behind).
    NotYetValid,
    Valid,
    /// Expires within `CERT_EXPIRY_WARN_DAYS`.
    Expiring,
    Expired,
}

/// The certificates of the configuration, each with its key for the journal.
pub fn configured(config: &Config) -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    if let Some(tls) = &config.http.tls {
        out.push(("http.tls_cert", tls.cert.clone()));
    }
    if let Some(tls) = &config.mqtt.broker.tls {
        out.push(("mqtt.tls_cert", tls.cert.clone()));
        if let Some((_, ca)) = &tls.client_cert {
            out.push(("mqtt.client_ca", ca.clone()));
        }
    }
    out
}

/// When every certificate of a PEM file is valid (Unix seconds): from the latest start of
/// any of them to the earliest end (a chain is as good as its first link to expire).
pub fn validity(path: &Path) -> Result<(i64, i64), String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut span: Option<(i64, i64)> = None;
    for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
        let block = block.map_err(|e| format!("{}: {e}", path.display()))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block.parse_x509().map_err(|e| format!("{}: {e}", path.display()))?;
        let (from, until) = (cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp());
        span = Some(span.map_or((from, until), |(f, u)| (f.max(from), u.min(until))));
    }
    span.ok_or_else(|| format!("{}: no certificate", path.display()))
}

pub fn standing((not_before, not_after): (i64, i64), now: i64) -> Standing {
    if now < not_before {
        Standing::NotYetValid
    } else if not_after <= now {
        Standing::Expired
    } else if not_after - now <= limits::CERT_EXPIRY_WARN_DAYS * 86_400 {
        Standing::Expiring
    } else {
        Standing::Valid
    }
}

/// Says in the journal what changed since `before` (one standing per certificate, in the
/// order of [`configured`]; all `Valid` at start so that start warns of any that is not).
pub fn check(config: &Config, now: i64, before: &mut Vec<Standing>) {
    let certs = configured(config);
    before.resize(certs.len(), Standing::Valid);
    for ((key, path), was) in certs.iter().zip(before.iter_mut()) {
        let (from, until) = match validity(path) {
            Ok(span) => span,
            Err(e) => {
                log::warn!("`{key}`: cannot tell when it expires: {e}");
                continue;
            }
        };
        let now_standing = standing((from, until), now);
        let day = |t: i64| {
            jiff::Timestamp::from_second(t)
                .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
                .unwrap_or_else(|_| t.to_string())
        };
        let date = day(until);
        match (now_standing, *was) {
            (Standing::Expired, Standing::Expired)
            | (Standing::Expiring, Standing::Expiring)
            | (Standing::NotYetValid, Standing::NotYetValid)
            | (Standing::Valid, _) => {}
            (Standing::NotYetValid, _) => log::error!(
                "`{key}` {} is not valid before {}: clients that check it refuse to connect until then                  (or the clock is behind)",
                path.display(),
                day(from)
            ),
            (Standing::Expired, _) => log::error!(
                "`{key}` {} expired on {date}: clients that check it refuse to connect; replace it and restart the service",
                path.display()
            ),
            (Standing::Expiring, _) => log::warn!(
                "`{key}` {} expires on {date}, in {} days: replace it and restart the service",
                path.display(),
                (until - now) / 86_400
            ),
        }
        *was = now_standing;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_valid_expiring_or_expired() {
        let day = 86_400;
        let now = 1_800_000_000;
        let from = now - day;
        assert_eq!(standing((from, now + 90 * day), now), Standing::Valid);
        assert_eq!(standing((from, now + limits::CERT_EXPIRY_WARN_DAYS * day), now), Standing::Expiring);
        assert_eq!(standing((from, now + 1), now), Standing::Expiring);
        assert_eq!(standing((from, now), now), Standing::Expired);
        assert_eq!(standing((from, now - day), now), Standing::Expired);
        assert_eq!(standing((now + day, now + 90 * day), now), Standing::NotYetValid);
    }

    /// The expiry is read from the certificate itself: one made to last 10 days.
    #[test]
    fn the_expiry_is_read_from_the_file() {
        let dir = std::env::temp_dir().join(format!("sitegate-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["gateway.example".to_string()]).unwrap();
        let now = jiff::Timestamp::now().as_second();
        let ymd = |d: jiff::civil::Date| rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8);
        let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
        let last = today.checked_add(jiff::Span::new().days(10)).unwrap();
        params.not_before = ymd(today.checked_sub(jiff::Span::new().days(1)).unwrap());
        params.not_after = ymd(last);
        let until = last.to_zoned(jiff::tz::TimeZone::UTC).unwrap().timestamp().as_second();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join("cert.pem");
        std::fs::write(&path, cert.pem()).unwrap();
        assert_eq!(validity(&path).unwrap().1, until);
        assert_eq!(standing(validity(&path).unwrap(), now), Standing::Expiring);
        // A chain: a leaf that lasts a year before an intermediate that lasts 10 days is as
        // good as the intermediate.
        let mut leaf = rcgen::CertificateParams::new(vec!["gateway.example".to_string()]).unwrap();
        leaf.not_before = ymd(today.checked_sub(jiff::Span::new().days(1)).unwrap());
        leaf.not_after = ymd(today.checked_add(jiff::Span::new().days(365)).unwrap());
        let leaf = leaf.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
        std::fs::write(&path, format!("{}{}", leaf.pem(), cert.pem())).unwrap();
        assert_eq!(validity(&path).unwrap().1, until);
        // Not valid yet.
        let mut later = rcgen::CertificateParams::new(vec!["gateway.example".to_string()]).unwrap();
        later.not_before = ymd(today.checked_add(jiff::Span::new().days(5)).unwrap());
        later.not_after = ymd(today.checked_add(jiff::Span::new().days(365)).unwrap());
        let later = later.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
        std::fs::write(&path, later.pem()).unwrap();
        assert_eq!(standing(validity(&path).unwrap(), now), Standing::NotYetValid);
        std::fs::write(&path, "not a certificate").unwrap();
        assert!(validity(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
