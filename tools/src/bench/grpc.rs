//! The workloads through Google Cloud Pub/Sub's gRPC API instead of the native protocol
//! (`ringpost-bench --grpc ADDR`): publishers call `Publisher.Publish`, subscribers hold a
//! `Subscriber.StreamingPull` each and acknowledge with unary `Acknowledge` calls, as the Python
//! and Node client libraries do. Topics and subscriptions are still made through the router's
//! native protocol: both protocols see the same names, so the figures differ only where the
//! messages go.
//!
//! tonic needs a tokio runtime for its connections; the bench's threads keep polling their
//! requests with their own small poller (`inflight`), and the runtime's threads carry the
//! HTTP/2 connections. One channel (one HTTP/2 connection) per publisher and per subscriber
//! thread, as an application with one client per thread would have.

use ringpost_client::{Error, Message};
use ringpost_proto::pubsub;
use ringpost_proto::pubsub::publisher_client::PublisherClient;
use ringpost_proto::pubsub::subscriber_client::SubscriberClient;
use ringpost_wire::{ErrorCode, Status};
use std::sync::OnceLock;
use tonic::transport::{Channel, Endpoint};

/// The project the bench names its resources in; every project maps to the daemon's one
/// namespace.
pub const PROJECT: &str = "ringpost-bench";

/// The tokio worker threads that carry the bench's gRPC connections.
pub const RUNTIME_THREADS: usize = 2;

/// The largest response a subscriber accepts: above the daemon's 4 MiB responses, and above
/// tonic's own 4 MiB default, which a message of 10 MB would exceed.
pub const RESPONSE_BYTES_MAX: usize = 16 << 20;

pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("bench-grpc")
            .enable_all()
            .build()
            .expect("starting the bench's tokio runtime")
    })
}

/// One HTTP/2 connection to the gRPC API, with its Publisher and Subscriber clients.
#[derive(Clone)]
pub struct GrpcClient {
    publisher: PublisherClient<Channel>,
    subscriber: SubscriberClient<Channel>,
    token: Option<String>,
}

impl GrpcClient {
    /// Connects to `address` (HOST:PORT, plaintext).
    pub fn connect(address: &str, token: Option<&str>) -> Result<GrpcClient, Error> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|error| Error::Protocol(format!("--grpc {address}: {error}")))?
            .tcp_nodelay(true);
        let channel = runtime()
            .block_on(endpoint.connect())
            .map_err(|error| Error::Closed(format!("{address} (gRPC): {error}")))?;
        Ok(GrpcClient {
            publisher: PublisherClient::new(channel.clone()),
            subscriber: SubscriberClient::new(channel).max_decoding_message_size(RESPONSE_BYTES_MAX),
            token: token.map(str::to_owned),
        })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            if let Ok(value) = format!("Bearer {token}").parse() {
                request.metadata_mut().insert("authorization", value);
            }
        }
        request
    }

    /// Publishes `messages` to `topic` (Ringpost's name); their message ids, in order.
    pub async fn publish(&self, topic: &str, messages: Vec<Message>) -> Result<Vec<u64>, Error> {
        let request = pubsub::PublishRequest {
            topic: format!("projects/{PROJECT}/topics/{topic}"),
            messages: messages
                .into_iter()
                .map(|Message(message)| pubsub::PubsubMessage {
                    data: message.data.into(),
                    attributes: message.attributes.into_iter().map(|pair| (pair.key, pair.value)).collect(),
                    ordering_key: message.ordering_key,
                    ..Default::default()
                })
                .collect(),
        };
        let response = self.publisher.clone().publish(self.request(request)).await.map_err(from_grpc)?;
        response
            .into_inner()
            .message_ids
            .iter()
            .map(|id| id.parse().map_err(|_| Error::Protocol(format!("message id {id:?} is not a number"))))
            .collect()
    }

    /// Acknowledges `ack_ids` on `subscription` (Ringpost's name).
    pub async fn acknowledge(&self, subscription: &str, ack_ids: Vec<String>) -> Result<(), Error> {
        let request = pubsub::AcknowledgeRequest {
            subscription: format!("projects/{PROJECT}/subscriptions/{subscription}"),
            ack_ids,
        };
        self.subscriber.clone().acknowledge(self.request(request)).await.map_err(from_grpc)?;
        Ok(())
    }

    /// Opens a StreamingPull on `subscription` with a window of `window` messages. The request
    /// side stays open and silent: acknowledgements go as unary calls.
    pub fn streaming_pull(
        &self,
        subscription: &str,
        window: u64,
    ) -> Result<tonic::Streaming<pubsub::StreamingPullResponse>, Error> {
        let first = pubsub::StreamingPullRequest {
            subscription: format!("projects/{PROJECT}/subscriptions/{subscription}"),
            stream_ack_deadline_seconds: STREAM_ACK_DEADLINE_SECONDS,
            max_outstanding_messages: window as i64,
            ..Default::default()
        };
        let requests = futures_lite::stream::once(first).chain(futures_lite::stream::pending());
        let mut subscriber = self.subscriber.clone();
        let request = self.request(requests);
        let response = runtime().block_on(subscriber.streaming_pull(request)).map_err(from_grpc)?;
        Ok(response.into_inner())
    }
}

use futures_lite::StreamExt;

/// The lease a bench stream asks for: the clients' own default.
pub const STREAM_ACK_DEADLINE_SECONDS: i32 = 60;

/// A gRPC status as the native client's error, so the workloads report both alike.
pub fn from_grpc(status: tonic::Status) -> Error {
    let code = ErrorCode::from_u32(status.code() as u32).unwrap_or(ErrorCode::Unknown);
    Error::Status(Status::new(code, status.message().to_owned()))
}
