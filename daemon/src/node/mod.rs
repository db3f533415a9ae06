//! The node: the wiring of one daemon's shards. It is the only place that builds executors:
//! one glommio executor per forwarder shard (pinned to a core) and one for the router shard,
//! joined by bounded control channels (router to forwarders) and dead-letter channels
//! (forwarder to forwarder), each shard with its port and its stop socket. [`start`] takes the
//! data directories, binds every port, starts the forwarders, then the router once they are
//! ready, and returns a [`Daemon`] once every shard is serving.

mod forwarder_shard;
mod os;
mod phase;
mod router_shard;
pub(crate) mod steps;

use crate::ids::NodeId;
use crate::{auth, catalog, log, metrics, net, placement, protocol, push, router, shard};
use forwarder_shard::{start_forwarder_shards, ForwarderShards};
pub use os::check_data_directories;
use os::{bind, lock_data_dir, raise_open_file_limit};
pub use os::{forwarder_port, host_and_port, OPEN_FILES_WANTED};
pub use phase::StartPhase;
use router_shard::{start_router_shard, RouterWiring};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;

/// How the daemon is run. `Config::new` gives the embedded defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// The router's address; forwarders listen on the following ports (or on ephemeral ports
    /// when this port is 0).
    pub listen: SocketAddr,
    /// The host clients are told to reach the forwarders at. `None`: the listening address,
    /// or, when that is every address (0.0.0.0, ::), the address each client reached the
    /// router at.
    pub advertise: Option<String>,
    /// The M data directories (M odd). Every log is kept in each; a commit is acknowledged when
    /// ⌈M/2⌉ copies are durable.
    pub data_dirs: Vec<PathBuf>,
    /// Forwarder shards; default one per core.
    pub shards: usize,
    /// Consistent hashing with bounded loads: no forwarder holds more than
    /// `ceil(balance_factor * topics / shards)` topics.
    pub balance_factor: f64,
    /// Pin each forwarder to a core.
    pub pin_shards: bool,
    /// Bytes of I/O memory each forwarder shard sets aside and registers with io_uring
    /// (`io_memory_bytes_for`).
    pub io_memory_bytes: usize,
    pub log: log::LogConfig,
    /// At start, a topic whose logs cannot be recovered (damage no copy can mend) is
    /// quarantined instead of stopping the start: left on disk as it is and answered with
    /// `DataLoss`, with its subscriptions, while every other topic is served. Off by default:
    /// the daemon then refuses to start and says which topic is damaged and why.
    pub quarantine_damaged: bool,
    /// What every shard allows the connections on its port (the router's and the forwarders').
    pub connections: net::server::ConnectionLimits,
    /// Who may do what: whether requests are checked, and the access file. `Config::new`
    /// gives auth off on a loopback address and required on any other.
    pub access: auth::AccessSettings,
    /// TLS on every port (the router's and the forwarders'), or plaintext.
    pub tls: Option<net::tls::TlsSettings>,
    /// Google Cloud Pub/Sub's gRPC API: where, and on how many threads. `Config::new` leaves
    /// it off; ringpostd's `--grpc-listen` turns it on by default.
    pub grpc: protocol::grpc::GrpcSettings,
    /// Where the monitoring endpoint serves (`/metrics`, `/healthz`, `/readyz`); `None`, not
    /// at all. `Config::new` leaves it off; ringpostd's `--http-listen` turns it on by default.
    pub http_listen: Option<SocketAddr>,
    /// The CA certificates HTTPS push endpoints are verified against (`--push-ca-file`);
    /// `None`: the system's roots.
    pub push_ca_file: Option<std::path::PathBuf>,
    /// The cluster this node is one of; `None`, a node alone.
    pub cluster: Option<ClusterSettings>,
    /// The issuer (`iss`) the OIDC tokens of push requests claim (`push::token`).
    pub push_token_issuer: String,
    /// How many topics, subscriptions and snapshots the catalog may hold (decided by the
    /// catalog's leader with its own).
    pub catalog_limits: router::CatalogLimits,
    /// When the catalog's leader adds and retires the sources of topics that follow their load
    /// (`--source-add-messages-per-second` and the others).
    pub follow_thresholds: router::follow::FollowThresholds,
    /// Messages and bytes delivered and not yet acknowledged that each forwarder shard, and each
    /// topic, allows its subscribers (`subscription::outstanding`).
    pub outstanding: crate::subscription::outstanding::OutstandingLimits,
    /// Every topic's publish rate, in messages and bytes a second (`topic::rate`); off by
    /// default.
    pub publish_rate: crate::topic::rate::PublishRateLimits,
}

/// A node's place in a cluster: its id, and every voter's cluster address, node `i + 1` at
/// index `i`. Each node is given the same list.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    pub node_id: NodeId,
    pub addresses: Vec<SocketAddr>,
    /// The secret every node presents on the others' cluster ports (`--cluster-secret-file`);
    /// without one, the cluster port answers whoever reaches it.
    pub secret: Option<String>,
    /// With TLS on the forwarders' ports, the CA the other nodes' certificates chain to
    /// (`--cluster-ca`): forwarders replicate to each other over TLS, verifying them against
    /// it. Without it, topics get one replica.
    pub ca: Option<std::path::PathBuf>,
    /// This node joins a running cluster (`--join`) rather than founding one with the others
    /// of the list: it waits until a member adds it (`ringpost cluster add-node`).
    pub join: bool,
}

/// How often a start that has not finished says in the log what it is doing.
pub const START_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Most voters a cluster's catalog takes: Raft's quorums grow with them, and 3 or 5 survive
/// one or two failures. More nodes join as learners (`ringpost cluster add-node`).
pub const CLUSTER_VOTERS_MAX: usize = 7;

/// Most addresses `--cluster` lists for a node that joins (`--join`), which is itself at
/// `--node-id`'s place: its node ids, and so the list, may go past the voters.
pub const CLUSTER_NODES_MAX: usize = 256;

impl ClusterSettings {
    /// This node's cluster address: the one at `--node-id`'s place, or, for a node that joins
    /// with an id beyond the list (the list names the members it can reach, itself last, so
    /// that no placeholder stands for a node removed before it), the last.
    pub fn address(&self) -> SocketAddr {
        let index = (self.node_id.get() as usize).min(self.addresses.len()) - 1;
        self.addresses[index]
    }

    /// The addresses the list numbers, by node id: every one at its place, or, for a node that
    /// joins with an id beyond the list, its own alone (it learns the members' from the
    /// catalog once a member adds it).
    pub fn numbered(&self) -> std::collections::BTreeMap<NodeId, SocketAddr> {
        if (self.node_id.get() as usize) <= self.addresses.len() {
            let numbered = self.addresses.iter().enumerate();
            numbered.map(|(index, address)| (NodeId::new(index as u64 + 1), *address)).collect()
        } else {
            std::collections::BTreeMap::from([(self.node_id, self.address())])
        }
    }

    /// The hosts of the cluster's nodes, as `--cluster` names them: their connections before
    /// authentication have a budget of their own on every port of this node.
    pub fn hosts(&self) -> Vec<std::net::IpAddr> {
        self.addresses.iter().map(SocketAddr::ip).filter(|host| !host.is_unspecified()).collect()
    }

    /// Checks the id and the list: at most `CLUSTER_VOTERS_MAX` distinct addresses, the id
    /// one of them (or, joining, any id up to `router::NODE_ID_MAX`, itself last in the list).
    pub fn check(&self) -> Result<(), String> {
        let (most, limit) = if self.join {
            (CLUSTER_NODES_MAX, "CLUSTER_NODES_MAX")
        } else {
            (CLUSTER_VOTERS_MAX, "CLUSTER_VOTERS_MAX")
        };
        if self.addresses.is_empty() || self.addresses.len() > most {
            return Err(format!(
                "--cluster lists {} addresses; give 1 to {most} ({limit})",
                self.addresses.len()
            ));
        }
        if self.join && (self.node_id.get() == 0 || self.node_id.get() > router::NODE_ID_MAX) {
            return Err(format!("--node-id {}: give 1 to {}", self.node_id, router::NODE_ID_MAX));
        }
        if !self.join && (self.node_id.get() == 0 || self.node_id.get() as usize > self.addresses.len()) {
            return Err(format!(
                "--node-id {} is not one of the {} nodes --cluster lists (numbered from 1 in its order)",
                self.node_id,
                self.addresses.len()
            ));
        }
        let distinct: std::collections::HashSet<&SocketAddr> = self.addresses.iter().collect();
        if distinct.len() != self.addresses.len() {
            return Err("--cluster lists an address twice".to_owned());
        }
        Ok(())
    }
}

/// What each forwarder shard sets aside for its commits' and reads' buffers, registered with
/// io_uring once at start: a buffer taken from it is already resident (no page faults while a
/// commit is copied in or a read lands) and its I/O skips pinning its pages (io_uring's fixed
/// buffers), which saves a shard a sixth of its CPU per published message. Sized like the
/// shard's cache budget (`shard::TAIL_CACHE_SHARD_BYTES_MAX`), which bounds the batches and
/// read-ahead extents that stay in memory: with less, a drain's 8 MiB extents often do not fit
/// and come from the heap. It is resident from the start: a daemon with two shards holds about
/// 128 MiB more. A buffer that does not fit comes from the heap as before.
pub const IO_MEMORY_BYTES_DEFAULT: usize = shard::TAIL_CACHE_SHARD_BYTES_MAX;

/// What the forwarder shards' I/O memory may take of the machine's memory by default, in all:
/// a sixteenth, so that a small machine (1 GiB, 2 cores) does not give an eighth of its memory
/// to buffers before it stores a message.
const IO_MEMORY_MACHINE_FRACTION: usize = 16;

/// The least I/O memory a forwarder shard is given by default.
const IO_MEMORY_BYTES_MIN: usize = 4 << 20;

/// Each forwarder's I/O memory when `shards` share this machine: `IO_MEMORY_BYTES_DEFAULT`, or
/// less where that would exceed `IO_MEMORY_MACHINE_FRACTION` of the machine's memory (MemTotal
/// from /proc/meminfo; unknown counts as large). A container's memory limit is not read: under
/// a tight one, `--io-memory-mib` says what to set aside.
pub fn io_memory_bytes_for(shards: usize) -> usize {
    let machine_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|meminfo| {
        let kilobytes = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
        kilobytes.trim().trim_end_matches("kB").trim().parse::<usize>().ok().map(|kb| kb * 1024)
    });
    io_memory_bytes_on(machine_bytes, shards)
}

fn io_memory_bytes_on(machine_bytes: Option<usize>, shards: usize) -> usize {
    match machine_bytes {
        Some(bytes) => (bytes / IO_MEMORY_MACHINE_FRACTION / shards.max(1))
            .clamp(IO_MEMORY_BYTES_MIN, IO_MEMORY_BYTES_DEFAULT),
        None => IO_MEMORY_BYTES_DEFAULT,
    }
}

/// The router shard's I/O memory (glommio's default is 10 MiB, resident and registered): it
/// writes only the catalog, in commits of a few KiB; a compaction's larger batch and the
/// start-up replay take their buffers from the heap.
pub const ROUTER_IO_MEMORY_BYTES: usize = 1 << 20;

impl Config {
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Config {
        let shards = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Config {
            listen,
            advertise: None,
            data_dirs: vec![data_dir],
            shards,
            balance_factor: placement::BALANCE_FACTOR_DEFAULT,
            pin_shards: true,
            io_memory_bytes: io_memory_bytes_for(shards),
            log: log::LogConfig::default(),
            quarantine_damaged: false,
            connections: net::server::ConnectionLimits::default(),
            access: auth::AccessSettings { mode: auth_mode_for(listen), file: None },
            tls: None,
            grpc: protocol::grpc::GrpcSettings::default(),
            http_listen: None,
            push_ca_file: None,
            cluster: None,
            push_token_issuer: push::token::ISSUER_DEFAULT.to_owned(),
            catalog_limits: router::CatalogLimits::default(),
            follow_thresholds: Default::default(),
            outstanding: Default::default(),
            publish_rate: Default::default(),
        }
    }

    /// What guards a shard's connections, as each shard builds its own.
    fn security(&self) -> Result<net::server::Security, String> {
        net::server::Security::open(&self.access, self.tls.as_ref())
    }
}

/// Authentication's default for a listening address: off on a loopback one (only this machine
/// reaches it), required on any other.
fn auth_mode_for(listen: SocketAddr) -> auth::Mode {
    if listen.ip().is_loopback() {
        auth::Mode::Off
    } else {
        auth::Mode::Required
    }
}

/// The warnings a configuration deserves at start: a setting that refuses everything, or one
/// that lets anyone in.
fn security_warnings(config: &Config) -> Vec<String> {
    let mut warnings = Vec::new();
    // The gRPC API shares the access file and TLS files; either port exposed exposes both.
    let grpc_exposed = config.grpc.listen.filter(|grpc| !grpc.ip().is_loopback());
    let exposed = !config.listen.ip().is_loopback() || grpc_exposed.is_some();
    let address = grpc_exposed.filter(|_| config.listen.ip().is_loopback()).unwrap_or(config.listen);
    match config.access.mode {
        auth::Mode::Required if config.access.file.is_none() => warnings.push(
            "authentication is required and no --access-file is given: nobody holds any role, every request \
             will be refused"
                .to_owned(),
        ),
        auth::Mode::Off if exposed => warnings.push(format!(
            "authentication is off on {address}, which is not a loopback address: anyone who reaches it can \
             read, publish to and delete every topic"
        )),
        _ => {}
    }
    if config.access.mode == auth::Mode::Required
        && config.access.file.is_some()
        && exposed
        && config.tls.is_none()
    {
        warnings.push(format!(
            "tokens are accepted on {address} without TLS: they cross the network in plaintext (give --tls-cert \
             and --tls-key)"
        ));
    }
    warnings
}

/// A running daemon.
pub struct Daemon {
    pub router_address: SocketAddr,
    pub forwarder_addresses: Vec<SocketAddr>,
    /// Where the gRPC API serves, when it does.
    pub grpc_address: Option<SocketAddr>,
    /// Where the REST API serves, when it does.
    pub rest_address: Option<SocketAddr>,
    grpc: Option<protocol::grpc::GrpcServer>,
    /// Where the monitoring endpoint serves, when it does.
    pub http_address: Option<SocketAddr>,
    http: Option<net::http::HttpServer>,
    /// Push subscriptions' HTTP client: its thread ends once the shards, holding its other
    /// ends, have stopped.
    _push: crate::push::client::PushClient,
    /// Signs the OIDC tokens of push requests with the node's key (`push::token`).
    pub push_signer: std::sync::Arc<dyn push::TokenSigner>,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    /// One end of a socket pair per shard (forwarders in order, then the router): closing it
    /// tells that shard to stop (`shutdown`).
    stops: Vec<std::os::unix::net::UnixStream>,
    /// Each shard's report once it stopped serving: its name and the connections it closed.
    stopped: mpsc::Receiver<(String, usize)>,
    _locks: Vec<std::fs::File>,
}

/// What a clean stop did, for the daemon's log.
#[derive(Debug)]
pub struct Stopped {
    /// Connections open when the stop began, per shard, all answered and closed.
    pub connections: Vec<(String, usize)>,
    pub took: std::time::Duration,
}

impl Daemon {
    /// Blocks until every shard stops (they stop only with the process).
    pub fn wait(mut self) {
        for thread in std::mem::take(&mut self.threads) {
            let _ = thread.join();
        }
    }

    /// Stops serving, gracefully: the router first (no new lookups or control-plane changes;
    /// those running finish), then the forwarders, each of which stops accepting and reading,
    /// lets the requests it read finish (publishes waiting for their commit are answered
    /// once durable, as always), ends its streams with `Unavailable` (clients retry) and closes
    /// its connections. Returns once every shard has, or `Err` naming those that had not
    /// after `grace`; the process may then exit, since whatever was left is safe to lose as
    /// at any crash.
    pub fn shutdown(mut self, grace: std::time::Duration) -> Result<Stopped, String> {
        let started = crate::runtime::now();
        // The gRPC API first: its streams end with UNAVAILABLE so that its clients reconnect,
        // and nothing it runs is left waiting on a stopped shard.
        if let Some(grpc) = self.grpc.take() {
            grpc.stop();
        }
        // A scrape then finds no shard to answer it; the endpoint goes before them.
        if let Some(http) = self.http.take() {
            http.stop();
        }
        let until = started + grace;
        let router = self.stops.pop().expect("the router's stop");
        let mut connections = Vec::new();
        let wait_for = |count: usize, connections: &mut Vec<(String, usize)>| {
            for _ in 0..count {
                let left = until.saturating_duration_since(crate::runtime::now());
                match self.stopped.recv_timeout(left) {
                    Ok(report) => connections.push(report),
                    Err(_) => return false,
                }
            }
            true
        };
        drop(router);
        let forwarders = std::mem::take(&mut self.stops);
        let router_stopped = wait_for(1, &mut connections);
        let count = forwarders.len();
        drop(forwarders);
        if !router_stopped || !wait_for(count, &mut connections) {
            let stopped: Vec<&str> = connections.iter().map(|(name, _)| name.as_str()).collect();
            return Err(format!(
                "not every shard stopped within {grace:?}; stopped: [{}]",
                stopped.join(", ")
            ));
        }
        Ok(Stopped { connections, took: crate::runtime::now() - started })
    }
}

/// Starts the daemon: takes its data directories, binds its ports, starts the forwarder shards,
/// then the router shard once they are ready, and returns once every shard is serving.
pub fn start(config: Config) -> Result<Daemon, String> {
    metrics::process::keep_large_buffers_in_heap();
    let open_files = raise_open_files_and_warn(&config);
    // Each shard opens its own; opened once here as well, so that an invalid access file or
    // certificate stops the start with its message before any shard starts.
    config.security()?;
    check_data_directories(&config.data_dirs)?;
    let locks =
        config.data_dirs.iter().map(|directory| lock_data_dir(directory)).collect::<Result<Vec<_>, _>>()?;
    // Under the directories' locks, so that two daemons never make two keys in one directory.
    let push_signer = open_push_signer(&config)?;
    let shards = config.shards.max(1);
    let forwarder_ports = (0..shards)
        .map(|shard| forwarder_port(config.listen.port(), shard, shards))
        .collect::<Result<Vec<_>, _>>()?;
    let Listeners {
        router: (router_listener, router_address),
        forwarders: forwarder_listeners,
        cluster: cluster_listener,
        grpc: grpc_listener,
        rest: rest_listener,
        http: http_listener,
    } = bind_every_port(&config, forwarder_ports)?;
    // The gRPC gateway's cache of who serves each topic and subscription (`dispatch::routes`);
    // each forwarder shard's relay keeps its own of the same kind.
    let node_id =
        config.cluster.as_ref().map_or(NodeId::new(crate::catalog::raft::NODE_ID), |cluster| cluster.node_id);
    let routes = std::sync::Arc::new(crate::dispatch::routes::Routes::new(node_id));
    let (grpc_jobs, grpc_gateway, router_jobs) =
        grpc_channels(grpc_listener.is_some(), http_listener.is_some(), shards, &routes);
    let forwarder_addresses: Vec<SocketAddr> =
        forwarder_listeners.iter().map(|(_, address)| *address).collect();
    let advertise = advertised_host(&config);
    let grpc_port = grpc_listener.as_ref().map(|(_, address)| address.port());
    let (stopped_sender, stopped) = mpsc::channel::<(String, usize)>();
    // A quarter of the descriptors for journals kept open, each holding one per data directory;
    // the rest are for message segments, connections and journals that reopen per commit.
    let journals_open_max = (open_files / 4 / (shards * config.data_dirs.len()) as u64) as usize;
    let (ready_sender, ready) = mpsc::channel::<Result<(), String>>();
    let ForwarderShards { mut threads, to_forwarders, from_forwarders, mut stops, push } =
        start_forwarder_shards(
            &config,
            router_address.port(),
            forwarder_listeners,
            journals_open_max,
            (&ready_sender, &stopped_sender),
            grpc_jobs.forwarders,
            &routes,
            push_signer.clone(),
        )?;
    for _ in 0..shards {
        ready.recv().map_err(|_| "a forwarder shard died while starting".to_string())??;
    }
    // The monitoring endpoint serves from here on: `/healthz` answers while the router starts
    // (a node waiting to be added may wait for hours), and `/readyz` says what it waits for.
    let phase = StartPhase::default();
    phase.set("starting its router");
    let http = start_monitoring(http_listener, router_jobs, &phase, &push_signer)?;

    let (router_stop, router_shard_stop) =
        std::os::unix::net::UnixStream::pair().map_err(|e| format!("making a socket pair: {e}"))?;
    let wiring = RouterWiring {
        listener: router_listener,
        to_forwarders,
        from_forwarders,
        ports: forwarder_addresses.iter().map(SocketAddr::port).collect(),
        advertise,
        stop: router_shard_stop,
        ready: ready_sender.clone(),
        stopped: stopped_sender,
        grpc_jobs: grpc_jobs.router,
        phase: phase.clone(),
        cluster: cluster_listener.map(|listener| {
            cluster_wiring(&config, listener, router_address, &forwarder_addresses, grpc_port, &push_signer)
        }),
    };
    let router = start_router_shard(&config, shards, wiring)?;
    threads.push(router);
    stops.push(router_stop);
    wait_for_the_router(&ready, &phase)?;
    let grpc = match (grpc_listener, grpc_gateway) {
        (Some((listener, _)), Some(gateway)) => Some(protocol::grpc::GrpcServer::start(
            listener,
            rest_listener.map(|(listener, _)| listener),
            gateway,
            config.grpc.threads,
            cores_without_a_shard(&config, shards),
            config.tls.as_ref(),
            config.grpc.idle_deadline,
        )?),
        _ => None,
    };
    let grpc_address = grpc.as_ref().map(|grpc| grpc.address);
    let rest_address = grpc.as_ref().and_then(|grpc| grpc.rest_address);
    phase.finish();
    let http_address = http.as_ref().map(|http| http.address);
    Ok(Daemon {
        router_address,
        forwarder_addresses,
        grpc_address,
        rest_address,
        grpc,
        http_address,
        http,
        _push: push.expect("the forwarder shards' push client"),
        // The push client signs with it too (a clone of the Arc given at its start).
        push_signer,
        threads,
        stops,
        stopped,
        _locks: locks,
    })
}

/// Raises the open-file limit as far as allowed and returns it, warning of a limit too low
/// for the topics a node usually keeps and of what the security settings leave open.
fn raise_open_files_and_warn(config: &Config) -> u64 {
    let open_files = raise_open_file_limit();
    if open_files < 4096 {
        crate::log_warn!(
            "ringpostd: WARNING: only {open_files} open files allowed; each topic keeps about two segment files open"
        );
    }
    for warning in security_warnings(config) {
        crate::log_warn!("ringpostd: WARNING: {warning}");
    }
    open_files
}

/// The host clients are told to reach this node's forwarders at: `--advertise`, else the
/// address a client connected to when the node listens on every address, else the one it
/// listens on.
fn advertised_host(config: &Config) -> router::Advertise {
    match &config.advertise {
        Some(host) => router::Advertise::Host(host.clone()),
        None if config.listen.ip().is_unspecified() => router::Advertise::ConnectionAddress,
        None => router::Advertise::Host(config.listen.ip().to_string()),
    }
}

/// The monitoring endpoint, when it has a port and a way to the router shard.
fn start_monitoring(
    listener: Option<(std::net::TcpListener, SocketAddr)>,
    router: Option<protocol::grpc::bridge::ShardCaller<protocol::grpc::gateway::RouterShard>>,
    phase: &StartPhase,
    push_signer: &push::token::Signer,
) -> Result<Option<net::http::HttpServer>, String> {
    let (Some((listener, _)), Some(router)) = (listener, router) else { return Ok(None) };
    let push_key = push_signer.key().push_key();
    net::http::HttpServer::start(listener, router, env!("CARGO_PKG_VERSION"), phase.clone(), push_key)
        .map(Some)
        .map_err(|error| format!("starting the monitoring endpoint: {error}"))
}

/// The node's push signer: its signing key, made at the first start in every data directory
/// and loaded at every later one (`push::token::SigningKey::open_or_create`), with the
/// configured issuer. A damaged key stops the start, naming its file.
fn open_push_signer(config: &Config) -> Result<std::sync::Arc<push::token::Signer>, String> {
    let (key, opened) = push::token::SigningKey::open_or_create(&config.data_dirs)?;
    match opened {
        push::token::Opened::Created => crate::log_info!(
            "ringpostd: made the push signing key (kid {}) in {}",
            key.key_id(),
            config.data_dirs.iter().map(|directory| directory.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
        push::token::Opened::Loaded { rewritten } if !rewritten.is_empty() => crate::log_warn!(
            "ringpostd: the push signing key (kid {}) was missing from {}; written again from the other data              directories",
            key.key_id(),
            rewritten.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
        push::token::Opened::Loaded { .. } => {}
    }
    Ok(std::sync::Arc::new(push::token::Signer::new(key, config.push_token_issuer.clone())))
}

/// Every port the daemon listens on, bound.
struct Listeners {
    router: (std::net::TcpListener, SocketAddr),
    forwarders: Vec<(std::net::TcpListener, SocketAddr)>,
    cluster: Option<std::net::TcpListener>,
    grpc: Option<(std::net::TcpListener, SocketAddr)>,
    rest: Option<(std::net::TcpListener, SocketAddr)>,
    http: Option<(std::net::TcpListener, SocketAddr)>,
}

/// Binds every port up front so a port conflict fails the start with a clear message: the
/// router's first, the port the user gave, so that a daemon already on it is named by it.
fn bind_every_port(config: &Config, forwarder_ports: Vec<u16>) -> Result<Listeners, String> {
    let router = bind(config.listen, "the router's port (--listen)")?;
    let mut forwarders = Vec::new();
    for (shard, port) in forwarder_ports.into_iter().enumerate() {
        let described = format!(
            "forwarder shard {shard}'s port (--listen {} puts forwarder shard i on its port + 1 + i)",
            config.listen
        );
        forwarders.push(bind(SocketAddr::new(config.listen.ip(), port), &described)?);
    }
    let cluster = match &config.cluster {
        Some(cluster) => {
            cluster.check()?;
            let described = format!("the cluster port (node {}'s address in --cluster)", cluster.node_id);
            Some(bind(cluster.address(), &described)?.0)
        }
        None => None,
    };
    let grpc =
        config.grpc.listen.map(|address| bind(address, "the gRPC API's port (--grpc-listen)")).transpose()?;
    if config.grpc.rest_listen.is_some() && config.grpc.listen.is_none() {
        return Err("the REST API (--rest-listen) runs beside the gRPC API: give --grpc-listen too".into());
    }
    let rest = config
        .grpc
        .rest_listen
        .map(|address| bind(address, "the REST API's port (--rest-listen)"))
        .transpose()?;
    let http = config
        .http_listen
        .map(|address| bind(address, "the monitoring endpoint's port (--http-listen)"))
        .transpose()?;
    Ok(Listeners { router, forwarders, cluster, grpc, rest, http })
}

/// What the router shard needs in a cluster: its port, and this node's registration as the
/// other nodes reach it.
fn cluster_wiring(
    config: &Config,
    listener: std::net::TcpListener,
    router_address: SocketAddr,
    forwarder_addresses: &[SocketAddr],
    grpc_port: Option<u16>,
    push_signer: &push::token::Signer,
) -> router_shard::ClusterWiring {
    let settings = config.cluster.clone().expect("bound for a cluster");
    // Where the other nodes' clients reach this node: a fixed host, since they did not
    // connect here; without one, the host of this node's cluster address.
    let host = match &config.advertise {
        Some(host) => host.clone(),
        None if !config.listen.ip().is_unspecified() => config.listen.ip().to_string(),
        None => settings.address().ip().to_string(),
    };
    router_shard::ClusterWiring {
        listener,
        record: catalog::NodeRecord {
            node_id: settings.node_id,
            cluster_address: settings.address().to_string(),
            router_address: crate::host_and_port(&host, router_address.port()),
            forwarders: forwarder_addresses
                .iter()
                .map(|address| crate::host_and_port(&host, address.port()))
                .collect(),
            // Where this node serves the gRPC API, registered with its other addresses
            // (calls reaching another node's gRPC API come here over the cluster's
            // connections, not to this address: `protocol::grpc::remote`).
            grpc_address: grpc_port.map(|port| crate::host_and_port(&host, port)).unwrap_or_default(),
        },
        // Every node serves every node's key, so that a receiver verifying against any node's
        // JWK Set accepts the tokens of whichever node pushes; they ask each other for it.
        push_key: push_signer.key().push_key(),
        settings,
    }
}

/// Waits for the router shard to say it serves (or why it could not). A start can wait long (a
/// majority of the cluster, an addition with --join), and once it waited with nothing in the
/// log (issue: 40 minutes, no line): each `START_REPORT_INTERVAL` it says what it waits for.
fn wait_for_the_router(ready: &mpsc::Receiver<Result<(), String>>, phase: &StartPhase) -> Result<(), String> {
    let started = crate::runtime::now();
    loop {
        match ready.recv_timeout(START_REPORT_INTERVAL) {
            Ok(result) => return result,
            Err(mpsc::RecvTimeoutError::Timeout) => crate::log_warn!(
                "ringpostd: still starting after {} s: {}",
                (crate::runtime::now() - started).as_secs(),
                phase.current().unwrap_or_default()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("the router shard died while starting".to_string())
            }
        }
    }
}

/// The shards' ends of the gRPC API's job channels, and the gateway holding the other ends.
struct GrpcJobs {
    router: Option<protocol::grpc::bridge::JobReceiver<protocol::grpc::gateway::RouterShard>>,
    forwarders: Vec<Option<protocol::grpc::bridge::JobReceiver<protocol::grpc::gateway::ForwarderShard>>>,
}

/// The job channels the gRPC API (`grpc`) and the monitoring endpoint (`http`) need: the
/// router's, for either; the forwarders' and the gateway, for the gRPC API. The last is the
/// monitoring endpoint's handle on the router shard.
fn grpc_channels(
    grpc: bool,
    http: bool,
    shards: usize,
    routes: &std::sync::Arc<crate::dispatch::routes::Routes>,
) -> (
    GrpcJobs,
    Option<protocol::grpc::gateway::Gateway>,
    Option<protocol::grpc::bridge::ShardCaller<protocol::grpc::gateway::RouterShard>>,
) {
    use protocol::grpc::bridge::job_channel;
    if !grpc && !http {
        let jobs = GrpcJobs { router: None, forwarders: (0..shards).map(|_| None).collect() };
        return (jobs, None, None);
    }
    let (router_caller, router_jobs) = job_channel();
    let http_caller = http.then(|| router_caller.clone());
    if !grpc {
        let jobs = GrpcJobs { router: Some(router_jobs), forwarders: (0..shards).map(|_| None).collect() };
        return (jobs, None, http_caller);
    }
    let (callers, receivers): (Vec<_>, Vec<_>) = (0..shards).map(|_| job_channel()).unzip();
    let jobs = GrpcJobs { router: Some(router_jobs), forwarders: receivers.into_iter().map(Some).collect() };
    (jobs, Some(protocol::grpc::gateway::Gateway::new(router_caller, callers, routes.clone())), http_caller)
}

/// The cores no forwarder shard is pinned to, for the gRPC API's threads; none when the
/// shards are not pinned or take every core (the threads then run where the scheduler puts
/// them, beside the shards).
fn cores_without_a_shard(config: &Config, shards: usize) -> Vec<usize> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if !config.pin_shards {
        return Vec::new();
    }
    (0..cores).filter(|core| (0..shards).all(|shard| shard % cores != *core)).collect()
}

/// Runs `action` on this shard every `interval` (after a first wait), as long as the shard runs.
fn repeat_every(interval: std::time::Duration, mut action: impl AsyncFnMut() + 'static) {
    crate::runtime::spawn(async move {
        loop {
            crate::runtime::sleep(interval).await;
            action().await;
        }
    })
    .detach();
}

#[cfg(test)]
mod io_memory_tests {
    use super::*;

    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    #[test]
    fn io_memory_is_the_default_unless_it_would_take_a_sixteenth_of_the_machine() {
        assert_eq!(io_memory_bytes_on(Some(24 * GIB), 2), 64 * MIB);
        assert_eq!(io_memory_bytes_on(Some(64 * GIB), 64), 64 * MIB);
        assert_eq!(io_memory_bytes_on(Some(GIB), 2), 32 * MIB);
        assert_eq!(io_memory_bytes_on(Some(8 * GIB), 64), 8 * MIB);
        assert_eq!(io_memory_bytes_on(Some(256 * MIB), 8), IO_MEMORY_BYTES_MIN);
        assert_eq!(io_memory_bytes_on(None, 2), IO_MEMORY_BYTES_DEFAULT);
        assert_eq!(io_memory_bytes_on(Some(GIB), 0), 64 * MIB);
    }
}
