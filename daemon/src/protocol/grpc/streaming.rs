//! StreamingPull: one job on the subscription's forwarder shard for as long as the stream is
//! open, which takes deliveries from the data plane's stream and sends them, copied into prost
//! messages, into a bounded channel whose other end is the response stream tonic writes; and a
//! task on tokio that reads the client's requests (acknowledgements, deadline changes,
//! heartbeats) and runs each acknowledgement or deadline change as a job of its own.
//!
//! The stream ends when the client goes (tonic drops the response stream, which closes the
//! channel: the shard's stream sees its peer gone and gives its outstanding messages back at
//! once), when the client closes its side, with `UNAVAILABLE` when the daemon stops (so the
//! client libraries reconnect), with `UNAUTHENTICATED` once the token it opened with is revoked
//! or expires (checked each `SECURITY_CHECK_INTERVAL`, as the native protocol checks its
//! connections), and with the data plane's error otherwise (`NOT_FOUND` once the subscription
//! is deleted).

use super::bridge::ShardCaller;
use super::credentials::Presented;
use super::decode_errors::refusal_of_bad_request;
use super::delivery::{
    ack_outcome, checked_call, deadline_seconds, properties_on, received_messages, Properties,
};
use super::gateway::{is_stale_route, ForwarderShard, Gateway, Gathered, Place, Resource, Serving};
use super::names;
use crate::api::data::{DataPlane, Delivery, DeliveryStream, InvalidAckId, StreamPeer, StreamSettings};
use crate::api::limits::{ACK_DEADLINE_SECONDS_MAX, ACK_DEADLINE_SECONDS_MIN, ACK_ID_BYTES_MAX};
use crate::auth::{Access, Credential, Session};
use crate::dispatch::Kind;
use crate::net::server::SECURITY_CHECK_INTERVAL;
use crate::subscription::budget::StreamReservation;
use futures_lite::future::or;
use prost::Message;
use ringpost_proto::pubsub;
use ringpost_proto::pubsub::streaming_pull_response::{
    AcknowledgeConfirmation, ModifyAckDeadlineConfirmation,
};
use ringpost_wire::frame::{decode_body, FrameBuffer};
use ringpost_wire::messages::{PullResponse as NativePullResponse, StreamingPullRequest};
use ringpost_wire::Command as WireCommand;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Response, Status, Streaming};

/// The largest response a stream sends: gRPC's default limit on a received message (4 MiB),
/// which clients keep unless told otherwise. A delivery larger than this is split across
/// responses; a single larger message goes alone.
pub const GRPC_STREAM_RESPONSE_BYTES_MAX: usize = 4 << 20;

/// Responses a stream has waiting for tonic to write them. Small: each holds up to
/// `GRPC_STREAM_RESPONSE_BYTES_MAX`, and a full channel is what stops the shard from leasing
/// more for a client that does not read.
pub const GRPC_STREAM_RESPONSES_QUEUED_MAX: usize = 2;

/// Room kept in each response for its `subscription_properties` (two booleans with their
/// tags and the field's own tag and length).
const PROPERTIES_BYTES_MAX: usize = 8;

/// What a StreamingPull answers: responses until the stream ends.
pub type ResponseStream =
    Pin<Box<dyn futures_lite::Stream<Item = Result<pubsub::StreamingPullResponse, Status>> + Send + 'static>>;

type Responses = mpsc::Sender<Result<pubsub::StreamingPullResponse, Status>>;

/// What the first request asks for, checked.
struct Opening {
    name: String,
    settings: StreamSettings,
    /// The same, as a native request, for a node that serves the subscription elsewhere.
    native: StreamingPullRequest,
}

impl Opening {
    fn of(first: &pubsub::StreamingPullRequest) -> Result<Opening, Status> {
        if first.subscription.is_empty() {
            return Err(Status::invalid_argument("the first request of a stream must name its subscription"));
        }
        let name = names::parse("subscription", names::Kind::Subscription, &first.subscription)?.name;
        let seconds = first.stream_ack_deadline_seconds;
        let deadline_range = ACK_DEADLINE_SECONDS_MIN as i32..=ACK_DEADLINE_SECONDS_MAX as i32;
        if !deadline_range.contains(&seconds) {
            return Err(Status::invalid_argument(format!(
                "stream_ack_deadline_seconds is {seconds}; it must be {ACK_DEADLINE_SECONDS_MIN} to \
                 {ACK_DEADLINE_SECONDS_MAX}"
            )));
        }
        // At or below zero: no limit, as Pub/Sub reads it.
        let limit = |value: i64| value.max(0) as u64;
        let mut settings = StreamSettings::new(
            seconds as u32,
            limit(first.max_outstanding_messages),
            limit(first.max_outstanding_bytes),
        )?;
        // A client that names itself reconnects when its stream breaks and keeps the messages
        // it holds (Google's clients do, and extend and acknowledge them by ack id): those
        // leases run to their deadlines rather than each being delivered again at once.
        settings.leases_outlive_stream = !first.client_id.is_empty();
        let native = StreamingPullRequest {
            subscription: name.clone(),
            stream_ack_deadline_seconds: seconds as u32,
            max_outstanding_messages: limit(first.max_outstanding_messages),
            max_outstanding_bytes: limit(first.max_outstanding_bytes),
        };
        Ok(Opening { name, settings, native })
    }
}

pub async fn streaming_pull(
    gateway: &Arc<Gateway>,
    request: Request<Streaming<pubsub::StreamingPullRequest>>,
    stopping: watch::Receiver<bool>,
) -> Result<Response<ResponseStream>, Status> {
    let presented = Presented::of(&request);
    let mut requests = request.into_inner();
    let first = requests
        .message()
        .await
        .map_err(refusal_of_bad_request)?
        .ok_or_else(|| Status::invalid_argument("the stream ended before its first request"))?;
    let opening = Opening::of(&first)?;
    check_deadline_changes(&first)?;
    let (responses, received) = mpsc::channel(GRPC_STREAM_RESPONSES_QUEUED_MAX);
    let (refusal, refused) = oneshot::channel();
    let resource = Resource::Subscription(opening.name.clone());
    let gathered = gateway.gathered(&presented, &resource, Kind::StreamingPull).await?;
    let (caller, properties, carried) = match &gathered {
        Some(sources) => open_gathered(gateway, &presented, &opening, sources, &responses, refusal).await?,
        None => open(gateway, &presented, &opening, &responses, refusal).await?,
    };
    let gathered = gathered.map(|sources| (gateway.clone(), sources));
    let (client_done, client_gone) = oneshot::channel();
    let reader =
        RequestReader { caller, carried, gathered, presented, name: opening.name, properties, responses };
    tokio::spawn(reader.run(first, requests, client_done));
    Ok(Response::new(response_stream(received, stopping, client_gone, refused)))
}

/// Starts the stream's job on the subscription's shard, or, when another node serves the
/// subscription, on the shard that carries it there (`remote`); once the stream is open, that
/// shard's caller, the subscription's properties, and whether it is carried. A stale route is
/// forgotten and tried once more. The job sends on `refusal` why the stream's credential no
/// longer holds, if it stops holding.
async fn open(
    gateway: &Gateway,
    presented: &Presented,
    opening: &Opening,
    responses: &Responses,
    refusal: oneshot::Sender<Status>,
) -> Result<(ShardCaller<ForwarderShard>, Properties, bool), Status> {
    let mut retried = false;
    // Shared by the attempts: only the one whose stream opens keeps it.
    let refusal = std::sync::Arc::new(std::sync::Mutex::new(Some(refusal)));
    let resource = Resource::Subscription(opening.name.clone());
    loop {
        let serving = gateway.subscription_forwarder(presented, &opening.name, Kind::StreamingPull).await?;
        let (opened, answer) = oneshot::channel();
        let (presented, name, settings, responses) =
            (presented.clone(), opening.name.clone(), opening.settings, responses.clone());
        let ends = Ends { opened, refusal: refusal.clone() };
        let (caller, carried) = match serving {
            Serving::Here(caller) => {
                let running = caller.clone();
                // The job lives as long as the stream; its result is only that it ended.
                tokio::spawn(async move {
                    let _ = running
                        .call(move |shard| serve_stream(shard, presented, name, settings, responses, ends))
                        .await;
                });
                (caller.clone(), false)
            }
            Serving::Elsewhere(caller) => {
                let properties = super::remote::properties(gateway, &opening.name).await?;
                let body = super::remote::native_body(WireCommand::StreamingPull, &opening.native)?;
                let running = caller.clone();
                tokio::spawn(async move {
                    let _ = running
                        .call(move |shard| {
                            let request = (body, settings.leases_outlive_stream);
                            let to = CarriedTo::Subscription(name);
                            serve_carried_stream(shard, presented, to, request, properties, responses, ends)
                        })
                        .await;
                });
                (caller.clone(), true)
            }
        };
        match answer.await {
            Ok(Ok(properties)) => return Ok((caller, properties, carried)),
            Ok(Err(status)) => {
                gateway.forget_if_stale(&resource, &status);
                if !is_stale_route(&status) || retried {
                    return Err(status.into());
                }
                retried = true;
            }
            // The job was dropped unrun: the shard is stopping.
            Err(_) => return Err(Status::unavailable("the server is stopping; retry")),
        }
    }
}

/// Opens the stream on every source of the subscription (`gathered`), each a job that sends
/// into the one `responses`, with its share of the client's window (`window_share`): on the
/// shard leading it, or on the shard carrying it to the node leading it (`Relay::stream_to`);
/// once each is open, source 0's shard's caller and the subscription's properties. A source that cannot open refuses the stream: the ones already open end when
/// the refusal drops the response channel, giving back what they leased.
async fn open_gathered(
    gateway: &Gateway,
    presented: &Presented,
    opening: &Opening,
    gathered: &Gathered,
    responses: &Responses,
    refusal: oneshot::Sender<Status>,
) -> Result<(ShardCaller<ForwarderShard>, Properties, bool), Status> {
    let refusal = Arc::new(std::sync::Mutex::new(Some(refusal)));
    let sources = gathered.places.len();
    // What another node delivers comes without the subscription's properties: this node's
    // catalog says them, read once.
    let remote_properties = match gathered.places.iter().any(|place| matches!(place, Place::Elsewhere { .. }))
    {
        true => Some(super::remote::properties(gateway, &opening.name).await?),
        false => None,
    };
    let mut answers = Vec::with_capacity(sources);
    for (source, place) in gathered.places.iter().enumerate() {
        let (opened, answer) = oneshot::channel();
        let mut settings = opening.settings;
        settings.max_outstanding_messages = window_share(settings.max_outstanding_messages, sources, source);
        settings.max_outstanding_bytes = window_share(settings.max_outstanding_bytes, sources, source);
        let (presented, name, responses) = (presented.clone(), opening.name.clone(), responses.clone());
        let ends = Ends { opened, refusal: refusal.clone() };
        // Each job lives as long as its source's stream; its result is only that it ended.
        match place {
            Place::Here(shard) => {
                let running = gateway.forwarders[*shard].clone();
                tokio::spawn(async move {
                    let _ = running
                        .call(move |shard| serve_stream(shard, presented, name, settings, responses, ends))
                        .await;
                });
            }
            Place::Elsewhere { owner, carrier } => {
                // The share, or, for no limit, the native protocol's 0.
                let native_limit = |share: u64| if share == u64::MAX { 0 } else { share };
                let mut native = opening.native.clone();
                native.max_outstanding_messages = native_limit(settings.max_outstanding_messages);
                native.max_outstanding_bytes = native_limit(settings.max_outstanding_bytes);
                let body = super::remote::native_body(WireCommand::StreamingPull, &native)?;
                let properties = remote_properties.expect("read when a source is elsewhere");
                let (running, to) = (gateway.forwarders[*carrier].clone(), CarriedTo::Source(owner.clone()));
                tokio::spawn(async move {
                    let _ = running
                        .call(move |shard| {
                            let request = (body, settings.leases_outlive_stream);
                            serve_carried_stream(shard, presented, to, request, properties, responses, ends)
                        })
                        .await;
                });
            }
        }
        answers.push(answer);
    }
    let mut properties = None;
    for answer in answers {
        match answer.await {
            Ok(Ok(opened)) => properties = properties.or(Some(opened)),
            Ok(Err(status)) => return Err(super::sources::moved(gateway, &opening.name, status)),
            Err(_) => return Err(Status::unavailable("the server is stopping; retry")),
        }
    }
    let properties = properties.expect("a topic of several sources opened a stream on each");
    let first = match &gathered.places[0] {
        Place::Here(shard) => *shard,
        Place::Elsewhere { carrier, .. } => *carrier,
    };
    Ok((gateway.forwarders[first].clone(), properties, false))
}

/// Source `source`'s share of a stream's window of `total` (messages or bytes) over `sources`:
/// the window split evenly, the remainder to the first sources, so that the shares sum to the
/// window and what a client holds unacknowledged over every source stays within the window it
/// asked for. A share is fixed for the stream's life: moving credit to the sources with
/// traffic would need each source's load read across shards before every lease; unordered
/// publishes spread evenly, so an even split wastes little. Each share is at least one, as a
/// source with none would never deliver: a window smaller than the number of sources (a
/// handful of messages, where Google's clients ask for 1,000) is the one the sum can exceed.
pub fn window_share(total: u64, sources: usize, source: usize) -> u64 {
    if total == u64::MAX {
        return total;
    }
    let (sources, source) = (sources.max(1) as u64, source as u64);
    (total / sources + u64::from(source < total % sources)).max(1)
}

/// How the stream's job tells its end: once opened (or why not), and, once the stream's
/// credential no longer holds, why (the response stream ends with it at once, whatever it had
/// queued).
struct Ends {
    opened: oneshot::Sender<Result<Properties, crate::api::Status>>,
    refusal: std::sync::Arc<std::sync::Mutex<Option<oneshot::Sender<Status>>>>,
}

/// The stream's peer as the shard sees it: gone once tonic dropped the response stream, or once
/// the session the stream opened with no longer holds (its token revoked or expired), checked
/// again each `SECURITY_CHECK_INTERVAL` against the shard's access file, which the shard reloads
/// as often: a stream ends within about two intervals of the change, as a native connection does.
struct CredentialedPeer<'a> {
    responses: &'a Responses,
    access: &'a Access,
    session: Session,
    /// When the session was last checked.
    checked: Cell<Instant>,
    /// Why the session no longer holds, once it does not.
    refused: RefCell<Option<crate::api::Status>>,
}

impl CredentialedPeer<'_> {
    /// Whether the session no longer holds, checking it again when an interval has passed
    /// since the last check (so a stream that keeps delivering checks too, at no cost per
    /// delivery beyond reading the clock).
    fn is_refused(&self) -> bool {
        if self.refused.borrow().is_some() {
            return true;
        }
        if !self.may_lapse() || crate::runtime::now() - self.checked.get() < SECURITY_CHECK_INTERVAL {
            return false;
        }
        self.check()
    }

    /// Checks the session now. Time is the shard's (`runtime`), as the native server's check
    /// reads it: the job runs on a forwarder shard, so a simulation's clock reaches it.
    fn check(&self) -> bool {
        self.checked.set(crate::runtime::now());
        let now = UNIX_EPOCH + Duration::from_millis(crate::runtime::wall_ms());
        match self.access.still_valid(&self.session, now) {
            Ok(()) => false,
            Err(status) => {
                *self.refused.borrow_mut() = Some(status);
                true
            }
        }
    }

    /// Whether the session can stop holding: only a token is revoked or expires (a certificate
    /// was verified at the handshake, and anonymous has nothing to lose), so only a token's
    /// stream pays for a timer.
    fn may_lapse(&self) -> bool {
        matches!(self.session.credential, Credential::Token { .. })
    }

    /// Resolves once the session no longer holds.
    async fn refusal(&self) {
        if !self.may_lapse() {
            return std::future::pending().await;
        }
        while !self.check() {
            crate::runtime::sleep(SECURITY_CHECK_INTERVAL).await;
        }
    }

    /// Why the stream must end for its credential, if it must.
    fn take_refusal(&self) -> Option<Status> {
        let status = self.refused.borrow_mut().take()?;
        let message = format!("the stream's credential no longer holds, it ends: {}", status.message);
        Some(crate::api::Status::new(status.code, message).into())
    }
}

impl StreamPeer for CredentialedPeer<'_> {
    fn is_gone(&self) -> bool {
        self.responses.is_closed() || self.is_refused()
    }

    async fn gone(&self) {
        or(self.responses.closed(), self.refusal()).await
    }
}

/// The stream's job, on the shard: opens the data plane's stream, says so on `opened`, then
/// sends each delivery as responses until the peer goes, the stream fails, or its credential
/// no longer holds.
async fn serve_stream(
    shard: Rc<ForwarderShard>,
    presented: Presented,
    name: String,
    settings: StreamSettings,
    responses: Responses,
    ends: Ends,
) {
    let opening = async {
        let session = presented.check(&shard.access, Kind::StreamingPull, &name)?;
        let stream = shard.forwarder.open_stream(&name, settings).await?;
        Ok((session, stream, properties_on(&shard, &name)?))
    };
    let (session, mut stream, mut properties) = match opening.await {
        Ok(opened_stream) => opened_stream,
        Err(status) => {
            let _ = ends.opened.send(Err(status));
            return;
        }
    };
    if ends.opened.send(Ok(properties)).is_err() {
        return;
    }
    let peer = CredentialedPeer {
        responses: &responses,
        access: &shard.access,
        session,
        checked: Cell::new(crate::runtime::now()),
        refused: RefCell::new(None),
    };
    loop {
        let delivery = match stream.next(&peer).await {
            Ok(Some(delivery)) => delivery,
            Ok(None) => break,
            Err(status) => {
                let _ = responses.send(Err(status.into())).await;
                return;
            }
        };
        // Read again for each delivery: an update may have changed them.
        properties = properties_on(&shard, &name).unwrap_or(properties);
        // A client that does not read holds the send; its credential is still checked.
        let sent = or(send_delivery(&responses, delivery, properties), async {
            peer.refusal().await;
            false
        });
        if !sent.await {
            break;
        }
    }
    // The stream is dropped first, so its messages are delivered again before the client
    // hears why.
    drop(stream);
    if let Some(status) = peer.take_refusal() {
        let refusal = ends.refusal.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(refusal) = refusal {
            let _ = refusal.send(status);
        }
    }
}

/// A stream on a subscription another node serves, carried there by the shard's relay for the
/// principal this shard authenticates the caller as; its batches come back as the native
/// protocol sends them and go on as Pub/Sub's responses, with the properties of the
/// subscription as this node's catalog holds them. The client's leaving (tonic drops the
/// response stream) closes the carried stream's connection, which ends the leader's stream and
/// gives its leases back.
async fn serve_carried_stream(
    shard: Rc<ForwarderShard>,
    presented: Presented,
    to: CarriedTo,
    (body, keeps_leases): (FrameBuffer, bool),
    properties: Properties,
    responses: Responses,
    ends: Ends,
) {
    let session = match presented.session(&shard.access) {
        Ok(session) => session,
        Err(status) => {
            let _ = ends.opened.send(Err(status));
            return;
        }
    };
    let Some(relay) = crate::net::relay::of(shard.forwarder.global_shard()) else {
        let status =
            crate::api::Status::unavailable("this node's forwarders carry no streams to other nodes");
        let _ = ends.opened.send(Err(status));
        return;
    };
    let principal = session.principal.clone();
    let downstream = CarriedDownstream {
        peer: CredentialedPeer {
            responses: &responses,
            access: &shard.access,
            session,
            checked: Cell::new(crate::runtime::now()),
            refused: RefCell::new(None),
        },
        properties,
        opened: RefCell::new(Some(ends.opened)),
    };
    let carried = match &to {
        CarriedTo::Subscription(name) => {
            relay.stream(name, &principal, &body, keeps_leases, &downstream).await
        }
        CarriedTo::Source(owner) => {
            relay.stream_to(owner, &principal, &body, keeps_leases, &downstream).await.map(Some)
        }
    };
    let opened = downstream.opened.borrow_mut().take();
    match (carried, opened) {
        (Ok(None), Some(opened)) => {
            let status =
                crate::api::Status::new(crate::api::Code::NotOwner, "the subscription is served here now");
            let _ = opened.send(Err(status));
        }
        (Err(status), Some(opened)) => {
            let _ = opened.send(Err(status));
        }
        (Err(status), None) => {
            let _ = responses.send(Err(status.into())).await;
        }
        (Ok(_), _) => {}
    }
    if let Some(status) = downstream.peer.take_refusal() {
        let refusal = ends.refusal.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(refusal) = refusal {
            let _ = refusal.send(status);
        }
    }
}

/// Where a carried stream goes.
enum CarriedTo {
    /// The leader of the subscription of this name (of its topic's source 0), followed when
    /// it moves (`Relay::stream`).
    Subscription(String),
    /// This forwarder of another node, leading one of the subscription's sources
    /// (`Relay::stream_to`): a stream the gateway gathers over every source.
    Source(crate::dispatch::routes::Owner),
}

/// A carried stream's subscriber, as the relay sees it.
struct CarriedDownstream<'a> {
    peer: CredentialedPeer<'a>,
    properties: Properties,
    /// Told once the leader took the stream.
    opened: RefCell<Option<oneshot::Sender<Result<Properties, crate::api::Status>>>>,
}

impl crate::net::relay::Downstream for CarriedDownstream<'_> {
    async fn accepted(&self) -> bool {
        let opened = self.opened.borrow_mut().take();
        match opened {
            Some(opened) => opened.send(Ok(self.properties)).is_ok(),
            None => !self.peer.is_gone(),
        }
    }

    async fn send(&self, batch: FrameBuffer, reservation: StreamReservation) -> bool {
        let Ok(response) = decode_body::<NativePullResponse>(&batch) else { return false };
        drop(batch);
        let messages = super::remote::received_messages(&response, self.properties);
        drop(response);
        let sent = or(
            async {
                for response in split_responses(messages, self.properties) {
                    if self.peer.responses.send(Ok(response)).await.is_err() {
                        return false;
                    }
                }
                true
            },
            async {
                self.peer.refusal().await;
                false
            },
        )
        .await;
        // Held until its responses are queued, as the shard's own deliveries' are.
        drop(reservation);
        sent
    }

    fn is_gone(&self) -> bool {
        StreamPeer::is_gone(&self.peer)
    }

    async fn gone(&self) {
        StreamPeer::gone(&self.peer).await
    }
}

/// Sends one delivery as responses of at most `GRPC_STREAM_RESPONSE_BYTES_MAX`, holding its
/// share of the shard's response budget until the last is queued; false once the peer went.
async fn send_delivery<B: AsRef<[u8]>>(
    responses: &Responses,
    delivery: Delivery<B>,
    properties: Properties,
) -> bool {
    let messages = received_messages(&delivery, properties);
    let Delivery { batches, reservation, .. } = delivery;
    // The messages are copied out: the log's buffers can go before the client reads them.
    drop(batches);
    for response in split_responses(messages, properties) {
        if responses.send(Ok(response)).await.is_err() {
            return false;
        }
    }
    drop(reservation);
    true
}

/// `messages` in responses of at most `GRPC_STREAM_RESPONSE_BYTES_MAX` encoded bytes each
/// (a single larger message alone), in order, each with the subscription's properties.
pub fn split_responses(
    messages: Vec<pubsub::ReceivedMessage>,
    properties: Properties,
) -> Vec<pubsub::StreamingPullResponse> {
    let response = |received_messages| pubsub::StreamingPullResponse {
        received_messages,
        subscription_properties: Some(properties.to_proto()),
        ..Default::default()
    };
    let room = GRPC_STREAM_RESPONSE_BYTES_MAX - PROPERTIES_BYTES_MAX;
    let (mut responses, mut current, mut bytes) = (Vec::new(), Vec::new(), 0);
    for message in messages {
        // The field's tag (1 byte), the message's length, the message.
        let length = message.encoded_len();
        let size = 1 + prost::encoding::encoded_len_varint(length as u64) + length;
        if !current.is_empty() && bytes + size > room {
            responses.push(response(std::mem::take(&mut current)));
            bytes = 0;
        }
        bytes += size;
        current.push(message);
    }
    if !current.is_empty() {
        responses.push(response(current));
    }
    responses
}

/// The response stream tonic writes: what the shard and the request reader send, until either
/// sends an error, the client closes its side, the daemon stops (`UNAVAILABLE`), or the shard
/// finds the stream's credential no longer holds (`refused`, ahead of anything queued).
fn response_stream(
    received: mpsc::Receiver<Result<pubsub::StreamingPullResponse, Status>>,
    stopping: watch::Receiver<bool>,
    client_gone: oneshot::Receiver<()>,
    refused: oneshot::Receiver<Status>,
) -> ResponseStream {
    struct Outlet {
        received: mpsc::Receiver<Result<pubsub::StreamingPullResponse, Status>>,
        stopping: watch::Receiver<bool>,
        client_gone: oneshot::Receiver<()>,
        /// `None` once it answered.
        refused: Option<oneshot::Receiver<Status>>,
        ended: bool,
    }
    enum Event {
        Sent(Option<Result<pubsub::StreamingPullResponse, Status>>),
        Stopping,
        ClientGone,
        Refused(Status),
    }
    let outlet = Outlet { received, stopping, client_gone, refused: Some(refused), ended: false };
    Box::pin(futures_lite::stream::unfold(outlet, |mut outlet| async move {
        if outlet.ended {
            return None;
        }
        let Outlet { received, stopping, client_gone, refused, .. } = &mut outlet;
        let refusal = async {
            let Some(receiver) = refused.as_mut() else { return std::future::pending().await };
            let outcome = receiver.await;
            *refused = None;
            match outcome {
                Ok(status) => Event::Refused(status),
                // The job ended without a refusal: nothing more to wait for from it.
                Err(_) => std::future::pending().await,
            }
        };
        // The refusal first: a client that does not read must not keep its stream by it.
        let event = or(
            refusal,
            or(
                or(async { Event::Sent(received.recv().await) }, async {
                    // A dropped sender is a stopped server too.
                    let _ = stopping.wait_for(|stopping| *stopping).await;
                    Event::Stopping
                }),
                async {
                    let _ = client_gone.await;
                    Event::ClientGone
                },
            ),
        )
        .await;
        match event {
            Event::Sent(Some(Ok(response))) => Some((Ok(response), outlet)),
            Event::Sent(Some(Err(status))) | Event::Refused(status) => {
                outlet.ended = true;
                Some((Err(status), outlet))
            }
            Event::Stopping => {
                outlet.ended = true;
                let status = Status::unavailable(
                    "ringpostd is stopping; open the stream again (its messages are delivered again)",
                );
                Some((Err(status), outlet))
            }
            Event::Sent(None) | Event::ClientGone => None,
        }
    }))
}

/// Requests after the first may change deadlines and acknowledge, not the flow control.
fn check_later_request(request: &pubsub::StreamingPullRequest) -> Result<(), Status> {
    if request.max_outstanding_messages != 0 || request.max_outstanding_bytes != 0 {
        return Err(Status::invalid_argument(
            "max_outstanding_messages and max_outstanding_bytes can only be set on the first request",
        ));
    }
    check_deadline_changes(request)
}

/// `modify_deadline_seconds` pairs with `modify_deadline_ack_ids`, one to one.
fn check_deadline_changes(request: &pubsub::StreamingPullRequest) -> Result<(), Status> {
    if request.modify_deadline_seconds.len() != request.modify_deadline_ack_ids.len() {
        return Err(Status::invalid_argument(format!(
            "modify_deadline_seconds has {} values and modify_deadline_ack_ids {}; they must pair up",
            request.modify_deadline_seconds.len(),
            request.modify_deadline_ack_ids.len()
        )));
    }
    Ok(())
}

/// Reads the client's side of a stream, on tokio.
struct RequestReader {
    caller: ShardCaller<ForwarderShard>,
    /// The stream is carried to another node (`caller` carries its acknowledgements there).
    carried: bool,
    /// The subscription's sources, when it has several: each ack id goes to the source it
    /// names, here or carried to the node leading it.
    gathered: Option<(Arc<Gateway>, Arc<Gathered>)>,
    presented: Presented,
    name: String,
    properties: Properties,
    responses: Responses,
}

impl RequestReader {
    /// Applies each request in turn (one acknowledgement or deadline change at a time per
    /// stream, which bounds a stream's jobs); a refused one ends the stream with its error.
    /// Dropping `client_done` ends the response stream once the client's side ended.
    async fn run(
        mut self,
        first: pubsub::StreamingPullRequest,
        mut requests: Streaming<pubsub::StreamingPullRequest>,
        client_done: oneshot::Sender<()>,
    ) {
        // The first request was checked as the opening one; the rest are later ones.
        let mut applied = self.apply(first).await;
        while applied.is_ok() {
            applied = match requests.message().await {
                Ok(Some(request)) => match check_later_request(&request) {
                    Ok(()) => self.apply(request).await,
                    Err(status) => Err(status),
                },
                // A request that does not decode ends the stream with the client's error; a
                // broken connection or a cancelled call just ends it.
                Err(status)
                    if refusal_of_bad_request(status.clone()).code() == tonic::Code::InvalidArgument =>
                {
                    Err(refusal_of_bad_request(status))
                }
                Ok(None) | Err(_) => break,
            };
        }
        if let Err(status) = applied {
            let _ = self.responses.send(Err(status)).await;
        }
        drop(client_done);
    }

    /// A request's acknowledgements, then its deadline changes grouped by their seconds. A new
    /// `stream_ack_deadline_seconds` is accepted; the leases of this stream keep the deadline
    /// it opened with (the client libraries extend each lease themselves).
    async fn apply(&mut self, request: pubsub::StreamingPullRequest) -> Result<(), Status> {
        if let Some((gateway, sources)) = self.gathered.clone() {
            return self.apply_gathered(&gateway, &sources, request).await;
        }
        if !request.ack_ids.is_empty() {
            let ack_ids = request.ack_ids;
            let name = self.name.clone();
            let sent = ack_ids.clone();
            let (properties, failures) = match self.carried {
                false => {
                    checked_call(&self.caller, &self.presented, &self.name, Kind::Acknowledge, move |shard| {
                        shard_acknowledge(shard, name, sent)
                    })
                    .await?
                }
                true => (self.properties, self.carry(sent, None).await?),
            };
            self.confirm(properties, &ack_ids, failures, Confirmation::Acknowledge).await?;
        }
        let mut by_seconds: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (seconds, ack_id) in
            request.modify_deadline_seconds.into_iter().zip(request.modify_deadline_ack_ids)
        {
            by_seconds.entry(deadline_seconds(seconds)?).or_default().push(ack_id);
        }
        for (seconds, ack_ids) in by_seconds {
            let name = self.name.clone();
            let sent = ack_ids.clone();
            let (properties, failures) = match self.carried {
                false => {
                    checked_call(
                        &self.caller,
                        &self.presented,
                        &self.name,
                        Kind::ModifyAckDeadline,
                        move |shard| shard_modify(shard, name, sent, seconds),
                    )
                    .await?
                }
                true => (self.properties, self.carry(sent, Some(seconds)).await?),
            };
            self.confirm(properties, &ack_ids, failures, Confirmation::ModifyAckDeadline).await?;
        }
        Ok(())
    }

    /// `apply` for a subscription of several sources: each ack id settled on the source it
    /// names, and each request's confirmation (with exactly-once) one answer for every source.
    async fn apply_gathered(
        &mut self,
        gateway: &Gateway,
        sources: &Gathered,
        request: pubsub::StreamingPullRequest,
    ) -> Result<(), Status> {
        let settle = super::sources::settle;
        let known = Some(self.properties);
        if !request.ack_ids.is_empty() {
            let ack_ids = request.ack_ids;
            let (properties, failures) =
                settle(gateway, &self.presented, &self.name, sources, &ack_ids, (None, known)).await?;
            self.confirm(properties, &ack_ids, failures, Confirmation::Acknowledge).await?;
        }
        let mut by_seconds: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (seconds, ack_id) in
            request.modify_deadline_seconds.into_iter().zip(request.modify_deadline_ack_ids)
        {
            by_seconds.entry(deadline_seconds(seconds)?).or_default().push(ack_id);
        }
        for (seconds, ack_ids) in by_seconds {
            let (properties, failures) =
                settle(gateway, &self.presented, &self.name, sources, &ack_ids, (Some(seconds), known))
                    .await?;
            self.confirm(properties, &ack_ids, failures, Confirmation::ModifyAckDeadline).await?;
        }
        Ok(())
    }

    /// Acknowledges (`seconds`: `None`) or changes the deadlines of `ack_ids` on the node the
    /// stream is carried to; a subscription served here now is refused as moved (`NotOwner`),
    /// which ends the stream: the client opens it again, here.
    async fn carry(&self, ack_ids: Vec<String>, seconds: Option<u32>) -> Result<Vec<InvalidAckId>, Status> {
        let carried =
            super::remote::acknowledge(&self.caller, &self.presented, &self.name, ack_ids, seconds).await;
        match carried? {
            Some(failures) => Ok(failures),
            None => Err(crate::api::Status::new(
                crate::api::Code::NotOwner,
                "the subscription moved to this node; open the stream again",
            )
            .into()),
        }
    }

    /// With exactly-once delivery, tells the client which ack ids succeeded and which failed,
    /// in a response of their own; without it, only a malformed ack id (or one that could
    /// not be made durable) is news, and it ends the stream.
    async fn confirm(
        &mut self,
        properties: Properties,
        requested: &[String],
        failures: Vec<InvalidAckId>,
        kind: Confirmation,
    ) -> Result<(), Status> {
        self.properties = properties;
        if !properties.exactly_once {
            return ack_outcome(properties, requested, failures);
        }
        let response = confirmation(properties, requested, &failures, kind);
        // The response stream is gone when the client is: nothing is left to tell.
        let _ = self.responses.send(Ok(response)).await;
        Ok(())
    }
}

/// Which confirmation field a response fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirmation {
    Acknowledge,
    ModifyAckDeadline,
}

/// An exactly-once stream's confirmation of `requested`, of which `failures` failed.
pub fn confirmation(
    properties: Properties,
    requested: &[String],
    failures: &[InvalidAckId],
    kind: Confirmation,
) -> pubsub::StreamingPullResponse {
    let failed: BTreeSet<&str> = failures.iter().map(|failure| failure.ack_id.as_str()).collect();
    let mut succeeded: Vec<String> = requested
        .iter()
        .filter(|ack_id| !failed.contains(ack_id.chars().take(ACK_ID_BYTES_MAX).collect::<String>().as_str()))
        .cloned()
        .collect();
    succeeded.dedup();
    let of = |permanent: bool| -> Vec<String> {
        failures
            .iter()
            .filter(|failure| failure.permanent == permanent)
            .map(|failure| failure.ack_id.clone())
            .collect()
    };
    let mut response = pubsub::StreamingPullResponse {
        subscription_properties: Some(properties.to_proto()),
        ..Default::default()
    };
    match kind {
        Confirmation::Acknowledge => {
            response.acknowledge_confirmation = Some(AcknowledgeConfirmation {
                ack_ids: succeeded,
                invalid_ack_ids: of(true),
                unordered_ack_ids: Vec::new(),
                temporary_failed_ack_ids: of(false),
            })
        }
        Confirmation::ModifyAckDeadline => {
            response.modify_ack_deadline_confirmation = Some(ModifyAckDeadlineConfirmation {
                ack_ids: succeeded,
                invalid_ack_ids: of(true),
                temporary_failed_ack_ids: of(false),
            })
        }
    }
    response
}

async fn shard_acknowledge(
    shard: Rc<ForwarderShard>,
    name: String,
    ack_ids: Vec<String>,
) -> Result<(Properties, Vec<InvalidAckId>), crate::api::Status> {
    let properties = properties_on(&shard, &name)?;
    let failures = shard.forwarder.acknowledge(&name, ack_ids.iter().map(String::as_str)).await?;
    Ok((properties, failures))
}

async fn shard_modify(
    shard: Rc<ForwarderShard>,
    name: String,
    ack_ids: Vec<String>,
    seconds: u32,
) -> Result<(Properties, Vec<InvalidAckId>), crate::api::Status> {
    let properties = properties_on(&shard, &name)?;
    let failures =
        shard.forwarder.modify_ack_deadline(&name, ack_ids.iter().map(String::as_str), seconds).await?;
    Ok((properties, failures))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(bytes: usize, index: usize) -> pubsub::ReceivedMessage {
        pubsub::ReceivedMessage {
            ack_id: format!("1.{index:x}.1"),
            message: Some(pubsub::PubsubMessage {
                data: vec![7u8; bytes].into(),
                message_id: index.to_string(),
                ..Default::default()
            }),
            delivery_attempt: 0,
        }
    }

    #[test]
    fn deliveries_split_into_responses_under_the_limit_and_a_big_message_goes_alone() {
        let properties = Properties { exactly_once: true, ordered: true, counts_attempts: false };
        let mut messages: Vec<_> = (0..40).map(|index| message(300_000, index)).collect();
        messages.insert(10, message(GRPC_STREAM_RESPONSE_BYTES_MAX + 10, 999));
        let count = messages.len();
        let responses = split_responses(messages, properties);
        let mut seen = 0;
        for response in &responses {
            let alone = response.received_messages.len() == 1;
            assert!(
                alone || response.encoded_len() <= GRPC_STREAM_RESPONSE_BYTES_MAX,
                "{}",
                response.encoded_len()
            );
            let properties = response.subscription_properties.expect("properties in every response");
            assert!(properties.exactly_once_delivery_enabled && properties.message_ordering_enabled);
            seen += response.received_messages.len();
        }
        assert_eq!(seen, count);
        assert!(responses.len() >= 4, "{} responses", responses.len());
        let big = responses
            .iter()
            .find(|response| response.received_messages[0].message.as_ref().unwrap().message_id == "999")
            .unwrap();
        assert_eq!(big.received_messages.len(), 1);
    }

    #[test]
    fn a_windows_shares_over_sources_sum_to_it_and_none_is_empty() {
        for (total, sources) in [(10, 2), (1000, 3), (7, 4), (100 << 20, 5), (2, 2)] {
            let shares: Vec<u64> = (0..sources).map(|source| window_share(total, sources, source)).collect();
            assert_eq!(shares.iter().sum::<u64>(), total, "{total} over {sources}: {shares:?}");
            assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1, "{shares:?}");
        }
        // No limit stays none; a window smaller than the sources gives each one.
        assert_eq!(window_share(u64::MAX, 3, 2), u64::MAX);
        assert_eq!((0..3).map(|source| window_share(2, 3, source)).collect::<Vec<_>>(), vec![1, 1, 1]);
    }

    #[test]
    fn exactly_once_confirmations_sort_ack_ids_into_succeeded_invalid_and_temporary() {
        let properties = Properties { exactly_once: true, ..Properties::default() };
        let requested: Vec<String> = ["1.1.1", "1.2.1", "1.3.1"].iter().map(|id| id.to_string()).collect();
        let failures =
            vec![InvalidAckId::new("1.2.1", "expired"), InvalidAckId::transient("1.3.1", "journal")];
        let response = confirmation(properties, &requested, &failures, Confirmation::Acknowledge);
        let confirmation = response.acknowledge_confirmation.unwrap();
        assert_eq!(confirmation.ack_ids, vec!["1.1.1"]);
        assert_eq!(confirmation.invalid_ack_ids, vec!["1.2.1"]);
        assert_eq!(confirmation.temporary_failed_ack_ids, vec!["1.3.1"]);
        assert!(response.subscription_properties.unwrap().exactly_once_delivery_enabled);
    }

    #[test]
    fn the_first_request_needs_a_subscription_and_a_stream_deadline_of_10_to_600_seconds() {
        let request = |subscription: &str, seconds| pubsub::StreamingPullRequest {
            subscription: subscription.into(),
            stream_ack_deadline_seconds: seconds,
            ..Default::default()
        };
        assert!(Opening::of(&request("projects/p/subscriptions/orders", 10)).is_ok());
        for (subscription, seconds) in [
            ("", 10),
            ("projects/p/subscriptions/orders", 9),
            ("projects/p/subscriptions/orders", 601),
            ("orders", 60),
        ] {
            let status = Opening::of(&request(subscription, seconds)).err().expect("refused");
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{subscription} {seconds}");
        }
        let mut unpaired = request("projects/p/subscriptions/orders", 10);
        unpaired.modify_deadline_ack_ids = vec!["1.1.1".into()];
        assert_eq!(check_deadline_changes(&unpaired).unwrap_err().code(), tonic::Code::InvalidArgument);
        let mut later = pubsub::StreamingPullRequest { max_outstanding_messages: 5, ..Default::default() };
        assert!(check_later_request(&later).is_err());
        later.max_outstanding_messages = 0;
        assert!(check_later_request(&later).is_ok());
    }

    /// The stream's credential check reads the shard's clock, so a simulation's reaches it: a
    /// token valid at the simulation's start (its wall clock is 2023's, the token expires 40
    /// minutes later) holds until the virtual clock passes its expiry, then ends the stream,
    /// with no real minute waited. On the system clock the token had expired at once and no
    /// interval had passed since the last check.
    #[test]
    fn a_streams_credential_is_checked_on_the_shards_clock() {
        let token = "rpt_streaming_alice";
        let epoch = UNIX_EPOCH + Duration::from_millis(crate::runtime::sim::EPOCH_MS);
        let expires = epoch + Duration::from_secs(40 * 60);
        let line = crate::auth::token::access_line("alice", token, Some(expires));
        let access = crate::protocol::native::forwarder::tests::required_access("grpc-stream-clock", &line);
        let (responses, _receiver) = mpsc::channel(1);
        crate::runtime::sim::Simulation::new(0).time_max(Duration::from_secs(3600)).run(async {
            let session = access.authenticate_token(token).expect("the token is valid at the start");
            let peer = CredentialedPeer {
                responses: &responses,
                access: &access,
                session,
                checked: Cell::new(crate::runtime::now()),
                refused: RefCell::new(None),
            };
            assert!(!peer.check(), "the token holds at the simulation's start");
            crate::runtime::sleep(Duration::from_secs(30 * 60)).await;
            assert!(!peer.is_gone(), "the token holds before it expires");
            let started = crate::runtime::now();
            peer.gone().await;
            let waited = crate::runtime::now() - started;
            assert!(waited >= Duration::from_secs(10 * 60), "ended before the expiry: {waited:?}");
            assert!(waited <= Duration::from_secs(10 * 60) + 2 * SECURITY_CHECK_INTERVAL, "{waited:?}");
            let refusal = peer.take_refusal().expect("the stream ends for its credential");
            assert_eq!(refusal.code(), tonic::Code::Unauthenticated);
            assert!(refusal.message().contains("expired"), "{}", refusal.message());
        });
    }
}
