//! Disk space kept ahead of the rolls: the spare (the next segment, zero-filled in the
//! background, `LogConfig::prewrite`), the recycled file (a deleted segment's file kept for the
//! next roll, `LogConfig::recycle`) and the reserve (a segment allocated for a full disk,
//! `LogConfig::reserve`). None of them is ever named a segment before a roll renames it into
//! place, so recovery removes what a crash leaves of a spare or a recycled file and keeps a
//! whole reserve. A shard keeps at most `SPARES_PER_SHARD_MAX` spares and
//! `RECYCLED_PER_SHARD_MAX` recycled files (`ShardPlace`, counted in the shard's `Directories`).

use super::*;

/// The next segment of a log, being zero-filled in the background (`LogConfig::prewrite`).
pub(super) struct Spare<S: Storage> {
    capacity: u64,
    /// Set to make the zero-filling stop after the write in flight.
    stop: Rc<std::cell::Cell<bool>>,
    /// Ends with the spare's file in each copy it could be prepared in.
    task: crate::runtime::Task<Vec<Option<Rc<S::File>>>>,
    /// Held until the spare is used or removed.
    _place: ShardPlace,
}

/// A file in each copy (None where a copy has none).
pub(super) type CopyFiles<S> = Vec<Option<Rc<<S as Storage>::File>>>;

/// The segment a log keeps allocated for a full disk (`LogConfig::reserve`): its size, and the
/// copies holding it (bit `copy`; `DATA_DIRECTORIES_MAX` fits a word). Its files are closed:
/// a journal that closes its segments to save descriptors holds none for its reserve either.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reserve {
    pub(super) capacity: u64,
    pub(super) copies: u64,
}

const _: () = assert!(DATA_DIRECTORIES_MAX <= u64::BITS as usize, "a reserve's copies are bits of a u64");

/// A deleted segment's file kept under `RECYCLE_NAME` in each copy for the next roll
/// (`LogConfig::recycle`).
pub(super) struct Recycled<S: Storage> {
    pub(super) capacity: u64,
    files: CopyFiles<S>,
    _place: ShardPlace,
}

/// The files a log keeps ahead of its rolls, each boxed: most logs (idle topics) never have
/// one, and each costs a word. (Whether a roll recycled and whether a reserve is being taken
/// are `LogInner::rolled` and `LogInner::reserving`.)
pub(super) struct Kept<S: Storage> {
    pub(super) spare: Option<Box<Spare<S>>>,
    /// The base offset of the active segment a spare was last started for (`u64::MAX`: none):
    /// one per segment, even if it could not be used.
    pub(super) spare_started_for: u64,
    /// Only busy logs keep one.
    pub(super) recycled: Option<Box<Recycled<S>>>,
    /// Only journals keep one (`LogConfig::reserve`).
    pub(super) reserve: Option<Box<Reserve>>,
}

impl<S: Storage> Kept<S> {
    pub(super) fn new() -> Kept<S> {
        Kept { spare: None, spare_started_for: u64::MAX, recycled: None, reserve: None }
    }
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

/// The name a reserve is allocated under before it is renamed to `RESERVE_NAME`, so that a
/// reserve under its name is always whole. Recovery removes it.
pub const RESERVE_MAKING_NAME: &str = "reserve.new";

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
pub(super) async fn find_reserve<S: Storage>(
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

/// The spares and recycled files the logs of one shard keep. The shard's `Directories`, which
/// every log of the shard shares, holds it, so that shards a simulation runs on one thread keep
/// theirs apart.
#[derive(Default)]
pub(super) struct KeptFiles {
    spares: std::cell::Cell<usize>,
    recycled: std::cell::Cell<usize>,
}

impl KeptFiles {
    /// Spares and recycled files kept now.
    pub(super) fn count(&self) -> usize {
        self.spares.get() + self.recycled.get()
    }
}

/// One of a shard's places for a spare (`SPARES_PER_SHARD_MAX`) or a recycled file
/// (`RECYCLED_PER_SHARD_MAX`), given back when dropped.
struct ShardPlace {
    directories: Rc<Directories>,
    recycled: bool,
}

impl ShardPlace {
    fn take(directories: &Rc<Directories>, recycled: bool) -> Option<ShardPlace> {
        let (count, max) = ShardPlace::count_and_max(directories, recycled);
        (count.get() < max).then(|| {
            count.set(count.get() + 1);
            ShardPlace { directories: directories.clone(), recycled }
        })
    }

    fn count_and_max(directories: &Directories, recycled: bool) -> (&std::cell::Cell<usize>, usize) {
        let kept = directories.kept_files();
        if recycled {
            (&kept.recycled, RECYCLED_PER_SHARD_MAX)
        } else {
            (&kept.spares, SPARES_PER_SHARD_MAX)
        }
    }

    fn spare(directories: &Rc<Directories>) -> Option<ShardPlace> {
        ShardPlace::take(directories, false)
    }

    fn recycled(directories: &Rc<Directories>) -> Option<ShardPlace> {
        ShardPlace::take(directories, true)
    }
}

impl Drop for ShardPlace {
    fn drop(&mut self) {
        let (count, _) = ShardPlace::count_and_max(&self.directories, self.recycled);
        assert!(count.get() > 0, "a kept file's place is counted");
        count.set(count.get() - 1);
    }
}

impl<S: Storage> Log<S> {
    /// Starts zero-filling the next segment once the active one is half full (see
    /// `LogConfig::prewrite`).
    pub(super) fn start_spare_if_due(&self) {
        let (capacity, place) = {
            let mut inner = self.inner.borrow_mut();
            if !inner.config.prewrite || !inner.config.keep_files_open || inner.kept.spare.is_some() {
                return;
            }
            // A recycled file of the largest size serves any roll the spare would.
            if inner.kept.recycled.is_some() {
                return;
            }
            let Some(segment) = inner.segments.last() else { return };
            if segment.write_position * 2 < segment.capacity
                || inner.kept.spare_started_for == segment.base_offset
            {
                return;
            }
            let capacity = (segment.capacity * 2).min(inner.config.segment_bytes_max).max(segment.capacity);
            // Without a place now, a later commit into this segment tries again.
            let Some(place) = ShardPlace::spare(&self.directories) else { return };
            inner.kept.spare_started_for = segment.base_offset;
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
                inner.staging.staged_bytes * 4 >= inner.config.group_commit_bytes_max
            })
        };
        let task =
            crate::runtime::spawn(prewrite_spare(self.storage.clone(), paths, capacity, stop.clone(), busy));
        self.inner.borrow_mut().kept.spare = Some(Box::new(Spare { capacity, stop, task, _place: place }));
    }

    /// Stops the zero-filling of the spare, if any, and hands over its capacity and files.
    async fn take_spare(&self) -> Option<(u64, Vec<Option<Rc<S::File>>>)> {
        let spare = self.inner.borrow_mut().kept.spare.take()?;
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
            .kept
            .reserve
            .as_ref()
            .is_some_and(|reserve| writable.iter().all(|copy| reserve.copies & (1 << copy) != 0))
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
        inner.kept.reserve = found.map(Box::new);
        inner.reserving = false;
        made
    }

    /// Bytes a new segment may take in the copies given: the free space of the one with the
    /// ⌈M/2⌉-th most, since a segment needs only a quorum of copies (a full one is fenced).
    /// Where the storage cannot tell, as much as anyone asks.
    pub(super) fn free_bytes_for_segment(&self, copies: &[usize]) -> u64 {
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
        let recycled = self.inner.borrow_mut().kept.recycled.take();
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

    /// The file a roll renames into place instead of creating one, if it has one that fits
    /// `capacity` (which becomes the file's) in every copy in `copies`: the recycled file
    /// (`LogConfig::recycle`), or else the spare (`LogConfig::prewrite`). Returns it, by copy,
    /// with the name it has, and whether it is the recycled one. What does not fit goes.
    pub(super) async fn take_kept_file(
        &self,
        copies: &[usize],
        capacity: &mut u64,
    ) -> (Option<(&'static str, CopyFiles<S>)>, bool) {
        let mut renamed: Option<(&'static str, CopyFiles<S>)> = None;
        let mut recycled = false;
        // A recycled file goes first: its blocks are written ones, where a spare's are only
        // as far as its zero-filling got. One large enough and in every copy that takes writes
        // is renamed into place; one too small waits for a roll it fits.
        let kept = self.inner.borrow_mut().kept.recycled.take();
        if let Some(kept) = kept {
            if kept.capacity < *capacity {
                self.inner.borrow_mut().kept.recycled = Some(kept);
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

    /// Keeps the newest of `removed` that the next roll can take as its segment
    /// (`LogConfig::recycle`): renamed to `RECYCLE_NAME` in every copy, with its files open.
    /// Called once the manifest without it is durable; a crash at any point leaves either
    /// name, and recovery removes both. Its entry in `removed` loses its files, so the caller
    /// deletes only the others.
    pub(super) fn recycle_one_of(&self, removed: &mut [Segment<S>]) {
        let segment_bytes_max = {
            let inner = self.inner.borrow();
            if !inner.config.recycle || !inner.config.keep_files_open || inner.kept.recycled.is_some() {
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
        let Some(place) = ShardPlace::recycled(&self.directories) else { return };
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
        self.inner.borrow_mut().kept.recycled =
            Some(Box::new(Recycled { capacity: segment.capacity, files, _place: place }));
    }

    /// Whether the log keeps a deleted segment's file for its next roll.
    pub fn keeps_a_recycled_file(&self) -> bool {
        self.inner.borrow().kept.recycled.is_some()
    }

    /// Whether the log rolled since the last call, for a log that recycles: its owner then
    /// deletes what no one needs any more, so that the next roll finds a file to recycle.
    pub fn take_rolled(&self) -> bool {
        std::mem::take(&mut self.inner.borrow_mut().rolled)
    }
}
