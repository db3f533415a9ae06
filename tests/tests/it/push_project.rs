//! The project a push request names its subscription in (`projects/P/subscriptions/S`), on the
//! real daemon: the one a gRPC request named the subscription in, wrapped and unwrapped with
//! metadata; changed by a ModifyPushConfig asked in another project; kept across a restart;
//! and the CLI's `--push-project`, its default, and what `sub get` shows.

use crate::grpc_admin::grpc_daemon;
use crate::push::field;
use ringpost_tests::grpc::{pubsub, topic_path};
use ringpost_tests::push_receiver::{Receiver, Seen};
use ringpost_tests::{failed, json_field, succeeded};
use std::time::{Duration, Instant};

use pubsub::push_config::{NoWrapper, Wrapper};

/// How long a push may take to arrive on a loaded machine.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(20);

fn in_project(project: &str, name: &str) -> String {
    format!("projects/{project}/subscriptions/{name}")
}

/// The first push to `path` of the message published with `data`, waited for: a wrapped one
/// carries it in base64 (`data_base64`), an unwrapped one as its body. Pushes are at least once
/// (one in flight when its subscription changes or the daemon restarts comes again), so a test
/// looks for the message it published rather than counting.
fn push_of(receiver: &Receiver, path: &str, data: &str, data_base64: &str) -> Seen {
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let seen = receiver.seen(path);
        let wrapped = format!("\"data\":\"{data_base64}\"");
        if let Some(push) =
            seen.iter().find(|push| push.body == data.as_bytes() || push.text().contains(&wrapped))
        {
            return push.clone();
        }
        assert!(Instant::now() < deadline, "no push of '{data}' to {path} among {} pushes", seen.len());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The name a wrapped push gives its subscription.
fn named(push: Seen) -> String {
    field(&push.text(), "subscription").to_owned()
}

/// The name an unwrapped push with metadata gives its subscription.
fn header_named(push: Seen) -> String {
    push.header("x-goog-pubsub-subscription-name").unwrap_or_default().to_owned()
}

#[test]
fn a_push_names_the_project_its_subscription_was_configured_in() {
    let (mut daemon, grpc) = grpc_daemon("push-project");
    let receiver = Receiver::on_free_port(|_, _| (Duration::ZERO, 204));
    grpc.create_plain_topic("orders").unwrap();
    let push = |endpoint: String, wrapper: Option<Wrapper>| pubsub::PushConfig {
        push_endpoint: endpoint,
        wrapper,
        ..Default::default()
    };
    for (name, wrapper) in
        [("wrapped", None), ("raw", Some(Wrapper::NoWrapper(NoWrapper { write_metadata: true })))]
    {
        grpc.create_subscription(pubsub::Subscription {
            name: in_project("my-proj", name),
            topic: topic_path("orders"),
            push_config: Some(push(receiver.url(&format!("/{name}")), wrapper)),
            ack_deadline_seconds: 10,
            ..Default::default()
        })
        .unwrap();
    }
    grpc.publish_data("orders", &[b"first"]).unwrap();
    assert_eq!(named(push_of(&receiver, "/wrapped", "first", "Zmlyc3Q=")), in_project("my-proj", "wrapped"));
    assert_eq!(header_named(push_of(&receiver, "/raw", "first", "")), in_project("my-proj", "raw"));

    // ModifyPushConfig asked in another project: the pushes name that one from then on.
    grpc.modify_push_config(pubsub::ModifyPushConfigRequest {
        subscription: in_project("other-proj", "wrapped"),
        push_config: Some(push(receiver.url("/wrapped"), None)),
    })
    .unwrap();
    // The CLI shows it, and a change of endpoint without --push-project keeps it.
    let shown = succeeded(&daemon.cli(&["sub", "get", "wrapped"]));
    assert_eq!(json_field(&shown, "project"), "other-proj", "{shown}");
    let table = succeeded(&daemon.cli(&["--output", "table", "sub", "get", "wrapped"]));
    assert!(table.contains(", in project other-proj"), "{table}");
    succeeded(&daemon.cli(&[
        "sub",
        "modify-push-config",
        "wrapped",
        "--push-endpoint",
        &receiver.url("/moved"),
    ]));
    succeeded(&daemon.cli(&["publish", "orders", "second"]));
    assert_eq!(
        named(push_of(&receiver, "/moved", "second", "c2Vjb25k")),
        in_project("other-proj", "wrapped")
    );

    // The CLI's --push-project, and its default: ringpost, as the CLI has no projects.
    for (name, project) in [("named", Some("cli-proj")), ("unnamed", None)] {
        let mut args = vec!["sub", "create", name, "--topic", "orders", "--push-endpoint"];
        let url = receiver.url(&format!("/{name}"));
        args.push(&url);
        if let Some(project) = project {
            args.extend(["--push-project", project]);
        }
        let created = succeeded(&daemon.cli(&args));
        assert_eq!(json_field(&created, "project"), project.unwrap_or("ringpost"), "{created}");
    }
    succeeded(&daemon.cli(&[
        "sub",
        "update",
        "unnamed",
        "--push-endpoint",
        &receiver.url("/unnamed"),
        "--push-project",
        "updated-proj",
    ]));
    succeeded(&daemon.cli(&["publish", "orders", "third"]));
    assert_eq!(named(push_of(&receiver, "/named", "third", "dGhpcmQ=")), in_project("cli-proj", "named"));
    assert_eq!(
        named(push_of(&receiver, "/unnamed", "third", "dGhpcmQ=")),
        in_project("updated-proj", "unnamed")
    );
    // A project that is not a project id is the daemon's refusal; one without an endpoint a
    // usage error.
    let refused = failed(&daemon.cli(&[
        "sub",
        "create",
        "badly",
        "--topic",
        "orders",
        "--push-endpoint",
        &receiver.url("/badly"),
        "--push-project",
        "My Project",
    ]));
    assert!(refused.contains("is not a project id"), "{refused}");
    let usage = failed(&daemon.cli(&["sub", "modify-push-config", "named", "--push-project", "p"]));
    assert!(usage.contains("need --push-endpoint"), "{usage}");

    // Kept in the catalog: after a restart, each pushes in its project still.
    daemon.restart();
    succeeded(&daemon.cli(&["publish", "orders", "after the restart"]));
    let restarted = ("after the restart", "YWZ0ZXIgdGhlIHJlc3RhcnQ=");
    assert_eq!(
        named(push_of(&receiver, "/moved", restarted.0, restarted.1)),
        in_project("other-proj", "wrapped")
    );
    assert_eq!(
        named(push_of(&receiver, "/named", restarted.0, restarted.1)),
        in_project("cli-proj", "named")
    );
    assert_eq!(header_named(push_of(&receiver, "/raw", restarted.0, "")), in_project("my-proj", "raw"));
}
