//! Number formatting for people (thousands separators) and for JSON, and parsing of byte sizes
//! on the command line.

/// `1234567` as `1,234,567`: benchmark figures are read at a glance, and digit groups make an
/// order of magnitude visible.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A float with a fixed number of decimals; JSON has no NaN or infinity, so those become null
/// rather than an unparsable document.
pub fn json_number(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "null".to_owned()
    }
}

/// Parses a byte count: a plain number of bytes, or a number followed by KiB, MiB or GiB.
/// Only binary units are accepted because block sizes must be multiples of 4096 and a decimal
/// "64K" would silently be 64,000.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, multiplier) = [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)]
        .iter()
        .find_map(|(suffix, multiplier)| text.strip_suffix(suffix).map(|number| (number, *multiplier)))
        .unwrap_or((text, 1));
    let value: u64 = number.trim().parse().map_err(|_| {
        format!("'{text}' is not a byte count: use a number of bytes, optionally with KiB, MiB or GiB")
    })?;
    value.checked_mul(multiplier).ok_or_else(|| format!("'{text}' is too large"))
}

/// Parses a comma-separated list of byte counts, such as `4096,64KiB,1MiB`.
pub fn parse_byte_list(text: &str) -> Result<Vec<usize>, String> {
    let sizes = text
        .split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| parse_bytes(part).map(|bytes| bytes as usize))
        .collect::<Result<Vec<usize>, String>>()?;
    if sizes.is_empty() {
        return Err("the list of sizes is empty".to_owned());
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(245_112), "245,112");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn json_numbers() {
        assert_eq!(json_number(1.23456, 3), "1.235");
        assert_eq!(json_number(f64::NAN, 1), "null");
        assert_eq!(json_number(f64::INFINITY, 1), "null");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("256 MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert!(parse_bytes("64K").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999999GiB").is_err());
        assert_eq!(parse_byte_list("4096,65536,1048576"), Ok(vec![4096, 65536, 1048576]));
        assert_eq!(parse_byte_list("4KiB, 1MiB"), Ok(vec![4096, 1 << 20]));
        assert!(parse_byte_list(",").is_err());
        assert!(parse_byte_list("4096,x").is_err());
    }
}
