//! T1 (docs/TESTING.md): SIGKILL the real daemon at random moments while 4 publishers publish
//! and 2 subscribers pull and acknowledge; restart; repeat; then drain and check the history
//! with total-queue semantics. Zero acknowledged publishes may be lost and nothing may be
//! delivered that was never published.
//!
//! `RINGPOST_T1_ITERATIONS` sets the number of kills (default 20); `RINGPOST_TEST_SEED` replays
//! a run's kill times.

use ringpost_client::{block_on, Client, Message, RetrySettings};
use ringpost_tests::checker::{Checker, Outcome};
use ringpost_tests::{create_topic_and_subscription, Daemon, Random};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const PUBLISHERS: usize = 4;
const SUBSCRIBERS: usize = 2;
const MESSAGES_PER_PUBLISH: u64 = 10;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// Pause between a publisher's requests: the test is about crash safety, not volume, and an
/// unpaced run builds a backlog that takes minutes to drain on two cores.
const PUBLISH_PAUSE: Duration = Duration::from_millis(5);

/// A client of the daemon's current address that returns every failure at once: the default
/// retries would keep calling the killed daemon's ports for many seconds, and the load would
/// stop at the first kill instead of going on across all of them.
fn connect(address: &RwLock<String>) -> Option<Client> {
    let address = address.read().unwrap().clone();
    let client = block_on(Client::connect(&address)).ok()?;
    Some(client.with_retry(RetrySettings::NONE, RetrySettings::NONE))
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_publish() {
    let iterations: u32 =
        std::env::var("RINGPOST_T1_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(20);
    sigkill_under_load(&mut Daemon::start("t1"), iterations);
}

/// T1 with the smallest segments the daemon takes (64 KiB): the topic rolls every few dozen
/// publishes and deletes what was acknowledged right after, so most segments are recycled
/// files (`LogConfig::recycle`) holding an earlier segment's batches past their own, and most
/// kills land with one such segment open, closed ones behind it, or a rename in flight.
#[test]
fn sigkill_under_load_with_recycled_segments_loses_nothing() {
    let iterations: u32 =
        std::env::var("RINGPOST_T1_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(10);
    let small_segments = vec!["--segment-bytes-max".to_string(), "65536".to_string()];
    let mut daemon = Daemon::start_with("t1-recycled", Vec::new(), small_segments);
    sigkill_under_load(&mut daemon, iterations);
    let data = daemon.data_dirs[0].clone();
    // The run recycled: a kept file is waiting for the next roll once everything was
    // acknowledged and collected (the sweep runs every 5 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    while !holds_a_file_named(&data, "recycle.tmp") {
        assert!(
            Instant::now() < deadline,
            "no deleted segment was kept for recycling: {:?}",
            files_under(&data)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn files_under(directory: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(directory).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push((path, entry.metadata().map(|metadata| metadata.len()).unwrap_or(0)));
        }
    }
    files
}

fn holds_a_file_named(directory: &std::path::Path, name: &str) -> bool {
    std::fs::read_dir(directory).into_iter().flatten().flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            holds_a_file_named(&path, name)
        } else {
            entry.file_name() == name
        }
    })
}

fn sigkill_under_load(daemon: &mut Daemon, iterations: u32) {
    let mut random = Random::from_time();
    {
        let client = daemon.client();
        create_topic_and_subscription(&client, "crash-topic", "crash-sub", 10);
    }
    let address = Arc::new(RwLock::new(daemon.address.clone()));
    let checker = Arc::new(Checker::new());
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let stop_subscribing = Arc::new(AtomicBool::new(false));
    let acked_deliveries = Arc::new(AtomicU64::new(0));
    // Payloads whose acknowledgement took effect (durably, the server says, for every ack id it
    // does not list as refused), and any of them delivered again after that: the kills must not
    // bring an acknowledged message back.
    let durably_acked = Arc::new(Mutex::new(HashSet::<String>::new()));
    let delivered_after_ack = Arc::new(Mutex::new(Vec::<String>::new()));

    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|publisher| {
            let (address, checker, stop) = (address.clone(), checker.clone(), stop_publishing.clone());
            std::thread::spawn(move || {
                let mut sequence = 0u64;
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&address)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let payloads: Vec<String> = (sequence..sequence + MESSAGES_PER_PUBLISH)
                        .map(|s| format!("p{publisher}-{s}"))
                        .collect();
                    sequence += MESSAGES_PER_PUBLISH;
                    std::thread::sleep(PUBLISH_PAUSE);
                    let messages = payloads.iter().map(|p| Message::new(p.as_str())).collect();
                    match block_on(connected.publish("crash-topic", messages)) {
                        Ok(ids) => {
                            assert_eq!(ids.len(), payloads.len());
                            payloads.iter().for_each(|p| checker.published(p, Outcome::Ok));
                            client = Some(connected);
                        }
                        Err(error) => {
                            let outcome = Outcome::of_error(&error);
                            assert_ne!(outcome, Outcome::Failed, "unexpected refusal: {error}");
                            payloads.iter().for_each(|p| checker.published(p, outcome));
                        }
                    }
                }
            })
        })
        .collect();

    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let (address, checker, stop, acked) =
                (address.clone(), checker.clone(), stop_subscribing.clone(), acked_deliveries.clone());
            let (durably_acked, delivered_after_ack) = (durably_acked.clone(), delivered_after_ack.clone());
            std::thread::spawn(move || {
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&address)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let messages = match block_on(connected.pull("crash-sub", 200, 300)) {
                        Ok(messages) => messages,
                        Err(_) => continue,
                    };
                    let mut ack_ids = Vec::with_capacity(messages.len());
                    let mut payloads = Vec::with_capacity(messages.len());
                    for message in messages {
                        let payload = String::from_utf8(message.data).expect("payloads are UTF-8");
                        checker.delivered(&payload, message.delivery_attempt);
                        if durably_acked.lock().unwrap().contains(&payload) {
                            delivered_after_ack.lock().unwrap().push(payload.clone());
                        }
                        ack_ids.push(message.ack_id);
                        payloads.push(payload);
                    }
                    if !ack_ids.is_empty() {
                        let count = ack_ids.len() as u64;
                        match block_on(connected.acknowledge("crash-sub", ack_ids.clone())) {
                            Ok(refused) => {
                                acked.fetch_add(count, Ordering::Relaxed);
                                let refused: HashSet<&str> =
                                    refused.iter().map(|invalid| invalid.ack_id.as_str()).collect();
                                let mut durable = durably_acked.lock().unwrap();
                                for (ack_id, payload) in ack_ids.iter().zip(payloads) {
                                    if !refused.contains(ack_id.as_str()) {
                                        durable.insert(payload);
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

    for _ in 0..iterations {
        std::thread::sleep(Duration::from_millis(random.between(200, 2000)));
        let restart_started = Instant::now();
        daemon.restart();
        let restart_took = restart_started.elapsed();
        if restart_took > Duration::from_secs(2) {
            eprintln!("T1: a restart took {restart_took:?}");
        }
        *address.write().unwrap() = daemon.address.clone();
    }
    std::thread::sleep(Duration::from_millis(500));
    stop_publishing.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.join().unwrap();
    }
    let drain_started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let missing = checker.missing().len();
        if missing == 0 || drain_started.elapsed() >= DRAIN_TIMEOUT {
            eprintln!(
                "T1: drain took {:?}, {missing} acknowledged publishes still missing",
                drain_started.elapsed()
            );
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!("T1: draining, {missing} acknowledged publishes not delivered yet");
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop_subscribing.store(true, Ordering::Relaxed);
    for subscriber in subscribers {
        subscriber.join().unwrap();
    }
    let verdict = checker.verdict();
    eprintln!("T1: {} kills, {}", daemon.starts() - 1, verdict.summary());
    assert!(verdict.acknowledged > 0, "no publish was ever acknowledged: the test proved nothing");
    assert!(
        verdict.lost.is_empty(),
        "{} acknowledged publishes lost, by producer: {:?}",
        verdict.lost.len(),
        checker.lost_by_producer(&verdict.lost)
    );
    assert!(verdict.unexpected.is_empty(), "delivered but never published: {:?}", verdict.unexpected);
    assert!(verdict.failed_but_delivered.is_empty());
    let delivered_after_ack = delivered_after_ack.lock().unwrap();
    eprintln!(
        "T1: {} deliveries acknowledged durably; {} of them delivered again after their acknowledgement",
        durably_acked.lock().unwrap().len(),
        delivered_after_ack.len()
    );
    assert!(delivered_after_ack.is_empty(), "acknowledged, then delivered again: {:?}", *delivered_after_ack);
}
