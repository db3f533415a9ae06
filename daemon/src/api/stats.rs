//! What the stats operation reports: every shard, every topic with its subscriptions, and the
//! process. The router gathers it from the forwarders (`ControlOk::Stats`); a protocol encodes
//! it (`protocol::native::stats` for the native one).

pub use crate::metrics::latency::LatencySummary;
pub use crate::metrics::process::ProcessStats;

/// The whole daemon: the router's shard first, then each forwarder's; topics in name order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    pub shards: Vec<ShardStats>,
    pub topics: Vec<TopicStats>,
    pub process: ProcessStats,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirectoryStatus {
    pub path: String,
    /// Why the directory is fenced; empty when it is healthy.
    pub fenced: String,
}

/// A topic left unserved at start because its logs could not be recovered
/// (`ringpostd --quarantine-damaged`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuarantinedTopic {
    pub name: String,
    /// Recovery's report of the damage.
    pub reason: String,
}

/// One shard: the router (`shard` = u32::MAX) or a forwarder.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardStats {
    pub shard: u32,
    pub topics: u32,
    pub directories: Vec<DirectoryStatus>,
    /// Copies of batches rewritten from good ones since start.
    pub repairs: u64,
    pub quarantined: Vec<QuarantinedTopic>,
    /// Publish requests, from the checked request to its durable result: the shard's share of
    /// a publisher's publish-ack latency.
    pub publish_latency: LatencySummary,
    /// Commits of the shard's logs (messages and acknowledgements), from the write issued to
    /// durable in a quorum of data directories: the disk's share.
    pub commit_latency: LatencySummary,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionStats {
    pub name: String,
    /// Messages published and not acknowledged.
    pub backlog_messages: u64,
    /// Messages delivered whose lease has not ended.
    pub outstanding_messages: u64,
    pub delivered_total: u64,
    /// Deliveries after a message's first (after a nack or an expired lease).
    pub redelivered_total: u64,
    pub acked_total: u64,
    pub expired_total: u64,
    /// Messages published to the dead-letter topic.
    pub dead_lettered_total: u64,
    /// Bytes of the topic's log from the oldest unacknowledged message on, as stored.
    pub backlog_bytes: u64,
    /// Streaming pulls open on it.
    pub open_streams: u64,
    /// Age of the oldest unacknowledged message; 0 when there is none.
    pub oldest_unacked_age_ms: u64,
    /// Time since the subscription was last pulled from or acknowledged (or since start).
    pub idle_ms: u64,
    /// Deliveries and acknowledgements per second over the last
    /// `metrics::rate::RATE_WINDOW_SECONDS` seconds.
    pub delivered_per_second: u64,
    pub acked_per_second: u64,
    /// Its pushing, for a push subscription; `None` for a pull one.
    pub push: Option<PushStats>,
}

/// A push subscription's delivery, as the shard that pushes it sees it. The figures are its
/// push task's, since the task started (when the shard took the subscription, or it was made
/// a push one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushStats {
    /// The URL pushed to.
    pub endpoint: String,
    /// Pushes that may be outstanding now (its flow control's window); 0 while no task
    /// pushes it (the shard has no HTTP client, or its task is starting).
    pub window: u32,
    /// Pushes sent and not answered yet.
    pub outstanding: u32,
    /// How the last push that did not acknowledge ended (an HTTP status, a connection error,
    /// no answer within the ack deadline), and how long ago; kept after later successes.
    pub last_error: Option<PushError>,
    /// Pushes that did not acknowledge since the last one that did: 0 while the endpoint
    /// acknowledges.
    pub failures_in_a_row: u64,
    /// Pushes answered, by outcome class (`push::client::PUSH_OUTCOME_CLASSES`: `1xx` to `5xx`,
    /// `connection_error`, `timeout`), in that order.
    pub requests_by_class: Vec<(String, u64)>,
}

/// A push that did not acknowledge.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushError {
    pub reason: String,
    pub ms_ago: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicStats {
    pub name: String,
    pub shard: u32,
    /// Which of its topic's publish sources this shard's log is (the unit's own, set at
    /// attach), and whether the topic has several: filled by the router from its catalog, so
    /// that `/metrics` labels the figures of a topic of several sources by source. Neither is
    /// in the control codec nor the native stats answer, whose bytes older peers read.
    pub source: crate::ids::SourceId,
    pub several_sources: bool,
    /// Oldest offset still stored, and one past the newest.
    pub first_offset: u64,
    pub end_offset: u64,
    /// Bytes of segment files in one data directory.
    pub disk_bytes: u64,
    /// Messages published per second over the last few seconds.
    pub published_per_second: u64,
    /// Messages and their bytes (as stored) published since the shard took the topic.
    pub published_messages_total: u64,
    pub published_bytes_total: u64,
    pub subscriptions: Vec<SubscriptionStats>,
    /// Its replica's part when the topic is replicated across nodes; `None` for a topic of
    /// one replica.
    pub replication: Option<ReplicaStats>,
}

/// One replica of a replicated topic, as its shard sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaStats {
    /// Whether it leads the topic (serves clients) or follows another replica.
    pub leader: bool,
    /// The leader epoch it leads, or last synced with as a follower (0: none yet).
    pub epoch: u64,
    /// One past the last message durable on this node's data directories, and one past the
    /// last a quorum of replicas holds.
    pub durable_end: u64,
    pub committed_end: u64,
    /// The leader's view of each follower; empty on a follower.
    pub followers: Vec<FollowerStats>,
}

/// A follower as its leader last heard from it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FollowerStats {
    /// The follower's forwarder, as the catalog names it, and the address it is reached at.
    pub shard: u32,
    pub address: String,
    /// One past the last message it holds durably.
    pub durable_end: u64,
    /// Messages durable on the leader that it does not hold yet.
    pub lag_messages: u64,
    /// Journal entries (acknowledgements, seeks) durable on the leader that it does not hold.
    pub journal_lag_entries: u64,
    /// Since the leader sent the last request it answered; `None` before its first answer.
    pub answered_ms_ago: Option<u64>,
}
