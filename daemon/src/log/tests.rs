//! Log tests on SimDisk: commits, crashes that drop unsynced writes, torn tails, bit rot in the
//! middle, failing writes and syncs, a full disk.

use super::*;
use crate::storage::sim::{CrashMode, SimDisk};
use std::path::Path;

fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
    let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap();
    executor.run(future);
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes_initial: 64 * 1024,
        segment_bytes_max: 128 * 1024,
        group_commit_bytes_max: 32 * 1024,
        tail_cache_bytes_max: 0,
        staging_bytes_max: 1 << 20,
    }
}

fn records_for(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for payload in payloads {
        record::encode_record_unsealed(&mut out, 42, payload, &mut std::iter::empty(), "");
    }
    out
}

fn payload(i: u64) -> Vec<u8> {
    format!("message-{i:06}-{}", "x".repeat((i % 300) as usize)).into_bytes()
}

async fn append_many(log: &Log<SimDisk>, from: u64, count: u64) -> Vec<u64> {
    let mut acked = Vec::new();
    for i in from..from + count {
        let (offset, n) = log.append(records_for(&[payload(i)]), 1).await.unwrap();
        assert_eq!(n, 1);
        acked.push(offset);
    }
    acked
}

async fn read_all(log: &Log<SimDisk>) -> Vec<StoredRecord> {
    log.read(0, usize::MAX, usize::MAX).await.unwrap()
}

const DIR: &str = "/data/topics/1";

#[test]
fn append_read_and_reopen() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        let offsets = append_many(&log, 0, 500).await;
        assert_eq!(offsets, (0..500).collect::<Vec<_>>());
        let records = read_all(&log).await;
        assert_eq!(records.len(), 500);
        assert!(records.iter().enumerate().all(|(i, r)| r.data == payload(i as u64)));
        drop(log);
        let (log, report) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        assert_eq!(report.records, 500);
        assert!(report.segments > 1, "the small segments must have rolled");
        assert_eq!(log.end_offset(), 500);
        assert_eq!(read_all(&log).await.len(), 500);
        let more = append_many(&log, 500, 10).await;
        assert_eq!(more[0], 500);
    });
}

#[test]
fn concurrent_appends_share_commits() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, LogConfig::default()).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let log = log.clone();
            tasks.push(glommio::spawn_local(async move {
                log.append(records_for(&[payload(i)]), 1).await.unwrap().0
            }));
        }
        let mut offsets = Vec::new();
        for task in tasks {
            offsets.push(task.await);
        }
        offsets.sort_unstable();
        assert_eq!(offsets, (0..200).collect::<Vec<_>>());
        assert!(disk.sync_count() < 200, "{} syncs for 200 appends: no group commit", disk.sync_count());
    });
}

#[test]
fn crash_loses_only_unacknowledged_writes() {
    for mode in [CrashMode::DropUnsynced, CrashMode::TearLastWrite { sectors: 3 }, CrashMode::KeepUnsynced] {
        run(async move {
            let disk = SimDisk::new();
            let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
            let acked = append_many(&log, 0, 300).await;
            // A commit that is written but whose sync fails is never acknowledged.
            disk.fail_nth_sync(1);
            assert!(log.append(records_for(&[payload(999)]), 1).await.is_err());
            drop(log);
            disk.crash(mode);
            let (log, report) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
            let records = read_all(&log).await;
            assert!(records.len() >= acked.len(), "{mode:?}: lost acknowledged records: {report:?}");
            for (i, record) in records.iter().take(acked.len()).enumerate() {
                assert_eq!(record.data, payload(i as u64));
            }
            // Appends work after recovery and survive another reopen.
            let next = log.end_offset();
            log.append(records_for(&[b"after".to_vec()]), 1).await.unwrap();
            drop(log);
            let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
            assert_eq!(log.read(next, 1, usize::MAX).await.unwrap()[0].data, b"after");
        });
    }
}

#[test]
fn torn_tail_is_cut_and_reported() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, LogConfig::default()).await.unwrap();
        append_many(&log, 0, 20).await;
        let segment = Path::new(DIR).join(segment_name(0));
        let mut bytes = disk.file_bytes(&segment).unwrap();
        let end = log.inner.borrow().segments[0].write_position as usize;
        drop(log);
        // An unacknowledged batch whose first sector reached the disk and the rest did not.
        let mut torn = vec![0u8; 8192];
        let mut records = records_for(&[vec![7u8; 6000]]);
        record::seal_records(1, &mut records, 20);
        record::encode_batch_header(&mut torn, 1, 0, end as u64, 20, 1, records.len() as u32);
        torn[32..32 + 480].copy_from_slice(&records[..480]);
        bytes[end..end + 8192].copy_from_slice(&torn);
        disk.set_file_bytes(&segment, bytes);
        let (log, report) = Log::open(disk.clone(), Path::new(DIR), 1, LogConfig::default()).await.unwrap();
        assert_eq!(report.torn_at.as_ref().map(|(_, at)| *at), Some(end as u64));
        assert_eq!(report.torn_bytes_discarded, 4096);
        assert_eq!(read_all(&log).await.len(), 20);
        assert_eq!(log.end_offset(), 20);
    });
}

#[test]
fn bit_rot_in_the_middle_refuses_to_start_and_deletes_nothing() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        append_many(&log, 0, 300).await;
        drop(log);
        let segment = Path::new(DIR).join(segment_name(0));
        disk.flip_bit(&segment, 4096 * 3 + 40, 2);
        let before = disk.file_bytes(&segment).unwrap();
        let error = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.err().unwrap();
        assert!(matches!(error, LogError::Corrupt(_)), "{error:?}");
        assert_eq!(disk.file_bytes(&segment).unwrap(), before, "recovery must not touch a corrupt log");
    });
}

#[test]
fn rot_in_a_sealed_batch_is_never_served() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        append_many(&log, 0, 50).await;
        let segment = Path::new(DIR).join(segment_name(0));
        disk.flip_bit(&segment, 4096 * 2 + 40, 0);
        let error = log.read(0, usize::MAX, usize::MAX).await.err().unwrap();
        assert!(matches!(error, LogError::DataLoss(_)), "{error:?}");
        // Records before the damaged batch are still served.
        assert_eq!(log.read(0, 2, usize::MAX).await.unwrap().len(), 2);
    });
}

#[test]
fn failed_write_fences_the_log() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        append_many(&log, 0, 5).await;
        disk.fail_nth_write(1);
        assert!(matches!(log.append(records_for(&[payload(5)]), 1).await, Err(LogError::Fenced(_))));
        // Fenced for good: the next append fails even though the disk would accept it.
        assert!(matches!(log.append(records_for(&[payload(6)]), 1).await, Err(LogError::Fenced(_))));
        assert_eq!(read_all(&log).await.len(), 5);
    });
}

#[test]
fn full_disk_is_resource_exhausted_and_recovers() {
    run(async {
        let disk = SimDisk::new();
        let config = LogConfig { segment_bytes_initial: 8192, segment_bytes_max: 8192, ..small_config() };
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, config).await.unwrap();
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
        // Offsets stay dense: no gap where appends were refused.
        let records = read_all(&log).await;
        assert!(records.windows(2).all(|pair| pair[1].offset == pair[0].offset + 1));
    });
}

#[test]
fn segment_created_but_not_synced_in_directory_is_safe() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        let acked = append_many(&log, 0, 400).await;
        drop(log);
        disk.crash(CrashMode::DropUnsynced);
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        assert_eq!(read_all(&log).await.len(), acked.len());
    });
}

#[test]
fn remove_before_keeps_the_active_segment() {
    run(async {
        let disk = SimDisk::new();
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        append_many(&log, 0, 600).await;
        let removed = log.remove_before(550).await.unwrap();
        assert!(removed > 0);
        assert!(log.start_offset() <= 550);
        let records = read_all(&log).await;
        assert_eq!(records.last().unwrap().offset, 599);
        drop(log);
        let (log, _) = Log::open(disk.clone(), Path::new(DIR), 1, small_config()).await.unwrap();
        assert_eq!(log.end_offset(), 600);
    });
}
