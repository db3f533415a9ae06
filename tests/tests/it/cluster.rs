//! Three `ringpostd` nodes on this machine as one cluster (`ringpost_tests::cluster`): one
//! catalog leader, one catalog on every node, topics spread over the nodes and reached through
//! any router; the catalog leader killed and restarted under running publishers and a streaming
//! subscriber, none of them interrupted; a quorum lost and regained.

use ringpost_client::{block_on, Client, ErrorCode, Message};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::json_field as field;
use ringpost_tests::{create_subscription, drain, failed, payload, succeeded};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The failover the cluster promises: from the catalog leader's death to another leader.
const FAILOVER_MAX: Duration = Duration::from_secs(10);
/// How long a node that did not take a change may take to apply it.
const APPLY_WITHIN: Duration = Duration::from_secs(5);

/// Every topic each running node's forwarders serve, by topic: each node's `stats` lists only
/// its own, and marks the replicas that follow another (they serve no client). Asserts that
/// no topic is served by two nodes.
fn owners(cluster: &Cluster) -> HashMap<String, u64> {
    let mut owners = HashMap::new();
    for id in cluster.ids().filter(|id| cluster.is_running(*id)) {
        let stats = block_on(cluster.node(id).client().stats()).unwrap();
        let served =
            stats.topics.into_iter().filter(|topic| topic.replication.as_ref().is_none_or(|r| r.leader));
        for topic in served {
            if let Some(other) = owners.insert(topic.name.clone(), id) {
                panic!("topic {} is served by node {other} and node {id}", topic.name);
            }
        }
    }
    owners
}

/// Topics `prefix-0`.. with a subscription `<topic>-sub` each, created through the running
/// nodes in turn.
fn create_topics(cluster: &Cluster, prefix: &str, count: usize) -> Vec<String> {
    let clients: Vec<Client> =
        cluster.ids().filter(|id| cluster.is_running(*id)).map(|id| cluster.node(id).client()).collect();
    (0..count)
        .map(|index| {
            let topic = format!("{prefix}-{index}");
            block_on(clients[index % clients.len()].create_topic(&topic)).unwrap();
            create_subscription(&clients[(index + 1) % clients.len()], &format!("{topic}-sub"), &topic, 60);
            topic
        })
        .collect()
}

/// Publishes `count` messages to `topic` in batches of five; each acknowledged id with its
/// payload.
fn publish(client: &Client, topic: &str, first_sequence: u64, count: u64) -> HashMap<u64, Vec<u8>> {
    let mut published = HashMap::new();
    let sequences: Vec<u64> = (first_sequence..first_sequence + count).collect();
    for batch in sequences.chunks(5) {
        let data: Vec<Vec<u8>> = batch.iter().map(|sequence| payload(*sequence, 64)).collect();
        let ids = block_on(client.publish(topic, data.iter().cloned().map(Message::new).collect())).unwrap();
        assert_eq!(ids.len(), batch.len());
        for (id, data) in ids.into_iter().zip(data) {
            assert!(published.insert(id, data).is_none(), "id {id} given twice");
        }
    }
    published
}

/// Waits until `check` holds (at most `limit`), or fails saying `what`.
fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cli_lists_topic(cluster: &Cluster, id: u64, topic: &str) -> bool {
    let output = cluster.node(id).cli(&["topic", "list"]);
    succeeded(&output).lines().any(|line| field(line, "name") == topic)
}

#[test]
fn three_nodes_elect_one_leader_and_share_the_catalog() {
    let cluster = Cluster::start("cluster-share", 3, Vec::new());
    let leader = cluster.leader();

    // Every node names the same leader and term; each knows itself, and the leader knows all.
    let mut terms = HashSet::new();
    for id in cluster.ids() {
        let output = succeeded(&cluster.node(id).cli(&["cluster", "status", "--output", "json"]));
        let mut lines = output.lines();
        let header = lines.next().unwrap();
        assert_eq!(field(header, "answering_node"), id.to_string(), "{output}");
        assert_eq!(field(header, "catalog_leader"), leader.to_string(), "node {id}: {output}");
        terms.insert(field(header, "term").to_owned());
        let members: Vec<&str> = lines.collect();
        assert_eq!(members.len(), 3, "{output}");
        for (member, line) in cluster.ids().zip(&members) {
            assert_eq!(field(line, "node"), member.to_string(), "{output}");
            assert_eq!(field(line, "cluster_address"), cluster.cluster_addresses[member as usize - 1]);
            assert_eq!(field(line, "voter"), "true", "{output}");
            let role = field(line, "role");
            if member == leader {
                assert_eq!(role, "leader", "node {id}: {output}");
            } else if member == id || id == leader {
                assert_eq!(role, "follower", "node {id}: {output}");
            }
        }
    }
    assert_eq!(terms.len(), 1, "the nodes name different terms: {terms:?}");

    // A topic created through a follower: that follower and the leader answer with it as soon
    // as the create returns; the third node applies it shortly.
    let follower = cluster.ids().find(|id| *id != leader).unwrap();
    let third = cluster.ids().find(|id| *id != leader && *id != follower).unwrap();
    let created = succeeded(&cluster.node(follower).cli(&["topic", "create", "shared-topic"]));
    assert_eq!(field(&created, "name"), "shared-topic");
    for id in [follower, leader] {
        let got = succeeded(&cluster.node(id).cli(&["topic", "get", "shared-topic"]));
        assert_eq!(field(&got, "name"), "shared-topic", "node {id}");
        assert!(cli_lists_topic(&cluster, id, "shared-topic"), "node {id} does not list it");
    }
    eventually(APPLY_WITHIN, "the third node gets the topic", || {
        cluster.node(third).cli(&["topic", "get", "shared-topic"]).status.success()
    });
    assert!(cli_lists_topic(&cluster, third, "shared-topic"));

    // Topics spread over the nodes: each is served by exactly one, not all by the same, and
    // every router sends its publishes to that node's forwarder.
    let topics = create_topics(&cluster, "spread", 12);
    let owners = owners(&cluster);
    for topic in &topics {
        let owner = owners.get(topic).unwrap_or_else(|| panic!("no node serves {topic}: {owners:?}"));
        let router_port: u16 = cluster.node(*owner).address.rsplit(':').next().unwrap().parse().unwrap();
        let forwarder = format!("127.0.0.1:{}", router_port + 1);
        for id in cluster.ids() {
            let route = block_on(cluster.node(id).client().lookup_topic(topic)).unwrap();
            assert_eq!(route.first(), Some(&forwarder), "node {id}'s route to {topic} (on node {owner})");
        }
    }
    let serving: HashSet<u64> = topics.iter().map(|topic| owners[topic]).collect();
    eprintln!("12 topics on nodes {serving:?}: {owners:?}");
    assert!(serving.len() > 1, "every topic landed on node {serving:?}");

    // Published through one node's router, pulled through another's: every message, intact.
    std::thread::scope(|scope| {
        for (index, topic) in topics.iter().enumerate() {
            let (cluster, owners) = (&cluster, &owners);
            scope.spawn(move || {
                let through = (index % 3) as u64 + 1;
                let pulled_through = through % 3 + 1;
                let published = publish(&cluster.node(through).client(), topic, index as u64 * 1000, 25);
                let delivered = drain(&cluster.node(pulled_through).client(), &format!("{topic}-sub"), true);
                assert_eq!(
                    delivered, published,
                    "{topic} (on node {}), published through node {through}, pulled through node {pulled_through}",
                    owners[topic]
                );
            });
        }
    });
}

/// One publisher's record: what was acknowledged, what failed, its slowest publish.
#[derive(Default)]
struct Record {
    acknowledged: HashMap<u64, Vec<u8>>,
    failures: Vec<String>,
    slowest: Duration,
}

#[test]
fn killing_the_catalog_leader_does_not_stop_established_publishers() {
    let mut cluster = Cluster::start("cluster-failover", 3, Vec::new());
    let leader = cluster.leader();
    let survivors: Vec<u64> = cluster.ids().filter(|id| *id != leader).collect();

    // Twelve topics over three forwarders at a balance factor of 1.25: at most five on any, so
    // at least two on each node.
    let topics = create_topics(&cluster, "failover", 12);
    let owners = owners(&cluster);
    let on = |node: u64| -> Vec<String> {
        topics.iter().filter(|topic| owners.get(*topic) == Some(&node)).cloned().collect()
    };
    let mut published_topics = Vec::new();
    for survivor in &survivors {
        let theirs = on(*survivor);
        assert!(theirs.len() >= 2, "node {survivor} serves {theirs:?} of {owners:?}");
        published_topics.extend(theirs.into_iter().take(2));
    }
    let leaders_topic =
        on(leader).first().cloned().unwrap_or_else(|| panic!("node {leader} serves none of {owners:?}"));
    eprintln!("leader node {leader}; publishing to {published_topics:?} through nodes {survivors:?}");

    // Messages on the leader's own topic, to find after its restart.
    let admin = cluster.node(survivors[0]).client();
    let mut on_leaders_topic = publish(&admin, &leaders_topic, 1_000_000, 10);

    // A streaming subscriber of the first topic, through a node that stays, on a subscription
    // of its own made before anything is published to it: it must get every acknowledged
    // publish, its stream never failing, across the catalog leader's death and restart.
    let live_topic = published_topics[0].clone();
    let live_subscription = format!("{live_topic}-live");
    create_subscription(&admin, &live_subscription, &live_topic, 10);
    let live_received = Arc::new(Mutex::new(HashSet::<Vec<u8>>::new()));
    let live_failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let live_stop = Arc::new(AtomicBool::new(false));
    let live = {
        let client = cluster.node(survivors[0]).client();
        let (received, failures, stop) = (live_received.clone(), live_failures.clone(), live_stop.clone());
        let subscription = live_subscription.clone();
        std::thread::spawn(move || {
            let settings = ringpost_client::StreamSettings::default();
            let mut stream = match block_on(client.streaming_pull(&subscription, settings)) {
                Ok(stream) => stream,
                Err(error) => return failures.lock().unwrap().push(format!("opening: {error}")),
            };
            while !stop.load(Ordering::Relaxed) {
                let batch = match block_on(stream.next()) {
                    Some(Ok(batch)) => batch,
                    Some(Err(error)) => {
                        return failures.lock().unwrap().push(format!("the stream failed: {error}"))
                    }
                    None => return failures.lock().unwrap().push("the stream ended".to_owned()),
                };
                let ack_ids = batch.iter().map(|message| message.ack_id.clone()).collect();
                received.lock().unwrap().extend(batch.into_iter().map(|message| message.data));
                if let Err(error) = block_on(client.acknowledge(&subscription, ack_ids)) {
                    failures.lock().unwrap().push(format!("acknowledging: {error}"));
                }
            }
        })
    };

    // A publisher per topic, through the routers of the nodes that stay, publishing until told.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicU64::new(0));
    let mut publishers = Vec::new();
    for (index, topic) in published_topics.iter().enumerate() {
        let client = cluster.node(survivors[index % 2]).client();
        let (topic, stop, acknowledged) = (topic.clone(), stop.clone(), acknowledged.clone());
        let record = Arc::new(Mutex::new(Record::default()));
        let recording = record.clone();
        let thread = std::thread::spawn(move || {
            let mut sequence = (index as u64 + 1) << 32;
            while !stop.load(Ordering::Relaxed) {
                let count = 1 + sequence % 4;
                let data: Vec<Vec<u8>> = (sequence..sequence + count)
                    .map(|sequence| payload(sequence, 64 + sequence as usize % 200))
                    .collect();
                sequence += count;
                let started = Instant::now();
                let result =
                    block_on(client.publish(&topic, data.iter().cloned().map(Message::new).collect()));
                let took = started.elapsed();
                let mut record = recording.lock().unwrap();
                record.slowest = record.slowest.max(took);
                match result {
                    Ok(ids) if ids.len() == data.len() => {
                        for (id, data) in ids.into_iter().zip(data) {
                            assert!(
                                record.acknowledged.insert(id, data).is_none(),
                                "{topic}: id {id} given twice"
                            );
                        }
                        acknowledged.fetch_add(count, Ordering::Relaxed);
                    }
                    Ok(ids) => record.failures.push(format!("{} ids for {count} messages", ids.len())),
                    Err(error) => record.failures.push(format!("after {took:?}: {error}")),
                }
            }
        });
        publishers.push((published_topics[index].clone(), record, thread));
    }
    let publishing = |what: &str| {
        let before = acknowledged.load(Ordering::Relaxed);
        eventually(Duration::from_secs(10), what, || acknowledged.load(Ordering::Relaxed) >= before + 100);
    };
    publishing("the publishers start");

    // SIGKILL the catalog's leader; another takes over while the publishers go on.
    cluster.node_mut(leader).kill();
    let killed = Instant::now();
    let acknowledged_at_kill = acknowledged.load(Ordering::Relaxed);
    let new_leader = cluster.leader();
    let failover = killed.elapsed();
    let during = acknowledged.load(Ordering::Relaxed) - acknowledged_at_kill;
    eprintln!("node {new_leader} leads {failover:?} after node {leader} was killed; {during} messages acknowledged meanwhile");
    assert_ne!(new_leader, leader);
    assert!(failover < FAILOVER_MAX, "the catalog took {failover:?} to elect another leader");
    assert!(during > 0, "no publish was acknowledged during the election");

    // The catalog takes changes again, through either node that stayed.
    let other = survivors.iter().copied().find(|id| *id != new_leader).unwrap();
    succeeded(&cluster.node(other).cli(&["topic", "create", "created-while-down"]));
    succeeded(&cluster.node(new_leader).cli(&["topic", "get", "created-while-down"]));
    publishing("the publishers go on after the election");

    // The killed node comes back: ready, caught up, serving its topics again.
    let restarted = Instant::now();
    cluster.node_mut(leader).restart();
    eprintln!("node {leader} serves again {:?} after its restart", restarted.elapsed());
    let got = succeeded(&cluster.node(leader).cli(&["topic", "get", "created-while-down"]));
    assert_eq!(field(&got, "name"), "created-while-down");
    let back = cluster.node(leader).client();
    on_leaders_topic.extend(publish(&back, &leaders_topic, 2_000_000, 10));
    let delivered = drain(&back, &format!("{leaders_topic}-sub"), true);
    assert_eq!(delivered, on_leaders_topic, "{leaders_topic} on node {leader}, before its death and after");
    publishing("the publishers go on after the restart");

    stop.store(true, Ordering::Relaxed);
    let reader = cluster.node(survivors[1]).client();
    for (topic, record, thread) in publishers {
        thread.join().expect("a publisher panicked");
        let record = record.lock().unwrap();
        eprintln!(
            "{topic} (node {}): {} messages acknowledged, slowest publish {:?}",
            owners[&topic],
            record.acknowledged.len(),
            record.slowest
        );
        assert!(record.failures.is_empty(), "{topic}: publishes failed: {:?}", record.failures);
        if *topic == live_topic {
            // The streaming subscriber catches up with everything acknowledged.
            eventually(Duration::from_secs(30), "the streaming subscriber gets every publish", || {
                let received = live_received.lock().unwrap();
                record.acknowledged.values().all(|data| received.contains(data))
            });
            // It stops at its next batch, or with the cluster (what it says then is not read).
            live_stop.store(true, Ordering::Relaxed);
            assert!(!live.is_finished(), "the streaming subscriber stopped early");
            let failures = live_failures.lock().unwrap();
            assert!(failures.is_empty(), "the streaming subscriber failed: {failures:?}");
            eprintln!(
                "{topic}: a streaming subscriber got all {} through the catalog leader's death",
                record.acknowledged.len()
            );
        }
        let delivered = drain(&reader, &format!("{topic}-sub"), true);
        assert_eq!(delivered.len(), record.acknowledged.len(), "{topic}: delivered and acknowledged counts");
        assert_eq!(
            delivered, record.acknowledged,
            "{topic}: the delivered messages are not the acknowledged ones"
        );
    }
}

#[test]
fn a_cluster_without_a_quorum_refuses_changes_and_recovers() {
    let mut cluster = Cluster::start("cluster-quorum", 3, Vec::new());
    let leader = cluster.leader();
    succeeded(&cluster.node(leader).cli(&["topic", "create", "before-the-loss"]));
    // The survivor is a follower; the leader and the other follower go.
    let survivor = cluster.ids().find(|id| *id != leader).unwrap();
    let killed: Vec<u64> = cluster.ids().filter(|id| *id != survivor).collect();
    for id in &killed {
        cluster.node_mut(*id).kill();
    }

    // A create through the survivor is refused, well within its timeout, as unavailable.
    let started = Instant::now();
    let output = cluster.node(survivor).cli(&["--timeout", "5", "topic", "create", "without-a-quorum"]);
    let took = started.elapsed();
    let error = failed(&output);
    eprintln!("without a quorum, after {took:?}: {}", error.trim());
    assert_eq!(output.status.code(), Some(1), "the server itself should refuse: {error}");
    assert!(error.starts_with("Unavailable"), "{error}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The Rust client sees the same.
    let client = cluster.node(survivor).client();
    let refused = block_on(client.create_topic("without-a-quorum-2")).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Unavailable, "{refused}");
    // Reads go on from the catalog the survivor applied; nothing was created.
    assert!(cli_lists_topic(&cluster, survivor, "before-the-loss"));
    let missing = failed(&cluster.node(survivor).cli(&["topic", "get", "without-a-quorum"]));
    assert!(missing.starts_with("NotFound"), "{missing}");

    // Back to three: the create succeeds, the refused ones never appear.
    for id in &killed {
        let restarted = Instant::now();
        cluster.node_mut(*id).restart();
        eprintln!("node {id} serves again {:?} after its restart", restarted.elapsed());
    }
    let leader = cluster.leader();
    eprintln!("node {leader} leads after the restarts");
    succeeded(&cluster.node(survivor).cli(&["topic", "create", "after-the-loss"]));
    for id in cluster.ids() {
        eventually(APPLY_WITHIN, "every node gets the new topic", || {
            cli_lists_topic(&cluster, id, "after-the-loss")
        });
        let listed = succeeded(&cluster.node(id).cli(&["topic", "list"]));
        let names: Vec<&str> = listed.lines().map(|line| field(line, "name")).collect();
        assert_eq!(names, ["after-the-loss", "before-the-loss"], "node {id}");
    }
}

/// The same loss from the leader's side: both followers go, and a create reaches the leader.
/// Within its lease it may already have logged the change, which Raft cannot take back: the
/// daemon then answers within its deadline that the outcome is unknown (`DeadlineExceeded`),
/// and once the followers return the change may be decided after all, and must then be whole.
/// After the lease, or whenever the leader has not heard from a majority lately, it refuses
/// at once (`Unavailable`). Either way it answers: before, the create waited for ever.
#[test]
fn a_catalog_leader_without_its_followers_answers_and_what_it_decides_later_is_whole() {
    let mut cluster = Cluster::start("cluster-lone-leader", 3, Vec::new());
    let leader = cluster.leader();
    let followers: Vec<u64> = cluster.ids().filter(|id| *id != leader).collect();
    for id in &followers {
        cluster.node_mut(*id).kill();
    }
    let started = Instant::now();
    let output = cluster.node(leader).cli(&["--timeout", "30", "topic", "create", "without-a-quorum"]);
    let took = started.elapsed();
    let answer =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    eprintln!("the leader alone, after {took:?}: exit {:?}: {}", output.status.code(), answer.trim());
    assert_eq!(output.status.code(), Some(1), "the leader alone did not refuse within 30 s: {answer}");
    assert!(
        answer.starts_with("Unavailable") || answer.starts_with("DeadlineExceeded"),
        "the leader alone answered {answer}"
    );
    // Later creates find the leader has heard from no majority, and are refused at once.
    let started = Instant::now();
    let output = cluster.node(leader).cli(&["--timeout", "30", "topic", "create", "without-a-quorum-again"]);
    let refused =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(refused.starts_with("Unavailable"), "a second create on the leader alone: {refused}");
    assert!(started.elapsed() < Duration::from_secs(5), "the refusal took {:?}", started.elapsed());

    for id in &followers {
        cluster.node_mut(*id).restart();
    }
    let leader = cluster.leader();
    succeeded(&cluster.node(leader).cli(&["topic", "create", "after-the-loss"]));
    assert!(!cli_lists_topic(&cluster, leader, "without-a-quorum-again"), "a refused create appeared");
    if cli_lists_topic(&cluster, leader, "without-a-quorum") {
        // Decided after all: it is a topic like any other, its files kept, served where it is.
        eprintln!("the undecided create was decided once the followers returned");
        let client = cluster.node(leader).client();
        create_subscription(&client, "without-a-quorum-sub", "without-a-quorum", 10);
        let published = publish(&client, "without-a-quorum", 0, 5);
        assert_eq!(drain(&client, "without-a-quorum-sub", true), published);
    }
}

/// A subscription's dead letters reach a dead-letter topic that another node leads: its
/// forwarder looks the topic up through its own router and publishes there.
#[test]
fn dead_letters_reach_a_topic_another_node_leads() {
    let cluster = Cluster::start("cluster-dead-letters", 3, Vec::new());
    let client = cluster.node(1).client();
    block_on(client.create_topic("letters")).unwrap();
    // Dead-letter topics until one is led by another node than the source's leader.
    let mut dead_letter_topic = None;
    for index in 0..12 {
        let topic = format!("letters-dead-{index}");
        block_on(client.create_topic(&topic)).unwrap();
        let owners = owners(&cluster);
        if owners.get(&topic).is_some_and(|node| Some(node) != owners.get("letters")) {
            dead_letter_topic = Some(topic);
            break;
        }
    }
    let dead_letter_topic = dead_letter_topic.expect("twelve topics all led by the source's node");
    create_subscription(&client, "letters-dead-sub", &dead_letter_topic, 60);
    succeeded(&cluster.node(2).cli(&[
        "sub",
        "create",
        "letters-sub",
        "--topic",
        "letters",
        "--dead-letter-topic",
        &dead_letter_topic,
        "--max-delivery-attempts",
        "5",
    ]));
    let sent: HashSet<Vec<u8>> = (0..3).map(|index| format!("letter-{index}").into_bytes()).collect();
    block_on(client.publish("letters", sent.iter().cloned().map(Message::new).collect())).unwrap();

    // Refused five times each, then they go to the dead-letter topic on the other node.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut dead = HashSet::new();
    while dead != sent {
        assert!(Instant::now() < deadline, "dead letters received: {dead:?}\n{}", cluster.logs());
        let refused = block_on(client.pull("letters-sub", 10, 200)).unwrap();
        if !refused.is_empty() {
            let ack_ids = refused.into_iter().map(|message| message.ack_id).collect();
            block_on(client.nack("letters-sub", ack_ids)).unwrap();
        }
        for message in block_on(client.pull("letters-dead-sub", 10, 200)).unwrap() {
            let source = message
                .attributes
                .iter()
                .find(|attribute| attribute.key == "CloudPubSubDeadLetterSourceSubscription");
            assert!(source.is_some_and(|source| source.value.ends_with("letters-sub")), "{message:?}");
            dead.insert(message.data);
        }
    }
}

/// Every running node's view of the catalog's members: (node, voter) by the node answering.
fn members_seen(cluster: &Cluster) -> HashMap<u64, Vec<(u64, bool)>> {
    cluster
        .ids()
        .filter(|id| cluster.is_running(*id))
        .map(|id| {
            let members = cluster
                .status(id)
                .map(|status| status.nodes.iter().map(|node| (node.node_id, node.voter)).collect::<Vec<_>>());
            (id, members.unwrap_or_default())
        })
        .collect()
}

/// Waits until every running node lists exactly `expected` as the catalog's members.
fn wait_for_members(cluster: &Cluster, expected: &[(u64, bool)]) {
    let deadline = Instant::now() + APPLY_WITHIN * 2;
    loop {
        let seen = members_seen(cluster);
        if seen.values().all(|members| members == expected) {
            return;
        }
        assert!(Instant::now() < deadline, "the nodes list other members than {expected:?}: {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A node joins a running cluster with one command, as a learner that takes topics, then as
/// a voter; it restarts like any member; it cannot leave while it holds topics, and leaves
/// with one command once it holds none. The catalog's leader can be removed too: it hands the
/// lead over first, and the cluster carries on with the voters left.
#[test]
fn a_node_joins_takes_topics_and_leaves_and_the_leader_can_be_removed() {
    let mut cluster = Cluster::start("cluster-members", 3, Vec::new());
    // (Before the new node runs: `leader` asks every running node.)
    let leader = cluster.leader();
    let joining = cluster.launch_joining();
    assert_eq!(joining, 4);
    let address = cluster.cluster_addresses[3].clone();
    // It waits to be added: it does not serve on its own.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(cluster.node_mut(4).poll_ready(), Ok(false), "a joining node served before it was added");

    // Added through a node that does not lead the catalog: carried to the leader.
    let other = cluster.ids().find(|id| *id != leader && *id != 4).unwrap();
    let added = succeeded(&cluster.node(other).cli(&["cluster", "add-node", "4", &address]));
    assert_eq!(field(&added, "role"), "learner", "{added}");
    cluster.wait_ready(4);
    wait_for_members(&cluster, &[(1, true), (2, true), (3, true), (4, false)]);
    // Adding it again is done already; at another address, refused.
    succeeded(&cluster.node(leader).cli(&["cluster", "add-node", "4", &address]));
    let moved = failed(&cluster.node(leader).cli(&["cluster", "add-node", "4", "127.0.0.1:1"]));
    assert!(moved.contains("AlreadyExists"), "{moved}");

    // Its forwarder takes topics like any other, and serves them through every router.
    let topics = create_topics(&cluster, "joined", 12);
    let leaders = owners(&cluster);
    let on_new: Vec<&String> = topics.iter().filter(|topic| leaders.get(*topic) == Some(&4)).collect();
    eprintln!("12 topics, led by: {leaders:?}");
    assert!(!on_new.is_empty(), "no topic is led by the new node: {leaders:?}");
    for (index, topic) in on_new.iter().enumerate() {
        let published = publish(&cluster.node(1).client(), topic, index as u64 * 1000, 20);
        let delivered = drain(&cluster.node(4).client(), &format!("{topic}-sub"), true);
        assert_eq!(delivered, published, "{topic}, led by the new node");
    }

    // Promoted to voter; it restarts as any member does.
    let promoted = succeeded(&cluster.node(4).cli(&["cluster", "add-node", "4", &address, "--voter"]));
    assert_eq!(field(&promoted, "role"), "voter", "{promoted}");
    wait_for_members(&cluster, &[(1, true), (2, true), (3, true), (4, true)]);
    cluster.node_mut(4).kill();
    cluster.node_mut(4).launch();
    cluster.wait_ready(4);
    // A founder restarted knows the new node only from the catalog (its --cluster lists three):
    // with it as the leader, the new node still hears of every change.
    let leader = cluster.leader();
    if leader != 4 {
        cluster.node_mut(leader).kill();
        cluster.node_mut(leader).launch();
        cluster.wait_ready(leader);
    }
    succeeded(&cluster.node(1).cli(&["topic", "create", "after-restart"]));
    eventually(APPLY_WITHIN, "the new node applies a topic created after the restarts", || {
        cluster.node(4).cli(&["topic", "get", "after-restart"]).status.success()
    });

    // A topic of one replica on it cannot move: the removal names it at once, before moving
    // anything, and it holds the removal back until deleted.
    let mut singles = Vec::new();
    let single = (0..40)
        .map(|index| format!("single-{index}"))
        .find(|name| {
            let topic = ringpost_client::Topic { name: name.clone(), ..Default::default() };
            block_on(cluster.node(1).client().create_topic_replicated(topic, 1)).unwrap();
            singles.push(name.clone());
            owners(&cluster).get(name) == Some(&4)
        })
        .expect("no topic of one replica landed on the new node in 40");
    let on_four = |cluster: &Cluster| {
        let placed = cluster.status(1).unwrap();
        placed.topics.iter().filter(|topic| topic.replica_nodes.contains(&4)).count()
    };
    let before = on_four(&cluster);
    let refused = failed(&cluster.node(2).cli(&["cluster", "remove-node", "4"]));
    assert!(refused.contains("FailedPrecondition") && refused.contains(&single), "{refused}");
    assert_eq!(on_four(&cluster), before, "the refused removal moved replicas");
    succeeded(&cluster.node(1).cli(&["topic", "delete", &single]));

    // It leaves with its replicas moved to the other nodes, under publishers, losing nothing.
    let published = Arc::new(Mutex::new(HashMap::<String, HashMap<u64, Vec<u8>>>::new()));
    for (index, topic) in topics.iter().enumerate() {
        let sent = publish(&cluster.node(1).client(), topic, 100_000 + index as u64 * 1000, 20);
        published.lock().unwrap().entry(topic.clone()).or_default().extend(sent);
    }
    std::thread::scope(|scope| {
        let running = Arc::new(AtomicBool::new(true));
        for (index, topic) in topics.iter().enumerate().take(4) {
            let (running, published, client) = (running.clone(), published.clone(), cluster.node(2).client());
            scope.spawn(move || {
                let mut sequence = 200_000 + index as u64 * 10_000;
                while running.load(Ordering::Relaxed) {
                    let data = payload(sequence, 64);
                    // A publish may fail while the topic's leader changes; only acknowledged
                    // ones are counted.
                    if let Ok(ids) = block_on(client.publish(topic, vec![Message::new(data.clone())])) {
                        published.lock().unwrap().entry(topic.clone()).or_default().insert(ids[0], data);
                    }
                    sequence += 1;
                }
            });
        }
        let during = published.lock().unwrap().values().map(HashMap::len).sum::<usize>();
        // The publishers stop before the answer is checked: a scope joins its threads before
        // it passes a panic on, so a failed removal would otherwise wait on them for good.
        let removal = cluster.node(2).cli(&["cluster", "remove-node", "4"]);
        running.store(false, Ordering::Relaxed);
        succeeded(&removal);
        let after = published.lock().unwrap().values().map(HashMap::len).sum::<usize>();
        eprintln!("{} publishes acknowledged while node 4's replicas moved", after - during);
    });
    let placed = cluster.status(1).unwrap();
    for topic in placed.topics.iter().filter(|topic| !singles.contains(&topic.name)) {
        assert_eq!(topic.replica_nodes.len(), 3, "{topic:?}");
        assert!(!topic.replica_nodes.contains(&4), "{topic:?} still has a replica on the node leaving");
    }
    cluster.node_mut(4).kill();
    wait_for_members(&cluster, &[(1, true), (2, true), (3, true)]);
    let unknown = failed(&cluster.node(2).cli(&["cluster", "remove-node", "4"]));
    assert!(unknown.contains("NotFound"), "{unknown}");
    for topic in &topics {
        let delivered = drain(&cluster.node(3).client(), &format!("{topic}-sub"), true);
        let published = published.lock().unwrap().remove(topic).unwrap_or_default();
        let lost: Vec<&u64> = published.keys().filter(|id| !delivered.contains_key(id)).collect();
        assert!(lost.is_empty(), "{topic}: {} acknowledged publishes lost: {lost:?}", lost.len());
    }
    // New topics go to the nodes left.
    let after = create_topics(&cluster, "after-removal", 6);
    let leaders = owners(&cluster);
    assert!(after.iter().all(|topic| matches!(leaders.get(topic), Some(1..=3))), "{leaders:?}");
    for topic in singles.iter().filter(|name| **name != single) {
        succeeded(&cluster.node(1).cli(&["topic", "delete", topic]));
    }
    // Three nodes left, each with a replica of every topic: one more removal has nowhere to
    // move them, says so, and changes nothing.
    let stuck = failed(&cluster.node(1).cli(&["cluster", "remove-node", "3"]));
    assert!(stuck.contains("FailedPrecondition") && stuck.contains("no node other than"), "{stuck}");
    let placed = cluster.status(1).unwrap();
    assert!(placed.topics.iter().all(|topic| topic.replica_nodes.len() == 3), "{:?}", placed.topics);
    wait_for_members(&cluster, &[(1, true), (2, true), (3, true)]);
    for topic in after.iter().chain(&topics).chain([&"after-restart".to_owned()]) {
        succeeded(&cluster.node(1).cli(&["topic", "delete", topic]));
    }

    // The catalog's leader, asked through another node to remove itself, hands the lead over.
    let leader = cluster.leader();
    let asker = cluster.ids().find(|id| *id != leader && cluster.is_running(*id)).unwrap();
    succeeded(&cluster.node(asker).cli(&["cluster", "remove-node", &leader.to_string()]));
    cluster.node_mut(leader).kill();
    let left: Vec<(u64, bool)> = (1..=3).filter(|id| *id != leader).map(|id| (id, true)).collect();
    wait_for_members(&cluster, &left);
    let new_leader = cluster.leader();
    assert_ne!(new_leader, leader);
    let created = succeeded(&cluster.node(asker).cli(&["topic", "create", "two-voters"]));
    assert_eq!(field(&created, "name"), "two-voters");
}

/// A node that died for good is removed with one command: its replicas are rebuilt on the
/// nodes left, from the replicas that survive, and nothing acknowledged is lost.
#[test]
fn a_dead_nodes_replicas_move_to_the_nodes_left_when_it_is_removed() {
    let mut cluster = Cluster::start("cluster-dead-node", 3, Vec::new());
    cluster.leader();
    cluster.launch_joining();
    let address = cluster.cluster_addresses[3].clone();
    succeeded(&cluster.node(1).cli(&["cluster", "add-node", "4", &address, "--voter"]));
    cluster.wait_ready(4);
    let topics = create_topics(&cluster, "dead", 8);
    let mut published = HashMap::new();
    for (index, topic) in topics.iter().enumerate() {
        published.insert(topic.clone(), publish(&cluster.node(1).client(), topic, index as u64 * 1000, 30));
    }
    let before = cluster.status(1).unwrap();
    let on_dead = before.topics.iter().filter(|topic| topic.replica_nodes.contains(&4)).count();
    eprintln!("{on_dead} of {} topics have a replica on node 4", before.topics.len());
    assert!(on_dead > 0, "no replica on node 4: {:?}", before.topics);

    cluster.node_mut(4).kill();
    // Dead for a while, as a machine that failed is: the catalog's leader has elected other
    // leaders for what it led.
    eventually(Duration::from_secs(20), "the topics node 4 led get other leaders", || {
        cluster.status(1).is_ok_and(|status| status.topics.iter().all(|topic| topic.leader_node != 4))
    });
    let started = Instant::now();
    succeeded(&cluster.node(1).cli(&["cluster", "remove-node", "4"]));
    eprintln!("node 4 (dead, {on_dead} replicas) removed in {:?}", started.elapsed());
    wait_for_members(&cluster, &[(1, true), (2, true), (3, true)]);
    for topic in &cluster.status(2).unwrap().topics {
        assert_eq!(topic.replica_nodes.len(), 3, "{topic:?}");
        assert!(!topic.replica_nodes.contains(&4), "{topic:?}");
    }
    for topic in &topics {
        let delivered = drain(&cluster.node(2).client(), &format!("{topic}-sub"), true);
        assert_eq!(delivered, published[topic], "{topic}");
    }
    // Every replica holds the same messages: the new ones caught up.
    eventually(APPLY_WITHIN, "every replica holds its topic's messages", || {
        cluster.ids().filter(|id| cluster.is_running(*id)).all(|id| {
            let stats = block_on(cluster.node(id).client().stats()).unwrap();
            stats.topics.iter().filter(|topic| topics.contains(&topic.name)).all(|topic| {
                topic.replication.as_ref().is_some_and(|replica| replica.durable_end == replica.committed_end)
                    && topic.end_offset >= 30
            })
        })
    });
}
