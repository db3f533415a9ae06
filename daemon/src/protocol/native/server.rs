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

use super::tls::{certificate_identity, Tls, TlsSettings};
use crate::auth::{Access, AccessSettings, Session};
use crate::subscription::budget::StreamReservation;
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
use std::time::{Duration, Instant, SystemTime};

pub const REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX: u64 = 1024;
pub const CONNECTIONS_PER_SHARD_MAX: usize = 4096;
/// Connections one peer address may hold on one shard: a quarter of the shard's, so that one
/// client (or one host behind it) cannot shut every other out.
pub const CONNECTIONS_PER_PEER_MAX: usize = CONNECTIONS_PER_SHARD_MAX / 4;
/// Connections of a shard that have not authenticated yet.
pub const CONNECTIONS_UNAUTHENTICATED_MAX: usize = 1024;
/// Connections one peer address may hold on one shard before they authenticate: a sixteenth of
/// `CONNECTIONS_UNAUTHENTICATED_MAX`, so that one stranger reopening idle connections cannot
/// take every slot before authentication and lock every other client out; a client's pool
/// opens a few connections at once, far fewer.
pub const CONNECTIONS_UNAUTHENTICATED_PER_PEER_MAX: usize = CONNECTIONS_UNAUTHENTICATED_MAX / 16;
const _: () = assert!(CONNECTIONS_UNAUTHENTICATED_PER_PEER_MAX <= CONNECTIONS_UNAUTHENTICATED_MAX);
/// Connections from the hosts of the cluster's nodes (`ClusterHosts`) before they authenticate, in
/// a budget of their own: a node's raft, replication and lookups never compete with strangers
/// for the slots before authentication, nor count in an address's share of them. A node opens
/// a connection per raft stream and per forwarder it replicates to, far fewer.
pub const CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX: usize = 256;
/// The largest frame body a connection may send before it authenticates, when anonymous may
/// not act: with the read buffer of `READ_CHUNK_UNAUTHENTICATED_BYTES`, a connection before
/// authentication holds about 20 KiB. An Authenticate request is far smaller.
pub const FRAME_BODY_BYTES_UNAUTHENTICATED_MAX: usize = 16 * 1024;
/// How often each shard reloads its access file and certificates (if changed) and checks
/// every open connection's session again: a revoked token's connections close within two.
pub const SECURITY_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// One log line per this long at most about failed TLS handshakes (and about connections closed
/// for a stalled write), counting those not logged.
const HANDSHAKE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes the frames not yet whole of one shard's connections may hold. Two frames of the
/// largest size fit, and a thousand 32 KiB ones; a frame that would take more closes its
/// connection with `ResourceExhausted` (`Reading::read_batch`), which a publisher retries.
/// Frames are partial only while they arrive (milliseconds on a fast link), so this bounds
/// large frames arriving at the same moment, not large frames in flight; an operator whose
/// many publishers send the largest requests at once raises it (`--partial-frames-mib-max`).
pub const PARTIAL_FRAME_BYTES_SHARD_MAX: usize = 32 << 20;
/// How long a new connection may take to authenticate (its TLS handshake included).
pub const UNAUTHENTICATED_DEADLINE: Duration = Duration::from_secs(10);
/// How long a frame may take to arrive once its first byte has, before its length's share.
pub const FRAME_DEADLINE_BASE: Duration = Duration::from_secs(5);
/// The slowest a frame may arrive, beyond `FRAME_DEADLINE_BASE`: the largest frame then has 21
/// seconds, and a peer that trickles bytes to hold memory is closed.
pub const FRAME_BYTES_PER_SECOND_MIN: u64 = 1 << 20;
/// A connection that completes no frame for this long is closed.
pub const CONNECTION_IDLE_MAX: Duration = Duration::from_secs(600);
/// A connection whose socket takes no byte for this long while an answer waits to be written is
/// closed (reset), releasing what it holds as a broken one does (`Outbound::break_off`): a peer
/// that is alive (TCP keepalive holds) but never reads would otherwise keep its slot, the
/// permits of its queued answers and their share of the shard's response budget for ever. Only
/// no progress at all counts: a slow reader taking a byte now and then is never cut. A minute is
/// far beyond a pause of a live client (a client library stops reading only while its
/// application has not taken a stream's frames).
pub const WRITE_STALL_DEADLINE: Duration = Duration::from_secs(60);
/// The write-stall deadline once the shard is stopping: answers still waiting for a socket that
/// takes nothing are given up after this, so that a stop ends well within the daemon's grace
/// (10 s) instead of by force.
pub const WRITE_STALL_DEADLINE_STOPPING: Duration = Duration::from_secs(2);
/// TCP keepalive on every connection: the kernel probes a peer it has heard nothing from for
/// `KEEPALIVE_IDLE`, every `KEEPALIVE_INTERVAL`, and fails the connection after
/// `KEEPALIVE_PROBES` unanswered, so a peer that vanished (its host gone, the network cut) is
/// found within two minutes, also on a connection whose open stream suspends the idle deadline.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 6;
/// Responses smaller than this are gathered into one socket write.
const COALESCE_BYTES_MAX: usize = 256 * 1024;
/// Runs handed to one vectored write: Linux takes at most 1024 (`UIO_MAXIOV`).
const WRITE_RUNS_MAX: usize = 1024;
/// Read buffer of an authenticated connection, allocated for the rest of its life: at
/// `CONNECTIONS_PER_SHARD_MAX` idle connections this is what a shard holds for them
/// (256 MiB), so it stays modest.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Read buffer of a connection until it authenticates: small, so that the many connections an
/// unauthenticated client may open cost little (a large first frame's body is read straight
/// into its own buffer anyway).
const READ_CHUNK_UNAUTHENTICATED_BYTES: usize = 4 * 1024;
/// How long a refused connection is kept to read what its peer sent before it closes: closing
/// a socket with unread bytes resets it, and the reset can overtake the refusal.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Refused connections a shard keeps lingering at once; beyond, a refusal closes at once.
const REFUSALS_LINGERING_MAX: usize = 256;
/// Bytes a lingering refused connection reads (and drops) at most.
const REFUSAL_DRAIN_BYTES_MAX: usize = 64 * 1024;
/// Accept failures wait this long before the next accept, doubling up to the maximum while
/// they go on, so that a shard out of file descriptors does not spin.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// One log line per this long at most about failed accepts, counting those not logged.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Partial frames released since the last trim of malloc's free memory beyond which a closing
/// connection trims it (the heap keeps freed pages otherwise, up to its 128 MiB trim
/// threshold): a quarter of the budget, so that what stays untrimmed after a burst of slow
/// peers is small, while a trim (a walk of the free lists) costs a peer that many bytes sent.
const PARTIAL_FRAME_BYTES_RELEASED_BEFORE_TRIM: usize = PARTIAL_FRAME_BYTES_SHARD_MAX / 4;

/// What a shard allows the connections on its port: the router's and each forwarder's alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionLimits {
    pub connections_per_shard_max: usize,
    pub connections_per_peer_max: usize,
    pub connections_unauthenticated_max: usize,
    pub connections_unauthenticated_per_peer_max: usize,
    pub partial_frame_bytes_max: usize,
    pub unauthenticated_deadline: Duration,
    pub frame_deadline_base: Duration,
    pub frame_bytes_per_second_min: u64,
    pub idle_deadline: Duration,
    pub write_stall_deadline: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            connections_per_shard_max: CONNECTIONS_PER_SHARD_MAX,
            connections_per_peer_max: CONNECTIONS_PER_PEER_MAX,
            connections_unauthenticated_max: CONNECTIONS_UNAUTHENTICATED_MAX,
            connections_unauthenticated_per_peer_max: CONNECTIONS_UNAUTHENTICATED_PER_PEER_MAX,
            partial_frame_bytes_max: PARTIAL_FRAME_BYTES_SHARD_MAX,
            unauthenticated_deadline: UNAUTHENTICATED_DEADLINE,
            frame_deadline_base: FRAME_DEADLINE_BASE,
            frame_bytes_per_second_min: FRAME_BYTES_PER_SECOND_MIN,
            idle_deadline: CONNECTION_IDLE_MAX,
            write_stall_deadline: WRITE_STALL_DEADLINE,
        }
    }
}

impl ConnectionLimits {
    /// When a frame whose first byte came at `started` must be whole, if its header (when
    /// known) announces `body_bytes`.
    fn frame_deadline(&self, started: Instant, body_bytes: u64) -> Instant {
        let rate = self.frame_bytes_per_second_min.max(1);
        started + self.frame_deadline_base + Duration::from_millis(body_bytes.saturating_mul(1000) / rate)
    }
}

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
    /// Who sent the request, as the connection was when it was read, and the shard's rules.
    session: Rc<Session>,
    access: Rc<Access>,
    /// The address the peer reached this connection at (the router answers lookups with it
    /// when it listens on every address, see `Advertise`).
    local_address: Option<SocketAddr>,
}

impl Responder {
    /// A responder on no connection, for tests that call a handler directly.
    #[cfg(test)]
    pub(crate) fn unconnected() -> Responder {
        Responder {
            outbound: Rc::default(),
            local_address: None,
            session: Rc::new(Session::anonymous()),
            access: Rc::new(Access::off()),
        }
    }

    /// A responder on no connection for a request from `session`, under `access`'s rules (a
    /// request another node carried here, and tests).
    #[cfg(test)]
    pub(crate) fn with_session(session: Session, access: Rc<Access>) -> Responder {
        Responder { session: Rc::new(session), access, ..Responder::unconnected() }
    }

    /// This responder for a request another node carried here for `session` (a client that
    /// node authenticated): on the same connection, decided by the same rules.
    pub fn carrying_for(&self, session: Session) -> Responder {
        Responder {
            outbound: self.outbound.clone(),
            session: Rc::new(session),
            access: self.access.clone(),
            local_address: self.local_address,
        }
    }

    /// Who sent the request.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The shard's rules the request is decided by.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Whether the request comes from another node of the cluster (`Access::is_cluster_peer`).
    pub fn is_cluster_peer(&self) -> bool {
        self.access.is_cluster_peer(&self.session)
    }

    /// Whether a request without a credential may do anything here (`Access::anonymous_may_act`).
    pub fn anonymous_may_act(&self) -> bool {
        self.access.anonymous_may_act()
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

/// Hosts a shard counts as the cluster's nodes': the hosts of the largest cluster
/// (`CLUSTER_NODES_MAX`, 256) a few times over. Beyond them, connections count as strangers'.
pub const CLUSTER_HOSTS_MAX: usize = 1024;
// Every host `--cluster` may name fits (`cluster_hosts` takes those first).
const _: () = assert!(crate::node::CLUSTER_NODES_MAX <= CLUSTER_HOSTS_MAX);

/// The hosts of the cluster's nodes, as one shard knows them now: those `--cluster` names and
/// those of the nodes the catalog registered since (an `add-node`, a `--join`). Their
/// connections before authentication have a budget of their own
/// (`CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX`). Shared by the servers of one shard (`Rc`, no
/// lock); each shard has its own, which the router shard keeps current by message
/// (`ControlRequest::ClusterHosts`), as its catalog's registrations change.
#[derive(Clone, Default)]
pub struct ClusterHosts(Rc<RefCell<HashSet<IpAddr>>>);

impl ClusterHosts {
    pub fn new(hosts: impl IntoIterator<Item = IpAddr>) -> ClusterHosts {
        let known = ClusterHosts::default();
        known.replace(hosts);
        known
    }

    pub fn contains(&self, host: IpAddr) -> bool {
        self.0.borrow().contains(&host)
    }

    /// From now on the hosts are `hosts`: connections open keep the budget they were counted in.
    /// Returns whether that changed anything.
    pub fn replace(&self, hosts: impl IntoIterator<Item = IpAddr>) -> bool {
        let hosts: HashSet<IpAddr> = hosts.into_iter().collect();
        assert!(hosts.len() <= CLUSTER_HOSTS_MAX, "{} hosts of the cluster's nodes", hosts.len());
        let changed = *self.0.borrow() != hosts;
        *self.0.borrow_mut() = hosts;
        changed
    }
}

/// What guards one shard's connections: who may do what, TLS when it is on, and the hosts of
/// the cluster's nodes. Each shard builds its own (`Security::open`), from the same files.
pub struct Security {
    pub access: Rc<Access>,
    pub tls: Option<Tls>,
    pub cluster_hosts: ClusterHosts,
}

impl Security {
    /// Everyone may do everything, in plaintext.
    pub fn off() -> Security {
        Security { access: Rc::new(Access::off()), tls: None, cluster_hosts: ClusterHosts::default() }
    }

    /// The same security, knowing the hosts of the cluster's nodes (and whatever they become).
    pub fn with_cluster_hosts(self, hosts: ClusterHosts) -> Security {
        Security { cluster_hosts: hosts, ..self }
    }

    /// Reads the access file and the TLS files; an error names the file and what is wrong.
    pub fn open(access: &AccessSettings, tls: Option<&TlsSettings>) -> Result<Security, String> {
        Security::open_with_cluster(access, tls, None)
    }

    /// `open`, for a forwarder's port in a cluster: other nodes' forwarders that present the
    /// cluster's secret replicate sources here (`Access::with_cluster_secret`).
    pub fn open_with_cluster(
        access: &AccessSettings,
        tls: Option<&TlsSettings>,
        cluster_secret: Option<&str>,
    ) -> Result<Security, String> {
        let access = Rc::new(Access::open(access)?.with_cluster_secret(cluster_secret));
        let tls = tls.map(Tls::open).transpose()?;
        Ok(Security { access, tls, cluster_hosts: ClusterHosts::default() })
    }
}

/// What the shard knows of one open connection: its session, checked again each second, and
/// why it must close once that check fails.
struct Link {
    session: RefCell<Rc<Session>>,
    ending: RefCell<Option<Status>>,
    /// The peer's address, as counted against the limits.
    peer: Option<IpAddr>,
    /// Whether it came from a host of the cluster's nodes, so that it leaves the budget before
    /// authentication it entered, whatever the hosts became since.
    cluster_host: bool,
    /// Told when the shard stops, for the connection's writer (`Stall`): its own, so that a
    /// writer's watch, polled at every write, finds one waiter here rather than scan the
    /// stop's waiters, one per connection.
    stopping: Notify,
    /// The connection in the shard's count for a scrape, until it is dropped.
    _counted: crate::metrics::shard::ConnectionCounted,
}

/// At most one log line per interval, counting the lines left out.
struct LogLimiter {
    interval: Duration,
    logged_at: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    fn new(interval: Duration) -> LogLimiter {
        LogLimiter { interval, logged_at: None, suppressed: 0 }
    }

    /// `Some(lines left out since the last one)` if a line may be written now.
    fn admit(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.logged_at.is_some_and(|at| now.duration_since(at) < self.interval) {
            self.suppressed += 1;
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// What the connections of one shard share: their counts, against the limits, the bytes
/// their frames not yet whole hold, and the shard's security.
struct Shard {
    limits: ConnectionLimits,
    access: Rc<Access>,
    tls: Option<Tls>,
    cluster_hosts: ClusterHosts,
    connections: Cell<usize>,
    /// Connections before authentication: strangers', in all and by address, and the cluster's
    /// hosts' (a budget of their own).
    unauthenticated: Cell<usize>,
    unauthenticated_per_peer: RefCell<HashMap<IpAddr, usize>>,
    unauthenticated_cluster: Cell<usize>,
    per_peer: RefCell<HashMap<IpAddr, usize>>,
    partial_frame_bytes: Cell<usize>,
    /// Bytes partial frames gave back since malloc's free memory was last trimmed.
    partial_frame_bytes_released: Cell<usize>,
    refusals_lingering: Cell<usize>,
    /// The connections open now, by socket. A stop shuts their reading side, which ends each
    /// connection's pending read at once: a read waiting on the stop order as well would
    /// register with it at every read of every connection. The security check closes those
    /// whose session no longer holds the same way.
    links: RefCell<HashMap<RawFd, Rc<Link>>>,
    closed: Notify,
    handshake_failures: RefCell<LogLimiter>,
    write_stalls: RefCell<LogLimiter>,
}

impl Shard {
    /// A shard's connection state before its first connection.
    fn new(limits: ConnectionLimits, security: Security) -> Shard {
        Shard {
            limits,
            access: security.access,
            tls: security.tls,
            cluster_hosts: security.cluster_hosts,
            connections: Cell::new(0),
            unauthenticated: Cell::new(0),
            unauthenticated_per_peer: RefCell::default(),
            unauthenticated_cluster: Cell::new(0),
            per_peer: RefCell::default(),
            partial_frame_bytes: Cell::new(0),
            partial_frame_bytes_released: Cell::new(0),
            refusals_lingering: Cell::new(0),
            links: RefCell::default(),
            closed: Notify::new(),
            handshake_failures: RefCell::new(LogLimiter::new(HANDSHAKE_ERROR_LOG_INTERVAL)),
            write_stalls: RefCell::new(LogLimiter::new(HANDSHAKE_ERROR_LOG_INTERVAL)),
        }
    }

    /// Reloads the access file and the certificates if they changed, then closes (through
    /// their reading side, as a stop does) the connections whose session no longer holds.
    fn check_security(&self) {
        if let Some(Err(error)) = self.access.reload_if_changed() {
            crate::log_warn!(
                "ringpostd: the access file was not reloaded, the one before stays in force: {error}"
            );
        }
        match self.tls.as_ref().and_then(Tls::reload_if_changed) {
            Some(Ok(())) => crate::log_info!("ringpostd: reloaded the TLS certificates for new connections"),
            Some(Err(error)) => {
                crate::log_warn!("ringpostd: the TLS certificates were not reloaded, the ones before stay in force: {error}")
            }
            None => {}
        }
        let now = SystemTime::now();
        for (socket, link) in self.links.borrow().iter() {
            if link.ending.borrow().is_some() {
                continue;
            }
            if let Err(status) = self.access.still_valid(&link.session.borrow(), now) {
                let status = Status::from(status);
                let message =
                    format!("the connection's credential no longer holds, it closes: {}", status.message);
                *link.ending.borrow_mut() = Some(Status::new(status.code, message));
                let _ = nix::sys::socket::shutdown(*socket, nix::sys::socket::Shutdown::Read);
            }
        }
    }

    /// Whether `peer` is a host of one of the cluster's nodes.
    fn is_cluster_host(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|peer| self.cluster_hosts.contains(peer))
    }

    /// Why a new connection from `peer` is refused, if it is: the limit it would pass.
    fn refusal(&self, peer: Option<IpAddr>) -> Option<Status> {
        let limits = &self.limits;
        let count = |map: &RefCell<HashMap<IpAddr, usize>>| {
            peer.and_then(|peer| map.borrow().get(&peer).copied()).unwrap_or(0)
        };
        let from = || peer.map_or_else(|| "this address".to_owned(), |peer| peer.to_string());
        let message = if self.connections.get() >= limits.connections_per_shard_max {
            format!(
                "this shard already serves {} connections (connections_per_shard_max)",
                limits.connections_per_shard_max
            )
        } else if count(&self.per_peer) >= limits.connections_per_peer_max {
            format!(
                "{} already holds {} connections to this shard (connections_per_peer_max)",
                from(),
                limits.connections_per_peer_max
            )
        } else if self.is_cluster_host(peer) {
            if self.unauthenticated_cluster.get() < CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX {
                return None;
            }
            format!(
                "this shard already has {CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX} connections from the cluster's \
                 nodes that have not authenticated (CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX)"
            )
        } else if self.unauthenticated.get() >= limits.connections_unauthenticated_max {
            format!(
                "this shard already has {} connections that have not authenticated (connections_unauthenticated_max)",
                limits.connections_unauthenticated_max
            )
        } else if count(&self.unauthenticated_per_peer) >= limits.connections_unauthenticated_per_peer_max {
            format!(
                "{} already holds {} connections to this shard that have not authenticated \
                 (connections_unauthenticated_per_peer_max)",
                from(),
                limits.connections_unauthenticated_per_peer_max
            )
        } else {
            return None;
        };
        Some(Status::resource_exhausted(message))
    }

    fn opened(&self, socket: RawFd, peer: Option<IpAddr>) -> Rc<Link> {
        self.connections.set(self.connections.get() + 1);
        let cluster_host = self.is_cluster_host(peer);
        if cluster_host {
            self.unauthenticated_cluster.set(self.unauthenticated_cluster.get() + 1);
        } else {
            self.unauthenticated.set(self.unauthenticated.get() + 1);
            if let Some(peer) = peer {
                *self.unauthenticated_per_peer.borrow_mut().entry(peer).or_insert(0) += 1;
            }
        }
        if let Some(peer) = peer {
            *self.per_peer.borrow_mut().entry(peer).or_insert(0) += 1;
        }
        let link = Rc::new(Link {
            session: RefCell::new(Rc::new(Session::anonymous())),
            ending: RefCell::default(),
            peer,
            cluster_host,
            stopping: Notify::new(),
            _counted: crate::metrics::shard::connection_opened(),
        });
        self.links.borrow_mut().insert(socket, link.clone());
        link
    }

    /// A connection authenticated: it leaves the counts before authentication.
    fn authenticated(&self, link: &Link) {
        let peer = link.peer;
        if link.cluster_host {
            assert!(self.unauthenticated_cluster.get() > 0, "an unauthenticated connection is counted");
            self.unauthenticated_cluster.set(self.unauthenticated_cluster.get() - 1);
            return;
        }
        assert!(self.unauthenticated.get() > 0, "an unauthenticated connection is counted");
        self.unauthenticated.set(self.unauthenticated.get() - 1);
        if let Some(peer) = peer {
            uncount(&self.unauthenticated_per_peer, peer);
        }
    }

    fn left(&self, socket: RawFd, link: &Link, authenticated: bool) {
        let peer = link.peer;
        if !authenticated {
            self.authenticated(link);
        }
        if let Some(peer) = peer {
            uncount(&self.per_peer, peer);
        }
        self.links.borrow_mut().remove(&socket);
        self.connections.set(self.connections.get() - 1);
        // Many partial frames given back leave the heap holding their pages; trim once they
        // add up, and once more when the last partial frame is gone, so that memory taken by
        // a burst of slow peers returns to the system.
        let released = self.partial_frame_bytes_released.get();
        let held = self.partial_frame_bytes.get();
        let burst_over = held == 0 && released >= PARTIAL_FRAME_BYTES_RELEASED_BEFORE_TRIM / 2;
        if burst_over
            || (released >= PARTIAL_FRAME_BYTES_RELEASED_BEFORE_TRIM
                && held < self.limits.partial_frame_bytes_max / 4)
        {
            self.partial_frame_bytes_released.set(0);
            crate::metrics::process::release_free_memory();
        }
        self.closed.notify_all();
    }

    /// Moves the bytes a connection's partial frame holds from `before` to `after`.
    fn charge_partial(&self, before: usize, after: usize) {
        let total = self.partial_frame_bytes.get() + after - before;
        self.partial_frame_bytes.set(total);
        if after < before {
            self.partial_frame_bytes_released.set(self.partial_frame_bytes_released.get() + before - after);
        }
    }

    fn partial_has_room(&self, bytes: usize) -> bool {
        self.partial_frame_bytes.get().saturating_add(bytes) <= self.limits.partial_frame_bytes_max
    }
}

/// Takes one from `peer`'s count in `map`, forgetting the address at zero.
fn uncount(map: &RefCell<HashMap<IpAddr, usize>>, peer: IpAddr) {
    let mut map = map.borrow_mut();
    let count = map.get_mut(&peer).expect("a connection's peer is counted");
    *count -= 1;
    if *count == 0 {
        map.remove(&peer);
    }
}

/// Accepts and serves connections until `stop` is given; then stops accepting (the listening
/// socket closes, so new clients are refused at once), lets every connection finish the
/// requests it has running and answer them, and returns once all connections are closed.
/// Returns how many connections were open when the stop was given.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Rc<H>,
    stop: Stop,
    limits: ConnectionLimits,
    security: Security,
) -> usize {
    let shard = Rc::new(Shard::new(limits, security));
    crate::runtime::spawn(check_security_each_interval(shard.clone(), stop.clone())).detach();
    let mut failures = AcceptFailures::new();
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
                failures.failed(&listener, &error.into()).await;
                continue;
            }
        };
        failures.succeeded();
        let peer = stream.peer_addr().ok().map(|address| address.ip());
        if let Some(status) = shard.refusal(peer) {
            refuse(stream, status, &shard);
            continue;
        }
        let socket = stream.as_raw_fd();
        let link = shard.opened(socket, peer);
        let (handler, shard, stop) = (handler.clone(), shard.clone(), stop.clone());
        crate::runtime::spawn(async move {
            let authenticated = open_connection(stream, peer, link.clone(), handler, stop, &shard).await;
            // The socket closed as the connection's task returned, and nothing ran since: no
            // other connection can have its number yet.
            shard.left(socket, &link, authenticated);
        })
        .detach();
    }
    drop(listener);
    for (socket, link) in shard.links.borrow().iter() {
        let _ = nix::sys::socket::shutdown(*socket, nix::sys::socket::Shutdown::Read);
        link.stopping.notify_all();
    }
    let open_at_stop = shard.connections.get();
    loop {
        let notified = shard.closed.notified();
        if shard.connections.get() == 0 {
            return open_at_stop;
        }
        notified.await;
    }
}

/// Runs the shard's security check each `SECURITY_CHECK_INTERVAL` until the stop.
async fn check_security_each_interval(shard: Rc<Shard>, stop: Stop) {
    loop {
        let stopped = futures_lite::future::or(
            async {
                crate::runtime::sleep(SECURITY_CHECK_INTERVAL).await;
                false
            },
            async {
                stop.given().await;
                true
            },
        )
        .await;
        if stopped {
            return;
        }
        shard.check_security();
    }
}

/// What a connection starts with once accepted (and handshaken).
struct Accepted {
    socket: RawFd,
    /// The peer's address, as counted against the limits.
    peer: Option<IpAddr>,
    local_address: Option<SocketAddr>,
    at: Instant,
    link: Rc<Link>,
    /// The session a verified client certificate gave, if any.
    certified: Option<Session>,
}

/// Serves an accepted connection, in plaintext or after its TLS handshake. Returns whether it
/// authenticated.
async fn open_connection<H: Handler>(
    stream: TcpStream,
    peer: Option<IpAddr>,
    link: Rc<Link>,
    handler: Rc<H>,
    stop: Stop,
    shard: &Shard,
) -> bool {
    let _ = stream.set_nodelay(true);
    keep_alive(stream.as_raw_fd());
    let accepted = Accepted {
        socket: stream.as_raw_fd(),
        peer,
        local_address: stream.local_addr().ok(),
        at: Instant::now(),
        link,
        certified: None,
    };
    let Some(tls) = &shard.tls else {
        return serve_connection(stream, accepted, handler, stop, shard).await;
    };
    let peer_address = stream.peer_addr().ok();
    let handshake = futures_lite::future::or(async { Some(tls.acceptor().accept(stream).await) }, async {
        crate::runtime::sleep(shard.limits.unauthenticated_deadline).await;
        None
    })
    .await;
    let failure = match handshake {
        Some(Ok(stream)) => {
            let identity = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
            let certified = identity.and_then(certificate_identity).map(|identity| {
                let session = shard.access.authenticate_certificate(&identity);
                *accepted.link.session.borrow_mut() = Rc::new(session.clone());
                session
            });
            return serve_connection(stream, Accepted { certified, ..accepted }, handler, stop, shard).await;
        }
        Some(Err(error)) => error.to_string(),
        None => format!(
            "it did not complete within {} ms (unauthenticated_deadline)",
            shard.limits.unauthenticated_deadline.as_millis()
        ),
    };
    if !stop.is_given() {
        if let Some(suppressed) = shard.handshake_failures.borrow_mut().admit() {
            let peer = peer_address.map_or_else(|| "a client".to_owned(), |peer| peer.to_string());
            crate::log_warn!(
                "ringpostd: a TLS handshake with {peer} failed, its connection is closed: {failure} \
                 ({suppressed} more failure(s) not logged since the last line)"
            );
        }
    }
    false
}

/// Turns TCP keepalive on for `socket` (`KEEPALIVE_IDLE`); a failure leaves the connection
/// without it, held to its other deadlines.
fn keep_alive(socket: RawFd) {
    use nix::libc::{c_int, setsockopt, socklen_t, IPPROTO_TCP, SOL_SOCKET, SO_KEEPALIVE};
    use nix::libc::{TCP_KEEPCNT, TCP_KEEPIDLE, TCP_KEEPINTVL};
    let options = [
        (SOL_SOCKET, SO_KEEPALIVE, 1),
        (IPPROTO_TCP, TCP_KEEPIDLE, KEEPALIVE_IDLE.as_secs() as c_int),
        (IPPROTO_TCP, TCP_KEEPINTVL, KEEPALIVE_INTERVAL.as_secs() as c_int),
        (IPPROTO_TCP, TCP_KEEPCNT, KEEPALIVE_PROBES as c_int),
    ];
    for (level, name, value) in options {
        // SAFETY: the option's value is one int, passed by pointer with its size.
        let _ = unsafe {
            setsockopt(socket, level, name, (&value as *const c_int).cast(), size_of::<c_int>() as socklen_t)
        };
    }
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

/// Answers a connection the shard will not serve with `status` and closes it. Its peer has
/// usually sent a request already: the connection reads (and drops) that for up to
/// `REFUSAL_LINGER`, after shutting its writing side, so that the refusal arrives before the
/// close instead of being overtaken by a reset.
fn refuse(stream: TcpStream, status: Status, shard: &Rc<Shard>) {
    let frame = encode_error(0, 0, &status);
    if shard.refusals_lingering.get() >= REFUSALS_LINGERING_MAX {
        // Too many lingering already: the refusal is sent if the socket takes it at once (on a
        // TLS port it would need a handshake first, so the connection just closes).
        if shard.tls.is_none() {
            send_now(&stream, &frame);
        }
        return;
    }
    shard.refusals_lingering.set(shard.refusals_lingering.get() + 1);
    let shard = shard.clone();
    crate::runtime::spawn(async move {
        match shard.tls.as_ref().map(Tls::acceptor) {
            Some(acceptor) => refuse_over_tls(stream, acceptor, &frame).await,
            None => refuse_in_plaintext(stream, &frame).await,
        }
        shard.refusals_lingering.set(shard.refusals_lingering.get() - 1);
    })
    .detach();
}

async fn refuse_in_plaintext(mut stream: TcpStream, frame: &[u8]) {
    if stream.write_all(frame).await.is_ok() {
        let _ = nix::sys::socket::shutdown(stream.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        let _ = stream.set_read_timeout(Some(REFUSAL_LINGER));
        drain(&mut stream).await;
    }
}

/// A TLS client reads nothing but records, so the refusal follows a handshake, within
/// `REFUSAL_LINGER` (at most `REFUSALS_LINGERING_MAX` at once, so that refusals cannot take a
/// shard's CPU); the client then reads the limit by name, as in plaintext.
async fn refuse_over_tls(stream: TcpStream, acceptor: futures_rustls::TlsAcceptor, frame: &[u8]) {
    let _ = stream.set_read_timeout(Some(REFUSAL_LINGER));
    let _ = stream.set_write_timeout(Some(REFUSAL_LINGER));
    let handshake = futures_lite::future::or(async { acceptor.accept(stream).await.ok() }, async {
        crate::runtime::sleep(REFUSAL_LINGER).await;
        None
    })
    .await;
    if let Some(mut stream) = handshake {
        if stream.write_all(frame).await.is_ok() && stream.flush().await.is_ok() {
            let _ = stream.close().await;
            drain(&mut stream).await;
        }
    }
}

/// Reads (and drops) what the peer of a refused connection sent, for up to `REFUSAL_LINGER`:
/// closing a socket with unread bytes resets it, and the reset can overtake the refusal.
async fn drain(stream: &mut (impl AsyncRead + Unpin)) {
    let started = Instant::now();
    let mut drained = 0;
    let mut buffer = [0u8; 4096];
    while drained < REFUSAL_DRAIN_BYTES_MAX && started.elapsed() < REFUSAL_LINGER {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(count) => drained += count,
        }
    }
}

/// What the accept loop knows about its failures: how long to wait before the next accept,
/// and what it has not logged yet. A spare file descriptor is kept open so that, out of
/// descriptors (EMFILE, ENFILE), the shard can still take the waiting client and tell it so
/// instead of leaving it in the listen backlog, unanswered.
struct AcceptFailures {
    backoff: Duration,
    spare: Option<OwnedFd>,
    logged_at: Option<Instant>,
    suppressed: u64,
}

impl AcceptFailures {
    fn new() -> AcceptFailures {
        AcceptFailures { backoff: ACCEPT_BACKOFF_MIN, spare: open_spare(), logged_at: None, suppressed: 0 }
    }

    fn succeeded(&mut self) {
        self.backoff = ACCEPT_BACKOFF_MIN;
    }

    async fn failed(&mut self, listener: &TcpListener, error: &std::io::Error) {
        let errno = error.raw_os_error().map(Errno::from_raw);
        let out_of_descriptors = matches!(errno, Some(Errno::EMFILE | Errno::ENFILE));
        let mut refused = 0;
        if out_of_descriptors {
            if let Some(spare) = self.spare.take() {
                drop(spare);
                refused = refuse_waiting(listener, error).await;
                self.spare = open_spare();
            }
        }
        let now = Instant::now();
        if self.logged_at.is_none_or(|at| now.duration_since(at) >= ACCEPT_ERROR_LOG_INTERVAL) {
            let suppressed = std::mem::take(&mut self.suppressed);
            let refused = if refused > 0 { "; refused the waiting client" } else { "" };
            crate::log_warn!(
                "ringpostd: accept failed: {error}{refused} ({suppressed} more failure(s) not logged since the last line; \
                 retrying in {} ms)",
                self.backoff.as_millis()
            );
            self.logged_at = Some(now);
        } else {
            self.suppressed += 1;
        }
        crate::runtime::sleep(self.backoff).await;
        // A failure that still answered a client made progress: the next client is not kept
        // waiting longer. Only failures that take no one back off further.
        self.backoff =
            if refused > 0 { ACCEPT_BACKOFF_MIN } else { (self.backoff * 2).min(ACCEPT_BACKOFF_MAX) };
    }
}

/// The spare descriptor `AcceptFailures` keeps.
fn open_spare() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null").ok().map(OwnedFd::from)
}

/// Takes one client waiting on `listener` (with the descriptor the spare freed), sends it a
/// `ResourceExhausted` refusal if its socket takes it at once, and closes it, without the
/// lingering of `refuse` (which would hold the descriptor the spare needs back). Returns how
/// many it refused (0 or 1); waits `ACCEPT_BACKOFF_MIN` at most for the client.
async fn refuse_waiting(listener: &TcpListener, error: &std::io::Error) -> usize {
    let accepted = futures_lite::future::or(async { listener.accept().await.ok() }, async {
        crate::runtime::sleep(ACCEPT_BACKOFF_MIN).await;
        None
    })
    .await;
    let Some(stream) = accepted else { return 0 };
    let status = Status::resource_exhausted(format!(
        "the daemon has no file descriptor left for a new connection ({error}); raise its open-file limit"
    ));
    send_now(&stream, &encode_error(0, 0, &status));
    1
}

/// Sends `frame` if the socket takes it at once, and shuts the writing side.
fn send_now(stream: &TcpStream, frame: &[u8]) {
    let _ =
        nix::sys::socket::send(stream.as_raw_fd(), frame, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL);
    let _ = nix::sys::socket::shutdown(stream.as_raw_fd(), nix::sys::socket::Shutdown::Write);
}

/// Responses waiting for the socket. Each holds the in-flight permit of its request until it is
/// written, so running plus queued requests never exceed the per-connection bound.
///
/// Once the socket takes no more (`broken`: a write failed, the peer reset the connection),
/// nothing waits for it any more: what was queued is dropped at once, and so is every response
/// pushed after, with its permit, its stream reservation and the buffers it gathered. Requests
/// still running then finish into nothing, the connection's last permit comes back, and the
/// connection closes with all it held.
#[derive(Default)]
pub struct Outbound {
    queue: RefCell<VecDeque<Queued>>,
    ready: Notify,
    closed: Cell<bool>,
    /// The socket takes no more bytes: responses are dropped instead of queued.
    broken: Cell<bool>,
    /// The socket took no byte for the write-stall deadline while answers waited.
    stalled: Cell<bool>,
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
        if self.broken.get() {
            // Nobody will write it: what it holds goes back now, not when the connection ends.
            return;
        }
        self.queue.borrow_mut().push_back((frame.into(), permit, reservation));
        self.ready.notify_all();
    }
    /// The socket takes no more: drops what is queued (permits, reservations and gathered
    /// buffers with it) and everything pushed from now on, and tells streams the peer is gone.
    fn break_off(&self) {
        self.broken.set(true);
        let dropped: VecDeque<Queued> = std::mem::take(&mut *self.queue.borrow_mut());
        drop(dropped);
        self.peer_left();
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

/// Serves one connection until its peer goes, it breaks a limit, its session ends, or the
/// shard stops. Returns whether it authenticated.
async fn serve_connection<H: Handler, S: Transport>(
    stream: S,
    accepted: Accepted,
    handler: Rc<H>,
    stop: Stop,
    shard: &Shard,
) -> bool {
    let Accepted { socket, peer, local_address, at, link, certified } = accepted;
    let (mut reader, writer) = futures_lite::io::split(stream);
    let outbound = Rc::new(Outbound::default());
    let stall = Stall {
        deadline: shard.limits.write_stall_deadline,
        stop: stop.clone(),
        stopping: link.stopping.clone(),
    };
    let writer_task = crate::runtime::spawn(write_responses(writer, socket, outbound.clone(), stall));
    let watch = Rc::new(Watch::new(at + shard.limits.unauthenticated_deadline, shard.limits.idle_deadline));
    let mut connection = Connection {
        handler,
        outbound: outbound.clone(),
        in_flight: Rc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX)),
        session: link.session.borrow().clone(),
        access: shard.access.clone(),
        local_address,
        link: link.clone(),
        watch: watch.clone(),
    };
    let watchdog = crate::runtime::spawn(watch_deadline(watch.clone(), socket));
    let mut reading = Reading {
        shard,
        socket,
        link: link.clone(),
        plaintext: S::PLAINTEXT,
        splitter: FrameSplitter::new(),
        chunk: vec![0u8; READ_CHUNK_UNAUTHENTICATED_BYTES],
        charged: 0,
        authenticated: false,
        unauthenticated_until: at + shard.limits.unauthenticated_deadline,
        frame_started: None,
        last_frame: at,
        refusal: None,
        deadline_kind: Deadline::Unauthenticated,
    };
    if certified.is_some() {
        reading.authenticate();
        let deadline = reading.deadline(Instant::now(), false);
        watch.set_kind(deadline, reading.deadline_kind == Deadline::Idle);
    }
    // Once the shard is told to stop, nothing more is read (`serve` shuts the socket's reading
    // side, so a pending read ends): the requests read so far run and are answered, and the
    // connection closes after them.
    'reading: while !outbound.closed.get() && !stop.is_given() {
        let frames = match reading.read_batch(&mut reader).await {
            Ok(frames) => frames,
            Err(refusal) => {
                reading.refusal = refusal;
                break;
            }
        };
        let completed = !frames.is_empty();
        for frame in frames {
            if frame.header.is_response() {
                let status = Status::new(ErrorCode::ProtocolError, "a client sent a response frame");
                outbound.push(fail(&frame.header, &status), None);
                break 'reading;
            }
            // The shard is behind, not the peer: its deadlines wait while it catches up.
            let waiting = (connection.in_flight.available() == 0).then(|| {
                watch.set(at + Duration::from_secs(365 * 24 * 3600));
                Instant::now()
            });
            let Ok(permit) = connection.in_flight.clone().acquire_static_permit(1).await else {
                break 'reading;
            };
            if outbound.broken.get() {
                // Nobody reads the answers any more (the permit came back with the queue).
                break 'reading;
            }
            if let Some(waiting) = waiting {
                reading.postpone(waiting.elapsed());
            }
            if frame.header.command == Command::Authenticate.code() {
                if !connection.authenticate(frame, permit, &mut reading) {
                    break 'reading;
                }
                continue;
            }
            connection.dispatch(frame, permit);
        }
        if reading.refusal.is_none() {
            reading.refusal = reading.unauthenticated_refusal();
        }
        if reading.refusal.is_some() {
            break;
        }
        let deadline = reading.deadline(Instant::now(), completed);
        watch.set_kind(deadline, reading.deadline_kind == Deadline::Idle);
    }
    watch.finish();
    watchdog.await;
    if let Some(ending) = link.ending.borrow_mut().take() {
        reading.refusal = Some(ending);
    } else if watch.expired.get() && !stop.is_given() {
        reading.refusal = Some(reading.deadline_status());
    }
    if let Some(status) = reading.refusal.take() {
        outbound.push(encode_error(0, 0, &status), None);
    }
    shard.charge_partial(reading.charged, 0);
    let authenticated = reading.authenticated;
    drop(reading);
    // The peer is done sending: streams stop; requests already running finish and answer;
    // then the connection closes.
    outbound.peer_left();
    let _ = connection.in_flight.acquire(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX).await;
    outbound.close();
    writer_task.await;
    if outbound.stalled.get() {
        if let Some(suppressed) = shard.write_stalls.borrow_mut().admit() {
            let peer = peer.map_or_else(|| "a client".to_owned(), |peer| peer.to_string());
            let limit = shard.limits.write_stall_deadline;
            let deadline = if stop.is_given() { limit.min(WRITE_STALL_DEADLINE_STOPPING) } else { limit };
            crate::log_info!(
                "ringpostd: reset a connection from {peer}: its socket took no byte for {} ms while answers \
                 waited (write_stall_deadline) ({suppressed} more not logged since the last line)",
                deadline.as_millis()
            );
        }
    }
    authenticated
}

/// What one connection's requests are dispatched with: its handler, its responses' queue, its
/// bound on requests in flight, and who it acts as now.
struct Connection<H> {
    handler: Rc<H>,
    outbound: Rc<Outbound>,
    in_flight: Rc<Semaphore>,
    session: Rc<Session>,
    access: Rc<Access>,
    local_address: Option<SocketAddr>,
    link: Rc<Link>,
    /// The connection's deadlines, which its open streams suspend the idle one of.
    watch: Rc<Watch>,
}

impl<H: Handler> Connection<H> {
    /// Runs one request as its own task, as the connection's session is now.
    fn dispatch(&self, frame: Frame, permit: StaticPermit) {
        let handler = self.handler.clone();
        let outbound = self.outbound.clone();
        let responder = Responder {
            outbound: outbound.clone(),
            local_address: self.local_address,
            session: self.session.clone(),
            access: self.access.clone(),
        };
        let command = frame.header.command;
        let stream = command == Command::StreamingPull.code();
        // A stream the client keeps open is not idleness, however quiet its subscription: the
        // idle deadline waits while one is open (a dead peer is found by TCP keepalive).
        let open_stream = stream.then(|| OpenStream::new(self.watch.clone()));
        crate::runtime::spawn(async move {
            let started = std::time::Instant::now();
            let response = handler.handle(frame.header, frame.body, &responder).await;
            drop(open_stream);
            // A stream's time is its subscriber's session, not a latency.
            let timed = !stream;
            crate::metrics::requests::record(
                command,
                response_code(&response),
                timed.then(|| started.elapsed()),
            );
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

    /// Answers an Authenticate before the frames after it are dispatched: on success the
    /// connection acts as the token's holder from the next frame on; on failure it answers
    /// `Unauthenticated` and closes (false).
    fn authenticate(&mut self, frame: Frame, permit: StaticPermit, reading: &mut Reading) -> bool {
        let session = access_body::<AuthenticateRequest>(&frame.body)
            .map_err(|status| Status::new(ErrorCode::Unauthenticated, status.message))
            .and_then(|request| self.access.authenticate_token(request.token.as_str()).map_err(Status::from));
        match session {
            Ok(session) => {
                let principal = session.principal.to_string();
                self.session = Rc::new(session);
                *self.link.session.borrow_mut() = self.session.clone();
                reading.authenticate();
                self.outbound.push(respond(&frame.header, &AuthenticateResponse { principal }), Some(permit));
                true
            }
            Err(status) => {
                let closing = format!("authentication failed, the connection closes: {}", status.message);
                self.outbound.push(fail(&frame.header, &status), Some(permit));
                reading.refusal = Some(Status::new(ErrorCode::Unauthenticated, closing));
                false
            }
        }
    }
}

/// The reading side of one connection: its frame splitter, what its partial frame holds of the
/// shard's budget, and the times its deadlines run from.
struct Reading<'a> {
    shard: &'a Shard,
    socket: RawFd,
    /// The connection as its shard counts it.
    link: Rc<Link>,
    /// Whether the stream is the socket's bytes (not TLS), so `FIONREAD` counts them.
    plaintext: bool,
    splitter: FrameSplitter,
    chunk: Vec<u8>,
    /// Bytes the splitter's partial frame holds, as last counted against the shard's budget.
    charged: usize,
    authenticated: bool,
    unauthenticated_until: Instant,
    /// When the first byte of the frame not yet whole arrived.
    frame_started: Option<Instant>,
    last_frame: Instant,
    /// The error to close with once the frames already read are dispatched.
    refusal: Option<Status>,
    /// Which deadline the watchdog holds the connection to.
    deadline_kind: Deadline,
}

/// The deadlines of a connection: the earliest that applies is the one it is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    Unauthenticated,
    Frame,
    Idle,
}

impl Reading<'_> {
    /// Reads once and returns the frames completed. `Err(None)`: the peer is gone (or the
    /// read side was shut); `Err(Some(status))`: the connection closes with that error.
    async fn read_batch<S: Transport>(
        &mut self,
        reader: &mut futures_lite::io::ReadHalf<S>,
    ) -> Result<Vec<Frame>, Option<Status>> {
        // A large body is read straight into its own buffer, not copied through the chunk.
        if self.splitter.body_room_bytes(0).is_some() {
            // What the socket holds is only a hint of what a TLS stream will read: none is
            // taken, and the body's room grows as its bytes come.
            let waiting = if self.plaintext && self.splitter.body_room_unfilled() == 0 {
                bytes_waiting(self.socket)
            } else {
                0
            };
            let size = self.splitter.body_room_bytes(waiting).expect("checked above");
            if self.splitter.body_room_unfilled() == 0
                && !self.shard.partial_has_room(size.saturating_sub(self.charged))
            {
                return Err(Some(self.over_budget()));
            }
            let room = self.splitter.body_room_for(waiting).expect("checked above");
            let count = match reader.read(room).await {
                Ok(0) | Err(_) => return Err(None),
                Ok(count) => count,
            };
            let frames = self.splitter.body_filled(count).into_iter().collect();
            self.recharge();
            return Ok(frames);
        }
        let count = match reader.read(&mut self.chunk).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(count) => count,
        };
        match self.splitter.push(&self.chunk[..count]) {
            Ok(frames) => {
                if self.recharge() {
                    self.refusal = Some(self.over_budget());
                }
                Ok(frames)
            }
            Err(error) => Err(Some(Status::new(ErrorCode::ProtocolError, error.to_string()))),
        }
    }

    /// Counts what the partial frame holds now against the shard's budget; true if it grew
    /// past the budget.
    fn recharge(&mut self) -> bool {
        let held = self.splitter.held_bytes();
        self.shard.charge_partial(self.charged, held);
        let grew = held > self.charged;
        self.charged = held;
        grew && !self.shard.partial_has_room(0)
    }

    fn over_budget(&self) -> Status {
        Status::resource_exhausted(format!(
            "frames not yet whole on this shard already hold {} of their {} bytes (partial_frame_bytes_max); \
             try again later",
            self.shard.partial_frame_bytes.get(),
            self.shard.limits.partial_frame_bytes_max
        ))
    }

    /// After a read that `completed` frames (or not): when the connection must next show
    /// progress. Only whole frames count: bytes that never complete one move no deadline.
    fn deadline(&mut self, now: Instant, completed: bool) -> Instant {
        if completed {
            self.last_frame = now;
            if !self.authenticated && self.anonymous_may_act() {
                self.authenticate();
            }
        }
        let limits = &self.shard.limits;
        let partial = self.splitter.buffered_bytes() > 0 || self.splitter.header().is_some();
        if !partial {
            self.frame_started = None;
        } else if completed || self.frame_started.is_none() {
            // A read that ended a frame and began the next starts the next one's clock.
            self.frame_started = Some(now);
        }
        let (mut deadline, mut kind) = if self.authenticated {
            (self.last_frame + limits.idle_deadline, Deadline::Idle)
        } else {
            (self.unauthenticated_until, Deadline::Unauthenticated)
        };
        if let Some(started) = self.frame_started {
            let body_bytes = self.splitter.header().map_or(0, |header| header.body_length as u64);
            let frame = limits.frame_deadline(started, body_bytes);
            if frame < deadline {
                (deadline, kind) = (frame, Deadline::Frame);
            }
        }
        self.deadline_kind = kind;
        deadline
    }

    /// Whether a connection without a credential may do anything, so that its first whole
    /// frame ends its unauthenticated phase.
    fn anonymous_may_act(&self) -> bool {
        self.shard.access.anonymous_may_act()
    }

    /// The connection's unauthenticated phase is over: it gets the full read buffer, and
    /// leaves the shard's count of connections before authentication.
    fn authenticate(&mut self) {
        if !self.authenticated {
            self.authenticated = true;
            self.shard.authenticated(&self.link);
            self.chunk = vec![0u8; READ_CHUNK_BYTES];
        }
    }

    /// Before authentication, when anonymous may not act: the refusal of a frame announcing a
    /// body over `FRAME_BODY_BYTES_UNAUTHENTICATED_MAX`, before any more of it is read.
    fn unauthenticated_refusal(&self) -> Option<Status> {
        if self.authenticated || self.anonymous_may_act() {
            return None;
        }
        let header = self.splitter.header()?;
        (header.body_length as usize > FRAME_BODY_BYTES_UNAUTHENTICATED_MAX).then(|| {
            Status::new(
                ErrorCode::Unauthenticated,
                format!(
                    "authenticate before sending large requests: this frame's body is {} bytes, and before \
                     authentication at most {FRAME_BODY_BYTES_UNAUTHENTICATED_MAX} are read \
                     (FRAME_BODY_BYTES_UNAUTHENTICATED_MAX)",
                    header.body_length
                ),
            )
        })
    }

    /// Moves the deadlines later by `waited`, the time the shard kept the reader from reading.
    fn postpone(&mut self, waited: Duration) {
        if waited < Duration::from_millis(1) {
            return;
        }
        self.unauthenticated_until += waited;
        self.last_frame += waited;
        if let Some(started) = &mut self.frame_started {
            *started += waited;
        }
    }

    /// The error a connection gets when a deadline closes it.
    fn deadline_status(&self) -> Status {
        let limits = &self.shard.limits;
        let message = if self.deadline_kind == Deadline::Frame {
            format!(
                "a frame did not arrive within {} ms plus its length at {} bytes/s (frame_deadline_base, \
                 frame_bytes_per_second_min)",
                limits.frame_deadline_base.as_millis(),
                limits.frame_bytes_per_second_min
            )
        } else if self.deadline_kind == Deadline::Unauthenticated {
            format!(
                "the connection did not authenticate within {} ms (unauthenticated_deadline)",
                limits.unauthenticated_deadline.as_millis()
            )
        } else {
            format!("no frame came for {} s (idle_deadline)", limits.idle_deadline.as_secs())
        };
        Status::new(ErrorCode::DeadlineExceeded, message)
    }
}

/// Bytes the socket has received that no read took yet (`FIONREAD`); 0 if it cannot say.
fn bytes_waiting(socket: RawFd) -> usize {
    let mut waiting: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points at one.
    let result = unsafe { nix::libc::ioctl(socket, nix::libc::FIONREAD, &mut waiting) };
    if result == 0 {
        waiting.max(0) as usize
    } else {
        0
    }
}

/// The deadline a connection's watchdog holds it to. The reader moves it; the watchdog sleeps
/// until it and shuts the socket's reading side if it passed, which ends the reader's pending
/// read (as a stop does). Moving it later costs nothing (the watchdog finds out when it wakes);
/// only moving it earlier wakes the watchdog, which happens once per frame that spans reads.
///
/// The idle deadline is suspended while a stream is open on the connection, and runs again
/// from the moment the last one ended: a subscriber's stream on a quiet subscription sends no
/// frame for hours and is not idle.
struct Watch {
    deadline: Cell<Instant>,
    /// Whether `deadline` is the idle one (the one open streams suspend).
    idle: Cell<bool>,
    /// The connection's idle deadline (`ConnectionLimits::idle_deadline`).
    idle_deadline: Duration,
    /// Streams open now, and when the last one ended.
    streams: Cell<usize>,
    streams_ended: Cell<Option<Instant>>,
    /// The deadline the watchdog sleeps until.
    watched: Cell<Instant>,
    earlier: Notify,
    expired: Cell<bool>,
    finished: Cell<bool>,
}

impl Watch {
    fn new(deadline: Instant, idle_deadline: Duration) -> Watch {
        Watch {
            deadline: Cell::new(deadline),
            idle: Cell::new(false),
            idle_deadline,
            streams: Cell::new(0),
            streams_ended: Cell::new(None),
            watched: Cell::new(deadline),
            earlier: Notify::new(),
            expired: Cell::new(false),
            finished: Cell::new(false),
        }
    }

    fn set(&self, deadline: Instant) {
        self.set_kind(deadline, false);
    }

    /// Sets the deadline, saying whether it is the idle one.
    fn set_kind(&self, deadline: Instant, idle: bool) {
        self.deadline.set(deadline);
        self.idle.set(idle);
        if deadline < self.watched.get() {
            self.earlier.notify_all();
        }
    }

    /// When the deadline in force passes, given the connection's open streams: `None` while the
    /// idle deadline waits for them to end.
    fn effective_deadline(&self) -> Option<Instant> {
        let deadline = self.deadline.get();
        if !self.idle.get() {
            return Some(deadline);
        }
        if self.streams.get() > 0 {
            return None;
        }
        let resumed = self.streams_ended.get().map(|ended| ended + self.idle_deadline);
        Some(resumed.map_or(deadline, |resumed| resumed.max(deadline)))
    }

    /// The connection is done reading: the watchdog ends (before the socket closes, so it
    /// never shuts another connection's socket that reused the number).
    fn finish(&self) {
        self.finished.set(true);
        self.earlier.notify_all();
    }
}

async fn watch_deadline(watch: Rc<Watch>, socket: RawFd) {
    loop {
        let earlier = watch.earlier.notified();
        if watch.finished.get() {
            return;
        }
        let Some(deadline) = watch.effective_deadline() else {
            // Suspended by open streams: any new deadline, or the last stream's end, wakes it.
            watch.watched.set(Instant::now() + Duration::from_secs(365 * 24 * 3600));
            earlier.await;
            continue;
        };
        watch.watched.set(deadline);
        let now = Instant::now();
        if deadline <= now {
            watch.expired.set(true);
            let _ = nix::sys::socket::shutdown(socket, nix::sys::socket::Shutdown::Read);
            return;
        }
        futures_lite::future::or(crate::runtime::sleep(deadline - now), earlier).await;
    }
}

/// A stream open on a connection, for as long as its request runs: the connection's idle
/// deadline waits until the last one ends.
struct OpenStream {
    watch: Rc<Watch>,
}

impl OpenStream {
    fn new(watch: Rc<Watch>) -> OpenStream {
        watch.streams.set(watch.streams.get() + 1);
        OpenStream { watch }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let streams = self.watch.streams.get();
        debug_assert!(streams > 0, "a stream is counted closed once");
        self.watch.streams.set(streams - 1);
        if streams == 1 {
            self.watch.streams_ended.set(Some(Instant::now()));
            self.watch.earlier.notify_all();
        }
    }
}

/// The status code a response answers with (0 for any answer that is not an error).
fn response_code(response: &Response) -> u16 {
    let Response::Frame(frame) = response else { return 0 };
    match FrameHeader::decode(frame) {
        Ok(header) if header.is_error() => {
            ringpost_wire::frame::decode_error(&frame[ringpost_wire::limits::FRAME_HEADER_BYTES..]).code
                as u16
        }
        _ => 0,
    }
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

/// How long a connection's writer may wait for its socket without a byte taken, and the stop
/// that shortens it (`WRITE_STALL_DEADLINE_STOPPING`): given (`stop`), and told to this
/// connection (`stopping`, which `serve` notifies at the stop).
struct Stall {
    deadline: Duration,
    stop: Stop,
    stopping: Notify,
}

async fn write_responses<S: Transport>(
    writer: futures_lite::io::WriteHalf<S>,
    socket: RawFd,
    outbound: Rc<Outbound>,
    stall: Stall,
) {
    let progress = WriteProgress::default();
    let writing = write_all_responses(Tracked { inner: writer, progress: &progress }, socket, &outbound);
    let written = futures_lite::future::or(writing, watch_writes(&progress, &stall)).await;
    if progress.stalled.get() {
        // What the socket holds would otherwise be sent for minutes after the close, to a peer
        // that does not read: a reset drops it (and tells the peer).
        outbound.stalled.set(true);
        let linger = nix::libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: the option's value is one `linger`, passed by pointer with its size; the
        // socket is open (the reader's half holds it until the connection's task returns).
        let _ = unsafe {
            nix::libc::setsockopt(
                socket,
                nix::libc::SOL_SOCKET,
                nix::libc::SO_LINGER,
                (&linger as *const nix::libc::linger).cast(),
                size_of::<nix::libc::linger>() as nix::libc::socklen_t,
            )
        };
    }
    if written.is_err() && !outbound.closed.get() {
        // The peer is gone (reset, or the socket broke) or does not read: the reader stops now
        // rather than at its next failed read or deadline. The socket is still open: the
        // reader's half holds it until the connection's task returns, after this one.
        let _ = nix::sys::socket::shutdown(socket, nix::sys::socket::Shutdown::Read);
    }
    // Whatever ended the writer (a broken or stalled socket, or the close), nobody reads any
    // more: what is queued, and what running requests answer later, is dropped with what it
    // holds.
    outbound.break_off();
}

/// Whether a connection's writer is waiting for its socket, and since when the socket took no
/// byte (the wait's beginning, or the last byte taken); and whether it waited too long.
#[derive(Default)]
struct WriteProgress {
    since: Cell<Option<Instant>>,
    stalled: Cell<bool>,
}

impl WriteProgress {
    /// The writer has answers to write: the wait for the socket begins.
    fn begin(&self) {
        self.since.set(Some(Instant::now()));
    }

    /// The socket took bytes.
    fn advanced(&self) {
        if self.since.get().is_some() {
            self.since.set(Some(Instant::now()));
        }
    }

    /// Everything taken was written: the writer waits for answers, not for the socket.
    fn end(&self) {
        self.since.set(None);
    }
}

/// Resolves with an error once the writer has waited for its socket without a byte taken for
/// the stall deadline (the shorter one once the shard stops). It wakes once per deadline while
/// the writer waits for answers, and at the stop.
async fn watch_writes(progress: &WriteProgress, stall: &Stall) -> std::io::Result<()> {
    loop {
        // Registered before looking, so that a stop in between is not missed.
        let stopped = stall.stopping.notified();
        let stopping = stall.stop.is_given();
        let deadline =
            if stopping { stall.deadline.min(WRITE_STALL_DEADLINE_STOPPING) } else { stall.deadline };
        let now = Instant::now();
        let wake = match progress.since.get() {
            Some(since) if since + deadline <= now => {
                progress.stalled.set(true);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the socket took no byte within write_stall_deadline",
                ));
            }
            Some(since) => since + deadline,
            None => now + deadline,
        };
        let sleep = crate::runtime::sleep(wake - now);
        if stopping {
            sleep.await;
        } else {
            futures_lite::future::or(sleep, stopped).await;
        }
    }
}

/// A connection's writing half, telling its `WriteProgress` of every byte the socket takes.
struct Tracked<'a, W> {
    inner: W,
    progress: &'a WriteProgress,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Tracked<'_, W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(context, bytes);
        if matches!(polled, std::task::Poll::Ready(Ok(written)) if written > 0) {
            self.progress.advanced();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buffers: &[IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(context, buffers);
        if matches!(polled, std::task::Poll::Ready(Ok(written)) if written > 0) {
            self.progress.advanced();
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // A flush that ends sent what TLS held: bytes the socket took.
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(context);
        if matches!(polled, std::task::Poll::Ready(Ok(()))) {
            self.progress.advanced();
        }
        polled
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_close(context)
    }
}

/// `socket` is the stream's descriptor, for vectored writes, which glommio's stream lacks; it
/// stays open as long as `writer` does.
async fn write_all_responses<S: Transport>(
    mut writer: Tracked<'_, futures_lite::io::WriteHalf<S>>,
    socket: RawFd,
    outbound: &Outbound,
) -> std::io::Result<()> {
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
        writer.progress.begin();
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
                    write_runs(&mut writer, socket, runs).await?;
                    gathered.clear();
                    continue;
                }
                Response::Reserved(..) => unreachable!("unwrapped above"),
            };
            if frame.len() >= COALESCE_BYTES_MAX {
                if !gathered.is_empty() {
                    writer.write_all(&gathered).await?;
                }
                gathered.clear();
                writer.write_all(&frame).await?;
            } else {
                gathered.extend_from_slice(&frame);
                if gathered.len() >= COALESCE_BYTES_MAX {
                    writer.write_all(&gathered).await?;
                    gathered.clear();
                }
            }
        }
        if !gathered.is_empty() {
            writer.write_all(&gathered).await?;
            gathered.clear();
        }
        // TLS keeps what the socket did not take at once in its own buffers; a write to the
        // socket itself has nothing left behind.
        if !S::PLAINTEXT {
            writer.flush().await?;
        }
        writer.progress.end();
        permits.clear();
    }
    // TLS's last records and its close are writes like any other: a peer that does not read
    // holds them to the same deadline.
    writer.progress.begin();
    let _ = writer.flush().await;
    let _ = writer.close().await;
    Ok(())
}

/// Writes `runs` in order with as few vectored writes as the socket allows. A write that
/// finds the socket full hands the first unwritten run to glommio's stream, which waits for
/// room through the ring, and the rest carries on vectored.
async fn write_runs<S: Transport>(
    writer: &mut Tracked<'_, futures_lite::io::WriteHalf<S>>,
    socket: RawFd,
    mut runs: Vec<&[u8]>,
) -> std::io::Result<()> {
    runs.retain(|run| !run.is_empty());
    if !S::PLAINTEXT {
        // TLS encrypts the runs into its own buffers anyway: they go through the stream, small
        // ones gathered first so that each write makes a full record, not one per run.
        let mut pending =
            Vec::with_capacity(runs.iter().map(|run| run.len()).sum::<usize>().min(COALESCE_BYTES_MAX));
        for run in runs {
            if pending.len() + run.len() > COALESCE_BYTES_MAX && !pending.is_empty() {
                writer.write_all(&pending).await?;
                pending.clear();
            }
            if run.len() >= COALESCE_BYTES_MAX {
                writer.write_all(run).await?;
            } else {
                pending.extend_from_slice(run);
            }
        }
        return writer.write_all(&pending).await;
    }
    let mut slices = Vec::with_capacity(runs.len().min(WRITE_RUNS_MAX));
    let mut first = 0;
    while first < runs.len() {
        slices.clear();
        slices.extend(runs[first..].iter().take(WRITE_RUNS_MAX).map(|run| IoSlice::new(run)));
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        // No address (the socket is connected); the type parameter only names the kind it lacks.
        match sendmsg::<UnixAddr>(socket, &slices, &[], flags, None) {
            Ok(mut written) => {
                if written > 0 {
                    writer.progress.advanced();
                }
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

    fn shard(limits: ConnectionLimits) -> Shard {
        Shard::new(limits, Security::off())
    }

    /// Each limit refuses with its own name; a connection that authenticates leaves room before
    /// authentication and none in the shard; leaving gives everything back.
    #[test]
    fn each_connection_limit_refuses_by_name() {
        let limits = ConnectionLimits {
            connections_per_shard_max: 3,
            connections_per_peer_max: 2,
            connections_unauthenticated_max: 2,
            ..ConnectionLimits::default()
        };
        let shard = shard(limits);
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        let named = |status: Option<Status>| status.map(|status| status.message);
        let first = shard.opened(10, Some(one));
        let second = shard.opened(11, Some(one));
        assert!(named(shard.refusal(Some(two))).unwrap().contains("connections_unauthenticated_max"));
        shard.authenticated(&first);
        assert!(named(shard.refusal(Some(one))).unwrap().contains("connections_per_peer_max"));
        assert_eq!(shard.refusal(Some(two)), None);
        let third = shard.opened(12, Some(two));
        assert!(named(shard.refusal(None)).unwrap().contains("connections_per_shard_max"));
        shard.left(10, &first, true);
        shard.left(11, &second, false);
        shard.left(12, &third, false);
        assert_eq!((shard.connections.get(), shard.unauthenticated.get()), (0, 0));
        assert!(shard.per_peer.borrow().is_empty() && shard.links.borrow().is_empty());
    }

    /// One address holds at most its share of the connections before authentication; the
    /// cluster's hosts have a budget of their own, beside the strangers' and outside any share;
    /// authenticating or leaving gives a connection's place back to its own budget.
    #[test]
    fn strangers_take_a_share_before_authentication_and_never_the_clusters_budget() {
        let limits = ConnectionLimits {
            connections_unauthenticated_max: 4,
            connections_unauthenticated_per_peer_max: 2,
            ..ConnectionLimits::default()
        };
        let node: IpAddr = "10.0.0.9".parse().unwrap();
        let shard = Shard::new(limits, Security::off().with_cluster_hosts(ClusterHosts::new([node])));
        let stranger = |last: u8| -> IpAddr { format!("10.0.1.{last}").parse().unwrap() };
        let named = |status: Option<Status>| status.map(|status| status.message).unwrap_or_default();
        let mut strangers = vec![shard.opened(10, Some(stranger(1))), shard.opened(11, Some(stranger(1)))];
        assert!(named(shard.refusal(Some(stranger(1)))).contains("connections_unauthenticated_per_peer_max"));
        strangers.extend([shard.opened(12, Some(stranger(2))), shard.opened(13, Some(stranger(2)))]);
        assert!(named(shard.refusal(Some(stranger(3)))).contains("connections_unauthenticated_max"));
        // The cluster's node is still let in, again and again, and counts nowhere else.
        let nodes: Vec<Rc<Link>> = (20..30)
            .map(|socket| {
                assert_eq!(shard.refusal(Some(node)), None);
                shard.opened(socket, Some(node))
            })
            .collect();
        assert_eq!((shard.unauthenticated.get(), shard.unauthenticated_cluster.get()), (4, 10));
        // A stranger authenticating makes room for another of its address.
        shard.authenticated(&strangers[0]);
        assert_eq!(shard.refusal(Some(stranger(1))), None);
        for (index, link) in strangers.iter().enumerate() {
            shard.left(10 + index as RawFd, link, index == 0);
        }
        for (index, link) in nodes.iter().enumerate() {
            let authenticated = index % 2 == 0;
            if authenticated {
                shard.authenticated(link);
            }
            shard.left(20 + index as RawFd, link, authenticated);
        }
        assert_eq!(
            (shard.connections.get(), shard.unauthenticated.get(), shard.unauthenticated_cluster.get()),
            (0, 0, 0)
        );
        assert!(shard.unauthenticated_per_peer.borrow().is_empty() && shard.per_peer.borrow().is_empty());
    }

    /// A host that becomes one of the cluster's (a node added) is let into the cluster's budget
    /// from then on, and one that stops being one (a node removed) into the strangers'; a
    /// connection open meanwhile leaves the budget it entered.
    #[test]
    fn the_clusters_budget_follows_its_hosts_and_open_connections_keep_theirs() {
        let limits = ConnectionLimits {
            connections_unauthenticated_max: 2,
            connections_unauthenticated_per_peer_max: 2,
            ..ConnectionLimits::default()
        };
        let (old, new): (IpAddr, IpAddr) = ("10.0.0.9".parse().unwrap(), "10.0.0.10".parse().unwrap());
        let hosts = ClusterHosts::new([old]);
        let shard = Shard::new(limits, Security::off().with_cluster_hosts(hosts.clone()));
        let strangers = [shard.opened(10, Some(new)), shard.opened(11, Some(new))];
        let from_old = shard.opened(12, Some(old));
        assert!(shard.refusal(Some(new)).is_some(), "a stranger beyond the strangers' budget");
        assert!(hosts.replace([new]));
        assert!(!hosts.replace([new]), "the same hosts change nothing");
        assert_eq!(shard.refusal(Some(new)), None, "the new node is let in beside strangers");
        let from_new = shard.opened(13, Some(new));
        assert_eq!((shard.unauthenticated.get(), shard.unauthenticated_cluster.get()), (2, 2));
        assert!(shard.refusal(Some(old)).is_some(), "the removed node's host is a stranger now");
        shard.left(12, &from_old, false);
        shard.authenticated(&from_new);
        shard.left(13, &from_new, true);
        assert_eq!((shard.unauthenticated.get(), shard.unauthenticated_cluster.get()), (2, 0));
        for (index, link) in strangers.iter().enumerate() {
            shard.left(10 + index as RawFd, link, false);
        }
        assert_eq!((shard.connections.get(), shard.unauthenticated.get()), (0, 0));
    }

    /// The budget for partial frames counts what each holds and what they give back.
    #[test]
    fn partial_frames_count_against_the_shard_budget() {
        let shard = shard(ConnectionLimits { partial_frame_bytes_max: 1000, ..ConnectionLimits::default() });
        shard.charge_partial(0, 600);
        assert!(shard.partial_has_room(400) && !shard.partial_has_room(401));
        shard.charge_partial(600, 100);
        assert_eq!(shard.partial_frame_bytes.get(), 100);
        assert_eq!(shard.partial_frame_bytes_released.get(), 500);
    }

    /// A frame's deadline is its base plus its length at the minimum rate.
    #[test]
    fn a_frame_deadline_grows_with_its_length() {
        let limits = ConnectionLimits::default();
        let start = Instant::now();
        assert_eq!(limits.frame_deadline(start, 0), start + FRAME_DEADLINE_BASE);
        let largest = limits.frame_deadline(start, FRAME_BYTES_PER_SECOND_MIN * 16);
        assert_eq!(largest, start + FRAME_DEADLINE_BASE + Duration::from_secs(16));
    }

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
        let responder = Responder::unconnected();
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

    /// Open streams suspend the idle deadline, and only the idle one; once the last stream
    /// ends, the idle deadline counts from that end.
    #[test]
    fn open_streams_suspend_the_idle_deadline_only() {
        let idle = Duration::from_secs(600);
        let start = Instant::now();
        let watch = Rc::new(Watch::new(start, idle));
        watch.set_kind(start + Duration::from_secs(5), false);
        let first = OpenStream::new(watch.clone());
        assert_eq!(
            watch.effective_deadline(),
            Some(start + Duration::from_secs(5)),
            "a frame's deadline holds"
        );
        watch.set_kind(start + idle, true);
        let second = OpenStream::new(watch.clone());
        assert_eq!(watch.effective_deadline(), None);
        drop(first);
        assert_eq!(watch.effective_deadline(), None, "one stream is still open");
        drop(second);
        let ended = watch.streams_ended.get().expect("the last stream's end");
        assert!(ended >= start);
        assert_eq!(watch.effective_deadline(), Some(ended + idle));
    }

    /// Once the socket is broken, what was queued gives back what it held at once, and so does
    /// every response pushed after (a request that finishes once its peer reset the
    /// connection); streams see the peer gone.
    #[test]
    fn a_broken_connection_drops_its_queue_and_every_later_response() {
        let budget = crate::subscription::budget::StreamBudget::new();
        let outbound = Outbound::default();
        let frame = |bytes: usize| {
            let mut buffer = FrameBuffer::new();
            buffer.resize(bytes, 0);
            Response::Frame(buffer)
        };
        outbound.push_held(frame(100), None, budget.try_reserve(1000));
        outbound.push_held(frame(100), None, budget.try_reserve(2000));
        assert_eq!((outbound.queue.borrow().len(), budget.reserved_bytes()), (2, 3000));
        outbound.break_off();
        assert!(outbound.peer_gone.get());
        assert_eq!((outbound.queue.borrow().len(), budget.reserved_bytes()), (0, 0));
        let reserved = Response::Reserved(Box::new(frame(100)), budget.try_reserve(5000).unwrap());
        outbound.push_held(reserved, None, budget.try_reserve(4000));
        assert_eq!((outbound.queue.borrow().len(), budget.reserved_bytes()), (0, 0));
    }

    /// A writer waiting for its socket is stalled once no byte was taken for the deadline, not
    /// while bytes are taken now and then, nor while it waits for answers; once the shard stops,
    /// the shorter deadline holds.
    #[test]
    fn a_write_stalls_only_without_progress_for_the_whole_deadline() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async {
            let deadline = Duration::from_millis(200);
            let stall = Stall { deadline, stop: Stop::default(), stopping: Notify::new() };
            let progress = WriteProgress::default();
            let watched = || {
                futures_lite::future::or(async { Some(watch_writes(&progress, &stall).await) }, async {
                    crate::runtime::sleep(deadline * 4).await;
                    None
                })
            };
            // Waiting for answers, not for the socket: never stalled.
            assert!(watched().await.is_none());
            // Bytes taken each half deadline: not stalled.
            progress.begin();
            let taking = async {
                for _ in 0..8 {
                    crate::runtime::sleep(deadline / 2).await;
                    progress.advanced();
                }
                None
            };
            assert!(futures_lite::future::or(taking, async { Some(watch_writes(&progress, &stall).await) })
                .await
                .is_none());
            assert!(!progress.stalled.get());
            // Nothing taken: stalled a deadline after the last byte.
            let last = Instant::now();
            assert!(watched().await.expect("stalled").is_err());
            assert!(progress.stalled.get() && last.elapsed() >= deadline);
            // A stop shortens a long deadline.
            let stall =
                Stall { deadline: Duration::from_secs(3600), stop: Stop::default(), stopping: Notify::new() };
            let progress = WriteProgress::default();
            progress.begin();
            let stopping = async {
                crate::runtime::sleep(deadline).await;
                stall.stop.give();
                stall.stopping.notify_all();
                futures_lite::future::pending::<std::io::Result<()>>().await
            };
            let stopped = Instant::now();
            assert!(futures_lite::future::or(watch_writes(&progress, &stall), stopping).await.is_err());
            let elapsed = stopped.elapsed();
            assert!(elapsed >= WRITE_STALL_DEADLINE_STOPPING, "{elapsed:?}");
            assert!(elapsed <= WRITE_STALL_DEADLINE_STOPPING + Duration::from_secs(1), "{elapsed:?}");
        });
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
            let (_, writer) = futures_lite::io::split(stream);
            let progress = WriteProgress::default();
            let mut writer = Tracked { inner: writer, progress: &progress };
            write_runs(&mut writer, socket, runs.iter().map(Vec::as_slice).collect()).await.unwrap();
            writer.close().await.unwrap();
            drop(writer);
            let received = reader.await;
            assert_eq!(received.len(), expected.len());
            assert!(received == expected, "the bytes arrived changed or out of order");
        });
    }
}

/// TLS and authentication on real connections: a server on a glommio executor, clients on
/// a thread of their own with blocking sockets (rustls's client over TLS).
#[cfg(test)]
mod security_tests {
    use super::*;
    use crate::auth::Mode;
    use crate::protocol::native::tls::ClientCertificates;
    use ringpost_wire::frame::decode_body;
    use ringpost_wire::limits::PROTOCOL_VERSION;
    use ringpost_wire::messages::HelloRequest;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};
    use std::path::PathBuf;
    use std::sync::Arc;

    /// Answers every request with the principal of the session it came in.
    struct AnswerPrincipal;

    impl Handler for AnswerPrincipal {
        async fn handle(&self, header: FrameHeader, _body: FrameBuffer, responder: &Responder) -> Response {
            let principal = responder.session().principal.to_string();
            respond(&header, &AuthenticateResponse { principal }).into()
        }
    }

    /// Serves `AnswerPrincipal` on a loopback port under `security`'s settings while `client`
    /// runs on a thread of its own, then stops; a panic on the client's thread fails the test.
    fn serve_while(
        access: AccessSettings,
        tls: Option<TlsSettings>,
        client: impl FnOnce(SocketAddr) + Send + 'static,
    ) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let security = Security::open(&access, tls.as_ref()).unwrap();
            let stop = Stop::default();
            let limits = ConnectionLimits::default();
            let serving = crate::runtime::spawn(serve(
                listener,
                Rc::new(AnswerPrincipal),
                stop.clone(),
                limits,
                security,
            ));
            let client = std::thread::spawn(move || client(address));
            while !client.is_finished() {
                crate::runtime::sleep(Duration::from_millis(5)).await;
            }
            stop.give();
            serving.await;
            if let Err(panic) = client.join() {
                std::panic::resume_unwind(panic);
            }
        });
    }

    fn send<T: ringpost_wire::frame::Body>(
        stream: &mut impl Write,
        command: Command,
        request_id: u64,
        body: &T,
    ) {
        stream.write_all(&ringpost_wire::encode_frame(command.code(), 0, request_id, body)).unwrap();
    }

    fn hello(stream: &mut impl Write, request_id: u64) {
        let body = HelloRequest { protocol_version: PROTOCOL_VERSION, client_name: "test".into() };
        send(stream, Command::Hello, request_id, &body);
    }

    /// The next frame, or `None` once the connection is closed.
    fn receive(stream: &mut impl Read) -> Option<(FrameHeader, FrameBuffer)> {
        let mut header = [0u8; ringpost_wire::limits::FRAME_HEADER_BYTES];
        stream.read_exact(&mut header).ok()?;
        let header = FrameHeader::decode(&header).unwrap();
        let mut body = FrameBuffer::with_capacity(header.body_length as usize);
        body.resize(header.body_length as usize, 0);
        stream.read_exact(&mut body).unwrap();
        Some((header, body))
    }

    /// The principal a request was answered with, or the error it was answered with.
    fn answer(stream: &mut impl Read, request_id: u64) -> Result<String, Status> {
        let (header, body) = receive(stream).expect("an answer, not a close");
        assert_eq!(header.request_id, request_id);
        if header.is_error() {
            return Err(ringpost_wire::frame::decode_error(&body));
        }
        Ok(decode_body::<AuthenticateResponse>(&body).unwrap().principal)
    }

    /// Whether the connection ends with no frame more.
    fn closes(stream: &mut impl Read) -> bool {
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        rest.len() < ringpost_wire::limits::FRAME_HEADER_BYTES
    }

    /// A directory of its own for one test's files.
    fn directory(name: &str) -> PathBuf {
        let directory = std::env::temp_dir().join(format!("ringpost-server-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        directory
    }

    /// A test CA, a server certificate for `localhost` and a client certificate for
    /// `alice.example`, as PEM files in `directory`.
    fn make_certificates(
        directory: &std::path::Path,
        client_certificates: ClientCertificates,
    ) -> TlsSettings {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "ringpost test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let write = |name: &str, text: String| std::fs::write(directory.join(name), text).unwrap();
        write("ca.pem", ca.pem());
        for (name, purpose) in [
            ("localhost", ExtendedKeyUsagePurpose::ServerAuth),
            ("alice.example", ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
            params.extended_key_usages = vec![purpose];
            let certificate = params.signed_by(&key, &ca, &ca_key).unwrap();
            write(&format!("{name}.pem"), certificate.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        TlsSettings {
            certificate: directory.join("localhost.pem"),
            key: directory.join("localhost.key"),
            client_ca: Some(directory.join("ca.pem")),
            client_certificates,
        }
    }

    /// A TLS connection to `address` trusting the test CA, with alice's certificate or none.
    fn connect_tls(
        address: SocketAddr,
        directory: &std::path::Path,
        with_certificate: bool,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(directory.join("ca.pem")).unwrap()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if with_certificate {
            let chain = vec![CertificateDer::from_pem_file(directory.join("alice.example.pem")).unwrap()];
            let key = PrivateKeyDer::from_pem_file(directory.join("alice.example.key")).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        let name = "localhost".try_into().unwrap();
        let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let socket = std::net::TcpStream::connect(address).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        rustls::StreamOwned::new(connection, socket)
    }

    /// Over TLS, requests are answered; a verified client certificate is the connection's
    /// principal from its first request, and a client without one is anonymous.
    #[test]
    fn requests_are_answered_over_tls_as_the_certificate_names() {
        let directory = directory("tls");
        let tls = make_certificates(&directory, ClientCertificates::Optional);
        serve_while(AccessSettings::off(), Some(tls), move |address| {
            let mut alice = connect_tls(address, &directory, true);
            hello(&mut alice, 1);
            hello(&mut alice, 2);
            assert_eq!(answer(&mut alice, 1).unwrap(), "alice.example");
            assert_eq!(answer(&mut alice, 2).unwrap(), "alice.example");
            let mut nobody = connect_tls(address, &directory, false);
            hello(&mut nobody, 7);
            assert_eq!(answer(&mut nobody, 7).unwrap(), "anonymous");
            let _ = std::fs::remove_dir_all(&directory);
        });
    }

    /// Plaintext sent to a TLS port fails the handshake and closes that connection alone;
    /// a client without a certificate where one is required is closed too.
    #[test]
    fn plaintext_to_a_tls_port_closes_while_others_are_served() {
        let directory = directory("plaintext");
        let tls = make_certificates(&directory, ClientCertificates::Required);
        serve_while(AccessSettings::off(), Some(tls), move |address| {
            let mut alice = connect_tls(address, &directory, true);
            hello(&mut alice, 1);
            assert_eq!(answer(&mut alice, 1).unwrap(), "alice.example");
            let mut plaintext = std::net::TcpStream::connect(address).unwrap();
            plaintext.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            hello(&mut plaintext, 1);
            let mut rest = Vec::new();
            let _ = plaintext.read_to_end(&mut rest);
            assert!(FrameHeader::decode(&rest).is_err(), "a plaintext client got a frame from a TLS port");
            let mut nobody = connect_tls(address, &directory, false);
            hello(&mut nobody, 3);
            assert!(receive(&mut nobody).is_none(), "a client without a certificate was served");
            hello(&mut alice, 2);
            assert_eq!(answer(&mut alice, 2).unwrap(), "alice.example");
            let _ = std::fs::remove_dir_all(&directory);
        });
    }

    /// A refused Authenticate answers its request `Unauthenticated`, closes the connection
    /// with an error frame of request id 0, and dispatches nothing pipelined after it.
    #[test]
    fn a_failed_authenticate_closes_the_connection() {
        serve_while(AccessSettings::off(), None, |address| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut pipelined = Vec::new();
            send(
                &mut pipelined,
                Command::Authenticate,
                1,
                &AuthenticateRequest { token: "rpt_unknown".into() },
            );
            hello(&mut pipelined, 2);
            stream.write_all(&pipelined).unwrap();
            assert_eq!(answer(&mut stream, 1).unwrap_err().code, ErrorCode::Unauthenticated);
            let closing = answer(&mut stream, 0).unwrap_err();
            assert_eq!(closing.code, ErrorCode::Unauthenticated);
            assert!(closing.message.contains("authentication failed"), "{}", closing.message);
            assert!(closes(&mut stream), "the connection answered after a failed Authenticate");
        });
    }

    /// Under required authentication, a small request before authenticating is read (the
    /// permission checks answer it), and a frame announcing a body over
    /// `FRAME_BODY_BYTES_UNAUTHENTICATED_MAX` closes the connection before its body is read.
    #[test]
    fn a_large_frame_before_authentication_closes_under_required_mode() {
        let access = AccessSettings { mode: Mode::Required, file: None };
        serve_while(access, None, |address| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            hello(&mut stream, 1);
            assert_eq!(answer(&mut stream, 1).unwrap(), "anonymous");
            let header = FrameHeader {
                body_length: FRAME_BODY_BYTES_UNAUTHENTICATED_MAX as u32 + 1,
                command: Command::Publish.code(),
                flags: 0,
                request_id: 2,
            };
            stream.write_all(&header.encode()).unwrap();
            stream.write_all(&[0u8; 1000]).unwrap();
            let closing = answer(&mut stream, 0).unwrap_err();
            assert_eq!(closing.code, ErrorCode::Unauthenticated);
            assert!(
                closing.message.contains("authenticate before sending large requests"),
                "{}",
                closing.message
            );
            assert!(closes(&mut stream));
        });
    }

    /// The same large frame is read once the mode is off (anonymous may act).
    #[test]
    fn a_large_frame_is_read_when_anonymous_may_act() {
        serve_while(AccessSettings::off(), None, |address| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let body = HelloRequest {
                protocol_version: PROTOCOL_VERSION,
                client_name: "x".repeat(FRAME_BODY_BYTES_UNAUTHENTICATED_MAX * 2),
            };
            send(&mut stream, Command::Hello, 1, &body);
            assert_eq!(answer(&mut stream, 1).unwrap(), "anonymous");
        });
    }

    /// An access file holding `token` for alice, granting her every role.
    fn write_access_file(file: &std::path::Path, token: Option<&str>) {
        let mut text = String::from("grant admin * alice\n");
        if let Some(token) = token {
            let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
            let hex: String = digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
            text.push_str(&format!("token alice sha256:{hex}\n"));
        }
        std::fs::write(file, text).unwrap();
    }

    const TOKEN: &str = "rpt_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    /// Authenticate pipelined with the requests after it: they run as the token's holder.
    #[test]
    fn requests_pipelined_after_authenticate_run_as_its_principal() {
        let directory = directory("authenticate");
        let file = directory.join("access");
        write_access_file(&file, Some(TOKEN));
        let access = AccessSettings { mode: Mode::Required, file: Some(file) };
        serve_while(access, None, move |address| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut pipelined = Vec::new();
            hello(&mut pipelined, 1);
            send(&mut pipelined, Command::Authenticate, 2, &AuthenticateRequest { token: TOKEN.into() });
            hello(&mut pipelined, 3);
            stream.write_all(&pipelined).unwrap();
            let mut answers: Vec<(u64, String)> = (0..3)
                .map(|_| {
                    let (header, body) = receive(&mut stream).unwrap();
                    (header.request_id, decode_body::<AuthenticateResponse>(&body).unwrap().principal)
                })
                .collect();
            answers.sort();
            let expected = [(1, "anonymous"), (2, "alice"), (3, "alice")];
            assert_eq!(answers, expected.map(|(id, name)| (id, name.to_owned())));
            let _ = std::fs::remove_dir_all(&directory);
        });
    }

    /// A token taken out of the access file closes its connections within two seconds.
    #[test]
    fn a_revoked_token_closes_its_connection() {
        let directory = directory("revoke");
        let file = directory.join("access");
        write_access_file(&file, Some(TOKEN));
        let access = AccessSettings { mode: Mode::Required, file: Some(file.clone()) };
        serve_while(access, None, move |address| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            send(&mut stream, Command::Authenticate, 1, &AuthenticateRequest { token: TOKEN.into() });
            assert_eq!(answer(&mut stream, 1).unwrap(), "alice");
            write_access_file(&file, None);
            let revoked = Instant::now();
            let closing = answer(&mut stream, 0).unwrap_err();
            assert!(revoked.elapsed() < 2 * SECURITY_CHECK_INTERVAL + Duration::from_millis(500));
            assert_eq!(closing.code, ErrorCode::Unauthenticated);
            assert!(closes(&mut stream));
            let _ = std::fs::remove_dir_all(&directory);
        });
    }

    /// Runs written through TLS (gathered into records, large ones alone) arrive whole and in
    /// order, through a reader that starts late.
    #[test]
    fn runs_arrive_whole_and_in_order_over_tls() {
        let directory = directory("runs");
        let settings = make_certificates(&directory, ClientCertificates::Optional);
        let runs: Vec<Vec<u8>> = (0..200u32)
            .map(|index| {
                let length =
                    if index % 50 == 7 { COALESCE_BYTES_MAX + 1 } else { (index as usize % 7) * 1001 + 1 };
                (0..length).map(|byte| (byte as u32 ^ index) as u8).collect()
            })
            .collect();
        let expected: Vec<u8> = runs.concat();
        assert!(
            runs.iter().any(|run| run.len() >= COALESCE_BYTES_MAX) && expected.len() > 4 * COALESCE_BYTES_MAX
        );
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let mut stream = connect_tls(address, &directory, false);
                std::thread::sleep(Duration::from_millis(200));
                let mut received = Vec::new();
                let _ = stream.read_to_end(&mut received);
                let _ = std::fs::remove_dir_all(&directory);
                received
            });
            let stream = listener.accept().await.unwrap();
            let socket = stream.as_raw_fd();
            let stream = Tls::open(&settings).unwrap().acceptor().accept(stream).await.unwrap();
            let (_, writer) = futures_lite::io::split(stream);
            let progress = WriteProgress::default();
            let mut writer = Tracked { inner: writer, progress: &progress };
            write_runs(&mut writer, socket, runs.iter().map(Vec::as_slice).collect()).await.unwrap();
            writer.close().await.unwrap();
            drop(writer);
            while !client.is_finished() {
                crate::runtime::sleep(Duration::from_millis(5)).await;
            }
            let received = client.join().unwrap();
            assert_eq!(received.len(), expected.len());
            assert!(received == expected, "the bytes arrived changed or out of order");
        });
    }

    /// Certificates that change are loaded for new connections; an invalid set is refused and
    /// the one before kept; files that did not change are not read again.
    #[test]
    fn changed_certificates_are_reloaded_and_invalid_ones_refused() {
        let directory = directory("reload");
        let settings = make_certificates(&directory, ClientCertificates::Optional);
        let tls = Tls::open(&settings).unwrap();
        assert_eq!(tls.reload_if_changed(), None);
        std::fs::write(&settings.certificate, "not a certificate\n").unwrap();
        let refused = tls.reload_if_changed().unwrap().unwrap_err();
        assert!(refused.contains("localhost.pem"), "{refused}");
        assert_eq!(tls.reload_if_changed(), None, "an invalid set is tried again only once it changes");
        make_certificates(&directory, ClientCertificates::Optional);
        assert_eq!(tls.reload_if_changed(), Some(Ok(())));
        let _ = std::fs::remove_dir_all(&directory);
    }
}
