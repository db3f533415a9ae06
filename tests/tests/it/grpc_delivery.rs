//! Google Cloud Pub/Sub's gRPC API, delivery: Pull, Acknowledge, ModifyAckDeadline and
//! StreamingPull against the real daemon, through a tonic client. Messages are published and
//! subscriptions created with the native client (except exactly-once subscriptions, which only
//! the gRPC API can ask for), so every test also proves that what one protocol publishes the
//! other delivers.
//!
//! The blocking gRPC helper below is this file's own until `tests/src/grpc.rs` lands.

use prost::Message as _;
use ringpost_client::{block_on, Message, Subscription};
use ringpost_proto::pubsub;
use ringpost_proto::pubsub::subscriber_client::SubscriberClient;
use ringpost_proto::pubsub::{
    AcknowledgeRequest, ModifyAckDeadlineRequest, PullRequest, ReceivedMessage, StreamingPullRequest,
    StreamingPullResponse,
};
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// The largest response a stream may send (the daemon's `GRPC_STREAM_RESPONSE_BYTES_MAX`, and
/// the tonic client's default decoding limit, which this client keeps for streams).
const STREAM_RESPONSE_BYTES_MAX: usize = 4 << 20;
const PROJECT: &str = "projects/test-project";

fn subscription_name(name: &str) -> String {
    format!("{PROJECT}/subscriptions/{name}")
}

/// A blocking client of the gRPC API's Subscriber service.
struct Grpc {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    subscriber: SubscriberClient<Channel>,
    /// The bearer token every request presents, if any.
    token: Option<String>,
}

impl Grpc {
    fn connect(daemon: &Daemon) -> Grpc {
        let address = daemon.grpc_address.clone().expect("the daemon serves gRPC");
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let channel = runtime
            .block_on(Channel::from_shared(format!("http://{address}")).unwrap().connect())
            .expect("connecting to the gRPC API");
        // Unary pulls may answer up to the daemon's pull limit (12 MiB).
        let subscriber = SubscriberClient::new(channel.clone()).max_decoding_message_size(16 << 20);
        Grpc { runtime, channel, subscriber, token: None }
    }

    fn with_token(mut self, token: &str) -> Grpc {
        self.token = Some(token.to_owned());
        self
    }

    /// `message` as a request, with the token if there is one.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    }

    fn block<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Creates `subscription` of the natively created `topic` with exactly-once delivery, which
    /// the native protocol cannot ask for.
    fn create_exactly_once_subscription(&self, subscription: &str, topic: &str) -> pubsub::Subscription {
        let request = pubsub::Subscription {
            name: subscription_name(subscription),
            topic: format!("{PROJECT}/topics/{topic}"),
            ack_deadline_seconds: 60,
            enable_exactly_once_delivery: true,
            ..Default::default()
        };
        let mut subscriber = self.subscriber.clone();
        let created = self.block(subscriber.create_subscription(self.request(request)));
        created.expect("creating an exactly-once subscription").into_inner()
    }

    fn pull(
        &self,
        subscription: &str,
        max_messages: i32,
        immediately: bool,
    ) -> Result<Vec<ReceivedMessage>, Status> {
        #[allow(deprecated)]
        let request = PullRequest {
            subscription: subscription_name(subscription),
            max_messages,
            return_immediately: immediately,
        };
        let mut subscriber = self.subscriber.clone();
        Ok(self.block(subscriber.pull(self.request(request)))?.into_inner().received_messages)
    }

    fn acknowledge(&self, subscription: &str, ack_ids: Vec<String>) -> Result<(), Status> {
        let request = AcknowledgeRequest { subscription: subscription_name(subscription), ack_ids };
        let mut subscriber = self.subscriber.clone();
        self.block(subscriber.acknowledge(self.request(request))).map(|_| ())
    }

    fn modify(&self, subscription: &str, ack_ids: Vec<String>, seconds: i32) -> Result<(), Status> {
        let request = ModifyAckDeadlineRequest {
            subscription: subscription_name(subscription),
            ack_ids,
            ack_deadline_seconds: seconds,
        };
        let mut subscriber = self.subscriber.clone();
        self.block(subscriber.modify_ack_deadline(self.request(request))).map(|_| ())
    }

    /// Opens a StreamingPull with `first` as its first request.
    fn open_stream(&self, first: StreamingPullRequest) -> Result<GrpcStream, Status> {
        let (requests, outgoing) = tokio::sync::mpsc::channel(16);
        requests.try_send(first).unwrap();
        let outgoing = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(outgoing);
        // A client of its own, with tonic's default 4 MiB decoding limit: a larger response
        // fails the stream.
        let mut subscriber = SubscriberClient::new(self.channel.clone());
        let responses = self.block(subscriber.streaming_pull(self.request(outgoing)))?.into_inner();
        Ok(GrpcStream { requests: Some(requests), responses })
    }
}

/// An open StreamingPull.
struct GrpcStream {
    requests: Option<tokio::sync::mpsc::Sender<StreamingPullRequest>>,
    responses: tonic::Streaming<StreamingPullResponse>,
}

impl GrpcStream {
    /// The next response, waiting up to `limit`: `None` if none came, `Some(Err)` if the stream
    /// ended with an error, `Some(Ok(None))` if it ended cleanly.
    fn next(
        &mut self,
        grpc: &Grpc,
        limit: Duration,
    ) -> Option<Result<Option<StreamingPullResponse>, Status>> {
        grpc.block(async { tokio::time::timeout(limit, self.responses.message()).await.ok() })
    }

    fn send(&self, grpc: &Grpc, request: StreamingPullRequest) {
        let requests = self.requests.as_ref().expect("the request side is open");
        grpc.block(requests.send(request)).expect("the stream takes requests");
    }
}

fn first_request(subscription: &str, max_outstanding_messages: i64) -> StreamingPullRequest {
    StreamingPullRequest {
        subscription: subscription_name(subscription),
        stream_ack_deadline_seconds: 60,
        max_outstanding_messages,
        ..Default::default()
    }
}

fn start(label: &str) -> Daemon {
    Daemon::start_with(label, vec![], vec!["--grpc-listen".into(), "127.0.0.1:0".into()])
}

fn ack_ids(messages: &[ReceivedMessage]) -> Vec<String> {
    messages.iter().map(|message| message.ack_id.clone()).collect()
}

fn data(message: &ReceivedMessage) -> String {
    String::from_utf8_lossy(&message.message.as_ref().expect("a message").data).into_owned()
}

/// Pulls (waiting) until `count` messages came or `limit` passed.
fn pull_at_least(grpc: &Grpc, subscription: &str, count: usize, limit: Duration) -> Vec<ReceivedMessage> {
    let deadline = Instant::now() + limit;
    let mut received = Vec::new();
    while received.len() < count && Instant::now() < deadline {
        received.extend(grpc.pull(subscription, 100, false).expect("pull"));
    }
    received
}

/// Creates `topic`, a dead-letter topic and `subscription` with a dead-letter policy, so that
/// deliveries count their attempts.
fn create_with_dead_letters(daemon: &Daemon, topic: &str, subscription: &str) {
    let client = daemon.client();
    block_on(client.create_topic(topic)).unwrap();
    let dead_letters = format!("{topic}-dead");
    block_on(client.create_topic(&dead_letters)).unwrap();
    block_on(client.create_subscription(Subscription {
        name: subscription.into(),
        topic: topic.into(),
        ack_deadline_seconds: 30,
        dead_letter_topic: dead_letters,
        max_delivery_attempts: 5,
        ..Default::default()
    }))
    .unwrap();
}

/// A natively published message pulled over gRPC carries its data, attributes, ordering key,
/// message id and publish time, with no delivery attempt (no dead-letter policy); acknowledged,
/// it is not delivered again. Unknown ack ids are ignored and malformed ones refused, as
/// Pub/Sub does without exactly-once delivery.
#[test]
fn grpc_pull_then_acknowledge_delivers_native_publishes_once() {
    let daemon = start("grpc-pull-ack");
    let client = daemon.client();
    create_topic_and_subscription(&client, "orders", "billing", 30);
    let published = block_on(client.publish(
        "orders",
        vec![
            Message::new("first").attribute("kind", "new").ordering_key("customer-1"),
            Message::new("second"),
            Message::new("third"),
        ],
    ))
    .unwrap();
    let grpc = Grpc::connect(&daemon);
    let received = pull_at_least(&grpc, "billing", 3, Duration::from_secs(10));
    assert_eq!(received.len(), 3, "{received:?}");
    let first = received.iter().find(|message| data(message) == "first").expect("the first message");
    let message = first.message.as_ref().unwrap();
    assert_eq!(message.attributes.get("kind").map(String::as_str), Some("new"));
    assert_eq!(message.ordering_key, "customer-1");
    assert_eq!(message.message_id, published[0].to_string());
    assert!(
        message.publish_time.is_some_and(|time| time.seconds > 1_600_000_000),
        "{:?}",
        message.publish_time
    );
    assert!(received.iter().all(|message| message.delivery_attempt == 0));

    grpc.acknowledge("billing", ack_ids(&received)).expect("acknowledge");
    assert!(grpc.pull("billing", 10, true).unwrap().is_empty());
    // Acknowledged already, or never delivered: ignored.
    grpc.acknowledge("billing", ack_ids(&received)).expect("acknowledging again");
    let malformed = grpc.acknowledge("billing", vec!["not-an-ack-id".into()]).unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument, "{malformed:?}");

    assert_eq!(grpc.pull("billing", 0, true).unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(grpc.pull("nothing-here", 1, true).unwrap_err().code(), Code::NotFound);
    assert_eq!(grpc.modify("billing", ack_ids(&received), -1).unwrap_err().code(), Code::InvalidArgument);
}

/// A lease whose deadline passes is delivered again, with its attempt counted (the
/// subscription has a dead-letter policy); the expired ack id is ignored, the new one works.
#[test]
fn grpc_expired_deadline_redelivers_with_the_next_delivery_attempt() {
    let daemon = start("grpc-expiry");
    create_with_dead_letters(&daemon, "expiring", "expiring-sub");
    block_on(daemon.client().publish("expiring", vec![Message::new("once")])).unwrap();
    let grpc = Grpc::connect(&daemon);
    let first = pull_at_least(&grpc, "expiring-sub", 1, Duration::from_secs(10));
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].delivery_attempt, 1);
    // The deadline, shortened to a second, passes.
    grpc.modify("expiring-sub", ack_ids(&first), 1).expect("modify ack deadline");
    let again = pull_at_least(&grpc, "expiring-sub", 1, Duration::from_secs(15));
    assert_eq!(again.len(), 1, "not delivered again after its deadline passed");
    assert_eq!(data(&again[0]), "once");
    assert_eq!(again[0].delivery_attempt, 2);
    assert_ne!(again[0].ack_id, first[0].ack_id);
    grpc.acknowledge("expiring-sub", ack_ids(&first)).expect("an expired ack id is ignored");
    grpc.acknowledge("expiring-sub", ack_ids(&again)).expect("acknowledge");
    assert!(grpc.pull("expiring-sub", 10, true).unwrap().is_empty());
}

/// ModifyAckDeadline with 0 (a nack) gives the message back at once, counted as an attempt.
#[test]
fn grpc_nack_redelivers_at_once() {
    let daemon = start("grpc-nack");
    create_with_dead_letters(&daemon, "nacked", "nacked-sub");
    block_on(daemon.client().publish("nacked", vec![Message::new("retry me")])).unwrap();
    let grpc = Grpc::connect(&daemon);
    let first = pull_at_least(&grpc, "nacked-sub", 1, Duration::from_secs(10));
    assert_eq!(first.len(), 1);
    grpc.modify("nacked-sub", ack_ids(&first), 0).expect("nack");
    let again = grpc.pull("nacked-sub", 10, true).expect("pull");
    assert_eq!(again.len(), 1, "a nacked message is delivered again at once");
    assert_eq!((data(&again[0]).as_str(), again[0].delivery_attempt), ("retry me", 2));
}

/// A stream with `max_outstanding_messages` never has more than that many unacknowledged
/// messages delivered; acknowledging on the stream lets the rest come, and every response
/// names the subscription's properties.
#[test]
fn grpc_streaming_pull_honours_max_outstanding_messages_and_takes_acks_on_the_stream() {
    const MESSAGES: usize = 30;
    const WINDOW: usize = 5;
    let daemon = start("grpc-stream-window");
    let client = daemon.client();
    create_topic_and_subscription(&client, "window", "window-sub", 60);
    let messages = (0..MESSAGES).map(|index| Message::new(format!("{index:03}"))).collect();
    block_on(client.publish("window", messages)).unwrap();
    let grpc = Grpc::connect(&daemon);
    let mut stream = grpc.open_stream(first_request("window-sub", WINDOW as i64)).expect("open");
    let (mut seen, mut unacked, mut peak) = (HashSet::new(), Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    while seen.len() < MESSAGES && Instant::now() < deadline {
        match stream.next(&grpc, Duration::from_millis(500)) {
            Some(Ok(Some(response))) => {
                assert!(
                    response.subscription_properties.is_some(),
                    "a response without subscription_properties"
                );
                for message in response.received_messages {
                    seen.insert(data(&message));
                    unacked.push(message.ack_id);
                }
                assert!(unacked.len() <= WINDOW, "{} outstanding on a window of {WINDOW}", unacked.len());
                peak = peak.max(unacked.len());
            }
            Some(Ok(None)) => panic!("the stream ended"),
            Some(Err(status)) => panic!("the stream failed: {status:?}"),
            // Quiet: the window is full (or the backlog drained); acknowledge on the stream.
            None => {
                let ack_ids = std::mem::take(&mut unacked);
                stream.send(&grpc, StreamingPullRequest { ack_ids, ..Default::default() });
            }
        }
    }
    assert_eq!(seen.len(), MESSAGES, "every message delivered through a window of {WINDOW}");
    assert_eq!(peak, WINDOW, "the window never filled, so it was not tested");
    stream.send(&grpc, StreamingPullRequest { ack_ids: std::mem::take(&mut unacked), ..Default::default() });
    // Give the last acknowledgements time to land before looking.
    std::thread::sleep(Duration::from_millis(500));
    drop(stream);
    assert!(
        grpc.pull("window-sub", 10, true).unwrap().is_empty(),
        "acked on the stream, yet delivered again"
    );
}

/// A backlog far larger than a response arrives in responses of at most 4 MiB each (the
/// client's default limit: a larger one would fail the stream), all of it, in several.
#[test]
fn grpc_streaming_pull_splits_a_big_backlog_into_responses_under_4_mib() {
    const MESSAGES: usize = 24;
    const MESSAGE_BYTES: usize = 1 << 20;
    let daemon = start("grpc-stream-split");
    let client = daemon.client();
    create_topic_and_subscription(&client, "big", "big-sub", 60);
    for index in 0..MESSAGES {
        let mut payload = vec![index as u8; MESSAGE_BYTES];
        payload[..3].copy_from_slice(format!("{index:03}").as_bytes());
        block_on(client.publish("big", vec![Message::new(payload)])).unwrap();
    }
    let grpc = Grpc::connect(&daemon);
    let mut stream = grpc.open_stream(first_request("big-sub", 0)).expect("open");
    let (mut seen, mut responses) = (HashMap::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    while seen.len() < MESSAGES && Instant::now() < deadline {
        match stream.next(&grpc, Duration::from_secs(2)) {
            Some(Ok(Some(response))) => {
                assert!(
                    response.encoded_len() <= STREAM_RESPONSE_BYTES_MAX,
                    "{} bytes",
                    response.encoded_len()
                );
                responses += 1;
                for message in response.received_messages {
                    let data = &message.message.as_ref().unwrap().data;
                    assert_eq!(data.len(), MESSAGE_BYTES);
                    seen.insert(String::from_utf8_lossy(&data[..3]).into_owned(), message.ack_id);
                }
            }
            Some(Ok(None)) => panic!("the stream ended"),
            Some(Err(status)) => panic!("the stream failed: {status:?}"),
            None => {}
        }
    }
    assert_eq!(seen.len(), MESSAGES);
    assert!(responses >= MESSAGES * MESSAGE_BYTES / STREAM_RESPONSE_BYTES_MAX, "{responses} responses");
}

/// SIGTERM ends an open stream with UNAVAILABLE, which the client libraries reconnect on.
#[test]
fn grpc_streaming_pull_ends_unavailable_when_the_daemon_stops() {
    let daemon = start("grpc-stream-stop");
    let client = daemon.client();
    create_topic_and_subscription(&client, "stopping", "stopping-sub", 60);
    block_on(client.publish("stopping", vec![Message::new("before the stop")])).unwrap();
    let grpc = Grpc::connect(&daemon);
    let mut stream = grpc.open_stream(first_request("stopping-sub", 0)).expect("open");
    let Some(Ok(Some(response))) = stream.next(&grpc, Duration::from_secs(10)) else {
        panic!("no delivery on the stream")
    };
    assert_eq!(response.received_messages.len(), 1);
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let ended = loop {
        match stream.next(&grpc, Duration::from_secs(15)) {
            Some(Ok(Some(_))) => continue,
            other => break other,
        }
    };
    match ended {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        other => panic!("the stream did not end with UNAVAILABLE: {other:?}"),
    }
}

/// A stream on a subscription that is deleted ends with NOT_FOUND; one on a subscription that
/// does not exist is refused with NOT_FOUND, and a bad first request with INVALID_ARGUMENT.
#[test]
fn grpc_streaming_pull_ends_not_found_when_its_subscription_is_deleted() {
    let daemon = start("grpc-stream-deleted");
    let client = daemon.client();
    create_topic_and_subscription(&client, "doomed", "doomed-sub", 60);
    let grpc = Grpc::connect(&daemon);
    let refused = grpc.open_stream(first_request("no-such-sub", 0)).err().expect("refused");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let mut bad = first_request("doomed-sub", 0);
    bad.stream_ack_deadline_seconds = 5;
    assert_eq!(grpc.open_stream(bad).err().expect("refused").code(), Code::InvalidArgument);

    let mut stream = grpc.open_stream(first_request("doomed-sub", 0)).expect("open");
    block_on(client.delete_subscription("doomed-sub")).unwrap();
    match stream.next(&grpc, Duration::from_secs(10)) {
        Some(Err(status)) => assert_eq!(status.code(), Code::NotFound, "{status:?}"),
        other => panic!("the stream did not end with NOT_FOUND: {other:?}"),
    }
}

/// Each delivery method checks the caller's permission on the subscription before it has any
/// effect, as the native protocol does: without `SubscriptionsConsume` a pull, stream,
/// acknowledgement or deadline change is PERMISSION_DENIED and leases nothing; without a token
/// it is UNAUTHENTICATED.
#[test]
fn grpc_delivery_needs_the_consume_permission_before_any_effect() {
    use crate::security::{access_text, client_with, daemon_requiring_auth, token, AccessFile, Files};
    let files = Files::new("grpc-delivery-auth");
    let (root, alice, bob) = (token("root"), token("alice"), token("bob"));
    let access = AccessFile::new(
        &files,
        &access_text(
            &[&root, &alice, &bob],
            &["admin * root", "subscriber subscription:allowed-* alice", "viewer * bob"],
        ),
    );
    let daemon = daemon_requiring_auth("grpc-delivery-auth", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let admin = client_with(&daemon, &root);
    create_topic_and_subscription(&admin, "guarded", "allowed-sub", 30);
    block_on(admin.create_subscription(Subscription {
        name: "other-sub".into(),
        topic: "guarded".into(),
        ack_deadline_seconds: 30,
        ..Default::default()
    }))
    .unwrap();
    block_on(admin.publish("guarded", vec![Message::new("kept")])).unwrap();

    let alice_grpc = Grpc::connect(&daemon).with_token(&alice.secret);
    let bob_grpc = Grpc::connect(&daemon).with_token(&bob.secret);
    let anonymous = Grpc::connect(&daemon);
    let denied = |result: Result<(), Status>, code: Code, what: &str| {
        let status = result.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
    };
    denied(bob_grpc.pull("allowed-sub", 10, true).map(|_| ()), Code::PermissionDenied, "a viewer's pull");
    denied(alice_grpc.pull("other-sub", 10, true).map(|_| ()), Code::PermissionDenied, "a pull elsewhere");
    denied(anonymous.pull("allowed-sub", 10, true).map(|_| ()), Code::Unauthenticated, "an anonymous pull");
    denied(
        bob_grpc.open_stream(first_request("allowed-sub", 0)).map(|_| ()),
        Code::PermissionDenied,
        "a viewer's stream",
    );
    // The refused pulls and stream leased nothing: the message comes at once.
    let received = alice_grpc.pull("allowed-sub", 10, true).expect("alice's pull");
    assert_eq!(received.len(), 1);
    denied(bob_grpc.modify("allowed-sub", ack_ids(&received), 0), Code::PermissionDenied, "a viewer's nack");
    denied(bob_grpc.acknowledge("allowed-sub", ack_ids(&received)), Code::PermissionDenied, "a viewer's ack");
    // The refused nack gave nothing back, and the refused ack acknowledged nothing.
    assert!(alice_grpc.pull("allowed-sub", 10, true).unwrap().is_empty());
    alice_grpc.modify("allowed-sub", ack_ids(&received), 0).expect("alice's nack");
    assert_eq!(alice_grpc.pull("allowed-sub", 10, true).unwrap().len(), 1);
}

/// The next response's messages, failing the test if none comes within `limit`.
fn next_messages(stream: &mut GrpcStream, grpc: &Grpc, limit: Duration) -> Vec<ReceivedMessage> {
    match stream.next(grpc, limit) {
        Some(Ok(Some(response))) => response.received_messages,
        other => panic!("no delivery on the stream: {other:?}"),
    }
}

/// On the stream, a deadline change of 0 (a nack) delivers the message again on the stream;
/// deadline changes that do not pair with their ack ids end the stream with INVALID_ARGUMENT,
/// and so does flow control set after the first request.
#[test]
fn grpc_streaming_pull_takes_nacks_on_the_stream_and_refuses_malformed_later_requests() {
    let daemon = start("grpc-stream-nack");
    let client = daemon.client();
    create_topic_and_subscription(&client, "streamed", "streamed-sub", 60);
    block_on(client.publish("streamed", vec![Message::new("again")])).unwrap();
    let grpc = Grpc::connect(&daemon);
    let mut stream = grpc.open_stream(first_request("streamed-sub", 0)).expect("open");
    let first = next_messages(&mut stream, &grpc, Duration::from_secs(10));
    assert_eq!(first.len(), 1);
    stream.send(
        &grpc,
        StreamingPullRequest {
            modify_deadline_seconds: vec![0],
            modify_deadline_ack_ids: ack_ids(&first),
            ..Default::default()
        },
    );
    let again = next_messages(&mut stream, &grpc, Duration::from_secs(10));
    assert_eq!(again.len(), 1);
    assert_eq!(data(&again[0]), "again");
    assert_ne!(again[0].ack_id, first[0].ack_id);

    let unpaired = StreamingPullRequest {
        modify_deadline_seconds: vec![30, 30],
        modify_deadline_ack_ids: ack_ids(&again),
        ..Default::default()
    };
    stream.send(&grpc, unpaired);
    match stream.next(&grpc, Duration::from_secs(10)) {
        Some(Err(status)) => assert_eq!(status.code(), Code::InvalidArgument, "{status:?}"),
        other => panic!("an unpaired deadline change did not end the stream: {other:?}"),
    }
    let mut stream = grpc.open_stream(first_request("streamed-sub", 0)).expect("open");
    stream.send(&grpc, StreamingPullRequest { max_outstanding_messages: 3, ..Default::default() });
    let ended = loop {
        match stream.next(&grpc, Duration::from_secs(10)) {
            Some(Ok(Some(_))) => continue,
            other => break other,
        }
    };
    match ended {
        Some(Err(status)) => assert_eq!(status.code(), Code::InvalidArgument, "{status:?}"),
        other => panic!("flow control set later did not end the stream: {other:?}"),
    }
}

/// A stream whose first request names a `client_id` (Google's clients always do) belongs to a
/// client that reconnects when the stream breaks and still holds what it was sent: those
/// leases outlive the stream, so the messages are not delivered again at once, and their ack
/// ids still acknowledge. A stream without one gives its messages back at once.
#[test]
fn grpc_a_named_clients_leases_outlive_its_broken_stream() {
    let daemon = start("grpc-stream-client-id");
    let client = daemon.client();
    create_topic_and_subscription(&client, "held", "held-sub", 60);
    create_topic_and_subscription(&client, "anonymous", "anonymous-sub", 60);
    block_on(client.publish("held", vec![Message::new("held")])).unwrap();
    block_on(client.publish("anonymous", vec![Message::new("anonymous")])).unwrap();
    let grpc = Grpc::connect(&daemon);
    let first_message = |stream: &mut GrpcStream| match stream.next(&grpc, Duration::from_secs(10)) {
        Some(Ok(Some(response))) => response.received_messages.into_iter().next().expect("a message"),
        other => panic!("no delivery on the stream: {other:?}"),
    };

    let named = StreamingPullRequest { client_id: "worker-1".into(), ..first_request("held-sub", 0) };
    let mut stream = grpc.open_stream(named).expect("open");
    let held = first_message(&mut stream);
    drop(stream);
    let mut stream = grpc.open_stream(first_request("anonymous-sub", 0)).expect("open");
    first_message(&mut stream);
    drop(stream);

    // Given back at once by the anonymous stream; a while for the daemon to see it closed.
    let again = pull_at_least(&grpc, "anonymous-sub", 1, Duration::from_secs(15));
    assert_eq!(again.len(), 1, "the anonymous stream's message was not delivered again");
    // The named client's message stays leased to it (the 60 s stream deadline) ...
    assert!(grpc.pull("held-sub", 10, true).unwrap().is_empty(), "delivered again while still leased");
    // ... and its ack id, from the broken stream, acknowledges it.
    grpc.acknowledge("held-sub", vec![held.ack_id]).expect("acknowledge");
    assert!(grpc.pull("held-sub", 10, true).unwrap().is_empty(), "acknowledged, yet delivered again");
}

/// The `google.rpc.ErrorInfo` in which Pub/Sub names the ack ids an exactly-once request
/// refused, as its client libraries read it: this reason and domain, and per refused ack id a
/// value starting with `PERMANENT_FAILURE_INVALID_ACK_ID` when sending it again cannot help
/// (the libraries retry only the ones starting with `TRANSIENT_`).
const EXACTLY_ONCE_FAILURE_REASON: &str = "EXACTLY_ONCE_ACKID_FAILURE";
const EXACTLY_ONCE_FAILURE_DOMAIN: &str = "pubsub.googleapis.com";
const PERMANENT_FAILURE_INVALID_ACK_ID: &str = "PERMANENT_FAILURE_INVALID_ACK_ID";
/// How long a test waits for one response on a stream before it fails.
const STREAM_RESPONSE_WAIT: Duration = Duration::from_secs(10);
/// How long a stream must stay quiet to show that nothing more is delivered.
const STREAM_QUIET: Duration = Duration::from_secs(2);

fn message_id(message: &ReceivedMessage) -> String {
    message.message.as_ref().expect("a message").message_id.clone()
}

/// Asserts that `status` has `code` and, as its first detail (the only one the client
/// libraries read), the exactly-once ErrorInfo naming exactly the ack ids `refused`, each as
/// refused for good.
fn assert_refused_for_good(status: &Status, code: Code, refused: &[&str]) {
    assert_eq!(status.code(), code, "{status:?}");
    let details = status.get_error_details_vec();
    let Some(tonic_types::ErrorDetail::ErrorInfo(info)) = details.first() else {
        panic!("the first detail is not an ErrorInfo: {details:?} in {status:?}")
    };
    assert_eq!(info.reason, EXACTLY_ONCE_FAILURE_REASON);
    assert_eq!(info.domain, EXACTLY_ONCE_FAILURE_DOMAIN);
    let named: BTreeSet<&str> = info.metadata.keys().map(String::as_str).collect();
    assert_eq!(named, refused.iter().copied().collect(), "the ack ids named: {:?}", info.metadata);
    for ack_id in refused {
        assert!(info.metadata[*ack_id].starts_with(PERMANENT_FAILURE_INVALID_ACK_ID), "{:?}", info.metadata);
    }
}

/// Exactly-once delivery through the unary calls. Once a message is handed back (a nack) and
/// delivered again, only the new delivery's ack id is good: the old one is refused, per id, in
/// Pub/Sub's ErrorInfo, by Acknowledge and by ModifyAckDeadline alike, and a stale nack leaves
/// the current delivery alone. The current ack id acknowledges, also beside a stale one, and
/// again without error. And the promise itself: an acknowledged message is never delivered
/// again, not even after the daemon is killed and started again on its data.
#[test]
fn grpc_exactly_once_refuses_stale_ack_ids_per_id_and_never_redelivers_an_acknowledged_message_across_a_restart(
) {
    let mut daemon = start("grpc-exactly-once");
    block_on(daemon.client().create_topic("payments")).unwrap();
    let grpc = Grpc::connect(&daemon);
    let created = grpc.create_exactly_once_subscription("settlement", "payments");
    assert!(created.enable_exactly_once_delivery, "{created:?}");
    let published = block_on(daemon.client().publish("payments", vec![Message::new("charge once")])).unwrap();

    let first = pull_at_least(&grpc, "settlement", 1, Duration::from_secs(10));
    assert_eq!(first.len(), 1, "{first:?}");
    let stale = first[0].ack_id.clone();
    grpc.modify("settlement", vec![stale.clone()], 0).expect("a nack of the current delivery");
    let again = pull_at_least(&grpc, "settlement", 1, Duration::from_secs(10));
    assert_eq!(again.len(), 1, "a nacked message is delivered again: {again:?}");
    let current = again[0].ack_id.clone();
    assert_eq!(message_id(&again[0]), published[0].to_string());
    assert_eq!(data(&again[0]), "charge once");
    assert_ne!(current, stale, "a new delivery has an ack id of its own");

    // Every ack id of the request refused for good: INVALID_ARGUMENT, as Pub/Sub answers.
    let refused = grpc.acknowledge("settlement", vec![stale.clone()]).unwrap_err();
    assert_refused_for_good(&refused, Code::InvalidArgument, &[&stale]);
    // A deadline change, an extension or a nack, of the stale ack id is refused the same way,
    // and the stale nack does not hand back the current delivery.
    for seconds in [60, 0] {
        let refused = grpc.modify("settlement", vec![stale.clone()], seconds).unwrap_err();
        assert_refused_for_good(&refused, Code::InvalidArgument, &[&stale]);
    }
    assert!(
        grpc.pull("settlement", 10, true).unwrap().is_empty(),
        "a stale nack handed back the current delivery"
    );
    // Beside the current ack id, only the stale one is named; the status is ABORTED (which the
    // client libraries retry for the ack ids not named), not INVALID_ARGUMENT, since the
    // current one succeeded.
    let partly = grpc.acknowledge("settlement", vec![stale.clone(), current.clone()]).unwrap_err();
    assert_refused_for_good(&partly, Code::Aborted, &[&stale]);
    // A client that lost the answer sends the acknowledgement again: it succeeds, and changes
    // nothing, since the message is acknowledged.
    grpc.acknowledge("settlement", vec![current.clone()]).expect("acknowledging again");
    assert!(grpc.pull("settlement", 10, true).unwrap().is_empty(), "delivered again once acknowledged");

    // SIGKILL: only what was made durable survives. A message published after the restart is
    // delivered, which shows the subscription delivers again; the acknowledged one, which would
    // come first, must not come with it.
    drop(grpc);
    daemon.restart();
    let grpc = Grpc::connect(&daemon);
    block_on(daemon.client().publish("payments", vec![Message::new("after the restart")])).unwrap();
    let mut after = pull_at_least(&grpc, "settlement", 1, Duration::from_secs(20));
    after.extend(grpc.pull("settlement", 10, true).expect("pull"));
    let texts: Vec<String> = after.iter().map(data).collect();
    assert_eq!(texts, ["after the restart"], "an acknowledged message came back after the restart");
}

/// The next response on an exactly-once stream, which must say so in its properties.
fn exactly_once_response(stream: &mut GrpcStream, grpc: &Grpc) -> StreamingPullResponse {
    let response = match stream.next(grpc, STREAM_RESPONSE_WAIT) {
        Some(Ok(Some(response))) => response,
        Some(Ok(None)) => panic!("the stream ended"),
        Some(Err(status)) => panic!("the stream failed: {status:?}"),
        None => panic!("no response on the stream in {STREAM_RESPONSE_WAIT:?}"),
    };
    let properties = response.subscription_properties.as_ref().expect("subscription_properties");
    assert!(properties.exactly_once_delivery_enabled, "{response:?}");
    response
}

/// A request on the stream that changes the deadline of `ack_id` to `seconds`.
fn deadline_change(ack_id: &str, seconds: i32) -> StreamingPullRequest {
    StreamingPullRequest {
        modify_deadline_seconds: vec![seconds],
        modify_deadline_ack_ids: vec![ack_id.to_owned()],
        ..Default::default()
    }
}

/// StreamingPull on an exactly-once subscription: every response says so in its
/// subscription_properties, and each acknowledgement or deadline change sent on the stream is
/// confirmed in a response of its own, with the good ack ids in `ack_ids` and the stale ones
/// in `invalid_ack_ids`, from which the client libraries settle each ack's future. A nack on
/// the stream delivers the message again on it under a new ack id; then the old ack id is
/// invalid for a nack and for an acknowledgement, the new one acknowledges (again without
/// error), and the message is not delivered again.
#[test]
fn grpc_exactly_once_streaming_pull_confirms_good_ack_ids_and_names_stale_ones_invalid() {
    let daemon = start("grpc-exactly-once-stream");
    block_on(daemon.client().create_topic("ledger")).unwrap();
    let grpc = Grpc::connect(&daemon);
    grpc.create_exactly_once_subscription("ledger-sub", "ledger");
    let published = block_on(daemon.client().publish("ledger", vec![Message::new("post once")])).unwrap();
    let mut stream = grpc.open_stream(first_request("ledger-sub", 0)).expect("open");
    let first = exactly_once_response(&mut stream, &grpc).received_messages;
    assert_eq!(first.len(), 1, "{first:?}");
    let stale = first[0].ack_id.clone();

    stream.send(&grpc, deadline_change(&stale, 0));
    // The nack's confirmation and the delivery again may come in either order.
    let (mut nacked, mut again) = (None, Vec::new());
    while nacked.is_none() || again.is_empty() {
        let response = exactly_once_response(&mut stream, &grpc);
        assert!(response.acknowledge_confirmation.is_none(), "{response:?}");
        if let Some(confirmation) = response.modify_ack_deadline_confirmation {
            assert!(nacked.replace(confirmation).is_none(), "a nack confirmed twice");
        }
        again.extend(response.received_messages);
    }
    let nacked = nacked.unwrap();
    assert_eq!(nacked.ack_ids, [stale.as_str()], "{nacked:?}");
    assert!(nacked.invalid_ack_ids.is_empty() && nacked.temporary_failed_ack_ids.is_empty(), "{nacked:?}");
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(message_id(&again[0]), published[0].to_string());
    let current = again[0].ack_id.clone();
    assert_ne!(current, stale, "a new delivery has an ack id of its own");

    // From here on nothing is delivered: each response is the confirmation of a request, in
    // the order the requests were sent.
    let mut confirmation_of = |request: StreamingPullRequest| {
        stream.send(&grpc, request);
        let response = exactly_once_response(&mut stream, &grpc);
        assert!(response.received_messages.is_empty(), "delivered again: {response:?}");
        response
    };
    let stale_nack = confirmation_of(deadline_change(&stale, 0)).modify_ack_deadline_confirmation;
    let stale_nack = stale_nack.expect("a deadline change's confirmation");
    assert!(stale_nack.ack_ids.is_empty(), "a stale nack succeeded: {stale_nack:?}");
    assert_eq!(stale_nack.invalid_ack_ids, [stale.as_str()], "{stale_nack:?}");

    let acknowledge = |ack_ids: &[&String]| StreamingPullRequest {
        ack_ids: ack_ids.iter().map(|ack_id| ack_id.to_string()).collect(),
        ..Default::default()
    };
    let acked = confirmation_of(acknowledge(&[&stale, &current])).acknowledge_confirmation;
    let acked = acked.expect("an acknowledgement's confirmation");
    assert_eq!(acked.ack_ids, [current.as_str()], "the stale nack ended the current delivery: {acked:?}");
    assert_eq!(acked.invalid_ack_ids, [stale.as_str()], "{acked:?}");
    assert!(acked.temporary_failed_ack_ids.is_empty() && acked.unordered_ack_ids.is_empty(), "{acked:?}");
    // A client that lost the confirmation sends the acknowledgement again.
    let acked_again = confirmation_of(acknowledge(&[&current])).acknowledge_confirmation;
    let acked_again = acked_again.expect("an acknowledgement's confirmation");
    assert_eq!(acked_again.ack_ids, [current.as_str()], "{acked_again:?}");
    assert!(acked_again.invalid_ack_ids.is_empty(), "{acked_again:?}");

    match stream.next(&grpc, STREAM_QUIET) {
        None => {}
        other => panic!("the stream sent more once everything was acknowledged: {other:?}"),
    }
    // Closing the stream gives back what it holds: nothing.
    drop(stream);
    assert!(grpc.pull("ledger-sub", 10, true).unwrap().is_empty(), "delivered again once acknowledged");
}

/// Google's clients send an empty request on an open stream every 30 s as a heartbeat, and
/// one carrying only a new `stream_ack_deadline_seconds` when their deadline changes: both
/// are taken without effect, and the stream goes on delivering.
#[test]
fn grpc_streaming_pull_takes_heartbeats_and_new_stream_deadlines() {
    let daemon = start("grpc-stream-heartbeat");
    let client = daemon.client();
    create_topic_and_subscription(&client, "beating", "beating-sub", 60);
    let grpc = Grpc::connect(&daemon);
    let mut stream = grpc.open_stream(first_request("beating-sub", 0)).expect("open");
    for _ in 0..3 {
        stream.send(&grpc, StreamingPullRequest::default());
    }
    stream.send(&grpc, StreamingPullRequest { stream_ack_deadline_seconds: 120, ..Default::default() });
    block_on(client.publish("beating", vec![Message::new("after the heartbeats")])).unwrap();
    let received = loop {
        match stream.next(&grpc, Duration::from_secs(10)) {
            Some(Ok(Some(response))) if response.received_messages.is_empty() => continue,
            Some(Ok(Some(response))) => break response.received_messages,
            other => panic!("the stream did not deliver after the heartbeats: {other:?}"),
        }
    };
    assert_eq!(received.iter().map(data).collect::<Vec<_>>(), ["after the heartbeats"]);
    stream.send(&grpc, StreamingPullRequest { ack_ids: ack_ids(&received), ..Default::default() });
    stream.send(&grpc, StreamingPullRequest::default());
    // The acknowledgement lands meanwhile (generous: a loaded machine), and the stream stays open.
    assert!(stream.next(&grpc, Duration::from_secs(2)).is_none(), "the stream ended or sent more");
    drop(stream);
    assert!(grpc.pull("beating-sub", 10, true).unwrap().is_empty(), "acknowledged, yet delivered again");
}
