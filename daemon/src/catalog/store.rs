//! The catalog's raft storage on Ringpost's own checksummed log: the raft log (entries, and the
//! vote, committed and purged markers as records of their own, the last of each kind winning
//! on replay) and the snapshots (a header record and the state's bytes in chunks, in a second
//! log whose older snapshots are removed once a newer one is durable).

use super::entry::CatalogEntry;
use super::legacy::record_bytes;
use super::raft::{CatalogRaft, Entry, LogId, Membership, SnapshotMeta, StoredMembership, Vote};
use super::CATALOG_RECENT_ENTRIES_BYTES_MAX;
use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::Offset;
use crate::log::{Directories, Log, LogConfig, LogError};
use crate::storage::Storage;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::type_config::alias::CommittedLeaderIdOf;
use openraft::{EntryPayload, RaftLogReader};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::rc::Rc;

pub const RAFT_LOG_ID: u64 = 0x4341_5452_4146_5400;
pub const SNAPSHOT_LOG_ID: u64 = 0x4341_5453_4e41_5000;
/// The raft log's folder in each data directory.
pub const RAFT_FOLDER: &str = "catalog-raft";
/// The snapshots' folder in each data directory.
pub const SNAPSHOT_FOLDER: &str = "catalog-snapshot";

const KIND_ENTRY: u8 = 1;
const KIND_VOTE: u8 = 2;
const KIND_COMMITTED: u8 = 3;
const KIND_PURGED: u8 = 4;
/// Entries after the index it names are gone (a follower's conflicting tail). An append-only
/// log can say so without rewriting anything: replay drops them when it reads this record.
const KIND_TRUNCATED: u8 = 5;
const KIND_SNAPSHOT_HEADER: u8 = 6;

const PAYLOAD_BLANK: u8 = 0;
const PAYLOAD_NORMAL: u8 = 1;
const PAYLOAD_MEMBERSHIP: u8 = 2;

/// A snapshot's bytes are stored in records of at most this many bytes.
const SNAPSHOT_CHUNK_BYTES_MAX: usize = 256 << 10;
/// Most bytes appended at once (the catalog logs' staging limit is 16 MiB).
const APPEND_BYTES_MAX: usize = 4 << 20;

fn io_error(error: LogError) -> io::Error {
    io::Error::other(error.to_string())
}

fn corrupt(offset: Offset, why: &str) -> LogError {
    LogError::Corrupt(format!(
        "catalog raft record at offset {offset} passed its checksum but not decoding: {why}"
    ))
}

pub(super) fn put_log_id(encoder: &mut Encoder, log_id: &Option<LogId>) {
    match log_id {
        Some(log_id) => {
            encoder.bool(true).u64(log_id.leader_id.term).u64(log_id.leader_id.node_id).u64(log_id.index);
        }
        None => {
            encoder.bool(false);
        }
    }
}

pub(super) fn get_log_id(decoder: &mut Decoder) -> DecodeResult<Option<LogId>> {
    if !decoder.bool()? {
        return Ok(None);
    }
    let (term, node_id, index) = (decoder.u64()?, decoder.u64()?, decoder.u64()?);
    Ok(Some(LogId::new(openraft::vote::leader_id_adv::LeaderId { term, node_id }, index)))
}

pub(super) fn put_membership(encoder: &mut Encoder, membership: &Membership) {
    let configs = membership.get_joint_config();
    encoder.u32(configs.len() as u32);
    for config in configs {
        encoder.u32(config.len() as u32);
        for id in config {
            encoder.u64(*id);
        }
    }
    let nodes: Vec<u64> = membership.nodes().map(|(id, _)| *id).collect();
    encoder.u32(nodes.len() as u32);
    for id in nodes {
        encoder.u64(id);
    }
}

pub(super) fn get_membership(decoder: &mut Decoder) -> DecodeResult<Membership> {
    let mut configs = Vec::new();
    for _ in 0..decoder.u32()? {
        let mut config = BTreeSet::new();
        for _ in 0..decoder.u32()? {
            config.insert(decoder.u64()?);
        }
        configs.push(config);
    }
    let mut nodes = Vec::new();
    for _ in 0..decoder.u32()? {
        nodes.push(decoder.u64()?);
    }
    Ok(Membership::new_with_defaults(configs, nodes))
}

pub(super) fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut encoder = Encoder::new(KIND_ENTRY);
    put_log_id(&mut encoder, &Some(entry.log_id));
    match &entry.payload {
        EntryPayload::Blank => {
            encoder.u8(PAYLOAD_BLANK);
        }
        EntryPayload::Normal(command) => {
            encoder.u8(PAYLOAD_NORMAL);
            encoder.0.extend_from_slice(&command.encode());
        }
        EntryPayload::Membership(membership) => {
            encoder.u8(PAYLOAD_MEMBERSHIP);
            put_membership(&mut encoder, membership);
        }
    }
    encoder.0
}

pub(super) fn decode_entry(decoder: &mut Decoder) -> DecodeResult<Entry> {
    let log_id = get_log_id(decoder)?.ok_or("an entry without its log id")?;
    let payload = match decoder.u8()? {
        PAYLOAD_BLANK => EntryPayload::Blank,
        PAYLOAD_NORMAL => {
            let rest = decoder.bytes(decoder.remaining())?;
            EntryPayload::Normal(CatalogEntry::decode(rest)?)
        }
        PAYLOAD_MEMBERSHIP => EntryPayload::Membership(get_membership(decoder)?),
        _ => return Err("unknown entry payload"),
    };
    Ok(Entry { log_id, payload })
}

fn encode_marker(kind: u8, log_id: &Option<LogId>) -> Vec<u8> {
    let mut encoder = Encoder::new(kind);
    put_log_id(&mut encoder, log_id);
    encoder.0
}

fn encode_vote(vote: &Vote) -> Vec<u8> {
    Encoder::new(KIND_VOTE)
        .u64(vote.leader_id.term)
        .u64(vote.leader_id.node_id)
        .bool(vote.committed)
        .0
        .clone()
}

/// An entry not purged, held by where its record is in the raft log and the leader that made it
/// (with its index, its log id). Its record is read back from the log when openraft reads the
/// entry, unless it is among the newest (`Held::recent`). Entries are held until a compaction,
/// which waits for the log to grow past `CATALOG_COMPACTION_BYTES_MIN`: held as their records,
/// the two entries of an idle topic and its subscription took about 400 B of the topic's cost.
#[derive(Clone, Copy)]
struct HeldEntry {
    leader_id: CommittedLeaderIdOf<CatalogRaft>,
    offset: Offset,
}

/// What the raft log holds, in memory: where each entry not purged is, the records of the
/// newest, and the markers.
#[derive(Default)]
struct Held {
    entries: BTreeMap<u64, HeldEntry>,
    /// The records of the newest entries, at most `CATALOG_RECENT_ENTRIES_BYTES_MAX` of them: the
    /// reads that follow an append (applying it, sending it to the followers) stay off the disk.
    recent: BTreeMap<u64, Box<[u8]>>,
    recent_bytes: usize,
    /// Counts the rewrites, which move every entry's record: a reader that took offsets before
    /// one and finds a record gone reads again.
    rewrites: u64,
    vote: Option<Vote>,
    committed: Option<LogId>,
    /// The committed id last written to the log: a newer one rides with the next append.
    committed_written: Option<LogId>,
    purged: Option<LogId>,
}

impl Held {
    fn replay(&mut self, offset: Offset, bytes: &[u8]) -> Result<(), LogError> {
        let mut decoder = Decoder::new(bytes);
        let kind = decoder.u8().map_err(|why| corrupt(offset, why))?;
        let result = match kind {
            KIND_ENTRY => {
                decode_entry(&mut decoder).map(|entry| self.hold(entry.log_id, offset, bytes.into()))
            }
            KIND_VOTE => (|| {
                let (term, node_id, committed) = (decoder.u64()?, decoder.u64()?, decoder.bool()?);
                let vote =
                    if committed { Vote::new_committed(term, node_id) } else { Vote::new(term, node_id) };
                self.vote = Some(vote);
                Ok(())
            })(),
            KIND_COMMITTED => get_log_id(&mut decoder).map(|log_id| {
                self.committed = log_id;
                self.committed_written = log_id;
            }),
            KIND_PURGED => get_log_id(&mut decoder).map(|log_id| self.purge(log_id)),
            KIND_TRUNCATED => get_log_id(&mut decoder).map(|log_id| self.truncate_after(log_id)),
            _ => Err("unknown raft record kind"),
        };
        result.map_err(|why| corrupt(offset, why))
    }

    /// Holds the entry at `log_id`, whose record `record` is at `offset`: it replaces the entry
    /// at its index and everything after (raft's log matching).
    fn hold(&mut self, log_id: LogId, offset: Offset, record: Box<[u8]>) {
        let index = log_id.index;
        self.drop_from(index);
        self.entries.insert(index, HeldEntry { leader_id: log_id.leader_id, offset });
        self.recent_bytes += record.len();
        self.recent.insert(index, record);
        while self.recent_bytes > CATALOG_RECENT_ENTRIES_BYTES_MAX {
            let Some((_, oldest)) = self.recent.pop_first() else { break };
            self.recent_bytes -= oldest.len();
        }
    }

    /// Forgets the entries from `index` on.
    fn drop_from(&mut self, index: u64) {
        self.entries.split_off(&index);
        let gone = self.recent.split_off(&index);
        self.recent_bytes -= gone.values().map(|record| record.len()).sum::<usize>();
    }

    /// Forgets the entries before `index`.
    fn drop_before(&mut self, index: u64) {
        self.entries = self.entries.split_off(&index);
        let kept = self.recent.split_off(&index);
        self.recent_bytes -= self.recent.values().map(|record| record.len()).sum::<usize>();
        self.recent = kept;
    }

    fn purge(&mut self, log_id: Option<LogId>) {
        if let Some(last) = log_id {
            // The index comes from a record (and before it from raft, which a peer's snapshot
            // moves): the last index there is purges everything rather than overflowing.
            match last.index.checked_add(1) {
                Some(first_kept) => self.drop_before(first_kept),
                None => self.drop_from(0),
            }
        }
        self.purged = self.purged.max(log_id);
    }

    fn truncate_after(&mut self, log_id: Option<LogId>) {
        // Nothing is after the last index there is.
        let Some(first_gone) = log_id.map_or(Some(0), |log_id| log_id.index.checked_add(1)) else { return };
        self.drop_from(first_gone);
    }

    fn last_log_id(&self) -> Option<LogId> {
        let last = self.entries.last_key_value();
        last.map(|(index, entry)| LogId::new(entry.leader_id, *index)).or(self.purged)
    }

    /// Records that restate everything held, given the records of the entries (in index
    /// order): what a rewrite appends before it removes the segments before it. Also returns
    /// how many records there are, and the position of the first entry's among them.
    fn restatement<'a>(&self, entry_records: impl IntoIterator<Item = &'a [u8]>) -> (Vec<u8>, u32, u32) {
        let mut records = Vec::new();
        let mut markers =
            vec![encode_marker(KIND_PURGED, &self.purged), encode_marker(KIND_COMMITTED, &self.committed)];
        if let Some(vote) = &self.vote {
            markers.insert(0, encode_vote(vote));
        }
        for marker in &markers {
            records.extend(record_bytes(marker));
        }
        let first_entry = markers.len() as u32;
        let mut count = first_entry;
        for record in entry_records {
            records.extend(record_bytes(record));
            count += 1;
        }
        (records, count, first_entry)
    }
}

/// The entry `record` holds, which must be the one at `log_id`.
fn entry_of(log_id: LogId, record: &[u8]) -> io::Result<Entry> {
    let mut decoder = Decoder::new(record);
    let decoded = decoder.u8().and_then(|_| decode_entry(&mut decoder));
    match decoded {
        Ok(entry) if entry.log_id == log_id => Ok(entry),
        Ok(entry) => {
            Err(io::Error::other(format!("the catalog entry at {log_id} reads as {}", entry.log_id)))
        }
        Err(why) => Err(io::Error::other(format!("the catalog entry at {log_id}: {why}"))),
    }
}

/// The raft log's replay over `records` (each the bytes of one record that passed its
/// checksum), then the restatement a rewrite would append, for the fuzzers and their property
/// tests (`crate::fuzzing`): whatever the bytes, a record that does not decode is an error.
#[cfg(any(test, feature = "fuzzing"))]
pub fn replay_records<'a>(records: impl IntoIterator<Item = &'a [u8]>) -> Result<(), LogError> {
    let records: Vec<&[u8]> = records.into_iter().collect();
    let mut held = Held::default();
    for (offset, record) in records.iter().enumerate() {
        held.replay(Offset::new(offset as u64), record)?;
    }
    // Every entry held is at the offset of a record that decoded as it.
    let entry_records = held.entries.iter().map(|(index, entry)| {
        let record = records[entry.offset.get() as usize];
        assert!(entry_of(LogId::new(entry.leader_id, *index), record).is_ok());
        record
    });
    held.restatement(entry_records);
    Ok(())
}

/// A record of every kind the raft log holds, from these values, for the fuzzers to start from.
#[cfg(any(test, feature = "fuzzing"))]
pub fn sample_records(entries: &[Entry], vote: &Vote, log_id: Option<LogId>) -> Vec<Vec<u8>> {
    let mut records = vec![encode_vote(vote)];
    for kind in [KIND_COMMITTED, KIND_PURGED, KIND_TRUNCATED] {
        records.push(encode_marker(kind, &log_id));
        records.push(encode_marker(kind, &None));
    }
    records.extend(entries.iter().map(encode_entry));
    records
}

/// The raft log store (cheap to clone: openraft takes one and its readers more).
pub struct RaftLog<S: Storage> {
    log: Rc<Log<S>>,
    held: Rc<RefCell<Held>>,
}

impl<S: Storage> Clone for RaftLog<S> {
    fn clone(&self) -> Self {
        RaftLog { log: self.log.clone(), held: self.held.clone() }
    }
}

impl<S: Storage> RaftLog<S> {
    pub async fn open(
        storage: S,
        directories: Rc<Directories>,
        config: LogConfig,
    ) -> Result<RaftLog<S>, LogError> {
        let log = open_log(storage, directories, RAFT_FOLDER, RAFT_LOG_ID, config).await?;
        let mut held = Held::default();
        for stored in log.read_all(Offset::ZERO).await? {
            held.replay(stored.offset, &stored.data)?;
        }
        Ok(RaftLog { log: Rc::new(log), held: Rc::new(RefCell::new(held)) })
    }

    pub fn log(&self) -> &Rc<Log<S>> {
        &self.log
    }

    /// Whether the log holds nothing at all (a catalog never started on raft).
    pub fn is_pristine(&self) -> bool {
        let held = self.held.borrow();
        held.vote.is_none() && held.entries.is_empty() && held.purged.is_none()
    }

    async fn append_records(&self, records: Vec<u8>, count: u32) -> io::Result<Offset> {
        self.log.append(records, count).await.map(|(first, _)| first).map_err(io_error)
    }

    /// The log ids and records of the entries held in `range`, in index order: the newest
    /// from memory, the others read back from the log.
    async fn records(&self, range: impl RangeBounds<u64> + Clone) -> io::Result<Vec<(LogId, Box<[u8]>)>> {
        loop {
            let (rewrites, mut wanted, mut offsets) = {
                let held = self.held.borrow();
                let mut wanted = Vec::new();
                let mut offsets = Vec::new();
                for (&index, entry) in held.entries.range(range.clone()) {
                    let record = held.recent.get(&index).cloned();
                    if record.is_none() {
                        offsets.push(entry.offset);
                    }
                    wanted.push((LogId::new(entry.leader_id, index), entry.offset, record));
                }
                (held.rewrites, wanted, offsets)
            };
            if !offsets.is_empty() {
                // A rewrite restates the entries in index order, so their offsets are sorted;
                // sorting again costs nothing and keeps `read_offsets`'s contract regardless.
                offsets.sort_unstable();
                let mut read: BTreeMap<Offset, Vec<u8>> = (self.log.read_offsets(&offsets).await)
                    .map_err(io_error)?
                    .into_iter()
                    .map(|stored| (stored.offset, stored.data))
                    .collect();
                for (_, offset, record) in wanted.iter_mut().filter(|(_, _, record)| record.is_none()) {
                    *record = read.remove(offset).map(Vec::into_boxed_slice);
                }
            }
            let missing = wanted.iter().find(|(_, _, record)| record.is_none()).map(|(log_id, ..)| *log_id);
            match missing {
                None => {
                    let records =
                        wanted.into_iter().filter_map(|(log_id, _, record)| Some((log_id, record?)));
                    return Ok(records.collect());
                }
                // The records moved while they were read: read them where they are now.
                Some(_) if self.held.borrow().rewrites != rewrites => continue,
                Some(log_id) => {
                    return Err(io::Error::other(format!(
                        "the catalog entry at {log_id} is not in the raft log"
                    )));
                }
            }
        }
    }

    /// Restates what is held at the end of the log and deletes the segments before it.
    async fn rewrite(&self) -> io::Result<()> {
        let entries = self.records(..).await?;
        let (records, count, first_entry) =
            self.held.borrow().restatement(entries.iter().map(|(_, record)| &record[..]));
        let first = self.append_records(records, count).await?;
        {
            let mut held = self.held.borrow_mut();
            held.committed_written = held.committed;
            held.rewrites += 1;
            // Nothing appends, truncates or purges while this runs (openraft calls them one at a
            // time), so the entries restated are the entries held.
            assert_eq!(held.entries.len(), entries.len(), "the catalog's entries changed while restated");
            for (position, (log_id, _)) in entries.iter().enumerate() {
                let entry = held.entries.get_mut(&log_id.index).expect("a restated entry is held");
                entry.offset = Offset::new(first.get() + u64::from(first_entry) + position as u64);
            }
        }
        self.log.remove_before(first).await.map_err(io_error)?;
        Ok(())
    }
}

impl<S: Storage> RaftLogReader<CatalogRaft> for RaftLog<S> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let records = self.records(range).await?;
        records.iter().map(|(log_id, record)| entry_of(*log_id, record)).collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.held.borrow().vote)
    }
}

impl<S: Storage> RaftLogStorage<CatalogRaft> for RaftLog<S> {
    type LogReader = RaftLog<S>;

    async fn get_log_state(&mut self) -> Result<LogState<CatalogRaft>, io::Error> {
        let held = self.held.borrow();
        Ok(LogState { last_purged_log_id: held.purged, last_log_id: held.last_log_id() })
    }

    async fn get_log_reader(&mut self) -> RaftLog<S> {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.append_records(record_bytes(&encode_vote(vote)), 1).await?;
        self.held.borrow_mut().vote = Some(*vote);
        Ok(())
    }

    /// Kept in memory and written with the next append, not by a commit of its own: a
    /// committed id older than the truth only makes a restart apply the tail once elected.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.held.borrow_mut().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.held.borrow().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<CatalogRaft>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry>,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut records = Vec::new();
        let mut count = 0;
        let committed = {
            let held = self.held.borrow();
            (held.committed != held.committed_written).then_some(held.committed)
        };
        if let Some(committed) = committed {
            records.extend(record_bytes(&encode_marker(KIND_COMMITTED, &committed)));
            count += 1;
        }
        let first_entry = count;
        let entries: Vec<(LogId, Vec<u8>)> =
            entries.iter().map(|entry| (entry.log_id, encode_entry(entry))).collect();
        for (_, record) in &entries {
            records.extend(record_bytes(record));
            count += 1;
        }
        let result = self.append_records(records, count).await;
        if let Ok(first) = result {
            let mut held = self.held.borrow_mut();
            if let Some(committed) = committed {
                held.committed_written = committed;
            }
            for (position, (log_id, record)) in entries.into_iter().enumerate() {
                let offset = Offset::new(first.get() + u64::from(first_entry) + position as u64);
                held.hold(log_id, offset, record.into_boxed_slice());
            }
        }
        let flushed = result.as_ref().map(|_| ()).map_err(|error| io::Error::other(error.to_string()));
        callback.io_completed(flushed);
        result.map(|_| ())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        self.append_records(record_bytes(&encode_marker(KIND_TRUNCATED, &last_log_id)), 1).await?;
        self.held.borrow_mut().truncate_after(last_log_id);
        Ok(())
    }

    /// Purges the entries a snapshot covers, then rewrites the log without them: purges follow
    /// snapshots, which the router takes only once the log has grown (`Catalog::compact`).
    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.held.borrow_mut().purge(Some(log_id));
        self.rewrite().await
    }
}

async fn open_log<S: Storage>(
    storage: S,
    directories: Rc<Directories>,
    folder: &str,
    log_id: u64,
    config: LogConfig,
) -> Result<Log<S>, LogError> {
    let (log, report) = Log::open(storage, directories, Path::new(folder), log_id, config).await?;
    // Made at the first start, while there is room; on a full disk the catalog goes on without
    // one until `Router::retake_catalog_reserve` finds room.
    if let Err(error) = log.retake_reserve().await {
        crate::log_warn!("ringpostd: reserving a segment for the catalog: {error}");
    }
    if report.batches_repaired > 0 {
        crate::log_info!(
            "ringpostd: catalog recovery repaired {} batch copies from healthy ones",
            report.batches_repaired
        );
    }
    if report.torn_bytes_discarded > 0 {
        crate::log_info!(
            "ringpostd: catalog recovery discarded a torn tail of {} bytes (an unacknowledged change)",
            report.torn_bytes_discarded
        );
    }
    Ok(log)
}

/// The catalog's snapshots: the newest complete one is the catalog as of its last log id.
pub struct SnapshotLog<S: Storage> {
    log: Rc<Log<S>>,
}

impl<S: Storage> SnapshotLog<S> {
    pub async fn open(
        storage: S,
        directories: Rc<Directories>,
        config: LogConfig,
    ) -> Result<SnapshotLog<S>, LogError> {
        let log = open_log(storage, directories, SNAPSHOT_FOLDER, SNAPSHOT_LOG_ID, config).await?;
        Ok(SnapshotLog { log: Rc::new(log) })
    }

    pub fn log(&self) -> &Rc<Log<S>> {
        &self.log
    }

    /// Stores a snapshot durably, then removes the ones before it.
    pub async fn write(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<(), LogError> {
        let chunks: Vec<&[u8]> = data.chunks(SNAPSHOT_CHUNK_BYTES_MAX).collect();
        let mut header = Encoder::new(KIND_SNAPSHOT_HEADER);
        put_log_id(&mut header, &meta.last_log_id);
        put_log_id(&mut header, meta.last_membership.log_id());
        put_membership(&mut header, meta.last_membership.membership());
        header.u32(chunks.len() as u32).u64(data.len() as u64);
        let mut pending = record_bytes(&header.0);
        let mut pending_count = 1u32;
        let mut start = None;
        for (index, chunk) in chunks.iter().enumerate() {
            pending.extend(record_bytes(chunk));
            pending_count += 1;
            if pending.len() >= APPEND_BYTES_MAX && index + 1 < chunks.len() {
                let (first, _) = self.log.append(std::mem::take(&mut pending), pending_count).await?;
                start.get_or_insert(first);
                pending_count = 0;
            }
        }
        let (first, _) = self.log.append(pending, pending_count).await?;
        let start = *start.get_or_insert(first);
        self.log.remove_before(start).await?;
        Ok(())
    }

    /// The newest complete snapshot.
    pub async fn read(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, LogError> {
        let records = self.log.read_all(Offset::ZERO).await?;
        let mut newest = None;
        let mut index = 0;
        while index < records.len() {
            let stored = &records[index];
            index += 1;
            let mut decoder = Decoder::new(&stored.data);
            if decoder.u8() != Ok(KIND_SNAPSHOT_HEADER) {
                continue;
            }
            let header = (|| {
                let last_log_id = get_log_id(&mut decoder)?;
                let membership_log_id = get_log_id(&mut decoder)?;
                let membership = get_membership(&mut decoder)?;
                let (chunks, bytes) = (decoder.u32()? as usize, decoder.u64()? as usize);
                let meta = SnapshotMeta {
                    last_log_id,
                    last_membership: StoredMembership::new(membership_log_id, membership),
                };
                Ok((meta, chunks, bytes))
            })()
            .map_err(|why: &str| corrupt(stored.offset, why))?;
            let (meta, chunks, bytes) = header;
            if index + chunks > records.len() {
                break;
            }
            let mut data = Vec::with_capacity(bytes);
            for chunk in &records[index..index + chunks] {
                data.extend_from_slice(&chunk.data);
            }
            index += chunks;
            if data.len() == bytes {
                newest = Some((meta, data));
            }
        }
        Ok(newest)
    }
}
