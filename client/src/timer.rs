//! A tiny timer for executor-agnostic futures: [`sleep`] registers its deadline and waker with
//! one timer thread per process, which wakes each sleeper when its deadline passes.
//!
//! The thread is started on the first `sleep` (a lazy static through `OnceLock`) and keeps a
//! binary heap of deadlines, so it wakes exactly when the next one is due and never polls.
//! A sleep that is dropped early stays in the heap until its deadline and is then discarded;
//! the heap is bounded by the sleeps started within the longest delay anyone asked for.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
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

/// The future of [`sleep`].
pub struct Sleep {
    deadline: Instant,
    /// Registered with the timer thread on the first poll that finds the deadline ahead.
    shared: Option<Arc<Sleeper>>,
}

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
            Some(shared) => {
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
                timer().register(self.deadline, shared.clone());
                self.shared = Some(shared);
            }
        }
        Poll::Pending
    }
}

struct Entry {
    deadline: Instant,
    /// Breaks ties between equal deadlines so the heap never compares sleepers.
    sequence: u64,
    sleeper: Arc<Sleeper>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        (self.deadline, self.sequence) == (other.deadline, other.sequence)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Entry) -> std::cmp::Ordering {
        (self.deadline, self.sequence).cmp(&(other.deadline, other.sequence))
    }
}

#[derive(Default)]
struct Heap {
    entries: BinaryHeap<Reverse<Entry>>,
    sequence: u64,
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
    fn register(&self, deadline: Instant, sleeper: Arc<Sleeper>) {
        let mut heap = self.heap.lock().unwrap();
        heap.sequence += 1;
        let sequence = heap.sequence;
        let earliest = heap.entries.peek().is_none_or(|Reverse(first)| deadline < first.deadline);
        heap.entries.push(Reverse(Entry { deadline, sequence, sleeper }));
        drop(heap);
        if earliest {
            self.earlier.notify_one();
        }
    }

    fn run(&self) {
        let mut heap = self.heap.lock().unwrap();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while heap.entries.peek().is_some_and(|Reverse(first)| first.deadline <= now) {
                due.push(heap.entries.pop().unwrap().0.sleeper);
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
            heap = match heap.entries.peek() {
                Some(Reverse(first)) => {
                    let wait = first.deadline.saturating_duration_since(now);
                    self.earlier.wait_timeout(heap, wait).unwrap().0
                }
                None => self.earlier.wait(heap).unwrap(),
            };
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
}
