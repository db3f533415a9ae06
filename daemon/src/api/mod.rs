//! The typed seam between the protocols and the domain: operations on domain types, with no
//! frames and no encoding, which the native protocol's handlers call and which another protocol
//! (a gRPC gateway) can call the same way.

pub mod cluster;
pub mod data;
pub mod error;
pub mod limits;
pub mod stats;
pub mod validate;

pub use error::{Code, Status};

pub mod control;
