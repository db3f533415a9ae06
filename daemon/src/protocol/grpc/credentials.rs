//! Who a gRPC request acts as. tonic's threads only carry what the request presented (a
//! bearer token, a verified client certificate's identity) to the shard; the shard decides
//! with its own `Access`, exactly as for the native protocol: the same access file, the same
//! roles, the same refusals and the same audit lines.

use crate::api::Status;
use crate::auth::{Access, Session};
use crate::dispatch::{self, Kind};

/// What a request presented, owned, so that it crosses to a shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presented {
    /// The bearer token of `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// The identity of a client certificate the TLS handshake verified.
    pub certificate: Option<String>,
}

impl Presented {
    /// What `request` presented. A malformed `authorization` header presents an empty token,
    /// which the shard refuses as `Unauthenticated`, instead of being taken for no credential.
    pub fn of<T>(request: &tonic::Request<T>) -> Presented {
        let token = request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().ok().and_then(bearer_token).unwrap_or_default().to_owned());
        let certificate = request
            .peer_certs()
            .and_then(|certificates| certificates.first().and_then(crate::net::tls::certificate_identity));
        Presented { token, certificate }
    }

    /// The session on this shard: a token is authenticated with the shard's access file; a
    /// verified certificate names its principal; nothing presented is anonymous.
    pub fn session(&self, access: &Access) -> Result<Session, Status> {
        match (&self.token, &self.certificate) {
            (Some(token), _) => access.authenticate_token(token),
            (None, Some(identity)) => Ok(access.authenticate_certificate(identity)),
            (None, None) => Ok(Session::anonymous()),
        }
    }

    /// The session, allowed an operation of `kind` on `name` (`dispatch::check`), or the
    /// refusal.
    pub fn check(&self, access: &Access, kind: Kind, name: &str) -> Result<Session, Status> {
        let session = self.session(access)?;
        dispatch::check(access, &session, kind, name)?;
        Ok(session)
    }
}

/// The token of an `authorization` header's value, `Bearer <token>`: the scheme is
/// case-insensitive (RFC 9110, section 11.1), so `BEARER` and `bearer` are the same scheme;
/// `None` for another scheme or no token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer rpt_1", "bearer rpt_1", "BEARER rpt_1", "BeArEr   rpt_1 "] {
            assert_eq!(bearer_token(value), Some("rpt_1"), "{value}");
        }
        for value in ["Basic dXNlcg==", "Bearer", "Bearer ", "rpt_1", "Bearerrpt_1"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
        let mut request = tonic::Request::new(());
        request.metadata_mut().insert("authorization", "BEARER rpt_upper".parse().unwrap());
        assert_eq!(Presented::of(&request).token.as_deref(), Some("rpt_upper"));
        request.metadata_mut().insert("authorization", "Basic x".parse().unwrap());
        assert_eq!(Presented::of(&request).token.as_deref(), Some(""), "another scheme is an empty token");
    }
}
