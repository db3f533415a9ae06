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
//!
//! # Layout
//! `commit.rs` the commit pipeline and the log's positions; `segments.rs` rolls, the manifest
//! and the segments' files; `space.rs` the spare, the recycled file and the reserve;
//! `reads.rs` reads, the tail cache and read-ahead; `resync.rs` the copies: fencing, repair
//! and resync; `epochs.rs` epochs, promises and truncation; `retention.rs` the deletion of old
//! segments; `recovery.rs` `open`. `LogInner` holds the state they share.

pub mod directories;
pub mod manifest;
pub mod read_ahead;
pub mod record;

mod commit;
mod epochs;
mod reads;
mod recovery;
mod resync;
mod retention;
mod segments;
mod space;

use crate::ids::{Epoch, Offset};
use crate::storage::{IoBuffer, Storage, StorageFile};
use crate::sync::{join_all, oneshot, Notify, Sender};
use commit::*;
pub use directories::{Directories, DATA_DIRECTORIES_MAX};
use epochs::Epochs;
use manifest::{Listed, Manifest, MANIFEST_SLOTS};
use read_ahead::{Extent, Lookup, ReadAhead, READ_AHEAD_BYTES};
use reads::ReadCache;
use record::{BatchError, BatchHeader, BLOCK_BYTES};
use recovery::zero_range;
use resync::*;
use retention::*;
use segments::*;
use space::*;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use commit::{EncodeRecords, Records};
pub use epochs::STANDALONE_EPOCH;
pub use reads::{span, HeldBatch, HeldBytes, StoredRecord, TailCacheBudget, TAIL_CACHE_IDLE_SWEEPS};
pub use recovery::RecoveryReport;
pub use retention::{SegmentInfo, SEGMENT_DELETE_PAUSE, SEGMENT_DELETE_STEP_BYTES};
pub use segments::segment_bytes_to_fit;
pub use space::{
    make_reserve, KEPT_FILE_FREE_BYTES_FACTOR, RECYCLED_PER_SHARD_MAX, RECYCLE_NAME, RESERVE_MAKING_NAME,
    RESERVE_NAME, SPARES_PER_SHARD_MAX, SPARE_BUSY_PAUSE, SPARE_NAME, SPARE_WRITE_CHUNK_BYTES,
};

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
    /// Durable here, but this replica stopped leading its source before a quorum of replicas
    /// confirmed it: it may or may not be kept, and the source's new leader (which the router
    /// names) is where to go. `led` is the epoch this replica led, `None` when it was already
    /// a follower as the write arrived.
    Deposed {
        led: Option<crate::ids::Epoch>,
    },
    /// Durable here, but fewer than `quorum` of the source's `replicas` confirmed it within
    /// `waited` (`replication::source::COMMIT_WAIT_MAX`); this replica still leads: it may or
    /// may not be kept, and the same leader is where to retry.
    CommitTimeout {
        quorum: usize,
        replicas: usize,
        waited: std::time::Duration,
    },
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
            LogError::Deposed { led: Some(epoch) } => write!(
                f,
                "this replica stopped leading the topic at epoch {epoch} before a quorum of replicas confirmed \
                 the write; it may or may not be kept, and the topic's new leader serves it"
            ),
            LogError::Deposed { led: None } => write!(
                f,
                "this replica no longer leads the topic; the write may or may not be kept, and the topic's \
                 new leader serves it"
            ),
            LogError::CommitTimeout { quorum, replicas, waited } => write!(
                f,
                "fewer than {quorum} of {replicas} replicas confirmed the write within {} s; it may or may \
                 not be kept, and this leader may be asked again",
                waited.as_secs()
            ),
        }
    }
}

/// The state of one log, shared by its handles (`Log`), in groups by concern; each group's
/// contract is on its type.
struct LogInner<S: Storage> {
    log_id: u64,
    relative: PathBuf,
    /// Shared by the logs opened with the same configuration (every topic's message log):
    /// one copy per shard instead of 56 bytes per log.
    config: Rc<LogConfig>,
    segments: Vec<Segment<S>>,
    positions: Positions,
    staging: Staging,
    epochs: Epochs,
    cache: ReadCache<S>,
    copies: Copies,
    kept: Kept<S>,
    fenced: Option<String>,
    /// Written into the manifest while a truncation zeroes the removed batches (see
    /// `manifest::Manifest::truncated_end`).
    truncated_end: Option<u64>,
    /// The sequence of the last manifest durable on ⌈M/2⌉ copies; the next goes to the other
    /// slot (`write_manifest`).
    manifest_sequence: u64,
    // The flags stay here rather than in their groups: a group is laid out on its own, so a
    // flag in one costs it a word of padding, and every topic has two logs (W4's bound is 2 KiB
    // resident per idle topic with a subscription; grouped, they made `LogInner`
    // 376 bytes rather than 344).
    /// The flush task runs (`Staging`): it ends once nothing is staged.
    flushing: bool,
    /// Whether each completed commit also commits (a standalone log); see `set_commit_on_durable`.
    commit_on_durable: bool,
    /// A `truncate_after` is in progress: appends are refused until it ends.
    truncating: bool,
    /// Its files are about to be removed (`close_for_removal`): appends are refused.
    closed_for_removal: bool,
    /// A manifest write is in progress: the next waits (see `write_manifest`).
    manifest_writing: bool,
    /// Set by a roll of a log that recycles, taken by `take_rolled`.
    rolled: bool,
    /// A `retake_reserve` is in progress.
    reserving: bool,
    /// Sweeps of the tail cache since the last commit, up to `TAIL_CACHE_IDLE_SWEEPS`.
    idle_sweeps: u8,
    warned_buffered: bool,
}

impl<S: Storage> Drop for LogInner<S> {
    /// A deleted topic's log gives its cached bytes back to the shard's budget.
    fn drop(&mut self) {
        self.drop_tail_cache();
        self.drop_read_ahead();
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

/// How often `close_for_removal` looks whether the commits in flight are done.
const REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

impl<S: Storage> Log<S> {
    pub fn storage(&self) -> &S {
        &self.storage
    }

    pub fn directories(&self) -> &Rc<Directories> {
        &self.directories
    }

    pub fn is_fenced(&self) -> Option<String> {
        self.inner.borrow().fenced.clone()
    }
}

#[cfg(test)]
mod replication_tests;
#[cfg(test)]
pub(crate) mod tests;
