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
/// Deletions that carry the record's name beside its id, so that applying one is a lookup, not
/// a scan of every record (kinds 5 and 7, written before, are still read).
const KIND_SUBSCRIPTION_DELETED_NAMED: u8 = 8;
const KIND_SNAPSHOT_DELETED_NAMED: u8 = 9;
/// Updates of a live topic or subscription (UpdateTopic, UpdateSubscription): each restates
/// every setting an update may change, so applying one needs nothing from the entries before.
const KIND_TOPIC_UPDATED: u8 = 10;
const KIND_SUBSCRIPTION_UPDATED: u8 = 11;

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
    Boot {
        count: u32,
    },
    TopicCreated(TopicRecord),
    TopicDeleted {
        id: u64,
    },
    SubscriptionCreated(SubscriptionRecord),
    /// `name` is empty in entries written before deletions recorded it.
    SubscriptionDeleted {
        id: u64,
        name: String,
    },
    SnapshotCreated(SnapshotRecord),
    /// `name` is empty in entries written before deletions recorded it.
    SnapshotDeleted {
        id: u64,
        name: String,
    },
    /// A topic's new message retention (0: not set).
    TopicUpdated {
        id: u64,
        message_retention_seconds: u64,
    },
    /// A subscription's settings after an update, whole; those an update cannot change
    /// (filter, ordering) are restated as they were.
    SubscriptionUpdated {
        id: u64,
        name: String,
        settings: SubscriptionSettings,
    },
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
                let mut encoder = Encoder::new(KIND_SUBSCRIPTION_CREATED);
                encoder
                    .u64(subscription.id)
                    .str(&subscription.name)
                    .u64(subscription.topic_id)
                    .str(&subscription.topic_name)
                    .u64(subscription.start_offset);
                encode_settings(&mut encoder, &subscription.settings).0.clone()
            }
            CatalogEntry::SubscriptionDeleted { id, name } if name.is_empty() => {
                Encoder::new(KIND_SUBSCRIPTION_DELETED).u64(*id).0.clone()
            }
            CatalogEntry::SubscriptionDeleted { id, name } => {
                Encoder::new(KIND_SUBSCRIPTION_DELETED_NAMED).u64(*id).str(name).0.clone()
            }
            CatalogEntry::SnapshotCreated(snapshot) => Encoder::new(KIND_SNAPSHOT_CREATED)
                .u64(snapshot.id)
                .str(&snapshot.name)
                .u64(snapshot.topic_id)
                .u64(snapshot.expire_time_ms)
                .0
                .clone(),
            CatalogEntry::SnapshotDeleted { id, name } if name.is_empty() => {
                Encoder::new(KIND_SNAPSHOT_DELETED).u64(*id).0.clone()
            }
            CatalogEntry::SnapshotDeleted { id, name } => {
                Encoder::new(KIND_SNAPSHOT_DELETED_NAMED).u64(*id).str(name).0.clone()
            }
            CatalogEntry::TopicUpdated { id, message_retention_seconds } => {
                Encoder::new(KIND_TOPIC_UPDATED).u64(*id).u64(*message_retention_seconds).0.clone()
            }
            CatalogEntry::SubscriptionUpdated { id, name, settings } => {
                let mut encoder = Encoder::new(KIND_SUBSCRIPTION_UPDATED);
                encoder.u64(*id).str(name);
                encode_settings(&mut encoder, settings).0.clone()
            }
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
                settings: decode_settings(&mut d)?,
            }),
            KIND_SUBSCRIPTION_DELETED => {
                CatalogEntry::SubscriptionDeleted { id: d.u64()?, name: String::new() }
            }
            KIND_SUBSCRIPTION_DELETED_NAMED => {
                CatalogEntry::SubscriptionDeleted { id: d.u64()?, name: non_empty(d.str()?)? }
            }
            KIND_SNAPSHOT_CREATED => CatalogEntry::SnapshotCreated(SnapshotRecord {
                id: d.u64()?,
                name: d.str()?,
                topic_id: d.u64()?,
                expire_time_ms: d.u64()?,
            }),
            KIND_SNAPSHOT_DELETED => CatalogEntry::SnapshotDeleted { id: d.u64()?, name: String::new() },
            KIND_SNAPSHOT_DELETED_NAMED => {
                CatalogEntry::SnapshotDeleted { id: d.u64()?, name: non_empty(d.str()?)? }
            }
            KIND_TOPIC_UPDATED => {
                CatalogEntry::TopicUpdated { id: d.u64()?, message_retention_seconds: d.u64()? }
            }
            KIND_SUBSCRIPTION_UPDATED => CatalogEntry::SubscriptionUpdated {
                id: d.u64()?,
                name: non_empty(d.str()?)?,
                settings: decode_settings(&mut d)?,
            },
            _ => return Err("unknown catalog entry kind"),
        };
        if !d.is_empty() {
            return Err("trailing bytes in catalog entry");
        }
        Ok(entry)
    }
}

/// A subscription's settings, in the order both its creation and its updates store them.
fn encode_settings<'a>(encoder: &'a mut Encoder, settings: &SubscriptionSettings) -> &'a mut Encoder {
    encoder
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
}

fn decode_settings(d: &mut Decoder) -> DecodeResult<SubscriptionSettings> {
    Ok(SubscriptionSettings {
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
    })
}

/// The catalog in memory: what the entries so far add up to.
#[derive(Debug, Default)]
pub struct CatalogState {
    pub boot_count: u32,
    pub topics: BTreeMap<String, TopicRecord>,
    pub topic_names: HashMap<u64, String>,
    /// Boxed: a B-tree fills its nodes about half when names arrive in order, and a record is
    /// 160 bytes; boxed, the empty slots cost 8 bytes each instead (about 130 bytes less per
    /// subscription).
    pub subscriptions: BTreeMap<String, Box<SubscriptionRecord>>,
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
                self.subscriptions.insert(subscription.name.clone(), Box::new(subscription));
            }
            CatalogEntry::SubscriptionDeleted { id, name } => {
                remove_record(&mut self.subscriptions, id, &name, |record| record.id)
            }
            CatalogEntry::SnapshotCreated(snapshot) => {
                self.snapshots.insert(snapshot.name.clone(), snapshot);
            }
            CatalogEntry::SnapshotDeleted { id, name } => {
                remove_record(&mut self.snapshots, id, &name, |record| record.id)
            }
            // An update of a record deleted since (or of another record under its name) changes
            // nothing: the router checks the record before it appends, but a deletion may
            // commit in between.
            CatalogEntry::TopicUpdated { id, message_retention_seconds } => {
                let topic = self.topic_names.get(&id).and_then(|name| self.topics.get_mut(name));
                if let Some(topic) = topic {
                    topic.message_retention_seconds = message_retention_seconds;
                }
            }
            CatalogEntry::SubscriptionUpdated { id, name, settings } => {
                if let Some(record) = self.subscriptions.get_mut(&name).filter(|record| record.id == id) {
                    record.settings = settings;
                }
            }
        }
    }

    pub fn topic_by_id(&self, id: u64) -> Option<&TopicRecord> {
        self.topic_names.get(&id).and_then(|name| self.topics.get(name))
    }
}

/// Removes record `id` from a map keyed by name: by its name when the deletion carries it (a
/// lookup), else by a scan (deletions written before they carried names). Deleting 10,000
/// subscriptions one by one by scan cost the router about a second of its core at 10,000
/// subscriptions, and grows with the square of their number.
fn remove_record<V>(records: &mut BTreeMap<String, V>, id: u64, name: &str, id_of: impl Fn(&V) -> u64) {
    if name.is_empty() {
        records.retain(|_, record| id_of(record) != id);
    } else if records.get(name).is_some_and(|record| id_of(record) == id) {
        records.remove(name);
    }
}

/// A name read from a deletion that must carry one.
fn non_empty(name: String) -> DecodeResult<String> {
    if name.is_empty() {
        return Err("a named deletion with an empty name");
    }
    Ok(name)
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
        // Read once, at start: extents kept after it would hold memory for nothing.
        read_ahead: false,
        // Small and slow-growing: its rare rolls are not worth a second file.
        prewrite: false,
        recycle: false,
        // Deleting topics and subscriptions is a way to free a full disk: their entries must
        // commit there, also when the catalog needs a new segment.
        reserve: true,
    };
    let (log, report) = Log::open(storage, directories, Path::new("catalog"), CATALOG_LOG_ID, config).await?;
    // Made at the first start, while there is room; on a full disk the catalog goes on without
    // one until `Router::retake_catalog_reserve` finds room.
    if let Err(error) = log.retake_reserve().await {
        eprintln!("ringpostd: reserving a segment for the catalog: {error}");
    }
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
    for stored in log.read_all(0).await? {
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

/// The catalog log is compacted once its segments take this many bytes (one copy) and four
/// times what a checkpoint of the live state would: creating and deleting topics otherwise
/// grows it without bound.
pub const CATALOG_COMPACTION_BYTES_MIN: u64 = 64 << 20;
/// Most bytes of checkpoint entries appended at once (the catalog's staging limit is 16 MiB).
const CHECKPOINT_APPEND_BYTES_MAX: usize = 4 << 20;

impl CatalogState {
    /// Entries that rebuild this state when replayed alone, or after any older entries: every
    /// one sets a record to its current value (the boot count, each live topic, subscription
    /// and snapshot), so replaying them over older history changes nothing that is live. What
    /// was deleted is simply absent.
    pub fn checkpoint_entries(&self) -> Vec<CatalogEntry> {
        let mut entries = vec![CatalogEntry::Boot { count: self.boot_count }];
        entries.extend(self.topics.values().cloned().map(CatalogEntry::TopicCreated));
        entries.extend(
            self.subscriptions.values().map(|record| CatalogEntry::SubscriptionCreated((**record).clone())),
        );
        entries.extend(self.snapshots.values().cloned().map(CatalogEntry::SnapshotCreated));
        entries
    }
}

/// Rewrites the live state at the end of the catalog log and deletes the segments before it,
/// when the log has grown past `bytes_min` and four times that checkpoint. Returns the number
/// of segments deleted. The caller must keep every other catalog append out until it returns:
/// an entry committed between the checkpoint's snapshot and its append (a deletion, say) would
/// be undone by the checkpoint on replay. A crash anywhere in here is safe: until the old
/// segments are gone the checkpoint only restates what they already say.
pub async fn compact<S: Storage>(
    log: &Log<S>,
    checkpoint: impl FnOnce() -> Vec<CatalogEntry>,
    bytes_min: u64,
) -> Result<usize, LogError> {
    if log.disk_bytes() < bytes_min {
        return Ok(0);
    }
    let encoded: Vec<Vec<u8>> = checkpoint().iter().map(entry_records).collect();
    let checkpoint_bytes: usize = encoded.iter().map(Vec::len).sum();
    if log.disk_bytes() < 4 * checkpoint_bytes as u64 {
        return Ok(0);
    }
    let mut checkpoint_start = None;
    let mut chunk = Vec::new();
    let mut chunk_entries = 0u32;
    for (index, records) in encoded.iter().enumerate() {
        chunk.extend_from_slice(records);
        chunk_entries += 1;
        if chunk.len() >= CHECKPOINT_APPEND_BYTES_MAX || index + 1 == encoded.len() {
            let (first, _) = log.append(std::mem::take(&mut chunk), chunk_entries).await?;
            checkpoint_start.get_or_insert(first);
            chunk_entries = 0;
        }
    }
    match checkpoint_start {
        Some(start) => log.remove_before(start).await,
        None => Ok(0),
    }
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
    use crate::log::tests::{directories, run};
    use crate::storage::sim::SimDisk;

    fn topic(id: u64) -> CatalogEntry {
        CatalogEntry::TopicCreated(TopicRecord {
            id,
            name: format!("topic-{id}"),
            message_retention_seconds: 0,
        })
    }

    fn subscription(id: u64, topic_id: u64) -> CatalogEntry {
        CatalogEntry::SubscriptionCreated(SubscriptionRecord {
            id,
            name: format!("subscription-{id}"),
            topic_id,
            topic_name: format!("topic-{topic_id}"),
            start_offset: id,
            settings: SubscriptionSettings { ack_deadline_seconds: 10, ..Default::default() },
        })
    }

    fn same_state(a: &CatalogState, b: &CatalogState) {
        assert_eq!(a.boot_count, b.boot_count);
        assert_eq!(a.topics, b.topics);
        assert_eq!(a.topic_names, b.topic_names);
        assert_eq!(a.subscriptions, b.subscriptions);
        assert_eq!(a.snapshots, b.snapshots);
    }

    /// Topics and subscriptions created and deleted by the thousand: compaction deletes the
    /// old segments, and the catalog reopened from disk (also at each crash point a power cut
    /// could leave) holds exactly the live state.
    /// Deleting topics is a way out of a full disk: the catalog keeps a reserve segment, so its
    /// entries commit on a full disk even when it needs a new segment.
    #[test]
    fn the_catalog_commits_on_a_full_disk() {
        run(async {
            let disk = SimDisk::new();
            let dirs = directories(1);
            let (log, _) = open_catalog(disk.clone(), dirs.clone()).await.unwrap();
            assert!(log.has_reserve(), "the catalog made no reserve at its first start");
            disk.set_no_space(true);
            // One block per commit: a 1 MiB first segment takes 256, so this needs a second.
            for id in 0..300u64 {
                log.append(entry_records(&CatalogEntry::TopicDeleted { id }), 1)
                    .await
                    .unwrap_or_else(|error| panic!("catalog entry {id} on a full disk: {error}"));
            }
            assert!(!log.has_reserve(), "the second segment took the reserve");
            assert!(log.closed_segments().len() == 1, "{:?}", log.closed_segments());
        });
    }

    #[test]
    fn compaction_keeps_the_live_state_and_bounds_the_log() {
        run(async {
            let disk = SimDisk::new();
            let dirs = directories(1);
            let (log, mut state) = open_catalog(disk.clone(), dirs.clone()).await.unwrap();
            let mut next = 1u64;
            for round in 0..40u64 {
                let mut records = Vec::new();
                let mut entries = Vec::new();
                for _ in 0..100 {
                    entries.push(topic(next));
                    entries.push(subscription(next + 1, next));
                    // Most of them go again; every fifth stays (ids go up by two).
                    if next % 10 != 1 {
                        entries.push(CatalogEntry::SubscriptionDeleted {
                            id: next + 1,
                            name: format!("subscription-{}", next + 1),
                        });
                        entries.push(CatalogEntry::TopicDeleted { id: next });
                    }
                    next += 2;
                }
                if round == 20 {
                    entries.push(CatalogEntry::SnapshotCreated(SnapshotRecord {
                        id: next,
                        name: "kept".into(),
                        topic_id: 1,
                        expire_time_ms: 9,
                    }));
                }
                for entry in &entries {
                    records.extend(entry_records(entry));
                }
                log.append(records, entries.len() as u32).await.unwrap();
                for entry in entries {
                    state.apply(entry);
                }
            }
            let before = log.disk_bytes();
            let checkpoint = || state.checkpoint_entries();
            assert_eq!(
                compact(&log, checkpoint, u64::MAX).await.unwrap(),
                0,
                "below the threshold nothing happens"
            );
            let removed = compact(&log, checkpoint, 0).await.unwrap();
            assert!(removed > 0, "old segments deleted");
            assert!(log.disk_bytes() < before, "{} bytes, {before} before", log.disk_bytes());
            assert_eq!(state.topics.len(), 800);
            assert_eq!(state.subscriptions.len(), 800);
            drop(log);

            disk.crash(crate::storage::sim::CrashMode::DropUnsynced);
            let (reopened, recovered) = open_catalog(disk.clone(), dirs.clone()).await.unwrap();
            // The reopen records one more boot; everything else is as it was.
            assert_eq!(recovered.boot_count, state.boot_count + 1);
            state.boot_count += 1;
            same_state(&recovered, &state);
            assert!(reopened.start_offset() > 0, "replay starts at the checkpoint");
        });
    }

    #[test]
    fn a_checkpoint_replayed_after_any_history_restates_the_live_state() {
        let mut state = CatalogState::default();
        for entry in
            [CatalogEntry::Boot { count: 4 }, topic(1), topic(2), subscription(3, 1), subscription(4, 2)]
        {
            state.apply(entry);
        }
        state.apply(CatalogEntry::SubscriptionDeleted { id: 4, name: "subscription-4".into() });
        state.apply(CatalogEntry::TopicDeleted { id: 2 });
        let checkpoint = state.checkpoint_entries();
        let mut alone = CatalogState::default();
        let mut after_history = CatalogState::default();
        for entry in [topic(2), subscription(4, 2), topic(9)] {
            after_history.apply(entry);
        }
        after_history.apply(CatalogEntry::TopicDeleted { id: 9 });
        for entry in checkpoint {
            alone.apply(entry.clone());
            after_history.apply(entry);
        }
        same_state(&alone, &state);
        // History before a checkpoint is always older than it, so what it deleted was deleted
        // there too; here it was not, and the checkpoint leaves it, which is why compaction
        // deletes the segments before it.
        assert!(after_history.topics.contains_key("topic-2"));
        assert_eq!(after_history.topics.len(), 2);
    }

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
            CatalogEntry::SubscriptionDeleted { id: 6, name: "audit".into() },
            CatalogEntry::SubscriptionDeleted { id: 6, name: String::new() },
            CatalogEntry::SnapshotCreated(SnapshotRecord {
                id: 8,
                name: "before".into(),
                topic_id: 5,
                expire_time_ms: 9,
            }),
            CatalogEntry::SnapshotDeleted { id: 8, name: "before".into() },
            CatalogEntry::SnapshotDeleted { id: 8, name: String::new() },
            CatalogEntry::TopicUpdated { id: 5, message_retention_seconds: 3600 },
            CatalogEntry::SubscriptionUpdated {
                id: 6,
                name: "audit".into(),
                settings: SubscriptionSettings {
                    ack_deadline_seconds: 60,
                    retain_acked_messages: true,
                    message_retention_seconds: 7200,
                    enable_message_ordering: true,
                    filter: "attributes:y".into(),
                    dead_letter_topic: "orders-dead".into(),
                    max_delivery_attempts: 7,
                    minimum_backoff_seconds: 1,
                    maximum_backoff_seconds: 30,
                    expiration_ttl_seconds: 86_400,
                },
            },
        ] {
            assert_eq!(CatalogEntry::decode(&entry.encode()), Ok(entry.clone()));
        }
    }

    /// Deletions written before they carried names (kinds 5 and 7, bytes as written then) still
    /// delete by id; named ones delete only the record of that id under that name.
    #[test]
    fn deletions_with_and_without_names_remove_the_right_record() {
        let mut state = CatalogState::default();
        for entry in [topic(1), subscription(3, 1), subscription(4, 1), subscription(5, 1)] {
            state.apply(entry);
        }
        state.apply(CatalogEntry::SnapshotCreated(SnapshotRecord {
            id: 7,
            name: "before".into(),
            topic_id: 1,
            expire_time_ms: 9,
        }));
        let mut old_subscription_deletion = vec![5u8];
        old_subscription_deletion.extend_from_slice(&4u64.to_le_bytes());
        let mut old_snapshot_deletion = vec![7u8];
        old_snapshot_deletion.extend_from_slice(&7u64.to_le_bytes());
        for bytes in [old_subscription_deletion, old_snapshot_deletion] {
            state.apply(CatalogEntry::decode(&bytes).unwrap());
        }
        assert!(!state.subscriptions.contains_key("subscription-4"));
        assert!(state.snapshots.is_empty());
        // A name whose record has another id (recreated since) is left alone.
        state.apply(CatalogEntry::SubscriptionDeleted { id: 99, name: "subscription-3".into() });
        assert!(state.subscriptions.contains_key("subscription-3"));
        state.apply(CatalogEntry::SubscriptionDeleted { id: 5, name: "subscription-5".into() });
        assert_eq!(state.subscriptions.keys().collect::<Vec<_>>(), ["subscription-3"]);
        let mut empty_name = vec![KIND_SUBSCRIPTION_DELETED_NAMED];
        empty_name.extend_from_slice(&3u64.to_le_bytes());
        empty_name.extend_from_slice(&0u32.to_le_bytes());
        assert!(CatalogEntry::decode(&empty_name).is_err());
    }

    fn updated_settings() -> SubscriptionSettings {
        SubscriptionSettings {
            ack_deadline_seconds: 45,
            retain_acked_messages: true,
            message_retention_seconds: 3600,
            dead_letter_topic: "topic-1".into(),
            max_delivery_attempts: 9,
            minimum_backoff_seconds: 2,
            maximum_backoff_seconds: 20,
            expiration_ttl_seconds: 2 * 86_400,
            ..Default::default()
        }
    }

    /// An update applies to the record of its id only: one of a record deleted since, or of a
    /// record recreated under the same name, changes nothing. An update without a name is not
    /// an entry this version writes.
    #[test]
    fn updates_change_only_the_record_of_their_id() {
        let mut state = CatalogState::default();
        for entry in [topic(1), subscription(3, 1)] {
            state.apply(entry);
        }
        state.apply(CatalogEntry::TopicUpdated { id: 1, message_retention_seconds: 600 });
        state.apply(CatalogEntry::SubscriptionUpdated {
            id: 3,
            name: "subscription-3".into(),
            settings: updated_settings(),
        });
        assert_eq!(state.topics["topic-1"].message_retention_seconds, 600);
        assert_eq!(state.subscriptions["subscription-3"].settings, updated_settings());
        let before = (state.topics.clone(), state.subscriptions.clone());
        state.apply(CatalogEntry::TopicUpdated { id: 2, message_retention_seconds: 900 });
        state.apply(CatalogEntry::SubscriptionUpdated {
            id: 4,
            name: "subscription-3".into(),
            settings: SubscriptionSettings::default(),
        });
        state.apply(CatalogEntry::SubscriptionUpdated {
            id: 3,
            name: "subscription-9".into(),
            settings: SubscriptionSettings::default(),
        });
        assert_eq!((state.topics.clone(), state.subscriptions.clone()), before);
        let mut unnamed = vec![KIND_SUBSCRIPTION_UPDATED];
        unnamed.extend_from_slice(&3u64.to_le_bytes());
        unnamed.extend_from_slice(&0u32.to_le_bytes());
        assert!(CatalogEntry::decode(&unnamed).is_err());
    }

    /// Updates are replayed at start, and compaction restates the updated settings: once the
    /// segments holding the creations and the updates are deleted, the catalog reopened from
    /// disk still has the new values.
    #[test]
    fn updates_survive_replay_and_compaction() {
        run(async {
            let disk = SimDisk::new();
            let dirs = directories(1);
            let (log, mut state) = open_catalog(disk.clone(), dirs.clone()).await.unwrap();
            let updates = [
                topic(1),
                subscription(2, 1),
                CatalogEntry::TopicUpdated { id: 1, message_retention_seconds: 7200 },
                CatalogEntry::SubscriptionUpdated {
                    id: 2,
                    name: "subscription-2".into(),
                    settings: updated_settings(),
                },
            ];
            let mut records = Vec::new();
            for entry in &updates {
                records.extend(entry_records(entry));
            }
            let (first, count) = log.append(records, updates.len() as u32).await.unwrap();
            let updates_end = first + count as u64;
            for entry in updates {
                state.apply(entry);
            }
            drop(log);
            let (log, mut state) = open_catalog(disk.clone(), dirs.clone()).await.unwrap();
            assert_eq!(state.topics["topic-1"].message_retention_seconds, 7200, "replayed");
            assert_eq!(state.subscriptions["subscription-2"].settings, updated_settings(), "replayed");
            // Topics created and deleted until the updates sit in a closed segment.
            let mut next = 10u64;
            while log.closed_segments().is_empty() {
                let mut records = Vec::new();
                let mut entries = Vec::new();
                for _ in 0..500 {
                    entries.push(topic(next));
                    entries.push(CatalogEntry::TopicDeleted { id: next });
                    next += 1;
                }
                for entry in &entries {
                    records.extend(entry_records(entry));
                }
                log.append(records, entries.len() as u32).await.unwrap();
                for entry in entries {
                    state.apply(entry);
                }
            }
            let removed = compact(&log, || state.checkpoint_entries(), 0).await.unwrap();
            assert!(removed > 0, "the segments before the checkpoint are deleted");
            assert!(log.start_offset() > updates_end, "the updates themselves are gone from the log");
            drop(log);
            disk.crash(crate::storage::sim::CrashMode::DropUnsynced);
            let (_, recovered) = open_catalog(disk.clone(), dirs.clone()).await.unwrap();
            assert_eq!(recovered.topics["topic-1"].message_retention_seconds, 7200);
            assert_eq!(recovered.subscriptions["subscription-2"].settings, updated_settings());
            state.boot_count += 1;
            same_state(&recovered, &state);
        });
    }
}
