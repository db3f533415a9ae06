//! What the node asks of the operating system at start: its data directories locked, its
//! ports bound (and handed to glommio), its open-file limit raised, and a stop socket per shard.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;

/// Waits, on the shard's executor, for the other end of `stop` to close (or write), then gives
/// the shard's stop order.
pub(super) fn stop_on_close(stop: std::os::unix::net::UnixStream, order: crate::sync::Stop) {
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
pub(super) fn lock_data_dir(data_dir: &std::path::Path) -> Result<std::fs::File, String> {
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

/// Binds `address`, which `port` describes (the flag that set it, and for a forwarder shard's
/// how it follows from the router's) so that a port in use is named as the user gave it.
pub(super) fn bind(address: SocketAddr, port: &str) -> Result<(StdListener, SocketAddr), String> {
    let started = crate::runtime::now();
    let listener = loop {
        match StdListener::bind(address) {
            Ok(listener) => break listener,
            // A daemon restarted at once after a crash finds its ports still held for a moment:
            // the kernel releases the sockets a dead process's io_uring held only once it has
            // torn the ring down, after the process is gone.
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && crate::runtime::now() - started < BIND_IN_USE_WAIT =>
            {
                std::thread::sleep(BIND_IN_USE_RETRY)
            }
            Err(error) => return Err(format!("binding {address}, {port}: {error}")),
        }
    };
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    Ok((listener, local))
}

/// How long a port found in use is tried again before the start fails (see `bind`), and how
/// often.
const BIND_IN_USE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const BIND_IN_USE_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Hands a listening std socket to the current glommio executor. Ports are bound with std
/// (without SO_REUSEPORT, which glommio's own bind sets) so that a second daemon on the same
/// port fails to start instead of silently sharing it.
pub(super) fn into_glommio(listener: StdListener) -> glommio::net::TcpListener {
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
pub(super) fn raise_open_file_limit() -> u64 {
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

/// Refuses data directories no majority can be counted in.
pub fn check_data_directories(data_dirs: &[PathBuf]) -> Result<(), String> {
    if data_dirs.is_empty() || data_dirs.len().is_multiple_of(2) {
        return Err(format!(
            "{} data directories given: give an odd number (1, 3, 5...), so that a majority is well defined",
            data_dirs.len()
        ));
    }
    if data_dirs.len() > crate::log::DATA_DIRECTORIES_MAX {
        return Err(format!(
            "{} data directories given; at most {} (DATA_DIRECTORIES_MAX)",
            data_dirs.len(),
            crate::log::DATA_DIRECTORIES_MAX
        ));
    }
    Ok(())
}
