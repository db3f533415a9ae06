//! The Ringpost client library.
//!
//! ```no_run
//! use ringpost_client::{block_on, Client, Message};
//! let client = block_on(Client::connect("127.0.0.1:7450")).unwrap();
//! block_on(client.create_topic("orders")).unwrap();
//! let ids = block_on(client.publish("orders", vec![Message::new("order 1").attribute("region", "eu")])).unwrap();
//! ```
//!
//! A [`Client`] talks to the router for the control plane (topics, subscriptions, lookups) and
//! directly to the forwarder that owns a topic for publish, pull and acknowledge, so data never
//! passes through the router. When a forwarder answers `NotOwner`, the client asks the router
//! again. See [`connection`] for the threading model: futures are executor-agnostic.
//!
//! The router gets one connection, reopened when it was closed. Each forwarder gets a
//! [`Pool`] of connections (Bigtable's channel pool: round robin over up to 4 connections of at
//! most 100 requests in flight each, idle close, periodic refresh; see [`pool`]). Publish, pull,
//! acknowledge and modify-ack-deadline that fail with a connection error, `Unavailable` or
//! `ResourceExhausted` are retried with backoff (see [`retry`]), sleeping on the process's one
//! [`timer`] thread.
//!
//! Every unary request has a deadline, [`REQUEST_TIMEOUT_DEFAULT`] (60 s, as Google's clients)
//! unless [`Client::with_request_timeout`] says otherwise, counted from the call to its result
//! with retries and backoff included (a pull's wait comes on top). When it passes, the request
//! fails with [`Error::DeadlineExceeded`] and is forgotten: an answer that still comes is
//! discarded. A streaming pull has the deadline while it opens, not once open.

mod admin;
pub mod connection;
pub mod pool;
pub mod publisher;
pub mod retry;
pub mod schemas;
pub mod security;
pub mod sources;
pub mod stream;
pub mod subscriber;
pub mod timer;

pub use admin::{SubscriptionUpdate, TopicUpdate};
pub use connection::Connection;
pub use pool::{ConnectionStats, Pool, PoolCounters, PoolSettings, Strategy};
pub use publisher::{
    BatchSettings, LimitExceededBehavior, PublishFlowControl, PublishFuture, Publisher, PublisherSettings,
};
pub use retry::RetrySettings;
pub use ringpost_wire::messages::{
    Attribute, ClusterDrainStatusResponse, ClusterStatusResponse, DirectoryStatus, FollowerStats,
    InvalidAckId, NodeDrainStatus, NodeStatus, ProcessStats, PubsubMessage, PushConfig, PushError,
    PushRequestCount, PushSubscriptionStats, ReceivedMessage, ReplicaStats, ResyncDirectoryResponse,
    RoutingRule, Schema, SchemaSettings, ShardStats, Snapshot, StatsResponse, StatsWithPushResponse,
    Subscription, SubscriptionStats, SubscriptionWithPush, SubscriptionWithPushProject, Topic,
    TopicPlacement, TopicSource, TopicStats, TopicWithSchema, TopicWithSourcePolicy, TopicWithSources,
};
pub use ringpost_wire::{ErrorCode, Status};
pub use schemas::{SchemaEncoding, SchemaType};
pub use security::Security;
pub use stream::{MessageStream, ResumingStream, StreamEvent, StreamSettings};
pub use subscriber::{AckHandle, ShutdownMode, Subscriber, SubscriberSettings, SubscriberStats};
pub use timer::sleep;

use connection::Response;
use retry::Backoff;
use ringpost_wire::frame::{decode_body, decode_error, Body};
use ringpost_wire::messages::*;
use ringpost_wire::Command;
use rkyv::api::high::HighValidator;
use rkyv::bytecheck::CheckBytes;
use rkyv::de::Pool as RkyvPool;
use rkyv::rancor::{self, Strategy as RkyvStrategy};
use rkyv::{Archive, Deserialize};
use sources::Target;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request; the code is the wire's stable error code.
    #[error("{0}")]
    Status(Status),
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    #[error("connection to {0} is closed")]
    Closed(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The request's deadline (`Client::with_request_timeout`) passed before it was done; the
    /// request is forgotten, and an answer that still comes is discarded.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// TLS could not be set up: a certificate or key file that cannot be read or used, or a
    /// handshake that failed (the server's certificate is not signed by the CA given, or not
    /// for the name expected, or the port does not speak TLS). Not retried: it would fail again.
    #[error("{0}")]
    Tls(String),
}

impl Error {
    /// The error code, for errors the server returned; `Unavailable` for connection failures.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Status(status) => status.code,
            Error::Connect { .. } | Error::Io(_) | Error::Closed(_) => ErrorCode::Unavailable,
            Error::Protocol(_) => ErrorCode::ProtocolError,
            Error::DeadlineExceeded(_) => ErrorCode::DeadlineExceeded,
            Error::Tls(_) => ErrorCode::Unavailable,
        }
    }

    fn duplicate(&self) -> Error {
        match self {
            Error::Status(status) => Error::Status(status.clone()),
            Error::Connect { address, source } => Error::Connect {
                address: address.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Io(error) => Error::Io(std::io::Error::new(error.kind(), error.to_string())),
            Error::Closed(address) => Error::Closed(address.clone()),
            Error::Protocol(text) => Error::Protocol(text.clone()),
            Error::DeadlineExceeded(text) => Error::DeadlineExceeded(text.clone()),
            Error::Tls(text) => Error::Tls(text.clone()),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A message to publish.
#[derive(Debug, Clone, Default)]
pub struct Message(pub PubsubMessage);

impl Message {
    pub fn new(data: impl Into<Vec<u8>>) -> Message {
        Message(PubsubMessage { data: data.into(), ..Default::default() })
    }
    pub fn attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Message {
        self.0.attributes.push(Attribute { key: key.into(), value: value.into() });
        self
    }
    pub fn ordering_key(mut self, key: impl Into<String>) -> Message {
        self.0.ordering_key = key.into();
        self
    }
}

pub(crate) fn decode<T>(response: Response) -> Result<T>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, RkyvStrategy<RkyvPool, rancor::Error>>,
{
    if response.header.is_error() {
        return Err(Error::Status(decode_error(&response.body)));
    }
    decode_body::<T>(&response.body).map_err(|status| Error::Protocol(status.message))
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Resource {
    Topic,
    Subscription,
}

/// The forwarder pools of one client, by address.
type Pools = Mutex<HashMap<String, Arc<Pool>>>;

/// A connection to a Ringpost daemon: the router plus a pool of connections per forwarder it
/// points to.
///
/// Threads: besides each connection's reader thread, a client starts one maintenance thread, on
/// its first data-plane request, which closes idle connections and refreshes old ones every
/// [`PoolSettings::maintenance_interval`] and ends when the client is dropped.
pub struct Client {
    /// Reopened (with a new `Hello`) when found closed, e.g. after the server's idle timeout.
    router: Mutex<Arc<Connection>>,
    router_address: String,
    settings: PoolSettings,
    /// How long one unary request may take in all, retries and their backoff included.
    request_timeout: Duration,
    retry_publish: RetrySettings,
    /// Pull, acknowledge and modify-ack-deadline.
    retry_subscribe: RetrySettings,
    pools: Arc<Pools>,
    routes: Mutex<HashMap<(Resource, String), sources::Routes>>,
    /// The turn of unordered publishes over a topic's active sources (`Target::Spread`). It
    /// starts at a random turn: many short-lived clients starting at 0 would all send their
    /// first requests to source 0, and a fault of its leader would stall each of them while
    /// the other sources sat idle.
    spread_turn: AtomicUsize,
    /// The router answered `LookupSources` with `Unimplemented` (it is from before sources):
    /// only the plain lookups are asked from then on.
    sources_unimplemented: AtomicBool,
    maintenance: OnceLock<Maintenance>,
    /// TLS and token of every connection the client opens.
    security: Security,
}

struct Maintenance {
    thread: Option<std::thread::Thread>,
    stop: Arc<AtomicBool>,
}

/// How often a data-plane request is sent again after `NotOwner`, each time after a new lookup:
/// at once the first time (the placement moved), then after the retry's backoff (a replicated
/// topic's leader is being elected, for a few seconds).
const ROUTING_ATTEMPTS_MAX: usize = 10;

/// The default deadline of a unary request, retries included: the total timeout Google's
/// generated Pub/Sub clients give publish, pull and acknowledge. A pull that waits for messages
/// gets its wait on top. Streams have none once open; opening one has it.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// The shortest request deadline a client takes; shorter ones are raised to it.
pub const REQUEST_TIMEOUT_MIN: Duration = Duration::from_millis(1);

impl Client {
    /// Connects to the router at `address` (host:port), with the default [`PoolSettings`].
    pub async fn connect(address: &str) -> Result<Client> {
        Client::connect_with(address, PoolSettings::default()).await
    }

    /// Connects to the router at `address` (host:port); forwarder connections are pooled with
    /// `settings` (`InvalidArgument` if they are out of range).
    pub async fn connect_with(address: &str, settings: PoolSettings) -> Result<Client> {
        Client::connect_with_timeout(address, settings, REQUEST_TIMEOUT_DEFAULT).await
    }

    /// Like `connect_with`, with `request_timeout` as the deadline of every unary request
    /// (see `with_request_timeout`), the connection's own `Hello` included: a port that accepts
    /// and never answers fails with `DeadlineExceeded` instead of waiting forever.
    pub async fn connect_with_timeout(
        address: &str,
        settings: PoolSettings,
        request_timeout: Duration,
    ) -> Result<Client> {
        Client::connect_with_security(address, settings, request_timeout, Security::default()).await
    }

    /// Like `connect_with_timeout`, with every connection the client opens (the router's,
    /// the forwarder pools', each streaming pull's) set up as `security` says: TLS, and a token
    /// presented first.
    pub async fn connect_with_security(
        address: &str,
        settings: PoolSettings,
        request_timeout: Duration,
        security: Security,
    ) -> Result<Client> {
        settings.validate()?;
        security.validate()?;
        let request_timeout = request_timeout.max(REQUEST_TIMEOUT_MIN);
        let router = open_router(address, request_timeout, &security).await?;
        Ok(Client {
            router: Mutex::new(router),
            router_address: address.to_owned(),
            settings,
            request_timeout,
            retry_publish: RetrySettings::PUBLISH,
            retry_subscribe: RetrySettings::SUBSCRIBE,
            pools: Arc::default(),
            routes: Mutex::default(),
            spread_turn: AtomicUsize::new(retry::random_below(1 << 32) as usize),
            sources_unimplemented: AtomicBool::new(false),
            maintenance: OnceLock::new(),
            security,
        })
    }

    /// Replaces the deadline of each unary request (default `REQUEST_TIMEOUT_DEFAULT`): the
    /// time from the call to its result, retries and backoff included, after which it fails
    /// with `DeadlineExceeded`. A pull that waits for messages gets its wait on top; a
    /// streaming pull is bounded only while it opens.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Client {
        self.request_timeout = timeout.max(REQUEST_TIMEOUT_MIN);
        self
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub fn router_address(&self) -> &str {
        &self.router_address
    }

    pub fn pool_settings(&self) -> &PoolSettings {
        &self.settings
    }

    pub fn security(&self) -> &Security {
        &self.security
    }

    /// Replaces the retry settings of publish and of the other data-plane requests (pull,
    /// acknowledge, modify-ack-deadline); the defaults are Pub/Sub's, `RetrySettings::PUBLISH`
    /// and `RetrySettings::SUBSCRIBE`. `RetrySettings::NONE` returns every failure at once, for
    /// callers that handle failures themselves (and tests that count refusals).
    pub fn with_retry(mut self, publish: RetrySettings, subscribe: RetrySettings) -> Client {
        self.retry_publish = publish;
        self.retry_subscribe = subscribe;
        self
    }

    /// Every forwarder connection of every pool (open, then draining, per pool).
    pub fn pool_stats(&self) -> Vec<ConnectionStats> {
        self.pool_list().iter().flat_map(|pool| pool.stats()).collect()
    }

    /// What the pools did, summed over forwarders.
    pub fn pool_counters(&self) -> PoolCounters {
        let mut total = PoolCounters::default();
        for pool in self.pool_list() {
            total += pool.counters();
        }
        total
    }

    /// Requests waiting for a forwarder connection, over all pools.
    pub fn pool_queued(&self) -> usize {
        self.pool_list().iter().map(|pool| pool.queued()).sum()
    }

    fn pool_list(&self) -> Vec<Arc<Pool>> {
        self.pools.lock().unwrap().values().cloned().collect()
    }

    /// The router connection, reopened if it was closed.
    async fn router(&self) -> Result<Arc<Connection>> {
        let current = self.router.lock().unwrap().clone();
        if !current.is_closed() {
            return Ok(current);
        }
        let fresh = open_router(&self.router_address, self.request_timeout, &self.security).await?;
        let mut router = self.router.lock().unwrap();
        // Requests that raced here each opened one: keep the first that is still open.
        if router.is_closed() {
            *router = fresh;
        }
        Ok(router.clone())
    }

    async fn control<Req: Body, Resp>(&self, command: Command, request: &Req) -> Result<Resp>
    where
        Resp: Archive,
        Resp::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<Resp, RkyvStrategy<RkyvPool, rancor::Error>>,
    {
        self.control_within(command, request, self.request_timeout).await
    }

    /// `control` with a deadline of its own, for a request that waits on more than the
    /// router (a node catching up with the catalog).
    async fn control_within<Req: Body, Resp>(
        &self,
        command: Command,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp>
    where
        Resp: Archive,
        Resp::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<Resp, RkyvStrategy<RkyvPool, rancor::Error>>,
    {
        let deadline = Instant::now() + timeout;
        let answer = async { decode(self.router().await?.call(command.code(), request).await?) };
        timer::run_until(deadline, answer).await.unwrap_or_else(|| {
            Err(Error::DeadlineExceeded(format!(
                "{command:?}: no answer from {} within {timeout:?}",
                self.router_address
            )))
        })
    }

    pub async fn create_topic(&self, name: &str) -> Result<Topic> {
        self.create_topic_with(Topic { name: name.to_owned(), ..Default::default() }).await
    }

    pub async fn create_topic_with(&self, topic: Topic) -> Result<Topic> {
        self.control(Command::CreateTopic, &topic).await
    }

    /// Creates `topic` on `replicas` nodes of a cluster (odd, at most its nodes): a publish is
    /// acknowledged once a majority of them hold it. `create_topic` gives the cluster's default
    /// (its nodes, at most 3).
    pub async fn create_topic_replicated(&self, topic: Topic, replicas: u32) -> Result<Topic> {
        self.control(Command::CreateReplicatedTopic, &CreateTopicRequest { topic, replicas }).await
    }

    pub async fn get_topic(&self, name: &str) -> Result<Topic> {
        self.control(Command::GetTopic, &NameRequest { name: name.to_owned() }).await
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        self.drop_route(Resource::Topic, name);
        self.control::<_, Empty>(Command::DeleteTopic, &NameRequest { name: name.to_owned() })
            .await
            .map(|_| ())
    }

    /// Every topic, following pages.
    pub async fn list_topics(&self) -> Result<Vec<Topic>> {
        let mut topics = Vec::new();
        let mut page_token = String::new();
        loop {
            let page: TopicList = self
                .control(
                    Command::ListTopics,
                    &ListRequest { topic: String::new(), page_size: 1000, page_token },
                )
                .await?;
            topics.extend(page.topics);
            if page.next_page_token.is_empty() {
                return Ok(topics);
            }
            page_token = page.next_page_token;
        }
    }

    pub async fn create_subscription(&self, subscription: Subscription) -> Result<Subscription> {
        self.control(Command::CreateSubscription, &subscription).await
    }

    pub async fn get_subscription(&self, name: &str) -> Result<Subscription> {
        self.control(Command::GetSubscription, &NameRequest { name: name.to_owned() }).await
    }

    /// Creates a subscription with a push configuration (an empty endpoint: it pulls). A
    /// daemon from before push subscriptions refuses it as an unknown command
    /// (`create_subscription` still creates a pull subscription there).
    pub async fn create_subscription_with_push(
        &self,
        subscription: Subscription,
        push: PushConfig,
    ) -> Result<SubscriptionWithPush> {
        self.control(Command::CreateSubscriptionWithPush, &SubscriptionWithPush { subscription, push }).await
    }

    /// A subscription with its push configuration (an empty endpoint for a pull one).
    pub async fn get_subscription_with_push(&self, name: &str) -> Result<SubscriptionWithPush> {
        self.control(Command::GetSubscriptionWithPush, &NameRequest { name: name.to_owned() }).await
    }

    /// `create_subscription_with_push`, its push requests naming the subscription in
    /// `push_project` (`projects/{push_project}/subscriptions/S`). A daemon from before the
    /// project refuses it as an unknown command (`Unimplemented`); there every push
    /// subscription is named in `PUSH_PROJECT_DEFAULT`.
    pub async fn create_subscription_with_push_project(
        &self,
        subscription: Subscription,
        push: PushConfig,
        push_project: &str,
    ) -> Result<SubscriptionWithPushProject> {
        let request = SubscriptionWithPushProject {
            subscription: SubscriptionWithPush { subscription, push },
            push_project: push_project.to_owned(),
        };
        self.control(Command::CreateSubscriptionWithPushProject, &request).await
    }

    /// A subscription with its push configuration and the project its push requests name it
    /// in (empty for a pull one). A daemon from before the project does not know the command:
    /// its answer to `get_subscription_with_push` comes then, with `PUSH_PROJECT_DEFAULT`, the
    /// one it pushes in.
    pub async fn get_subscription_with_push_project(
        &self,
        name: &str,
    ) -> Result<SubscriptionWithPushProject> {
        let request = NameRequest { name: name.to_owned() };
        match self.control(Command::GetSubscriptionWithPushProject, &request).await {
            Err(error) if error.code() == ErrorCode::Unimplemented => {
                let subscription = self.get_subscription_with_push(name).await?;
                let push_project = match subscription.push.endpoint.is_empty() {
                    true => String::new(),
                    false => ringpost_wire::limits::PUSH_PROJECT_DEFAULT.to_owned(),
                };
                Ok(SubscriptionWithPushProject { subscription, push_project })
            }
            answered => answered,
        }
    }

    /// Changes a subscription's push configuration alone (Pub/Sub's ModifyPushConfig); an
    /// empty endpoint makes it pull.
    pub async fn modify_push_config(&self, name: &str, push: PushConfig) -> Result<()> {
        let request = ModifyPushConfigRequest { subscription: name.to_owned(), push };
        self.control::<_, Empty>(Command::ModifyPushConfig, &request).await.map(|_| ())
    }

    /// `modify_push_config`, its push requests naming the subscription in `push_project`. A
    /// daemon from before the project refuses it as an unknown command (`Unimplemented`).
    pub async fn modify_push_config_with_project(
        &self,
        name: &str,
        push: PushConfig,
        push_project: &str,
    ) -> Result<()> {
        let request = ModifyPushConfigWithProjectRequest {
            request: ModifyPushConfigRequest { subscription: name.to_owned(), push },
            push_project: push_project.to_owned(),
        };
        self.control::<_, Empty>(Command::ModifyPushConfigWithProject, &request).await.map(|_| ())
    }

    pub async fn delete_subscription(&self, name: &str) -> Result<()> {
        self.drop_route(Resource::Subscription, name);
        self.control::<_, Empty>(Command::DeleteSubscription, &NameRequest { name: name.to_owned() })
            .await
            .map(|_| ())
    }

    /// Every subscription (of `topic`, if given), following pages.
    pub async fn list_subscriptions(&self, topic: Option<&str>) -> Result<Vec<Subscription>> {
        let mut subscriptions = Vec::new();
        let mut page_token = String::new();
        loop {
            let request =
                ListRequest { topic: topic.unwrap_or_default().to_owned(), page_size: 1000, page_token };
            let page: SubscriptionList = self.control(Command::ListSubscriptions, &request).await?;
            subscriptions.extend(page.subscriptions);
            if page.next_page_token.is_empty() {
                return Ok(subscriptions);
            }
            page_token = page.next_page_token;
        }
    }

    /// Publishes a batch; resolves, once the batch is durable, with one id per message.
    /// `InvalidArgument` naming the limit, before anything is sent, for a batch the server
    /// would refuse for its size: a message over `MESSAGE_BYTES_MAX` (10 MB), a batch over
    /// `PUBLISH_REQUEST_BYTES_MAX` or `PUBLISH_BATCH_MESSAGES_MAX`, an attribute or ordering key
    /// over its limit.
    ///
    /// On a topic of several sources the batch goes to one source: its ordering key's (the key
    /// map), or, unordered, the active source with the fewest of this client's requests
    /// outstanding (ties in turn). There, a batch mixing ordering keys is sent as one request
    /// per key (unordered messages together), one after another, in the order each key first
    /// appears; its ids come back in the batch's order.
    pub async fn publish(&self, topic: &str, messages: Vec<Message>) -> Result<Vec<u64>> {
        check_publish(&messages)?;
        let key = messages.first().map_or("", |message| message.0.ordering_key.as_str());
        // One source takes every key: the batch goes whole, in one request, as it always did
        // (its messages' offsets in the batch's order).
        if !messages.iter().all(|message| message.0.ordering_key == key)
            && self.source_count(Resource::Topic, topic).await?.1 > 1
        {
            return self.publish_by_key(topic, messages).await;
        }
        let request = PublishRequest {
            topic: topic.to_owned(),
            messages: messages.into_iter().map(|message| message.0).collect(),
        };
        let key = request.messages.first().map_or("", |message| message.ordering_key.as_str());
        let target = if key.is_empty() { Target::Spread } else { Target::Key(key) };
        let response: PublishResponse =
            self.data(Resource::Topic, topic, target, Command::Publish, &request, Duration::ZERO).await?;
        Ok(response.message_ids)
    }

    /// `publish` of a batch mixing ordering keys: one request per key, each to its source.
    async fn publish_by_key(&self, topic: &str, messages: Vec<Message>) -> Result<Vec<u64>> {
        let mut groups: Vec<(String, Vec<usize>, Vec<Message>)> = Vec::new();
        for (index, message) in messages.into_iter().enumerate() {
            match groups.iter_mut().find(|(key, ..)| *key == message.0.ordering_key) {
                Some((_, indices, group)) => {
                    indices.push(index);
                    group.push(message);
                }
                None => groups.push((message.0.ordering_key.clone(), vec![index], vec![message])),
            }
        }
        let mut ids = vec![0; groups.iter().map(|(_, indices, _)| indices.len()).sum()];
        for (_, indices, group) in groups {
            let published = Box::pin(self.publish(topic, group)).await?;
            for (index, id) in indices.into_iter().zip(published) {
                ids[index] = id;
            }
        }
        Ok(ids)
    }

    /// Pulls up to `max_messages`, waiting up to `wait_ms` for the first one. On a topic of
    /// several sources the sources are asked in turn, from one that changes with each call
    /// (so that none starves), until `max_messages` are pulled; only the last one asked waits,
    /// and only when the others had nothing. A source that fails after its retries fails the
    /// pull only if nothing was pulled from the others.
    pub async fn pull(
        &self,
        subscription: &str,
        max_messages: u32,
        wait_ms: u32,
    ) -> Result<Vec<ReceivedMessage>> {
        let (count, _) = self.source_count(Resource::Subscription, subscription).await?;
        if count <= 1 {
            return self.pull_source(subscription, 0, max_messages, wait_ms).await;
        }
        let first = self.spread_turn.fetch_add(1, Ordering::Relaxed) as u32 % count;
        let mut received: Vec<ReceivedMessage> = Vec::new();
        for step in 0..count {
            let source = (first + step) % count;
            let wait = if step + 1 == count && received.is_empty() { wait_ms } else { 0 };
            let wanted = max_messages.saturating_sub(received.len() as u32);
            match self.pull_source(subscription, source, wanted, wait).await {
                Ok(batch) => received.extend(batch),
                Err(error) => {
                    // A retired source deleted meanwhile is gone from the routes looked up
                    // again on its refusal: it had nothing more to give, which is no error.
                    let now = self.source_count(Resource::Subscription, subscription).await;
                    let gone = now.is_ok_and(|(now, _)| source >= now);
                    if received.is_empty() && step + 1 == count && !gone {
                        return Err(error);
                    }
                    continue;
                }
            }
            if received.len() as u32 >= max_messages && max_messages != 0 {
                break;
            }
        }
        Ok(received)
    }

    /// Pulls from source `source` of the subscription's topic alone.
    pub async fn pull_source(
        &self,
        subscription: &str,
        source: u32,
        max_messages: u32,
        wait_ms: u32,
    ) -> Result<Vec<ReceivedMessage>> {
        let request = PullRequest { subscription: subscription.to_owned(), max_messages, wait_ms };
        let wait = Duration::from_millis(wait_ms.into());
        let target = Target::Source(source);
        let response: PullResponse =
            self.data(Resource::Subscription, subscription, target, Command::Pull, &request, wait).await?;
        Ok(response.received_messages)
    }

    /// Acknowledges; resolves once the acknowledgements are durable, with the ack ids refused.
    /// Each ack id goes to the source it names.
    pub async fn acknowledge(&self, subscription: &str, ack_ids: Vec<String>) -> Result<Vec<InvalidAckId>> {
        let request = |ack_ids| AcknowledgeRequest { subscription: subscription.to_owned(), ack_ids };
        self.settle(subscription, Command::Acknowledge, ack_ids, request).await
    }

    /// Sets the deadline of leased messages to `seconds` from now (0 to 600; 0 is a nack).
    /// Each ack id goes to the source it names.
    pub async fn modify_ack_deadline(
        &self,
        subscription: &str,
        ack_ids: Vec<String>,
        seconds: u32,
    ) -> Result<Vec<InvalidAckId>> {
        let request = |ack_ids| ModifyAckDeadlineRequest {
            subscription: subscription.to_owned(),
            ack_ids,
            ack_deadline_seconds: seconds,
        };
        self.settle(subscription, Command::ModifyAckDeadline, ack_ids, request).await
    }

    /// Sends `ack_ids` in one request per source they name (one request when they name one, as
    /// on a topic of one source), and gathers the ids refused.
    async fn settle<Req: Body>(
        &self,
        subscription: &str,
        command: Command,
        ack_ids: Vec<String>,
        request: impl Fn(Vec<String>) -> Req,
    ) -> Result<Vec<InvalidAckId>> {
        // An ack id naming a source the topic does not have goes to source 0, which refuses it
        // saying why, as an ack id of another subscription is refused.
        let (count, _) = self.source_count(Resource::Subscription, subscription).await?;
        let source_of =
            |id: &str| Some(sources::source_of_ack_id(id)).filter(|source| *source < count).unwrap_or(0);
        let first = ack_ids.first().map_or(0, |id| source_of(id));
        let mut groups: Vec<(u32, Vec<String>)> = Vec::with_capacity(1);
        if ack_ids.iter().all(|id| source_of(id) == first) {
            groups.push((first, ack_ids));
        } else {
            for id in ack_ids {
                let source = source_of(&id);
                match groups.iter_mut().find(|(number, _)| *number == source) {
                    Some((_, ids)) => ids.push(id),
                    None => groups.push((source, vec![id])),
                }
            }
        }
        let mut invalid = Vec::new();
        for (source, ids) in groups {
            let target = Target::Source(source);
            let response: AckResponse = self
                .data(Resource::Subscription, subscription, target, command, &request(ids), Duration::ZERO)
                .await?;
            invalid.extend(response.invalid_ack_ids);
        }
        Ok(invalid)
    }

    /// Asks for immediate redelivery.
    pub async fn nack(&self, subscription: &str, ack_ids: Vec<String>) -> Result<Vec<InvalidAckId>> {
        self.modify_ack_deadline(subscription, ack_ids, 0).await
    }

    /// The addresses of the forwarders that serve `topic`'s source 0, in the router's order of
    /// preference, as the router advertises them (the first is where its publishes go).
    pub async fn lookup_topic(&self, topic: &str) -> Result<Vec<String>> {
        Ok(self.route(Resource::Topic, topic, Target::Source(0)).await?.1)
    }

    /// How many publish sources `topic` has, retiring ones included, and how many of them are
    /// active (take publishes), as the client last looked them up (at most
    /// `SOURCES_REFRESH_INTERVAL` ago).
    pub async fn topic_sources(&self, topic: &str) -> Result<(u32, u32)> {
        self.source_count(Resource::Topic, topic).await
    }

    /// `topic_sources` of a subscription's topic.
    pub async fn subscription_sources(&self, subscription: &str) -> Result<(u32, u32)> {
        self.source_count(Resource::Subscription, subscription).await
    }

    /// The pool of `address`, created empty if there is none.
    fn pool(&self, address: &str) -> Arc<Pool> {
        let pool = {
            let mut pools = self.pools.lock().unwrap();
            if let Some(pool) = pools.get(address) {
                return pool.clone();
            }
            let pool = Pool::new(address, self.settings.clone())
                .expect("settings validated by connect_with")
                .with_security(self.security.clone());
            let pool = Arc::new(pool);
            pools.insert(address.to_owned(), pool.clone());
            pool
        };
        self.maintenance.get_or_init(|| start_maintenance(Arc::downgrade(&self.pools), &self.settings));
        pool
    }

    /// Sends a data-plane request to the forwarder that owns `name`: re-looking the route up
    /// after `NotOwner` (`ROUTING_ATTEMPTS_MAX`), retrying with backoff after a connection
    /// failure, `Unavailable` or `ResourceExhausted` (`retry`), and looking the route up again
    /// after a connection failure. A full client-side queue fails at once. The whole, retries
    /// and backoff included, ends with `DeadlineExceeded` after the request timeout (plus
    /// `wait`, the time the server may hold the request by design).
    async fn data<Req: Body, Resp>(
        &self,
        resource: Resource,
        name: &str,
        target: Target<'_>,
        command: Command,
        request: &Req,
        wait: Duration,
    ) -> Result<Resp>
    where
        Resp: Archive,
        Resp::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<Resp, RkyvStrategy<RkyvPool, rancor::Error>>,
    {
        let retry = match command {
            Command::Publish => self.retry_publish,
            _ => self.retry_subscribe,
        };
        let mut backoff = Backoff::new(retry);
        let mut attempts = 0;
        let mut routings = 1;
        let started = Instant::now();
        let timeout = self.request_timeout + wait;
        let deadline = Instant::now() + timeout;
        let exceeded = |last: Option<&Error>| {
            let last =
                last.map(|error| format!(" (last attempt: {}: {error})", error.code())).unwrap_or_default();
            Error::DeadlineExceeded(format!("{command:?} of '{name}' not done within {timeout:?}{last}"))
        };
        let mut last_failure = None;
        loop {
            attempts += 1;
            let Some(outcome) =
                timer::run_until(deadline, self.attempt(resource, name, target, command, request)).await
            else {
                return Err(exceeded(last_failure.as_ref()));
            };
            let error = match outcome {
                Ok(response) => return Ok(response),
                Err(Attempt::Refused(error)) => return Err(error),
                Err(Attempt::Failed(error)) => error,
            };
            match &error {
                Error::Status(status)
                    if status.code == ErrorCode::NotOwner && routings < ROUTING_ATTEMPTS_MAX =>
                {
                    // Not a failure of the attempt: the placement moved.
                    routings += 1;
                    attempts -= 1;
                    self.forget(resource, name);
                    if routings > 2 {
                        // The router still names a forwarder that does not serve it: a
                        // leader is being elected. Looking again at once would not help.
                        let delay = backoff.next_delay();
                        if Instant::now() + delay >= deadline {
                            return Err(exceeded(Some(&error)));
                        }
                        last_failure = Some(error);
                        timer::sleep(delay).await;
                    }
                }
                Error::Status(status) if retry.attempts_max > 1 && status.retry_delay().is_some() => {
                    // The server is smoothing a burst (a topic's publish rate) and says when to
                    // come back: not a failure of the attempt, so it is retried within the
                    // request's deadline whatever the count, after that delay and a jitter of
                    // up to a quarter of it, so that publishers refused together spread out.
                    attempts -= 1;
                    let asked = status.retry_delay().unwrap_or_default();
                    let jitter = retry::random_below(asked.as_nanos() as u64 / 4);
                    let delay = asked + std::time::Duration::from_nanos(jitter);
                    if Instant::now() + delay >= deadline {
                        return Err(exceeded(Some(&error)));
                    }
                    last_failure = Some(error);
                    timer::sleep(delay).await;
                }
                _ if retry::is_retryable(&error)
                    && (attempts < retry.attempts_max || started.elapsed() < retry.retry_for_min) =>
                {
                    // A failed connection was passed over by the attempt.
                    if retry::needs_new_route(&error) && !retry::is_connection_failure(&error) {
                        self.forget(resource, name);
                    }
                    let mut delay = backoff.next_delay();
                    if attempts >= retry.attempts_max {
                        // Past its attempts a request is retried only to the end of
                        // `retry_for_min`: the last attempt no later, so that what fails then
                        // fails with its own error, not the deadline's.
                        delay = delay.min(retry.retry_for_min.saturating_sub(started.elapsed()));
                    }
                    // An attempt that would start after the deadline cannot finish before it.
                    if Instant::now() + delay >= deadline {
                        return Err(exceeded(Some(&error)));
                    }
                    last_failure = Some(error);
                    timer::sleep(delay).await;
                }
                _ => return Err(error),
            }
        }
    }

    async fn attempt<Req: Body, Resp>(
        &self,
        resource: Resource,
        name: &str,
        target: Target<'_>,
        command: Command,
        request: &Req,
    ) -> std::result::Result<Resp, Attempt>
    where
        Resp: Archive,
        Resp::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<Resp, RkyvStrategy<RkyvPool, rancor::Error>>,
    {
        // Held to the end of the attempt, whatever ends it, and so given back then.
        let (source, route, _outstanding) =
            self.route_counted(resource, name, target).await.map_err(Attempt::Failed)?;
        let pool = self.pool(&route[0]);
        let passed_over = |error: Error| {
            if retry::is_connection_failure(&error) {
                self.pass_over(resource, name, source, &route[0]);
            }
            Attempt::Failed(error)
        };
        let lease = match pool.acquire().await {
            Ok(lease) => lease,
            // The only status `acquire` returns: the pool's queue is full.
            Err(error @ Error::Status(_)) => return Err(Attempt::Refused(error)),
            Err(error) => return Err(passed_over(error)),
        };
        let response = lease.connection().call(command.code(), request).await;
        drop(lease);
        response.and_then(decode::<Resp>).map_err(passed_over)
    }
}

/// Refuses a publish the server would refuse for its size or shape before it is encoded, with
/// the model's checks (`InvalidArgument` naming the limit): a message of 20 MB would otherwise
/// only be found past the frame's limit, as it is encoded.
fn check_publish(messages: &[Message]) -> Result<()> {
    use ringpost_wire::limits::{PUBLISH_BATCH_MESSAGES_MAX, PUBLISH_REQUEST_BYTES_MAX};
    if messages.len() > PUBLISH_BATCH_MESSAGES_MAX {
        return Err(Error::Status(Status::invalid_argument(format!(
            "publish request has {} messages; the limit is {PUBLISH_BATCH_MESSAGES_MAX} (PUBLISH_BATCH_MESSAGES_MAX)",
            messages.len()
        ))));
    }
    let mut total = 0usize;
    for (index, Message(message)) in messages.iter().enumerate() {
        total += ringpost_wire::validate::validate_message(
            index,
            &message.data,
            message.attributes.iter().map(|attribute| (attribute.key.as_str(), attribute.value.as_str())),
            &message.ordering_key,
        )
        .map_err(Error::Status)?;
    }
    if total > PUBLISH_REQUEST_BYTES_MAX {
        return Err(Error::Status(Status::invalid_argument(format!(
            "publish request is {total} bytes; the limit is {PUBLISH_REQUEST_BYTES_MAX} (PUBLISH_REQUEST_BYTES_MAX)"
        ))));
    }
    Ok(())
}

/// How one attempt of a data-plane request ended, when it did not succeed.
enum Attempt {
    /// Worth nothing to retry: the client's own queue is full.
    Refused(Error),
    Failed(Error),
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(maintenance) = self.maintenance.get() {
            maintenance.stop.store(true, Ordering::Release);
            if let Some(thread) = &maintenance.thread {
                thread.unpark();
            }
        }
    }
}

/// Connects to the router and checks its protocol version, within `timeout`.
async fn open_router(address: &str, timeout: Duration, security: &Security) -> Result<Arc<Connection>> {
    let deadline = Instant::now() + timeout;
    let (target, security) = (address.to_owned(), security.clone());
    let router = off_thread(move || Connection::connect_with(&target, &security)).await?;
    let hello = HelloRequest {
        protocol_version: ringpost_wire::limits::PROTOCOL_VERSION,
        client_name: "ringpost-client".into(),
    };
    let Some(answer) = timer::run_until(deadline, router.call(Command::Hello.code(), &hello)).await else {
        return Err(Error::DeadlineExceeded(format!(
            "{address} accepted the connection but did not answer within {timeout:?} (is it a Ringpost server?)"
        )));
    };
    let response: HelloResponse = decode(answer?)?;
    if response.protocol_version != ringpost_wire::limits::PROTOCOL_VERSION {
        return Err(Error::Protocol(format!(
            "server speaks protocol {}, this client {}",
            response.protocol_version,
            ringpost_wire::limits::PROTOCOL_VERSION
        )));
    }
    Ok(router)
}

/// Starts the client's maintenance thread. It holds the pools only weakly, and ends when the
/// client is dropped (which unparks it) or the pools are gone. If the thread cannot be started,
/// idle connections are still closed on the next request, but refresh does not happen.
fn start_maintenance(pools: Weak<Pools>, settings: &PoolSettings) -> Maintenance {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let interval = settings.maintenance_interval();
    let thread = std::thread::Builder::new()
        .name("ringpost-pool".into())
        .spawn(move || maintain_pools(pools, stopped, interval))
        .ok()
        .map(|handle| handle.thread().clone());
    Maintenance { thread, stop }
}

fn maintain_pools(pools: Weak<Pools>, stop: Arc<AtomicBool>, interval: Duration) {
    loop {
        std::thread::park_timeout(interval);
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Some(pools) = pools.upgrade() else { return };
        // Pools are kept once created, empty ones too, so their counters last as long as the
        // client; there is one per forwarder address the client ever used.
        let snapshot: Vec<Arc<Pool>> = pools.lock().unwrap().values().cloned().collect();
        drop(pools);
        for pool in &snapshot {
            if stop.load(Ordering::Acquire) {
                return;
            }
            pool.maintain();
        }
    }
}

/// Runs blocking work (connecting) on a short-lived thread and awaits it without blocking the
/// caller's executor.
pub(crate) async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    type Shared<T> = Arc<Mutex<(Option<Result<T>>, Option<Waker>)>>;
    let slot: Shared<T> = Arc::default();
    let shared = slot.clone();
    std::thread::Builder::new()
        .name("ringpost-connect".into())
        .spawn(move || {
            let result = work();
            let waker = {
                let mut slot = shared.lock().unwrap();
                slot.0 = Some(result);
                slot.1.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        })
        .map_err(Error::Io)?;
    std::future::poll_fn(move |context| {
        let mut slot = slot.lock().unwrap();
        match slot.0.take() {
            Some(result) => Poll::Ready(result),
            None => {
                slot.1 = Some(context.waker().clone());
                Poll::Pending
            }
        }
    })
    .await
}

/// Runs a future to completion on the current thread: for programs without an async runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles only if the data-plane futures can move between threads, as multi-threaded
    /// executors require.
    #[allow(dead_code)]
    fn futures_are_send(client: &Client) {
        fn send<T: Send>(_: T) {}
        send(client.publish("topic", Vec::new()));
        send(client.pull("subscription", 1, 0));
        send(client.acknowledge("subscription", Vec::new()));
        send(client.create_topic("topic"));
    }

    /// What the fake daemon does with the next publish.
    #[derive(Clone, Copy)]
    enum Next {
        Refuse(ErrorCode),
        /// Closes the connection without an answer.
        Drop,
        /// Reads the request and never answers it.
        Ignore,
    }

    #[derive(Default)]
    struct Seen {
        hellos: usize,
        lookups: usize,
        publishes: usize,
        script: std::collections::VecDeque<Next>,
        streams: Vec<std::net::TcpStream>,
        /// Every request's command, per connection, in the order they came.
        commands: Vec<Vec<Command>>,
        /// The token of each Authenticate.
        tokens: Vec<String>,
        /// Connections whose TLS handshake verified a client certificate.
        client_certificates: usize,
    }

    /// The token the fake daemon takes; any other is refused, as the daemon does: an
    /// `Unauthenticated` answer, then a connection error (request 0), then the close.
    const GOOD_TOKEN: &str = "rpt_good";

    /// A daemon in miniature: router and forwarder on one port, answering Hello, GetTopic,
    /// LookupTopic and Publish, and failing publishes as scripted.
    struct FakeDaemon {
        address: String,
        seen: Arc<Mutex<Seen>>,
    }

    impl FakeDaemon {
        fn start(script: &[Next]) -> FakeDaemon {
            FakeDaemon::start_with(script, None)
        }

        /// With `tls`, every connection is served over TLS with that configuration.
        fn start_with(script: &[Next], tls: Option<Arc<rustls::ServerConfig>>) -> FakeDaemon {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let seen =
                Arc::new(Mutex::new(Seen { script: script.iter().copied().collect(), ..Seen::default() }));
            let (shared, own_address) = (seen.clone(), address.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { return };
                    shared.lock().unwrap().streams.push(stream.try_clone().unwrap());
                    let (shared, own_address, tls) = (shared.clone(), own_address.clone(), tls.clone());
                    std::thread::spawn(move || {
                        let control = stream.try_clone().unwrap();
                        match tls {
                            None => serve_fake(stream, control, shared, own_address),
                            Some(config) => {
                                let mut tls = rustls::ServerConnection::new(config).unwrap();
                                let mut socket = stream;
                                while tls.is_handshaking() {
                                    if tls.complete_io(&mut socket).is_err() {
                                        let _ = control.shutdown(std::net::Shutdown::Both);
                                        return;
                                    }
                                }
                                if tls.peer_certificates().is_some() {
                                    shared.lock().unwrap().client_certificates += 1;
                                }
                                let stream = rustls::StreamOwned::new(tls, socket);
                                serve_fake(stream, control, shared, own_address);
                            }
                        }
                    });
                }
            });
            FakeDaemon { address, seen }
        }

        fn seen<T>(&self, read: impl FnOnce(&Seen) -> T) -> T {
            read(&self.seen.lock().unwrap())
        }
    }

    fn serve_fake(
        mut stream: impl std::io::Read + std::io::Write,
        control: std::net::TcpStream,
        seen: Arc<Mutex<Seen>>,
        own_address: String,
    ) {
        use ringpost_wire::frame::{encode_error, encode_frame, FrameHeader, FLAG_RESPONSE};
        let connection = {
            let mut seen = seen.lock().unwrap();
            seen.commands.push(Vec::new());
            seen.commands.len() - 1
        };
        loop {
            let mut header = [0u8; ringpost_wire::limits::FRAME_HEADER_BYTES];
            if stream.read_exact(&mut header).is_err() {
                return;
            }
            let header = FrameHeader::decode(&header).unwrap();
            let mut body = vec![0u8; header.body_length as usize];
            if stream.read_exact(&mut body).is_err() {
                return;
            }
            let (command, id) = (header.command, header.request_id);
            seen.lock().unwrap().commands[connection].push(Command::from_u16(command).unwrap());
            let reply = match Command::from_u16(command).unwrap() {
                Command::Authenticate => {
                    let request: AuthenticateRequest = decode_body(&body).unwrap();
                    seen.lock().unwrap().tokens.push(request.token.clone());
                    if request.token == GOOD_TOKEN {
                        let answer = AuthenticateResponse { principal: "alice".into() };
                        encode_frame(command, FLAG_RESPONSE, id, &answer)
                    } else {
                        let status = Status::new(ErrorCode::Unauthenticated, "the token is not known");
                        let mut refusal = encode_error(command, id, &status);
                        refusal.extend_from_slice(&encode_error(0, 0, &status));
                        let _ = stream.write_all(&refusal);
                        let _ = stream.flush();
                        let _ = control.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                }
                Command::Hello => {
                    seen.lock().unwrap().hellos += 1;
                    let hello = HelloResponse {
                        protocol_version: ringpost_wire::limits::PROTOCOL_VERSION,
                        ..Default::default()
                    };
                    encode_frame(command, FLAG_RESPONSE, id, &hello)
                }
                Command::GetTopic => encode_frame(command, FLAG_RESPONSE, id, &Topic::default()),
                // As a daemon from before topics had several sources answers them.
                Command::GetTopicWithSources | Command::LookupSources => encode_error(
                    command,
                    id,
                    &Status::new(ErrorCode::Unimplemented, format!("unknown command {command}")),
                ),
                Command::LookupTopic => {
                    seen.lock().unwrap().lookups += 1;
                    let forwarder = ShardAddress { shard: 0, address: own_address.clone() };
                    encode_frame(command, FLAG_RESPONSE, id, &LookupResponse { forwarders: vec![forwarder] })
                }
                Command::Publish => {
                    let next = {
                        let mut seen = seen.lock().unwrap();
                        seen.publishes += 1;
                        seen.script.pop_front()
                    };
                    match next {
                        None => encode_frame(
                            command,
                            FLAG_RESPONSE,
                            id,
                            &PublishResponse { message_ids: vec![7] },
                        ),
                        Some(Next::Refuse(code)) => encode_error(command, id, &Status::new(code, "scripted")),
                        Some(Next::Drop) => {
                            let _ = control.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        Some(Next::Ignore) => continue,
                    }
                }
                other => panic!("the fake daemon does not serve {other:?}"),
            };
            if stream.write_all(&reply).is_err() || stream.flush().is_err() {
                return;
            }
        }
    }

    /// Pub/Sub's shape with millisecond delays, so the tests do not wait for real backoff.
    const FAST: RetrySettings = RetrySettings {
        delay_initial: Duration::from_millis(1),
        delay_multiplier: 2.0,
        delay_max: Duration::from_millis(10),
        attempts_max: retry::RETRY_ATTEMPTS_MAX,
        retry_for_min: Duration::ZERO,
    };

    fn client(daemon: &FakeDaemon) -> Client {
        block_on(Client::connect(&daemon.address)).unwrap().with_retry(FAST, FAST)
    }

    fn publish(client: &Client) -> Result<Vec<u64>> {
        block_on(client.publish("topic", vec![Message::new("m")]))
    }

    /// A message over Pub/Sub's 10 MB, and one over the frame's 16 MiB, are refused by name
    /// before anything is sent (the second used to panic as it was encoded); so is a request
    /// whose messages fit one by one but not together. The connection serves on.
    #[test]
    fn an_oversized_publish_is_refused_before_it_is_sent() {
        use ringpost_wire::limits::{MESSAGE_BYTES_MAX, PUBLISH_REQUEST_BYTES_MAX};
        let daemon = FakeDaemon::start(&[]);
        let client = client(&daemon);
        for bytes in [MESSAGE_BYTES_MAX + 1, 20_000_000] {
            let error = block_on(client.publish("topic", vec![Message::new(vec![0u8; bytes])])).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
            assert!(error.to_string().contains("MESSAGE_BYTES_MAX"), "{error}");
        }
        let halves = vec![Message::new(vec![0u8; PUBLISH_REQUEST_BYTES_MAX / 2 + 1]); 2];
        let error = block_on(client.publish("topic", halves)).unwrap_err();
        assert!(error.to_string().contains("PUBLISH_REQUEST_BYTES_MAX"), "{error}");
        assert_eq!(daemon.seen(|seen| seen.publishes), 0, "nothing was sent");
        assert_eq!(publish(&client).unwrap(), vec![7]);
        // Below the client's checks, a connection refuses a frame past its limit by name.
        let connection = Connection::connect(&daemon.address).unwrap();
        let request = PublishRequest {
            topic: "topic".into(),
            messages: vec![PubsubMessage { data: vec![0u8; 20_000_000], ..Default::default() }],
        };
        let Err(error) = block_on(connection.call(Command::Publish.code(), &request)) else {
            panic!("a frame past its limit was sent");
        };
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
        assert!(error.to_string().contains("FRAME_BODY_BYTES_MAX"), "{error}");
    }

    #[test]
    fn unavailable_and_resource_exhausted_are_retried() {
        let daemon = FakeDaemon::start(&[
            Next::Refuse(ErrorCode::Unavailable),
            Next::Refuse(ErrorCode::ResourceExhausted),
        ]);
        assert_eq!(publish(&client(&daemon)).unwrap(), vec![7]);
        // `Unavailable` may be a replicated topic's deposed leader: the route is looked up
        // again; `ResourceExhausted` is the same forwarder's backpressure.
        assert_eq!(daemon.seen(|seen| (seen.publishes, seen.lookups)), (3, 2));
    }

    #[test]
    fn a_dropped_connection_is_retried_after_a_new_lookup() {
        let daemon = FakeDaemon::start(&[Next::Drop]);
        let client = client(&daemon);
        assert_eq!(publish(&client).unwrap(), vec![7]);
        assert_eq!(daemon.seen(|seen| (seen.publishes, seen.lookups)), (2, 2));
        assert_eq!(client.pool_counters().opened, 2);
    }

    #[test]
    fn retries_end_after_five_attempts() {
        let daemon = FakeDaemon::start(&[Next::Refuse(ErrorCode::Unavailable); 6]);
        let error = publish(&client(&daemon)).unwrap_err();
        assert_eq!(error.code(), ErrorCode::Unavailable);
        assert_eq!(daemon.seen(|seen| seen.publishes), 5);
    }

    #[test]
    fn retries_go_on_past_five_attempts_for_as_long_as_a_failover_may_take() {
        let daemon = FakeDaemon::start(&[Next::Refuse(ErrorCode::Unavailable); 20]);
        let lasting = RetrySettings { retry_for_min: Duration::from_secs(30), ..FAST };
        let client = client(&daemon).with_retry(lasting, lasting);
        assert_eq!(publish(&client).unwrap(), vec![7]);
        assert_eq!(daemon.seen(|seen| seen.publishes), 21);
    }

    #[test]
    fn past_its_attempts_a_request_fails_with_its_own_error_when_the_time_is_up() {
        let daemon = FakeDaemon::start(&[Next::Refuse(ErrorCode::Unavailable); 1000]);
        let lasting = RetrySettings { retry_for_min: Duration::from_millis(300), ..FAST };
        let client = client(&daemon).with_retry(lasting, lasting);
        let started = std::time::Instant::now();
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::Unavailable);
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(daemon.seen(|seen| seen.publishes) > retry::RETRY_ATTEMPTS_MAX);
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let daemon =
            FakeDaemon::start(&[Next::Refuse(ErrorCode::NotFound), Next::Refuse(ErrorCode::InvalidArgument)]);
        let client = client(&daemon);
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::NotFound);
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::InvalidArgument);
        assert_eq!(daemon.seen(|seen| seen.publishes), 2);
    }

    /// Every way a publish ends gives its count of outstanding requests back to its source:
    /// answered, refused for good, refused until the retries run out, its connection dropped,
    /// its deadline passed. Counted while it waits: one request the daemon ignores shows as
    /// one outstanding. Without the count given back, a failed request would leave its source
    /// looking busy for good, and unordered publishes would pass it over.
    #[test]
    fn a_failed_request_gives_its_count_of_outstanding_back() {
        let daemon = FakeDaemon::start(&[
            Next::Refuse(ErrorCode::InvalidArgument),
            Next::Refuse(ErrorCode::Unavailable),
            Next::Refuse(ErrorCode::Unavailable),
            Next::Refuse(ErrorCode::Unavailable),
            Next::Refuse(ErrorCode::Unavailable),
            Next::Refuse(ErrorCode::Unavailable),
            Next::Ignore,
            Next::Drop,
        ]);
        let client = Arc::new(client(&daemon).with_request_timeout(Duration::from_secs(2)));
        let outstanding = || client.outstanding(Resource::Topic, "topic");
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::InvalidArgument);
        assert_eq!(outstanding(), [0]);
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::Unavailable);
        assert_eq!(outstanding(), [0]);
        let waiting = std::thread::spawn({
            let client = client.clone();
            move || publish(&client)
        });
        let started = Instant::now();
        while outstanding() != [1] {
            assert!(started.elapsed() < Duration::from_secs(2), "never counted: {:?}", outstanding());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(waiting.join().unwrap().unwrap_err().code(), ErrorCode::DeadlineExceeded);
        assert_eq!(outstanding(), [0]);
        assert_eq!(publish(&client).unwrap(), vec![7], "after a dropped connection, a retry");
        assert_eq!(outstanding(), [0]);
        assert_eq!(daemon.seen(|seen| seen.publishes), 9);
    }

    #[test]
    fn retries_can_be_turned_off() {
        let daemon = FakeDaemon::start(&[Next::Refuse(ErrorCode::Unavailable)]);
        let client = client(&daemon).with_retry(RetrySettings::NONE, RetrySettings::NONE);
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::Unavailable);
        assert_eq!(daemon.seen(|seen| seen.publishes), 1);
    }

    #[test]
    fn not_owner_looks_the_route_up_again() {
        let daemon =
            FakeDaemon::start(&[Next::Refuse(ErrorCode::NotOwner), Next::Refuse(ErrorCode::NotOwner)]);
        assert_eq!(publish(&client(&daemon)).unwrap(), vec![7]);
        assert_eq!(daemon.seen(|seen| (seen.publishes, seen.lookups)), (3, 3));
    }

    #[test]
    fn the_router_connection_is_reopened_after_the_server_closed_it() {
        let daemon = FakeDaemon::start(&[]);
        let client = client(&daemon);
        block_on(client.get_topic("topic")).unwrap();
        for stream in daemon.seen.lock().unwrap().streams.drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !client.router.lock().unwrap().is_closed() {
            assert!(std::time::Instant::now() < deadline, "the client never saw the close");
            std::thread::sleep(Duration::from_millis(2));
        }
        block_on(client.get_topic("topic")).unwrap();
        assert_eq!(daemon.seen(|seen| seen.hellos), 2);
    }

    /// A listener that accepts connections, reads what comes, and answers `answer` (nothing if
    /// empty) without ever closing; the accepted sockets live as long as the listener thread.
    fn foreign_server(answer: &'static [u8]) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                use std::io::{Read, Write};
                let mut request = [0u8; 64];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(answer);
                open.push(stream);
            }
        });
        address
    }

    #[test]
    fn a_port_that_never_answers_fails_with_deadline_exceeded() {
        let address = foreign_server(b"");
        let connecting =
            Client::connect_with_timeout(&address, PoolSettings::default(), Duration::from_millis(200));
        let error = block_on(connecting).err().expect("no Ringpost server there");
        assert_eq!(error.code(), ErrorCode::DeadlineExceeded, "{error}");
        assert!(error.to_string().contains("did not answer"), "{error}");
    }

    #[test]
    fn a_server_of_another_protocol_is_named_as_such() {
        let address = foreign_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        let error = block_on(Client::connect(&address)).err().expect("an HTTP server is not Ringpost");
        assert_eq!(
            error.to_string(),
            format!("protocol error: {address} is not a Ringpost server (it answered \"HTTP/1.1 400 Bad Request\")")
        );
        // Fewer bytes than a frame header, then the connection closes.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let short = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut stream, _) = listener.accept().unwrap();
            // The answer follows the client's Hello, as a real server's would.
            let _ = stream.read(&mut [0u8; 64]);
            stream.write_all(b"hi\x01\n").unwrap();
        });
        let error = block_on(Client::connect(&short)).err().expect("a short answer is not Ringpost");
        assert!(error.to_string().ends_with("is not a Ringpost server (it answered \"hi\\x01\")"), "{error}");
    }

    /// An HTTP/2 server (a gRPC port) sends its SETTINGS first and closes the connection on a
    /// client without its preface, which may be before the client's Hello is even queued: the
    /// error says what answered, not "connection closed".
    #[test]
    fn an_http2_server_is_named_as_such_even_when_it_closes_first() {
        let settings: &[u8] = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64";
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                use std::io::Write;
                let _ = stream.write_all(settings);
                // Closed at once, the client's request unread.
            }
        });
        for _ in 0..20 {
            let error = block_on(Client::connect(&address)).err().expect("HTTP/2 is not Ringpost");
            let text = error.to_string();
            assert!(text.contains("is not a Ringpost server") && text.contains("HTTP/2"), "{text}");
            assert_eq!(error.code(), ErrorCode::ProtocolError);
        }
    }

    #[test]
    fn an_unanswered_request_fails_with_deadline_exceeded_and_is_forgotten() {
        let daemon = FakeDaemon::start(&[Next::Ignore, Next::Ignore]);
        let client = client(&daemon).with_request_timeout(Duration::from_millis(200));
        let error = publish(&client).unwrap_err();
        assert_eq!(error.code(), ErrorCode::DeadlineExceeded, "{error}");
        let connections = client.pool_stats();
        assert_eq!(connections.len(), 1);
        assert_eq!(
            connections[0].in_flight, 0,
            "the forgotten request left the pending map: {connections:?}"
        );
        assert_eq!(daemon.seen(|seen| seen.publishes), 1, "a deadline is not retried");
        // The connection still serves: the next request is answered (the second Ignore first).
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::DeadlineExceeded);
        assert_eq!(publish(&client).unwrap(), vec![7]);
    }

    #[test]
    fn retries_stop_at_the_deadline() {
        // Backoff far longer than the deadline: the retry would start after it, so the request
        // ends with the deadline and names the last failure.
        let slow = RetrySettings {
            delay_initial: Duration::from_secs(600),
            delay_max: Duration::from_secs(600),
            ..FAST
        };
        let daemon = FakeDaemon::start(&[Next::Refuse(ErrorCode::Unavailable); 6]);
        let client = client(&daemon).with_retry(slow, slow).with_request_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let error = publish(&client).unwrap_err();
        assert_eq!(error.code(), ErrorCode::DeadlineExceeded, "{error}");
        assert!(error.to_string().contains("last attempt: Unavailable"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(600), "no backoff sleep beyond the deadline");
    }

    #[test]
    fn settings_are_checked_before_connecting() {
        let settings = PoolSettings { connections_per_forwarder: 0, ..PoolSettings::default() };
        // Nothing listens on port 1: an invalid setting must be reported before the connect.
        let error = block_on(Client::connect_with("127.0.0.1:1", settings)).err().unwrap();
        assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
    }

    /// `PermissionDenied` and `Unauthenticated` reach the caller with their codes, at once:
    /// another attempt would be refused again.
    #[test]
    fn permission_denied_and_unauthenticated_are_not_retried() {
        let daemon = FakeDaemon::start(&[
            Next::Refuse(ErrorCode::PermissionDenied),
            Next::Refuse(ErrorCode::Unauthenticated),
        ]);
        let client = client(&daemon);
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::PermissionDenied);
        assert_eq!(publish(&client).unwrap_err().code(), ErrorCode::Unauthenticated);
        assert_eq!(daemon.seen(|seen| seen.publishes), 2);
    }

    fn connect_as(daemon: &FakeDaemon, security: Security) -> Result<Client> {
        let connecting = Client::connect_with_security(
            &daemon.address,
            PoolSettings::default(),
            Duration::from_secs(10),
            security,
        );
        block_on(connecting).map(|client| client.with_retry(FAST, FAST))
    }

    /// With a token, every connection the client opens (the router's, the forwarder pool's)
    /// sends an Authenticate first, and the requests after it do not wait for its answer.
    #[test]
    fn the_authenticate_frame_goes_first_on_every_connection() {
        let daemon = FakeDaemon::start(&[]);
        let client = connect_as(&daemon, Security::default().with_token(GOOD_TOKEN.into())).unwrap();
        assert_eq!(publish(&client).unwrap(), vec![7]);
        let (commands, tokens) = daemon.seen(|seen| (seen.commands.clone(), seen.tokens.clone()));
        assert_eq!(commands.len(), 2, "the router's connection and one forwarder connection");
        assert_eq!(
            commands[0],
            [Command::Authenticate, Command::Hello, Command::LookupSources, Command::LookupTopic]
        );
        assert_eq!(commands[1], [Command::Authenticate, Command::Publish]);
        assert_eq!(tokens, [GOOD_TOKEN, GOOD_TOKEN]);
        // Without a token, nothing but the requests.
        let plain = client_of(&daemon);
        block_on(plain.get_topic("topic")).unwrap();
        assert_eq!(daemon.seen(|seen| seen.commands[2].clone()), [Command::Hello, Command::GetTopic]);
    }

    /// A daemon from before topics had several sources refuses GetTopicWithSources as an
    /// unknown command: the client asks GetTopic then, and its topic has one source (none
    /// listed).
    #[test]
    fn a_topics_sources_from_a_daemon_before_them_are_its_topic_alone() {
        let daemon = FakeDaemon::start(&[]);
        let client = client_of(&daemon);
        let shown = block_on(client.get_topic_with_sources("topic")).unwrap();
        assert_eq!(shown, TopicWithSources { topic: Topic::default(), ..Default::default() });
        assert_eq!(
            daemon.seen(|seen| seen.commands[0].clone()),
            [Command::Hello, Command::GetTopicWithSources, Command::GetTopic]
        );
    }

    /// A daemon from before topics had several sources refuses LookupSources as an unknown
    /// command: the client looks the topic up as before (one source, the plain lookup's list)
    /// and asks only that from then on, a new lookup after `NotOwner` included.
    #[test]
    fn the_sources_of_a_daemon_before_them_are_its_plain_lookup() {
        let daemon = FakeDaemon::start(&[Next::Refuse(ErrorCode::NotOwner)]);
        let client = client_of(&daemon);
        assert_eq!(publish(&client).unwrap(), vec![7]);
        assert_eq!(block_on(client.topic_sources("topic")).unwrap(), (1, 1));
        assert_eq!(
            daemon.seen(|seen| seen.commands[0].clone()),
            [Command::Hello, Command::LookupSources, Command::LookupTopic, Command::LookupTopic]
        );
        assert_eq!(daemon.seen(|seen| seen.publishes), 2);
    }

    fn client_of(daemon: &FakeDaemon) -> Client {
        client(daemon)
    }

    /// A refused token fails what was pipelined behind it with `Unauthenticated` and the
    /// server's reason, not with a bare "connection closed".
    #[test]
    fn a_refused_token_fails_the_requests_with_unauthenticated() {
        let daemon = FakeDaemon::start(&[]);
        let error = connect_as(&daemon, Security::default().with_token("rpt_wrong".into())).err().unwrap();
        assert_eq!(error.code(), ErrorCode::Unauthenticated, "{error}");
        assert!(error.to_string().contains("the token is not known"), "{error}");
    }

    /// A CA and certificates made for a test, written as PEM files in a directory of its own.
    struct TestPki {
        directory: std::path::PathBuf,
        ca: rcgen::Certificate,
        ca_key: rcgen::KeyPair,
    }

    impl TestPki {
        fn new(name: &str) -> TestPki {
            use std::sync::atomic::AtomicUsize;
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let directory = std::env::temp_dir().join(format!(
                "ringpost-client-pki-{}-{}-{name}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&directory).unwrap();
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} test CA"));
            let ca = params.self_signed(&ca_key).unwrap();
            std::fs::write(directory.join("ca.pem"), ca.pem()).unwrap();
            TestPki { directory, ca, ca_key }
        }

        fn ca_file(&self) -> std::path::PathBuf {
            self.directory.join("ca.pem")
        }

        /// A certificate for `names`, signed by the CA: its chain and key, and their files.
        fn issue(
            &self,
            file: &str,
            names: &[&str],
        ) -> (Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>)
        {
            let key = rcgen::KeyPair::generate().unwrap();
            let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
            let certificate = rcgen::CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &self.ca, &self.ca_key)
                .unwrap();
            std::fs::write(self.directory.join(format!("{file}.pem")), certificate.pem()).unwrap();
            std::fs::write(self.directory.join(format!("{file}.key")), key.serialize_pem()).unwrap();
            let der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
            (vec![certificate.der().clone()], der.into())
        }

        /// A server configuration for 127.0.0.1, asking for client certificates of this CA if
        /// `client_certificates`.
        fn server(&self, client_certificates: bool) -> Arc<rustls::ServerConfig> {
            let (chain, key) = self.issue("server", &["127.0.0.1", "ringpost.test"]);
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap();
            let builder = if client_certificates {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(self.ca.der().clone()).unwrap();
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated()
                        .build()
                        .unwrap();
                builder.with_client_cert_verifier(verifier)
            } else {
                builder.with_no_client_auth()
            };
            Arc::new(builder.with_single_cert(chain, key).unwrap())
        }
    }

    impl Drop for TestPki {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
    }

    /// Over TLS, the router's connection and the forwarder pool's both work, with a token
    /// first, for frames small and large (a large one is encrypted in many records).
    #[test]
    fn requests_go_over_tls_with_a_token() {
        let pki = TestPki::new("tls");
        let daemon = FakeDaemon::start_with(&[], Some(pki.server(false)));
        let security =
            Security::default().with_ca_file(&pki.ca_file()).unwrap().with_token(GOOD_TOKEN.into());
        assert!(security.is_tls());
        let client = connect_as(&daemon, security).unwrap();
        block_on(client.get_topic("topic")).unwrap();
        assert_eq!(publish(&client).unwrap(), vec![7]);
        let large = vec![Message::new(vec![5u8; 3 << 20])];
        assert_eq!(block_on(client.publish("topic", large)).unwrap(), vec![7]);
        let commands = daemon.seen(|seen| seen.commands.clone());
        assert!(commands.iter().all(|connection| connection[0] == Command::Authenticate), "{commands:?}");
        let publishes = commands.iter().flatten().filter(|&&command| command == Command::Publish).count();
        assert_eq!(publishes, 2, "{commands:?}");
        // A name the certificate holds, given instead of the address's host.
        let named = Security::default()
            .with_ca_file(&pki.ca_file())
            .unwrap()
            .with_server_name("ringpost.test".into());
        block_on(connect_as(&daemon, named).unwrap().get_topic("topic")).unwrap();
    }

    /// A server whose certificate another CA signed, or that holds another name, fails the
    /// handshake with an error that says so, and is not retried.
    #[test]
    fn a_certificate_of_another_ca_or_name_fails_the_handshake() {
        let pki = TestPki::new("server");
        let other = TestPki::new("other");
        let daemon = FakeDaemon::start_with(&[], Some(pki.server(false)));
        let error =
            connect_as(&daemon, Security::default().with_ca_file(&other.ca_file()).unwrap()).err().unwrap();
        assert!(matches!(error, Error::Tls(_)), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("TLS handshake with") && text.contains("UnknownIssuer"), "{text}");
        let renamed = Security::default()
            .with_ca_file(&pki.ca_file())
            .unwrap()
            .with_server_name("elsewhere.test".into());
        let error = connect_as(&daemon, renamed).err().unwrap();
        assert!(error.to_string().contains("not valid for name"), "{error}");
        assert!(!retry::is_retryable(&error));
        // Plaintext to a TLS port is no Ringpost answer either.
        let error = block_on(Client::connect(&daemon.address)).err().unwrap();
        assert!(error.to_string().contains("TLS"), "{error}");
    }

    /// With a client certificate, the server's handshake verifies it (mTLS).
    #[test]
    fn a_client_certificate_is_presented() {
        let pki = TestPki::new("mtls");
        let daemon = FakeDaemon::start_with(&[], Some(pki.server(true)));
        pki.issue("client", &["alice.test"]);
        let (cert, key) = (pki.directory.join("client.pem"), pki.directory.join("client.key"));
        let security = Security::default()
            .with_ca_file(&pki.ca_file())
            .unwrap()
            .with_client_certificate(&cert, &key)
            .unwrap();
        block_on(connect_as(&daemon, security).unwrap().get_topic("topic")).unwrap();
        assert_eq!(daemon.seen(|seen| seen.client_certificates), 1);
        // Without one, the handshake still succeeds (the server allows it), and none is seen.
        let anonymous = Security::default().with_ca_file(&pki.ca_file()).unwrap();
        block_on(connect_as(&daemon, anonymous).unwrap().get_topic("topic")).unwrap();
        assert_eq!(daemon.seen(|seen| seen.client_certificates), 1);
        let missing = Security::default().with_ca_file(&pki.directory.join("absent.pem")).err().unwrap();
        assert!(missing.to_string().contains("absent.pem"), "{missing}");
    }
}
