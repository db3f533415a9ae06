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

mod admin;
pub mod connection;

pub use connection::Connection;
pub use ringpost_wire::messages::{
    Attribute, DirectoryStatus, InvalidAckId, PubsubMessage, ReceivedMessage, ResyncDirectoryResponse,
    ShardStats, Snapshot, StatsResponse, Subscription, SubscriptionStats, Topic, TopicStats,
};
pub use ringpost_wire::{ErrorCode, Status};

use connection::Response;
use ringpost_wire::frame::{access_body, decode_error, Body};
use ringpost_wire::messages::*;
use ringpost_wire::Command;
use rkyv::api::high::HighValidator;
use rkyv::bytecheck::CheckBytes;
use rkyv::de::Pool;
use rkyv::rancor::{self, Strategy};
use rkyv::{Archive, Deserialize};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

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
}

impl Error {
    /// The error code, for errors the server returned; `Unavailable` for connection failures.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Status(status) => status.code,
            Error::Connect { .. } | Error::Io(_) | Error::Closed(_) => ErrorCode::Unavailable,
            Error::Protocol(_) => ErrorCode::ProtocolError,
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

fn decode<T>(response: Response) -> Result<T>
where
    T: Archive,
    T::Archived:
        for<'a> CheckBytes<HighValidator<'a, rancor::Error>> + Deserialize<T, Strategy<Pool, rancor::Error>>,
{
    if response.header.is_error() {
        return Err(Error::Status(decode_error(&response.body)));
    }
    let archived = access_body::<T>(&response.body).map_err(|status| Error::Protocol(status.message))?;
    rkyv::deserialize::<T, rancor::Error>(archived).map_err(|error| Error::Protocol(error.to_string()))
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Resource {
    Topic,
    Subscription,
}

/// A connection to a Ringpost daemon: the router plus the forwarders it points to.
pub struct Client {
    router: Arc<Connection>,
    router_address: String,
    forwarders: Mutex<HashMap<String, Arc<Connection>>>,
    routes: Mutex<HashMap<(Resource, String), Vec<String>>>,
}

/// How often a data-plane request is retried after `NotOwner` or a dropped connection.
const ROUTING_ATTEMPTS_MAX: usize = 3;

impl Client {
    /// Connects to the router at `address` (host:port).
    pub async fn connect(address: &str) -> Result<Client> {
        let target = address.to_owned();
        let router = off_thread(move || Connection::connect(&target)).await?;
        let hello = HelloRequest {
            protocol_version: ringpost_wire::limits::PROTOCOL_VERSION,
            client_name: "ringpost-client".into(),
        };
        let response: HelloResponse = decode(router.call(Command::Hello.code(), &hello).await?)?;
        if response.protocol_version != ringpost_wire::limits::PROTOCOL_VERSION {
            return Err(Error::Protocol(format!(
                "server speaks protocol {}, this client {}",
                response.protocol_version,
                ringpost_wire::limits::PROTOCOL_VERSION
            )));
        }
        Ok(Client {
            router,
            router_address: address.to_owned(),
            forwarders: Mutex::default(),
            routes: Mutex::default(),
        })
    }

    pub fn router_address(&self) -> &str {
        &self.router_address
    }

    async fn control<Req: Body, Resp>(&self, command: Command, request: &Req) -> Result<Resp>
    where
        Resp: Archive,
        Resp::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<Resp, Strategy<Pool, rancor::Error>>,
    {
        decode(self.router.call(command.code(), request).await?)
    }

    pub async fn create_topic(&self, name: &str) -> Result<Topic> {
        self.create_topic_with(Topic { name: name.to_owned(), ..Default::default() }).await
    }

    pub async fn create_topic_with(&self, topic: Topic) -> Result<Topic> {
        self.control(Command::CreateTopic, &topic).await
    }

    pub async fn get_topic(&self, name: &str) -> Result<Topic> {
        self.control(Command::GetTopic, &NameRequest { name: name.to_owned() }).await
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        self.forget(Resource::Topic, name);
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

    pub async fn delete_subscription(&self, name: &str) -> Result<()> {
        self.forget(Resource::Subscription, name);
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
    pub async fn publish(&self, topic: &str, messages: Vec<Message>) -> Result<Vec<u64>> {
        let request = PublishRequest {
            topic: topic.to_owned(),
            messages: messages.into_iter().map(|message| message.0).collect(),
        };
        let response: PublishResponse = self.data(Resource::Topic, topic, Command::Publish, &request).await?;
        Ok(response.message_ids)
    }

    /// Pulls up to `max_messages`, waiting up to `wait_ms` for the first one.
    pub async fn pull(
        &self,
        subscription: &str,
        max_messages: u32,
        wait_ms: u32,
    ) -> Result<Vec<ReceivedMessage>> {
        let request = PullRequest { subscription: subscription.to_owned(), max_messages, wait_ms };
        let response: PullResponse =
            self.data(Resource::Subscription, subscription, Command::Pull, &request).await?;
        Ok(response.received_messages)
    }

    /// Acknowledges; resolves once the acknowledgements are durable, with the ack ids refused.
    pub async fn acknowledge(&self, subscription: &str, ack_ids: Vec<String>) -> Result<Vec<InvalidAckId>> {
        let request = AcknowledgeRequest { subscription: subscription.to_owned(), ack_ids };
        let response: AckResponse =
            self.data(Resource::Subscription, subscription, Command::Acknowledge, &request).await?;
        Ok(response.invalid_ack_ids)
    }

    /// Sets the deadline of leased messages to `seconds` from now (0 to 600; 0 is a nack).
    pub async fn modify_ack_deadline(
        &self,
        subscription: &str,
        ack_ids: Vec<String>,
        seconds: u32,
    ) -> Result<Vec<InvalidAckId>> {
        let request = ModifyAckDeadlineRequest {
            subscription: subscription.to_owned(),
            ack_ids,
            ack_deadline_seconds: seconds,
        };
        let response: AckResponse =
            self.data(Resource::Subscription, subscription, Command::ModifyAckDeadline, &request).await?;
        Ok(response.invalid_ack_ids)
    }

    /// Asks for immediate redelivery.
    pub async fn nack(&self, subscription: &str, ack_ids: Vec<String>) -> Result<Vec<InvalidAckId>> {
        self.modify_ack_deadline(subscription, ack_ids, 0).await
    }

    fn forget(&self, resource: Resource, name: &str) {
        self.routes.lock().unwrap().remove(&(resource, name.to_owned()));
    }

    async fn route(&self, resource: Resource, name: &str) -> Result<Vec<String>> {
        if let Some(route) = self.routes.lock().unwrap().get(&(resource, name.to_owned())) {
            return Ok(route.clone());
        }
        let command = match resource {
            Resource::Topic => Command::LookupTopic,
            Resource::Subscription => Command::LookupSubscription,
        };
        let response: LookupResponse = self.control(command, &NameRequest { name: name.to_owned() }).await?;
        let route: Vec<String> = response.forwarders.into_iter().map(|forwarder| forwarder.address).collect();
        if route.is_empty() {
            return Err(Error::Status(Status::unavailable(format!("no forwarder serves '{name}'"))));
        }
        self.routes.lock().unwrap().insert((resource, name.to_owned()), route.clone());
        Ok(route)
    }

    async fn forwarder(&self, address: &str) -> Result<Arc<Connection>> {
        if let Some(connection) = self.forwarders.lock().unwrap().get(address) {
            if !connection.is_closed() {
                return Ok(connection.clone());
            }
        }
        let target = address.to_owned();
        let connection = off_thread(move || Connection::connect(&target)).await?;
        let mut forwarders = self.forwarders.lock().unwrap();
        // Requests that raced here each opened a connection: keep the first, drop the others.
        if let Some(existing) = forwarders.get(address) {
            if !existing.is_closed() {
                return Ok(existing.clone());
            }
        }
        forwarders.insert(address.to_owned(), connection.clone());
        Ok(connection)
    }

    async fn data<Req: Body, Resp>(
        &self,
        resource: Resource,
        name: &str,
        command: Command,
        request: &Req,
    ) -> Result<Resp>
    where
        Resp: Archive,
        Resp::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<Resp, Strategy<Pool, rancor::Error>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let route = self.route(resource, name).await?;
            let result = match self.forwarder(&route[0]).await {
                Ok(connection) => connection.call(command.code(), request).await.and_then(decode::<Resp>),
                Err(error) => Err(error),
            };
            match result {
                Err(Error::Status(status))
                    if status.code == ErrorCode::NotOwner && attempt < ROUTING_ATTEMPTS_MAX =>
                {
                    self.forget(resource, name);
                }
                Err(Error::Io(_) | Error::Closed(_) | Error::Connect { .. })
                    if attempt < ROUTING_ATTEMPTS_MAX =>
                {
                    self.forget(resource, name);
                    self.forwarders.lock().unwrap().remove(&route[0]);
                }
                other => return other,
            }
        }
    }
}

/// Runs blocking work (connecting) on a short-lived thread and awaits it without blocking the
/// caller's executor.
async fn off_thread<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
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
