//! Reads: readers see committed batches only, each validated (its header against the index,
//! its checksums when read from disk) before a record of it is returned, from the tail cache
//! (the commits' own buffers), from extents read ahead for readers going through the log in
//! order, or from the first copy whose bytes pass; a copy that fails is repaired from the good
//! one (`resync`). The tail caches of a shard's logs share one budget (`TailCacheBudget`).

use super::*;

/// Bytes the tail caches of many logs hold together. Each log's cache is bounded on its own,
/// but 10,000 topics times a bounded cache is still too much: the logs of a shard share one
/// budget, and a log over it gives back its oldest batches first.
#[derive(Debug)]
pub struct TailCacheBudget {
    // An atomic only so that a `LogConfig` can cross to the shard's thread before its logs
    // exist; each shard makes its own budget, so there is never contention.
    used_bytes: AtomicUsize,
    bytes_max: usize,
}

impl TailCacheBudget {
    pub fn new(bytes_max: usize) -> Arc<TailCacheBudget> {
        Arc::new(TailCacheBudget { used_bytes: AtomicUsize::new(0), bytes_max })
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::Relaxed)
    }

    pub(super) fn over(&self) -> bool {
        self.used_bytes() > self.bytes_max
    }

    /// Read-ahead may take the budget up to three quarters, so that it never pushes the tail
    /// caches of busy topics out.
    fn has_room_to_read_ahead(&self) -> bool {
        self.used_bytes() + READ_AHEAD_BYTES <= self.bytes_max / 4 * 3
    }

    pub(super) fn charge(&self, bytes: usize) {
        self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn refund(&self, bytes: usize) {
        self.used_bytes.fetch_sub(bytes.min(self.used_bytes()), Ordering::Relaxed);
    }
}

/// Sweeps (`Log::release_idle_cache`, once a second) without a commit after which a log drops
/// its tail cache: the readers of an idle topic have caught up or will read from disk.
pub const TAIL_CACHE_IDLE_SWEEPS: u8 = 10;

/// Records copied out of one batch, and where the batch ends.
#[derive(Default)]
struct BatchRead {
    end: u64,
    records: Vec<StoredRecord>,
}

/// The bytes of a validated batch, held for as long as a reader needs them.
pub enum HeldBytes<S: Storage> {
    /// From the tail cache: the commit's own buffer.
    Cached(Rc<S::Buffer>),
    /// Read from disk (an extent read ahead, or the batch alone), from this position on.
    Read(Rc<<S::File as StorageFile>::Read>, usize),
}

impl<S: Storage> HeldBytes<S> {
    fn bytes(&self) -> &[u8] {
        match self {
            HeldBytes::Cached(buffer) => buffer.bytes(),
            HeldBytes::Read(read, start) => &read[*start..],
        }
    }
}

/// A validated batch a reader holds: its records are views into it, copied nowhere.
pub struct HeldBatch<S: Storage> {
    bytes: HeldBytes<S>,
    log_id: u64,
    header: BatchHeader,
}

impl<S: Storage> HeldBatch<S> {
    /// One past its last record.
    pub fn end_offset(&self) -> Offset {
        Offset::new(self.header.end_offset())
    }

    /// Its first record's offset.
    pub fn base_offset(&self) -> Offset {
        Offset::new(self.header.base_offset)
    }

    /// The bytes of its records (what holding it costs, but for the block padding; the buffer
    /// it was read into may be a larger extent).
    pub fn records_bytes(&self) -> usize {
        self.header.records_bytes as usize
    }

    /// The bytes it was read into, from the batch's start: its records' views point inside.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.bytes()
    }

    /// The epoch of the leader that wrote it.
    pub fn epoch(&self) -> Epoch {
        Epoch::new(self.header.epoch)
    }

    /// How many records it holds.
    pub fn record_count(&self) -> u32 {
        self.header.record_count
    }

    /// Its records as they lie in it, sealed (offsets and checksums in place): what a leader
    /// sends a follower, which checks them (`record::check_sealed_records`) and seals them
    /// again at the same offsets, to the same bytes.
    pub fn sealed_records(&self) -> &[u8] {
        let start = self.header.header_bytes();
        &self.bytes.bytes()[start..start + self.header.records_bytes as usize]
    }

    /// Its records, in offset order. They passed their checksums when the batch was read from
    /// disk, so only their layout is checked again.
    pub fn records(&self) -> Result<Vec<record::RecordView<'_>>, LogError> {
        self.records_in(Offset::ZERO..Offset::new(u64::MAX))
    }

    /// Its records whose offsets are in `wanted`, the others not parsed.
    pub fn records_in(
        &self,
        wanted: std::ops::Range<Offset>,
    ) -> Result<Vec<record::RecordView<'_>>, LogError> {
        let wanted = wanted.start.get()..wanted.end.get();
        record::decode_batch_range(self.bytes.bytes(), self.log_id, &self.header, false, wanted).map_err(
            |error| LogError::DataLoss(format!("batch at offset {}: {error}", self.header.base_offset)),
        )
    }
}

impl<S: Storage> AsRef<[u8]> for HeldBatch<S> {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

/// The offsets from the first of `offsets` (sorted) to its last, inclusive: what a reader of
/// them needs parsed (`HeldBatch::records_in`).
pub fn span(offsets: &[Offset]) -> std::ops::Range<Offset> {
    offsets.first().copied().unwrap_or(Offset::ZERO)..offsets.last().map_or(Offset::ZERO, |last| *last + 1)
}

/// A stored message, copied out of a validated batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: Offset,
    pub publish_time_ms: u64,
    pub ordering_key: String,
    pub attributes: Vec<(String, String)>,
    pub data: Vec<u8>,
}

impl StoredRecord {
    fn of(view: &record::RecordView<'_>) -> StoredRecord {
        StoredRecord {
            offset: view.offset,
            publish_time_ms: view.publish_time_ms,
            ordering_key: view.ordering_key.to_owned(),
            attributes: view.attributes().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
            data: view.data.to_vec(),
        }
    }
}

/// One read of whole batches, planned while the log is borrowed and done after.
struct ExtentPlan<S: Storage> {
    file: Rc<S::File>,
    log_id: u64,
    segment_base: u64,
    position: u64,
    bytes: usize,
    end_offset: u64,
    batches: Vec<BatchEntry>,
}

impl<S: Storage> ExtentPlan<S> {
    /// Reads the extent and validates every batch in it, as a batch read alone is. None if the
    /// read or any check fails: the reader then reads batch by batch, copy by copy, which
    /// reports the damage and repairs it from another copy.
    async fn read(self) -> Option<Extent<<S::File as StorageFile>::Read>> {
        let bytes = self.file.read_at(self.position, self.bytes).await.ok()?;
        if bytes.len() < self.bytes {
            return None;
        }
        for entry in &self.batches {
            let batch = &bytes[(entry.position - self.position) as usize..];
            let header =
                record::decode_batch_header(batch, self.log_id, self.segment_base, entry.position).ok()?;
            if header != entry.header {
                return None;
            }
            record::decode_batch_checked(batch, self.log_id, &header, true).ok()?;
        }
        Some(Extent {
            segment_base: self.segment_base,
            position: self.position,
            base_offset: self.batches.first()?.header.base_offset,
            end_offset: self.end_offset,
            bytes: Rc::new(bytes),
        })
    }
}

/// What a log keeps in memory for its readers, charged to the shard's `TailCacheBudget` and
/// given back when dropped (`LogInner`'s `Drop`). (Sweeps since the last commit are
/// `LogInner::idle_sweeps`.)
pub(super) struct ReadCache<S: Storage> {
    /// The last commits' own buffers, by base offset, in commit order.
    pub(super) tail_cache: VecDeque<(u64, Rc<S::Buffer>)>,
    pub(super) tail_cache_bytes: usize,
    /// Extents read ahead for readers going through the log in order; made on the first read
    /// from disk (boxed: most logs are never read from disk).
    pub(super) read_ahead: Option<Box<ReadAhead<<S::File as StorageFile>::Read>>>,
}

impl<S: Storage> ReadCache<S> {
    pub(super) fn new() -> ReadCache<S> {
        ReadCache { tail_cache: VecDeque::new(), tail_cache_bytes: 0, read_ahead: None }
    }
}

impl<S: Storage> LogInner<S> {
    pub(super) fn drop_oldest_cached(&mut self) {
        if let Some((_, old)) = self.cache.tail_cache.pop_front() {
            let bytes = old.bytes().len();
            self.cache.tail_cache_bytes -= bytes;
            if let Some(budget) = &self.config.tail_cache_budget {
                budget.refund(bytes);
            }
        }
    }

    pub(super) fn drop_tail_cache(&mut self) {
        while !self.cache.tail_cache.is_empty() {
            self.drop_oldest_cached();
        }
    }

    fn has_room_to_read_ahead(&self) -> bool {
        self.config.tail_cache_budget.as_ref().is_none_or(|budget| budget.has_room_to_read_ahead())
    }

    fn keep_extent(&mut self, extent: Extent<<S::File as StorageFile>::Read>) {
        let added = extent.bytes.len();
        let dropped = self.cache.read_ahead.get_or_insert_with(Default::default).insert(extent);
        if let Some(budget) = &self.config.tail_cache_budget {
            budget.charge(added);
            budget.refund(dropped);
        }
    }

    pub(super) fn drop_read_ahead(&mut self) {
        if let Some(mut cache) = self.cache.read_ahead.take() {
            // Nobody may be left waiting on a read whose result has nowhere to go.
            cache.finish_reading();
            if let Some(budget) = &self.config.tail_cache_budget {
                budget.refund(cache.bytes());
            }
        }
    }

    /// The batches to read in one I/O from the batch starting at `base_offset` on: up to
    /// `READ_AHEAD_BYTES` of them (at least one) that follow each other in its segment, from
    /// the first current copy. None when there is nothing to read that way: nothing committed
    /// there, the batch is in the tail cache, or the segment's files are closed.
    fn plan_extent(&self, base_offset: u64) -> Option<ExtentPlan<S>> {
        let segment_index =
            match self.segments.binary_search_by_key(&base_offset, |segment| segment.base_offset) {
                Ok(index) => index,
                Err(0) => return None,
                Err(index) => index - 1,
            };
        let segment = &self.segments[segment_index];
        let first =
            segment.batches.binary_search_by_key(&base_offset, |entry| entry.header.base_offset).ok()?;
        let cached_from = self.cache.tail_cache.front().map_or(u64::MAX, |(base, _)| *base);
        let position = segment.batches[first].position;
        let mut batches = Vec::new();
        let mut bytes = 0usize;
        for entry in &segment.batches[first..] {
            let follows = entry.position == position + bytes as u64;
            let fits = batches.is_empty() || bytes + entry.header.disk_bytes() <= READ_AHEAD_BYTES;
            // Only committed batches: a truncation may take the others away.
            let committed = entry.header.base_offset < self.positions.committed_end;
            if entry.header.base_offset >= cached_from || !follows || !fits || !committed {
                break;
            }
            batches.push(*entry);
            bytes += entry.header.disk_bytes();
        }
        let (_, file) = self
            .copy_files(segment_index)
            .into_iter()
            .find(|(copy, _)| self.copies.states.get(*copy) == CopyState::Current)?;
        Some(ExtentPlan {
            file,
            log_id: self.log_id,
            segment_base: segment.base_offset,
            position,
            bytes,
            end_offset: batches.last()?.header.end_offset(),
            batches,
        })
    }

    /// The open files of a segment, current copies first; a stale (fenced) copy is still read
    /// as a last resort: what it holds from before it was fenced is checked like everything else.
    fn copy_files(&self, segment_index: usize) -> Vec<(usize, Rc<S::File>)> {
        let mut files: Vec<(usize, Rc<S::File>)> = self.segments[segment_index]
            .files
            .iter()
            .enumerate()
            .filter_map(|(copy, file)| file.clone().map(|file| (copy, file)))
            .collect();
        files.sort_by_key(|(copy, _)| self.copies.states.get(*copy) != CopyState::Current);
        files
    }
}

impl<S: Storage> Log<S> {
    /// Called once a second: after `TAIL_CACHE_IDLE_SWEEPS` without a commit the log keeps
    /// nothing in memory, so idle topics cost no cached batches; extents read ahead go as soon
    /// as a sweep finds that no reader used them since the last.
    pub fn release_idle_cache(&self) {
        let mut inner = self.inner.borrow_mut();
        if inner.idle_sweeps < TAIL_CACHE_IDLE_SWEEPS {
            inner.idle_sweeps += 1;
        } else if !inner.cache.tail_cache.is_empty() {
            inner.drop_tail_cache();
        }
        if inner.cache.read_ahead.as_mut().is_some_and(|cache| cache.idle_since_last_sweep()) {
            inner.drop_read_ahead();
        }
    }

    /// Bytes of batches this log keeps in memory for readers.
    pub fn tail_cache_bytes(&self) -> usize {
        self.inner.borrow().cache.tail_cache_bytes
    }

    /// Bytes of extents this log keeps read ahead.
    pub fn read_ahead_bytes(&self) -> usize {
        self.inner.borrow().cache.read_ahead.as_ref().map_or(0, |cache| cache.bytes())
    }

    /// The durable batches from the one holding `offset`, in order, up to `records_bytes_max`
    /// bytes of records (the first is always taken): what a leader sends a follower, committed
    /// or not. Empty when nothing durable holds `offset` (it is at the durable end, or below
    /// the log's start).
    pub async fn hold_durable_from(
        &self,
        offset: Offset,
        records_bytes_max: usize,
    ) -> Result<Vec<HeldBatch<S>>, LogError> {
        let mut out: Vec<HeldBatch<S>> = Vec::new();
        let mut next = offset;
        let mut held_bytes = 0usize;
        while next < self.durable_end() && (out.is_empty() || held_bytes < records_bytes_max) {
            let Some(batch) = self.hold_batch_within(next.get(), true).await? else { break };
            if batch.end_offset() <= next {
                break;
            }
            next = batch.end_offset();
            held_bytes = held_bytes.saturating_add(batch.records_bytes());
            out.push(batch);
        }
        Ok(out)
    }

    /// Reads records from `from` on, at most `max_records` of them and (beyond the first) at
    /// most `max_bytes` of data. Every record returned passed its checksum.
    pub async fn read(
        &self,
        from: Offset,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, LogError> {
        self.read_within(from, max_records, max_bytes, false).await
    }

    /// `read`, up to the durable end instead of the committed one when `durable`.
    async fn read_within(
        &self,
        from: Offset,
        max_records: usize,
        max_bytes: usize,
        durable: bool,
    ) -> Result<Vec<StoredRecord>, LogError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut offset = from.max(self.start_offset()).get();
        let visible_end = || if durable { self.durable_end().get() } else { self.end_offset().get() };
        while out.len() < max_records && offset < visible_end() {
            let lowest = offset;
            let batch = self.read_batch_at(offset, &|wanted| wanted >= lowest, durable).await?;
            if batch.end <= offset {
                break;
            }
            for record in batch.records {
                if out.len() >= max_records || (!out.is_empty() && bytes + record.data.len() > max_bytes) {
                    return Ok(out);
                }
                bytes += record.data.len();
                out.push(record);
            }
            offset = batch.end;
        }
        Ok(out)
    }

    /// Every record from `from` to the end, as `read` returns them, but read in extents of up
    /// to `READ_AHEAD_BYTES` even where the log does not read ahead (`LogConfig::read_ahead`),
    /// and with the extents dropped after. For the replays at start-up (the catalog, a topic's
    /// journal), which read once, in order: batch by batch, a large catalog is thousands of
    /// 4 KiB reads (see benches/README.md). The log's
    /// configuration reads ahead for the replay's duration, so it is meant for a log nothing
    /// else reads yet (both callers run it before the log is served). Durable records count,
    /// committed or not: a replicated topic's new leader replays its journal before it has
    /// committed what it holds.
    pub async fn read_all(&self, from: Offset) -> Result<Vec<StoredRecord>, LogError> {
        let configured = self.inner.borrow().config.clone();
        if !configured.read_ahead {
            self.inner.borrow_mut().config = Rc::new(LogConfig { read_ahead: true, ..(*configured).clone() });
        }
        let result = self.read_within(from, usize::MAX, usize::MAX, true).await;
        if !configured.read_ahead {
            let mut inner = self.inner.borrow_mut();
            inner.config = configured;
            inner.drop_read_ahead();
        }
        result
    }

    /// Reads the records at the given offsets (sorted), skipping offsets no longer stored. Only
    /// those records are copied out of their batches; the rest are validated in place.
    pub async fn read_offsets(&self, offsets: &[Offset]) -> Result<Vec<StoredRecord>, LogError> {
        let mut out = Vec::with_capacity(offsets.len());
        let wanted = span(offsets);
        for batch in self.hold_offsets(offsets, usize::MAX).await?.0 {
            let views = batch.records_in(wanted.clone())?;
            out.extend(
                views.iter().filter(|view| offsets.binary_search(&view.offset).is_ok()).map(StoredRecord::of),
            );
        }
        Ok(out)
    }

    /// The batches holding the given offsets (sorted), each once and validated, skipping
    /// offsets no longer stored: for a reader that takes the records it wants as views, without
    /// copying them out (`HeldBatch::records`). Reading stops once the batches held carry
    /// `records_bytes_max` bytes of records (the first is always read, however large), so a
    /// reader bounded in bytes does not hold what it cannot send; returns the batches and how
    /// many of `offsets` they cover (or were found no longer stored); the rest were not read.
    pub async fn hold_offsets(
        &self,
        offsets: &[Offset],
        records_bytes_max: usize,
    ) -> Result<(Vec<HeldBatch<S>>, usize), LogError> {
        let mut out = Vec::new();
        let mut index = 0;
        let mut held_bytes = 0usize;
        let start = self.start_offset();
        while index < offsets.len() {
            if offsets[index] < start {
                index += 1;
                continue;
            }
            if held_bytes >= records_bytes_max {
                return Ok((out, index));
            }
            let Some(batch) = self.hold_batch_at(offsets[index].get()).await? else { break };
            let end = batch.end_offset();
            if end <= offsets[index] {
                break;
            }
            held_bytes = held_bytes.saturating_add(batch.records_bytes());
            out.push(batch);
            while index < offsets.len() && offsets[index] < end {
                index += 1;
            }
        }
        // Past the log's end (or a gap): those offsets are not stored either.
        Ok((out, offsets.len()))
    }

    /// The whole batch holding `offset`, with its records copied out where `keep` says.
    async fn read_batch_at(
        &self,
        offset: u64,
        keep: &dyn Fn(u64) -> bool,
        durable: bool,
    ) -> Result<BatchRead, LogError> {
        let Some(batch) = self.hold_batch_within(offset, durable).await? else {
            return Ok(BatchRead::default());
        };
        let records =
            batch.records()?.iter().filter(|view| keep(view.offset.get())).map(StoredRecord::of).collect();
        Ok(BatchRead { end: batch.end_offset().get(), records })
    }

    /// The whole batch holding `offset`, validated: from the tail cache, from an extent read
    /// ahead, or from the first copy whose bytes pass their checksums. A copy that fails is
    /// repaired from the good one. None if no batch holds it.
    async fn hold_batch_at(&self, offset: u64) -> Result<Option<HeldBatch<S>>, LogError> {
        self.hold_batch_within(offset, false).await
    }

    /// `hold_batch_at`, up to the durable end instead of the committed one when `durable`.
    async fn hold_batch_within(&self, offset: u64, durable: bool) -> Result<Option<HeldBatch<S>>, LogError> {
        let (segment_index, entry, files, segment_base, log_id, cached) = {
            let inner = self.inner.borrow();
            let segment_index =
                match inner.segments.binary_search_by_key(&offset, |segment| segment.base_offset) {
                    Ok(index) => index,
                    Err(0) => return Ok(None),
                    Err(index) => index - 1,
                };
            let segment = &inner.segments[segment_index];
            let batch_index =
                match segment.batches.binary_search_by_key(&offset, |entry| entry.header.base_offset) {
                    Ok(index) => index,
                    Err(0) => return Ok(None),
                    Err(index) => index - 1,
                };
            let entry = segment.batches[batch_index];
            // Readers see committed batches only (`committed_end` is a batch's end).
            let visible_end =
                if durable { inner.positions.durable_end } else { inner.positions.committed_end };
            if offset >= entry.header.end_offset() || entry.header.base_offset >= visible_end {
                return Ok(None);
            }
            // The cache is in commit order, so by base offset: a search, not a scan, since it
            // may hold thousands of small batches and a lagging reader looks up every one.
            let cached = inner
                .cache
                .tail_cache
                .binary_search_by_key(&entry.header.base_offset, |(base, _)| *base)
                .ok()
                .map(|index| inner.cache.tail_cache[index].1.clone());
            let files = inner.copy_files(segment_index);
            (segment_index, entry, files, segment.base_offset, inner.log_id, cached)
        };
        let describe = |error: &dyn fmt::Display| {
            format!(
                "batch at offset {} (segment {segment_base}, byte {}): {error}",
                entry.header.base_offset, entry.position
            )
        };
        // Bytes from memory were validated when they were read or written: their header is
        // checked against the index, their checksums are not computed again.
        let held = |bytes: HeldBytes<S>| -> Result<HeldBatch<S>, LogError> {
            let header = record::decode_batch_header(bytes.bytes(), log_id, segment_base, entry.position)
                .map_err(|e| LogError::DataLoss(describe(&e)))?;
            if header != entry.header {
                return Err(LogError::DataLoss(describe(
                    &"the batch header differs from the one recovery indexed",
                )));
            }
            Ok(HeldBatch { bytes, log_id, header })
        };
        if let Some(buffer) = cached {
            return held(HeldBytes::Cached(buffer)).map(Some);
        }
        if let Some(bytes) = self.hold_from_extents(segment_base, entry).await {
            return held(bytes).map(Some);
        }
        let files = if files.is_empty() && self.segment_is_closed(segment_index) {
            self.ensure_open(segment_index).await?;
            self.inner.borrow().copy_files(segment_index)
        } else {
            files
        };
        let mut bad_copies = Vec::new();
        let mut last_error = String::from("no copy of this segment is readable");
        for (copy, file) in &files {
            let result = match file.read_at(entry.position, entry.header.disk_bytes()).await {
                Ok(bytes) => {
                    let checked = record::decode_batch_header(&bytes, log_id, segment_base, entry.position)
                        .map_err(|e| describe(&e))
                        .and_then(|header| {
                            if header != entry.header {
                                return Err(describe(
                                    &"the batch header differs from the one recovery indexed",
                                ));
                            }
                            record::decode_batch_checked(&bytes, log_id, &header, true)
                                .map_err(|e| describe(&e))?;
                            Ok(header)
                        });
                    checked.map(|header| HeldBatch {
                        bytes: HeldBytes::Read(Rc::new(bytes), 0),
                        log_id,
                        header,
                    })
                }
                Err(error) => Err(describe(&error)),
            };
            match result {
                Ok(batch) => {
                    for bad in bad_copies {
                        if self.inner.borrow().copies.states.get(bad) == CopyState::Current {
                            crate::log_info!(
                                "ringpostd: repairing data directory {bad}'s copy of {last_error}"
                            );
                            self.repair(segment_index, entry.position, entry.header.disk_bytes(), *copy, bad)
                                .await?;
                        }
                    }
                    return Ok(Some(batch));
                }
                Err(error) => {
                    last_error = error;
                    bad_copies.push(*copy);
                }
            }
        }
        Err(LogError::DataLoss(last_error))
    }

    /// The batch from the extents read ahead, reading an extent from it on when there is none;
    /// and once a reader is in the newest extent, the next one is read in the background. None
    /// when the batch cannot be read that way: the caller reads it alone, copy by copy.
    async fn hold_from_extents(&self, segment_base: u64, entry: BatchEntry) -> Option<HeldBytes<S>> {
        let offset = entry.header.base_offset;
        loop {
            let lookup = match self.inner.borrow_mut().cache.read_ahead.as_mut() {
                Some(cache) => cache.lookup(segment_base, entry.position, offset),
                None => Lookup::Miss,
            };
            match lookup {
                Lookup::Hit { bytes, start, newest } => {
                    if newest {
                        self.start_read_ahead();
                    }
                    return Some(HeldBytes::Read(bytes, start));
                }
                Lookup::Pending(arrived) => arrived.await,
                Lookup::Miss => break,
            }
        }
        let plan = {
            let inner = self.inner.borrow();
            if !inner.config.read_ahead || !inner.has_room_to_read_ahead() {
                return None;
            }
            inner.plan_extent(offset)?
        };
        let extent = plan.read().await?;
        let held = HeldBytes::Read(extent.bytes.clone(), (entry.position - extent.position) as usize);
        self.inner.borrow_mut().keep_extent(extent);
        self.start_read_ahead();
        Some(held)
    }

    /// Reads the extent after the newest one kept, in a task of its own, unless one is being
    /// read, the batches are in the tail cache, or the shard's cache budget is short.
    fn start_read_ahead(&self) {
        let plan = {
            let mut inner = self.inner.borrow_mut();
            if !inner.has_room_to_read_ahead() {
                return;
            }
            let Some(next) = inner.cache.read_ahead.as_ref().and_then(|cache| cache.next_to_read()) else {
                return;
            };
            if next >= inner.positions.committed_end {
                return;
            }
            let Some(plan) = inner.plan_extent(next) else { return };
            inner.cache.read_ahead.as_mut().unwrap().start_reading(next, plan.end_offset);
            plan
        };
        let log = self.clone();
        crate::runtime::spawn(async move {
            let extent = plan.read().await;
            let mut inner = log.inner.borrow_mut();
            if inner.cache.read_ahead.is_some() {
                if let Some(extent) = extent {
                    inner.keep_extent(extent);
                }
                inner.cache.read_ahead.as_mut().unwrap().finish_reading();
            }
        })
        .detach();
    }

    /// The first offset published at or after `time_ms`, or the end of the log.
    pub async fn offset_at_time(&self, time_ms: u64) -> Result<Offset, LogError> {
        let first_segment = {
            let inner = self.inner.borrow();
            inner.segments.iter().find(|segment| segment.newest_publish_ms >= time_ms).map(|s| s.base_offset)
        };
        let first_segment = first_segment.map(Offset::new);
        let Some(mut offset) = first_segment else { return Ok(self.end_offset()) };
        loop {
            let records = self.read(offset, 1000, usize::MAX).await?;
            let Some(last) = records.last().map(|record| record.offset) else { return Ok(self.end_offset()) };
            if let Some(found) = records.iter().find(|record| record.publish_time_ms >= time_ms) {
                return Ok(found.offset);
            }
            offset = last + 1;
        }
    }

    /// Bytes of the durable batches from the one holding `offset` to the log's end, as stored
    /// (headers and checksums included): what a reader starting at `offset` has left to read.
    pub fn bytes_from(&self, offset: Offset) -> u64 {
        let offset = offset.get();
        let inner = self.inner.borrow();
        let mut bytes = 0;
        for segment in inner.segments.iter().rev() {
            let Some(first) = segment.batches.first() else { continue };
            if segment.base_offset > offset || first.header.base_offset > offset {
                bytes += segment.write_position - first.position;
                continue;
            }
            let holding = segment.batches.partition_point(|batch| batch.header.end_offset() <= offset);
            if let Some(batch) = segment.batches.get(holding) {
                bytes += segment.write_position - batch.position;
            }
            break;
        }
        bytes
    }
}
