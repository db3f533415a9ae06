//! Small ext4 filesystems on loop devices, for tests of full and failing disks.
//!
//! Needs root and loop-device support (this project's machines and CI have both). Without
//! them a test panics with a clear message rather than passing silently.

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// An image file of a few MiB under the test's temporary directory, formatted as ext4 and
/// loop-mounted. Dropping it unmounts it (retrying, then lazily) and removes the image.
pub struct LoopFilesystem {
    directory: PathBuf,
    image: PathBuf,
    mount_point: PathBuf,
}

/// `EXT4_IOC_SHUTDOWN` (`_IOR('X', 125, __u32)`, the same number as XFS's GOINGDOWN).
const EXT4_IOC_SHUTDOWN: u64 = 0x8004_587D;
/// Shut down at once, without flushing the journal: as if the disk died.
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// The path of a system tool: from PATH, or from the sbin directories a non-login root shell
/// may not have on its PATH.
fn tool(name: &str) -> PathBuf {
    let mut candidates: Vec<PathBuf> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).map(|d| d.join(name)).collect();
    candidates.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(name)));
    candidates.into_iter().find(|path| path.is_file()).unwrap_or_else(|| PathBuf::from(name))
}

fn run(name: &str, args: &[&std::ffi::OsStr]) -> std::io::Result<Output> {
    Command::new(tool(name)).args(args).output()
}

fn describe(output: &std::io::Result<Output>) -> String {
    match output {
        Ok(output) => format!(
            "{}: {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(error) => format!("could not run: {error}"),
    }
}

fn succeeded(output: &std::io::Result<Output>) -> bool {
    output.as_ref().is_ok_and(|output| output.status.success())
}

impl LoopFilesystem {
    /// Creates, formats and mounts a filesystem of `mebibytes` MiB. Panics (loudly) when that
    /// is impossible here: not root, no loop devices, no mkfs.ext4.
    pub fn create(label: &str, mebibytes: u64) -> LoopFilesystem {
        let directory = crate::temporary_directory(label);
        let image = directory.join("image.ext4");
        let mount_point = directory.join("mnt");
        std::fs::create_dir_all(&mount_point).expect("creating the mount point");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(mebibytes << 20))
            .expect("creating the filesystem image");
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { nix::libc::geteuid() };
        let unavailable = |what: &str, detail: String| -> ! {
            let message = format!(
                "LOOP FILESYSTEM UNAVAILABLE: {what} failed ({detail}). These tests need root, loop devices and \
                 mkfs.ext4 (euid is {euid}); they fail rather than pass without testing anything."
            );
            eprintln!("{message}");
            let _ = std::fs::remove_dir_all(&directory);
            panic!("{message}");
        };
        if euid != 0 {
            unavailable("mounting a loop filesystem", "not running as root".into());
        }
        let mkfs = run("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), image.as_os_str()]);
        if !succeeded(&mkfs) {
            unavailable(&format!("mkfs.ext4 -q -F {}", image.display()), describe(&mkfs));
        }
        // Tests run in parallel: two mounts may race for the same free loop device, so a failed
        // mount is retried a few times before it counts.
        let mount_once =
            || run("mount", &["-o".as_ref(), "loop".as_ref(), image.as_os_str(), mount_point.as_os_str()]);
        let mut mount = mount_once();
        for attempt in 1..5 {
            if succeeded(&mount) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100 * attempt));
            mount = mount_once();
        }
        if !succeeded(&mount) {
            unavailable(
                &format!("mount -o loop {} {}", image.display(), mount_point.display()),
                describe(&mount),
            );
        }
        LoopFilesystem { directory, image, mount_point }
    }

    /// The mount point: the root of the filesystem.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// Bytes root may still allocate (root may use the blocks ext4 reserves, and the daemon
    /// runs as root here).
    pub fn free_bytes(&self) -> u64 {
        let stats = nix::sys::statvfs::statvfs(&self.mount_point).expect("statvfs of a loop filesystem");
        stats.blocks_free() as u64 * stats.fragment_size() as u64
    }

    /// `mount -o remount,ro`. The kernel refuses (EBUSY, "mount point is busy") while any file
    /// on the filesystem is open for writing, which a running ringpostd always has (its LOCK
    /// file, its open segments): to make a disk fail under a running daemon use `shut_down`.
    pub fn remount_read_only(&self) -> Result<(), String> {
        let output = run("mount", &["-o".as_ref(), "remount,ro".as_ref(), self.mount_point.as_os_str()]);
        if succeeded(&output) {
            Ok(())
        } else {
            Err(describe(&output))
        }
    }

    /// Shuts the filesystem down (ext4's `EXT4_IOC_SHUTDOWN`, without flushing the journal):
    /// from now on every write, fdatasync, open and read on it fails with EIO, as if the disk
    /// died. Works with files open for writing, unlike a read-only remount.
    pub fn shut_down(&self) {
        let root = std::fs::File::open(&self.mount_point).expect("opening the mount point");
        let mut flags: u32 = EXT4_GOING_FLAGS_NOLOGFLUSH;
        // SAFETY: the ioctl reads one u32 through the pointer, which is valid for the call.
        let result =
            unsafe { nix::libc::ioctl(root.as_raw_fd(), EXT4_IOC_SHUTDOWN as _, &mut flags as *mut u32) };
        assert_eq!(
            result,
            0,
            "EXT4_IOC_SHUTDOWN on {} failed: {}",
            self.mount_point.display(),
            std::io::Error::last_os_error()
        );
    }

    /// Allocates a filler file until at most `leave_bytes` (plus one block) stay free; returns
    /// the bytes left free.
    pub fn fill(&self, leave_bytes: u64) -> u64 {
        use nix::fcntl::{fallocate, FallocateFlags};
        let path = self.mount_point.join("filler");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("creating the filler file");
        let block = nix::sys::statvfs::statvfs(&self.mount_point).unwrap().fragment_size() as u64;
        for _ in 0..64 {
            let free = self.free_bytes();
            if free <= leave_bytes + block {
                break;
            }
            let length = file.metadata().unwrap().len();
            let mut want = (free - leave_bytes) / block * block;
            // Extent blocks come out of the same free space: ask for less after ENOSPC.
            while want >= block {
                match fallocate(file.as_raw_fd(), FallocateFlags::empty(), length as i64, want as i64) {
                    Ok(()) => break,
                    Err(nix::errno::Errno::ENOSPC) => want /= 2,
                    Err(error) => panic!("fallocate of {} failed: {error}", path.display()),
                }
            }
            if want < block {
                break;
            }
        }
        file.sync_all().expect("syncing the filler file");
        self.free_bytes()
    }
}

impl Drop for LoopFilesystem {
    fn drop(&mut self) {
        let mut unmounted = false;
        for attempt in 0..5 {
            if succeeded(&run("umount", &[self.mount_point.as_os_str()])) {
                unmounted = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(200 * (attempt + 1)));
        }
        if !unmounted {
            let lazy = run("umount", &["-l".as_ref(), self.mount_point.as_os_str()]);
            if !succeeded(&lazy) {
                // Still mounted: removing the directory would delete inside the filesystem.
                eprintln!("could not unmount {}: {}", self.mount_point.display(), describe(&lazy));
                return;
            }
        }
        if std::thread::panicking() {
            eprintln!("kept filesystem image {} for inspection", self.image.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
    }
}
