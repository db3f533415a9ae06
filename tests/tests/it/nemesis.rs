//! T9 (docs/TESTING.md): three real nodes, each in a network namespace of its own, a topic on
//! all three (R=3), four publishers and two acknowledging subscribers in a fourth namespace,
//! and a nemesis that every 5 s either breaks something or heals what it broke: a leader of
//! one of the topic's sources cut off from everyone, another node cut off, one node SIGKILLed,
//! two SIGKILLed, one SIGSTOPped for 10 s. Then everything is healed, the publishers stop and
//! the subscribers drain. The history checker must find nothing acknowledged lost and nothing
//! unexpected (it keys by payload; a message id names its source); nothing whose
//! acknowledgement was confirmed may be delivered again (by a pull sent after the
//! confirmation); nothing may be confirmed that was sent while two nodes were dead and answered
//! before either came back (no quorum was reachable); and each source's replicas must end
//! agreeing: the same durable end and epoch on all three, all of it committed, and no follower
//! behind its leader's messages or journal.
//!
//! Runs alternate a topic of two publish sources (nodes of two forwarder shards, each source's
//! three replicas on three nodes, each with its own leader) and one (one shard, what T9 tested
//! before sources), the first of two: CI runs one run, and the topic of two is the one whose
//! faults reach two leaders at once (a node cut off may lead both, or one of each). The
//! publishers spread their requests over the active sources, the subscribers' pulls ask every
//! source, and their acknowledgements go to the source each ack id names, as the client does.
//! Each fault aims at the leader of a source drawn by the seed. Alternating rather than
//! doubling each run keeps CI's one run as long as before. Over every four runs, data
//! directories per node alternate too: M=3 with two sources, M=1 with one, M=1 with two, M=3
//! with one. `RINGPOST_T9_RUNS` sets the runs (default 1), each with `RINGPOST_T9_SECONDS` of
//! nemesis (default 50: each fault once); `RINGPOST_T9_SOURCES` (1 or 2) makes every run's topic
//! that many sources; `RINGPOST_TEST_SEED` replays a run's choices.

use ringpost_client::ReplicaStats;
use ringpost_client::{block_on, Client, Message, PoolSettings, RetrySettings};
use ringpost_tests::checker::{Checker, Outcome};
use ringpost_tests::netns::NetCluster;
use ringpost_tests::Random;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: usize = 3;
/// The namespace the clients run in: beside the nodes, so a node cut off is cut off from them.
const CLIENTS_NODE: usize = NODES;
const PUBLISHERS: usize = 4;
const SUBSCRIBERS: usize = 2;
const MESSAGES_PER_PUBLISH: u64 = 5;
const PUBLISH_PAUSE: Duration = Duration::from_millis(5);
/// Each request's deadline: long enough for a publish waiting out a failover, short enough
/// that a client stuck on a node cut off tries another soon, and that requests sent while two
/// nodes are dead are answered before they come back.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a fault lasts (a pause lasts `PAUSE_HOLD`), and how long all is well after it.
const FAULT_HOLD: Duration = Duration::from_secs(5);
const PAUSE_HOLD: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_secs(5);
/// After the last heal: publishes must be acknowledged again within this.
const RECOVERY_WITHIN: Duration = Duration::from_secs(60);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
const TOPIC: &str = "nemesis";
const SUBSCRIPTION: &str = "nemesis-sub";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The topic's leader's link goes down: the other two must elect a new one.
    IsolateLeader,
    /// A node that does not lead the topic is cut off.
    IsolateMinority,
    /// SIGKILL one node.
    KillOne,
    /// SIGKILL two nodes: no quorum until one is back.
    KillMajority,
    /// SIGSTOP one node for `PAUSE_HOLD`: it wakes up believing what it believed.
    PauseOne,
}

const FAULTS: [Fault; 5] =
    [Fault::IsolateLeader, Fault::IsolateMinority, Fault::KillOne, Fault::KillMajority, Fault::PauseOne];

/// What the subscribers were given and what they acknowledged, to find a message delivered
/// by a pull sent after its acknowledgement was confirmed. A pull sent before may have been
/// answered before the acknowledgement was applied (a subscriber whose lease ended and one
/// given the message again both hold it, and the first's acknowledgement is accepted while the
/// second's pull is answered): that is at-least-once, and this cannot tell it apart from a
/// delivery after the confirmation, so only pulls sent after it are judged.
#[derive(Default)]
struct Deliveries {
    /// Each payload's deliveries: when the pull was sent, and the message id.
    given: std::collections::HashMap<String, Vec<(Instant, u64)>>,
    acknowledged: std::collections::HashMap<String, Instant>,
    after_ack: Vec<String>,
}

impl Deliveries {
    fn delivered(&mut self, payload: &str, pull_sent: Instant, message_id: u64) {
        self.given.entry(payload.to_owned()).or_default().push((pull_sent, message_id));
        if self.acknowledged.get(payload).is_some_and(|confirmed| *confirmed < pull_sent) {
            self.after_ack.push(payload.to_owned());
        }
    }

    fn acknowledged(&mut self, payload: String, confirmed: Instant) {
        self.acknowledged.entry(payload).or_insert(confirmed);
    }

    fn history(&self, payload: &str, origin: Instant) -> String {
        let given: Vec<String> = self.given[payload]
            .iter()
            .map(|(sent, id)| format!("pulled at {:.3} s as {id}", secs(*sent, origin)))
            .collect();
        let acknowledged = self.acknowledged.get(payload).map(|at| secs(*at, origin));
        format!("{payload}: {given:?}, acknowledgement confirmed at {acknowledged:?} s")
    }
}

/// Seconds from the run's start, for the timelines printed on a failure.
fn secs(at: Instant, origin: Instant) -> f64 {
    at.saturating_duration_since(origin).as_secs_f64()
}

/// One request's history: when it was sent, when it was answered, and whether it succeeded.
#[derive(Clone, Copy)]
struct Attempt {
    sent: Instant,
    answered: Instant,
    confirmed: bool,
    publish: bool,
}

/// A client of one node's router, chosen at random, that returns every failure at once.
fn connect(routers: &[String], random: &mut Random) -> Option<Client> {
    let address = &routers[random.between(0, routers.len() as u64) as usize];
    let client =
        block_on(Client::connect_with_timeout(address, PoolSettings::default(), CLIENT_TIMEOUT)).ok()?;
    Some(client.with_retry(RetrySettings::NONE, RetrySettings::NONE))
}

/// Each source's leader, source 0 first, as (node, forwarder shard), as a reachable router's
/// catalog names them.
fn source_leaders(cluster: &NetCluster) -> Option<Vec<(usize, u32)>> {
    let routers: Vec<String> =
        (0..NODES).filter(|node| cluster.is_running(*node)).map(|node| cluster.router(node)).collect();
    let leaders = cluster.network.in_node(CLIENTS_NODE, move || {
        routers.iter().find_map(|router| {
            let client = block_on(Client::connect_with_timeout(
                router,
                PoolSettings::default(),
                Duration::from_secs(2),
            ))
            .ok()?;
            let topic = block_on(client.get_topic_with_sources(TOPIC)).ok()?;
            Some(
                topic
                    .sources
                    .iter()
                    .map(|source| (source.leader_node, source.leader_shard))
                    .collect::<Vec<_>>(),
            )
        })
    })?;
    // Node ids count from 1; a source led nowhere (0) is being elected.
    leaders
        .into_iter()
        .map(|(node, shard)| (1..=NODES as u64).contains(&node).then(|| (node as usize - 1, shard)))
        .collect::<Option<Vec<_>>>()
        .filter(|leaders| !leaders.is_empty())
}

#[test]
fn three_nodes_under_partitions_kills_and_pauses_lose_nothing_acknowledged() {
    let runs: u32 = std::env::var("RINGPOST_T9_RUNS").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    let seconds: u64 = std::env::var("RINGPOST_T9_SECONDS").ok().and_then(|n| n.parse().ok()).unwrap_or(50);
    let sources_forced: Option<u32> = std::env::var("RINGPOST_T9_SOURCES").ok().and_then(|n| n.parse().ok());
    let mut random = Random::from_time();
    for run in 0..runs {
        // Two sources, then one, in turn; over four runs each with M=3 and M=1.
        let sources = sources_forced.unwrap_or(if run % 2 == 0 { 2 } else { 1 });
        let directories = if matches!(run % 4, 0 | 3) { 3 } else { 1 };
        eprintln!(
            "T9 run {run} of {runs}, {seconds} s of nemesis, a topic of {sources} sources, \
             {directories} data directories per node"
        );
        run_once(Duration::from_secs(seconds), sources, directories, &mut random);
    }
}

fn run_once(nemesis_for: Duration, sources: u32, directories: usize, random: &mut Random) {
    // One source of the topic per shard: each node holds a replica of each source.
    let mut cluster = NetCluster::start_with_shards("t9", NODES, 1, directories, sources as usize);
    let routers: Arc<Vec<String>> = Arc::new((0..NODES).map(|node| cluster.router(node)).collect());
    {
        let routers = routers.clone();
        cluster.network.in_node(CLIENTS_NODE, move || {
            let client = block_on(Client::connect(&routers[0])).expect("connecting to node 0");
            if sources == 1 {
                let created = block_on(client.create_topic(TOPIC)).expect("creating the topic");
                assert_eq!(created.name, TOPIC);
            } else {
                let topic = ringpost_client::Topic { name: TOPIC.to_owned(), ..Default::default() };
                let created = block_on(client.create_topic_with_sources(topic, NODES as u32, sources))
                    .expect("creating the topic");
                assert_eq!(created.topic.name, TOPIC);
                assert_eq!(created.sources.len(), sources as usize, "{created:?}");
            }
            ringpost_tests::create_subscription(&client, SUBSCRIPTION, TOPIC, 10);
        });
    }
    let checker = Arc::new(Checker::new());
    let attempts = Arc::new(Mutex::new(Vec::<Attempt>::new()));
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let stop_subscribing = Arc::new(AtomicBool::new(false));
    let deliveries = Arc::new(Mutex::new(Deliveries::default()));
    let origin = Instant::now();

    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|publisher| {
            let (routers, checker, stop, attempts) =
                (routers.clone(), checker.clone(), stop_publishing.clone(), attempts.clone());
            let seed = random.next_u64();
            cluster.network.spawn_in_node(CLIENTS_NODE, move || {
                let mut random = Random::from_seed(seed);
                let mut sequence = 0u64;
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&routers, &mut random)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let payloads: Vec<String> = (sequence..sequence + MESSAGES_PER_PUBLISH)
                        .map(|s| format!("p{publisher}-{s}"))
                        .collect();
                    sequence += MESSAGES_PER_PUBLISH;
                    std::thread::sleep(PUBLISH_PAUSE);
                    let messages = payloads.iter().map(|p| Message::new(p.as_str())).collect();
                    let sent = Instant::now();
                    let result = block_on(connected.publish(TOPIC, messages));
                    let answered = Instant::now();
                    attempts.lock().unwrap().push(Attempt {
                        sent,
                        answered,
                        confirmed: result.is_ok(),
                        publish: true,
                    });
                    match result {
                        Ok(ids) => {
                            assert_eq!(ids.len(), payloads.len());
                            payloads.iter().for_each(|p| checker.published(p, Outcome::Ok));
                            client = Some(connected);
                        }
                        Err(error) => {
                            let outcome = Outcome::of_error(&error);
                            assert_ne!(outcome, Outcome::Failed, "unexpected refusal: {error}");
                            payloads.iter().for_each(|p| checker.published(p, outcome));
                            // Half the time the same client goes on, its next request to the
                            // next source: a new client's turn starts at source 0, so publishers
                            // that always reconnected would all wait on source 0's leader while
                            // it is down and leave the other sources idle through the fault.
                            if random.between(0, 2) == 0 {
                                client = Some(connected);
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            })
        })
        .collect();

    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let (routers, checker, stop, attempts) =
                (routers.clone(), checker.clone(), stop_subscribing.clone(), attempts.clone());
            let deliveries = deliveries.clone();
            let seed = random.next_u64();
            cluster.network.spawn_in_node(CLIENTS_NODE, move || {
                let mut random = Random::from_seed(seed);
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&routers, &mut random)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let pull_sent = Instant::now();
                    let messages = match block_on(connected.pull(SUBSCRIPTION, 200, 300)) {
                        Ok(messages) => messages,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                    };
                    let mut ack_ids = Vec::with_capacity(messages.len());
                    let mut payloads = Vec::with_capacity(messages.len());
                    for message in messages {
                        let payload = String::from_utf8(message.data).expect("payloads are UTF-8");
                        checker.delivered(&payload, message.delivery_attempt);
                        deliveries.lock().unwrap().delivered(&payload, pull_sent, message.message_id);
                        ack_ids.push(message.ack_id);
                        payloads.push(payload);
                    }
                    if !ack_ids.is_empty() {
                        let sent = Instant::now();
                        let result = block_on(connected.acknowledge(SUBSCRIPTION, ack_ids.clone()));
                        let answered = Instant::now();
                        let Ok(refused) = result else {
                            attempts.lock().unwrap().push(Attempt {
                                sent,
                                answered,
                                confirmed: false,
                                publish: false,
                            });
                            continue;
                        };
                        let refused: HashSet<&str> =
                            refused.iter().map(|invalid| invalid.ack_id.as_str()).collect();
                        let mut deliveries = deliveries.lock().unwrap();
                        let mut confirmed = false;
                        for (ack_id, payload) in ack_ids.iter().zip(payloads) {
                            if !refused.contains(ack_id.as_str()) {
                                deliveries.acknowledged(payload, answered);
                                confirmed = true;
                            }
                        }
                        attempts.lock().unwrap().push(Attempt { sent, answered, confirmed, publish: false });
                    }
                    client = Some(connected);
                }
            })
        })
        .collect();

    let confirmed_publishes = || attempts.lock().unwrap().iter().filter(|a| a.publish && a.confirmed).count();
    let wait_for_publishes = |what: &str, within: Duration, cluster: &NetCluster| {
        let started = Instant::now();
        let before = confirmed_publishes();
        while confirmed_publishes() <= before {
            assert!(
                started.elapsed() < within,
                "{what}: no publish acknowledged within {within:?}\n{}",
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        started.elapsed()
    };
    wait_for_publishes("the publishers start", Duration::from_secs(30), &cluster);

    // The nemesis: each fault once, in a random order, then faults at random.
    let mut order = FAULTS.to_vec();
    for index in (1..order.len()).rev() {
        order.swap(index, random.between(0, index as u64 + 1) as usize);
    }
    let mut without_quorum = Vec::<(Instant, Instant)>::new();
    let mut timeline = Vec::<(String, Instant, Instant)>::new();
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < nemesis_for {
        let fault = order.get(round).copied().unwrap_or_else(|| FAULTS[random.between(0, 5) as usize]);
        round += 1;
        // The source whose leader the fault aims at, drawn whether or not the leaders are known,
        // so that a seed's draws do not depend on what the routers answered.
        let aimed = random.between(0, u64::from(sources)) as usize;
        let leaders = source_leaders(&cluster).unwrap_or_default();
        let leader = leaders
            .get(aimed)
            .map(|(node, _)| *node)
            .unwrap_or_else(|| random.between(0, NODES as u64) as usize);
        let other = (leader + 1 + random.between(0, NODES as u64 - 1) as usize) % NODES;
        let led: Vec<usize> = leaders.iter().map(|(node, _)| *node).collect();
        let began = Instant::now();
        let named: Vec<(usize, u32)> = leaders.iter().map(|(node, shard)| (node + 1, *shard)).collect();
        eprintln!("T9: {fault:?} aimed at source {aimed}; the sources' leaders (node, shard): {named:?}");
        // Whether the fault reached a source's leader (then a failover pauses publishing there).
        let mut leader_hit = true;
        match fault {
            Fault::IsolateLeader | Fault::IsolateMinority => {
                let node = if fault == Fault::IsolateLeader { leader } else { other };
                leader_hit = led.is_empty() || led.contains(&node);
                cluster.network.isolate(node);
                std::thread::sleep(FAULT_HOLD);
                cluster.network.heal(node);
                eprintln!(
                    "T9: node {} (source {aimed}'s leader {}) cut off for {FAULT_HOLD:?}",
                    node + 1,
                    leader + 1
                );
            }
            Fault::KillOne => {
                let node = if random.between(0, 2) == 0 { leader } else { other };
                leader_hit = led.is_empty() || led.contains(&node);
                cluster.kill(node);
                std::thread::sleep(FAULT_HOLD);
                cluster.spawn(node);
                eprintln!(
                    "T9: node {} (source {aimed}'s leader {}) killed for {FAULT_HOLD:?}",
                    node + 1,
                    leader + 1
                );
            }
            Fault::KillMajority => {
                let survivor = random.between(0, NODES as u64) as usize;
                let victims: Vec<usize> = (0..NODES).filter(|node| *node != survivor).collect();
                victims.iter().for_each(|node| cluster.kill(*node));
                let dead = Instant::now();
                std::thread::sleep(FAULT_HOLD);
                without_quorum.push((dead, Instant::now()));
                victims.iter().for_each(|node| cluster.spawn(*node));
                let victims: Vec<usize> = victims.iter().map(|node| node + 1).collect();
                eprintln!(
                    "T9: nodes {victims:?} (source {aimed}'s leader {}) killed for {FAULT_HOLD:?}",
                    leader + 1
                );
            }
            Fault::PauseOne => {
                let node = if random.between(0, 2) == 0 { leader } else { other };
                leader_hit = led.is_empty() || led.contains(&node);
                cluster.signal(node, nix::sys::signal::Signal::SIGSTOP);
                std::thread::sleep(PAUSE_HOLD);
                cluster.signal(node, nix::sys::signal::Signal::SIGCONT);
                eprintln!(
                    "T9: node {} (source {aimed}'s leader {}) stopped for {PAUSE_HOLD:?}",
                    node + 1,
                    leader + 1
                );
            }
        }
        timeline.push((format!("{fault:?} (source {aimed}'s leader {})", leader + 1), began, Instant::now()));
        std::thread::sleep(QUIET);
        // How long publishing stalled: from the fault to the first publish sent after it and
        // confirmed (clients stuck on a node cut off wait out their deadline first).
        let resumed = attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|attempt| attempt.publish && attempt.confirmed && attempt.sent > began)
            .map(|attempt| attempt.answered)
            .min();
        match resumed {
            Some(resumed) => eprintln!(
                "T9:   {fault:?}: a publish sent after it confirmed {:?} after it began",
                resumed - began
            ),
            None => eprintln!("T9:   {fault:?}: no publish sent since confirmed"),
        }
        // A fault that spared every source's leader should not pause publishing: when it did,
        // the nodes' logs so far, to see why.
        let stalled = resumed.is_none_or(|resumed| resumed - began > Duration::from_secs(2));
        if !leader_hit && fault != Fault::KillMajority && stalled {
            eprintln!("T9: STALL after {fault:?} that spared the leaders; the logs:\n{}", cluster.logs());
        }
    }
    wait_for_publishes("after the last heal", RECOVERY_WITHIN, &cluster);
    stop_publishing.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.join().unwrap();
    }
    let drain_started = Instant::now();
    while !checker.missing().is_empty() && drain_started.elapsed() < DRAIN_TIMEOUT {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop_subscribing.store(true, Ordering::Relaxed);
    for subscriber in subscribers {
        subscriber.join().unwrap();
    }

    let verdict = checker.verdict();
    let attempts = attempts.lock().unwrap().clone();
    let in_window = |attempt: &Attempt| {
        without_quorum.iter().any(|(dead, back)| attempt.sent >= *dead && attempt.answered <= *back)
    };
    let tried_without_quorum = attempts.iter().filter(|attempt| in_window(attempt)).count();
    let confirmed_without_quorum =
        attempts.iter().filter(|attempt| attempt.confirmed && in_window(attempt)).count();
    eprintln!(
        "T9: {round} faults; {}; {} requests sent and answered while two nodes were dead, {} of them confirmed",
        verdict.summary(),
        tried_without_quorum,
        confirmed_without_quorum,
    );
    assert!(verdict.acknowledged > 0, "no publish was ever acknowledged: the test proved nothing");
    assert!(
        verdict.lost.is_empty(),
        "{} acknowledged publishes lost, by producer: {:?}\n{}",
        verdict.lost.len(),
        checker.lost_by_producer(&verdict.lost),
        cluster.logs()
    );
    assert!(verdict.unexpected.is_empty(), "delivered but never published: {:?}", verdict.unexpected);
    assert!(verdict.failed_but_delivered.is_empty());
    assert_eq!(confirmed_without_quorum, 0, "requests confirmed while no quorum of nodes ran");
    let deliveries = deliveries.lock().unwrap();
    eprintln!(
        "T9: {} deliveries acknowledged and confirmed; {} delivered again by a pull sent after that",
        deliveries.acknowledged.len(),
        deliveries.after_ack.len()
    );
    if !deliveries.after_ack.is_empty() {
        let faults: Vec<String> = timeline
            .iter()
            .map(|(fault, from, to)| {
                format!("{fault} {:.3}..{:.3} s", secs(*from, origin), secs(*to, origin))
            })
            .collect();
        let histories: Vec<String> =
            deliveries.after_ack.iter().take(20).map(|payload| deliveries.history(payload, origin)).collect();
        panic!(
            "acknowledged, then delivered again: {:?}\nfaults: {faults:#?}\n{histories:#?}\n{}",
            deliveries.after_ack,
            cluster.logs()
        );
    }
    drop(deliveries);
    replicas_agree(&cluster, sources);
}

/// Once publishing stopped, each source's replicas agree: the replica at the leader the catalog
/// names holds all it has durable committed and finds both its followers caught up (messages
/// and journal), and the replicas at those followers' forwarders hold the same durable end
/// under the same epoch. Every replica of the topic on every node is one of some source's.
fn replicas_agree(cluster: &NetCluster, sources: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let routers: Vec<String> = (0..NODES).map(|node| cluster.router(node)).collect();
        // Each replica of the topic by its forwarder's address (node, shard).
        let replicas = cluster.network.in_node(CLIENTS_NODE, move || {
            routers
                .iter()
                .map(|router| {
                    let client = block_on(Client::connect(router)).ok()?;
                    let stats = block_on(client.stats()).ok()?;
                    Some(
                        stats
                            .topics
                            .into_iter()
                            .filter(|stats| stats.name.ends_with(TOPIC))
                            .map(|stats| (stats.shard, stats.replication))
                            .collect::<Vec<_>>(),
                    )
                })
                .collect::<Vec<_>>()
        });
        let by_address: HashMap<String, Option<ReplicaStats>> = replicas
            .iter()
            .enumerate()
            .flat_map(|(node, on_node)| {
                on_node
                    .iter()
                    .flatten()
                    .map(move |(shard, replica)| (cluster.forwarder(node, *shard as usize), replica.clone()))
            })
            .collect();
        let leaders = source_leaders(cluster).unwrap_or_default();
        let mut seen = HashSet::new();
        let mut agreed =
            replicas.iter().all(|on_node| on_node.as_ref().is_some_and(|on| on.len() == sources as usize))
                && leaders.len() == sources as usize;
        let mut described = Vec::new();
        for (source, (node, shard)) in leaders.iter().enumerate() {
            let address = cluster.forwarder(*node, *shard as usize);
            let Some(Some(leader)) = by_address.get(&address) else {
                agreed = false;
                described.push(format!("source {source}: no replica at its leader {address}"));
                continue;
            };
            seen.insert(address.clone());
            let caught_up = leader.leader
                && leader.committed_end == leader.durable_end
                && leader.followers.len() == NODES - 1
                && leader.followers.iter().all(|follower| {
                    seen.insert(follower.address.clone());
                    follower.lag_messages == 0
                        && follower.journal_lag_entries == 0
                        && by_address.get(&follower.address).is_some_and(|replica| {
                            replica.as_ref().is_some_and(|replica| {
                                !replica.leader
                                    && replica.durable_end == leader.durable_end
                                    && replica.epoch == leader.epoch
                            })
                        })
                });
            agreed &= caught_up;
            described.push(format!("source {source}: leader at {address} {leader:?}"));
        }
        agreed &= seen.len() == by_address.len();
        if agreed {
            eprintln!("T9: each source's replicas agree: {described:#?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replicas do not agree: {described:#?}\nall: {by_address:#?}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
