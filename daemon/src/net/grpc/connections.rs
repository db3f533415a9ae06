//! The gRPC API's connections, before tonic serves them: a bound on how many are open, a
//! deadline for a new one to show it speaks gRPC, and TLS with certificates reloaded for new
//! connections when their files change.
//!
//! Each connection holds a permit from one semaphore for as long as it is open; one accepted
//! beyond the bound is closed at once (the clients back off and retry, as they do for any
//! refused connection), with at most one log line a second. A new connection must finish its
//! TLS handshake, if any, and send HTTP/2's connection preface within
//! `GRPC_PREFACE_TIMEOUT`, or it is closed: neither tonic nor hyper bounds that wait, so
//! without it strangers that connect and say nothing would hold every permit. Handshakes run
//! on tasks of their own, so a slow one delays no other connection.
//!
//! Each connection is then served by a tonic server of its own (`serve_each`), so that it can
//! be closed alone and gracefully: a layer made for it (`ActivityLayer`) counts its open calls
//! and the end of its last one, and once it has had no call open for its idle deadline it is
//! sent HTTP/2's GOAWAY (calls already arriving still run; the client opens a new connection
//! when it next calls). Keepalive pings close peers that are gone; this closes the ones that
//! answer pings and never call.

use crate::net::tls::TlsFiles;
use futures_lite::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::body::Body;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// Connections the gRPC API serves at once, over all clients.
pub const GRPC_CONNECTIONS_MAX: usize = 4096;
/// Connections one peer address may hold, a quarter of `GRPC_CONNECTIONS_MAX` as on the native
/// ports: one more from it is closed at once, so one host (or the clients behind one address)
/// cannot take every connection. Google's client libraries open a handful each.
pub const GRPC_CONNECTIONS_PER_PEER_MAX: usize = GRPC_CONNECTIONS_MAX / 4;

/// How long a connection may stay open with no call on it, counted from the end of its last
/// call (or from its accept): past it, it is closed gracefully with GOAWAY. A connection with a
/// call open (a StreamingPull, a Pull waiting for messages) is never idle. The same as the
/// native protocol's `CONNECTION_IDLE_MAX`; Google's client libraries reconnect on demand
/// (`--grpc-idle-deadline-seconds`).
pub const GRPC_IDLE_DEADLINE: Duration = Duration::from_secs(600);

/// How long a new connection has to finish its TLS handshake (if the API serves TLS) and send
/// HTTP/2's 24-byte connection preface; past it, it is closed. A real client sends the
/// preface in its first packet after the handshake.
pub const GRPC_PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bytes of HTTP/2's connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_BYTES: usize = 24;

/// Handshaken connections waiting for tonic to take them (it takes each at once).
const HANDSHAKEN_QUEUED_MAX: usize = 64;

/// At most one log line a second for each kind of refusal: a flood of strangers must not
/// become a flood of log lines.
struct LogLimiter {
    last_second: AtomicU64,
}

impl LogLimiter {
    fn new() -> LogLimiter {
        LogLimiter { last_second: AtomicU64::new(0) }
    }

    fn allows(&self) -> bool {
        let second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        self.last_second.swap(second, Ordering::Relaxed) != second
    }
}

/// An accepted connection: its share of the bound, its calls' activity, and until it has sent
/// the preface, the deadline for that.
pub struct Counted {
    stream: tokio::net::TcpStream,
    _permit: OwnedSemaphorePermit,
    _share: PeerShare,
    accepted_at: Instant,
    activity: Arc<Activity>,
}

/// The calls of one connection, for its idle deadline: how many are open and when the last one
/// ended; and whether the connection has closed, so that its server stops waiting for it.
pub struct Activity {
    accepted_at: Instant,
    calls_open: AtomicUsize,
    /// When the last call ended, in milliseconds from `accepted_at` (0: none has).
    last_call_ended_ms: AtomicU64,
    closed: Notify,
}

impl Activity {
    fn new(accepted_at: Instant) -> Activity {
        Activity {
            accepted_at,
            calls_open: AtomicUsize::new(0),
            last_call_ended_ms: AtomicU64::new(0),
            closed: Notify::new(),
        }
    }

    /// A call begins; it is open until the returned guard is dropped.
    pub fn begin(self: &Arc<Activity>) -> Call {
        self.calls_open.fetch_add(1, Ordering::SeqCst);
        Call { activity: self.clone() }
    }

    /// Since when the connection has had no call open: `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        // The end is written before the count drops, so a count of 0 is read with its end.
        if self.calls_open.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(self.accepted_at + Duration::from_millis(self.last_call_ended_ms.load(Ordering::SeqCst)))
    }

    /// Resolves once the connection has had no call open for `deadline`. It wakes once per
    /// `deadline` while calls are open, and at the deadline counted from the last call's end.
    async fn idle_for(&self, deadline: Duration) {
        loop {
            let now = Instant::now();
            let wake = self.idle_since().map_or(now + deadline, |since| since + deadline);
            if wake <= now {
                return;
            }
            tokio::time::sleep_until(wake).await;
        }
    }

    /// Resolves once the connection has closed (at once if it already has).
    async fn closed(&self) {
        self.closed.notified().await;
    }
}

/// One open call of a connection.
pub struct Call {
    activity: Arc<Activity>,
}

impl Drop for Call {
    fn drop(&mut self) {
        let activity = &self.activity;
        let ended_ms = activity.accepted_at.elapsed().as_millis() as u64;
        activity.last_call_ended_ms.fetch_max(ended_ms, Ordering::SeqCst);
        let open = activity.calls_open.fetch_sub(1, Ordering::SeqCst);
        assert!(open > 0, "a call ends once");
    }
}

/// The tower layer one connection's server is built with: every call holds a `Call` of the
/// connection's `Activity` from its arrival until its response's body ends or is dropped (a
/// StreamingPull's for as long as the stream is open).
#[derive(Clone)]
pub struct ActivityLayer {
    activity: Arc<Activity>,
}

impl ActivityLayer {
    pub fn new(activity: Arc<Activity>) -> ActivityLayer {
        ActivityLayer { activity }
    }
}

impl<S> tower_layer::Layer<S> for ActivityLayer {
    type Service = Active<S>;

    fn layer(&self, inner: S) -> Active<S> {
        Active { inner, activity: self.activity.clone() }
    }
}

#[derive(Clone)]
pub struct Active<S> {
    inner: S,
    activity: Arc<Activity>,
}

type Answered<E> = Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send>>;

impl<S> tower_service::Service<http::Request<Body>> for Active<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answered<S::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let call = self.activity.begin();
        let answered = self.inner.call(request);
        Box::pin(async move {
            let (parts, body) = answered.await?.into_parts();
            Ok(http::Response::from_parts(parts, Body::new(InCall { inner: body, _call: call })))
        })
    }
}

/// A response body that keeps its call open until it ends or is dropped.
struct InCall {
    inner: Body,
    _call: Call,
}

impl http_body::Body for InCall {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.inner).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connections of each peer address, against `GRPC_CONNECTIONS_PER_PEER_MAX`.
type PerPeer = Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>;

/// A connection's place in its address's share, given back when dropped.
struct PeerShare {
    per_peer: PerPeer,
    peer: Option<IpAddr>,
}

impl PeerShare {
    /// A place for a connection from `peer`, if its address has one left (one of unknown
    /// address counts nowhere).
    fn take(per_peer: &PerPeer, peer: Option<IpAddr>) -> Option<PeerShare> {
        if let Some(peer) = peer {
            let mut counts = per_peer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let count = counts.entry(peer).or_insert(0);
            if *count >= GRPC_CONNECTIONS_PER_PEER_MAX {
                return None;
            }
            *count += 1;
        }
        Some(PeerShare { per_peer: per_peer.clone(), peer })
    }
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let Some(peer) = self.peer else { return };
        let mut counts = self.per_peer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&peer);
            }
        }
    }
}

/// Connections of the gRPC API open now, for a scrape.
static OPEN: AtomicU64 = AtomicU64::new(0);

/// How many connections the gRPC API has open.
pub fn open_connections() -> u64 {
    OPEN.load(Ordering::Relaxed)
}

impl Counted {
    fn new(stream: tokio::net::TcpStream, permit: OwnedSemaphorePermit, share: PeerShare) -> Counted {
        OPEN.fetch_add(1, Ordering::Relaxed);
        let accepted_at = Instant::now();
        let activity = Arc::new(Activity::new(accepted_at));
        Counted { stream, _permit: permit, _share: share, accepted_at, activity }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        // A permit is kept if nobody waits yet, so the server's wait ends whenever it begins.
        self.activity.closed.notify_one();
    }
}

impl Connected for Counted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// A connection until it has sent `PREFACE_BYTES` (after TLS, when it is TLS): a read that
/// waits past the deadline fails, and hyper closes the connection.
pub struct Preface<IO> {
    inner: IO,
    /// `None` once the preface's bytes arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    received: usize,
}

impl<IO> Preface<IO> {
    fn new(inner: IO, accepted_at: Instant) -> Preface<IO> {
        let deadline = Some(Box::pin(tokio::time::sleep_until(accepted_at + GRPC_PREFACE_TIMEOUT)));
        Preface { inner, deadline, received: 0 }
    }
}

impl<IO: Connected> Connected for Preface<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> IO::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Preface<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buffer.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(context, buffer);
        if let Some(deadline) = &mut this.deadline {
            if let Poll::Ready(Ok(())) = read {
                this.received += buffer.filled().len() - before;
                if this.received >= PREFACE_BYTES {
                    this.deadline = None;
                }
            } else if read.is_pending() && deadline.as_mut().poll(context).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within GRPC_PREFACE_TIMEOUT",
                )));
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Preface<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(context)
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(context, buffer)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

/// The accepted connections of `incoming`, at most `connections_max` open at once and
/// `GRPC_CONNECTIONS_PER_PEER_MAX` from one address.
fn bounded(
    incoming: TcpIncoming,
    connections_max: usize,
) -> impl futures_lite::Stream<Item = io::Result<Counted>> + Send + 'static {
    let permits = Arc::new(Semaphore::new(connections_max));
    let per_peer = PerPeer::default();
    let refusals = LogLimiter::new();
    let shares_refused = LogLimiter::new();
    incoming.filter_map(move |accepted| match accepted {
        Err(error) => Some(Err(error)),
        Ok(stream) => match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let peer = stream.peer_addr().ok();
                let Some(share) = PeerShare::take(&per_peer, peer.map(|peer| peer.ip())) else {
                    if shares_refused.allows() {
                        crate::log_info!(
                            "ringpostd: the gRPC API refused a connection from {}: it holds \
                             {GRPC_CONNECTIONS_PER_PEER_MAX} already (GRPC_CONNECTIONS_PER_PEER_MAX)",
                            peer.map_or_else(|| "?".to_owned(), |peer| peer.ip().to_string())
                        );
                    }
                    return None;
                };
                Some(Ok(Counted::new(stream, permit, share)))
            }
            Err(_) => {
                if refusals.allows() {
                    crate::log_info!(
                        "ringpostd: the gRPC API refused a connection from {}: {connections_max} are open (GRPC_CONNECTIONS_MAX)",
                        stream.peer_addr().map(|peer| peer.to_string()).unwrap_or_else(|_| "?".into())
                    );
                }
                None
            }
        },
    })
}

/// A connection ready to serve, with its calls' activity.
pub struct Accepted<IO> {
    pub io: IO,
    pub activity: Arc<Activity>,
}

/// Plaintext connections, bounded, each with its preface deadline.
pub fn plain(
    incoming: TcpIncoming,
    connections_max: usize,
) -> impl futures_lite::Stream<Item = io::Result<Accepted<Preface<Counted>>>> + Send + 'static {
    bounded(incoming, connections_max).map(|accepted| {
        accepted.map(|counted| {
            let (accepted_at, activity) = (counted.accepted_at, counted.activity.clone());
            Accepted { io: Preface::new(counted, accepted_at), activity }
        })
    })
}

/// TLS connections, bounded, handshaken on tasks of their own with the certificates the files
/// hold when each connection arrives (`tls` looks at them each time: a few `stat`s beside a
/// handshake), each with its preface deadline counted from its accept. Accepting ends when
/// `stopping` turns true, which closes the listener.
pub fn handshaken(
    incoming: TcpIncoming,
    connections_max: usize,
    mut tls: TlsFiles,
    mut stopping: watch::Receiver<bool>,
) -> impl futures_lite::Stream<Item = io::Result<Accepted<Preface<TlsStream<Counted>>>>> + Send + 'static {
    let (sender, receiver) = mpsc::channel(HANDSHAKEN_QUEUED_MAX);
    let failures = Arc::new(LogLimiter::new());
    tokio::spawn(async move {
        let mut accepted = Box::pin(bounded(incoming, connections_max));
        loop {
            let next = futures_lite::future::or(async { accepted.next().await }, async {
                let _ = stopping.wait_for(|stopping| *stopping).await;
                None
            });
            let counted = match next.await {
                None => break,
                // Accept errors (a connection reset before it was taken, no file descriptor
                // left) end nothing but that connection, as tonic's own accept loop has it.
                Some(Err(_)) => continue,
                Some(Ok(counted)) => counted,
            };
            match tls.reload_if_changed() {
                Some(Ok(())) => crate::log_info!("ringpostd: the gRPC API reloaded its TLS certificates for new connections"),
                Some(Err(error)) => crate::log_warn!(
                    "ringpostd: the gRPC API's TLS certificates were not reloaded, the ones before stay in force: {error}"
                ),
                None => {}
            }
            let acceptor = TlsAcceptor::from(tls.config());
            let (sender, failures) = (sender.clone(), failures.clone());
            tokio::spawn(async move {
                let (accepted_at, activity) = (counted.accepted_at, counted.activity.clone());
                let peer =
                    counted.stream.peer_addr().map(|peer| peer.to_string()).unwrap_or_else(|_| "?".into());
                let deadline = accepted_at + GRPC_PREFACE_TIMEOUT;
                match tokio::time::timeout_at(deadline, acceptor.accept(counted)).await {
                    Ok(Ok(stream)) => {
                        let io = Preface::new(stream, accepted_at);
                        let _ = sender.send(Ok(Accepted { io, activity })).await;
                    }
                    Ok(Err(error)) if failures.allows() => {
                        crate::log_warn!("ringpostd: the gRPC API's TLS handshake with {peer} failed: {error}")
                    }
                    Err(_) if failures.allows() => crate::log_info!(
                        "ringpostd: the gRPC API closed a connection from {peer}: no TLS handshake within GRPC_PREFACE_TIMEOUT"
                    ),
                    _ => {}
                }
            });
        }
    });
    futures_lite::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|connection| (connection, receiver))
    })
}

/// What ends the serving of one connection: the API's stop, the connection's idle deadline, or
/// its close. tonic then closes it gracefully (GOAWAY, then the calls running finish).
pub type Ending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves each connection of `incoming` on a task of its own with `serve_one`, which is given
/// the connection, its activity, and when to end, until `stopping` turns true; then stops
/// accepting and returns once every connection's serving has ended.
pub async fn serve_each<IO, Connections, Serve, Serving>(
    incoming: Connections,
    idle_deadline: Duration,
    stopping: watch::Receiver<bool>,
    serve_one: Serve,
) where
    Connections: futures_lite::Stream<Item = io::Result<Accepted<IO>>>,
    Serve: Fn(IO, Arc<Activity>, Ending) -> Serving,
    Serving: Future<Output = ()> + Send + 'static,
{
    // Boxed, so that dropping it at the stop closes the listener at once: new clients are then
    // refused rather than left waiting while the open connections finish.
    let mut incoming = Box::pin(incoming);
    // Each connection's task holds a sender; once all are dropped, every connection has ended.
    let (serving, mut ended) = mpsc::channel::<()>(1);
    loop {
        let mut stop = stopping.clone();
        let next = futures_lite::future::or(async { incoming.next().await }, async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
            None
        });
        let Accepted { io, activity } = match next.await {
            None => break,
            // An accept error ends nothing but that connection, as in tonic's own loop.
            Some(Err(_)) => continue,
            Some(Ok(accepted)) => accepted,
        };
        let (watched, mut stop) = (activity.clone(), stopping.clone());
        let ending: Ending = Box::pin(async move {
            let stopped = async move {
                let _ = stop.wait_for(|stopping| *stopping).await;
            };
            let idle = watched.idle_for(idle_deadline);
            futures_lite::future::or(stopped, futures_lite::future::or(idle, watched.closed())).await
        });
        let connection = serve_one(io, activity, ending);
        let serving = serving.clone();
        tokio::spawn(async move {
            connection.await;
            drop(serving);
        });
    }
    drop(incoming);
    drop(serving);
    let _ = ended.recv().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection is idle only with no call open, from the end of its last call.
    #[test]
    fn a_connection_is_idle_only_with_no_call_open() {
        let accepted_at = Instant::now();
        let activity = Arc::new(Activity::new(accepted_at));
        assert_eq!(activity.idle_since(), Some(accepted_at));
        let stream = activity.begin();
        let unary = activity.begin();
        assert_eq!(activity.idle_since(), None);
        std::thread::sleep(Duration::from_millis(20));
        drop(unary);
        assert_eq!(activity.idle_since(), None, "the stream is still open");
        std::thread::sleep(Duration::from_millis(20));
        drop(stream);
        let since = activity.idle_since().expect("no call open");
        assert!(since >= accepted_at + Duration::from_millis(40), "{:?}", since - accepted_at);
    }

    /// The idle wait ends a deadline after the last call's end, not while a call is open.
    #[test]
    fn the_idle_wait_counts_from_the_last_calls_end() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(async {
            let deadline = Duration::from_millis(100);
            let activity = Arc::new(Activity::new(Instant::now()));
            let call = activity.begin();
            let waited = tokio::time::timeout(deadline * 3, activity.idle_for(deadline)).await;
            assert!(waited.is_err(), "idle with a call open");
            drop(call);
            let ended = Instant::now();
            activity.idle_for(deadline).await;
            assert!(ended.elapsed() >= deadline - Duration::from_millis(1), "{:?}", ended.elapsed());
        });
    }
}
