//! Keeps a bounded set of futures in flight on the calling thread.
//!
//! The client's futures complete through wakers called from each connection's reader thread,
//! so any executor works. A publisher needs only this: start a request, keep up to K of them
//! pending, and sleep until one completes or the next open-loop request is due. Each slot has
//! its own waker that records the slot's index and unparks the owning thread, so a wake-up
//! polls just the futures that asked for it instead of all K.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

type SlotFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// The slots woken since the owner last polled, and the owner to unpark.
struct WokenSlots {
    indices: Mutex<Vec<usize>>,
    owner: Thread,
}

struct SlotWaker {
    index: usize,
    woken: Arc<WokenSlots>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.indices.lock().unwrap().push(self.index);
        // An unpark that comes before the owner parks is kept as a token, so no wake is lost.
        self.woken.owner.unpark();
    }
}

/// Up to `capacity` futures, polled on the thread that created the set.
///
/// The set is not `Send` (its futures need not be), so it is always driven by the thread its
/// wakers unpark.
pub struct InflightSet<'a, T> {
    slots: Vec<Option<SlotFuture<'a, T>>>,
    wakers: Vec<Waker>,
    free: Vec<usize>,
    woken: Arc<WokenSlots>,
    /// Reused between calls of `poll_woken` so that polling does not allocate.
    polling: Vec<usize>,
}

impl<'a, T> InflightSet<'a, T> {
    pub fn new(capacity: usize) -> InflightSet<'a, T> {
        assert!(capacity > 0, "an InflightSet needs at least one slot");
        let woken = Arc::new(WokenSlots {
            indices: Mutex::new(Vec::with_capacity(capacity)),
            owner: std::thread::current(),
        });
        let wakers = (0..capacity)
            .map(|index| Waker::from(Arc::new(SlotWaker { index, woken: woken.clone() })))
            .collect();
        InflightSet {
            slots: (0..capacity).map(|_| None).collect(),
            wakers,
            free: (0..capacity).rev().collect(),
            woken,
            polling: Vec::with_capacity(capacity),
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Futures started and not yet finished.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    /// Starts a future and polls it once right away, so that a request is written to the
    /// socket now rather than at the next wake-up. Returns the output if that first poll
    /// already finished it (the client fails fast on a closed connection, for instance).
    ///
    /// Panics when every slot is busy: the caller bounds what it keeps in flight.
    pub fn start(&mut self, future: impl Future<Output = T> + 'a) -> Option<T> {
        let index = self.free.pop().expect("InflightSet::start with every slot busy");
        let mut future: SlotFuture<'a, T> = Box::pin(future);
        match future.as_mut().poll(&mut Context::from_waker(&self.wakers[index])) {
            Poll::Ready(output) => {
                self.free.push(index);
                Some(output)
            }
            Poll::Pending => {
                self.slots[index] = Some(future);
                None
            }
        }
    }

    /// Polls the futures woken since the last call and appends the outputs of those that
    /// finished to `finished`.
    pub fn poll_woken(&mut self, finished: &mut Vec<T>) {
        debug_assert_eq!(std::thread::current().id(), self.woken.owner.id());
        let mut polling = std::mem::take(&mut self.polling);
        std::mem::swap(&mut polling, &mut *self.woken.indices.lock().unwrap());
        for index in polling.drain(..) {
            // A slot can be woken twice, or after its future finished and the slot was reused;
            // polling an unfinished future once more is harmless, so duplicates are not
            // filtered.
            let Some(future) = self.slots[index].as_mut() else {
                continue;
            };
            if let Poll::Ready(output) = future.as_mut().poll(&mut Context::from_waker(&self.wakers[index])) {
                self.slots[index] = None;
                self.free.push(index);
                finished.push(output);
            }
        }
        self.polling = polling;
    }

    /// Sleeps until a future is woken, or until `deadline` when one is given.
    pub fn wait(&self, deadline: Option<Instant>) {
        debug_assert_eq!(std::thread::current().id(), self.woken.owner.id());
        if !self.woken.indices.lock().unwrap().is_empty() {
            return;
        }
        match deadline {
            None => std::thread::park(),
            Some(deadline) => {
                let now = Instant::now();
                if deadline > now {
                    std::thread::park_timeout(deadline - now);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A future completed by another thread after a delay, like a response from a server.
    fn completed_later(value: u32, delay: Duration) -> impl Future<Output = u32> {
        let slot: Arc<Mutex<(Option<u32>, Option<Waker>)>> = Arc::default();
        let shared = slot.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let waker = {
                let mut slot = shared.lock().unwrap();
                slot.0 = Some(value);
                slot.1.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        });
        std::future::poll_fn(move |context| {
            let mut slot = slot.lock().unwrap();
            match slot.0.take() {
                Some(value) => Poll::Ready(value),
                None => {
                    slot.1 = Some(context.waker().clone());
                    Poll::Pending
                }
            }
        })
    }

    #[test]
    fn finishes_every_future_and_reuses_slots() {
        let mut set = InflightSet::new(3);
        let mut finished = Vec::new();
        let mut next = 0;
        while finished.len() < 10 {
            while next < 10 && set.len() < set.capacity() {
                if let Some(value) =
                    set.start(completed_later(next, Duration::from_millis(u64::from(next % 3))))
                {
                    finished.push(value);
                }
                next += 1;
            }
            set.wait(None);
            set.poll_woken(&mut finished);
        }
        assert!(set.is_empty());
        finished.sort();
        assert_eq!(finished, (0..10).collect::<Vec<u32>>());
    }

    #[test]
    fn ready_futures_finish_in_start() {
        let mut set = InflightSet::new(1);
        assert_eq!(set.start(async { 7 }), Some(7));
        assert!(set.is_empty());
        assert_eq!(set.start(async { 8 }), Some(8));
    }

    #[test]
    fn wait_returns_at_the_deadline() {
        let set: InflightSet<'_, ()> = InflightSet::new(1);
        let started = Instant::now();
        set.wait(Some(started + Duration::from_millis(20)));
        // park_timeout may wake early (spuriously), never much later than asked.
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
