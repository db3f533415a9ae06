//! A data directory that fills up: 25 topics, each with a subscription, take publishes on a
//! 64 MiB ext4 filesystem until `df` shows nothing available and every topic is refused with
//! `ResourceExhausted`. Creating a topic then is `ResourceExhausted` too, and leaves nothing;
//! the daemon restarts on the full disk; acknowledging everything (the way a user frees space)
//! must work there, segment collection must give the space back, and publishing must work again.
//!
//! Needs root and loop devices (CI has both); without them it fails loudly.

use ringpost_client::{block_on, Client, ErrorCode, Message, RetrySettings};
use ringpost_tests::loopfs::LoopFilesystem;
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const FILESYSTEM_MIB: u64 = 64;
const TOPICS: usize = 25;
const MESSAGE_BYTES: usize = 1024;
const MESSAGES_PER_PUBLISH: u64 = 100;
const MIB: u64 = 1 << 20;
/// Refusals in a row after which a topic counts as full: a refused publish makes the shard
/// give up its spare files, so the next one may find room.
const REFUSALS_FULL: u32 = 3;
/// Far more publishes than 64 MiB can hold: the filling loop's bound.
const PUBLISHES_MAX: u64 = 4 * FILESYSTEM_MIB * MIB / (MESSAGES_PER_PUBLISH * MESSAGE_BYTES as u64);
/// Segment collection runs every 5 s: the space must come back well within this.
const SPACE_BACK_WITHIN: Duration = Duration::from_secs(30);
/// What `df` must show available again once everything is acknowledged: room for a segment.
/// Not much more is certain: each topic keeps its active segment (collection deletes closed
/// segments only), and the journals and the catalog take their reserves back first.
const SPACE_BACK_BYTES_MIN: u64 = ROOM_FOR_A_SEGMENT;
/// Publishes topic 0 gets for each one of the others: its segments grow large (doubling up to
/// 64 MiB), as a busy topic's do, and must still shrink to what fits as the disk fills.
const HOT_TOPIC_WEIGHT: usize = 8;
/// `df`'s available space with which no publish may be refused: segments are sized by the space
/// there is, down to 1 MiB, so one always fits in this.
const ROOM_FOR_A_SEGMENT: u64 = 2 * MIB;
/// How often the daemon may log a data directory as full (`DISK_FULL_LINE_INTERVAL`).
const DISK_FULL_LINE_INTERVAL_SECONDS: u64 = 60;

fn payload(sequence: u64) -> Vec<u8> {
    ringpost_tests::payload(sequence, MESSAGE_BYTES)
}

fn messages(first: u64) -> Vec<Message> {
    (first..first + MESSAGES_PER_PUBLISH).map(|sequence| Message::new(payload(sequence))).collect()
}

/// `df`'s "Available" (what an unprivileged user may still allocate) and the blocks free
/// (what root, the daemon here, may still allocate).
fn space(filesystem: &LoopFilesystem) -> (u64, u64) {
    let stats = nix::sys::statvfs::statvfs(filesystem.path()).expect("statvfs of the loop filesystem");
    let block = stats.fragment_size() as u64;
    (stats.blocks_available() as u64 * block, stats.blocks_free() as u64 * block)
}

fn topic_name(index: usize) -> String {
    format!("full-{index:02}")
}

fn subscription_name(index: usize) -> String {
    format!("full-{index:02}-reader")
}

#[test]
fn acknowledgements_free_a_full_disk_and_publishing_resumes() {
    // Declared before the daemon, so that it is unmounted after the daemon is killed.
    let filesystem = LoopFilesystem::create("full-disk", FILESYSTEM_MIB);
    let mut daemon = Daemon::start_with("full-disk", vec![filesystem.path().to_path_buf()], Vec::new());
    // Every failure at once: the test asserts on the daemon's first answer.
    let client: Client = daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE);
    for index in 0..TOPICS {
        create_topic_and_subscription(&client, &topic_name(index), &subscription_name(index), 600);
    }

    // Fill: publishes round-robin (topic 0 HOT_TOPIC_WEIGHT times a round) until every topic is
    // refused REFUSALS_FULL times in a row.
    let started = Instant::now();
    let mut acked: Vec<HashMap<u64, u64>> = vec![HashMap::new(); TOPICS];
    let mut refusals = [0u32; TOPICS];
    let (mut publishes, mut sequence, mut first_refusal) = (0u64, 0u64, None);
    let mut refused_with_room: Vec<(String, u64)> = Vec::new();
    let round: Vec<usize> = std::iter::repeat_n(0, HOT_TOPIC_WEIGHT - 1).chain(0..TOPICS).collect();
    while refusals.iter().any(|refused| *refused < REFUSALS_FULL) {
        assert!(
            publishes < PUBLISHES_MAX,
            "{publishes} publishes and the disk is not full: {:?}",
            space(&filesystem)
        );
        for index in round.iter().copied() {
            if refusals[index] >= REFUSALS_FULL {
                continue;
            }
            publishes += 1;
            match block_on(client.publish(&topic_name(index), messages(sequence))) {
                Ok(ids) => {
                    refusals[index] = 0;
                    for (at, id) in ids.into_iter().enumerate() {
                        acked[index].insert(id, sequence + at as u64);
                    }
                }
                Err(error) => {
                    assert_eq!(
                        error.code(),
                        ErrorCode::ResourceExhausted,
                        "a publish on a filling disk was refused with something else: {error}"
                    );
                    first_refusal.get_or_insert_with(|| {
                        (acked.iter().map(HashMap::len).sum::<usize>(), error.to_string())
                    });
                    let (available, _) = space(&filesystem);
                    if available >= ROOM_FOR_A_SEGMENT {
                        refused_with_room.push((topic_name(index), available));
                    }
                    refusals[index] += 1;
                }
            }
            sequence += MESSAGES_PER_PUBLISH;
        }
    }
    let stored: usize = acked.iter().map(HashMap::len).sum();
    let (available, free) = space(&filesystem);
    let (first_refused_after, first_refusal) = first_refusal.unwrap();
    println!(
        "full after {publishes} publishes ({stored} messages of {MESSAGE_BYTES} bytes acknowledged) in {:?}; first \
         refusal after {first_refused_after} messages: {first_refusal}; df available {available}, free {free}",
        started.elapsed()
    );
    assert_eq!(available, 0, "every topic is refused but df shows {available} bytes available");
    assert!(
        refused_with_room.is_empty(),
        "publishes refused while df showed room for a segment (topic, bytes available): {:?}; the next \
         segment must be sized by the space there is",
        &refused_with_room[..refused_with_room.len().min(10)]
    );
    for (index, messages) in acked.iter().enumerate() {
        assert!(!messages.is_empty(), "topic {} took no publish at all", topic_name(index));
    }

    // The full disk was logged, at ERROR, once (not per refused publish: there were
    // hundreds), or once a minute at most.
    let filling_log = daemon.log();
    let full_lines = filling_log.lines().filter(|line| is_full_line(line)).count() as u64;
    let room_lines = filling_log.lines().filter(|line| line.contains("has room again")).count() as u64;
    println!("while filling: {full_lines} line(s) for the full disk, {room_lines} for its room again");
    assert!(full_lines >= 1, "the data directory filled up and no ERROR line said so");
    let lines_allowed = 1 + started.elapsed().as_secs() / DISK_FULL_LINE_INTERVAL_SECONDS;
    assert!(
        full_lines <= lines_allowed,
        "{full_lines} lines for a full disk in {:?}; at most one a minute",
        started.elapsed()
    );

    // A new topic on the full disk: ResourceExhausted, and nothing of it left behind.
    let refused =
        block_on(client.create_topic("full-extra")).expect_err("a topic was created on a full disk");
    println!("creating a topic on the full disk: {refused}");
    assert_eq!(refused.code(), ErrorCode::ResourceExhausted, "creating a topic on a full disk: {refused}");
    let listed = block_on(client.list_topics()).unwrap();
    assert!(listed.iter().all(|topic| topic.name != "full-extra"), "the refused topic is listed: {listed:?}");
    assert_eq!(
        block_on(client.get_topic("full-extra")).unwrap_err().code(),
        ErrorCode::NotFound,
        "the refused topic half exists"
    );

    // The crumbs no segment fits in go to a filler file, so that not one block is left (not
    // even for root); then a restart on that disk: the daemon starts, and the journals keep
    // their reserves.
    // Only printed: the daemon may have freed blocks since `free` was read.
    let crumbs = free.saturating_sub(filesystem.fill(0));
    let restarted_at = daemon.log().len();
    daemon.restart();
    let client: Client = daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE);
    println!(
        "restarted on the full disk, {crumbs} bytes of crumbs filled: {:?} available/free",
        space(&filesystem)
    );

    // Pull and acknowledge everything, on the full disk: every acknowledgement succeeds.
    let draining = Instant::now();
    let mut acknowledgements = 0;
    for (index, published) in acked.iter().enumerate() {
        let mut delivered: HashMap<u64, Vec<u8>> = HashMap::new();
        loop {
            let batch = block_on(client.pull(&subscription_name(index), 1000, 200)).unwrap_or_else(|error| {
                panic!("pulling {} on a full disk: {error}", subscription_name(index))
            });
            if batch.is_empty() {
                break;
            }
            let ack_ids: Vec<String> = batch.iter().map(|message| message.ack_id.clone()).collect();
            for message in batch {
                delivered.insert(message.message_id, message.data);
            }
            let invalid =
                block_on(client.acknowledge(&subscription_name(index), ack_ids)).unwrap_or_else(|error| {
                    panic!(
                        "acknowledging on {} with the disk full ({:?} available/free) failed: {error}",
                        subscription_name(index),
                        space(&filesystem)
                    )
                });
            assert!(invalid.is_empty(), "acknowledgements refused: {:?}", &invalid[..invalid.len().min(3)]);
            acknowledgements += 1;
        }
        for (id, sequence) in published {
            let data = delivered
                .get(id)
                .unwrap_or_else(|| panic!("message {id} of {} never delivered", topic_name(index)));
            assert!(
                *data == payload(*sequence),
                "message {id} of {} came back with other bytes",
                topic_name(index)
            );
        }
    }
    println!(
        "{acknowledgements} acknowledgement requests on the full disk succeeded in {:?}; {:?} available/free",
        draining.elapsed(),
        space(&filesystem)
    );

    // The space comes back: segment collection deletes what every subscription acknowledged.
    let waiting = Instant::now();
    let mut available = 0;
    while available < SPACE_BACK_BYTES_MIN {
        assert!(
            waiting.elapsed() < SPACE_BACK_WITHIN,
            "{SPACE_BACK_WITHIN:?} after every message was acknowledged, df shows {available} bytes available"
        );
        std::thread::sleep(Duration::from_millis(100));
        available = space(&filesystem).0;
    }
    let space_back_after = waiting.elapsed();
    // And every topic takes publishes again. Each one's active segment is full and was
    // acknowledged whole: its roll into the space that came back lets collection delete it,
    // which makes room for the next topic's roll.
    let mut pending: Vec<usize> = (0..TOPICS).collect();
    let mut refused_again = 0;
    while !pending.is_empty() {
        assert!(
            waiting.elapsed() < SPACE_BACK_WITHIN,
            "{SPACE_BACK_WITHIN:?} after every message was acknowledged, topics {:?} still refuse publishes; \
             space {:?}",
            pending.iter().map(|index| topic_name(*index)).collect::<Vec<_>>(),
            space(&filesystem)
        );
        pending.retain(|index| match block_on(client.publish(&topic_name(*index), messages(sequence))) {
            Ok(_) => false,
            Err(error) => {
                assert_eq!(
                    error.code(),
                    ErrorCode::ResourceExhausted,
                    "publishing after the acknowledgements: {error}"
                );
                refused_again += 1;
                true
            }
        });
        sequence += MESSAGES_PER_PUBLISH;
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    println!(
        "{available} bytes available {space_back_after:?} after the acknowledgements; every topic took a publish \
         again {:?} after them ({refused_again} refused meanwhile); {:?} available/free now",
        waiting.elapsed(),
        space(&filesystem)
    );
    // Nothing of the refused topic came back with the space.
    assert_eq!(block_on(client.get_topic("full-extra")).unwrap_err().code(), ErrorCode::NotFound);
    // Where the restarted daemon found the disk full, it said so, and then that the space
    // came back.
    let log = daemon.log();
    let restarted_log = &log[restarted_at.min(log.len())..];
    let lines: Vec<&str> = restarted_log.lines().collect();
    let last_full = lines.iter().rposition(|line| is_full_line(line));
    let last_room = lines.iter().rposition(|line| line.contains("has room again"));
    println!("after the restart: last full line {last_full:?}, last room line {last_room:?}");
    if refused_again > 0 {
        assert!(
            last_full.is_some(),
            "{refused_again} publishes refused after the restart, and nothing logged"
        );
    }
    if let Some(full) = last_full {
        assert!(
            last_room.is_some_and(|room| room > full),
            "the space came back and no line said so; log since the restart:\n{restarted_log}"
        );
    }
}

/// The daemon's line saying a data directory is full (`log::directories::note_full`).
fn is_full_line(line: &str) -> bool {
    line.contains("ERROR") && line.contains("is full")
}

/// A data directory that fills up is logged once at ERROR, however many publishes are refused,
/// and its return is logged once space comes back (here, a file of someone else's removed).
#[test]
fn a_full_disk_is_logged_once_and_its_return_too() {
    const REFUSALS: u32 = 20;
    let filesystem = LoopFilesystem::create("full-disk-log", 32);
    let daemon = Daemon::start_with(
        "full-disk-log",
        vec![filesystem.path().to_path_buf()],
        vec!["--shards".into(), "1".into()],
    );
    let client: Client = daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE);
    create_topic_and_subscription(&client, "filling", "filling-reader", 600);
    // Room for a few segments beside the filler, too little for a spare.
    filesystem.fill(4 * MIB);
    let (mut sequence, mut refusals, mut accepted) = (0u64, 0u32, 0u64);
    while refusals < REFUSALS {
        assert!(
            sequence < PUBLISHES_MAX * MESSAGES_PER_PUBLISH,
            "the disk never filled: {:?}",
            space(&filesystem)
        );
        match block_on(client.publish("filling", messages(sequence))) {
            Ok(_) => accepted += 1,
            Err(error) => {
                assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}");
                refusals += 1;
            }
        }
        sequence += MESSAGES_PER_PUBLISH;
    }
    let log = daemon.log();
    let full_lines: Vec<&str> = log.lines().filter(|line| is_full_line(line)).collect();
    println!("{accepted} publishes taken, {refusals} refused; the lines: {full_lines:?}");
    assert_eq!(full_lines.len(), 1, "{refusals} refusals for want of space; log:\n{log}");
    assert!(full_lines[0].contains(&filesystem.path().display().to_string()), "{}", full_lines[0]);
    assert!(!log.contains("has room again"), "room again while the disk stayed full; log:\n{log}");

    std::fs::remove_file(filesystem.path().join("filler")).expect("removing the filler");
    let waiting = Instant::now();
    while block_on(client.publish("filling", messages(sequence))).is_err() {
        assert!(
            waiting.elapsed() < SPACE_BACK_WITHIN,
            "publishes still refused with {:?}",
            space(&filesystem)
        );
        std::thread::sleep(Duration::from_millis(100));
        sequence += MESSAGES_PER_PUBLISH;
    }
    let log = daemon.log();
    let room_lines: Vec<&str> = log.lines().filter(|line| line.contains("has room again")).collect();
    println!("space back: {room_lines:?}");
    assert_eq!(room_lines.len(), 1, "log:\n{log}");
    assert_eq!(log.lines().filter(|line| is_full_line(line)).count(), 1, "log:\n{log}");
}
