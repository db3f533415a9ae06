//! Ringpost's native protocol: rkyv frames over TCP (`ringpost_wire`). The only part of the
//! daemon, with `api::limits` and `api::error`, that names the wire crate.

pub mod forwarder;
pub mod router;
pub mod server;
