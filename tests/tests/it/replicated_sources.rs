//! A topic of two sources of three replicas each, on three nodes of two forwarder shards (six
//! shards for six replicas, one source of the topic per shard): each source is published to at
//! its own leader's forwarder, as a client that knows the sources' routes would. Killing the
//! node that leads source 1 elects it a new leader among its own replicas, and draining the
//! node that leads it then moves its leadership; through both, every acknowledged message of
//! every source is delivered at its source's leader. Three sources of three replicas (nine)
//! are refused, naming the shards they need. A source whose shard is gone (its node started
//! with fewer) is placed again on a shard holding none of its topic's units.

use super::sources::{forwarders, leader_shards, payloads, source_of, Forwarder};
use ringpost_client::{block_on, Connection};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::{create_subscription, failed, json_field, succeeded, Daemon};
use ringpost_wire::frame::{decode_body, decode_error};
use ringpost_wire::messages::{PublishRequest, PublishResponse, PubsubMessage};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const TOPIC: &str = "spread";
const SUBSCRIPTION: &str = "spread-sub";
/// Messages published at each source in each round.
const PER_ROUND: usize = 10;
/// How long an election, a promotion or a drain may take on a loaded machine: generous, to tell
/// a stuck cluster from a slow one.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Each source's leader as (node, shard) in a topic's JSON, source 0 first.
fn source_leaders(json: &str) -> Vec<(u64, u64)> {
    let numbers = |key: &str| -> Vec<u64> {
        json.split(key)
            .skip(1)
            .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap())
            .collect()
    };
    numbers("\"leader_node\":").into_iter().zip(numbers("\"leader_shard\":")).collect()
}

/// The sources' leaders as node `asked` sees them.
fn leaders_seen_by(cluster: &Cluster, asked: u64) -> Vec<(u64, u64)> {
    source_leaders(&succeeded(&cluster.node(asked).cli(&["topic", "get", TOPIC])))
}

/// The address of forwarder shard `shard` of node `node` (its ports follow its router's).
fn forwarder_address(cluster: &Cluster, (node, shard): (u64, u64)) -> String {
    let router = &cluster.node(node).address;
    let (host, port) = router.rsplit_once(':').unwrap();
    format!("{host}:{}", port.parse::<u64>().unwrap() + 1 + shard)
}

/// Publishes `payloads` at `address`, retrying while its replica is not serving yet (a leader
/// being promoted, or one deposed that the routers still name), at most `SETTLE_LIMIT`; the
/// message ids.
fn publish(address: &str, payloads: &[String]) -> Vec<u64> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let messages = payloads
            .iter()
            .map(|data| PubsubMessage { data: data.clone().into_bytes(), ..PubsubMessage::default() })
            .collect();
        let request = PublishRequest { topic: TOPIC.to_owned(), messages };
        let answer = Connection::connect(address)
            .and_then(|connection| {
                block_on(connection.call(ringpost_wire::Command::Publish.code(), &request))
            })
            .map_err(|error| error.to_string())
            .and_then(|reply| {
                if reply.header.is_error() {
                    return Err(decode_error(&reply.body).to_string());
                }
                Ok(decode_body::<PublishResponse>(&reply.body).unwrap().message_ids)
            });
        match answer {
            Ok(ids) => return ids,
            Err(error) => {
                assert!(Instant::now() < deadline, "publishing at {address}: {error}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Publishes a round of messages at each source's leader (as node `asked` sees them), each id
/// naming its source; what each source was given.
fn publish_round(cluster: &Cluster, asked: u64, round: &str) -> Vec<Vec<String>> {
    let leaders = leaders_seen_by(cluster, asked);
    leaders
        .iter()
        .enumerate()
        .map(|(source, leader)| {
            let sent: Vec<String> = (0..PER_ROUND).map(|index| format!("{round}-{source}-{index}")).collect();
            let ids = publish(&forwarder_address(cluster, *leader), &sent);
            assert_eq!(ids.len(), PER_ROUND, "{round}: source {source}");
            assert!(
                ids.iter().all(|id| source_of(*id) == source as u64),
                "{round}: source {source}: {ids:x?}"
            );
            sent
        })
        .collect()
}

/// Pulls at each source's leader (as node `asked` sees them) until it delivered every one of
/// `wanted[source]`, and acknowledges what came.
fn delivered_at_leaders(cluster: &Cluster, asked: u64, wanted: &[Vec<String>]) {
    let leaders = leaders_seen_by(cluster, asked);
    for (source, leader) in leaders.iter().enumerate() {
        let forwarder = Forwarder::connect(&forwarder_address(cluster, *leader));
        let wanted: BTreeSet<String> = wanted[source].iter().cloned().collect();
        let mut received = BTreeSet::new();
        let deadline = Instant::now() + SETTLE_LIMIT;
        while !wanted.is_subset(&received) {
            assert!(Instant::now() < deadline, "source {source} at {leader:?} delivered only {received:?}");
            let batch = forwarder.pull(SUBSCRIPTION, wanted.len() - wanted.intersection(&received).count());
            assert!(batch.iter().all(|message| source_of(message.message_id) == source as u64));
            if !batch.is_empty() {
                forwarder.settle(
                    SUBSCRIPTION,
                    batch.iter().map(|message| message.ack_id.clone()).collect(),
                    None,
                );
            }
            received.extend(payloads(&batch));
        }
    }
}

/// Waits until every live node names leaders for every source and none on `gone`; the leaders.
fn led_off(cluster: &Cluster, asked: u64, gone: u64) -> Vec<(u64, u64)> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let leaders = leaders_seen_by(cluster, asked);
        if leaders.len() == 2 && leaders.iter().all(|(node, _)| *node != gone) {
            return leaders;
        }
        assert!(Instant::now() < deadline, "sources still led on node {gone}: {leaders:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_replicated_sources_leader_is_elected_again_and_drained_and_nothing_acknowledged_is_lost() {
    let mut cluster = Cluster::start("replsources", 3, vec!["--shards".into(), "2".into()]);
    let admin = cluster.leader();

    // Nine replicas for six shards: refused before anything is made.
    let refused = failed(&cluster.node(admin).cli(&[
        "topic",
        "create",
        "too-wide",
        "--sources",
        "3",
        "--replicas",
        "3",
    ]));
    assert!(refused.starts_with("FailedPrecondition"), "{refused}");
    assert!(refused.contains("need 9 forwarder shards") && refused.contains("has 6"), "{refused}");

    let created =
        succeeded(&cluster.node(admin).cli(&["topic", "create", TOPIC, "--sources", "2", "--replicas", "3"]));
    let leaders = source_leaders(&created);
    assert_eq!(leaders.len(), 2, "{created}");
    create_subscription(&cluster.node(admin).client(), SUBSCRIPTION, TOPIC, 30);
    let mut unpulled = publish_round(&cluster, admin, "first");

    // Source 1's leader's node killed: the source elects a leader among its other replicas, and
    // every acknowledged message of both sources is delivered at their leaders.
    let killed = leaders[1].0;
    cluster.node_mut(killed).kill();
    let asked = cluster.ids().find(|id| *id != killed).unwrap();
    let after_kill = led_off(&cluster, asked, killed);
    eprintln!("source leaders {leaders:?}; after node {killed} was killed {after_kill:?}");
    for (source, sent) in publish_round(&cluster, asked, "second").into_iter().enumerate() {
        unpulled[source].extend(sent);
    }
    delivered_at_leaders(&cluster, asked, &unpulled);
    cluster.node_mut(killed).restart();
    cluster.wait_ready(killed);

    // The node leading source 1 now is drained: its leaderships move, nothing is lost.
    let drained = leaders_seen_by(&cluster, asked)[1].0;
    let unpulled = publish_round(&cluster, asked, "third");
    let asked = cluster.ids().find(|id| *id != drained).unwrap();
    let answer =
        succeeded(&cluster.node(asked).cli(&["cluster", "drain", &drained.to_string(), "--wait", "60"]));
    assert_eq!(json_field(answer.trim(), "drained"), "true", "{answer}");
    let after_drain = led_off(&cluster, asked, drained);
    eprintln!("after node {drained} was drained {after_drain:?}");
    let mut wanted = unpulled;
    for (source, sent) in publish_round(&cluster, asked, "fourth").into_iter().enumerate() {
        wanted[source].extend(sent);
    }
    delivered_at_leaders(&cluster, asked, &wanted);
    succeeded(&cluster.node(asked).cli(&["cluster", "undrain", &drained.to_string()]));
}

/// A daemon started again with fewer shards than a topic's source 1 was placed on places it on a
/// shard holding none of the topic's units, with its messages and its subscription's state (its
/// files are this node's); with no such shard left, the start is refused, saying why.
#[test]
fn a_source_whose_shard_is_gone_is_placed_again_on_a_shard_free_of_its_topic() {
    let shards = |count: &str| vec!["--shards".to_owned(), count.to_owned()];
    let mut daemon = Daemon::start_with("sources-gone", Vec::new(), shards("4"));
    // A topic whose source 1 is on the last shard (placement is a function of the names).
    let (name, leaders) = (0..32)
        .find_map(|index| {
            let name = format!("gone-{index}");
            let leaders =
                leader_shards(&succeeded(&daemon.cli(&["topic", "create", &name, "--sources", "2"])));
            if leaders[1] == 3 {
                return Some((name, leaders));
            }
            succeeded(&daemon.cli(&["topic", "delete", &name]));
            None
        })
        .expect("no topic of 32 has its source 1 on shard 3");
    create_subscription(&daemon.client(), "gone-sub", &name, 30);
    let sent: Vec<String> = (0..3).map(|index| format!("kept-{index}")).collect();
    let ids = Forwarder::connect(&forwarders(&daemon)[3]).publish(&name, &sent);
    assert!(ids.iter().all(|id| source_of(*id) == 1), "{ids:x?}");

    daemon.kill();
    daemon.extra_args = shards("3");
    daemon.restart();
    let placed = leader_shards(&succeeded(&daemon.cli(&["topic", "get", &name])));
    assert_eq!(placed[0], leaders[0], "source 0's shard is still there");
    assert!(placed[1] < 3 && placed[1] != placed[0], "source 1 placed on {placed:?}");
    assert!(daemon.log().contains("its shard 3 is gone; placed on"), "{}", daemon.log());
    let forwarder = Forwarder::connect(&forwarders(&daemon)[placed[1] as usize]);
    let received = forwarder.pull("gone-sub", sent.len());
    assert_eq!(payloads(&received), sent, "source 1's messages at its new shard");
    assert!(received.iter().all(|message| source_of(message.message_id) == 1));
    forwarder.settle("gone-sub", received.iter().map(|message| message.ack_id.clone()).collect(), None);
    daemon.restart();
    assert_eq!(leader_shards(&succeeded(&daemon.cli(&["topic", "get", &name]))), placed, "kept");

    // One shard cannot hold two sources of the topic: the start is refused, saying why.
    daemon.kill();
    daemon.extra_args = shards("1");
    daemon.launch();
    let exited = daemon.wait_for_exit(Duration::from_secs(60)).expect("the daemon starts on one shard");
    assert!(!exited.success(), "{exited:?}");
    assert!(
        daemon.log().contains("every shard left holds another of its topic's sources"),
        "{}",
        daemon.log()
    );
}

/// Entries in node `id`'s data directories' `topics` folders: one per replica of a unit (a
/// topic's own log, or a source's) held there.
fn unit_folders(cluster: &Cluster, id: u64) -> usize {
    let node = cluster.node(id);
    node.data_dirs.iter().flat_map(|dir| super::sources::topic_folders(dir)).map(|(_, count)| count).sum()
}

/// Waits until every node of `nodes` holds `count` unit folders.
fn folders_become(cluster: &Cluster, nodes: &[u64], count: usize) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let held: Vec<usize> = nodes.iter().map(|id| unit_folders(cluster, *id)).collect();
        if held.iter().all(|held| *held == count) {
            return;
        }
        assert!(Instant::now() < deadline, "nodes {nodes:?} hold {held:?} unit folders, not {count} each");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until node `asked` shows the topic with `count` sources.
fn sources_become(cluster: &Cluster, asked: u64, count: usize) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let leaders = leaders_seen_by(cluster, asked);
        if leaders.len() == count {
            return;
        }
        assert!(Instant::now() < deadline, "the topic has sources led at {leaders:?}, not {count}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pulls at `address`, source `source`'s leader, until every one of `wanted` came, retrying
/// while its replica is not serving yet (a leader being promoted), at most `SETTLE_LIMIT`; the
/// ack ids, not acknowledged. A forwarder not serving the subscription yet carries the pull to
/// source 0's leader, whose messages are left to their deadline.
fn pulled(address: &str, source: u64, wanted: &[String]) -> Vec<String> {
    use ringpost_wire::messages::{PullRequest, PullResponse};
    let wanted: BTreeSet<String> = wanted.iter().cloned().collect();
    let (mut received, mut ack_ids) = (BTreeSet::new(), Vec::new());
    let deadline = Instant::now() + SETTLE_LIMIT;
    while !wanted.is_subset(&received) {
        assert!(Instant::now() < deadline, "{address} delivered only {received:?}");
        let request = PullRequest { subscription: SUBSCRIPTION.to_owned(), max_messages: 100, wait_ms: 500 };
        let answer = Connection::connect(address)
            .and_then(|connection| block_on(connection.call(ringpost_wire::Command::Pull.code(), &request)));
        match answer {
            Ok(reply) if !reply.header.is_error() => {
                let mut batch = decode_body::<PullResponse>(&reply.body).unwrap().received_messages;
                batch.retain(|message| source_of(message.message_id) == source);
                ack_ids.extend(batch.iter().map(|message| message.ack_id.clone()));
                received.extend(payloads(&batch));
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    ack_ids
}

/// Lowers a topic of two sources of three replicas to one and kills `killed_leader`'s choice of
/// node (the retiring source's leader's, or none), then checks the retirement through: the
/// retiring source's leader refuses publishes (`NotOwner`), its subscriber receives and
/// acknowledges everything both sources held, and source 1 is deleted, its folders gone from
/// every node (a node down meanwhile removes its own at its next start).
fn retire_replicated_source(label: &str, kill_retiring_leader: bool) {
    let mut cluster = Cluster::start(label, 3, vec!["--shards".into(), "2".into()]);
    let admin = cluster.leader();
    let created =
        succeeded(&cluster.node(admin).cli(&["topic", "create", TOPIC, "--sources", "2", "--replicas", "3"]));
    let leaders = source_leaders(&created);
    assert_eq!(leaders.len(), 2, "{created}");
    create_subscription(&cluster.node(admin).client(), SUBSCRIPTION, TOPIC, 30);
    let sent = publish_round(&cluster, admin, "first");
    let nodes: Vec<u64> = cluster.ids().collect();
    folders_become(&cluster, &nodes, 2);

    let lowered = succeeded(&cluster.node(admin).cli(&["topic", "update", TOPIC, "--sources", "1"]));
    assert_eq!(source_leaders(&lowered).len(), 2, "a retiring source is still listed: {lowered}");
    let (mut asked, mut live) = (admin, nodes.clone());
    let killed = leaders[1].0;
    if kill_retiring_leader {
        cluster.node_mut(killed).kill();
        live.retain(|id| *id != killed);
        asked = live[0];
        led_off(&cluster, asked, killed);
    }
    // Source 1's leader (the one elected after the kill, when killed) serves its subscriber and
    // refuses every publish, keyed or not.
    let leader = forwarder_address(&cluster, leaders_seen_by(&cluster, asked)[1]);
    let held = pulled(&leader, 1, &sent[1]);
    let retiring = Forwarder::connect(&leader);
    let key = super::source_keys::key_of(1, 2);
    for key in ["", key.as_str()] {
        assert_eq!(retiring.publish_keyed(TOPIC, key, "late"), Err(ringpost_client::ErrorCode::NotOwner));
    }
    // Not yet acknowledged: still there a few passes later.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(leaders_seen_by(&cluster, asked).len(), 2, "deleted before its messages were acknowledged");
    retiring.settle(SUBSCRIPTION, held, None);

    sources_become(&cluster, asked, 1);
    folders_become(&cluster, &live, 1);
    if kill_retiring_leader {
        cluster.node_mut(killed).restart();
        cluster.wait_ready(killed);
        folders_become(&cluster, &[killed], 1);
    }
    // Source 0 takes what source 1 took before, and delivers it with what it held: nothing
    // acknowledged was lost on it.
    let moved = publish_round(&cluster, asked, "second");
    assert_eq!(moved.len(), 1, "one source takes publishes");
    delivered_at_leaders(&cluster, asked, &[sent[0].iter().chain(&moved[0]).cloned().collect()]);
}

/// A replicated topic's source 1 retired (`topic update --sources 1`): delivered out, it is
/// deleted with every replica's folder, on every node.
#[test]
fn a_replicated_source_retires_and_every_replica_is_deleted() {
    retire_replicated_source("replretire", false);
}

/// The retiring source's leader's node killed: its new leader refuses publishes from the first,
/// the retirement completes on the nodes left, and the killed node removes its replica's folder
/// when it starts again.
#[test]
fn a_retiring_replicated_sources_new_leader_refuses_publishes_and_the_retirement_completes() {
    retire_replicated_source("replretire-kill", true);
}
