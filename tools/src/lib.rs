//! Shared pieces of the `ringpost` CLI and `ringpost-bench`.

pub mod bench;
pub mod cli;
pub mod completions;
pub mod disk;
pub mod json;
pub mod loopback;
pub mod probe;
