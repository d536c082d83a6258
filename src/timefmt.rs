//! Time formats of the interface. Times are stored as Unix seconds; the API shows them as
//! ISO 8601 in UTC with a `+00:00` offset. Dates are civil dates (YYYY-MM-DD).

use jiff::Timestamp;
use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;

/// Unix seconds now.
pub fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

/// `2026-11-22T01:55:07+00:00`
pub fn iso(secs: i64) -> String {
    with_iso(secs, str::to_string)
}

/// Calls `f` with the ISO time of `secs` (empty when out of range), written on the stack for
/// years 0-9999: responses write these without allocating.
pub fn with_iso<R>(secs: i64, f: impl FnOnce(&str) -> R) -> R {
    let Ok(ts) = Timestamp::from_second(secs) else { return f("") };
    let dt = jiff::tz::Offset::UTC.to_datetime(ts);
    if !(0..=9999).contains(&dt.year()) {
        return f(&ts.strftime("%Y-%m-%dT%H:%M:%S+00:00").to_string());
    }
    // Every show and list writes two or three of these: digits straight into a buffer
    // (strftime costs some 1,500 instructions a time).
    let mut out = *b"0000-00-00T00:00:00+00:00";
    let fields = [
        (i32::from(dt.year()), 0, 4),
        (i32::from(dt.month()), 5, 2),
        (i32::from(dt.day()), 8, 2),
        (i32::from(dt.hour()), 11, 2),
        (i32::from(dt.minute()), 14, 2),
        (i32::from(dt.second()), 17, 2),
    ];
    for (mut value, start, width) in fields {
        for place in (start..start + width).rev() {
            out[place] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    f(std::str::from_utf8(&out).unwrap_or_default())
}

/// `Nov 22, 2026 01:55:07` (UTC), the activity create response's `created`.
pub fn short(secs: i64) -> String {
    match Timestamp::from_second(secs) {
        Ok(ts) => ts.to_zoned(TimeZone::UTC).strftime("%b %-d, %Y %H:%M:%S").to_string(),
        Err(_) => String::new(),
    }
}

/// A date as the API accepts it: `2004-02-12`, or the date part of `2004-02-12 15:19:21` or
/// `2004-02-12T15:19:21+00:00`.
pub fn parse_date(s: &str) -> Option<Date> {
    let s = crate::model::trim_blank(s);
    let head = s.get(..10)?;
    let date: Date = head.parse().ok()?;
    let rest = &s[10..];
    if rest.is_empty() || parse_datetime(s).is_some() { Some(date) } else { None }
}

/// A date-time with a time zone annotation (RFC 9557: `2026-03-29T02:30:00[Europe/Berlin]`,
/// with or without an offset): `Some` when `s` carries one, holding its instant, or `None`
/// when the zone is unknown or the offset does not fit it. Without an annotation, `None`.
fn annotated(s: &str) -> Option<Option<Timestamp>> {
    has_zone_annotation(s).then(|| s.replacen(' ', "T", 1).parse::<jiff::Zoned>().ok().map(|z| z.timestamp()))
}

/// Whether `s` carries a time zone annotation (`[Europe/Berlin]`, `[!UTC]`, `[+05:00]`); other
/// annotations are `key=value` (`[u-ca=gregory]`), which the parsers read past.
fn has_zone_annotation(s: &str) -> bool {
    s.split('[').skip(1).any(|rest| {
        let inside = rest.split(']').next().unwrap_or_default();
        !inside.trim_start_matches('!').contains('=')
    })
}

/// A point in time as the API accepts it, in Unix seconds: `2004-02-12T15:19:21+00:00` (any
/// offset), `2004-02-12T15:19:21[Europe/Berlin]` (a named zone), `2004-02-12 15:19:21` or
/// `2004-02-12T15:19:21` (UTC), or `2004-02-12` (midnight UTC).
pub fn parse_datetime(s: &str) -> Option<i64> {
    let s = crate::model::trim_blank(s);
    if let Some(ts) = annotated(s) {
        return ts.map(|ts| ts.as_second());
    }
    if let Ok(ts) = s.parse::<Timestamp>() {
        return Some(ts.as_second());
    }
    if let Ok(dt) = s.replacen(' ', "T", 1).parse::<DateTime>() {
        return dt.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp().as_second());
    }
    if s.len() == 10
        && let Ok(d) = s.parse::<Date>()
    {
        return d.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp().as_second());
    }
    None
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// `2026-11-22 14:05:09` in the site's time zone, from Unix milliseconds (the location API's
/// timestamps).
pub fn local_ms(ms: i64, tz: &TimeZone) -> String {
    match Timestamp::from_millisecond(ms) {
        Ok(ts) => ts.to_zoned(tz.clone()).strftime("%Y-%m-%d %H:%M:%S").to_string(),
        Err(_) => String::new(),
    }
}

/// A point in time in the site's time zone, as Unix milliseconds: `2026-11-22 14:05:09`,
/// `2026-11-22T14:05`, `2026-11-22` (midnight), or with an explicit offset or zone
/// (`[Europe/Berlin]`). A local time that does not exist (skipped by a change to summer time)
/// is taken as the same time after the change (02:30 as 03:30); one that exists twice, as the
/// earlier.
pub fn parse_local_ms(s: &str, tz: &TimeZone) -> Option<i64> {
    let s = crate::model::trim_blank(s);
    if let Some(ts) = annotated(s) {
        return ts.map(|ts| ts.as_millisecond());
    }
    if let Ok(ts) = s.parse::<Timestamp>() {
        return Some(ts.as_millisecond());
    }
    let dt: DateTime = if s.len() == 10 {
        s.parse::<Date>().ok()?.to_datetime(jiff::civil::Time::midnight())
    } else {
        s.replacen(' ', "T", 1).parse().ok()?
    };
    dt.to_zoned(tz.clone()).ok().map(|z| z.timestamp().as_millisecond())
}

/// The end of a plain date `YYYY-MM-DD` in the site's time zone: the next day's midnight there
/// (a day of a daylight-saving change is 23 or 25 hours long). None for anything else.
pub fn local_day_end_ms(s: &str, tz: &TimeZone) -> Option<i64> {
    let s = crate::model::trim_blank(s);
    if s.len() != 10 {
        return None;
    }
    let next = s.parse::<Date>().ok()?.tomorrow().ok()?;
    next.to_datetime(jiff::civil::Time::midnight()).to_zoned(tz.clone()).ok().map(|z| z.timestamp().as_millisecond())
}

/// A date as a report's `start` or `end`: `2026-11-28`, or a date-time. One with an offset or
/// a zone (`2026-11-28T23:30:00-05:00`) is an instant, taken as its day in the site's time zone;
/// one without (`2026-11-28 00:00:00`) is the date as written.
pub fn parse_local_date(s: &str, tz: &TimeZone) -> Option<Date> {
    let s = crate::model::trim_blank(s);
    let instant = match annotated(s) {
        Some(zoned) => Some(zoned?),
        None => s.parse::<Timestamp>().ok(),
    };
    match instant {
        Some(ts) => Some(ts.to_zoned(tz.clone()).date()),
        None => parse_date(s),
    }
}

/// Today's date in the site's time zone.
pub fn today(tz: &TimeZone) -> Date {
    Timestamp::now().to_zoned(tz.clone()).date()
}

#[cfg(test)]
mod tests {

    #[test]
    fn zone_annotations_are_honoured() {
        let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        // Winter time in Berlin: UTC+1.
        assert_eq!(parse_datetime("2026-01-10T10:00:00[Europe/Berlin]"), parse_datetime("2026-01-10T09:00:00Z"));
        assert_eq!(parse_datetime("2026-01-10T10:00:00+01:00[Europe/Berlin]"), parse_datetime("2026-01-10T09:00:00Z"));
        assert_eq!(parse_datetime("2026-01-10T10:00:00[Mars/Olympus]"), None);
        assert_eq!(parse_datetime("2026-01-10T10:00:00+05:00[Europe/Berlin]"), None, "an offset that does not fit");
        // Other annotations are read past, with a zone or without.
        assert_eq!(parse_datetime("2026-01-10T09:00:00Z[u-ca=gregory]"), parse_datetime("2026-01-10T09:00:00Z"));
        assert_eq!(parse_datetime("2026-01-10T10:00:00+01:00[u-ca=gregory]"), parse_datetime("2026-01-10T09:00:00Z"));
        assert_eq!(
            parse_datetime("2026-01-10T10:00:00[Europe/Berlin][u-ca=gregory]"),
            parse_datetime("2026-01-10T09:00:00Z")
        );
        let utc = |s: &str| parse_datetime(s).map(|secs| secs * 1000);
        assert_eq!(parse_local_ms("2026-10-23T21:30:00[UTC]", &berlin), utc("2026-10-23T21:30:00Z"));
        assert_eq!(parse_local_ms("2026-10-23 21:30:00", &berlin), utc("2026-10-23T19:30:00Z"));
    }

    #[test]
    fn report_dates_with_an_offset_are_days_of_the_site() {
        let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        let day = |s: &str| parse_local_date(s, &berlin).map(|d| d.to_string());
        assert_eq!(day("2026-11-28"), Some("2026-11-28".into()));
        assert_eq!(day("2026-11-28T23:30:00-05:00"), Some("2026-11-29".into()));
        assert_eq!(day("2026-11-28T23:30:00Z"), Some("2026-11-29".into()));
        assert_eq!(day("2026-11-28T23:30:00[Asia/Tokyo]"), Some("2026-11-28".into()));
        assert_eq!(day("2026-11-28 23:30:00"), Some("2026-11-28".into()), "without an offset: as written");
        assert_eq!(day("2026-11-28T23:30:00[Nowhere/Land]"), None);
        assert_eq!(day("2026-11-28T23:30:00[u-ca=gregory]"), Some("2026-11-28".into()), "a calendar: as written");
        assert_eq!(day("2026-11-31"), None);
    }
    use super::*;

    #[test]
    fn a_plain_date_ends_at_the_next_local_midnight() {
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        let day = |d: &str| {
            let start = parse_local_ms(d, &berlin).unwrap();
            (local_day_end_ms(d, &berlin).unwrap() - start) / 3_600_000
        };
        assert_eq!(day("2026-10-25"), 25, "the autumn change");
        assert_eq!(day("2026-03-29"), 23, "the spring change");
        assert_eq!(day("2026-06-01"), 24);
        assert_eq!(local_day_end_ms("2026-06-01 10:00:00", &berlin), None);
    }

    #[test]
    fn formats() {
        assert_eq!(iso(1_245_509_379), "2009-06-20T14:49:39+00:00");
        // The digits written directly agree with strftime, across years, leap days and the
        // range ends (years outside 0-9999 take strftime itself).
        let strftime = |secs: i64| {
            Timestamp::from_second(secs)
                .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%S+00:00").to_string())
                .unwrap_or_default()
        };
        let mut secs = -62_167_219_200 - 86_400; // 0000-01-01 less a day
        while secs < 253_402_300_800 + 86_400 {
            assert_eq!(iso(secs), strftime(secs), "{secs}");
            secs += 86_400 * 97 + 3_599;
        }
        for secs in [0, 951_782_400, 951_868_799, 1_709_164_800, 253_402_207_200, 253_402_207_201, -1] {
            assert_eq!(iso(secs), strftime(secs), "{secs}");
        }
        assert_eq!(short(1_245_509_379), "Jun 20, 2009 14:49:39");
        assert_eq!(parse_datetime("2009-06-20T14:49:39+00:00"), Some(1_245_509_379));
        assert_eq!(parse_datetime("2009-06-20T16:49:39+02:00"), Some(1_245_509_379));
        assert_eq!(parse_datetime("2009-06-20 14:49:39"), Some(1_245_509_379));
        assert_eq!(parse_datetime("2009-06-20"), Some(1_245_456_000));
        assert_eq!(parse_datetime("yesterday"), None);
        assert_eq!(parse_date("2009-06-20").map(|d| d.to_string()), Some("2009-06-20".into()));
        assert_eq!(parse_date("2009-06-20 10:00:00").map(|d| d.to_string()), Some("2009-06-20".into()));
        assert_eq!(parse_date("2009-02-30"), None);
        assert_eq!(parse_date("2009-06-20xyz"), None);
    }
}
