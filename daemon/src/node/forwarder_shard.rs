//! The forwarder shards' start: each on its own executor, with its port, its ends of the
//! router's control channels and of the dead-letter channels, and its timers.

use super::os::{into_glommio, stop_on_close};
use super::{steps, Config};
use crate::control::{ControlEnvelope, ControlOk, ControlReply, ControlRequest, CONTROL_CHANNEL_CAPACITY};
use crate::dispatch::routes::Routes;
use crate::ids::NodeId;
use crate::{clock, log, net, protocol, shard, storage};
use glommio::channels::shared_channel;
use glommio::{LocalExecutorBuilder, Placement as CpuPlacement};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::{mpsc, Arc};

type GrpcJobs = protocol::grpc::bridge::JobReceiver<ForwarderShard>;
use protocol::grpc::bridge::serve_jobs;
use protocol::grpc::gateway::ForwarderShard;

/// What one forwarder shard is given at start: its port, its ends of the router's control
/// channels and of its stop socket, and where it reports that it is ready and that it stopped.
pub(super) struct ForwarderWiring {
    shard: usize,
    listener: StdListener,
    requests: glommio::channels::shared_channel::SharedReceiver<ControlEnvelope>,
    replies: glommio::channels::shared_channel::SharedSender<ControlReply>,
    stop: std::os::unix::net::UnixStream,
    ready: mpsc::Sender<Result<(), String>>,
    stopped: mpsc::Sender<(String, usize)>,
    /// Its ends of the dead-letter channels to and from the other forwarder shards.
    peers: shard::dead_letters::PeerChannels,
    journals_open_max: usize,
    /// The gRPC API's jobs for this shard, when it is served.
    grpc_jobs: Option<GrpcJobs>,
    /// The port this node's router listens on, as bound (`--listen` may ask for any port).
    router_port: u16,
    /// The node's cache of who serves what, which the shard's relay reads and fills.
    routes: Arc<Routes>,
    /// Its end of the push subscriptions' HTTP client.
    push: crate::push::client::PushSender,
}

/// The forwarder shards, started: their threads, the router's ends of their control channels,
/// and the ends of their stop sockets that stop them when closed.
pub(super) struct ForwarderShards {
    pub threads: Vec<glommio::ExecutorJoinHandle<()>>,
    pub to_forwarders: Vec<glommio::channels::shared_channel::SharedSender<ControlEnvelope>>,
    pub from_forwarders: Vec<glommio::channels::shared_channel::SharedReceiver<ControlReply>>,
    pub stops: Vec<std::os::unix::net::UnixStream>,
    /// Push subscriptions' HTTP client, of which each shard holds an end.
    pub push: Option<crate::push::client::PushClient>,
}

/// Where shards report that they are ready (or failed to start), and that they stopped.
pub(super) type ShardReports<'a> = (&'a mpsc::Sender<Result<(), String>>, &'a mpsc::Sender<(String, usize)>);

/// Starts one forwarder shard per listener, each reporting on `reports` (ready, stopped);
/// `router_port`: the port this node's router was bound to; `push_signer` signs the tokens
/// of the push subscriptions' HTTP client, of which each shard gets an end.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_forwarder_shards(
    config: &Config,
    router_port: u16,
    listeners: Vec<(StdListener, SocketAddr)>,
    journals_open_max: usize,
    reports: ShardReports<'_>,
    grpc_jobs: Vec<Option<GrpcJobs>>,
    routes: &Arc<Routes>,
    push_signer: Arc<dyn crate::push::TokenSigner>,
) -> Result<ForwarderShards, String> {
    let push = start_push_client(config, push_signer)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut started = ForwarderShards {
        threads: Vec::new(),
        to_forwarders: Vec::new(),
        from_forwarders: Vec::new(),
        stops: Vec::new(),
        push: None,
    };
    let peer_channels = shard::dead_letters::peer_channels(listeners.len());
    for (shard, (((listener, _), peers), grpc_jobs)) in
        listeners.into_iter().zip(peer_channels).zip(grpc_jobs).enumerate()
    {
        let (request_sender, request_receiver) =
            shared_channel::new_bounded::<ControlEnvelope>(CONTROL_CHANNEL_CAPACITY);
        let (reply_sender, reply_receiver) =
            shared_channel::new_bounded::<ControlReply>(CONTROL_CHANNEL_CAPACITY);
        started.to_forwarders.push(request_sender);
        started.from_forwarders.push(reply_receiver);
        let (stop, shard_stop) =
            std::os::unix::net::UnixStream::pair().map_err(|e| format!("making a socket pair: {e}"))?;
        started.stops.push(stop);
        let placement =
            if config.pin_shards { CpuPlacement::Fixed(shard % cores) } else { CpuPlacement::Unbound };
        let wiring = ForwarderWiring {
            shard,
            listener,
            requests: request_receiver,
            replies: reply_sender,
            stop: shard_stop,
            ready: reports.0.clone(),
            stopped: reports.1.clone(),
            peers,
            journals_open_max,
            grpc_jobs,
            router_port,
            // Each shard its own cache: shards share no lock (the gateway's is its threads').
            routes: Arc::new(Routes::new(routes.node())),
            push: push.sender(),
        };
        started.threads.push(start_forwarder_shard(config, placement, wiring)?);
    }
    started.push = Some(push);
    Ok(started)
}

/// Push subscriptions' HTTP client, on a thread of its own (`push::client`), verifying HTTPS
/// endpoints as `--push-ca-file` says and signing tokens with the node's key.
fn start_push_client(
    config: &Config,
    signer: Arc<dyn crate::push::TokenSigner>,
) -> Result<crate::push::client::PushClient, String> {
    let tls = net::tls::push_client_config(config.push_ca_file.as_deref())?;
    crate::push::client::PushClient::start(tls, Some(signer))
        .map_err(|error| format!("starting the push client: {error}"))
}

/// Starts forwarder shard `wiring.shard` on its own executor: probes its data directories,
/// makes its `Forwarder`, and serves its port and the router's requests until it stops.
fn start_forwarder_shard(
    config: &Config,
    placement: CpuPlacement,
    wiring: ForwarderWiring,
) -> Result<glommio::ExecutorJoinHandle<()>, String> {
    let shard = wiring.shard;
    let data_dirs = config.data_dirs.clone();
    let log_config = config.log.clone();
    let quarantine_damaged = config.quarantine_damaged;
    let (outstanding, publish_rate) = (config.outstanding, config.publish_rate);
    let connection_limits = config.connections;
    let (access_settings, tls_settings) = (config.access.clone(), config.tls.clone());
    let cluster = config.cluster.as_ref().map(|cluster| (cluster.node_id, cluster.secret.clone()));
    let cluster_hosts = config.cluster.as_ref().map(|cluster| cluster.hosts()).unwrap_or_default();
    // Where this node's router is reached from here (an unspecified listen address is this
    // host; its port as bound, which `--listen` may leave to the system).
    let router_address = {
        let mut listen = config.listen;
        if listen.ip().is_unspecified() {
            listen.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        listen.set_port(wiring.router_port);
        listen.to_string()
    };
    // Replication over TLS when the forwarders' ports take it and the nodes' CA is given;
    // without the CA, the router gives topics one replica.
    let replication_tls =
        match (&tls_settings, config.cluster.as_ref().and_then(|cluster| cluster.ca.as_ref())) {
            (Some(_), Some(ca)) => Some(net::tls::replication_client_config(ca)?),
            _ => None,
        };
    LocalExecutorBuilder::new(placement)
        .name(&format!("forwarder-{shard}"))
        .io_memory(config.io_memory_bytes)
        .spawn(move || async move {
            let ForwarderWiring {
                shard,
                listener,
                requests,
                replies,
                stop: stop_socket,
                ready,
                stopped,
                peers,
                journals_open_max,
                grpc_jobs,
                router_port: _,
                routes,
                push,
            } = wiring;
            for data_dir in &data_dirs {
                if let Err(error) =
                    storage::dma::warm_up_device_probe(data_dir, &format!("forwarder-{shard}")).await
                {
                    let _ = ready.send(Err(format!("probing {}: {error}", data_dir.display())));
                    return;
                }
            }
            let cluster_secret = cluster.as_ref().and_then(|(_, secret)| secret.as_deref());
            // The router shard tells of the nodes registered since (`ClusterHosts` below).
            let hosts = net::server::ClusterHosts::new(cluster_hosts);
            let security = match net::server::Security::open_with_cluster(
                &access_settings,
                tls_settings.as_ref(),
                cluster_secret,
            ) {
                Ok(security) => security.with_cluster_hosts(hosts.clone()),
                Err(error) => {
                    let _ = ready.send(Err(error));
                    return;
                }
            };
            let listener = into_glommio(listener);
            let access = security.access.clone();
            let forwarder = Rc::new(shard::Forwarder::new(
                shard as u32,
                storage::dma::DmaStorage,
                log::Directories::new(data_dirs),
                log_config,
                Rc::new(clock::SystemClock),
            ));
            forwarder.dead_letters.connect(&forwarder, peers);
            if let Some((node_id, secret)) = &cluster {
                join_the_cluster(
                    &forwarder,
                    *node_id,
                    routes,
                    secret.as_deref(),
                    replication_tls.clone(),
                    &router_address,
                );
            }
            forwarder.set_journals_open_max(journals_open_max);
            forwarder.set_quarantine_damaged(quarantine_damaged);
            forwarder.store.outstanding.set_limits(outstanding);
            forwarder.store.publish_rate.limits.set(publish_rate);
            let _ = ready.send(Ok(()));
            let requests = requests.connect().await;
            let replies = Rc::new(replies.connect().await);
            let stop = forwarder.stop_handle();
            stop_on_close(stop_socket, stop.clone());
            let stopping = forwarder.clone();
            crate::runtime::spawn(async move { stopping.wake_for_stop().await }).detach();
            let serving = crate::runtime::spawn(net::server::serve(
                listener,
                forwarder.clone(),
                stop,
                connection_limits,
                security,
            ));
            run_forwarder_tasks(&forwarder, push);
            if let Some(jobs) = grpc_jobs {
                let target = Rc::new(ForwarderShard { forwarder: forwarder.clone(), access });
                crate::runtime::spawn(serve_jobs(jobs, target, forwarder.stop_handle())).detach();
            }
            // The router's requests are served until the shard ends (the router stops
            // first, so none is cut short by this shard's stop).
            crate::runtime::spawn(serve_router_requests(requests, replies, forwarder, hosts)).detach();
            let connections = serving.await;
            let _ = stopped.send((format!("forwarder-{shard}"), connections));
        })
        .map_err(|e| format!("starting forwarder shard {shard}: {e}"))
}

/// Connects a forwarder of node `node_id` to the other nodes: sources replicate from it
/// straight to their forwarders, dead letters for a topic another node leads go there, and
/// subscribers of sources other nodes lead are served here too, carried there.
fn join_the_cluster<S: storage::Storage>(
    forwarder: &Rc<shard::Forwarder<S>>,
    node_id: NodeId,
    routes: Arc<Routes>,
    secret: Option<&str>,
    replication_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    router_address: &str,
) {
    let transport = net::replica::NativeTransport::new(secret.map(Rc::from), replication_tls);
    // Dead letters are looked up through this node's router.
    forwarder.dead_letters.set_remote(Rc::new(net::replica::RemoteDeadLetters {
        transport: transport.clone(),
        router: router_address.to_owned(),
    }));
    let cluster = steps::ForwarderCluster {
        node_id,
        replicas: Rc::new(transport.clone()),
        carrier: Rc::new(transport),
        routes,
        router_address: router_address.to_owned(),
    };
    steps::forwarder_joins_the_cluster(forwarder, cluster);
}

/// Serves the router's control requests to a forwarder, each as a task of its own, until the
/// router's channel closes; the cluster's hosts are the connection server's to keep (`hosts`),
/// not the forwarder's.
async fn serve_router_requests<S: storage::Storage>(
    requests: shared_channel::ConnectedReceiver<ControlEnvelope>,
    replies: Rc<shared_channel::ConnectedSender<ControlReply>>,
    forwarder: Rc<shard::Forwarder<S>>,
    hosts: net::server::ClusterHosts,
) {
    while let Some(envelope) = requests.recv().await {
        if let ControlRequest::ClusterHosts { hosts: now } = &envelope.request {
            hosts.replace(now.iter().copied());
            let reply = ControlReply { request_id: envelope.request_id, result: Ok(ControlOk::Done) };
            let _ = replies.send(reply).await;
            continue;
        }
        let forwarder = forwarder.clone();
        let replies = replies.clone();
        crate::runtime::spawn(async move {
            let result = forwarder.control(envelope.request).await;
            let _ = replies.send(ControlReply { request_id: envelope.request_id, result }).await;
        })
        .detach();
    }
}

/// A forwarder shard's own tasks: its push subscriptions' (`push::task::serve`, started before
/// the router's requests are served, so that every push subscription they attach is pushed),
/// and its timers, segment collection and the lease sweep.
fn run_forwarder_tasks<S: storage::Storage>(
    forwarder: &Rc<shard::Forwarder<S>>,
    push: crate::push::client::PushSender,
) {
    crate::runtime::spawn(crate::push::task::serve(forwarder.clone(), Rc::new(push))).detach();
    steps::run_forwarder_timers(forwarder);
}
