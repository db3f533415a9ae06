//! The clock seam. Deadlines use the monotonic clock so a wall-clock jump never causes mass
//! redelivery; publish times use the wall clock.
//!
//! [`SystemClock`] is the runtime's clock (`crate::runtime::{now, wall_ms}`): the system's in
//! the daemon, the virtual clock of a simulation under `runtime::sim`, which moves as its timers
//! fire. [`ManualClock`] is for unit tests that move time by hand, without an executor, and
//! wall jumps that a simulation's clock does not make; it starts at the simulation's epoch.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub trait Clock {
    /// Monotonic time, for deadlines.
    fn now(&self) -> Instant;
    /// Milliseconds since the Unix epoch, for publish times.
    fn wall_ms(&self) -> u64;
}

/// The runtime's clock: the system's, or a simulation's virtual one.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        crate::runtime::now()
    }
    fn wall_ms(&self) -> u64 {
        crate::runtime::wall_ms()
    }
}

/// A clock that moves only when told to, for tests.
#[derive(Clone)]
pub struct ManualClock {
    start: Instant,
    elapsed: Rc<Cell<Duration>>,
    wall_offset_ms: Rc<Cell<i64>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock { start: Instant::now(), elapsed: Rc::default(), wall_offset_ms: Rc::default() }
    }
}

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        self.elapsed.set(self.elapsed.get() + by);
    }
    /// Moves only the wall clock, as an NTP step would.
    pub fn jump_wall_ms(&self, by: i64) {
        self.wall_offset_ms.set(self.wall_offset_ms.get() + by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + self.elapsed.get()
    }
    fn wall_ms(&self) -> u64 {
        (crate::runtime::sim::EPOCH_MS as i64
            + self.elapsed.get().as_millis() as i64
            + self.wall_offset_ms.get()) as u64
    }
}
