//! Just enough JSON and base64 for the tools' output. Hand-written: a few dozen lines, where a
//! serialization framework would be the biggest dependency of the CLI.

/// A JSON string literal.
pub fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON object from (key, already-encoded value) pairs.
pub fn object(fields: &[(&str, String)]) -> String {
    let body: Vec<String> = fields.iter().map(|(key, value)| format!("{}:{}", string(key), value)).collect();
    format!("{{{}}}", body.join(","))
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// RFC 3339 UTC time with milliseconds, from milliseconds since the Unix epoch.
pub fn rfc3339(epoch_ms: u64) -> String {
    let seconds = epoch_ms / 1000;
    let days = (seconds / 86_400) as i64;
    let second_of_day = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        epoch_ms % 1000
    )
}

/// Parses an RFC 3339 time (`2026-11-30T10:00:00Z`, fractional seconds and `+HH:MM` offsets
/// allowed) or a plain number of milliseconds since the Unix epoch, into epoch milliseconds.
pub fn parse_time(text: &str) -> Result<u64, String> {
    if let Ok(milliseconds) = text.parse::<u64>() {
        return Ok(milliseconds);
    }
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Result<i64, String> {
        text.get(range.clone()).and_then(|part| part.parse().ok()).ok_or_else(|| {
            format!("expected digits at {}; use RFC 3339 like 2026-11-30T10:00:00Z", range.start)
        })
    };
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || !matches!(bytes[10], b'T' | b't' | b' ') {
        return Err("use RFC 3339 like 2026-11-30T10:00:00Z, or milliseconds since the epoch".into());
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return Err("a date or time field is out of range".into());
    }
    let mut position = 19;
    let mut milliseconds = 0i64;
    if bytes.get(position) == Some(&b'.') {
        let start = position + 1;
        position = start;
        while bytes.get(position).is_some_and(u8::is_ascii_digit) {
            position += 1;
        }
        let digits = &text[start..position];
        if digits.is_empty() {
            return Err("expected digits after the decimal point".into());
        }
        let padded = format!("{:0<3}", &digits[..digits.len().min(3)]);
        milliseconds = padded.parse().unwrap_or(0);
    }
    let offset_minutes = match &text[position..] {
        "Z" | "z" => 0,
        zone if zone.len() == 6 && matches!(&zone[..1], "+" | "-") && &zone[3..4] == ":" => {
            let hours: i64 = zone[1..3].parse().map_err(|_| "bad offset hours".to_string())?;
            let minutes: i64 = zone[4..6].parse().map_err(|_| "bad offset minutes".to_string())?;
            let sign = if &zone[..1] == "-" { -1 } else { 1 };
            sign * (hours * 60 + minutes)
        }
        _ => return Err("expected Z or an offset like +02:00 after the time".into()),
    };
    // Days from civil date (Howard Hinnant's algorithm), the inverse of `rfc3339`.
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    if seconds < 0 {
        return Err("times before 1970 are not supported".into());
    }
    Ok(seconds as u64 * 1000 + milliseconds as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        for epoch_ms in [0, 1_700_000_000_123, 951_782_400_000, 4_102_444_799_999] {
            assert_eq!(parse_time(&rfc3339(epoch_ms)), Ok(epoch_ms));
        }
        assert_eq!(parse_time("2023-11-14T23:13:20.123+01:00"), Ok(1_700_000_000_123));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
        assert_eq!(parse_time("1700000000000"), Ok(1_700_000_000_000));
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("2023-13-14T22:13:20Z").is_err());
    }
}
