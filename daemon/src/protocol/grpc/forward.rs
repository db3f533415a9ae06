//! Catalog changes that reach a node that does not lead the catalog, carried to the leader's
//! gRPC API, so that Google's client libraries (which cannot follow a redirect) work against
//! any node of a cluster, as the native protocol's clients do (`protocol::native::router`'s
//! `forward`).
//!
//! A tower layer, beside the budget: a request whose method changes the catalog
//! (`changes_the_catalog`), arriving while this node's `LeaderView` says another node leads
//! and where its gRPC API is, is sent on unchanged (its headers too, so the leader checks the
//! caller's `authorization` with its own access file) over one cached `Channel` per address,
//! and the leader's response is the answer. Nothing is decoded here: the bytes cross as they
//! came. When the leader or its address is unknown, the call runs here and the router answers
//! `UNAVAILABLE`, which the client libraries retry.
//!
//! A carried request is marked (`FORWARDED_FROM`), and a marked request is never carried again,
//! so two nodes whose views disagree for a moment cannot pass a change back and forth: the
//! second answers it itself (`UNAVAILABLE` when it no longer leads). The leader answers a
//! marked change with the catalog index it has applied (`APPLIED_INDEX`), and the node that
//! carried it waits to apply that far before it answers, so that the client's next call here
//! (a publish to the topic it just made) finds what it changed, as the native protocol does.
//!
//! Only in plaintext. Over TLS the leader would see this node's connection, not the client's
//! certificate, so a client authenticated by its certificate would act as this node, or as
//! nobody; there the change runs here and is answered `UNAVAILABLE`, naming the leader.

use super::gateway::Gateway;
use http::HeaderValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::Body;
use tonic::Status;

/// The request header that marks a change carried here by another node (its id): answered
/// here whatever this node's view, with `APPLIED_INDEX`.
pub const FORWARDED_FROM: &str = "ringpost-forwarded-from";
/// The response header with the catalog index the leader had applied when it answered a
/// carried change.
pub const APPLIED_INDEX: &str = "ringpost-catalog-applied";

/// How long connecting to the leader's gRPC API may take before the change is answered
/// `UNAVAILABLE` (the client retries, by then perhaps toward another leader).
pub const GRPC_FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Other nodes' gRPC addresses whose channels the gateway keeps (`Gateway::channel`); past it the cache is emptied (a cluster has at
/// most `CLUSTER_VOTERS_MAX` nodes, so only addresses that changed fill it).
pub const GRPC_FORWARD_CHANNELS_MAX: usize = 16;

/// What the gRPC API knows of the catalog's leader, without asking the router shard: the
/// router shard keeps it current (`node::router_shard`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderView {
    /// This node's id.
    pub node_id: u64,
    /// Whether this node is one of a cluster's; a node alone decides every change itself.
    pub clustered: bool,
    /// Whether this node leads the catalog.
    pub leads: bool,
    /// The node leading it, when one is known, and its gRPC API's address as it registered
    /// it (empty: it serves none, or its registration is not applied here yet).
    pub leader: Option<(u64, String)>,
}

impl LeaderView {
    /// Where a catalog change arriving here goes: the leader and its gRPC API, or `None` to
    /// run here (a node alone, the leader, or a leader not known or without a gRPC address).
    pub fn forward_to(&self) -> Option<(u64, &str)> {
        if !self.clustered || self.leads {
            return None;
        }
        match &self.leader {
            Some((leader, address)) if *leader != self.node_id && !address.is_empty() => {
                Some((*leader, address.as_str()))
            }
            _ => None,
        }
    }
}

pub type LeaderViewSender = tokio::sync::watch::Sender<LeaderView>;
pub type LeaderViewReceiver = tokio::sync::watch::Receiver<LeaderView>;

/// A view of a node alone, until the router shard says otherwise.
pub fn leader_view() -> (LeaderViewSender, LeaderViewReceiver) {
    tokio::sync::watch::channel(LeaderView::default())
}

/// The methods that change the catalog, by their gRPC paths: those whose router method
/// proposes an entry. Seek does not (the subscription's journal is its forwarder's), nor do
/// the reads, Publish and delivery.
pub fn changes_the_catalog(path: &str) -> bool {
    let Some((service, method)) = path.strip_prefix('/').and_then(|path| path.split_once('/')) else {
        return false;
    };
    match service {
        "google.pubsub.v1.Publisher" => {
            matches!(method, "CreateTopic" | "UpdateTopic" | "DeleteTopic" | "DetachSubscription")
        }
        "google.pubsub.v1.Subscriber" => matches!(
            method,
            "CreateSubscription"
                | "UpdateSubscription"
                | "DeleteSubscription"
                | "CreateSnapshot"
                | "UpdateSnapshot"
                | "DeleteSnapshot"
        ),
        _ => false,
    }
}

/// Changes after which the routes this node's gateway cached may be stale, as the handlers
/// forget them when they run here.
fn forgets_routes(path: &str) -> bool {
    path.ends_with("/DeleteTopic")
        || path.ends_with("/DeleteSubscription")
        || path.ends_with("/DetachSubscription")
}

/// The tower layer that carries catalog changes to the leader.
#[derive(Clone)]
pub struct ForwardLayer {
    shared: Arc<Shared>,
}

struct Shared {
    /// Off over TLS (see the module's comment).
    enabled: bool,
    gateway: Arc<Gateway>,
}

impl ForwardLayer {
    pub fn new(gateway: Arc<Gateway>, enabled: bool) -> ForwardLayer {
        ForwardLayer { shared: Arc::new(Shared { enabled, gateway }) }
    }
}

impl<S> tower_layer::Layer<S> for ForwardLayer {
    type Service = Forwarding<S>;

    fn layer(&self, inner: S) -> Forwarding<S> {
        Forwarding { inner, shared: self.shared.clone() }
    }
}

#[derive(Clone)]
pub struct Forwarding<S> {
    inner: S,
    shared: Arc<Shared>,
}

type Boxed<E> = Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// A call's answer: the service's here (no allocation added), or the leader's.
    #[project = AnswerProjection]
    pub enum Answer<F, E> {
        Here { #[pin] future: F },
        Elsewhere { future: Boxed<E> },
    }
}

impl<F, E> Future for Answer<F, E>
where
    F: Future<Output = Result<http::Response<Body>, E>>,
{
    type Output = Result<http::Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AnswerProjection::Here { future } => future.poll(context),
            AnswerProjection::Elsewhere { future } => future.as_mut().poll(context),
        }
    }
}

impl<S> tower_service::Service<http::Request<Body>> for Forwarding<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Future, S::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if !changes_the_catalog(request.uri().path()) {
            return Answer::Here { future: self.inner.call(request) };
        }
        let shared = self.shared.clone();
        if request.headers().contains_key(FORWARDED_FROM) {
            // Carried here by another node: answered here, with how far this node applied.
            let answered = self.inner.call(request);
            return Answer::Elsewhere {
                future: Box::pin(async move {
                    let mut response = answered.await?;
                    if succeeded(&response) {
                        let applied = shared
                            .gateway
                            .router
                            .call(|shard| async move { shard.router.applied_index() })
                            .await
                            .ok()
                            .flatten();
                        if let Some(index) = applied {
                            response.headers_mut().insert(APPLIED_INDEX, HeaderValue::from(index));
                        }
                    }
                    Ok(response)
                }),
            };
        }
        let target = if shared.enabled {
            let view = shared.gateway.leader.borrow();
            view.forward_to().map(|(leader, address)| (view.node_id, leader, address.to_owned()))
        } else {
            None
        };
        let Some((node_id, leader, address)) = target else {
            return Answer::Here { future: self.inner.call(request) };
        };
        request.headers_mut().insert(FORWARDED_FROM, HeaderValue::from(node_id));
        Answer::Elsewhere {
            future: Box::pin(async move { Ok(shared.forward(request, node_id, leader, address).await) }),
        }
    }
}

impl Shared {
    /// Sends `request` to the leader's gRPC API at `address` and answers with its response,
    /// once this node applied the change (at most `crate::router::FORWARDED_APPLY_WAIT`).
    async fn forward(
        &self,
        request: http::Request<Body>,
        node_id: u64,
        leader: u64,
        address: String,
    ) -> http::Response<Body> {
        let path = request.uri().path().to_owned();
        let unreachable = |error: &dyn std::error::Error| {
            // tonic's transport error says only "transport error"; the cause is in its sources.
            let mut why = error.to_string();
            let mut source = error.source();
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                // hyper's connector repeats its own message once per layer.
                if !why.ends_with(&cause_text) {
                    why.push_str(": ");
                    why.push_str(&cause_text);
                }
                source = cause.source();
            }
            Status::unavailable(format!(
                "node {node_id} does not lead the catalog and could not carry this change to node {leader}, \
                 which does, at its gRPC API {address}: {why}; retry"
            ))
            .into_http()
        };
        let mut channel = match self.gateway.channel(&address) {
            Ok(channel) => channel,
            Err(status) => return Status::from(status).into_http(),
        };
        let sent = async {
            std::future::poll_fn(|context| tower_service::Service::poll_ready(&mut channel, context)).await?;
            tower_service::Service::call(&mut channel, request).await
        };
        let response = match sent.await {
            Ok(response) => response,
            Err(error) => return unreachable(&error),
        };
        if let Some(index) = applied_index(&response) {
            let _ = self
                .gateway
                .router
                .call(move |shard| async move {
                    shard.router.wait_applied(index, crate::router::FORWARDED_APPLY_WAIT).await
                })
                .await;
        }
        if forgets_routes(&path) {
            self.gateway.forget_all();
        }
        response
    }
}

/// Whether a response is a success so far: a failure that has no message to send is answered
/// with its status in the headers (gRPC's trailers-only response).
fn succeeded<B>(response: &http::Response<B>) -> bool {
    response.headers().get("grpc-status").is_none_or(|status| status.as_bytes() == b"0")
}

fn applied_index<B>(response: &http::Response<B>) -> Option<u64> {
    response.headers().get(APPLIED_INDEX)?.to_str().ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringpost_proto::pubsub::publisher_server::PublisherServer;
    use ringpost_proto::pubsub::subscriber_server::SubscriberServer;
    use tonic::server::NamedService;

    #[test]
    fn the_methods_that_change_the_catalog_and_only_those_are_carried() {
        type Publisher = PublisherServer<crate::protocol::grpc::publisher::PublisherService>;
        type Subscriber = SubscriberServer<crate::protocol::grpc::subscriber::SubscriberService>;
        let (publisher, subscriber) = (Publisher::NAME, Subscriber::NAME);
        let path = |service: &str, method: &str| format!("/{service}/{method}");
        for method in ["CreateTopic", "UpdateTopic", "DeleteTopic", "DetachSubscription"] {
            assert!(changes_the_catalog(&path(publisher, method)), "{method}");
        }
        for method in [
            "CreateSubscription",
            "UpdateSubscription",
            "DeleteSubscription",
            "CreateSnapshot",
            "UpdateSnapshot",
            "DeleteSnapshot",
        ] {
            assert!(changes_the_catalog(&path(subscriber, method)), "{method}");
        }
        for method in ["Publish", "GetTopic", "ListTopics", "ListTopicSubscriptions", "ListTopicSnapshots"] {
            assert!(!changes_the_catalog(&path(publisher, method)), "{method}");
        }
        for method in [
            "Seek",
            "Pull",
            "StreamingPull",
            "Acknowledge",
            "ModifyAckDeadline",
            "ModifyPushConfig",
            "GetSubscription",
            "ListSubscriptions",
            "GetSnapshot",
            "ListSnapshots",
        ] {
            assert!(!changes_the_catalog(&path(subscriber, method)), "{method}");
        }
        // A method of another service that shares a name, and paths that are not a method's.
        for other in [
            "/google.pubsub.v1.SchemaService/CreateSchema",
            "/google.iam.v1.IAMPolicy/SetIamPolicy",
            "/grpc.health.v1.Health/Check",
            "/google.pubsub.v1.Publisher.CreateTopic",
            "google.pubsub.v1.Publisher/CreateTopic",
            "/google.pubsub.v1.Publisher/CreateTopic/",
            "/",
            "",
        ] {
            assert!(!changes_the_catalog(other), "{other}");
        }
        assert!(!changes_the_catalog(&path("google.pubsub.v1.Publisher", "CreateSubscription")));
    }

    /// The service behind the layer: counts the calls that reach it, answers each empty.
    #[derive(Clone, Default)]
    struct Here(Arc<std::sync::atomic::AtomicUsize>);

    impl tower_service::Service<http::Request<Body>> for Here {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<http::Response<Body>, std::convert::Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::future::ready(Ok(http::Response::new(Body::empty())))
        }
    }

    fn request(path: &str, forwarded: bool) -> http::Request<Body> {
        let mut request = http::Request::builder().uri(format!("http://127.0.0.1{path}"));
        if forwarded {
            request = request.header(FORWARDED_FROM, "1");
        }
        request.body(Body::empty()).unwrap()
    }

    /// Node 2's layer, node 1 leading at `leader_grpc`, with no router shard to answer jobs.
    fn layered(leader_grpc: &str, enabled: bool) -> (Forwarding<Here>, Here, LeaderViewSender) {
        let (router, jobs) = crate::protocol::grpc::bridge::job_channel();
        drop(jobs);
        let (view, leader) = leader_view();
        view.send_replace(LeaderView {
            node_id: 2,
            clustered: true,
            leads: false,
            leader: Some((1, leader_grpc.to_owned())),
        });
        let gateway = Arc::new(Gateway::new(router, Vec::new(), leader));
        let here = Here::default();
        let layer = ForwardLayer::new(gateway, enabled);
        (tower_layer::Layer::layer(&layer, here.clone()), here, view)
    }

    /// The status a trailers-only response carries in its headers.
    fn grpc_status(response: &http::Response<Body>) -> Option<Status> {
        Status::from_header_map(response.headers())
    }

    #[test]
    fn a_change_at_a_follower_goes_to_the_leader_and_the_rest_stays_here() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            // A port nothing listens on: the leader's gRPC API is unreachable.
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
            let (mut service, here, view) = layered(&closed.to_string(), true);
            let calls = || here.0.load(std::sync::atomic::Ordering::Relaxed);
            let call = |service: &mut Forwarding<Here>, path: &str, forwarded: bool| {
                tower_service::Service::call(service, request(path, forwarded))
            };

            let response =
                call(&mut service, "/google.pubsub.v1.Publisher/CreateTopic", false).await.unwrap();
            let status = grpc_status(&response).expect("a status");
            assert_eq!(
                status.code(),
                tonic::Code::Unavailable,
                "which the client libraries retry: {status:?}"
            );
            let message = status.message();
            assert!(message.contains("could not carry this change to node 1"), "{message}");
            assert!(
                message.contains(&closed.to_string()) && message.contains("Connection refused"),
                "{message}"
            );
            assert_eq!(calls(), 0, "the change did not run here");

            call(&mut service, "/google.pubsub.v1.Publisher/Publish", false).await.unwrap();
            call(&mut service, "/google.pubsub.v1.Subscriber/Seek", false).await.unwrap();
            assert_eq!(calls(), 2, "the data plane and Seek run here");

            // Carried here already: answered here whatever the view, never carried again.
            let response =
                call(&mut service, "/google.pubsub.v1.Subscriber/CreateSnapshot", true).await.unwrap();
            assert!(grpc_status(&response).is_none());
            assert_eq!(calls(), 3);

            // This node leads now, or the leader's address is unknown: the change runs here.
            view.send_modify(|view| view.leads = true);
            call(&mut service, "/google.pubsub.v1.Publisher/DeleteTopic", false).await.unwrap();
            view.send_modify(|view| {
                view.leads = false;
                view.leader = Some((1, String::new()));
            });
            call(&mut service, "/google.pubsub.v1.Publisher/DeleteTopic", false).await.unwrap();
            assert_eq!(calls(), 5);

            // Over TLS nothing is carried.
            let (mut service, here, _view) = layered(&closed.to_string(), false);
            tower_service::Service::call(
                &mut service,
                request("/google.pubsub.v1.Publisher/CreateTopic", false),
            )
            .await
            .unwrap();
            assert_eq!(here.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        });
    }

    #[test]
    fn a_change_goes_to_a_leader_known_with_its_grpc_address_only() {
        let leader = |id: u64, address: &str| Some((id, address.to_owned()));
        let view = |clustered, leads, leader| LeaderView { node_id: 2, clustered, leads, leader };
        assert_eq!(view(true, false, leader(1, "10.0.0.1:8085")).forward_to(), Some((1, "10.0.0.1:8085")));
        assert_eq!(LeaderView::default().forward_to(), None, "a node alone");
        assert_eq!(view(false, false, leader(1, "10.0.0.1:8085")).forward_to(), None, "not clustered");
        assert_eq!(view(true, true, leader(2, "10.0.0.2:8085")).forward_to(), None, "this node leads");
        assert_eq!(view(true, false, None).forward_to(), None, "no leader known");
        assert_eq!(view(true, false, leader(1, "")).forward_to(), None, "the leader serves no gRPC API");
        assert_eq!(view(true, false, leader(2, "10.0.0.2:8085")).forward_to(), None, "never to itself");
    }
}
