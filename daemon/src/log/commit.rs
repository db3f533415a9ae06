//! The commit pipeline: steps 1, 2, 4 and 5 of the durability contract (`log`'s
//! documentation). Appends are staged (`stage`), one flush task per log takes them into group
//! commits (`flush_loop`), gives their offsets as the batch is built (`build_batch`), writes it
//! to every copy that takes writes and syncs them (`sync_written`), and resolves the appends once
//! the batch is durable on ⌈M/2⌉ copies; while a write is with the disk, the next batch is built
//! and its write issued (`prepare_ahead`). Commits complete in order. Here too are the log's
//! positions (committed ≤ durable ≤ written ≤ assigned, `LogInner::check_positions`) and the
//! commit point a replicated log is told (`commit_to`).

use super::*;
use crate::ids::{Epoch, Offset};

/// The log's positions, each an offset one past the last record it counts, in order
/// `start_offset() <= committed_end <= durable_end <= written_end <= assigned_end`
/// (`LogInner::check_positions`):
/// - `committed_end`: what readers see (`read`, `hold_offsets`, `offset_at_time`, the
///   `committed` notification). A standalone log commits what is durable as each commit
///   completes (`LogInner::commit_on_durable`); a replicated one is told (`commit_to`) once a
///   quorum of replicas has it. Always the end of a batch.
/// - `durable_end`: what is durable on ⌈M/2⌉ of this node's directories; appends are
///   acknowledged up to here.
/// - `written_end`: the end of the last batch whose offsets were given and whose write may
///   be in flight.
/// - `assigned_end`: the offset the next append will get once everything queued commits:
///   what `append_at` must be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Positions {
    pub(super) committed_end: u64,
    pub(super) durable_end: u64,
    pub(super) written_end: u64,
    pub(super) assigned_end: u64,
}

impl Positions {
    /// Every position at `offset`: a log recovered up to there, or one that starts there.
    pub(super) fn at(offset: u64) -> Positions {
        Positions { committed_end: offset, durable_end: offset, written_end: offset, assigned_end: offset }
    }
}

/// The appends waiting for a commit, taken by the one flush task (`flush_loop`; whether it runs
/// is `LogInner::flushing`).
pub(super) struct Staging {
    /// In the order they were made, which is the order of their offsets.
    pub(super) staged: VecDeque<Staged>,
    /// Their bytes of records, at most `LogConfig::staging_bytes_max`.
    pub(super) staged_bytes: usize,
    /// Commits built and issued while the one before was being written (`prepare_ahead`).
    pub(super) commits_built_ahead: u64,
}

impl Staging {
    /// Nothing staged: a log as it opens.
    pub(super) fn new() -> Staging {
        Staging { staged: VecDeque::new(), staged_bytes: 0, commits_built_ahead: 0 }
    }
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

pub(super) struct Staged {
    records: Records,
    pub(super) record_count: u32,
    /// The epoch of the batch that takes these records: a batch takes appends of one epoch.
    epoch: u64,
    /// The offset a follower's append was given (`append_at`); None for the leader's appends,
    /// whose offsets the flush loop assigns.
    first_offset: Option<u64>,
    pub(super) reply: Sender<Result<(Offset, u32), LogError>>,
}

/// Where a batch goes: its segment, its byte position in it, and its first offset.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    pub(super) segment_base: u64,
    pub(super) position: u64,
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

impl<S: Storage> LogInner<S> {
    /// Where the next batch goes: the active segment's write position and the next offset;
    /// None before the first segment.
    pub(super) fn end(&self) -> Option<Place> {
        self.segments.last().map(|segment| Place {
            segment_base: segment.base_offset,
            position: segment.write_position,
            base_offset: self.positions.durable_end,
        })
    }

    /// Asserts the order of the log's positions (see `Positions`), in release builds too: four
    /// comparisons once a commit completes or the commit point moves, and a log whose positions
    /// are out of order would acknowledge or serve what is not durable. The daemon is fail-stop
    /// (`fail_stop`): recovery then rebuilds the positions from what the disks hold.
    pub(super) fn check_positions(&self) {
        let start = self.segments.first().map_or(self.positions.committed_end, |segment| segment.base_offset);
        assert!(
            start <= self.positions.committed_end
                && self.positions.committed_end <= self.positions.durable_end
                && self.positions.durable_end <= self.positions.written_end
                && self.positions.written_end <= self.positions.assigned_end,
            "positions out of order: start {start}, committed {}, durable {}, written {}, assigned {}",
            self.positions.committed_end,
            self.positions.durable_end,
            self.positions.written_end,
            self.positions.assigned_end
        );
    }
}

impl<S: Storage> Log<S> {
    /// One past the last committed record: what readers see. Every offset below it is durable
    /// here, and (replicated) on a quorum of replicas. The same as `committed_end`.
    pub fn end_offset(&self) -> Offset {
        Offset::new(self.inner.borrow().positions.committed_end)
    }

    /// One past the last record a quorum has (see `LogInner::committed_end`).
    pub fn committed_end(&self) -> Offset {
        Offset::new(self.inner.borrow().positions.committed_end)
    }

    /// One past the last record durable on ⌈M/2⌉ of this node's data directories: what the
    /// appends are acknowledged for.
    pub fn durable_end(&self) -> Offset {
        Offset::new(self.inner.borrow().positions.durable_end)
    }

    /// One past the last record whose batch was built and whose write may be in flight.
    pub fn written_end(&self) -> Offset {
        Offset::new(self.inner.borrow().positions.written_end)
    }

    /// The offset `append_at` must be given next: one past every record queued or written.
    pub fn next_offset(&self) -> Offset {
        Offset::new(self.inner.borrow().positions.assigned_end)
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
    pub fn commit_to(&self, offset: Offset) {
        let offset = offset.get();
        let advanced = {
            let mut inner = self.inner.borrow_mut();
            // The durable end is a batch's end: a standalone log's every commit needs no search.
            let offset = if offset >= inner.positions.durable_end {
                inner.positions.durable_end
            } else {
                inner.batch_end_at_or_below(offset)
            };
            let advanced = offset > inner.positions.committed_end;
            if advanced {
                inner.positions.committed_end = offset;
            }
            inner.check_positions();
            advanced
        };
        if advanced {
            self.committed.notify_all();
        }
    }

    /// Commits whose bytes were built, and whose write was issued, while the commit before them
    /// was being written.
    pub fn commits_built_ahead(&self) -> u64 {
        self.inner.borrow().staging.commits_built_ahead
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
        let start =
            inner.segments.first().map_or(inner.positions.committed_end, |segment| segment.base_offset);
        inner.positions.committed_end = inner.positions.committed_end.min(start);
        inner.check_positions();
    }

    /// Appends `record_count` unsealed records (see `record::encode_record_unsealed`) and
    /// resolves, after they are durable, with the offset of the first and the count. The
    /// records are copied once more, into the aligned buffer of the commit that takes them.
    pub async fn append(&self, records: Vec<u8>, record_count: u32) -> Result<(Offset, u32), LogError> {
        self.append_records(Records::Encoded(records), record_count).await
    }

    /// `append`, for records encoded already or encoded when their commit is built.
    pub async fn append_records(
        &self,
        records: Records,
        record_count: u32,
    ) -> Result<(Offset, u32), LogError> {
        self.stage(records, record_count, None, None).await
    }

    /// A follower's append: the leader's records from `first_offset` on, in a batch of
    /// `epoch`. Refused (`LogError::Refused`) unless `first_offset` is the log's next offset
    /// (`next_offset`: no gap, no overlap; a follower truncates a tail that disagrees with
    /// its leader first, `truncate_after`) and `epoch` is at least the log's last
    /// (`last_epoch`). Resolves, as `append` does, once the records are durable here.
    pub async fn append_at(
        &self,
        first_offset: Offset,
        epoch: Epoch,
        records: Vec<u8>,
        record_count: u32,
    ) -> Result<(Offset, u32), LogError> {
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
        leader_epoch: Epoch,
        first_offset: Offset,
        epoch: Epoch,
        records: Vec<u8>,
        record_count: u32,
    ) -> Result<(Offset, u32), LogError> {
        self.append_records_from_leader(
            leader_epoch,
            first_offset,
            epoch,
            Records::Encoded(records),
            record_count,
        )
        .await
    }

    /// `append_from_leader`, for records copied into the commit's buffer only when it is built
    /// (`Records::Deferred`: a follower's records, still in the frame they arrived in).
    pub async fn append_records_from_leader(
        &self,
        leader_epoch: Epoch,
        first_offset: Offset,
        epoch: Epoch,
        records: Records,
        record_count: u32,
    ) -> Result<(Offset, u32), LogError> {
        let (leader_epoch, first_offset, epoch) = (leader_epoch.get(), first_offset.get(), epoch.get());
        {
            let inner = self.inner.borrow();
            if epoch > leader_epoch || leader_epoch < inner.epochs.promised_epoch {
                return Err(LogError::Refused(format!(
                    "an append of epoch {epoch} from the leader of epoch {leader_epoch}: the log promised to take \
                     none from a leader older than epoch {}",
                    inner.epochs.promised_epoch
                )));
            }
        }
        self.stage(records, record_count, Some(epoch), Some(first_offset)).await
    }

    /// Queues an append for the flush loop and waits for its commit. `epoch` None: the
    /// leader's (`set_epoch`); `first_offset` None: the flush loop gives the offsets.
    async fn stage(
        &self,
        records: Records,
        record_count: u32,
        epoch: Option<u64>,
        first_offset: Option<u64>,
    ) -> Result<(Offset, u32), LogError> {
        let receiver = {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            if inner.closed_for_removal {
                return Err(LogError::Fenced("the log is being removed (`close_for_removal`)".into()));
            }
            let epoch = epoch.unwrap_or(inner.epochs.epoch);
            Self::check_append(&inner, epoch, first_offset)?;
            if inner.staging.staged_bytes + records.len() > inner.config.staging_bytes_max {
                return Err(LogError::Overloaded);
            }
            inner.staging.staged_bytes += records.len();
            inner.positions.assigned_end += record_count as u64;
            inner.epochs.last_epoch = epoch;
            let (reply, receiver) = oneshot();
            inner.staging.staged.push_back(Staged { records, record_count, epoch, first_offset, reply });
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
        if epoch == record::EPOCH_NONE || epoch < inner.epochs.last_epoch {
            return Err(LogError::Refused(format!(
                "an append of epoch {epoch}: the log's last batch is of epoch {}",
                inner.epochs.last_epoch
            )));
        }
        if first_offset.is_none() && epoch < inner.epochs.promised_epoch {
            return Err(LogError::Refused(format!(
                "an append of epoch {epoch}: the log promised to take none older than epoch {}",
                inner.epochs.promised_epoch
            )));
        }
        match first_offset {
            Some(first) if first != inner.positions.assigned_end => Err(LogError::Refused(format!(
                "an append at offset {first}: the log's next offset is {}",
                inner.positions.assigned_end
            ))),
            _ => Ok(()),
        }
    }

    /// How many of the staged appends the next commit takes (at least one; then as many as fit
    /// in `group_commit_bytes_max`), and their bytes.
    fn next_take(inner: &LogInner<S>) -> (usize, usize) {
        let mut take_bytes = 0;
        let mut take = 0;
        let first = inner.staging.staged.front();
        for staged in inner.staging.staged.iter() {
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
                    if inner.staging.staged.is_empty() {
                        inner.flushing = false;
                        return;
                    }
                    let (take, take_bytes) = Self::next_take(&inner);
                    inner.staging.staged_bytes -= take_bytes;
                    (inner.staging.staged.drain(..take).collect(), None)
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
                        self.commit_to(Offset::new(first + count as u64));
                    }
                    self.durable.notify_all();
                    for staged in batch {
                        staged.reply.send(Ok((Offset::new(first), staged.record_count)));
                        first += staged.record_count as u64;
                    }
                }
                Err(error) => {
                    // Unless the log is fenced, nothing of it was written (a failure after a
                    // write fences the log): the appends queued behind take its offsets.
                    if !matches!(error, LogError::Fenced(_)) {
                        self.inner.borrow_mut().positions.assigned_end -= count as u64;
                    }
                    for staged in batch {
                        staged.reply.send(Err(error.clone()));
                    }
                    if let LogError::Fenced(_) = error {
                        // (A failed commit hands back the batch it took ahead: `ahead` is None.)
                        let mut inner = self.inner.borrow_mut();
                        for staged in inner.staging.staged.drain(..) {
                            staged.reply.send(Err(error.clone()));
                        }
                        inner.staging.staged_bytes = 0;
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
                    inner.staging.staged_bytes += staged.records.len();
                    inner.staging.staged.push_front(staged);
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
                self.inner.borrow_mut().staging.commits_built_ahead += 1;
                (prepared.place, prepared.buffer, prepared.writing)
            }
            None => {
                // The offsets are given here, as the batch is built, not when the appends were
                // queued: a commit that fails before its write (a full disk) then leaves no
                // gap, and the appends behind it take its offsets. A follower's append came
                // with its offsets, which must still be the log's next.
                let durable_end = self.inner.borrow().positions.durable_end;
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
        // Offsets only grow, without a gap: commits complete in the order of their offsets, each
        // starting where the one before ended (a truncation moves the durable end back first).
        assert_eq!(
            base_offset, inner.positions.durable_end,
            "a commit that does not start at the durable end"
        );
        inner.positions.durable_end = entry.header.end_offset();
        inner.idle_sweeps = 0;
        if inner.config.tail_cache_bytes_max > 0 {
            // Commits complete in order, so the cache stays sorted by base offset for
            // `hold_batch_at`'s search.
            assert!(inner.cache.tail_cache.back().is_none_or(|(newest, _)| *newest < base_offset));
            inner.cache.tail_cache.push_back((base_offset, buffer));
            inner.cache.tail_cache_bytes += disk_bytes;
            if let Some(budget) = &inner.config.tail_cache_budget {
                budget.charge(disk_bytes);
            }
        }
        loop {
            let over_budget = inner.config.tail_cache_budget.as_ref().is_some_and(|budget| budget.over());
            // The newest batch stays unless the shard's budget is spent: a reader that keeps up
            // reads it from memory.
            let keep = if over_budget { 0 } else { 1 };
            if inner.cache.tail_cache.len() <= keep
                || (!over_budget && inner.cache.tail_cache_bytes <= inner.config.tail_cache_bytes_max)
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
            inner.positions.written_end = base_offset + count as u64;
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
        let waiting = |inner: &LogInner<S>| inner.staging.staged_bytes > 0;
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
                .staging
                .staged
                .front()
                .and_then(|staged| staged.first_offset)
                .is_some_and(|first| first != next.base_offset)
            {
                return None;
            }
            inner.staging.staged_bytes -= take_bytes;
            inner.staging.staged.drain(..take).collect()
        };
        let count: u32 = batch.iter().map(|staged| staged.record_count).sum();
        let buffer = Rc::new(self.build_batch(&batch, count, next, true));
        let writing = spawn_writes(targets, &buffer, next.position);
        Some((batch, Prepared { place: next, buffer, writing }))
    }
}
