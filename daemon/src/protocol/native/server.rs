//! The connection server shared by the router and the forwarders: frames in, one task per
//! request, responses out in completion order (each carries its request id).
//!
//! Bounds: a frame body is refused before allocation if it exceeds `FRAME_BODY_BYTES_MAX`;
//! at most `REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX` requests run per connection (the reader
//! stops reading beyond that, which is TCP backpressure); responses wait in a queue of the
//! same bound; at most `CONNECTIONS_PER_SHARD_MAX` connections per shard; a connection that
//! sends nothing for `CONNECTION_IDLE_MAX` is closed. A frame that cannot be parsed gets a
//! `ProtocolError` reply and the connection is closed; other connections carry on.

use crate::subscription::budget::StreamReservation;
use crate::sync::{Notify, Stop};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::{Semaphore, StaticPermit};
use nix::errno::Errno;
use nix::sys::socket::{sendmsg, MsgFlags, UnixAddr};
use ringpost_wire::frame::{encode_error, FrameBuffer, FrameHeader, FrameSplitter, FLAG_RESPONSE};
use ringpost_wire::gather::GatheredFrame;
use ringpost_wire::{ErrorCode, Status};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

pub const REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX: u64 = 1024;
pub const CONNECTIONS_PER_SHARD_MAX: usize = 4096;
pub const CONNECTION_IDLE_MAX: Duration = Duration::from_secs(600);
/// Responses smaller than this are gathered into one socket write.
const COALESCE_BYTES_MAX: usize = 256 * 1024;
/// Runs handed to one vectored write: Linux takes at most 1024 (`UIO_MAXIOV`).
const WRITE_RUNS_MAX: usize = 1024;
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
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response;
}

/// A frame to write: in one buffer, or in pieces, holding the buffers its large runs stay in
/// (a pull's messages, in the log's read buffers) until one vectored write sends them.
pub enum Response {
    Frame(FrameBuffer),
    Gathered(GatheredFrame<Held>),
    /// A response holding a share of the shard's pull budget until it is written.
    Reserved(Box<Response>, StreamReservation),
}

/// Bytes that the gathered frames of one shard may hold while they wait for their sockets. A
/// gathered frame holds whole read buffers (a read-ahead extent is 8 MiB), not just the messages
/// it sends, so without a bound many small responses queued behind slow readers could each keep
/// a large buffer alive. Beyond it, frames are copied into their own buffers, as before.
pub const GATHERED_HELD_BYTES_SHARD_MAX: usize = 256 << 20;

thread_local! {
    static GATHERED_HELD_BYTES: Cell<usize> = const { Cell::new(0) };
}

/// Whether this shard's gathered frames may hold `bytes` more (`GATHERED_HELD_BYTES_SHARD_MAX`).
pub fn gathering_has_room(bytes: usize) -> bool {
    GATHERED_HELD_BYTES.get().saturating_add(bytes) <= GATHERED_HELD_BYTES_SHARD_MAX
}

/// A buffer a gathered frame holds, whatever keeps it alive; `charged` bytes count against the
/// shard's `GATHERED_HELD_BYTES_SHARD_MAX` until it is dropped (its length, or 0 for a slice of
/// a buffer another `Held` of the frame already counts).
pub struct Held {
    owner: Box<dyn AsRef<[u8]>>,
    charged: usize,
}

impl Held {
    pub fn new(owner: Box<dyn AsRef<[u8]>>, charged: usize) -> Held {
        GATHERED_HELD_BYTES.set(GATHERED_HELD_BYTES.get() + charged);
        Held { owner, charged }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        GATHERED_HELD_BYTES.set(GATHERED_HELD_BYTES.get() - self.charged);
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        (*self.owner).as_ref()
    }
}

impl From<FrameBuffer> for Response {
    fn from(frame: FrameBuffer) -> Response {
        Response::Frame(frame)
    }
}

impl Response {
    /// Bytes on the wire.
    pub fn wire_bytes(&self) -> usize {
        match self {
            Response::Frame(frame) => frame.len(),
            Response::Gathered(frame) => frame.len(),
            Response::Reserved(response, _) => response.wire_bytes(),
        }
    }

    /// The frame in one buffer.
    pub fn into_contiguous(self) -> FrameBuffer {
        match self {
            Response::Frame(frame) => frame,
            Response::Gathered(frame) => frame.to_contiguous(),
            Response::Reserved(response, _) => response.into_contiguous(),
        }
    }
}

/// What a handler may do besides returning its answer: stream frames, and notice the peer
/// leaving.
pub struct Responder {
    outbound: Rc<Outbound>,
    /// The address the peer reached this connection at (the router answers lookups with it
    /// when it listens on every address, see `Advertise`).
    local_address: Option<SocketAddr>,
}

impl Responder {
    /// A responder on no connection, for tests that call a handler directly.
    #[cfg(test)]
    pub(crate) fn unconnected() -> Responder {
        Responder { outbound: Rc::default(), local_address: None }
    }

    /// The address of this end of the connection, as the peer reached it.
    pub fn local_address(&self) -> Option<SocketAddr> {
        self.local_address
    }

    /// Whether the peer closed its side, or the connection broke.
    pub fn is_gone(&self) -> bool {
        self.outbound.peer_gone.get()
    }

    /// Resolves when the peer goes (or at once, if it already has).
    pub async fn gone(&self) {
        while !self.is_gone() {
            self.outbound.left.notified().await;
        }
    }

    /// Queues one intermediate frame of a stream, waiting while the socket is behind. Returns
    /// false if the peer is gone. `reservation`, if any, is held until the frame is written.
    pub async fn send_more(
        &self,
        frame: impl Into<Response>,
        reservation: Option<StreamReservation>,
    ) -> bool {
        let frame = frame.into();
        loop {
            if self.is_gone() {
                return false;
            }
            let changed = self.outbound.changed.notified();
            if self.outbound.queue.borrow().len() < STREAM_FRAMES_QUEUED_MAX {
                self.outbound.push_held(frame, None, reservation);
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

/// Accepts and serves connections until `stop` is given; then stops accepting (the listening
/// socket closes, so new clients are refused at once), lets every connection finish the
/// requests it has running and answer them, and returns once all connections are closed.
/// Returns how many connections were open when the stop was given.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Rc<H>, stop: Stop) -> usize {
    let connections = Rc::new(Cell::new(0usize));
    let closed = Rc::new(Notify::new());
    // The sockets of the connections open now. A stop shuts their reading side, which ends
    // each connection's pending read at once: a read waiting on the stop order as well would
    // register with it at every read of every connection.
    let sockets: Rc<RefCell<std::collections::HashSet<RawFd>>> = Rc::default();
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            stop.given().await;
            None
        })
        .await;
        let Some(accepted) = accepted else { break };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(error) => {
                eprintln!("ringpostd: accept failed: {error}");
                crate::runtime::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if connections.get() >= CONNECTIONS_PER_SHARD_MAX {
            crate::runtime::spawn(async move {
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
        let socket = stream.as_raw_fd();
        sockets.borrow_mut().insert(socket);
        let (handler, connections, closed, stop, sockets) =
            (handler.clone(), connections.clone(), closed.clone(), stop.clone(), sockets.clone());
        crate::runtime::spawn(async move {
            serve_connection(stream, handler, stop).await;
            // The socket closed as serve_connection returned, and nothing ran since: no other
            // connection can have its number yet.
            sockets.borrow_mut().remove(&socket);
            connections.set(connections.get() - 1);
            closed.notify_all();
        })
        .detach();
    }
    drop(listener);
    for socket in sockets.borrow().iter() {
        let _ = nix::sys::socket::shutdown(*socket, nix::sys::socket::Shutdown::Read);
    }
    let open_at_stop = connections.get();
    loop {
        let notified = closed.notified();
        if connections.get() == 0 {
            return open_at_stop;
        }
        notified.await;
    }
}

/// Responses waiting for the socket. Each holds the in-flight permit of its request until it is
/// written, so running plus queued requests never exceed the per-connection bound.
#[derive(Default)]
pub struct Outbound {
    queue: RefCell<VecDeque<Queued>>,
    ready: Notify,
    closed: Cell<bool>,
    /// The peer stopped sending (EOF, error, idle timeout) or the socket broke.
    peer_gone: Cell<bool>,
    /// Fires when the queue drains or the peer goes, for streams waiting for room.
    changed: Notify,
    /// Fires when the peer goes, for idle streams. Not `changed`: that fires at every write,
    /// and thousands of idle streams on one connection all woke at each (W4 steady state).
    left: Notify,
}

/// A response waiting for the socket, with what it holds until written: its request's
/// in-flight permit, and a stream frame's reservation.
type Queued = (Response, Option<StaticPermit>, Option<StreamReservation>);

impl Outbound {
    fn push(&self, frame: impl Into<Response>, permit: Option<StaticPermit>) {
        self.push_held(frame, permit, None);
    }
    fn push_held(
        &self,
        frame: impl Into<Response>,
        permit: Option<StaticPermit>,
        reservation: Option<StreamReservation>,
    ) {
        self.queue.borrow_mut().push_back((frame.into(), permit, reservation));
        self.ready.notify_all();
    }
    fn close(&self) {
        self.closed.set(true);
        self.ready.notify_all();
    }
    fn peer_left(&self) {
        self.peer_gone.set(true);
        self.changed.notify_all();
        self.left.notify_all();
    }
}

async fn serve_connection<H: Handler>(stream: TcpStream, handler: Rc<H>, stop: Stop) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(CONNECTION_IDLE_MAX));
    let local_address = stream.local_addr().ok();
    let socket = stream.as_raw_fd();
    let (mut reader, writer) = futures_lite::io::split(stream);
    let outbound = Rc::new(Outbound::default());
    let writer_task = crate::runtime::spawn(write_responses(writer, socket, outbound.clone()));
    let in_flight = Rc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX));
    let mut splitter = FrameSplitter::new();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    // Once the shard is told to stop, nothing more is read (`serve` shuts the socket's reading
    // side, so a pending read ends): the requests read so far run and are answered, and the
    // connection closes after them.
    'reading: while !outbound.closed.get() && !stop.is_given() {
        // A large body is read straight into its own buffer, not copied through the chunk.
        let frames = if let Some(room) = splitter.body_room() {
            let count = match reader.read(room).await {
                Ok(0) | Err(_) => break,
                Ok(count) => count,
            };
            splitter.body_filled(count).into_iter().collect()
        } else {
            let count = match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(count) => count,
            };
            match splitter.push(&chunk[..count]) {
                Ok(frames) => frames,
                Err(error) => {
                    let status = Status::new(ErrorCode::ProtocolError, error.to_string());
                    outbound.push(encode_error(0, 0, &status), None);
                    break;
                }
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
            crate::runtime::spawn(async move {
                let responder = Responder { outbound: outbound.clone(), local_address };
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

fn is_protocol_error(response: &Response) -> bool {
    let Response::Frame(frame) = response else { return false };
    match FrameHeader::decode(frame) {
        Ok(header) if header.is_error() => {
            let status =
                ringpost_wire::frame::decode_error(&frame[ringpost_wire::limits::FRAME_HEADER_BYTES..]);
            status.code == ErrorCode::ProtocolError
        }
        _ => false,
    }
}

async fn write_responses(
    writer: futures_lite::io::WriteHalf<TcpStream>,
    socket: RawFd,
    outbound: Rc<Outbound>,
) {
    write_all_responses(writer, socket, &outbound).await;
    // Whatever ended the writer (a broken socket, or the close), nobody reads any more.
    outbound.peer_left();
}

/// `socket` is the stream's descriptor, for vectored writes, which glommio's stream lacks; it
/// stays open as long as `writer` does.
async fn write_all_responses(
    mut writer: futures_lite::io::WriteHalf<TcpStream>,
    socket: RawFd,
    outbound: &Outbound,
) {
    let mut gathered: Vec<u8> = Vec::with_capacity(COALESCE_BYTES_MAX);
    let mut permits = Vec::new();
    loop {
        let ready = outbound.ready.notified();
        let batch: Vec<Queued> = outbound.queue.borrow_mut().drain(..).collect();
        outbound.changed.notify_all();
        if batch.is_empty() {
            if outbound.closed.get() {
                break;
            }
            ready.await;
            continue;
        }
        for (response, permit, reservation) in batch {
            // A reserved response's share is held, like its permit, until the write is done.
            let (response, held) = match response {
                Response::Reserved(response, held) => (*response, Some(held)),
                response => (response, None),
            };
            permits.push((permit, reservation.or(held)));
            let frame = match response {
                Response::Frame(frame) => frame,
                Response::Gathered(frame) => {
                    // The small frames gathered so far go first, in the same write.
                    let runs = std::iter::once(&gathered[..]).chain(frame.slices()).collect();
                    if write_runs(&mut writer, socket, runs).await.is_err() {
                        return;
                    }
                    gathered.clear();
                    continue;
                }
                Response::Reserved(..) => unreachable!("unwrapped above"),
            };
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

/// Writes `runs` in order with as few vectored writes as the socket allows. A write that
/// finds the socket full hands the first unwritten run to glommio's stream, which waits for
/// room through the ring, and the rest carries on vectored.
async fn write_runs(
    writer: &mut futures_lite::io::WriteHalf<TcpStream>,
    socket: RawFd,
    mut runs: Vec<&[u8]>,
) -> std::io::Result<()> {
    runs.retain(|run| !run.is_empty());
    let mut slices = Vec::with_capacity(runs.len().min(WRITE_RUNS_MAX));
    let mut first = 0;
    while first < runs.len() {
        slices.clear();
        slices.extend(runs[first..].iter().take(WRITE_RUNS_MAX).map(|run| IoSlice::new(run)));
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        // No address (the socket is connected); the type parameter only names the kind it lacks.
        match sendmsg::<UnixAddr>(socket, &slices, &[], flags, None) {
            Ok(mut written) => {
                while written > 0 {
                    let run = runs[first];
                    if written >= run.len() {
                        written -= run.len();
                        first += 1;
                    } else {
                        runs[first] = &run[written..];
                        written = 0;
                    }
                }
            }
            Err(Errno::EAGAIN) => {
                writer.write_all(runs[first]).await?;
                first += 1;
            }
            Err(Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_buffers_count_against_the_shard_until_dropped() {
        let before = GATHERED_HELD_BYTES.get();
        assert!(gathering_has_room(GATHERED_HELD_BYTES_SHARD_MAX - before));
        let first = Held::new(Box::new(vec![0u8; 1000]), 1000);
        let second = Held::new(Box::new(vec![0u8; 24]), 24);
        assert_eq!(GATHERED_HELD_BYTES.get(), before + 1024);
        assert!(!gathering_has_room(GATHERED_HELD_BYTES_SHARD_MAX - before - 1023));
        assert!(gathering_has_room(GATHERED_HELD_BYTES_SHARD_MAX - before - 1024));
        assert_eq!(first.as_ref().len(), 1000);
        drop((first, second));
        assert_eq!(GATHERED_HELD_BYTES.get(), before);
    }

    /// An idle stream waits for its peer to go; the writer draining the connection's queue (at
    /// every write) must not wake it, or thousands of idle streams on one connection all wake
    /// at each write. Room in the queue still wakes a stream waiting to send.
    #[test]
    fn idle_streams_wake_when_the_peer_goes_not_at_every_write() {
        use std::future::Future;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::task::{Wake, Waker};
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut context = std::task::Context::from_waker(&waker);
        let responder = Responder { outbound: Rc::new(Outbound::default()), local_address: None };
        let mut gone = std::pin::pin!(responder.gone());
        let mut room = std::pin::pin!(responder.outbound.changed.notified());
        assert!(gone.as_mut().poll(&mut context).is_pending());
        assert!(room.as_mut().poll(&mut context).is_pending());
        // What the writer does each time it takes the queue.
        responder.outbound.changed.notify_all();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "only the stream waiting for room woke");
        assert!(room.as_mut().poll(&mut context).is_ready());
        assert!(gone.as_mut().poll(&mut context).is_pending());
        responder.outbound.peer_left();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert!(gone.as_mut().poll(&mut context).is_ready());
    }

    /// Many runs (more than one vectored write takes), many more bytes than the socket buffers,
    /// and a reader that starts late: the writes stop on a full socket, wait, and resume
    /// mid-run, and the bytes arrive whole and in order.
    #[test]
    fn runs_arrive_whole_and_in_order_through_a_full_socket() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let runs: Vec<Vec<u8>> = (0..3000u32)
                .map(|index| (0..(index % 7) * 3001 + 1).map(|byte| (byte ^ index) as u8).collect())
                .collect();
            let expected: Vec<u8> = runs.concat();
            assert!(runs.len() > WRITE_RUNS_MAX && expected.len() > 16 << 20);
            let reader = crate::runtime::spawn(async move {
                let mut stream = listener.accept().await.unwrap();
                crate::runtime::sleep(Duration::from_millis(200)).await;
                let mut received = Vec::new();
                stream.read_to_end(&mut received).await.unwrap();
                received
            });
            let stream = TcpStream::connect(address).await.unwrap();
            let socket = stream.as_raw_fd();
            let (_, mut writer) = futures_lite::io::split(stream);
            write_runs(&mut writer, socket, runs.iter().map(Vec::as_slice).collect()).await.unwrap();
            writer.close().await.unwrap();
            drop(writer);
            let received = reader.await;
            assert_eq!(received.len(), expected.len());
            assert!(received == expected, "the bytes arrived changed or out of order");
        });
    }
}
