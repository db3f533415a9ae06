//! Ringpost's native protocol: rkyv frames over TCP (`ringpost_wire`). The only part of the
//! daemon that names the wire crate: its handlers convert frames to the domain's operations
//! (`api`) and back, and the domain's limits, errors and stats to the wire's.

pub mod forwarder;
mod limits;
pub mod peer;
pub mod relay;
pub mod replica;
pub mod router;
pub mod server;
mod stats;
mod status;
pub mod tls;
