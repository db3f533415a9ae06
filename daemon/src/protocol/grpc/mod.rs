//! Google Cloud Pub/Sub's gRPC API (`google.pubsub.v1`), so that code written against Google's
//! client libraries runs against Ringpost with nothing changed but `PUBSUB_EMULATOR_HOST`.
//!
//! tonic serves it on a tokio runtime of its own, whose threads run on the cores no forwarder
//! shard is pinned to (or beside them, when every core has one). A handler decodes its request,
//! maps Pub/Sub's names and fields onto the typed API (`crate::api`), and runs the operation on
//! the shard that owns it as a job (`bridge`): the router shard for administration, the topic's
//! forwarder shard for publishing and delivery. Permissions are decided there, by the shard's
//! own `Access`, as for the native protocol.

pub mod bridge;
pub mod convert;
pub mod credentials;
pub mod decode_errors;
mod delivery;
pub mod gateway;
pub mod names;
mod publisher;
pub mod remote;
mod schemas;
mod snapshots;
mod sources;
pub mod status;
mod streaming;
mod subscriber;
mod subscriptions;
mod unimplemented;

use crate::net::grpc::{budget, connections, counting};
use crate::net::tls::{TlsFiles, TlsSettings};
use gateway::Gateway;
use ringpost_proto::google::iam::v1::iam_policy_server::IamPolicyServer;
use ringpost_proto::pubsub::publisher_server::PublisherServer;
use ringpost_proto::pubsub::schema_service_server::SchemaServiceServer;
use ringpost_proto::pubsub::subscriber_server::SubscriberServer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The emulator's port, so `PUBSUB_EMULATOR_HOST=localhost:8085` finds Ringpost.
pub const GRPC_LISTEN_DEFAULT: &str = "127.0.0.1:8085";

/// A gRPC message the server decodes: above Pub/Sub's 10 MB request limit, so that a publish
/// over that limit is refused by the same check as the native protocol's, naming the limit.
pub const GRPC_REQUEST_BYTES_MAX: usize = 16 << 20;

/// Concurrent calls on one HTTP/2 connection (a client's StreamingPulls, publishes, acks), as
/// Google's front ends and grpc-core's servers allow; a client queues calls beyond it. With
/// `GRPC_REQUEST_BYTES_MAX`, it bounds what one connection can make the server hold.
pub const GRPC_STREAMS_PER_CONNECTION_MAX: u32 = 100;

/// HTTP/2 keepalive: a connection the server heard nothing from for `GRPC_KEEPALIVE_INTERVAL`
/// is pinged, and closed unless the ping is answered within `GRPC_KEEPALIVE_TIMEOUT`. Every
/// HTTP/2 client answers pings by itself, so this closes only peers that are gone or never
/// spoke HTTP/2 past their preface (which held connections for good before), within 30 s.
pub const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
pub const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stop waits for calls to finish after open streams were told to reconnect.
pub const GRPC_STOP_GRACE: Duration = Duration::from_secs(5);

/// How the gRPC API is served.
#[derive(Clone, Debug, PartialEq)]
pub struct GrpcSettings {
    /// `None`: not served.
    pub listen: Option<SocketAddr>,
    /// Where the REST API (`protocol::rest`) is served, on the gRPC API's runtime; `None`: not
    /// at all (`--rest-listen`).
    pub rest_listen: Option<SocketAddr>,
    /// The tokio runtime's worker threads.
    pub threads: usize,
    /// How long a connection with no call open stays open (`connections::GRPC_IDLE_DEADLINE`).
    pub idle_deadline: Duration,
}

impl Default for GrpcSettings {
    fn default() -> GrpcSettings {
        GrpcSettings {
            listen: None,
            rest_listen: None,
            threads: 2,
            idle_deadline: connections::GRPC_IDLE_DEADLINE,
        }
    }
}

/// The gRPC API, serving: its runtime's thread, and how to stop it.
pub struct GrpcServer {
    pub address: SocketAddr,
    /// The REST API's address, when it is served.
    pub rest_address: Option<SocketAddr>,
    stopping: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GrpcServer {
    /// Serves the gRPC API on `listener` (bound by the caller, so a taken port fails the
    /// start), on `threads` tokio worker threads pinned to `cpus` (none: unpinned); and the
    /// REST API on `rest`, if given.
    pub fn start(
        listener: std::net::TcpListener,
        rest: Option<std::net::TcpListener>,
        gateway: Gateway,
        threads: usize,
        cpus: Vec<usize>,
        tls: Option<&TlsSettings>,
        idle_deadline: Duration,
    ) -> Result<GrpcServer, String> {
        let address = listener.local_addr().map_err(|error| format!("the gRPC listener: {error}"))?;
        listener.set_nonblocking(true).map_err(|error| format!("the gRPC listener: {error}"))?;
        let rest_address = rest
            .as_ref()
            .map(|rest| {
                rest.set_nonblocking(true)?;
                rest.local_addr()
            })
            .transpose()
            .map_err(|error| format!("the REST listener: {error}"))?;
        let rest_tls = match (&rest, tls) {
            (Some(_), Some(settings)) => Some(TlsFiles::open(settings, &[b"http/1.1"])?),
            _ => None,
        };
        let tls = tls.map(|settings| TlsFiles::open(settings, &[b"h2"])).transpose()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("grpc")
            .enable_io()
            .enable_time()
            .on_thread_start(move || pin_to(&cpus))
            .build()
            .map_err(|error| format!("starting the gRPC runtime: {error}"))?;
        let (stopping, stopping_receiver) = tokio::sync::watch::channel(false);
        let listener = {
            let _entered = runtime.enter();
            let rest = rest
                .map(tokio::net::TcpListener::from_std)
                .transpose()
                .map_err(|error| format!("the REST listener: {error}"))?;
            let grpc = tokio::net::TcpListener::from_std(listener)
                .map_err(|error| format!("the gRPC listener: {error}"))?;
            Listening { grpc, rest: rest.map(|listener| (listener, rest_tls)) }
        };
        let gateway = Arc::new(gateway);
        let thread = std::thread::Builder::new()
            .name("grpc-main".into())
            .spawn(move || {
                let mut stop = stopping_receiver.clone();
                runtime.block_on(async move {
                    let serving =
                        tokio::spawn(serve(listener, gateway, tls, stopping_receiver, idle_deadline));
                    let _ = stop.wait_for(|stopping| *stopping).await;
                    // Calls still running after the grace (a long Pull, a client that keeps
                    // a stream open past its UNAVAILABLE) are cut: the daemon's stop is bounded.
                    let _ = tokio::time::timeout(GRPC_STOP_GRACE, serving).await;
                });
                runtime.shutdown_timeout(Duration::from_millis(100));
            })
            .map_err(|error| format!("starting the gRPC thread: {error}"))?;
        Ok(GrpcServer { address, rest_address, stopping, thread: Some(thread) })
    }

    /// Stops serving: open StreamingPulls end with `UNAVAILABLE` (the clients reconnect), the
    /// listener closes, and calls running get `GRPC_STOP_GRACE` to finish.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let _ = self.stopping.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The API's listeners: gRPC's, and REST's with its TLS, if it is served.
struct Listening {
    grpc: tokio::net::TcpListener,
    rest: Option<(tokio::net::TcpListener, Option<TlsFiles>)>,
}

async fn serve(
    listening: Listening,
    gateway: Arc<Gateway>,
    tls: Option<TlsFiles>,
    stopping: tokio::sync::watch::Receiver<bool>,
    idle_deadline: Duration,
) {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<PublisherServer<publisher::PublisherService>>().await;
    health_reporter.set_serving::<SubscriberServer<subscriber::SubscriberService>>().await;
    let publisher = PublisherServer::new(publisher::PublisherService { gateway: gateway.clone() })
        .max_decoding_message_size(GRPC_REQUEST_BYTES_MAX);
    let schemas = SchemaServiceServer::new(schemas::SchemaService { gateway: gateway.clone() });
    let subscriber =
        SubscriberServer::new(subscriber::SubscriberService { gateway, stopping: stopping.clone() })
            .max_decoding_message_size(GRPC_REQUEST_BYTES_MAX);
    let routes = tonic::service::Routes::new(health)
        .add_service(publisher)
        .add_service(subscriber)
        .add_service(schemas)
        .add_service(IamPolicyServer::new(unimplemented::IamPolicyService));
    let budget = budget::BudgetLayer::new(budget::GRPC_REQUEST_BYTES_ARRIVING_MAX);
    let Listening { grpc: listener, rest } = listening;
    let rest_serving = rest.map(|(rest, rest_tls)| {
        // REST calls go through the same counting and budget as gRPC's (`protocol::rest`).
        use tower_layer::Layer;
        let services = counting::CountingLayer.layer(budget.layer(routes.clone()));
        tokio::spawn(crate::protocol::rest::serve(rest, services, rest_tls, stopping.clone(), idle_deadline))
    });
    // Each connection has a server of its own, sharing the services and the budget, so that it
    // can be closed alone when idle (`connections::serve_each`).
    let server = move |activity| {
        tonic::transport::Server::builder()
            .max_concurrent_streams(GRPC_STREAMS_PER_CONNECTION_MAX)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
            // Outside the rest, so that every call arriving is the connection's activity.
            .layer(connections::ActivityLayer::new(activity))
            // Outside the rest, so that a call the budget refuses is counted too; it also gives
            // a request that does not decode the client's code (`decode_errors`).
            .layer(counting::CountingLayer)
            .layer(budget.clone())
            .add_routes(routes.clone())
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let connections_max = connections::GRPC_CONNECTIONS_MAX;
    // TLS is ours rather than tonic's: tonic's reads its certificates once and gives a
    // handshake no deadline.
    match tls {
        None => {
            let incoming = connections::plain(incoming, connections_max);
            connections::serve_each(incoming, idle_deadline, stopping, move |io, activity, ending| {
                serve_connection(server(activity), io, ending)
            })
            .await
        }
        Some(tls) => {
            let incoming = connections::handshaken(incoming, connections_max, tls, stopping.clone());
            connections::serve_each(incoming, idle_deadline, stopping, move |io, activity, ending| {
                serve_connection(server(activity), io, ending)
            })
            .await
        }
    }
    if let Some(rest_serving) = rest_serving {
        let _ = rest_serving.await;
    }
}

/// Serves one connection with `router` until `ending` resolves, then closes it gracefully.
async fn serve_connection<Layers, IO>(
    router: tonic::transport::server::Router<Layers>,
    io: IO,
    ending: connections::Ending,
) where
    Layers: tower_layer::Layer<tonic::service::Routes>,
    Layers::Service: tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    <Layers::Service as tower_service::Service<http::Request<tonic::body::Body>>>::Future: Send,
    <Layers::Service as tower_service::Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    // The one connection, then nothing: tonic's serving then lasts until `ending`.
    use futures_lite::StreamExt;
    let incoming =
        futures_lite::stream::once(Ok::<IO, std::io::Error>(io)).chain(futures_lite::stream::pending());
    if let Err(error) = router.serve_with_incoming_shutdown(incoming, ending).await {
        crate::log_warn!("ringpostd: the gRPC API stopped serving a connection: {error}");
    }
}

/// Pins the calling thread to `cpus` (none: leaves it where the scheduler puts it).
fn pin_to(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        let _ = set.set(cpu);
    }
    let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
}
