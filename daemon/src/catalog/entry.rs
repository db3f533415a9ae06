//! The catalog's entries: the decided commands the catalog's raft log carries (and that its
//! checkpoint restates), with their codec. Each entry holds every decision it needs (ids,
//! creation times, placement, sync points), so applying it is deterministic.
//!
//! Fields added later (labels, exactly-once delivery, detachment, a push configuration, a node's
//! gRPC address) are an optional trailer after an entry's fields, written only when one of them
//! is not its default: an entry that uses none of them is encoded exactly as before, and one
//! written before decodes with the defaults. A node of an older version refuses an entry whose
//! trailer holds a field it does not know (trailing bytes), rather than misread it.
//!
//! Kinds 1 to 11 are those the catalog wrote before it ran on raft; they are still decoded, for
//! the one-time import of such a catalog and because some of them are still written.

use super::schemas::{self, SchemaEntry};
use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::{NodeId, ShardId, SnapshotId, SourceId, TopicId, SOURCES_PER_TOPIC_MAX};
use std::rc::Rc;

const KIND_BOOT: u8 = 1;
const KIND_TOPIC_CREATED: u8 = 2;
const KIND_TOPIC_DELETED: u8 = 3;
const KIND_SUBSCRIPTION_CREATED: u8 = 4;
const KIND_SUBSCRIPTION_DELETED: u8 = 5;
const KIND_SNAPSHOT_CREATED: u8 = 6;
const KIND_SNAPSHOT_DELETED: u8 = 7;
/// Deletions that carry the record's name beside its id, so that applying one is a lookup, not
/// a scan of every record (kinds 5 and 7, written before, are still read).
const KIND_SUBSCRIPTION_DELETED_NAMED: u8 = 8;
const KIND_SNAPSHOT_DELETED_NAMED: u8 = 9;
/// Updates of a live topic or subscription (UpdateTopic, UpdateSubscription): each restates
/// every setting an update may change, so applying one needs nothing from the entries before.
const KIND_TOPIC_UPDATED: u8 = 10;
const KIND_SUBSCRIPTION_UPDATED: u8 = 11;
/// A topic's creation with its creation time and its forwarder shard, decided by the leader.
const KIND_TOPIC_CREATED_PLACED: u8 = 12;
/// A subscription's creation with its creation time.
const KIND_SUBSCRIPTION_CREATED_AT: u8 = 13;
/// A topic moved to another forwarder shard (when the shard it was placed on is gone).
const KIND_TOPIC_PLACED: u8 = 14;
/// The next id the catalog hands out, as a checkpoint restates it.
const KIND_NEXT_ID: u8 = 15;
/// A snapshot's labels after an UpdateSnapshot.
const KIND_SNAPSHOT_UPDATED: u8 = 16;
/// A subscription detached from its topic (DetachSubscription).
const KIND_SUBSCRIPTION_DETACHED: u8 = 17;
const KIND_NODE_REGISTERED: u8 = 18;
/// A topic's creation with its replicas and their epoch, in a cluster where it has more than
/// one: kind 12's fields, then the replicas and the epoch, then the labels' trailer.
const KIND_TOPIC_CREATED_REPLICATED: u8 = 19;
/// A replicated topic's new leader, elected at a new epoch after a fencing round.
const KIND_TOPIC_LEADER_ELECTED: u8 = 20;
/// A node left the cluster (`ringpost cluster remove-node`).
const KIND_NODE_REMOVED: u8 = 21;
/// A replicated topic's replicas after one was added or removed (a replica move's steps).
const KIND_TOPIC_REPLICAS_CHANGED: u8 = 22;
/// One more publish source of a topic (`SourceRecord`). A node of the version before sources
/// refuses the kind as unknown, so it never takes a topic of several sources for one of one.
const KIND_SOURCE_ADDED: u8 = 23;
/// A subscription's creation on a topic of several sources: each later source's sync point,
/// then kind 13's fields. Written only when the topic has several sources, so a subscription
/// of a topic of one is kind 13 as before; a node of the version before refuses the kind as
/// unknown rather than serve the subscription from offset 0 of every source but the first.
const KIND_SUBSCRIPTION_CREATED_WITH_SOURCES: u8 = 24;
/// A node drained (`ringpost cluster drain`) or undrained: a version before it refuses the
/// kind (unknown), never reading it as another entry.
const KIND_NODE_DRAINING: u8 = 25;
/// The routing restrictions, whole, after one was added or removed.
const KIND_ROUTING_RULES_SET: u8 = 26;
/// A topic's highest active source retires (`CatalogEntry::SourceRetiring`): a node of the
/// version before refuses the kind as unknown, never counting the source as taking publishes.
const KIND_SOURCE_RETIRING: u8 = 28;
/// A retiring source, delivered out, is deleted (`CatalogEntry::SourceDeleted`).
const KIND_SOURCE_DELETED: u8 = 29;
/// A topic's publish sources following its load (`ringpost topic update --sources auto`), with
/// their bounds, or fixed again. A topic whose count was only ever fixed never writes it, so its
/// entries are the bytes of the version before; a version before it refuses the kind (unknown)
/// rather than keep a followed topic's count fixed unseen.
const KIND_SOURCE_POLICY_SET: u8 = 27;
/// The delivery gate of a topic's key map (docs/SOURCES.md, rules 2 and 3), in one of three
/// forms named by the byte after the kind: a topic's last change of its active count as a
/// checkpoint restates it (`SourceGate`), a subscription that passed a change
/// (`SourcesPassed`), or a change that every source losing keys in it applied
/// (`SourcesApplied`). A
/// node of the version before refuses the kind as unknown rather than deliver a moved key out
/// of order. A topic whose count never changed writes neither.
const KIND_SOURCE_GATE: u8 = 30;
const GATE_FORM_CHANGE: u8 = 0;
const GATE_FORM_PASSED: u8 = 1;
const GATE_FORM_APPLIED: u8 = 2;
// Kinds 31 to 34 are the schemas' (`catalog::schemas`).

/// A topic's shard in entries written before placement was decided in the entry (kind 2):
/// the import places those topics once.
pub const SHARD_UNPLACED: ShardId = ShardId::from_global(u32::MAX);

/// The most replicas a topic may have: one per voter of the largest cluster.
pub const REPLICAS_MAX: usize = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub id: SnapshotId,
    pub name: String,
    pub topic_id: TopicId,
    pub expire_time_ms: u64,
    pub labels: Labels,
}

/// Pub/Sub's labels of a resource, stored and returned as given (checked by the router).
pub type Labels = std::collections::BTreeMap<String, String>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    pub id: TopicId,
    pub name: Rc<str>,
    /// 0: not set (messages are kept until every subscription has acknowledged them).
    pub message_retention_seconds: u64,
    /// The forwarder shard that serves the topic, as decided when it was created.
    pub shard: ShardId,
    /// Milliseconds since the Unix epoch; 0 for topics created before it was recorded.
    pub created_ms: u64,
    pub labels: Labels,
    /// Every forwarder holding a replica of the topic's log, `shard` (its leader) among them
    /// (first when the topic was created); empty for a topic with one replica, on `shard`
    /// alone.
    pub replicas: Vec<ShardId>,
    /// The leader's epoch: what every batch it writes carries and every replica checks
    /// (`Log::append_at`). 0 for a topic with one replica.
    pub epoch: u64,
}

impl TopicRecord {
    /// How many replicas hold the topic's log.
    pub fn replica_count(&self) -> usize {
        self.replicas.len().max(1)
    }

    /// Every forwarder holding a replica, the leader first.
    pub fn replica_shards(&self) -> Vec<ShardId> {
        if self.replicas.is_empty() {
            vec![self.shard]
        } else {
            self.replicas.clone()
        }
    }
}

/// One of a topic's publish sources after the first (source 0 is the topic's own record and
/// log, as before topics had several). It is a unit of its own, with its own id from the
/// catalog's counter, its own replicas, epoch and leader, so that what is keyed by a `TopicId`
/// (log folders, a shard's registry, replication, elections, replica moves) handles it as it
/// handles a topic; it knows its topic and its `SourceId`, which its message ids and ack ids
/// carry. No shard holds two units of one topic (`CatalogState::apply` refuses it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// The unit's own id, never a topic's.
    pub id: TopicId,
    pub topic_id: TopicId,
    /// Never `SourceId::FIRST`, which is the topic's own record.
    pub source: SourceId,
    /// Its leader's forwarder shard.
    pub shard: ShardId,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// As a topic's: every forwarder holding a replica, the leader among them; empty for a
    /// source of one replica, on `shard` alone.
    pub replicas: Vec<ShardId>,
    /// As a topic's: its leader's epoch, 0 for a source of one replica.
    pub epoch: u64,
    /// It retires (`CatalogEntry::SourceRetiring`): it takes no publish and is still delivered
    /// from, until every subscription acknowledged it and it is deleted. Not in `SourceAdded`'s
    /// bytes: a checkpoint restates it as its own entry.
    pub retiring: bool,
}

/// The bounds of a topic's publish sources when their number follows its load (`auto`): the
/// catalog's leader adds a source while they run hot and the topic has fewer than `max`, and
/// retires one while they run cold and it has more than `min`. Neither is 0, and `min <= max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceBounds {
    pub min: u32,
    pub max: u32,
}

impl SourceRecord {
    /// Every forwarder holding a replica, the leader first when it was placed.
    pub fn replica_shards(&self) -> Vec<ShardId> {
        if self.replicas.is_empty() {
            vec![self.shard]
        } else {
            self.replicas.clone()
        }
    }
}

/// A subscription's settings as stored; defaults already applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionSettings {
    pub ack_deadline_seconds: u32,
    pub retain_acked_messages: bool,
    pub message_retention_seconds: u64,
    pub enable_message_ordering: bool,
    pub filter: String,
    pub dead_letter_topic: String,
    pub max_delivery_attempts: u32,
    pub minimum_backoff_seconds: u32,
    pub maximum_backoff_seconds: u32,
    pub expiration_ttl_seconds: u64,
    /// Pub/Sub's labels, stored and returned as given.
    pub labels: Labels,
    /// Exactly-once delivery: an ack id is good only while its lease is, and once an
    /// acknowledgement is confirmed the message is never delivered again.
    pub enable_exactly_once_delivery: bool,
    /// Where the daemon pushes the subscription's messages; `None` for a pull subscription
    /// (Pub/Sub's empty `push_config`). Boxed: most subscriptions pull.
    pub push: Option<Box<PushConfig>>,
}

/// The project a push configuration names when none was given: the native protocol and the CLI
/// have no projects (a daemon is one namespace, see `protocol::grpc::names`), and configurations
/// stored before the project was kept named this one.
pub use ringpost_model::limits::PUSH_PROJECT_DEFAULT;

/// A push subscription's delivery, as Pub/Sub's `PushConfig` has it: the serving forwarder
/// POSTs each message to `endpoint` and takes the answer as its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    /// An `http://` or `https://` URL, checked when it is set.
    pub endpoint: String,
    /// Pub/Sub's `attributes` of a push config (`x-goog-version`), stored and returned as given.
    pub attributes: Labels,
    /// What a request's body is.
    pub wrapper: PushWrapper,
    /// When set, each request carries `Authorization: Bearer` a JWT the daemon signs.
    pub oidc_token: Option<OidcToken>,
    /// The project the requests name the subscription in (`projects/{project}/subscriptions/S`):
    /// the one the configuration was set in through gRPC, `PUSH_PROJECT_DEFAULT` unless given
    /// otherwise. Receivers written for Pub/Sub route by that name, or refuse another.
    pub project: String,
}

impl Default for PushConfig {
    fn default() -> PushConfig {
        PushConfig {
            endpoint: String::new(),
            attributes: Labels::new(),
            wrapper: PushWrapper::default(),
            oidc_token: None,
            project: PUSH_PROJECT_DEFAULT.to_owned(),
        }
    }
}

/// The body of a push request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PushWrapper {
    /// Pub/Sub's JSON envelope: the message (data in base64, attributes, ids, times) and the
    /// subscription's name.
    #[default]
    Pubsub,
    /// The message's data as it was published; with `write_metadata`, its attributes and
    /// metadata as HTTP headers.
    NoWrapper { write_metadata: bool },
}

/// The identity a push request's token claims (Pub/Sub's `OidcToken`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OidcToken {
    /// The token's `email` and `sub` claims.
    pub service_account_email: String,
    /// The token's `aud` claim; empty: the endpoint's URL, as Pub/Sub defaults it.
    pub audience: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionRecord {
    pub id: u64,
    pub name: Rc<str>,
    pub topic_id: TopicId,
    /// The topic's name when the subscription was created (the topic may be deleted since).
    pub topic_name: Rc<str>,
    /// The sync point: the subscription receives every message at or after this offset.
    pub start_offset: u64,
    pub settings: SubscriptionSettings,
    /// Milliseconds since the Unix epoch; 0 for subscriptions created before it was recorded.
    pub created_ms: u64,
    /// Detached from its topic (DetachSubscription): kept, but served by no forwarder, as if
    /// its topic were deleted.
    pub detached: bool,
    /// The sync point on each of the topic's sources after the first that existed when the
    /// subscription was created, in source order (`start_offset` is source 0's). A source
    /// not listed was added after: the subscription receives all of it, from offset 0.
    pub source_starts: Vec<(SourceId, u64)>,
}

impl SubscriptionRecord {
    /// The subscription's sync point on source `source` of its topic.
    pub fn start_on(&self, source: SourceId) -> u64 {
        if source == SourceId::FIRST {
            return self.start_offset;
        }
        self.source_starts.iter().find(|(listed, _)| *listed == source).map_or(0, |(_, start)| *start)
    }
}

/// One node of a cluster, as it registered itself: where its peers reach its router, and where
/// clients reach its router, each of its forwarder shards and its gRPC API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub node_id: NodeId,
    pub cluster_address: String,
    pub router_address: String,
    /// Shard `i`'s address at index `i`.
    pub forwarders: Vec<String>,
    /// Where clients (and the other nodes' gRPC APIs, carrying catalog changes to the leader)
    /// reach its gRPC API; empty when it serves none, and in entries written before the field.
    pub grpc_address: String,
}

impl NodeRecord {
    /// A node admitted to the cluster (`ringpost cluster add-node`) that has not registered
    /// yet: its cluster address only, so that the catalog's leader, and every later one, can
    /// reach it. It has no forwarders, so placement gives it nothing until it registers.
    pub fn admitted(node_id: NodeId, cluster_address: String) -> NodeRecord {
        NodeRecord {
            node_id,
            cluster_address,
            router_address: String::new(),
            forwarders: Vec::new(),
            grpc_address: String::new(),
        }
    }
}

// How a topic's `shard` packs a node and one of its forwarder shards: shared with the CLI,
// which shows the shards of the stats it reads.
pub use ringpost_model::shards::{forwarder_name, global_shard, node_and_shard, NODE_SHARD_BITS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogEntry {
    Boot {
        count: u32,
    },
    TopicCreated(TopicRecord),
    TopicDeleted {
        id: TopicId,
    },
    SubscriptionCreated(SubscriptionRecord),
    /// `name` is empty in entries written before deletions recorded it.
    SubscriptionDeleted {
        id: u64,
        name: String,
    },
    SnapshotCreated(SnapshotRecord),
    /// `name` is empty in entries written before deletions recorded it.
    SnapshotDeleted {
        id: SnapshotId,
        name: String,
    },
    /// A topic's settings after an update, whole: its message retention (0: not set) and
    /// labels.
    TopicUpdated {
        id: TopicId,
        message_retention_seconds: u64,
        labels: Labels,
    },
    /// A subscription's settings after an update, whole; those an update cannot change
    /// (filter, ordering) are restated as they were.
    SubscriptionUpdated {
        id: u64,
        name: String,
        settings: SubscriptionSettings,
    },
    /// A topic's new forwarder shard.
    TopicPlaced {
        id: TopicId,
        shard: ShardId,
    },
    /// Ids below this are taken (a checkpoint's restatement of the counter).
    NextId {
        next_id: u64,
    },
    /// A snapshot's labels after an update, whole.
    SnapshotUpdated {
        id: SnapshotId,
        name: String,
        labels: Labels,
    },
    /// A subscription leaves its topic for good; a checkpoint restates it in the record.
    SubscriptionDetached {
        id: u64,
        name: String,
    },
    /// A node joined the cluster, or started again with other addresses or shards; or was
    /// admitted and has not registered yet (`NodeRecord::admitted`).
    NodeRegistered(NodeRecord),
    /// A node left the cluster: its record is dropped, so placement no longer counts its
    /// forwarders. Decided only once it holds no topic and no replica.
    NodeRemoved {
        node_id: NodeId,
    },
    /// A replicated topic's replicas from now on: its replicas with one added or one removed,
    /// its leader among them (docs/REPLICATION.md, "Moving a replica"). Applied only to a
    /// topic of more than one replica, and only if the set keeps its leader and has at least
    /// two, each on its own node.
    TopicReplicasChanged {
        id: TopicId,
        replicas: Vec<ShardId>,
    },
    /// A replicated topic's leader from `epoch` on: one of its replicas, chosen by a fencing
    /// round that a quorum of them answered (docs/REPLICATION.md). Applied only when `epoch`
    /// is newer than the topic's, so one epoch has one leader.
    TopicLeaderElected {
        id: TopicId,
        epoch: u64,
        leader: ShardId,
    },
    /// A topic's publish source after the first, placed: applied only while its topic lives,
    /// and only if no other unit of the topic has that source number or a replica on its shards.
    /// The entries that elect, move and place a topic's leader and replicas apply to a source
    /// by its unit id.
    SourceAdded(SourceRecord),
    /// Topic `topic_id`'s source `source` retires: applied only to its highest source that is
    /// not retiring yet (never source 0), so that the retiring sources are always the highest
    /// numbers and the active count (`CatalogState::active_sources`) falls by one.
    SourceRetiring {
        topic_id: TopicId,
        source: SourceId,
    },
    /// Topic `topic_id`'s retiring source `source`, unit `id`, is deleted: every subscription
    /// acknowledged everything it holds (or it has none). Applied only to a retiring source of
    /// that unit id.
    SourceDeleted {
        topic_id: TopicId,
        source: SourceId,
        id: TopicId,
    },
    /// A registered node is draining (`ringpost cluster drain`), or no longer (`undrain`):
    /// while it drains, routers hand out none of its forwarders, new placements go elsewhere
    /// where they can, and the catalog's leader moves its topics' leaderships away.
    NodeDraining {
        node_id: NodeId,
        draining: bool,
    },
    /// The routing restrictions from now on, every rule (`ringpost cluster restrict`); a node
    /// of a version before them refuses the kind.
    RoutingRulesSet {
        rules: Vec<super::routing::RoutingRule>,
    },
    /// Topic `topic_id`'s sources follow its load within `bounds` from now on, or, with `None`,
    /// keep the number they have (`ringpost topic update --sources N`). Applied only while the
    /// topic lives.
    SourcePolicySet {
        topic_id: TopicId,
        bounds: Option<SourceBounds>,
    },
    /// Topic `topic_id`'s last change of its active count, as a checkpoint restates it: its
    /// number `generation` (the topic's changes so far) and the count `before` it. Applying
    /// `SourceAdded` or `SourceRetiring` moves both on by itself, so that the gate opens in the
    /// same step as the change; this entry only restates them. Applied only while the topic
    /// lives.
    SourceGate {
        topic_id: TopicId,
        gate: SourceGate,
    },
    /// Subscription `id` (`name`) passed its topic's change `generation`: on every source that
    /// lost keys in it, its ack floor reached that source's fence, so its sources deliver the
    /// keys that moved. Applied only while the subscription lives; a pass never goes back.
    SourcesPassed {
        id: u64,
        name: String,
        generation: u64,
    },
    /// Every source of topic `topic_id` that lost keys in its change `generation` applied it:
    /// from now on the sources that gained keys take them, even when they attach or are
    /// promoted, since no source that lost them takes them any more (docs/SOURCES.md, rule 2).
    /// Applied only while the topic lives and its last change is `generation`.
    SourcesApplied {
        topic_id: TopicId,
        generation: u64,
    },
    /// A schema's revision or deletion, or a topic's schema settings (`SchemaEntry`).
    Schema(SchemaEntry),
}

/// A topic's last change of its active count (docs/SOURCES.md, "Key order across a change of
/// the source set"): how many changes it had, and the count before the last. The count after
/// is the topic's active count, since a change waits until every ordered subscription passed
/// the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SourceGate {
    pub generation: u64,
    pub before: u32,
    /// Whether every source that lost keys in the change applied it (`SourcesApplied`); until
    /// then a source that gained keys is attached under the count `before`.
    pub applied: bool,
}

impl SourceGate {
    /// The sources that lost keys in the change to `after`: every source before an addition
    /// (keys move only to the new ones, by the key map's consistency), the retired ones in a
    /// retirement. A source that gained keys never lost any in that change.
    pub fn losing(&self, after: u32) -> std::ops::Range<u32> {
        losing_sources(self.before, after)
    }

    /// Whether source `source` gained keys in the change to `after`: the new ones of an
    /// addition, the active ones of a retirement. None when the count never changed.
    pub fn gains(&self, source: u32, after: u32) -> bool {
        self.generation != 0 && source < after && !self.losing(after).contains(&source)
    }
}

/// The sources that lost keys in a change of the active count from `before` to `after` (see
/// `SourceGate::losing`).
pub fn losing_sources(before: u32, after: u32) -> std::ops::Range<u32> {
    if after > before {
        0..before
    } else {
        after..before
    }
}

fn encode_topic_created(topic: &TopicRecord) -> Vec<u8> {
    // One replica: the bytes every version reads.
    let replicated = topic.replicas.len() > 1;
    let kind = if replicated { KIND_TOPIC_CREATED_REPLICATED } else { KIND_TOPIC_CREATED_PLACED };
    let mut encoder = Encoder::new(kind);
    encoder
        .u64(topic.id.get())
        .str(&topic.name)
        .u64(topic.message_retention_seconds)
        .u32(topic.shard.global())
        .u64(topic.created_ms);
    if replicated {
        encoder.u32(topic.replicas.len() as u32);
        for replica in &topic.replicas {
            encoder.u32(replica.global());
        }
        encoder.u64(topic.epoch);
    }
    encode_labels_trailer(&mut encoder, &topic.labels).0.clone()
}

/// `KIND_SOURCE_POLICY_SET`: the topic's id, whether its sources follow its load, and their
/// bounds (0 and 0 when they do not).
fn encode_source_policy(topic_id: TopicId, bounds: Option<SourceBounds>) -> Vec<u8> {
    let mut encoder = Encoder::new(KIND_SOURCE_POLICY_SET);
    let SourceBounds { min, max } = bounds.unwrap_or(SourceBounds { min: 0, max: 0 });
    encoder.u64(topic_id.get()).bool(bounds.is_some()).u32(min).u32(max);
    encoder.0
}

fn decode_source_policy(d: &mut Decoder) -> DecodeResult<CatalogEntry> {
    let topic_id = TopicId::new(d.u64()?);
    let follows = d.bool()?;
    let bounds = SourceBounds { min: d.u32()?, max: d.u32()? };
    if follows && (bounds.min == 0 || bounds.min > bounds.max) {
        return Err("a source policy's bounds are out of order");
    }
    Ok(CatalogEntry::SourcePolicySet { topic_id, bounds: follows.then_some(bounds) })
}

fn encode_node_registered(node: &NodeRecord) -> Vec<u8> {
    let mut encoder = Encoder::new(KIND_NODE_REGISTERED);
    encoder
        .u64(node.node_id.get())
        .str(&node.cluster_address)
        .str(&node.router_address)
        .u32(node.forwarders.len() as u32);
    for address in &node.forwarders {
        encoder.str(address);
    }
    // A trailer, written only when set: a node without a gRPC API registers in exactly the
    // bytes it did before the field, which every version reads.
    if !node.grpc_address.is_empty() {
        encoder.str(&node.grpc_address);
    }
    encoder.0
}

impl CatalogEntry {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            CatalogEntry::Schema(entry) => entry.encode(),
            CatalogEntry::Boot { count } => Encoder::new(KIND_BOOT).u32(*count).0.clone(),
            CatalogEntry::TopicCreated(topic) => encode_topic_created(topic),
            CatalogEntry::TopicDeleted { id } => Encoder::new(KIND_TOPIC_DELETED).u64(id.get()).0.clone(),
            CatalogEntry::SubscriptionCreated(subscription) => encode_subscription_created(subscription),
            CatalogEntry::SubscriptionDeleted { id, name } if name.is_empty() => {
                Encoder::new(KIND_SUBSCRIPTION_DELETED).u64(*id).0.clone()
            }
            CatalogEntry::SubscriptionDeleted { id, name } => {
                Encoder::new(KIND_SUBSCRIPTION_DELETED_NAMED).u64(*id).str(name).0.clone()
            }
            CatalogEntry::SnapshotCreated(snapshot) => {
                let mut encoder = Encoder::new(KIND_SNAPSHOT_CREATED);
                encoder
                    .u64(snapshot.id.get())
                    .str(&snapshot.name)
                    .u64(snapshot.topic_id.get())
                    .u64(snapshot.expire_time_ms);
                encode_labels_trailer(&mut encoder, &snapshot.labels).0.clone()
            }
            CatalogEntry::SnapshotDeleted { id, name } if name.is_empty() => {
                Encoder::new(KIND_SNAPSHOT_DELETED).u64(id.get()).0.clone()
            }
            CatalogEntry::SnapshotDeleted { id, name } => {
                Encoder::new(KIND_SNAPSHOT_DELETED_NAMED).u64(id.get()).str(name).0.clone()
            }
            CatalogEntry::TopicUpdated { id, message_retention_seconds, labels } => {
                let mut encoder = Encoder::new(KIND_TOPIC_UPDATED);
                encoder.u64(id.get()).u64(*message_retention_seconds);
                encode_labels_trailer(&mut encoder, labels).0.clone()
            }
            CatalogEntry::SubscriptionUpdated { id, name, settings } => {
                encode_subscription_updated(*id, name, settings)
            }
            CatalogEntry::TopicPlaced { id, shard } => {
                Encoder::new(KIND_TOPIC_PLACED).u64(id.get()).u32(shard.global()).0.clone()
            }
            CatalogEntry::NextId { next_id } => Encoder::new(KIND_NEXT_ID).u64(*next_id).0.clone(),
            CatalogEntry::SnapshotUpdated { id, name, labels } => {
                let mut encoder = Encoder::new(KIND_SNAPSHOT_UPDATED);
                encoder.u64(id.get()).str(name);
                encode_labels(&mut encoder, labels).0.clone()
            }
            CatalogEntry::SubscriptionDetached { id, name } => {
                Encoder::new(KIND_SUBSCRIPTION_DETACHED).u64(*id).str(name).0.clone()
            }
            CatalogEntry::NodeRegistered(node) => encode_node_registered(node),
            CatalogEntry::TopicLeaderElected { id, epoch, leader } => Encoder::new(KIND_TOPIC_LEADER_ELECTED)
                .u64(id.get())
                .u64(*epoch)
                .u32(leader.global())
                .0
                .clone(),
            CatalogEntry::NodeRemoved { node_id } => {
                Encoder::new(KIND_NODE_REMOVED).u64(node_id.get()).0.clone()
            }
            CatalogEntry::NodeDraining { node_id, draining } => {
                Encoder::new(KIND_NODE_DRAINING).u64(node_id.get()).bool(*draining).0.clone()
            }
            CatalogEntry::RoutingRulesSet { rules } => {
                super::routing::encode_rules(&mut Encoder::new(KIND_ROUTING_RULES_SET), rules).0.clone()
            }
            CatalogEntry::SourcePolicySet { topic_id, bounds } => encode_source_policy(*topic_id, *bounds),
            CatalogEntry::TopicReplicasChanged { id, replicas } => {
                let mut encoder = Encoder::new(KIND_TOPIC_REPLICAS_CHANGED);
                encoder.u64(id.get()).u32(replicas.len() as u32);
                for replica in replicas {
                    encoder.u32(replica.global());
                }
                encoder.0
            }
            CatalogEntry::SourceAdded(source) => {
                let mut encoder = Encoder::new(KIND_SOURCE_ADDED);
                encoder
                    .u64(source.id.get())
                    .u64(source.topic_id.get())
                    .u32(source.source.get())
                    .u32(source.shard.global())
                    .u64(source.created_ms)
                    .u32(source.replicas.len() as u32);
                for replica in &source.replicas {
                    encoder.u32(replica.global());
                }
                encoder.u64(source.epoch).0.clone()
            }
            CatalogEntry::SourceRetiring { topic_id, source } => {
                Encoder::new(KIND_SOURCE_RETIRING).u64(topic_id.get()).u32(source.get()).0.clone()
            }
            CatalogEntry::SourceDeleted { topic_id, source, id } => Encoder::new(KIND_SOURCE_DELETED)
                .u64(topic_id.get())
                .u32(source.get())
                .u64(id.get())
                .0
                .clone(),
            CatalogEntry::SourceGate { topic_id, gate } => Encoder::new(KIND_SOURCE_GATE)
                .u8(GATE_FORM_CHANGE)
                .u64(topic_id.get())
                .u64(gate.generation)
                .u32(gate.before)
                .0
                .clone(),
            CatalogEntry::SourcesPassed { id, name, generation } => Encoder::new(KIND_SOURCE_GATE)
                .u8(GATE_FORM_PASSED)
                .u64(*id)
                .str(name)
                .u64(*generation)
                .0
                .clone(),
            CatalogEntry::SourcesApplied { topic_id, generation } => Encoder::new(KIND_SOURCE_GATE)
                .u8(GATE_FORM_APPLIED)
                .u64(topic_id.get())
                .u64(*generation)
                .0
                .clone(),
        }
    }

    pub fn decode(bytes: &[u8]) -> DecodeResult<CatalogEntry> {
        let mut d = Decoder::new(bytes);
        let entry = match d.u8()? {
            KIND_BOOT => CatalogEntry::Boot { count: d.u32()? },
            KIND_TOPIC_CREATED => CatalogEntry::TopicCreated(TopicRecord {
                id: TopicId::new(d.u64()?),
                name: d.str()?.into(),
                message_retention_seconds: d.u64()?,
                shard: SHARD_UNPLACED,
                created_ms: 0,
                labels: Labels::new(),
                replicas: Vec::new(),
                epoch: 0,
            }),
            KIND_TOPIC_CREATED_PLACED => CatalogEntry::TopicCreated(TopicRecord {
                id: TopicId::new(d.u64()?),
                name: d.str()?.into(),
                message_retention_seconds: d.u64()?,
                shard: ShardId::from_global(d.u32()?),
                created_ms: d.u64()?,
                labels: decode_labels_trailer(&mut d)?,
                replicas: Vec::new(),
                epoch: 0,
            }),
            KIND_TOPIC_CREATED_REPLICATED => CatalogEntry::TopicCreated(decode_replicated_topic(&mut d)?),
            KIND_TOPIC_DELETED => CatalogEntry::TopicDeleted { id: TopicId::new(d.u64()?) },
            KIND_SUBSCRIPTION_CREATED => CatalogEntry::SubscriptionCreated(SubscriptionRecord {
                id: d.u64()?,
                name: d.str()?.into(),
                topic_id: TopicId::new(d.u64()?),
                topic_name: d.str()?.into(),
                start_offset: d.u64()?,
                settings: decode_settings(&mut d)?,
                created_ms: 0,
                detached: false,
                source_starts: Vec::new(),
            }),
            KIND_SUBSCRIPTION_CREATED_AT => {
                CatalogEntry::SubscriptionCreated(decode_subscription_created_at(&mut d)?)
            }
            KIND_SUBSCRIPTION_CREATED_WITH_SOURCES => {
                let source_starts = decode_source_starts(&mut d)?;
                let record = decode_subscription_created_at(&mut d)?;
                CatalogEntry::SubscriptionCreated(SubscriptionRecord { source_starts, ..record })
            }
            KIND_SUBSCRIPTION_DELETED => {
                CatalogEntry::SubscriptionDeleted { id: d.u64()?, name: String::new() }
            }
            KIND_SUBSCRIPTION_DELETED_NAMED => {
                CatalogEntry::SubscriptionDeleted { id: d.u64()?, name: non_empty(d.str()?)? }
            }
            KIND_SNAPSHOT_CREATED => CatalogEntry::SnapshotCreated(SnapshotRecord {
                id: SnapshotId::new(d.u64()?),
                name: d.str()?,
                topic_id: TopicId::new(d.u64()?),
                expire_time_ms: d.u64()?,
                labels: decode_labels_trailer(&mut d)?,
            }),
            KIND_SNAPSHOT_DELETED => {
                CatalogEntry::SnapshotDeleted { id: SnapshotId::new(d.u64()?), name: String::new() }
            }
            KIND_SNAPSHOT_DELETED_NAMED => {
                CatalogEntry::SnapshotDeleted { id: SnapshotId::new(d.u64()?), name: non_empty(d.str()?)? }
            }
            KIND_TOPIC_UPDATED => CatalogEntry::TopicUpdated {
                id: TopicId::new(d.u64()?),
                message_retention_seconds: d.u64()?,
                labels: decode_labels_trailer(&mut d)?,
            },
            KIND_SUBSCRIPTION_UPDATED => decode_subscription_updated(&mut d)?,
            KIND_TOPIC_PLACED => CatalogEntry::TopicPlaced {
                id: TopicId::new(d.u64()?),
                shard: ShardId::from_global(d.u32()?),
            },
            KIND_NEXT_ID => CatalogEntry::NextId { next_id: d.u64()? },
            KIND_SNAPSHOT_UPDATED => CatalogEntry::SnapshotUpdated {
                id: SnapshotId::new(d.u64()?),
                name: non_empty(d.str()?)?,
                labels: decode_labels(&mut d)?,
            },
            KIND_SUBSCRIPTION_DETACHED => {
                CatalogEntry::SubscriptionDetached { id: d.u64()?, name: non_empty(d.str()?)? }
            }
            KIND_NODE_REGISTERED => CatalogEntry::NodeRegistered(decode_node(&mut d)?),
            KIND_TOPIC_LEADER_ELECTED => CatalogEntry::TopicLeaderElected {
                id: TopicId::new(d.u64()?),
                epoch: d.u64()?,
                leader: ShardId::from_global(d.u32()?),
            },
            KIND_NODE_REMOVED => CatalogEntry::NodeRemoved { node_id: NodeId::new(d.u64()?) },
            KIND_TOPIC_REPLICAS_CHANGED => CatalogEntry::TopicReplicasChanged {
                id: TopicId::new(d.u64()?),
                replicas: decode_replicas(&mut d)?,
            },
            KIND_SOURCE_ADDED => CatalogEntry::SourceAdded(decode_source(&mut d)?),
            kind @ (KIND_SOURCE_RETIRING | KIND_SOURCE_DELETED) => decode_source_change(kind, &mut d)?,
            KIND_NODE_DRAINING => {
                CatalogEntry::NodeDraining { node_id: NodeId::new(d.u64()?), draining: d.bool()? }
            }
            KIND_ROUTING_RULES_SET => {
                CatalogEntry::RoutingRulesSet { rules: super::routing::decode_rules(&mut d)? }
            }
            KIND_SOURCE_POLICY_SET => decode_source_policy(&mut d)?,
            KIND_SOURCE_GATE => decode_source_gate(&mut d)?,
            kind @ schemas::KIND_SCHEMA_COMMITTED..=schemas::KIND_TOPIC_SCHEMA_SET => {
                CatalogEntry::Schema(SchemaEntry::decode(kind, &mut d)?)
            }
            _ => return Err("unknown catalog entry kind"),
        };
        if !d.is_empty() {
            return Err("trailing bytes in catalog entry");
        }
        Ok(entry)
    }
}

/// `KIND_SUBSCRIPTION_UPDATED`: the subscription, its settings, and their trailer when a later
/// field is set.
fn decode_subscription_updated(d: &mut Decoder) -> DecodeResult<CatalogEntry> {
    let (id, name, mut settings) = (d.u64()?, non_empty(d.str()?)?, decode_settings(d)?);
    if !d.is_empty() {
        decode_settings_trailer(d, &mut settings)?;
        if !d.is_empty() {
            settings.push = Some(Box::new(decode_push_ending(d)?));
        }
    }
    Ok(CatalogEntry::SubscriptionUpdated { id, name, settings })
}

/// A subscription's creation (`KIND_SUBSCRIPTION_CREATED_AT`): its fields, the first
/// encoding's settings, its creation time, and the trailer when a later field is set.
fn encode_subscription_created(subscription: &SubscriptionRecord) -> Vec<u8> {
    let starts = &subscription.source_starts;
    let mut encoder = if starts.is_empty() {
        Encoder::new(KIND_SUBSCRIPTION_CREATED_AT)
    } else {
        // The later sources' sync points first, so that kind 13's fields (and their trailer,
        // read to the entry's end) follow as they always were.
        let mut encoder = Encoder::new(KIND_SUBSCRIPTION_CREATED_WITH_SOURCES);
        encoder.u32(starts.len() as u32);
        for (source, start) in starts {
            encoder.u32(source.get()).u64(*start);
        }
        encoder
    };
    encoder
        .u64(subscription.id)
        .str(&subscription.name)
        .u64(subscription.topic_id.get())
        .str(&subscription.topic_name)
        .u64(subscription.start_offset);
    encode_settings(&mut encoder, &subscription.settings).u64(subscription.created_ms);
    if has_trailer(&subscription.settings) || subscription.detached {
        encode_settings_trailer(&mut encoder, &subscription.settings).bool(subscription.detached);
        // Added after detachment, so after it; only a push subscription writes it.
        if let Some(push) = &subscription.settings.push {
            encode_push_ending(&mut encoder, push);
        }
    }
    encoder.0
}

/// A subscription's update (`KIND_SUBSCRIPTION_UPDATED`): its id and name, its settings whole,
/// the trailer when a later field is set.
fn encode_subscription_updated(id: u64, name: &str, settings: &SubscriptionSettings) -> Vec<u8> {
    let mut encoder = Encoder::new(KIND_SUBSCRIPTION_UPDATED);
    encoder.u64(id).str(name);
    encode_settings(&mut encoder, settings);
    if has_trailer(settings) {
        encode_settings_trailer(&mut encoder, settings);
        if let Some(push) = &settings.push {
            encode_push_ending(&mut encoder, push);
        }
    }
    encoder.0
}

/// A topic created with its replicas (`KIND_TOPIC_CREATED_REPLICATED`), after its kind.
fn decode_replicated_topic(d: &mut Decoder) -> DecodeResult<TopicRecord> {
    let (id, name, message_retention_seconds, shard, created_ms) =
        (TopicId::new(d.u64()?), d.str()?, d.u64()?, ShardId::from_global(d.u32()?), d.u64()?);
    let replicas = decode_replicas(d)?;
    if !replicas.contains(&shard) {
        return Err("a replicated topic whose leader is not one of its replicas");
    }
    let epoch = d.u64()?;
    let labels = decode_labels_trailer(d)?;
    Ok(TopicRecord {
        id,
        name: name.into(),
        message_retention_seconds,
        shard,
        created_ms,
        labels,
        replicas,
        epoch,
    })
}

/// A source's addition (`KIND_SOURCE_ADDED`), after its kind.
fn decode_source(d: &mut Decoder) -> DecodeResult<SourceRecord> {
    let (id, topic_id, number) = (TopicId::new(d.u64()?), TopicId::new(d.u64()?), d.u32()?);
    let source = SourceId::new(number).ok_or("a source number past SOURCES_PER_TOPIC_MAX")?;
    if source == SourceId::FIRST {
        return Err("an added source numbered 0, which is the topic's own");
    }
    if id == topic_id {
        return Err("a source whose unit id is its topic's");
    }
    let (shard, created_ms) = (ShardId::from_global(d.u32()?), d.u64()?);
    let replicas = decode_replicas(d)?;
    if !replicas.is_empty() && !replicas.contains(&shard) {
        return Err("a replicated source whose leader is not one of its replicas");
    }
    let epoch = d.u64()?;
    Ok(SourceRecord { id, topic_id, source, shard, created_ms, replicas, epoch, retiring: false })
}

/// A source's retirement or deletion (`KIND_SOURCE_RETIRING`, `KIND_SOURCE_DELETED`), after
/// its kind.
fn decode_source_change(kind: u8, d: &mut Decoder) -> DecodeResult<CatalogEntry> {
    let (topic_id, source) = (TopicId::new(d.u64()?), decode_later_source(d)?);
    if kind == KIND_SOURCE_RETIRING {
        return Ok(CatalogEntry::SourceRetiring { topic_id, source });
    }
    Ok(CatalogEntry::SourceDeleted { topic_id, source, id: TopicId::new(d.u64()?) })
}

/// The delivery gate's entries (`KIND_SOURCE_GATE`), after their kind: a change, numbered from
/// 1, whose count before was at least 1; a pass of a change numbered from 1; or a change,
/// numbered from 1, applied. A restated change is not yet applied: its `SourcesApplied` follows.
fn decode_source_gate(d: &mut Decoder) -> DecodeResult<CatalogEntry> {
    match d.u8()? {
        GATE_FORM_CHANGE => {
            let topic_id = TopicId::new(d.u64()?);
            let gate = SourceGate { generation: d.u64()?, before: d.u32()?, applied: false };
            if gate.generation == 0 || gate.before == 0 || gate.before > SOURCES_PER_TOPIC_MAX {
                return Err(
                    "a topic's source change numbered 0, or from a count of 0 or past SOURCES_PER_TOPIC_MAX",
                );
            }
            Ok(CatalogEntry::SourceGate { topic_id, gate })
        }
        GATE_FORM_PASSED => {
            let (id, name, generation) = (d.u64()?, non_empty(d.str()?)?, d.u64()?);
            if generation == 0 {
                return Err("a subscription passing a topic's source change numbered 0");
            }
            Ok(CatalogEntry::SourcesPassed { id, name, generation })
        }
        GATE_FORM_APPLIED => {
            let (topic_id, generation) = (TopicId::new(d.u64()?), d.u64()?);
            if generation == 0 {
                return Err("a topic's source change numbered 0 applied");
            }
            Ok(CatalogEntry::SourcesApplied { topic_id, generation })
        }
        _ => Err("an unknown form of the delivery gate's entry"),
    }
}

/// A source after the first, by number.
fn decode_later_source(d: &mut Decoder) -> DecodeResult<SourceId> {
    match SourceId::new(d.u32()?) {
        Some(source) if source != SourceId::FIRST => Ok(source),
        _ => Err("a source numbered 0 (the topic's own, which never retires) or past SOURCES_PER_TOPIC_MAX"),
    }
}

/// A topic's replicas: their count, at most `REPLICAS_MAX`, then each one's shard.
fn decode_replicas(d: &mut Decoder) -> DecodeResult<Vec<ShardId>> {
    let count = d.u32()?;
    if count as usize > REPLICAS_MAX {
        return Err("a topic with more replicas than REPLICAS_MAX");
    }
    (0..count).map(|_| d.u32().map(ShardId::from_global)).collect()
}

/// A subscription created with its creation time (`KIND_SUBSCRIPTION_CREATED_AT`), after its
/// kind; the later settings and whether it is detached follow when it was written with them.
fn decode_subscription_created_at(d: &mut Decoder) -> DecodeResult<SubscriptionRecord> {
    let mut record = SubscriptionRecord {
        id: d.u64()?,
        name: d.str()?.into(),
        topic_id: TopicId::new(d.u64()?),
        topic_name: d.str()?.into(),
        start_offset: d.u64()?,
        settings: decode_settings(d)?,
        created_ms: d.u64()?,
        detached: false,
        source_starts: Vec::new(),
    };
    if !d.is_empty() {
        decode_settings_trailer(d, &mut record.settings)?;
        record.detached = d.bool()?;
        if !d.is_empty() {
            record.settings.push = Some(Box::new(decode_push_ending(d)?));
        }
    }
    Ok(record)
}

/// A subscription's sync points on its topic's later sources
/// (`KIND_SUBSCRIPTION_CREATED_WITH_SOURCES`): at least one, each a source after the first, in
/// increasing order.
fn decode_source_starts(d: &mut Decoder) -> DecodeResult<Vec<(SourceId, u64)>> {
    let count = d.u32()?;
    if count == 0 || count >= SOURCES_PER_TOPIC_MAX {
        return Err("a subscription's sync points on no later source, or on more than a topic has");
    }
    let mut starts: Vec<(SourceId, u64)> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let source = SourceId::new(d.u32()?).ok_or("a source number past SOURCES_PER_TOPIC_MAX")?;
        let after_previous = starts.last().map_or(SourceId::FIRST, |(previous, _)| *previous);
        if source <= after_previous {
            return Err("a subscription's sync points out of source order, or on source 0");
        }
        starts.push((source, d.u64()?));
    }
    Ok(starts)
}

/// A node's registration (`KIND_NODE_REGISTERED`), after its kind; its gRPC address follows
/// when it was written with one.
fn decode_node(d: &mut Decoder) -> DecodeResult<NodeRecord> {
    let (node_id, cluster_address, router_address) = (NodeId::new(d.u64()?), d.str()?, d.str()?);
    let count = d.u32()?;
    if count > 1 << NODE_SHARD_BITS {
        return Err("a node with more forwarder shards than a shard number holds");
    }
    let mut forwarders = Vec::with_capacity(count as usize);
    for _ in 0..count {
        forwarders.push(d.str()?);
    }
    let grpc_address = if d.is_empty() { String::new() } else { d.str()? };
    Ok(NodeRecord { node_id, cluster_address, router_address, forwarders, grpc_address })
}

/// A subscription's settings, in the order both its creation and its updates store them.
fn encode_settings<'a>(encoder: &'a mut Encoder, settings: &SubscriptionSettings) -> &'a mut Encoder {
    encoder
        .u32(settings.ack_deadline_seconds)
        .bool(settings.retain_acked_messages)
        .u64(settings.message_retention_seconds)
        .bool(settings.enable_message_ordering)
        .str(&settings.filter)
        .str(&settings.dead_letter_topic)
        .u32(settings.max_delivery_attempts)
        .u32(settings.minimum_backoff_seconds)
        .u32(settings.maximum_backoff_seconds)
        .u64(settings.expiration_ttl_seconds)
}

fn decode_settings(d: &mut Decoder) -> DecodeResult<SubscriptionSettings> {
    Ok(SubscriptionSettings {
        ack_deadline_seconds: d.u32()?,
        retain_acked_messages: d.bool()?,
        message_retention_seconds: d.u64()?,
        enable_message_ordering: d.bool()?,
        filter: d.str()?,
        dead_letter_topic: d.str()?,
        max_delivery_attempts: d.u32()?,
        minimum_backoff_seconds: d.u32()?,
        maximum_backoff_seconds: d.u32()?,
        expiration_ttl_seconds: d.u64()?,
        labels: Default::default(),
        enable_exactly_once_delivery: false,
        push: None,
    })
}
/// Whether a subscription's settings need the trailer (a setting added after the first
/// encoding is not its default).
fn has_trailer(settings: &SubscriptionSettings) -> bool {
    !settings.labels.is_empty() || settings.enable_exactly_once_delivery || settings.push.is_some()
}

const PUSH_WRAPPER_PUBSUB: u8 = 0;
const PUSH_NO_WRAPPER: u8 = 1;
const PUSH_NO_WRAPPER_WITH_METADATA: u8 = 2;

/// A push configuration: its endpoint, attributes, wrapper and, behind a flag, its OIDC token.
fn encode_push<'a>(encoder: &'a mut Encoder, push: &PushConfig) -> &'a mut Encoder {
    encoder.str(&push.endpoint);
    encode_labels(encoder, &push.attributes);
    encoder.u8(match push.wrapper {
        PushWrapper::Pubsub => PUSH_WRAPPER_PUBSUB,
        PushWrapper::NoWrapper { write_metadata: false } => PUSH_NO_WRAPPER,
        PushWrapper::NoWrapper { write_metadata: true } => PUSH_NO_WRAPPER_WITH_METADATA,
    });
    match &push.oidc_token {
        Some(token) => encoder.bool(true).str(&token.service_account_email).str(&token.audience),
        None => encoder.bool(false),
    }
}

fn decode_push(d: &mut Decoder) -> DecodeResult<PushConfig> {
    let endpoint = d.str()?;
    // A push configuration is stored only with its endpoint: an empty one means pull, and is
    // stored as no configuration at all.
    if endpoint.is_empty() {
        return Err("a push configuration without an endpoint");
    }
    let attributes = decode_labels(d)?;
    let wrapper = match d.u8()? {
        PUSH_WRAPPER_PUBSUB => PushWrapper::Pubsub,
        PUSH_NO_WRAPPER => PushWrapper::NoWrapper { write_metadata: false },
        PUSH_NO_WRAPPER_WITH_METADATA => PushWrapper::NoWrapper { write_metadata: true },
        _ => return Err("unknown push wrapper"),
    };
    let oidc_token = if d.bool()? {
        Some(OidcToken { service_account_email: d.str()?, audience: d.str()? })
    } else {
        None
    };
    Ok(PushConfig { endpoint, attributes, wrapper, oidc_token, project: PUSH_PROJECT_DEFAULT.to_owned() })
}

/// A push configuration that ends its message: `encode_push`'s fields, then its project only
/// when it is not `PUSH_PROJECT_DEFAULT`. So a configuration of the default project is byte for
/// byte what the version before the project wrote, and one of another project leaves bytes that
/// version does not know after it: it refuses the message whole (trailing bytes) rather than
/// push in the wrong project.
fn encode_push_ending<'a>(encoder: &'a mut Encoder, push: &PushConfig) -> &'a mut Encoder {
    encode_push(encoder, push);
    if push.project != PUSH_PROJECT_DEFAULT {
        encoder.str(&push.project);
    }
    encoder
}

fn decode_push_ending(d: &mut Decoder) -> DecodeResult<PushConfig> {
    let mut push = decode_push(d)?;
    if !d.is_empty() {
        push.project = decode_project(d)?;
    }
    Ok(push)
}

/// A push configuration's project, written only when it is not the default: the default written
/// out is refused, so that each configuration has one encoding.
fn decode_project(d: &mut Decoder) -> DecodeResult<String> {
    let project = d.str()?;
    if project == PUSH_PROJECT_DEFAULT {
        return Err("a push configuration's default project written out");
    }
    if ringpost_model::validate::validate_project(&project).is_err() {
        return Err("a push configuration's project is not a project id");
    }
    Ok(project)
}

/// The settings added after the first encoding, in the order they were added.
fn encode_settings_trailer<'a>(encoder: &'a mut Encoder, settings: &SubscriptionSettings) -> &'a mut Encoder {
    encode_labels(encoder, &settings.labels).bool(settings.enable_exactly_once_delivery)
}

fn decode_settings_trailer(d: &mut Decoder, settings: &mut SubscriptionSettings) -> DecodeResult<()> {
    settings.labels = decode_labels(d)?;
    settings.enable_exactly_once_delivery = d.bool()?;
    Ok(())
}

/// A subscription's settings whole: the first encoding's fields and then, always, those added
/// after it (the push configuration behind a flag saying whether there is one). Messages that
/// carry settings among other fields (the control messages between nodes) use this, since an
/// optional trailer there could not be told from the fields after it.
pub(crate) fn encode_whole_settings<'a>(
    encoder: &'a mut Encoder,
    settings: &SubscriptionSettings,
    projects: bool,
) -> &'a mut Encoder {
    encode_settings(encoder, settings);
    encode_settings_trailer(encoder, settings);
    encode_optional_push(encoder, settings.push.as_deref(), projects)
}

pub(crate) fn decode_whole_settings(d: &mut Decoder, projects: bool) -> DecodeResult<SubscriptionSettings> {
    let mut settings = decode_settings(d)?;
    decode_settings_trailer(d, &mut settings)?;
    settings.push = decode_optional_push(d, projects)?;
    Ok(settings)
}

/// A subscription's settings as the control messages between a router and its forwarders carry
/// them: the first encoding's fields and, always (other fields follow), those added after it,
/// but not the push configuration. Those messages carry it as their last field, and only for a
/// push subscription (`encode_push_last`), so that a node of the version before push reads
/// every pull subscription's messages as it did, and refuses a push subscription's (trailing
/// bytes) rather than attach it as a pull one.
pub(crate) fn encode_settings_but_push<'a>(
    encoder: &'a mut Encoder,
    settings: &SubscriptionSettings,
) -> &'a mut Encoder {
    encode_settings(encoder, settings);
    encode_settings_trailer(encoder, settings)
}

pub(crate) fn decode_settings_but_push(d: &mut Decoder) -> DecodeResult<SubscriptionSettings> {
    let mut settings = decode_settings(d)?;
    decode_settings_trailer(d, &mut settings)?;
    Ok(settings)
}

/// A message's last field: the push configuration of a push subscription (its project only when
/// it is not the default, `encode_push_ending`), nothing for a pull one.
pub(crate) fn encode_push_last(encoder: &mut Encoder, push: Option<&PushConfig>) {
    if let Some(push) = push {
        encode_push_ending(encoder, push);
    }
}

/// The last field `encode_push_last` wrote: a push configuration if any bytes are left.
pub(crate) fn decode_push_last(d: &mut Decoder) -> DecodeResult<Option<Box<PushConfig>>> {
    Ok(if d.is_empty() { None } else { Some(Box::new(decode_push_ending(d)?)) })
}

/// Whether a push configuration names a project other than the default, so that a message
/// carrying it in the middle of other fields needs the format that writes projects
/// (`encode_optional_push`).
pub(crate) fn names_a_project(push: Option<&PushConfig>) -> bool {
    push.is_some_and(|push| push.project != PUSH_PROJECT_DEFAULT)
}

/// A push configuration or none, behind a flag saying which; with `projects` (a format that
/// writes them, chosen by the whole message), its project after it.
pub(crate) fn encode_optional_push<'a>(
    encoder: &'a mut Encoder,
    push: Option<&PushConfig>,
    projects: bool,
) -> &'a mut Encoder {
    match push {
        Some(push) => {
            encode_push(encoder.bool(true), push);
            if projects {
                encoder.str(&push.project);
            }
            encoder
        }
        None => encoder.bool(false),
    }
}

pub(crate) fn decode_optional_push(d: &mut Decoder, projects: bool) -> DecodeResult<Option<Box<PushConfig>>> {
    if !d.bool()? {
        return Ok(None);
    }
    let mut push = decode_push(d)?;
    if projects {
        push.project = d.str()?;
        if ringpost_model::validate::validate_project(&push.project).is_err() {
            return Err("a push configuration's project is not a project id");
        }
    }
    Ok(Some(Box::new(push)))
}

/// Labels as a count and then each key and value.
fn encode_labels<'a>(encoder: &'a mut Encoder, labels: &Labels) -> &'a mut Encoder {
    encoder.u32(labels.len() as u32);
    for (key, value) in labels {
        encoder.str(key).str(value);
    }
    encoder
}

fn decode_labels(d: &mut Decoder) -> DecodeResult<Labels> {
    let count = d.u32()?;
    let mut labels = Labels::new();
    for _ in 0..count {
        labels.insert(d.str()?, d.str()?);
    }
    Ok(labels)
}

/// Labels as an optional trailer: nothing when there are none, as entries were before.
fn encode_labels_trailer<'a>(encoder: &'a mut Encoder, labels: &Labels) -> &'a mut Encoder {
    if labels.is_empty() {
        return encoder;
    }
    encode_labels(encoder, labels)
}

fn decode_labels_trailer(d: &mut Decoder) -> DecodeResult<Labels> {
    if d.is_empty() {
        return Ok(Labels::new());
    }
    decode_labels(d)
}

/// A name read from a deletion that must carry one.
fn non_empty(name: String) -> DecodeResult<String> {
    if name.is_empty() {
        return Err("a named deletion with an empty name");
    }
    Ok(name)
}

/// What the raft log's debug output says of an entry.
impl std::fmt::Display for CatalogEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogEntry::Boot { count } => write!(f, "boot {count}"),
            CatalogEntry::TopicCreated(topic) => write!(f, "create topic '{}' ({:x})", topic.name, topic.id),
            CatalogEntry::TopicDeleted { id } => write!(f, "delete topic {id:x}"),
            CatalogEntry::SubscriptionCreated(record) => {
                write!(f, "create subscription '{}' ({:x})", record.name, record.id)
            }
            CatalogEntry::SubscriptionDeleted { id, .. } => write!(f, "delete subscription {id:x}"),
            CatalogEntry::SnapshotCreated(record) => {
                write!(f, "create snapshot '{}' ({:x})", record.name, record.id)
            }
            CatalogEntry::SnapshotDeleted { id, .. } => write!(f, "delete snapshot {id:x}"),
            CatalogEntry::TopicUpdated { id, .. } => write!(f, "update topic {id:x}"),
            CatalogEntry::SubscriptionUpdated { id, .. } => write!(f, "update subscription {id:x}"),
            CatalogEntry::TopicPlaced { id, shard } => {
                write!(f, "place topic {id:x} on shard {}", shard.global())
            }
            CatalogEntry::NextId { next_id } => write!(f, "next id {next_id:x}"),
            CatalogEntry::Schema(entry) => write!(f, "{entry}"),
            CatalogEntry::SnapshotUpdated { id, .. } => write!(f, "update snapshot {id:x}"),
            CatalogEntry::SubscriptionDetached { id, .. } => write!(f, "detach subscription {id:x}"),
            CatalogEntry::NodeRegistered(node) => write!(f, "register node {}", node.node_id),
            CatalogEntry::NodeRemoved { node_id } => write!(f, "remove node {node_id}"),
            CatalogEntry::NodeDraining { node_id, draining: true } => write!(f, "drain node {node_id}"),
            CatalogEntry::NodeDraining { node_id, draining: false } => write!(f, "undrain node {node_id}"),
            CatalogEntry::RoutingRulesSet { rules } => write!(f, "{} routing rule(s)", rules.len()),
            CatalogEntry::SourceRetiring { topic_id, source } => {
                write!(f, "retire source {} of topic {topic_id:x}", source.get())
            }
            CatalogEntry::SourceDeleted { topic_id, source, id } => {
                write!(f, "delete source {} ({id:x}) of topic {topic_id:x}", source.get())
            }
            CatalogEntry::SourcePolicySet { topic_id, bounds: Some(bounds) } => {
                write!(f, "topic {topic_id:x}'s sources follow its load, {} to {}", bounds.min, bounds.max)
            }
            CatalogEntry::SourcePolicySet { topic_id, bounds: None } => {
                write!(f, "topic {topic_id:x}'s sources keep their number")
            }
            CatalogEntry::TopicReplicasChanged { id, replicas } => {
                let numbers: Vec<u32> = replicas.iter().map(|replica| replica.global()).collect();
                write!(f, "topic {id:x} replicated on shards {numbers:x?}")
            }
            CatalogEntry::TopicLeaderElected { id, epoch, leader } => {
                write!(f, "topic {id:x} led by shard {} from epoch {epoch}", leader.global())
            }
            CatalogEntry::SourceGate { topic_id, gate } => write!(
                f,
                "topic {topic_id:x}'s source change {} was from {} sources",
                gate.generation, gate.before
            ),
            CatalogEntry::SourcesPassed { id, generation, .. } => {
                write!(f, "subscription {id:x} passed its topic's source change {generation}")
            }
            CatalogEntry::SourcesApplied { topic_id, generation } => {
                write!(
                    f,
                    "topic {topic_id:x}'s source change {generation} was applied by the sources losing keys"
                )
            }
            CatalogEntry::SourceAdded(source) => write!(
                f,
                "topic {:x} source {} ({:x}) on shard {}",
                source.topic_id,
                source.source.get(),
                source.id,
                source.shard.global()
            ),
        }
    }
}
