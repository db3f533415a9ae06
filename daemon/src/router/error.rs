//! The router's errors: why a control-plane request was refused, each variant saying what its
//! caller does next. Each displays as the message its client reads; they become a `Status` in
//! one place (`api::error`), where the door and the protocols answer.

use crate::api::Status;
use crate::catalog::CatalogError;
use crate::ids::NodeId;

/// Why the router refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// What the request names does not exist (or no longer does): correct the name or create
    /// it first.
    #[error("{0}")]
    NotFound(String),
    /// What the request would create exists already: use it, or pick another name.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request itself is wrong, for the reason given: change it before sending it again.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is sound but the state refuses it (a detached subscription, a node that
    /// still holds topics): change that state first.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Another request is creating the same name right now: retry once it has finished.
    #[error("'{name}' is being created by another request")]
    BeingCreated { name: String },
    /// The record changed between reading it and deciding the change (a concurrent election,
    /// say): nothing was changed; retry.
    #[error("{0}")]
    ChangedMeanwhile(String),
    /// A limit of the catalog is reached: delete something first.
    #[error("{0}")]
    LimitReached(String),
    /// This node does not lead the catalog and decides nothing: carry the change to `leader`
    /// (its node and router's address) or, with none, try again once one is elected.
    #[error("{}", match leader {
        Some((leader, address)) => format!(
            "node {this_node} does not lead the catalog; node {leader} does (its router is at {address})"
        ),
        None => "the catalog has no leader (too few of its voters are reachable)".to_owned(),
    })]
    NotLeader { this_node: NodeId, leader: Option<(NodeId, String)> },
    /// What the request needs is out of reach for now (a forwarder, a node, a peer): retry
    /// later, here.
    #[error("{0}")]
    Unavailable(String),
    /// A node or forwarder asked on the way did not answer in time; what it was asked may or
    /// may not have been done: look, then retry.
    #[error("{0}")]
    NoAnswer(String),
    /// The update of `kind` `name` is durable in the catalog but its forwarder did not apply it
    /// (`why`): the next start applies it, and so does sending the update again.
    #[error(
        "the update of {kind} '{name}' is durable, but its forwarder did not apply it ({why}); \
         it applies at the next start, or when the update is sent again"
    )]
    NotApplied { kind: &'static str, name: String, why: Status },
    /// `error`, met while doing what `context` says: its caller acts on `error`.
    #[error("{context}: {error}")]
    Within { context: String, error: Box<ControlError> },
    /// The router is closing, or answered what it cannot have asked for: a bug or a shutdown.
    #[error("{0}")]
    Internal(String),
    /// The catalog did not decide the change: as the catalog's error says.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A refusal that reached the router already as a `Status`: a forwarder's answer on its
    /// control channel, another node's router's answer through the cluster port, or the
    /// validation of names and settings all protocols share (`api::control`). Passed on as it
    /// came, with its code and message.
    #[error("{}", .0.message)]
    Answered(Status),
}

impl From<ringpost_model::Invalid> for ControlError {
    /// The shared validation's refusals are all invalid arguments.
    fn from(invalid: ringpost_model::Invalid) -> ControlError {
        ControlError::InvalidArgument(invalid.message)
    }
}

impl From<Status> for ControlError {
    fn from(status: Status) -> ControlError {
        ControlError::Answered(status)
    }
}

impl ControlError {
    pub fn not_found(message: impl Into<String>) -> ControlError {
        ControlError::NotFound(message.into())
    }
    pub fn already_exists(message: impl Into<String>) -> ControlError {
        ControlError::AlreadyExists(message.into())
    }
    pub fn invalid_argument(message: impl Into<String>) -> ControlError {
        ControlError::InvalidArgument(message.into())
    }
    pub fn failed_precondition(message: impl Into<String>) -> ControlError {
        ControlError::FailedPrecondition(message.into())
    }
    pub fn unavailable(message: impl Into<String>) -> ControlError {
        ControlError::Unavailable(message.into())
    }
    pub fn no_answer(message: impl Into<String>) -> ControlError {
        ControlError::NoAnswer(message.into())
    }
    pub fn internal(message: impl Into<String>) -> ControlError {
        ControlError::Internal(message.into())
    }

    /// Whether a change may still be decided: its proposer neither knows it refused nor may
    /// undo what it prepared for it.
    pub fn is_undecided(&self) -> bool {
        match self {
            ControlError::Catalog(error) => error.is_undecided(),
            ControlError::Within { error, .. } => error.is_undecided(),
            _ => false,
        }
    }

    /// The code it answers with (`api::error` maps it).
    pub fn code(&self) -> crate::api::Code {
        Status::from(self.clone()).code
    }

    /// Whether what was asked of a forwarder is worth asking of the next one: its node or
    /// shard could not be reached, or it said it cannot serve now.
    pub fn is_unavailable(&self) -> bool {
        self.code() == crate::api::Code::Unavailable
    }

    /// `self`, met while doing what `context` says.
    pub fn within(self, context: impl Into<String>) -> ControlError {
        ControlError::Within { context: context.into(), error: Box::new(self) }
    }
}
