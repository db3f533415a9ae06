//! Stopping and signals: SIGTERM stops the daemon gracefully (requests running are answered,
//! streams end with a status clients retry on, exit 0), SIGHUP does not stop it, and bad
//! listening ports are refused with an error rather than a panic.

use nix::sys::signal::Signal;
use ringpost_client::{block_on, Client, ErrorCode, Message, RetrySettings, StreamSettings};
use ringpost_tests::{create_topic_and_subscription, drain, failed, Daemon};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The daemon's grace for a stop is 10 s; the machine may be busy with other tests.
const EXIT_MAX: Duration = Duration::from_secs(20);

#[test]
fn sigterm_answers_what_runs_ends_streams_retryably_and_exits_zero() {
    let mut daemon = Daemon::start("shutdown-term");
    let client = daemon.client();
    create_topic_and_subscription(&client, "stopping", "stopping-sub", 60);
    create_topic_and_subscription(&client, "quiet", "quiet-sub", 60);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let publishers: Vec<_> = (0..4)
        .map(|publisher| {
            let (address, stop, acked) = (daemon.address.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || {
                // Pub/Sub's retries without the floor of retries a failover needs: a stopped
                // daemon's refusals come back after five attempts, not ten seconds.
                let retry = RetrySettings { retry_for_min: Duration::ZERO, ..RetrySettings::PUBLISH };
                let client =
                    block_on(Client::connect(&address)).unwrap().with_retry(retry, RetrySettings::SUBSCRIBE);
                let mut refused = 0;
                let mut sequence = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let messages =
                        (0..10).map(|i| Message::new(format!("{publisher}-{}", sequence * 10 + i))).collect();
                    sequence += 1;
                    match block_on(client.publish("stopping", messages)) {
                        Ok(ids) => acked.lock().unwrap().extend(ids),
                        // After the stop: refused connections, or Unavailable.
                        Err(error) => {
                            assert_eq!(error.code(), ErrorCode::Unavailable, "{error}");
                            refused += 1;
                            if refused > 3 {
                                return;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let mut stream = block_on(client.streaming_pull("quiet-sub", StreamSettings::default())).unwrap();
    let waiting = {
        let address = daemon.address.clone();
        std::thread::spawn(move || {
            let client = block_on(Client::connect(&address)).unwrap();
            let started = Instant::now();
            let pulled = block_on(client.pull("quiet-sub", 10, 30_000));
            (pulled.map(|messages| messages.len()), started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!acked.lock().unwrap().is_empty(), "the publishers published before the stop");

    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_for_exit(EXIT_MAX).expect("ringpostd stopped after SIGTERM");
    stop.store(true, Ordering::Relaxed);
    assert!(status.success(), "ringpostd exited with {status}; log:\n{}", daemon.log());
    let log = daemon.log();
    assert!(log.contains("SIGTERM: stopping"), "{log}");
    assert!(log.contains("ringpostd: stopped in"), "{log}");

    // The open stream ended with a status the clients retry on, not as if it had asked.
    match block_on(stream.next()) {
        Some(Err(error)) => assert_eq!(error.code(), ErrorCode::Unavailable, "{error}"),
        other => panic!("the stream ended with {other:?}"),
    }
    // The pull waiting for messages was answered at the stop, long before its wait ended.
    let (pulled, took) = waiting.join().unwrap();
    assert_eq!(pulled.unwrap(), 0);
    assert!(took < Duration::from_secs(25), "the waiting pull was held {took:?}");
    for publisher in publishers {
        publisher.join().unwrap();
    }

    // Every publish answered Ok is there after the restart.
    daemon.restart();
    let client = daemon.client();
    let delivered = drain(&client, "stopping-sub", true);
    let acked = acked.lock().unwrap();
    let lost: Vec<&u64> = acked.iter().filter(|id| !delivered.contains_key(id)).take(5).collect();
    assert!(lost.is_empty(), "{} acknowledged publishes lost, e.g. {lost:?}", acked.len() - delivered.len());
    eprintln!("{} publishes acknowledged before the stop, all delivered after it", acked.len());
}

#[test]
fn sighup_does_not_stop_the_daemon() {
    let daemon = Daemon::start("shutdown-hup");
    let client = daemon.client();
    client_creates(&client, "hangup");
    daemon.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(block_on(client.publish("hangup", vec![Message::new("still here")])).unwrap().len(), 1);
    assert!(daemon.log().contains("SIGHUP ignored"), "{}", daemon.log());
}

fn client_creates(client: &Client, topic: &str) {
    block_on(client.create_topic(topic)).unwrap();
}

/// The forwarders take the ports after the router's: a router port too close to 65535 is an
/// error that says so, not an overflow panic; a name to listen on is resolved.
#[test]
fn listening_ports_beyond_65535_are_refused_and_names_resolve() {
    let directory = ringpost_tests::temporary_directory("shutdown-ports");
    let ringpostd = ringpost_tests::binary("ringpostd");
    let output = std::process::Command::new(&ringpostd)
        .args([
            "--listen",
            "127.0.0.1:65535",
            "--grpc-listen",
            "off",
            "--http-listen",
            "off",
            "--shards",
            "2",
            "--no-pin",
            "--data-dir",
        ])
        .arg(directory.join("data"))
        .output()
        .unwrap();
    let text = failed(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("beyond 65535") && text.contains("at most 65533"), "{text}");
    assert!(!text.contains("panicked"), "{text}");

    let output = std::process::Command::new(&ringpostd)
        .args(["--listen", "no-such-host.invalid:7450", "--data-dir"])
        .arg(directory.join("data"))
        .output()
        .unwrap();
    let text = failed(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("does not resolve"), "{text}");
    let _ = std::fs::remove_dir_all(&directory);
}

/// `--advertise` names the host clients are told to reach the forwarders at (the router's
/// choice for every address, and for a listening name, is unit-tested in `router/forwarders.rs`).
#[test]
fn lookups_advertise_the_host_given_with_advertise() {
    let daemon = Daemon::start_with(
        "shutdown-advertise",
        Vec::new(),
        vec!["--advertise".into(), "forwarders.example".into()],
    );
    let client = daemon.client();
    client_creates(&client, "advertised");
    let routes = block_on(client.lookup_topic("advertised")).unwrap();
    assert!(!routes.is_empty());
    assert!(routes.iter().all(|address| address.starts_with("forwarders.example:")), "{routes:?}");
}
