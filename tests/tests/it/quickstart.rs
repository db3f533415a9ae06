//! The README's quickstart through the `ringpost` CLI, with SIGKILL and restart between publish
//! and pull and between ack and pull.

use ringpost_tests::json_field as field;
use ringpost_tests::{failed, succeeded, Daemon};

#[test]
fn quickstart_survives_sigkill() {
    let mut daemon = Daemon::start("quickstart");
    succeeded(&daemon.cli(&["topic", "create", "orders"]));
    succeeded(&daemon.cli(&["sub", "create", "orders-audit", "--topic", "orders"]));
    let ids = succeeded(&daemon.cli(&[
        "publish",
        "orders",
        "--attr",
        "region=eu",
        "order 1",
        "order 2",
        "order 3",
    ]));
    assert_eq!(ids.lines().count(), 3, "one id per message: {ids}");

    // Acknowledged publishes survive a crash before anyone pulled them.
    daemon.restart();
    let pulled = succeeded(&daemon.cli(&["pull", "orders-audit", "--max", "10"]));
    let lines: Vec<&str> = pulled.lines().collect();
    assert_eq!(lines.len(), 3, "{pulled}");
    for (line, expected) in lines.iter().zip(["order 1", "order 2", "order 3"]) {
        assert_eq!(field(line, "data"), expected);
        assert!(line.contains("\"attributes\":{\"region\":\"eu\"}"), "{line}");
        assert!(field(line, "publish_time").ends_with('Z'), "{line}");
        assert_eq!(field(line, "delivery_attempt"), "1");
        field(line, "message_id");
    }
    let ack_ids: Vec<&str> = lines.iter().map(|line| field(line, "ack_id")).collect();
    succeeded(&daemon.cli(&["ack", "orders-audit", ack_ids[0], ack_ids[1]]));

    // Acknowledged messages never come back; the delivered but unacknowledged one does.
    daemon.restart();
    let again = succeeded(&daemon.cli(&["pull", "orders-audit", "--max", "10"]));
    let lines: Vec<&str> = again.lines().collect();
    assert_eq!(lines.len(), 1, "{again}");
    assert_eq!(field(lines[0], "data"), "order 3");

    // Topic and subscription survived both crashes.
    let topics = succeeded(&daemon.cli(&["topic", "list"]));
    assert!(topics.contains("\"name\":\"orders\""), "{topics}");
    let subscription = succeeded(&daemon.cli(&["sub", "get", "orders-audit"]));
    assert!(subscription.contains("\"topic\":\"orders\""), "{subscription}");
    let table = succeeded(&daemon.cli(&["--output", "table", "sub", "list"]));
    assert!(table.starts_with("NAME"), "{table}");
}

#[test]
fn publish_reads_standard_input_and_pull_can_ack() {
    let daemon = Daemon::start("stdin");
    succeeded(&daemon.cli(&["topic", "create", "lines"]));
    succeeded(&daemon.cli(&["sub", "create", "reader", "--topic", "lines"]));
    let ids = succeeded(&daemon.cli_with_input(&["publish", "lines"], Some("first\nsecond\n")));
    assert_eq!(ids.lines().count(), 2);
    let pulled = succeeded(&daemon.cli(&["pull", "reader", "--max", "10", "--ack", "--base64"]));
    assert!(pulled.contains("\"data\":\"Zmlyc3Q=\""), "{pulled}");
    // Acked by --ack: nothing left, even after the deadline would have passed for a lease.
    let empty = succeeded(&daemon.cli(&["pull", "reader", "--max", "10"]));
    assert!(empty.is_empty(), "{empty}");
}

#[test]
fn cli_errors_name_the_code_and_exit_non_zero() {
    let daemon = Daemon::start("cli-errors");
    let error = failed(&daemon.cli(&["topic", "get", "missing"]));
    assert_eq!(error.trim(), "NotFound: topic 'missing'");
    succeeded(&daemon.cli(&["topic", "create", "twice"]));
    assert!(failed(&daemon.cli(&["topic", "create", "twice"])).starts_with("AlreadyExists: topic 'twice'"));
    assert!(failed(&daemon.cli(&["sub", "create", "sub-one", "--topic", "missing"]))
        .starts_with("NotFound: topic 'missing'"));
    assert!(failed(&daemon.cli(&["ack", "missing-sub", "1.2.3"]))
        .starts_with("NotFound: subscription 'missing-sub'"));
    let unreachable = std::process::Command::new(ringpost_tests::binary("ringpost"))
        .args(["--server", "127.0.0.1:1", "topic", "list"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&unreachable.stderr).starts_with("Unavailable: cannot connect"));
    assert_ne!(unreachable.status.code(), Some(0));
}

#[test]
fn stats_show_backlog_and_healthy_directories() {
    let daemon = Daemon::start("stats");
    succeeded(&daemon.cli(&["topic", "create", "metrics"]));
    succeeded(&daemon.cli(&["sub", "create", "dashboard", "--topic", "metrics"]));
    succeeded(&daemon.cli(&["publish", "metrics", "a", "b", "c"]));
    succeeded(&daemon.cli(&["pull", "dashboard", "--max", "1"]));
    let stats = succeeded(&daemon.cli(&["stats"]));
    let subscription =
        stats.lines().find(|line| line.contains("\"subscription\":\"dashboard\"")).expect(&stats);
    assert_eq!(field(subscription, "backlog"), "3");
    assert_eq!(field(subscription, "outstanding"), "1");
    assert_eq!(field(subscription, "delivered"), "1");
    field(subscription, "delivered_per_second");
    field(subscription, "acked_per_second");
    let topic =
        stats.lines().find(|line| line.starts_with("{\"topic\":\"metrics\",\"shard\"")).expect(&stats);
    assert_eq!(field(topic, "messages"), "3");
    let directories: Vec<&str> = stats.lines().filter(|line| line.contains("\"directory\"")).collect();
    assert_eq!(directories.len(), 3, "the router and two forwarders, one data directory each: {stats}");
    assert!(directories.iter().all(|line| field(line, "healthy") == "true"));
    let table = succeeded(&daemon.cli(&["--output", "table", "stats"]));
    assert!(table.contains("dashboard") && table.contains("healthy"), "{table}");
    let refused = failed(&daemon.cli(&["admin", "resync-dir", "5"]));
    assert!(refused.starts_with("InvalidArgument"), "{refused}");
}

#[test]
fn cluster_status_shows_the_single_node_leading_the_catalog() {
    let daemon = Daemon::start("cluster-status");
    succeeded(&daemon.cli(&["topic", "create", "decided"]));
    let json = succeeded(&daemon.cli(&["cluster", "status"]));
    let lines: Vec<&str> = json.lines().collect();
    assert_eq!(lines.len(), 2, "the answering node's view, then one member: {json}");
    assert_eq!(field(lines[0], "answering_node"), "1", "{json}");
    assert_eq!(field(lines[0], "catalog_leader"), "1", "{json}");
    let term: u64 = field(lines[0], "term").parse().expect(&json);
    assert!(term >= 1, "{json}");
    let applied: u64 = field(lines[0], "last_applied_index").parse().expect(&json);
    assert!(applied >= 1, "{json}");
    assert_eq!(field(lines[1], "node"), "1", "{json}");
    assert_eq!(field(lines[1], "voter"), "true", "{json}");
    assert_eq!(field(lines[1], "role"), "leader", "{json}");
    let matched: u64 = field(lines[1], "matched_index").parse().expect(&json);
    assert!(matched >= applied, "the leader holds what it applied: {json}");

    let table = succeeded(&daemon.cli(&["--output", "table", "cluster", "status"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let header = format!("node 1 answering: catalog leader 1, term {term}, applied index ");
    assert!(lines[0].starts_with(&header), "{table}");
    assert!(lines[1].starts_with("NODE") && lines[1].contains("MATCHED_INDEX"), "{table}");
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(row[..4], ["1", "-", "voter", "leader"], "{table}");
}

#[test]
fn stats_report_publish_and_delivery_rates() {
    let daemon = Daemon::start("rates");
    let client = daemon.client();
    ringpost_client::block_on(client.create_topic("busy-rates")).unwrap();
    ringpost_client::block_on(client.create_subscription(ringpost_client::Subscription {
        name: "busy-reader".into(),
        topic: "busy-rates".into(),
        ..Default::default()
    }))
    .unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(3) {
        let messages = (0..50).map(|i| ringpost_client::Message::new(format!("m{i}"))).collect();
        ringpost_client::block_on(client.publish("busy-rates", messages)).unwrap();
        let delivered = ringpost_client::block_on(client.pull("busy-reader", 100, 0)).unwrap();
        let ids: Vec<String> = delivered.into_iter().map(|m| m.ack_id).collect();
        if !ids.is_empty() {
            ringpost_client::block_on(client.acknowledge("busy-reader", ids)).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stats = ringpost_client::block_on(client.stats()).unwrap();
    let topic = &stats.topics[0];
    let subscription = &topic.subscriptions[0];
    assert!(topic.published_per_second > 0, "{topic:?}");
    assert!(subscription.delivered_per_second > 0 && subscription.acked_per_second > 0, "{subscription:?}");
    assert!(subscription.delivered_per_second <= topic.end_offset, "{subscription:?}");
}

#[test]
fn stats_report_each_shards_publish_and_commit_latencies() {
    let daemon = Daemon::start("latencies");
    let client = daemon.client();
    ringpost_client::block_on(client.create_topic("timed")).unwrap();
    for index in 0..20 {
        let message = ringpost_client::Message::new(format!("m{index}"));
        ringpost_client::block_on(client.publish("timed", vec![message])).unwrap();
    }
    let stats = ringpost_client::block_on(client.stats()).unwrap();
    let owner = stats.topics.iter().find(|topic| topic.name == "timed").expect("the topic's stats").shard;
    for shard in stats.shards.iter().filter(|shard| shard.shard != u32::MAX) {
        let (publish, commit) = (&shard.publish_latency, &shard.commit_latency);
        if shard.shard != owner {
            assert_eq!(publish.count, 0, "shard {} published nothing: {publish:?}", shard.shard);
            continue;
        }
        assert_eq!(publish.count, 20, "{publish:?}");
        // One publish at a time: each is a commit of its own.
        assert!(commit.count >= 20, "{commit:?}");
        for summary in [publish, commit] {
            assert!(0 < summary.p50_us && summary.p50_us <= summary.p99_us, "{summary:?}");
            assert!(
                summary.p99_us <= summary.p999_us && summary.p999_us <= summary.max_us + summary.max_us / 100
            );
        }
    }
    let table = succeeded(&daemon.cli(&["--output", "table", "stats"]));
    let line = format!("forwarder-{owner} publish latency, last 10-20 s: 20 measured, p50 ");
    assert!(table.contains(&line), "{table}");
    let json = succeeded(&daemon.cli(&["stats"]));
    let line = format!("{{\"shard\":\"forwarder-{owner}\",\"publish_us\":{{\"count\":20,\"p50\":");
    assert!(json.contains(&line), "{json}");
}

/// A listener that accepts connections, reads what comes and answers `answer` (nothing if
/// empty), keeping them open: a port that is not Ringpost's, or one that never replies.
fn foreign_port(answer: &'static [u8]) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            use std::io::{Read, Write};
            let _ = stream.read(&mut [0u8; 256]);
            let _ = stream.write_all(answer);
            open.push(stream);
        }
    });
    address
}

fn ringpost(args: &[&str]) -> std::process::Output {
    std::process::Command::new(ringpost_tests::binary("ringpost")).args(args).output().unwrap()
}

#[test]
fn exit_codes_follow_one_scheme() {
    let daemon = Daemon::start("exit-codes");
    // 1: the server refused.
    assert_eq!(daemon.cli(&["topic", "get", "missing"]).status.code(), Some(1));
    // 2: usage, whether argh or the CLI itself finds it, before anything is sent.
    for args in [
        &["topic", "lst"][..],
        &["topic", "create"],
        &["publish", "some-topic", "--attr", "novalue", "m"],
        &["pull", "some-sub", "--wait", "99"],
        &["--timeout", "0", "topic", "list"],
        &["--output", "yaml", "topic", "list"],
    ] {
        let output = daemon.cli(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let help = ringpost(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Error codes:"));
    // 3: no Ringpost server answered.
    assert_eq!(ringpost(&["--server", "127.0.0.1:1", "topic", "list"]).status.code(), Some(3));
    let http = foreign_port(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    let output = ringpost(&["topic", "list", "--server", &http]);
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        format!("ProtocolError: {http} is not a Ringpost server (it answered \"HTTP/1.1 400 Bad Request\")")
    );
    let silent = foreign_port(b"");
    let output = ringpost(&["--server", &silent, "--timeout", "0.5", "stats"]);
    assert_eq!(output.status.code(), Some(3));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.starts_with("DeadlineExceeded: "), "{error}");

    let bench = |args: &[&str]| {
        std::process::Command::new(ringpost_tests::binary("ringpost-bench")).args(args).output().unwrap()
    };
    assert_eq!(bench(&["--no-such-flag", "publish"]).status.code(), Some(2));
    assert_eq!(bench(&["--help"]).status.code(), Some(0));
    assert_eq!(bench(&["--server", "127.0.0.1:1", "publish", "--messages", "1"]).status.code(), Some(3));
    // Its global options go after the workload too.
    assert_eq!(bench(&["publish", "--messages", "1", "--server", "127.0.0.1:1"]).status.code(), Some(3));
}

#[test]
fn global_options_go_anywhere_and_say_where_they_do_not_apply() {
    let daemon = Daemon::start("global-options");
    succeeded(&daemon.cli(&["topic", "create", "placed"]));
    let table = succeeded(&daemon.cli(&["topic", "list", "--output", "table"]));
    assert!(table.starts_with("NAME"), "{table}");
    let table = succeeded(&daemon.cli(&["topic", "--output=table", "get", "placed"]));
    assert!(table.starts_with("NAME") && table.contains("placed"), "{table}");
    succeeded(&daemon.cli(&["sub", "create", "placed-sub", "--topic", "placed"]));
    succeeded(&daemon.cli(&["publish", "placed", "m"]));
    let pulled = daemon.cli(&["pull", "placed-sub", "--output", "table", "--timeout", "30"]);
    assert!(succeeded(&pulled).contains("\"data\":\"m\""));
    let note = String::from_utf8_lossy(&pulled.stderr);
    assert!(note.contains("--output table does not apply here: pull prints one JSON object"), "{note}");
    // After `--`, what reads like an option is a message.
    succeeded(&daemon.cli(&["publish", "placed", "--", "--output"]));
    let pulled = succeeded(&daemon.cli(&["pull", "placed-sub", "--max", "10", "--wait", "5"]));
    assert!(pulled.contains("\"data\":\"--output\""), "{pulled}");
}

#[test]
fn a_closed_standard_output_ends_the_cli_quietly() {
    let daemon = Daemon::start("closed-pipe");
    for index in 0..200 {
        succeeded(&daemon.cli(&["topic", "create", &format!("piped-{index:03}")]));
    }
    for args in [&["topic", "list"][..], &["stats"], &["--output", "table", "stats"]] {
        let mut child = std::process::Command::new(ringpost_tests::binary("ringpost"))
            .arg("--server")
            .arg(&daemon.address)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the first line, as `| head -0` would.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(error.is_empty(), "{args:?}: {error}");
        assert_eq!(output.status.code(), Some(0), "{args:?}");
    }
}

#[test]
fn publish_sends_binary_files_and_base64() {
    let daemon = Daemon::start("binary");
    succeeded(&daemon.cli(&["topic", "create", "binary"]));
    succeeded(&daemon.cli(&["sub", "create", "binary-sub", "--topic", "binary"]));
    let file = daemon.directory.join("payload.bin");
    let bytes: Vec<u8> = (0..=255u8).chain([b'\n', b'\r', 0]).collect();
    std::fs::write(&file, &bytes).unwrap();
    let ids = succeeded(&daemon.cli(&["publish", "binary", "--file", file.to_str().unwrap()]));
    assert_eq!(ids.lines().count(), 1, "{ids}");
    let ids = succeeded(&daemon.cli(&["publish", "binary", "--base64", "AAEC/w==", "aGk"]));
    assert_eq!(ids.lines().count(), 2, "{ids}");
    // Blank lines are skipped with a note naming them; \r\n ends a line as \n does.
    let output = daemon.cli_with_input(&["publish", "binary"], Some("one\n\r\ntwo\r\n"));
    assert_eq!(succeeded(&output).lines().count(), 2);
    let note = String::from_utf8_lossy(&output.stderr);
    assert!(note.contains("skipped 1 blank line(s) of standard input (line 2)"), "{note}");
    let refused = daemon.cli_with_input(&["publish", "binary", "--base64"], Some("aGk=\nnot base64!\n"));
    assert_eq!(refused.status.code(), Some(2));
    assert!(failed(&refused).contains("line 2 of standard input is not base64"));

    let client = daemon.client();
    let delivered = ringpost_client::block_on(client.pull("binary-sub", 10, 5000)).unwrap();
    let data: Vec<Vec<u8>> = delivered.into_iter().map(|message| message.data).collect();
    let expected: Vec<Vec<u8>> =
        vec![bytes, vec![0, 1, 2, 255], b"hi".to_vec(), b"one".to_vec(), b"two".to_vec()];
    assert_eq!(data, expected);
}

#[test]
fn snapshot_get_shows_one_snapshot() {
    let daemon = Daemon::start("snapshot-get");
    succeeded(&daemon.cli(&["topic", "create", "snapped"]));
    succeeded(&daemon.cli(&["sub", "create", "snapped-sub", "--topic", "snapped"]));
    succeeded(&daemon.cli(&["snapshot", "create", "snap-one", "--subscription", "snapped-sub"]));
    let shown = succeeded(&daemon.cli(&["snapshot", "get", "snap-one"]));
    assert!(shown.starts_with("{\"name\":\"snap-one\",\"topic\":\"snapped\",\"expire_time\":\""), "{shown}");
    let table = succeeded(&daemon.cli(&["snapshot", "get", "snap-one", "--output", "table"]));
    assert!(table.starts_with("NAME") && table.contains("snapped"), "{table}");
    let missing = daemon.cli(&["snapshot", "get", "snap-two"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(failed(&missing).trim(), "NotFound: snapshot 'snap-two'");
}
