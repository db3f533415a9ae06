//! Log tests on SimDisk: commits, crashes that drop unsynced writes, torn tails, bit rot,
//! failing writes and syncs, a full disk, and with three data directories: a corrupting, a
//! misdirecting, a losing and a failing one (docs/TESTING.md T2–T8).
//!
//! The tests whose outcome depends on how tasks interleave (group commit, commits built
//! ahead, fencing, resync, rolls, the ENOSPC reserve, spares, truncation in
//! `replication_tests`) run under the seeded deterministic executor over `SEEDS_DEFAULT`
//! seeds (`for_each_seed`), each seed one interleaving and one set of disk latencies,
//! replayed by `RINGPOST_SIM_SEED`; the others run on glommio (`run`), as do the tests of
//! real O_DIRECT files in `storage::dma`.

use super::*;
use crate::ids::Offset;
use crate::storage::sim::{CrashMode, SimDisk};
use std::path::Path;

pub(crate) fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
    let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap();
    executor.run(future);
}

/// Seeds each seeded log test runs by default (`RINGPOST_SIM_SEEDS` and `RINGPOST_SIM_SEED`
/// change it; see `runtime::sim::seeds`).
pub(crate) const SEEDS_DEFAULT: u64 = 16;

/// Most latency the seeded tests give a disk operation, in virtual time: long beside a commit's
/// building, so that writes, syncs and the tasks around them complete in an order the seed
/// chooses.
const LATENCY_MAX: std::time::Duration = std::time::Duration::from_micros(300);

/// Runs `test` under the seeded deterministic executor once per seed (see
/// `runtime::sim::for_each_seed`), on a SimDisk whose every operation takes a latency drawn
/// from the seed, so that each seed is one interleaving of appends, commits, writes ahead,
/// rolls, resyncs and truncations, replayed exactly by `RINGPOST_SIM_SEED`.
pub(crate) fn for_each_seed<F: std::future::Future<Output = ()>>(
    name: &str,
    test: impl Fn(SimDisk, u64) -> F,
) {
    crate::runtime::sim::for_each_seed(name, SEEDS_DEFAULT, |seed| {
        let disk = SimDisk::new();
        // A third of the seeds without latency: every disk operation completes at once, and
        // only the order of ready tasks varies.
        let latency_max = LATENCY_MAX * (seed % 3) as u32 / 2;
        let latency = crate::storage::sim::FaultPlan { latency_max, ..Default::default() };
        disk.set_fault_plan(Some(latency), seed);
        crate::runtime::sim::run(seed, test(disk, seed));
    });
}

pub(crate) fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes_initial: 64 * 1024,
        segment_bytes_max: 128 * 1024,
        group_commit_bytes_max: 32 * 1024,
        tail_cache_bytes_max: 0,
        tail_cache_budget: None,
        staging_bytes_max: 1 << 20,
        keep_files_open: true,
        read_ahead: true,
        prewrite: false,
        recycle: false,
        reserve: false,
    }
}

pub(crate) fn records_for(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for payload in payloads {
        record::encode_record_unsealed(&mut out, 42, payload, &mut std::iter::empty(), "");
    }
    out
}

pub(crate) fn payload(i: u64) -> Vec<u8> {
    format!("message-{i:06}-{}", "x".repeat((i % 300) as usize)).into_bytes()
}

const RELATIVE: &str = "topics/1";

pub(crate) fn directories(count: usize) -> Rc<Directories> {
    Directories::new((0..count).map(|i| PathBuf::from(format!("/d{i}"))).collect())
}

fn folder(copy: usize) -> PathBuf {
    PathBuf::from(format!("/d{copy}")).join(RELATIVE)
}

fn segment_path(copy: usize, base: u64) -> PathBuf {
    folder(copy).join(segment_name(base))
}

pub(crate) async fn open(
    disk: &SimDisk,
    dirs: &Rc<Directories>,
    config: LogConfig,
) -> Result<(Log<SimDisk>, RecoveryReport), LogError> {
    Log::open(disk.clone(), dirs.clone(), Path::new(RELATIVE), 1, config).await
}

async fn append_many(log: &Log<SimDisk>, from: u64, count: u64) -> Vec<u64> {
    let mut acked = Vec::new();
    for i in from..from + count {
        let (offset, n) = log.append(records_for(&[payload(i)]), 1).await.unwrap();
        assert_eq!(n, 1);
        acked.push(offset.get());
    }
    acked
}

async fn read_all(log: &Log<SimDisk>) -> Vec<StoredRecord> {
    log.read(Offset::ZERO, usize::MAX, usize::MAX).await.unwrap()
}

/// Writes a batch header of the current format (epoch `STANDALONE_EPOCH`) at the start of
/// `out`; `place` is (log id, segment base, file position).
pub(crate) fn write_header(
    out: &mut [u8],
    place: (u64, u64, u64),
    base_offset: u64,
    count: u32,
    records_bytes: usize,
) {
    let header = BatchHeader {
        base_offset,
        record_count: count,
        records_bytes: records_bytes as u32,
        epoch: STANDALONE_EPOCH,
    };
    record::encode_batch_header_flagged(out, place, &header, 0);
}

fn check_payloads(records: &[StoredRecord], count: usize) {
    assert!(records.len() >= count, "{} records, expected at least {count}", records.len());
    for (i, record) in records.iter().take(count).enumerate() {
        assert_eq!(record.offset.get(), i as u64);
        assert_eq!(record.data, payload(i as u64), "record {i}");
    }
}

#[test]
fn append_read_and_reopen() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        let offsets = append_many(&log, 0, 500).await;
        assert_eq!(offsets, (0..500).collect::<Vec<_>>());
        check_payloads(&read_all(&log).await, 500);
        drop(log);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(report.records, 500);
        assert!(report.segments > 1, "the small segments must have rolled");
        assert_eq!(log.end_offset().get(), 500);
        check_payloads(&read_all(&log).await, 500);
        assert_eq!(append_many(&log, 500, 10).await[0], 500);
    });
}

/// What a reader has left to read, across the segments a small log rolled through.
#[test]
fn bytes_from_an_offset_run_to_the_logs_end() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(1), small_config()).await.unwrap();
        assert_eq!(log.bytes_from(Offset::new(0)), 0, "an empty log has nothing to read");
        append_many(&log, 0, 500).await;
        let whole = log.bytes_from(Offset::new(0));
        assert!(whole >= 500 * payload(0).len() as u64, "{whole}");
        // Each append here is a batch of one: the bytes fall by one batch per offset.
        let mut previous = whole;
        for offset in [1, 100, 250, 499] {
            let left = log.bytes_from(Offset::new(offset));
            assert!(left < previous, "{offset}: {left} of {previous}");
            previous = left;
        }
        assert_eq!(log.bytes_from(Offset::new(500)), 0);
        assert_eq!(log.bytes_from(Offset::new(u64::MAX)), 0);
    });
}

#[test]
fn concurrent_appends_share_commits() {
    for_each_seed("concurrent_appends_share_commits", |disk, _seed| async move {
        let (log, _) = open(&disk, &directories(1), LogConfig::default()).await.unwrap();
        let syncs_before = disk.sync_count();
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let log = log.clone();
            tasks.push(crate::runtime::spawn(async move {
                log.append(records_for(&[payload(i)]), 1).await.unwrap().0.get()
            }));
        }
        let mut offsets = Vec::new();
        for task in tasks {
            offsets.push(task.await);
        }
        offsets.sort_unstable();
        assert_eq!(offsets, (0..200).collect::<Vec<_>>());
        let syncs = disk.sync_count() - syncs_before;
        assert!(syncs < 20, "{syncs} syncs for 200 concurrent appends: no group commit");
    });
}

#[test]
fn crash_loses_only_unacknowledged_writes() {
    for mode in [CrashMode::DropUnsynced, CrashMode::TearLastWrite { sectors: 3 }, CrashMode::KeepUnsynced] {
        run(async move {
            let disk = SimDisk::new();
            let dirs = directories(1);
            let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
            let acked = append_many(&log, 0, 300).await;
            // A commit that is written but whose sync fails is never acknowledged.
            disk.fail_nth_sync(1);
            assert!(log.append(records_for(&[payload(999)]), 1).await.is_err());
            drop(log);
            disk.crash(mode);
            dirs.unfence(0);
            let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
            let records = read_all(&log).await;
            assert!(records.len() >= acked.len(), "{mode:?}: lost acknowledged records: {report:?}");
            check_payloads(&records, acked.len());
            let next = log.end_offset();
            log.append(records_for(&[b"after".to_vec()]), 1).await.unwrap();
            drop(log);
            let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
            assert_eq!(log.read(next, 1, usize::MAX).await.unwrap()[0].data, b"after");
        });
    }
}

/// Writes the unsynced `tail` at `end` of a segment's `bytes` as T3's case `case` left it:
/// only a prefix of it reached the disk, or all of it with one bit flipped, or all of it with a
/// zeroed stretch.
fn damage_tail(bytes: &mut [u8], end: usize, tail: &[u8], case: usize) {
    let cut = (case * 61) % tail.len();
    match case % 3 {
        0 => bytes[end..end + cut].copy_from_slice(&tail[..cut]),
        1 => {
            bytes[end..end + tail.len()].copy_from_slice(tail);
            bytes[end + cut] ^= 1 << (case % 8);
        }
        _ => {
            bytes[end..end + tail.len()].copy_from_slice(tail);
            let zero_end = (cut + 700).min(tail.len());
            bytes[end + cut..end + zero_end].fill(0);
        }
    }
}

/// How unsynced writes end at a random power failure: dropped, kept, or the last one torn.
fn random_crash_mode(next: &mut impl FnMut() -> u64) -> CrashMode {
    match next() % 3 {
        0 => CrashMode::DropUnsynced,
        1 => CrashMode::KeepUnsynced,
        _ => CrashMode::TearLastWrite { sectors: (next() % 8) as usize },
    }
}

/// T3: a torn or damaged unsynced tail at many offsets: recovery cuts exactly to the last valid
/// batch, every acknowledged record stays readable, and appends after recovery work and survive
/// another restart.
#[test]
fn torn_tail_at_200_offsets() {
    run(async {
        let dirs = directories(1);
        // Every case replays the same appends, so its synced bytes are identical.
        let end = {
            let disk = SimDisk::new();
            let (log, _) = open(&disk, &dirs, LogConfig::default()).await.unwrap();
            append_many(&log, 0, 20).await;
            let end = log.inner.borrow().segments[0].write_position as usize;
            end
        };
        // The unsynced tail: the one commit in flight when the power failed (the log writes a
        // batch only after the previous one is durable), holding the last two records.
        let mut records = records_for(&[vec![20u8; 3000], vec![21u8; 5000]]);
        record::seal_records(1, &mut records, 20);
        let mut tail = vec![0u8; record::batch_disk_bytes(records.len())];
        write_header(&mut tail, (1, 0, end as u64), 20, 2, records.len());
        tail[record::BATCH_HEADER_BYTES..record::BATCH_HEADER_BYTES + records.len()]
            .copy_from_slice(&records);
        let mut discarded_runs = 0;
        for case in 0..200usize {
            let disk = SimDisk::new();
            let (log, _) = open(&disk, &dirs, LogConfig::default()).await.unwrap();
            append_many(&log, 0, 20).await;
            drop(log);
            let mut bytes = disk.file_bytes(&segment_path(0, 0)).unwrap();
            damage_tail(&mut bytes, end, &tail, case);
            disk.set_file_bytes(&segment_path(0, 0), bytes);
            let (log, report) =
                open(&disk, &dirs, LogConfig::default()).await.unwrap_or_else(|e| panic!("case {case}: {e}"));
            let records = read_all(&log).await;
            assert!(records.len() >= 20, "case {case}: lost synced records");
            check_payloads(&records, 20);
            for record in &records[20..] {
                assert_eq!(
                    record.data,
                    vec![record.offset.get() as u8; if record.offset.get() == 20 { 3000 } else { 5000 }]
                );
            }
            if report.torn_bytes_discarded > 0 {
                discarded_runs += 1;
            }
            let (offset, _) = log.append(records_for(&[b"after".to_vec()]), 1).await.unwrap();
            drop(log);
            let (log, _) = open(&disk, &dirs, LogConfig::default()).await.unwrap();
            assert_eq!(log.read(offset, 1, usize::MAX).await.unwrap()[0].data, b"after", "case {case}");
        }
        assert!(discarded_runs > 100, "the torn-tail path ran in only {discarded_runs} of 200 cases");
    });
}

/// T4: one flipped bit in the middle of a sealed segment, single copy: never served, never
/// silently truncated, nothing deleted; recovery refuses to start with a report.
#[test]
fn bit_rot_in_the_middle_refuses_to_start_and_deletes_nothing() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 300).await;
        let error = {
            disk.flip_bit(&segment_path(0, 0), 4096 * 3 + 40, 2);
            log.read(Offset::ZERO, usize::MAX, usize::MAX).await.err().unwrap()
        };
        assert!(matches!(error, LogError::DataLoss(_)), "{error:?}");
        assert_eq!(
            log.read(Offset::ZERO, 3, usize::MAX).await.unwrap().len(),
            3,
            "records before the damage are served"
        );
        drop(log);
        let before = disk.file_bytes(&segment_path(0, 0)).unwrap();
        let error = open(&disk, &dirs, small_config()).await.err().unwrap();
        assert!(matches!(error, LogError::Corrupt(_)), "{error:?}");
        assert_eq!(
            disk.file_bytes(&segment_path(0, 0)).unwrap(),
            before,
            "recovery must not touch a corrupt log"
        );
    });
}

#[test]
fn failed_write_or_sync_fences_a_single_copy_log() {
    for fail_sync in [false, true] {
        run(async move {
            let disk = SimDisk::new();
            let dirs = directories(1);
            let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
            append_many(&log, 0, 5).await;
            if fail_sync {
                disk.fail_nth_sync(1);
            } else {
                disk.fail_nth_write(1);
            }
            assert!(matches!(log.append(records_for(&[payload(5)]), 1).await, Err(LogError::Fenced(_))));
            // Fenced for good: the next append fails though the disk would accept it.
            assert!(matches!(log.append(records_for(&[payload(6)]), 1).await, Err(LogError::Fenced(_))));
            assert!(dirs.is_fenced(0));
            assert_eq!(read_all(&log).await.len(), 5);
        });
    }
}

#[test]
fn full_disk_is_resource_exhausted_and_recovers() {
    for_each_seed("full_disk_is_resource_exhausted_and_recovers", |disk, _seed| async move {
        let config = LogConfig { segment_bytes_initial: 8192, segment_bytes_max: 8192, ..small_config() };
        let (log, _) = open(&disk, &directories(1), config).await.unwrap();
        append_many(&log, 0, 2).await;
        disk.set_no_space(true);
        let mut refused = 0;
        for i in 2..10 {
            if matches!(log.append(records_for(&[payload(i)]), 1).await, Err(LogError::NoSpace(_))) {
                refused += 1;
            }
        }
        assert!(refused > 0);
        disk.set_no_space(false);
        let (offset, _) = log.append(records_for(&[b"later".to_vec()]), 1).await.unwrap();
        assert_eq!(log.read(offset, 1, usize::MAX).await.unwrap()[0].data, b"later");
        let records = read_all(&log).await;
        assert!(
            records.windows(2).all(|pair| pair[1].offset == pair[0].offset + 1),
            "no gap where appends were refused"
        );
    });
}

#[test]
fn remove_before_keeps_the_active_segment_and_survives_restart() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 600).await;
        assert!(log.remove_before(Offset::new(550)).await.unwrap() > 0);
        assert!(log.start_offset().get() <= 550);
        assert_eq!(read_all(&log).await.last().unwrap().offset.get(), 599);
        let start = log.start_offset().get();
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(log.end_offset().get(), 600);
        assert_eq!(log.start_offset().get(), start);
    });
}

/// A log that never held anything starts where it is told (a new replica of a leader whose
/// older segments are gone): it appends there, and a crash at any point after brings it back
/// starting there; one that holds records refuses.
#[test]
fn an_untouched_log_starts_at_an_offset_and_recovers_there() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        log.start_at(Offset::new(1000)).await.unwrap();
        assert_eq!(
            (log.start_offset().get(), log.next_offset().get(), log.committed_end().get()),
            (1000, 1000, 1000)
        );
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!((log.start_offset().get(), log.next_offset().get()), (1000, 1000));
        let (offset, _) = log.append(records_for(&[payload(7)]), 1).await.unwrap();
        assert_eq!(offset.get(), 1000);
        assert!(matches!(log.start_at(Offset::new(2000)).await, Err(LogError::Refused(_))));
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!((log.start_offset().get(), log.end_offset().get()), (1000, 1001));
        let records = read_all(&log).await;
        assert_eq!(records.len(), 1);
        assert_eq!((records[0].offset.get(), records[0].data.as_slice()), (1000, payload(7).as_slice()));
    });
}

#[test]
fn a_lost_segment_file_is_detected_not_skipped() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 300).await;
        drop(log);
        disk.set_file_bytes(&segment_path(0, 0), Vec::new());
        crate::storage::Storage::remove_file(&disk, &segment_path(0, 0)).unwrap();
        let error = open(&disk, &dirs, small_config()).await.err().unwrap();
        assert!(
            matches!(&error, LogError::Corrupt(why) if why.contains("missing from every data directory")),
            "{error:?}"
        );
    });
}

/// A new log makes its folders, durably, and no file until its first commit: a topic that
/// never publishes costs no file. The folders survive a power cut right after they are made
/// (on ext4 without a journal, a new directory's name is lost unless its parent is synced).
#[test]
fn a_new_log_has_durable_folders_and_no_files_until_its_first_commit() {
    use crate::storage::Storage;
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(2);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(report.segments, 0);
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        for copy in 0..2 {
            assert!(disk.exists(&folder(copy)), "the folder of copy {copy} was lost");
            assert_eq!(disk.list_dir(&folder(copy)).unwrap(), Vec::<String>::new());
        }
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(disk.list_dir(&folder(0)).unwrap(), Vec::<String>::new(), "reopening made files");
        let acked = append_many(&log, 0, 3).await;
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(report.records, 3, "{report:?}");
        check_payloads(&read_all(&log).await, acked.len());
    });
}

/// A log's first segment is listed by no manifest: its first commit creates one file, and
/// recovery takes a log without a manifest to be that segment alone. A first segment of zeros
/// (a first roll cut short) is removed; one whose data is a torn first write is cut back like
/// any torn tail, and so is a first manifest torn during the second roll; a first segment that
/// does not start as this log's would, or a second segment holding data when no manifest is
/// valid, stops recovery and deletes nothing.
#[test]
fn a_first_segment_is_listed_by_no_manifest_and_recovered_alone() {
    use crate::storage::{Storage, StorageFile};
    run(async {
        let dirs = directories(1);
        // The first commits make one file, the second segment the first manifest.
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(append_many(&log, 0, 3).await, vec![0, 1, 2]);
        assert_eq!(disk.list_dir(&folder(0)).unwrap(), vec![segment_name(0)]);
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!((report.segments, report.records), (1, 3), "{report:?}");
        let acked = 3 + append_many(&log, 3, 400).await.len();
        assert!(log.inner.borrow().segments.len() > 1, "the test wants a second segment");
        assert!(disk.list_dir(&folder(0)).unwrap().iter().any(|name| name.starts_with("manifest")));
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        check_payloads(&read_all(&log).await, acked);
        drop(log);

        // A first roll cut short: zeros, removed.
        let disk = SimDisk::new();
        disk.create_dir_durable(&folder(0)).await.unwrap();
        let file = disk.open(&segment_path(0, 0), true).await.unwrap();
        file.allocate(64 * 1024).await.unwrap();
        file.sync_data().await.unwrap();
        disk.sync_dir(&folder(0)).await.unwrap();
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(report.empty_segments_removed, 1, "{report:?}");
        assert!(!disk.exists(&segment_path(0, 0)));
        assert_eq!(append_many(&log, 0, 2).await, vec![0, 1]);
        drop(log);

        // A torn first write, its header's sector landed and the rest not, or the other way
        // round: cut back like any torn tail, and the log goes on.
        for header_landed in [true, false] {
            let payloads: Vec<Vec<u8>> = (290..300).map(payload).collect();
            torn_first_write_is_cut_back(&dirs, &payloads, |bytes, written| {
                assert!((1024..BLOCK_BYTES).contains(&written), "the test wants one batch of 2-8 sectors");
                match header_landed {
                    true => bytes[512..].fill(0),
                    false => bytes[..512].fill(0),
                }
            })
            .await;
        }

        // A torn first write of several blocks whose whole first block was lost: recovery must
        // look past the zero first block to see that the file holds data (and not refuse it as
        // an unlisted segment), and the log goes on from its start.
        let payloads: Vec<Vec<u8>> = (0..12).map(|index| vec![index as u8 + 1; 1000]).collect();
        torn_first_write_is_cut_back(&dirs, &payloads, |bytes, written| {
            assert!(written > 2 * BLOCK_BYTES, "the test wants one batch of three blocks or more");
            bytes[..BLOCK_BYTES].fill(0);
        })
        .await;

        // Bytes that are no batch of this log where its first write would start: refused, and
        // the report names the file that holds them (here in the second of two directories).
        let disk = SimDisk::new();
        disk.create_dir_durable(&folder(1)).await.unwrap();
        disk.open(&segment_path(1, 0), true).await.unwrap();
        let foreign = vec![7u8; 64 * 1024];
        disk.set_file_bytes(&segment_path(1, 0), foreign.clone());
        let error = open(&disk, &directories(2), small_config()).await.err().unwrap();
        let named = segment_path(1, 0).display().to_string();
        assert!(
            matches!(&error, LogError::Corrupt(why)
                if why.contains("does not start with a batch of this log") && why.contains(&named)),
            "{error:?}"
        );
        assert_eq!(disk.file_bytes(&segment_path(1, 0)), Some(foreign), "recovery changed data");

        // The first manifest torn by a crash during the second roll: the slot holds bytes but
        // no manifest, the new segment only zeros. The first segment alone is the log; the
        // second goes, and the next manifest is written.
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 3).await;
        drop(log);
        let slot = folder(0).join(manifest::MANIFEST_SLOTS[1]);
        disk.open(&slot, true).await.unwrap();
        disk.set_file_bytes(&slot, [vec![9u8; 512], vec![0u8; 3584]].concat());
        let second = disk.open(&segment_path(0, 3), true).await.unwrap();
        second.allocate(128 * 1024).await.unwrap();
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!((report.records, report.empty_segments_removed), (3, 1), "{report:?}");
        assert!(!disk.exists(&segment_path(0, 3)));
        assert_eq!(append_many(&log, 3, 2).await, vec![3, 4]);
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        check_payloads(&read_all(&log).await, 5);
        drop(log);

        // Damage in the slots and a second segment holding data: nothing says what the log
        // was, so recovery stops and deletes nothing.
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 400).await;
        assert!(log.inner.borrow().segments.len() > 1, "the test wants a second segment");
        drop(log);
        for slot in manifest::MANIFEST_SLOTS {
            if disk.exists(&folder(0).join(slot)) {
                disk.set_file_bytes(&folder(0).join(slot), vec![9u8; 4096]);
            }
        }
        let before = disk.list_dir(&folder(0)).unwrap();
        let error = open(&disk, &dirs, small_config()).await.err().unwrap();
        assert!(matches!(&error, LogError::Corrupt(why) if why.contains("does not list it")), "{error:?}");
        assert_eq!(disk.list_dir(&folder(0)).unwrap(), before, "recovery deleted files");
    });
}

/// A new log's first write of `payloads`, then `tear` applied to the first segment's bytes (and
/// told how many of them were written), as a crash would leave them: recovery finds no record,
/// and the log goes on from its start, across a restart too.
async fn torn_first_write_is_cut_back(
    dirs: &Rc<Directories>,
    payloads: &[Vec<u8>],
    tear: impl FnOnce(&mut Vec<u8>, usize),
) {
    let disk = SimDisk::new();
    let (log, _) = open(&disk, dirs, small_config()).await.unwrap();
    log.append(records_for(payloads), payloads.len() as u32).await.unwrap();
    drop(log);
    let mut bytes = disk.file_bytes(&segment_path(0, 0)).unwrap();
    let written = bytes.iter().rposition(|byte| *byte != 0).unwrap() + 1;
    tear(&mut bytes, written);
    disk.set_file_bytes(&segment_path(0, 0), bytes);
    let (log, report) = open(&disk, dirs, small_config()).await.unwrap();
    assert_eq!(report.records, 0, "{report:?}");
    assert_eq!(append_many(&log, 0, 2).await, vec![0, 1]);
    drop(log);
    let (log, _) = open(&disk, dirs, small_config()).await.unwrap();
    check_payloads(&read_all(&log).await, 2);
}

fn copy_bytes(disk: &SimDisk, copy: usize, base: u64) -> Vec<u8> {
    disk.file_bytes(&segment_path(copy, base)).unwrap()
}

/// T5: bit rot in a sealed record of one copy is never served: reads come from another copy
/// and the bad copy is repaired.
#[test]
fn rot_in_one_of_three_copies_is_repaired_on_read() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 200).await;
        disk.flip_bit(&segment_path(0, 0), 4096 * 4 + 50, 3);
        check_payloads(&read_all(&log).await, 200);
        assert!(dirs.repairs() >= 1);
        assert_eq!(copy_bytes(&disk, 0, 0), copy_bytes(&disk, 1, 0), "copy 0 was repaired from a good copy");
        // The same damage found at recovery instead.
        disk.flip_bit(&segment_path(2, 0), 4096 * 7 + 60, 1);
        drop(log);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(report.batches_repaired, 1, "{report:?}");
        check_payloads(&read_all(&log).await, 200);
        assert_eq!(copy_bytes(&disk, 2, 0), copy_bytes(&disk, 1, 0));
    });
}

/// T5: a misdirected write and a lost write on one copy each: the checksums, which cover the
/// position, catch both, and recovery repairs them from the other copies.
#[test]
fn misdirected_and_lost_writes_are_caught_and_repaired() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 5).await;
        disk.misdirect_next_write_under(&folder(1), 1);
        append_many(&log, 5, 1).await;
        disk.lose_next_write_under(&folder(2));
        append_many(&log, 6, 10).await;
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert!(report.batches_repaired >= 2, "{report:?}");
        check_payloads(&read_all(&log).await, 16);
        assert_eq!(copy_bytes(&disk, 1, 0), copy_bytes(&disk, 0, 0));
        assert_eq!(copy_bytes(&disk, 2, 0), copy_bytes(&disk, 0, 0));
    });
}

/// T6: one of three directories fails every write: publishes go on with two, that directory is
/// fenced; a second failing directory stops acknowledgements (Unavailable) and acknowledges
/// nothing; after the disks are replaced recovery rebuilds every copy.
#[test]
fn failing_directories_fence_and_quorum_stops_acks() {
    for_each_seed("failing_directories_fence_and_quorum_stops_acks", |disk, _seed| async move {
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 10).await;
        disk.fail_writes_under(Path::new("/d1"), true);
        let acked = append_many(&log, 10, 200).await;
        assert_eq!(acked.len(), 200, "publishes keep succeeding with 2 of 3 directories");
        assert!(dirs.is_fenced(1) && !dirs.is_fenced(0) && !dirs.is_fenced(2));
        disk.fail_writes_under(Path::new("/d1"), false);
        assert_eq!(
            append_many(&log, 210, 5).await.len(),
            5,
            "a fenced directory is not trusted again on its own"
        );
        assert!(dirs.is_fenced(1));
        disk.fail_writes_under(Path::new("/d2"), true);
        let refused = log.append(records_for(&[payload(215)]), 1).await;
        assert!(matches!(refused, Err(LogError::Fenced(_))), "{refused:?}");
        assert_eq!(log.end_offset().get(), 215, "nothing acknowledged without a quorum");
        check_payloads(&read_all(&log).await, 215);
        drop(log);
        // Replace the failed disks: clear the faults, restart; recovery repairs both copies.
        disk.fail_writes_under(Path::new("/d2"), false);
        disk.crash(CrashMode::DropUnsynced);
        let dirs = directories(3);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert!(report.batches_repaired > 0);
        check_payloads(&read_all(&log).await, 215);
        for base in log.inner.borrow().segments.iter().map(|segment| segment.base_offset) {
            assert_eq!(copy_bytes(&disk, 1, base), copy_bytes(&disk, 0, base));
            assert_eq!(copy_bytes(&disk, 2, base), copy_bytes(&disk, 0, base));
        }
    });
}

/// T7: one fdatasync fails on one directory: that copy is fenced and never counted, the commit
/// is still acknowledged by the other two, and nothing acknowledged is lost after a crash.
#[test]
fn a_failed_sync_fences_its_directory_without_losing_acks() {
    for_each_seed("a_failed_sync_fences_its_directory_without_losing_acks", |disk, _seed| async move {
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 10).await;
        disk.fail_next_sync_under(&folder(0));
        append_many(&log, 10, 50).await;
        assert!(dirs.is_fenced(0));
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &directories(3), small_config()).await.unwrap();
        check_payloads(&read_all(&log).await, 60);
    });
}

/// Beyond the fault budget: the same record rotten in every copy is never served, and recovery
/// refuses to start rather than truncate.
#[test]
fn the_same_rot_in_every_copy_is_data_loss_not_garbage() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 50).await;
        for copy in 0..3 {
            disk.flip_bit(&segment_path(copy, 0), 4096 * 5 + 40, 0);
        }
        assert!(matches!(log.read(Offset::ZERO, usize::MAX, usize::MAX).await, Err(LogError::DataLoss(_))));
        drop(log);
        assert!(matches!(open(&disk, &dirs, small_config()).await, Err(LogError::Corrupt(_))));
    });
}

#[test]
fn one_full_directory_of_three_is_fenced_and_publishing_goes_on() {
    for_each_seed("one_full_directory_of_three_is_fenced_and_publishing_goes_on", |disk, _seed| async move {
        let dirs = directories(3);
        let config = LogConfig { segment_bytes_initial: 8192, segment_bytes_max: 8192, ..small_config() };
        let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
        append_many(&log, 0, 2).await;
        disk.no_space_under(Path::new("/d2"), true);
        append_many(&log, 2, 20).await;
        assert!(dirs.is_fenced(2));
        disk.no_space_under(Path::new("/d1"), true);
        let refused = log.append(records_for(&[payload(22)]), 1).await;
        assert!(refused.is_err(), "two full directories of three: no quorum");
    });
}

// ---------------------------------------------------------------------------------------------
// Crash points (T2, T8)
// ---------------------------------------------------------------------------------------------

/// Runs appends (several at once, so commits are shared) until the disk dies; returns the
/// offsets acknowledged.
async fn append_until_power_fails(log: &Log<SimDisk>, first_payload: u64, count: u64) -> Vec<(u64, u64)> {
    let mut tasks = Vec::new();
    for i in first_payload..first_payload + count {
        let log = log.clone();
        tasks.push(crate::runtime::spawn(async move {
            log.append(records_for(&[payload(i)]), 1).await.ok().map(|(o, _)| (o.get(), i))
        }));
    }
    let mut acked = Vec::new();
    for task in tasks {
        if let Some(pair) = task.await {
            acked.push(pair);
        }
    }
    acked
}

fn check_acknowledged(records: &[StoredRecord], acked: &std::collections::BTreeMap<u64, u64>) {
    let by_offset: std::collections::HashMap<u64, &StoredRecord> =
        records.iter().map(|r| (r.offset.get(), r)).collect();
    for (offset, payload_index) in acked {
        let record = by_offset.get(offset).unwrap_or_else(|| panic!("acknowledged offset {offset} lost"));
        assert_eq!(record.data, payload(*payload_index), "offset {offset} holds other bytes");
    }
}

/// T8: the power fails after every single storage operation of a log's life — creating it,
/// filling and rolling segments, deleting old ones — with unsynced writes dropped, kept, or
/// torn. Every crash state must recover, keep every acknowledged record, and accept appends.
#[test]
fn crash_after_every_storage_operation() {
    crash_after_every_storage_operation_of_a_log(false);
}

/// T8 with writes that are durable as they complete (O_DSYNC, as the real storage opens its
/// files): the log skips its fdatasyncs, and every acknowledged record still survives.
#[test]
fn crash_after_every_storage_operation_with_durable_writes() {
    crash_after_every_storage_operation_of_a_log(true);
}

fn crash_after_every_storage_operation_of_a_log(durable_writes: bool) {
    let config =
        || LogConfig { segment_bytes_initial: 16 * 1024, segment_bytes_max: 32 * 1024, ..small_config() };
    // The scenario: create, fill and roll segments in rounds of concurrent appends, delete the
    // oldest segments, append more.
    fn scenario<'a>(log: &'a Log<SimDisk>, acked: &'a mut Acknowledged) -> ScenarioRun<'a> {
        Box::pin(async move {
            for round in 0..8 {
                acked.extend(append_until_power_fails(log, round * 10, 10).await);
            }
            let _ = log.remove_before(Offset::new(40)).await;
            for round in 8..10 {
                acked.extend(append_until_power_fails(log, round * 10, 10).await);
            }
        })
    }
    let total =
        power_fails_after_every_operation(config, 3, durable_writes, scenario, |disk, _, syncs_before| {
            if disk.durable_writes() {
                // Only the rolls sync (allocations, manifests): no commit does.
                assert!(disk.sync_count() - syncs_before < disk.write_count() / 2);
            }
        });
    assert!(total > 80, "the scenario should exercise many operations, got {total}");
}

/// T8 with commits built ahead: group commits of 2 KiB and rounds of 30 concurrent appends, so
/// that the next batch is taken and built while a commit is written, across segment rolls, on
/// three copies, with the power failing after every storage operation.
#[test]
fn crash_after_every_storage_operation_with_commits_built_ahead() {
    let config = || LogConfig {
        segment_bytes_initial: 16 * 1024,
        segment_bytes_max: 16 * 1024,
        group_commit_bytes_max: 2 * 1024,
        ..small_config()
    };
    fn scenario<'a>(log: &'a Log<SimDisk>, acked: &'a mut Acknowledged) -> ScenarioRun<'a> {
        Box::pin(async move {
            for round in 0..6 {
                acked.extend(append_until_power_fails(log, round * 30, 30).await);
            }
        })
    }
    for durable_writes in [true, false] {
        let total = power_fails_after_every_operation(config, 3, durable_writes, scenario, |_, log, _| {
            assert!(log.commits_built_ahead() > 0, "no commit was built ahead");
        });
        assert!(total > 80, "the scenario should exercise many operations, got {total}");
    }
}

/// T8 with writes ahead: a batch's write is issued while the write before it is in flight,
/// and the device may complete the later one first. For each write of a run of concurrent
/// appends in turn, that write is held back until those issued after it have landed, and the
/// power fails just as it would land; recovery must still hold every acknowledged append. A
/// log that acknowledged a batch once its own write was durable, without the batches before
/// it, fails here: recovery stops at the hole the held-back write leaves.
#[test]
fn a_batch_written_ahead_is_acknowledged_only_after_the_batches_before_it() {
    written_ahead_batches_and_held_back_writes(false, 2 * 1024);
    written_ahead_batches_and_held_back_writes(false, 16 * 1024);
}

/// The same in a recycled segment, where the hole a held-back write leaves holds the file's old
/// bytes instead of zeros: the batch after it, written ahead, is told from a valid batch after
/// damage (which refuses to start) by its flag, and discarded.
#[test]
fn a_hole_in_a_recycled_segment_is_not_taken_for_damage() {
    written_ahead_batches_and_held_back_writes(true, 2 * 1024);
}

fn written_ahead_batches_and_held_back_writes(recycled: bool, group_commit_bytes_max: usize) {
    let config = move || LogConfig {
        segment_bytes_initial: 8 * group_commit_bytes_max as u64,
        segment_bytes_max: if recycled { 64 * 1024 } else { 8 * group_commit_bytes_max as u64 },
        group_commit_bytes_max,
        recycle: recycled,
        ..small_config()
    };
    // With `recycled`, the appends go into a recycled segment full of old batches.
    async fn prepare(log: &Log<SimDisk>, recycled: bool) -> u64 {
        let mut next = 0;
        if recycled {
            while log.inner.borrow().segments.last().is_none_or(|segment| segment.capacity < 64 * 1024) {
                append_until_rolled(log, &mut next, 1).await;
            }
            append_until_rolled(log, &mut next, 1).await;
            let closed = log.closed_segments().len();
            log.remove_oldest(closed).await.unwrap();
            append_until_rolled(log, &mut next, 1).await;
            assert!(log.inner.borrow().segments.last().unwrap().recycled);
        }
        next
    }
    // Enough for several commits of the largest size.
    let appends = 30 * group_commit_bytes_max as u64 / 1024;
    for copies in [1, 3] {
        for durable_writes in [true, false] {
            let writes = Rc::new(std::cell::Cell::new(0));
            let counted = writes.clone();
            run(async move {
                let disk = SimDisk::new();
                disk.set_durable_writes(durable_writes);
                let (log, _) = open(&disk, &directories(copies), config()).await.unwrap();
                let first = prepare(&log, recycled).await;
                let before = disk.write_count();
                for append in spawn_appends_from(&log, first, appends) {
                    append.await.1.unwrap();
                }
                counted.set(disk.write_count() - before);
            });
            let out_of_order = Rc::new(std::cell::Cell::new(0));
            for held in 1..=writes.get() {
                let out_of_order = out_of_order.clone();
                run(async move {
                    let disk = SimDisk::new();
                    disk.set_durable_writes(durable_writes);
                    let (log, _) = open(&disk, &directories(copies), config()).await.unwrap();
                    let first = prepare(&log, recycled).await;
                    disk.delay_nth_write(held, std::time::Duration::from_millis(2), true);
                    let mut acked = Acknowledged::new();
                    for append in spawn_appends_from(&log, first, appends) {
                        if let (i, Ok((offset, _))) = append.await {
                            acked.insert(offset.get(), i);
                        }
                    }
                    out_of_order.set(out_of_order.get() + disk.writes_landed_out_of_order());
                    drop(log);
                    disk.crash(CrashMode::DropUnsynced);
                    // A restart: the data directories' health is found anew.
                    let (log, _) =
                        open(&disk, &directories(copies), config()).await.unwrap_or_else(|error| {
                            panic!("write {held} held back, {copies} copies: recovery failed: {error}")
                        });
                    check_acknowledged(&read_all(&log).await, &acked);
                    // A second life: one append, then a commit torn by the next power failure,
                    // at a position before the batch the first crash left written ahead.
                    let (offset, _) = log.append(records_for(&[payload(1000)]), 1).await.unwrap();
                    acked.insert(offset.get(), 1000);
                    disk.die_after(1);
                    let _ = log.append(records_for(&[payload(1001)]), 1).await;
                    drop(log);
                    disk.crash(CrashMode::TearLastWrite { sectors: 1 });
                    let (log, _) =
                        open(&disk, &directories(copies), config()).await.unwrap_or_else(|error| {
                            panic!("write {held} held back, {copies} copies, second crash: recovery failed: {error}")
                        });
                    check_acknowledged(&read_all(&log).await, &acked);
                });
            }
            assert!(
                out_of_order.get() > 0,
                "no write landed before one issued earlier ({copies} copies, durable writes {durable_writes})"
            );
        }
    }
}

/// Group commits of at most 8 KiB, so that a few records of some KiB each make commits of their
/// own, and a first segment of 256 KiB that none of these tests fills.
fn eight_kib_commits_config() -> LogConfig {
    LogConfig { segment_bytes_initial: 256 * 1024, group_commit_bytes_max: 8 * 1024, ..small_config() }
}

/// Spawns appends of one record of each size, together: each above a group commit's room
/// beside the others is a commit of its own, written ahead while the one before is in flight.
fn spawn_sized_appends(
    log: &Log<SimDisk>,
    sizes: &[usize],
) -> Vec<crate::runtime::Task<Result<(Offset, u32), LogError>>> {
    sizes
        .iter()
        .map(|size| {
            let (log, bytes) = (log.clone(), vec![*size as u8; *size]);
            crate::runtime::spawn(async move { log.append(records_for(&[bytes]), 1).await })
        })
        .collect()
}

/// Appends one record of each of two sizes together, the first a commit whose write is held
/// back until the power fails, the second written ahead of it, which lands; then the power
/// fails with unsynced writes dropped. Neither is acknowledged.
async fn lose_a_commit_while_the_next_lands(disk: &SimDisk, log: Log<SimDisk>, sizes: [usize; 2]) {
    let landed_before = disk.writes_landed_out_of_order();
    // Held in real time (glommio's clock): long enough that the second commit is written
    // while it waits even on a loaded machine (at 2 ms, CI beside other tests once missed it).
    disk.delay_nth_write(1, std::time::Duration::from_millis(200), true);
    for append in spawn_sized_appends(&log, &sizes) {
        assert!(append.await.is_err(), "neither is acknowledged");
    }
    assert_eq!(disk.writes_landed_out_of_order(), landed_before + 1);
    drop(log);
    disk.crash(CrashMode::DropUnsynced);
}

/// Recovery after the last crash of a hole test keeps every acknowledged record and nothing
/// else, and the log goes on from there.
async fn recover_only_what_was_acknowledged(disk: &SimDisk, acked: &Acknowledged) {
    let (log, report) = open(disk, &directories(1), eight_kib_commits_config())
        .await
        .unwrap_or_else(|error| panic!("the second recovery failed: {error}"));
    let records = read_all(&log).await;
    check_acknowledged(&records, acked);
    assert_eq!(records.len(), acked.len(), "nothing but what was acknowledged: {report:?}");
    let (offset, _) = log.append(records_for(&[payload(5)]), 1).await.unwrap();
    assert_eq!(offset.get(), acked.len() as u64);
}

/// A power failure loses a commit while the one after it, written ahead, lands, beyond the
/// reach of the recovery that follows (`LogConfig::written_ahead_distance_max`): the log wrote
/// it with a larger group commit than it recovers with, as a build before that recovery looked
/// for such batches would have left it too. Recovery stops at the hole's zeros and leaves the
/// batch on disk. Returns the log after that recovery, with offset 0 acknowledged
/// (`payload(0)`, at byte 0), the hole from byte 4096 (offset 1) and the orphan beyond it at
/// byte 28672, holding offset 2.
async fn leave_a_batch_written_ahead_beyond_a_hole(disk: &SimDisk, acked: &mut Acknowledged) -> Log<SimDisk> {
    disk.set_durable_writes(true);
    let config = LogConfig { group_commit_bytes_max: 28 * 1024, ..eight_kib_commits_config() };
    assert!(config.written_ahead_distance_max() >= 28672 - 4096);
    assert!(eight_kib_commits_config().written_ahead_distance_max() < 28672 - 4096);
    let (log, _) = open(disk, &directories(1), config).await.unwrap();
    let (offset, _) = log.append(records_for(&[payload(0)]), 1).await.unwrap();
    acked.insert(offset.get(), 0);
    lose_a_commit_while_the_next_lands(disk, log, [24_000, 9000]).await;
    let (log, _) = open(disk, &directories(1), eight_kib_commits_config()).await.unwrap();
    assert_eq!(log.end_offset().get(), 1);
    log
}

/// A power failure loses a commit in a fresh segment while the one after it, written ahead,
/// lands: the hole reads as zeros, and recovery, which ends the log there, also finds that
/// batch where it can start and zeroes its header, so that no later life meets it.
#[test]
fn a_batch_written_ahead_beyond_a_hole_of_zeros_is_cleared() {
    run(async {
        let disk = SimDisk::new();
        disk.set_durable_writes(true);
        let (log, _) = open(&disk, &directories(1), eight_kib_commits_config()).await.unwrap();
        log.append(records_for(&[payload(0)]), 1).await.unwrap();
        lose_a_commit_while_the_next_lands(&disk, log, [5000, 5000]).await;
        let orphan_header =
            |disk: &SimDisk| disk.file_bytes(&segment_path(0, 0)).unwrap()[12288..12288 + 64].to_vec();
        assert!(
            orphan_header(&disk).iter().any(|byte| *byte != 0),
            "the batch written ahead landed at 12288"
        );
        let (log, _) = open(&disk, &directories(1), eight_kib_commits_config()).await.unwrap();
        assert_eq!(log.end_offset().get(), 1);
        assert!(orphan_header(&disk).iter().all(|byte| *byte == 0), "its header is zeroed");
    });
}

/// A write of the only copy that reported success and stored nothing leaves zeros in the
/// middle of the log, with acknowledged batches after it: recovery refuses to start, where
/// it used to end the log at the zeros and drop those batches.
#[test]
fn zeros_before_acknowledged_batches_refuse_the_start() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(1), eight_kib_commits_config()).await.unwrap();
        log.append(records_for(&[payload(0)]), 1).await.unwrap();
        disk.lose_next_write_under(Path::new("/d0"));
        for i in 1..4 {
            log.append(records_for(&[payload(i)]), 1).await.unwrap();
        }
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let error = open(&disk, &directories(1), eight_kib_commits_config())
            .await
            .err()
            .expect("the start is refused");
        assert!(error.to_string().contains("zeros in every copy, but a valid batch follows"), "{error}");
    });
}

/// After `leave_a_batch_written_ahead_beyond_a_hole`, the log writes over the hole with smaller
/// commits, reusing the orphan's offsets. When a later power failure tears one of them short of
/// the orphan, recovery finds the orphan after the damage, with offsets the log already holds:
/// a batch of an earlier life, never acknowledged, and no sign of mid-log corruption.
#[test]
fn a_batch_left_written_ahead_by_an_earlier_crash_does_not_stop_a_later_recovery() {
    run(async {
        let disk = SimDisk::new();
        let mut acked = Acknowledged::new();
        let log = leave_a_batch_written_ahead_beyond_a_hole(&disk, &mut acked).await;
        // A small commit takes offset 1 over the hole, and the orphan's offset 2 comes next; the
        // next commit (more than a sector) is torn.
        // (Writes made durable by fdatasync from here, so that the last one can be torn.)
        disk.set_durable_writes(false);
        let (offset, _) = log.append(records_for(&[payload(3)]), 1).await.unwrap();
        acked.insert(offset.get(), 3);
        // Its write lands, its fdatasync does not happen.
        disk.die_after(1);
        assert!(log.append(records_for(&[vec![9u8; 3000]]), 1).await.is_err());
        drop(log);
        disk.crash(CrashMode::TearLastWrite { sectors: 1 });
        recover_only_what_was_acknowledged(&disk, &acked).await;
    });
}

/// The same orphan of an earlier life, now beyond a hole of this life whose commit was torn
/// and whose successor, written ahead, landed: that successor is the last batch of this life
/// in the segment, so it is this crash's orphan and is dropped, not taken for a valid batch
/// after damage.
#[test]
fn a_batch_of_an_earlier_life_does_not_hide_this_crash_orphan() {
    run(async {
        let disk = SimDisk::new();
        let mut acked = Acknowledged::new();
        let log = leave_a_batch_written_ahead_beyond_a_hole(&disk, &mut acked).await;
        let (offset, _) = log.append(records_for(&[payload(3)]), 1).await.unwrap();
        acked.insert(offset.get(), 3);
        // At byte 8192 a commit held back until the power fails, and at 16384 one written
        // ahead, which lands and ends before the earlier life's orphan.
        lose_a_commit_while_the_next_lands(&disk, log, [5000, 5000]).await;
        // The held-back write tore instead of vanishing: its first bytes landed.
        disk.flip_bit(&segment_path(0, 0), 8192 + 8, 0);
        recover_only_what_was_acknowledged(&disk, &acked).await;
    });
}

/// The same orphan of an earlier life, when the log's commits after the hole end exactly where
/// it starts and the next one does not fit the segment: the log rolls, and the orphan stays
/// whole right after the segment's last batch. Every later recovery reads it there; it holds
/// offsets the segment already holds, so it ends the segment, as zeros would.
#[test]
fn a_batch_of_an_earlier_life_at_a_closed_segment_end_ends_it() {
    run(async {
        let disk = SimDisk::new();
        let mut acked = Acknowledged::new();
        let log = leave_a_batch_written_ahead_beyond_a_hole(&disk, &mut acked).await;
        // As large as the lost commit: it ends where the orphan starts.
        let (offset, _) = log.append(records_for(&[vec![7u8; 24_000]]), 1).await.unwrap();
        assert_eq!(offset.get(), 1);
        let (offset, _) = log.append(records_for(&[vec![6u8; 240_000]]), 1).await.unwrap();
        assert_eq!((offset.get(), log.inner.borrow().segments.len()), (2, 2), "the second commit rolled");
        drop(log);
        for restart in 0..2 {
            let (log, report) = open(&disk, &directories(1), eight_kib_commits_config())
                .await
                .unwrap_or_else(|error| panic!("restart {restart}: recovery failed: {error}"));
            assert_eq!(log.end_offset().get(), 3, "{report:?}");
            let records = read_all(&log).await;
            check_acknowledged(&records, &acked);
            assert_eq!((records[1].data.len(), records[2].data.len()), (24_000, 240_000));
        }
    });
}

/// Acknowledged offsets, with the payload index each was appended with.
type Acknowledged = std::collections::BTreeMap<u64, u64>;
type ScenarioRun<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// Runs `scenario` once on a log in `copies` data directories to count its storage operations
/// (`counted` then looks at the disk, the log, and the sync count before the scenario), then
/// once per operation with the power failing after it, with unsynced writes dropped, kept or
/// torn in turn: every crash must recover with every acknowledged record still stored (or
/// deleted by the scenario's retention), and take appends. Returns the operations counted.
fn power_fails_after_every_operation(
    config: fn() -> LogConfig,
    copies: usize,
    durable_writes: bool,
    scenario: for<'a> fn(&'a Log<SimDisk>, &'a mut Acknowledged) -> ScenarioRun<'a>,
    counted: fn(&SimDisk, &Log<SimDisk>, u64),
) -> u64 {
    let modes = [CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::TearLastWrite { sectors: 1 }];
    let total = std::rc::Rc::new(std::cell::Cell::new(0));
    let total_seen = total.clone();
    run(async move {
        let disk = SimDisk::new();
        disk.set_durable_writes(durable_writes);
        let (log, _) = open(&disk, &directories(copies), config()).await.unwrap();
        let syncs_before = disk.sync_count();
        scenario(&log, &mut Acknowledged::new()).await;
        counted(&disk, &log, syncs_before);
        total_seen.set(disk.operation_count());
    });
    let total = total.get();
    for point in 0..=total {
        let mode = modes[(point % 3) as usize];
        run(async move {
            let disk = SimDisk::new();
            disk.set_durable_writes(durable_writes);
            disk.die_after(point);
            let mut acked = Acknowledged::new();
            if let Ok((log, _)) = open(&disk, &directories(copies), config()).await {
                scenario(&log, &mut acked).await;
            }
            disk.crash(mode);
            let (log, _) = open(&disk, &directories(copies), config())
                .await
                .unwrap_or_else(|e| panic!("crash after operation {point} ({mode:?}): recovery failed: {e}"));
            let records = log.read(Offset::ZERO, usize::MAX, usize::MAX).await.unwrap();
            acked.retain(|offset, _| *offset >= log.start_offset().get());
            check_acknowledged(&records, &acked);
            log.append(records_for(&[b"after".to_vec()]), 1).await.unwrap();
        });
    }
    total
}

/// T2: 200 power failures at random moments on one log that lives on across them, with
/// concurrent appends, unsynced writes dropped, kept or torn each time.
#[test]
fn two_hundred_random_power_failures() {
    run(async {
        let disk = SimDisk::new();
        let given: u64 = std::env::var("RINGPOST_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x9E37_79B9_7F4A_7C15);
        // Spread by splitmix64 first: xorshift's first outputs from a small seed are small too,
        // and with some seeds no crash tore a write (the check at the end failed, on any build).
        let mut seed = given.wrapping_add(0x9E37_79B9_7F4A_7C15);
        seed = (seed ^ (seed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        seed = (seed ^ (seed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        seed = (seed ^ (seed >> 31)) | 1;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut acked = std::collections::BTreeMap::new();
        let mut payload_index = 0;
        let mut torn_reports = 0;
        // At least 200 crashes, and on until one has left a torn tail (few do: the power must
        // fail inside a commit's write), so that any seed covers that path.
        let mut crash = 0;
        while crash < 200 || (torn_reports == 0 && crash < 5000) {
            crash += 1;
            let (log, report) = open(&disk, &directories(1), small_config())
                .await
                .unwrap_or_else(|e| panic!("crash {crash}: recovery failed: {e}"));
            if report.torn_bytes_discarded > 0 {
                torn_reports += 1;
            }
            let records = log.read(Offset::ZERO, usize::MAX, usize::MAX).await.unwrap();
            check_acknowledged(&records, &acked);
            disk.die_after(next() % 40 + 1);
            acked.extend(append_until_power_fails(&log, payload_index, 12).await);
            payload_index += 12;
            drop(log);
            disk.crash(random_crash_mode(&mut next));
        }
        assert!(!acked.is_empty());
        assert!(torn_reports > 0, "no crash left a torn tail: the path was never exercised");
    });
}

/// Appends `rounds` times `at_once` payloads from `payload(first)` on, each round's at once
/// (so that they share commits and commits are built ahead); returns (offset, payload index)
/// of each.
async fn append_in_rounds(log: Log<SimDisk>, first: u64, rounds: u64, at_once: u64) -> Vec<(u64, u64)> {
    let mut acked = Vec::new();
    for round in 0..rounds {
        for task in spawn_appends_from(&log, first + round * at_once, at_once) {
            let (i, result) = task.await;
            acked.push((result.unwrap().0.get(), i));
        }
    }
    acked
}

/// An operator brings a fenced directory back while publishing goes on: the stale copy is
/// rewritten from healthy ones, takes writes again, and ends identical to the others. Seeded:
/// the resync races commits in flight, commits built ahead and rolls. Seed 0 showed a batch
/// whose write was in flight (issued to the two other copies) when the resync found nothing
/// left to copy: the copy was declared current without it.
#[test]
fn a_fenced_directory_is_resynced_live() {
    for_each_seed("a_fenced_directory_is_resynced_live", |disk, _seed| async move {
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 20).await;
        disk.fail_writes_under(Path::new("/d2"), true);
        append_many(&log, 20, 300).await;
        assert!(dirs.is_fenced(2) && log.is_stale(2));
        disk.fail_writes_under(Path::new("/d2"), false);
        dirs.unfence(2);
        // Commits that interleave with the resync are caught up too.
        let writer = crate::runtime::spawn(append_in_rounds(log.clone(), 320, 10, 4));
        let copied = log.resync_copy(2).await.unwrap();
        assert!(copied > 0);
        let mut acked: std::collections::BTreeMap<u64, u64> = (0..320).map(|i| (i, i)).collect();
        acked.extend(writer.await);
        assert!(!log.is_stale(2) && !dirs.is_fenced(2));
        assert!(log.inner.borrow().copies.joining.is_none(), "the copy is still joining");
        acked.extend(append_in_rounds(log.clone(), 360, 2, 5).await);
        for base in log.inner.borrow().segments.iter().map(|segment| segment.base_offset) {
            let (resynced, healthy) = (copy_bytes(&disk, 2, base), copy_bytes(&disk, 0, base));
            let block = |bytes: &[u8], block: usize| {
                bytes.get(block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES).map(<[u8]>::to_vec)
            };
            let differs = (0..resynced.len().max(healthy.len()) / BLOCK_BYTES)
                .find(|index| block(&resynced, *index) != block(&healthy, *index));
            assert_eq!(
                differs, None,
                "segment {base}: the resynced copy differs from a healthy one at this block"
            );
        }
        // The resynced copy alone is enough to read everything back.
        drop(log);
        for copy in [0, 1] {
            let folder = PathBuf::from(format!("/d{copy}"));
            crate::storage::Storage::remove_dir_all(&disk, &folder).unwrap();
        }
        let (log, report) = open(&disk, &directories(3), small_config()).await.unwrap();
        assert!(report.batches_repaired > 0);
        let records = read_all(&log).await;
        assert_eq!(records.len(), 370);
        check_acknowledged(&records, &acked);
    });
}

/// A read that fails with EIO in one copy of three during recovery fences that copy, as a
/// failed write or sync does at run time, and the log opens from the two others with every
/// record; every read of recovery is tried as the one that fails. Reads failing in two copies
/// of three refuse the start with DataLoss naming both.
#[test]
fn a_read_failing_in_one_copy_fences_it_and_recovery_goes_on() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(3), small_config()).await.unwrap();
        append_many(&log, 0, 60).await;
        assert!(log.inner.borrow().segments.len() > 1, "the log has rolled");
        drop(log);
        let reads_before = disk.read_count();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        let recovery_reads = disk.read_count() - reads_before;
        drop(log);
        for nth in 1..=recovery_reads {
            disk.fail_nth_read(nth);
            let dirs = directories(3);
            let (log, report) = open(&disk, &dirs, small_config())
                .await
                .unwrap_or_else(|error| panic!("read {nth} of {recovery_reads} failing: {error}"));
            assert_eq!(report.copies_fenced.len(), 1, "read {nth}: {report:?}");
            assert!(dirs.is_fenced(report.copies_fenced[0]) && log.is_stale(report.copies_fenced[0]));
            check_payloads(&read_all(&log).await, 60);
        }
        let every_read_fails = |faulty: &[&str]| crate::storage::sim::FaultPlan {
            faulty: faulty.iter().map(PathBuf::from).collect(),
            read_eio_ppm: 1_000_000,
            ..Default::default()
        };
        disk.set_fault_plan(Some(every_read_fails(&["/d1"])), 1);
        let dirs = directories(3);
        let (log, report) = open(&disk, &dirs, small_config()).await.unwrap();
        assert_eq!(report.copies_fenced, vec![1]);
        append_many(&log, 60, 5).await;
        check_payloads(&read_all(&log).await, 65);
        drop(log);
        disk.set_fault_plan(Some(every_read_fails(&["/d1", "/d2"])), 1);
        match open(&disk, &directories(3), small_config()).await {
            Err(LogError::DataLoss(why)) => assert!(why.contains("/d1") && why.contains("/d2"), "{why}"),
            other => panic!("two failing copies of three: {:?}", other.map(|(_, report)| report)),
        }
        disk.set_fault_plan(None, 0);
        let (log, _) = open(&disk, &directories(3), small_config()).await.unwrap();
        check_payloads(&read_all(&log).await, 65);
    });
}

/// Running out of file descriptors when a segment rolls is a resource limit, not a disk fault:
/// ResourceExhausted, nothing fenced, and appends work again once files free up.
#[test]
fn out_of_file_descriptors_is_resource_exhausted_not_a_fenced_disk() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let config = LogConfig { segment_bytes_initial: 8192, segment_bytes_max: 8192, ..small_config() };
        let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
        append_many(&log, 0, 2).await;
        disk.set_too_many_files(true);
        let refused = log.append(records_for(&[payload(2)]), 1).await;
        assert!(
            matches!(refused, Err(LogError::NoSpace(ref why)) if why.contains("os error 24")),
            "{refused:?}"
        );
        assert!(!dirs.is_fenced(0) && log.is_fenced().is_none());
        disk.set_too_many_files(false);
        append_many(&log, 2, 5).await;
        drop(log);
        let (log, _) = open(&disk, &dirs, config).await.unwrap();
        check_payloads(&read_all(&log).await, 7);
    });
}

/// A log that closes its files after every commit (a journal's setting) reopens them for the
/// next commit, a read, a repair and a resync, and holds no file open in between.
#[test]
fn a_log_that_closes_its_files_reopens_them_on_use() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let config = LogConfig { keep_files_open: false, ..small_config() };
        let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
        append_many(&log, 0, 300).await;
        assert!(log.inner.borrow().segments.iter().all(|segment| segment.files.iter().all(Option::is_none)));
        check_payloads(&read_all(&log).await, 300);
        // Rot in one copy is repaired through reopened files.
        disk.flip_bit(&segment_path(0, 0), 4096 * 2 + 40, 0);
        log.inner.borrow_mut().segments[0].close_files();
        check_payloads(&read_all(&log).await, 300);
        assert!(dirs.repairs() >= 1);
        assert_eq!(copy_bytes(&disk, 0, 0), copy_bytes(&disk, 1, 0), "copy 0 was repaired from a good copy");
        // A fenced directory is resynced through reopened files too.
        disk.fail_writes_under(Path::new("/d2"), true);
        append_many(&log, 300, 50).await;
        disk.fail_writes_under(Path::new("/d2"), false);
        dirs.unfence(2);
        for segment in log.inner.borrow_mut().segments.iter_mut() {
            segment.close_files();
        }
        assert!(log.resync_copy(2).await.unwrap() > 0);
        append_many(&log, 350, 10).await;
        drop(log);
        let (log, _) = open(&disk, &directories(3), config).await.unwrap();
        check_payloads(&read_all(&log).await, 360);
    });
}

/// The tail caches of many logs stay within their shared budget; a log under it keeps its
/// newest batch for readers; an idle log drops everything; a dropped log refunds its bytes.
#[test]
fn tail_caches_share_a_budget_and_idle_logs_empty_theirs() {
    run(async {
        let disk = SimDisk::new();
        let budget = TailCacheBudget::new(5 * 4096);
        let config = LogConfig {
            tail_cache_bytes_max: 1 << 20,
            tail_cache_budget: Some(budget.clone()),
            ..small_config()
        };
        let dirs = directories(1);
        let mut logs = Vec::new();
        for id in 0..8u64 {
            let relative = PathBuf::from(format!("topics/{id}"));
            let (log, _) =
                Log::open(disk.clone(), dirs.clone(), &relative, id, config.clone()).await.unwrap();
            append_many(&log, 0, 3).await;
            assert!(budget.used_bytes() <= 5 * 4096, "{} bytes cached", budget.used_bytes());
            logs.push(log);
        }
        let cached: usize = logs.iter().map(|log| log.tail_cache_bytes()).sum();
        assert_eq!(cached, budget.used_bytes());
        assert!(logs[0].tail_cache_bytes() > 0, "the newest commit is cached while the budget allows");
        assert_eq!(logs[7].tail_cache_bytes(), 0, "with the budget spent, later logs read from disk");
        for log in &logs {
            check_payloads(&read_all(log).await, 3);
            // An extent would not fit what is left of the budget: nothing is read ahead.
            assert_eq!(log.read_ahead_bytes(), 0);
        }
        assert!(budget.used_bytes() <= 5 * 4096);

        let idle = &logs[0];
        for _ in 0..TAIL_CACHE_IDLE_SWEEPS {
            idle.release_idle_cache();
        }
        assert!(idle.tail_cache_bytes() > 0, "not idle long enough yet");
        idle.release_idle_cache();
        assert_eq!(idle.tail_cache_bytes(), 0);
        check_payloads(&read_all(idle).await, 3);

        // The idle log's room goes to the next log that commits.
        append_many(&logs[7], 3, 1).await;
        assert!(logs[7].tail_cache_bytes() > 0);
        let before = budget.used_bytes();
        let dropped = logs.remove(7).tail_cache_bytes();
        assert!(dropped > 0);
        assert_eq!(budget.used_bytes(), before - dropped, "a dropped log gives its bytes back");
    });
}

/// A reader going through the log in order reads each batch from disk once, in extents read
/// ahead of it, rather than the whole batch again for every pull; the extents stay bounded, and
/// go once a sweep finds no reader used them.
#[test]
fn an_ordered_reader_reads_each_batch_once_through_extents_read_ahead() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(1), small_config()).await.unwrap();
        // Batches of 10 records, and pulls of 3: each batch is taken in several pulls.
        for batch in 0..60u64 {
            let payloads: Vec<Vec<u8>> = (batch * 10..batch * 10 + 10).map(payload).collect();
            log.append(records_for(&payloads), 10).await.unwrap();
        }
        let segments = log.closed_segments().len() + 1;
        let reads_before = disk.read_count();
        let mut records = Vec::new();
        for from in (0..600u64).step_by(3) {
            let offsets: Vec<Offset> = (from..from + 3).map(Offset::new).collect();
            records.extend(log.read_offsets(&offsets).await.unwrap());
            let bound = read_ahead::READ_AHEAD_EXTENTS_MAX * small_config().segment_bytes_max as usize;
            assert!(log.read_ahead_bytes() <= bound, "{} bytes read ahead", log.read_ahead_bytes());
        }
        check_payloads(&records, 600);
        // An extent ends where its segment does: one read per segment, not one per pull (200).
        let reads = disk.read_count() - reads_before;
        assert!(reads <= segments as u64, "{reads} reads for {segments} segments");
        assert!(log.read_ahead_bytes() > 0);
        log.release_idle_cache();
        assert!(log.read_ahead_bytes() > 0, "used since the last sweep");
        log.release_idle_cache();
        assert_eq!(log.read_ahead_bytes(), 0);
    });
}

/// Every batch the tail cache holds is read from memory, the oldest as well as the newest: a
/// reader a little behind finds its batches among many small ones without touching the disk.
#[test]
fn every_cached_batch_is_read_from_memory() {
    run(async {
        let disk = SimDisk::new();
        let config = LogConfig { tail_cache_bytes_max: 1 << 20, read_ahead: false, ..small_config() };
        let (log, _) = open(&disk, &directories(1), config).await.unwrap();
        // One record a batch: 200 batches of a block each, all within the cache's bound.
        for offset in 0..200u64 {
            log.append(records_for(&[payload(offset)]), 1).await.unwrap();
        }
        assert!(log.tail_cache_bytes() >= 200 * record::BLOCK_BYTES, "every batch is cached");
        let reads_before = disk.read_count();
        let mut records = Vec::new();
        for offset in 0..200u64 {
            records.extend(log.read_offsets(&[Offset::new(offset)]).await.unwrap());
        }
        check_payloads(&records, 200);
        assert_eq!(disk.read_count(), reads_before, "no cached batch is read from disk");
    });
}

/// A log that does not read ahead (the catalog, journals) still replays in extents at start-up
/// (`read_all`): a few reads instead of one per batch, the same records, nothing kept after.
#[test]
fn a_replay_reads_in_extents_and_keeps_none() {
    run(async {
        let disk = SimDisk::new();
        let config = LogConfig { read_ahead: false, ..small_config() };
        let (log, _) = open(&disk, &directories(1), config.clone()).await.unwrap();
        append_many(&log, 0, 300).await;
        drop(log);
        let (log, _) = open(&disk, &directories(1), config).await.unwrap();
        let segments = log.closed_segments().len() as u64 + 1;
        let reads_before = disk.read_count();
        let replayed = log.read_all(Offset::ZERO).await.unwrap();
        let reads = disk.read_count() - reads_before;
        check_payloads(&replayed, 300);
        // An extent ends where its segment does: one read per segment, not one per batch (300).
        assert!(reads <= segments, "{reads} reads for {segments} segments");
        assert_eq!(log.read_ahead_bytes(), 0, "nothing is kept after the replay");
        let reads_before = disk.read_count();
        assert_eq!(read_all(&log).await.len(), 300);
        assert!(disk.read_count() - reads_before >= 300, "plain reads still go batch by batch");
        assert_eq!(log.read_ahead_bytes(), 0);
    });
}

/// Rot inside an extent read ahead is never served: the extent fails its checks as a whole, the
/// reader falls back to reading the batch copy by copy, and the bad copy is repaired.
#[test]
fn rot_inside_an_extent_is_read_from_another_copy_and_repaired() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        for batch in 0..10u64 {
            let payloads: Vec<Vec<u8>> = (batch * 10..batch * 10 + 10).map(payload).collect();
            log.append(records_for(&payloads), 10).await.unwrap();
        }
        disk.flip_bit(&segment_path(0, 0), 4096 * 5 + 70, 2);
        let mut records = Vec::new();
        for from in (0..100u64).step_by(3) {
            let offsets: Vec<Offset> = (from..(from + 3).min(100)).map(Offset::new).collect();
            records.extend(log.read_offsets(&offsets).await.unwrap());
        }
        check_payloads(&records, 100);
        assert!(dirs.repairs() >= 1);
        assert_eq!(copy_bytes(&disk, 0, 0), copy_bytes(&disk, 1, 0), "copy 0 was repaired from a good copy");
    });
}

/// A log read only at recovery (a journal, the catalog) reads without extents: nothing would
/// sweep them, and they would hold memory and the shard's cache budget for good.
#[test]
fn a_log_without_read_ahead_keeps_no_extents() {
    run(async {
        let disk = SimDisk::new();
        let budget = TailCacheBudget::new(64 << 20);
        let config =
            LogConfig { read_ahead: false, tail_cache_budget: Some(budget.clone()), ..small_config() };
        let (log, _) = open(&disk, &directories(1), config).await.unwrap();
        append_many(&log, 0, 300).await;
        check_payloads(&read_all(&log).await, 300);
        assert_eq!(log.read_ahead_bytes(), 0);
        assert_eq!(budget.used_bytes(), 0);
    });
}

/// A deleted segment larger than a step shrinks in steps before it is unlinked, and the log
/// reopens after a crash as if it had been unlinked at once.
#[test]
fn large_deleted_segments_shrink_in_steps_then_go() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let config = LogConfig {
            segment_bytes_initial: 16 << 20,
            segment_bytes_max: 16 << 20,
            group_commit_bytes_max: 4 << 20,
            staging_bytes_max: 64 << 20,
            ..small_config()
        };
        let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
        let big = vec![7u8; 1 << 20];
        for _ in 0..40 {
            log.append(records_for(std::slice::from_ref(&big)), 1).await.unwrap();
        }
        assert_eq!(log.closed_segments().len(), 2);
        let first_two: Vec<u64> =
            log.closed_segments().iter().map(|segment| segment.base_offset.get()).collect();
        assert_eq!(log.remove_oldest(2).await.unwrap(), 2);
        // 16 MiB each: 12, 8 and 4 MiB, then the unlink.
        assert_eq!(disk.truncation_count(), 6);
        for base in &first_two {
            assert!(disk.file_bytes(&segment_path(0, *base)).is_none(), "segment {base} is gone");
        }
        let start = log.start_offset().get();
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, config).await.unwrap();
        assert_eq!((log.start_offset().get(), log.end_offset().get()), (start, 40));
    });
}

/// Power fails at each storage operation of a stepwise deletion in turn, losing or keeping
/// what was not synced: the log reopens with every acknowledged record at or after its start,
/// and takes appends again.
#[test]
fn power_failing_anywhere_in_a_stepwise_deletion_loses_nothing() {
    let config = || LogConfig {
        segment_bytes_initial: 8 << 20,
        segment_bytes_max: 8 << 20,
        group_commit_bytes_max: 4 << 20,
        staging_bytes_max: 64 << 20,
        ..small_config()
    };
    let big = || vec![3u8; 1 << 20];
    async fn fill(log: &Log<SimDisk>, payload: &[u8]) {
        for _ in 0..20 {
            log.append(records_for(&[payload.to_vec()]), 1).await.unwrap();
        }
    }
    let span = Rc::new(std::cell::Cell::new((0, 0)));
    let measured = span.clone();
    run(async move {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(1), config()).await.unwrap();
        fill(&log, &big()).await;
        assert_eq!(log.closed_segments().len(), 2);
        let before = disk.operation_count();
        log.remove_oldest(2).await.unwrap();
        assert!(disk.truncation_count() > 0, "8 MiB segments shrink in steps");
        measured.set((before, disk.operation_count()));
    });
    let (before, after) = span.get();
    // The manifest, two shrink steps each, two unlinks, the directory sync.
    assert!(after - before >= 6, "the deletion took {} operations", after - before);
    for point in before..=after {
        run(async move {
            let disk = SimDisk::new();
            let (log, _) = open(&disk, &directories(1), config()).await.unwrap();
            fill(&log, &big()).await;
            disk.die_after(point - disk.operation_count());
            let _ = log.remove_oldest(2).await;
            drop(log);
            // A truncation not yet synced may or may not have reached the disk: both.
            let mode = if point % 2 == 0 { CrashMode::DropUnsynced } else { CrashMode::KeepUnsynced };
            disk.crash(mode);
            let (log, _) = open(&disk, &directories(1), config()).await.unwrap_or_else(|e| {
                panic!("power failure at operation {point} ({mode:?}): recovery failed: {e}")
            });
            assert_eq!(log.end_offset().get(), 20);
            let records = log.read(log.start_offset(), usize::MAX, usize::MAX).await.unwrap();
            assert_eq!(
                records.len() as u64,
                20 - log.start_offset().get(),
                "power failure at operation {point}"
            );
            log.append(records_for(&[b"after".to_vec()]), 1).await.unwrap();
        });
    }
}

fn spare_config() -> LogConfig {
    LogConfig {
        segment_bytes_initial: 64 * 1024,
        segment_bytes_max: 128 * 1024,
        group_commit_bytes_max: 8 * 1024,
        prewrite: true,
        ..small_config()
    }
}

/// Appends single 1 KiB records until the log's active segment is at least half full.
async fn fill_past_half(log: &Log<SimDisk>, first: u64) -> u64 {
    let mut next = first;
    loop {
        let half = {
            let inner = log.inner.borrow();
            inner.segments.last().is_some_and(|segment| segment.write_position * 2 >= segment.capacity)
        };
        if half && next > first {
            return next;
        }
        log.append(records_for(&[vec![b'k'; 1024]]), 1).await.unwrap();
        next += 1;
    }
}

/// Gives the background task time to prepare the spare: SimDisk's operations complete at
/// once, so a few milliseconds of pauses are plenty.
async fn spare_ready(log: &Log<SimDisk>) {
    assert!(log.inner.borrow().kept.spare.is_some(), "a spare is being prepared");
    crate::runtime::sleep(std::time::Duration::from_millis(30)).await;
}

/// A log that is half through its segment zero-fills the next one in the background, and the
/// roll renames it into place: the records written into it survive a power failure, and no
/// spare is left behind.
#[test]
fn a_spare_is_zero_filled_ahead_and_becomes_the_next_segment() {
    for_each_seed("a_spare_is_zero_filled_ahead_and_becomes_the_next_segment", |disk, _seed| async move {
        let (log, _) = open(&disk, &directories(2), spare_config()).await.unwrap();
        let appended = fill_past_half(&log, 0).await;
        spare_ready(&log).await;
        for copy in 0..2 {
            let spare = disk.file_bytes(&folder(copy).join(SPARE_NAME)).expect("a spare in every copy");
            assert_eq!(spare.len(), 128 * 1024, "the next segment's size");
            assert!(spare.iter().all(|byte| *byte == 0));
        }
        let writes_before = disk.write_count();
        // Fill the first segment and roll into the spare.
        let mut next = appended;
        while log.inner.borrow().segments.len() < 2 {
            log.append(records_for(&[vec![b'k'; 1024]]), 1).await.unwrap();
            next += 1;
        }
        assert!(disk.write_count() > writes_before);
        let second = log.inner.borrow().segments[1].base_offset;
        assert_eq!(log.inner.borrow().segments[1].capacity, 128 * 1024);
        for copy in 0..2 {
            assert!(!disk.exists(&folder(copy).join(SPARE_NAME)), "the spare was renamed");
            assert!(disk.exists(&segment_path(copy, second)));
        }
        for _ in 0..3 {
            log.append(records_for(&[vec![b'k'; 1024]]), 1).await.unwrap();
            next += 1;
        }
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, report) = open(&disk, &directories(2), spare_config()).await.unwrap();
        assert_eq!(report.empty_segments_removed, 0);
        assert_eq!(log.end_offset().get(), next);
        assert_eq!(log.read(Offset::ZERO, usize::MAX, usize::MAX).await.unwrap().len() as u64, next);
    });
}

/// A spare left by a stop (or a crash after its folder was synced for another file) is removed
/// when the log opens, whatever it holds, and the log goes on to prepare and use a new one.
#[test]
fn a_leftover_spare_is_removed_at_recovery() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(1), spare_config()).await.unwrap();
        let appended = fill_past_half(&log, 0).await;
        spare_ready(&log).await;
        // A stop: the spare's name was never synced, so a crash would take it too.
        drop(log);
        // Not zeros any more: it must not become a segment as it is.
        disk.set_file_bytes(&folder(0).join(SPARE_NAME), vec![7u8; 128 * 1024]);
        let (log, _) = open(&disk, &directories(1), spare_config()).await.unwrap();
        assert!(!disk.exists(&folder(0).join(SPARE_NAME)));
        let mut next = appended;
        while log.inner.borrow().segments.len() < 3 {
            log.append(records_for(&[vec![b'k'; 1024]]), 1).await.unwrap();
            next += 1;
        }
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &directories(1), spare_config()).await.unwrap();
        assert_eq!(log.read(Offset::ZERO, usize::MAX, usize::MAX).await.unwrap().len() as u64, next);
    });
}

/// T8 with spares: the power fails after every storage operation of a log that prepares its
/// segments in the background (creating, zero-filling and renaming spares among its commits),
/// with unsynced writes dropped, kept or torn. Every crash recovers with every acknowledged
/// record.
#[test]
fn crash_after_every_storage_operation_with_spares() {
    crash_after_every_storage_operation_with_spares_and(false);
}

/// The same with writes durable as they complete (O_DSYNC): a renamed spare is opened again as
/// every segment is before commits go into it.
#[test]
fn crash_after_every_storage_operation_with_spares_and_durable_writes() {
    crash_after_every_storage_operation_with_spares_and(true);
}

fn crash_after_every_storage_operation_with_spares_and(durable_writes: bool) {
    let config = || LogConfig {
        segment_bytes_initial: 16 * 1024,
        segment_bytes_max: 32 * 1024,
        group_commit_bytes_max: 4 * 1024,
        prewrite: true,
        ..small_config()
    };
    fn scenario<'a>(log: &'a Log<SimDisk>, acked: &'a mut Acknowledged) -> ScenarioRun<'a> {
        Box::pin(async move {
            for round in 0..20 {
                acked.extend(append_until_power_fails(log, round * 4, 4).await);
                // Time for the spare to be prepared between rounds.
                crate::runtime::sleep(std::time::Duration::from_millis(2)).await;
            }
        })
    }
    power_fails_after_every_operation(config, 2, durable_writes, scenario, |_, log, _| {
        assert!(log.inner.borrow().segments.len() >= 3, "the scenario rolls");
    });
}

/// A shard keeps at most `SPARES_PER_SHARD_MAX` spares (each holds files open): one more log
/// past half its segment gets none until a place is given back, and then gets one at its next
/// commit.
#[test]
fn a_shard_keeps_a_bounded_number_of_spares() {
    for_each_seed("a_shard_keeps_a_bounded_number_of_spares", |disk, _seed| async move {
        let dirs = directories(1);
        let mut logs = Vec::new();
        for index in 0..=SPARES_PER_SHARD_MAX {
            let relative = PathBuf::from(format!("topics/{index}"));
            let (log, _) = Log::open(disk.clone(), dirs.clone(), &relative, index as u64 + 1, spare_config())
                .await
                .unwrap();
            fill_past_half(&log, 0).await;
            logs.push(log);
        }
        let with_spare =
            |logs: &[Log<SimDisk>]| logs.iter().filter(|log| log.inner.borrow().kept.spare.is_some()).count();
        assert_eq!(with_spare(&logs), SPARES_PER_SHARD_MAX);
        let without = logs.iter().position(|log| log.inner.borrow().kept.spare.is_none()).unwrap();
        let with = logs.iter().position(|log| log.inner.borrow().kept.spare.is_some()).unwrap();
        logs[with].discard_spares().await;
        logs[without].append(records_for(&[vec![b'k'; 1024]]), 1).await.unwrap();
        assert!(logs[without].inner.borrow().kept.spare.is_some(), "the place given back is taken");
        assert_eq!(with_spare(&logs), SPARES_PER_SHARD_MAX);
        drop(logs);
        let relative = PathBuf::from("topics/another");
        let (log, _) = Log::open(disk.clone(), dirs.clone(), &relative, 1000, spare_config()).await.unwrap();
        fill_past_half(&log, 0).await;
        assert!(log.inner.borrow().kept.spare.is_some(), "dropped logs give their places back");
    });
}

/// Two shards on one thread (as the whole-node simulation runs them), each with its own
/// `Directories`, keep their spares apart: one shard's logs taking every place leave the other
/// shard's places free.
#[test]
fn shards_on_one_thread_each_have_their_own_spare_places() {
    for_each_seed("shards_on_one_thread_each_have_their_own_spare_places", |disk, _seed| async move {
        let (full, other) = (directories(1), directories(1));
        let mut logs = Vec::new();
        for index in 0..SPARES_PER_SHARD_MAX {
            let relative = PathBuf::from(format!("topics/{index}"));
            let (log, _) = Log::open(disk.clone(), full.clone(), &relative, index as u64 + 1, spare_config())
                .await
                .unwrap();
            fill_past_half(&log, 0).await;
            logs.push(log);
        }
        assert_eq!(full.files_kept(), SPARES_PER_SHARD_MAX, "the first shard took every place");
        let relative = PathBuf::from("other/topics/0");
        let (log, _) = Log::open(disk.clone(), other.clone(), &relative, 1000, spare_config()).await.unwrap();
        fill_past_half(&log, 0).await;
        assert!(log.inner.borrow().kept.spare.is_some(), "the other shard's places are its own");
        assert_eq!(other.files_kept(), 1);
    });
}

/// A discarded spare loses its name at once and is then shrunk in steps, as a deleted segment
/// is, rather than freed whole.
#[test]
fn a_discarded_spare_shrinks_in_steps() {
    run(async {
        let disk = SimDisk::new();
        let config = LogConfig {
            segment_bytes_initial: 8 << 20,
            segment_bytes_max: 16 << 20,
            group_commit_bytes_max: 8 * 1024,
            prewrite: true,
            ..small_config()
        };
        let (log, _) = open(&disk, &directories(1), config).await.unwrap();
        fill_past_half(&log, 0).await;
        spare_ready(&log).await;
        let truncations = disk.truncation_count();
        log.discard_spares().await;
        assert!(!disk.exists(&folder(0).join(SPARE_NAME)));
        crate::runtime::sleep(std::time::Duration::from_millis(50)).await;
        // 16 MiB in 4 MiB steps: three truncations before the file closes.
        assert_eq!(disk.truncation_count() - truncations, 3);
    });
}

/// An append's payload index and its outcome.
type AppendOutcome = (u64, Result<(Offset, u32), LogError>);

/// Spawns `count` appends at once, one payload each, and returns them with their payload index.
fn spawn_appends(log: &Log<SimDisk>, count: u64) -> Vec<crate::runtime::Task<AppendOutcome>> {
    spawn_appends_from(log, 0, count)
}

/// `spawn_appends` of `payload(first)` on.
fn spawn_appends_from(
    log: &Log<SimDisk>,
    first: u64,
    count: u64,
) -> Vec<crate::runtime::Task<AppendOutcome>> {
    (first..first + count)
        .map(|i| {
            let log = log.clone();
            crate::runtime::spawn(async move { (i, log.append(records_for(&[payload(i)]), 1).await) })
        })
        .collect()
}

/// Appends spawned together, many more than one group commit takes: commits are built while
/// the one before is written. Every append gets its own offsets, in one sequence without gaps,
/// each offset holds the bytes of the append that was told it, and all of it survives a crash.
#[test]
fn commits_built_ahead_keep_every_append_where_it_was_acknowledged() {
    for copies in [1, 3] {
        for_each_seed(
            "commits_built_ahead_keep_every_append_where_it_was_acknowledged",
            |disk, _seed| async move {
                let dirs = directories(copies);
                let config = LogConfig { group_commit_bytes_max: 4 * 1024, ..small_config() };
                let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
                let appends = spawn_appends(&log, 400);
                let mut payload_at = std::collections::BTreeMap::new();
                for append in appends {
                    let (i, result) = append.await;
                    let (offset, count) = result.unwrap();
                    assert_eq!(count, 1);
                    assert!(payload_at.insert(offset.get(), i).is_none(), "offset {offset} given twice");
                }
                assert_eq!(payload_at.keys().copied().collect::<Vec<_>>(), (0..400).collect::<Vec<_>>());
                assert!(log.commits_built_ahead() > 0, "no commit was built ahead");
                let check = |records: Vec<StoredRecord>| {
                    assert_eq!(records.len(), 400);
                    for record in records {
                        assert_eq!(
                            record.data,
                            payload(payload_at[&record.offset.get()]),
                            "offset {}",
                            record.offset
                        );
                    }
                };
                check(read_all(&log).await);
                drop(log);
                disk.crash(CrashMode::DropUnsynced);
                let (reopened, _) = open(&disk, &dirs, config).await.unwrap();
                check(read_all(&reopened).await);
            },
        );
    }
}

/// A commit that fails after the next batch was taken ahead hands that batch back: with one
/// copy the log is fenced and every append still waiting fails, none is acknowledged without
/// being durable, and what was acknowledged is read back after a crash.
#[test]
fn a_failed_commit_hands_back_the_batch_taken_ahead() {
    for failing_write in [3, 6, 11] {
        for_each_seed("a_failed_commit_hands_back_the_batch_taken_ahead", |disk, _seed| async move {
            let dirs = directories(1);
            let config = LogConfig { group_commit_bytes_max: 4 * 1024, ..small_config() };
            let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
            disk.fail_nth_write(failing_write);
            let appends = spawn_appends(&log, 300);
            let mut acknowledged = std::collections::BTreeMap::new();
            let mut failed = 0;
            for append in appends {
                match append.await {
                    (i, Ok((offset, _))) => assert!(acknowledged.insert(offset.get(), i).is_none()),
                    (_, Err(LogError::Fenced(_))) => failed += 1,
                    (i, Err(error)) => panic!("append {i}: {error}"),
                }
            }
            assert!(failed > 0, "the failed write fenced the log");
            assert!(!acknowledged.is_empty());
            assert_eq!(
                acknowledged.keys().copied().collect::<Vec<_>>(),
                (0..acknowledged.len() as u64).collect::<Vec<_>>()
            );
            drop(log);
            disk.crash(CrashMode::DropUnsynced);
            let (reopened, _) = open(&disk, &dirs, config).await.unwrap();
            let records = read_all(&reopened).await;
            for (offset, i) in &acknowledged {
                assert_eq!(records[*offset as usize].data, payload(*i), "acknowledged offset {offset}");
            }
        });
    }
}

fn recycle_config() -> LogConfig {
    LogConfig {
        segment_bytes_initial: 32 * 1024,
        segment_bytes_max: 32 * 1024,
        group_commit_bytes_max: 4 * 1024,
        recycle: true,
        ..small_config()
    }
}

/// Appends `payload(next)`, `payload(next + 1)`, ... one at a time until the log has rolled
/// `rolls` times.
async fn append_until_rolled(log: &Log<SimDisk>, next: &mut u64, rolls: usize) {
    let target = log.inner.borrow().segments.len() + rolls;
    while log.inner.borrow().segments.len() < target {
        let (offset, _) = log.append(records_for(&[payload(*next)]), 1).await.unwrap();
        assert_eq!(offset.get(), *next);
        *next += 1;
    }
}

/// Every record from the log's start holds the payload of its offset, up to `end`.
async fn check_from_start(log: &Log<SimDisk>, end: u64) {
    assert_eq!(log.end_offset().get(), end);
    let records = log.read(log.start_offset(), usize::MAX, usize::MAX).await.unwrap();
    assert_eq!(records.len() as u64, end - log.start_offset().get());
    for record in &records {
        assert_eq!(record.data, payload(record.offset.get()), "offset {}", record.offset.get());
    }
}

/// A deleted segment of the largest size is kept under `RECYCLE_NAME` and renamed into place
/// by the next roll; commits overwrite its old batches. Recovery ends each recycled segment
/// where its own batches end (the old ones never validate there), closed ones and the active
/// one alike, reports nothing torn, and appends after it survive another power failure.
#[test]
fn a_deleted_segment_is_recycled_by_the_next_roll() {
    for_each_seed("a_deleted_segment_is_recycled_by_the_next_roll", |disk, _seed| async move {
        let dirs = directories(2);
        let (log, _) = open(&disk, &dirs, recycle_config()).await.unwrap();
        let mut next = 0;
        append_until_rolled(&log, &mut next, 2).await;
        let oldest = log.inner.borrow().segments[0].base_offset;
        log.remove_oldest(1).await.unwrap();
        for copy in 0..2 {
            assert!(!disk.exists(&segment_path(copy, oldest)));
            let kept = disk.file_bytes(&folder(copy).join(RECYCLE_NAME)).expect("kept in every copy");
            assert!(kept.iter().any(|byte| *byte != 0), "it still holds its old batches");
        }
        assert_eq!(log.disk_bytes(), 2 * 32 * 1024, "a segment and the kept file");
        for _ in 0..3 {
            append_until_rolled(&log, &mut next, 1).await;
            assert!(log.inner.borrow().segments.last().unwrap().recycled, "the roll took the kept file");
            for copy in 0..2 {
                assert!(!disk.exists(&folder(copy).join(RECYCLE_NAME)));
            }
            let closed = log.closed_segments().len();
            log.remove_oldest(closed).await.unwrap();
            assert!(log.inner.borrow().kept.recycled.is_some());
        }
        // A few commits into the active recycled segment, then one more roll: a closed recycled
        // segment followed by another one.
        for _ in 0..5 {
            log.append(records_for(&[payload(next)]), 1).await.unwrap();
            next += 1;
        }
        append_until_rolled(&log, &mut next, 1).await;
        for _ in 0..3 {
            log.append(records_for(&[payload(next)]), 1).await.unwrap();
            next += 1;
        }
        assert!(log.inner.borrow().segments.iter().all(|segment| segment.recycled));
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, report) = open(&disk, &dirs, recycle_config()).await.unwrap();
        assert_eq!(report.torn_at, None, "the old bytes after the last batch are not a torn write");
        assert_eq!(report.torn_bytes_discarded, 0);
        assert!(log.inner.borrow().segments.iter().all(|segment| segment.recycled), "the manifest says so");
        check_from_start(&log, next).await;
        for _ in 0..4 {
            log.append(records_for(&[payload(next)]), 1).await.unwrap();
            next += 1;
        }
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, recycle_config()).await.unwrap();
        check_from_start(&log, next).await;
        assert!(!disk.exists(&folder(0).join(RECYCLE_NAME)), "a kept file does not outlive a start");
    });
}

/// Damage in the middle of a recycled segment, in every copy, is refused as in a fresh one:
/// the old bytes that end a recycled segment do not hide it.
#[test]
fn rot_in_a_recycled_segment_still_refuses_to_start() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(2);
        let (log, _) = open(&disk, &dirs, recycle_config()).await.unwrap();
        let mut next = 0;
        append_until_rolled(&log, &mut next, 2).await;
        log.remove_oldest(1).await.unwrap();
        append_until_rolled(&log, &mut next, 1).await;
        for _ in 0..6 {
            log.append(records_for(&[payload(next)]), 1).await.unwrap();
            next += 1;
        }
        let active = log.inner.borrow().segments.last().unwrap().base_offset;
        assert!(log.inner.borrow().segments.last().unwrap().recycled);
        drop(log);
        for copy in 0..2 {
            disk.flip_bit(&segment_path(copy, active), 4096 + 40, 3);
        }
        match open(&disk, &dirs, recycle_config()).await {
            Err(LogError::Corrupt(why)) => assert!(why.contains("mid-log corruption"), "{why}"),
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("rot in the middle of a recycled segment was taken for its end"),
        }
    });
}

/// T8 with recycling: the power fails after every storage operation of a log that deletes its
/// closed segments after each round of appends, keeping one file and renaming it into place at
/// its next roll. Every crash recovers with every acknowledged record not deleted, including a
/// crash between the rename and the manifest that lists it (the file then holds old bytes under
/// an unlisted segment name, and is removed).
#[test]
fn crash_after_every_storage_operation_with_recycled_segments() {
    let config = || LogConfig {
        segment_bytes_initial: 16 * 1024,
        segment_bytes_max: 16 * 1024,
        group_commit_bytes_max: 2 * 1024,
        recycle: true,
        ..small_config()
    };
    fn scenario<'a>(log: &'a Log<SimDisk>, acked: &'a mut Acknowledged) -> ScenarioRun<'a> {
        Box::pin(async move {
            for round in 0..8 {
                acked.extend(append_until_power_fails(log, round * 25, 25).await);
                let closed = log.closed_segments().len();
                let _ = log.remove_oldest(closed).await;
            }
        })
    }
    for durable_writes in [false, true] {
        power_fails_after_every_operation(config, 2, durable_writes, scenario, |_, log, _| {
            let recycled = log.inner.borrow().segments.iter().filter(|segment| segment.recycled).count();
            assert!(recycled > 0 && log.commits_built_ahead() > 0, "the scenario recycles and writes ahead");
        });
    }
}

/// A commit cut short in a recycled segment, whose header landed, is reported as a torn tail
/// (its header names this segment and position, which old bytes never do), and recovery ends
/// the log before it.
#[test]
fn a_torn_commit_in_a_recycled_segment_is_reported() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs, recycle_config()).await.unwrap();
        let mut next = 0;
        append_until_rolled(&log, &mut next, 2).await;
        log.remove_oldest(1).await.unwrap();
        append_until_rolled(&log, &mut next, 1).await;
        let (base, end) = {
            let inner = log.inner.borrow();
            let segment = inner.segments.last().unwrap();
            assert!(segment.recycled);
            (segment.base_offset, segment.write_position)
        };
        drop(log);
        let path = segment_path(0, base);
        let mut bytes = disk.file_bytes(&path).unwrap();
        // Unsealed records: their checksums do not hold, as in a write whose tail never landed.
        let records = records_for(&[payload(next)]);
        let at = end as usize;
        bytes[at + record::BATCH_HEADER_BYTES..at + record::BATCH_HEADER_BYTES + records.len()]
            .copy_from_slice(&records);
        write_header(&mut bytes[at..], (1, base, end), next, 1, records.len());
        disk.set_file_bytes(&path, bytes);
        let (log, report) = open(&disk, &dirs, recycle_config()).await.unwrap();
        assert_eq!(report.torn_at, Some((path, end)));
        assert_eq!(report.torn_bytes_discarded, 4096);
        check_from_start(&log, next).await;
    });
}

/// T2 with recycling: one log lives on across 200 power failures at random moments, with
/// concurrent appends and, between them, the deletion of its closed segments (so that its rolls
/// take recycled files), unsynced writes dropped, kept or torn each time. Every acknowledged
/// record not deleted survives.
#[test]
fn two_hundred_random_power_failures_with_recycled_segments() {
    let config = || LogConfig {
        segment_bytes_initial: 16 * 1024,
        segment_bytes_max: 16 * 1024,
        group_commit_bytes_max: 4 * 1024,
        recycle: true,
        ..small_config()
    };
    run(async move {
        let disk = SimDisk::new();
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut acked = Acknowledged::new();
        let mut payload_index = 0;
        let mut recycled_rolls = 0;
        let mut acknowledged_total = 0;
        for crash in 0..200 {
            let (log, _) = open(&disk, &directories(2), config())
                .await
                .unwrap_or_else(|e| panic!("crash {crash}: recovery failed: {e}"));
            acked.retain(|offset, _| *offset >= log.start_offset().get());
            let records = log.read(log.start_offset(), usize::MAX, usize::MAX).await.unwrap();
            check_acknowledged(&records, &acked);
            disk.die_after(next() % 200 + 1);
            for _ in 0..8 {
                let appended = append_until_power_fails(&log, payload_index, 12).await;
                acknowledged_total += appended.len();
                acked.extend(appended);
                payload_index += 12;
                let closed = log.closed_segments().len();
                let _ = log.remove_oldest(closed).await;
            }
            recycled_rolls += log.inner.borrow().segments.iter().filter(|segment| segment.recycled).count();
            drop(log);
            disk.crash(random_crash_mode(&mut next));
        }
        assert!(acknowledged_total > 1000, "{acknowledged_total} acknowledged");
        assert!(recycled_rolls > 20, "only {recycled_rolls} recycled segments seen");
    });
}

/// T3 in a recycled segment: the unsynced tail is cut, flipped or zeroed at 200 offsets over
/// the old batches of the file's earlier life. Recovery keeps every acknowledged record, serves
/// the tail's records only where they are whole, and appends after it survive a restart.
#[test]
fn torn_tail_at_200_offsets_in_a_recycled_segment() {
    let config = || LogConfig {
        segment_bytes_initial: 64 * 1024,
        segment_bytes_max: 64 * 1024,
        group_commit_bytes_max: 4 * 1024,
        recycle: true,
        ..small_config()
    };
    // The same appends every time: a recycled active segment with five batches of its own.
    async fn prepare(disk: &SimDisk, config: LogConfig) -> (u64, u64, u64) {
        let (log, _) = open(disk, &directories(1), config).await.unwrap();
        let mut next = 0;
        append_until_rolled(&log, &mut next, 2).await;
        log.remove_oldest(1).await.unwrap();
        append_until_rolled(&log, &mut next, 1).await;
        for _ in 0..5 {
            log.append(records_for(&[payload(next)]), 1).await.unwrap();
            next += 1;
        }
        let inner = log.inner.borrow();
        let segment = inner.segments.last().unwrap();
        assert!(segment.recycled);
        (segment.base_offset, segment.write_position, next)
    }
    run(async move {
        let (base, end, next) = prepare(&SimDisk::new(), config()).await;
        let end = end as usize;
        let mut records = records_for(&[vec![20u8; 3000], vec![21u8; 5000]]);
        record::seal_records(1, &mut records, next);
        let mut tail = vec![0u8; record::batch_disk_bytes(records.len())];
        write_header(&mut tail, (1, base, end as u64), next, 2, records.len());
        tail[record::BATCH_HEADER_BYTES..record::BATCH_HEADER_BYTES + records.len()]
            .copy_from_slice(&records);
        let mut reported = 0;
        for case in 0..200usize {
            let disk = SimDisk::new();
            prepare(&disk, config()).await;
            let path = segment_path(0, base);
            let mut bytes = disk.file_bytes(&path).unwrap();
            assert!(bytes[end + tail.len()..].iter().any(|byte| *byte != 0), "old bytes follow");
            damage_tail(&mut bytes, end, &tail, case);
            disk.set_file_bytes(&path, bytes);
            let (log, report) =
                open(&disk, &directories(1), config()).await.unwrap_or_else(|e| panic!("case {case}: {e}"));
            let records = log.read(log.start_offset(), usize::MAX, usize::MAX).await.unwrap();
            let acknowledged = (next - log.start_offset().get()) as usize;
            assert!(records.len() >= acknowledged, "case {case}: lost acknowledged records");
            for record in &records[..acknowledged] {
                assert_eq!(record.data, payload(record.offset.get()), "case {case}");
            }
            for record in &records[acknowledged..] {
                let length = if record.offset.get() == next { 3000 } else { 5000 };
                assert_eq!(record.data, vec![(20 + record.offset.get() - next) as u8; length], "case {case}");
            }
            if report.torn_at.is_some() {
                reported += 1;
            }
            let (offset, _) = log.append(records_for(&[b"after".to_vec()]), 1).await.unwrap();
            drop(log);
            disk.crash(CrashMode::DropUnsynced);
            let (log, _) = open(&disk, &directories(1), config()).await.unwrap();
            assert_eq!(log.read(offset, 1, usize::MAX).await.unwrap()[0].data, b"after", "case {case}");
        }
        assert!(reported > 50, "a torn tail was reported in only {reported} of 200 cases");
    });
}

/// T2 with writes landing out of order: one log lives through many power failures, each during
/// appends of mixed sizes (from a few bytes to several blocks, so that commits split, are
/// written ahead and roll segments), where either one write is held back while later ones land
/// and the power fails before it does (a hole with its successor on disk), or the power fails
/// after a random number of operations; unsynced writes are then dropped, kept or torn. With
/// three copies, one write of one copy is now and then lost (reported done, never stored).
/// With recycling, closed segments are deleted between appends. Every recovery must succeed and
/// keep every acknowledged record not deleted, across lives that build on what earlier crashes
/// left.
#[test]
fn power_failures_with_writes_landing_out_of_order() {
    const SEEDS: u64 = 40;
    const LIVES: usize = 60;
    // One seed alone with RINGPOST_TEST_SEED, to look into a failure.
    let seeds = match std::env::var("RINGPOST_TEST_SEED").ok().and_then(|seed| seed.parse().ok()) {
        Some(seed) => seed..=seed,
        None => 1..=SEEDS,
    };
    for recycle in [false, true] {
        for seed in seeds.clone() {
            run(async move {
                let config = move || LogConfig {
                    segment_bytes_initial: 32 * 1024,
                    segment_bytes_max: 64 * 1024,
                    group_commit_bytes_max: 8 * 1024,
                    recycle,
                    ..small_config()
                };
                let disk = SimDisk::new();
                disk.set_durable_writes(seed % 2 == 0);
                let copies = if seed % 3 == 0 { 3 } else { 1 };
                let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                let mut acked: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
                let mut payload_index = 0u64;
                for life in 0..LIVES {
                    let (log, _) =
                        open(&disk, &directories(copies), config()).await.unwrap_or_else(|error| {
                            panic!("seed {seed}, recycle {recycle}, life {life}: recovery failed: {error}")
                        });
                    acked.retain(|offset, _| *offset >= log.start_offset().get());
                    let records = log.read(log.start_offset(), usize::MAX, usize::MAX).await.unwrap();
                    let stored: std::collections::HashMap<u64, &[u8]> =
                        records.iter().map(|record| (record.offset.get(), &record.data[..])).collect();
                    for (offset, bytes) in &acked {
                        assert_eq!(
                            stored.get(offset).copied(),
                            Some(&bytes[..]),
                            "seed {seed}, recycle {recycle}, life {life}: acknowledged offset {offset}"
                        );
                    }
                    if recycle {
                        let closed = log.closed_segments().len();
                        let _ = log.remove_oldest(closed).await;
                        acked.retain(|offset, _| *offset >= log.start_offset().get());
                    }
                    if copies == 3 && next() % 4 == 0 {
                        disk.lose_next_write_under(Path::new(if next() % 2 == 0 { "/d1" } else { "/d2" }));
                    }
                    if next() % 2 == 0 {
                        disk.delay_nth_write(next() % 4 + 1, std::time::Duration::from_millis(2), true);
                    } else {
                        disk.die_after(next() % 40 + 1);
                    }
                    let appends: Vec<_> = (0..next() % 12 + 2)
                        .map(|_| {
                            let size = match next() % 3 {
                                0 => 20 + next() % 300,
                                1 => 3000 + next() % 3000,
                                _ => 9000 + next() % 11_000,
                            } as usize;
                            let mut bytes = payload(payload_index);
                            payload_index += 1;
                            bytes.resize(size, b'y');
                            let log = log.clone();
                            crate::runtime::spawn(async move {
                                log.append(records_for(&[bytes.clone()]), 1)
                                    .await
                                    .ok()
                                    .map(|(offset, _)| (offset, bytes))
                            })
                        })
                        .collect();
                    for append in appends {
                        if let Some((offset, bytes)) = append.await {
                            acked.insert(offset.get(), bytes);
                        }
                    }
                    drop(log);
                    disk.crash(random_crash_mode(&mut next));
                }
            });
        }
    }
}

/// Appends single records until the log refuses one with `NoSpace`; returns the offsets
/// acknowledged. Panics on any other error, or if the disk never fills.
async fn append_until_full(log: &Log<SimDisk>, from: u64) -> Vec<u64> {
    let mut acked = Vec::new();
    for i in from..from + 100_000 {
        match log.append(records_for(&[payload(i)]), 1).await {
            Ok((offset, _)) => acked.push(offset.get()),
            Err(LogError::NoSpace(_)) => return acked,
            Err(error) => panic!("append {i} failed with {error:?}, not NoSpace"),
        }
    }
    panic!("100,000 appends and the disk is not full");
}

#[test]
fn segments_are_sized_by_the_space_there_is() {
    for_each_seed("segments_are_sized_by_the_space_there_is", |disk, _seed| async move {
        let dirs = directories(1);
        let config =
            LogConfig { segment_bytes_initial: 64 * 1024, segment_bytes_max: 1 << 20, ..small_config() };
        // Room for 64 + 128 + 256 + 512 KiB and the manifest slots, then 232 KiB: doubling
        // would ask for 1 MiB and stop there with a fifth of the disk free.
        let capacity_bytes = 1200 * 1024;
        disk.set_capacity_bytes(Some(capacity_bytes));
        let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
        let acked = append_until_full(&log, 0).await;
        let capacities: Vec<u64> =
            log.inner.borrow().segments.iter().map(|segment| segment.capacity).collect();
        let left = disk.free_bytes_left();
        assert!(
            left < config.segment_bytes_initial,
            "refused with {left} bytes free, room for a segment of the initial size; segments {capacities:?}"
        );
        assert!(
            capacities.windows(2).any(|pair| pair[1] < pair[0]),
            "no segment was made smaller than the one before it: {capacities:?}"
        );
        assert!(
            capacities.iter().all(|bytes| *bytes >= config.segment_bytes_initial),
            "a segment below the initial size: {capacities:?}"
        );
        check_payloads(&read_all(&log).await, acked.len());
        // Once space comes back the log goes on, and everything survives a restart.
        disk.set_capacity_bytes(None);
        let more = append_many(&log, acked.len() as u64, 20).await;
        assert_eq!(more[0], acked.len() as u64, "no gap where appends were refused");
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = open(&disk, &dirs, config).await.unwrap();
        check_payloads(&read_all(&log).await, acked.len() + 20);
    });
}

/// A data directory out of space is noted once as full (logged at ERROR, not per refused
/// append), and as having room again at the next allocation there (logged too).
#[test]
fn a_full_directory_is_noted_once_and_its_room_again() {
    run(async {
        // A directory of its own: the notes are the process's, shared with the other tests.
        let directory = PathBuf::from("/full-directory-noted");
        let dirs = Directories::new(vec![directory.clone()]);
        let disk = SimDisk::new();
        disk.set_capacity_bytes(Some(256 * 1024));
        let (log, _) = Log::open(disk.clone(), dirs, Path::new(RELATIVE), 1, small_config()).await.unwrap();
        assert!(!directories::is_full(&directory));
        let acked = append_until_full(&log, 0).await;
        assert!(directories::is_full(&directory), "refused for want of space, and not noted full");
        for i in 0..10 {
            assert!(matches!(log.append(records_for(&[payload(i)]), 1).await, Err(LogError::NoSpace(_))));
        }
        assert!(directories::is_full(&directory));
        assert_eq!(directories::space_lines(&directory), (1, 0), "one line for eleven refusals");
        disk.set_capacity_bytes(None);
        append_many(&log, acked.len() as u64, 20).await;
        assert!(
            !directories::is_full(&directory),
            "a segment was allocated, and the directory is still noted full"
        );
        assert_eq!(directories::space_lines(&directory), (1, 1), "its return is logged once");
        // Full again within `DISK_FULL_LINE_INTERVAL`: noted, not logged again yet.
        disk.set_capacity_bytes(Some(0));
        append_until_full(&log, 1000).await;
        assert!(directories::is_full(&directory));
        assert_eq!(directories::space_lines(&directory), (1, 1), "a second line within the interval");
    });
}

#[test]
fn spares_are_not_made_on_a_nearly_full_disk() {
    for_each_seed("spares_are_not_made_on_a_nearly_full_disk", |disk, _seed| async move {
        let dirs = directories(1);
        let config = LogConfig {
            segment_bytes_initial: 64 * 1024,
            segment_bytes_max: 1 << 20,
            prewrite: true,
            ..small_config()
        };
        // A spare of 128 KiB needs four times that free.
        disk.set_capacity_bytes(Some(64 * 1024 + 4 * 128 * 1024 - 4096));
        let (log, _) = open(&disk, &dirs, config).await.unwrap();
        // The first segment (16 blocks) over half full, which would start a spare.
        append_many(&log, 0, 10).await;
        crate::runtime::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !disk.exists(&folder(0).join(SPARE_NAME)),
            "a spare was made with {} bytes free",
            disk.free_bytes_left()
        );
    });
}

#[test]
fn a_log_with_a_reserve_commits_on_a_full_disk() {
    for_each_seed("a_log_with_a_reserve_commits_on_a_full_disk", |disk, _seed| async move {
        let dirs = directories(1);
        // A journal's shape: small segments, one block per commit, and a reserve.
        let config = LogConfig {
            segment_bytes_initial: 16 * 1024,
            segment_bytes_max: 16 * 1024,
            reserve: true,
            ..small_config()
        };
        // Made while the log is closed, as for a journal before its first entry (whose folder
        // the forwarder made with its topic's): the log adopts it when it opens.
        disk.create_dir_durable(&folder(0)).await.unwrap();
        make_reserve(&disk, &dirs, Path::new(RELATIVE), config.segment_bytes_initial).await.unwrap();
        let (log, _) = open(&disk, &dirs, config.clone()).await.unwrap();
        assert!(log.has_reserve(), "the log did not adopt the reserve made before it opened");

        // Every allocation fails: the first segment comes from the reserve.
        disk.set_no_space(true);
        let acked = append_until_full(&log, 0).await;
        assert_eq!(acked.len(), 4, "one segment of four one-block commits, from the reserve");
        assert!(!log.has_reserve(), "the roll on a full disk took the reserve");
        assert!(!disk.exists(&folder(0).join(RESERVE_NAME)));
        assert!(
            matches!(log.retake_reserve().await, Err(LogError::NoSpace(_))),
            "a reserve was made on a full disk"
        );

        // Space for a reserve, then none at all (as statvfs tells): the second segment comes
        // from it without trying to allocate, and its manifest goes into a slot whose block
        // was allocated with the reserve.
        disk.set_no_space(false);
        log.retake_reserve().await.unwrap();
        assert!(log.has_reserve());
        disk.set_capacity_bytes(Some(0));
        let more = append_until_full(&log, 4).await;
        assert_eq!(more, vec![4, 5, 6, 7], "the second segment, from the reserve again");
        assert!(!log.has_reserve());

        // Everything acknowledged survives a power failure, and the log goes on once space
        // comes back.
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        disk.set_capacity_bytes(None);
        let (log, report) = open(&disk, &dirs, config).await.unwrap();
        assert_eq!(report.records, 8, "{report:?}");
        check_payloads(&read_all(&log).await, 8);
        append_many(&log, 8, 8).await;
        log.retake_reserve().await.unwrap();
        assert!(log.has_reserve(), "no reserve once space came back");
        check_payloads(&read_all(&log).await, 16);
    });
}

/// The positions' order is asserted in every build: a commit point moved past the durable end
/// (here by hand) stops the log at its next commit rather than serving what is not durable.
#[test]
#[should_panic(expected = "positions out of order")]
fn positions_out_of_order_stop_the_log() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs, small_config()).await.unwrap();
        append_many(&log, 0, 10).await;
        log.inner.borrow_mut().positions.committed_end = 20;
        log.commit_to(Offset::new(10));
    });
}
