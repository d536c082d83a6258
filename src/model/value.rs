//! Field values: the kinds a record or activity field can have, and the one place where a value
//! of each kind is checked and normalised.

use crate::limits;

/// How a field's value is checked and stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Text,
    /// An e-mail address: one `@`, no white space.
    Email,
    /// Comma-delimited e-mail addresses.
    Emails,
    /// A phone number: free text; `byphone` compares its digits.
    Phone,
    /// A user or group id of the organisation (its existence is the store's check).
    Principal,
    /// YYYY-MM-DD.
    Date,
    /// A point in time, stored as ISO 8601 UTC.
    DateTime,
    /// An integer within bounds.
    Int {
        min: i64,
        max: i64,
    },
    /// A decimal number.
    Decimal,
    /// 0 or 1.
    Flag,
    /// One of the values (matched ignoring case, stored as listed).
    Choice(&'static [&'static str]),
    /// A file reference (name or URL).
    File,
}

impl Kind {
    /// Checks and normalises a value; the empty string clears the field.
    pub fn normalize(self, value: &str) -> Result<String, String> {
        let value = trim_blank(value);
        check_text(value)?;
        if value.is_empty() {
            return Ok(String::new());
        }
        match self {
            Kind::Text | Kind::Phone | Kind::File => Ok(value.to_string()),
            Kind::Email => {
                if looks_like_email(value) {
                    Ok(value.to_string())
                } else {
                    Err("must be an e-mail address".into())
                }
            }
            Kind::Emails => {
                let parts: Vec<&str> = value.split(',').map(trim_blank).filter(|s| !s.is_empty()).collect();
                if parts.iter().all(|p| looks_like_email(p)) {
                    Ok(parts.join(", "))
                } else {
                    Err("must be e-mail addresses separated by commas".into())
                }
            }
            Kind::Principal => value
                .parse::<i64>()
                .ok()
                .filter(|v| *v > 0)
                .map(|v| v.to_string())
                .ok_or_else(|| "must be a user or group id".into()),
            Kind::Date => crate::timefmt::parse_date(value)
                .map(|d| d.to_string())
                .ok_or_else(|| "must be a date (YYYY-MM-DD)".into()),
            Kind::DateTime => crate::timefmt::parse_datetime(value)
                .map(crate::timefmt::iso)
                .ok_or_else(|| "must be a date and time (YYYY-MM-DDTHH:MM:SS+00:00)".into()),
            Kind::Int { min, max } => match value.parse::<i64>() {
                Ok(n) if n >= min && n <= max => Ok(n.to_string()),
                Ok(_) if min == 0 && max == i64::MAX => Err("must not be negative".into()),
                Ok(_) => Err(format!("must be from {min} to {max}")),
                Err(_) => Err("must be an integer".into()),
            },
            Kind::Decimal => match value.parse::<f64>() {
                Ok(n) if n.is_finite() => Ok(value.to_string()),
                _ => Err("must be a number".into()),
            },
            Kind::Flag => match value {
                "0" | "1" => Ok(value.to_string()),
                _ => Err("must be 0 or 1".into()),
            },
            Kind::Choice(options) => choose(options.iter().copied(), value),
        }
    }
}

/// The option that matches `value` ignoring case, as the option is written.
pub fn choose<'a>(options: impl Iterator<Item = &'a str>, value: &str) -> Result<String, String> {
    let options: Vec<&str> = options.collect();
    let value = trim_blank(value);
    if value.is_empty() {
        return Ok(String::new());
    }
    options
        .iter()
        .find(|o| o.eq_ignore_ascii_case(value))
        .map(|o| o.to_string())
        .ok_or_else(|| format!("must be one of: {}", options.join(", ")))
}

/// One `@` with something on both sides and no white space: the check every e-mail field gets.
pub fn looks_like_email(value: &str) -> bool {
    value.split('@').count() == 2
        && !value.starts_with('@')
        && !value.ends_with('@')
        && !value.chars().any(char::is_whitespace)
}

/// The white space the API ignores around a value, a parameter and a list's items: space, tab,
/// line feed, carriage return, form feed and vertical tab, the set docs/openapi.json's patterns
/// write as `[ \t\n\r\f\u000b]`. Other white space, such as a no-break space, is content.
pub fn trim_blank(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'))
}

/// Text accepted in any field or name: bounded, no control characters but tab and newlines
/// (XML 1.0 cannot carry them).
pub fn check_text(value: &str) -> Result<(), String> {
    if value.len() > limits::FIELD_VALUE_BYTES_MAX {
        return Err(format!("is longer than {} bytes", limits::FIELD_VALUE_BYTES_MAX));
    }
    match value.chars().find(|c| !xml_char(*c)) {
        None => Ok(()),
        Some(c) if c.is_control() => Err("contains control characters".into()),
        Some(_) => Err("contains U+FFFE or U+FFFF, which XML cannot carry".into()),
    }
}

/// Whether XML 1.0 can carry a character: not a control character other than tab, LF and
/// CR, and not U+FFFE or U+FFFF (surrogates are no `char`). Values are checked by it
/// ([`check_text`]), and XML output replaces what fails it.
pub fn xml_char(c: char) -> bool {
    (!c.is_control() || matches!(c, '\t' | '\n' | '\r')) && !matches!(c, '\u{FFFE}' | '\u{FFFF}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        assert_eq!(Kind::Int { min: 0, max: 100 }.normalize("101"), Err("must be from 0 to 100".into()));
        assert_eq!(Kind::Int { min: 0, max: i64::MAX }.normalize("-1"), Err("must not be negative".into()));
        assert_eq!(Kind::Choice(&["Won", "Lost"]).normalize("won"), Ok("Won".into()));
        assert!(Kind::Choice(&["Won"]).normalize("XYZ").is_err());
        assert_eq!(Kind::DateTime.normalize("2024-01-02 03:04:05"), Ok("2024-01-02T03:04:05+00:00".into()));
        assert_eq!(Kind::Date.normalize("2024-01-02T03:04:05+00:00"), Ok("2024-01-02".into()));
        assert_eq!(Kind::Emails.normalize("a@x.org,b@y.org"), Ok("a@x.org, b@y.org".into()));
        assert!(Kind::Email.normalize("a b@x").is_err());
        assert!(Kind::Flag.normalize("2").is_err());
        assert!(Kind::Decimal.normalize("NaN").is_err());
        assert!(Kind::Text.normalize("a\u{7}").is_err());
        assert_eq!(Kind::Principal.normalize(" 12 "), Ok("12".into()));
        assert_eq!(Kind::Date.normalize(""), Ok(String::new()));
        // The blanks docs/openapi.json allows around a value, and no other white space.
        assert_eq!(trim_blank(" \t\n\r\x0b\x0ca b\x0c\x0b\r\n\t "), "a b");
        assert_eq!(trim_blank("\u{a0}a\u{2003}"), "\u{a0}a\u{2003}");
        assert!(Kind::Principal.normalize("\u{a0}12").is_err());
    }
}
