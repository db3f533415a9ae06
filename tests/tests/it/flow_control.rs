//! Flow control per shard and per topic (`subscription::outstanding`): beyond the messages a
//! topic's or shard's subscribers may hold unacknowledged, delivery pauses without an error,
//! and resumes once acknowledgements or streams that end give their count back.

use ringpost_client::{block_on, Client, Message, MessageStream, StreamSettings};
use ringpost_tests::{create_subscription, create_topic_and_subscription, Daemon};
use std::time::{Duration, Instant};

/// How long a paused subscriber is watched to see that it receives nothing more.
const QUIET: Duration = Duration::from_millis(1500);
/// How long a subscriber that should receive is given: tells a paused daemon from a serving
/// one on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

fn publish(client: &Client, topic: &str, count: u64) {
    let messages = (0..count).map(|i| Message::new(format!("{i:06}"))).collect();
    block_on(client.publish(topic, messages)).unwrap();
}

fn open_stream(client: &Client, subscription: &str) -> MessageStream {
    let settings = StreamSettings { max_outstanding_messages: 1000, ..StreamSettings::default() };
    block_on(client.streaming_pull(subscription, settings)).unwrap()
}

/// Takes what `stream` delivers until it has `want` messages (within `PATIENCE`) and then
/// nothing more for `QUIET`; returns every ack id received.
fn receive_exactly(stream: &mut MessageStream, want: usize) -> Vec<String> {
    let mut ack_ids = Vec::new();
    let started = Instant::now();
    let mut quiet_since = None::<Instant>;
    loop {
        match ringpost_tests::within(Duration::from_millis(200), stream.next()) {
            Some(Some(Ok(batch))) => {
                ack_ids.extend(batch.into_iter().map(|message| message.ack_id));
                assert!(ack_ids.len() <= want, "{} delivered past the limit of {want}", ack_ids.len());
                quiet_since = None;
            }
            Some(Some(Err(error))) => panic!("the stream failed: {error}"),
            Some(None) => panic!("the server ended the stream"),
            None if ack_ids.len() == want => {
                if quiet_since.get_or_insert_with(Instant::now).elapsed() >= QUIET {
                    return ack_ids;
                }
            }
            None => assert!(started.elapsed() < PATIENCE, "{} of {want} delivered", ack_ids.len()),
        }
    }
}

/// The value of `name` for forwarder shard 0 (and `limit`, when given) in the daemon's
/// `/metrics`.
fn shard_metric(daemon: &Daemon, name: &str, limit: Option<&str>) -> f64 {
    let address = daemon.http_address.as_ref().expect("started with --http-listen");
    let (status, body) = ringpost_tests::scrape::http_get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    let mut labels = vec![("shard", "0")];
    labels.extend(limit.map(|limit| ("limit", limit)));
    ringpost_tests::scrape::Scrape::parse(&body)
        .value(name, &labels)
        .unwrap_or_else(|| panic!("no {name} {labels:?} in /metrics"))
}

/// Pulls until something comes (within `PATIENCE`).
fn pull_some(client: &Client, subscription: &str) -> Vec<String> {
    let started = Instant::now();
    loop {
        let batch = block_on(client.pull(subscription, 100, 500)).unwrap();
        if !batch.is_empty() {
            return batch.into_iter().map(|message| message.ack_id).collect();
        }
        assert!(started.elapsed() < PATIENCE, "nothing delivered on '{subscription}'");
    }
}

/// A topic's limit: a subscriber that never acknowledges stops at it, another subscription's
/// pulls find nothing while it holds everything, and it receives again once the other's
/// acknowledgements make room; its stream, dropped, gives its count back.
#[test]
fn a_subscriber_that_never_acknowledges_stops_at_the_topics_limit_until_others_make_room() {
    const LIMIT: usize = 50;
    let daemon = Daemon::start_with(
        "flow-topic",
        Vec::new(),
        [
            "--shards",
            "1",
            "--http-listen",
            "127.0.0.1:0",
            "--outstanding-messages-topic-max",
            &LIMIT.to_string(),
        ]
        .map(String::from)
        .to_vec(),
    );
    let client = daemon.client();
    create_topic_and_subscription(&client, "hot", "holder", 60);
    create_subscription(&client, "acker", "hot", 60);
    publish(&client, "hot", 400);
    // The acknowledging subscriber takes 30 first and holds them for now.
    let held = block_on(client.pull("acker", 30, 5000)).unwrap();
    assert_eq!(held.len(), 30);
    let mut holder = open_stream(&client, "holder");
    let first = receive_exactly(&mut holder, LIMIT - 30);
    // The topic is at its limit: a pull on either subscription waits and finds nothing.
    assert!(
        block_on(client.pull("acker", 100, 1000)).unwrap().is_empty(),
        "delivered past the topic's limit"
    );
    // The other subscriber's acknowledgements make room, which the holder takes.
    let refused =
        block_on(client.acknowledge("acker", held.into_iter().map(|m| m.ack_id).collect())).unwrap();
    assert!(refused.is_empty());
    let second = receive_exactly(&mut holder, 30);
    assert_eq!(first.len() + second.len(), LIMIT);
    assert!(
        block_on(client.pull("acker", 100, 1000)).unwrap().is_empty(),
        "delivered past the topic's limit"
    );
    // Seen: what the subscribers hold, and the pauses.
    assert_eq!(shard_metric(&daemon, "ringpost_outstanding_messages", None), LIMIT as f64);
    assert!(shard_metric(&daemon, "ringpost_deliveries_paused_total", None) >= 2.0);
    // The holder goes: what it held comes back, and the other subscription is served again.
    drop(holder);
    let delivered = pull_some(&client, "acker");
    assert!(!delivered.is_empty() && delivered.len() <= LIMIT);
    assert_eq!(shard_metric(&daemon, "ringpost_outstanding_messages", None), delivered.len() as f64);
}

/// A topic of two sources, each on a shard of its own with a count of its own: each holds half
/// the topic's limit, so that a subscriber that never acknowledges holds at most the topic's
/// limit over both, not twice it.
#[test]
fn a_topic_of_two_sources_holds_its_limit_over_both() {
    const LIMIT: usize = 40;
    let daemon = Daemon::start_with(
        "flow-sources",
        Vec::new(),
        ["--shards", "2", "--outstanding-messages-topic-max", &LIMIT.to_string()].map(String::from).to_vec(),
    );
    ringpost_tests::succeeded(&daemon.cli(&["topic", "create", "wide", "--sources", "2"]));
    let client = daemon.client();
    create_subscription(&client, "holder", "wide", 60);
    assert_eq!(block_on(client.topic_sources("wide")).unwrap(), (2, 2));
    // Unordered requests go to the sources in turn: 100 messages on each, more than the limit.
    for _ in 0..10 {
        publish(&client, "wide", 20);
    }
    let mut streams: Vec<MessageStream> = (0..2)
        .map(|source| {
            let settings = StreamSettings { max_outstanding_messages: 1000, ..StreamSettings::default() };
            block_on(client.streaming_pull_source("holder", source, settings)).unwrap()
        })
        .collect();
    // Each stream takes its source's share and then nothing more for a while.
    let held: usize = streams.iter_mut().map(|stream| receive_exactly(stream, LIMIT / 2).len()).sum();
    assert_eq!(held, LIMIT);
}

/// A shard's limit holds over its topics: a stream holding the shard's every outstanding
/// message on one topic pauses another topic's pulls, until it disconnects.
#[test]
fn a_shards_limit_pauses_its_other_topics_until_a_stream_that_disconnects_gives_its_count_back() {
    const LIMIT: usize = 40;
    let daemon = Daemon::start_with(
        "flow-shard",
        Vec::new(),
        ["--shards", "1", "--outstanding-messages-shard-max", &LIMIT.to_string()].map(String::from).to_vec(),
    );
    let client = daemon.client();
    create_topic_and_subscription(&client, "first", "first-holder", 60);
    create_topic_and_subscription(&client, "second", "second-puller", 60);
    publish(&client, "first", 200);
    publish(&client, "second", 200);
    let mut holder = open_stream(&client, "first-holder");
    receive_exactly(&mut holder, LIMIT);
    assert!(block_on(client.pull("second-puller", 100, 1000)).unwrap().is_empty(), "past the shard's limit");
    drop(holder);
    let delivered = pull_some(&client, "second-puller");
    assert!(!delivered.is_empty() && delivered.len() <= LIMIT);
}

/// A topic's publish rate: a burst of ten times a second's limit through the client library's
/// publisher is slowed and refused with a retry delay, which the library waits and retries, so
/// every message is acknowledged and delivered, the daemon stays up and its memory bounded. A
/// client that does not retry reads the refusal as `ResourceExhausted` with its delay.
#[test]
fn a_burst_of_ten_times_a_topics_publish_limit_is_smoothed_and_nothing_is_lost() {
    use ringpost_client::{ErrorCode, Publisher, PublisherSettings, RetrySettings};
    use std::collections::HashSet;
    use std::sync::Arc;
    const LIMIT_PER_SECOND: u64 = 200;
    const BURST: u64 = 10 * LIMIT_PER_SECOND;
    let daemon = Daemon::start_with(
        "flow-publish",
        Vec::new(),
        [
            "--shards",
            "1",
            "--http-listen",
            "127.0.0.1:0",
            "--publish-messages-per-second-topic-max",
            &LIMIT_PER_SECOND.to_string(),
        ]
        .map(String::from)
        .to_vec(),
    );
    let client = Arc::new(daemon.client());
    create_topic_and_subscription(&client, "burst", "checker", 60);
    let rss_before_kib = daemon.memory_kib("VmRSS");
    let started = Instant::now();
    let publisher = Publisher::new(client.clone(), "burst", PublisherSettings::default()).unwrap();
    let pending: Vec<_> =
        (0..BURST).map(|i| (i, publisher.publish(Message::new(format!("{i:06}"))))).collect();
    let mut acknowledged = HashSet::new();
    for (i, future) in pending {
        match block_on(future) {
            Ok(_) => assert!(acknowledged.insert(format!("{i:06}"))),
            Err(error) => panic!("message {i} failed: {error}"),
        }
    }
    block_on(publisher.shutdown());
    let took = started.elapsed();
    eprintln!("{BURST} messages at {LIMIT_PER_SECOND}/s published in {took:?}");
    // The rate held: ten seconds' worth took at least the nine beyond the bucket's first second.
    assert!(took >= Duration::from_secs(8), "{BURST} messages at {LIMIT_PER_SECOND}/s took {took:?}");
    // Memory stayed bounded: the refused publishes were never held, the held ones within
    // `PUBLISH_HELD_BYTES_SHARD_MAX` (64 MiB); 2,000 small messages move RSS by far less.
    let rss_after_kib = daemon.memory_kib("VmRSS");
    assert!(rss_after_kib < rss_before_kib + 64 * 1024, "RSS {rss_before_kib} KiB -> {rss_after_kib} KiB");
    // A client that does not retry is refused, and reads the delay to wait. Its publishes go
    // at once, together: ten seconds' worth, of which the shard holds no more than
    // `PUBLISH_HOLD_MAX` (5 s).
    let impatient = daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE);
    let refusal = (0..100)
        .find_map(|_| {
            std::thread::scope(|scope| {
                let publishes: Vec<_> = (0..4)
                    .map(|_| {
                        scope.spawn(|| block_on(impatient.publish("burst", vec![Message::new("x"); 500])))
                    })
                    .collect();
                publishes.into_iter().filter_map(|publish| publish.join().unwrap().err()).next()
            })
        })
        .expect("a burst was never refused");
    let ringpost_client::Error::Status(status) = &refusal else { panic!("{refusal}") };
    assert_eq!(status.code, ErrorCode::ResourceExhausted, "{status}");
    assert!(status.retry_delay().is_some_and(|delay| delay > Duration::ZERO), "{status}");
    // Seen: publishes slowed and refused, by limit; none held now.
    assert!(shard_metric(&daemon, "ringpost_publishes_slowed_total", None) >= 1.0);
    assert!(shard_metric(&daemon, "ringpost_publishes_refused_by_limit_total", Some("messages_rate")) >= 1.0);
    assert_eq!(shard_metric(&daemon, "ringpost_publish_held_bytes", None), 0.0);
    // Every acknowledged publish is delivered (the impatient client's too, when it got through).
    let draining = Instant::now();
    let delivered: HashSet<String> = ringpost_tests::drain(&client, "checker", true)
        .into_values()
        .map(|data| String::from_utf8(data).unwrap())
        .collect();
    eprintln!("drained in {:?}", draining.elapsed());
    let lost: Vec<&String> = acknowledged.iter().filter(|data| !delivered.contains(*data)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged and never delivered, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
}
