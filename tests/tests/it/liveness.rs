//! Liveness: a shard keeps serving every topic it owns while streams wait with full
//! flow-control windows, whatever happens to their leases (they expire, are nacked, extended or
//! acknowledged). A stream whose window was full once spun its shard at 100% one ack deadline
//! later, and every topic of that shard stopped answering; the streaming tests all acknowledged
//! what they received, so none ever held a full window past a deadline. Each test here runs a
//! prober beside the streams: a publisher to another topic of the same shard, one publish at a
//! time, that must be answered throughout.

use ringpost_client::{block_on, Client, Message, ReceivedMessage, StreamSettings, SubscriberSettings};
use ringpost_tests::{create_subscription, create_topic_and_subscription, within, Daemon};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The shortest ack deadline Pub/Sub allows, so that leases expire within the test.
const ACK_DEADLINE: Duration = Duration::from_secs(10);
/// Far longer than a publish takes on a serving shard (milliseconds); a frozen shard never
/// answers, so this tells the two apart without measuring speed.
const ANSWER_MAX: Duration = Duration::from_secs(5);
/// How late after its deadline an expired lease may be redelivered: the lease sweep runs every
/// second, and the machine may be busy with the tests beside this one.
const REDELIVERY_SLACK: Duration = Duration::from_secs(5);

/// Publishes to one topic, one message at a time, until stopped; remembers the slowest answer
/// and whether one never came within `ANSWER_MAX`.
struct Prober {
    stop: Arc<AtomicBool>,
    published: Arc<AtomicU64>,
    slowest: Arc<Mutex<Duration>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Prober {
    fn start(address: &str, topic: &str) -> Prober {
        let client = block_on(Client::connect(address)).unwrap();
        let (stop, published, slowest) = (Arc::new(AtomicBool::new(false)), Arc::default(), Arc::default());
        let (topic, thread_stop, thread_published, thread_slowest) =
            (topic.to_owned(), stop.clone(), Arc::clone(&published), Arc::clone(&slowest));
        let thread = std::thread::spawn(move || {
            let published: Arc<AtomicU64> = thread_published;
            let slowest: Arc<Mutex<Duration>> = thread_slowest;
            while !thread_stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let sequence = published.load(Ordering::Relaxed);
                match within(
                    ANSWER_MAX,
                    client.publish(&topic, vec![Message::new(format!("probe {sequence}"))]),
                ) {
                    None => {
                        return Err(format!("publish {sequence} to '{topic}' not answered in {ANSWER_MAX:?}"))
                    }
                    Some(Err(error)) => {
                        return Err(format!("publish {sequence} to '{topic}' failed: {error}"))
                    }
                    Some(Ok(_)) => {}
                }
                let took = started.elapsed();
                let mut worst = slowest.lock().unwrap();
                *worst = (*worst).max(took);
                drop(worst);
                published.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        });
        Prober { stop, published, slowest, thread: Some(thread) }
    }

    fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Stops it and panics if a publish went unanswered or failed.
    fn finish(mut self) -> (u64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        if let Err(why) = self.thread.take().unwrap().join().unwrap() {
            panic!("the shard stopped serving: {why}");
        }
        (self.published(), *self.slowest.lock().unwrap())
    }
}

/// The next batch of a stream, skipping empty ones, or `None` after `limit`.
fn next_batch(stream: &mut ringpost_client::MessageStream, limit: Duration) -> Option<Vec<ReceivedMessage>> {
    let until = Instant::now() + limit;
    loop {
        let left = until.checked_duration_since(Instant::now())?;
        match within(left, stream.next())? {
            Some(Ok(batch)) if batch.is_empty() => continue,
            Some(Ok(batch)) => return Some(batch),
            Some(Err(error)) => panic!("the stream failed: {error}"),
            None => panic!("the server ended the stream"),
        }
    }
}

/// Runs the CLI against the daemon; panics if it has not exited after `limit`.
fn cli_within(daemon: &Daemon, args: &[&str], limit: Duration) -> std::process::Output {
    let mut child = std::process::Command::new(ringpost_tests::binary("ringpost"))
        .arg("--server")
        .arg(&daemon.address)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`ringpost {}` not answered in {limit:?}: the shard stopped serving", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn data(message: &ReceivedMessage) -> String {
    String::from_utf8_lossy(&message.data).into_owned()
}

fn window(messages: u64) -> StreamSettings {
    StreamSettings { max_outstanding_messages: messages, ..StreamSettings::default() }
}

/// One forwarder shard, so every topic shares it. Streams of windows 3 and 1 fill up and never
/// acknowledge until their leases expire; others nack, extend and acknowledge. Throughout, the
/// prober's publishes to another topic are answered, the stats are answered, each expired
/// message comes back after its deadline (on the stream that held it, once that stream has room
/// again, or on another stream of the subscription), an extended one not before its extension
/// ends, and a nacked one at once.
#[test]
fn full_stream_windows_whose_leases_expire_keep_the_shard_serving() {
    let daemon = Daemon::start_with("liveness-windows", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = daemon.client();
    create_topic_and_subscription(&client, "probe", "probe-sub", 10);
    create_topic_and_subscription(&client, "held", "held-three", ACK_DEADLINE.as_secs() as u32);
    create_subscription(&client, "held-one", "held", ACK_DEADLINE.as_secs() as u32);
    let prober = Prober::start(&daemon.address, "probe");
    block_on(client.publish("held", (0..3).map(|i| Message::new(format!("m{i}"))).collect())).unwrap();

    // Window 3: takes all three and holds them past their deadline.
    let mut three = block_on(client.streaming_pull("held-three", window(3))).unwrap();
    let mut first = Vec::new();
    while first.len() < 3 {
        first.extend(next_batch(&mut three, ANSWER_MAX).expect("the window-3 stream got its messages"));
    }
    let received_at = Instant::now();
    assert!(first.iter().all(|message| message.delivery_attempt == 1));

    // Window 1, two streams: one nacks (the message comes back at once), then extends; the
    // other holds its message until the lease expires.
    let mut nacking = block_on(client.streaming_pull("held-one", window(1))).unwrap();
    let mut holding = block_on(client.streaming_pull("held-one", window(1))).unwrap();
    let nacked = next_batch(&mut nacking, ANSWER_MAX).expect("the first window-1 stream got a message");
    let held = next_batch(&mut holding, ANSWER_MAX).expect("the second window-1 stream got a message");
    assert_eq!((nacked.len(), held.len()), (1, 1));
    let refused = block_on(client.nack("held-one", vec![nacked[0].ack_id.clone()])).unwrap();
    assert!(refused.is_empty(), "{refused:?}");
    let again = next_batch(&mut nacking, ANSWER_MAX).expect("a nacked message comes back at once");
    assert_eq!((data(&again[0]), again[0].delivery_attempt), (data(&nacked[0]), 2));
    let extension_seconds = 25;
    let extended_at = Instant::now();
    let refused =
        block_on(client.modify_ack_deadline("held-one", vec![again[0].ack_id.clone()], extension_seconds))
            .unwrap();
    assert!(refused.is_empty(), "{refused:?}");

    // Past the deadline: the window-3 stream had no room, yet its leases are taken back and it
    // receives the same three again; the shard went on answering all along.
    let mut redelivered = Vec::new();
    while redelivered.len() < 3 {
        let batch = next_batch(&mut three, ACK_DEADLINE + REDELIVERY_SLACK * 2)
            .expect("the full window-3 stream sees its expired messages again");
        redelivered.extend(batch);
    }
    let waited = received_at.elapsed();
    assert!(
        waited + Duration::from_secs(1) >= ACK_DEADLINE,
        "redelivered after {waited:?}, before the deadline"
    );
    let mut names: Vec<String> = redelivered.iter().map(data).collect();
    names.sort();
    assert_eq!(names, ["m0", "m1", "m2"]);
    assert!(redelivered.iter().all(|message| message.delivery_attempt == 2), "{redelivered:?}");
    let stats = within(ANSWER_MAX, client.stats()).expect("stats answered beside full streams");
    stats.unwrap();

    // The held window-1 message expired too and comes back on its stream (it has room again).
    let back =
        next_batch(&mut holding, REDELIVERY_SLACK).expect("the expired window-1 message is redelivered");
    assert_eq!((data(&back[0]), back[0].delivery_attempt), (data(&held[0]), 2));
    // The extended one is not redelivered before its extension ends.
    assert!(extended_at.elapsed() < Duration::from_secs(extension_seconds as u64));
    let early = next_batch(&mut nacking, Duration::from_millis(500));
    assert!(early.is_none(), "an extended lease came back early: {early:?}");

    // Acknowledging frees the windows: the third message of held-one goes out.
    let acked: Vec<String> = redelivered.iter().map(|message| message.ack_id.clone()).collect();
    assert!(block_on(client.acknowledge("held-three", acked)).unwrap().is_empty());
    let both = vec![again[0].ack_id.clone(), back[0].ack_id.clone()];
    assert!(block_on(client.acknowledge("held-one", both)).unwrap().is_empty());
    let mut rest = next_batch(&mut nacking, ANSWER_MAX).or_else(|| next_batch(&mut holding, ANSWER_MAX));
    let last = rest.take().expect("the last message goes out once a window frees");
    let mut seen = vec![data(&again[0]), data(&back[0]), data(&last[0])];
    seen.sort();
    assert_eq!(seen, ["m0", "m1", "m2"]);

    let (published, slowest) = prober.finish();
    eprintln!("prober: {published} publishes beside the full streams, slowest {slowest:?}");
    assert!(published > 0);
}

/// The reproduction as a user runs it: `ringpost pull --stream --max 3` holds three messages
/// and acknowledges none; one deadline later they come back on the same stream, and publishing
/// to the same topic is answered throughout.
#[test]
fn a_cli_stream_holding_its_window_past_the_deadline_leaves_the_topic_serving() {
    let daemon = Daemon::start("liveness-cli");
    ringpost_tests::succeeded(&daemon.cli(&["topic", "create", "lock-topic"]));
    ringpost_tests::succeeded(&daemon.cli(&["sub", "create", "lock-sub", "--topic", "lock-topic"]));
    for message in ["m1", "m2", "m3"] {
        ringpost_tests::succeeded(&daemon.cli(&["publish", "lock-topic", message]));
    }
    let mut child = std::process::Command::new(ringpost_tests::binary("ringpost"))
        .args(["--server", &daemon.address, "pull", "lock-sub", "--stream", "--max", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().take(6).map(|line| line.unwrap()).collect::<Vec<String>>()
    });
    let prober = Prober::start(&daemon.address, "lock-topic");
    let started = Instant::now();
    // Past the deadline and well into the time the shard used to spin.
    while started.elapsed() < ACK_DEADLINE + Duration::from_secs(4) {
        let publish = cli_within(&daemon, &["publish", "lock-topic", "after"], ANSWER_MAX);
        ringpost_tests::succeeded(&publish);
        std::thread::sleep(Duration::from_millis(500));
    }
    let deadline = Instant::now() + REDELIVERY_SLACK * 2;
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let finished = reader.is_finished();
    let _ = child.kill();
    let _ = child.wait();
    assert!(finished, "the stream did not see its three messages again");
    let lines = reader.join().unwrap();
    let attempts: Vec<bool> = lines.iter().map(|line| line.contains("\"delivery_attempt\":2")).collect();
    assert_eq!(attempts, [false, false, false, true, true, true], "{lines:#?}");
    let (published, _) = prober.finish();
    assert!(published > 0);
}

/// The client library's subscriber with a window of one, a handler that holds its message
/// beyond `max_lease_duration` and then beyond the stream's deadline: the lease stops being
/// extended, the server takes it back and redelivers it, and the shard serves a publisher of
/// another topic throughout.
#[test]
fn a_subscriber_holding_past_its_max_lease_leaves_the_shard_serving() {
    let daemon = Daemon::start_with("liveness-lease", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = Arc::new(daemon.client());
    create_topic_and_subscription(&client, "probe", "probe-sub", 10);
    create_topic_and_subscription(&client, "slow", "slow-sub", ACK_DEADLINE.as_secs() as u32);
    block_on(client.publish("slow", vec![Message::new("slow work")])).unwrap();
    let prober = Prober::start(&daemon.address, "probe");
    let settings = SubscriberSettings {
        max_outstanding_messages: 1,
        workers: 2,
        max_lease_duration: Duration::from_secs(1),
        ..SubscriberSettings::default()
    };
    let subscriber = ringpost_client::Subscriber::new(client.clone(), "slow-sub", settings).unwrap();
    let attempts: Arc<Mutex<Vec<(u32, Instant)>>> = Arc::default();
    let seen = attempts.clone();
    subscriber
        .run(move |message, handle| {
            seen.lock().unwrap().push((message.delivery_attempt, Instant::now()));
            if message.delivery_attempt == 1 {
                // Held past the max lease and the deadline; the redelivery goes to the other
                // worker meanwhile.
                std::thread::sleep(ACK_DEADLINE + REDELIVERY_SLACK * 2);
            }
            handle.ack();
        })
        .unwrap();
    let started = Instant::now();
    while attempts.lock().unwrap().len() < 2 && started.elapsed() < ACK_DEADLINE + REDELIVERY_SLACK * 2 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 2, "the message held past its max lease was redelivered: {attempts:?}");
    assert_eq!((attempts[0].0, attempts[1].0), (1, 2));
    let gap = attempts[1].1 - attempts[0].1;
    assert!(gap + Duration::from_secs(1) >= ACK_DEADLINE, "redelivered after {gap:?}");
    assert!(subscriber.stats().lease_expired >= 1);
    let (published, slowest) = prober.finish();
    eprintln!("prober: {published} publishes beside the held subscriber, slowest {slowest:?}");
    block_on(subscriber.shutdown(ringpost_client::ShutdownMode::NackImmediately)).unwrap();
}
