//! One TCP connection to a Ringpost shard, shared by any number of concurrent requests.
//!
//! Threading model: each connection owns one reader thread that reads response frames and
//! completes the matching request futures through their wakers; requests are written by the
//! calling thread under a lock. So the futures need no particular executor: tokio, glommio, or
//! the `block_on` of this crate all work. A write of a large request blocks the calling thread
//! until the kernel takes it.

use crate::Error;
use ringpost_wire::frame::{encode_frame, Body, FrameBuffer, FrameHeader};
use ringpost_wire::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Requests waiting for an answer on one connection; beyond it `call` fails with
/// `ResourceExhausted` instead of queueing without bound.
pub const REQUESTS_PENDING_PER_CONNECTION_MAX: usize = 4096;
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A response frame: its header and its body, aligned for in-place access.
pub struct Response {
    pub header: FrameHeader,
    pub body: FrameBuffer,
}

#[derive(Default)]
struct Slot {
    result: Option<Result<Response, Error>>,
    waker: Option<Waker>,
}

type Pending = Mutex<HashMap<u64, Arc<Mutex<Slot>>>>;

/// Frames of one stream the application has not taken yet. Beyond this the reader thread stops
/// reading the connection (which is the stream's own), so TCP backpressure slows the server's
/// stream instead of the client buffering without bound.
pub const STREAM_FRAMES_BUFFERED_MAX: usize = 16;

#[derive(Default)]
struct StreamState {
    frames: VecDeque<Result<Response, Error>>,
    done: bool,
    waker: Option<Waker>,
}

#[derive(Default)]
struct StreamQueue {
    state: Mutex<StreamState>,
    room: Condvar,
}

impl StreamQueue {
    /// Called by the reader thread: waits for room (or for the receiver to go), then queues.
    fn push(&self, item: Result<Response, Error>, last: bool) {
        let mut state = self.state.lock().unwrap();
        while state.frames.len() >= STREAM_FRAMES_BUFFERED_MAX && !state.done {
            state = self.room.wait(state).unwrap();
        }
        state.frames.push_back(item);
        state.done |= last;
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }
}

type Streams = Mutex<HashMap<u64, Arc<StreamQueue>>>;

/// The receiving end of a stream (`StreamingPull`): frames in order until the server ends the
/// stream or the connection fails. Dropping it closes the stream's connection, which is how a
/// stream is cancelled.
pub struct StreamReceiver {
    queue: Arc<StreamQueue>,
    connection: Arc<Connection>,
}

impl StreamReceiver {
    /// The next frame, or `None` once the stream has ended.
    pub async fn next(&mut self) -> Option<Result<Response, Error>> {
        std::future::poll_fn(|context| {
            let mut state = self.queue.state.lock().unwrap();
            if let Some(item) = state.frames.pop_front() {
                self.queue.room.notify_all();
                return Poll::Ready(Some(item));
            }
            if state.done {
                return Poll::Ready(None);
            }
            state.waker = Some(context.waker().clone());
            Poll::Pending
        })
        .await
    }
}

impl Drop for StreamReceiver {
    fn drop(&mut self) {
        {
            let mut state = self.queue.state.lock().unwrap();
            state.done = true;
            state.frames.clear();
        }
        self.queue.room.notify_all();
        self.connection.close();
    }
}

pub struct Connection {
    address: String,
    writer: Mutex<TcpStream>,
    /// Another handle on the socket, so `close` never waits for a write in progress.
    control: TcpStream,
    pending: Arc<Pending>,
    streams: Arc<Streams>,
    next_request: AtomicU64,
    closed: Arc<AtomicBool>,
    pub(crate) started: AtomicU64,
    pub(crate) completed: Arc<AtomicU64>,
}

impl Connection {
    /// Connects (blocking, bounded by `CONNECT_TIMEOUT`) and starts the reader thread.
    pub fn connect(address: &str) -> Result<Arc<Connection>, Error> {
        let socket_address = address
            .to_socket_addrs()
            .map_err(Error::Io)?
            .next()
            .ok_or_else(|| Error::Protocol(format!("cannot resolve '{address}'")))?;
        let stream = TcpStream::connect_timeout(&socket_address, CONNECT_TIMEOUT)
            .map_err(|error| Error::Connect { address: address.to_owned(), source: error })?;
        stream.set_nodelay(true).map_err(Error::Io)?;
        let reader = stream.try_clone().map_err(Error::Io)?;
        let control = stream.try_clone().map_err(Error::Io)?;
        let pending: Arc<Pending> = Arc::default();
        let streams: Arc<Streams> = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicU64::new(0));
        let connection = Arc::new(Connection {
            address: address.to_owned(),
            writer: Mutex::new(stream),
            control,
            pending: pending.clone(),
            streams: streams.clone(),
            next_request: AtomicU64::new(1),
            closed: closed.clone(),
            started: AtomicU64::new(0),
            completed: completed.clone(),
        });
        std::thread::Builder::new()
            .name(format!("ringpost-reader-{address}"))
            .spawn(move || read_responses(reader, pending, streams, closed, completed))
            .map_err(Error::Io)?;
        Ok(connection)
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Requests started and completed on this connection; the difference is what is in flight.
    /// A request counts as completed once it has a result, an answer or a connection failure,
    /// like gRPC's `started_rpcs` and `completed_rpcs`.
    pub fn counters(&self) -> (u64, u64) {
        (self.started.load(Ordering::Relaxed), self.completed.load(Ordering::Relaxed))
    }

    /// Requests written (or being written) and not answered yet.
    pub fn in_flight(&self) -> u64 {
        let (started, completed) = self.counters();
        started.saturating_sub(completed)
    }

    /// Sends a request and returns a future of its response frame.
    /// Opens a stream on this connection, which should be the stream's own (dropping the
    /// receiver closes it).
    pub fn open_stream<T: Body>(self: &Arc<Self>, command: u16, body: &T) -> Result<StreamReceiver, Error> {
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(command, 0, request_id, body);
        let queue = Arc::new(StreamQueue::default());
        self.streams.lock().unwrap().insert(request_id, queue.clone());
        if self.is_closed() {
            return Err(Error::Closed(self.address.clone()));
        }
        self.writer.lock().unwrap().write_all(&frame).map_err(Error::Io)?;
        Ok(StreamReceiver { queue, connection: self.clone() })
    }

    pub fn call<T: Body>(&self, command: u16, body: &T) -> ResponseFuture {
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(command, 0, request_id, body);
        let slot = Arc::new(Mutex::new(Slot::default()));
        {
            let mut pending = self.pending.lock().unwrap();
            // Checked under the lock the reader thread drains `pending` with after it marks the
            // connection closed: a request is either refused here or failed by the reader.
            if self.is_closed() {
                return ResponseFuture::ready(Err(Error::Closed(self.address.clone())));
            }
            if pending.len() >= REQUESTS_PENDING_PER_CONNECTION_MAX {
                return ResponseFuture::ready(Err(Error::Status(ringpost_wire::Status::resource_exhausted(format!(
                    "{REQUESTS_PENDING_PER_CONNECTION_MAX} requests already wait on {} (REQUESTS_PENDING_PER_CONNECTION_MAX)",
                    self.address
                )))));
            }
            // Counted before the reader thread can see the request, so `completed` never
            // overtakes `started`.
            self.started.fetch_add(1, Ordering::Relaxed);
            pending.insert(request_id, slot.clone());
        }
        let written = self.writer.lock().unwrap().write_all(&frame);
        if let Err(error) = written {
            // Whoever removes the request from `pending` counts it as completed: here, or the
            // reader thread when it fails everything that waits on a closed connection.
            if self.pending.lock().unwrap().remove(&request_id).is_some() {
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
            self.close();
            return ResponseFuture::ready(Err(Error::Io(error)));
        }
        ResponseFuture { slot: Some(slot), ready: None }
    }

    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            // Also ends a write blocked on a full socket buffer, which then fails.
            let _ = self.control.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// Read buffer of the reader thread: the server gathers many responses into one write, so one
/// system call usually brings several frames.
const READ_BUFFER_BYTES: usize = 256 * 1024;

fn read_responses(
    socket: TcpStream,
    pending: Arc<Pending>,
    streams: Arc<Streams>,
    closed: Arc<AtomicBool>,
    completed: Arc<AtomicU64>,
) {
    let mut stream = std::io::BufReader::with_capacity(READ_BUFFER_BYTES, socket);
    let error = loop {
        let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
        if let Err(error) = stream.read_exact(&mut header_bytes) {
            break Error::Io(error);
        }
        let header = match FrameHeader::decode(&header_bytes) {
            Ok(header) => header,
            Err(error) => break Error::Protocol(format!("bad frame from the server: {error}")),
        };
        let length = header.body_length as usize;
        debug_assert!(length <= FRAME_BODY_BYTES_MAX);
        let mut body = FrameBuffer::with_capacity(length);
        body.resize(length, 0);
        if let Err(error) = stream.read_exact(&mut body) {
            break Error::Io(error);
        }
        if header.request_id == 0 && header.is_error() {
            // A connection-level error (protocol error, too many connections): the server
            // closes the connection after it.
            let status = ringpost_wire::frame::decode_error(&body);
            break Error::Status(status);
        }
        let stream = streams.lock().unwrap().get(&header.request_id).cloned();
        if let Some(stream) = stream {
            let last = header.flags & ringpost_wire::frame::FLAG_MORE == 0;
            if last {
                streams.lock().unwrap().remove(&header.request_id);
            }
            let item = if header.is_error() {
                Err(Error::Status(ringpost_wire::frame::decode_error(&body)))
            } else {
                Ok(Response { header, body })
            };
            stream.push(item, last);
            continue;
        }
        let slot = pending.lock().unwrap().remove(&header.request_id);
        if let Some(slot) = slot {
            completed.fetch_add(1, Ordering::Relaxed);
            let waker = {
                let mut slot = slot.lock().unwrap();
                slot.result = Some(Ok(Response { header, body }));
                slot.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    };
    closed.store(true, Ordering::Release);
    let _ = stream.get_ref().shutdown(Shutdown::Both);
    let open_streams: Vec<Arc<StreamQueue>> =
        streams.lock().unwrap().drain().map(|(_, queue)| queue).collect();
    for queue in open_streams {
        let mut state = queue.state.lock().unwrap();
        state.frames.push_back(Err(error.duplicate()));
        state.done = true;
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }
    let waiting: Vec<Arc<Mutex<Slot>>> = pending.lock().unwrap().drain().map(|(_, slot)| slot).collect();
    completed.fetch_add(waiting.len() as u64, Ordering::Relaxed);
    for slot in waiting {
        let waker = {
            let mut slot = slot.lock().unwrap();
            slot.result = Some(Err(error.duplicate()));
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The future of one response.
pub struct ResponseFuture {
    slot: Option<Arc<Mutex<Slot>>>,
    ready: Option<Result<Response, Error>>,
}

impl ResponseFuture {
    fn ready(result: Result<Response, Error>) -> ResponseFuture {
        ResponseFuture { slot: None, ready: Some(result) }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response, Error>;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(result) = self.ready.take() {
            return Poll::Ready(result);
        }
        let Some(slot) = &self.slot else {
            return Poll::Ready(Err(Error::Protocol("polled after completion".into())));
        };
        let mut slot = slot.lock().unwrap();
        match slot.result.take() {
            Some(result) => Poll::Ready(result),
            None => {
                slot.waker = Some(context.waker().clone());
                Poll::Pending
            }
        }
    }
}
