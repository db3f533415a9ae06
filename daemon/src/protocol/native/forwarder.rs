//! The native protocol on a forwarder's port: frames in, the data plane's typed operations
//! (`api::data::DataPlane`), frames out. A pull's messages are sent from the log batches they
//! were read into, as a gathered frame (`encode_gathered`): the data is copied only by the
//! kernel.

use crate::api::data::{
    Attributes, DataError, DataPlane, Delivery, DeliveryStream, InvalidAckId, MessageView, PublishBatch,
    PullSettings, StreamPeer, StreamSettings,
};
use crate::auth::Principal;
use crate::dispatch::{self, Kind};
use crate::ids::ShardId;
use crate::net::relay;
use crate::net::server::{fail, gathering_has_room, respond, Handler, Held, Responder, Response};
use crate::shard::Forwarder;
use crate::storage::Storage;
use crate::subscription::budget::StreamReservation;
use ringpost_wire::borrowed::{
    AttributeRef, BytesRef, PublishResponseRange, PullResponseRef, ReceivedMessageRef, StrRef,
};
use ringpost_wire::frame::{access_body, FrameBuffer, FrameHeader, FLAG_MORE, FLAG_RELAYED, FLAG_RESPONSE};
use ringpost_wire::gather::{encode_gathered, GATHER_RUN_BYTES_MIN};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::*;
use ringpost_wire::{Command, ErrorCode, Status};

impl<S: Storage> Handler for Forwarder<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response {
        self.activity.count_request();
        // Every request runs as a task as large as this future, which is as large as its
        // largest arm: the pull and acknowledgement paths' futures are large, a publish's
        // small. Those are boxed, so that a publish's task is a small allocation.
        let result = match Command::from_u16(header.command) {
            Some(Command::StreamingPull) => {
                Box::pin(streaming_pull(self, &header, &body, responder, false)).await
            }
            Some(Command::Hello) => Ok(crate::router::hello_response(&header).into()),
            // Validated and checked before the data plane sees it (`publish`), so that a refused
            // publish appends nothing.
            Some(Command::Publish) => {
                publish(self, body, responder).await.map(|response| respond(&header, &response).into())
            }
            Some(Command::Pull) => Box::pin(checked_pull(self, &header, &body, responder)).await,
            Some(Command::Acknowledge) => {
                Box::pin(checked_acknowledge(self, &header, &body, responder)).await
            }
            Some(Command::ModifyAckDeadline) => {
                Box::pin(modify_ack_deadline(self, &header, &body, responder)).await
            }
            Some(Command::Replica) => Box::pin(replica(self, &header, body, responder)).await,
            Some(Command::Carried) => Box::pin(carried_here(self, &header, body, responder)).await,
            // The connection's reading loop answers it before any handler sees it.
            Some(Command::Authenticate) => {
                Err(Status::new(ErrorCode::Internal, "an Authenticate request reached a forwarder's handler"))
            }
            Some(command) => Err(Status::failed_precondition(format!(
                "{command:?} is a control-plane command: send it to the router's address, not a forwarder's"
            ))),
            None => Err(Status::new(ErrorCode::Unimplemented, format!("unknown command {}", header.command))),
        };
        result.unwrap_or_else(|status| fail(&header, &status).into())
    }
}

/// A publish another node carried here, checked as `handle` checks one.
async fn publish_request<S: Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: FrameBuffer,
    responder: &Responder,
) -> Result<Response, Status> {
    let response = publish(forwarder, body, responder).await?;
    Ok(respond(header, &response).into())
}

/// A request another node's forwarder carried here for its client (`relay`): served as that
/// client's own, for the principal the carrying node authenticated it as, decided by this
/// node's rules (`dispatch::vouched_for`), and marked `FLAG_RELAYED` so that it is never
/// carried on. Only a node of the cluster may vouch for a principal, and only for a data-plane
/// request.
async fn carried_here<S: Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: FrameBuffer,
    responder: &Responder,
) -> Result<Response, Status> {
    if !responder.is_cluster_peer() {
        return Err(Status::new(
            ErrorCode::Unauthenticated,
            "a carried request is taken only from nodes of the cluster, which present its secret",
        ));
    }
    let request = access_body::<CarriedRequest>(&body)?;
    let principal = match request.principal.as_ref() {
        Some(name) => Principal::Named(name.as_str().into()),
        None => Principal::Anonymous,
    };
    let mut inner = FrameBuffer::with_capacity(request.body.len());
    inner.extend_from_slice(request.body.as_slice());
    let command = request.command.to_native();
    let header = FrameHeader {
        body_length: inner.len() as u32,
        command,
        flags: FLAG_RELAYED,
        request_id: header.request_id,
    };
    let client_keeps_leases = request.client_keeps_leases;
    let responder = &responder.carrying_for(dispatch::vouched_for(principal));
    match Command::from_u16(command) {
        Some(Command::Publish) => publish_request(forwarder, &header, inner, responder).await,
        Some(Command::Pull) => checked_pull(forwarder, &header, &inner, responder).await,
        Some(Command::Acknowledge) => checked_acknowledge(forwarder, &header, &inner, responder).await,
        Some(Command::ModifyAckDeadline) => modify_ack_deadline(forwarder, &header, &inner, responder).await,
        Some(Command::StreamingPull) => {
            streaming_pull(forwarder, &header, &inner, responder, client_keeps_leases).await
        }
        _ => Err(Status::invalid_argument(format!(
            "a carried request carries a publish, a pull, an acknowledgement, a deadline change or a \
             streaming pull, not command {command}"
        ))),
    }
}

/// Another replica's request: only from a node of the cluster.
async fn replica<S: crate::storage::Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: FrameBuffer,
    responder: &Responder,
) -> Result<Response, Status> {
    if !responder.is_cluster_peer() {
        return Err(Status::new(
            ErrorCode::Unauthenticated,
            "replication answers only nodes of the cluster, which present its secret",
        ));
    }
    // An append's records stay in the frame they came in until its commit copies them.
    let frame: std::rc::Rc<dyn AsRef<[u8]>> = std::rc::Rc::new(body);
    let message = access_body::<PeerMessage>((*frame).as_ref())?;
    let request = crate::replication::protocol::ReplicaRequest::decode_held(&frame, message.bytes.as_slice())
        .map_err(|why| Status::invalid_argument(format!("a replica request did not decode: {why}")))?;
    let answer = forwarder.replica_request(request).await.map_err(Status::from)?;
    Ok(respond(header, &PeerMessage { bytes: answer.encode() }).into())
}

/// Whether a publish's sender may publish to its topic, read from the request validated once.
fn check_publish(request: &FramedPublish, responder: &Responder) -> Result<(), Status> {
    check(responder, Kind::Publish, request.request().topic.as_str())
}

/// Whether the request's sender may run an operation of `kind` on `name` (`dispatch::check`);
/// a refusal is the request's answer, logged for audit.
fn check(responder: &Responder, kind: Kind, name: &str) -> Result<(), Status> {
    dispatch::check(responder.access(), responder.session(), kind, name).map_err(Status::from)
}

impl StreamPeer for Responder {
    fn is_gone(&self) -> bool {
        Responder::is_gone(self)
    }
    async fn gone(&self) {
        Responder::gone(self).await
    }
}

impl Attributes for rkyv::vec::ArchivedVec<ArchivedAttribute> {
    fn count(&self) -> usize {
        self.len()
    }
    fn get(&self, index: usize) -> (&str, &str) {
        let attribute = &self[index];
        (attribute.key.as_str(), attribute.value.as_str())
    }
}

/// A publish's messages, still in the request's frame, read in place. The frame is validated
/// once, when the request arrives (`new`, the only constructor); every later read (the data
/// plane's checks, the key check, the encoding into the commit on the log's flush) reads the
/// archive without validating it again.
pub struct FramedPublish {
    /// Never changed after `new` validated it: no `&mut` to it is ever made.
    body: FrameBuffer,
}

impl FramedPublish {
    /// Validates `body` as an archived `PublishRequest`: a malformed body is refused here, with
    /// the frame's `ProtocolError`, and never becomes a `FramedPublish`.
    pub fn new(body: FrameBuffer) -> Result<FramedPublish, Status> {
        access_body::<PublishRequest>(&body)?;
        Ok(FramedPublish { body })
    }

    /// The request, read without validating it again.
    pub fn request(&self) -> &ArchivedPublishRequest {
        // SAFETY: `new` validated these very bytes as an archived `PublishRequest` (rkyv's
        // `access` with bytecheck, which also checked the 16-byte alignment). The buffer is
        // owned by `self` and is never mutated or reallocated after that: the field is private
        // and nothing takes `&mut` to it, and moving `self` moves the vector's pointer, not its
        // heap bytes, so their address and alignment are unchanged. An empty body never
        // validates (a `PublishRequest`'s root is not empty), so the pointer is a real one.
        unsafe { rkyv::access_unchecked::<ArchivedPublishRequest>(&self.body) }
    }
}

impl PublishBatch for FramedPublish {
    fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = MessageView<'_>>),
    ) -> Result<(), DataError> {
        let request = self.request();
        let mut messages = request.messages.iter().map(|message| MessageView {
            data: message.data.as_slice(),
            attributes: &message.attributes,
            ordering_key: message.ordering_key.as_str(),
        });
        visit(request.topic.as_str(), &mut messages);
        Ok(())
    }
}

/// A publish: its body validated (`FramedPublish::new`, the only validation it gets) and its
/// sender checked before the data plane sees it, so that a refused publish appends nothing.
/// Answered with its messages' ids written straight from their range into the response's frame
/// (`PublishResponseRange`, the bytes of a `PublishResponse`), with no vector of them built.
pub async fn publish(
    data: &impl DataPlane,
    body: FrameBuffer,
    responder: &Responder,
) -> Result<PublishResponseRange, Status> {
    // The validated request is moved into the data plane's future: nothing of the check is
    // kept across its await, which keeps a publish's task small.
    let request = checked_publish(body, responder)?;
    Ok(PublishResponseRange(data.publish(request).await?))
}

fn checked_publish(body: FrameBuffer, responder: &Responder) -> Result<FramedPublish, Status> {
    let request = FramedPublish::new(body)?;
    check_publish(&request, responder)?;
    Ok(request)
}

/// A publish, unchecked: for tests that drive the data plane through its protocol.
#[cfg(test)]
pub async fn publish_unchecked(data: &impl DataPlane, body: FrameBuffer) -> Result<PublishResponse, Status> {
    let ids = data.publish(FramedPublish::new(body)?).await?;
    Ok(PublishResponse { message_ids: ids.collect() })
}

/// A pull, unchecked: for tests that drive the data plane through its protocol.
#[cfg(test)]
pub async fn pull<D: DataPlane>(data: &D, header: &FrameHeader, body: &[u8]) -> Result<Response, Status> {
    pull_request(data, header, access_body::<PullRequest>(body)?, None).await
}

async fn checked_pull<S: Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<Response, Status> {
    let request = access_body::<PullRequest>(body)?;
    check(responder, Kind::Pull, request.subscription.as_str())?;
    match pull_request(forwarder, header, request, Some(responder)).await {
        Err(status) if status.code == ErrorCode::NotOwner => {
            let wait = std::time::Duration::from_millis(request.wait_ms.to_native().into());
            carried_unary(
                forwarder.global_shard(),
                header,
                body,
                request.subscription.as_str(),
                responder,
                wait,
                status,
            )
            .await
        }
        result => result,
    }
}

/// A pull, acknowledgement or deadline change on `subscription` refused with `refusal`
/// (`NotOwner`), carried (`carried`) for the same principal; a pull waits up to `wait` there.
async fn carried_unary(
    shard: ShardId,
    header: &FrameHeader,
    body: &[u8],
    subscription: &str,
    responder: &Responder,
    wait: std::time::Duration,
    refusal: Status,
) -> Result<Response, Status> {
    carried(shard, header, refusal, |relay| async move {
        relay.unary(header, body, subscription, &responder.session().principal, wait).await
    })
    .await
}

/// A request the data plane refused with `refusal` (`NotOwner`): on a forwarder of a cluster
/// (`shard`, its global shard), carried to its source's leader on another node (`relay`), unless
/// another node's forwarder already carried it; otherwise, or when the leader is on this node,
/// refused.
async fn carried<F: std::future::Future<Output = Result<Option<Response>, crate::api::Status>>>(
    shard: ShardId,
    header: &FrameHeader,
    refusal: Status,
    carry: impl FnOnce(std::rc::Rc<relay::Relay>) -> F,
) -> Result<Response, Status> {
    if header.flags & FLAG_RELAYED != 0 {
        return Err(refusal);
    }
    let Some(relay) = relay::of(shard) else { return Err(refusal) };
    match carry(relay).await? {
        Some(response) => Ok(response),
        None => Err(refusal),
    }
}

/// A pull on this shard; with `responder`, its wait ends once the connection's peer is gone.
async fn pull_request<D: DataPlane>(
    data: &D,
    header: &FrameHeader,
    request: &ArchivedPullRequest,
    responder: Option<&Responder>,
) -> Result<Response, Status> {
    let settings = PullSettings::new(request.max_messages.to_native(), request.wait_ms.to_native())?;
    let subscription = request.subscription.as_str();
    let delivery = match responder {
        Some(responder) => data.pull_for_peer(subscription, settings, responder).await?,
        None => data.pull(subscription, settings).await?,
    };
    match delivery {
        Some(delivery) => {
            let (frame, reservation) = encode_delivery(header, 0, delivery);
            Ok(Response::Reserved(Box::new(frame), reservation))
        }
        None => Ok(respond(header, &PullResponse::default()).into()),
    }
}

/// A streaming pull: pushes deliveries as frames flagged `FLAG_MORE` until the stream ends,
/// then answers with an empty last frame.
async fn streaming_pull<S: Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
    client_keeps_leases: bool,
) -> Result<Response, Status> {
    let request = access_body::<StreamingPullRequest>(body)?;
    check(responder, Kind::StreamingPull, request.subscription.as_str())?;
    let mut settings = StreamSettings::new(
        request.stream_ack_deadline_seconds.to_native(),
        request.max_outstanding_messages.to_native(),
        request.max_outstanding_bytes.to_native(),
    )?;
    settings.leases_outlive_stream = client_keeps_leases;
    let mut stream = match forwarder.open_stream(request.subscription.as_str(), settings).await {
        Ok(stream) => stream,
        Err(error) if error.is_not_owner() => {
            return carried(forwarder.global_shard(), header, error.into(), |relay| async move {
                let downstream = relay::NativeDownstream { header, responder };
                let principal = &responder.session().principal;
                let subscription = request.subscription.as_str();
                let carried = relay.stream(subscription, principal, body, false, &downstream).await?;
                Ok(carried.map(|()| respond(header, &PullResponse::default()).into()))
            })
            .await;
        }
        Err(status) => return Err(status.into()),
    };
    if !responder.send_more(stream_accepted(header), None).await {
        return Ok(respond(header, &PullResponse::default()).into());
    }
    while let Some(delivery) = stream.next(responder).await? {
        let (frame, reservation) = encode_delivery(header, FLAG_MORE, delivery);
        // A stop while it waited for room is seen by the stream's next turn.
        if !responder.send_more(frame, Some(reservation)).await && !stream.stopping() {
            break;
        }
    }
    drop(stream);
    Ok(respond(header, &PullResponse::default()).into())
}

/// An empty first batch: it tells the client its stream is taken (a refusal is an error).
pub fn stream_accepted(header: &FrameHeader) -> FrameBuffer {
    ringpost_wire::encode_frame(
        header.command,
        FLAG_RESPONSE | FLAG_MORE,
        header.request_id,
        &PullResponse::default(),
    )
}

/// An acknowledgement, unchecked: for tests that drive the data plane through its protocol.
#[cfg(test)]
pub async fn acknowledge(data: &impl DataPlane, body: &[u8]) -> Result<AckResponse, Status> {
    acknowledge_request(data, access_body::<AcknowledgeRequest>(body)?).await
}

async fn checked_acknowledge<S: Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<Response, Status> {
    let request = access_body::<AcknowledgeRequest>(body)?;
    check(responder, Kind::Acknowledge, request.subscription.as_str())?;
    match acknowledge_request(forwarder, request).await {
        Ok(response) => Ok(respond(header, &response).into()),
        Err(status) if status.code == ErrorCode::NotOwner => {
            let subscription = request.subscription.as_str();
            carried_unary(
                forwarder.global_shard(),
                header,
                body,
                subscription,
                responder,
                std::time::Duration::ZERO,
                status,
            )
            .await
        }
        Err(status) => Err(status),
    }
}

async fn acknowledge_request(
    data: &impl DataPlane,
    request: &ArchivedAcknowledgeRequest,
) -> Result<AckResponse, Status> {
    let ack_ids = request.ack_ids.iter().map(|ack_id| ack_id.as_str());
    let invalid = data.acknowledge(request.subscription.as_str(), ack_ids).await?;
    Ok(ack_response(invalid))
}

async fn modify_ack_deadline<S: Storage>(
    forwarder: &Forwarder<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<Response, Status> {
    let request = access_body::<ModifyAckDeadlineRequest>(body)?;
    check(responder, Kind::ModifyAckDeadline, request.subscription.as_str())?;
    let ack_ids = request.ack_ids.iter().map(|ack_id| ack_id.as_str());
    let seconds = request.ack_deadline_seconds.to_native();
    match forwarder.modify_ack_deadline(request.subscription.as_str(), ack_ids, seconds).await {
        Ok(invalid) => Ok(respond(header, &ack_response(invalid)).into()),
        Err(error) if error.is_not_owner() => {
            let subscription = request.subscription.as_str();
            let shard = forwarder.global_shard();
            let zero = std::time::Duration::ZERO;
            carried_unary(shard, header, body, subscription, responder, zero, error.into()).await
        }
        Err(status) => Err(status.into()),
    }
}

fn ack_response(invalid: Vec<InvalidAckId>) -> AckResponse {
    AckResponse {
        invalid_ack_ids: invalid
            .into_iter()
            .map(|invalid| ringpost_wire::messages::InvalidAckId {
                ack_id: invalid.ack_id,
                reason: invalid.reason.to_owned(),
            })
            .collect(),
    }
}

/// A pull response as `encode_delivery` encoded it.
enum Encoded {
    /// Its data left in the batches read, which the frame will hold.
    Gathered(ringpost_wire::gather::GatheredBody),
    /// Copied whole into its own buffer.
    Whole(FrameBuffer),
}

/// Encodes a delivery as one pull response frame, with its reservation fitted to the frame's
/// size. Gathered when its messages' data is long enough to be worth leaving in place and the
/// shard's gathered frames have room to hold its batches; copied whole otherwise. No
/// allocation per message.
pub fn encode_delivery<B: AsRef<[u8]> + 'static>(
    header: &FrameHeader,
    more: u16,
    delivery: Delivery<B>,
) -> (Response, StreamReservation) {
    let encoded = {
        let response = PullResponseRef {
            received_messages: delivery
                .messages
                .iter()
                .map(|message| {
                    let view = delivery.view(message);
                    ReceivedMessageRef {
                        ack_id: StrRef(view.ack_id),
                        message_id: view.message_id,
                        publish_time_ms: view.publish_time_ms,
                        data: BytesRef(view.data),
                        attributes: view
                            .attributes
                            .map(|(key, value)| AttributeRef { key: StrRef(key), value: StrRef(value) })
                            .collect(),
                        ordering_key: StrRef(view.ordering_key),
                        delivery_attempt: view.delivery_attempt,
                    }
                })
                .collect(),
        };
        let flags = FLAG_RESPONSE | more;
        let estimate = FRAME_HEADER_BYTES + response.encoded_bytes_estimate();
        // What is not data, and data too short to be left in place, is copied.
        let (gathered_runs, gathered_bytes) = response
            .received_messages
            .iter()
            .map(|message| message.data.0.len())
            .filter(|&length| length >= GATHER_RUN_BYTES_MIN)
            .fold((0, 0), |(runs, bytes), length| (runs + 1, bytes + length));
        if gathered_bytes > 0 && gathering_has_room(delivery.reservation.budget(), delivery.held_bytes()) {
            let sources: Vec<&[u8]> = delivery.batches.iter().map(|(batch, _)| batch.as_ref()).collect();
            Encoded::Gathered(encode_gathered(
                header.command,
                flags,
                header.request_id,
                &response,
                &sources,
                estimate - gathered_bytes,
                gathered_runs,
            ))
        } else {
            Encoded::Whole(ringpost_wire::encode_frame_sized(
                header.command,
                flags,
                header.request_id,
                &response,
                estimate,
            ))
        }
    };
    let Delivery { batches, mut reservation, .. } = delivery;
    // The buffers count against the gathered-bytes budget of the shard the delivery's
    // reservation came from.
    let budget = reservation.budget().clone();
    let frame = match encoded {
        Encoded::Gathered(body) => Response::Gathered(body.holding(
            batches.into_iter().map(|(batch, charge)| Held::new(Box::new(batch), charge, &budget)).collect(),
        )),
        Encoded::Whole(frame) => Response::Frame(frame),
    };
    reservation.fit_to(frame.wire_bytes());
    (frame, reservation)
}

#[cfg(test)]
pub(crate) mod tests;
