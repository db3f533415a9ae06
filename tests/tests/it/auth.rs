//! Authentication and permissions (docs/TESTING.md T17) against the real daemon, the client
//! library and the CLI: tokens (valid, missing, malformed, unknown, expired, lacking the
//! role), a denied publish that leaves no record, each role and resource pattern, the special
//! principals, revocation and new grants while connections are open, the default mode of a
//! loopback and a non-loopback listener, and the rate-limited audit log. The TLS half is in
//! `tls.rs`.

use crate::connections::{connect, forwarders, read_frame};
use crate::security::*;
use ringpost_client::{block_on, ErrorCode, Message, Security, StreamSettings, Subscription};
use ringpost_tests::{create_subscription, drain, failed, succeeded, within, Daemon};
use ringpost_wire::frame::{decode_error, encode_frame, FrameHeader};
use ringpost_wire::messages::{PublishRequest, PubsubMessage};
use ringpost_wire::Command;
use std::io::Write;
use std::time::{Duration, Instant};

/// Audit lines each shard may write a second (the daemon's `AUDIT_LINES_PER_SECOND_MAX`).
const AUDIT_LINES_PER_SECOND_MAX: usize = 10;
/// Frame bodies a connection may send before it authenticates, under required mode.
const FRAME_BODY_BYTES_UNAUTHENTICATED_MAX: u32 = 16 * 1024;

fn subscription(name: &str, topic: &str) -> Subscription {
    Subscription { name: name.into(), topic: topic.into(), ack_deadline_seconds: 10, ..Default::default() }
}

/// A raw Authenticate with `token` on a new connection to `address`: the request's status and
/// what followed (the server must then close the connection with an error frame of id 0).
fn raw_authenticate_refused(address: &str, token: &str, what: &str) -> String {
    let mut stream = connect(address);
    stream.write_all(&authenticate_frame(token, 5)).unwrap();
    let frames = frames_until_closed(&mut stream, Duration::from_secs(5));
    let (request_id, status) = frames.first().cloned().unwrap_or_else(|| panic!("{what}: no answer"));
    let status = status.unwrap_or_else(|| panic!("{what}: the Authenticate was accepted"));
    assert_eq!(request_id, 5, "{what}: {frames:?}");
    assert_eq!(status.code, ErrorCode::Unauthenticated, "{what}: {status}");
    assert!(!status.message.contains(token) || token.is_empty(), "{what}: the message repeats the token");
    status.message
}

#[test]
fn tokens_are_checked_unauthenticated_and_permission_denied_named_as_such() {
    let files = Files::new("auth-tokens");
    let root = token("root");
    let alice = token("alice");
    let expired = token_expiring("bob", Some("2020-01-01T00:00:00Z"));
    let access = AccessFile::new(
        &files,
        &access_text(
            &[&root, &alice, &expired],
            &["admin * root", "publisher topic:orders-* alice", "publisher * bob"],
        ),
    );
    let daemon = daemon_requiring_auth("auth-tokens", &access, &[]);
    let admin = client_with(&daemon, &root);
    block_on(admin.create_topic("orders-eu")).unwrap();

    // A valid token does what its role allows, and only that: PermissionDenied, naming the
    // principal, never the token.
    let client = client_with(&daemon, &alice);
    block_on(client.publish("orders-eu", vec![Message::new("by alice")])).unwrap();
    let said =
        assert_code(block_on(client.get_topic("orders-eu")), ErrorCode::PermissionDenied, "alice gets");
    assert!(said.contains(&alice.principal) && !said.contains(&alice.secret), "{said}");
    assert_code(block_on(client.create_topic("orders-us")), ErrorCode::PermissionDenied, "alice creates");

    // No credential: Unauthenticated (Hello alone is open to everyone).
    let nobody = anonymous_client(&daemon);
    let said =
        assert_code(block_on(nobody.create_topic("xyz-topic")), ErrorCode::Unauthenticated, "no token");
    assert!(said.contains("credential"), "{said}");
    assert_code(
        block_on(nobody.publish("orders-eu", vec![Message::new("x")])),
        ErrorCode::Unauthenticated,
        "no token",
    );

    // Unknown and expired tokens: Unauthenticated, at the connection or its first request.
    let unknown = random_secret();
    for (secret, what) in [(&unknown, "an unknown token"), (&expired.secret, "an expired token")] {
        let outcome =
            connect_and(&daemon.address, Security::default().with_token(secret.clone()), |client| {
                block_on(client.list_topics())
            });
        let said = assert_code(outcome, ErrorCode::Unauthenticated, what);
        assert!(!said.contains(secret.as_str()), "{what}: the message repeats the token: {said}");
        if secret == &expired.secret {
            assert!(said.contains("expired"), "{said}");
        }
    }

    // Malformed tokens, on the wire as no client library would send them: refused, then the
    // connection is closed (an error frame of id 0), on the router's port and a forwarder's.
    for address in [daemon.address.clone(), forwarders(&daemon)[0].clone()] {
        raw_authenticate_refused(&address, "", "an empty token");
        raw_authenticate_refused(&address, &"a".repeat(2000), "a token over 1024 bytes");
        raw_authenticate_refused(&address, "rpt_\u{1}\u{7f}é", "a token with unprintable characters");
        raw_authenticate_refused(&address, &unknown, "an unknown token");
    }

    // The CLI prints the codes by name.
    let cli = |words: &[&str]| daemon.cli(words);
    succeeded(&cli(&["--token", &alice.secret, "publish", "orders-eu", "from the CLI"]));
    let said = failed(&cli(&["--token", &alice.secret, "topic", "get", "orders-eu"]));
    assert!(said.contains("PermissionDenied"), "{said}");
    let said = failed(&cli(&["topic", "create", "by-nobody"]));
    assert!(said.contains("Unauthenticated"), "{said}");
    let said = failed(&cli(&["--token", &unknown, "topic", "list"]));
    assert!(said.contains("Unauthenticated") && !said.contains(&unknown), "{said}");
    let said = failed(&cli(&["--token", &expired.secret, "topic", "list"]));
    assert!(said.contains("Unauthenticated"), "{said}");
    assert_eq!(block_on(admin.list_topics()).unwrap().len(), 1, "nothing refused was created");
}

/// `ringpost token create NAME [--expires T]`: the token, then its access-file line.
fn token_from_the_cli(name: &str, expires: Option<&str>) -> Token {
    let mut command = std::process::Command::new(ringpost_tests::binary("ringpost"));
    command.args(["token", "create", name]);
    if let Some(expires) = expires {
        command.args(["--expires", expires]);
    }
    let printed = succeeded(&command.output().unwrap());
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "{printed}");
    let (secret, line) = (lines[0].to_owned(), lines[1].to_owned());
    assert!(secret.starts_with("rpt_") && secret.len() == 68, "{secret}");
    // The line holds the digest, never the token, and the digest is SHA-256's.
    assert!(!line.contains(&secret), "{line}");
    assert!(line.starts_with(&format!("token {name} sha256:{}", sha256_hex(&secret))), "{line}");
    Token { principal: name.to_owned(), secret, line }
}

#[test]
fn tokens_made_by_the_cli_are_accepted_until_they_expire() {
    let files = Files::new("auth-token-create");
    let lasting = token_from_the_cli("carol", Some("2999-01-01T00:00:00Z"));
    assert!(lasting.line.ends_with("expires=2999-01-01T00:00:00Z"), "{}", lasting.line);
    let forever = token_from_the_cli("dave", None);
    let past = token_from_the_cli("erin", Some("2020-06-01T12:00:00Z"));
    let access =
        AccessFile::new(&files, &access_text(&[&lasting, &forever, &past], &["editor * carol dave erin"]));
    let daemon = daemon_requiring_auth("auth-token-create", &access, &[]);
    block_on(client_with(&daemon, &lasting).create_topic("by-carol")).unwrap();
    block_on(client_with(&daemon, &forever).publish("by-carol", vec![Message::new("by dave")])).unwrap();
    let outcome =
        connect_and(&daemon.address, Security::default().with_token(past.secret.clone()), |client| {
            block_on(client.get_topic("by-carol"))
        });
    assert_code(outcome, ErrorCode::Unauthenticated, "a token that expired");
    // The environment variable is the CLI's default for --token.
    let output = std::process::Command::new(ringpost_tests::binary("ringpost"))
        .args(["--server", &daemon.address, "topic", "get", "by-carol"])
        .env("RINGPOST_TOKEN", &forever.secret)
        .output()
        .unwrap();
    succeeded(&output);
}

#[test]
fn before_authenticating_a_large_frame_closes_the_connection() {
    let files = Files::new("auth-large-frame");
    let root = token("root");
    let access = AccessFile::new(&files, &access_text(&[&root], &["admin * root"]));
    let daemon = daemon_requiring_auth("auth-large-frame", &access, &[]);
    for address in [daemon.address.clone(), forwarders(&daemon)[1].clone()] {
        let mut stream = connect(&address);
        let header = FrameHeader {
            body_length: FRAME_BODY_BYTES_UNAUTHENTICATED_MAX + 1,
            command: Command::Publish.code(),
            flags: 0,
            request_id: 3,
        };
        stream.write_all(&header.encode()).unwrap();
        let frames = frames_until_closed(&mut stream, Duration::from_secs(2));
        let status = frames.iter().find_map(|(_, status)| status.clone()).expect("told why");
        assert_eq!(status.code, ErrorCode::Unauthenticated, "{status}");
        assert!(status.message.contains("authenticate"), "{status}");
        // Authenticated, the same frame is read (and refused only by what it holds).
        let mut stream = authenticated_stream(&address, &root.secret);
        let request = PublishRequest {
            topic: "missing".into(),
            messages: vec![PubsubMessage { data: vec![7; 20 * 1024], ..Default::default() }],
        };
        stream.write_all(&encode_frame(Command::Publish.code(), 0, 4, &request)).unwrap();
        let (header, body) = read_frame(&mut stream, REQUEST_TIMEOUT).expect("answered");
        assert_eq!(header.request_id, 4);
        if header.is_error() {
            let status = decode_error(&body);
            assert!(
                !matches!(status.code, ErrorCode::Unauthenticated | ErrorCode::PermissionDenied),
                "{status}"
            );
        }
    }
}

#[test]
fn a_denied_publish_leaves_no_record() {
    let files = Files::new("auth-denied-publish");
    let root = token("root");
    let publisher = token("publisher-a");
    let reader = token("reader-b");
    let access = AccessFile::new(
        &files,
        &access_text(
            &[&root, &publisher, &reader],
            &[
                "admin * root",
                "publisher topic:topic-a publisher-a",
                "subscriber subscription:b-sub reader-b",
            ],
        ),
    );
    let daemon = daemon_requiring_auth("auth-denied-publish", &access, &[]);
    let admin = client_with(&daemon, &root);
    block_on(admin.create_topic("topic-a")).unwrap();
    block_on(admin.create_topic("topic-b")).unwrap();
    create_subscription(&admin, "b-sub", "topic-b", 10);
    let first = block_on(admin.publish("topic-b", vec![Message::new("first")])).unwrap()[0];

    let client = client_with(&daemon, &publisher);
    block_on(client.publish("topic-a", vec![Message::new("allowed")])).unwrap();
    for _ in 0..3 {
        assert_code(
            block_on(client.publish("topic-b", vec![Message::new("denied"), Message::new("denied too")])),
            ErrorCode::PermissionDenied,
            "publishing to b",
        );
    }
    // Straight to the forwarders too, past the router's lookup: the owner refuses it before
    // it writes (the other answers that it does not own the topic, or refuses the same way).
    let mut refusals = Vec::new();
    for forwarder in forwarders(&daemon) {
        let mut stream = authenticated_stream(&forwarder, &publisher.secret);
        let request = PublishRequest {
            topic: "topic-b".into(),
            messages: vec![PubsubMessage { data: b"denied on the wire".to_vec(), ..Default::default() }],
        };
        stream.write_all(&encode_frame(Command::Publish.code(), 0, 2, &request)).unwrap();
        let (header, body) = read_frame(&mut stream, REQUEST_TIMEOUT).expect("answered");
        assert!(header.is_error(), "a forwarder took the publish");
        refusals.push(decode_error(&body).code);
    }
    assert!(
        refusals.iter().all(|code| matches!(code, ErrorCode::PermissionDenied | ErrorCode::NotOwner))
            && refusals.contains(&ErrorCode::PermissionDenied),
        "{refusals:?}"
    );

    // The subscriber with rights on b sees only what was allowed, and the next id follows the
    // first: ids are log offsets, so a denied publish that was written would leave a gap.
    let subscriber = client_with(&daemon, &reader);
    let delivered = drain(&subscriber, "b-sub", true);
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered.get(&first).map(Vec::as_slice), Some(&b"first"[..]));
    let second = block_on(admin.publish("topic-b", vec![Message::new("second")])).unwrap()[0];
    assert_eq!(second, first + 1, "the denied publishes took ids");
    let delivered = drain(&subscriber, "b-sub", true);
    assert_eq!(delivered.keys().copied().collect::<Vec<_>>(), vec![second]);
}

#[test]
fn each_role_grants_what_pubsub_roles_do() {
    let files = Files::new("auth-roles");
    let [root, publisher, subscriber, viewer, editor, orders] =
        ["root", "pub", "sub", "view", "edit", "orders"].map(token);
    let access = AccessFile::new(
        &files,
        &access_text(
            &[&root, &publisher, &subscriber, &viewer, &editor, &orders],
            &[
                "admin * root",
                "publisher topic:topic-1 pub",
                "subscriber subscription:sub-1 sub",
                "subscriber topic:topic-1 sub",
                "editor subscription:sub-own-* sub",
                "viewer topic:vis-* view",
                "viewer subscription:sub-1 view",
                "editor * edit",
                "publisher topic:orders-* orders",
                "viewer topic:topic-2 allAuthenticatedUsers",
            ],
        ),
    );
    let daemon = daemon_requiring_auth("auth-roles", &access, &[]);
    let admin = client_with(&daemon, &root);
    for topic in ["topic-1", "topic-2", "vis-1", "vis-2", "orders", "orders-eu"] {
        block_on(admin.create_topic(topic)).unwrap();
    }
    create_subscription(&admin, "sub-1", "topic-1", 10);
    let denied = ErrorCode::PermissionDenied;

    // publisher: publish, nothing else.
    let client = client_with(&daemon, &publisher);
    block_on(client.publish("topic-1", vec![Message::new("one")])).unwrap();
    assert_code(
        block_on(client.publish("topic-2", vec![Message::new("x")])),
        denied,
        "pub publishes topic-2",
    );
    assert_code(block_on(client.get_topic("topic-1")), denied, "pub gets topic-1");
    assert_code(block_on(client.create_topic("topic-3")), denied, "pub creates");
    assert_code(block_on(client.pull("sub-1", 10, 0)), denied, "pub pulls");
    assert!(block_on(client.list_topics()).unwrap().iter().all(|topic| topic.name == "topic-2"));
    // allAuthenticatedUsers covers every token's holder.
    block_on(client.get_topic("topic-2")).unwrap();

    // subscriber: consume its subscription, attach new ones to the topic it holds the role on.
    let client = client_with(&daemon, &subscriber);
    let delivered = drain(&client, "sub-1", true);
    assert_eq!(delivered.len(), 1);
    block_on(client.create_subscription(subscription("sub-own-1", "topic-1"))).unwrap();
    assert_code(
        block_on(client.create_subscription(subscription("sub-own-2", "topic-2"))),
        denied,
        "attach to t2",
    );
    assert_code(
        block_on(client.create_subscription(subscription("other", "topic-1"))),
        denied,
        "create other",
    );
    assert_code(block_on(client.publish("topic-1", vec![Message::new("x")])), denied, "sub publishes");
    assert_code(block_on(client.delete_subscription("sub-1")), denied, "sub deletes s1");

    // viewer: get and list, and a list shows only what it may see.
    let client = client_with(&daemon, &viewer);
    block_on(client.get_topic("vis-1")).unwrap();
    let mut names: Vec<String> =
        block_on(client.list_topics()).unwrap().into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["topic-2", "vis-1", "vis-2"]);
    let subscriptions = block_on(client.list_subscriptions(None)).unwrap();
    assert_eq!(subscriptions.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["sub-1"]);
    block_on(client.get_subscription("sub-1")).unwrap();
    assert_code(block_on(client.get_topic("topic-1")), denied, "view gets topic-1");
    assert_code(block_on(client.publish("vis-1", vec![Message::new("x")])), denied, "view publishes");
    assert_code(block_on(client.pull("sub-1", 10, 0)), denied, "view pulls");
    // A role on topics says nothing of the daemon: its statistics need a grant on `*`.
    assert_code(block_on(client.stats()), denied, "view stats");

    // editor on `*`: every topic, subscription and snapshot, and the statistics; not the
    // daemon's administration.
    let client = client_with(&daemon, &editor);
    block_on(client.create_topic("edit-1")).unwrap();
    create_subscription(&client, "e1-sub", "edit-1", 10);
    block_on(client.publish("edit-1", vec![Message::new("x")])).unwrap();
    block_on(client.create_snapshot("e1-snap", "e1-sub")).unwrap();
    block_on(client.delete_subscription("e1-sub")).unwrap();
    block_on(client.delete_topic("edit-1")).unwrap();
    block_on(client.stats()).unwrap();
    assert_code(block_on(client.resync_directory(0)), denied, "editor resyncs");

    // admin: the daemon too.
    block_on(admin.resync_directory(0)).unwrap();
    block_on(admin.stats()).unwrap();

    // A pattern: `orders-*` is every name that starts so, not `orders` itself.
    let client = client_with(&daemon, &orders);
    block_on(client.publish("orders-eu", vec![Message::new("x")])).unwrap();
    assert_code(
        block_on(client.publish("orders", vec![Message::new("x")])),
        denied,
        "orders publishes orders",
    );
    assert_code(block_on(client.publish("topic-1", vec![Message::new("x")])), denied, "orders publishes t1");

    // Anonymous holds nothing here (allAuthenticatedUsers does not cover it): Unauthenticated.
    let nobody = anonymous_client(&daemon);
    assert_code(block_on(nobody.get_topic("topic-2")), ErrorCode::Unauthenticated, "anonymous gets t2");
}

#[test]
fn granting_all_users_makes_an_emulator_style_setup() {
    let files = Files::new("auth-all-users");
    let operator = token("operator");
    let access =
        AccessFile::new(&files, &access_text(&[&operator], &["editor * allUsers", "admin * operator"]));
    let daemon = daemon_requiring_auth("auth-all-users", &access, &[]);
    // Without any credential: everything an editor may, through the client library and the CLI.
    let client = anonymous_client(&daemon);
    block_on(client.create_topic("emulated")).unwrap();
    create_subscription(&client, "emulated-sub", "emulated", 10);
    block_on(client.publish("emulated", vec![Message::new("hello")])).unwrap();
    assert_eq!(drain(&client, "emulated-sub", true).len(), 1);
    block_on(client.stats()).unwrap();
    succeeded(&daemon.cli(&["publish", "emulated", "from the CLI"]));
    succeeded(&daemon.cli(&["topic", "list"]));
    // What the grant leaves out is still refused: anonymous, so Unauthenticated.
    assert_code(block_on(client.resync_directory(0)), ErrorCode::Unauthenticated, "anonymous resyncs");
    // A token's holder is among all users too, and holds its own grants besides.
    let client = client_with(&daemon, &operator);
    block_on(client.publish("emulated", vec![Message::new("by the operator")])).unwrap();
    block_on(client.resync_directory(0)).unwrap();
}

#[test]
fn revoking_a_token_closes_its_connections_and_a_new_grant_needs_no_restart() {
    let files = Files::new("auth-revoke");
    let root = token("root");
    let temporary = token("temporary");
    let late = token("late");
    let grants =
        ["admin * root", "subscriber subscription:r-sub temporary", "publisher topic:topic-r temporary"];
    let access = AccessFile::new(&files, &access_text(&[&root, &temporary, &late], &grants));
    let daemon = daemon_requiring_auth("auth-revoke", &access, &[]);
    let admin = client_with(&daemon, &root);
    block_on(admin.create_topic("topic-r")).unwrap();
    block_on(admin.create_topic("topic-c")).unwrap();
    create_subscription(&admin, "r-sub", "topic-r", 10);

    // The token's holder: a streaming pull, a publisher that published once and now idles,
    // and raw authenticated connections idling on every port.
    let holder = client_with(&daemon, &temporary);
    let mut stream = block_on(holder.streaming_pull("r-sub", StreamSettings::default())).unwrap();
    block_on(holder.publish("topic-r", vec![Message::new("before")])).unwrap();
    let batch = block_on(stream.next()).expect("a batch").unwrap();
    assert_eq!(batch.len(), 1);
    block_on(holder.acknowledge("r-sub", vec![batch[0].ack_id.clone()])).unwrap();
    let mut idle: Vec<_> = std::iter::once(daemon.address.clone())
        .chain(forwarders(&daemon))
        .map(|address| authenticated_stream(&address, &temporary.secret))
        .collect();
    let other = client_with(&daemon, &late);
    assert_code(
        block_on(other.publish("topic-c", vec![Message::new("x")])),
        ErrorCode::PermissionDenied,
        "late",
    );

    // Revoke one token and grant another a role, in one new file renamed over the old.
    let mut grants = grants.to_vec();
    grants.push("publisher topic:topic-c late");
    access.replace(&access_text(&[&root, &late], &grants));
    let changed = Instant::now();

    // Every connection of the revoked token is told so and closed.
    for connection in &mut idle {
        let frames = frames_until_closed(connection, RELOAD_WITHIN + Duration::from_secs(1));
        let (request_id, status) = frames.last().cloned().expect("an error frame before the close");
        let status = status.expect("an error frame");
        assert_eq!((request_id, status.code), (0, ErrorCode::Unauthenticated), "{status}");
    }
    let ended = within(RELOAD_WITHIN + Duration::from_secs(1), stream.next()).expect("the stream ended");
    let closed_in = changed.elapsed();
    match ended {
        Some(Err(error)) => assert_eq!(error.code(), ErrorCode::Unauthenticated, "{error}"),
        Some(Ok(batch)) => panic!("the revoked stream delivered {batch:?}"),
        None => {}
    }
    assert!(closed_in <= RELOAD_WITHIN, "the revoked connections closed after {closed_in:?}");
    println!("T17: revoked token's connections closed {closed_in:?} after the file changed");

    // New requests with it fail, on the client that held it and on a new one.
    assert_code(
        block_on(holder.publish("topic-r", vec![Message::new("after")])),
        ErrorCode::Unauthenticated,
        "the revoked holder publishes",
    );
    let outcome =
        connect_and(&daemon.address, Security::default().with_token(temporary.secret.clone()), |client| {
            block_on(client.list_topics())
        });
    assert_code(outcome, ErrorCode::Unauthenticated, "a new client with the revoked token");

    // The new grant holds without a restart, on the connection opened before it.
    eventually(RELOAD_WITHIN, || block_on(other.publish("topic-c", vec![Message::new("granted")])))
        .expect("the new grant took effect");
    println!("T17: a new grant held {:?} after the file changed", changed.elapsed());
    assert_eq!(daemon.starts(), 1);
    let delivered = drain(&admin, "r-sub", true);
    assert!(delivered.is_empty(), "{delivered:?}");
}

#[test]
fn authentication_is_off_on_loopback_and_required_elsewhere_by_default() {
    let files = Files::new("auth-default-mode");
    let root = token("root");
    // Nothing granted to anonymous, and still: on loopback the default is off.
    let access = AccessFile::new(&files, &access_text(&[&root], &["admin * root"]));
    let loopback =
        Daemon::start_with("auth-loopback", Vec::new(), flags(&["--access-file", &text(&access.path)]));
    let client = anonymous_client(&loopback);
    block_on(client.create_topic("open")).unwrap();
    block_on(client.publish("open", vec![Message::new("x")])).unwrap();
    drop(loopback);

    // On every address (not loopback): required, and the start says so.
    let everywhere =
        OwnDaemon::start("auth-everywhere", "0.0.0.0:0", &flags(&["--access-file", &text(&access.path)]));
    let log = everywhere.log();
    assert!(log.lines().any(|line| line.contains(" WARN ") && line.contains("TLS")), "{log}");
    let client = connect_with(&everywhere.address, Security::default());
    assert_code(block_on(client.create_topic("closed")), ErrorCode::Unauthenticated, "anonymous on 0.0.0.0");
    let client = connect_with(&everywhere.address, Security::default().with_token(root.secret.clone()));
    block_on(client.create_topic("closed")).unwrap();
    block_on(client.publish("closed", vec![Message::new("x")])).unwrap();
    drop(everywhere);

    // Required with no access file: everything refused, and a warning says so.
    let refusing = OwnDaemon::start("auth-no-file", "0.0.0.0:0", &[]);
    let log = refusing.log();
    assert!(log.lines().any(|line| line.contains(" WARN ") && line.contains("access")), "{log}");
    let client = connect_with(&refusing.address, Security::default());
    assert_code(
        block_on(client.create_topic("refused")),
        ErrorCode::Unauthenticated,
        "without an access file",
    );
    // A list without a credential is refused too, as on the gRPC API, rather than answered
    // with an empty page.
    assert_code(block_on(client.list_topics()), ErrorCode::Unauthenticated, "an anonymous list");
    drop(refusing);

    // Off on every address: served, with a warning.
    let open = OwnDaemon::start("auth-off-everywhere", "0.0.0.0:0", &flags(&["--auth", "off"]));
    let log = open.log();
    assert!(log.lines().any(|line| line.contains(" WARN ") && line.contains("anyone")), "{log}");
    let client = connect_with(&open.address, Security::default());
    block_on(client.create_topic("anyone")).unwrap();
}

/// The audit lines in `log`, and the refusals they say were left out ("(N more denial(s) not
/// logged since the last line)").
fn audit_lines(log: &str) -> (usize, u64) {
    let lines: Vec<&str> = log.lines().filter(|line| line.contains("ringpostd: audit: denied")).collect();
    let left_out = lines
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.windows(2).find_map(|pair| {
                (pair[1] == "more").then(|| pair[0].trim_start_matches('(').parse::<u64>().ok()).flatten()
            })
        })
        .sum();
    (lines.len(), left_out)
}

#[test]
fn denials_are_audited_at_a_bounded_rate_with_a_count_of_those_left_out() {
    let files = Files::new("auth-audit");
    let root = token("root");
    let nosy = token("nosy");
    let access = AccessFile::new(&files, &access_text(&[&root, &nosy], &["admin * root"]));
    let daemon = daemon_requiring_auth("auth-audit", &access, &[]);
    block_on(client_with(&daemon, &root).create_topic("secret")).unwrap();
    // Every refusal goes to the router's shard: one limiter.
    let client = client_with(&daemon, &nosy);
    let denials = 1000;
    let started = Instant::now();
    for _ in 0..denials {
        assert_code(block_on(client.get_topic("secret")), ErrorCode::PermissionDenied, "nosy gets");
    }
    let burst = started.elapsed();
    // A second later, one more: its line reports what the limiter left out.
    std::thread::sleep(Duration::from_millis(1100));
    assert_code(block_on(client.get_topic("secret")), ErrorCode::PermissionDenied, "nosy gets");
    std::thread::sleep(Duration::from_millis(200));
    let log = daemon.log();
    let (lines, left_out) = audit_lines(&log);
    let seconds = (burst + Duration::from_millis(1300)).as_secs() as usize + 1;
    println!("T17: {denials} denials in {burst:?}: {lines} audit lines, {left_out} reported left out");
    assert!(lines >= 2, "{log}");
    assert!(lines <= AUDIT_LINES_PER_SECOND_MAX * (seconds + 1), "{lines} audit lines in {seconds} s");
    assert!(
        left_out + lines as u64 >= denials as u64 + 1 - AUDIT_LINES_PER_SECOND_MAX as u64,
        "{left_out} left out and {lines} lines for {} denials",
        denials + 1
    );
    assert!(left_out + lines as u64 <= denials as u64 + 1, "more reported than refused");
    assert!(!log.contains(&nosy.secret), "the log holds a token");
}
