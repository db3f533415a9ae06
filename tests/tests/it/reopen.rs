//! Streams that outlive what served them: `ringpost pull --stream` and the library's
//! `Subscriber` across the SIGKILL of their topic's leader in a cluster, and the CLI across a
//! restart of a single daemon. Each opens its stream again (the failed forwarder passed over
//! or the route looked up again, with backoff) and receives what is published afterwards;
//! nothing acknowledged by a publisher is lost.

use ringpost_client::{block_on, Client, Message, ShutdownMode, Subscriber, SubscriberSettings};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::{create_subscription, Daemon};
use std::collections::HashSet;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a stream may take to deliver what was published after its server died: an
/// election (a few seconds) plus the client's backoff, with room for a loaded machine. Only
/// tells a stream that carries on from one that ended.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// `ringpost pull --stream --ack` running against `server`: its standard output's lines come
/// through `lines`, its standard error is kept; killed when dropped.
struct StreamingCli {
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl StreamingCli {
    fn start(server: &str, subscription: &str, extra: &[&str]) -> StreamingCli {
        let mut child = Command::new(ringpost_tests::binary("ringpost"))
            .args(["--server", server, "pull", subscription, "--stream", "--ack", "--max", "100"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let kept = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                let mut kept = kept.lock().unwrap();
                kept.push_str(&line);
                kept.push('\n');
            }
        });
        StreamingCli { child, lines, stderr }
    }

    /// Reads printed messages until every payload of `wanted` was seen; panics after
    /// `DELIVERY_TIMEOUT`, or if the CLI exits first.
    fn receive(&mut self, wanted: &HashSet<String>, what: &str) -> Vec<String> {
        let mut seen = Vec::new();
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        while !wanted.iter().all(|payload| seen.contains(payload)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => seen.push(ringpost_tests::json_field(&line, "data").to_owned()),
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{what}: {} of {} printed within {DELIVERY_TIMEOUT:?}; stderr:\n{}",
                    wanted.iter().filter(|payload| seen.contains(payload)).count(),
                    wanted.len(),
                    self.stderr()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().unwrap();
                    panic!("{what}: the CLI exited ({status}); stderr:\n{}", self.stderr())
                }
            }
        }
        seen
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for StreamingCli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes `messages` payloads `{prefix}{i}` (each acknowledged; the client retries through
/// a failover) and returns them.
fn publish_numbered(client: &Client, topic: &str, prefix: &str, messages: usize) -> HashSet<String> {
    let payloads: Vec<String> = (0..messages).map(|i| format!("{prefix}{i}")).collect();
    for chunk in payloads.chunks(10) {
        let batch = chunk.iter().map(|payload| Message::new(payload.as_str())).collect();
        block_on(client.publish(topic, batch)).unwrap();
    }
    payloads.into_iter().collect()
}

/// The reproduction: `ringpost pull --stream` whose server (`--server`) is the node
/// that leads its topic. The leader is SIGKILLed: the CLI's stream breaks with its forwarder
/// and its router is gone too; it opens the stream again from the route it had (another
/// node's forwarder, which carries it to the new leader), prints what is published after the
/// kill and says on its standard error that it reopened. It used to exit 3 within 19 ms.
#[test]
fn cli_pull_stream_carries_on_across_its_topics_leaders_death() {
    const MESSAGES: usize = 30;
    let mut cluster = Cluster::start("reopen-cli", 3, Vec::new());
    let admin = cluster.node(1).client();
    block_on(admin.create_topic("followed")).unwrap();
    create_subscription(&admin, "followed-cli", "followed", 10);
    let leader = cluster.topic_leader("followed");
    let survivor = cluster.ids().find(|id| *id != leader).unwrap();
    let publisher = cluster.node(survivor).client();

    let mut cli = StreamingCli::start(&cluster.node(leader).address.clone(), "followed-cli", &[]);
    let before = publish_numbered(&publisher, "followed", "a", MESSAGES);
    cli.receive(&before, "before the kill");

    cluster.node_mut(leader).kill();
    let killed = Instant::now();
    let after = publish_numbered(&publisher, "followed", "b", MESSAGES);
    let seen = cli.receive(&after, "after the leader's death");
    eprintln!("the CLI printed every message published after the kill {:?} after it", killed.elapsed());
    // At least once: a message acknowledged before the kill may come again only if its
    // acknowledgement was not durable; every one published after it came.
    assert!(seen.iter().all(|payload| payload.starts_with('a') || after.contains(payload)));
    assert!(cli.is_running(), "the CLI still follows the subscription");
    let stderr = cli.stderr();
    assert!(stderr.contains("broke") && stderr.contains("is open again"), "{stderr}");
    cluster.node_mut(leader).restart();
}

/// The library's `Subscriber`, its client's router on the node that leads the topic, across
/// that node's SIGKILL: its stream breaks, opens again through another node's forwarder of
/// the route it had (which carries it to the new leader), and when that forwarder cannot
/// carry it yet (the election is not over) and the route is to be looked up again, the dead
/// router does not stop it: the route it had is used again. Every message published after
/// the kill is handled and acknowledged; once the acknowledgements are confirmed, nothing is
/// delivered again.
#[test]
fn a_subscriber_carries_on_across_its_topics_leaders_death() {
    const MESSAGES: usize = 30;
    let mut cluster = Cluster::start("reopen-subscriber", 3, Vec::new());
    let admin = cluster.node(1).client();
    block_on(admin.create_topic("handled")).unwrap();
    create_subscription(&admin, "handled-sub", "handled", 10);
    let leader = cluster.topic_leader("handled");
    let survivor = cluster.ids().find(|id| *id != leader).unwrap();
    let publisher = cluster.node(survivor).client();

    let client = Arc::new(cluster.node(leader).client());
    let subscriber = Subscriber::new(client, "handled-sub", SubscriberSettings::default()).unwrap();
    let handled = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorder = handled.clone();
    subscriber
        .run(move |message, handle| {
            recorder.lock().unwrap().push(String::from_utf8(message.data).unwrap());
            handle.ack();
        })
        .unwrap();
    let wait_for = |wanted: &HashSet<String>, what: &str| {
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        loop {
            let seen: HashSet<String> = handled.lock().unwrap().iter().cloned().collect();
            if wanted.is_subset(&seen) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {} handled within {DELIVERY_TIMEOUT:?} ({:?})",
                wanted.intersection(&seen).count(),
                wanted.len(),
                subscriber.stats()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let before = publish_numbered(&publisher, "handled", "a", MESSAGES);
    wait_for(&before, "before the kill");
    let opened_before = subscriber.stats().streams_opened;

    cluster.node_mut(leader).kill();
    let after = publish_numbered(&publisher, "handled", "b", MESSAGES);
    wait_for(&after, "after the leader's death");
    let stats = subscriber.stats();
    assert!(stats.streams_opened > opened_before, "the stream was opened again: {stats:?}");
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    let stats = subscriber.stats();
    eprintln!("subscriber across the kill: {stats:?}");
    assert_eq!(stats.failed, 0, "every acknowledgement went through: {stats:?}");
    // Confirmed acknowledgements are not delivered again: the subscription is empty.
    let reader = cluster.node(survivor).client();
    let again = block_on(reader.pull("handled-sub", 100, 2000)).unwrap();
    assert!(again.is_empty(), "delivered again after their acknowledgements were confirmed: {again:?}");
    cluster.node_mut(leader).restart();
}

/// A run of `count` free ports on loopback, for a daemon that must keep its ports across a
/// restart (its router's, then its forwarders' after it).
fn free_port_run(count: u16) -> u16 {
    for base in (20_000..30_000u16).step_by(7).skip((std::process::id() % 1000) as usize) {
        let held: Option<Vec<std::net::TcpListener>> =
            (0..count).map(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).ok()).collect();
        if held.is_some() {
            return base;
        }
    }
    panic!("no {count} free ports in a row");
}

/// A single daemon SIGKILLed and restarted on the same ports under `ringpost pull --stream`:
/// the CLI opens its stream again once the daemon serves, and prints what is published
/// afterwards, instead of exiting. Down longer than `--timeout`, it gives up with exit 3.
#[test]
fn cli_pull_stream_carries_on_across_a_daemon_restart() {
    let mut daemon = Daemon::prepare("reopen-restart", Vec::new(), vec!["--shards".into(), "1".into()]);
    daemon.listen_on(&format!("127.0.0.1:{}", free_port_run(2)));
    daemon.spawn();
    let client = daemon.client();
    block_on(client.create_topic("restarted")).unwrap();
    create_subscription(&client, "restarted-cli", "restarted", 10);
    let mut cli = StreamingCli::start(&daemon.address.clone(), "restarted-cli", &["--timeout", "30"]);
    let before = publish_numbered(&client, "restarted", "a", 10);
    cli.receive(&before, "before the restart");

    daemon.kill();
    std::thread::sleep(Duration::from_secs(2));
    daemon.spawn();
    let client = daemon.client();
    let after = publish_numbered(&client, "restarted", "b", 10);
    cli.receive(&after, "after the restart");
    assert!(cli.is_running());
    assert!(cli.stderr().contains("is open again"), "{}", cli.stderr());

    // Down for longer than its --timeout, the CLI gives up, saying why.
    drop(cli);
    let mut cli = StreamingCli::start(&daemon.address.clone(), "restarted-cli", &["--timeout", "2"]);
    let more = publish_numbered(&client, "restarted", "c", 1);
    cli.receive(&more, "before the stop");
    daemon.kill();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = cli.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the CLI did not give up: {}", cli.stderr());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(3), "{}", cli.stderr());
    assert!(cli.stderr().contains("not opened again within 2s"), "{}", cli.stderr());
}
