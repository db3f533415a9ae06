//! The M data directories of a shard and their health. Each log keeps one copy of every
//! segment in each directory; a commit is acknowledged when ⌈M/2⌉ copies have synced.
//!
//! A directory whose write or sync fails is *fenced*: it receives no more writes and counts for
//! nothing, because after a failed fsync the kernel may have dropped the pages and a later sync
//! would report success without them (fsyncgate). Only an explicit resync, which rewrites
//! every log's copy from healthy ones, brings it back.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Most data directories (M) a daemon keeps copies in: a log tracks its copies' states in one
/// 64-bit word, and M is odd. Far more than any machine has disks for.
pub const DATA_DIRECTORIES_MAX: usize = 63;

pub struct Directories {
    paths: Vec<PathBuf>,
    fenced: RefCell<Vec<Option<String>>>,
    repairs: Cell<u64>,
    /// The spares and recycled files the shard's logs keep in these directories.
    kept: super::space::KeptFiles,
}

impl Directories {
    pub fn new(paths: Vec<PathBuf>) -> Rc<Directories> {
        assert!(!paths.is_empty(), "at least one data directory");
        assert!(paths.len() <= DATA_DIRECTORIES_MAX, "at most {DATA_DIRECTORIES_MAX} data directories");
        let count = paths.len();
        Rc::new(Directories {
            paths,
            fenced: RefCell::new(vec![None; count]),
            repairs: Cell::new(0),
            kept: super::space::KeptFiles::default(),
        })
    }

    /// Spares and recycled files the shard's logs keep now (`SPARES_PER_SHARD_MAX`,
    /// `RECYCLED_PER_SHARD_MAX`).
    pub fn files_kept(&self) -> usize {
        self.kept.count()
    }

    pub(super) fn kept_files(&self) -> &super::space::KeptFiles {
        &self.kept
    }

    pub fn count(&self) -> usize {
        self.paths.len()
    }

    /// Copies that must be durable before an acknowledgement: ⌈M/2⌉.
    pub fn quorum(&self) -> usize {
        self.paths.len() / 2 + 1
    }

    pub fn path(&self, index: usize) -> &Path {
        &self.paths[index]
    }

    pub fn is_fenced(&self, index: usize) -> bool {
        self.fenced.borrow()[index].is_some()
    }

    pub fn fence(&self, index: usize, why: &str) {
        let mut fenced = self.fenced.borrow_mut();
        if fenced[index].is_none() {
            crate::log_error!(
                "ringpostd: ERROR: fencing data directory {} ({}): {why}; it takes no more writes until it is resynced",
                index,
                self.paths[index].display()
            );
            fenced[index] = Some(why.to_owned());
        }
    }

    pub fn unfence(&self, index: usize) {
        self.fenced.borrow_mut()[index] = None;
    }

    pub fn healthy_count(&self) -> usize {
        self.fenced.borrow().iter().filter(|fenced| fenced.is_none()).count()
    }

    /// Each directory with the reason it is fenced, if it is.
    pub fn status(&self) -> Vec<(PathBuf, Option<String>)> {
        self.paths.iter().cloned().zip(self.fenced.borrow().iter().cloned()).collect()
    }

    pub fn count_repair(&self) {
        self.repairs.set(self.repairs.get() + 1);
    }

    /// Bad copies of batches rewritten from good ones since start.
    pub fn repairs(&self) -> u64 {
        self.repairs.get()
    }
}

/// How often a data directory may be logged as full: a disk at the edge of full goes from full
/// to room and back as segments are deleted and allocated, and each turn would be a line.
pub const DISK_FULL_LINE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
/// Data directories whose space is tracked (`note_full`): more than any daemon has.
const SPACE_DIRECTORIES_REMEMBERED: usize = 64;

/// Where a data directory stands with its space, as the logs of every shard found it: one
/// record per directory for the whole process, so that a full disk is one line, not one per
/// shard or per refused publish.
struct Space {
    directory: PathBuf,
    /// A segment could not be allocated there for want of space, and none was since.
    full: bool,
    /// The last time it went full was logged (so its return is logged too).
    logged_full: bool,
    last_full_line: Option<std::time::Instant>,
    /// Allocations refused since the last line about the directory.
    refusals: u64,
    /// Lines logged: that it is full, that it has room again.
    lines: (u64, u64),
}

static SPACE: std::sync::Mutex<Vec<Space>> = std::sync::Mutex::new(Vec::new());
/// Whether any directory is full: the allocations that succeed look at this word only.
static ANY_FULL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A segment could not be allocated in `directory` (a data directory's root) for want of space
/// (ENOSPC, EDQUOT), and the publish or acknowledgement that needed it was refused. Logged at
/// ERROR once when it goes full, at most once per `DISK_FULL_LINE_INTERVAL`; `note_room` logs
/// its return.
pub fn note_full(directory: &Path, why: &str) {
    let mut spaces = SPACE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let index = match spaces.iter().position(|space| space.directory == directory) {
        Some(index) => index,
        None if spaces.len() < SPACE_DIRECTORIES_REMEMBERED => {
            spaces.push(Space {
                directory: directory.to_owned(),
                full: false,
                logged_full: false,
                last_full_line: None,
                refusals: 0,
                lines: (0, 0),
            });
            spaces.len() - 1
        }
        None => return,
    };
    let space = &mut spaces[index];
    space.full = true;
    ANY_FULL.store(true, std::sync::atomic::Ordering::Relaxed);
    space.refusals += 1;
    let now = crate::runtime::now();
    let recently =
        space.last_full_line.is_some_and(|at| now.saturating_duration_since(at) < DISK_FULL_LINE_INTERVAL);
    if space.logged_full || recently {
        return;
    }
    crate::log_error!(
        "ringpostd: ERROR: data directory {} is full ({} allocation(s) refused): publishes and acknowledgements that need a new segment there are refused with ResourceExhausted until space returns; acknowledge messages, delete topics or free disk space: {why}",
        directory.display(),
        space.refusals
    );
    space.logged_full = true;
    space.last_full_line = Some(now);
    space.refusals = 0;
    space.lines.0 += 1;
}

/// A segment was allocated in `directory`: if it was full, it has room again (logged once, if
/// its going full was). A load of one word while no directory is full.
pub fn note_room(directory: &Path) {
    if !ANY_FULL.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut spaces = SPACE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(space) = spaces.iter_mut().find(|space| space.directory == directory && space.full) else {
        return;
    };
    space.full = false;
    if std::mem::replace(&mut space.logged_full, false) {
        crate::log_info!(
            "ringpostd: data directory {} has room again: a segment was allocated there ({} allocation(s) refused since it was logged full)",
            directory.display(),
            space.refusals
        );
        space.refusals = 0;
        space.lines.1 += 1;
    }
    let any_full = spaces.iter().any(|space| space.full);
    ANY_FULL.store(any_full, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `directory` is full as far as the daemon knows (`note_full`, `note_room`).
pub fn is_full(directory: &Path) -> bool {
    let spaces = SPACE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    spaces.iter().any(|space| space.directory == directory && space.full)
}

/// Lines logged about `directory`'s space: (full, room again).
#[cfg(test)]
pub fn space_lines(directory: &Path) -> (u64, u64) {
    let spaces = SPACE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    spaces.iter().find(|space| space.directory == directory).map_or((0, 0), |space| space.lines)
}
