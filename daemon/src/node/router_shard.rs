//! The router shard's start: on its own executor, it opens the catalog, connects to every
//! forwarder's control channels, recovers, then serves its port and runs its timers.

use super::os::{into_glommio, stop_on_close};
use super::{steps, ClusterSettings, Config, ROUTER_IO_MEMORY_BYTES};
use crate::control::{ControlEnvelope, ControlReply};
use crate::{catalog, log, net, protocol, router, storage, sync};
use glommio::channels::shared_channel::{SharedReceiver, SharedSender};
use glommio::{LocalExecutorBuilder, Placement as CpuPlacement};
use std::net::TcpListener as StdListener;
use std::rc::Rc;
use std::sync::mpsc;

use net::peer::{PeerAddresses, PeerHandler, PeerNetwork, PeerPool};
use net::server::{serve, Security};
use protocol::grpc::bridge::{serve_jobs, JobReceiver};
use protocol::grpc::gateway::RouterShard;

/// What the router shard is given at start: its port, the router's ends of the forwarders'
/// control channels, the forwarders' ports and how to advertise them, its end of its stop
/// socket, and where it reports that it is ready and that it stopped.
pub(super) struct RouterWiring {
    pub listener: StdListener,
    pub to_forwarders: Vec<SharedSender<ControlEnvelope>>,
    pub from_forwarders: Vec<SharedReceiver<ControlReply>>,
    pub ports: Vec<u16>,
    pub advertise: router::Advertise,
    pub stop: std::os::unix::net::UnixStream,
    pub ready: mpsc::Sender<Result<(), String>>,
    pub stopped: mpsc::Sender<(String, usize)>,
    /// The gRPC API's jobs for the router, when it is served.
    pub grpc_jobs: Option<JobReceiver<RouterShard>>,
    /// The cluster port and this node's registration, in a cluster.
    pub cluster: Option<ClusterWiring>,
    /// What the start is doing, set here as it moves on.
    pub phase: super::StartPhase,
}

pub(super) struct ClusterWiring {
    pub listener: StdListener,
    pub settings: super::ClusterSettings,
    pub record: catalog::NodeRecord,
    /// This node's push signing key, which its cluster port gives the other nodes
    /// (`push::keys`).
    pub push_key: crate::push::keys::PushKey,
}

/// Starts the router shard for `shards` forwarder shards, which are serving already.
pub(super) fn start_router_shard(
    config: &Config,
    shards: usize,
    wiring: RouterWiring,
) -> Result<glommio::ExecutorJoinHandle<()>, String> {
    let replication_refused = replication_the_ports_would_refuse(config);
    let cluster_tls = cluster_tls(config)?;
    let cluster_secret = config.cluster.as_ref().and_then(|cluster| cluster.secret.clone());
    let cluster_hosts = config.cluster.as_ref().map(ClusterSettings::hosts).unwrap_or_default();
    let config = config.clone();
    LocalExecutorBuilder::new(CpuPlacement::Unbound)
        .name("router")
        .io_memory(ROUTER_IO_MEMORY_BYTES)
        .spawn(move || async move {
            let RouterWiring {
                listener: router_listener,
                to_forwarders,
                from_forwarders,
                ports,
                advertise,
                stop: router_shard_stop,
                ready: router_ready,
                stopped: stopped_sender,
                grpc_jobs,
                cluster,
                phase,
            } = wiring;
            let fail = |message: String| {
                let _ = router_ready.send(Err(message));
            };
            let links = connect_forwarders(to_forwarders, from_forwarders).await;
            if let Err(error) = probe_data_directories(&config.data_dirs).await {
                return fail(error);
            }
            let directories = log::Directories::new(config.data_dirs.clone());
            let storage = storage::dma::DmaStorage;
            // The router's port and the cluster port share what this shard knows of the
            // cluster's hosts; `follow_cluster_hosts` keeps it (and the forwarders') current.
            let hosts = net::server::ClusterHosts::new(cluster_hosts.iter().copied());
            // Forwarders of this node present the cluster's secret here to look up topics
            // another node leads (their dead letters).
            let security = match Security::open_with_cluster(
                &config.access,
                config.tls.as_ref(),
                cluster_secret.as_deref(),
            ) {
                Ok(security) => security.with_cluster_hosts(hosts.clone()),
                Err(error) => return fail(error),
            };
            let access = security.access.clone();
            let stop = sync::Stop::default();
            stop_on_close(router_shard_stop, stop.clone());
            // The router's port answers from the start: until the router is ready, every
            // request but Hello is refused at once with what the start waits for (a node
            // waiting with --join to be added, a catalog without a leader), rather than left
            // unanswered in the listening socket's backlog.
            let port = Rc::new(RouterPort::new(phase.clone()));
            let serving = crate::runtime::spawn(serve(
                into_glommio(router_listener),
                port.clone(),
                stop.clone(),
                config.connections,
                security,
            ));
            phase.set("opening the catalog");
            let opened = open_catalog(
                (storage.clone(), directories.clone()),
                (shards as u32, config.balance_factor),
                cluster.as_ref(),
                (&access, &hosts),
                &stop,
                config.connections,
                cluster_tls,
                &phase,
            )
            .await;
            let (catalog, peers) = match opened {
                Ok(opened) => opened,
                Err(error) => return fail(error),
            };
            let membership = membership(cluster.as_ref(), peers.as_ref(), replication_refused);
            let parts = steps::RouterParts {
                storage,
                directories,
                links,
                addresses: router::ForwarderAddresses::new(ports, advertise),
                balance_factor: config.balance_factor,
                limits: config.catalog_limits,
                follow_thresholds: config.follow_thresholds,
            };
            // The door opens to the cluster port, then to the router's port, once the router
            // recovered; the shard is ready then.
            let open = |router: &Rc<router::Router<_>>, door: &Rc<crate::dispatch::Door<_>>| {
                if let Some((handler, _)) = &peers {
                    handler.set_door(door.clone());
                    follow_cluster_hosts(router, cluster_hosts, hosts, shards as u32, &stop);
                }
                port.open(door.clone());
                let _ = router_ready.send(Ok(()));
            };
            let (router, door) = match steps::serve_router(catalog, parts, membership, &phase, open).await {
                Ok(served) => served,
                Err(error) => return fail(error),
            };
            if let Some(jobs) = grpc_jobs {
                let pool = peers.as_ref().map(|(_, pool)| pool.clone());
                serve_router_jobs(jobs, router.clone(), door, access, pool, &stop);
            }
            let connections = serving.await;
            let _ = stopped_sender.send(("router".to_owned(), connections));
        })
        .map_err(|e| format!("starting the router shard: {e}"))
}

/// Serves the jobs the gRPC API's and the monitoring endpoint's threads send the router shard,
/// with the router, its door, the shard's access rules and, in a cluster, the way to the
/// other nodes (for their push keys).
fn serve_router_jobs(
    jobs: JobReceiver<RouterShard>,
    router: Rc<router::Router<storage::dma::DmaStorage>>,
    door: Rc<crate::dispatch::Door<storage::dma::DmaStorage>>,
    access: Rc<crate::auth::Access>,
    peers: Option<Rc<PeerPool>>,
    stop: &sync::Stop,
) {
    let target = Rc::new(RouterShard { router, door, access, peers, push_keys: Default::default() });
    crate::runtime::spawn(serve_jobs(jobs, target, stop.clone())).detach();
}

/// A clustered node's ways to the other nodes, through the cluster port's pool, and the
/// registration it makes; none for a node alone.
fn membership(
    cluster: Option<&ClusterWiring>,
    peers: Option<&Peers>,
    replication_refused: Option<&'static str>,
) -> Option<steps::Membership> {
    let (cluster, (_, pool)) = cluster.zip(peers)?;
    Some(steps::Membership {
        peers: Rc::new(pool.clone()),
        nodes: Rc::new(pool.clone()),
        record: cluster.record.clone(),
        replication_refused,
    })
}

/// With TLS and the cluster's CA, the cluster port takes TLS too: the server's certificate
/// verified against the CA, the client authenticated by the cluster's secret inside.
fn cluster_tls(
    config: &Config,
) -> Result<Option<(net::tls::TlsSettings, std::sync::Arc<rustls::ClientConfig>)>, String> {
    match (&config.tls, config.cluster.as_ref().and_then(|cluster| cluster.ca.as_ref())) {
        (Some(settings), Some(ca)) => {
            let server = net::tls::TlsSettings { client_ca: None, ..settings.clone() };
            Ok(Some((server, net::tls::replication_client_config(ca)?)))
        }
        _ => Ok(None),
    }
}

/// The forwarders' control channels, connected before anything else: glommio's connect of a
/// shared channel wakes its executor at every turn until the other end connects, so a
/// forwarder left waiting while this shard opened the catalog spun its core (1.26 cores for a
/// node waiting with --join to be added).
async fn connect_forwarders(
    to_forwarders: Vec<SharedSender<ControlEnvelope>>,
    from_forwarders: Vec<SharedReceiver<ControlReply>>,
) -> Vec<Rc<router::ForwarderLink>> {
    let mut links = Vec::new();
    for (sender, receiver) in to_forwarders.into_iter().zip(from_forwarders) {
        let link = router::ForwarderLink::new(sender.connect().await);
        crate::runtime::spawn(link.clone().receive_replies(receiver.connect().await)).detach();
        links.push(link);
    }
    links
}

/// Each data directory's device probed once, as the router's shard opens the catalog there.
async fn probe_data_directories(data_dirs: &[std::path::PathBuf]) -> Result<(), String> {
    for data_dir in data_dirs {
        if let Err(error) = storage::dma::warm_up_device_probe(data_dir, "router").await {
            return Err(format!("probing {}: {error}", data_dir.display()));
        }
    }
    Ok(())
}

/// Why replication between nodes is refused up front, if the forwarders' ports would refuse
/// the replicating forwarders of other nodes.
fn replication_the_ports_would_refuse(config: &Config) -> Option<&'static str> {
    let replication_over_tls = config.cluster.as_ref().is_some_and(|cluster| cluster.ca.is_some());
    if config.tls.is_some() && !replication_over_tls {
        // Forwarders would replicate to each other in plaintext, which a TLS port refuses.
        Some("the forwarders' ports take TLS and no --cluster-ca says how to verify the other nodes' certificates")
    } else if config
        .tls
        .as_ref()
        .is_some_and(|tls| tls.client_certificates == net::tls::ClientCertificates::Required)
    {
        // A replicating forwarder authenticates with the cluster's secret and presents no
        // certificate, which these ports would refuse.
        Some("the forwarders' ports require client certificates, which replication between nodes does not present")
    } else {
        None
    }
}

/// The router's port while the router starts: Hello is answered (a client connects and learns
/// the server's version), every other request is refused with `Unavailable` saying what the
/// start waits for; once the router is ready (`open`), every request goes to its door.
struct RouterPort<S: storage::Storage> {
    door: std::cell::RefCell<Option<Rc<crate::dispatch::Door<S>>>>,
    phase: super::StartPhase,
}

impl<S: storage::Storage> RouterPort<S> {
    fn new(phase: super::StartPhase) -> RouterPort<S> {
        RouterPort { door: std::cell::RefCell::new(None), phase }
    }

    fn open(&self, door: Rc<crate::dispatch::Door<S>>) {
        *self.door.borrow_mut() = Some(door);
    }
}

impl<S: storage::Storage> net::server::Handler for RouterPort<S> {
    async fn handle(
        &self,
        header: ringpost_wire::frame::FrameHeader,
        body: ringpost_wire::frame::FrameBuffer,
        responder: &net::server::Responder,
    ) -> net::server::Response {
        let door = self.door.borrow().clone();
        if let Some(door) = door {
            return door.handle(header, body, responder).await;
        }
        if header.command == ringpost_wire::Command::Hello.code() {
            return protocol::native::router::hello_response(&header).into();
        }
        let step = self.phase.current().unwrap_or_else(|| "starting".to_owned());
        let status = crate::api::Status::unavailable(format!("this node is still starting: {step}"));
        net::server::fail(&header, &status.into()).into()
    }
}

/// How often the router shard looks whether the catalog's registrations changed the hosts of
/// the cluster's nodes, as often as a shard reloads its access file: a node added is let in
/// beside strangers within a second of its registration being applied here.
const CLUSTER_HOSTS_CHECK_INTERVAL: std::time::Duration = net::server::SECURITY_CHECK_INTERVAL;

/// Keeps every shard's hosts of the cluster's nodes (`ClusterHosts`) following the catalog:
/// those `--cluster` named (`given`) and those of every node registered (`add-node`, `--join`),
/// here for the router's port and the cluster port (`hosts`), and by message for each of the
/// `forwarders` local forwarder shards, which have their own. A forwarder that was not told
/// (its channel full at a stop) is told again at the next look.
fn follow_cluster_hosts<S: storage::Storage>(
    router: &Rc<router::Router<S>>,
    given: Vec<std::net::IpAddr>,
    hosts: net::server::ClusterHosts,
    forwarders: u32,
    stop: &sync::Stop,
) {
    let (router, stop) = (router.clone(), stop.clone());
    crate::runtime::spawn(async move {
        // What the shards were started with (`--cluster`'s hosts, as the list they make).
        let mut told = net::peer::cluster_hosts(&given, &Default::default());
        loop {
            if stop.sleep(CLUSTER_HOSTS_CHECK_INTERVAL).await {
                return;
            }
            let now = net::peer::cluster_hosts(&given, &router.registered_nodes());
            if now == told {
                continue;
            }
            hosts.replace(now.iter().copied());
            let mut all_told = true;
            for local in 0..forwarders {
                let request = crate::control::ControlRequest::ClusterHosts { hosts: now.clone() };
                all_told &= router.local_control(local, request).await.is_ok();
            }
            if all_told {
                crate::log_info!(
                    "ringpostd: the hosts of the cluster's nodes are now {} (their connections before authentication \
                     have a budget of their own)",
                    now.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                );
                told = now;
            }
        }
    })
    .detach();
}

/// The catalog: this node's alone, or its voter of the cluster's (`open_clustered`) with the
/// cluster port's handler and the pool of connections to the other nodes.
#[allow(clippy::too_many_arguments)]
async fn open_catalog(
    (storage, directories): (storage::dma::DmaStorage, Rc<log::Directories>),
    (shards, balance_factor): (u32, f64),
    cluster: Option<&ClusterWiring>,
    (access, hosts): (&Rc<crate::auth::Access>, &net::server::ClusterHosts),
    stop: &sync::Stop,
    connection_limits: net::server::ConnectionLimits,
    cluster_tls: Option<(net::tls::TlsSettings, std::sync::Arc<rustls::ClientConfig>)>,
    phase: &super::StartPhase,
) -> Result<(catalog::Catalog<storage::dma::DmaStorage>, Option<Peers>), String> {
    match cluster {
        None => catalog::Catalog::open(storage, directories, shards, balance_factor)
            .await
            .map(|catalog| (catalog, None)),
        Some(cluster) => open_clustered(
            storage,
            directories,
            shards,
            balance_factor,
            cluster,
            (access, hosts),
            stop,
            connection_limits,
            cluster_tls,
            phase,
        )
        .await
        .map(|(catalog, handler, pool)| (catalog, Some((handler, pool)))),
    }
}

/// A clustered node's cluster port handler and its connections to the other nodes.
type Peers = (Rc<PeerHandler<storage::dma::DmaStorage>>, Rc<PeerPool>);

/// Opens this node's voter of the cluster's catalog, serves the cluster port (the other voters
/// need it to elect anyone), and waits until the catalog has a leader and this node applied
/// what it committed.
#[allow(clippy::too_many_arguments)]
async fn open_clustered(
    storage: storage::dma::DmaStorage,
    directories: Rc<log::Directories>,
    shards: u32,
    balance_factor: f64,
    cluster: &ClusterWiring,
    (access, hosts): (&Rc<crate::auth::Access>, &net::server::ClusterHosts),
    stop: &sync::Stop,
    connection_limits: net::server::ConnectionLimits,
    cluster_tls: Option<(net::tls::TlsSettings, std::sync::Arc<rustls::ClientConfig>)>,
    phase: &super::StartPhase,
) -> Result<
    (catalog::Catalog<storage::dma::DmaStorage>, Rc<PeerHandler<storage::dma::DmaStorage>>, Rc<PeerPool>),
    String,
> {
    let (server_tls, client_tls) = match cluster_tls {
        Some((server, client)) => (Some(net::tls::Tls::open(&server)?), Some(client)),
        None => (None, None),
    };
    let settings = &cluster.settings;
    let addresses = settings.numbered();
    let voters = catalog::Voters {
        this_node: settings.node_id.get(),
        ids: addresses.keys().map(|node| node.get()).collect(),
        joining: settings.join,
    };
    let addresses = PeerAddresses::new(addresses);
    let secret: Option<Rc<str>> = settings.secret.as_deref().map(Rc::from);
    let catalog = catalog::Catalog::open_clustered(
        storage,
        directories,
        shards,
        balance_factor,
        catalog::legacy::catalog_log_config(),
        &voters,
        PeerNetwork { addresses: addresses.clone(), secret: secret.clone(), tls: client_tls.clone() },
    )
    .await?;
    addresses.learn_from(catalog.shared_state());
    let handler = PeerHandler::new(
        catalog.raft(),
        access.clone(),
        secret.is_some(),
        catalog.leader_contact(),
        cluster.push_key.clone(),
    );
    let listener =
        into_glommio(cluster.listener.try_clone().map_err(|error| format!("the cluster port: {error}"))?);
    let serving = handler.clone();
    let (stop, limits, port_secret, hosts) = (stop.clone(), connection_limits, secret.clone(), hosts.clone());
    crate::runtime::spawn(async move {
        // Only the cluster's secret authenticates here; the router's access file does not.
        let access = Rc::new(crate::auth::Access::for_cluster(port_secret.as_deref()));
        let security = net::server::Security { access, tls: server_tls, cluster_hosts: hosts };
        net::server::serve(listener, serving, stop, limits, security).await;
    })
    .detach();
    let pool = PeerPool::new(addresses, secret, client_tls);
    let asking = pool.clone();
    catalog
        .ready(&voters, async move |leader| asking.read_index(leader).await, &|why| phase.set(why))
        .await?;
    crate::log_info!(
        "ringpostd: node {} joined the catalog of {} voters (leader: node {})",
        settings.node_id,
        catalog.voter_count(),
        catalog.leader().map_or("none".to_owned(), |leader| leader.to_string())
    );
    Ok((catalog, handler, pool))
}
