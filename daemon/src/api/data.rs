//! The data plane as domain operations: publish, pull, streaming pull, acknowledge and modify
//! an ack deadline, on plain values borrowed from whatever the protocol decoded. Pub/Sub's
//! defaults and checks of those values are made here, so that every protocol gets them.
//!
//! Nothing is copied on the way in or out beyond what the operation needs: a publish's messages
//! stay where the protocol received them until they are encoded into their commit, and a
//! delivery hands out the log batches its messages were read into, with where each message lies
//! in them, so that a protocol can send the data straight from those buffers.

use crate::api::limits::{
    ACK_IDS_PER_REQUEST_MAX, ACK_ID_BYTES_MAX, MODIFY_ACK_DEADLINE_SECONDS_MAX, PUBLISH_BATCH_MESSAGES_MAX,
    PUBLISH_REQUEST_BYTES_MAX, PULL_MESSAGES_MAX, PULL_WAIT_MS_MAX,
};
use crate::api::validate::{effective_ack_deadline_seconds, validate_message, validate_name};
use crate::log::record::AttributeIter;
use crate::log::LogError;
use crate::subscription::budget::StreamReservation;
use crate::subscription::SubscriptionError;
use ringpost_model::Invalid;
use std::ops::Range;
use std::rc::Rc;
use std::time::Duration;

/// Which kind of resource a data-plane request named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    Topic,
    Subscription,
}

impl std::fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ResourceKind::Topic => "topic",
            ResourceKind::Subscription => "subscription",
        })
    }
}

/// Why the data plane refused or failed a request, by what its caller does next. Each protocol
/// turns it into its own code at its edge, through the domain's `Status` (`api::error`); the
/// message is this `Display` but for `Log`, whose message is the log's mapping's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// The request breaks one of Pub/Sub's rules, which the reason names: sent again as it is,
    /// it fails again.
    #[error("{0}")]
    InvalidArgument(String),
    /// The protocol could not read the request it received (a malformed frame): its
    /// connection is closed after the reply.
    #[error("{0}")]
    Malformed(String),
    /// This shard does not serve the topic or subscription: the caller asks the router which
    /// forwarder does, by the resource's kind and name, and goes there.
    #[error("this forwarder does not serve {kind} '{name}'; ask the router again")]
    NotOwner { kind: ResourceKind, name: Box<str> },
    /// The topic (or the subscription's topic) could not be recovered at start and is not
    /// served until an operator repairs or deletes it: no retry helps.
    #[error(
        "{kind} '{name}' is quarantined: {why}. It is not served until repaired or deleted; nothing was deleted"
    )]
    Quarantined { kind: ResourceKind, name: Box<str>, why: Rc<str> },
    /// The subscription's own refusal (deleted, detached, moved, the shard stopping).
    #[error("{0}")]
    Subscription(SubscriptionError),
    /// The topic's log failed the write or the read; it says whether to retry here, go
    /// elsewhere (a deposed leader) or give up.
    #[error("{0}")]
    Log(LogError),
    /// The topic's publishes are over its rate (`topic::rate`): `limit` says which, as its flag.
    /// The message ends with the retry delay in the form every client reads
    /// (`ringpost_wire::Status::retry_delay`).
    #[error(
        "topic '{topic}' is publishing over its rate ({limit}); retry after {} ms",
        retry_after.as_millis().max(1)
    )]
    Throttled { topic: Box<str>, limit: &'static str, retry_after: std::time::Duration },
}

impl From<SubscriptionError> for DataError {
    fn from(error: SubscriptionError) -> DataError {
        DataError::Subscription(error)
    }
}

impl From<LogError> for DataError {
    fn from(error: LogError) -> DataError {
        DataError::Log(error)
    }
}

impl DataError {
    /// Whether the caller should go to another forwarder: this one does not serve the resource,
    /// or its replica stopped leading the topic under the write.
    pub fn is_not_owner(&self) -> bool {
        matches!(
            self,
            DataError::NotOwner { .. }
                | DataError::Log(LogError::Deposed { .. })
                | DataError::Subscription(SubscriptionError::Log(LogError::Deposed { .. }))
        )
    }
}

impl From<Invalid> for DataError {
    /// The model's refusals are all invalid arguments, with its message.
    fn from(invalid: Invalid) -> DataError {
        DataError::InvalidArgument(invalid.message)
    }
}

pub trait Attributes {
    fn count(&self) -> usize;
    /// The key and value of attribute `index`, below `count`.
    fn get(&self, index: usize) -> (&str, &str);
}

/// One message of a publish, borrowed.
#[derive(Clone, Copy)]
pub struct MessageView<'a> {
    pub data: &'a [u8],
    pub attributes: &'a dyn Attributes,
    pub ordering_key: &'a str,
}

impl<'a> MessageView<'a> {
    pub fn attributes(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone + 'a {
        let attributes = self.attributes;
        (0..attributes.count()).map(move |index| attributes.get(index))
    }
}

/// The messages of one publish, and the topic they go to, kept where the protocol received
/// them until their commit is built: they are read twice, once to check and size them when
/// the publish arrives, once to encode them into the commit's buffer.
pub trait PublishBatch: 'static {
    /// Calls `visit` with the topic's name and the messages, in order; fails if the messages
    /// cannot be read (a malformed request), which the first visit finds.
    fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = MessageView<'_>>),
    ) -> Result<(), DataError>;

    /// Whether the batch is not to be checked against its topic's schema on the forwarder: it
    /// was checked, and its attributes added, before it reached the shard (gRPC's gateway), or
    /// it is forwarded as it was once published (dead letters).
    fn checked_against_schema(&self) -> bool {
        false
    }
}

/// Checks a publish with Pub/Sub's rules (the topic's name, the number of messages, each
/// message's parts, the request's size) and returns its messages' encoded size in the log.
pub fn check_publish(
    topic: &str,
    messages: &mut dyn ExactSizeIterator<Item = MessageView<'_>>,
    record_bytes: impl Fn(&MessageView<'_>) -> usize,
) -> Result<usize, DataError> {
    validate_name("topic", topic)?;
    let count = messages.len();
    if count == 0 {
        return Err(DataError::InvalidArgument("publish request has no messages".into()));
    }
    if count > PUBLISH_BATCH_MESSAGES_MAX {
        return Err(DataError::InvalidArgument(format!(
            "publish request has {count} messages; the limit is {PUBLISH_BATCH_MESSAGES_MAX} (PUBLISH_BATCH_MESSAGES_MAX)"
        )));
    }
    let (mut total, mut encoded_bytes) = (0usize, 0usize);
    for (index, message) in messages.enumerate() {
        total += validate_message(index, message.data, message.attributes(), message.ordering_key)?;
        encoded_bytes += record_bytes(&message);
    }
    if total > PUBLISH_REQUEST_BYTES_MAX {
        return Err(DataError::InvalidArgument(format!(
            "publish request is {total} bytes; the limit is {PUBLISH_REQUEST_BYTES_MAX} (PUBLISH_REQUEST_BYTES_MAX)"
        )));
    }
    Ok(encoded_bytes)
}

/// What a unary pull asks for, checked.
#[derive(Clone, Copy, Debug)]
pub struct PullSettings {
    pub max_messages: usize,
    /// How long to wait for a first message when there is none.
    pub wait: Duration,
}

impl PullSettings {
    pub fn new(max_messages: u32, wait_ms: u32) -> Result<PullSettings, DataError> {
        if max_messages == 0 || max_messages > PULL_MESSAGES_MAX {
            return Err(DataError::InvalidArgument(format!(
                "max_messages is {max_messages}; it must be 1 to {PULL_MESSAGES_MAX} (PULL_MESSAGES_MAX)"
            )));
        }
        if wait_ms > PULL_WAIT_MS_MAX {
            return Err(DataError::InvalidArgument(format!(
                "wait_ms is {wait_ms}; the limit is {PULL_WAIT_MS_MAX} (PULL_WAIT_MS_MAX)"
            )));
        }
        Ok(PullSettings { max_messages: max_messages as usize, wait: Duration::from_millis(wait_ms as u64) })
    }
}

/// What a streaming pull asks for, checked: its lease (`None`: the subscription's ack
/// deadline), its flow-control window, and what becomes of its leases when it ends.
#[derive(Clone, Copy, Debug)]
pub struct StreamSettings {
    pub lease: Option<Duration>,
    pub max_outstanding_messages: u64,
    pub max_outstanding_bytes: u64,
    /// When the stream ends, its leases run on to their deadlines instead of ending at once:
    /// the client will reconnect and still holds the messages (Pub/Sub's `client_id`), so it
    /// can extend or acknowledge them without each being delivered again on its new stream.
    pub leases_outlive_stream: bool,
}

impl StreamSettings {
    /// Zero stands for the default of each: the subscription's deadline, no limit.
    pub fn new(
        ack_deadline_seconds: u32,
        max_outstanding_messages: u64,
        max_outstanding_bytes: u64,
    ) -> Result<StreamSettings, DataError> {
        let lease = match ack_deadline_seconds {
            0 => None,
            seconds => Some(Duration::from_secs(effective_ack_deadline_seconds(seconds)? as u64)),
        };
        let unlimited_at_zero = |limit: u64| if limit == 0 { u64::MAX } else { limit };
        Ok(StreamSettings {
            lease,
            max_outstanding_messages: unlimited_at_zero(max_outstanding_messages),
            max_outstanding_bytes: unlimited_at_zero(max_outstanding_bytes),
            leases_outlive_stream: false,
        })
    }
}

/// The other end of a stream, as the stream sees it.
#[allow(async_fn_in_trait)]
pub trait StreamPeer {
    /// Whether the peer went (closed its side, or the connection broke).
    fn is_gone(&self) -> bool;
    /// Resolves when the peer goes.
    async fn gone(&self);
}

/// An open streaming pull: deliveries while its window has room, until the peer goes. Dropping
/// it ends the stream; its outstanding messages are delivered again at once.
#[allow(async_fn_in_trait)]
pub trait DeliveryStream {
    type Batch;
    /// The next delivery, waiting for one; `None` once the peer went. An error ends the stream.
    async fn next(&mut self, peer: &impl StreamPeer) -> Result<Option<Delivery<Self::Batch>>, DataError>;
    /// Whether the shard is stopping: a peer that seems gone may only have stopped being read.
    fn stopping(&self) -> bool;
}

/// Messages leased to a subscriber, with the batches they were read into (each with the bytes
/// it counts against the shard's budget for held buffers: 0 for a slice of a buffer an earlier
/// batch of the delivery holds already), and a share of the shard's budget for responses,
/// which the protocol holds until its response is written.
pub struct Delivery<B> {
    pub batches: Vec<(B, usize)>,
    pub messages: Vec<DeliveredMessage>,
    /// Every ack id of the delivery in one string; each message has its span.
    pub ack_ids: String,
    pub reservation: StreamReservation,
}

/// Where a delivered message lies in its batch's bytes, with its ack id and attempt.
#[derive(Clone, Debug)]
pub struct DeliveredMessage {
    pub batch: usize,
    pub message_id: u64,
    pub publish_time_ms: u64,
    pub data: Range<usize>,
    pub ordering_key: Range<usize>,
    pub attributes: Range<usize>,
    pub attribute_count: u16,
    pub ack_id: Range<usize>,
    pub delivery_attempt: u32,
}

/// A delivered message read in place.
pub struct DeliveredView<'a> {
    pub message_id: u64,
    pub publish_time_ms: u64,
    pub data: &'a [u8],
    pub ordering_key: &'a str,
    pub attributes: AttributeIter<'a>,
    pub ack_id: &'a str,
    pub delivery_attempt: u32,
}

impl<B: AsRef<[u8]>> Delivery<B> {
    pub fn view(&self, message: &DeliveredMessage) -> DeliveredView<'_> {
        let bytes = self.batches[message.batch].0.as_ref();
        DeliveredView {
            message_id: message.message_id,
            publish_time_ms: message.publish_time_ms,
            data: &bytes[message.data.clone()],
            // Checked as UTF-8 when the batch was read.
            ordering_key: std::str::from_utf8(&bytes[message.ordering_key.clone()]).unwrap_or(""),
            attributes: AttributeIter::over(&bytes[message.attributes.clone()], message.attribute_count),
            ack_id: &self.ack_ids[message.ack_id.clone()],
            delivery_attempt: message.delivery_attempt,
        }
    }

    /// Bytes the batches count against the shard's budget for held buffers.
    pub fn held_bytes(&self) -> usize {
        self.batches.iter().map(|(_, charge)| charge).sum()
    }
}

/// An ack id a request named that could not be honoured, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidAckId {
    /// At most `ACK_ID_BYTES_MAX` characters of it.
    pub ack_id: String,
    pub reason: &'static str,
    /// Whether asking again can never succeed (a malformed, unknown or expired ack id), or
    /// might (the acknowledgement could not be made durable yet).
    pub permanent: bool,
}

impl InvalidAckId {
    /// An ack id that can never be honoured.
    pub fn new(ack_id: &str, reason: &'static str) -> InvalidAckId {
        InvalidAckId { ack_id: ack_id.chars().take(ACK_ID_BYTES_MAX).collect(), reason, permanent: true }
    }

    /// An ack id not honoured this time, which may be on a retry.
    pub fn transient(ack_id: &str, reason: &'static str) -> InvalidAckId {
        InvalidAckId { permanent: false, ..InvalidAckId::new(ack_id, reason) }
    }
}

/// Checks the number of ack ids of an acknowledgement or a deadline change.
pub fn check_ack_id_count(count: usize) -> Result<(), DataError> {
    if count == 0 || count > ACK_IDS_PER_REQUEST_MAX {
        return Err(DataError::InvalidArgument(format!(
            "{count} ack ids; a request carries 1 to {ACK_IDS_PER_REQUEST_MAX} (ACK_IDS_PER_REQUEST_MAX)"
        )));
    }
    Ok(())
}

/// Checks a deadline change's seconds (0 gives the messages back at once).
pub fn check_ack_deadline_change(seconds: u32) -> Result<(), DataError> {
    if seconds > MODIFY_ACK_DEADLINE_SECONDS_MAX {
        return Err(DataError::InvalidArgument(format!(
            "ack deadline of {seconds} s is outside 0 to {MODIFY_ACK_DEADLINE_SECONDS_MAX} s (MODIFY_ACK_DEADLINE_SECONDS_MAX)"
        )));
    }
    Ok(())
}

/// The data-plane operations a forwarder shard serves.
#[allow(async_fn_in_trait)]
pub trait DataPlane {
    /// The buffers deliveries are read into.
    type Batch: AsRef<[u8]> + 'static;
    type Stream<'a>: DeliveryStream<Batch = Self::Batch>
    where
        Self: 'a;

    /// Appends the messages to their topic once durable; returns their message ids, in order.
    async fn publish(&self, messages: impl PublishBatch) -> Result<Range<u64>, DataError>;
    /// Leases up to `settings.max_messages`, waiting up to `settings.wait` for a first one;
    /// `None` when there was none.
    async fn pull(
        &self,
        subscription: &str,
        settings: PullSettings,
    ) -> Result<Option<Delivery<Self::Batch>>, DataError>;
    /// `pull`, ending its wait with `None` once `peer` is gone: a connection whose client left
    /// is not held until the wait it asked for ends. Only the wait ends early; a pull that has
    /// leased messages answers them.
    async fn pull_for_peer(
        &self,
        subscription: &str,
        settings: PullSettings,
        peer: &impl StreamPeer,
    ) -> Result<Option<Delivery<Self::Batch>>, DataError> {
        let _ = peer;
        self.pull(subscription, settings).await
    }
    async fn open_stream(
        &self,
        subscription: &str,
        settings: StreamSettings,
    ) -> Result<Self::Stream<'_>, DataError>;
    /// Acknowledges, durably; returns the ack ids refused. On a subscription with exactly-once
    /// delivery, only ack ids of current, unexpired leases are accepted, and a journal write
    /// that fails is not an error of the request: each id it held is returned as
    /// `InvalidAckId::transient` (the others refused are permanent).
    async fn acknowledge<'a>(
        &self,
        subscription: &str,
        ack_ids: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<Vec<InvalidAckId>, DataError>;
    /// Extends the leases by `seconds` from now (durably), or gives them back at once with 0.
    /// With exactly-once delivery, refusals and failures are per id, as for `acknowledge`.
    async fn modify_ack_deadline<'a>(
        &self,
        subscription: &str,
        ack_ids: impl ExactSizeIterator<Item = &'a str> + Clone,
        seconds: u32,
    ) -> Result<Vec<InvalidAckId>, DataError>;
}
