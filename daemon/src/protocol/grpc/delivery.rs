//! Delivery: pull, acknowledge and modify ack deadline, on the subscription's forwarder
//! (streaming pull is `streaming`). Each runs as a job on that shard: it checks the caller's
//! permission there, calls the data plane (`api::data::DataPlane`), and turns what it returns
//! into owned prost messages before the answer leaves the shard, since a `Delivery` holds the
//! shard's own buffers.

use super::bridge::ShardCaller;
use super::credentials::Presented;
use super::gateway::{is_stale_route, ForwarderShard, Gateway, Resource, Serving};
use super::names;
use super::remote;
use super::streaming;
use crate::api::data::{DataPlane, Delivery, InvalidAckId, PullSettings};
use crate::api::limits::{ACK_ID_BYTES_MAX, MODIFY_ACK_DEADLINE_SECONDS_MAX, PULL_MESSAGES_MAX};
use crate::dispatch::Kind;
use crate::subscription::state::AckId;
use crate::subscription::SubscriptionEntry;
use ringpost_proto::pubsub;
use ringpost_wire::frame::decode_body;
use ringpost_wire::frame::FrameBuffer;
use ringpost_wire::messages::{AckResponse, PullRequest, PullResponse};
use ringpost_wire::Command;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

pub use streaming::{streaming_pull, ResponseStream};

/// How long a pull with `return_immediately: false` waits for a first message. Pub/Sub answers
/// such a pull with nothing after a while rather than hold it to the client's deadline; the
/// client libraries pull again. Below `PULL_WAIT_MS_MAX`, and short enough that a caller's
/// default deadline (60 s in the client libraries) never cuts it.
pub const GRPC_PULL_WAIT_MS: u32 = 10_000;

/// `google.rpc.ErrorInfo` of an exactly-once acknowledgement's failures, as Pub/Sub sends it and
/// its client libraries read it: the reason and domain, and per failed ack id one of the values
/// below (the libraries retry the ack ids whose value starts with `TRANSIENT_`).
pub const EXACTLY_ONCE_FAILURE_REASON: &str = "EXACTLY_ONCE_ACKID_FAILURE";
pub const EXACTLY_ONCE_FAILURE_DOMAIN: &str = "pubsub.googleapis.com";
pub const PERMANENT_FAILURE_INVALID_ACK_ID: &str = "PERMANENT_FAILURE_INVALID_ACK_ID";
/// The acknowledgement could not be made durable this time; asking again may succeed.
pub const TRANSIENT_FAILURE_NOT_DURABLE: &str = "TRANSIENT_FAILURE_NOT_DURABLE";

/// Pub/Sub's message when every ack id of an exactly-once request was refused for good.
const INVALID_ACK_IDS_MESSAGE: &str = "Some acknowledgement ids in the request were invalid. This could be \
     because the acknowledgement ids have expired or the acknowledgement ids were malformed.";

/// What every streaming response says of its subscription, read on its shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Properties {
    pub exactly_once: bool,
    pub ordered: bool,
    /// The subscription has a dead-letter policy, so a delivery says its attempt (Pub/Sub
    /// leaves it 0 otherwise).
    pub counts_attempts: bool,
}

impl Properties {
    pub fn of(entry: &SubscriptionEntry) -> Properties {
        Properties {
            exactly_once: entry.state.borrow().policy.exactly_once,
            ordered: entry.state.borrow().policy.ordered,
            counts_attempts: entry.dead_letter_topic.is_some(),
        }
    }

    pub fn to_proto(self) -> pubsub::streaming_pull_response::SubscriptionProperties {
        pubsub::streaming_pull_response::SubscriptionProperties {
            exactly_once_delivery_enabled: self.exactly_once,
            message_ordering_enabled: self.ordered,
        }
    }
}

/// The properties of `name` on this shard (`NotOwner` if it is not served here).
pub fn properties_on(shard: &ForwarderShard, name: &str) -> Result<Properties, crate::api::Status> {
    let (entry, _) = shard.forwarder.subscription(name)?;
    Ok(Properties::of(&entry))
}

/// What a delivery call came to: `work`'s answer on this node's shard, or the answer's body
/// from the node it was carried to.
pub enum Ran<R> {
    Here(R),
    Carried(FrameBuffer),
}

/// Runs `work` on this node's forwarder serving `name`, after checking there that the caller
/// may run an operation of `kind` on it; or, when another node serves it, carries `native`
/// there (`remote`: its command, body, and how long the leader may hold it by design). A stale
/// route (the subscription moved) is forgotten and asked once more.
pub async fn on_subscription_shard<R, F, Fut>(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    kind: Kind,
    work: F,
    native: (Command, FrameBuffer, Duration),
) -> Result<Ran<R>, Status>
where
    R: Send + 'static,
    F: FnOnce(Rc<ForwarderShard>) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = Result<R, crate::api::Status>> + 'static,
{
    let mut retried = false;
    let resource = Resource::Subscription(name.to_owned());
    loop {
        let result = match gateway.subscription_forwarder(presented, name, kind).await? {
            Serving::Here(caller) => {
                checked_call(caller, presented, name, kind, work.clone()).await.map(Ran::Here)
            }
            Serving::Elsewhere(caller) => {
                let (command, body, wait) = native.clone();
                let carried = resource.clone();
                remote::carry(caller, presented, carried, command, body, wait).await.and_then(|answer| {
                    let answer = answer.ok_or_else(|| {
                        crate::api::Status::new(
                            crate::api::Code::NotOwner,
                            "the subscription is served here now",
                        )
                    })?;
                    Ok(Ran::Carried(answer))
                })
            }
        };
        match result {
            Err(status) => {
                gateway.forget_if_stale(&resource, &status);
                if !is_stale_route(&status) || retried {
                    return Err(status.into());
                }
                retried = true;
            }
            Ok(ran) => return Ok(ran),
        }
    }
}

/// `work` on the shard of `caller`, once the caller's permission for `kind` is checked there.
pub async fn checked_call<R, F, Fut>(
    caller: &ShardCaller<ForwarderShard>,
    presented: &Presented,
    name: &str,
    kind: Kind,
    work: F,
) -> Result<R, crate::api::Status>
where
    R: Send + 'static,
    F: FnOnce(Rc<ForwarderShard>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<R, crate::api::Status>> + 'static,
{
    let (presented, name) = (presented.clone(), name.to_owned());
    caller
        .try_call(move |shard| async move {
            presented.check(&shard.access, kind, &name)?;
            work(shard).await
        })
        .await
}

/// A delivery as Pub/Sub's received messages, copied out of the shard's buffers.
pub fn received_messages<B: AsRef<[u8]>>(
    delivery: &Delivery<B>,
    properties: Properties,
) -> Vec<pubsub::ReceivedMessage> {
    delivery
        .messages
        .iter()
        .map(|message| {
            let view = delivery.view(message);
            pubsub::ReceivedMessage {
                ack_id: view.ack_id.to_owned(),
                message: Some(pubsub::PubsubMessage {
                    data: prost::bytes::Bytes::copy_from_slice(view.data),
                    attributes: view
                        .attributes
                        .map(|(key, value)| (key.to_owned(), value.to_owned()))
                        .collect(),
                    message_id: view.message_id.to_string(),
                    publish_time: Some(timestamp(view.publish_time_ms)),
                    ordering_key: view.ordering_key.to_owned(),
                }),
                delivery_attempt: match properties.counts_attempts {
                    true => i32::try_from(view.delivery_attempt).unwrap_or(i32::MAX),
                    false => 0,
                },
            }
        })
        .collect()
}

pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

pub async fn pull(
    gateway: &Gateway,
    request: Request<pubsub::PullRequest>,
) -> Result<Response<pubsub::PullResponse>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let name = names::parse("subscription", names::Kind::Subscription, &request.subscription)?.name;
    let settings = pull_settings(&request)?;
    let resource = Resource::Subscription(name.clone());
    if let Some(gathered) = gateway.gathered(&presented, &resource, Kind::Pull).await? {
        let received_messages = super::sources::pull(gateway, &presented, &name, settings, gathered).await?;
        return Ok(Response::new(pubsub::PullResponse { received_messages }));
    }
    let subscription = name.clone();
    let work = move |shard: Rc<ForwarderShard>| async move {
        let delivery = shard.forwarder.pull(&subscription, settings).await?;
        // Read after the pull, so that a policy changed while it waited is the one answered.
        let properties = properties_on(&shard, &subscription)?;
        Ok(delivery.map(|delivery| received_messages(&delivery, properties)).unwrap_or_default())
    };
    let native = PullRequest {
        subscription: name.clone(),
        max_messages: settings.max_messages as u32,
        wait_ms: settings.wait.as_millis() as u32,
    };
    let native = (Command::Pull, remote::native_body(Command::Pull, &native)?, settings.wait);
    let received_messages =
        match on_subscription_shard(gateway, &presented, &name, Kind::Pull, work, native).await? {
            Ran::Here(received_messages) => received_messages,
            Ran::Carried(answer) => {
                let response = decode_body::<PullResponse>(&answer).map_err(crate::api::Status::from)?;
                remote::received_messages(&response, remote::properties(gateway, &name).await?)
            }
        };
    Ok(Response::new(pubsub::PullResponse { received_messages }))
}

/// Pub/Sub's pull: `max_messages` must be positive (a larger one than Ringpost answers is
/// capped, as Pub/Sub caps it); `return_immediately` waits for nothing. That field is
/// deprecated in the proto, yet clients still send it, so it is honoured.
#[allow(deprecated)]
fn pull_settings(request: &pubsub::PullRequest) -> Result<PullSettings, Status> {
    if request.max_messages <= 0 {
        return Err(Status::invalid_argument(format!(
            "max_messages is {}; it must be positive",
            request.max_messages
        )));
    }
    let max_messages = (request.max_messages as u32).min(PULL_MESSAGES_MAX);
    let wait_ms = if request.return_immediately { 0 } else { GRPC_PULL_WAIT_MS };
    Ok(PullSettings::new(max_messages, wait_ms)?)
}

pub async fn acknowledge(
    gateway: &Gateway,
    request: Request<pubsub::AcknowledgeRequest>,
) -> Result<Response<()>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let name = names::parse("subscription", names::Kind::Subscription, &request.subscription)?.name;
    let ack_ids = request.ack_ids;
    let (properties, failures) = acknowledge_on_shard(gateway, &presented, &name, ack_ids.clone()).await?;
    ack_outcome(properties, &ack_ids, failures)?;
    Ok(Response::new(()))
}

/// Acknowledges `ack_ids` on the subscription's shard; the subscription's properties and the
/// ack ids refused.
pub async fn acknowledge_on_shard(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    ack_ids: Vec<String>,
) -> Result<(Properties, Vec<InvalidAckId>), Status> {
    let resource = Resource::Subscription(name.to_owned());
    if let Some(gathered) = gateway.gathered(presented, &resource, Kind::Acknowledge).await? {
        return super::sources::settle(gateway, presented, name, &gathered, &ack_ids, (None, None)).await;
    }
    let subscription = name.to_owned();
    let sent = ack_ids.clone();
    let work = move |shard: Rc<ForwarderShard>| async move {
        let properties = properties_on(&shard, &subscription)?;
        let failures = shard.forwarder.acknowledge(&subscription, ack_ids.iter().map(String::as_str)).await?;
        Ok((properties, failures))
    };
    let native = remote::acknowledge_request(name, sent, None)?;
    match on_subscription_shard(gateway, presented, name, Kind::Acknowledge, work, native).await? {
        Ran::Here(answer) => Ok(answer),
        Ran::Carried(answer) => carried_acknowledged(gateway, name, &answer).await,
    }
}

pub async fn modify_ack_deadline(
    gateway: &Gateway,
    request: Request<pubsub::ModifyAckDeadlineRequest>,
) -> Result<Response<()>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let name = names::parse("subscription", names::Kind::Subscription, &request.subscription)?.name;
    let seconds = deadline_seconds(request.ack_deadline_seconds)?;
    let ack_ids = request.ack_ids;
    let (properties, failures) =
        modify_on_shard(gateway, &presented, &name, ack_ids.clone(), seconds).await?;
    ack_outcome(properties, &ack_ids, failures)?;
    Ok(Response::new(()))
}

/// Changes the deadlines of `ack_ids` on the subscription's shard, as `acknowledge_on_shard`.
pub async fn modify_on_shard(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    ack_ids: Vec<String>,
    seconds: u32,
) -> Result<(Properties, Vec<InvalidAckId>), Status> {
    let resource = Resource::Subscription(name.to_owned());
    if let Some(gathered) = gateway.gathered(presented, &resource, Kind::ModifyAckDeadline).await? {
        return super::sources::settle(gateway, presented, name, &gathered, &ack_ids, (Some(seconds), None))
            .await;
    }
    let subscription = name.to_owned();
    let sent = ack_ids.clone();
    let work = move |shard: Rc<ForwarderShard>| async move {
        let properties = properties_on(&shard, &subscription)?;
        let failures = shard
            .forwarder
            .modify_ack_deadline(&subscription, ack_ids.iter().map(String::as_str), seconds)
            .await?;
        Ok((properties, failures))
    };
    let native = remote::acknowledge_request(name, sent, Some(seconds))?;
    match on_subscription_shard(gateway, presented, name, Kind::ModifyAckDeadline, work, native).await? {
        Ran::Here(answer) => Ok(answer),
        Ran::Carried(answer) => carried_acknowledged(gateway, name, &answer).await,
    }
}

/// What the node an acknowledgement or deadline change was carried to answered, with the
/// subscription's properties as this node's catalog holds them.
async fn carried_acknowledged(
    gateway: &Gateway,
    name: &str,
    answer: &[u8],
) -> Result<(Properties, Vec<InvalidAckId>), Status> {
    let response = decode_body::<AckResponse>(answer).map_err(crate::api::Status::from)?;
    Ok((remote::properties(gateway, name).await?, remote::failures(response)))
}

/// A deadline change's seconds: 0 (give the message back now) to Pub/Sub's 600.
pub fn deadline_seconds(seconds: i32) -> Result<u32, Status> {
    u32::try_from(seconds).ok().filter(|&seconds| seconds <= MODIFY_ACK_DEADLINE_SECONDS_MAX).ok_or_else(
        || {
            Status::invalid_argument(format!(
                "ack_deadline_seconds is {seconds}; it must be 0 to {MODIFY_ACK_DEADLINE_SECONDS_MAX}"
            ))
        },
    )
}

/// Why an ack id could never be one this daemon handed out (malformed, or of a later format
/// version), if it could not.
pub fn malformed(ack_id: &str) -> Option<&'static str> {
    AckId::parse(ack_id).err().map(|refusal| refusal.reason())
}

/// What the caller of Acknowledge or ModifyAckDeadline is told of the ack ids refused.
///
/// Without exactly-once delivery, Pub/Sub ignores unknown and expired ack ids, refuses the
/// request when one is malformed (`INVALID_ARGUMENT`), and a refusal that may pass on a retry
/// (the acknowledgement was not made durable) is `UNAVAILABLE`, which the client libraries
/// retry whole.
///
/// With it, each refused ack id is named in a `google.rpc.ErrorInfo`, permanent or transient,
/// as the client libraries read it (google-cloud-pubsub's `_get_ack_errors` and
/// `_process_requests`): they fail the permanent ones, retry the transient ones, and decide the
/// ack ids the ErrorInfo does not name by the status code. So when every ack id was refused
/// for good, the code is Pub/Sub's `INVALID_ARGUMENT` (nothing is left for the code to
/// decide); otherwise it is `ABORTED`, which the libraries retry (and their default retry
/// settings do not retry the whole request for): the ack ids that succeeded succeed again,
/// since an acknowledged message acknowledges again without error, instead of being reported
/// as failed, which `INVALID_ARGUMENT` would make them.
pub fn ack_outcome(
    properties: Properties,
    requested: &[String],
    failures: Vec<InvalidAckId>,
) -> Result<(), Status> {
    if failures.is_empty() {
        return Ok(());
    }
    if !properties.exactly_once {
        if let Some((ack_id, reason)) = requested.iter().find_map(|ack_id| Some((ack_id, malformed(ack_id)?)))
        {
            let shown: String = ack_id.chars().take(ACK_ID_BYTES_MAX).collect();
            return Err(Status::invalid_argument(format!(
                "You have passed an invalid ack ID to the service (ack_id={shown}): {reason}."
            )));
        }
        if let Some(transient) = failures.iter().find(|failure| !failure.permanent) {
            return Err(Status::unavailable(format!(
                "acknowledgements were not made durable ({}); retry",
                transient.reason
            )));
        }
        return Ok(());
    }
    Err(exactly_once_failure(requested, &failures))
}

/// The status of an exactly-once request some of whose ack ids were refused (`ack_outcome`).
pub fn exactly_once_failure(requested: &[String], failures: &[InvalidAckId]) -> Status {
    let metadata: HashMap<String, String> = failures
        .iter()
        .map(|failure| {
            let value = if failure.permanent {
                PERMANENT_FAILURE_INVALID_ACK_ID
            } else {
                TRANSIENT_FAILURE_NOT_DURABLE
            };
            (failure.ack_id.clone(), value.to_owned())
        })
        .collect();
    // Refused ack ids are cut to `ACK_ID_BYTES_MAX` characters; so are the requested ones here.
    let requested: BTreeSet<String> =
        requested.iter().map(|ack_id| ack_id.chars().take(ACK_ID_BYTES_MAX).collect()).collect();
    let every_one_permanent = failures.iter().all(|failure| failure.permanent)
        && requested.iter().all(|ack_id| metadata.contains_key(ack_id));
    let details =
        ErrorDetails::with_error_info(EXACTLY_ONCE_FAILURE_REASON, EXACTLY_ONCE_FAILURE_DOMAIN, metadata);
    match every_one_permanent {
        true => Status::with_error_details(tonic::Code::InvalidArgument, INVALID_ACK_IDS_MESSAGE, details),
        false => Status::with_error_details(
            tonic::Code::Aborted,
            "Some acknowledgement ids in the request failed; the ErrorInfo names them (PERMANENT_: \
             expired, unknown or malformed; TRANSIENT_: retry them). The others succeeded, and \
             succeed again if retried.",
            details,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXACTLY_ONCE: Properties =
        Properties { exactly_once: true, ordered: false, counts_attempts: false };

    fn ids(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    #[test]
    fn without_exactly_once_unknown_and_expired_ack_ids_are_ignored_and_malformed_ones_refused() {
        let properties = Properties::default();
        let expired = vec![InvalidAckId::new("1.2.3", "ack id expired")];
        assert!(ack_outcome(properties, &ids(&["1.2.3", "1.4.1"]), expired).is_ok());
        let malformed = vec![InvalidAckId::new("nonsense", "malformed ack id")];
        let status = ack_outcome(properties, &ids(&["1.2.3", "nonsense"]), malformed).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("(ack_id=nonsense)"), "{}", status.message());
        let transient = vec![InvalidAckId::transient("1.2.3", "journal write failed")];
        assert_eq!(
            ack_outcome(properties, &ids(&["1.2.3"]), transient).unwrap_err().code(),
            tonic::Code::Unavailable
        );
    }

    #[test]
    fn exactly_once_failures_name_each_ack_id_in_an_error_info_as_the_client_libraries_read_it() {
        let failures = vec![InvalidAckId::new("1.2.3", "ack id expired")];
        let status = ack_outcome(EXACTLY_ONCE, &ids(&["1.2.3"]), failures).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), INVALID_ACK_IDS_MESSAGE);
        // The first detail is the ErrorInfo (`_get_ack_errors` reads only the first).
        let details = status.get_error_details_vec();
        let Some(tonic_types::ErrorDetail::ErrorInfo(info)) = details.first() else {
            panic!("the first detail is not an ErrorInfo: {details:?}")
        };
        assert_eq!(info.reason, EXACTLY_ONCE_FAILURE_REASON);
        assert_eq!(info.domain, EXACTLY_ONCE_FAILURE_DOMAIN);
        assert_eq!(info.metadata.get("1.2.3").map(String::as_str), Some(PERMANENT_FAILURE_INVALID_ACK_ID));
        assert_eq!(info.metadata.len(), 1);
    }

    #[test]
    fn exactly_once_partial_or_transient_failures_are_aborted_so_the_rest_is_retried_not_failed() {
        let failures = vec![InvalidAckId::new("1.2.3", "ack id expired")];
        let status = ack_outcome(EXACTLY_ONCE, &ids(&["1.2.3", "1.4.1"]), failures).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Aborted);
        let failures = vec![InvalidAckId::transient("1.4.1", "journal write failed")];
        let status = ack_outcome(EXACTLY_ONCE, &ids(&["1.4.1"]), failures).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Aborted);
        let info = status.get_details_error_info().expect("an ErrorInfo");
        assert_eq!(info.metadata.get("1.4.1").map(String::as_str), Some(TRANSIENT_FAILURE_NOT_DURABLE));
        assert!(TRANSIENT_FAILURE_NOT_DURABLE.starts_with("TRANSIENT_"));
    }

    #[test]
    fn deadline_seconds_are_zero_to_six_hundred() {
        assert_eq!(deadline_seconds(0).unwrap(), 0);
        assert_eq!(deadline_seconds(600).unwrap(), 600);
        assert_eq!(deadline_seconds(-1).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(deadline_seconds(601).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    #[allow(deprecated)]
    fn pulls_need_a_positive_max_messages_and_larger_ones_are_capped() {
        let request = |max_messages, return_immediately| pubsub::PullRequest {
            subscription: "projects/p/subscriptions/s".into(),
            return_immediately,
            max_messages,
        };
        assert_eq!(pull_settings(&request(0, false)).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(pull_settings(&request(-3, false)).unwrap_err().code(), tonic::Code::InvalidArgument);
        let settings = pull_settings(&request(5000, true)).unwrap();
        assert_eq!(settings.max_messages, PULL_MESSAGES_MAX as usize);
        assert!(settings.wait.is_zero());
        assert_eq!(pull_settings(&request(1, false)).unwrap().wait.as_millis(), GRPC_PULL_WAIT_MS as u128);
    }
}
