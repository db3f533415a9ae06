//! Replicated topics on three real nodes (docs/REPLICATION.md): a topic on three replicas,
//! its leader's node SIGKILLed under four publishers and two acknowledging subscribers, again
//! and again, each time brought back. The history checker must find no acknowledged publish
//! lost and nothing unexpected, and no message whose acknowledgement was confirmed may be
//! delivered again. Each failover (from the kill to the first publish acknowledged after it)
//! is printed.
//!
//! `RINGPOST_REPLICATION_KILLS` sets how many leaders are killed (default 3).

use ringpost_client::{block_on, Client, Message};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::load::Load;
use ringpost_tests::{create_subscription, Random};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const PUBLISHERS: usize = 4;
const SUBSCRIBERS: usize = 2;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// The failover the issue allows: from a leader's death to publishes acknowledged again.
const FAILOVER_MAX: Duration = Duration::from_secs(10);

/// The node whose forwarder the routers name first for `topic`: its leader.
fn leader_of(cluster: &Cluster, topic: &str) -> u64 {
    cluster.topic_leader(topic)
}

fn running_routers(cluster: &Cluster) -> Vec<String> {
    cluster.ids().filter(|id| cluster.is_running(*id)).map(|id| cluster.node(id).address.clone()).collect()
}

#[test]
fn killing_a_topics_leader_under_load_loses_no_acknowledged_publish_or_acknowledgement() {
    let kills: u32 =
        std::env::var("RINGPOST_REPLICATION_KILLS").ok().and_then(|n| n.parse().ok()).unwrap_or(3);
    let mut cluster = Cluster::start("replication-kill", 3, Vec::new());
    {
        let client = cluster.node(1).client();
        let created = block_on(client.create_topic("replicated")).unwrap();
        assert_eq!(created.name, "replicated");
        create_subscription(&client, "replicated-sub", "replicated", 10);
    }
    let load =
        Load::start("replicated", "replicated-sub", running_routers(&cluster), PUBLISHERS, SUBSCRIBERS);
    load.wait_for_publishes("the publishers start", Duration::from_secs(30));
    let mut random = Random::from_time();
    for kill in 0..kills {
        std::thread::sleep(Duration::from_millis(random.between(500, 1500)));
        let leader = leader_of(&cluster, "replicated");
        cluster.node_mut(leader).kill();
        *load.routers.write().unwrap() = running_routers(&cluster);
        let failover = load.wait_for_publishes("publishing after the leader's death", FAILOVER_MAX);
        let new_leader = leader_of(&cluster, "replicated");
        eprintln!("kill {kill}: node {leader} killed; publishes acknowledged again after {failover:?}, node {new_leader} leads");
        assert_ne!(new_leader, leader);
        std::thread::sleep(Duration::from_millis(random.between(200, 1500)));
        cluster.node_mut(leader).restart();
        *load.routers.write().unwrap() = running_routers(&cluster);
    }
    std::thread::sleep(Duration::from_millis(500));
    let checker = load.checker.clone();
    let outcomes = load.finish(DRAIN_TIMEOUT);
    outcomes.report(&format!("replication: {kills} leaders killed"));
    outcomes.assert_safe(&checker, || cluster.logs());
    replicas_are_shown_and_catch_up(&cluster, "replicated");
}

/// Once publishing stops, every node's cluster status places `topic` on all three nodes, and
/// its leader's stats show both followers holding everything it holds.
fn replicas_are_shown_and_catch_up(cluster: &Cluster, topic: &str) {
    for id in cluster.ids() {
        let status = block_on(cluster.node(id).client().cluster_status()).unwrap();
        let placement = status.topics.iter().find(|placement| placement.name.ends_with(topic));
        let placement =
            placement.unwrap_or_else(|| panic!("node {id}'s cluster status lacks {topic}: {status:?}"));
        let mut nodes = placement.replica_nodes.clone();
        nodes.sort_unstable();
        assert_eq!(nodes, [1, 2, 3], "{placement:?}");
        assert!(nodes.contains(&placement.leader_node), "{placement:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leader = leader_of(cluster, topic);
        let stats = block_on(cluster.node(leader).client().stats()).unwrap();
        let replica = stats
            .topics
            .iter()
            .find(|stats| stats.name.ends_with(topic) && stats.replication.as_ref().is_some_and(|r| r.leader))
            .and_then(|stats| stats.replication.clone());
        let caught_up = replica.as_ref().is_some_and(|replica| {
            replica.followers.len() == 2
                && replica.committed_end == replica.durable_end
                && replica
                    .followers
                    .iter()
                    .all(|follower| follower.lag_messages == 0 && follower.journal_lag_entries == 0)
        });
        if caught_up {
            // The CLI's cluster status shows the same, gathered from every node, on any node.
            for id in cluster.ids() {
                let output = cluster.node(id).cli(&["cluster", "status"]);
                let text = ringpost_tests::succeeded(&output);
                let line = text
                    .lines()
                    .find(|line| line.contains("\"topic\"") && line.contains(topic))
                    .unwrap_or_else(|| panic!("node {id}'s cluster status lacks {topic}: {text}"));
                assert_eq!(ringpost_tests::json_field(line, "lag_messages_max"), "0", "{line}");
                let committed = replica.as_ref().map(|replica| replica.committed_end.to_string());
                assert_eq!(
                    Some(ringpost_tests::json_field(line, "committed_end").to_owned()),
                    committed,
                    "{line}"
                );
            }
            return;
        }
        assert!(Instant::now() < deadline, "the followers did not catch up: {replica:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The address of node `id`'s first forwarder (the router's port plus one, as `Cluster` gives).
fn forwarder_of(cluster: &Cluster, id: u64) -> String {
    let router = &cluster.node(id).address;
    let (host, port) = router.rsplit_once(':').unwrap();
    format!("{host}:{}", port.parse::<u16>().unwrap() + 1)
}

/// Publishes `messages` with payloads `{prefix}{i}`, each acknowledged (retried through a
/// failover by the client).
fn publish_numbered(client: &Client, topic: &str, prefix: &str, messages: usize) -> HashSet<String> {
    let payloads: Vec<String> = (0..messages).map(|i| format!("{prefix}{i}")).collect();
    for chunk in payloads.chunks(10) {
        let batch = chunk.iter().map(|payload| Message::new(payload.as_str())).collect();
        block_on(client.publish(topic, batch)).unwrap();
    }
    payloads.into_iter().collect()
}

/// A streaming pull held open on one forwarder's port, read by a thread of its own: every
/// batch goes to `batches`, and the end or failure of the stream to the same channel.
fn open_raw_stream(
    address: &str,
    subscription: &str,
) -> (
    std::sync::Arc<ringpost_client::Connection>,
    std::sync::mpsc::Receiver<Result<Vec<ringpost_client::ReceivedMessage>, String>>,
) {
    use ringpost_wire::messages::{PullResponse, StreamingPullRequest};
    let connection = ringpost_client::Connection::connect(address).unwrap();
    let request = StreamingPullRequest {
        subscription: subscription.to_owned(),
        stream_ack_deadline_seconds: 10,
        max_outstanding_messages: 1000,
        max_outstanding_bytes: 0,
    };
    let mut receiver =
        connection.open_stream(ringpost_wire::Command::StreamingPull.code(), &request).unwrap();
    let (batches, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        let next = match block_on(receiver.next()) {
            None => Err("the stream ended".to_owned()),
            Some(Err(error)) => Err(format!("the stream failed: {error}")),
            Some(Ok(response)) => ringpost_wire::frame::decode_body::<PullResponse>(&response.body)
                .map(|batch| batch.received_messages)
                .map_err(|status| format!("a batch did not decode: {status:?}")),
        };
        let ended = next.is_err();
        if batches.send(next).is_err() || ended {
            return;
        }
    });
    (connection, received)
}

/// `ack_ids` acknowledged (or, with `seconds`, their deadlines changed) on `connection`'s
/// forwarder; none refused.
fn settle(
    connection: &ringpost_client::Connection,
    subscription: &str,
    ack_ids: Vec<String>,
    seconds: Option<u32>,
) {
    use ringpost_wire::messages::{AckResponse, AcknowledgeRequest, ModifyAckDeadlineRequest};
    let subscription = subscription.to_owned();
    let response =
        match seconds {
            None => block_on(connection.call(
                ringpost_wire::Command::Acknowledge.code(),
                &AcknowledgeRequest { subscription, ack_ids },
            )),
            Some(ack_deadline_seconds) => block_on(connection.call(
                ringpost_wire::Command::ModifyAckDeadline.code(),
                &ModifyAckDeadlineRequest { subscription, ack_ids, ack_deadline_seconds },
            )),
        }
        .unwrap();
    let answer = ringpost_wire::frame::decode_body::<AckResponse>(&response.body).unwrap();
    assert!(answer.invalid_ack_ids.is_empty(), "refused: {:?}", answer.invalid_ack_ids);
}

/// A subscriber served by a forwarder of a node that does not lead its topic: its stream,
/// acknowledgements and deadline changes are carried to the leader's forwarder; when the
/// leader's node is SIGKILLed, the same stream carries on from the new leader (the subscriber
/// sees a pause, not an error), and nothing acknowledged is delivered again. A second
/// subscriber, whose client knows only the killed node's router, carries on through another
/// node's forwarder, passing over the dead one in the route it had, with no lookup.
#[test]
fn a_subscriber_served_by_another_nodes_forwarder_follows_its_source_across_the_leaders_death() {
    const MESSAGES: usize = 60;
    let mut cluster = Cluster::start("relay", 3, Vec::new());
    let admin = cluster.node(1).client();
    block_on(admin.create_topic("carried")).unwrap();
    create_subscription(&admin, "carried-relayed", "carried", 10);
    create_subscription(&admin, "carried-routerless", "carried", 10);
    let leader = leader_of(&cluster, "carried");
    let relay = cluster.ids().find(|id| *id != leader).unwrap();
    let publisher = cluster.node(relay).client();

    // The relayed subscriber, on the other node's forwarder.
    let (relayed, batches) = open_raw_stream(&forwarder_of(&cluster, relay), "carried-relayed");
    let accepted = batches.recv_timeout(Duration::from_secs(10)).expect("the stream was not taken").unwrap();
    assert!(accepted.is_empty(), "the first batch only says the stream is taken");
    // The routerless subscriber: its client's router is the leader's node.
    let routerless = cluster.node(leader).client();
    let mut stream = block_on(routerless.streaming_pull("carried-routerless", Default::default())).unwrap();

    let receive =
        |batches: &std::sync::mpsc::Receiver<Result<Vec<ringpost_client::ReceivedMessage>, String>>,
         wanted: &HashSet<String>,
         what: &str|
         -> Vec<(String, String)> {
            let mut got = Vec::new();
            let mut seen = HashSet::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !wanted.iter().all(|payload| seen.contains(payload)) {
                let left = deadline.saturating_duration_since(Instant::now());
                let batch = batches
                    .recv_timeout(left)
                    .unwrap_or_else(|_| panic!("{what}: {} of {} delivered", seen.len(), wanted.len()))
                    .unwrap_or_else(|why| panic!("{what}: {why}"));
                for message in batch {
                    let payload = String::from_utf8(message.data).unwrap();
                    seen.insert(payload.clone());
                    got.push((payload, message.ack_id));
                }
            }
            got
        };

    let first = publish_numbered(&publisher, "carried", "a", MESSAGES);
    let delivered = receive(&batches, &first, "through the relay");
    // Half acknowledged, the other half given back at once: delivered again, then acknowledged.
    let (acked, nacked): (Vec<_>, Vec<_>) =
        delivered.into_iter().partition(|(payload, _)| payload[1..].parse::<usize>().unwrap() % 2 == 0);
    settle(&relayed, "carried-relayed", acked.iter().map(|(_, id)| id.clone()).collect(), None);
    settle(&relayed, "carried-relayed", nacked.iter().map(|(_, id)| id.clone()).collect(), Some(0));
    let given_back: HashSet<String> = nacked.iter().map(|(payload, _)| payload.clone()).collect();
    let again = receive(&batches, &given_back, "given back through the relay");
    settle(&relayed, "carried-relayed", again.iter().map(|(_, id)| id.clone()).collect(), None);

    let mut routerless_seen = HashSet::new();
    while !first.iter().all(|payload| routerless_seen.contains(payload)) {
        let batch = block_on(stream.next()).unwrap().unwrap();
        let ack_ids = batch.iter().map(|message| message.ack_id.clone()).collect();
        routerless_seen.extend(batch.into_iter().map(|message| String::from_utf8(message.data).unwrap()));
        let refused = block_on(routerless.acknowledge("carried-routerless", ack_ids)).unwrap();
        assert!(refused.is_empty());
    }

    // The leader's node dies; both subscribers carry on from the new leader.
    cluster.node_mut(leader).kill();
    let second = publish_numbered(&publisher, "carried", "b", MESSAGES);
    let delivered = receive(&batches, &second, "through the relay after the leader's death");
    for (payload, _) in &delivered {
        assert!(payload.starts_with('b'), "{payload} was acknowledged, then delivered again");
    }
    settle(&relayed, "carried-relayed", delivered.iter().map(|(_, id)| id.clone()).collect(), None);

    // The routerless subscriber's stream broke with its forwarder; it opens another from the
    // route it had, its router dead, and acknowledges through the same forwarder.
    assert!(
        matches!(block_on(stream.next()), Some(Err(_)) | None),
        "a stream from the killed node's forwarder should have failed"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match block_on(routerless.streaming_pull("carried-routerless", Default::default())) {
            Ok(stream) => break stream,
            Err(error) => {
                assert!(Instant::now() < deadline, "no stream opened without the router: {error}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    let mut routerless_seen = HashSet::new();
    while !second.iter().all(|payload| routerless_seen.contains(payload)) {
        let batch = block_on(stream.next()).unwrap().unwrap();
        let ack_ids = batch.iter().map(|message| message.ack_id.clone()).collect();
        for message in batch {
            let payload = String::from_utf8(message.data).unwrap();
            assert!(payload.starts_with('b'), "{payload} was acknowledged, then delivered again");
            routerless_seen.insert(payload);
        }
        let refused = block_on(routerless.acknowledge("carried-routerless", ack_ids)).unwrap();
        assert!(refused.is_empty());
    }
    cluster.node_mut(leader).restart();
}

/// T10 on real nodes (the shape of Kafka's KIP-966 and NATS's stale-majority reports): a
/// follower A is paused (SIGSTOP) while the leader B and the other follower C take publishes
/// for `RINGPOST_T10_SECONDS` (default 8); B is SIGKILLed; A resumes, missing all of it, and B
/// restarts, counting nothing as committed; then C is SIGKILLed, so that A and B must form the
/// majority. The leader they elect must hold everything acknowledged (B does, A catches up
/// before it counts), publishes go on through the two, and once C is back every replica
/// holds the leader's log. On real disks the crash is SIGKILL: writes are O_DSYNC, so nothing
/// acknowledged was unsynced; crashes that drop unsynced writes run in the simulation
/// (`daemon/src/replication_sim_tests.rs`).
#[test]
fn a_stale_follower_and_a_restarted_leader_form_a_majority_that_loses_nothing_acknowledged() {
    use nix::sys::signal::Signal;
    let seconds: u64 = std::env::var("RINGPOST_T10_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let mut cluster = Cluster::start("stale-majority", 3, Vec::new());
    {
        let client = cluster.node(1).client();
        block_on(client.create_topic("stale")).unwrap();
        create_subscription(&client, "stale-sub", "stale", 10);
    }
    let load = Load::start("stale", "stale-sub", running_routers(&cluster), 2, 1);
    load.wait_for_publishes("the publishers start", Duration::from_secs(30));
    let b = leader_of(&cluster, "stale");
    let mut followers = cluster.ids().filter(|id| *id != b);
    let (a, c) = (followers.next().unwrap(), followers.next().unwrap());
    let routers_of = |cluster: &Cluster, ids: &[u64]| -> Vec<String> {
        ids.iter().map(|id| cluster.node(*id).address.clone()).collect()
    };

    cluster.node(a).signal(Signal::SIGSTOP);
    *load.routers.write().unwrap() = routers_of(&cluster, &[b, c]);
    let before = load.acknowledged_publishes();
    std::thread::sleep(Duration::from_secs(seconds));
    let while_paused = load.acknowledged_publishes() - before;
    assert!(while_paused > 0, "nothing was acknowledged while node {a} was paused");

    cluster.node_mut(b).kill();
    cluster.node(a).signal(Signal::SIGCONT);
    cluster.node_mut(b).restart();
    cluster.node_mut(c).kill();
    *load.routers.write().unwrap() = routers_of(&cluster, &[a, b]);
    let failover =
        load.wait_for_publishes("publishing through the stale node and the restarted one", FAILOVER_MAX * 3);
    let majority_leader = leader_of(&cluster, "stale");
    eprintln!(
        "T10: node {a} paused while {b} (leader) and {c} acknowledged {while_paused} publishes; {b} killed, {a} \
         resumed, {b} restarted, {c} killed: publishes acknowledged again after {failover:?}, node {majority_leader} leads"
    );
    load.wait_for_publishes("publishing through the two", Duration::from_secs(30));

    cluster.node_mut(c).restart();
    *load.routers.write().unwrap() = running_routers(&cluster);
    load.wait_for_publishes("publishing once all are back", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let checker = load.checker.clone();
    let outcomes = load.finish(DRAIN_TIMEOUT);
    outcomes.report("T10");
    outcomes.assert_safe(&checker, || cluster.logs());
    replicas_are_shown_and_catch_up(&cluster, "stale");
}
