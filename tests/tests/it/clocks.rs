//! T11: the nodes' wall clocks disagree and jump. Each node of a three-node cluster runs under
//! libfaketime with its wall clock offset (+5 min, −5 min, none) while its monotonic clock is
//! left alone; mid-run every wall clock steps by 30 s (the topic's leader's forward, the others'
//! back), and later steps back, while two publishers and an acknowledging subscriber run and
//! the topic's leader is SIGKILLed once. Checked: nothing acknowledged is lost and nothing
//! unexpected delivered; a message whose acknowledgement was confirmed is not delivered
//! again; a lease held across the steps runs out on the monotonic clock (redelivered no
//! earlier than its deadline, give or take the probe's round trips, and at most
//! `LEASE_LATENESS_MAX` after it); and the steps
//! themselves redeliver nothing (no duplicate before the kill). The offsets are checked to be
//! in force (the publish times the leader stamps), so the test cannot pass without them.

use ringpost_client::{block_on, Client, Message};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::load::Load;
use ringpost_tests::{create_subscription, libfaketime, temporary_directory};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Each node's wall-clock offset, in seconds, at the start.
const OFFSETS_SECONDS: [i64; 3] = [300, -300, 0];
/// How far each wall clock steps mid-run.
const STEP_SECONDS: i64 = 30;
const ACK_DEADLINE_SECONDS: u32 = 10;
/// How late past its deadline a lease may be redelivered: the daemon's lease timer and the
/// probe's pull wait (`PROBE_PULL_WAIT_MS`) between them.
const LEASE_LATENESS_MAX: Duration = Duration::from_secs(2);
/// How early it may seem to be: the test times the lease from the first pull's answer, the
/// server from before it, and the two answers' trips on loopback may differ by this much. A
/// lease on the wall clock would end 28 s early or 30 s late here.
const LEASE_EARLINESS_MAX: Duration = Duration::from_millis(250);
const PROBE_PULL_WAIT_MS: u32 = 200;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);

/// Sets the wall-clock offset a node reads from `file` (libfaketime rereads it each second).
fn set_offset(file: &Path, seconds: i64) {
    std::fs::write(file, format!("{seconds:+}\n")).unwrap();
}

fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn wall_clocks_that_disagree_and_jump_change_nothing_safe_and_leases_run_on_the_monotonic_clock() {
    let library = libfaketime();
    let clocks = temporary_directory("clocks-offsets");
    let files: Vec<PathBuf> = (1..=3).map(|id| clocks.join(format!("node{id}"))).collect();
    for (file, offset) in files.iter().zip(OFFSETS_SECONDS) {
        set_offset(file, offset);
    }
    let mut cluster = Cluster::start_each("clocks", 3, Vec::new(), &|id, daemon| {
        daemon.env = vec![
            ("LD_PRELOAD".to_owned(), library.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE".to_owned(), files[id as usize - 1].display().to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
            ("FAKETIME_CACHE_DURATION".to_owned(), "1".to_owned()),
        ];
    });
    let admin = cluster.node(1).client();
    block_on(admin.create_topic("clocks")).unwrap();
    create_subscription(&admin, "clocks-sub", "clocks", ACK_DEADLINE_SECONDS);
    // The lease probes have a topic of their own, so that the load does not bury them.
    block_on(admin.create_topic("clocks-probe")).unwrap();
    create_subscription(&admin, "clocks-lease", "clocks-probe", ACK_DEADLINE_SECONDS);

    // The offsets are in force: a leader stamps publish times with its own wall clock.
    let probe_leader = cluster.topic_leader("clocks-probe");
    let before = wall_ms();
    block_on(admin.publish("clocks-probe", vec![Message::new("clock-check")])).unwrap();
    let check = pull_one(&admin, "clock-check");
    block_on(admin.acknowledge("clocks-lease", vec![check.ack_id])).unwrap();
    let skew_ms = check.publish_time_ms as i64 - before;
    let expected_ms = OFFSETS_SECONDS[probe_leader as usize - 1] * 1000;
    assert!(
        (skew_ms - expected_ms).abs() < 5_000,
        "node {probe_leader} stamped {skew_ms} ms from the test's clock; its offset is {expected_ms} ms: libfaketime is not in force"
    );

    let routers: Vec<String> = cluster.ids().map(|id| cluster.node(id).address.clone()).collect();
    let load = Load::start("clocks", "clocks-sub", routers, 2, 1);
    let wait_for_publishes = |what: &str| load.wait_for_publishes(what, Duration::from_secs(30));
    wait_for_publishes("the publishers start");

    // A lease taken, then every wall clock steps while it runs, the lease holder's forward and
    // then back: it ends on the monotonic clock either way.
    for direction in [1, -1] {
        let steps: Vec<i64> = (1..=3u64)
            .map(|id| if id == probe_leader { direction * STEP_SECONDS } else { -direction * STEP_SECONDS })
            .collect();
        let waited = lease_across_steps(&admin, &files, &steps);
        eprintln!(
            "clocks: a lease of {ACK_DEADLINE_SECONDS} s, its holder's wall clock stepped by {:+} s, was redelivered after {waited:?}",
            direction * STEP_SECONDS
        );
        assert!(
            waited + LEASE_EARLINESS_MAX >= Duration::from_secs(ACK_DEADLINE_SECONDS.into()),
            "redelivered after {waited:?}, before its deadline: the lease ran on the wall clock"
        );
        assert!(
            waited <= Duration::from_secs(ACK_DEADLINE_SECONDS.into()) + LEASE_LATENESS_MAX,
            "redelivered after {waited:?}, later than LEASE_LATENESS_MAX past its deadline"
        );
    }
    wait_for_publishes("after the steps");
    let duplicates = load.checker.verdict().duplicates;
    assert_eq!(duplicates, 0, "the steps redelivered {duplicates} messages");

    // The topic's leader dies and comes back under the skewed clocks; then the clocks step back.
    let leader = cluster.topic_leader("clocks");
    cluster.node_mut(leader).kill();
    *load.routers.write().unwrap() =
        cluster.ids().filter(|id| *id != leader).map(|id| cluster.node(id).address.clone()).collect();
    wait_for_publishes("after the leader's death");
    cluster.node_mut(leader).restart();
    *load.routers.write().unwrap() = cluster.ids().map(|id| cluster.node(id).address.clone()).collect();
    for (file, offset) in files.iter().zip(OFFSETS_SECONDS) {
        set_offset(file, offset);
    }
    wait_for_publishes("after the clocks stepped back");
    std::thread::sleep(Duration::from_secs(2));

    let checker = load.checker.clone();
    let outcomes = load.finish(DRAIN_TIMEOUT);
    outcomes.report("clocks");
    outcomes.assert_safe(&checker, || cluster.logs());
    // The nodes read their offsets from these files until they stop; the directory goes after.
    drop(cluster);
    let _ = std::fs::remove_dir_all(&clocks);
}

/// Pulls `clocks-lease` until the message `payload` comes (at most 30 s).
fn pull_one(client: &Client, payload: &str) -> ringpost_client::ReceivedMessage {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for message in block_on(client.pull("clocks-lease", 10, 500)).unwrap() {
            if message.data == payload.as_bytes() {
                return message;
            }
        }
        assert!(Instant::now() < deadline, "{payload} was not delivered");
    }
}

/// Publishes a probe, takes its lease on `clocks-lease`, steps each node's wall clock by its
/// `steps` (seconds, from its offset) while the lease runs, and returns how long after the
/// delivery the probe was delivered again.
fn lease_across_steps(client: &Client, files: &[PathBuf], steps: &[i64]) -> Duration {
    block_on(client.publish("clocks-probe", vec![Message::new("lease-probe")])).unwrap();
    pull_one(client, "lease-probe");
    let delivered = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    for ((file, offset), step) in files.iter().zip(OFFSETS_SECONDS).zip(steps) {
        set_offset(file, offset + step);
    }
    loop {
        let messages = block_on(client.pull("clocks-lease", 10, PROBE_PULL_WAIT_MS)).unwrap();
        let waited = delivered.elapsed();
        if let Some(again) = messages.into_iter().find(|message| message.data == b"lease-probe") {
            block_on(client.acknowledge("clocks-lease", vec![again.ack_id])).unwrap();
            for (file, offset) in files.iter().zip(OFFSETS_SECONDS) {
                set_offset(file, offset);
            }
            return waited;
        }
        assert!(waited < Duration::from_secs(60), "the probe's lease never ran out");
    }
}
