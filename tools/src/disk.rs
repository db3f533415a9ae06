//! Measures a data directory's own durable-write ceiling.
//!
//! The daemon makes a message durable by writing it into a log segment with an O_DIRECT write
//! and then issuing fdatasync, both through io_uring. This module repeats that pattern against
//! a scratch file in the data directory, so the figures it reports are the disk's ceiling for
//! it rather than a page-cache number. By default it writes over blocks written once before,
//! the disk's best case; the daemon's segments are only fallocated, so its small commits also
//! pay for converting unwritten extents (on this machine a 4 KiB commit measured 100 µs of write
//! and 113 µs of fdatasync inside the daemon, against 94 µs for both here). `fresh` measures
//! that case too: writes into space that is only fallocated, each once, as a growing log
//! writes, the ceiling for a log that is not overwriting old segments. `measure_reads` gives
//! the other side: sequential O_DIRECT reads of a file written first, as a subscriber draining a
//! backlog reads the log (the daemon reads past its tail cache with O_DIRECT too, so the page
//! cache never serves it).

use std::alloc::{self, Layout};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use io_uring::{opcode, types, IoUring};
use nix::errno::Errno;
use nix::fcntl::{self, FallocateFlags, FcntlArg, OFlag};

/// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block size; 4096
/// covers every device we expect, including 4Kn drives.
const ALIGNMENT_BYTES: usize = 4096;

/// Pre-writing uses large chunks so that filling the file costs a few seconds at most.
const PREWRITE_CHUNK_BYTES: usize = 4 << 20;

/// A slow disk must not stall a whole run, so each size stops after this long even when it has
/// not yet written `bytes_per_size`.
const MAX_DURATION_PER_SIZE: Duration = Duration::from_secs(10);

/// More outstanding pairs than this is far past anything the daemon does and would only make
/// the ring large.
const MAX_IN_FLIGHT: usize = 4096;

/// Latencies above a minute are recorded as a minute; such a disk is broken anyway.
const HISTOGRAM_MAX_MICROSECONDS: u64 = 60_000_000;

/// The low bit of an SQE's user data says which half of a write+fsync pair completed, and the
/// remaining bits say which in-flight slot it belongs to.
const OPERATION_WRITE: u64 = 0;
const OPERATION_FSYNC: u64 = 1;

/// Keeps scratch file names unique when one process measures several sizes or several
/// directories in quick succession.
static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What to measure and how hard.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// Directory whose file system is measured; the scratch file is created here.
    pub data_dir: PathBuf,
    /// Write sizes to measure, each a multiple of 4096.
    pub block_sizes: Vec<usize>,
    /// How many bytes to write per block size before stopping (at most 10 s are spent).
    pub bytes_per_size: u64,
    /// Size of the scratch file; writes wrap around at this length.
    pub file_bytes: u64,
    /// How many write+fdatasync pairs are kept outstanding at once.
    pub in_flight: usize,
    /// Write into space that is only fallocated (no pre-write), each block once: the run ends
    /// at the end of the file instead of wrapping.
    pub fresh: bool,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            data_dir: PathBuf::from("."),
            block_sizes: vec![4096, 65536, 1048576],
            bytes_per_size: 256 << 20,
            file_bytes: 256 << 20,
            in_flight: 1,
            fresh: false,
        }
    }
}

/// The figures measured for one block size.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskResult {
    pub block_bytes: usize,
    /// Completed write+fdatasync pairs.
    pub writes: u64,
    /// Time from the first write's submission to the last fdatasync's completion.
    pub seconds: f64,
    /// Durable throughput in decimal megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
    pub writes_per_sec: f64,
    /// Latency of the fdatasync alone.
    pub sync_p50_us: u64,
    pub sync_p99_us: u64,
    /// Latency of the whole write followed by fdatasync, which is what a publisher waits for.
    pub write_sync_p99_us: u64,
    /// Whether the file really was opened with O_DIRECT; if not, the writes went through the
    /// page cache and only the fdatasync figures are comparable with the daemon.
    pub o_direct: bool,
    /// Whether the writes went into fallocated space, each block once (see `DiskOptions`).
    pub fresh: bool,
}

/// Measures every size in `options.block_sizes` in turn and calls `progress` with one line per
/// size as it finishes.
pub fn measure(options: &DiskOptions, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<DiskResult>> {
    validate(options)?;
    let mut results = Vec::with_capacity(options.block_sizes.len());
    for &block_bytes in &options.block_sizes {
        let result = measure_size(options, block_bytes)?;
        progress(&describe(&result));
        results.push(result);
    }
    Ok(results)
}

/// The figures measured for one read size (`measure_reads`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReadResult {
    pub block_bytes: usize,
    /// Completed reads, each of `block_bytes`.
    pub reads: u64,
    /// Time from the first read's submission to the last one's completion.
    pub seconds: f64,
    /// Throughput in decimal megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
    pub read_p50_us: u64,
    pub read_p99_us: u64,
    /// Whether the file really was opened with O_DIRECT; if not, the reads came from the page
    /// cache and say nothing about the disk.
    pub o_direct: bool,
    /// Reads kept outstanding at once.
    pub in_flight: usize,
}

/// Measures sequential reads for every size in `options.block_sizes`: a file of
/// `bytes_per_size` (rounded up to whole reads) is written and synced, then read once from
/// start to end with `in_flight` reads outstanding. `fresh` and `file_bytes` do not apply.
pub fn measure_reads(options: &DiskOptions, progress: &mut dyn FnMut(&str)) -> io::Result<Vec<ReadResult>> {
    let largest = options.block_sizes.iter().copied().max().unwrap_or(0) as u64;
    let file_bytes = options.bytes_per_size.max(largest).next_multiple_of(ALIGNMENT_BYTES as u64);
    validate(&DiskOptions { file_bytes, ..options.clone() })?;
    let mut results = Vec::with_capacity(options.block_sizes.len());
    for &block_bytes in &options.block_sizes {
        let file_bytes = options.bytes_per_size.max(1).next_multiple_of(block_bytes as u64);
        let result = measure_read_size(options, block_bytes, file_bytes)?;
        progress(&format!(
            "{:>8} KiB reads: {:>9.1} MB/s  read p50 {:>6} us  p99 {:>6} us{}",
            block_bytes / 1024,
            result.mb_per_sec,
            result.read_p50_us,
            result.read_p99_us,
            if result.o_direct { "" } else { "  (no O_DIRECT: page cache)" }
        ));
        results.push(result);
    }
    Ok(results)
}

/// Renders read results as `{"results":[{...},...]}`.
pub fn reads_to_json(results: &[ReadResult]) -> String {
    let entries: Vec<String> = results
        .iter()
        .map(|result| {
            format!(
                concat!(
                    "{{\"block_bytes\":{},\"mb_per_sec\":{},\"read_p50_us\":{},\"read_p99_us\":{},",
                    "\"o_direct\":{},\"in_flight\":{},\"reads\":{},\"seconds\":{}}}"
                ),
                result.block_bytes,
                json_number(result.mb_per_sec, 1),
                result.read_p50_us,
                result.read_p99_us,
                result.o_direct,
                result.in_flight,
                result.reads,
                json_number(result.seconds, 3),
            )
        })
        .collect();
    format!("{{\"results\":[{}]}}", entries.join(","))
}

fn measure_read_size(options: &DiskOptions, block_bytes: usize, file_bytes: u64) -> io::Result<ReadResult> {
    let scratch = ScratchFile::new(&options.data_dir, block_bytes);
    let (file, o_direct) = open_scratch(&scratch.path, block_bytes)?;
    let fd = types::Fd(file.as_raw_fd());
    // Declared before the ring, so that the ring (and any read still in flight) goes first.
    let mut pattern = AlignedBuffer::new(PREWRITE_CHUNK_BYTES.min(file_bytes as usize), false)?;
    pattern.as_mut_slice().fill(0xa5);
    let mut buffers = (0..options.in_flight)
        .map(|_| AlignedBuffer::new(block_bytes, false))
        .collect::<io::Result<Vec<_>>>()?;
    let ring_entries = options.in_flight.next_power_of_two().max(8);
    let mut ring = IoUring::new(ring_entries as u32)
        .map_err(|error| context(error, format!("disk {block_bytes} B: creating the io_uring")))?;
    // Allocated in one piece, as a segment is, then written, as a log's blocks are: reading
    // space that is only fallocated returns zeros without touching the disk.
    allocate(fd, file_bytes, block_bytes)?;
    prewrite(&mut ring, fd, &pattern, file_bytes, block_bytes)?;

    let mut latencies = new_histogram()?;
    let length_bytes = block_bytes as u32;
    let started = Instant::now();
    let deadline = started + MAX_DURATION_PER_SIZE;
    let mut issued_at = vec![(0u64, started); options.in_flight];
    let mut next_offset_bytes = 0u64;
    // Queues the next read of the file into `slot`'s buffer.
    let issue = |ring: &mut IoUring,
                 next_offset_bytes: &mut u64,
                 slot: usize,
                 buffer: &mut AlignedBuffer,
                 issued: &mut (u64, Instant)| {
        *issued = (*next_offset_bytes, Instant::now());
        let entry = opcode::Read::new(fd, buffer.as_mut_slice().as_mut_ptr(), length_bytes)
            .offset(*next_offset_bytes)
            .build()
            .user_data(slot as u64);
        *next_offset_bytes += u64::from(length_bytes);
        push(ring, &entry, "read", block_bytes)
    };
    let mut outstanding = 0usize;
    let mut first_error: Option<io::Error> = None;
    for (slot, buffer) in buffers.iter_mut().enumerate() {
        if next_offset_bytes + u64::from(length_bytes) > file_bytes {
            break;
        }
        if let Err(error) = issue(&mut ring, &mut next_offset_bytes, slot, buffer, &mut issued_at[slot]) {
            first_error = Some(error);
            break;
        }
        outstanding += 1;
    }
    let mut reads = 0u64;
    let mut last_completion = started;
    let mut completions: Vec<(u64, i32)> = Vec::with_capacity(options.in_flight);
    while outstanding > 0 {
        if let Err(error) = submit_and_wait(&ring, "the read loop", block_bytes) {
            return Err(first_error.unwrap_or(error));
        }
        let now = Instant::now();
        completions.clear();
        completions.extend(ring.completion().map(|completion| (completion.user_data(), completion.result())));
        for &(slot, result) in &completions {
            outstanding -= 1;
            let slot = slot as usize;
            let (offset_bytes, issued) = issued_at[slot];
            // A short read is as wrong as a failed one: the file holds every byte asked for.
            if let Err(error) = check_write(result, length_bytes, "read", offset_bytes, block_bytes) {
                first_error.get_or_insert(error);
                continue;
            }
            reads += 1;
            last_completion = now;
            latencies.saturating_record(microseconds(now - issued));
            let more = next_offset_bytes + u64::from(length_bytes) <= file_bytes && now < deadline;
            if first_error.is_none() && more {
                if let Err(error) =
                    issue(&mut ring, &mut next_offset_bytes, slot, &mut buffers[slot], &mut issued_at[slot])
                {
                    first_error.get_or_insert(error);
                    continue;
                }
                outstanding += 1;
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    let seconds = (last_completion - started).as_secs_f64();
    let mb_per_sec = if seconds > 0.0 { (reads * block_bytes as u64) as f64 / seconds / 1e6 } else { 0.0 };
    Ok(ReadResult {
        block_bytes,
        reads,
        seconds,
        mb_per_sec,
        read_p50_us: latencies.value_at_quantile(0.50),
        read_p99_us: latencies.value_at_quantile(0.99),
        o_direct,
        in_flight: options.in_flight,
    })
}

/// Renders results as `{"results":[{...},...]}` by hand, so that the tool needs no serde.
pub fn to_json(results: &[DiskResult]) -> String {
    let entries: Vec<String> = results
        .iter()
        .map(|result| {
            format!(
                concat!(
                    "{{\"block_bytes\":{},\"mb_per_sec\":{},\"sync_p50_us\":{},",
                    "\"sync_p99_us\":{},\"writes_per_sec\":{},\"write_sync_p99_us\":{},",
                    "\"o_direct\":{},\"fresh\":{},\"writes\":{},\"seconds\":{}}}"
                ),
                result.block_bytes,
                json_number(result.mb_per_sec, 3),
                result.sync_p50_us,
                result.sync_p99_us,
                json_number(result.writes_per_sec, 1),
                result.write_sync_p99_us,
                result.o_direct,
                result.fresh,
                result.writes,
                json_number(result.seconds, 3),
            )
        })
        .collect();
    format!("{{\"results\":[{}]}}", entries.join(","))
}

/// JSON has no NaN or infinity, so those become null rather than an unparsable document.
fn json_number(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "null".to_string()
    }
}

fn describe(result: &DiskResult) -> String {
    let mode = if result.o_direct { "" } else { " (O_DIRECT not supported here, writes were buffered)" };
    let space = if result.fresh { " into fallocated space" } else { "" };
    format!(
        "disk {} B{space}: {:.1} MB/s, {:.0} writes/s, fdatasync p50 {} us p99 {} us{}",
        result.block_bytes,
        result.mb_per_sec,
        result.writes_per_sec,
        result.sync_p50_us,
        result.sync_p99_us,
        mode
    )
}

/// Rejects options that O_DIRECT or the ring could not honour, before any file is created.
fn validate(options: &DiskOptions) -> io::Result<()> {
    if !is_aligned(options.file_bytes) {
        return Err(invalid_input(format!(
            "file_bytes {} must be a non-zero multiple of {ALIGNMENT_BYTES}",
            options.file_bytes
        )));
    }
    if options.in_flight == 0 || options.in_flight > MAX_IN_FLIGHT {
        return Err(invalid_input(format!(
            "in_flight {} must be between 1 and {MAX_IN_FLIGHT}",
            options.in_flight
        )));
    }
    for &block_bytes in &options.block_sizes {
        if !is_aligned(block_bytes as u64) {
            return Err(invalid_input(format!(
                "block size {block_bytes} must be a non-zero multiple of {ALIGNMENT_BYTES}"
            )));
        }
        // The write length travels in a u32 field of the SQE.
        if u32::try_from(block_bytes).is_err() || block_bytes as u64 > options.file_bytes {
            return Err(invalid_input(format!(
                "block size {block_bytes} must fit in file_bytes {} and in 4 GiB",
                options.file_bytes
            )));
        }
    }
    Ok(())
}

/// True for a non-zero multiple of the O_DIRECT alignment. The mask works because the alignment
/// is a power of two, and unlike `is_multiple_of` it needs nothing newer than the workspace's
/// Rust 1.85.
fn is_aligned(value: u64) -> bool {
    value != 0 && value & (ALIGNMENT_BYTES as u64 - 1) == 0
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Runs the whole procedure for one block size: scratch file, pre-write, timed loop, cleanup.
fn measure_size(options: &DiskOptions, block_bytes: usize) -> io::Result<DiskResult> {
    // The guard is created before the file so that the file is removed on every path out of
    // this function, including a failed open that already created it.
    let scratch = ScratchFile::new(&options.data_dir, block_bytes);
    let (file, o_direct) = open_scratch(&scratch.path, block_bytes)?;
    let fd = types::Fd(file.as_raw_fd());

    // The buffers are declared before the ring so that the ring is dropped first: nothing the
    // kernel may still be reading from is freed while the ring is alive.
    let mut pattern = AlignedBuffer::new(block_bytes, false)?;
    pattern.as_mut_slice().fill(0xa5);
    let prewrite_bytes = PREWRITE_CHUNK_BYTES.min(options.file_bytes as usize);
    let zeroes = AlignedBuffer::new(prewrite_bytes, true)?;
    let ring_entries = options.in_flight.next_power_of_two().max(8);
    let mut ring = IoUring::new(ring_entries as u32)
        .map_err(|error| context(error, format!("disk {block_bytes} B: creating the io_uring")))?;

    allocate(fd, options.file_bytes, block_bytes)?;

    if !options.fresh {
        prewrite(&mut ring, fd, &zeroes, options.file_bytes, block_bytes)?;
    }
    let loop_result = timed_loop(&mut ring, fd, &pattern, options, block_bytes)?;

    let seconds = loop_result.elapsed.as_secs_f64();
    let bytes_written = loop_result.writes * block_bytes as u64;
    let (mb_per_sec, writes_per_sec) = if seconds > 0.0 {
        (bytes_written as f64 / seconds / 1e6, loop_result.writes as f64 / seconds)
    } else {
        (0.0, 0.0)
    };
    Ok(DiskResult {
        block_bytes,
        writes: loop_result.writes,
        seconds,
        mb_per_sec,
        writes_per_sec,
        sync_p50_us: loop_result.sync_microseconds.value_at_quantile(0.50),
        sync_p99_us: loop_result.sync_microseconds.value_at_quantile(0.99),
        write_sync_p99_us: loop_result.write_sync_microseconds.value_at_quantile(0.99),
        o_direct,
        fresh: options.fresh,
    })
}

fn allocate(fd: types::Fd, file_bytes: u64, block_bytes: usize) -> io::Result<()> {
    match fcntl::fallocate(fd.0, FallocateFlags::empty(), 0, file_bytes as nix::libc::off_t) {
        Ok(()) => Ok(()),
        // Some file systems cannot preallocate; writing allocates the blocks anyway.
        Err(Errno::EOPNOTSUPP) => Ok(()),
        Err(errno) => Err(context(
            io::Error::from(errno),
            format!("disk {block_bytes} B: fallocate of {file_bytes} bytes"),
        )),
    }
}

/// Opens the scratch file with O_DIRECT and reports whether O_DIRECT is really in effect.
///
/// A file system without O_DIRECT support rejects the open with EINVAL; the measurement then
/// falls back to buffered writes so that fdatasync can still be measured, and says so.
fn open_scratch(path: &Path, block_bytes: usize) -> io::Result<(File, bool)> {
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(path);
    let file = match direct {
        Ok(file) => file,
        Err(error) if error.raw_os_error() == Some(nix::libc::EINVAL) => {
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).map_err(
                |error| context(error, format!("disk {block_bytes} B: opening {}", path.display())),
            )?
        }
        Err(error) => {
            return Err(context(
                error,
                format!("disk {block_bytes} B: opening {} with O_DIRECT", path.display()),
            ))
        }
    };
    // Some file systems accept the flag at open time but silently drop it, so the flags are
    // read back rather than trusted.
    let flags = fcntl::fcntl(file.as_raw_fd(), FcntlArg::F_GETFL)
        .map_err(|errno| context(io::Error::from(errno), format!("disk {block_bytes} B: fcntl(F_GETFL)")))?;
    let o_direct = OFlag::from_bits_truncate(flags).contains(OFlag::O_DIRECT);
    Ok((file, o_direct))
}

/// Writes `chunk` over the whole file, again and again, and makes it durable (zeros for the
/// write ceiling, a pattern for the read one).
///
/// fdatasync after writing into space that is only fallocated has to convert unwritten extents
/// and commit metadata, which costs about three times as much as overwriting written blocks.
/// The ceiling is the best case, so the measurement overwrites written blocks.
fn prewrite(
    ring: &mut IoUring,
    fd: types::Fd,
    chunk: &AlignedBuffer,
    file_bytes: u64,
    block_bytes: usize,
) -> io::Result<()> {
    let mut offset_bytes = 0u64;
    while offset_bytes < file_bytes {
        let length_bytes = (file_bytes - offset_bytes).min(chunk.len() as u64) as u32;
        let entry = opcode::Write::new(fd, chunk.as_ptr(), length_bytes).offset(offset_bytes).build();
        let result = run_one(ring, entry, "pre-write", block_bytes)?;
        check_write(result, length_bytes, "pre-write", offset_bytes, block_bytes)?;
        offset_bytes += u64::from(length_bytes);
    }
    let entry = opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build();
    let result = run_one(ring, entry, "pre-write fdatasync", block_bytes)?;
    check_result(result, "pre-write fdatasync", block_bytes)?;
    Ok(())
}

/// Submits a single SQE and waits for its completion, returning the CQE's result.
fn run_one(
    ring: &mut IoUring,
    entry: io_uring::squeue::Entry,
    operation: &str,
    block_bytes: usize,
) -> io::Result<i32> {
    push(ring, &entry, operation, block_bytes)?;
    loop {
        submit_and_wait(ring, operation, block_bytes)?;
        if let Some(completion) = ring.completion().next() {
            return Ok(completion.result());
        }
    }
}

/// Pushes an SQE, submitting what is queued first if the submission queue is full.
fn push(
    ring: &mut IoUring,
    entry: &io_uring::squeue::Entry,
    operation: &str,
    block_bytes: usize,
) -> io::Result<()> {
    for _ in 0..2 {
        // SAFETY: every buffer an entry points at outlives the ring (see measure_size), and
        // every entry is reaped before the buffer is reused for anything else.
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        ring.submit().map_err(|error| {
            context(error, format!("disk {block_bytes} B: submitting before {operation}"))
        })?;
    }
    Err(io::Error::other(format!(
        "disk {block_bytes} B: io_uring submission queue stayed full for {operation}"
    )))
}

/// Submits queued SQEs and waits for at least one completion, retrying when a signal
/// interrupts the wait.
fn submit_and_wait(ring: &IoUring, operation: &str, block_bytes: usize) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                return Err(context(error, format!("disk {block_bytes} B: io_uring_enter for {operation}")))
            }
        }
    }
}

/// Turns a negative CQE result into an error naming the operation and the block size.
fn check_result(result: i32, operation: &str, block_bytes: usize) -> io::Result<u32> {
    if result < 0 {
        let error = io::Error::from_raw_os_error(-result);
        return Err(context(error, format!("disk {block_bytes} B: {operation} failed")));
    }
    Ok(result as u32)
}

/// A write that moved fewer bytes than asked is as bad as a failed one for a durability test.
fn check_write(
    result: i32,
    length_bytes: u32,
    operation: &str,
    offset_bytes: u64,
    block_bytes: usize,
) -> io::Result<()> {
    let written_bytes = check_result(result, operation, block_bytes)?;
    if written_bytes != length_bytes {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!(
                "disk {block_bytes} B: short {operation} at offset {offset_bytes}: \
                 {written_bytes} of {length_bytes} bytes"
            ),
        ));
    }
    Ok(())
}

/// Prefixes an error with what was being done, keeping its kind.
fn context(error: io::Error, what: String) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// What the timed loop measured.
struct LoopResult {
    writes: u64,
    elapsed: Duration,
    sync_microseconds: Histogram<u64>,
    write_sync_microseconds: Histogram<u64>,
}

/// One write+fdatasync pair that is in flight.
#[derive(Clone, Copy)]
struct Slot {
    offset_bytes: u64,
    write_started: Instant,
    sync_started: Instant,
}

/// Issues write+fdatasync pairs until `bytes_per_size` bytes or the time limit are reached.
///
/// Each of the `in_flight` slots runs its own sequence: write, wait for the write, fdatasync,
/// wait for the fdatasync, next write. With one slot every write is durable before the next
/// starts; with more, several fdatasyncs overlap, which shows what batching commits can gain.
fn timed_loop(
    ring: &mut IoUring,
    fd: types::Fd,
    pattern: &AlignedBuffer,
    options: &DiskOptions,
    block_bytes: usize,
) -> io::Result<LoopResult> {
    let mut sync_microseconds = new_histogram()?;
    let mut write_sync_microseconds = new_histogram()?;
    let length_bytes = block_bytes as u32;
    let started = Instant::now();
    let deadline = started + MAX_DURATION_PER_SIZE;
    let mut slots =
        vec![Slot { offset_bytes: 0, write_started: started, sync_started: started }; options.in_flight];
    let mut writer = SequentialWriter {
        fd,
        pattern,
        length_bytes,
        file_bytes: options.file_bytes,
        next_offset_bytes: 0,
        issued_bytes: 0,
        block_bytes,
        wrap: !options.fresh,
    };
    let mut outstanding = 0usize;
    let mut writes = 0u64;
    let mut last_completion = started;
    // After a failure no new work is issued, but what is already in flight is still reaped, so
    // that the kernel is done with the buffers before they are freed.
    let mut first_error: Option<io::Error> = None;
    let mut completions: Vec<(u64, i32)> = Vec::with_capacity(options.in_flight);

    for (slot_index, slot) in slots.iter_mut().enumerate() {
        // The first write is always issued so that even a tiny byte budget yields a figure.
        if slot_index > 0 && (writer.issued_bytes >= options.bytes_per_size || !writer.has_room()) {
            break;
        }
        if let Err(error) = writer.issue(ring, slot_index, slot) {
            first_error = Some(error);
            break;
        }
        outstanding += 1;
    }

    while outstanding > 0 {
        if let Err(error) = submit_and_wait(ring, "the timed loop", block_bytes) {
            // Without a working io_uring_enter nothing more can be reaped; the buffers stay
            // alive until the ring is closed, which is the best that can be done.
            return Err(first_error.unwrap_or(error));
        }
        // One timestamp per batch: every completion in the batch was already done when the
        // wait returned, so this is the closest observation for all of them.
        let now = Instant::now();
        completions.clear();
        completions.extend(ring.completion().map(|completion| (completion.user_data(), completion.result())));
        for &(data, result) in &completions {
            outstanding -= 1;
            let slot_index = (data >> 1) as usize;
            let operation = data & 1;
            let slot = slots[slot_index];
            if operation == OPERATION_WRITE {
                let checked = check_write(result, length_bytes, "write", slot.offset_bytes, block_bytes);
                if let Err(error) = checked {
                    first_error.get_or_insert(error);
                    continue;
                }
                if first_error.is_some() {
                    continue;
                }
                let entry = opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(user_data(slot_index, OPERATION_FSYNC));
                slots[slot_index].sync_started = Instant::now();
                if let Err(error) = push(ring, &entry, "fdatasync", block_bytes) {
                    first_error.get_or_insert(error);
                    continue;
                }
                outstanding += 1;
            } else {
                if let Err(error) = check_result(result, "fdatasync", block_bytes) {
                    first_error.get_or_insert(error);
                    continue;
                }
                writes += 1;
                last_completion = now;
                sync_microseconds.saturating_record(microseconds(now - slot.sync_started));
                write_sync_microseconds.saturating_record(microseconds(now - slot.write_started));
                let keep_going = first_error.is_none()
                    && writer.issued_bytes < options.bytes_per_size
                    && writer.has_room()
                    && now < deadline;
                if keep_going {
                    if let Err(error) = writer.issue(ring, slot_index, &mut slots[slot_index]) {
                        first_error.get_or_insert(error);
                        continue;
                    }
                    outstanding += 1;
                }
            }
        }
    }

    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(LoopResult { writes, elapsed: last_completion - started, sync_microseconds, write_sync_microseconds })
}

/// Hands out sequential write offsets like a log and queues the writes.
struct SequentialWriter<'a> {
    fd: types::Fd,
    pattern: &'a AlignedBuffer,
    length_bytes: u32,
    file_bytes: u64,
    next_offset_bytes: u64,
    issued_bytes: u64,
    block_bytes: usize,
    /// Start again at the beginning of the file at its end (over written blocks); otherwise the
    /// run ends there.
    wrap: bool,
}

impl SequentialWriter<'_> {
    /// Whether another write fits: always when wrapping.
    fn has_room(&self) -> bool {
        self.wrap || self.next_offset_bytes + u64::from(self.length_bytes) <= self.file_bytes
    }

    /// Queues the next write for `slot`, wrapping to the start of the file when the block would
    /// run past its end, as a log reuses its pre-written segment.
    fn issue(&mut self, ring: &mut IoUring, slot_index: usize, slot: &mut Slot) -> io::Result<()> {
        let length_bytes = u64::from(self.length_bytes);
        if self.next_offset_bytes + length_bytes > self.file_bytes {
            self.next_offset_bytes = 0;
        }
        slot.offset_bytes = self.next_offset_bytes;
        let entry = opcode::Write::new(self.fd, self.pattern.as_ptr(), self.length_bytes)
            .offset(slot.offset_bytes)
            .build()
            .user_data(user_data(slot_index, OPERATION_WRITE));
        slot.write_started = Instant::now();
        push(ring, &entry, "write", self.block_bytes)?;
        self.next_offset_bytes += length_bytes;
        self.issued_bytes += length_bytes;
        Ok(())
    }
}

fn user_data(slot_index: usize, operation: u64) -> u64 {
    ((slot_index as u64) << 1) | operation
}

fn new_histogram() -> io::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_MICROSECONDS, 3)
        .map_err(|error| io::Error::other(format!("creating a latency histogram: {error}")))
}

fn microseconds(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A heap buffer aligned for O_DIRECT, freed on drop.
struct AlignedBuffer {
    pointer: *mut u8,
    layout: Layout,
}

impl AlignedBuffer {
    fn new(length_bytes: usize, zeroed: bool) -> io::Result<AlignedBuffer> {
        let layout = Layout::from_size_align(length_bytes.max(1), ALIGNMENT_BYTES)
            .map_err(|error| invalid_input(format!("buffer of {length_bytes} bytes: {error}")))?;
        // SAFETY: the layout has a non-zero size, as alloc requires.
        let pointer = unsafe {
            if zeroed {
                alloc::alloc_zeroed(layout)
            } else {
                alloc::alloc(layout)
            }
        };
        if pointer.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("allocating a {length_bytes} byte aligned buffer"),
            ));
        }
        Ok(AlignedBuffer { pointer, layout })
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    fn as_ptr(&self) -> *const u8 {
        self.pointer
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the pointer covers layout.size() bytes that this value owns exclusively.
        // Bytes from a plain alloc are uninitialised, so callers only write through this slice
        // (fill) before anything reads the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from alloc or alloc_zeroed with this very layout.
        unsafe { alloc::dealloc(self.pointer, self.layout) }
    }
}

/// Owns the scratch file's name and removes the file when dropped, whatever happened.
struct ScratchFile {
    path: PathBuf,
}

impl ScratchFile {
    fn new(data_dir: &Path, block_bytes: usize) -> ScratchFile {
        let counter = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanoseconds =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|duration| duration.subsec_nanos()).unwrap_or(0);
        let name =
            format!(".ringpost-disk-probe-{}-{counter}-{nanoseconds}-{block_bytes}.tmp", std::process::id());
        ScratchFile { path: data_dir.join(name) }
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        // A missing file just means the open failed before creating it; any other failure
        // cannot be reported from drop, and the name makes a leftover easy to recognise.
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_json_renders_every_field() {
        let result = DiskResult {
            block_bytes: 4096,
            writes: 1000,
            seconds: 2.5,
            mb_per_sec: 1.6384,
            writes_per_sec: 400.0,
            sync_p50_us: 180,
            sync_p99_us: 310,
            write_sync_p99_us: 355,
            o_direct: true,
            fresh: false,
        };
        let expected = concat!(
            "{\"results\":[{\"block_bytes\":4096,\"mb_per_sec\":1.638,\"sync_p50_us\":180,",
            "\"sync_p99_us\":310,\"writes_per_sec\":400.0,\"write_sync_p99_us\":355,",
            "\"o_direct\":true,\"fresh\":false,\"writes\":1000,\"seconds\":2.500}]}"
        );
        assert_eq!(to_json(&[result]), expected);
    }

    #[test]
    fn to_json_of_nothing_is_an_empty_list() {
        assert_eq!(to_json(&[]), "{\"results\":[]}");
    }

    #[test]
    fn to_json_writes_null_for_non_finite_numbers() {
        let result = DiskResult {
            block_bytes: 4096,
            writes: 0,
            seconds: 0.0,
            mb_per_sec: f64::NAN,
            writes_per_sec: f64::INFINITY,
            sync_p50_us: 0,
            sync_p99_us: 0,
            write_sync_p99_us: 0,
            o_direct: false,
            fresh: false,
        };
        let json = to_json(&[result]);
        assert!(json.contains("\"mb_per_sec\":null"), "{json}");
        assert!(json.contains("\"writes_per_sec\":null"), "{json}");
    }

    /// A directory under /var/tmp, which is on a disk-backed file system that supports
    /// O_DIRECT, unlike /tmp on hosts where that is tmpfs.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(name: &str) -> TestDir {
            let path = PathBuf::from(format!("/var/tmp/ringpost-disk-test-{name}-{}", std::process::id()));
            fs::create_dir_all(&path).expect("create test directory under /var/tmp");
            TestDir(path)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn small_options(data_dir: &Path) -> DiskOptions {
        DiskOptions {
            data_dir: data_dir.to_path_buf(),
            block_sizes: vec![4096, 65536],
            bytes_per_size: 4 << 20,
            file_bytes: 8 << 20,
            in_flight: 1,
            fresh: false,
        }
    }

    fn assert_sane(results: &[DiskResult], directory: &Path) {
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].block_bytes, 4096);
        assert_eq!(results[1].block_bytes, 65536);
        for result in results {
            assert!(result.writes > 0, "{result:?}");
            assert!(result.mb_per_sec > 0.0, "{result:?}");
            assert!(result.writes_per_sec > 0.0, "{result:?}");
            assert!(result.o_direct, "{result:?}");
            assert!(result.sync_p50_us <= result.sync_p99_us, "{result:?}");
        }
        let leftovers: Vec<_> = fs::read_dir(directory).expect("list test directory").collect();
        assert!(leftovers.is_empty(), "scratch files left behind: {leftovers:?}");
    }

    #[test]
    fn measure_small_run_one_in_flight() {
        let directory = TestDir::new("one");
        let mut lines = Vec::new();
        let results =
            measure(&small_options(&directory.0), &mut |line| lines.push(line.to_string())).expect("measure");
        assert_sane(&results, &directory.0);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("disk 4096 B: "), "{lines:?}");
        // 4 MiB of 64 KiB writes is 64 writes, since the byte budget ends the run first.
        assert_eq!(results[1].writes, 64);
    }

    #[test]
    fn measure_small_run_several_in_flight() {
        let directory = TestDir::new("several");
        let options = DiskOptions { in_flight: 4, ..small_options(&directory.0) };
        let results = measure(&options, &mut |_| {}).expect("measure");
        assert_sane(&results, &directory.0);
        assert_eq!(results[1].writes, 64);
    }

    /// Into fallocated space each block is written once: the run ends at the end of the file
    /// (8 MiB of 64 KiB writes is 128 of them, though the budget would allow more), and the
    /// result says how it was measured.
    #[test]
    fn measure_reads_reads_the_whole_file_once() {
        let directory = TestDir::new("reads");
        let options = DiskOptions {
            block_sizes: vec![1 << 20],
            bytes_per_size: (4 << 20) - 4096,
            in_flight: 2,
            ..small_options(&directory.0)
        };
        let results = measure_reads(&options, &mut |_| {}).unwrap();
        assert_eq!(results.len(), 1);
        let result = &results[0];
        assert_eq!(result.reads, 4, "3 MiB and a bit, rounded up to whole 1 MiB reads, each once");
        assert!(result.mb_per_sec > 0.0 && result.read_p99_us >= result.read_p50_us);
        let json = reads_to_json(&results);
        assert!(json.starts_with("{\"results\":[{\"block_bytes\":1048576,") && json.contains("\"reads\":4,"));
        assert!(json.contains("\"in_flight\":2,"));
        assert_eq!(std::fs::read_dir(&directory.0).unwrap().count(), 0, "the scratch file is removed");
    }

    #[test]
    fn measure_fresh_writes_each_block_once() {
        let directory = TestDir::new("fresh");
        let options = DiskOptions { fresh: true, bytes_per_size: 64 << 20, ..small_options(&directory.0) };
        let results = measure(&options, &mut |_| {}).expect("measure");
        assert_sane(&results, &directory.0);
        assert_eq!(results[1].writes, 128);
        assert!(results.iter().all(|result| result.fresh));
        assert!(to_json(&results).contains("\"fresh\":true"));
        let options = DiskOptions { bytes_per_size: 16 << 20, ..small_options(&directory.0) };
        let results = measure(&options, &mut |_| {}).expect("measure");
        assert!(results[1].writes > 128, "over written blocks the run wraps: {results:?}");
        assert!(results.iter().all(|result| !result.fresh));
    }

    #[test]
    fn measure_rejects_unaligned_block_size() {
        let directory = TestDir::new("unaligned");
        let options = DiskOptions { block_sizes: vec![1000], ..small_options(&directory.0) };
        let error = measure(&options, &mut |_| {}).expect_err("unaligned size must fail");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn measure_names_the_block_size_when_the_directory_is_missing() {
        let options = DiskOptions {
            data_dir: PathBuf::from("/var/tmp/ringpost-disk-test-does-not-exist"),
            ..small_options(Path::new("."))
        };
        let error = measure(&options, &mut |_| {}).expect_err("missing directory must fail");
        assert!(error.to_string().contains("disk 4096 B"), "{error}");
    }
}
