//! The catalog's errors: why a change was not decided, each variant saying what its caller does
//! next. They become a `Status` in one place (`api::error`), at the edge.

use crate::ids::NodeId;
use crate::log::LogError;
use std::time::Duration;

/// Why the catalog did not decide a change (or a change of its members), or could not do what
/// was asked of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// This node stopped leading the catalog while the change was in hand: nothing was decided
    /// here; carry the change to `leader` (when openraft names one) and propose it there.
    #[error("this node no longer leads the catalog; try again")]
    NotLeader { leader: Option<NodeId> },
    /// This node leads the catalog but has not heard from a majority of its `voters` for
    /// `since` (never, when None): nothing was proposed; retry once enough voters answer.
    #[error(
        "node {node} leads the catalog but has not heard from a majority of its {voters} voters{}: \
         too few are reachable to decide anything",
        since.map_or(String::new(), |since| format!(" for {:.1} s", since.as_secs_f64()))
    )]
    QuorumNotHeard { node: NodeId, voters: usize, since: Option<Duration> },
    /// The change was not decided within `waited`, and may still be: look before proposing it
    /// again (`is_undecided`).
    #[error(
        "the catalog did not decide the change within {} s (too few of its voters answer); \
         it may still be decided once they do",
        waited.as_secs()
    )]
    Undecided { waited: Duration },
    /// The change of the members (node `node_id`) was not decided within `waited`, and may
    /// still be: look at the cluster's status before asking again.
    #[error(
        "the catalog did not decide the change of its members (node {node_id}) within {} s; \
         it may still be decided: look with `ringpost cluster status`",
        waited.as_secs()
    )]
    MembershipUndecided { node_id: NodeId, waited: Duration },
    /// Node `node_id` is a learner now but did not catch up within `waited`: start it (with
    /// `--join`) and ask again.
    #[error(
        "node {node_id} is a learner of the catalog now, but did not catch up within {} s: \
         is it running, started with --join? Run the command again once it is",
        waited.as_secs()
    )]
    NotCaughtUp { node_id: NodeId, waited: Duration },
    /// openraft refused to commit the change for another reason (it is shutting down, say):
    /// retry later.
    #[error("the catalog did not commit the change: {0}")]
    NotCommitted(String),
    /// openraft refused the change of the members for another reason: retry later.
    #[error("changing the catalog's members (node {node_id}): {why}")]
    MembershipRefused { node_id: NodeId, why: String },
    /// openraft did not take the request to hand the leadership over: retry later.
    #[error("handing the catalog's leadership over: {0}")]
    TransferRefused(String),
    /// Applying the change found its name taken (a create decided meanwhile): nothing changed;
    /// the caller's resource exists already.
    #[error("{0}")]
    NameTaken(String),
    /// The catalog's own logs failed (rewriting a stale copy): as the log's error says. Its
    /// message is the one its `Status` carries, which says more than the log's own.
    #[error("{}", crate::api::Status::from(.0.clone()).message)]
    Storage(LogError),
}

impl From<LogError> for CatalogError {
    fn from(error: LogError) -> CatalogError {
        CatalogError::Storage(error)
    }
}

impl CatalogError {
    /// Whether the change may still be decided: its proposer neither knows it refused nor may
    /// undo what it prepared for it.
    pub fn is_undecided(&self) -> bool {
        matches!(self, CatalogError::Undecided { .. } | CatalogError::MembershipUndecided { .. })
    }
}
