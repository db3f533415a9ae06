//! Tests of what a replicated log needs: epochs on batches (and data written before them),
//! a follower's append at a given offset, committed and durable positions apart, and the
//! truncation of an uncommitted tail, crashes during it included.

use super::tests::{directories, for_each_seed, payload, records_for, run, small_config};
use super::*;
use crate::ids::{Epoch, Offset};
use crate::storage::sim::{CrashMode, SimDisk};
use std::path::Path;

const RELATIVE: &str = "topics/1";

async fn open(disk: &SimDisk, dirs: &Rc<Directories>) -> Result<(Log<SimDisk>, RecoveryReport), LogError> {
    Log::open(disk.clone(), dirs.clone(), Path::new(RELATIVE), 1, small_config()).await
}

fn segment_path(copy: usize, base: u64) -> PathBuf {
    PathBuf::from(format!("/d{copy}")).join(RELATIVE).join(segment_name(base))
}

/// Appends records `from..from + count` one batch each, as the leader.
async fn append_each(log: &Log<SimDisk>, from: u64, count: u64) {
    for i in from..from + count {
        let (offset, _) = log.append(records_for(&[payload(i)]), 1).await.unwrap();
        assert_eq!(offset.get(), i);
    }
}

/// The payloads of every committed record, by offset.
async fn committed_payloads(log: &Log<SimDisk>) -> Vec<(u64, Vec<u8>)> {
    let records = log.read(Offset::ZERO, usize::MAX, usize::MAX).await.unwrap();
    records.into_iter().map(|record| (record.offset.get(), record.data)).collect()
}

fn expected(offsets: std::ops::Range<u64>, payload_of: impl Fn(u64) -> Vec<u8>) -> Vec<(u64, Vec<u8>)> {
    offsets.map(|offset| (offset, payload_of(offset))).collect()
}

/// A follower's payload, different from the leader's at the same offset.
fn follower_payload(offset: u64) -> Vec<u8> {
    format!("follower-{offset}").into_bytes()
}

#[test]
fn append_at_takes_the_next_offset_and_refuses_a_gap_an_overlap_or_an_older_epoch() {
    for_each_seed(
        "append_at_takes_the_next_offset_and_refuses_a_gap_an_overlap_or_an_older_epoch",
        |disk, _seed| async move {
            let (log, _) = open(&disk, &directories(1)).await.unwrap();
            append_each(&log, 0, 3).await;
            assert_eq!(log.last_epoch().get(), STANDALONE_EPOCH);
            let two = records_for(&[follower_payload(3), follower_payload(4)]);
            assert_eq!(
                log.append_at(Offset::new(3), Epoch::new(2), two, 2).await.unwrap(),
                (Offset::new(3), 2)
            );
            for (offset, why) in [(4, "an overlap"), (7, "a gap")] {
                let refused = log
                    .append_at(
                        Offset::new(offset),
                        Epoch::new(2),
                        records_for(&[follower_payload(offset)]),
                        1,
                    )
                    .await;
                assert!(matches!(refused, Err(LogError::Refused(_))), "{why}: {refused:?}");
            }
            let older =
                log.append_at(Offset::new(5), Epoch::new(1), records_for(&[follower_payload(5)]), 1).await;
            assert!(matches!(older, Err(LogError::Refused(_))), "an older epoch: {older:?}");
            let none = log
                .append_at(
                    Offset::new(5),
                    Epoch::new(record::EPOCH_NONE),
                    records_for(&[follower_payload(5)]),
                    1,
                )
                .await;
            assert!(matches!(none, Err(LogError::Refused(_))), "epoch 0: {none:?}");
            // The leader's appends are refused while its epoch is behind the log's last batch.
            assert!(matches!(log.append(records_for(&[payload(5)]), 1).await, Err(LogError::Refused(_))));
            assert!(log.set_epoch(Epoch::new(1)).is_err());
            log.set_epoch(Epoch::new(2)).unwrap();
            assert_eq!(log.append(records_for(&[payload(5)]), 1).await.unwrap(), (Offset::new(5), 1));
            assert_eq!(log.next_offset().get(), 6);
            let mut wanted = expected(0..3, payload);
            wanted.extend(expected(3..5, follower_payload));
            wanted.push((5, payload(5)));
            assert_eq!(committed_payloads(&log).await, wanted);
        },
    );
}

#[test]
fn appends_at_queued_together_commit_in_order() {
    // On glommio: the appends must be queued in offset order (a follower's are, by its one
    // stream from the leader), which glommio's first-in first-out run queue gives the tasks
    // spawned here and a seeded executor does not.
    run(async {
        let disk = SimDisk::new();
        let (log, _) = open(&disk, &directories(3)).await.unwrap();
        let tasks: Vec<_> = (0..50u64)
            .map(|offset| {
                let log = log.clone();
                crate::runtime::spawn(async move {
                    log.append_at(
                        Offset::new(offset),
                        Epoch::new(4),
                        records_for(&[follower_payload(offset)]),
                        1,
                    )
                    .await
                    .unwrap()
                })
            })
            .collect();
        for (offset, task) in tasks.into_iter().enumerate() {
            assert_eq!(task.await, (Offset::new(offset as u64), 1));
        }
        assert_eq!(committed_payloads(&log).await, expected(0..50, follower_payload));
    });
}

#[test]
fn the_epoch_is_persisted_and_recovered() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs).await.unwrap();
        append_each(&log, 0, 2).await;
        log.append_at(Offset::new(2), Epoch::new(7), records_for(&[follower_payload(2)]), 1).await.unwrap();
        drop(log);
        let (log, _) = open(&disk, &dirs).await.unwrap();
        assert_eq!(log.last_epoch().get(), 7);
        let epochs: Vec<u64> =
            log.inner.borrow().segments[0].batches.iter().map(|entry| entry.header.epoch).collect();
        assert_eq!(epochs, vec![STANDALONE_EPOCH, STANDALONE_EPOCH, 7]);
        // The leader's appends after the restart keep the newest epoch.
        assert_eq!(log.append(records_for(&[payload(3)]), 1).await.unwrap(), (Offset::new(3), 1));
        assert_eq!(log.inner.borrow().segments[0].batches[3].header.epoch, 7);
    });
}

/// A log written before epochs (batch headers of format 1, written here by the old encoder)
/// opens, reads as epoch 0, and takes appends of the current format after its batches.
#[test]
fn data_written_before_epochs_opens_as_epoch_0() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        drop(open(&disk, &dirs).await.unwrap());
        let capacity = small_config().segment_bytes_initial as usize;
        let mut bytes = vec![0u8; capacity];
        let mut position = 0;
        for batch in 0..10u64 {
            let base = batch * 2;
            let mut records = records_for(&[payload(base), payload(base + 1)]);
            record::seal_records(1, &mut records, base);
            record::encode_batch_header_epochless(
                &mut bytes[position..],
                1,
                0,
                position as u64,
                base,
                2,
                records.len() as u32,
            );
            let at = position + record::BATCH_HEADER_BYTES_EPOCHLESS;
            bytes[at..at + records.len()].copy_from_slice(&records);
            position +=
                record::align_up(record::BATCH_HEADER_BYTES_EPOCHLESS + records.len(), record::BLOCK_BYTES);
        }
        let path = segment_path(0, 0);
        let file = disk.open(&path, true).await.unwrap();
        file.allocate(capacity as u64).await.unwrap();
        disk.sync_dir(path.parent().unwrap()).await.unwrap();
        drop(file);
        disk.set_file_bytes(&path, bytes);
        let (log, report) = open(&disk, &dirs).await.unwrap();
        assert_eq!((report.records, report.batches), (20, 10));
        assert_eq!(log.last_epoch().get(), record::EPOCH_NONE);
        assert_eq!(committed_payloads(&log).await, expected(0..20, payload));
        // New batches follow in the current format, across a roll, and all of it reopens.
        append_each(&log, 20, 40).await;
        assert_eq!(log.last_epoch().get(), STANDALONE_EPOCH);
        drop(log);
        let (log, report) = open(&disk, &dirs).await.unwrap();
        assert_eq!(report.records, 60);
        assert_eq!(committed_payloads(&log).await, expected(0..60, payload));
    });
}

#[test]
fn readers_see_only_what_is_committed() {
    for_each_seed("readers_see_only_what_is_committed", |disk, _seed| async move {
        let (log, _) = open(&disk, &directories(3)).await.unwrap();
        log.set_commit_on_durable(false);
        append_each(&log, 0, 5).await;
        let two = records_for(&[payload(5), payload(6)]);
        log.append(two, 2).await.unwrap();
        assert_eq!((log.committed_end().get(), log.durable_end().get(), log.written_end().get()), (0, 7, 7));
        assert_eq!(log.end_offset().get(), 0);
        assert!(committed_payloads(&log).await.is_empty());
        let (held, covered) =
            log.hold_offsets(&[Offset::new(0), Offset::new(1), Offset::new(2)], usize::MAX).await.unwrap();
        assert!(held.is_empty() && covered == 3, "nothing committed is held");
        assert_eq!(log.offset_at_time(0).await.unwrap(), Offset::ZERO);
        let woken = log.committed();
        log.commit_to(Offset::new(3));
        woken.await;
        assert_eq!(committed_payloads(&log).await, expected(0..3, payload));
        // Into the middle of a batch: only whole batches are committed.
        log.commit_to(Offset::new(6));
        assert_eq!(log.committed_end().get(), 5);
        log.commit_to(Offset::new(2));
        assert_eq!(log.committed_end().get(), 5, "the committed position never goes back");
        log.commit_to(Offset::new(100));
        assert_eq!(log.committed_end().get(), 7, "never past what is durable");
        assert_eq!(committed_payloads(&log).await, expected(0..7, payload));
    });
}

#[test]
fn truncate_after_removes_the_tail_and_appends_continue_there() {
    for_each_seed("truncate_after_removes_the_tail_and_appends_continue_there", |disk, _seed| async move {
        let dirs = directories(3);
        let (log, _) = open(&disk, &dirs).await.unwrap();
        log.set_commit_on_durable(false);
        append_each(&log, 0, 300).await;
        assert!(log.inner.borrow().segments.len() > 2, "the tail spans segments");
        log.commit_to(Offset::new(100));
        for at_or_below_committed in [0, 99] {
            let refused = log.truncate_after(Offset::new(at_or_below_committed)).await;
            assert!(matches!(refused, Err(LogError::Refused(_))), "{refused:?}");
        }
        assert!(
            matches!(log.truncate_after(Offset::new(301)).await, Err(LogError::Refused(_))),
            "past the durable end"
        );
        log.truncate_after(Offset::new(150)).await.unwrap();
        assert_eq!(
            (log.committed_end().get(), log.durable_end().get(), log.next_offset().get()),
            (100, 150, 150)
        );
        for offset in 150..200 {
            log.append_at(Offset::new(offset), Epoch::new(2), records_for(&[follower_payload(offset)]), 1)
                .await
                .unwrap();
        }
        log.commit_to(Offset::new(200));
        let mut wanted = expected(0..150, payload);
        wanted.extend(expected(150..200, follower_payload));
        assert_eq!(committed_payloads(&log).await, wanted);
        drop(log);
        let (log, _) = open(&disk, &dirs).await.unwrap();
        assert_eq!(committed_payloads(&log).await, wanted);
        assert_eq!(log.last_epoch().get(), 2);
        // A truncation inside a batch is refused; at the committed position it is not.
        log.set_commit_on_durable(false);
        log.append_at(Offset::new(200), Epoch::new(2), records_for(&[payload(200), payload(201)]), 2)
            .await
            .unwrap();
        assert!(matches!(log.truncate_after(Offset::new(201)).await, Err(LogError::Refused(_))));
        log.truncate_after(Offset::new(200)).await.unwrap();
        assert_eq!(log.durable_end().get(), 200);
    });
}

#[test]
fn truncate_after_fails_the_appends_still_queued() {
    for_each_seed("truncate_after_fails_the_appends_still_queued", |disk, _seed| async move {
        let (log, _) = open(&disk, &directories(1)).await.unwrap();
        log.set_commit_on_durable(false);
        append_each(&log, 0, 10).await;
        let queued: Vec<_> = (10..40u64)
            .map(|offset| {
                let log = log.clone();
                crate::runtime::spawn(async move { log.append(records_for(&[payload(offset)]), 1).await })
            })
            .collect();
        // Every append is queued (or committed already) before the truncation begins.
        while log.inner.borrow().positions.assigned_end < 40 {
            futures_lite::future::yield_now().await;
        }
        log.truncate_after(Offset::new(5)).await.unwrap();
        for task in queued {
            // Each either committed before the truncation (and went with it) or was refused.
            if let Err(error) = task.await {
                assert!(matches!(error, LogError::Refused(_)), "{error:?}");
            }
        }
        assert_eq!(log.durable_end().get(), 5);
        assert_eq!(log.append(records_for(&[payload(5)]), 1).await.unwrap(), (Offset::new(5), 1));
    });
}

/// A power failure after every storage operation of a truncation: the recovered log either
/// still holds the whole tail (the truncation had not begun to count) or ends at the cut,
/// and a truncation that returned has its cut for good. After a cut, appends of another
/// payload go there and survive the next recovery, with nothing of the old tail.
#[test]
fn a_crash_during_truncation_never_brings_the_removed_tail_back() {
    run(async {
        let mut completed = false;
        for operations in 0..400u64 {
            for mode in
                [CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::TearLastWrite { sectors: 1 }]
            {
                let disk = SimDisk::new();
                let dirs = directories(3);
                let (log, _) = open(&disk, &dirs).await.unwrap();
                log.set_commit_on_durable(false);
                append_each(&log, 0, 120).await;
                log.commit_to(Offset::new(40));
                disk.die_after(operations);
                let truncated = log.truncate_after(Offset::new(60)).await;
                drop(log);
                disk.crash(mode);
                // Fencing is the running process's: the directories start healthy again.
                let dirs = directories(3);
                let (log, _) = open(&disk, &dirs).await.unwrap();
                let end = log.durable_end().get();
                assert!(end == 60 || (end == 120 && truncated.is_err()), "end {end} after {truncated:?}");
                assert_eq!(committed_payloads(&log).await, expected(0..end, payload));
                if end == 60 {
                    for offset in 60..70 {
                        log.append_at(
                            Offset::new(offset),
                            Epoch::new(2),
                            records_for(&[follower_payload(offset)]),
                            1,
                        )
                        .await
                        .unwrap();
                    }
                    drop(log);
                    disk.crash(mode);
                    let (log, _) = open(&disk, &dirs).await.unwrap();
                    let mut wanted = expected(0..60, payload);
                    wanted.extend(expected(60..70, follower_payload));
                    assert_eq!(
                        committed_payloads(&log).await,
                        wanted,
                        "after {operations} operations, {mode:?}"
                    );
                }
                completed = truncated.is_ok();
            }
            if completed {
                return;
            }
        }
        panic!("the truncation never completed");
    });
}

/// A promise (a replica's answer to a fencing round) refuses every later append of an older
/// epoch, the leader's own included, takes the promised epoch and newer ones, answers the
/// log's last epoch and durable end, and a lower promise changes nothing.
#[test]
fn a_promised_epoch_refuses_older_appends_and_takes_newer_ones() {
    for_each_seed("a_promised_epoch_refuses_older_appends_and_takes_newer_ones", |disk, _seed| async move {
        let (log, _) = open(&disk, &directories(3)).await.unwrap();
        log.set_epoch(Epoch::new(2)).unwrap();
        append_each(&log, 0, 4).await;
        assert_eq!(log.promise_epoch(Epoch::new(5)).await.unwrap(), (Epoch::new(2), Offset::new(4)));
        assert_eq!(log.promised_epoch().get(), 5);
        let leader = log.append(records_for(&[payload(4)]), 1).await;
        assert!(matches!(leader, Err(LogError::Refused(_))), "the deposed leader's append: {leader:?}");
        let follower =
            log.append_at(Offset::new(4), Epoch::new(4), records_for(&[follower_payload(4)]), 1).await;
        assert!(matches!(follower, Err(LogError::Refused(_))), "an append of epoch 4: {follower:?}");
        assert!(log.set_epoch(Epoch::new(4)).is_err(), "a leader's epoch below the promise");
        assert_eq!(log.next_offset().get(), 4, "nothing refused took an offset");
        assert_eq!(
            log.promise_epoch(Epoch::new(3)).await.unwrap(),
            (Epoch::new(2), Offset::new(4)),
            "a lower promise answers as it is"
        );
        assert_eq!(log.promised_epoch().get(), 5);
        log.append_at(Offset::new(4), Epoch::new(5), records_for(&[follower_payload(4)]), 1).await.unwrap();
        log.set_epoch(Epoch::new(6)).unwrap();
        append_each(&log, 5, 1).await;
        let mut wanted = expected(0..4, payload);
        wanted.push((4, follower_payload(4)));
        wanted.push((5, payload(5)));
        assert_eq!(committed_payloads(&log).await, wanted);
    });
}

/// Appends queued before a promise are let through and are in its answer, so that a deposed
/// leader can count nothing here that the fencing round did not hear of.
#[test]
fn appends_queued_before_a_promise_are_durable_and_in_its_answer() {
    for_each_seed(
        "appends_queued_before_a_promise_are_durable_and_in_its_answer",
        |disk, _seed| async move {
            let (log, _) = open(&disk, &directories(3)).await.unwrap();
            log.set_epoch(Epoch::new(2)).unwrap();
            // The leader's appends (offsets given as commits take them: the seeded executor runs
            // the tasks in any order).
            let queued: Vec<_> = (0..20u64)
                .map(|index| {
                    let log = log.clone();
                    crate::runtime::spawn(async move { log.append(records_for(&[payload(index)]), 1).await })
                })
                .collect();
            // Every append queued, most not yet durable, before the promise.
            while log.next_offset().get() < 20 {
                crate::runtime::sleep(std::time::Duration::from_micros(10)).await;
            }
            let (last_epoch, durable_end) = log.promise_epoch(Epoch::new(3)).await.unwrap();
            let mut taken = 0;
            for task in queued {
                if task.await.is_ok() {
                    taken += 1;
                }
            }
            assert_eq!(last_epoch, Epoch::new(2));
            assert_eq!(
                (durable_end, taken),
                (Offset::new(20), 20),
                "every append queued before the promise is in its answer"
            );
            let refused = log.append(records_for(&[payload(20)]), 1).await;
            assert!(matches!(refused, Err(LogError::Refused(_))), "after the promise: {refused:?}");
        },
    );
}

/// The promise is durable before it is answered: a crash right after (unsynced writes lost,
/// kept or torn) and a restart keep it.
#[test]
fn a_promise_survives_a_crash_and_a_restart() {
    run(async {
        for mode in
            [CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::TearLastWrite { sectors: 1 }]
        {
            let disk = SimDisk::new();
            let dirs = directories(3);
            let (log, _) = open(&disk, &dirs).await.unwrap();
            log.set_commit_on_durable(false);
            append_each(&log, 0, 3).await;
            log.commit_to(Offset::new(3));
            log.promise_epoch(Epoch::new(9)).await.unwrap();
            drop(log);
            disk.crash(mode);
            let (log, _) = open(&disk, &dirs).await.unwrap();
            log.set_commit_on_durable(false);
            log.commit_to(Offset::new(3));
            assert_eq!(log.promised_epoch().get(), 9, "{mode:?}");
            let older =
                log.append_at(Offset::new(3), Epoch::new(8), records_for(&[follower_payload(3)]), 1).await;
            assert!(matches!(older, Err(LogError::Refused(_))), "{mode:?}: {older:?}");
            // Later manifests (a roll, a truncation) keep it too.
            log.append_at(Offset::new(3), Epoch::new(9), records_for(&[follower_payload(3)]), 1)
                .await
                .unwrap();
            log.truncate_after(Offset::new(3)).await.unwrap();
            drop(log);
            disk.crash(mode);
            let (log, _) = open(&disk, &dirs).await.unwrap();
            assert_eq!(log.promised_epoch().get(), 9, "{mode:?}, after a truncation");
        }
    });
}

/// The epoch history follows the durable batches (across a restart, and a truncation), and the
/// divergence it gives a follower is where the follower's log really parts from its leader's.
#[test]
fn the_epoch_history_follows_the_batches_and_finds_where_two_logs_part() {
    run(async {
        let (leader_disk, follower_disk) = (SimDisk::new(), SimDisk::new());
        let dirs = directories(1);
        let (leader, _) = open(&leader_disk, &dirs).await.unwrap();
        let (follower, _) = open(&follower_disk, &dirs).await.unwrap();
        for log in [&leader, &follower] {
            log.set_commit_on_durable(false);
            log.set_epoch(Epoch::new(2)).unwrap();
            append_each(log, 0, 3).await;
        }
        // The follower took two more records of epoch 2 that the leader of epoch 3 never had.
        follower
            .append_at(
                Offset::new(3),
                Epoch::new(2),
                records_for(&[follower_payload(3), follower_payload(4)]),
                2,
            )
            .await
            .unwrap();
        leader.set_epoch(Epoch::new(3)).unwrap();
        append_each(&leader, 3, 2).await;
        let history = |epochs: &[u64]| crate::replication::EpochHistory::of_epochs(epochs.iter().copied());
        assert_eq!(leader.epoch_history(), history(&[2, 2, 2, 3, 3]));
        assert_eq!(follower.epoch_history(), history(&[2, 2, 2, 2, 2]));
        let cut = crate::replication::divergence(
            &follower.epoch_history(),
            crate::ids::Offset::new(follower.durable_end().get()),
            &leader.epoch_history(),
            crate::ids::Offset::new(leader.durable_end().get()),
        )
        .get();
        assert_eq!(cut, 3);
        follower.truncate_after(Offset::new(cut)).await.unwrap();
        follower
            .append_at(Offset::new(3), Epoch::new(3), records_for(&[payload(3), payload(4)]), 2)
            .await
            .unwrap();
        assert_eq!(follower.epoch_history(), leader.epoch_history());
        drop(follower);
        let (follower, _) = open(&follower_disk, &dirs).await.unwrap();
        assert_eq!(follower.epoch_history(), history(&[2, 2, 2, 3, 3]), "after a restart");
        assert_eq!(committed_payloads(&follower).await, expected(0..5, payload));
    });
}

/// A new leader sends its followers records older leaders wrote, at their own epochs: after a
/// promise of epoch 5 the log takes records of epoch 3 from the leader of epoch 5, and refuses
/// the deposed leader of epoch 3 and a record newer than its sender.
#[test]
fn a_newer_leader_sends_older_records_and_a_deposed_one_is_refused() {
    for_each_seed(
        "a_newer_leader_sends_older_records_and_a_deposed_one_is_refused",
        |disk, _seed| async move {
            let (log, _) = open(&disk, &directories(1)).await.unwrap();
            log.forget_commits();
            log.append_at(Offset::new(0), Epoch::new(3), records_for(&[follower_payload(0)]), 1)
                .await
                .unwrap();
            log.promise_epoch(Epoch::new(5)).await.unwrap();
            let deposed = log
                .append_from_leader(
                    Epoch::new(3),
                    Offset::new(1),
                    Epoch::new(3),
                    records_for(&[follower_payload(1)]),
                    1,
                )
                .await;
            assert!(matches!(deposed, Err(LogError::Refused(_))), "{deposed:?}");
            let ahead = log
                .append_from_leader(
                    Epoch::new(5),
                    Offset::new(1),
                    Epoch::new(6),
                    records_for(&[follower_payload(1)]),
                    1,
                )
                .await;
            assert!(matches!(ahead, Err(LogError::Refused(_))), "{ahead:?}");
            // Two chunks queued in order, without awaiting the first: both commit, in order.
            let chunks = vec![
                log.append_from_leader(
                    Epoch::new(5),
                    Offset::new(1),
                    Epoch::new(3),
                    records_for(&[follower_payload(1), follower_payload(2)]),
                    2,
                ),
                log.append_from_leader(
                    Epoch::new(5),
                    Offset::new(3),
                    Epoch::new(5),
                    records_for(&[follower_payload(3)]),
                    1,
                ),
            ];
            let results = crate::sync::join_all(chunks).await;
            assert_eq!(
                results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
                vec![(Offset::new(1), 2), (Offset::new(3), 1)]
            );
            assert_eq!(log.epoch_history(), crate::replication::EpochHistory::of_epochs([3, 3, 3, 5]));
            // Nothing is committed until a leader says so; then readers see it.
            assert!(committed_payloads(&log).await.is_empty());
            log.commit_to(Offset::new(4));
            assert_eq!(committed_payloads(&log).await, expected(0..4, follower_payload));
        },
    );
}

/// A leader sends what is durable, committed or not; a log whose commits were forgotten (as
/// after a restart) can be cut below what it had counted as committed.
#[test]
fn durable_batches_are_held_past_the_commit_and_forgotten_commits_allow_a_cut() {
    run(async {
        let disk = SimDisk::new();
        let dirs = directories(1);
        let (log, _) = open(&disk, &dirs).await.unwrap();
        log.set_commit_on_durable(false);
        append_each(&log, 0, 10).await;
        log.commit_to(Offset::new(4));
        let batches = log.hold_durable_from(Offset::new(2), usize::MAX).await.unwrap();
        let offsets: Vec<u64> = batches
            .iter()
            .flat_map(|batch| {
                batch.records().unwrap().iter().map(|record| record.offset.get()).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(offsets, (2..10).collect::<Vec<u64>>());
        let bounded = log.hold_durable_from(Offset::new(2), 1).await.unwrap();
        assert_eq!(bounded.len(), 1, "the first batch alone when the bound is small");
        assert!(log.hold_durable_from(Offset::new(10), usize::MAX).await.unwrap().is_empty());
        drop((batches, bounded, log));
        let (log, _) = open(&disk, &dirs).await.unwrap();
        assert_eq!(log.committed_end().get(), 10, "recovery counts everything durable as committed");
        log.forget_commits();
        assert_eq!(log.committed_end().get(), 0);
        log.truncate_after(Offset::new(3)).await.unwrap();
        assert_eq!(log.next_offset().get(), 3);
    });
}

/// A replica a move adds holds nothing, and its leader's log no longer starts at 0: its first
/// sync starts it where the leader's log does, and every later sync (a new leader, the leader
/// after a cut) finds it parting from the leader there, not at 0 below what it counts as
/// committed (it was refused every sync after its first, and never caught up).
#[test]
fn a_replica_started_at_its_leaders_start_takes_every_later_sync() {
    run(async {
        let (leader_disk, follower_disk) = (SimDisk::new(), SimDisk::new());
        let dirs = directories(1);
        let open_both = |disk: &SimDisk| {
            let disk = disk.clone();
            let dirs = dirs.clone();
            async move {
                let messages =
                    Log::open(disk.clone(), dirs.clone(), Path::new("topics/1"), 1, small_config());
                let journal = Log::open(disk, dirs, Path::new("topics/1/journal"), 2, small_config());
                [messages.await.unwrap().0, journal.await.unwrap().0]
            }
        };
        let leader = open_both(&leader_disk).await;
        for log in &leader {
            log.start_at(Offset::new(12)).await.unwrap();
            log.set_epoch(Epoch::new(3)).unwrap();
            append_each(log, 12, 4).await;
        }
        let follower = open_both(&follower_disk).await;
        let tips = [crate::replication::source::tip(&leader[0]), crate::replication::source::tip(&leader[1])];
        for (sync, epoch) in [(1, 4), (2, 4), (3, 5)] {
            let next = crate::replication::source::follow(&follower, Epoch::new(epoch), &tips).await;
            assert_eq!(next.unwrap(), [Offset::new(12); 2], "sync {sync}, from the leader of epoch {epoch}");
        }
        follower[0]
            .append_from_leader(
                Epoch::new(5),
                Offset::new(12),
                Epoch::new(3),
                records_for(&[payload(12), payload(13)]),
                2,
            )
            .await
            .unwrap();
        let next = crate::replication::source::follow(&follower, Epoch::new(5), &tips).await.unwrap();
        assert_eq!(next, [Offset::new(14), Offset::new(12)], "a sync after records came keeps them");
    });
}
