//! Google's gRPC API over a topic of two publish sources led by two nodes (one replica each,
//! one shard a node): a node's gateway spreads publishes over both, its own source in one hop
//! and the other node's carried there, and gathers pulls, streams and acknowledgements from
//! both, so that every message published reaches every subscription whichever node a client
//! reaches.

use super::grpc_sources::{
    ack_source, publish_spread, publish_unordered, source_of, Stream, KEYS, PER_KEY,
    STREAM_ACK_DEADLINE_SECONDS, WINDOW,
};
use ringpost_proto::pubsub;
use ringpost_tests::cluster::Cluster;
use ringpost_tests::grpc::{subscription_path, topic_path, Grpc};
use ringpost_tests::succeeded;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// Two nodes serving gRPC and a topic `topic` of two sources, one led by each node; the
/// cluster and a gRPC client of each node.
fn start(label: &str, topic: &str) -> (Cluster, Grpc, Grpc) {
    let grpc_on = ["--grpc-listen".to_owned(), "127.0.0.1:0".to_owned()];
    let cluster = Cluster::start(label, 2, grpc_on.to_vec());
    let created = succeeded(&cluster.node(1).cli(&["topic", "create", topic, "--sources", "2"]));
    let leader_nodes: HashSet<String> = created
        .split("\"leader_node\":")
        .skip(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
        .collect();
    assert_eq!(leader_nodes.len(), 2, "both sources are led by one node: {created}");
    let grpc = |id: u64| Grpc::connect(cluster.node(id).grpc_address.as_deref().expect("gRPC serves"));
    let (first, second) = (grpc(1), grpc(2));
    (cluster, first, second)
}

/// Publishing to node 1 spreads over both sources (each key's messages to its key's source,
/// unordered requests over both: `publish_spread` checks the ids' source bits), though node 1
/// leads one of them; a StreamingPull at node 2 of an ordered subscription receives every
/// message once, each key's in order, never more than its window unacknowledged over both
/// sources, and acknowledges on the stream; a unary Pull at node 1 drains another subscription,
/// each ack id acknowledged at the source it names, on whichever node; nothing comes again.
/// Fails when the gateway serves a topic with a source led elsewhere as source 0 alone: every
/// publish lands on source 0 (`publish_spread`'s first key of source 1 fails).
#[test]
fn grpc_spreads_and_gathers_over_sources_led_by_other_nodes() {
    let (_cluster, one, two) = start("grpc-remote-sources", "far");
    for (name, ordered) in [("far-stream", true), ("far-pull", false)] {
        one.create_subscription(pubsub::Subscription {
            name: subscription_path(name),
            topic: topic_path("far"),
            ack_deadline_seconds: 60,
            enable_message_ordering: ordered,
            ..Default::default()
        })
        .expect("create subscription");
    }
    let published = publish_spread(&one, "far");
    assert_eq!(published.len(), KEYS * PER_KEY + 1_000);

    let mut stream = Stream::open(&two, "far-stream", WINDOW);
    let mut received: HashSet<String> = HashSet::new();
    let mut last_of_key: BTreeMap<String, String> = BTreeMap::new();
    let (mut unacked, mut sources) = (Vec::new(), HashSet::new());
    let deadline = Instant::now() + Duration::from_secs(90);
    while received.len() < published.len() && Instant::now() < deadline {
        let Some(response) = stream.next(&two, Duration::from_millis(300)) else {
            stream.acknowledge(&two, std::mem::take(&mut unacked));
            continue;
        };
        for delivered in response.received_messages {
            let message = delivered.message.expect("a message");
            let data = String::from_utf8(message.data.to_vec()).unwrap();
            assert_eq!(published.get(&message.message_id), Some(&data), "an unknown message");
            assert!(received.insert(message.message_id.clone()), "{data} delivered twice");
            assert_eq!(ack_source(&delivered.ack_id), source_of(&message.message_id));
            sources.insert(ack_source(&delivered.ack_id));
            if !message.ordering_key.is_empty() {
                if let Some(before) = last_of_key.insert(message.ordering_key.clone(), data.clone()) {
                    assert!(before < data, "key {}: {data} after {before}", message.ordering_key);
                }
            }
            unacked.push(delivered.ack_id);
        }
        assert!(unacked.len() <= WINDOW, "{} unacknowledged over a window of {WINDOW}", unacked.len());
        if unacked.len() == WINDOW {
            stream.acknowledge(&two, std::mem::take(&mut unacked));
        }
    }
    assert_eq!(received.len(), published.len(), "the stream did not gather every message");
    assert_eq!(sources, HashSet::from([0, 1]), "ack ids of one source only");
    assert!(
        last_of_key.values().all(|last| last.ends_with(&format!("{:03}", PER_KEY - 1))),
        "{last_of_key:?}"
    );
    stream.acknowledge(&two, std::mem::take(&mut unacked));

    let mut drained = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while drained.len() < published.len() && Instant::now() < deadline {
        #[allow(deprecated)]
        let request = pubsub::PullRequest {
            subscription: subscription_path("far-pull"),
            return_immediately: false,
            max_messages: 300,
        };
        let pulled = one.pull(request).expect("pull").received_messages;
        assert!(pulled.len() <= 300);
        let ack_ids = pulled.iter().map(|message| message.ack_id.clone()).collect();
        for message in pulled {
            assert!(drained.insert(message.message.expect("a message").message_id), "pulled twice");
        }
        let request = pubsub::AcknowledgeRequest { subscription: subscription_path("far-pull"), ack_ids };
        one.acknowledge(request).expect("acknowledge");
    }
    assert_eq!(drained.len(), published.len(), "the pulls did not gather every message");

    // Past the stream's ack deadline nothing acknowledged comes again on it; once it went,
    // nothing is leased, on either source, at either node. The client's runtime runs only
    // while driven, so the wait drives it: the last acknowledgements go out meanwhile.
    let past_deadline = Duration::from_secs(STREAM_ACK_DEADLINE_SECONDS as u64 + 2);
    two.block_on(async { tokio::time::sleep(past_deadline).await });
    if let Some(again) = stream.next(&two, Duration::from_millis(500)) {
        let again: Vec<_> = again
            .received_messages
            .iter()
            .map(|message| (message.ack_id.clone(), message.message.as_ref().unwrap().data.clone()))
            .collect();
        panic!("delivered again after its ack: {again:?}");
    }
    drop(stream);
    for (grpc, subscription) in
        [(&one, "far-stream"), (&two, "far-stream"), (&one, "far-pull"), (&two, "far-pull")]
    {
        let again = grpc.pull_now(subscription, 100).expect("pull");
        let again: Vec<_> = again
            .iter()
            .map(|message| (message.ack_id.clone(), message.message.as_ref().unwrap().data.clone()))
            .collect();
        assert!(again.is_empty(), "{subscription} redelivered: {again:?}");
    }
}

/// A stream at node 1 that leaves holding messages of both sources gives them back on both,
/// the other node's source included (the subscription's ack deadline is ten minutes, so only a
/// lease given back comes again within the test): another stream receives every message, and
/// acknowledges them all, each at its source. A unary ModifyAckDeadline of 0 at the other node
/// gives back messages of both sources at once, and a unary Acknowledge there settles them.
#[test]
fn a_gathered_stream_that_leaves_gives_back_the_leases_of_a_source_led_elsewhere() {
    const MESSAGES: usize = 40;
    let (_cluster, one, two) = start("grpc-remote-leave", "held");
    one.create_subscription(pubsub::Subscription {
        name: subscription_path("held-sub"),
        topic: topic_path("held"),
        ack_deadline_seconds: 600,
        ..Default::default()
    })
    .expect("create subscription");
    let published = publish_unordered(&two, "held", MESSAGES);
    let sources: HashSet<u64> = published.iter().map(|id| source_of(id)).collect();
    assert_eq!(sources, HashSet::from([0, 1]), "the publishes did not spread");

    let mut leaving = Stream::open(&one, "held-sub", WINDOW);
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while held.len() < WINDOW && Instant::now() < deadline {
        if let Some(response) = leaving.next(&one, Duration::from_millis(300)) {
            held.extend(response.received_messages.into_iter().map(|message| message.ack_id));
        }
    }
    assert_eq!(held.len(), WINDOW, "the leaving stream did not fill its window");
    let held_sources: HashSet<u64> = held.iter().map(|ack_id| ack_source(ack_id)).collect();
    assert_eq!(held_sources, HashSet::from([0, 1]), "the window held one source's messages");
    drop(leaving);

    let mut staying = Stream::open(&one, "held-sub", 0);
    let (mut received, mut ack_ids) = (HashSet::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.len() < MESSAGES && Instant::now() < deadline {
        let Some(response) = staying.next(&one, Duration::from_millis(300)) else { continue };
        for delivered in response.received_messages {
            let id = delivered.message.expect("a message").message_id;
            assert!(received.insert(id), "delivered twice to the staying stream");
            ack_ids.push(delivered.ack_id);
        }
    }
    assert_eq!(received, published, "the leaving stream's leases were not given back");
    staying.acknowledge(&one, ack_ids);
    one.block_on(async { tokio::time::sleep(Duration::from_secs(2)).await });
    drop(staying);
    assert!(two.pull_now("held-sub", 100).expect("pull").is_empty(), "acknowledged, yet delivered again");

    // A unary ModifyAckDeadline of 0 at node 2 gives back what a pull leased on both sources
    // (the ack deadline is ten minutes: only the change brings them back at once).
    let more = publish_unordered(&one, "held", 20);
    let pull_all = |grpc: &Grpc| -> Vec<(String, String)> {
        let mut pulled = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while pulled.len() < more.len() && Instant::now() < deadline {
            let batch = grpc.pull_now("held-sub", 100).expect("pull");
            pulled.extend(
                batch.into_iter().map(|message| (message.ack_id, message.message.unwrap().message_id)),
            );
        }
        pulled
    };
    let leased = pull_all(&one);
    assert_eq!(leased.iter().map(|(_, id)| id.clone()).collect::<HashSet<_>>(), more);
    let ack_ids: Vec<String> = leased.into_iter().map(|(ack_id, _)| ack_id).collect();
    let sources: HashSet<u64> = ack_ids.iter().map(|ack_id| ack_source(ack_id)).collect();
    assert_eq!(sources, HashSet::from([0, 1]));
    let request = pubsub::ModifyAckDeadlineRequest {
        subscription: subscription_path("held-sub"),
        ack_ids,
        ack_deadline_seconds: 0,
    };
    two.modify_ack_deadline(request).expect("modify ack deadline");
    let again = pull_all(&two);
    assert_eq!(again.iter().map(|(_, id)| id.clone()).collect::<HashSet<_>>(), more, "not given back");
    let ack_ids = again.into_iter().map(|(ack_id, _)| ack_id).collect();
    two.acknowledge(pubsub::AcknowledgeRequest { subscription: subscription_path("held-sub"), ack_ids })
        .expect("acknowledge");
    assert!(one.pull_now("held-sub", 100).expect("pull").is_empty(), "acknowledged, yet delivered again");
}
