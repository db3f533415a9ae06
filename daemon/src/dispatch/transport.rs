//! How the door reaches another node: the native protocol's cluster port in the daemon
//! (`net::peer::PeerPool`); any other network (an in-memory one in a simulation)
//! that carries an operation with its principal and brings back the outcome.

use super::{Operation, Outcome};
use crate::api::Status;
use crate::auth::Principal;
use crate::ids::NodeId;
use crate::router::PeerFuture;
use std::time::Duration;

/// Another node's answer to a carried operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// The catalog index that node had applied when it answered (`None`: none yet): the
    /// carrying node waits to apply as far before it answers its client.
    pub applied: Option<u64>,
    pub outcome: Result<Outcome, Status>,
}

pub trait NodeTransport {
    /// Runs `operation` on node `node` for `principal` (checked there, with that node's
    /// access file), within `timeout`. `Err`: it was not answered (the node is unreachable, or
    /// its answer did not decode), which the client may retry; a refusal is an `Ok` whose
    /// outcome is the error.
    fn carry(
        &self,
        node: NodeId,
        principal: &Principal,
        operation: &Operation,
        timeout: Duration,
    ) -> PeerFuture<Carried>;
}
