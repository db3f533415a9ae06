//! Push subscriptions: the forwarder that serves a push subscription delivers its messages to
//! the subscription's HTTP endpoint, one POST per message, and takes the endpoint's answer as
//! the acknowledgement.
//!
//! The pushing is a consumer the daemon runs itself: on the shard that serves a push
//! subscription, a task (`task.rs`) opens a delivery stream through the shard's own
//! `DataPlane`, as a client's streaming pull would, builds each message's request
//! (`body.rs`), hands it to the HTTP client (the `Pusher` seam) and acknowledges the message
//! on a success status, or gives it back (a nack, under the subscription's retry policy and
//! dead-letter count) on anything else. How many pushes are outstanding is the window's
//! decision (`window.rs`). The HTTP client runs on a tokio thread of its own (`client.rs`);
//! `token.rs` signs the OIDC tokens it sends. `body.rs` and `window.rs` are without I/O.

pub mod body;
pub mod client;
pub mod keys;
pub mod task;
#[cfg(test)]
mod tests;
pub mod token;
pub mod window;

use crate::catalog::OidcToken;
use std::time::Duration;

pub use body::PushBody;
pub use task::ShardPushing;

/// Signs the OIDC tokens push requests carry (`Authorization: Bearer`) with the daemon's key.
/// Called where the HTTP requests are made, on any thread.
pub trait TokenSigner: Send + Sync {
    /// A JWT claiming `token`'s service account, for `token`'s audience (`endpoint`, the URL
    /// pushed to, when it names none), issued at `issued_at_seconds` (Unix time).
    fn sign(&self, token: &OidcToken, endpoint: &str, issued_at_seconds: u64) -> Result<String, String>;
}

/// One push, as it crosses from a shard to the HTTP client: owned and `Send`.
#[derive(Debug, Clone)]
pub struct PushRequest {
    pub endpoint: String,
    pub body: PushBody,
    /// The subscription's ack deadline: an endpoint that has not answered by then has not
    /// acknowledged, as Pub/Sub has it.
    pub timeout: Duration,
    /// When set, the client signs a token for it (`TokenSigner`) and sends it as
    /// `Authorization: Bearer`.
    pub oidc_token: Option<OidcToken>,
}

/// How a push ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    /// The endpoint answered with this HTTP status.
    Status(u16),
    /// No answer: the connection could not be made or broke (the reason), or the client
    /// could not take the request (its queue full, its thread gone).
    ConnectionError(String),
    /// No answer within the request's timeout.
    Timeout,
}

impl PushOutcome {
    /// Whether it acknowledges the message: Pub/Sub's 102, 200, 201, 202 and 204.
    pub fn acknowledges(&self) -> bool {
        matches!(self, PushOutcome::Status(102 | 200 | 201 | 202 | 204))
    }
}

/// The HTTP client, as the shards see it: pushes one request and answers how it ended. The
/// daemon's is on a tokio thread of its own (`client.rs`); tests put a fake in its place.
#[allow(async_fn_in_trait)]
pub trait Pusher: 'static {
    async fn push(&self, request: PushRequest) -> PushOutcome;
}
