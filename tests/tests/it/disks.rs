//! Several data directories on real, small ext4 filesystems (loop-mounted images): a full
//! directory is fenced while the others keep acknowledging (quorum ⌈M/2⌉), a second failing
//! one stops acknowledgements without losing what was acknowledged, acknowledged segments are
//! deleted so disk use stays bounded, and recovery rebuilds a replaced (empty) directory.
//!
//! These tests need root and loop devices (CI has both); without them they fail loudly.

use ringpost_client::{block_on, Client, ErrorCode, Message, RetrySettings};
use ringpost_tests::loopfs::LoopFilesystem;
use ringpost_tests::scrape::{http_get, Scrape};
use ringpost_tests::{create_topic_and_subscription, drain, temporary_directory, Daemon};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MESSAGE_BYTES: usize = 1024;
const MESSAGES_PER_PUBLISH: u64 = 100;
const MIB: u64 = 1 << 20;
const SMALL_SEGMENTS: [&str; 2] = ["--segment-bytes-max", "1048576"];

/// A plain temporary directory, removed at the end unless the test failed.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        Scratch(temporary_directory(label))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn small_segments() -> Vec<String> {
    SMALL_SEGMENTS.iter().map(|flag| flag.to_string()).collect()
}

/// 1 KiB whose every byte depends on `sequence`, so a delivered payload proves itself intact.
fn payload(sequence: u64) -> Vec<u8> {
    ringpost_tests::payload(sequence, MESSAGE_BYTES)
}

fn sequence_of(data: &[u8]) -> Option<u64> {
    let sequence = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    (payload(sequence) == data).then_some(sequence)
}

fn messages(first: u64, count: u64) -> Vec<Message> {
    (first..first + count).map(|sequence| Message::new(payload(sequence))).collect()
}

fn setup(client: &Client, topic: &str, subscription: &str) {
    create_topic_and_subscription(client, topic, subscription, 600);
}

/// Publishes sequences `first..first + MESSAGES_PER_PUBLISH` and records each acknowledged id
/// with its sequence.
fn publish_batch(
    client: &Client,
    topic: &str,
    first: u64,
    acked: &mut HashMap<u64, u64>,
) -> ringpost_client::Result<()> {
    let ids = block_on(client.publish(topic, messages(first, MESSAGES_PER_PUBLISH)))?;
    assert_eq!(ids.len() as u64, MESSAGES_PER_PUBLISH, "one id per message");
    for (index, id) in ids.into_iter().enumerate() {
        assert!(acked.insert(id, first + index as u64).is_none(), "message id {id} was given twice");
    }
    Ok(())
}

/// A client that returns every failure at once: these tests assert on the daemon's first answer,
/// which the client's default retries of `Unavailable` and `ResourceExhausted` would hide (and
/// slow down by seconds of backoff per refused publish).
fn unretried_client(daemon: &Daemon) -> Client {
    daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE)
}

/// Every acknowledged publish is delivered with its bytes intact.
fn assert_all_delivered(acked: &HashMap<u64, u64>, delivered: &HashMap<u64, Vec<u8>>) {
    let mut missing: Vec<u64> = Vec::new();
    for (id, sequence) in acked {
        match delivered.get(id) {
            None => missing.push(*id),
            Some(data) => assert!(
                *data == payload(*sequence),
                "message {id} (sequence {sequence}) came back with other bytes (it reads as sequence {:?})",
                sequence_of(data)
            ),
        }
    }
    missing.sort_unstable();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged messages were never delivered, e.g. ids {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
}

/// The daemon's log line fencing data directory `index` (`path`), if there is one.
fn fence_line(daemon: &Daemon, index: usize, path: &Path) -> Option<String> {
    let needle = format!("fencing data directory {index} ({})", path.display());
    daemon.log().lines().find(|line| line.contains(&needle)).map(str::to_owned)
}

/// Every `*.seg` file under `root` (recursively), by path relative to `root`, with its size.
fn segment_files(root: &Path) -> BTreeMap<PathBuf, u64> {
    fn walk(root: &Path, directory: &Path, into: &mut BTreeMap<PathBuf, u64>) {
        let Ok(entries) = std::fs::read_dir(directory) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(metadata) = entry.metadata() else { continue };
            if metadata.is_dir() {
                walk(root, &path, into);
            } else if path.extension().is_some_and(|extension| extension == "seg") {
                into.insert(path.strip_prefix(root).unwrap().to_path_buf(), metadata.len());
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(root, root, &mut files);
    files
}

#[test]
fn one_full_directory_of_three_keeps_acknowledging() {
    // Declared before the daemon so they are unmounted and removed after it is killed.
    let c = LoopFilesystem::create("disks-full-c", 16);
    let (a, b) = (Scratch::new("disks-full-a"), Scratch::new("disks-full-b"));
    let daemon = Daemon::start_with(
        "disks-full",
        vec![a.0.clone(), b.0.clone(), c.path().to_path_buf()],
        small_segments(),
    );
    let client = unretried_client(&daemon);
    setup(&client, "filling", "filling-reader");

    // 40,000 messages of 1 KiB: far more than C's 16 MiB.
    let total: u64 = 40_000;
    let mut acked = HashMap::new();
    let mut fenced_at: Option<u64> = None;
    for first in (0..total).step_by(MESSAGES_PER_PUBLISH as usize) {
        if let Err(error) = publish_batch(&client, "filling", first, &mut acked) {
            panic!(
                "publishing sequences {first}.. was refused with {:?} ({error}) while two of three data \
                 directories are healthy; C has {} bytes free",
                error.code(),
                c.free_bytes()
            );
        }
        if fenced_at.is_none() && fence_line(&daemon, 2, c.path()).is_some() {
            fenced_at = Some(first + MESSAGES_PER_PUBLISH);
        }
    }
    let line = fence_line(&daemon, 2, c.path());
    let Some(fenced_at) = fenced_at else {
        panic!(
            "{total} KiB published and the full data directory {} was never fenced; it has {} bytes free",
            c.path().display(),
            c.free_bytes()
        )
    };
    let line = line.unwrap();
    println!("C was fenced after {fenced_at} acknowledged messages: {line}");
    assert!(
        line.contains("os error 28") || line.contains("No space left"),
        "C was fenced for something other than a full disk: {line}"
    );
    assert!(
        total - fenced_at >= 10_000,
        "C was fenced only after {fenced_at} of {total} messages: the test did not publish well past it"
    );
    assert!(c.free_bytes() < 2 * MIB, "C was fenced for lack of space but has {} bytes free", c.free_bytes());
    assert_eq!(acked.len() as u64, total);

    let delivered = drain(&client, "filling-reader", true);
    assert_all_delivered(&acked, &delivered);
    assert_eq!(delivered.len(), acked.len(), "delivered messages that were never acknowledged");
}

#[test]
fn second_failing_directory_stops_acknowledgements() {
    let b = LoopFilesystem::create("disks-second-b", 64);
    let c = LoopFilesystem::create("disks-second-c", 16);
    let a = Scratch::new("disks-second-a");
    let mut flags = small_segments();
    flags.extend(["--http-listen".to_owned(), "127.0.0.1:0".to_owned()]);
    let daemon = Daemon::start_with(
        "disks-second",
        vec![a.0.clone(), b.path().to_path_buf(), c.path().to_path_buf()],
        flags,
    );
    let http = daemon.http_address.clone().expect("the monitoring endpoint serves");
    let fenced_gauge = |path: &Path| -> Vec<f64> {
        let (_, body) = http_get(&http, "/metrics");
        let scrape = Scrape::parse(&body);
        let path = path.display().to_string();
        scrape
            .samples
            .iter()
            .filter(|sample| sample.name == "ringpost_data_directory_fenced")
            .filter(|sample| {
                sample.labels.get("path") == Some(&path)
                    && sample.labels.get("shard").is_some_and(|s| s != "router")
            })
            .map(|sample| sample.value)
            .collect()
    };
    assert!(fenced_gauge(c.path()).iter().all(|value| *value == 0.0));
    let client = unretried_client(&daemon);
    setup(&client, "failing", "failing-reader");

    // Until C is full and fenced, then 2,000 more: acknowledgements continue on A and B.
    let mut acked = HashMap::new();
    let mut next: u64 = 0;
    let mut after_fence = None;
    while after_fence.is_none_or(|after: u64| next < after + 2_000) {
        assert!(next < 40_000, "{next} KiB published and C ({} bytes free) was never fenced", c.free_bytes());
        publish_batch(&client, "failing", next, &mut acked)
            .unwrap_or_else(|error| panic!("publish refused with one directory of three full: {error}"));
        next += MESSAGES_PER_PUBLISH;
        if after_fence.is_none() && fence_line(&daemon, 2, c.path()).is_some() {
            after_fence = Some(next);
        }
    }
    println!(
        "C fenced after {} messages: {}",
        after_fence.unwrap(),
        fence_line(&daemon, 2, c.path()).unwrap()
    );

    // The monitoring endpoint shows C fenced, and the daemon still ready (two of three).
    assert!(
        fenced_gauge(c.path()).contains(&1.0),
        "C was fenced and ringpost_data_directory_fenced does not say so: {:?}",
        fenced_gauge(c.path())
    );
    assert_eq!(http_get(&http, "/readyz"), (200, "ready\n".to_owned()));

    // A remount read-only is refused while the daemon holds files open for writing; shutting
    // the filesystem down makes every write and sync on B fail, as a dying disk does.
    match b.remount_read_only() {
        Ok(()) => println!("B remounted read-only"),
        Err(why) => {
            println!("remounting B read-only is impossible under a running daemon ({why}); shutting B down");
            b.shut_down();
        }
    }
    let acknowledged_before = acked.len();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    let mut failed = 0;
    for attempt in 0..20 {
        let first = next;
        next += MESSAGES_PER_PUBLISH;
        match publish_batch(&client, "failing", first, &mut acked) {
            Ok(()) => panic!(
                "publish {attempt} after B failed was acknowledged, with only A of three data directories \
                 healthy (quorum is 2)"
            ),
            Err(error) => {
                let code = error.code();
                assert!(
                    matches!(code, ErrorCode::Unavailable | ErrorCode::ResourceExhausted),
                    "publish after B failed refused with {code:?}, not Unavailable or ResourceExhausted: {error}"
                );
                if failed == 0 {
                    println!("first refused publish after B failed: {code:?}: {error}");
                }
                failed += 1;
                *codes.entry(format!("{code:?}")).or_default() += 1;
            }
        }
    }
    println!("publishes after B failed: {failed} refused ({codes:?}), none acknowledged");
    assert_eq!(acked.len(), acknowledged_before);
    assert!(fence_line(&daemon, 1, b.path()).is_some(), "B's failure was not reported as a fence");
    // Without a quorum of healthy directories the daemon is not ready, and says why.
    let (status, reasons) = http_get(&http, "/readyz");
    assert_eq!(status, 503, "{reasons}");
    assert!(reasons.contains("fewer than a quorum"), "{reasons}");

    // Reads come from any valid copy: everything acknowledged before is still delivered.
    let delivered = drain(&client, "failing-reader", false);
    assert_all_delivered(&acked, &delivered);
    let unacknowledged: Vec<u64> = delivered.keys().filter(|id| !acked.contains_key(id)).copied().collect();
    for id in &unacknowledged {
        let sequence = sequence_of(&delivered[id]).expect("a delivered message that was never published");
        assert!(
            sequence >= next - 20 * MESSAGES_PER_PUBLISH,
            "message {id} delivered twice under another id"
        );
    }
    println!(
        "delivered {} acknowledged messages and {} from refused publishes",
        acked.len(),
        unacknowledged.len()
    );
}

#[test]
fn disk_use_stays_bounded_under_publish_and_ack() {
    let daemon = Daemon::start_with("disks-bounded", Vec::new(), small_segments());
    let topics = daemon.data_dirs[0].join("topics");
    {
        let client = daemon.client();
        setup(&client, "flowing", "flowing-reader");
    }
    let total: u64 = 60_000;
    let publisher = {
        let client = daemon.client();
        std::thread::spawn(move || {
            let mut acked = HashMap::new();
            for first in (0..total).step_by(MESSAGES_PER_PUBLISH as usize) {
                publish_batch(&client, "flowing", first, &mut acked).unwrap();
            }
            acked
        })
    };
    let publishing_done = Arc::new(AtomicBool::new(false));
    let subscriber = {
        let client = daemon.client();
        let publishing_done = publishing_done.clone();
        std::thread::spawn(move || {
            let mut delivered: HashMap<u64, u64> = HashMap::new();
            let mut idle_since_publishing_done = 0;
            while (delivered.len() as u64) < total {
                let batch = block_on(client.pull("flowing-reader", 1000, 500)).unwrap();
                if batch.is_empty() {
                    if publishing_done.load(Ordering::Relaxed) {
                        idle_since_publishing_done += 1;
                        assert!(
                            idle_since_publishing_done < 10,
                            "only {} of {total} messages delivered, and nothing more comes",
                            delivered.len()
                        );
                    }
                    continue;
                }
                let ack_ids: Vec<String> = batch.iter().map(|message| message.ack_id.clone()).collect();
                for message in batch {
                    let sequence = sequence_of(&message.data).expect("a delivered payload is intact");
                    delivered.insert(message.message_id, sequence);
                }
                let refused = block_on(client.acknowledge("flowing-reader", ack_ids)).unwrap();
                assert!(refused.is_empty(), "{refused:?}");
            }
            delivered
        })
    };
    let mut peak = 0u64;
    while !publisher.is_finished() {
        peak = peak.max(segment_files(&topics).values().sum());
        std::thread::sleep(Duration::from_millis(200));
    }
    let acked = publisher.join().expect("the publisher failed");
    publishing_done.store(true, Ordering::Relaxed);
    let delivered = subscriber.join().expect("the subscriber failed");
    assert_eq!(delivered, acked, "every acknowledged message is delivered under its id");

    // Collection runs every 5 s: within 15 s everything acknowledged must be gone.
    let limit = 8 * MIB;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut files = segment_files(&topics);
    while files.values().sum::<u64>() >= limit && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        files = segment_files(&topics);
    }
    let on_disk: u64 = files.values().sum();
    println!(
        "{} MB passed through; segment files now {on_disk} bytes in {} files (peak seen while publishing {peak}): {files:?}",
        total * MESSAGE_BYTES as u64 / 1_000_000,
        files.len()
    );
    assert!(
        on_disk < limit,
        "{on_disk} bytes of segment files remain 15 s after every message was acknowledged: {files:?}"
    );
}

#[test]
fn restart_with_an_empty_replacement_directory_rebuilds_it() {
    let (a, b, c) =
        (Scratch::new("disks-rebuild-a"), Scratch::new("disks-rebuild-b"), Scratch::new("disks-rebuild-c"));
    let mut daemon =
        Daemon::start_with("disks-rebuild", vec![a.0.clone(), b.0.clone(), c.0.clone()], small_segments());
    let mut acked = HashMap::new();
    {
        let client = daemon.client();
        setup(&client, "replaced", "replaced-reader");
        for first in (0..2_000).step_by(MESSAGES_PER_PUBLISH as usize) {
            publish_batch(&client, "replaced", first, &mut acked).unwrap();
        }
    }
    daemon.kill();
    let before = segment_files(&a.0.join("topics"));
    assert!(before.len() >= 3, "expected several segments in A: {before:?}");
    // A replaced disk: C is there but empty.
    for entry in std::fs::read_dir(&c.0).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
    assert_eq!(std::fs::read_dir(&c.0).unwrap().count(), 0);
    daemon.restart();
    let client = daemon.client();
    let delivered = drain(&client, "replaced-reader", false);
    assert_all_delivered(&acked, &delivered);
    assert_eq!(delivered.len(), 2_000);

    let in_a = segment_files(&a.0.join("topics"));
    let in_c = segment_files(&c.0.join("topics"));
    println!("A's segments after recovery: {in_a:?}\nC's segments after recovery: {in_c:?}");
    assert_eq!(in_a, before, "A's segments changed across the restart");
    assert_eq!(in_c, in_a, "recovery did not rebuild C's copy of every segment");
    // The rebuilt copy holds the same bytes, not only the same sizes.
    let differing: Vec<&PathBuf> = in_a
        .keys()
        .filter(|relative| {
            std::fs::read(a.0.join("topics").join(relative)).unwrap()
                != std::fs::read(c.0.join("topics").join(relative)).unwrap()
        })
        .collect();
    assert!(differing.is_empty(), "C's rebuilt segments differ from A's: {differing:?}");
}

/// The helpers the tests above rely on do what they say.
#[test]
fn loop_filesystem_fills_and_remounts_read_only() {
    let filesystem = LoopFilesystem::create("disks-helpers", 16);
    assert!(
        filesystem.free_bytes() > 8 * MIB,
        "a fresh 16 MiB filesystem has {} free",
        filesystem.free_bytes()
    );
    let left = filesystem.fill(2 * MIB);
    assert!((MIB..=2 * MIB + 64 * 1024).contains(&left), "fill(2 MiB) left {left} bytes free");
    let big = std::fs::File::create(filesystem.path().join("big")).and_then(|file| {
        nix::fcntl::fallocate(
            std::os::unix::io::AsRawFd::as_raw_fd(&file),
            nix::fcntl::FallocateFlags::empty(),
            0,
            (3 * MIB) as i64,
        )
        .map_err(std::io::Error::from)
    });
    assert_eq!(big.unwrap_err().raw_os_error(), Some(nix::libc::ENOSPC));
    let _ = std::fs::remove_file(filesystem.path().join("big"));
    {
        let _open_for_writing =
            std::fs::OpenOptions::new().append(true).open(filesystem.path().join("filler")).unwrap();
        assert!(
            filesystem.remount_read_only().is_err(),
            "a remount read-only succeeded with a file open for writing"
        );
    }
    filesystem.remount_read_only().unwrap();
    let error = std::fs::write(filesystem.path().join("after"), b"x").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EROFS), "{error}");
}
