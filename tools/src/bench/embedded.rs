//! A daemon inside the benchmark process, for a one-command measurement.

use super::Failure;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// A running in-process daemon and, unless the user named one, the scratch directory it uses.
pub struct EmbeddedDaemon {
    /// The router's address, as a client connects to it.
    pub address: String,
    /// Where its gRPC API serves, when asked for.
    pub grpc_address: Option<String>,
    pub data_dir: PathBuf,
    // Field order matters: the daemon is dropped before its scratch directory is removed.
    _daemon: ringpost_daemon::Daemon,
    scratch: Option<ScratchDir>,
}

impl EmbeddedDaemon {
    /// Starts a daemon on ephemeral loopback ports, with one forwarder shard per core. With no
    /// `data_dir`, it gets a fresh directory under [`SCRATCH_PARENT`] that is removed on drop.
    pub fn start(data_dir: Option<&Path>, grpc: bool) -> Result<EmbeddedDaemon, Failure> {
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
        if grpc {
            config.grpc.listen = Some(listen);
        }
        let daemon = ringpost_daemon::start(config)
            .map_err(|error| Failure::runtime(format!("starting the embedded daemon: {error}")))?;
        Ok(EmbeddedDaemon {
            address: daemon.router_address.to_string(),
            grpc_address: daemon.grpc_address.map(|address| address.to_string()),
            data_dir,
            _daemon: daemon,
            scratch,
        })
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
