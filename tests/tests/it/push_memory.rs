//! What a push subscription may hold when its receiver is slow: the bytes of its pushes
//! outstanding are bounded (`PUSH_SUBSCRIPTION_BYTES_MAX`) whatever its window, so the daemon's
//! memory stays within a budget however much is published, and the window itself shrinks once
//! the answers come slowly.
//!
//! The window is read from the daemon's stats as the subscription's outstanding messages: a
//! push task leases a message for each push it sends and ends the lease with the answer, so its
//! leases are its pushes outstanding, which its window bounds. (While a delivery is read the
//! stream also holds, for a moment, leases of messages beyond its budget in bytes, which it
//! gives back unread: with large messages the count says little about the bytes held, and the
//! test of the budget reads the daemon's memory instead.)

use ringpost_client::{block_on, Client, Message, PushConfig};
use ringpost_daemon::push::task::{PUSH_BODY_BYTES_SHARD_MAX, PUSH_SUBSCRIPTION_BYTES_MAX};
use ringpost_daemon::push::window::PUSH_WINDOW_INITIAL;
use ringpost_tests::push_receiver::Receiver;
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::time::{Duration, Instant};

/// Longer than half the ack deadline (10 s): each answer counts as slow, and halves the window.
const SLOW_ANSWER: Duration = Duration::from_secs(6);
/// Bodies at least this long are the large messages, which the receiver answers slowly.
const SMALL_BODY_BYTES_MAX: usize = 4_096;
const SMALL_BYTES: usize = 100;

/// The messages a subscription's stats count as outstanding: its pushes outstanding.
fn outstanding(client: &Client, subscription: &str) -> u64 {
    let stats = block_on(client.stats()).unwrap();
    stats
        .topics
        .iter()
        .flat_map(|topic| &topic.subscriptions)
        .find(|stats| stats.name == subscription)
        .map_or(0, |stats| stats.outstanding_messages)
}

fn publish(client: &Client, topic: &str, count: usize, bytes: usize, batch: usize) {
    let mut left = count;
    while left > 0 {
        let messages = (0..batch.min(left)).map(|_| Message::new(vec![b'm'; bytes])).collect();
        block_on(client.publish(topic, messages)).unwrap();
        left -= batch.min(left);
    }
}

/// Pushes answered at once up to `fast` requests, then each after `SLOW_ANSWER`.
fn fast_then_slow(fast: usize) -> Receiver {
    Receiver::on_free_port(move |_, before| match before < fast {
        true => (Duration::ZERO, 204),
        false => (SLOW_ANSWER, 204),
    })
}

const LARGE_BYTES: usize = 128 << 10;
/// 125 MiB: eight times the subscription's budget, twice the shard's.
const LARGE_MESSAGES: usize = 1_000;
/// Successes enough to open the window to its ceiling (`PUSH_OUTSTANDING_MAX`), so that only the
/// budget in bytes holds the large pushes back.
const SMALL_MESSAGES: usize = 1_000;
/// What the daemon's resident memory may grow by while the receiver is slow: the bodies of a
/// budget's worth of messages (base64 makes them 4/3 of the data) twice over, for the log's
/// reads behind them and the allocator's slack. Measured in a debug build: +23 MiB; without
/// the subscription's budget (its window of 1,000 pushes then held back only by the shard's
/// budget for bodies), +73 MiB.
const GROWTH_BYTES_MAX: u64 = 2 * PUSH_SUBSCRIPTION_BYTES_MAX * 4 / 3;
// Below the shard's budget, so that the test tells the subscription's budget from the shard's.
const _: () = assert!(GROWTH_BYTES_MAX < PUSH_BODY_BYTES_SHARD_MAX as u64);

#[test]
fn a_slow_receiver_holds_a_push_subscription_to_its_budget_in_bytes() {
    let daemon = Daemon::start_with("push-memory", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = daemon.client();
    // Stored first, pushed after: what publishing costs is in the baseline, not the growth.
    create_topic_and_subscription(&client, "large", "slow", 10);
    publish(&client, "large", SMALL_MESSAGES, SMALL_BYTES, 100);
    publish(&client, "large", LARGE_MESSAGES, LARGE_BYTES, 8);
    let before_kib = daemon.memory_kib("VmRSS:");
    let receiver = Receiver::on_free_port(|seen, _| match seen.body.len() < SMALL_BODY_BYTES_MAX {
        true => (Duration::ZERO, 204),
        false => (SLOW_ANSWER, 204),
    });
    let push = PushConfig { endpoint: receiver.url("/slow"), ..Default::default() };
    block_on(client.modify_push_config("slow", push)).unwrap();

    let started = Instant::now();
    let mut peak_kib = 0;
    // Past the first slow answers (6 s), which open room for as many pushes again.
    while started.elapsed() < Duration::from_secs(9) {
        peak_kib = peak_kib.max(daemon.memory_kib("VmRSS:"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = receiver.seen("/slow");
    let small = seen.iter().filter(|seen| seen.body.len() < SMALL_BODY_BYTES_MAX).count();
    let large = seen.len() - small;
    let growth_kib = peak_kib.saturating_sub(before_kib);
    eprintln!(
        "resident before the pushing {} MiB, peak {} MiB (+{} MiB, bound {} MiB); {small} small pushes answered at once, {large} large ones received",
        before_kib / 1024,
        peak_kib / 1024,
        growth_kib / 1024,
        GROWTH_BYTES_MAX >> 20
    );
    assert!(small >= SMALL_MESSAGES, "the small messages opened the window: {small} answered");
    assert!(large > 0, "the large messages were pushed");
    assert!(growth_kib * 1024 < GROWTH_BYTES_MAX, "resident memory grew by {} MiB", growth_kib / 1024);
}

/// Successes before the receiver turns slow: the window opens to about this many pushes.
const GROWTH_PUSHES: usize = 200;

#[test]
fn a_slow_receiver_shrinks_the_push_window() {
    let daemon = Daemon::start_with("push-window", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = daemon.client();
    let receiver = fast_then_slow(GROWTH_PUSHES);
    create_topic_and_subscription(&client, "events", "shrinking", 10);
    let push = PushConfig { endpoint: receiver.url("/events"), ..Default::default() };
    block_on(client.modify_push_config("shrinking", push)).unwrap();
    publish(&client, "events", GROWTH_PUSHES, SMALL_BYTES, 50);
    let until = Instant::now() + Duration::from_secs(20);
    while receiver.seen("/events").len() < GROWTH_PUSHES && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(receiver.seen("/events").len(), GROWTH_PUSHES, "the fast answers came");

    // Now every answer is slow: the window, open to about GROWTH_PUSHES, is filled at once;
    // the first slow answers (after 6 s) halve it, and the pushes that waited for a connection
    // behind them time out at the ack deadline (10 s), halving it again.
    publish(&client, "events", 2_000, SMALL_BYTES, 100);
    let started = Instant::now();
    let (mut early, mut middle, mut late) = (0, 0, 0);
    while started.elapsed() < Duration::from_secs(14) {
        let now = outstanding(&client, "shrinking");
        match started.elapsed().as_secs_f64() {
            // Before any slow answer.
            elapsed if elapsed < 5.0 => early = early.max(now),
            // After the first slow answers, before the deadline of those waiting behind them.
            elapsed if (7.0..9.5).contains(&elapsed) => middle = middle.max(now),
            // After the deadline.
            elapsed if elapsed > 12.0 => late = late.max(now),
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "pushes outstanding to a slow receiver: at most {early} before the first answer, {middle} after the first slow answers, {late} after the ack deadline"
    );
    assert!(
        early as usize >= GROWTH_PUSHES / 2 + PUSH_WINDOW_INITIAL as usize,
        "the window had opened: {early} outstanding"
    );
    // A window that did not shrink would fill the slots of the answered pushes again at once.
    assert!(middle < early, "the slow answers shrank the window: {early} outstanding, then {middle}");
    assert!(late * 2 <= early, "the timeouts shrank it further: {early} outstanding, then {late}");
}
