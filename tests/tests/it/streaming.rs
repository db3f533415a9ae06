//! Streaming pull: competing streams share a subscription, each within its flow-control window.

use ringpost_client::{block_on, Client, Message, StreamSettings, Subscription};
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WINDOW_MESSAGES: u64 = 1000;
const ACK_DEADLINE: Duration = Duration::from_secs(10);

/// 200,000 messages drained by 4 streaming subscribers with flow control 1,000 each, acking as
/// they go: every message is delivered, no stream ever has more than its window outstanding,
/// duplicates stay under 1% (and are reported with the server's delivery attempts), and no
/// stream goes an ack deadline without a batch while messages remain.
#[test]
fn four_streams_drain_a_200k_backlog_within_their_windows() {
    const MESSAGES: u64 = 200_000;
    let daemon = Daemon::start("stream-backlog");
    let client = daemon.client();
    create_topic_and_subscription(&client, "backlog", "drain", 10);
    for batch in 0..MESSAGES / 1000 {
        let messages = (batch * 1000..batch * 1000 + 1000).map(|i| Message::new(format!("{i:08}"))).collect();
        block_on(client.publish("backlog", messages)).unwrap();
    }
    let seen: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let redelivered = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let subscribers: Vec<_> = (0..4)
        .map(|_| {
            let (address, seen, redelivered, done) =
                (daemon.address.clone(), seen.clone(), redelivered.clone(), done.clone());
            std::thread::spawn(move || {
                let client = block_on(Client::connect(&address)).unwrap();
                let settings =
                    StreamSettings { max_outstanding_messages: WINDOW_MESSAGES, ..StreamSettings::default() };
                let mut stream = block_on(client.streaming_pull("drain", settings)).unwrap();
                let mut unacked: Vec<String> = Vec::new();
                let mut last_batch = Instant::now();
                let mut outstanding_peak = 0;
                let mut longest_gap = Duration::ZERO;
                while !done.load(Ordering::Relaxed) {
                    // Wait with a bound, so a finished drain lets the thread go.
                    let batch = match ringpost_tests::within(Duration::from_millis(500), stream.next()) {
                        Some(Some(Ok(batch))) => batch,
                        Some(Some(Err(error))) => panic!("stream failed: {error}"),
                        Some(None) => panic!("the server ended the stream"),
                        None => continue,
                    };
                    longest_gap = longest_gap.max(last_batch.elapsed());
                    last_batch = Instant::now();
                    let outstanding = unacked.len() + batch.len();
                    outstanding_peak = outstanding_peak.max(outstanding);
                    assert!(
                        outstanding as u64 <= WINDOW_MESSAGES,
                        "{outstanding} outstanding on a stream of window {WINDOW_MESSAGES}"
                    );
                    {
                        let mut seen = seen.lock().unwrap();
                        for message in &batch {
                            let index: u64 = String::from_utf8_lossy(&message.data).parse().unwrap();
                            *seen.entry(index).or_insert(0) += 1;
                            if message.delivery_attempt > 1 {
                                redelivered.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        if seen.len() as u64 == MESSAGES {
                            done.store(true, Ordering::Relaxed);
                        }
                    }
                    unacked.extend(batch.into_iter().map(|message| message.ack_id));
                    // Acknowledge in chunks, so the window really fills and drains.
                    if unacked.len() >= 500 {
                        let refused =
                            block_on(client.acknowledge("drain", std::mem::take(&mut unacked))).unwrap();
                        assert!(refused.is_empty(), "{refused:?}");
                    }
                }
                if !unacked.is_empty() {
                    let _ = block_on(client.acknowledge("drain", unacked));
                }
                (outstanding_peak, longest_gap)
            })
        })
        .collect();
    let mut peaks = Vec::new();
    for subscriber in subscribers {
        let (peak, gap) = subscriber.join().unwrap();
        assert!(gap < ACK_DEADLINE, "a stream waited {gap:?} for a batch: a stall");
        peaks.push(peak);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as u64, MESSAGES, "every message delivered");
    let duplicates: u64 = seen.values().map(|count| (*count - 1) as u64).sum();
    eprintln!(
        "drained {MESSAGES} in {:?} over 4 streams; outstanding peaks {peaks:?}; {duplicates} duplicates, {} deliveries \
         the server marked as redeliveries (expired deadline or nack)",
        started.elapsed(),
        redelivered.load(Ordering::Relaxed)
    );
    assert!(duplicates * 100 < MESSAGES, "{duplicates} duplicates: over 1%");
    assert!(peaks.iter().all(|peak| *peak > 0), "every stream took part: {peaks:?}");
}

#[test]
fn a_closed_stream_gives_its_messages_back_at_once() {
    let daemon = Daemon::start("stream-close");
    let client = daemon.client();
    create_topic_and_subscription(&client, "handover", "handover-sub", 600);
    block_on(client.publish("handover", (0..10).map(|i| Message::new(format!("m{i}"))).collect())).unwrap();
    let mut stream = block_on(client.streaming_pull("handover-sub", StreamSettings::default())).unwrap();
    let batch = block_on(stream.next()).unwrap().unwrap();
    assert_eq!(batch.len(), 10);
    drop(stream);
    // The lease was 600 s, but the stream is gone: another subscriber gets them now.
    let started = Instant::now();
    let mut again = 0;
    while again < 10 && started.elapsed() < Duration::from_secs(5) {
        again += block_on(client.pull("handover-sub", 100, 1000)).unwrap().len();
    }
    assert_eq!(again, 10);
    assert_eq!(
        block_on(client.streaming_pull("missing-sub", StreamSettings::default())).err().unwrap().code(),
        ringpost_client::ErrorCode::NotFound
    );
}

#[test]
fn cli_pull_stream_follows_the_subscription() {
    let daemon = Daemon::start("cli-stream");
    ringpost_tests::succeeded(&daemon.cli(&["topic", "create", "follow"]));
    ringpost_tests::succeeded(&daemon.cli(&["sub", "create", "follower", "--topic", "follow"]));
    let mut child = std::process::Command::new(ringpost_tests::binary("ringpost"))
        .args(["--server", &daemon.address, "pull", "follower", "--stream", "--ack", "--max", "50"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().take(3).map(|line| line.unwrap()).collect::<Vec<String>>()
    });
    std::thread::sleep(Duration::from_millis(300));
    ringpost_tests::succeeded(&daemon.cli(&["publish", "follow", "one", "two", "three"]));
    let lines = reader.join().unwrap();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].contains("\"data\":\"one\"") && lines[2].contains("\"data\":\"three\""), "{lines:?}");
    // The CLI acknowledges after printing: the backlog drains to zero while it still runs.
    let client = daemon.client();
    let started = Instant::now();
    let backlog = || block_on(client.stats()).unwrap().topics[0].subscriptions[0].backlog_messages;
    while backlog() > 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(backlog(), 0, "the streamed messages were acknowledged");
    let _ = child.kill();
    let _ = child.wait();
}

/// Deleting a subscription ends its open streams and waiting pulls with NotFound, as Pub/Sub
/// does, rather than leaving them waiting on a subscription nothing delivers to again (they
/// used to: a stream opened before the deletion got nothing, not even for a new subscription
/// of the same name, and never ended). Deleting the topic does the same to its subscriptions'.
#[test]
fn deleting_a_subscription_or_its_topic_ends_its_streams_and_pulls() {
    let daemon = Daemon::start("stream-deleted");
    let client = daemon.client();
    // The next item of a stream, given 10 s: an open stream that never ends fails the test
    // instead of hanging it.
    let not_found = |stream: &mut ringpost_client::MessageStream| {
        let next = ringpost_tests::within(Duration::from_secs(10), stream.next());
        match next {
            Some(Some(Err(error))) => {
                assert_eq!(error.code(), ringpost_client::ErrorCode::NotFound, "{error}")
            }
            None => panic!("the stream is still open 10 s after the deletion"),
            Some(other) => panic!("expected NotFound, got {other:?}"),
        }
    };
    block_on(client.create_topic("doomed")).unwrap();
    for name in ["streamed", "pulled", "topic-streamed"] {
        block_on(client.create_subscription(Subscription {
            name: name.into(),
            topic: "doomed".into(),
            ..Default::default()
        }))
        .unwrap();
    }
    block_on(client.publish("doomed", vec![Message::new("first")])).unwrap();
    let mut stream = block_on(client.streaming_pull("streamed", StreamSettings::default())).unwrap();
    assert_eq!(block_on(stream.next()).unwrap().unwrap().len(), 1);
    let mut topic_stream =
        block_on(client.streaming_pull("topic-streamed", StreamSettings::default())).unwrap();
    assert_eq!(block_on(topic_stream.next()).unwrap().unwrap().len(), 1);
    assert_eq!(block_on(client.pull("pulled", 10, 0)).unwrap().len(), 1);
    // A pull that waits (up to 30 s) for the next message, from another connection.
    let address = daemon.address.clone();
    let waiting = std::thread::spawn(move || {
        let client = block_on(Client::connect(&address)).unwrap();
        block_on(client.pull("pulled", 10, 30_000))
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    block_on(client.delete_subscription("streamed")).unwrap();
    block_on(client.delete_subscription("pulled")).unwrap();
    not_found(&mut stream);
    match waiting.join().unwrap() {
        Err(error) => assert_eq!(error.code(), ringpost_client::ErrorCode::NotFound, "{error}"),
        Ok(messages) => panic!("the waiting pull returned {} messages", messages.len()),
    }
    block_on(client.delete_topic("doomed")).unwrap();
    not_found(&mut topic_stream);
    // Well before any periodic look: the deletion itself ends them.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}
