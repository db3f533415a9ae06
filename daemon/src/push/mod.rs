//! Push subscriptions: the forwarder that serves a push subscription delivers its messages to
//! the subscription's HTTP endpoint, one POST per message, and takes the endpoint's answer as
//! the acknowledgement.

pub mod token;

use crate::catalog::OidcToken;

/// Signs the OIDC tokens push requests carry (`Authorization: Bearer`) with the daemon's key.
/// Called where the HTTP requests are made, on any thread.
pub trait TokenSigner: Send + Sync {
    /// A JWT claiming `token`'s service account, for `token`'s audience (`endpoint`, the URL
    /// pushed to, when it names none), issued at `issued_at_seconds` (Unix time).
    fn sign(&self, token: &OidcToken, endpoint: &str, issued_at_seconds: u64) -> Result<String, String>;
}
