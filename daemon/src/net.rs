//! The connection server shared by the router and the forwarders: frames in, one task per
//! request, responses out in completion order (each carries its request id).
//!
//! Bounds: a frame body is refused before allocation if it exceeds `FRAME_BODY_BYTES_MAX`;
//! at most `REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX` requests run per connection (the reader
//! stops reading beyond that, which is TCP backpressure); responses wait in a queue of the
//! same bound; at most `CONNECTIONS_PER_SHARD_MAX` connections per shard; a connection that
//! sends nothing for `CONNECTION_IDLE_MAX` is closed. A frame that cannot be parsed gets a
//! `ProtocolError` reply and the connection is closed; other connections carry on.

use crate::sync::Notify;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::{Semaphore, StaticPermit};
use ringpost_wire::frame::{encode_error, FrameBuffer, FrameHeader, FrameSplitter, FLAG_RESPONSE};
use ringpost_wire::{ErrorCode, Status};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

pub const REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX: u64 = 1024;
pub const CONNECTIONS_PER_SHARD_MAX: usize = 4096;
pub const CONNECTION_IDLE_MAX: Duration = Duration::from_secs(600);
/// Responses smaller than this are gathered into one socket write.
const COALESCE_BYTES_MAX: usize = 256 * 1024;
/// Read buffer of one connection, allocated for its whole life: at `CONNECTIONS_PER_SHARD_MAX`
/// idle connections this is what a shard holds for them (256 MiB), so it stays modest.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Frames a stream may have waiting for the socket before it must wait: a slow reader slows
/// the stream down instead of growing memory (its messages stay in the log).
pub const STREAM_FRAMES_QUEUED_MAX: usize = 4;

/// Serves the requests of one kind of shard.
#[allow(async_fn_in_trait)]
pub trait Handler: 'static {
    /// Answers one request. The returned frame must carry the request's id; a streaming request
    /// sends its intermediate frames through `responder` first.
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> FrameBuffer;
}

/// What a handler may do besides returning its answer: stream frames, and notice the peer
/// leaving.
pub struct Responder {
    outbound: Rc<Outbound>,
}

impl Responder {
    /// Whether the peer closed its side, or the connection broke.
    pub fn is_gone(&self) -> bool {
        self.outbound.peer_gone.get()
    }

    /// Resolves when the peer goes (or at once, if it already has).
    pub async fn gone(&self) {
        while !self.is_gone() {
            self.outbound.changed.notified().await;
        }
    }

    /// Queues one intermediate frame of a stream, waiting while the socket is behind. Returns
    /// false if the peer is gone.
    pub async fn send_more(&self, frame: FrameBuffer) -> bool {
        loop {
            if self.is_gone() {
                return false;
            }
            let changed = self.outbound.changed.notified();
            if self.outbound.queue.borrow().len() < STREAM_FRAMES_QUEUED_MAX {
                self.outbound.push(frame, None);
                return true;
            }
            changed.await;
        }
    }
}

/// Builds a response frame.
pub fn respond<T: ringpost_wire::frame::Body>(header: &FrameHeader, body: &T) -> FrameBuffer {
    ringpost_wire::encode_frame(header.command, FLAG_RESPONSE, header.request_id, body)
}

/// Builds an error response frame.
pub fn fail(header: &FrameHeader, status: &Status) -> FrameBuffer {
    encode_error(header.command, header.request_id, status)
}

pub async fn serve<H: Handler>(listener: TcpListener, handler: Rc<H>) {
    let connections = Rc::new(Cell::new(0usize));
    loop {
        let stream = match listener.accept().await {
            Ok(stream) => stream,
            Err(error) => {
                eprintln!("ringpostd: accept failed: {error}");
                glommio::timer::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if connections.get() >= CONNECTIONS_PER_SHARD_MAX {
            glommio::spawn_local(async move {
                let mut stream = stream;
                let status = Status::resource_exhausted(format!(
                    "this shard already serves {CONNECTIONS_PER_SHARD_MAX} connections (CONNECTIONS_PER_SHARD_MAX)"
                ));
                let _ = stream.write_all(&encode_error(0, 0, &status)).await;
            })
            .detach();
            continue;
        }
        connections.set(connections.get() + 1);
        let handler = handler.clone();
        let connections = connections.clone();
        glommio::spawn_local(async move {
            serve_connection(stream, handler).await;
            connections.set(connections.get() - 1);
        })
        .detach();
    }
}

/// Responses waiting for the socket. Each holds the in-flight permit of its request until it is
/// written, so running plus queued requests never exceed the per-connection bound.
#[derive(Default)]
pub struct Outbound {
    queue: RefCell<VecDeque<(FrameBuffer, Option<StaticPermit>)>>,
    ready: Notify,
    closed: Cell<bool>,
    /// The peer stopped sending (EOF, error, idle timeout) or the socket broke.
    peer_gone: Cell<bool>,
    /// Fires when the queue drains or the peer goes, for streams waiting on either.
    changed: Notify,
}

impl Outbound {
    fn push(&self, frame: FrameBuffer, permit: Option<StaticPermit>) {
        self.queue.borrow_mut().push_back((frame, permit));
        self.ready.notify_all();
    }
    fn close(&self) {
        self.closed.set(true);
        self.ready.notify_all();
    }
    fn peer_left(&self) {
        self.peer_gone.set(true);
        self.changed.notify_all();
    }
}

async fn serve_connection<H: Handler>(stream: TcpStream, handler: Rc<H>) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(CONNECTION_IDLE_MAX));
    let (mut reader, writer) = futures_lite::io::split(stream);
    let outbound = Rc::new(Outbound::default());
    let writer_task = glommio::spawn_local(write_responses(writer, outbound.clone()));
    let in_flight = Rc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX));
    let mut splitter = FrameSplitter::new();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    'reading: while !outbound.closed.get() {
        let count = match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(count) => count,
        };
        let frames = match splitter.push(&chunk[..count]) {
            Ok(frames) => frames,
            Err(error) => {
                let status = Status::new(ErrorCode::ProtocolError, error.to_string());
                outbound.push(encode_error(0, 0, &status), None);
                break;
            }
        };
        for frame in frames {
            if frame.header.is_response() {
                let status = Status::new(ErrorCode::ProtocolError, "a client sent a response frame");
                outbound.push(fail(&frame.header, &status), None);
                break 'reading;
            }
            let Ok(permit) = in_flight.clone().acquire_static_permit(1).await else { break 'reading };
            let handler = handler.clone();
            let outbound = outbound.clone();
            glommio::spawn_local(async move {
                let responder = Responder { outbound: outbound.clone() };
                let response = handler.handle(frame.header, frame.body, &responder).await;
                let closes = is_protocol_error(&response);
                outbound.push(response, Some(permit));
                if closes {
                    // The stream may still be in step, but a peer that sends malformed bodies
                    // is not trusted with more.
                    outbound.close();
                }
            })
            .detach();
        }
    }
    // The peer is done sending: streams stop; requests already running finish and answer;
    // then the connection closes.
    outbound.peer_left();
    let _ = in_flight.acquire(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX).await;
    outbound.close();
    writer_task.await;
}

fn is_protocol_error(frame: &FrameBuffer) -> bool {
    match FrameHeader::decode(frame) {
        Ok(header) if header.is_error() => {
            let status =
                ringpost_wire::frame::decode_error(&frame[ringpost_wire::limits::FRAME_HEADER_BYTES..]);
            status.code == ErrorCode::ProtocolError
        }
        _ => false,
    }
}

async fn write_responses(writer: futures_lite::io::WriteHalf<TcpStream>, outbound: Rc<Outbound>) {
    write_all_responses(writer, &outbound).await;
    // Whatever ended the writer (a broken socket, or the close), nobody reads any more.
    outbound.peer_left();
}

async fn write_all_responses(mut writer: futures_lite::io::WriteHalf<TcpStream>, outbound: &Outbound) {
    let mut gathered: Vec<u8> = Vec::with_capacity(COALESCE_BYTES_MAX);
    let mut permits = Vec::new();
    loop {
        let ready = outbound.ready.notified();
        let batch: Vec<(FrameBuffer, Option<StaticPermit>)> = outbound.queue.borrow_mut().drain(..).collect();
        outbound.changed.notify_all();
        if batch.is_empty() {
            if outbound.closed.get() {
                break;
            }
            ready.await;
            continue;
        }
        for (frame, permit) in batch {
            permits.push(permit);
            if frame.len() >= COALESCE_BYTES_MAX {
                if !gathered.is_empty() && writer.write_all(&gathered).await.is_err() {
                    return;
                }
                gathered.clear();
                if writer.write_all(&frame).await.is_err() {
                    return;
                }
            } else {
                gathered.extend_from_slice(&frame);
                if gathered.len() >= COALESCE_BYTES_MAX {
                    if writer.write_all(&gathered).await.is_err() {
                        return;
                    }
                    gathered.clear();
                }
            }
        }
        if !gathered.is_empty() {
            if writer.write_all(&gathered).await.is_err() {
                return;
            }
            gathered.clear();
        }
        permits.clear();
    }
    let _ = writer.flush().await;
    let _ = writer.close().await;
}
