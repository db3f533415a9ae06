//! `ringpostd`: a durable Pub/Sub daemon, thread-per-core.
//!
//! [`start`] spawns one glommio executor per forwarder shard (pinned to a core) and one for the
//! router shard, wires them with bounded control channels, recovers the catalog and every
//! topic, and returns once every shard is serving; that wiring is `node`'s. See
//! ARCHITECTURE.md for the map.

pub mod api;
#[cfg(test)]
mod architecture_doc_tests;
pub mod auth;
pub mod catalog;
/// Placement lives with the catalog, which records each decision; this name stays for callers.
pub use catalog::placement;
pub mod clock;
#[cfg(test)]
mod cluster_sim_tests;
pub mod codec;
pub mod control;
pub mod dispatch;
pub mod fail_stop;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod ids;
#[cfg(test)]
mod limits_doc_tests;
pub mod log;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod node;
#[cfg(any(test, feature = "profiling"))]
pub mod profiling;
pub mod protocol;
pub mod push;
pub mod replication;
#[cfg(test)]
mod replication_sim_tests;
pub mod router;
pub mod runtime;
pub mod schema;
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

/// What `ringpostd`, the tools and the tests start a daemon with.
pub use node::{
    forwarder_port, host_and_port, io_memory_bytes_for, start, ClusterSettings, Config, Daemon, Stopped,
    IO_MEMORY_BYTES_DEFAULT, OPEN_FILES_WANTED, ROUTER_IO_MEMORY_BYTES,
};
