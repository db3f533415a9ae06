//! The limits a shard holds its connections to, and what it counts against them: its
//! connections, in all, by address and before authentication, and the bytes their frames not
//! yet whole hold.

use super::*;

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
pub(super) const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
pub(super) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub(super) const KEEPALIVE_PROBES: u32 = 6;
/// Responses smaller than this are gathered into one socket write.
pub(super) const COALESCE_BYTES_MAX: usize = 256 * 1024;
/// Runs handed to one vectored write: Linux takes at most 1024 (`UIO_MAXIOV`).
pub(super) const WRITE_RUNS_MAX: usize = 1024;
/// Read buffer of an authenticated connection, allocated for the rest of its life: at
/// `CONNECTIONS_PER_SHARD_MAX` idle connections this is what a shard holds for them
/// (256 MiB), so it stays modest.
pub(super) const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Read buffer of a connection until it authenticates: small, so that the many connections an
/// unauthenticated client may open cost little (a large first frame's body is read straight
/// into its own buffer anyway).
pub(super) const READ_CHUNK_UNAUTHENTICATED_BYTES: usize = 4 * 1024;
/// How long a refused connection is kept to read what its peer sent before it closes: closing
/// a socket with unread bytes resets it, and the reset can overtake the refusal.
pub(super) const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// Refused connections a shard keeps lingering at once; beyond, a refusal closes at once.
pub(super) const REFUSALS_LINGERING_MAX: usize = 256;
/// Bytes a lingering refused connection reads (and drops) at most.
pub(super) const REFUSAL_DRAIN_BYTES_MAX: usize = 64 * 1024;
/// Accept failures wait this long before the next accept, doubling up to the maximum while
/// they go on, so that a shard out of file descriptors does not spin.
pub(super) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
pub(super) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// One log line per this long at most about failed accepts, counting those not logged.
pub(super) const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
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
    pub(super) fn frame_deadline(&self, started: Instant, body_bytes: u64) -> Instant {
        let rate = self.frame_bytes_per_second_min.max(1);
        started + self.frame_deadline_base + Duration::from_millis(body_bytes.saturating_mul(1000) / rate)
    }
}

/// What the shard knows of one open connection: its session, checked again each second, and
/// why it must close once that check fails.
pub(super) struct Link {
    pub(super) session: RefCell<Rc<Session>>,
    pub(super) ending: RefCell<Option<Status>>,
    /// The peer's address, as counted against the limits.
    peer: Option<IpAddr>,
    /// Whether it came from a host of the cluster's nodes, so that it leaves the budget before
    /// authentication it entered, whatever the hosts became since.
    cluster_host: bool,
    /// Told when the shard stops, for the connection's writer (`Stall`): its own, so that a
    /// writer's watch, polled at every write, finds one waiter here rather than scan the
    /// stop's waiters, one per connection.
    pub(super) stopping: Notify,
    /// The connection in the shard's count for a scrape, until it is dropped.
    _counted: crate::metrics::shard::ConnectionCounted,
}

/// At most one log line per interval, counting the lines left out.
pub(super) struct LogLimiter {
    interval: Duration,
    logged_at: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    pub(super) fn new(interval: Duration) -> LogLimiter {
        LogLimiter { interval, logged_at: None, suppressed: 0 }
    }

    /// `Some(lines left out since the last one)` if a line may be written now.
    pub(super) fn admit(&mut self) -> Option<u64> {
        let now = crate::runtime::now();
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
pub(super) struct Shard {
    pub(super) limits: ConnectionLimits,
    pub(super) access: Rc<Access>,
    pub(super) tls: Option<Tls>,
    cluster_hosts: ClusterHosts,
    pub(super) connections: Cell<usize>,
    /// Connections before authentication: strangers', in all and by address, and the cluster's
    /// hosts' (a budget of their own).
    unauthenticated: Cell<usize>,
    unauthenticated_per_peer: RefCell<HashMap<IpAddr, usize>>,
    unauthenticated_cluster: Cell<usize>,
    per_peer: RefCell<HashMap<IpAddr, usize>>,
    pub(super) partial_frame_bytes: Cell<usize>,
    /// Bytes partial frames gave back since malloc's free memory was last trimmed.
    partial_frame_bytes_released: Cell<usize>,
    pub(super) refusals_lingering: Cell<usize>,
    /// The connections open now, by socket. A stop shuts their reading side, which ends each
    /// connection's pending read at once: a read waiting on the stop order as well would
    /// register with it at every read of every connection. The security check closes those
    /// whose session no longer holds the same way.
    pub(super) links: RefCell<HashMap<RawFd, Rc<Link>>>,
    pub(super) closed: Notify,
    pub(super) handshake_failures: RefCell<LogLimiter>,
    pub(super) write_stalls: RefCell<LogLimiter>,
}

impl Shard {
    /// A shard's connection state before its first connection.
    pub(super) fn new(limits: ConnectionLimits, security: Security) -> Shard {
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

    /// Whether `peer` is a host of one of the cluster's nodes.
    fn is_cluster_host(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|peer| self.cluster_hosts.contains(peer))
    }

    /// Why a new connection from `peer` is refused, if it is: the limit it would pass.
    pub(super) fn refusal(&self, peer: Option<IpAddr>) -> Option<Status> {
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

    pub(super) fn opened(&self, socket: RawFd, peer: Option<IpAddr>) -> Rc<Link> {
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
    pub(super) fn authenticated(&self, link: &Link) {
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

    pub(super) fn left(&self, socket: RawFd, link: &Link, authenticated: bool) {
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
    pub(super) fn charge_partial(&self, before: usize, after: usize) {
        let total = self.partial_frame_bytes.get() + after - before;
        self.partial_frame_bytes.set(total);
        if after < before {
            self.partial_frame_bytes_released.set(self.partial_frame_bytes_released.get() + before - after);
        }
    }

    pub(super) fn partial_has_room(&self, bytes: usize) -> bool {
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

    /// The log limiter counts its interval on the shard's clock: under a simulation, a line is
    /// let through again once the virtual clock passed the interval, and not before.
    #[test]
    fn the_log_limiter_counts_on_the_shards_clock() {
        crate::runtime::sim::run(0, async {
            let mut limiter = LogLimiter::new(Duration::from_secs(10));
            assert_eq!(limiter.admit(), Some(0));
            crate::runtime::sleep(Duration::from_secs(9)).await;
            assert_eq!(limiter.admit(), None);
            crate::runtime::sleep(Duration::from_secs(1)).await;
            assert_eq!(limiter.admit(), Some(1), "one line left out since the last");
        });
    }

    /// A frame's deadline is its base plus its length at the minimum rate.
    #[test]
    fn a_frame_deadline_grows_with_its_length() {
        let limits = ConnectionLimits::default();
        let start = crate::runtime::now();
        assert_eq!(limits.frame_deadline(start, 0), start + FRAME_DEADLINE_BASE);
        let largest = limits.frame_deadline(start, FRAME_BYTES_PER_SECOND_MIN * 16);
        assert_eq!(largest, start + FRAME_DEADLINE_BASE + Duration::from_secs(16));
    }
}
