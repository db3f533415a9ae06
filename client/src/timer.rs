//! A tiny timer for executor-agnostic futures: [`sleep`] registers its deadline and waker with
//! one timer thread per process, which wakes each sleeper when its deadline passes.
//!
//! The thread is started on the first `sleep` (a lazy static through `OnceLock`) and keeps the
//! deadlines in order, so it wakes exactly when the next one is due and never polls. A sleep
//! that is dropped early takes its entry out: every request carries a deadline (see
//! `Client::with_request_timeout`) that almost never fires, and entries left until a 60 s
//! deadline would pile up by the million at a high request rate. So the timer holds exactly the
//! sleeps that are live.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Sleeps for `duration` without blocking the thread that polls it.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(Instant::now() + duration)
}

/// Sleeps until `deadline` without blocking the thread that polls it.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep { deadline, shared: None }
}

/// Runs `future` until `deadline`: its output, or `None` once the deadline passed first (the
/// future is then dropped, which is how a request is forgotten).
pub async fn run_until<F: Future>(deadline: Instant, future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut expiry = std::pin::pin!(sleep_until(deadline));
    std::future::poll_fn(|context| {
        // The work first: a future that is ready at once never registers a sleep.
        if let Poll::Ready(output) = future.as_mut().poll(context) {
            return Poll::Ready(Some(output));
        }
        match expiry.as_mut().poll(context) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// The future of [`sleep`].
pub struct Sleep {
    deadline: Instant,
    /// Registered with the timer thread on the first poll that finds the deadline ahead: the
    /// entry's key and what it shares with the timer thread.
    shared: Option<(Key, Arc<Sleeper>)>,
}

/// An entry's place in the timer: its deadline, and a sequence number that keeps equal
/// deadlines apart.
type Key = (Instant, u64);

/// What a sleep shares with the timer thread.
struct Sleeper {
    /// `None` once the timer thread fired it.
    waker: Mutex<Option<Waker>>,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        match &self.shared {
            Some((_, shared)) => {
                let mut waker = shared.waker.lock().unwrap();
                match waker.as_mut() {
                    // Fired: the deadline passed between the check above and now.
                    None => return Poll::Ready(()),
                    Some(registered) => {
                        if !registered.will_wake(context.waker()) {
                            *registered = context.waker().clone();
                        }
                    }
                }
            }
            None => {
                let shared = Arc::new(Sleeper { waker: Mutex::new(Some(context.waker().clone())) });
                let key = timer().register(self.deadline, shared.clone());
                self.shared = Some((key, shared));
            }
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((key, shared)) = &self.shared {
            // Fired already (no waker left): the timer thread took the entry out itself.
            if shared.waker.lock().unwrap().is_some() {
                timer().cancel(key);
            }
        }
    }
}

#[derive(Default)]
struct Heap {
    entries: BTreeMap<Key, Arc<Sleeper>>,
    sequence: u64,
    /// What the timer thread is doing, so that a new sleep signals it only when it would
    /// otherwise wake too late.
    thread: ThreadState,
}

/// The timer thread's state, as of the last time it held the lock.
#[derive(Default, Clone, Copy)]
enum ThreadState {
    /// Firing sleeps: it looks at the entries again before it waits.
    #[default]
    Running,
    /// Waiting until this instant (the earliest deadline when it began to wait; that entry
    /// may have been taken out since, which costs one wake-up for nothing).
    WaitingUntil(Instant),
    /// Waiting with no entry at all.
    WaitingForever,
}

struct Timer {
    heap: Mutex<Heap>,
    /// Signalled when an entry becomes the earliest, so the thread shortens its wait.
    earlier: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer =
            Box::leak(Box::new(Timer { heap: Mutex::default(), earlier: Condvar::new() }));
        std::thread::Builder::new()
            .name("ringpost-timer".into())
            .spawn(move || timer.run())
            .expect("starting the ringpost-timer thread");
        timer
    })
}

impl Timer {
    fn register(&self, deadline: Instant, sleeper: Arc<Sleeper>) -> Key {
        let mut heap = self.heap.lock().unwrap();
        heap.sequence += 1;
        let key = (deadline, heap.sequence);
        heap.entries.insert(key, sleeper);
        // Signalled only when its wait would end after this deadline. Most sleeps are request
        // deadlines, dropped unfired long before they are due: a signal for each, on an idle
        // client where each is the earliest, would wake the thread once per request.
        let signal = match heap.thread {
            ThreadState::Running => false,
            ThreadState::WaitingUntil(wake) => deadline < wake,
            ThreadState::WaitingForever => true,
        };
        drop(heap);
        if signal {
            self.earlier.notify_one();
        }
        key
    }

    /// Takes out the entry of a sleep dropped before its deadline. The thread may wake once for
    /// nothing if it was the earliest; that costs less than signalling it here.
    fn cancel(&self, key: &Key) {
        self.heap.lock().unwrap().entries.remove(key);
    }

    /// Sleeps registered and neither fired nor dropped.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.heap.lock().unwrap().entries.len()
    }

    fn run(&self) {
        let mut heap = self.heap.lock().unwrap();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while heap.entries.first_key_value().is_some_and(|((deadline, _), _)| *deadline <= now) {
                due.push(heap.entries.pop_first().unwrap().1);
            }
            if !due.is_empty() {
                drop(heap);
                for sleeper in due {
                    let waker = sleeper.waker.lock().unwrap().take();
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }
                heap = self.heap.lock().unwrap();
                continue;
            }
            heap = match heap.entries.first_key_value() {
                Some(((deadline, _), _)) => {
                    let (deadline, wait) = (*deadline, deadline.saturating_duration_since(now));
                    heap.thread = ThreadState::WaitingUntil(deadline);
                    self.earlier.wait_timeout(heap, wait).unwrap().0
                }
                None => {
                    heap.thread = ThreadState::WaitingForever;
                    self.earlier.wait(heap).unwrap()
                }
            };
            heap.thread = ThreadState::Running;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on;

    #[test]
    fn sleep_waits_at_least_its_duration() {
        let started = Instant::now();
        block_on(sleep(Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_zero_sleep_is_ready_at_once() {
        block_on(sleep(Duration::ZERO));
    }

    #[test]
    fn many_sleepers_wake_in_deadline_order() {
        // Deadlines 40 ms apart from a common start, registered out of order.
        let start = Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = [5u64, 1, 3, 2, 4]
            .into_iter()
            .map(|step| {
                let order = order.clone();
                std::thread::spawn(move || {
                    block_on(sleep_until(start + Duration::from_millis(40 * step)));
                    order.lock().unwrap().push(step);
                })
            })
            .collect();
        threads.into_iter().for_each(|thread| thread.join().unwrap());
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_later_sleep_does_not_delay_an_earlier_one() {
        // Registers a long sleep first, so the timer thread waits on it, then a short one.
        // Not joined: the test is over once the short one woke.
        std::thread::spawn(|| block_on(sleep(Duration::from_secs(5))));
        std::thread::sleep(Duration::from_millis(20));
        let started = Instant::now();
        block_on(sleep(Duration::from_millis(20)));
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn a_dropped_sleep_is_harmless() {
        let waker = Waker::noop();
        let mut context = Context::from_waker(waker);
        let mut early = Box::pin(sleep(Duration::from_millis(10)));
        assert!(early.as_mut().poll(&mut context).is_pending());
        drop(early);
        block_on(sleep(Duration::from_millis(30)));
    }

    /// A sleep dropped before its deadline leaves nothing behind in the timer (other tests'
    /// sleeps come and go meanwhile, so the count is compared on a margin far above theirs).
    #[test]
    fn dropped_sleeps_are_taken_out_of_the_timer() {
        const SLEEPS: usize = 10_000;
        let waker = Waker::noop();
        let mut context = Context::from_waker(waker);
        let before = timer().live();
        let mut sleeps: Vec<Pin<Box<Sleep>>> =
            (0..SLEEPS).map(|_| Box::pin(sleep(Duration::from_secs(600)))).collect();
        for sleep in &mut sleeps {
            assert!(sleep.as_mut().poll(&mut context).is_pending());
        }
        // At least this test's own: other tests' sleeps counted in `before` may have ended.
        assert!(timer().live() >= SLEEPS, "{} live with {SLEEPS} of this test's", timer().live());
        drop(sleeps);
        assert!(timer().live() < before + SLEEPS / 100, "{} live after dropping", timer().live());
    }
}
