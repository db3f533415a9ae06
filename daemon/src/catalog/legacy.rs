//! The catalog as it was written before it ran on raft: a log of entries (kinds 1 to 11) at
//! `catalog/` in each data directory, replayed in order. A data directory that holds one is
//! imported once, at the first start of this version, as the raft catalog's first snapshot;
//! the old folder is left as it was, and never read again once that snapshot is durable (a
//! start imports only when the catalog has no snapshot). An operator may delete it.

use super::entry::CatalogEntry;
use super::state::CatalogState;
use crate::log::{record, Directories, Log, LogConfig, LogError};
use crate::storage::Storage;
use std::path::Path;
use std::rc::Rc;

pub const CATALOG_LOG_ID: u64 = 0x4341_5441_4c4f_4700;
/// The old catalog's folder in each data directory.
pub const LEGACY_FOLDER: &str = "catalog";
/// The configuration of the catalog's logs (the old one, and the raft log and snapshots now).
pub fn catalog_log_config() -> LogConfig {
    LogConfig {
        segment_bytes_initial: 1 << 20,
        segment_bytes_max: 16 << 20,
        group_commit_bytes_max: 1 << 20,
        // Its records are read at start, a snapshot when a follower needs one, and raft entries
        // older than those the raft store keeps (`store::Held::recent`): kept after each
        // commit, they held up to 1 MiB that nothing read.
        tail_cache_bytes_max: 0,
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
    }
}

/// Encodes bytes as one unsealed log record.
pub fn record_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut records = Vec::with_capacity(bytes.len() + 64);
    record::encode_record_unsealed(&mut records, 0, bytes, &mut std::iter::empty(), "");
    records
}

/// Whether some data directory holds a catalog not yet imported.
pub fn exists<S: Storage>(storage: &S, directories: &Directories) -> bool {
    (0..directories.count()).any(|copy| storage.exists(&directories.path(copy).join(LEGACY_FOLDER)))
}

/// Replays the old catalog into a state, or `None` when there is none.
pub async fn read<S: Storage>(
    storage: S,
    directories: Rc<Directories>,
) -> Result<Option<CatalogState>, LogError> {
    if !exists(&storage, &directories) {
        return Ok(None);
    }
    let (log, report) =
        Log::open(storage, directories, Path::new(LEGACY_FOLDER), CATALOG_LOG_ID, catalog_log_config())
            .await?;
    if report.torn_bytes_discarded > 0 {
        crate::log_info!(
            "ringpostd: the catalog being imported had a torn tail of {} bytes (an unacknowledged change)",
            report.torn_bytes_discarded
        );
    }
    let mut state = CatalogState::default();
    for stored in log.read_all(crate::ids::Offset::ZERO).await? {
        let entry = CatalogEntry::decode(&stored.data).map_err(|why| {
            LogError::Corrupt(format!(
                "catalog entry at offset {} passed its checksum but not decoding: {why}",
                stored.offset
            ))
        })?;
        state.apply(entry);
    }
    Ok(Some(state))
}

/// The old code path's writer, for the import's tests: opens the old catalog, records a boot
/// as the old `open_catalog` did, and appends entries.
#[cfg(test)]
pub async fn write_old<S: Storage>(
    storage: S,
    directories: Rc<Directories>,
    entries: &[CatalogEntry],
) -> Result<(), LogError> {
    let (log, _) =
        Log::open(storage, directories, Path::new(LEGACY_FOLDER), CATALOG_LOG_ID, catalog_log_config())
            .await?;
    let mut boot = 0;
    for stored in log.read_all(crate::ids::Offset::ZERO).await? {
        if let Ok(CatalogEntry::Boot { count }) = CatalogEntry::decode(&stored.data) {
            boot = count;
        }
    }
    let mut records = record_bytes(&CatalogEntry::Boot { count: boot + 1 }.encode());
    for entry in entries {
        records.extend(record_bytes(&old_encoding(entry)));
    }
    log.append(records, entries.len() as u32 + 1).await?;
    Ok(())
}

/// An entry as the old code wrote it: creations without placement or creation time (kinds 2
/// and 4); the other kinds are encoded as they still are.
#[cfg(test)]
fn old_encoding(entry: &CatalogEntry) -> Vec<u8> {
    use crate::codec::Encoder;
    match entry {
        CatalogEntry::TopicCreated(topic) => Encoder::new(2)
            .u64(topic.id.get())
            .str(&topic.name)
            .u64(topic.message_retention_seconds)
            .0
            .clone(),
        CatalogEntry::SubscriptionCreated(record) => {
            let mut encoded = Encoder::new(4);
            encoded
                .u64(record.id)
                .str(&record.name)
                .u64(record.topic_id.get())
                .str(&record.topic_name)
                .u64(record.start_offset);
            let new = entry.encode();
            // The new encoding is the old one (kind 13 for 4) with the creation time after.
            encoded.0.extend_from_slice(&new[encoded.0.len()..new.len() - 8]);
            encoded.0
        }
        other => other.encode(),
    }
}
