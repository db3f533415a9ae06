//! The connection server shared by the router and the forwarders: frames in, one task per
//! request, responses out in completion order (each carries its request id).
//!
//! Bounds (`ConnectionLimits`, per shard): a frame body is refused before allocation if it
//! exceeds `FRAME_BODY_BYTES_MAX`; a frame not yet whole holds memory only for the bytes that
//! arrived, out of the shard's `partial_frame_bytes_max`, and must arrive within
//! `frame_deadline_base` plus its length at `frame_bytes_per_second_min` once its first byte
//! has; at most `REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX` requests run per connection (the
//! reader stops reading beyond that, which is TCP backpressure); responses wait in a queue of
//! the same bound; connections are limited per shard, per peer address, and before they are
//! authenticated; a connection that completes no frame for `idle_deadline` is closed (bytes
//! that never make a frame do not count), and one whose socket takes no byte for
//! `write_stall_deadline` while an answer waits for it (a peer that never reads) is reset. A
//! refusal or a closing for a limit is an error frame (request id 0) naming the limit. A frame
//! that cannot be parsed gets a `ProtocolError` reply and the connection is closed; other
//! connections carry on.
//!
//! Security (`Security`, per shard): with TLS on, every connection is handshaken first (within
//! `unauthenticated_deadline`; a failed handshake closes that connection alone, with one
//! rate-limited log line). A connection is unauthenticated until an Authenticate succeeds, the
//! handshake verified a client certificate, or (when anonymous may act) its first whole frame
//! came, and must get there within `unauthenticated_deadline`; until then, when anonymous may
//! not act, a frame larger than `FRAME_BODY_BYTES_UNAUTHENTICATED_MAX` closes it. Authenticate
//! is answered by the reading loop itself, before the frames after it are dispatched, so a
//! client may pipeline it; a failed one closes the connection. Each second the shard reloads
//! its access file and certificates if they changed and closes the connections whose session
//! no longer holds (a revoked or expired token).

mod accept;
mod connection;
mod limits;
mod read;
mod responder;
mod security;
#[cfg(test)]
mod security_tests;
mod write;

pub use self::accept::*;
use self::connection::*;
pub use self::limits::*;
use self::read::*;
pub use self::responder::*;
pub use self::security::*;
use self::write::*;

use super::tls::{certificate_identity, Tls, TlsSettings};
use crate::auth::{Access, AccessSettings, Session};
use crate::subscription::budget::{StreamBudget, StreamReservation};
use crate::sync::{Notify, Stop};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::{Semaphore, StaticPermit};
use nix::errno::Errno;
use nix::sys::socket::{sendmsg, MsgFlags, UnixAddr};
use ringpost_wire::frame::{access_body, Frame};
use ringpost_wire::frame::{encode_error, FrameBuffer, FrameHeader, FrameSplitter, FLAG_RESPONSE};
use ringpost_wire::gather::GatheredFrame;
use ringpost_wire::messages::{AuthenticateRequest, AuthenticateResponse};
use ringpost_wire::{Command, ErrorCode, Status};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Serves the requests of one kind of shard.
#[allow(async_fn_in_trait)]
pub trait Handler: 'static {
    /// Answers one request. The returned frame must carry the request's id; a streaming request
    /// sends its intermediate frames through `responder` first.
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response;
}

/// A connection's byte stream: the socket itself, or TLS over it.
trait Transport: AsyncRead + AsyncWrite + Unpin + 'static {
    /// Whether the stream's bytes are the socket's: writes may then go past the stream,
    /// straight to the socket (vectored, `write_runs`), and what the socket has received
    /// (`FIONREAD`) is what the stream will read.
    const PLAINTEXT: bool;
}

impl Transport for TcpStream {
    const PLAINTEXT: bool = true;
}

impl Transport for futures_rustls::server::TlsStream<TcpStream> {
    const PLAINTEXT: bool = false;
}
