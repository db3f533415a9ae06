//! One TCP connection to a Ringpost shard, shared by any number of concurrent requests.
//!
//! Threading model: each connection owns one reader thread that reads response frames and
//! completes the matching request futures through their wakers, and one writer thread that
//! sends requests: a call appends its frame to the connection's outbox and the writer sends
//! everything that gathered there with one write, the way Kafka's sender thread and the NATS
//! client's flusher do. Sixty-four requests in flight then cost a few system calls instead of
//! sixty-four, on both ends. So the futures need no particular executor: tokio, glommio, or the
//! `block_on` of this crate all work. A call waits only when `OUTBOX_BYTES_MAX` bytes are
//! already waiting to be sent.
//!
//! A call on an idle connection (no request waiting for an answer, nothing queued, no write in
//! progress) sends its frame itself, with one write that never blocks, and queues only what the
//! socket did not take. Waking the writer thread costs a request a thread wake-up, about 50 µs
//! on this machine's 2 vCPUs, which at a light load is a large part of a durable publish's
//! 200-400 µs. Under load a connection is never idle and every call queues as before, so the
//! writes stay gathered.
//!
//! Over TLS (see `security`), rustls' `ClientConnection` is one state machine for both
//! directions, behind a mutex the reader thread and the writer thread share: the reader takes it
//! to hand rustls the bytes a socket read brought and to take plaintext out, never while
//! blocked in a socket read; the writer takes it to encrypt frames, and writes the records to
//! the socket after letting it go. Every call queues for the writer thread (no call writes its
//! own frame): the records must reach the socket in the order rustls made them, and the
//! outbox's `writing` flag gives the writer thread alone that order. The plaintext path is as
//! described above, untouched.

use crate::security::Security;
use crate::Error;
use nix::errno::Errno;
use nix::sys::socket::MsgFlags;
use ringpost_wire::frame::{try_encode_frame, Body, FrameBuffer, FrameHeader};
use ringpost_wire::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use ringpost_wire::messages::AuthenticateRequest;
use ringpost_wire::Command;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Requests waiting for an answer on one connection; beyond it `call` fails with
/// `ResourceExhausted` instead of queueing without bound.
pub const REQUESTS_PENDING_PER_CONNECTION_MAX: usize = 4096;
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of requests waiting for the writer thread; a call that would go beyond it waits for
/// room (one frame larger than it still goes, alone).
pub const OUTBOX_BYTES_MAX: usize = 4 << 20;

/// Requests not yet sent, in call order: the frames themselves, sent with vectored writes, so
/// a request's bytes are not copied again on their way to the socket.
#[derive(Default)]
struct Outbox {
    frames: Vec<FrameBuffer>,
    bytes: usize,
    /// Bytes at the front of `frames[0]` that a call's own write sent already (the socket took
    /// only part of its frame).
    first_sent_bytes: usize,
    /// A write is in progress, the writer thread's or a call's own: no other starts until it
    /// ends, so the frames' bytes never interleave on the socket.
    writing: bool,
    /// Set when the connection closes: nothing more is sent, and the writer thread ends.
    closed: bool,
}

#[derive(Default)]
struct Writer {
    /// Where a call on an idle connection writes its frame itself (None: every call queues, as
    /// over TLS).
    socket: Option<TcpStream>,
    /// The TLS session frames are encrypted with, if the connection uses TLS.
    tls: Option<Arc<TlsSession>>,
    outbox: Mutex<Outbox>,
    /// Signals the writer thread that frames arrived (or the connection closed).
    ready: Condvar,
    /// Signals callers waiting for room that the writer took the frames.
    room: Condvar,
}

impl Writer {
    fn new(socket: TcpStream) -> Writer {
        Writer { socket: Some(socket), ..Writer::default() }
    }

    fn new_tls(tls: Arc<TlsSession>) -> Writer {
        Writer { tls: Some(tls), ..Writer::default() }
    }

    /// Has the writer thread write what the TLS session has pending (an answer to the server's
    /// key update, an alert) even with no frame to send: an empty frame carries it. Never waits
    /// for room, so the reader thread, which calls it, never stops reading for it.
    fn flush_tls_soon(&self) {
        let mut outbox = self.outbox.lock().unwrap();
        if outbox.closed {
            return;
        }
        outbox.frames.push(FrameBuffer::new());
        drop(outbox);
        self.ready.notify_one();
    }

    /// Sends a frame, or queues it for the writer thread; false if the connection is closed.
    /// `idle` says no request on the connection waits for an answer: then, with nothing queued
    /// and no write in progress, the frame is written here (see the module's comment).
    fn push(&self, frame: FrameBuffer, idle: bool) -> bool {
        let mut outbox = self.outbox.lock().unwrap();
        while !outbox.closed && outbox.bytes > 0 && outbox.bytes + frame.len() > OUTBOX_BYTES_MAX {
            outbox = self.room.wait(outbox).unwrap();
        }
        if outbox.closed {
            return false;
        }
        if let Some(socket) = &self.socket {
            if idle && outbox.frames.is_empty() && !outbox.writing {
                outbox.writing = true;
                drop(outbox);
                let sent = send_without_waiting(socket, &frame);
                return self.after_own_write(frame, sent);
            }
        }
        let was_empty = outbox.frames.is_empty();
        outbox.bytes += frame.len();
        outbox.frames.push(frame);
        drop(outbox);
        if was_empty {
            self.ready.notify_one();
        }
        true
    }

    /// Ends a call's own write of `frame`, which sent `sent` bytes of it: what the socket did
    /// not take goes to the front of the outbox (calls that queued during the write came after
    /// it), for the writer thread. A failed write queues the whole frame: the writer thread's
    /// write then fails too and closes the connection, as for any broken socket.
    fn after_own_write(&self, frame: FrameBuffer, sent: std::io::Result<usize>) -> bool {
        let mut outbox = self.outbox.lock().unwrap();
        outbox.writing = false;
        let sent = sent.unwrap_or(0);
        if sent < frame.len() {
            if outbox.closed {
                return false;
            }
            outbox.bytes += frame.len() - sent;
            outbox.first_sent_bytes = sent;
            outbox.frames.insert(0, frame);
        }
        let queued = !outbox.frames.is_empty();
        drop(outbox);
        if queued {
            self.ready.notify_one();
        }
        true
    }

    fn close(&self) {
        self.outbox.lock().unwrap().closed = true;
        self.ready.notify_all();
        self.room.notify_all();
    }
}

/// Buffers one vectored write takes at most (Linux's IOV_MAX).
const WRITE_SLICES_MAX: usize = 1024;

/// Writes as much of `frame` as the socket takes at once, without blocking: the bytes sent, 0
/// if its buffer is full.
fn send_without_waiting(socket: &TcpStream, frame: &[u8]) -> std::io::Result<usize> {
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    loop {
        match nix::sys::socket::send(socket.as_raw_fd(), frame, flags) {
            Ok(sent) => return Ok(sent),
            Err(Errno::EAGAIN) => return Ok(0),
            Err(Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// Writes every frame, in order, with as few system calls as the kernel allows, except the
/// first `first_sent_bytes` bytes of the first, which are sent already.
fn write_frames(
    mut socket: &TcpStream,
    frames: &[FrameBuffer],
    first_sent_bytes: usize,
) -> std::io::Result<()> {
    for (index, group) in frames.chunks(WRITE_SLICES_MAX).enumerate() {
        let mut slices: Vec<IoSlice<'_>> = group.iter().map(|frame| IoSlice::new(frame)).collect();
        if index == 0 {
            if let Some(first) = group.first() {
                slices[0] = IoSlice::new(&first[first_sent_bytes..]);
            }
        }
        let mut left = &mut slices[..];
        while !left.is_empty() {
            match socket.write_vectored(left) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(written) => IoSlice::advance_slices(&mut left, written),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(())
}

/// The writer thread: sends what gathered in the outbox, in order, until the connection
/// closes. A failed write closes the connection; the reader thread then fails every request
/// still waiting, as for any broken connection.
fn write_requests(writer: Arc<Writer>, socket: TcpStream, closed: Arc<AtomicBool>) {
    // The same socket a call on an idle connection writes to; `writing` keeps them apart.
    let socket = &socket;
    let mut sending = Vec::new();
    // TLS records made and not yet written (empty, never allocated, in plaintext).
    let mut records = Vec::new();
    let mut first_sent_bytes;
    // Frames the last write carried: more than one means callers are queueing faster than
    // single writes, and are likely to queue more.
    let mut frames_last_write = 0;
    loop {
        {
            let mut outbox = writer.outbox.lock().unwrap();
            if outbox.frames.is_empty() && !outbox.closed && frames_last_write > 1 {
                // Under load, before sleeping, give the CPU once to whoever else is ready to
                // run: on a busy machine that is often a caller about to queue a frame, which
                // the next write then takes along instead of the writer being woken for it
                // alone. With nothing else runnable the yield returns at once. Not at a light
                // load (one frame a write), where a frame queued during the yield would wait
                // for the rest of another thread's time slice. Measured with one message per
                // request (4 publishers, 64 requests in flight each, 2 cores): 15-30% fewer
                // writes and futex calls per message, and 5-22% more messages a second.
                drop(outbox);
                std::thread::yield_now();
                outbox = writer.outbox.lock().unwrap();
            }
            while (outbox.frames.is_empty() || outbox.writing) && !outbox.closed {
                outbox = writer.ready.wait(outbox).unwrap();
            }
            if outbox.closed {
                return;
            }
            std::mem::swap(&mut sending, &mut outbox.frames);
            first_sent_bytes = std::mem::take(&mut outbox.first_sent_bytes);
            outbox.bytes = 0;
            outbox.writing = true;
        }
        writer.room.notify_all();
        let written = match &writer.tls {
            None => write_frames(socket, &sending, first_sent_bytes),
            Some(tls) => {
                debug_assert_eq!(first_sent_bytes, 0, "over TLS no call writes its own frame");
                tls.write_frames(socket, &sending, &mut records)
            }
        };
        writer.outbox.lock().unwrap().writing = false;
        if written.is_err() {
            closed.store(true, Ordering::Release);
            let _ = socket.shutdown(Shutdown::Both);
            writer.close();
            return;
        }
        frames_last_write = sending.len();
        sending.clear();
    }
}

/// TLS records gathered before one socket write: frames are encrypted up to about this many
/// bytes of records, which are then written without the session's lock held.
const TLS_WRITE_BYTES: usize = 256 * 1024;
/// Bytes one socket read hands to rustls at most (a TLS record is at most about 16 KiB).
const TLS_READ_BYTES: usize = 64 * 1024;

/// One connection's TLS state machine, shared by its reader and its writer (see the module's
/// comment).
pub(crate) struct TlsSession {
    connection: Mutex<rustls::ClientConnection>,
}

impl TlsSession {
    /// Encrypts every frame, in order, and writes the records. The lock is held while encrypting
    /// only, never during a socket write: a writer blocked on a full socket must not stop the
    /// reader, or a server that waits for its answers to be read before it reads again would
    /// never read again.
    fn write_frames(
        &self,
        mut socket: &TcpStream,
        frames: &[FrameBuffer],
        records: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let (mut index, mut offset) = (0, 0);
        loop {
            {
                let mut tls = self.connection.lock().unwrap();
                while index < frames.len() && records.len() < TLS_WRITE_BYTES {
                    let frame = &frames[index];
                    let taken = tls.writer().write(&frame[offset..])?;
                    offset += taken;
                    while tls.wants_write() {
                        tls.write_tls(records)?;
                    }
                    if offset == frame.len() {
                        (index, offset) = (index + 1, 0);
                    } else if taken == 0 {
                        return Err(std::io::ErrorKind::WriteZero.into());
                    }
                }
                // Also what the session has pending without a frame (see `flush_tls_soon`).
                while tls.wants_write() {
                    tls.write_tls(records)?;
                }
            }
            if !records.is_empty() {
                socket.write_all(records)?;
                records.clear();
            }
            if index == frames.len() {
                return Ok(());
            }
        }
    }
}

/// The reader thread's side of a TLS connection: reads the socket without the session's lock,
/// then hands what came to rustls and takes the plaintext out under it.
struct TlsReader {
    session: Arc<TlsSession>,
    socket: TcpStream,
    writer: Arc<Writer>,
    /// Bytes read from the socket, `start..end` of them not yet taken by rustls.
    incoming: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Read for TlsReader {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let wants_write = {
                let mut tls = self.session.connection.lock().unwrap();
                match tls.reader().read(buffer) {
                    Ok(count) => return Ok(count),
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(error) => return Err(error),
                }
                if self.start == self.end {
                    None
                } else {
                    let taken = tls.read_tls(&mut &self.incoming[self.start..self.end])?;
                    self.start += taken;
                    tls.process_new_packets()
                        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
                    Some(tls.wants_write())
                }
            };
            match wants_write {
                Some(true) => self.writer.flush_tls_soon(),
                Some(false) => {}
                None => {
                    let count = loop {
                        match self.socket.read(&mut self.incoming) {
                            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                            other => break other?,
                        }
                    };
                    if count == 0 {
                        // The server closed without a close_notify: what came is all there is.
                        return Ok(0);
                    }
                    (self.start, self.end) = (0, count);
                }
            }
        }
    }
}

/// Does the TLS handshake on `socket` within what is left of `CONNECT_TIMEOUT`, so that a
/// server that never answers it fails the connect as one that never accepts does.
fn handshake(
    socket: &TcpStream,
    address: &str,
    (config, name): (Arc<rustls::ClientConfig>, rustls::pki_types::ServerName<'static>),
    deadline: std::time::Instant,
) -> Result<rustls::ClientConnection, Error> {
    let failed = |error: &dyn std::fmt::Display| {
        Error::Tls(format!(
            "TLS handshake with {address} failed: {error} (is it a TLS port, and does the CA given sign its certificate for {name:?}?)",
            name = name.to_str()
        ))
    };
    let mut tls = rustls::ClientConnection::new(config, name.clone()).map_err(|error| failed(&error))?;
    let mut io = socket;
    while tls.is_handshaking() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(failed(&format!("no answer within {CONNECT_TIMEOUT:?}")));
        }
        socket.set_read_timeout(Some(left)).map_err(Error::Io)?;
        socket.set_write_timeout(Some(left)).map_err(Error::Io)?;
        match tls.complete_io(&mut io) {
            Ok((0, 0)) if tls.is_handshaking() => return Err(failed(&"the server closed the connection")),
            Ok(_) => {}
            Err(error)
                if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                return Err(failed(&format!("no answer within {CONNECT_TIMEOUT:?}")))
            }
            // The connection itself failed (a node that died while it was being reached, say):
            // worth another attempt, which a failed verification is not.
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::NotConnected
                ) =>
            {
                let source = std::io::Error::new(error.kind(), format!("{error} during the TLS handshake"));
                return Err(Error::Connect { address: address.to_owned(), source });
            }
            Err(error) => return Err(failed(&error)),
        }
    }
    socket.set_read_timeout(None).map_err(Error::Io)?;
    socket.set_write_timeout(None).map_err(Error::Io)?;
    Ok(tls)
}

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
    writer: Arc<Writer>,
    /// Another handle on the socket, so `close` never waits for a write in progress.
    control: TcpStream,
    pending: Arc<Pending>,
    streams: Arc<Streams>,
    next_request: AtomicU64,
    closed: Arc<AtomicBool>,
    /// The error the server closed the connection with (a refusal naming a limit, a protocol
    /// error), if it gave one, or the `Error::Protocol` of a peer that is no Ringpost server:
    /// what a request on the closed connection fails with, instead of a bare "closed" that
    /// hides why (an HTTP/2 server speaks first, so its answer can close the connection
    /// before the first request is sent).
    refusal: Arc<Mutex<Option<Error>>>,
    pub(crate) started: AtomicU64,
    pub(crate) completed: Arc<AtomicU64>,
}

impl Connection {
    /// Connects in plaintext without a token (blocking, bounded by `CONNECT_TIMEOUT`) and starts
    /// the reader and writer threads.
    pub fn connect(address: &str) -> Result<Arc<Connection>, Error> {
        Connection::connect_with(address, &Security::default())
    }

    /// Connects as `security` says: the TLS handshake, if it asks for TLS, within
    /// `CONNECT_TIMEOUT` with the connect; then, if it has a token, an `Authenticate` frame goes
    /// first, before any request, and is not waited for. A failed authentication comes back as
    /// `Unauthenticated`, which every request on the connection then fails with.
    pub fn connect_with(address: &str, security: &Security) -> Result<Arc<Connection>, Error> {
        security.validate()?;
        let deadline = std::time::Instant::now() + CONNECT_TIMEOUT;
        let socket_address = address
            .to_socket_addrs()
            .map_err(Error::Io)?
            .next()
            .ok_or_else(|| Error::Protocol(format!("cannot resolve '{address}'")))?;
        let stream = TcpStream::connect_timeout(&socket_address, CONNECT_TIMEOUT)
            .map_err(|error| Error::Connect { address: address.to_owned(), source: error })?;
        stream.set_nodelay(true).map_err(Error::Io)?;
        let tls = match security.tls_for(address)? {
            Some(settings) => {
                let connection = handshake(&stream, address, settings, deadline)?;
                Some(Arc::new(TlsSession { connection: Mutex::new(connection) }))
            }
            None => None,
        };
        let reader = stream.try_clone().map_err(Error::Io)?;
        let control = stream.try_clone().map_err(Error::Io)?;
        let writer_socket = stream.try_clone().map_err(Error::Io)?;
        // The TLS reader reads the socket itself; the reader thread keeps a handle to close it.
        let tls_reader_socket = match &tls {
            Some(_) => Some(stream.try_clone().map_err(Error::Io)?),
            None => None,
        };
        let pending: Arc<Pending> = Arc::default();
        let streams: Arc<Streams> = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let refusal: Arc<Mutex<Option<Error>>> = Arc::default();
        let completed = Arc::new(AtomicU64::new(0));
        let writer = Arc::new(match &tls {
            None => Writer::new(stream),
            Some(session) => Writer::new_tls(session.clone()),
        });
        let connection = Arc::new(Connection {
            address: address.to_owned(),
            writer: writer.clone(),
            control,
            pending: pending.clone(),
            streams: streams.clone(),
            next_request: AtomicU64::new(1),
            closed: closed.clone(),
            refusal: refusal.clone(),
            started: AtomicU64::new(0),
            completed: completed.clone(),
        });
        // The id of the Authenticate frame, whose refusal ends the connection (0: none is sent).
        let authenticate_request = if security.token().is_some() {
            connection.next_request.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let writer_closed = closed.clone();
        std::thread::Builder::new()
            .name(format!("ringpost-writer-{address}"))
            .spawn(move || write_requests(writer, writer_socket, writer_closed))
            .map_err(Error::Io)?;
        let reader_writer = connection.writer.clone();
        let state = (closed, refusal, authenticate_request);
        std::thread::Builder::new()
            .name(format!("ringpost-reader-{address}"))
            .spawn(move || {
                match (tls, tls_reader_socket) {
                    (Some(session), Some(socket)) => {
                        let source = TlsReader {
                            session,
                            socket,
                            writer: reader_writer.clone(),
                            incoming: vec![0u8; TLS_READ_BYTES].into_boxed_slice(),
                            start: 0,
                            end: 0,
                        };
                        read_responses(&reader, source, pending, streams, state, completed);
                    }
                    _ => read_responses(&reader, &reader, pending, streams, state, completed),
                }
                // Nothing more can be answered: stop sending too.
                reader_writer.close();
            })
            .map_err(Error::Io)?;
        if let Some(token) = security.token() {
            let request = AuthenticateRequest { token: token.to_owned() };
            let frame = try_encode_frame(Command::Authenticate.code(), 0, authenticate_request, &request)
                .map_err(Error::Status)?;
            if !connection.writer.push(frame, true) {
                return Err(connection.closed_error());
            }
        }
        Ok(connection)
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// What a request on this closed connection fails with: the server's reason, if it gave one.
    fn closed_error(&self) -> Error {
        match &*self.refusal.lock().unwrap() {
            Some(error) => error.duplicate(),
            None => Error::Closed(self.address.clone()),
        }
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
        let frame = try_encode_frame(command, 0, request_id, body).map_err(Error::Status)?;
        let queue = Arc::new(StreamQueue::default());
        self.streams.lock().unwrap().insert(request_id, queue.clone());
        // A stream opens once and lives long: its first request gains little from being
        // written here, so it always queues.
        if self.is_closed() || !self.writer.push(frame, false) {
            self.streams.lock().unwrap().remove(&request_id);
            return Err(self.closed_error());
        }
        Ok(StreamReceiver { queue, connection: self.clone() })
    }

    pub fn call<T: Body>(&self, command: u16, body: &T) -> ResponseFuture {
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        // A body past the frame's limit (the caller's choice) is refused here, never sent.
        let frame = match try_encode_frame(command, 0, request_id, body) {
            Ok(frame) => frame,
            Err(status) => return ResponseFuture::ready(Err(Error::Status(status))),
        };
        let slot = Arc::new(Mutex::new(Slot::default()));
        let idle = {
            let mut pending = self.pending.lock().unwrap();
            // Checked under the lock the reader thread drains `pending` with after it marks the
            // connection closed: a request is either refused here or failed by the reader.
            if self.is_closed() {
                return ResponseFuture::ready(Err(self.closed_error()));
            }
            if pending.len() >= REQUESTS_PENDING_PER_CONNECTION_MAX {
                return ResponseFuture::ready(Err(Error::Status(ringpost_wire::Status::resource_exhausted(format!(
                    "{REQUESTS_PENDING_PER_CONNECTION_MAX} requests already wait on {} (REQUESTS_PENDING_PER_CONNECTION_MAX)",
                    self.address
                )))));
            }
            // Counted before the reader thread can see the request, so `completed` never
            // overtakes `started`.
            let idle = pending.is_empty();
            self.started.fetch_add(1, Ordering::Relaxed);
            pending.insert(request_id, slot.clone());
            idle
        };
        if !self.writer.push(frame, idle) {
            // Whoever removes the request from `pending` counts it as completed: here, or the
            // reader thread when it fails everything that waits on a closed connection.
            if self.pending.lock().unwrap().remove(&request_id).is_some() {
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
            return ResponseFuture::ready(Err(self.closed_error()));
        }
        ResponseFuture {
            slot: Some(slot),
            ready: None,
            pending: Some(Waiting {
                request_id,
                pending: self.pending.clone(),
                completed: self.completed.clone(),
            }),
        }
    }

    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            // Also ends a write blocked on a full socket buffer, which then fails.
            let _ = self.control.shutdown(Shutdown::Both);
        }
        self.writer.close();
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

/// The reader thread: reads answers from `source` (the socket itself, or its TLS session) and
/// completes the requests and streams they answer, until the connection fails; then fails
/// everything still waiting with why. `socket` is the connection's, to close it and name it.
fn read_responses(
    socket: &TcpStream,
    source: impl Read,
    pending: Arc<Pending>,
    streams: Arc<Streams>,
    (closed, refusal, authenticate_request): (Arc<AtomicBool>, Arc<Mutex<Option<Error>>>, u64),
    completed: Arc<AtomicU64>,
) {
    let address = socket.peer_addr().map(|peer| peer.to_string()).unwrap_or_else(|_| "the server".into());
    let mut stream = std::io::BufReader::with_capacity(READ_BUFFER_BYTES, source);
    // The first frame on a connection tells whether the peer speaks Ringpost at all.
    let mut first = true;
    let error = loop {
        let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
        if let Err(error) = read_header(&mut stream, &mut header_bytes, first, &address) {
            break error;
        }
        let header = match FrameHeader::decode(&header_bytes) {
            Ok(header) if !first || is_ringpost_answer(&header) => header,
            Err(error) if !first => break Error::Protocol(format!("bad frame from the server: {error}")),
            _ => break not_ringpost(&address, &header_bytes, stream.buffer()),
        };
        first = false;
        let length = header.body_length as usize;
        debug_assert!(length <= FRAME_BODY_BYTES_MAX);
        let mut body = FrameBuffer::with_capacity(length);
        body.resize(length, 0);
        if let Err(error) = stream.read_exact(&mut body) {
            break Error::Io(error);
        }
        if header.is_error() && (header.request_id == 0 || header.request_id == authenticate_request) {
            // A connection-level error (protocol error, too many connections, a revoked
            // token) or a refused Authenticate: the server closes the connection after it.
            let status = ringpost_wire::frame::decode_error(&body);
            *refusal.lock().unwrap() = Some(Error::Status(status.clone()));
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
    if let Error::Protocol(_) = &error {
        refusal.lock().unwrap().get_or_insert_with(|| error.duplicate());
    }
    closed.store(true, Ordering::Release);
    let _ = socket.shutdown(Shutdown::Both);
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

/// Bytes of a foreign server's answer quoted in the error (its first line, at most).
pub const FOREIGN_ANSWER_EXCERPT_BYTES_MAX: usize = 80;

/// Reads a frame header. A peer that closes the connection after a few bytes, before the first
/// header is whole, is no Ringpost server (one answers every request with a whole frame).
fn read_header(
    stream: &mut impl Read,
    header: &mut [u8; FRAME_HEADER_BYTES],
    first: bool,
    address: &str,
) -> Result<(), Error> {
    let mut filled = 0;
    while filled < header.len() {
        match stream.read(&mut header[filled..]) {
            Ok(0) if first && filled > 0 => return Err(not_ringpost(address, &header[..filled], &[])),
            Ok(0) => return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            // A peer that answered a few bytes and then reset the connection (an HTTP/2 server
            // closing on a client without its preface, with our request unread, resets it) is
            // as foreign as one that closed it.
            Err(_) if first && filled > 0 => return Err(not_ringpost(address, &header[..filled], &[])),
            Err(error) => return Err(Error::Io(error)),
        }
    }
    Ok(())
}

/// Whether the first header a connection receives, already checked by `FrameHeader::decode`,
/// can be a Ringpost server's: a response to a request (which has a command and an id), or a
/// connection-level error (command 0, request 0). The header has no magic number, but another
/// protocol's first bytes fail these checks: text puts a printable byte at the top of the body
/// length, so an HTTP server's "HTTP/1.1 400" reads as a body of 1,347,703,880 bytes and an SSH
/// server's "SSH-2.0-" as 760,763,219, far beyond `FRAME_BODY_BYTES_MAX`; and few binary
/// protocols set exactly the response flag and no unknown one.
fn is_ringpost_answer(header: &FrameHeader) -> bool {
    let connection_error = header.command == 0 && header.request_id == 0 && header.is_error();
    let answer = header.command != 0 && header.request_id != 0;
    header.is_response() && (connection_error || answer)
}

/// The error for a peer that answered something other than Ringpost frames, quoting the first
/// line of what it sent (`FOREIGN_ANSWER_EXCERPT_BYTES_MAX`), non-printable bytes escaped.
fn not_ringpost(address: &str, header: &[u8], rest: &[u8]) -> Error {
    let answer: Vec<u8> =
        header.iter().chain(rest).copied().take(FOREIGN_ANSWER_EXCERPT_BYTES_MAX + 1).collect();
    let line_end = answer.iter().position(|&byte| byte == b'\r' || byte == b'\n');
    let cut = line_end.unwrap_or(answer.len()).min(FOREIGN_ANSWER_EXCERPT_BYTES_MAX);
    let ellipsis = if line_end.is_none() && answer.len() > cut { "..." } else { "" };
    // A TLS record (an alert or a handshake) starts with its type, 21 or 22, then major version 3.
    let tls = matches!(answer.as_slice(), [21 | 22, 3, ..]);
    // An HTTP/2 server (a gRPC port) speaks first: a SETTINGS frame (type 4), or a GOAWAY
    // (type 7) for a client without the preface, each on stream 0, after a 3-byte length.
    let http2 = matches!(answer.as_slice(), [_, _, _, 4 | 7, _, 0, 0, 0, 0, ..]);
    let hint = if tls {
        "; it speaks TLS: give the CA that signed its certificate (--ca, RINGPOST_CA)"
    } else if http2 {
        "; it speaks HTTP/2, as a gRPC port does: give the router's native port (ringpostd --listen, 7450 by default)"
    } else {
        ""
    };
    Error::Protocol(format!(
        "{address} is not a Ringpost server (it answered \"{}{ellipsis}\"{hint})",
        answer[..cut].escape_ascii()
    ))
}

/// The future of one response. Dropping it before the answer came (a deadline passed, the
/// caller gave up) forgets the request: its entry leaves the connection's pending map, and an
/// answer that still comes is read and discarded.
pub struct ResponseFuture {
    slot: Option<Arc<Mutex<Slot>>>,
    ready: Option<Result<Response, Error>>,
    /// Where the request waits for its answer, until it has one.
    pending: Option<Waiting>,
}

/// A request's entry in its connection's pending map.
struct Waiting {
    request_id: u64,
    pending: Arc<Pending>,
    completed: Arc<AtomicU64>,
}

impl ResponseFuture {
    fn ready(result: Result<Response, Error>) -> ResponseFuture {
        ResponseFuture { slot: None, ready: Some(result), pending: None }
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        if let Some(waiting) = self.pending.take() {
            // Whoever removes the entry counts the request as completed (see `call`).
            if waiting.pending.lock().unwrap().remove(&waiting.request_id).is_some() {
                waiting.completed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
impl Connection {
    /// Requests waiting for an answer.
    pub(crate) fn pending_requests(&self) -> usize {
        self.pending.lock().unwrap().len()
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
        let result = {
            let mut slot = slot.lock().unwrap();
            match slot.result.take() {
                Some(result) => result,
                None => {
                    slot.waker = Some(context.waker().clone());
                    return Poll::Pending;
                }
            }
        };
        // Answered: whoever answered took the entry out of the pending map already.
        self.pending = None;
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringpost_wire::frame::encode_frame;

    /// Frames queue in call order; a frame larger than the outbox still goes (alone); a call
    /// waiting for room is let go when the writer takes the bytes, and refused once closed.
    #[test]
    fn outbox_keeps_order_bounds_bytes_and_refuses_after_close() {
        let frame = |bytes: &[u8]| {
            let mut frame = FrameBuffer::new();
            frame.extend_from_slice(bytes);
            frame
        };
        let queued = |writer: &Writer| -> Vec<u8> {
            writer.outbox.lock().unwrap().frames.iter().flat_map(|frame| frame.iter().copied()).collect()
        };
        let drain = |writer: &Writer| {
            let mut outbox = writer.outbox.lock().unwrap();
            outbox.frames.clear();
            outbox.bytes = 0;
        };
        let writer = Arc::new(Writer::default());
        assert!(writer.push(frame(b"one"), true));
        assert!(writer.push(frame(b"two"), false));
        assert_eq!(queued(&writer), b"onetwo");
        drain(&writer);
        assert!(
            writer.push(frame(&vec![7u8; OUTBOX_BYTES_MAX + 1]), false),
            "an empty outbox takes a frame of any size"
        );

        // The outbox is over its bound: the next call waits until the writer drains it.
        let waiting = {
            let writer = writer.clone();
            std::thread::spawn(move || writer.push(frame(b"three"), false))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished(), "a call beyond OUTBOX_BYTES_MAX waits for room");
        drain(&writer);
        writer.room.notify_all();
        assert!(waiting.join().unwrap());
        assert_eq!(queued(&writer), b"three");

        writer.close();
        assert!(!writer.push(frame(b"four"), true), "nothing is queued on a closed connection");
    }

    /// A connected pair of sockets: the client's end and the server's.
    fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (client, server)
    }

    fn frame_of(bytes: &[u8]) -> FrameBuffer {
        let mut frame = FrameBuffer::new();
        frame.extend_from_slice(bytes);
        frame
    }

    /// A call on an idle connection sends its frame without the writer thread (there is none
    /// here); any other call queues, and so does an idle one behind a queued frame.
    #[test]
    fn a_call_on_an_idle_connection_sends_its_frame_itself() {
        let (client, mut server) = socket_pair();
        let writer = Writer::new(client);
        assert!(writer.push(frame_of(b"first"), true));
        let mut received = [0u8; 5];
        server.read_exact(&mut received).unwrap();
        assert_eq!(&received, b"first");
        assert!(writer.push(frame_of(b"second"), false));
        assert!(writer.push(frame_of(b"third"), true), "behind a queued frame, an idle call queues");
        let queued: Vec<u8> =
            writer.outbox.lock().unwrap().frames.iter().flat_map(|frame| frame.iter().copied()).collect();
        assert_eq!(queued, b"secondthird");
        server.set_nonblocking(true).unwrap();
        let nothing = server.read(&mut received);
        assert!(
            matches!(&nothing, Err(error) if error.kind() == std::io::ErrorKind::WouldBlock),
            "queued frames wait for the writer thread: {nothing:?}"
        );
    }

    /// When the socket takes only part of a call's frame, the writer thread sends the rest
    /// (and nothing twice), before what was queued after it.
    #[test]
    fn the_rest_of_a_frame_the_socket_cut_short_goes_first() {
        let (client, mut server) = socket_pair();
        let frame: Vec<u8> = (0..4 << 20).map(|index| (index % 251) as u8).collect();
        let writer = Arc::new(Writer::new(client.try_clone().unwrap()));
        // Nobody reads yet: 4 MiB is more than loopback's socket buffers hold.
        assert!(writer.push(frame_of(&frame), true));
        let first_sent_bytes = writer.outbox.lock().unwrap().first_sent_bytes;
        assert!(first_sent_bytes > 0 && first_sent_bytes < frame.len(), "sent {first_sent_bytes}");
        assert!(writer.push(frame_of(b"after"), true));
        let closed = Arc::new(AtomicBool::new(false));
        let thread = {
            let writer = writer.clone();
            let control = client.try_clone().unwrap();
            std::thread::spawn(move || write_requests(writer, control, closed))
        };
        let mut received = vec![0u8; frame.len() + 5];
        server.read_exact(&mut received).unwrap();
        assert!(received[..frame.len()] == frame[..], "the frame arrives whole, once");
        assert_eq!(&received[frame.len()..], b"after");
        writer.close();
        thread.join().unwrap();
    }

    /// While a call writes its own frame, the writer thread leaves queued frames alone; then the
    /// rest of the call's frame goes first, ahead of what queued during its write.
    #[test]
    fn the_writer_thread_waits_for_a_calls_own_write() {
        let (client, mut server) = socket_pair();
        let writer = Arc::new(Writer::new(client.try_clone().unwrap()));
        writer.outbox.lock().unwrap().writing = true;
        let closed = Arc::new(AtomicBool::new(false));
        let thread = {
            let writer = writer.clone();
            let control = client.try_clone().unwrap();
            std::thread::spawn(move || write_requests(writer, control, closed))
        };
        assert!(writer.push(frame_of(b"queued"), true));
        std::thread::sleep(Duration::from_millis(100));
        server.set_nonblocking(true).unwrap();
        let mut received = [0u8; 8];
        let nothing = server.read(&mut received);
        assert!(
            matches!(&nothing, Err(error) if error.kind() == std::io::ErrorKind::WouldBlock),
            "nothing is sent during a call's own write: {nothing:?}"
        );
        server.set_nonblocking(false).unwrap();
        // The call's write sent one byte of "own".
        assert!(writer.after_own_write(frame_of(b"own"), Ok(1)));
        server.read_exact(&mut received).unwrap();
        assert_eq!(&received, b"wnqueued");
        writer.close();
        thread.join().unwrap();
    }

    /// Threads calling at once, often on an idle connection and often not, never interleave
    /// their frames' bytes, and each thread's requests arrive in its call order.
    #[test]
    fn calls_written_by_callers_and_by_the_writer_thread_stay_whole_and_in_order() {
        use ringpost_wire::messages::NameRequest;
        const THREADS: usize = 4;
        const CALLS: usize = 300;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut splitter = ringpost_wire::frame::FrameSplitter::new();
            let mut chunk = vec![0u8; 64 * 1024];
            let mut names = Vec::new();
            while names.len() < THREADS * CALLS {
                let count = stream.read(&mut chunk).unwrap();
                assert!(count > 0, "the connection ended after {} frames", names.len());
                for frame in splitter.push(&chunk[..count]).expect("whole frames") {
                    let request: NameRequest = ringpost_wire::frame::decode_body(&frame.body).unwrap();
                    names.push(request.name);
                    let header = &frame.header;
                    let response = encode_frame(
                        header.command,
                        ringpost_wire::frame::FLAG_RESPONSE,
                        header.request_id,
                        &NameRequest::default(),
                    );
                    stream.write_all(&response).unwrap();
                }
            }
            names
        });
        let connection = Connection::connect(&address).unwrap();
        let callers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let connection = connection.clone();
                std::thread::spawn(move || {
                    let mut waiting = Vec::new();
                    for call in 0..CALLS {
                        let name = format!("{thread} {call:04}");
                        waiting.push(connection.call(7, &NameRequest { name }));
                        // Bursts of one to four calls, each waited for: the connection is
                        // idle between some and busy during others.
                        if call % (thread + 1) == 0 {
                            for future in waiting.drain(..) {
                                crate::block_on(future).unwrap();
                            }
                        }
                    }
                    for future in waiting {
                        crate::block_on(future).unwrap();
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
        let names = server.join().unwrap();
        for thread in 0..THREADS {
            let mine: Vec<&String> =
                names.iter().filter(|name| name.starts_with(&format!("{thread} "))).collect();
            let expected: Vec<String> = (0..CALLS).map(|call| format!("{thread} {call:04}")).collect();
            assert_eq!(mine, expected.iter().collect::<Vec<_>>(), "thread {thread}'s calls in order");
        }
    }

    /// A request dropped before its answer (its deadline passed) leaves the pending map, and
    /// the answer that comes later is discarded without disturbing the next request.
    #[test]
    fn a_dropped_request_is_forgotten() {
        use ringpost_wire::messages::NameRequest;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connection = Connection::connect(&address).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let abandoned = connection.call(7, &NameRequest { name: "late".into() });
        assert_eq!(connection.pending_requests(), 1);
        drop(abandoned);
        assert_eq!(connection.pending_requests(), 0);
        assert_eq!(connection.in_flight(), 0);
        let answered = connection.call(7, &NameRequest { name: "next".into() });
        let mut splitter = ringpost_wire::frame::FrameSplitter::new();
        let mut frames = Vec::new();
        let mut chunk = vec![0u8; 4096];
        while frames.len() < 2 {
            let count = server.read(&mut chunk).unwrap();
            assert!(count > 0);
            frames.extend(splitter.push(&chunk[..count]).unwrap());
        }
        for frame in &frames {
            let response = encode_frame(
                frame.header.command,
                ringpost_wire::frame::FLAG_RESPONSE,
                frame.header.request_id,
                &NameRequest { name: frame.header.request_id.to_string() },
            );
            server.write_all(&response).unwrap();
        }
        let response = crate::block_on(answered).unwrap();
        assert_eq!(response.header.request_id, frames[1].header.request_id);
        assert_eq!(connection.pending_requests(), 0);
    }

    /// Requests reach the server in call order through the writer thread, and a closed
    /// connection fails the calls after it instead of queueing them.
    #[test]
    fn writer_thread_sends_in_order_and_stops_on_close() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connection = Connection::connect(&address).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let bodies: Vec<ringpost_wire::messages::NameRequest> =
            (0..100).map(|i| ringpost_wire::messages::NameRequest { name: format!("topic-{i}") }).collect();
        let futures: Vec<ResponseFuture> = bodies.iter().map(|body| connection.call(7, body)).collect();
        let mut splitter = ringpost_wire::frame::FrameSplitter::new();
        let mut frames = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        while frames.len() < bodies.len() {
            let count = server.read(&mut chunk).unwrap();
            assert!(count > 0, "the connection ended after {} frames", frames.len());
            frames.extend(splitter.push(&chunk[..count]).unwrap());
        }
        let ids: Vec<u64> = frames.iter().map(|frame| frame.header.request_id).collect();
        assert_eq!(ids, (1..=100).collect::<Vec<u64>>(), "in call order");
        connection.close();
        let refused = crate::block_on(connection.call(7, &bodies[0]));
        assert!(matches!(refused, Err(Error::Closed(_))), "{:?}", refused.err());
        for future in futures {
            assert!(crate::block_on(future).is_err(), "unanswered calls fail once the connection closes");
        }
    }
}
