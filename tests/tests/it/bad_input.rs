//! Bad input gets a clear error and loses nothing: invalid names, sizes and counts, unknown
//! resources and ack ids, and hostile frames on a raw socket. Every other client carries on.

use ringpost_client::{block_on, Client, ErrorCode, Message, Subscription};
use ringpost_tests::Daemon;
use ringpost_wire::frame::{decode_error, encode_frame, FrameHeader};
use ringpost_wire::limits::*;
use ringpost_wire::messages::{HelloRequest, NameRequest};
use ringpost_wire::Command;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn code<T: std::fmt::Debug>(result: Result<T, ringpost_client::Error>) -> (ErrorCode, String) {
    let error = result.expect_err("expected an error");
    (error.code(), error.to_string())
}

fn setup(label: &str) -> (Daemon, Client) {
    let daemon = Daemon::start(label);
    let client = daemon.client();
    block_on(client.create_topic("input")).unwrap();
    block_on(client.create_subscription(Subscription {
        name: "input-sub".into(),
        topic: "input".into(),
        ..Default::default()
    }))
    .unwrap();
    (daemon, client)
}

#[test]
fn invalid_names_and_unknown_resources() {
    let (_daemon, client) = setup("names");
    for bad in ["ab", "9starts-with-digit", "goog-reserved", "has space", "slash/inside", &"x".repeat(256)] {
        let (code, text) = code(block_on(client.create_topic(bad)));
        assert_eq!(code, ErrorCode::InvalidArgument, "{bad}: {text}");
    }
    assert_eq!(code(block_on(client.create_topic("input"))).0, ErrorCode::AlreadyExists);
    assert_eq!(code(block_on(client.get_topic("nothing"))).0, ErrorCode::NotFound);
    assert_eq!(code(block_on(client.publish("nothing", vec![Message::new("x")]))).0, ErrorCode::NotFound);
    assert_eq!(code(block_on(client.pull("nothing", 1, 0))).0, ErrorCode::NotFound);
    assert_eq!(code(block_on(client.delete_subscription("nothing"))).0, ErrorCode::NotFound);
    let bad_deadline = Subscription {
        name: "deadline".into(),
        topic: "input".into(),
        ack_deadline_seconds: 5,
        ..Default::default()
    };
    assert_eq!(code(block_on(client.create_subscription(bad_deadline))).0, ErrorCode::InvalidArgument);
    let filtered = Subscription {
        name: "filtered".into(),
        topic: "input".into(),
        filter: "attributes.x = y".into(),
        ..Default::default()
    };
    let (code_found, text) = code(block_on(client.create_subscription(filtered)));
    assert_eq!(code_found, ErrorCode::InvalidArgument);
    assert!(text.contains("position 15"), "the error names where the filter is wrong: {text}");
    let no_dead_letter_topic = Subscription {
        name: "dead".into(),
        topic: "input".into(),
        dead_letter_topic: "missing".into(),
        ..Default::default()
    };
    assert_eq!(code(block_on(client.create_subscription(no_dead_letter_topic))).0, ErrorCode::NotFound);
    let too_few_attempts = Subscription {
        name: "dead".into(),
        topic: "input".into(),
        dead_letter_topic: "input".into(),
        max_delivery_attempts: 4,
        ..Default::default()
    };
    assert_eq!(code(block_on(client.create_subscription(too_few_attempts))).0, ErrorCode::InvalidArgument);
}

#[test]
fn message_limits_are_enforced_and_nothing_is_stored() {
    let (_daemon, client) = setup("limits");
    let cases: Vec<(Vec<Message>, &str)> = vec![
        (vec![Message::new("")], "empty"),
        (
            vec![(0..101).fold(Message::new("x"), |m, i| m.attribute(format!("k{i}"), "v"))],
            "ATTRIBUTES_COUNT_MAX",
        ),
        (vec![Message::new("x").attribute("k".repeat(257), "v")], "ATTRIBUTE_KEY_BYTES_MAX"),
        (vec![Message::new("x").attribute("k", "v".repeat(1025))], "ATTRIBUTE_VALUE_BYTES_MAX"),
        (vec![Message::new("x").ordering_key("o".repeat(1025))], "ORDERING_KEY_BYTES_MAX"),
        (vec![Message::new(vec![7u8; MESSAGE_BYTES_MAX + 1])], "MESSAGE_BYTES_MAX"),
        ((0..1001).map(|_| Message::new("x")).collect(), "PUBLISH_BATCH_MESSAGES_MAX"),
        (vec![], "no messages"),
    ];
    // The client refuses them before sending; the server, sent them past the client's checks
    // on a connection of their own to the topic's forwarder, refuses them the same way.
    let forwarder = block_on(client.lookup_topic("input")).unwrap()[0].clone();
    let raw = ringpost_client::Connection::connect(&forwarder).unwrap();
    for (messages, limit) in cases {
        let request = ringpost_wire::messages::PublishRequest {
            topic: "input".into(),
            messages: messages.iter().map(|message| message.0.clone()).collect(),
        };
        let (code, text) = code(block_on(client.publish("input", messages)));
        assert_eq!(code, ErrorCode::InvalidArgument, "{limit}: {text}");
        assert!(text.contains(limit), "the error should name {limit}: {text}");
        let response = block_on(raw.call(Command::Publish.code(), &request)).unwrap();
        assert!(response.header.is_error(), "the server took a message over {limit}");
        let refusal = decode_error(&response.body);
        assert_eq!(refusal.code, ErrorCode::InvalidArgument, "{limit}: {refusal:?}");
        assert!(refusal.message.contains(limit), "the server's error should name {limit}: {refusal:?}");
    }
    // A message with only attributes is valid, and the largest message fits.
    block_on(client.publish("input", vec![Message::default().attribute("only", "attributes")])).unwrap();
    block_on(client.publish("input", vec![Message::new(vec![1u8; MESSAGE_BYTES_MAX - 10])])).unwrap();
    let delivered = block_on(client.pull("input-sub", 10, 0)).unwrap();
    assert_eq!(delivered.len(), 2, "only the two valid publishes were stored");
    assert_eq!(delivered[1].data.len(), MESSAGE_BYTES_MAX - 10);
    for max in [0, PULL_MESSAGES_MAX + 1] {
        assert_eq!(code(block_on(client.pull("input-sub", max, 0))).0, ErrorCode::InvalidArgument);
    }
}

#[test]
fn unknown_and_foreign_ack_ids_are_refused_clearly() {
    let (_daemon, client) = setup("ack-ids");
    block_on(client.create_subscription(Subscription {
        name: "other".into(),
        topic: "input".into(),
        ..Default::default()
    }))
    .unwrap();
    block_on(client.publish("input", vec![Message::new("m")])).unwrap();
    let foreign = block_on(client.pull("other", 1, 0)).unwrap().remove(0).ack_id;
    let refused = block_on(client.acknowledge(
        "input-sub",
        vec!["not-an-ack-id".into(), "1.2.3".into(), foreign, "ffffffffffffffff.0.1".into()],
    ))
    .unwrap();
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert!(refused.iter().all(|r| !r.reason.is_empty()));
    assert_eq!(code(block_on(client.acknowledge("input-sub", vec![]))).0, ErrorCode::InvalidArgument);
    let too_many: Vec<String> = (0..ACK_IDS_PER_REQUEST_MAX + 1).map(|i| i.to_string()).collect();
    assert_eq!(code(block_on(client.acknowledge("input-sub", too_many))).0, ErrorCode::InvalidArgument);
    // The message is still there for its own subscription.
    assert_eq!(block_on(client.pull("input-sub", 10, 0)).unwrap().len(), 1);
}

fn read_frame(stream: &mut TcpStream) -> Option<(FrameHeader, Vec<u8>)> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).ok()?;
    let header = FrameHeader::decode(&header).expect("the server sends valid headers");
    let mut body = ringpost_wire::FrameBuffer::with_capacity(header.body_length as usize);
    body.resize(header.body_length as usize, 0);
    stream.read_exact(&mut body).ok()?;
    Some((header, body.to_vec()))
}

fn error_code(body: &[u8]) -> ErrorCode {
    let mut aligned = ringpost_wire::FrameBuffer::new();
    aligned.extend_from_slice(body);
    decode_error(&aligned).code
}

fn expect_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let result = stream.read_to_end(&mut rest);
    assert!(result.is_ok(), "the server should close the connection: {result:?}");
}

#[test]
fn hostile_frames_close_only_their_own_connection() {
    let (daemon, client) = setup("hostile");
    let connect = || {
        let stream = TcpStream::connect(&daemon.address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
    };

    // A 4 GiB length prefix: refused before any allocation, connection closed.
    let mut stream = connect();
    let header =
        FrameHeader { body_length: u32::MAX, command: Command::CreateTopic.code(), flags: 0, request_id: 9 };
    stream.write_all(&header.encode()).unwrap();
    let (reply, body) = read_frame(&mut stream).expect("an error reply");
    assert!(reply.is_error());
    assert_eq!(error_code(&body), ErrorCode::ProtocolError);
    expect_closed(&mut stream);

    // A valid length with garbage rkyv bytes: ProtocolError, then closed.
    let mut stream = connect();
    let garbage = vec![0xA5u8; 64];
    let header =
        FrameHeader { body_length: 64, command: Command::CreateTopic.code(), flags: 0, request_id: 10 };
    stream.write_all(&header.encode()).unwrap();
    stream.write_all(&garbage).unwrap();
    let (reply, body) = read_frame(&mut stream).expect("an error reply");
    assert_eq!(reply.request_id, 10);
    assert_eq!(error_code(&body), ErrorCode::ProtocolError);
    expect_closed(&mut stream);

    // An unknown command is refused but the connection stays usable.
    let mut stream = connect();
    let unknown = encode_frame(999, 0, 11, &NameRequest { name: "x".into() });
    stream.write_all(&unknown).unwrap();
    let (reply, body) = read_frame(&mut stream).unwrap();
    assert_eq!(reply.request_id, 11);
    assert_eq!(error_code(&body), ErrorCode::Unimplemented);
    let hello = encode_frame(
        Command::Hello.code(),
        0,
        12,
        &HelloRequest { protocol_version: PROTOCOL_VERSION, client_name: "raw".into() },
    );
    stream.write_all(&hello).unwrap();
    let (reply, _) = read_frame(&mut stream).unwrap();
    assert_eq!(reply.request_id, 12);
    assert!(!reply.is_error());

    // A truncated frame followed by EOF, and a bare header that never sends its body.
    let mut stream = connect();
    let frame = encode_frame(Command::CreateTopic.code(), 0, 13, &NameRequest { name: "half".into() });
    stream.write_all(&frame[..frame.len() / 2]).unwrap();
    drop(stream);
    let mut idle = connect();
    idle.write_all(&FrameHeader { body_length: 1 << 20, command: 10, flags: 0, request_id: 14 }.encode())
        .unwrap();

    // Everyone else carries on, and nothing was created by the hostile frames.
    block_on(client.publish("input", vec![Message::new("still fine")])).unwrap();
    assert_eq!(block_on(client.pull("input-sub", 10, 0)).unwrap().len(), 1);
    let fresh = daemon.client();
    assert_eq!(block_on(fresh.list_topics()).unwrap().len(), 1);
}
