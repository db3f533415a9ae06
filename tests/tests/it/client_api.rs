//! The high-level client API against the real daemon: the batching `Publisher` (batch limits,
//! flow control, ordering keys) and the `Subscriber` (lease extension, graceful shutdown, the
//! stream API, flow control), and the examples in `client/examples/`.

use ringpost_client::{
    block_on, timer, AckHandle, BatchSettings, Client, ErrorCode, LimitExceededBehavior, Message,
    PublishFlowControl, Publisher, PublisherSettings, ShutdownMode, StreamSettings, Subscriber,
    SubscriberSettings,
};
use ringpost_tests::{create_subscription, Daemon};
use std::future::Future;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

fn connect(daemon: &Daemon) -> Arc<Client> {
    Arc::new(daemon.client())
}

/// Requests the client's forwarder pools have sent so far (publish, pull, ack, ...).
fn requests_started(client: &Client) -> u64 {
    client.pool_stats().iter().map(|connection| connection.started).sum()
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::pin::Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Waits up to `timeout` for `done`, panicking with `what` if it never holds.
fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn publisher(client: &Arc<Client>, topic: &str, batch: BatchSettings, flow: PublishFlowControl) -> Publisher {
    let settings = PublisherSettings { batch, flow_control: flow, ..PublisherSettings::default() };
    Publisher::new(client.clone(), topic, settings).unwrap()
}

/// Batches go out when the count or byte limit is reached, at once, and otherwise after the
/// delay and not before. Requests are counted on the client's connection pool.
#[test]
fn publisher_batches_by_count_bytes_and_delay() {
    let daemon = Daemon::start("client-batching");
    let admin = daemon.client();
    for topic in ["by-count", "by-bytes", "by-delay"] {
        block_on(admin.create_topic(topic)).unwrap();
    }
    let long = Duration::from_secs(10);

    // 250 messages with a count limit of 100: two full batches go at once, the rest waits for
    // the delay (or, here, the flush): three requests.
    let client = connect(&daemon);
    let by_count = publisher(
        &client,
        "by-count",
        BatchSettings { max_messages: 100, max_bytes: 1_000_000, max_delay: long },
        PublishFlowControl::default(),
    );
    let futures: Vec<_> = (0..250).map(|i| by_count.publish(Message::new(format!("m{i}")))).collect();
    wait_for("two full batches", Duration::from_secs(5), || requests_started(&client) == 2);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(requests_started(&client), 2, "the partial batch waits for its delay");
    block_on(by_count.flush());
    assert_eq!(requests_started(&client), 3);
    let mut ids: Vec<u64> = futures.into_iter().map(|future| block_on(future).unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 250, "one distinct id per message");

    // 300-byte messages with a byte limit of 1000: three per batch.
    let client = connect(&daemon);
    let by_bytes = publisher(
        &client,
        "by-bytes",
        BatchSettings { max_messages: 100, max_bytes: 1000, max_delay: long },
        PublishFlowControl::default(),
    );
    let futures: Vec<_> = (0..10).map(|_| by_bytes.publish(Message::new(vec![b'b'; 300]))).collect();
    wait_for("three full batches", Duration::from_secs(5), || requests_started(&client) == 3);
    block_on(by_bytes.flush());
    assert_eq!(requests_started(&client), 4, "3 + 3 + 3 + 1");
    for future in futures {
        block_on(future).unwrap();
    }

    // A lone message goes after the delay, not before.
    let client = connect(&daemon);
    let delay = Duration::from_millis(300);
    let by_delay = publisher(
        &client,
        "by-delay",
        BatchSettings { max_messages: 100, max_bytes: 1_000_000, max_delay: delay },
        PublishFlowControl::default(),
    );
    let started = Instant::now();
    let mut future = by_delay.publish(Message::new("alone"));
    std::thread::sleep(delay / 2);
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(requests_started(&client), 0, "sent before its delay");
    block_on(future).unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= delay && elapsed < delay + Duration::from_secs(3), "published after {elapsed:?}");
    assert_eq!(requests_started(&client), 1);
    block_on(by_delay.shutdown());
    let refused = by_delay.publish(Message::new("late"));
    assert_eq!(block_on(refused).unwrap_err().code(), ErrorCode::FailedPrecondition);
}

/// Publisher flow control: `Block` keeps the future pending while the window is full and
/// completes it once the window frees; `Error` fails at once; a message that could never fit
/// is refused at once, even with `Block`.
#[test]
fn publisher_flow_control_blocks_or_errors_and_refuses_oversized_messages() {
    let daemon = Daemon::start("client-flow");
    let client = connect(&daemon);
    block_on(client.create_topic("flow")).unwrap();
    let delay = Duration::from_millis(400);
    let batch = BatchSettings { max_messages: 100, max_bytes: 1_000_000, max_delay: delay };
    let window = |behavior| PublishFlowControl {
        max_outstanding_messages: 2,
        max_outstanding_bytes: 1000,
        limit_exceeded_behavior: behavior,
    };

    // Two messages fill the window and wait out the batch delay; the third waits for them.
    let blocking = publisher(&client, "flow", batch, window(LimitExceededBehavior::Block));
    let started = Instant::now();
    let first = blocking.publish(Message::new("1"));
    let second = blocking.publish(Message::new("2"));
    let mut third = blocking.publish(Message::new("3"));
    assert!(poll_once(&mut third).is_pending());
    std::thread::sleep(delay / 2);
    assert!(poll_once(&mut third).is_pending(), "published while the window was full");
    let third_id = block_on(third).unwrap();
    let elapsed = started.elapsed();
    let (first_id, second_id) = (block_on(first).unwrap(), block_on(second).unwrap());
    assert!(first_id < second_id && second_id < third_id, "{first_id} {second_id} {third_id}");
    assert!(elapsed >= 2 * delay, "the third message went in a second batch, after {elapsed:?}");

    // A message larger than the byte window never fits: refused at once, not blocked forever.
    let mut too_big = blocking.publish(Message::new(vec![b'x'; 1001]));
    match poll_once(&mut too_big) {
        Poll::Ready(Err(error)) => {
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
            assert!(error.to_string().contains("max_outstanding_bytes"), "{error}");
        }
        _ => panic!("a message larger than the window was not refused at once"),
    }
    let unlimited = publisher(
        &client,
        "flow",
        batch,
        PublishFlowControl { max_outstanding_bytes: 0, ..PublishFlowControl::default() },
    );
    let mut over_limit =
        unlimited.publish(Message::new(vec![b'x'; ringpost_wire::limits::MESSAGE_BYTES_MAX + 1]));
    match poll_once(&mut over_limit) {
        Poll::Ready(Err(error)) => {
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{error}");
            assert!(error.to_string().contains("MESSAGE_BYTES_MAX"), "{error}");
        }
        _ => panic!("a message over MESSAGE_BYTES_MAX was not refused at once"),
    }

    // `Error`: the third fails at once with ResourceExhausted; once the window frees, publishing
    // works again.
    let failing = publisher(&client, "flow", batch, window(LimitExceededBehavior::Error));
    let kept = [failing.publish(Message::new("a")), failing.publish(Message::new("b"))];
    let mut refused = failing.publish(Message::new("c"));
    match poll_once(&mut refused) {
        Poll::Ready(Err(error)) => assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}"),
        _ => panic!("a publish over the window did not fail at once"),
    }
    block_on(failing.flush());
    for future in kept {
        block_on(future).unwrap();
    }
    block_on(failing.publish(Message::new("d"))).unwrap();
}

/// Ordering keys: one key's messages keep their order; a failure pauses that key only, until
/// `resume_publish`.
#[test]
fn ordering_keys_pause_after_a_failure_until_resumed() {
    let daemon = Daemon::start("client-ordering");
    let admin = daemon.client();
    block_on(admin.create_topic("ordered")).unwrap();
    let client = connect(&daemon);
    let settings = PublisherSettings {
        batch: BatchSettings { max_messages: 1, ..BatchSettings::default() },
        ..PublisherSettings::default()
    };
    let publisher = Publisher::new(client, "ordered", settings).unwrap();
    let keyed = |key: &str, data: &str| publisher.publish(Message::new(data).ordering_key(key));

    // Batches of one message each, one in flight per key: ids follow publish order.
    let futures: Vec<_> = (0..20).map(|i| keyed("k", &format!("k{i}"))).collect();
    let ids: Vec<u64> = futures.into_iter().map(|future| block_on(future).unwrap()).collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");

    // A message the server would refuse pauses its key at once; other keys carry on.
    let oversized = Message::new(vec![b'x'; ringpost_wire::limits::MESSAGE_BYTES_MAX + 1]).ordering_key("k");
    assert_eq!(block_on(publisher.publish(oversized)).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert!(publisher.is_paused("k"));
    let mut paused = keyed("k", "after the failure");
    match poll_once(&mut paused) {
        Poll::Ready(Err(error)) => assert_eq!(error.code(), ErrorCode::FailedPrecondition, "{error}"),
        _ => panic!("a publish with a paused key did not fail at once"),
    }
    block_on(keyed("j", "another key")).unwrap();
    block_on(publisher.publish(Message::new("no key"))).unwrap();
    publisher.resume_publish("k");
    block_on(keyed("k", "resumed")).unwrap();

    // A publish the server fails (the topic is gone) pauses the key too.
    block_on(admin.delete_topic("ordered")).unwrap();
    let error = block_on(keyed("k", "to a deleted topic")).unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound, "{error}");
    assert_eq!(block_on(keyed("k", "still paused")).unwrap_err().code(), ErrorCode::FailedPrecondition);
    block_on(admin.create_topic("ordered")).unwrap();
    assert_eq!(block_on(keyed("k", "still paused")).unwrap_err().code(), ErrorCode::FailedPrecondition);
    block_on(keyed("j", "j was not paused by k")).unwrap();
    publisher.resume_publish("k");
    block_on(keyed("k", "resumed again")).unwrap();
    block_on(publisher.shutdown());
}

/// A handler that takes 25 s on a subscription with a 10 s ack deadline keeps its message: the
/// subscriber extends the lease, the message is delivered once, and the late ack is accepted.
#[test]
fn leases_are_extended_while_a_handler_works() {
    const WORK: Duration = Duration::from_secs(25);
    let daemon = Daemon::start("client-lease");
    let client = connect(&daemon);
    block_on(client.create_topic("slow")).unwrap();
    create_subscription(&client, "slow-sub", "slow", 10);
    block_on(client.publish("slow", vec![Message::new("take your time")])).unwrap();

    let deliveries = Arc::new(AtomicU64::new(0));
    let counted = deliveries.clone();
    let subscriber = Subscriber::new(client.clone(), "slow-sub", SubscriberSettings::default()).unwrap();
    subscriber
        .run(move |_message, handle| {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(WORK);
            handle.ack();
        })
        .unwrap();
    wait_for("the ack", WORK + Duration::from_secs(15), || subscriber.stats().acked >= 1);
    // Leave time for a redelivery to show, had the lease lapsed.
    std::thread::sleep(Duration::from_millis(500));
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    let stats = subscriber.stats();
    assert_eq!(deliveries.load(Ordering::SeqCst), 1, "redelivered while being handled: {stats:?}");
    assert!(stats.extended >= 2, "extensions at ~8 s, ~16 s and ~24 s: {stats:?}");
    assert_eq!((stats.refused, stats.failed), (0, 0), "{stats:?}");
    let again = block_on(client.pull("slow-sub", 10, 0)).unwrap();
    assert!(again.is_empty(), "acked after 25 s yet delivered again: {again:?}");
}

/// `WaitForProcessing` sends the acks before it closes the stream: messages acked just
/// before shutdown are not redelivered. `NackImmediately` gives held messages back at once.
#[test]
fn shutdown_flushes_acks_or_nacks_immediately() {
    let daemon = Daemon::start("client-shutdown");
    let client = connect(&daemon);
    block_on(client.create_topic("closing")).unwrap();
    // A deadline of 600 s: a message comes back within the test only if it was nacked or
    // released with its stream, never by expiry.
    create_subscription(&client, "closing-acked", "closing", 600);
    create_subscription(&client, "closing-held", "closing", 600);
    block_on(client.publish("closing", (0..50).map(|i| Message::new(format!("m{i}"))).collect())).unwrap();

    // The messages are acked together just before shutdown, so their acks are still queued
    // when it begins; meanwhile a second subscriber waits for anything given back.
    let held: Arc<Mutex<Vec<AckHandle>>> = Arc::default();
    let keep = held.clone();
    let subscriber = Subscriber::new(client.clone(), "closing-acked", SubscriberSettings::default()).unwrap();
    subscriber.run(move |_message, handle| keep.lock().unwrap().push(handle)).unwrap();
    wait_for("50 messages held", Duration::from_secs(10), || held.lock().unwrap().len() == 50);
    let mut competitor = block_on(client.streaming_pull("closing-acked", StreamSettings::default())).unwrap();
    held.lock().unwrap().drain(..).for_each(AckHandle::ack);
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    let stats = subscriber.stats();
    assert_eq!((stats.received, stats.acked, stats.refused, stats.failed), (50, 50, 0, 0), "{stats:?}");
    let mut redelivered = 0;
    while let Some(batch) = block_on(with_timeout(competitor.next(), Duration::from_secs(1))) {
        redelivered += batch.expect("the stream ends").unwrap().len();
    }
    assert_eq!(redelivered, 0, "messages acked before shutdown went to another subscriber");
    drop(competitor);
    assert!(block_on(client.pull("closing-acked", 100, 500)).unwrap().is_empty());

    // Handles kept by the application are nacked by `NackImmediately`, and delivered again.
    let held: Arc<Mutex<Vec<AckHandle>>> = Arc::default();
    let keep = held.clone();
    let subscriber = Subscriber::new(client.clone(), "closing-held", SubscriberSettings::default()).unwrap();
    subscriber.run(move |_message, handle| keep.lock().unwrap().push(handle)).unwrap();
    wait_for("50 messages held", Duration::from_secs(10), || held.lock().unwrap().len() == 50);
    let started = Instant::now();
    block_on(subscriber.shutdown(ShutdownMode::NackImmediately)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "shutdown took {:?}", started.elapsed());
    assert_eq!(subscriber.stats().nacked, 50);
    // Settling a handle after shutdown nacked it does nothing.
    held.lock().unwrap().drain(..).for_each(AckHandle::ack);
    assert_eq!(subscriber.stats().acked, 0);
    let mut again = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while again < 50 && Instant::now() < deadline {
        let batch = block_on(client.pull("closing-held", 100, 500)).unwrap();
        again += batch.len();
        block_on(client.acknowledge("closing-held", batch.into_iter().map(|m| m.ack_id).collect())).unwrap();
    }
    assert_eq!(again, 50, "nacked messages are delivered again");
}

/// The stream API (`next`), and flow control: with a window of 3, the server sends no fourth
/// message until one is settled.
#[test]
fn stream_api_and_subscriber_flow_control() {
    let daemon = Daemon::start("client-stream-api");
    let client = connect(&daemon);
    block_on(client.create_topic("items")).unwrap();
    create_subscription(&client, "items-next", "items", 600);
    create_subscription(&client, "items-window", "items", 600);
    block_on(client.publish("items", (0..10).map(|i| Message::new(format!("item {i}"))).collect())).unwrap();

    let subscriber = Subscriber::new(client.clone(), "items-next", SubscriberSettings::default()).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let next = block_on(with_timeout(subscriber.next(), Duration::from_secs(10)));
        let (message, handle) = next.expect("a message within 10 s").expect("not the end").unwrap();
        seen.push(String::from_utf8(message.data).unwrap());
        handle.ack();
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 10);
    let error = subscriber.run(|_, _| {}).unwrap_err();
    assert_eq!(error.code(), ErrorCode::FailedPrecondition, "{error}");
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    assert!(block_on(subscriber.next()).is_none(), "next after shutdown ends the stream");
    assert!(block_on(client.pull("items-next", 100, 500)).unwrap().is_empty(), "acked messages came back");

    let settings = SubscriberSettings { max_outstanding_messages: 3, ..SubscriberSettings::default() };
    let held: Arc<Mutex<Vec<AckHandle>>> = Arc::default();
    let keep = held.clone();
    let subscriber = Subscriber::new(client.clone(), "items-window", settings).unwrap();
    subscriber.run(move |_message, handle| keep.lock().unwrap().push(handle)).unwrap();
    wait_for("a full window", Duration::from_secs(10), || held.lock().unwrap().len() == 3);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(subscriber.stats().received, 3, "the window of 3 was exceeded");
    let started = Instant::now();
    while subscriber.stats().acked < 10 {
        assert!(started.elapsed() < Duration::from_secs(10), "stalled: {:?}", subscriber.stats());
        let settled: Vec<AckHandle> = held.lock().unwrap().drain(..).collect();
        settled.into_iter().for_each(AckHandle::ack);
        std::thread::sleep(Duration::from_millis(10));
    }
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    assert_eq!(subscriber.stats().received, 10);

    // A failure no retry mends ends the stream: reported once, then the end.
    let missing = Subscriber::new(client.clone(), "no-such-sub", SubscriberSettings::default()).unwrap();
    let error = block_on(missing.next()).expect("the failure").unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound, "{error}");
    assert!(block_on(missing.next()).is_none());
    assert_eq!(block_on(missing.stopped()).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(
        block_on(missing.shutdown(ShutdownMode::WaitForProcessing)).unwrap_err().code(),
        ErrorCode::NotFound
    );
}

/// Acks go out a quarter of the flow-control window at a time, so the window never empties
/// waiting for a whole window of acks (or for the flush interval) before the stream may send
/// more: 400 messages through a window of 40 take at least 40 acknowledge requests, where
/// batching by the window would send about 10.
#[test]
fn acks_go_out_a_quarter_window_at_a_time() {
    let daemon = Daemon::start("client-ack-batches");
    let client = connect(&daemon);
    block_on(client.create_topic("quarters")).unwrap();
    create_subscription(&client, "quarters-sub", "quarters", 600);
    for chunk in 0..4 {
        let messages = (0..100).map(|i| Message::new(format!("message {}", chunk * 100 + i))).collect();
        block_on(client.publish("quarters", messages)).unwrap();
    }
    let before = requests_started(&client);
    let settings = SubscriberSettings { max_outstanding_messages: 40, ..SubscriberSettings::default() };
    let subscriber = Subscriber::new(client.clone(), "quarters-sub", settings).unwrap();
    subscriber.run(|_message, handle| handle.ack()).unwrap();
    wait_for("every message acknowledged", Duration::from_secs(30), || subscriber.stats().acked >= 400);
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing)).unwrap();
    let stats = subscriber.stats();
    assert_eq!((stats.acked, stats.failed, stats.refused), (400, 0, 0), "{stats:?}");
    // The forwarder pools carry the acks only: the subscription lookup goes to the router and
    // the stream has a connection of its own.
    let acknowledge_requests = requests_started(&client) - before;
    assert!(acknowledge_requests >= 40, "{acknowledge_requests} acknowledge requests for 400 acks");
    assert!(block_on(client.pull("quarters-sub", 100, 500)).unwrap().is_empty(), "acked messages came back");
}

/// The first output of two futures, or `None` if `timeout` passed first.
async fn with_timeout<F: Future>(future: F, timeout: Duration) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut sleep = std::pin::pin!(timer::sleep(timeout));
    std::future::poll_fn(|context| {
        if let Poll::Ready(output) = future.as_mut().poll(context) {
            return Poll::Ready(Some(output));
        }
        sleep.as_mut().poll(context).map(|_| None)
    })
    .await
}

/// The path of an example binary of `ringpost-client`, built once per test process.
fn example(name: &str) -> std::path::PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let executable = std::env::current_exe().unwrap();
    let profile_directory = executable.parent().and_then(std::path::Path::parent).unwrap().to_path_buf();
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut command = Command::new(cargo);
        command.args(["build", "--quiet", "-p", "ringpost-client", "--examples"]);
        if profile_directory.file_name().is_some_and(|profile| profile == "release") {
            command.arg("--release");
        }
        assert!(command.status().unwrap().success(), "building the client examples failed");
    });
    let path = profile_directory.join("examples").join(name);
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

fn output_of(child: std::process::Child) -> String {
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "example failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `subscribe` waits on its subscription while `publish` sends 5 messages; `ordering` shows
/// every key in order.
#[test]
fn examples_run_against_a_daemon() {
    let daemon = Daemon::start("client-examples");
    let (publish, subscribe, ordering) = (example("publish"), example("subscribe"), example("ordering"));
    let client = daemon.client();
    let run = |path: &std::path::Path, args: &[&str]| {
        Command::new(path)
            .arg(&daemon.address)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    let subscriber = run(&subscribe, &["5", "examples-sub", "examples", "30"]);
    wait_for("the example's subscription", Duration::from_secs(20), || {
        block_on(client.get_subscription("examples-sub")).is_ok()
    });
    let published = output_of(run(&publish, &["5", "examples"]));
    for i in 0..5 {
        assert!(published.contains(&format!("published message {i} as id ")), "{published}");
    }
    let received = output_of(subscriber);
    assert!(received.contains("created subscription examples-sub on examples"), "{received}");
    for i in 0..5 {
        assert!(received.contains(&format!(": message {i}\n")), "message {i} missing:\n{received}");
    }
    assert!(received.contains("received 5 messages, acked 5"), "{received}");

    let ordered = output_of(run(&ordering, &["3", "4"]));
    for key in 0..3 {
        assert!(ordered.contains(&format!("key-{key}: 0 1 2 3 (in order)")), "{ordered}");
    }
    assert!(ordered.contains("every key arrived in publish order"), "{ordered}");

    // The address also comes from RINGPOST_SERVER.
    let from_env = Command::new(&publish)
        .args(["2", "examples"])
        .env("RINGPOST_SERVER", &daemon.address)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(output_of(from_env).contains("published 2 messages to examples"));
}
