//! Messages between the router shard and the forwarder shards. They cross threads through
//! bounded glommio shared channels, so they are plain owned data. `codec` gives them a binary
//! encoding, for the router of one node to reach the forwarders of another.

mod codec;

pub use codec::{decode_reply, encode_reply};

use crate::api::Status;
use crate::catalog::SubscriptionSettings;
use crate::ids::{SnapshotId, TopicId};

#[derive(Debug, PartialEq, Eq)]
pub enum ControlRequest {
    /// Open (recover) or create a topic's log and journal on this forwarder.
    AttachTopic {
        topic_id: TopicId,
        name: String,
        /// Topic message retention; 0 when not set.
        retention_seconds: u64,
        /// Attached at start-up: its folders exist, and are read from a cold cache.
        recovering: bool,
        /// Which of its topic's publish sources the unit `topic_id` is: what its message ids
        /// and ack ids name (`SourceId::FIRST` for a topic's own log).
        source: crate::ids::SourceId,
        /// Its topic's active count (`topic::sources`): the sources below it take publishes,
        /// an ordered message only at its key's. 0 only from a router that did not say it
        /// (before the key map): the unit then takes every publish, as before.
        active: u32,
    },
    /// Stop serving a topic; with `delete_data`, remove its files.
    DetachTopic {
        topic_id: TopicId,
        delete_data: bool,
    },
    /// Serve a subscription. With `create`, its sync point is the topic's current durable end,
    /// which the reply carries; without, `start_offset` is the sync point the catalog decided
    /// (what the router sends, at recovery and once a creation is applied).
    AttachSubscription {
        subscription_id: u64,
        name: String,
        topic_id: TopicId,
        settings: SubscriptionSettings,
        create: bool,
        start_offset: u64,
    },
    /// Report a topic's durable end offset (`ControlOk::SubscriptionStart`): the sync point the
    /// router decides a new subscription with, before it proposes the creation.
    DurableEnd {
        topic_id: TopicId,
    },
    /// Stop serving a subscription: it was deleted (`deleted`), or detached from its topic,
    /// which its open pulls and streams end with (`FailedPrecondition` instead of `NotFound`).
    DetachSubscription {
        subscription_id: u64,
        name: String,
        topic_id: TopicId,
        deleted: bool,
    },
    /// Move a subscription's acknowledgements to the first message published at `time_ms`, or
    /// to those captured by a snapshot.
    Seek {
        subscription_id: u64,
        topic_id: TopicId,
        time_ms: u64,
        snapshot_id: Option<SnapshotId>,
    },
    /// Capture a subscription's acknowledgements durably as a snapshot of its topic.
    TakeSnapshot {
        topic_id: TopicId,
        subscription_id: u64,
        snapshot_id: SnapshotId,
        expire_time_ms: u64,
    },
    DropSnapshot {
        topic_id: TopicId,
        snapshot_id: SnapshotId,
    },
    /// Apply settings an update changed, already durable in the catalog, to a topic or
    /// subscription served here.
    UpdateSettings {
        topic_id: TopicId,
        update: SettingsUpdate,
    },
    /// Report this shard's topics, subscriptions and data directories.
    Stats,
    /// Report the requests this shard answered, by command, status and duration.
    Requests,
    /// Trust data directory `index` again, after rewriting every stale copy in it.
    ResyncDirectory {
        index: usize,
    },
    /// Open (recover) or create one replica of a replicated topic, as a follower: it takes
    /// records from whichever replica leads, until it is promoted (`PromoteReplica`).
    AttachReplica {
        topic_id: TopicId,
        name: String,
        retention_seconds: u64,
        recovering: bool,
        /// As `AttachTopic`'s.
        source: crate::ids::SourceId,
        /// The topic's active count, as `AttachTopic`'s, applied by the follower so that once
        /// promoted its first publish is checked (`topic::sources`); 0 when the router did
        /// not say it (a router before replicated sources retired), and then never applied.
        active: u32,
    },
    /// Lead a replicated topic from `epoch`, which the catalog elected this replica for.
    PromoteReplica {
        topic_id: TopicId,
        epoch: u64,
        replicas: Vec<crate::replication::source::Peer>,
    },
    /// Stop leading a replicated topic at an epoch older than `epoch`.
    DemoteReplica {
        topic_id: TopicId,
        epoch: u64,
    },
    /// A fencing round: promise to take nothing from a leader older than `epoch`, and report
    /// the topic's messages log (`ControlOk::Fenced`).
    FenceReplica {
        topic_id: TopicId,
        epoch: u64,
    },
    /// The topics this shard leads whose followers refused it for a newer epoch's promise
    /// (`ControlOk::Topics`): elections to ask for.
    ElectionsWanted,
    /// Where a replica's logs stand, and on a leader its followers' (`ControlOk::Progress`):
    /// what a replica move waits on.
    ReplicaProgress {
        topic_id: TopicId,
    },
    /// The hosts of the cluster's nodes are now `hosts` (the catalog registered a node, or
    /// removed one): the shard's connection server counts their connections before
    /// authentication in the cluster's budget (`net::server::ClusterHosts`). At
    /// most `CLUSTER_HOSTS_MAX`.
    ClusterHosts {
        hosts: Vec<std::net::IpAddr>,
    },
    /// Apply topic `topic_id`'s active count `active` (a source added or retiring): answered
    /// with the fence of the change and each subscription's ack floor on this source
    /// (`ControlOk::SourcesApplied`). The same count again changes nothing, so the router
    /// sends it again to learn the floors.
    ApplySources {
        topic_id: TopicId,
        active: u32,
    },
    /// The delivery gate of topic `topic_id`'s key map (docs/SOURCES.md, rule 3): its last
    /// change of the active count, numbered `generation`, went from `before` to `after`, and of
    /// its subscriptions only those listed in `passed` (by id) passed it; each other ordered
    /// one holds the keys that moved to this source. Sent before the `ApplySources` of the
    /// change, so that a source takes a moved key only once it holds it. Answered `Done`.
    GateSources {
        topic_id: TopicId,
        generation: u64,
        before: u32,
        after: u32,
        passed: Vec<u64>,
    },
    /// Check topic unit `topic_id`'s publishes against `schema` from now on (`None`: it has no
    /// schema any more): its settings and the definitions of the revisions between their
    /// bounds, oldest first. Sent after each attach of a topic with a schema and after each
    /// change of a schema or of a topic's settings; the same again changes nothing. Answered
    /// `Done`.
    SetTopicSchema {
        topic_id: TopicId,
        schema: Option<crate::router::schemas::TopicSchema>,
    },
}

/// One replica's logs (messages, journal), and a leader's view of its followers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaProgress {
    pub leader: bool,
    /// The epoch it leads, or last synced with as a follower.
    pub epoch: u64,
    /// On a leader: everything its logs held when its epoch began is on a quorum of its
    /// replicas (`Leader::holds_what_came_before`).
    pub epoch_committed: bool,
    pub durable_ends: [u64; 2],
    pub committed_ends: [u64; 2],
    /// Each follower's shard and the durable ends it answered, on a leader.
    pub followers: Vec<(u32, [u64; 2])>,
}

/// What an `UpdateSettings` changes.
#[derive(Debug, PartialEq, Eq)]
pub enum SettingsUpdate {
    /// The topic's message retention; 0 when not set.
    Topic { retention_seconds: u64 },
    /// A subscription's settings, whole, as the catalog now holds them.
    Subscription { subscription_id: u64, settings: SubscriptionSettings },
}

#[derive(Debug, PartialEq, Eq)]
pub enum ControlOk {
    Done,
    SubscriptionStart(u64),
    Stats(crate::api::stats::ShardStats, Vec<crate::api::stats::TopicStats>),
    Requests(crate::metrics::shard::ShardFigures),
    Resynced {
        logs: u64,
        batches: u64,
    },
    /// A replica's answer to a fencing round: its messages' last epoch and durable end.
    Fenced {
        last_epoch: u64,
        durable_end: u64,
    },
    /// Topics, by id (`ElectionsWanted`).
    Topics(Vec<TopicId>),
    Progress(ReplicaProgress),
    /// A source's answer to `ApplySources`: its log's assigned end when the count it now
    /// applies came (`topic::sources::SourceSet::fence`), and each subscription's ack floor on
    /// it, by subscription id, at most `SUBSCRIPTIONS_PER_SOURCE_LISTED_MAX`.
    SourcesApplied {
        fence: u64,
        floors: Vec<(u64, u64)>,
    },
}

#[derive(Debug)]
pub struct ControlEnvelope {
    pub request_id: u64,
    pub request: ControlRequest,
}

#[derive(Debug)]
pub struct ControlReply {
    pub request_id: u64,
    pub result: Result<ControlOk, Status>,
}

/// Bound of each router↔forwarder channel.
pub const CONTROL_CHANNEL_CAPACITY: usize = 256;
