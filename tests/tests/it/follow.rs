//! A topic whose sources follow its load (`--sources auto`): the catalog's leader adds a source
//! while the topic runs above the add threshold (set low here) and retires it once the topic is
//! idle, a subscriber losing nothing and an ordered one receiving every key's messages in
//! publish order across both changes, and a topic of a fixed count keeps it under the same load.

use ringpost_client::{block_on, Message, Subscription};
use ringpost_tests::{json_field, succeeded, Daemon};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long the test waits for the second source: two readings of the rates (every 2 s), the
/// hold (1 s here) and the source's placement, on a loaded machine.
const SOURCE_ADDED_WITHIN: Duration = Duration::from_secs(60);
/// Ordering keys of the hot topic: each round publishes one message of one of them, in turn.
const KEYS: u64 = 4;

/// Each source's leader shard in a topic's JSON.
fn source_count(json: &str) -> usize {
    json.matches("\"leader_shard\":").count()
}

#[test]
fn a_followed_topics_sources_rise_under_load_and_fall_back_once_idle_losing_nothing() {
    // Over 50 messages a second per source the topic runs hot; bytes do not count; the hold
    // between readings and changes is a second.
    let flags = [
        "--http-listen",
        "127.0.0.1:0",
        "--source-add-messages-per-second",
        "50",
        "--source-add-kib-per-second",
        "0",
        "--source-hold-seconds",
        "1",
    ];
    let daemon =
        Daemon::start_with("follow", Vec::new(), flags.iter().map(|flag| flag.to_string()).collect());
    let created = succeeded(&daemon.cli(&["topic", "create", "hot", "--sources", "auto"]));
    assert_eq!(source_count(&created), 1, "{created}");
    assert!(created.contains("\"source_policy\":{\"auto\":true,\"min\":1,\"max\":2}"), "{created}");
    succeeded(&daemon.cli(&["topic", "create", "calm", "--sources", "1"]));
    let calm_before = succeeded(&daemon.cli(&["topic", "get", "calm"]));
    assert!(!calm_before.contains("source_policy"), "a fixed topic is shown as before: {calm_before}");
    let subscription = Subscription {
        name: "hot-all".into(),
        topic: "hot".into(),
        ack_deadline_seconds: 60,
        ..Default::default()
    };
    block_on(daemon.client().create_subscription(subscription)).unwrap();
    // An ordered subscription, not read until the topic idles: its keys' messages are on source
    // 0 and, once a key moved, on source 1, which holds them until the old ones are out.
    succeeded(&daemon.cli(&[
        "sub",
        "create",
        "hot-ordered",
        "--topic",
        "hot",
        "--ordering",
        "--ack-deadline",
        "60",
    ]));
    let mut published = HashSet::new();

    // About 500 messages a second on each, ten times the threshold, until the second source
    // comes.
    let client = daemon.client();
    let started = Instant::now();
    let mut shown = String::new();
    for round in 0.. {
        if started.elapsed() > SOURCE_ADDED_WITHIN {
            break;
        }
        for topic in ["hot", "calm"] {
            let mut messages: Vec<Message> =
                (0..10).map(|i| Message::new(format!("{round}-{i:04}"))).collect();
            // One message of each round carries a key, in turn, its round in its data.
            messages[0] =
                Message::new(format!("{round}-{:04}", 0)).ordering_key(format!("key-{}", round % KEYS));
            let ids = block_on(client.publish(topic, messages)).expect("a publish");
            if topic == "hot" {
                published.extend((0..10).map(|i| format!("{round}-{i:04}")));
                assert_eq!(ids.len(), 10);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        if round % 20 == 19 {
            shown = succeeded(&daemon.cli(&["topic", "get", "hot"]));
            if source_count(&shown) == 2 {
                break;
            }
        }
    }
    assert_eq!(source_count(&shown), 2, "no source added in {SOURCE_ADDED_WITHIN:?}: {shown}");
    eprintln!("a second source after {:?}", started.elapsed());
    assert_eq!(json_field(&shown, "name"), "hot");
    assert!(shown.contains("\"source_policy\":{\"auto\":true,\"min\":1,\"max\":2}"), "{shown}");
    assert!(daemon.log().contains("topic 'hot' runs hot: 2 sources now"), "{}", daemon.log());
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "calm"])), calm_before, "a fixed topic changed");

    // The scrape shows the followed topic's sources, bounds and the leader's last decision,
    // and nothing of the fixed one.
    let (status, body) = ringpost_tests::scrape::http_get(
        daemon.http_address.as_ref().expect("the monitoring endpoint"),
        "/metrics",
    );
    assert_eq!(status, 200);
    let scrape = ringpost_tests::scrape::Scrape::parse(&body);
    assert_eq!(scrape.value("ringpost_topic_sources", &[("topic", "hot")]), Some(2.0), "{body}");
    assert_eq!(scrape.value("ringpost_topic_sources_max", &[("topic", "hot")]), Some(2.0), "{body}");
    let added = [("topic", "hot"), ("decision", "add")];
    assert_eq!(scrape.value("ringpost_topic_sources_last_decision", &added), Some(1.0), "{body}");
    assert_eq!(scrape.value("ringpost_topic_sources", &[("topic", "calm")]), None, "{body}");

    // Idle, it runs cold and its highest source retires: taking no more publishes, delivered
    // out to the subscription (every message published, from both sources, none lost), then
    // deleted once acknowledged.
    let mut received = HashSet::new();
    let mut ordered = OrderedReceived::default();
    let started = Instant::now();
    let puller = daemon.client();
    let mut shown = String::new();
    for pass in 0.. {
        if started.elapsed() > SOURCE_ADDED_WITHIN {
            break;
        }
        let messages = block_on(puller.pull("hot-all", 500, 200)).expect("a pull");
        let ack_ids: Vec<String> = messages.iter().map(|message| message.ack_id.clone()).collect();
        received.extend(messages.iter().map(|message| String::from_utf8(message.data.clone()).unwrap()));
        if !ack_ids.is_empty() {
            assert!(block_on(puller.acknowledge("hot-all", ack_ids)).unwrap().is_empty());
        }
        let messages = block_on(puller.pull("hot-ordered", 500, 50)).expect("an ordered pull");
        for message in &messages {
            ordered.take(String::from_utf8(message.data.clone()).unwrap());
        }
        let ack_ids: Vec<String> = messages.iter().map(|message| message.ack_id.clone()).collect();
        if !ack_ids.is_empty() {
            assert!(block_on(puller.acknowledge("hot-ordered", ack_ids)).unwrap().is_empty());
        }
        let drained = received.len() >= published.len() && ordered.all.len() >= published.len();
        if drained || pass % 10 == 9 {
            shown = succeeded(&daemon.cli(&["topic", "get", "hot"]));
            if source_count(&shown) == 1 && drained {
                break;
            }
        }
    }
    assert_eq!(source_count(&shown), 1, "the idle topic kept its second source: {shown}");
    assert!(daemon.log().contains("topic 'hot' runs cold: its highest source retires"), "{}", daemon.log());
    let lost: Vec<&String> = published.difference(&received).take(5).collect();
    assert!(
        lost.is_empty(),
        "{} of {} published never delivered, e.g. {lost:?}",
        published.len() - received.len(),
        published.len()
    );
    let lost: Vec<&String> = published.difference(&ordered.all).take(5).collect();
    assert!(lost.is_empty(), "the ordered subscription never received {lost:?}");
    assert!(ordered.out_of_order.is_empty(), "keys out of publish order: {:?}", ordered.out_of_order);
    assert!(ordered.keyed > 0);
    eprintln!("back to one source after {:?}, {} keyed messages in order", started.elapsed(), ordered.keyed);

    // A count asked for fixes it again.
    // The ordered subscription must have passed the retirement first (one change at a time):
    // the pass that deleted the source commits it, or the next one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let fixed = loop {
        let output = daemon.cli(&["topic", "update", "hot", "--sources", "2"]);
        if output.status.success() || Instant::now() > deadline {
            break succeeded(&output);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(source_count(&fixed), 2, "{fixed}");
    assert!(!succeeded(&daemon.cli(&["topic", "get", "hot"])).contains("source_policy"));
}

/// What an ordered subscription received: every message's data, and for each key the round of
/// its last message first delivered, which each next first delivery of the key must exceed.
#[derive(Default)]
struct OrderedReceived {
    all: HashSet<String>,
    last_round: HashMap<u64, u64>,
    keyed: usize,
    out_of_order: Vec<String>,
}

impl OrderedReceived {
    fn take(&mut self, data: String) {
        if !self.all.insert(data.clone()) {
            return;
        }
        let (round, index) = data.split_once('-').expect("round-index");
        if index != "0000" {
            return;
        }
        let round: u64 = round.parse().expect("a round");
        self.keyed += 1;
        if let Some(last) = self.last_round.insert(round % KEYS, round) {
            if last > round {
                self.out_of_order.push(format!("key-{} round {round} after {last}", round % KEYS));
            }
        }
    }
}
