//! Access tokens, their digests and the access file's times: the `ringpost-token` crate, which
//! the CLI's `token create` shares so that it need not link the daemon.

pub use ringpost_token::{
    access_line, digest, digest_line, format_digest, format_rfc3339_utc, generate, parse_digest,
    parse_rfc3339_utc, DIGEST_BYTES, DIGEST_PREFIX, TOKEN_PREFIX, TOKEN_RANDOM_BYTES,
};
