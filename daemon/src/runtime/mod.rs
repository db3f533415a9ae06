//! The runtime seam: spawning, sleeping and the clock, behind one module, so that the router,
//! the forwarders and the log can run on glommio in the daemon and on a seeded deterministic
//! executor in the simulation tests. Nothing in the daemon outside `node` and this module calls
//! glommio's executor, timers or the system clock directly.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A spawned task. Dropping it cancels the task; `detach` lets it run to its end.
#[must_use = "a task is cancelled when dropped; detach it to let it run"]
pub struct Task<T>(glommio::Task<T>);

impl<T> Task<T> {
    pub fn detach(self) {
        self.0.detach();
    }
}

impl<T> Future for Task<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        Pin::new(&mut self.0).poll(context)
    }
}

/// Runs `future` on this shard's executor, beside the task that calls it.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    Task(glommio::spawn_local(future))
}

/// Waits `duration` on this shard's timers.
pub async fn sleep(duration: Duration) {
    glommio::timer::sleep(duration).await;
}

/// Monotonic time, for deadlines and durations.
pub fn now() -> Instant {
    Instant::now()
}

/// Milliseconds since the Unix epoch, for publish times and expirations.
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
}
