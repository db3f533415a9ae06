//! A blocking client of the daemon's gRPC API (Google Cloud Pub/Sub's `google.pubsub.v1`), for
//! tests: tonic's generated clients driven by a current-thread tokio runtime of its own, so a
//! test calls `grpc.create_topic(..)` as it calls the native client's methods, with nothing
//! async in sight. Every call is bounded by `GRPC_CALL_TIMEOUT`, so a daemon that does not
//! answer fails the test instead of hanging it.
//!
//! For what the wrappers do not cover (a StreamingPull, metadata of its own), `block_on`,
//! `publisher`, `subscriber` and `request` give the pieces.

pub use ringpost_proto::pubsub;
use ringpost_proto::pubsub::publisher_client::PublisherClient;
use ringpost_proto::pubsub::schema_service_client::SchemaServiceClient;
use ringpost_proto::pubsub::subscriber_client::SubscriberClient;
use std::future::Future;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// The longest a test waits for one call (or for the connection).
pub const GRPC_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest response a client decodes: above Pub/Sub's 10 MB message limit, so a pull of
/// the largest message is read whole (tonic's default is 4 MiB).
pub const GRPC_RESPONSE_BYTES_MAX: usize = 32 << 20;
/// The project the helpers name resources in (any valid project is the daemon's one namespace).
pub const PROJECT: &str = "test-project";

/// `projects/test-project/topics/{name}`.
pub fn topic_path(name: &str) -> String {
    format!("projects/{PROJECT}/topics/{name}")
}

/// `projects/test-project/subscriptions/{name}`.
pub fn subscription_path(name: &str) -> String {
    format!("projects/{PROJECT}/subscriptions/{name}")
}

/// `projects/test-project/snapshots/{name}`.
pub fn snapshot_path(name: &str) -> String {
    format!("projects/{PROJECT}/snapshots/{name}")
}

/// `projects/test-project/schemas/{name}`.
pub fn schema_path(name: &str) -> String {
    format!("projects/{PROJECT}/schemas/{name}")
}

/// `projects/test-project`.
pub fn project_path() -> String {
    format!("projects/{PROJECT}")
}

/// A connection to the gRPC API, and the token it presents (if any) on every call.
pub struct Grpc {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    token: Option<String>,
}

/// A unary call's blocking wrapper, by the generated client's method name.
macro_rules! unary {
    ($client:ident, $method:ident, $request:ty, $response:ty) => {
        pub fn $method(&self, request: $request) -> Result<$response, tonic::Status> {
            let mut client = self.$client();
            let request = self.request(request);
            self.call(async move { client.$method(request).await.map(tonic::Response::into_inner) })
        }
    };
}

impl Grpc {
    /// Connects to `address` ("127.0.0.1:PORT", as `Daemon::grpc_address`) without credential.
    pub fn connect(address: &str) -> Grpc {
        Grpc::connect_with_token(address, None)
    }

    /// Connects to `address`; every call presents `token` as `authorization: Bearer <token>`.
    pub fn connect_with_token(address: &str, token: Option<&str>) -> Grpc {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("building the gRPC client's runtime");
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .expect("a gRPC address")
            .connect_timeout(GRPC_CALL_TIMEOUT)
            .timeout(GRPC_CALL_TIMEOUT);
        let channel = runtime
            .block_on(endpoint.connect())
            .unwrap_or_else(|error| panic!("connecting to the gRPC API at {address}: {error}"));
        Grpc { runtime, channel, token: token.map(str::to_owned) }
    }

    /// The same connection presenting `token` instead (or none). It keeps the runtime: the
    /// channel's background task runs on it, and only while it is driven.
    pub fn with_token(self, token: Option<&str>) -> Grpc {
        Grpc { token: token.map(str::to_owned), ..self }
    }

    /// Runs `future` on this client's runtime (a StreamingPull, say).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Runs a call, failing it as `DEADLINE_EXCEEDED` after `GRPC_CALL_TIMEOUT`.
    pub fn call<T>(&self, call: impl Future<Output = Result<T, tonic::Status>>) -> Result<T, tonic::Status> {
        self.block_on(async move {
            match tokio::time::timeout(GRPC_CALL_TIMEOUT, call).await {
                Ok(result) => result,
                Err(_) => Err(tonic::Status::deadline_exceeded("the test's gRPC call timed out")),
            }
        })
    }

    pub fn publisher(&self) -> PublisherClient<Channel> {
        PublisherClient::new(self.channel.clone()).max_decoding_message_size(GRPC_RESPONSE_BYTES_MAX)
    }

    pub fn subscriber(&self) -> SubscriberClient<Channel> {
        SubscriberClient::new(self.channel.clone()).max_decoding_message_size(GRPC_RESPONSE_BYTES_MAX)
    }

    pub fn schemas(&self) -> SchemaServiceClient<Channel> {
        SchemaServiceClient::new(self.channel.clone()).max_decoding_message_size(GRPC_RESPONSE_BYTES_MAX)
    }

    /// `message` as a request carrying this client's token.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}").parse().expect("a token is printable ASCII");
            request.metadata_mut().insert("authorization", value);
        }
        request
    }

    unary!(publisher, create_topic, pubsub::Topic, pubsub::Topic);
    unary!(publisher, update_topic, pubsub::UpdateTopicRequest, pubsub::Topic);
    unary!(publisher, publish, pubsub::PublishRequest, pubsub::PublishResponse);
    unary!(publisher, get_topic, pubsub::GetTopicRequest, pubsub::Topic);
    unary!(publisher, list_topics, pubsub::ListTopicsRequest, pubsub::ListTopicsResponse);
    unary!(
        publisher,
        list_topic_subscriptions,
        pubsub::ListTopicSubscriptionsRequest,
        pubsub::ListTopicSubscriptionsResponse
    );
    unary!(
        publisher,
        list_topic_snapshots,
        pubsub::ListTopicSnapshotsRequest,
        pubsub::ListTopicSnapshotsResponse
    );
    unary!(publisher, delete_topic, pubsub::DeleteTopicRequest, ());
    unary!(
        publisher,
        detach_subscription,
        pubsub::DetachSubscriptionRequest,
        pubsub::DetachSubscriptionResponse
    );

    unary!(subscriber, create_subscription, pubsub::Subscription, pubsub::Subscription);
    unary!(subscriber, get_subscription, pubsub::GetSubscriptionRequest, pubsub::Subscription);
    unary!(subscriber, update_subscription, pubsub::UpdateSubscriptionRequest, pubsub::Subscription);
    unary!(
        subscriber,
        list_subscriptions,
        pubsub::ListSubscriptionsRequest,
        pubsub::ListSubscriptionsResponse
    );
    unary!(subscriber, delete_subscription, pubsub::DeleteSubscriptionRequest, ());
    unary!(subscriber, modify_push_config, pubsub::ModifyPushConfigRequest, ());
    unary!(subscriber, modify_ack_deadline, pubsub::ModifyAckDeadlineRequest, ());
    unary!(subscriber, acknowledge, pubsub::AcknowledgeRequest, ());
    unary!(subscriber, pull, pubsub::PullRequest, pubsub::PullResponse);
    unary!(subscriber, get_snapshot, pubsub::GetSnapshotRequest, pubsub::Snapshot);
    unary!(subscriber, list_snapshots, pubsub::ListSnapshotsRequest, pubsub::ListSnapshotsResponse);
    unary!(subscriber, create_snapshot, pubsub::CreateSnapshotRequest, pubsub::Snapshot);
    unary!(subscriber, update_snapshot, pubsub::UpdateSnapshotRequest, pubsub::Snapshot);
    unary!(subscriber, delete_snapshot, pubsub::DeleteSnapshotRequest, ());
    unary!(subscriber, seek, pubsub::SeekRequest, pubsub::SeekResponse);

    unary!(schemas, create_schema, pubsub::CreateSchemaRequest, pubsub::Schema);
    unary!(schemas, get_schema, pubsub::GetSchemaRequest, pubsub::Schema);
    unary!(schemas, list_schemas, pubsub::ListSchemasRequest, pubsub::ListSchemasResponse);
    unary!(
        schemas,
        list_schema_revisions,
        pubsub::ListSchemaRevisionsRequest,
        pubsub::ListSchemaRevisionsResponse
    );
    unary!(schemas, commit_schema, pubsub::CommitSchemaRequest, pubsub::Schema);
    unary!(schemas, rollback_schema, pubsub::RollbackSchemaRequest, pubsub::Schema);
    unary!(schemas, delete_schema_revision, pubsub::DeleteSchemaRevisionRequest, pubsub::Schema);
    unary!(schemas, delete_schema, pubsub::DeleteSchemaRequest, ());
    unary!(schemas, validate_schema, pubsub::ValidateSchemaRequest, pubsub::ValidateSchemaResponse);
    unary!(schemas, validate_message, pubsub::ValidateMessageRequest, pubsub::ValidateMessageResponse);

    // --- Shorthands for the common cases ---------------------------------------------------

    /// Creates topic `name` (in `PROJECT`) with nothing else set.
    pub fn create_plain_topic(&self, name: &str) -> Result<pubsub::Topic, tonic::Status> {
        self.create_topic(pubsub::Topic { name: topic_path(name), ..Default::default() })
    }

    /// Creates a pull subscription `name` of topic `topic` with Pub/Sub's defaults.
    pub fn create_plain_subscription(
        &self,
        name: &str,
        topic: &str,
    ) -> Result<pubsub::Subscription, tonic::Status> {
        self.create_subscription(pubsub::Subscription {
            name: subscription_path(name),
            topic: topic_path(topic),
            ..Default::default()
        })
    }

    /// Publishes messages of `data` to `topic`; returns their message ids.
    pub fn publish_data(&self, topic: &str, data: &[&[u8]]) -> Result<Vec<String>, tonic::Status> {
        let messages = data
            .iter()
            .map(|data| pubsub::PubsubMessage { data: data.to_vec().into(), ..Default::default() })
            .collect();
        Ok(self.publish(pubsub::PublishRequest { topic: topic_path(topic), messages })?.message_ids)
    }

    /// Pulls up to `max_messages`, returning at once when there are none.
    pub fn pull_now(
        &self,
        subscription: &str,
        max_messages: i32,
    ) -> Result<Vec<pubsub::ReceivedMessage>, tonic::Status> {
        #[allow(deprecated)]
        let request = pubsub::PullRequest {
            subscription: subscription_path(subscription),
            return_immediately: true,
            max_messages,
        };
        Ok(self.pull(request)?.received_messages)
    }

    /// The names of every topic (following pages).
    pub fn topic_names(&self) -> Result<Vec<String>, tonic::Status> {
        let mut names = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self.list_topics(pubsub::ListTopicsRequest {
                project: project_path(),
                page_size: 0,
                page_token,
            })?;
            names.extend(page.topics.into_iter().map(|topic| topic.name));
            if page.next_page_token.is_empty() {
                return Ok(names);
            }
            page_token = page.next_page_token;
        }
    }

    /// The names of every subscription (following pages).
    pub fn subscription_names(&self) -> Result<Vec<String>, tonic::Status> {
        let mut names = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self.list_subscriptions(pubsub::ListSubscriptionsRequest {
                project: project_path(),
                page_size: 0,
                page_token,
            })?;
            names.extend(page.subscriptions.into_iter().map(|subscription| subscription.name));
            if page.next_page_token.is_empty() {
                return Ok(names);
            }
            page_token = page.next_page_token;
        }
    }
}
