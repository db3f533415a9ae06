//! Routing restrictions and `ringpost cluster drain` on three nodes. The drain runs under load: the drained node (the catalog's leader,
//! so that its lead of the catalog moves too) ends leading nothing and handed out to no one,
//! is killed and started again, and is undrained, while four publishers and two acknowledging
//! subscribers run through the other nodes' routers without one error, and every acknowledged
//! publish is delivered.

use ringpost_client::{block_on, Client, Message};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::json_field as field;
use ringpost_tests::{create_subscription, drain, payload, succeeded};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the drain may take to move every leadership off the node: a few elections and
/// one catalog leadership transfer, on a loaded machine.
const DRAIN_WAIT_SECONDS: &str = "60";

/// Waits until `check` holds (at most `limit`), or fails saying `what`.
fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The node whose forwarder leads each topic, as node `asked` sees the catalog.
fn leaders(cluster: &Cluster, asked: u64) -> HashMap<String, u64> {
    let status = block_on(cluster.node(asked).client().cluster_status()).unwrap();
    status.topics.into_iter().map(|topic| (topic.name, topic.leader_node)).collect()
}

/// The forwarders a fresh client of node `asked`'s router is handed for `topic`.
fn handed(cluster: &Cluster, asked: u64, topic: &str) -> Vec<String> {
    block_on(cluster.node(asked).client().lookup_topic(topic)).unwrap()
}

/// What one publisher or subscriber saw.
#[derive(Default)]
struct Record {
    /// Publishers: each acknowledged payload; subscribers: each received payload.
    payloads: HashSet<Vec<u8>>,
    failures: Vec<String>,
    /// Subscribers: acknowledgements refused, and the last reason given.
    refused_acks: usize,
    refusal: String,
}

/// Publishes batches to `topic` until `stop`, recording what was acknowledged and every error.
fn publisher(
    client: Client,
    topic: String,
    index: u64,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> Arc<Mutex<Record>> {
    let record = Arc::new(Mutex::new(Record::default()));
    let recording = record.clone();
    std::thread::spawn(move || {
        let mut sequence = (index + 1) << 32;
        while !stop.load(Ordering::Relaxed) {
            let batch = 1 + sequence % 4;
            let data: Vec<Vec<u8>> =
                (sequence..sequence + batch).map(|sequence| payload(sequence, 64)).collect();
            sequence += batch;
            let result = block_on(client.publish(&topic, data.iter().cloned().map(Message::new).collect()));
            let mut record = recording.lock().unwrap();
            match result {
                Ok(ids) if ids.len() == data.len() => {
                    record.payloads.extend(data);
                    count.fetch_add(batch, Ordering::Relaxed);
                }
                Ok(ids) => record.failures.push(format!("{} ids for {batch} messages", ids.len())),
                Err(error) => record.failures.push(format!("{topic}: {error}")),
            }
        }
    });
    record
}

/// Pulls and acknowledges `subscription` until `stop`, recording what was received and every
/// error.
fn subscriber(client: Client, subscription: String, stop: Arc<AtomicBool>) -> Arc<Mutex<Record>> {
    let record = Arc::new(Mutex::new(Record::default()));
    let recording = record.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let batch = match block_on(client.pull(&subscription, 100, 200)) {
                Ok(batch) => batch,
                Err(error) => {
                    recording.lock().unwrap().failures.push(format!("pulling {subscription}: {error}"));
                    continue;
                }
            };
            let ack_ids: Vec<String> = batch.iter().map(|message| message.ack_id.clone()).collect();
            recording.lock().unwrap().payloads.extend(batch.into_iter().map(|message| message.data));
            if ack_ids.is_empty() {
                continue;
            }
            match block_on(client.acknowledge(&subscription, ack_ids)) {
                Ok(refused) if refused.is_empty() => {}
                // A lease does not outlive its leader (README, "Upgrading"): an ack id held
                // across the leadership's move is refused, naming why, and its message comes
                // again, so nothing is lost; the refusal is counted, not failed.
                Ok(refused) => {
                    let mut record = recording.lock().unwrap();
                    record.refused_acks += refused.len();
                    record.refusal = refused[0].reason.clone();
                }
                Err(error) => recording.lock().unwrap().failures.push(format!("acknowledging: {error}")),
            }
        }
    });
    record
}

#[test]
fn a_drained_node_leads_nothing_is_handed_to_no_one_and_restarts_unseen_by_clients() {
    let mut cluster = Cluster::start("drain", 3, Vec::new());
    let drained = cluster.leader();
    let others: Vec<u64> = cluster.ids().filter(|id| *id != drained).collect();
    let admin = cluster.node(others[0]).client();

    // Six topics of three replicas over three forwarders: each node leads some. The four
    // published to are those the drained node leads first.
    let topics: Vec<String> = (0..6).map(|index| format!("drained-{index}")).collect();
    for topic in &topics {
        block_on(admin.create_topic(topic)).unwrap();
        create_subscription(&admin, &format!("{topic}-sub"), topic, 10);
    }
    let before = leaders(&cluster, others[0]);
    let mut published = topics.clone();
    published.sort_by_key(|topic| before[topic] != drained);
    published.truncate(4);
    assert_eq!(before[&published[0]], drained, "node {drained} leads none of {before:?}");
    let drained_forwarder = handed(&cluster, others[0], &published[0])[0].clone();
    let subscribed: Vec<String> = published[..2].iter().map(|topic| format!("{topic}-live")).collect();
    for (topic, subscription) in published.iter().zip(&subscribed) {
        create_subscription(&admin, subscription, topic, 10);
    }

    let stop_publishing = Arc::new(AtomicBool::new(false));
    let stop_subscribing = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicU64::new(0));
    let publishers: Vec<(String, Arc<Mutex<Record>>)> = published
        .iter()
        .enumerate()
        .map(|(index, topic)| {
            let client = cluster.node(others[index % 2]).client();
            let record =
                publisher(client, topic.clone(), index as u64, stop_publishing.clone(), acknowledged.clone());
            (topic.clone(), record)
        })
        .collect();
    let subscribers: Vec<Arc<Mutex<Record>>> = subscribed
        .iter()
        .enumerate()
        .map(|(index, subscription)| {
            let client = cluster.node(others[(index + 1) % 2]).client();
            subscriber(client, subscription.clone(), stop_subscribing.clone())
        })
        .collect();
    let publishing = |what: &str| {
        let before = acknowledged.load(Ordering::Relaxed);
        eventually(Duration::from_secs(20), what, || acknowledged.load(Ordering::Relaxed) >= before + 100);
    };
    publishing("the publishers start");

    // The drain: it waits until the node is empty and says so.
    let started = Instant::now();
    let output = cluster.node(others[1]).cli(&[
        "cluster",
        "drain",
        &drained.to_string(),
        "--wait",
        DRAIN_WAIT_SECONDS,
    ]);
    let answer = succeeded(&output);
    assert_eq!(field(answer.trim(), "drained"), "true", "{answer}");
    eprintln!("node {drained} drained in {:?}", started.elapsed());
    let new_leader = cluster.leader();
    assert_ne!(new_leader, drained, "the drained node still leads the catalog");
    let after = leaders(&cluster, new_leader);
    assert!(after.values().all(|leader| *leader != drained), "node {drained} still leads: {after:?}");
    let no_one_hands_it_out = |cluster: &Cluster| {
        for asked in cluster.ids() {
            for topic in &topics {
                let list = handed(cluster, asked, topic);
                assert!(!list.is_empty(), "node {asked} hands out nothing for {topic}");
                assert!(!list.contains(&drained_forwarder), "node {asked} hands out {list:?} for {topic}");
            }
        }
    };
    no_one_hands_it_out(&cluster);
    let status = succeeded(&cluster.node(others[0]).cli(&["cluster", "status"]));
    let drain_row = status.lines().find(|line| line.contains("\"draining_node\""));
    let drain_row = drain_row.unwrap_or_else(|| panic!("no draining node in {status}"));
    assert_eq!(field(drain_row, "draining_node"), drained.to_string(), "{status}");
    assert_eq!(field(drain_row, "empty"), "true", "{status}");
    publishing("the publishers go on after the drain");

    // Stopped and started again: still drained (the catalog says so), and no client notices.
    cluster.node_mut(drained).restart();
    publishing("the publishers go on after the drained node's restart");
    eventually(Duration::from_secs(10), "the restarted node says it drains", || {
        let drains = block_on(cluster.node(drained).client().drain_status());
        drains.is_ok_and(|drains| drains.nodes.iter().map(|drain| drain.node_id).eq([drained]))
    });
    assert!(leaders(&cluster, others[0]).values().all(|leader| *leader != drained));
    no_one_hands_it_out(&cluster);

    // Undrained, it is handed out again.
    succeeded(&cluster.node(others[0]).cli(&["cluster", "undrain", &drained.to_string()]));
    eventually(Duration::from_secs(10), "the undrained node is handed out again", || {
        cluster.ids().all(|asked| handed(&cluster, asked, &published[0]).len() == 3)
    });
    publishing("the publishers go on after the undrain");

    stop_publishing.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let mut sent: HashMap<String, HashSet<Vec<u8>>> = HashMap::new();
    for (topic, record) in &publishers {
        let record = record.lock().unwrap();
        assert!(record.failures.is_empty(), "{topic}: publishes failed: {:?}", record.failures);
        eprintln!("{topic}: {} publishes acknowledged", record.payloads.len());
        sent.insert(topic.clone(), record.payloads.clone());
    }
    for (index, subscription) in subscribed.iter().enumerate() {
        let wanted = &sent[&published[index]];
        eventually(
            Duration::from_secs(30),
            &format!("{subscription} gets every acknowledged publish"),
            || wanted.is_subset(&subscribers[index].lock().unwrap().payloads),
        );
    }
    stop_subscribing.store(true, Ordering::Relaxed);
    for (subscription, record) in subscribed.iter().zip(&subscribers) {
        let record = record.lock().unwrap();
        assert!(record.failures.is_empty(), "{subscription}: {:?}", record.failures);
        eprintln!(
            "{subscription}: {} received, {} acknowledgements refused ({})",
            record.payloads.len(),
            record.refused_acks,
            record.refusal
        );
    }
    let reader = cluster.node(others[1]).client();
    for topic in &published {
        let delivered: HashSet<Vec<u8>> =
            drain(&reader, &format!("{topic}-sub"), true).into_values().collect();
        assert_eq!(&delivered, &sent[topic], "{topic}: the delivered messages are not the acknowledged ones");
    }
}

/// Routing restrictions: a rule picking this test's clients (by their loopback address, then by
/// their principal) keeps every router's lookup lists to the nodes it allows and away from
/// those it denies; rules leaving a client no forwarder get it a refusal naming them; removed,
/// the lists are whole again.
#[test]
fn a_restricted_client_is_never_handed_a_denied_node() {
    let cluster = Cluster::start("restrict", 3, Vec::new());
    let admin = cluster.node(1).client();
    let topics: Vec<String> = (0..3).map(|index| format!("restricted-{index}")).collect();
    for topic in &topics {
        block_on(admin.create_topic(topic)).unwrap();
    }
    // A router that has not applied a change yet may still refuse: an empty list here.
    let lists = |cluster: &Cluster| -> Vec<Vec<String>> {
        let handed = |asked: u64, topic: &str| {
            block_on(cluster.node(asked).client().lookup_topic(topic)).unwrap_or_default()
        };
        cluster.ids().flat_map(|asked| topics.iter().map(move |topic| handed(asked, topic))).collect()
    };
    assert!(lists(&cluster).iter().all(|list| list.len() == 3));
    let cli = |args: &[&str]| succeeded(&cluster.node(2).cli(args));

    // Allowed node 3 alone: every list is its one forwarder (each node applies the rule
    // within moments of the one that carried it).
    cli(&["cluster", "restrict-add", "--from", "127.0.0.1/32", "--allow", "3"]);
    eventually(Duration::from_secs(10), "every list is one forwarder", || {
        lists(&cluster).iter().all(|list| list.len() == 1)
    });
    let allowed = lists(&cluster);
    let only = allowed[0].clone();
    assert!(allowed.iter().all(|list| *list == only), "{allowed:?}");
    let listed = cli(&["cluster", "restrict-list"]);
    assert_eq!((field(listed.trim(), "from"), field(listed.trim(), "effect")), ("127.0.0.1/32", "allow"));

    // Denied node 3 by principal: deny beats the allow, and the client is told why.
    cli(&["cluster", "restrict-add", "--principal", "anonymous", "--deny", "3"]);
    eventually(Duration::from_secs(10), "every router refuses the lookup", || {
        cluster.ids().all(|asked| block_on(cluster.node(asked).client().lookup_topic(&topics[0])).is_err())
    });
    let refused = block_on(cluster.node(1).client().lookup_topic(&topics[0])).unwrap_err().to_string();
    assert!(
        refused.contains("routing restrictions leave anonymous (from 127.0.0.1) no forwarder"),
        "{refused}"
    );
    cli(&["cluster", "restrict-remove", "--from", "127.0.0.1/32", "--allow", "3"]);
    eventually(Duration::from_secs(10), "every list leaves node 3 out", || {
        lists(&cluster).iter().all(|list| list.len() == 2 && !list.contains(&only[0]))
    });

    // Removed, every node is handed out again.
    cli(&["cluster", "restrict-remove", "--principal", "anonymous", "--deny", "3"]);
    eventually(Duration::from_secs(10), "every list is whole again", || {
        lists(&cluster).iter().all(|list| list.len() == 3)
    });
    assert!(cli(&["cluster", "restrict-list"]).trim().is_empty());
}

/// A topic of one replica on a draining node cannot move: the drain says so by name and fails,
/// and the node stays first in the topic's list (a native publish goes to the leader, and is
/// not relayed), so its publishers and subscribers carry on.
#[test]
fn a_topic_of_one_replica_holds_a_drain_back_by_name_and_keeps_being_served() {
    let cluster = Cluster::start("drain-single", 3, Vec::new());
    succeeded(&cluster.node(1).cli(&["topic", "create", "lone", "--replicas", "1"]));
    let holder = leaders(&cluster, 1)["lone"];
    let other = cluster.ids().find(|id| *id != holder).unwrap();
    let client = cluster.node(other).client();
    create_subscription(&client, "lone-sub", "lone", 10);
    let owner = handed(&cluster, other, "lone")[0].clone();

    let output = cluster.node(other).cli(&["cluster", "drain", &holder.to_string(), "--wait", "30"]);
    let refusal = ringpost_tests::failed(&output);
    assert!(refusal.contains("holds 1 topic(s) of one replica") && refusal.contains("(lone)"), "{refusal}");
    for asked in cluster.ids() {
        let list = handed(&cluster, asked, "lone");
        assert_eq!(list[0], owner, "node {asked} hands out {list:?}");
    }
    let published: HashSet<Vec<u8>> = (0..20).map(|sequence| payload(sequence, 64)).collect();
    for data in &published {
        block_on(client.publish("lone", vec![Message::new(data.clone())])).unwrap();
    }
    let delivered: HashSet<Vec<u8>> = drain(&client, "lone-sub", true).into_values().collect();
    assert_eq!(delivered, published);
    succeeded(&cluster.node(other).cli(&["cluster", "undrain", &holder.to_string()]));
}
