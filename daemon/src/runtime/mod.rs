//! The runtime seam: spawning, sleeping and the clock, behind one module, so that the router,
//! the forwarders and the log can run on glommio in the daemon and on a seeded deterministic
//! executor in the simulation tests ([`sim`]). Nothing in the daemon outside `node` and this
//! module calls glommio's executor, timers or the system clock directly.
//!
//! Each call checks a thread-local for a running simulation first: a borrow of a `RefCell`
//! holding `None` in the daemon, against the microseconds of a spawn or a timer; `now`, the
//! only call made per request (latency windows) or per commit (the log's write timing), pays a
//! few nanoseconds for it.

pub mod sim;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

thread_local! {
    /// The simulation running on this thread, if any (see `sim::Simulation::run`).
    static SIMULATION: RefCell<Option<Rc<sim::Executor>>> = const { RefCell::new(None) };
}

fn simulation() -> Option<Rc<sim::Executor>> {
    SIMULATION.with(|current| current.borrow().clone())
}

fn enter_simulation(executor: Rc<sim::Executor>) {
    SIMULATION.with(|current| {
        let mut current = current.borrow_mut();
        assert!(current.is_none(), "a simulation is already running on this thread");
        *current = Some(executor);
    });
}

fn leave_simulation() {
    SIMULATION.with(|current| current.borrow_mut().take());
}

/// A hasher with the same keys in every process, for unit tests: a simulation's seed must
/// replay in another process (`RINGPOST_SIM_SEED`), and maps the node walks and acts on in
/// their order must walk the same way there. (ahash's "fixed" keys are drawn once per
/// process, std's random ones once per map.)
pub type FixedHasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// The hasher of maps keyed by client text that the node walks in their order (a shard's
/// subscriptions, swept for expired leases): std's random keys in the daemon, against
/// flooding; `FixedHasher` in unit tests. The daemon's type is std's own, so it costs nothing
/// there.
#[cfg(not(test))]
pub type NameHasher = std::collections::hash_map::RandomState;
#[cfg(test)]
pub type NameHasher = FixedHasher;

/// A spawned task. Dropping it cancels the task; `detach` lets it run to its end.
#[must_use = "a task is cancelled when dropped; detach it to let it run"]
pub struct Task<T>(Spawned<T>);

enum Spawned<T> {
    Glommio(glommio::Task<T>),
    Simulated(sim::SimTask<T>),
}

impl<T> Task<T> {
    pub fn detach(self) {
        match self.0 {
            Spawned::Glommio(task) => {
                task.detach();
            }
            Spawned::Simulated(task) => task.detach(),
        }
    }
}

impl<T> Future for Task<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        match &mut self.0 {
            Spawned::Glommio(task) => Pin::new(task).poll(context),
            Spawned::Simulated(task) => Pin::new(task).poll(context),
        }
    }
}

/// Runs `future` on this shard's executor, beside the task that calls it.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    match simulation() {
        Some(executor) => Task(Spawned::Simulated(sim::spawn(&executor, future))),
        None => Task(Spawned::Glommio(glommio::spawn_local(future))),
    }
}

/// Waits `duration` on this shard's timers.
pub async fn sleep(duration: Duration) {
    match simulation() {
        Some(executor) => sim::Sleep::new(&executor, duration).await,
        None => {
            glommio::timer::sleep(duration).await;
        }
    }
}

/// Lets every other ready task run before this one goes on.
pub async fn yield_now() {
    futures_lite::future::yield_now().await;
}

/// Monotonic time, for deadlines and durations.
pub fn now() -> Instant {
    SIMULATION
        .with(|current| current.borrow().as_ref().map(|executor| executor.now()))
        .unwrap_or_else(Instant::now)
}

/// A seed for a generator, drawn from the running simulation's seed; None outside a simulation.
pub fn simulated_seed() -> Option<u64> {
    SIMULATION.with(|current| current.borrow().as_ref().map(|executor| executor.next_seed()))
}

/// Milliseconds since the Unix epoch, for publish times and expirations.
pub fn wall_ms() -> u64 {
    if let Some(wall_ms) =
        SIMULATION.with(|current| current.borrow().as_ref().map(|executor| executor.wall_ms()))
    {
        return wall_ms;
    }
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as u64).unwrap_or(0)
}
