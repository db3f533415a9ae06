//! The high-level publisher: batching, flow control and ordering keys over [`Client::publish`],
//! with the defaults and behaviour of Google Cloud Pub/Sub's client libraries.
//!
//! ```no_run
//! use ringpost_client::{block_on, Client, Message, Publisher, PublisherSettings};
//! use std::sync::Arc;
//! let client = Arc::new(block_on(Client::connect("127.0.0.1:7450")).unwrap());
//! let publisher = Publisher::new(client, "orders", PublisherSettings::default()).unwrap();
//! let pending: Vec<_> = (0..10).map(|i| publisher.publish(Message::new(format!("order {i}")))).collect();
//! for future in pending {
//!     println!("published as {}", block_on(future).unwrap());
//! }
//! block_on(publisher.shutdown());
//! ```
//!
//! # Batching
//!
//! [`Publisher::publish`] puts the message in the open batch of its ordering key and returns a
//! [`PublishFuture`] at once. A batch goes out as one publish request when any of its limits is
//! reached: [`BatchSettings::max_messages`] (default 100), [`BatchSettings::max_bytes`] (default
//! 1 MB, counted like the server counts a message: data, attribute keys and values, ordering
//! key) or [`BatchSettings::max_delay`] after its first message (default 10 ms), which are
//! Python's, Go's and C++'s defaults. Up to [`PublisherSettings::batches_in_flight_max`] batches
//! (default 16) are in flight at once; the next ones wait in the publisher.
//!
//! # Flow control
//!
//! At most [`PublishFlowControl::max_outstanding_messages`] (default 1000) messages and
//! [`PublishFlowControl::max_outstanding_bytes`] (default 10 MB) are *outstanding*: published and
//! not yet answered by the server. When a message does not fit,
//! [`LimitExceededBehavior::Block`] (the default) lets its future wait, first in first out,
//! until enough outstanding messages are answered; [`LimitExceededBehavior::Error`] fails it at
//! once with `ResourceExhausted`. A message that could never fit (larger than the byte window,
//! or than the protocol's `MESSAGE_BYTES_MAX`) and any other message the server would refuse
//! fail at once with `InvalidArgument`, instead of blocking forever (java-pubsub#685).
//!
//! A blocked message waits inside the publisher on behalf of its future, like the value of a
//! bounded channel's `send`: it is admitted as soon as there is room, whether or not the future
//! is being polled, but **dropping a future whose message is still waiting for room cancels
//! that message**. Once admitted, a message is published whether its future is kept or not.
//! This keeps memory bounded by what the application holds.
//!
//! # Ordering keys
//!
//! Messages with the same non-empty ordering key go in batches of that key only, and one batch
//! per key is in flight at a time, so the server stores them in publish order. When a publish
//! of a key fails (after the client's retries) or a message of the key is refused at once, the
//! key is *paused*: the queued messages of the key and every later publish with it fail at once
//! with `FailedPrecondition`, until [`Publisher::resume_publish`]. Other keys carry on.
//!
//! # Threading model
//!
//! Each publisher starts exactly one thread, `ringpost-publisher`, which seals batches on their
//! deadline, sends them and drives their request futures (it is a tiny executor for at most
//! `batches_in_flight_max` futures, woken by their wakers and by `publish`). `publish` itself
//! only takes a lock and queues. The futures this module returns ([`PublishFuture`],
//! [`Publisher::flush`], [`Publisher::shutdown`]) are woken through their wakers from that
//! thread, so they run on any executor. The thread ends after [`Publisher::shutdown`], or, when
//! the publisher is dropped, once every admitted message has its outcome.

use crate::{Client, Error, Message, Result};
use ringpost_wire::limits::{MESSAGE_BYTES_MAX, PUBLISH_BATCH_MESSAGES_MAX, PUBLISH_REQUEST_BYTES_MAX};
use ringpost_wire::Status;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Messages per batch (Python, Go, C++: 100).
pub const BATCH_MESSAGES_DEFAULT: usize = 100;
/// Bytes per batch (Python and Go: 1 MB).
pub const BATCH_BYTES_DEFAULT: usize = 1_000_000;
/// Longest a batch waits for more messages after its first (Python, Go, C++: 10 ms).
pub const BATCH_DELAY_DEFAULT: Duration = Duration::from_millis(10);
/// Longest `max_delay` accepted: beyond it a message would sit in the client for no reason.
pub const BATCH_DELAY_MAX: Duration = Duration::from_secs(60);
/// Publish requests in flight at once per publisher.
pub const BATCHES_IN_FLIGHT_DEFAULT: usize = 16;
pub const BATCHES_IN_FLIGHT_MAX: usize = 1024;
/// Messages published and not yet answered (Python's publisher flow control: 1000).
pub const OUTSTANDING_MESSAGES_DEFAULT: usize = 1000;
/// Bytes published and not yet answered (Python's publisher flow control: 10 MB).
pub const OUTSTANDING_BYTES_DEFAULT: usize = 10_000_000;

const _: () = assert!(BATCH_MESSAGES_DEFAULT <= PUBLISH_BATCH_MESSAGES_MAX);
const _: () = assert!(BATCH_BYTES_DEFAULT <= PUBLISH_REQUEST_BYTES_MAX);
const _: () = assert!(BATCHES_IN_FLIGHT_DEFAULT <= BATCHES_IN_FLIGHT_MAX);
const _: () = assert!(BATCH_DELAY_DEFAULT.as_nanos() <= BATCH_DELAY_MAX.as_nanos());
const _: () =
    assert!(MESSAGE_BYTES_MAX <= OUTSTANDING_BYTES_DEFAULT, "a legal message fits the default window");

/// When a batch is sent: as soon as any limit is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// 1 to `PUBLISH_BATCH_MESSAGES_MAX` (default 100).
    pub max_messages: usize,
    /// 1 to `PUBLISH_REQUEST_BYTES_MAX` (default 1 MB). A message larger than this goes alone.
    pub max_bytes: usize,
    /// Up to `BATCH_DELAY_MAX` (default 10 ms); zero sends every message on its own at once.
    pub max_delay: Duration,
}

impl Default for BatchSettings {
    fn default() -> BatchSettings {
        BatchSettings {
            max_messages: BATCH_MESSAGES_DEFAULT,
            max_bytes: BATCH_BYTES_DEFAULT,
            max_delay: BATCH_DELAY_DEFAULT,
        }
    }
}

/// What `publish` does when the flow-control window is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitExceededBehavior {
    /// The message waits (in its future) until there is room.
    #[default]
    Block,
    /// The publish fails at once with `ResourceExhausted`.
    Error,
}

/// Limits on messages published and not yet answered by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishFlowControl {
    /// 0: no limit (default 1000).
    pub max_outstanding_messages: usize,
    /// 0: no limit (default 10 MB). A larger message is refused at once.
    pub max_outstanding_bytes: usize,
    pub limit_exceeded_behavior: LimitExceededBehavior,
}

impl Default for PublishFlowControl {
    fn default() -> PublishFlowControl {
        PublishFlowControl {
            max_outstanding_messages: OUTSTANDING_MESSAGES_DEFAULT,
            max_outstanding_bytes: OUTSTANDING_BYTES_DEFAULT,
            limit_exceeded_behavior: LimitExceededBehavior::Block,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublisherSettings {
    pub batch: BatchSettings,
    pub flow_control: PublishFlowControl,
    /// Publish requests in flight at once, 1 to `BATCHES_IN_FLIGHT_MAX` (default 16). A key
    /// with ordering never has more than one.
    pub batches_in_flight_max: usize,
}

impl Default for PublisherSettings {
    fn default() -> PublisherSettings {
        PublisherSettings {
            batch: BatchSettings::default(),
            flow_control: PublishFlowControl::default(),
            batches_in_flight_max: BATCHES_IN_FLIGHT_DEFAULT,
        }
    }
}

impl PublisherSettings {
    /// `InvalidArgument` naming the first setting out of range.
    pub fn validate(&self) -> Result<()> {
        let refuse = |message: String| Err(Error::Status(Status::invalid_argument(message)));
        if !(1..=PUBLISH_BATCH_MESSAGES_MAX).contains(&self.batch.max_messages) {
            return refuse(format!(
                "batch.max_messages is {}; it must be 1 to {PUBLISH_BATCH_MESSAGES_MAX} (PUBLISH_BATCH_MESSAGES_MAX)",
                self.batch.max_messages
            ));
        }
        if !(1..=PUBLISH_REQUEST_BYTES_MAX).contains(&self.batch.max_bytes) {
            return refuse(format!(
                "batch.max_bytes is {}; it must be 1 to {PUBLISH_REQUEST_BYTES_MAX} (PUBLISH_REQUEST_BYTES_MAX)",
                self.batch.max_bytes
            ));
        }
        if self.batch.max_delay > BATCH_DELAY_MAX {
            return refuse(format!(
                "batch.max_delay is {:?}; it must be at most {BATCH_DELAY_MAX:?} (BATCH_DELAY_MAX)",
                self.batch.max_delay
            ));
        }
        if !(1..=BATCHES_IN_FLIGHT_MAX).contains(&self.batches_in_flight_max) {
            return refuse(format!(
                "batches_in_flight_max is {}; it must be 1 to {BATCHES_IN_FLIGHT_MAX} (BATCHES_IN_FLIGHT_MAX)",
                self.batches_in_flight_max
            ));
        }
        Ok(())
    }
}

/// Publishes to one topic in batches. See the module docs.
pub struct Publisher {
    shared: Arc<Shared>,
}

struct Shared {
    client: Arc<Client>,
    topic: String,
    settings: PublisherSettings,
    state: Mutex<State>,
    /// Wakes the publisher thread; set right after it started.
    wake: OnceLock<Arc<ThreadWake>>,
}

impl Shared {
    fn wake_thread(&self) {
        if let Some(wake) = self.wake.get() {
            wake.clone().wake();
        }
    }
}

impl Publisher {
    /// A publisher of `topic` over `client`; starts its thread. `InvalidArgument` if the
    /// settings are out of range. The topic is not checked here: publishing to a missing topic
    /// fails each publish with `NotFound`.
    pub fn new(
        client: Arc<Client>,
        topic: impl Into<String>,
        settings: PublisherSettings,
    ) -> Result<Publisher> {
        settings.validate()?;
        let shared = Arc::new(Shared {
            client,
            topic: topic.into(),
            settings,
            state: Mutex::new(State::default()),
            wake: OnceLock::new(),
        });
        let running = shared.clone();
        let handle = std::thread::Builder::new()
            .name("ringpost-publisher".into())
            .spawn(move || {
                // Wait for the wake handle `new` sets right after the spawn.
                let wake = loop {
                    if let Some(wake) = running.wake.get() {
                        break wake.clone();
                    }
                    std::thread::park();
                };
                run_batcher(&running, wake)
            })
            .map_err(Error::Io)?;
        let wake = Arc::new(ThreadWake { thread: handle.thread().clone(), woken: AtomicBool::new(false) });
        let _ = shared.wake.set(wake);
        handle.thread().unpark();
        Ok(Publisher { shared })
    }

    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    pub fn settings(&self) -> &PublisherSettings {
        &self.shared.settings
    }

    /// Queues a message for publishing and returns the future of its id. The message is in a
    /// batch when this returns, unless the flow-control window is full (see the module docs).
    pub fn publish(&self, message: Message) -> PublishFuture {
        let shared = &self.shared;
        let settings = &shared.settings;
        let key = message.0.ordering_key.clone();
        let mut state = shared.state.lock().unwrap();
        if state.closing {
            return PublishFuture::failed(Error::Status(Status::failed_precondition(format!(
                "the publisher of topic '{}' is shut down",
                shared.topic
            ))));
        }
        if let Some(paused) = state.paused_error(&key) {
            return PublishFuture::failed(paused);
        }
        let size = match message_size(&message) {
            Ok(size) => size,
            Err(error) => return PublishFuture::failed(state.refuse(&key, error)),
        };
        let window = settings.flow_control.max_outstanding_bytes;
        if window != 0 && size > window {
            let error = Error::Status(Status::invalid_argument(format!(
                "the message is {size} bytes, more than the publisher's flow-control window of {window} bytes \
                 (max_outstanding_bytes): it could never be published"
            )));
            return PublishFuture::failed(state.refuse(&key, error));
        }
        let fits = state.waiters.is_empty() && state.fits(&settings.flow_control, size);
        if !fits && settings.flow_control.limit_exceeded_behavior == LimitExceededBehavior::Error {
            let flow = &settings.flow_control;
            let error = Error::Status(Status::resource_exhausted(format!(
                "{} messages and {} bytes are outstanding; the publisher's flow control allows {} and {} \
                 (0: no limit)",
                state.outstanding_messages,
                state.outstanding_bytes,
                flow.max_outstanding_messages,
                flow.max_outstanding_bytes
            )));
            return PublishFuture::failed(state.refuse(&key, error));
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.outstanding.insert(seq);
        let slot = Arc::new(Slot::default());
        let item = Item { seq, size, message, slot: slot.clone() };
        if fits {
            state.reserve(size);
            let wake = state.enqueue(&settings.batch, Instant::now(), key, item);
            drop(state);
            if wake {
                shared.wake_thread();
            }
            PublishFuture { slot: Some(slot), waiting: None, failed: None }
        } else {
            state.waiters.push_back((key, item));
            PublishFuture { slot: Some(slot), waiting: Some((shared.clone(), seq)), failed: None }
        }
    }

    /// Resumes publishing with an ordering key paused after a failure. Does nothing for a key
    /// that is not paused.
    pub fn resume_publish(&self, ordering_key: &str) {
        let mut state = self.shared.state.lock().unwrap();
        if let Some(queue) = state.keys.get_mut(ordering_key) {
            queue.paused = None;
        }
        state.tidy_key(ordering_key);
    }

    /// Whether publishing with `ordering_key` is paused after a failure.
    pub fn is_paused(&self, ordering_key: &str) -> bool {
        self.shared.state.lock().unwrap().paused_error(ordering_key).is_some()
    }

    /// Sends every batch now, and resolves once every message published before the call has
    /// its outcome (messages waiting for flow-control room included).
    pub async fn flush(&self) {
        let target = {
            let mut state = self.shared.state.lock().unwrap();
            state.flushes += 1;
            state.next_seq
        };
        let _flushing = FlushGuard(&self.shared);
        self.shared.wake_thread();
        std::future::poll_fn(|context| {
            let mut state = self.shared.state.lock().unwrap();
            if state.outstanding.first().is_none_or(|first| *first >= target) {
                return Poll::Ready(());
            }
            state.watchers.push(context.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Refuses new publishes (`FailedPrecondition`), publishes everything already published,
    /// and stops the publisher thread; resolves once the thread has ended.
    pub async fn shutdown(&self) {
        self.shared.state.lock().unwrap().closing = true;
        self.flush().await;
        self.shared.wake_thread();
        std::future::poll_fn(|context| {
            let mut state = self.shared.state.lock().unwrap();
            if state.exited {
                return Poll::Ready(());
            }
            state.watchers.push(context.waker().clone());
            Poll::Pending
        })
        .await
    }
}

impl Drop for Publisher {
    /// The thread still publishes what was admitted, then ends.
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().closing = true;
        self.shared.wake_thread();
    }
}

/// Ends a flush's claim on "send every batch now", also when the flush is dropped early.
struct FlushGuard<'a>(&'a Shared);

impl Drop for FlushGuard<'_> {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().flushes -= 1;
    }
}

/// The accounted size of a message (as the server counts it), or why the server would refuse
/// it: checked here so that a bad message fails at once and never blocks or poisons a batch.
fn message_size(message: &Message) -> Result<usize> {
    let message = &message.0;
    ringpost_wire::validate::validate_message(
        0,
        &message.data,
        message.attributes.iter().map(|attribute| (attribute.key.as_str(), attribute.value.as_str())),
        &message.ordering_key,
    )
    .map_err(|mut status| {
        status.message = status.message.replacen("message 0 ", "the message ", 1);
        Error::Status(status)
    })
}

/// The outcome of one message, shared by its future and the publisher.
#[derive(Default)]
struct Slot {
    inner: Mutex<SlotInner>,
}

#[derive(Default)]
struct SlotInner {
    result: Option<Result<u64>>,
    waker: Option<Waker>,
}

impl Slot {
    fn resolve(&self, result: Result<u64>) {
        let waker = {
            let mut inner = self.inner.lock().unwrap();
            inner.result = Some(result);
            inner.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The id of one published message, or why it was not published.
#[must_use = "a message still waiting for flow-control room is cancelled when its future is dropped"]
pub struct PublishFuture {
    slot: Option<Arc<Slot>>,
    /// Set while the message may still wait for flow-control room: dropping the future then
    /// takes it out of the queue.
    waiting: Option<(Arc<Shared>, u64)>,
    failed: Option<Error>,
}

impl PublishFuture {
    fn failed(error: Error) -> PublishFuture {
        PublishFuture { slot: None, waiting: None, failed: Some(error) }
    }
}

impl Future for PublishFuture {
    type Output = Result<u64>;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Result<u64>> {
        if let Some(error) = self.failed.take() {
            self.slot = None;
            return Poll::Ready(Err(error));
        }
        let Some(slot) = &self.slot else {
            return Poll::Ready(Err(Error::Protocol("publish future polled after completion".into())));
        };
        let mut inner = slot.inner.lock().unwrap();
        match inner.result.take() {
            Some(result) => {
                drop(inner);
                self.slot = None;
                self.waiting = None;
                Poll::Ready(result)
            }
            None => {
                if !inner.waker.as_ref().is_some_and(|waker| waker.will_wake(context.waker())) {
                    inner.waker = Some(context.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for PublishFuture {
    fn drop(&mut self) {
        if let Some((shared, seq)) = self.waiting.take() {
            let mut state = shared.state.lock().unwrap();
            if let Some(at) = state.waiters.iter().position(|(_, item)| item.seq == seq) {
                state.waiters.remove(at);
                state.outstanding.remove(&seq);
                state.wake_watchers();
            }
        }
    }
}

/// One message on its way.
struct Item {
    /// Publish order, for `flush`.
    seq: u64,
    size: usize,
    message: Message,
    slot: Arc<Slot>,
}

/// Messages of one ordering key sent as one request.
struct Batch {
    items: Vec<Item>,
    bytes: usize,
    /// When it goes out even if not full.
    deadline: Instant,
    /// No more messages join it.
    sealed: bool,
}

#[derive(Default)]
struct KeyQueue {
    /// Oldest first; all but the last are sealed.
    batches: VecDeque<Batch>,
    in_flight: usize,
    /// Why the key is paused (ordering keys only).
    paused: Option<String>,
}

/// Everything the publisher thread and `publish` share, under one lock.
#[derive(Default)]
struct State {
    /// By ordering key; "" holds the messages without one.
    keys: HashMap<String, KeyQueue>,
    /// Messages waiting for flow-control room, first in first out, with their ordering key.
    waiters: VecDeque<(String, Item)>,
    outstanding_messages: usize,
    outstanding_bytes: usize,
    /// Sequence numbers of messages without an outcome yet (admitted or waiting).
    outstanding: BTreeSet<u64>,
    next_seq: u64,
    in_flight: usize,
    /// Flushes in progress: every batch is sent at once while there is one.
    flushes: usize,
    closing: bool,
    /// The publisher thread has ended.
    exited: bool,
    /// Futures of `flush` and `shutdown`, woken whenever a message gets its outcome.
    watchers: Vec<Waker>,
}

impl State {
    fn fits(&self, flow: &PublishFlowControl, size: usize) -> bool {
        (flow.max_outstanding_messages == 0 || self.outstanding_messages < flow.max_outstanding_messages)
            && (flow.max_outstanding_bytes == 0
                || self.outstanding_bytes + size <= flow.max_outstanding_bytes)
    }

    fn reserve(&mut self, size: usize) {
        self.outstanding_messages += 1;
        self.outstanding_bytes += size;
    }

    fn paused_error(&self, key: &str) -> Option<Error> {
        let reason = self.keys.get(key)?.paused.as_ref()?;
        Some(Error::Status(Status::failed_precondition(format!(
            "publishing with ordering key '{key}' is paused after a failed publish ({reason}); \
             call resume_publish to publish with it again"
        ))))
    }

    /// A message refused before it was queued: with an ordering key, the key pauses, since the
    /// messages after it would otherwise overtake it. The messages of the key published before
    /// it still go.
    fn refuse(&mut self, key: &str, error: Error) -> Error {
        if !key.is_empty() {
            self.keys.entry(key.to_owned()).or_default().paused.get_or_insert_with(|| error.to_string());
        }
        error
    }

    /// Puts a message in the open batch of its key, sealing and opening batches as limits are
    /// reached. Returns whether the publisher thread should look again (a new batch has a
    /// deadline to wait for, or a batch is ready).
    fn enqueue(&mut self, limits: &BatchSettings, now: Instant, key: String, item: Item) -> bool {
        let queue = self.keys.entry(key).or_default();
        let joins = queue.batches.back().is_some_and(|open| {
            !open.sealed
                && open.items.len() < limits.max_messages
                && open.bytes + item.size <= limits.max_bytes
        });
        let mut wake = false;
        if !joins {
            if let Some(open) = queue.batches.back_mut() {
                open.sealed = true;
            }
            queue.batches.push_back(Batch {
                items: Vec::new(),
                bytes: 0,
                deadline: now + limits.max_delay,
                sealed: false,
            });
            wake = true;
        }
        let open = queue.batches.back_mut().unwrap();
        open.bytes += item.size;
        open.items.push(item);
        if open.items.len() >= limits.max_messages || open.bytes >= limits.max_bytes {
            open.sealed = true;
            wake = true;
        }
        wake
    }

    /// Takes the batches to send now and returns them with the earliest deadline of those that
    /// wait for it.
    fn take_sendable(
        &mut self,
        settings: &PublisherSettings,
        now: Instant,
    ) -> (Vec<(String, Batch)>, Option<Instant>) {
        let urgent = self.flushes > 0 || self.closing;
        let mut sendable = Vec::new();
        let mut next_deadline: Option<Instant> = None;
        for (key, queue) in self.keys.iter_mut() {
            while let Some(front) = queue.batches.front() {
                if !(front.sealed || urgent || front.deadline <= now) {
                    next_deadline =
                        Some(next_deadline.map_or(front.deadline, |next| next.min(front.deadline)));
                    break;
                }
                // A completion wakes the thread when a request or the key's turn frees.
                if self.in_flight >= settings.batches_in_flight_max
                    || (!key.is_empty() && queue.in_flight > 0)
                {
                    break;
                }
                let batch = queue.batches.pop_front().unwrap();
                queue.in_flight += 1;
                self.in_flight += 1;
                sendable.push((key.clone(), batch));
            }
        }
        (sendable, next_deadline)
    }

    /// A request ended: resolves its messages, pauses the key on failure, frees the window and
    /// admits waiting messages.
    fn complete(
        &mut self,
        limits: &PublisherSettings,
        key: &str,
        items: Vec<Done>,
        result: Result<Vec<u64>>,
    ) {
        self.in_flight -= 1;
        if let Some(queue) = self.keys.get_mut(key) {
            queue.in_flight -= 1;
        }
        match result {
            Ok(ids) if ids.len() == items.len() => {
                for (done, id) in items.into_iter().zip(ids) {
                    self.finish(done, Ok(id));
                }
            }
            Ok(ids) => {
                let error =
                    Error::Protocol(format!("{} ids for a batch of {} messages", ids.len(), items.len()));
                self.fail_batch(key, items, error);
            }
            Err(error) => self.fail_batch(key, items, error),
        }
        self.admit(limits, Instant::now());
        self.tidy_key(key);
    }

    fn fail_batch(&mut self, key: &str, items: Vec<Done>, error: Error) {
        if !key.is_empty() {
            self.pause(key, &error);
        }
        for done in items {
            self.finish(done, Err(error.duplicate()));
        }
    }

    /// Pauses a key after a failed request: its queued and waiting messages, all published after
    /// the failed ones, fail with `FailedPrecondition`.
    fn pause(&mut self, key: &str, cause: &Error) {
        let queue = self.keys.entry(key.to_owned()).or_default();
        if queue.paused.is_none() {
            queue.paused = Some(cause.to_string());
        }
        let queued: Vec<Item> = queue.batches.drain(..).flat_map(|batch| batch.items).collect();
        let failed = self.paused_error(key).expect("just paused");
        for item in queued {
            self.finish(Done { seq: item.seq, size: item.size, slot: item.slot }, Err(failed.duplicate()));
        }
        let (waiting, others): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut self.waiters).into_iter().partition(|(waiter_key, _)| waiter_key == key);
        self.waiters = others;
        for (_, item) in waiting {
            // Never admitted, so nothing to give back to the window.
            self.outstanding.remove(&item.seq);
            item.slot.resolve(Err(failed.duplicate()));
        }
        self.wake_watchers();
    }

    /// A message has its outcome: its future resolves and its place in the window frees.
    fn finish(&mut self, done: Done, result: Result<u64>) {
        self.outstanding_messages -= 1;
        self.outstanding_bytes -= done.size;
        self.outstanding.remove(&done.seq);
        done.slot.resolve(result);
        self.wake_watchers();
    }

    /// Moves waiting messages into batches while the window has room, first in first out.
    fn admit(&mut self, limits: &PublisherSettings, now: Instant) {
        while let Some((_, front)) = self.waiters.front() {
            if !self.fits(&limits.flow_control, front.size) {
                break;
            }
            let (key, item) = self.waiters.pop_front().unwrap();
            self.reserve(item.size);
            self.enqueue(&limits.batch, now, key, item);
        }
    }

    fn tidy_key(&mut self, key: &str) {
        if self
            .keys
            .get(key)
            .is_some_and(|queue| queue.batches.is_empty() && queue.in_flight == 0 && queue.paused.is_none())
        {
            self.keys.remove(key);
        }
    }

    fn wake_watchers(&mut self) {
        for waker in self.watchers.drain(..) {
            waker.wake();
        }
    }

    /// Closing, and nothing left to send or wait for.
    fn finished(&self) -> bool {
        self.closing
            && self.in_flight == 0
            && self.waiters.is_empty()
            && self.keys.values().all(|queue| queue.batches.is_empty())
    }
}

/// What remains of a sent message: enough to resolve it and free its place in the window.
struct Done {
    seq: u64,
    size: usize,
    slot: Arc<Slot>,
}

type RequestFuture = Pin<Box<dyn Future<Output = Result<Vec<u64>>> + Send>>;

struct InFlight {
    key: String,
    items: Vec<Done>,
    request: RequestFuture,
}

/// Wakes the publisher thread: from request futures' wakers and from `publish`.
struct ThreadWake {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for ThreadWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// The publisher thread: sends batches when they are due and drives their requests.
fn run_batcher(shared: &Shared, wake: Arc<ThreadWake>) {
    let waker = Waker::from(wake.clone());
    let mut context = Context::from_waker(&waker);
    let mut in_flight: Vec<InFlight> = Vec::new();
    loop {
        wake.woken.store(false, Ordering::Release);
        let (sendable, next_deadline) = {
            let mut state = shared.state.lock().unwrap();
            if in_flight.is_empty() && state.finished() {
                state.exited = true;
                state.wake_watchers();
                return;
            }
            state.take_sendable(&shared.settings, Instant::now())
        };
        let started = !sendable.is_empty();
        for (key, batch) in sendable {
            let mut messages = Vec::with_capacity(batch.items.len());
            let mut items = Vec::with_capacity(batch.items.len());
            for item in batch.items {
                messages.push(item.message);
                items.push(Done { seq: item.seq, size: item.size, slot: item.slot });
            }
            let (client, topic) = (shared.client.clone(), shared.topic.clone());
            let request: RequestFuture = Box::pin(async move { client.publish(&topic, messages).await });
            in_flight.push(InFlight { key, items, request });
        }
        let mut completed = Vec::new();
        in_flight.retain_mut(|flight| match flight.request.as_mut().poll(&mut context) {
            Poll::Ready(result) => {
                completed.push((std::mem::take(&mut flight.key), std::mem::take(&mut flight.items), result));
                false
            }
            Poll::Pending => true,
        });
        if !completed.is_empty() {
            let mut state = shared.state.lock().unwrap();
            for (key, items, result) in completed.drain(..) {
                state.complete(&shared.settings, &key, items, result);
            }
            continue;
        }
        if started || wake.woken.load(Ordering::Acquire) {
            continue;
        }
        match next_deadline {
            Some(deadline) => std::thread::park_timeout(deadline.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringpost_wire::ErrorCode;

    fn item(seq: u64, size: usize, key: &str) -> Item {
        Item { seq, size, message: Message::new(vec![b'x'; size]).ordering_key(key), slot: Arc::default() }
    }

    fn settings(max_messages: usize, max_bytes: usize, max_delay: Duration) -> PublisherSettings {
        PublisherSettings {
            batch: BatchSettings { max_messages, max_bytes, max_delay },
            ..PublisherSettings::default()
        }
    }

    fn enqueue_all(state: &mut State, settings: &PublisherSettings, now: Instant, items: Vec<(&str, Item)>) {
        for (key, item) in items {
            state.reserve(item.size);
            state.outstanding.insert(item.seq);
            state.enqueue(&settings.batch, now, key.to_owned(), item);
        }
    }

    fn sizes(batches: &[(String, Batch)]) -> Vec<usize> {
        batches.iter().map(|(_, batch)| batch.items.len()).collect()
    }

    /// Compiles only if the publisher and its futures can move between threads.
    #[allow(dead_code)]
    fn futures_are_send(publisher: &Publisher) {
        fn send<T: Send>(_: T) {}
        fn shared<T: Send + Sync>(_: &T) {}
        shared(publisher);
        send(publisher.publish(Message::new("m")));
        send(publisher.flush());
        send(publisher.shutdown());
    }

    #[test]
    fn a_batch_is_sealed_by_count_and_by_bytes() {
        let settings = settings(3, 100, Duration::from_secs(60));
        let mut state = State::default();
        let now = Instant::now();
        enqueue_all(&mut state, &settings, now, (0..7).map(|i| ("", item(i, 10, ""))).collect());
        let (sendable, next) = state.take_sendable(&settings, now);
        assert_eq!(sizes(&sendable), vec![3, 3]);
        assert_eq!(next, Some(now + Duration::from_secs(60)));

        let mut state = State::default();
        enqueue_all(&mut state, &settings, now, (0..5).map(|i| ("", item(i, 40, ""))).collect());
        let (sendable, _) = state.take_sendable(&settings, now);
        assert_eq!(sizes(&sendable), vec![2, 2], "40 + 40 fits 100, a third would not");
    }

    #[test]
    fn an_open_batch_goes_at_its_deadline_or_on_flush() {
        let settings = settings(100, 1000, Duration::from_millis(10));
        let mut state = State::default();
        let now = Instant::now();
        enqueue_all(&mut state, &settings, now, vec![("", item(0, 1, ""))]);
        assert!(state.take_sendable(&settings, now).0.is_empty());
        assert_eq!(sizes(&state.take_sendable(&settings, now + Duration::from_millis(10)).0), vec![1]);

        enqueue_all(&mut state, &settings, now, vec![("", item(1, 1, ""))]);
        state.flushes = 1;
        assert_eq!(sizes(&state.take_sendable(&settings, now).0), vec![1]);
    }

    #[test]
    fn one_batch_per_ordering_key_is_in_flight() {
        let settings = settings(2, 1000, Duration::ZERO);
        let mut state = State::default();
        let now = Instant::now();
        enqueue_all(
            &mut state,
            &settings,
            now,
            (0..6)
                .map(|i| (if i % 2 == 0 { "a" } else { "" }, item(i, 1, if i % 2 == 0 { "a" } else { "" })))
                .collect(),
        );
        let (sendable, _) = state.take_sendable(&settings, now);
        let keyed: Vec<_> = sendable.iter().filter(|(key, _)| key == "a").collect();
        assert_eq!(keyed.len(), 1, "one batch of key a at a time");
        assert_eq!(
            sendable.iter().filter(|(key, _)| key.is_empty()).count(),
            2,
            "unkeyed batches go together"
        );
        assert!(state.take_sendable(&settings, now).0.is_empty());
        let (key, batch) = sendable.into_iter().find(|(key, _)| key == "a").unwrap();
        let done = batch
            .items
            .into_iter()
            .map(|item| Done { seq: item.seq, size: item.size, slot: item.slot })
            .collect();
        state.complete(&settings, &key, done, Ok(vec![1, 2]));
        assert_eq!(sizes(&state.take_sendable(&settings, now).0), vec![1], "the next batch of key a");
    }

    #[test]
    fn a_failed_key_pauses_and_fails_its_queue() {
        let settings = settings(1, 1000, Duration::ZERO);
        let mut state = State::default();
        let now = Instant::now();
        let queued = item(1, 1, "k");
        let queued_slot = queued.slot.clone();
        enqueue_all(&mut state, &settings, now, vec![("k", item(0, 1, "k")), ("k", queued)]);
        let (mut sendable, _) = state.take_sendable(&settings, now);
        let (key, batch) = sendable.pop().unwrap();
        let done = batch
            .items
            .into_iter()
            .map(|item| Done { seq: item.seq, size: item.size, slot: item.slot })
            .collect();
        state.complete(&settings, &key, done, Err(Error::Status(Status::not_found("gone"))));
        let result = queued_slot.inner.lock().unwrap().result.take().unwrap();
        assert_eq!(result.unwrap_err().code(), ErrorCode::FailedPrecondition);
        assert!(state.paused_error("k").is_some());
        assert!(state.paused_error("other").is_none());
        assert_eq!((state.outstanding_messages, state.outstanding_bytes), (0, 0));
        assert!(state.outstanding.is_empty());
    }

    #[test]
    fn waiting_messages_are_admitted_in_order_as_the_window_frees() {
        let mut settings = settings(10, 1000, Duration::from_secs(1));
        settings.flow_control.max_outstanding_messages = 2;
        let mut state = State::default();
        let now = Instant::now();
        enqueue_all(&mut state, &settings, now, vec![("", item(0, 1, "")), ("", item(1, 1, ""))]);
        assert!(!state.fits(&settings.flow_control, 1));
        state.outstanding.insert(2);
        state.waiters.push_back((String::new(), item(2, 1, "")));
        state.flushes = 1;
        let (mut sendable, _) = state.take_sendable(&settings, now);
        let (key, batch) = sendable.pop().unwrap();
        let done = batch
            .items
            .into_iter()
            .map(|item| Done { seq: item.seq, size: item.size, slot: item.slot })
            .collect();
        state.complete(&settings, &key, done, Ok(vec![7, 8]));
        assert!(state.waiters.is_empty());
        assert_eq!(state.outstanding_messages, 1);
        assert_eq!(state.outstanding.iter().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        assert!(PublisherSettings::default().validate().is_ok());
        for bad in [
            settings(0, 1000, Duration::ZERO),
            settings(PUBLISH_BATCH_MESSAGES_MAX + 1, 1000, Duration::ZERO),
            settings(10, PUBLISH_REQUEST_BYTES_MAX + 1, Duration::ZERO),
            settings(10, 1000, BATCH_DELAY_MAX + Duration::from_secs(1)),
            PublisherSettings { batches_in_flight_max: 0, ..PublisherSettings::default() },
        ] {
            assert_eq!(bad.validate().unwrap_err().code(), ErrorCode::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn oversized_and_empty_messages_are_refused_with_their_reason() {
        let error = message_size(&Message::new(vec![0u8; MESSAGE_BYTES_MAX + 1])).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgument);
        assert!(error.to_string().contains("MESSAGE_BYTES_MAX"), "{error}");
        assert!(message_size(&Message::new(Vec::new())).is_err());
        assert_eq!(message_size(&Message::new("abc").attribute("k", "vv").ordering_key("o")).unwrap(), 7);
    }
}
