//! The copies of a log, one per data directory: which take writes (`CopyStates`), fencing one
//! whose write, sync or read failed (`fence_copy`) or the whole log (`fence`), repairing a batch
//! from another copy (`repair`), and bringing a stale copy back while commits go on
//! (`resync_copy`): it is current only once it holds every batch (`Joining`).

use super::*;

/// Whether a copy of this log may take writes. A copy that missed a write stays stale until a
/// resync rewrites it, even if its directory is healthy again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CopyState {
    Current,
    Stale,
}

/// The state of each of a log's copies, one bit each (`DATA_DIRECTORIES_MAX` bounds them): a
/// vector cost every log 24 bytes and an allocation.
#[derive(Clone, Copy)]
pub(super) struct CopyStates {
    stale: u64,
    count: u8,
}

impl CopyStates {
    /// `count` is a `Directories::count()`, which `Directories::new` keeps within
    /// `DATA_DIRECTORIES_MAX`.
    pub(super) fn all_current(count: usize) -> CopyStates {
        CopyStates { stale: 0, count: count as u8 }
    }

    fn len(&self) -> usize {
        self.count as usize
    }

    pub(super) fn get(&self, copy: usize) -> CopyState {
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
pub(super) struct Joining {
    copies: u64,
    /// Writes issued while a copy was joining that did not go to it: (segment base, byte
    /// position, the copies it missed). At most `RESYNC_MISSED_MAX`.
    missed: Vec<(u64, u64, u64)>,
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

/// Which of a log's copies take writes: the current ones, and those joining (`Joining`).
pub(super) struct Copies {
    pub(super) states: CopyStates,
    /// Set while a resync brings copies back (see `Joining`).
    pub(super) joining: Option<Box<Joining>>,
}

impl<S: Storage> LogInner<S> {
    /// Marks a copy stale: it missed a write. One that was joining stops joining (its resync
    /// then fails: the copy needs another).
    pub(super) fn mark_stale(&mut self, copy: usize) {
        self.copies.states.set(copy, CopyState::Stale);
        if let Some(joining) = self.copies.joining.as_mut() {
            joining.copies &= !(1 << copy);
            if joining.copies == 0 {
                self.copies.joining = None;
            }
        }
    }

    /// Whether a copy takes writes: it is current, or joining (see `Joining`).
    fn takes_writes(&self, copy: usize) -> bool {
        self.copies.states.get(copy) == CopyState::Current
            || self.copies.joining.as_ref().is_some_and(|joining| joining.copies & (1 << copy) != 0)
    }

    /// The joining copies that a write to `targets` misses (0 with no copy joining).
    pub(super) fn joining_missed_by<F>(&self, targets: &[(usize, Rc<F>)]) -> u64 {
        let Some(joining) = self.copies.joining.as_ref() else { return 0 };
        let written = targets.iter().fold(0u64, |written, (copy, _)| written | 1 << copy);
        joining.copies & !written
    }
}

impl<S: Storage> Log<S> {
    /// Rewrites the batch at `position` of a segment in copy `to` with the bytes of copy `from`.
    /// Returns whether the copy was repaired; a copy that fails the repair is fenced.
    pub(super) async fn repair(
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

    /// Copies that take writes now.
    pub(super) fn writable_copies(&self) -> Vec<usize> {
        let mut inner = self.inner.borrow_mut();
        for copy in 0..inner.copies.states.len() {
            if self.directories.is_fenced(copy) {
                inner.mark_stale(copy);
            }
        }
        (0..inner.copies.states.len()).filter(|copy| inner.takes_writes(*copy)).collect()
    }

    pub(super) fn fence_copy(&self, copy: usize, why: &str) {
        self.directories.fence(copy, why);
        self.inner.borrow_mut().mark_stale(copy);
    }

    pub(super) fn fence(&self, why: String) -> LogError {
        let mut inner = self.inner.borrow_mut();
        crate::log_error!(
            "ringpostd: ERROR: fencing log {} ({}): {why}",
            inner.log_id,
            inner.relative.display()
        );
        inner.fenced = Some(why.clone());
        LogError::Fenced(why)
    }

    /// Notes a write issued to `targets` at `place` that misses a joining copy (see
    /// `Joining`). With no copy joining, which is the rule, this costs a look at one word.
    pub(super) fn note_missed(&self, place: Place, targets: &[(usize, Rc<S::File>)]) {
        let mut inner = self.inner.borrow_mut();
        let missed = inner.joining_missed_by(targets);
        if missed == 0 {
            return;
        }
        let joining = inner.copies.joining.as_mut().expect("a copy that missed a write is joining");
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
            if inner.copies.states.get(copy) == CopyState::Current {
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
            inner.copies.joining.get_or_insert_with(|| Box::new(Joining { copies: 0, missed: Vec::new() }));
        joining.copies |= 1 << copy;
        inner.positions.written_end
    }

    /// Makes a joining copy current: it holds every batch.
    fn finish_joining(&self, copy: usize) {
        let mut inner = self.inner.borrow_mut();
        if let Some(joining) = inner.copies.joining.as_mut() {
            joining.copies &= !(1 << copy);
            for (_, _, missed) in joining.missed.iter_mut() {
                *missed &= !(1 << copy);
            }
            joining.missed.retain(|(_, _, missed)| *missed != 0);
            if joining.copies == 0 {
                inner.copies.joining = None;
            }
        }
        inner.copies.states.set(copy, CopyState::Current);
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
        let in_flight = inner.positions.durable_end < inner.positions.written_end;
        let missed_by = |inner: &LogInner<S>, base: u64, position: u64| {
            inner.copies.joining.as_ref().is_some_and(|joining| {
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
        if inner.positions.durable_end < joined_at.min(inner.positions.written_end) {
            return ResyncWork::Wait;
        }
        // The writes noted as missing it whose batches are not indexed: in flight (at the
        // active segment's end), or gone (a truncation, a removed segment) with nothing to copy.
        let end = inner.end();
        let missed_in_flight = inner.copies.joining.as_ref().is_some_and(|joining| {
            joining.missed.iter().any(|(base, position, missed)| {
                missed & (1 << copy) != 0
                    && end.is_some_and(|end| end.segment_base == *base && end.position <= *position)
            })
        });
        if in_flight && missed_in_flight {
            return ResyncWork::Wait;
        }
        if let Some(joining) = inner.copies.joining.as_mut() {
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
                (0..inner.copies.states.len()).find(|other| {
                    *other != copy
                        && inner.copies.states.get(*other) == CopyState::Current
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
            if let Some(joining) = inner.copies.joining.as_mut() {
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
        self.inner.borrow().copies.states.get(copy) == CopyState::Stale
    }
}
