//! The storage seam. The log does all of its disk work through these traits: the production
//! implementation ([`dma::DmaStorage`]) uses glommio's O_DIRECT | O_DSYNC files on io_uring, and
//! [`sim::SimDisk`] keeps files in memory and can lose unsynced writes, tear writes and fail
//! calls. io_uring bypasses strace and LD_PRELOAD, so faults can only be injected here.
//!
//! Contract of every implementation:
//! 1. `write_at` is durable only after a later `sync_data` on the same file returns `Ok`, or,
//!    on a file whose `writes_are_durable` (O_DSYNC), once it returns `Ok`.
//! 2. A new name (created file or directory, rename, removal) is durable only after
//!    `sync_dir` of its directory returns `Ok`: ext4 without a journal (this machine's) keeps
//!    no order between a directory's entries and anything else.
//! 3. An error from `write_at` or `sync_data` means nothing about what reached the disk; the
//!    caller must not retry the sync and trust it (fsyncgate), but fence the file.
//! 4. Positions and lengths of `write_at`/`read_at` are multiples of `BLOCK_BYTES`.

pub mod dma;
pub mod sim;

use std::collections::BTreeSet;
use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Memory that can be written to a file opened for direct I/O: aligned to a block.
pub trait IoBuffer: 'static {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

#[allow(async_fn_in_trait)] // Shards are single-threaded: these futures are never sent.
pub trait Storage: Clone + 'static {
    type File: StorageFile<Buffer = Self::Buffer>;
    type Buffer: IoBuffer;

    /// Opens a file for direct reads and writes, creating it if asked.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;
    /// `open`, but with writes that are durable only once synced even where `open` makes them
    /// durable as they complete: for filling a file in bulk with one sync at the end.
    async fn open_unsynced(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        self.open(path, create).await
    }
    /// Makes the directory's entries (creations, renames, removals) durable.
    async fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// A buffer of `bytes` (a multiple of the block size) for `write_at`. Its contents are
    /// unspecified: the caller writes every byte it will write to disk.
    fn alloc_buffer(&self, bytes: usize) -> Self::Buffer;
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates the directory and its missing parents, and makes each new one's name durable
    /// (a `sync_dir` of the directory holding it), so that files made durable in it later are
    /// not lost with a directory entry that never reached the disk.
    async fn create_dir_durable(&self, path: &Path) -> io::Result<()> {
        self.create_dirs_durable(&[path.to_path_buf()]).await
    }
    /// `create_dir_durable` for several directories at once, syncing each parent once however
    /// many of its children are new (a topic's two folders share theirs).
    async fn create_dirs_durable(&self, paths: &[PathBuf]) -> io::Result<()> {
        create_dirs_durable_here(self, paths).await
    }
    /// Names of the entries of a directory, sorted.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Brings the directories' metadata into the kernel's cache without blocking the shard, so
    /// that the calls above find it there; nothing is returned, and missing ones are skipped.
    async fn prefetch_dirs(&self, _paths: &[PathBuf]) {}
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn exists(&self, path: &Path) -> bool;
    /// Bytes this process may still allocate on the filesystem holding `path` (statvfs): what
    /// the log sizes its next segment by, so that a nearly full disk still takes a smaller one.
    /// Advisory only: another writer may take the space before an allocation does, which then
    /// fails with ENOSPC as it would without this.
    fn free_bytes(&self, path: &Path) -> io::Result<u64>;
}

/// `Storage::create_dirs_durable` done with the storage's own calls, on the calling task.
pub async fn create_dirs_durable_here<S: Storage>(storage: &S, paths: &[PathBuf]) -> io::Result<()> {
    let parents = parents_to_sync(paths, |directory| storage.exists(directory));
    for path in paths {
        storage.create_dir_all(path)?;
    }
    for parent in &parents {
        storage.sync_dir(parent).await?;
    }
    Ok(())
}

/// The directories whose entries creating `paths` (and their missing ancestors) adds to, each
/// once: what must be synced to make the new names durable.
pub fn parents_to_sync(paths: &[PathBuf], exists: impl Fn(&Path) -> bool) -> BTreeSet<PathBuf> {
    let mut parents = BTreeSet::new();
    for path in paths {
        let mut current = Some(path.as_path());
        while let Some(directory) = current.filter(|directory| !directory.as_os_str().is_empty()) {
            if exists(directory) {
                break;
            }
            current = directory.parent();
            if let Some(parent) = current.filter(|parent| !parent.as_os_str().is_empty()) {
                parents.insert(parent.to_path_buf());
            }
        }
    }
    parents
}

#[allow(async_fn_in_trait)]
pub trait StorageFile: 'static {
    type Buffer: IoBuffer;
    type Read: Deref<Target = [u8]> + 'static;

    /// Writes the whole buffer at `position`. Not durable until `sync_data`.
    async fn write_at(&self, buffer: Rc<Self::Buffer>, position: u64) -> io::Result<()>;
    /// Reads up to `bytes` at `position`; fewer at the end of the file.
    async fn read_at(&self, position: u64, bytes: usize) -> io::Result<Self::Read>;
    /// fdatasync.
    async fn sync_data(&self) -> io::Result<()>;
    /// Reserves `bytes` for the file (fallocate), extending its size.
    async fn allocate(&self, bytes: u64) -> io::Result<()>;
    async fn size(&self) -> io::Result<u64>;
    /// Shrinks the file to `bytes` (ftruncate); not durable until synced.
    async fn truncate(&self, bytes: u64) -> io::Result<()>;
    /// The first position at or after `position` where the file may hold data (lseek
    /// SEEK_DATA: space only fallocated holds none), or None if it holds none there. Storage
    /// that cannot tell answers `position`.
    async fn data_from(&self, position: u64) -> io::Result<Option<u64>> {
        Ok(Some(position))
    }
    /// Whether writes really bypass the page cache (O_DIRECT took effect).
    fn direct_io(&self) -> bool;
    /// Whether a write completes only once it is durable (O_DSYNC: the data and the metadata
    /// needed to read it back, as an fdatasync after it would make them), so that no fdatasync
    /// needs to follow it.
    fn writes_are_durable(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_parent_of_a_new_directory_is_synced_once() {
        let existing = [PathBuf::from("/data"), PathBuf::from("/data/topics")];
        let exists = |path: &Path| existing.iter().any(|known| known == path);
        let paths = [PathBuf::from("/data/topics/7/messages"), PathBuf::from("/data/topics/7/journal")];
        let parents: Vec<PathBuf> = parents_to_sync(&paths, exists).into_iter().collect();
        assert_eq!(parents, vec![PathBuf::from("/data/topics"), PathBuf::from("/data/topics/7")]);
        assert!(parents_to_sync(&existing, exists).is_empty(), "nothing new, nothing to sync");
        let relative = [PathBuf::from("d0/topics")];
        let parents: Vec<PathBuf> = parents_to_sync(&relative, |_| false).into_iter().collect();
        assert_eq!(parents, vec![PathBuf::from("d0")], "a relative root has no parent to sync");
    }
}
