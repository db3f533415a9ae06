//! Publish and delivery calls for a topic or subscription another node of the cluster serves.
//! Google's client libraries know one endpoint, not the forwarder lists the native protocol's
//! clients follow, so a call may reach a node that does not serve its resource. It is then
//! carried the way a native client's request is (`net::relay`): a forwarder shard of this
//! node authenticates the caller with its own access file (a token, or the client certificate's
//! identity, which cannot cross nodes itself), and its relay carries the call as a native
//! request with that principal over the cluster's connections, TLS or not, to the forwarder
//! leading the resource, which decides it for that principal with its own access file and
//! answers as it answers its own clients.

use super::bridge::ShardCaller;
use super::credentials::Presented;
use super::delivery::Properties;
use super::gateway::{ForwarderShard, Gateway, Resource};
use crate::api::data::InvalidAckId;
use crate::api::Status;
use crate::dispatch::routes::Owner;
use crate::net::relay;
use ringpost_proto::pubsub;
use ringpost_wire::frame::{decode_body, FrameBuffer};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::{
    AckResponse, AcknowledgeRequest, ModifyAckDeadlineRequest, PullResponse, ReceivedMessage,
};
use ringpost_wire::Command;
use std::time::Duration;

/// The body of a native request (a frame without its header); one over `FRAME_BODY_BYTES_MAX`
/// (16 MiB of ack ids, say) is refused, `INVALID_ARGUMENT` naming the limit.
pub fn native_body<T: ringpost_wire::frame::Body>(
    command: Command,
    request: &T,
) -> Result<FrameBuffer, Status> {
    let frame = ringpost_wire::frame::try_encode_frame(command.code(), 0, 0, request)?;
    let mut body = FrameBuffer::with_capacity(frame.len() - FRAME_HEADER_BYTES);
    body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    Ok(body)
}

/// Carries `command` (its native `body`) on `resource` from `shard` to the node leading it, for
/// whom `presented` authenticates on that shard; the answer's body, or `None` when the
/// resource is led on this node now (its route is stale: the caller looks it up again).
/// `wait`: how long the leader may hold it by design (a pull's wait).
pub async fn carry(
    shard: &ShardCaller<ForwarderShard>,
    presented: &Presented,
    resource: Resource,
    command: Command,
    body: FrameBuffer,
    wait: Duration,
) -> Result<Option<FrameBuffer>, Status> {
    let presented = presented.clone();
    shard
        .try_call(move |shard| async move {
            let session = presented.session(&shard.access)?;
            let relay = shard_relay(&shard)?;
            let answer = relay.carry(&resource, &session.principal, command.code(), &body, wait).await?;
            // A pull's share of the shard's response budget is given back once its answer is
            // handed to tonic, as for the shard's own pulls.
            Ok(answer.map(|(answer, _reservation)| answer))
        })
        .await
}

/// Carries `command` (its native `body`) from `shard` to `owner`, another node's forwarder
/// leading one of a topic's publish sources (`Relay::carry_to`), for whom `presented`
/// authenticates on that shard; the answer's body. `wait`: as `carry`'s.
pub async fn carry_to(
    shard: &ShardCaller<ForwarderShard>,
    presented: &Presented,
    owner: Owner,
    command: Command,
    body: FrameBuffer,
    wait: Duration,
) -> Result<FrameBuffer, Status> {
    let presented = presented.clone();
    shard
        .try_call(move |shard| async move {
            let session = presented.session(&shard.access)?;
            let relay = shard_relay(&shard)?;
            let answer = relay.carry_to(&owner, &session.principal, command.code(), &body, wait).await?;
            // As `carry`'s: a pull's share of the budget is given back once it is answered.
            Ok(answer.0)
        })
        .await
}

/// A subscription's properties as this node's catalog holds them, for what another node
/// delivers: the leader's forwarder answers natively, which says nothing of them.
pub async fn properties(gateway: &Gateway, subscription: &str) -> Result<Properties, Status> {
    let name = subscription.to_owned();
    gateway
        .router
        .try_call(move |shard| async move {
            let settings = shard.router.get_subscription(&name)?.settings;
            Ok(Properties {
                exactly_once: settings.enable_exactly_once_delivery,
                ordered: settings.enable_message_ordering,
                counts_attempts: !settings.dead_letter_topic.is_empty(),
            })
        })
        .await
}

/// A native delivery's messages as Pub/Sub's.
pub fn received_messages(response: &PullResponse, properties: Properties) -> Vec<pubsub::ReceivedMessage> {
    response.received_messages.iter().map(|message| received_message(message, properties)).collect()
}

fn received_message(message: &ReceivedMessage, properties: Properties) -> pubsub::ReceivedMessage {
    pubsub::ReceivedMessage {
        ack_id: message.ack_id.clone(),
        message: Some(pubsub::PubsubMessage {
            data: prost::bytes::Bytes::copy_from_slice(&message.data),
            attributes: message
                .attributes
                .iter()
                .map(|attribute| (attribute.key.clone(), attribute.value.clone()))
                .collect(),
            message_id: message.message_id.to_string(),
            publish_time: Some(super::delivery::timestamp(message.publish_time_ms)),
            ordering_key: message.ordering_key.clone(),
        }),
        delivery_attempt: match properties.counts_attempts {
            true => i32::try_from(message.delivery_attempt).unwrap_or(i32::MAX),
            false => 0,
        },
    }
}

/// The reason the gRPC API gives an ack id another node refused for good (the native answer
/// says why in words; Pub/Sub's answer names only the ack id).
const REFUSED_BY_ITS_NODE: &str = "refused by the node serving the subscription";

/// The ack ids a native acknowledgement or deadline change refused: transient when the leader
/// could not make the change durable (its reason says so), permanent otherwise.
pub fn failures(response: AckResponse) -> Vec<InvalidAckId> {
    response
        .invalid_ack_ids
        .into_iter()
        .map(|invalid| match invalid.reason == crate::subscription::acknowledge::NOT_DURABLE {
            true => InvalidAckId::transient(&invalid.ack_id, crate::subscription::acknowledge::NOT_DURABLE),
            false => InvalidAckId::new(&invalid.ack_id, REFUSED_BY_ITS_NODE),
        })
        .collect()
}

/// An acknowledgement (`seconds`: `None`) or a deadline change of `ack_ids`, as a native
/// request: its command, its body, and no wait.
pub fn acknowledge_request(
    subscription: &str,
    ack_ids: Vec<String>,
    seconds: Option<u32>,
) -> Result<(Command, FrameBuffer, Duration), Status> {
    let subscription = subscription.to_owned();
    let (command, body) = match seconds {
        None => (
            Command::Acknowledge,
            native_body(Command::Acknowledge, &AcknowledgeRequest { subscription, ack_ids })?,
        ),
        Some(ack_deadline_seconds) => (
            Command::ModifyAckDeadline,
            native_body(
                Command::ModifyAckDeadline,
                &ModifyAckDeadlineRequest { subscription, ack_ids, ack_deadline_seconds },
            )?,
        ),
    };
    Ok((command, body, Duration::ZERO))
}

/// Acknowledges (`seconds`: `None`) or changes the deadlines of `ack_ids` on a subscription
/// another node serves, carried from `shard`; `None` when it is served here now.
pub async fn acknowledge(
    shard: &ShardCaller<ForwarderShard>,
    presented: &Presented,
    subscription: &str,
    ack_ids: Vec<String>,
    seconds: Option<u32>,
) -> Result<Option<Vec<InvalidAckId>>, Status> {
    let (command, body, wait) = acknowledge_request(subscription, ack_ids, seconds)?;
    let resource = Resource::Subscription(subscription.to_owned());
    let Some(answer) = carry(shard, presented, resource, command, body, wait).await? else {
        return Ok(None);
    };
    Ok(Some(failures(decode_body::<AckResponse>(&answer)?)))
}

/// The relay of `shard`, which carries its calls to other nodes.
fn shard_relay(shard: &ForwarderShard) -> Result<std::rc::Rc<relay::Relay>, Status> {
    relay::of(shard.forwarder.global_shard())
        .ok_or_else(|| Status::unavailable("this node's forwarders carry no calls to other nodes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Code;
    use ringpost_wire::messages::InvalidAckId as NativeInvalidAckId;

    #[test]
    fn an_ack_id_the_serving_node_could_not_make_durable_stays_transient_and_the_rest_are_permanent() {
        let not_durable = crate::subscription::acknowledge::NOT_DURABLE;
        let response = AckResponse {
            invalid_ack_ids: vec![
                NativeInvalidAckId { ack_id: "1.2.3".into(), reason: not_durable.into() },
                NativeInvalidAckId { ack_id: "1.4.1".into(), reason: "ack id expired".into() },
            ],
        };
        let failures = failures(response);
        assert_eq!(failures.len(), 2);
        assert_eq!((failures[0].ack_id.as_str(), failures[0].permanent), ("1.2.3", false));
        assert_eq!(failures[0].reason, not_durable);
        assert_eq!((failures[1].ack_id.as_str(), failures[1].permanent), ("1.4.1", true));
    }

    #[test]
    fn a_call_too_large_for_a_native_frame_is_refused_not_encoded() {
        // A gRPC request may be as large as a frame (16 MiB); as a native request it may not fit.
        let ack_ids = vec!["x".repeat(1 << 20); 17];
        let refused = acknowledge_request("s", ack_ids, None).unwrap_err();
        assert_eq!(refused.code, Code::InvalidArgument);
        assert!(refused.message.contains("FRAME_BODY_BYTES_MAX"), "{refused}");
        let (command, body, wait) = acknowledge_request("s", vec!["1.2.3".into()], Some(30)).unwrap();
        assert_eq!((command, wait), (Command::ModifyAckDeadline, Duration::ZERO));
        let request = decode_body::<ModifyAckDeadlineRequest>(&body).unwrap();
        assert_eq!((request.ack_ids, request.ack_deadline_seconds), (vec!["1.2.3".to_owned()], 30));
    }
}
