//! SimDisk: an in-memory disk with the failure modes of a real one (see docs/TESTING.md).
//!
//! Each file has a *durable* image and a *current* image; writes change the current image and
//! are remembered as unsynced until `sync_data`. Directory entries become durable only on
//! `sync_dir`. `crash` throws away whatever was not made durable, optionally keeping a torn
//! prefix (whole 512-byte sectors) of the last unsynced write, like a power cut mid-write.
//! Faults: EIO on the n-th write, read or sync; ENOSPC on allocation (always, or once the
//! files would pass a capacity, which `free_bytes` then answers by); bit flips at rest; and,
//! per directory, failing writes, one failing sync, a misdirected write (it lands whole blocks
//! away and reports success), a lost write (reports success, persists nothing), a full disk.
//! A write can be held back (`delay_nth_write`) so that writes issued after it land first, as
//! a device may complete them.
//! `die_after(n)` makes every operation after the next n fail, as if power went out there;
//! `crash` then turns the disk into what a restart would find.
//!
//! Besides these scripted faults, a [`FaultPlan`] draws them from a seed, for simulations:
//! per write, sync and read a chance of EIO, ENOSPC or a torn write, confined to the directories
//! the plan names as faulty, and a latency in virtual time for each of them; and
//! [`CrashMode::KeepEach`] lets a crash keep, drop or tear each unsynced write by the seed.

use super::{IoBuffer, Storage, StorageFile};
use crate::runtime::sim::Rng;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub const SECTOR_BYTES: usize = 512;

#[derive(Default)]
struct SimFile {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in order: (position, length).
    unsynced: Vec<(u64, usize)>,
    /// The shortest length a truncation since the last sync left: a crash that keeps unsynced
    /// changes keeps it too.
    truncated_to: Option<usize>,
}

#[derive(Default)]
struct SimState {
    next_inode: u64,
    files: HashMap<u64, SimFile>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    directories: std::collections::BTreeSet<PathBuf>,
    /// Directories whose own names were made durable by a `sync_dir` of their parent (roots
    /// are always durable). A crash loses the others, and everything under them.
    durable_directories: std::collections::BTreeSet<PathBuf>,
    writes: u64,
    reads: u64,
    syncs: u64,
    directory_syncs: u64,
    truncations: u64,
    fail_write_at: Option<u64>,
    fail_read_at: Option<u64>,
    fail_sync_at: Option<u64>,
    fail_all_writes: bool,
    no_space: bool,
    /// Bytes all named files may hold together (`SimDisk::set_capacity_bytes`); None for no
    /// limit.
    capacity_bytes: Option<u64>,
    too_many_files: bool,
    rules: Vec<Rule>,
    /// See `SimDisk::set_durable_writes`.
    durable_writes: bool,
    operations: u64,
    dies_at: Option<u64>,
    /// Writes issued (counted as they start, where `writes` counts them as they land).
    writes_issued: u64,
    /// The write to hold back, by issue number, for how long, and whether the power goes out
    /// just as it would land.
    delayed_write: Option<(u64, std::time::Duration, bool)>,
    /// The issue number of the write being held back, while it is.
    held_issue: Option<u64>,
    /// Writes that landed while a write issued before them was held back.
    writes_landed_out_of_order: u64,
    /// Crashes so far: a write still held back at a crash never lands after it.
    crashes: u64,
    /// Faults and latencies drawn from a seed, with the generator drawing them.
    plan: Option<(FaultPlan, Rng)>,
    /// Faults the plan injected so far.
    planned_faults: u64,
    /// See `SimDisk::set_opens_yield`.
    opens_yield: bool,
    /// Opens whose path no longer named the file they opened when they ended.
    opens_raced: u64,
}

/// Faults and latencies drawn from a seed (`SimDisk::set_fault_plan`). Chances are in parts
/// per million of operations under a faulty directory.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// The directories whose files may fail: a test keeps them within what the log tolerates
    /// (at most ⌊M/2⌋ of M data directories), so that a quorum stays whole.
    pub faulty: Vec<PathBuf>,
    pub write_eio_ppm: u32,
    pub write_no_space_ppm: u32,
    /// A write that fails with EIO after part of it (whole sectors) reached the file.
    pub write_torn_ppm: u32,
    /// An fdatasync that fails with EIO and drops the file's unsynced writes, as Linux does.
    pub sync_eio_ppm: u32,
    pub read_eio_ppm: u32,
    /// Each write, sync and read takes a latency drawn up to this, in virtual time under a
    /// simulation, so that operations complete in an order the seed chooses.
    pub latency_max: std::time::Duration,
}

/// The highest chance a drawn plan gives one kind of fault, in parts per million (10%): a
/// faulty directory is fenced at its first failed write, so its faults come early or not at all.
const DRAWN_FAULT_PPM_MAX: u32 = 100_000;
/// The highest chance a drawn plan gives a failing read (10%, as other faults): a read failing
/// in a copy fences it, at run time (the batch is read from another copy) and in recovery (the
/// open goes on from the others), so its faults too come early or not at all.
const DRAWN_READ_FAULT_PPM_MAX: u32 = 100_000;
/// Most latency a drawn plan gives an operation.
const DRAWN_LATENCY_MAX: std::time::Duration = std::time::Duration::from_micros(500);

impl FaultPlan {
    /// A plan drawn from `rng` for a log over `directories`: up to ⌊M/2⌋ of them faulty, each
    /// kind of fault with its own chance (often none), and a latency bound.
    pub fn draw(rng: &mut Rng, directories: &[PathBuf]) -> FaultPlan {
        let mut candidates = directories.to_vec();
        let faulty_count = rng.below(directories.len() as u64 / 2 + 1) as usize;
        let mut faulty = Vec::new();
        for _ in 0..faulty_count {
            faulty.push(candidates.swap_remove(rng.below(candidates.len() as u64) as usize));
        }
        let chance = |rng: &mut Rng| {
            if rng.chance(500_000) {
                rng.below(u64::from(DRAWN_FAULT_PPM_MAX)) as u32
            } else {
                0
            }
        };
        FaultPlan {
            faulty,
            write_eio_ppm: chance(rng),
            write_no_space_ppm: chance(rng),
            write_torn_ppm: chance(rng),
            sync_eio_ppm: chance(rng),
            read_eio_ppm: chance(rng) / (DRAWN_FAULT_PPM_MAX / DRAWN_READ_FAULT_PPM_MAX),
            latency_max: std::time::Duration::from_micros(
                rng.below(DRAWN_LATENCY_MAX.as_micros() as u64 + 1),
            ),
        }
    }
}

/// What the plan makes of one operation.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Planned {
    Eio,
    NoSpace,
    /// EIO after this many sectors of the write landed.
    Torn {
        sectors: usize,
    },
}

#[derive(Clone, Copy)]
enum Operation {
    Write { sectors: usize },
    Sync,
    Read,
}

/// A fault confined to the files under one directory.
#[derive(Clone, Debug)]
struct Rule {
    prefix: PathBuf,
    fault: Fault,
}

#[derive(Clone, Debug, PartialEq)]
enum Fault {
    FailWrites,
    FailNextSync,
    MisdirectNextWrite { blocks: i64 },
    LoseNextWrite,
    NoSpace,
}

/// How a crash treats writes that were not synced.
#[derive(Clone, Copy, Debug)]
pub enum CrashMode {
    /// Every unsynced write is lost.
    DropUnsynced,
    /// The last unsynced write of each file keeps its first `sectors` sectors; the rest is lost.
    TearLastWrite { sectors: usize },
    /// Every unsynced write happens to have reached the disk.
    KeepUnsynced,
    /// Each unsynced write, by a generator seeded with `seed`, reached the disk whole, not at
    /// all, or torn (its first sectors only): a device may complete them in any order.
    KeepEach { seed: u64 },
}

#[derive(Clone, Default)]
pub struct SimDisk {
    state: Rc<RefCell<SimState>>,
}

pub struct SimFileHandle {
    state: Rc<RefCell<SimState>>,
    inode: u64,
    path: PathBuf,
}

impl SimState {
    /// A latency for the next operation, from the plan.
    fn planned_latency(&mut self) -> Option<std::time::Duration> {
        let (plan, rng) = self.plan.as_mut()?;
        let latency_max = plan.latency_max.as_nanos() as u64;
        (latency_max > 0).then(|| std::time::Duration::from_nanos(rng.below(latency_max + 1)))
    }

    /// The fault the plan draws for an operation on `path`, if any.
    fn planned_fault(&mut self, path: &Path, operation: Operation) -> Option<Planned> {
        let (plan, rng) = self.plan.as_mut()?;
        if !plan.faulty.iter().any(|directory| path.starts_with(directory)) {
            return None;
        }
        let fault = match operation {
            Operation::Write { sectors } => {
                if rng.chance(plan.write_eio_ppm) {
                    Some(Planned::Eio)
                } else if rng.chance(plan.write_no_space_ppm) {
                    Some(Planned::NoSpace)
                } else if sectors > 1 && rng.chance(plan.write_torn_ppm) {
                    Some(Planned::Torn { sectors: rng.between(1..sectors as u64) as usize })
                } else {
                    None
                }
            }
            Operation::Sync => rng.chance(plan.sync_eio_ppm).then_some(Planned::Eio),
            Operation::Read => rng.chance(plan.read_eio_ppm).then_some(Planned::Eio),
        };
        self.planned_faults += u64::from(fault.is_some());
        fault
    }

    /// Bytes the named files hold (a file with several names counted once; an unlinked one
    /// not at all, as its space is freed once closed, and the log shrinks it before).
    fn used_bytes(&self) -> u64 {
        let inodes: std::collections::BTreeSet<u64> = self.names.values().copied().collect();
        inodes.iter().map(|inode| self.files[inode].current.len() as u64).sum()
    }

    /// Bytes left under the capacity; `u64::MAX` without one.
    fn free_bytes(&self) -> u64 {
        self.capacity_bytes.map_or(u64::MAX, |capacity| capacity.saturating_sub(self.used_bytes()))
    }

    /// ENOSPC if growing `inode` to `bytes` would pass the capacity.
    fn check_room(&self, inode: u64, bytes: u64) -> io::Result<()> {
        let growth = bytes.saturating_sub(self.files[&inode].current.len() as u64);
        if growth > 0 && growth > self.free_bytes() {
            return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
        }
        Ok(())
    }

    /// Counts an operation; fails it if power is already out.
    fn operate(&mut self, what: &str) -> io::Result<()> {
        self.operations += 1;
        if self.dies_at.is_some_and(|dies_at| self.operations > dies_at) {
            return Err(io::Error::other(format!("power is out ({what})")));
        }
        Ok(())
    }

    /// Takes the first rule matching `path` and `test`, removing it if it is one-shot.
    fn take_rule(&mut self, path: &Path, test: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let index = self.rules.iter().position(|rule| path.starts_with(&rule.prefix) && test(&rule.fault))?;
        let fault = self.rules[index].fault.clone();
        if !matches!(fault, Fault::FailWrites | Fault::NoSpace) {
            self.rules.remove(index);
        }
        Some(fault)
    }
}

/// A path with no parent to hold its name ("/", or the first part of a relative path): a
/// data directory's mount point, always there.
fn is_root(path: &Path) -> bool {
    path.parent().is_none_or(|parent| parent.as_os_str().is_empty())
}

pub struct SimBuffer(Vec<u8>);

impl IoBuffer for SimBuffer {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected EIO on {what}"))
}

/// A disk held weakly, to tell whether anything (a file handle of a log, a forwarder) still
/// keeps its contents after a simulation ended.
pub struct SimDiskHeld(std::rc::Weak<RefCell<SimState>>);

impl SimDiskHeld {
    pub fn is_held(&self) -> bool {
        self.0.strong_count() > 0
    }
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    pub fn downgrade(&self) -> SimDiskHeld {
        SimDiskHeld(Rc::downgrade(&self.state))
    }

    /// Files whose writes are durable once they complete, as with O_DSYNC (the real storage
    /// opens its files so): a crash keeps every completed write, and the log skips its
    /// fdatasyncs.
    pub fn set_durable_writes(&self, durable: bool) {
        self.state.borrow_mut().durable_writes = durable;
    }

    pub fn durable_writes(&self) -> bool {
        self.state.borrow().durable_writes
    }

    /// The next `n`-th write from now (1 = the next one) fails with EIO.
    pub fn fail_nth_write(&self, n: u64) {
        let mut state = self.state.borrow_mut();
        state.fail_write_at = Some(state.writes + n);
    }
    pub fn fail_nth_sync(&self, n: u64) {
        let mut state = self.state.borrow_mut();
        state.fail_sync_at = Some(state.syncs + n);
    }
    pub fn fail_nth_read(&self, n: u64) {
        let mut state = self.state.borrow_mut();
        state.fail_read_at = Some(state.reads + n);
    }
    pub fn fail_all_writes(&self, fail: bool) {
        self.state.borrow_mut().fail_all_writes = fail;
    }
    pub fn set_no_space(&self, full: bool) {
        self.state.borrow_mut().no_space = full;
    }
    /// The files may hold `capacity` bytes together (None: no limit): an allocation or a write
    /// that would grow them past it fails with ENOSPC, and `free_bytes` says what is left.
    pub fn set_capacity_bytes(&self, capacity: Option<u64>) {
        self.state.borrow_mut().capacity_bytes = capacity;
    }
    /// Opens yield to the executor once, between finding the file and returning it, as the
    /// real storage's do (io_uring's openat, then a statx): other tasks may rename or remove
    /// the name meanwhile. An open whose path no longer names the file it opened when it
    /// returns is counted (`opens_raced`): glommio's own DMA open looked the path up again
    /// there and panicked, and whatever removed the name raced the opener. Off by default, so
    /// that the other tests keep their interleavings.
    pub fn set_opens_yield(&self, yields: bool) {
        self.state.borrow_mut().opens_yield = yields;
    }
    /// Opens that raced a rename or removal of their path (see `set_opens_yield`).
    pub fn opens_raced(&self) -> u64 {
        self.state.borrow().opens_raced
    }
    /// Opens (or creates) the file at `path` at once: `Storage::open` without its yield.
    fn open_now(&self, path: &Path, create: bool) -> io::Result<SimFileHandle> {
        let mut state = self.state.borrow_mut();
        if create {
            state.operate("open")?;
            if state.too_many_files && !state.names.contains_key(path) {
                return Err(io::Error::from_raw_os_error(nix::libc::EMFILE));
            }
        }
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        if !state.directories.contains(&parent) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no directory {}", parent.display()),
            ));
        }
        let inode = match state.names.get(path) {
            Some(inode) => *inode,
            None if create => {
                state.next_inode += 1;
                let inode = state.next_inode;
                state.files.insert(inode, SimFile::default());
                state.names.insert(path.to_path_buf(), inode);
                inode
            }
            None => {
                return Err(io::Error::new(io::ErrorKind::NotFound, format!("no file {}", path.display())))
            }
        };
        Ok(SimFileHandle { state: self.state.clone(), inode, path: path.to_path_buf() })
    }

    /// Bytes left under the capacity (`u64::MAX` without one).
    pub fn free_bytes_left(&self) -> u64 {
        self.state.borrow().free_bytes()
    }
    /// Creating a file fails with EMFILE, as when the process is out of descriptors.
    pub fn set_too_many_files(&self, exhausted: bool) {
        self.state.borrow_mut().too_many_files = exhausted;
    }
    /// Every write under `directory` fails with EIO (or succeeds again with `false`).
    pub fn fail_writes_under(&self, directory: &Path, fail: bool) {
        self.set_rule(directory, Fault::FailWrites, fail);
    }
    /// The next fdatasync of a file under `directory` fails with EIO and drops its unsynced
    /// writes, as Linux does.
    pub fn fail_next_sync_under(&self, directory: &Path) {
        self.set_rule(directory, Fault::FailNextSync, true);
    }
    /// The next write under `directory` lands `blocks` 4 KiB blocks away and reports success.
    pub fn misdirect_next_write_under(&self, directory: &Path, blocks: i64) {
        self.set_rule(directory, Fault::MisdirectNextWrite { blocks }, true);
    }
    /// The next write under `directory` reports success and persists nothing.
    pub fn lose_next_write_under(&self, directory: &Path) {
        self.set_rule(directory, Fault::LoseNextWrite, true);
    }
    /// Allocations under `directory` fail with ENOSPC.
    pub fn no_space_under(&self, directory: &Path, full: bool) {
        self.set_rule(directory, Fault::NoSpace, full);
    }
    fn set_rule(&self, directory: &Path, fault: Fault, on: bool) {
        let mut state = self.state.borrow_mut();
        state.rules.retain(|rule| !(rule.prefix == directory && rule.fault == fault));
        if on {
            state.rules.push(Rule { prefix: directory.to_path_buf(), fault });
        }
    }
    /// The `n`-th write from now (1 = the next one) is held back for `delay` before it lands
    /// (or fails, if the power is out by then): writes issued meanwhile land first. With
    /// `power_fails`, the power goes out just before it would land: it and every later
    /// operation fail, as `die_after` makes them.
    pub fn delay_nth_write(&self, n: u64, delay: std::time::Duration, power_fails: bool) {
        let mut state = self.state.borrow_mut();
        state.delayed_write = Some((state.writes_issued + n, delay, power_fails));
    }
    /// Writes that landed while a write issued before them was held back (see
    /// `delay_nth_write`).
    pub fn writes_landed_out_of_order(&self) -> u64 {
        self.state.borrow().writes_landed_out_of_order
    }
    /// Faults and latencies from now on drawn by `plan` with a generator seeded with `seed`
    /// (None: none but the scripted ones).
    pub fn set_fault_plan(&self, plan: Option<FaultPlan>, seed: u64) {
        self.state.borrow_mut().plan = plan.map(|plan| (plan, Rng::new(seed)));
    }
    /// Faults the plan injected so far.
    pub fn planned_fault_count(&self) -> u64 {
        self.state.borrow().planned_faults
    }
    /// Power goes out after `operations` more operations: every later one fails.
    pub fn die_after(&self, operations: u64) {
        let mut state = self.state.borrow_mut();
        state.dies_at = Some(state.operations + operations);
    }
    /// Operations performed so far.
    pub fn operation_count(&self) -> u64 {
        self.state.borrow().operations
    }
    pub fn write_count(&self) -> u64 {
        self.state.borrow().writes
    }
    pub fn sync_count(&self) -> u64 {
        self.state.borrow().syncs
    }
    pub fn directory_sync_count(&self) -> u64 {
        self.state.borrow().directory_syncs
    }
    pub fn read_count(&self) -> u64 {
        self.state.borrow().reads
    }
    pub fn truncation_count(&self) -> u64 {
        self.state.borrow().truncations
    }

    /// Flips one bit of a file, at rest (both images).
    pub fn flip_bit(&self, path: &Path, byte: usize, bit: u8) {
        let mut state = self.state.borrow_mut();
        let inode = *state.names.get(path).expect("no such file");
        let file = state.files.get_mut(&inode).unwrap();
        file.current[byte] ^= 1 << bit;
        if byte < file.durable.len() {
            file.durable[byte] ^= 1 << bit;
        }
    }

    /// Power loss: every file goes back to its durable image (plus what `mode` keeps), and
    /// every directory to its durable entries.
    pub fn crash(&self, mode: CrashMode) {
        let mut state = self.state.borrow_mut();
        state.dies_at = None;
        state.delayed_write = None;
        state.held_issue = None;
        state.crashes += 1;
        // A directory survives if its name and every ancestor's were durable; a file survives
        // if its name was durable and its directory survived.
        let survives = |directory: &Path, durable: &std::collections::BTreeSet<PathBuf>| {
            directory.ancestors().all(|ancestor| is_root(ancestor) || durable.contains(ancestor))
        };
        let directories: std::collections::BTreeSet<PathBuf> = state
            .directories
            .iter()
            .filter(|directory| survives(directory, &state.durable_directories))
            .cloned()
            .collect();
        let names: BTreeMap<PathBuf, u64> = state
            .durable_names
            .iter()
            .filter(|(name, _)| name.parent().is_some_and(|parent| directories.contains(parent)))
            .map(|(name, inode)| (name.clone(), *inode))
            .collect();
        state.durable_directories.retain(|directory| directories.contains(directory));
        state.durable_names = names.clone();
        state.directories = directories;
        state.names = names;
        let mut kept_by_seed = match mode {
            CrashMode::KeepEach { seed } => Some(Rng::new(seed)),
            _ => None,
        };
        // Files in inode order, so that a seeded crash replays.
        let mut inodes: Vec<u64> = state.files.keys().copied().collect();
        inodes.sort_unstable();
        for inode in inodes {
            let file = state.files.get_mut(&inode).expect("listed above");
            let mut image = file.durable.clone();
            let keep: Vec<(u64, usize)> = match mode {
                CrashMode::DropUnsynced => Vec::new(),
                CrashMode::KeepEach { .. } => {
                    let rng = kept_by_seed.as_mut().expect("made for this mode");
                    file.unsynced
                        .iter()
                        .filter_map(|&(position, length)| match rng.below(3) {
                            0 => None,
                            1 => Some((position, length)),
                            _ => Some((
                                position,
                                length.min(
                                    rng.between(0..length as u64 / SECTOR_BYTES as u64 + 1) as usize
                                        * SECTOR_BYTES,
                                ),
                            )),
                        })
                        .collect()
                }
                CrashMode::KeepUnsynced => file.unsynced.clone(),
                CrashMode::TearLastWrite { sectors } => {
                    let mut kept = file.unsynced.clone();
                    if let Some(last) = kept.last_mut() {
                        last.1 = last.1.min(sectors * SECTOR_BYTES);
                    }
                    kept
                }
            };
            if let (Some(length), CrashMode::KeepUnsynced) = (file.truncated_to, mode) {
                image.truncate(length);
            }
            for (position, length) in keep {
                let position = position as usize;
                // A write that a later truncation cut short left only what is still there.
                let length = length.min(file.current.len().saturating_sub(position));
                if image.len() < position + length {
                    image.resize(position + length, 0);
                }
                image[position..position + length]
                    .copy_from_slice(&file.current[position..position + length]);
            }
            if image.len() < file.current.len() && file.durable.len() >= file.current.len() {
                image.resize(file.current.len(), 0);
            }
            file.current = image.clone();
            file.durable = image;
            file.unsynced.clear();
        }
    }

    /// The current bytes of a file, for tests that edit files directly.
    pub fn file_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.borrow();
        let inode = state.names.get(path)?;
        Some(state.files[inode].current.clone())
    }

    /// Replaces a file's bytes durably, for tests that corrupt or truncate at rest.
    pub fn set_file_bytes(&self, path: &Path, bytes: Vec<u8>) {
        let mut state = self.state.borrow_mut();
        let inode = *state.names.get(path).expect("no such file");
        let file = state.files.get_mut(&inode).unwrap();
        file.current = bytes.clone();
        file.durable = bytes;
        file.unsynced.clear();
    }
}

impl Storage for SimDisk {
    type File = SimFileHandle;
    type Buffer = SimBuffer;

    async fn open(&self, path: &Path, create: bool) -> io::Result<SimFileHandle> {
        let handle = self.open_now(path, create)?;
        if self.state.borrow().opens_yield {
            futures_lite::future::yield_now().await;
            let mut state = self.state.borrow_mut();
            if state.names.get(path) != Some(&handle.inode) {
                state.opens_raced += 1;
            }
        }
        Ok(handle)
    }

    /// The real storage does this on another thread (`dma.rs`): here the task yields once
    /// first, so that tasks making folders interleave there as they do in the daemon.
    async fn create_dirs_durable(&self, paths: &[PathBuf]) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        super::create_dirs_durable_here(self, paths).await
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.operate("fsync of a directory")?;
        state.directory_syncs += 1;
        let in_dir = |name: &PathBuf| name.parent() == Some(path);
        let current: Vec<(PathBuf, u64)> =
            state.names.iter().filter(|(name, _)| in_dir(name)).map(|(n, i)| (n.clone(), *i)).collect();
        state.durable_names.retain(|name, _| !in_dir(name));
        state.durable_names.extend(current);
        let children: Vec<PathBuf> = state.directories.iter().filter(|name| in_dir(name)).cloned().collect();
        state.durable_directories.retain(|name| !in_dir(name));
        state.durable_directories.extend(children);
        Ok(())
    }

    fn alloc_buffer(&self, bytes: usize) -> SimBuffer {
        SimBuffer(vec![0u8; bytes])
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // A new directory's name is durable only once its parent is synced, as on ext4
        // without a journal.
        let mut state = self.state.borrow_mut();
        let mut current = Some(path);
        while let Some(directory) = current {
            state.directories.insert(directory.to_path_buf());
            current = directory.parent();
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let state = self.state.borrow();
        if !state.directories.contains(path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", path.display())));
        }
        let mut names: Vec<String> = state
            .names
            .keys()
            .filter(|name| name.parent() == Some(path))
            .map(|name| name.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.extend(
            state
                .directories
                .iter()
                .filter(|name| name.parent() == Some(path))
                .map(|name| name.file_name().unwrap().to_string_lossy().into_owned()),
        );
        names.sort();
        Ok(names)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.operate("unlink")?;
        state
            .names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {}", path.display())))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.names.retain(|name, _| !name.starts_with(path));
        state.durable_names.retain(|name, _| !name.starts_with(path));
        state.directories.retain(|name| !name.starts_with(path));
        state.durable_directories.retain(|name| !name.starts_with(path));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.operate("rename")?;
        let inode = state
            .names
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {}", from.display())))?;
        state.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let state = self.state.borrow();
        state.names.contains_key(path) || state.directories.contains(path)
    }

    /// The same for every directory: one SimDisk is one filesystem.
    fn free_bytes(&self, _path: &Path) -> io::Result<u64> {
        Ok(self.state.borrow().free_bytes())
    }
}

impl SimFileHandle {
    /// Waits the plan's latency for this operation, if there is a plan.
    async fn planned_wait(&self) {
        let latency = self.state.borrow_mut().planned_latency();
        if let Some(latency) = latency {
            crate::runtime::sleep(latency).await;
        }
    }

    /// Puts `bytes` into the file at `position`: durable at once with durable writes, else
    /// remembered as unsynced.
    fn land(&self, state: &mut SimState, bytes: &[u8], position: u64) -> io::Result<()> {
        state.check_room(self.inode, position + bytes.len() as u64)?;
        let durable_writes = state.durable_writes;
        let file = state.files.get_mut(&self.inode).unwrap();
        let start = position as usize;
        let end = start + bytes.len();
        if file.current.len() < end {
            file.current.resize(end, 0);
        }
        file.current[start..end].copy_from_slice(bytes);
        if durable_writes {
            if file.durable.len() < end {
                file.durable.resize(end, 0);
            }
            file.durable[start..end].copy_from_slice(bytes);
        } else {
            file.unsynced.push((position, bytes.len()));
        }
        Ok(())
    }
}

impl StorageFile for SimFileHandle {
    type Buffer = SimBuffer;
    type Read = Vec<u8>;

    async fn write_at(&self, buffer: Rc<SimBuffer>, position: u64) -> io::Result<()> {
        let (issue, delay, crashes, latency) = {
            let mut state = self.state.borrow_mut();
            state.writes_issued += 1;
            let issue = state.writes_issued;
            let latency = state.planned_latency();
            (issue, state.delayed_write.filter(|(delayed, _, _)| *delayed == issue), state.crashes, latency)
        };
        if let Some(latency) = latency {
            crate::runtime::sleep(latency).await;
            if self.state.borrow().crashes != crashes {
                return Err(io::Error::other("power went out while the write was under way"));
            }
        }
        if let Some((_, delay, power_fails)) = delay {
            self.state.borrow_mut().held_issue = Some(issue);
            crate::runtime::sleep(delay).await;
            let mut state = self.state.borrow_mut();
            state.held_issue = None;
            if state.crashes != crashes {
                return Err(io::Error::other("power went out while the write was held back"));
            }
            if power_fails {
                state.dies_at = Some(state.operations);
            }
        }
        let mut state = self.state.borrow_mut();
        state.operate("write")?;
        if state.held_issue.is_some_and(|held| held < issue) {
            state.writes_landed_out_of_order += 1;
        }
        state.writes += 1;
        if state.fail_all_writes || state.fail_write_at == Some(state.writes) {
            return Err(eio("write"));
        }
        match state.planned_fault(&self.path, Operation::Write { sectors: buffer.0.len() / SECTOR_BYTES }) {
            Some(Planned::Eio) => return Err(eio("write (planned)")),
            Some(Planned::NoSpace) => return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC)),
            Some(Planned::Torn { sectors }) => {
                self.land(&mut state, &buffer.0[..sectors * SECTOR_BYTES], position)?;
                return Err(eio("write (planned, torn)"));
            }
            None => {}
        }
        let mut position = position;
        match state.take_rule(&self.path, |fault| {
            matches!(fault, Fault::FailWrites | Fault::LoseNextWrite | Fault::MisdirectNextWrite { .. })
        }) {
            Some(Fault::FailWrites) => return Err(eio("write")),
            Some(Fault::LoseNextWrite) => return Ok(()),
            Some(Fault::MisdirectNextWrite { blocks }) => {
                position = (position as i64 + blocks * 4096).max(0) as u64;
            }
            _ => {}
        }
        self.land(&mut state, &buffer.0, position)
    }

    async fn read_at(&self, position: u64, bytes: usize) -> io::Result<Vec<u8>> {
        self.planned_wait().await;
        let mut state = self.state.borrow_mut();
        state.reads += 1;
        if state.fail_read_at == Some(state.reads)
            || state.planned_fault(&self.path, Operation::Read).is_some()
        {
            return Err(eio("read"));
        }
        let file = &state.files[&self.inode];
        let start = (position as usize).min(file.current.len());
        let end = (start + bytes).min(file.current.len());
        Ok(file.current[start..end].to_vec())
    }

    async fn sync_data(&self) -> io::Result<()> {
        let crashes = self.state.borrow().crashes;
        self.planned_wait().await;
        let mut state = self.state.borrow_mut();
        if state.crashes != crashes {
            return Err(io::Error::other("power went out while the sync was under way"));
        }
        state.operate("fdatasync")?;
        state.syncs += 1;
        let rule = state.take_rule(&self.path, |fault| *fault == Fault::FailNextSync);
        let planned = state.planned_fault(&self.path, Operation::Sync);
        if state.fail_sync_at == Some(state.syncs) || rule.is_some() || planned.is_some() {
            // Like Linux after a failed fsync: the unsynced pages are dropped, and a later
            // sync would report success without them (fsyncgate).
            let file = state.files.get_mut(&self.inode).unwrap();
            file.unsynced.clear();
            file.truncated_to = None;
            file.current = file.durable.clone();
            return Err(eio("fdatasync"));
        }
        let file = state.files.get_mut(&self.inode).unwrap();
        file.durable = file.current.clone();
        file.unsynced.clear();
        file.truncated_to = None;
        Ok(())
    }

    async fn allocate(&self, bytes: u64) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.operate("fallocate")?;
        if state.no_space || state.take_rule(&self.path, |fault| *fault == Fault::NoSpace).is_some() {
            return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
        }
        state.check_room(self.inode, bytes)?;
        let file = state.files.get_mut(&self.inode).unwrap();
        if (file.current.len() as u64) < bytes {
            file.current.resize(bytes as usize, 0);
        }
        // The size change is metadata that fdatasync would persist; treat it as durable at
        // once since the new bytes are zeros either way.
        if (file.durable.len() as u64) < bytes {
            file.durable.resize(bytes as usize, 0);
        }
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.state.borrow().files[&self.inode].current.len() as u64)
    }

    async fn truncate(&self, bytes: u64) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.operate("ftruncate")?;
        state.truncations += 1;
        // Not durable until a sync: a crash brings the old length (and bytes) back.
        let file = state.files.get_mut(&self.inode).unwrap();
        file.current.truncate(bytes as usize);
        file.truncated_to =
            Some(file.truncated_to.map_or(bytes as usize, |length| length.min(bytes as usize)));
        Ok(())
    }

    fn direct_io(&self) -> bool {
        true
    }

    fn writes_are_durable(&self) -> bool {
        self.state.borrow().durable_writes
    }
}
