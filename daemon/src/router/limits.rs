//! How many topics, subscriptions and snapshots the catalog may hold, and the creates in
//! flight counted against them.

use super::*;
use crate::ids::TopicId;

/// Topics a daemon (or cluster) holds by default (`--topics-max`). Pub/Sub allows 10,000 per
/// project; a daemon holds every project's in one namespace, so twice that, which also leaves
/// room beside the 10,000 topics of the W4 workload. Each topic preallocates at least a 1 MiB
/// segment in every data directory and holds descriptors while its files are open, so 20,000 is
/// some 20 GiB of every data disk before any message.
pub const TOPICS_MAX_DEFAULT: usize = 20_000;

/// Subscriptions of one topic by default (`--subscriptions-per-topic-max`): Pub/Sub's 10,000.
/// Every subscription reads each message its topic takes, on the topic's one core.
pub const SUBSCRIPTIONS_PER_TOPIC_MAX_DEFAULT: usize = 10_000;

/// Subscriptions in all by default (`--subscriptions-max`): ten times Pub/Sub's 10,000 per
/// project, five per topic at the topic limit. Each is a catalog record kept on every node and in
/// every catalog snapshot, and an acknowledgement state and journal on its forwarder.
pub const SUBSCRIPTIONS_MAX_DEFAULT: usize = 100_000;

/// Snapshots in all by default (`--snapshots-max`): Pub/Sub's 5,000. Each keeps its topic's
/// messages from its subscription's acknowledgement point for up to 7 days
/// (`SNAPSHOT_LIFETIME_MS`), so each can pin a week of its topic's log on disk.
pub const SNAPSHOTS_MAX_DEFAULT: usize = 5_000;

/// How many topics, subscriptions and snapshots the catalog may hold: a create beyond one is
/// refused with `ResourceExhausted` naming the limit and its flag. Decided by the catalog's
/// leader with its own limits, so every node of a cluster should be given the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogLimits {
    pub topics_max: usize,
    pub subscriptions_max: usize,
    pub subscriptions_per_topic_max: usize,
    pub snapshots_max: usize,
}

impl Default for CatalogLimits {
    fn default() -> CatalogLimits {
        CatalogLimits {
            topics_max: TOPICS_MAX_DEFAULT,
            subscriptions_max: SUBSCRIPTIONS_MAX_DEFAULT,
            subscriptions_per_topic_max: SUBSCRIPTIONS_PER_TOPIC_MAX_DEFAULT,
            snapshots_max: SNAPSHOTS_MAX_DEFAULT,
        }
    }
}

/// Creates in flight, not yet in the catalog, counted against its limits so that concurrent
/// creates cannot pass one together.
#[derive(Default)]
pub(super) struct Creating {
    topics: usize,
    subscriptions: usize,
    snapshots: usize,
    /// Subscriptions in flight by their topic's id.
    subscriptions_by_topic: HashMap<TopicId, usize>,
}

/// One create's place in `Creating`, given back when the create ends (by then a created
/// resource is in the catalog, so for a moment it counts twice: the limits hold).
pub(super) struct CreatingSlot<'a> {
    creating: &'a RefCell<Creating>,
    kind: CreateKind,
}

#[derive(Clone, Copy)]
pub(super) enum CreateKind {
    Topic,
    Subscription { topic_id: TopicId },
    Snapshot,
}

impl Drop for CreatingSlot<'_> {
    fn drop(&mut self) {
        let mut creating = self.creating.borrow_mut();
        match self.kind {
            CreateKind::Topic => creating.topics -= 1,
            CreateKind::Snapshot => creating.snapshots -= 1,
            CreateKind::Subscription { topic_id } => {
                creating.subscriptions -= 1;
                let on_topic =
                    creating.subscriptions_by_topic.get_mut(&topic_id).expect("counted when taken");
                *on_topic -= 1;
                if *on_topic == 0 {
                    creating.subscriptions_by_topic.remove(&topic_id);
                }
            }
        }
    }
}

/// A create refused by the limit `name` of `limit` `noun`, of which `holder` holds `count`
/// already (those being created included).
pub(super) fn beyond_limit(holder: &str, count: usize, noun: &str, limit: usize, name: &str) -> ControlError {
    ControlError::LimitReached(format!(
        "{holder} holds {count} {noun} (those being created included), and its limit is {limit} \
             ({name}; ringpostd --{}): delete some, or raise the limit",
        name.replace('_', "-")
    ))
}

impl<S: Storage> Router<S> {
    /// Sets how many topics, subscriptions and snapshots the catalog may hold.
    pub fn set_limits(&mut self, limits: CatalogLimits) {
        self.limits = limits;
    }

    /// Takes a place for one create of `kind` within the catalog's limits, or refuses it with
    /// `ResourceExhausted` naming the limit. Called on the catalog's leader, which decides.
    /// Topics whose creation is in flight on this leader (placed, not yet decided).
    pub(super) fn creating_topics(&self) -> usize {
        self.in_flight.borrow().topics
    }

    pub(super) fn within_limits(&self, kind: CreateKind) -> Result<CreatingSlot<'_>, ControlError> {
        let state = self.state.borrow();
        let mut creating = self.in_flight.borrow_mut();
        let limits = &self.limits;
        match kind {
            CreateKind::Topic => {
                let count = state.topics.len() + creating.topics;
                if count >= limits.topics_max {
                    return Err(beyond_limit(
                        "the catalog",
                        count,
                        "topics",
                        limits.topics_max,
                        "topics_max",
                    ));
                }
                creating.topics += 1;
            }
            CreateKind::Snapshot => {
                let count = state.snapshots.len() + creating.snapshots;
                if count >= limits.snapshots_max {
                    return Err(beyond_limit(
                        "the catalog",
                        count,
                        "snapshots",
                        limits.snapshots_max,
                        "snapshots_max",
                    ));
                }
                creating.snapshots += 1;
            }
            CreateKind::Subscription { topic_id } => {
                let count = state.subscriptions.len() + creating.subscriptions;
                if count >= limits.subscriptions_max {
                    return Err(beyond_limit(
                        "the catalog",
                        count,
                        "subscriptions",
                        limits.subscriptions_max,
                        "subscriptions_max",
                    ));
                }
                // A scan bounded by `subscriptions_max`, beside a create's durable catalog write.
                let on_topic = state.subscriptions_served_by(topic_id).count()
                    + creating.subscriptions_by_topic.get(&topic_id).copied().unwrap_or(0);
                if on_topic >= limits.subscriptions_per_topic_max {
                    let topic = state.topic_names.get(&topic_id).map_or("the topic", |name| &**name);
                    return Err(beyond_limit(
                        &format!("topic '{topic}'"),
                        on_topic,
                        "subscriptions",
                        limits.subscriptions_per_topic_max,
                        "subscriptions_per_topic_max",
                    ));
                }
                creating.subscriptions += 1;
                *creating.subscriptions_by_topic.entry(topic_id).or_default() += 1;
            }
        }
        Ok(CreatingSlot { creating: &self.in_flight, kind })
    }
}
