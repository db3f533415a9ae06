//! The catalog's limits (topics, subscriptions in all and per topic, snapshots), lowered by
//! ringpostd's flags: a create beyond one is refused with ResourceExhausted naming the limit and
//! its flag, on the native protocol and the gRPC API, concurrent creates never pass it together,
//! a deletion makes room, and a restart keeps them. And bad input the server refuses as
//! Pub/Sub does: protobuf that does not decode, a Seek's nanos out of range, a dead-letter topic
//! equal to the subscription's own.

use ringpost_client::{block_on, Client, ErrorCode, Subscription, SubscriptionUpdate};
use ringpost_proto::pubsub;
use ringpost_tests::grpc::{subscription_path, topic_path, Grpc};
use ringpost_tests::{create_subscription, Daemon};
use std::time::Duration;
use tonic::Code;

/// The daemon with small limits and the gRPC API.
fn limited(label: &str) -> Daemon {
    let flags = [
        "--topics-max",
        "3",
        "--subscriptions-max",
        "4",
        "--subscriptions-per-topic-max",
        "2",
        "--snapshots-max",
        "1",
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    Daemon::start_with(label, Vec::new(), flags.iter().map(|flag| flag.to_string()).collect())
}

/// The refusal of a native call, which must be ResourceExhausted naming `limit` and its flag.
fn assert_exhausted<T: std::fmt::Debug>(result: ringpost_client::Result<T>, limit: &str) {
    let error = result.expect_err("beyond the limit");
    assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}");
    let flag = format!("--{}", limit.replace('_', "-"));
    assert!(error.to_string().contains(limit) && error.to_string().contains(&flag), "{error}");
}

fn subscription(name: &str, topic: &str) -> Subscription {
    Subscription { name: name.into(), topic: topic.into(), ..Default::default() }
}

#[test]
fn creates_beyond_the_catalogs_limits_are_refused_naming_the_limit_and_its_flag() {
    let mut daemon = limited("catalog-limits");
    let client = daemon.client();
    let grpc = Grpc::connect(daemon.grpc_address.as_ref().unwrap());
    for topic in ["top1", "top2", "top3"] {
        block_on(client.create_topic(topic)).unwrap();
    }
    assert_exhausted(block_on(client.create_topic("top4")), "topics_max");
    let refused = grpc.create_plain_topic("top4").unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("--topics-max"), "{}", refused.message());

    // Two subscriptions per topic, four in all.
    create_subscription(&client, "sub1", "top1", 10);
    create_subscription(&client, "sub2", "top1", 10);
    assert_exhausted(
        block_on(client.create_subscription(subscription("sub3", "top1"))),
        "subscriptions_per_topic_max",
    );
    let refused = grpc.create_plain_subscription("sub3", "top1").unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("topic 'top1'"), "{}", refused.message());
    create_subscription(&client, "sub3", "top2", 10);
    create_subscription(&client, "sub4", "top2", 10);
    assert_exhausted(block_on(client.create_subscription(subscription("sub5", "top3"))), "subscriptions_max");

    // One snapshot.
    block_on(client.create_snapshot("snap1", "sub1")).unwrap();
    assert_exhausted(block_on(client.create_snapshot("snap2", "sub2")), "snapshots_max");
    let request = pubsub::CreateSnapshotRequest {
        name: "projects/p/snapshots/snap2".into(),
        subscription: subscription_path("sub2"),
        ..Default::default()
    };
    assert_eq!(grpc.create_snapshot(request).unwrap_err().code(), Code::ResourceExhausted);
    assert_eq!(block_on(client.list_topics()).unwrap().len(), 3, "nothing refused was created");

    // A deletion makes room; a restart counts what the catalog holds.
    block_on(client.delete_subscription("sub4")).unwrap();
    create_subscription(&client, "sub5", "top3", 10);
    block_on(client.delete_snapshot("snap1")).unwrap();
    block_on(client.create_snapshot("snap2", "sub2")).unwrap();
    daemon.restart();
    let client = daemon.client();
    assert_exhausted(block_on(client.create_topic("top4")), "topics_max");
    assert_exhausted(block_on(client.create_subscription(subscription("sub6", "top3"))), "subscriptions_max");
    assert_exhausted(block_on(client.create_snapshot("snap3", "sub1")), "snapshots_max");
}

/// Creates racing each other at a limit: exactly as many succeed as it leaves room for, the rest
/// are ResourceExhausted (the creates in flight count against it, not only what is decided).
#[test]
fn concurrent_creates_never_pass_a_limit_together() {
    let daemon = limited("catalog-limits-race");
    let address = daemon.address.clone();
    let created = |names: Vec<String>, create: fn(&Client, &str) -> ringpost_client::Result<()>| {
        let threads: Vec<_> = names
            .into_iter()
            .map(|name| {
                let address = address.clone();
                std::thread::spawn(move || {
                    let client = block_on(Client::connect(&address)).unwrap();
                    create(&client, &name)
                })
            })
            .collect();
        let outcomes: Vec<_> = threads.into_iter().map(|thread| thread.join().unwrap()).collect();
        for outcome in &outcomes {
            if let Err(error) = outcome {
                assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}");
            }
        }
        outcomes.iter().filter(|outcome| outcome.is_ok()).count()
    };
    let topics = (0..12).map(|index| format!("race-{index}")).collect();
    assert_eq!(created(topics, |client, name| block_on(client.create_topic(name)).map(|_| ())), 3);
    let topic = block_on(daemon.client().list_topics()).unwrap()[0].name.clone();
    let subscriptions = (0..12).map(|index| format!("{topic}/race-sub-{index}")).collect();
    let made = created(subscriptions, |client, name| {
        let (topic, name) = name.split_once('/').unwrap();
        block_on(client.create_subscription(subscription(name, topic))).map(|_| ())
    });
    assert_eq!(made, 2, "subscriptions_per_topic_max is 2");
}

#[test]
fn a_limit_of_zero_is_a_usage_error() {
    for flag in ["--topics-max", "--subscriptions-max", "--subscriptions-per-topic-max", "--snapshots-max"] {
        let output = std::process::Command::new(ringpost_tests::binary("ringpostd"))
            .args([flag, "0"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{flag}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains(flag) && said.contains("at least 1"), "{flag}: {said}");
    }
}

/// A request whose protobuf does not decode: tonic's codec answers INTERNAL, Pub/Sub
/// INVALID_ARGUMENT, which is the client's error.
mod raw {
    use bytes::{Buf, BufMut};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    /// Sends bytes as they are; decodes answers as `T`.
    pub struct RawCodec<T>(std::marker::PhantomData<T>);

    impl<T> Default for RawCodec<T> {
        fn default() -> Self {
            RawCodec(std::marker::PhantomData)
        }
    }

    pub struct Raw;
    pub struct Answer<T>(std::marker::PhantomData<T>);

    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, buffer: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
            buffer.put_slice(&item);
            Ok(())
        }
    }

    impl<T: prost::Message + Default> Decoder for Answer<T> {
        type Item = T;
        type Error = tonic::Status;
        fn decode(&mut self, buffer: &mut DecodeBuf<'_>) -> Result<Option<T>, tonic::Status> {
            let bytes = buffer.copy_to_bytes(buffer.remaining());
            T::decode(bytes).map(Some).map_err(|error| tonic::Status::internal(error.to_string()))
        }
    }

    impl<T: prost::Message + Default + Send + 'static> Codec for RawCodec<T> {
        type Encode = Vec<u8>;
        type Decode = T;
        type Encoder = Raw;
        type Decoder = Answer<T>;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Answer<T> {
            Answer(std::marker::PhantomData)
        }
    }
}

/// Bytes that are no protobuf message: field 1, length-delimited, announcing 5 bytes and
/// carrying 1.
const NOT_PROTOBUF: [u8; 3] = [0x0a, 0x05, 0x61];

#[test]
fn grpc_refuses_bad_input_as_pubsub_does() {
    let daemon = Daemon::start_with(
        "grpc-bad-input",
        Vec::new(),
        vec!["--grpc-listen".to_owned(), "127.0.0.1:0".to_owned()],
    );
    let grpc = Grpc::connect(daemon.grpc_address.as_ref().unwrap());
    grpc.create_plain_topic("orders").unwrap();
    grpc.create_plain_topic("dead").unwrap();
    grpc.create_plain_subscription("orders-sub", "orders").unwrap();

    // A unary call and a stream whose request does not decode.
    let address = format!("http://{}", daemon.grpc_address.as_ref().unwrap());
    let channel = grpc.block_on(tonic::transport::Endpoint::from_shared(address).unwrap().connect()).unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    let path = http::uri::PathAndQuery::from_static("/google.pubsub.v1.Publisher/GetTopic");
    let refused = grpc
        .call(async {
            raw.ready().await.unwrap();
            raw.unary(
                tonic::Request::new(NOT_PROTOBUF.to_vec()),
                path,
                raw::RawCodec::<pubsub::Topic>::default(),
            )
            .await
        })
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("protobuf"), "{}", refused.message());
    let path = http::uri::PathAndQuery::from_static("/google.pubsub.v1.Subscriber/StreamingPull");
    let requests = tonic::codegen::tokio_stream::iter(vec![NOT_PROTOBUF.to_vec()]);
    let refused = grpc.block_on(async {
        raw.ready().await.unwrap();
        let codec = raw::RawCodec::<pubsub::StreamingPullResponse>::default();
        match raw.streaming(tonic::Request::new(requests), path, codec).await {
            Err(status) => status,
            Ok(response) => {
                let mut responses = response.into_inner();
                tokio::time::timeout(Duration::from_secs(10), responses.message())
                    .await
                    .expect("the stream ends")
                    .expect_err("refused")
            }
        }
    });
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // A Seek's time with nanos of a second or more.
    for (nanos, code) in [
        (2_000_000_000, Code::InvalidArgument),
        (1_000_000_000, Code::InvalidArgument),
        (-1, Code::InvalidArgument),
    ] {
        let request = pubsub::SeekRequest {
            subscription: subscription_path("orders-sub"),
            target: Some(pubsub::seek_request::Target::Time(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos,
            })),
        };
        assert_eq!(grpc.seek(request).unwrap_err().code(), code, "nanos {nanos}");
    }
    let request = pubsub::SeekRequest {
        subscription: subscription_path("orders-sub"),
        target: Some(pubsub::seek_request::Target::Time(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 999_999_999,
        })),
    };
    grpc.seek(request).expect("the largest nanos");

    // A dead-letter topic equal to the subscription's own, at creation and by an update.
    let policy = |topic: &str| pubsub::DeadLetterPolicy {
        dead_letter_topic: topic_path(topic),
        max_delivery_attempts: 5,
    };
    let looping = pubsub::Subscription {
        name: subscription_path("looping"),
        topic: topic_path("orders"),
        dead_letter_policy: Some(policy("orders")),
        ..Default::default()
    };
    let refused = grpc.create_subscription(looping).unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("dead_letter_topic"), "{}", refused.message());
    let update = pubsub::UpdateSubscriptionRequest {
        subscription: Some(pubsub::Subscription {
            name: subscription_path("orders-sub"),
            topic: topic_path("orders"),
            dead_letter_policy: Some(policy("orders")),
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask { paths: vec!["dead_letter_policy".into()] }),
    };
    assert_eq!(grpc.update_subscription(update.clone()).unwrap_err().code(), Code::InvalidArgument);
    let mut to_dead = update;
    to_dead.subscription.as_mut().unwrap().dead_letter_policy = Some(policy("dead"));
    grpc.update_subscription(to_dead).expect("another topic is a dead-letter topic");

    // The native protocol refuses it alike.
    let client = daemon.client();
    let looping = Subscription {
        dead_letter_topic: "orders".into(),
        max_delivery_attempts: 5,
        ..subscription("looping", "orders")
    };
    let error = block_on(client.create_subscription(looping)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    let update = SubscriptionUpdate { dead_letter_policy: Some(("orders".into(), 5)), ..Default::default() };
    let error = block_on(client.update_subscription("orders-sub", update)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
}
