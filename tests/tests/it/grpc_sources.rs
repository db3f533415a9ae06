//! Google's gRPC API over a topic of two publish sources (one on each of the daemon's two
//! shards): publishes spread over both (a key to its key's source, unordered requests taking
//! turns), and a StreamingPull, a unary Pull and acknowledgements gather from both, under one
//! flow-control window, as if the topic were one log.

use ringpost_proto::pubsub;
use ringpost_proto::pubsub::{StreamingPullRequest, StreamingPullResponse};
use ringpost_tests::grpc::{subscription_path, topic_path, Grpc};
use ringpost_tests::{json_field, succeeded, Daemon};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

pub(super) const KEYS: usize = 20;
pub(super) const PER_KEY: usize = 50;
const UNORDERED: usize = 1_000;
/// The stream's window, which both sources' deliveries share.
pub(super) const WINDOW: usize = 10;
/// The shortest ack deadline a stream may ask for: what an acknowledged message would have
/// been delivered again after.
pub(super) const STREAM_ACK_DEADLINE_SECONDS: i32 = 10;

fn start(label: &str) -> (Daemon, Grpc) {
    let daemon = Daemon::start_with(label, vec![], vec!["--grpc-listen".into(), "127.0.0.1:0".into()]);
    let grpc = Grpc::connect(daemon.grpc_address.as_deref().expect("the daemon serves gRPC"));
    (daemon, grpc)
}

/// The source a message id names (the bits above its offset).
pub(super) fn source_of(message_id: &str) -> u64 {
    message_id.parse::<u64>().expect("a numeric message id") >> 52
}

/// The source an ack id names (`v1.<subscription>.<source>.<offset>.<generation>`, in hex).
pub(super) fn ack_source(ack_id: &str) -> u64 {
    u64::from_str_radix(ack_id.split('.').nth(2).expect("an ack id of this version"), 16).unwrap()
}

pub(super) fn message(data: String, key: &str) -> pubsub::PubsubMessage {
    pubsub::PubsubMessage {
        data: data.into_bytes().into(),
        ordering_key: key.to_owned(),
        ..Default::default()
    }
}

pub(super) fn publish(grpc: &Grpc, topic: &str, messages: Vec<pubsub::PubsubMessage>) -> Vec<String> {
    let count = messages.len();
    let ids = grpc
        .publish(pubsub::PublishRequest { topic: topic_path(topic), messages })
        .expect("publish")
        .message_ids;
    assert_eq!(ids.len(), count);
    ids
}

/// Publishes `PER_KEY` messages on each of `KEYS` ordering keys (in requests of ten of one key,
/// as Google's publishers batch them, and one request mixing every key) and `UNORDERED`
/// without a key (in requests of 50); checks each key's messages went to its key's source and
/// the unordered ones to both. Returns each message's data by its id.
pub(super) fn publish_spread(grpc: &Grpc, topic: &str) -> HashMap<String, String> {
    let mut published = HashMap::new();
    let key = |index: usize| format!("key-{index:02}");
    let mut sources_of_keys = HashSet::new();
    // The first message of every key together: a request mixing keys is split by source.
    let mixed: Vec<_> =
        (0..KEYS).map(|index| message(format!("{}/{:03}", key(index), 0), &key(index))).collect();
    for (id, sent) in publish(grpc, topic, mixed.clone()).into_iter().zip(mixed) {
        published.insert(id, String::from_utf8(sent.data.to_vec()).unwrap());
    }
    for index in 0..KEYS {
        let key = key(index);
        let expected = ringpost_model::sources::source_of_key(key.as_bytes(), 2) as u64;
        sources_of_keys.insert(expected);
        for batch in (1..PER_KEY).collect::<Vec<_>>().chunks(10) {
            let messages: Vec<_> =
                batch.iter().map(|sequence| message(format!("{key}/{sequence:03}"), &key)).collect();
            for (id, sent) in publish(grpc, topic, messages.clone()).into_iter().zip(messages) {
                assert_eq!(source_of(&id), expected, "key {key}'s message went to another source");
                published.insert(id, String::from_utf8(sent.data.to_vec()).unwrap());
            }
        }
    }
    assert_eq!(sources_of_keys.len(), 2, "the keys all map to one source: the test proves nothing");
    let mut unordered_sources = HashSet::new();
    for batch in (0..UNORDERED).collect::<Vec<_>>().chunks(50) {
        let messages: Vec<_> = batch.iter().map(|index| message(format!("plain/{index:04}"), "")).collect();
        let ids = publish(grpc, topic, messages.clone());
        let sources: HashSet<u64> = ids.iter().map(|id| source_of(id)).collect();
        assert_eq!(sources.len(), 1, "an unordered request goes to one source");
        unordered_sources.extend(sources);
        for (id, sent) in ids.into_iter().zip(messages) {
            published.insert(id, String::from_utf8(sent.data.to_vec()).unwrap());
        }
    }
    assert_eq!(unordered_sources.len(), 2, "unordered requests all went to one source");
    assert_eq!(published.len(), KEYS * PER_KEY + UNORDERED, "message ids are unique over the topic");
    published
}

/// Each source's published messages in `ringpost stats` (source 0 first).
fn stats_by_source(daemon: &Daemon, topic: &str) -> Vec<u64> {
    let json = succeeded(&daemon.cli(&["stats"]));
    let mut counts = Vec::new();
    for source in 0..2 {
        let line = json
            .lines()
            .find(|line| {
                line.starts_with(&format!("{{\"topic\":\"{topic}\",\"shard\""))
                    && line.contains(&format!("\"source\":{source},"))
            })
            .unwrap_or_else(|| panic!("no stats of source {source}: {json}"));
        counts.push(json_field(line, "messages").parse().unwrap());
    }
    counts
}

/// An open StreamingPull.
pub(super) struct Stream {
    requests: tokio::sync::mpsc::Sender<StreamingPullRequest>,
    pub(super) responses: tonic::Streaming<StreamingPullResponse>,
}

impl Stream {
    pub(super) fn open(grpc: &Grpc, subscription: &str, window: usize) -> Stream {
        let (requests, outgoing) = tokio::sync::mpsc::channel(16);
        let first = StreamingPullRequest {
            subscription: subscription_path(subscription),
            stream_ack_deadline_seconds: STREAM_ACK_DEADLINE_SECONDS,
            max_outstanding_messages: window as i64,
            ..Default::default()
        };
        requests.try_send(first).unwrap();
        let outgoing = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(outgoing);
        let mut subscriber = grpc.subscriber();
        let request = grpc.request(outgoing);
        let responses =
            grpc.call(async move { subscriber.streaming_pull(request).await }).expect("open").into_inner();
        Stream { requests, responses }
    }

    /// The next response within `limit`, `None` if none came; a stream that ends fails the test.
    pub(super) fn next(&mut self, grpc: &Grpc, limit: Duration) -> Option<StreamingPullResponse> {
        match grpc.block_on(async { tokio::time::timeout(limit, self.responses.message()).await.ok() }) {
            None => None,
            Some(Ok(Some(response))) => Some(response),
            Some(Ok(None)) => panic!("the stream ended"),
            Some(Err(status)) => panic!("the stream failed: {status:?}"),
        }
    }

    pub(super) fn acknowledge(&self, grpc: &Grpc, ack_ids: Vec<String>) {
        let request = StreamingPullRequest { ack_ids, ..Default::default() };
        grpc.block_on(self.requests.send(request)).expect("the stream takes requests");
    }
}

/// Publishes spread over both sources, each showing in its shard's stats; one StreamingPull of
/// an ordered subscription with a window of ten receives every message once, each key's in
/// order, never holding more than ten unacknowledged over both sources (and ten at times, so
/// both sources deliver at once), acknowledges on the stream, and nothing comes again after
/// the ack deadline; a unary Pull drains a second subscription from both sources, each ack id
/// acknowledged on the source it names. Fails when the gateway serves source 0 alone: source
/// 1's stats show nothing published.
#[test]
fn grpc_publishes_spread_over_sources_and_pulls_and_streams_gather_them() {
    let (daemon, grpc) = start("grpc-sources");
    succeeded(&daemon.cli(&["topic", "create", "spread", "--sources", "2"]));
    for (name, ordered) in [("spread-stream", true), ("spread-pull", false)] {
        grpc.create_subscription(pubsub::Subscription {
            name: subscription_path(name),
            topic: topic_path("spread"),
            ack_deadline_seconds: 60,
            enable_message_ordering: ordered,
            ..Default::default()
        })
        .expect("create subscription");
    }
    let published = publish_spread(&grpc, "spread");
    let counts = stats_by_source(&daemon, "spread");
    assert!(counts.iter().all(|&count| count > 0), "a source took no publishes: {counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), published.len() as u64, "{counts:?}");

    let mut stream = Stream::open(&grpc, "spread-stream", WINDOW);
    let mut received: HashSet<String> = HashSet::new();
    let mut last_of_key: BTreeMap<String, String> = BTreeMap::new();
    let (mut unacked, mut peak, mut sources) = (Vec::new(), 0, HashSet::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.len() < published.len() && Instant::now() < deadline {
        let Some(response) = stream.next(&grpc, Duration::from_millis(300)) else {
            stream.acknowledge(&grpc, std::mem::take(&mut unacked));
            continue;
        };
        for delivered in response.received_messages {
            let message = delivered.message.expect("a message");
            let data = String::from_utf8(message.data.to_vec()).unwrap();
            assert_eq!(published.get(&message.message_id), Some(&data), "an unknown message");
            assert!(received.insert(message.message_id.clone()), "{data} delivered twice");
            sources.insert(ack_source(&delivered.ack_id));
            if !message.ordering_key.is_empty() {
                if let Some(before) = last_of_key.insert(message.ordering_key.clone(), data.clone()) {
                    assert!(before < data, "key {}: {data} after {before}", message.ordering_key);
                }
            }
            unacked.push(delivered.ack_id);
        }
        assert!(unacked.len() <= WINDOW, "{} unacknowledged over a window of {WINDOW}", unacked.len());
        peak = peak.max(unacked.len());
        if unacked.len() == WINDOW {
            stream.acknowledge(&grpc, std::mem::take(&mut unacked));
        }
    }
    assert_eq!(received.len(), published.len(), "the stream did not gather every message");
    assert_eq!(sources, HashSet::from([0, 1]), "ack ids of one source only");
    assert_eq!(peak, WINDOW, "the window never filled from both sources");
    assert!(
        last_of_key.values().all(|last| last.ends_with(&format!("{:03}", PER_KEY - 1))),
        "{last_of_key:?}"
    );
    stream.acknowledge(&grpc, std::mem::take(&mut unacked));

    // A unary Pull drains the other subscription, acknowledging as it goes.
    let mut drained = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while drained.len() < published.len() && Instant::now() < deadline {
        #[allow(deprecated)]
        let request = pubsub::PullRequest {
            subscription: subscription_path("spread-pull"),
            return_immediately: false,
            max_messages: 300,
        };
        let pulled = grpc.pull(request).expect("pull").received_messages;
        assert!(pulled.len() <= 300);
        let ack_ids = pulled.iter().map(|message| message.ack_id.clone()).collect();
        for message in pulled {
            assert!(drained.insert(message.message.expect("a message").message_id), "pulled twice");
        }
        let request = pubsub::AcknowledgeRequest { subscription: subscription_path("spread-pull"), ack_ids };
        grpc.acknowledge(request).expect("acknowledge");
    }
    assert_eq!(drained.len(), published.len(), "the pulls did not gather every message");

    // Past the stream's ack deadline, nothing acknowledged comes again, on either.
    std::thread::sleep(Duration::from_secs(STREAM_ACK_DEADLINE_SECONDS as u64 + 2));
    assert!(stream.next(&grpc, Duration::from_millis(500)).is_none(), "delivered again after its ack");
    drop(stream);
    for subscription in ["spread-stream", "spread-pull"] {
        assert_eq!(grpc.pull_now(subscription, 100).expect("pull").len(), 0, "{subscription} redelivered");
    }
}

/// Publishes `count` unordered messages in requests of ten (taking turns over the sources);
/// their ids.
pub(super) fn publish_unordered(grpc: &Grpc, topic: &str, count: usize) -> HashSet<String> {
    let mut ids = HashSet::new();
    for batch in (0..count).collect::<Vec<_>>().chunks(10) {
        let messages = batch.iter().map(|index| message(format!("m{index:03}"), "")).collect();
        ids.extend(publish(grpc, topic, messages));
    }
    ids
}

/// A stream that leaves holding messages of both sources gives them back on both at once
/// (the subscription's ack deadline is ten minutes, so only a lease given back comes again
/// within the test): another stream receives every message. Its acknowledgement of all of
/// them, with one unknown ack id of source 1, is confirmed in one exactly-once confirmation
/// gathering both sources' answers.
#[test]
fn a_gathered_stream_that_leaves_gives_back_both_sources_leases_and_exactly_once_confirms_once() {
    const MESSAGES: usize = 40;
    let (daemon, grpc) = start("grpc-sources-leave");
    succeeded(&daemon.cli(&["topic", "create", "held", "--sources", "2"]));
    grpc.create_subscription(pubsub::Subscription {
        name: subscription_path("held-once"),
        topic: topic_path("held"),
        ack_deadline_seconds: 600,
        enable_exactly_once_delivery: true,
        ..Default::default()
    })
    .expect("create subscription");
    let published = publish_unordered(&grpc, "held", MESSAGES);
    let sources: HashSet<u64> = published.iter().map(|id| source_of(id)).collect();
    assert_eq!(sources, HashSet::from([0, 1]), "the publishes did not spread");

    let mut leaving = Stream::open(&grpc, "held-once", WINDOW);
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while held.len() < WINDOW && Instant::now() < deadline {
        if let Some(response) = leaving.next(&grpc, Duration::from_millis(300)) {
            held.extend(response.received_messages.into_iter().map(|message| message.ack_id));
        }
    }
    assert_eq!(held.len(), WINDOW, "the leaving stream did not fill its window");
    let held_sources: HashSet<u64> = held.iter().map(|ack_id| ack_source(ack_id)).collect();
    assert_eq!(held_sources, HashSet::from([0, 1]), "the window held one source's messages");
    drop(leaving);

    let mut staying = Stream::open(&grpc, "held-once", 0);
    let (mut received, mut ack_ids) = (HashSet::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while received.len() < MESSAGES && Instant::now() < deadline {
        let Some(response) = staying.next(&grpc, Duration::from_millis(300)) else { continue };
        for delivered in response.received_messages {
            let id = delivered.message.expect("a message").message_id;
            assert!(received.insert(id), "delivered twice to the staying stream");
            ack_ids.push(delivered.ack_id);
        }
    }
    assert_eq!(received, published, "the leaving stream's leases were not given back");

    let unknown = "v1.ffff.1.5.1".to_owned();
    let mut acknowledged = ack_ids.clone();
    acknowledged.push(unknown.clone());
    staying.acknowledge(&grpc, acknowledged);
    let confirmation = loop {
        let response = staying.next(&grpc, Duration::from_secs(10)).expect("a confirmation");
        assert!(response.received_messages.is_empty(), "delivered again before its acknowledgement");
        if let Some(confirmation) = response.acknowledge_confirmation {
            break confirmation;
        }
    };
    let confirmed: HashSet<String> = confirmation.ack_ids.into_iter().collect();
    assert_eq!(
        confirmed,
        ack_ids.into_iter().collect::<HashSet<_>>(),
        "not every source's confirmed at once"
    );
    assert_eq!(confirmation.invalid_ack_ids, vec![unknown]);
    drop(staying);
    assert!(grpc.pull_now("held-once", 100).expect("pull").is_empty(), "acknowledged, yet delivered again");
}

/// An empty subscription's unary Pull waits, and is answered with a message published on
/// either source while it waits (within the pull's 10 s wait, so not by its end): once on
/// source 0, once on source 1.
#[test]
fn an_empty_gathered_pull_waits_for_a_message_on_either_source() {
    let (daemon, grpc) = start("grpc-sources-wait");
    succeeded(&daemon.cli(&["topic", "create", "quiet", "--sources", "2"]));
    grpc.create_plain_subscription("quiet-sub", "quiet").expect("create subscription");
    let address = daemon.grpc_address.clone().unwrap();
    let mut sources = HashSet::new();
    for round in 0..2u64 {
        // A key of source `round`, so that each round's message is on another source.
        let key = (0..)
            .map(|index| format!("key-{index}"))
            .find(|key| ringpost_model::sources::source_of_key(key.as_bytes(), 2) as u64 == round)
            .unwrap();
        let publisher = {
            let address = address.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(700));
                let grpc = Grpc::connect(&address);
                publish(&grpc, "quiet", vec![message(format!("late {round}"), &key)])
            })
        };
        let started = Instant::now();
        #[allow(deprecated)]
        let request = pubsub::PullRequest {
            subscription: subscription_path("quiet-sub"),
            return_immediately: false,
            max_messages: 10,
        };
        let pulled = grpc.pull(request).expect("pull").received_messages;
        let waited = started.elapsed();
        let ids = publisher.join().unwrap();
        assert_eq!(pulled.len(), 1, "round {round}: the waiting pull returned {pulled:?}");
        assert_eq!(pulled[0].message.as_ref().unwrap().message_id, ids[0]);
        assert!(waited < Duration::from_secs(8), "round {round}: answered only after {waited:?}");
        sources.insert(source_of(&ids[0]));
        let request = pubsub::AcknowledgeRequest {
            subscription: subscription_path("quiet-sub"),
            ack_ids: vec![pulled[0].ack_id.clone()],
        };
        grpc.acknowledge(request).expect("acknowledge");
    }
    assert_eq!(sources, HashSet::from([0, 1]), "the late messages' keys map to one source");
}

/// A gathered stream ends as one stream would when its subscription is deleted (each source's
/// stream fails with NOT_FOUND, and the first failure ends the client's), and a stream of a
/// subscription made again under the name gathers from both sources.
#[test]
fn a_gathered_stream_ends_not_found_when_its_subscription_is_deleted() {
    let (daemon, grpc) = start("grpc-sources-deleted");
    succeeded(&daemon.cli(&["topic", "create", "gone", "--sources", "2"]));
    grpc.create_plain_subscription("gone-sub", "gone").expect("create subscription");
    let mut stream = Stream::open(&grpc, "gone-sub", WINDOW);
    assert!(stream.next(&grpc, Duration::from_millis(300)).is_none(), "a message from nowhere");
    let request = pubsub::DeleteSubscriptionRequest { subscription: subscription_path("gone-sub") };
    grpc.delete_subscription(request).expect("delete subscription");
    let ended = grpc
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), stream.responses.message()).await });
    match ended.expect("the stream did not end within 30 s") {
        Err(status) => assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}"),
        Ok(other) => panic!("the stream went on: {other:?}"),
    }

    grpc.create_plain_subscription("gone-sub", "gone").expect("create the subscription again");
    let published = publish_unordered(&grpc, "gone", 20);
    let mut again = Stream::open(&grpc, "gone-sub", 0);
    let mut received = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while received.len() < published.len() && Instant::now() < deadline {
        if let Some(response) = again.next(&grpc, Duration::from_millis(300)) {
            received.extend(
                response.received_messages.into_iter().map(|message| message.message.unwrap().message_id),
            );
        }
    }
    assert_eq!(received, published);
}
