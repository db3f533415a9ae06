//! A daemon inside the benchmark process, for a one-command measurement.

use super::Failure;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Scratch data directories are made here rather than under /tmp, which is often a tmpfs: a
/// tmpfs has no real fdatasync and would make durable publishes look free.
pub const SCRATCH_PARENT: &str = "/var/tmp";

/// A name that no other run of this or another process picks: the pid and the clock.
pub fn unique_suffix() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_nanos()).unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// A data directory made for one run and removed when dropped, so that a run leaves nothing
/// behind, also when it fails or panics.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    pub fn create(parent: &Path) -> Result<ScratchDir, Failure> {
        let path = parent.join(format!("ringpost-bench-{}", unique_suffix()));
        // create_dir, not create_dir_all: an existing directory is someone else's, never ours
        // to remove.
        std::fs::create_dir(&path)
            .map_err(|error| Failure::runtime(format!("creating {}: {error}", path.display())))?;
        Ok(ScratchDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            crate::errln!("warning: could not remove {}: {error}", self.path.display());
        }
    }
}

/// A thread that reads the daemon's `/metrics` at a fixed interval while a run loads it, as a
/// Prometheus server would: for measuring what scraping costs the hot path.
pub struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(u64, u64), String>>>,
}

// Only a daemon started here is scraped.
#[cfg(feature = "embedded")]
impl Scraper {
    fn start(address: std::net::SocketAddr, every: Duration) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut scrapes, mut bytes) = (0u64, 0u64);
            while !stopping.load(Ordering::Relaxed) {
                let started = std::time::Instant::now();
                bytes += scrape(address)?;
                scrapes += 1;
                // Sleeps in short steps, so that a stop does not wait out a whole interval.
                while started.elapsed() < every && !stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10).min(every));
                }
            }
            Ok((scrapes, bytes))
        });
        Scraper { stop, thread: Some(thread) }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|thread| thread.join()) {
            Some(Ok(Ok((scrapes, bytes)))) => {
                crate::errln!("scraped /metrics {scrapes} times, {} bytes each", bytes / scrapes.max(1))
            }
            Some(Ok(Err(error))) => crate::errln!("warning: scraping /metrics stopped: {error}"),
            _ => crate::errln!("warning: the scraping thread panicked"),
        }
    }
}

/// One GET of `/metrics`, read whole; its length.
#[cfg(feature = "embedded")]
fn scrape(address: std::net::SocketAddr) -> Result<u64, String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .map_err(|error| format!("connecting to {address}: {error}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|error| error.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .map_err(|error| format!("asking {address}: {error}"))?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(|error| format!("reading from {address}: {error}"))?;
    if !response.starts_with(b"HTTP/1.1 200") {
        let head = String::from_utf8_lossy(&response[..response.len().min(80)]).into_owned();
        return Err(format!("{address} answered {head:?}"));
    }
    Ok(response.len() as u64)
}

/// The daemon a run starts in this process.
#[cfg(feature = "embedded")]
type Daemon = ringpost_daemon::Daemon;
/// Built without the `embedded` feature there is no daemon to start, and no value of this type.
#[cfg(not(feature = "embedded"))]
type Daemon = std::convert::Infallible;

/// A running in-process daemon and, unless the user named one, the scratch directory it uses.
pub struct EmbeddedDaemon {
    /// The router's address, as a client connects to it.
    pub address: String,
    /// Where its gRPC API serves, when asked for.
    pub grpc_address: Option<String>,
    /// Where its REST interface serves, when asked for.
    pub rest_address: Option<String>,
    pub data_dir: PathBuf,
    // Field order matters: the scraper stops before the daemon, and the daemon is dropped
    // before its scratch directory is removed.
    _scraper: Option<Scraper>,
    _daemon: Daemon,
    scratch: Option<ScratchDir>,
}

impl EmbeddedDaemon {
    /// Starts a daemon on ephemeral loopback ports, with one forwarder shard per core. With no
    /// `data_dir`, it gets a fresh directory under [`SCRATCH_PARENT`] that is removed on drop.
    /// With `scrape_every`, it serves its monitoring endpoint and a thread scrapes it at that
    /// interval until the daemon is dropped. `rest` serves the REST interface, beside the gRPC
    /// API it needs.
    #[cfg(feature = "embedded")]
    pub fn start(
        data_dir: Option<&Path>,
        grpc: bool,
        rest: bool,
        scrape_every: Option<Duration>,
    ) -> Result<EmbeddedDaemon, Failure> {
        let scratch = match data_dir {
            Some(_) => None,
            None => Some(ScratchDir::create(Path::new(SCRATCH_PARENT))?),
        };
        let data_dir = match (&scratch, data_dir) {
            (Some(scratch), _) => scratch.path().to_path_buf(),
            (None, Some(data_dir)) => data_dir.to_path_buf(),
            (None, None) => unreachable!("a scratch directory is made when none is given"),
        };
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let mut config = ringpost_daemon::Config::new(listen, data_dir.clone());
        if grpc || rest {
            config.grpc.listen = Some(listen);
        }
        if rest {
            config.grpc.rest_listen = Some(listen);
        }
        if scrape_every.is_some() {
            config.http_listen = Some(listen);
        }
        // A panic on any of the daemon's threads stops the process, as it stops ringpostd
        // (`fail_stop`): a run with a dead shard would measure half a daemon. The scratch
        // directory goes first, as it does when a run ends.
        let scratch_path = scratch.as_ref().map(|scratch| scratch.path().to_path_buf());
        let cleanup = scratch_path.map(|path| -> Box<dyn Fn() + Send + Sync> {
            Box::new(move || {
                let _ = std::fs::remove_dir_all(&path);
            })
        });
        ringpost_daemon::fail_stop::install(cleanup).map_err(Failure::usage)?;
        let daemon = ringpost_daemon::start(config)
            .map_err(|error| Failure::runtime(format!("starting the embedded daemon: {error}")))?;
        let scraper = match (scrape_every, daemon.http_address) {
            (Some(every), Some(address)) => {
                crate::errln!("scraping http://{address}/metrics every {} ms", every.as_millis());
                Some(Scraper::start(address, every))
            }
            _ => None,
        };
        Ok(EmbeddedDaemon {
            address: daemon.router_address.to_string(),
            grpc_address: daemon.grpc_address.map(|address| address.to_string()),
            rest_address: daemon.rest_address.map(|address| address.to_string()),
            data_dir,
            _scraper: scraper,
            _daemon: daemon,
            scratch,
        })
    }

    /// Built without the `embedded` feature (the daemon and its runtimes left out), `--embedded`
    /// is refused by name.
    #[cfg(not(feature = "embedded"))]
    pub fn start(
        _data_dir: Option<&Path>,
        _grpc: bool,
        _rest: bool,
        _scrape_every: Option<Duration>,
    ) -> Result<EmbeddedDaemon, Failure> {
        Err(Failure::usage(
            "InvalidArgument: --embedded: this ringpost-bench is built without the daemon (the \
             `embedded` feature of ringpost-tools, on by default); give --server",
        ))
    }

    /// Whether the data directory is removed when the daemon is dropped.
    pub fn is_scratch(&self) -> bool {
        self.scratch.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_dir_is_removed_on_drop() {
        let parent = std::env::temp_dir();
        let scratch = ScratchDir::create(&parent).unwrap();
        let path = scratch.path().to_path_buf();
        std::fs::write(path.join("file"), b"data").unwrap();
        assert!(path.is_dir());
        drop(scratch);
        assert!(!path.exists());
    }
}
