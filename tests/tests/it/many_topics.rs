//! W4, many topics (issue 46): topics with one subscription each, publishes spread evenly (ten
//! messages a request, each request to the next topic), then every message pulled and
//! acknowledged, on a daemon whose open-file limit is twice the topics. As with 10,000 topics
//! under 20,000 descriptors, the journals beyond a quarter of the limit close their files
//! between commits and reopen them at the next, and every topic's journal makes its reserve in
//! the background after its first publish while segment collection asks for it too (two of
//! those at once once took a shard down). Nothing acknowledged may be lost, no shard may die (a
//! panic stops the process), and nothing may be logged as failing. `RINGPOST_MANY_TOPICS` sets
//! the topics: 600 by default, 10000 for the full size.

use ringpost_client::{block_on, Client, Message, RetrySettings};
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TOPICS_DEFAULT: usize = 600;
/// The daemon's open-file limit per topic: W4's 20,000 for 10,000 topics.
const OPEN_FILES_PER_TOPIC: u64 = 2;
const MESSAGES_PER_REQUEST: usize = 10;
const REQUESTS_PER_TOPIC: usize = 2;
const MESSAGE_BYTES: usize = 1024;
/// Threads creating topics, publishing, and draining.
const THREADS: usize = 4;
/// Pulls of one subscription that may come back short of its messages before the test gives
/// up on it: they were all acknowledged, so each pull should bring some.
const EMPTY_PULLS_MAX: u32 = 50;

fn topic_count() -> usize {
    std::env::var("RINGPOST_MANY_TOPICS").ok().and_then(|text| text.parse().ok()).unwrap_or(TOPICS_DEFAULT)
}

fn topic_name(index: usize) -> String {
    format!("many-{index:05}")
}

fn subscription_name(index: usize) -> String {
    format!("many-{index:05}-reader")
}

/// A payload naming its topic, request and place, padded to `MESSAGE_BYTES`.
fn payload(topic: usize, request: usize, place: usize) -> Vec<u8> {
    let mut data = format!("{topic}:{request}:{place}:").into_bytes();
    data.resize(MESSAGE_BYTES, b'.');
    data
}

/// The daemon's soft open-file limit, from /proc.
fn open_files_limit(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|line| line.starts_with("Max open files")).unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|entries| entries.count()).unwrap_or(0)
}

/// Runs `work(index)` for every index below `count` on `THREADS` threads.
fn spread(count: usize, work: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return;
                }
                work(index);
            });
        }
    });
}

#[test]
fn many_topics_under_a_descriptor_limit_lose_nothing() {
    let topics = topic_count();
    let limit = OPEN_FILES_PER_TOPIC * topics as u64;
    let mut daemon = Daemon::prepare("many-topics", Vec::new(), vec!["--shards".into(), "2".into()]);
    daemon.open_files_max = Some(limit);
    daemon.spawn();
    let pid = daemon.pid().unwrap();
    assert_eq!(open_files_limit(pid), limit, "the daemon raised its open-file limit: the test needs it kept");
    // Refusals fail the test: none is expected.
    let client: Client = daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE);
    let started = Instant::now();
    spread(topics, |index| {
        create_topic_and_subscription(&client, &topic_name(index), &subscription_name(index), 600)
    });
    println!(
        "{topics} topics and subscriptions created in {:?} (open-file limit {limit})",
        started.elapsed()
    );

    // Publish: request r goes to topic r % topics, as W4 spreads them.
    let started = Instant::now();
    let acknowledged: Vec<Mutex<HashMap<u64, Vec<u8>>>> = (0..topics).map(|_| Mutex::default()).collect();
    spread(topics * REQUESTS_PER_TOPIC, |request| {
        let topic = request % topics;
        let payloads: Vec<Vec<u8>> =
            (0..MESSAGES_PER_REQUEST).map(|place| payload(topic, request, place)).collect();
        let messages = payloads.iter().map(|data| Message::new(data.clone())).collect();
        let ids = block_on(client.publish(&topic_name(topic), messages))
            .unwrap_or_else(|error| panic!("publish {request} to {}: {error}", topic_name(topic)));
        acknowledged[topic].lock().unwrap().extend(ids.into_iter().zip(payloads));
    });
    let published = topics * REQUESTS_PER_TOPIC * MESSAGES_PER_REQUEST;
    println!("{published} messages published in {:?}", started.elapsed());

    // Drain and acknowledge every subscription: every acknowledgement is a journal commit.
    let started = Instant::now();
    let peak_open_files = AtomicUsize::new(0);
    spread(topics, |index| {
        let expected = acknowledged[index].lock().unwrap().clone();
        let mut delivered: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut empty_pulls = 0;
        while delivered.len() < expected.len() {
            let batch = block_on(client.pull(&subscription_name(index), 1000, 100))
                .unwrap_or_else(|error| panic!("pulling {}: {error}", subscription_name(index)));
            if batch.is_empty() {
                empty_pulls += 1;
                assert!(
                    empty_pulls < EMPTY_PULLS_MAX,
                    "{}: {} of {} acknowledged messages delivered",
                    subscription_name(index),
                    delivered.len(),
                    expected.len()
                );
                continue;
            }
            let ack_ids: Vec<String> = batch.iter().map(|message| message.ack_id.clone()).collect();
            delivered.extend(batch.into_iter().map(|message| (message.message_id, message.data)));
            let refused = block_on(client.acknowledge(&subscription_name(index), ack_ids))
                .unwrap_or_else(|error| panic!("acknowledging on {}: {error}", subscription_name(index)));
            assert!(refused.is_empty(), "acknowledgements refused: {:?}", &refused[..refused.len().min(3)]);
        }
        for (id, data) in &expected {
            assert_eq!(delivered.get(id), Some(data), "{} message {id} lost or changed", topic_name(index));
        }
        if index % 50 == 0 {
            peak_open_files.fetch_max(open_files(pid), Ordering::Relaxed);
        }
    });
    println!(
        "every message delivered and acknowledged in {:?}; the daemon held at most {} descriptors of {limit}",
        started.elapsed(),
        peak_open_files.load(Ordering::Relaxed)
    );

    // No shard died (a panic ends the process), and each still serves.
    assert!(daemon.wait_for_exit(Duration::ZERO).is_none(), "the daemon stopped; log:\n{}", daemon.log());
    for index in 0..topics.min(8) {
        block_on(client.publish(&topic_name(index), vec![Message::new("after")]))
            .unwrap_or_else(|error| panic!("publishing to {} at the end: {error}", topic_name(index)));
    }
    let log = daemon.log();
    let failures: Vec<&str> = log
        .lines()
        .filter(|line| {
            line.contains("ERROR") || line.contains("reserving journal space") || line.contains("panicked")
        })
        .collect();
    assert!(failures.is_empty(), "failures logged: {:?}", &failures[..failures.len().min(10)]);
}
