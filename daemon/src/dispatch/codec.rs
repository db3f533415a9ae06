//! An operation as it crosses to another node, with its principal, and the answer that comes
//! back, in the daemon's own encoding (`crate::codec`). The bytes come from the network, so a
//! decode holds for any input: it never panics, and refuses what is cut or left over.
//!
//! An operation's kind is its place in `Kind::ALL` and a status code its place in `Code::ALL`;
//! both lists only grow at their end. The first byte is the format, so that a node of another
//! version is told apart from damage.

use super::{Carried, Kind, MessageCheck, Operation, Outcome, SubscriptionShown};
use crate::api::control::{
    Labels, ListRequest, SeekTarget, Snapshot, Subscription, SubscriptionUpdate, Topic, TopicUpdate,
};
use crate::api::{Code, Status};
use crate::auth::Principal;
use crate::catalog::entry::{
    decode_optional_push, decode_whole_settings, encode_optional_push, encode_whole_settings, names_a_project,
};
use crate::catalog::routing::{Cidr, ClientSelector, RoutingRule};
use crate::catalog::schemas::{SchemaEncoding, SchemaSettings, SchemaType};
use crate::catalog::SourceBounds;
use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::{NodeId, ShardId, SOURCES_PER_TOPIC_MAX};

/// The format of a carried operation and of its answer. 2: a subscription's settings end with
/// its push configuration (`encode_whole_settings`). 3: as 2, with each push configuration's
/// project after it; written only when one names a project other than the default, so that
/// everything else is byte for byte what a node of the version before the project reads, and
/// what names another project is refused by that node as another version's rather than pushed
/// in the wrong project.
const FORMAT_PUSH: u8 = 2;
const FORMAT_PUSH_PROJECT: u8 = 3;

const PRINCIPAL_ANONYMOUS: u8 = 0;
const PRINCIPAL_NAMED: u8 = 1;

const OUTCOME_DONE: u8 = 0;
const OUTCOME_TOPIC: u8 = 1;
const OUTCOME_SUBSCRIPTION: u8 = 2;
const OUTCOME_SNAPSHOT: u8 = 3;

const SEEK_TIME: u8 = 0;
const SEEK_SNAPSHOT: u8 = 1;

const SELECTOR_PRINCIPAL: u8 = 0;
const SELECTOR_FROM: u8 = 1;

/// `operation`, to be run for `principal` on another node.
pub fn encode_carried(principal: &Principal, operation: &Operation) -> Vec<u8> {
    let projects = operation_names_a_project(operation);
    let mut encoder = Encoder::new(if projects { FORMAT_PUSH_PROJECT } else { FORMAT_PUSH });
    match principal {
        Principal::Anonymous => encoder.u8(PRINCIPAL_ANONYMOUS),
        Principal::Named(name) => encoder.u8(PRINCIPAL_NAMED).str(name),
    };
    encode_operation(&mut encoder, operation, projects);
    encoder.0
}

pub fn decode_carried(bytes: &[u8]) -> Result<(Principal, Operation), String> {
    let mut decoder = Decoder::new(bytes);
    let projects = format(&mut decoder, "a carried operation")?;
    let decoded = (|| {
        let principal = match decoder.u8()? {
            PRINCIPAL_ANONYMOUS => Principal::Anonymous,
            PRINCIPAL_NAMED => Principal::Named(decoder.str()?.into()),
            _ => return Err("unknown principal kind"),
        };
        let operation = decode_operation(&mut decoder, projects)?;
        Ok((principal, operation))
    })();
    let decoded = decoded.map_err(str::to_owned)?;
    whole(&decoder)?;
    Ok(decoded)
}

/// Another node's answer: how far it applied the catalog, and the outcome or its refusal.
/// An outcome no carried operation has (a listing, stats) is never sent: it is answered as an
/// internal error rather than encoded.
pub fn encode_answer(answer: &Carried) -> Vec<u8> {
    let projects = match &answer.outcome {
        Ok(Outcome::Subscription(shown)) => names_a_project(shown.subscription.settings.push.as_deref()),
        _ => false,
    };
    let mut encoder = Encoder::new(if projects { FORMAT_PUSH_PROJECT } else { FORMAT_PUSH });
    optional(&mut encoder, answer.applied, |encoder, index| {
        encoder.u64(index);
    });
    let outcome = match &answer.outcome {
        Ok(Outcome::Done | Outcome::Topic(_) | Outcome::Subscription(_) | Outcome::Snapshot(_)) => {
            answer.outcome.clone()
        }
        Ok(other) => Err(Status::internal(format!("{other:?} is not carried between nodes"))),
        Err(status) => Err(status.clone()),
    };
    match outcome {
        Ok(outcome) => {
            encoder.bool(true);
            encode_outcome(&mut encoder, &outcome, projects);
        }
        Err(status) => {
            let number = Code::ALL.iter().position(|code| *code == status.code).expect("Code::ALL is whole");
            encoder.bool(false).u32(number as u32).str(&status.message);
        }
    }
    encoder.0
}

pub fn decode_answer(bytes: &[u8]) -> Result<Carried, String> {
    let mut decoder = Decoder::new(bytes);
    let projects = format(&mut decoder, "an answer to a carried operation")?;
    let decoded = (|| {
        let applied = if decoder.bool()? { Some(decoder.u64()?) } else { None };
        let outcome = if decoder.bool()? {
            Ok(decode_outcome(&mut decoder, projects)?)
        } else {
            let code = *Code::ALL.get(decoder.u32()? as usize).ok_or("unknown status code")?;
            Err(Status::new(code, decoder.str()?))
        };
        Ok(Carried { applied, outcome })
    })();
    let decoded = decoded.map_err(str::to_owned)?;
    whole(&decoder)?;
    Ok(decoded)
}

/// Reads the format byte: whether push configurations carry their projects.
fn format(decoder: &mut Decoder, what: &str) -> Result<bool, String> {
    match decoder.u8().map_err(|_| format!("{what} is empty"))? {
        FORMAT_PUSH => Ok(false),
        FORMAT_PUSH_PROJECT => Ok(true),
        found => Err(format!(
            "{what} in format {found}, where this node reads {FORMAT_PUSH} and {FORMAT_PUSH_PROJECT}: the nodes run different versions"
        )),
    }
}

/// Whether `operation` holds a push configuration of a project other than the default.
fn operation_names_a_project(operation: &Operation) -> bool {
    match operation {
        Operation::CreateSubscription(subscription) => names_a_project(subscription.settings.push.as_deref()),
        Operation::UpdateSubscription(update) => {
            names_a_project(update.push.as_ref().and_then(|push| push.as_deref()))
        }
        Operation::ModifyPushConfig { push, .. } => names_a_project(push.as_deref()),
        _ => false,
    }
}

fn whole(decoder: &Decoder) -> Result<(), String> {
    match decoder.is_empty() {
        true => Ok(()),
        false => Err(format!("{} bytes are left over", decoder.remaining())),
    }
}

fn optional<T>(encoder: &mut Encoder, value: Option<T>, put: impl FnOnce(&mut Encoder, T)) {
    match value {
        Some(value) => {
            encoder.bool(true);
            put(encoder, value);
        }
        None => {
            encoder.bool(false);
        }
    }
}

fn take_optional<T>(
    decoder: &mut Decoder,
    take: impl FnOnce(&mut Decoder) -> DecodeResult<T>,
) -> DecodeResult<Option<T>> {
    Ok(if decoder.bool()? { Some(take(decoder)?) } else { None })
}

fn encode_labels(encoder: &mut Encoder, labels: &Labels) {
    encoder.u32(labels.len() as u32);
    for (key, value) in labels {
        encoder.str(key).str(value);
    }
}

fn decode_labels(decoder: &mut Decoder) -> DecodeResult<Labels> {
    let count = decoder.u32()?;
    let mut labels = Labels::new();
    // Each label takes at least its two lengths, so a count the input cannot hold fails at
    // once rather than after a long loop.
    if count as usize > decoder.remaining() / 8 {
        return Err("more labels than the message holds");
    }
    for _ in 0..count {
        labels.insert(decoder.str()?, decoder.str()?);
    }
    Ok(labels)
}

fn encode_list(encoder: &mut Encoder, list: &ListRequest) {
    encoder.str(&list.topic).u32(list.page_size).str(&list.page_token);
}

fn decode_list(decoder: &mut Decoder) -> DecodeResult<ListRequest> {
    Ok(ListRequest { topic: decoder.str()?, page_size: decoder.u32()?, page_token: decoder.str()? })
}

/// A topic, its last field wherever it is carried: a topic of several sources ends with their
/// number and leaders, which a topic of one leaves out, so that a node of the version before
/// sources reads it as it did and refuses the rest (trailing bytes) rather than take a topic of
/// several sources for one of one.
fn encode_topic(encoder: &mut Encoder, topic: &Topic) {
    encoder.str(&topic.name).u64(topic.message_retention_seconds);
    encode_labels(encoder, &topic.labels);
    encoder.u32(topic.replicas);
    if topic.sources > 1 || topic.source_policy.is_some() {
        encoder.u32(topic.sources).u32(topic.source_leaders.len() as u32);
        for leader in &topic.source_leaders {
            encoder.u32(leader.global());
        }
    }
    // Later still, and only for a topic whose sources follow its load: a node of the version
    // before refuses it (trailing bytes) rather than show the topic's count as fixed.
    if let Some(bounds) = topic.source_policy {
        encoder.u32(bounds.min).u32(bounds.max);
    }
}

/// The bounds a topic's sources follow its load within, read as `encode_topic` and an update
/// write them (an update's `max` of 0 asks for the default).
fn decode_source_bounds(decoder: &mut Decoder) -> DecodeResult<SourceBounds> {
    let bounds = SourceBounds { min: decoder.u32()?, max: decoder.u32()? };
    if bounds.min == 0 || (bounds.max != 0 && bounds.min > bounds.max) {
        return Err("a topic's source bounds are out of order");
    }
    Ok(bounds)
}

fn decode_topic(decoder: &mut Decoder) -> DecodeResult<Topic> {
    let mut topic = Topic {
        name: decoder.str()?,
        message_retention_seconds: decoder.u64()?,
        labels: decode_labels(decoder)?,
        replicas: decoder.u32()?,
        sources: 0,
        source_leaders: Vec::new(),
        source_policy: None,
    };
    if !decoder.is_empty() {
        topic.sources = decoder.u32()?;
        let count = decoder.u32()?;
        if count > topic.sources || count > SOURCES_PER_TOPIC_MAX {
            return Err("more source leaders than sources");
        }
        for _ in 0..count {
            topic.source_leaders.push(ShardId::from_global(decoder.u32()?));
        }
        if !decoder.is_empty() {
            topic.source_policy = Some(decode_source_bounds(decoder)?);
        }
    }
    Ok(topic)
}

fn decode_topic_update(decoder: &mut Decoder) -> DecodeResult<Operation> {
    let mut update = TopicUpdate {
        name: decoder.str()?,
        message_retention_seconds: take_optional(decoder, |decoder| decoder.u64())?,
        labels: take_optional(decoder, decode_labels)?,
        ..TopicUpdate::default()
    };
    if !decoder.is_empty() {
        let sources = decoder.u32()?;
        if decoder.is_empty() {
            update.sources = Some(sources);
        } else {
            update.sources = (sources != 0).then_some(sources);
            update.sources_auto = Some(decode_source_bounds(decoder)?);
        }
    }
    Ok(Operation::UpdateTopic(update))
}

fn encode_subscription(encoder: &mut Encoder, subscription: &Subscription, projects: bool) {
    encoder.str(&subscription.name).str(&subscription.topic);
    encode_whole_settings(encoder, &subscription.settings, projects).bool(subscription.detached);
}

fn decode_subscription(decoder: &mut Decoder, projects: bool) -> DecodeResult<Subscription> {
    Ok(Subscription {
        name: decoder.str()?,
        topic: decoder.str()?,
        settings: decode_whole_settings(decoder, projects)?,
        detached: decoder.bool()?,
    })
}

fn encode_operation(encoder: &mut Encoder, operation: &Operation, projects: bool) {
    let kind = operation.kind();
    let tag = Kind::ALL.iter().position(|known| *known == kind).expect("Kind::ALL is whole");
    encoder.u8(tag as u8);
    match operation {
        Operation::CreateTopic(topic) => encode_topic(encoder, topic),
        Operation::UpdateTopic(update) => {
            encoder.str(&update.name);
            optional(encoder, update.message_retention_seconds, |encoder, seconds| {
                encoder.u64(seconds);
            });
            optional(encoder, update.labels.as_ref(), encode_labels);
            // Last, and only when asked, as `encode_topic`'s sources.
            // A change to following the load comes after the count (0: none asked), which a
            // node of the version before refuses as trailing bytes.
            if update.sources.is_some() || update.sources_auto.is_some() {
                encoder.u32(update.sources.unwrap_or(0));
            }
            if let Some(bounds) = update.sources_auto {
                encoder.u32(bounds.min).u32(bounds.max);
            }
        }
        Operation::GetTopic { name }
        | Operation::DeleteTopic { name }
        | Operation::LookupTopic { name }
        | Operation::GetSubscription { name }
        | Operation::DeleteSubscription { name }
        | Operation::DetachSubscription { name }
        | Operation::LookupSubscription { name }
        | Operation::LookupTopicSources { name }
        | Operation::LookupSubscriptionSources { name }
        | Operation::GetSnapshot { name }
        | Operation::DeleteSnapshot { name } => {
            encoder.str(name);
        }
        Operation::ListTopics(list)
        | Operation::ListTopicSubscriptions(list)
        | Operation::ListTopicSnapshots(list)
        | Operation::ListSubscriptions(list)
        | Operation::ListSnapshots(list) => encode_list(encoder, list),
        Operation::CreateSubscription(subscription) => encode_subscription(encoder, subscription, projects),
        Operation::UpdateSubscription(update) => {
            encoder.str(&update.name);
            optional(encoder, update.ack_deadline_seconds, |encoder, seconds| {
                encoder.u32(seconds);
            });
            optional(encoder, update.retain_acked_messages, |encoder, retain| {
                encoder.bool(retain);
            });
            optional(encoder, update.message_retention_seconds, |encoder, seconds| {
                encoder.u64(seconds);
            });
            optional(encoder, update.expiration_ttl_seconds, |encoder, seconds| {
                encoder.u64(seconds);
            });
            optional(encoder, update.dead_letter_policy.as_ref(), |encoder, (topic, attempts)| {
                encoder.str(topic).u32(*attempts);
            });
            optional(encoder, update.retry_policy, |encoder, (minimum, maximum)| {
                encoder.u32(minimum).u32(maximum);
            });
            optional(encoder, update.labels.as_ref(), encode_labels);
            optional(encoder, update.enable_exactly_once_delivery, |encoder, enable| {
                encoder.bool(enable);
            });
            optional(encoder, update.push.as_ref(), |encoder, push| {
                encode_optional_push(encoder, push.as_deref(), projects);
            });
        }
        Operation::ModifyPushConfig { name, push } => {
            encoder.str(name);
            encode_optional_push(encoder, push.as_deref(), projects);
        }
        Operation::Seek { subscription, target } => {
            encoder.str(subscription);
            match target {
                SeekTarget::Time { time_ms } => encoder.u8(SEEK_TIME).u64(*time_ms),
                SeekTarget::Snapshot { name } => encoder.u8(SEEK_SNAPSHOT).str(name),
            };
        }
        Operation::CreateSnapshot { name, subscription, labels } => {
            encoder.str(name).str(subscription);
            encode_labels(encoder, labels);
        }
        Operation::UpdateSnapshot { name, labels } => {
            encoder.str(name);
            optional(encoder, labels.as_ref(), encode_labels);
        }
        Operation::Stats | Operation::ClusterStatus => {}
        Operation::ClusterAddNode { node_id, cluster_address, voter } => {
            encoder.u64(node_id.get()).str(cluster_address).bool(*voter);
        }
        Operation::ClusterRemoveNode { node_id } => {
            encoder.u64(node_id.get());
        }
        Operation::ClusterDrain { node_id, draining } => {
            encoder.u64(node_id.get()).bool(*draining);
        }
        Operation::ClusterDrainStatus | Operation::ClusterRestrictions => {}
        Operation::ClusterRestrict { rule, add } => {
            encode_routing_rule(encoder, rule);
            encoder.bool(*add);
        }
        Operation::ResyncDirectory { index } => {
            encoder.u32(*index);
        }
        Operation::CreateSchema { .. }
        | Operation::CommitSchema { .. }
        | Operation::RollbackSchema { .. }
        | Operation::DeleteSchemaRevision { .. }
        | Operation::DeleteSchema { .. }
        | Operation::SetTopicSchema { .. }
        | Operation::GetSchema { .. }
        | Operation::ListSchemas(_)
        | Operation::ListSchemaRevisions { .. }
        | Operation::ValidateSchema { .. }
        | Operation::ValidateMessage(_) => encode_schema_operation(encoder, operation),
    }
}

/// A routing restriction: whom it selects, whether it allows or forbids, and which nodes.
fn encode_routing_rule(encoder: &mut Encoder, rule: &RoutingRule) {
    match &rule.selector {
        ClientSelector::Principal(name) => encoder.u8(SELECTOR_PRINCIPAL).str(name),
        ClientSelector::From(range) => encoder.u8(SELECTOR_FROM).str(&range.to_string()),
    };
    encoder.bool(rule.allow).u32(rule.nodes.len() as u32);
    for node in &rule.nodes {
        encoder.u64(node.get());
    }
}

/// A schema's change, or a topic's schema settings, after its kind.
fn encode_schema_operation(encoder: &mut Encoder, operation: &Operation) {
    match operation {
        Operation::CreateSchema { name, schema_type, definition }
        | Operation::CommitSchema { name, schema_type, definition } => {
            encoder.str(name).u8(*schema_type as u8).str(definition);
        }
        Operation::RollbackSchema { name, revision_id }
        | Operation::DeleteSchemaRevision { name, revision_id } => {
            encoder.str(name).str(revision_id);
        }
        Operation::DeleteSchema { name }
        | Operation::GetSchema { name }
        | Operation::ListSchemaRevisions { name } => {
            encoder.str(name);
        }
        Operation::ListSchemas(list) => encode_list(encoder, list),
        Operation::ValidateSchema { schema_type, definition } => {
            encoder.u8(*schema_type as u8).str(definition);
        }
        Operation::ValidateMessage(check) => {
            encoder
                .str(&check.schema)
                .str(&check.revision_id)
                .u8(check.schema_type as u8)
                .str(&check.definition)
                .u8(check.encoding as u8)
                .u32(check.message.len() as u32);
            encoder.0.extend_from_slice(&check.message);
        }
        Operation::SetTopicSchema { topic, settings } => {
            encoder.str(topic);
            optional(encoder, settings.as_ref(), |encoder, settings| {
                encoder
                    .str(&settings.schema)
                    .u8(settings.encoding as u8)
                    .str(&settings.first_revision_id)
                    .str(&settings.last_revision_id);
            });
        }
        _ => unreachable!("encode_schema_operation is handed a schema's change"),
    }
}

/// A schema's type, by its number.
fn decode_schema_type(decoder: &mut Decoder) -> DecodeResult<SchemaType> {
    SchemaType::from_number(decoder.u8()?).ok_or("an unknown schema type")
}

/// A topic's schema settings.
fn decode_schema_settings(decoder: &mut Decoder) -> DecodeResult<SchemaSettings> {
    Ok(SchemaSettings {
        schema: decoder.str()?,
        encoding: SchemaEncoding::from_number(decoder.u8()?).ok_or("an unknown schema encoding")?,
        first_revision_id: decoder.str()?,
        last_revision_id: decoder.str()?,
    })
}

/// A schema's read or check, after its kind (`kind`).
fn decode_schema_read(decoder: &mut Decoder, kind: Kind) -> DecodeResult<Operation> {
    Ok(match kind {
        Kind::GetSchema => Operation::GetSchema { name: decoder.str()? },
        Kind::ListSchemaRevisions => Operation::ListSchemaRevisions { name: decoder.str()? },
        Kind::ListSchemas => Operation::ListSchemas(decode_list(decoder)?),
        Kind::ValidateSchema => Operation::ValidateSchema {
            schema_type: decode_schema_type(decoder)?,
            definition: decoder.str()?,
        },
        Kind::ValidateMessage => Operation::ValidateMessage(Box::new(MessageCheck {
            schema: decoder.str()?,
            revision_id: decoder.str()?,
            schema_type: decode_schema_type(decoder)?,
            definition: decoder.str()?,
            encoding: SchemaEncoding::from_number(decoder.u8()?).ok_or("an unknown schema encoding")?,
            message: {
                let length = decoder.u32()? as usize;
                decoder.bytes(length)?.to_vec()
            },
        })),
        _ => return Err("not a schema's read"),
    })
}

fn decode_operation(decoder: &mut Decoder, projects: bool) -> DecodeResult<Operation> {
    let kind = *Kind::ALL.get(decoder.u8()? as usize).ok_or("unknown operation kind")?;
    Ok(match kind {
        Kind::CreateTopic => Operation::CreateTopic(decode_topic(decoder)?),
        Kind::UpdateTopic => decode_topic_update(decoder)?,
        Kind::GetTopic => Operation::GetTopic { name: decoder.str()? },
        Kind::DeleteTopic => Operation::DeleteTopic { name: decoder.str()? },
        Kind::LookupTopic => Operation::LookupTopic { name: decoder.str()? },
        Kind::GetSubscription => Operation::GetSubscription { name: decoder.str()? },
        Kind::DeleteSubscription => Operation::DeleteSubscription { name: decoder.str()? },
        Kind::DetachSubscription => Operation::DetachSubscription { name: decoder.str()? },
        Kind::LookupSubscription => Operation::LookupSubscription { name: decoder.str()? },
        Kind::LookupTopicSources => Operation::LookupTopicSources { name: decoder.str()? },
        Kind::LookupSubscriptionSources => Operation::LookupSubscriptionSources { name: decoder.str()? },
        Kind::GetSnapshot => Operation::GetSnapshot { name: decoder.str()? },
        Kind::DeleteSnapshot => Operation::DeleteSnapshot { name: decoder.str()? },
        Kind::ListTopics => Operation::ListTopics(decode_list(decoder)?),
        Kind::ListTopicSubscriptions => Operation::ListTopicSubscriptions(decode_list(decoder)?),
        Kind::ListTopicSnapshots => Operation::ListTopicSnapshots(decode_list(decoder)?),
        Kind::ListSubscriptions => Operation::ListSubscriptions(decode_list(decoder)?),
        Kind::ListSnapshots => Operation::ListSnapshots(decode_list(decoder)?),
        Kind::CreateSubscription => Operation::CreateSubscription(decode_subscription(decoder, projects)?),
        Kind::UpdateSubscription => Operation::UpdateSubscription(SubscriptionUpdate {
            name: decoder.str()?,
            ack_deadline_seconds: take_optional(decoder, |decoder| decoder.u32())?,
            retain_acked_messages: take_optional(decoder, |decoder| decoder.bool())?,
            message_retention_seconds: take_optional(decoder, |decoder| decoder.u64())?,
            expiration_ttl_seconds: take_optional(decoder, |decoder| decoder.u64())?,
            dead_letter_policy: take_optional(decoder, |decoder| Ok((decoder.str()?, decoder.u32()?)))?,
            retry_policy: take_optional(decoder, |decoder| Ok((decoder.u32()?, decoder.u32()?)))?,
            labels: take_optional(decoder, decode_labels)?,
            enable_exactly_once_delivery: take_optional(decoder, |decoder| decoder.bool())?,
            push: take_optional(decoder, |decoder| decode_optional_push(decoder, projects))?,
        }),
        Kind::ModifyPushConfig => Operation::ModifyPushConfig {
            name: decoder.str()?,
            push: decode_optional_push(decoder, projects)?,
        },
        Kind::Seek => {
            let subscription = decoder.str()?;
            let target = match decoder.u8()? {
                SEEK_TIME => SeekTarget::Time { time_ms: decoder.u64()? },
                SEEK_SNAPSHOT => SeekTarget::Snapshot { name: decoder.str()? },
                _ => return Err("unknown seek target"),
            };
            Operation::Seek { subscription, target }
        }
        Kind::CreateSnapshot => Operation::CreateSnapshot {
            name: decoder.str()?,
            subscription: decoder.str()?,
            labels: decode_labels(decoder)?,
        },
        Kind::UpdateSnapshot => {
            Operation::UpdateSnapshot { name: decoder.str()?, labels: take_optional(decoder, decode_labels)? }
        }
        Kind::Stats => Operation::Stats,
        Kind::ClusterStatus => Operation::ClusterStatus,
        Kind::ClusterAddNode => Operation::ClusterAddNode {
            node_id: NodeId::new(decoder.u64()?),
            cluster_address: decoder.str()?,
            voter: decoder.bool()?,
        },
        Kind::ClusterRemoveNode => Operation::ClusterRemoveNode { node_id: NodeId::new(decoder.u64()?) },
        Kind::ClusterDrain => {
            Operation::ClusterDrain { node_id: NodeId::new(decoder.u64()?), draining: decoder.bool()? }
        }
        Kind::ClusterDrainStatus => Operation::ClusterDrainStatus,
        Kind::ClusterRestrictions => Operation::ClusterRestrictions,
        Kind::ClusterRestrict => {
            let selector = match decoder.u8()? {
                SELECTOR_PRINCIPAL => ClientSelector::Principal(decoder.str()?),
                SELECTOR_FROM => ClientSelector::From(
                    Cidr::parse(&decoder.str()?).map_err(|_| "a rule's range does not parse")?,
                ),
                _ => return Err("unknown routing rule selector"),
            };
            let allow = decoder.bool()?;
            let count = decoder.u32()? as usize;
            if count > crate::router::NODE_ID_MAX as usize {
                return Err("a routing rule naming more nodes than there are");
            }
            let mut nodes = std::collections::BTreeSet::new();
            for _ in 0..count {
                nodes.insert(NodeId::new(decoder.u64()?));
            }
            let rule = RoutingRule { selector, allow, nodes };
            Operation::ClusterRestrict { rule, add: decoder.bool()? }
        }
        Kind::ResyncDirectory => Operation::ResyncDirectory { index: decoder.u32()? },
        Kind::CreateSchema => Operation::CreateSchema {
            name: decoder.str()?,
            schema_type: decode_schema_type(decoder)?,
            definition: decoder.str()?,
        },
        Kind::CommitSchema => Operation::CommitSchema {
            name: decoder.str()?,
            schema_type: decode_schema_type(decoder)?,
            definition: decoder.str()?,
        },
        Kind::RollbackSchema => {
            Operation::RollbackSchema { name: decoder.str()?, revision_id: decoder.str()? }
        }
        Kind::DeleteSchemaRevision => {
            Operation::DeleteSchemaRevision { name: decoder.str()?, revision_id: decoder.str()? }
        }
        Kind::DeleteSchema => Operation::DeleteSchema { name: decoder.str()? },
        Kind::SetTopicSchema => Operation::SetTopicSchema {
            topic: decoder.str()?,
            settings: take_optional(decoder, decode_schema_settings)?,
        },
        Kind::GetSchema
        | Kind::ListSchemaRevisions
        | Kind::ListSchemas
        | Kind::ValidateSchema
        | Kind::ValidateMessage => decode_schema_read(decoder, kind)?,
        Kind::Publish | Kind::Pull | Kind::StreamingPull | Kind::Acknowledge | Kind::ModifyAckDeadline => {
            return Err("a data-plane operation is not carried this way")
        }
    })
}

fn encode_outcome(encoder: &mut Encoder, outcome: &Outcome, projects: bool) {
    match outcome {
        Outcome::Done => {
            encoder.u8(OUTCOME_DONE);
        }
        Outcome::Topic(topic) => {
            encoder.u8(OUTCOME_TOPIC);
            encode_topic(encoder, topic);
        }
        Outcome::Subscription(shown) => {
            encoder.u8(OUTCOME_SUBSCRIPTION);
            encode_subscription(encoder, &shown.subscription, projects);
            encoder.u64(shown.topic_retention_seconds);
        }
        Outcome::Snapshot(snapshot) => {
            encoder
                .u8(OUTCOME_SNAPSHOT)
                .str(&snapshot.name)
                .str(&snapshot.topic)
                .u64(snapshot.expire_time_ms);
            encode_labels(encoder, &snapshot.labels);
        }
        other => unreachable!("{other:?} is answered as an error by encode_answer"),
    }
}

fn decode_outcome(decoder: &mut Decoder, projects: bool) -> DecodeResult<Outcome> {
    Ok(match decoder.u8()? {
        OUTCOME_DONE => Outcome::Done,
        OUTCOME_TOPIC => Outcome::Topic(decode_topic(decoder)?),
        OUTCOME_SUBSCRIPTION => Outcome::Subscription(SubscriptionShown {
            subscription: decode_subscription(decoder, projects)?,
            topic_retention_seconds: decoder.u64()?,
        }),
        OUTCOME_SNAPSHOT => Outcome::Snapshot(Snapshot {
            name: decoder.str()?,
            topic: decoder.str()?,
            expire_time_ms: decoder.u64()?,
            labels: decode_labels(decoder)?,
        }),
        _ => return Err("unknown outcome"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::control::SubscriptionSettings;

    fn labels() -> Labels {
        [("team".to_owned(), "orders".to_owned()), ("tier".to_owned(), String::new())].into()
    }

    /// One operation of every kind the door runs, with every optional field set and unset.
    fn operations() -> Vec<Operation> {
        let list = ListRequest { topic: "t".into(), page_size: 7, page_token: "after".into() };
        let settings = SubscriptionSettings {
            ack_deadline_seconds: 30,
            dead_letter_topic: "dead".into(),
            labels: labels(),
            enable_exactly_once_delivery: true,
            ..Default::default()
        };
        vec![
            Operation::CreateTopic(Topic {
                name: "t".into(),
                message_retention_seconds: 600,
                labels: labels(),
                replicas: 3,
                ..Default::default()
            }),
            Operation::GetTopic { name: "t".into() },
            Operation::UpdateTopic(TopicUpdate {
                name: "t".into(),
                message_retention_seconds: Some(0),
                labels: Some(labels()),
                ..Default::default()
            }),
            Operation::UpdateTopic(TopicUpdate { name: "t".into(), ..Default::default() }),
            Operation::DeleteTopic { name: "t".into() },
            Operation::ListTopics(list.clone()),
            Operation::ListTopicSubscriptions(list.clone()),
            Operation::ListTopicSnapshots(list.clone()),
            Operation::LookupTopic { name: "t".into() },
            Operation::CreateSubscription(Subscription {
                name: "s".into(),
                topic: "t".into(),
                settings: settings.clone(),
                detached: false,
            }),
            Operation::CreateSubscription(Subscription {
                name: "s".into(),
                topic: "t".into(),
                settings: SubscriptionSettings {
                    push: Some(Box::new(crate::catalog::PushConfig {
                        endpoint: "https://receiver.example/push".into(),
                        attributes: labels(),
                        wrapper: crate::catalog::PushWrapper::NoWrapper { write_metadata: false },
                        oidc_token: Some(crate::catalog::OidcToken {
                            service_account_email: "pusher@p.iam.example".into(),
                            audience: String::new(),
                        }),
                        project: "my-proj".into(),
                    })),
                    ..settings
                },
                detached: false,
            }),
            Operation::GetSubscription { name: "s".into() },
            Operation::UpdateSubscription(SubscriptionUpdate {
                name: "s".into(),
                ack_deadline_seconds: Some(20),
                retain_acked_messages: Some(true),
                message_retention_seconds: Some(3600),
                expiration_ttl_seconds: Some(0),
                dead_letter_policy: Some(("dead".into(), 5)),
                retry_policy: Some((1, 60)),
                labels: Some(Labels::new()),
                enable_exactly_once_delivery: Some(false),
                push: Some(None),
            }),
            Operation::UpdateSubscription(SubscriptionUpdate {
                name: "s".into(),
                push: Some(Some(Box::new(crate::catalog::PushConfig {
                    endpoint: "http://localhost:8080/".into(),
                    ..Default::default()
                }))),
                ..Default::default()
            }),
            Operation::UpdateSubscription(SubscriptionUpdate {
                name: "s".into(),
                push: Some(Some(Box::new(crate::catalog::PushConfig {
                    endpoint: "http://localhost:8080/".into(),
                    project: "example.com:my-proj".into(),
                    ..Default::default()
                }))),
                ..Default::default()
            }),
            Operation::ModifyPushConfig { name: "s".into(), push: None },
            Operation::ModifyPushConfig {
                name: "s".into(),
                push: Some(Box::new(crate::catalog::PushConfig {
                    endpoint: "https://receiver.example/push".into(),
                    wrapper: crate::catalog::PushWrapper::NoWrapper { write_metadata: true },
                    ..Default::default()
                })),
            },
            Operation::ModifyPushConfig {
                name: "s".into(),
                push: Some(Box::new(crate::catalog::PushConfig {
                    endpoint: "https://receiver.example/push".into(),
                    project: "my-proj".into(),
                    ..Default::default()
                })),
            },
            Operation::UpdateSubscription(SubscriptionUpdate { name: "s".into(), ..Default::default() }),
            Operation::DeleteSubscription { name: "s".into() },
            Operation::DetachSubscription { name: "s".into() },
            Operation::ListSubscriptions(list.clone()),
            Operation::LookupSubscription { name: "s".into() },
            Operation::LookupTopicSources { name: "t".into() },
            Operation::LookupSubscriptionSources { name: "s".into() },
            Operation::Seek { subscription: "s".into(), target: SeekTarget::Time { time_ms: 12 } },
            Operation::Seek { subscription: "s".into(), target: SeekTarget::Snapshot { name: "m".into() } },
            Operation::CreateSnapshot { name: "m".into(), subscription: "s".into(), labels: labels() },
            Operation::GetSnapshot { name: "m".into() },
            Operation::UpdateSnapshot { name: "m".into(), labels: Some(labels()) },
            Operation::UpdateSnapshot { name: "m".into(), labels: None },
            Operation::DeleteSnapshot { name: "m".into() },
            Operation::ListSnapshots(list),
            Operation::Stats,
            Operation::ClusterStatus,
            Operation::ClusterAddNode {
                node_id: NodeId::new(4),
                cluster_address: "10.0.0.4:7460".into(),
                voter: true,
            },
            Operation::ClusterRemoveNode { node_id: NodeId::new(4) },
            Operation::ClusterDrain { node_id: NodeId::new(3), draining: true },
            Operation::ClusterDrainStatus,
            Operation::ClusterRestrictions,
            Operation::CreateSchema {
                name: "orders".into(),
                schema_type: SchemaType::Avro,
                definition: r#"{"type": "string"}"#.into(),
            },
            Operation::CommitSchema {
                name: "orders".into(),
                schema_type: SchemaType::ProtocolBuffer,
                definition: "syntax = \"proto3\"; message Order { string id = 1; }".into(),
            },
            Operation::RollbackSchema { name: "orders".into(), revision_id: "0a1b2c3d".into() },
            Operation::DeleteSchemaRevision { name: "orders".into(), revision_id: "0a1b2c3d".into() },
            Operation::DeleteSchema { name: "orders".into() },
            Operation::SetTopicSchema {
                topic: "t".into(),
                settings: Some(SchemaSettings {
                    schema: "orders".into(),
                    encoding: SchemaEncoding::Binary,
                    first_revision_id: "0a1b2c3d".into(),
                    last_revision_id: String::new(),
                }),
            },
            Operation::SetTopicSchema { topic: "t".into(), settings: None },
            Operation::GetSchema { name: "orders".into() },
            Operation::ListSchemas(ListRequest {
                topic: String::new(),
                page_size: 3,
                page_token: "a".into(),
            }),
            Operation::ListSchemaRevisions { name: "orders".into() },
            Operation::ValidateSchema { schema_type: SchemaType::Avro, definition: "{}".into() },
            Operation::ValidateMessage(Box::new(MessageCheck {
                schema: "orders".into(),
                revision_id: "0a1b2c3d".into(),
                schema_type: SchemaType::ProtocolBuffer,
                definition: "syntax = \"proto3\";".into(),
                encoding: SchemaEncoding::Json,
                message: b"{\"id\": 1}".to_vec(),
            })),
            Operation::ClusterRestrict {
                rule: RoutingRule {
                    selector: ClientSelector::From(Cidr::parse("10.0.0.0/8").unwrap()),
                    allow: false,
                    nodes: [NodeId::new(2), NodeId::new(3)].into(),
                },
                add: true,
            },
            Operation::ClusterRestrict {
                rule: RoutingRule {
                    selector: ClientSelector::Principal("billing".into()),
                    allow: true,
                    nodes: [NodeId::new(1)].into(),
                },
                add: false,
            },
            Operation::ResyncDirectory { index: 2 },
        ]
    }

    #[test]
    fn every_operation_decodes_to_what_was_encoded_and_a_cut_or_a_tail_is_refused() {
        let kinds: std::collections::HashSet<Kind> = operations().iter().map(Operation::kind).collect();
        let control = Kind::ALL.iter().filter(|kind| !kind.is_data_plane()).count();
        assert_eq!(kinds.len(), control, "a kind of operation is left out of this test");
        for principal in [Principal::Anonymous, Principal::Named("alice".into())] {
            for operation in operations() {
                let encoded = encode_carried(&principal, &operation);
                assert_eq!(decode_carried(&encoded), Ok((principal.clone(), operation.clone())));
                for cut in 0..encoded.len() {
                    assert!(decode_carried(&encoded[..cut]).is_err(), "{operation:?} cut at {cut} decoded");
                }
                let mut longer = encoded.clone();
                longer.push(0);
                assert!(decode_carried(&longer).is_err(), "{operation:?} with a byte more decoded");
            }
        }
    }

    /// A topic's sources are the last field of a create, an update and a topic answered, and
    /// only when there are several: a topic of one source is encoded as before sources (so a
    /// node of that version reads it), and one of several decodes whole, a cut within its
    /// sources refused.
    #[test]
    fn a_topics_sources_are_carried_last_and_only_when_several() {
        let one = Topic { name: "t".into(), replicas: 3, ..Default::default() };
        let several = Topic {
            sources: 3,
            source_leaders: [0x1_0000, 0x2_0001, 0x3_0000].map(ShardId::from_global).to_vec(),
            ..one.clone()
        };
        let as_before = encode_carried(&Principal::Anonymous, &Operation::CreateTopic(one.clone()));
        let with_one = Topic { sources: 1, ..one.clone() };
        assert_eq!(encode_carried(&Principal::Anonymous, &Operation::CreateTopic(with_one)), as_before);
        let update = TopicUpdate { name: "t".into(), sources: Some(4), ..Default::default() };
        for operation in [Operation::CreateTopic(several.clone()), Operation::UpdateTopic(update)] {
            let encoded = encode_carried(&Principal::Anonymous, &operation);
            assert_eq!(decode_carried(&encoded), Ok((Principal::Anonymous, operation.clone())));
            let without = match &operation {
                Operation::CreateTopic(_) => as_before.len(),
                _ => encoded.len() - 4,
            };
            for cut in without + 1..encoded.len() {
                assert!(decode_carried(&encoded[..cut]).is_err(), "{operation:?} cut at {cut} decoded");
            }
        }
        let answer = Carried { applied: Some(9), outcome: Ok(Outcome::Topic(several)) };
        assert_eq!(decode_answer(&encode_answer(&answer)), Ok(answer));
    }

    /// A topic whose sources follow its load carries its bounds after its sources, even with
    /// one source, and an update to following carries them after the count: a node of the
    /// version before refuses both (trailing bytes), and bounds out of order are refused.
    #[test]
    fn a_topics_source_bounds_are_carried_after_its_sources() {
        let bounds = SourceBounds { min: 1, max: 3 };
        let plain = Topic { name: "t".into(), sources: 1, ..Default::default() };
        let followed = Topic { source_policy: Some(bounds), ..plain.clone() };
        let as_before = encode_carried(&Principal::Anonymous, &Operation::CreateTopic(plain));
        let answer = Carried { applied: None, outcome: Ok(Outcome::Topic(followed.clone())) };
        assert_eq!(decode_answer(&encode_answer(&answer)), Ok(answer));
        let encoded = encode_carried(&Principal::Anonymous, &Operation::CreateTopic(followed.clone()));
        assert_eq!(encoded.len(), as_before.len() + 16, "the count, no leaders, and the bounds");
        assert_eq!(decode_carried(&encoded), Ok((Principal::Anonymous, Operation::CreateTopic(followed))));
        for sources in [None, Some(2)] {
            let update =
                TopicUpdate { name: "t".into(), sources, sources_auto: Some(bounds), ..Default::default() };
            let operation = Operation::UpdateTopic(update);
            let encoded = encode_carried(&Principal::Anonymous, &operation);
            assert_eq!(decode_carried(&encoded), Ok((Principal::Anonymous, operation.clone())));
        }
        let reversed = TopicUpdate {
            name: "t".into(),
            sources_auto: Some(SourceBounds { min: 3, max: 1 }),
            ..Default::default()
        };
        assert!(decode_carried(&encode_carried(&Principal::Anonymous, &Operation::UpdateTopic(reversed)))
            .is_err());
    }

    #[test]
    fn every_answer_decodes_to_what_was_encoded_and_one_of_an_earlier_format_is_named() {
        let subscription = SubscriptionShown {
            subscription: Subscription { name: "s".into(), topic: "t".into(), ..Default::default() },
            topic_retention_seconds: 600,
        };
        let snapshot = Snapshot { name: "m".into(), topic: "t".into(), expire_time_ms: 99, labels: labels() };
        let outcomes = [
            Ok(Outcome::Done),
            Ok(Outcome::Topic(Topic { name: "t".into(), ..Default::default() })),
            Ok(Outcome::Subscription(subscription)),
            Ok(Outcome::Snapshot(snapshot)),
            Err(Status::new(Code::PermissionDenied, "denied")),
            Err(Status::new(Code::NotOwner, "")),
        ];
        for applied in [None, Some(41)] {
            for outcome in outcomes.clone() {
                let answer = Carried { applied, outcome };
                let encoded = encode_answer(&answer);
                assert_eq!(decode_answer(&encoded), Ok(answer.clone()));
                for cut in 0..encoded.len() {
                    assert!(decode_answer(&encoded[..cut]).is_err(), "{answer:?} cut at {cut} decoded");
                }
            }
        }
        // What no carried operation answers is sent as an error, not encoded.
        let listing = Carried { applied: None, outcome: Ok(Outcome::Topics(Default::default())) };
        let decoded = decode_answer(&encode_answer(&listing)).unwrap();
        assert_eq!(decoded.outcome.unwrap_err().code, Code::Internal);
        // The frame-carrying format before it (its first byte 0) is named, not misread.
        let refused = decode_carried(&[0, 0]).unwrap_err();
        assert!(refused.contains("different versions"), "{refused}");
    }

    /// A push configuration of the default project is carried in format 2, byte for byte what
    /// the version before the project wrote and read (so its nodes and these carry pull and
    /// default-project push operations to each other as before); one of another project in
    /// format 3, which that version refuses as another version's rather than read it as the
    /// default project. The same holds for the answers that show a subscription.
    #[test]
    fn a_push_configuration_of_another_project_is_carried_in_format_3_and_the_default_one_in_format_2() {
        let push = |project: &str| {
            Some(Box::new(crate::catalog::PushConfig {
                endpoint: "https://receiver.example/push".into(),
                project: project.into(),
                ..Default::default()
            }))
        };
        let modify = |project: &str| Operation::ModifyPushConfig { name: "s".into(), push: push(project) };
        let default = encode_carried(&Principal::Anonymous, &modify(crate::catalog::PUSH_PROJECT_DEFAULT));
        // The version before's bytes: the format, the principal, the kind, the name, the flag and
        // the push configuration (endpoint, no attributes, the envelope, no token).
        let mut before = Encoder::new(FORMAT_PUSH);
        let kind = Kind::ALL.iter().position(|kind| *kind == Kind::ModifyPushConfig).unwrap();
        before.u8(PRINCIPAL_ANONYMOUS).u8(kind as u8).str("s").bool(true);
        before.str("https://receiver.example/push").u32(0).u8(0).bool(false);
        assert_eq!(default, before.0);
        let other = encode_carried(&Principal::Anonymous, &modify("my-proj"));
        assert_eq!(other[0], FORMAT_PUSH_PROJECT);
        assert_eq!(decode_carried(&other), Ok((Principal::Anonymous, modify("my-proj"))));
        // The version before's check of the format byte: anything but its 2 is refused.
        assert_ne!(other[0], FORMAT_PUSH);

        let shown = |project: &str| Carried {
            applied: Some(3),
            outcome: Ok(Outcome::Subscription(SubscriptionShown {
                subscription: Subscription {
                    name: "s".into(),
                    topic: "t".into(),
                    settings: SubscriptionSettings { push: push(project), ..Default::default() },
                    detached: false,
                },
                topic_retention_seconds: 600,
            })),
        };
        assert_eq!(encode_answer(&shown(crate::catalog::PUSH_PROJECT_DEFAULT))[0], FORMAT_PUSH);
        let answer = encode_answer(&shown("my-proj"));
        assert_eq!(answer[0], FORMAT_PUSH_PROJECT);
        assert_eq!(decode_answer(&answer), Ok(shown("my-proj")));
        // A project that is not a project id is refused.
        let mut bad = encode_carried(&Principal::Anonymous, &modify("my-proj"));
        let at = bad.len() - "my-proj".len();
        bad[at] = b'M';
        assert!(decode_carried(&bad).is_err());
    }
}
