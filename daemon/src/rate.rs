//! Per-second rates for the stats (published, delivered, acknowledged per second), averaged over
//! the last `RATE_WINDOW_SECONDS`.
//!
//! A forwarder samples every counter on the same once-a-second tick, so the tick times are kept
//! once per forwarder (`RateTicks`) and each counter keeps only what moved in each tick
//! (`RateWindow`: 56 bytes, no allocation). With 10,000 idle topics a window of timestamped
//! samples per counter cost more than everything else a topic holds.

use std::collections::VecDeque;
use std::time::Instant;

/// Seconds a rate in the stats is averaged over.
pub const RATE_WINDOW_SECONDS: usize = 10;

/// The times of a forwarder's last `RATE_WINDOW_SECONDS + 1` sampling ticks.
#[derive(Default)]
pub struct RateTicks {
    times: VecDeque<Instant>,
}

impl RateTicks {
    /// Records a tick; call it before sampling the windows on that tick.
    pub fn tick(&mut self, now: Instant) {
        self.times.push_back(now);
        while self.times.len() > RATE_WINDOW_SECONDS + 1 {
            self.times.pop_front();
        }
    }

    /// Seconds spanned by a window's last `deltas` samples (0 when there are none).
    fn span_seconds(&self, deltas: usize) -> f64 {
        let count = self.times.len();
        if deltas == 0 || deltas >= count {
            return 0.0;
        }
        self.times[count - 1].duration_since(self.times[count - 1 - deltas]).as_secs_f64()
    }
}

/// One counter's increase in each of the last ticks.
#[derive(Default)]
pub struct RateWindow {
    /// The counter at the last tick; None before the first.
    last_total: Option<u64>,
    /// Increase per tick, a ring; a tick that saw more than u32::MAX counts u32::MAX.
    deltas: [u32; RATE_WINDOW_SECONDS],
    /// Where the next delta goes, and how many of `deltas` are filled.
    next: u8,
    filled: u8,
}

impl RateWindow {
    /// Samples the counter on a tick already recorded in the forwarder's `RateTicks`.
    pub fn sample(&mut self, total: u64) {
        if let Some(last) = self.last_total {
            self.deltas[self.next as usize] = total.saturating_sub(last).min(u32::MAX as u64) as u32;
            self.next = ((self.next as usize + 1) % RATE_WINDOW_SECONDS) as u8;
            self.filled = (self.filled as usize + 1).min(RATE_WINDOW_SECONDS) as u8;
        }
        self.last_total = Some(total);
    }

    pub fn per_second(&self, ticks: &RateTicks) -> u64 {
        let filled = self.filled as usize;
        let seconds = ticks.span_seconds(filled);
        if seconds <= 0.0 {
            return 0;
        }
        let increase: u64 = self.deltas[..filled].iter().map(|delta| *delta as u64).sum();
        (increase as f64 / seconds).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rates_average_the_last_samples() {
        let mut ticks = RateTicks::default();
        let mut window = RateWindow::default();
        let start = Instant::now();
        assert_eq!(window.per_second(&ticks), 0);
        for second in 0..30u64 {
            ticks.tick(start + Duration::from_secs(second));
            window.sample(second * 500);
        }
        assert_eq!(window.per_second(&ticks), 500);
        assert_eq!(ticks.times.len(), RATE_WINDOW_SECONDS + 1, "the ticks stay bounded");
        ticks.tick(start + Duration::from_secs(30));
        window.sample(29 * 500);
        assert_eq!(window.per_second(&ticks), 450, "a quiet second lowers the average");
    }

    #[test]
    fn a_window_younger_than_the_ticks_averages_over_its_own_samples() {
        let mut ticks = RateTicks::default();
        let start = Instant::now();
        for second in 0..20u64 {
            ticks.tick(start + Duration::from_secs(second));
        }
        // Created with 1,000 already counted (a recovered topic): that is not a rate.
        let mut window = RateWindow::default();
        window.sample(1000);
        assert_eq!(window.per_second(&ticks), 0);
        for second in 20..23u64 {
            ticks.tick(start + Duration::from_secs(second));
            window.sample(1000 + (second - 19) * 300);
        }
        assert_eq!(window.per_second(&ticks), 300);
    }

    #[test]
    fn uneven_ticks_use_their_real_span() {
        let mut ticks = RateTicks::default();
        let mut window = RateWindow::default();
        let start = Instant::now();
        ticks.tick(start);
        window.sample(0);
        ticks.tick(start + Duration::from_millis(2000));
        window.sample(1000);
        assert_eq!(window.per_second(&ticks), 500);
    }

    #[test]
    fn stays_small() {
        assert!(std::mem::size_of::<RateWindow>() <= 64);
    }
}
