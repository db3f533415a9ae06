//! Why a pull, stream, acknowledgement or deadline change on a subscription failed as a whole
//! (an ack id refused alone is not an error of the request: it is an `InvalidAckId`). Each
//! variant says what the caller does next; `api::error` maps them onto the domain's codes.

use crate::log::LogError;
use std::rc::Rc;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionError {
    /// Its topic's replica here stopped leading: another replica serves it now, which the
    /// caller looks up again (as a retry, which is what clients do on `Unavailable`).
    #[error("subscription '{subscription}' is now served by its topic's new leader; look it up again")]
    Moved { subscription: Rc<str> },
    /// Detached from its topic (DetachSubscription): it delivers nothing again; a retry fails
    /// the same way.
    #[error("subscription '{subscription}' is detached")]
    Detached { subscription: Rc<str> },
    /// Deleted (or its topic was) while the request waited on it.
    #[error("subscription '{subscription}' was deleted")]
    Deleted { subscription: Rc<str> },
    /// The shard is stopping: the stream's messages are delivered again, and the caller opens
    /// the stream again (on this node once it is back, or another).
    #[error("ringpostd is stopping; open the stream again (its messages are delivered again)")]
    Stopping,
    /// Reading its messages or writing its journal failed; the log's error says whether to
    /// retry here, go elsewhere or give up.
    #[error("{0}")]
    Log(LogError),
}

impl From<LogError> for SubscriptionError {
    fn from(error: LogError) -> SubscriptionError {
        SubscriptionError::Log(error)
    }
}
