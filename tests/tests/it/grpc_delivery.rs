//! Google Cloud Pub/Sub's gRPC API, delivery: Pull, Acknowledge, ModifyAckDeadline and
//! StreamingPull against the real daemon, through a tonic client. Messages are published and
//! subscriptions created with the native client, so every test also proves that what one
//! protocol publishes the other delivers.
//!
//! The blocking gRPC helper below is this file's own until `tests/src/grpc.rs` lands.

use prost::Message as _;
use ringpost_client::{block_on, Message, Subscription};
use ringpost_proto::pubsub::subscriber_client::SubscriberClient;
use ringpost_proto::pubsub::{
    AcknowledgeRequest, ModifyAckDeadlineRequest, PullRequest, ReceivedMessage, StreamingPullRequest,
    StreamingPullResponse,
};
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Status};

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
