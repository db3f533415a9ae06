//! The high-level subscriber: streaming pull with flow control, batched acknowledgements,
//! automatic lease extension and graceful shutdown, as Google Cloud Pub/Sub's client libraries
//! do them.
//!
//! ```no_run
//! use ringpost_client::{block_on, Client, ShutdownMode, Subscriber, SubscriberSettings};
//! use std::sync::Arc;
//! let client = Arc::new(block_on(Client::connect("127.0.0.1:7450")).unwrap());
//! let subscriber = Subscriber::new(client, "orders-sub", SubscriberSettings::default()).unwrap();
//! subscriber
//!     .run(|message, handle| {
//!         println!("{}", String::from_utf8_lossy(&message.data));
//!         handle.ack();
//!     })
//!     .unwrap();
//! std::thread::sleep(std::time::Duration::from_secs(10));
//! block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
//! ```
//!
//! # Two ways to consume
//!
//! - [`Subscriber::run`] calls a handler for each message on a pool of
//!   [`SubscriberSettings::workers`] threads (default 4), like Python's `subscribe(callback)` or
//!   Go's `Receive`.
//! - [`Subscriber::next`] hands messages to the application one at a time, as a stream.
//!
//! Either way each message comes with an [`AckHandle`]: [`AckHandle::ack`],
//! [`AckHandle::nack`] (redeliver now) or [`AckHandle::modify_ack_deadline`]. **Dropping a
//! handle without acking nacks the message**, so a forgotten handle can never hold the
//! flow-control window until its lease runs out (python-pubsub#365, java-pubsub#2480). Acks,
//! nacks and deadline changes are batched: a request goes out every [`ACK_FLUSH_INTERVAL`]
//! (100 ms) or as soon as [`ACK_BATCH_IDS_MAX`] (1000) ids wait.
//!
//! # Flow control
//!
//! The server enforces it: each stream carries [`SubscriberSettings::max_outstanding_messages`]
//! (default 1000) and [`SubscriberSettings::max_outstanding_bytes`] (default 100 MiB, Python's
//! defaults) and the server sends nothing more while that many messages are delivered and not
//! acked or nacked. With [`SubscriberSettings::parallel_streams`] above 1, or a topic of several
//! publish sources (a stream on each), the limits are split between the streams, so they bound
//! the whole subscriber and not each stream (the `setParallelPullCount` surprise of
//! java-pubsub#2480). Every ack and nack frees the window, and
//! a handle that is dropped nacks, so the window cannot fill with messages nobody will settle.
//!
//! # Lease extension
//!
//! While the application holds a message (queued for a worker, in a handler, or taken from
//! `next`), the subscriber extends its ack deadline before it expires: first at 0.8 of the
//! stream's deadline (the subscription's ack deadline, e.g. 10 s, unless
//! [`SubscriberSettings::stream_ack_deadline_seconds`] sets another), then each time 0.8 of the
//! way through the extension it sent. The extension is the 99th percentile of the processing
//! times observed so far (receipt to ack), clamped to 10–600 s, as python-pubsub's histogram
//! does; until the first ack it is the stream's deadline. Extensions stop once a message has
//! been held [`SubscriberSettings::max_lease_duration`] (default 60 minutes, like Python, Java
//! and Go); the server then redelivers it when its deadline passes, and an ack from the
//! application is still sent (the server accepts it until the message is delivered again).
//!
//! # Shutdown
//!
//! [`Subscriber::shutdown`] stops pulling, then, with [`ShutdownMode::WaitForProcessing`],
//! lets the workers handle every message already received and waits until the application has
//! settled every handle it holds (leases are still extended meanwhile); with
//! [`ShutdownMode::NackImmediately`] it nacks every message not yet settled. It then sends the
//! pending acks and nacks and waits for their answers, and only then closes the streams:
//! Ringpost redelivers the messages of a closed stream at once, so closing first would
//! redeliver messages whose acks were still on their way. Messages the server pushed after
//! pulling stopped and that nobody saw go back with the stream, without counting an attempt.
//! Dropping a running subscriber shuts it down with `NackImmediately` in the background.
//!
//! # Threading model
//!
//! A subscriber starts its threads on the first `run` or `next`, a fixed number of them:
//! - one `ringpost-sub-sources` thread, which looks up the topic's publish sources and starts
//!   `parallel_streams` pulling threads on each, and on each source added later (it looks again
//!   every [`crate::sources::SOURCES_REFRESH_INTERVAL`], 30 s);
//! - `parallel_streams` `ringpost-sub-pull` threads per source, each owning one streaming pull
//!   on its source: it reads batches, registers their leases and hands the messages to the
//!   workers or to `next`, and reopens its stream alone, with backoff, after a failure;
//! - one `ringpost-sub-lease` thread, which sends the lease extensions when they are due;
//! - `ACK_SENDERS` `ringpost-sub-ack` threads, which send the batched acks, nacks and deadline
//!   changes, a quarter of the flow-control window per request at most, one request each at a
//!   time;
//! - with `run`, `workers` `ringpost-sub-work` threads that call the handler (a panicking
//!   handler nacks its message and the worker carries on).
//!
//! Requests are sent with [`crate::block_on`] on those threads. The futures of this module
//! (`next`, `shutdown`, `stopped`) are woken through wakers or sleep on the process's [`timer`]
//! thread, so they work with any executor. All threads end with `shutdown`.
//!
//! [`timer`]: crate::timer

use crate::retry::{Backoff, RetrySettings};
use crate::stream::{MessageStream, StreamSettings};
use crate::{block_on, timer, Client, Error, ReceivedMessage, Result};
use ringpost_wire::limits::{
    ACK_DEADLINE_SECONDS_DEFAULT, ACK_DEADLINE_SECONDS_MAX, ACK_DEADLINE_SECONDS_MIN,
    ACK_IDS_PER_REQUEST_MAX, MODIFY_ACK_DEADLINE_SECONDS_MAX,
};
use ringpost_wire::Status;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// Messages delivered and not yet acked or nacked, over all streams (Python: 1000).
pub const MAX_OUTSTANDING_MESSAGES_DEFAULT: u64 = 1000;
/// Bytes delivered and not yet acked or nacked, over all streams (Python: 100 MiB).
pub const MAX_OUTSTANDING_BYTES_DEFAULT: u64 = 100 * 1024 * 1024;
pub const PARALLEL_STREAMS_DEFAULT: usize = 1;
pub const PARALLEL_STREAMS_MAX: usize = 64;
/// Handler threads of `run`.
pub const WORKERS_DEFAULT: usize = 4;
pub const WORKERS_MAX: usize = 1024;
/// Acks, nacks and deadline changes wait at most this long to be sent together...
pub const ACK_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// ... or until a quarter of `max_outstanding_messages` wait, and at most this many; a request
/// carries no more. A quarter window, so that acks are on their way long before the window is
/// full: with a whole window per request the stream would stop and wait for every round.
pub const ACK_BATCH_IDS_MAX: usize = 1000;
/// `ringpost-sub-ack` threads. Each sends one request and waits for its answer, and an ack is
/// answered once it is durable on the server (milliseconds while the disk is busy), so this
/// many are in flight: with one, acks fell behind a backlog drain.
pub const ACK_SENDERS: usize = 4;
/// How long a message is kept leased at most (Python's `max_lease_duration`, Java, Go: 60 min).
pub const MAX_LEASE_DURATION_DEFAULT: Duration = Duration::from_secs(60 * 60);
/// Bounds of one lease extension (python-pubsub clamps its p99 estimate to 10-600 s).
pub const LEASE_EXTENSION_SECONDS_MIN: u32 = ACK_DEADLINE_SECONDS_MIN;
pub const LEASE_EXTENSION_SECONDS_MAX: u32 = ACK_DEADLINE_SECONDS_MAX;
/// A lease is extended this far into its deadline.
pub const LEASE_EXTEND_AT: f64 = 0.8;
/// The percentile of processing times an extension covers.
pub const LEASE_PERCENTILE: f64 = 99.0;
/// Extensions due within this of the first one due go in the same request.
pub const LEASE_GROUPING: Duration = Duration::from_secs(1);
/// Longest wait before a stream that failed is opened again.
pub use crate::stream::STREAM_REOPEN_DELAY_MAX;
/// How often `shutdown` looks whether the threads it waits for are done.
const SHUTDOWN_POLL_INTERVAL: Duration = Duration::from_millis(5);

const _: () = assert!(ACK_BATCH_IDS_MAX <= ACK_IDS_PER_REQUEST_MAX);
const _: () = assert!(LEASE_EXTENSION_SECONDS_MAX <= MODIFY_ACK_DEADLINE_SECONDS_MAX);
const _: () = assert!(LEASE_GROUPING.as_secs() * 5 <= LEASE_EXTENSION_SECONDS_MIN as u64);

/// Pull, acknowledge and modify-ack-deadline backoff, capped lower for reopening streams.
const REOPEN_RETRY: RetrySettings = crate::stream::STREAM_REOPEN_RETRY;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberSettings {
    /// Over all streams; 0: no limit (default 1000).
    pub max_outstanding_messages: u64,
    /// Over all streams; 0: no limit (default 100 MiB).
    pub max_outstanding_bytes: u64,
    /// Streaming pulls, 1 to `PARALLEL_STREAMS_MAX` (default 1).
    pub parallel_streams: usize,
    /// Handler threads of `run`, 1 to `WORKERS_MAX` (default 4).
    pub workers: usize,
    /// Leases are not extended beyond this (default 60 minutes).
    pub max_lease_duration: Duration,
    /// The streams' ack deadline, 10 to 600 s; 0 (the default) uses the subscription's.
    pub stream_ack_deadline_seconds: u32,
}

impl Default for SubscriberSettings {
    fn default() -> SubscriberSettings {
        SubscriberSettings {
            max_outstanding_messages: MAX_OUTSTANDING_MESSAGES_DEFAULT,
            max_outstanding_bytes: MAX_OUTSTANDING_BYTES_DEFAULT,
            parallel_streams: PARALLEL_STREAMS_DEFAULT,
            workers: WORKERS_DEFAULT,
            max_lease_duration: MAX_LEASE_DURATION_DEFAULT,
            stream_ack_deadline_seconds: 0,
        }
    }
}

impl SubscriberSettings {
    /// `InvalidArgument` naming the first setting out of range.
    pub fn validate(&self) -> Result<()> {
        let refuse = |message: String| Err(Error::Status(Status::invalid_argument(message)));
        if !(1..=PARALLEL_STREAMS_MAX).contains(&self.parallel_streams) {
            return refuse(format!(
                "parallel_streams is {}; it must be 1 to {PARALLEL_STREAMS_MAX} (PARALLEL_STREAMS_MAX)",
                self.parallel_streams
            ));
        }
        if !(1..=WORKERS_MAX).contains(&self.workers) {
            return refuse(format!(
                "workers is {}; it must be 1 to {WORKERS_MAX} (WORKERS_MAX)",
                self.workers
            ));
        }
        let deadline = self.stream_ack_deadline_seconds;
        if deadline != 0 && !(ACK_DEADLINE_SECONDS_MIN..=ACK_DEADLINE_SECONDS_MAX).contains(&deadline) {
            return refuse(format!(
                "stream_ack_deadline_seconds is {deadline}; it must be 0 (the subscription's) or \
                 {ACK_DEADLINE_SECONDS_MIN} to {ACK_DEADLINE_SECONDS_MAX}"
            ));
        }
        Ok(())
    }

    /// The settings of each stream when the topic has `sources` sources: the flow-control
    /// limits split between the streams, `parallel_streams` on each source (at least one
    /// message and byte a stream).
    fn stream_settings(&self, sources: u32) -> StreamSettings {
        let streams = self.parallel_streams as u64 * u64::from(sources.max(1));
        let share = |limit: u64| match limit {
            0 => 0,
            limit => (limit / streams).max(1),
        };
        StreamSettings {
            max_outstanding_messages: share(self.max_outstanding_messages),
            max_outstanding_bytes: share(self.max_outstanding_bytes),
            stream_ack_deadline_seconds: self.stream_ack_deadline_seconds,
        }
    }
}

/// How [`Subscriber::shutdown`] treats the messages not settled yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShutdownMode {
    /// Handle every message already received and wait until each handle is settled.
    #[default]
    WaitForProcessing,
    /// Nack every message not settled yet; wait only for the handlers running now to return.
    NackImmediately,
}

/// What a subscriber did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Messages delivered by the server.
    pub received: u64,
    pub acked: u64,
    /// Nacked, by the application, by dropped handles or by shutdown.
    pub nacked: u64,
    /// Lease extensions sent, counted per message.
    pub extended: u64,
    /// Messages held past `max_lease_duration`, whose leases were no longer extended.
    pub lease_expired: u64,
    /// Ack ids the server refused (their lease had expired and the message went to another
    /// subscriber), in acks, nacks and extensions.
    pub refused: u64,
    /// Ack ids whose request still failed after the client's retries.
    pub failed: u64,
    pub handler_panics: u64,
    pub streams_opened: u64,
    /// Messages delivered and not yet settled.
    pub held: u64,
    /// The lease extension in use, in seconds (0 before the first stream opened).
    pub lease_seconds: u32,
}

/// Receives from one subscription. See the module docs.
pub struct Subscriber {
    inner: Arc<Inner>,
}

/// Settles one message: ack, nack or a new deadline. Dropping it unsettled nacks the message.
pub struct AckHandle {
    inner: Arc<Inner>,
    ack_id: String,
}

impl std::fmt::Debug for AckHandle {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("AckHandle").field("ack_id", &self.ack_id).finish()
    }
}

impl AckHandle {
    pub fn ack_id(&self) -> &str {
        &self.ack_id
    }

    /// Acknowledges the message (sent with the next batch of acks).
    pub fn ack(self) {
        self.inner.settle(&self.ack_id, Settle::Ack);
    }

    /// Asks for the message to be delivered again now.
    pub fn nack(self) {
        self.inner.settle(&self.ack_id, Settle::Nack);
    }

    /// Sets the message's deadline to `seconds` from now (at most 600; 0 is a nack, after which
    /// the handle does nothing more). Automatic extension carries on from there.
    pub fn modify_ack_deadline(&self, seconds: u32) {
        let seconds = seconds.min(MODIFY_ACK_DEADLINE_SECONDS_MAX);
        if seconds == 0 {
            self.inner.settle(&self.ack_id, Settle::Nack);
            return;
        }
        let now = Instant::now();
        let held = {
            let mut leases = self.inner.leases.lock().unwrap();
            match leases.held.get_mut(&self.ack_id) {
                Some(held) => {
                    held.next_extension = now + Duration::from_secs(seconds as u64).mul_f64(LEASE_EXTEND_AT);
                    true
                }
                None => false,
            }
        };
        if held {
            self.inner.leases_changed.notify_all();
            self.inner.push_ack(Pending::Modify(seconds), self.ack_id.clone());
        }
    }
}

impl Drop for AckHandle {
    fn drop(&mut self) {
        // A no-op after ack or nack: the message is no longer held.
        self.inner.settle(&self.ack_id, Settle::Nack);
    }
}

type Handler = Arc<dyn Fn(ReceivedMessage, AckHandle) + Send + Sync + 'static>;
type ThreadBody = Box<dyn FnOnce() + Send>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Handler,
    Stream,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    NotStarted,
    Running,
    ShuttingDown,
    Done,
}

#[derive(Clone, Copy)]
enum Settle {
    Ack,
    Nack,
}

#[derive(Clone, Copy)]
enum Pending {
    Ack,
    Nack,
    Modify(u32),
}

struct Inner {
    client: Arc<Client>,
    subscription: String,
    settings: SubscriberSettings,
    mode: OnceLock<Mode>,
    life: Mutex<Life>,
    leases: Mutex<Leases>,
    leases_changed: Condvar,
    acks: Mutex<AckQueue>,
    acks_changed: Condvar,
    work: Mutex<WorkQueue>,
    work_changed: Condvar,
    ready: Mutex<ReadyQueue>,
    /// Fired when pulling must stop: shutdown, or a failure no retry can mend.
    stop: Signal,
    pullers: AtomicUsize,
    workers: AtomicUsize,
    leasers: AtomicUsize,
    ackers: AtomicUsize,
    counters: Counters,
}

struct Life {
    phase: Phase,
    /// The failure that stopped the subscriber, if one did.
    fatal: Option<Error>,
    /// Streams kept open after pulling stopped, closed once the acks are sent.
    parked: Vec<MessageStream>,
}

struct Leases {
    held: HashMap<String, Held>,
    histogram: Histogram,
    /// The streams' ack deadline, known once the first stream is about to open.
    initial_seconds: u32,
    stop: bool,
}

struct Held {
    received: Instant,
    next_extension: Instant,
    /// False once held past `max_lease_duration`.
    extending: bool,
}

#[derive(Default)]
struct AckQueue {
    acks: Vec<String>,
    nacks: Vec<String>,
    modifies: BTreeMap<u32, Vec<String>>,
    count: usize,
    /// When the oldest waiting id was queued.
    since: Option<Instant>,
    stop: bool,
}

impl AckQueue {
    /// Takes up to `most` ids, acks first, then nacks, then deadline changes (longest first);
    /// what is left stays due from the same time.
    fn take(&mut self, most: usize) -> AckQueue {
        fn split(ids: &mut Vec<String>, most: usize) -> Vec<String> {
            ids.split_off(ids.len().saturating_sub(most))
        }
        let mut taken = AckQueue::default();
        taken.acks = split(&mut self.acks, most);
        taken.nacks = split(&mut self.nacks, most - taken.acks.len());
        let mut room = most - taken.acks.len() - taken.nacks.len();
        while room > 0 {
            let Some(mut entry) = self.modifies.last_entry() else { break };
            let ids = split(entry.get_mut(), room);
            room -= ids.len();
            taken.modifies.insert(*entry.key(), ids);
            if entry.get().is_empty() {
                entry.remove();
            }
        }
        let count =
            taken.acks.len() + taken.nacks.len() + taken.modifies.values().map(Vec::len).sum::<usize>();
        self.count -= count;
        if self.count == 0 {
            self.since = None;
        }
        taken.count = count;
        taken
    }
}

#[derive(Default)]
struct WorkQueue {
    items: VecDeque<(ReceivedMessage, AckHandle)>,
    closed: bool,
}

#[derive(Default)]
struct ReadyQueue {
    items: VecDeque<(ReceivedMessage, AckHandle)>,
    closed: bool,
    error_reported: bool,
    wakers: HashMap<u64, Waker>,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    acked: AtomicU64,
    nacked: AtomicU64,
    extended: AtomicU64,
    lease_expired: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    handler_panics: AtomicU64,
    streams_opened: AtomicU64,
}

fn add(counter: &AtomicU64, count: usize) {
    counter.fetch_add(count as u64, Ordering::Relaxed);
}

thread_local! {
    /// Set while a handler runs, so `shutdown` from a handler fails instead of waiting for
    /// itself.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

static NEXT_WAITER_ID: AtomicU64 = AtomicU64::new(1);

impl Subscriber {
    /// A subscriber of `subscription` over `client`; `InvalidArgument` if the settings are out
    /// of range. Nothing is pulled (and no thread started) before `run` or `next`.
    pub fn new(
        client: Arc<Client>,
        subscription: impl Into<String>,
        settings: SubscriberSettings,
    ) -> Result<Subscriber> {
        settings.validate()?;
        let inner = Inner {
            client,
            subscription: subscription.into(),
            settings,
            mode: OnceLock::new(),
            life: Mutex::new(Life { phase: Phase::NotStarted, fatal: None, parked: Vec::new() }),
            leases: Mutex::new(Leases {
                held: HashMap::new(),
                histogram: Histogram::default(),
                initial_seconds: 0,
                stop: false,
            }),
            leases_changed: Condvar::new(),
            acks: Mutex::default(),
            acks_changed: Condvar::new(),
            work: Mutex::default(),
            work_changed: Condvar::new(),
            ready: Mutex::default(),
            stop: Signal::default(),
            pullers: AtomicUsize::new(0),
            workers: AtomicUsize::new(0),
            leasers: AtomicUsize::new(0),
            ackers: AtomicUsize::new(0),
            counters: Counters::default(),
        };
        Ok(Subscriber { inner: Arc::new(inner) })
    }

    pub fn subscription(&self) -> &str {
        &self.inner.subscription
    }

    pub fn settings(&self) -> &SubscriberSettings {
        &self.inner.settings
    }

    /// Starts pulling and calls `handler` for each message on the worker threads; returns once
    /// started. `FailedPrecondition` if the subscriber was already started or shut down.
    pub fn run<F>(&self, handler: F) -> Result<()>
    where
        F: Fn(ReceivedMessage, AckHandle) + Send + Sync + 'static,
    {
        self.inner.start(Mode::Handler, Some(Arc::new(handler)))
    }

    /// The next message, pulling from the first call on. `None` once the subscriber stopped
    /// (after `shutdown`, or after the failure it reports first as `Some(Err)`).
    /// `Some(Err(FailedPrecondition))` if the subscriber runs a handler instead.
    pub async fn next(&self) -> Option<Result<(ReceivedMessage, AckHandle)>> {
        if let Err(error) = self.inner.start(Mode::Stream, None) {
            match self.inner.mode.get() {
                Some(Mode::Stream) => {}
                Some(Mode::Handler) => return Some(Err(error)),
                // Shut down before it ever started.
                None => return None,
            }
        }
        let id = NEXT_WAITER_ID.fetch_add(1, Ordering::Relaxed);
        let _forget = ForgetWaker { inner: &self.inner, id };
        std::future::poll_fn(|context| {
            let mut ready = self.inner.ready.lock().unwrap();
            if let Some(item) = ready.items.pop_front() {
                return Poll::Ready(Some(Ok(item)));
            }
            if ready.closed {
                if !ready.error_reported {
                    ready.error_reported = true;
                    if let Some(error) = &self.inner.life.lock().unwrap().fatal {
                        return Poll::Ready(Some(Err(error.duplicate())));
                    }
                }
                return Poll::Ready(None);
            }
            ready.wakers.insert(id, context.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Resolves once the subscriber has stopped pulling: after `shutdown` began, or after a
    /// failure no retry can mend (the subscription was deleted, ...), which it returns.
    pub async fn stopped(&self) -> Result<()> {
        self.inner.stop.wait().await;
        match &self.inner.life.lock().unwrap().fatal {
            Some(error) => Err(error.duplicate()),
            None => Ok(()),
        }
    }

    /// Stops pulling, settles or waits for the messages held (see [`ShutdownMode`]), sends the
    /// pending acks and nacks, closes the streams and ends every thread. Returns the failure
    /// that had stopped the subscriber, if one did. A second call waits for the first.
    /// `FailedPrecondition` when called from a handler, which it would wait for.
    pub async fn shutdown(&self, mode: ShutdownMode) -> Result<()> {
        if IN_HANDLER.with(Cell::get) {
            return Err(Error::Status(Status::failed_precondition(
                "Subscriber::shutdown called from a handler, which it would wait for",
            )));
        }
        let first = {
            let mut life = self.inner.life.lock().unwrap();
            match life.phase {
                Phase::NotStarted => {
                    life.phase = Phase::Done;
                    self.inner.stop.fire();
                    false
                }
                Phase::Running => {
                    life.phase = Phase::ShuttingDown;
                    true
                }
                Phase::ShuttingDown | Phase::Done => false,
            }
        };
        if first {
            shut_down(&self.inner, mode).await;
        } else {
            wait_until(|| self.inner.life.lock().unwrap().phase == Phase::Done).await;
        }
        match &self.inner.life.lock().unwrap().fatal {
            Some(error) => Err(error.duplicate()),
            None => Ok(()),
        }
    }

    pub fn stats(&self) -> SubscriberStats {
        let counters = &self.inner.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let (held, lease_seconds) = {
            let leases = self.inner.leases.lock().unwrap();
            (leases.held.len() as u64, leases.extension_seconds())
        };
        SubscriberStats {
            received: read(&counters.received),
            acked: read(&counters.acked),
            nacked: read(&counters.nacked),
            extended: read(&counters.extended),
            lease_expired: read(&counters.lease_expired),
            refused: read(&counters.refused),
            failed: read(&counters.failed),
            handler_panics: read(&counters.handler_panics),
            streams_opened: read(&counters.streams_opened),
            held,
            lease_seconds,
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let running = {
            let mut life = self.inner.life.lock().unwrap();
            if life.phase == Phase::Running {
                life.phase = Phase::ShuttingDown;
                true
            } else {
                false
            }
        };
        if running {
            let inner = self.inner.clone();
            let spawned = std::thread::Builder::new()
                .name("ringpost-sub-close".into())
                .spawn(move || block_on(shut_down(&inner, ShutdownMode::NackImmediately)));
            if spawned.is_err() {
                // At least stop pulling; the streams close with the last reference.
                self.inner.stop.fire();
            }
        }
    }
}

/// Removes the waker of a `next` that ended or was dropped.
struct ForgetWaker<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for ForgetWaker<'_> {
    fn drop(&mut self) {
        self.inner.ready.lock().unwrap().wakers.remove(&self.id);
    }
}

impl Inner {
    /// Starts the threads, once.
    fn start(self: &Arc<Self>, mode: Mode, handler: Option<Handler>) -> Result<()> {
        {
            let mut life = self.life.lock().unwrap();
            if life.phase != Phase::NotStarted {
                let what = match (life.phase, self.mode.get()) {
                    (Phase::Running, Some(Mode::Handler)) => "already runs a handler",
                    (Phase::Running, _) => "is already consumed with next()",
                    _ => "is shut down",
                };
                return Err(Error::Status(Status::failed_precondition(format!(
                    "the subscriber of '{}' {what}",
                    self.subscription
                ))));
            }
            life.phase = Phase::Running;
            let _ = self.mode.set(mode);
        }
        // Each thread is counted before it runs, so a shutdown that starts at once waits for it;
        // a body that never runs gives its count back when it is dropped.
        let mut threads: Vec<(&str, ThreadBody)> = Vec::new();
        for _ in 0..ACK_SENDERS {
            let running = Running::enter(self, Kind::Acker);
            threads.push(("ringpost-sub-ack", Box::new(move || running.inner.clone().send_acks(&running))));
        }
        let running = Running::enter(self, Kind::Leaser);
        threads.push(("ringpost-sub-lease", Box::new(move || running.inner.clone().extend_leases(&running))));
        if let Some(handler) = handler {
            for _ in 0..self.settings.workers {
                let (running, handler) = (Running::enter(self, Kind::Worker), handler.clone());
                threads.push((
                    "ringpost-sub-work",
                    Box::new(move || running.inner.clone().work(handler, &running)),
                ));
            }
        }
        let running = Running::enter(self, Kind::Puller);
        threads.push(("ringpost-sub-sources", Box::new(move || running.inner.clone().gather(&running))));
        for (name, body) in threads {
            if let Err(error) = std::thread::Builder::new().name(name.into()).spawn(body) {
                self.fail(Error::Io(error));
                return Err(Error::Status(Status::unavailable(format!(
                    "cannot start the threads of the subscriber of '{}'",
                    self.subscription
                ))));
            }
        }
        Ok(())
    }

    fn count(&self, kind: Kind) -> &AtomicUsize {
        match kind {
            Kind::Puller => &self.pullers,
            Kind::Worker => &self.workers,
            Kind::Leaser => &self.leasers,
            Kind::Acker => &self.ackers,
        }
    }

    /// Records a failure no retry can mend and stops pulling.
    fn fail(&self, error: Error) {
        self.life.lock().unwrap().fatal.get_or_insert(error);
        self.stop.fire();
    }

    // ---- pulling ----

    /// The `ringpost-sub-sources` thread: looks up the topic's sources and starts
    /// `parallel_streams` pulling threads on each, then looks again every
    /// `SOURCES_REFRESH_INTERVAL` and starts them on each source added since. A source's
    /// streams take their share of the window over the sources known when they start: streams
    /// started before a source was added keep their larger share until they reopen.
    fn gather(self: Arc<Self>, _running: &Running) {
        let mut backoff = Backoff::new(REOPEN_RETRY);
        let mut started = 0;
        while !self.stop.is_fired() {
            let count =
                match block_on(until(&self.stop, self.client.subscription_sources(&self.subscription))) {
                    None => return,
                    Some(Ok((count, _active))) => count,
                    Some(Err(error)) => {
                        if !self.retry_after(&error, &mut backoff) {
                            return;
                        }
                        continue;
                    }
                };
            backoff = Backoff::new(REOPEN_RETRY);
            let settings = self.settings.stream_settings(count);
            for source in started..count {
                for _ in 0..self.settings.parallel_streams {
                    let running = Running::enter(&self, Kind::Puller);
                    let settings = settings.clone();
                    let body = move || running.inner.clone().pull(&running, source, settings);
                    if let Err(error) =
                        std::thread::Builder::new().name("ringpost-sub-pull".into()).spawn(body)
                    {
                        self.fail(Error::Io(error));
                        return;
                    }
                }
            }
            started = started.max(count);
            block_on(until(&self.stop, timer::sleep(crate::sources::SOURCES_REFRESH_INTERVAL)));
        }
    }

    /// One `ringpost-sub-pull` thread: keeps one stream open on source `source` and hands its
    /// messages out. Each source's streams are its own: one that fails reopens alone.
    fn pull(self: Arc<Self>, _running: &Running, source: u32, settings: StreamSettings) {
        let mut backoff = Backoff::new(REOPEN_RETRY);
        while !self.stop.is_fired() {
            if let Err(error) = self.learn_initial_deadline() {
                if !self.retry_after(&error, &mut backoff) {
                    return;
                }
                continue;
            }
            let opening = self.client.streaming_pull_source(&self.subscription, source, settings.clone());
            let mut stream = match block_on(until(&self.stop, opening)) {
                None => return,
                Some(Ok(stream)) => stream,
                Some(Err(error)) => {
                    if !self.retry_after(&error, &mut backoff) {
                        return;
                    }
                    continue;
                }
            };
            add(&self.counters.streams_opened, 1);
            backoff = Backoff::new(REOPEN_RETRY);
            loop {
                match block_on(until(&self.stop, stream.next())) {
                    None => {
                        // Kept open until the acks are sent: closing redelivers its messages.
                        self.life.lock().unwrap().parked.push(stream);
                        return;
                    }
                    Some(Some(Ok(batch))) => self.deliver(batch),
                    Some(Some(Err(error))) => {
                        if !self.retry_after(&error, &mut backoff) {
                            return;
                        }
                        break;
                    }
                    // The server ended the stream: open another.
                    Some(None) => break,
                }
            }
        }
    }

    /// The deadline the streams' messages start with, for their first extension.
    fn learn_initial_deadline(&self) -> Result<()> {
        if self.leases.lock().unwrap().initial_seconds != 0 {
            return Ok(());
        }
        let seconds = match self.settings.stream_ack_deadline_seconds {
            0 => match block_on(until(&self.stop, self.client.get_subscription(&self.subscription))) {
                None => return Ok(()),
                Some(subscription) => match subscription?.ack_deadline_seconds {
                    0 => ACK_DEADLINE_SECONDS_DEFAULT,
                    seconds => seconds,
                },
            },
            seconds => seconds,
        };
        self.leases.lock().unwrap().initial_seconds = seconds;
        Ok(())
    }

    /// After a failure: waits out the backoff and returns true if it is worth another try;
    /// otherwise records it as fatal and returns false.
    fn retry_after(&self, error: &Error, backoff: &mut Backoff) -> bool {
        // `NotOwner` here outlasted the stream's own lookups: a replicated topic's leader is
        // being elected; it is retried like `Unavailable`. A stream that could not be opened
        // within the request timeout (a node still starting) is tried again too: a subscriber
        // runs until it is shut down.
        let timed_out = matches!(error, Error::DeadlineExceeded(_));
        if !crate::stream::is_worth_reopening(error) && !timed_out {
            self.fail(error.duplicate());
            return false;
        }
        // A stream whose connection failed opens again from the route it had: a forwarder that
        // cannot be reached is passed over for the next as the stream opens, with no lookup
        // through a router that may be on the node that failed.
        self.client.after_stream_failure(&self.subscription, error);
        block_on(until(&self.stop, timer::sleep(backoff.next_delay())));
        !self.stop.is_fired()
    }

    /// Leases a batch and hands its messages to the workers or to `next`.
    fn deliver(self: &Arc<Self>, batch: Vec<ReceivedMessage>) {
        if batch.is_empty() {
            return;
        }
        let now = Instant::now();
        {
            let mut leases = self.leases.lock().unwrap();
            let first = Duration::from_secs(leases.initial_seconds.max(ACK_DEADLINE_SECONDS_MIN) as u64);
            let next_extension = now + first.mul_f64(LEASE_EXTEND_AT);
            for message in &batch {
                leases
                    .held
                    .insert(message.ack_id.clone(), Held { received: now, next_extension, extending: true });
            }
        }
        self.leases_changed.notify_all();
        add(&self.counters.received, batch.len());
        let items = batch.into_iter().map(|message| {
            let handle = AckHandle { inner: self.clone(), ack_id: message.ack_id.clone() };
            (message, handle)
        });
        match self.mode.get() {
            Some(Mode::Handler) => {
                self.work.lock().unwrap().items.extend(items);
                self.work_changed.notify_all();
            }
            _ => {
                let wakers: Vec<Waker> = {
                    let mut ready = self.ready.lock().unwrap();
                    ready.items.extend(items);
                    ready.wakers.drain().map(|(_, waker)| waker).collect()
                };
                wakers.into_iter().for_each(Waker::wake);
            }
        }
    }

    // ---- handlers ----

    /// One `ringpost-sub-work` thread.
    fn work(self: Arc<Self>, handler: Handler, _running: &Running) {
        loop {
            let item = {
                let mut work = self.work.lock().unwrap();
                loop {
                    if let Some(item) = work.items.pop_front() {
                        break Some(item);
                    }
                    if work.closed {
                        break None;
                    }
                    work = self.work_changed.wait(work).unwrap();
                }
            };
            let Some((message, handle)) = item else { return };
            IN_HANDLER.with(|flag| flag.set(true));
            // A panicking handler drops its handle while unwinding, which nacks the message.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| handler(message, handle)));
            IN_HANDLER.with(|flag| flag.set(false));
            if outcome.is_err() {
                add(&self.counters.handler_panics, 1);
            }
        }
    }

    // ---- settling ----

    fn settle(&self, ack_id: &str, settle: Settle) {
        {
            let mut leases = self.leases.lock().unwrap();
            let Some(held) = leases.held.remove(ack_id) else { return };
            if let Settle::Ack = settle {
                leases.histogram.record(held.received.elapsed());
            }
        }
        let pending = match settle {
            Settle::Ack => {
                add(&self.counters.acked, 1);
                Pending::Ack
            }
            Settle::Nack => {
                add(&self.counters.nacked, 1);
                Pending::Nack
            }
        };
        self.push_ack(pending, ack_id.to_owned());
    }

    /// Ids per acknowledge request: a quarter of the flow-control window (`ACK_BATCH_IDS_MAX`).
    fn ack_batch_ids(&self) -> usize {
        match self.settings.max_outstanding_messages {
            0 => ACK_BATCH_IDS_MAX,
            window => usize::try_from(window / 4).unwrap_or(usize::MAX).clamp(1, ACK_BATCH_IDS_MAX),
        }
    }

    fn push_ack(&self, pending: Pending, ack_id: String) {
        let notify = {
            let mut queue = self.acks.lock().unwrap();
            match pending {
                Pending::Ack => queue.acks.push(ack_id),
                Pending::Nack => queue.nacks.push(ack_id),
                Pending::Modify(seconds) => queue.modifies.entry(seconds).or_default().push(ack_id),
            }
            queue.count += 1;
            queue.since.get_or_insert_with(Instant::now);
            queue.count == 1 || queue.count.is_multiple_of(self.ack_batch_ids())
        };
        if notify {
            self.acks_changed.notify_all();
        }
    }

    /// Nacks every message held, wherever it is.
    fn nack_all_held(&self) {
        let held: Vec<String> = self.leases.lock().unwrap().held.drain().map(|(ack_id, _)| ack_id).collect();
        add(&self.counters.nacked, held.len());
        for ack_id in held {
            self.push_ack(Pending::Nack, ack_id);
        }
    }

    /// A `ringpost-sub-ack` thread: sends acks, nacks and deadline changes in batches, and
    /// everything left once stopped.
    fn send_acks(self: Arc<Self>, _running: &Running) {
        let batch_ids = self.ack_batch_ids();
        loop {
            let batch = {
                let mut queue = self.acks.lock().unwrap();
                loop {
                    let now = Instant::now();
                    match queue.since {
                        None if queue.stop => return,
                        None => queue = self.acks_changed.wait(queue).unwrap(),
                        Some(since) => {
                            let due = since + ACK_FLUSH_INTERVAL;
                            if queue.stop || queue.count >= batch_ids || now >= due {
                                let batch = queue.take(batch_ids);
                                if queue.count > 0 {
                                    // More is due: another sender takes it.
                                    self.acks_changed.notify_one();
                                }
                                break batch;
                            }
                            queue = self.acks_changed.wait_timeout(queue, due - now).unwrap().0;
                        }
                    }
                }
            };
            for chunk in batch.acks.chunks(ACK_BATCH_IDS_MAX) {
                let request = self.client.acknowledge(&self.subscription, chunk.to_vec());
                self.count_outcome(chunk.len(), block_on(request));
            }
            for chunk in batch.nacks.chunks(ACK_BATCH_IDS_MAX) {
                self.count_outcome(
                    chunk.len(),
                    block_on(self.client.nack(&self.subscription, chunk.to_vec())),
                );
            }
            for (seconds, ack_ids) in &batch.modifies {
                for chunk in ack_ids.chunks(ACK_BATCH_IDS_MAX) {
                    let request =
                        self.client.modify_ack_deadline(&self.subscription, chunk.to_vec(), *seconds);
                    self.count_outcome(chunk.len(), block_on(request));
                }
            }
        }
    }

    fn count_outcome(&self, ids: usize, outcome: Result<Vec<crate::InvalidAckId>>) {
        match outcome {
            Ok(refused) => add(&self.counters.refused, refused.len()),
            Err(_) => add(&self.counters.failed, ids),
        }
    }

    // ---- leases ----

    /// The `ringpost-sub-lease` thread: extends the leases that are due.
    fn extend_leases(self: Arc<Self>, _running: &Running) {
        let max_lease = self.settings.max_lease_duration;
        loop {
            let groups: BTreeMap<u32, Vec<String>> = {
                let mut leases = self.leases.lock().unwrap();
                let now = loop {
                    if leases.stop {
                        return;
                    }
                    let now = Instant::now();
                    let earliest = leases
                        .held
                        .values()
                        .filter(|held| held.extending)
                        .map(|held| held.next_extension)
                        .min();
                    leases = match earliest {
                        None => self.leases_changed.wait(leases).unwrap(),
                        Some(earliest) if earliest > now => {
                            self.leases_changed.wait_timeout(leases, earliest - now).unwrap().0
                        }
                        Some(_) => break now,
                    };
                };
                let extension = leases.extension_seconds().max(LEASE_EXTENSION_SECONDS_MIN);
                let horizon = now + LEASE_GROUPING;
                let mut groups: BTreeMap<u32, Vec<String>> = BTreeMap::new();
                let mut expired = 0;
                for (ack_id, held) in leases.held.iter_mut() {
                    if !held.extending || held.next_extension > horizon {
                        continue;
                    }
                    let remaining = max_lease.saturating_sub(now - held.received);
                    if remaining.is_zero() {
                        held.extending = false;
                        expired += 1;
                        continue;
                    }
                    let seconds = extension.min(remaining.as_secs_f64().ceil() as u32).max(1);
                    held.next_extension = now + Duration::from_secs(seconds as u64).mul_f64(LEASE_EXTEND_AT);
                    groups.entry(seconds).or_default().push(ack_id.clone());
                }
                add(&self.counters.lease_expired, expired);
                groups
            };
            for (seconds, ack_ids) in groups {
                for chunk in ack_ids.chunks(ACK_BATCH_IDS_MAX) {
                    let request =
                        self.client.modify_ack_deadline(&self.subscription, chunk.to_vec(), seconds);
                    let outcome = block_on(request);
                    if outcome.is_ok() {
                        add(&self.counters.extended, chunk.len());
                    }
                    self.count_outcome(chunk.len(), outcome);
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Puller,
    Worker,
    Leaser,
    Acker,
}

/// Counts one thread of a kind as running, from before it starts until it ends (panics
/// included), so `shutdown` can wait for it.
struct Running {
    inner: Arc<Inner>,
    kind: Kind,
}

impl Running {
    fn enter(inner: &Arc<Inner>, kind: Kind) -> Running {
        inner.count(kind).fetch_add(1, Ordering::AcqRel);
        Running { inner: inner.clone(), kind }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let left = self.inner.count(self.kind).fetch_sub(1, Ordering::AcqRel) - 1;
        // The last puller out closes `next`: nothing more can arrive.
        if left == 0 && self.kind == Kind::Puller {
            let wakers: Vec<Waker> = {
                let mut ready = self.inner.ready.lock().unwrap();
                ready.closed = true;
                ready.wakers.drain().map(|(_, waker)| waker).collect()
            };
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

impl Leases {
    /// The extension to send: the p99 of processing times clamped to 10-600 s, or the streams'
    /// deadline before the first ack.
    fn extension_seconds(&self) -> u32 {
        match self.histogram.percentile(LEASE_PERCENTILE) {
            Some(seconds) => seconds.clamp(LEASE_EXTENSION_SECONDS_MIN, LEASE_EXTENSION_SECONDS_MAX),
            None => self.initial_seconds,
        }
    }
}

/// The shutdown sequence (see the module docs).
async fn shut_down(inner: &Arc<Inner>, mode: ShutdownMode) {
    inner.stop.fire();
    wait_until(|| inner.pullers.load(Ordering::Acquire) == 0).await;
    match inner.mode.get() {
        Some(Mode::Handler) => {
            if mode == ShutdownMode::NackImmediately {
                let queued = std::mem::take(&mut inner.work.lock().unwrap().items);
                drop(queued);
                inner.nack_all_held();
            }
            inner.work.lock().unwrap().closed = true;
            inner.work_changed.notify_all();
            wait_until(|| inner.workers.load(Ordering::Acquire) == 0).await;
        }
        _ => {
            // Messages never handed out go back at once, in either mode.
            let queued = std::mem::take(&mut inner.ready.lock().unwrap().items);
            drop(queued);
        }
    }
    match mode {
        ShutdownMode::NackImmediately => inner.nack_all_held(),
        ShutdownMode::WaitForProcessing => wait_until(|| inner.leases.lock().unwrap().held.is_empty()).await,
    }
    inner.leases.lock().unwrap().stop = true;
    inner.leases_changed.notify_all();
    wait_until(|| inner.leasers.load(Ordering::Acquire) == 0).await;
    inner.acks.lock().unwrap().stop = true;
    inner.acks_changed.notify_all();
    wait_until(|| inner.ackers.load(Ordering::Acquire) == 0).await;
    let parked = std::mem::take(&mut inner.life.lock().unwrap().parked);
    drop(parked);
    inner.life.lock().unwrap().phase = Phase::Done;
}

async fn wait_until(mut done: impl FnMut() -> bool) {
    while !done() {
        timer::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
}

/// Runs `future` until it finishes (`Some`) or `signal` fires (`None`).
async fn until<F: Future>(signal: &Signal, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut stopped = pin!(signal.wait());
    std::future::poll_fn(|context| {
        if stopped.as_mut().poll(context).is_ready() {
            return Poll::Ready(None);
        }
        future.as_mut().poll(context).map(Some)
    })
    .await
}

/// A one-shot event that futures can wait for.
#[derive(Default)]
struct Signal {
    fired: AtomicBool,
    wakers: Mutex<HashMap<u64, Waker>>,
}

impl Signal {
    fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        let wakers: Vec<Waker> = self.wakers.lock().unwrap().drain().map(|(_, waker)| waker).collect();
        wakers.into_iter().for_each(Waker::wake);
    }

    fn is_fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    fn wait(&self) -> SignalWait<'_> {
        SignalWait { signal: self, id: NEXT_WAITER_ID.fetch_add(1, Ordering::Relaxed) }
    }
}

struct SignalWait<'a> {
    signal: &'a Signal,
    id: u64,
}

impl Future for SignalWait<'_> {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, context: &mut std::task::Context<'_>) -> Poll<()> {
        if self.signal.is_fired() {
            return Poll::Ready(());
        }
        self.signal.wakers.lock().unwrap().insert(self.id, context.waker().clone());
        // `fire` sets the flag before it takes the wakers: look again after registering.
        if self.signal.is_fired() {
            self.signal.wakers.lock().unwrap().remove(&self.id);
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for SignalWait<'_> {
    fn drop(&mut self) {
        self.signal.wakers.lock().unwrap().remove(&self.id);
    }
}

/// Processing times (receipt to ack) in whole seconds, 0 to `LEASE_EXTENSION_SECONDS_MAX`:
/// python-pubsub's histogram.
struct Histogram {
    buckets: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { buckets: vec![0; LEASE_EXTENSION_SECONDS_MAX as usize + 1], total: 0 }
    }
}

impl Histogram {
    fn record(&mut self, elapsed: Duration) {
        let seconds = (elapsed.as_secs_f64().ceil() as usize).min(self.buckets.len() - 1);
        self.buckets[seconds] += 1;
        self.total += 1;
    }

    /// The smallest value at or above `percent` of the samples; `None` without samples.
    fn percentile(&self, percent: f64) -> Option<u32> {
        if self.total == 0 {
            return None;
        }
        let target = ((self.total as f64 * percent / 100.0).ceil() as u64).max(1);
        let mut seen = 0;
        for (seconds, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= target {
                return Some(seconds as u32);
            }
        }
        Some(LEASE_EXTENSION_SECONDS_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringpost_wire::ErrorCode;

    /// Compiles only if the subscriber, its handles and its futures can move between threads.
    #[allow(dead_code)]
    fn futures_are_send(subscriber: &Subscriber, handle: AckHandle) {
        fn send<T: Send + Sync>(_: &T) {}
        fn send_future<T: Send>(_: T) {}
        send(subscriber);
        send_future(handle);
        send_future(subscriber.next());
        send_future(subscriber.stopped());
        send_future(subscriber.shutdown(ShutdownMode::WaitForProcessing));
    }

    #[test]
    fn the_ack_queue_gives_out_at_most_a_batch_acks_first() {
        let ids = |prefix: &str, count: usize| (0..count).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>();
        let mut queue = AckQueue {
            acks: ids("a", 3),
            nacks: ids("n", 2),
            modifies: BTreeMap::from([(30, ids("m", 2)), (60, ids("l", 2))]),
            count: 9,
            since: Some(Instant::now()),
            stop: false,
        };
        let first = queue.take(4);
        assert_eq!((first.acks.len(), first.nacks.len(), first.count), (3, 1, 4));
        assert_eq!((queue.count, queue.since.is_some()), (5, true), "the rest stays due");
        let second = queue.take(4);
        assert_eq!(second.nacks.len(), 1);
        assert_eq!(second.modifies.get(&60).map(Vec::len), Some(2), "the longest extension first");
        assert_eq!(second.modifies.get(&30).map(Vec::len), Some(1));
        let last = queue.take(4);
        assert_eq!((last.count, queue.count, queue.since), (1, 0, None));
        assert!(queue.modifies.is_empty() && queue.acks.is_empty() && queue.nacks.is_empty());
    }

    #[test]
    fn the_histogram_gives_the_99th_percentile() {
        let mut histogram = Histogram::default();
        assert_eq!(histogram.percentile(99.0), None);
        for _ in 0..99 {
            histogram.record(Duration::from_millis(1500));
        }
        histogram.record(Duration::from_secs(45));
        assert_eq!(histogram.percentile(99.0), Some(2));
        histogram.record(Duration::from_secs(45));
        assert_eq!(histogram.percentile(99.0), Some(45));
        histogram.record(Duration::from_secs(100_000));
        assert_eq!(histogram.percentile(100.0), Some(LEASE_EXTENSION_SECONDS_MAX));
    }

    #[test]
    fn the_extension_is_clamped_and_starts_at_the_stream_deadline() {
        let mut leases = Leases {
            held: HashMap::new(),
            histogram: Histogram::default(),
            initial_seconds: 30,
            stop: false,
        };
        assert_eq!(leases.extension_seconds(), 30);
        leases.histogram.record(Duration::from_secs(1));
        assert_eq!(leases.extension_seconds(), LEASE_EXTENSION_SECONDS_MIN);
        for _ in 0..10 {
            leases.histogram.record(Duration::from_secs(5000));
        }
        assert_eq!(leases.extension_seconds(), LEASE_EXTENSION_SECONDS_MAX);
    }

    #[test]
    fn flow_control_is_split_between_streams_and_sources() {
        let settings = SubscriberSettings { parallel_streams: 3, ..SubscriberSettings::default() };
        let stream = settings.stream_settings(1);
        assert_eq!(stream.max_outstanding_messages, 333);
        assert_eq!(stream.max_outstanding_bytes, MAX_OUTSTANDING_BYTES_DEFAULT / 3);
        let over_two = settings.stream_settings(2);
        assert_eq!(over_two.max_outstanding_messages, 166, "six streams: three on each of two sources");
        let unlimited = SubscriberSettings { max_outstanding_messages: 0, parallel_streams: 2, ..settings };
        assert_eq!(unlimited.stream_settings(2).max_outstanding_messages, 0);
        let tiny = SubscriberSettings { max_outstanding_messages: 1, parallel_streams: 4, ..unlimited };
        assert_eq!(tiny.stream_settings(1).max_outstanding_messages, 1);
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        assert!(SubscriberSettings::default().validate().is_ok());
        for bad in [
            SubscriberSettings { parallel_streams: 0, ..SubscriberSettings::default() },
            SubscriberSettings { workers: 0, ..SubscriberSettings::default() },
            SubscriberSettings { stream_ack_deadline_seconds: 5, ..SubscriberSettings::default() },
            SubscriberSettings { stream_ack_deadline_seconds: 601, ..SubscriberSettings::default() },
        ] {
            assert_eq!(bad.validate().unwrap_err().code(), ErrorCode::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn a_signal_wakes_its_waiters_and_forgets_dropped_ones() {
        let signal = Arc::new(Signal::default());
        let waker = Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let mut dropped = Box::pin(signal.wait());
        assert!(dropped.as_mut().poll(&mut context).is_pending());
        drop(dropped);
        assert!(signal.wakers.lock().unwrap().is_empty());
        let firing = signal.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            firing.fire();
        });
        block_on(signal.wait());
        thread.join().unwrap();
        assert_eq!(block_on(until(&signal, std::future::pending::<()>())), None);
    }
}
