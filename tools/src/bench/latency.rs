//! Latency histograms and the clock that publish start times are written in.
//!
//! Every latency is kept in microseconds in an HdrHistogram with three significant figures, so
//! percentiles are exact to 0.1% at any magnitude and histograms of different threads merge.

use hdrhistogram::Histogram;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Latencies above a minute are recorded as a minute; a run like that is broken anyway.
pub const LATENCY_US_MAX: u64 = 60_000_000;
const LATENCY_SIGNIFICANT_FIGURES: u8 = 3;

/// The quantiles reported, with their names in the tables and in the JSON.
pub const QUANTILES: [(&str, &str, f64); 4] =
    [("p50", "p50", 0.50), ("p90", "p90", 0.90), ("p99", "p99", 0.99), ("p99.9", "p999", 0.999)];

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_FIGURES)
        .expect("the latency histogram bounds are valid")
}

/// The value at `quantile`, or 0 for an empty histogram (which has no meaningful quantile).
pub fn at(histogram: &Histogram<u64>, quantile: f64) -> u64 {
    if histogram.is_empty() {
        0
    } else {
        histogram.value_at_quantile(quantile)
    }
}

/// `{"p50":..,"p90":..,"p99":..,"p999":..,"max":..}` in microseconds.
pub fn json(histogram: &Histogram<u64>) -> String {
    let mut fields: Vec<(&str, String)> =
        QUANTILES.iter().map(|(_, key, quantile)| (*key, at(histogram, *quantile).to_string())).collect();
    fields.push(("max", histogram.max().to_string()));
    crate::json::object(&fields)
}

/// Microseconds between two instants, 0 if `to` is not after `from`.
pub fn micros_between(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_micros() as u64
}

/// The instant every stamp counts from. Publishers and subscribers live in the same process, so
/// a monotonic clock shared by them measures delivery latency without any clock skew.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Fixes the stamp epoch now. Called before any thread takes a time to stamp, so that no stamp
/// is of an instant before the epoch (which would be rounded up to it).
pub fn start_clock() {
    epoch();
}

/// `instant` as nanoseconds since the process's stamp epoch, for writing into a payload.
pub fn stamp_ns(instant: Instant) -> u64 {
    instant.saturating_duration_since(epoch()).as_nanos() as u64
}

/// The instant a stamp stands for.
pub fn instant_of_stamp(stamp_ns: u64) -> Instant {
    epoch() + Duration::from_nanos(stamp_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip() {
        start_clock();
        let now = Instant::now();
        let back = instant_of_stamp(stamp_ns(now));
        assert!(back <= now && now - back < Duration::from_micros(1));
    }

    #[test]
    fn json_of_quantiles() {
        let mut histogram = new_histogram();
        assert_eq!(json(&histogram), "{\"p50\":0,\"p90\":0,\"p99\":0,\"p999\":0,\"max\":0}");
        histogram.record(1000).unwrap();
        assert_eq!(json(&histogram), "{\"p50\":1000,\"p90\":1000,\"p99\":1000,\"p999\":1000,\"max\":1000}");
    }
}
