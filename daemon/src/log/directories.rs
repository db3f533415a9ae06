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
}

impl Directories {
    pub fn new(paths: Vec<PathBuf>) -> Rc<Directories> {
        assert!(!paths.is_empty(), "at least one data directory");
        assert!(paths.len() <= DATA_DIRECTORIES_MAX, "at most {DATA_DIRECTORIES_MAX} data directories");
        let count = paths.len();
        Rc::new(Directories { paths, fenced: RefCell::new(vec![None; count]), repairs: Cell::new(0) })
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
