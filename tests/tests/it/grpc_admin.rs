//! Google Cloud Pub/Sub's gRPC API, its administration and Publish, against the real daemon:
//! every method of topics, subscriptions and snapshots and Seek, what the answers show, bad
//! input refused with a clear code and nothing stored, messages crossing between the gRPC API
//! and the native protocol, and the same access control as the native protocol.
//!
//! Delivery over gRPC (Pull, StreamingPull, acknowledgements) is `grpc_delivery.rs`'s; here
//! messages are read back with the native client, which also shows the two protocols share
//! one daemon.

use crate::security::{access_text, daemon_requiring_auth, token, AccessFile, Files};
use ringpost_client::{block_on, Client, Message};
use ringpost_tests::grpc::{project_path, pubsub, snapshot_path, subscription_path, topic_path, Grpc};
use ringpost_tests::Daemon;
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::Code;

/// How long a native pull waits for a message that should be there.
const PULL_WAIT_MS: u32 = 3000;
/// How long a native pull waits to show that no message is there.
const EMPTY_PULL_WAIT_MS: u32 = 300;

/// A daemon with its gRPC API on a free port, and a client of it (shared by the gRPC and push
/// tests).
pub(crate) fn grpc_daemon(label: &str) -> (Daemon, Grpc) {
    let daemon = Daemon::start_with(label, Vec::new(), vec!["--grpc-listen".into(), "127.0.0.1:0".into()]);
    let grpc = Grpc::connect(&daemon.grpc_address.clone().expect("the gRPC API's address"));
    (daemon, grpc)
}

/// The refusal's message, checked to carry `code`.
pub(crate) fn refused<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: Code,
    what: &str,
) -> String {
    match result {
        Ok(answer) => panic!("{what}: expected {code:?}, got {answer:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{what}: {}", status.message());
            status.message().to_owned()
        }
    }
}

fn seconds(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

fn mask(paths: &[&str]) -> Option<prost_types::FieldMask> {
    Some(prost_types::FieldMask { paths: paths.iter().map(|path| (*path).to_owned()).collect() })
}

fn get_topic(grpc: &Grpc, name: &str) -> Result<pubsub::Topic, tonic::Status> {
    grpc.get_topic(pubsub::GetTopicRequest { topic: topic_path(name) })
}

fn get_subscription(grpc: &Grpc, name: &str) -> Result<pubsub::Subscription, tonic::Status> {
    grpc.get_subscription(pubsub::GetSubscriptionRequest { subscription: subscription_path(name) })
}

fn get_snapshot(grpc: &Grpc, name: &str) -> Result<pubsub::Snapshot, tonic::Status> {
    grpc.get_snapshot(pubsub::GetSnapshotRequest { snapshot: snapshot_path(name) })
}

fn create_snapshot(grpc: &Grpc, name: &str, subscription: &str) -> Result<pubsub::Snapshot, tonic::Status> {
    grpc.create_snapshot(pubsub::CreateSnapshotRequest {
        name: snapshot_path(name),
        subscription: subscription_path(subscription),
        ..Default::default()
    })
}

fn snapshot_names(grpc: &Grpc) -> Vec<String> {
    let page = grpc
        .list_snapshots(pubsub::ListSnapshotsRequest { project: project_path(), ..Default::default() })
        .unwrap();
    page.snapshots.into_iter().map(|snapshot| snapshot.name).collect()
}

/// A native pull's message data, acknowledged or not.
fn pull_natively(client: &Client, subscription: &str, wait_ms: u32, acknowledge: bool) -> Vec<Vec<u8>> {
    let messages = block_on(client.pull(subscription, 100, wait_ms)).unwrap();
    if acknowledge && !messages.is_empty() {
        let ack_ids = messages.iter().map(|message| message.ack_id.clone()).collect();
        assert!(block_on(client.acknowledge(subscription, ack_ids)).unwrap().is_empty());
    }
    messages.into_iter().map(|message| message.data).collect()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[test]
fn topics_are_created_read_updated_listed_and_deleted() {
    let (daemon, grpc) = grpc_daemon("grpc-topics");
    let created = grpc
        .create_topic(pubsub::Topic {
            name: topic_path("orders"),
            message_retention_duration: seconds(3600),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(created.name, topic_path("orders"));
    assert_eq!(created.message_retention_duration, seconds(3600));
    let said = refused(grpc.create_plain_topic("orders"), Code::AlreadyExists, "a second create");
    assert!(said.contains("Resource already exists") && said.contains("orders"), "{said}");

    // One namespace: the topic is the native protocol's too, and every project's, answered in
    // the project asked.
    let native = daemon.client();
    assert_eq!(block_on(native.get_topic("orders")).unwrap().message_retention_seconds, 3600);
    let elsewhere = grpc
        .get_topic(pubsub::GetTopicRequest { topic: "projects/other-project/topics/orders".into() })
        .unwrap();
    assert_eq!(elsewhere.name, "projects/other-project/topics/orders");
    assert_eq!(elsewhere.message_retention_duration, seconds(3600));

    let updated = grpc
        .update_topic(pubsub::UpdateTopicRequest {
            topic: Some(pubsub::Topic {
                name: topic_path("orders"),
                message_retention_duration: seconds(7200),
                ..Default::default()
            }),
            update_mask: mask(&["message_retention_duration"]),
        })
        .unwrap();
    assert_eq!(updated.message_retention_duration, seconds(7200));
    assert_eq!(get_topic(&grpc, "orders").unwrap().message_retention_duration, seconds(7200));

    // Pages, in name order, followed by their tokens.
    for name in ["payments", "refunds"] {
        grpc.create_plain_topic(name).unwrap();
    }
    let first = grpc
        .list_topics(pubsub::ListTopicsRequest {
            project: project_path(),
            page_size: 2,
            page_token: String::new(),
        })
        .unwrap();
    let names: Vec<&str> = first.topics.iter().map(|topic| topic.name.as_str()).collect();
    assert_eq!(names, [topic_path("orders"), topic_path("payments")]);
    assert!(!first.next_page_token.is_empty());
    let second = grpc
        .list_topics(pubsub::ListTopicsRequest {
            project: project_path(),
            page_size: 2,
            page_token: first.next_page_token,
        })
        .unwrap();
    assert_eq!(second.topics.len(), 1);
    assert_eq!(second.topics[0].name, topic_path("refunds"));
    assert!(second.next_page_token.is_empty());

    // A topic's subscriptions and snapshots, by name.
    grpc.create_plain_subscription("orders-audit", "orders").unwrap();
    grpc.create_plain_subscription("payments-audit", "payments").unwrap();
    create_snapshot(&grpc, "orders-audit-start", "orders-audit").unwrap();
    let subscriptions = grpc
        .list_topic_subscriptions(pubsub::ListTopicSubscriptionsRequest {
            topic: topic_path("orders"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(subscriptions.subscriptions, [subscription_path("orders-audit")]);
    let snapshots = grpc
        .list_topic_snapshots(pubsub::ListTopicSnapshotsRequest {
            topic: topic_path("orders"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(snapshots.snapshots, [snapshot_path("orders-audit-start")]);
    let none = grpc
        .list_topic_snapshots(pubsub::ListTopicSnapshotsRequest {
            topic: topic_path("payments"),
            ..Default::default()
        })
        .unwrap();
    assert!(none.snapshots.is_empty());
    let missing =
        pubsub::ListTopicSubscriptionsRequest { topic: topic_path("nothing"), ..Default::default() };
    refused(grpc.list_topic_subscriptions(missing), Code::NotFound, "subscriptions of a missing topic");

    grpc.delete_topic(pubsub::DeleteTopicRequest { topic: topic_path("orders") }).unwrap();
    let said = refused(get_topic(&grpc, "orders"), Code::NotFound, "a deleted topic");
    assert!(said.contains("Resource not found"), "{said}");
    refused(
        grpc.delete_topic(pubsub::DeleteTopicRequest { topic: topic_path("orders") }),
        Code::NotFound,
        "a second delete",
    );
    assert_eq!(grpc.topic_names().unwrap(), [topic_path("payments"), topic_path("refunds")]);
    // Its subscription stays, on Pub/Sub's deleted topic.
    assert_eq!(get_subscription(&grpc, "orders-audit").unwrap().topic, "_deleted-topic_");
    let publish = grpc.publish_data("orders", &[b"late"]);
    refused(publish, Code::NotFound, "a publish to a deleted topic");
}

#[test]
fn subscriptions_are_created_read_updated_listed_and_deleted() {
    let (daemon, grpc) = grpc_daemon("grpc-subscriptions");
    grpc.create_topic(pubsub::Topic {
        name: topic_path("events"),
        message_retention_duration: seconds(3600),
        ..Default::default()
    })
    .unwrap();
    grpc.create_plain_topic("events-dead").unwrap();
    let asked = pubsub::Subscription {
        name: subscription_path("events-billing"),
        topic: topic_path("events"),
        ack_deadline_seconds: 30,
        retain_acked_messages: true,
        message_retention_duration: seconds(7200),
        enable_message_ordering: true,
        filter: "attributes.kind = \"invoice\"".into(),
        dead_letter_policy: Some(pubsub::DeadLetterPolicy {
            dead_letter_topic: topic_path("events-dead"),
            max_delivery_attempts: 6,
        }),
        retry_policy: Some(pubsub::RetryPolicy { minimum_backoff: seconds(5), maximum_backoff: seconds(60) }),
        expiration_policy: Some(pubsub::ExpirationPolicy { ttl: seconds(2 * 24 * 3600) }),
        enable_exactly_once_delivery: true,
        // An empty push configuration is a pull subscription's, as the client libraries send it.
        push_config: Some(pubsub::PushConfig::default()),
        ..Default::default()
    };
    let created = grpc.create_subscription(asked.clone()).unwrap();
    for shown in [created, get_subscription(&grpc, "events-billing").unwrap()] {
        assert_eq!(shown.name, asked.name);
        assert_eq!(shown.topic, asked.topic);
        assert_eq!(shown.ack_deadline_seconds, 30);
        assert!(
            shown.retain_acked_messages
                && shown.enable_message_ordering
                && shown.enable_exactly_once_delivery
        );
        assert_eq!(shown.message_retention_duration, seconds(7200));
        assert_eq!(shown.filter, asked.filter);
        assert_eq!(shown.dead_letter_policy, asked.dead_letter_policy);
        assert_eq!(shown.retry_policy, asked.retry_policy);
        assert_eq!(shown.expiration_policy, asked.expiration_policy);
        assert_eq!(shown.topic_message_retention_duration, seconds(3600));
        assert_eq!(shown.state, pubsub::subscription::State::Active as i32);
        assert!(!shown.detached);
    }
    // The native protocol sees the same subscription, with Ringpost's names.
    let native = block_on(daemon.client().get_subscription("events-billing")).unwrap();
    assert_eq!((native.topic.as_str(), native.ack_deadline_seconds), ("events", 30));
    assert_eq!((native.dead_letter_topic.as_str(), native.max_delivery_attempts), ("events-dead", 6));
    assert_eq!(native.expiration_ttl_seconds, 2 * 24 * 3600);

    // Defaults, and an expiration policy without a ttl: never expires.
    let plain = grpc.create_plain_subscription("events-plain", "events").unwrap();
    assert_eq!(plain.ack_deadline_seconds, 10);
    assert_eq!(plain.message_retention_duration, seconds(7 * 24 * 3600));
    assert_eq!(plain.expiration_policy.unwrap().ttl, seconds(31 * 24 * 3600));
    assert_eq!((plain.dead_letter_policy, plain.retry_policy), (None, None));
    let forever = grpc
        .create_subscription(pubsub::Subscription {
            name: subscription_path("events-forever"),
            topic: topic_path("events"),
            expiration_policy: Some(pubsub::ExpirationPolicy { ttl: None }),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(forever.expiration_policy, Some(pubsub::ExpirationPolicy { ttl: None }));
    let said =
        refused(grpc.create_plain_subscription("events-plain", "events"), Code::AlreadyExists, "twice");
    assert!(said.contains("Resource already exists"), "{said}");

    // An update changes what its mask names, and nothing else.
    let changes = pubsub::Subscription {
        name: subscription_path("events-billing"),
        ack_deadline_seconds: 60,
        retain_acked_messages: false,
        expiration_policy: Some(pubsub::ExpirationPolicy { ttl: seconds(3 * 24 * 3600) }),
        // Named below, absent: the policies are removed.
        dead_letter_policy: None,
        retry_policy: None,
        // Not named: not changed.
        message_retention_duration: seconds(900),
        ..Default::default()
    };
    let updated = grpc
        .update_subscription(pubsub::UpdateSubscriptionRequest {
            subscription: Some(changes),
            update_mask: mask(&[
                "ack_deadline_seconds",
                "retain_acked_messages",
                "expiration_policy",
                "dead_letter_policy",
                "retry_policy",
            ]),
        })
        .unwrap();
    for shown in [updated, get_subscription(&grpc, "events-billing").unwrap()] {
        assert_eq!(shown.ack_deadline_seconds, 60);
        assert!(!shown.retain_acked_messages);
        assert_eq!(shown.expiration_policy.unwrap().ttl, seconds(3 * 24 * 3600));
        assert_eq!((shown.dead_letter_policy, shown.retry_policy), (None, None));
        assert_eq!(shown.message_retention_duration, seconds(7200), "not in the mask");
        assert_eq!(shown.filter, asked.filter);
    }

    // Pages of every subscription, then deletion.
    let first = grpc
        .list_subscriptions(pubsub::ListSubscriptionsRequest {
            project: project_path(),
            page_size: 2,
            page_token: String::new(),
        })
        .unwrap();
    assert_eq!(first.subscriptions.len(), 2);
    assert_eq!(first.subscriptions[0].topic_message_retention_duration, seconds(3600));
    assert_eq!(
        grpc.subscription_names().unwrap(),
        [
            subscription_path("events-billing"),
            subscription_path("events-forever"),
            subscription_path("events-plain")
        ]
    );
    grpc.delete_subscription(pubsub::DeleteSubscriptionRequest {
        subscription: subscription_path("events-plain"),
    })
    .unwrap();
    let said = refused(get_subscription(&grpc, "events-plain"), Code::NotFound, "a deleted subscription");
    assert!(said.contains("Resource not found"), "{said}");
    refused(
        grpc.delete_subscription(pubsub::DeleteSubscriptionRequest {
            subscription: subscription_path("events-plain"),
        }),
        Code::NotFound,
        "a second delete",
    );
    assert_eq!(grpc.subscription_names().unwrap().len(), 2);
}

#[test]
fn snapshots_are_taken_read_listed_and_deleted_and_seek_moves_a_subscription() {
    let (daemon, grpc) = grpc_daemon("grpc-snapshots");
    let native = daemon.client();
    grpc.create_plain_topic("ledger").unwrap();
    grpc.create_subscription(pubsub::Subscription {
        name: subscription_path("ledger-reader"),
        topic: topic_path("ledger"),
        // Kept once acknowledged, so that a seek back in time delivers them again.
        retain_acked_messages: true,
        ..Default::default()
    })
    .unwrap();
    grpc.publish_data("ledger", &[b"entry 1"]).unwrap();

    // A snapshot of the unacknowledged entry, then the entry acknowledged.
    let before = now_ms();
    let snapshot = create_snapshot(&grpc, "ledger-before", "ledger-reader").unwrap();
    assert_eq!(snapshot.name, snapshot_path("ledger-before"));
    assert_eq!(snapshot.topic, topic_path("ledger"));
    let expires_ms = snapshot.expire_time.map_or(0, |time| time.seconds as u64 * 1000);
    assert!(expires_ms > before + 6 * 24 * 3600 * 1000, "a snapshot lives about 7 days: {expires_ms}");
    assert_eq!(get_snapshot(&grpc, "ledger-before").unwrap(), snapshot);
    assert_eq!(snapshot_names(&grpc), [snapshot_path("ledger-before")]);
    let said =
        refused(create_snapshot(&grpc, "ledger-before", "ledger-reader"), Code::AlreadyExists, "twice");
    assert!(said.contains("Resource already exists"), "{said}");
    refused(
        create_snapshot(&grpc, "ledger-other", "no-such-reader"),
        Code::NotFound,
        "of a missing subscription",
    );
    assert_eq!(pull_natively(&native, "ledger-reader", PULL_WAIT_MS, true), [b"entry 1".to_vec()]);
    assert!(pull_natively(&native, "ledger-reader", EMPTY_PULL_WAIT_MS, false).is_empty());

    // Seek to the snapshot: the entry is unacknowledged again.
    let to_snapshot = |name: &str| pubsub::SeekRequest {
        subscription: subscription_path("ledger-reader"),
        target: Some(pubsub::seek_request::Target::Snapshot(snapshot_path(name))),
    };
    grpc.seek(to_snapshot("ledger-before")).unwrap();
    assert_eq!(pull_natively(&native, "ledger-reader", PULL_WAIT_MS, true), [b"entry 1".to_vec()]);

    // Seek to a time: before the entry, it is delivered again; after it, it is not.
    let to_time = |time_ms: u64| pubsub::SeekRequest {
        subscription: subscription_path("ledger-reader"),
        target: Some(pubsub::seek_request::Target::Time(prost_types::Timestamp {
            seconds: (time_ms / 1000) as i64,
            nanos: 0,
        })),
    };
    grpc.seek(to_time(0)).unwrap();
    assert_eq!(pull_natively(&native, "ledger-reader", PULL_WAIT_MS, true), [b"entry 1".to_vec()]);
    grpc.seek(to_time(now_ms() + 3_600_000)).unwrap();
    assert!(pull_natively(&native, "ledger-reader", EMPTY_PULL_WAIT_MS, false).is_empty());

    refused(grpc.seek(to_snapshot("ledger-missing")), Code::NotFound, "a seek to a missing snapshot");
    let no_target = pubsub::SeekRequest { subscription: subscription_path("ledger-reader"), target: None };
    refused(grpc.seek(no_target), Code::InvalidArgument, "a seek without a target");
    let bad = pubsub::SeekRequest {
        subscription: subscription_path("ledger-reader"),
        target: Some(pubsub::seek_request::Target::Snapshot("ledger-before".into())),
    };
    refused(grpc.seek(bad), Code::InvalidArgument, "a seek to a snapshot named without its project");

    grpc.delete_snapshot(pubsub::DeleteSnapshotRequest { snapshot: snapshot_path("ledger-before") }).unwrap();
    let said = refused(get_snapshot(&grpc, "ledger-before"), Code::NotFound, "a deleted snapshot");
    assert!(said.contains("Resource not found"), "{said}");
    refused(
        grpc.delete_snapshot(pubsub::DeleteSnapshotRequest { snapshot: snapshot_path("ledger-before") }),
        Code::NotFound,
        "a second delete",
    );
    assert!(snapshot_names(&grpc).is_empty());
}

/// Needs the core work (wt-core): labels kept by the router, exactly-once changed by updates,
/// UpdateSnapshot.
#[test]
fn labels_are_kept_and_updated_on_topics_subscriptions_and_snapshots() {
    let (_daemon, grpc) = grpc_daemon("grpc-labels");
    let labels = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
        pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
    };
    let team = labels(&[("team", "billing"), ("tier", "gold")]);
    let created = grpc
        .create_topic(pubsub::Topic {
            name: topic_path("invoices"),
            labels: team.clone(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(created.labels, team);
    assert_eq!(get_topic(&grpc, "invoices").unwrap().labels, team);
    let moved = labels(&[("team", "finance")]);
    let updated = grpc
        .update_topic(pubsub::UpdateTopicRequest {
            topic: Some(pubsub::Topic {
                name: topic_path("invoices"),
                labels: moved.clone(),
                ..Default::default()
            }),
            update_mask: mask(&["labels"]),
        })
        .unwrap();
    assert_eq!(updated.labels, moved);
    assert_eq!(get_topic(&grpc, "invoices").unwrap().labels, moved);

    let subscription = pubsub::Subscription {
        name: subscription_path("invoices-mail"),
        topic: topic_path("invoices"),
        labels: team.clone(),
        ..Default::default()
    };
    assert_eq!(grpc.create_subscription(subscription).unwrap().labels, team);
    let updated = grpc
        .update_subscription(pubsub::UpdateSubscriptionRequest {
            subscription: Some(pubsub::Subscription {
                name: subscription_path("invoices-mail"),
                labels: moved.clone(),
                enable_exactly_once_delivery: true,
                ..Default::default()
            }),
            update_mask: mask(&["labels", "enable_exactly_once_delivery"]),
        })
        .unwrap();
    assert_eq!(updated.labels, moved);
    assert!(updated.enable_exactly_once_delivery);
    let shown = get_subscription(&grpc, "invoices-mail").unwrap();
    assert_eq!(shown.labels, moved);
    assert!(shown.enable_exactly_once_delivery);

    let snapshot = grpc
        .create_snapshot(pubsub::CreateSnapshotRequest {
            name: snapshot_path("invoices-mark"),
            subscription: subscription_path("invoices-mail"),
            labels: team.clone(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(snapshot.labels, team);
    let updated = grpc
        .update_snapshot(pubsub::UpdateSnapshotRequest {
            snapshot: Some(pubsub::Snapshot {
                name: snapshot_path("invoices-mark"),
                labels: moved.clone(),
                ..Default::default()
            }),
            update_mask: mask(&["labels"]),
        })
        .unwrap();
    assert_eq!(updated.labels, moved);
    assert_eq!(get_snapshot(&grpc, "invoices-mark").unwrap().labels, moved);

    // Labels outside Pub/Sub's rules are refused, and nothing is stored.
    let bad = labels(&[("Team", "x")]);
    let refused_topic = grpc.create_topic(pubsub::Topic {
        name: topic_path("bad-labels"),
        labels: bad.clone(),
        ..Default::default()
    });
    refused(refused_topic, Code::InvalidArgument, "an upper-case label key");
    refused(get_topic(&grpc, "bad-labels"), Code::NotFound, "a topic refused for its labels");
    let refused_update = grpc.update_topic(pubsub::UpdateTopicRequest {
        topic: Some(pubsub::Topic { name: topic_path("invoices"), labels: bad, ..Default::default() }),
        update_mask: mask(&["labels"]),
    });
    refused(refused_update, Code::InvalidArgument, "an update to bad labels");
    assert_eq!(get_topic(&grpc, "invoices").unwrap().labels, moved);
}

/// Needs the core work (wt-core): the router's DetachSubscription.
#[test]
fn a_detached_subscription_stays_but_leaves_its_topic() {
    let (daemon, grpc) = grpc_daemon("grpc-detach");
    grpc.create_plain_topic("alerts").unwrap();
    grpc.create_plain_subscription("alerts-pager", "alerts").unwrap();
    grpc.publish_data("alerts", &[b"disk full"]).unwrap();
    grpc.detach_subscription(pubsub::DetachSubscriptionRequest {
        subscription: subscription_path("alerts-pager"),
    })
    .unwrap();
    let shown = get_subscription(&grpc, "alerts-pager").unwrap();
    assert!(shown.detached, "{shown:?}");
    let pulled = block_on(daemon.client().pull("alerts-pager", 10, EMPTY_PULL_WAIT_MS));
    let error = pulled.expect_err("a detached subscription delivers nothing");
    assert!(format!("{error:?}").contains("FailedPrecondition"), "{error:?}");
    // The topic is untouched, and takes messages still.
    grpc.publish_data("alerts", &[b"disk full again"]).unwrap();
    let subscriptions = grpc
        .list_topic_subscriptions(pubsub::ListTopicSubscriptionsRequest {
            topic: topic_path("alerts"),
            ..Default::default()
        })
        .unwrap();
    assert!(subscriptions.subscriptions.is_empty(), "{subscriptions:?}");
    refused(
        grpc.detach_subscription(pubsub::DetachSubscriptionRequest {
            subscription: subscription_path("no-such-pager"),
        }),
        Code::NotFound,
        "a missing subscription",
    );
}

#[test]
fn bad_names_and_unimplemented_fields_are_refused_by_name_and_store_nothing() {
    let (_daemon, grpc) = grpc_daemon("grpc-bad-input");
    for name in [
        "orders",
        "projects/test-project/topics/ab",
        "projects/Test/topics/orders",
        "projects/test-project/topics/goog-orders",
    ] {
        let topic = pubsub::Topic { name: name.into(), ..Default::default() };
        let said = refused(grpc.create_topic(topic), Code::InvalidArgument, name);
        assert!(said.contains(name), "{said}");
        refused(grpc.get_topic(pubsub::GetTopicRequest { topic: name.into() }), Code::InvalidArgument, name);
        refused(
            grpc.delete_topic(pubsub::DeleteTopicRequest { topic: name.into() }),
            Code::InvalidArgument,
            name,
        );
        let publish = pubsub::PublishRequest {
            topic: name.into(),
            messages: vec![pubsub::PubsubMessage { data: b"x".to_vec().into(), ..Default::default() }],
        };
        refused(grpc.publish(publish), Code::InvalidArgument, name);
        let subscription =
            pubsub::Subscription { name: name.into(), topic: topic_path("orders"), ..Default::default() };
        refused(grpc.create_subscription(subscription), Code::InvalidArgument, name);
        let get = pubsub::GetSubscriptionRequest { subscription: name.into() };
        refused(grpc.get_subscription(get), Code::InvalidArgument, name);
        let snapshot = pubsub::GetSnapshotRequest { snapshot: name.into() };
        refused(grpc.get_snapshot(snapshot), Code::InvalidArgument, name);
    }
    let bad_project = pubsub::ListTopicsRequest { project: "test-project".into(), ..Default::default() };
    refused(grpc.list_topics(bad_project), Code::InvalidArgument, "a project without projects/");
    let negative = pubsub::ListTopicsRequest { project: project_path(), page_size: -1, ..Default::default() };
    refused(grpc.list_topics(negative), Code::InvalidArgument, "a negative page size");

    // A topic's fields Ringpost does not implement.
    let topic = || pubsub::Topic { name: topic_path("orders"), ..Default::default() };
    for (field, asked) in [
        (
            "kms_key_name",
            pubsub::Topic {
                kms_key_name: "projects/p/locations/l/keyRings/r/cryptoKeys/k".into(),
                ..topic()
            },
        ),
        (
            "message_storage_policy",
            pubsub::Topic {
                message_storage_policy: Some(pubsub::MessageStoragePolicy {
                    allowed_persistence_regions: vec!["europe-west1".into()],
                    ..Default::default()
                }),
                ..topic()
            },
        ),
        (
            "ingestion_data_source_settings",
            pubsub::Topic { ingestion_data_source_settings: Some(Default::default()), ..topic() },
        ),
        ("message_transforms", pubsub::Topic { message_transforms: vec![Default::default()], ..topic() }),
    ] {
        let said = refused(grpc.create_topic(asked), Code::InvalidArgument, field);
        assert!(said.contains(field) && said.contains("not supported"), "{field}: {said}");
    }
    let short_retention = pubsub::Topic { message_retention_duration: seconds(60), ..topic() };
    refused(grpc.create_topic(short_retention), Code::InvalidArgument, "a retention under 10 minutes");
    assert!(grpc.topic_names().unwrap().is_empty(), "a refused topic was stored");

    // A subscription's: exports, detached, transforms; and settings out of range. (Push
    // configurations are `push_config.rs`'s.)
    grpc.create_plain_topic("orders").unwrap();
    let subscription = || pubsub::Subscription {
        name: subscription_path("orders-audit"),
        topic: topic_path("orders"),
        ..Default::default()
    };
    for (field, asked) in [
        (
            "bigquery_config",
            pubsub::Subscription { bigquery_config: Some(Default::default()), ..subscription() },
        ),
        (
            "cloud_storage_config",
            pubsub::Subscription { cloud_storage_config: Some(Default::default()), ..subscription() },
        ),
        ("detached", pubsub::Subscription { detached: true, ..subscription() }),
        (
            "message_transforms",
            pubsub::Subscription { message_transforms: vec![Default::default()], ..subscription() },
        ),
    ] {
        let said = refused(grpc.create_subscription(asked), Code::InvalidArgument, field);
        assert!(said.contains(field) && said.contains("not supported"), "{field}: {said}");
    }
    for (what, asked) in [
        ("ACK_DEADLINE_SECONDS_MIN", pubsub::Subscription { ack_deadline_seconds: 5, ..subscription() }),
        (
            "RETENTION_SECONDS_MIN",
            pubsub::Subscription { message_retention_duration: seconds(5), ..subscription() },
        ),
        ("filter", pubsub::Subscription { filter: "attributes.kind = ".into(), ..subscription() }),
        (
            "MAX_DELIVERY_ATTEMPTS_MIN",
            pubsub::Subscription {
                dead_letter_policy: Some(pubsub::DeadLetterPolicy {
                    dead_letter_topic: topic_path("orders"),
                    max_delivery_attempts: 2,
                }),
                ..subscription()
            },
        ),
    ] {
        let said = refused(grpc.create_subscription(asked), Code::InvalidArgument, what);
        assert!(said.contains(what), "{what}: {said}");
    }
    let no_topic = pubsub::Subscription { topic: topic_path("no-such-topic"), ..subscription() };
    refused(grpc.create_subscription(no_topic), Code::NotFound, "a subscription of a missing topic");
    let no_dead_letter_topic = pubsub::Subscription {
        dead_letter_policy: Some(pubsub::DeadLetterPolicy {
            dead_letter_topic: topic_path("no-such-topic"),
            max_delivery_attempts: 5,
        }),
        ..subscription()
    };
    refused(grpc.create_subscription(no_dead_letter_topic), Code::NotFound, "a missing dead-letter topic");
    assert!(grpc.subscription_names().unwrap().is_empty(), "a refused subscription was stored");
}

#[test]
fn bad_update_masks_are_refused_by_name_and_change_nothing() {
    let (_daemon, grpc) = grpc_daemon("grpc-bad-masks");
    grpc.create_plain_topic("orders").unwrap();
    grpc.create_plain_subscription("orders-audit", "orders").unwrap();
    create_snapshot(&grpc, "orders-mark", "orders-audit").unwrap();

    let topic = pubsub::Topic {
        name: topic_path("orders"),
        message_retention_duration: seconds(3600),
        ..Default::default()
    };
    for (paths, said_in_refusal) in [
        (&[][..], "update_mask is required"),
        (&["name"][..], "'name'"),
        (&["kms_key_name"][..], "kms_key_name is not supported"),
        (&["message_retention_duration", "state_of_mind"][..], "'state_of_mind'"),
    ] {
        let request = pubsub::UpdateTopicRequest { topic: Some(topic.clone()), update_mask: mask(paths) };
        let said = refused(grpc.update_topic(request), Code::InvalidArgument, said_in_refusal);
        assert!(said.contains(said_in_refusal), "{said}");
    }
    let no_mask = pubsub::UpdateTopicRequest { topic: Some(topic), update_mask: None };
    refused(grpc.update_topic(no_mask), Code::InvalidArgument, "no update mask");
    assert_eq!(get_topic(&grpc, "orders").unwrap().message_retention_duration, None, "the topic changed");

    let subscription = pubsub::Subscription {
        name: subscription_path("orders-audit"),
        ack_deadline_seconds: 60,
        filter: "attributes.kind = \"x\"".into(),
        ..Default::default()
    };
    for (paths, said_in_refusal) in [
        (&[][..], "update_mask is required"),
        (&["ack_deadline_seconds", "filter"][..], "'filter'"),
        (&["enable_message_ordering"][..], "'enable_message_ordering'"),
        (&["topic"][..], "'topic'"),
        (&["bigquery_config"][..], "bigquery_config is not supported"),
        (&["retry_policy.minimum_backoff"][..], "'retry_policy.minimum_backoff'"),
    ] {
        let request = pubsub::UpdateSubscriptionRequest {
            subscription: Some(subscription.clone()),
            update_mask: mask(paths),
        };
        let said = refused(grpc.update_subscription(request), Code::InvalidArgument, said_in_refusal);
        assert!(said.contains(said_in_refusal), "{said}");
    }
    let out_of_range = pubsub::UpdateSubscriptionRequest {
        subscription: Some(pubsub::Subscription { ack_deadline_seconds: 5000, ..subscription.clone() }),
        update_mask: mask(&["ack_deadline_seconds"]),
    };
    refused(grpc.update_subscription(out_of_range), Code::InvalidArgument, "an ack deadline of 5000 s");
    let missing = pubsub::UpdateSubscriptionRequest {
        subscription: Some(pubsub::Subscription { name: subscription_path("no-such-audit"), ..subscription }),
        update_mask: mask(&["ack_deadline_seconds"]),
    };
    refused(grpc.update_subscription(missing), Code::NotFound, "an update of a missing subscription");
    let unchanged = get_subscription(&grpc, "orders-audit").unwrap();
    assert_eq!(
        (unchanged.ack_deadline_seconds, unchanged.filter.as_str()),
        (10, ""),
        "the subscription changed"
    );

    let snapshot = pubsub::Snapshot { name: snapshot_path("orders-mark"), ..Default::default() };
    for (paths, said_in_refusal) in [
        (&[][..], "update_mask is required"),
        (&["expire_time"][..], "expire_time"),
        (&["topic"][..], "'topic'"),
    ] {
        let request =
            pubsub::UpdateSnapshotRequest { snapshot: Some(snapshot.clone()), update_mask: mask(paths) };
        let said = refused(grpc.update_snapshot(request), Code::InvalidArgument, said_in_refusal);
        assert!(said.contains(said_in_refusal), "{said}");
    }
}

#[test]
fn publishes_are_checked_with_pub_subs_limits_and_a_refused_one_stores_nothing() {
    let (daemon, grpc) = grpc_daemon("grpc-publish-limits");
    grpc.create_plain_topic("uploads").unwrap();
    grpc.create_plain_subscription("uploads-scan", "uploads").unwrap();
    let publish = |messages: Vec<pubsub::PubsubMessage>| {
        grpc.publish(pubsub::PublishRequest { topic: topic_path("uploads"), messages })
    };
    let message = |data: Vec<u8>| pubsub::PubsubMessage { data: data.into(), ..Default::default() };

    let oversized = message(vec![7u8; 10_000_001]);
    let said = refused(publish(vec![oversized]), Code::InvalidArgument, "a message over 10 MB");
    assert!(said.contains("MESSAGE_BYTES_MAX"), "{said}");
    let halves = vec![message(vec![1u8; 5_000_001]), message(vec![2u8; 5_000_001])];
    let said = refused(publish(halves), Code::InvalidArgument, "a request over 10 MB");
    assert!(said.contains("_BYTES_MAX"), "{said}");
    let attributes = (0..101).map(|index| (format!("key-{index}"), "value".to_owned())).collect();
    let crowded = pubsub::PubsubMessage { attributes, ..message(b"x".to_vec()) };
    let said = refused(publish(vec![crowded]), Code::InvalidArgument, "101 attributes");
    assert!(said.contains("ATTRIBUTES_COUNT_MAX"), "{said}");
    let long_key = pubsub::PubsubMessage { ordering_key: "k".repeat(1025), ..message(b"x".to_vec()) };
    let said = refused(publish(vec![long_key]), Code::InvalidArgument, "an ordering key over 1 KB");
    assert!(said.contains("ORDERING_KEY_BYTES_MAX"), "{said}");
    let said = refused(publish(Vec::new()), Code::InvalidArgument, "no messages");
    assert!(said.contains("no messages"), "{said}");
    let many = (0..1001).map(|_| message(b"x".to_vec())).collect();
    let said = refused(publish(many), Code::InvalidArgument, "1001 messages");
    assert!(said.contains("PUBLISH_BATCH_MESSAGES_MAX"), "{said}");
    refused(grpc.publish_data("no-such-uploads", &[b"x"]), Code::NotFound, "a missing topic");
    assert!(
        pull_natively(&daemon.client(), "uploads-scan", EMPTY_PULL_WAIT_MS, false).is_empty(),
        "a refused publish stored a message"
    );

    // At the limits exactly, accepted: a 100-attribute message, and a near-10 MB one.
    let attributes = (0..100).map(|index| (format!("key-{index}"), "value".to_owned())).collect();
    let full =
        pubsub::PubsubMessage { attributes, ordering_key: "k".repeat(1024), ..message(b"full".to_vec()) };
    assert_eq!(publish(vec![full]).unwrap().message_ids.len(), 1);
    assert_eq!(publish(vec![message(vec![3u8; 9_000_000])]).unwrap().message_ids.len(), 1);
}

#[test]
fn messages_cross_between_the_grpc_api_and_the_native_protocol() {
    let (daemon, grpc) = grpc_daemon("grpc-cross");
    let native = daemon.client();
    grpc.create_plain_topic("orders").unwrap();
    grpc.create_plain_subscription("orders-audit", "orders").unwrap();
    let by_grpc = pubsub::PubsubMessage {
        data: b"from gRPC".to_vec().into(),
        attributes: [("origin".to_owned(), "grpc".to_owned()), ("kind".to_owned(), "order".to_owned())]
            .into(),
        ordering_key: "customer-7".into(),
        ..Default::default()
    };
    let grpc_ids = grpc
        .publish(pubsub::PublishRequest { topic: topic_path("orders"), messages: vec![by_grpc.clone()] })
        .unwrap()
        .message_ids;
    let native_ids =
        block_on(native.publish("orders", vec![Message::new("from native").attribute("origin", "native")]))
            .unwrap();
    let grpc_id: u64 = grpc_ids[0].parse().expect("a message id is a decimal number");
    assert!(native_ids[0] > grpc_id, "one topic, one sequence of ids: {grpc_id} then {native_ids:?}");

    let mut pulled = block_on(native.pull("orders-audit", 10, PULL_WAIT_MS)).unwrap();
    if pulled.len() < 2 {
        pulled.extend(block_on(native.pull("orders-audit", 10, PULL_WAIT_MS)).unwrap());
    }
    pulled.sort_by_key(|message| message.message_id);
    assert_eq!(pulled.len(), 2, "{pulled:?}");
    let first = &pulled[0];
    assert_eq!((first.message_id, first.data.as_slice()), (grpc_id, &b"from gRPC"[..]));
    assert_eq!(first.ordering_key, "customer-7");
    let mut attributes: Vec<(&str, &str)> =
        first.attributes.iter().map(|attribute| (attribute.key.as_str(), attribute.value.as_str())).collect();
    attributes.sort();
    assert_eq!(attributes, [("kind", "order"), ("origin", "grpc")]);
    assert_eq!((pulled[1].message_id, pulled[1].data.as_slice()), (native_ids[0], &b"from native"[..]));

    // A topic made natively is the gRPC API's too, in any project.
    block_on(native.create_topic("shipments")).unwrap();
    let topic =
        grpc.get_topic(pubsub::GetTopicRequest { topic: "projects/shipping-7/topics/shipments".into() });
    assert_eq!(topic.unwrap().name, "projects/shipping-7/topics/shipments");
}

#[test]
fn the_grpc_api_asks_for_the_native_protocols_permissions() {
    let files = Files::new("grpc-auth");
    let root = token("root");
    let alice = token("alice");
    let viewer = token("vera");
    let access = AccessFile::new(
        &files,
        &access_text(
            &[&root, &alice, &viewer],
            &[
                "admin * root",
                "publisher topic:orders-* alice",
                "subscriber topic:orders-* alice",
                "editor subscription:alice-* alice",
                "viewer topic:orders-* vera",
            ],
        ),
    );
    let daemon = daemon_requiring_auth("grpc-auth", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let address = daemon.grpc_address.clone().expect("the gRPC API's address");
    let admin = Grpc::connect_with_token(&address, Some(&root.secret));
    admin.create_plain_topic("orders-eu").unwrap();
    admin.create_plain_topic("payments").unwrap();
    admin.create_plain_subscription("audit", "orders-eu").unwrap();

    // No credential: Unauthenticated, for an operation and for a listing.
    let nobody = Grpc::connect(&address);
    refused(nobody.create_plain_topic("orders-us"), Code::Unauthenticated, "a create without a token");
    refused(nobody.publish_data("orders-eu", &[b"x"]), Code::Unauthenticated, "a publish without a token");
    refused(nobody.topic_names(), Code::Unauthenticated, "a listing without a token");
    let unknown = Grpc::connect_with_token(&address, Some("rpt_not-a-token-of-this-daemon"));
    refused(
        unknown.get_topic(pubsub::GetTopicRequest { topic: topic_path("orders-eu") }),
        Code::Unauthenticated,
        "an unknown token",
    );

    // A token does what its roles allow, and only that; nothing refused is stored.
    let as_alice = Grpc::connect_with_token(&address, Some(&alice.secret));
    as_alice.publish_data("orders-eu", &[b"by alice"]).unwrap();
    let said =
        refused(as_alice.publish_data("payments", &[b"x"]), Code::PermissionDenied, "publish elsewhere");
    assert!(said.contains("alice") && !said.contains(&alice.secret), "{said}");
    refused(as_alice.create_plain_topic("orders-us"), Code::PermissionDenied, "alice creates a topic");
    refused(get_topic(&as_alice, "orders-eu"), Code::PermissionDenied, "alice reads a topic");
    as_alice.create_plain_subscription("alice-orders", "orders-eu").unwrap();
    refused(
        as_alice.create_plain_subscription("alice-payments", "payments"),
        Code::PermissionDenied,
        "a subscription of a topic alice may not attach to",
    );
    refused(
        as_alice.create_plain_subscription("bob-orders", "orders-eu"),
        Code::PermissionDenied,
        "another's name",
    );
    refused(
        as_alice.delete_subscription(pubsub::DeleteSubscriptionRequest {
            subscription: subscription_path("audit"),
        }),
        Code::PermissionDenied,
        "alice deletes another's subscription",
    );
    refused(
        as_alice.seek(pubsub::SeekRequest {
            subscription: subscription_path("audit"),
            target: Some(pubsub::seek_request::Target::Time(Default::default())),
        }),
        Code::PermissionDenied,
        "alice seeks another's subscription",
    );
    refused(
        create_snapshot(&as_alice, "alice-mark", "audit"),
        Code::PermissionDenied,
        "a snapshot of another's",
    );
    refused(
        as_alice.delete_topic(pubsub::DeleteTopicRequest { topic: topic_path("orders-eu") }),
        Code::PermissionDenied,
        "alice deletes a topic",
    );

    // Listings show what their reader may list.
    let as_vera = Grpc::connect_with_token(&address, Some(&viewer.secret));
    assert_eq!(as_vera.topic_names().unwrap(), [topic_path("orders-eu")]);
    assert!(as_vera.subscription_names().unwrap().is_empty());
    refused(as_vera.publish_data("orders-eu", &[b"x"]), Code::PermissionDenied, "a viewer publishes");

    assert_eq!(admin.topic_names().unwrap(), [topic_path("orders-eu"), topic_path("payments")]);
    assert_eq!(
        admin.subscription_names().unwrap(),
        [subscription_path("alice-orders"), subscription_path("audit")]
    );
    assert!(snapshot_names(&admin).is_empty());
    let native = crate::security::client_with(&daemon, &root);
    let pulled = block_on(native.pull("audit", 10, PULL_WAIT_MS)).unwrap();
    assert_eq!(pulled.iter().map(|message| message.data.as_slice()).collect::<Vec<_>>(), [&b"by alice"[..]]);
}

/// Recreations a test makes at most to move a topic to another shard.
const MOVE_ATTEMPTS_MAX: usize = 40;

/// The forwarder address serving `topic`, asked of a new native client (a client caches routes).
fn serving(daemon: &Daemon, topic: &str) -> String {
    block_on(daemon.client().lookup_topic(topic)).unwrap().remove(0)
}

#[test]
fn a_publish_follows_its_topic_to_another_shard() {
    let (daemon, grpc) = grpc_daemon("grpc-moved");
    let native = daemon.client();
    grpc.create_plain_topic("moving").unwrap();
    // The gateway now remembers which forwarder serves the topic.
    grpc.publish_data("moving", &[b"before"]).unwrap();
    let first = serving(&daemon, "moving");

    // The topic made again, natively (the gateway is not told), until it is served elsewhere:
    // topics kept on the first forwarder fill its share, so placement moves on.
    let mut moved = false;
    for filler in 0..MOVE_ATTEMPTS_MAX {
        block_on(native.delete_topic("moving")).unwrap();
        let filler = format!("filler-{filler}");
        block_on(native.create_topic(&filler)).unwrap();
        if serving(&daemon, &filler) != first {
            block_on(native.delete_topic(&filler)).unwrap();
        }
        block_on(native.create_topic("moving")).unwrap();
        if serving(&daemon, "moving") != first {
            moved = true;
            break;
        }
    }
    assert!(moved, "the topic stayed on {first} through {MOVE_ATTEMPTS_MAX} recreations");
    ringpost_tests::create_subscription(&daemon.client(), "moving-reader", "moving", 10);

    // The stale route is found out on the old forwarder, and the publish goes where it moved.
    let ids = grpc.publish_data("moving", &[b"after"]).unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(pull_natively(&daemon.client(), "moving-reader", PULL_WAIT_MS, true), [b"after".to_vec()]);
}
