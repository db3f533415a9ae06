//! Per-second rates for the stats (published, delivered, acknowledged per second), averaged over
//! the last `RATE_WINDOW_SECONDS`.
//!
//! A forwarder samples every counter on the same once-a-second tick, so the tick times are kept
//! once per forwarder (`RateTicks`) and each counter keeps only what moved in each tick
//! (`RateWindow`), and only while it moves. With 10,000 idle topics a window of timestamped
//! samples per counter cost more than everything else a topic holds.

use std::cell::Cell;
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

/// One counter's increase in each of the last ticks. The ring of increases is made when the
/// counter first moves and dropped once a whole window passed without a move, so a counter
/// that stays still (an idle topic's, an idle subscription's) costs 16 bytes and no allocation.
/// Its parts are cells, so that its holder needs no `RefCell` (8 bytes more) around it: with
/// 10,000 idle topics, each holding three windows with their subscription, that counted.
#[derive(Default)]
pub struct RateWindow {
    /// The counter at the last tick in its low `TOTAL_BITS` bits, and the ticks sampled so far
    /// (up to `RATE_WINDOW_SECONDS + 1`; 0 before the first, whose total is only a starting
    /// point) in the bits above.
    last: Cell<u64>,
    ring: Cell<Option<Box<DeltaRing>>>,
}

/// Bits of `RateWindow::last` that hold the counter. A counter past them (2^60, over 36 years
/// at a billion a second) is taken as staying there.
const TOTAL_BITS: u32 = 60;
const TOTAL_MAX: u64 = (1 << TOTAL_BITS) - 1;
const _: () = assert!(RATE_WINDOW_SECONDS < (1 << (64 - TOTAL_BITS)), "the samples count fits its bits");

/// Increase per tick; a tick that saw more than u32::MAX counts u32::MAX.
struct DeltaRing {
    deltas: [u32; RATE_WINDOW_SECONDS],
    /// Where the next delta goes.
    next: u8,
}

impl RateWindow {
    /// Samples the counter on a tick already recorded in the forwarder's `RateTicks`.
    pub fn sample(&self, total: u64) {
        let total = total.min(TOTAL_MAX);
        let (last_total, samples) = self.last_and_samples();
        let first = samples == 0;
        let delta = total.saturating_sub(last_total).min(u32::MAX as u64) as u32;
        let samples = (samples + 1).min(RATE_WINDOW_SECONDS + 1);
        self.last.set(total | (samples as u64) << TOTAL_BITS);
        if first {
            return;
        }
        let ring = self.ring.take();
        if ring.is_none() && delta == 0 {
            return;
        }
        // Deltas filled so far, this one included; the ones before a new ring were all 0, and
        // it starts at the slot the next delta would have taken, so `deltas[..filled]` holds
        // the window as if the ring had been there all along.
        let filled = self.filled();
        let mut ring = ring.unwrap_or_else(|| {
            Box::new(DeltaRing {
                deltas: [0; RATE_WINDOW_SECONDS],
                next: ((filled - 1) % RATE_WINDOW_SECONDS) as u8,
            })
        });
        ring.deltas[ring.next as usize] = delta;
        ring.next = ((ring.next as usize + 1) % RATE_WINDOW_SECONDS) as u8;
        if filled < RATE_WINDOW_SECONDS || ring.deltas.iter().any(|delta| *delta != 0) {
            self.ring.set(Some(ring));
        }
    }

    #[cfg(test)]
    fn holds_ring(&self) -> bool {
        let ring = self.ring.take();
        let held = ring.is_some();
        self.ring.set(ring);
        held
    }

    fn last_and_samples(&self) -> (u64, usize) {
        let last = self.last.get();
        (last & TOTAL_MAX, (last >> TOTAL_BITS) as usize)
    }

    /// Deltas in the window: one per sample after the first, at most `RATE_WINDOW_SECONDS`.
    fn filled(&self) -> usize {
        self.last_and_samples().1.saturating_sub(1)
    }

    pub fn per_second(&self, ticks: &RateTicks) -> u64 {
        let Some(ring) = self.ring.take() else { return 0 };
        let filled = self.filled();
        let increase: u64 = ring.deltas[..filled].iter().map(|delta| *delta as u64).sum();
        self.ring.set(Some(ring));
        let seconds = ticks.span_seconds(filled);
        if seconds <= 0.0 {
            return 0;
        }
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
        let window = RateWindow::default();
        let start = crate::runtime::now();
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
        let start = crate::runtime::now();
        for second in 0..20u64 {
            ticks.tick(start + Duration::from_secs(second));
        }
        // Created with 1,000 already counted (a recovered topic): that is not a rate.
        let window = RateWindow::default();
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
        let window = RateWindow::default();
        let start = crate::runtime::now();
        ticks.tick(start);
        window.sample(0);
        ticks.tick(start + Duration::from_millis(2000));
        window.sample(1000);
        assert_eq!(window.per_second(&ticks), 500);
    }

    #[test]
    fn a_still_counter_keeps_no_ring_and_a_moving_one_averages_over_the_whole_window() {
        let mut ticks = RateTicks::default();
        let window = RateWindow::default();
        let start = crate::runtime::now();
        for second in 0..30u64 {
            ticks.tick(start + Duration::from_secs(second));
            window.sample(700);
        }
        assert!(!window.holds_ring(), "a counter that never moved allocates nothing");
        assert_eq!(window.per_second(&ticks), 0);
        // It moves once: the average is over the whole window, the quiet seconds included.
        ticks.tick(start + Duration::from_secs(30));
        window.sample(700 + 1000);
        assert_eq!(window.per_second(&ticks), 100);
        // Then stays still for a whole window: the ring goes again.
        for second in 31..31 + RATE_WINDOW_SECONDS as u64 {
            ticks.tick(start + Duration::from_secs(second));
            window.sample(1700);
        }
        assert!(!window.holds_ring());
        assert_eq!(window.per_second(&ticks), 0);
        assert!(std::mem::size_of::<RateWindow>() <= 16);
    }

    #[test]
    fn a_counter_past_its_bits_stays_there_and_the_samples_are_kept_apart() {
        let mut ticks = RateTicks::default();
        let window = RateWindow::default();
        let start = crate::runtime::now();
        for (second, total) in [(0, TOTAL_MAX - 30), (1, TOTAL_MAX - 10), (2, u64::MAX)].into_iter() {
            ticks.tick(start + Duration::from_secs(second));
            window.sample(total);
        }
        assert_eq!(window.last_and_samples(), (TOTAL_MAX, 3), "the count and the samples each in their bits");
        assert_eq!(window.per_second(&ticks), 15, "20 and then the 10 left below the top, over 2 s");
    }

    proptest::proptest! {
        /// The same rates as a plain window that keeps every delta.
        #[test]
        fn matches_a_window_that_keeps_everything(steps in proptest::collection::vec(0u64..3, 1..60)) {
            let mut ticks = RateTicks::default();
            let window = RateWindow::default();
            let mut deltas: Vec<u64> = Vec::new();
            let start = crate::runtime::now();
            let mut total = 0;
            for (second, step) in steps.iter().enumerate() {
                ticks.tick(start + Duration::from_secs(second as u64));
                if second > 0 {
                    total += step * 100;
                    deltas.push(step * 100);
                }
                window.sample(total);
                let last: Vec<u64> = deltas.iter().rev().take(RATE_WINDOW_SECONDS).copied().collect();
                let expected =
                    if last.is_empty() { 0 } else { (last.iter().sum::<u64>() as f64 / last.len() as f64).round() as u64 };
                proptest::prop_assert_eq!(window.per_second(&ticks), expected);
            }
        }
    }
}
