//! The monitoring endpoint (`--http-listen`) of a real daemon: `/healthz`, `/readyz` and
//! `/metrics` under load, parsed as Prometheus parses them. Every family a dashboard needs is
//! there with its type; counters only grow; a subscription's backlog and oldest unacknowledged
//! age move as its subscriber falls behind and catches up. (A fenced data directory's gauge
//! and `/readyz` without a quorum of directories are checked in `disks.rs`.)

use ringpost_client::{block_on, Message};
use ringpost_tests::grpc::{pubsub, topic_path, Grpc};
use ringpost_tests::scrape::{http_get, http_request, Scrape};
use ringpost_tests::{create_subscription, Daemon};
use std::time::Duration;

fn scrape(address: &str) -> Scrape {
    let (status, body) = http_get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    Scrape::parse(&body)
}

#[test]
fn metrics_health_and_readiness_follow_a_subscriber_that_falls_behind_and_catches_up() {
    let daemon = Daemon::start_with(
        "monitoring",
        vec![],
        ["--http-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"].map(String::from).to_vec(),
    );
    let http = daemon.http_address.clone().expect("the ready file names the monitoring endpoint");
    assert_eq!(http_get(&http, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(http_get(&http, "/readyz"), (200, "ready\n".to_owned()));
    assert_eq!(http_get(&http, "/nothing").0, 404);
    assert_eq!(http_request(&http, "POST", "/metrics").0, 405);

    let client = daemon.client();
    block_on(client.create_topic("monitored")).unwrap();
    create_subscription(&client, "monitored-sub", "monitored", 10);
    let publish = |count: usize| {
        for _ in 0..count / 10 {
            let batch = (0..10).map(|i| Message::new(format!("m{i}").as_str())).collect();
            block_on(client.publish("monitored", batch)).unwrap();
        }
    };
    publish(100);
    // A request refused: its status is counted too.
    let missing = block_on(client.publish("no-such-topic", vec![Message::new("x")]));
    assert_eq!(missing.unwrap_err().code(), ringpost_client::ErrorCode::NotFound);
    // The gRPC API's calls are counted beside them, under the same command names; its
    // connection stays open for the scrape.
    let grpc = Grpc::connect(daemon.grpc_address.as_deref().expect("the gRPC API serves"));
    grpc.publish(pubsub::PublishRequest {
        topic: topic_path("monitored"),
        messages: vec![pubsub::PubsubMessage { data: b"by grpc".to_vec().into(), ..Default::default() }],
    })
    .unwrap();
    let absent = grpc.get_topic(pubsub::GetTopicRequest { topic: topic_path("absent") }).unwrap_err();
    assert_eq!(absent.code(), tonic::Code::NotFound);
    std::thread::sleep(Duration::from_millis(1100));

    let first = scrape(&http);
    for (family, kind) in [
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("ringpost_build_info", "gauge"),
        ("ringpost_shard_topics", "gauge"),
        ("ringpost_data_directory_fenced", "gauge"),
        ("ringpost_data_directory_repairs", "counter"),
        ("ringpost_publish_ack_latency_window_seconds", "gauge"),
        ("ringpost_commit_latency_window_seconds", "gauge"),
        ("ringpost_topic_offsets", "counter"),
        ("ringpost_topic_stored_bytes", "gauge"),
        ("ringpost_subscription_num_undelivered_messages", "gauge"),
        ("ringpost_subscription_oldest_unacked_message_age_seconds", "gauge"),
        ("ringpost_subscription_outstanding_messages", "gauge"),
        ("ringpost_subscription_delivered_messages", "counter"),
        ("ringpost_subscription_expired_leases", "counter"),
        ("ringpost_metrics_topics_omitted", "gauge"),
        ("ringpost_metrics_subscriptions_omitted", "gauge"),
        ("ringpost_requests", "counter"),
        ("ringpost_request_duration_seconds", "histogram"),
        ("ringpost_publish_ack_latency_seconds", "histogram"),
        ("ringpost_commit_latency_seconds", "histogram"),
        ("ringpost_delivery_latency_seconds", "histogram"),
        ("ringpost_data_directory_write_latency_seconds", "histogram"),
        ("ringpost_data_directory_sync_latency_seconds", "histogram"),
        ("ringpost_data_directory_written_bytes", "counter"),
        ("ringpost_data_directory_write_errors", "counter"),
        ("ringpost_connections", "gauge"),
        ("ringpost_topic_published_messages", "counter"),
        ("ringpost_topic_published_bytes", "counter"),
        ("ringpost_subscription_backlog_bytes", "gauge"),
        ("ringpost_subscription_redelivered_messages", "counter"),
        ("ringpost_subscription_acknowledged_messages", "counter"),
        ("ringpost_subscription_dead_lettered_messages", "counter"),
        ("ringpost_subscription_open_streams", "gauge"),
    ] {
        assert_eq!(first.type_of(family), Some(kind), "{family} in {:?}", first.types);
    }
    // Requests by command and status, summed over the shards, and their durations.
    let total = |scrape: &Scrape, name: &str, labels: &[(&str, &str)]| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|sample| {
                sample.name == name
                    && labels
                        .iter()
                        .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|sample| sample.value)
            .sum()
    };
    let native_publish = [("protocol", "native"), ("command", "publish")];
    let publishes =
        total(&first, "ringpost_requests_total", &[native_publish[0], native_publish[1], ("code", "ok")]);
    assert_eq!(publishes, 10.0, "ten publish requests answered ok");
    let refused = total(&first, "ringpost_requests_total", &[("protocol", "native"), ("code", "not_found")]);
    assert!(refused >= 1.0, "the refused publish's lookup was not counted");
    let timed = total(&first, "ringpost_request_duration_seconds_count", &native_publish);
    assert_eq!(timed, 10.0);
    let all_buckets = total(
        &first,
        "ringpost_request_duration_seconds_bucket",
        &[native_publish[0], native_publish[1], ("le", "+Inf")],
    );
    assert_eq!(all_buckets, 10.0);
    let grpc_publish = [("protocol", "grpc"), ("command", "publish"), ("code", "ok")];
    assert_eq!(total(&first, "ringpost_requests_total", &grpc_publish), 1.0, "the gRPC publish");
    let grpc_refused = [("protocol", "grpc"), ("command", "get_topic"), ("code", "not_found")];
    assert_eq!(total(&first, "ringpost_requests_total", &grpc_refused), 1.0, "the gRPC lookup refused");
    assert_eq!(
        total(
            &first,
            "ringpost_request_duration_seconds_count",
            &[("protocol", "grpc"), ("command", "publish")]
        ),
        1.0
    );
    assert!(total(&first, "ringpost_connections", &[("protocol", "grpc")]) >= 1.0, "the gRPC connection");
    assert!(
        total(&first, "ringpost_connections", &[("protocol", "native")]) >= 1.0,
        "the client's connections"
    );
    // Each publish was timed on its shard, and each commit written to the data directory.
    assert_eq!(total(&first, "ringpost_publish_ack_latency_seconds_count", &[]), 11.0);
    assert!(total(&first, "ringpost_data_directory_write_latency_seconds_count", &[]) >= 11.0);
    assert!(total(&first, "ringpost_data_directory_written_bytes_total", &[]) >= 101.0 * 2.0);
    assert_eq!(total(&first, "ringpost_data_directory_write_errors_total", &[]), 0.0);
    assert_eq!(
        first.value("ringpost_topic_published_messages_total", &[("topic", "monitored")]),
        Some(101.0)
    );
    assert!(
        first.value("ringpost_topic_published_bytes_total", &[("topic", "monitored")]).unwrap() > 101.0 * 2.0
    );
    let subscription = [("subscription", "monitored-sub"), ("topic", "monitored")];
    assert_eq!(first.value("ringpost_subscription_num_undelivered_messages", &subscription), Some(101.0));
    assert!(first.value("ringpost_subscription_backlog_bytes", &subscription).unwrap() > 101.0 * 2.0);
    let oldest =
        first.value("ringpost_subscription_oldest_unacked_message_age_seconds", &subscription).unwrap();
    assert!(oldest >= 1.0, "the oldest unacknowledged message is {oldest} s old after 1.1 s");
    assert_eq!(first.value("ringpost_topic_offsets_total", &[("topic", "monitored")]), Some(101.0));
    assert!(first.value("process_resident_memory_bytes", &[]).unwrap() > 0.0);
    // The shard that serves the topic measured its publishes; the other measured none.
    let p99 = first
        .samples
        .iter()
        .filter(|sample| sample.name == "ringpost_publish_ack_latency_window_seconds")
        .filter(|sample| sample.labels.get("percentile").map(String::as_str) == Some("99"))
        .map(|sample| sample.value)
        .fold(0.0, f64::max);
    assert!(p99 > 0.0, "ten publishes and no publish latency");
    for sample in first.samples.iter().filter(|sample| sample.name == "ringpost_data_directory_fenced") {
        assert_eq!(sample.value, 0.0, "{sample:?}");
    }

    // The subscriber falls further behind, then catches up.
    publish(50);
    let behind = scrape(&http);
    assert_eq!(behind.value("ringpost_subscription_num_undelivered_messages", &subscription), Some(151.0));
    // Ten delivered and given back: delivered again, and counted as redelivered.
    let nacked = block_on(client.pull("monitored-sub", 10, 1000)).unwrap();
    assert_eq!(nacked.len(), 10);
    let ack_ids = nacked.iter().map(|message| message.ack_id.clone()).collect();
    assert!(block_on(client.nack("monitored-sub", ack_ids)).unwrap().is_empty());
    let delivered = ringpost_tests::drain(&client, "monitored-sub", true);
    assert_eq!(delivered.len(), 151);
    let caught_up = scrape(&http);
    assert_eq!(caught_up.value("ringpost_subscription_num_undelivered_messages", &subscription), Some(0.0));
    assert_eq!(caught_up.value("ringpost_subscription_backlog_bytes", &subscription), Some(0.0));
    assert_eq!(
        caught_up.value("ringpost_subscription_redelivered_messages_total", &subscription),
        Some(10.0)
    );
    assert_eq!(
        caught_up.value("ringpost_subscription_acknowledged_messages_total", &subscription),
        Some(151.0)
    );
    assert_eq!(
        total(&caught_up, "ringpost_delivery_latency_seconds_count", &[]),
        151.0,
        "each message's first delivery"
    );
    assert_eq!(
        caught_up.value("ringpost_subscription_oldest_unacked_message_age_seconds", &subscription),
        Some(0.0)
    );
    // Counters only grow.
    for sample in first
        .samples
        .iter()
        .filter(|sample| first.type_of(sample.name.trim_end_matches("_total")) == Some("counter"))
    {
        let later = caught_up
            .samples
            .iter()
            .find(|later| later.name == sample.name && later.labels == sample.labels)
            .unwrap_or_else(|| panic!("{sample:?} is gone from a later scrape"));
        assert!(later.value >= sample.value, "{} went from {} to {}", sample.name, sample.value, later.value);
    }
    assert!(
        caught_up.value("ringpost_subscription_delivered_messages_total", &subscription).unwrap() >= 161.0,
        "151 delivered, ten of them twice"
    );
}

/// `ringpost probe`: probes a real daemon, one JSON line each with sane figures, serving its
/// own histograms to Prometheus while it runs and deleting every subscription it made; a
/// missed objective exits 1; a stopped daemon fails at once with a clear error.
#[test]
fn the_prober_measures_a_daemon_and_fails_fast_when_it_is_gone() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut daemon = Daemon::start("probe");
    let mut prober = Command::new(ringpost_tests::binary("ringpost"))
        .args(["--server", &daemon.address, "probe", "--every", "100ms", "--count", "20"])
        .args(["--http-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(prober.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let endpoint = line
        .trim()
        .strip_prefix("probe: metrics on http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("the prober did not say where its metrics are: {line:?}"))
        .to_owned();
    // Its figures, while it runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let figures = loop {
        let figures = scrape(&endpoint);
        if figures.value("ringpost_probe_probes_total", &[("result", "ok")]).unwrap_or(0.0) >= 2.0 {
            break figures;
        }
        assert!(std::time::Instant::now() < deadline, "no probe succeeded within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    for family in [
        "ringpost_probe_create_subscription_seconds",
        "ringpost_probe_publish_ack_seconds",
        "ringpost_probe_delivery_seconds",
    ] {
        assert_eq!(figures.type_of(family), Some("histogram"), "{family}");
        assert!(figures.value(&format!("{family}_count"), &[]).unwrap() >= 2.0, "{family}");
    }
    let output = prober.wait_with_output().unwrap();
    assert!(output.status.success(), "the prober exited with {}", output.status);
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 20, "{stdout}");
    for line in &lines {
        assert_eq!(ringpost_tests::json_field(line, "ok"), "true", "{line}");
        let figure = |name: &str| -> f64 { ringpost_tests::json_field(line, name).parse().unwrap() };
        let (create, publish, delivery) =
            (figure("create_subscription_ms"), figure("publish_ack_ms"), figure("delivery_ms"));
        assert!(create > 0.0 && publish > 0.0 && delivery >= publish && delivery < 10_000.0, "{line}");
    }
    // Every subscription it made is gone.
    let subscriptions = block_on(daemon.client().list_subscriptions(None)).unwrap();
    assert!(
        subscriptions.iter().all(|subscription| !subscription.name.starts_with("ringpost-probe-")),
        "{subscriptions:?}"
    );

    // An objective nobody meets: exit 1, the objective named.
    let missed = daemon.cli(&["probe", "--delivery-objective-ms", "0"]);
    assert_eq!(missed.status.code(), Some(1), "{missed:?}");
    let line = String::from_utf8(missed.stdout).unwrap();
    assert!(line.contains("\"missed\":[\"delivery\"]"), "{line}");

    // A stopped daemon: a clear error at once, not a hang.
    daemon.kill();
    let started = std::time::Instant::now();
    let gone = daemon.cli(&["probe"]);
    assert!(!gone.status.success());
    let error = String::from_utf8_lossy(&gone.stderr);
    // Refused, or reset by a port still closing: either way said as Unavailable.
    assert!(error.starts_with("Unavailable:"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10), "the prober took {:?} to fail", started.elapsed());
}

/// `ringpost-bench --scrape-every`: the load generator's embedded daemon serves its endpoint
/// and is scraped while a workload runs, for the A/B of what scraping costs (benches/ab.sh with
/// `B_ARGS`); without an embedded daemon it is a usage error.
#[test]
fn the_load_generator_scrapes_its_embedded_daemon_while_it_loads_it() {
    let bench = ringpost_tests::binary("ringpost-bench");
    let output = std::process::Command::new(&bench)
        .args(["--embedded", "--scrape-every", "50", "publish", "--messages", "20000", "--batch", "10"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let scraped = stderr
        .lines()
        .find_map(|line| line.strip_prefix("scraped /metrics ")?.split(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the run did not say how often it scraped: {stderr}"));
    assert!(scraped >= 1, "{stderr}");
    let refused = std::process::Command::new(&bench)
        .args(["--server", "127.0.0.1:1", "--scrape-every", "1000", "publish"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}

/// `--version` on the three binaries, and the server's version in `ringpost stats`.
#[test]
fn the_binaries_and_the_server_say_their_version() {
    let mut versions = Vec::new();
    for binary in ["ringpostd", "ringpost", "ringpost-bench"] {
        let output =
            std::process::Command::new(ringpost_tests::binary(binary)).arg("--version").output().unwrap();
        assert!(output.status.success(), "{binary} --version: {output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        let version = text
            .trim()
            .strip_prefix(&format!("{binary} "))
            .unwrap_or_else(|| panic!("{binary} --version printed {text:?}"))
            .to_owned();
        assert_eq!(version.split('.').count(), 3, "{binary}: {version}");
        versions.push(version);
    }
    let daemon = Daemon::start("version");
    let stats = ringpost_tests::succeeded(&daemon.cli(&["stats"]));
    let process = stats.lines().find(|line| line.contains("\"process\"")).expect("a process line");
    assert_eq!(ringpost_tests::json_field(process, "version"), versions[0], "{process}");
}

/// The systemd unit in the repository passes `systemd-analyze verify` (its ExecStart pointed
/// at the built daemon, since verify checks the program exists), with nothing said: a
/// misspelt or invalid setting is only a warning to systemd, so any output fails the test.
/// Where systemd-analyze is not installed there is nothing to check it with, and the test says so.
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/systemd/ringpostd.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains("ExecStart=/usr/local/bin/ringpostd "), "the install steps put ringpostd there");
    for setting in
        ["LimitNOFILE=", "LimitMEMLOCK=", "CAP_IPC_LOCK", "Restart=on-failure", "StateDirectory=ringpost"]
    {
        assert!(text.contains(setting), "the unit lacks {setting}");
    }
    let Ok(probe) = std::process::Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: the unit is not verified here");
        return;
    };
    assert!(probe.status.success());
    let directory = ringpost_tests::temporary_directory("systemd-unit");
    let copy = directory.join("ringpostd.service");
    let daemon = ringpost_tests::binary("ringpostd");
    std::fs::write(&copy, text.replace("/usr/local/bin/ringpostd", &daemon.display().to_string())).unwrap();
    let output = std::process::Command::new("systemd-analyze").arg("verify").arg(&copy).output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
    let _ = std::fs::remove_dir_all(&directory);
}

/// A data directory whose filesystem does not take O_DIRECT (tmpfs) is warned about once per
/// start, not once per log: here by the catalog's logs and four topics' on two shards, first
/// as they are made, then as they are recovered.
#[test]
fn a_data_directory_without_direct_io_is_warned_about_once() {
    const WARNING: &str = "O_DIRECT does not take effect in data directory";
    let shared_memory = std::path::Path::new("/dev/shm");
    assert!(
        shared_memory.is_dir(),
        "/dev/shm (tmpfs) is where this test finds a filesystem without O_DIRECT"
    );
    let directory = shared_memory.join(format!("ringpost-buffered-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    let mut daemon = Daemon::start_with("buffered", vec![directory.clone()], Vec::new());
    let client = daemon.client();
    for topic in ["buffered-a", "buffered-b", "buffered-c", "buffered-d"] {
        block_on(client.create_topic(topic)).unwrap();
        create_subscription(&client, &format!("{topic}-sub"), topic, 10);
        block_on(client.publish(topic, vec![Message::new("x")])).unwrap();
        let delivered = ringpost_tests::drain(&client, &format!("{topic}-sub"), true);
        assert_eq!(delivered.len(), 1);
    }
    let warnings = |log: &str| log.lines().filter(|line| line.contains(WARNING)).count();
    assert_eq!(warnings(&daemon.log()), 1, "{}", daemon.log());
    daemon.restart();
    assert_eq!(warnings(&daemon.log()), 2, "once more at the second start:\n{}", daemon.log());
    drop(daemon);
    let _ = std::fs::remove_dir_all(&directory);
}

/// promtool, fetched by `tests/monitoring/setup.sh`.
pub(crate) fn promtool() -> std::path::PathBuf {
    let setup = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring/setup.sh");
    let output = std::process::Command::new("bash").arg(&setup).output().unwrap();
    assert!(
        output.status.success(),
        "tests/monitoring/setup.sh: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::path::PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// The alerting rules pass `promtool check rules`; the dashboard is JSON Grafana imports, every
/// panel's query is PromQL promtool accepts, and every metric a query names is one a
/// three-node cluster's endpoint or the prober serves.
#[test]
fn the_alerting_rules_and_the_dashboard_check_out() {
    use ringpost_tests::cluster::Cluster;
    let promtool = promtool();
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring");
    let check = |rules: &std::path::Path| {
        let output =
            std::process::Command::new(&promtool).arg("check").arg("rules").arg(rules).output().unwrap();
        let said =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "promtool check rules {}: {said}", rules.display());
    };
    check(&docs.join("alerts.yml"));

    // The dashboard's queries, read by Python's JSON parser, as recording rules for promtool.
    let directory = ringpost_tests::temporary_directory("dashboard");
    let rules = directory.join("dashboard-queries.yml");
    let script = r#"
import json, sys
dashboard = json.load(open(sys.argv[1]))
assert dashboard["title"] and dashboard["uid"] and dashboard["panels"], "a dashboard needs a title, uid and panels"
queries = []
for panel in dashboard["panels"]:
    assert panel["title"] and panel["targets"] and panel["gridPos"], panel
    queries += [target["expr"] for target in panel["targets"]]
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for index, query in enumerate(queries):
        out.write("      - record: dashboard:query_%d\n        expr: %s\n" % (index, json.dumps(query)))
print("\n".join(queries))
"#;
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(docs.join("dashboard.json"))
        .arg(&rules)
        .output()
        .unwrap();
    assert!(output.status.success(), "the dashboard: {}", String::from_utf8_lossy(&output.stderr));
    let queries = String::from_utf8(output.stdout).unwrap();
    check(&rules);

    // What a cluster's node and the prober serve.
    let cluster = Cluster::start("dashboard", 3, vec!["--http-listen".into(), "127.0.0.1:0".into()]);
    let client = cluster.node(1).client();
    block_on(client.create_topic("dashboarded")).unwrap();
    create_subscription(&client, "dashboarded-sub", "dashboarded", 10);
    block_on(client.publish("dashboarded", vec![Message::new("x")])).unwrap();
    let leader = cluster.topic_leader("dashboarded");
    let mut families: Vec<String> =
        scrape(cluster.node(leader).http_address.as_ref().unwrap()).types.into_keys().collect();
    let mut prober = std::process::Command::new(ringpost_tests::binary("ringpost"))
        .args([
            "--server",
            &cluster.node(leader).address,
            "probe",
            "--http-listen",
            "127.0.0.1:0",
            "--every",
            "1s",
            "--count",
            "3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(prober.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    let endpoint =
        line.trim().trim_start_matches("probe: metrics on http://").trim_end_matches("/metrics").to_owned();
    // Its counter shows once the first probe is counted.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let probe_families = loop {
        let types = scrape(&endpoint).types;
        if types.contains_key("ringpost_probe_probes") {
            break types;
        }
        assert!(std::time::Instant::now() < deadline, "the prober counted no probe within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    families.extend(probe_families.into_keys());
    assert!(prober.wait().unwrap().success(), "the prober failed");
    let names: std::collections::BTreeSet<&str> = queries
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("ringpost_") || word.starts_with("process_"))
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        let family = ["_bucket", "_total", "_count", "_sum"]
            .iter()
            .fold(name, |name, suffix| name.trim_end_matches(suffix));
        assert!(
            families.iter().any(|known| known == family),
            "the dashboard queries {name}, which nothing serves: {families:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&directory);
}

/// Log lines carry a time and a level; `--log-format json` makes each an object Python's JSON
/// parser reads; `RINGPOST_LOG=warn` (or `--log-level warn`) leaves the info lines out.
#[test]
fn log_lines_have_times_and_levels_in_text_or_json() {
    let text = Daemon::start("log-text");
    let log = text.log();
    let serving = log.lines().find(|line| line.contains("ringpostd: serving on")).expect("a serving line");
    let words: Vec<&str> = serving.split_whitespace().collect();
    assert!(words[0].len() == 24 && words[0].ends_with('Z') && words[0].contains('T'), "{serving}");
    assert_eq!(words[1], "INFO", "{serving}");
    drop(text);

    let json = Daemon::start_with("log-json", Vec::new(), vec!["--log-format".into(), "json".into()]);
    let log = json.log();
    let check = r#"
import json, sys
lines = [line for line in sys.stdin.read().splitlines() if line]
assert lines, "no log lines"
for line in lines:
    event = json.loads(line)
    assert set(event) == {"time", "level", "message"}, event
    assert event["level"] in ("error", "warn", "info", "debug"), event
assert any(e["level"] == "info" and e["message"].startswith("serving on") for e in map(json.loads, lines))
"#;
    let mut python = std::process::Command::new("python3")
        .arg("-c")
        .arg(check)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut python.stdin.take().unwrap(), log.as_bytes()).unwrap();
    let output = python.wait_with_output().unwrap();
    assert!(output.status.success(), "{}\n{log}", String::from_utf8_lossy(&output.stderr));
    drop(json);

    let mut quiet = Daemon::prepare("log-warn", Vec::new(), Vec::new());
    quiet.env = vec![("RINGPOST_LOG".to_owned(), "warn".to_owned())];
    quiet.spawn();
    assert!(!quiet.log().contains("serving on"), "an info line at level warn:\n{}", quiet.log());
}

/// `ringpost completions`: the bash script completes commands, actions and options as bash
/// runs it; the zsh and fish scripts name every command; an unknown shell is a usage error.
#[test]
fn completion_scripts_complete_commands_actions_and_options() {
    let ringpost = ringpost_tests::binary("ringpost");
    let script =
        |shell: &str| std::process::Command::new(&ringpost).args(["completions", shell]).output().unwrap();
    let bash = script("bash");
    assert!(bash.status.success());
    let completions = |words: &str, index: usize| -> String {
        let program = format!(
            "source <({} completions bash); COMP_WORDS=({words}); COMP_CWORD={index}; _ringpost; echo \"${{COMPREPLY[*]}}\"",
            ringpost.display()
        );
        let output = std::process::Command::new("bash").arg("-c").arg(program).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(completions("ringpost to", 1), "topic token");
    assert_eq!(completions("ringpost --server host:7450 topic cr", 4), "create");
    assert_eq!(completions("ringpost sub s", 2), "seek");
    assert_eq!(completions("ringpost cluster --ser", 2), "--server --server-name");
    for shell in ["zsh", "fish"] {
        let output = script(shell);
        assert!(output.status.success(), "{shell}");
        let text = String::from_utf8(output.stdout).unwrap();
        for command in ["topic", "sub", "publish", "pull", "probe", "cluster"] {
            assert!(text.contains(command), "{shell} lacks {command}");
        }
    }
    assert_eq!(script("tcsh").status.code(), Some(2));
}

/// `ringpostd --config FILE`: a TOML file of the flags' names; the command line wins;
/// `--print-config` prints what the daemon would start with, which `--config` reads back; a
/// daemon started from the file alone serves as it says.
#[test]
fn a_config_file_sets_the_flags_and_the_command_line_wins() {
    use std::process::{Command, Stdio};
    let directory = ringpost_tests::temporary_directory("config");
    let data = directory.join("data");
    let file = directory.join("ringpostd.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:0\"\nshards = 1\ndata-dir = [\"{}\"]\ngrpc_listen = \"off\"\nhttp-listen = \"off\"\nno-pin = true\n",
            data.display()
        ),
    )
    .unwrap();
    let ringpostd = ringpost_tests::binary("ringpostd");
    let print = |file: &std::path::Path, more: &[&str]| -> String {
        let output = Command::new(&ringpostd)
            .arg("--config")
            .arg(file)
            .arg("--print-config")
            .args(more)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let printed = print(&file, &["--shards", "2"]);
    assert!(printed.lines().any(|line| line == "shards = 2"), "the command line wins:\n{printed}");
    assert!(printed.lines().any(|line| line == "no-pin = true"), "{printed}");
    assert!(printed.lines().any(|line| line == "grpc-listen = \"off\""), "{printed}");
    let again = directory.join("printed.toml");
    std::fs::write(&again, &printed).unwrap();
    assert_eq!(print(&again, &[]), printed, "--print-config's output reads back as itself");

    let bad = directory.join("bad.toml");
    std::fs::write(&bad, "listen = [\n").unwrap();
    let refused = Command::new(&ringpostd).arg("--config").arg(&bad).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("bad.toml"));

    let ready = directory.join("ready");
    let log = std::fs::File::create(directory.join("log")).unwrap();
    let mut daemon = Command::new(&ringpostd)
        .arg("--config")
        .arg(&file)
        .arg("--ready-file")
        .arg(&ready)
        .stderr(log)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(std::time::Instant::now() < deadline, "the daemon did not start from its file");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(directory.join("log")).unwrap();
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(log.contains("with 1 forwarder shard(s)"), "{log}");
    assert!(data.is_dir(), "the file's data directory is not where the daemon stores");
    let _ = std::fs::remove_dir_all(&directory);
}
