//! A push subscription's flow control, without I/O: how many pushes may be outstanding at
//! once. Pub/Sub's push flow control is slow start: the window starts small, grows while the
//! endpoint answers with success, and shrinks when it fails or answers slowly, so that a
//! receiver that cannot keep up is not buried in requests, and one that can is not held back.
//!
//! Here, as TCP's congestion window: each success adds one to the window while it is below its
//! threshold (doubling it per window's worth of successes), and one per window's worth above
//! it; a failure or a slow answer halves it (and sets the threshold there), never below
//! `PUSH_WINDOW_MIN`, never above `PUSH_OUTSTANDING_MAX`. A failure halves it at most once per
//! window's worth of answers: the pushes that were already outstanding when it halved fail
//! together when an endpoint goes down, and should count as one signal, not collapse the window
//! to its floor by themselves. Failures in a row at the floor pause the pushing, from
//! `PUSH_PAUSE_MIN` doubling to `PUSH_PAUSE_MAX`, until a push succeeds.

use std::time::Duration;

/// Pushes outstanding per subscription at most: beyond this a receiver gains nothing from
/// more concurrency that connection reuse does not give it, and each outstanding push holds a
/// lease, a body and a request slot.
pub const PUSH_OUTSTANDING_MAX: u32 = 1_000;
/// The window's floor: one push at a time still delivers to a struggling endpoint, so it is
/// seen to recover.
pub const PUSH_WINDOW_MIN: u32 = 1;
/// The window a subscription starts with (and whose growth doubles up to the threshold).
pub const PUSH_WINDOW_INITIAL: u32 = 4;

/// The pause before the next push after a failure at the window's floor, doubled by each
/// failure in a row up to `PUSH_PAUSE_MAX`: an endpoint that is down is not hammered with
/// retries, whatever the subscription's retry policy (which without backoff redelivers at once).
pub const PUSH_PAUSE_MIN: Duration = Duration::from_millis(100);
/// The longest pause: an endpoint that comes back is pushed to again within it.
pub const PUSH_PAUSE_MAX: Duration = Duration::from_secs(10);

/// How a push ended, as the window counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A success status, quickly enough.
    Success,
    /// A success status, but slower than the half of the ack deadline that counts as slow.
    Slow,
    /// Any other status, a connection error or no answer within the deadline.
    Failure,
}

/// The window of one push subscription.
#[derive(Debug, Clone)]
pub struct Window {
    size: u32,
    /// Above it, growth is linear.
    threshold: u32,
    /// Successes since the window last grew by one in its linear phase.
    successes: u32,
    /// Answers still to come before another failure may halve the window again.
    answers_before_halving: u32,
    /// Failures since the last success.
    failures_in_a_row: u32,
}

impl Default for Window {
    fn default() -> Self {
        Window::new()
    }
}

impl Window {
    pub fn new() -> Window {
        Window {
            size: PUSH_WINDOW_INITIAL,
            threshold: PUSH_OUTSTANDING_MAX,
            successes: 0,
            answers_before_halving: 0,
            failures_in_a_row: 0,
        }
    }

    /// Pushes that may be outstanding now.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// How long to wait before the next push: zero unless failures in a row have brought the
    /// window to its floor.
    pub fn pause(&self) -> Duration {
        if self.failures_in_a_row == 0 || self.size > PUSH_WINDOW_MIN {
            return Duration::ZERO;
        }
        let doublings = (self.failures_in_a_row - 1).min(16);
        PUSH_PAUSE_MIN.saturating_mul(1 << doublings).min(PUSH_PAUSE_MAX)
    }

    /// Counts an answer; returns the window's new size.
    pub fn on_answer(&mut self, answer: Answer) -> u32 {
        self.answers_before_halving = self.answers_before_halving.saturating_sub(1);
        match answer {
            Answer::Success => {
                self.failures_in_a_row = 0;
                self.grow()
            }
            Answer::Slow => {
                self.failures_in_a_row = 0;
                self.halve()
            }
            Answer::Failure => {
                self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
                self.halve()
            }
        }
        debug_assert!((PUSH_WINDOW_MIN..=PUSH_OUTSTANDING_MAX).contains(&self.size), "{self:?}");
        self.size
    }

    fn grow(&mut self) {
        if self.size < self.threshold {
            self.size += 1;
        } else {
            self.successes += 1;
            if self.successes >= self.size {
                self.successes = 0;
                self.size += 1;
            }
        }
        self.size = self.size.min(PUSH_OUTSTANDING_MAX);
    }

    fn halve(&mut self) {
        if self.answers_before_halving > 0 {
            return;
        }
        self.size = (self.size / 2).max(PUSH_WINDOW_MIN);
        self.threshold = self.size;
        self.successes = 0;
        // The pushes outstanding now answer before the next halving counts.
        self.answers_before_halving = self.size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_grows_fast_from_its_start_then_slowly() {
        let mut window = Window::new();
        assert_eq!(window.size(), PUSH_WINDOW_INITIAL);
        for _ in 0..10 {
            window.on_answer(Answer::Success);
        }
        assert_eq!(window.size(), PUSH_WINDOW_INITIAL + 10);
        // One failure halves it; from there growth is one per window's worth of successes.
        assert_eq!(window.on_answer(Answer::Failure), 7);
        for _ in 0..7 {
            window.on_answer(Answer::Success);
        }
        assert_eq!(window.size(), 8);
        for _ in 0..7 {
            window.on_answer(Answer::Success);
        }
        assert_eq!(window.size(), 8, "8 successes are needed at 8");
        assert_eq!(window.on_answer(Answer::Success), 9);
    }

    #[test]
    fn failures_together_halve_the_window_once_and_it_never_leaves_its_bounds() {
        let mut window = Window::new();
        for _ in 0..100 {
            window.on_answer(Answer::Success);
        }
        assert_eq!(window.size(), 104);
        // The 104 pushes outstanding fail together: one halving for them...
        assert_eq!(window.on_answer(Answer::Failure), 52);
        for _ in 0..51 {
            assert_eq!(window.on_answer(Answer::Failure), 52);
        }
        // ...and the failures after them halve it again, down to the floor.
        assert_eq!(window.on_answer(Answer::Failure), 26);
        for _ in 0..1_000 {
            window.on_answer(Answer::Failure);
        }
        assert_eq!(window.size(), PUSH_WINDOW_MIN);
        for _ in 0..1_000_000 {
            window.on_answer(Answer::Success);
        }
        assert_eq!(window.size(), PUSH_OUTSTANDING_MAX);
    }

    #[test]
    fn failures_in_a_row_at_the_floor_pause_the_pushing_until_a_success() {
        let mut window = Window::new();
        window.on_answer(Answer::Failure);
        assert_eq!(window.pause(), Duration::ZERO, "above the floor, no pause");
        for _ in 0..3 {
            window.on_answer(Answer::Failure);
        }
        assert_eq!(window.size(), PUSH_WINDOW_MIN);
        assert_eq!(window.pause(), Duration::from_millis(800), "four failures in a row");
        for _ in 0..100 {
            window.on_answer(Answer::Failure);
        }
        assert_eq!(window.pause(), PUSH_PAUSE_MAX);
        window.on_answer(Answer::Success);
        assert_eq!(window.pause(), Duration::ZERO);
    }

    #[test]
    fn slow_answers_shrink_the_window_as_failures_do() {
        let mut window = Window::new();
        for _ in 0..12 {
            window.on_answer(Answer::Success);
        }
        assert_eq!(window.on_answer(Answer::Slow), 8);
        for _ in 0..7 {
            window.on_answer(Answer::Slow);
        }
        assert_eq!(window.on_answer(Answer::Slow), 4);
    }
}
