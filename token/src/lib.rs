//! `ringpost-token`: access tokens: how a new one is made, the digest the access file keeps of
//! it, the RFC 3339 times its `expires=` field is written in, and the names a principal may
//! have. The daemon reads the access file with these (`auth::token`) and the CLI's
//! `token create` writes with them, so that what it prints is exactly what the daemon parses,
//! and the CLI links neither the daemon nor its runtimes to make a token.
//!
//! A token is 256 random bits: a guess succeeds with probability 2^-256, so the daemon keeps
//! a plain SHA-256 of each (as GitHub does for its tokens). A password hash's deliberate
//! slowness only helps against guessing a low-entropy secret from its hash, which a random
//! token is not; a fast hash keeps authenticating a connection cheap.

use ring::rand::SecureRandom;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The special principal of a session without a credential.
pub const PRINCIPAL_ANONYMOUS: &str = "anonymous";
/// The special principal every session with a credential (a token or a certificate) is.
pub const PRINCIPAL_ALL_AUTHENTICATED: &str = "allAuthenticatedUsers";
/// The special principal everyone is, anonymous included.
pub const PRINCIPAL_ALL_USERS: &str = "allUsers";
/// The longest principal name a file may give, so that an audit line stays a line.
pub const PRINCIPAL_BYTES_MAX: usize = 256;

/// What every token this daemon makes starts with, so that one found in a log or a
/// repository is recognisable (and scanners can look for it).
pub const TOKEN_PREFIX: &str = "rpt_";
/// The random bytes of a new token.
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// How the access file writes a digest: `sha256:` and 64 lowercase hexadecimal digits.
pub const DIGEST_PREFIX: &str = "sha256:";
/// The bytes of a SHA-256 digest.
pub const DIGEST_BYTES: usize = 32;

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// A new token: `rpt_` and 64 lowercase hexadecimal digits, from the system's secure random
/// source. Panics only if the operating system cannot give random bytes, which no caller
/// could recover from (a token from a weaker source would be worse than none).
pub fn generate() -> String {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random source failed; no token can be made without it");
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 2 * TOKEN_RANDOM_BYTES);
    token.push_str(TOKEN_PREFIX);
    push_hex(&mut token, &bytes);
    token
}

/// The SHA-256 of a token, the only thing the daemon keeps of it.
pub fn digest(token: &str) -> [u8; DIGEST_BYTES] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut bytes = [0u8; DIGEST_BYTES];
    bytes.copy_from_slice(digest.as_ref());
    bytes
}

/// The token's digest as the access file writes it: `sha256:<64 lowercase hex>`.
pub fn digest_line(token: &str) -> String {
    format_digest(&digest(token))
}

/// A digest as the access file writes it.
pub fn format_digest(digest: &[u8; DIGEST_BYTES]) -> String {
    let mut line = String::with_capacity(DIGEST_PREFIX.len() + 2 * DIGEST_BYTES);
    line.push_str(DIGEST_PREFIX);
    push_hex(&mut line, digest);
    line
}

/// Reads `sha256:<64 lowercase hex>`; None for anything else (upper case included, so that a
/// file has one spelling of each digest).
pub fn parse_digest(text: &str) -> Option<[u8; DIGEST_BYTES]> {
    let hex = text.strip_prefix(DIGEST_PREFIX)?.as_bytes();
    if hex.len() != 2 * DIGEST_BYTES {
        return None;
    }
    let mut digest = [0u8; DIGEST_BYTES];
    for (byte, pair) in digest.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = (hex_value(pair[0])? << 4) | hex_value(pair[1])?;
    }
    Some(digest)
}

/// The access file's line for a token: `token NAME sha256:... [expires=...]`.
pub fn access_line(principal: &str, token: &str, expires: Option<SystemTime>) -> String {
    let mut line = format!("token {principal} {}", digest_line(token));
    if let Some(expires) = expires {
        line.push_str(" expires=");
        line.push_str(&format_rfc3339_utc(expires));
    }
    line
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        out.push(HEX_DIGITS[usize::from(byte >> 4)] as char);
        out.push(HEX_DIGITS[usize::from(byte & 0x0f)] as char);
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// The earliest year `parse_rfc3339_utc` takes: times before the Unix epoch have no use here.
const YEAR_MIN: i64 = 1970;
/// The latest: RFC 3339 has four digits for the year.
const YEAR_MAX: i64 = 9999;
const SECONDS_PER_DAY: u64 = 86_400;

/// Reads a time written `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339 in UTC, whole seconds, as the access
/// file writes expiries); None for anything else, an impossible date (February 30th) included.
pub fn parse_rfc3339_utc(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() != 20 {
        return None;
    }
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'Z')];
    if separators.iter().any(|&(at, separator)| bytes[at] != separator) {
        return None;
    }
    let number = |from: usize, to: usize| -> Option<i64> {
        let digits = &bytes[from..to];
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| digits.iter().fold(0i64, |value, digit| value * 10 + i64::from(digit - b'0')))
    };
    let (year, month, day) = (number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    let valid = (YEAR_MIN..=YEAR_MAX).contains(&year)
        && (1..=12).contains(&month)
        && day >= 1
        && day <= days_in_month(year, month)
        && hour < 24
        && minute < 60
        && second < 60;
    if !valid {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * SECONDS_PER_DAY as i64 + hour * 3600 + minute * 60 + second;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?))
}

/// Writes a time as `YYYY-MM-DDTHH:MM:SSZ` (fractions of a second dropped); times before the
/// Unix epoch are written as the epoch, times after year 9999 as its last second.
pub fn format_rfc3339_utc(time: SystemTime) -> String {
    let seconds_max = days_from_civil(YEAR_MAX, 12, 31) as u64 * SECONDS_PER_DAY + SECONDS_PER_DAY - 1;
    let seconds = time.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs()).min(seconds_max);
    let (year, month, day) = civil_from_days((seconds / SECONDS_PER_DAY) as i64);
    let in_day = seconds % SECONDS_PER_DAY;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", in_day / 3600, in_day / 60 % 60, in_day % 60)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of `days_from_civil`.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_is_prefixed_random_hex_and_its_digest_line_parses_back() {
        let token = generate();
        assert_eq!(token.len(), TOKEN_PREFIX.len() + 64);
        assert!(token.starts_with(TOKEN_PREFIX));
        assert!(token[TOKEN_PREFIX.len()..].bytes().all(|digit| hex_value(digit).is_some()));
        assert_ne!(token, generate(), "two tokens are never the same");
        let line = digest_line(&token);
        assert_eq!(line.len(), DIGEST_PREFIX.len() + 64);
        assert_eq!(parse_digest(&line), Some(digest(&token)));
        assert_eq!(format_digest(&digest(&token)), line);
    }

    #[test]
    fn the_digest_is_sha256() {
        // The SHA-256 of "abc", from FIPS 180-2's examples.
        assert_eq!(
            digest_line("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn only_lowercase_hex_digests_of_the_right_length_parse() {
        let good = digest_line("abc");
        assert!(parse_digest(&good).is_some());
        assert!(parse_digest(&good.to_uppercase()).is_none());
        assert!(parse_digest(&good.replace("sha256:", "sha1:")).is_none());
        assert!(parse_digest(&good[..good.len() - 1]).is_none());
        assert!(parse_digest(&format!("{good}0")).is_none());
        assert!(parse_digest(&good.replacen('b', "g", 1)).is_none());
    }

    #[test]
    fn rfc3339_times_round_trip() {
        for text in [
            "1970-01-01T00:00:00Z",
            "2000-02-29T12:34:56Z",
            "2026-12-02T04:45:39Z",
            "2027-01-01T00:00:00Z",
            "2100-03-01T23:59:59Z",
            "9999-12-31T23:59:59Z",
        ] {
            let time = parse_rfc3339_utc(text).unwrap_or_else(|| panic!("{text} parses"));
            assert_eq!(format_rfc3339_utc(time), text);
        }
        assert_eq!(parse_rfc3339_utc("1970-01-02T00:00:01Z"), Some(UNIX_EPOCH + Duration::from_secs(86_401)));
        // 2027-01-01 is 20,819 days after the epoch.
        assert_eq!(
            parse_rfc3339_utc("2027-01-01T00:00:00Z"),
            Some(UNIX_EPOCH + Duration::from_secs(20_819 * 86_400))
        );
        let with_fraction = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(format_rfc3339_utc(with_fraction), "1970-01-01T00:00:01Z");
    }

    #[test]
    fn malformed_or_impossible_rfc3339_times_do_not_parse() {
        for text in [
            "",
            "2027-01-01",
            "2027-01-01T00:00:00",
            "2027-01-01T00:00:00+00:00",
            "2027-01-01T00:00:00.5Z",
            "2027-01-01t00:00:00z",
            "2027-01-01 00:00:00Z",
            "2027-13-01T00:00:00Z",
            "2027-00-01T00:00:00Z",
            "2027-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2027-04-31T00:00:00Z",
            "2027-01-00T00:00:00Z",
            "2027-01-01T24:00:00Z",
            "2027-01-01T00:60:00Z",
            "2027-01-01T00:00:60Z",
            "1969-12-31T23:59:59Z",
            "+027-01-01T00:00:00Z",
            "2027-01-0١T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339_utc(text), None, "{text:?} must not parse");
        }
    }

    #[test]
    fn the_access_line_is_what_the_file_parses() {
        let expires = parse_rfc3339_utc("2027-01-01T00:00:00Z");
        assert_eq!(
            access_line("alice", "abc", expires),
            "token alice sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad \
             expires=2027-01-01T00:00:00Z"
        );
        assert!(!access_line("alice", "abc", None).contains("expires"));
    }
}
