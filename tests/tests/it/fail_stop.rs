//! A panic on any shard stops the whole process (fail-stop), so that no half-alive node keeps
//! answering with a dead shard: the daemon aborts at once, the panic logged at ERROR with its
//! place, and a restart recovers everything acknowledged. The embedded daemon of
//! `ringpost-bench --embedded` stops the same way and leaves no scratch directory behind.
//! The panic is made on purpose through the daemon's test hook, an environment variable read
//! at start (`RINGPOST_TEST_PANIC_AFTER_PUBLISHES`: the Nth publish of each forwarder shard
//! panics).

use ringpost_client::{block_on, Message, RetrySettings};
use ringpost_tests::{create_topic_and_subscription, drain, Daemon};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PANIC_AFTER_PUBLISHES_VARIABLE: &str = "RINGPOST_TEST_PANIC_AFTER_PUBLISHES";
/// Tells a process that stopped from one that carries on with a dead shard; generous for a
/// loaded machine.
const STOPS_WITHIN: Duration = Duration::from_secs(10);
/// The same for the benchmark, whose debug build also starts its embedded daemon in this time.
const BENCH_STOPS_WITHIN: Duration = Duration::from_secs(60);

/// The log line the panic hook writes: at ERROR, naming the thread, the place in the daemon's
/// source and the hook's message.
fn panic_line(log: &str) -> Option<&str> {
    log.lines().find(|line| line.contains("ERROR") && line.contains("panicked at"))
}

#[test]
fn a_panicking_shard_stops_the_daemon_and_a_restart_recovers() {
    let mut daemon = Daemon::prepare("fail-stop", Vec::new(), Vec::new());
    daemon.env.push((PANIC_AFTER_PUBLISHES_VARIABLE.into(), "3".into()));
    daemon.spawn();
    let client = daemon.client().with_retry(RetrySettings::NONE, RetrySettings::NONE);
    create_topic_and_subscription(&client, "fragile", "fragile-reader", 60);
    for sequence in 0..2u8 {
        block_on(client.publish("fragile", vec![Message::new(vec![sequence; 8])]))
            .unwrap_or_else(|error| panic!("publish {sequence} before the hook fires: {error}"));
    }
    let started = Instant::now();
    let third = block_on(client.publish("fragile", vec![Message::new(vec![2; 8])]));
    assert!(third.is_err(), "the shard's third publish was acknowledged although it panicked");
    let status = daemon.wait_for_exit(STOPS_WITHIN).unwrap_or_else(|| {
        panic!("the daemon still runs {STOPS_WITHIN:?} after a shard panicked; log:\n{}", daemon.log())
    });
    println!(
        "the daemon stopped {} ms after the publish that panicked: {status}",
        started.elapsed().as_millis()
    );
    assert!(!status.success(), "a daemon that lost a shard exited 0");
    assert_eq!(status.signal(), Some(nix::libc::SIGABRT), "not aborted: {status}");
    let log = daemon.log();
    let line = panic_line(&log).unwrap_or_else(|| panic!("no ERROR line for the panic; log:\n{log}"));
    assert!(line.contains("forwarder"), "the line does not name the shard's thread: {line}");
    assert!(line.contains("daemon/src/"), "the line does not say where: {line}");
    assert!(
        line.contains(PANIC_AFTER_PUBLISHES_VARIABLE),
        "the line does not give the panic's message: {line}"
    );

    // Without the hook, recovery brings back both acknowledged publishes.
    daemon.env.clear();
    daemon.spawn();
    let client = daemon.client();
    let delivered = drain(&client, "fragile-reader", true);
    let mut payloads: Vec<Vec<u8>> = delivered.into_values().collect();
    payloads.sort();
    assert!(
        payloads.starts_with(&[vec![0; 8], vec![1; 8]]),
        "acknowledged publishes missing after the restart: {payloads:?}"
    );
}

/// The scratch data directories of benchmark process `pid` (named after it) under /var/tmp.
fn scratch_of(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("ringpost-bench-{pid}-");
    std::fs::read_dir("/var/tmp")
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

#[test]
fn the_embedded_daemon_of_the_benchmark_stops_the_same_way() {
    let bench = ringpost_tests::binary("ringpost-bench");
    let directory = ringpost_tests::temporary_directory("fail-stop-bench");
    let stderr_path = directory.join("stderr");
    let started = Instant::now();
    let mut child = Command::new(bench)
        .env(PANIC_AFTER_PUBLISHES_VARIABLE, "1")
        .args(["--embedded", "publish", "--messages", "100000", "--publishers", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("starting ringpost-bench");
    let pid = child.id();
    // A benchmark whose daemon carried on without the shard would hang on it or end on its
    // own; either fails here or below.
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BENCH_STOPS_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            scratch_of(pid).iter().for_each(|path| drop(std::fs::remove_dir_all(path)));
            panic!(
                "ringpost-bench still ran {BENCH_STOPS_WITHIN:?} after its shard panicked; stderr:\n{stderr}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    println!("ringpost-bench stopped after {} ms: {status}", started.elapsed().as_millis());
    assert_eq!(status.signal(), Some(nix::libc::SIGABRT), "not aborted: {status}; stderr:\n{stderr}");
    let line =
        panic_line(&stderr).unwrap_or_else(|| panic!("no ERROR line for the panic; stderr:\n{stderr}"));
    assert!(line.contains(PANIC_AFTER_PUBLISHES_VARIABLE), "{line}");
    let left = scratch_of(pid);
    assert!(left.is_empty(), "the aborted benchmark left its scratch directory: {left:?}");
    let _ = std::fs::remove_dir_all(&directory);
}
