//! The monitoring endpoint (`--http-listen`) of a real daemon: `/healthz`, `/readyz` and
//! `/metrics` under load, parsed as Prometheus parses them. Every family a dashboard needs is
//! there with its type; counters only grow; a subscription's backlog and oldest unacknowledged
//! age move as its subscriber falls behind and catches up. (A fenced data directory's gauge
//! and `/readyz` without a quorum of directories are checked in `disks.rs`.)

use ringpost_client::{block_on, Message};
use ringpost_tests::scrape::{http_get, http_request, Scrape};
use ringpost_tests::{create_subscription, Daemon};
use std::time::Duration;

fn scrape(address: &str) -> Scrape {
    let (status, body) = http_get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    Scrape::parse(&body)
}

#[test]
fn metrics_health_and_readiness_follow_a_subscriber_that_falls_behind_and_catches_up() {
    let daemon = Daemon::start_with("monitoring", vec![], vec!["--http-listen".into(), "127.0.0.1:0".into()]);
    let http = daemon.http_address.clone().expect("the ready file names the monitoring endpoint");
    assert_eq!(http_get(&http, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(http_get(&http, "/readyz"), (200, "ready\n".to_owned()));
    assert_eq!(http_get(&http, "/nothing").0, 404);
    assert_eq!(http_request(&http, "POST", "/metrics").0, 405);

    let client = daemon.client();
    block_on(client.create_topic("monitored")).unwrap();
    create_subscription(&client, "monitored-sub", "monitored", 10);
    let publish = |count: usize| {
        for _ in 0..count / 10 {
            let batch = (0..10).map(|i| Message::new(format!("m{i}").as_str())).collect();
            block_on(client.publish("monitored", batch)).unwrap();
        }
    };
    publish(100);
    std::thread::sleep(Duration::from_millis(1100));

    let first = scrape(&http);
    for (family, kind) in [
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("ringpost_build_info", "gauge"),
        ("ringpost_shard_topics", "gauge"),
        ("ringpost_data_directory_fenced", "gauge"),
        ("ringpost_data_directory_repairs", "counter"),
        ("ringpost_publish_ack_latency_window_seconds", "gauge"),
        ("ringpost_commit_latency_window_seconds", "gauge"),
        ("ringpost_topic_offsets", "counter"),
        ("ringpost_topic_stored_bytes", "gauge"),
        ("ringpost_subscription_num_undelivered_messages", "gauge"),
        ("ringpost_subscription_oldest_unacked_message_age_seconds", "gauge"),
        ("ringpost_subscription_outstanding_messages", "gauge"),
        ("ringpost_subscription_delivered_messages", "counter"),
        ("ringpost_subscription_expired_leases", "counter"),
        ("ringpost_metrics_topics_omitted", "gauge"),
        ("ringpost_metrics_subscriptions_omitted", "gauge"),
    ] {
        assert_eq!(first.type_of(family), Some(kind), "{family} in {:?}", first.types);
    }
    let subscription = [("subscription", "monitored-sub"), ("topic", "monitored")];
    assert_eq!(first.value("ringpost_subscription_num_undelivered_messages", &subscription), Some(100.0));
    let oldest =
        first.value("ringpost_subscription_oldest_unacked_message_age_seconds", &subscription).unwrap();
    assert!(oldest >= 1.0, "the oldest unacknowledged message is {oldest} s old after 1.1 s");
    assert_eq!(first.value("ringpost_topic_offsets_total", &[("topic", "monitored")]), Some(100.0));
    assert!(first.value("process_resident_memory_bytes", &[]).unwrap() > 0.0);
    // The shard that serves the topic measured its publishes; the other measured none.
    let p99 = first
        .samples
        .iter()
        .filter(|sample| sample.name == "ringpost_publish_ack_latency_window_seconds")
        .filter(|sample| sample.labels.get("quantile").map(String::as_str) == Some("0.99"))
        .map(|sample| sample.value)
        .fold(0.0, f64::max);
    assert!(p99 > 0.0, "ten publishes and no publish latency");
    for sample in first.samples.iter().filter(|sample| sample.name == "ringpost_data_directory_fenced") {
        assert_eq!(sample.value, 0.0, "{sample:?}");
    }

    // The subscriber falls further behind, then catches up.
    publish(50);
    let behind = scrape(&http);
    assert_eq!(behind.value("ringpost_subscription_num_undelivered_messages", &subscription), Some(150.0));
    let delivered = ringpost_tests::drain(&client, "monitored-sub", true);
    assert_eq!(delivered.len(), 150);
    let caught_up = scrape(&http);
    assert_eq!(caught_up.value("ringpost_subscription_num_undelivered_messages", &subscription), Some(0.0));
    assert_eq!(
        caught_up.value("ringpost_subscription_oldest_unacked_message_age_seconds", &subscription),
        Some(0.0)
    );
    // Counters only grow.
    for sample in first
        .samples
        .iter()
        .filter(|sample| first.type_of(sample.name.trim_end_matches("_total")) == Some("counter"))
    {
        let later = caught_up
            .samples
            .iter()
            .find(|later| later.name == sample.name && later.labels == sample.labels)
            .unwrap_or_else(|| panic!("{sample:?} is gone from a later scrape"));
        assert!(later.value >= sample.value, "{} went from {} to {}", sample.name, sample.value, later.value);
    }
    assert!(
        caught_up.value("ringpost_subscription_delivered_messages_total", &subscription).unwrap() >= 150.0,
        "150 delivered"
    );
}
