//! Replicated topics on three real nodes (docs/REPLICATION.md): a topic on three replicas,
//! its leader's node SIGKILLed under four publishers and two acknowledging subscribers, again
//! and again, each time brought back. The history checker must find no acknowledged publish
//! lost and nothing unexpected, and no message whose acknowledgement was confirmed may be
//! delivered again. Each failover (from the kill to the first publish acknowledged after it)
//! is printed.
//!
//! `RINGPOST_REPLICATION_KILLS` sets how many leaders are killed (default 3).

use ringpost_client::{block_on, Client, Message, RetrySettings};
use ringpost_tests::checker::{Checker, Outcome};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::{create_subscription, Random};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const PUBLISHERS: usize = 4;
const SUBSCRIBERS: usize = 2;
const MESSAGES_PER_PUBLISH: u64 = 5;
const PUBLISH_PAUSE: Duration = Duration::from_millis(5);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// The failover the issue allows: from a leader's death to publishes acknowledged again.
const FAILOVER_MAX: Duration = Duration::from_secs(10);

/// A client of one of the running nodes' routers, chosen at random, that returns every
/// failure at once (the caller connects again, maybe to another node).
fn connect(routers: &RwLock<Vec<String>>, random: &mut Random) -> Option<Client> {
    let routers = routers.read().unwrap().clone();
    if routers.is_empty() {
        return None;
    }
    let address = &routers[random.between(0, routers.len() as u64) as usize];
    let client = block_on(Client::connect(address)).ok()?;
    Some(client.with_retry(RetrySettings::NONE, RetrySettings::NONE))
}

/// The node whose forwarder the routers name first for `topic`: its leader.
fn leader_of(cluster: &Cluster, topic: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for id in cluster.ids().filter(|id| cluster.is_running(*id)) {
            let Ok(route) = block_on(cluster.node(id).client().lookup_topic(topic)) else { continue };
            let Some(first) = route.first() else { continue };
            let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap();
            for candidate in cluster.ids() {
                let router_port: u16 =
                    cluster.node(candidate).address.rsplit(':').next().unwrap().parse().unwrap();
                if port == router_port + 1 && cluster.is_running(candidate) {
                    return candidate;
                }
            }
        }
        assert!(Instant::now() < deadline, "no running node leads {topic}");
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let routers = Arc::new(RwLock::new(running_routers(&cluster)));
    let checker = Arc::new(Checker::new());
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let stop_subscribing = Arc::new(AtomicBool::new(false));
    let acknowledged_publishes = Arc::new(AtomicU64::new(0));
    let durably_acked = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let delivered_after_ack = Arc::new(Mutex::new(Vec::<String>::new()));

    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|publisher| {
            let (routers, checker, stop) = (routers.clone(), checker.clone(), stop_publishing.clone());
            let acknowledged = acknowledged_publishes.clone();
            std::thread::spawn(move || {
                let mut random = Random::from_time();
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
                    match block_on(connected.publish("replicated", messages)) {
                        Ok(ids) => {
                            assert_eq!(ids.len(), payloads.len());
                            payloads.iter().for_each(|p| checker.published(p, Outcome::Ok));
                            acknowledged.fetch_add(1, Ordering::Relaxed);
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
            let (routers, checker, stop) = (routers.clone(), checker.clone(), stop_subscribing.clone());
            let (durably_acked, delivered_after_ack) = (durably_acked.clone(), delivered_after_ack.clone());
            std::thread::spawn(move || {
                let mut random = Random::from_time();
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&routers, &mut random)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let pull_sent = Instant::now();
                    let messages = match block_on(connected.pull("replicated-sub", 200, 300)) {
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
                        // Judged only for pulls sent after the confirmation: one sent before may
                        // have been answered before the acknowledgement was applied.
                        if durably_acked.lock().unwrap().get(&payload).is_some_and(|at| *at < pull_sent) {
                            delivered_after_ack.lock().unwrap().push(payload.clone());
                        }
                        ack_ids.push(message.ack_id);
                        payloads.push(payload);
                    }
                    if !ack_ids.is_empty() {
                        match block_on(connected.acknowledge("replicated-sub", ack_ids.clone())) {
                            Ok(refused) => {
                                let refused: HashSet<&str> =
                                    refused.iter().map(|invalid| invalid.ack_id.as_str()).collect();
                                let mut durable = durably_acked.lock().unwrap();
                                let confirmed = Instant::now();
                                for (ack_id, payload) in ack_ids.iter().zip(payloads) {
                                    if !refused.contains(ack_id.as_str()) {
                                        durable.entry(payload).or_insert(confirmed);
                                    }
                                }
                            }
                            Err(_) => continue,
                        }
                    }
                    client = Some(connected);
                }
            })
        })
        .collect();

    let wait_for_publishes = |what: &str, within: Duration| -> Duration {
        let started = Instant::now();
        let before = acknowledged_publishes.load(Ordering::Relaxed);
        while acknowledged_publishes.load(Ordering::Relaxed) <= before {
            assert!(started.elapsed() < within, "{what}: no publish acknowledged within {within:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        started.elapsed()
    };
    wait_for_publishes("the publishers start", Duration::from_secs(30));
    let mut random = Random::from_time();
    for kill in 0..kills {
        std::thread::sleep(Duration::from_millis(random.between(500, 1500)));
        let leader = leader_of(&cluster, "replicated");
        cluster.node_mut(leader).kill();
        *routers.write().unwrap() = running_routers(&cluster);
        let failover = wait_for_publishes("publishing after the leader's death", FAILOVER_MAX);
        let new_leader = leader_of(&cluster, "replicated");
        eprintln!("kill {kill}: node {leader} killed; publishes acknowledged again after {failover:?}, node {new_leader} leads");
        assert_ne!(new_leader, leader);
        std::thread::sleep(Duration::from_millis(random.between(200, 1500)));
        cluster.node_mut(leader).restart();
        *routers.write().unwrap() = running_routers(&cluster);
    }
    std::thread::sleep(Duration::from_millis(500));
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
    eprintln!(
        "replication: {kills} leaders killed, {} publishes acknowledged, {} distinct delivered, {} duplicates \
         ({} flagged as redeliveries), {} indeterminate publishes recovered, lost {}, unexpected {}",
        verdict.acknowledged,
        verdict.delivered_distinct,
        verdict.duplicates,
        verdict.redeliveries_reported_by_server,
        verdict.recovered,
        verdict.lost.len(),
        verdict.unexpected.len()
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
    let delivered_after_ack = delivered_after_ack.lock().unwrap();
    eprintln!(
        "replication: {} deliveries acknowledged and confirmed; {} of them delivered again after",
        durably_acked.lock().unwrap().len(),
        delivered_after_ack.len()
    );
    assert!(delivered_after_ack.is_empty(), "acknowledged, then delivered again: {:?}", *delivered_after_ack);
    drop(delivered_after_ack);
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
