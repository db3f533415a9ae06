//! openraft's runtime on the router shard: its tasks, timers and clock go through
//! `crate::runtime` (glommio in the daemon, the seeded executor in the simulation), and its
//! channels, mutex and watch are tokio's runtime-independent `sync` types, which need no tokio
//! executor. With openraft's `single-threaded` feature none of it has to be `Send`.

use openraft_rt::{
    instant, oneshot, watch, AsyncRuntime, Mpsc, MpscReceiver, MpscSender, MpscWeakSender, SendError,
    TryRecvError,
};
use rand::SeedableRng;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct ShardRuntime;

/// A task that ended without its result: it was cancelled (its shard is stopping).
#[derive(Debug, thiserror::Error)]
#[error("the task was cancelled")]
pub struct Cancelled;

/// The result of a detached task: dropping it does not cancel the task, as openraft expects.
pub struct JoinHandle<T>(tokio::sync::oneshot::Receiver<T>);

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Cancelled>;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(context).map(|result| result.map_err(|_| Cancelled))
    }
}

pub type Sleep = Pin<Box<dyn Future<Output = ()>>>;

/// `future`, unless `sleep` ends first.
pub struct Timeout<T> {
    future: Pin<Box<T>>,
    sleep: Sleep,
}

#[derive(Debug, thiserror::Error)]
#[error("timed out")]
pub struct Elapsed;

impl<R, T: Future<Output = R>> Future for Timeout<T> {
    type Output = Result<R, Elapsed>;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(value) = self.future.as_mut().poll(context) {
            return Poll::Ready(Ok(value));
        }
        self.sleep.as_mut().poll(context).map(|()| Err(Elapsed))
    }
}

/// The seam's monotonic clock, in openraft's instant type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ShardInstant(std::time::Instant);

impl std::ops::Add<Duration> for ShardInstant {
    type Output = ShardInstant;
    fn add(self, duration: Duration) -> ShardInstant {
        ShardInstant(self.0 + duration)
    }
}
impl std::ops::AddAssign<Duration> for ShardInstant {
    fn add_assign(&mut self, duration: Duration) {
        self.0 += duration;
    }
}
impl std::ops::Sub<Duration> for ShardInstant {
    type Output = ShardInstant;
    fn sub(self, duration: Duration) -> ShardInstant {
        ShardInstant(self.0 - duration)
    }
}
impl std::ops::Sub<ShardInstant> for ShardInstant {
    type Output = Duration;
    fn sub(self, earlier: ShardInstant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }
}
impl std::ops::SubAssign<Duration> for ShardInstant {
    fn sub_assign(&mut self, duration: Duration) {
        self.0 -= duration;
    }
}
impl instant::Instant for ShardInstant {
    fn now() -> ShardInstant {
        ShardInstant(crate::runtime::now())
    }
}

thread_local! {
    /// Seeds of the generators openraft asks for (election timeouts): a fixed sequence, so that
    /// a run under the seeded executor repeats exactly.
    static NEXT_SEED: Cell<u64> = const { Cell::new(0x5249_4e47_504f_5354) };
}

fn sleep_for(duration: Duration) -> Sleep {
    Box::pin(crate::runtime::sleep(duration))
}

impl AsyncRuntime for ShardRuntime {
    type JoinError = Cancelled;
    type JoinHandle<T: 'static> = JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = ShardInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R>> = Timeout<T>;
    type ThreadLocalRng = rand::rngs::SmallRng;

    fn spawn<T>(future: T) -> JoinHandle<T::Output>
    where
        T: Future + 'static,
        T::Output: 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        crate::runtime::spawn(async move {
            let _ = sender.send(future.await);
        })
        .detach();
        JoinHandle(receiver)
    }

    fn sleep(duration: Duration) -> Sleep {
        sleep_for(duration)
    }

    fn sleep_until(deadline: ShardInstant) -> Sleep {
        sleep_for(deadline.0.saturating_duration_since(crate::runtime::now()))
    }

    fn timeout<R, F: Future<Output = R>>(duration: Duration, future: F) -> Timeout<F> {
        Timeout { future: Box::pin(future), sleep: sleep_for(duration) }
    }

    fn timeout_at<R, F: Future<Output = R>>(deadline: ShardInstant, future: F) -> Timeout<F> {
        Timeout { future: Box::pin(future), sleep: Self::sleep_until(deadline) }
    }

    fn is_panic(_: &Cancelled) -> bool {
        false
    }

    fn thread_rng() -> rand::rngs::SmallRng {
        // Under a simulation, from its seed: the thread-local sequence goes on from one run to
        // the next on a thread, and a replay of a seed would draw other timeouts.
        let seed = crate::runtime::simulated_seed().unwrap_or_else(|| {
            NEXT_SEED.with(|next| {
                let seed = next.get();
                next.set(
                    seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407),
                );
                seed
            })
        });
        rand::rngs::SmallRng::seed_from_u64(seed)
    }

    type Mpsc = TokioMpsc;
    type Watch = TokioWatch;
    type Oneshot = TokioOneshot;
    type Mutex<T: 'static> = TokioMutex<T>;

    fn new(_threads: usize) -> ShardRuntime {
        ShardRuntime
    }

    /// For openraft's own test helpers only: the catalog runs its raft on a shard's executor.
    fn block_on<F: Future<Output = T>, T>(&mut self, future: F) -> T {
        futures_lite::future::block_on(future)
    }
}

pub struct TokioMpsc;
pub struct Sender<T>(tokio::sync::mpsc::Sender<T>);
pub struct Receiver<T>(tokio::sync::mpsc::Receiver<T>);
pub struct WeakSender<T>(tokio::sync::mpsc::WeakSender<T>);

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender(self.0.clone())
    }
}
impl<T> Clone for WeakSender<T> {
    fn clone(&self) -> Self {
        WeakSender(self.0.clone())
    }
}

impl Mpsc for TokioMpsc {
    type Sender<T> = Sender<T>;
    type Receiver<T> = Receiver<T>;
    type WeakSender<T> = WeakSender<T>;
    fn channel<T>(buffer: usize) -> (Sender<T>, Receiver<T>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(buffer);
        (Sender(sender), Receiver(receiver))
    }
}

impl<T> MpscSender<TokioMpsc, T> for Sender<T> {
    async fn send(&self, message: T) -> Result<(), SendError<T>> {
        self.0.send(message).await.map_err(|error| SendError(error.0))
    }
    fn downgrade(&self) -> WeakSender<T> {
        WeakSender(self.0.downgrade())
    }
}

impl<T> MpscReceiver<T> for Receiver<T> {
    fn recv(&mut self) -> impl Future<Output = Option<T>> {
        self.0.recv()
    }
    fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map_err(|error| match error {
            tokio::sync::mpsc::error::TryRecvError::Empty => TryRecvError::Empty,
            tokio::sync::mpsc::error::TryRecvError::Disconnected => TryRecvError::Disconnected,
        })
    }
}

impl<T> MpscWeakSender<TokioMpsc, T> for WeakSender<T> {
    fn upgrade(&self) -> Option<Sender<T>> {
        self.0.upgrade().map(Sender)
    }
}

pub struct TokioOneshot;
pub struct OneshotSender<T>(tokio::sync::oneshot::Sender<T>);

impl oneshot::Oneshot for TokioOneshot {
    type Sender<T> = OneshotSender<T>;
    type Receiver<T> = tokio::sync::oneshot::Receiver<T>;
    type ReceiverError = tokio::sync::oneshot::error::RecvError;
    fn channel<T>() -> (OneshotSender<T>, tokio::sync::oneshot::Receiver<T>) {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        (OneshotSender(sender), receiver)
    }
}

impl<T> oneshot::OneshotSender<T> for OneshotSender<T> {
    fn send(self, value: T) -> Result<(), T> {
        self.0.send(value)
    }
}

pub struct TokioMutex<T>(tokio::sync::Mutex<T>);

impl<T: 'static> openraft_rt::Mutex<T> for TokioMutex<T> {
    type Guard<'a> = tokio::sync::MutexGuard<'a, T>;
    fn new(value: T) -> Self {
        TokioMutex(tokio::sync::Mutex::new(value))
    }
    fn lock(&self) -> impl Future<Output = tokio::sync::MutexGuard<'_, T>> {
        self.0.lock()
    }
}

pub struct TokioWatch;
pub struct WatchSender<T>(tokio::sync::watch::Sender<T>);
pub struct WatchReceiver<T>(tokio::sync::watch::Receiver<T>);
pub struct WatchRef<'a, T>(tokio::sync::watch::Ref<'a, T>);

impl watch::Watch for TokioWatch {
    type Sender<T> = WatchSender<T>;
    type Receiver<T> = WatchReceiver<T>;
    type Ref<'a, T: 'a> = WatchRef<'a, T>;
    fn channel<T>(initial: T) -> (WatchSender<T>, WatchReceiver<T>) {
        let (sender, receiver) = tokio::sync::watch::channel(initial);
        (WatchSender(sender), WatchReceiver(receiver))
    }
}

impl<T> Clone for WatchSender<T> {
    fn clone(&self) -> Self {
        WatchSender(self.0.clone())
    }
}
impl<T> Clone for WatchReceiver<T> {
    fn clone(&self) -> Self {
        WatchReceiver(self.0.clone())
    }
}

impl<T> watch::WatchSender<TokioWatch, T> for WatchSender<T> {
    fn send(&self, value: T) -> Result<(), watch::SendError<T>> {
        self.0.send(value).map_err(|error| watch::SendError(error.0))
    }
    fn send_if_modified<F: FnOnce(&mut T) -> bool>(&self, modify: F) -> bool {
        self.0.send_if_modified(modify)
    }
    fn borrow_watched(&self) -> WatchRef<'_, T> {
        WatchRef(self.0.borrow())
    }
    fn subscribe(&self) -> WatchReceiver<T> {
        WatchReceiver(self.0.subscribe())
    }
}

impl<T> watch::WatchReceiver<TokioWatch, T> for WatchReceiver<T> {
    async fn changed(&mut self) -> Result<(), watch::RecvError> {
        self.0.changed().await.map_err(|_| watch::RecvError(()))
    }
    fn borrow_watched(&self) -> WatchRef<'_, T> {
        WatchRef(self.0.borrow())
    }
    fn borrow_and_update(&mut self) -> WatchRef<'_, T> {
        WatchRef(self.0.borrow_and_update())
    }
}

impl<T> std::ops::Deref for WatchRef<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
