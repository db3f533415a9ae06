//! A ModifyAckDeadline storm (issue 47): a subscriber holding 1,000 leases pipelines
//! extensions of 2,500 ids (each lease named two or three times) by 600 s, with nothing pulled
//! in between. Every extension used to push an entry on the subscription's deadline heap that
//! left only when it reached the top, up to 600 s later: the daemon grew from 104 MiB to
//! 3.99 GB in 60 s. Its resident memory must stay within a bound, and the leases must still
//! be acknowledged afterwards. `RINGPOST_MODACK_STORM_SECONDS` sets how long the storm lasts
//! (5 s by default; the was 60).

use ringpost_client::{block_on, Message};
use ringpost_tests::{create_topic_and_subscription, Daemon};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const LEASES: usize = 1000;
const IDS_PER_REQUEST: usize = 2500;
const EXTENSION_SECONDS: u32 = 600;
/// Threads sending extensions at once, so that requests are pipelined on the connections.
const STORM_THREADS: usize = 4;
const STORM_SECONDS_DEFAULT: u64 = 5;
/// What the daemon's resident memory may grow by during the storm. The heap's bound is 3,024
/// entries of 32 bytes here; the rest is the requests in flight, the journal's commits of the
/// extensions and the allocator's slack. Measured in a debug build: +0 MiB over 762 requests
/// in 5 s; without the bound, +67 MiB over 664 requests in 5 s and +230 MiB in 15 s.
const GROWTH_KIB_MAX: u64 = 16 * 1024;

fn storm_seconds() -> u64 {
    std::env::var("RINGPOST_MODACK_STORM_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(STORM_SECONDS_DEFAULT)
}

#[test]
fn a_modify_ack_deadline_storm_keeps_memory_bounded() {
    let daemon = Daemon::start_with("modack-storm", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = daemon.client();
    create_topic_and_subscription(&client, "stormy", "stormy-reader", 60);
    let messages: Vec<Message> = (0..LEASES).map(|index| Message::new(format!("message {index}"))).collect();
    block_on(client.publish("stormy", messages)).unwrap();
    let mut leased = Vec::new();
    let started = Instant::now();
    while leased.len() < LEASES {
        assert!(started.elapsed() < Duration::from_secs(30), "pulled only {} of {LEASES}", leased.len());
        leased.extend(block_on(client.pull("stormy-reader", LEASES as u32, 1000)).unwrap());
    }
    let ack_ids: Vec<String> = leased.iter().map(|message| message.ack_id.clone()).collect();
    let request: Vec<String> = ack_ids.iter().cycle().take(IDS_PER_REQUEST).cloned().collect();
    let before_kib = daemon.memory_kib("VmRSS:");

    let seconds = storm_seconds();
    let requests = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut peak_kib = before_kib;
    std::thread::scope(|scope| {
        for _ in 0..STORM_THREADS {
            let (client, request, requests) = (&client, &request, &requests);
            scope.spawn(move || {
                while Instant::now() < until {
                    let refused = block_on(client.modify_ack_deadline(
                        "stormy-reader",
                        request.clone(),
                        EXTENSION_SECONDS,
                    ))
                    .expect("an extension during the storm");
                    assert!(refused.is_empty(), "extensions refused: {:?}", &refused[..refused.len().min(3)]);
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        while Instant::now() < until {
            peak_kib = peak_kib.max(daemon.memory_kib("VmRSS:"));
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    peak_kib = peak_kib.max(daemon.memory_kib("VmRSS:"));
    let requests = requests.into_inner();
    let growth_kib = peak_kib.saturating_sub(before_kib);
    println!(
        "{requests} extensions of {IDS_PER_REQUEST} ids in {seconds} s ({} extended leases): resident {} MiB before, \
         peak {} MiB (+{} MiB)",
        requests * IDS_PER_REQUEST as u64,
        before_kib / 1024,
        peak_kib / 1024,
        growth_kib / 1024
    );
    assert!(requests > 0, "no extension was answered");
    assert!(
        growth_kib <= GROWTH_KIB_MAX,
        "the storm grew the daemon by {} MiB (at most {} MiB)",
        growth_kib / 1024,
        GROWTH_KIB_MAX / 1024
    );

    // The leases are intact: every one is acknowledged, and nothing comes back.
    let refused = block_on(client.acknowledge("stormy-reader", ack_ids)).unwrap();
    assert!(
        refused.is_empty(),
        "acknowledgements refused after the storm: {:?}",
        &refused[..refused.len().min(3)]
    );
    assert!(
        block_on(client.pull("stormy-reader", 10, 500)).unwrap().is_empty(),
        "redelivered after the storm"
    );
}
