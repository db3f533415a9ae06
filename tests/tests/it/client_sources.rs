//! The native client over a topic of two publish sources (one on each of the daemon's two
//! shards): the publisher spreads its requests over both, a subscriber gathers from both under
//! one flow-control window, and each acknowledgement goes to the source its ack id names.

use ringpost_client::{
    block_on, Message, Publisher, PublisherSettings, ShutdownMode, Subscriber, SubscriberSettings,
    Subscription,
};
use ringpost_tests::{json_field, succeeded, Daemon};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The source a message id names (the bits above its offset).
fn source_of(message_id: u64) -> u64 {
    message_id >> 52
}

/// The source an ack id names: `v1.<subscription>.<source>.<offset>.<generation>`.
fn source_of_ack_id(ack_id: &str) -> u64 {
    u64::from_str_radix(ack_id.split('.').nth(2).expect("a v1 ack id"), 16).unwrap()
}

const MESSAGES: usize = 2000;
const ORDERING_KEYS: usize = 20;
const OUTSTANDING_MAX: u64 = 10;
/// Long enough to tell a frozen subscriber from a working one on a loaded machine.
const QUIET: Duration = Duration::from_secs(1);
const RECEIVE_WITHIN: Duration = Duration::from_secs(60);

/// One of `field`'s values in `ringpost stats`' lines of `prefix` for source `source`.
fn stat(json: &str, prefix: &str, source: u64, field: &str) -> u64 {
    let line = json
        .lines()
        .find(|line| line.starts_with(prefix) && line.contains(&format!("\"source\":{source},")))
        .unwrap_or_else(|| panic!("no {prefix} line of source {source}: {json}"));
    json_field(line, field).parse().unwrap()
}

/// The native Publisher's 2,000 messages, half with 20 ordering keys, land on both sources
/// (ids and `ringpost stats` per source); one Subscriber with a window of 10 receives every
/// one exactly once, each key's in order, never holding more than 10 across both sources; its
/// acknowledgements, each sent to its source, leave both sources' backlogs empty, and nothing is
/// delivered again. Without the gathering, the subscriber gets source 0's messages alone.
#[test]
fn a_publisher_spreads_over_two_sources_and_a_subscriber_gathers_them_exactly_once_in_key_order() {
    let daemon = Daemon::start("client-sources");
    succeeded(&daemon.cli(&["topic", "create", "spread", "--sources", "2"]));
    let client = Arc::new(daemon.client());
    block_on(client.create_subscription(Subscription {
        name: "spread-all".into(),
        topic: "spread".into(),
        ack_deadline_seconds: 60,
        enable_message_ordering: true,
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(block_on(client.topic_sources("spread")).unwrap(), (2, 2));

    let publisher = Publisher::new(client.clone(), "spread", PublisherSettings::default()).unwrap();
    let futures: Vec<_> = (0..MESSAGES)
        .map(|index| {
            let message = Message::new(index.to_string());
            let message = match index % 2 {
                0 => message.ordering_key(format!("key-{}", (index / 2) % ORDERING_KEYS)),
                _ => message,
            };
            publisher.publish(message)
        })
        .collect();
    let ids: Vec<u64> = futures.into_iter().map(|future| block_on(future).unwrap()).collect();
    block_on(publisher.shutdown());
    let mut per_source = [0usize; 2];
    for id in &ids {
        per_source[source_of(*id) as usize] += 1;
    }
    assert!(per_source.iter().all(|count| *count > MESSAGES / 10), "{per_source:?}");
    let json = succeeded(&daemon.cli(&["stats"]));
    for (source, count) in per_source.iter().enumerate() {
        assert_eq!(stat(&json, "{\"topic\":\"spread\",\"shard\"", source as u64, "messages"), *count as u64);
    }

    let settings = SubscriberSettings { max_outstanding_messages: OUTSTANDING_MAX, ..Default::default() };
    let subscriber = Subscriber::new(client.clone(), "spread-all", settings).unwrap();
    // First the window: held unsettled, the subscriber gets 10 messages from both sources (5
    // each) and no more.
    let mut held = Vec::new();
    loop {
        let next = block_on(ringpost_client::timer::run_until(Instant::now() + QUIET, subscriber.next()));
        match next {
            Some(Some(delivered)) => held.push(delivered.unwrap()),
            Some(None) => panic!("the subscriber stopped: {:?}", block_on(subscriber.stopped())),
            None => break,
        }
    }
    assert_eq!(held.len() as u64, OUTSTANDING_MAX, "the window over both sources");
    let sources: HashSet<u64> = held.iter().map(|(message, _)| source_of_ack_id(&message.ack_id)).collect();
    assert_eq!(sources.len(), 2, "both sources' streams share the window");

    let mut seen: HashSet<usize> = HashSet::new();
    let last_of_key: std::cell::RefCell<HashMap<String, usize>> = Default::default();
    let mut most_held = 0;
    let take = |seen: &mut HashSet<usize>, message: &ringpost_client::ReceivedMessage| {
        let index: usize = String::from_utf8(message.data.clone()).unwrap().parse().unwrap();
        assert!(seen.insert(index), "message {index} delivered twice");
        let key = &message.ordering_key;
        if !key.is_empty() {
            if let Some(last) = last_of_key.borrow_mut().insert(key.clone(), index) {
                assert!(last < index, "key {key}: {index} after {last}");
            }
        }
    };
    for (message, handle) in held.drain(..) {
        take(&mut seen, &message);
        handle.ack();
    }
    let started = Instant::now();
    while seen.len() < MESSAGES {
        assert!(started.elapsed() < RECEIVE_WITHIN, "{} of {MESSAGES} received", seen.len());
        most_held = most_held.max(subscriber.stats().held);
        let next =
            block_on(ringpost_client::timer::run_until(Instant::now() + RECEIVE_WITHIN, subscriber.next()));
        let (message, handle) = next.expect("a message within the bound").expect("running").unwrap();
        take(&mut seen, &message);
        handle.ack();
    }
    assert!(most_held <= OUTSTANDING_MAX, "{most_held} held at once");
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    let stats = subscriber.stats();
    assert_eq!((stats.received, stats.acked, stats.refused), (MESSAGES as u64, MESSAGES as u64, 0));

    // Every acknowledgement reached its source: nothing is left to deliver on either.
    let json = succeeded(&daemon.cli(&["stats"]));
    for source in 0..2 {
        assert_eq!(stat(&json, "{\"topic\":\"spread\",\"subscription\"", source, "backlog"), 0, "{json}");
    }
    assert!(block_on(client.pull("spread-all", 100, 0)).unwrap().is_empty());
}

/// Unary requests over two sources: unordered publishes take turns, a pull asks both sources
/// and gathers their messages, one acknowledgement of ack ids of both sources acknowledges each
/// on its own, and a nack redelivers on its source.
#[test]
fn unary_publish_pull_and_acknowledge_reach_each_source() {
    let daemon = Daemon::start("client-sources-unary");
    succeeded(&daemon.cli(&["topic", "create", "turns", "--sources", "2"]));
    let client = daemon.client();
    ringpost_tests::create_subscription(&client, "turns-sub", "turns", 30);
    let mut sources = HashSet::new();
    for index in 0..4 {
        let ids = block_on(client.publish("turns", vec![Message::new(format!("m{index}"))])).unwrap();
        sources.insert(source_of(ids[0]));
    }
    assert_eq!(sources.len(), 2, "unordered publishes take turns over both sources");

    let mut received = Vec::new();
    let started = Instant::now();
    while received.len() < 4 {
        assert!(started.elapsed() < RECEIVE_WITHIN, "{} of 4 pulled", received.len());
        received.extend(block_on(client.pull("turns-sub", 10, 500)).unwrap());
    }
    assert_eq!(received.len(), 4);
    let by_source: HashSet<u64> = received.iter().map(|message| source_of_ack_id(&message.ack_id)).collect();
    assert_eq!(by_source.len(), 2, "the pull gathered both sources");

    // Nack one of each source, acknowledge the rest in one call: the nacked come back, alone.
    let (nacked, acked): (Vec<_>, Vec<_>) = received.iter().enumerate().partition(|(index, message)| {
        let source = source_of_ack_id(&message.ack_id);
        received[..*index].iter().all(|earlier| source_of_ack_id(&earlier.ack_id) != source)
    });
    let ids = |messages: &[(usize, &ringpost_client::ReceivedMessage)]| {
        messages.iter().map(|(_, message)| message.ack_id.clone()).collect::<Vec<_>>()
    };
    assert!(block_on(client.acknowledge("turns-sub", ids(&acked))).unwrap().is_empty());
    assert!(block_on(client.nack("turns-sub", ids(&nacked))).unwrap().is_empty());
    let mut again = Vec::new();
    let started = Instant::now();
    while again.len() < 2 {
        assert!(started.elapsed() < RECEIVE_WITHIN, "{} of 2 redelivered", again.len());
        again.extend(block_on(client.pull("turns-sub", 10, 500)).unwrap());
    }
    let mut redelivered: Vec<Vec<u8>> = again.iter().map(|message| message.data.clone()).collect();
    let mut expected: Vec<Vec<u8>> = nacked.iter().map(|(_, message)| message.data.clone()).collect();
    redelivered.sort();
    expected.sort();
    assert_eq!(redelivered, expected);
    let all: Vec<String> = again.iter().map(|message| message.ack_id.clone()).collect();
    assert!(block_on(client.acknowledge("turns-sub", all)).unwrap().is_empty());
    assert!(block_on(client.pull("turns-sub", 10, 300)).unwrap().is_empty());
}

/// A push subscription of a topic of two sources pushes every message: each source's shard
/// pushes its own, so the publisher's spread messages all reach the endpoint, and every
/// source's backlog empties as the pushes succeed.
#[test]
fn a_push_subscription_of_two_sources_pushes_every_message() {
    use ringpost_client::PushConfig;
    use ringpost_tests::push_receiver::Receiver;
    const PUSHED: usize = 40;
    let daemon = Daemon::start("client-sources-push");
    succeeded(&daemon.cli(&["topic", "create", "pushed", "--sources", "2"]));
    let client = daemon.client();
    let receiver =
        Receiver::start(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), |_, _| (Duration::ZERO, 200));
    let subscription = Subscription {
        name: "pushed-out".into(),
        topic: "pushed".into(),
        ack_deadline_seconds: 10,
        ..Default::default()
    };
    let push = PushConfig { endpoint: receiver.url("/in"), no_wrapper: true, ..Default::default() };
    block_on(client.create_subscription_with_push(subscription, push)).unwrap();
    let mut sources = HashSet::new();
    for index in 0..PUSHED {
        let ids = block_on(client.publish("pushed", vec![Message::new(index.to_string())])).unwrap();
        sources.insert(source_of(ids[0]));
    }
    assert_eq!(sources.len(), 2, "the publishes spread over both sources");
    let started = Instant::now();
    let distinct = || {
        let bodies: HashSet<Vec<u8>> = receiver.seen("/in").into_iter().map(|seen| seen.body).collect();
        bodies.len()
    };
    while distinct() < PUSHED && started.elapsed() < RECEIVE_WITHIN {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(distinct(), PUSHED, "every message of both sources pushed");
    let started = Instant::now();
    loop {
        let json = succeeded(&daemon.cli(&["stats"]));
        let backlogs: Vec<u64> = (0..2)
            .map(|source| stat(&json, "{\"topic\":\"pushed\",\"subscription\"", source, "backlog"))
            .collect();
        if backlogs == [0, 0] {
            break;
        }
        assert!(started.elapsed() < RECEIVE_WITHIN, "backlogs {backlogs:?} after the pushes");
        std::thread::sleep(Duration::from_millis(200));
    }
}
