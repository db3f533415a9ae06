//! `ringpostd`: runs the daemon. With no flags it serves on 127.0.0.1:7450 with its data in
//! `./ringpost-data`.

use argh::FromArgs;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Ringpost: a durable, thread-per-core Pub/Sub daemon.
#[derive(FromArgs)]
struct Flags {
    /// the router's address; forwarder shards listen on the next ports (default 127.0.0.1:7450;
    /// port 0 picks free ports for everything)
    #[argh(option, default = "\"127.0.0.1:7450\".parse().unwrap()")]
    listen: SocketAddr,
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
    /// write the router's address to this file once the daemon serves (for scripts and tests)
    #[argh(option)]
    ready_file: Option<PathBuf>,
    /// start even if some topics' logs cannot be recovered (damage no copy can mend): each
    /// such topic is quarantined, answering DataLoss with the reason, its files left as they
    /// are, while the other topics are served; without it the daemon refuses to start
    #[argh(switch)]
    quarantine_damaged: bool,
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
        eprintln!(
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

fn main() {
    let flags: Flags = argh::from_env();
    // A shard that panics leaves the others serving a half-working process; stop everything
    // instead, so a supervisor restarts it and recovery runs.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    if flags.balance_factor <= 1.0 || !flags.balance_factor.is_finite() {
        eprintln!("ringpostd: InvalidArgument: --balance-factor must be a number above 1");
        std::process::exit(2);
    }
    let data_dirs =
        if flags.data_dir.is_empty() { vec![PathBuf::from("ringpost-data")] } else { flags.data_dir.clone() };
    let mut config = ringpost_daemon::Config::new(flags.listen, data_dirs[0].clone());
    config.data_dirs = data_dirs.clone();
    if let Some(shards) = flags.shards {
        if shards == 0 {
            eprintln!("ringpostd: InvalidArgument: --shards must be at least 1");
            std::process::exit(2);
        }
        config.shards = shards;
        config.io_memory_bytes = ringpost_daemon::io_memory_bytes_for(shards);
    }
    config.balance_factor = flags.balance_factor;
    if let Some(bytes) = flags.segment_bytes_max {
        if bytes < 64 * 1024 || !bytes.is_multiple_of(4096) {
            eprintln!("ringpostd: InvalidArgument: --segment-bytes-max must be a multiple of 4096 of at least 65536");
            std::process::exit(2);
        }
        config.log.segment_bytes_max = bytes;
        config.log.segment_bytes_initial = config.log.segment_bytes_initial.min(bytes);
    }
    if let Some(mib) = flags.io_memory_mib {
        if !(1..=IO_MEMORY_MIB_MAX).contains(&mib) {
            eprintln!("ringpostd: InvalidArgument: --io-memory-mib must be from 1 to {IO_MEMORY_MIB_MAX}");
            std::process::exit(2);
        }
        config.io_memory_bytes = mib << 20;
    }
    config.pin_shards = !flags.no_pin;
    config.quarantine_damaged = flags.quarantine_damaged;
    let shards = config.shards;
    warn_if_io_memory_cannot_be_registered(shards, config.io_memory_bytes);
    let daemon = match ringpost_daemon::start(config) {
        Ok(daemon) => daemon,
        Err(error) => {
            eprintln!("ringpostd: cannot start: {error}");
            std::process::exit(1);
        }
    };
    let forwarders: Vec<String> = daemon.forwarder_addresses.iter().map(|a| a.to_string()).collect();
    eprintln!(
        "ringpostd: serving on {} (router) with {shards} forwarder shard(s) on {}; data in {}",
        daemon.router_address,
        forwarders.join(", "),
        data_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    if let Some(path) = flags.ready_file {
        let temporary = path.with_extension("tmp");
        if let Err(error) = std::fs::write(&temporary, daemon.router_address.to_string())
            .and_then(|_| std::fs::rename(&temporary, &path))
        {
            eprintln!("ringpostd: writing {}: {error}", path.display());
            std::process::exit(1);
        }
    }
    daemon.wait();
}
