//! The binary encoding of the control messages, for a router that reaches forwarders on other
//! nodes. Each message is a tag byte naming its variant, then its fields in declaration order,
//! written with the daemon's own codec (`crate::codec`). Every field is always written, so a
//! message's length follows from its tag and contents, and a cut or padded message is refused.
//!
//! These bytes come from the network, so decoding never panics on any input: it reads each
//! length before what it counts, allocates only as the input proves to hold, and refuses
//! unknown tags, unknown status codes and trailing bytes with a message naming what was wrong.

use super::{ControlOk, ControlRequest, SettingsUpdate};
use crate::api::stats::{
    DirectoryStatus, FollowerStats, LatencySummary, PushError, PushStats, QuarantinedTopic, ReplicaStats,
    ShardStats, SubscriptionStats, TopicStats,
};
use crate::api::{Code, Status};
use crate::catalog::entry::{
    decode_push_last, decode_settings_but_push, encode_push_last, encode_settings_but_push,
};
use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::{SnapshotId, TopicId};

// Tags start at 1, so that a run of zero bytes is never a message.
const REQUEST_ATTACH_TOPIC: u8 = 1;
const REQUEST_DETACH_TOPIC: u8 = 2;
const REQUEST_ATTACH_SUBSCRIPTION: u8 = 3;
const REQUEST_DURABLE_END: u8 = 4;
const REQUEST_DETACH_SUBSCRIPTION: u8 = 5;
const REQUEST_SEEK: u8 = 6;
const REQUEST_TAKE_SNAPSHOT: u8 = 7;
const REQUEST_DROP_SNAPSHOT: u8 = 8;
const REQUEST_UPDATE_SETTINGS: u8 = 9;
const REQUEST_STATS: u8 = 10;
const REQUEST_RESYNC_DIRECTORY: u8 = 11;
const REQUEST_ATTACH_REPLICA: u8 = 12;
const REQUEST_PROMOTE_REPLICA: u8 = 13;
const REQUEST_DEMOTE_REPLICA: u8 = 14;
const REQUEST_FENCE_REPLICA: u8 = 15;
const REQUEST_ELECTIONS_WANTED: u8 = 16;
const REQUEST_REPLICA_PROGRESS: u8 = 17;
const REQUEST_REQUESTS: u8 = 18;
const REQUEST_CLUSTER_HOSTS: u8 = 19;
/// New with the key map: a node of the version before refuses it as unknown.
const REQUEST_APPLY_SOURCES: u8 = 22;
/// New with the delivery gate: a node of the version before refuses it as unknown.
const REQUEST_GATE_SOURCES: u8 = 23;
/// New with schemas checked on forwarders: a node of the version before refuses it as
/// unknown, so a topic with a schema is never served there unchecked.
const REQUEST_SET_TOPIC_SCHEMA: u8 = 24;

const UPDATE_TOPIC: u8 = 1;
const UPDATE_SUBSCRIPTION: u8 = 2;

const OK_DONE: u8 = 1;
const OK_SUBSCRIPTION_START: u8 = 2;
const OK_STATS: u8 = 3;
const OK_RESYNCED: u8 = 4;
const OK_FENCED: u8 = 5;
const OK_TOPICS: u8 = 6;
const OK_PROGRESS: u8 = 7;
const OK_REQUESTS: u8 = 8;
/// `OK_STATS` with each subscription's push figures: a shard with no push subscription
/// answers `OK_STATS`, the bytes of the version before push subscriptions.
const OK_STATS_WITH_PUSH: u8 = 9;
/// `OK_REQUESTS` with the shard's flow-control figures after them: a shard whose flow control
/// has nothing to show answers `OK_REQUESTS`, the bytes of the version before.
const OK_REQUESTS_WITH_FLOW: u8 = 10;
/// A source's fence and its subscriptions' ack floors (`ControlOk::SourcesApplied`).
const OK_SOURCES_APPLIED: u8 = 12;

/// Most topics a `ControlOk::Topics` lists.
const TOPICS_LISTED_MAX: usize = 1 << 20;

/// Most subscriptions' ack floors a `ControlOk::SourcesApplied` lists: a decoding bound, as
/// `TOPICS_LISTED_MAX` is (a topic's subscriptions are not limited in number; 2^20 pairs are
/// 16 MiB).
const SOURCE_FLOORS_LISTED_MAX: usize = 1 << 20;

/// Most hosts a `ClusterHosts` names.
const CLUSTER_HOSTS_MAX: usize = crate::net::server::CLUSTER_HOSTS_MAX;

/// Most replicas a control request names: one per voter of the largest cluster.
const REPLICAS_MAX: usize = crate::catalog::entry::REPLICAS_MAX;

/// A reply's first byte: a `ControlOk`'s encoding follows one, a status the other.
const REPLY_OK: u8 = 1;
const REPLY_ERROR: u8 = 2;

impl ControlRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut encoder;
        match self {
            ControlRequest::AttachTopic { topic_id, name, retention_seconds, recovering, source, active } => {
                encoder = Encoder::new(REQUEST_ATTACH_TOPIC);
                encoder.u64(topic_id.get()).str(name).u64(*retention_seconds).bool(*recovering);
                encode_source_and_active(&mut encoder, *source, *active);
            }
            ControlRequest::DetachTopic { topic_id, delete_data } => {
                encoder = Encoder::new(REQUEST_DETACH_TOPIC);
                encoder.u64(topic_id.get()).bool(*delete_data);
            }
            ControlRequest::AttachSubscription {
                subscription_id,
                name,
                topic_id,
                settings,
                create,
                start_offset,
            } => {
                encoder = Encoder::new(REQUEST_ATTACH_SUBSCRIPTION);
                encoder.u64(*subscription_id).str(name).u64(topic_id.get());
                encode_settings_but_push(&mut encoder, settings).bool(*create).u64(*start_offset);
                encode_push_last(&mut encoder, settings.push.as_deref());
            }
            ControlRequest::DurableEnd { topic_id } => {
                encoder = Encoder::new(REQUEST_DURABLE_END);
                encoder.u64(topic_id.get());
            }
            ControlRequest::DetachSubscription { subscription_id, name, topic_id, deleted } => {
                encoder = Encoder::new(REQUEST_DETACH_SUBSCRIPTION);
                encoder.u64(*subscription_id).str(name).u64(topic_id.get()).bool(*deleted);
            }
            ControlRequest::Seek { subscription_id, topic_id, time_ms, snapshot_id } => {
                encoder = Encoder::new(REQUEST_SEEK);
                encoder.u64(*subscription_id).u64(topic_id.get()).u64(*time_ms).bool(snapshot_id.is_some());
                if let Some(snapshot_id) = snapshot_id {
                    encoder.u64(snapshot_id.get());
                }
            }
            ControlRequest::TakeSnapshot { topic_id, subscription_id, snapshot_id, expire_time_ms } => {
                encoder = Encoder::new(REQUEST_TAKE_SNAPSHOT);
                encoder.u64(topic_id.get()).u64(*subscription_id).u64(snapshot_id.get()).u64(*expire_time_ms);
            }
            ControlRequest::DropSnapshot { topic_id, snapshot_id } => {
                encoder = Encoder::new(REQUEST_DROP_SNAPSHOT);
                encoder.u64(topic_id.get()).u64(snapshot_id.get());
            }
            ControlRequest::UpdateSettings { topic_id, update } => {
                encoder = Encoder::new(REQUEST_UPDATE_SETTINGS);
                encoder.u64(topic_id.get());
                encode_settings_update(&mut encoder, update);
            }
            ControlRequest::Stats => encoder = Encoder::new(REQUEST_STATS),
            ControlRequest::Requests => encoder = Encoder::new(REQUEST_REQUESTS),
            ControlRequest::ResyncDirectory { index } => {
                encoder = Encoder::new(REQUEST_RESYNC_DIRECTORY);
                encoder.u64(*index as u64);
            }
            ControlRequest::AttachReplica {
                topic_id,
                name,
                retention_seconds,
                recovering,
                source,
                active,
            } => {
                encoder = Encoder::new(REQUEST_ATTACH_REPLICA);
                encoder.u64(topic_id.get()).str(name).u64(*retention_seconds).bool(*recovering);
                encode_replica_source(&mut encoder, *source, *active);
            }
            ControlRequest::PromoteReplica { topic_id, epoch, replicas } => {
                encoder = Encoder::new(REQUEST_PROMOTE_REPLICA);
                encoder.u64(topic_id.get()).u64(*epoch);
                encode_peers(&mut encoder, replicas);
            }
            ControlRequest::DemoteReplica { topic_id, epoch } => {
                encoder = Encoder::new(REQUEST_DEMOTE_REPLICA);
                encoder.u64(topic_id.get()).u64(*epoch);
            }
            ControlRequest::FenceReplica { topic_id, epoch } => {
                encoder = Encoder::new(REQUEST_FENCE_REPLICA);
                encoder.u64(topic_id.get()).u64(*epoch);
            }
            ControlRequest::ElectionsWanted => encoder = Encoder::new(REQUEST_ELECTIONS_WANTED),
            ControlRequest::ReplicaProgress { topic_id } => {
                encoder = Encoder::new(REQUEST_REPLICA_PROGRESS);
                encoder.u64(topic_id.get());
            }
            ControlRequest::ClusterHosts { hosts } => {
                assert!(hosts.len() <= CLUSTER_HOSTS_MAX, "{} cluster hosts", hosts.len());
                encoder = Encoder::new(REQUEST_CLUSTER_HOSTS);
                encoder.u32(hosts.len() as u32);
                for host in hosts {
                    encoder.str(&host.to_string());
                }
            }
            ControlRequest::ApplySources { topic_id, active } => {
                encoder = Encoder::new(REQUEST_APPLY_SOURCES);
                encoder.u64(topic_id.get()).u32(*active);
            }
            ControlRequest::GateSources { topic_id, generation, before, after, passed } => {
                encoder = Encoder::new(REQUEST_GATE_SOURCES);
                encoder
                    .u64(topic_id.get())
                    .u64(*generation)
                    .u32(*before)
                    .u32(*after)
                    .u32(passed.len() as u32);
                for id in passed {
                    encoder.u64(*id);
                }
            }
            ControlRequest::SetTopicSchema { topic_id, schema } => {
                encoder = Encoder::new(REQUEST_SET_TOPIC_SCHEMA);
                encode_topic_schema(encoder.u64(topic_id.get()), schema.as_ref());
            }
        }
        encoder.0
    }

    pub fn decode(bytes: &[u8]) -> Result<ControlRequest, String> {
        let mut decoder = Decoder::new(bytes);
        let tag = decoder.u8().map_err(|_| "control request is empty".to_owned())?;
        let decoder = &mut decoder;
        let request = match tag {
            REQUEST_ATTACH_TOPIC => fields("control request AttachTopic", decoder, decode_attach_topic)?,
            REQUEST_DETACH_TOPIC => fields("control request DetachTopic", decoder, |decoder| {
                Ok(ControlRequest::DetachTopic {
                    topic_id: TopicId::new(decoder.u64()?),
                    delete_data: decoder.bool()?,
                })
            })?,
            REQUEST_ATTACH_SUBSCRIPTION => {
                fields("control request AttachSubscription", decoder, decode_attach_subscription)?
            }
            REQUEST_DURABLE_END => fields("control request DurableEnd", decoder, |decoder| {
                Ok(ControlRequest::DurableEnd { topic_id: TopicId::new(decoder.u64()?) })
            })?,
            REQUEST_DETACH_SUBSCRIPTION => {
                fields("control request DetachSubscription", decoder, |decoder| {
                    Ok(ControlRequest::DetachSubscription {
                        subscription_id: decoder.u64()?,
                        name: decoder.str()?,
                        topic_id: TopicId::new(decoder.u64()?),
                        deleted: decoder.bool()?,
                    })
                })?
            }
            REQUEST_SEEK => fields("control request Seek", decoder, |decoder| {
                Ok(ControlRequest::Seek {
                    subscription_id: decoder.u64()?,
                    topic_id: TopicId::new(decoder.u64()?),
                    time_ms: decoder.u64()?,
                    snapshot_id: if decoder.bool()? { Some(SnapshotId::new(decoder.u64()?)) } else { None },
                })
            })?,
            REQUEST_TAKE_SNAPSHOT => fields("control request TakeSnapshot", decoder, |decoder| {
                Ok(ControlRequest::TakeSnapshot {
                    topic_id: TopicId::new(decoder.u64()?),
                    subscription_id: decoder.u64()?,
                    snapshot_id: SnapshotId::new(decoder.u64()?),
                    expire_time_ms: decoder.u64()?,
                })
            })?,
            REQUEST_DROP_SNAPSHOT => fields("control request DropSnapshot", decoder, |decoder| {
                Ok(ControlRequest::DropSnapshot {
                    topic_id: TopicId::new(decoder.u64()?),
                    snapshot_id: SnapshotId::new(decoder.u64()?),
                })
            })?,
            REQUEST_UPDATE_SETTINGS => {
                let topic_id =
                    TopicId::new(fields("control request UpdateSettings", decoder, |decoder| decoder.u64())?);
                ControlRequest::UpdateSettings { topic_id, update: decode_settings_update(decoder)? }
            }
            REQUEST_STATS => ControlRequest::Stats,
            REQUEST_REQUESTS => ControlRequest::Requests,
            REQUEST_RESYNC_DIRECTORY => fields("control request ResyncDirectory", decoder, |decoder| {
                // An index is a position among this node's data directories, so one too large
                // for this machine's `usize` names no directory.
                let index = usize::try_from(decoder.u64()?)
                    .map_err(|_| "directory index does not fit in this machine's usize")?;
                Ok(ControlRequest::ResyncDirectory { index })
            })?,
            REQUEST_ATTACH_REPLICA => fields("control request AttachReplica", decoder, |decoder| {
                let (topic_id, name) = (TopicId::new(decoder.u64()?), decoder.str()?);
                let (retention_seconds, recovering) = (decoder.u64()?, decoder.bool()?);
                let (source, active) = decode_replica_source(decoder)?;
                Ok(ControlRequest::AttachReplica {
                    topic_id,
                    name,
                    retention_seconds,
                    recovering,
                    source,
                    active,
                })
            })?,
            REQUEST_PROMOTE_REPLICA => fields("control request PromoteReplica", decoder, |decoder| {
                Ok(ControlRequest::PromoteReplica {
                    topic_id: TopicId::new(decoder.u64()?),
                    epoch: decoder.u64()?,
                    replicas: decode_peers(decoder)?,
                })
            })?,
            REQUEST_DEMOTE_REPLICA => fields("control request DemoteReplica", decoder, |decoder| {
                Ok(ControlRequest::DemoteReplica {
                    topic_id: TopicId::new(decoder.u64()?),
                    epoch: decoder.u64()?,
                })
            })?,
            REQUEST_FENCE_REPLICA => fields("control request FenceReplica", decoder, |decoder| {
                Ok(ControlRequest::FenceReplica {
                    topic_id: TopicId::new(decoder.u64()?),
                    epoch: decoder.u64()?,
                })
            })?,
            REQUEST_ELECTIONS_WANTED => ControlRequest::ElectionsWanted,
            REQUEST_REPLICA_PROGRESS => fields("control request ReplicaProgress", decoder, |decoder| {
                Ok(ControlRequest::ReplicaProgress { topic_id: TopicId::new(decoder.u64()?) })
            })?,
            REQUEST_CLUSTER_HOSTS => fields("control request ClusterHosts", decoder, decode_cluster_hosts)?,
            REQUEST_APPLY_SOURCES => fields("control request ApplySources", decoder, |decoder| {
                Ok(ControlRequest::ApplySources {
                    topic_id: TopicId::new(decoder.u64()?),
                    active: decoder.u32()?,
                })
            })?,
            REQUEST_GATE_SOURCES => fields("control request GateSources", decoder, decode_gate_sources)?,
            REQUEST_SET_TOPIC_SCHEMA => fields("control request SetTopicSchema", decoder, |decoder| {
                let topic_id = TopicId::new(decoder.u64()?);
                Ok(ControlRequest::SetTopicSchema { topic_id, schema: decode_topic_schema(decoder)? })
            })?,
            _ => return Err(format!("unknown control request tag {tag}")),
        };
        refuse_trailing("control request", decoder)?;
        Ok(request)
    }
}

fn decode_attach_topic(decoder: &mut Decoder) -> DecodeResult<ControlRequest> {
    let (topic_id, name) = (TopicId::new(decoder.u64()?), decoder.str()?);
    let (retention_seconds, recovering) = (decoder.u64()?, decoder.bool()?);
    let (source, active) = decode_source_and_active(decoder)?;
    Ok(ControlRequest::AttachTopic { topic_id, name, retention_seconds, recovering, source, active })
}

fn decode_gate_sources(decoder: &mut Decoder) -> DecodeResult<ControlRequest> {
    let (topic_id, generation) = (TopicId::new(decoder.u64()?), decoder.u64()?);
    let (before, after, count) = (decoder.u32()?, decoder.u32()?, decoder.u32()? as usize);
    if count > SOURCE_FLOORS_LISTED_MAX {
        return Err("more subscriptions passing a change than SOURCE_FLOORS_LISTED_MAX");
    }
    let mut passed = Vec::with_capacity(count.min(decoder.remaining() / 8));
    for _ in 0..count {
        passed.push(decoder.u64()?);
    }
    Ok(ControlRequest::GateSources { topic_id, generation, before, after, passed })
}

/// A topic's schema or none: a flag, then its settings (as the catalog writes them) and its
/// revisions, counted.
fn encode_topic_schema(encoder: &mut Encoder, schema: Option<&crate::router::schemas::TopicSchema>) {
    encoder.bool(schema.is_some());
    let Some(schema) = schema else { return };
    let settings = &schema.settings;
    encoder
        .str(&settings.schema)
        .u8(settings.encoding as u8)
        .str(&settings.first_revision_id)
        .str(&settings.last_revision_id)
        .u32(schema.revisions.len() as u32);
    for revision in &schema.revisions {
        encoder
            .str(&revision.revision_id)
            .u8(revision.schema_type as u8)
            .str(&revision.definition)
            .u64(revision.created_ms);
    }
}

fn decode_topic_schema(decoder: &mut Decoder) -> DecodeResult<Option<crate::router::schemas::TopicSchema>> {
    use crate::catalog::schemas::{SchemaEncoding, SchemaRevision, SchemaSettings, SchemaType};
    if !decoder.bool()? {
        return Ok(None);
    }
    let settings = SchemaSettings {
        schema: decoder.str()?,
        encoding: SchemaEncoding::from_number(decoder.u8()?).ok_or("an unknown schema encoding")?,
        first_revision_id: decoder.str()?,
        last_revision_id: decoder.str()?,
    };
    let count = decoder.u32()? as usize;
    if count > crate::router::schemas::SCHEMA_REVISIONS_MAX {
        return Err("more revisions than SCHEMA_REVISIONS_MAX");
    }
    let mut revisions = Vec::with_capacity(count);
    for _ in 0..count {
        revisions.push(SchemaRevision {
            revision_id: decoder.str()?,
            schema_type: SchemaType::from_number(decoder.u8()?).ok_or("an unknown schema type")?,
            definition: decoder.str()?,
            created_ms: decoder.u64()?,
        });
    }
    Ok(Some(crate::router::schemas::TopicSchema { settings, revisions }))
}

fn decode_cluster_hosts(decoder: &mut Decoder) -> DecodeResult<ControlRequest> {
    let count = decoder.u32()? as usize;
    if count > CLUSTER_HOSTS_MAX {
        return Err("more hosts than CLUSTER_HOSTS_MAX");
    }
    let mut hosts = Vec::with_capacity(count);
    for _ in 0..count {
        hosts.push(decoder.str()?.parse().map_err(|_| "a host that is not an IP address")?);
    }
    Ok(ControlRequest::ClusterHosts { hosts })
}

/// An AttachSubscription's fields: the settings in the middle, their push configuration (a
/// push subscription's only) last.
fn decode_attach_subscription(decoder: &mut Decoder) -> DecodeResult<ControlRequest> {
    let (subscription_id, name, topic_id) = (decoder.u64()?, decoder.str()?, TopicId::new(decoder.u64()?));
    let mut settings = decode_settings_but_push(decoder)?;
    let (create, start_offset) = (decoder.bool()?, decoder.u64()?);
    settings.push = decode_push_last(decoder)?;
    Ok(ControlRequest::AttachSubscription { subscription_id, name, topic_id, settings, create, start_offset })
}

fn encode_peers(encoder: &mut Encoder, peers: &[crate::replication::source::Peer]) {
    encoder.u32(peers.len() as u32);
    for peer in peers {
        encoder.u32(peer.shard.global()).str(&peer.address);
    }
}

fn decode_peers(decoder: &mut Decoder) -> DecodeResult<Vec<crate::replication::source::Peer>> {
    let count = decoder.u32()? as usize;
    if count > REPLICAS_MAX {
        return Err("more replicas than REPLICAS_MAX");
    }
    let mut peers = Vec::with_capacity(count);
    for _ in 0..count {
        let shard = crate::ids::ShardId::from_global(decoder.u32()?);
        peers.push(crate::replication::source::Peer { shard, address: decoder.str()? });
    }
    Ok(peers)
}

fn encode_settings_update(encoder: &mut Encoder, update: &SettingsUpdate) {
    match update {
        SettingsUpdate::Topic { retention_seconds } => {
            encoder.u8(UPDATE_TOPIC).u64(*retention_seconds);
        }
        SettingsUpdate::Subscription { subscription_id, settings } => {
            encoder.u8(UPDATE_SUBSCRIPTION).u64(*subscription_id);
            encode_settings_but_push(encoder, settings);
            // The message's last field (the settings update is UpdateSettings' last).
            encode_push_last(encoder, settings.push.as_deref());
        }
    }
}

fn decode_settings_update(decoder: &mut Decoder) -> Result<SettingsUpdate, String> {
    let tag = decoder.u8().map_err(|_| "control request UpdateSettings has no settings update".to_owned())?;
    match tag {
        UPDATE_TOPIC => fields("control request UpdateSettings Topic", decoder, |decoder| {
            Ok(SettingsUpdate::Topic { retention_seconds: decoder.u64()? })
        }),
        UPDATE_SUBSCRIPTION => fields("control request UpdateSettings Subscription", decoder, |decoder| {
            let subscription_id = decoder.u64()?;
            let mut settings = decode_settings_but_push(decoder)?;
            settings.push = decode_push_last(decoder)?;
            Ok(SettingsUpdate::Subscription { subscription_id, settings })
        }),
        _ => Err(format!("control request UpdateSettings has unknown settings update tag {tag}")),
    }
}

impl ControlOk {
    pub fn encode(&self) -> Vec<u8> {
        let mut encoder;
        match self {
            ControlOk::Done => encoder = Encoder::new(OK_DONE),
            ControlOk::SubscriptionStart(offset) => {
                encoder = Encoder::new(OK_SUBSCRIPTION_START);
                encoder.u64(*offset);
            }
            ControlOk::Stats(shard, topics) => {
                let push = topics.iter().flat_map(|topic| &topic.subscriptions).any(|sub| sub.push.is_some());
                encoder = Encoder::new(if push { OK_STATS_WITH_PUSH } else { OK_STATS });
                encode_shard_stats(&mut encoder, shard);
                encoder.u32(topics.len() as u32);
                for topic in topics {
                    encode_topic_stats(&mut encoder, topic, push);
                }
            }
            ControlOk::Requests(figures) => {
                let flow = figures.flow != crate::metrics::shard::FlowFigures::default();
                encoder = Encoder::new(if flow { OK_REQUESTS_WITH_FLOW } else { OK_REQUESTS });
                encode_shard_figures(&mut encoder, figures);
                if flow {
                    let flow = &figures.flow;
                    encoder
                        .u64(flow.outstanding_messages)
                        .u64(flow.outstanding_bytes)
                        .u64(flow.deliveries_paused)
                        .u64(flow.publishes_slowed)
                        .u64(flow.publishes_refused_messages_rate)
                        .u64(flow.publishes_refused_bytes_rate)
                        .u64(flow.publishes_refused_held_bytes)
                        .u64(flow.publish_held_bytes);
                }
            }
            ControlOk::Resynced { logs, batches } => {
                encoder = Encoder::new(OK_RESYNCED);
                encoder.u64(*logs).u64(*batches);
            }
            ControlOk::Fenced { last_epoch, durable_end } => {
                encoder = Encoder::new(OK_FENCED);
                encoder.u64(*last_epoch).u64(*durable_end);
            }
            ControlOk::Topics(topics) => {
                encoder = Encoder::new(OK_TOPICS);
                encoder.u32(topics.len() as u32);
                for topic in topics {
                    encoder.u64(topic.get());
                }
            }
            ControlOk::Progress(progress) => {
                encoder = Encoder::new(OK_PROGRESS);
                encoder.bool(progress.leader).u64(progress.epoch).bool(progress.epoch_committed);
                for end in progress.durable_ends.iter().chain(&progress.committed_ends) {
                    encoder.u64(*end);
                }
                encoder.u32(progress.followers.len() as u32);
                for (shard, ends) in &progress.followers {
                    encoder.u32(*shard).u64(ends[0]).u64(ends[1]);
                }
            }
            ControlOk::SourcesApplied { fence, floors } => {
                encoder = Encoder::new(OK_SOURCES_APPLIED);
                encoder.u64(*fence).u32(floors.len() as u32);
                for (subscription_id, floor) in floors {
                    encoder.u64(*subscription_id).u64(*floor);
                }
            }
        }
        encoder.0
    }

    pub fn decode(bytes: &[u8]) -> Result<ControlOk, String> {
        let mut decoder = Decoder::new(bytes);
        let tag = decoder.u8().map_err(|_| "control reply is empty".to_owned())?;
        let decoder = &mut decoder;
        let ok = match tag {
            OK_DONE => ControlOk::Done,
            OK_SUBSCRIPTION_START => fields("control reply SubscriptionStart", decoder, |decoder| {
                Ok(ControlOk::SubscriptionStart(decoder.u64()?))
            })?,
            OK_STATS | OK_STATS_WITH_PUSH => fields("control reply Stats", decoder, |decoder| {
                let push = tag == OK_STATS_WITH_PUSH;
                let shard = decode_shard_stats(decoder)?;
                let topics = decode_list(decoder, |decoder| decode_topic_stats(decoder, push))?;
                Ok(ControlOk::Stats(shard, topics))
            })?,
            OK_REQUESTS | OK_REQUESTS_WITH_FLOW => fields("control reply Requests", decoder, |decoder| {
                let mut figures = decode_shard_figures(decoder)?;
                if tag == OK_REQUESTS_WITH_FLOW {
                    figures.flow = crate::metrics::shard::FlowFigures {
                        outstanding_messages: decoder.u64()?,
                        outstanding_bytes: decoder.u64()?,
                        deliveries_paused: decoder.u64()?,
                        publishes_slowed: decoder.u64()?,
                        publishes_refused_messages_rate: decoder.u64()?,
                        publishes_refused_bytes_rate: decoder.u64()?,
                        publishes_refused_held_bytes: decoder.u64()?,
                        publish_held_bytes: decoder.u64()?,
                    };
                }
                Ok(ControlOk::Requests(figures))
            })?,
            OK_RESYNCED => fields("control reply Resynced", decoder, |decoder| {
                Ok(ControlOk::Resynced { logs: decoder.u64()?, batches: decoder.u64()? })
            })?,
            OK_FENCED => fields("control reply Fenced", decoder, |decoder| {
                Ok(ControlOk::Fenced { last_epoch: decoder.u64()?, durable_end: decoder.u64()? })
            })?,
            OK_TOPICS => fields("control reply Topics", decoder, |decoder| {
                let count = decoder.u32()? as usize;
                if count > TOPICS_LISTED_MAX {
                    return Err("more topics than TOPICS_LISTED_MAX");
                }
                let topics =
                    (0..count).map(|_| decoder.u64().map(TopicId::new)).collect::<DecodeResult<Vec<_>>>()?;
                Ok(ControlOk::Topics(topics))
            })?,
            OK_PROGRESS => fields("control reply Progress", decoder, |decoder| {
                let (leader, epoch, epoch_committed) = (decoder.bool()?, decoder.u64()?, decoder.bool()?);
                let durable_ends = [decoder.u64()?, decoder.u64()?];
                let committed_ends = [decoder.u64()?, decoder.u64()?];
                let count = decoder.u32()? as usize;
                if count > REPLICAS_MAX {
                    return Err("more followers than REPLICAS_MAX");
                }
                let followers = (0..count)
                    .map(|_| Ok((decoder.u32()?, [decoder.u64()?, decoder.u64()?])))
                    .collect::<DecodeResult<Vec<(u32, [u64; 2])>>>()?;
                Ok(ControlOk::Progress(super::ReplicaProgress {
                    leader,
                    epoch,
                    epoch_committed,
                    durable_ends,
                    committed_ends,
                    followers,
                }))
            })?,
            OK_SOURCES_APPLIED => fields("control reply SourcesApplied", decoder, |decoder| {
                let fence = decoder.u64()?;
                let count = decoder.u32()? as usize;
                if count > SOURCE_FLOORS_LISTED_MAX {
                    return Err("more ack floors than SOURCE_FLOORS_LISTED_MAX");
                }
                let floors = (0..count)
                    .map(|_| Ok((decoder.u64()?, decoder.u64()?)))
                    .collect::<DecodeResult<Vec<_>>>()?;
                Ok(ControlOk::SourcesApplied { fence, floors })
            })?,
            _ => return Err(format!("unknown control reply tag {tag}")),
        };
        refuse_trailing("control reply", decoder)?;
        Ok(ok)
    }
}

/// A forwarder's answer to a `ControlRequest`: its `ControlOk`, or the status it failed with.
pub fn encode_reply(result: &Result<ControlOk, Status>) -> Vec<u8> {
    match result {
        Ok(ok) => {
            let mut bytes = vec![REPLY_OK];
            bytes.extend_from_slice(&ok.encode());
            bytes
        }
        Err(status) => {
            let mut encoder = Encoder::new(REPLY_ERROR);
            encoder.u32(code_number(status.code)).str(&status.message);
            encoder.0
        }
    }
}

pub fn decode_reply(bytes: &[u8]) -> Result<Result<ControlOk, Status>, String> {
    let mut decoder = Decoder::new(bytes);
    match decoder.u8().map_err(|_| "control reply is empty".to_owned())? {
        REPLY_OK => Ok(Ok(ControlOk::decode(&bytes[1..])?)),
        REPLY_ERROR => {
            let decoder = &mut decoder;
            let (number, message) =
                fields("control reply status", decoder, |decoder| Ok((decoder.u32()?, decoder.str()?)))?;
            let code = code_from_number(number)
                .ok_or_else(|| format!("control reply has unknown status code {number}"))?;
            refuse_trailing("control reply status", decoder)?;
            Ok(Err(Status::new(code, message)))
        }
        outcome => Err(format!("unknown control reply outcome {outcome}")),
    }
}

/// A status code's number is its place in `Code::ALL`, which only grows at its end, so nodes of
/// two versions agree on every code both know.
fn code_number(code: Code) -> u32 {
    Code::ALL.iter().position(|known| *known == code).expect("Code::ALL lists every code") as u32
}

fn code_from_number(number: u32) -> Option<Code> {
    Code::ALL.get(number as usize).copied()
}

fn encode_shard_stats(encoder: &mut Encoder, shard: &ShardStats) {
    encoder.u32(shard.shard).u32(shard.topics).u32(shard.directories.len() as u32);
    for directory in &shard.directories {
        encoder.str(&directory.path).str(&directory.fenced);
    }
    encoder.u64(shard.repairs).u32(shard.quarantined.len() as u32);
    for topic in &shard.quarantined {
        encoder.str(&topic.name).str(&topic.reason);
    }
    encode_latency(encoder, &shard.publish_latency);
    encode_latency(encoder, &shard.commit_latency);
}

fn decode_shard_stats(decoder: &mut Decoder) -> DecodeResult<ShardStats> {
    Ok(ShardStats {
        shard: decoder.u32()?,
        topics: decoder.u32()?,
        directories: decode_list(decoder, |decoder| {
            Ok(DirectoryStatus { path: decoder.str()?, fenced: decoder.str()? })
        })?,
        repairs: decoder.u64()?,
        quarantined: decode_list(decoder, |decoder| {
            Ok(QuarantinedTopic { name: decoder.str()?, reason: decoder.str()? })
        })?,
        publish_latency: decode_latency(decoder)?,
        commit_latency: decode_latency(decoder)?,
    })
}

fn encode_latency(encoder: &mut Encoder, latency: &LatencySummary) {
    encoder
        .u64(latency.count)
        .u64(latency.p50_us)
        .u64(latency.p99_us)
        .u64(latency.p999_us)
        .u64(latency.max_us);
}

fn decode_latency(decoder: &mut Decoder) -> DecodeResult<LatencySummary> {
    Ok(LatencySummary {
        count: decoder.u64()?,
        p50_us: decoder.u64()?,
        p99_us: decoder.u64()?,
        p999_us: decoder.u64()?,
        max_us: decoder.u64()?,
    })
}

/// A topic's stats; with `push`, each subscription's push figures after its others (a
/// presence flag, then `encode_push_stats`).
fn encode_topic_stats(encoder: &mut Encoder, topic: &TopicStats, push: bool) {
    encoder
        .str(&topic.name)
        .u32(topic.shard)
        .u64(topic.first_offset)
        .u64(topic.end_offset)
        .u64(topic.disk_bytes)
        .u64(topic.published_per_second)
        .u64(topic.published_messages_total)
        .u64(topic.published_bytes_total)
        .u32(topic.subscriptions.len() as u32);
    for subscription in &topic.subscriptions {
        encoder
            .str(&subscription.name)
            .u64(subscription.backlog_messages)
            .u64(subscription.outstanding_messages)
            .u64(subscription.delivered_total)
            .u64(subscription.expired_total)
            .u64(subscription.oldest_unacked_age_ms)
            .u64(subscription.idle_ms)
            .u64(subscription.delivered_per_second)
            .u64(subscription.acked_per_second)
            .u64(subscription.redelivered_total)
            .u64(subscription.acked_total)
            .u64(subscription.dead_lettered_total)
            .u64(subscription.backlog_bytes)
            .u64(subscription.open_streams);
        if push {
            encoder.bool(subscription.push.is_some());
            if let Some(push) = &subscription.push {
                encode_push_stats(encoder, push);
            }
        }
    }
    encoder.bool(topic.replication.is_some());
    if let Some(replica) = &topic.replication {
        encoder
            .bool(replica.leader)
            .u64(replica.epoch)
            .u64(replica.durable_end)
            .u64(replica.committed_end)
            .u32(replica.followers.len() as u32);
        for follower in &replica.followers {
            encoder
                .u32(follower.shard)
                .str(&follower.address)
                .u64(follower.durable_end)
                .u64(follower.lag_messages)
                .u64(follower.journal_lag_entries)
                .bool(follower.answered_ms_ago.is_some())
                .u64(follower.answered_ms_ago.unwrap_or(0));
        }
    }
}

fn decode_replica_stats(decoder: &mut Decoder) -> DecodeResult<Option<ReplicaStats>> {
    if !decoder.bool()? {
        return Ok(None);
    }
    Ok(Some(ReplicaStats {
        leader: decoder.bool()?,
        epoch: decoder.u64()?,
        durable_end: decoder.u64()?,
        committed_end: decoder.u64()?,
        followers: decode_list(decoder, |decoder| {
            Ok(FollowerStats {
                shard: decoder.u32()?,
                address: decoder.str()?,
                durable_end: decoder.u64()?,
                lag_messages: decoder.u64()?,
                journal_lag_entries: decoder.u64()?,
                answered_ms_ago: {
                    let known = decoder.bool()?;
                    let ago = decoder.u64()?;
                    known.then_some(ago)
                },
            })
        })?,
    }))
}

fn encode_push_stats(encoder: &mut Encoder, push: &PushStats) {
    encoder.str(&push.endpoint).u32(push.window).u32(push.outstanding).bool(push.last_error.is_some());
    if let Some(error) = &push.last_error {
        encoder.str(&error.reason).u64(error.ms_ago);
    }
    encoder.u64(push.failures_in_a_row).u32(push.requests_by_class.len() as u32);
    for (class, count) in &push.requests_by_class {
        encoder.str(class).u64(*count);
    }
}

fn decode_push_stats(decoder: &mut Decoder) -> DecodeResult<PushStats> {
    Ok(PushStats {
        endpoint: decoder.str()?,
        window: decoder.u32()?,
        outstanding: decoder.u32()?,
        last_error: match decoder.bool()? {
            true => Some(PushError { reason: decoder.str()?, ms_ago: decoder.u64()? }),
            false => None,
        },
        failures_in_a_row: decoder.u64()?,
        requests_by_class: decode_list(decoder, |decoder| Ok((decoder.str()?, decoder.u64()?)))?,
    })
}

fn decode_topic_stats(decoder: &mut Decoder, push: bool) -> DecodeResult<TopicStats> {
    Ok(TopicStats {
        name: decoder.str()?,
        shard: decoder.u32()?,
        first_offset: decoder.u64()?,
        end_offset: decoder.u64()?,
        disk_bytes: decoder.u64()?,
        published_per_second: decoder.u64()?,
        published_messages_total: decoder.u64()?,
        published_bytes_total: decoder.u64()?,
        subscriptions: decode_list(decoder, |decoder| {
            Ok(SubscriptionStats {
                name: decoder.str()?,
                backlog_messages: decoder.u64()?,
                outstanding_messages: decoder.u64()?,
                delivered_total: decoder.u64()?,
                expired_total: decoder.u64()?,
                oldest_unacked_age_ms: decoder.u64()?,
                idle_ms: decoder.u64()?,
                delivered_per_second: decoder.u64()?,
                acked_per_second: decoder.u64()?,
                redelivered_total: decoder.u64()?,
                acked_total: decoder.u64()?,
                dead_lettered_total: decoder.u64()?,
                backlog_bytes: decoder.u64()?,
                open_streams: decoder.u64()?,
                push: match push && decoder.bool()? {
                    true => Some(decode_push_stats(decoder)?),
                    false => None,
                },
            })
        })?,
        replication: decode_replica_stats(decoder)?,
        // Not carried, so that these bytes stay what older nodes read: the router that asked
        // fills both from its catalog (`Router::stats`), for `/metrics` alone.
        source: crate::ids::SourceId::FIRST,
        several_sources: false,
    })
}

fn encode_histogram(encoder: &mut Encoder, histogram: &crate::metrics::histogram::DurationHistogram) {
    encoder.u32(histogram.buckets.len() as u32);
    for count in &histogram.buckets {
        encoder.u64(*count);
    }
    encoder.u64(histogram.sum_us);
}

fn decode_histogram(decoder: &mut Decoder) -> DecodeResult<crate::metrics::histogram::DurationHistogram> {
    let buckets = decode_list(decoder, |decoder| decoder.u64())?;
    if !buckets.is_empty() && buckets.len() != crate::metrics::histogram::DURATION_BUCKETS + 1 {
        return Err("a histogram with other buckets than DURATION_BUCKETS_US");
    }
    Ok(crate::metrics::histogram::DurationHistogram { buckets, sum_us: decoder.u64()? })
}

fn encode_shard_figures(encoder: &mut Encoder, figures: &crate::metrics::shard::ShardFigures) {
    encoder.u32(figures.commands.len() as u32);
    for command in &figures.commands {
        encoder.u32(command.command as u32).u32(command.codes.len() as u32);
        for (code, count) in &command.codes {
            encoder.u32(*code as u32).u64(*count);
        }
        encode_histogram(encoder, &command.duration);
    }
    encode_histogram(encoder, &figures.publish_ack);
    encode_histogram(encoder, &figures.commit);
    encode_histogram(encoder, &figures.delivery);
    encoder.u32(figures.directories.len() as u32);
    for directory in &figures.directories {
        encoder.u32(directory.copy);
        encode_histogram(encoder, &directory.writes);
        encode_histogram(encoder, &directory.syncs);
        encoder.u64(directory.written_bytes).u64(directory.write_errors);
    }
    encoder.u64(figures.connections);
}

fn decode_shard_figures(decoder: &mut Decoder) -> DecodeResult<crate::metrics::shard::ShardFigures> {
    let commands = decode_list(decoder, |decoder| {
        Ok(crate::metrics::requests::CommandFigures {
            command: decoder.u32()? as u16,
            codes: decode_list(decoder, |decoder| Ok((decoder.u32()? as u16, decoder.u64()?)))?,
            duration: decode_histogram(decoder)?,
        })
    })?;
    Ok(crate::metrics::shard::ShardFigures {
        commands,
        publish_ack: decode_histogram(decoder)?,
        commit: decode_histogram(decoder)?,
        delivery: decode_histogram(decoder)?,
        directories: decode_list(decoder, |decoder| {
            Ok(crate::metrics::shard::DirectoryFigures {
                copy: decoder.u32()?,
                writes: decode_histogram(decoder)?,
                syncs: decode_histogram(decoder)?,
                written_bytes: decoder.u64()?,
                write_errors: decoder.u64()?,
            })
        })?,
        connections: decoder.u64()?,
        flow: crate::metrics::shard::FlowFigures::default(),
    })
}

/// A count and then that many items. The count comes from the network, so nothing is reserved
/// by it: the list grows only by items actually read, and a count larger than the input ends
/// at the first missing item.
fn decode_list<T>(
    decoder: &mut Decoder,
    mut item: impl FnMut(&mut Decoder) -> DecodeResult<T>,
) -> DecodeResult<Vec<T>> {
    let count = decoder.u32()?;
    let mut items = Vec::new();
    for _ in 0..count {
        items.push(item(decoder)?);
    }
    Ok(items)
}

/// Reads a message's fields, naming the message in any error the codec reports.
/// A unit's source, the last field of an attach: written only for a source after the first,
/// so that a topic's own attach is the bytes it was, and a node of the version before sources
/// refuses a source's (trailing bytes) rather than serve it as a topic's own log.
/// A topic attach's last fields: its source, then its topic's active count
/// (`topic::sources`). A topic's own log in a topic of one source (source 0, count 1) writes
/// neither, the bytes of the version before sources; any other writes both, which a node of
/// that version refuses (trailing bytes) rather than serve a source as a topic's own log. Both
/// or neither: a cut attach is never another one, and a count is never 0.
fn encode_source_and_active(encoder: &mut Encoder, source: crate::ids::SourceId, active: u32) {
    assert!(active >= 1, "an attach names its topic's active count");
    if source == crate::ids::SourceId::FIRST && active == 1 {
        return;
    }
    encoder.u32(source.get()).u32(active);
}

fn decode_source_and_active(decoder: &mut Decoder) -> DecodeResult<(crate::ids::SourceId, u32)> {
    if decoder.is_empty() {
        return Ok((crate::ids::SourceId::FIRST, 1));
    }
    let source = crate::ids::SourceId::new(decoder.u32()?)
        .ok_or("an attach naming a source past SOURCES_PER_TOPIC_MAX")?;
    match decoder.u32()? {
        0 => Err("an attach naming an active count of 0"),
        1 if source == crate::ids::SourceId::FIRST => {
            Err("a topic of one source's attach with its fields written")
        }
        active => Ok((source, active)),
    }
}

/// A replica attach's last fields: its source, then its topic's active count. A topic of one
/// source's own log (source 0, count 1) writes neither, the bytes of the version before
/// sources; a later source with no count said (0) writes its number alone, the bytes of the
/// version before replicated sources retired. Any other writes both: a node of that version
/// refuses them (trailing bytes after a later source's number, or source 0 named) rather than
/// attach a follower that would take every key once promoted.
fn encode_replica_source(encoder: &mut Encoder, source: crate::ids::SourceId, active: u32) {
    let first = source == crate::ids::SourceId::FIRST;
    assert!(!(first && active == 0), "a topic's own log's replica attach names its topic's active count");
    if first && active == 1 {
        return;
    }
    encoder.u32(source.get());
    if active != 0 {
        encoder.u32(active);
    }
}

fn decode_replica_source(decoder: &mut Decoder) -> DecodeResult<(crate::ids::SourceId, u32)> {
    if decoder.is_empty() {
        return Ok((crate::ids::SourceId::FIRST, 1));
    }
    let source = crate::ids::SourceId::new(decoder.u32()?)
        .ok_or("an attach naming a source past SOURCES_PER_TOPIC_MAX")?;
    let first = source == crate::ids::SourceId::FIRST;
    if decoder.is_empty() {
        return match first {
            true => Err("an attach naming source 0 with no active count"),
            false => Ok((source, 0)),
        };
    }
    match decoder.u32()? {
        0 => Err("an attach naming an active count of 0"),
        1 if first => Err("a topic of one source's attach with its fields written"),
        active => Ok((source, active)),
    }
}

fn fields<'a, T>(
    what: &str,
    decoder: &mut Decoder<'a>,
    read: impl FnOnce(&mut Decoder<'a>) -> DecodeResult<T>,
) -> Result<T, String> {
    read(decoder).map_err(|why| format!("{what}: {why}"))
}

fn refuse_trailing(what: &str, decoder: &Decoder) -> Result<(), String> {
    match decoder.remaining() {
        0 => Ok(()),
        count => Err(format!("{what} has {count} trailing bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Labels, SubscriptionSettings};

    fn settings(seed: u32) -> SubscriptionSettings {
        SubscriptionSettings {
            ack_deadline_seconds: 30 + seed,
            retain_acked_messages: true,
            message_retention_seconds: 86_400 + seed as u64,
            enable_message_ordering: true,
            filter: format!("attributes.seed = \"{seed}\""),
            dead_letter_topic: "projects/p/topics/dead".to_owned(),
            max_delivery_attempts: 5 + seed,
            minimum_backoff_seconds: 10 + seed,
            maximum_backoff_seconds: 600 + seed,
            expiration_ttl_seconds: 7 * 86_400 + seed as u64,
            labels: Labels::from([
                ("team".to_owned(), "ops".to_owned()),
                ("tier".to_owned(), "gold".to_owned()),
            ]),
            enable_exactly_once_delivery: true,
            // Odd seeds push (with every optional part set), even ones pull.
            push: (seed % 2 == 1).then(|| {
                Box::new(crate::catalog::PushConfig {
                    endpoint: format!("https://receiver.example/{seed}"),
                    attributes: Labels::from([("x-goog-version".to_owned(), "v1".to_owned())]),
                    wrapper: crate::catalog::PushWrapper::NoWrapper { write_metadata: true },
                    oidc_token: Some(crate::catalog::OidcToken {
                        service_account_email: "pusher@p.iam.example".to_owned(),
                        audience: "https://receiver.example".to_owned(),
                    }),
                    ..Default::default()
                })
            }),
        }
    }

    /// A pull subscription's attach and settings update are the bytes the version before push
    /// subscriptions wrote, which a node of that version reads; a push subscription's are the
    /// same with the push configuration after them, which that version refuses (trailing bytes)
    /// rather than attach the subscription as a pull one.
    #[test]
    fn a_pull_subscriptions_control_messages_are_those_of_the_version_before_push() {
        let pull = settings(2);
        assert!(pull.push.is_none());
        let attach = |settings: SubscriptionSettings| ControlRequest::AttachSubscription {
            subscription_id: 3,
            name: "s".to_owned(),
            topic_id: TopicId::new(4),
            settings,
            create: true,
            start_offset: 9,
        };
        // The version before: the attach's fields, the settings with their trailer, its fields.
        let mut before = Encoder::new(REQUEST_ATTACH_SUBSCRIPTION);
        before.u64(3).str("s").u64(4);
        encode_settings_but_push(&mut before, &pull).bool(true).u64(9);
        assert_eq!(attach(pull.clone()).encode(), before.0);

        let update = |settings: SubscriptionSettings| ControlRequest::UpdateSettings {
            topic_id: TopicId::new(4),
            update: SettingsUpdate::Subscription { subscription_id: 3, settings },
        };
        let mut before_update = Encoder::new(REQUEST_UPDATE_SETTINGS);
        before_update.u64(4).u8(UPDATE_SUBSCRIPTION).u64(3);
        encode_settings_but_push(&mut before_update, &pull);
        assert_eq!(update(pull.clone()).encode(), before_update.0);

        // A push subscription's: the same bytes, then its configuration, which the version
        // before's decoder (every field but the push configuration, then nothing) refuses.
        let push = SubscriptionSettings { push: settings(1).push, ..pull };
        for (message, prefix) in
            [(attach(push.clone()).encode(), &before.0), (update(push).encode(), &before_update.0)]
        {
            assert!(message.len() > prefix.len() && message.starts_with(prefix));
            let mut old = Decoder::new(&message[prefix.len()..]);
            assert!(refuse_trailing("a message of the version before", &old).is_err());
            assert!(decode_push_last(&mut old).unwrap().is_some());
            assert!(old.is_empty());
        }
    }

    /// A push subscription's control messages carry its project after its configuration only
    /// when it is not the default: a default one's bytes are the version before the project's,
    /// another's leave bytes that version refuses (trailing) rather than attach the subscription
    /// to push in the default project.
    #[test]
    fn a_push_subscriptions_project_follows_its_configuration_only_when_it_is_not_the_default() {
        let attach = |settings: SubscriptionSettings| ControlRequest::AttachSubscription {
            subscription_id: 3,
            name: "s".to_owned(),
            topic_id: TopicId::new(4),
            settings,
            create: true,
            start_offset: 9,
        };
        let default = settings(1);
        assert_eq!(default.push.as_ref().unwrap().project, crate::catalog::PUSH_PROJECT_DEFAULT);
        let mut other = default.clone();
        other.push.as_mut().unwrap().project = "my-proj".to_owned();
        let (default_bytes, other_bytes) = (attach(default.clone()).encode(), attach(other.clone()).encode());
        let mut expected = default_bytes.clone();
        Encoder(Vec::new()).str("my-proj").0.iter().for_each(|byte| expected.push(*byte));
        assert_eq!(other_bytes, expected);
        assert_eq!(ControlRequest::decode(&other_bytes), Ok(attach(other)));
        assert_eq!(ControlRequest::decode(&default_bytes), Ok(attach(default)));
        // The version before's decoder reads the configuration, then finds the project left.
        let mut old = Decoder::new(&other_bytes[other_bytes.len() - 4 - "my-proj".len()..]);
        assert!(refuse_trailing("a message of the version before", &old).is_err());
        assert_eq!(old.str(), Ok("my-proj".to_owned()));
    }

    /// One request of each variant (two for those with an option or a nested variant), every
    /// field away from its default.
    fn topic_schema() -> crate::router::schemas::TopicSchema {
        use crate::catalog::schemas::{SchemaEncoding, SchemaRevision, SchemaSettings, SchemaType};
        let revision = |revision_id: &str, schema_type, definition: &str| SchemaRevision {
            revision_id: revision_id.to_owned(),
            schema_type,
            definition: definition.to_owned(),
            created_ms: 1_700_000_000_000,
        };
        crate::router::schemas::TopicSchema {
            settings: SchemaSettings {
                schema: "states".to_owned(),
                encoding: SchemaEncoding::Binary,
                first_revision_id: "0000000a".to_owned(),
                last_revision_id: String::new(),
            },
            revisions: vec![
                revision("0000000a", SchemaType::Avro, r#"{"type": "string"}"#),
                revision("0000000b", SchemaType::ProtocolBuffer, "syntax = \"proto3\"; message A {}"),
            ],
        }
    }

    /// A topic's schema names at most `SCHEMA_REVISIONS_MAX` revisions, and known encodings
    /// and types only.
    #[test]
    fn a_topic_schema_of_too_many_revisions_or_unknown_numbers_is_refused() {
        let request =
            ControlRequest::SetTopicSchema { topic_id: TopicId::new(3), schema: Some(topic_schema()) };
        let bytes = request.encode();
        // The tag, the topic, the flag, then the schema's name ("states"), its encoding.
        let encoding_at = 1 + 8 + 1 + 4 + "states".len();
        let mut unknown = bytes.clone();
        unknown[encoding_at] = 9;
        assert!(ControlRequest::decode(&unknown).unwrap_err().contains("unknown schema encoding"));
        let count_at = encoding_at + 1 + 4 + "0000000a".len() + 4;
        assert_eq!(bytes[count_at..count_at + 4], 2u32.to_le_bytes());
        let mut many = bytes.clone();
        many[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(ControlRequest::decode(&many).unwrap_err().contains("SCHEMA_REVISIONS_MAX"));
        let type_at = count_at + 4 + 4 + "0000000a".len();
        let mut unknown_type = bytes;
        unknown_type[type_at] = 0;
        assert!(ControlRequest::decode(&unknown_type).unwrap_err().contains("unknown schema type"));
    }

    fn requests() -> Vec<ControlRequest> {
        vec![
            ControlRequest::AttachTopic {
                topic_id: TopicId::new(0x0102_0304_0506_0708),
                name: "projects/p/topics/orders".to_owned(),
                retention_seconds: 3600,
                recovering: true,
                source: crate::ids::SourceId::FIRST,
                active: 1,
            },
            ControlRequest::AttachTopic {
                topic_id: TopicId::new(19),
                name: "projects/p/topics/orders".to_owned(),
                retention_seconds: 0,
                recovering: false,
                source: crate::ids::SourceId::FIRST,
                active: 3,
            },
            ControlRequest::ApplySources { topic_id: TopicId::new(19), active: 2 },
            ControlRequest::GateSources {
                topic_id: TopicId::new(19),
                generation: 3,
                before: 2,
                after: 3,
                passed: vec![18, u64::MAX],
            },
            ControlRequest::SetTopicSchema { topic_id: TopicId::new(19), schema: Some(topic_schema()) },
            ControlRequest::SetTopicSchema { topic_id: TopicId::new(20), schema: None },
            ControlRequest::DetachTopic { topic_id: TopicId::new(17), delete_data: true },
            ControlRequest::AttachSubscription {
                subscription_id: 18,
                name: "projects/p/subscriptions/billing".to_owned(),
                topic_id: TopicId::new(17),
                settings: settings(1),
                create: true,
                start_offset: 99,
            },
            ControlRequest::DurableEnd { topic_id: TopicId::new(u64::MAX) },
            ControlRequest::DetachSubscription {
                subscription_id: 18,
                name: "projects/p/subscriptions/billing".to_owned(),
                topic_id: TopicId::new(17),
                deleted: true,
            },
            ControlRequest::Seek {
                subscription_id: 18,
                topic_id: TopicId::new(17),
                time_ms: 1_700_000_000_000,
                snapshot_id: None,
            },
            ControlRequest::Seek {
                subscription_id: 18,
                topic_id: TopicId::new(17),
                time_ms: 0,
                snapshot_id: Some(SnapshotId::new(42)),
            },
            ControlRequest::TakeSnapshot {
                topic_id: TopicId::new(17),
                subscription_id: 18,
                snapshot_id: SnapshotId::new(42),
                expire_time_ms: 1_800_000_000_000,
            },
            ControlRequest::DropSnapshot { topic_id: TopicId::new(17), snapshot_id: SnapshotId::new(42) },
            ControlRequest::UpdateSettings {
                topic_id: TopicId::new(17),
                update: SettingsUpdate::Topic { retention_seconds: 7200 },
            },
            ControlRequest::UpdateSettings {
                topic_id: TopicId::new(17),
                update: SettingsUpdate::Subscription { subscription_id: 18, settings: settings(2) },
            },
            ControlRequest::Stats,
            ControlRequest::Requests,
            ControlRequest::ResyncDirectory { index: 2 },
            ControlRequest::AttachReplica {
                topic_id: TopicId::new(17),
                name: "orders".to_owned(),
                retention_seconds: 0,
                recovering: true,
                source: crate::ids::SourceId::FIRST,
                active: 1,
            },
            ControlRequest::AttachReplica {
                topic_id: TopicId::new(18),
                name: "orders".to_owned(),
                retention_seconds: 0,
                recovering: false,
                source: crate::ids::SourceId::new(2).unwrap(),
                active: 2,
            },
            ControlRequest::PromoteReplica {
                topic_id: TopicId::new(17),
                epoch: 3,
                replicas: vec![
                    crate::replication::source::Peer {
                        shard: crate::ids::ShardId::from_global(1),
                        address: "10.0.0.1:7451".to_owned(),
                    },
                    crate::replication::source::Peer {
                        shard: crate::ids::ShardId::from_global(65_536),
                        address: "10.0.0.2:7451".to_owned(),
                    },
                ],
            },
            ControlRequest::DemoteReplica { topic_id: TopicId::new(17), epoch: 4 },
            ControlRequest::FenceReplica { topic_id: TopicId::new(17), epoch: 4 },
            ControlRequest::ElectionsWanted,
            ControlRequest::ReplicaProgress { topic_id: TopicId::new(77) },
            ControlRequest::ClusterHosts {
                hosts: vec!["10.0.0.4".parse().unwrap(), "fd00::4".parse().unwrap()],
            },
        ]
    }

    fn shard_stats() -> ShardStats {
        let latency = |base: u64| LatencySummary {
            count: base,
            p50_us: base + 1,
            p99_us: base + 2,
            p999_us: base + 3,
            max_us: base + 4,
        };
        ShardStats {
            shard: 3,
            topics: 2,
            directories: vec![
                DirectoryStatus { path: "/data/a".to_owned(), fenced: String::new() },
                DirectoryStatus { path: "/data/b".to_owned(), fenced: "write failed: EIO".to_owned() },
            ],
            repairs: 7,
            quarantined: vec![QuarantinedTopic {
                name: "projects/p/topics/broken".to_owned(),
                reason: "segment 4 is damaged".to_owned(),
            }],
            publish_latency: latency(100),
            commit_latency: latency(200),
        }
    }

    fn topic_stats(name: &str, subscriptions: usize) -> TopicStats {
        TopicStats {
            name: name.to_owned(),
            shard: 3,
            source: crate::ids::SourceId::FIRST,
            several_sources: false,
            first_offset: 10,
            end_offset: 1000,
            disk_bytes: 1 << 20,
            published_per_second: 250,
            published_messages_total: 990,
            published_bytes_total: 99_000,
            subscriptions: (0..subscriptions as u64)
                .map(|index| SubscriptionStats {
                    name: format!("projects/p/subscriptions/s{index}"),
                    backlog_messages: index + 1,
                    outstanding_messages: index + 2,
                    delivered_total: index + 3,
                    expired_total: index + 4,
                    oldest_unacked_age_ms: index + 5,
                    idle_ms: index + 6,
                    delivered_per_second: index + 7,
                    acked_per_second: index + 8,
                    redelivered_total: index + 9,
                    acked_total: index + 10,
                    dead_lettered_total: index + 11,
                    backlog_bytes: index + 12,
                    open_streams: index + 13,
                    push: None,
                })
                .collect(),
            replication: (subscriptions > 0).then(|| ReplicaStats {
                leader: subscriptions > 1,
                epoch: 4,
                durable_end: 1000,
                committed_end: 990,
                followers: vec![
                    FollowerStats {
                        shard: 2049,
                        address: "10.0.0.2:7451".to_owned(),
                        durable_end: 980,
                        lag_messages: 20,
                        journal_lag_entries: 3,
                        answered_ms_ago: Some(12),
                    },
                    FollowerStats { shard: 3073, answered_ms_ago: None, ..FollowerStats::default() },
                ],
            }),
        }
    }

    /// A topic whose first subscription pushes and has failed, whose second pushes and has
    /// not, and whose third pulls.
    fn push_topic_stats() -> TopicStats {
        let mut topic = topic_stats("projects/p/topics/pushed", 3);
        topic.subscriptions[0].push = Some(PushStats {
            endpoint: "https://receiver.example/push".to_owned(),
            window: 12,
            outstanding: 3,
            last_error: Some(PushError { reason: "HTTP status 500".to_owned(), ms_ago: 1_500 }),
            failures_in_a_row: 2,
            requests_by_class: vec![("2xx".to_owned(), 40), ("5xx".to_owned(), 2)],
        });
        topic.subscriptions[1].push =
            Some(PushStats { endpoint: "http://10.0.0.9/p".to_owned(), ..PushStats::default() });
        topic
    }

    fn oks() -> Vec<ControlOk> {
        vec![
            ControlOk::Stats(shard_stats(), vec![topic_stats("a", 1), push_topic_stats()]),
            ControlOk::Done,
            ControlOk::SubscriptionStart(12_345),
            ControlOk::Stats(
                shard_stats(),
                vec![topic_stats("projects/p/topics/a", 2), topic_stats("b", 1), topic_stats("t", 0)],
            ),
            ControlOk::Stats(ShardStats::default(), Vec::new()),
            ControlOk::Resynced { logs: 4, batches: 96 },
            ControlOk::Fenced { last_epoch: 3, durable_end: 1_000 },
            ControlOk::Topics(vec![TopicId::new(1), TopicId::new(2), TopicId::new(3)]),
            ControlOk::Requests(crate::metrics::shard::ShardFigures {
                commands: vec![
                    crate::metrics::requests::CommandFigures {
                        command: 6,
                        codes: vec![(0, 41), (14, 2)],
                        duration: crate::metrics::histogram::DurationHistogram {
                            buckets: (0..25).collect(),
                            sum_us: 123_456,
                        },
                    },
                    crate::metrics::requests::CommandFigures {
                        command: 9,
                        codes: vec![(100, 1)],
                        ..Default::default()
                    },
                ],
                publish_ack: crate::metrics::histogram::DurationHistogram {
                    buckets: (100..125).collect(),
                    sum_us: 7,
                },
                directories: vec![crate::metrics::shard::DirectoryFigures {
                    copy: 2,
                    written_bytes: 4096,
                    write_errors: 1,
                    syncs: crate::metrics::histogram::DurationHistogram {
                        buckets: (200..225).collect(),
                        sum_us: 9,
                    },
                    ..Default::default()
                }],
                connections: 12,
                ..Default::default()
            }),
            ControlOk::Requests(crate::metrics::shard::ShardFigures::default()),
            ControlOk::Requests(crate::metrics::shard::ShardFigures {
                connections: 1,
                flow: crate::metrics::shard::FlowFigures {
                    outstanding_messages: 1,
                    outstanding_bytes: 2,
                    deliveries_paused: 3,
                    publishes_slowed: 4,
                    publishes_refused_messages_rate: 5,
                    publishes_refused_bytes_rate: 6,
                    publishes_refused_held_bytes: 7,
                    publish_held_bytes: 8,
                },
                ..Default::default()
            }),
            ControlOk::Progress(crate::control::ReplicaProgress {
                leader: true,
                epoch: 4,
                epoch_committed: true,
                durable_ends: [100, 7],
                committed_ends: [90, 6],
                followers: vec![(1, [90, 6]), (65_536, [0, 0])],
            }),
            ControlOk::SourcesApplied { fence: 41, floors: vec![(18, 40), (u64::MAX, 0)] },
            ControlOk::SourcesApplied { fence: 0, floors: Vec::new() },
        ]
    }

    /// Every reply: each `ControlOk`, and a status of every code the domain has.
    fn replies() -> Vec<Result<ControlOk, Status>> {
        let statuses = Code::ALL.iter().map(|code| Err(Status::new(*code, format!("failed with {code}"))));
        oks().into_iter().map(Ok).chain(statuses).collect()
    }

    /// Which decoder an encoding was written for.
    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Request,
        Ok,
        Reply,
    }

    fn decodes(kind: Kind, bytes: &[u8]) -> bool {
        match kind {
            Kind::Request => ControlRequest::decode(bytes).is_ok(),
            Kind::Ok => ControlOk::decode(bytes).is_ok(),
            Kind::Reply => decode_reply(bytes).is_ok(),
        }
    }

    /// Every valid encoding the samples give, with what it encodes and its decoder.
    fn encodings() -> Vec<(String, Kind, Vec<u8>)> {
        let requests =
            requests().into_iter().map(|request| (format!("{request:?}"), Kind::Request, request.encode()));
        let oks = oks().into_iter().map(|ok| (format!("{ok:?}"), Kind::Ok, ok.encode()));
        let replies =
            replies().into_iter().map(|reply| (format!("{reply:?}"), Kind::Reply, encode_reply(&reply)));
        requests.chain(oks).chain(replies).collect()
    }

    /// Fails to compile when a variant is added, so that the samples above grow with it.
    #[test]
    fn the_samples_hold_every_variant() {
        let mut seen_requests = [false; 23];
        for request in requests() {
            let index = match request {
                ControlRequest::AttachTopic { .. } => 0,
                ControlRequest::DetachTopic { .. } => 1,
                ControlRequest::AttachSubscription { .. } => 2,
                ControlRequest::DurableEnd { .. } => 3,
                ControlRequest::DetachSubscription { .. } => 4,
                ControlRequest::Seek { .. } => 5,
                ControlRequest::TakeSnapshot { .. } => 6,
                ControlRequest::DropSnapshot { .. } => 7,
                ControlRequest::UpdateSettings { update: SettingsUpdate::Topic { .. }, .. } => 8,
                ControlRequest::UpdateSettings { update: SettingsUpdate::Subscription { .. }, .. } => 9,
                ControlRequest::Stats => 10,
                ControlRequest::ResyncDirectory { .. } => 11,
                ControlRequest::AttachReplica { .. } => 12,
                ControlRequest::PromoteReplica { .. } => 13,
                ControlRequest::DemoteReplica { .. } => 14,
                ControlRequest::FenceReplica { .. } => 15,
                ControlRequest::ElectionsWanted => 16,
                ControlRequest::ReplicaProgress { .. } => 17,
                ControlRequest::Requests => 18,
                ControlRequest::ClusterHosts { .. } => 19,
                ControlRequest::ApplySources { .. } => 20,
                ControlRequest::GateSources { .. } => 21,
                ControlRequest::SetTopicSchema { .. } => 22,
            };
            seen_requests[index] = true;
        }
        assert!(seen_requests.iter().all(|seen| *seen), "{seen_requests:?}");
        let mut seen_oks = [false; 9];
        for ok in oks() {
            let index = match ok {
                ControlOk::Done => 0,
                ControlOk::SubscriptionStart(_) => 1,
                ControlOk::Stats(..) => 2,
                ControlOk::Resynced { .. } => 3,
                ControlOk::Fenced { .. } => 4,
                ControlOk::Topics(_) => 5,
                ControlOk::Progress(_) => 6,
                ControlOk::Requests(_) => 7,
                ControlOk::SourcesApplied { .. } => 8,
            };
            seen_oks[index] = true;
        }
        assert!(seen_oks.iter().all(|seen| *seen), "{seen_oks:?}");
    }

    #[test]
    fn every_request_round_trips() {
        for request in requests() {
            let bytes = request.encode();
            assert_eq!(ControlRequest::decode(&bytes), Ok(request));
        }
    }

    #[test]
    fn every_ok_round_trips() {
        for ok in oks() {
            let bytes = ok.encode();
            assert_eq!(ControlOk::decode(&bytes), Ok(ok));
        }
    }

    #[test]
    fn every_reply_round_trips() {
        for reply in replies() {
            let bytes = encode_reply(&reply);
            assert_eq!(decode_reply(&bytes), Ok(reply));
        }
    }

    /// The message a push subscription's attach or settings update is without its push
    /// configuration: the pull subscription's, which that message's bytes begin with.
    fn pull_twin(mut request: ControlRequest) -> Option<Vec<u8>> {
        let settings: &mut SubscriptionSettings = match &mut request {
            // A topic attach with its source and count is, without them, a topic of one
            // source's own log's (`encode_source_and_active`).
            ControlRequest::AttachTopic { source, active, .. } if (source.get(), *active) != (0, 1) => {
                (*source, *active) = (crate::ids::SourceId::FIRST, 1);
                return Some(request.encode());
            }
            ControlRequest::AttachSubscription { settings, .. } => settings,
            ControlRequest::UpdateSettings {
                update: SettingsUpdate::Subscription { settings, .. }, ..
            } => settings,
            _ => return None,
        };
        settings.push.take()?;
        Some(request.encode())
    }

    /// Every field is always written but two, so that no proper prefix of a message is one but
    /// two: a topic attach cut right before its source and count is a topic of one source's
    /// own log's; a push subscription's attach or settings update cut right before its push
    /// configuration, the message's last field, is the pull subscription's (`encode_push_last`,
    /// which a node of the version before push reads).
    #[test]
    fn every_truncation_is_an_error() {
        let mut twins: Vec<Vec<u8>> = requests().into_iter().filter_map(pull_twin).collect();
        // A later source's replica attach cut right before its count is the version before's
        // (its number alone), and cut right before its number a topic's own log's.
        for (index, request) in requests().into_iter().enumerate() {
            let ControlRequest::AttachReplica { source, active, .. } = request else { continue };
            if source == crate::ids::SourceId::FIRST || active == 0 {
                continue;
            }
            for (source, active) in [(source, 0), (crate::ids::SourceId::FIRST, 1)] {
                let mut twin = requests().swap_remove(index);
                if let ControlRequest::AttachReplica { source: at, active: count, .. } = &mut twin {
                    (*at, *count) = (source, active);
                }
                twins.push(twin.encode());
            }
        }
        assert!(!twins.is_empty(), "the samples hold a push subscription's attach");
        for (what, kind, bytes) in encodings() {
            assert!(decodes(kind, &bytes), "{what} does not decode whole");
            for length in 0..bytes.len() {
                if matches!(kind, Kind::Request) && twins.iter().any(|twin| twin[..] == bytes[..length]) {
                    continue;
                }
                assert!(
                    !decodes(kind, &bytes[..length]),
                    "{what} cut to {length} of {} bytes decoded",
                    bytes.len()
                );
            }
        }
    }

    /// An attach of a topic's own log is the bytes of the version before sources; one of
    /// another source ends with its number, which that version refuses (trailing bytes) rather
    /// than serve the source as a topic's own log, and which is never source 0.
    #[test]
    fn a_sources_attach_ends_with_its_number_and_a_topics_own_is_as_before() {
        let attaches = requests().into_iter().filter(|request| {
            matches!(
                request,
                ControlRequest::AttachTopic { active: 1, .. }
                    | ControlRequest::AttachReplica { active: 1, .. }
            )
        });
        let mut count = 0;
        for mut request in attaches {
            let before = request.encode();
            match &mut request {
                ControlRequest::AttachTopic { source, .. } | ControlRequest::AttachReplica { source, .. } => {
                    *source = crate::ids::SourceId::new(3).unwrap()
                }
                _ => unreachable!(),
            }
            let bytes = request.encode();
            assert_eq!((&bytes[..before.len()], bytes.len()), (&before[..], before.len() + 8));
            let replica = matches!(request, ControlRequest::AttachReplica { .. });
            assert_eq!(ControlRequest::decode(&bytes), Ok(request));
            for length in before.len() + 1..bytes.len() {
                // A replica's attach cut after its source's number is the version before's,
                // whose count was not said.
                if replica && length == before.len() + 4 {
                    continue;
                }
                assert!(ControlRequest::decode(&bytes[..length]).is_err(), "cut to {length} decoded");
            }
            let mut zero = before.clone();
            zero.extend_from_slice(&0u32.to_le_bytes());
            zero.extend_from_slice(&1u32.to_le_bytes());
            assert!(ControlRequest::decode(&zero).is_err(), "an attach naming source 0 decoded");
            count += 1;
        }
        assert_eq!(count, 2, "the samples hold both attaches");
    }

    /// A replica's attach says its topic's active count only for a topic of several sources:
    /// a topic of one source's is the bytes of the version before sources, a later source's
    /// with no count said the bytes of the version before retiring replicated sources (its
    /// number alone, decoded as count 0, never applied), and one with the count ends with it,
    /// which that version refuses (trailing bytes) rather than attach a follower taking every
    /// key once promoted. Source 0 of a topic of several names its count after number 0,
    /// which the version before refuses as naming source 0.
    #[test]
    fn a_replicas_attach_ends_with_its_topics_active_count_for_several_sources_only() {
        let attach = |source: u32, active: u32| ControlRequest::AttachReplica {
            topic_id: TopicId::new(17),
            name: "orders".to_owned(),
            retention_seconds: 0,
            recovering: true,
            source: crate::ids::SourceId::new(source).unwrap(),
            active,
        };
        let mut before = Encoder::new(REQUEST_ATTACH_REPLICA);
        before.u64(17).str("orders").u64(0).bool(true);
        let own = before.0.clone();
        assert_eq!(attach(0, 1).encode(), own);
        let mut numbered = own.clone();
        numbered.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(attach(3, 0).encode(), numbered, "a source's number alone, as before");
        assert_eq!(ControlRequest::decode(&numbered), Ok(attach(3, 0)));
        let mut counted = numbered.clone();
        counted.extend_from_slice(&2u32.to_le_bytes());
        assert_eq!(attach(3, 2).encode(), counted);
        assert_eq!(ControlRequest::decode(&counted), Ok(attach(3, 2)));
        let mut first = own.clone();
        first.extend_from_slice(&0u32.to_le_bytes());
        first.extend_from_slice(&2u32.to_le_bytes());
        assert_eq!(attach(0, 2).encode(), first);
        assert_eq!(ControlRequest::decode(&first), Ok(attach(0, 2)));
        // Source 0 named with no count, or with a count of 0, is no attach this version writes.
        assert!(ControlRequest::decode(&first[..own.len() + 4]).is_err());
        let mut zero = numbered.clone();
        zero.extend_from_slice(&0u32.to_le_bytes());
        assert!(ControlRequest::decode(&zero).is_err());
    }

    /// A shard without push subscriptions answers Stats in the bytes of the version before
    /// them; one with them under a tag of its own, which that version refuses as unknown rather
    /// than misreads.
    #[test]
    fn a_stats_reply_without_push_subscriptions_is_that_of_the_version_before_push() {
        let pull = ControlOk::Stats(shard_stats(), vec![topic_stats("a", 2), topic_stats("b", 0)]);
        let bytes = pull.encode();
        assert_eq!(bytes[0], OK_STATS);
        // The version before: every subscription's figures and nothing after them.
        let mut before = Encoder::new(OK_STATS);
        encode_shard_stats(&mut before, &shard_stats());
        before.u32(2);
        for topic in [topic_stats("a", 2), topic_stats("b", 0)] {
            encode_topic_stats(&mut before, &topic, false);
        }
        assert_eq!(bytes, before.0);
        let push = ControlOk::Stats(shard_stats(), vec![push_topic_stats()]);
        let bytes = push.encode();
        assert_eq!(bytes[0], OK_STATS_WITH_PUSH);
        assert_eq!(ControlOk::decode(&bytes).unwrap(), push);
        // Without push figures, the push subscriptions' reply is the pull one's bytes.
        let mut stripped = push_topic_stats();
        stripped.subscriptions.iter_mut().for_each(|subscription| subscription.push = None);
        assert_eq!(ControlOk::Stats(shard_stats(), vec![stripped]).encode()[0], OK_STATS);
    }

    #[test]
    fn trailing_bytes_are_refused() {
        for request in requests() {
            let mut bytes = request.encode();
            bytes.push(0);
            let error = ControlRequest::decode(&bytes).unwrap_err();
            // A pull subscription's attach or update reads what follows as a push configuration
            // (its optional last field), and a push subscription's of the default project as its
            // project (the configuration's optional last field), and refuses it as one; a topic's
            // own attach reads it as a source's number (its optional last field), and refuses it
            // cut.
            let optional_last = matches!(
                &request,
                ControlRequest::AttachSubscription { settings, .. }
                    | ControlRequest::UpdateSettings {
                        update: SettingsUpdate::Subscription { settings, .. },
                        ..
                    } if !crate::catalog::entry::names_a_project(settings.push.as_deref())
            ) || matches!(
                &request,
                ControlRequest::AttachTopic { .. } | ControlRequest::AttachReplica { .. }
            );
            assert!(error.contains("1 trailing bytes") || optional_last, "{error}");
        }
        for ok in oks() {
            let mut bytes = ok.encode();
            bytes.push(0);
            let error = ControlOk::decode(&bytes).unwrap_err();
            assert!(error.contains("1 trailing bytes"), "{error}");
        }
        for reply in replies() {
            let mut bytes = encode_reply(&reply);
            bytes.extend_from_slice(&[0, 0]);
            let error = decode_reply(&bytes).unwrap_err();
            assert!(error.contains("2 trailing bytes"), "{error}");
        }
    }

    #[test]
    fn errors_name_what_was_wrong() {
        assert_eq!(ControlRequest::decode(&[]).unwrap_err(), "control request is empty");
        assert_eq!(ControlRequest::decode(&[0]).unwrap_err(), "unknown control request tag 0");
        assert_eq!(ControlRequest::decode(&[200]).unwrap_err(), "unknown control request tag 200");
        assert_eq!(ControlOk::decode(&[11]).unwrap_err(), "unknown control reply tag 11");
        assert_eq!(decode_reply(&[3]).unwrap_err(), "unknown control reply outcome 3");
        assert_eq!(
            ControlRequest::decode(&[REQUEST_DURABLE_END, 1, 2]).unwrap_err(),
            "control request DurableEnd: entry is truncated"
        );
        assert_eq!(
            ControlRequest::decode(&[REQUEST_UPDATE_SETTINGS, 1, 0, 0, 0, 0, 0, 0, 0, 7]).unwrap_err(),
            "control request UpdateSettings has unknown settings update tag 7"
        );
        let mut unknown_code = Encoder::new(REPLY_ERROR);
        unknown_code.u32(57).str("who knows");
        assert_eq!(decode_reply(&unknown_code.0).unwrap_err(), "control reply has unknown status code 57");
        let mut not_text = Encoder::new(REQUEST_ATTACH_TOPIC);
        not_text.u64(1).u32(2).u8(0xff).u8(0xfe).u64(0).bool(false);
        assert_eq!(
            ControlRequest::decode(&not_text.0).unwrap_err(),
            "control request AttachTopic: string is not UTF-8"
        );
    }

    /// A list's count is read from the input; one far beyond it is refused. Had decoding
    /// reserved room for that many items by the count, the allocation would abort the test.
    #[test]
    fn a_huge_count_is_refused_without_allocating() {
        let mut bytes = ControlOk::Stats(ShardStats::default(), Vec::new()).encode();
        let length = bytes.len();
        bytes[length - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        let error = ControlOk::decode(&bytes).unwrap_err();
        assert_eq!(error, "control reply Stats: entry is truncated");
    }

    fn decode_all(bytes: &[u8]) {
        let _ = ControlRequest::decode(bytes);
        let _ = ControlOk::decode(bytes);
        let _ = decode_reply(bytes);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            decode_all(&bytes);
        }

        /// Random bytes rarely start with a valid tag; these do, so that decoding reaches the
        /// fields of every variant.
        #[test]
        fn arbitrary_fields_after_valid_tags_never_panic(
            tags in proptest::collection::vec(0u8..25, 1..4),
            rest in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
        ) {
            decode_all(&[tags, rest].concat());
        }

        /// A valid message with one byte changed reaches deepest: lengths and counts that
        /// are almost right.
        #[test]
        fn a_changed_byte_never_panics(
            sample in proptest::sample::select(encodings()),
            position in proptest::num::usize::ANY,
            value in proptest::num::u8::ANY,
        ) {
            let (_, _, mut bytes) = sample;
            let length = bytes.len();
            bytes[position % length] = value;
            decode_all(&bytes);
        }
    }
}
