//! Subscriber threads: each holds streaming pulls on its share of the subscriptions, within a
//! flow-control window, records every delivery against the ids the publishers were
//! acknowledged, measures delivery latency from the publish start time in the payload, and
//! acknowledges as it goes, in batches.
//!
//! Acknowledgements are batched as the client library's `Subscriber` batches them (and Pub/Sub's
//! Java and Go clients): a subscription sends an acknowledge request once a quarter window of
//! ids waits, or `ACK_FLUSH_INTERVAL` (100 ms) after the first of them began to wait. So the
//! window never fills up with acknowledged-but-unsent ids, and a light load does not make one
//! journal commit per few messages. Sending at once whenever no request was in flight, as this
//! bench did before, made about 2,000 acknowledgement commits a second at an offered 10k msg/s,
//! beside about 5,000 publish commits, on a disk that does one durable write at a time, and the
//! publishes waited for them (4 interleaved runs at 10k msg/s: e2e p50 472-607 us before,
//! 345-451 us after).
//!
//! Two kinds of stream: the client's own `streaming_pull` (one connection per stream, as an
//! application would use it), and for many subscriptions (the topics workload) streams
//! multiplexed over a few connections per forwarder, because one connection and one reader
//! thread per stream does not scale to 10,000 subscriptions (and the daemon serves at most
//! 4,096 connections per shard).

use super::gate::StartGate;
use super::ids::IdSet;
use super::inflight::InflightSet;
use super::latency::{instant_of_stamp, micros_between, new_histogram};
use super::live::LiveStats;
use super::publish::{pin_thread, read_stamp};
use super::Failure;
use hdrhistogram::Histogram;
use ringpost_client::connection::{Connection, StreamReceiver};
use ringpost_client::subscriber::ACK_FLUSH_INTERVAL;
use ringpost_client::{block_on, Client, Error, InvalidAckId, MessageStream, StreamSettings};
use ringpost_wire::frame::access_body;
use ringpost_wire::limits::ACK_IDS_PER_REQUEST_MAX;
use ringpost_wire::messages::{PullResponse, StreamingPullRequest};
use ringpost_wire::Command;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Messages a stream may have delivered and not yet acknowledged, as Pub/Sub's clients default.
pub const WINDOW_DEFAULT: u64 = 1000;
pub const WINDOW_MAX: u64 = 1_000_000;
/// Acknowledge requests in flight per subscription. An acknowledge returns once the journal
/// entry is durable, which takes milliseconds while a backlog drain keeps the disk busy reading
/// (measured: 5-10 ms); with 4 in flight the W5 drain waited on them (650-800k msgs/s), with 16
/// it does not (920k-1.02M).
pub const ACK_REQUESTS_PER_SUBSCRIPTION_MAX: usize = 16;
/// Acknowledge requests in flight per subscriber thread: below the 4 x 100 requests the
/// client's default pool carries per forwarder, so acks never queue inside the client.
pub const ACK_REQUESTS_PER_THREAD_MAX: usize = 256;
/// Multiplexed streams per connection: each takes one of the daemon's 1,024 request slots per
/// connection for as long as it lives.
pub const STREAMS_PER_CONNECTION_MAX: usize = 256;
const _: () = assert!(STREAMS_PER_CONNECTION_MAX < 1024);
/// Once publishing is done, a subscriber that has received nothing new for this long gives up
/// and reports what is missing as lost. It is longer than the default ack deadline (10 s), so a
/// message whose lease expired somewhere is delivered again before it counts as lost.
pub const DRAIN_IDLE_MAX: Duration = Duration::from_secs(15);
/// The same after Ctrl-C (the user wants the results now) or after publishing was abandoned.
pub const STOPPED_IDLE_MAX: Duration = Duration::from_secs(2);
/// How often a waiting subscriber looks whether publishing has ended or it is done.
const CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// One subscription to consume.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    /// Index of its topic in the run's list of topics.
    pub topic: usize,
    /// The forwarder that owns it, for multiplexed streams.
    pub forwarder: Option<String>,
}

/// What every subscriber thread shares.
pub struct SubscriberContext<'a> {
    pub server: &'a str,
    pub targets: &'a [Target],
    /// Subscriber threads; thread t takes targets t, t + threads, ...
    pub threads: usize,
    pub window: u64,
    /// Multiplex streams over a few connections (needs `Target::forwarder`).
    pub multiplex: bool,
    /// Open the streams only once every publisher is done (the backlog workload).
    pub wait_for_publishers: bool,
    /// Pin thread t to core `pin_offset + t` (modulo the cores), when set.
    pub pin_offset: Option<usize>,
    pub stop: &'a AtomicBool,
    /// Publishing was abandoned after too many failures.
    pub abort: &'a AtomicBool,
    pub setup_failed: &'a AtomicBool,
    pub start: &'a StartGate,
    /// One per subscriber thread.
    pub live: &'a [LiveStats],
    pub publishers_running: &'a AtomicUsize,
    pub acknowledged_per_topic: &'a [AtomicU64],
    pub warnings: &'a Mutex<Vec<String>>,
    /// Backlog workload: the daemon's resident bytes with the whole backlog stored, read by
    /// thread 0 before it opens its streams (0 when unknown).
    pub resident_stored_bytes: &'a AtomicU64,
}

/// What one subscriber thread hands back.
pub struct SubscriberOutcome {
    /// Indices into the context's targets, and for each the ids delivered on it.
    pub targets: Vec<usize>,
    pub delivered: Vec<IdSet>,
    /// Every message received, duplicates included.
    pub deliveries: u64,
    pub duplicates: u64,
    /// Delivery latency of each first delivery, from its publish start.
    pub latency_us: Histogram<u64>,
    pub acknowledged: u64,
    pub acknowledge_failed: u64,
    /// When its streams were opened.
    pub opened: Instant,
    pub last_delivery: Option<Instant>,
    /// It gave up waiting for messages that never came.
    pub timed_out: bool,
    pub first_error: Option<String>,
}

/// One delivered message, reduced to what the measurement needs.
struct Delivery {
    ack_id: String,
    message_id: u64,
    stamp_ns: Option<u64>,
}

enum Feed {
    Client(MessageStream),
    Multiplexed(StreamReceiver),
    Grpc(Box<tonic::Streaming<ringpost_proto::pubsub::StreamingPullResponse>>),
}

impl Feed {
    /// The next batch; `None` when the server ended the stream.
    async fn next(&mut self) -> Option<ringpost_client::Result<Vec<Delivery>>> {
        match self {
            Feed::Client(stream) => stream.next().await.map(|batch| {
                batch.map(|messages| {
                    messages
                        .into_iter()
                        .map(|message| Delivery {
                            stamp_ns: read_stamp(&message.data),
                            ack_id: message.ack_id,
                            message_id: message.message_id,
                        })
                        .collect()
                })
            }),
            Feed::Grpc(stream) => loop {
                match stream.message().await {
                    Ok(Some(response)) if response.received_messages.is_empty() => continue,
                    Ok(Some(response)) => break Some(grpc_deliveries(response)),
                    Ok(None) => break None,
                    Err(status) => break Some(Err(super::grpc::from_grpc(status))),
                }
            },
            Feed::Multiplexed(receiver) => receiver.next().await.map(|frame| {
                let frame = frame?;
                // Read in place: only the ack id is copied out of the frame.
                let batch = access_body::<PullResponse>(&frame.body).map_err(Error::Status)?;
                Ok(batch
                    .received_messages
                    .iter()
                    .map(|message| Delivery {
                        ack_id: message.ack_id.as_str().to_owned(),
                        message_id: message.message_id.to_native(),
                        stamp_ns: read_stamp(message.data.as_slice()),
                    })
                    .collect())
            }),
        }
    }
}

enum Event {
    Batch { local: usize, feed: Feed, result: Option<ringpost_client::Result<Vec<Delivery>>> },
    Acknowledged { local: usize, count: usize, result: ringpost_client::Result<Vec<InvalidAckId>> },
}

/// Opens the streams of `mine` (indices into the targets).
/// A StreamingPull response's messages as deliveries.
fn grpc_deliveries(
    response: ringpost_proto::pubsub::StreamingPullResponse,
) -> ringpost_client::Result<Vec<Delivery>> {
    response
        .received_messages
        .into_iter()
        .map(|received| {
            let message = received.message.unwrap_or_default();
            let message_id = message.message_id.parse().map_err(|_| {
                Error::Protocol(format!("message id {:?} is not a number", message.message_id))
            })?;
            Ok(Delivery { stamp_ns: read_stamp(&message.data), ack_id: received.ack_id, message_id })
        })
        .collect()
}

/// Where a subscriber thread sends its acknowledgements: the native client, or the gRPC API.
enum Acker<'a> {
    Native(&'a Client),
    Grpc(Box<super::grpc::GrpcClient>),
}

impl Acker<'_> {
    async fn acknowledge(
        &self,
        subscription: &str,
        ack_ids: Vec<String>,
    ) -> ringpost_client::Result<Vec<InvalidAckId>> {
        match self {
            Acker::Native(client) => client.acknowledge(subscription, ack_ids).await,
            Acker::Grpc(client) => client.acknowledge(subscription, ack_ids).await.map(|()| Vec::new()),
        }
    }
}

fn open_feeds(client: &Client, mine: &[usize], context: &SubscriberContext) -> Result<Vec<Feed>, Failure> {
    let settings = StreamSettings { max_outstanding_messages: context.window, ..StreamSettings::default() };
    if let Some(address) = super::grpc_address() {
        let grpc = super::grpc::GrpcClient::connect(address, super::security().token())?;
        return mine
            .iter()
            .map(|&index| {
                grpc.streaming_pull(&context.targets[index].name, context.window)
                    .map(|stream| Feed::Grpc(Box::new(stream)))
                    .map_err(Failure::from)
            })
            .collect();
    }
    if !context.multiplex {
        return mine
            .iter()
            .map(|&index| {
                block_on(client.streaming_pull(&context.targets[index].name, settings.clone()))
                    .map(Feed::Client)
                    .map_err(Failure::from)
            })
            .collect();
    }
    let mut feeds: Vec<Option<Feed>> = mine.iter().map(|_| None).collect();
    let mut by_forwarder: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (local, &index) in mine.iter().enumerate() {
        let forwarder = context.targets[index].forwarder.as_deref().ok_or_else(|| {
            Failure::runtime(format!("no forwarder was looked up for {}", context.targets[index].name))
        })?;
        by_forwarder.entry(forwarder).or_default().push(local);
    }
    for (forwarder, locals) in by_forwarder {
        for chunk in locals.chunks(STREAMS_PER_CONNECTION_MAX) {
            let connection = Connection::connect_with(forwarder, super::security()).map_err(Failure::from)?;
            for &local in chunk {
                let request = StreamingPullRequest {
                    subscription: context.targets[mine[local]].name.clone(),
                    stream_ack_deadline_seconds: settings.stream_ack_deadline_seconds,
                    max_outstanding_messages: settings.max_outstanding_messages,
                    max_outstanding_bytes: settings.max_outstanding_bytes,
                };
                let receiver =
                    connection.open_stream(Command::StreamingPull.code(), &request).map_err(Failure::from)?;
                feeds[local] = Some(Feed::Multiplexed(receiver));
            }
        }
    }
    Ok(feeds.into_iter().flatten().collect())
}

/// Connects and, unless the streams wait for the publishers, opens them.
fn prepare(mine: &[usize], context: &SubscriberContext) -> Result<(Client, Option<Vec<Feed>>), Failure> {
    let client = block_on(super::connect(context.server))?;
    let feeds = match context.wait_for_publishers {
        true => None,
        false => Some(open_feeds(&client, mine, context)?),
    };
    Ok((client, feeds))
}

/// Per-subscription state of one thread.
struct Subscription {
    delivered: IdSet,
    pending_acks: Vec<String>,
    /// When the oldest of `pending_acks` began to wait.
    pending_since: Option<Instant>,
    acks_in_flight: usize,
    /// In the list of subscriptions with acks to send.
    dirty: bool,
    /// Deliveries to wait for, known once publishing is done.
    expected: Option<u64>,
}

/// Runs subscriber thread `thread` until it received every acknowledged message of its
/// subscriptions (and acknowledged them), or gave up. `Ok(None)` means it stood down because
/// another thread could not connect.
pub fn subscriber_run(
    thread: usize,
    context: &SubscriberContext,
) -> Result<Option<SubscriberOutcome>, Failure> {
    if let Some(offset) = context.pin_offset {
        if let Err(warning) = pin_thread(offset + thread) {
            context.warnings.lock().unwrap().push(warning);
        }
    }
    let mine: Vec<usize> = (thread..context.targets.len()).step_by(context.threads.max(1)).collect();
    let prepared = prepare(&mine, context);
    if prepared.is_err() {
        context.setup_failed.store(true, Ordering::Release);
    }
    context.start.arrive_and_wait();
    let (client, feeds) = prepared?;
    if context.setup_failed.load(Ordering::Acquire) {
        return Ok(None);
    }
    let feeds = match feeds {
        Some(feeds) => feeds,
        None => {
            while context.publishers_running.load(Ordering::Acquire) > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread == 0 {
                if let Ok(stats) = block_on(client.stats()) {
                    context.resident_stored_bytes.store(stats.process.resident_bytes, Ordering::Relaxed);
                }
            }
            open_feeds(&client, &mine, context)?
        }
    };
    let opened = Instant::now();
    let stats = &context.live[thread];
    let ack_batch = (context.window as usize / 4).clamp(1, ACK_IDS_PER_REQUEST_MAX);
    let mut subscriptions: Vec<Subscription> = mine
        .iter()
        .map(|_| Subscription {
            delivered: IdSet::new(),
            pending_acks: Vec::new(),
            pending_since: None,
            acks_in_flight: 0,
            dirty: false,
            expected: None,
        })
        .collect();
    let mut latency_us = new_histogram();
    let mut outcome = SubscriberOutcome {
        targets: mine.clone(),
        delivered: Vec::new(),
        deliveries: 0,
        duplicates: 0,
        latency_us: new_histogram(),
        acknowledged: 0,
        acknowledge_failed: 0,
        opened,
        last_delivery: None,
        timed_out: false,
        first_error: None,
    };
    let acker = match super::grpc_address() {
        Some(address) => {
            Acker::Grpc(Box::new(super::grpc::GrpcClient::connect(address, super::security().token())?))
        }
        None => Acker::Native(&client),
    };
    let acker = &acker;
    let mut in_flight: InflightSet<'_, Event> = InflightSet::new(feeds.len() + ACK_REQUESTS_PER_THREAD_MAX);
    let mut events: Vec<Event> = Vec::new();
    for (local, feed) in feeds.into_iter().enumerate() {
        events.extend(in_flight.start(next_batch(local, feed)));
    }
    let mut dirty: Vec<usize> = Vec::new();
    let mut acks_in_flight = 0usize;
    // Subscriptions still short of their expected deliveries, once publishing is done.
    let mut incomplete: Option<usize> = None;
    // Since when nothing new arrived (once publishing is done).
    let mut idle_since = opened;
    loop {
        while let Some(event) = events.pop() {
            match event {
                Event::Batch { local, feed, result } => match result {
                    Some(Ok(batch)) => {
                        let now = Instant::now();
                        let subscription = &mut subscriptions[local];
                        let mut fresh = 0u64;
                        let mut interval_latency_us = stats.interval_latency_us.lock().unwrap();
                        for delivery in &batch {
                            if !subscription.delivered.insert(delivery.message_id) {
                                outcome.duplicates += 1;
                                continue;
                            }
                            fresh += 1;
                            if let Some(stamp) = delivery.stamp_ns {
                                let latency = micros_between(instant_of_stamp(stamp), now);
                                latency_us.saturating_record(latency);
                                interval_latency_us.saturating_record(latency);
                            }
                        }
                        drop(interval_latency_us);
                        if fresh > 0 {
                            outcome.last_delivery = Some(now);
                            idle_since = now;
                            if let (Some(expected), Some(count)) =
                                (subscription.expected, incomplete.as_mut())
                            {
                                // Counted once, on the delivery that completes the subscription.
                                let before = subscription.delivered.len() - fresh;
                                if before < expected && subscription.delivered.len() >= expected {
                                    *count -= 1;
                                }
                            }
                        }
                        outcome.deliveries += batch.len() as u64;
                        stats.messages.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        if subscription.pending_acks.is_empty() {
                            subscription.pending_since = Some(now);
                        }
                        subscription.pending_acks.extend(batch.into_iter().map(|delivery| delivery.ack_id));
                        if !subscription.pending_acks.is_empty() && !subscription.dirty {
                            subscription.dirty = true;
                            dirty.push(local);
                        }
                        events.extend(in_flight.start(next_batch(local, feed)));
                    }
                    Some(Err(error)) => {
                        let name = &context.targets[mine[local]].name;
                        outcome.first_error.get_or_insert(format!("the stream of {name} failed: {error}"));
                    }
                    None => {
                        let name = &context.targets[mine[local]].name;
                        outcome.first_error.get_or_insert(format!("the server ended the stream of {name}"));
                    }
                },
                Event::Acknowledged { local, count, result } => {
                    acks_in_flight -= 1;
                    let subscription = &mut subscriptions[local];
                    subscription.acks_in_flight -= 1;
                    let failed = match result {
                        Ok(refused) => {
                            if let Some(refusal) = refused.first() {
                                outcome.first_error.get_or_insert(format!(
                                    "ack id {} refused: {}",
                                    refusal.ack_id, refusal.reason
                                ));
                            }
                            refused.len()
                        }
                        Err(error) => {
                            outcome.first_error.get_or_insert(format!("acknowledge failed: {error}"));
                            count
                        }
                    };
                    outcome.acknowledged += (count - failed) as u64;
                    outcome.acknowledge_failed += failed as u64;
                    stats.messages_failed.fetch_add(failed as u64, Ordering::Relaxed);
                    if !subscription.pending_acks.is_empty() && !subscription.dirty {
                        subscription.dirty = true;
                        dirty.push(local);
                    }
                }
            }
        }
        // Send the acknowledgements that are due.
        let now = Instant::now();
        let mut next_due: Option<Instant> = None;
        dirty.retain(|&local| {
            let subscription = &mut subscriptions[local];
            let due = subscription.pending_since.map(|since| since + ACK_FLUSH_INTERVAL);
            while !subscription.pending_acks.is_empty()
                && subscription.acks_in_flight < ACK_REQUESTS_PER_SUBSCRIPTION_MAX
                && acks_in_flight < ACK_REQUESTS_PER_THREAD_MAX
                && (subscription.pending_acks.len() >= ack_batch || due.is_some_and(|due| due <= now))
            {
                let take = subscription.pending_acks.len().min(ACK_IDS_PER_REQUEST_MAX);
                let ids: Vec<String> = subscription.pending_acks.drain(..take).collect();
                let name = context.targets[mine[local]].name.as_str();
                subscription.acks_in_flight += 1;
                acks_in_flight += 1;
                let count = ids.len();
                let request = async move {
                    let result = acker.acknowledge(name, ids).await;
                    Event::Acknowledged { local, count, result }
                };
                events.extend(in_flight.start(request));
            }
            // Still dirty if something is left to send later: at its due time, or, if it is due
            // and waits for room, when an acknowledgement in flight returns. What is left
            // waited since the same time as what went.
            subscription.dirty = !subscription.pending_acks.is_empty();
            match due {
                Some(due) if subscription.dirty && due > now => {
                    next_due = Some(next_due.map_or(due, |next| next.min(due)));
                }
                _ if !subscription.dirty => subscription.pending_since = None,
                _ => {}
            }
            subscription.dirty
        });
        if !events.is_empty() {
            continue;
        }
        let now = Instant::now();
        if incomplete.is_none() && context.publishers_running.load(Ordering::Acquire) == 0 {
            let mut count = 0;
            for (local, subscription) in subscriptions.iter_mut().enumerate() {
                let expected = context.acknowledged_per_topic[context.targets[mine[local]].topic]
                    .load(Ordering::Acquire);
                subscription.expected = Some(expected);
                count += usize::from(subscription.delivered.len() < expected);
            }
            incomplete = Some(count);
            idle_since = idle_since.max(now);
        }
        if let Some(remaining) = incomplete {
            let settled = acks_in_flight == 0 && dirty.is_empty();
            if remaining == 0 && settled {
                break;
            }
            let idle_max =
                if context.stop.load(Ordering::Relaxed) { STOPPED_IDLE_MAX } else { DRAIN_IDLE_MAX };
            if now.saturating_duration_since(idle_since) > idle_max {
                outcome.timed_out = remaining > 0;
                break;
            }
        }
        let wake = next_due.map_or(now + CHECK_INTERVAL, |due| due.min(now + CHECK_INTERVAL));
        in_flight.wait(Some(wake));
        in_flight.poll_woken(&mut events);
    }
    outcome.latency_us = latency_us;
    outcome.delivered = subscriptions.into_iter().map(|subscription| subscription.delivered).collect();
    Ok(Some(outcome))
}

/// The future of a feed's next batch, which hands the feed back with it.
async fn next_batch(local: usize, mut feed: Feed) -> Event {
    let result = feed.next().await;
    Event::Batch { local, feed, result }
}
