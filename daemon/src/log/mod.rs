//! The segmented, append-only, group-committed log, kept in one copy per data directory. One
//! per topic (messages), one per topic for its subscriptions' acknowledgements (the journal),
//! and one for the router's catalog.
//!
//! # Write path (the durability contract)
//! 1. `append` queues the request's records and waits; they have no offset yet. They are
//!    encoded already, or (`append_records` with `Records::Deferred`, a publish) encoded
//!    straight into the batch's buffer when it is built.
//! 2. One flush task per log takes what is queued (up to `group_commit_bytes_max`, at least one
//!    request) and forms one batch: offsets are assigned now, so a failed commit leaves no gap.
//!    While a commit's write is with the disk and appends wait, the next batch is taken, its
//!    bytes built (copied, sealed) for the place this commit leaves, and its write issued: at
//!    most two writes per log are in flight, and the device may complete the second first.
//!    Nothing is written ahead of a commit larger than a full group commit (one request above
//!    `group_commit_bytes_max`), so a batch written ahead starts at most
//!    `LogConfig::written_ahead_distance_max` past the commit before it.
//!    So a batch is acknowledged only once every batch ahead of it is durable too (commits
//!    complete in order), and every failure after a write is issued fences the log: a batch
//!    that landed beyond a hole is never acknowledged, and recovery (below) stops at the hole.
//! 3. If the batch does not fit the active segment, a new segment is created in every healthy
//!    copy: open (create) → fallocate → fdatasync → fsync(directory) (a manifest slot file not
//!    yet made is created empty beside it, so this one directory sync covers its name too);
//!    or, when a deleted segment's file was kept (`LogConfig::recycle`: renamed to
//!    `RECYCLE_NAME` once the manifest without it was durable), or a spare was prepared in the
//!    background (`LogConfig::prewrite`: created, fallocated and fdatasync'ed the same way, then
//!    zero-filled), it is renamed to the segment's name → fsync(directory). The manifest marks
//!    a recycled segment: its file holds old batches beyond the new ones.
//!    Then the manifest listing it is written to its next slot and fdatasync'ed on ⌈M/2⌉
//!    copies. Only then is anything written into the new segment. A log's first segment (base
//!    offset 0) is the exception: no manifest lists it and no slot file is made with it, as
//!    recovery takes a log without a manifest to be that segment alone; the first manifest is
//!    written with the second segment. A topic's first publish costs one new file and three
//!    syncs, not two files and four. The second segment's roll makes both manifest slot files,
//!    each with its block allocated, so that no later manifest write needs disk space.
//!    The new segment doubles the last one up to `segment_bytes_max`, halved while it is larger
//!    than the free space of the ⌈M/2⌉-th emptiest copy (`Storage::free_bytes`), down to
//!    `segment_bytes_initial` (`segment_bytes_to_fit`), so that a nearly full disk still takes
//!    smaller segments. A log with a reserve (`LogConfig::reserve`: a topic's journal) renames
//!    its reserve (`RESERVE_NAME`, made by `make_reserve`: allocated, synced, never written) into
//!    place, as a spare, when the free space has no room for the segment or its allocation
//!    fails with ENOSPC; so acknowledgements still commit on a full disk.
//! 4. The batch is written into fresh 4 KiB blocks at the segment's write position in every
//!    healthy copy at once (never over a block holding acknowledged records), then each copy is
//!    fdatasync'ed, except a copy whose file was opened with O_DSYNC (`writes_are_durable`; the
//!    real storage opens its files so): its write completes only once it is durable.
//! 5. When ⌈M/2⌉ copies have synced without error the appends are resolved with their offsets;
//!    the caller acknowledges its publishers after that. A standalone log then commits them
//!    (`commit_to`): readers see committed records only, and a replicated log will commit on
//!    its replicas' word instead (see `LogInner::committed_end` for the four positions).
//!    A follower's appends (`append_at`) come with their offsets and their leader's epoch;
//!    the flush loop takes them in order like any other and refuses one whose offset is no
//!    longer the log's next. `truncate_after` removes an uncommitted tail.
//! 6. A copy whose write or fdatasync fails is fenced (its directory takes no more writes and
//!    counts for nothing) and the sync is never retried and trusted. With fewer than ⌈M/2⌉
//!    healthy copies the log is fenced: appends fail with `Unavailable`. A full disk while
//!    creating a segment fences the full copies if enough others remain, and otherwise fails the
//!    batch with `ResourceExhausted`, leaving the log usable once space returns.
//!
//! # Recovery (`open`)
//! Three steps (`recovery`): a scan reads what every copy holds, a pure plan decides from
//! that alone what follows from the rules below, and a last step carries it out.
//! 1. A missing folder is made, with its parents, and their names synced (a new log writes no
//!    file until its first commit). Every copy's manifest slots are read; the newest valid
//!    manifest across copies names the segments. No valid manifest, and a first segment (base
//!    0) holding data in some copy: that segment alone is the log (its largest copy gives its
//!    capacity; a slot holding a torn first manifest, or damage, changes nothing, since step 2
//!    stops at any other segment that holds data), unless no copy holding data starts with a
//!    batch header of this log or with a zero sector (a torn first write), which stops
//!    recovery. Otherwise, with no valid manifest, its segment files are a first roll cut short
//!    and step 2 removes them if they hold only zeros, and refuses to start if not.
//! 2. A spare (`SPARE_NAME`), a kept file (`RECYCLE_NAME`) and a reserve being made
//!    (`RESERVE_MAKING_NAME`), never listed, are removed; a whole reserve (`RESERVE_NAME`),
//!    allocated and never written, stays the log's reserve (on a full disk it could not be
//!    made again).
//!    Segment files the manifest does not list are removed if they are below the log's start
//!    (a crash between a manifest update and the unlink), hold only zeros (created, never
//!    used), or, with a manifest, hold no valid batch of their own segment (a kept file renamed
//!    by a roll that a crash cut short before its manifest); any other one stops recovery with
//!    a report. A listed segment missing from every
//!    copy stops recovery: it cannot be rebuilt.
//! 3. Each segment is scanned from position 0 in every copy: a batch must have a valid header
//!    checksum (which covers the log, segment and position), the expected base offset, and
//!    valid records. The first copy holding a valid batch is the truth; copies that do not
//!    (missing, torn, rotten, misdirected) are repaired by writing the good bytes at the same
//!    position. A closed segment ends once its batches reach the next segment's base offset.
//! 4. Where no copy holds a valid batch: if a valid batch follows in any copy (here or in a
//!    later segment) the damage is in the middle of the log: recovery refuses to start and
//!    deletes nothing, unless that batch is the last valid one, beyond the expected offset, and
//!    was written ahead (`record::FLAG_WRITTEN_AHEAD`): the hole of an unacknowledged commit
//!    whose successor landed first, which a power failure leaves; that batch's header is
//!    zeroed. Otherwise it is a torn tail from an interrupted, unacknowledged commit: its bytes
//!    are zeroed in every copy, synced, and reported as discarded. Where every copy holds
//!    zeros, the log ends there; the batch a lost commit's successor may have left beyond is
//!    looked for within `written_ahead_distance_max` (only where the file holds data, by
//!    SEEK_DATA) and its header zeroed by the same rule, and any other valid batch there
//!    refuses the start. Valid batches holding offsets below the damaged one's do not count:
//!    they are of an earlier life (such a successor beyond the reach of the recovery after it,
//!    as builds before that search left them, whose offsets the log then reused). In a
//!    recycled segment the first position without a valid batch is the segment's end, as
//!    zeros are in a fresh one (old batches never validate: a header's checksum covers its
//!    segment's base offset), and nothing is zeroed: commits after recovery overwrite it.
//! 5. A manifest marking a truncation's cut (`Manifest::truncated_end`, a truncation a crash
//!    interrupted) ends the last segment at the cut: what follows is zeroed as a torn tail is,
//!    and segment files beyond it are removed.
//! 6. Every copy ends with the same segments and the newest manifest.

pub mod directories;
pub mod manifest;
pub mod read_ahead;
pub mod record;
mod recovery;

use crate::storage::{IoBuffer, Storage, StorageFile};
use crate::sync::{join_all, oneshot, Notify, Sender};
pub use directories::{Directories, DATA_DIRECTORIES_MAX};
use manifest::{Listed, Manifest, MANIFEST_SLOTS};
use read_ahead::{Extent, Lookup, ReadAhead, READ_AHEAD_BYTES};
use record::{BatchError, BatchHeader, BLOCK_BYTES};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes the tail caches of many logs hold together. Each log's cache is bounded on its own,
/// but 10,000 topics times a bounded cache is still too much: the logs of a shard share one
/// budget, and a log over it gives back its oldest batches first.
#[derive(Debug)]
pub struct TailCacheBudget {
    // An atomic only so that a `LogConfig` can cross to the shard's thread before its logs
    // exist; each shard makes its own budget, so there is never contention.
    used_bytes: AtomicUsize,
    bytes_max: usize,
}

impl TailCacheBudget {
    pub fn new(bytes_max: usize) -> Arc<TailCacheBudget> {
        Arc::new(TailCacheBudget { used_bytes: AtomicUsize::new(0), bytes_max })
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used_bytes() > self.bytes_max
    }

    /// Read-ahead may take the budget up to three quarters, so that it never pushes the tail
    /// caches of busy topics out.
    fn has_room_to_read_ahead(&self) -> bool {
        self.used_bytes() + READ_AHEAD_BYTES <= self.bytes_max / 4 * 3
    }

    fn charge(&self, bytes: usize) {
        self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn refund(&self, bytes: usize) {
        self.used_bytes.fetch_sub(bytes.min(self.used_bytes()), Ordering::Relaxed);
    }
}

/// The epoch of a standalone node's batches (`Log::set_epoch` gives another): a node that is
/// a cluster of one is the leader of one term.
pub const STANDALONE_EPOCH: u64 = 1;

/// Sweeps (`Log::release_idle_cache`, once a second) without a commit after which a log drops
/// its tail cache: the readers of an idle topic have caught up or will read from disk.
pub const TAIL_CACHE_IDLE_SWEEPS: u8 = 10;

#[derive(Clone, Debug)]
pub struct LogConfig {
    /// Size of a log's first segment; later segments double up to `segment_bytes_max`, so an
    /// idle topic costs little disk and a busy one rolls rarely.
    pub segment_bytes_initial: u64,
    pub segment_bytes_max: u64,
    /// Most bytes of records one group commit writes (one batch always takes at least one
    /// whole request, even a larger one).
    pub group_commit_bytes_max: usize,
    /// Most bytes of recently written batches kept in memory for readers.
    pub tail_cache_bytes_max: usize,
    /// What all the logs of a shard may keep in their tail caches together; None for no limit
    /// beyond `tail_cache_bytes_max` per log.
    pub tail_cache_budget: Option<Arc<TailCacheBudget>>,
    /// Most bytes queued and waiting for a commit; beyond it appends get `ResourceExhausted`.
    pub staging_bytes_max: usize,
    /// Keep segment files open between commits. A log read only at recovery (a journal) may
    /// close them after each commit instead and reopen them on the next, when descriptors are
    /// short: an open per commit buys 10,000 topics under a 20,000-descriptor limit.
    pub keep_files_open: bool,
    /// Read extents ahead of readers that go through the log in order (a subscription draining
    /// a backlog). Only for logs whose idle caches are swept (`release_idle_cache`): a log read
    /// once at recovery (a journal, the catalog) would keep its last extents for good.
    pub read_ahead: bool,
    /// Zero-fill the next segment in the background once the active one is half full, so that
    /// commits into it overwrite written blocks: a commit into space that was only fallocated
    /// pays at its fdatasync for converting the unwritten extents (several times the sync).
    /// Only for logs that keep their files open; a log that closes them (a journal when
    /// descriptors are short) does not prepare spares.
    pub prewrite: bool,
    /// Keep one deleted segment's file of the largest size (`segment_bytes_max`) and rename it
    /// into place at the next roll, instead of unlinking it: commits into it overwrite written
    /// blocks (faster than fresh ones, see benches/README.md), and no trim of a freed segment
    /// stalls the disk. Only for logs that keep their files open.
    pub recycle: bool,
    /// Keep one segment of `segment_bytes_initial` allocated beside the log (`RESERVE_NAME`),
    /// taken by a roll only when the disk has no room for a new segment, so that the log can
    /// still commit on a full disk. For a topic's journal: acknowledging is how a user frees
    /// space, and an acknowledgement that needs a new segment on a full disk would otherwise
    /// be refused, and nothing could be freed. See `make_reserve`. A reserve rather than an
    /// acknowledgement floor written in place on a full disk: a floor rewritten in place would
    /// overwrite a block holding acknowledged state (a torn write could lose it), and would need
    /// a record format and a recovery of its own; with the reserve an acknowledgement stays an
    /// ordinary checksummed record appended into fresh blocks and confirmed once durable on
    /// ⌈M/2⌉ copies, and recovery is unchanged: the reserve is a segment allocated ahead.
    pub reserve: bool,
}

impl LogConfig {
    /// How far past the place a commit starts the batch written ahead of it can start: only a
    /// commit no larger than a full group commit has one written ahead (see `prepare_ahead`).
    /// Recovery looks this far past a hole of zeros for that batch (see `open`).
    pub fn written_ahead_distance_max(&self) -> u64 {
        record::batch_disk_bytes(self.group_commit_bytes_max) as u64
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes_initial: 1 << 20,
            segment_bytes_max: 64 << 20,
            group_commit_bytes_max: 4 << 20,
            tail_cache_bytes_max: 8 << 20,
            tail_cache_budget: None,
            staging_bytes_max: 64 << 20,
            keep_files_open: true,
            read_ahead: true,
            prewrite: true,
            recycle: true,
            reserve: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogError {
    /// Writes failed on too many copies; the log accepts no more appends.
    Fenced(String),
    /// The disk is full; the append may be retried later.
    NoSpace(String),
    /// Too much is waiting for the disk already.
    Overloaded,
    /// Stored bytes failed validation in every copy, or could not be read.
    DataLoss(String),
    /// Recovery found damage it must not repair on its own.
    Corrupt(String),
    Io(String),
    /// The request does not fit the log's state: an append at an offset that is not the log's
    /// next one, an epoch older than the log's last, a truncation of committed records.
    Refused(String),
    /// Durable here, but a quorum of the source's replicas did not confirm it (its leader was
    /// deposed, or too few replicas answered in time): it may or may not be kept.
    Unreplicated(String),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Fenced(why) => write!(f, "log is fenced after an I/O failure: {why}"),
            LogError::NoSpace(why) => write!(f, "out of disk space or another resource: {why}"),
            LogError::Overloaded => write!(f, "too many appends waiting for the disk"),
            LogError::DataLoss(why) => write!(f, "data loss: {why}"),
            LogError::Corrupt(why) => write!(f, "log is corrupt: {why}"),
            LogError::Io(why) => write!(f, "I/O error: {why}"),
            LogError::Refused(why) => write!(f, "refused by the log: {why}"),
            LogError::Unreplicated(why) => write!(f, "not replicated: {why}"),
        }
    }
}

/// What recovery found, for the log line an operator reads.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    pub batches: usize,
    pub records: u64,
    pub torn_bytes_discarded: u64,
    pub torn_at: Option<(PathBuf, u64)>,
    pub empty_segments_removed: usize,
    /// Batches rewritten into a copy from another (missing, torn, rotten or misplaced).
    pub batches_repaired: usize,
    /// Copies (data directories) whose files do not take O_DIRECT.
    pub buffered_io_copies: Vec<usize>,
    /// Data directories fenced because a read of this log failed in them (at most ⌊M/2⌋ of
    /// M; more refuses the start).
    pub copies_fenced: Vec<usize>,
}

/// Records copied out of one batch, and where the batch ends.
#[derive(Default)]
struct BatchRead {
    end: u64,
    records: Vec<StoredRecord>,
}

/// The bytes of a validated batch, held for as long as a reader needs them.
pub enum HeldBytes<S: Storage> {
    /// From the tail cache: the commit's own buffer.
    Cached(Rc<S::Buffer>),
    /// Read from disk (an extent read ahead, or the batch alone), from this position on.
    Read(Rc<<S::File as StorageFile>::Read>, usize),
}

impl<S: Storage> HeldBytes<S> {
    fn bytes(&self) -> &[u8] {
        match self {
            HeldBytes::Cached(buffer) => buffer.bytes(),
            HeldBytes::Read(read, start) => &read[*start..],
        }
    }
}

/// A validated batch a reader holds: its records are views into it, copied nowhere.
pub struct HeldBatch<S: Storage> {
    bytes: HeldBytes<S>,
    log_id: u64,
    header: BatchHeader,
}

impl<S: Storage> HeldBatch<S> {
    /// One past its last record.
    pub fn end_offset(&self) -> u64 {
        self.header.end_offset()
    }

    /// Its first record's offset.
    pub fn base_offset(&self) -> u64 {
        self.header.base_offset
    }

    /// The bytes of its records (what holding it costs, but for the block padding; the buffer
    /// it was read into may be a larger extent).
    pub fn records_bytes(&self) -> usize {
        self.header.records_bytes as usize
    }

    /// The bytes it was read into, from the batch's start: its records' views point inside.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.bytes()
    }

    /// The epoch of the leader that wrote it.
    pub fn epoch(&self) -> u64 {
        self.header.epoch
    }

    /// How many records it holds.
    pub fn record_count(&self) -> u32 {
        self.header.record_count
    }

    /// Its records as they lie in it, sealed (offsets and checksums in place): what a leader
    /// sends a follower, which checks them (`record::check_sealed_records`) and seals them
    /// again at the same offsets, to the same bytes.
    pub fn sealed_records(&self) -> &[u8] {
        let start = self.header.header_bytes();
        &self.bytes.bytes()[start..start + self.header.records_bytes as usize]
    }

    /// Its records, in offset order. They passed their checksums when the batch was read from
    /// disk, so only their layout is checked again.
    pub fn records(&self) -> Result<Vec<record::RecordView<'_>>, LogError> {
        self.records_in(0..u64::MAX)
    }

    /// Its records whose offsets are in `wanted`, the others not parsed.
    pub fn records_in(&self, wanted: std::ops::Range<u64>) -> Result<Vec<record::RecordView<'_>>, LogError> {
        record::decode_batch_range(self.bytes.bytes(), self.log_id, &self.header, false, wanted).map_err(
            |error| LogError::DataLoss(format!("batch at offset {}: {error}", self.header.base_offset)),
        )
    }
}

impl<S: Storage> AsRef<[u8]> for HeldBatch<S> {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

/// The offsets from the first of `offsets` (sorted) to its last, inclusive: what a reader of
/// them needs parsed (`HeldBatch::records_in`).
pub fn span(offsets: &[u64]) -> std::ops::Range<u64> {
    offsets.first().copied().unwrap_or(0)..offsets.last().map_or(0, |last| last + 1)
}

/// A closed segment, as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: u64,
    /// One past its last record.
    pub end_offset: u64,
    pub newest_publish_ms: u64,
}

/// A stored message, copied out of a validated batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub publish_time_ms: u64,
    pub ordering_key: String,
    pub attributes: Vec<(String, String)>,
    pub data: Vec<u8>,
}

impl StoredRecord {
    fn of(view: &record::RecordView<'_>) -> StoredRecord {
        StoredRecord {
            offset: view.offset,
            publish_time_ms: view.publish_time_ms,
            ordering_key: view.ordering_key.to_owned(),
            attributes: view.attributes().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
            data: view.data.to_vec(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BatchEntry {
    header: BatchHeader,
    position: u64,
}

struct Segment<S: Storage> {
    base_offset: u64,
    /// Publish time of the newest record, for time-based retention.
    newest_publish_ms: u64,
    capacity: u64,
    write_position: u64,
    /// The files were a deleted segment's (see `remove_oldest`): bytes of their earlier life
    /// may follow this segment's batches, and the manifest says so.
    recycled: bool,
    batches: Vec<BatchEntry>,
    /// The segment's file in each data directory (None where the copy is missing or fenced).
    files: Vec<Option<Rc<S::File>>>,
    /// Set while the files are closed to save descriptors: which copies have the file, to
    /// reopen on the next use (`ensure_open`).
    closed: Option<Vec<bool>>,
}

impl<S: Storage> Segment<S> {
    /// Drops this log's handles on the segment's files; in-flight reads and writes keep theirs.
    fn close_files(&mut self) {
        if self.closed.is_none() {
            self.closed = Some(self.files.iter().map(Option::is_some).collect());
            for file in self.files.iter_mut() {
                *file = None;
            }
        }
    }
}

/// Whether a copy of this log may take writes. A copy that missed a write stays stale until a
/// resync rewrites it, even if its directory is healthy again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyState {
    Current,
    Stale,
}

/// The state of each of a log's copies, one bit each (`DATA_DIRECTORIES_MAX` bounds them): a
/// vector cost every log 24 bytes and an allocation.
#[derive(Clone, Copy)]
struct CopyStates {
    stale: u64,
    count: u8,
}

impl CopyStates {
    /// `count` is a `Directories::count()`, which `Directories::new` keeps within
    /// `DATA_DIRECTORIES_MAX`.
    fn all_current(count: usize) -> CopyStates {
        CopyStates { stale: 0, count: count as u8 }
    }

    fn len(&self) -> usize {
        self.count as usize
    }

    fn get(&self, copy: usize) -> CopyState {
        if self.stale & (1 << copy) == 0 {
            CopyState::Current
        } else {
            CopyState::Stale
        }
    }

    fn set(&mut self, copy: usize, state: CopyState) {
        match state {
            CopyState::Current => self.stale &= !(1 << copy),
            CopyState::Stale => self.stale |= 1 << copy,
        }
    }
}

/// Copies being brought back by `resync_copy` that already take every write issued (bit
/// `copy`), while they are still stale for everything else (reads, a resync's source, the
/// operator's view): a write issued before a copy joined, or into a segment a roll made
/// without it, misses it, and is noted so that the resync copies that batch too before the
/// copy is current. Boxed in an Option: a log has one only while one of its copies is being
/// resynced, so the commit path looks at one word (`Log::note_missed`).
struct Joining {
    copies: u64,
    /// Writes issued while a copy was joining that did not go to it: (segment base, byte
    /// position, the copies it missed). At most `RESYNC_MISSED_MAX`.
    missed: Vec<(u64, u64, u64)>,
}

/// What an append hands the log: its records, unsealed (`record::encode_record_unsealed`),
/// either encoded already or encoded only when the commit that carries them is built, straight
/// into the commit's aligned buffer: a publish's messages are then copied once on their way to
/// the disk instead of twice.
pub enum Records {
    Encoded(Vec<u8>),
    Deferred(Box<dyn EncodeRecords>),
}

/// Records encoded when their commit is built (`Records::Deferred`).
pub trait EncodeRecords {
    /// Bytes the unsealed records take, padding included: exactly what `encode_into` writes.
    fn encoded_bytes(&self) -> usize;
    /// Writes the unsealed records into `out`, which is `encoded_bytes()` long.
    fn encode_into(&self, out: &mut [u8]);
    /// The newest publish time among the records.
    fn newest_publish_ms(&self) -> u64;
}

impl Records {
    fn len(&self) -> usize {
        match self {
            Records::Encoded(records) => records.len(),
            Records::Deferred(records) => records.encoded_bytes(),
        }
    }

    fn write_into(&self, out: &mut [u8]) {
        match self {
            Records::Encoded(records) => out.copy_from_slice(records),
            Records::Deferred(records) => records.encode_into(out),
        }
    }

    fn newest_publish_ms(&self) -> u64 {
        match self {
            Records::Encoded(records) => record::newest_publish_ms(records),
            Records::Deferred(records) => records.newest_publish_ms(),
        }
    }
}

struct Staged {
    records: Records,
    record_count: u32,
    /// The epoch of the batch that takes these records: a batch takes appends of one epoch.
    epoch: u64,
    /// The offset a follower's append was given (`append_at`); None for the leader's appends,
    /// whose offsets the flush loop assigns.
    first_offset: Option<u64>,
    reply: Sender<Result<(u64, u32), LogError>>,
}

/// Where a batch goes: its segment, its byte position in it, and its first offset.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Place {
    segment_base: u64,
    position: u64,
    base_offset: u64,
}

/// A batch's bytes built while the commit before it was being written (see `flush_loop`), for
/// the place that commit leaves, and the write of them already issued: it is acknowledged only
/// once the commit before it is durable too, and if that one fails the log is fenced.
struct Prepared<S: Storage> {
    place: Place,
    buffer: Rc<S::Buffer>,
    writing: Writing<S::File>,
}

/// A batch's write issued to each copy (copy index, file), not yet awaited.
struct Writing<F: StorageFile> {
    targets: Vec<(usize, Rc<F>)>,
    task: crate::runtime::Task<Vec<std::io::Result<()>>>,
    /// When the write was issued, for the shard's commit latency (`crate::metrics::latency`).
    issued: std::time::Instant,
}

/// What `Log::create_in_copies` makes: a segment's base, size, whether it is the log's first,
/// and the copies (bits) taking the reserve.
#[derive(Clone, Copy)]
struct Creation {
    base_offset: u64,
    capacity: u64,
    first_segment: bool,
    reserve_copies: u64,
}

/// A segment made in some copies: the files by copy, how many, and the copies that failed for
/// want of space and for other reasons.
type Created<S> = (
    Vec<Option<Rc<<S as Storage>::File>>>,
    usize,
    Vec<(usize, std::io::Error)>,
    Vec<(usize, std::io::Error)>,
);

/// The next batch, taken, built and being written ahead.
type Ahead<S> = (Vec<Staged>, Prepared<S>);

/// Issues the same write to every target at once, in a task of its own so that it goes to the
/// disk whether or not anyone is polling it yet.
fn spawn_writes<F: StorageFile>(
    targets: &[(usize, Rc<F>)],
    buffer: &Rc<F::Buffer>,
    position: u64,
) -> Writing<F> {
    let files: Vec<(usize, Rc<F>)> = targets.to_vec();
    let buffer = buffer.clone();
    let task = crate::runtime::spawn(async move {
        let bytes = buffer.bytes().len() as u64;
        join_all(
            files
                .iter()
                .map(|(copy, file)| {
                    let buffer = buffer.clone();
                    async move {
                        let started = crate::runtime::now();
                        let written = file.write_at(buffer, position).await;
                        let took = crate::runtime::now().saturating_duration_since(started);
                        crate::metrics::shard::record_write(*copy, bytes, took, written.is_ok());
                        written
                    }
                })
                .collect(),
        )
        .await
    });
    Writing { targets: targets.to_vec(), task, issued: crate::runtime::now() }
}

/// The next segment of a log, being zero-filled in the background (`LogConfig::prewrite`).
struct Spare<S: Storage> {
    capacity: u64,
    /// Set to make the zero-filling stop after the write in flight.
    stop: Rc<std::cell::Cell<bool>>,
    /// Ends with the spare's file in each copy it could be prepared in.
    task: crate::runtime::Task<Vec<Option<Rc<S::File>>>>,
    /// Held until the spare is used or removed.
    _place: ShardPlace,
}

/// A file in each copy (None where a copy has none).
type CopyFiles<S> = Vec<Option<Rc<<S as Storage>::File>>>;

/// The segment a log keeps allocated for a full disk (`LogConfig::reserve`): its size, and the
/// copies holding it (bit `copy`; `DATA_DIRECTORIES_MAX` fits a word). Its files are closed:
/// a journal that closes its segments to save descriptors holds none for its reserve either.
#[derive(Clone, Copy, Debug)]
struct Reserve {
    capacity: u64,
    copies: u64,
}
const _: () = assert!(DATA_DIRECTORIES_MAX <= u64::BITS as usize, "a reserve's copies are bits of a u64");

/// A deleted segment's file kept under `RECYCLE_NAME` in each copy for the next roll
/// (`LogConfig::recycle`).
struct Recycled<S: Storage> {
    capacity: u64,
    files: CopyFiles<S>,
    _place: ShardPlace,
}

struct LogInner<S: Storage> {
    log_id: u64,
    relative: PathBuf,
    /// Shared by the logs opened with the same configuration (every topic's message log):
    /// one copy per shard instead of 56 bytes per log.
    config: Rc<LogConfig>,
    segments: Vec<Segment<S>>,
    /// The log's positions, each an offset one past the last record it counts, in order
    /// `start_offset() <= committed_end <= durable_end <= written_end <= assigned_end`
    /// (`check_positions`):
    /// - `committed_end`: what readers see (`read`, `hold_offsets`, `offset_at_time`, the
    ///   `committed` notification). A standalone log commits what is durable as each commit
    ///   completes (`commit_on_durable`); a replicated one is told (`commit_to`) once a quorum
    ///   of replicas has it. Always the end of a batch.
    /// - `durable_end`: what is durable on ⌈M/2⌉ of this node's directories; appends are
    ///   acknowledged up to here.
    /// - `written_end`: the end of the last batch whose offsets were given and whose write may
    ///   be in flight.
    /// - `assigned_end`: the offset the next append will get once everything queued commits:
    ///   what `append_at` must be given.
    committed_end: u64,
    durable_end: u64,
    written_end: u64,
    assigned_end: u64,
    /// Whether each completed commit also commits (a standalone log); see `set_commit_on_durable`.
    commit_on_durable: bool,
    /// The epoch of the leader's appends (`append`): `STANDALONE_EPOCH` unless set.
    epoch: u64,
    /// The epoch of the last batch written or queued: no later batch may have an older one.
    last_epoch: u64,
    /// The epoch this log promised (`promise_epoch`, kept in the manifest): appends of an older
    /// one are refused. 0: none.
    promised_epoch: u64,
    /// The promise the manifest holds durably (`promise_epoch` writes it once).
    promised_durable: u64,
    /// A `truncate_after` is in progress: appends are refused until it ends.
    truncating: bool,
    /// Written into the manifest while a truncation zeroes the removed batches (see
    /// `manifest::Manifest::truncated_end`).
    truncated_end: Option<u64>,
    staged: VecDeque<Staged>,
    staged_bytes: usize,
    flushing: bool,
    fenced: Option<String>,
    /// Its files are about to be removed (`close_for_removal`): appends are refused.
    closed_for_removal: bool,
    tail_cache: VecDeque<(u64, Rc<S::Buffer>)>,
    tail_cache_bytes: usize,
    /// Sweeps since the last commit, up to `TAIL_CACHE_IDLE_SWEEPS`.
    idle_sweeps: u8,
    /// Extents read ahead for readers going through the log in order; made on the first read
    /// from disk (boxed: most logs are never read from disk).
    read_ahead: Option<Box<ReadAhead<<S::File as StorageFile>::Read>>>,
    warned_buffered: bool,
    copies: CopyStates,
    /// Set while a resync brings copies back (see `Joining`).
    joining: Option<Box<Joining>>,
    manifest_sequence: u64,
    /// Boxed: most logs (idle topics) never have one, and each of them costs a word.
    spare: Option<Box<Spare<S>>>,
    /// The base offset of the active segment a spare was last started for (`u64::MAX`: none):
    /// one per segment, even if it could not be used.
    spare_started_for: u64,
    /// Commits built and issued while the one before was being written (`prepare_ahead`).
    commits_built_ahead: u64,
    /// Boxed, as the spare: only busy logs keep one.
    recycled: Option<Box<Recycled<S>>>,
    /// Set by a roll of a log that recycles, taken by `take_rolled`.
    rolled: bool,
    /// A manifest write is in progress: the next waits (see `write_manifest`).
    manifest_writing: bool,
    /// Boxed: only journals keep one (`LogConfig::reserve`).
    reserve: Option<Box<Reserve>>,
    /// A `retake_reserve` is in progress.
    reserving: bool,
}

impl<S: Storage> LogInner<S> {
    /// Marks a copy stale: it missed a write. One that was joining stops joining (its resync
    /// then fails: the copy needs another).
    fn mark_stale(&mut self, copy: usize) {
        self.copies.set(copy, CopyState::Stale);
        if let Some(joining) = self.joining.as_mut() {
            joining.copies &= !(1 << copy);
            if joining.copies == 0 {
                self.joining = None;
            }
        }
    }

    /// Whether a copy takes writes: it is current, or joining (see `Joining`).
    fn takes_writes(&self, copy: usize) -> bool {
        self.copies.get(copy) == CopyState::Current
            || self.joining.as_ref().is_some_and(|joining| joining.copies & (1 << copy) != 0)
    }

    /// The joining copies that a write to `targets` misses (0 with no copy joining).
    fn joining_missed_by<F>(&self, targets: &[(usize, Rc<F>)]) -> u64 {
        let Some(joining) = self.joining.as_ref() else { return 0 };
        let written = targets.iter().fold(0u64, |written, (copy, _)| written | 1 << copy);
        joining.copies & !written
    }

    /// Where the next batch goes: the active segment's write position and the next offset;
    /// None before the first segment.
    fn end(&self) -> Option<Place> {
        self.segments.last().map(|segment| Place {
            segment_base: segment.base_offset,
            position: segment.write_position,
            base_offset: self.durable_end,
        })
    }

    /// Asserts the order of the log's positions (see `committed_end`).
    fn check_positions(&self) {
        let start = self.segments.first().map_or(self.committed_end, |segment| segment.base_offset);
        debug_assert!(
            start <= self.committed_end
                && self.committed_end <= self.durable_end
                && self.durable_end <= self.written_end
                && self.written_end <= self.assigned_end,
            "positions out of order: start {start}, committed {}, durable {}, written {}, assigned {}",
            self.committed_end,
            self.durable_end,
            self.written_end,
            self.assigned_end
        );
    }

    /// The epoch of the last batch indexed (`EPOCH_NONE` without one).
    fn last_indexed_epoch(&self) -> u64 {
        self.segments
            .iter()
            .rev()
            .find_map(|segment| segment.batches.last())
            .map_or(record::EPOCH_NONE, |entry| entry.header.epoch)
    }

    /// The end of the last whole batch at or below `offset`.
    fn batch_end_at_or_below(&self, offset: u64) -> u64 {
        let segment_index = match self.segments.binary_search_by_key(&offset, |segment| segment.base_offset) {
            Ok(index) => index,
            Err(0) => return self.segments.first().map_or(offset, |segment| segment.base_offset),
            Err(index) => index - 1,
        };
        let segment = &self.segments[segment_index];
        let batches = &segment.batches;
        let kept = batches.partition_point(|entry| entry.header.end_offset() <= offset);
        match kept {
            0 => segment.base_offset,
            kept => batches[kept - 1].header.end_offset(),
        }
    }

    fn drop_oldest_cached(&mut self) {
        if let Some((_, old)) = self.tail_cache.pop_front() {
            let bytes = old.bytes().len();
            self.tail_cache_bytes -= bytes;
            if let Some(budget) = &self.config.tail_cache_budget {
                budget.refund(bytes);
            }
        }
    }

    fn drop_tail_cache(&mut self) {
        while !self.tail_cache.is_empty() {
            self.drop_oldest_cached();
        }
    }

    fn has_room_to_read_ahead(&self) -> bool {
        self.config.tail_cache_budget.as_ref().is_none_or(|budget| budget.has_room_to_read_ahead())
    }

    fn keep_extent(&mut self, extent: Extent<<S::File as StorageFile>::Read>) {
        let added = extent.bytes.len();
        let dropped = self.read_ahead.get_or_insert_with(Default::default).insert(extent);
        if let Some(budget) = &self.config.tail_cache_budget {
            budget.charge(added);
            budget.refund(dropped);
        }
    }

    fn drop_read_ahead(&mut self) {
        if let Some(mut cache) = self.read_ahead.take() {
            // Nobody may be left waiting on a read whose result has nowhere to go.
            cache.finish_reading();
            if let Some(budget) = &self.config.tail_cache_budget {
                budget.refund(cache.bytes());
            }
        }
    }

    /// The batches to read in one I/O from the batch starting at `base_offset` on: up to
    /// `READ_AHEAD_BYTES` of them (at least one) that follow each other in its segment, from
    /// the first current copy. None when there is nothing to read that way: nothing committed
    /// there, the batch is in the tail cache, or the segment's files are closed.
    fn plan_extent(&self, base_offset: u64) -> Option<ExtentPlan<S>> {
        let segment_index =
            match self.segments.binary_search_by_key(&base_offset, |segment| segment.base_offset) {
                Ok(index) => index,
                Err(0) => return None,
                Err(index) => index - 1,
            };
        let segment = &self.segments[segment_index];
        let first =
            segment.batches.binary_search_by_key(&base_offset, |entry| entry.header.base_offset).ok()?;
        let cached_from = self.tail_cache.front().map_or(u64::MAX, |(base, _)| *base);
        let position = segment.batches[first].position;
        let mut batches = Vec::new();
        let mut bytes = 0usize;
        for entry in &segment.batches[first..] {
            let follows = entry.position == position + bytes as u64;
            let fits = batches.is_empty() || bytes + entry.header.disk_bytes() <= READ_AHEAD_BYTES;
            // Only committed batches: a truncation may take the others away.
            let committed = entry.header.base_offset < self.committed_end;
            if entry.header.base_offset >= cached_from || !follows || !fits || !committed {
                break;
            }
            batches.push(*entry);
            bytes += entry.header.disk_bytes();
        }
        let (_, file) = self
            .copy_files(segment_index)
            .into_iter()
            .find(|(copy, _)| self.copies.get(*copy) == CopyState::Current)?;
        Some(ExtentPlan {
            file,
            log_id: self.log_id,
            segment_base: segment.base_offset,
            position,
            bytes,
            end_offset: batches.last()?.header.end_offset(),
            batches,
        })
    }

    /// The open files of a segment, current copies first; a stale (fenced) copy is still read
    /// as a last resort: what it holds from before it was fenced is checked like everything else.
    fn copy_files(&self, segment_index: usize) -> Vec<(usize, Rc<S::File>)> {
        let mut files: Vec<(usize, Rc<S::File>)> = self.segments[segment_index]
            .files
            .iter()
            .enumerate()
            .filter_map(|(copy, file)| file.clone().map(|file| (copy, file)))
            .collect();
        files.sort_by_key(|(copy, _)| self.copies.get(*copy) != CopyState::Current);
        files
    }
}

impl<S: Storage> Drop for LogInner<S> {
    /// A deleted topic's log gives its cached bytes back to the shard's budget.
    fn drop(&mut self) {
        self.drop_tail_cache();
        self.drop_read_ahead();
    }
}

/// One read of whole batches, planned while the log is borrowed and done after.
struct ExtentPlan<S: Storage> {
    file: Rc<S::File>,
    log_id: u64,
    segment_base: u64,
    position: u64,
    bytes: usize,
    end_offset: u64,
    batches: Vec<BatchEntry>,
}

impl<S: Storage> ExtentPlan<S> {
    /// Reads the extent and validates every batch in it, as a batch read alone is. None if the
    /// read or any check fails: the reader then reads batch by batch, copy by copy, which
    /// reports the damage and repairs it from another copy.
    async fn read(self) -> Option<Extent<<S::File as StorageFile>::Read>> {
        let bytes = self.file.read_at(self.position, self.bytes).await.ok()?;
        if bytes.len() < self.bytes {
            return None;
        }
        for entry in &self.batches {
            let batch = &bytes[(entry.position - self.position) as usize..];
            let header =
                record::decode_batch_header(batch, self.log_id, self.segment_base, entry.position).ok()?;
            if header != entry.header {
                return None;
            }
            record::decode_batch_checked(batch, self.log_id, &header, true).ok()?;
        }
        Some(Extent {
            segment_base: self.segment_base,
            position: self.position,
            base_offset: self.batches.first()?.header.base_offset,
            end_offset: self.end_offset,
            bytes: Rc::new(bytes),
        })
    }
}

/// A handle to one log. Cheap to clone; all clones share the log.
pub struct Log<S: Storage> {
    storage: S,
    directories: Rc<Directories>,
    inner: Rc<RefCell<LogInner<S>>>,
    committed: Notify,
    /// Fires when the durable end moves (a leader's replicas are sent what is durable here).
    durable: Notify,
}

impl<S: Storage> Clone for Log<S> {
    fn clone(&self) -> Self {
        Log {
            storage: self.storage.clone(),
            directories: self.directories.clone(),
            inner: self.inner.clone(),
            committed: self.committed.clone(),
            durable: self.durable.clone(),
        }
    }
}

fn segment_name(base_offset: u64) -> String {
    format!("{base_offset:020}.seg")
}

fn io_text(error: &std::io::Error) -> String {
    error.to_string()
}

/// A resource ran out (disk space, quota, open files, kernel memory): the request should be
/// refused with `ResourceExhausted` and retried later. It says nothing bad about the disk, so
/// it never fences a directory on its own.
pub fn is_no_space(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(nix::libc::ENOSPC)
            | Some(nix::libc::EDQUOT)
            | Some(nix::libc::EMFILE)
            | Some(nix::libc::ENFILE)
            | Some(nix::libc::ENOMEM)
    )
}

/// The directory's filesystem (or its quota) is out of space, as opposed to a process-wide
/// shortage (open files, memory) that `is_no_space` also counts.
fn is_out_of_space(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT))
}

/// Creates a spare segment file in each copy given a path (`None` elsewhere), allocates and
/// syncs it, then writes zeros over it chunk by chunk until it is whole or `stop` is set: only
/// while `busy` (the log is bound by the disk) is false, and pausing after each chunk as long
/// as it took, so that the log's own commits keep at least half of the disk's time. A complete
/// spare is synced again, so that the extents it converted are durable before a commit depends
/// on them. Copies that fail on the way end as `None`. A filesystem without direct I/O gets no
/// spare: zeros through the page cache would be copied for nothing.
async fn prewrite_spare<S: Storage>(
    storage: S,
    paths: Vec<Option<PathBuf>>,
    capacity: u64,
    stop: Rc<std::cell::Cell<bool>>,
    busy: impl Fn() -> bool,
) -> Vec<Option<Rc<S::File>>> {
    let mut files: Vec<Option<Rc<S::File>>> = Vec::with_capacity(paths.len());
    for path in &paths {
        let Some(path) = path else {
            files.push(None);
            continue;
        };
        let created = async {
            // Whatever an earlier spare left here is not known to be zeros.
            if storage.exists(path) {
                storage.remove_file(path)?;
            }
            let file = storage.open_unsynced(path, true).await?;
            file.allocate(capacity).await?;
            file.sync_data().await?;
            Ok::<_, std::io::Error>(file)
        }
        .await;
        match created {
            Ok(file) if file.direct_io() => files.push(Some(Rc::new(file))),
            _ => {
                let _ = storage.remove_file(path);
                files.push(None);
            }
        }
    }
    let mut zeros: Option<Rc<S::Buffer>> = None;
    let mut position = 0;
    while position < capacity && !stop.get() && files.iter().any(Option::is_some) {
        if busy() {
            crate::runtime::sleep(SPARE_BUSY_PAUSE).await;
            continue;
        }
        let bytes = SPARE_WRITE_CHUNK_BYTES.min(capacity - position) as usize;
        let buffer = match &zeros {
            Some(buffer) if buffer.bytes().len() == bytes => buffer.clone(),
            _ => {
                let mut buffer = storage.alloc_buffer(bytes);
                buffer.bytes_mut().fill(0);
                let buffer = Rc::new(buffer);
                zeros = Some(buffer.clone());
                buffer
            }
        };
        let started = crate::runtime::now();
        let writing: Vec<usize> = (0..files.len()).filter(|copy| files[*copy].is_some()).collect();
        let writes = join_all(
            writing
                .iter()
                .map(|copy| files[*copy].as_ref().unwrap().write_at(buffer.clone(), position))
                .collect(),
        )
        .await;
        for (copy, result) in writing.into_iter().zip(writes) {
            if result.is_err() {
                files[copy] = None;
                if let Some(path) = &paths[copy] {
                    let _ = storage.remove_file(path);
                }
            }
        }
        position += bytes as u64;
        if position < capacity && !stop.get() {
            // Measured on the seam's clock: `Instant::elapsed` reads the system clock, which a
            // simulation does not run on, and made its pauses (and a seed's replay) vary.
            crate::runtime::sleep(crate::runtime::now().saturating_duration_since(started)).await;
        }
    }
    if position >= capacity && !stop.get() {
        for copy in 0..files.len() {
            let Some(file) = files[copy].clone() else { continue };
            if file.sync_data().await.is_err() {
                files[copy] = None;
                if let Some(path) = &paths[copy] {
                    let _ = storage.remove_file(path);
                }
            }
        }
    }
    files
}

/// How long a manifest write waits before looking again while another one is in progress.
const MANIFEST_WAIT: std::time::Duration = std::time::Duration::from_micros(50);

/// Ends a manifest write's turn, however the write ends (a dropped future included).
struct ManifestTurn<'a, S: Storage>(&'a RefCell<LogInner<S>>);

impl<S: Storage> Drop for ManifestTurn<'_, S> {
    fn drop(&mut self) {
        self.0.borrow_mut().manifest_writing = false;
    }
}

/// Rounds a live resync may take to catch up with commits before it gives up.
const RESYNC_ROUNDS_MAX: usize = 1000;
/// How long a resync waits between two looks at a write in flight that missed its copy.
const RESYNC_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// Writes that may miss a joining copy before its resync gives up (see `Joining`): only a
/// roll racing the join makes one, so a handful is plenty.
const RESYNC_MISSED_MAX: usize = 64;

/// What a round of a resync finds (`Log::resync_work`).
enum ResyncWork {
    /// Batches to copy, by segment: (segment index, base offset, batches, the file is missing).
    Copy(Vec<(usize, u64, Vec<BatchEntry>, bool)>),
    /// A write that missed the copy is in flight: look again once it is durable.
    Wait,
    /// Nothing is left to copy.
    Done,
}

/// Bytes a deleted segment shrinks by at a time before it is unlinked (see `shrink_gradually`).
pub const SEGMENT_DELETE_STEP_BYTES: u64 = 4 << 20;
/// Pause between two steps, so that other writes and syncs get to the device in between.
pub const SEGMENT_DELETE_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// The file a log's next segment is zero-filled in before it gets its name (see
/// `LogConfig::prewrite`). Not a segment name: recovery removes it.
pub const SPARE_NAME: &str = "spare.tmp";
/// Bytes the zero-filling of a spare writes at a time: small, so that a commit arriving
/// meanwhile waits little behind it at the device.
pub const SPARE_WRITE_CHUNK_BYTES: u64 = 256 << 10;
/// How long the zero-filling of a spare waits before looking again while its log is bound by
/// the disk.
pub const SPARE_BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);
/// Spares a shard keeps at once. Each holds a file open in every copy and up to a segment of
/// disk, and the descriptors are the same ones every topic's segments need: beyond this, logs
/// roll the usual way.
pub const SPARES_PER_SHARD_MAX: usize = 64;

/// The name a deleted segment's file is kept under until the next roll renames it into place
/// (`LogConfig::recycle`). Not a segment name: recovery removes it.
pub const RECYCLE_NAME: &str = "recycle.tmp";
/// Recycled files a shard keeps at once. Each holds `segment_bytes_max` of disk in every copy
/// that the user's retention no longer asks for, and a descriptor per copy: a few busy topics
/// take them, the others delete their segments as before.
pub const RECYCLED_PER_SHARD_MAX: usize = 16;
/// A spare or a recycled file is kept only where the free space is at least this many times
/// its size: near a full disk it would take the room another log's next segment needs, and a
/// refused publish would then make the shard give them all up again.
pub const KEPT_FILE_FREE_BYTES_FACTOR: u64 = 4;

/// The file a log's reserve segment is kept under (`LogConfig::reserve`). Not a segment name:
/// recovery keeps it as the reserve. It is only ever made by `fallocate` and never written,
/// so a roll may rename it into place as it does a spare.
pub const RESERVE_NAME: &str = "reserve.tmp";
/// How often `close_for_removal` looks whether the commits in flight are done.
const REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// The name a reserve is allocated under before it is renamed to `RESERVE_NAME`, so that a
/// reserve under its name is always whole. Recovery removes it.
pub const RESERVE_MAKING_NAME: &str = "reserve.new";

/// The size of the next segment when the disk may not hold `wanted` bytes: halved until it
/// fits in `free_bytes`, but not below `minimum_bytes` (nor below `wanted` when that is
/// smaller: the size a batch needs). A log then keeps taking commits in ever smaller segments
/// until not even `minimum_bytes` is left, instead of stopping while a large doubling is all
/// that does not fit.
pub fn segment_bytes_to_fit(wanted: u64, free_bytes: u64, minimum_bytes: u64) -> u64 {
    let mut bytes = wanted;
    while bytes > free_bytes && bytes / 2 >= minimum_bytes && bytes / 2 >= BLOCK_BYTES as u64 {
        bytes /= 2;
    }
    bytes
}

/// Allocates the reserve segment of the log at `relative` (`LogConfig::reserve`), `bytes`
/// long, in every data directory that is not fenced, holds the log's folder (a missing one is
/// not made: a deleted topic's would come back) and does not hold a reserve yet: allocated and
/// synced under `RESERVE_MAKING_NAME`, renamed to `RESERVE_NAME`, the folder synced. Also
/// allocates one block for each manifest slot file not yet made, so that the manifest a roll
/// into the reserve writes needs no space either. Works on a log that is not open (a journal
/// before its first entry): the log adopts the reserve when it opens (`open`) or when it looks
/// again (`Log::retake_reserve`). Fails, removing what it made, with `NoSpace` when the disk
/// has no room for it.
pub async fn make_reserve<S: Storage>(
    storage: &S,
    directories: &Directories,
    relative: &Path,
    bytes: u64,
) -> Result<(), LogError> {
    let mut result = Ok(());
    for copy in (0..directories.count()).filter(|copy| !directories.is_fenced(*copy)) {
        let folder = directories.path(copy).join(relative);
        // A folder that is gone (its topic was deleted meanwhile) is not made again: the log
        // makes its folders when it opens.
        if !storage.exists(&folder) || storage.exists(&folder.join(RESERVE_NAME)) {
            continue;
        }
        let making = folder.join(RESERVE_MAKING_NAME);
        let made = async {
            for slot in MANIFEST_SLOTS {
                let path = folder.join(slot);
                if !storage.exists(&path) {
                    let file = storage.open(&path, true).await?;
                    file.allocate(BLOCK_BYTES as u64).await?;
                    file.sync_data().await?;
                }
            }
            let file = storage.open_unsynced(&making, true).await?;
            file.allocate(bytes).await?;
            file.sync_data().await?;
            drop(file);
            storage.rename(&making, &folder.join(RESERVE_NAME))?;
            storage.sync_dir(&folder).await
        }
        .await;
        match made {
            Ok(()) => self::directories::note_room(directories.path(copy)),
            Err(error) => {
                let _ = storage.remove_file(&making);
                if is_out_of_space(&error) {
                    self::directories::note_full(directories.path(copy), &error.to_string());
                }
                let text = format!("reserving {bytes} bytes for {}: {error}", folder.display());
                result = Err(if is_no_space(&error) { LogError::NoSpace(text) } else { LogError::Io(text) });
            }
        }
    }
    result
}

/// The reserve each copy of the log at `relative` holds, as `open` and `retake_reserve` find
/// it: its smallest size over the copies that have one.
async fn find_reserve<S: Storage>(
    storage: &S,
    directories: &Directories,
    relative: &Path,
) -> Option<Reserve> {
    let mut reserve = Reserve { capacity: u64::MAX, copies: 0 };
    for copy in 0..directories.count() {
        let path = directories.path(copy).join(relative).join(RESERVE_NAME);
        if !storage.exists(&path) {
            continue;
        }
        let Ok(file) = storage.open(&path, false).await else { continue };
        let Ok(size) = file.size().await else { continue };
        if size >= BLOCK_BYTES as u64 {
            reserve.capacity = reserve.capacity.min(size / BLOCK_BYTES as u64 * BLOCK_BYTES as u64);
            reserve.copies |= 1 << copy;
        }
    }
    (reserve.copies != 0).then_some(reserve)
}

thread_local! {
    /// Spares alive on this thread: a shard is one thread.
    static SPARES_ALIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Recycled files kept on this thread.
    static RECYCLED_ALIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Spares and recycled files the logs of this shard (this thread) keep.
pub fn files_kept_on_this_shard() -> usize {
    SPARES_ALIVE.with(|count| count.get()) + RECYCLED_ALIVE.with(|count| count.get())
}

/// One of this shard's places for a spare (`SPARES_PER_SHARD_MAX`) or a recycled file
/// (`RECYCLED_PER_SHARD_MAX`), given back when dropped.
struct ShardPlace(&'static std::thread::LocalKey<std::cell::Cell<usize>>);

impl ShardPlace {
    fn take(alive: &'static std::thread::LocalKey<std::cell::Cell<usize>>, max: usize) -> Option<ShardPlace> {
        alive.with(|count| {
            (count.get() < max).then(|| {
                count.set(count.get() + 1);
                ShardPlace(alive)
            })
        })
    }

    fn spare() -> Option<ShardPlace> {
        ShardPlace::take(&SPARES_ALIVE, SPARES_PER_SHARD_MAX)
    }

    fn recycled() -> Option<ShardPlace> {
        ShardPlace::take(&RECYCLED_ALIVE, RECYCLED_PER_SHARD_MAX)
    }
}

impl Drop for ShardPlace {
    fn drop(&mut self) {
        self.0.with(|count| count.set(count.get() - 1));
    }
}

/// Scan window for recovery reads, at most: the window grows from
/// `RECOVERY_READ_BYTES_FIRST`, so that a log holding little is read with little.
const RECOVERY_READ_BYTES: usize = 1 << 20;
const RECOVERY_READ_BYTES_FIRST: usize = 64 << 10;

/// What one copy holds at a position during recovery.
#[derive(Debug, Clone)]
enum CopyBatch {
    Valid(BatchHeader, u64),
    Empty,
    Invalid(String),
    Missing,
}

impl<S: Storage> Log<S> {
    /// Opens (recovering and repairing) or creates the log at `relative` inside every data
    /// directory.
    pub async fn open(
        storage: S,
        directories: Rc<Directories>,
        relative: &Path,
        log_id: u64,
        config: impl Into<Rc<LogConfig>>,
    ) -> Result<(Log<S>, RecoveryReport), LogError> {
        let config = config.into();
        let (scan, files) = recovery::scan(&storage, &directories, relative, log_id, &config).await?;
        let plan = recovery::plan(&scan)?;
        Log::carry_out(storage, directories, (relative, log_id, config), plan, files).await
    }

    /// Rewrites the batch at `position` of a segment in copy `to` with the bytes of copy `from`.
    /// Returns whether the copy was repaired; a copy that fails the repair is fenced.
    async fn repair(
        &self,
        segment_index: usize,
        position: u64,
        bytes: usize,
        from: usize,
        to: usize,
    ) -> Result<bool, LogError> {
        self.ensure_open(segment_index).await?;
        let (source, target, base, capacity) = {
            let inner = self.inner.borrow();
            let segment = &inner.segments[segment_index];
            (segment.files[from].clone(), segment.files[to].clone(), segment.base_offset, segment.capacity)
        };
        let Some(source) = source else { return Ok(false) };
        let target = match target {
            Some(file) => file,
            None => {
                let folder = self.folder(to);
                let path = folder.join(segment_name(base));
                let created = async {
                    // The copy's directory may have been replaced by an empty one while running.
                    self.storage.create_dir_durable(&folder).await?;
                    let file = self.storage.open(&path, true).await?;
                    file.allocate(capacity).await?;
                    file.sync_data().await?;
                    self.storage.sync_dir(&folder).await?;
                    Ok::<_, std::io::Error>(file)
                }
                .await;
                match created {
                    Ok(file) => {
                        let file = Rc::new(file);
                        self.inner.borrow_mut().segments[segment_index].files[to] = Some(file.clone());
                        file
                    }
                    Err(error) => {
                        self.fence_copy(to, &format!("recreating {}: {error}", path.display()));
                        return Ok(false);
                    }
                }
            }
        };
        let good = source.read_at(position, bytes).await.map_err(|e| LogError::Io(io_text(&e)))?;
        let mut buffer = self.storage.alloc_buffer(bytes);
        buffer.bytes_mut().copy_from_slice(&good[..bytes]);
        let result = async {
            target.write_at(Rc::new(buffer), position).await?;
            target.sync_data().await
        }
        .await;
        match result {
            Ok(()) => {
                self.directories.count_repair();
                Ok(true)
            }
            Err(error) => {
                self.fence_copy(to, &format!("repairing a batch at byte {position}: {error}"));
                Ok(false)
            }
        }
    }

    pub fn keeps_files_open(&self) -> bool {
        self.inner.borrow().config.keep_files_open
    }

    fn segment_is_closed(&self, segment_index: usize) -> bool {
        self.inner.borrow().segments.get(segment_index).is_some_and(|segment| segment.closed.is_some())
    }

    /// Reopens a segment's files if they were closed to save descriptors.
    async fn ensure_open(&self, segment_index: usize) -> Result<(), LogError> {
        let (present, base) = {
            let inner = self.inner.borrow();
            let Some(segment) = inner.segments.get(segment_index) else { return Ok(()) };
            match &segment.closed {
                None => return Ok(()),
                Some(present) => (present.clone(), segment.base_offset),
            }
        };
        let mut files: Vec<Option<Rc<S::File>>> = vec![None; present.len()];
        let mut missing = Vec::new();
        for (copy, had) in present.iter().enumerate() {
            if !had {
                continue;
            }
            let path = self.folder(copy).join(segment_name(base));
            match self.storage.open(&path, false).await {
                Ok(file) => files[copy] = Some(Rc::new(file)),
                Err(error) if is_no_space(&error) => {
                    return Err(LogError::NoSpace(format!("reopening {}: {error}", path.display())))
                }
                Err(error) => missing.push((copy, format!("reopening {}: {error}", path.display()))),
            }
        }
        let listed = self.inner.borrow().segments.iter().any(|segment| segment.base_offset == base);
        if !listed {
            // Removed (retention, compaction) while its files were being opened: its files are
            // gone for that reason, which says nothing against the directory.
            return Err(LogError::Refused(format!(
                "segment {} was removed while it was reopened",
                segment_name(base)
            )));
        }
        for (copy, why) in missing {
            self.fence_copy(copy, &why);
        }
        // Found again by base offset: the list may have changed while the files opened.
        let mut inner = self.inner.borrow_mut();
        if let Some(segment) = inner.segments.iter_mut().find(|segment| segment.base_offset == base) {
            if segment.closed.is_some() {
                segment.files = files;
                segment.closed = None;
            }
        }
        Ok(())
    }

    fn folder(&self, copy: usize) -> PathBuf {
        self.directories.path(copy).join(&self.inner.borrow().relative)
    }

    /// Copies that take writes now.
    fn writable_copies(&self) -> Vec<usize> {
        let mut inner = self.inner.borrow_mut();
        for copy in 0..inner.copies.len() {
            if self.directories.is_fenced(copy) {
                inner.mark_stale(copy);
            }
        }
        (0..inner.copies.len()).filter(|copy| inner.takes_writes(*copy)).collect()
    }

    fn fence_copy(&self, copy: usize, why: &str) {
        self.directories.fence(copy, why);
        self.inner.borrow_mut().mark_stale(copy);
    }

    fn fence(&self, why: String) -> LogError {
        let mut inner = self.inner.borrow_mut();
        crate::log_error!(
            "ringpostd: ERROR: fencing log {} ({}): {why}",
            inner.log_id,
            inner.relative.display()
        );
        inner.fenced = Some(why.clone());
        LogError::Fenced(why)
    }

    /// Writes the next manifest (the current segment list) to every writable copy; it must be
    /// durable on ⌈M/2⌉ of them.
    async fn write_manifest(&self) -> Result<(), LogError> {
        // One at a time: a roll and a deletion writing at once would both take the same next
        // sequence and slot, and the one that landed last, with the older list, would win.
        // Each write lists the segments as they are once it has its turn.
        while self.inner.borrow().manifest_writing {
            crate::runtime::sleep(MANIFEST_WAIT).await;
        }
        self.inner.borrow_mut().manifest_writing = true;
        let _turn = ManifestTurn(&self.inner);
        let (manifest, log_id) = {
            let inner = self.inner.borrow();
            // The sequence advances only once this write is durable: a failed write is retried
            // into the same slot, never into the one holding the last good manifest.
            let manifest = Manifest {
                sequence: inner.manifest_sequence + 1,
                segments: inner
                    .segments
                    .iter()
                    .map(|segment| Listed {
                        base_offset: segment.base_offset,
                        capacity: segment.capacity,
                        recycled: segment.recycled,
                    })
                    .collect(),
                truncated_end: inner.truncated_end,
                promised_epoch: inner.promised_epoch,
            };
            (manifest, inner.log_id)
        };
        let encoded = manifest.encode(log_id);
        let slot = manifest.slot();
        let copies = self.writable_copies();
        let writes = copies.iter().map(|copy| {
            let folder = self.folder(*copy);
            let mut buffer = self.storage.alloc_buffer(encoded.len());
            buffer.bytes_mut().copy_from_slice(&encoded);
            let buffer = Rc::new(buffer);
            async move {
                // As in `repair`: a directory replaced while running gets its folder back here
                // when a resync has no segment to copy into it.
                self.storage.create_dir_durable(&folder).await?;
                let path = folder.join(slot);
                let existed = self.storage.exists(&path);
                let file = self.storage.open(&path, true).await?;
                file.write_at(buffer, 0).await?;
                if !file.writes_are_durable() {
                    file.sync_data().await?;
                }
                if !existed {
                    self.storage.sync_dir(&folder).await?;
                }
                Ok::<(), std::io::Error>(())
            }
        });
        let results = join_all(writes.collect()).await;
        let mut durable = 0;
        let mut exhausted = None;
        for (copy, result) in copies.iter().zip(results) {
            match result {
                Ok(()) => durable += 1,
                Err(error) if is_no_space(&error) => {
                    // Out of files or space: no fault of the disk. The caller undoes what the
                    // manifest was to record, and the retry rewrites this same slot.
                    exhausted = Some(format!("writing the manifest: {error}"));
                }
                Err(error) => self.fence_copy(*copy, &format!("writing the manifest: {error}")),
            }
        }
        if durable < self.directories.quorum() {
            if let Some(why) = exhausted {
                return Err(LogError::NoSpace(why));
            }
            return Err(self.fence(format!(
                "the manifest is durable in {durable} data directories; {} are needed",
                self.directories.quorum()
            )));
        }
        self.inner.borrow_mut().manifest_sequence = manifest.sequence;
        Ok(())
    }

    /// Called once a second: after `TAIL_CACHE_IDLE_SWEEPS` without a commit the log keeps
    /// nothing in memory, so idle topics cost no cached batches; extents read ahead go as soon
    /// as a sweep finds that no reader used them since the last.
    pub fn release_idle_cache(&self) {
        let mut inner = self.inner.borrow_mut();
        if inner.idle_sweeps < TAIL_CACHE_IDLE_SWEEPS {
            inner.idle_sweeps += 1;
        } else if !inner.tail_cache.is_empty() {
            inner.drop_tail_cache();
        }
        if inner.read_ahead.as_mut().is_some_and(|cache| cache.idle_since_last_sweep()) {
            inner.drop_read_ahead();
        }
    }

    /// Bytes of batches this log keeps in memory for readers.
    pub fn tail_cache_bytes(&self) -> usize {
        self.inner.borrow().tail_cache_bytes
    }

    /// Bytes of extents this log keeps read ahead.
    pub fn read_ahead_bytes(&self) -> usize {
        self.inner.borrow().read_ahead.as_ref().map_or(0, |cache| cache.bytes())
    }

    /// One past the last committed record: what readers see. Every offset below it is durable
    /// here, and (replicated) on a quorum of replicas. The same as `committed_end`.
    pub fn end_offset(&self) -> u64 {
        self.inner.borrow().committed_end
    }

    /// One past the last record a quorum has (see `LogInner::committed_end`).
    pub fn committed_end(&self) -> u64 {
        self.inner.borrow().committed_end
    }

    /// One past the last record durable on ⌈M/2⌉ of this node's data directories: what the
    /// appends are acknowledged for.
    pub fn durable_end(&self) -> u64 {
        self.inner.borrow().durable_end
    }

    /// One past the last record whose batch was built and whose write may be in flight.
    pub fn written_end(&self) -> u64 {
        self.inner.borrow().written_end
    }

    /// The offset `append_at` must be given next: one past every record queued or written.
    pub fn next_offset(&self) -> u64 {
        self.inner.borrow().assigned_end
    }

    /// The epoch of the log's last batch, queued or written (`record::EPOCH_NONE` for none, or
    /// for batches written before epochs).
    pub fn last_epoch(&self) -> u64 {
        self.inner.borrow().last_epoch
    }

    /// Sets the epoch of the leader's appends (`append`). Refused when older than the epoch of
    /// the log's last batch, or 0 (the epoch of batches written before epochs).
    pub fn set_epoch(&self, epoch: u64) -> Result<(), LogError> {
        let mut inner = self.inner.borrow_mut();
        if epoch == record::EPOCH_NONE || epoch < inner.last_epoch.max(inner.promised_epoch) {
            return Err(LogError::Refused(format!(
                "epoch {epoch}: the log's last batch is of epoch {} and it promised epoch {}",
                inner.last_epoch, inner.promised_epoch
            )));
        }
        inner.epoch = epoch;
        Ok(())
    }

    /// Where each epoch begins among this log's durable batches, for a follower and its leader
    /// to find where their logs part (`replication::divergence`) without comparing records.
    /// Batches written before epochs (epoch 0) and segments retention removed are not in it.
    pub fn epoch_history(&self) -> crate::replication::EpochHistory {
        let inner = self.inner.borrow();
        let mut history = crate::replication::EpochHistory::default();
        let durable = inner.segments.iter().flat_map(|segment| segment.batches.iter());
        for entry in durable.take_while(|entry| entry.header.end_offset() <= inner.durable_end) {
            if entry.header.epoch != record::EPOCH_NONE && entry.header.record_count > 0 {
                history.appended(entry.header.epoch, entry.header.base_offset);
            }
        }
        history
    }

    /// The epoch promised (`promise_epoch`); 0 if none.
    pub fn promised_epoch(&self) -> u64 {
        self.inner.borrow().promised_epoch
    }

    /// A replica's part in a fencing round before a new leader is chosen: from now on, and
    /// across restarts, no append of an epoch older than `epoch` is taken. The appends queued
    /// before the promise are let through to their commits and waited for, and the promise is
    /// made durable in the manifest; then the log answers its last epoch and durable end, so
    /// the answer holds every record a deposed leader could still count as replicated here
    /// (one queued earlier is durable by then and in it; any later one is refused). A promise
    /// at or below one made before only waits and answers.
    pub async fn promise_epoch(&self, epoch: u64) -> Result<(u64, u64), LogError> {
        {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            inner.promised_epoch = inner.promised_epoch.max(epoch);
        }
        while self.inner.borrow().flushing {
            crate::runtime::sleep(REMOVAL_WAIT).await;
        }
        // A promise made durable before needs no write again (a fencing round retried).
        let promised = self.inner.borrow().promised_epoch;
        if promised > self.inner.borrow().promised_durable {
            self.write_manifest().await?;
            let mut inner = self.inner.borrow_mut();
            inner.promised_durable = inner.promised_durable.max(promised);
        }
        let inner = self.inner.borrow();
        if let Some(why) = &inner.fenced {
            return Err(LogError::Fenced(why.clone()));
        }
        Ok((inner.last_epoch, inner.durable_end))
    }

    /// Whether each completed commit also commits its records (true when opened: a standalone
    /// node's quorum is its own directories). A replicated log sets it false and calls
    /// `commit_to` as its replicas confirm.
    pub fn set_commit_on_durable(&self, commit_on_durable: bool) {
        self.inner.borrow_mut().commit_on_durable = commit_on_durable;
    }

    /// Moves the committed position up to `offset`, or rather to the end of the last whole
    /// batch at or below it (readers are served whole batches), and wakes the readers waiting
    /// (`committed`). Never past what is durable here, never back: an offset at or below the
    /// committed position changes nothing.
    pub fn commit_to(&self, offset: u64) {
        let advanced = {
            let mut inner = self.inner.borrow_mut();
            // The durable end is a batch's end: a standalone log's every commit needs no search.
            let offset = if offset >= inner.durable_end {
                inner.durable_end
            } else {
                inner.batch_end_at_or_below(offset)
            };
            let advanced = offset > inner.committed_end;
            if advanced {
                inner.committed_end = offset;
            }
            inner.check_positions();
            advanced
        };
        if advanced {
            self.committed.notify_all();
        }
    }

    pub fn storage(&self) -> &S {
        &self.storage
    }

    pub fn directories(&self) -> &Rc<Directories> {
        &self.directories
    }

    /// Whether the log never held anything: no segment on disk, nothing written. Opening it
    /// again finds it just the same.
    pub fn is_empty(&self) -> bool {
        let inner = self.inner.borrow();
        inner.segments.is_empty() && inner.durable_end == 0 && inner.staged.is_empty()
    }

    /// Makes a log that never held anything (`is_empty`) start at `offset`: its first segment
    /// is made there and listed in the manifest, so a recovery finds it starting there too, as
    /// it finds a log whose older segments retention removed. For a new replica whose leader's
    /// log no longer starts at 0: nothing below `offset` exists anywhere to copy. Everything
    /// below it counts as committed (there is nothing).
    pub async fn start_at(&self, offset: u64) -> Result<(), LogError> {
        {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            let untouched = inner.segments.is_empty()
                && inner.durable_end == 0
                && inner.assigned_end == 0
                && inner.staged.is_empty()
                && !inner.flushing
                && !inner.truncating;
            if !untouched {
                return Err(LogError::Refused(format!(
                    "a log that holds records cannot start again at offset {offset}"
                )));
            }
            inner.committed_end = offset;
            inner.durable_end = offset;
            inner.written_end = offset;
            inner.assigned_end = offset;
            inner.check_positions();
        }
        if let Err(error) = self.roll(0).await {
            let mut inner = self.inner.borrow_mut();
            if inner.segments.is_empty() {
                inner.committed_end = 0;
                inner.durable_end = 0;
                inner.written_end = 0;
                inner.assigned_end = 0;
            }
            return Err(error);
        }
        Ok(())
    }

    /// Commits whose bytes were built, and whose write was issued, while the commit before them
    /// was being written.
    pub fn commits_built_ahead(&self) -> u64 {
        self.inner.borrow().commits_built_ahead
    }

    /// The oldest offset still stored.
    pub fn start_offset(&self) -> u64 {
        let inner = self.inner.borrow();
        inner.segments.first().map(|segment| segment.base_offset).unwrap_or(inner.committed_end)
    }

    pub fn is_fenced(&self) -> Option<String> {
        self.inner.borrow().fenced.clone()
    }

    /// Resolves after the committed position next moves.
    pub fn committed(&self) -> crate::sync::Notified {
        self.committed.notified()
    }

    /// Resolves after the durable end next moves.
    pub fn durable(&self) -> crate::sync::Notified {
        self.durable.notified()
    }

    /// Forgets which records are committed: a replicated log's own directories cannot tell
    /// which of its records a quorum of replicas holds, so after it is opened (and when its
    /// leader is deposed) nothing past its start counts as committed until a leader says so
    /// (`commit_to`). Readers then see nothing new; a truncation may cut anywhere.
    pub fn forget_commits(&self) {
        let mut inner = self.inner.borrow_mut();
        inner.commit_on_durable = false;
        let start = inner.segments.first().map_or(inner.committed_end, |segment| segment.base_offset);
        inner.committed_end = inner.committed_end.min(start);
        inner.check_positions();
    }

    /// The durable batches from the one holding `offset`, in order, up to `records_bytes_max`
    /// bytes of records (the first is always taken): what a leader sends a follower, committed
    /// or not. Empty when nothing durable holds `offset` (it is at the durable end, or below
    /// the log's start).
    pub async fn hold_durable_from(
        &self,
        offset: u64,
        records_bytes_max: usize,
    ) -> Result<Vec<HeldBatch<S>>, LogError> {
        let mut out: Vec<HeldBatch<S>> = Vec::new();
        let mut next = offset;
        let mut held_bytes = 0usize;
        while next < self.durable_end() && (out.is_empty() || held_bytes < records_bytes_max) {
            let Some(batch) = self.hold_batch_within(next, true).await? else { break };
            if batch.end_offset() <= next {
                break;
            }
            next = batch.end_offset();
            held_bytes = held_bytes.saturating_add(batch.records_bytes());
            out.push(batch);
        }
        Ok(out)
    }

    /// Appends `record_count` unsealed records (see `record::encode_record_unsealed`) and
    /// resolves, after they are durable, with the offset of the first and the count. The
    /// records are copied once more, into the aligned buffer of the commit that takes them.
    pub async fn append(&self, records: Vec<u8>, record_count: u32) -> Result<(u64, u32), LogError> {
        self.append_records(Records::Encoded(records), record_count).await
    }

    /// `append`, for records encoded already or encoded when their commit is built.
    pub async fn append_records(&self, records: Records, record_count: u32) -> Result<(u64, u32), LogError> {
        self.stage(records, record_count, None, None).await
    }

    /// A follower's append: the leader's records from `first_offset` on, in a batch of
    /// `epoch`. Refused (`LogError::Refused`) unless `first_offset` is the log's next offset
    /// (`next_offset`: no gap, no overlap; a follower truncates a tail that disagrees with
    /// its leader first, `truncate_after`) and `epoch` is at least the log's last
    /// (`last_epoch`). Resolves, as `append` does, once the records are durable here.
    pub async fn append_at(
        &self,
        first_offset: u64,
        epoch: u64,
        records: Vec<u8>,
        record_count: u32,
    ) -> Result<(u64, u32), LogError> {
        self.append_from_leader(epoch, first_offset, epoch, records, record_count).await
    }

    /// `append_at`, for records of `epoch` sent by the leader of `leader_epoch`: a new leader
    /// sends its followers the records older leaders wrote, at their own epochs. The promise
    /// (`promise_epoch`) is kept against the leader's epoch, the order of epochs against the
    /// records': refused when `leader_epoch` is older than the promise or `epoch` newer than
    /// `leader_epoch`. Appends made one after the other without awaiting (`sync::join_all`
    /// polls its futures in order) are queued, and commit, in that order.
    pub async fn append_from_leader(
        &self,
        leader_epoch: u64,
        first_offset: u64,
        epoch: u64,
        records: Vec<u8>,
        record_count: u32,
    ) -> Result<(u64, u32), LogError> {
        {
            let inner = self.inner.borrow();
            if epoch > leader_epoch || leader_epoch < inner.promised_epoch {
                return Err(LogError::Refused(format!(
                    "an append of epoch {epoch} from the leader of epoch {leader_epoch}: the log promised to take \
                     none from a leader older than epoch {}",
                    inner.promised_epoch
                )));
            }
        }
        self.stage(Records::Encoded(records), record_count, Some(epoch), Some(first_offset)).await
    }

    /// Queues an append for the flush loop and waits for its commit. `epoch` None: the
    /// leader's (`set_epoch`); `first_offset` None: the flush loop gives the offsets.
    async fn stage(
        &self,
        records: Records,
        record_count: u32,
        epoch: Option<u64>,
        first_offset: Option<u64>,
    ) -> Result<(u64, u32), LogError> {
        let receiver = {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            if inner.closed_for_removal {
                return Err(LogError::Fenced("the log is being removed (`close_for_removal`)".into()));
            }
            let epoch = epoch.unwrap_or(inner.epoch);
            Self::check_append(&inner, epoch, first_offset)?;
            if inner.staged_bytes + records.len() > inner.config.staging_bytes_max {
                return Err(LogError::Overloaded);
            }
            inner.staged_bytes += records.len();
            inner.assigned_end += record_count as u64;
            inner.last_epoch = epoch;
            let (reply, receiver) = oneshot();
            inner.staged.push_back(Staged { records, record_count, epoch, first_offset, reply });
            let start_flushing = !inner.flushing;
            inner.flushing = true;
            drop(inner);
            if start_flushing {
                let log = self.clone();
                crate::runtime::spawn(async move { log.flush_loop().await }).detach();
            }
            receiver
        };
        match receiver.await {
            Some(result) => result,
            None => Err(LogError::Io("the commit task ended without an answer".into())),
        }
    }

    /// Refuses an append of `epoch` (at `first_offset`, for a follower's) that does not follow
    /// the log's last batch, or that comes while the tail is being truncated.
    fn check_append(inner: &LogInner<S>, epoch: u64, first_offset: Option<u64>) -> Result<(), LogError> {
        if inner.truncating {
            return Err(LogError::Refused("the log's tail is being truncated".into()));
        }
        if epoch == record::EPOCH_NONE || epoch < inner.last_epoch {
            return Err(LogError::Refused(format!(
                "an append of epoch {epoch}: the log's last batch is of epoch {}",
                inner.last_epoch
            )));
        }
        if first_offset.is_none() && epoch < inner.promised_epoch {
            return Err(LogError::Refused(format!(
                "an append of epoch {epoch}: the log promised to take none older than epoch {}",
                inner.promised_epoch
            )));
        }
        match first_offset {
            Some(first) if first != inner.assigned_end => Err(LogError::Refused(format!(
                "an append at offset {first}: the log's next offset is {}",
                inner.assigned_end
            ))),
            _ => Ok(()),
        }
    }

    /// How many of the staged appends the next commit takes (at least one; then as many as fit
    /// in `group_commit_bytes_max`), and their bytes.
    fn next_take(inner: &LogInner<S>) -> (usize, usize) {
        let mut take_bytes = 0;
        let mut take = 0;
        let first = inner.staged.front();
        for staged in inner.staged.iter() {
            if take > 0 && take_bytes + staged.records.len() > inner.config.group_commit_bytes_max {
                break;
            }
            // A batch has one epoch, and either offsets the loop gives or a follower's.
            let alike = first.is_some_and(|first| {
                first.epoch == staged.epoch && first.first_offset.is_some() == staged.first_offset.is_some()
            });
            if take > 0 && !alike {
                break;
            }
            take_bytes += staged.records.len();
            take += 1;
        }
        (take, take_bytes)
    }

    async fn flush_loop(&self) {
        // Let the appends that are already runnable queue their records first, so the first
        // commit after an idle period is shared too.
        futures_lite::future::yield_now().await;
        let mut ahead: Option<Ahead<S>> = None;
        loop {
            let (batch, prepared) = match ahead.take() {
                Some((batch, prepared)) => (batch, Some(prepared)),
                None => {
                    let mut inner = self.inner.borrow_mut();
                    if inner.staged.is_empty() {
                        inner.flushing = false;
                        return;
                    }
                    let (take, take_bytes) = Self::next_take(&inner);
                    inner.staged_bytes -= take_bytes;
                    (inner.staged.drain(..take).collect(), None)
                }
            };
            let count: u32 = batch.iter().map(|staged| staged.record_count).sum();
            let (result, next) = self.commit(&batch, count, prepared).await;
            ahead = next;
            match result {
                Ok(mut first) => {
                    // Standalone, what is durable here is committed: one call, so that a
                    // replicated log can make it on its replicas' word instead.
                    let commit_on_durable = self.inner.borrow().commit_on_durable;
                    if commit_on_durable {
                        self.commit_to(first + count as u64);
                    }
                    self.durable.notify_all();
                    for staged in batch {
                        staged.reply.send(Ok((first, staged.record_count)));
                        first += staged.record_count as u64;
                    }
                }
                Err(error) => {
                    // Unless the log is fenced, nothing of it was written (a failure after a
                    // write fences the log): the appends queued behind take its offsets.
                    if !matches!(error, LogError::Fenced(_)) {
                        self.inner.borrow_mut().assigned_end -= count as u64;
                    }
                    for staged in batch {
                        staged.reply.send(Err(error.clone()));
                    }
                    if let LogError::Fenced(_) = error {
                        // (A failed commit hands back the batch it took ahead: `ahead` is None.)
                        let mut inner = self.inner.borrow_mut();
                        for staged in inner.staged.drain(..) {
                            staged.reply.send(Err(error.clone()));
                        }
                        inner.staged_bytes = 0;
                        inner.flushing = false;
                        return;
                    }
                }
            }
        }
    }

    /// Commits `batch` (whose write is already in flight if `prepared` is given), and while its
    /// write is with the disk, takes, builds and issues the next (see `prepare_ahead`).
    async fn commit(
        &self,
        batch: &[Staged],
        count: u32,
        prepared: Option<Prepared<S>>,
    ) -> (Result<u64, LogError>, Option<Ahead<S>>) {
        let mut ahead = None;
        let result = self.commit_taking_ahead(batch, count, prepared, &mut ahead).await;
        if result.is_err() {
            // The batch taken ahead goes back to the front of the queue, in order, to be failed
            // as the log is fenced (every failure once a write is issued fences it), after its
            // own write is over: nothing is left in flight on a fenced log.
            if let Some((taken, prepared)) = ahead.take() {
                let _ = prepared.writing.task.await;
                let mut inner = self.inner.borrow_mut();
                for staged in taken.into_iter().rev() {
                    inner.staged_bytes += staged.records.len();
                    inner.staged.push_front(staged);
                }
            }
        }
        (result, ahead)
    }

    async fn commit_taking_ahead(
        &self,
        batch: &[Staged],
        count: u32,
        prepared: Option<Prepared<S>>,
        ahead: &mut Option<Ahead<S>>,
    ) -> Result<u64, LogError> {
        let records_bytes: usize = batch.iter().map(|staged| staged.records.len()).sum();
        let disk_bytes = record::batch_disk_bytes(records_bytes);
        let (place, buffer, writing) = match prepared {
            Some(prepared) => {
                // Its write is in flight already, at the place the commit before it left, which
                // succeeded (a failure fences the log): nothing to set up.
                let end = self.inner.borrow().end();
                if end != Some(prepared.place) {
                    // Cannot happen (see above); if it did, its bytes are on disk at a place
                    // the log does not continue from, so nothing more is written to this log.
                    let _ = prepared.writing.task.await;
                    return Err(self.fence(format!(
                        "a batch written ahead at byte {} is not at the log's end",
                        prepared.place.position
                    )));
                }
                self.inner.borrow_mut().commits_built_ahead += 1;
                (prepared.place, prepared.buffer, prepared.writing)
            }
            None => {
                // The offsets are given here, as the batch is built, not when the appends were
                // queued: a commit that fails before its write (a full disk) then leaves no
                // gap, and the appends behind it take its offsets. A follower's append came
                // with its offsets, which must still be the log's next.
                let durable_end = self.inner.borrow().durable_end;
                if let Some(first) = batch[0].first_offset.filter(|first| *first != durable_end) {
                    return Err(LogError::Refused(format!(
                        "an append at offset {first}: a failed commit before it left the log's next offset at {durable_end}"
                    )));
                }
                let (place, targets) = self.prepare_commit(disk_bytes).await?;
                let buffer = Rc::new(self.build_batch(batch, count, place, false));
                let writing = spawn_writes(&targets, &buffer, place.position);
                self.note_missed(place, &targets);
                (place, buffer, writing)
            }
        };
        let Place { segment_base, position, base_offset } = place;
        let capacity = self.inner.borrow().segments.last().map_or(0, |segment| segment.capacity);
        let next = Place {
            segment_base,
            position: position + disk_bytes as u64,
            base_offset: base_offset + count as u64,
        };
        let Writing { targets, task, issued } = writing;
        let (writes, taken) =
            futures_lite::future::zip(task, self.prepare_ahead(next, disk_bytes as u64, capacity, &targets))
                .await;
        *ahead = taken;
        self.sync_written(targets, writes, position, disk_bytes).await?;
        crate::metrics::latency::record_commit(issued);
        let newest = batch.iter().map(|staged| staged.records.newest_publish_ms()).max().unwrap_or(0);
        let header = BatchHeader {
            base_offset,
            record_count: count,
            records_bytes: records_bytes as u32,
            epoch: batch[0].epoch,
        };
        self.index_commit(BatchEntry { header, position }, newest, buffer);
        self.start_spare_if_due();
        Ok(base_offset)
    }

    /// Syncs the copies whose write of a commit (`disk_bytes` at `position`) succeeded, and
    /// fences each copy that failed; the commit must be durable on ⌈M/2⌉ of them.
    async fn sync_written(
        &self,
        targets: Vec<(usize, Rc<S::File>)>,
        writes: Vec<std::io::Result<()>>,
        position: u64,
        disk_bytes: usize,
    ) -> Result<(), LogError> {
        // A copy fenced while this write was in flight (by the commit before it) no longer
        // counts, whatever its write did.
        let writable = self.writable_copies();
        let mut written = Vec::with_capacity(targets.len());
        for ((copy, file), result) in targets.into_iter().zip(writes) {
            if !writable.contains(&copy) {
                continue;
            }
            match result {
                Ok(()) => written.push((copy, file)),
                Err(error) => self
                    .fence_copy(copy, &format!("write of {disk_bytes} bytes at {position} failed: {error}")),
            }
        }
        // A file opened with O_DSYNC is durable as its write completes: no fdatasync follows.
        let syncs = join_all(
            written
                .iter()
                .map(|(copy, file)| async move {
                    if file.writes_are_durable() {
                        Ok(())
                    } else {
                        let started = crate::runtime::now();
                        let synced = file.sync_data().await;
                        let took = crate::runtime::now().saturating_duration_since(started);
                        crate::metrics::shard::record_sync(*copy, took);
                        synced
                    }
                })
                .collect(),
        )
        .await;
        let mut durable = 0;
        for ((copy, _), result) in written.iter().zip(syncs) {
            match result {
                Ok(()) => durable += 1,
                Err(error) => {
                    self.fence_copy(*copy, &format!("fdatasync after writing at {position} failed: {error}"))
                }
            }
        }
        let quorum = self.directories.quorum();
        if durable < quorum {
            return Err(self.fence(format!(
                "the commit at byte {position} is durable in {durable} data directories; {quorum} are needed"
            )));
        }
        Ok(())
    }

    /// Records a durable commit of `entry` in the index and the tail cache.
    fn index_commit(&self, entry: BatchEntry, newest: u64, buffer: Rc<S::Buffer>) {
        let (base_offset, disk_bytes) = (entry.header.base_offset, entry.header.disk_bytes());
        let mut inner = self.inner.borrow_mut();
        let keep_files_open = inner.config.keep_files_open;
        let segment = inner.segments.last_mut().unwrap();
        segment.newest_publish_ms = segment.newest_publish_ms.max(newest);
        segment.batches.push(entry);
        segment.write_position += disk_bytes as u64;
        if !keep_files_open {
            segment.close_files();
        }
        inner.durable_end = entry.header.end_offset();
        inner.idle_sweeps = 0;
        if inner.config.tail_cache_bytes_max > 0 {
            // Commits complete in order, so the cache stays sorted by base offset for
            // `hold_batch_at`'s search.
            debug_assert!(inner.tail_cache.back().is_none_or(|(newest, _)| *newest < base_offset));
            inner.tail_cache.push_back((base_offset, buffer));
            inner.tail_cache_bytes += disk_bytes;
            if let Some(budget) = &inner.config.tail_cache_budget {
                budget.charge(disk_bytes);
            }
        }
        loop {
            let over_budget = inner.config.tail_cache_budget.as_ref().is_some_and(|budget| budget.over());
            // The newest batch stays unless the shard's budget is spent: a reader that keeps up
            // reads it from memory.
            let keep = if over_budget { 0 } else { 1 };
            if inner.tail_cache.len() <= keep
                || (!over_budget && inner.tail_cache_bytes <= inner.config.tail_cache_bytes_max)
            {
                break;
            }
            inner.drop_oldest_cached();
        }
        inner.check_positions();
    }

    /// Makes room for a batch of `disk_bytes` (a new segment if the active one is full) and
    /// opens its files: the batch's place, and the copies (index, file) to write it to, as
    /// many as a quorum at least.
    async fn prepare_commit(
        &self,
        disk_bytes: usize,
    ) -> Result<(Place, Vec<(usize, Rc<S::File>)>), LogError> {
        let needs_segment = {
            let inner = self.inner.borrow();
            match inner.segments.last() {
                Some(segment) => segment.write_position + disk_bytes as u64 > segment.capacity,
                None => true,
            }
        };
        if needs_segment {
            self.roll(disk_bytes as u64).await?;
        }
        let last = self.inner.borrow().segments.len() - 1;
        self.ensure_open(last).await?;
        let writable = self.writable_copies();
        let (targets, place) = {
            let inner = self.inner.borrow();
            let segment = inner.segments.last().unwrap();
            let targets: Vec<(usize, Rc<S::File>)> = writable
                .iter()
                .filter_map(|copy| segment.files[*copy].clone().map(|file| (*copy, file)))
                .collect();
            (targets, inner.end().unwrap())
        };
        let quorum = self.directories.quorum();
        if targets.len() < quorum {
            return Err(self.fence(format!(
                "only {} of {} data directories are healthy; {quorum} are needed to acknowledge",
                targets.len(),
                self.directories.count()
            )));
        }
        Ok((place, targets))
    }

    /// A batch's bytes: its header, its records copied from the appends (or encoded there) and
    /// sealed with their offsets and checksums, and zeros to the end of its last block.
    fn build_batch(&self, batch: &[Staged], count: u32, place: Place, written_ahead: bool) -> S::Buffer {
        let Place { segment_base, position, base_offset } = place;
        let records_bytes: usize = batch.iter().map(|staged| staged.records.len()).sum();
        let log_id = {
            let mut inner = self.inner.borrow_mut();
            inner.written_end = base_offset + count as u64;
            inner.log_id
        };
        let mut buffer = self.storage.alloc_buffer(record::batch_disk_bytes(records_bytes));
        let bytes = buffer.bytes_mut();
        let mut at = record::BATCH_HEADER_BYTES;
        for staged in batch {
            staged.records.write_into(&mut bytes[at..at + staged.records.len()]);
            at += staged.records.len();
        }
        let records_end = record::BATCH_HEADER_BYTES + records_bytes;
        let sealed =
            record::seal_records(log_id, &mut bytes[record::BATCH_HEADER_BYTES..records_end], base_offset);
        debug_assert_eq!(sealed, count, "the appends' records and their counts disagree");
        bytes[records_end..].fill(0);
        let flags = if written_ahead { record::FLAG_WRITTEN_AHEAD } else { 0 };
        let header = BatchHeader {
            base_offset,
            record_count: count,
            records_bytes: records_bytes as u32,
            epoch: batch[0].epoch,
        };
        record::encode_batch_header_flagged(bytes, (log_id, segment_base, position), &header, flags);
        buffer
    }

    /// While a commit's write is with the disk, takes the appends waiting, builds their batch
    /// for the place that commit leaves (`next`, in a segment of `capacity` bytes) and issues
    /// its write to the same `targets`: the copy and the checksums of the next commit are not
    /// between two writes, and an append that arrives during a write waits for its own write
    /// only, not for the one in flight too (the publish latency's tail shrinks; see
    /// benches/README.md). At most two writes of a log are in
    /// flight: the one after is taken when this commit is done. Its appends are acknowledged
    /// only after this commit is durable too (`flush_loop` completes commits in order), and
    /// any failure once this write is issued fences the log, so a batch that landed beyond a
    /// hole is never acknowledged. Not when the batch would need a new segment (that takes I/O
    /// of its own).
    async fn prepare_ahead(
        &self,
        next: Place,
        in_flight_bytes: u64,
        capacity: u64,
        targets: &[(usize, Rc<S::File>)],
    ) -> Option<Ahead<S>> {
        let waiting = |inner: &LogInner<S>| inner.staged_bytes > 0;
        // Behind a commit larger than a full group commit (one request above it) nothing is
        // written ahead, so that recovery knows how far past a hole to look for such a batch.
        if !waiting(&self.inner.borrow())
            || in_flight_bytes > self.inner.borrow().config.written_ahead_distance_max()
        {
            return None;
        }
        // glommio hands queued I/O to the kernel only once nothing on the shard is runnable;
        // a timer takes this task off the run queue so that the commit's write is submitted
        // before the copy starts.
        crate::runtime::sleep(std::time::Duration::from_micros(1)).await;
        let batch: Vec<Staged> = {
            let mut inner = self.inner.borrow_mut();
            // A copy that joined since `targets` were chosen takes the next write: it is
            // chosen afresh by a commit of its own.
            if inner.fenced.is_some() || !waiting(&inner) || inner.joining_missed_by(targets) != 0 {
                return None;
            }
            let (take, take_bytes) = Self::next_take(&inner);
            if next.position + record::batch_disk_bytes(take_bytes) as u64 > capacity {
                return None;
            }
            // A follower's append that no longer continues the log is refused by a commit of
            // its own (`commit_taking_ahead`).
            if inner
                .staged
                .front()
                .and_then(|staged| staged.first_offset)
                .is_some_and(|first| first != next.base_offset)
            {
                return None;
            }
            inner.staged_bytes -= take_bytes;
            inner.staged.drain(..take).collect()
        };
        let count: u32 = batch.iter().map(|staged| staged.record_count).sum();
        let buffer = Rc::new(self.build_batch(&batch, count, next, true));
        let writing = spawn_writes(targets, &buffer, next.position);
        Some((batch, Prepared { place: next, buffer, writing }))
    }

    /// Starts zero-filling the next segment once the active one is half full (see
    /// `LogConfig::prewrite`).
    fn start_spare_if_due(&self) {
        let (capacity, place) = {
            let mut inner = self.inner.borrow_mut();
            if !inner.config.prewrite || !inner.config.keep_files_open || inner.spare.is_some() {
                return;
            }
            // A recycled file of the largest size serves any roll the spare would.
            if inner.recycled.is_some() {
                return;
            }
            let Some(segment) = inner.segments.last() else { return };
            if segment.write_position * 2 < segment.capacity || inner.spare_started_for == segment.base_offset
            {
                return;
            }
            let capacity = (segment.capacity * 2).min(inner.config.segment_bytes_max).max(segment.capacity);
            // Without a place now, a later commit into this segment tries again.
            let Some(place) = ShardPlace::spare() else { return };
            inner.spare_started_for = segment.base_offset;
            (capacity, place)
        };
        let writable = self.writable_copies();
        // Near a full disk a spare would take the room the next segments of this and other
        // logs need: then this log's roll sizes its segment by the space there is instead.
        if self.free_bytes_for_segment(&writable) / KEPT_FILE_FREE_BYTES_FACTOR < capacity {
            return;
        }
        let paths: Vec<Option<PathBuf>> = (0..self.directories.count())
            .map(|copy| writable.contains(&copy).then(|| self.folder(copy).join(SPARE_NAME)))
            .collect();
        let stop = Rc::new(std::cell::Cell::new(false));
        let log = Rc::downgrade(&self.inner);
        // Zeros go to the disk only while the log is not bound by it: with a quarter of a group
        // commit or more waiting, the disk's time is the log's own, and its spare is then just
        // allocated ahead, off the roll's path. (A dropped log drops, and so cancels, the task.)
        let busy = move || {
            log.upgrade().is_none_or(|inner| {
                let inner = inner.borrow();
                inner.staged_bytes * 4 >= inner.config.group_commit_bytes_max
            })
        };
        let task =
            crate::runtime::spawn(prewrite_spare(self.storage.clone(), paths, capacity, stop.clone(), busy));
        self.inner.borrow_mut().spare = Some(Box::new(Spare { capacity, stop, task, _place: place }));
    }

    /// Stops the zero-filling of the spare, if any, and hands over its capacity and files.
    async fn take_spare(&self) -> Option<(u64, Vec<Option<Rc<S::File>>>)> {
        let spare = self.inner.borrow_mut().spare.take()?;
        spare.stop.set(true);
        // The write in flight ends before the task does: nothing lands in the file after this.
        let files = spare.task.await;
        Some((spare.capacity, files))
    }

    /// Whether the log holds its reserve segment (`LogConfig::reserve`) in every copy that
    /// takes writes.
    pub fn has_reserve(&self) -> bool {
        let writable = self.writable_copies();
        self.inner
            .borrow()
            .reserve
            .as_ref()
            .is_some_and(|reserve| writable.iter().all(|copy| reserve.copies & (1 << copy) != 0))
    }

    /// Refuses appends from now on and waits until the commits in flight are done, so that the
    /// log's files can be removed: a commit that met a vanished file would fail its write, and a
    /// failed write fences the data directory for every log of the shard. Segments can still be
    /// removed (`remove_oldest`), and nothing is fenced.
    pub async fn close_for_removal(&self) {
        self.inner.borrow_mut().closed_for_removal = true;
        while self.inner.borrow().flushing || self.inner.borrow().manifest_writing {
            crate::runtime::sleep(REMOVAL_WAIT).await;
        }
    }

    /// Removes every batch holding offsets at or above `end`, in every data directory, so
    /// that the log's next offset is `end`: a follower's tail that its new leader never
    /// committed. `end` must be the end of a batch, at or above the committed position
    /// (`LogError::Refused` otherwise: committed records are never removed) and at or below
    /// the durable one. Appends queued and not yet taken by a commit fail; the commits in
    /// flight are waited for, and what they make durable past `end` goes too. Durable in
    /// steps a crash may cut at any point: the manifest saying the log ends at `end`
    /// (`Manifest::truncated_end`, which recovery honours) is durable before anything is
    /// zeroed, the removed batches are zeroed and synced and the later segments' files
    /// removed, and only then is the manifest without the mark written and appends taken
    /// again. Readers never held the removed batches: they see committed ones only.
    pub async fn truncate_after(&self, end: u64) -> Result<(), LogError> {
        {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            if inner.truncating || inner.closed_for_removal {
                return Err(LogError::Refused("the log is being truncated or removed".into()));
            }
            if end < inner.committed_end {
                return Err(LogError::Refused(format!(
                    "a truncation at offset {end}: offsets up to {} are committed",
                    inner.committed_end
                )));
            }
            inner.truncating = true;
            let refused = LogError::Refused(format!("the log's tail was truncated at offset {end}"));
            for staged in std::mem::take(&mut inner.staged) {
                inner.assigned_end -= staged.record_count as u64;
                staged.reply.send(Err(refused.clone()));
            }
            inner.staged_bytes = 0;
        }
        while self.inner.borrow().flushing {
            crate::runtime::sleep(REMOVAL_WAIT).await;
        }
        // Committed meanwhile, past the cut (a commit point taken while the writes in flight
        // ended): refused as at the start, or a committed record would go.
        let committed_end = self.inner.borrow().committed_end;
        if end < committed_end {
            self.inner.borrow_mut().truncating = false;
            return Err(LogError::Refused(format!(
                "a truncation at offset {end}: offsets up to {committed_end} were committed while it waited"
            )));
        }
        let result = self.truncate_durable(end).await;
        self.inner.borrow_mut().truncating = false;
        result
    }

    /// `truncate_after` once nothing is in flight.
    async fn truncate_durable(&self, end: u64) -> Result<(), LogError> {
        let (cut_base, cut, removed) = {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            if end > inner.durable_end || inner.batch_end_at_or_below(end) != end {
                return Err(LogError::Refused(format!(
                    "a truncation at offset {end}: not the end of a batch at or below the durable end {}",
                    inner.durable_end
                )));
            }
            if end == inner.durable_end {
                return Ok(());
            }
            // The segment holding the cut: the last one starting at or below it.
            let segment_index = inner.segments.partition_point(|segment| segment.base_offset <= end) - 1;
            let segment = &inner.segments[segment_index];
            let kept = segment.batches.partition_point(|entry| entry.header.end_offset() <= end);
            let cut = segment.batches.get(kept).map_or(segment.write_position, |entry| entry.position);
            let cut_base = segment.base_offset;
            let removed: Vec<Segment<S>> = inner.segments.drain(segment_index + 1..).collect();
            inner.truncated_end = Some(end);
            (cut_base, (kept, cut), removed)
        };
        // 1. The mark: from here on a recovery discards what follows `end`.
        if let Err(error) = self.write_manifest().await {
            let mut inner = self.inner.borrow_mut();
            inner.segments.extend(removed);
            inner.truncated_end = None;
            return Err(error);
        }
        // Found again by its base: retention may have removed older segments meanwhile (never
        // the last one, which this is).
        let (segment_index, written_to) = {
            let inner = self.inner.borrow();
            let index = inner.segments.iter().position(|segment| segment.base_offset == cut_base).unwrap();
            (index, inner.segments[index].write_position)
        };
        self.forget_after(segment_index, cut, end);
        // 2. Zeros over the removed batches, and the later segments' files removed.
        self.zero_removed(segment_index, cut.1, written_to).await?;
        self.remove_segment_files(removed).await;
        // 3. The mark goes: the log takes appends at `end`.
        self.inner.borrow_mut().truncated_end = None;
        self.write_manifest().await
    }

    /// Drops from memory every batch from `kept` on in segment `segment_index` (the cut at
    /// byte `cut.1`), and the cached batches past `end`; the positions all come back to `end`.
    fn forget_after(&self, segment_index: usize, cut: (usize, u64), end: u64) {
        let mut inner = self.inner.borrow_mut();
        let segment = &mut inner.segments[segment_index];
        segment.batches.truncate(cut.0);
        segment.write_position = cut.1;
        while inner.tail_cache.back().is_some_and(|(base, _)| *base >= end) {
            let (_, old) = inner.tail_cache.pop_back().unwrap();
            let bytes = old.bytes().len();
            inner.tail_cache_bytes -= bytes;
            if let Some(budget) = &inner.config.tail_cache_budget {
                budget.refund(bytes);
            }
        }
        inner.drop_read_ahead();
        inner.durable_end = end;
        inner.written_end = end;
        inner.assigned_end = end;
        inner.last_epoch = inner.last_indexed_epoch();
        inner.check_positions();
    }

    /// Zeroes bytes `from..to` of a segment in every copy holding it, and syncs them. A copy
    /// that fails is fenced, and so is the log: the mark stays in the manifest, and the next
    /// recovery zeroes them again.
    async fn zero_removed(&self, segment_index: usize, from: u64, to: u64) -> Result<(), LogError> {
        if from >= to {
            return Ok(());
        }
        self.ensure_open(segment_index).await?;
        let files = self.inner.borrow().segments[segment_index].files.clone();
        for (copy, file) in files.into_iter().enumerate() {
            let Some(file) = file else { continue };
            let zeroed = async {
                zero_range(&self.storage, &*file, from, to).await?;
                file.sync_data().await.map_err(|e| LogError::Io(io_text(&e)))
            }
            .await;
            if let Err(error) = zeroed {
                self.fence_copy(copy, &format!("zeroing a truncated tail: {error}"));
                return Err(self.fence(format!("the truncated tail could not be zeroed: {error}")));
            }
        }
        Ok(())
    }

    /// Removes the files of segments no longer listed, in every copy, and syncs the folders.
    async fn remove_segment_files(&self, removed: Vec<Segment<S>>) {
        if removed.is_empty() {
            return;
        }
        for copy in 0..self.directories.count() {
            let folder = self.folder(copy);
            for segment in &removed {
                let _ = self.storage.remove_file(&folder.join(segment_name(segment.base_offset)));
            }
            if !self.directories.is_fenced(copy) {
                let _ = self.storage.sync_dir(&folder).await;
            }
        }
    }

    /// Whether a reserve is being made in the log's folders right now (`retake_reserve`).
    pub fn is_reserving(&self) -> bool {
        self.inner.borrow().reserving
    }

    /// Makes the reserve segment again where a roll on a full disk took it, or where it is
    /// missing (`LogConfig::reserve`), and adopts one made while the log was closed. Called
    /// once space may have come back (after segments were deleted); on a disk still full it
    /// fails with `NoSpace` and the log goes on without one.
    pub async fn retake_reserve(&self) -> Result<(), LogError> {
        let (bytes, relative) = {
            let inner = self.inner.borrow();
            if !inner.config.reserve || inner.reserving || inner.fenced.is_some() {
                return Ok(());
            }
            (inner.config.segment_bytes_initial, inner.relative.clone())
        };
        if self.has_reserve() {
            return Ok(());
        }
        self.inner.borrow_mut().reserving = true;
        let made = make_reserve(&self.storage, &self.directories, &relative, bytes).await;
        let found = find_reserve(&self.storage, &self.directories, &relative).await;
        let mut inner = self.inner.borrow_mut();
        inner.reserve = found.map(Box::new);
        inner.reserving = false;
        made
    }

    /// Bytes a new segment may take in the copies given: the free space of the one with the
    /// ⌈M/2⌉-th most, since a segment needs only a quorum of copies (a full one is fenced).
    /// Where the storage cannot tell, as much as anyone asks.
    fn free_bytes_for_segment(&self, copies: &[usize]) -> u64 {
        let mut free: Vec<u64> = copies
            .iter()
            .map(|copy| self.storage.free_bytes(&self.folder(*copy)).unwrap_or(u64::MAX))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        free.get(self.directories.quorum().saturating_sub(1)).copied().unwrap_or(u64::MAX)
    }

    /// Stops and removes the spare and the recycled file, if any: before the log's files are
    /// deleted.
    pub async fn discard_spares(&self) {
        if let Some((capacity, files)) = self.take_spare().await {
            self.remove_kept_files(SPARE_NAME, files, capacity);
        }
        let recycled = self.inner.borrow_mut().recycled.take();
        if let Some(recycled) = recycled {
            let Recycled { files, capacity, .. } = *recycled;
            self.remove_kept_files(RECYCLE_NAME, files, capacity);
        }
    }

    /// Unlinks a spare's or a recycled file's name (`name`) in each copy at once, so that the
    /// next one can take it, then shrinks the files still open in steps in the background
    /// before they close, as deleted segments are: a whole segment freed at once would make a
    /// trimming disk stall every write behind it.
    fn remove_kept_files(&self, name: &str, files: Vec<Option<Rc<S::File>>>, capacity: u64) {
        let mut open = Vec::new();
        for (copy, file) in files.into_iter().enumerate() {
            if let Some(file) = file {
                let _ = self.storage.remove_file(&self.folder(copy).join(name));
                open.push(file);
            }
        }
        if !open.is_empty() {
            crate::runtime::spawn(async move {
                for file in open {
                    shrink_gradually(Some(file), capacity).await;
                }
            })
            .detach();
        }
    }

    /// Creates the next segment in every writable copy, then lists it in the manifest. Order
    /// matters for crash safety: the file is allocated and synced, and its directory entry and
    /// the manifest made durable, before anything in it is acknowledged.
    async fn roll(&self, at_least_bytes: u64) -> Result<(), LogError> {
        let copies = self.writable_copies();
        let at_least_bytes = record::align_up(at_least_bytes as usize, BLOCK_BYTES) as u64;
        let free_bytes = self.free_bytes_for_segment(&copies);
        let (mut capacity, base_offset) = {
            let inner = self.inner.borrow();
            let previous = inner.segments.last().map(|segment| segment.capacity).unwrap_or(0);
            let next = if previous == 0 {
                inner.config.segment_bytes_initial
            } else {
                (previous * 2).min(inner.config.segment_bytes_max)
            };
            // Doubling is for a disk with room: on a nearly full one the next segment is what
            // fits, down to the initial size (see `segment_bytes_to_fit`).
            let next = segment_bytes_to_fit(next, free_bytes, inner.config.segment_bytes_initial);
            (next.max(at_least_bytes), inner.durable_end)
        };
        // The reserve (`LogConfig::reserve`) is for a disk without room for this segment: a
        // roll that the free space says cannot be allocated takes it at once, and one whose
        // allocation fails with ENOSPC takes it then (below).
        let reserve_fits = |reserve: &Option<Box<Reserve>>| {
            reserve.as_ref().filter(|reserve| reserve.capacity >= at_least_bytes).map(|reserve| **reserve)
        };
        let mut from_reserve = reserve_fits(&self.inner.borrow().reserve).filter(|_| free_bytes < capacity);
        let (renamed, recycled) = self.take_kept_file(&copies, &mut capacity).await;
        // A file renamed into place (a spare, a kept file) is allocated already: the reserve
        // stays for a later roll.
        if renamed.is_some() {
            from_reserve = None;
        }
        // A log's first segment is listed by no manifest: recovery takes a log that has none to
        // be that segment alone (see `open`). So the first roll, a topic's first publish,
        // creates one file instead of two and writes no manifest: one sync less of four. The
        // first manifest comes with the second segment.
        let first_segment = {
            let inner = self.inner.borrow();
            inner.segments.is_empty() && inner.manifest_sequence == 0 && base_offset == 0
        };
        let quorum = self.directories.quorum();
        let (files, created, full, failed) = loop {
            let reserve_copies = from_reserve.map_or(0, |reserve| reserve.copies);
            if let Some(reserve) = from_reserve {
                capacity = reserve.capacity;
            }
            let creation = Creation { base_offset, capacity, first_segment, reserve_copies };
            let (files, created, full, failed) = self.create_in_copies(&copies, &renamed, creation).await;
            if reserve_copies != 0 {
                // Taken, or removed by a rename that failed: either way it is gone.
                let mut inner = self.inner.borrow_mut();
                if let Some(reserve) = inner.reserve.as_mut() {
                    reserve.copies &= !reserve_copies;
                }
                if inner.reserve.as_ref().is_some_and(|reserve| reserve.copies == 0) {
                    inner.reserve = None;
                }
            }
            // The disk has no room after all: the reserve, if there is one, instead.
            let retry = created < quorum
                && renamed.is_none()
                && from_reserve.is_none()
                && failed.is_empty()
                && !full.is_empty();
            if let Some(reserve) = reserve_fits(&self.inner.borrow().reserve).filter(|_| retry) {
                for (copy, file) in files.iter().enumerate() {
                    if file.is_some() {
                        let _ = self.storage.remove_file(&self.folder(copy).join(segment_name(base_offset)));
                    }
                }
                from_reserve = Some(reserve);
                continue;
            }
            break (files, created, full, failed);
        };
        debug_assert!(
            capacity >= at_least_bytes,
            "a segment of {capacity} bytes for a batch of {at_least_bytes}"
        );
        self.adopt_segment(base_offset, capacity, recycled, (files, created, full, failed))?;
        if first_segment {
            return Ok(());
        }
        if let Err(error) = self.write_manifest().await {
            self.inner.borrow_mut().segments.pop();
            return Err(error);
        }
        Ok(())
    }

    /// The file a roll renames into place instead of creating one, if it has one that fits
    /// `capacity` (which becomes the file's) in every copy in `copies`: the recycled file
    /// (`LogConfig::recycle`), or else the spare (`LogConfig::prewrite`). Returns it, by copy,
    /// with the name it has, and whether it is the recycled one. What does not fit goes.
    async fn take_kept_file(
        &self,
        copies: &[usize],
        capacity: &mut u64,
    ) -> (Option<(&'static str, CopyFiles<S>)>, bool) {
        let mut renamed: Option<(&'static str, CopyFiles<S>)> = None;
        let mut recycled = false;
        // A recycled file goes first: its blocks are written ones, where a spare's are only
        // as far as its zero-filling got. One large enough and in every copy that takes writes
        // is renamed into place; one too small waits for a roll it fits.
        let kept = self.inner.borrow_mut().recycled.take();
        if let Some(kept) = kept {
            if kept.capacity < *capacity {
                self.inner.borrow_mut().recycled = Some(kept);
            } else if copies.iter().all(|copy| kept.files[*copy].is_some()) {
                *capacity = kept.capacity;
                let Recycled { files, .. } = *kept;
                let fenced: Vec<Option<Rc<S::File>>> = (0..files.len())
                    .map(|copy| if copies.contains(&copy) { None } else { files[copy].clone() })
                    .collect();
                self.remove_kept_files(RECYCLE_NAME, fenced, *capacity);
                let files = (0..files.len())
                    .map(|copy| if copies.contains(&copy) { files[copy].clone() } else { None })
                    .collect();
                renamed = Some((RECYCLE_NAME, files));
                recycled = true;
                // Its spare, if one was started, is not needed.
                if let Some((spare_capacity, files)) = self.take_spare().await {
                    self.remove_kept_files(SPARE_NAME, files, spare_capacity);
                }
            } else {
                let Recycled { files, capacity, .. } = *kept;
                self.remove_kept_files(RECYCLE_NAME, files, capacity);
            }
        }
        // A spare prepared for this roll is renamed into place if it is large enough and in
        // every copy that takes writes; otherwise it goes and the segment is created as usual.
        let spare = if renamed.is_none() { self.take_spare().await } else { None };
        if let Some((spare_capacity, mut files)) = spare {
            if spare_capacity >= *capacity && copies.iter().all(|copy| files[*copy].is_some()) {
                *capacity = spare_capacity;
                // A copy fenced since the spare was started takes no segment.
                let fenced: Vec<Option<Rc<S::File>>> = (0..files.len())
                    .map(|copy| if copies.contains(&copy) { None } else { files[copy].take() })
                    .collect();
                self.remove_kept_files(SPARE_NAME, fenced, spare_capacity);
                renamed = Some((SPARE_NAME, files));
            } else {
                self.remove_kept_files(SPARE_NAME, files, spare_capacity);
            }
        }
        (renamed, recycled)
    }

    /// Creates segment `creation.base_offset` in every copy in `copies`: renamed from `renamed`
    /// or the reserve (`creation.reserve_copies`) where given, else made and allocated. Returns
    /// the files by copy, how many were made, and the copies that failed for want of space or
    /// otherwise.
    async fn create_in_copies(
        &self,
        copies: &[usize],
        renamed: &Option<(&'static str, CopyFiles<S>)>,
        creation: Creation,
    ) -> Created<S> {
        let Creation { base_offset, capacity, first_segment, reserve_copies } = creation;
        let creations = copies.iter().map(|copy| {
            let folder = self.folder(*copy);
            let from: Option<(&'static str, Option<Rc<S::File>>)> = match renamed {
                Some((name, files)) => files[*copy].clone().map(|file| (*name, Some(file))),
                None if reserve_copies & (1 << copy) != 0 => Some((RESERVE_NAME, None)),
                None => None,
            };
            async move {
                let path = folder.join(segment_name(base_offset));
                if let Some((name, kept)) = from {
                    // Allocated and synced already (a spare, zero-filled as far as it got, a
                    // deleted segment's file, or the reserve): only its name must be made
                    // durable. It is opened again as every segment is (a spare's zeros were
                    // written without O_DSYNC).
                    let renamed = async {
                        self.storage.rename(&folder.join(name), &path)?;
                        self.storage.sync_dir(&folder).await?;
                        drop(kept);
                        self.storage.open(&path, false).await
                    }
                    .await;
                    return match renamed {
                        Ok(file) => Ok(Rc::new(file)),
                        Err(error) => {
                            let _ = self.storage.remove_file(&path);
                            let _ = self.storage.remove_file(&folder.join(name));
                            Err(error)
                        }
                    };
                }
                let file = Rc::new(self.storage.open(&path, true).await?);
                let prepared = async {
                    // Both manifest slots are made with the second segment, each with its
                    // block allocated, so that no later manifest write needs disk space: a
                    // deletion of acknowledged segments on a full disk writes one.
                    if !first_segment {
                        for slot in MANIFEST_SLOTS {
                            let slot = folder.join(slot);
                            if !self.storage.exists(&slot) {
                                let slot = self.storage.open(&slot, true).await?;
                                slot.allocate(BLOCK_BYTES as u64).await?;
                            }
                        }
                    }
                    file.allocate(capacity).await?;
                    file.sync_data().await?;
                    self.storage.sync_dir(&folder).await
                }
                .await;
                if let Err(error) = prepared {
                    let _ = self.storage.remove_file(&path);
                    return Err(error);
                }
                // Space allocated: a directory logged full has room again.
                directories::note_room(self.directories.path(*copy));
                Ok(file)
            }
        });
        let results = join_all(creations.collect()).await;
        let mut files: Vec<Option<Rc<S::File>>> = vec![None; self.directories.count()];
        let mut created = 0;
        let mut full = Vec::new();
        let mut failed = Vec::new();
        for (copy, result) in copies.iter().zip(results) {
            match result {
                Ok(file) => {
                    if !file.direct_io() {
                        self.warn_buffered(*copy);
                    }
                    files[*copy] = Some(file);
                    created += 1;
                }
                Err(error) if is_no_space(&error) => full.push((*copy, error)),
                Err(error) => failed.push((*copy, error)),
            }
        }
        (files, created, full, failed)
    }

    /// Takes a segment made by `create_in_copies` as the log's active one (fencing the copies
    /// that failed), or, made in fewer than ⌈M/2⌉ copies, removes it and fails the roll.
    fn adopt_segment(
        &self,
        base_offset: u64,
        capacity: u64,
        recycled: bool,
        (files, created, full, failed): Created<S>,
    ) -> Result<(), LogError> {
        let quorum = self.directories.quorum();
        for (copy, error) in &failed {
            self.fence_copy(*copy, &format!("creating segment {}: {error}", segment_name(base_offset)));
        }
        if created < quorum {
            // Nothing was written into the new segment: remove what was created so a retry
            // starts clean.
            for (copy, file) in files.iter().enumerate() {
                if file.is_some() {
                    let _ = self.storage.remove_file(&self.folder(copy).join(segment_name(base_offset)));
                }
            }
            for (copy, error) in &full {
                if is_out_of_space(error) {
                    directories::note_full(self.directories.path(*copy), &error.to_string());
                }
            }
            if !full.is_empty() {
                let (copy, error) = &full[0];
                return Err(LogError::NoSpace(format!(
                    "allocating {capacity} bytes for a segment in {}: {error}",
                    self.directories.path(*copy).display()
                )));
            }
            return Err(
                self.fence(format!("a new segment could be created in only {created} data directories"))
            );
        }
        for (copy, error) in &full {
            // A full directory is fenced so the others carry on; a process-wide shortage (open
            // files, memory) is no fault of the directory, so its copy just misses this segment
            // and is marked stale for a resync.
            if is_out_of_space(error) {
                self.fence_copy(
                    *copy,
                    &format!("no space for segment {}: {error}", segment_name(base_offset)),
                );
            } else {
                // The other copies go on without this one for this segment: it missed writes.
                self.inner.borrow_mut().mark_stale(*copy);
            }
        }
        let mut inner = self.inner.borrow_mut();
        inner.segments.push(Segment {
            base_offset,
            newest_publish_ms: 0,
            capacity,
            write_position: 0,
            recycled,
            batches: Vec::new(),
            files,
            closed: None,
        });
        inner.rolled = inner.config.recycle;
        Ok(())
    }

    /// Warns that a copy's files do not take O_DIRECT: once per data directory and process,
    /// since every log there finds the same (`warned_buffered` spares this log the lock after).
    fn warn_buffered(&self, copy: usize) {
        if std::mem::replace(&mut self.inner.borrow_mut().warned_buffered, true) {
            return;
        }
        warn_buffered_directory(self.directories.path(copy));
    }

    /// Reads records from `from` on, at most `max_records` of them and (beyond the first) at
    /// most `max_bytes` of data. Every record returned passed its checksum.
    pub async fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, LogError> {
        self.read_within(from, max_records, max_bytes, false).await
    }

    /// `read`, up to the durable end instead of the committed one when `durable`.
    async fn read_within(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        durable: bool,
    ) -> Result<Vec<StoredRecord>, LogError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut offset = from.max(self.start_offset());
        let visible_end = || if durable { self.durable_end() } else { self.end_offset() };
        while out.len() < max_records && offset < visible_end() {
            let lowest = offset;
            let batch = self.read_batch_at(offset, &|wanted| wanted >= lowest, durable).await?;
            if batch.end <= offset {
                break;
            }
            for record in batch.records {
                if out.len() >= max_records || (!out.is_empty() && bytes + record.data.len() > max_bytes) {
                    return Ok(out);
                }
                bytes += record.data.len();
                out.push(record);
            }
            offset = batch.end;
        }
        Ok(out)
    }

    /// Every record from `from` to the end, as `read` returns them, but read in extents of up
    /// to `READ_AHEAD_BYTES` even where the log does not read ahead (`LogConfig::read_ahead`),
    /// and with the extents dropped after. For the replays at start-up (the catalog, a topic's
    /// journal), which read once, in order: batch by batch, a large catalog is thousands of
    /// 4 KiB reads (see benches/README.md). The log's
    /// configuration reads ahead for the replay's duration, so it is meant for a log nothing
    /// else reads yet (both callers run it before the log is served). Durable records count,
    /// committed or not: a replicated topic's new leader replays its journal before it has
    /// committed what it holds.
    pub async fn read_all(&self, from: u64) -> Result<Vec<StoredRecord>, LogError> {
        let configured = self.inner.borrow().config.clone();
        if !configured.read_ahead {
            self.inner.borrow_mut().config = Rc::new(LogConfig { read_ahead: true, ..(*configured).clone() });
        }
        let result = self.read_within(from, usize::MAX, usize::MAX, true).await;
        if !configured.read_ahead {
            let mut inner = self.inner.borrow_mut();
            inner.config = configured;
            inner.drop_read_ahead();
        }
        result
    }

    /// Reads the records at the given offsets (sorted), skipping offsets no longer stored. Only
    /// those records are copied out of their batches; the rest are validated in place.
    pub async fn read_offsets(&self, offsets: &[u64]) -> Result<Vec<StoredRecord>, LogError> {
        let mut out = Vec::with_capacity(offsets.len());
        let wanted = span(offsets);
        for batch in self.hold_offsets(offsets, usize::MAX).await?.0 {
            let views = batch.records_in(wanted.clone())?;
            out.extend(
                views.iter().filter(|view| offsets.binary_search(&view.offset).is_ok()).map(StoredRecord::of),
            );
        }
        Ok(out)
    }

    /// The batches holding the given offsets (sorted), each once and validated, skipping
    /// offsets no longer stored: for a reader that takes the records it wants as views, without
    /// copying them out (`HeldBatch::records`). Reading stops once the batches held carry
    /// `records_bytes_max` bytes of records (the first is always read, however large), so a
    /// reader bounded in bytes does not hold what it cannot send; returns the batches and how
    /// many of `offsets` they cover (or were found no longer stored); the rest were not read.
    pub async fn hold_offsets(
        &self,
        offsets: &[u64],
        records_bytes_max: usize,
    ) -> Result<(Vec<HeldBatch<S>>, usize), LogError> {
        let mut out = Vec::new();
        let mut index = 0;
        let mut held_bytes = 0usize;
        let start = self.start_offset();
        while index < offsets.len() {
            if offsets[index] < start {
                index += 1;
                continue;
            }
            if held_bytes >= records_bytes_max {
                return Ok((out, index));
            }
            let Some(batch) = self.hold_batch_at(offsets[index]).await? else { break };
            let end = batch.end_offset();
            if end <= offsets[index] {
                break;
            }
            held_bytes = held_bytes.saturating_add(batch.records_bytes());
            out.push(batch);
            while index < offsets.len() && offsets[index] < end {
                index += 1;
            }
        }
        // Past the log's end (or a gap): those offsets are not stored either.
        Ok((out, offsets.len()))
    }

    /// The whole batch holding `offset`, with its records copied out where `keep` says.
    async fn read_batch_at(
        &self,
        offset: u64,
        keep: &dyn Fn(u64) -> bool,
        durable: bool,
    ) -> Result<BatchRead, LogError> {
        let Some(batch) = self.hold_batch_within(offset, durable).await? else {
            return Ok(BatchRead::default());
        };
        let records =
            batch.records()?.iter().filter(|view| keep(view.offset)).map(StoredRecord::of).collect();
        Ok(BatchRead { end: batch.end_offset(), records })
    }

    /// The whole batch holding `offset`, validated: from the tail cache, from an extent read
    /// ahead, or from the first copy whose bytes pass their checksums. A copy that fails is
    /// repaired from the good one. None if no batch holds it.
    async fn hold_batch_at(&self, offset: u64) -> Result<Option<HeldBatch<S>>, LogError> {
        self.hold_batch_within(offset, false).await
    }

    /// `hold_batch_at`, up to the durable end instead of the committed one when `durable`.
    async fn hold_batch_within(&self, offset: u64, durable: bool) -> Result<Option<HeldBatch<S>>, LogError> {
        let (segment_index, entry, files, segment_base, log_id, cached) = {
            let inner = self.inner.borrow();
            let segment_index =
                match inner.segments.binary_search_by_key(&offset, |segment| segment.base_offset) {
                    Ok(index) => index,
                    Err(0) => return Ok(None),
                    Err(index) => index - 1,
                };
            let segment = &inner.segments[segment_index];
            let batch_index =
                match segment.batches.binary_search_by_key(&offset, |entry| entry.header.base_offset) {
                    Ok(index) => index,
                    Err(0) => return Ok(None),
                    Err(index) => index - 1,
                };
            let entry = segment.batches[batch_index];
            // Readers see committed batches only (`committed_end` is a batch's end).
            let visible_end = if durable { inner.durable_end } else { inner.committed_end };
            if offset >= entry.header.end_offset() || entry.header.base_offset >= visible_end {
                return Ok(None);
            }
            // The cache is in commit order, so by base offset: a search, not a scan, since it
            // may hold thousands of small batches and a lagging reader looks up every one.
            let cached = inner
                .tail_cache
                .binary_search_by_key(&entry.header.base_offset, |(base, _)| *base)
                .ok()
                .map(|index| inner.tail_cache[index].1.clone());
            let files = inner.copy_files(segment_index);
            (segment_index, entry, files, segment.base_offset, inner.log_id, cached)
        };
        let describe = |error: &dyn fmt::Display| {
            format!(
                "batch at offset {} (segment {segment_base}, byte {}): {error}",
                entry.header.base_offset, entry.position
            )
        };
        // Bytes from memory were validated when they were read or written: their header is
        // checked against the index, their checksums are not computed again.
        let held = |bytes: HeldBytes<S>| -> Result<HeldBatch<S>, LogError> {
            let header = record::decode_batch_header(bytes.bytes(), log_id, segment_base, entry.position)
                .map_err(|e| LogError::DataLoss(describe(&e)))?;
            if header != entry.header {
                return Err(LogError::DataLoss(describe(
                    &"the batch header differs from the one recovery indexed",
                )));
            }
            Ok(HeldBatch { bytes, log_id, header })
        };
        if let Some(buffer) = cached {
            return held(HeldBytes::Cached(buffer)).map(Some);
        }
        if let Some(bytes) = self.hold_from_extents(segment_base, entry).await {
            return held(bytes).map(Some);
        }
        let files = if files.is_empty() && self.segment_is_closed(segment_index) {
            self.ensure_open(segment_index).await?;
            self.inner.borrow().copy_files(segment_index)
        } else {
            files
        };
        let mut bad_copies = Vec::new();
        let mut last_error = String::from("no copy of this segment is readable");
        for (copy, file) in &files {
            let result = match file.read_at(entry.position, entry.header.disk_bytes()).await {
                Ok(bytes) => {
                    let checked = record::decode_batch_header(&bytes, log_id, segment_base, entry.position)
                        .map_err(|e| describe(&e))
                        .and_then(|header| {
                            if header != entry.header {
                                return Err(describe(
                                    &"the batch header differs from the one recovery indexed",
                                ));
                            }
                            record::decode_batch_checked(&bytes, log_id, &header, true)
                                .map_err(|e| describe(&e))?;
                            Ok(header)
                        });
                    checked.map(|header| HeldBatch {
                        bytes: HeldBytes::Read(Rc::new(bytes), 0),
                        log_id,
                        header,
                    })
                }
                Err(error) => Err(describe(&error)),
            };
            match result {
                Ok(batch) => {
                    for bad in bad_copies {
                        if self.inner.borrow().copies.get(bad) == CopyState::Current {
                            crate::log_info!(
                                "ringpostd: repairing data directory {bad}'s copy of {last_error}"
                            );
                            self.repair(segment_index, entry.position, entry.header.disk_bytes(), *copy, bad)
                                .await?;
                        }
                    }
                    return Ok(Some(batch));
                }
                Err(error) => {
                    last_error = error;
                    bad_copies.push(*copy);
                }
            }
        }
        Err(LogError::DataLoss(last_error))
    }

    /// The batch from the extents read ahead, reading an extent from it on when there is none;
    /// and once a reader is in the newest extent, the next one is read in the background. None
    /// when the batch cannot be read that way: the caller reads it alone, copy by copy.
    async fn hold_from_extents(&self, segment_base: u64, entry: BatchEntry) -> Option<HeldBytes<S>> {
        let offset = entry.header.base_offset;
        loop {
            let lookup = match self.inner.borrow_mut().read_ahead.as_mut() {
                Some(cache) => cache.lookup(segment_base, entry.position, offset),
                None => Lookup::Miss,
            };
            match lookup {
                Lookup::Hit { bytes, start, newest } => {
                    if newest {
                        self.start_read_ahead();
                    }
                    return Some(HeldBytes::Read(bytes, start));
                }
                Lookup::Pending(arrived) => arrived.await,
                Lookup::Miss => break,
            }
        }
        let plan = {
            let inner = self.inner.borrow();
            if !inner.config.read_ahead || !inner.has_room_to_read_ahead() {
                return None;
            }
            inner.plan_extent(offset)?
        };
        let extent = plan.read().await?;
        let held = HeldBytes::Read(extent.bytes.clone(), (entry.position - extent.position) as usize);
        self.inner.borrow_mut().keep_extent(extent);
        self.start_read_ahead();
        Some(held)
    }

    /// Reads the extent after the newest one kept, in a task of its own, unless one is being
    /// read, the batches are in the tail cache, or the shard's cache budget is short.
    fn start_read_ahead(&self) {
        let plan = {
            let mut inner = self.inner.borrow_mut();
            if !inner.has_room_to_read_ahead() {
                return;
            }
            let Some(next) = inner.read_ahead.as_ref().and_then(|cache| cache.next_to_read()) else { return };
            if next >= inner.committed_end {
                return;
            }
            let Some(plan) = inner.plan_extent(next) else { return };
            inner.read_ahead.as_mut().unwrap().start_reading(next, plan.end_offset);
            plan
        };
        let log = self.clone();
        crate::runtime::spawn(async move {
            let extent = plan.read().await;
            let mut inner = log.inner.borrow_mut();
            if inner.read_ahead.is_some() {
                if let Some(extent) = extent {
                    inner.keep_extent(extent);
                }
                inner.read_ahead.as_mut().unwrap().finish_reading();
            }
        })
        .detach();
    }

    /// Notes a write issued to `targets` at `place` that misses a joining copy (see
    /// `Joining`). With no copy joining, which is the rule, this costs a look at one word.
    fn note_missed(&self, place: Place, targets: &[(usize, Rc<S::File>)]) {
        let mut inner = self.inner.borrow_mut();
        let missed = inner.joining_missed_by(targets);
        if missed == 0 {
            return;
        }
        let joining = inner.joining.as_mut().expect("a copy that missed a write is joining");
        if joining.missed.len() < RESYNC_MISSED_MAX {
            joining.missed.push((place.segment_base, place.position, missed));
            return;
        }
        // A resync that cannot keep up with the rolls racing it: the copies stay stale.
        for copy in 0..DATA_DIRECTORIES_MAX {
            if missed & (1 << copy) != 0 {
                inner.mark_stale(copy);
            }
        }
    }

    /// Brings this log's copy in data directory `copy` up to date after the directory was
    /// fenced and an operator asked to resync it. Every batch is copied from a current copy
    /// (after validation) and synced, round after round, until a round finds nothing left;
    /// then, with no await in between, the copy joins (`Joining`): every write issued from
    /// then on goes to it too. The batches whose writes were in flight as it joined, and any
    /// write that still missed it (into a segment a roll was making without it), are copied
    /// once they are durable; only when none is left, again with no await in between, is the
    /// copy current, and the manifest is rewritten. Returns the batches copied.
    pub async fn resync_copy(&self, copy: usize) -> Result<u64, LogError> {
        {
            let inner = self.inner.borrow();
            if inner.copies.get(copy) == CopyState::Current {
                return Ok(0);
            }
            if inner.takes_writes(copy) {
                return Err(LogError::Io(format!("data directory {copy} is being resynced already")));
            }
        }
        let mut copied: std::collections::HashSet<(u64, u64)> = std::collections::HashSet::new();
        // The end of the last batch issued when the copy joined.
        let mut joined_at: Option<u64> = None;
        for _round in 0..RESYNC_ROUNDS_MAX {
            if let Some(why) = self.inner.borrow().fenced.clone() {
                return Err(LogError::Fenced(why));
            }
            if joined_at.is_some() && !self.inner.borrow().takes_writes(copy) {
                return Err(LogError::Io(format!("data directory {copy} failed again during the resync")));
            }
            let work = match self.resync_work(copy, &copied, joined_at) {
                ResyncWork::Copy(work) => work,
                ResyncWork::Wait => {
                    crate::runtime::sleep(RESYNC_WAIT).await;
                    continue;
                }
                ResyncWork::Done if joined_at.is_none() => {
                    joined_at = Some(self.join(copy));
                    continue;
                }
                ResyncWork::Done => {
                    self.finish_joining(copy);
                    self.write_manifest().await?;
                    return Ok(copied.len() as u64);
                }
            };
            for (segment_index, base, pending, _) in work {
                self.resync_segment(copy, segment_index, base, pending, &mut copied).await?;
            }
        }
        Err(LogError::Io(format!(
            "the resync of data directory {copy} did not catch up in {RESYNC_ROUNDS_MAX} rounds"
        )))
    }

    /// Makes a copy that a resync found caught up take every write issued from now on (see
    /// `Joining`); returns the end of the last batch issued before.
    fn join(&self, copy: usize) -> u64 {
        let mut inner = self.inner.borrow_mut();
        let joining =
            inner.joining.get_or_insert_with(|| Box::new(Joining { copies: 0, missed: Vec::new() }));
        joining.copies |= 1 << copy;
        inner.written_end
    }

    /// Makes a joining copy current: it holds every batch.
    fn finish_joining(&self, copy: usize) {
        let mut inner = self.inner.borrow_mut();
        if let Some(joining) = inner.joining.as_mut() {
            joining.copies &= !(1 << copy);
            for (_, _, missed) in joining.missed.iter_mut() {
                *missed &= !(1 << copy);
            }
            joining.missed.retain(|(_, _, missed)| *missed != 0);
            if joining.copies == 0 {
                inner.joining = None;
            }
        }
        inner.copies.set(copy, CopyState::Current);
    }

    /// What a resync of `copy` has left, by segment (index, base offset, batches to copy,
    /// whether the copy lacks the segment's file). Before the copy joined: every batch not
    /// copied yet. After (`joined_at`, the end of the last batch issued before): the batches
    /// issued before it joined and not copied, and those whose writes missed it; and it waits
    /// while such a write is in flight.
    fn resync_work(
        &self,
        copy: usize,
        copied: &std::collections::HashSet<(u64, u64)>,
        joined_at: Option<u64>,
    ) -> ResyncWork {
        let mut inner = self.inner.borrow_mut();
        let in_flight = inner.durable_end < inner.written_end;
        let missed_by = |inner: &LogInner<S>, base: u64, position: u64| {
            inner.joining.as_ref().is_some_and(|joining| {
                joining
                    .missed
                    .iter()
                    .any(|(b, p, missed)| *b == base && *p == position && missed & (1 << copy) != 0)
            })
        };
        let work: Vec<(usize, u64, Vec<BatchEntry>, bool)> = inner
            .segments
            .iter()
            .enumerate()
            .map(|(index, segment)| {
                let pending: Vec<BatchEntry> = segment
                    .batches
                    .iter()
                    .filter(|entry| {
                        let not_copied = !copied.contains(&(segment.base_offset, entry.position));
                        match joined_at {
                            None => not_copied,
                            Some(joined_at) => {
                                (not_copied && entry.header.base_offset < joined_at)
                                    || missed_by(&inner, segment.base_offset, entry.position)
                            }
                        }
                    })
                    .copied()
                    .collect();
                (index, segment.base_offset, pending, segment.files[copy].is_none())
            })
            .filter(|(_, _, pending, missing)| !pending.is_empty() || *missing)
            .collect();
        if !work.is_empty() {
            return ResyncWork::Copy(work);
        }
        let Some(joined_at) = joined_at else { return ResyncWork::Done };
        // A write issued before the copy joined is still in flight.
        if inner.durable_end < joined_at.min(inner.written_end) {
            return ResyncWork::Wait;
        }
        // The writes noted as missing it whose batches are not indexed: in flight (at the
        // active segment's end), or gone (a truncation, a removed segment) with nothing to copy.
        let end = inner.end();
        let missed_in_flight = inner.joining.as_ref().is_some_and(|joining| {
            joining.missed.iter().any(|(base, position, missed)| {
                missed & (1 << copy) != 0
                    && end.is_some_and(|end| end.segment_base == *base && end.position <= *position)
            })
        });
        if in_flight && missed_in_flight {
            return ResyncWork::Wait;
        }
        if let Some(joining) = inner.joining.as_mut() {
            for (_, _, missed) in joining.missed.iter_mut() {
                *missed &= !(1 << copy);
            }
            joining.missed.retain(|(_, _, missed)| *missed != 0);
        }
        ResyncWork::Done
    }

    /// Copies `pending` batches of a segment into `copy`, and creates the segment's file there
    /// if it has none (a segment created while the copy was stale, empty so far).
    async fn resync_segment(
        &self,
        copy: usize,
        segment_index: usize,
        base: u64,
        pending: Vec<BatchEntry>,
        copied: &mut std::collections::HashSet<(u64, u64)>,
    ) -> Result<(), LogError> {
        self.ensure_open(segment_index).await?;
        for entry in pending {
            let source = {
                let inner = self.inner.borrow();
                (0..inner.copies.len()).find(|other| {
                    *other != copy
                        && inner.copies.get(*other) == CopyState::Current
                        && inner.segments.get(segment_index).is_some_and(|s| s.files[*other].is_some())
                })
            };
            let Some(source) = source else {
                return Err(LogError::Io("no healthy copy to resync from".into()));
            };
            let before = self.directories.repairs();
            self.repair(segment_index, entry.position, entry.header.disk_bytes(), source, copy).await?;
            if self.directories.repairs() == before {
                return Err(LogError::Io(format!(
                    "writing to data directory {copy} failed during the resync"
                )));
            }
            copied.insert((base, entry.position));
            let mut inner = self.inner.borrow_mut();
            if let Some(joining) = inner.joining.as_mut() {
                for (b, p, missed) in joining.missed.iter_mut() {
                    if *b == base && *p == entry.position {
                        *missed &= !(1 << copy);
                    }
                }
                joining.missed.retain(|(_, _, missed)| *missed != 0);
            }
        }
        if self.inner.borrow().segments[segment_index].files[copy].is_none() {
            let capacity = self.inner.borrow().segments[segment_index].capacity;
            let folder = self.folder(copy);
            let path = folder.join(segment_name(base));
            self.storage.create_dir_durable(&folder).await.map_err(|e| LogError::Io(io_text(&e)))?;
            let file = self.storage.open(&path, true).await.map_err(|e| LogError::Io(io_text(&e)))?;
            file.allocate(capacity).await.map_err(|e| LogError::Io(io_text(&e)))?;
            file.sync_data().await.map_err(|e| LogError::Io(io_text(&e)))?;
            self.storage.sync_dir(&folder).await.map_err(|e| LogError::Io(io_text(&e)))?;
            self.inner.borrow_mut().segments[segment_index].files[copy] = Some(Rc::new(file));
        }
        Ok(())
    }

    /// Whether this log's copy in `copy` missed writes and needs a resync.
    pub fn is_stale(&self, copy: usize) -> bool {
        self.inner.borrow().copies.get(copy) == CopyState::Stale
    }

    /// The first offset published at or after `time_ms`, or the end of the log.
    pub async fn offset_at_time(&self, time_ms: u64) -> Result<u64, LogError> {
        let first_segment = {
            let inner = self.inner.borrow();
            inner.segments.iter().find(|segment| segment.newest_publish_ms >= time_ms).map(|s| s.base_offset)
        };
        let Some(mut offset) = first_segment else { return Ok(self.end_offset()) };
        loop {
            let records = self.read(offset, 1000, usize::MAX).await?;
            let Some(last) = records.last().map(|record| record.offset) else { return Ok(self.end_offset()) };
            if let Some(found) = records.iter().find(|record| record.publish_time_ms >= time_ms) {
                return Ok(found.offset);
            }
            offset = last + 1;
        }
    }

    /// The closed segments (all but the active one), oldest first, for retention decisions.
    pub fn closed_segments(&self) -> Vec<SegmentInfo> {
        let inner = self.inner.borrow();
        let count = inner.segments.len();
        (0..count.saturating_sub(1))
            .map(|index| SegmentInfo {
                base_offset: inner.segments[index].base_offset,
                end_offset: inner.segments[index + 1].base_offset,
                newest_publish_ms: inner.segments[index].newest_publish_ms,
            })
            .collect()
    }

    /// Deletes whole segments all of whose records are below `offset` (never the active one).
    pub async fn remove_before(&self, offset: u64) -> Result<usize, LogError> {
        let count = self.closed_segments().iter().take_while(|segment| segment.end_offset <= offset).count();
        self.remove_oldest(count).await
    }

    /// Deletes the `count` oldest segments (never the active one): the manifest without them is
    /// made durable first, then the files are removed. Returns the number removed.
    pub async fn remove_oldest(&self, count: usize) -> Result<usize, LogError> {
        let count = count.min(self.inner.borrow().segments.len().saturating_sub(1));
        if count == 0 || self.is_fenced().is_some() {
            return Ok(0);
        }
        let mut removed: Vec<Segment<S>> = self.inner.borrow_mut().segments.drain(..count).collect();
        if let Err(error) = self.write_manifest().await {
            // Nothing was deleted: the segments stay the log's, for the next collection to try
            // again (dropped here, they would have stayed on disk for good).
            let mut inner = self.inner.borrow_mut();
            let kept = std::mem::take(&mut inner.segments);
            inner.segments = removed;
            inner.segments.extend(kept);
            return Err(error);
        }
        self.recycle_one_of(&mut removed);
        for copy in 0..self.directories.count() {
            let folder = self.folder(copy);
            for segment in &mut removed {
                let path = folder.join(segment_name(segment.base_offset));
                if self.storage.exists(&path) {
                    shrink_gradually(segment.files[copy].take(), segment.capacity).await;
                    let _ = self.storage.remove_file(&path);
                }
            }
            if !self.directories.is_fenced(copy) {
                let _ = self.storage.sync_dir(&folder).await;
            }
        }
        Ok(count)
    }

    /// Keeps the newest of `removed` that the next roll can take as its segment
    /// (`LogConfig::recycle`): renamed to `RECYCLE_NAME` in every copy, with its files open.
    /// Called once the manifest without it is durable; a crash at any point leaves either
    /// name, and recovery removes both. Its entry in `removed` loses its files, so the caller
    /// deletes only the others.
    fn recycle_one_of(&self, removed: &mut [Segment<S>]) {
        let segment_bytes_max = {
            let inner = self.inner.borrow();
            if !inner.config.recycle || !inner.config.keep_files_open || inner.recycled.is_some() {
                return;
            }
            inner.config.segment_bytes_max
        };
        let writable = self.writable_copies();
        // Only a file nothing else holds (a read in flight would see its bytes change) and
        // present in every copy that takes writes.
        let Some(segment) = removed.iter_mut().rev().find(|segment| {
            segment.capacity == segment_bytes_max
                && segment.closed.is_none()
                && writable
                    .iter()
                    .all(|copy| segment.files[*copy].as_ref().is_some_and(|file| Rc::strong_count(file) == 1))
        }) else {
            return;
        };
        // Near a full disk the file goes, as a deleted segment does: space comes back for the
        // logs that need it, and the next roll sizes its segment by the space there is.
        if self.free_bytes_for_segment(&writable) / KEPT_FILE_FREE_BYTES_FACTOR < segment.capacity {
            return;
        }
        let Some(place) = ShardPlace::recycled() else { return };
        let mut files: Vec<Option<Rc<S::File>>> = vec![None; self.directories.count()];
        for copy in &writable {
            let folder = self.folder(*copy);
            if self
                .storage
                .rename(&folder.join(segment_name(segment.base_offset)), &folder.join(RECYCLE_NAME))
                .is_err()
            {
                // The copies renamed so far go as deleted segments do.
                let renamed = std::mem::take(&mut files);
                self.remove_kept_files(RECYCLE_NAME, renamed, segment.capacity);
                return;
            }
            files[*copy] = segment.files[*copy].take();
        }
        self.inner.borrow_mut().recycled =
            Some(Box::new(Recycled { capacity: segment.capacity, files, _place: place }));
    }

    /// Whether the log keeps a deleted segment's file for its next roll.
    pub fn keeps_a_recycled_file(&self) -> bool {
        self.inner.borrow().recycled.is_some()
    }

    /// Whether the log rolled since the last call, for a log that recycles: its owner then
    /// deletes what no one needs any more, so that the next roll finds a file to recycle.
    pub fn take_rolled(&self) -> bool {
        std::mem::take(&mut self.inner.borrow_mut().rolled)
    }

    /// Bytes of the durable batches from the one holding `offset` to the log's end, as stored
    /// (headers and checksums included): what a reader starting at `offset` has left to read.
    pub fn bytes_from(&self, offset: u64) -> u64 {
        let inner = self.inner.borrow();
        let mut bytes = 0;
        for segment in inner.segments.iter().rev() {
            let Some(first) = segment.batches.first() else { continue };
            if segment.base_offset > offset || first.header.base_offset > offset {
                bytes += segment.write_position - first.position;
                continue;
            }
            let holding = segment.batches.partition_point(|batch| batch.header.end_offset() <= offset);
            if let Some(batch) = segment.batches.get(holding) {
                bytes += segment.write_position - batch.position;
            }
            break;
        }
        bytes
    }

    /// Bytes of segment files (allocated capacity) of one copy, a recycled one included.
    pub fn disk_bytes(&self) -> u64 {
        let inner = self.inner.borrow();
        let recycled = inner.recycled.as_ref().map_or(0, |recycled| recycled.capacity);
        inner.segments.iter().map(|segment| segment.capacity).sum::<u64>() + recycled
    }
}

enum ReadBatch {
    /// A valid batch and the publish time of its newest record.
    Valid(BatchHeader, u64),
    Empty,
    Invalid(String),
}

/// A read-ahead window over a segment for the recovery scan: batches are parsed out of one
/// large read instead of one read per batch.
struct Window<R> {
    start: u64,
    bytes: Option<R>,
    /// The size of the next read: `RECOVERY_READ_BYTES_FIRST`, doubling up to
    /// `RECOVERY_READ_BYTES`. Most logs are small, and the unwritten rest of a segment reads
    /// as zeros the kernel still copies: many small logs would read gigabytes of them in
    /// large reads.
    next_bytes: usize,
}

impl<R: std::ops::Deref<Target = [u8]>> Window<R> {
    fn new() -> Window<R> {
        Window { start: 0, bytes: None, next_bytes: RECOVERY_READ_BYTES_FIRST }
    }

    /// The bytes at `[position, position + length)` (fewer at the end of the file).
    async fn at<F: StorageFile<Read = R>>(
        &mut self,
        file: &F,
        position: u64,
        length: usize,
        size: u64,
    ) -> Result<&[u8], LogError> {
        let covered = self.bytes.as_ref().is_some_and(|bytes| {
            position >= self.start && position + length as u64 <= self.start + bytes.len() as u64
        });
        if !covered {
            let want = (length.max(self.next_bytes) as u64).min(size.saturating_sub(position)) as usize;
            let want = record::align_up(want, BLOCK_BYTES);
            self.next_bytes = (self.next_bytes * 2).min(RECOVERY_READ_BYTES);
            self.bytes = Some(file.read_at(position, want).await.map_err(|e| LogError::Io(io_text(&e)))?);
            self.start = position;
        }
        let bytes = self.bytes.as_ref().unwrap();
        let from = (position - self.start) as usize;
        let to = (from + length).min(bytes.len());
        Ok(&bytes[from.min(to)..to])
    }
}

async fn read_batch<F: StorageFile>(
    file: &F,
    window: &mut Window<F::Read>,
    log_id: u64,
    segment_base: u64,
    position: u64,
    size: u64,
) -> Result<ReadBatch, LogError> {
    let head = window.at(file, position, BLOCK_BYTES, size).await?;
    let header = match record::decode_batch_header(head, log_id, segment_base, position) {
        Ok(header) => header,
        Err(BatchError::Empty) => return Ok(ReadBatch::Empty),
        Err(error) => return Ok(ReadBatch::Invalid(error.to_string())),
    };
    if position + header.disk_bytes() as u64 > size {
        return Ok(ReadBatch::Invalid("batch extends past the end of the segment".into()));
    }
    let whole = window.at(file, position, header.disk_bytes(), size).await?;
    Ok(match record::decode_batch(whole, log_id, &header) {
        Ok(views) => {
            ReadBatch::Valid(header, views.iter().map(|view| view.publish_time_ms).max().unwrap_or(0))
        }
        Err(error) => ReadBatch::Invalid(error.to_string()),
    })
}

/// The position of the first block at or after `from` that starts a fully valid batch.
async fn first_valid_batch<F: StorageFile>(
    file: &F,
    log_id: u64,
    segment_base: u64,
    from: u64,
    size: u64,
) -> Result<Option<u64>, LogError> {
    first_valid_batch_from_offset(file, log_id, segment_base, from..size, size, 0).await
}

/// The position of the first valid batch starting in `starts` whose offsets start at
/// `offset_min` or later (reading up to `size`). Valid batches below `offset_min` are passed
/// over: found after damage at the log's end (`offset_min` one past the offset the damaged
/// batch would have held), they are of an earlier life of the file. Such a batch is one written
/// ahead of a commit a crash lost, beyond the reach of the recovery after it (written with a
/// larger group commit, or by a build before recovery looked for it), whose offsets the log
/// then reused. Being whole, nothing written since overlaps them.
async fn first_valid_batch_from_offset<F: StorageFile>(
    file: &F,
    log_id: u64,
    segment_base: u64,
    starts: std::ops::Range<u64>,
    size: u64,
    offset_min: u64,
) -> Result<Option<u64>, LogError> {
    let mut window = Window::new();
    let mut position = starts.start;
    while position < starts.end && position + BLOCK_BYTES as u64 <= size {
        let head = window.at(file, position, BLOCK_BYTES, size).await?;
        if record::decode_batch_header(head, log_id, segment_base, position).is_ok() {
            if let ReadBatch::Valid(header, _) =
                read_batch(file, &mut window, log_id, segment_base, position, size).await?
            {
                if header.base_offset >= offset_min {
                    return Ok(Some(position));
                }
                position += header.disk_bytes() as u64;
                continue;
            }
        }
        position += BLOCK_BYTES as u64;
    }
    Ok(None)
}

/// Whether the valid batch at `at` is a commit's successor that landed while the commit did
/// not: written ahead (`record::FLAG_WRITTEN_AHEAD`), beyond the offsets recovered so far
/// (`next_offset`), and the last valid batch of the segment (batches of an earlier life aside,
/// see `first_valid_batch_from_offset`). At most two writes of a log are in flight, so damage
/// in the middle of the log is followed by more than one valid batch, or by one that was not
/// written ahead, and is refused; only damage to the second-to-last batch in every copy, when
/// the last was written ahead, reads the same as the hole and loses both.
async fn orphan_written_ahead<F: StorageFile>(
    file: &F,
    log_id: u64,
    segment_base: u64,
    at: u64,
    size: u64,
    next_offset: u64,
) -> Result<bool, LogError> {
    let mut window = Window::new();
    let ReadBatch::Valid(header, _) = read_batch(file, &mut window, log_id, segment_base, at, size).await?
    else {
        return Ok(false);
    };
    let head = window.at(file, at, BLOCK_BYTES, size).await?;
    if record::batch_flags(head) & record::FLAG_WRITTEN_AHEAD == 0 || header.base_offset <= next_offset {
        return Ok(false);
    }
    let end = at + header.disk_bytes() as u64;
    Ok(first_valid_batch_from_offset(file, log_id, segment_base, end..size, size, next_offset + 1)
        .await?
        .is_none())
}

/// The end of the last block holding a non-zero byte.
async fn last_nonzero_end<F: StorageFile>(file: &F, size: u64) -> Result<u64, LogError> {
    let mut position = 0;
    let mut end = 0;
    while position < size {
        let window = (size - position).min(RECOVERY_READ_BYTES as u64) as usize;
        let bytes = file.read_at(position, window).await.map_err(|e| LogError::Io(io_text(&e)))?;
        if bytes.is_empty() {
            break;
        }
        for (index, block) in bytes.chunks(BLOCK_BYTES).enumerate() {
            if block.iter().any(|byte| *byte != 0) {
                end = position + ((index + 1) * BLOCK_BYTES) as u64;
            }
        }
        position += bytes.len() as u64;
    }
    Ok(end.min(size))
}

/// Deleting a large file frees all of its blocks at once, and where the filesystem trims freed
/// blocks (ext4 mounted with `discard`, as here) the device then trims all of them while every
/// write and fdatasync queued behind waits, for milliseconds: the tail of the end-to-end
/// latency. Shrinking it by `SEGMENT_DELETE_STEP_BYTES` with a pause between steps trims a
/// step at a time, between the other I/O (see benches/README.md).
/// Not while anyone else holds the file (a read still finishing): the plain unlink that follows
/// leaves the bytes to it.
async fn shrink_gradually<F: StorageFile>(file: Option<Rc<F>>, size: u64) {
    let Some(file) = file else { return };
    if Rc::strong_count(&file) > 1 {
        return;
    }
    let mut size = size;
    while size > SEGMENT_DELETE_STEP_BYTES {
        size -= SEGMENT_DELETE_STEP_BYTES;
        if file.truncate(size).await.is_err() {
            return;
        }
        crate::runtime::sleep(SEGMENT_DELETE_PAUSE).await;
    }
}

async fn zero_range<S: Storage>(storage: &S, file: &S::File, from: u64, to: u64) -> Result<(), LogError> {
    let mut position = from;
    while position < to {
        let length = ((to - position) as usize).min(RECOVERY_READ_BYTES);
        let mut buffer = storage.alloc_buffer(record::align_up(length, BLOCK_BYTES));
        buffer.bytes_mut().fill(0);
        file.write_at(Rc::new(buffer), position).await.map_err(|e| LogError::Io(io_text(&e)))?;
        position += length as u64;
    }
    Ok(())
}

/// Data directories already warned about as not taking O_DIRECT, at most
/// `BUFFERED_DIRECTORIES_REMEMBERED` (past it a directory may be warned about again).
static BUFFERED_DIRECTORIES_WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
const BUFFERED_DIRECTORIES_REMEMBERED: usize = 64;

/// One warning per data directory whose filesystem does not take O_DIRECT (tmpfs, some
/// network filesystems), not one per log.
fn warn_buffered_directory(directory: &Path) {
    let mut warned = BUFFERED_DIRECTORIES_WARNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if warned.iter().any(|known| known == directory) {
        return;
    }
    if warned.len() < BUFFERED_DIRECTORIES_REMEMBERED {
        warned.push(directory.to_owned());
    }
    crate::log_warn!(
        "ringpostd: WARNING: O_DIRECT does not take effect in data directory {} (its filesystem does not support \
         direct I/O): writes there go through the page cache and rely on fdatasync alone (said once for the directory)",
        directory.display()
    );
}

#[cfg(test)]
mod replication_tests;
#[cfg(test)]
pub(crate) mod tests;
