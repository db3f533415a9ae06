//! A seeded deterministic executor for simulation tests: one thread, a virtual clock, and a
//! run queue from which a seeded generator picks the next task, so that each seed gives one
//! interleaving and replays it exactly. When no task is ready the clock jumps to the earliest
//! timer; when there is no timer either while the simulated future still waits, nothing can
//! ever wake it, and the run panics with its seed.
//!
//! While [`run`] runs, `crate::runtime::{spawn, sleep, now, wall_ms}` on this thread go to the
//! simulation instead of glommio (see `super::current`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// The wall clock's reading when a simulation starts (14 November 2023), in milliseconds since
/// the Unix epoch: fixed, so that publish times replay with the seed.
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// Polls one run may make before it is taken for a livelock (tasks waking each other forever
/// without the simulated future finishing).
pub const POLLS_MAX: u64 = 5_000_000;

/// Virtual time one run may take by default before it is taken for a livelock (periodic timers
/// firing forever while the simulated future waits on something that never comes).
pub const VIRTUAL_TIME_MAX: Duration = Duration::from_secs(24 * 3600);

/// The id of the simulated future itself, which is polled in place rather than spawned.
const MAIN: u64 = 0;

/// Mixed into the simulation's seed for the stream of `Executor::next_seed` (any constant
/// keeps it apart from the task order's stream).
const SEEDS_STREAM: u64 = 0x6f70_656e_7261_6674;

/// SplitMix64 (Steele, Lea and Flood): a small generator whose every seed, 0 included, gives a
/// full-period, well-mixed stream. Simulations need reproducibility, not cryptography.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0). The modulo bias is below 2^-40 for the bounds a
    /// simulation uses, which is no concern for picking tasks and faults.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range");
        self.next_u64() % bound
    }

    /// A number in `range` (not empty).
    pub fn between(&mut self, range: std::ops::Range<u64>) -> u64 {
        range.start + self.below(range.end - range.start)
    }

    /// True with probability `parts_per_million` / 1,000,000.
    pub fn chance(&mut self, parts_per_million: u32) -> bool {
        self.below(1_000_000) < u64::from(parts_per_million)
    }

    /// A generator for another purpose (the disk's faults, the workload), drawn from this one so
    /// that all of them follow from one seed yet do not disturb each other's streams.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// The ready queue, shared with wakers. Wakers must be `Send + Sync`, so this one is behind a
/// mutex even though a simulation never leaves its thread; no lock is ever contended.
#[derive(Default)]
struct ReadyQueue {
    /// In the order of their ids, not of their wakes, so that the pick depends only on which
    /// tasks are ready: tokio's watch (openraft's metrics) wakes its waiters in an order drawn
    /// from a generator of its own, seeded anew in each process, which made a cluster's
    /// simulation take another course at each run of one seed.
    ids: Vec<u64>,
    queued: HashSet<u64>,
}

struct TaskWaker {
    id: u64,
    queue: Arc<Mutex<ReadyQueue>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let mut queue = self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if queue.queued.insert(self.id) {
            let at = queue.ids.partition_point(|id| *id < self.id);
            queue.ids.insert(at, self.id);
        }
    }
}

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

struct Entry {
    /// None while the task is being polled.
    future: Option<LocalFuture>,
    waker: Waker,
    /// Its handle was dropped while it was being polled: drop it once the poll returns.
    cancelled: bool,
    /// The simulated process it belongs to (`spawn_in_group`; 0 for the simulated future's),
    /// which every task it spawns inherits, so that one node of a simulated cluster dies alone
    /// (`kill_group`) and reads its own wall clock (`set_wall_offset_ms`).
    group: u64,
}

pub(crate) struct Executor {
    seed: u64,
    rng: RefCell<Rng>,
    /// Seeds for the generators the code under test asks for (openraft's election timeouts):
    /// drawn from the simulation's seed, so that two runs of one seed on one thread draw the
    /// same ones, and apart from `rng`, so that drawing them does not change the task order.
    seeds: RefCell<Rng>,
    start: Instant,
    elapsed: Cell<Duration>,
    time_max: Duration,
    tasks: RefCell<BTreeMap<u64, Entry>>,
    next_id: Cell<u64>,
    queue: Arc<Mutex<ReadyQueue>>,
    /// Sleeping tasks by (deadline, timer number): the number keeps equal deadlines apart and
    /// in the order they were set.
    timers: RefCell<BTreeMap<(Duration, u64), Waker>>,
    next_timer: Cell<u64>,
    polls: Cell<u64>,
    /// The group of the task being polled (0 for the simulated future).
    current_group: Cell<u64>,
    /// Each group's wall clock, ahead of (or behind) the simulation's by milliseconds.
    wall_offsets_ms: RefCell<BTreeMap<u64, i64>>,
}

impl Executor {
    fn new(seed: u64, time_max: Duration) -> Executor {
        Executor {
            seed,
            rng: RefCell::new(Rng::new(seed)),
            seeds: RefCell::new(Rng::new(seed ^ SEEDS_STREAM)),
            start: Instant::now(),
            elapsed: Cell::new(Duration::ZERO),
            time_max,
            tasks: RefCell::default(),
            next_id: Cell::new(MAIN + 1),
            queue: Arc::default(),
            timers: RefCell::default(),
            next_timer: Cell::new(0),
            polls: Cell::new(0),
            current_group: Cell::new(0),
            wall_offsets_ms: RefCell::default(),
        }
    }

    pub(crate) fn now(&self) -> Instant {
        self.start + self.elapsed.get()
    }

    pub(crate) fn next_seed(&self) -> u64 {
        self.seeds.borrow_mut().next_u64()
    }

    pub(crate) fn wall_ms(&self) -> u64 {
        let offset = self.wall_offsets_ms.borrow().get(&self.current_group.get()).copied().unwrap_or(0);
        (EPOCH_MS + self.elapsed.get().as_millis() as u64).saturating_add_signed(offset)
    }

    fn waker(&self, id: u64) -> Waker {
        Waker::from(Arc::new(TaskWaker { id, queue: self.queue.clone() }))
    }

    fn schedule(&self, id: u64) {
        self.waker(id).wake();
    }

    /// Takes a ready task, chosen by the seeded generator.
    fn next_ready(&self) -> Option<u64> {
        let mut queue = self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if queue.ids.is_empty() {
            return None;
        }
        let index = self.rng.borrow_mut().below(queue.ids.len() as u64) as usize;
        let id = queue.ids.remove(index);
        queue.queued.remove(&id);
        Some(id)
    }

    fn poll_task(&self, id: u64) {
        let taken = {
            let mut tasks = self.tasks.borrow_mut();
            tasks.get_mut(&id).and_then(|entry| {
                entry.future.take().map(|future| (future, entry.waker.clone(), entry.group))
            })
        };
        // A task woken after it finished or was cancelled has nothing left to poll.
        let Some((mut future, waker, group)) = taken else { return };
        self.current_group.set(group);
        let done = future.as_mut().poll(&mut Context::from_waker(&waker)).is_ready();
        self.current_group.set(0);
        let finished = {
            let mut tasks = self.tasks.borrow_mut();
            let cancelled = tasks.get(&id).is_none_or(|entry| entry.cancelled);
            if done || cancelled {
                tasks.remove(&id);
                Some(future)
            } else {
                tasks.get_mut(&id).expect("checked above").future = Some(future);
                None
            }
        };
        // Dropped with no borrow held: its destructors may spawn, cancel or set timers.
        drop(finished);
    }

    /// Moves the clock to the earliest timer and wakes every timer due by then; false if
    /// there is none.
    fn advance_clock(&self) -> bool {
        let mut timers = self.timers.borrow_mut();
        let Some((&(deadline, _), _)) = timers.first_key_value() else { return false };
        self.elapsed.set(self.elapsed.get().max(deadline));
        while let Some(entry) = timers.first_entry() {
            if entry.key().0 > self.elapsed.get() {
                break;
            }
            entry.remove().wake();
        }
        true
    }

    fn spawn_local(&self, future: LocalFuture, group: u64) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let waker = self.waker(id);
        self.tasks.borrow_mut().insert(id, Entry { future: Some(future), waker, cancelled: false, group });
        // glommio polls a task it spawns at once, inside the call that spawns it
        // (`spawn_and_run`), before the caller goes on; the simulation does the same, so that a
        // borrow the caller holds across a spawn fails here as it fails in the daemon. A task
        // that is not done registered its waker in that poll and runs again when woken.
        let caller_group = self.current_group.get();
        self.poll_task(id);
        self.current_group.set(caller_group);
        id
    }

    /// Drops every task of `group`, each with no borrow held.
    fn kill_group(&self, group: u64) {
        let ids: Vec<u64> =
            self.tasks.borrow().iter().filter(|(_, entry)| entry.group == group).map(|(id, _)| *id).collect();
        for id in ids {
            let entry = self.tasks.borrow_mut().remove(&id);
            drop(entry);
        }
    }

    fn cancel(&self, id: u64) {
        let future = {
            let mut tasks = self.tasks.borrow_mut();
            match tasks.get_mut(&id) {
                Some(entry) if entry.future.is_none() => {
                    entry.cancelled = true;
                    None
                }
                Some(_) => tasks.remove(&id).and_then(|entry| entry.future),
                None => None,
            }
        };
        drop(future);
    }

    /// Drops every task left (detached loops, mostly), one at a time with no borrow held, while
    /// the simulation is still current: their destructors may call the runtime.
    fn drop_tasks(&self) {
        self.kill_tasks();
        self.timers.borrow_mut().clear();
    }

    /// Drops every spawned task, each with no borrow held (a `while let` would hold the borrow
    /// through its body).
    fn kill_tasks(&self) {
        loop {
            let entry = self.tasks.borrow_mut().pop_first();
            match entry {
                Some((_, entry)) => drop(entry),
                None => break,
            }
        }
    }

    fn check_limits(&self) {
        let polls = self.polls.get() + 1;
        self.polls.set(polls);
        if polls > POLLS_MAX {
            panic!("simulation seed {}: {POLLS_MAX} polls without finishing: a livelock?", self.seed);
        }
        if self.elapsed.get() > self.time_max {
            panic!(
                "simulation seed {}: {:?} of virtual time without finishing: a livelock, or a wait that \
                 only periodic timers keep alive?",
                self.seed, self.time_max
            );
        }
    }
}

/// A task of the simulation. Dropping it cancels the task, as glommio's does.
pub(crate) struct SimTask<T> {
    id: u64,
    executor: Weak<Executor>,
    join: Rc<RefCell<Join<T>>>,
    detached: bool,
}

struct Join<T> {
    output: Option<T>,
    waker: Option<Waker>,
    finished: bool,
}

impl<T> SimTask<T> {
    pub(crate) fn detach(mut self) {
        self.detached = true;
    }
}

impl<T> Drop for SimTask<T> {
    fn drop(&mut self) {
        if self.detached || self.join.borrow().finished {
            return;
        }
        if let Some(executor) = self.executor.upgrade() {
            executor.cancel(self.id);
        }
    }
}

impl<T> Future for SimTask<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        let mut join = self.join.borrow_mut();
        if let Some(output) = join.output.take() {
            return Poll::Ready(output);
        }
        assert!(!join.finished, "a simulated task polled after it returned its output");
        join.waker = Some(context.waker().clone());
        Poll::Pending
    }
}

pub(crate) fn spawn<T: 'static>(
    executor: &Rc<Executor>,
    future: impl Future<Output = T> + 'static,
) -> SimTask<T> {
    let group = executor.current_group.get();
    spawn_grouped(executor, future, group)
}

fn spawn_grouped<T: 'static>(
    executor: &Rc<Executor>,
    future: impl Future<Output = T> + 'static,
    group: u64,
) -> SimTask<T> {
    let join = Rc::new(RefCell::new(Join { output: None, waker: None, finished: false }));
    let result = join.clone();
    let id = executor.spawn_local(
        Box::pin(async move {
            let output = future.await;
            let waker = {
                let mut join = result.borrow_mut();
                join.output = Some(output);
                join.finished = true;
                join.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }),
        group,
    );
    SimTask { id, executor: Rc::downgrade(executor), join, detached: false }
}

/// A timer of the simulation: ready once the virtual clock reaches its deadline.
pub(crate) struct Sleep {
    executor: Weak<Executor>,
    deadline: Duration,
    key: Option<(Duration, u64)>,
}

impl Sleep {
    pub(crate) fn new(executor: &Rc<Executor>, duration: Duration) -> Sleep {
        Sleep { executor: Rc::downgrade(executor), deadline: executor.elapsed.get() + duration, key: None }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let Some(executor) = self.executor.upgrade() else { return Poll::Pending };
        if executor.elapsed.get() >= self.deadline {
            if let Some(key) = self.key.take() {
                executor.timers.borrow_mut().remove(&key);
            }
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                let number = executor.next_timer.get();
                executor.next_timer.set(number + 1);
                (self.deadline, number)
            }
        };
        self.key = Some(key);
        executor.timers.borrow_mut().insert(key, context.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let (Some(key), Some(executor)) = (self.key, self.executor.upgrade()) {
            executor.timers.borrow_mut().remove(&key);
        }
    }
}

/// Makes the simulation current on this thread for as long as it lives.
struct Entered(Rc<Executor>);

impl Drop for Entered {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Tasks dropped now could panic again and abort the test binary; leak them, and
            // the executor they keep alive.
            std::mem::forget(std::mem::take(&mut *self.0.tasks.borrow_mut()));
        } else {
            self.0.drop_tasks();
        }
        super::leave_simulation();
    }
}

/// How a simulation is run: its seed, and how much virtual time it may take.
pub struct Simulation {
    seed: u64,
    time_max: Duration,
}

impl Simulation {
    pub fn new(seed: u64) -> Simulation {
        Simulation { seed, time_max: VIRTUAL_TIME_MAX }
    }

    /// Virtual time after which the run is taken for a livelock.
    pub fn time_max(mut self, time_max: Duration) -> Simulation {
        self.time_max = time_max;
        self
    }

    /// Runs `future` to its end on this thread, under a fresh virtual clock, and returns its
    /// output. Tasks it leaves behind are dropped before this returns. Panics (naming the seed)
    /// if it can never finish.
    pub fn run<T>(self, future: impl Future<Output = T>) -> T {
        let executor = Rc::new(Executor::new(self.seed, self.time_max));
        super::enter_simulation(executor.clone());
        let entered = Entered(executor.clone());
        let mut future = pin!(future);
        let waker = executor.waker(MAIN);
        executor.schedule(MAIN);
        let output = loop {
            executor.check_limits();
            match executor.next_ready() {
                Some(MAIN) => {
                    if let Poll::Ready(output) = future.as_mut().poll(&mut Context::from_waker(&waker)) {
                        break output;
                    }
                }
                Some(id) => executor.poll_task(id),
                None => {
                    if !executor.advance_clock() {
                        panic!(
                            "simulation seed {} deadlocked at {:?} of virtual time: no task is ready and no \
                             timer is set while the simulated future waits",
                            self.seed,
                            executor.elapsed.get()
                        );
                    }
                }
            }
        };
        drop(entered);
        output
    }
}

/// Drops every spawned task of the running simulation (not the simulated future itself), as
/// the death of the process would end them: a crash in a simulation is this, then
/// `SimDisk::crash`. What the simulated future holds (handles of the dead node) it drops itself.
pub fn kill_spawned_tasks() {
    super::simulation().expect("kill_spawned_tasks outside a simulation").kill_tasks();
}

/// Spawns `future` as a task of `group` (a simulated process: every task it spawns belongs to
/// it too), in the running simulation.
#[cfg(test)]
pub(crate) fn spawn_in_group<T: 'static>(
    group: u64,
    future: impl Future<Output = T> + 'static,
) -> SimTask<T> {
    let executor = super::simulation().expect("spawn_in_group outside a simulation");
    spawn_grouped(&executor, future, group)
}

/// Drops every task of `group`, as the death of that simulated process would end them.
pub fn kill_group(group: u64) {
    super::simulation().expect("kill_group outside a simulation").kill_group(group);
}

/// Sets `group`'s wall clock `offset_ms` from the simulation's (a node whose clock is off, or
/// that was stepped).
pub fn set_wall_offset_ms(group: u64, offset_ms: i64) {
    let executor = super::simulation().expect("set_wall_offset_ms outside a simulation");
    executor.wall_offsets_ms.borrow_mut().insert(group, offset_ms);
}

/// Runs `future` under the simulation with `seed` (see [`Simulation::run`]).
pub fn run<T>(seed: u64, future: impl Future<Output = T>) -> T {
    Simulation::new(seed).run(future)
}

/// Seeds to run: `RINGPOST_SIM_SEED=S` replays seed S alone; otherwise `RINGPOST_SIM_SEEDS=N`
/// seeds (default `default_count`) from 0.
pub fn seeds(default_count: u64) -> Vec<u64> {
    let number = |name: &str| {
        let value = std::env::var(name).ok()?;
        Some(value.parse::<u64>().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
    };
    if let Some(seed) = number("RINGPOST_SIM_SEED") {
        return vec![seed];
    }
    (0..number("RINGPOST_SIM_SEEDS").unwrap_or(default_count)).collect()
}

/// Runs `simulation` once per seed of [`seeds`]; a failing seed is printed with the command
/// that replays it (`test` names the test), and the failure is passed on.
pub fn for_each_seed(test: &str, default_count: u64, simulation: impl Fn(u64)) {
    for seed in seeds(default_count) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| simulation(seed)));
        if let Err(panic) = outcome {
            eprintln!(
                "simulation {test} failed with seed {seed}; replay it with:\n    RINGPOST_SIM_SEED={seed} cargo test \
                 -p ringpost-daemon {test} -- --nocapture"
            );
            std::panic::resume_unwind(panic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime;

    #[test]
    fn the_clock_jumps_to_the_next_timer() {
        let (elapsed, wall) = run(1, async {
            let start = runtime::now();
            let wall = runtime::wall_ms();
            runtime::sleep(Duration::from_secs(3600)).await;
            (runtime::now() - start, runtime::wall_ms() - wall)
        });
        assert_eq!(elapsed, Duration::from_secs(3600));
        assert_eq!(wall, 3_600_000);
    }

    /// The order tasks run in follows from the seed: the same seed gives the same order,
    /// and some other seed a different one.
    fn order(seed: u64) -> Vec<u32> {
        run(seed, async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let order = order.clone();
                    runtime::spawn(async move {
                        runtime::yield_now().await;
                        order.borrow_mut().push(i);
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
            order.take()
        })
    }

    #[test]
    fn a_seed_replays_its_interleaving() {
        assert_eq!(order(7), order(7));
        assert!((0..20).any(|seed| order(seed) != order(7)), "interleavings do not depend on the seed");
    }

    #[test]
    fn dropping_a_task_cancels_it_and_detaching_lets_it_run() {
        run(3, async {
            let ran = Rc::new(Cell::new(0));
            let cancelled = {
                let ran = ran.clone();
                runtime::spawn(async move {
                    runtime::sleep(Duration::from_millis(10)).await;
                    ran.set(ran.get() + 1);
                })
            };
            drop(cancelled);
            let detached = ran.clone();
            runtime::spawn(async move {
                runtime::sleep(Duration::from_millis(10)).await;
                detached.set(detached.get() + 10);
            })
            .detach();
            runtime::sleep(Duration::from_millis(20)).await;
            assert_eq!(ran.get(), 10);
        });
    }

    #[test]
    fn a_deadlock_names_its_seed() {
        let panic = std::panic::catch_unwind(|| {
            run(42, async {
                let (_sender, receiver) = crate::sync::oneshot::<()>();
                let _never = std::mem::ManuallyDrop::new(_sender);
                receiver.await;
            })
        })
        .unwrap_err();
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("seed 42") && message.contains("deadlocked"), "{message}");
    }

    /// The router and the connections gate work with glommio's semaphore, which needs no
    /// glommio executor: it works under the simulation as it is.
    #[test]
    fn glommio_semaphores_work_under_the_simulation() {
        run(9, async {
            let semaphore = Rc::new(glommio::sync::Semaphore::new(1));
            let permit = semaphore.acquire_permit(1).await.unwrap();
            let waiter = {
                let semaphore = semaphore.clone();
                runtime::spawn(async move {
                    let _permit = semaphore.acquire_permit(1).await.unwrap();
                    runtime::now()
                })
            };
            runtime::sleep(Duration::from_millis(3)).await;
            let released = runtime::now();
            drop(permit);
            assert!(waiter.await >= released, "the waiter got the permit before it was released");
        });
    }

    /// How far a task runs inside the call that spawns it: to its first wait, under both.
    async fn spawned_runs_at_once() -> (u32, u32) {
        let steps = Rc::new(Cell::new(0));
        let task = {
            let steps = steps.clone();
            runtime::spawn(async move {
                steps.set(1);
                runtime::yield_now().await;
                steps.set(2);
            })
        };
        let at_spawn = steps.get();
        task.await;
        (at_spawn, steps.get())
    }

    /// glommio polls a task it spawns before `spawn` returns, so a borrow held across a spawn
    /// meets the task's own borrows; the simulation must do the same or it hides that fault
    /// (a router's cluster watch panicked so in a three-node run, never in the simulation).
    #[test]
    fn a_spawned_task_runs_to_its_first_wait_at_once_under_glommio_and_the_simulation() {
        assert_eq!(run(5, spawned_runs_at_once()), (1, 2));
        let under_glommio = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .unwrap()
            .run(spawned_runs_at_once());
        assert_eq!(under_glommio, (1, 2));
    }

    #[test]
    fn outside_a_simulation_the_runtime_is_glommio() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async {
            let start = std::time::Instant::now();
            runtime::sleep(Duration::from_millis(5)).await;
            assert!(start.elapsed() >= Duration::from_millis(5));
            assert!(runtime::spawn(async { 5 }).await == 5);
        });
    }
}
