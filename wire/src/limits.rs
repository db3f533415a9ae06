//! Every limit of the protocol, by name: the model's (`ringpost_model::limits`, Pub/Sub's
//! quotas, which the daemon applies whatever protocol a request came by), re-exported so that
//! the wire's users find them all here, and the wire's own, which bound its frames.

pub use ringpost_model::limits::*;

/// Fixed frame header: body length, command, flags, request id.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest frame body either side accepts. A publish request of `PUBLISH_REQUEST_BYTES_MAX`
/// plus the per-message framing of the largest batch must fit.
pub const FRAME_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Bytes of an error message carried on the wire.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4096;
/// Field names in one update mask: more than the fields there are to name, so a mask that
/// repeats some still fits, while a hostile one cannot make the router scan without end.
pub const UPDATE_MASK_PATHS_MAX: usize = 32;

/// The protocol version this crate speaks; the server refuses a Hello with another major.
pub const PROTOCOL_VERSION: u32 = 1;

const _: () = assert!(PUBLISH_REQUEST_BYTES_MAX + PUBLISH_BATCH_MESSAGES_MAX * 256 < FRAME_BODY_BYTES_MAX);
const _: () =
    assert!(FRAME_HEADER_BYTES.is_multiple_of(16), "bodies must stay 16-byte aligned after the header");
