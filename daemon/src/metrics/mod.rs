//! What a shard measures about itself for the stats: latencies, per-second rates, and what the
//! kernel says about the process.

pub mod exposition;
pub mod histogram;
pub mod latency;
pub mod process;
pub mod rate;
pub mod requests;
pub mod shard;
