//! Push subscriptions delivering to HTTP receivers started by the test, on the real daemon
//! configured over gRPC: wrapped and unwrapped requests field for field, success statuses
//! acknowledging, failures (500, 400, a refused connection, a receiver slower than the ack
//! deadline) retried with the policy's backoff and dead-lettered after the maximum, a receiver
//! down then back getting everything with ordering keys in order, and a subscription switched to
//! pull no longer pushed.

use crate::grpc_admin::grpc_daemon;
use ringpost_tests::grpc::{pubsub, subscription_path, topic_path, Grpc};
use ringpost_tests::push_receiver::{Receiver, Seen};
use ringpost_tests::{json_field, succeeded, Daemon};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use pubsub::push_config::{AuthenticationMethod, NoWrapper, OidcToken, Wrapper};

fn push_subscription(name: &str, topic: &str, endpoint: String) -> pubsub::Subscription {
    pubsub::Subscription {
        name: subscription_path(name),
        topic: topic_path(topic),
        push_config: Some(pubsub::PushConfig { push_endpoint: endpoint, ..Default::default() }),
        ack_deadline_seconds: 10,
        ..Default::default()
    }
}

/// A JSON string field's value in a body without escapes in it.
pub(crate) fn field<'a>(json: &'a str, name: &str) -> &'a str {
    let start =
        json.find(&format!("\"{name}\":\"")).unwrap_or_else(|| panic!("{name} in {json}")) + name.len() + 4;
    &json[start..start + json[start..].find('"').unwrap()]
}

/// `2026-12-06T10:00:00.123Z`: RFC 3339 in UTC with milliseconds.
fn is_rfc3339_with_milliseconds(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 24
        && bytes[4] == b'-'
        && bytes[10] == b'T'
        && bytes[19] == b'.'
        && bytes[23] == b'Z'
        && text[..4].parse::<u32>().is_ok_and(|year| year >= 2020)
}

/// Makes `name` pull, then pulls what it holds: what was pushed and not acknowledged comes back
/// at once (the push task's leases are given back as it stops).
fn switch_to_pull_and_pull(grpc: &Grpc, name: &str) -> Vec<pubsub::ReceivedMessage> {
    grpc.modify_push_config(pubsub::ModifyPushConfigRequest {
        subscription: subscription_path(name),
        push_config: Some(pubsub::PushConfig::default()),
    })
    .unwrap();
    let mut received = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        received.extend(grpc.pull_now(name, 100).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    received
}

#[test]
fn pushes_arrive_wrapped_and_unwrapped_field_for_field_and_success_acknowledges() {
    let (_daemon, grpc) = grpc_daemon("push-bodies");
    let receiver =
        Receiver::on_free_port(|seen, _| (Duration::ZERO, if seen.path == "/raw" { 204 } else { 200 }));
    grpc.create_plain_topic("orders").unwrap();
    let mut wrapped = push_subscription("wrapped", "orders", receiver.url("/wrapped"));
    wrapped.enable_message_ordering = true;
    grpc.create_subscription(wrapped).unwrap();
    let mut raw = push_subscription("raw", "orders", receiver.url("/raw"));
    raw.push_config.as_mut().unwrap().wrapper = Some(Wrapper::NoWrapper(NoWrapper { write_metadata: true }));
    grpc.create_subscription(raw).unwrap();
    let mut signed = push_subscription("signed", "orders", receiver.url("/signed"));
    signed.push_config.as_mut().unwrap().authentication_method =
        Some(AuthenticationMethod::OidcToken(OidcToken {
            service_account_email: "pusher@project.iam.example".into(),
            audience: String::new(),
        }));
    grpc.create_subscription(signed).unwrap();
    let message = pubsub::PubsubMessage {
        data: b"hello".to_vec().into(),
        attributes: [("colour".to_owned(), "red".to_owned())].into(),
        ordering_key: "k1".into(),
        ..Default::default()
    };
    let published = grpc
        .publish(pubsub::PublishRequest { topic: topic_path("orders"), messages: vec![message] })
        .unwrap();
    let id = &published.message_ids[0];

    let wrapped = receiver.wait_for("/wrapped", 1, Duration::from_secs(10));
    assert_eq!(wrapped.len(), 1, "the wrapped push arrived");
    let body = wrapped[0].text();
    let time = field(&body, "publishTime");
    assert!(is_rfc3339_with_milliseconds(time), "{time}");
    let expected = format!(
        "{{\"message\":{{\"attributes\":{{\"colour\":\"red\"}},\"data\":\"aGVsbG8=\",\"messageId\":\"{id}\",\
         \"message_id\":\"{id}\",\"publishTime\":\"{time}\",\"publish_time\":\"{time}\",\"orderingKey\":\"k1\"}},\
         \"subscription\":\"projects/test-project/subscriptions/wrapped\"}}"
    );
    assert_eq!(body, expected);
    assert_eq!(wrapped[0].header("content-type"), Some("application/json"));

    let raw = receiver.wait_for("/raw", 1, Duration::from_secs(10));
    assert_eq!(raw.len(), 1, "the unwrapped push arrived");
    assert_eq!(raw[0].body, b"hello");
    assert_eq!(
        raw[0].header("x-goog-pubsub-subscription-name"),
        Some("projects/test-project/subscriptions/raw")
    );
    assert_eq!(raw[0].header("x-goog-pubsub-message-id"), Some(id.as_str()));
    assert_eq!(raw[0].header("x-goog-pubsub-publish-time"), Some(time));
    assert_eq!(raw[0].header("x-goog-pubsub-ordering-key"), Some("k1"));
    assert_eq!(raw[0].header("colour"), Some("red"));
    assert_eq!(raw[0].header("x-goog-pubsub-delivery-attempt"), None, "no dead-letter policy");

    // With an OIDC token, a JWT signed by the daemon, claiming the service account, for the
    // endpoint's URL (the audience left empty).
    let signed = receiver.wait_for("/signed", 1, Duration::from_secs(10));
    assert_eq!(signed.len(), 1, "the signed push arrived");
    let bearer = signed[0].header("authorization").expect("an Authorization header");
    let jwt = bearer.strip_prefix("Bearer ").expect("a bearer token");
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "{jwt}");
    let claims = String::from_utf8(decode_base64(parts[1])).unwrap();
    assert!(claims.contains("\"email\":\"pusher@project.iam.example\""), "{claims}");
    assert!(claims.contains(&format!("\"aud\":\"{}\"", receiver.url("/signed"))), "{claims}");

    // 200 and 204 acknowledged: switched to pull, neither subscription has it to give.
    assert!(switch_to_pull_and_pull(&grpc, "wrapped").is_empty());
    assert!(switch_to_pull_and_pull(&grpc, "raw").is_empty());
    assert!(switch_to_pull_and_pull(&grpc, "signed").is_empty());
    let pushed = ["/wrapped", "/raw", "/signed"].map(|path| receiver.seen(path).len());
    assert_eq!(pushed, [1, 1, 1], "nothing pushed twice");
}

#[test]
fn failures_are_retried_with_the_policys_backoff_and_dead_lettered_after_the_maximum() {
    let daemon = Daemon::start_with(
        "push-failures",
        Vec::new(),
        ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"].map(String::from).to_vec(),
    );
    let grpc = Grpc::connect(&daemon.grpc_address.clone().expect("the gRPC API's address"));
    let receiver =
        Receiver::on_free_port(|seen, _| (Duration::ZERO, if seen.path == "/400" { 400 } else { 500 }));
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = format!("http://127.0.0.1:{}/refused", closed.local_addr().unwrap().port());
    drop(closed);
    grpc.create_plain_topic("jobs").unwrap();
    grpc.create_plain_topic("dead").unwrap();
    grpc.create_plain_subscription("dead-reader", "dead").unwrap();
    for (name, endpoint) in
        [("failing", receiver.url("/500")), ("refusing", receiver.url("/400")), ("unreachable", refused)]
    {
        let mut subscription = push_subscription(name, "jobs", endpoint);
        subscription.retry_policy = Some(pubsub::RetryPolicy {
            minimum_backoff: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
            maximum_backoff: Some(prost_types::Duration { seconds: 2, nanos: 0 }),
        });
        subscription.dead_letter_policy = Some(pubsub::DeadLetterPolicy {
            dead_letter_topic: topic_path("dead"),
            max_delivery_attempts: 5,
        });
        grpc.create_subscription(subscription).unwrap();
    }
    grpc.publish_data("jobs", &[b"work"]).unwrap();

    // Each subscription's copy ends in the dead-letter topic after its five attempts.
    let mut dead = Vec::new();
    let until = Instant::now() + Duration::from_secs(40);
    while dead.len() < 3 && Instant::now() < until {
        for message in grpc.pull_now("dead-reader", 10).unwrap() {
            grpc.acknowledge(pubsub::AcknowledgeRequest {
                subscription: subscription_path("dead-reader"),
                ack_ids: vec![message.ack_id.clone()],
            })
            .unwrap();
            dead.push(message);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(dead.len(), 3, "each subscription's copy dead-lettered");
    for path in ["/500", "/400"] {
        let seen = receiver.seen(path);
        assert_eq!(seen.len(), 5, "{path}: five attempts");
        for (attempt, request) in seen.iter().enumerate() {
            let body = request.text();
            assert!(body.ends_with(&format!(",\"deliveryAttempt\":{}}}", attempt + 1)), "{body}");
        }
        // The policy's backoff after failed attempt n: 1 s, then 2 s (its maximum); the bounds
        // tell a waiting daemon from one retrying at once or stuck, on a loaded machine.
        for (pair, seconds) in seen.windows(2).zip([1.0, 2.0, 2.0, 2.0]) {
            let waited = (pair[1].at - pair[0].at).as_secs_f64();
            assert!(
                waited >= seconds * 0.9 && waited < seconds + 5.0,
                "{path}: waited {waited} s, expected {seconds} s"
            );
        }
    }
    // The monitoring endpoint counts them by class, with their latency.
    let (status, metrics) = ringpost_tests::scrape::http_get(
        daemon.http_address.as_ref().expect("the monitoring endpoint"),
        "/metrics",
    );
    assert_eq!(status, 200);
    for class in ["4xx", "5xx", "connection_error"] {
        let line = format!("ringpost_push_requests_total{{class=\"{class}\"}} 5");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("ringpost_push_latency_seconds_count 15"), "{metrics}");
}

/// How long the receiver of `a_receiver_down_then_back_gets_everything_with_its_keys_in_order`
/// is down, in seconds, unless `RINGPOST_PUSH_OUTAGE_SECONDS` says otherwise: long enough in CI
/// for the window to fall to its floor and the pushing to pause; the figure, 30, takes
/// the pause to its longest (`PUSH_PAUSE_MAX`, 10 s) and keeps it there.
const OUTAGE_SECONDS_DEFAULT: u64 = 3;

fn outage_seconds() -> u64 {
    std::env::var("RINGPOST_PUSH_OUTAGE_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(OUTAGE_SECONDS_DEFAULT)
}

#[test]
fn a_receiver_down_then_back_gets_everything_with_its_keys_in_order() {
    let (daemon, grpc) = grpc_daemon("push-down-then-back");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    grpc.create_plain_topic("events").unwrap();
    let mut subscription = push_subscription("ordered", "events", format!("http://127.0.0.1:{port}/events"));
    subscription.enable_message_ordering = true;
    grpc.create_subscription(subscription).unwrap();
    let messages: Vec<pubsub::PubsubMessage> = (0..30)
        .map(|index| pubsub::PubsubMessage {
            data: format!("{index}").into_bytes().into(),
            ordering_key: format!("key-{}", index % 3),
            ..Default::default()
        })
        .collect();
    grpc.publish(pubsub::PublishRequest { topic: topic_path("events"), messages }).unwrap();
    // Down: every push is refused for a while.
    let outage = Duration::from_secs(outage_seconds());
    std::thread::sleep(outage);
    // The test's gRPC client answers the daemon's keepalive pings only while it calls: after an
    // outage longer than their interval and timeout (30 s) its idle connection has been closed,
    // so it connects again.
    let grpc = Grpc::connect(daemon.grpc_address.as_deref().expect("the gRPC API's address"));
    let receiver =
        Receiver::start(TcpListener::bind(("127.0.0.1", port)).unwrap(), |_, _| (Duration::ZERO, 200));
    // Back: the pushing resumes within its longest pause, whatever the outage's length.
    let back = Instant::now();
    let until = back + Duration::from_secs(30);
    let distinct = |seen: &[Seen]| {
        let mut data: Vec<String> = seen.iter().map(|seen| field(&seen.text(), "data").to_owned()).collect();
        data.sort();
        data.dedup();
        data.len()
    };
    while distinct(&receiver.seen("/events")) < 30 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = receiver.seen("/events");
    assert_eq!(distinct(&seen), 30, "none lost after an outage of {} s", outage.as_secs());
    let mut arrived = std::collections::HashSet::new();
    let last_arrival = seen.iter().find(|seen| {
        arrived.insert(field(&seen.text(), "data").to_owned());
        arrived.len() == 30
    });
    eprintln!(
        "after an outage of {} s, the 30 messages were in {:.1} s after the receiver's return ({} requests)",
        outage.as_secs(),
        last_arrival.map_or(0.0, |seen| seen.at.saturating_duration_since(back).as_secs_f64()),
        seen.len()
    );
    for key in 0..3 {
        let order: Vec<u32> = seen
            .iter()
            .map(|seen| seen.text())
            .filter(|body| field(body, "orderingKey") == format!("key-{key}"))
            .map(|body| {
                let data = field(&body, "data").to_owned();
                decode_small_base64_number(&data)
            })
            .collect();
        let mut first_arrivals = order.clone();
        first_arrivals.dedup();
        let mut sorted = first_arrivals.clone();
        sorted.sort_unstable();
        assert_eq!(first_arrivals, sorted, "key-{key} in order: {order:?}");
    }
    assert!(switch_to_pull_and_pull(&grpc, "ordered").is_empty(), "everything acknowledged");
}

/// The number a message's data spells, from its base64 (the data here is "0" to "29").
fn decode_small_base64_number(base64: &str) -> u32 {
    String::from_utf8(decode_base64(base64)).unwrap().parse().unwrap()
}

/// Base64, standard or URL-safe, padded or not.
fn decode_base64(base64: &str) -> Vec<u8> {
    const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut bytes = Vec::new();
    for character in base64.chars().filter(|&character| character != '=') {
        let character = match character {
            '-' => '+',
            '_' => '/',
            other => other,
        };
        bits = bits << 6 | ALPHABET.find(character).unwrap() as u32;
        count += 6;
        if count >= 8 {
            count -= 8;
            bytes.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    bytes
}

#[test]
fn a_receiver_slower_than_the_deadline_is_pushed_again_and_a_switch_to_pull_stops_the_pushing() {
    let (_daemon, grpc) = grpc_daemon("push-slow-then-pull");
    // The first request is answered after the 10 s ack deadline, the others at once.
    let receiver = Receiver::on_free_port(|_, before| match before {
        0 => (Duration::from_secs(12), 200),
        _ => (Duration::ZERO, 200),
    });
    grpc.create_plain_topic("slow").unwrap();
    grpc.create_subscription(push_subscription("patient", "slow", receiver.url("/slow"))).unwrap();
    grpc.publish_data("slow", &[b"late"]).unwrap();
    let seen = receiver.wait_for("/slow", 2, Duration::from_secs(25));
    assert_eq!(seen.len(), 2, "pushed again once the deadline passed");
    let waited = (seen[1].at - seen[0].at).as_secs_f64();
    assert!((9.5..20.0).contains(&waited), "pushed again after {waited} s");
    assert_eq!(field(&seen[0].text(), "messageId"), field(&seen[1].text(), "messageId"));

    // Switched to pull: what is published next is pulled, not pushed.
    assert!(switch_to_pull_and_pull(&grpc, "patient").is_empty(), "the second push acknowledged it");
    grpc.publish_data("slow", &[b"a", b"b", b"c"]).unwrap();
    let mut pulled = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while pulled.len() < 3 && Instant::now() < until {
        pulled.extend(grpc.pull_now("patient", 10).unwrap());
    }
    assert_eq!(pulled.len(), 3);
    std::thread::sleep(Duration::from_secs(1));
    // The first, slow request's answer may land late; nothing new was pushed.
    assert_eq!(receiver.seen("/slow").len(), 2, "nothing pushed after the switch");
}

/// `ringpost stats`'s line of push subscription `name` (JSON, `kind` push).
fn push_line(stats: &str, name: &str) -> Option<String> {
    let subscription = format!("\"subscription\":\"{name}\"");
    stats
        .lines()
        .find(|line| line.contains("\"kind\":\"push\"") && line.contains(&subscription))
        .map(str::to_owned)
}

/// What an operator sees of push subscriptions: `ringpost stats` (JSON and table) shows each
/// one's endpoint, a window grown by successes, its outstanding pushes, the last error after a
/// 500 and the backlog it leaves, and `/metrics` its window, outstanding pushes and pushes by
/// class; a pull subscription has neither.
#[test]
fn stats_and_metrics_show_each_push_subscriptions_endpoint_window_last_error_and_backlog() {
    let daemon = Daemon::start_with(
        "push-stats",
        Vec::new(),
        ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"].map(String::from).to_vec(),
    );
    let grpc = Grpc::connect(&daemon.grpc_address.clone().expect("the gRPC API's address"));
    let receiver =
        Receiver::on_free_port(|seen, _| (Duration::ZERO, if seen.path == "/failing" { 500 } else { 200 }));
    grpc.create_plain_topic("orders").unwrap();
    grpc.create_plain_subscription("pulled", "orders").unwrap();
    grpc.create_subscription(push_subscription("succeeding", "orders", receiver.url("/succeeding"))).unwrap();
    let mut failing = push_subscription("failing", "orders", receiver.url("/failing"));
    failing.retry_policy = Some(pubsub::RetryPolicy {
        minimum_backoff: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
        maximum_backoff: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
    });
    grpc.create_subscription(failing).unwrap();
    let data: Vec<Vec<u8>> = (0..30).map(|index| format!("m{index}").into_bytes()).collect();
    let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    grpc.publish_data("orders", &data).unwrap();
    assert_eq!(receiver.wait_for("/succeeding", 30, Duration::from_secs(20)).len(), 30);
    assert!(!receiver.wait_for("/failing", 1, Duration::from_secs(20)).is_empty());

    // The successful one's acknowledgements are durable shortly after the answers.
    let until = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let stats = succeeded(&daemon.cli(&["stats"]));
        let settled = push_line(&stats, "succeeding").is_some_and(|line| json_field(&line, "backlog") == "0");
        if settled || Instant::now() > until {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let succeeding = push_line(&stats, "succeeding").expect("a push line for the succeeding subscription");
    assert_eq!(json_field(&succeeding, "endpoint"), receiver.url("/succeeding"));
    assert_eq!(json_field(&succeeding, "topic"), "orders");
    assert_eq!(json_field(&succeeding, "backlog"), "0");
    assert_eq!(json_field(&succeeding, "last_error"), "null");
    assert_eq!(json_field(&succeeding, "failures_in_a_row"), "0");
    let window: u32 = json_field(&succeeding, "window").parse().unwrap();
    assert!(window > 4, "the window grew from its start of 4 with 30 successes: {succeeding}");
    assert!(json_field(&succeeding, "2xx").parse::<u64>().unwrap() >= 30, "{succeeding}");

    let failing = push_line(&stats, "failing").expect("a push line for the failing subscription");
    assert_eq!(json_field(&failing, "endpoint"), receiver.url("/failing"));
    assert_eq!(json_field(&failing, "last_error"), "HTTP status 500");
    assert!(json_field(&failing, "last_error_ms_ago").parse::<u64>().unwrap() < 60_000, "{failing}");
    assert!(json_field(&failing, "failures_in_a_row").parse::<u64>().unwrap() >= 1, "{failing}");
    assert!(json_field(&failing, "5xx").parse::<u64>().unwrap() >= 1, "{failing}");
    assert_eq!(json_field(&failing, "backlog"), "30", "nothing acknowledged by a 500");
    let window: u32 = json_field(&failing, "window").parse().unwrap();
    let outstanding: u32 = json_field(&failing, "outstanding").parse().unwrap();
    assert!((1..=4).contains(&window) && outstanding <= window, "{failing}");
    assert!(push_line(&stats, "pulled").is_none(), "a pull subscription has no push line");

    // The table: a row per push subscription, the last error last.
    let table = succeeded(&daemon.cli(&["--output", "table", "stats"]));
    assert!(table.contains("LAST_ERROR"), "{table}");
    let row = table.lines().find(|line| line.contains(&receiver.url("/failing"))).expect("the failing row");
    assert!(row.ends_with("HTTP status 500"), "{row}");

    // /metrics: each push subscription's window and outstanding pushes as gauges, its pushes by
    // class as counters; none for the pull subscription.
    let (status, body) = ringpost_tests::scrape::http_get(
        daemon.http_address.as_ref().expect("the monitoring endpoint"),
        "/metrics",
    );
    assert_eq!(status, 200);
    let scrape = ringpost_tests::scrape::Scrape::parse(&body);
    fn of(name: &str) -> [(&str, &str); 2] {
        [("subscription", name), ("topic", "orders")]
    }
    for family in ["ringpost_push_window", "ringpost_push_outstanding", "ringpost_push_failures_in_a_row"] {
        assert_eq!(scrape.type_of(family), Some("gauge"), "{family}");
        assert!(scrape.value(family, &of("pulled")).is_none(), "{family} of a pull subscription");
    }
    assert!(scrape.value("ringpost_push_window", &of("succeeding")).unwrap() > 4.0, "{body}");
    let failing_window = scrape.value("ringpost_push_window", &of("failing")).unwrap();
    assert!((1.0..=4.0).contains(&failing_window), "{body}");
    assert!(scrape.value("ringpost_push_outstanding", &of("failing")).unwrap() <= failing_window);
    assert!(scrape.value("ringpost_push_failures_in_a_row", &of("failing")).unwrap() >= 1.0);
    let requests = |name: &str, class: &str| {
        let labels = [("subscription", name), ("topic", "orders"), ("class", class)];
        scrape.value("ringpost_push_subscription_requests_total", &labels).unwrap()
    };
    assert!(requests("succeeding", "2xx") >= 30.0 && requests("succeeding", "5xx") == 0.0, "{body}");
    assert!(requests("failing", "5xx") >= 1.0 && requests("failing", "2xx") == 0.0, "{body}");
}
