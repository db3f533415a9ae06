//! Push subscriptions' configuration against the real daemon: set at creation, shown by Get
//! and List, changed by UpdateSubscription (`push_config` in the mask) and ModifyPushConfig,
//! switched back to pull in place by an empty one, checked as Pub/Sub checks it (the endpoint,
//! the token's service account, exactly-once delivery refused beside it whichever came first),
//! asked with UpdateSubscription's permission, and kept across a restart. (Pushing itself is
//! not checked here.)

use crate::grpc_admin::{grpc_daemon, refused};
use crate::security::{access_text, daemon_requiring_auth, token, AccessFile, Files};
use ringpost_tests::grpc::{project_path, pubsub, subscription_path, topic_path, Grpc};
use ringpost_tests::Daemon;
use tonic::Code;

use pubsub::push_config::{AuthenticationMethod, NoWrapper, OidcToken, Wrapper};

fn mask(paths: &[&str]) -> Option<prost_types::FieldMask> {
    Some(prost_types::FieldMask { paths: paths.iter().map(|path| (*path).to_owned()).collect() })
}

fn push_config(endpoint: &str) -> pubsub::PushConfig {
    pubsub::PushConfig { push_endpoint: endpoint.into(), ..Default::default() }
}

/// Every part set: attributes, an OIDC token with its audience, no wrapper with metadata.
fn full_push_config(endpoint: &str) -> pubsub::PushConfig {
    pubsub::PushConfig {
        push_endpoint: endpoint.into(),
        attributes: [("x-goog-version".to_owned(), "v1".to_owned())].into(),
        authentication_method: Some(AuthenticationMethod::OidcToken(OidcToken {
            service_account_email: "pusher@project.iam.example".into(),
            audience: "https://receiver.example".into(),
        })),
        wrapper: Some(Wrapper::NoWrapper(NoWrapper { write_metadata: true })),
    }
}

fn subscription(name: &str, topic: &str, push: Option<pubsub::PushConfig>) -> pubsub::Subscription {
    pubsub::Subscription {
        name: subscription_path(name),
        topic: topic_path(topic),
        push_config: push,
        ..Default::default()
    }
}

fn shown_push(grpc: &Grpc, name: &str) -> pubsub::PushConfig {
    let shown =
        grpc.get_subscription(pubsub::GetSubscriptionRequest { subscription: subscription_path(name) });
    shown.unwrap().push_config.expect("a subscription shows its push configuration, empty when it pulls")
}

fn modify(grpc: &Grpc, name: &str, push: Option<pubsub::PushConfig>) -> Result<(), tonic::Status> {
    grpc.modify_push_config(pubsub::ModifyPushConfigRequest {
        subscription: subscription_path(name),
        push_config: push,
    })
}

#[test]
fn a_push_configuration_is_set_shown_changed_removed_and_kept_over_grpc() {
    let (mut daemon, grpc) = grpc_daemon("push-config-grpc");
    grpc.create_plain_topic("orders").unwrap();

    // Created with every part set, shown as given by the creation, Get and List.
    let full = full_push_config("https://receiver.example/push");
    let created = grpc.create_subscription(subscription("pushed", "orders", Some(full.clone()))).unwrap();
    assert_eq!(created.push_config.as_ref(), Some(&full));
    assert_eq!(shown_push(&grpc, "pushed"), full);
    let listed = grpc
        .list_subscriptions(pubsub::ListSubscriptionsRequest {
            project: project_path(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(listed.subscriptions[0].push_config.as_ref(), Some(&full));

    // UpdateSubscription with `push_config` in the mask replaces it; another path leaves it.
    let plain = push_config("http://localhost:8080/push");
    let request = |push: Option<pubsub::PushConfig>, paths: &[&str]| pubsub::UpdateSubscriptionRequest {
        subscription: Some(pubsub::Subscription {
            ack_deadline_seconds: 30,
            ..subscription("pushed", "orders", push)
        }),
        update_mask: mask(paths),
    };
    let updated = grpc.update_subscription(request(Some(plain.clone()), &["push_config"])).unwrap();
    assert_eq!(updated.push_config.as_ref(), Some(&plain));
    let updated = grpc.update_subscription(request(None, &["ack_deadline_seconds"])).unwrap();
    assert_eq!((updated.ack_deadline_seconds, updated.push_config.as_ref()), (30, Some(&plain)));

    // ModifyPushConfig changes it, and an empty one (or none) makes the subscription pull.
    modify(&grpc, "pushed", Some(full.clone())).unwrap();
    assert_eq!(shown_push(&grpc, "pushed"), full);
    modify(&grpc, "pushed", Some(pubsub::PushConfig::default())).unwrap();
    assert_eq!(shown_push(&grpc, "pushed"), pubsub::PushConfig::default());
    modify(&grpc, "pushed", Some(plain.clone())).unwrap();
    modify(&grpc, "pushed", None).unwrap();
    assert_eq!(shown_push(&grpc, "pushed"), pubsub::PushConfig::default());
    let updated = grpc.update_subscription(request(Some(plain.clone()), &["push_config"])).unwrap();
    assert_eq!(updated.push_config.as_ref(), Some(&plain));
    let updated = grpc.update_subscription(request(None, &["push_config"])).unwrap();
    assert_eq!(updated.push_config, Some(pubsub::PushConfig::default()), "an empty one in the mask: pull");
    let said = refused(modify(&grpc, "no-such-subscription", Some(plain.clone())), Code::NotFound, "missing");
    assert!(said.contains("no-such-subscription"), "{said}");

    // Kept across a SIGKILL and restart.
    modify(&grpc, "pushed", Some(full.clone())).unwrap();
    daemon.restart();
    let grpc = Grpc::connect(&daemon.grpc_address.clone().unwrap());
    assert_eq!(shown_push(&grpc, "pushed"), full);
}

#[test]
fn push_configurations_are_checked_as_pub_sub_checks_them_and_refusals_change_nothing() {
    let (_daemon, grpc) = grpc_daemon("push-config-checks");
    grpc.create_plain_topic("orders").unwrap();
    for (endpoint, said) in [
        ("receiver.example/push", "absolute"),
        ("ftp://receiver.example/push", "scheme"),
        ("https://", "no host"),
        ("http://receiver.example:70000/", "port"),
    ] {
        let asked = subscription("pushed", "orders", Some(push_config(endpoint)));
        let message = refused(grpc.create_subscription(asked), Code::InvalidArgument, endpoint);
        assert!(message.contains("invalid push endpoint") && message.contains(said), "{endpoint}: {message}");
    }
    let mut no_account = full_push_config("https://receiver.example/push");
    no_account.authentication_method = Some(AuthenticationMethod::OidcToken(OidcToken::default()));
    let message = refused(
        grpc.create_subscription(subscription("pushed", "orders", Some(no_account))),
        Code::InvalidArgument,
        "token",
    );
    assert!(message.contains("service_account_email"), "{message}");

    // Exactly-once delivery and push on one subscription: refused at creation, and by either
    // update, whichever the subscription had first.
    let both = pubsub::Subscription {
        enable_exactly_once_delivery: true,
        ..subscription("pushed", "orders", Some(push_config("https://receiver.example/push")))
    };
    let message = refused(grpc.create_subscription(both), Code::InvalidArgument, "push and exactly-once");
    assert!(message.contains("exactly-once delivery is not supported on push subscriptions"), "{message}");
    assert!(grpc.subscription_names().unwrap().is_empty(), "a refused subscription was stored");

    let exactly_once =
        pubsub::Subscription { enable_exactly_once_delivery: true, ..subscription("once", "orders", None) };
    grpc.create_subscription(exactly_once).unwrap();
    let message = refused(
        modify(&grpc, "once", Some(push_config("https://receiver.example/push"))),
        Code::InvalidArgument,
        "push on an exactly-once subscription",
    );
    assert!(message.contains("not supported on push subscriptions"), "{message}");
    let push_by_update = pubsub::UpdateSubscriptionRequest {
        subscription: Some(subscription(
            "once",
            "orders",
            Some(push_config("https://receiver.example/push")),
        )),
        update_mask: mask(&["push_config"]),
    };
    refused(grpc.update_subscription(push_by_update), Code::InvalidArgument, "push by update");
    assert_eq!(shown_push(&grpc, "once"), pubsub::PushConfig::default(), "still pulls");

    grpc.create_subscription(subscription(
        "pushed",
        "orders",
        Some(push_config("https://receiver.example/push")),
    ))
    .unwrap();
    let exactly_once_by_update = pubsub::UpdateSubscriptionRequest {
        subscription: Some(pubsub::Subscription {
            enable_exactly_once_delivery: true,
            ..subscription("pushed", "orders", None)
        }),
        update_mask: mask(&["enable_exactly_once_delivery"]),
    };
    let message =
        refused(grpc.update_subscription(exactly_once_by_update), Code::InvalidArgument, "exactly-once");
    assert!(message.contains("not supported on push subscriptions"), "{message}");
    let bad_endpoint = modify(&grpc, "pushed", Some(push_config("https:///push")));
    refused(bad_endpoint, Code::InvalidArgument, "a bad endpoint by ModifyPushConfig");
    let shown =
        grpc.get_subscription(pubsub::GetSubscriptionRequest { subscription: subscription_path("pushed") });
    let shown = shown.unwrap();
    assert!(!shown.enable_exactly_once_delivery);
    assert_eq!(
        shown.push_config,
        Some(push_config("https://receiver.example/push")),
        "refusals change nothing"
    );
}

/// ModifyPushConfig asks UpdateSubscription's permission (`pubsub.subscriptions.update`): a
/// viewer is refused and changes nothing, an editor changes it.
#[test]
fn modify_push_config_needs_the_permission_to_update_the_subscription() {
    let files = Files::new("push-config-auth");
    let (editor, viewer) = (token("editor"), token("viewer"));
    let access =
        AccessFile::new(&files, &access_text(&[&editor, &viewer], &["editor * editor", "viewer * viewer"]));
    let daemon = daemon_requiring_auth("push-config-auth", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let address = daemon.grpc_address.clone().unwrap();
    let as_editor = Grpc::connect_with_token(&address, Some(&editor.secret));
    as_editor.create_plain_topic("orders").unwrap();
    as_editor.create_plain_subscription("pulled", "orders").unwrap();
    let as_viewer = Grpc::connect_with_token(&address, Some(&viewer.secret));
    let push = push_config("https://receiver.example/push");
    refused(modify(&as_viewer, "pulled", Some(push.clone())), Code::PermissionDenied, "a viewer");
    assert_eq!(shown_push(&as_viewer, "pulled"), pubsub::PushConfig::default());
    modify(&as_editor, "pulled", Some(push.clone())).unwrap();
    assert_eq!(shown_push(&as_viewer, "pulled"), push);
}

/// The CLI's push flags on `sub create`, `sub update` and `sub modify-push-config`, and what
/// `sub get` shows: the endpoint, the wrapper, the token's account, and that a plain http
/// endpoint is not encrypted. Flags that need another are usage errors (nothing sent), the
/// daemon's refusals are exit 1 with its message.
#[test]
fn the_cli_sets_shows_and_removes_a_push_configuration() {
    use ringpost_tests::{failed, json_field, succeeded};
    let daemon = Daemon::start("push-config-cli");
    succeeded(&daemon.cli(&["topic", "create", "orders"]));
    let created = succeeded(&daemon.cli(&[
        "sub",
        "create",
        "pushed",
        "--topic",
        "orders",
        "--push-endpoint",
        "https://receiver.example/push",
        "--push-auth-service-account",
        "pusher@project.iam.example",
        "--push-auth-audience",
        "receiver",
    ]));
    assert_eq!(json_field(&created, "endpoint"), "https://receiver.example/push", "{created}");
    let shown = succeeded(&daemon.cli(&["sub", "get", "pushed"]));
    assert_eq!(json_field(&shown, "endpoint"), "https://receiver.example/push", "{shown}");
    assert_eq!(json_field(&shown, "encrypted"), "true");
    assert_eq!(json_field(&shown, "service_account_email"), "pusher@project.iam.example");
    assert_eq!(json_field(&shown, "audience"), "receiver");
    assert_eq!(json_field(&shown, "no_wrapper"), "false");

    let updated = succeeded(&daemon.cli(&[
        "sub",
        "update",
        "pushed",
        "--ack-deadline",
        "30",
        "--push-endpoint",
        "http://localhost:8080/push",
        "--push-no-wrapper",
        "--push-write-metadata",
    ]));
    assert_eq!(json_field(&updated, "ack_deadline_seconds"), "30");
    assert_eq!(json_field(&updated, "endpoint"), "http://localhost:8080/push");
    let table = succeeded(&daemon.cli(&["--output", "table", "sub", "get", "pushed"]));
    assert!(
        table.contains("http://localhost:8080/push (not encrypted), no wrapper, metadata in headers"),
        "{table}"
    );
    let shown = succeeded(&daemon.cli(&["sub", "get", "pushed"]));
    assert_eq!(json_field(&shown, "encrypted"), "false", "{shown}");
    assert_eq!((json_field(&shown, "no_wrapper"), json_field(&shown, "write_metadata")), ("true", "true"));
    assert_eq!(json_field(&shown, "service_account_email"), "", "an update sets the configuration whole");

    // An update without push flags leaves it; an empty endpoint makes the subscription pull.
    succeeded(&daemon.cli(&["sub", "update", "pushed", "--ack-deadline", "20"]));
    assert_eq!(
        json_field(&succeeded(&daemon.cli(&["sub", "get", "pushed"])), "endpoint"),
        "http://localhost:8080/push"
    );
    succeeded(&daemon.cli(&["sub", "update", "pushed", "--push-endpoint", ""]));
    let shown = succeeded(&daemon.cli(&["sub", "get", "pushed"]));
    assert_eq!(json_field(&shown, "push_config"), "null", "{shown}");
    let table = succeeded(&daemon.cli(&["--output", "table", "sub", "get", "pushed"]));
    assert!(table.lines().nth(1).is_some_and(|row| row.trim_end().ends_with("pull")), "{table}");

    // modify-push-config: with an endpoint it pushes, without one it pulls.
    succeeded(&daemon.cli(&[
        "sub",
        "modify-push-config",
        "pushed",
        "--push-endpoint",
        "https://receiver.example/b",
    ]));
    assert_eq!(
        json_field(&succeeded(&daemon.cli(&["sub", "get", "pushed"])), "endpoint"),
        "https://receiver.example/b"
    );
    succeeded(&daemon.cli(&["sub", "modify-push-config", "pushed"]));
    assert_eq!(json_field(&succeeded(&daemon.cli(&["sub", "get", "pushed"])), "push_config"), "null");

    // Usage errors, found before anything is sent (exit 2), and the daemon's refusal (exit 1).
    for (flags, said) in [
        (&["--push-no-wrapper"][..], "need --push-endpoint"),
        (&["--push-endpoint", "https://r.example/", "--push-write-metadata"][..], "--push-no-wrapper"),
        (
            &["--push-endpoint", "https://r.example/", "--push-auth-audience", "a"][..],
            "--push-auth-service-account",
        ),
        (&["--push-endpoint", "", "--push-no-wrapper"][..], "empty --push-endpoint"),
    ] {
        let output = daemon.cli(&[&["sub", "modify-push-config", "pushed"][..], flags].concat());
        let error = failed(&output);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {error}");
        assert!(error.contains(said), "{flags:?}: {error}");
    }
    let output =
        daemon.cli(&["sub", "create", "bad", "--topic", "orders", "--push-endpoint", "receiver.example"]);
    let error = failed(&output);
    assert_eq!(output.status.code(), Some(1), "{error}");
    assert!(error.contains("InvalidArgument") && error.contains("invalid push endpoint"), "{error}");
    assert!(failed(&daemon.cli(&["sub", "get", "bad"])).contains("NotFound"));
}

/// What one protocol sets the other shows: gRPC's configuration through the native client, and
/// the native client's through gRPC.
#[test]
fn the_native_protocol_and_grpc_each_see_the_push_configuration_the_other_set() {
    let (daemon, grpc) = grpc_daemon("push-config-both");
    let client = daemon.client();
    grpc.create_plain_topic("orders").unwrap();
    grpc.create_subscription(subscription(
        "by-grpc",
        "orders",
        Some(full_push_config("https://receiver.example/g")),
    ))
    .unwrap();
    let shown = ringpost_client::block_on(client.get_subscription_with_push("by-grpc")).unwrap();
    assert_eq!(shown.push.endpoint, "https://receiver.example/g");
    assert!(shown.push.no_wrapper && shown.push.write_metadata);
    assert_eq!(
        (shown.push.service_account_email.as_str(), shown.push.audience.as_str()),
        ("pusher@project.iam.example", "https://receiver.example")
    );
    assert_eq!(shown.push.attributes.len(), 1, "attributes set over gRPC are kept");
    // The command clients built before push subscriptions use still reads it (without push).
    assert_eq!(ringpost_client::block_on(client.get_subscription("by-grpc")).unwrap().topic, "orders");

    let push = ringpost_client::PushConfig {
        endpoint: "http://localhost:9/n".into(),
        no_wrapper: true,
        service_account_email: "native@project.iam.example".into(),
        ..Default::default()
    };
    let asked = ringpost_client::Subscription {
        name: "by-native".into(),
        topic: "orders".into(),
        ..Default::default()
    };
    let created = ringpost_client::block_on(client.create_subscription_with_push(asked, push)).unwrap();
    assert_eq!(created.push.endpoint, "http://localhost:9/n");
    let expected = pubsub::PushConfig {
        push_endpoint: "http://localhost:9/n".into(),
        authentication_method: Some(AuthenticationMethod::OidcToken(OidcToken {
            service_account_email: "native@project.iam.example".into(),
            audience: String::new(),
        })),
        wrapper: Some(Wrapper::NoWrapper(NoWrapper { write_metadata: false })),
        ..Default::default()
    };
    assert_eq!(shown_push(&grpc, "by-native"), expected);
    // The native update and ModifyPushConfig, seen over gRPC; exactly-once refused as there.
    let update = ringpost_client::SubscriptionUpdate {
        push: Some(ringpost_client::PushConfig {
            endpoint: "https://receiver.example/u".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let updated =
        ringpost_client::block_on(client.update_subscription_with_push("by-native", update)).unwrap();
    assert_eq!(updated.push.endpoint, "https://receiver.example/u");
    assert_eq!(shown_push(&grpc, "by-native"), push_config("https://receiver.example/u"));
    ringpost_client::block_on(client.modify_push_config("by-native", Default::default())).unwrap();
    assert_eq!(shown_push(&grpc, "by-native"), pubsub::PushConfig::default());
    let exactly_once =
        pubsub::Subscription { enable_exactly_once_delivery: true, ..subscription("once", "orders", None) };
    grpc.create_subscription(exactly_once).unwrap();
    let push =
        ringpost_client::PushConfig { endpoint: "https://receiver.example/x".into(), ..Default::default() };
    let error = ringpost_client::block_on(client.modify_push_config("once", push)).unwrap_err();
    assert!(error.to_string().contains("not supported on push subscriptions"), "{error}");
}

/// A `ringpost` built before push subscriptions (its path in `RINGPOST_OLD_CLI`; the test says
/// so and passes without it) still creates, reads and updates subscriptions on this daemon,
/// a push one read without its configuration and left pushing by an update of another field,
/// and reads the stats.
#[test]
fn an_older_cli_still_creates_and_reads_subscriptions() {
    use ringpost_tests::{json_field, succeeded};
    let Some(old_cli) = std::env::var_os("RINGPOST_OLD_CLI") else {
        eprintln!("RINGPOST_OLD_CLI is not set: the older CLI's check is skipped");
        return;
    };
    let daemon = Daemon::start("push-config-old-cli");
    let old = |args: &[&str]| {
        std::process::Command::new(&old_cli).arg("--server").arg(&daemon.address).args(args).output().unwrap()
    };
    succeeded(&old(&["topic", "create", "orders"]));
    succeeded(&old(&["sub", "create", "pulled", "--topic", "orders", "--ack-deadline", "20"]));
    assert_eq!(json_field(&succeeded(&old(&["sub", "get", "pulled"])), "ack_deadline_seconds"), "20");
    succeeded(&daemon.cli(&[
        "sub",
        "create",
        "pushed",
        "--topic",
        "orders",
        "--push-endpoint",
        "https://r.example/p",
    ]));
    assert_eq!(json_field(&succeeded(&old(&["sub", "get", "pushed"])), "topic"), "orders");
    assert!(succeeded(&old(&["sub", "list"])).contains("\"pushed\""));
    succeeded(&old(&["sub", "update", "pushed", "--ack-deadline", "30"]));
    let shown = succeeded(&daemon.cli(&["sub", "get", "pushed"]));
    assert_eq!(
        (json_field(&shown, "ack_deadline_seconds"), json_field(&shown, "endpoint")),
        ("30", "https://r.example/p")
    );
    // Its stats (Stats, whose answer is as it was) list both subscriptions, the push one as a
    // subscription like any; this CLI shows its pushing besides.
    let stats = succeeded(&old(&["stats"]));
    for name in ["pulled", "pushed"] {
        let subscription = format!("\"subscription\":\"{name}\"");
        assert!(stats.lines().any(|line| line.contains(&subscription)), "{name} in {stats}");
    }
    assert!(!stats.contains("\"kind\":\"push\""), "{stats}");
    let stats = succeeded(&daemon.cli(&["stats"]));
    let push = stats.lines().find(|line| line.contains("\"kind\":\"push\"")).expect("a push line");
    assert_eq!(json_field(push, "endpoint"), "https://r.example/p");
}

/// This build's `ringpost stats` against a `ringpostd` built before push subscriptions (its
/// path in `RINGPOST_OLD_DAEMON`; the test says so and passes without it): that daemon answers
/// StatsWithPush `Unimplemented`, and the CLI shows what its Stats answers, with no push table.
#[test]
fn this_clis_stats_read_an_older_daemon() {
    use ringpost_tests::succeeded;
    let Some(old_daemon) = std::env::var_os("RINGPOST_OLD_DAEMON") else {
        eprintln!("RINGPOST_OLD_DAEMON is not set: the older daemon's check is skipped");
        return;
    };
    let mut daemon = Daemon::prepare("push-stats-old-daemon", Vec::new(), Vec::new());
    daemon.program = old_daemon.into();
    daemon.spawn();
    succeeded(&daemon.cli(&["topic", "create", "orders"]));
    succeeded(&daemon.cli(&["sub", "create", "pulled", "--topic", "orders"]));
    let stats = succeeded(&daemon.cli(&["stats"]));
    assert!(stats.contains("\"subscription\":\"pulled\""), "{stats}");
    assert!(stats.contains("\"kind\":\"process\""), "{stats}");
    assert!(!stats.contains("\"kind\":\"push\""), "{stats}");
    let table = succeeded(&daemon.cli(&["--output", "table", "stats"]));
    assert!(table.contains("pulled") && !table.contains("LAST_ERROR"), "{table}");
}
