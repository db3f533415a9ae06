//! Subscription semantics users of Pub/Sub expect: filters, dead-letter topics, retry backoff,
//! ordering keys, seek, and the sync point under concurrent publishers.

use ringpost_client::{block_on, Client, Message, ReceivedMessage, Subscription};
use ringpost_tests::{Daemon, Random};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn subscription(name: &str, topic: &str) -> Subscription {
    Subscription { name: name.into(), topic: topic.into(), ..Default::default() }
}

fn texts(messages: &[ReceivedMessage]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8(m.data.clone()).unwrap()).collect()
}

fn attribute<'a>(message: &'a ReceivedMessage, key: &str) -> Option<&'a str> {
    message.attributes.iter().find(|a| a.key == key).map(|a| a.value.as_str())
}

fn ack_all(client: &Client, subscription: &str, messages: &[ReceivedMessage]) {
    let ids = messages.iter().map(|m| m.ack_id.clone()).collect();
    assert!(block_on(client.acknowledge(subscription, ids)).unwrap().is_empty());
}

#[test]
fn filters_deliver_only_matching_messages_and_acknowledge_the_rest() {
    let daemon = Daemon::start("filter");
    let client = daemon.client();
    block_on(client.create_topic("regional")).unwrap();
    let filtered = Subscription {
        filter: r#"attributes.region = "eu" AND NOT hasPrefix(attributes.kind, "test")"#.into(),
        ..subscription("eu-only", "regional")
    };
    block_on(client.create_subscription(filtered)).unwrap();
    block_on(client.create_subscription(subscription("everything", "regional"))).unwrap();
    block_on(client.publish(
        "regional",
        vec![
            Message::new("eu order").attribute("region", "eu").attribute("kind", "order"),
            Message::new("us order").attribute("region", "us"),
            Message::new("eu test").attribute("region", "eu").attribute("kind", "test-1"),
            Message::new("no region"),
        ],
    ))
    .unwrap();
    assert_eq!(texts(&block_on(client.pull("eu-only", 10, 0)).unwrap()), vec!["eu order"]);
    assert_eq!(block_on(client.pull("everything", 10, 0)).unwrap().len(), 4);
    let stats = block_on(client.stats()).unwrap();
    let eu = stats.topics[0].subscriptions.iter().find(|s| s.name == "eu-only").unwrap();
    assert_eq!(
        eu.backlog_messages, 1,
        "the three rejected messages were acknowledged; the delivered one is not yet"
    );
}

#[test]
fn exhausted_messages_go_to_the_dead_letter_topic_once() {
    let daemon =
        Daemon::start_with("dead-letter", vec![], vec!["--http-listen".into(), "127.0.0.1:0".into()]);
    let client = daemon.client();
    block_on(client.create_topic("jobs")).unwrap();
    block_on(client.create_topic("jobs-dead")).unwrap();
    block_on(client.create_subscription(subscription("dead-reader", "jobs-dead"))).unwrap();
    block_on(client.create_subscription(Subscription {
        dead_letter_topic: "jobs-dead".into(),
        max_delivery_attempts: 5,
        ..subscription("workers", "jobs")
    }))
    .unwrap();
    block_on(
        client.publish("jobs", vec![Message::new("poison").attribute("kind", "bad"), Message::new("fine")]),
    )
    .unwrap();
    let mut attempts_seen = Vec::new();
    for _ in 0..5 {
        let delivered = block_on(client.pull("workers", 10, 2000)).unwrap();
        let poison: Vec<&ReceivedMessage> = delivered.iter().filter(|m| m.data == b"poison").collect();
        assert_eq!(poison.len(), 1, "{:?}", texts(&delivered));
        attempts_seen.push(poison[0].delivery_attempt);
        for message in &delivered {
            if message.data == b"fine" {
                ack_all(&client, "workers", std::slice::from_ref(message));
            }
        }
        assert!(block_on(client.nack("workers", vec![poison[0].ack_id.clone()])).unwrap().is_empty());
    }
    assert_eq!(attempts_seen, vec![1, 2, 3, 4, 5]);
    let dead = block_on(client.pull("dead-reader", 10, 5000)).unwrap();
    assert_eq!(texts(&dead), vec!["poison"]);
    assert_eq!(attribute(&dead[0], "kind"), Some("bad"), "original attributes are kept");
    assert_eq!(attribute(&dead[0], "CloudPubSubDeadLetterSourceSubscription"), Some("workers"));
    assert_eq!(attribute(&dead[0], "CloudPubSubDeadLetterSourceDeliveryCount"), Some("5"));
    assert!(
        block_on(client.pull("workers", 10, 1000)).unwrap().is_empty(),
        "dead-lettered means acknowledged here"
    );
    // What a monitoring system sees of it.
    let (status, body) =
        ringpost_tests::scrape::http_get(daemon.http_address.as_deref().unwrap(), "/metrics");
    assert_eq!(status, 200, "{body}");
    let scrape = ringpost_tests::scrape::Scrape::parse(&body);
    let workers = [("subscription", "workers"), ("topic", "jobs")];
    let counter = |name: &str| scrape.value(name, &workers);
    assert_eq!(counter("ringpost_subscription_dead_lettered_messages_total"), Some(1.0));
    assert_eq!(counter("ringpost_subscription_redelivered_messages_total"), Some(4.0), "attempts 2 to 5");
    assert_eq!(counter("ringpost_subscription_acknowledged_messages_total"), Some(2.0));
    assert_eq!(
        scrape.value("ringpost_topic_published_messages_total", &[("topic", "jobs-dead")]),
        Some(1.0),
        "the dead letter is a publish to its topic"
    );
}

#[test]
fn nacks_back_off_exponentially_under_a_retry_policy() {
    let daemon = Daemon::start("backoff");
    let client = daemon.client();
    block_on(client.create_topic("retries")).unwrap();
    block_on(client.create_subscription(Subscription {
        minimum_backoff_seconds: 2,
        maximum_backoff_seconds: 3,
        ..subscription("patient", "retries")
    }))
    .unwrap();
    block_on(client.publish("retries", vec![Message::new("later")])).unwrap();
    let first = block_on(client.pull("patient", 1, 0)).unwrap();
    let nacked_at = Instant::now();
    block_on(client.nack("patient", vec![first[0].ack_id.clone()])).unwrap();
    assert!(block_on(client.pull("patient", 1, 1000)).unwrap().is_empty(), "not before the backoff");
    let again = block_on(client.pull("patient", 1, 5000)).unwrap();
    assert_eq!(again.len(), 1);
    assert!(nacked_at.elapsed() >= Duration::from_secs(2), "redelivered after {:?}", nacked_at.elapsed());
    assert_eq!(again[0].delivery_attempt, 2);
}

#[test]
fn ordering_keys_deliver_each_key_in_order_and_a_nack_blocks_only_its_key() {
    let daemon = Daemon::start("ordering");
    let client = daemon.client();
    block_on(client.create_topic("ledger-events")).unwrap();
    block_on(client.create_subscription(Subscription {
        enable_message_ordering: true,
        ..subscription("ledger", "ledger-events")
    }))
    .unwrap();
    let mut messages = Vec::new();
    for i in 0..3 {
        messages.push(Message::new(format!("a{i}")).ordering_key("account-a"));
        messages.push(Message::new(format!("b{i}")).ordering_key("account-b"));
    }
    messages.push(Message::new("unkeyed"));
    block_on(client.publish("ledger-events", messages)).unwrap();
    let first = block_on(client.pull("ledger", 100, 0)).unwrap();
    assert_eq!(texts(&first), vec!["a0", "b0", "unkeyed"], "one message per key at a time");
    ack_all(&client, "ledger", &[first[0].clone(), first[2].clone()]);
    block_on(client.nack("ledger", vec![first[1].ack_id.clone()])).unwrap();
    let second = block_on(client.pull("ledger", 100, 0)).unwrap();
    assert_eq!(
        texts(&second),
        vec!["b0", "a1"],
        "b0 comes back before anything later of its key; a moves on"
    );
    assert_eq!(second[0].delivery_attempt, 2);
    ack_all(&client, "ledger", &second);
    let third = block_on(client.pull("ledger", 100, 0)).unwrap();
    assert_eq!(texts(&third), vec!["b1", "a2"]);
}

/// 100 keys × 1,000 messages with random nacks: per key, first deliveries arrive in publish
/// order, and every message is delivered.
#[test]
fn a_hundred_keys_stay_in_order_under_random_nacks() {
    const KEYS: usize = 100;
    const PER_KEY: usize = 1000;
    let daemon = Daemon::start("ordering-load");
    let client = daemon.client();
    block_on(client.create_topic("ordered-load")).unwrap();
    block_on(client.create_subscription(Subscription {
        enable_message_ordering: true,
        ack_deadline_seconds: 60,
        ..subscription("ordered-reader", "ordered-load")
    }))
    .unwrap();
    for round in 0..PER_KEY / 10 {
        let mut batch = Vec::new();
        for sequence in round * 10..round * 10 + 10 {
            for key in 0..KEYS {
                batch.push(Message::new(format!("{key}:{sequence}")).ordering_key(format!("key-{key}")));
            }
        }
        for chunk in batch.chunks(1000) {
            block_on(client.publish("ordered-load", chunk.to_vec())).unwrap();
        }
    }
    let mut random = Random::from_time();
    let mut next_first: Vec<usize> = vec![0; KEYS];
    let mut done = 0;
    let started = Instant::now();
    while done < KEYS * PER_KEY {
        assert!(started.elapsed() < Duration::from_secs(240), "stalled at {done} of {}", KEYS * PER_KEY);
        let delivered = block_on(client.pull("ordered-reader", 1000, 1000)).unwrap();
        let mut ack = Vec::new();
        let mut nack = Vec::new();
        for message in delivered {
            let text = String::from_utf8(message.data).unwrap();
            let (key, sequence) = text.split_once(':').unwrap();
            let (key, sequence): (usize, usize) = (key.parse().unwrap(), sequence.parse().unwrap());
            if message.delivery_attempt == 1 {
                assert_eq!(sequence, next_first[key], "key {key}: first delivery of {sequence} out of order");
                next_first[key] += 1;
            } else {
                assert!(sequence < next_first[key], "key {key}: a redelivery of a message never delivered");
            }
            if random.between(0, 10) == 0 {
                nack.push(message.ack_id);
            } else {
                ack.push(message.ack_id);
                done += 1;
            }
        }
        if !ack.is_empty() {
            assert!(block_on(client.acknowledge("ordered-reader", ack)).unwrap().is_empty());
        }
        if !nack.is_empty() {
            block_on(client.nack("ordered-reader", nack)).unwrap();
        }
    }
    assert!(next_first.iter().all(|next| *next == PER_KEY));
}

#[test]
fn seek_replays_retained_messages_and_skips_forward() {
    let daemon = Daemon::start("seek");
    let client = daemon.client();
    block_on(client.create_topic("replayable")).unwrap();
    block_on(client.create_subscription(Subscription {
        retain_acked_messages: true,
        ..subscription("replayer", "replayable")
    }))
    .unwrap();
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    block_on(client.publish("replayable", (0..10).map(|i| Message::new(format!("m{i}"))).collect())).unwrap();
    let delivered = block_on(client.pull("replayer", 100, 0)).unwrap();
    ack_all(&client, "replayer", &delivered);
    assert!(block_on(client.pull("replayer", 100, 0)).unwrap().is_empty());
    block_on(client.seek("replayer", before)).unwrap();
    assert_eq!(
        block_on(client.pull("replayer", 100, 0)).unwrap().len(),
        10,
        "seek to the past replays acknowledged messages"
    );
    block_on(client.seek("replayer", before + 3_600_000)).unwrap();
    assert!(
        block_on(client.pull("replayer", 100, 0)).unwrap().is_empty(),
        "seek to the future acknowledges everything"
    );
}

/// Subscriptions created while 4 publishers run each receive every message whose publish was
/// sent after the subscription's creation was acknowledged.
#[test]
fn the_sync_point_holds_under_concurrent_publishers() {
    let daemon = Daemon::start("sync-concurrent");
    let client = daemon.client();
    block_on(client.create_topic("busy")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sequences: Vec<Arc<AtomicU64>> = (0..4).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let publishers: Vec<_> = (0..4)
        .map(|publisher| {
            let (stop, sequence, address) =
                (stop.clone(), sequences[publisher].clone(), daemon.address.clone());
            std::thread::spawn(move || {
                let client = block_on(Client::connect(&address)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let next = sequence.load(Ordering::SeqCst);
                    let messages =
                        (next..next + 10).map(|s| Message::new(format!("{publisher}:{s}"))).collect();
                    block_on(client.publish("busy", messages)).unwrap();
                    sequence.store(next + 10, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let mut cutoffs: Vec<(String, Vec<u64>)> = Vec::new();
    for index in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        let name = format!("late-{index}");
        block_on(client.create_subscription(subscription(&name, "busy"))).unwrap();
        // Publishes sent from now on must all arrive on this subscription.
        cutoffs.push((name, sequences.iter().map(|s| s.load(Ordering::SeqCst) + 10).collect()));
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.join().unwrap();
    }
    let published: Vec<u64> = sequences.iter().map(|s| s.load(Ordering::SeqCst)).collect();
    for (name, cutoff) in cutoffs {
        let mut seen: HashMap<(usize, u64), ()> = HashMap::new();
        loop {
            let batch = block_on(client.pull(&name, 1000, 0)).unwrap();
            if batch.is_empty() {
                break;
            }
            for text in texts(&batch) {
                let (publisher, sequence) = text.split_once(':').unwrap();
                seen.insert((publisher.parse().unwrap(), sequence.parse().unwrap()), ());
            }
            ack_all(&client, &name, &batch);
        }
        for publisher in 0..4 {
            for sequence in cutoff[publisher]..published[publisher] {
                assert!(seen.contains_key(&(publisher, sequence)), "{name} missed {publisher}:{sequence}");
            }
        }
    }
    let _ = Mutex::new(());
}

#[test]
fn snapshots_capture_acknowledgements_and_seek_restores_them() {
    let mut daemon = Daemon::start("snapshot");
    let client = daemon.client();
    block_on(client.create_topic("orders-log")).unwrap();
    block_on(client.create_subscription(subscription("billing", "orders-log"))).unwrap();
    block_on(client.publish("orders-log", (0..6).map(|i| Message::new(format!("o{i}"))).collect())).unwrap();
    let first = block_on(client.pull("billing", 100, 0)).unwrap();
    ack_all(&client, "billing", &first[..2]);
    ack_all(&client, "billing", &first[4..5]);
    // Unacknowledged at snapshot time: o2, o3, o5.
    let snapshot = block_on(client.create_snapshot("before-bug", "billing")).unwrap();
    assert_eq!(snapshot.topic, "orders-log");
    ack_all(&client, "billing", &[first[2].clone(), first[3].clone(), first[5].clone()]);
    assert!(block_on(client.pull("billing", 100, 0)).unwrap().is_empty());
    // A restart keeps the snapshot (journal and catalog) and the acknowledgements.
    drop(client);
    daemon.restart();
    let client = daemon.client();
    assert_eq!(block_on(client.list_snapshots()).unwrap().len(), 1);
    block_on(client.seek_to_snapshot("billing", "before-bug")).unwrap();
    let replayed = block_on(client.pull("billing", 100, 0)).unwrap();
    assert_eq!(texts(&replayed), vec!["o2", "o3", "o5"]);
    block_on(client.create_topic("other-topic")).unwrap();
    block_on(client.create_subscription(subscription("other-sub", "other-topic"))).unwrap();
    let refused = block_on(client.seek_to_snapshot("other-sub", "before-bug")).unwrap_err();
    assert_eq!(refused.code(), ringpost_client::ErrorCode::FailedPrecondition);
    block_on(client.delete_snapshot("before-bug")).unwrap();
    assert!(block_on(client.list_snapshots()).unwrap().is_empty());
    assert_eq!(
        block_on(client.seek_to_snapshot("billing", "before-bug")).unwrap_err().code(),
        ringpost_client::ErrorCode::NotFound
    );
}

#[test]
fn cli_creates_subscriptions_with_every_policy_and_seeks() {
    let daemon = Daemon::start("cli-policies");
    let run = |args: &[&str]| ringpost_tests::succeeded(&daemon.cli(args));
    run(&["topic", "create", "events"]);
    run(&["topic", "create", "events-dead"]);
    let created = run(&[
        "sub",
        "create",
        "policies",
        "--topic",
        "events",
        "--ack-deadline",
        "30",
        "--ordering",
        "--filter",
        "attributes:kind",
        "--dead-letter-topic",
        "events-dead",
        "--max-delivery-attempts",
        "7",
        "--min-backoff",
        "1",
        "--max-backoff",
        "5",
        "--retain-acked",
        "--retention",
        "3600",
        "--expiration",
        "86400",
    ]);
    for expected in [
        "\"ack_deadline_seconds\":30",
        "\"enable_message_ordering\":true",
        "\"filter\":\"attributes:kind\"",
        "\"dead_letter_topic\":\"events-dead\"",
        "\"max_delivery_attempts\":7",
        "\"minimum_backoff_seconds\":1",
        "\"maximum_backoff_seconds\":5",
        "\"retain_acked_messages\":true",
    ] {
        assert!(created.contains(expected), "{expected} missing from {created}");
    }
    run(&["publish", "events", "--attr", "kind=x", "--ordering-key", "k1", "one"]);
    run(&["pull", "policies", "--max", "5", "--ack"]);
    run(&["sub", "seek", "policies", "--time", "1970-01-01T00:00:00Z"]);
    let replayed = run(&["pull", "policies", "--max", "5"]);
    assert!(replayed.contains("\"data\":\"one\""), "{replayed}");
    assert!(replayed.contains("\"ordering_key\":\"k1\""), "{replayed}");
    run(&["snapshot", "create", "snap-1", "--subscription", "policies"]);
    assert!(run(&["snapshot", "list"]).contains("snap-1"));
    run(&["sub", "seek", "policies", "--snapshot", "snap-1"]);
    run(&["snapshot", "delete", "snap-1"]);
    let bad = ringpost_tests::failed(&daemon.cli(&["sub", "seek", "policies", "--time", "yesterday"]));
    assert!(bad.starts_with("InvalidArgument"), "{bad}");
}

/// The ack id a daemon gave before ack ids named their source (`<subscription>.<offset>.
/// <generation>`), made from the versioned one a daemon gives now
/// (`v1.<subscription>.<source>.<offset>.<generation>`).
fn version_0_ack_id(ack_id: &str) -> String {
    let fields: Vec<&str> = ack_id.strip_prefix("v1.").expect("a version 1 ack id").split('.').collect();
    assert_eq!(fields.len(), 4, "{ack_id}");
    assert_eq!(fields[1], "0", "the topic's one source is source 0: {ack_id}");
    format!("{}.{}.{}", fields[0], fields[2], fields[3])
}

/// A client holding ack ids across a rolling restart onto versioned ack ids: those in the old
/// format still acknowledge their messages (source 0), and ack ids of a later format version or
/// naming a source the topic lacks are refused saying why, acknowledging nothing.
#[test]
fn ack_ids_from_before_versioning_still_acknowledge_and_others_are_refused_saying_why() {
    let mut daemon = Daemon::start("versioned-ack-ids");
    let client = daemon.client();
    block_on(client.create_topic("upgraded")).unwrap();
    let held = Subscription { ack_deadline_seconds: 600, ..subscription("held", "upgraded") };
    block_on(client.create_subscription(held)).unwrap();
    block_on(client.publish("upgraded", (0..4).map(|n| Message::new(format!("m{n}"))).collect())).unwrap();
    let mut pulled = block_on(client.pull("held", 4, 0)).unwrap();
    pulled.sort_by_key(|message| message.message_id);
    assert_eq!(pulled.iter().map(|message| message.message_id).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    // An extension is journaled, so the leases and their ack ids outlive the restart.
    let held_ids = pulled.iter().map(|message| message.ack_id.clone()).collect();
    assert!(block_on(client.modify_ack_deadline("held", held_ids, 600)).unwrap().is_empty());
    drop(client);
    daemon.restart();
    let client = daemon.client();
    assert!(block_on(client.pull("held", 4, 0)).unwrap().is_empty(), "the leases were restored");
    let old = version_0_ack_id(&pulled[0].ack_id);
    let later_version = format!("v2.{}", &pulled[2].ack_id["v1.".len()..]);
    let fields: Vec<&str> = pulled[3].ack_id.split('.').collect();
    let other_source = format!("v1.{}.1.{}.{}", fields[1], fields[3], fields[4]);
    let refused = block_on(client.acknowledge(
        "held",
        vec![old, pulled[1].ack_id.clone(), later_version.clone(), other_source.clone()],
    ))
    .unwrap();
    let reasons: HashMap<&str, &str> =
        refused.iter().map(|refusal| (refusal.ack_id.as_str(), refusal.reason.as_str())).collect();
    assert_eq!(reasons.len(), 2, "only the later version and the other source are refused: {refused:?}");
    assert!(reasons[later_version.as_str()].contains("later format version"), "{refused:?}");
    assert!(reasons[other_source.as_str()].contains("no such source"), "{refused:?}");
    // The two refused go back at once; the two acknowledged stay acknowledged.
    let nacked =
        block_on(client.nack("held", vec![pulled[2].ack_id.clone(), pulled[3].ack_id.clone()])).unwrap();
    assert!(nacked.is_empty(), "{nacked:?}");
    let mut again = block_on(client.pull("held", 4, 5_000)).unwrap();
    again.sort_by_key(|message| message.message_id);
    assert_eq!(texts(&again), vec!["m2", "m3"]);
}
