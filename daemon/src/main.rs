//! `ringpostd`: runs the daemon. With no flags it serves on 127.0.0.1:7450 with its data in
//! `./ringpost-data`.

mod settings;

use argh::FromArgs;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// The shortest cluster secret taken: a guessable one would open every cluster port.
const CLUSTER_SECRET_BYTES_MIN: usize = 32;

/// Ringpost: a durable, thread-per-core Pub/Sub daemon. `ringpostd --version` prints its
/// version.
#[derive(FromArgs)]
struct Flags {
    /// the router's address, HOST:PORT, HOST a name or an address (default 127.0.0.1:7450);
    /// forwarder shard i listens on PORT+1+i, so N shards take the N ports after PORT (7451
    /// and 7452 by default on two cores); port 0 picks free ports for all of them
    #[argh(option, default = "String::from(\"127.0.0.1:7450\")")]
    listen: String,
    /// the host name or address clients are told to reach the forwarders at (default: the
    /// host of --listen; when that is every address, 0.0.0.0 or [::], the address each client
    /// reached the router at)
    #[argh(option)]
    advertise: Option<String>,
    /// where topics, subscriptions and messages are stored (default ./ringpost-data); give it M
    /// times (M odd) to keep a copy on each of M disks and acknowledge once ⌈M/2⌉ are durable
    #[argh(option)]
    data_dir: Vec<PathBuf>,
    /// forwarder shards, one glommio executor each (default: one per core)
    #[argh(option)]
    shards: Option<usize>,
    /// balance factor of consistent hashing with bounded loads: no shard holds more than
    /// ceil(factor * topics / shards) topics (default 1.25; must be above 1)
    #[argh(option, default = "ringpost_daemon::placement::BALANCE_FACTOR_DEFAULT")]
    balance_factor: f64,
    /// do not pin shards to cores (useful when several daemons share a small machine)
    #[argh(switch)]
    no_pin: bool,
    /// largest segment file in bytes (default 64 MiB); segments start at 1 MiB and double up to
    /// this, and are deleted whole once every subscription has acknowledged them
    #[argh(option)]
    segment_bytes_max: Option<u64>,
    /// memory each forwarder shard sets aside for I/O buffers, in MiB, and registers with io_uring
    /// (default 64, less where the shards' share would pass a sixteenth of the machine's
    /// memory); resident from the start
    #[argh(option)]
    io_memory_mib: Option<usize>,
    /// write the router's address to this file once the daemon serves (for scripts and tests);
    /// further lines `grpc HOST:PORT` and `http HOST:PORT` say where the gRPC API and the
    /// monitoring endpoint serve
    #[argh(option)]
    ready_file: Option<PathBuf>,
    /// start even if some topics' logs cannot be recovered (damage no copy can mend): each
    /// such topic is quarantined, answering DataLoss with the reason, its files left as they
    /// are, while the other topics are served; without it the daemon refuses to start
    #[argh(switch)]
    quarantine_damaged: bool,
    /// connections each shard serves at most, on its port (default 4096)
    #[argh(option)]
    connections_per_shard_max: Option<usize>,
    /// connections one peer address may hold on each shard (default 1024)
    #[argh(option)]
    connections_per_peer_max: Option<usize>,
    /// connections each shard holds that have not authenticated yet, i.e. sent no whole frame
    /// (default 1024)
    #[argh(option)]
    connections_unauthenticated_max: Option<usize>,
    /// connections one peer address may hold on each shard before they authenticate, so that
    /// one address cannot take them all; the cluster's nodes (the hosts --cluster names and
    /// those added since) have a budget of their own (default 64)
    #[argh(option)]
    connections_unauthenticated_per_peer_max: Option<usize>,
    /// mebibytes that the frames not yet whole of each shard's connections may hold; a frame that
    /// would take more closes its connection with ResourceExhausted (default 32)
    #[argh(option)]
    partial_frames_mib_max: Option<usize>,
    /// milliseconds a new connection has to authenticate, i.e. send its first whole frame
    /// (default 10000)
    #[argh(option)]
    unauthenticated_deadline_ms: Option<u64>,
    /// milliseconds a frame may take to arrive once its first byte has, plus its length at
    /// --frame-bytes-per-second-min (default 5000)
    #[argh(option)]
    frame_deadline_base_ms: Option<u64>,
    /// the slowest a frame may arrive, in bytes a second (default 1048576)
    #[argh(option)]
    frame_bytes_per_second_min: Option<u64>,
    /// seconds a connection may go without sending a whole frame before it is closed, not
    /// counting the time a streaming pull is open on it (default 600)
    #[argh(option)]
    idle_deadline_seconds: Option<u64>,
    /// seconds a connection's socket may take no byte while an answer waits for it (a peer
    /// that does not read) before the connection is reset and what it held released (default
    /// 60)
    #[argh(option)]
    write_stall_deadline_seconds: Option<u64>,
    /// whether requests must be authenticated and permitted: auto (the default: off on a
    /// loopback --listen address, required on any other), required, or off
    #[argh(option, default = "String::from(\"auto\")")]
    auth: String,
    /// the access file: tokens (their SHA-256) and role grants, reloaded when it changes
    #[argh(option)]
    access_file: Option<PathBuf>,
    /// the server's certificate chain (PEM), with --tls-key: TLS on every port
    #[argh(option)]
    tls_cert: Option<PathBuf>,
    /// the server's private key (PEM), with --tls-cert
    #[argh(option)]
    tls_key: Option<PathBuf>,
    /// a CA (PEM) that client certificates are verified against; a verified certificate's
    /// identity (its first DNS or URI name, else its common name) is its principal
    #[argh(option)]
    tls_client_ca: Option<PathBuf>,
    /// with --tls-client-ca: optional (the default: a client without a certificate may use a
    /// token or stay anonymous) or required (the handshake fails without one)
    #[argh(option)]
    tls_client_cert: Option<String>,
    /// where Google Cloud Pub/Sub's gRPC API serves, HOST:PORT (default 127.0.0.1:8085, the
    /// emulator's port, so PUBSUB_EMULATOR_HOST=localhost:8085 finds it), or off
    #[argh(option, default = "String::from(ringpost_daemon::protocol::grpc::GRPC_LISTEN_DEFAULT)")]
    grpc_listen: String,
    /// where Google Cloud Pub/Sub's REST API serves (JSON over HTTP/1.1, on the gRPC API's
    /// threads and with its TLS and tokens), HOST:PORT, or off (the default)
    #[argh(option, default = "String::from(\"off\")")]
    rest_listen: String,
    /// threads of the gRPC API's runtime, on the cores no shard is pinned to (default 2)
    #[argh(option)]
    grpc_threads: Option<usize>,
    /// seconds a gRPC connection may stay open with no call on it before it is closed
    /// gracefully (GOAWAY), counted from its last call's end; a streaming pull is a call
    /// (default 600)
    #[argh(option)]
    grpc_idle_deadline_seconds: Option<u64>,
    /// the least severe log lines written: error, warn, info or debug (default
    /// $RINGPOST_LOG, else info)
    #[argh(option)]
    log_level: Option<String>,
    /// log lines as text (time, level, message) or json, one object per line (default
    /// $RINGPOST_LOG_FORMAT, else text)
    #[argh(option)]
    log_format: Option<String>,
    /// a TOML file of settings: the flags' names as keys (`data-dir = ["/a", "/b"]`,
    /// `no-pin = true`); flags on the command line win
    #[argh(option)]
    #[allow(dead_code)] // Here for --help: parse_flags takes it off the line first.
    config: Option<String>,
    /// print the settings (the file's and the command line's) as TOML, and exit
    #[argh(switch)]
    #[allow(dead_code)] // Here for --help: parse_flags takes it off the line first.
    print_config: bool,
    /// where the monitoring endpoint serves /metrics (Prometheus), /healthz, /readyz and the
    /// push tokens' public keys (/oauth2/v3/certs), HOST:PORT (default 127.0.0.1:9464), or off
    #[argh(option, default = "String::from(ringpost_daemon::net::http::HTTP_LISTEN_DEFAULT)")]
    http_listen: String,
    /// the issuer (`iss`) of the OIDC tokens push requests carry (default
    /// https://accounts.google.com, Google's, so that receivers written for Google's push
    /// tokens verify ours once pointed at this daemon's /oauth2/v3/certs)
    #[argh(option, default = "String::from(ringpost_daemon::push::token::ISSUER_DEFAULT)")]
    push_token_issuer: String,
    /// the cluster's nodes, HOST:PORT,HOST:PORT,... (the same list on every node): node i
    /// (from 1) listens for the other nodes at the i-th address; the catalog is replicated to
    /// all of them and topics are placed over all their forwarders (default: a node alone)
    #[argh(option)]
    cluster: Option<String>,
    /// this node's place in --cluster, from 1 (default 1)
    #[argh(option, default = "1")]
    node_id: u64,
    /// with --cluster: this node joins a running cluster instead of founding it with the
    /// others of the list; it serves once a member adds it (`ringpost cluster add-node`).
    /// --cluster then lists the members it can reach and, at --node-id's place or last, itself
    #[argh(switch)]
    join: bool,
    /// topics the daemon (or its cluster) holds at most; one more is refused with
    /// ResourceExhausted (default 20000)
    #[argh(option)]
    topics_max: Option<usize>,
    /// subscriptions held at most, of every topic (default 100000)
    #[argh(option)]
    subscriptions_max: Option<usize>,
    /// subscriptions one topic has at most (default 10000)
    #[argh(option)]
    subscriptions_per_topic_max: Option<usize>,
    /// snapshots held at most, each keeping its topic's messages for up to 7 days (default 5000)
    #[argh(option)]
    snapshots_max: Option<usize>,
    /// messages each forwarder shard's subscribers may hold, delivered and not yet
    /// acknowledged, over all its topics; beyond, delivery pauses until acknowledgements,
    /// nacks or expiries make room (default 1000000)
    #[argh(option)]
    outstanding_messages_shard_max: Option<u64>,
    /// mebibytes of messages each forwarder shard's subscribers may hold, delivered and not yet
    /// acknowledged (default 10240)
    #[argh(option)]
    outstanding_mib_shard_max: Option<u64>,
    /// messages one topic's subscribers may hold, delivered and not yet acknowledged (default
    /// 500000)
    #[argh(option)]
    outstanding_messages_topic_max: Option<u64>,
    /// mebibytes of messages one topic's subscribers may hold, delivered and not yet
    /// acknowledged (default 5120)
    #[argh(option)]
    outstanding_mib_topic_max: Option<u64>,
    /// messages a second each topic may be published at (0: no limit, the default); a burst
    /// beyond it is held up to a second on the topic's shard, then refused with
    /// ResourceExhausted and the delay to retry after
    #[argh(option)]
    publish_messages_per_second_topic_max: Option<u64>,
    /// kibibytes a second each topic may be published at (0: no limit, the default), as
    /// --publish-messages-per-second-topic-max
    #[argh(option)]
    publish_kib_per_second_topic_max: Option<u64>,
    /// messages a second per source above which the catalog's leader adds a source to a topic
    /// whose sources follow its load (`topic create|update --sources auto`; default 300000; 0:
    /// messages do not count)
    #[argh(option)]
    source_add_messages_per_second: Option<u64>,
    /// kibibytes a second per source above which a source is added, as
    /// --source-add-messages-per-second (default 262144; 0: bytes do not count)
    #[argh(option)]
    source_add_kib_per_second: Option<u64>,
    /// percent of the add thresholds (1 to 99) that a followed topic's sources, one fewer, must
    /// stay under before one is retired (default 30)
    #[argh(option)]
    source_retire_percent: Option<u32>,
    /// seconds a followed topic must run hot (or cold) before a source is added (or retired),
    /// and the least time between two changes (default 30, at most 86400)
    #[argh(option)]
    source_hold_seconds: Option<u64>,
    /// a file holding the cluster's secret (one line, e.g. from `ringpost token create`), the
    /// same on every node: the cluster port then answers only nodes that present it; needed
    /// unless auth is off
    #[argh(option)]
    cluster_secret_file: Option<PathBuf>,
    /// with --cluster and TLS on (--tls-cert): the CA (PEM) the other nodes' certificates chain
    /// to, so that forwarders replicate to each other over TLS (without it, topics get one
    /// replica)
    #[argh(option)]
    cluster_ca: Option<PathBuf>,
    /// the CA certificates (PEM) HTTPS push endpoints are verified against, instead of the
    /// system's roots
    #[argh(option)]
    push_ca_file: Option<PathBuf>,
}

/// The access and TLS settings the flags set; the TLS files are read when the shards start.
fn security_settings(
    flags: &Flags,
    listen: SocketAddr,
    api_listens: [Option<SocketAddr>; 2],
) -> (ringpost_daemon::auth::AccessSettings, Option<ringpost_daemon::net::tls::TlsSettings>) {
    use ringpost_daemon::auth::{AccessSettings, Mode};
    use ringpost_daemon::net::tls::{ClientCertificates, TlsSettings};
    let mode = match flags.auth.as_str() {
        "auto"
            if listen.ip().is_loopback()
                && api_listens.iter().all(|api| api.is_none_or(|api| api.ip().is_loopback())) =>
        {
            Mode::Off
        }
        "auto" | "required" => Mode::Required,
        "off" => Mode::Off,
        other => usage_error(&format!("--auth {other}: give auto, required or off")),
    };
    let client_certificates = match flags.tls_client_cert.as_deref() {
        None | Some("optional") => ClientCertificates::Optional,
        Some("required") => ClientCertificates::Required,
        Some(other) => usage_error(&format!("--tls-client-cert {other}: give optional or required")),
    };
    if flags.tls_client_cert.is_some() && flags.tls_client_ca.is_none() {
        usage_error(
            "--tls-client-cert needs --tls-client-ca, the CA client certificates are verified against",
        );
    }
    let tls = match (&flags.tls_cert, &flags.tls_key) {
        (Some(certificate), Some(key)) => Some(TlsSettings {
            certificate: certificate.clone(),
            key: key.clone(),
            client_ca: flags.tls_client_ca.clone(),
            client_certificates,
        }),
        (None, None) if flags.tls_client_ca.is_some() => {
            usage_error("--tls-client-ca needs --tls-cert and --tls-key: client certificates come with TLS")
        }
        (None, None) => None,
        _ => usage_error("give --tls-cert and --tls-key together, or neither"),
    };
    (AccessSettings { mode, file: flags.access_file.clone() }, tls)
}

/// The connection limits the flags set, over the defaults.
fn connection_limits(flags: &Flags) -> ringpost_daemon::net::server::ConnectionLimits {
    let mut limits = ringpost_daemon::net::server::ConnectionLimits::default();
    let positive = |value: Option<usize>, name: &str| -> Option<usize> {
        if value == Some(0) {
            usage_error(&format!("--{name} must be at least 1"));
        }
        value
    };
    if let Some(count) = positive(flags.connections_per_shard_max, "connections-per-shard-max") {
        limits.connections_per_shard_max = count;
    }
    if let Some(count) = positive(flags.connections_per_peer_max, "connections-per-peer-max") {
        limits.connections_per_peer_max = count;
    }
    if let Some(count) = positive(flags.connections_unauthenticated_max, "connections-unauthenticated-max") {
        limits.connections_unauthenticated_max = count;
    }
    if let Some(count) =
        positive(flags.connections_unauthenticated_per_peer_max, "connections-unauthenticated-per-peer-max")
    {
        limits.connections_unauthenticated_per_peer_max = count;
    }
    if let Some(mib) = positive(flags.partial_frames_mib_max, "partial-frames-mib-max") {
        limits.partial_frame_bytes_max = mib << 20;
    }
    let duration = |value: Option<u64>, name: &str| -> Option<Duration> {
        if value == Some(0) {
            usage_error(&format!("--{name} must be at least 1"));
        }
        value.map(Duration::from_millis)
    };
    if let Some(deadline) = duration(flags.unauthenticated_deadline_ms, "unauthenticated-deadline-ms") {
        limits.unauthenticated_deadline = deadline;
    }
    if let Some(deadline) = duration(flags.frame_deadline_base_ms, "frame-deadline-base-ms") {
        limits.frame_deadline_base = deadline;
    }
    if let Some(rate) =
        positive(flags.frame_bytes_per_second_min.map(|rate| rate as usize), "frame-bytes-per-second-min")
    {
        limits.frame_bytes_per_second_min = rate as u64;
    }
    if let Some(deadline) =
        duration(flags.idle_deadline_seconds.map(|seconds| seconds * 1000), "idle-deadline-seconds")
    {
        limits.idle_deadline = deadline;
    }
    if let Some(deadline) = duration(
        flags.write_stall_deadline_seconds.map(|seconds| seconds * 1000),
        "write-stall-deadline-seconds",
    ) {
        limits.write_stall_deadline = deadline;
    }
    limits
}

/// The catalog's limits the flags set, over the defaults.
fn catalog_limits(flags: &Flags) -> ringpost_daemon::router::CatalogLimits {
    let mut limits = ringpost_daemon::router::CatalogLimits::default();
    for (value, name, limit) in [
        (flags.topics_max, "topics-max", &mut limits.topics_max),
        (flags.subscriptions_max, "subscriptions-max", &mut limits.subscriptions_max),
        (
            flags.subscriptions_per_topic_max,
            "subscriptions-per-topic-max",
            &mut limits.subscriptions_per_topic_max,
        ),
        (flags.snapshots_max, "snapshots-max", &mut limits.snapshots_max),
    ] {
        match value {
            Some(0) => usage_error(&format!("--{name} must be at least 1")),
            Some(count) => *limit = count,
            None => {}
        }
    }
    limits
}

/// When the catalog's leader adds and retires a followed topic's sources, as the flags set
/// them over the defaults.
fn follow_thresholds(flags: &Flags) -> ringpost_daemon::router::follow::FollowThresholds {
    use ringpost_daemon::router::follow::{FollowThresholds, SOURCE_HOLD_SECONDS_MAX};
    let mut thresholds = FollowThresholds::default();
    if let Some(messages) = flags.source_add_messages_per_second {
        thresholds.add_messages_per_second = messages;
    }
    if let Some(kib) = flags.source_add_kib_per_second {
        thresholds.add_bytes_per_second = kib.saturating_mul(1024);
    }
    if let Some(percent) = flags.source_retire_percent {
        if !(1..100).contains(&percent) {
            usage_error("--source-retire-percent must be from 1 to 99: under the add threshold");
        }
        thresholds.retire_percent = percent;
    }
    if let Some(seconds) = flags.source_hold_seconds {
        if seconds > SOURCE_HOLD_SECONDS_MAX {
            usage_error(&format!("--source-hold-seconds must be at most {SOURCE_HOLD_SECONDS_MAX}"));
        }
        thresholds.hold = std::time::Duration::from_secs(seconds);
    }
    thresholds
}

/// The outstanding limits the flags set, over the defaults.
fn outstanding_limits(flags: &Flags) -> ringpost_daemon::subscription::outstanding::OutstandingLimits {
    let mut limits = ringpost_daemon::subscription::outstanding::OutstandingLimits::default();
    for (value, name, limit, unit) in [
        (
            flags.outstanding_messages_shard_max,
            "outstanding-messages-shard-max",
            &mut limits.messages_shard_max,
            1,
        ),
        (flags.outstanding_mib_shard_max, "outstanding-mib-shard-max", &mut limits.bytes_shard_max, 1 << 20),
        (
            flags.outstanding_messages_topic_max,
            "outstanding-messages-topic-max",
            &mut limits.messages_topic_max,
            1,
        ),
        (flags.outstanding_mib_topic_max, "outstanding-mib-topic-max", &mut limits.bytes_topic_max, 1 << 20),
    ] {
        match value {
            Some(0) => usage_error(&format!("--{name} must be at least 1")),
            Some(count) => *limit = count.saturating_mul(unit),
            None => {}
        }
    }
    limits
}

/// The most `--io-memory-mib` takes: the memory is resident from the start, per shard.
const IO_MEMORY_MIB_MAX: usize = 4096;

/// io_uring rings a glommio executor registers its I/O memory in (main, latency, poll): the
/// memory counts that many times against RLIMIT_MEMLOCK.
const IO_URING_RINGS_PER_EXECUTOR: usize = 3;

/// Registering a shard's I/O memory (the router's too) pins it, which counts against
/// RLIMIT_MEMLOCK once per io_uring ring (glommio registers it in three) unless the process
/// holds CAP_IPC_LOCK (root does, a container's root often does not). When it fails the shard
/// still takes its buffers from that memory, unregistered: every write then pins its pages
/// itself. Said once here, since the failure is otherwise silent.
fn warn_if_io_memory_cannot_be_registered(shards: usize, io_memory_bytes: usize) {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    if may_lock_memory() {
        return;
    }
    let Ok((limit_bytes, _)) = getrlimit(Resource::RLIMIT_MEMLOCK) else { return };
    let needed_bytes = (IO_URING_RINGS_PER_EXECUTOR
        * (shards * io_memory_bytes + ringpost_daemon::ROUTER_IO_MEMORY_BYTES)) as u64;
    if limit_bytes != RLIM_INFINITY && limit_bytes < needed_bytes {
        ringpost_daemon::log_info!(
            "ringpostd: note: RLIMIT_MEMLOCK is {} KiB and registering the I/O memory of {shards} forwarder shard(s) and the router needs {} KiB; \
             writes will pin their buffers one by one (raise `ulimit -l`, grant CAP_IPC_LOCK, or lower --io-memory-mib)",
            limit_bytes / 1024,
            needed_bytes / 1024
        );
    }
}

/// Whether the process holds CAP_IPC_LOCK (bit 14 of the effective set in /proc/self/status).
fn may_lock_memory() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|effective| effective >> CAP_IPC_LOCK & 1 == 1)
}

/// How long a stop (SIGTERM, SIGINT) may take: the requests running then finish and are
/// answered, streams end and connections close; whatever is left after it is cut as a crash
/// would cut it, which loses nothing acknowledged.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Exit codes: 0 a clean stop; 1 the daemon could not start or stopped by force; 2 the command
/// line was wrong.
const EXIT_FAILURE: i32 = 1;
const EXIT_USAGE: i32 = 2;

/// Ends the process for a wrong command line or settings file: the message names the flag, and
/// the file and line when the file set it.
fn usage_error(message: &str) -> ! {
    eprintln!("ringpostd: InvalidArgument: {}", settings::with_origin(message));
    std::process::exit(EXIT_USAGE);
}

/// `HOST:PORT` to an address to bind, a host name resolved (its first address).
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let mut resolved = text
        .to_socket_addrs()
        .map_err(|error| format!("--listen {text}: not HOST:PORT, or HOST does not resolve ({error})"))?;
    resolved.next().ok_or_else(|| format!("--listen {text}: HOST resolves to no address"))
}

/// The host part of `HOST:PORT` when it is a name rather than an address.
fn host_name(text: &str) -> Option<String> {
    let (host, _) = text.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.parse::<std::net::IpAddr>().is_err() && !host.is_empty()).then(|| host.to_owned())
}

/// Blocks the signals the daemon handles in this thread, before any shard starts, so that
/// every thread inherits the mask and they arrive only where `wait_for_stop` waits for them.
fn block_handled_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(signal);
    }
    if let Err(error) = signals.thread_block() {
        ringpost_daemon::log_warn!("ringpostd: WARNING: cannot block SIGTERM, SIGINT and SIGHUP ({error}); they will stop the daemon at once");
    }
    signals
}

/// Waits for SIGTERM or SIGINT. SIGHUP is logged and otherwise ignored: nothing is reloaded
/// yet, and a hang-up from a closed terminal must not stop a daemon.
fn wait_for_stop(signals: &nix::sys::signal::SigSet) -> nix::sys::signal::Signal {
    use nix::sys::signal::Signal;
    loop {
        match signals.wait() {
            Ok(Signal::SIGHUP) => {
                ringpost_daemon::log_info!("ringpostd: SIGHUP ignored: there is nothing to reload")
            }
            Ok(signal) => return signal,
            Err(error) => {
                ringpost_daemon::log_warn!("ringpostd: waiting for signals: {error}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// SIGTERM and SIGINT as they arrive, waited for on a thread of their own from before the
/// start: a start can wait for long (for a majority of the cluster, or with --join to be added),
/// and a signal then must stop it, not wait for it to finish.
struct StopSignals {
    received: std::sync::mpsc::Receiver<nix::sys::signal::Signal>,
    serving: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn watch_signals(signals: nix::sys::signal::SigSet) -> StopSignals {
    use std::sync::atomic::{AtomicBool, Ordering};
    let serving = std::sync::Arc::new(AtomicBool::new(false));
    let (sender, received) = std::sync::mpsc::channel();
    let started = serving.clone();
    std::thread::spawn(move || loop {
        let signal = wait_for_stop(&signals);
        if !started.load(Ordering::SeqCst) {
            // Nothing was served yet, so nothing is cut short: whatever the start wrote is
            // recovered at the next start, as after any stop.
            ringpost_daemon::log_info!("ringpostd: {signal} while starting: stopped before serving");
            std::process::exit(0);
        }
        if sender.send(signal).is_err() {
            return;
        }
    });
    StopSignals { received, serving }
}

impl StopSignals {
    /// The daemon serves: from now on a signal stops it gracefully.
    fn serving(&self) {
        self.serving.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn next(&self) -> nix::sys::signal::Signal {
        self.received.recv().expect("the signal thread runs as long as the process")
    }
}

/// Tells systemd how the daemon is, for a unit of `Type=notify`: `READY=1` once it serves,
/// `STOPPING=1` as it begins to stop. systemd's protocol (sd_notify(3)): one datagram to the
/// unix socket `$NOTIFY_SOCKET` names, a path or, after `@`, an abstract name. Without the
/// variable (not started by systemd) nothing is sent; a failure is logged, since systemd then
/// waits for the start until its timeout.
fn notify_systemd(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr as UnixAddress, UnixDatagram};
    let Some(name) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let name = name.as_bytes();
    let address = match name.strip_prefix(b"@") {
        Some(abstract_name) => UnixAddress::from_abstract_name(abstract_name),
        None => UnixAddress::from_pathname(std::ffi::OsStr::from_bytes(name)),
    };
    let sent = address
        .and_then(|address| UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &address).map(|_| ()));
    if let Err(error) = sent {
        ringpost_daemon::log_warn!(
            "ringpostd: WARNING: telling systemd {state} through NOTIFY_SOCKET={}: {error}",
            String::from_utf8_lossy(name)
        );
    }
}

/// Removes `switch` from `arguments`; whether it was there.
fn take_switch(arguments: &mut Vec<String>, switch: &str) -> bool {
    let before = arguments.len();
    arguments.retain(|argument| argument != switch);
    arguments.len() != before
}

/// Removes `option` and its value from `arguments`; the value, if it was there.
fn take_option(arguments: &mut Vec<String>, option: &str) -> Option<String> {
    let index = arguments.iter().position(|argument| argument == option)?;
    if index + 1 >= arguments.len() {
        usage_error(&format!("{option} needs a value"));
    }
    let value = arguments.remove(index + 1);
    arguments.remove(index);
    Some(value)
}

/// The log's level and format: the flags, else the environment, else info and text. Returns
/// their names, for `--print-config`.
fn configure_logging(flags: &Flags) -> (&'static str, &'static str) {
    use ringpost_daemon::logging::{configure, Format, Level};
    let level = flags.log_level.clone().or_else(|| std::env::var("RINGPOST_LOG").ok());
    let level: Level = match level.as_deref().map(str::parse).transpose() {
        Ok(level) => level.unwrap_or(Level::Info),
        Err(why) => usage_error(&format!("--log-level (or RINGPOST_LOG): {why}")),
    };
    let format = flags.log_format.clone().or_else(|| std::env::var("RINGPOST_LOG_FORMAT").ok());
    let format: Format = match format.as_deref().map(str::parse).transpose() {
        Ok(format) => format.unwrap_or(Format::Text),
        Err(why) => usage_error(&format!("--log-format (or RINGPOST_LOG_FORMAT): {why}")),
    };
    configure(level, format);
    (level.name(), format.name())
}

/// The flags, and whether to print the settings (`--print-config`) rather than start, or the
/// process ends: `--help` prints and exits 0, a bad command line exits `EXIT_USAGE` (argh's own
/// `from_env` would exit 1, which the scheme gives to failures). `--config FILE` adds the
/// file's settings, each checked (`settings::file_arguments`).
fn parse_flags() -> (Flags, bool) {
    let mut arguments: Vec<String> = std::env::args().collect();
    if arguments.get(1).map(String::as_str) == Some("--version") {
        println!("ringpostd {}", env!("CARGO_PKG_VERSION"));
        std::process::exit(0);
    }
    let print_config = take_switch(&mut arguments, "--print-config");
    if let Some(path) = take_option(&mut arguments, "--config") {
        let from_file =
            settings::file_arguments(&path, &arguments[1..]).unwrap_or_else(|why| usage_error(&why));
        arguments.splice(1..1, from_file);
    }
    let words: Vec<&str> = arguments.iter().map(String::as_str).collect();
    let (command, rest) = words.split_first().map_or(("ringpostd", &[][..]), |(first, rest)| (*first, rest));
    match <Flags as argh::FromArgs>::from_args(&[command], rest) {
        Ok(flags) => (flags, print_config),
        Err(early) => match early.status {
            Ok(()) => {
                println!("{}", early.output);
                std::process::exit(0);
            }
            Err(()) => {
                eprintln!("{}", early.output);
                std::process::exit(EXIT_USAGE);
            }
        },
    }
}

fn main() {
    // A message store is its owner's alone: files 0600 and folders 0700, whatever the
    // invoking shell's umask (commonly 022, which made them 0644 and 0755).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let (flags, print_config) = parse_flags();
    let log = configure_logging(&flags);
    let signals = block_handled_signals();
    // A shard that panics leaves the others serving a half-working process; stop everything
    // instead, so a supervisor restarts it and recovery runs (`fail_stop`).
    ringpost_daemon::fail_stop::install(None).unwrap_or_else(|why| usage_error(&why));
    let config = config_from_flags(&flags);
    if print_config {
        print!("{}", settings::print(&flags, &config, log));
        std::process::exit(0);
    }
    let open_files_before = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok();
    let (shards, data_dirs) = (config.shards, config.data_dirs.clone());
    warn_if_io_memory_cannot_be_registered(shards, config.io_memory_bytes);
    let signals = watch_signals(signals);
    let daemon = match ringpost_daemon::start(config) {
        Ok(daemon) => {
            signals.serving();
            daemon
        }
        Err(error) => {
            ringpost_daemon::log_error!("ringpostd: cannot start: {error}");
            std::process::exit(EXIT_FAILURE);
        }
    };
    announce(&daemon, shards, &data_dirs, open_files_before);
    if let Some(path) = &flags.ready_file {
        write_ready_file(path, &daemon);
    }
    notify_systemd("READY=1");
    stop_on_signal(daemon, signals)
}

/// The daemon's configuration from the flags; a flag out of range ends the process with a
/// usage error.
fn config_from_flags(flags: &Flags) -> ringpost_daemon::Config {
    if flags.balance_factor <= 1.0 || !flags.balance_factor.is_finite() {
        usage_error("--balance-factor must be a number above 1");
    }
    let data_dirs =
        if flags.data_dir.is_empty() { vec![PathBuf::from("ringpost-data")] } else { flags.data_dir.clone() };
    let listen = listen_address(&flags.listen).unwrap_or_else(|why| usage_error(&why));
    let mut config = ringpost_daemon::Config::new(listen, data_dirs[0].clone());
    config.advertise = flags.advertise.clone().or_else(|| host_name(&flags.listen));
    if let Some(host) = &config.advertise {
        let name = !host.is_empty()
            && host.chars().all(|character| character.is_ascii_alphanumeric() || "-.".contains(character));
        if !name && host.parse::<std::net::IpAddr>().is_err() {
            usage_error(&format!("--advertise {host}: give a host name or address, without a port"));
        }
    }
    config.data_dirs = data_dirs.clone();
    if let Some(shards) = flags.shards {
        if shards == 0 {
            usage_error("--shards must be at least 1");
        }
        config.shards = shards;
        config.io_memory_bytes = ringpost_daemon::io_memory_bytes_for(shards);
    }
    config.balance_factor = flags.balance_factor;
    if let Some(bytes) = flags.segment_bytes_max {
        if bytes < 64 * 1024 || !bytes.is_multiple_of(4096) {
            usage_error("--segment-bytes-max must be a multiple of 4096 of at least 65536");
        }
        config.log.segment_bytes_max = bytes;
        config.log.segment_bytes_initial = config.log.segment_bytes_initial.min(bytes);
    }
    if let Some(mib) = flags.io_memory_mib {
        if !(1..=IO_MEMORY_MIB_MAX).contains(&mib) {
            usage_error(&format!("--io-memory-mib must be from 1 to {IO_MEMORY_MIB_MAX}"));
        }
        config.io_memory_bytes = mib << 20;
    }
    config.pin_shards = !flags.no_pin;
    config.quarantine_damaged = flags.quarantine_damaged;
    config.connections = connection_limits(flags);
    config.catalog_limits = catalog_limits(flags);
    config.outstanding = outstanding_limits(flags);
    config.follow_thresholds = follow_thresholds(flags);
    config.publish_rate = ringpost_daemon::topic::rate::PublishRateLimits {
        messages_per_second: flags.publish_messages_per_second_topic_max.unwrap_or(0),
        bytes_per_second: flags.publish_kib_per_second_topic_max.unwrap_or(0).saturating_mul(1024),
    };
    config.grpc.listen = match flags.grpc_listen.as_str() {
        "off" => None,
        text => Some(
            listen_address(text)
                .unwrap_or_else(|why| usage_error(&why.replacen("--listen", "--grpc-listen", 1))),
        ),
    };
    config.grpc.rest_listen = match flags.rest_listen.as_str() {
        "off" => None,
        text => Some(
            listen_address(text)
                .unwrap_or_else(|why| usage_error(&why.replacen("--listen", "--rest-listen", 1))),
        ),
    };
    config.push_ca_file = flags.push_ca_file.clone();
    config.http_listen = match flags.http_listen.as_str() {
        "off" => None,
        text => Some(
            listen_address(text)
                .unwrap_or_else(|why| usage_error(&why.replacen("--listen", "--http-listen", 1))),
        ),
    };
    if flags.push_token_issuer.is_empty() {
        usage_error("--push-token-issuer must not be empty: receivers check the issuer");
    }
    config.push_token_issuer = flags.push_token_issuer.clone();
    if let Some(threads) = flags.grpc_threads {
        if threads == 0 {
            usage_error("--grpc-threads must be at least 1");
        }
        config.grpc.threads = threads;
    }
    if let Some(seconds) = flags.grpc_idle_deadline_seconds {
        if seconds == 0 {
            usage_error("--grpc-idle-deadline-seconds must be at least 1");
        }
        config.grpc.idle_deadline = Duration::from_secs(seconds);
    }
    (config.access, config.tls) =
        security_settings(flags, listen, [config.grpc.listen, config.grpc.rest_listen]);
    config.cluster = cluster_settings(flags, config.access.mode, config.tls.is_some());
    // Checked here as well as at the start, so that --print-config refuses what a start would.
    if let Err(why) = ringpost_daemon::node::check_data_directories(&config.data_dirs) {
        usage_error(&format!("--data-dir: {why}"));
    }
    config
}

/// The cluster's settings from `--cluster` and the flags that go with it; None for a node
/// alone (and then none of those flags may be given).
fn cluster_settings(
    flags: &Flags,
    access_mode: ringpost_daemon::auth::Mode,
    tls: bool,
) -> Option<ringpost_daemon::ClusterSettings> {
    let Some(list) = &flags.cluster else {
        if flags.node_id != 1 {
            usage_error("--node-id needs --cluster");
        } else if flags.join {
            usage_error("--join needs --cluster");
        } else if flags.cluster_ca.is_some() {
            usage_error("--cluster-ca needs --cluster");
        }
        return None;
    };
    let addresses = list
        .split(',')
        .map(|address| {
            listen_address(address.trim())
                .unwrap_or_else(|why| usage_error(&why.replacen("--listen", "--cluster", 1)))
        })
        .collect();
    let secret = flags.cluster_secret_file.as_ref().map(|path| {
        let text = std::fs::read_to_string(path).unwrap_or_else(|error| {
            usage_error(&format!("--cluster-secret-file {}: {error}", path.display()))
        });
        let secret = text.trim().to_owned();
        if secret.len() < CLUSTER_SECRET_BYTES_MIN {
            usage_error(&format!(
                "--cluster-secret-file {}: the secret is {} bytes; give at least {CLUSTER_SECRET_BYTES_MIN}",
                path.display(),
                secret.len()
            ));
        }
        secret
    });
    if secret.is_none() && access_mode != ringpost_daemon::auth::Mode::Off {
        usage_error(
            "--cluster needs --cluster-secret-file while auth is on (the default off loopback): \
             without it, anyone who reaches a cluster port could act as a node",
        );
    }
    if flags.cluster_ca.is_some() && !tls {
        usage_error(
            "--cluster-ca is the CA of the nodes' TLS certificates: give --tls-cert and --tls-key too",
        );
    }
    if let Some(ca) = &flags.cluster_ca {
        if let Err(why) = ringpost_daemon::net::tls::replication_client_config(ca) {
            usage_error(&format!("--cluster-ca: {why}"));
        }
    }
    let cluster = ringpost_daemon::ClusterSettings {
        node_id: ringpost_daemon::ids::NodeId::new(flags.node_id),
        addresses,
        secret,
        ca: flags.cluster_ca.clone(),
        join: flags.join,
    };
    if let Err(why) = cluster.check() {
        usage_error(&why);
    }
    Some(cluster)
}

/// Logs where the daemon serves, and that it raised the open-file limit if it did.
fn announce(
    daemon: &ringpost_daemon::Daemon,
    shards: usize,
    data_dirs: &[PathBuf],
    open_files_before: Option<(u64, u64)>,
) {
    // The daemon raises its soft open-file limit as it starts; say so, since every connection
    // takes a descriptor and the limits on connections are only as good as that one.
    let open_files_now = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok();
    if let (Some((before, _)), Some((now, hard))) = (open_files_before, open_files_now) {
        if now != before {
            ringpost_daemon::log_info!(
                "ringpostd: raised the open-file limit from {before} to {now} (hard limit {hard})"
            );
        }
    }
    let forwarders: Vec<String> = daemon.forwarder_addresses.iter().map(|a| a.to_string()).collect();
    let mut grpc = match daemon.grpc_address {
        Some(address) => format!("; Pub/Sub's gRPC API on {address}"),
        None => String::new(),
    };
    if let Some(address) = daemon.rest_address {
        grpc.push_str(&format!("; Pub/Sub's REST API on http://{address}"));
    }
    if let Some(address) = daemon.http_address {
        grpc.push_str(&format!("; metrics on http://{address}/metrics"));
    }
    ringpost_daemon::log_info!(
        "ringpostd: serving on {} (router) with {shards} forwarder shard(s) on {}{grpc}; data in {}",
        daemon.router_address,
        forwarders.join(", "),
        data_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    );
}

/// Writes the addresses the daemon serves on to `--ready-file`, whole or not at all (a
/// temporary file renamed over it).
fn write_ready_file(path: &std::path::Path, daemon: &ringpost_daemon::Daemon) {
    let temporary = path.with_extension("tmp");
    // The router's address on the first line; the gRPC API's and the monitoring
    // endpoint's, when served, on the lines after it.
    // Each line ends with a newline, as a text file's lines do (`read`, `wc -l`).
    let mut contents = format!("{}\n", daemon.router_address);
    if let Some(grpc) = daemon.grpc_address {
        contents.push_str(&format!("grpc {grpc}\n"));
    }
    if let Some(http) = daemon.http_address {
        contents.push_str(&format!("http {http}\n"));
    }
    if let Some(rest) = daemon.rest_address {
        contents.push_str(&format!("rest {rest}\n"));
    }
    if let Err(error) = std::fs::write(&temporary, contents).and_then(|_| std::fs::rename(&temporary, path)) {
        ringpost_daemon::log_error!("ringpostd: cannot start: writing {}: {error}", path.display());
        std::process::exit(EXIT_FAILURE);
    }
}

/// Waits for SIGTERM or SIGINT, then stops the daemon within `SHUTDOWN_GRACE` (a second
/// signal stops it at once) and ends the process.
fn stop_on_signal(daemon: ringpost_daemon::Daemon, signals: StopSignals) -> ! {
    let signal = signals.next();
    notify_systemd("STOPPING=1");
    ringpost_daemon::log_info!(
        "ringpostd: {signal}: stopping: no new connections; requests running finish and are answered, streams end \
         with Unavailable (at most {} s; a second signal stops at once)",
        SHUTDOWN_GRACE.as_secs()
    );
    // A second SIGTERM or SIGINT while stopping ends the process at once.
    std::thread::spawn(move || {
        let signal = signals.next();
        ringpost_daemon::log_info!("ringpostd: {signal} again: stopping at once");
        std::process::exit(EXIT_FAILURE);
    });
    match daemon.shutdown(SHUTDOWN_GRACE) {
        Ok(stopped) => {
            let connections: usize = stopped.connections.iter().map(|(_, count)| count).sum();
            ringpost_daemon::log_info!(
                "ringpostd: stopped in {} ms; {connections} connection(s) answered and closed",
                stopped.took.as_millis()
            );
            std::process::exit(0);
        }
        Err(why) => {
            ringpost_daemon::log_error!(
                "ringpostd: ERROR: stopping by force: {why}; nothing acknowledged is lost"
            );
            std::process::exit(EXIT_FAILURE);
        }
    }
}
