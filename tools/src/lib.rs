//! Shared pieces of the `ringpost` CLI and `ringpost-bench`.

pub mod bench;
pub mod disk;
pub mod json;
pub mod loopback;
