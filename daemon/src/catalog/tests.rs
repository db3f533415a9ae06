use super::*;
use crate::catalog::entry::SourceGate;
use crate::ids::{NodeId, ShardId, SnapshotId, TopicId};
use crate::log::tests::{directories, run};
use crate::storage::sim::{CrashMode, SimDisk};

/// Node `node`'s forwarder `local`.
fn forwarder(node: u64, local: u32) -> ShardId {
    ShardId::new(NodeId::new(node), local)
}

/// Topic `id` on node 1's forwarder `local`.
pub(super) fn topic(id: u64, local: u32) -> CatalogEntry {
    CatalogEntry::TopicCreated(TopicRecord {
        id: TopicId::new(id),
        name: format!("topic-{id}").into(),
        message_retention_seconds: 0,
        shard: forwarder(1, local),
        created_ms: 1_700_000_000_000 + id,
        labels: Labels::new(),
        replicas: Vec::new(),
        epoch: 0,
    })
}

fn subscription(id: u64, topic_id: u64) -> CatalogEntry {
    CatalogEntry::SubscriptionCreated(SubscriptionRecord {
        id,
        name: format!("subscription-{id}").into(),
        topic_id: TopicId::new(topic_id),
        topic_name: format!("topic-{topic_id}").into(),
        start_offset: id * 3,
        settings: SubscriptionSettings { ack_deadline_seconds: 10, ..Default::default() },
        created_ms: 0,
        detached: false,
        source_starts: Vec::new(),
    })
}

/// A history with every kind of entry, deletions, updates and a refused creation.
fn history() -> Vec<CatalogEntry> {
    let mut entries = Vec::new();
    for id in (1..60u64).step_by(3) {
        entries.push(topic(id, (id % 3) as u32));
        entries.push(subscription(id + 1, id));
        if id % 2 == 0 {
            entries.push(CatalogEntry::SubscriptionDeleted {
                id: id + 1,
                name: format!("subscription-{}", id + 1),
            });
            entries.push(CatalogEntry::TopicDeleted { id: TopicId::new(id) });
        }
    }
    entries.push(CatalogEntry::TopicUpdated {
        id: TopicId::new(1),
        message_retention_seconds: 600,
        labels: labels("env"),
    });
    entries.push(CatalogEntry::SnapshotCreated(SnapshotRecord {
        id: SnapshotId::new(100),
        name: "before".into(),
        topic_id: TopicId::new(1),
        expire_time_ms: 9,
        labels: Labels::new(),
    }));
    entries.push(CatalogEntry::SnapshotUpdated {
        id: SnapshotId::new(100),
        name: "before".into(),
        labels: labels("kept"),
    });
    entries.push(labeled_subscription(80, 1));
    entries.push(CatalogEntry::SubscriptionDetached { id: 80, name: "subscription-80".into() });
    entries.push(CatalogEntry::TopicPlaced { id: TopicId::new(7), shard: forwarder(1, 0) });
    // Refused: the name is taken by another id.
    entries.push(CatalogEntry::TopicCreated(TopicRecord {
        id: TopicId::new(200),
        name: "topic-1".into(),
        message_retention_seconds: 5,
        shard: forwarder(1, 1),
        created_ms: 0,
        labels: Labels::new(),
        replicas: Vec::new(),
        epoch: 0,
    }));
    entries
}

fn labels(value: &str) -> Labels {
    [("team".to_owned(), value.to_owned()), ("tier".to_owned(), String::new())].into_iter().collect()
}

/// A subscription that uses every field added after the first encoding.
fn labeled_subscription(id: u64, topic_id: u64) -> CatalogEntry {
    let CatalogEntry::SubscriptionCreated(mut record) = subscription(id, topic_id) else { unreachable!() };
    record.settings.labels = labels("orders");
    record.settings.enable_exactly_once_delivery = true;
    record.created_ms = 1_700_000_000_000;
    CatalogEntry::SubscriptionCreated(record)
}

#[test]
fn apply_is_deterministic() {
    let mut first = CatalogState::default();
    let mut second = CatalogState::default();
    let answers_first: Vec<Applied> = history().into_iter().map(|entry| first.apply(entry)).collect();
    let answers_second: Vec<Applied> = history().into_iter().map(|entry| second.apply(entry)).collect();
    assert_eq!(first, second);
    assert_eq!(answers_first, answers_second);
    assert!(matches!(answers_first.last(), Some(Applied::Refused(_))));
    assert_eq!(first.topics["topic-1"].message_retention_seconds, 600);
    assert_eq!(first.topics["topic-7"].shard, forwarder(1, 0));
    assert_eq!(first.topics["topic-1"].labels, labels("env"));
    assert_eq!(first.snapshots["before"].labels, labels("kept"));
    let detached = &first.subscriptions["subscription-80"];
    assert!(detached.detached && detached.settings.enable_exactly_once_delivery);
    assert_eq!(detached.settings.labels, labels("orders"));
    assert_eq!(first.next_id, 101, "the counter passes every id used");
}

/// A snapshot of the state after some entries, decoded and followed by the rest, is the
/// state after all of them.
#[test]
fn a_snapshot_and_the_entries_after_it_make_the_live_state() {
    let entries = history();
    for cut in [0, 1, entries.len() / 2, entries.len()] {
        let mut live = CatalogState::default();
        for entry in entries[..cut].iter().cloned() {
            live.apply(entry);
        }
        let mut restored = CatalogState::decode(&live.encode()).unwrap();
        for entry in entries[cut..].iter().cloned() {
            live.apply(entry.clone());
            restored.apply(entry);
        }
        assert_eq!(restored, live, "cut at {cut}");
    }
}

#[test]
fn entries_round_trip() {
    for entry in history().into_iter().chain([
        CatalogEntry::Boot { count: 3 },
        CatalogEntry::NextId { next_id: 77 },
        CatalogEntry::SubscriptionDeleted { id: 6, name: String::new() },
        CatalogEntry::SnapshotDeleted { id: SnapshotId::new(8), name: "before".into() },
        CatalogEntry::SubscriptionUpdated {
            id: 6,
            name: "audit".into(),
            settings: SubscriptionSettings { filter: "attributes:y".into(), ..Default::default() },
        },
        CatalogEntry::SubscriptionUpdated {
            id: 6,
            name: "audit".into(),
            settings: SubscriptionSettings { labels: labels("x"), ..Default::default() },
        },
        CatalogEntry::SubscriptionUpdated {
            id: 6,
            name: "audit".into(),
            settings: SubscriptionSettings { enable_exactly_once_delivery: true, ..Default::default() },
        },
        CatalogEntry::TopicCreated(TopicRecord {
            id: TopicId::new(3),
            name: "labeled".into(),
            message_retention_seconds: 0,
            shard: forwarder(1, 1),
            created_ms: 5,
            labels: labels("y"),
            replicas: Vec::new(),
            epoch: 0,
        }),
        CatalogEntry::SnapshotCreated(SnapshotRecord {
            id: SnapshotId::new(4),
            name: "labeled".into(),
            topic_id: TopicId::new(3),
            expire_time_ms: 9,
            labels: labels("z"),
        }),
        CatalogEntry::NodeRegistered(node_record("")),
        CatalogEntry::NodeRegistered(node_record("10.0.0.2:8085")),
        CatalogEntry::NodeRegistered(NodeRecord::admitted(NodeId::new(4), "10.0.0.4:7460".into())),
        CatalogEntry::NodeRemoved { node_id: NodeId::new(4) },
        CatalogEntry::NodeDraining { node_id: NodeId::new(2), draining: true },
        CatalogEntry::NodeDraining { node_id: NodeId::new(2), draining: false },
        CatalogEntry::RoutingRulesSet { rules: routing_rules() },
        CatalogEntry::RoutingRulesSet { rules: Vec::new() },
        CatalogEntry::SourcePolicySet {
            topic_id: TopicId::new(3),
            bounds: Some(SourceBounds { min: 2, max: 6 }),
        },
        CatalogEntry::SourcePolicySet { topic_id: TopicId::new(3), bounds: None },
    ]) {
        assert_eq!(CatalogEntry::decode(&entry.encode()), Ok(entry.clone()));
    }
}

/// Node 2 of a cluster, its gRPC API at `grpc_address` (empty: none).
fn node_record(grpc_address: &str) -> NodeRecord {
    NodeRecord {
        node_id: NodeId::new(2),
        cluster_address: "10.0.0.2:7460".into(),
        router_address: "10.0.0.2:7450".into(),
        forwarders: vec!["10.0.0.2:7451".into(), "10.0.0.2:7452".into()],
        grpc_address: grpc_address.into(),
    }
}

/// A node admitted (address only) is a record placement gives nothing to; its registration
/// fills it in; its removal drops it, from the state and from a checkpoint of it.
#[test]
fn an_admitted_node_registers_and_is_removed() {
    let mut state = CatalogState::default();
    state.apply(CatalogEntry::NodeRegistered(node_record("")));
    state.apply(CatalogEntry::NodeRegistered(NodeRecord::admitted(NodeId::new(4), "10.0.0.4:7460".into())));
    assert!(state.nodes[&NodeId::new(4)].forwarders.is_empty());
    let restored = CatalogState::decode(&state.encode()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(state.apply(CatalogEntry::NodeRemoved { node_id: NodeId::new(4) }), Applied::Updated(true));
    assert_eq!(state.apply(CatalogEntry::NodeRemoved { node_id: NodeId::new(4) }), Applied::Updated(false));
    assert_eq!(state.nodes.keys().copied().collect::<Vec<_>>(), vec![NodeId::new(2)]);
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state);
}

/// A rule of each selector.
fn routing_rules() -> Vec<crate::catalog::routing::RoutingRule> {
    use crate::catalog::routing::{Cidr, ClientSelector, RoutingRule};
    vec![
        RoutingRule {
            selector: ClientSelector::Principal("billing".into()),
            allow: true,
            nodes: [NodeId::new(1), NodeId::new(2)].into(),
        },
        RoutingRule {
            selector: ClientSelector::From(Cidr::parse("2001:db8::/32").unwrap()),
            allow: false,
            nodes: [NodeId::new(3)].into(),
        },
    ]
}

/// Routing rules are kept whole by a checkpoint; a catalog without them is checkpointed in the
/// bytes it was before they existed.
#[test]
fn routing_rules_are_restated_by_a_checkpoint() {
    let mut state = CatalogState::default();
    state.apply(CatalogEntry::NodeRegistered(node_record("")));
    let without = state.encode();
    state.apply(CatalogEntry::RoutingRulesSet { rules: routing_rules() });
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state);
    state.apply(CatalogEntry::RoutingRulesSet { rules: Vec::new() });
    assert_eq!(state.encode(), without);
}

/// A topic whose sources follow its load keeps its bounds in a checkpoint until it is fixed
/// again or deleted; a catalog of fixed topics is checkpointed in the bytes it was before the
/// policy existed; bounds out of order are refused at decoding.
#[test]
fn a_topics_source_policy_is_restated_by_a_checkpoint_until_fixed_or_deleted() {
    let mut state = CatalogState::default();
    let topic = TopicRecord {
        id: TopicId::new(3),
        name: "hot".into(),
        message_retention_seconds: 0,
        shard: forwarder(1, 1),
        created_ms: 5,
        labels: Labels::new(),
        replicas: Vec::new(),
        epoch: 0,
    };
    state.apply(CatalogEntry::TopicCreated(topic.clone()));
    let fixed = state.encode();
    let bounds = SourceBounds { min: 1, max: 3 };
    let follow = CatalogEntry::SourcePolicySet { topic_id: topic.id, bounds: Some(bounds) };
    assert_eq!(state.apply(follow.clone()), Applied::Updated(true));
    assert_eq!(state.source_policies[&topic.id], bounds);
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state);
    assert_eq!(
        state.apply(CatalogEntry::SourcePolicySet { topic_id: topic.id, bounds: None }),
        Applied::Updated(true)
    );
    assert_eq!(state.encode(), fixed);
    state.apply(follow.clone());
    state.apply(CatalogEntry::TopicDeleted { id: topic.id });
    assert!(state.source_policies.is_empty(), "a deleted topic's policy goes with it");
    assert_eq!(state.apply(follow), Applied::Updated(false), "nor comes back for it");
    let mut reversed =
        CatalogEntry::SourcePolicySet { topic_id: topic.id, bounds: Some(SourceBounds { min: 4, max: 2 }) }
            .encode();
    assert!(CatalogEntry::decode(&reversed).is_err());
    reversed.push(0);
    assert!(CatalogEntry::decode(&reversed).is_err());
}

/// A drained node stays drained in a checkpoint (so across a restart), until undrained or
/// removed; an unregistered node does not drain; a catalog without drains is checkpointed in
/// the bytes it was before drains existed.
#[test]
fn a_draining_node_is_restated_by_a_checkpoint_until_undrained_or_removed() {
    let mut state = CatalogState::default();
    state.apply(CatalogEntry::NodeRegistered(node_record("")));
    let undrained = state.encode();
    let two = NodeId::new(2);
    assert_eq!(
        state.apply(CatalogEntry::NodeDraining { node_id: two, draining: true }),
        Applied::Updated(true)
    );
    assert_eq!(
        state.apply(CatalogEntry::NodeDraining { node_id: NodeId::new(5), draining: true }),
        Applied::Updated(false)
    );
    assert_eq!(state.draining.iter().copied().collect::<Vec<_>>(), vec![two]);
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state);
    state.apply(CatalogEntry::NodeDraining { node_id: two, draining: false });
    assert!(state.draining.is_empty());
    assert_eq!(state.encode(), undrained);
    state.apply(CatalogEntry::NodeDraining { node_id: two, draining: true });
    state.apply(CatalogEntry::NodeRemoved { node_id: two });
    assert!(state.draining.is_empty());
}

/// A registration written before nodes recorded their gRPC API (bytes built by hand, the old
/// field list) decodes with none; a node without one is still encoded byte for byte as before,
/// and one with one only adds its trailer, so a checkpoint holding both decodes whole.
#[test]
fn node_registrations_written_before_the_grpc_address_decode_without_one() {
    use crate::codec::Encoder;
    let mut old = Encoder::new(18);
    old.u64(2).str("10.0.0.2:7460").str("10.0.0.2:7450").u32(2).str("10.0.0.2:7451").str("10.0.0.2:7452");
    let old = old.0;
    assert_eq!(CatalogEntry::decode(&old), Ok(CatalogEntry::NodeRegistered(node_record(""))));
    assert_eq!(CatalogEntry::NodeRegistered(node_record("")).encode(), old);
    let with_grpc = Encoder(old.clone()).str("10.0.0.2:8085").0.clone();
    assert_eq!(CatalogEntry::NodeRegistered(node_record("10.0.0.2:8085")).encode(), with_grpc);

    let mut checkpoint = Vec::new();
    let mut third = node_record("10.0.0.3:8085");
    third.node_id = NodeId::new(3);
    for entry in [old, CatalogEntry::NodeRegistered(third).encode()] {
        checkpoint.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        checkpoint.extend_from_slice(&entry);
    }
    let state = CatalogState::decode(&checkpoint).unwrap();
    assert_eq!(state.nodes[&NodeId::new(2)].grpc_address, "");
    assert_eq!(state.nodes[&NodeId::new(3)].grpc_address, "10.0.0.3:8085");
}

/// Entries as this version's predecessor wrote them (bytes built by hand, the old field lists):
/// they decode with the new fields at their defaults, and an entry that uses none of the new
/// fields is still encoded byte for byte as before, so both versions read it.
#[test]
fn entries_written_before_labels_decode_with_defaults() {
    use crate::codec::Encoder;
    let old_topic = Encoder::new(12).u64(7).str("orders").u64(600).u32(1).u64(1_700_000_000_000).0.clone();
    let expected_topic = TopicRecord {
        id: TopicId::new(7),
        name: "orders".into(),
        message_retention_seconds: 600,
        shard: forwarder(1, 1),
        created_ms: 1_700_000_000_000,
        labels: Labels::new(),
        replicas: Vec::new(),
        epoch: 0,
    };
    assert_eq!(CatalogEntry::decode(&old_topic), Ok(CatalogEntry::TopicCreated(expected_topic.clone())));
    assert_eq!(CatalogEntry::TopicCreated(expected_topic).encode(), old_topic);

    let mut old_subscription = Encoder::new(13);
    old_subscription.u64(8).str("reader").u64(7).str("orders").u64(42);
    old_subscription.u32(20).bool(true).u64(3600).bool(false).str("attributes:a").str("dead");
    old_subscription.u32(5).u32(10).u32(600).u64(86_400).u64(1_700_000_000_001);
    let old_subscription = old_subscription.0;
    let CatalogEntry::SubscriptionCreated(record) = CatalogEntry::decode(&old_subscription).unwrap() else {
        panic!("not a subscription's creation");
    };
    assert_eq!((record.id, record.start_offset, record.created_ms), (8, 42, 1_700_000_000_001));
    assert_eq!(record.settings.filter, "attributes:a");
    assert_eq!(record.settings.expiration_ttl_seconds, 86_400);
    assert!(record.settings.labels.is_empty() && !record.settings.enable_exactly_once_delivery);
    assert!(!record.detached);
    assert_eq!(CatalogEntry::SubscriptionCreated(record).encode(), old_subscription);

    let old_snapshot = Encoder::new(6).u64(9).str("before").u64(7).u64(99).0.clone();
    let CatalogEntry::SnapshotCreated(snapshot) = CatalogEntry::decode(&old_snapshot).unwrap() else {
        panic!("not a snapshot's creation");
    };
    assert!(snapshot.labels.is_empty());
    let old_update = Encoder::new(10).u64(7).u64(600).0.clone();
    assert_eq!(
        CatalogEntry::decode(&old_update),
        Ok(CatalogEntry::TopicUpdated {
            id: TopicId::new(7),
            message_retention_seconds: 600,
            labels: Labels::new()
        })
    );
    // A checkpoint written before decodes too.
    let mut old_checkpoint = Vec::new();
    for entry in [&old_topic, &old_subscription, &old_snapshot] {
        old_checkpoint.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        old_checkpoint.extend_from_slice(entry);
    }
    let state = CatalogState::decode(&old_checkpoint).unwrap();
    assert_eq!(state.topics["orders"].labels, Labels::new());
    assert!(!state.subscriptions["reader"].detached);
}

/// Every shape a push configuration takes: each wrapper, with and without a token, with and
/// without attributes.
pub(super) fn push_configs() -> Vec<PushConfig> {
    let token = OidcToken { service_account_email: "pusher@p.iam.example".into(), audience: "aud".into() };
    vec![
        PushConfig { endpoint: "https://example.com/push".into(), ..Default::default() },
        PushConfig {
            endpoint: "http://localhost:8080/a?b=c".into(),
            attributes: Labels::from([("x-goog-version".to_owned(), "v1".to_owned())]),
            wrapper: PushWrapper::NoWrapper { write_metadata: false },
            oidc_token: None,
            project: "my-proj".into(),
        },
        PushConfig {
            endpoint: "https://receiver.example/".into(),
            attributes: Labels::new(),
            wrapper: PushWrapper::NoWrapper { write_metadata: true },
            oidc_token: Some(token.clone()),
            project: crate::catalog::PUSH_PROJECT_DEFAULT.into(),
        },
        PushConfig {
            endpoint: "https://receiver.example/".into(),
            oidc_token: Some(OidcToken { audience: String::new(), ..token }),
            ..Default::default()
        },
    ]
}

/// A push subscription's creation and update round-trip with every shape of push
/// configuration, beside labels, exactly-once and detachment or without them; a checkpoint
/// keeps the configuration; a pull subscription is written as before (the test above).
#[test]
fn push_configurations_round_trip_in_entries_and_checkpoints() {
    for push in push_configs() {
        for (labeled, detached) in [(false, false), (true, false), (false, true), (true, true)] {
            let entry = if labeled { labeled_subscription(5, 1) } else { subscription(5, 1) };
            let CatalogEntry::SubscriptionCreated(mut record) = entry else { unreachable!() };
            record.settings.push = Some(Box::new(push.clone()));
            record.detached = detached;
            let created = CatalogEntry::SubscriptionCreated(record.clone());
            assert_eq!(CatalogEntry::decode(&created.encode()), Ok(created.clone()), "{push:?}");
            let updated = CatalogEntry::SubscriptionUpdated {
                id: 5,
                name: record.name.to_string(),
                settings: record.settings,
            };
            assert_eq!(CatalogEntry::decode(&updated.encode()), Ok(updated.clone()), "{push:?}");
            let mut state = CatalogState::default();
            state.apply(topic(1, 0));
            state.apply(created);
            let restored = CatalogState::decode(&state.encode()).unwrap();
            assert_eq!(restored.subscriptions["subscription-5"].settings.push.as_deref(), Some(&push));
        }
    }
    // Switching back to pull is an update without one.
    let pull = CatalogEntry::SubscriptionUpdated { id: 5, name: "s".into(), settings: Default::default() };
    assert_eq!(CatalogEntry::decode(&pull.encode()), Ok(pull));
}

/// A push configuration is written after the trailer's older fields, so an older node reading
/// it finds bytes it does not know and refuses the entry whole (as the README's "Upgrading"
/// says of a change made while versions are mixed), rather than reading a push subscription as
/// a pull one; and a cut configuration is refused here too.
#[test]
fn a_push_configuration_is_the_trailers_last_field_and_refused_cut() {
    let CatalogEntry::SubscriptionCreated(mut record) = labeled_subscription(5, 1) else { unreachable!() };
    let pull = CatalogEntry::SubscriptionCreated(record.clone()).encode();
    record.settings.push = Some(Box::new(push_configs().remove(2)));
    let push = CatalogEntry::SubscriptionCreated(record).encode();
    assert_eq!(&push[..pull.len()], &pull[..], "the pull subscription's bytes come first, unchanged");
    for length in pull.len() + 1..push.len() {
        assert!(CatalogEntry::decode(&push[..length]).is_err(), "cut to {length} of {} bytes", push.len());
    }
    let mut empty = push.clone();
    // The endpoint's length (a u32) is the first field after the pull bytes: an empty endpoint
    // is not a push configuration.
    empty.truncate(pull.len());
    empty.extend_from_slice(&0u32.to_le_bytes());
    empty.extend_from_slice(&0u32.to_le_bytes());
    empty.extend_from_slice(&[0, 0]);
    assert!(CatalogEntry::decode(&empty).is_err());
}

/// A push subscription of the default project, as a38487b (the version before the project was
/// kept) wrote it: a subscription created with labels and exactly-once, pushed to
/// `https://example.com/push`.
const CREATED_BEFORE_THE_PROJECT_HEX: &str = "0d05000000000000000e000000737562736372697074696f6e2d35010000000000000007000000746f7069632d310f000000000000000a00000000000000000000000000000000000000000000000000000000000000000000000000000000000068e5cf8b01000002000000040000007465616d060000006f726465727304000000746965720000000001001800000068747470733a2f2f6578616d706c652e636f6d2f70757368000000000000";

/// A push configuration's project is written after it only when it is not the default: the
/// default's bytes are those the version before wrote (which decode with the default project),
/// another's are the same followed by the project, which that version refuses (trailing bytes)
/// rather than push in the default project. A default written out, or a project that is not a
/// project id, is refused.
#[test]
fn a_push_configurations_project_follows_it_only_when_it_is_not_the_default() {
    let CatalogEntry::SubscriptionCreated(mut record) = labeled_subscription(5, 1) else { unreachable!() };
    record.settings.push =
        Some(Box::new(PushConfig { endpoint: "https://example.com/push".into(), ..Default::default() }));
    let default = CatalogEntry::SubscriptionCreated(record.clone()).encode();
    let hex: String = default.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(hex, CREATED_BEFORE_THE_PROJECT_HEX, "the version before's bytes");
    let Ok(CatalogEntry::SubscriptionCreated(decoded)) = CatalogEntry::decode(&default) else { panic!() };
    assert_eq!(decoded.settings.push.unwrap().project, crate::catalog::PUSH_PROJECT_DEFAULT);

    let with_project = |project: &str| {
        let mut bytes = default.clone();
        bytes.extend_from_slice(&(project.len() as u32).to_le_bytes());
        bytes.extend_from_slice(project.as_bytes());
        bytes
    };
    record.settings.push.as_mut().unwrap().project = "my-proj".into();
    let created = CatalogEntry::SubscriptionCreated(record.clone());
    assert_eq!(created.encode(), with_project("my-proj"));
    assert_eq!(CatalogEntry::decode(&with_project("my-proj")), Ok(created));
    assert!(CatalogEntry::decode(&with_project(crate::catalog::PUSH_PROJECT_DEFAULT)).is_err());
    assert!(CatalogEntry::decode(&with_project("My-Proj")).is_err());
    assert!(CatalogEntry::decode(&with_project("")).is_err());

    // An update the same way.
    let update = |project: &str| {
        let mut settings = record.settings.clone();
        settings.push.as_mut().unwrap().project = project.into();
        CatalogEntry::SubscriptionUpdated { id: 5, name: record.name.to_string(), settings }
    };
    let default_update = update(crate::catalog::PUSH_PROJECT_DEFAULT).encode();
    let other_update = update("my-proj").encode();
    assert_eq!(&other_update[..default_update.len()], &default_update[..]);
    assert_eq!(other_update.len(), default_update.len() + 4 + "my-proj".len());
    assert_eq!(CatalogEntry::decode(&other_update), Ok(update("my-proj")));
}

async fn open(disk: &SimDisk, dirs: &Rc<Directories>) -> Catalog<SimDisk> {
    Catalog::open(disk.clone(), dirs.clone(), 2, placement::BALANCE_FACTOR_DEFAULT).await.unwrap()
}

async fn create_topics(catalog: &Catalog<SimDisk>, count: usize) -> Vec<TopicId> {
    let mut ids = Vec::new();
    for _ in 0..count {
        let id = TopicId::new(catalog.allocate_id());
        let record = TopicRecord {
            id,
            name: format!("t{id:x}").into(),
            message_retention_seconds: 0,
            shard: forwarder(1, 0),
            created_ms: 0,
            labels: Labels::new(),
            replicas: Vec::new(),
            epoch: 0,
        };
        assert_eq!(catalog.propose(CatalogEntry::TopicCreated(record)).await, Ok(Applied::Done));
        ids.push(id);
    }
    ids
}

/// A data directory with a catalog written by the code before raft starts: it is imported
/// once (topics placed, ids above every old one), its folder renamed, and the next start
/// reads the imported snapshot.
#[test]
fn an_old_catalog_is_imported_once() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let old_topic = |id: u64| {
            CatalogEntry::TopicCreated(TopicRecord {
                id: TopicId::new(id),
                name: format!("old-{id:x}").into(),
                message_retention_seconds: 60,
                shard: entry::SHARD_UNPLACED,
                created_ms: 0,
                labels: Labels::new(),
                replicas: Vec::new(),
                epoch: 0,
            })
        };
        let first = 1u64 << 32 | 1;
        legacy::write_old(disk.clone(), dirs.clone(), &[old_topic(first), old_topic(first + 1)])
            .await
            .unwrap();
        let second = 2u64 << 32 | 1;
        legacy::write_old(
            disk.clone(),
            dirs.clone(),
            &[
                old_topic(second),
                subscription(second + 1, first),
                CatalogEntry::TopicDeleted { id: TopicId::new(first + 1) },
            ],
        )
        .await
        .unwrap();
        let catalog = open(&disk, &dirs).await;
        {
            let state = catalog.state();
            assert_eq!(state.topics.len(), 2);
            assert!(state.topics.values().all(|topic| topic.shard.global() < 2), "placed at the import");
            assert_eq!(state.topics[format!("old-{first:x}").as_str()].message_retention_seconds, 60);
            assert_eq!(
                state.subscriptions[format!("subscription-{}", second + 1).as_str()].start_offset,
                (second + 1) * 3
            );
        }
        let placed: Vec<u32> = catalog.state().topics.values().map(|topic| topic.shard.global()).collect();
        assert!(catalog.allocate_id() >= 3u64 << 32, "above any id the old code could have handed out");
        assert!(legacy::exists(&disk, &dirs), "the old folder is left as it was");
        create_topics(&catalog, 3).await;
        drop(catalog);
        disk.crash(CrashMode::DropUnsynced);
        let reopened = open(&disk, &dirs).await;
        let state = reopened.state();
        assert_eq!(state.topics.len(), 5, "the imported topics and those created after");
        let old: Vec<u32> = state
            .topics
            .values()
            .filter(|topic| topic.name.starts_with("old-"))
            .map(|topic| topic.shard.global())
            .collect();
        assert_eq!(old, placed, "placement is read back, not recomputed");
    });
}

/// Ids are unique across restarts, also after a snapshot purged the entries that used them.
#[test]
fn ids_are_unique_across_restarts_and_compaction() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let mut seen = std::collections::HashSet::new();
        for round in 0..3 {
            let catalog = open(&disk, &dirs).await;
            for id in create_topics(&catalog, 20).await {
                assert!(seen.insert(id), "id {id:x} handed out twice");
            }
            if round == 1 {
                assert!(catalog.compact(0).await.unwrap(), "compacted");
            }
            drop(catalog);
            disk.crash(CrashMode::DropUnsynced);
        }
        let catalog = open(&disk, &dirs).await;
        assert_eq!(catalog.state().topics.len(), 60);
    });
}

/// A torn write at the raft log's tail (a change never acknowledged) is discarded at the
/// next start, and every acknowledged change is there.
#[test]
fn the_raft_log_recovers_from_a_torn_tail() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let catalog = open(&disk, &dirs).await;
        let ids = create_topics(&catalog, 10).await;
        drop(catalog);
        let folder = dirs.path(0).join(store::RAFT_FOLDER);
        let segment = disk.list_dir(&folder).unwrap().into_iter().filter(|name| name.ends_with(".seg")).max();
        let path = folder.join(segment.expect("a raft log segment"));
        let mut bytes = disk.file_bytes(&path).unwrap();
        let end = bytes.iter().rposition(|byte| *byte != 0).unwrap() + 1;
        let block = crate::log::record::BLOCK_BYTES;
        let torn = end.div_ceil(block) * block;
        if bytes.len() < torn + block {
            bytes.resize(torn + block, 0);
        }
        for (index, byte) in bytes[torn..torn + block / 2].iter_mut().enumerate() {
            *byte = (index * 31 + 7) as u8;
        }
        disk.set_file_bytes(&path, bytes);
        let catalog = open(&disk, &dirs).await;
        let state = catalog.state();
        assert_eq!(state.topics.len(), ids.len());
        assert!(ids.iter().all(|id| state.topic_by_id(*id).is_some()));
    });
}

/// Topics created and deleted by the thousand: compaction (a snapshot, then the purge of the
/// raft log it covers) deletes the old segments, and the catalog reopened after a crash holds
/// exactly the live state.
#[test]
fn compaction_keeps_the_live_state_and_bounds_the_log() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let catalog = open(&disk, &dirs).await;
        for round in 0..30 {
            for id in create_topics(&catalog, 100).await {
                // Most of them go again; every tenth stays.
                if id.get() % 10 != 0 {
                    let applied = catalog.propose(CatalogEntry::TopicDeleted { id }).await.unwrap();
                    assert!(matches!(applied, Applied::TopicDeleted(Some(_))), "round {round}");
                }
            }
        }
        let live = catalog.state().clone();
        let before = catalog.disk_bytes();
        assert!(!catalog.compact(u64::MAX).await.unwrap(), "below the threshold nothing happens");
        assert!(catalog.compact(0).await.unwrap());
        assert!(catalog.disk_bytes() < before, "{} bytes, {before} before", catalog.disk_bytes());
        drop(catalog);
        disk.crash(CrashMode::DropUnsynced);
        let reopened = open(&disk, &dirs).await;
        let mut recovered = reopened.state().clone();
        // The reopened catalog's counter may only be ahead (never behind) of the live one.
        assert!(recovered.next_id >= live.next_id);
        recovered.next_id = live.next_id;
        assert_eq!(recovered, live);
        assert_eq!(live.topics.len(), 300);
    });
}

/// Raft entries `first..first + count` at `term`, each a topic with a long name, so a few
/// thousand of them pass the records held in memory and span segments.
fn raft_entries_at(term: u64, first: u64, count: u64) -> Vec<raft::Entry> {
    let entry = |index: u64| {
        let mut created = topic(index, 0);
        if let CatalogEntry::TopicCreated(record) = &mut created {
            record.name = format!("{index:0>200}").into();
        }
        raft::Entry {
            log_id: LogId::new(openraft::vote::leader_id_adv::LeaderId { term, node_id: 1 }, index),
            payload: openraft::EntryPayload::Normal(created),
        }
    };
    (first..first + count).map(entry).collect()
}

/// What the raft log answers for `range` equals `expected`, and its log state ends at the
/// last of `all`.
async fn assert_reads(log: &mut RaftLog<SimDisk>, all: &[raft::Entry], range: std::ops::Range<u64>) {
    use openraft::storage::RaftLogStorage;
    use openraft::RaftLogReader;
    let read = log.try_get_log_entries(range.clone()).await.unwrap();
    let expected: Vec<&raft::Entry> =
        all.iter().filter(|entry| range.contains(&entry.log_id.index)).collect();
    assert_eq!(read.iter().collect::<Vec<_>>(), expected, "entries {range:?}");
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, all.last().map(|entry| entry.log_id));
}

/// The raft log holds its entries by offset and only the newest as records: entries older
/// than those are read back from the disk, the same after a truncation, after a purge has
/// rewritten the log (which moves every record) and after a crash.
#[test]
fn raft_entries_are_read_back_from_the_log_after_a_truncation_a_rewrite_and_a_restart() {
    use openraft::storage::{IOFlushed, RaftLogStorage};
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        // Small segments, so the rewrite removes the segments of entries it keeps.
        let config = crate::log::LogConfig {
            segment_bytes_initial: 256 << 10,
            segment_bytes_max: 256 << 10,
            ..legacy::catalog_log_config()
        };
        let mut log = RaftLog::open(disk.clone(), dirs.clone(), config.clone()).await.unwrap();
        let mut all = raft_entries_at(1, 1, 6_000);
        for batch in all.chunks(500) {
            log.append(batch.to_vec(), IOFlushed::noop()).await.unwrap();
        }
        let held_bytes = all.len() * 300;
        assert!(held_bytes > 2 * CATALOG_RECENT_ENTRIES_BYTES_MAX, "most entries are read from the disk");
        for range in [1..2, 1..6_001, 2_000..2_100, 5_990..6_001] {
            assert_reads(&mut log, &all, range).await;
        }
        // A new leader's entries replace the tail from 5,001 on.
        log.truncate_after(Some(all[4_999].log_id)).await.unwrap();
        all.truncate(5_000);
        let replacing = raft_entries_at(2, 5_001, 300);
        log.append(replacing.clone(), IOFlushed::noop()).await.unwrap();
        all.extend(replacing);
        assert_reads(&mut log, &all, 4_990..5_301).await;
        // A purge rewrites the log with the entries kept, at new offsets.
        let segments_before = log.log().disk_bytes();
        log.purge(all[2_999].log_id).await.unwrap();
        all.drain(..3_000);
        assert!(log.log().disk_bytes() < segments_before, "the old segments are removed");
        assert_reads(&mut log, &all, 1..6_000).await;
        assert_reads(&mut log, &all, 3_001..3_002).await;
        let appended = raft_entries_at(2, 5_301, 10);
        log.append(appended.clone(), IOFlushed::noop()).await.unwrap();
        all.extend(appended);
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let mut reopened = RaftLog::open(disk.clone(), dirs.clone(), config).await.unwrap();
        assert_reads(&mut reopened, &all, 1..6_000).await;
        assert_reads(&mut reopened, &all, 3_001..3_500).await;
    });
}

/// A replicated topic keeps its replicas and epoch through its entry, a checkpoint and a cut;
/// an election moves its leader only to one of its replicas and only at a newer epoch.
#[test]
fn a_replicated_topic_and_its_elections_round_trip_and_apply_once_per_epoch() {
    let replicated = TopicRecord {
        id: TopicId::new(9),
        name: "orders".into(),
        message_retention_seconds: 0,
        shard: forwarder(2, 0),
        created_ms: 1_700_000_000_000,
        labels: labels("env"),
        replicas: vec![forwarder(2, 0), forwarder(1, 1), forwarder(3, 0)],
        epoch: 1,
    };
    let created = CatalogEntry::TopicCreated(replicated.clone());
    assert_eq!(CatalogEntry::decode(&created.encode()), Ok(created.clone()));
    // Without labels, no optional trailer: every cut is refused.
    let encoded =
        CatalogEntry::TopicCreated(TopicRecord { labels: Labels::new(), ..replicated.clone() }).encode();
    for cut in 0..encoded.len() {
        assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
    }
    // The leader must be one of the replicas.
    let mut misled = replicated.clone();
    misled.shard = forwarder(3, 1);
    assert!(CatalogEntry::decode(&CatalogEntry::TopicCreated(misled).encode()).is_err());

    let elected = CatalogEntry::TopicLeaderElected { id: TopicId::new(9), epoch: 2, leader: forwarder(3, 0) };
    assert_eq!(CatalogEntry::decode(&elected.encode()), Ok(elected.clone()));

    let mut state = CatalogState::default();
    state.apply(created);
    assert_eq!(state.apply(elected.clone()), Applied::Updated(true));
    assert_eq!((state.topics["orders"].shard, state.topics["orders"].epoch), (forwarder(3, 0), 2));
    // The same epoch again, an older one, and a shard that holds no replica change nothing.
    for stale in [
        CatalogEntry::TopicLeaderElected { id: TopicId::new(9), epoch: 2, leader: forwarder(1, 1) },
        CatalogEntry::TopicLeaderElected { id: TopicId::new(9), epoch: 1, leader: forwarder(1, 1) },
        CatalogEntry::TopicLeaderElected { id: TopicId::new(9), epoch: 3, leader: forwarder(1, 0) },
    ] {
        assert_eq!(state.apply(stale), Applied::Updated(false));
    }
    assert_eq!((state.topics["orders"].shard, state.topics["orders"].epoch), (forwarder(3, 0), 2));
    let restored = CatalogState::decode(&state.encode()).unwrap();
    assert_eq!(restored, state);
}

/// Source 1 of topic 9, unit 12, on `shard` alone.
fn source(shard: ShardId) -> SourceRecord {
    SourceRecord {
        id: TopicId::new(12),
        topic_id: TopicId::new(9),
        source: crate::ids::SourceId::new(1).unwrap(),
        shard,
        created_ms: 1_700_000_000_002,
        replicas: Vec::new(),
        epoch: 0,
        retiring: false,
    }
}

/// A topic's source after the first round-trips whole (a cut refused, and source 0 or the
/// topic's own id refused), applies only beside its live topic on a shard holding none of the
/// topic's units, takes the elections, replica moves and placements naming its unit, survives a
/// checkpoint, and goes with its topic. A topic's entry, as every version wrote it, is a topic
/// of one source.
#[test]
fn a_topics_sources_round_trip_apply_beside_it_and_go_with_it() {
    let mut state = CatalogState::default();
    state.apply(topic(9, 0));
    assert_eq!(state.source_count(TopicId::new(9)), 1);

    let replicated = SourceRecord {
        shard: forwarder(2, 1),
        replicas: vec![forwarder(2, 1), forwarder(3, 0), forwarder(1, 1)],
        epoch: 1,
        ..source(forwarder(1, 1))
    };
    for record in [source(forwarder(1, 1)), replicated.clone()] {
        let entry = CatalogEntry::SourceAdded(record);
        let encoded = entry.encode();
        assert_eq!(CatalogEntry::decode(&encoded), Ok(entry.clone()));
        for cut in 0..encoded.len() {
            assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
        }
    }
    let first = SourceRecord { source: crate::ids::SourceId::FIRST, ..source(forwarder(1, 1)) };
    let own_id = SourceRecord { id: TopicId::new(9), ..source(forwarder(1, 1)) };
    let misled = SourceRecord { shard: forwarder(2, 0), ..replicated.clone() };
    for refused in [first, own_id, misled] {
        assert!(CatalogEntry::decode(&CatalogEntry::SourceAdded(refused).encode()).is_err());
    }

    // On the topic's own shard, or beside a topic that is not there: not applied.
    assert!(matches!(state.apply(CatalogEntry::SourceAdded(source(forwarder(1, 0)))), Applied::Refused(_)));
    let orphan = SourceRecord { topic_id: TopicId::new(10), ..source(forwarder(1, 1)) };
    assert_eq!(state.apply(CatalogEntry::SourceAdded(orphan)), Applied::Updated(false));
    assert_eq!(state.source_count(TopicId::new(9)), 1);

    assert_eq!(state.apply(CatalogEntry::SourceAdded(replicated.clone())), Applied::Done);
    assert_eq!(state.source_count(TopicId::new(9)), 2);
    assert!(state.next_id > 12);
    // Source 2 on a shard holding a replica of source 1: refused.
    let beside = SourceRecord {
        id: TopicId::new(13),
        source: crate::ids::SourceId::new(2).unwrap(),
        ..source(forwarder(3, 0))
    };
    assert!(matches!(state.apply(CatalogEntry::SourceAdded(beside)), Applied::Refused(_)));
    // Source 1 again under another unit id: refused.
    let twice = SourceRecord { id: TopicId::new(14), ..source(forwarder(2, 0)) };
    assert!(matches!(state.apply(CatalogEntry::SourceAdded(twice)), Applied::Refused(_)));

    let unit = TopicId::new(12);
    let elected = CatalogEntry::TopicLeaderElected { id: unit, epoch: 2, leader: forwarder(3, 0) };
    assert_eq!(state.apply(elected), Applied::Updated(true));
    let moved = vec![forwarder(3, 0), forwarder(2, 1), forwarder(4, 0)];
    assert_eq!(
        state.apply(CatalogEntry::TopicReplicasChanged { id: unit, replicas: moved.clone() }),
        Applied::Updated(true)
    );
    let now = state.sources_of(TopicId::new(9)).next().unwrap().clone();
    assert_eq!((now.shard, now.epoch, now.replicas), (forwarder(3, 0), 2, moved));
    // The topic itself is untouched by its source's entries.
    assert_eq!(state.topics["topic-9"].shard, forwarder(1, 0));

    let restored = CatalogState::decode(&state.encode()).unwrap();
    assert_eq!(restored, state);

    state.apply(CatalogEntry::TopicDeleted { id: TopicId::new(9) });
    assert_eq!(state.sources_of(TopicId::new(9)).count(), 0);
    assert!(state.source_units.is_empty());
    let elected = CatalogEntry::TopicLeaderElected { id: unit, epoch: 3, leader: forwarder(2, 1) };
    assert_eq!(state.apply(elected), Applied::Updated(false));
}

/// A subscription of a topic of several sources keeps each later source's sync point in its
/// creation's entry (kind 24, which a node before sources refuses as unknown), through a
/// checkpoint; one of a topic of one source is kind 13 as before. A source it does not list
/// was added after it: it starts there at 0.
#[test]
fn a_subscriptions_sync_points_on_later_sources_round_trip_and_only_when_several() {
    let CatalogEntry::SubscriptionCreated(alone) = subscription(5, 1) else { unreachable!() };
    assert_eq!(CatalogEntry::SubscriptionCreated(alone.clone()).encode()[0], 13);
    let source = |number| crate::ids::SourceId::new(number).unwrap();
    let several = SubscriptionRecord {
        source_starts: vec![(source(1), 40), (source(3), 7)],
        detached: true,
        ..alone.clone()
    };
    let entry = CatalogEntry::SubscriptionCreated(several.clone());
    let encoded = entry.encode();
    assert_eq!(encoded[0], 24);
    assert_eq!(CatalogEntry::decode(&encoded), Ok(entry.clone()));
    // A cut among the sync points, or before the subscription's own fields end, is refused (a
    // cut at the trailer's start reads as kind 13's fields without it, as it always did).
    for cut in 0..encoded.len() - 16 {
        assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
    }
    assert_eq!(
        (several.start_on(crate::ids::SourceId::FIRST), several.start_on(source(1))),
        (alone.start_offset, 40)
    );
    assert_eq!((several.start_on(source(2)), several.start_on(source(3))), (0, 7));
    // Out of order, repeated, or naming source 0: refused.
    for starts in [vec![(source(3), 1), (source(1), 1)], vec![(source(1), 1), (source(1), 2)]] {
        let refused = SubscriptionRecord { source_starts: starts, ..alone.clone() };
        assert!(CatalogEntry::decode(&CatalogEntry::SubscriptionCreated(refused).encode()).is_err());
    }
    let mut zero = encoded.clone();
    zero[5..9].copy_from_slice(&0u32.to_le_bytes());
    assert!(CatalogEntry::decode(&zero).is_err());

    let mut state = CatalogState::default();
    state.apply(topic(1, 0));
    state.apply(entry);
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state);
}

/// A topic's sources retire from the top, one at a time (never source 0), and only a retiring
/// source is deleted, and its subscriptions' sync points on it with it; the active count
/// follows; a checkpoint restates a retirement as its own
/// entry after the sources, and the entries round-trip whole (a cut refused, source 0 refused).
#[test]
fn a_topics_sources_retire_from_the_top_and_only_a_retiring_one_is_deleted() {
    use crate::ids::SourceId;
    let topic_id = TopicId::new(9);
    let number = |n: u32| SourceId::new(n).unwrap();
    let mut state = CatalogState::default();
    state.apply(topic(9, 0));
    let second = SourceRecord { id: TopicId::new(13), source: number(2), ..source(forwarder(2, 0)) };
    assert_eq!(state.apply(CatalogEntry::SourceAdded(source(forwarder(1, 1)))), Applied::Done);
    assert_eq!(state.apply(CatalogEntry::SourceAdded(second)), Applied::Done);
    assert_eq!(state.active_sources(topic_id), 3);
    // A subscription made once both existed keeps a sync point on each.
    let CatalogEntry::SubscriptionCreated(mut record) = subscription(20, 9) else { unreachable!() };
    record.source_starts = vec![(number(1), 5), (number(2), 7)];
    let name = record.name.clone();
    assert_eq!(state.apply(CatalogEntry::SubscriptionCreated(record)), Applied::Done);

    let retire = |n: u32| CatalogEntry::SourceRetiring { topic_id, source: number(n) };
    let delete =
        |n: u32, id: u64| CatalogEntry::SourceDeleted { topic_id, source: number(n), id: TopicId::new(id) };
    for entry in [retire(1), delete(1, 12), delete(2, 13)] {
        let encoded = entry.encode();
        assert_eq!(CatalogEntry::decode(&encoded), Ok(entry.clone()));
        for cut in 0..encoded.len() {
            assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "{entry}: a cut at {cut} decoded");
        }
        // Source 0 in its place.
        let mut zero = encoded.clone();
        zero[9..13].copy_from_slice(&0u32.to_le_bytes());
        assert!(CatalogEntry::decode(&zero).is_err(), "{entry} of source 0 decoded");
    }

    // Not the highest, or not retiring: nothing changes.
    assert_eq!(state.apply(retire(1)), Applied::Updated(false));
    assert_eq!(state.apply(delete(2, 13)), Applied::Updated(false));
    assert_eq!(state.apply(retire(2)), Applied::Updated(true));
    assert_eq!(state.active_sources(topic_id), 2);
    assert_eq!(state.source_count(topic_id), 3);
    assert_eq!(state.apply(retire(2)), Applied::Updated(false), "retired twice");
    assert_eq!(state.apply(retire(1)), Applied::Updated(true));
    assert_eq!(state.active_sources(topic_id), 1);

    let restated = CatalogState::decode(&state.encode()).unwrap();
    assert_eq!(restated, state);
    assert_eq!(restated.active_sources(topic_id), 1);

    assert_eq!(state.apply(delete(2, 12)), Applied::Updated(false), "another unit's id");
    assert_eq!(state.apply(delete(2, 13)), Applied::Updated(true));
    assert_eq!((state.source_count(topic_id), state.active_sources(topic_id)), (2, 1));
    assert!(!state.source_units.contains_key(&TopicId::new(13)));
    // The deleted source's sync point goes with it: a source added again under its number
    // starts at offset 0, and a kept point past it would skip its first messages.
    let kept = &state.subscriptions[&name];
    assert_eq!((kept.start_on(number(1)), kept.start_on(number(2))), (5, 0));
    assert_eq!(state.apply(delete(1, 12)), Applied::Updated(true));
    assert_eq!((state.source_count(topic_id), state.active_sources(topic_id)), (1, 1));
    assert!(state.source_units.is_empty());
    assert!(state.subscriptions[&name].source_starts.is_empty());
}

/// The delivery gate (docs/SOURCES.md, rule 3): a source's addition and a retirement each open
/// the topic's next change, from the count before; an ordered subscription passes it by its
/// own entry (kind 30), never back; a checkpoint restates both, and a topic whose count never
/// changed writes neither.
#[test]
fn a_change_of_the_source_count_gates_ordered_subscriptions_until_they_pass_it() {
    let mut state = CatalogState::default();
    state.apply(topic(9, 0));
    let ordered = |id: u64| {
        let CatalogEntry::SubscriptionCreated(mut record) = subscription(id, 9) else { unreachable!() };
        record.settings.enable_message_ordering = true;
        CatalogEntry::SubscriptionCreated(record)
    };
    state.apply(ordered(20));
    state.apply(subscription(21, 9));
    let topic_id = TopicId::new(9);
    assert_eq!(state.source_gate(topic_id), SourceGate::default());
    assert_eq!(state.gated_subscriptions(topic_id).count(), 0, "no change yet");

    assert_eq!(state.apply(CatalogEntry::SourceAdded(source(forwarder(1, 1)))), Applied::Done);
    assert_eq!(state.source_gate(topic_id), SourceGate { generation: 1, before: 1, applied: false });
    let gated: Vec<u64> = state.gated_subscriptions(topic_id).map(|record| record.id).collect();
    assert_eq!(gated, [20], "the unordered subscription is never gated");
    let passed = CatalogEntry::SourcesPassed { id: 20, name: "subscription-20".into(), generation: 1 };
    assert_eq!(CatalogEntry::decode(&passed.encode()), Ok(passed.clone()));
    assert_eq!(state.apply(passed), Applied::Updated(true));
    assert_eq!(state.gated_subscriptions(topic_id).count(), 0);
    let stale = CatalogEntry::SourcesPassed { id: 20, name: "subscription-21".into(), generation: 5 };
    assert_eq!(state.apply(stale), Applied::Updated(false), "another subscription's name");

    let retire = CatalogEntry::SourceRetiring { topic_id, source: crate::ids::SourceId::new(1).unwrap() };
    assert_eq!(state.apply(retire), Applied::Updated(true));
    assert_eq!(state.source_gate(topic_id), SourceGate { generation: 2, before: 2, applied: false });
    assert_eq!(state.gated_subscriptions(topic_id).count(), 1);
    let old = CatalogEntry::SourcesPassed { id: 20, name: "subscription-20".into(), generation: 1 };
    state.apply(old);
    assert_eq!(state.gated_subscriptions(topic_id).count(), 1, "a pass of the change before");

    let restored = CatalogState::decode(&state.encode()).unwrap();
    assert_eq!(restored, state);
    let restate =
        CatalogEntry::SourceGate { topic_id, gate: SourceGate { generation: 2, before: 2, applied: false } };
    let encoded = restate.encode();
    assert_eq!(CatalogEntry::decode(&encoded), Ok(restate));
    for cut in 0..encoded.len() {
        assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
    }

    state.apply(CatalogEntry::SubscriptionDeleted { id: 20, name: "subscription-20".into() });
    assert!(state.sources_passed.is_empty(), "a deleted subscription's pass goes with it");
    state.apply(CatalogEntry::SourcesApplied { topic_id, generation: 2 });
    assert!(state.source_gates[&topic_id].applied);
    state.apply(CatalogEntry::TopicDeleted { id: topic_id });
    assert!(state.source_gates.is_empty(), "a deleted topic's gate goes with it");
}

/// Until every source that lost keys in a change applied it (`SourcesApplied`), a source that
/// gained keys is attached and promoted under the count before, so that two sources never take
/// one key (docs/SOURCES.md, rule 2); a source that lost keys, or one of a change applied, under
/// the topic's. The applied mark is of one change: the next opens unapplied, an old one's mark
/// is not taken, and a checkpoint restates it.
#[test]
fn a_source_that_gains_keys_takes_the_new_count_only_once_the_losing_sources_applied_it() {
    let mut state = CatalogState::default();
    state.apply(topic(9, 0));
    let topic_id = TopicId::new(9);
    assert_eq!(state.count_for_source(topic_id, 0), 1, "never changed");
    state.apply(CatalogEntry::SourceAdded(source(forwarder(1, 1))));
    assert_eq!(state.count_for_source(topic_id, 0), 2, "source 0 lost keys");
    assert_eq!(state.count_for_source(topic_id, 1), 1, "source 1 gained them");
    let applied = CatalogEntry::SourcesApplied { topic_id, generation: 1 };
    let encoded = applied.encode();
    assert_eq!(CatalogEntry::decode(&encoded), Ok(applied.clone()));
    for cut in 0..encoded.len() {
        assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
    }
    assert_eq!(
        state.apply(CatalogEntry::SourcesApplied { topic_id, generation: 2 }),
        Applied::Updated(false)
    );
    assert_eq!(state.apply(applied.clone()), Applied::Updated(true));
    assert_eq!(state.count_for_source(topic_id, 1), 2);
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state, "the mark restated");

    let retire = CatalogEntry::SourceRetiring { topic_id, source: crate::ids::SourceId::new(1).unwrap() };
    state.apply(retire);
    assert_eq!(state.count_for_source(topic_id, 1), 1, "the retiring source lost keys");
    assert_eq!(state.count_for_source(topic_id, 0), 2, "source 0 gains them back");
    assert_eq!(state.apply(applied), Applied::Updated(false), "the change before's mark");
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state, "unapplied restated");
    state.apply(CatalogEntry::SourcesApplied { topic_id, generation: 2 });
    assert_eq!(state.count_for_source(topic_id, 0), 1);
}

fn schema_entry(entry: super::schemas::SchemaEntry) -> CatalogEntry {
    CatalogEntry::Schema(entry)
}

fn schema_revision(revision_id: &str, definition: &str) -> super::schemas::SchemaRevision {
    super::schemas::SchemaRevision {
        revision_id: revision_id.to_owned(),
        schema_type: super::schemas::SchemaType::Avro,
        definition: definition.to_owned(),
        created_ms: 1_700_000_000_000,
    }
}

fn schema_settings(schema: &str) -> super::schemas::SchemaSettings {
    super::schemas::SchemaSettings {
        schema: schema.to_owned(),
        encoding: super::schemas::SchemaEncoding::Binary,
        first_revision_id: "0000000a".to_owned(),
        last_revision_id: String::new(),
    }
}

/// Schemas (kinds 31 to 34): each entry round-trips whole and a cut is refused; a creation
/// over a live schema is refused, a revision is added once, the last revision is never
/// deleted; a deleted schema leaves its topics' settings naming `_deleted-schema_`; a deleted
/// topic takes its settings with it; a checkpoint restates it all, and a catalog without
/// schemas writes none of these kinds (the bytes of the version before).
#[test]
fn schemas_and_topics_schema_settings_round_trip_apply_and_are_restated() {
    use super::schemas::{SchemaEntry, DELETED_SCHEMA};
    let mut state = CatalogState::default();
    state.apply(topic(9, 0));
    state.apply(topic(12, 1));
    let before = state.encode();
    let entries = [
        schema_entry(SchemaEntry::Committed {
            name: "states".into(),
            creates: true,
            revision: schema_revision("0000000a", "\"string\""),
        }),
        schema_entry(SchemaEntry::Committed {
            name: "states".into(),
            creates: false,
            revision: schema_revision("0000000b", "\"long\""),
        }),
        schema_entry(SchemaEntry::RevisionDeleted { name: "states".into(), revision_id: "0000000b".into() }),
        schema_entry(SchemaEntry::Deleted { name: "states".into() }),
        schema_entry(SchemaEntry::TopicSet {
            topic_id: TopicId::new(9),
            settings: Some(schema_settings("states")),
        }),
        schema_entry(SchemaEntry::TopicSet { topic_id: TopicId::new(9), settings: None }),
    ];
    for (entry, kind) in entries.iter().zip([31, 31, 32, 33, 34, 34]) {
        let encoded = entry.encode();
        assert_eq!(encoded[0], kind, "{entry:?}");
        assert_eq!(CatalogEntry::decode(&encoded).as_ref(), Ok(entry));
        for cut in 0..encoded.len() {
            assert!(CatalogEntry::decode(&encoded[..cut]).is_err(), "{entry:?}: a cut at {cut} decoded");
        }
    }
    let [create, commit, delete_revision, delete, set, clear] = entries;

    assert_eq!(state.apply(create.clone()), Applied::Done);
    assert!(matches!(state.apply(create), Applied::Refused(_)), "a schema's name is taken");
    assert_eq!(state.apply(commit.clone()), Applied::Updated(true));
    assert_eq!(state.apply(commit.clone()), Applied::Updated(false), "a revision id is added once");
    assert_eq!(state.schemas["states"].revisions.len(), 2);
    assert_eq!(state.apply(set.clone()), Applied::Updated(true));
    state.apply(schema_entry(SchemaEntry::TopicSet {
        topic_id: TopicId::new(12),
        settings: Some(schema_settings("states")),
    }));
    assert_eq!(
        state.apply(schema_entry(SchemaEntry::TopicSet {
            topic_id: TopicId::new(99),
            settings: Some(schema_settings("s"))
        })),
        Applied::Updated(false),
        "no such topic"
    );

    let restored = CatalogState::decode(&state.encode()).unwrap();
    assert_eq!(restored, state);

    assert_eq!(state.apply(delete_revision.clone()), Applied::Updated(true));
    assert_eq!(state.apply(delete_revision), Applied::Updated(false), "gone already");
    let last =
        schema_entry(SchemaEntry::RevisionDeleted { name: "states".into(), revision_id: "0000000a".into() });
    assert_eq!(state.apply(last), Applied::Updated(false), "a schema keeps its last revision");
    assert_eq!(state.apply(clear), Applied::Updated(true));
    assert!(!state.topic_schemas.contains_key(&TopicId::new(9)));
    state.apply(set);
    assert_eq!(state.apply(delete.clone()), Applied::Updated(true));
    assert_eq!(state.apply(delete), Applied::Updated(false));
    assert!(state.schemas.is_empty());
    assert_eq!(state.topic_schemas[&TopicId::new(9)].schema, DELETED_SCHEMA);
    assert_eq!(CatalogState::decode(&state.encode()).unwrap(), state);

    state.apply(CatalogEntry::TopicDeleted { id: TopicId::new(9) });
    state.apply(CatalogEntry::TopicDeleted { id: TopicId::new(12) });
    assert!(state.topic_schemas.is_empty(), "a deleted topic's settings go with it");
    state.apply(topic(9, 0));
    state.apply(topic(12, 1));
    state.next_id = CatalogState::decode(&before).unwrap().next_id;
    assert_eq!(state.encode(), before, "without schemas, the bytes of the version before");
}
