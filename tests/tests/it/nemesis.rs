//! T9 (docs/TESTING.md): three real nodes, each in a network namespace of its own, a topic on
//! all three (R=3), four publishers and two acknowledging subscribers in a fourth namespace,
//! and a nemesis that every 5 s either breaks something or heals what it broke: the topic's
//! leader cut off from everyone, another node cut off, one node SIGKILLed, two SIGKILLed, one
//! SIGSTOPped for 10 s. Then everything is healed, the publishers stop and the subscribers
//! drain. The history checker must find nothing acknowledged lost and nothing unexpected;
//! nothing whose acknowledgement was confirmed may be delivered again (by a pull sent after
//! the confirmation); nothing may be confirmed
//! that was sent while two nodes were dead and answered before either came back (no quorum
//! was reachable); and the replicas must end agreeing: the same durable end and epoch on all
//! three, all of it committed, and no follower behind the leader's messages or journal.
//!
//! Runs alternate three data directories per node (M=3, the first) and one.
//! `RINGPOST_T9_RUNS` sets the runs (default 1), each with `RINGPOST_T9_SECONDS` of nemesis
//! (default 50: each fault once); `RINGPOST_TEST_SEED` replays a run's choices.

use ringpost_client::{block_on, Client, Message, PoolSettings, RetrySettings};
use ringpost_tests::checker::{Checker, Outcome};
use ringpost_tests::netns::NetCluster;
use ringpost_tests::Random;
use std::collections::HashSet;
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

/// The node whose forwarder a reachable router names first for the topic: its leader.
fn topic_leader(cluster: &NetCluster) -> Option<usize> {
    let routers: Vec<String> =
        (0..NODES).filter(|node| cluster.is_running(*node)).map(|node| cluster.router(node)).collect();
    let first = cluster.network.in_node(CLIENTS_NODE, move || {
        routers.iter().find_map(|router| {
            let client = block_on(Client::connect_with_timeout(
                router,
                PoolSettings::default(),
                Duration::from_secs(2),
            ))
            .ok()?;
            block_on(client.lookup_topic(TOPIC)).ok()?.into_iter().next()
        })
    })?;
    cluster.node_of(&first)
}

#[test]
fn three_nodes_under_partitions_kills_and_pauses_lose_nothing_acknowledged() {
    let runs: u32 = std::env::var("RINGPOST_T9_RUNS").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    let seconds: u64 = std::env::var("RINGPOST_T9_SECONDS").ok().and_then(|n| n.parse().ok()).unwrap_or(50);
    let mut random = Random::from_time();
    for run in 0..runs {
        // Three data directories per node, then one, in turn.
        let directories = if run % 2 == 0 { 3 } else { 1 };
        eprintln!("T9 run {run} of {runs}, {seconds} s of nemesis, {directories} data directories per node");
        run_once(Duration::from_secs(seconds), directories, &mut random);
    }
}

fn run_once(nemesis_for: Duration, directories: usize, random: &mut Random) {
    let mut cluster = NetCluster::start_with_directories("t9", NODES, 1, directories);
    let routers: Arc<Vec<String>> = Arc::new((0..NODES).map(|node| cluster.router(node)).collect());
    {
        let routers = routers.clone();
        cluster.network.in_node(CLIENTS_NODE, move || {
            let client = block_on(Client::connect(&routers[0])).expect("connecting to node 0");
            let created = block_on(client.create_topic(TOPIC)).expect("creating the topic");
            assert_eq!(created.name, TOPIC);
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
        let leader = topic_leader(&cluster).unwrap_or_else(|| random.between(0, NODES as u64) as usize);
        let other = (leader + 1 + random.between(0, NODES as u64 - 1) as usize) % NODES;
        let began = Instant::now();
        // Whether the fault reached the topic's leader (then a failover pauses publishing).
        let mut leader_hit = true;
        match fault {
            Fault::IsolateLeader | Fault::IsolateMinority => {
                let node = if fault == Fault::IsolateLeader { leader } else { other };
                leader_hit = node == leader;
                cluster.network.isolate(node);
                std::thread::sleep(FAULT_HOLD);
                cluster.network.heal(node);
                eprintln!("T9: node {} (leader {}) cut off for {FAULT_HOLD:?}", node + 1, leader + 1);
            }
            Fault::KillOne => {
                let node = if random.between(0, 2) == 0 { leader } else { other };
                leader_hit = node == leader;
                cluster.kill(node);
                std::thread::sleep(FAULT_HOLD);
                cluster.spawn(node);
                eprintln!("T9: node {} (leader {}) killed for {FAULT_HOLD:?}", node + 1, leader + 1);
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
                eprintln!("T9: nodes {victims:?} (leader {}) killed for {FAULT_HOLD:?}", leader + 1);
            }
            Fault::PauseOne => {
                let node = if random.between(0, 2) == 0 { leader } else { other };
                leader_hit = node == leader;
                cluster.signal(node, nix::sys::signal::Signal::SIGSTOP);
                std::thread::sleep(PAUSE_HOLD);
                cluster.signal(node, nix::sys::signal::Signal::SIGCONT);
                eprintln!("T9: node {} (leader {}) stopped for {PAUSE_HOLD:?}", node + 1, leader + 1);
            }
        }
        timeline.push((format!("{fault:?} (leader {})", leader + 1), began, Instant::now()));
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
        // A fault that spared the leader should not pause publishing: when it did, the nodes'
        // logs so far, to see why.
        let stalled = resumed.is_none_or(|resumed| resumed - began > Duration::from_secs(2));
        if !leader_hit && fault != Fault::KillMajority && stalled {
            eprintln!("T9: STALL after {fault:?} that spared the leader; the logs:\n{}", cluster.logs());
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
    replicas_agree(&mut cluster);
}

/// Once publishing stopped, every node's replica of the topic holds the same durable end
/// under the same epoch, all of it committed, and the leader finds both followers caught up.
fn replicas_agree(cluster: &mut NetCluster) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let routers: Vec<String> = (0..NODES).map(|node| cluster.router(node)).collect();
        let replicas = cluster.network.in_node(CLIENTS_NODE, move || {
            routers
                .iter()
                .map(|router| {
                    let client = block_on(Client::connect(router)).ok()?;
                    let stats = block_on(client.stats()).ok()?;
                    stats
                        .topics
                        .into_iter()
                        .filter(|stats| stats.name.ends_with(TOPIC))
                        .find_map(|stats| stats.replication)
                })
                .collect::<Vec<_>>()
        });
        let leaders: Vec<_> = replicas.iter().flatten().filter(|replica| replica.leader).collect();
        let agreed = replicas.iter().all(Option::is_some)
            && leaders.len() == 1
            && leaders[0].committed_end == leaders[0].durable_end
            && leaders[0].followers.len() == NODES - 1
            && leaders[0]
                .followers
                .iter()
                .all(|follower| follower.lag_messages == 0 && follower.journal_lag_entries == 0)
            && replicas.iter().flatten().all(|replica| {
                replica.durable_end == leaders[0].durable_end && replica.epoch == leaders[0].epoch
            });
        if agreed {
            eprintln!("T9: the replicas agree: {:?}", leaders[0]);
            return;
        }
        assert!(Instant::now() < deadline, "the replicas do not agree: {replicas:?}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(500));
    }
}
