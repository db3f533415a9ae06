//! The wire's frames must hold what the daemon sends in one: its limits that bound a frame are
//! asserted against the wire's here, at compile time. The limits both apply are the model's
//! (`ringpost_model::limits`), which the wire and `api::limits` re-export, so there is nothing
//! else to keep equal.

use crate::subscription::budget::PULL_RESPONSE_BYTES_MAX;
use ringpost_wire::limits as wire;

/// A pull response's messages and the envelope of the largest single message fit one frame.
const _: () = assert!(PULL_RESPONSE_BYTES_MAX + 2 * 1024 * 1024 <= wire::FRAME_BODY_BYTES_MAX);
