//! Pub/Sub's limits, as one table shared by the server, the client and the protocol's
//! validation: the domain reads them from here so that only this module and `protocol::native`
//! name the wire crate.

pub use ringpost_wire::limits::*;
/// The checks of values against those limits, which are pure functions of plain values.
pub use ringpost_wire::validate::{effective_ack_deadline_seconds, validate_message, validate_name};
