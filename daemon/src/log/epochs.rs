//! Epochs and truncation, for a replicated log: the epoch of the leader's appends
//! (`set_epoch`), where each epoch begins (`epoch_history`), a fencing round's promise
//! (`promise_epoch`, durable in the manifest: no append of an older leader is taken after it),
//! and the removal of an uncommitted tail that a new leader never had (`truncate_after`, step 5
//! of the recovery rules: the manifest marks the cut before anything is zeroed).

use super::*;
use crate::ids::{Epoch, Offset};

/// The epoch of a standalone node's batches (`Log::set_epoch` gives another): a node that is
/// a cluster of one is the leader of one term.
pub const STANDALONE_EPOCH: u64 = 1;

/// A log's epochs: the order of its leaders' terms, which no append may go back on.
pub(super) struct Epochs {
    /// The epoch of the leader's appends (`append`): `STANDALONE_EPOCH` unless set.
    pub(super) epoch: u64,
    /// The epoch of the last batch written or queued: no later batch may have an older one.
    pub(super) last_epoch: u64,
    /// The epoch this log promised (`promise_epoch`, kept in the manifest): appends of an older
    /// one are refused. 0: none.
    pub(super) promised_epoch: u64,
    /// The promise the manifest holds durably (`promise_epoch` writes it once).
    pub(super) promised_durable: u64,
}

impl<S: Storage> LogInner<S> {
    /// The epoch of the last batch indexed (`EPOCH_NONE` without one).
    fn last_indexed_epoch(&self) -> u64 {
        self.segments
            .iter()
            .rev()
            .find_map(|segment| segment.batches.last())
            .map_or(record::EPOCH_NONE, |entry| entry.header.epoch)
    }
}

impl<S: Storage> Log<S> {
    /// The epoch of the log's last batch, queued or written (`record::EPOCH_NONE` for none, or
    /// for batches written before epochs).
    pub fn last_epoch(&self) -> Epoch {
        Epoch::new(self.inner.borrow().epochs.last_epoch)
    }

    /// Sets the epoch of the leader's appends (`append`). Refused when older than the epoch of
    /// the log's last batch, or 0 (the epoch of batches written before epochs).
    pub fn set_epoch(&self, epoch: Epoch) -> Result<(), LogError> {
        let epoch = epoch.get();
        let mut inner = self.inner.borrow_mut();
        if epoch == record::EPOCH_NONE || epoch < inner.epochs.last_epoch.max(inner.epochs.promised_epoch) {
            return Err(LogError::Refused(format!(
                "epoch {epoch}: the log's last batch is of epoch {} and it promised epoch {}",
                inner.epochs.last_epoch, inner.epochs.promised_epoch
            )));
        }
        inner.epochs.epoch = epoch;
        Ok(())
    }

    /// Where each epoch begins among this log's durable batches, for a follower and its leader
    /// to find where their logs part (`replication::divergence`) without comparing records.
    /// Batches written before epochs (epoch 0) and segments retention removed are not in it.
    pub fn epoch_history(&self) -> crate::replication::EpochHistory {
        let inner = self.inner.borrow();
        let mut history = crate::replication::EpochHistory::default();
        let durable = inner.segments.iter().flat_map(|segment| segment.batches.iter());
        for entry in durable.take_while(|entry| entry.header.end_offset() <= inner.positions.durable_end) {
            if entry.header.epoch != record::EPOCH_NONE && entry.header.record_count > 0 {
                history.appended(Epoch::new(entry.header.epoch), Offset::new(entry.header.base_offset));
            }
        }
        history
    }

    /// The epoch promised (`promise_epoch`); 0 if none.
    pub fn promised_epoch(&self) -> Epoch {
        Epoch::new(self.inner.borrow().epochs.promised_epoch)
    }

    /// A replica's part in a fencing round before a new leader is chosen: from now on, and
    /// across restarts, no append of an epoch older than `epoch` is taken. The appends queued
    /// before the promise are let through to their commits and waited for, and the promise is
    /// made durable in the manifest; then the log answers its last epoch and durable end, so
    /// the answer holds every record a deposed leader could still count as replicated here
    /// (one queued earlier is durable by then and in it; any later one is refused). A promise
    /// at or below one made before only waits and answers.
    pub async fn promise_epoch(&self, epoch: Epoch) -> Result<(Epoch, Offset), LogError> {
        let epoch = epoch.get();
        {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            inner.epochs.promised_epoch = inner.epochs.promised_epoch.max(epoch);
        }
        while self.inner.borrow().flushing {
            crate::runtime::sleep(REMOVAL_WAIT).await;
        }
        // A promise made durable before needs no write again (a fencing round retried).
        let promised = self.inner.borrow().epochs.promised_epoch;
        if promised > self.inner.borrow().epochs.promised_durable {
            self.write_manifest().await?;
            let mut inner = self.inner.borrow_mut();
            inner.epochs.promised_durable = inner.epochs.promised_durable.max(promised);
        }
        let inner = self.inner.borrow();
        if let Some(why) = &inner.fenced {
            return Err(LogError::Fenced(why.clone()));
        }
        Ok((Epoch::new(inner.epochs.last_epoch), Offset::new(inner.positions.durable_end)))
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
    pub async fn truncate_after(&self, end: Offset) -> Result<(), LogError> {
        let end = end.get();
        {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            if inner.truncating || inner.closed_for_removal {
                return Err(LogError::Refused("the log is being truncated or removed".into()));
            }
            if end < inner.positions.committed_end {
                return Err(LogError::Refused(format!(
                    "a truncation at offset {end}: offsets up to {} are committed",
                    inner.positions.committed_end
                )));
            }
            inner.truncating = true;
            let refused = LogError::Refused(format!("the log's tail was truncated at offset {end}"));
            for staged in std::mem::take(&mut inner.staging.staged) {
                inner.positions.assigned_end -= staged.record_count as u64;
                staged.reply.send(Err(refused.clone()));
            }
            inner.staging.staged_bytes = 0;
        }
        while self.inner.borrow().flushing {
            crate::runtime::sleep(REMOVAL_WAIT).await;
        }
        // Committed meanwhile, past the cut (a commit point taken while the writes in flight
        // ended): refused as at the start, or a committed record would go.
        let committed_end = self.inner.borrow().positions.committed_end;
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
            if end > inner.positions.durable_end || inner.batch_end_at_or_below(end) != end {
                return Err(LogError::Refused(format!(
                    "a truncation at offset {end}: not the end of a batch at or below the durable end {}",
                    inner.positions.durable_end
                )));
            }
            if end == inner.positions.durable_end {
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
        while inner.cache.tail_cache.back().is_some_and(|(base, _)| *base >= end) {
            let (_, old) = inner.cache.tail_cache.pop_back().unwrap();
            let bytes = old.bytes().len();
            inner.cache.tail_cache_bytes -= bytes;
            if let Some(budget) = &inner.config.tail_cache_budget {
                budget.refund(bytes);
            }
        }
        inner.drop_read_ahead();
        inner.positions.durable_end = end;
        inner.positions.written_end = end;
        inner.positions.assigned_end = end;
        inner.epochs.last_epoch = inner.last_indexed_epoch();
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
}
