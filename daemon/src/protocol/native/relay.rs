//! A subscribe forwarder: a forwarder of a cluster serves a subscriber whose subscription's
//! source another node leads by carrying its requests there. A stream, a pull, an
//! acknowledgement or a deadline change that the data plane answers with `NotOwner` is looked
//! up through this node's router; when the source's leader is on another node, the request
//! goes to that leader's forwarder as it came (its body unchanged, marked `FLAG_RELAYED` so
//! that it is carried at most once), and the answer comes back as it was given. Leases, flow
//! control, ordering, dead letters and exactly-once stay where they are decided, on the
//! source's leader: the relay holds no subscription state.
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
//! response budget (`StreamReservation`) as the shard's own streams do. Pulls,
//! acknowledgements and deadline changes share the per-node-pair connections replication uses.

use super::replica::{
    connect_peer, frame_with_body, present_secret, read_body, read_header, Duplex, NativeTransport,
    REPLICA_REQUEST_TIMEOUT,
};
use super::server::{Responder, Response};
use crate::api::{Code, Status};
use crate::catalog::entry::node_and_shard;
use crate::subscription::budget::{StreamBudget, StreamReservation};
use crate::sync::{Notify, Stop};
use futures_lite::io::{ReadHalf, WriteHalf};
use futures_lite::AsyncWriteExt;
use ringpost_wire::frame::{
    decode_error, FrameBuffer, FrameHeader, FLAG_ERROR, FLAG_MORE, FLAG_RELAYED, FLAG_RESPONSE,
};
use ringpost_wire::messages::{LookupResponse, NameRequest, PullResponse};
use ringpost_wire::Command;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// Subscriptions whose leader a shard remembers; past it the remembered are forgotten at once
/// (each costs one lookup to learn again).
pub const RELAY_ROUTES_MAX: usize = 4096;
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
    /// This shard's relay, when it is a forwarder of a cluster: one per thread, as a shard is.
    static RELAY: RefCell<Option<Rc<Relay>>> = const { RefCell::new(None) };
}

/// Makes `relay` this shard's.
pub fn install(relay: Rc<Relay>) {
    RELAY.with(|current| *current.borrow_mut() = Some(relay));
}

/// This shard's relay, if it has one.
pub fn current() -> Option<Rc<Relay>> {
    RELAY.with(|current| current.borrow().clone())
}

/// Where a subscription's source is led, as this node's router said.
#[derive(Clone)]
struct Route {
    address: String,
    node: u64,
}

pub struct Relay {
    transport: Rc<NativeTransport>,
    /// This node's router, where lookups go.
    router: String,
    node_id: u64,
    stop: Stop,
    /// The shard's response budget, which carried pulls and streams reserve from as the
    /// shard's own do.
    budget: Rc<StreamBudget>,
    routes: RefCell<HashMap<String, Route>>,
    pulls_in_flight: Cell<usize>,
    pull_room: Notify,
}

impl Relay {
    pub fn new(
        transport: Rc<NativeTransport>,
        router: String,
        node_id: u64,
        stop: Stop,
        budget: Rc<StreamBudget>,
    ) -> Rc<Relay> {
        Rc::new(Relay {
            transport,
            router,
            node_id,
            stop,
            budget,
            routes: RefCell::default(),
            pulls_in_flight: Cell::new(0),
            pull_room: Notify::new(),
        })
    }

    async fn route(&self, subscription: &str) -> Result<Route, Status> {
        if let Some(route) = self.routes.borrow().get(subscription) {
            return Ok(route.clone());
        }
        let lookup: LookupResponse = self
            .transport
            .request(
                &self.router,
                Command::LookupSubscription,
                &NameRequest { name: subscription.to_owned() },
            )
            .await?;
        let first = lookup.forwarders.into_iter().next().ok_or_else(|| {
            Status::unavailable(format!("no forwarder serves subscription '{subscription}'"))
        })?;
        let route = Route { address: first.address, node: node_and_shard(first.shard).0 };
        let mut routes = self.routes.borrow_mut();
        if routes.len() >= RELAY_ROUTES_MAX {
            routes.clear();
        }
        routes.insert(subscription.to_owned(), route.clone());
        Ok(route)
    }

    fn forget(&self, subscription: &str) {
        self.routes.borrow_mut().remove(subscription);
    }

    /// The leader's forwarder, when it is on another node.
    async fn elsewhere(&self, subscription: &str) -> Result<Option<Route>, Status> {
        let route = self.route(subscription).await?;
        Ok((route.node != self.node_id).then_some(route))
    }

    /// Carries a pull, an acknowledgement or a deadline change (`header`, `body`) on
    /// `subscription` to its leader on another node; `None` when the leader is on this node.
    /// `wait`: how long the leader may hold it by design (a pull's wait).
    pub async fn unary(
        &self,
        header: &FrameHeader,
        body: &[u8],
        subscription: &str,
        wait: Duration,
    ) -> Result<Option<Response>, Status> {
        let Some(route) = self.elsewhere(subscription).await? else { return Ok(None) };
        let is_pull = header.command == Command::Pull.code();
        if is_pull {
            while self.pulls_in_flight.get() >= RELAYED_PULLS_IN_FLIGHT_MAX {
                self.pull_room.notified().await;
            }
            self.pulls_in_flight.set(self.pulls_in_flight.get() + 1);
        }
        let answer = self.transport.carry(&route.address, header.command, FLAG_RELAYED, body, wait).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(status) => {
                if is_pull {
                    self.pull_done();
                }
                if matches!(status.code, Code::NotOwner | Code::Unavailable | Code::DeadlineExceeded) {
                    self.forget(subscription);
                }
                return Err(status);
            }
        };
        let frame = frame_with_body(header.command, FLAG_RESPONSE, header.request_id, &answer);
        drop(answer);
        if !is_pull {
            return Ok(Some(frame.into()));
        }
        // The response waits for room in the shard's budget like the shard's own pulls'.
        let reservation = reserve(&self.budget, frame.len()).await;
        self.pull_done();
        Ok(Some(Response::Reserved(Box::new(frame.into()), reservation)))
    }

    fn pull_done(&self) {
        self.pulls_in_flight.set(self.pulls_in_flight.get() - 1);
        self.pull_room.notify_all();
    }

    /// Carries a streaming pull (`header`, `body`) on `subscription` to its leader on another
    /// node, and its frames back to `responder` until either side ends it; `None` when the
    /// leader is on this node.
    pub async fn stream(
        &self,
        header: &FrameHeader,
        body: &[u8],
        subscription: &str,
        responder: &Responder,
    ) -> Result<Option<Response>, Status> {
        let Some(route) = self.elsewhere(subscription).await? else { return Ok(None) };
        let mut upstream = match Upstream::open(&self.transport, &self.budget, &route.address, body).await {
            Ok(upstream) => upstream,
            Err(status) => {
                self.forget(subscription);
                return Err(status);
            }
        };
        let end = || Ok(Some(super::server::respond(header, &PullResponse::default()).into()));
        // The client hears its stream is taken once the leader has taken it.
        if !responder.send_more(super::forwarder::stream_accepted(header), None).await {
            return end();
        }
        loop {
            let next = futures_lite::future::or(async { Some(upstream.next().await) }, async {
                futures_lite::future::or(responder.gone(), self.stop.given()).await;
                None
            })
            .await;
            match next {
                // The subscriber left or the shard stops: dropping the connection ends the
                // leader's stream, which gives its leases back.
                None => return end(),
                Some(Ok(Some((frame, reservation)))) => {
                    let frame =
                        frame_with_body(header.command, FLAG_RESPONSE | FLAG_MORE, header.request_id, &frame);
                    if !responder.send_more(frame, Some(reservation)).await {
                        return end();
                    }
                }
                // The leader ended it (it stops): so does the subscriber's.
                Some(Ok(None)) => return end(),
                Some(Err(status)) if matches!(status.code, Code::NotOwner | Code::Unavailable) => {
                    // The leader failed, lost its lead or the source moved: find the new one.
                    self.forget(subscription);
                    match self.reopen(subscription, body, responder, status).await? {
                        Some(reopened) => upstream = reopened,
                        None => return end(),
                    }
                }
                Some(Err(status)) => return Err(status),
            }
        }
    }

    /// Opens a carried stream again wherever its source is led now (this node included: the
    /// subscriber stays where it is), trying until `RELAY_REOPEN_TIMEOUT`; `None` when the
    /// subscriber left or the shard stops first.
    async fn reopen(
        &self,
        subscription: &str,
        body: &[u8],
        responder: &Responder,
        mut last: Status,
    ) -> Result<Option<Upstream>, Status> {
        let started = crate::runtime::now();
        let mut delay = RELAY_REOPEN_DELAY_MIN;
        loop {
            if responder.is_gone() || self.stop.is_given() {
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
                    futures_lite::future::or(responder.gone(), self.stop.given()).await;
                    false
                },
            )
            .await;
            if !waited {
                return Ok(None);
            }
            delay = (delay * 2).min(RELAY_REOPEN_DELAY_MAX);
            let route = match self.route(subscription).await {
                Ok(route) => route,
                Err(status) => {
                    last = status;
                    continue;
                }
            };
            match Upstream::open(&self.transport, &self.budget, &route.address, body).await {
                Ok(upstream) => return Ok(Some(upstream)),
                Err(status) if matches!(status.code, Code::NotOwner | Code::Unavailable) => {
                    self.forget(subscription);
                    last = status;
                }
                Err(status) => return Err(status),
            }
        }
    }
}

/// Waits until the shard's response budget takes `bytes` (at once when nothing else holds it).
async fn reserve(budget: &Rc<StreamBudget>, bytes: usize) -> StreamReservation {
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
    /// Connects, presents the cluster's secret, asks for the stream and waits for the leader
    /// to take it (its empty first batch) or refuse it.
    async fn open(
        transport: &NativeTransport,
        budget: &Rc<StreamBudget>,
        address: &str,
        body: &[u8],
    ) -> Result<Upstream, Status> {
        let unavailable = |why: String| Status::unavailable(format!("carrying a stream to {address}: {why}"));
        let stream = connect_peer(address, transport.tls()).await.map_err(unavailable)?;
        let (reader, mut writer) = futures_lite::io::split(stream);
        present_secret(&mut writer, transport.secret()).await.map_err(unavailable)?;
        let request = frame_with_body(Command::StreamingPull.code(), FLAG_RELAYED, UPSTREAM_REQUEST_ID, body);
        writer.write_all(&request).await.map_err(|error| unavailable(error.to_string()))?;
        writer.flush().await.map_err(|error| unavailable(error.to_string()))?;
        let mut upstream = Upstream { reader, _writer: writer, budget: budget.clone() };
        let accepted = futures_lite::future::or(upstream.next(), async {
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

    /// The stream's next batch (its body, and its share of the shard's response budget,
    /// taken before it was read); `None` once the leader ended the stream.
    async fn next(&mut self) -> Result<Option<(FrameBuffer, StreamReservation)>, Status> {
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
