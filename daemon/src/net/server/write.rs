//! The writing side of a connection: its queue of responses (`Outbound`), the writer that
//! coalesces them into few socket writes, and the stall deadline of a peer that never reads.

use super::*;

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
    pub(super) queue: RefCell<VecDeque<Queued>>,
    ready: Notify,
    pub(super) closed: Cell<bool>,
    /// The socket takes no more bytes: responses are dropped instead of queued.
    pub(super) broken: Cell<bool>,
    /// The socket took no byte for the write-stall deadline while answers waited.
    pub(super) stalled: Cell<bool>,
    /// The peer stopped sending (EOF, error, idle timeout) or the socket broke.
    pub(super) peer_gone: Cell<bool>,
    /// Fires when the queue drains or the peer goes, for streams waiting for room.
    pub(super) changed: Notify,
    /// Fires when the peer goes, for idle streams. Not `changed`: that fires at every write,
    /// and thousands of idle streams on one connection all woke at each (W4 steady state).
    pub(super) left: Notify,
}

/// A response waiting for the socket, with what it holds until written: its request's
/// in-flight permit, and a stream frame's reservation.
type Queued = (Response, Option<StaticPermit>, Option<StreamReservation>);

impl Outbound {
    pub(super) fn push(&self, frame: impl Into<Response>, permit: Option<StaticPermit>) {
        self.push_held(frame, permit, None);
    }
    pub(super) fn push_held(
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
    pub(super) fn close(&self) {
        self.closed.set(true);
        self.ready.notify_all();
    }
    pub(super) fn peer_left(&self) {
        self.peer_gone.set(true);
        self.changed.notify_all();
        self.left.notify_all();
    }
}

/// What a connection's writer and reader would do, for a simulation that runs a handler with
/// no socket under it (the cluster simulation's streams): the handler's answer queued as the
/// read loop queues it, frames taken as the writer takes them, the peer leaving.
#[cfg(test)]
impl Responder {
    /// Queues the handler's answer to the request, after its stream's frames.
    pub(crate) fn answer(&self, response: Response) {
        self.outbound.push(response, None);
    }

    /// The wire bytes of the frame the writer would take next, if one is queued.
    pub(crate) fn queued_bytes(&self) -> Option<usize> {
        self.outbound.queue.borrow().front().map(|(response, _, _)| response.wire_bytes())
    }

    /// Resolves once a frame is queued (at once, if one is).
    pub(crate) async fn queued(&self) {
        loop {
            let ready = self.outbound.ready.notified();
            if !self.outbound.queue.borrow().is_empty() {
                return;
            }
            ready.await;
        }
    }

    /// Takes the next frame queued, as the writer does once it wrote it: its permit and its
    /// reservation go back, and a stream waiting for room in the queue is woken.
    pub(crate) fn take_written(&self) -> Option<FrameBuffer> {
        let front = self.outbound.queue.borrow_mut().pop_front();
        let (response, permit, reservation) = front?;
        let frame = response.into_contiguous();
        drop((permit, reservation));
        self.outbound.changed.notify_all();
        Some(frame)
    }

    /// The peer leaves, or the connection breaks: what is queued is dropped with what it
    /// holds, and streams see the peer gone.
    pub(crate) fn leave(&self) {
        self.outbound.break_off();
    }
}

/// How long a connection's writer may wait for its socket without a byte taken, and the stop
/// that shortens it (`WRITE_STALL_DEADLINE_STOPPING`): given (`stop`), and told to this
/// connection (`stopping`, which `serve` notifies at the stop).
pub(super) struct Stall {
    pub(super) deadline: Duration,
    pub(super) stop: Stop,
    pub(super) stopping: Notify,
}

pub(super) async fn write_responses<S: Transport>(
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
pub(super) struct WriteProgress {
    since: Cell<Option<Instant>>,
    stalled: Cell<bool>,
}

impl WriteProgress {
    /// The writer has answers to write: the wait for the socket begins.
    fn begin(&self) {
        self.since.set(Some(crate::runtime::now()));
    }

    /// The socket took bytes.
    fn advanced(&self) {
        if self.since.get().is_some() {
            self.since.set(Some(crate::runtime::now()));
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
        let now = crate::runtime::now();
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
pub(super) struct Tracked<'a, W> {
    pub(super) inner: W,
    pub(super) progress: &'a WriteProgress,
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
pub(super) async fn write_runs<S: Transport>(
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
            let last = crate::runtime::now();
            assert!(watched().await.expect("stalled").is_err());
            assert!(progress.stalled.get() && crate::runtime::now() - last >= deadline);
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
            let stopped = crate::runtime::now();
            assert!(futures_lite::future::or(watch_writes(&progress, &stall), stopping).await.is_err());
            let elapsed = crate::runtime::now() - stopped;
            assert!(elapsed >= WRITE_STALL_DEADLINE_STOPPING, "{elapsed:?}");
            assert!(elapsed <= WRITE_STALL_DEADLINE_STOPPING + Duration::from_secs(1), "{elapsed:?}");
        });
    }

    /// The stall deadline runs on the shard's clock: under a simulation, a writer waiting for
    /// its socket is stalled once the virtual clock passes the whole deadline (a minute), which
    /// takes no real minute, and not a moment before.
    #[test]
    fn a_write_stall_is_timed_on_the_shards_clock() {
        let real = std::time::Instant::now();
        crate::runtime::sim::Simulation::new(0).time_max(Duration::from_secs(3600)).run(async {
            let stall =
                Stall { deadline: WRITE_STALL_DEADLINE, stop: Stop::default(), stopping: Notify::new() };
            let progress = WriteProgress::default();
            let started = crate::runtime::now();
            progress.begin();
            assert!(watch_writes(&progress, &stall).await.is_err());
            let waited = crate::runtime::now() - started;
            assert!(progress.stalled.get());
            assert!(waited >= WRITE_STALL_DEADLINE && waited < WRITE_STALL_DEADLINE * 2, "{waited:?}");
        });
        assert!(real.elapsed() < WRITE_STALL_DEADLINE / 2, "the deadline waited in real time");
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
