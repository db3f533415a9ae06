//! Segments and the manifest: step 3 of the durability contract (`log`'s documentation). A
//! roll (`roll`) creates the next segment in every copy that takes writes (or renames a spare,
//! a recycled file or the reserve into place, `space`), makes its name durable, and lists it
//! in a manifest durable on ⌈M/2⌉ copies (`write_manifest`, one at a time) before anything is
//! written into it. Also the segments' files: their folders, and closing and reopening them
//! for a log that saves descriptors (`ensure_open`).

use super::*;
use crate::ids::Offset;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BatchEntry {
    pub(super) header: BatchHeader,
    pub(super) position: u64,
}

pub(super) struct Segment<S: Storage> {
    pub(super) base_offset: u64,
    /// Publish time of the newest record, for time-based retention.
    pub(super) newest_publish_ms: u64,
    pub(super) capacity: u64,
    pub(super) write_position: u64,
    /// The files were a deleted segment's (see `remove_oldest`): bytes of their earlier life
    /// may follow this segment's batches, and the manifest says so.
    pub(super) recycled: bool,
    pub(super) batches: Vec<BatchEntry>,
    /// The segment's file in each data directory (None where the copy is missing or fenced).
    pub(super) files: Vec<Option<Rc<S::File>>>,
    /// Set while the files are closed to save descriptors: which copies have the file, to
    /// reopen on the next use (`ensure_open`).
    pub(super) closed: Option<Vec<bool>>,
}

impl<S: Storage> Segment<S> {
    /// Drops this log's handles on the segment's files; in-flight reads and writes keep theirs.
    pub(super) fn close_files(&mut self) {
        if self.closed.is_none() {
            self.closed = Some(self.files.iter().map(Option::is_some).collect());
            for file in self.files.iter_mut() {
                *file = None;
            }
        }
    }
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

pub(super) fn segment_name(base_offset: u64) -> String {
    format!("{base_offset:020}.seg")
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

impl<S: Storage> LogInner<S> {
    /// The end of the last whole batch at or below `offset`.
    pub(super) fn batch_end_at_or_below(&self, offset: u64) -> u64 {
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
}

impl<S: Storage> Log<S> {
    pub fn keeps_files_open(&self) -> bool {
        self.inner.borrow().config.keep_files_open
    }

    pub(super) fn segment_is_closed(&self, segment_index: usize) -> bool {
        self.inner.borrow().segments.get(segment_index).is_some_and(|segment| segment.closed.is_some())
    }

    /// Reopens a segment's files if they were closed to save descriptors.
    pub(super) async fn ensure_open(&self, segment_index: usize) -> Result<(), LogError> {
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

    pub(super) fn folder(&self, copy: usize) -> PathBuf {
        self.directories.path(copy).join(&self.inner.borrow().relative)
    }

    /// Writes the next manifest (the current segment list) to every writable copy; it must be
    /// durable on ⌈M/2⌉ of them.
    pub(super) async fn write_manifest(&self) -> Result<(), LogError> {
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
                promised_epoch: inner.epochs.promised_epoch,
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

    /// Whether the log never held anything: no segment on disk, nothing written. Opening it
    /// again finds it just the same.
    pub fn is_empty(&self) -> bool {
        let inner = self.inner.borrow();
        inner.segments.is_empty() && inner.positions.durable_end == 0 && inner.staging.staged.is_empty()
    }

    /// Whether nothing of the log is on disk at all: it is empty and no manifest of it was
    /// ever written, so it records no promise, truncation or removed segment either. Such a
    /// log is what `Log::new_empty` makes, and may be dropped and made again that way.
    pub fn is_pristine(&self) -> bool {
        self.is_empty() && self.inner.borrow().manifest_sequence == 0 && self.is_fenced().is_none()
    }

    /// Makes a log that never held anything (`is_empty`) start at `offset`: its first segment
    /// is made there and listed in the manifest, so a recovery finds it starting there too, as
    /// it finds a log whose older segments retention removed. For a new replica whose leader's
    /// log no longer starts at 0: nothing below `offset` exists anywhere to copy. Everything
    /// below it counts as committed (there is nothing).
    pub async fn start_at(&self, offset: Offset) -> Result<(), LogError> {
        let offset = offset.get();
        {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            let untouched = inner.segments.is_empty()
                && inner.positions.durable_end == 0
                && inner.positions.assigned_end == 0
                && inner.staging.staged.is_empty()
                && !inner.flushing
                && !inner.truncating;
            if !untouched {
                return Err(LogError::Refused(format!(
                    "a log that holds records cannot start again at offset {offset}"
                )));
            }
            inner.positions.committed_end = offset;
            inner.positions.durable_end = offset;
            inner.positions.written_end = offset;
            inner.positions.assigned_end = offset;
            inner.check_positions();
        }
        if let Err(error) = self.roll(0).await {
            let mut inner = self.inner.borrow_mut();
            if inner.segments.is_empty() {
                inner.positions.committed_end = 0;
                inner.positions.durable_end = 0;
                inner.positions.written_end = 0;
                inner.positions.assigned_end = 0;
            }
            return Err(error);
        }
        Ok(())
    }

    /// Creates the next segment in every writable copy, then lists it in the manifest. Order
    /// matters for crash safety: the file is allocated and synced, and its directory entry and
    /// the manifest made durable, before anything in it is acknowledged.
    pub(super) async fn roll(&self, at_least_bytes: u64) -> Result<(), LogError> {
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
            (next.max(at_least_bytes), inner.positions.durable_end)
        };
        // The reserve (`LogConfig::reserve`) is for a disk without room for this segment: a
        // roll that the free space says cannot be allocated takes it at once, and one whose
        // allocation fails with ENOSPC takes it then (below).
        let reserve_fits = |reserve: &Option<Box<Reserve>>| {
            reserve.as_ref().filter(|reserve| reserve.capacity >= at_least_bytes).map(|reserve| **reserve)
        };
        let mut from_reserve =
            reserve_fits(&self.inner.borrow().kept.reserve).filter(|_| free_bytes < capacity);
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
                if let Some(reserve) = inner.kept.reserve.as_mut() {
                    reserve.copies &= !reserve_copies;
                }
                if inner.kept.reserve.as_ref().is_some_and(|reserve| reserve.copies == 0) {
                    inner.kept.reserve = None;
                }
            }
            // The disk has no room after all: the reserve, if there is one, instead.
            let retry = created < quorum
                && renamed.is_none()
                && from_reserve.is_none()
                && failed.is_empty()
                && !full.is_empty();
            if let Some(reserve) = reserve_fits(&self.inner.borrow().kept.reserve).filter(|_| retry) {
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
    pub(super) fn warn_buffered(&self, copy: usize) {
        if std::mem::replace(&mut self.inner.borrow_mut().warned_buffered, true) {
            return;
        }
        warn_buffered_directory(self.directories.path(copy));
    }
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
