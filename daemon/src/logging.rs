//! The daemon's log: one line per event on stderr, with the time (UTC, milliseconds) and a
//! level, as text or as JSON (`--log-format`), below a level (`--log-level`, else
//! `RINGPOST_LOG`). Events are rare (starts, stops, elections, failures), never per request,
//! so a line is formatted whole and written with one call, and the settings are two atomics
//! read per line.
//!
//! `log_info!`, `log_warn!` and `log_error!` take `format!`'s arguments. A message that begins
//! `ringpostd: ` has it taken off (the text format puts it back after the level); one that
//! then begins `WARNING: ` or `ERROR: ` is logged at that level, whatever the macro said.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(text: &str) -> Result<Level, String> {
        match text.to_ascii_lowercase().as_str() {
            "error" => Ok(Level::Error),
            "warn" | "warning" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" => Ok(Level::Debug),
            other => Err(format!("unknown log level '{other}': use error, warn, info or debug")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(text: &str) -> Result<Format, String> {
        match text {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown log format '{other}': use text or json")),
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static FORMAT: AtomicU8 = AtomicU8::new(Format::Text as u8);

/// Sets the level lines must reach and their format, for the whole process.
pub fn configure(level: Level, format: Format) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    FORMAT.store(format as u8, Ordering::Relaxed);
}

/// Logs `message` at `level` (or at the level its `WARNING: `/`ERROR: ` prefix names).
pub fn line(level: Level, message: std::fmt::Arguments<'_>) {
    let text = message.to_string();
    let text = text.strip_prefix("ringpostd: ").unwrap_or(&text);
    let (level, text) = if let Some(rest) = text.strip_prefix("ERROR: ") {
        (Level::Error, rest)
    } else if let Some(rest) = text.strip_prefix("WARNING: ") {
        (Level::Warn, rest)
    } else {
        (level, text)
    };
    if level as u8 > LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let json = FORMAT.load(Ordering::Relaxed) == Format::Json as u8;
    let formatted = format_line(utc_now_text(), level, text, json);
    // One write, so lines of different threads do not interleave.
    let _ = std::io::stderr().lock().write_all(formatted.as_bytes());
}

fn format_line(time: String, level: Level, text: &str, json: bool) -> String {
    let mut line = String::with_capacity(text.len() + 64);
    if json {
        line.push_str("{\"time\":\"");
        line.push_str(&time);
        line.push_str("\",\"level\":\"");
        line.push_str(level.name());
        line.push_str("\",\"message\":");
        push_json_string(&mut line, text);
        line.push_str("}\n");
    } else {
        let _ = writeln!(line, "{time} {:<5} ringpostd: {text}", level.name().to_ascii_uppercase());
    }
    line
}

/// Appends `text` to `out` as a JSON string, quoted and escaped (also the push requests' bodies).
pub(crate) fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The wall clock as RFC 3339 in UTC with milliseconds (`2026-12-05T07:40:00.123Z`).
fn utc_now_text() -> String {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    utc_text(since.as_millis() as u64)
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC with milliseconds (also the push
/// requests' publish times).
pub(crate) fn utc_text(millis: u64) -> String {
    let seconds = millis / 1000;
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's days-to-civil: the proleptic Gregorian date of a day count.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        millis % 1000
    )
}

#[macro_export]
macro_rules! log_error {
    ($($argument:tt)*) => { $crate::logging::line($crate::logging::Level::Error, format_args!($($argument)*)) };
}

#[macro_export]
macro_rules! log_warn {
    ($($argument:tt)*) => { $crate::logging::line($crate::logging::Level::Warn, format_args!($($argument)*)) };
}

#[macro_export]
macro_rules! log_info {
    ($($argument:tt)*) => { $crate::logging::line($crate::logging::Level::Info, format_args!($($argument)*)) };
}

#[macro_export]
macro_rules! log_debug {
    ($($argument:tt)*) => { $crate::logging::line($crate::logging::Level::Debug, format_args!($($argument)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_text(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc_text(1_796_456_400_999), "2026-12-05T07:40:00.999Z");
        assert_eq!(utc_text(4_102_444_799_000), "2099-12-31T23:59:59.000Z");
    }

    #[test]
    fn lines_in_text_and_in_json() {
        let text = format_line("T".into(), Level::Warn, "disk \"a\"\nfull", false);
        assert_eq!(text, "T WARN  ringpostd: disk \"a\"\nfull\n");
        let json = format_line("T".into(), Level::Warn, "disk \"a\"\nfull", true);
        assert_eq!(json, "{\"time\":\"T\",\"level\":\"warn\",\"message\":\"disk \\\"a\\\"\\nfull\"}\n");
    }

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("WARNING".parse::<Level>(), Ok(Level::Warn));
        assert!("loud".parse::<Level>().is_err());
        assert!(Level::Error < Level::Debug);
    }
}
