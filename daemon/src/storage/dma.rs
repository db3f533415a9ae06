//! Production storage: glommio DMA files (O_DIRECT, io_uring).

use super::{IoBuffer, Storage, StorageFile};
use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::rc::Rc;

#[derive(Clone, Default)]
pub struct DmaStorage;

pub struct DmaStorageFile {
    file: DmaFile,
    direct_io: bool,
    writes_are_durable: bool,
}

impl IoBuffer for DmaBuffer {
    fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

fn to_io(error: glommio::GlommioError<()>) -> io::Error {
    match error {
        glommio::GlommioError::IoError(error) => error,
        glommio::GlommioError::EnhancedIoError { source, .. } => source,
        other => io::Error::other(other.to_string()),
    }
}

/// Whether `O_DIRECT` is set on the descriptor. glommio quietly opens files buffered on
/// filesystems without direct I/O (tmpfs), and then an fdatasync is the only durability we
/// have; the caller warns loudly.
fn has_o_direct(fd: i32) -> bool {
    has_flag(fd, nix::fcntl::OFlag::O_DIRECT)
}

fn has_flag(fd: i32, flag: nix::fcntl::OFlag) -> bool {
    match nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL) {
        Ok(flags) => nix::fcntl::OFlag::from_bits_truncate(flags).contains(flag),
        Err(_) => false,
    }
}

/// glommio decides once per block device whether to use its polled (IOPOLL) ring by reading
/// the first DMA file opened on it. If that file is empty the probe read succeeds trivially,
/// the device is marked pollable, and every later read fails with EOPNOTSUPP on devices that
/// do not support polling (seen on this machine's virtio disk). Opening a non-empty file first
/// makes the probe meaningful. Call once per data directory before opening any log file.
pub async fn warm_up_device_probe(directory: &Path, shard_name: &str) -> io::Result<()> {
    let path = directory.join(format!(".device-probe-{shard_name}"));
    match std::fs::write(&path, vec![0u8; 4096]) {
        Ok(()) => {
            let file = open_with(&path, false, 0).await?;
            let _ = file.file.close().await;
            std::fs::remove_file(&path)
        }
        // A full disk must not stop the daemon from starting: the user frees space through it
        // (acknowledging, deleting topics). Any non-empty file of ours makes the probe as well.
        Err(error) if error.raw_os_error() == Some(nix::libc::ENOSPC) => {
            let _ = std::fs::remove_file(&path);
            let Some(found) = non_empty_file_under(directory, PROBE_SEARCH_DEPTH_MAX) else {
                return Err(error);
            };
            let file = open_with(&found, false, 0).await?;
            let _ = file.file.close().await;
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// How deep `warm_up_device_probe` looks for a file of the daemon's when the disk is full: a
/// topic's segments are at `topics/<id>/messages/`, the catalog's at `catalog/`.
const PROBE_SEARCH_DEPTH_MAX: usize = 3;

/// A regular file under `directory`, at most `depth` folders down, whose first block holds
/// written data (SEEK_DATA finds data at 0): a file only fallocated reads as zeros without a
/// trip to the device, which would make the probe as meaningless as an empty file.
fn non_empty_file_under(directory: &Path, depth: usize) -> Option<std::path::PathBuf> {
    let mut entries: Vec<std::path::PathBuf> =
        std::fs::read_dir(directory).ok()?.flatten().map(|entry| entry.path()).collect();
    entries.sort();
    let mut folders = Vec::new();
    for path in entries {
        let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
        if metadata.is_dir() {
            folders.push(path);
        } else if metadata.is_file() && metadata.len() >= 4096 && data_at_start(&path) {
            return Some(path);
        }
    }
    if depth == 0 {
        return None;
    }
    folders.into_iter().find_map(|folder| non_empty_file_under(&folder, depth - 1))
}

/// Whether the file's first byte is in written data, by lseek SEEK_DATA.
fn data_at_start(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    matches!(nix::unistd::lseek(file.as_raw_fd(), 0, nix::unistd::Whence::SeekData), Ok(0))
}

/// Opens `path` as a DMA file, by descriptor. glommio's `DmaFile` open looks the path up a
/// second time after opening it (`statfs(path).unwrap()`, to tell a tmpfs) and panics when
/// the name went meanwhile, taking the shard's thread with it: any rename or unlink of the
/// name by another task of the shard during the open's awaits did that (the journal's reserve,
/// made twice at once, at 10,000 topics). So the path is opened once (a buffered open, which
/// looks nothing up again), and the DMA file is opened through the descriptor's name in
/// `/proc`, which names that file for as long as the descriptor is held, whatever happens to
/// `path`; the first descriptor is closed once the second is open. A vanished file is then an
/// error (`NotFound`) from the first open, never a panic. The price is a second open and a
/// close per file, microseconds beside the allocation or write that follows. Checking that the
/// path exists first would leave the window open; patching glommio would mean keeping a fork.
async fn open_with(path: &Path, create: bool, flags: i32) -> io::Result<DmaStorageFile> {
    let held =
        OpenOptions::new().read(true).write(true).create(create).buffered_open(path).await.map_err(to_io)?;
    let by_descriptor = descriptor_path(held.as_raw_fd());
    let opened = OpenOptions::new().read(true).write(true).custom_flags(flags).dma_open(&by_descriptor).await;
    // Closed whatever the second open did: the DMA file holds its own descriptor.
    let _ = held.close().await;
    let file = opened.map_err(|error| match to_io(error) {
        // The descriptor is held, so its name cannot be missing unless /proc is not mounted.
        error if error.kind() == io::ErrorKind::NotFound => io::Error::new(
            error.kind(),
            format!(
                "opening {} through {}: {error} (is /proc mounted?)",
                path.display(),
                by_descriptor.display()
            ),
        ),
        error => error,
    })?;
    let direct_io = has_o_direct(file.as_raw_fd());
    let writes_are_durable = has_flag(file.as_raw_fd(), nix::fcntl::OFlag::O_DSYNC);
    Ok(DmaStorageFile { file, direct_io, writes_are_durable })
}

/// The name `/proc` gives the file that descriptor `fd` of this process holds. By process id
/// rather than `self`: io_uring may run the open on one of its worker threads.
fn descriptor_path(fd: i32) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/{}/fd/{fd}", std::process::id()))
}

impl Storage for DmaStorage {
    type File = DmaStorageFile;
    type Buffer = DmaBuffer;

    /// Files are opened with O_DSYNC: a commit is then one write that completes once durable,
    /// instead of a write, its completion, and an fdatasync submitted after it (two trips
    /// through io_uring and its workers), which shortened the publish-ack latency (see
    /// benches/README.md, "DmaStorage::open").
    async fn open(&self, path: &Path, create: bool) -> io::Result<DmaStorageFile> {
        open_with(path, create, nix::libc::O_DSYNC).await
    }

    /// Without O_DSYNC: a spare's zero-filling would otherwise flush the device's cache after
    /// every chunk, in the way of the commits.
    async fn open_unsynced(&self, path: &Path, create: bool) -> io::Result<DmaStorageFile> {
        open_with(path, create, 0).await
    }

    /// A plain fsync(2) of the directory (glommio's `Directory::sync` fails with EBADF on this
    /// kernel), on the executor's blocking thread: a directory sync takes 100 µs or more, and
    /// a topic's first publish and first acknowledgement make several, which on the shard's
    /// own thread stalled every other topic of the shard meanwhile. One such thread per shard
    /// (glommio's default): more of them published less (see benches/README.md,
    /// "DmaStorage::sync_dir").
    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let path = path.to_path_buf();
        glommio::executor().spawn_blocking(move || std::fs::File::open(path)?.sync_all()).await
    }

    /// The mkdirs and the syncs of their parents, on the blocking thread in one trip.
    async fn create_dirs_durable(&self, paths: &[std::path::PathBuf]) -> io::Result<()> {
        if paths.iter().all(|path| path.exists()) {
            return Ok(());
        }
        let paths = paths.to_vec();
        glommio::executor()
            .spawn_blocking(move || {
                let parents = super::parents_to_sync(&paths, Path::exists);
                for path in &paths {
                    std::fs::create_dir_all(path)?;
                }
                for parent in &parents {
                    std::fs::File::open(parent)?.sync_all()?;
                }
                Ok(())
            })
            .await
    }

    fn alloc_buffer(&self, bytes: usize) -> DmaBuffer {
        // From the shard's registered I/O memory while it has room (`IO_MEMORY_BYTES_DEFAULT`
        // says what that saves), else from the heap: written batches stay in the tail cache
        // for readers, so the pool is often full of them. Not zeroed: every caller writes all
        // of it (a commit fills its padding), and zeroing 1 MiB per commit showed in profiles.
        glommio::allocate_dma_buffer(bytes)
    }

    /// On the blocking thread, which also frees what it allocates (a listing handed back
    /// to the shard moved the W4 memory figure: 050984d).
    async fn prefetch_dirs(&self, paths: &[std::path::PathBuf]) {
        let paths = paths.to_vec();
        glommio::executor()
            .spawn_blocking(move || {
                for path in &paths {
                    if let Ok(entries) = std::fs::read_dir(path) {
                        entries.for_each(drop);
                    }
                }
            })
            .await
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    /// statvfs(2) on the shard's thread: it reads the superblock's counters, kept in memory.
    /// What `df` shows as available, even for root: the blocks free beyond it are ext4's
    /// reserve for root (which the daemon, as root, may still take: an allocation decides)
    /// and blocks ext4 keeps back for its own metadata, which nobody can allocate (2% of the
    /// filesystem up to 4096 clusters: 1.3 MiB of a 64 MiB one), so that the free count
    /// overstates the room by that much and a segment sized by it would not fit.
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        let stats = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
        let blocks = stats.blocks_available();
        Ok((blocks as u64).saturating_mul(stats.fragment_size() as u64))
    }
}

impl StorageFile for DmaStorageFile {
    type Buffer = DmaBuffer;
    type Read = ReadResult;

    async fn write_at(&self, buffer: Rc<DmaBuffer>, position: u64) -> io::Result<()> {
        let length = buffer.len();
        let written = self.file.write_rc_at(buffer, position).await.map_err(to_io)?;
        if written != length {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {length} bytes at {position}"),
            ));
        }
        Ok(())
    }

    async fn read_at(&self, position: u64, bytes: usize) -> io::Result<ReadResult> {
        self.file.read_at_aligned(position, bytes).await.map_err(to_io)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(to_io)
    }

    async fn allocate(&self, bytes: u64) -> io::Result<()> {
        self.file.pre_allocate(bytes, false).await.map_err(to_io)
    }

    /// fstat(2) of the descriptor, on the shard's thread (the inode is in memory). glommio's
    /// `file_size` stats the path the file was opened by, which names the file no more once it
    /// is renamed (a spare or a reserve renamed into place) and, for a file opened by
    /// descriptor (`open_with`), names a descriptor closed since.
    async fn size(&self) -> io::Result<u64> {
        let stat = nix::sys::stat::fstat(self.file.as_raw_fd()).map_err(io::Error::from)?;
        Ok(stat.st_size as u64)
    }

    /// A plain lseek(2), on the shard's thread: it reads the file's extent map, which recovery
    /// has just had in use, and ext4 reports unwritten extents as holes.
    async fn data_from(&self, position: u64) -> io::Result<Option<u64>> {
        use nix::unistd::{lseek, Whence};
        let Ok(offset) = i64::try_from(position) else { return Ok(Some(position)) };
        match lseek(self.file.as_raw_fd(), offset, Whence::SeekData) {
            Ok(found) => Ok(Some(found as u64)),
            Err(nix::errno::Errno::ENXIO) => Ok(None),
            // A filesystem without SEEK_DATA: assume data.
            Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::EOPNOTSUPP) => Ok(Some(position)),
            Err(error) => Err(io::Error::from(error)),
        }
    }

    async fn truncate(&self, bytes: u64) -> io::Result<()> {
        self.file.truncate(bytes).await.map_err(to_io)
    }

    fn direct_io(&self) -> bool {
        self.direct_io
    }

    fn writes_are_durable(&self) -> bool {
        self.writes_are_durable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(future);
    }

    /// A folder of its own on the real filesystem (O_DIRECT; /tmp is often a tmpfs).
    fn scratch(label: &str) -> std::path::PathBuf {
        let path =
            std::path::PathBuf::from("/var/tmp").join(format!("ringpost-dma-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// A file opened by descriptor is the file, whatever happens to its name afterwards: its
    /// size is read from it after a rename (glommio's stat of the path found nothing), and it
    /// still takes writes once unlinked. A missing path is an error, not a panic.
    #[test]
    fn a_file_is_the_file_whatever_happens_to_its_name() {
        let folder = scratch("names");
        let moved = folder.clone();
        run(async move {
            let storage = DmaStorage;
            let path = moved.join("first");
            let file = storage.open(&path, true).await.unwrap();
            file.allocate(64 << 10).await.unwrap();
            assert!(file.writes_are_durable(), "opened without O_DSYNC");
            std::fs::rename(&path, moved.join("second")).unwrap();
            assert_eq!(file.size().await.unwrap(), 64 << 10, "the size after a rename");
            std::fs::remove_file(moved.join("second")).unwrap();
            let mut buffer = storage.alloc_buffer(4096);
            buffer.bytes_mut().fill(7);
            file.write_at(Rc::new(buffer), 0).await.unwrap();
            file.sync_data().await.unwrap();
            let missing = storage.open(&moved.join("never-made"), false).await.map(|_| ()).unwrap_err();
            assert_eq!(missing.kind(), io::ErrorKind::NotFound, "{missing}");
        });
        std::fs::remove_dir_all(&folder).unwrap();
    }

    /// Opened through its descriptor's name in /proc, a file on a tmpfs is still seen as one
    /// (glommio's statfs then names the file's filesystem, not /proc's): buffered, no O_DIRECT.
    #[test]
    fn a_tmpfs_file_is_still_told_from_a_disk_file() {
        let shm = Path::new("/dev/shm");
        let is_tmpfs = nix::sys::statfs::statfs(shm)
            .is_ok_and(|stats| stats.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if !is_tmpfs {
            eprintln!("skipped: /dev/shm is not a tmpfs here");
            return;
        }
        let path = shm.join(format!("ringpost-dma-tmpfs-{}", std::process::id()));
        let opened = path.clone();
        run(async move {
            let file = DmaStorage.open(&opened, true).await.unwrap();
            assert!(!file.direct_io(), "O_DIRECT reported on a tmpfs");
        });
        std::fs::remove_file(&path).unwrap();
    }
}
