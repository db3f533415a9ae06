//! Subscriptions: what a shard keeps of each subscription it serves, and the data-plane
//! operations on it: delivery (pulls and streams) through a message source, acknowledgements
//! and deadline changes made durable in its journal first, and dead letters through an
//! internal publisher. Nothing here names the log or the wire.

pub mod acknowledge;
pub mod budget;
pub mod dead_letter;
pub mod delivery;
pub mod error;
pub mod filter;
pub mod journal_entry;
pub mod offset_map;
pub mod outstanding;
pub mod pull;
pub mod source;
pub mod state;

use crate::catalog::{PushConfig, SubscriptionSettings};
use crate::clock::Clock;
use crate::ids::{Offset, TopicId};
use crate::metrics::rate::RateWindow;
use crate::sync::{Notify, RcCell, Stop};
pub use error::SubscriptionError;
use journal_entry::JournalEntry;
use state::{DeliveryPolicy, SubscriptionState};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// What the subscriptions of one shard share: the clock, the shard's stop order, where dead
/// letters are published, the numbering of streams, the shard's budget for responses, and
/// what to do when the disk is full. Each shard has its own, made with its forwarder.
pub struct Environment {
    pub clock: Rc<dyn Clock>,
    /// Given when the daemon stops (SIGTERM): streams end with `Unavailable`, which clients
    /// retry on, and waiting pulls answer with what they have.
    pub stop: Stop,
    pub dead_letters: Rc<dyn dead_letter::Publisher>,
    pub next_stream: Cell<u64>,
    /// The shard's `STREAM_RESERVED_BYTES_SHARD_MAX`, which its pulls, streams and carried
    /// streams reserve their responses from.
    pub stream_budget: Rc<budget::StreamBudget>,
    /// Called when an acknowledgement found no disk space: the shard frees what it can.
    pub release_space: Box<dyn Fn()>,
}

pub struct SubscriptionEntry {
    pub id: crate::ids::SubscriptionId,
    /// Shared with the key of the shard's map of subscriptions by name.
    pub name: Rc<str>,
    pub topic_id: TopicId,
    // The three settings the forwarder reads after attaching, not the whole
    // `SubscriptionSettings` (88 bytes, over 10,000 idle subscriptions): the deadline and the
    // delivery policy went into `state`, the filter into `filter`, and the router keeps them all.
    // Cells, so that an update changes them in place (`update_settings`).
    /// Where exhausted messages go; `None` without a dead-letter policy.
    pub dead_letter_topic: RcCell<str>,
    /// How long the subscription keeps messages, and whether acknowledged ones too.
    pub message_retention_seconds: Cell<u64>,
    pub retain_acked_messages: Cell<bool>,
    pub state: RefCell<SubscriptionState>,
    /// Where the daemon pushes its messages (a push subscription), as last attached or updated;
    /// `None` while clients pull. Shared, so that a pushing task reads it without a copy.
    pub push: RcCell<PushConfig>,
    /// The subscription's filter; `None` delivers everything.
    /// Boxed: most subscriptions have none, and an idle one should not carry its room.
    pub filter: Option<Box<filter::Filter>>,
    /// Fires when leases end (ack, nack, stream closed), so streams waiting for flow-control
    /// room or for redeliveries look again.
    pub changed: Notify,
    /// A dead-letter task is running for this subscription.
    pub dead_lettering: Cell<bool>,
    /// A push task is running for this subscription (`push::task`).
    pub pushing: Cell<bool>,
    /// Deleted (or its topic was): the pulls and streams still holding it end with NotFound.
    pub detached: Cell<bool>,
    /// Detached from its topic (DetachSubscription) rather than deleted: they end with
    /// FailedPrecondition instead.
    pub left_topic: Cell<bool>,
    /// Its topic's replica here stopped leading (another replica was elected): they end with
    /// Unavailable, and their clients look for the new leader.
    pub moved: Cell<bool>,
    /// Wall-clock time of the last pull or acknowledgement, for the expiration policy.
    pub last_activity_ms: Cell<u64>,
    pub delivered: RateWindow,
    pub acked: RateWindow,
}

impl SubscriptionEntry {
    /// Marks the subscription deleted and wakes whatever waits on it, so that its open pulls
    /// and streams end with NotFound, as Pub/Sub ends them, instead of waiting forever on a
    /// subscription nothing will deliver to again.
    pub fn detach(&self) {
        self.detached.set(true);
        self.changed.notify_all();
    }

    /// The error a pull or stream on a deleted (or detached) subscription ends with.
    pub fn deleted(&self) -> SubscriptionError {
        let subscription = self.name.clone();
        if self.moved.get() {
            return SubscriptionError::Moved { subscription };
        }
        if self.left_topic.get() {
            return SubscriptionError::Detached { subscription };
        }
        SubscriptionError::Deleted { subscription }
    }

    /// A subscription attached now, with `state` built from its sync point (and journal).
    pub fn new(
        name: Rc<str>,
        topic_id: TopicId,
        settings: &SubscriptionSettings,
        state: SubscriptionState,
        filter: Option<Box<filter::Filter>>,
        now_ms: u64,
    ) -> SubscriptionEntry {
        SubscriptionEntry {
            id: state.id,
            name,
            topic_id,
            dead_letter_topic: RcCell::new(dead_letter_topic(settings)),
            message_retention_seconds: Cell::new(settings.message_retention_seconds),
            retain_acked_messages: Cell::new(settings.retain_acked_messages),
            state: RefCell::new(state),
            push: RcCell::new(push_config(settings)),
            filter,
            changed: Notify::new(),
            dead_lettering: Cell::new(false),
            pushing: Cell::new(false),
            detached: Cell::new(false),
            left_topic: Cell::new(false),
            moved: Cell::new(false),
            last_activity_ms: Cell::new(now_ms),
            delivered: RateWindow::default(),
            acked: RateWindow::default(),
        }
    }

    /// Applies settings an update made durable in the catalog: the ack deadline (for leases
    /// granted from now on: open streams keep the lease they were opened with), delivery policy
    /// (retry backoff, dead letters) and retention. The filter and message ordering cannot
    /// change.
    pub fn update(&self, settings: &SubscriptionSettings) {
        {
            let mut state = self.state.borrow_mut();
            state.set_ack_deadline(Duration::from_secs(settings.ack_deadline_seconds as u64));
            state.set_policy(delivery_policy(settings));
        }
        self.dead_letter_topic.set(dead_letter_topic(settings));
        self.message_retention_seconds.set(settings.message_retention_seconds);
        self.retain_acked_messages.set(settings.retain_acked_messages);
        self.push.set(push_config(settings));
        // Messages the new policy no longer sends to the dead-letter topic are deliverable
        // again: the pulls and streams waiting on the subscription look.
        self.changed.notify_all();
    }
}

/// The dead-letter topic a subscription's settings name; `None` without a policy.
pub fn dead_letter_topic(settings: &SubscriptionSettings) -> Option<Rc<str>> {
    (!settings.dead_letter_topic.is_empty()).then(|| settings.dead_letter_topic.as_str().into())
}

/// The push configuration a subscription's settings ask for; `None` for pulling.
pub fn push_config(settings: &SubscriptionSettings) -> Option<Rc<PushConfig>> {
    settings.push.as_deref().map(|push| Rc::new(push.clone()))
}

/// The delivery policy a subscription's settings ask for.
pub fn delivery_policy(settings: &SubscriptionSettings) -> DeliveryPolicy {
    let backoff = (settings.minimum_backoff_seconds > 0 || settings.maximum_backoff_seconds > 0).then(|| {
        (
            settings.minimum_backoff_seconds,
            settings.maximum_backoff_seconds.max(settings.minimum_backoff_seconds),
        )
    });
    DeliveryPolicy {
        retry_backoff_seconds: backoff,
        max_delivery_attempts: (!settings.dead_letter_topic.is_empty())
            .then_some(settings.max_delivery_attempts.max(1)),
        ordered: settings.enable_message_ordering,
        exactly_once: settings.enable_exactly_once_delivery,
    }
}

/// A subscription's state as it was before a restart: its sync point, then what its journal
/// recorded, in order. Leases extended before the restart run on: the wall clock is the only
/// clock that spans a restart, so the remaining time is measured on it, once (`now` and
/// `wall_ms` are the same moment on both clocks).
pub fn recovered_state(
    mut state: SubscriptionState,
    entries: Vec<JournalEntry>,
    now: Instant,
    wall_ms: u64,
) -> SubscriptionState {
    let mut extended: HashMap<Offset, u64, state::IdHasher> = HashMap::default();
    for entry in entries {
        match entry {
            JournalEntry::Seek { offset, .. } => {
                state.seek(offset);
                extended.clear();
            }
            JournalEntry::Acked { runs, .. } => {
                for (first, count) in runs {
                    for offset in first.up_to(first + count as u64) {
                        state.restore_ack(offset);
                    }
                }
            }
            JournalEntry::DeadlineExtended { runs, until_ms, .. } => {
                for (first, count) in runs {
                    for offset in first.up_to(first + count as u64) {
                        extended.insert(offset, until_ms);
                    }
                }
            }
            _ => {}
        }
    }
    for (offset, until_ms) in extended {
        if until_ms > wall_ms {
            state.restore_lease(offset, now + Duration::from_millis(until_ms - wall_ms));
        }
    }
    state
}
