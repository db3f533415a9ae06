//! Single-threaded synchronisation for tasks of one shard: a one-shot reply slot and a
//! notifier. Shards share nothing, so nothing here is `Send`.

use std::cell::{Cell, OnceCell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    sender_alive: bool,
}

/// The sending half of a one-shot reply.
pub struct Sender<T>(Rc<RefCell<Slot<T>>>);
/// The receiving half: a future resolving to `Some(value)`, or `None` if the sender was
/// dropped without sending.
pub struct Receiver<T>(Rc<RefCell<Slot<T>>>);

pub fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Rc::new(RefCell::new(Slot { value: None, waker: None, sender_alive: true }));
    (Sender(slot.clone()), Receiver(slot))
}

impl<T> Sender<T> {
    pub fn send(self, value: T) {
        let waker = {
            let mut slot = self.0.borrow_mut();
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = self.0.borrow_mut();
            slot.sender_alive = false;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = self.0.borrow_mut();
        if let Some(value) = slot.value.take() {
            return Poll::Ready(Some(value));
        }
        if !slot.sender_alive {
            return Poll::Ready(None);
        }
        slot.waker = Some(context.waker().clone());
        Poll::Pending
    }
}

/// Wakes every task waiting at the moment `notify_all` is called. A waiter registers by
/// awaiting `notified()`, and deregisters when it stops waiting (the future is dropped), so a
/// waiter that gave up (a long poll that timed out) leaves nothing behind.
///
/// The shared state is allocated when first needed (a waiter, or a clone, which must share it):
/// every topic and subscription has notifiers, and an idle one is never waited on.
#[derive(Default)]
pub struct Notify {
    inner: OnceCell<Rc<RefCell<NotifyInner>>>,
}

#[derive(Default)]
struct NotifyInner {
    generation: u64,
    next_waiter: u64,
    wakers: Vec<(u64, Waker)>,
}

impl Clone for Notify {
    fn clone(&self) -> Notify {
        Notify { inner: OnceCell::from(self.shared().clone()) }
    }
}

impl Notify {
    pub fn new() -> Notify {
        Notify::default()
    }

    fn shared(&self) -> &Rc<RefCell<NotifyInner>> {
        self.inner.get_or_init(Rc::default)
    }

    pub fn notify_all(&self) {
        // Never shared means never waited on: nobody to wake.
        let Some(inner) = self.inner.get() else { return };
        let wakers = {
            let mut inner = inner.borrow_mut();
            inner.generation += 1;
            std::mem::take(&mut inner.wakers)
        };
        for (_, waker) in wakers {
            waker.wake();
        }
    }

    /// Resolves at the next `notify_all` after this call.
    pub fn notified(&self) -> Notified {
        let notify = self.clone();
        let generation = notify.shared().borrow().generation;
        Notified { notify, generation, waiter: None }
    }

    /// Tasks waiting right now.
    pub fn waiters(&self) -> usize {
        self.inner.get().map_or(0, |inner| inner.borrow().wakers.len())
    }

    /// Whether the shared state was allocated (what an idle object holds).
    #[cfg(test)]
    fn is_allocated(&self) -> bool {
        self.inner.get().is_some()
    }
}

pub struct Notified {
    notify: Notify,
    generation: u64,
    waiter: Option<u64>,
}

impl Future for Notified {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let shared = self.notify.shared().clone();
        let mut inner = shared.borrow_mut();
        if inner.generation != self.generation {
            return Poll::Ready(());
        }
        match self.waiter {
            Some(id) => {
                if let Some(entry) = inner.wakers.iter_mut().find(|(waiter, _)| *waiter == id) {
                    if !entry.1.will_wake(context.waker()) {
                        entry.1 = context.waker().clone();
                    }
                }
            }
            None => {
                let id = inner.next_waiter;
                inner.next_waiter += 1;
                inner.wakers.push((id, context.waker().clone()));
                self.waiter = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for Notified {
    fn drop(&mut self) {
        if let Some(id) = self.waiter {
            let mut inner = self.notify.shared().borrow_mut();
            if let Some(index) = inner.wakers.iter().position(|(waiter, _)| *waiter == id) {
                inner.wakers.swap_remove(index);
            }
        }
    }
}

/// Polls every future until all are done; outputs in input order. Used to issue the same write
/// or sync to every data directory at once rather than one after another.
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|future| Some(Box::pin(future))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut done = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(context) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(|output| output.expect("every future completed")).collect()
}

/// Runs `work` on every item with at most `limit` of them in progress at once, and returns the
/// first error. After an error no further item is started; those in progress finish. Used
/// where many independent waits (one per topic at start-up) would otherwise be taken one at a
/// time, while a bound keeps their buffers and descriptors bounded.
pub async fn try_for_each_concurrent<T, E, F, W>(items: Vec<T>, limit: usize, work: W) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
    W: Fn(T) -> F,
{
    let queue = RefCell::new(std::collections::VecDeque::from(items));
    let first_error: RefCell<Option<E>> = RefCell::new(None);
    let worker = || async {
        loop {
            let Some(item) = queue.borrow_mut().pop_front() else { break };
            if let Err(error) = work(item).await {
                queue.borrow_mut().clear();
                first_error.borrow_mut().get_or_insert(error);
                break;
            }
        }
    };
    let workers = limit.max(1).min(queue.borrow().len());
    join_all((0..workers).map(|_| worker()).collect()).await;
    match first_error.into_inner() {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// An `Option<Rc<T>>` in a cell, read by cloning the `Rc` and replaced whole: a setting
/// that is rarely there and changes in place (a subscription's push endpoint, its dead-letter
/// topic). Half the size of a `RefCell` around the same value, which counted over 10,000 idle
/// subscriptions, and no borrow to hold across an await.
pub struct RcCell<T: ?Sized>(Cell<Option<Rc<T>>>);

impl<T: ?Sized> RcCell<T> {
    pub fn new(value: Option<Rc<T>>) -> RcCell<T> {
        RcCell(Cell::new(value))
    }

    pub fn get(&self) -> Option<Rc<T>> {
        let value = self.0.take();
        let copy = value.clone();
        self.0.set(value);
        copy
    }

    pub fn is_some(&self) -> bool {
        let value = self.0.take();
        let some = value.is_some();
        self.0.set(value);
        some
    }

    /// Replaces the value; the old one is dropped after the new one is in place.
    pub fn set(&self, value: Option<Rc<T>>) {
        drop(self.0.replace(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_rc_cell_hands_out_its_value_and_keeps_it() {
        let cell: RcCell<str> = RcCell::new(None);
        assert!(!cell.is_some() && cell.get().is_none());
        cell.set(Some(Rc::from("dead-letters")));
        assert_eq!(cell.get().as_deref(), Some("dead-letters"));
        assert_eq!(cell.get().as_deref(), Some("dead-letters"), "a read leaves the value in place");
        let held = cell.get().unwrap();
        cell.set(None);
        assert!(!cell.is_some());
        assert_eq!(&*held, "dead-letters", "a value handed out outlives its replacement");
    }

    /// Drives a future made of pending-once steps on a no-op waker, as an executor would.
    fn run<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut context = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
                return output;
            }
        }
    }

    /// Returns Pending once, so that several workers are in progress together.
    async fn yield_once() {
        let mut yielded = false;
        std::future::poll_fn(|_| {
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                Poll::Pending
            }
        })
        .await
    }

    #[test]
    fn concurrent_work_takes_every_item_once_within_the_limit() {
        let in_progress = std::cell::Cell::new(0usize);
        let in_progress_max = std::cell::Cell::new(0usize);
        let done = RefCell::new(Vec::new());
        let result: Result<(), ()> = run(try_for_each_concurrent((0..100).collect(), 7, |item: u32| {
            let (in_progress, in_progress_max, done) = (&in_progress, &in_progress_max, &done);
            async move {
                in_progress.set(in_progress.get() + 1);
                in_progress_max.set(in_progress_max.get().max(in_progress.get()));
                yield_once().await;
                done.borrow_mut().push(item);
                in_progress.set(in_progress.get() - 1);
                Ok(())
            }
        }));
        assert_eq!(result, Ok(()));
        let mut done = done.into_inner();
        done.sort();
        assert_eq!(done, (0..100).collect::<Vec<_>>());
        assert_eq!(in_progress_max.get(), 7, "as many in progress as the limit allows, and no more");
    }

    #[test]
    fn concurrent_work_stops_starting_items_after_an_error() {
        let started = RefCell::new(Vec::new());
        let result = run(try_for_each_concurrent((0..100).collect(), 4, |item: u32| {
            let started = &started;
            async move {
                started.borrow_mut().push(item);
                yield_once().await;
                if item == 5 {
                    Err(format!("item {item} failed"))
                } else {
                    Ok(())
                }
            }
        }));
        assert_eq!(result, Err("item 5 failed".to_string()));
        assert!(started.borrow().len() < 10, "started after the error: {:?}", started.borrow());
        let nothing: Result<(), ()> =
            run(try_for_each_concurrent(Vec::<u32>::new(), 4, |_| async { Ok(()) }));
        assert_eq!(nothing, Ok(()));
    }

    #[test]
    fn a_notifier_nobody_waits_on_allocates_nothing_and_clones_share() {
        let notify = Notify::new();
        notify.notify_all();
        assert!(!notify.is_allocated());
        let clone = notify.clone();
        let waker = std::task::Waker::noop();
        let mut context = Context::from_waker(waker);
        let mut notified = std::pin::pin!(clone.notified());
        assert!(notified.as_mut().poll(&mut context).is_pending());
        notify.notify_all();
        assert!(notified.as_mut().poll(&mut context).is_ready(), "the clone made before waiting shares");
    }

    #[test]
    fn waiters_that_give_up_leave_nothing_behind() {
        let notify = Notify::new();
        let waker = std::task::Waker::noop();
        let mut context = Context::from_waker(waker);
        for _ in 0..1000 {
            let mut notified = std::pin::pin!(notify.notified());
            assert!(notified.as_mut().poll(&mut context).is_pending());
            assert!(notified.as_mut().poll(&mut context).is_pending(), "a second poll registers nothing new");
        }
        assert_eq!(notify.waiters(), 0);
        let mut notified = std::pin::pin!(notify.notified());
        assert!(notified.as_mut().poll(&mut context).is_pending());
        assert_eq!(notify.waiters(), 1);
        notify.notify_all();
        assert!(notified.as_mut().poll(&mut context).is_ready());
    }
}

/// A shard's order to stop serving (SIGTERM): given once and never taken back. Whatever must
/// end for the shard to stop (accepting, reading connections, streams, waiting pulls) waits on
/// it beside its own work.
#[derive(Clone, Default)]
pub struct Stop {
    inner: Rc<StopInner>,
}

#[derive(Default)]
struct StopInner {
    given: Cell<bool>,
    notify: Notify,
}

impl Stop {
    pub fn is_given(&self) -> bool {
        self.inner.given.get()
    }

    /// Gives the order and wakes everything waiting on it.
    pub fn give(&self) {
        self.inner.given.set(true);
        self.inner.notify.notify_all();
    }

    /// Resolves once the order is given (at once if it was).
    pub async fn given(&self) {
        loop {
            // Registered before looking, so an order given in between is not missed.
            let notified = self.inner.notify.notified();
            if self.is_given() {
                return;
            }
            notified.await;
        }
    }

    /// Waits `duration` on the runtime's clock, or less if the order is given meanwhile:
    /// whether it was (a loop that runs until the stop ends there).
    pub async fn sleep(&self, duration: std::time::Duration) -> bool {
        futures_lite::future::or(
            async {
                crate::runtime::sleep(duration).await;
                false
            },
            async {
                self.given().await;
                true
            },
        )
        .await
    }
}
