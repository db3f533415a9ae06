//! The accept loop: connections taken, counted and refused by name, handshaken, served; the
//! refusals that linger so their answer arrives; what an accept failure does.

use super::*;

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

/// What a connection starts with once accepted (and handshaken).
pub(super) struct Accepted {
    pub(super) socket: RawFd,
    /// The peer's address, as counted against the limits.
    pub(super) peer: Option<IpAddr>,
    pub(super) local_address: Option<SocketAddr>,
    pub(super) at: Instant,
    pub(super) link: Rc<Link>,
    /// The session a verified client certificate gave, if any.
    pub(super) certified: Option<Session>,
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
        at: crate::runtime::now(),
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

/// Answers a connection the shard will not serve with `status` and closes it. Its peer has
/// usually sent a request already: the connection reads (and drops) that for up to
/// `REFUSAL_LINGER`, after shutting its writing side, so that the refusal arrives before the
/// close instead of being overtaken by a reset.
pub(super) fn refuse(stream: TcpStream, status: Status, shard: &Rc<Shard>) {
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
    let started = crate::runtime::now();
    let mut drained = 0;
    let mut buffer = [0u8; 4096];
    while drained < REFUSAL_DRAIN_BYTES_MAX && crate::runtime::now() - started < REFUSAL_LINGER {
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
    pub(super) fn new() -> AcceptFailures {
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
        let now = crate::runtime::now();
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
