//! A topic of several publish sources over gRPC: Google's clients know one topic and one
//! subscription, so the gateway spreads a publish over the topic's sources and gathers a pull's
//! or an acknowledgement's over the subscription's, each source where it is led
//! (`Gateway::gathered`; StreamingPull's gathering is `streaming`'s): on a forwarder shard of
//! this node, one hop; on another node, carried there by a shard of this node's relay to the
//! forwarder leading it (`Relay::carry_to`) as the native request the gateway would send for
//! source 0, which that forwarder serves with the topic's one unit on its shard.
//!
//! A message with an ordering key goes to its key's source (`ringpost_model::sources::
//! source_of_key` over the active sources), so one key's messages are in one source and its
//! order is that source's. A request's unordered messages go together to the source the
//! gateway's turn names (one request to one source, the turn moving each request). A request
//! mixing keys is split by source (Pub/Sub takes such a request; Google's publishers batch by
//! key and never send one) and checked whole first, so that a bad message refuses all of it
//! before any part is stored. A source that answers `NotOwner` (the sources changed) has its
//! messages sent again by the sources looked up anew, `GRPC_PUBLISH_SPREAD_ATTEMPTS_MAX`
//! rounds in all.
//!
//! A pull asks the sources in turn, starting where the gateway's turn says (so no source is
//! always asked last), until it has `max_messages` or asked each. An empty subscription's pull
//! waits on one source for `GRPC_PULL_GATHER_SLICE_MS` and then asks the others at once, the
//! source waited on turning each slice, until the pull's wait is over: a pull waiting on every
//! source at once could be answered by several, leasing more than `max_messages` or leasing
//! messages nobody would be sent, so one shard waits at a time and a message on another
//! source is seen within a slice.

use super::bridge::ShardCaller;
use super::credentials::Presented;
use super::delivery::{checked_call, properties_on, received_messages, Properties};
use super::gateway::{is_stale_route, ForwarderShard, Gateway, Gathered, Place, Resource};
use super::publisher::{OwnedMessage, OwnedPublish};
use super::remote;
use crate::api::data::{DataError, DataPlane, InvalidAckId, PublishBatch, PullSettings};
use crate::api::Status as DomainStatus;
use crate::dispatch::Kind;
use crate::subscription::state::AckId;
use ringpost_model::sources::source_of_key;
use ringpost_proto::pubsub;
use ringpost_wire::frame::decode_body;
use ringpost_wire::messages::{
    AckResponse, PublishResponse, PullRequest as NativePullRequest, PullResponse as NativePullResponse,
};
use ringpost_wire::Command as WireCommand;
use std::collections::BTreeMap;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Status;

/// Rounds a spread publish takes: after a source's `NotOwner` its messages go again by the
/// sources looked up anew. Sources change seldom (a count set by hand, or load following's
/// minutes), so a third refusal in a row means they are moving now; the client's retry of
/// `UNAVAILABLE` covers it.
pub const GRPC_PUBLISH_SPREAD_ATTEMPTS_MAX: usize = 3;

/// How long a gathered pull waits on one source before asking the others: the longest a
/// message on another source of an empty subscription waits for a waiting pull. Each slice
/// costs one job per source, five a second.
pub const GRPC_PULL_GATHER_SLICE_MS: u64 = 200;

/// A publish of `batch` spread over the sources of `gathered`: the message ids in the
/// request's order.
pub async fn publish(
    gateway: &Gateway,
    presented: &Presented,
    batch: OwnedPublish,
    mut gathered: Arc<Gathered>,
) -> Result<Vec<String>, Status> {
    if batch.messages.is_empty() {
        return Err(
            DomainStatus::from(DataError::InvalidArgument("publish request has no messages".into())).into()
        );
    }
    batch.check()?;
    let OwnedPublish { topic, messages } = batch;
    let resource = Resource::Topic(topic.clone());
    let mut ids: Vec<Option<u64>> = vec![None; messages.len()];
    let mut pending: Vec<(usize, OwnedMessage)> = messages.into_iter().enumerate().collect();
    for _round in 0..GRPC_PUBLISH_SPREAD_ATTEMPTS_MAX {
        let mut refused = Vec::new();
        for (source, (indexes, messages)) in split(pending, &gathered, gateway.next_turn()) {
            let place = &gathered.places[source as usize];
            let part = OwnedPublish { topic: topic.clone(), messages };
            let published = match publish_at(gateway, place, presented, part).await {
                Ok(published) => published,
                Err(status) => {
                    gateway.forget_if_stale(&resource, &status);
                    return Err(status.into());
                }
            };
            match published {
                Ok(published) => {
                    if published.len() != indexes.len() {
                        return Err(Status::internal(format!(
                            "source {source} answered {} message ids for {} messages",
                            published.len(),
                            indexes.len()
                        )));
                    }
                    for (index, id) in indexes.into_iter().zip(published) {
                        ids[index] = Some(id);
                    }
                }
                Err(returned) => refused.extend(indexes.into_iter().zip(returned.messages)),
            }
        }
        pending = refused;
        if pending.is_empty() {
            return Ok(ids.into_iter().map(|id| id.expect("every message published").to_string()).collect());
        }
        gateway.forget(&resource);
        gathered = match gateway.gathered(presented, &resource, Kind::Publish).await? {
            Some(fresh) => fresh,
            None => break,
        };
    }
    Err(Status::unavailable(format!("topic '{topic}': its sources changed while it was published to; retry")))
}

/// `pending` messages by the source each goes to: its key's, or, unordered, the one `turn`
/// names among the active sources.
fn split(
    pending: Vec<(usize, OwnedMessage)>,
    gathered: &Gathered,
    turn: usize,
) -> BTreeMap<u32, (Vec<usize>, Vec<OwnedMessage>)> {
    let active = gathered.active.max(1);
    let unordered = (turn % active as usize) as u32;
    let mut groups: BTreeMap<u32, (Vec<usize>, Vec<OwnedMessage>)> = BTreeMap::new();
    for (index, message) in pending {
        let source = match message.ordering_key.is_empty() {
            true => unordered,
            false => source_of_key(message.ordering_key.as_bytes(), active),
        };
        let group = groups.entry(source).or_default();
        group.0.push(index);
        group.1.push(message);
    }
    groups
}

/// A publish's messages lent to the shard's publish, so that they come back to be sent
/// elsewhere when the source refuses them as not its own.
struct Lent(Rc<OwnedPublish>);

impl PublishBatch for Lent {
    fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = crate::api::data::MessageView<'_>>),
    ) -> Result<(), DataError> {
        self.0.visit(visit)
    }

    fn checked_against_schema(&self) -> bool {
        self.0.checked_against_schema()
    }
}

/// Publishes `part` on the source served at `place`: its message ids, or the messages back
/// when the source refuses them as not its own (`NotOwner`: the sources changed).
async fn publish_at(
    gateway: &Gateway,
    place: &Place,
    presented: &Presented,
    part: OwnedPublish,
) -> Result<Result<Vec<u64>, OwnedPublish>, DomainStatus> {
    let (owner, carrier) = match place {
        Place::Here(shard) => {
            let published = publish_on(&gateway.forwarders[*shard], presented, part).await?;
            return Ok(published.map(|ids| ids.collect()));
        }
        Place::Elsewhere { owner, carrier } => (owner, &gateway.forwarders[*carrier]),
    };
    let body = remote::native_body(WireCommand::Publish, &part.native())?;
    let carried =
        remote::carry_to(carrier, presented, owner.clone(), WireCommand::Publish, body, Duration::ZERO);
    match carried.await {
        Ok(answer) => Ok(Ok(decode_body::<PublishResponse>(&answer)?.message_ids)),
        Err(status) if is_stale_route(&status) => Ok(Err(part)),
        Err(status) => Err(status),
    }
}

/// Publishes `part` on `shard`, which leads one of its topic's sources: its message ids, or
/// the messages back when the source refuses them as not its own (`NotOwner`).
async fn publish_on(
    shard: &ShardCaller<ForwarderShard>,
    presented: &Presented,
    part: OwnedPublish,
) -> Result<Result<Range<u64>, OwnedPublish>, DomainStatus> {
    let presented = presented.clone();
    shard
        .try_call(move |shard| async move {
            presented.check(&shard.access, Kind::Publish, &part.topic)?;
            let part = Rc::new(part);
            let published = shard.forwarder.publish(Lent(part.clone())).await;
            match published {
                Ok(ids) => Ok(Ok(ids)),
                Err(error) if error.is_not_owner() => match Rc::try_unwrap(part) {
                    Ok(part) => Ok(Err(part)),
                    Err(_) => Err(error.into()),
                },
                Err(error) => Err(error.into()),
            }
        })
        .await
}

/// A unary pull of up to `settings.max_messages` gathered over the subscription's sources.
pub async fn pull(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    settings: PullSettings,
    gathered: Arc<Gathered>,
) -> Result<Vec<pubsub::ReceivedMessage>, Status> {
    let give_up_at = Instant::now() + settings.wait;
    let start = gateway.next_turn();
    let mut received = Vec::new();
    for round in 0.. {
        for (step, (_source, place)) in gathered.rotated(start + round).enumerate() {
            let wanted = settings.max_messages - received.len();
            if wanted == 0 {
                break;
            }
            // Only the first source of a round waits, and only once one round found nothing.
            let left = give_up_at.saturating_duration_since(Instant::now());
            let wait = match (round, step) {
                (0, _) | (_, 1..) => Duration::ZERO,
                _ => left.min(Duration::from_millis(GRPC_PULL_GATHER_SLICE_MS)),
            };
            let asked = PullSettings { max_messages: wanted, wait };
            match pull_on(gateway, presented, name, place, asked).await {
                Ok(pulled) => received.extend(pulled),
                // What other sources leased is answered rather than left to its deadline; the
                // refusal comes again at the next pull.
                Err(_) if !received.is_empty() => return Ok(received),
                Err(status) => return Err(status),
            }
        }
        if !received.is_empty() || Instant::now() >= give_up_at {
            return Ok(received);
        }
    }
    unreachable!("the rounds end at the pull's wait")
}

/// A pull on one of the subscription's sources, where `place` says it is served; a source
/// that is not served there any more forgets the sources and is refused as unavailable (the
/// client retries).
async fn pull_on(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    place: &Place,
    settings: PullSettings,
) -> Result<Vec<pubsub::ReceivedMessage>, Status> {
    let subscription = name.to_owned();
    let pulled = match place {
        Place::Here(shard) => {
            let work = move |shard: Rc<ForwarderShard>| async move {
                let delivery = shard.forwarder.pull(&subscription, settings).await?;
                let properties = properties_on(&shard, &subscription)?;
                Ok(delivery.map(|delivery| received_messages(&delivery, properties)).unwrap_or_default())
            };
            checked_call(&gateway.forwarders[*shard], presented, name, Kind::Pull, work).await
        }
        Place::Elsewhere { owner, carrier } => {
            let native = NativePullRequest {
                subscription,
                max_messages: settings.max_messages as u32,
                wait_ms: settings.wait.as_millis() as u32,
            };
            let body = remote::native_body(WireCommand::Pull, &native)?;
            let carrier = &gateway.forwarders[*carrier];
            let owner = owner.clone();
            match remote::carry_to(carrier, presented, owner, WireCommand::Pull, body, settings.wait).await {
                Ok(answer) => match decode_body::<NativePullResponse>(&answer) {
                    Ok(response) => {
                        let properties = remote::properties(gateway, name).await?;
                        Ok(remote::received_messages(&response, properties))
                    }
                    Err(error) => Err(DomainStatus::from(error)),
                },
                Err(status) => Err(status),
            }
        }
    };
    pulled.map_err(|status| moved(gateway, name, status))
}

/// A source's refusal as the client hears it: a source that moved makes the gateway look the
/// sources up again, and the client retry.
pub fn moved(gateway: &Gateway, name: &str, status: DomainStatus) -> Status {
    let resource = Resource::Subscription(name.to_owned());
    gateway.forget_if_stale(&resource, &status);
    if is_stale_route(&status) {
        return Status::unavailable(format!("subscription '{name}': its sources moved; retry"));
    }
    status.into()
}

/// `ack_ids` by the source each names; one that names none of the subscription's sources (or
/// is malformed) goes with source 0's, which refuses it as a single source always has.
pub fn by_source(ack_ids: &[String], sources: usize) -> BTreeMap<usize, Vec<String>> {
    let mut groups: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for ack_id in ack_ids {
        let source = AckId::parse(ack_id)
            .ok()
            .map(|parsed| parsed.source.get() as usize)
            .filter(|&source| source < sources)
            .unwrap_or(0);
        groups.entry(source).or_default().push(ack_id.clone());
    }
    groups
}

/// Acknowledges (`seconds`: `None`) or changes the deadlines of `ack_ids`, each on the source
/// its ack id names: the subscription's properties and every source's refusals together. A
/// source on this node says the properties; when none did, they are `known` (a stream's, read
/// when it opened), else read from this node's catalog.
pub async fn settle(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    gathered: &Gathered,
    ack_ids: &[String],
    (seconds, known): (Option<u32>, Option<Properties>),
) -> Result<(Properties, Vec<InvalidAckId>), Status> {
    let mut properties: Option<Properties> = None;
    let mut failures = Vec::new();
    for (source, ack_ids) in by_source(ack_ids, gathered.places.len()) {
        let (settled, refused) =
            settle_on(gateway, presented, name, &gathered.places[source], ack_ids, seconds)
                .await
                .map_err(|status| moved(gateway, name, status))?;
        properties = properties.or(settled);
        failures.extend(refused);
    }
    let properties = match properties.or(known) {
        Some(properties) => properties,
        None if ack_ids.is_empty() => Properties::default(),
        // Every source settled on another node, which does not say them.
        None => remote::properties(gateway, name).await?,
    };
    Ok((properties, failures))
}

/// `settle` on one source, where `place` says it is served: the subscription's properties
/// (when served here) and the ack ids refused.
async fn settle_on(
    gateway: &Gateway,
    presented: &Presented,
    name: &str,
    place: &Place,
    ack_ids: Vec<String>,
    seconds: Option<u32>,
) -> Result<(Option<Properties>, Vec<InvalidAckId>), DomainStatus> {
    let kind = if seconds.is_some() { Kind::ModifyAckDeadline } else { Kind::Acknowledge };
    let (owner, carrier) = match place {
        Place::Here(shard) => {
            let subscription = name.to_owned();
            let work = move |shard: Rc<ForwarderShard>| async move {
                let properties = properties_on(&shard, &subscription)?;
                let ids = ack_ids.iter().map(String::as_str);
                let failures = match seconds {
                    None => shard.forwarder.acknowledge(&subscription, ids).await?,
                    Some(seconds) => shard.forwarder.modify_ack_deadline(&subscription, ids, seconds).await?,
                };
                Ok((Some(properties), failures))
            };
            return checked_call(&gateway.forwarders[*shard], presented, name, kind, work).await;
        }
        Place::Elsewhere { owner, carrier } => (owner.clone(), &gateway.forwarders[*carrier]),
    };
    let (command, body, wait) = remote::acknowledge_request(name, ack_ids, seconds)?;
    let answer = remote::carry_to(carrier, presented, owner, command, body, wait).await?;
    Ok((None, remote::failures(decode_body::<AckResponse>(&answer)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_ids_go_to_the_source_they_name_and_others_to_source_zero() {
        let ack_ids: Vec<String> = ["v1.7.0.10.1", "v1.7.1.4.1", "v1.7.1.5.2", "v1.7.5.1.1", "nonsense"]
            .iter()
            .map(|id| id.to_string())
            .collect();
        let groups = by_source(&ack_ids, 2);
        assert_eq!(groups[&0], vec!["v1.7.0.10.1", "v1.7.5.1.1", "nonsense"]);
        assert_eq!(groups[&1], vec!["v1.7.1.4.1", "v1.7.1.5.2"]);
    }

    #[test]
    fn keyed_messages_go_to_their_keys_source_and_unordered_ones_together_to_the_turns() {
        let message = |key: &str| pubsub::PubsubMessage { ordering_key: key.into(), ..Default::default() };
        let keys: Vec<String> = (0..40).map(|index| format!("key-{index}")).collect();
        let mut messages: Vec<_> = keys.iter().map(|key| message(key)).collect();
        messages.extend((0..5).map(|_| message("")));
        let batch = OwnedPublish::new("t".into(), messages);
        let gathered = Gathered { active: 2, places: vec![Place::Here(1), Place::Here(0)] };
        for turn in [0, 1, 7] {
            assert!(split(Vec::new(), &gathered, turn).is_empty());
        }
        let pending: Vec<_> = batch.messages.into_iter().enumerate().collect();
        let groups = split(pending, &gathered, 3);
        assert_eq!(groups.len(), 2, "forty keys over two sources use both");
        let mut seen = 0;
        for (source, (indexes, messages)) in &groups {
            for (index, message) in indexes.iter().zip(messages) {
                let expected = match message.ordering_key.is_empty() {
                    true => 1, // turn 3 of 2 active sources
                    false => source_of_key(keys[*index].as_bytes(), 2),
                };
                assert_eq!(*source, expected, "message {index}");
                seen += 1;
            }
        }
        assert_eq!(seen, 45);
        // A source not active (retiring) takes none: keys map over the active ones only.
        let retiring = Gathered { active: 1, places: vec![Place::Here(0), Place::Here(1)] };
        let pending: Vec<_> = OwnedPublish::new("t".into(), keys.iter().map(|key| message(key)).collect())
            .messages
            .into_iter()
            .enumerate()
            .collect();
        assert_eq!(split(pending, &retiring, 1).keys().copied().collect::<Vec<_>>(), vec![0]);
    }
}
