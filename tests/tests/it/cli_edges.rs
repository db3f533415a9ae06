//! The CLI's edges, each against a real daemon: messages over Pub/Sub's limit refused before
//! anything is sent, however they come (a file, an endless file, a long line of standard
//! input).

use ringpost_client::block_on;
use ringpost_tests::Daemon;
use ringpost_wire::limits::MESSAGE_BYTES_MAX;
use std::time::{Duration, Instant};

/// The exit code of `output`, and its standard error.
fn exit(output: &std::process::Output) -> (Option<i32>, String) {
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Runs the CLI against `daemon` with `input` on its standard input, written by a thread of its
/// own: the CLI may stop reading early (that is what is tested), and the rest is dropped.
fn cli_fed(daemon: &Daemon, args: &[&str], input: Vec<u8>) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(ringpost_tests::binary("ringpost"))
        .args(["--server", &daemon.address])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    output
}

/// A message of 10,000,001 bytes, or of 20 MB (which used to panic the client with exit 101),
/// from `--file`, `--file /dev/zero` (which used to read until memory ran out) or one line
/// of standard input, is a usage error naming the limit (exit 2), and nothing is published; a
/// message of exactly the limit is published.
#[test]
fn a_message_over_the_limit_is_refused_before_anything_is_sent() {
    let daemon = Daemon::start("cli-oversized");
    ringpost_tests::succeeded(&daemon.cli(&["topic", "create", "big"]));
    ringpost_tests::succeeded(&daemon.cli(&["sub", "create", "big-sub", "--topic", "big"]));
    let file = daemon.directory.join("message");
    for bytes in [MESSAGE_BYTES_MAX + 1, 20_000_000] {
        std::fs::write(&file, vec![b'x'; bytes]).unwrap();
        let (code, stderr) = exit(&daemon.cli(&["publish", "big", "--file", file.to_str().unwrap()]));
        assert_eq!(code, Some(2), "{bytes} bytes: {stderr}");
        assert!(stderr.contains("MESSAGE_BYTES_MAX"), "{stderr}");
    }
    let started = Instant::now();
    let (code, stderr) = exit(&daemon.cli(&["publish", "big", "--file", "/dev/zero"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("/dev/zero is over the limit"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "--file /dev/zero took {:?}", started.elapsed());
    let long_line = format!("short\n{}\nnever sent\n", "y".repeat(20_000_000));
    let (code, stderr) = exit(&cli_fed(&daemon, &["publish", "big"], long_line.into_bytes()));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("line 2 of standard input") && stderr.contains("MESSAGE_BYTES_MAX"), "{stderr}");
    // Data within the limit but too much with its attributes is the server's rule, checked here.
    std::fs::write(&file, vec![b'x'; MESSAGE_BYTES_MAX - 2]).unwrap();
    let (code, stderr) =
        exit(&daemon.cli(&["publish", "big", "--file", file.to_str().unwrap(), "--attr", "key=value"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("MESSAGE_BYTES_MAX"), "{stderr}");

    let client = daemon.client();
    assert!(block_on(client.pull("big-sub", 10, 0)).unwrap().is_empty(), "nothing was published");
    std::fs::write(&file, vec![b'z'; MESSAGE_BYTES_MAX]).unwrap();
    ringpost_tests::succeeded(&daemon.cli(&["publish", "big", "--file", file.to_str().unwrap()]));
    let pulled = block_on(client.pull("big-sub", 10, 5000)).unwrap();
    assert_eq!(pulled.len(), 1);
    assert_eq!(pulled[0].data.len(), MESSAGE_BYTES_MAX);
}

/// `--server` at the daemon's gRPC port: the CLI says it is no Ringpost server and that it
/// speaks HTTP/2, with exit 3, rather than "connection closed".
#[test]
fn the_grpc_port_is_named_as_http2_not_a_closed_connection() {
    let daemon =
        Daemon::start_with("cli-grpc-port", Vec::new(), vec!["--grpc-listen".into(), "127.0.0.1:0".into()]);
    let grpc = daemon.grpc_address.clone().expect("the gRPC API serves");
    for _ in 0..5 {
        let output = std::process::Command::new(ringpost_tests::binary("ringpost"))
            .args(["--server", &grpc, "topic", "list"])
            .output()
            .unwrap();
        let (code, stderr) = exit(&output);
        assert_eq!(code, Some(3), "{stderr}");
        assert!(stderr.contains("is not a Ringpost server") && stderr.contains("HTTP/2"), "{stderr}");
    }
}

/// The first line of a successful CLI run's standard output.
fn first_line(output: &std::process::Output) -> String {
    ringpost_tests::succeeded(output).lines().next().unwrap_or_default().to_owned()
}

/// Pub/Sub allows a retry policy of 0 to 600 s for both bounds: a minimum of 0 is taken (it
/// was refused with "retry backoff of 10 to 1 s", a 10 nobody sent), by the CLI as by the
/// gRPC API, and a refusal names what was given and which value was a default.
#[test]
fn a_retry_policy_may_start_at_0_in_both_protocols() {
    use ringpost_tests::grpc::{pubsub, subscription_path, topic_path, Grpc};
    let daemon =
        Daemon::start_with("cli-retry", Vec::new(), vec!["--grpc-listen".into(), "127.0.0.1:0".into()]);
    ringpost_tests::succeeded(&daemon.cli(&["topic", "create", "retried"]));
    let created = first_line(&daemon.cli(&[
        "sub",
        "create",
        "at-once",
        "--topic",
        "retried",
        "--min-backoff",
        "0",
        "--max-backoff",
        "1",
    ]));
    assert_eq!(ringpost_tests::json_field(&created, "minimum_backoff_seconds"), "0", "{created}");
    assert_eq!(ringpost_tests::json_field(&created, "maximum_backoff_seconds"), "1", "{created}");
    // A bound not given is Pub/Sub's default.
    let created =
        first_line(&daemon.cli(&["sub", "create", "from-zero", "--topic", "retried", "--min-backoff", "0"]));
    assert_eq!(ringpost_tests::json_field(&created, "minimum_backoff_seconds"), "0", "{created}");
    assert_eq!(ringpost_tests::json_field(&created, "maximum_backoff_seconds"), "600", "{created}");
    let updated = first_line(&daemon.cli(&["sub", "update", "from-zero", "--max-backoff", "30"]));
    assert_eq!(ringpost_tests::json_field(&updated, "minimum_backoff_seconds"), "10", "{updated}");
    assert_eq!(ringpost_tests::json_field(&updated, "maximum_backoff_seconds"), "30", "{updated}");
    let (code, stderr) =
        exit(&daemon.cli(&["sub", "create", "bad", "--topic", "retried", "--max-backoff", "5"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--min-backoff (not given: the default, 10 s) is above its --max-backoff of 5 s"),
        "{stderr}"
    );
    let (code, stderr) =
        exit(&daemon.cli(&["sub", "update", "at-once", "--min-backoff", "30", "--max-backoff", "20"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--min-backoff of 30 s is above its --max-backoff of 20 s"), "{stderr}");

    let grpc = Grpc::connect(&daemon.grpc_address.clone().unwrap());
    let seconds = |seconds: i64| Some(prost_types::Duration { seconds, nanos: 0 });
    let asked = pubsub::Subscription {
        name: subscription_path("grpc-at-once"),
        topic: topic_path("retried"),
        retry_policy: Some(pubsub::RetryPolicy { minimum_backoff: seconds(0), maximum_backoff: seconds(1) }),
        ..Default::default()
    };
    let created = grpc.create_subscription(asked.clone()).unwrap();
    assert_eq!(created.retry_policy, asked.retry_policy);
    let refused = grpc
        .create_subscription(pubsub::Subscription {
            name: subscription_path("grpc-bad"),
            topic: topic_path("retried"),
            retry_policy: Some(pubsub::RetryPolicy { minimum_backoff: None, maximum_backoff: seconds(5) }),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("minimum_backoff (not given: the default, 10 s)"),
        "{}",
        refused.message()
    );
    // Both protocols show the same policy.
    let shown = first_line(&daemon.cli(&["sub", "get", "grpc-at-once"]));
    assert_eq!(ringpost_tests::json_field(&shown, "minimum_backoff_seconds"), "0", "{shown}");
    assert_eq!(ringpost_tests::json_field(&shown, "maximum_backoff_seconds"), "1", "{shown}");
}

/// A subscription that never expires (Pub/Sub's expiration policy without a ttl) is made by
/// the CLI with `--expiration never` and shown with `"expiration_ttl_seconds":null`, not
/// 18446744073709551615; `sub update` sets it both ways.
#[test]
fn a_subscription_that_never_expires_is_made_and_shown_as_such() {
    let daemon = Daemon::start("cli-never");
    ringpost_tests::succeeded(&daemon.cli(&["topic", "create", "kept"]));
    let created =
        first_line(&daemon.cli(&["sub", "create", "forever", "--topic", "kept", "--expiration", "never"]));
    assert!(created.contains("\"expiration_ttl_seconds\":null"), "{created}");
    let got = first_line(&daemon.cli(&["sub", "get", "forever"]));
    assert!(got.contains("\"expiration_ttl_seconds\":null"), "{got}");
    let updated = first_line(&daemon.cli(&["sub", "update", "forever", "--expiration", "86400"]));
    assert_eq!(ringpost_tests::json_field(&updated, "expiration_ttl_seconds"), "86400", "{updated}");
    let updated = first_line(&daemon.cli(&["sub", "update", "forever", "--expiration", "never"]));
    assert!(updated.contains("\"expiration_ttl_seconds\":null"), "{updated}");
    let client = daemon.client();
    assert_eq!(
        block_on(client.get_subscription("forever")).unwrap().expiration_ttl_seconds,
        ringpost_wire::limits::EXPIRATION_TTL_SECONDS_NEVER
    );
    let (code, stderr) =
        exit(&daemon.cli(&["sub", "create", "bad", "--topic", "kept", "--expiration", "nope"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("neither seconds nor never"), "{stderr}");
}

/// `pull` without `--base64`: text stays text in `data`; data that is not UTF-8 (printed as
/// lossy text before, then acknowledged by `--ack`) comes whole as base64 in `data_base64`,
/// with a note on standard error naming the message.
#[test]
fn pull_prints_data_that_is_not_utf8_as_base64_and_says_so() {
    use ringpost_client::Message;
    let daemon = Daemon::start("cli-binary-pull");
    let client = daemon.client();
    ringpost_tests::create_topic_and_subscription(&client, "mixed", "mixed-sub", 10);
    let binary = vec![0xff, 0xfe, b'a', 0x00, 0x80];
    let ids =
        block_on(client.publish("mixed", vec![Message::new("plain text"), Message::new(binary)])).unwrap();
    let output = daemon.cli(&["pull", "mixed-sub", "--max", "10", "--wait", "5", "--ack"]);
    let stdout = ringpost_tests::succeeded(&output);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(ringpost_tests::json_field(lines[0], "data"), "plain text");
    assert!(!lines[1].contains("\"data\":"), "{}", lines[1]);
    // Base64 of ff fe 61 00 80 (Python's base64.b64encode).
    assert_eq!(ringpost_tests::json_field(lines[1], "data_base64"), "//5hAIA=", "{}", lines[1]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("message(s) {} is not UTF-8", ids[1])) && stderr.contains("data_base64"),
        "{stderr}"
    );
}

/// An unknown command or option is a usage error that suggests the nearest known one.
#[test]
fn typos_are_answered_with_the_nearest_command_or_option() {
    for (arguments, nearest) in [
        (&["publsh", "orders", "x"][..], "publish"),
        (&["sub", "crate", "s", "--topic", "t"][..], "create"),
        (&["pull", "s", "--strem"][..], "--stream"),
        (&["topic", "list", "--outptu", "table"][..], "--output"),
    ] {
        let output =
            std::process::Command::new(ringpost_tests::binary("ringpost")).args(arguments).output().unwrap();
        let (code, stderr) = exit(&output);
        assert_eq!(code, Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains(&format!("did you mean `{nearest}`?")), "{arguments:?}: {stderr}");
    }
}

/// `ringpost completions`: after a command or an action, `-` completes its own options beside
/// the global ones (it completed only the global ones), in bash as bash runs the script, and
/// in fish's script.
#[test]
fn completions_offer_each_commands_own_options() {
    let ringpost = ringpost_tests::binary("ringpost");
    let completions = |words: &str, index: usize| -> String {
        let program = format!(
            "source <({} completions bash); COMP_WORDS=({words}); COMP_CWORD={index}; _ringpost; echo \"${{COMPREPLY[*]}}\"",
            ringpost.display()
        );
        let output = std::process::Command::new("bash").arg("-c").arg(program).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(completions("ringpost sub create audit --to", 4), "--token --topic");
    assert_eq!(completions("ringpost sub update audit --min", 4), "--min-backoff");
    assert_eq!(completions("ringpost pull audit --st", 3), "--stream");
    assert_eq!(completions("ringpost --timeout 5 publish orders --at", 5), "--attr");
    assert_eq!(completions("ringpost topic create orders --rep", 4), "--replicas");
    // An action's options are its own: topic create has no --topic.
    assert_eq!(completions("ringpost topic create orders --to", 4), "--token");
    assert_eq!(completions("ringpost cluster --ser", 2), "--server --server-name");
    let fish = std::process::Command::new(&ringpost).args(["completions", "fish"]).output().unwrap();
    let fish = String::from_utf8(fish.stdout).unwrap();
    assert!(
        fish.contains(
            "complete -c ringpost -n '__fish_seen_subcommand_from sub; and __fish_seen_subcommand_from create' -l topic -r"
        ),
        "{fish}"
    );
    assert!(
        fish.contains("complete -c ringpost -n '__fish_seen_subcommand_from pull' -l stream\n"),
        "{fish}"
    );
}
