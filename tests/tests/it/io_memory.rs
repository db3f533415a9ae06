//! A forwarder shard's I/O memory (`--io-memory-mib`): buffers come from it while it has room
//! and from the heap once it is full. Both kinds carry commits to disk and reads back from it.

use ringpost_client::{block_on, Message};
use ringpost_tests::{binary, create_topic_and_subscription, drain, payload, temporary_directory, Daemon};
use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SMALL_MESSAGE_BYTES: usize = 1024;
const LARGE_MESSAGE_BYTES: usize = 2048;
const LARGE_MESSAGES_PER_PUBLISH: u64 = 1000;

#[test]
fn commits_larger_than_the_io_memory_are_stored_and_read_back_intact() {
    // 1 MiB of I/O memory per shard: a one-message publish commits a 4 KiB buffer taken from
    // it; a publish of 1,000 messages of 2 KiB commits about 2 MiB, which only the heap holds.
    let mut daemon = Daemon::start_with("io-memory", Vec::new(), vec!["--io-memory-mib".into(), "1".into()]);
    let client = daemon.client();
    create_topic_and_subscription(&client, "orders", "audit", 600);

    let mut expected: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut sequence = 0;
    for round in 0..4 {
        for _ in 0..10 {
            let data = payload(sequence, SMALL_MESSAGE_BYTES);
            let ids = block_on(client.publish("orders", vec![Message::new(data.clone())])).unwrap();
            expected.insert(ids[0], data);
            sequence += 1;
        }
        let batch: Vec<Vec<u8>> = (0..LARGE_MESSAGES_PER_PUBLISH)
            .map(|index| payload(sequence + index, LARGE_MESSAGE_BYTES))
            .collect();
        sequence += LARGE_MESSAGES_PER_PUBLISH;
        let ids =
            block_on(client.publish("orders", batch.iter().cloned().map(Message::new).collect())).unwrap();
        assert_eq!(ids.len(), batch.len(), "round {round}: one id per message");
        expected.extend(ids.into_iter().zip(batch));
    }

    // After a SIGKILL and a restart every message is read back from the disk, through read
    // buffers of both kinds too.
    daemon.restart();
    let delivered = drain(&daemon.client(), "audit", true);
    assert_eq!(delivered.len(), expected.len(), "every acknowledged publish is delivered");
    for (id, data) in &expected {
        assert!(delivered.get(id) == Some(data), "message {id} was not delivered intact");
    }
}

#[test]
fn an_io_memory_of_zero_is_refused() {
    let directory = temporary_directory("io-memory-zero");
    let mut child = Command::new(binary("ringpostd"))
        .args([
            "--io-memory-mib",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "off",
            "--http-listen",
            "off",
            "--data-dir",
        ])
        .arg(directory.join("data"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("running ringpostd");
    // A daemon that accepted the flag would serve until killed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("ringpostd started with --io-memory-mib 0");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    child.stderr.take().unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(text.contains("InvalidArgument: --io-memory-mib"), "{text}");
    let _ = std::fs::remove_dir_all(&directory);
}
