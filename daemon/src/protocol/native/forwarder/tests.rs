//! A forwarder's handlers under authentication: each data-plane command is checked before it
//! does anything, against an access file as an operator writes one.

use crate::auth::{Access, AccessSettings, Mode, Session};
use crate::catalog::SubscriptionSettings;
use crate::clock::ManualClock;
use crate::control::ControlRequest;
use crate::ids::TopicId;
use crate::log::{Directories, LogConfig};
use crate::net::server::{Handler, Responder};
use crate::shard::Forwarder;
use crate::storage::sim::SimDisk;
use ringpost_wire::frame::{decode_error, Body, FrameBuffer, FrameHeader};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::*;
use ringpost_wire::{Command, ErrorCode, Status};
use std::path::PathBuf;
use std::rc::Rc;

/// Who may do what in these tests: alice publishes to "retained" and consumes "reader"; bob
/// may only look at them; carol may publish to every topic; nobody else, anonymous included,
/// may do anything.
const ACCESS_FILE: &str = "\
# the forwarder's permission tests
grant publisher topic:retained alice
grant publisher topic:* carol
grant subscriber subscription:reader alice
grant viewer * bob
";

fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(future);
}

/// An access file written for one test, and the `Access` that required mode builds from it.
pub(crate) fn required_access(test: &str, text: &str) -> Rc<Access> {
    let path: PathBuf = std::env::temp_dir().join(format!("ringpost-access-{}-{test}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let settings = AccessSettings { mode: Mode::Required, file: Some(path.clone()) };
    let access = Access::open(&settings).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    std::fs::remove_file(&path).unwrap();
    Rc::new(access)
}

/// A forwarder serving topic "retained" with subscription "reader", both empty.
async fn forwarder() -> Forwarder<SimDisk> {
    let forwarder = Forwarder::new(
        0,
        SimDisk::new(),
        Directories::new(vec!["/d0".into()]),
        LogConfig::default(),
        Rc::new(ManualClock::default()),
    );
    let topic = ControlRequest::AttachTopic {
        topic_id: TopicId::new(7),
        name: "retained".into(),
        retention_seconds: 0,
        recovering: false,
        source: crate::ids::SourceId::FIRST,
        active: 1,
    };
    forwarder.control(topic).await.unwrap();
    let subscription = ControlRequest::AttachSubscription {
        subscription_id: 9,
        name: "reader".into(),
        topic_id: TopicId::new(7),
        settings: SubscriptionSettings { ack_deadline_seconds: 10, ..Default::default() },
        create: true,
        start_offset: 0,
    };
    forwarder.control(subscription).await.unwrap();
    forwarder
}

/// A request through a shard's handler (a forwarder's or the router's) as `responder`'s
/// session sends it: the response frame's body, or the error.
pub(crate) async fn call<H: Handler, T: Body>(
    handler: &H,
    responder: &Responder,
    command: Command,
    request: &T,
) -> Result<FrameBuffer, Status> {
    let frame = ringpost_wire::encode_frame(command.code(), 0, 1, request);
    let header = FrameHeader::decode(&frame[..FRAME_HEADER_BYTES]).unwrap();
    let mut body = FrameBuffer::new();
    body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    let response = handler.handle(header, body, responder).await.into_contiguous();
    let header = FrameHeader::decode(&response[..FRAME_HEADER_BYTES]).unwrap();
    let mut body = FrameBuffer::new();
    body.extend_from_slice(&response[FRAME_HEADER_BYTES..]);
    if header.is_error() {
        Err(decode_error(&body))
    } else {
        Ok(body)
    }
}

fn publish_request(topic: &str) -> PublishRequest {
    PublishRequest {
        topic: topic.into(),
        messages: vec![PubsubMessage { data: b"hello".to_vec(), ..Default::default() }],
    }
}

fn pull_request() -> PullRequest {
    PullRequest { subscription: "reader".into(), max_messages: 10, wait_ms: 0 }
}

fn as_principal(access: &Rc<Access>, name: &str) -> Responder {
    Responder::with_session(access.authenticate_certificate(name), access.clone())
}

fn pulled(body: &[u8]) -> Vec<ReceivedMessage> {
    ringpost_wire::decode_body::<PullResponse>(body).unwrap().received_messages
}

#[test]
fn a_refused_publish_appends_nothing() {
    run(async {
        let access = required_access("refused-publish", ACCESS_FILE);
        let forwarder = forwarder().await;
        let log = forwarder.topic("retained").unwrap().log.clone();
        let anonymous = Responder::with_session(Session::anonymous(), access.clone());
        let refused = call(&forwarder, &anonymous, Command::Publish, &publish_request("retained")).await;
        assert_eq!(refused.unwrap_err().code, ErrorCode::Unauthenticated);
        let viewer = as_principal(&access, "bob");
        let refused = call(&forwarder, &viewer, Command::Publish, &publish_request("retained")).await;
        let status = refused.unwrap_err();
        assert_eq!(status.code, ErrorCode::PermissionDenied, "{status:?}");
        assert!(status.message.contains("bob"), "the refusal names the principal: {}", status.message);
        assert_eq!(log.end_offset().get(), 0, "a refused publish appends nothing");
        assert_eq!(log.next_offset().get(), 0, "nor queues anything to append");
        // Refused before the topic is looked up: a topic one may not publish to and one that
        // does not exist answer alike.
        let publisher = as_principal(&access, "alice");
        let refused = call(&forwarder, &publisher, Command::Publish, &publish_request("elsewhere")).await;
        assert_eq!(refused.unwrap_err().code, ErrorCode::PermissionDenied);

        call(&forwarder, &publisher, Command::Publish, &publish_request("retained")).await.unwrap();
        assert_eq!(log.end_offset().get(), 1);
        // A grant on every topic lets its holder publish without the name being read first;
        // the publish is then the data plane's to answer.
        let everywhere = as_principal(&access, "carol");
        call(&forwarder, &everywhere, Command::Publish, &publish_request("retained")).await.unwrap();
        assert_eq!(log.end_offset().get(), 2);
        let unknown = call(&forwarder, &everywhere, Command::Publish, &publish_request("elsewhere")).await;
        assert_eq!(unknown.unwrap_err().code, ErrorCode::NotOwner);
        let subscriber = as_principal(&access, "alice");
        let pulled = pulled(&call(&forwarder, &subscriber, Command::Pull, &pull_request()).await.unwrap());
        assert_eq!(pulled.len(), 2, "only the permitted publishes were recorded");
    });
}

#[test]
fn consuming_needs_the_subscriber_role() {
    run(async {
        let access = required_access("consume", ACCESS_FILE);
        let forwarder = forwarder().await;
        let alice = as_principal(&access, "alice");
        call(&forwarder, &alice, Command::Publish, &publish_request("retained")).await.unwrap();
        let bob = as_principal(&access, "bob");
        let anonymous = Responder::with_session(Session::anonymous(), access.clone());
        for (responder, code) in
            [(&bob, ErrorCode::PermissionDenied), (&anonymous, ErrorCode::Unauthenticated)]
        {
            let refused = call(&forwarder, responder, Command::Pull, &pull_request()).await;
            assert_eq!(refused.unwrap_err().code, code);
            let stream = StreamingPullRequest {
                subscription: "reader".into(),
                stream_ack_deadline_seconds: 10,
                max_outstanding_messages: 10,
                max_outstanding_bytes: 0,
            };
            let refused = call(&forwarder, responder, Command::StreamingPull, &stream).await;
            assert_eq!(refused.unwrap_err().code, code);
        }
        // The refused pulls leased nothing: alice's pull gets the message.
        let messages = pulled(&call(&forwarder, &alice, Command::Pull, &pull_request()).await.unwrap());
        assert_eq!(messages.len(), 1);
        let ack_ids = vec![messages[0].ack_id.clone()];
        let extend = ModifyAckDeadlineRequest {
            subscription: "reader".into(),
            ack_ids: ack_ids.clone(),
            ack_deadline_seconds: 0,
        };
        let refused = call(&forwarder, &bob, Command::ModifyAckDeadline, &extend).await;
        assert_eq!(refused.unwrap_err().code, ErrorCode::PermissionDenied);
        let acknowledge = AcknowledgeRequest { subscription: "reader".into(), ack_ids };
        let refused = call(&forwarder, &bob, Command::Acknowledge, &acknowledge).await;
        assert_eq!(refused.unwrap_err().code, ErrorCode::PermissionDenied);
        let entry = forwarder.subscription("reader").unwrap().0;
        assert_eq!(
            entry.state.borrow().ack_floor().get(),
            0,
            "a refused acknowledgement acknowledges nothing"
        );
        call(&forwarder, &alice, Command::Acknowledge, &acknowledge).await.unwrap();
        assert_eq!(entry.state.borrow().ack_floor().get(), 1);
    });
}

/// The connection's reading loop answers an Authenticate itself; one that reached a handler
/// would be the server's mistake, not the client's.
#[test]
fn an_authenticate_request_is_not_a_handlers() {
    run(async {
        let forwarder = forwarder().await;
        let request = AuthenticateRequest { token: "rpt_0".into() };
        let refused = call(&forwarder, &Responder::unconnected(), Command::Authenticate, &request).await;
        assert_eq!(refused.unwrap_err().code, ErrorCode::Internal);
    });
}

/// The body of a native request, as a carried request holds it.
fn native_body<T: Body>(command: Command, request: &T) -> Vec<u8> {
    ringpost_wire::encode_frame(command.code(), 0, 1, request)[FRAME_HEADER_BYTES..].to_vec()
}

fn carried<T: Body>(principal: Option<&str>, command: Command, request: &T) -> CarriedRequest {
    CarriedRequest {
        principal: principal.map(str::to_owned),
        command: command.code(),
        body: native_body(command, request),
        client_keeps_leases: false,
    }
}

/// A request another node's forwarder carried here is decided for the principal that node
/// names, with this shard's rules, as the principal's own request would be; only a node of the
/// cluster may carry one, and what was carried is not carried again.
#[test]
fn a_carried_request_is_decided_here_for_the_principal_the_carrying_node_names() {
    run(async {
        let secret = "rpt_the-forwarder-tests-cluster-secret-0123456789";
        let access = required_access("carried", ACCESS_FILE);
        let access =
            Rc::new(Rc::try_unwrap(access).ok().expect("one owner").with_cluster_secret(Some(secret)));
        let forwarder = forwarder().await;
        let log = forwarder.topic("retained").unwrap().log.clone();
        let node = Responder::with_session(access.authenticate_token(secret).unwrap(), access.clone());
        assert!(node.is_cluster_peer());

        let publish = |principal| carried(principal, Command::Publish, &publish_request("retained"));
        let refused = call(&forwarder, &node, Command::Carried, &publish(Some("bob"))).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied, "{refused:?}");
        assert!(refused.message.contains("bob"), "the refusal names the principal: {}", refused.message);
        let refused = call(&forwarder, &node, Command::Carried, &publish(None)).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unauthenticated, "{refused:?}");
        assert_eq!(
            log.next_offset(),
            crate::ids::Offset::new(0),
            "a refused carried publish appends nothing"
        );
        call(&forwarder, &node, Command::Carried, &publish(Some("alice"))).await.unwrap();
        assert_eq!(log.end_offset().get(), 1);

        let pull = |principal| carried(principal, Command::Pull, &pull_request());
        let refused = call(&forwarder, &node, Command::Carried, &pull(Some("bob"))).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied, "{refused:?}");
        let delivered =
            pulled(&call(&forwarder, &node, Command::Carried, &pull(Some("alice"))).await.unwrap());
        assert_eq!(delivered.len(), 1);
        let acknowledge =
            AcknowledgeRequest { subscription: "reader".into(), ack_ids: vec![delivered[0].ack_id.clone()] };
        let refused = call(
            &forwarder,
            &node,
            Command::Carried,
            &carried(Some("bob"), Command::Acknowledge, &acknowledge),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied, "{refused:?}");
        let answer = call(
            &forwarder,
            &node,
            Command::Carried,
            &carried(Some("alice"), Command::Acknowledge, &acknowledge),
        )
        .await
        .unwrap();
        let answer = ringpost_wire::decode_body::<AckResponse>(&answer).unwrap();
        assert!(answer.invalid_ack_ids.is_empty(), "{answer:?}");

        // A client may not vouch for anyone, itself included.
        let alice = as_principal(&access, "alice");
        let refused = call(&forwarder, &alice, Command::Carried, &publish(Some("alice"))).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unauthenticated, "{refused:?}");
        // What is carried is a data-plane request, never another carried one.
        let nested = carried(Some("alice"), Command::Carried, &publish(Some("alice")));
        let refused = call(&forwarder, &node, Command::Carried, &nested).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidArgument, "{refused:?}");
        let control = carried(Some("alice"), Command::DeleteTopic, &NameRequest { name: "retained".into() });
        let refused = call(&forwarder, &node, Command::Carried, &control).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidArgument, "{refused:?}");
        assert_eq!(log.end_offset().get(), 1);
    });
}
