//! Frame bodies. Each is an rkyv archive read in place after validation; see `frame`.
//! Daemon-side types never derive rkyv: handlers convert at the edge.

use rkyv::{Archive, Deserialize, Serialize};

macro_rules! wire_type {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
        #[rkyv(derive(Debug))]
        pub struct $name { $($(#[$field_meta])* pub $field: $ty),* }
    };
}

wire_type! {
    /// The body of every error reply.
    pub struct ErrorBody { pub code: u32, pub message: String }
}

wire_type! {
    /// A body with nothing in it.
    pub struct Empty {}
}

wire_type! {
    pub struct HelloRequest { pub protocol_version: u32, pub client_name: String }
}

wire_type! {
    /// The server's version and the limits it enforces, so a client can check before sending.
    pub struct HelloResponse {
        pub protocol_version: u32,
        pub server_version: String,
        pub frame_body_bytes_max: u32,
        pub message_bytes_max: u32,
        pub publish_batch_messages_max: u32,
    }
}

wire_type! {
    /// A credential: an access token (the daemon keeps only its SHA-256).
    pub struct AuthenticateRequest { pub token: String }
}

wire_type! {
    /// The principal the connection now acts as.
    pub struct AuthenticateResponse { pub principal: String }
}

wire_type! {
    /// A request that names one resource.
    pub struct NameRequest { pub name: String }
}

wire_type! {
    pub struct ListRequest {
        /// Only list subscriptions of this topic (ListSubscriptions); empty for all.
        pub topic: String,
        pub page_size: u32,
        /// Name to start after; empty for the first page.
        pub page_token: String,
    }
}

wire_type! {
    pub struct Topic {
        pub name: String,
        /// How long messages are kept after publish even once acknowledged; 0 means not set:
        /// messages are kept until every subscription has acknowledged them.
        pub message_retention_seconds: u64,
    }
}

wire_type! {
    /// A topic's creation with the number of nodes that hold its messages (odd; 0 for the
    /// cluster's default: its nodes, at most 3).
    pub struct CreateTopicRequest { pub topic: Topic, pub replicas: u32 }
}

wire_type! {
    /// `CreateTopicRequest` with the number of the topic's publish sources (each a replicated
    /// log with its own leader, on a forwarder shard of its own; 0 for one).
    pub struct CreateTopicWithSourcesRequest { pub topic: Topic, pub replicas: u32, pub sources: u32 }
}

wire_type! {
    /// A topic's sources' number from now on: at least what it has.
    pub struct UpdateTopicSourcesRequest { pub name: String, pub sources: u32 }
}

wire_type! {
    /// A topic with its replicas' number and each publish source's leader, source 0 first.
    pub struct TopicWithSources { pub topic: Topic, pub replicas: u32, pub sources: Vec<TopicSource> }
}

wire_type! {
    /// A topic's sources' policy, asked for (`change` false), or changed to following its load
    /// (`change` true) from `sources_min` to `sources_max` sources (0: as many as placement can
    /// give, at most the daemon's `SOURCES_AUTO_MAX`).
    pub struct TopicSourcePolicyRequest {
        pub name: String,
        pub change: bool,
        pub sources_min: u32,
        pub sources_max: u32,
    }
}

wire_type! {
    /// A topic with its sources, and whether their number follows its load (`auto`), between
    /// `sources_min` and `sources_max` (both 0 when it is fixed).
    pub struct TopicWithSourcePolicy {
        pub topic: TopicWithSources,
        pub auto: bool,
        pub sources_min: u32,
        pub sources_max: u32,
    }
}

wire_type! {
    /// One of a topic's publish sources: its number and where its leader is.
    pub struct TopicSource { pub number: u32, pub leader_node: u64, pub leader_shard: u32 }
}

wire_type! {
    pub struct TopicList { pub topics: Vec<Topic>, pub next_page_token: String }
}

wire_type! {
    pub struct Subscription {
        pub name: String,
        pub topic: String,
        /// 0 means the default (10 s); otherwise 10 to 600.
        pub ack_deadline_seconds: u32,
        pub retain_acked_messages: bool,
        /// 0 means the default (7 days).
        pub message_retention_seconds: u64,
        pub enable_message_ordering: bool,
        pub filter: String,
        pub dead_letter_topic: String,
        pub max_delivery_attempts: u32,
        /// The retry policy, 0 to 600 each, the minimum at most the maximum; both 0: none (a
        /// failed message is delivered again at once). A minimum of 0 is no wait (send 10 for
        /// Pub/Sub's default); a maximum of 0 with a minimum means the default (600).
        pub minimum_backoff_seconds: u32,
        pub maximum_backoff_seconds: u32,
        /// 0 means the default (31 days); `EXPIRATION_TTL_SECONDS_NEVER` (u64::MAX): never.
        pub expiration_ttl_seconds: u64,
    }
}

wire_type! {
    pub struct SubscriptionList { pub subscriptions: Vec<Subscription>, pub next_page_token: String }
}

wire_type! {
    /// Where the daemon pushes a subscription's messages (Pub/Sub's `PushConfig`). An empty
    /// endpoint: the subscription pulls, and the other fields are not read.
    pub struct PushConfig {
        /// An absolute `http://` or `https://` URL.
        pub endpoint: String,
        /// Pub/Sub's push attributes (`x-goog-version`), kept as given.
        pub attributes: Vec<Attribute>,
        /// The body is the message's data alone (Pub/Sub's `no_wrapper`), not the JSON
        /// envelope (its `pubsub_wrapper`, the default).
        pub no_wrapper: bool,
        /// With `no_wrapper`: the message's attributes and metadata as HTTP headers.
        pub write_metadata: bool,
        /// Not empty: each request carries an OIDC token for this service account.
        pub service_account_email: String,
        /// The token's audience; empty: the endpoint's URL.
        pub audience: String,
    }
}

wire_type! {
    /// A subscription with its push configuration, the body of commands 26 to 28. Commands 20
    /// to 25 keep `Subscription` as it was, so that clients built before push subscriptions
    /// still create and read subscriptions (a push one read so shows no push configuration).
    pub struct SubscriptionWithPush { pub subscription: Subscription, pub push: PushConfig }
}

wire_type! {
    /// UpdateSubscriptionWithPush: `UpdateSubscriptionRequest`'s fields, and `push_config`
    /// (read from `subscription.push`; an empty endpoint makes the subscription pull).
    pub struct UpdateSubscriptionWithPushRequest { pub subscription: SubscriptionWithPush, pub update_mask: Vec<String> }
}

wire_type! {
    /// ModifyPushConfig: a subscription's push configuration alone; an empty endpoint makes it
    /// pull.
    pub struct ModifyPushConfigRequest { pub subscription: String, pub push: PushConfig }
}

wire_type! {
    /// A subscription with its push configuration and the project its push requests name it in
    /// (`projects/{push_project}/subscriptions/S`; empty: `ringpost`, as without it), the body
    /// of commands 90 to 92. Commands 26 to 29 keep their bodies, so that clients built before
    /// the project still configure push (in the default project) and read it.
    pub struct SubscriptionWithPushProject { pub subscription: SubscriptionWithPush, pub push_project: String }
}

wire_type! {
    /// UpdateSubscriptionWithPushProject: `UpdateSubscriptionWithPushRequest`, and the project
    /// the push configuration names the subscription in, read where the mask names `push_config`.
    pub struct UpdateSubscriptionWithPushProjectRequest {
        pub request: UpdateSubscriptionWithPushRequest,
        pub push_project: String,
    }
}

wire_type! {
    /// ModifyPushConfigWithProject: `ModifyPushConfigRequest`, and the project the push
    /// configuration names the subscription in.
    pub struct ModifyPushConfigWithProjectRequest { pub request: ModifyPushConfigRequest, pub push_project: String }
}

wire_type! {
    /// UpdateTopic: the topic's new values and the fields of them to change, by Pub/Sub's
    /// names (`message_retention_duration`); fields the mask leaves out are not read.
    pub struct UpdateTopicRequest { pub topic: Topic, pub update_mask: Vec<String> }
}

wire_type! {
    /// UpdateSubscription: the subscription's new values and the fields of them to change, by
    /// Pub/Sub's names: `ack_deadline_seconds`, `retain_acked_messages`,
    /// `message_retention_duration`, `expiration_policy`, `dead_letter_policy` (topic and
    /// attempts; an empty topic removes the policy), `retry_policy` (both backoffs; both 0
    /// remove it). Fields the mask leaves out are not read.
    pub struct UpdateSubscriptionRequest { pub subscription: Subscription, pub update_mask: Vec<String> }
}

wire_type! {
    pub struct ShardAddress { pub shard: u32, pub address: String }
}

wire_type! {
    /// The forwarders to use for a resource, most preferred first.
    pub struct LookupResponse { pub forwarders: Vec<ShardAddress> }
}

wire_type! {
    /// LookupSources: `name` is a subscription's when `subscription`, else a topic's.
    pub struct LookupSourcesRequest { pub name: String, pub subscription: bool }
}

wire_type! {
    /// One publish source's number and its forwarders, most preferred first (its leader's).
    pub struct SourceRoute { pub number: u32, pub forwarders: Vec<ShardAddress> }
}

wire_type! {
    /// Every source of a topic, by number from 0, retiring ones included (a subscriber drains
    /// them); `active` is how many take publishes, sources `0..active`, the count the key map
    /// (`source_of_key`) is computed with.
    pub struct LookupSourcesResponse { pub sources: Vec<SourceRoute>, pub active: u32 }
}

wire_type! {
    pub struct Attribute { pub key: String, pub value: String }
}

wire_type! {
    pub struct PubsubMessage {
        pub data: Vec<u8>,
        pub attributes: Vec<Attribute>,
        pub ordering_key: String,
    }
}

wire_type! {
    pub struct PublishRequest { pub topic: String, pub messages: Vec<PubsubMessage> }
}

wire_type! {
    /// One id per published message, in request order. Ids are the messages' offsets in the
    /// topic's log, unique per topic.
    pub struct PublishResponse { pub message_ids: Vec<u64> }
}

wire_type! {
    pub struct PullRequest {
        pub subscription: String,
        pub max_messages: u32,
        /// How long to wait for at least one message; 0 returns at once.
        pub wait_ms: u32,
    }
}

wire_type! {
    pub struct ReceivedMessage {
        pub ack_id: String,
        pub message_id: u64,
        pub publish_time_ms: u64,
        pub data: Vec<u8>,
        pub attributes: Vec<Attribute>,
        pub ordering_key: String,
        pub delivery_attempt: u32,
    }
}

wire_type! {
    pub struct PullResponse { pub received_messages: Vec<ReceivedMessage> }
}

wire_type! {
    pub struct AcknowledgeRequest { pub subscription: String, pub ack_ids: Vec<String> }
}

wire_type! {
    pub struct ModifyAckDeadlineRequest {
        pub subscription: String,
        pub ack_ids: Vec<String>,
        /// 0 to 600; 0 is a nack.
        pub ack_deadline_seconds: u32,
    }
}

wire_type! {
    pub struct InvalidAckId { pub ack_id: String, pub reason: String }
}

wire_type! {
    /// Which ack ids were refused, and why. The others took effect durably.
    pub struct AckResponse { pub invalid_ack_ids: Vec<InvalidAckId> }
}

wire_type! {
    pub struct DirectoryStatus {
        pub path: String,
        /// Why the directory is fenced; empty when it is healthy.
        pub fenced: String,
    }
}

wire_type! {
    /// A topic left unserved at start because its logs could not be recovered
    /// (`ringpostd --quarantine-damaged`).
    pub struct QuarantinedTopic {
        pub name: String,
        /// Recovery's report of the damage.
        pub reason: String,
    }
}

wire_type! {
    /// Latencies a shard measured over its last 10 to 20 seconds; all zero when it measured
    /// none.
    pub struct LatencySummary {
        pub count: u64,
        pub p50_us: u64,
        pub p99_us: u64,
        pub p999_us: u64,
        pub max_us: u64,
    }
}

wire_type! {
    /// One shard: the router (`shard` = u32::MAX) or a forwarder.
    pub struct ShardStats {
        pub shard: u32,
        pub topics: u32,
        pub directories: Vec<DirectoryStatus>,
        /// Copies of batches rewritten from good ones since start.
        pub repairs: u64,
        pub quarantined: Vec<QuarantinedTopic>,
        /// Publish requests, from the validated request to its durable result: the shard's
        /// share of a publisher's publish-ack latency.
        pub publish_latency: LatencySummary,
        /// Commits of the shard's logs (messages and acknowledgements), from the write issued
        /// to durable in a quorum of data directories: the disk's share.
        pub commit_latency: LatencySummary,
    }
}

wire_type! {
    pub struct SubscriptionStats {
        pub name: String,
        /// Messages published and not acknowledged.
        pub backlog_messages: u64,
        /// Messages delivered whose lease has not ended.
        pub outstanding_messages: u64,
        pub delivered_total: u64,
        pub expired_total: u64,
        /// Age of the oldest unacknowledged message; 0 when there is none.
        pub oldest_unacked_age_ms: u64,
        /// Time since the subscription was last pulled from or acknowledged (or since start).
        pub idle_ms: u64,
        /// Deliveries and acknowledgements per second over the last `RATE_WINDOW_SECONDS` seconds.
        pub delivered_per_second: u64,
        pub acked_per_second: u64,
    }
}

wire_type! {
    pub struct TopicStats {
        pub name: String,
        pub shard: u32,
        /// Oldest offset still stored, and one past the newest.
        pub first_offset: u64,
        pub end_offset: u64,
        /// Bytes of segment files in one data directory.
        pub disk_bytes: u64,
        /// Messages published per second over the last few seconds.
        pub published_per_second: u64,
        pub subscriptions: Vec<SubscriptionStats>,
        /// This replica's part when the topic is replicated across nodes; `None` for a topic
        /// of one replica.
        pub replication: Option<ReplicaStats>,
    }
}

wire_type! {
    /// One replica of a replicated topic, as its forwarder sees it.
    pub struct ReplicaStats {
        /// It leads the topic (serves clients), or else follows another replica.
        pub leader: bool,
        /// The leader epoch it leads, or last synced with as a follower (0: none yet).
        pub epoch: u64,
        /// One past the last message durable on this node, and one past the last a quorum
        /// of replicas holds.
        pub durable_end: u64,
        pub committed_end: u64,
        /// The leader's view of each follower; empty on a follower.
        pub followers: Vec<FollowerStats>,
    }
}

wire_type! {
    /// A follower as its leader last heard from it.
    pub struct FollowerStats {
        /// Its forwarder as the catalog names it, and the address it is reached at.
        pub shard: u32,
        pub address: String,
        /// One past the last message it holds durably, and how many the leader holds beyond.
        pub durable_end: u64,
        pub lag_messages: u64,
        /// Journal entries (acknowledgements, seeks) the leader holds durably beyond it.
        pub journal_lag_entries: u64,
        /// Since the leader sent the last request it answered; `None` before its first answer.
        pub answered_ms_ago: Option<u64>,
    }
}

wire_type! {
    /// The daemon process as the kernel sees it.
    pub struct ProcessStats {
        /// Resident memory (RSS), bytes.
        pub resident_bytes: u64,
        /// File descriptors open, and the soft limit on them.
        pub open_files: u64,
        pub open_files_limit: u64,
    }
}

wire_type! {
    pub struct StatsResponse {
        pub shards: Vec<ShardStats>,
        pub topics: Vec<TopicStats>,
        pub process: ProcessStats,
    }
}

wire_type! {
    /// `StatsWithPush`'s answer: `Stats`'s, and each push subscription's pushing. A body of its
    /// own, since an rkyv body cannot grow a field that an older reader would skip: a client
    /// of the version before push subscriptions asks `Stats` and reads `StatsResponse` alike.
    pub struct StatsWithPushResponse {
        pub stats: StatsResponse,
        /// Every push subscription the answering node serves, in the order of `stats.topics`.
        pub push_subscriptions: Vec<PushSubscriptionStats>,
    }
}

wire_type! {
    /// A push subscription's delivery, as the forwarder that pushes it sees it: its push
    /// task's figures since the task started (when the forwarder took the subscription, or it
    /// was made a push one). Its backlog is its `SubscriptionStats`'.
    pub struct PushSubscriptionStats {
        pub topic: String,
        pub subscription: String,
        /// The URL pushed to.
        pub endpoint: String,
        /// Pushes that may be outstanding now (its flow control's window); 0 while no task
        /// pushes it.
        pub window: u32,
        /// Pushes sent and not answered yet.
        pub outstanding: u32,
        /// How the last push that did not acknowledge ended, and how long ago; kept after later
        /// successes (`failures_in_a_row` says whether the endpoint still fails).
        pub last_error: Option<PushError>,
        /// Pushes that did not acknowledge since the last one that did.
        pub failures_in_a_row: u64,
        /// Pushes answered, by outcome class: `1xx` to `5xx` (the status's hundreds),
        /// `connection_error`, `timeout`.
        pub requests: Vec<PushRequestCount>,
    }
}

wire_type! {
    /// A push that did not acknowledge: an HTTP status, a connection error, or no answer within
    /// the ack deadline.
    pub struct PushError { pub reason: String, pub ms_ago: u64 }
}

wire_type! {
    pub struct PushRequestCount { pub class: String, pub count: u64 }
}

wire_type! {
    pub struct ResyncDirectoryRequest { pub index: u32 }
}

wire_type! {
    pub struct ResyncDirectoryResponse { pub logs_resynced: u64, pub batches_copied: u64 }
}

wire_type! {
    /// Adds node `node_id`, whose cluster port is at `cluster_address`, to the cluster.
    pub struct ClusterAddNodeRequest {
        pub node_id: u64,
        pub cluster_address: String,
        /// A voter of the catalog, or else a learner (it holds topics either way).
        pub voter: bool,
    }
}

wire_type! {
    pub struct ClusterRemoveNodeRequest { pub node_id: u64 }
}

wire_type! {
    /// Node `node_id` drains (`draining`), or no longer does.
    pub struct ClusterDrainRequest { pub node_id: u64, pub draining: bool }
}

wire_type! {
    /// A draining node and what it still holds; it is empty once all three are none.
    pub struct NodeDrainStatus {
        pub node_id: u64,
        /// Replicated topics it still leads.
        pub leaderships: u64,
        /// Whether it still leads the catalog.
        pub leads_catalog: bool,
        /// Topics of one replica on it (which cannot move without their data): some names,
        /// and how many in all.
        pub single_replica_topics: Vec<String>,
        pub single_replica_count: u64,
    }
}

wire_type! {
    /// A routing restriction: the clients authenticated as `principal`, or connecting from the
    /// range `from` (`ADDRESS/PREFIX`; exactly one of the two is set), may be handed only
    /// `nodes`' forwarders (`allow`), or none of them.
    pub struct RoutingRule {
        pub principal: String,
        pub from: String,
        pub allow: bool,
        pub nodes: Vec<u64>,
    }
}

wire_type! {
    /// `rule` added (`add`) or removed (the same rule as added).
    pub struct ClusterRestrictRequest { pub add: bool, pub rule: RoutingRule }
}

wire_type! {
    /// Every routing restriction, in the order they were added.
    pub struct ClusterRestrictionsResponse { pub rules: Vec<RoutingRule> }
}

wire_type! {
    /// Every draining node, in id order.
    pub struct ClusterDrainStatusResponse { pub nodes: Vec<NodeDrainStatus> }
}

wire_type! {
    /// One member of the catalog's raft group.
    pub struct NodeStatus {
        pub node_id: u64,
        /// The address its peers reach it at.
        pub cluster_address: String,
        /// Where its router serves clients; empty until it registered.
        pub router_address: String,
        /// A voter, or else a learner.
        pub voter: bool,
        /// "leader", "follower", "candidate", "learner", "unreachable", "leader-without-quorum",
        /// "removed", "joining", or "unknown" when only the leader could tell.
        pub role: String,
        /// The leader's view: the highest catalog index this member is known to hold; `None`
        /// when unknown (the answering node does not lead).
        pub matched_index: Option<u64>,
        /// The leader's view: milliseconds since this member last answered it (0 for the leader);
        /// `None` when unknown (never, or the leader's view was not had).
        pub heard_ms_ago: Option<u64>,
    }
}

wire_type! {
    /// The catalog's raft group as the answering node sees it.
    pub struct ClusterStatusResponse {
        /// The node that answered.
        pub node_id: u64,
        /// The catalog's leader as that node can vouch for it; `None` during an election, on a
        /// leader cut off from its majority and on a node that no longer hears its leader.
        pub catalog_leader: Option<u64>,
        pub term: u64,
        /// The last catalog index in its log and the last it applied; `None`: none yet.
        pub last_log_index: Option<u64>,
        pub last_applied_index: Option<u64>,
        /// Every member, voters and learners, in id order.
        pub nodes: Vec<NodeStatus>,
        /// Topics as the answering node's catalog places them, in name order (at most a
        /// thousand), and how many more there are.
        pub topics: Vec<TopicPlacement>,
        pub topics_omitted: u64,
        /// Why the answering node does not serve as a member, if it does not (as `/readyz`).
        pub not_serving: Option<String>,
        /// Whose view the members' roles and liveness are when not the leader's; empty when
        /// they are the leader's.
        pub note: String,
    }
}

wire_type! {
    /// Where a replicated topic's replicas are.
    pub struct TopicPlacement {
        pub name: String,
        /// The node whose replica leads, and the leader epoch.
        pub leader_node: u64,
        pub epoch: u64,
        /// Every node holding a replica, the leader among them.
        pub replica_nodes: Vec<u64>,
    }
}

wire_type! {
    pub struct StreamingPullRequest {
        pub subscription: String,
        /// Lease of the messages this stream receives; 0 uses the subscription's ack deadline.
        pub stream_ack_deadline_seconds: u32,
        /// Flow control: most messages and bytes delivered and not yet acknowledged on this
        /// stream; 0 means unlimited.
        pub max_outstanding_messages: u64,
        pub max_outstanding_bytes: u64,
    }
}

wire_type! {
    /// Seek to a time (milliseconds since the Unix epoch): messages published before it count as
    /// acknowledged, messages from it on as not, including ones acknowledged before if they are
    /// still retained.
    pub struct SeekRequest {
        pub subscription: String,
        /// Seek to this time, when `snapshot` is empty.
        pub time_ms: u64,
        /// Seek to this snapshot's acknowledgements instead (it must be of the same topic).
        pub snapshot: String,
    }
}

wire_type! {
    pub struct SnapshotRequest { pub name: String, pub subscription: String }
}

wire_type! {
    pub struct Snapshot {
        pub name: String,
        pub topic: String,
        /// When the snapshot stops keeping messages (milliseconds since the Unix epoch).
        pub expire_time_ms: u64,
    }
}

wire_type! {
    pub struct SnapshotList { pub snapshots: Vec<Snapshot>, pub next_page_token: String }
}

wire_type! {
    /// A data-plane request another node's forwarder carries here for its client (`Carried`):
    /// the request's command and body as the client would send them, and who the carrying node
    /// authenticated the client as (`None`: anonymous), which this node's rules then decide for.
    /// `client_keeps_leases`: a streaming pull's client reconnects holding what the stream
    /// delivered (a gRPC stream's `client_id`), so the stream's leases outlive it.
    pub struct CarriedRequest {
        pub principal: Option<String>,
        pub command: u16,
        pub body: Vec<u8>,
        pub client_keeps_leases: bool,
    }
}

wire_type! {
    /// A message between two nodes' routers on their cluster ports: bytes in the encoding of
    /// the daemon's own durable entries (the catalog's raft messages, control requests), which
    /// the daemon decodes defensively; the wire only frames them.
    pub struct PeerMessage { pub bytes: Vec<u8> }
}

wire_type! {
    /// A schema's revision (Pub/Sub's `Schema`). `schema_type`: 1 Protocol Buffer, 2 Avro, as
    /// Pub/Sub numbers them; `definition` is empty in a BASIC view.
    pub struct Schema {
        pub name: String,
        pub schema_type: u8,
        pub definition: String,
        /// Eight hex digits, unique within the schema.
        pub revision_id: String,
        /// When the revision was committed (milliseconds since the Unix epoch).
        pub revision_create_time_ms: u64,
    }
}

wire_type! {
    /// CreateSchema and CommitSchema: schema `name` with a revision of `definition`;
    /// ValidateSchema: `definition` checked (`name` not read).
    pub struct SchemaRequest { pub name: String, pub schema_type: u8, pub definition: String }
}

wire_type! {
    /// GetSchema: schema `name`'s revision `revision_id` (empty: its newest), with its
    /// definition when `full`.
    pub struct GetSchemaRequest { pub name: String, pub revision_id: String, pub full: bool }
}

wire_type! {
    /// ListSchemas: one page of the schemas, by name (each its newest revision), with their
    /// definitions when `full`; ListSchemaRevisions: one page of schema `name`'s revisions,
    /// newest first (`name` is not read by ListSchemas).
    pub struct ListSchemasRequest { pub name: String, pub page_size: u32, pub page_token: String, pub full: bool }
}

wire_type! {
    pub struct SchemaList { pub schemas: Vec<Schema>, pub next_page_token: String }
}

wire_type! {
    /// RollbackSchema (a new revision of revision `revision_id`'s definition) and
    /// DeleteSchemaRevision.
    pub struct SchemaRevisionRequest { pub name: String, pub revision_id: String }
}

wire_type! {
    /// ValidateMessage: `message` checked against schema `name`'s revision `revision_id` (empty:
    /// its newest) or, when `name` is empty, against `definition` of `schema_type`; `encoding`:
    /// 1 JSON, 2 binary, as Pub/Sub numbers them.
    pub struct ValidateMessageRequest {
        pub name: String,
        pub revision_id: String,
        pub schema_type: u8,
        pub definition: String,
        pub encoding: u8,
        pub message: Vec<u8>,
    }
}

wire_type! {
    /// A topic's schema settings (Pub/Sub's `SchemaSettings`): an empty `schema` is none; an
    /// empty revision id is no bound; `encoding` as in `ValidateMessageRequest`.
    pub struct SchemaSettings {
        pub schema: String,
        pub encoding: u8,
        pub first_revision_id: String,
        pub last_revision_id: String,
    }
}

wire_type! {
    /// CreateTopicWithSchema: `CreateTopicWithSourcesRequest` with the topic's schema settings.
    pub struct CreateTopicWithSchemaRequest {
        pub topic: CreateTopicWithSourcesRequest,
        pub schema: SchemaSettings,
    }
}

wire_type! {
    /// UpdateTopicSchema: topic `name`'s schema settings from now on (an empty schema: none).
    pub struct UpdateTopicSchemaRequest { pub name: String, pub schema: SchemaSettings }
}

wire_type! {
    /// A topic with its sources and its schema settings (an empty schema: none).
    pub struct TopicWithSchema { pub topic: TopicWithSources, pub schema: SchemaSettings }
}
