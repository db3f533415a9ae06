//! The latencies a shard reports in its stats: how long a publish waits for its durable commit,
//! and how long the disk takes with each commit, over the last `LATENCY_WINDOW_SECONDS` to
//! twice that.
//!
//! A client's publish-ack latency also holds its own threads' wake-ups, the loopback and the
//! shard's turn on a shared core; these figures hold only what happens inside the shard, so an
//! operator (and `ringpost-bench`) can tell the two apart. They are measured with the monotonic
//! clock, not the forwarder's clock seam: a manual clock in a test would report every latency
//! as zero.
//!
//! Each shard is one thread, so its recorders are thread-local: every log of the shard records
//! into the same one without a handle being passed down to it.

use hdrhistogram::Histogram;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Seconds of latencies a summary covers at least; it covers at most twice as many.
pub const LATENCY_WINDOW_SECONDS: u64 = 10;
/// The longest latency recorded as itself; longer ones count as this.
const LATENCY_US_MAX: u64 = 60_000_000;
/// Two significant digits: a reported percentile is within 1% of the true one.
const LATENCY_SIGNIFICANT_DIGITS: u8 = 2;

/// Latencies a shard measured over its last `LATENCY_WINDOW_SECONDS` to twice that; all zero
/// when it measured none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

/// Latencies of one kind, in two windows of `LATENCY_WINDOW_SECONDS`: the one filling and the
/// one before it. A summary merges both, so it never covers less than a whole window (a
/// summary right after a switch would otherwise describe a few samples).
pub struct LatencyWindow {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    current_since: Instant,
}

impl LatencyWindow {
    pub fn new(now: Instant) -> LatencyWindow {
        let histogram = || {
            Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_DIGITS)
                .expect("the latency bounds are valid")
        };
        LatencyWindow { current: histogram(), previous: histogram(), current_since: now }
    }

    /// Moves to a new window if the current one is over; forgets both after two quiet windows.
    fn advance(&mut self, now: Instant) {
        let window = Duration::from_secs(LATENCY_WINDOW_SECONDS);
        let elapsed = now.saturating_duration_since(self.current_since);
        if elapsed < window {
            return;
        }
        std::mem::swap(&mut self.current, &mut self.previous);
        self.current.reset();
        if elapsed >= 2 * window {
            self.previous.reset();
        }
        self.current_since = now;
    }

    pub fn record(&mut self, latency: Duration, now: Instant) {
        self.advance(now);
        self.current.saturating_record((latency.as_micros() as u64).max(1));
    }

    pub fn summary(&mut self, now: Instant) -> LatencySummary {
        self.advance(now);
        let mut merged = self.previous.clone();
        // Both have the same bounds, so adding cannot fail.
        let _ = merged.add(&self.current);
        if merged.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: merged.len(),
            p50_us: merged.value_at_quantile(0.50),
            p99_us: merged.value_at_quantile(0.99),
            p999_us: merged.value_at_quantile(0.999),
            max_us: merged.max(),
        }
    }
}

/// The latencies one shard records.
pub struct ShardLatencies {
    /// A publish request, from its validated body to its durable result.
    pub publish: LatencyWindow,
    /// A commit of any of the shard's logs (messages or acknowledgements), from its write
    /// issued to the quorum of its copies durable.
    pub commit: LatencyWindow,
}

thread_local! {
    static SHARD_LATENCIES: RefCell<ShardLatencies> = RefCell::new(ShardLatencies {
        publish: LatencyWindow::new(crate::runtime::now()),
        commit: LatencyWindow::new(crate::runtime::now()),
    });
}

/// Records on this shard a publish that started at `started`.
pub fn record_publish(started: Instant) {
    let now = crate::runtime::now();
    super::shard::record_publish_ack(now - started);
    SHARD_LATENCIES.with(|latencies| latencies.borrow_mut().publish.record(now - started, now));
}

/// Records on this shard a commit whose write was issued at `issued`.
pub fn record_commit(issued: Instant) {
    let now = crate::runtime::now();
    super::shard::record_commit(now - issued);
    SHARD_LATENCIES.with(|latencies| latencies.borrow_mut().commit.record(now - issued, now));
}

/// This shard's publish and commit latency summaries.
pub fn shard_summaries() -> (LatencySummary, LatencySummary) {
    let now = crate::runtime::now();
    SHARD_LATENCIES.with(|latencies| {
        let mut latencies = latencies.borrow_mut();
        (latencies.publish.summary(now), latencies.commit.summary(now))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_covers_the_current_window_and_the_one_before() {
        let start = crate::runtime::now();
        let mut window = LatencyWindow::new(start);
        assert_eq!(window.summary(start), LatencySummary::default(), "nothing recorded");
        for latency_us in 1..=100 {
            window.record(Duration::from_micros(latency_us * 10), start);
        }
        let summary = window.summary(start);
        assert_eq!(summary.count, 100);
        assert!((495..=505).contains(&summary.p50_us), "{summary:?}");
        assert!((985..=995).contains(&summary.p99_us), "{summary:?}");
        assert!((995..=1005).contains(&summary.max_us), "{summary:?}");

        // A window later, the first window's samples still count, beside the new ones.
        let later = start + Duration::from_secs(LATENCY_WINDOW_SECONDS);
        window.record(Duration::from_millis(50), later);
        let summary = window.summary(later);
        assert_eq!(summary.count, 101);
        assert!((49_750..=50_250).contains(&summary.max_us), "{summary:?}");

        // Two windows later, only the second window's sample is left.
        let summary = window.summary(later + Duration::from_secs(LATENCY_WINDOW_SECONDS));
        assert_eq!(summary.count, 1);
        assert_eq!(summary.p50_us, summary.max_us);

        // After two quiet windows, nothing.
        let quiet = later + Duration::from_secs(3 * LATENCY_WINDOW_SECONDS);
        assert_eq!(window.summary(quiet), LatencySummary::default());
    }

    #[test]
    fn latencies_beyond_the_bound_count_as_the_bound() {
        let start = crate::runtime::now();
        let mut window = LatencyWindow::new(start);
        window.record(Duration::from_secs(3600), start);
        window.record(Duration::ZERO, start);
        let summary = window.summary(start);
        assert_eq!(summary.count, 2);
        assert!(summary.max_us >= LATENCY_US_MAX * 99 / 100 && summary.max_us <= LATENCY_US_MAX * 101 / 100);
        assert_eq!(summary.p50_us, 1, "zero counts as one microsecond");
    }
}
