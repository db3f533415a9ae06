//! The reading side of a connection: frames split from its bytes against the shard's budget
//! for partial frames, and the deadlines (before authentication, per frame, idle) its
//! watchdog holds it to.

use super::*;

/// The reading side of one connection: its frame splitter, what its partial frame holds of the
/// shard's budget, and the times its deadlines run from.
pub(super) struct Reading<'a> {
    shard: &'a Shard,
    socket: RawFd,
    /// The connection as its shard counts it.
    link: Rc<Link>,
    /// Whether the stream is the socket's bytes (not TLS), so `FIONREAD` counts them.
    plaintext: bool,
    splitter: FrameSplitter,
    chunk: Vec<u8>,
    /// Bytes the splitter's partial frame holds, as last counted against the shard's budget.
    pub(super) charged: usize,
    pub(super) authenticated: bool,
    unauthenticated_until: Instant,
    /// When the first byte of the frame not yet whole arrived.
    frame_started: Option<Instant>,
    last_frame: Instant,
    /// The error to close with once the frames already read are dispatched.
    pub(super) refusal: Option<Status>,
    /// Which deadline the watchdog holds the connection to.
    pub(super) deadline_kind: Deadline,
}

/// The deadlines of a connection: the earliest that applies is the one it is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deadline {
    Unauthenticated,
    Frame,
    Idle,
}

impl<'a> Reading<'a> {
    /// The reading side of a connection accepted `at`, before its first byte: unauthenticated,
    /// with the small read buffer, held to the deadline before authentication.
    pub(super) fn new(
        shard: &'a Shard,
        socket: RawFd,
        link: Rc<Link>,
        plaintext: bool,
        at: Instant,
    ) -> Reading<'a> {
        Reading {
            shard,
            socket,
            link,
            plaintext,
            splitter: FrameSplitter::new(),
            chunk: vec![0u8; READ_CHUNK_UNAUTHENTICATED_BYTES],
            charged: 0,
            authenticated: false,
            unauthenticated_until: at + shard.limits.unauthenticated_deadline,
            frame_started: None,
            last_frame: at,
            refusal: None,
            deadline_kind: Deadline::Unauthenticated,
        }
    }

    /// Reads once and returns the frames completed. `Err(None)`: the peer is gone (or the
    /// read side was shut); `Err(Some(status))`: the connection closes with that error.
    pub(super) async fn read_batch<S: Transport>(
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
    pub(super) fn deadline(&mut self, now: Instant, completed: bool) -> Instant {
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
    pub(super) fn authenticate(&mut self) {
        if !self.authenticated {
            self.authenticated = true;
            self.shard.authenticated(&self.link);
            self.chunk = vec![0u8; READ_CHUNK_BYTES];
        }
    }

    /// Before authentication, when anonymous may not act: the refusal of a frame announcing a
    /// body over `FRAME_BODY_BYTES_UNAUTHENTICATED_MAX`, before any more of it is read.
    pub(super) fn unauthenticated_refusal(&self) -> Option<Status> {
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
    pub(super) fn postpone(&mut self, waited: Duration) {
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
    pub(super) fn deadline_status(&self) -> Status {
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
pub(super) struct Watch {
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
    pub(super) expired: Cell<bool>,
    finished: Cell<bool>,
}

impl Watch {
    pub(super) fn new(deadline: Instant, idle_deadline: Duration) -> Watch {
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

    pub(super) fn set(&self, deadline: Instant) {
        self.set_kind(deadline, false);
    }

    /// Sets the deadline, saying whether it is the idle one.
    pub(super) fn set_kind(&self, deadline: Instant, idle: bool) {
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
    pub(super) fn finish(&self) {
        self.finished.set(true);
        self.earlier.notify_all();
    }
}

pub(super) async fn watch_deadline(watch: Rc<Watch>, socket: RawFd) {
    loop {
        let earlier = watch.earlier.notified();
        if watch.finished.get() {
            return;
        }
        let Some(deadline) = watch.effective_deadline() else {
            // Suspended by open streams: any new deadline, or the last stream's end, wakes it.
            watch.watched.set(crate::runtime::now() + Duration::from_secs(365 * 24 * 3600));
            earlier.await;
            continue;
        };
        watch.watched.set(deadline);
        let now = crate::runtime::now();
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
pub(super) struct OpenStream {
    watch: Rc<Watch>,
}

impl OpenStream {
    pub(super) fn new(watch: Rc<Watch>) -> OpenStream {
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
            self.watch.streams_ended.set(Some(crate::runtime::now()));
            self.watch.earlier.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Open streams suspend the idle deadline, and only the idle one; once the last stream
    /// ends, the idle deadline counts from that end.
    #[test]
    fn open_streams_suspend_the_idle_deadline_only() {
        let idle = Duration::from_secs(600);
        let start = crate::runtime::now();
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
}
