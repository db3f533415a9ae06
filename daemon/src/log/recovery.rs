//! Recovery (`Log::open`, the rules in the module's documentation) in three steps: `scan`
//! reads what every data directory holds, `plan` decides from that alone, with no I/O, what
//! to keep, what to repair from which copy, what to zero and what to remove, or refuses with
//! the error an operator reads, and `carry_out` does what the plan says.
//!
//! The scan reads what the plan may need and no more: which files it reads follows the
//! newest manifest (`choose_manifest`, the planner's own first decision, pure), and a
//! segment's walk from position 0 follows the first copy holding a valid batch, as the plan
//! does. It decides nothing else: what a hole, a torn tail or a later valid batch means is
//! the plan's.

use super::*;

/// What recovery found, for the log line an operator reads.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    pub batches: usize,
    pub records: u64,
    pub torn_bytes_discarded: u64,
    pub torn_at: Option<(PathBuf, u64)>,
    pub empty_segments_removed: usize,
    /// Batches rewritten into a copy from another (missing, torn, rotten or misplaced).
    pub batches_repaired: usize,
    /// Copies (data directories) whose files do not take O_DIRECT.
    pub buffered_io_copies: Vec<usize>,
    /// Data directories fenced because a read of this log failed in them (at most ⌊M/2⌋ of
    /// M; more refuses the start).
    pub copies_fenced: Vec<usize>,
}

/// What one copy's folder holds.
#[derive(Debug, Clone, Default)]
pub(super) struct FolderScan {
    /// The base offsets of its segment files.
    pub segments: Vec<u64>,
    /// Files that were never named a segment (`SPARE_NAME`, `RECYCLE_NAME`,
    /// `RESERVE_MAKING_NAME`).
    pub leftovers: Vec<&'static str>,
    /// The valid manifests of its slots.
    pub manifests: Vec<Manifest>,
}

/// A copy's first segment file (base 0), read for a log without a valid manifest.
#[derive(Debug, Clone)]
pub(super) struct FirstSegmentScan {
    pub copy: usize,
    pub size: u64,
    pub holds_data: bool,
    /// Its first block holds a batch header of this log, or zeros.
    pub starts_as_this_log: bool,
}

/// A segment file that the manifest does not list.
#[derive(Debug, Clone)]
pub(super) struct UnlistedScan {
    pub copy: usize,
    pub base: u64,
    pub holds_data: bool,
    /// It holds a valid batch of its own segment (looked for with a manifest only).
    pub has_own_batch: bool,
}

/// What one copy holds beyond the place where a segment's walk found no valid batch.
#[derive(Debug, Clone, Default)]
pub(super) struct Beyond {
    /// The first valid batch of this life past the place (offsets above the one expected):
    /// its position, and whether it is a successor written ahead of a lost commit, and the
    /// segment's last (`orphan_written_ahead`).
    pub later: Option<(u64, bool)>,
    /// In a recycled segment: the disk bytes of a batch header of this segment at the place
    /// (a commit cut short), if one is there.
    pub torn_header_bytes: Option<u64>,
}

/// Why a segment's walk ended.
#[derive(Debug, Clone)]
pub(super) enum StopWhy {
    /// The segment is full, or its batches reached the next segment's base.
    End,
    /// Its batches reached the cut of a truncation a crash interrupted.
    AtCut,
    /// Zeros (or no file) in every copy; what lies beyond, in the last segment.
    Zeros(Vec<Beyond>),
    /// No copy holds a valid batch, and some hold bytes.
    Damaged { why: String, beyond: Vec<Beyond> },
}

/// What a listed segment holds.
#[derive(Debug, Clone)]
pub(super) enum Walk {
    /// After a torn tail in an earlier segment: whether each copy holds data (bytes, or in a
    /// recycled segment a valid batch of its own).
    AfterTorn(Vec<bool>),
    /// The log before it ends at `expected`, not at its base: nothing was read.
    Misplaced { expected: u64 },
    /// Each position walked from 0 with what every copy holds there (the last one, when no
    /// copy is valid, is where it stopped), and why it stopped.
    Walked { steps: Vec<(u64, Vec<CopyBatch>)>, stop: StopWhy },
}

#[derive(Debug, Clone)]
pub(super) struct SegmentScan {
    pub listed: Listed,
    /// Which copies hold the file.
    pub present: Vec<bool>,
    pub walk: Walk,
}

/// Everything recovery read, for `plan`.
#[derive(Debug, Clone, Default)]
pub(super) struct Scan {
    /// The log's folder inside each data directory, for the messages.
    pub relative: PathBuf,
    /// Each copy's folder.
    pub folders: Vec<PathBuf>,
    pub listings: Vec<FolderScan>,
    pub first_segment: Vec<FirstSegmentScan>,
    pub unlisted: Vec<UnlistedScan>,
    pub segments: Vec<SegmentScan>,
    pub buffered_io: Vec<usize>,
    /// Copies a read (or another call) failed in, with the error: the scan went on without
    /// them, as if their folders were empty, while they were at most ⌊M/2⌋ of M; past that
    /// it stopped, and the plan refuses.
    pub failed: Vec<(usize, String)>,
}

/// A batch to rewrite in copy `to` from copy `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Repair {
    pub segment: usize,
    pub position: u64,
    pub bytes: usize,
    pub from: usize,
    pub to: usize,
}

/// A listed segment as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PlannedSegment {
    pub listed: Listed,
    pub batches: Vec<BatchEntry>,
    pub write_position: u64,
    pub newest_publish_ms: u64,
}

/// What recovery does, decided by `plan` alone.
#[derive(Debug, Clone)]
pub(super) struct RecoveryPlan {
    pub manifest: Manifest,
    /// (copy, name) of files never named a segment, removed.
    pub leftovers: Vec<(usize, &'static str)>,
    /// (copy, base) of segment files not listed and removed.
    pub unlisted_removed: Vec<(usize, u64)>,
    /// The segments kept, in order.
    pub segments: Vec<PlannedSegment>,
    /// Segments after a torn tail, dropped from the manifest and removed in every copy.
    pub dropped_after_torn: Vec<u64>,
    pub repairs: Vec<Repair>,
    /// (segment, copy, position): headers of written-ahead orphans to zero.
    pub orphans: Vec<(usize, usize, u64)>,
    /// (segment, position): a torn tail to zero in every copy.
    pub torn: Option<(usize, u64)>,
    pub next_offset: u64,
    /// The manifest is rewritten to every copy at the end.
    pub rewrite_manifest: bool,
    /// Copies fenced for a failed read (`Scan::failed`): as a failed write or sync fences a
    /// copy at run time, they take nothing more until an operator resyncs them, and the log
    /// opens from the others.
    pub fenced: Vec<(usize, String)>,
    /// The report so far: what the plan knows (the carry-out adds what it did).
    pub report: RecoveryReport,
}

fn corrupt(text: String) -> LogError {
    LogError::Corrupt(text)
}

/// The newest valid manifest across copies (the first of the highest sequence), or, without
/// one, the one a log that has only its first segment implies (`first_segment_alone`).
/// Returns it and whether there is one of either kind (false: a log that never wrote).
pub(super) fn choose_manifest(scan: &Scan) -> Result<(Manifest, bool), LogError> {
    let mut best: Option<&Manifest> = None;
    for found in scan.listings.iter().flat_map(|listing| listing.manifests.iter()) {
        if best.is_none_or(|best| found.sequence > best.sequence) {
            best = Some(found);
        }
    }
    if let Some(best) = best {
        return Ok((best.clone(), true));
    }
    let implied = first_segment_alone(scan)?;
    let has_manifest = implied.is_some();
    Ok((implied.unwrap_or_default(), has_manifest))
}

/// The manifest a log without one implies: its first segment alone, if that holds data in any
/// copy (its size, the largest among the copies, is the capacity it was allocated with). Its
/// first write starts with a batch header of this log (the header's checksum covers the log
/// id): a crash may tear that write, but sectors land whole, so at position 0 some copy holds
/// either that header or zeros (the first sector never landed). Where every copy holding data
/// has other bytes there, the file is no first segment of this log (copied from another, or
/// rotten): recovery stops, deleting nothing.
fn first_segment_alone(scan: &Scan) -> Result<Option<Manifest>, LogError> {
    let holding: Vec<&FirstSegmentScan> =
        scan.first_segment.iter().filter(|first| first.holds_data).collect();
    let Some(first) = holding.first() else { return Ok(None) };
    if !holding.iter().any(|first| first.starts_as_this_log) {
        return Err(corrupt(format!(
            "{} holds data but no data directory has a valid manifest for its log, and it does not start with a batch of this log; refusing to start (nothing was deleted)",
            scan.folders[first.copy].join(segment_name(0)).display()
        )));
    }
    let capacity = holding.iter().map(|first| first.size).max().unwrap_or(0);
    Ok(Some(Manifest {
        sequence: 0,
        segments: vec![Listed {
            base_offset: 0,
            capacity: record::align_up(capacity as usize, BLOCK_BYTES) as u64,
            recycled: false,
        }],
        truncated_end: None,
        promised_epoch: 0,
    }))
}

/// Copies of M that may fail with the log still opening: ⌊M/2⌋, so that ⌈M/2⌉ remain, and
/// among them a copy of every acknowledged batch and of the newest durable manifest (each
/// was durable on ⌈M/2⌉ copies).
pub(super) fn failures_tolerated(copies: usize) -> usize {
    copies / 2
}

/// Refuses a start whose failed copies (`Scan::failed`) are beyond the budget: what they
/// alone hold cannot be told from nothing.
fn check_failed(scan: &Scan) -> Result<(), LogError> {
    let copies = scan.folders.len();
    if scan.failed.len() <= failures_tolerated(copies) {
        return Ok(());
    }
    let failed: Vec<String> =
        scan.failed.iter().map(|(copy, why)| format!("{} ({why})", scan.folders[*copy].display())).collect();
    Err(LogError::DataLoss(format!(
        "reading {} failed in {} of {copies} data directories: {}; at most {} may fail; refusing to start (nothing was deleted)",
        scan.relative.display(),
        scan.failed.len(),
        failed.join(", "),
        failures_tolerated(copies)
    )))
}

/// Decides recovery from what the scan read: no I/O.
pub(super) fn plan(scan: &Scan) -> Result<RecoveryPlan, LogError> {
    check_failed(scan)?;
    let (manifest, has_manifest) = choose_manifest(scan)?;
    let mut plan = RecoveryPlan {
        leftovers: scan
            .listings
            .iter()
            .enumerate()
            .flat_map(|(copy, listing)| listing.leftovers.iter().map(move |name| (copy, *name)))
            .collect(),
        unlisted_removed: plan_unlisted(scan, &manifest, has_manifest)?,
        next_offset: manifest.segments.first().map_or(0, |listed| listed.base_offset),
        manifest,
        segments: Vec::new(),
        dropped_after_torn: Vec::new(),
        repairs: Vec::new(),
        orphans: Vec::new(),
        torn: None,
        rewrite_manifest: false,
        fenced: scan.failed.clone(),
        report: RecoveryReport {
            buffered_io_copies: scan.buffered_io.clone(),
            copies_fenced: scan.failed.iter().map(|(copy, _)| *copy).collect(),
            ..Default::default()
        },
    };
    plan.report.empty_segments_removed = plan.unlisted_removed.len();
    for (index, segment) in scan.segments.iter().enumerate() {
        plan_segment(scan, &mut plan, index, segment)?;
    }
    if let Some((torn_segment, _)) = plan.torn {
        // Later segments were checked empty; a later segment starting elsewhere than the cut
        // is an orphan of the interrupted commit's roll and is dropped from the manifest.
        for dropped in plan.segments.drain(torn_segment + 1..) {
            plan.dropped_after_torn.push(dropped.listed.base_offset);
            plan.report.empty_segments_removed += 1;
        }
    }
    let behind = scan.listings.iter().enumerate().any(|(copy, listing)| {
        let fenced = scan.failed.iter().any(|(failed, _)| *failed == copy);
        let newest = listing.manifests.iter().map(|manifest| manifest.sequence).max().unwrap_or(0);
        !fenced && newest < plan.manifest.sequence
    });
    plan.rewrite_manifest = has_manifest
        && (behind || plan.report.empty_segments_removed > 0 || plan.manifest.truncated_end.is_some());
    Ok(plan)
}

/// The segment files the manifest does not list that are removed: below the log's start (a
/// crash between a manifest update and the unlink), beyond a truncation's cut (the same, for
/// a truncation), holding only zeros (created, never used), or, with a manifest, holding no
/// valid batch of their own segment (a kept file renamed by a roll that a crash cut short
/// before its manifest). Any other refuses the start.
fn plan_unlisted(
    scan: &Scan,
    manifest: &Manifest,
    has_manifest: bool,
) -> Result<Vec<(usize, u64)>, LogError> {
    let first_listed = manifest.segments.first().map(|listed| listed.base_offset);
    let mut removed = Vec::new();
    for unlisted in &scan.unlisted {
        let base = unlisted.base;
        if manifest.segments.iter().any(|listed| listed.base_offset == base) {
            continue;
        }
        let below_start = first_listed.is_some_and(|first| base < first)
            || manifest.truncated_end.is_some_and(|end| base > end);
        let never_written = !unlisted.holds_data || (has_manifest && !unlisted.has_own_batch);
        if below_start || never_written {
            removed.push((unlisted.copy, base));
            continue;
        }
        let path = scan.folders[unlisted.copy].join(segment_name(base));
        return Err(corrupt(if has_manifest {
            format!(
                "{} holds data but the manifest does not list it; refusing to start (nothing was deleted)",
                path.display()
            )
        } else {
            format!(
                "{} holds data but no data directory has a valid manifest for its log; refusing to start (nothing was deleted)",
                path.display()
            )
        }));
    }
    Ok(removed)
}

/// Plans one listed segment from its walk (rules 3 and 4 of the module's documentation).
fn plan_segment(
    scan: &Scan,
    plan: &mut RecoveryPlan,
    index: usize,
    segment: &SegmentScan,
) -> Result<(), LogError> {
    let listed = segment.listed;
    let name = segment_name(listed.base_offset);
    let relative = scan.relative.display();
    if !segment.present.iter().any(|present| *present) {
        return Err(corrupt(format!(
            "segment {name} of {relative} is listed in the manifest but missing from every data directory; refusing to start"
        )));
    }
    let mut planned = PlannedSegment { listed, batches: Vec::new(), write_position: 0, newest_publish_ms: 0 };
    let (steps, stop) = match &segment.walk {
        Walk::AfterTorn(holds_data) => {
            if holds_data.iter().any(|holds| *holds) {
                return Err(corrupt(format!(
                    "segment {name} of {relative} holds bytes after a torn batch in an earlier segment; refusing to start"
                )));
            }
            plan.segments.push(planned);
            return Ok(());
        }
        Walk::Misplaced { expected } => {
            return Err(corrupt(format!(
                "segment {name} of {relative} starts at offset {} but the log before it ends at {expected}; refusing to start",
                listed.base_offset
            )));
        }
        Walk::Walked { steps, stop } => (steps, stop),
    };
    let mut position = 0;
    for (at, found) in steps {
        position = *at;
        let Some(good) = found.iter().position(|batch| matches!(batch, CopyBatch::Valid(..))) else { break };
        let CopyBatch::Valid(header, newest) = found[good] else { unreachable!() };
        planned.newest_publish_ms = planned.newest_publish_ms.max(newest);
        for (copy, batch) in found.iter().enumerate() {
            let fenced = scan.failed.iter().any(|(failed, _)| *failed == copy);
            if !matches!(batch, CopyBatch::Valid(..)) && !fenced {
                let repair = Repair {
                    segment: index,
                    position: *at,
                    bytes: header.disk_bytes(),
                    from: good,
                    to: copy,
                };
                plan.repairs.push(repair);
            }
        }
        planned.batches.push(BatchEntry { header, position: *at });
        plan.report.batches += 1;
        plan.report.records += header.record_count as u64;
        plan.next_offset = header.end_offset();
        position = *at + header.disk_bytes() as u64;
    }
    planned.write_position = position;
    let place = || format!("{relative} segment {name} at byte {position}");
    match stop {
        StopWhy::End => {}
        StopWhy::AtCut => plan.torn = plan.torn.or(Some((index, position))),
        StopWhy::Zeros(beyond) => {
            for (copy, beyond) in beyond.iter().enumerate() {
                match beyond.later {
                    Some((later, true)) => plan.orphans.push((index, copy, later)),
                    Some((later, false)) => {
                        return Err(corrupt(format!(
                            "{}: zeros in every copy, but a valid batch follows at byte {later}: mid-log damage; refusing to start (nothing was deleted)",
                            place()
                        )))
                    }
                    None => {}
                }
            }
        }
        StopWhy::Damaged { why, beyond } => {
            for (copy, beyond) in beyond.iter().enumerate() {
                match beyond.later {
                    // The commit here never completed, and the one after it, whose write was
                    // issued while this one was in flight, landed first: neither was
                    // acknowledged. Its header is zeroed.
                    Some((later, true)) => plan.orphans.push((index, copy, later)),
                    Some((later, false)) => {
                        return Err(corrupt(format!(
                            "{}: {why} in every copy, but a valid batch follows at byte {later}: mid-log corruption; refusing to start (nothing was deleted)",
                            place()
                        )))
                    }
                    None => {}
                }
            }
            if listed.recycled {
                // The bytes of the file's earlier life end this segment, as zeros end a fresh
                // one, and nothing is zeroed: commits after recovery overwrite them. A commit
                // cut short shows only where its header landed.
                for bytes in beyond.iter().filter_map(|beyond| beyond.torn_header_bytes) {
                    plan.report.torn_bytes_discarded = plan.report.torn_bytes_discarded.max(bytes);
                    plan.report.torn_at = Some((scan.folders[0].join(&name), position));
                }
            } else {
                plan.torn = Some((index, position));
            }
        }
    }
    plan.segments.push(planned);
    plan.report.segments += 1;
    Ok(())
}

/// The files of every listed segment, by copy, as the scan opened them.
pub(super) type ScannedFiles<S> = Vec<CopyFiles<S>>;

/// The first I/O error of a scan that one copy's call returned, with that copy: the scan is
/// run again without it (see `scan`).
#[derive(Default)]
struct FailedRead(RefCell<Option<(usize, String)>>);

impl FailedRead {
    /// Notes an I/O error of copy `copy`'s call and passes it on.
    fn of(&self, copy: usize) -> impl Fn(LogError) -> LogError + '_ {
        move |error| {
            if let LogError::Io(why) = &error {
                self.0.borrow_mut().get_or_insert_with(|| (copy, why.clone()));
            }
            error
        }
    }
}

/// Reads what every copy holds (see the module's documentation). Makes a missing folder,
/// with its parents, and nothing else. A call failing in one copy (EIO reading a batch, say)
/// does not fail the scan: it is read again without that copy, as a disk that fails stops,
/// and the copy is named in `Scan::failed`, for the plan to fence it, or, past ⌊M/2⌋ of M
/// copies, to refuse the start.
pub(super) async fn scan<S: Storage>(
    storage: &S,
    directories: &Directories,
    relative: &Path,
    log_id: u64,
    config: &LogConfig,
) -> Result<(Scan, ScannedFiles<S>), LogError> {
    let mut failed: Vec<(usize, String)> = Vec::new();
    loop {
        let failure = FailedRead::default();
        let scanned = scan_without(storage, directories, (relative, log_id, config), &failed, &failure).await;
        let error = match scanned {
            Ok((mut scan, files)) => {
                scan.failed = failed;
                return Ok((scan, files));
            }
            Err(error) => error,
        };
        let Some(copy_failed) = failure.0.take() else { return Err(error) };
        failed.push(copy_failed);
        if failed.len() > failures_tolerated(directories.count()) {
            // Nothing more is read: the plan refuses with the copies named.
            let scan = Scan {
                relative: relative.to_path_buf(),
                folders: (0..directories.count()).map(|copy| directories.path(copy).join(relative)).collect(),
                failed,
                ..Default::default()
            };
            return Ok((scan, Vec::new()));
        }
    }
}

/// `scan`, leaving out the copies in `failed` as if their folders were empty, and noting in
/// `failure` a copy whose call fails.
async fn scan_without<S: Storage>(
    storage: &S,
    directories: &Directories,
    (relative, log_id, config): (&Path, u64, &LogConfig),
    failed: &[(usize, String)],
    failure: &FailedRead,
) -> Result<(Scan, ScannedFiles<S>), LogError> {
    let mut scan = Scan {
        relative: relative.to_path_buf(),
        folders: (0..directories.count()).map(|copy| directories.path(copy).join(relative)).collect(),
        failed: failed.to_vec(),
        ..Default::default()
    };
    for copy in 0..directories.count() {
        let listing = if scan.failed.iter().any(|(failed, _)| *failed == copy) {
            FolderScan::default()
        } else {
            scan_folder(storage, &scan.folders[copy], log_id).await.map_err(failure.of(copy))?
        };
        scan.listings.push(listing);
    }
    if scan.listings.iter().all(|listing| listing.manifests.is_empty()) {
        for copy in (0..scan.listings.len()).filter(|copy| scan.listings[*copy].segments.contains(&0)) {
            let first = scan_first_segment(storage, &scan.folders[copy], copy, log_id)
                .await
                .map_err(failure.of(copy))?;
            scan.first_segment.push(first);
        }
    }
    let (manifest, has_manifest) = choose_manifest(&scan)?;
    for copy in 0..scan.listings.len() {
        for base in scan.listings[copy].segments.clone() {
            if !manifest.segments.iter().any(|listed| listed.base_offset == base) {
                let path = scan.folders[copy].join(segment_name(base));
                let unlisted = scan_unlisted(storage, &path, copy, base, log_id, has_manifest)
                    .await
                    .map_err(failure.of(copy))?;
                scan.unlisted.push(unlisted);
            }
        }
    }
    let files = scan_segments(storage, &mut scan, &manifest, (log_id, config), failure).await?;
    Ok((scan, files))
}

/// One copy's folder: made if missing, its names and its valid manifests.
async fn scan_folder<S: Storage>(storage: &S, folder: &Path, log_id: u64) -> Result<FolderScan, LogError> {
    let io = |e: std::io::Error| LogError::Io(io_text(&e));
    // Made here, not at the first segment: making it then (the directories, their syncs)
    // doubled the time of a log's first append.
    storage.create_dir_durable(folder).await.map_err(|e| {
        if is_no_space(&e) {
            LogError::NoSpace(format!("making {}: {}", folder.display(), io_text(&e)))
        } else {
            LogError::Io(io_text(&e))
        }
    })?;
    let names = storage.list_dir(folder).map_err(io)?;
    let mut listing = FolderScan {
        segments: names
            .iter()
            .filter_map(|name| name.strip_suffix(".seg").and_then(|base| base.parse().ok()))
            .collect(),
        // A spare that was being prepared, a deleted segment's file kept for the next roll,
        // or a reserve being allocated: none was ever named a segment. (A whole reserve,
        // `RESERVE_NAME`, is kept: it was never written either, and on a full disk it could
        // not be made again.)
        leftovers: [SPARE_NAME, RECYCLE_NAME, RESERVE_MAKING_NAME]
            .into_iter()
            .filter(|leftover| names.iter().any(|name| name == leftover))
            .collect(),
        manifests: Vec::new(),
    };
    for slot in MANIFEST_SLOTS {
        if !names.iter().any(|name| name == slot) {
            continue;
        }
        let file = storage.open(&folder.join(slot), false).await.map_err(io)?;
        let size = file.size().await.map_err(io)?;
        if size == 0 {
            // Created ahead by a roll (see `roll`), never written.
            continue;
        }
        let bytes = file.read_at(0, record::align_up(size as usize, BLOCK_BYTES)).await.map_err(io)?;
        listing.manifests.extend(Manifest::decode(&bytes, log_id));
    }
    Ok(listing)
}

async fn scan_first_segment<S: Storage>(
    storage: &S,
    folder: &Path,
    copy: usize,
    log_id: u64,
) -> Result<FirstSegmentScan, LogError> {
    let io = |e: std::io::Error| LogError::Io(io_text(&e));
    let file = storage.open(&folder.join(segment_name(0)), false).await.map_err(io)?;
    let size = file.size().await.map_err(io)?;
    let head = file.read_at(0, (BLOCK_BYTES as u64).min(size) as usize).await.map_err(io)?;
    // A first block holding bytes says the file holds data without reading the rest, which
    // for every small log at every start would be most of their segment (and most of the
    // start of a daemon with thousands of them; see benches/README.md). Only a zero first
    // block (a file never written, or a first write torn before its first sector) needs the
    // whole file.
    let head_is_zero = head.iter().all(|byte| *byte == 0);
    let holds_data = !head_is_zero || last_nonzero_end(&file, size).await? > 0;
    let starts_as_this_log =
        matches!(record::decode_batch_header(&head, log_id, 0, 0), Ok(_) | Err(BatchError::Empty));
    Ok(FirstSegmentScan { copy, size, holds_data, starts_as_this_log })
}

async fn scan_unlisted<S: Storage>(
    storage: &S,
    path: &Path,
    copy: usize,
    base: u64,
    log_id: u64,
    has_manifest: bool,
) -> Result<UnlistedScan, LogError> {
    let io = |e: std::io::Error| LogError::Io(io_text(&e));
    let file = storage.open(path, false).await.map_err(io)?;
    let size = file.size().await.map_err(io)?;
    let holds_data = last_nonzero_end(&file, size).await? > 0;
    // A file renamed into place by a roll that a crash cut short before its manifest holds an
    // earlier segment's bytes, none of which validates as a batch of this segment (a batch
    // header's checksum covers its segment's base offset).
    let has_own_batch =
        holds_data && has_manifest && first_valid_batch(&file, log_id, base, 0, size).await?.is_some();
    Ok(UnlistedScan { copy, base, holds_data, has_own_batch })
}

/// Opens every listed segment's files and walks them.
async fn scan_segments<S: Storage>(
    storage: &S,
    scan: &mut Scan,
    manifest: &Manifest,
    (log_id, config): (u64, &LogConfig),
    failure: &FailedRead,
) -> Result<ScannedFiles<S>, LogError> {
    let io = |e: std::io::Error| LogError::Io(io_text(&e));
    let mut all_files = Vec::with_capacity(manifest.segments.len());
    let mut next_offset = manifest.segments.first().map_or(0, |listed| listed.base_offset);
    let mut after_torn = false;
    for (index, listed) in manifest.segments.iter().copied().enumerate() {
        let mut files: CopyFiles<S> = Vec::with_capacity(scan.folders.len());
        for (copy, folder) in scan.folders.iter().enumerate() {
            let path = folder.join(segment_name(listed.base_offset));
            let left_out = scan.failed.iter().any(|(failed, _)| *failed == copy);
            if !left_out && storage.exists(&path) {
                let file = storage.open(&path, false).await.map_err(io).map_err(failure.of(copy))?;
                if !file.direct_io() && !scan.buffered_io.contains(&copy) {
                    scan.buffered_io.push(copy);
                }
                files.push(Some(Rc::new(file)));
            } else {
                files.push(None);
            }
        }
        let present: Vec<bool> = files.iter().map(Option::is_some).collect();
        let walk = if !present.iter().any(|present| *present) {
            Walk::AfterTorn(Vec::new())
        } else if after_torn {
            Walk::AfterTorn(holds_data(&files, log_id, listed, failure).await?)
        } else if listed.base_offset != next_offset {
            Walk::Misplaced { expected: next_offset }
        } else {
            let next_base = manifest.segments.get(index + 1).map(|next| next.base_offset);
            let cut = manifest.truncated_end.filter(|_| next_base.is_none());
            let bounds =
                WalkBounds { log_id, listed, next_base, cut, reach: config.written_ahead_distance_max() };
            let (walk, end) = walk_segment(&files, bounds, next_offset, failure).await?;
            next_offset = end;
            after_torn = matches!(&walk, Walk::Walked { stop: StopWhy::AtCut, .. })
                || matches!(&walk, Walk::Walked { stop: StopWhy::Damaged { .. }, .. }) && !listed.recycled;
            walk
        };
        let misplaced = matches!(walk, Walk::Misplaced { .. });
        scan.segments.push(SegmentScan { listed, present, walk });
        all_files.push(files);
        if misplaced {
            // The plan refuses the start there: nothing after it matters.
            break;
        }
    }
    Ok(all_files)
}

/// Whether each copy of a segment after a torn tail holds data: bytes, or, in a recycled
/// segment, a valid batch of its own.
async fn holds_data<F: StorageFile>(
    files: &[Option<Rc<F>>],
    log_id: u64,
    listed: Listed,
    failure: &FailedRead,
) -> Result<Vec<bool>, LogError> {
    let mut holds = Vec::with_capacity(files.len());
    for (copy, file) in files.iter().enumerate() {
        holds.push(match file {
            None => false,
            Some(file) if listed.recycled => {
                first_valid_batch(&**file, log_id, listed.base_offset, 0, listed.capacity)
                    .await
                    .map_err(failure.of(copy))?
                    .is_some()
            }
            Some(file) => last_nonzero_end(&**file, listed.capacity).await.map_err(failure.of(copy))? > 0,
        });
    }
    Ok(holds)
}

/// What bounds a segment's walk.
#[derive(Clone, Copy)]
struct WalkBounds {
    log_id: u64,
    listed: Listed,
    /// The next segment's base: a closed segment ends there.
    next_base: Option<u64>,
    /// A truncation's cut, in the last segment.
    cut: Option<u64>,
    /// How far past a hole of zeros a batch written ahead may start.
    reach: u64,
}

/// Walks a segment from position 0, expecting `next_offset` first: at each position what
/// every copy holds, moving on by the first valid copy's batch. Returns the walk and the
/// offset it reached.
async fn walk_segment<F: StorageFile>(
    files: &[Option<Rc<F>>],
    bounds: WalkBounds,
    mut next_offset: u64,
    failure: &FailedRead,
) -> Result<(Walk, u64), LogError> {
    let WalkBounds { log_id, listed, next_base, cut, .. } = bounds;
    let (base, capacity) = (listed.base_offset, listed.capacity);
    let mut windows: Vec<Window<F::Read>> = files.iter().map(|_| Window::new()).collect();
    let mut steps = Vec::new();
    let mut position = 0u64;
    // A closed segment holds the offsets up to the next one's base and ends there. What may
    // follow its last batch is not always zeros: a batch of an earlier life (see
    // `first_valid_batch_from_offset`) can stand right after it, whole, when the log rolled
    // there.
    while position + BLOCK_BYTES as u64 <= capacity
        && Some(next_offset) != next_base
        && Some(next_offset) != cut
    {
        let mut found = Vec::with_capacity(files.len());
        for (copy, file) in files.iter().enumerate() {
            found.push(match file {
                None => CopyBatch::Missing,
                Some(file) => {
                    let read =
                        read_batch(&**file, &mut windows[copy], log_id, base, position, capacity).await;
                    match read.map_err(failure.of(copy))? {
                        ReadBatch::Valid(header, newest) if header.base_offset == next_offset => {
                            CopyBatch::Valid(header, newest)
                        }
                        ReadBatch::Valid(header, _) => CopyBatch::Invalid(format!(
                            "batch starts at offset {} where {next_offset} was expected",
                            header.base_offset
                        )),
                        ReadBatch::Empty => CopyBatch::Empty,
                        ReadBatch::Invalid(why) => CopyBatch::Invalid(why),
                    }
                }
            });
        }
        let valid = found.iter().find_map(|batch| match batch {
            CopyBatch::Valid(header, _) => Some(*header),
            _ => None,
        });
        let zeros = found.iter().all(|batch| matches!(batch, CopyBatch::Empty | CopyBatch::Missing));
        let why = found.iter().find_map(|batch| match batch {
            CopyBatch::Invalid(why) => Some(why.clone()),
            _ => None,
        });
        steps.push((position, found));
        if let Some(header) = valid {
            next_offset = header.end_offset();
            position += header.disk_bytes() as u64;
            continue;
        }
        let stop = if zeros {
            // The log's end, unless a power failure lost the commit here after the one behind
            // it was written ahead and landed: in a fresh segment that hole reads as zeros.
            // Left on disk, that batch (never acknowledged) would outlive this recovery, so
            // it is looked for where it can start, at most `reach` past here. (A closed
            // segment ends at the next one's base, before any such hole.)
            let mut beyond = vec![Beyond::default(); files.len()];
            if next_base.is_none() {
                for (copy, file) in files.iter().enumerate() {
                    let Some(file) = file else { continue };
                    let starts = position + BLOCK_BYTES as u64..(position + bounds.reach + 1).min(capacity);
                    // Where the file holds no data (space only fallocated, as after the end of
                    // most fresh segments), nothing is read.
                    let data = file
                        .data_from(starts.start)
                        .await
                        .map_err(|e| LogError::Io(io_text(&e)))
                        .map_err(failure.of(copy))?;
                    let Some(data) = data else { continue };
                    let from = starts.start.max(data / BLOCK_BYTES as u64 * BLOCK_BYTES as u64);
                    beyond[copy].later = later_batch(&**file, bounds, from..starts.end, next_offset)
                        .await
                        .map_err(failure.of(copy))?;
                }
            }
            StopWhy::Zeros(beyond)
        } else {
            let mut beyond = vec![Beyond::default(); files.len()];
            for (copy, file) in files.iter().enumerate() {
                let Some(file) = file else { continue };
                // The batch that belongs here would have held `next_offset`: any later one
                // of this life starts after it.
                let starts = position + BLOCK_BYTES as u64..capacity;
                beyond[copy].later =
                    later_batch(&**file, bounds, starts, next_offset).await.map_err(failure.of(copy))?;
                if listed.recycled {
                    let head = windows[copy]
                        .at(&**file, position, BLOCK_BYTES, capacity)
                        .await
                        .map_err(failure.of(copy))?;
                    beyond[copy].torn_header_bytes =
                        record::decode_batch_header(head, log_id, base, position)
                            .ok()
                            .map(|header| header.disk_bytes() as u64);
                }
            }
            StopWhy::Damaged { why: why.unwrap_or_default(), beyond }
        };
        return Ok((Walk::Walked { steps, stop }, next_offset));
    }
    let stop = if Some(next_offset) == cut { StopWhy::AtCut } else { StopWhy::End };
    Ok((Walk::Walked { steps, stop }, next_offset))
}

/// The first valid batch of this life starting in `starts` (offsets above `next_offset`), and
/// whether it is an orphan written ahead (`orphan_written_ahead`).
async fn later_batch<F: StorageFile>(
    file: &F,
    bounds: WalkBounds,
    starts: std::ops::Range<u64>,
    next_offset: u64,
) -> Result<Option<(u64, bool)>, LogError> {
    let (log_id, base, capacity) = (bounds.log_id, bounds.listed.base_offset, bounds.listed.capacity);
    let Some(later) =
        first_valid_batch_from_offset(file, log_id, base, starts, capacity, next_offset + 1).await?
    else {
        return Ok(None);
    };
    let orphan = orphan_written_ahead(file, log_id, base, later, capacity, next_offset).await?;
    Ok(Some((later, orphan)))
}

/// Scan window for recovery reads, at most: the window grows from
/// `RECOVERY_READ_BYTES_FIRST`, so that a log holding little is read with little.
const RECOVERY_READ_BYTES: usize = 1 << 20;

const RECOVERY_READ_BYTES_FIRST: usize = 64 << 10;

/// What one copy holds at a position during recovery.
#[derive(Debug, Clone)]
pub(super) enum CopyBatch {
    Valid(BatchHeader, u64),
    Empty,
    Invalid(String),
    Missing,
}

enum ReadBatch {
    /// A valid batch and the publish time of its newest record.
    Valid(BatchHeader, u64),
    Empty,
    Invalid(String),
}

/// A read-ahead window over a segment for the recovery scan: batches are parsed out of one
/// large read instead of one read per batch.
struct Window<R> {
    start: u64,
    bytes: Option<R>,
    /// The size of the next read: `RECOVERY_READ_BYTES_FIRST`, doubling up to
    /// `RECOVERY_READ_BYTES`. Most logs are small, and the unwritten rest of a segment reads
    /// as zeros the kernel still copies: many small logs would read gigabytes of them in
    /// large reads.
    next_bytes: usize,
}

impl<R: std::ops::Deref<Target = [u8]>> Window<R> {
    fn new() -> Window<R> {
        Window { start: 0, bytes: None, next_bytes: RECOVERY_READ_BYTES_FIRST }
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
            let want = (length.max(self.next_bytes) as u64).min(size.saturating_sub(position)) as usize;
            let want = record::align_up(want, BLOCK_BYTES);
            self.next_bytes = (self.next_bytes * 2).min(RECOVERY_READ_BYTES);
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
        Ok(views) => {
            ReadBatch::Valid(header, views.iter().map(|view| view.publish_time_ms).max().unwrap_or(0))
        }
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
    first_valid_batch_from_offset(file, log_id, segment_base, from..size, size, 0).await
}

/// The position of the first valid batch starting in `starts` whose offsets start at
/// `offset_min` or later (reading up to `size`). Valid batches below `offset_min` are passed
/// over: found after damage at the log's end (`offset_min` one past the offset the damaged
/// batch would have held), they are of an earlier life of the file. Such a batch is one written
/// ahead of a commit a crash lost, beyond the reach of the recovery after it (written with a
/// larger group commit, or by a build before recovery looked for it), whose offsets the log
/// then reused. Being whole, nothing written since overlaps them.
async fn first_valid_batch_from_offset<F: StorageFile>(
    file: &F,
    log_id: u64,
    segment_base: u64,
    starts: std::ops::Range<u64>,
    size: u64,
    offset_min: u64,
) -> Result<Option<u64>, LogError> {
    let mut window = Window::new();
    let mut position = starts.start;
    while position < starts.end && position + BLOCK_BYTES as u64 <= size {
        let head = window.at(file, position, BLOCK_BYTES, size).await?;
        if record::decode_batch_header(head, log_id, segment_base, position).is_ok() {
            if let ReadBatch::Valid(header, _) =
                read_batch(file, &mut window, log_id, segment_base, position, size).await?
            {
                if header.base_offset >= offset_min {
                    return Ok(Some(position));
                }
                position += header.disk_bytes() as u64;
                continue;
            }
        }
        position += BLOCK_BYTES as u64;
    }
    Ok(None)
}

/// Whether the valid batch at `at` is a commit's successor that landed while the commit did
/// not: written ahead (`record::FLAG_WRITTEN_AHEAD`), beyond the offsets recovered so far
/// (`next_offset`), and the last valid batch of the segment (batches of an earlier life aside,
/// see `first_valid_batch_from_offset`). At most two writes of a log are in flight, so damage
/// in the middle of the log is followed by more than one valid batch, or by one that was not
/// written ahead, and is refused; only damage to the second-to-last batch in every copy, when
/// the last was written ahead, reads the same as the hole and loses both.
async fn orphan_written_ahead<F: StorageFile>(
    file: &F,
    log_id: u64,
    segment_base: u64,
    at: u64,
    size: u64,
    next_offset: u64,
) -> Result<bool, LogError> {
    let mut window = Window::new();
    let ReadBatch::Valid(header, _) = read_batch(file, &mut window, log_id, segment_base, at, size).await?
    else {
        return Ok(false);
    };
    let head = window.at(file, at, BLOCK_BYTES, size).await?;
    if record::batch_flags(head) & record::FLAG_WRITTEN_AHEAD == 0 || header.base_offset <= next_offset {
        return Ok(false);
    }
    let end = at + header.disk_bytes() as u64;
    Ok(first_valid_batch_from_offset(file, log_id, segment_base, end..size, size, next_offset + 1)
        .await?
        .is_none())
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

pub(super) async fn zero_range<S: Storage>(
    storage: &S,
    file: &S::File,
    from: u64,
    to: u64,
) -> Result<(), LogError> {
    let mut position = from;
    while position < to {
        let length = ((to - position) as usize).min(RECOVERY_READ_BYTES);
        let mut buffer = storage.alloc_buffer(record::align_up(length, BLOCK_BYTES));
        buffer.bytes_mut().fill(0);
        file.write_at(Rc::new(buffer), position).await.map_err(|e| LogError::Io(io_text(&e)))?;
        position += length as u64;
    }
    Ok(())
}

impl<S: Storage> Log<S> {
    /// Opens (recovering and repairing) or creates the log at `relative` inside every data
    /// directory.
    pub async fn open(
        storage: S,
        directories: Rc<Directories>,
        relative: &Path,
        log_id: u64,
        config: impl Into<Rc<LogConfig>>,
    ) -> Result<(Log<S>, RecoveryReport), LogError> {
        let config = config.into();
        let (scan, files) = recovery::scan(&storage, &directories, relative, log_id, &config).await?;
        let plan = recovery::plan(&scan)?;
        Log::carry_out(storage, directories, (relative, log_id, config), plan, files).await
    }

    /// The log `open` returns for a folder nothing was ever written to, made without reading
    /// it: for a log found pristine (`is_pristine`) and dropped, made again at its first use (a
    /// log gets its first file with its first segment). Not for a log with a reserve, which
    /// `open` looks for on disk.
    pub fn new_empty(
        storage: S,
        directories: Rc<Directories>,
        relative: &Path,
        log_id: u64,
        config: Rc<LogConfig>,
    ) -> Log<S> {
        assert!(!config.reserve, "a log with a reserve is opened, not made empty");
        Log::recovered(
            storage,
            directories,
            (relative, log_id, config),
            Vec::new(),
            (0, &Manifest::default()),
        )
    }

    /// Does what `plan` decided, with the files the scan opened, and returns the log.
    pub(super) async fn carry_out(
        storage: S,
        directories: Rc<Directories>,
        (relative, log_id, config): (&Path, u64, Rc<LogConfig>),
        plan: RecoveryPlan,
        files: ScannedFiles<S>,
    ) -> Result<(Log<S>, RecoveryReport), LogError> {
        let io = |e: std::io::Error| LogError::Io(io_text(&e));
        let folder = |copy: usize| directories.path(copy).join(relative);
        // The copies a read failed in are left alone: they are fenced below.
        let healthy: Vec<usize> = (0..directories.count())
            .filter(|copy| !plan.fenced.iter().any(|(fenced, _)| fenced == copy))
            .collect();
        let mut report = plan.report.clone();
        for (copy, name) in &plan.leftovers {
            storage.remove_file(&folder(*copy).join(name)).map_err(io)?;
        }
        for (copy, base) in &plan.unlisted_removed {
            storage.remove_file(&folder(*copy).join(segment_name(*base))).map_err(io)?;
        }
        if !plan.unlisted_removed.is_empty() {
            // The unlinks are durable before the manifest is rewritten without a truncation's
            // mark, which is all that tells a removed tail's file from damage.
            for copy in &healthy {
                storage.sync_dir(&folder(*copy)).await.map_err(io)?;
            }
        }
        for base in &plan.dropped_after_torn {
            for copy in &healthy {
                let path = folder(*copy).join(segment_name(*base));
                if storage.exists(&path) {
                    storage.remove_file(&path).map_err(io)?;
                }
            }
        }
        let segments: Vec<Segment<S>> = plan
            .segments
            .iter()
            .zip(files)
            .map(|(planned, files)| Segment {
                base_offset: planned.listed.base_offset,
                newest_publish_ms: planned.newest_publish_ms,
                capacity: planned.listed.capacity,
                write_position: planned.write_position,
                recycled: planned.listed.recycled,
                batches: planned.batches.clone(),
                files,
                closed: None,
            })
            .collect();
        let reserve = if config.reserve {
            find_reserve(&storage, &directories, relative).await.map(Box::new)
        } else {
            None
        };
        let log = Log::recovered(
            storage.clone(),
            directories.clone(),
            (relative, log_id, config),
            segments,
            (plan.next_offset, &plan.manifest),
        );
        log.inner.borrow_mut().kept.reserve = reserve;
        for copy in &report.buffered_io_copies {
            log.warn_buffered(*copy);
        }
        for (copy, why) in &plan.fenced {
            log.fence_copy(*copy, &format!("reading {} during recovery: {why}", folder(*copy).display()));
        }
        for repair in &plan.repairs {
            // A copy that could not take a repair (a full or failing disk) is fenced; skip the
            // rest of its repairs instead of failing each one again.
            if log.directories.is_fenced(repair.to) {
                continue;
            }
            if log.repair(repair.segment, repair.position, repair.bytes, repair.from, repair.to).await? {
                report.batches_repaired += 1;
            }
        }
        log.zero_discarded(&plan, &mut report).await?;
        // Every copy gets the newest manifest. A new log writes none: it gets its first with
        // its first segment, so a log never appended to has only its folders.
        if plan.rewrite_manifest {
            log.write_manifest().await?;
        }
        Ok((log, report))
    }

    /// Zeroes what recovery discards in each copy holding it: the headers of batches written
    /// ahead of a lost commit, and a torn tail. A copy whose write, sync or read fails here is
    /// fenced, as at run time, and the log opens while ⌈M/2⌉ copies remain.
    async fn zero_discarded(&self, plan: &RecoveryPlan, report: &mut RecoveryReport) -> Result<(), LogError> {
        let io = |e: std::io::Error| LogError::Io(io_text(&e));
        let mut fenced_here = false;
        for (segment_index, copy, position) in &plan.orphans {
            let file = self.inner.borrow().segments[*segment_index].files[*copy].clone();
            let Some(file) = file else { continue };
            let zeroed = async {
                zero_range(&self.storage, &*file, *position, position + BLOCK_BYTES as u64).await?;
                file.sync_data().await.map_err(io)
            };
            if let Err(error) = zeroed.await {
                self.fence_copy(*copy, &format!("zeroing a batch written ahead at byte {position}: {error}"));
                fenced_here = true;
            }
        }
        if let Some((segment_index, position)) = plan.torn {
            let (files, capacity) = {
                let inner = self.inner.borrow();
                let segment = &inner.segments[segment_index];
                (segment.files.clone(), segment.capacity)
            };
            let mut discarded = 0;
            for (copy, file) in files.into_iter().enumerate() {
                let Some(file) = file else { continue };
                let zeroed = async {
                    let end = last_nonzero_end(&*file, capacity).await?;
                    if end > position {
                        zero_range(&self.storage, &*file, position, end).await?;
                        file.sync_data().await.map_err(io)?;
                    }
                    Ok::<u64, LogError>(end)
                };
                match zeroed.await {
                    Ok(end) => discarded = discarded.max(end.saturating_sub(position)),
                    Err(error) => {
                        self.fence_copy(copy, &format!("zeroing a torn tail at byte {position}: {error}"));
                        fenced_here = true;
                    }
                }
            }
            report.torn_bytes_discarded = discarded;
            let base = plan.segments[segment_index].listed.base_offset;
            report.torn_at = Some((self.folder(0).join(segment_name(base)), position));
        }
        let healthy = self.writable_copies().len();
        let quorum = self.directories.quorum();
        if fenced_here && healthy < quorum {
            return Err(LogError::Io(format!(
                "recovery could zero what it discards in only {healthy} data directories; {quorum} are needed"
            )));
        }
        Ok(())
    }

    /// The log as recovery leaves it, its positions all at the recovered end.
    fn recovered(
        storage: S,
        directories: Rc<Directories>,
        (relative, log_id, config): (&Path, u64, Rc<LogConfig>),
        segments: Vec<Segment<S>>,
        (next_offset, manifest): (u64, &Manifest),
    ) -> Log<S> {
        let last_epoch = segments
            .iter()
            .rev()
            .find_map(|segment| segment.batches.last())
            .map_or(record::EPOCH_NONE, |entry| entry.header.epoch);
        let copies = directories.count();
        Log {
            storage,
            directories,
            inner: Rc::new(RefCell::new(LogInner {
                log_id,
                relative: relative.to_path_buf(),
                config,
                segments,
                // Standalone: what recovery found durable is committed (see `committed_end`).
                // A replicated log's commit point is its consensus's to persist; until a
                // replica is told (`commit_to`), it would serve what it has durable.
                positions: Positions::at(next_offset),
                staging: Staging::new(),
                epochs: Epochs {
                    epoch: STANDALONE_EPOCH.max(last_epoch),
                    last_epoch,
                    promised_epoch: manifest.promised_epoch,
                    promised_durable: manifest.promised_epoch,
                },
                cache: ReadCache::new(),
                copies: Copies { states: CopyStates::all_current(copies), joining: None },
                kept: Kept::new(),
                fenced: None,
                truncated_end: None,
                manifest_sequence: manifest.sequence,
                flushing: false,
                commit_on_durable: true,
                truncating: false,
                closed_for_removal: false,
                manifest_writing: false,
                rolled: false,
                reserving: false,
                idle_sweeps: 0,
                warned_buffered: false,
            })),
            committed: Notify::new(),
            durable: Notify::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The planner alone, on scans made up here: what recovery decides for each state a crash
    //! or a disk can leave (the recovery tests in `log::tests` run the same rules on SimDisk).
    use super::*;

    const COPIES: usize = 3;

    fn header(base_offset: u64) -> BatchHeader {
        BatchHeader { base_offset, record_count: 1, records_bytes: 100, epoch: STANDALONE_EPOCH }
    }

    fn valid(base_offset: u64) -> CopyBatch {
        CopyBatch::Valid(header(base_offset), 7)
    }

    fn invalid() -> CopyBatch {
        CopyBatch::Invalid("checksum mismatch".into())
    }

    fn listed(base_offset: u64) -> Listed {
        Listed { base_offset, capacity: 1 << 20, recycled: false }
    }

    /// A walk whose steps are one block apart (each batch takes a block).
    fn walked(steps: Vec<Vec<CopyBatch>>, stop: StopWhy) -> Walk {
        let steps = steps
            .into_iter()
            .enumerate()
            .map(|(index, found)| ((index * BLOCK_BYTES) as u64, found))
            .collect();
        Walk::Walked { steps, stop }
    }

    fn segment(base_offset: u64, walk: Walk) -> SegmentScan {
        SegmentScan { listed: listed(base_offset), present: vec![true; COPIES], walk }
    }

    /// Every copy holding the manifest (sequence 3) that lists `segments`.
    fn scan_of(segments: Vec<SegmentScan>) -> Scan {
        let manifest = Manifest {
            sequence: 3,
            segments: segments.iter().map(|segment| segment.listed).collect(),
            truncated_end: None,
            promised_epoch: 0,
        };
        Scan {
            relative: PathBuf::from("log"),
            folders: (0..COPIES).map(|copy| PathBuf::from(format!("/d{copy}/log"))).collect(),
            listings: (0..COPIES)
                .map(|_| FolderScan {
                    segments: Vec::new(),
                    leftovers: Vec::new(),
                    manifests: vec![manifest.clone()],
                })
                .collect(),
            segments,
            ..Default::default()
        }
    }

    fn zeros() -> StopWhy {
        StopWhy::Zeros(vec![Beyond::default(); COPIES])
    }

    fn damaged(beyond: Vec<Beyond>) -> StopWhy {
        StopWhy::Damaged { why: "checksum mismatch".into(), beyond }
    }

    fn all(batch: CopyBatch) -> Vec<CopyBatch> {
        vec![batch; COPIES]
    }

    fn is_corrupt(result: Result<RecoveryPlan, LogError>) -> bool {
        matches!(result, Err(LogError::Corrupt(_)))
    }

    /// A read failed in copy 1 (EIO), so the scan went on without it: its folder reads as
    /// empty and its files as missing. Within the budget (⌊M/2⌋) the copy is fenced, nothing is
    /// repaired into it, and the log recovers from the others; beyond it the start is refused,
    /// naming the copies.
    #[test]
    fn a_copy_whose_read_failed_is_fenced_within_the_budget_and_refuses_beyond() {
        let left_out = |walk: Walk, failed: &[usize]| {
            let mut scan = scan_of(vec![segment(0, walk)]);
            for copy in failed {
                scan.listings[*copy] = FolderScan::default();
                scan.segments[0].present[*copy] = false;
                scan.failed.push((*copy, "injected EIO on read".into()));
            }
            scan
        };
        let one_missing = vec![valid(0), CopyBatch::Missing, valid(0)];
        let walk =
            walked(vec![one_missing.clone(), vec![valid(1), CopyBatch::Missing, CopyBatch::Empty]], zeros());
        let plan = plan(&left_out(walk, &[1])).unwrap();
        assert_eq!(plan.fenced.iter().map(|(copy, _)| *copy).collect::<Vec<_>>(), vec![1]);
        assert_eq!(plan.report.copies_fenced, vec![1]);
        let repair = Repair { segment: 0, position: BLOCK_BYTES as u64, bytes: BLOCK_BYTES, from: 0, to: 2 };
        assert_eq!(plan.repairs, vec![repair], "a batch is repaired into a healthy copy only");
        assert_eq!(plan.next_offset, 2);
        assert!(!plan.rewrite_manifest, "the fenced copy's missing manifest is no reason to rewrite it");

        let only_one = vec![valid(0), CopyBatch::Missing, CopyBatch::Missing];
        let refused = super::plan(&left_out(walked(vec![only_one], zeros()), &[1, 2]));
        let Err(LogError::DataLoss(why)) = refused else { panic!("two failed copies of three: {refused:?}") };
        assert!(why.contains("/d1/log") && why.contains("/d2/log") && why.contains("2 of 3"), "{why}");
    }

    #[test]
    fn a_clean_log_keeps_everything_and_rewrites_nothing() {
        let plan = plan(&scan_of(vec![segment(
            0,
            walked(vec![all(valid(0)), all(valid(1)), all(CopyBatch::Empty)], zeros()),
        )]))
        .unwrap();
        assert_eq!(plan.next_offset, 2);
        assert_eq!(plan.segments[0].write_position, 2 * BLOCK_BYTES as u64);
        assert!(plan.repairs.is_empty() && plan.orphans.is_empty() && plan.torn.is_none());
        assert!(!plan.rewrite_manifest);
        assert_eq!((plan.report.batches, plan.report.records, plan.report.segments), (2, 2, 1));
    }

    #[test]
    fn a_torn_tail_in_every_copy_is_zeroed() {
        let walk = walked(vec![all(valid(0)), all(invalid())], damaged(vec![Beyond::default(); COPIES]));
        let plan = plan(&scan_of(vec![segment(0, walk)])).unwrap();
        assert_eq!(plan.torn, Some((0, BLOCK_BYTES as u64)));
        assert_eq!(plan.next_offset, 1);
    }

    #[test]
    fn a_copy_behind_is_repaired_from_the_first_good_one() {
        let behind = vec![valid(1), valid(1), CopyBatch::Empty];
        let walk = walked(vec![all(valid(0)), behind, all(CopyBatch::Empty)], zeros());
        let plan = plan(&scan_of(vec![segment(0, walk)])).unwrap();
        let repair = Repair { segment: 0, position: BLOCK_BYTES as u64, bytes: BLOCK_BYTES, from: 0, to: 2 };
        assert_eq!(plan.repairs, vec![repair]);
        assert_eq!(plan.next_offset, 2);
    }

    #[test]
    fn a_damaged_header_in_one_copy_is_repaired() {
        let walk =
            walked(vec![vec![invalid(), valid(0), CopyBatch::Missing], all(CopyBatch::Empty)], zeros());
        let plan = plan(&scan_of(vec![segment(0, walk)])).unwrap();
        let to = |to| Repair { segment: 0, position: 0, bytes: BLOCK_BYTES, from: 1, to };
        assert_eq!(plan.repairs, vec![to(0), to(2)]);
    }

    #[test]
    fn damage_in_every_copy_with_a_valid_batch_after_it_refuses() {
        let mut beyond = vec![Beyond::default(); COPIES];
        beyond[1].later = Some((3 * BLOCK_BYTES as u64, false));
        let walk = walked(vec![all(valid(0)), all(invalid())], damaged(beyond));
        assert!(is_corrupt(plan(&scan_of(vec![segment(0, walk)]))));
    }

    #[test]
    fn zeros_with_a_valid_batch_after_them_refuse_unless_it_was_written_ahead() {
        let mut beyond = vec![Beyond::default(); COPIES];
        beyond[0].later = Some((2 * BLOCK_BYTES as u64, false));
        let walk = walked(vec![all(valid(0)), all(CopyBatch::Empty)], StopWhy::Zeros(beyond.clone()));
        assert!(is_corrupt(plan(&scan_of(vec![segment(0, walk)]))));
        beyond[0].later = Some((2 * BLOCK_BYTES as u64, true));
        let walk = walked(vec![all(valid(0)), all(CopyBatch::Empty)], StopWhy::Zeros(beyond));
        let plan = plan(&scan_of(vec![segment(0, walk)])).unwrap();
        assert_eq!(plan.orphans, vec![(0, 0, 2 * BLOCK_BYTES as u64)]);
        assert!(plan.torn.is_none());
    }

    #[test]
    fn a_segment_missing_from_every_copy_refuses() {
        let mut missing = segment(0, walked(vec![], StopWhy::End));
        missing.present = vec![false; COPIES];
        assert!(is_corrupt(plan(&scan_of(vec![missing]))));
    }

    #[test]
    fn segments_after_a_torn_tail_must_be_empty_and_are_dropped() {
        let torn = || {
            segment(0, walked(vec![all(valid(0)), all(invalid())], damaged(vec![Beyond::default(); COPIES])))
        };
        let holding = segment(1, Walk::AfterTorn(vec![false, true, false]));
        assert!(is_corrupt(plan(&scan_of(vec![torn(), holding]))));
        let empty = segment(1, Walk::AfterTorn(vec![false; COPIES]));
        let plan = plan(&scan_of(vec![torn(), empty])).unwrap();
        assert_eq!(plan.dropped_after_torn, vec![1]);
        assert_eq!(plan.segments.len(), 1);
        assert!(plan.rewrite_manifest, "the manifest without the dropped segment");
    }

    #[test]
    fn a_segment_starting_elsewhere_than_the_log_ends_refuses() {
        let first = segment(0, walked(vec![all(valid(0)), all(CopyBatch::Empty)], zeros()));
        let second = segment(5, Walk::Misplaced { expected: 1 });
        assert!(is_corrupt(plan(&scan_of(vec![first, second]))));
    }

    #[test]
    fn an_unlisted_file_is_removed_only_when_it_holds_nothing_of_its_own() {
        let mut scan = scan_of(vec![segment(0, walked(vec![all(CopyBatch::Empty)], zeros()))]);
        scan.unlisted = vec![UnlistedScan { copy: 1, base: 9, holds_data: true, has_own_batch: false }];
        let removed = plan(&scan).unwrap();
        assert_eq!(removed.unlisted_removed, vec![(1, 9)]);
        assert!(removed.rewrite_manifest);
        scan.unlisted[0].has_own_batch = true;
        assert!(is_corrupt(plan(&scan)));
    }

    #[test]
    fn without_a_manifest_the_first_segment_alone_is_the_log() {
        let mut scan = scan_of(vec![segment(0, walked(vec![all(valid(0)), all(CopyBatch::Empty)], zeros()))]);
        for listing in &mut scan.listings {
            listing.manifests.clear();
        }
        scan.first_segment = vec![
            FirstSegmentScan { copy: 0, size: 64 << 10, holds_data: true, starts_as_this_log: true },
            FirstSegmentScan { copy: 1, size: 128 << 10, holds_data: true, starts_as_this_log: false },
        ];
        let (manifest, has_manifest) = choose_manifest(&scan).unwrap();
        assert!(has_manifest, "the one the first segment implies");
        assert_eq!(manifest.segments, vec![Listed { base_offset: 0, capacity: 128 << 10, recycled: false }]);
        assert!(!plan(&scan).unwrap().rewrite_manifest, "a log with one segment writes no manifest");
        scan.first_segment[0].starts_as_this_log = false;
        assert!(is_corrupt(plan(&scan)), "no copy starts with a batch of this log");
    }

    #[test]
    fn a_truncation_cut_short_ends_the_log_at_its_cut() {
        let mut scan = scan_of(vec![segment(0, walked(vec![all(valid(0))], StopWhy::AtCut))]);
        for listing in &mut scan.listings {
            listing.manifests[0].truncated_end = Some(1);
        }
        let plan = plan(&scan).unwrap();
        assert_eq!(plan.torn, Some((0, BLOCK_BYTES as u64)));
        assert!(plan.rewrite_manifest, "the manifest without the mark");
    }

    #[test]
    fn a_copy_with_an_older_manifest_gets_the_newest() {
        let mut scan = scan_of(vec![segment(0, walked(vec![all(CopyBatch::Empty)], zeros()))]);
        scan.listings[2].manifests[0].sequence = 2;
        let plan = plan(&scan).unwrap();
        assert_eq!(plan.manifest.sequence, 3);
        assert!(plan.rewrite_manifest);
    }

    #[test]
    fn damage_in_a_recycled_segment_ends_it_without_zeroing() {
        let mut beyond = vec![Beyond::default(); COPIES];
        beyond[0].torn_header_bytes = Some(8192);
        let mut recycled = segment(0, walked(vec![all(valid(0)), all(invalid())], damaged(beyond)));
        recycled.listed.recycled = true;
        let plan = plan(&scan_of(vec![recycled])).unwrap();
        assert!(plan.torn.is_none());
        assert_eq!(plan.report.torn_bytes_discarded, 8192);
        assert_eq!(plan.segments[0].write_position, BLOCK_BYTES as u64);
    }
}
