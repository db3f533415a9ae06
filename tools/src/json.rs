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
    // Written as bytes, whole groups first: `ringpost-bench --rest` encodes every message's
    // data, and a char at a time cost the load generator more than the daemon's decoding.
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    let mut groups = bytes.chunks_exact(3);
    for group in &mut groups {
        let n = (group[0] as u32) << 16 | (group[1] as u32) << 8 | group[2] as u32;
        out.extend_from_slice(&[
            BASE64[(n >> 18) as usize],
            BASE64[(n >> 12 & 63) as usize],
            BASE64[(n >> 6 & 63) as usize],
            BASE64[(n & 63) as usize],
        ]);
    }
    let tail = groups.remainder();
    if !tail.is_empty() {
        let n = (tail[0] as u32) << 16 | (*tail.get(1).unwrap_or(&0) as u32) << 8;
        out.push(BASE64[(n >> 18) as usize]);
        out.push(BASE64[(n >> 12 & 63) as usize]);
        out.push(if tail.len() == 2 { BASE64[(n >> 6 & 63) as usize] } else { b'=' });
        out.push(b'=');
    }
    String::from_utf8(out).expect("base64's alphabet is ASCII")
}

/// Decodes standard base64 (RFC 4648's alphabet, as `base64` writes it); the `=` padding may
/// be left out. Whitespace or any other byte outside the alphabet is refused, with its place.
pub fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let unpadded = text.trim_end_matches('=');
    if text.len() - unpadded.len() > 2 || (text.len() != unpadded.len() && !text.len().is_multiple_of(4)) {
        return Err("misplaced '=' padding".into());
    }
    if unpadded.len() % 4 == 1 {
        return Err(format!("{} characters cannot be base64 (a group of 4 lost 3)", unpadded.len()));
    }
    let mut out = Vec::with_capacity(unpadded.len() / 4 * 3 + 2);
    let mut bits = 0u32;
    let mut bit_count = 0;
    for (index, byte) in unpadded.bytes().enumerate() {
        let Some(value) = BASE64.iter().position(|&symbol| symbol == byte) else {
            return Err(format!("byte {index} ({:?}) is not base64", byte as char));
        };
        bits = bits << 6 | value as u32;
        bit_count += 6;
        if bit_count >= 8 {
            bit_count -= 8;
            out.push((bits >> bit_count) as u8);
            bits &= (1 << bit_count) - 1;
        }
    }
    Ok(out)
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

/// A parsed JSON value, for reading back the tools' own output (`ringpost-bench compare`).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Value>),
    /// Fields in document order, which is the order the tools wrote them in.
    Object(Vec<(String, Value)>),
}

/// Nesting deeper than this is refused: the tools write two levels, and a bound keeps a
/// hostile file from overflowing the stack.
pub const DEPTH_MAX: usize = 64;

/// Parses one JSON document (RFC 8259), with the position of the first error.
pub fn parse(text: &str) -> Result<Value, String> {
    let mut parser = Parser { bytes: text.as_bytes(), position: 0 };
    let value = parser.value(0)?;
    parser.skip_space();
    if parser.position != parser.bytes.len() {
        return Err(parser.error("trailing characters after the document"));
    }
    Ok(value)
}

struct Parser<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.position)
    }

    fn skip_space(&mut self) {
        while self.bytes.get(self.position).is_some_and(|byte| b" \t\r\n".contains(byte)) {
            self.position += 1;
        }
    }

    fn expect(&mut self, literal: &str, value: Value) -> Result<Value, String> {
        if self.bytes[self.position..].starts_with(literal.as_bytes()) {
            self.position += literal.len();
            Ok(value)
        } else {
            Err(self.error("unknown literal"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > DEPTH_MAX {
            return Err(self.error("nesting too deep"));
        }
        self.skip_space();
        match self.bytes.get(self.position) {
            None => Err(self.error("unexpected end")),
            Some(b'n') => self.expect("null", Value::Null),
            Some(b't') => self.expect("true", Value::Bool(true)),
            Some(b'f') => self.expect("false", Value::Bool(false)),
            Some(b'"') => self.string().map(Value::String),
            Some(b'[') => {
                self.position += 1;
                let mut items = Vec::new();
                self.skip_space();
                if self.bytes.get(self.position) == Some(&b']') {
                    self.position += 1;
                    return Ok(Value::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.skip_space();
                    match self.bytes.get(self.position) {
                        Some(b',') => self.position += 1,
                        Some(b']') => {
                            self.position += 1;
                            return Ok(Value::Array(items));
                        }
                        _ => return Err(self.error("expected , or ]")),
                    }
                }
            }
            Some(b'{') => {
                self.position += 1;
                let mut fields = Vec::new();
                self.skip_space();
                if self.bytes.get(self.position) == Some(&b'}') {
                    self.position += 1;
                    return Ok(Value::Object(fields));
                }
                loop {
                    self.skip_space();
                    if self.bytes.get(self.position) != Some(&b'"') {
                        return Err(self.error("expected a field name"));
                    }
                    let key = self.string()?;
                    self.skip_space();
                    if self.bytes.get(self.position) != Some(&b':') {
                        return Err(self.error("expected :"));
                    }
                    self.position += 1;
                    fields.push((key, self.value(depth + 1)?));
                    self.skip_space();
                    match self.bytes.get(self.position) {
                        Some(b',') => self.position += 1,
                        Some(b'}') => {
                            self.position += 1;
                            return Ok(Value::Object(fields));
                        }
                        _ => return Err(self.error("expected , or }")),
                    }
                }
            }
            Some(_) => self.number(),
        }
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.position;
        while self.bytes.get(self.position).is_some_and(|byte| b"+-.eE0123456789".contains(byte)) {
            self.position += 1;
        }
        let text = std::str::from_utf8(&self.bytes[start..self.position]).unwrap_or("");
        text.parse::<f64>().map(Value::Number).map_err(|_| {
            self.position = start;
            self.error("expected a value")
        })
    }

    fn string(&mut self) -> Result<String, String> {
        // The caller saw the opening quote.
        self.position += 1;
        let mut out = Vec::new();
        loop {
            let Some(&byte) = self.bytes.get(self.position) else {
                return Err(self.error("unterminated string"));
            };
            self.position += 1;
            match byte {
                b'"' => return String::from_utf8(out).map_err(|_| self.error("invalid UTF-8 in a string")),
                b'\\' => {
                    let Some(&escape) = self.bytes.get(self.position) else {
                        return Err(self.error("unterminated escape"));
                    };
                    self.position += 1;
                    let decoded = match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = self
                                .bytes
                                .get(self.position..self.position + 4)
                                .and_then(|digits| std::str::from_utf8(digits).ok())
                                .and_then(|digits| u32::from_str_radix(digits, 16).ok())
                                .ok_or_else(|| self.error("bad \\u escape"))?;
                            self.position += 4;
                            // Surrogate pairs do not occur in the tools' output; stand-ins suffice.
                            char::from_u32(hex).unwrap_or(char::REPLACEMENT_CHARACTER)
                        }
                        _ => return Err(self.error("unknown escape")),
                    };
                    let mut buffer = [0u8; 4];
                    out.extend_from_slice(decoded.encode_utf8(&mut buffer).as_bytes());
                }
                byte => out.push(byte),
            }
        }
    }
}

impl Value {
    /// Leaves of a document as (dotted path, value) pairs in document order: `{"a":{"b":1}}`
    /// gives `a.b`; array items are numbered, `results.0.mb_per_sec`.
    pub fn flatten(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        self.flatten_into("", &mut out);
        out
    }

    fn flatten_into(&self, prefix: &str, out: &mut Vec<(String, Value)>) {
        let join = |key: &str| if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") };
        match self {
            Value::Object(fields) => {
                for (key, value) in fields {
                    value.flatten_into(&join(key), out);
                }
            }
            Value::Array(items) => {
                for (index, value) in items.iter().enumerate() {
                    value.flatten_into(&join(&index.to_string()), out);
                }
            }
            leaf => out.push((prefix.to_owned(), leaf.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_what_is_not_base64() {
        for length in 0..40usize {
            let bytes: Vec<u8> = (0..length).map(|index| (index * 37 + 251) as u8).collect();
            let text = base64(&bytes);
            assert_eq!(base64_decode(&text).unwrap(), bytes, "{text}");
            assert_eq!(base64_decode(text.trim_end_matches('=')).unwrap(), bytes, "unpadded {text}");
        }
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert!(base64_decode("aGVs bG8").unwrap_err().contains("byte 4"));
        assert!(base64_decode("aGVsb").is_err());
        assert!(base64_decode("aGVsbG8===").is_err());
        assert!(base64_decode("aG=sbG8=").is_err());
    }

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

    #[test]
    fn parses_what_it_writes() {
        let text = object(&[
            ("name", string("a\"b\\c\n")),
            ("count", "3".into()),
            ("rate", "null".into()),
            ("latency", object(&[("p99", "1.5e3".into())])),
            ("list", "[true,false,[],{}]".into()),
        ]);
        let value = parse(&format!(" {text}\n")).unwrap();
        let flat = value.flatten();
        assert_eq!(flat[0], ("name".to_owned(), Value::String("a\"b\\c\n".into())));
        assert_eq!(flat[1], ("count".to_owned(), Value::Number(3.0)));
        assert_eq!(flat[2], ("rate".to_owned(), Value::Null));
        assert_eq!(flat[3], ("latency.p99".to_owned(), Value::Number(1500.0)));
        assert_eq!(flat[4], ("list.0".to_owned(), Value::Bool(true)));
        assert_eq!(parse("\"\\u00e9\"").unwrap(), Value::String("é".into()));
        for bad in ["", "{", "[1,]", "{\"a\" 1}", "nul", "1 2", "\"abc", "{\"a\":x}"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse(&"[".repeat(100)).is_err());
    }
}
