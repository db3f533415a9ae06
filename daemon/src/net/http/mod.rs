//! The monitoring endpoint (`ringpostd --http-listen`): `/metrics` for Prometheus (encoded by
//! `metrics::exposition`), `/healthz` (the process serves), `/readyz` (the shards serve,
//! every shard's data directories hold a quorum, and in a cluster the catalog has a leader) and
//! `/oauth2/v3/certs`, the public keys of the push tokens as a JWK Set (`push::token`), which a
//! push receiver's JWT library fetches: this node's key from the start, as `/healthz` answers,
//! and in a cluster every other node's, which the router shard asks them for (`push::keys`).
//!
//! hyper serves HTTP/1.1 on one tokio thread of its own, unpinned: a scrape is rare, small and
//! never on a publish's path, and the endpoint must answer whether or not the gRPC API runs.
//! A scrape or a readiness check runs on the router shard as a job (`protocol::grpc::bridge`),
//! which gathers every forwarder's figures over the control channels as `ringpost stats` does;
//! the shards keep plain figures and share nothing with this thread.
//!
//! Strangers cannot take it from the probes and scrapers it is for: it serves
//! `HTTP_CONNECTIONS_MAX` connections, at most `HTTP_CONNECTIONS_PER_PEER_MAX` from one address,
//! each closed if a request's head takes longer than `HTTP_REQUEST_HEAD_TIMEOUT`; and scrapes
//! arriving while a gathering runs share the next one (`Endpoint::metrics`).

use crate::api::Status;
use crate::metrics::exposition;
use crate::protocol::grpc::bridge::ShardCaller;
use crate::protocol::grpc::gateway::RouterShard;
use crate::push;
use crate::push::keys::{PushKey, PUSH_KEY_ASK_TIMEOUT};
use crate::push::token::JWKS_PATH;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Where the endpoint serves unless told otherwise: Prometheus's exporters' range, loopback.
pub const HTTP_LISTEN_DEFAULT: &str = "127.0.0.1:9464";
/// How long a scrape or a readiness check waits for the shards before it answers 503.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the listening socket's backlog.
pub const HTTP_CONNECTIONS_MAX: usize = 64;
/// Connections one peer address may hold at once, an eighth of `HTTP_CONNECTIONS_MAX`; one
/// more from it is closed at once. A host that trickles request heads then holds a few slots,
/// not all of them, and a liveness probe from elsewhere is still answered.
pub const HTTP_CONNECTIONS_PER_PEER_MAX: usize = HTTP_CONNECTIONS_MAX / 8;
/// How long a connection may take to send a request's head, idle time between requests
/// included; then it is closed. A scraper sends its head in one packet.
pub const HTTP_REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(3);
/// The response header that numbers the gathering a `/metrics` answer was rendered from:
/// scrapes that share one show the same number.
pub const RENDERING_HEADER: &str = "x-ringpost-rendering";

/// What the endpoint answers from.
struct Endpoint {
    router: ShardCaller<RouterShard>,
    version: &'static str,
    /// The last rendering of `/metrics`. Gatherings run one at a time; a scrape that arrived
    /// before the last one began takes its rendering rather than gathering again, so parallel
    /// scrapers cost the shards one or two gatherings, never one each, and no scrape answers
    /// figures older than itself.
    rendering: tokio::sync::Mutex<Option<Rendering>>,
    /// What the node's start is doing, until it serves: the router shard answers no job before.
    phase: crate::node::StartPhase,
    /// This node's push signing key, which `push::token::JWKS_PATH` serves first.
    push_key: PushKey,
}

/// One rendering of `/metrics`: when its gathering began, its number, and its body (or why
/// there is none).
struct Rendering {
    started: tokio::time::Instant,
    number: u64,
    body: Result<Bytes, String>,
}

/// The endpoint, serving: its thread, and how to stop it.
pub struct HttpServer {
    pub address: SocketAddr,
    stopping: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Serves on `listener` (bound by the caller, so that a taken port fails the start),
    /// answering from the router shard through `router`.
    pub fn start(
        listener: std::net::TcpListener,
        router: ShardCaller<RouterShard>,
        version: &'static str,
        phase: crate::node::StartPhase,
        push_key: PushKey,
    ) -> std::io::Result<HttpServer> {
        let address = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let (stopping, stopped) = tokio::sync::watch::channel(false);
        let endpoint =
            Arc::new(Endpoint { router, version, rendering: tokio::sync::Mutex::new(None), phase, push_key });
        let thread = std::thread::Builder::new().name("ringpost-http".to_owned()).spawn(move || {
            runtime.block_on(serve(listener, endpoint, stopped));
        })?;
        Ok(HttpServer { address, stopping, thread: Some(thread) })
    }

    /// Stops accepting and ends the connections; returns once the thread has.
    pub fn stop(mut self) {
        let _ = self.stopping.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    endpoint: Arc<Endpoint>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            crate::log_warn!("ringpostd: the monitoring endpoint cannot serve: {error}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS_MAX));
    let per_peer = Arc::new(std::sync::Mutex::new(HashMap::new()));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { break };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let Ok((stream, peer)) = accepted else { continue };
        // Beyond its address's share the connection closes at once, its slot free again.
        let Some(share) = PeerShare::take(&per_peer, peer.ip()) else { continue };
        let endpoint = endpoint.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let endpoint = endpoint.clone();
                async move { Ok::<_, std::convert::Infallible>(endpoint.answer(request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HTTP_REQUEST_HEAD_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            drop((share, slot));
        });
        // Finished connections are reaped as new ones come, so the set stays small.
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
}

/// A connection's place in its address's share (`HTTP_CONNECTIONS_PER_PEER_MAX`), given back
/// when dropped.
struct PeerShare {
    per_peer: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
    peer: IpAddr,
}

impl PeerShare {
    /// A place for a connection from `peer`, if its address has one left.
    fn take(per_peer: &Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>, peer: IpAddr) -> Option<PeerShare> {
        let mut counts = per_peer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = counts.entry(peer).or_insert(0);
        if *count >= HTTP_CONNECTIONS_PER_PEER_MAX {
            return None;
        }
        *count += 1;
        Some(PeerShare { per_peer: per_peer.clone(), peer })
    }
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let mut counts = self.per_peer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// What the router shard tells a scrape or a readiness check.
struct Gathered {
    stats: crate::api::stats::Stats,
    cluster: Option<crate::api::cluster::ClusterStatus>,
    counted: exposition::Counted,
}

impl Endpoint {
    async fn answer<B>(&self, request: Request<B>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".to_owned());
        }
        match request.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n".to_owned()),
            "/readyz" => match self.gather().await {
                Ok(gathered) => match not_ready(&gathered) {
                    reasons if reasons.is_empty() => text(StatusCode::OK, "ready\n".to_owned()),
                    reasons => {
                        text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready:\n{}\n", reasons.join("\n")))
                    }
                },
                Err(status) => {
                    text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", status.message))
                }
            },
            "/metrics" => self.metrics().await,
            JWKS_PATH => self.jwks().await,
            "/" => text(StatusCode::OK, format!("ringpostd: /metrics, /healthz, /readyz, {JWKS_PATH}\n")),
            _ => {
                text(StatusCode::NOT_FOUND, format!("not found: /metrics, /healthz, /readyz, {JWKS_PATH}\n"))
            }
        }
    }

    /// The push tokens' public keys, as JSON a JWT library fetches: this node's, then those of
    /// the other nodes (`push::keys`), since each node signs with its own key
    /// and a subscription is pushed by whichever node leads its topic, after a failover another.
    /// It changes only as nodes join or leave, so caches may keep it a while (Google's say
    /// hours; an hour here), and a library meeting a kid it does not know fetches it again.
    async fn jwks(&self) -> Response<Full<Bytes>> {
        let mut keys = vec![self.push_key.clone()];
        for key in self.other_nodes_push_keys().await {
            if !keys.iter().any(|known| known.key_id == key.key_id) {
                keys.push(key);
            }
        }
        let mut response = Response::new(Full::new(Bytes::from(push::token::jwk_set(&keys))));
        let headers = response.headers_mut();
        headers
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
        headers.insert(
            hyper::header::CACHE_CONTROL,
            hyper::header::HeaderValue::from_static("public, max-age=3600"),
        );
        response
    }

    /// The other nodes' push keys, as the router shard learnt them (asking those it holds no
    /// recent key of); none while the node starts or if the router shard does not answer within
    /// `SCRAPE_TIMEOUT` (the set then holds this node's key alone, which verifies what this
    /// node pushes).
    async fn other_nodes_push_keys(&self) -> Vec<PushKey> {
        if self.phase.current().is_some() {
            return Vec::new();
        }
        let reading = self
            .router
            .try_call(|shard: std::rc::Rc<RouterShard>| async move { Ok(learn_push_keys(&shard).await) });
        match tokio::time::timeout(SCRAPE_TIMEOUT, reading).await {
            Ok(Ok(keys)) => keys,
            _ => Vec::new(),
        }
    }

    /// `/metrics`: the rendering of a gathering that began after this scrape arrived, the
    /// last one if it did, else a new one.
    async fn metrics(&self) -> Response<Full<Bytes>> {
        let arrived = tokio::time::Instant::now();
        let mut last = self.rendering.lock().await;
        let fresh = last.as_ref().is_some_and(|rendering| rendering.started >= arrived);
        if !fresh {
            let started = tokio::time::Instant::now();
            let body = self.gather().await.map_err(|status| status.message).map(|gathered| {
                Bytes::from(exposition::encode_metrics(
                    &gathered.stats,
                    gathered.cluster.as_ref(),
                    &gathered.counted,
                    self.version,
                ))
            });
            let number = last.as_ref().map_or(1, |rendering| rendering.number + 1);
            *last = Some(Rendering { started, number, body });
        }
        let rendering = last.as_ref().expect("rendered above");
        let mut response = match &rendering.body {
            Ok(body) => {
                let mut response = Response::new(Full::new(body.clone()));
                response.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(exposition::OPENMETRICS_CONTENT_TYPE),
                );
                response
            }
            Err(message) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{message}\n")),
        };
        response.headers_mut().insert(RENDERING_HEADER, hyper::header::HeaderValue::from(rendering.number));
        response
    }

    async fn gather(&self) -> Result<Gathered, Status> {
        if let Some(step) = self.phase.current() {
            return Err(Status::unavailable(format!("this node is still starting: {step}")));
        }
        let gathering = self.router.try_call(|shard: std::rc::Rc<RouterShard>| async move {
            let stats = shard.router.stats().await?;
            let cluster = shard.router.is_clustered().then(|| shard.router.catalog_status());
            let shards = shard.router.shard_figures().await?;
            let counted = exposition::Counted {
                shards,
                grpc_requests: crate::net::grpc::counting::snapshot(),
                grpc_connections: crate::net::grpc::connections::open_connections(),
                push: crate::push::client::snapshot(),
                followed: shard.router.followed_topics(exposition::METRICS_TOPICS_MAX),
            };
            Ok(Gathered { stats, cluster, counted })
        });
        match tokio::time::timeout(SCRAPE_TIMEOUT, gathering).await {
            Ok(gathered) => gathered,
            Err(_) => Err(Status::unavailable("the shards did not answer within SCRAPE_TIMEOUT")),
        }
    }
}

/// Why the daemon is not ready, if it is not: a shard whose data directories no longer hold a
/// quorum, or a node of a cluster that does not serve as a member.
fn not_ready(gathered: &Gathered) -> Vec<String> {
    let mut reasons = Vec::new();
    for shard in &gathered.stats.shards {
        let directories = shard.directories.len();
        let healthy = shard.directories.iter().filter(|directory| directory.fenced.is_empty()).count();
        if directories > 0 && healthy < directories.div_ceil(2) {
            let name = match shard.shard {
                u32::MAX => "the router".to_owned(),
                shard => format!("forwarder shard {shard}"),
            };
            reasons.push(format!(
                "{name} has {healthy} healthy data directories of {directories}, fewer than a quorum"
            ));
        }
    }
    // A node of a cluster serves only as a member that hears its majority or its leader
    // (`catalog::standing`): a leader cut off, a follower whose leader went silent, no leader,
    // a node removed or waiting to be added.
    if let Some(cluster) = &gathered.cluster {
        reasons.extend(cluster.not_serving.clone());
    }
    reasons
}

/// On the router shard: asks every other registered node whose key it holds none of (or none
/// heard recently) for its key, each within `PUSH_KEY_ASK_TIMEOUT` and all at once, learns the
/// answers, and returns the keys to serve. A node that does not answer, or refuses the request
/// (a node from before it), gives no key; one it gave before stays served a while
/// (`push::keys::PushKeys`).
async fn learn_push_keys(shard: &RouterShard) -> Vec<PushKey> {
    let Some(pool) = shard.peers.clone() else { return Vec::new() };
    let this_node = shard.router.node_id();
    let others = shard.router.registered_nodes().into_keys().filter(|node| *node != this_node);
    let asking = shard.push_keys.borrow().to_ask(others, crate::runtime::now());
    let answers = crate::sync::join_all(
        asking
            .into_iter()
            .map(|node| {
                let pool = pool.clone();
                async move { (node, pool.push_key(node, PUSH_KEY_ASK_TIMEOUT).await) }
            })
            .collect(),
    )
    .await;
    let now = crate::runtime::now();
    let mut keys = shard.push_keys.borrow_mut();
    for (node, answer) in answers {
        match answer {
            Ok(key) => keys.learn(node, key, now),
            Err(status) => {
                crate::log_debug!("ringpostd: no push key from node {node}: {status}");
                keys.unanswered(node, now);
            }
        }
    }
    keys.serving(now)
}
