//! Flow control per shard and per topic: the messages and bytes a shard's subscribers hold,
//! delivered and not yet acknowledged (nor nacked, nor expired), counted where leases are taken
//! and given back (`state::InFlight`), and the limits beyond which delivery pauses.
//!
//! A pull or stream that finds no room leases nothing and waits (as it waits for messages)
//! until an acknowledgement, a nack, an expiry or a stream that ends brings the count back
//! under; subscribers see no error. The limits bound what the shard keeps for its leases
//! (about 150 bytes each: the lease, its deadline entries and its attempt count) and what a
//! burst hands out before its subscribers have acknowledged any of it.
//!
//! A topic of several publish sources has a count on each source's shard: each source takes an
//! even share of the topic's limits, the limit over the topic's active count (never 0, as its
//! publish rate is split, `topic::rate`), so that what its subscribers hold over every source
//! stays within the topic's limit in all. The shard's limits are not split: they bound the shard.
//!
//! The byte limits are soft by one response: a lease's bytes are known only once its message
//! is read, so a pull that found room may carry up to the room it found, and several pulls
//! finding the same room may pass the limit by what each carries. The message limits are
//! exact.

use crate::sync::{Notified, Notify};
use std::cell::Cell;
use std::rc::Rc;

/// Messages one shard's subscribers may hold, delivered and not yet acknowledged, over every
/// topic and subscription (`--outstanding-messages-shard-max`). About 150 bytes of lease state
/// each: 150 MB at the limit.
pub const OUTSTANDING_MESSAGES_SHARD_MAX: u64 = 1_000_000;
/// Bytes of messages one shard's subscribers may hold (`--outstanding-mib-shard-max`). The
/// messages stay in the logs while leased, so this bounds what a burst hands out rather than
/// the shard's memory: ten times Pub/Sub's 1 GB default for one subscriber's stream.
pub const OUTSTANDING_BYTES_SHARD_MAX: u64 = 10 << 30;
/// Messages the subscribers of one topic may hold (`--outstanding-messages-topic-max`): half
/// the shard's, so that one hot topic leaves room for the others on its shard.
pub const OUTSTANDING_MESSAGES_TOPIC_MAX: u64 = OUTSTANDING_MESSAGES_SHARD_MAX / 2;
/// Bytes the subscribers of one topic may hold (`--outstanding-mib-topic-max`).
pub const OUTSTANDING_BYTES_TOPIC_MAX: u64 = OUTSTANDING_BYTES_SHARD_MAX / 2;

const _: () = assert!(OUTSTANDING_MESSAGES_TOPIC_MAX <= OUTSTANDING_MESSAGES_SHARD_MAX);
const _: () = assert!(OUTSTANDING_BYTES_TOPIC_MAX <= OUTSTANDING_BYTES_SHARD_MAX);

/// The limits of one shard and of each of its topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutstandingLimits {
    pub messages_shard_max: u64,
    pub bytes_shard_max: u64,
    pub messages_topic_max: u64,
    pub bytes_topic_max: u64,
}

impl OutstandingLimits {
    /// One source's share when `active` sources take its topic's publishes: the topic's limits
    /// over the count (at least 1, so that a share never stops delivery for good), the shard's
    /// as they are. A count of 0 (a source never told it) or 1 keeps the topic's whole.
    pub fn per_source(self, active: u32) -> OutstandingLimits {
        let share = |limit: u64| (limit / u64::from(active.max(1))).max(1);
        OutstandingLimits {
            messages_topic_max: share(self.messages_topic_max),
            bytes_topic_max: share(self.bytes_topic_max),
            ..self
        }
    }
}

impl Default for OutstandingLimits {
    fn default() -> OutstandingLimits {
        OutstandingLimits {
            messages_shard_max: OUTSTANDING_MESSAGES_SHARD_MAX,
            bytes_shard_max: OUTSTANDING_BYTES_SHARD_MAX,
            messages_topic_max: OUTSTANDING_MESSAGES_TOPIC_MAX,
            bytes_topic_max: OUTSTANDING_BYTES_TOPIC_MAX,
        }
    }
}

/// Messages and bytes held, of one scope (a shard or a topic).
#[derive(Default)]
struct Counts {
    messages: Cell<u64>,
    bytes: Cell<u64>,
}

impl Counts {
    fn at_limit(&self, messages_max: u64, bytes_max: u64) -> bool {
        self.messages.get() >= messages_max || self.bytes.get() >= bytes_max
    }

    fn add(&self, messages: u64, bytes: u64) {
        self.messages.set(self.messages.get() + messages);
        self.bytes.set(self.bytes.get() + bytes);
    }

    /// Asserted in release builds: a count that went below zero would wrap and pause the
    /// shard's delivery for good.
    fn take(&self, messages: u64, bytes: u64) {
        let (held_messages, held_bytes) = (self.messages.get(), self.bytes.get());
        assert!(
            messages <= held_messages && bytes <= held_bytes,
            "gave back {messages} messages and {bytes} bytes of {held_messages} and {held_bytes} outstanding"
        );
        self.messages.set(held_messages - messages);
        self.bytes.set(held_bytes - bytes);
    }
}

/// One shard's count and limits, shared by its topics' counts.
pub struct ShardOutstanding {
    counts: Counts,
    limits: Cell<OutstandingLimits>,
    /// Fires when a give-back brings a count at its limit back under it.
    freed: Notify,
    /// Times a pull or stream with messages to deliver waited for room (`/metrics`).
    pub paused_total: Cell<u64>,
}

impl ShardOutstanding {
    pub fn new(limits: OutstandingLimits) -> Rc<ShardOutstanding> {
        Rc::new(ShardOutstanding {
            counts: Counts::default(),
            limits: Cell::new(limits),
            freed: Notify::new(),
            paused_total: Cell::new(0),
        })
    }

    pub fn limits(&self) -> OutstandingLimits {
        self.limits.get()
    }

    pub fn set_limits(&self, limits: OutstandingLimits) {
        self.limits.set(limits);
        self.freed.notify_all();
    }

    /// Messages and bytes the shard's subscribers hold now.
    pub fn held(&self) -> (u64, u64) {
        (self.counts.messages.get(), self.counts.bytes.get())
    }

    /// Resolves at the next give-back that brings a count at its limit under it (or a change of
    /// the limits). Made before the room is looked at, so that a give-back between the look
    /// and the wait is not missed.
    pub fn freed(&self) -> Notified {
        self.freed.notified()
    }

    fn at_limit(&self) -> bool {
        let limits = self.limits.get();
        self.counts.at_limit(limits.messages_shard_max, limits.bytes_shard_max)
    }
}

/// One topic's count, within its shard's: on a topic of several sources, one source's.
pub struct TopicOutstanding {
    counts: Counts,
    shard: Rc<ShardOutstanding>,
    /// The topic's active source count as its source last applied it (0: never told), which
    /// its share of the topic's limits is divided by (`OutstandingLimits::per_source`).
    active_sources: Cell<u32>,
}

/// What a pull may take now: messages (0: none) and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub messages: u64,
    pub bytes: u64,
}

impl Room {
    pub const UNLIMITED: Room = Room { messages: u64::MAX, bytes: u64::MAX };

    /// Whether nothing may be delivered now.
    pub fn is_full(&self) -> bool {
        self.messages == 0 || self.bytes == 0
    }
}

impl TopicOutstanding {
    pub fn new(shard: &Rc<ShardOutstanding>) -> Rc<TopicOutstanding> {
        Rc::new(TopicOutstanding {
            counts: Counts::default(),
            shard: shard.clone(),
            active_sources: Cell::new(0),
        })
    }

    /// The topic's active source count changed to `active` (`TopicState::apply_active_sources`):
    /// this source's share of the topic's limits follows. A larger share (fewer sources) may
    /// make room: the pulls and streams waiting for it look again.
    pub fn set_active_sources(&self, active: u32) {
        let before = self.active_sources.replace(active);
        if before != active {
            self.shard.freed.notify_all();
        }
    }

    /// The limits this count is held to: the shard's, and its source's share of the topic's.
    fn limits(&self) -> OutstandingLimits {
        self.shard.limits.get().per_source(self.active_sources.get())
    }

    pub fn shard(&self) -> &Rc<ShardOutstanding> {
        &self.shard
    }

    /// Messages and bytes the topic's subscribers hold now.
    pub fn held(&self) -> (u64, u64) {
        (self.counts.messages.get(), self.counts.bytes.get())
    }

    /// What the topic's and the shard's limits leave room for.
    pub fn room(&self) -> Room {
        let limits = self.limits();
        let shard = &self.shard.counts;
        let messages = limits
            .messages_topic_max
            .saturating_sub(self.counts.messages.get())
            .min(limits.messages_shard_max.saturating_sub(shard.messages.get()));
        let bytes = limits
            .bytes_topic_max
            .saturating_sub(self.counts.bytes.get())
            .min(limits.bytes_shard_max.saturating_sub(shard.bytes.get()));
        Room { messages, bytes }
    }

    fn at_limit(&self) -> bool {
        let limits = self.limits();
        self.counts.at_limit(limits.messages_topic_max, limits.bytes_topic_max) || self.shard.at_limit()
    }

    /// A lease was taken (`messages` 1) or its message's size became known (`bytes`).
    pub fn add(&self, messages: u64, bytes: u64) {
        self.counts.add(messages, bytes);
        self.shard.counts.add(messages, bytes);
    }

    /// A lease ended (or leases left this count for another): what it held comes back, and
    /// pulls and streams waiting for room look again once a count at its limit is under it.
    pub fn give_back(&self, messages: u64, bytes: u64) {
        if messages == 0 && bytes == 0 {
            return;
        }
        let was_at_limit = self.at_limit();
        self.counts.take(messages, bytes);
        self.shard.counts.take(messages, bytes);
        if was_at_limit && !self.at_limit() {
            self.shard.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> OutstandingLimits {
        OutstandingLimits {
            messages_shard_max: 5,
            bytes_shard_max: 1000,
            messages_topic_max: 3,
            bytes_topic_max: 600,
        }
    }

    #[test]
    fn the_room_is_the_smaller_of_the_topics_and_the_shards() {
        let shard = ShardOutstanding::new(limits());
        let (first, second) = (TopicOutstanding::new(&shard), TopicOutstanding::new(&shard));
        assert_eq!(first.room(), Room { messages: 3, bytes: 600 });
        first.add(2, 100);
        assert_eq!(first.room(), Room { messages: 1, bytes: 500 });
        second.add(2, 700);
        // The shard has 1 message and 200 bytes left; the first topic 1 and 500.
        assert_eq!(first.room(), Room { messages: 1, bytes: 200 });
        second.add(1, 0);
        assert!(first.room().is_full() && second.room().is_full());
        assert_eq!(shard.held(), (5, 800));
        second.give_back(3, 700);
        first.give_back(2, 100);
        assert_eq!(shard.held(), (0, 0));
        assert_eq!(first.room(), Room { messages: 3, bytes: 600 });
    }

    #[test]
    fn a_give_back_under_the_limit_wakes_the_waiters_and_one_above_it_does_not() {
        use std::future::Future;
        use std::pin::pin;
        use std::task::{Context, Poll, Waker};
        let shard = ShardOutstanding::new(limits());
        let topic = TopicOutstanding::new(&shard);
        topic.add(4, 0);
        let mut context = Context::from_waker(Waker::noop());
        let mut freed = pin!(shard.freed());
        assert_eq!(freed.as_mut().poll(&mut context), Poll::Pending);
        // Still over the topic's 3 after it: nobody would find room.
        topic.give_back(1, 0);
        assert_eq!(freed.as_mut().poll(&mut context), Poll::Pending);
        topic.give_back(1, 0);
        assert_eq!(freed.as_mut().poll(&mut context), Poll::Ready(()));
    }

    #[test]
    fn a_topics_limits_are_split_over_its_active_sources() {
        let shard = ShardOutstanding::new(limits());
        let source = TopicOutstanding::new(&shard);
        // Never told, or one source: the topic's whole limits.
        assert_eq!(source.room(), Room { messages: 3, bytes: 600 });
        source.set_active_sources(1);
        assert_eq!(source.room(), Room { messages: 3, bytes: 600 });
        // Two sources: each holds half (rounded down), three: a third.
        source.set_active_sources(2);
        assert_eq!(source.room(), Room { messages: 1, bytes: 300 });
        source.set_active_sources(3);
        assert_eq!(source.room(), Room { messages: 1, bytes: 200 });
        source.add(1, 150);
        assert!(source.room().is_full());
        // More sources than the limit: a share is never 0, which would stop delivery for good.
        source.give_back(1, 150);
        source.set_active_sources(10);
        assert_eq!(source.room(), Room { messages: 1, bytes: 60 });
        // The shard's limits are not split.
        let split = limits().per_source(4);
        assert_eq!((split.messages_shard_max, split.bytes_shard_max), (5, 1000));
        assert_eq!((split.messages_topic_max, split.bytes_topic_max), (1, 150));
    }

    #[test]
    fn a_source_whose_share_grows_wakes_the_waiters() {
        use std::future::Future;
        use std::pin::pin;
        use std::task::{Context, Poll, Waker};
        let shard = ShardOutstanding::new(limits());
        let source = TopicOutstanding::new(&shard);
        source.set_active_sources(3);
        source.add(1, 0);
        assert!(source.room().is_full());
        let mut context = Context::from_waker(Waker::noop());
        let mut freed = pin!(shard.freed());
        assert_eq!(freed.as_mut().poll(&mut context), Poll::Pending);
        source.set_active_sources(3);
        assert_eq!(freed.as_mut().poll(&mut context), Poll::Pending);
        // The count falls to one: the source holds the topic's whole 3 again.
        source.set_active_sources(1);
        assert_eq!(freed.as_mut().poll(&mut context), Poll::Ready(()));
        assert_eq!(source.room(), Room { messages: 2, bytes: 600 });
    }

    #[test]
    #[should_panic(expected = "outstanding")]
    fn giving_back_more_than_was_held_is_caught() {
        let shard = ShardOutstanding::new(limits());
        let topic = TopicOutstanding::new(&shard);
        topic.add(1, 10);
        topic.give_back(1, 11);
    }
}
