//! The segmented, append-only, group-committed log. One per topic (messages) and one per
//! topic for its subscriptions' acknowledgements (the journal).
//!
//! # Write path (the durability contract)
//! 1. `append` queues the request's encoded records and waits; they have no offset yet.
//! 2. One flush task per log takes everything staged (up to `group_commit_bytes_max`, at least
//!    one request) and forms one batch: offsets are assigned now, so a failed commit leaves no
//!    gap.
//! 3. If the batch does not fit the active segment, a new segment is created: open
//!    (create) → fallocate → fdatasync → fsync(directory), all before any record in it can be
//!    acknowledged.
//! 4. The batch is written into fresh 4 KiB blocks at the segment's write position (never over
//!    a block holding acknowledged records), then fdatasync'ed.
//! 5. Only when fdatasync returns `Ok` are the appends resolved with their offsets; the caller
//!    acknowledges its publishers after that.
//! 6. A failed write or fdatasync fences the log: the batch's appends and every later one fail
//!    with `Unavailable`, and the sync is never retried and trusted. A full disk while creating
//!    a segment fails the batch with `ResourceExhausted` and leaves the log usable.
//!
//! # Recovery (`open`)
//! 1. Segment files are listed and sorted by the base offset in their names.
//! 2. Each segment is scanned from position 0: every batch must have a valid header checksum
//!    (which covers the log, segment and position), the expected base offset, and valid
//!    records. A zero header ends the segment's data.
//! 3. At the first invalid batch: if any valid batch follows (in this segment or a later one),
//!    the damage is in the middle of the log: recovery refuses to start and reports it, and
//!    deletes nothing. Otherwise it is a torn tail from an interrupted, unacknowledged commit:
//!    its bytes are zeroed, synced, and reported as discarded.
//! 4. Trailing segments that hold only zeros (created, never written) are removed.

pub mod record;

use crate::storage::{IoBuffer, Storage, StorageFile};
use crate::sync::{oneshot, Notify, Sender};
use record::{BatchError, BatchHeader, BLOCK_BYTES};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

#[derive(Clone, Debug)]
pub struct LogConfig {
    /// Size of a log's first segment; later segments double up to `segment_bytes_max`, so an
    /// idle topic costs little disk and a busy one rolls rarely.
    pub segment_bytes_initial: u64,
    pub segment_bytes_max: u64,
    /// Most bytes of records one group commit writes (one batch always takes at least one
    /// whole request, even a larger one).
    pub group_commit_bytes_max: usize,
    /// Most bytes of recently written batches kept in memory for readers.
    pub tail_cache_bytes_max: usize,
    /// Most bytes staged and waiting for a commit; beyond it appends get `ResourceExhausted`.
    pub staging_bytes_max: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes_initial: 1 << 20,
            segment_bytes_max: 64 << 20,
            group_commit_bytes_max: 4 << 20,
            tail_cache_bytes_max: 8 << 20,
            staging_bytes_max: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogError {
    /// A write or sync failed earlier; the log accepts no more appends.
    Fenced(String),
    /// The disk is full; the append may be retried later.
    NoSpace(String),
    /// Too much is waiting for the disk already.
    Overloaded,
    /// Stored bytes failed validation or could not be read.
    DataLoss(String),
    /// Recovery found damage it must not repair on its own.
    Corrupt(String),
    Io(String),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Fenced(why) => write!(f, "log is fenced after an I/O failure: {why}"),
            LogError::NoSpace(why) => write!(f, "no space left: {why}"),
            LogError::Overloaded => write!(f, "too many appends waiting for the disk"),
            LogError::DataLoss(why) => write!(f, "data loss: {why}"),
            LogError::Corrupt(why) => write!(f, "log is corrupt: {why}"),
            LogError::Io(why) => write!(f, "I/O error: {why}"),
        }
    }
}

/// What recovery found, for the log line an operator reads.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    pub batches: usize,
    pub records: u64,
    pub torn_bytes_discarded: u64,
    pub torn_at: Option<(PathBuf, u64)>,
    pub empty_segments_removed: usize,
    pub buffered_io_warning: bool,
}

/// A stored message, copied out of a validated batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub publish_time_ms: u64,
    pub ordering_key: String,
    pub attributes: Vec<(String, String)>,
    pub data: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
struct BatchEntry {
    header: BatchHeader,
    position: u64,
}

struct Segment<S: Storage> {
    base_offset: u64,
    path: PathBuf,
    file: Rc<S::File>,
    capacity: u64,
    write_position: u64,
    batches: Vec<BatchEntry>,
}

struct Staged {
    records: Vec<u8>,
    record_count: u32,
    reply: Sender<Result<(u64, u32), LogError>>,
}

struct LogInner<S: Storage> {
    log_id: u64,
    directory: PathBuf,
    config: LogConfig,
    segments: Vec<Segment<S>>,
    next_offset: u64,
    staged: VecDeque<Staged>,
    staged_bytes: usize,
    flushing: bool,
    fenced: Option<String>,
    tail_cache: VecDeque<(u64, Rc<S::Buffer>)>,
    tail_cache_bytes: usize,
    warned_buffered: bool,
}

/// A handle to one log. Cheap to clone; all clones share the log.
pub struct Log<S: Storage> {
    storage: S,
    inner: Rc<RefCell<LogInner<S>>>,
    committed: Notify,
}

impl<S: Storage> Clone for Log<S> {
    fn clone(&self) -> Self {
        Log { storage: self.storage.clone(), inner: self.inner.clone(), committed: self.committed.clone() }
    }
}

fn segment_name(base_offset: u64) -> String {
    format!("{base_offset:020}.seg")
}

fn io_text(error: &std::io::Error) -> String {
    error.to_string()
}

fn is_no_space(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(nix::libc::ENOSPC) || error.raw_os_error() == Some(nix::libc::EDQUOT)
}

/// Scan window for recovery reads.
const RECOVERY_READ_BYTES: usize = 1 << 20;

impl<S: Storage> Log<S> {
    /// Opens (recovering) or creates the log in `directory`.
    pub async fn open(
        storage: S,
        directory: &Path,
        log_id: u64,
        config: LogConfig,
    ) -> Result<(Log<S>, RecoveryReport), LogError> {
        storage.create_dir_all(directory).map_err(|e| LogError::Io(io_text(&e)))?;
        let mut report = RecoveryReport::default();
        let mut bases: Vec<u64> = storage
            .list_dir(directory)
            .map_err(|e| LogError::Io(io_text(&e)))?
            .iter()
            .filter_map(|name| name.strip_suffix(".seg").and_then(|base| base.parse().ok()))
            .collect();
        bases.sort_unstable();
        let mut segments: Vec<Segment<S>> = Vec::new();
        let mut next_offset: u64 = bases.first().copied().unwrap_or(0);
        let mut torn: Option<(usize, u64)> = None; // (segment index, position)
        let mut index = 0;
        while index < bases.len() {
            let base = bases[index];
            let path = directory.join(segment_name(base));
            let file = storage.open(&path, false).await.map_err(|e| LogError::Io(io_text(&e)))?;
            if !file.direct_io() {
                report.buffered_io_warning = true;
            }
            let size = file.size().await.map_err(|e| LogError::Io(io_text(&e)))?;
            let file = Rc::new(file);
            if torn.is_some() {
                // Anything after a torn tail must be empty; otherwise the damage is mid-log.
                if first_valid_batch(&*file, log_id, base, 0, size).await?.is_some() {
                    return Err(LogError::Corrupt(format!(
                        "{} holds valid batches after an invalid one in an earlier segment; refusing to start (nothing was deleted)",
                        path.display()
                    )));
                }
                if last_nonzero_end(&*file, size).await? == 0 {
                    storage.remove_file(&path).map_err(|e| LogError::Io(io_text(&e)))?;
                    report.empty_segments_removed += 1;
                    index += 1;
                    continue;
                }
                return Err(LogError::Corrupt(format!(
                    "{} follows a torn segment and holds non-zero bytes; refusing to start",
                    path.display()
                )));
            }
            if base != next_offset {
                if last_nonzero_end(&*file, size).await? == 0 {
                    // A segment created for a commit that never happened, named after offsets
                    // that recovery has since cut: it holds no data.
                    storage.remove_file(&path).map_err(|e| LogError::Io(io_text(&e)))?;
                    report.empty_segments_removed += 1;
                    index += 1;
                    continue;
                }
                return Err(LogError::Corrupt(format!(
                    "{} starts at offset {base} but the log before it ends at {next_offset}; refusing to start",
                    path.display()
                )));
            }
            let mut segment = Segment {
                base_offset: base,
                path: path.clone(),
                file: file.clone(),
                capacity: size,
                write_position: 0,
                batches: Vec::new(),
            };
            let mut position = 0u64;
            let mut window = Window::new();
            loop {
                if position + BLOCK_BYTES as u64 > size {
                    break;
                }
                match read_batch(&*file, &mut window, log_id, base, position, size).await? {
                    ReadBatch::Valid(header) => {
                        if header.base_offset != next_offset {
                            return Err(LogError::Corrupt(format!(
                                "{} at byte {position}: batch starts at offset {} where {next_offset} was expected; refusing to start",
                                path.display(),
                                header.base_offset
                            )));
                        }
                        segment.batches.push(BatchEntry { header, position });
                        report.batches += 1;
                        report.records += header.record_count as u64;
                        next_offset = header.end_offset();
                        position += header.disk_bytes() as u64;
                    }
                    ReadBatch::Empty => break,
                    ReadBatch::Invalid(why) => {
                        if let Some(found) =
                            first_valid_batch(&*file, log_id, base, position + BLOCK_BYTES as u64, size)
                                .await?
                        {
                            return Err(LogError::Corrupt(format!(
                                "{} at byte {position}: {why}, but a valid batch follows at byte {found}: mid-log corruption; refusing to start (nothing was deleted)",
                                path.display()
                            )));
                        }
                        torn = Some((segments.len(), position));
                        break;
                    }
                }
            }
            segment.write_position = position;
            report.segments += 1;
            segments.push(segment);
            index += 1;
        }
        if let Some((segment_index, position)) = torn {
            let segment = &segments[segment_index];
            let end = last_nonzero_end(&*segment.file, segment.capacity).await?;
            let discarded = end.saturating_sub(position);
            if discarded > 0 {
                zero_range(&storage, &*segment.file, position, end).await?;
                segment.file.sync_data().await.map_err(|e| LogError::Io(io_text(&e)))?;
            }
            report.torn_bytes_discarded = discarded;
            report.torn_at = Some((segment.path.clone(), position));
        }
        let log = Log {
            storage,
            inner: Rc::new(RefCell::new(LogInner {
                log_id,
                directory: directory.to_path_buf(),
                config,
                segments,
                next_offset,
                staged: VecDeque::new(),
                staged_bytes: 0,
                flushing: false,
                fenced: None,
                tail_cache: VecDeque::new(),
                tail_cache_bytes: 0,
                warned_buffered: report.buffered_io_warning,
            })),
            committed: Notify::new(),
        };
        Ok((log, report))
    }

    /// The offset the next committed record will get: every offset below it is durable.
    pub fn end_offset(&self) -> u64 {
        self.inner.borrow().next_offset
    }

    /// The oldest offset still stored.
    pub fn start_offset(&self) -> u64 {
        let inner = self.inner.borrow();
        inner.segments.first().map(|segment| segment.base_offset).unwrap_or(inner.next_offset)
    }

    pub fn is_fenced(&self) -> Option<String> {
        self.inner.borrow().fenced.clone()
    }

    /// Resolves after the next commit.
    pub fn committed(&self) -> crate::sync::Notified {
        self.committed.notified()
    }

    /// Appends `record_count` unsealed records (see `record::encode_record_unsealed`) and
    /// resolves, after they are durable, with the offset of the first and the count. The
    /// records are copied once more, into the aligned buffer of the commit that takes them.
    pub async fn append(&self, records: Vec<u8>, record_count: u32) -> Result<(u64, u32), LogError> {
        let receiver = {
            let mut inner = self.inner.borrow_mut();
            if let Some(why) = &inner.fenced {
                return Err(LogError::Fenced(why.clone()));
            }
            if inner.staged_bytes + records.len() > inner.config.staging_bytes_max {
                return Err(LogError::Overloaded);
            }
            inner.staged_bytes += records.len();
            let (reply, receiver) = oneshot();
            inner.staged.push_back(Staged { records, record_count, reply });
            let start_flushing = !inner.flushing;
            inner.flushing = true;
            drop(inner);
            if start_flushing {
                let log = self.clone();
                glommio::spawn_local(async move { log.flush_loop().await }).detach();
            }
            receiver
        };
        match receiver.await {
            Some(result) => result,
            None => Err(LogError::Io("the commit task ended without an answer".into())),
        }
    }

    async fn flush_loop(&self) {
        // Let the appends that are already runnable stage their records first, so the first
        // commit after an idle period is shared too.
        futures_lite::future::yield_now().await;
        loop {
            let batch: Vec<Staged> = {
                let mut inner = self.inner.borrow_mut();
                if inner.staged.is_empty() {
                    inner.flushing = false;
                    return;
                }
                let mut take_bytes = 0;
                let mut take = 0;
                for staged in inner.staged.iter() {
                    if take > 0 && take_bytes + staged.records.len() > inner.config.group_commit_bytes_max {
                        break;
                    }
                    take_bytes += staged.records.len();
                    take += 1;
                }
                inner.staged_bytes -= take_bytes;
                inner.staged.drain(..take).collect()
            };
            let count: u32 = batch.iter().map(|staged| staged.record_count).sum();
            let result = self.commit(&batch, count).await;
            match result {
                Ok(mut first) => {
                    for staged in batch {
                        staged.reply.send(Ok((first, staged.record_count)));
                        first += staged.record_count as u64;
                    }
                    self.committed.notify_all();
                }
                Err(error) => {
                    for staged in batch {
                        staged.reply.send(Err(error.clone()));
                    }
                    if let LogError::Fenced(_) = error {
                        let mut inner = self.inner.borrow_mut();
                        for staged in inner.staged.drain(..) {
                            staged.reply.send(Err(error.clone()));
                        }
                        inner.staged_bytes = 0;
                        inner.flushing = false;
                        return;
                    }
                }
            }
        }
    }

    fn fence(&self, why: String) -> LogError {
        let mut inner = self.inner.borrow_mut();
        eprintln!("ringpostd: ERROR: fencing log {} ({}): {why}", inner.log_id, inner.directory.display());
        inner.fenced = Some(why.clone());
        LogError::Fenced(why)
    }

    async fn commit(&self, batch: &[Staged], count: u32) -> Result<u64, LogError> {
        let records_bytes: usize = batch.iter().map(|staged| staged.records.len()).sum();
        let disk_bytes = record::batch_disk_bytes(records_bytes);
        let needs_segment = {
            let inner = self.inner.borrow();
            match inner.segments.last() {
                Some(segment) => segment.write_position + disk_bytes as u64 > segment.capacity,
                None => true,
            }
        };
        if needs_segment {
            self.roll(disk_bytes as u64).await?;
        }
        let (file, position, segment_base, base_offset, log_id) = {
            let inner = self.inner.borrow();
            let segment = inner.segments.last().unwrap();
            (
                segment.file.clone(),
                segment.write_position,
                segment.base_offset,
                inner.next_offset,
                inner.log_id,
            )
        };
        let mut buffer = self.storage.alloc_buffer(disk_bytes);
        {
            let bytes = buffer.bytes_mut();
            let mut at = record::BATCH_HEADER_BYTES;
            for staged in batch {
                bytes[at..at + staged.records.len()].copy_from_slice(&staged.records);
                at += staged.records.len();
            }
            let records_end = record::BATCH_HEADER_BYTES + records_bytes;
            record::seal_records(log_id, &mut bytes[record::BATCH_HEADER_BYTES..records_end], base_offset);
            bytes[records_end..].fill(0);
            record::encode_batch_header(
                bytes,
                log_id,
                segment_base,
                position,
                base_offset,
                count,
                records_bytes as u32,
            );
        }
        let buffer = Rc::new(buffer);
        if let Err(error) = file.write_at(buffer.clone(), position).await {
            return Err(self.fence(format!("write of {disk_bytes} bytes at {position} failed: {error}")));
        }
        if let Err(error) = file.sync_data().await {
            return Err(self.fence(format!("fdatasync after writing at {position} failed: {error}")));
        }
        let mut inner = self.inner.borrow_mut();
        let header = BatchHeader { base_offset, record_count: count, records_bytes: records_bytes as u32 };
        let segment = inner.segments.last_mut().unwrap();
        segment.batches.push(BatchEntry { header, position });
        segment.write_position += disk_bytes as u64;
        inner.next_offset = base_offset + count as u64;
        inner.tail_cache.push_back((base_offset, buffer));
        inner.tail_cache_bytes += disk_bytes;
        while inner.tail_cache_bytes > inner.config.tail_cache_bytes_max && inner.tail_cache.len() > 1 {
            let (_, old) = inner.tail_cache.pop_front().unwrap();
            inner.tail_cache_bytes -= old.bytes().len();
        }
        Ok(base_offset)
    }

    /// Creates the next segment. Order matters for crash safety: the file is allocated and
    /// synced, and its directory entry made durable, before anything in it is acknowledged.
    async fn roll(&self, at_least_bytes: u64) -> Result<(), LogError> {
        let (path, directory, capacity, base_offset) = {
            let inner = self.inner.borrow();
            let previous = inner.segments.last().map(|segment| segment.capacity).unwrap_or(0);
            let next = if previous == 0 {
                inner.config.segment_bytes_initial
            } else {
                (previous * 2).min(inner.config.segment_bytes_max)
            };
            let capacity = next.max(record::align_up(at_least_bytes as usize, BLOCK_BYTES) as u64);
            let base_offset = inner.next_offset;
            (inner.directory.join(segment_name(base_offset)), inner.directory.clone(), capacity, base_offset)
        };
        let file = match self.storage.open(&path, true).await {
            Ok(file) => file,
            Err(error) if is_no_space(&error) => return Err(LogError::NoSpace(io_text(&error))),
            Err(error) => return Err(self.fence(format!("creating {} failed: {error}", path.display()))),
        };
        if let Err(error) = file.allocate(capacity).await {
            let _ = self.storage.remove_file(&path);
            if is_no_space(&error) {
                return Err(LogError::NoSpace(format!(
                    "allocating {capacity} bytes for {}: {error}",
                    path.display()
                )));
            }
            return Err(self.fence(format!("allocating {} failed: {error}", path.display())));
        }
        if let Err(error) = file.sync_data().await {
            return Err(self.fence(format!("syncing new segment {} failed: {error}", path.display())));
        }
        if let Err(error) = self.storage.sync_dir(&directory).await {
            return Err(self.fence(format!("syncing directory {} failed: {error}", directory.display())));
        }
        let mut inner = self.inner.borrow_mut();
        if !file.direct_io() && !inner.warned_buffered {
            inner.warned_buffered = true;
            eprintln!(
                "ringpostd: WARNING: O_DIRECT did not take effect for {} (the filesystem does not support direct I/O); \
                 writes go through the page cache and rely on fdatasync alone",
                path.display()
            );
        }
        inner.segments.push(Segment {
            base_offset,
            path,
            file: Rc::new(file),
            capacity,
            write_position: 0,
            batches: Vec::new(),
        });
        Ok(())
    }

    /// Reads records from `from` on, at most `max_records` of them and (beyond the first) at
    /// most `max_bytes` of data. Every record returned passed its checksum.
    pub async fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, LogError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut offset = from.max(self.start_offset());
        while out.len() < max_records && offset < self.end_offset() {
            let records = self.read_batch_at(offset).await?;
            if records.is_empty() {
                break;
            }
            for record in records {
                if record.offset < offset {
                    continue;
                }
                if out.len() >= max_records || (!out.is_empty() && bytes + record.data.len() > max_bytes) {
                    return Ok(out);
                }
                bytes += record.data.len();
                offset = record.offset + 1;
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Reads the records at the given offsets (sorted), skipping offsets no longer stored.
    pub async fn read_offsets(&self, offsets: &[u64]) -> Result<Vec<StoredRecord>, LogError> {
        let mut out = Vec::with_capacity(offsets.len());
        let mut index = 0;
        let start = self.start_offset();
        while index < offsets.len() {
            if offsets[index] < start {
                index += 1;
                continue;
            }
            let records = self.read_batch_at(offsets[index]).await?;
            let Some(last) = records.last().map(|record| record.offset) else {
                break;
            };
            let first = records[0].offset;
            let mut records = records.into_iter().peekable();
            while index < offsets.len() && offsets[index] <= last && offsets[index] >= first {
                let wanted = offsets[index];
                while records.peek().is_some_and(|record| record.offset < wanted) {
                    records.next();
                }
                if let Some(record) = records.next() {
                    out.push(record);
                }
                index += 1;
            }
            if index < offsets.len() && offsets[index] < first {
                index += 1;
            }
        }
        Ok(out)
    }

    /// The whole batch holding `offset`, validated.
    async fn read_batch_at(&self, offset: u64) -> Result<Vec<StoredRecord>, LogError> {
        let (entry, file, segment_base, log_id, cached) = {
            let inner = self.inner.borrow();
            let segment_index =
                match inner.segments.binary_search_by_key(&offset, |segment| segment.base_offset) {
                    Ok(index) => index,
                    Err(0) => return Ok(Vec::new()),
                    Err(index) => index - 1,
                };
            let segment = &inner.segments[segment_index];
            let batch_index =
                match segment.batches.binary_search_by_key(&offset, |entry| entry.header.base_offset) {
                    Ok(index) => index,
                    Err(0) => return Ok(Vec::new()),
                    Err(index) => index - 1,
                };
            let entry = segment.batches[batch_index];
            if offset >= entry.header.end_offset() {
                return Ok(Vec::new());
            }
            let cached = inner
                .tail_cache
                .iter()
                .rev()
                .find(|(base, _)| *base == entry.header.base_offset)
                .map(|(_, buffer)| buffer.clone());
            (entry, segment.file.clone(), segment.base_offset, inner.log_id, cached)
        };
        let decode = |bytes: &[u8]| -> Result<Vec<StoredRecord>, LogError> {
            let header = record::decode_batch_header(bytes, log_id, segment_base, entry.position).map_err(
                |error| {
                    LogError::DataLoss(format!(
                        "batch at offset {} (segment {segment_base}, byte {}): {error}",
                        entry.header.base_offset, entry.position
                    ))
                },
            )?;
            let views = record::decode_batch(bytes, log_id, &header).map_err(|error| {
                LogError::DataLoss(format!(
                    "batch at offset {} (segment {segment_base}, byte {}): {error}",
                    entry.header.base_offset, entry.position
                ))
            })?;
            Ok(views
                .into_iter()
                .map(|view| StoredRecord {
                    offset: view.offset,
                    publish_time_ms: view.publish_time_ms,
                    ordering_key: view.ordering_key.to_owned(),
                    attributes: view.attributes().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
                    data: view.data.to_vec(),
                })
                .collect())
        };
        match cached {
            Some(buffer) => decode(buffer.bytes()),
            None => {
                let bytes =
                    file.read_at(entry.position, entry.header.disk_bytes()).await.map_err(|error| {
                        LogError::DataLoss(format!("reading batch at {}: {error}", entry.position))
                    })?;
                decode(&bytes)
            }
        }
    }

    /// Deletes whole segments all of whose records are below `offset` (never the active one).
    /// Returns the number of segments removed.
    pub async fn remove_before(&self, offset: u64) -> Result<usize, LogError> {
        let removable: Vec<PathBuf> = {
            let inner = self.inner.borrow();
            let count = inner.segments.len();
            inner
                .segments
                .iter()
                .enumerate()
                .take_while(|(index, segment)| {
                    *index + 1 < count
                        && inner.segments[index + 1].base_offset <= offset
                        && segment.base_offset < offset
                })
                .map(|(_, segment)| segment.path.clone())
                .collect()
        };
        if removable.is_empty() {
            return Ok(0);
        }
        {
            let mut inner = self.inner.borrow_mut();
            inner.segments.drain(..removable.len());
        }
        for path in &removable {
            self.storage.remove_file(path).map_err(|e| LogError::Io(io_text(&e)))?;
        }
        let directory = self.inner.borrow().directory.clone();
        self.storage.sync_dir(&directory).await.map_err(|e| LogError::Io(io_text(&e)))?;
        Ok(removable.len())
    }

    /// Bytes of segment files (allocated capacity).
    pub fn disk_bytes(&self) -> u64 {
        self.inner.borrow().segments.iter().map(|segment| segment.capacity).sum()
    }
}

enum ReadBatch {
    Valid(BatchHeader),
    Empty,
    Invalid(String),
}

/// A read-ahead window over a segment for the recovery scan: batches are parsed out of one
/// large read instead of one read per batch.
struct Window<R> {
    start: u64,
    bytes: Option<R>,
}

impl<R: std::ops::Deref<Target = [u8]>> Window<R> {
    fn new() -> Window<R> {
        Window { start: 0, bytes: None }
    }

    /// The bytes at `[position, position + length)` (fewer at the end of the file).
    async fn at<F: StorageFile<Read = R>>(
        &mut self,
        file: &F,
        position: u64,
        length: usize,
        size: u64,
    ) -> Result<&[u8], LogError> {
        let covered = self.bytes.as_ref().is_some_and(|bytes| {
            position >= self.start && position + length as u64 <= self.start + bytes.len() as u64
        });
        if !covered {
            let want = (length.max(RECOVERY_READ_BYTES) as u64).min(size.saturating_sub(position)) as usize;
            let want = record::align_up(want, BLOCK_BYTES);
            self.bytes = Some(file.read_at(position, want).await.map_err(|e| LogError::Io(io_text(&e)))?);
            self.start = position;
        }
        let bytes = self.bytes.as_ref().unwrap();
        let from = (position - self.start) as usize;
        let to = (from + length).min(bytes.len());
        Ok(&bytes[from.min(to)..to])
    }
}

async fn read_batch<F: StorageFile>(
    file: &F,
    window: &mut Window<F::Read>,
    log_id: u64,
    segment_base: u64,
    position: u64,
    size: u64,
) -> Result<ReadBatch, LogError> {
    let head = window.at(file, position, BLOCK_BYTES, size).await?;
    let header = match record::decode_batch_header(head, log_id, segment_base, position) {
        Ok(header) => header,
        Err(BatchError::Empty) => return Ok(ReadBatch::Empty),
        Err(error) => return Ok(ReadBatch::Invalid(error.to_string())),
    };
    if position + header.disk_bytes() as u64 > size {
        return Ok(ReadBatch::Invalid("batch extends past the end of the segment".into()));
    }
    let whole = window.at(file, position, header.disk_bytes(), size).await?;
    Ok(match record::decode_batch(whole, log_id, &header) {
        Ok(_) => ReadBatch::Valid(header),
        Err(error) => ReadBatch::Invalid(error.to_string()),
    })
}

/// The position of the first block at or after `from` that starts a fully valid batch.
async fn first_valid_batch<F: StorageFile>(
    file: &F,
    log_id: u64,
    segment_base: u64,
    from: u64,
    size: u64,
) -> Result<Option<u64>, LogError> {
    let mut window = Window::new();
    let mut position = from;
    while position + BLOCK_BYTES as u64 <= size {
        let head = window.at(file, position, BLOCK_BYTES, size).await?;
        if record::decode_batch_header(head, log_id, segment_base, position).is_ok() {
            if let ReadBatch::Valid(_) =
                read_batch(file, &mut window, log_id, segment_base, position, size).await?
            {
                return Ok(Some(position));
            }
        }
        position += BLOCK_BYTES as u64;
    }
    Ok(None)
}

/// The end of the last block holding a non-zero byte.
async fn last_nonzero_end<F: StorageFile>(file: &F, size: u64) -> Result<u64, LogError> {
    let mut position = 0;
    let mut end = 0;
    while position < size {
        let window = (size - position).min(RECOVERY_READ_BYTES as u64) as usize;
        let bytes = file.read_at(position, window).await.map_err(|e| LogError::Io(io_text(&e)))?;
        if bytes.is_empty() {
            break;
        }
        for (index, block) in bytes.chunks(BLOCK_BYTES).enumerate() {
            if block.iter().any(|byte| *byte != 0) {
                end = position + ((index + 1) * BLOCK_BYTES) as u64;
            }
        }
        position += bytes.len() as u64;
    }
    Ok(end.min(size))
}

async fn zero_range<S: Storage>(storage: &S, file: &S::File, from: u64, to: u64) -> Result<(), LogError> {
    let mut position = from;
    while position < to {
        let length = ((to - position) as usize).min(RECOVERY_READ_BYTES);
        let buffer = Rc::new(storage.alloc_buffer(record::align_up(length, BLOCK_BYTES)));
        file.write_at(buffer, position).await.map_err(|e| LogError::Io(io_text(&e)))?;
        position += length as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
