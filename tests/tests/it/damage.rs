//! A topic whose log holds damage no copy can mend (docs/TESTING.md T4, on the real daemon):
//! the daemon refuses to start and names it, and the operator's way out,
//! `--quarantine-damaged`, serves every other topic while that one answers `DataLoss` and
//! keeps its files as they are, until it is deleted.

use ringpost_client::{block_on, Client, ErrorCode, Message};
use ringpost_tests::{binary, create_topic_and_subscription, drain, Daemon};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every segment file under `directory`.
fn segment_files(directory: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(directory) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(segment_files(&path));
        } else if path.extension().is_some_and(|extension| extension == "seg") {
            found.push(path);
        }
    }
    found
}

/// The segment holding `marker`, and where.
fn find_marker(data_dir: &Path, marker: &[u8]) -> (PathBuf, usize) {
    for path in segment_files(data_dir) {
        let bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(marker.len()).position(|window| window == marker) {
            return (path, at);
        }
    }
    panic!("no segment holds {}", String::from_utf8_lossy(marker));
}

fn publish_three_batches(client: &Client, topic: &str) {
    for batch in 0..3 {
        let messages = (0..5).map(|i| Message::new(format!("{topic}-batch{batch}-message{i}"))).collect();
        block_on(client.publish(topic, messages)).unwrap();
    }
}

/// Runs the daemon on `data_dir` expecting it to refuse to start; returns what it said.
fn refused_start(data_dir: &Path) -> String {
    let mut child = Command::new(binary("ringpostd"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0", "--grpc-listen", "off", "--http-listen", "off", "--shards", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "ringpostd started on a damaged log");
            let mut said = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
            return said;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ringpostd neither started nor refused in 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_damaged_topic_stops_the_start_or_is_quarantined_and_the_others_are_served() {
    let mut daemon = Daemon::start("quarantine");
    let client = daemon.client();
    create_topic_and_subscription(&client, "damaged-topic", "damaged-sub", 10);
    create_topic_and_subscription(&client, "healthy-topic", "healthy-sub", 10);
    publish_three_batches(&client, "damaged-topic");
    publish_three_batches(&client, "healthy-topic");
    drop(client);
    daemon.kill();

    // One byte of a message in the damaged topic's first batch, with two valid batches after
    // it: mid-log damage, which the only copy cannot mend.
    let data_dir = daemon.data_dirs[0].clone();
    let (segment, at) = find_marker(&data_dir, b"damaged-topic-batch0-message2");
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[at] ^= 0x20;
    std::fs::write(&segment, &bytes).unwrap();

    let said = refused_start(&data_dir);
    assert!(said.contains("damaged-topic") && said.contains("--quarantine-damaged"), "{said}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "a refused start changes nothing");

    daemon.extra_args.push("--quarantine-damaged".into());
    daemon.restart();
    assert!(daemon.log().contains("topic 'damaged-topic' is quarantined"), "{}", daemon.log());
    let client = daemon.client();
    // The healthy topic: everything published before, and publishing goes on.
    block_on(client.publish("healthy-topic", vec![Message::new("after the restart")])).unwrap();
    let delivered = drain(&client, "healthy-sub", true);
    assert_eq!(delivered.len(), 16, "{delivered:?}");
    // The damaged one answers DataLoss, with the reason, to publishers and subscribers.
    let error = block_on(client.publish("damaged-topic", vec![Message::new("x")])).unwrap_err();
    assert_eq!(error.code(), ErrorCode::DataLoss, "{error}");
    assert!(error.to_string().contains("quarantined"), "{error}");
    let error = block_on(client.pull("damaged-sub", 10, 0)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::DataLoss, "{error}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "a quarantined topic's files are left as they are");
    let stats = ringpost_tests::succeeded(&daemon.cli(&["stats"]));
    assert!(
        stats
            .lines()
            .any(|line| line.contains(r#""quarantined_topic":"damaged-topic""#) && line.contains("mid-log")),
        "{stats}"
    );

    // Deleting it removes its files; the next start needs no flag.
    block_on(client.delete_topic("damaged-topic")).unwrap();
    assert!(!segment.exists(), "the deleted topic's segment is still there");
    drop(client);
    daemon.extra_args.clear();
    daemon.restart();
    let client = daemon.client();
    block_on(client.publish("healthy-topic", vec![Message::new("and after the next")])).unwrap();
    assert_eq!(drain(&client, "healthy-sub", true).len(), 1);
}
