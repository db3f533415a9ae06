//! Ringpost's own protocol: frames in, typed calls, frames out.

pub mod router;
