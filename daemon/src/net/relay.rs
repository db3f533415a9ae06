//! A subscribe forwarder: a forwarder of a cluster serves a client whose topic or
//! subscription another node leads by carrying its requests there, for either protocol. A
//! stream, a pull, an acknowledgement or a deadline change that the data plane answers with
//! `NotOwner` (and a gRPC publish, pull or stream the gateway found led elsewhere) is looked up
//! in the node's route cache (`dispatch::routes`, which the gateway shares), else through this
//! node's router; when the leader is on another node, the request goes to that
//! leader's forwarder as the client's protocol would send it natively, wrapped with the
//! principal this node authenticated the client as (`Command::Carried`): the leader decides
//! it for that principal with its own access file (`dispatch::vouched_for`), serves it marked
//! `FLAG_RELAYED` so that it is carried at most once, and its answer comes back as it was
//! given. Leases, flow control, ordering, dead letters and exactly-once stay where they are
//! decided, on the source's leader: the relay holds no subscription state.
//!
//! The gRPC gateway, which gathers a topic of several sources over every source, carries a
//! source led on another node to that source's forwarder itself (`carry_to`, `stream_to`): a
//! forwarder serves a name with the one unit of the topic on its shard, so the request reaches
//! that source, where a lookup by the name would find source 0.
//!
//! A request for a source another shard of this node leads is refused with `NotOwner` as
//! before, so the client goes there itself instead of crossing a core. A stream, once carried,
//! follows its source: when the leader's node fails or the source moves, the relay finds the
//! new leader through the router and opens the stream again there, and the subscriber sees a
//! pause, not an error. Messages leased to the old stream are delivered again once their
//! leases expire; an acknowledgement that reached a quorum is kept.
//!
//! Each carried stream has a connection of its own to the leader's forwarder, so a slow
//! subscriber holds back its own stream through TCP and no other; its frames take the shard's
//! response budget (`StreamReservation`) as the shard's own streams do, and a subscriber that
//! leaves closes that connection, which ends the leader's stream and gives its leases back.
//! Publishes, pulls, acknowledgements and deadline changes share the per-node-pair connections
//! replication uses.
//!
//! The relay reaches this node's router and the other nodes' forwarders through a `Carrier`:
//! the cluster's connections (`NativeTransport`) in the daemon, a seeded simulated network in
//! the cluster simulation, which so runs the relay and the owner's `Command::Carried` as they
//! are, streams included.

use super::replica::{
    connect_peer, frame_with_body, present_secret, read_body, read_header, Duplex, NativeTransport,
    REPLICA_REQUEST_TIMEOUT,
};
use super::server::{Responder, Response};
use crate::api::{Code, Status};
use crate::auth::Principal;
use crate::dispatch::routes::{Owner, Resource, Routes};
use crate::ids::ShardId;
use crate::subscription::budget::{StreamBudget, StreamReservation};
use crate::subscription::dead_letter::LocalFuture;
use crate::sync::{Notify, Stop};
use futures_lite::io::{ReadHalf, WriteHalf};
use futures_lite::AsyncWriteExt;
use ringpost_wire::frame::{
    decode_error, FrameBuffer, FrameHeader, FLAG_ERROR, FLAG_MORE, FLAG_RELAYED, FLAG_RESPONSE,
};
use ringpost_wire::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use ringpost_wire::messages::{CarriedRequest, LookupResponse, NameRequest};
use ringpost_wire::Command;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// How long a carried stream looks for its source's new leader after losing the old one
/// before it ends with the last error: longer than an election after a node's loss.
pub const RELAY_REOPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The first and the longest wait between two attempts to open a carried stream again.
const RELAY_REOPEN_DELAY_MIN: Duration = Duration::from_millis(50);
const RELAY_REOPEN_DELAY_MAX: Duration = Duration::from_secs(1);
/// Unary pulls one shard carries at once; more wait. Each may bring back a whole pull
/// response (`PULL_RESPONSE_BYTES_MAX`), held until its reservation is taken.
pub const RELAYED_PULLS_IN_FLIGHT_MAX: usize = 8;

thread_local! {
    /// The relays of the forwarders of a cluster running on this thread, by the forwarder's
    /// shard as the catalog names it (`Forwarder::global_shard`): one in the daemon, where a
    /// shard is a thread; one per node in the cluster simulation, which runs several nodes'
    /// forwarders on one thread.
    static RELAYS: RefCell<HashMap<ShardId, Rc<Relay>>> = RefCell::default();
}

/// Makes `relay` the relay of forwarder `shard` (its global shard), in place of any before.
pub fn install(shard: ShardId, relay: Rc<Relay>) {
    RELAYS.with(|relays| relays.borrow_mut().insert(shard, relay));
}

/// The relay of forwarder `shard` (its global shard), if it is a forwarder of a cluster.
pub fn of(shard: ShardId) -> Option<Rc<Relay>> {
    RELAYS.with(|relays| relays.borrow().get(&shard).cloned())
}

/// How a relay reaches the ports of this node's router and of the other nodes' forwarders: the
/// cluster's connections (`NativeTransport`, the cluster's secret presented first) in the
/// daemon; any other network that takes a native request as the port at `address` would, as a
/// cluster peer, in a simulation.
pub trait Carrier {
    /// One request (`command`, `flags`, its native `body`) to the port at `address`, answered
    /// as that port answers a node of the cluster; the answer's body, or the status it failed
    /// with. `wait`: how long it may be held there by design (a pull's wait).
    fn send<'a>(
        &'a self,
        address: &'a str,
        command: u16,
        flags: u16,
        body: &'a [u8],
        wait: Duration,
    ) -> LocalFuture<'a, Result<FrameBuffer, Status>>;

    /// Opens a carried stream (`carried`: the body of its `Carried` request) on the forwarder at
    /// `address`, each batch taking its share of `budget` before it is read; ready once the
    /// leader took the stream (its empty first batch), or the refusal.
    fn open_stream<'a>(
        &'a self,
        budget: &'a Rc<StreamBudget>,
        address: &'a str,
        carried: &'a [u8],
    ) -> LocalFuture<'a, Result<Box<dyn CarriedStream>, Status>>;
}

/// A carried stream, as its leader sends it.
pub trait CarriedStream {
    /// The stream's next batch (its body, and its share of the shard's response budget,
    /// taken before it was read); `None` once the leader ended the stream.
    fn next(&mut self) -> LocalFuture<'_, Result<Option<(FrameBuffer, StreamReservation)>, Status>>;
}

impl Carrier for Rc<NativeTransport> {
    fn send<'a>(
        &'a self,
        address: &'a str,
        command: u16,
        flags: u16,
        body: &'a [u8],
        wait: Duration,
    ) -> LocalFuture<'a, Result<FrameBuffer, Status>> {
        Box::pin(self.carry(address, command, flags, body, wait))
    }

    fn open_stream<'a>(
        &'a self,
        budget: &'a Rc<StreamBudget>,
        address: &'a str,
        carried: &'a [u8],
    ) -> LocalFuture<'a, Result<Box<dyn CarriedStream>, Status>> {
        Box::pin(async move {
            let upstream = Upstream::open(self, budget, address, carried).await?;
            Ok(Box::new(upstream) as Box<dyn CarriedStream>)
        })
    }
}

pub struct Relay {
    transport: Rc<dyn Carrier>,
    /// This node's router, where lookups go.
    router: String,
    /// The node's one cache of who serves what, shared with the gRPC gateway and the node's
    /// other shards (`dispatch::routes`).
    routes: Arc<Routes>,
    stop: Stop,
    /// The shard's response budget, which carried pulls and streams reserve from as the
    /// shard's own do.
    budget: Rc<StreamBudget>,
    pulls_in_flight: Cell<usize>,
    pull_room: Notify,
}

impl Relay {
    pub fn new(
        transport: Rc<dyn Carrier>,
        router: String,
        routes: Arc<Routes>,
        stop: Stop,
        budget: Rc<StreamBudget>,
    ) -> Rc<Relay> {
        Rc::new(Relay {
            transport,
            router,
            routes,
            stop,
            budget,
            pulls_in_flight: Cell::new(0),
            pull_room: Notify::new(),
        })
    }

    /// Who serves `resource`: as the node's cache remembers, else as this node's router answers
    /// a lookup.
    async fn owner(&self, resource: &Resource) -> Result<Owner, Status> {
        self.routes
            .owner(resource, || async {
                let command = match resource {
                    Resource::Topic(_) => Command::LookupTopic,
                    Resource::Subscription(_) => Command::LookupSubscription,
                };
                let request = NameRequest { name: resource.name().to_owned() };
                let frame = ringpost_wire::encode_frame(command.code(), 0, 0, &request);
                let body = &frame[FRAME_HEADER_BYTES..];
                let answer =
                    self.transport.send(&self.router, command.code(), 0, body, Duration::ZERO).await?;
                let lookup: LookupResponse =
                    ringpost_wire::frame::decode_body(&answer).map_err(Status::from)?;
                Owner::first(
                    resource,
                    lookup
                        .forwarders
                        .into_iter()
                        .map(|found| (ShardId::from_global(found.shard), found.address)),
                )
            })
            .await
    }

    /// The leader's forwarder, when it is on another node. The relay is asked once a forwarder
    /// of this node refused the request as not its own (or the gateway found it led elsewhere),
    /// so an owner on this node, as remembered, may be stale: the source may have moved away
    /// with nothing on this node told. It is looked up again, once.
    async fn elsewhere(&self, resource: &Resource) -> Result<Option<Owner>, Status> {
        let mut owner = self.owner(resource).await?;
        if self.routes.is_here(&owner) {
            self.routes.forget(resource);
            owner = self.owner(resource).await?;
        }
        Ok((!self.routes.is_here(&owner)).then_some(owner))
    }

    /// Carries a native client's pull, acknowledgement or deadline change (`header`, `body`)
    /// on `subscription` to its leader on another node, for `principal`; `None` when the
    /// leader is on this node. `wait`: how long the leader may hold it by design (a pull's
    /// wait).
    pub async fn unary(
        &self,
        header: &FrameHeader,
        body: &[u8],
        subscription: &str,
        principal: &Principal,
        wait: Duration,
    ) -> Result<Option<Response>, Status> {
        let resource = Resource::Subscription(subscription.to_owned());
        let Some((answer, reservation)) =
            self.carry(&resource, principal, header.command, body, wait).await?
        else {
            return Ok(None);
        };
        let frame = frame_with_body(header.command, FLAG_RESPONSE, header.request_id, &answer);
        drop(answer);
        Ok(Some(match reservation {
            Some(reservation) => Response::Reserved(Box::new(frame.into()), reservation),
            None => frame.into(),
        }))
    }

    /// Carries a request (`command`, its native `body`) about `resource` to its leader on
    /// another node, for `principal`, and brings back the answer's body; `None` when the leader
    /// is on this node. A pull's answer comes with its share of the shard's response budget,
    /// waited for as the shard's own pulls wait, and at most `RELAYED_PULLS_IN_FLIGHT_MAX` pulls
    /// are carried at once. `wait`: how long the leader may hold it by design (a pull's wait).
    pub async fn carry(
        &self,
        resource: &Resource,
        principal: &Principal,
        command: u16,
        body: &[u8],
        wait: Duration,
    ) -> Result<Option<(FrameBuffer, Option<StreamReservation>)>, Status> {
        let Some(owner) = self.elsewhere(resource).await? else { return Ok(None) };
        match self.send_to(&owner, principal, command, body, wait).await {
            Ok(answer) => Ok(Some(answer)),
            Err(status) => {
                self.routes.forget_if_stale(resource, &status);
                Err(from_an_earlier_version(status, &owner))
            }
        }
    }

    /// Carries a request to `owner`, another node's forwarder leading one of a topic's publish
    /// sources, as `carry` carries one to a resource's owner: the far forwarder serves the
    /// topic's (or subscription's) name with the one unit of the topic it holds, so the
    /// request reaches that source and no other. The caller found the owner in the topic's
    /// sources (`LookupSources`) and forgets them when the answer says they changed.
    pub async fn carry_to(
        &self,
        owner: &Owner,
        principal: &Principal,
        command: u16,
        body: &[u8],
        wait: Duration,
    ) -> Result<(FrameBuffer, Option<StreamReservation>), Status> {
        let carried = self.send_to(owner, principal, command, body, wait).await;
        carried.map_err(|status| from_an_earlier_version(status, owner))
    }

    /// `carry`'s send to `owner`, the owner's answer as it gave it.
    async fn send_to(
        &self,
        owner: &Owner,
        principal: &Principal,
        command: u16,
        body: &[u8],
        wait: Duration,
    ) -> Result<(FrameBuffer, Option<StreamReservation>), Status> {
        let is_pull = command == Command::Pull.code();
        if is_pull {
            while self.pulls_in_flight.get() >= RELAYED_PULLS_IN_FLIGHT_MAX {
                self.pull_room.notified().await;
            }
            self.pulls_in_flight.set(self.pulls_in_flight.get() + 1);
        }
        let carried = match carried_body(principal, command, body, false) {
            Ok(carried) => carried,
            Err(status) => {
                if is_pull {
                    self.pull_done();
                }
                return Err(status);
            }
        };
        let answer =
            self.transport.send(&owner.address, Command::Carried.code(), FLAG_RELAYED, &carried, wait).await;
        drop(carried);
        let answer = match answer {
            Ok(answer) => answer,
            Err(status) => {
                if is_pull {
                    self.pull_done();
                }
                return Err(status);
            }
        };
        if !is_pull {
            return Ok((answer, None));
        }
        // The response waits for room in the shard's budget like the shard's own pulls'.
        let reservation = reserve(&self.budget, FRAME_HEADER_BYTES + answer.len()).await;
        self.pull_done();
        Ok((answer, Some(reservation)))
    }

    fn pull_done(&self) {
        self.pulls_in_flight.set(self.pulls_in_flight.get() - 1);
        self.pull_room.notify_all();
    }

    /// Carries a streaming pull (its native request's `body`) on `subscription` to its leader
    /// on another node for `principal`, and its batches back to `downstream` until either side
    /// ends it; `None` when the leader is on this node. `client_keeps_leases`: the client
    /// reconnects holding what it was sent, so the leader keeps the stream's leases to their
    /// deadlines when it ends.
    pub async fn stream<D: Downstream>(
        &self,
        subscription: &str,
        principal: &Principal,
        body: &[u8],
        client_keeps_leases: bool,
        downstream: &D,
    ) -> Result<Option<()>, Status> {
        let resource = Resource::Subscription(subscription.to_owned());
        let Some(owner) = self.elsewhere(&resource).await? else { return Ok(None) };
        let carried = carried_body(principal, Command::StreamingPull.code(), body, client_keeps_leases)?;
        let mut upstream = match self.transport.open_stream(&self.budget, &owner.address, &carried).await {
            Ok(upstream) => upstream,
            Err(status) => {
                self.routes.forget_if_stale(&resource, &status);
                return Err(from_an_earlier_version(status, &owner));
            }
        };
        // The client hears its stream is taken once the leader has taken it.
        if !downstream.accepted().await {
            return Ok(Some(()));
        }
        loop {
            match self.pump(&mut upstream, downstream).await {
                Pumped::Left | Pumped::Ended => return Ok(Some(())),
                Pumped::Failed(status) if matches!(status.code, Code::NotOwner | Code::Unavailable) => {
                    // The leader failed, lost its lead or the source moved: find the new one.
                    self.routes.forget(&resource);
                    match self.reopen(&resource, &carried, downstream, status).await? {
                        Some(reopened) => upstream = reopened,
                        None => return Ok(Some(())),
                    }
                }
                Pumped::Failed(status) => return Err(status),
            }
        }
    }

    /// Carries a streaming pull (its native request's `body`) to `owner`, another node's
    /// forwarder leading one of the subscription's publish sources, for `principal`, and its
    /// batches back to `downstream` until either side ends it: `stream` for one source of a
    /// stream the gRPC gateway gathers over every source. It is not opened again elsewhere:
    /// the gateway's other sources' streams share the client's, so a failure here, or the
    /// leader's end of it, ends the client's stream with the error (`UNAVAILABLE` for a leader
    /// gone or moved), and the client opens it again, over the sources as they are then. The
    /// subscriber's leaving drops the connection, which gives the source's leases back.
    pub async fn stream_to<D: Downstream>(
        &self,
        owner: &Owner,
        principal: &Principal,
        body: &[u8],
        client_keeps_leases: bool,
        downstream: &D,
    ) -> Result<(), Status> {
        let carried = carried_body(principal, Command::StreamingPull.code(), body, client_keeps_leases)?;
        let opened = self.transport.open_stream(&self.budget, &owner.address, &carried).await;
        let mut upstream = opened.map_err(|status| from_an_earlier_version(status, owner))?;
        drop(carried);
        if !downstream.accepted().await {
            return Ok(());
        }
        match self.pump(&mut upstream, downstream).await {
            Pumped::Left => Ok(()),
            Pumped::Ended => Err(Status::unavailable(format!(
                "node {} ended the stream of one of the subscription's sources; open the stream again",
                owner.node()
            ))),
            Pumped::Failed(status) if status.code == Code::NotOwner => Err(Status::unavailable(format!(
                "one of the subscription's sources moved ({}); open the stream again",
                status.message
            ))),
            Pumped::Failed(status) => Err(status),
        }
    }

    /// Passes `upstream`'s batches to `downstream` until one side ends.
    async fn pump<D: Downstream>(&self, upstream: &mut Box<dyn CarriedStream>, downstream: &D) -> Pumped {
        loop {
            let next = futures_lite::future::or(async { Some(upstream.next().await) }, async {
                futures_lite::future::or(downstream.gone(), self.stop.given()).await;
                None
            })
            .await;
            match next {
                // The subscriber left or the shard stops: dropping the connection ends the
                // leader's stream, which gives its leases back.
                None => return Pumped::Left,
                Some(Ok(Some((batch, reservation)))) => {
                    if !downstream.send(batch, reservation).await {
                        return Pumped::Left;
                    }
                }
                // The leader ended it (it stops).
                Some(Ok(None)) => return Pumped::Ended,
                Some(Err(status)) => return Pumped::Failed(status),
            }
        }
    }

    /// Opens a carried stream again wherever its source is led now (this node included: the
    /// subscriber stays where it is), trying until `RELAY_REOPEN_TIMEOUT`; `None` when the
    /// subscriber left or the shard stops first.
    async fn reopen<D: Downstream>(
        &self,
        resource: &Resource,
        carried: &[u8],
        downstream: &D,
        mut last: Status,
    ) -> Result<Option<Box<dyn CarriedStream>>, Status> {
        let started = crate::runtime::now();
        let mut delay = RELAY_REOPEN_DELAY_MIN;
        loop {
            if downstream.is_gone() || self.stop.is_given() {
                return Ok(None);
            }
            if crate::runtime::now() - started >= RELAY_REOPEN_TIMEOUT {
                return Err(Status::new(
                    last.code,
                    format!(
                        "the subscription's source was not found again within RELAY_REOPEN_TIMEOUT: {}",
                        last.message
                    ),
                ));
            }
            let waited = futures_lite::future::or(
                async {
                    crate::runtime::sleep(delay).await;
                    true
                },
                async {
                    futures_lite::future::or(downstream.gone(), self.stop.given()).await;
                    false
                },
            )
            .await;
            if !waited {
                return Ok(None);
            }
            delay = (delay * 2).min(RELAY_REOPEN_DELAY_MAX);
            let owner = match self.owner(resource).await {
                Ok(owner) => owner,
                Err(status) => {
                    last = status;
                    continue;
                }
            };
            let opened = self.transport.open_stream(&self.budget, &owner.address, carried).await;
            match opened.map_err(|status| from_an_earlier_version(status, &owner)) {
                Ok(upstream) => return Ok(Some(upstream)),
                Err(status) if matches!(status.code, Code::NotOwner | Code::Unavailable) => {
                    self.routes.forget(resource);
                    last = status;
                }
                Err(status) => return Err(status),
            }
        }
    }
}

/// How a carried stream's passing of batches ended (`Relay::pump`).
enum Pumped {
    /// The subscriber left, or the shard stops.
    Left,
    /// The leader ended the stream.
    Ended,
    /// The stream failed, with this status.
    Failed(Status),
}

/// A node of an earlier version, which does not know `Command::Carried`, answers it as an
/// unknown command: `Unimplemented`, which Google's clients do not retry. While a cluster is
/// upgraded one node at a time, the call works again once that node runs this version or the
/// resource's lead moves, so it is said as `Unavailable` (retried), naming the node.
fn from_an_earlier_version(status: Status, owner: &Owner) -> Status {
    if status.code != Code::Unimplemented {
        return status;
    }
    Status::unavailable(format!(
        "node {} could not take a call carried from another node ({}): it runs an earlier version \
         of ringpostd; retry, or send the call to node {}",
        owner.node(),
        status.message,
        owner.node()
    ))
}

/// Where a carried stream's batches go: a native client's connection (`NativeDownstream`), or a
/// gRPC stream's responses. Its futures stay on the shard that runs the stream, so they need
/// not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Downstream {
    /// Tells the subscriber its stream is taken; false once it is gone.
    async fn accepted(&self) -> bool;
    /// One batch, the body of a `PullResponse` frame, with its share of the shard's response
    /// budget; false once the subscriber is gone.
    async fn send(&self, batch: FrameBuffer, reservation: StreamReservation) -> bool;
    fn is_gone(&self) -> bool;
    /// Resolves once the subscriber is gone.
    async fn gone(&self);
}

/// A native client's stream: each batch is a frame of its request, flagged `FLAG_MORE`.
pub struct NativeDownstream<'a> {
    pub header: &'a FrameHeader,
    pub responder: &'a Responder,
}

impl Downstream for NativeDownstream<'_> {
    async fn accepted(&self) -> bool {
        self.responder.send_more(crate::protocol::native::forwarder::stream_accepted(self.header), None).await
    }

    async fn send(&self, batch: FrameBuffer, reservation: StreamReservation) -> bool {
        let header = self.header;
        let frame = frame_with_body(header.command, FLAG_RESPONSE | FLAG_MORE, header.request_id, &batch);
        drop(batch);
        self.responder.send_more(frame, Some(reservation)).await
    }

    fn is_gone(&self) -> bool {
        self.responder.is_gone()
    }

    async fn gone(&self) {
        self.responder.gone().await
    }
}

/// The body of a `Carried` request: `command`'s native `body`, for `principal`. One too large
/// for a frame is refused here: the leader's port would close the connection it arrived on,
/// which other requests share.
fn carried_body(
    principal: &Principal,
    command: u16,
    body: &[u8],
    client_keeps_leases: bool,
) -> Result<FrameBuffer, Status> {
    let principal = match principal {
        Principal::Anonymous => None,
        Principal::Named(name) => Some(name.to_string()),
    };
    let request = CarriedRequest { principal, command, body: body.to_vec(), client_keeps_leases };
    let frame =
        ringpost_wire::frame::try_encode_frame(Command::Carried.code(), 0, 0, &request).map_err(|_| {
            Status::invalid_argument(format!(
            "the request is too large to carry to the node that serves it: over {FRAME_BODY_BYTES_MAX} bytes \
             (FRAME_BODY_BYTES_MAX) with what is carried beside it"
        ))
        })?;
    let mut carried = FrameBuffer::with_capacity(frame.len() - FRAME_HEADER_BYTES);
    carried.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    Ok(carried)
}

/// Waits until the shard's response budget takes `bytes` (at once when nothing else holds it).
pub(crate) async fn reserve(budget: &Rc<StreamBudget>, bytes: usize) -> StreamReservation {
    loop {
        let freed = budget.freed();
        if let Some(reservation) = budget.try_reserve(bytes) {
            return reservation;
        }
        freed.await;
    }
}

/// A carried stream's connection to the source leader's forwarder.
struct Upstream {
    reader: ReadHalf<Box<dyn Duplex>>,
    /// Kept so that the connection stays whole until the stream ends.
    _writer: WriteHalf<Box<dyn Duplex>>,
    /// The shard's response budget, which each batch reserves before it is read.
    budget: Rc<StreamBudget>,
}

/// The carried stream's request id: the connection carries nothing else.
const UPSTREAM_REQUEST_ID: u64 = 2;

impl Upstream {
    /// Connects, presents the cluster's secret, asks for the stream (`carried`: the body of
    /// its `Carried` request) and waits for the leader to take it (its empty first batch) or
    /// refuse it.
    async fn open(
        transport: &NativeTransport,
        budget: &Rc<StreamBudget>,
        address: &str,
        carried: &[u8],
    ) -> Result<Upstream, Status> {
        let unavailable = |why: String| Status::unavailable(format!("carrying a stream to {address}: {why}"));
        let stream = connect_peer(address, transport.tls()).await.map_err(unavailable)?;
        let (reader, mut writer) = futures_lite::io::split(stream);
        present_secret(&mut writer, transport.secret()).await.map_err(unavailable)?;
        let request = frame_with_body(Command::Carried.code(), FLAG_RELAYED, UPSTREAM_REQUEST_ID, carried);
        writer.write_all(&request).await.map_err(|error| unavailable(error.to_string()))?;
        writer.flush().await.map_err(|error| unavailable(error.to_string()))?;
        let mut upstream = Upstream { reader, _writer: writer, budget: budget.clone() };
        let accepted = futures_lite::future::or(upstream.next_batch(), async {
            crate::runtime::sleep(REPLICA_REQUEST_TIMEOUT).await;
            Err(Status::unavailable(format!(
                "{address} did not take a carried stream within REPLICA_REQUEST_TIMEOUT"
            )))
        })
        .await?;
        match accepted {
            Some(_) => Ok(upstream),
            None => Err(unavailable("the stream ended as it opened".to_owned())),
        }
    }

    /// `CarriedStream::next`.
    async fn next_batch(&mut self) -> Result<Option<(FrameBuffer, StreamReservation)>, Status> {
        loop {
            let unavailable = |why: String| Status::unavailable(format!("a carried stream's leader: {why}"));
            let header = read_header(&mut self.reader).await.map_err(unavailable)?;
            if header.request_id != UPSTREAM_REQUEST_ID {
                // The answer to the secret (refused: an error that is followed by the close).
                let body = read_body(&mut self.reader, &header).await.map_err(unavailable)?;
                if header.flags & FLAG_ERROR != 0 {
                    return Err(Status::new(
                        Code::Unauthenticated,
                        format!("the cluster's secret was refused: {}", decode_error(&body).message),
                    ));
                }
                continue;
            }
            let reservation = reserve(&self.budget, header.body_length as usize).await;
            let body = read_body(&mut self.reader, &header).await.map_err(unavailable)?;
            if header.flags & FLAG_ERROR != 0 {
                return Err(Status::from(decode_error(&body)));
            }
            if header.flags & FLAG_MORE == 0 {
                return Ok(None);
            }
            return Ok(Some((body, reservation)));
        }
    }
}

impl CarriedStream for Upstream {
    fn next(&mut self) -> LocalFuture<'_, Result<Option<(FrameBuffer, StreamReservation)>, Status>> {
        Box::pin(self.next_batch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;
    use crate::net::server::{fail, respond, serve, ConnectionLimits, Handler, Security};
    use glommio::net::TcpListener;
    use ringpost_wire::messages::{PublishResponse, ShardAddress};
    use ringpost_wire::ErrorCode;

    /// This node's router and another node's forwarder in one: a lookup names node 2's
    /// forwarder 0 at `owner` (counted), and a carried request is answered with message id 7.
    struct RouterAndOwner {
        owner: RefCell<String>,
        lookups: Cell<usize>,
        /// Answers `Carried` as a node of an earlier version does: a command it does not know.
        earlier: Cell<bool>,
    }

    impl Handler for RouterAndOwner {
        async fn handle(&self, header: FrameHeader, _body: FrameBuffer, _responder: &Responder) -> Response {
            if header.command == Command::Carried.code() && self.earlier.get() {
                let unknown = format!("unknown command {}", header.command);
                return fail(&header, &ringpost_wire::Status::new(ErrorCode::Unimplemented, unknown)).into();
            }
            if header.command == Command::Carried.code() {
                return respond(&header, &PublishResponse { message_ids: vec![7] }).into();
            }
            assert_eq!(header.command, Command::LookupTopic.code());
            self.lookups.set(self.lookups.get() + 1);
            let owner = ShardAddress {
                shard: crate::catalog::entry::global_shard(2, 0),
                address: self.owner.borrow().clone(),
            };
            respond(&header, &LookupResponse { forwarders: vec![owner] }).into()
        }
    }

    /// The relay reads and fills the node's route cache: an owner on this node, remembered
    /// before the source moved to node 2, is looked up again rather than answered "here"
    /// (the relay is asked only once this node refused the request); what it learns is the
    /// node's (the gateway reads it), used without another lookup; and an owner it cannot
    /// reach is forgotten.
    #[test]
    fn the_relay_finds_an_owner_that_moved_away_and_forgets_one_it_cannot_reach() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let handler = Rc::new(RouterAndOwner {
                owner: RefCell::new(address.clone()),
                lookups: Cell::new(0),
                earlier: Cell::new(false),
            });
            let stop = Stop::default();
            let security = Security::open(&crate::auth::AccessSettings::off(), None).unwrap();
            let serving = crate::runtime::spawn(serve(
                listener,
                handler.clone(),
                stop.clone(),
                ConnectionLimits::default(),
                security,
            ));
            let routes = Arc::new(Routes::new(NodeId::new(1)));
            let topic = Resource::Topic("orders".into());
            let here = Owner { shard: ShardId::new(NodeId::new(1), 0), address: "127.0.0.1:9".into() };
            routes.owner(&topic, || async { Ok(here.clone()) }).await.unwrap();
            let relay = Relay::new(
                Rc::new(NativeTransport::new(None, None)),
                address.clone(),
                routes.clone(),
                stop.clone(),
                StreamBudget::new(),
            );
            let publish =
                || relay.carry(&topic, &Principal::Anonymous, Command::Publish.code(), b"", Duration::ZERO);
            let (answer, _) = publish().await.unwrap().expect("carried to node 2");
            let answer = ringpost_wire::decode_body::<PublishResponse>(&answer).unwrap();
            assert_eq!(answer.message_ids, vec![7]);
            assert_eq!(handler.lookups.get(), 1);
            let learnt = routes.cached(&topic).expect("the node remembers the owner");
            assert_eq!(
                (learnt.node(), learnt.shard.local(), learnt.address.as_str()),
                (NodeId::new(2), 0, address.as_str())
            );
            publish().await.unwrap().expect("carried again");
            assert_eq!(handler.lookups.get(), 1, "a remembered owner on another node is not looked up again");
            // An owner of an earlier version does not know the command: said as retryable.
            handler.earlier.set(true);
            let Err(earlier) = publish().await else { panic!("an earlier version took Carried") };
            assert_eq!(earlier.code, Code::Unavailable, "{earlier}");
            assert!(
                earlier.message.contains("node 2") && earlier.message.contains("earlier version"),
                "{earlier}"
            );
            assert!(earlier.message.contains("unknown command 81"), "{earlier}");
            handler.earlier.set(false);
            // The owner's node stops answering: the failed connection forgets it.
            let unreachable = Owner { shard: ShardId::new(NodeId::new(2), 0), address: "127.0.0.1:9".into() };
            routes.forget(&topic);
            routes.owner(&topic, || async { Ok(unreachable) }).await.unwrap();
            let Err(failed) = publish().await else { panic!("carried to an owner nobody serves") };
            assert_eq!(failed.code, Code::Unavailable, "{failed}");
            assert!(routes.cached(&topic).is_none(), "a failed connection forgets the owner");
            stop.give();
            serving.await;
        });
    }

    #[test]
    fn a_carried_request_names_its_principal_and_one_too_large_for_a_frame_is_refused_before_it_is_sent() {
        let carried =
            carried_body(&Principal::Named("alice".into()), Command::Pull.code(), b"the pull", false)
                .unwrap();
        let request = ringpost_wire::decode_body::<CarriedRequest>(&carried).unwrap();
        assert_eq!(request.principal.as_deref(), Some("alice"));
        assert_eq!((request.command, &request.body[..]), (Command::Pull.code(), &b"the pull"[..]));
        let anonymous = carried_body(&Principal::Anonymous, Command::Pull.code(), b"", true).unwrap();
        let request = ringpost_wire::decode_body::<CarriedRequest>(&anonymous).unwrap();
        assert_eq!((request.principal, request.client_keeps_leases), (None, true));
        let large = vec![0u8; FRAME_BODY_BYTES_MAX];
        let refused =
            carried_body(&Principal::Anonymous, Command::Publish.code(), &large, false).unwrap_err();
        assert_eq!(refused.code, Code::InvalidArgument);
        assert!(refused.message.contains("FRAME_BODY_BYTES_MAX"), "{refused}");
    }
}
