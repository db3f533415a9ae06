//! Entry points into the decoders of what other nodes send, for the fuzz targets in
//! `daemon/fuzz` (built with the `fuzzing` feature) and for the property tests below, which run
//! the same entry points in a plain `cargo test`.
//!
//! Each `Family` is one file's decoders: the replicas' protocol (`replication::protocol`), the
//! control messages between a router and another node's forwarders (`control::codec`), the
//! catalog's raft messages (`catalog::peer`, with the catalog entries they carry), the catalog's
//! raft log as its recovery reads it back from disk (`catalog::store`), and the rest of the
//! cluster port (`net::peer`: cluster status, carried requests and their answers, push keys,
//! requests for elections). Whatever the bytes, a decoder returns an error, never panics,
//! never allocates by a count it has not read the items of; and what it decodes encodes to
//! bytes that decode to the same value (the oracle that finds an encoder and a decoder that
//! disagree, which no panic would show).

use crate::catalog::entry::{
    CatalogEntry, Labels, NodeRecord, SnapshotRecord, SubscriptionRecord, SubscriptionSettings, TopicRecord,
};
use crate::catalog::raft::{Entry, LogId, Membership, Snapshot, SnapshotMeta, StoredMembership, Vote};
use crate::control::{ControlOk, ControlRequest, SettingsUpdate};
use crate::ids::{Epoch, NodeId, Offset, ShardId, TopicId};
use crate::replication::protocol::{
    Chunk, FencedLog, LogAppend, LogTip, ReplicaAnswer, ReplicaRequest, JOURNAL, LOGS,
};
use crate::replication::EpochHistory;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::vote::leader_id_adv::LeaderId;
use openraft::EntryPayload;
use std::collections::BTreeSet;

/// The decoders of one file, fuzzed together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    ReplicaProtocol,
    ControlCodec,
    CatalogPeer,
    CatalogStore,
    NativePeer,
}

impl Family {
    pub const ALL: [Family; 5] = [
        Family::ReplicaProtocol,
        Family::ControlCodec,
        Family::CatalogPeer,
        Family::CatalogStore,
        Family::NativePeer,
    ];

    /// Every decoder of the family on `bytes`; whether one of them took the bytes.
    pub fn decode(self, bytes: &[u8]) -> bool {
        match self {
            Family::ReplicaProtocol => replica_protocol(bytes),
            Family::ControlCodec => control_codec(bytes),
            Family::CatalogPeer => catalog_peer(bytes),
            Family::CatalogStore => catalog_store(bytes),
            Family::NativePeer => native_peer(bytes),
        }
    }

    /// Valid encodings of the family's messages: where fuzzing starts from.
    pub fn samples(self) -> Vec<Vec<u8>> {
        match self {
            Family::ReplicaProtocol => replica_samples(),
            Family::ControlCodec => control_samples(),
            Family::CatalogPeer => catalog_peer_samples(),
            Family::CatalogStore => catalog_store_samples(),
            Family::NativePeer => native_peer_samples(),
        }
    }
}

/// Most edits `mutate` applies: enough to fix up a length and change a field or two.
pub const EDITS_MAX: usize = 16;

/// A fuzz target's input taken as one of two things, by its first byte: even, bytes for the
/// decoders as they are; odd, a sample of the family (chosen by the second byte) changed by
/// the edits the rest encodes (`mutate`). Random bytes rarely get past a message's first
/// fields; a valid message with a few bytes changed reaches every field.
pub fn fuzz(family: Family, data: &[u8]) {
    match data {
        [mode, choice, edits @ ..] if mode % 2 == 1 => {
            let samples = family.samples();
            let sample = &samples[*choice as usize % samples.len()];
            family.decode(&mutate(sample, edits));
        }
        [_, rest @ ..] => {
            family.decode(rest);
        }
        [] => {
            family.decode(data);
        }
    }
}

/// `sample` changed by `edits`, read four bytes an edit: what to do, where (two bytes, taken
/// modulo the length), and a value. An edit sets a byte, cuts the bytes there, inserts a byte,
/// writes a 32-bit count or length there (the value, or that far below 2^32), or a 64-bit
/// number that far below 2^64: the fields a hostile peer would change to make a decoder read,
/// or reserve, past its input, or make what uses the decoded numbers overflow.
pub fn mutate(sample: &[u8], edits: &[u8]) -> Vec<u8> {
    let mut bytes = sample.to_vec();
    for edit in edits.chunks_exact(4).take(EDITS_MAX) {
        let at = u16::from_le_bytes([edit[1], edit[2]]) as usize % (bytes.len() + 1);
        let value = edit[3];
        match edit[0] % 6 {
            0 if at < bytes.len() => bytes[at] = value,
            1 => bytes.truncate(at),
            2 => bytes.insert(at, value),
            3 if at + 4 <= bytes.len() => bytes[at..at + 4].copy_from_slice(&u32::from(value).to_le_bytes()),
            4 if at + 4 <= bytes.len() => {
                bytes[at..at + 4].copy_from_slice(&(u32::MAX - u32::from(value)).to_le_bytes())
            }
            5 if at + 8 <= bytes.len() => {
                bytes[at..at + 8].copy_from_slice(&(u64::MAX - u64::from(value)).to_le_bytes())
            }
            _ => {}
        }
    }
    bytes
}

/// `decode(bytes)`, and if it decodes, the same value from its own encoding.
fn round_trip<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, E>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> Option<T> {
    let value = decode(bytes).ok()?;
    let again = decode(&encode(&value));
    assert!(matches!(&again, Ok(same) if *same == value), "{value:?} encodes to what decodes as {again:?}");
    Some(value)
}

/// The same for types without `PartialEq` (openraft's), compared by their `Debug` output.
fn round_trip_debug<T: std::fmt::Debug, E: std::fmt::Debug>(
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, E>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> bool {
    let Ok(value) = decode(bytes) else { return false };
    let again = decode(&encode(&value));
    let (value, again) = (format!("{value:?}"), again.map(|again| format!("{again:?}")));
    assert!(matches!(&again, Ok(same) if *same == value), "{value} encodes to what decodes as {again:?}");
    true
}

/// `replication::protocol`: what replicas of a source say to each other.
pub fn replica_protocol(bytes: &[u8]) -> bool {
    let request = round_trip(bytes, ReplicaRequest::decode, ReplicaRequest::encode);
    let answer = round_trip(bytes, ReplicaAnswer::decode, ReplicaAnswer::encode);
    // A follower decodes a request within the frame it came in: the same request as a copy's.
    let frame: std::rc::Rc<dyn AsRef<[u8]>> = std::rc::Rc::new(bytes.to_vec());
    assert_eq!(ReplicaRequest::decode_held(&frame, (*frame).as_ref()).ok(), request);
    // A follower, and a new leader reading what it lacks, work out where each chunk ends.
    let chunks = match (&request, &answer) {
        (Some(ReplicaRequest::Append { logs, .. }), _) => logs.iter().flat_map(|log| &log.chunks).collect(),
        (_, Some(ReplicaAnswer::Read { chunks, .. })) => chunks.iter().collect(),
        _ => Vec::new(),
    };
    for chunk in chunks {
        chunk.end_offset();
    }
    request.is_some() || answer.is_some()
}

/// `control::codec`: a router's requests to another node's forwarders, and their answers.
pub fn control_codec(bytes: &[u8]) -> bool {
    let request = round_trip(bytes, ControlRequest::decode, ControlRequest::encode).is_some();
    let ok = round_trip(bytes, ControlOk::decode, ControlOk::encode).is_some();
    let reply = round_trip(bytes, crate::control::decode_reply, crate::control::encode_reply).is_some();
    request || ok || reply
}

/// `catalog::peer`: the catalog's raft messages, and the catalog entries they carry.
pub fn catalog_peer(bytes: &[u8]) -> bool {
    use crate::catalog::peer::*;
    [
        round_trip_debug(bytes, decode_append, encode_append),
        round_trip(bytes, decode_append_response, encode_append_response).is_some(),
        round_trip(bytes, decode_vote, encode_vote).is_some(),
        round_trip(bytes, decode_vote_response, encode_vote_response).is_some(),
        round_trip(bytes, decode_transfer_leader, encode_transfer_leader).is_some(),
        round_trip_debug(bytes, decode_snapshot, |(vote, snapshot)| encode_snapshot(vote, snapshot)),
        round_trip(bytes, decode_snapshot_response, encode_snapshot_response).is_some(),
        round_trip(bytes, decode_read_index, encode_read_index).is_some(),
        round_trip(bytes, CatalogEntry::decode, CatalogEntry::encode).is_some(),
    ]
    .contains(&true)
}

/// `catalog::store`: the catalog's raft log read back from disk, as records that passed their
/// checksum. The input is a series of records, each a two-byte length and its bytes.
pub fn catalog_store(bytes: &[u8]) -> bool {
    crate::catalog::store::replay_records(records_of(bytes)).is_ok()
}

/// The records of `catalog_store`'s input: a two-byte length, then that many bytes (fewer at
/// the end of the input).
fn records_of(bytes: &[u8]) -> Vec<&[u8]> {
    let mut records = Vec::new();
    let mut rest = bytes;
    while let [low, high, tail @ ..] = rest {
        let length = (u16::from_le_bytes([*low, *high]) as usize).min(tail.len());
        records.push(&tail[..length]);
        rest = &tail[length..];
    }
    records
}

/// `net::peer`: the cluster port's messages besides raft's and the control ones.
pub fn native_peer(bytes: &[u8]) -> bool {
    use crate::net::peer::*;
    let status = round_trip(bytes, decode_cluster_status, encode_cluster_status).is_some();
    let elections =
        round_trip(bytes, decode_want_elections, |topics| encode_want_elections(topics)).is_some();
    let push_key = round_trip(bytes, crate::push::keys::decode_push_key, crate::push::keys::encode_push_key);
    status || elections || push_key.is_some() || carried(bytes)
}

/// `dispatch::codec`, also on the cluster port: an operation another node carries to this one
/// with its principal, and the answer that goes back.
fn carried(bytes: &[u8]) -> bool {
    use crate::dispatch::{decode_answer, decode_carried, encode_answer, encode_carried};
    let operation = decode_carried(bytes);
    if let Ok((principal, operation)) = &operation {
        let again = decode_carried(&encode_carried(principal, operation));
        assert_eq!(again.as_ref(), Ok(&(principal.clone(), operation.clone())));
    }
    let answer = round_trip(bytes, decode_answer, encode_answer).is_some();
    operation.is_ok() || answer
}

fn log_id(term: u64, node_id: u64, index: u64) -> LogId {
    LogId::new(LeaderId { term, node_id }, index)
}

fn settings() -> SubscriptionSettings {
    settings_pushed_in(crate::catalog::PUSH_PROJECT_DEFAULT)
}

/// `settings()`, pushed naming the subscription in `project`: a project other than the default
/// is written after the push configuration (`catalog::entry::encode_push_ending`), or in the
/// carried operations' format 3.
fn settings_pushed_in(project: &str) -> SubscriptionSettings {
    SubscriptionSettings {
        ack_deadline_seconds: 30,
        retain_acked_messages: true,
        message_retention_seconds: 86_400,
        enable_message_ordering: true,
        filter: "attributes.kind = \"a\"".to_owned(),
        dead_letter_topic: "projects/p/topics/dead".to_owned(),
        max_delivery_attempts: 5,
        minimum_backoff_seconds: 10,
        maximum_backoff_seconds: 600,
        expiration_ttl_seconds: 604_800,
        labels: Labels::from([("team".to_owned(), "ops".to_owned())]),
        enable_exactly_once_delivery: true,
        push: Some(Box::new(crate::catalog::PushConfig {
            endpoint: "https://receiver.example/push".to_owned(),
            attributes: Labels::from([("x-goog-version".to_owned(), "v1".to_owned())]),
            wrapper: crate::catalog::PushWrapper::NoWrapper { write_metadata: true },
            oidc_token: Some(crate::catalog::OidcToken {
                service_account_email: "pusher@p.iam.example".to_owned(),
                audience: String::new(),
            }),
            project: project.to_owned(),
        })),
    }
}

/// A catalog entry of each kind.
fn catalog_entries() -> Vec<CatalogEntry> {
    let mut entries = catalog_entries_before_the_gate();
    entries.extend(source_gate());
    entries
}

/// A catalog entry of each kind but the delivery gate's.
fn catalog_entries_before_the_gate() -> Vec<CatalogEntry> {
    let topic = TopicRecord {
        id: TopicId::new(5),
        name: "projects/p/topics/orders".into(),
        message_retention_seconds: 3600,
        shard: ShardId::from_global(0x1_0001),
        created_ms: 1_700_000_000_000,
        labels: Labels::from([("tier".to_owned(), "gold".to_owned())]),
        replicas: [0x1_0001, 0x2_0001, 0x3_0001].map(ShardId::from_global).to_vec(),
        epoch: 2,
    };
    let subscription = SubscriptionRecord {
        id: 6,
        name: "projects/p/subscriptions/billing".into(),
        topic_id: TopicId::new(5),
        topic_name: topic.name.clone(),
        start_offset: 40,
        settings: settings(),
        created_ms: 1_700_000_000_001,
        detached: false,
        source_starts: Vec::new(),
    };
    vec![
        CatalogEntry::Boot { count: 3 },
        CatalogEntry::TopicCreated(topic.clone()),
        CatalogEntry::TopicCreated(TopicRecord {
            replicas: Vec::new(),
            epoch: 0,
            labels: Labels::new(),
            ..topic
        }),
        CatalogEntry::TopicDeleted { id: TopicId::new(5) },
        CatalogEntry::SubscriptionCreated(subscription.clone()),
        CatalogEntry::SubscriptionDeleted { id: 6, name: "projects/p/subscriptions/billing".to_owned() },
        CatalogEntry::SnapshotCreated(SnapshotRecord {
            id: crate::ids::SnapshotId::new(7),
            name: "projects/p/snapshots/s".to_owned(),
            topic_id: TopicId::new(5),
            expire_time_ms: 1_800_000_000_000,
            labels: Labels::new(),
        }),
        CatalogEntry::SnapshotDeleted {
            id: crate::ids::SnapshotId::new(7),
            name: "projects/p/snapshots/s".to_owned(),
        },
        CatalogEntry::TopicUpdated {
            id: TopicId::new(5),
            message_retention_seconds: 60,
            labels: Labels::new(),
        },
        CatalogEntry::SubscriptionUpdated {
            id: 6,
            name: "projects/p/subscriptions/b".to_owned(),
            settings: settings(),
        },
        CatalogEntry::SubscriptionUpdated {
            id: 6,
            name: "projects/p/subscriptions/b".to_owned(),
            settings: settings_pushed_in("my-proj"),
        },
        CatalogEntry::TopicPlaced { id: TopicId::new(5), shard: ShardId::from_global(2) },
        CatalogEntry::NextId { next_id: 99 },
        CatalogEntry::SnapshotUpdated {
            id: crate::ids::SnapshotId::new(7),
            name: "projects/p/snapshots/s".to_owned(),
            labels: Labels::new(),
        },
        CatalogEntry::SubscriptionDetached { id: 6, name: "projects/p/subscriptions/b".to_owned() },
        CatalogEntry::NodeRegistered(NodeRecord {
            node_id: NodeId::new(2),
            cluster_address: "10.0.0.2:7460".to_owned(),
            router_address: "10.0.0.2:7450".to_owned(),
            forwarders: vec!["10.0.0.2:7451".to_owned(), "10.0.0.2:7452".to_owned()],
            grpc_address: "10.0.0.2:8085".to_owned(),
        }),
        CatalogEntry::NodeRemoved { node_id: NodeId::new(3) },
        CatalogEntry::NodeDraining { node_id: NodeId::new(2), draining: true },
        CatalogEntry::RoutingRulesSet {
            rules: vec![crate::catalog::routing::RoutingRule {
                selector: crate::catalog::routing::ClientSelector::From(
                    crate::catalog::routing::Cidr::parse("10.0.0.0/8").unwrap(),
                ),
                allow: false,
                nodes: [NodeId::new(3)].into(),
            }],
        },
        CatalogEntry::SourcePolicySet {
            topic_id: TopicId::new(5),
            bounds: Some(crate::catalog::SourceBounds { min: 1, max: 4 }),
        },
        CatalogEntry::SourcePolicySet { topic_id: TopicId::new(5), bounds: None },
        CatalogEntry::TopicReplicasChanged {
            id: TopicId::new(5),
            replicas: vec![ShardId::from_global(0x1_0001), ShardId::from_global(0x2_0002)],
        },
        CatalogEntry::TopicLeaderElected {
            id: TopicId::new(5),
            epoch: 3,
            leader: ShardId::from_global(0x2_0002),
        },
        CatalogEntry::SourceAdded(crate::catalog::SourceRecord {
            id: TopicId::new(8),
            topic_id: TopicId::new(5),
            source: crate::ids::SourceId::new(1).unwrap(),
            shard: ShardId::from_global(0x2_0000),
            created_ms: 1_700_000_000_002,
            replicas: [0x2_0000, 0x3_0000, 0x1_0000].map(ShardId::from_global).to_vec(),
            epoch: 1,
            retiring: false,
        }),
        source_retiring(),
        source_deleted(),
        CatalogEntry::SubscriptionCreated(SubscriptionRecord {
            id: 9,
            name: "projects/p/subscriptions/audit".into(),
            source_starts: vec![(crate::ids::SourceId::new(1).unwrap(), 17)],
            ..subscription.clone()
        }),
    ]
}

/// The delivery gate's entries: `catalog_entries`' topic's second change, from three sources,
/// a subscription's pass of it, and its sources' application of it.
fn source_gate() -> [CatalogEntry; 3] {
    let gate = crate::catalog::entry::SourceGate { generation: 2, before: 3, applied: false };
    [
        CatalogEntry::SourceGate { topic_id: TopicId::new(5), gate },
        CatalogEntry::SourcesPassed { id: 9, name: "orders".to_owned(), generation: 2 },
        CatalogEntry::SourcesApplied { topic_id: TopicId::new(5), generation: 2 },
    ]
}

/// Source 1 of `catalog_entries`' topic retires, then goes.
fn source_retiring() -> CatalogEntry {
    CatalogEntry::SourceRetiring { topic_id: TopicId::new(5), source: crate::ids::SourceId::new(1).unwrap() }
}

fn source_deleted() -> CatalogEntry {
    CatalogEntry::SourceDeleted {
        topic_id: TopicId::new(5),
        source: crate::ids::SourceId::new(1).unwrap(),
        id: TopicId::new(8),
    }
}

/// Raft entries of each payload, catalog entries of each kind among them.
fn raft_entries() -> Vec<Entry> {
    let membership = Membership::new_with_defaults(vec![BTreeSet::from([1, 2, 3])], vec![4]);
    let mut entries = vec![
        Entry { log_id: log_id(7, 2, 10), payload: EntryPayload::Blank },
        Entry { log_id: log_id(7, 2, 11), payload: EntryPayload::Membership(membership) },
    ];
    for (index, entry) in catalog_entries().into_iter().enumerate() {
        entries.push(Entry { log_id: log_id(7, 2, 12 + index as u64), payload: EntryPayload::Normal(entry) });
    }
    entries
}

fn replica_samples() -> Vec<Vec<u8>> {
    let history = EpochHistory::of_epochs([1, 1, 3, 4]);
    let chunk =
        |first_offset, epoch| Chunk { first_offset, epoch, record_count: 2, records: vec![7; 24].into() };
    let requests = [
        ReplicaRequest::Sync {
            topic_id: TopicId::new(9),
            leader_epoch: Epoch::new(4),
            stamp: 0,
            logs: [
                LogTip { history: history.clone(), end: Offset::new(4), start: Offset::new(2) },
                LogTip::default(),
            ],
        },
        ReplicaRequest::Append {
            topic_id: TopicId::new(9),
            leader_epoch: Epoch::new(4),
            stamp: 0,
            logs: [
                LogAppend {
                    chunks: vec![chunk(Offset::new(4), Epoch::new(3)), chunk(Offset::new(6), Epoch::new(4))],
                    committed_end: Offset::new(3),
                    start_offset: Offset::new(0),
                },
                LogAppend {
                    chunks: vec![chunk(Offset::new(0), Epoch::new(4))],
                    committed_end: Offset::new(0),
                    start_offset: Offset::new(0),
                },
            ],
        },
        ReplicaRequest::Fence { topic_id: TopicId::new(9), epoch: Epoch::new(5) },
        ReplicaRequest::Read {
            topic_id: TopicId::new(9),
            log: JOURNAL as u8,
            from: Offset::new(3),
            bytes_max: 1 << 20,
        },
    ];
    let answers = [
        ReplicaAnswer::Synced { next_offsets: [Offset::new(4); LOGS] },
        ReplicaAnswer::Appended { durable_ends: [Offset::new(8), Offset::new(2)] },
        ReplicaAnswer::Fenced {
            logs: [
                FencedLog { last_epoch: Epoch::new(4), durable_end: Offset::new(8), history },
                FencedLog::default(),
            ],
        },
        ReplicaAnswer::Read {
            chunks: vec![chunk(Offset::new(0), Epoch::new(1)), chunk(Offset::new(2), Epoch::new(2))],
            durable_end: Offset::new(4),
        },
        ReplicaAnswer::Deposed { promised_epoch: Epoch::new(7) },
        ReplicaAnswer::Stale { synced_stamp: 3 },
    ];
    // The stamped forms of the sync and the append, beside the unstamped ones.
    let stamped = requests[..2].iter().cloned().map(|mut request| {
        if let ReplicaRequest::Sync { stamp, .. } | ReplicaRequest::Append { stamp, .. } = &mut request {
            *stamp = 2;
        }
        request
    });
    let requests: Vec<ReplicaRequest> = requests.iter().cloned().chain(stamped).collect();
    requests.iter().map(ReplicaRequest::encode).chain(answers.iter().map(ReplicaAnswer::encode)).collect()
}

fn control_samples() -> Vec<Vec<u8>> {
    let requests = [
        ControlRequest::AttachTopic {
            topic_id: TopicId::new(5),
            name: "projects/p/topics/orders".to_owned(),
            retention_seconds: 3600,
            recovering: true,
            source: crate::ids::SourceId::FIRST,
            active: 1,
        },
        ControlRequest::AttachSubscription {
            subscription_id: 6,
            name: "projects/p/subscriptions/billing".to_owned(),
            topic_id: TopicId::new(5),
            settings: settings(),
            create: true,
            start_offset: 40,
        },
        ControlRequest::Seek {
            subscription_id: 6,
            topic_id: TopicId::new(5),
            time_ms: 0,
            snapshot_id: Some(crate::ids::SnapshotId::new(7)),
        },
        ControlRequest::UpdateSettings {
            topic_id: TopicId::new(5),
            update: SettingsUpdate::Subscription { subscription_id: 6, settings: settings() },
        },
        ControlRequest::UpdateSettings {
            topic_id: TopicId::new(5),
            update: SettingsUpdate::Subscription {
                subscription_id: 6,
                settings: settings_pushed_in("my-proj"),
            },
        },
        ControlRequest::PromoteReplica {
            topic_id: TopicId::new(5),
            epoch: 3,
            replicas: vec![crate::replication::source::Peer {
                shard: crate::ids::ShardId::from_global(1),
                address: "10.0.0.1:7451".to_owned(),
            }],
        },
        ControlRequest::ClusterHosts { hosts: vec!["10.0.0.4".parse().unwrap(), "fd00::4".parse().unwrap()] },
        ControlRequest::ReplicaProgress { topic_id: TopicId::new(5) },
    ];
    let topic = crate::api::stats::TopicStats {
        name: "projects/p/topics/orders".to_owned(),
        subscriptions: vec![crate::api::stats::SubscriptionStats {
            name: "projects/p/subscriptions/billing".to_owned(),
            ..Default::default()
        }],
        replication: Some(crate::api::stats::ReplicaStats {
            followers: vec![crate::api::stats::FollowerStats {
                address: "10.0.0.2:7451".to_owned(),
                answered_ms_ago: Some(12),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let histogram = crate::metrics::histogram::DurationHistogram {
        buckets: vec![1; crate::metrics::histogram::DURATION_BUCKETS + 1],
        sum_us: 7,
    };
    let oks = [
        ControlOk::Done,
        ControlOk::Stats(crate::api::stats::ShardStats::default(), vec![topic.clone()]),
        // With a push subscription's figures, the reply's other tag.
        ControlOk::Stats(crate::api::stats::ShardStats::default(), {
            let mut pushed = topic;
            pushed.subscriptions[0].push = Some(crate::api::stats::PushStats {
                endpoint: "https://receiver.example/push".to_owned(),
                window: 4,
                last_error: Some(crate::api::stats::PushError {
                    reason: "HTTP status 500".to_owned(),
                    ms_ago: 9,
                }),
                requests_by_class: vec![("5xx".to_owned(), 1)],
                ..Default::default()
            });
            vec![pushed]
        }),
        ControlOk::Requests(crate::metrics::shard::ShardFigures {
            commands: vec![crate::metrics::requests::CommandFigures {
                command: 6,
                codes: vec![(0, 41)],
                duration: histogram.clone(),
            }],
            publish_ack: histogram,
            ..Default::default()
        }),
        ControlOk::Topics(vec![TopicId::new(1), TopicId::new(2), TopicId::new(3)]),
        ControlOk::Progress(crate::control::ReplicaProgress {
            leader: true,
            epoch: 4,
            followers: vec![(1, [90, 6])],
            ..Default::default()
        }),
    ];
    let mut samples: Vec<Vec<u8>> = requests.iter().map(ControlRequest::encode).collect();
    samples.extend(oks.iter().map(ControlOk::encode));
    let failed = Err(crate::api::Status::new(crate::api::Code::NotFound, "no such topic"));
    samples.push(crate::control::encode_reply(&failed));
    samples.push(crate::control::encode_reply(&Ok(ControlOk::SubscriptionStart(40))));
    samples
}

fn catalog_peer_samples() -> Vec<Vec<u8>> {
    use crate::catalog::peer::*;
    let mut vote = Vote::new(7, 2);
    vote.committed = true;
    let append = AppendEntriesRequest {
        vote,
        prev_log_id: Some(log_id(6, 1, 9)),
        entries: raft_entries(),
        leader_commit: Some(log_id(6, 1, 8)),
    };
    let membership =
        Membership::new_with_defaults(vec![BTreeSet::from([1, 2]), BTreeSet::from([2, 3])], vec![]);
    let snapshot = Snapshot {
        meta: SnapshotMeta {
            last_log_id: Some(log_id(7, 2, 12)),
            last_membership: StoredMembership::new(Some(log_id(7, 2, 11)), membership),
        },
        snapshot: vec![1, 2, 3, 4],
    };
    let mut samples = vec![
        encode_append(&append),
        encode_append_response(&AppendEntriesResponse::PartialSuccess(Some(log_id(3, 1, 4)))),
        encode_append_response(&AppendEntriesResponse::HigherVote(vote)),
        encode_vote(&VoteRequest::new(Vote::new(8, 3), Some(log_id(7, 2, 12)))),
        encode_vote_response(&VoteResponse { vote, vote_granted: true, last_log_id: None }),
        encode_transfer_leader(&openraft::raft::TransferLeaderRequest::new(vote, 2, Some(log_id(7, 2, 12)))),
        encode_snapshot(&vote, &snapshot),
        encode_snapshot_response(&SnapshotResponse { vote }),
        encode_read_index(&Some(log_id(9, 1, 40))),
    ];
    samples.extend(catalog_entries().iter().map(CatalogEntry::encode));
    samples
}

/// Series of records as `catalog_store` reads them: each record alone, then all in a row.
fn catalog_store_samples() -> Vec<Vec<u8>> {
    let records =
        crate::catalog::store::sample_records(&raft_entries(), &Vote::new(7, 2), Some(log_id(7, 2, 11)));
    let framed = |record: &Vec<u8>| [&(record.len() as u16).to_le_bytes()[..], record].concat();
    let mut samples: Vec<Vec<u8>> = records.iter().map(framed).collect();
    samples.push(records.iter().flat_map(framed).collect());
    samples
}

fn native_peer_samples() -> Vec<Vec<u8>> {
    use crate::net::peer::*;
    let status = crate::api::cluster::ClusterStatus {
        node_id: NodeId::new(2),
        catalog_leader: Some(NodeId::new(3)),
        term: 7,
        last_log_index: Some(40),
        last_applied_index: None,
        nodes: vec![crate::api::cluster::NodeStatus {
            node_id: NodeId::new(1),
            cluster_address: "10.0.0.1:7460".into(),
            router_address: "10.0.0.1:7450".into(),
            voter: true,
            role: "follower".into(),
            matched_index: Some(39),
            heard_ms_ago: Some(250),
        }],
        ..Default::default()
    };
    let topic = crate::api::control::Topic { name: "orders".into(), ..Default::default() };
    let created = crate::dispatch::Carried {
        applied: Some(41),
        outcome: Ok(crate::dispatch::Outcome::Topic(topic.clone())),
    };
    let refused =
        crate::dispatch::Carried { applied: None, outcome: Err(crate::api::Status::not_found("no topic")) };
    let pushed_in_my_project = crate::api::control::Subscription {
        name: "billing".into(),
        topic: "orders".into(),
        settings: settings_pushed_in("my-proj"),
        detached: false,
    };
    vec![
        encode_cluster_status(&status),
        encode_want_elections(&[TopicId::new(5), TopicId::new(6), TopicId::new(7)]),
        crate::push::keys::encode_push_key(&crate::push::keys::PushKey {
            key_id: "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs".to_owned(),
            modulus: "0vx7agoebGc".to_owned(),
            exponent: "AQAB".to_owned(),
        }),
        crate::dispatch::encode_carried(
            &crate::auth::Principal::Named("alice".into()),
            &crate::dispatch::Operation::CreateTopic(topic),
        ),
        crate::dispatch::encode_carried(
            &crate::auth::Principal::Anonymous,
            &crate::dispatch::Operation::LookupTopic { name: "orders".into() },
        ),
        crate::dispatch::encode_answer(&created),
        crate::dispatch::encode_answer(&refused),
        // A push subscription of another project than the default: the carried format 3.
        crate::dispatch::encode_carried(
            &crate::auth::Principal::Anonymous,
            &crate::dispatch::Operation::CreateSubscription(pushed_in_my_project.clone()),
        ),
        crate::dispatch::encode_answer(&crate::dispatch::Carried {
            applied: Some(42),
            outcome: Ok(crate::dispatch::Outcome::Subscription(crate::dispatch::SubscriptionShown {
                subscription: pushed_in_my_project,
                topic_retention_seconds: 3600,
            })),
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Each family's samples decode, so that mutating them starts from valid messages.
    #[test]
    fn every_sample_decodes() {
        for family in Family::ALL {
            for sample in family.samples() {
                assert!(family.decode(&sample), "{family:?}: a sample does not decode: {sample:?}");
            }
        }
    }

    /// Every proper prefix of a sample, and the sample with a byte more, through every decoder.
    #[test]
    fn every_cut_and_every_extension_of_a_sample_is_refused_or_decodes_without_panic() {
        for family in Family::ALL {
            for sample in family.samples() {
                for cut in 0..sample.len() {
                    family.decode(&sample[..cut]);
                }
                family.decode(&[&sample[..], &[0]].concat());
            }
        }
    }

    /// Found by `mutated_samples_never_panic`: a chunk whose first offset and record count add
    /// past 2^64 decoded, and the follower that appends it (or the new leader that reads it)
    /// overflowed working out where it ends. The decoder now refuses it.
    #[test]
    fn a_chunk_that_ends_past_the_last_offset_is_refused() {
        let found = [1, 145, 27, 149, 1, 0, 117, 27, 9, 0, 41, 47, 184, 0, 171, 83, 1, 0];
        fuzz(Family::ReplicaProtocol, &found);

        let chunk = Chunk {
            first_offset: Offset::new(u64::MAX - 1),
            epoch: Epoch::new(1),
            record_count: 2,
            records: vec![7; 24].into(),
        };
        let append = LogAppend {
            chunks: vec![chunk.clone()],
            committed_end: Offset::new(0),
            start_offset: Offset::new(0),
        };
        let request = ReplicaRequest::Append {
            topic_id: TopicId::new(9),
            leader_epoch: Epoch::new(1),
            stamp: 0,
            logs: [append, LogAppend::default()],
        };
        assert!(ReplicaRequest::decode(&request.encode()).is_err());
        let answer = ReplicaAnswer::Read { chunks: vec![chunk], durable_end: Offset::new(0) };
        assert!(ReplicaAnswer::decode(&answer.encode()).is_err());

        // The last chunk that fits still decodes.
        let last = Chunk {
            first_offset: Offset::new(u64::MAX - 2),
            epoch: Epoch::new(1),
            record_count: 2,
            records: vec![7; 24].into(),
        };
        let answer = ReplicaAnswer::Read { chunks: vec![last], durable_end: Offset::new(0) };
        assert_eq!(ReplicaAnswer::decode(&answer.encode()), Ok(answer));
    }

    /// Found by `mutated_samples_never_panic`: a raft log holding a purge (or a truncation)
    /// marker at the last index there is overflowed its recovery, which keeps what follows it.
    /// Now a purge there purges everything, and a truncation after it truncates nothing.
    #[test]
    fn markers_at_the_last_index_replay_without_overflow() {
        let found = [1, 3, 9, 3, 0, 1, 131, 17, 11, 0, 40, 27, 182, 0, 2, 57, 60, 0, 8, 3, 55, 0];
        fuzz(Family::CatalogStore, &found);

        let last = Some(log_id(7, 2, u64::MAX));
        let records = crate::catalog::store::sample_records(&raft_entries(), &Vote::new(7, 2), last);
        assert!(crate::catalog::store::replay_records(records.iter().map(Vec::as_slice)).is_ok());
        // And each marker alone, after the entries (the samples put the vote and the six
        // markers first).
        let (markers, entries) = records.split_at(7);
        for marker in markers {
            let series = entries.iter().chain([marker]).map(Vec::as_slice);
            assert!(crate::catalog::store::replay_records(series).is_ok());
        }
    }

    fn family() -> impl Strategy<Value = Family> {
        proptest::sample::select(Family::ALL.to_vec())
    }

    proptest! {
        // 2,000 cases each by default, under a second; PROPTEST_CASES=1000000 for a long run.
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(2000),
            ..ProptestConfig::default()
        })]

        #[test]
        fn random_bytes_never_panic(family in family(), bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            family.decode(&bytes);
        }

        /// A sample changed as a fuzzer would change it: a byte set, a cut, a byte inserted,
        /// a count or length written (small, or near 2^32).
        #[test]
        fn mutated_samples_never_panic(
            family in family(),
            choice in any::<u8>(),
            edits in proptest::collection::vec(any::<u8>(), 0..(4 * EDITS_MAX)),
        ) {
            fuzz(family, &[&[1, choice][..], &edits].concat());
        }
    }
}
