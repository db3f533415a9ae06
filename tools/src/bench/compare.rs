//! `compare A.json B.json`: two runs side by side, with the ratio B/A of every number.
//!
//! Any two JSON documents work, so a publish run can be set beside another publish run, a disk
//! run beside a disk run, or one workload of two builds beside each other. Fields are matched by
//! their dotted path (`publish_ack_us.p99`); a field only one side has is shown with a dash.

use super::format::thousands;
use super::Failure;
use crate::json::{self, Value};
use std::path::Path;

/// A parsed result file and the name it is shown under.
pub struct Run {
    pub name: String,
    pub fields: Vec<(String, Value)>,
}

impl Run {
    pub fn load(path: &Path) -> Result<Run, Failure> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| Failure::runtime(format!("reading {}: {error}", path.display())))?;
        let value = json::parse(&text).map_err(|error| {
            Failure::usage(format!("InvalidArgument: {} is not a JSON document: {error}", path.display()))
        })?;
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Run { name, fields: value.flatten() })
    }
}

/// A number the way the tables print it: whole numbers with digit groups, others with up to
/// three decimals.
fn show(value: Option<&Value>) -> String {
    match value {
        None => "-".to_owned(),
        Some(Value::Null) => "null".to_owned(),
        Some(Value::Bool(flag)) => flag.to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Number(number)) if number.abs() < 1e18 => {
            let sign = if *number < 0.0 { "-" } else { "" };
            let text = format!("{:.3}", number.abs());
            let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
            let whole = thousands(whole.parse().unwrap_or(0));
            match fraction.trim_end_matches('0') {
                "" => format!("{sign}{whole}"),
                fraction => format!("{sign}{whole}.{fraction}"),
            }
        }
        Some(Value::Number(number)) => format!("{number:e}"),
        Some(Value::Array(_) | Value::Object(_)) => "…".to_owned(),
    }
}

/// B/A for two numbers, `-` when either is missing or A is zero.
fn ratio(first: Option<&Value>, second: Option<&Value>) -> String {
    match (first, second) {
        (Some(Value::Number(first)), Some(Value::Number(second))) if *first != 0.0 => {
            format!("{:.2}x", second / first)
        }
        (Some(Value::Number(first)), Some(Value::Number(second))) if first == second => "1.00x".to_owned(),
        _ => "-".to_owned(),
    }
}

/// The side-by-side table: one row per field of either run, in the order of the first run and
/// then the fields only the second has.
pub fn table(first: &Run, second: &Run) -> String {
    let lookup = |run: &Run, key: &str| {
        run.fields.iter().find(|(name, _)| name == key).map(|(_, value)| value.clone())
    };
    let mut keys: Vec<&str> = first.fields.iter().map(|(key, _)| key.as_str()).collect();
    for (key, _) in &second.fields {
        if !keys.contains(&key.as_str()) {
            keys.push(key);
        }
    }
    let mut rows = vec![["field".to_owned(), first.name.clone(), second.name.clone(), "B/A".to_owned()]];
    for key in keys {
        let (a, b) = (lookup(first, key), lookup(second, key));
        rows.push([key.to_owned(), show(a.as_ref()), show(b.as_ref()), ratio(a.as_ref(), b.as_ref())]);
    }
    let mut widths = [0usize; 4];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let [key, a, b, ratio] = row;
        out.push_str(&format!(
            "{key:<w0$}  {a:>w1$}  {b:>w2$}  {ratio:>w3$}\n",
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        ));
    }
    out.push_str("A is the first file, B the second; B/A above 1 means B is larger (better for msgs/s, worse for latency)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, text: &str) -> Run {
        Run { name: name.into(), fields: json::parse(text).unwrap().flatten() }
    }

    #[test]
    fn side_by_side_with_ratios() {
        let first =
            run("a.json", r#"{"workload":"publish","msgs_per_sec":1000.0,"publish_ack_us":{"p99":200}}"#);
        let second = run(
            "b.json",
            r#"{"workload":"publish","msgs_per_sec":1500.0,"publish_ack_us":{"p99":100},"lost":0}"#,
        );
        let table = table(&first, &second);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("field"), "{table}");
        assert!(lines[1].contains("publish") && lines[1].ends_with('-'), "{table}");
        assert!(
            lines[2].contains("1,000") && lines[2].contains("1,500") && lines[2].ends_with("1.50x"),
            "{table}"
        );
        assert!(lines[3].starts_with("publish_ack_us.p99") && lines[3].ends_with("0.50x"), "{table}");
        assert!(lines[4].starts_with("lost") && lines[4].contains(" - "), "{table}");
    }

    #[test]
    fn numbers_are_shown_like_the_tables() {
        assert_eq!(show(Some(&Value::Number(1234567.0))), "1,234,567");
        assert_eq!(show(Some(&Value::Number(-12.0))), "-12");
        assert_eq!(show(Some(&Value::Number(0.5))), "0.5");
        assert_eq!(show(Some(&Value::Number(241088.3))), "241,088.3");
        assert_eq!(show(Some(&Value::Number(1e30))), "1e30");
        assert_eq!(show(None), "-");
        assert_eq!(ratio(Some(&Value::Number(0.0)), Some(&Value::Number(0.0))), "1.00x");
        assert_eq!(ratio(Some(&Value::Number(0.0)), Some(&Value::Number(3.0))), "-");
    }
}
