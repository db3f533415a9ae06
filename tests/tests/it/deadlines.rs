//! A daemon that stops answering: requests of the client library and the CLI end with
//! `DeadlineExceeded` at their deadline instead of waiting forever, and work again once it
//! answers. The daemon is stopped with SIGSTOP (its sockets stay open, as a hung process's do).

use ringpost_client::{block_on, ErrorCode, Message};
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::time::Duration;

/// SIGSTOPs the daemon; SIGCONTs it when dropped, so a failed assertion leaves no stopped
/// process behind (the harness then kills it).
struct Stopped(nix::unistd::Pid);

impl Stopped {
    fn new(daemon: &Daemon) -> Stopped {
        let pid = nix::unistd::Pid::from_raw(daemon.pid().expect("a running daemon") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

#[test]
fn requests_to_a_daemon_that_stopped_answering_end_at_their_deadline() {
    let daemon = Daemon::start("deadlines");
    let client = daemon.client().with_request_timeout(Duration::from_millis(500));
    create_topic_and_subscription(&client, "hung-topic", "hung-sub", 10);
    // The stream that fails to open has a subscription of its own: the daemon, once it runs
    // again, may still serve the abandoned stream and lease messages to it.
    ringpost_tests::create_subscription(&client, "hung-stream-sub", "hung-topic", 10);
    block_on(client.publish("hung-topic", vec![Message::new("before")])).unwrap();

    let stopped = Stopped::new(&daemon);
    // Opening a stream has the deadline too.
    let opening = block_on(client.streaming_pull("hung-stream-sub", Default::default()));
    assert_eq!(opening.err().map(|error| error.code()), Some(ErrorCode::DeadlineExceeded));
    let error = block_on(client.publish("hung-topic", vec![Message::new("during")])).unwrap_err();
    assert_eq!(error.code(), ErrorCode::DeadlineExceeded, "{error}");
    let error = block_on(client.get_topic("hung-topic")).unwrap_err();
    assert_eq!(error.code(), ErrorCode::DeadlineExceeded, "{error}");
    // A pull that waits gets its wait on top of the deadline, and still ends.
    let error = block_on(client.pull("hung-sub", 10, 200)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::DeadlineExceeded, "{error}");
    let output = daemon.cli(&["--timeout", "0.5", "topic", "list"]);
    assert_eq!(output.status.code(), Some(3), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("DeadlineExceeded: "));
    let output = daemon.cli(&["publish", "hung-topic", "--timeout", "0.5", "late"]);
    assert_eq!(output.status.code(), Some(3), "{}", String::from_utf8_lossy(&output.stderr));

    // Answering again, the same client and connections serve; the forgotten requests'
    // answers (the publish may have been stored: publish is at-least-once) are discarded.
    drop(stopped);
    let client = client.with_request_timeout(ringpost_client::REQUEST_TIMEOUT_DEFAULT);
    block_on(client.publish("hung-topic", vec![Message::new("after")])).unwrap();
    assert!(
        client.pool_stats().iter().all(|connection| connection.in_flight == 0),
        "{:?}",
        client.pool_stats()
    );
    let delivered = ringpost_tests::drain(&client, "hung-sub", true);
    let data: Vec<&[u8]> = delivered.values().map(Vec::as_slice).collect();
    assert!(data.contains(&&b"before"[..]) && data.contains(&&b"after"[..]), "{data:?}");
}

#[test]
fn an_open_stream_outlives_the_request_deadline() {
    let daemon = Daemon::start("stream-deadline");
    let timeout = Duration::from_millis(300);
    let client = daemon.client().with_request_timeout(timeout);
    create_topic_and_subscription(&client, "long-topic", "long-sub", 10);
    let mut stream = block_on(client.streaming_pull("long-sub", Default::default())).unwrap();
    // Idle for longer than a request may take, then a message: the stream still delivers it.
    std::thread::sleep(timeout * 3);
    block_on(client.publish("long-topic", vec![Message::new("late")])).unwrap();
    let batch = loop {
        let batch = block_on(stream.next()).expect("the stream is open").unwrap();
        if !batch.is_empty() {
            break batch;
        }
    };
    assert_eq!(batch[0].data, b"late");
}

#[test]
fn a_closed_standard_output_ends_ringpost_bench_quietly() {
    let directory = ringpost_tests::temporary_directory("bench-pipe");
    let (first, second) = (directory.join("first.json"), directory.join("second.json"));
    std::fs::write(&first, "{\"workload\":\"publish\",\"msgs_per_sec\":1000}").unwrap();
    std::fs::write(&second, "{\"workload\":\"publish\",\"msgs_per_sec\":2000}").unwrap();
    let mut child = std::process::Command::new(ringpost_tests::binary("ringpost-bench"))
        .arg("compare")
        .args([&first, &second])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&directory);
    assert!(output.stderr.is_empty(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0));
}
