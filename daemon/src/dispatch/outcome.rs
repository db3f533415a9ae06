//! What an operation answers, before any protocol encodes it.

use crate::api::cluster::{ClusterStatus, NodeDrain};
use crate::api::control::{ForwarderAddress, Page, Resynced, Snapshot, SourceRoutes, Subscription, Topic};
use crate::api::stats::Stats;
use crate::api::Status;
use crate::catalog::schemas::SchemaRecord;

/// A subscription as an operation answers it, with its topic's message retention (0: not set,
/// or the topic is gone), which Pub/Sub shows beside it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionShown {
    pub subscription: Subscription,
    pub topic_retention_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done, with nothing to show (a deletion, a seek, a node added).
    Done,
    Topic(Topic),
    Subscription(SubscriptionShown),
    Snapshot(Snapshot),
    Topics(Page<Topic>),
    Subscriptions(Page<SubscriptionShown>),
    Snapshots(Page<Snapshot>),
    Forwarders(Vec<ForwarderAddress>),
    /// Each publish source's forwarders.
    Sources(SourceRoutes),
    Stats(Box<Stats>),
    ClusterStatus(Box<ClusterStatus>),
    /// What each draining node still holds.
    Drains(Vec<NodeDrain>),
    /// The routing restrictions.
    RoutingRules(Vec<crate::catalog::routing::RoutingRule>),
    Resynced(Resynced),
    /// A schema with every revision, oldest first.
    Schema(SchemaRecord),
    Schemas(Page<SchemaRecord>),
}

/// An outcome of another shape than its operation's: a node that answers otherwise than this
/// one would (another version), or a mistake here.
fn mismatched(outcome: &Outcome, wanted: &str) -> Status {
    Status::internal(format!("an operation answered {outcome:?} where {wanted} was expected"))
}

macro_rules! into_variant {
    ($method:ident, $variant:ident, $type:ty) => {
        /// The outcome's value, if it is of this shape.
        pub fn $method(self) -> Result<$type, Status> {
            match self {
                Outcome::$variant(value) => Ok(value),
                other => Err(mismatched(&other, stringify!($variant))),
            }
        }
    };
}

impl Outcome {
    into_variant!(into_topic, Topic, Topic);
    into_variant!(into_subscription, Subscription, SubscriptionShown);
    into_variant!(into_snapshot, Snapshot, Snapshot);
    into_variant!(into_topics, Topics, Page<Topic>);
    into_variant!(into_subscriptions, Subscriptions, Page<SubscriptionShown>);
    into_variant!(into_snapshots, Snapshots, Page<Snapshot>);
    into_variant!(into_forwarders, Forwarders, Vec<ForwarderAddress>);
    into_variant!(into_sources, Sources, SourceRoutes);
    into_variant!(into_stats, Stats, Box<Stats>);
    into_variant!(into_cluster_status, ClusterStatus, Box<ClusterStatus>);
    into_variant!(into_drains, Drains, Vec<NodeDrain>);
    into_variant!(into_routing_rules, RoutingRules, Vec<crate::catalog::routing::RoutingRule>);
    into_variant!(into_resynced, Resynced, Resynced);
    into_variant!(into_schema, Schema, SchemaRecord);
    into_variant!(into_schemas, Schemas, Page<SchemaRecord>);

    pub fn into_done(self) -> Result<(), Status> {
        match self {
            Outcome::Done => Ok(()),
            other => Err(mismatched(&other, "Done")),
        }
    }
}
