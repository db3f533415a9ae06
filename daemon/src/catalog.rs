//! The router's catalog: topics and subscriptions, kept durably in a log of entries (the same
//! group-committed, checksummed log as messages) and replayed in order at start.
//!
//! Ids are `boot_count << 32 | sequence`: each start appends a durable `Boot` entry first, so
//! an id handed out before a crash is never handed out again, even if the entry that used it
//! never became durable.

use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::log::{record, Directories, Log, LogConfig, LogError};
use crate::storage::Storage;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;

pub const CATALOG_LOG_ID: u64 = 0x4341_5441_4c4f_4700;

const KIND_BOOT: u8 = 1;
const KIND_TOPIC_CREATED: u8 = 2;
const KIND_TOPIC_DELETED: u8 = 3;
const KIND_SUBSCRIPTION_CREATED: u8 = 4;
const KIND_SUBSCRIPTION_DELETED: u8 = 5;
const KIND_SNAPSHOT_CREATED: u8 = 6;
const KIND_SNAPSHOT_DELETED: u8 = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub id: u64,
    pub name: String,
    pub topic_id: u64,
    pub expire_time_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    pub id: u64,
    pub name: String,
    /// 0: not set (messages are kept until every subscription has acknowledged them).
    pub message_retention_seconds: u64,
}

/// A subscription's settings as stored; defaults already applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionSettings {
    pub ack_deadline_seconds: u32,
    pub retain_acked_messages: bool,
    pub message_retention_seconds: u64,
    pub enable_message_ordering: bool,
    pub filter: String,
    pub dead_letter_topic: String,
    pub max_delivery_attempts: u32,
    pub minimum_backoff_seconds: u32,
    pub maximum_backoff_seconds: u32,
    pub expiration_ttl_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionRecord {
    pub id: u64,
    pub name: String,
    pub topic_id: u64,
    /// The topic's name when the subscription was created (the topic may be deleted since).
    pub topic_name: String,
    /// The sync point: the subscription receives every message at or after this offset.
    pub start_offset: u64,
    pub settings: SubscriptionSettings,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogEntry {
    Boot { count: u32 },
    TopicCreated(TopicRecord),
    TopicDeleted { id: u64 },
    SubscriptionCreated(SubscriptionRecord),
    SubscriptionDeleted { id: u64 },
    SnapshotCreated(SnapshotRecord),
    SnapshotDeleted { id: u64 },
}

impl CatalogEntry {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            CatalogEntry::Boot { count } => Encoder::new(KIND_BOOT).u32(*count).0.clone(),
            CatalogEntry::TopicCreated(topic) => Encoder::new(KIND_TOPIC_CREATED)
                .u64(topic.id)
                .str(&topic.name)
                .u64(topic.message_retention_seconds)
                .0
                .clone(),
            CatalogEntry::TopicDeleted { id } => Encoder::new(KIND_TOPIC_DELETED).u64(*id).0.clone(),
            CatalogEntry::SubscriptionCreated(subscription) => {
                let settings = &subscription.settings;
                Encoder::new(KIND_SUBSCRIPTION_CREATED)
                    .u64(subscription.id)
                    .str(&subscription.name)
                    .u64(subscription.topic_id)
                    .str(&subscription.topic_name)
                    .u64(subscription.start_offset)
                    .u32(settings.ack_deadline_seconds)
                    .bool(settings.retain_acked_messages)
                    .u64(settings.message_retention_seconds)
                    .bool(settings.enable_message_ordering)
                    .str(&settings.filter)
                    .str(&settings.dead_letter_topic)
                    .u32(settings.max_delivery_attempts)
                    .u32(settings.minimum_backoff_seconds)
                    .u32(settings.maximum_backoff_seconds)
                    .u64(settings.expiration_ttl_seconds)
                    .0
                    .clone()
            }
            CatalogEntry::SubscriptionDeleted { id } => {
                Encoder::new(KIND_SUBSCRIPTION_DELETED).u64(*id).0.clone()
            }
            CatalogEntry::SnapshotCreated(snapshot) => Encoder::new(KIND_SNAPSHOT_CREATED)
                .u64(snapshot.id)
                .str(&snapshot.name)
                .u64(snapshot.topic_id)
                .u64(snapshot.expire_time_ms)
                .0
                .clone(),
            CatalogEntry::SnapshotDeleted { id } => Encoder::new(KIND_SNAPSHOT_DELETED).u64(*id).0.clone(),
        }
    }

    pub fn decode(bytes: &[u8]) -> DecodeResult<CatalogEntry> {
        let mut d = Decoder::new(bytes);
        let entry = match d.u8()? {
            KIND_BOOT => CatalogEntry::Boot { count: d.u32()? },
            KIND_TOPIC_CREATED => CatalogEntry::TopicCreated(TopicRecord {
                id: d.u64()?,
                name: d.str()?,
                message_retention_seconds: d.u64()?,
            }),
            KIND_TOPIC_DELETED => CatalogEntry::TopicDeleted { id: d.u64()? },
            KIND_SUBSCRIPTION_CREATED => CatalogEntry::SubscriptionCreated(SubscriptionRecord {
                id: d.u64()?,
                name: d.str()?,
                topic_id: d.u64()?,
                topic_name: d.str()?,
                start_offset: d.u64()?,
                settings: SubscriptionSettings {
                    ack_deadline_seconds: d.u32()?,
                    retain_acked_messages: d.bool()?,
                    message_retention_seconds: d.u64()?,
                    enable_message_ordering: d.bool()?,
                    filter: d.str()?,
                    dead_letter_topic: d.str()?,
                    max_delivery_attempts: d.u32()?,
                    minimum_backoff_seconds: d.u32()?,
                    maximum_backoff_seconds: d.u32()?,
                    expiration_ttl_seconds: d.u64()?,
                },
            }),
            KIND_SUBSCRIPTION_DELETED => CatalogEntry::SubscriptionDeleted { id: d.u64()? },
            KIND_SNAPSHOT_CREATED => CatalogEntry::SnapshotCreated(SnapshotRecord {
                id: d.u64()?,
                name: d.str()?,
                topic_id: d.u64()?,
                expire_time_ms: d.u64()?,
            }),
            KIND_SNAPSHOT_DELETED => CatalogEntry::SnapshotDeleted { id: d.u64()? },
            _ => return Err("unknown catalog entry kind"),
        };
        if !d.is_empty() {
            return Err("trailing bytes in catalog entry");
        }
        Ok(entry)
    }
}

/// The catalog in memory: what the entries so far add up to.
#[derive(Debug, Default)]
pub struct CatalogState {
    pub boot_count: u32,
    pub topics: BTreeMap<String, TopicRecord>,
    pub topic_names: HashMap<u64, String>,
    pub subscriptions: BTreeMap<String, SubscriptionRecord>,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

impl CatalogState {
    pub fn apply(&mut self, entry: CatalogEntry) {
        match entry {
            CatalogEntry::Boot { count } => self.boot_count = count,
            CatalogEntry::TopicCreated(topic) => {
                self.topic_names.insert(topic.id, topic.name.clone());
                self.topics.insert(topic.name.clone(), topic);
            }
            CatalogEntry::TopicDeleted { id } => {
                if let Some(name) = self.topic_names.remove(&id) {
                    self.topics.remove(&name);
                }
            }
            CatalogEntry::SubscriptionCreated(subscription) => {
                self.subscriptions.insert(subscription.name.clone(), subscription);
            }
            CatalogEntry::SubscriptionDeleted { id } => self.subscriptions.retain(|_, s| s.id != id),
            CatalogEntry::SnapshotCreated(snapshot) => {
                self.snapshots.insert(snapshot.name.clone(), snapshot);
            }
            CatalogEntry::SnapshotDeleted { id } => self.snapshots.retain(|_, s| s.id != id),
        }
    }

    pub fn topic_by_id(&self, id: u64) -> Option<&TopicRecord> {
        self.topic_names.get(&id).and_then(|name| self.topics.get(name))
    }
}

/// Opens (replays) the catalog in `directory` and durably records a new boot, whose count
/// prefixes every id handed out until the next start.
pub async fn open_catalog<S: Storage>(
    storage: S,
    directories: Rc<Directories>,
) -> Result<(Log<S>, CatalogState), LogError> {
    let config = LogConfig {
        segment_bytes_initial: 1 << 20,
        segment_bytes_max: 16 << 20,
        group_commit_bytes_max: 1 << 20,
        tail_cache_bytes_max: 1 << 20,
        tail_cache_budget: None,
        staging_bytes_max: 16 << 20,
        keep_files_open: true,
    };
    let (log, report) = Log::open(storage, directories, Path::new("catalog"), CATALOG_LOG_ID, config).await?;
    if report.batches_repaired > 0 {
        eprintln!(
            "ringpostd: catalog recovery repaired {} batch copies from healthy ones",
            report.batches_repaired
        );
    }
    if report.torn_bytes_discarded > 0 {
        eprintln!(
            "ringpostd: catalog recovery discarded a torn tail of {} bytes (an unacknowledged change)",
            report.torn_bytes_discarded
        );
    }
    let mut state = CatalogState::default();
    for stored in log.read(0, usize::MAX, usize::MAX).await? {
        let entry = CatalogEntry::decode(&stored.data).map_err(|why| {
            LogError::Corrupt(format!(
                "catalog entry at offset {} passed its checksum but not decoding: {why}",
                stored.offset
            ))
        })?;
        state.apply(entry);
    }
    let boot = CatalogEntry::Boot { count: state.boot_count + 1 };
    log.append(entry_records(&boot), 1).await?;
    state.apply(boot);
    Ok((log, state))
}

/// Encodes one catalog entry as unsealed log records.
pub fn entry_records(entry: &CatalogEntry) -> Vec<u8> {
    let bytes = entry.encode();
    let mut records = Vec::with_capacity(bytes.len() + 64);
    record::encode_record_unsealed(&mut records, 0, &bytes, &mut std::iter::empty(), "");
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let settings = SubscriptionSettings {
            ack_deadline_seconds: 30,
            filter: "attributes:x".into(),
            ..Default::default()
        };
        for entry in [
            CatalogEntry::Boot { count: 3 },
            CatalogEntry::TopicCreated(TopicRecord {
                id: 5,
                name: "orders".into(),
                message_retention_seconds: 0,
            }),
            CatalogEntry::TopicDeleted { id: 5 },
            CatalogEntry::SubscriptionCreated(SubscriptionRecord {
                id: 6,
                name: "audit".into(),
                topic_id: 5,
                topic_name: "orders".into(),
                start_offset: 12,
                settings,
            }),
            CatalogEntry::SubscriptionDeleted { id: 6 },
            CatalogEntry::SnapshotCreated(SnapshotRecord {
                id: 8,
                name: "before".into(),
                topic_id: 5,
                expire_time_ms: 9,
            }),
            CatalogEntry::SnapshotDeleted { id: 8 },
        ] {
            assert_eq!(CatalogEntry::decode(&entry.encode()), Ok(entry.clone()));
        }
    }
}
