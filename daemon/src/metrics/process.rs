//! What the kernel says about the daemon process: resident memory and open files, for the
//! stats (an operator's first two questions about a daemon with many topics).

use std::cell::Cell;

/// The daemon process as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessStats {
    /// Resident memory (RSS), bytes.
    pub resident_bytes: u64,
    /// File descriptors open, and the soft limit on them.
    pub open_files: u64,
    pub open_files_limit: u64,
}

/// Reads the process's figures from /proc; a figure that cannot be read is 0.
pub fn stats() -> ProcessStats {
    // SAFETY: sysconf only reads a constant of the running system.
    let page_bytes = match unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) } {
        bytes if bytes > 0 => bytes as u64,
        _ => 4096,
    };
    let resident_bytes = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| resident_pages_of_statm(&text))
        .map_or(0, |pages| pages * page_bytes);
    let open_files = std::fs::read_dir("/proc/self/fd").map_or(0, |entries| entries.count() as u64);
    let open_files_limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(0, |(soft, _hard)| soft);
    ProcessStats { resident_bytes, open_files, open_files_limit }
}

/// Largest allocation glibc's malloc serves from its heap rather than from a fresh mmap.
pub const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
/// Free memory at the top of a heap beyond which a `free` gives it back to the kernel.
pub const TRIM_THRESHOLD_BYTES: i32 = 4 * MMAP_THRESHOLD_BYTES;
/// A free this large makes glibc look at its arena's top (smaller ones go to the thread's
/// cache or the fast bins without it); see `release_free_memory`.
const FREE_THAT_TRIMS_BYTES: usize = 128 << 10;

/// Frames and record buffers of a large publish are megabytes each and short-lived. Served by
/// mmap, every one of them is fresh memory the kernel has to fault in and zero page by page
/// (`clear_page_erms` was 7% of the forwarder's time publishing 1 MiB messages); served from
/// the heap, the freed ones are reused. glibc raises its mmap threshold this way by itself,
/// but only after the first free, and per process; setting it keeps the behaviour fixed. The
/// heap then holds on to the peak of what is in flight, which the staging limits bound, until
/// `release_free_memory` gives it back.
pub fn keep_large_buffers_in_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}

/// Hands free heap memory back to the kernel. It walks the free lists, so it is called after
/// large releases only, not on a timer.
///
/// `malloc_trim` releases the free chunks of every arena, but not the free memory at the top
/// of a thread's arena (each shard's thread has its own), where large buffers freed last
/// coalesce: only a `free` trims that, and only beyond `M_TRIM_THRESHOLD`, which is kept high
/// (see `keep_large_buffers_in_heap`) and above a thread heap's 64 MiB. So the threshold is
/// lowered for one large free on the calling thread, whose arena is the one that released the
/// memory, and set back. Without it, 100 connections' partial frames freed together stayed
/// resident (34 MiB of one shard's arena, all zero pages) however often this ran.
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim and mallopt only change what malloc holds free and its parameters;
    // the buffer is allocated and freed here, unused in between.
    unsafe {
        nix::libc::malloc_trim(0);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 0);
        let probe = nix::libc::malloc(FREE_THAT_TRIMS_BYTES);
        nix::libc::free(probe);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}

/// Sweeps without a request after which a shard that was busy hands the heap memory it freed
/// back to the kernel (`QuietTrim`): after its tail caches went idle
/// (`TAIL_CACHE_IDLE_SWEEPS`), so that those are returned too.
pub const QUIET_SWEEPS_BEFORE_TRIM: u32 = crate::log::TAIL_CACHE_IDLE_SWEEPS as u32 + 2;

/// Gives a shard's freed heap memory back once it has been quiet: malloc keeps what a burst
/// freed (request tasks, buffers, caches, deleted topics), and without a trim the process would
/// stay at its peak resident for good. A shard calls `sweep` on a timer with its count of
/// requests so far.
#[derive(Default)]
pub struct QuietTrim {
    /// The count of requests at the last sweep.
    requests_at_sweep: Cell<u64>,
    /// Sweeps in a row without a request since the shard was last busy; None once trimmed.
    quiet_sweeps: Cell<Option<u32>>,
}

impl QuietTrim {
    /// Counts a sweep; trims once `QUIET_SWEEPS_BEFORE_TRIM` of them in a row saw no request
    /// since the shard was last busy, and not again until it is busy again. True if it trimmed.
    pub fn sweep(&self, requests: u64) -> bool {
        if requests != self.requests_at_sweep.replace(requests) {
            self.quiet_sweeps.set(Some(0));
            return false;
        }
        match self.quiet_sweeps.get() {
            Some(quiet) if quiet + 1 >= QUIET_SWEEPS_BEFORE_TRIM => {
                release_free_memory();
                self.quiet_sweeps.set(None);
                true
            }
            Some(quiet) => {
                self.quiet_sweeps.set(Some(quiet + 1));
                false
            }
            None => false,
        }
    }

    /// Sweeps in a row without a request since the shard was last busy; None once trimmed
    /// (or never busy).
    pub fn quiet_sweeps(&self) -> Option<u32> {
        self.quiet_sweeps.get()
    }
}

/// The second field of /proc/PID/statm: resident pages.
fn resident_pages_of_statm(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statm_resident_field() {
        assert_eq!(resident_pages_of_statm("10518 2811 1720 218 0 1130 0\n"), Some(2811));
        assert_eq!(resident_pages_of_statm("10518"), None);
        assert_eq!(resident_pages_of_statm(""), None);
    }

    #[test]
    fn reads_this_process() {
        let stats = stats();
        assert!(stats.resident_bytes > 0);
        assert!(stats.open_files > 0);
        assert!(stats.open_files_limit >= stats.open_files);
    }
}
