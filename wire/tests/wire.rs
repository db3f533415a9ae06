//! The test suite of `ringpost-wire`: the command and error tables, frame round trips for every
//! body type, property tests of the codec and the splitter, hostile inputs, and validation.
//!
//! One binary on purpose: it links the crate once and runs in a few seconds on two cores.

use std::fmt::Debug;

use ringpost_wire::frame::{decode_error, Body, FLAGS_KNOWN, FLAG_ERROR, FLAG_RESPONSE};
use ringpost_wire::limits::*;
use ringpost_wire::messages::*;
use ringpost_wire::{
    access_body, decode_body, encode_error, encode_frame, encode_frame_sized, Command, ErrorCode, Frame,
    FrameBuffer, FrameError, FrameHeader, FrameSplitter, Status,
};
use rkyv::api::high::{HighDeserializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::{rancor, Deserialize, Portable};

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// Copies `bytes` to the start of a fresh 16-byte aligned buffer, as the daemon reads bodies.
fn aligned(bytes: &[u8]) -> FrameBuffer {
    let mut buffer = FrameBuffer::with_capacity(bytes.len().max(1));
    buffer.extend_from_slice(bytes);
    buffer
}

/// Whether `bytes` starts on a 16-byte boundary, as `access_body` requires.
fn is_aligned_16(bytes: &[u8]) -> bool {
    bytes.as_ptr() as usize & 15 == 0
}

/// The body of an encoded frame, copied into its own aligned buffer.
fn body_of(frame: &FrameBuffer) -> FrameBuffer {
    aligned(&frame[FRAME_HEADER_BYTES..])
}

/// Encodes `value` in a frame, checks the header, reads the body back in place, and checks the
/// same body through a `FrameSplitter` fed one byte at a time.
fn check_round_trip<T>(command: Command, flags: u16, request_id: u64, value: &T)
where
    T: Body + PartialEq + Debug,
    T::Archived: Portable
        + for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let frame = encode_frame(command.code(), flags, request_id, value);
    assert!(is_aligned_16(&frame), "frames are built in aligned buffers");
    assert!(frame.len() >= FRAME_HEADER_BYTES);

    let header = FrameHeader::decode(&frame).expect("a frame we built has a valid header");
    assert_eq!(header.body_length as usize, frame.len() - FRAME_HEADER_BYTES);
    assert_eq!(header.command, command.code());
    assert_eq!(header.flags, flags);
    assert_eq!(header.request_id, request_id);
    assert_eq!(header.is_response(), flags & FLAG_RESPONSE != 0);
    assert_eq!(header.is_error(), flags & FLAG_ERROR != 0);
    assert_eq!(Command::from_u16(header.command), Some(command));

    // In place, straight from the frame buffer: the 16-byte header keeps the body aligned.
    let archived = access_body::<T>(&frame[FRAME_HEADER_BYTES..]).expect("a body we built validates");
    let back = rkyv::deserialize::<T, rancor::Error>(archived).expect("deserialize");
    assert_eq!(&back, value);

    // Through the splitter, one byte at a time. (Empty bodies are checked separately: see
    // `hostile::empty_body_from_splitter_is_accessible`.)
    let mut splitter = FrameSplitter::new();
    let mut frames = Vec::new();
    for byte in frame.iter() {
        frames.extend(splitter.push(std::slice::from_ref(byte)).expect("valid stream"));
    }
    assert_eq!(frames.len(), 1);
    assert_eq!(splitter.buffered_bytes(), 0);
    assert_eq!(frames[0].header, header);
    assert_eq!(&frames[0].body[..], &frame[FRAME_HEADER_BYTES..]);
    if header.body_length > 0 {
        let back = decode_body::<T>(&frames[0].body).expect("splitter body validates");
        assert_eq!(&back, value);
    }
}

fn attribute(key: &str, value: &str) -> Attribute {
    Attribute { key: key.to_owned(), value: value.to_owned() }
}

fn sample_publish() -> PublishRequest {
    PublishRequest {
        topic: "orders-with-a-long-name".to_owned(),
        messages: vec![
            PubsubMessage {
                data: b"hello world, this is a message body".to_vec(),
                attributes: vec![attribute("origin", "eu-west"), attribute("kind", "order.created")],
                ordering_key: "customer-42".to_owned(),
            },
            PubsubMessage { data: vec![0, 1, 2, 3, 255], attributes: vec![], ordering_key: String::new() },
            PubsubMessage {
                data: vec![],
                attributes: vec![attribute("only", "attributes here")],
                ordering_key: "k".to_owned(),
            },
        ],
    }
}

fn sample_subscription() -> Subscription {
    Subscription {
        name: "orders-billing".to_owned(),
        topic: "orders".to_owned(),
        ack_deadline_seconds: 30,
        retain_acked_messages: true,
        message_retention_seconds: 86_400,
        enable_message_ordering: true,
        filter: "attributes.kind = \"order.created\"".to_owned(),
        dead_letter_topic: "orders-dead".to_owned(),
        max_delivery_attempts: 5,
        minimum_backoff_seconds: 10,
        maximum_backoff_seconds: 600,
        expiration_ttl_seconds: 31 * 24 * 3600,
    }
}

fn sample_received(n: u64) -> ReceivedMessage {
    ReceivedMessage {
        ack_id: format!("ack-{n:016x}"),
        message_id: n,
        publish_time_ms: 1_700_000_000_000 + n,
        data: vec![n as u8; (n as usize) % 40],
        attributes: vec![attribute("n", &n.to_string())],
        ordering_key: if n.is_multiple_of(2) { String::new() } else { format!("key-{n}") },
        delivery_attempt: n as u32 + 1,
    }
}

/// A frame as the reference splitter sees it: its header and its body bytes.
type RawFrame = (FrameHeader, Vec<u8>);

/// Splits `stream` the way the splitter should, without its state machine: the frames it
/// completes, then `Err` at the first bad header, or `Ok(bytes still buffered)` at the end.
fn reference_split(mut stream: &[u8]) -> (Vec<RawFrame>, Result<usize, FrameError>) {
    let mut frames = Vec::new();
    loop {
        if stream.len() < FRAME_HEADER_BYTES {
            return (frames, Ok(stream.len()));
        }
        let header = match FrameHeader::decode(&stream[..FRAME_HEADER_BYTES]) {
            Ok(header) => header,
            Err(error) => return (frames, Err(error)),
        };
        let end = FRAME_HEADER_BYTES + header.body_length as usize;
        if stream.len() < end {
            // The splitter has consumed the header and holds only the body bytes so far.
            return (frames, Ok(stream.len() - FRAME_HEADER_BYTES));
        }
        frames.push((header, stream[FRAME_HEADER_BYTES..end].to_vec()));
        stream = &stream[end..];
    }
}

/// Feeds `stream` to a new splitter in chunks cut at `cuts` (positions, any order, clamped),
/// collecting frames until the first error.
fn split_chunked(stream: &[u8], cuts: &[usize]) -> (Vec<Frame>, Result<usize, FrameError>, FrameSplitter) {
    let mut cuts: Vec<usize> = cuts.iter().map(|cut| (*cut).min(stream.len())).collect();
    cuts.push(stream.len());
    cuts.sort_unstable();
    let mut splitter = FrameSplitter::new();
    let mut frames = Vec::new();
    let mut start = 0;
    for cut in cuts {
        match splitter.push(&stream[start..cut]) {
            Ok(more) => frames.extend(more),
            Err(error) => return (frames, Err(error), splitter),
        }
        start = cut;
    }
    let buffered = splitter.buffered_bytes();
    (frames, Ok(buffered), splitter)
}

// ---------------------------------------------------------------------------------------------
// 1. The command and error tables
// ---------------------------------------------------------------------------------------------

mod tables {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn command_codes_are_unique() {
        let codes: HashSet<u16> = Command::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(codes.len(), Command::ALL.len(), "duplicate command code in Command::ALL");
        let commands: HashSet<Command> = Command::ALL.iter().copied().collect();
        assert_eq!(commands.len(), Command::ALL.len(), "duplicate command in Command::ALL");
    }

    #[test]
    fn every_command_round_trips_through_its_code() {
        for command in Command::ALL {
            assert_eq!(Command::from_u16(command.code()), Some(command), "{command:?}");
        }
    }

    #[test]
    fn every_accepted_command_code_is_in_the_table() {
        let mut accepted = 0;
        for code in 0..=u16::MAX {
            if let Some(command) = Command::from_u16(code) {
                accepted += 1;
                assert_eq!(command.code(), code, "from_u16({code}) gave {command:?}");
                assert!(
                    Command::ALL.contains(&command),
                    "{command:?} (code {code}) missing from Command::ALL"
                );
            }
        }
        assert_eq!(accepted, Command::ALL.len());
        assert_eq!(Command::from_u16(0), None, "code 0 is not a command");
    }

    #[test]
    fn data_plane_commands_are_not_control_plane() {
        for command in Command::ALL {
            let data_plane = matches!(
                command,
                Command::Publish
                    | Command::Pull
                    | Command::Acknowledge
                    | Command::ModifyAckDeadline
                    | Command::StreamingPull
            );
            assert_eq!(command.is_control_plane(), !data_plane, "{command:?}");
        }
    }

    #[test]
    fn error_codes_are_unique_and_in_number_order() {
        let codes: Vec<u32> = ErrorCode::ALL.iter().map(|c| *c as u32).collect();
        let unique: HashSet<u32> = codes.iter().copied().collect();
        assert_eq!(unique.len(), codes.len(), "duplicate error code in ErrorCode::ALL");
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        assert_eq!(codes, sorted, "ErrorCode::ALL is documented to be in number order");
        let names: HashSet<&str> = ErrorCode::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), codes.len(), "duplicate error code name");
    }

    #[test]
    fn every_error_code_round_trips_through_its_number() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u32(code as u32), Some(code), "{code:?}");
            assert_eq!(code.to_string(), code.name());
            assert_eq!(format!("{code:?}"), code.name(), "name() matches the variant name");
        }
    }

    #[test]
    fn every_accepted_error_number_is_in_the_table() {
        let mut accepted = 0;
        for value in 0..=1000u32 {
            if let Some(code) = ErrorCode::from_u32(value) {
                accepted += 1;
                assert_eq!(code as u32, value);
                assert!(ErrorCode::ALL.contains(&code));
            }
        }
        assert_eq!(accepted, ErrorCode::ALL.len());
        assert_eq!(ErrorCode::from_u32(u32::MAX), None);
    }

    #[test]
    fn error_codes_0_to_16_are_grpcs() {
        let grpc = [
            (0, ErrorCode::Ok),
            (1, ErrorCode::Cancelled),
            (2, ErrorCode::Unknown),
            (3, ErrorCode::InvalidArgument),
            (4, ErrorCode::DeadlineExceeded),
            (5, ErrorCode::NotFound),
            (6, ErrorCode::AlreadyExists),
            (7, ErrorCode::PermissionDenied),
            (8, ErrorCode::ResourceExhausted),
            (9, ErrorCode::FailedPrecondition),
            (10, ErrorCode::Aborted),
            (11, ErrorCode::OutOfRange),
            (12, ErrorCode::Unimplemented),
            (13, ErrorCode::Internal),
            (14, ErrorCode::Unavailable),
            (15, ErrorCode::DataLoss),
            (16, ErrorCode::Unauthenticated),
        ];
        for (number, code) in grpc {
            assert_eq!(code as u32, number, "{code:?}");
            assert_eq!(ErrorCode::from_u32(number), Some(code));
        }
        // Ringpost's own codes start at 100.
        for code in ErrorCode::ALL {
            let number = code as u32;
            assert!(number <= 16 || number >= 100, "{code:?} = {number} is in the reserved gap");
        }
        assert_eq!(ErrorCode::NotOwner as u32, 100);
        assert_eq!(ErrorCode::ProtocolError as u32, 101);
    }

    #[test]
    fn retryable_codes_are_pubsubs_publish_retry_set() {
        let retryable: HashSet<ErrorCode> =
            ErrorCode::ALL.iter().copied().filter(|c| c.is_retryable()).collect();
        let expected: HashSet<ErrorCode> = [
            ErrorCode::Unavailable,
            ErrorCode::ResourceExhausted,
            ErrorCode::Aborted,
            ErrorCode::DeadlineExceeded,
            ErrorCode::Internal,
            ErrorCode::Unknown,
        ]
        .into_iter()
        .collect();
        assert_eq!(retryable, expected);
    }

    #[test]
    fn status_display_and_constructors() {
        let status = Status::invalid_argument("bad topic");
        assert_eq!(status.code, ErrorCode::InvalidArgument);
        assert_eq!(status.to_string(), "InvalidArgument: bad topic");
        assert_eq!(Status::not_found("x").code, ErrorCode::NotFound);
        assert_eq!(Status::already_exists("x").code, ErrorCode::AlreadyExists);
        assert_eq!(Status::unavailable("x").code, ErrorCode::Unavailable);
        assert_eq!(Status::internal("x").code, ErrorCode::Internal);
        assert_eq!(Status::resource_exhausted("x").code, ErrorCode::ResourceExhausted);
        assert_eq!(Status::failed_precondition("x").code, ErrorCode::FailedPrecondition);
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Round trips of every body type
// ---------------------------------------------------------------------------------------------

mod round_trips {
    use super::*;
    use ringpost_wire::borrowed::{
        AttributeRef, BytesRef, PublishResponseRange, PullResponseRef, ReceivedMessageRef, StrRef,
    };

    /// The borrowed twin of `owned`, as the server builds it from the batches it read.
    fn borrowed(owned: &PullResponse) -> PullResponseRef<'_> {
        PullResponseRef {
            received_messages: owned
                .received_messages
                .iter()
                .map(|message| ReceivedMessageRef {
                    ack_id: StrRef(&message.ack_id),
                    message_id: message.message_id,
                    publish_time_ms: message.publish_time_ms,
                    data: BytesRef(&message.data),
                    attributes: message
                        .attributes
                        .iter()
                        .map(|attribute| AttributeRef {
                            key: StrRef(&attribute.key),
                            value: StrRef(&attribute.value),
                        })
                        .collect(),
                    ordering_key: StrRef(&message.ordering_key),
                    delivery_attempt: message.delivery_attempt,
                })
                .collect(),
        }
    }

    /// The borrowed pull response the server encodes is the same bytes as the owned one, and
    /// reads back as it.
    #[test]
    fn a_borrowed_pull_response_encodes_to_the_same_bytes() {
        for count in [0u64, 1, 2, 9, 300] {
            let mut owned = PullResponse { received_messages: (0..count).map(sample_received).collect() };
            for message in owned.received_messages.iter_mut().step_by(4) {
                message.data = vec![3; 1500];
                message.ack_id = "a-rather-long-ack-id.ff.1".into();
                message.attributes.push(attribute("a-long-attribute-key", "and a long value for it"));
            }
            let expected = encode_frame(Command::Pull.code(), FLAG_RESPONSE, 5, &owned);
            let frame = encode_frame(Command::Pull.code(), FLAG_RESPONSE, 5, &borrowed(&owned));
            assert_eq!(&frame[..], &expected[..], "{count} messages");
            let decoded: PullResponse = decode_body(&body_of(&frame)).unwrap();
            assert_eq!(decoded, owned);
        }
    }

    /// A publish response written from its range of ids is the same bytes as one of a vector of
    /// them, and reads back as it: empty, one id (a one-message publish), many, ids with a
    /// source in their high bits, and the last ids there are.
    #[test]
    fn a_publish_response_from_a_range_encodes_to_the_same_bytes() {
        let high = 5u64 << 48;
        for ids in [0..0, 7..8, 0..1, 0..1000, high + 41..high + 44, u64::MAX - 3..u64::MAX] {
            let owned = PublishResponse { message_ids: ids.clone().collect() };
            let expected = encode_frame(Command::Publish.code(), FLAG_RESPONSE, 6, &owned);
            let range = PublishResponseRange(ids.clone());
            assert_eq!(range.len(), owned.message_ids.len());
            let frame = encode_frame(Command::Publish.code(), FLAG_RESPONSE, 6, &range);
            assert_eq!(&frame[..], &expected[..], "ids {ids:?}");
            let decoded: PublishResponse = decode_body(&body_of(&frame)).unwrap();
            assert_eq!(decoded, owned);
        }
    }

    /// A pull's estimate covers its encoding, so the frame is written into one buffer without
    /// growing it; and a sized frame is the same bytes as an unsized one.
    #[test]
    fn a_pull_response_estimate_covers_its_encoding() {
        for count in [0u64, 1, 7, 1000] {
            let mut owned = PullResponse { received_messages: (0..count).map(sample_received).collect() };
            for message in owned.received_messages.iter_mut().step_by(3) {
                message.data = vec![7; 1024];
                message.attributes.push(attribute("region", "europe-west1"));
            }
            let response = borrowed(&owned);
            let frame = encode_frame(Command::Pull.code(), FLAG_RESPONSE, 9, &response);
            let estimate = FRAME_HEADER_BYTES + response.encoded_bytes_estimate();
            assert!(estimate >= frame.len(), "{count} messages: estimate {estimate} < {}", frame.len());
            assert!(estimate <= frame.len() * 2 + 64, "{count} messages: estimate {estimate} is far off");
            let sized = encode_frame_sized(Command::Pull.code(), FLAG_RESPONSE, 9, &response, estimate);
            assert_eq!(&sized[..], &frame[..]);
            assert_eq!(sized.capacity(), estimate.max(FRAME_HEADER_BYTES), "never grown");
        }
    }

    #[test]
    fn header_encode_decode() {
        let header =
            FrameHeader { body_length: 1234, command: 30, flags: FLAG_RESPONSE, request_id: u64::MAX - 7 };
        let bytes = header.encode();
        assert_eq!(&bytes[0..4], &1234u32.to_le_bytes(), "little-endian body length first");
        assert_eq!(&bytes[4..6], &30u16.to_le_bytes());
        assert_eq!(&bytes[6..8], &FLAG_RESPONSE.to_le_bytes());
        assert_eq!(&bytes[8..16], &(u64::MAX - 7).to_le_bytes());
        assert_eq!(FrameHeader::decode(&bytes), Ok(header));
        // Extra bytes after the header are ignored by decode.
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"body");
        assert_eq!(FrameHeader::decode(&longer), Ok(header));
    }

    #[test]
    fn error_body() {
        check_round_trip(
            Command::Publish,
            FLAG_RESPONSE | FLAG_ERROR,
            1,
            &ErrorBody { code: ErrorCode::NotOwner as u32, message: "ask the router again".to_owned() },
        );
    }

    #[test]
    fn empty() {
        check_round_trip(Command::DeleteTopic, FLAG_RESPONSE, 2, &Empty {});
    }

    #[test]
    fn hello() {
        check_round_trip(
            Command::Hello,
            0,
            3,
            &HelloRequest {
                protocol_version: PROTOCOL_VERSION,
                client_name: "ringpost-client/0.1".to_owned(),
            },
        );
        check_round_trip(
            Command::Hello,
            FLAG_RESPONSE,
            3,
            &HelloResponse {
                protocol_version: PROTOCOL_VERSION,
                server_version: "ringpost 0.1.0".to_owned(),
                frame_body_bytes_max: FRAME_BODY_BYTES_MAX as u32,
                message_bytes_max: MESSAGE_BYTES_MAX as u32,
                publish_batch_messages_max: PUBLISH_BATCH_MESSAGES_MAX as u32,
            },
        );
    }

    #[test]
    fn update_requests() {
        check_round_trip(
            Command::UpdateTopic,
            0,
            5,
            &UpdateTopicRequest {
                topic: Topic { name: "orders".to_owned(), message_retention_seconds: 3600 },
                update_mask: vec!["message_retention_duration".to_owned()],
            },
        );
        check_round_trip(
            Command::UpdateSubscription,
            0,
            6,
            &UpdateSubscriptionRequest {
                subscription: sample_subscription(),
                update_mask: vec!["ack_deadline_seconds".to_owned(), "dead_letter_policy".to_owned()],
            },
        );
    }

    /// A topic's sources' bodies (commands 17 to 19, and 121).
    #[test]
    fn topics_with_sources() {
        let topic = Topic { name: "projects/p/topics/hot".to_owned(), message_retention_seconds: 60 };
        let create = CreateTopicWithSourcesRequest { topic: topic.clone(), replicas: 3, sources: 2 };
        check_round_trip(Command::CreateTopicWithSources, 0, 10, &create);
        let update = UpdateTopicSourcesRequest { name: topic.name.clone(), sources: 4 };
        check_round_trip(Command::UpdateTopicSources, 0, 11, &update);
        let policy = TopicSourcePolicyRequest {
            name: topic.name.clone(),
            change: true,
            sources_min: 1,
            sources_max: 4,
        };
        check_round_trip(Command::TopicSourcePolicy, 0, 12, &policy);
        let shown = TopicWithSources {
            topic,
            replicas: 3,
            sources: vec![
                TopicSource { number: 0, leader_node: 1, leader_shard: 0 },
                TopicSource { number: 1, leader_node: 2, leader_shard: 1 },
            ],
        };
        check_round_trip(Command::GetTopicWithSources, FLAG_RESPONSE, 12, &shown.clone());
        check_round_trip(Command::GetTopicWithSources, FLAG_RESPONSE, 13, &TopicWithSources::default());
        let followed = TopicWithSourcePolicy { topic: shown, auto: true, sources_min: 1, sources_max: 4 };
        check_round_trip(Command::TopicSourcePolicy, FLAG_RESPONSE, 14, &followed);
    }

    /// The schemas' bodies (commands 31 to 39 and 44 to 47), every field set and none.
    #[test]
    fn schemas_and_topics_with_schemas() {
        let schema = Schema {
            name: "orders".to_owned(),
            schema_type: 2,
            definition: r#"{"type": "record", "name": "Order", "fields": []}"#.to_owned(),
            revision_id: "0a1b2c3d".to_owned(),
            revision_create_time_ms: 1_700_000_000_000,
        };
        let request =
            SchemaRequest { name: "orders".to_owned(), schema_type: 1, definition: "syntax".to_owned() };
        for command in [Command::CreateSchema, Command::CommitSchema, Command::ValidateSchema] {
            check_round_trip(command, 0, 1, &request);
            check_round_trip(command, 0, 2, &SchemaRequest::default());
        }
        check_round_trip(Command::CreateSchema, FLAG_RESPONSE, 1, &schema);
        check_round_trip(Command::GetSchema, FLAG_RESPONSE, 3, &Schema::default());
        let get =
            GetSchemaRequest { name: "orders".to_owned(), revision_id: "0a1b2c3d".to_owned(), full: true };
        check_round_trip(Command::GetSchema, 0, 3, &get);
        let list = ListSchemasRequest {
            name: "orders".to_owned(),
            page_size: 5,
            page_token: "a".to_owned(),
            full: true,
        };
        check_round_trip(Command::ListSchemas, 0, 4, &list);
        check_round_trip(Command::ListSchemaRevisions, 0, 4, &ListSchemasRequest::default());
        let page =
            SchemaList { schemas: vec![schema.clone(), Schema::default()], next_page_token: "b".to_owned() };
        check_round_trip(Command::ListSchemaRevisions, FLAG_RESPONSE, 4, &page);
        let revision =
            SchemaRevisionRequest { name: "orders".to_owned(), revision_id: "0a1b2c3d".to_owned() };
        check_round_trip(Command::RollbackSchema, 0, 5, &revision);
        check_round_trip(Command::DeleteSchemaRevision, 0, 6, &revision);
        check_round_trip(Command::DeleteSchema, 0, 7, &NameRequest { name: "orders".to_owned() });
        let message = ValidateMessageRequest {
            name: "orders".to_owned(),
            revision_id: "0a1b2c3d".to_owned(),
            schema_type: 2,
            definition: "{}".to_owned(),
            encoding: 2,
            message: vec![0, 1, 2, 255],
        };
        check_round_trip(Command::ValidateMessage, 0, 8, &message);
        check_round_trip(Command::ValidateMessage, 0, 8, &ValidateMessageRequest::default());
        let settings = SchemaSettings {
            schema: "orders".to_owned(),
            encoding: 1,
            first_revision_id: "0a1b2c3d".to_owned(),
            last_revision_id: "4e5f6a7b".to_owned(),
        };
        let topic = Topic { name: "orders-in".to_owned(), message_retention_seconds: 600 };
        let create = CreateTopicWithSchemaRequest {
            topic: CreateTopicWithSourcesRequest { topic: topic.clone(), replicas: 3, sources: 2 },
            schema: settings.clone(),
        };
        check_round_trip(Command::CreateTopicWithSchema, 0, 9, &create);
        check_round_trip(Command::CreateTopicWithSchema, 0, 9, &CreateTopicWithSchemaRequest::default());
        let update = UpdateTopicSchemaRequest { name: "orders-in".to_owned(), schema: settings.clone() };
        check_round_trip(Command::UpdateTopicSchema, 0, 10, &update);
        let shown = TopicWithSchema {
            topic: TopicWithSources {
                topic,
                replicas: 3,
                sources: vec![TopicSource { number: 0, leader_node: 1, leader_shard: 0 }],
            },
            schema: settings,
        };
        check_round_trip(Command::GetTopicWithSchema, FLAG_RESPONSE, 11, &shown);
        check_round_trip(Command::GetTopicWithSchema, FLAG_RESPONSE, 11, &TopicWithSchema::default());
    }

    /// The push configuration's bodies (commands 26 to 29), every field set and none.
    #[test]
    fn subscriptions_with_push() {
        let push = PushConfig {
            endpoint: "https://receiver.example/push".to_owned(),
            attributes: vec![Attribute { key: "x-goog-version".to_owned(), value: "v1".to_owned() }],
            no_wrapper: true,
            write_metadata: true,
            service_account_email: "pusher@p.iam.example".to_owned(),
            audience: "https://receiver.example".to_owned(),
        };
        let with_push = SubscriptionWithPush { subscription: sample_subscription(), push: push.clone() };
        check_round_trip(Command::CreateSubscriptionWithPush, 0, 8, &with_push);
        check_round_trip(Command::GetSubscriptionWithPush, FLAG_RESPONSE, 8, &with_push);
        let pulled =
            SubscriptionWithPush { subscription: sample_subscription(), push: PushConfig::default() };
        check_round_trip(Command::CreateSubscriptionWithPush, FLAG_RESPONSE, 8, &pulled);
        check_round_trip(
            Command::UpdateSubscriptionWithPush,
            0,
            9,
            &UpdateSubscriptionWithPushRequest {
                subscription: with_push,
                update_mask: vec!["push_config".to_owned(), "ack_deadline_seconds".to_owned()],
            },
        );
        check_round_trip(
            Command::ModifyPushConfig,
            0,
            9,
            &ModifyPushConfigRequest { subscription: "orders-audit".to_owned(), push: push.clone() },
        );
    }

    /// The bodies that carry the project push requests name the subscription in (commands 90 to
    /// 93), with a project and without one.
    #[test]
    fn subscriptions_with_push_project() {
        let push = PushConfig { endpoint: "https://receiver.example/push".to_owned(), ..Default::default() };
        let with_push = SubscriptionWithPush { subscription: sample_subscription(), push: push.clone() };
        for push_project in ["my-proj", ""] {
            let shown = SubscriptionWithPushProject {
                subscription: with_push.clone(),
                push_project: push_project.to_owned(),
            };
            check_round_trip(Command::CreateSubscriptionWithPushProject, 0, 8, &shown);
            check_round_trip(Command::GetSubscriptionWithPushProject, FLAG_RESPONSE, 8, &shown);
            check_round_trip(
                Command::UpdateSubscriptionWithPushProject,
                0,
                9,
                &UpdateSubscriptionWithPushProjectRequest {
                    request: UpdateSubscriptionWithPushRequest {
                        subscription: with_push.clone(),
                        update_mask: vec!["push_config".to_owned()],
                    },
                    push_project: push_project.to_owned(),
                },
            );
            check_round_trip(
                Command::ModifyPushConfigWithProject,
                0,
                9,
                &ModifyPushConfigWithProjectRequest {
                    request: ModifyPushConfigRequest {
                        subscription: "orders-audit".to_owned(),
                        push: push.clone(),
                    },
                    push_project: push_project.to_owned(),
                },
            );
        }
    }

    /// StatsWithPush's answer (command 65): a push subscription that failed, one that has not,
    /// beside the stats `Stats` answers.
    #[test]
    fn stats_with_push() {
        let stats = StatsResponse {
            topics: vec![TopicStats {
                name: "orders".to_owned(),
                subscriptions: vec![SubscriptionStats {
                    name: "pushed".to_owned(),
                    backlog_messages: 7,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let failed = PushSubscriptionStats {
            topic: "orders".to_owned(),
            subscription: "pushed".to_owned(),
            endpoint: "https://receiver.example/push".to_owned(),
            window: 9,
            outstanding: 3,
            last_error: Some(PushError { reason: "HTTP status 500".to_owned(), ms_ago: 1_200 }),
            failures_in_a_row: 2,
            requests: vec![
                PushRequestCount { class: "2xx".to_owned(), count: 40 },
                PushRequestCount { class: "5xx".to_owned(), count: 2 },
            ],
        };
        let fresh = PushSubscriptionStats { subscription: "other".to_owned(), ..Default::default() };
        let response = StatsWithPushResponse { stats, push_subscriptions: vec![failed, fresh] };
        check_round_trip(Command::StatsWithPush, FLAG_RESPONSE, 11, &response);
        check_round_trip(Command::StatsWithPush, FLAG_RESPONSE, 12, &StatsWithPushResponse::default());
    }

    #[test]
    fn name_and_list_requests() {
        check_round_trip(Command::GetTopic, 0, 4, &NameRequest { name: "orders".to_owned() });
        check_round_trip(Command::DeleteSubscription, 0, 4, &NameRequest { name: String::new() });
        check_round_trip(
            Command::ListSubscriptions,
            0,
            5,
            &ListRequest {
                topic: "orders".to_owned(),
                page_size: 100,
                page_token: "orders-billing".to_owned(),
            },
        );
        check_round_trip(Command::ListTopics, 0, 5, &ListRequest::default());
    }

    #[test]
    fn topics() {
        let topic = Topic { name: "orders".to_owned(), message_retention_seconds: RETENTION_SECONDS_DEFAULT };
        check_round_trip(Command::CreateTopic, 0, 6, &topic);
        check_round_trip(Command::CreateTopic, FLAG_RESPONSE, 6, &topic);
        let list = TopicList {
            topics: (0..50)
                .map(|i| Topic {
                    name: format!("topic-{i:03}-with-a-longer-name"),
                    message_retention_seconds: i,
                })
                .collect(),
            next_page_token: "topic-049-with-a-longer-name".to_owned(),
        };
        check_round_trip(Command::ListTopics, FLAG_RESPONSE, 7, &list);
        check_round_trip(Command::ListTopics, FLAG_RESPONSE, 7, &TopicList::default());
    }

    #[test]
    fn subscriptions() {
        check_round_trip(Command::CreateSubscription, 0, 8, &sample_subscription());
        check_round_trip(Command::GetSubscription, FLAG_RESPONSE, 8, &Subscription::default());
        let list = SubscriptionList {
            subscriptions: vec![sample_subscription(), Subscription::default(), sample_subscription()],
            next_page_token: String::new(),
        };
        check_round_trip(Command::ListSubscriptions, FLAG_RESPONSE, 9, &list);
    }

    #[test]
    fn lookups() {
        let lookup = LookupResponse {
            forwarders: vec![
                ShardAddress { shard: 0, address: "127.0.0.1:7400".to_owned() },
                ShardAddress { shard: 7, address: "[::1]:7407".to_owned() },
            ],
        };
        check_round_trip(Command::LookupTopic, FLAG_RESPONSE, 10, &lookup);
        check_round_trip(Command::LookupSubscription, FLAG_RESPONSE, 10, &LookupResponse::default());
        check_round_trip(
            Command::LookupTopic,
            FLAG_RESPONSE,
            10,
            &ShardAddress { shard: u32::MAX, address: "x".into() },
        );
    }

    #[test]
    fn publish() {
        check_round_trip(Command::Publish, 0, 11, &sample_publish());
        check_round_trip(Command::Publish, 0, 11, &PublishRequest::default());
        check_round_trip(Command::Publish, 0, 11, &sample_publish().messages[0]);
        check_round_trip(Command::Publish, 0, 11, &attribute("k", "v"));
        check_round_trip(
            Command::Publish,
            FLAG_RESPONSE,
            11,
            &PublishResponse { message_ids: vec![0, 1, 2, u64::MAX] },
        );
    }

    #[test]
    fn pull() {
        check_round_trip(
            Command::Pull,
            0,
            12,
            &PullRequest { subscription: "orders-billing".to_owned(), max_messages: 1000, wait_ms: 5000 },
        );
        check_round_trip(Command::Pull, FLAG_RESPONSE, 12, &sample_received(3));
        check_round_trip(
            Command::Pull,
            FLAG_RESPONSE,
            12,
            &PullResponse { received_messages: (0..20).map(sample_received).collect() },
        );
    }

    #[test]
    fn acknowledge_and_modify() {
        let ack_ids: Vec<String> = (0..10).map(|i| format!("ack-{i:016x}")).collect();
        check_round_trip(
            Command::Acknowledge,
            0,
            13,
            &AcknowledgeRequest { subscription: "orders-billing".to_owned(), ack_ids: ack_ids.clone() },
        );
        check_round_trip(
            Command::ModifyAckDeadline,
            0,
            14,
            &ModifyAckDeadlineRequest {
                subscription: "orders-billing".to_owned(),
                ack_ids,
                ack_deadline_seconds: 0,
            },
        );
        let invalid = InvalidAckId { ack_id: "bogus".to_owned(), reason: "malformed ack id".to_owned() };
        check_round_trip(Command::Acknowledge, FLAG_RESPONSE, 15, &invalid);
        check_round_trip(
            Command::Acknowledge,
            FLAG_RESPONSE,
            15,
            &AckResponse { invalid_ack_ids: vec![invalid.clone(), invalid] },
        );
        check_round_trip(Command::ModifyAckDeadline, FLAG_RESPONSE, 15, &AckResponse::default());
    }

    #[test]
    fn cluster_status() {
        check_round_trip(Command::ClusterStatus, 0, 16, &Empty {});
        let add =
            ClusterAddNodeRequest { node_id: 4, cluster_address: "10.0.0.4:7460".to_owned(), voter: true };
        check_round_trip(Command::ClusterAddNode, 0, 16, &add);
        check_round_trip(Command::ClusterRemoveNode, 0, 16, &ClusterRemoveNodeRequest { node_id: 4 });
        check_round_trip(Command::ClusterDrain, 0, 16, &ClusterDrainRequest { node_id: 3, draining: true });
        check_round_trip(Command::ClusterDrainStatus, 0, 16, &Empty {});
        let draining = NodeDrainStatus {
            node_id: 3,
            leaderships: 2,
            leads_catalog: true,
            single_replica_topics: vec!["lone".to_owned()],
            single_replica_count: 1,
        };
        let drains = ClusterDrainStatusResponse { nodes: vec![draining, NodeDrainStatus::default()] };
        check_round_trip(Command::ClusterDrainStatus, FLAG_RESPONSE, 16, &drains);
        let rule = RoutingRule {
            principal: String::new(),
            from: "10.0.0.0/8".to_owned(),
            allow: false,
            nodes: vec![2, 3],
        };
        check_round_trip(
            Command::ClusterRestrict,
            0,
            16,
            &ClusterRestrictRequest { add: true, rule: rule.clone() },
        );
        let rules = ClusterRestrictionsResponse { rules: vec![rule, RoutingRule::default()] };
        check_round_trip(Command::ClusterRestrictions, FLAG_RESPONSE, 16, &rules);
        let node = |node_id, voter, role: &str, matched_index| NodeStatus {
            node_id,
            cluster_address: format!("10.0.0.{node_id}:7460"),
            router_address: format!("10.0.0.{node_id}:7450"),
            voter,
            role: role.to_owned(),
            matched_index,
            heard_ms_ago: matched_index.map(|index| index % 1000),
        };
        let leader = ClusterStatusResponse {
            node_id: 1,
            catalog_leader: Some(1),
            term: 7,
            last_log_index: Some(42),
            last_applied_index: Some(41),
            nodes: vec![
                node(1, true, "leader", Some(42)),
                node(2, true, "follower", Some(0)),
                node(3, true, "follower", None),
                node(u64::MAX, false, "learner", Some(u64::MAX)),
            ],
            topics: vec![TopicPlacement {
                name: "projects/p/topics/orders".to_owned(),
                leader_node: 2,
                epoch: 5,
                replica_nodes: vec![1, 2, 3],
            }],
            topics_omitted: 7,
            not_serving: None,
            note: String::new(),
        };
        check_round_trip(Command::ClusterStatus, FLAG_RESPONSE, 16, &leader);
        let electing = ClusterStatusResponse {
            node_id: 3,
            catalog_leader: None,
            term: 8,
            last_log_index: None,
            last_applied_index: None,
            nodes: vec![node(3, true, "candidate", None), node(1, true, "unknown", None)],
            topics: Vec::new(),
            topics_omitted: 0,
            not_serving: Some("node 3: the catalog has no leader this node knows".to_owned()),
            note: "node 3's own view".to_owned(),
        };
        check_round_trip(Command::ClusterStatus, FLAG_RESPONSE, 16, &electing);
        check_round_trip(Command::ClusterStatus, FLAG_RESPONSE, 16, &ClusterStatusResponse::default());
    }

    #[test]
    fn error_frame() {
        let status = Status::new(ErrorCode::NotOwner, "shard 3 does not own topic 'orders'");
        let frame = encode_error(Command::Publish.code(), 77, &status);
        let header = FrameHeader::decode(&frame).unwrap();
        assert_eq!(header.command, Command::Publish.code());
        assert_eq!(header.request_id, 77);
        assert_eq!(header.flags, FLAG_RESPONSE | FLAG_ERROR);
        assert!(header.is_response() && header.is_error());
        assert_eq!(header.body_length as usize, frame.len() - FRAME_HEADER_BYTES);
        assert_eq!(decode_error(&frame[FRAME_HEADER_BYTES..]), status);
        assert_eq!(decode_error(&body_of(&frame)), status);
    }

    #[test]
    fn every_error_code_survives_an_error_frame() {
        for code in ErrorCode::ALL {
            let status = Status::new(code, format!("because {code}"));
            let frame = encode_error(Command::Hello.code(), code as u64, &status);
            assert_eq!(decode_error(&frame[FRAME_HEADER_BYTES..]), status);
        }
    }

    #[test]
    fn long_error_messages_are_cut_at_a_char_boundary() {
        // '€' is 3 bytes; 4096 is not a multiple of 3, so the cut must step back.
        let status = Status::new(ErrorCode::Internal, "€".repeat(3000));
        let frame = encode_error(Command::Pull.code(), 1, &status);
        let back = decode_error(&frame[FRAME_HEADER_BYTES..]);
        assert_eq!(back.code, ErrorCode::Internal);
        assert!(back.message.len() <= ERROR_MESSAGE_BYTES_MAX);
        assert_eq!(back.message.len(), ERROR_MESSAGE_BYTES_MAX / 3 * 3);
        assert!(status.message.starts_with(&back.message));

        let ascii = Status::new(ErrorCode::Internal, "x".repeat(ERROR_MESSAGE_BYTES_MAX + 100));
        let frame = encode_error(Command::Pull.code(), 1, &ascii);
        assert_eq!(decode_error(&frame[FRAME_HEADER_BYTES..]).message.len(), ERROR_MESSAGE_BYTES_MAX);

        let exact = Status::new(ErrorCode::Internal, "y".repeat(ERROR_MESSAGE_BYTES_MAX));
        let frame = encode_error(Command::Pull.code(), 1, &exact);
        assert_eq!(decode_error(&frame[FRAME_HEADER_BYTES..]), exact);
    }

    #[test]
    fn unknown_error_numbers_decode_as_unknown() {
        let frame = encode_frame(
            Command::Pull.code(),
            FLAG_RESPONSE | FLAG_ERROR,
            1,
            &ErrorBody { code: 999, message: "?".into() },
        );
        let status = decode_error(&frame[FRAME_HEADER_BYTES..]);
        assert_eq!(status.code, ErrorCode::Unknown);
        assert_eq!(status.message, "?");
    }

    #[test]
    fn garbage_error_bodies_decode_as_protocol_errors() {
        let status = decode_error(&aligned(&[0xff; 5]));
        assert_eq!(status.code, ErrorCode::ProtocolError);
        let status = decode_error(&aligned(&[]));
        assert_eq!(status.code, ErrorCode::ProtocolError);
    }

    #[test]
    fn splitter_yields_back_to_back_frames_from_one_push() {
        let frames = [
            encode_frame(Command::Publish.code(), 0, 1, &sample_publish()),
            encode_frame(Command::Pull.code(), 0, 2, &PullRequest::default()),
            encode_error(Command::Pull.code(), 3, &Status::internal("oops")),
        ];
        let stream: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let mut splitter = FrameSplitter::new();
        let out = splitter.push(&stream).unwrap();
        assert_eq!(out.len(), 3);
        for (got, sent) in out.iter().zip(&frames) {
            assert_eq!(got.header, FrameHeader::decode(sent).unwrap());
            assert_eq!(&got.body[..], &sent[FRAME_HEADER_BYTES..]);
            assert!(is_aligned_16(&got.body), "splitter bodies are aligned");
        }
        assert_eq!(decode_body::<PublishRequest>(&out[0].body).unwrap(), sample_publish());
        assert_eq!(decode_error(&out[2].body), Status::internal("oops"));
        assert_eq!(splitter.buffered_bytes(), 0);
        assert!(splitter.push(&[]).unwrap().is_empty());
    }

    #[test]
    fn splitter_counts_buffered_bytes() {
        let frame = encode_frame(Command::Publish.code(), 0, 1, &sample_publish());
        let mut splitter = FrameSplitter::new();
        assert!(splitter.push(&frame[..10]).unwrap().is_empty());
        assert_eq!(splitter.buffered_bytes(), 10);
        assert!(splitter.push(&frame[10..20]).unwrap().is_empty());
        assert_eq!(splitter.buffered_bytes(), 4, "the header is consumed once whole");
        let out = splitter.push(&frame[20..]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(splitter.buffered_bytes(), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Property tests
// ---------------------------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    fn text(max_chars: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(any::<char>(), 0..=max_chars).prop_map(|chars| chars.into_iter().collect())
    }

    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..=max)
    }

    fn arb_attribute() -> impl Strategy<Value = Attribute> {
        (text(12), text(20)).prop_map(|(key, value)| Attribute { key, value })
    }

    fn arb_message() -> impl Strategy<Value = PubsubMessage> {
        (bytes(64), prop::collection::vec(arb_attribute(), 0..4), text(12))
            .prop_map(|(data, attributes, ordering_key)| PubsubMessage { data, attributes, ordering_key })
    }

    fn arb_publish() -> impl Strategy<Value = PublishRequest> {
        (text(24), prop::collection::vec(arb_message(), 0..6))
            .prop_map(|(topic, messages)| PublishRequest { topic, messages })
    }

    fn arb_received() -> impl Strategy<Value = ReceivedMessage> {
        (
            text(20),
            any::<u64>(),
            any::<u64>(),
            bytes(48),
            prop::collection::vec(arb_attribute(), 0..3),
            text(10),
            any::<u32>(),
        )
            .prop_map(
                |(ack_id, message_id, publish_time_ms, data, attributes, ordering_key, delivery_attempt)| {
                    ReceivedMessage {
                        ack_id,
                        message_id,
                        publish_time_ms,
                        data,
                        attributes,
                        ordering_key,
                        delivery_attempt,
                    }
                },
            )
    }

    fn arb_pull_response() -> impl Strategy<Value = PullResponse> {
        prop::collection::vec(arb_received(), 0..6)
            .prop_map(|received_messages| PullResponse { received_messages })
    }

    fn arb_subscription() -> impl Strategy<Value = Subscription> {
        (
            (text(20), text(20), any::<u32>(), any::<bool>(), any::<u64>(), any::<bool>()),
            (text(30), text(20), any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>()),
        )
            .prop_map(
                |(
                    (
                        name,
                        topic,
                        ack_deadline_seconds,
                        retain_acked_messages,
                        message_retention_seconds,
                        ordering,
                    ),
                    (filter, dead_letter_topic, max_delivery_attempts, minimum_backoff, maximum_backoff, ttl),
                )| Subscription {
                    name,
                    topic,
                    ack_deadline_seconds,
                    retain_acked_messages,
                    message_retention_seconds,
                    enable_message_ordering: ordering,
                    filter,
                    dead_letter_topic,
                    max_delivery_attempts,
                    minimum_backoff_seconds: minimum_backoff,
                    maximum_backoff_seconds: maximum_backoff,
                    expiration_ttl_seconds: ttl,
                },
            )
    }

    /// A valid encoded frame with a small body of one of a few types.
    fn arb_frame() -> impl Strategy<Value = FrameBuffer> {
        let flags = prop_oneof![Just(0u16), Just(FLAG_RESPONSE), Just(FLAG_RESPONSE | FLAG_ERROR)];
        let command = prop::sample::select(Command::ALL.to_vec());
        (command, flags, any::<u64>(), 0..4u8, arb_publish(), text(16)).prop_map(
            |(command, flags, id, kind, publish, name)| match kind {
                0 => encode_frame(command.code(), flags, id, &publish),
                1 => encode_frame(command.code(), flags, id, &NameRequest { name }),
                2 => encode_error(command.code(), id, &Status::not_found(name)),
                _ => encode_frame(
                    command.code(),
                    flags,
                    id,
                    &PullRequest { subscription: name, max_messages: 10, wait_ms: 0 },
                ),
            },
        )
    }

    /// Touches every part of an archived publish request, as a handler would.
    fn walk_publish(request: &ArchivedPublishRequest) -> usize {
        let mut total = request.topic.as_str().len();
        for message in request.messages.iter() {
            total += message.data.as_slice().len() + message.ordering_key.as_str().len();
            for attribute in message.attributes.iter() {
                total += attribute.key.as_str().len() + attribute.value.as_str().len();
            }
        }
        let _ = ringpost_wire::validate::validate_publish(request);
        total
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn publish_requests_round_trip(value in arb_publish(), id in any::<u64>()) {
            check_round_trip(Command::Publish, 0, id, &value);
        }

        #[test]
        fn pull_responses_round_trip(value in arb_pull_response(), id in any::<u64>()) {
            check_round_trip(Command::Pull, FLAG_RESPONSE, id, &value);
        }

        #[test]
        fn subscriptions_round_trip(value in arb_subscription(), id in any::<u64>()) {
            check_round_trip(Command::CreateSubscription, 0, id, &value);
        }

        #[test]
        fn arbitrary_bytes_never_panic_access_body(data in bytes(512)) {
            let buffer = aligned(&data);
            if let Ok(request) = access_body::<PublishRequest>(&buffer) {
                walk_publish(request);
            }
            let _ = access_body::<PullResponse>(&buffer);
            let _ = access_body::<Subscription>(&buffer);
            let _ = access_body::<AcknowledgeRequest>(&buffer);
            let _ = decode_error(&buffer);
        }

        #[test]
        fn mutated_publish_bodies_never_panic(
            value in arb_publish(),
            edits in prop::collection::vec((any::<Index>(), any::<u8>()), 1..8),
        ) {
            let frame = encode_frame(Command::Publish.code(), 0, 1, &value);
            let mut body = body_of(&frame);
            if !body.is_empty() {
                for (index, byte) in edits {
                    let at = index.index(body.len());
                    body[at] = byte;
                }
            }
            if let Ok(request) = access_body::<PublishRequest>(&body) {
                walk_publish(request);
                let _ = rkyv::deserialize::<PublishRequest, rancor::Error>(request).unwrap();
            }
        }

        #[test]
        fn header_decode_is_exact_or_refuses(raw in any::<[u8; 16]>()) {
            let body_length = u32::from_le_bytes(raw[0..4].try_into().unwrap());
            let flags = u16::from_le_bytes(raw[6..8].try_into().unwrap());
            match FrameHeader::decode(&raw) {
                Ok(header) => {
                    prop_assert_eq!(header.encode(), raw);
                    prop_assert!(header.body_length as usize <= FRAME_BODY_BYTES_MAX);
                    prop_assert_eq!(header.flags & !FLAGS_KNOWN, 0);
                }
                Err(FrameError::BodyTooLarge(length)) => {
                    prop_assert_eq!(length, body_length);
                    prop_assert!(body_length as usize > FRAME_BODY_BYTES_MAX);
                }
                Err(FrameError::UnknownFlags(got)) => {
                    prop_assert_eq!(got, flags);
                    prop_assert!(flags & !FLAGS_KNOWN != 0);
                }
                Err(error) => prop_assert!(false, "unexpected {error:?}"),
            }
        }

        #[test]
        fn header_decode_of_valid_headers(
            body_length in 0..=FRAME_BODY_BYTES_MAX as u32,
            command in any::<u16>(),
            flags in 0..=FLAGS_KNOWN,
            request_id in any::<u64>(),
        ) {
            let header = FrameHeader { body_length, command, flags, request_id };
            prop_assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
        }

        #[test]
        fn splitter_on_arbitrary_streams_matches_the_reference(
            stream in bytes(2048),
            cuts in prop::collection::vec(any::<Index>(), 0..16),
            small_headers in any::<bool>(),
        ) {
            let mut stream = stream;
            if small_headers {
                // Make headers plausible so that bodies, not just header errors, get exercised:
                // clear the high bytes of every 16-byte-aligned length and the flag bits.
                let mut at = 0;
                while at + FRAME_HEADER_BYTES <= stream.len() {
                    stream[at + 1] &= 0x01;
                    stream[at + 2] = 0;
                    stream[at + 3] = 0;
                    stream[at + 6] &= FLAGS_KNOWN as u8;
                    stream[at + 7] = 0;
                    let length = u32::from_le_bytes(stream[at..at + 4].try_into().unwrap()) as usize;
                    at += FRAME_HEADER_BYTES + length;
                }
            }
            let cuts: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            let (expected, expected_end) = reference_split(&stream);
            let (frames, end, mut splitter) = split_chunked(&stream, &cuts);

            prop_assert!(frames.len() <= expected.len());
            for (got, (header, body)) in frames.iter().zip(&expected) {
                prop_assert_eq!(&got.header, header);
                prop_assert_eq!(&got.body[..], &body[..]);
            }
            match (&end, &expected_end) {
                (Ok(buffered), Ok(leftover)) => {
                    prop_assert_eq!(frames.len(), expected.len());
                    prop_assert_eq!(buffered, leftover);
                }
                (Err(got), Err(want)) => {
                    prop_assert_eq!(got, want);
                    // A bad header poisons the stream.
                    prop_assert!(splitter.push(&[0u8; 64]).is_err());
                }
                _ => prop_assert!(false, "splitter ended {end:?}, reference {expected_end:?}"),
            }
        }

        /// The connection loop's way: a large body is read straight into the room the splitter
        /// gives (`body_room`), everything else through a chunk. Reads of any size give the
        /// frames the reference split gives, and the room is never more than four times what
        /// arrived of its body (64 KiB at first).
        #[test]
        fn bodies_read_into_their_room_match_the_reference(
            body_lengths in prop::collection::vec(
                prop_oneof![0usize..100, 60_000usize..70_000, 200_000usize..400_000], 1..5),
            read_sizes in prop::collection::vec(1usize..150_000, 1..40),
            fill in any::<u8>(),
        ) {
            let mut stream = Vec::new();
            for (index, length) in body_lengths.iter().enumerate() {
                let header = FrameHeader { body_length: *length as u32, command: 1, flags: 0, request_id: index as u64 };
                stream.extend_from_slice(&header.encode());
                stream.extend((0..*length).map(|at| (at as u8).wrapping_mul(31).wrapping_add(fill)));
            }
            let (expected, expected_end) = reference_split(&stream);
            prop_assert_eq!(expected_end, Ok(0));
            let mut splitter = FrameSplitter::new();
            let mut frames = Vec::new();
            let mut at = 0;
            let mut reads = read_sizes.iter().cycle();
            let mut direct_reads = 0;
            while at < stream.len() {
                let read = *reads.next().unwrap();
                let arrived = splitter.buffered_bytes();
                if let Some(room) = splitter.body_room() {
                    prop_assert!(
                        arrived + room.len() <= (4 * arrived).max(ringpost_wire::frame::DIRECT_BODY_BYTES_MIN),
                        "room {} after {arrived} bytes", room.len()
                    );
                    let count = read.min(room.len()).min(stream.len() - at);
                    room[..count].copy_from_slice(&stream[at..at + count]);
                    at += count;
                    direct_reads += 1;
                    frames.extend(splitter.body_filled(count));
                } else {
                    // The daemon's read chunk is 64 KiB.
                    let count = read.min(64 * 1024).min(stream.len() - at);
                    frames.extend(splitter.push(&stream[at..at + count]).unwrap());
                    at += count;
                }
            }
            prop_assert_eq!(splitter.buffered_bytes(), 0);
            prop_assert_eq!(frames.len(), expected.len());
            for (got, (header, body)) in frames.iter().zip(&expected) {
                prop_assert_eq!(&got.header, header);
                prop_assert_eq!(&got.body[..], &body[..]);
                if !got.body.is_empty() {
                    prop_assert!(is_aligned_16(&got.body));
                }
            }
            if body_lengths.iter().any(|length| *length >= 200_000) {
                prop_assert!(direct_reads > 0, "a body of 200 KB or more is read into its room");
            }
        }

        #[test]
        fn splitter_yields_valid_frames_regardless_of_chunking(
            sent in prop::collection::vec(arb_frame(), 0..6),
            cuts in prop::collection::vec(any::<Index>(), 0..24),
            byte_at_a_time in any::<bool>(),
        ) {
            let stream: Vec<u8> = sent.iter().flat_map(|f| f.iter().copied()).collect();
            let cuts: Vec<usize> = if byte_at_a_time {
                (0..stream.len()).collect()
            } else {
                cuts.iter().map(|i| i.index(stream.len() + 1)).collect()
            };
            let (frames, end, _) = split_chunked(&stream, &cuts);
            prop_assert_eq!(end, Ok(0));
            prop_assert_eq!(frames.len(), sent.len());
            for (got, frame) in frames.iter().zip(&sent) {
                prop_assert_eq!(got.header, FrameHeader::decode(frame).unwrap());
                prop_assert_eq!(&got.body[..], &frame[FRAME_HEADER_BYTES..]);
                if !got.body.is_empty() {
                    prop_assert!(is_aligned_16(&got.body));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Hostile inputs
// ---------------------------------------------------------------------------------------------

mod hostile {
    use super::*;

    fn header_bytes(body_length: u32, flags: u16) -> [u8; FRAME_HEADER_BYTES] {
        FrameHeader { body_length, command: Command::Publish.code(), flags, request_id: 9 }.encode()
    }

    #[test]
    fn oversized_bodies_are_refused_in_the_header() {
        for length in [u32::MAX, FRAME_BODY_BYTES_MAX as u32 + 1, u32::MAX / 2 + 1] {
            assert_eq!(FrameHeader::decode(&header_bytes(length, 0)), Err(FrameError::BodyTooLarge(length)));
        }
        let at_limit = header_bytes(FRAME_BODY_BYTES_MAX as u32, 0);
        assert_eq!(FrameHeader::decode(&at_limit).unwrap().body_length as usize, FRAME_BODY_BYTES_MAX);
        // Length is checked before flags.
        assert_eq!(
            FrameHeader::decode(&header_bytes(u32::MAX, 0xffff)),
            Err(FrameError::BodyTooLarge(u32::MAX))
        );
    }

    #[test]
    fn the_splitter_refuses_an_oversized_header_before_buffering_a_body() {
        for length in [u32::MAX, FRAME_BODY_BYTES_MAX as u32 + 1] {
            let mut stream = header_bytes(length, 0).to_vec();
            stream.extend_from_slice(&[0xab; 4096]);

            // All at once.
            let mut splitter = FrameSplitter::new();
            assert_eq!(splitter.push(&stream).err(), Some(FrameError::BodyTooLarge(length)));
            assert!(splitter.buffered_bytes() <= FRAME_HEADER_BYTES, "no body bytes were buffered");

            // A byte at a time: the 16th byte is refused, and nothing after it is taken.
            let mut splitter = FrameSplitter::new();
            for byte in &stream[..FRAME_HEADER_BYTES - 1] {
                assert!(splitter.push(std::slice::from_ref(byte)).unwrap().is_empty());
            }
            assert_eq!(
                splitter.push(&stream[FRAME_HEADER_BYTES - 1..FRAME_HEADER_BYTES]).err(),
                Some(FrameError::BodyTooLarge(length))
            );
            assert!(splitter.buffered_bytes() <= FRAME_HEADER_BYTES);
            // The stream stays poisoned.
            assert_eq!(
                splitter.push(&stream[FRAME_HEADER_BYTES..]).err(),
                Some(FrameError::BodyTooLarge(length))
            );
            assert!(splitter.buffered_bytes() <= FRAME_HEADER_BYTES);
        }
    }

    #[test]
    fn a_bad_header_after_good_frames() {
        let good = encode_frame(Command::Pull.code(), 0, 1, &PullRequest::default());
        let mut stream = good.to_vec();
        stream.extend_from_slice(&header_bytes(0, 1 << 5));
        let mut splitter = FrameSplitter::new();
        assert_eq!(splitter.push(&good).unwrap().len(), 1);
        assert_eq!(splitter.push(&stream[good.len()..]).err(), Some(FrameError::UnknownFlags(1 << 5)));
    }

    #[test]
    fn unknown_flags_are_refused() {
        for bit in 0..16 {
            let flag = 1u16 << bit;
            let decoded = FrameHeader::decode(&header_bytes(0, flag));
            if flag & FLAGS_KNOWN != 0 {
                assert!(decoded.is_ok(), "flag {flag:#06x}");
            } else {
                assert_eq!(decoded, Err(FrameError::UnknownFlags(flag)));
                assert_eq!(
                    FrameHeader::decode(&header_bytes(10, flag | FLAG_RESPONSE)),
                    Err(FrameError::UnknownFlags(flag | FLAG_RESPONSE))
                );
                let mut splitter = FrameSplitter::new();
                assert_eq!(splitter.push(&header_bytes(0, flag)).err(), Some(FrameError::UnknownFlags(flag)));
            }
        }
        assert_eq!(FrameHeader::decode(&header_bytes(0, 0xffff)), Err(FrameError::UnknownFlags(0xffff)));
    }

    #[test]
    fn truncated_headers_are_refused() {
        let bytes = header_bytes(0, 0);
        for length in 0..FRAME_HEADER_BYTES {
            assert_eq!(FrameHeader::decode(&bytes[..length]), Err(FrameError::Truncated(length)));
        }
        // The splitter just waits for the rest.
        let mut splitter = FrameSplitter::new();
        assert!(splitter.push(&bytes[..15]).unwrap().is_empty());
        assert_eq!(splitter.buffered_bytes(), 15);
    }

    #[test]
    fn every_truncation_of_a_body_is_handled() {
        let frame = encode_frame(Command::Publish.code(), 0, 1, &sample_publish());
        let body = &frame[FRAME_HEADER_BYTES..];
        for length in 0..body.len() {
            let prefix = aligned(&body[..length]);
            if let Ok(value) = decode_body::<PublishRequest>(&prefix) {
                // Possible in principle (a prefix can be an archive of its own); it must then
                // be a value, never a panic.
                let _ = value;
            }
            let _ = decode_body::<PullResponse>(&prefix);
            let _ = decode_body::<Subscription>(&prefix);
        }
        assert_eq!(decode_body::<PublishRequest>(&aligned(body)).unwrap(), sample_publish());
    }

    #[test]
    fn every_single_byte_corruption_is_handled() {
        let frame = encode_frame(Command::Publish.code(), 0, 1, &sample_publish());
        let body = body_of(&frame);
        for position in 0..body.len() {
            for mask in [0x01u8, 0x80, 0xff, 0x7f] {
                let mut corrupt = body.clone();
                corrupt[position] ^= mask;
                if let Ok(request) = access_body::<PublishRequest>(&corrupt) {
                    let _ = ringpost_wire::validate::validate_publish(request);
                    let _ = rkyv::deserialize::<PublishRequest, rancor::Error>(request).unwrap();
                }
            }
            for value in [0x00u8, 0xff, 0x80] {
                let mut corrupt = body.clone();
                corrupt[position] = value;
                let _ = decode_body::<PublishRequest>(&corrupt);
            }
        }
    }

    #[test]
    fn misaligned_bodies_are_refused() {
        let frame = encode_frame(Command::Publish.code(), 0, 1, &sample_publish());
        let body = &frame[FRAME_HEADER_BYTES..];
        let mut buffer = FrameBuffer::with_capacity(body.len() + 16);
        buffer.extend_from_slice(&[0u8; 16]);
        buffer.extend_from_slice(body);
        for shift in 1..16 {
            let mut shifted = FrameBuffer::with_capacity(body.len() + 16);
            shifted.extend_from_slice(&vec![0u8; shift]);
            shifted.extend_from_slice(body);
            let slice = &shifted[shift..];
            assert!(!is_aligned_16(slice));
            let error = access_body::<PublishRequest>(slice).expect_err("misaligned body");
            assert_eq!(error.code, ErrorCode::ProtocolError);
            assert!(error.message.contains("aligned"), "{}", error.message);
            assert_eq!(decode_error(slice).code, ErrorCode::ProtocolError);
        }
        // The same bytes, aligned, are fine.
        assert_eq!(decode_body::<PublishRequest>(&buffer[16..]).unwrap(), sample_publish());
    }

    #[test]
    fn out_of_bounds_relative_pointers_are_refused() {
        let frame = encode_frame(Command::Publish.code(), 0, 1, &sample_publish());
        let body = body_of(&frame);
        // The root, an `ArchivedPublishRequest`, is the last 16 bytes: the topic string (its
        // name is longer than 8 bytes, so out of line: length, then relative offset) and the
        // messages vector (relative offset, then length).
        assert!(body.len() > 16);
        let root = body.len() - 16;
        let patches: &[(usize, &[u8])] = &[
            // messages: offset far past the end, and far before the start
            (root + 8, &0x7fff_fff0i32.to_le_bytes()),
            (root + 8, &i32::MIN.to_le_bytes()),
            // messages: length far past the end
            (root + 12, &u32::MAX.to_le_bytes()),
            (root + 12, &0x00ff_ffffu32.to_le_bytes()),
            // topic: offset out of range
            (root + 4, &0x7fff_fff0i32.to_le_bytes()),
            (root + 4, &(-(root as i32) - 64).to_le_bytes()),
            // the whole root overwritten with large values
            (root, &[0xff; 16]),
            (root, &[0x7f; 16]),
        ];
        for (at, patch) in patches {
            let mut corrupt = body.clone();
            corrupt[*at..*at + patch.len()].copy_from_slice(patch);
            let error = access_body::<PublishRequest>(&corrupt).expect_err("out-of-bounds root");
            assert_eq!(error.code, ErrorCode::ProtocolError, "{}", error.message);
            assert!(error.message.starts_with("malformed frame body"), "{}", error.message);
        }
    }

    #[test]
    fn a_body_of_the_wrong_type_does_not_panic() {
        let frame = encode_frame(Command::Pull.code(), 0, 1, &PullRequest::default());
        let body = body_of(&frame);
        let _ = decode_body::<PublishRequest>(&body);
        let _ = decode_body::<Subscription>(&body);
        let _ = decode_body::<PullResponse>(&body);
        let error = access_body::<Subscription>(&aligned(&[0u8; 3])).expect_err("too short");
        assert_eq!(error.code, ErrorCode::ProtocolError);
    }

    #[test]
    fn invalid_utf8_in_a_string_is_refused() {
        let request = NameRequest { name: "abcdefghijklmnop".to_owned() };
        let frame = encode_frame(Command::GetTopic.code(), 0, 1, &request);
        let mut body = body_of(&frame);
        let at = body.windows(4).position(|w| w == b"abcd").expect("the name's bytes");
        body[at] = 0xff;
        assert!(access_body::<NameRequest>(&body).is_err());

        let inline = NameRequest { name: "abc".to_owned() };
        let frame = encode_frame(Command::GetTopic.code(), 0, 1, &inline);
        let mut body = body_of(&frame);
        let at = body.windows(3).position(|w| w == b"abc").expect("the name's bytes");
        body[at + 1] = 0xc3; // a lone lead byte
        assert!(access_body::<NameRequest>(&body).is_err());
    }

    #[test]
    fn invalid_bools_are_refused() {
        let frame = encode_frame(Command::CreateSubscription.code(), 0, 1, &Subscription::default());
        let body = body_of(&frame);
        let mut refused = 0;
        for position in 0..body.len() {
            let mut corrupt = body.clone();
            corrupt[position] = 2;
            if access_body::<Subscription>(&corrupt).is_err() {
                refused += 1;
            }
        }
        assert!(refused >= 2, "a bool byte of 2 is refused (the struct has two bools)");
    }

    /// `encode_frame` has no error path: a body over the limit is a panic, so callers (the
    /// daemon's pull handler above all) must bound what they put in a frame beforehand.
    #[test]
    #[should_panic(expected = "exceeds the limit")]
    fn encode_frame_panics_on_an_oversized_body() {
        let body = PublishResponse { message_ids: vec![0; FRAME_BODY_BYTES_MAX / 8 + 1] };
        let _ = encode_frame(Command::Publish.code(), FLAG_RESPONSE, 1, &body);
    }

    /// The largest publish request that validates must fit in one frame: the worst rkyv
    /// overhead per accounted byte is a one-byte key with an empty value (16 archived bytes
    /// for 1 accounted byte), at the attribute and batch limits.
    #[test]
    fn the_largest_valid_publish_request_fits_in_a_frame() {
        let per_message = PUBLISH_REQUEST_BYTES_MAX / PUBLISH_BATCH_MESSAGES_MAX;
        let message = PubsubMessage {
            data: vec![0x5a; per_message - ATTRIBUTES_COUNT_MAX],
            attributes: vec![attribute("k", ""); ATTRIBUTES_COUNT_MAX],
            ordering_key: String::new(),
        };
        let request = PublishRequest {
            topic: "t".repeat(NAME_BYTES_MAX),
            messages: vec![message; PUBLISH_BATCH_MESSAGES_MAX],
        };
        let frame = encode_frame(Command::Publish.code(), 0, 1, &request);
        let header = FrameHeader::decode(&frame).expect("fits");
        assert!(header.body_length as usize <= FRAME_BODY_BYTES_MAX);
        let archived = access_body::<PublishRequest>(&frame[FRAME_HEADER_BYTES..]).unwrap();
        assert_eq!(ringpost_wire::validate::validate_publish(archived), Ok(PUBLISH_REQUEST_BYTES_MAX));
    }

    /// An empty body (the archive of `Empty` is zero bytes) read by the splitter lands in an
    /// `AlignedVec` that never allocated, whose pointer is a dangling placeholder; `access_body`
    /// must still accept it (every `Empty` reply goes through the splitter on the client).
    #[test]
    fn empty_body_from_splitter_is_accessible() {
        let frame = encode_frame(Command::DeleteTopic.code(), FLAG_RESPONSE, 1, &Empty {});
        assert_eq!(frame.len(), FRAME_HEADER_BYTES, "Empty archives to zero bytes");
        access_body::<Empty>(&frame[FRAME_HEADER_BYTES..]).expect("in place");
        let mut splitter = FrameSplitter::new();
        let frames = splitter.push(&frame).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].header.body_length, 0);
        access_body::<Empty>(&frames[0].body).expect("an empty body from the splitter");
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Validation
// ---------------------------------------------------------------------------------------------

mod validation {
    use super::*;
    use ringpost_wire::validate::*;

    fn message(data: &[u8], attributes: &[(String, String)], ordering_key: &str) -> Result<usize, Status> {
        validate_message(7, data, attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())), ordering_key)
    }

    fn refused(result: Result<usize, Status>, limit: &str) {
        let error = result.expect_err(limit);
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert!(error.message.contains(limit), "'{}' should name {limit}", error.message);
        assert!(error.message.contains("message 7"), "'{}' should name the message index", error.message);
    }

    fn publish(request: &PublishRequest) -> Result<usize, Status> {
        let frame = encode_frame(Command::Publish.code(), 0, 1, request);
        let archived = access_body::<PublishRequest>(&frame[FRAME_HEADER_BYTES..]).unwrap();
        validate_publish(archived)
    }

    fn one_message() -> PubsubMessage {
        PubsubMessage { data: b"x".to_vec(), attributes: vec![], ordering_key: String::new() }
    }

    #[test]
    fn names_accepted() {
        let longest = format!("a{}", "b".repeat(NAME_BYTES_MAX - 1));
        assert_eq!(longest.len(), 255);
        for name in ["orders", "a-b_c.d~e+f%g", "abc", "Orders2024", "go0gle", longest.as_str()] {
            assert_eq!(validate_name("topic", name), Ok(()), "{name}");
        }
    }

    #[test]
    fn names_refused() {
        let too_long = format!("a{}", "b".repeat(NAME_BYTES_MAX));
        assert_eq!(too_long.len(), 256);
        let cases = [
            "ab",
            "",
            too_long.as_str(),
            "1orders",
            "9ab",
            "-orders",
            "_orders",
            "goog-x",
            "GOOG-x",
            "google",
            "has space",
            "a/b",
            "projects/p/topics/t",
            "ordérs",
            "abc\0",
            "abc\n",
        ];
        for name in cases {
            let error = validate_name("subscription", name).expect_err(name);
            assert_eq!(error.code, ErrorCode::InvalidArgument, "{name}");
            assert!(error.message.starts_with("subscription name"), "{}", error.message);
        }
        let error = validate_name("topic", &too_long).unwrap_err();
        assert!(error.message.contains("NAME_BYTES_MAX"), "{}", error.message);
        assert!(error.message.len() < 200, "long names are shortened in messages: {}", error.message);
    }

    #[test]
    fn message_limits() {
        refused(message(b"", &[], ""), "empty");
        let attrs = |n: usize| -> Vec<(String, String)> {
            (0..n).map(|i| (format!("k{i}"), "v".to_owned())).collect()
        };
        refused(message(b"x", &attrs(ATTRIBUTES_COUNT_MAX + 1), ""), "ATTRIBUTES_COUNT_MAX");
        assert!(message(b"x", &attrs(ATTRIBUTES_COUNT_MAX), "").is_ok());

        let key = |n: usize| vec![("k".repeat(n), "v".to_owned())];
        refused(message(b"x", &key(ATTRIBUTE_KEY_BYTES_MAX + 1), ""), "ATTRIBUTE_KEY_BYTES_MAX");
        assert!(message(b"x", &key(ATTRIBUTE_KEY_BYTES_MAX), "").is_ok());

        let value = |n: usize| vec![("k".to_owned(), "v".repeat(n))];
        refused(message(b"x", &value(ATTRIBUTE_VALUE_BYTES_MAX + 1), ""), "ATTRIBUTE_VALUE_BYTES_MAX");
        assert!(message(b"x", &value(ATTRIBUTE_VALUE_BYTES_MAX), "").is_ok());

        refused(message(b"x", &[], &"o".repeat(ORDERING_KEY_BYTES_MAX + 1)), "ORDERING_KEY_BYTES_MAX");
        assert!(message(b"x", &[], &"o".repeat(ORDERING_KEY_BYTES_MAX)).is_ok());

        let big = vec![0u8; MESSAGE_BYTES_MAX + 1];
        refused(message(&big, &[], ""), "MESSAGE_BYTES_MAX");
        assert_eq!(message(&big[..MESSAGE_BYTES_MAX], &[], ""), Ok(MESSAGE_BYTES_MAX));
        // Attributes and the ordering key count towards the message size.
        refused(
            message(&big[..MESSAGE_BYTES_MAX - 2], &[("k".into(), "v".into())], "o"),
            "MESSAGE_BYTES_MAX",
        );

        refused(message(b"x", &[(String::new(), "v".to_owned())], ""), "empty key");
    }

    #[test]
    fn message_sizes_are_accounted() {
        assert_eq!(
            message(b"", &[("key".into(), "value".into())], ""),
            Ok(8),
            "attributes alone are a message"
        );
        assert_eq!(message(b"", &[("k".into(), String::new())], ""), Ok(1));
        assert_eq!(message(b"hello", &[("ab".into(), "cde".into())], "okey"), Ok(5 + 2 + 3 + 4));
        // An ordering key alone does not make a message.
        assert!(message(b"", &[], "okey").is_err());
    }

    #[test]
    fn publish_requests() {
        let ok = PublishRequest { topic: "orders".into(), messages: vec![one_message(); 3] };
        assert_eq!(publish(&ok), Ok(3));
        assert_eq!(publish(&sample_publish()).map(|size| size > 0), Ok(true));

        let none = PublishRequest { topic: "orders".into(), messages: vec![] };
        let error = publish(&none).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert!(error.message.contains("no messages"), "{}", error.message);

        let too_many = PublishRequest {
            topic: "orders".into(),
            messages: vec![one_message(); PUBLISH_BATCH_MESSAGES_MAX + 1],
        };
        let error = publish(&too_many).unwrap_err();
        assert!(error.message.contains("PUBLISH_BATCH_MESSAGES_MAX"), "{}", error.message);
        let most = PublishRequest {
            topic: "orders".into(),
            messages: vec![one_message(); PUBLISH_BATCH_MESSAGES_MAX],
        };
        assert_eq!(publish(&most), Ok(PUBLISH_BATCH_MESSAGES_MAX));

        let bad_topic = PublishRequest { topic: "goog-orders".into(), messages: vec![one_message()] };
        assert_eq!(publish(&bad_topic).unwrap_err().code, ErrorCode::InvalidArgument);

        let bad_message = PublishRequest {
            topic: "orders".into(),
            messages: vec![one_message(), PubsubMessage::default()],
        };
        let error = publish(&bad_message).unwrap_err();
        assert!(error.message.contains("message 1"), "{}", error.message);
    }

    #[test]
    fn publish_request_total_size() {
        let half = PubsubMessage { data: vec![7u8; PUBLISH_REQUEST_BYTES_MAX / 2 + 1], ..Default::default() };
        let request = PublishRequest { topic: "orders".into(), messages: vec![half.clone(), half] };
        let error = publish(&request).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidArgument);
        assert!(error.message.contains("PUBLISH_REQUEST_BYTES_MAX"), "{}", error.message);
    }

    #[test]
    fn ack_deadlines() {
        assert_eq!(effective_ack_deadline_seconds(0), Ok(ACK_DEADLINE_SECONDS_DEFAULT));
        assert_eq!(effective_ack_deadline_seconds(0), Ok(10));
        assert_eq!(effective_ack_deadline_seconds(10), Ok(10));
        assert_eq!(effective_ack_deadline_seconds(600), Ok(600));
        for bad in [1, 9, 601, u32::MAX] {
            let error = effective_ack_deadline_seconds(bad).expect_err("out of range");
            assert_eq!(error.code, ErrorCode::InvalidArgument);
        }
    }

    #[test]
    fn retention() {
        assert_eq!(effective_retention_seconds(0), Ok(RETENTION_SECONDS_DEFAULT));
        assert_eq!(effective_retention_seconds(0), Ok(7 * 24 * 3600));
        assert_eq!(effective_retention_seconds(RETENTION_SECONDS_MIN), Ok(600));
        assert_eq!(effective_retention_seconds(RETENTION_SECONDS_MAX), Ok(31 * 24 * 3600));
        for bad in [1, RETENTION_SECONDS_MIN - 1, RETENTION_SECONDS_MAX + 1, u64::MAX] {
            let error = effective_retention_seconds(bad).expect_err("out of range");
            assert_eq!(error.code, ErrorCode::InvalidArgument);
        }
    }
}
