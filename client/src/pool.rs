//! A pool of connections to one forwarder, after Bigtable's channel pool.
//!
//! A [`Pool`] holds up to `connections_per_forwarder` connections to one address, opened lazily
//! when a request is routed to a slot that has none. Each request goes to one connection chosen
//! by the [`Strategy`] among those carrying fewer than `requests_per_connection_max` requests
//! (gRPC's and Bigtable's cap of 100 concurrent streams per connection). When every connection is
//! at the cap and the pool is full, the request waits in a bounded client-side FIFO queue
//! ([`Pool::queued`]) and is admitted when any request of the pool completes; a request that
//! finds the queue full fails at once with `ResourceExhausted`.
//!
//! Life cycle of a connection:
//! 1. Opened on demand (a blocking connect on a short-lived thread, awaited without blocking).
//! 2. Idle close: a connection without a request for `idle_close` (5 min, Bigtable's middleware)
//!    is closed and its slot emptied, checked on each request and by [`Pool::maintain`].
//! 3. Refresh: at `refresh_period ± refresh_jitter` from its creation (50 ± 5 min: Bigtable
//!    refreshes every 50 min, Go's recycler adds up to 5 min of jitter so connections opened
//!    together are not replaced together), [`Pool::maintain`] opens a replacement, which takes
//!    new requests at once. The old connection drains: it is closed when its last request in
//!    flight completes, or after [`DRAIN_DURATION_MAX`] at the latest. A replacement that cannot
//!    be opened leaves the old connection in place and is tried again later.
//! 4. A connection the server closed is dropped from its slot on the next request.
//!
//! Sizing: the default of 4 connections suits most programs. To size a pool, measure the
//! throughput while raising the connection count; the count where throughput stops growing is
//! the saturating count, and the pool should have **twice** that many connections. That keeps
//! each connection at the optimal 10-50 outstanding requests instead of at the cap of 100, and
//! leaves room for bursts (Bigtable's rule: 4 saturated connections → a pool of 8). Too few
//! connections and requests queue in the client; too many and they sit idle, get closed, and
//! are reopened on the next burst at the cost of a connect.
//!
//! Futures are executor-agnostic: a queued request is woken through its waker by whichever
//! thread completes the request that frees a slot. A [`crate::Client`] calls
//! [`Pool::maintain`] from its one maintenance thread; a pool used on its own needs its owner
//! to call it every [`PoolSettings::maintenance_interval`].

use crate::connection::{Connection, Response, REQUESTS_PENDING_PER_CONNECTION_MAX};
use crate::retry::random_below;
use crate::{off_thread, Error, Result, Security};
use ringpost_wire::frame::Body;
use ringpost_wire::limits::PULL_WAIT_MS_MAX;
use ringpost_wire::Status;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub const CONNECTIONS_PER_FORWARDER_DEFAULT: usize = 4;
/// Bigtable's channel pool allows 200 channels; beyond that a pool is a misconfiguration.
pub const CONNECTIONS_PER_FORWARDER_MAX: usize = 256;
/// gRPC's limit of concurrent streams on one HTTP/2 connection, which Bigtable enforces.
pub const REQUESTS_PER_CONNECTION_DEFAULT: usize = 100;
pub const IDLE_CLOSE_DEFAULT: Duration = Duration::from_secs(5 * 60);
pub const REFRESH_PERIOD_DEFAULT: Duration = Duration::from_secs(50 * 60);
pub const REFRESH_JITTER_DEFAULT: Duration = Duration::from_secs(5 * 60);
pub const QUEUE_REQUESTS_DEFAULT: usize = 10_000;
/// A replaced connection still carrying requests after this long is closed anyway, failing
/// them. Requests are unary and the longest is a pull waiting `PULL_WAIT_MS_MAX`, so only a
/// stuck server gets here.
pub const DRAIN_DURATION_MAX: Duration = Duration::from_secs(120);
/// After a replacement connection failed to open, the old one is refreshed again after this
/// (or after `refresh_period`, if shorter).
pub const REFRESH_RETRY_DELAY: Duration = Duration::from_secs(30);
pub const MAINTENANCE_INTERVAL_MIN: Duration = Duration::from_millis(10);
pub const MAINTENANCE_INTERVAL_MAX: Duration = Duration::from_secs(5);

const _: () = assert!(DRAIN_DURATION_MAX.as_millis() >= 2 * PULL_WAIT_MS_MAX as u128);
const _: () = assert!(REQUESTS_PER_CONNECTION_DEFAULT <= REQUESTS_PENDING_PER_CONNECTION_MAX);
const _: () = assert!(CONNECTIONS_PER_FORWARDER_DEFAULT <= CONNECTIONS_PER_FORWARDER_MAX);
const _: () = assert!(REFRESH_JITTER_DEFAULT.as_nanos() < REFRESH_PERIOD_DEFAULT.as_nanos());

/// How a request picks its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Each request goes to the next slot in turn, skipping connections at the cap and opening
    /// the slot's connection if it has none: Bigtable's default, which spreads load evenly. Even
    /// one request at a time cycles through, and so opens, every slot.
    #[default]
    RoundRobin,
    /// Each request goes to the connection with the fewest requests in flight (ties in turn). An
    /// empty slot counts as a connection with none, but an idle open connection is preferred, so
    /// new connections are opened only when every open one is busy.
    LeastInFlight,
}

/// The settings of every forwarder pool of a [`crate::Client`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSettings {
    /// Connections per forwarder address (default 4). Size it at twice the saturating count:
    /// raise the count until throughput stops growing, and use twice that (see the module docs).
    pub connections_per_forwarder: usize,
    /// Requests in flight on one connection (default 100, gRPC's concurrent-stream cap). At
    /// most `REQUESTS_PENDING_PER_CONNECTION_MAX`.
    pub requests_per_connection_max: usize,
    pub strategy: Strategy,
    /// A connection without a request for this long is closed (default 5 min).
    pub idle_close: Duration,
    /// A connection is replaced this long after it was opened (default 50 min), ...
    pub refresh_period: Duration,
    /// ... give or take up to this much, drawn per connection (default 5 min).
    pub refresh_jitter: Duration,
    /// Requests waiting for a connection beyond these fail with `ResourceExhausted` (default
    /// 10 000).
    pub queue_requests_max: usize,
}

impl Default for PoolSettings {
    fn default() -> PoolSettings {
        PoolSettings {
            connections_per_forwarder: CONNECTIONS_PER_FORWARDER_DEFAULT,
            requests_per_connection_max: REQUESTS_PER_CONNECTION_DEFAULT,
            strategy: Strategy::RoundRobin,
            idle_close: IDLE_CLOSE_DEFAULT,
            refresh_period: REFRESH_PERIOD_DEFAULT,
            refresh_jitter: REFRESH_JITTER_DEFAULT,
            queue_requests_max: QUEUE_REQUESTS_DEFAULT,
        }
    }
}

impl PoolSettings {
    /// `InvalidArgument` naming the first setting out of range.
    pub fn validate(&self) -> Result<()> {
        let refuse = |message: String| Err(Error::Status(Status::invalid_argument(message)));
        if !(1..=CONNECTIONS_PER_FORWARDER_MAX).contains(&self.connections_per_forwarder) {
            return refuse(format!(
                "connections_per_forwarder is {}; it must be 1 to {CONNECTIONS_PER_FORWARDER_MAX} (CONNECTIONS_PER_FORWARDER_MAX)",
                self.connections_per_forwarder
            ));
        }
        if !(1..=REQUESTS_PENDING_PER_CONNECTION_MAX).contains(&self.requests_per_connection_max) {
            return refuse(format!(
                "requests_per_connection_max is {}; it must be 1 to {REQUESTS_PENDING_PER_CONNECTION_MAX} (REQUESTS_PENDING_PER_CONNECTION_MAX)",
                self.requests_per_connection_max
            ));
        }
        if self.idle_close.is_zero() {
            return refuse("idle_close must be above zero".into());
        }
        if self.refresh_period.is_zero() {
            return refuse("refresh_period must be above zero".into());
        }
        Ok(())
    }

    /// How often [`Pool::maintain`] should run: a quarter of the shortest idle or refresh delay,
    /// so a connection is closed or replaced within a quarter period of when it is due, and
    /// within `MAINTENANCE_INTERVAL_MIN..=MAINTENANCE_INTERVAL_MAX`.
    pub fn maintenance_interval(&self) -> Duration {
        (self.idle_close.min(self.refresh_delay_min()) / 4)
            .clamp(MAINTENANCE_INTERVAL_MIN, MAINTENANCE_INTERVAL_MAX)
    }

    /// `refresh_period - refresh_jitter`, but never less than half the period.
    fn refresh_delay_min(&self) -> Duration {
        self.refresh_period.saturating_sub(self.refresh_jitter).max(self.refresh_period / 2)
    }

    /// One connection's time to refresh: uniform in `refresh_period ± refresh_jitter`, at least
    /// half the period.
    fn refresh_delay(&self) -> Duration {
        let jitter_ns = self.refresh_jitter.as_nanos().min(u64::MAX as u128 / 2) as u64;
        let offset_ns = random_below(2 * jitter_ns + 1);
        let delay = if offset_ns >= jitter_ns {
            self.refresh_period + Duration::from_nanos(offset_ns - jitter_ns)
        } else {
            self.refresh_period.saturating_sub(Duration::from_nanos(jitter_ns - offset_ns))
        };
        delay.max(self.refresh_delay_min())
    }
}

/// One connection of a pool, as [`Pool::stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionStats {
    pub address: String,
    /// Numbers the connections of one pool in the order they were opened, from 1.
    pub id: u64,
    /// Requests written on this connection (gRPC's `started_rpcs`).
    pub started: u64,
    /// Requests answered or failed (gRPC's `completed_rpcs`).
    pub completed: u64,
    /// `started - completed`: what is on the wire now. It can exceed the cap for a moment only
    /// when callers drop requests before their answers arrive: a dropped request frees its place
    /// at once, though the server may still be working on it.
    pub in_flight: u64,
    /// The most requests the pool ever had admitted on this connection at once; never above
    /// `requests_per_connection_max`.
    pub in_flight_peak: usize,
    /// Replaced by a refresh, waiting for its requests in flight before it is closed.
    pub draining: bool,
}

/// What a pool did over its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolCounters {
    /// Connections opened, on demand or as refresh replacements.
    pub opened: u64,
    /// Connections replaced by a refresh.
    pub refreshed: u64,
    /// Replaced connections that still carried requests and were closed once those completed.
    pub drained: u64,
    /// Draining connections closed after `DRAIN_DURATION_MAX` with requests still in flight.
    pub drain_forced: u64,
    /// Connections closed after `idle_close` without a request.
    pub idle_closed: u64,
    /// Requests that waited in the queue.
    pub queued: u64,
    /// Requests refused because the queue was full.
    pub queue_refused: u64,
}

impl std::ops::AddAssign for PoolCounters {
    fn add_assign(&mut self, other: PoolCounters) {
        self.opened += other.opened;
        self.refreshed += other.refreshed;
        self.drained += other.drained;
        self.drain_forced += other.drain_forced;
        self.idle_closed += other.idle_closed;
        self.queued += other.queued;
        self.queue_refused += other.queue_refused;
    }
}

/// Up to `connections_per_forwarder` connections to one address. See the module docs.
pub struct Pool {
    address: String,
    settings: PoolSettings,
    /// TLS and token of each connection the pool opens.
    security: Security,
    state: Mutex<State>,
}

impl Pool {
    /// A pool with no connection yet; `InvalidArgument` if the settings are out of range.
    pub fn new(address: impl Into<String>, settings: PoolSettings) -> Result<Pool> {
        settings.validate()?;
        let state = State {
            slots: (0..settings.connections_per_forwarder).map(|_| Slot::Empty).collect(),
            draining: Vec::new(),
            cursor: 0,
            queue: VecDeque::new(),
            next_id: 1,
            counters: PoolCounters::default(),
        };
        Ok(Pool {
            address: address.into(),
            settings,
            security: Security::default(),
            state: Mutex::new(state),
        })
    }

    /// Opens every connection as `security` says (TLS, a token presented first).
    pub fn with_security(mut self, security: Security) -> Pool {
        self.security = security;
        self
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Sends a request on one of the pool's connections, waiting for a free one if needed.
    pub async fn call<T: Body>(&self, command: u16, body: &T) -> Result<Response> {
        let lease = self.acquire().await?;
        lease.connection().call(command, body).await
    }

    /// Every connection: the open ones, then the draining ones.
    pub fn stats(&self) -> Vec<ConnectionStats> {
        let state = self.state.lock().unwrap();
        let open = state.slots.iter().filter_map(|slot| match slot {
            Slot::Open(member) => Some((member, false)),
            _ => None,
        });
        let draining = state.draining.iter().map(|draining| (&draining.member, true));
        open.chain(draining).map(|(member, draining)| member.stats(&self.address, draining)).collect()
    }

    /// Requests waiting for a connection.
    pub fn queued(&self) -> usize {
        self.state.lock().unwrap().queue.len()
    }

    pub fn counters(&self) -> PoolCounters {
        self.state.lock().unwrap().counters
    }

    /// Closes idle connections, force-closes connections that drained too long, and refreshes
    /// the connections that are due. Blocks while it opens replacements (up to
    /// `CONNECT_TIMEOUT` each): call it from a thread of its own, not from an executor.
    pub fn maintain(&self) {
        self.maintain_at(Instant::now());
    }

    pub(crate) fn maintain_at(&self, now: Instant) {
        let mut effects = Effects::default();
        let due = {
            let mut state = self.state.lock().unwrap();
            state.tidy(&self.settings, now, &mut effects);
            state.dispatch(&self.settings, now, &mut effects);
            state.refresh_due(now)
        };
        effects.apply();
        for (slot, id) in due {
            let connected = Connection::connect_with(&self.address, &self.security);
            let mut effects = Effects::default();
            self.state.lock().unwrap().refreshed(slot, id, connected, &self.settings, now, &mut effects);
            effects.apply();
        }
    }

    /// No connection, none being opened, nobody waiting.
    #[cfg(test)]
    fn is_unused(&self) -> bool {
        let state = self.state.lock().unwrap();
        state.queue.is_empty()
            && state.draining.is_empty()
            && state.slots.iter().all(|slot| matches!(slot, Slot::Empty))
    }

    /// Admits one request onto a connection; the request counts against the connection until
    /// the lease is dropped. Fails with `ResourceExhausted` (and only then with a `Status`) when
    /// the queue is full, or with the connection error when no connection could be opened.
    pub(crate) async fn acquire(&self) -> Result<Lease<'_>> {
        let mut effects = Effects::default();
        let admitted = self.state.lock().unwrap().admit(&self.settings, Instant::now(), &mut effects);
        effects.apply();
        let admission = match admitted {
            Admit::Now(admission) => admission,
            Admit::Queued(waiter) => Queued { pool: self, waiter }.await?,
            Admit::Refused { connections } => {
                return Err(Error::Status(Status::resource_exhausted(format!(
                    "{} requests already wait for a connection to {} (queue_requests_max); \
                     {connections} connections carry {} requests each (requests_per_connection_max)",
                    self.settings.queue_requests_max, self.address, self.settings.requests_per_connection_max
                ))));
            }
        };
        match admission {
            Admission::Leased(reservation) => Ok(Lease { pool: self, reservation }),
            Admission::Open(slot) => self.open(Opening { pool: self, slot: Some(slot) }).await,
        }
    }

    /// Opens the connection of a slot marked `Connecting` and admits the caller on it.
    async fn open<'a>(&'a self, mut opening: Opening<'a>) -> Result<Lease<'a>> {
        let (address, security) = (self.address.clone(), self.security.clone());
        let connected = off_thread(move || Connection::connect_with(&address, &security)).await;
        let slot = opening.slot.take().expect("an opening is awaited once");
        let mut effects = Effects::default();
        let result = {
            let mut state = self.state.lock().unwrap();
            let now = Instant::now();
            match connected {
                Ok(connection) => {
                    state.install(slot, connection, &self.settings, now);
                    let reservation = state.reserve(slot, now);
                    state.dispatch(&self.settings, now, &mut effects);
                    Ok(Lease { pool: self, reservation })
                }
                Err(error) => {
                    state.open_failed(slot, &error, &self.settings, now, &mut effects);
                    Err(error)
                }
            }
        };
        effects.apply();
        result
    }

    fn release(&self, reservation: &Reservation) {
        let mut effects = Effects::default();
        {
            let mut state = self.state.lock().unwrap();
            let now = Instant::now();
            state.release(reservation, now, &mut effects);
            state.dispatch(&self.settings, now, &mut effects);
        }
        effects.apply();
    }
}

/// A request's claim on a connection: one of the connection's `requests_per_connection_max`.
struct Reservation {
    slot: usize,
    id: u64,
    connection: Arc<Connection>,
}

/// An admitted request. Dropping it (the response arrived, or the caller gave up) frees its
/// place on the connection and admits the next queued request.
pub(crate) struct Lease<'a> {
    pool: &'a Pool,
    reservation: Reservation,
}

impl Lease<'_> {
    pub(crate) fn connection(&self) -> &Arc<Connection> {
        &self.reservation.connection
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.pool.release(&self.reservation);
    }
}

/// Returns a `Connecting` slot to `Empty` if its opener is dropped before the connect finished.
struct Opening<'a> {
    pool: &'a Pool,
    slot: Option<usize>,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut effects = Effects::default();
            {
                let mut state = self.pool.state.lock().unwrap();
                state.slots[slot] = Slot::Empty;
                state.dispatch(&self.pool.settings, Instant::now(), &mut effects);
            }
            effects.apply();
        }
    }
}

struct Member {
    /// Unique within the pool, so a lease never releases a slot's later connection.
    id: u64,
    connection: Arc<Connection>,
    /// Admitted requests not yet released.
    reserved: usize,
    reserved_peak: usize,
    last_used: Instant,
    refresh_at: Instant,
    /// A replacement is being opened.
    refreshing: bool,
}

impl Member {
    fn stats(&self, address: &str, draining: bool) -> ConnectionStats {
        let (started, completed) = self.connection.counters();
        ConnectionStats {
            address: address.to_owned(),
            id: self.id,
            started,
            completed,
            in_flight: started.saturating_sub(completed),
            in_flight_peak: self.reserved_peak,
            draining,
        }
    }
}

enum Slot {
    Empty,
    /// A request is opening this slot's connection.
    Connecting,
    Open(Member),
}

struct Draining {
    member: Member,
    since: Instant,
}

/// What to do once the pool's lock is released: close sockets and wake queued requests.
#[derive(Default)]
struct Effects {
    closes: Vec<Arc<Connection>>,
    wakers: Vec<Waker>,
}

impl Effects {
    fn apply(self) {
        for connection in self.closes {
            connection.close();
        }
        for waker in self.wakers {
            waker.wake();
        }
    }
}

/// A queued request, shared with the queue.
#[derive(Default)]
struct Waiter {
    inner: Mutex<WaiterInner>,
}

#[derive(Default)]
struct WaiterInner {
    grant: Grant,
    waker: Option<Waker>,
}

#[derive(Default)]
enum Grant {
    #[default]
    Waiting,
    /// Admitted on a connection.
    Leased(Reservation),
    /// Asked to open the connection of an empty slot.
    Open(usize),
    /// No connection could be opened.
    Failed(Error),
    /// Handed to the request.
    Taken,
}

impl Waiter {
    fn grant(&self, grant: Grant, effects: &mut Effects) {
        let mut inner = self.inner.lock().unwrap();
        inner.grant = grant;
        effects.wakers.extend(inner.waker.take());
    }
}

enum Admission {
    Leased(Reservation),
    Open(usize),
}

enum Admit {
    Now(Admission),
    Queued(Arc<Waiter>),
    Refused { connections: usize },
}

/// The future of a queued request. Dropped before its turn, it leaves the queue; dropped after
/// it was granted but before it saw the grant, it hands the grant back.
struct Queued<'a> {
    pool: &'a Pool,
    waiter: Arc<Waiter>,
}

impl Future for Queued<'_> {
    type Output = Result<Admission>;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.waiter.inner.lock().unwrap();
        match std::mem::replace(&mut inner.grant, Grant::Taken) {
            Grant::Waiting => {
                inner.grant = Grant::Waiting;
                match &mut inner.waker {
                    Some(waker) if waker.will_wake(context.waker()) => {}
                    waker => *waker = Some(context.waker().clone()),
                }
                Poll::Pending
            }
            Grant::Leased(reservation) => Poll::Ready(Ok(Admission::Leased(reservation))),
            Grant::Open(slot) => Poll::Ready(Ok(Admission::Open(slot))),
            Grant::Failed(error) => Poll::Ready(Err(error)),
            Grant::Taken => {
                Poll::Ready(Err(Error::Protocol("a queued request was polled after completion".into())))
            }
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut effects = Effects::default();
        {
            let mut state = self.pool.state.lock().unwrap();
            let grant = std::mem::replace(&mut self.waiter.inner.lock().unwrap().grant, Grant::Taken);
            let now = Instant::now();
            match grant {
                Grant::Waiting => state.queue.retain(|waiter| !Arc::ptr_eq(waiter, &self.waiter)),
                Grant::Leased(reservation) => state.release(&reservation, now, &mut effects),
                Grant::Open(slot) => state.slots[slot] = Slot::Empty,
                Grant::Failed(_) | Grant::Taken => {}
            }
            state.dispatch(&self.pool.settings, now, &mut effects);
        }
        effects.apply();
    }
}

enum Pick {
    Member(usize),
    Empty(usize),
}

/// The pool's bookkeeping, without I/O: every method runs under the pool's lock and leaves
/// socket closes and wakeups in `Effects`.
struct State {
    /// `connections_per_forwarder` of them.
    slots: Vec<Slot>,
    /// Replaced connections waiting for their requests.
    draining: Vec<Draining>,
    /// Where the next round-robin search starts.
    cursor: usize,
    queue: VecDeque<Arc<Waiter>>,
    next_id: u64,
    counters: PoolCounters,
}

impl State {
    fn admit(&mut self, settings: &PoolSettings, now: Instant, effects: &mut Effects) -> Admit {
        self.tidy(settings, now, effects);
        self.dispatch(settings, now, effects);
        // A non-empty queue after dispatching means every connection is busy; a new request
        // does not overtake the ones waiting.
        if self.queue.is_empty() {
            match self.pick(settings) {
                Some(Pick::Member(slot)) => return Admit::Now(Admission::Leased(self.reserve(slot, now))),
                Some(Pick::Empty(slot)) => {
                    self.slots[slot] = Slot::Connecting;
                    return Admit::Now(Admission::Open(slot));
                }
                None => {}
            }
        }
        if self.queue.len() >= settings.queue_requests_max {
            self.counters.queue_refused += 1;
            let connections = self.slots.iter().filter(|slot| !matches!(slot, Slot::Empty)).count();
            return Admit::Refused { connections };
        }
        let waiter = Arc::new(Waiter::default());
        self.queue.push_back(waiter.clone());
        self.counters.queued += 1;
        Admit::Queued(waiter)
    }

    /// Empties the slots of connections that are closed or idle, and closes draining connections
    /// past `DRAIN_DURATION_MAX`.
    fn tidy(&mut self, settings: &PoolSettings, now: Instant, effects: &mut Effects) {
        for slot in &mut self.slots {
            let Slot::Open(member) = slot else { continue };
            let closed = member.connection.is_closed();
            let idle = member.reserved == 0
                && now.saturating_duration_since(member.last_used) >= settings.idle_close;
            if closed || idle {
                if idle && !closed {
                    self.counters.idle_closed += 1;
                }
                if let Slot::Open(member) = std::mem::replace(slot, Slot::Empty) {
                    effects.closes.push(member.connection);
                }
            }
        }
        let counters = &mut self.counters;
        self.draining.retain(|draining| {
            if draining.member.connection.is_closed() {
                return false;
            }
            if now.saturating_duration_since(draining.since) >= DRAIN_DURATION_MAX {
                counters.drain_forced += 1;
                effects.closes.push(draining.member.connection.clone());
                return false;
            }
            true
        });
    }

    /// A slot for the next request: an open connection below the cap, or an empty slot to open.
    fn pick(&mut self, settings: &PoolSettings) -> Option<Pick> {
        let count = self.slots.len();
        let cap = settings.requests_per_connection_max;
        let pick = match settings.strategy {
            Strategy::RoundRobin => (0..count).find_map(|step| {
                let index = (self.cursor + step) % count;
                match &self.slots[index] {
                    Slot::Open(member) if member.reserved < cap => Some(Pick::Member(index)),
                    Slot::Empty => Some(Pick::Empty(index)),
                    _ => None,
                }
            })?,
            Strategy::LeastInFlight => {
                let mut least: Option<(usize, usize)> = None;
                let mut empty = None;
                for step in 0..count {
                    let index = (self.cursor + step) % count;
                    match &self.slots[index] {
                        Slot::Open(member)
                            if member.reserved < cap
                                && least.is_none_or(|(reserved, _)| member.reserved < reserved) =>
                        {
                            least = Some((member.reserved, index));
                        }
                        Slot::Empty if empty.is_none() => empty = Some(index),
                        _ => {}
                    }
                }
                match (least, empty) {
                    (Some((0, index)), _) | (Some((_, index)), None) => Pick::Member(index),
                    (_, Some(index)) => Pick::Empty(index),
                    (None, None) => return None,
                }
            }
        };
        let (Pick::Member(index) | Pick::Empty(index)) = pick;
        self.cursor = (index + 1) % count;
        Some(pick)
    }

    fn reserve(&mut self, slot: usize, now: Instant) -> Reservation {
        let Slot::Open(member) = &mut self.slots[slot] else {
            unreachable!("reserving on slot {slot}, which has no open connection");
        };
        member.reserved += 1;
        member.reserved_peak = member.reserved_peak.max(member.reserved);
        member.last_used = now;
        Reservation { slot, id: member.id, connection: member.connection.clone() }
    }

    fn release(&mut self, reservation: &Reservation, now: Instant, effects: &mut Effects) {
        if let Slot::Open(member) = &mut self.slots[reservation.slot] {
            if member.id == reservation.id {
                member.reserved -= 1;
                member.last_used = now;
                return;
            }
        }
        let Some(position) = self.draining.iter().position(|draining| draining.member.id == reservation.id)
        else {
            // The connection was closed and dropped from the pool meanwhile.
            return;
        };
        let member = &mut self.draining[position].member;
        member.reserved -= 1;
        if member.reserved == 0 {
            let drained = self.draining.swap_remove(position);
            self.counters.drained += 1;
            effects.closes.push(drained.member.connection);
        }
    }

    /// Hands free capacity to the queue in order: a place on an open connection, or an empty
    /// slot for the waiter to open.
    fn dispatch(&mut self, settings: &PoolSettings, now: Instant, effects: &mut Effects) {
        while !self.queue.is_empty() {
            let Some(pick) = self.pick(settings) else { break };
            let grant = match pick {
                Pick::Member(slot) => Grant::Leased(self.reserve(slot, now)),
                Pick::Empty(slot) => {
                    self.slots[slot] = Slot::Connecting;
                    Grant::Open(slot)
                }
            };
            let waiter = self.queue.pop_front().expect("the queue is not empty");
            waiter.grant(grant, effects);
        }
    }

    fn new_member(&mut self, connection: Arc<Connection>, settings: &PoolSettings, now: Instant) -> Member {
        let id = self.next_id;
        self.next_id += 1;
        self.counters.opened += 1;
        Member {
            id,
            connection,
            reserved: 0,
            reserved_peak: 0,
            last_used: now,
            refresh_at: now + settings.refresh_delay(),
            refreshing: false,
        }
    }

    fn install(&mut self, slot: usize, connection: Arc<Connection>, settings: &PoolSettings, now: Instant) {
        debug_assert!(matches!(self.slots[slot], Slot::Connecting));
        let member = self.new_member(connection, settings, now);
        self.slots[slot] = Slot::Open(member);
    }

    fn open_failed(
        &mut self,
        slot: usize,
        error: &Error,
        settings: &PoolSettings,
        now: Instant,
        effects: &mut Effects,
    ) {
        self.slots[slot] = Slot::Empty;
        if self.slots.iter().all(|slot| matches!(slot, Slot::Empty)) {
            // Nothing open and nothing being opened: the address is unreachable, and the waiting
            // requests would each try and fail in turn. They fail now, and retry with backoff.
            for waiter in self.queue.drain(..) {
                waiter.grant(Grant::Failed(error.duplicate()), effects);
            }
        } else {
            self.dispatch(settings, now, effects);
        }
    }

    /// Marks and returns the open connections whose refresh is due.
    fn refresh_due(&mut self, now: Instant) -> Vec<(usize, u64)> {
        let mut due = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if let Slot::Open(member) = slot {
                if !member.refreshing && now >= member.refresh_at {
                    member.refreshing = true;
                    due.push((index, member.id));
                }
            }
        }
        due
    }

    /// Swaps in a replacement for connection `id` of `slot`; the old one drains.
    fn refreshed(
        &mut self,
        slot: usize,
        id: u64,
        connected: Result<Arc<Connection>>,
        settings: &PoolSettings,
        now: Instant,
        effects: &mut Effects,
    ) {
        let current = matches!(&self.slots[slot], Slot::Open(member) if member.id == id);
        match connected {
            Ok(connection) if current => {
                let member = self.new_member(connection, settings, now);
                let Slot::Open(old) = std::mem::replace(&mut self.slots[slot], Slot::Open(member)) else {
                    unreachable!("slot {slot} held connection {id}");
                };
                self.counters.refreshed += 1;
                if old.reserved == 0 {
                    effects.closes.push(old.connection);
                } else {
                    self.draining.push(Draining { member: old, since: now });
                }
                self.dispatch(settings, now, effects);
            }
            // Idle-closed or dropped meanwhile: the replacement is not needed.
            Ok(connection) => effects.closes.push(connection),
            Err(_) => {
                if let Slot::Open(member) = &mut self.slots[slot] {
                    if member.id == id {
                        member.refreshing = false;
                        member.refresh_at = now + REFRESH_RETRY_DELAY.min(settings.refresh_period);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on;
    use ringpost_wire::frame::{encode_frame, FrameHeader, FLAG_RESPONSE};
    use ringpost_wire::limits::FRAME_HEADER_BYTES;
    use ringpost_wire::messages::Empty;
    use ringpost_wire::ErrorCode;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::Condvar;
    use std::thread::JoinHandle;

    const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A server speaking just enough of the protocol: it answers every request with an empty
    /// body, at once or, while holding, when released.
    struct FakeServer {
        address: String,
        shared: Arc<(Mutex<ServerState>, Condvar)>,
    }

    #[derive(Default)]
    struct ServerState {
        holding: bool,
        held: Vec<(Arc<Mutex<TcpStream>>, FrameHeader)>,
        /// Commands in the order they arrived.
        received: Vec<u16>,
        accepted: usize,
        open: usize,
        streams: Vec<TcpStream>,
    }

    fn respond(stream: &Mutex<TcpStream>, header: &FrameHeader) {
        let frame = encode_frame(header.command, FLAG_RESPONSE, header.request_id, &Empty {});
        let _ = stream.lock().unwrap().write_all(&frame);
    }

    impl FakeServer {
        fn start() -> FakeServer {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let shared: Arc<(Mutex<ServerState>, Condvar)> = Arc::default();
            let accepting = shared.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { return };
                    {
                        let mut state = accepting.0.lock().unwrap();
                        state.accepted += 1;
                        state.open += 1;
                        state.streams.push(stream.try_clone().unwrap());
                    }
                    accepting.1.notify_all();
                    let shared = accepting.clone();
                    std::thread::spawn(move || serve(stream, shared));
                }
            });
            FakeServer { address, shared }
        }

        fn hold(&self) {
            self.shared.0.lock().unwrap().holding = true;
        }

        fn release(&self) {
            let held = {
                let mut state = self.shared.0.lock().unwrap();
                state.holding = false;
                std::mem::take(&mut state.held)
            };
            for (stream, header) in held {
                respond(&stream, &header);
            }
        }

        /// Answers the oldest held request only.
        fn release_one(&self) {
            let first = {
                let mut state = self.shared.0.lock().unwrap();
                (!state.held.is_empty()).then(|| state.held.remove(0))
            };
            if let Some((stream, header)) = first {
                respond(&stream, &header);
            }
        }

        fn kill_connections(&self) {
            for stream in self.shared.0.lock().unwrap().streams.drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }

        fn state<T>(&self, read: impl FnOnce(&ServerState) -> T) -> T {
            read(&self.shared.0.lock().unwrap())
        }

        fn wait_for(&self, what: &str, condition: impl Fn(&ServerState) -> bool) {
            let deadline = Instant::now() + WAIT_TIMEOUT;
            let mut state = self.shared.0.lock().unwrap();
            while !condition(&state) {
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(!left.is_zero(), "timed out waiting for the server: {what}");
                state = self.shared.1.wait_timeout(state, left).unwrap().0;
            }
        }
    }

    fn serve(mut stream: TcpStream, shared: Arc<(Mutex<ServerState>, Condvar)>) {
        let writer = Arc::new(Mutex::new(stream.try_clone().unwrap()));
        loop {
            let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
            if stream.read_exact(&mut header_bytes).is_err() {
                break;
            }
            let header = FrameHeader::decode(&header_bytes).unwrap();
            let mut body = vec![0u8; header.body_length as usize];
            if stream.read_exact(&mut body).is_err() {
                break;
            }
            let mut state = shared.0.lock().unwrap();
            state.received.push(header.command);
            if state.holding {
                state.held.push((writer.clone(), header));
            } else {
                respond(&writer, &header);
            }
            drop(state);
            shared.1.notify_all();
        }
        shared.0.lock().unwrap().open -= 1;
        shared.1.notify_all();
    }

    fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + WAIT_TIMEOUT;
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn settings(connections: usize, requests: usize) -> PoolSettings {
        PoolSettings {
            connections_per_forwarder: connections,
            requests_per_connection_max: requests,
            ..PoolSettings::default()
        }
    }

    fn pool(server: &FakeServer, settings: PoolSettings) -> Arc<Pool> {
        Arc::new(Pool::new(server.address.clone(), settings).unwrap())
    }

    const COMMAND: u16 = 9000;

    fn call(pool: &Pool, command: u16) -> Result<()> {
        block_on(pool.call(command, &Empty {})).map(|_| ())
    }

    fn spawn_calls(pool: &Arc<Pool>, count: usize) -> Vec<JoinHandle<Result<()>>> {
        (0..count)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || call(&pool, COMMAND))
            })
            .collect()
    }

    fn join(calls: Vec<JoinHandle<Result<()>>>) -> Vec<Result<()>> {
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    }

    fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    fn in_flight(pool: &Pool) -> u64 {
        pool.stats().iter().map(|stats| stats.in_flight).sum()
    }

    #[test]
    fn defaults_are_bigtables() {
        let defaults = PoolSettings::default();
        assert_eq!(defaults.connections_per_forwarder, 4);
        assert_eq!(defaults.requests_per_connection_max, 100);
        assert_eq!(defaults.strategy, Strategy::RoundRobin);
        assert_eq!(defaults.idle_close, Duration::from_secs(300));
        assert_eq!(defaults.refresh_period, Duration::from_secs(3000));
        assert_eq!(defaults.refresh_jitter, Duration::from_secs(300));
        assert_eq!(defaults.queue_requests_max, 10_000);
        assert_eq!(defaults.maintenance_interval(), MAINTENANCE_INTERVAL_MAX);
        defaults.validate().unwrap();
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        for bad in [
            settings(0, 100),
            settings(CONNECTIONS_PER_FORWARDER_MAX + 1, 100),
            settings(4, 0),
            settings(4, REQUESTS_PENDING_PER_CONNECTION_MAX + 1),
            PoolSettings { idle_close: Duration::ZERO, ..PoolSettings::default() },
            PoolSettings { refresh_period: Duration::ZERO, ..PoolSettings::default() },
        ] {
            let error = Pool::new("127.0.0.1:1", bad.clone()).err().expect("refused");
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{bad:?}: {error}");
        }
    }

    #[test]
    fn refresh_delays_stay_within_the_jitter() {
        let settings = PoolSettings {
            refresh_period: Duration::from_secs(3000),
            refresh_jitter: Duration::from_secs(300),
            ..PoolSettings::default()
        };
        let delays: Vec<Duration> = (0..1000).map(|_| settings.refresh_delay()).collect();
        assert!(delays.iter().all(|delay| (2700..=3300).contains(&delay.as_secs())));
        assert!(
            delays.iter().any(|delay| delay.as_secs() < 2850)
                && delays.iter().any(|delay| delay.as_secs() > 3150)
        );
        // A jitter above the period never makes a delay shorter than half the period.
        let wild = PoolSettings {
            refresh_period: Duration::from_millis(200),
            refresh_jitter: Duration::from_secs(1),
            ..settings
        };
        assert!((0..1000).all(|_| wild.refresh_delay() >= Duration::from_millis(100)));
        assert_eq!(wild.maintenance_interval(), Duration::from_millis(25));
    }

    #[test]
    fn connections_open_lazily_and_never_exceed_the_pool_size() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(3, 100));
        assert!(pool.stats().is_empty());
        assert_eq!(server.state(|state| state.accepted), 0, "nothing opened before a request");
        server.hold();
        let calls = spawn_calls(&pool, 60);
        server.wait_for("60 requests", |state| state.received.len() == 60);
        assert_eq!(server.state(|state| state.accepted), 3);
        assert_eq!(pool.stats().len(), 3);
        server.release();
        assert!(join(calls).iter().all(Result::is_ok));
        assert_eq!(pool.counters().opened, 3);
    }

    #[test]
    fn round_robin_spreads_requests_evenly() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(4, 100));
        for _ in 0..400 {
            call(&pool, COMMAND).unwrap();
        }
        let stats = pool.stats();
        assert_eq!(stats.len(), 4);
        for connection in &stats {
            assert_eq!(
                (connection.started, connection.completed, connection.in_flight),
                (100, 100, 0),
                "{stats:?}"
            );
        }
    }

    #[test]
    fn least_in_flight_opens_connections_only_when_busy() {
        let server = FakeServer::start();
        let pool = pool(&server, PoolSettings { strategy: Strategy::LeastInFlight, ..settings(4, 100) });
        for _ in 0..50 {
            call(&pool, COMMAND).unwrap();
        }
        assert_eq!(pool.stats().len(), 1, "one request at a time needs one connection");
        server.hold();
        let calls = spawn_calls(&pool, 3);
        server.wait_for("3 requests", |state| state.received.len() == 53);
        let stats = pool.stats();
        assert_eq!(stats.len(), 3, "{stats:?}");
        assert!(stats.iter().all(|connection| connection.in_flight == 1), "{stats:?}");
        server.release();
        assert!(join(calls).iter().all(Result::is_ok));
    }

    #[test]
    fn a_connection_carries_at_most_its_cap_and_the_rest_queue() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(1, 2));
        server.hold();
        let calls = spawn_calls(&pool, 10);
        wait_until("8 queued", || pool.queued() == 8);
        server.wait_for("2 requests", |state| state.received.len() == 2);
        assert_eq!(in_flight(&pool), 2);
        // Each answer admits exactly one queued request.
        server.release_one();
        wait_until("7 queued", || pool.queued() == 7);
        server.wait_for("3 requests", |state| state.received.len() == 3);
        assert_eq!(in_flight(&pool), 2);
        server.release();
        assert!(join(calls).iter().all(Result::is_ok));
        let stats = pool.stats();
        assert_eq!((stats[0].started, stats[0].in_flight_peak), (10, 2));
        // 8, or 9 if the second request arrived while the first was still connecting.
        assert!((8..=9).contains(&pool.counters().queued), "{:?}", pool.counters());
    }

    #[test]
    fn queued_requests_are_served_in_arrival_order() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(1, 1));
        server.hold();
        let mut calls = Vec::new();
        for (position, command) in (100..106).enumerate() {
            let caller = pool.clone();
            calls.push(std::thread::spawn(move || call(&caller, command)));
            if position == 0 {
                server.wait_for("the first request", |state| state.received.len() == 1);
            } else {
                wait_until("queued in turn", || pool.queued() == position);
            }
        }
        server.release();
        assert!(join(calls).iter().all(Result::is_ok));
        assert_eq!(server.state(|state| state.received.clone()), (100..106).collect::<Vec<u16>>());
    }

    #[test]
    fn a_full_queue_refuses_at_once() {
        let server = FakeServer::start();
        let pool = pool(&server, PoolSettings { queue_requests_max: 2, ..settings(1, 1) });
        server.hold();
        let calls = spawn_calls(&pool, 3);
        wait_until("2 queued", || pool.queued() == 2);
        let mut refused = std::pin::pin!(pool.call(COMMAND, &Empty {}));
        let Poll::Ready(Err(error)) = poll_once(refused.as_mut()) else {
            panic!("the fourth request must fail on its first poll");
        };
        assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}");
        assert!(error.to_string().contains("queue_requests_max"), "{error}");
        assert_eq!(pool.counters().queue_refused, 1);
        server.release();
        assert!(join(calls).iter().all(Result::is_ok));
    }

    #[test]
    fn a_request_dropped_while_queued_leaves_the_queue() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(1, 1));
        server.hold();
        let first = spawn_calls(&pool, 1);
        server.wait_for("the first request", |state| state.received.len() == 1);
        {
            let mut abandoned = std::pin::pin!(pool.call(COMMAND, &Empty {}));
            assert!(poll_once(abandoned.as_mut()).is_pending());
            assert_eq!(pool.queued(), 1);
        }
        assert_eq!(pool.queued(), 0);
        let second = spawn_calls(&pool, 1);
        wait_until("queued", || pool.queued() == 1);
        server.release();
        assert!(join(first).into_iter().chain(join(second)).all(|result| result.is_ok()));
        assert_eq!(server.state(|state| state.received.len()), 2, "the abandoned request was never sent");
    }

    #[test]
    fn a_granted_request_dropped_before_it_runs_hands_its_place_on() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(1, 1));
        server.hold();
        let first = spawn_calls(&pool, 1);
        server.wait_for("the first request", |state| state.received.len() == 1);
        let mut granted = Box::pin(pool.call(COMMAND, &Empty {}));
        assert!(poll_once(granted.as_mut()).is_pending());
        let third = spawn_calls(&pool, 1);
        wait_until("2 queued", || pool.queued() == 2);
        // The first answer grants the place to the dropped-to-be request; dropping it passes the
        // place to the third.
        server.release_one();
        wait_until("granted", || pool.queued() == 1);
        drop(granted);
        server.wait_for("the third request", |state| state.received.len() == 2);
        server.release();
        assert!(join(first).into_iter().chain(join(third)).all(|result| result.is_ok()));
    }

    #[test]
    fn idle_connections_close_and_reopen_on_demand() {
        let server = FakeServer::start();
        let pool = pool(&server, PoolSettings { idle_close: Duration::from_millis(100), ..settings(2, 100) });
        call(&pool, COMMAND).unwrap();
        call(&pool, COMMAND).unwrap();
        assert_eq!(pool.stats().len(), 2);
        pool.maintain();
        assert_eq!(pool.stats().len(), 2, "not idle yet");
        std::thread::sleep(Duration::from_millis(150));
        pool.maintain();
        assert!(pool.stats().is_empty());
        assert_eq!(pool.counters().idle_closed, 2);
        server.wait_for("both connections closed", |state| state.open == 0);
        assert!(pool.is_unused());
        call(&pool, COMMAND).unwrap();
        assert_eq!(pool.stats().len(), 1);
        assert_eq!(server.state(|state| state.accepted), 3);
    }

    #[test]
    fn idle_connections_close_on_the_next_request_without_maintenance() {
        let server = FakeServer::start();
        let pool = pool(&server, PoolSettings { idle_close: Duration::from_millis(100), ..settings(1, 100) });
        call(&pool, COMMAND).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        call(&pool, COMMAND).unwrap();
        let stats = pool.stats();
        assert_eq!((stats.len(), stats[0].id, stats[0].started), (1, 2, 1), "{stats:?}");
        assert_eq!(pool.counters().idle_closed, 1);
    }

    #[test]
    fn refresh_replaces_connections_and_lets_the_old_ones_drain() {
        let server = FakeServer::start();
        let pool = pool(
            &server,
            PoolSettings {
                refresh_period: Duration::from_millis(100),
                refresh_jitter: Duration::ZERO,
                ..settings(1, 100)
            },
        );
        server.hold();
        let old = spawn_calls(&pool, 2);
        server.wait_for("2 requests", |state| state.received.len() == 2);
        std::thread::sleep(Duration::from_millis(120));
        pool.maintain();
        let stats = pool.stats();
        assert_eq!(stats.len(), 2, "{stats:?}");
        assert_eq!((stats[0].id, stats[0].draining, stats[0].in_flight), (2, false, 0));
        assert_eq!((stats[1].id, stats[1].draining, stats[1].in_flight), (1, true, 2));
        // New requests go to the replacement at once.
        let new = spawn_calls(&pool, 1);
        server.wait_for("the new request", |state| state.received.len() == 3);
        assert_eq!(pool.stats()[0].in_flight, 1);
        server.release();
        assert!(join(old).into_iter().chain(join(new)).all(|result| result.is_ok()));
        let stats = pool.stats();
        assert_eq!(stats.len(), 1, "the drained connection is gone: {stats:?}");
        assert_eq!(stats[0].id, 2);
        server.wait_for("the old connection closed", |state| state.open == 1);
        let counters = pool.counters();
        assert_eq!((counters.opened, counters.refreshed, counters.drained), (2, 1, 1));
    }

    #[test]
    fn an_idle_connection_due_for_refresh_is_replaced_at_once() {
        let server = FakeServer::start();
        let pool = pool(
            &server,
            PoolSettings {
                refresh_period: Duration::from_millis(50),
                refresh_jitter: Duration::ZERO,
                ..settings(1, 10)
            },
        );
        call(&pool, COMMAND).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        pool.maintain();
        let stats = pool.stats();
        assert_eq!((stats.len(), stats[0].id, stats[0].draining), (1, 2, false), "{stats:?}");
        server.wait_for("the old connection closed", |state| state.open == 1);
        assert_eq!(pool.counters().drained, 0);
    }

    #[test]
    fn a_connection_draining_too_long_is_closed() {
        let server = FakeServer::start();
        let pool = pool(
            &server,
            PoolSettings {
                refresh_period: Duration::from_millis(50),
                refresh_jitter: Duration::ZERO,
                ..settings(1, 10)
            },
        );
        server.hold();
        let stuck = spawn_calls(&pool, 1);
        server.wait_for("the request", |state| state.received.len() == 1);
        std::thread::sleep(Duration::from_millis(60));
        pool.maintain();
        assert!(pool.stats()[1].draining);
        pool.maintain_at(Instant::now() + DRAIN_DURATION_MAX);
        let results = join(stuck);
        assert_eq!(results[0].as_ref().unwrap_err().code(), ErrorCode::Unavailable);
        assert!(pool.stats().iter().all(|connection| !connection.draining));
        assert_eq!(pool.counters().drain_forced, 1);
    }

    #[test]
    fn a_connection_the_server_closed_is_replaced() {
        let server = FakeServer::start();
        let pool = pool(&server, settings(1, 10));
        call(&pool, COMMAND).unwrap();
        server.kill_connections();
        wait_until("the client saw the close", || {
            let state = pool.state.lock().unwrap();
            matches!(&state.slots[0], Slot::Open(member) if member.connection.is_closed())
        });
        call(&pool, COMMAND).unwrap();
        let stats = pool.stats();
        assert_eq!((stats.len(), stats[0].id), (1, 2), "{stats:?}");
    }

    #[test]
    fn an_unreachable_address_fails_the_opener_and_the_waiting_requests() {
        let address = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let pool = Arc::new(Pool::new(address, settings(1, 1)).unwrap());
        let results = join(
            (0..5)
                .map(|_| {
                    let pool = pool.clone();
                    std::thread::spawn(move || call(&pool, COMMAND))
                })
                .collect(),
        );
        for result in results {
            assert_eq!(result.unwrap_err().code(), ErrorCode::Unavailable);
        }
        assert!(pool.is_unused());
        assert_eq!(pool.queued(), 0);
    }

    #[test]
    fn an_opener_dropped_while_connecting_frees_its_slot() {
        let server = FakeServer::start();
        server.hold();
        let pool = pool(&server, settings(1, 10));
        let mut connecting_seen = 0;
        for _ in 0..20 {
            {
                let mut opening = std::pin::pin!(pool.call(COMMAND, &Empty {}));
                assert!(poll_once(opening.as_mut()).is_pending());
                // Usually still connecting; a fast connect may have finished within the poll, and
                // the request is then on the wire.
                connecting_seen += matches!(pool.state.lock().unwrap().slots[0], Slot::Connecting) as usize;
            }
            let state = pool.state.lock().unwrap();
            match &state.slots[0] {
                Slot::Empty => {}
                Slot::Open(member) => assert_eq!(member.reserved, 0, "the dropped request kept its place"),
                Slot::Connecting => panic!("the slot stayed connecting after its opener was dropped"),
            }
            drop(state);
            if let Slot::Open(member) =
                std::mem::replace(&mut pool.state.lock().unwrap().slots[0], Slot::Empty)
            {
                member.connection.close();
            }
        }
        assert!(connecting_seen > 0, "every connect finished within one poll");
        server.release();
        call(&pool, COMMAND).unwrap();
    }
}
