//! The client's forwarder connection pool against the real daemon: pool size, round robin, the
//! per-connection cap and the client-side queue, idle close, and refresh under load.

use ringpost_client::{block_on, Client, ErrorCode, Message, PoolSettings, Strategy, Subscription};
use ringpost_tests::Daemon;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const WAIT_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs futures concurrently on the calling thread, without a runtime: each wake-up polls every
/// unfinished one.
fn run_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    block_on(std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }));
    outputs.into_iter().map(Option::unwrap).collect()
}

fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn connect(daemon: &Daemon, settings: PoolSettings) -> Client {
    block_on(Client::connect_with(&daemon.address, settings)).expect("connecting to ringpostd")
}

fn pool(connections: usize, requests: usize) -> PoolSettings {
    PoolSettings {
        connections_per_forwarder: connections,
        requests_per_connection_max: requests,
        ..PoolSettings::default()
    }
}

fn create(client: &Client, topic: &str, subscription: &str) {
    block_on(client.create_topic(topic)).unwrap();
    block_on(client.create_subscription(Subscription {
        name: subscription.into(),
        topic: topic.into(),
        ..Default::default()
    }))
    .unwrap();
}

#[test]
fn the_pool_opens_at_most_its_size_under_400_concurrent_publishes() {
    let daemon = Daemon::start("pool-size");
    let client = connect(&daemon, PoolSettings::default());
    block_on(client.create_topic("burst")).unwrap();
    // Looks the route up once, so the burst does not make 400 lookups.
    block_on(client.publish("burst", vec![Message::new("first")])).unwrap();
    let publishes =
        (0..400).map(|index| client.publish("burst", vec![Message::new(format!("m{index}"))])).collect();
    let ids: Vec<u64> = run_all(publishes).into_iter().flat_map(|result| result.unwrap()).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 400);
    let stats = client.pool_stats();
    assert!(!stats.is_empty() && stats.len() <= 4, "{stats:#?}");
    assert!(client.pool_counters().opened <= 4, "{:?}", client.pool_counters());
    assert_eq!(stats.iter().map(|connection| connection.started).sum::<u64>(), 401);
    for connection in &stats {
        assert!(connection.in_flight_peak <= 100, "{connection:?}");
        assert_eq!(connection.in_flight, 0, "{connection:?}");
    }
}

#[test]
fn requests_go_round_robin() {
    let daemon = Daemon::start("pool-round-robin");
    let client = connect(&daemon, pool(4, 100));
    block_on(client.create_topic("turns")).unwrap();
    for index in 0..200 {
        block_on(client.publish("turns", vec![Message::new(format!("m{index}"))])).unwrap();
    }
    let stats = client.pool_stats();
    assert_eq!(stats.len(), 4, "{stats:#?}");
    for connection in &stats {
        assert!((45..=55).contains(&connection.started), "uneven spread: {stats:#?}");
    }

    // Least-in-flight keeps one request at a time on one connection.
    let client = connect(&daemon, PoolSettings { strategy: Strategy::LeastInFlight, ..pool(4, 100) });
    for index in 0..50 {
        block_on(client.publish("turns", vec![Message::new(format!("l{index}"))])).unwrap();
    }
    let stats = client.pool_stats();
    assert_eq!(stats.len(), 1, "{stats:#?}");
}

#[test]
fn a_connection_carries_at_most_its_cap_and_the_rest_queue() {
    let daemon = Daemon::start("pool-cap");
    let client = connect(&daemon, pool(1, 2));
    create(&client, "capped", "capped-sub");
    assert!(block_on(client.pull("capped-sub", 10, 0)).unwrap().is_empty());
    // Six long polls on an empty subscription: two on the wire, four waiting in the client.
    std::thread::scope(|scope| {
        let pulls = scope.spawn(|| run_all((0..6).map(|_| client.pull("capped-sub", 10, 400)).collect()));
        let on_the_wire = || client.pool_stats().iter().map(|connection| connection.in_flight).sum::<u64>();
        wait_until("two pulls on the wire and four queued", || {
            on_the_wire() == 2 && client.pool_queued() == 4
        });
        let stats = client.pool_stats();
        assert_eq!(stats.len(), 1, "{stats:#?}");
        assert_eq!(stats[0].in_flight_peak, 2, "{stats:#?}");
        for result in pulls.join().unwrap() {
            assert!(result.unwrap().is_empty());
        }
    });
    assert_eq!(client.pool_queued(), 0);

    // A publish burst: never more than two on the wire, every publish acknowledged.
    let sampling = AtomicBool::new(true);
    let in_flight_seen_max = AtomicU64::new(0);
    let queued_seen_max = AtomicU64::new(0);
    let ids: Vec<u64> = std::thread::scope(|scope| {
        scope.spawn(|| {
            while sampling.load(Ordering::Relaxed) {
                let in_flight: u64 = client.pool_stats().iter().map(|connection| connection.in_flight).sum();
                in_flight_seen_max.fetch_max(in_flight, Ordering::Relaxed);
                queued_seen_max.fetch_max(client.pool_queued() as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let publishes =
            (0..100).map(|index| client.publish("capped", vec![Message::new(format!("m{index}"))])).collect();
        let results = run_all(publishes);
        sampling.store(false, Ordering::Relaxed);
        results.into_iter().flat_map(|result| result.unwrap()).collect()
    });
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 100);
    let stats = client.pool_stats();
    assert_eq!(stats.len(), 1, "{stats:#?}");
    assert_eq!(stats[0].in_flight_peak, 2, "{stats:#?}");
    assert!(in_flight_seen_max.load(Ordering::Relaxed) <= 2);
    assert!(queued_seen_max.load(Ordering::Relaxed) > 0, "the burst never queued");
}

#[test]
fn a_full_queue_fails_at_once_with_resource_exhausted() {
    let daemon = Daemon::start("pool-queue-full");
    let client = connect(&daemon, PoolSettings { queue_requests_max: 2, ..pool(1, 1) });
    create(&client, "full", "full-sub");
    assert!(block_on(client.pull("full-sub", 10, 0)).unwrap().is_empty());
    std::thread::scope(|scope| {
        let pulls = scope.spawn(|| run_all((0..3).map(|_| client.pull("full-sub", 10, 500)).collect()));
        wait_until("two pulls queued", || client.pool_queued() == 2);
        // Refused on its first poll: no wait in the queue, no retry after a backoff.
        let mut refused = std::pin::pin!(client.pull("full-sub", 10, 0));
        let Poll::Ready(Err(error)) = refused.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("the request beyond the queue must fail at once");
        };
        assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}");
        assert!(error.to_string().contains("queue_requests_max"), "{error}");
        for result in pulls.join().unwrap() {
            assert!(result.unwrap().is_empty());
        }
    });
    assert_eq!(client.pool_counters().queue_refused, 1);
}

#[test]
fn idle_connections_close() {
    let daemon = Daemon::start("pool-idle");
    let client = connect(&daemon, PoolSettings { idle_close: Duration::from_millis(300), ..pool(2, 100) });
    block_on(client.create_topic("quiet")).unwrap();
    for index in 0..4 {
        block_on(client.publish("quiet", vec![Message::new(format!("m{index}"))])).unwrap();
    }
    let last_request = Instant::now();
    assert_eq!(client.pool_stats().len(), 2);
    wait_until("idle connections closed", || client.pool_stats().is_empty());
    assert!(last_request.elapsed() >= Duration::from_millis(300));
    assert_eq!(client.pool_counters().idle_closed, 2);
    // The next request opens a connection again.
    block_on(client.publish("quiet", vec![Message::new("again")])).unwrap();
    assert_eq!(client.pool_stats().len(), 1);
    assert_eq!(client.pool_counters().opened, 3);
}

#[test]
fn refresh_under_continuous_publishing_loses_and_duplicates_nothing() {
    const PUBLISHERS: usize = 4;
    const MESSAGES_PER_PUBLISH: usize = 5;
    const PUBLISHING: Duration = Duration::from_millis(2500);
    let daemon = Daemon::start("pool-refresh");
    let client = connect(
        &daemon,
        PoolSettings {
            refresh_period: Duration::from_millis(200),
            refresh_jitter: Duration::from_millis(20),
            ..pool(2, 100)
        },
    );
    create(&client, "renewed", "renewed-sub");
    let stop = AtomicBool::new(false);
    let draining_seen = AtomicU64::new(0);
    let (published, ids): (Vec<String>, Vec<u64>) = std::thread::scope(|scope| {
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|publisher| {
                let (client, stop) = (&client, &stop);
                scope.spawn(move || {
                    let mut published = Vec::new();
                    let mut ids = Vec::new();
                    let mut sequence = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let payloads: Vec<String> = (0..MESSAGES_PER_PUBLISH)
                            .map(|index| format!("p{publisher}-{}", sequence + index))
                            .collect();
                        sequence += MESSAGES_PER_PUBLISH;
                        let messages =
                            payloads.iter().map(|payload| Message::new(payload.as_str())).collect();
                        let acked = block_on(client.publish("renewed", messages))
                            .unwrap_or_else(|error| panic!("a publish failed during refresh: {error}"));
                        assert_eq!(acked.len(), MESSAGES_PER_PUBLISH);
                        published.extend(payloads);
                        ids.extend(acked);
                    }
                    (published, ids)
                })
            })
            .collect();
        let started = Instant::now();
        while started.elapsed() < PUBLISHING {
            let draining = client.pool_stats().iter().filter(|connection| connection.draining).count();
            draining_seen.fetch_max(draining as u64, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::Relaxed);
        let mut published = Vec::new();
        let mut ids = Vec::new();
        for publisher in publishers {
            let (payloads, acked) = publisher.join().unwrap();
            published.extend(payloads);
            ids.extend(acked);
        }
        (published, ids)
    });
    // Every publish acknowledged exactly once: one distinct id per message.
    assert_eq!(ids.len(), published.len());
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "duplicate message ids");

    let counters = client.pool_counters();
    assert!(counters.refreshed >= 4, "{counters:?}");
    assert!(counters.drained >= 1, "no refreshed connection had requests to drain: {counters:?}");
    assert_eq!(counters.drain_forced, 0, "{counters:?}");
    wait_until("drained connections closed", || {
        client.pool_stats().iter().all(|connection| !connection.draining)
    });
    assert!(client.pool_stats().len() <= 2, "{:#?}", client.pool_stats());
    eprintln!(
        "pool refresh: {} messages in {} publishes, {counters:?}, at most {} draining at once",
        published.len(),
        published.len() / MESSAGES_PER_PUBLISH,
        draining_seen.load(Ordering::Relaxed)
    );

    // And the subscription received each message once.
    let mut delivered = HashSet::new();
    let deadline = Instant::now() + WAIT_TIMEOUT;
    while delivered.len() < published.len() {
        assert!(Instant::now() < deadline, "delivered {} of {}", delivered.len(), published.len());
        let messages = block_on(client.pull("renewed-sub", 1000, 500)).unwrap();
        let mut ack_ids = Vec::new();
        for message in messages {
            let payload = String::from_utf8(message.data).unwrap();
            assert!(delivered.insert(payload.clone()), "{payload} delivered twice");
            ack_ids.push(message.ack_id);
        }
        if !ack_ids.is_empty() {
            assert!(block_on(client.acknowledge("renewed-sub", ack_ids)).unwrap().is_empty());
        }
    }
    assert_eq!(delivered, published.into_iter().collect::<HashSet<_>>());
}
