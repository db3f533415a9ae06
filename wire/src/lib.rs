//! `ringpost-wire`: the one binary protocol that links Ringpost's clients, forwarders and
//! routers. A pure codec: no I/O, no async, no knowledge of the daemon.
//!
//! - [`frame`]: the 16-byte header, frame building, in-place validated access, a splitter.
//! - [`gather`]: frames whose large runs stay in the buffers they live in (vectored writes).
//! - [`command`]: the command table.
//! - [`error`]: stable numbered error codes (gRPC's numbers, plus Ringpost's from 100).
//! - [`messages`]: the rkyv bodies.
//! - [`validate`]: semantic checks after structural validation.
//! - [`limits`]: every limit, by name.

pub mod borrowed;
pub mod command;
pub mod error;
pub mod frame;
pub mod gather;
pub mod limits;
pub mod messages;
pub mod validate;

pub use command::Command;
pub use error::{ErrorCode, Status};
pub use frame::{
    access_body, decode_body, encode_error, encode_frame, encode_frame_sized, Frame, FrameBuffer, FrameError,
    FrameHeader, FrameSplitter,
};
