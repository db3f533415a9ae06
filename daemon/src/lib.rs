//! `ringpostd`: a durable Pub/Sub daemon, thread-per-core.
//!
//! [`start`] spawns one glommio executor per forwarder shard (pinned to a core) and one for the
//! router shard, wires them with bounded control channels, recovers the catalog and every
//! topic, and returns once every shard is serving. See ARCHITECTURE.md for the map.

pub mod api;
pub mod catalog;
/// Placement lives with the catalog, which records each decision; this name stays for callers.
pub use catalog::placement;
pub mod clock;
pub mod codec;
pub mod control;
pub mod log;
pub mod metrics;
pub mod protocol;
pub mod router;
pub mod runtime;
pub mod shard;
#[cfg(test)]
mod sim_checker;
#[cfg(test)]
mod sim_node_tests;
#[cfg(test)]
mod sim_tests;
pub mod storage;
pub mod subscription;
pub mod sync;
pub mod topic;

use control::{ControlEnvelope, ControlReply, CONTROL_CHANNEL_CAPACITY};
use glommio::channels::shared_channel;
use glommio::{LocalExecutorBuilder, Placement as CpuPlacement};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::rc::Rc;
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
        }
    }
}

/// A running daemon.
pub struct Daemon {
    pub router_address: SocketAddr,
    pub forwarder_addresses: Vec<SocketAddr>,
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
    pub fn wait(self) {
        for thread in self.threads {
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
        let started = std::time::Instant::now();
        let until = started + grace;
        let router = self.stops.pop().expect("the router's stop");
        let mut connections = Vec::new();
        let wait_for = |count: usize, connections: &mut Vec<(String, usize)>| {
            for _ in 0..count {
                let left = until.saturating_duration_since(std::time::Instant::now());
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
        Ok(Stopped { connections, took: started.elapsed() })
    }
}

/// Waits, on the shard's executor, for the other end of `stop` to close (or write), then gives
/// the shard's stop order.
fn stop_on_close(stop: std::os::unix::net::UnixStream, order: sync::Stop) {
    use std::os::unix::io::{FromRawFd, IntoRawFd};
    let _ = stop.set_nonblocking(true);
    // SAFETY: the descriptor is one end of a connected Unix socket pair that we own and hand
    // over whole.
    let mut stream = unsafe { glommio::net::UnixStream::from_raw_fd(stop.into_raw_fd()) };
    crate::runtime::spawn(async move {
        let mut byte = [0u8; 1];
        let _ = futures_lite::AsyncReadExt::read(&mut stream, &mut byte).await;
        order.give();
    })
    .detach();
}

/// `host:port`, with an IPv6 literal in brackets.
pub fn host_and_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The port of forwarder shard `shard`: the one after the router's and the shards before it,
/// or 0 (a free port) when the router's is 0.
pub fn forwarder_port(router_port: u16, shard: usize, shards: usize) -> Result<u16, String> {
    if router_port == 0 {
        return Ok(0);
    }
    u16::try_from(shard + 1).ok().and_then(|offset| router_port.checked_add(offset)).ok_or_else(|| {
        format!(
            "forwarder shard {shard} would listen on port {}, beyond 65535: the {shards} forwarder shard(s) take the \
             {shards} port(s) after the router's, so --listen takes a port of at most {} (or 0 for free ports)",
            router_port as usize + shard + 1,
            65535usize.saturating_sub(shards)
        )
    })
}

/// Takes an exclusive lock on the data directory so two daemons never share one.
fn lock_data_dir(data_dir: &std::path::Path) -> Result<std::fs::File, String> {
    let created = !data_dir.exists();
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("creating data directory {}: {e}", data_dir.display()))?;
    if created {
        // Its name must outlive a power cut like everything made durable inside it.
        let parent = data_dir.parent().filter(|parent| !parent.as_os_str().is_empty());
        std::fs::File::open(parent.unwrap_or(std::path::Path::new(".")))
            .and_then(|parent| parent.sync_all())
            .map_err(|e| format!("syncing the folder holding data directory {}: {e}", data_dir.display()))?;
    }
    let path = data_dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    #[allow(deprecated)] // nix's Flock wrapper takes ownership of the file; we keep ours.
    nix::fcntl::flock(
        std::os::unix::io::AsRawFd::as_raw_fd(&file),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .map_err(|_| format!("data directory {} is in use by another ringpostd", data_dir.display()))?;
    Ok(file)
}

fn bind(address: SocketAddr) -> Result<(StdListener, SocketAddr), String> {
    let listener = StdListener::bind(address).map_err(|e| format!("binding {address}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    Ok((listener, local))
}

/// Hands a listening std socket to the current glommio executor. Ports are bound with std
/// (without SO_REUSEPORT, which glommio's own bind sets) so that a second daemon on the same
/// port fails to start instead of silently sharing it.
fn into_glommio(listener: StdListener) -> glommio::net::TcpListener {
    use std::os::unix::io::{FromRawFd, IntoRawFd};
    // Accepts are issued through io_uring or as non-blocking attempts: the socket must not block.
    let _ = listener.set_nonblocking(true);
    // SAFETY: the descriptor is a bound, listening TCP socket that we own and hand over whole.
    unsafe { glommio::net::TcpListener::from_raw_fd(listener.into_raw_fd()) }
}

/// Open files the daemon asks for: every topic keeps its active message and journal segments
/// open, so 10,000 topics want over 20,000 descriptors besides connections. Under a lower limit
/// the journals beyond a quarter of it close their files between commits (see
/// `Forwarder::set_journals_open_max`).
pub const OPEN_FILES_WANTED: u64 = 1 << 20;

/// Raises the open-file limit as far as allowed (to `OPEN_FILES_WANTED` when privileged, else to
/// the hard limit) and returns the limit in force.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 0 };
    let wanted = OPEN_FILES_WANTED.max(soft);
    if setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted.max(hard)).is_ok() {
        return wanted;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// What one forwarder shard is given at start: its port, its ends of the router's control
/// channels and of its stop socket, and where it reports that it is ready and that it stopped.
struct ForwarderWiring {
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
}

/// The forwarder shards, started: their threads, the router's ends of their control channels,
/// and the ends of their stop sockets that stop them when closed.
struct ForwarderShards {
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    to_forwarders: Vec<glommio::channels::shared_channel::SharedSender<ControlEnvelope>>,
    from_forwarders: Vec<glommio::channels::shared_channel::SharedReceiver<ControlReply>>,
    stops: Vec<std::os::unix::net::UnixStream>,
}

/// Where shards report that they are ready (or failed to start), and that they stopped.
type ShardReports<'a> = (&'a mpsc::Sender<Result<(), String>>, &'a mpsc::Sender<(String, usize)>);

/// Starts one forwarder shard per listener, each reporting on `reports` (ready, stopped).
fn start_forwarder_shards(
    config: &Config,
    listeners: Vec<(StdListener, SocketAddr)>,
    journals_open_max: usize,
    reports: ShardReports<'_>,
) -> Result<ForwarderShards, String> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut started = ForwarderShards {
        threads: Vec::new(),
        to_forwarders: Vec::new(),
        from_forwarders: Vec::new(),
        stops: Vec::new(),
    };
    let peer_channels = shard::dead_letters::peer_channels(listeners.len());
    for (shard, ((listener, _), peers)) in listeners.into_iter().zip(peer_channels).enumerate() {
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
        };
        started.threads.push(start_forwarder_shard(config, placement, wiring)?);
    }
    Ok(started)
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
            } = wiring;
            for data_dir in &data_dirs {
                if let Err(error) =
                    storage::dma::warm_up_device_probe(data_dir, &format!("forwarder-{shard}")).await
                {
                    let _ = ready.send(Err(format!("probing {}: {error}", data_dir.display())));
                    return;
                }
            }
            let listener = into_glommio(listener);
            let forwarder = Rc::new(shard::Forwarder::new(
                shard as u32,
                storage::dma::DmaStorage,
                log::Directories::new(data_dirs),
                log_config,
                Rc::new(clock::SystemClock),
            ));
            forwarder.dead_letters.connect(&forwarder, peers);
            forwarder.set_journals_open_max(journals_open_max);
            forwarder.set_quarantine_damaged(quarantine_damaged);
            let _ = ready.send(Ok(()));
            let requests = requests.connect().await;
            let replies = Rc::new(replies.connect().await);
            let stop = forwarder.stop_handle();
            stop_on_close(stop_socket, stop.clone());
            let stopping = forwarder.clone();
            crate::runtime::spawn(async move { stopping.wake_for_stop().await }).detach();
            let serving =
                crate::runtime::spawn(protocol::native::server::serve(listener, forwarder.clone(), stop));
            run_forwarder_timers(&forwarder);
            // The router's requests are served until the shard ends (the router stops
            // first, so none is cut short by this shard's stop).
            crate::runtime::spawn(async move {
                while let Some(envelope) = requests.recv().await {
                    let forwarder = forwarder.clone();
                    let replies = replies.clone();
                    crate::runtime::spawn(async move {
                        let result = forwarder.control(envelope.request).await;
                        let _ = replies.send(ControlReply { request_id: envelope.request_id, result }).await;
                    })
                    .detach();
                }
            })
            .detach();
            let connections = serving.await;
            let _ = stopped.send((format!("forwarder-{shard}"), connections));
        })
        .map_err(|e| format!("starting forwarder shard {shard}: {e}"))
}

/// A forwarder shard's timers: segment collection and the lease sweep.
fn run_forwarder_timers<S: storage::Storage>(forwarder: &Rc<shard::Forwarder<S>>) {
    let collector = forwarder.clone();
    crate::runtime::spawn(async move {
        loop {
            crate::runtime::sleep(shard::SEGMENT_COLLECTION_INTERVAL).await;
            collector.collect_segments().await;
        }
    })
    .detach();
    let sweeper = forwarder.clone();
    crate::runtime::spawn(async move {
        loop {
            crate::runtime::sleep(shard::LEASE_SWEEP_INTERVAL).await;
            sweeper.sweep_leases();
        }
    })
    .detach();
}

/// Refuses data directories no majority can be counted in.
fn check_data_directories(data_dirs: &[PathBuf]) -> Result<(), String> {
    if data_dirs.is_empty() || data_dirs.len().is_multiple_of(2) {
        return Err(format!(
            "{} data directories given: give an odd number (1, 3, 5...), so that a majority is well defined",
            data_dirs.len()
        ));
    }
    if data_dirs.len() > log::DATA_DIRECTORIES_MAX {
        return Err(format!(
            "{} data directories given; at most {} (DATA_DIRECTORIES_MAX)",
            data_dirs.len(),
            log::DATA_DIRECTORIES_MAX
        ));
    }
    Ok(())
}

pub fn start(config: Config) -> Result<Daemon, String> {
    metrics::process::keep_large_buffers_in_heap();
    let open_files = raise_open_file_limit();
    if open_files < 4096 {
        eprintln!(
            "ringpostd: WARNING: only {open_files} open files allowed; each topic keeps about two segment files open"
        );
    }
    check_data_directories(&config.data_dirs)?;
    let locks =
        config.data_dirs.iter().map(|directory| lock_data_dir(directory)).collect::<Result<Vec<_>, _>>()?;
    let shards = config.shards.max(1);
    // Bind every port up front so a port conflict fails the start with a clear message.
    let mut forwarder_listeners = Vec::new();
    for shard in 0..shards {
        let port = forwarder_port(config.listen.port(), shard, shards)?;
        forwarder_listeners.push(bind(SocketAddr::new(config.listen.ip(), port))?);
    }
    let (router_listener, router_address) = bind(config.listen)?;
    let forwarder_addresses: Vec<SocketAddr> =
        forwarder_listeners.iter().map(|(_, address)| *address).collect();
    let advertise = match &config.advertise {
        Some(host) => router::Advertise::Host(host.clone()),
        None if config.listen.ip().is_unspecified() => router::Advertise::ConnectionAddress,
        None => router::Advertise::Host(config.listen.ip().to_string()),
    };
    let (stopped_sender, stopped) = mpsc::channel::<(String, usize)>();
    // A quarter of the descriptors for journals kept open, each holding one per data directory;
    // the rest are for message segments, connections and journals that reopen per commit.
    let journals_open_max = (open_files / 4 / (shards * config.data_dirs.len()) as u64) as usize;
    let (ready_sender, ready) = mpsc::channel::<Result<(), String>>();
    let ForwarderShards { mut threads, to_forwarders, from_forwarders, mut stops } = start_forwarder_shards(
        &config,
        forwarder_listeners,
        journals_open_max,
        (&ready_sender, &stopped_sender),
    )?;
    for _ in 0..shards {
        ready.recv().map_err(|_| "a forwarder shard died while starting".to_string())??;
    }

    let data_dirs = config.data_dirs.clone();
    let balance_factor = config.balance_factor;
    let router_ready = ready_sender.clone();
    let (router_stop, router_shard_stop) =
        std::os::unix::net::UnixStream::pair().map_err(|e| format!("making a socket pair: {e}"))?;
    let ports: Vec<u16> = forwarder_addresses.iter().map(SocketAddr::port).collect();
    let router = LocalExecutorBuilder::new(CpuPlacement::Unbound)
        .name("router")
        .io_memory(ROUTER_IO_MEMORY_BYTES)
        .spawn(move || async move {
            let fail = |message: String| {
                let _ = router_ready.send(Err(message));
            };
            for data_dir in &data_dirs {
                if let Err(error) = storage::dma::warm_up_device_probe(data_dir, "router").await {
                    return fail(format!("probing {}: {error}", data_dir.display()));
                }
            }
            let directories = log::Directories::new(data_dirs);
            let storage = storage::dma::DmaStorage;
            let catalog = match catalog::Catalog::open(
                storage.clone(),
                directories.clone(),
                shards as u32,
                balance_factor,
            )
            .await
            {
                Ok(catalog) => catalog,
                Err(error) => return fail(error),
            };
            let mut links = Vec::new();
            for (sender, receiver) in to_forwarders.into_iter().zip(from_forwarders) {
                let link = router::ForwarderLink::new(sender.connect().await);
                crate::runtime::spawn(link.clone().receive_replies(receiver.connect().await)).detach();
                links.push(link);
            }
            let router = Rc::new(router::Router::new(
                storage,
                directories,
                catalog,
                links,
                router::ForwarderAddresses::new(ports, advertise),
                balance_factor,
            ));
            if let Err(error) = router.recover().await {
                return fail(error);
            }
            let listener = into_glommio(router_listener);
            let _ = router_ready.send(Ok(()));
            let expirer = router.clone();
            crate::runtime::spawn(async move {
                loop {
                    crate::runtime::sleep(router::EXPIRATION_CHECK_INTERVAL).await;
                    expirer.expire_subscriptions().await;
                    expirer.retake_catalog_reserve().await;
                    match expirer.compact_catalog().await {
                        Ok(false) => {}
                        Ok(true) => {
                            eprintln!("ringpostd: compacted the catalog: snapshot taken, raft log purged")
                        }
                        Err(error) => eprintln!("ringpostd: compacting the catalog: {error}"),
                    }
                }
            })
            .detach();
            let stop = sync::Stop::default();
            stop_on_close(router_shard_stop, stop.clone());
            let connections = protocol::native::server::serve(listener, router, stop).await;
            let _ = stopped_sender.send(("router".to_owned(), connections));
        })
        .map_err(|e| format!("starting the router shard: {e}"))?;
    threads.push(router);
    stops.push(router_stop);
    ready.recv().map_err(|_| "the router shard died while starting".to_string())??;
    Ok(Daemon { router_address, forwarder_addresses, threads, stops, stopped, _locks: locks })
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
