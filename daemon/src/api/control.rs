//! The control plane's operations on domain types: what the router serves (topics,
//! subscriptions, snapshots, seek, lookups), whichever protocol asked. The native protocol's
//! handlers (`crate::protocol::native::router`) decode each request into these and encode the
//! answers; another protocol would do the same with its own encoding.

/// Pub/Sub's rules for names, settings and their defaults.
pub use crate::api::validate::{
    effective_ack_deadline_seconds, effective_expiration_ttl_seconds, effective_max_delivery_attempts,
    effective_retention_seconds, effective_retry_backoff_seconds, retry_backoff_seconds,
    topic_retention_seconds, validate_labels, validate_name, validate_push_config, validate_push_delivery,
};

/// A resource's labels, Pub/Sub's key-value pairs, kept in key order (as the catalog stores
/// them).
pub use crate::catalog::Labels;

/// A topic as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topic {
    pub name: String,
    /// 0: not set (messages are kept until every subscription has acknowledged them).
    pub message_retention_seconds: u64,
    pub labels: Labels,
    /// How many nodes hold its messages (odd): asked at creation, 0 for the default (the
    /// cluster's nodes, at most 3, odd); reported as it is.
    pub replicas: u32,
    /// How many publish sources it has (each a replicated log with its own leader): asked at
    /// creation, 0 for one; reported as it is.
    pub sources: u32,
    /// Reported only: each source's leader, source 0 first (empty in a request, and in a
    /// listing).
    pub source_leaders: Vec<crate::ids::ShardId>,
    /// Reported only: the bounds its sources follow its load within (`--sources auto`);
    /// `None` when their number is fixed.
    pub source_policy: Option<crate::catalog::SourceBounds>,
}

/// A subscription's settings, which the catalog stores as they are (defaults applied).
pub use crate::catalog::{OidcToken, PushConfig, PushWrapper, SubscriptionSettings};

/// A subscription as clients see it: its settings as stored, or, when it is asked for at
/// creation, as asked (0 or empty asks for the default of a setting).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscription {
    pub name: String,
    /// The topic's name, or `DELETED_TOPIC` once the topic is deleted.
    pub topic: String,
    pub settings: SubscriptionSettings,
    /// Detached (DetachSubscription): it stays in the catalog, but its topic is
    /// `DELETED_TOPIC` and it delivers nothing. Output only: ignored in a creation.
    pub detached: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub name: String,
    /// The topic's name, or `DELETED_TOPIC` once the topic is deleted.
    pub topic: String,
    pub expire_time_ms: u64,
    pub labels: Labels,
}

/// A page of a listing, in name order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListRequest {
    /// Only subscriptions of this topic (subscriptions' listing); empty for all.
    pub topic: String,
    /// 0: `LIST_PAGE_SIZE_DEFAULT`; at most `LIST_PAGE_SIZE_MAX`.
    pub page_size: u32,
    /// The name to start after; empty for the first page.
    pub page_token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// The last name of this page when there are more, else empty.
    pub next_page_token: String,
}

/// The changes of an UpdateTopic, checked; `None` leaves a setting as it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicUpdate {
    pub name: String,
    pub message_retention_seconds: Option<u64>,
    pub labels: Option<Labels>,
    /// Its publish sources' number; only upward (a source is added, none retired).
    pub sources: Option<u32>,
    /// Its publish sources follow its load within these bounds from now on (`--sources auto`);
    /// `sources` fixes their number again.
    pub sources_auto: Option<crate::catalog::SourceBounds>,
}

/// The changes of an UpdateSubscription, checked; `None` leaves a setting as it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionUpdate {
    pub name: String,
    pub ack_deadline_seconds: Option<u32>,
    pub retain_acked_messages: Option<bool>,
    pub message_retention_seconds: Option<u64>,
    pub expiration_ttl_seconds: Option<u64>,
    /// The dead-letter topic (empty: no policy) and its delivery attempts.
    pub dead_letter_policy: Option<(String, u32)>,
    /// Minimum and maximum backoff seconds; (0, 0): no retry policy.
    pub retry_policy: Option<(u32, u32)>,
    pub labels: Option<Labels>,
    pub enable_exactly_once_delivery: Option<bool>,
    /// The push configuration: `Some(None)` makes the subscription pull (Pub/Sub's empty
    /// `push_config`).
    pub push: Option<Option<Box<PushConfig>>>,
}

/// Where a subscription's acknowledgements move to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeekTarget {
    /// The first message published at or after this time.
    Time { time_ms: u64 },
    /// The acknowledgements a snapshot of the same topic captured.
    Snapshot { name: String },
}

/// A forwarder that serves a resource: its shard and the address to reach it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwarderAddress {
    pub shard: crate::ids::ShardId,
    pub address: String,
}

/// One publish source of a topic and the forwarders that serve it, most preferred first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRoute {
    pub source: crate::ids::SourceId,
    pub forwarders: Vec<ForwarderAddress>,
}

/// Every publish source of a topic, source 0 first, retiring ones included (a subscriber still
/// drains them), and how many are active: sources `0..active` take publishes, and `active` is
/// the count the key map (`ringpost_model::sources::source_of_key`) is computed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRoutes {
    pub sources: Vec<SourceRoute>,
    pub active: u32,
}

/// What a resync of a data directory rewrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resynced {
    pub logs: u64,
    pub batches: u64,
}
