//! Figures the threads update as they go and the progress line printed from them once a second.

use super::format::thousands;
use super::latency::new_histogram;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// One thread's running figures. A publisher counts acknowledged messages and publish-ack
/// latency; a subscriber counts deliveries and delivery (end-to-end) latency.
pub struct LiveStats {
    pub messages: AtomicU64,
    pub messages_failed: AtomicU64,
    /// Latencies since the last progress line; the reporter drains it every interval.
    pub interval_latency_us: Mutex<Histogram<u64>>,
}

impl LiveStats {
    pub fn new() -> LiveStats {
        LiveStats {
            messages: AtomicU64::new(0),
            messages_failed: AtomicU64::new(0),
            interval_latency_us: Mutex::new(new_histogram()),
        }
    }
}

impl Default for LiveStats {
    fn default() -> Self {
        LiveStats::new()
    }
}

/// One side's figures (publish or delivery) for the interval since the previous line.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    pub messages_per_sec: f64,
    /// `None` when nothing completed in the interval.
    pub latency_us_p99: Option<u64>,
}

/// One progress line's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub elapsed_seconds: f64,
    pub publish: Rate,
    pub mb_per_sec: f64,
    /// Messages failed since the start (publishes, and for subscribers failed acknowledgements).
    pub messages_failed: u64,
    /// Deliveries, for workloads with subscribers.
    pub delivery: Option<Rate>,
}

impl Progress {
    /// `[  3.0s] 245,112 msg/s  251.0 MB/s  p99 1,234 us  errors 0`, and with subscribers
    /// `  | delivered 240,000 msg/s  e2e p99 2,345 us` after it.
    pub fn line(&self) -> String {
        let p99 = |rate: &Rate| rate.latency_us_p99.map(thousands).unwrap_or_else(|| "-".to_owned());
        let mut line = format!(
            "[{:5.1}s] {} msg/s  {:.1} MB/s  p99 {} us  errors {}",
            self.elapsed_seconds,
            thousands(self.publish.messages_per_sec.round() as u64),
            self.mb_per_sec,
            p99(&self.publish),
            thousands(self.messages_failed)
        );
        if let Some(delivery) = &self.delivery {
            line.push_str(&format!(
                "  | delivered {} msg/s  e2e p99 {} us",
                thousands(delivery.messages_per_sec.round() as u64),
                p99(delivery)
            ));
        }
        line
    }
}

/// The threads a progress reporter watches.
pub struct Watched<'a> {
    pub publishers: &'a [LiveStats],
    pub subscribers: &'a [LiveStats],
    /// Threads not yet done; the reporter stops when it reaches zero.
    pub running: &'a AtomicUsize,
    pub size_bytes: usize,
}

/// Sums the counters and drains the interval histograms of `stats`.
fn collect(stats: &[LiveStats], interval_latency_us: &mut Histogram<u64>) -> (u64, u64) {
    interval_latency_us.reset();
    let mut messages = 0;
    let mut failed = 0;
    for stats in stats {
        let mut latency = stats.interval_latency_us.lock().unwrap();
        interval_latency_us.add(&*latency).expect("histograms with equal bounds merge");
        latency.reset();
        messages += stats.messages.load(Ordering::Relaxed);
        failed += stats.messages_failed.load(Ordering::Relaxed);
    }
    (messages, failed)
}

/// Calls `progress` every interval until every watched thread is done. Threads unpark the
/// calling thread when they finish, so the run does not linger.
pub fn report_progress(watched: &Watched, progress: &mut dyn FnMut(&Progress)) {
    let started = Instant::now();
    let mut last_tick = started;
    let mut next_tick = started + PROGRESS_INTERVAL;
    let mut last_published = 0u64;
    let mut last_delivered = 0u64;
    let mut publish_latency_us = new_histogram();
    let mut delivery_latency_us = new_histogram();
    let p99 = |histogram: &Histogram<u64>| (!histogram.is_empty()).then(|| histogram.value_at_quantile(0.99));
    while watched.running.load(Ordering::Acquire) > 0 {
        let now = Instant::now();
        if now < next_tick {
            std::thread::park_timeout(next_tick - now);
            continue;
        }
        let (published, publish_failed) = collect(watched.publishers, &mut publish_latency_us);
        let (delivered, delivery_failed) = collect(watched.subscribers, &mut delivery_latency_us);
        let seconds = (now - last_tick).as_secs_f64();
        let publish_per_sec = published.saturating_sub(last_published) as f64 / seconds;
        progress(&Progress {
            elapsed_seconds: (now - started).as_secs_f64(),
            publish: Rate { messages_per_sec: publish_per_sec, latency_us_p99: p99(&publish_latency_us) },
            mb_per_sec: publish_per_sec * watched.size_bytes as f64 / 1e6,
            messages_failed: publish_failed + delivery_failed,
            delivery: (!watched.subscribers.is_empty()).then(|| Rate {
                messages_per_sec: delivered.saturating_sub(last_delivered) as f64 / seconds,
                latency_us_p99: p99(&delivery_latency_us),
            }),
        });
        last_tick = now;
        last_published = published;
        last_delivered = delivered;
        // After a stall (a suspended process), skip the missed ticks rather than print a burst.
        while next_tick <= now {
            next_tick += PROGRESS_INTERVAL;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        let mut progress = Progress {
            elapsed_seconds: 3.0,
            publish: Rate { messages_per_sec: 245_112.0, latency_us_p99: Some(1234) },
            mb_per_sec: 251.0,
            messages_failed: 0,
            delivery: None,
        };
        assert_eq!(progress.line(), "[  3.0s] 245,112 msg/s  251.0 MB/s  p99 1,234 us  errors 0");
        progress.delivery = Some(Rate { messages_per_sec: 240_000.0, latency_us_p99: None });
        assert_eq!(
            progress.line(),
            "[  3.0s] 245,112 msg/s  251.0 MB/s  p99 1,234 us  errors 0  | delivered 240,000 msg/s  e2e p99 - us"
        );
    }
}
