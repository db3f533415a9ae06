//! A data directory written by an earlier `ringpostd` is served by this one, with its topics,
//! subscriptions, snapshots and every subscription's position, and this version writes on top
//! of it and recovers what it wrote.
//!
//! `tests/fixtures/data-a69b528.tar.gz` is the data directory of one node with two forwarder
//! shards, written by `ringpostd` built at a69b528: before ack ids and message ids were
//! versioned, before the carrying of requests between nodes, before the log's split. It was made
//! on 2026-12-06 at 10:00 UTC with these commands, then a SIGTERM:
//!
//! ```sh
//! ringpost topic create orders --retention 86400
//! ringpost topic create orders-dead
//! ringpost topic create events
//! ringpost sub create audit --topic orders --filter 'attributes.region = "eu"' --ordering \
//!     --dead-letter-topic orders-dead --max-delivery-attempts 7 --ack-deadline 30
//! ringpost sub create everything --topic orders --min-backoff 1 --max-backoff 60
//! ringpost sub create events-sub --topic events --retain-acked --retention 3600
//! # order-0 … order-9: region "us" for every third (2, 5, 8), "eu" otherwise; key customer-(i % 2)
//! for i in 0 … 9: ringpost publish orders --attr region=R --attr n=i --ordering-key customer-K order-i
//! ringpost publish events event-00 … event-09   # five requests of ten, to event-49
//! ringpost pull everything --max 3 --ack        # order-0, order-1, order-2
//! ringpost snapshot create before --subscription audit
//! ringpost pull audit --max 10 --ack            # order-0, order-1 (one per ordering key)
//! ringpost pull events-sub --max 20 --ack       # event-00 … event-19
//! ringpost sub update events-sub --expiration never
//! ringpost pull everything --max 2              # order-3 (ack id 5.3.4), order-4: leased, not acked
//! ```
//!
//! The daemon runs under libfaketime with its wall clock set to half an hour after that, so that
//! the retention and expiry the fixture holds (seven days for the snapshot and for unacknowledged
//! messages) are what they were, whatever the date the test runs on; its monotonic clock is left
//! alone.

use ringpost_client::{block_on, Client, Message, ReceivedMessage};
use ringpost_tests::{libfaketime, Daemon};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The wall clock the daemon reads: half an hour after the fixture was written.
const FAKE_WALL_CLOCK: &str = "@2026-12-06 10:30:00";
/// The same, in milliseconds since the Unix epoch (2026-12-06T10:30:00Z).
const FAKE_WALL_CLOCK_MS: u64 = 1_796_553_000_000;
/// When the fixture was written, a little before its first publish (ms since the Unix epoch:
/// 2026-12-06T10:00:00Z), for the seek by time.
const BEFORE_THE_FIRST_PUBLISH_MS: u64 = 1_796_551_200_000;
/// How long the test waits for messages it expects before it fails.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn a_data_directory_of_an_earlier_version_is_served_with_its_settings_and_positions() {
    let library = libfaketime();
    let mut daemon = Daemon::prepare("upgrade", Vec::new(), Vec::new());
    let data = daemon.data_dirs[0].clone();
    std::fs::create_dir_all(&data).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/data-a69b528.tar.gz");
    let status = Command::new("tar").arg("-C").arg(&data).arg("-xzf").arg(&fixture).status().unwrap();
    assert!(status.success(), "unpacking {}", fixture.display());
    daemon.env = vec![
        ("LD_PRELOAD".to_owned(), library.display().to_string()),
        ("FAKETIME".to_owned(), FAKE_WALL_CLOCK.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        // libfaketime reads FAKETIME in the local time zone.
        ("TZ".to_owned(), "UTC".to_owned()),
    ];
    daemon.spawn();
    let client = daemon.client();

    // The catalog: every topic, subscription and snapshot with its settings.
    let topics: BTreeMap<String, u64> = block_on(client.list_topics())
        .unwrap()
        .into_iter()
        .map(|topic| (topic.name, topic.message_retention_seconds))
        .collect();
    let expected: BTreeMap<String, u64> = [("events", 0), ("orders", 86_400), ("orders-dead", 0)]
        .map(|(name, seconds)| (name.to_owned(), seconds))
        .into();
    assert_eq!(topics, expected);
    let audit = block_on(client.get_subscription("audit")).unwrap();
    assert_eq!(
        (
            audit.topic.as_str(),
            audit.ack_deadline_seconds,
            audit.enable_message_ordering,
            audit.filter.as_str()
        ),
        ("orders", 30, true, "attributes.region = \"eu\"")
    );
    assert_eq!((audit.dead_letter_topic.as_str(), audit.max_delivery_attempts), ("orders-dead", 7));
    let everything = block_on(client.get_subscription("everything")).unwrap();
    assert_eq!((everything.minimum_backoff_seconds, everything.maximum_backoff_seconds), (1, 60));
    let events = block_on(client.get_subscription("events-sub")).unwrap();
    assert!(events.retain_acked_messages);
    assert_eq!(events.message_retention_seconds, 3_600);
    assert_eq!(events.expiration_ttl_seconds, u64::MAX, "set to never");
    let snapshots = block_on(client.list_snapshots()).unwrap();
    assert_eq!(snapshots.iter().map(|snapshot| snapshot.name.as_str()).collect::<Vec<_>>(), ["before"]);

    // A lease did not outlive the restart: its ack id, of the format before versioning, is read
    // and refused saying why, and its message is delivered again with the rest.
    let refused = block_on(client.acknowledge("everything", vec!["5.3.4".to_owned()])).unwrap();
    assert_eq!(refused.len(), 1, "the lease of 5.3.4 ended with the restart");
    assert!(refused[0].reason.contains("unknown ack id"), "{:?}", refused[0]);
    let delivered = receive(&client, "everything", 7, true);
    assert_eq!(
        numbers(&delivered),
        (3..=9).collect::<Vec<u64>>(),
        "everything: what it had not acknowledged"
    );
    for message in &delivered {
        let n = message.message_id;
        assert_eq!(message.data, format!("order-{n}").into_bytes());
        assert_eq!(message.ordering_key, format!("customer-{}", n % 2));
        let region = if n % 3 == 2 { "us" } else { "eu" };
        assert_eq!(attribute(message, "region"), Some(region));
        assert_eq!(attribute(message, "n"), Some(n.to_string().as_str()));
        assert!(message.ack_id.starts_with("v1."), "{}", message.ack_id);
    }

    // The filter and the ordering hold on: the "eu" messages not yet acknowledged, each key's
    // in publish order; then the snapshot takes the subscription back to before order-0.
    let audited = receive(&client, "audit", 5, true);
    assert_eq!(sorted(&audited), vec![3, 4, 6, 7, 9]);
    assert_in_key_order(&audited);
    block_on(client.seek_to_snapshot("audit", "before")).unwrap();
    let again = receive(&client, "audit", 7, true);
    assert_eq!(sorted(&again), vec![0, 1, 3, 4, 6, 7, 9]);
    assert_in_key_order(&again);

    // Acknowledged messages kept by `--retain-acked` come back with a seek by time.
    block_on(client.seek("events-sub", BEFORE_THE_FIRST_PUBLISH_MS)).unwrap();
    let replayed = receive(&client, "events-sub", 50, true);
    let payloads: BTreeSet<Vec<u8>> = replayed.iter().map(|message| message.data.clone()).collect();
    assert_eq!(payloads, (0..50).map(|n| format!("event-{n:02}").into_bytes()).collect());

    // This version writes after what the earlier one wrote, and recovers both.
    let ids = block_on(client.publish("orders", vec![Message::new("order-10")])).unwrap();
    assert_eq!(ids, vec![10], "the next offset of orders");
    drop(client);
    daemon.kill();
    daemon.spawn();
    let client = daemon.client();
    let latest = receive(&client, "everything", 1, true);
    assert_eq!(latest[0].data, b"order-10");
    // Stamped by the wall clock the test set, so that the retention and expiry checked above
    // were the fixture's, not the date's.
    let stamped = latest[0].publish_time_ms;
    assert!(
        (FAKE_WALL_CLOCK_MS..FAKE_WALL_CLOCK_MS + 600_000).contains(&stamped),
        "order-10 was stamped {stamped} ms: libfaketime is not in force"
    );
    assert_eq!(block_on(client.list_topics()).unwrap().len(), 3);
}

/// Pulls `subscription` until `count` messages came, acknowledging each pull's when `ack`.
fn receive(client: &Client, subscription: &str, count: usize, ack: bool) -> Vec<ReceivedMessage> {
    let deadline = Instant::now() + DELIVERY_TIMEOUT;
    let mut received = Vec::new();
    while received.len() < count {
        assert!(
            Instant::now() < deadline,
            "{subscription}: {} of {count} within {DELIVERY_TIMEOUT:?}",
            received.len()
        );
        let batch = block_on(client.pull(subscription, 10, 500)).unwrap();
        if ack && !batch.is_empty() {
            let ack_ids = batch.iter().map(|message| message.ack_id.clone()).collect();
            let refused = block_on(client.acknowledge(subscription, ack_ids)).unwrap();
            assert!(refused.is_empty(), "{subscription}: {refused:?}");
        }
        received.extend(batch);
    }
    assert_eq!(received.len(), count, "{subscription}: no more than expected");
    received
}

fn numbers(messages: &[ReceivedMessage]) -> Vec<u64> {
    messages.iter().map(|message| message.message_id).collect()
}

fn sorted(messages: &[ReceivedMessage]) -> Vec<u64> {
    let mut numbers = numbers(messages);
    numbers.sort_unstable();
    numbers
}

fn attribute<'a>(message: &'a ReceivedMessage, key: &str) -> Option<&'a str> {
    message.attributes.iter().find(|attribute| attribute.key == key).map(|attribute| attribute.value.as_str())
}

/// Each ordering key's messages came in the order they were published.
fn assert_in_key_order(messages: &[ReceivedMessage]) {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for message in messages {
        if let Some(previous) = last.insert(&message.ordering_key, message.message_id) {
            assert!(
                previous < message.message_id,
                "key {}: {previous} before {}",
                message.ordering_key,
                message.message_id
            );
        }
    }
}
