//! What a handler answers with (`Response`, the gathered frames' budget) and what it may do
//! besides (`Responder`: stream frames, notice the peer leaving, check the sender's rights).

use super::*;

/// Frames a stream may have waiting for the socket before it must wait: a slow reader slows
/// the stream down instead of growing memory (its messages stay in the log).
pub const STREAM_FRAMES_QUEUED_MAX: usize = 4;

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

/// Whether the gathered frames of the shard whose budget is `budget` may hold `bytes` more
/// (`GATHERED_HELD_BYTES_SHARD_MAX`).
pub fn gathering_has_room(budget: &StreamBudget, bytes: usize) -> bool {
    budget.gathered_bytes().saturating_add(bytes) <= GATHERED_HELD_BYTES_SHARD_MAX
}

/// A buffer a gathered frame holds, whatever keeps it alive; `charged` bytes count against its
/// shard's `GATHERED_HELD_BYTES_SHARD_MAX` (in the shard's `budget`) until it is dropped (its
/// length, or 0 for a slice of a buffer another `Held` of the frame already counts).
pub struct Held {
    owner: Box<dyn AsRef<[u8]>>,
    charged: usize,
    budget: Rc<StreamBudget>,
}

impl Held {
    pub fn new(owner: Box<dyn AsRef<[u8]>>, charged: usize, budget: &Rc<StreamBudget>) -> Held {
        budget.hold_gathered(charged);
        Held { owner, charged, budget: budget.clone() }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release_gathered(self.charged);
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
    pub(super) outbound: Rc<Outbound>,
    /// Who sent the request, as the connection was when it was read, and the shard's rules.
    pub(super) session: Rc<Session>,
    pub(super) access: Rc<Access>,
    /// The address the peer reached this connection at (the router answers lookups with it
    /// when it listens on every address, see `Advertise`).
    pub(super) local_address: Option<SocketAddr>,
    /// The peer's address (routing restrictions match on it).
    pub(super) peer_address: Option<std::net::IpAddr>,
}

impl Responder {
    /// A responder on no connection, for tests and measurements that call a handler directly.
    #[cfg(any(test, feature = "profiling"))]
    pub(crate) fn unconnected() -> Responder {
        Responder {
            outbound: Rc::default(),
            local_address: None,
            peer_address: None,
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
            peer_address: self.peer_address,
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

    /// The address the peer connected from.
    pub fn peer_address(&self) -> Option<std::net::IpAddr> {
        self.peer_address
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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn held_buffers_count_against_the_shard_until_dropped() {
        let budget = StreamBudget::new();
        assert!(gathering_has_room(&budget, GATHERED_HELD_BYTES_SHARD_MAX));
        let first = Held::new(Box::new(vec![0u8; 1000]), 1000, &budget);
        let second = Held::new(Box::new(vec![0u8; 24]), 24, &budget);
        assert_eq!(budget.gathered_bytes(), 1024);
        assert!(!gathering_has_room(&budget, GATHERED_HELD_BYTES_SHARD_MAX - 1023));
        assert!(gathering_has_room(&budget, GATHERED_HELD_BYTES_SHARD_MAX - 1024));
        assert_eq!(first.as_ref().len(), 1000);
        drop((first, second));
        assert_eq!(budget.gathered_bytes(), 0);
    }

    /// Two shards on one thread (as the whole-node simulation runs them) each have their own
    /// gathered-bytes budget: one shard's gathered frames holding all of its own leave the
    /// other's whole.
    #[test]
    fn shards_on_one_thread_each_have_their_own_gathered_budget() {
        let (full, other) = (StreamBudget::new(), StreamBudget::new());
        let held = Held::new(Box::new(Vec::<u8>::new()), GATHERED_HELD_BYTES_SHARD_MAX, &full);
        assert!(!gathering_has_room(&full, 1), "the full shard has no room left");
        assert!(
            gathering_has_room(&other, GATHERED_HELD_BYTES_SHARD_MAX),
            "the other shard's budget is whole"
        );
        drop(held);
        assert!(gathering_has_room(&full, GATHERED_HELD_BYTES_SHARD_MAX));
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
}
