//! Counts of durations in fixed buckets, as Prometheus histograms hold them: a shard adds to its
//! own with plain additions, and a scrape adds the shards' together bucket by bucket, which
//! percentile windows (`latency.rs`) cannot be.

use std::time::Duration;

/// Buckets of a histogram, the last one for everything longer than the last bound.
pub const DURATION_BUCKETS: usize = 24;

/// Upper bounds of the buckets, in microseconds: 50 µs doubling to about 7 minutes (a
/// delivery's latency holds a backlog's wait), then everything longer.
pub const DURATION_BUCKETS_US: [u64; DURATION_BUCKETS] = {
    let mut bounds = [0u64; DURATION_BUCKETS];
    let mut index = 0;
    while index < DURATION_BUCKETS {
        bounds[index] = 50 << index;
        index += 1;
    }
    bounds
};

/// Durations counted by bucket (`DURATION_BUCKETS_US`, then one for longer), and their sum.
/// Empty (no buckets) until the first one is recorded, so that what was never measured costs
/// nothing to carry and is not shown.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DurationHistogram {
    pub buckets: Vec<u64>,
    pub sum_us: u64,
}

impl DurationHistogram {
    pub fn record(&mut self, duration: Duration) {
        let micros = duration.as_micros().min(u64::MAX as u128) as u64;
        let bucket =
            DURATION_BUCKETS_US.iter().position(|bound| micros <= *bound).unwrap_or(DURATION_BUCKETS);
        if self.buckets.is_empty() {
            self.buckets = vec![0; DURATION_BUCKETS + 1];
        }
        self.buckets[bucket] += 1;
        self.sum_us = self.sum_us.saturating_add(micros);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds `other`'s counts to these (a histogram of another length, which a decoder let
    /// through, is left out).
    pub fn add(&mut self, other: &DurationHistogram) {
        if other.buckets.len() != DURATION_BUCKETS + 1 {
            return;
        }
        if self.buckets.is_empty() {
            self.buckets = vec![0; DURATION_BUCKETS + 1];
        }
        for (total, count) in self.buckets.iter_mut().zip(&other.buckets) {
            *total += count;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_the_first_bucket_whose_bound_holds_them() {
        let mut histogram = DurationHistogram::default();
        assert!(histogram.buckets.is_empty());
        histogram.record(Duration::from_micros(40));
        histogram.record(Duration::from_micros(50));
        histogram.record(Duration::from_micros(51));
        histogram.record(Duration::from_secs(3600));
        assert_eq!(histogram.buckets[0], 2);
        assert_eq!(histogram.buckets[1], 1);
        assert_eq!(histogram.buckets[DURATION_BUCKETS], 1);
        assert_eq!(histogram.count(), 4);
        assert_eq!(histogram.sum_us, 3_600_000_141);
        let mut total = DurationHistogram::default();
        total.add(&histogram);
        total.add(&histogram);
        total.add(&DurationHistogram { buckets: vec![1], sum_us: 5 });
        assert_eq!(total.count(), 8);
        assert_eq!(total.sum_us, 2 * histogram.sum_us);
        assert_eq!(DURATION_BUCKETS_US[DURATION_BUCKETS - 1], 50 << 23);
    }
}
