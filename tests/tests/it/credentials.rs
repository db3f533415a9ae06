//! Credentials and what they may see (T17): a gRPC StreamingPull ends once its token is revoked
//! or expires, as a native connection does; list pages never name what their reader may not
//! list, on either protocol; DetachSubscription says nothing of a subscription its caller may
//! not see; the `authorization` scheme is case-insensitive; a wrong cluster secret is named so.

use crate::connections::{connect, read_frame};
use crate::security::{
    access_text, authenticate_frame, authenticated_stream, client_with, daemon_requiring_auth,
    frames_until_closed, token, token_expiring, AccessFile, Files, RELOAD_WITHIN, REQUEST_TIMEOUT,
};
use ringpost_client::{block_on, Message};
use ringpost_proto::pubsub;
use ringpost_tests::grpc::{subscription_path, topic_path, Grpc};
use ringpost_tests::{create_subscription, Daemon};
use ringpost_wire::frame::{access_body, decode_error, encode_frame};
use ringpost_wire::messages as wire;
use ringpost_wire::{Command, ErrorCode};
use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::Code;

/// `seconds` from now as RFC 3339 in UTC, from coreutils' `date` (the access file's format).
fn rfc3339_in(seconds: u64) -> String {
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + seconds;
    let output = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{at}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("running date");
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// An open gRPC StreamingPull, with its own connection and runtime.
struct Stream {
    grpc: Grpc,
    _requests: tokio::sync::mpsc::Sender<pubsub::StreamingPullRequest>,
    responses: tonic::Streaming<pubsub::StreamingPullResponse>,
    /// The data of every message it delivered.
    delivered: Vec<Vec<u8>>,
    /// How it ended, once it did.
    ended: Option<Result<(), tonic::Status>>,
}

impl Stream {
    fn open(address: &str, token: &str, subscription: &str) -> Stream {
        let grpc = Grpc::connect_with_token(address, Some(token));
        let (requests, outgoing) = tokio::sync::mpsc::channel(4);
        let first = pubsub::StreamingPullRequest {
            subscription: subscription_path(subscription),
            stream_ack_deadline_seconds: 60,
            ..Default::default()
        };
        grpc.block_on(requests.send(first)).unwrap();
        let outgoing = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(outgoing);
        let mut subscriber = grpc.subscriber();
        let responses = grpc
            .block_on(subscriber.streaming_pull(grpc.request(outgoing)))
            .expect("the stream opens")
            .into_inner();
        Stream { grpc, _requests: requests, responses, delivered: Vec::new(), ended: None }
    }

    /// Reads what arrives within `limit` (nothing once it ended); whether it is still open.
    fn read_for(&mut self, limit: Duration) -> bool {
        if self.ended.is_some() {
            return false;
        }
        let until = Instant::now() + limit;
        while Instant::now() < until {
            let next = self.grpc.block_on(async {
                tokio::time::timeout(until - Instant::now(), self.responses.message()).await.ok()
            });
            match next {
                None => break,
                Some(Ok(Some(response))) => self.delivered.extend(
                    response
                        .received_messages
                        .into_iter()
                        .map(|received| received.message.unwrap().data.to_vec()),
                ),
                Some(Ok(None)) => self.ended = Some(Ok(())),
                Some(Err(status)) => self.ended = Some(Err(status)),
            }
            if self.ended.is_some() {
                return false;
            }
        }
        true
    }
}

/// Publishes one message a tick to `topic` until the returned flag is set.
fn publish_every(
    client: ringpost_client::Client,
    topic: &'static str,
    tick: Duration,
) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<()>) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut sequence = 0;
        while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
            block_on(client.publish(topic, vec![Message::new(format!("{topic}-{sequence}"))])).unwrap();
            sequence += 1;
            std::thread::sleep(tick);
        }
    });
    (stop, thread)
}

/// A StreamingPull whose token is revoked ends with UNAUTHENTICATED within the bound a native
/// connection meets, and one whose token expires too, while a publisher keeps its subscription
/// fed and the client never acknowledges (before, such a stream kept delivering until the
/// client acknowledged). The messages it held are delivered again at once, and unary calls
/// with the token are refused.
#[test]
fn grpc_streams_end_when_their_token_is_revoked_or_expires() {
    let files = Files::new("grpc-revoke");
    let root = token("root");
    let revoked = token("revoked");
    let expiring = token_expiring("expiring", Some(&rfc3339_in(6)));
    let grants =
        ["admin * root", "subscriber subscription:r-* revoked", "subscriber subscription:e-* expiring"];
    let access = AccessFile::new(&files, &access_text(&[&root, &revoked, &expiring], &grants));
    let daemon = daemon_requiring_auth("grpc-revoke", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let grpc_address = daemon.grpc_address.clone().unwrap();
    let admin = client_with(&daemon, &root);
    block_on(admin.create_topic("fed")).unwrap();
    create_subscription(&admin, "r-sub", "fed", 60);
    create_subscription(&admin, "e-sub", "fed", 60);
    let (stop, publisher) = publish_every(client_with(&daemon, &root), "fed", Duration::from_millis(100));

    let mut to_revoke = Stream::open(&grpc_address, &revoked.secret, "r-sub");
    let mut to_expire = Stream::open(&grpc_address, &expiring.secret, "e-sub");
    let started = Instant::now();
    while to_revoke.delivered.is_empty() || to_expire.delivered.is_empty() {
        assert!(started.elapsed() < REQUEST_TIMEOUT, "the streams delivered nothing");
        to_revoke.read_for(Duration::from_millis(100));
        to_expire.read_for(Duration::from_millis(100));
    }

    access.replace(&access_text(&[&root, &expiring], &grants));
    let changed = Instant::now();
    while to_revoke.read_for(Duration::from_millis(100)) {
        to_expire.read_for(Duration::from_millis(10));
        assert!(changed.elapsed() < RELOAD_WITHIN, "the revoked token's stream still delivers");
    }
    let ended = to_revoke.ended.clone().unwrap().expect_err("the stream ended with an error");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("revoked"), "{}", ended.message());
    println!("T17: a revoked token's gRPC stream ended {:?} after the file changed", changed.elapsed());
    assert!(to_expire.ended.is_none(), "the other token's stream goes on: {:?}", to_expire.ended);

    // The messages the revoked stream held go to the next consumer at once, not at their
    // deadline (60 s).
    let first = to_revoke.delivered[0].clone();
    let mut again = Stream::open(&grpc_address, &root.secret, "r-sub");
    let redelivered = Instant::now();
    while !again.delivered.contains(&first) {
        assert!(redelivered.elapsed() < REQUEST_TIMEOUT, "the revoked stream's messages were not given back");
        again.read_for(Duration::from_millis(100));
    }

    // A unary call with the revoked token is refused at once.
    let unary = Grpc::connect_with_token(&grpc_address, Some(&revoked.secret));
    let refused = unary
        .pull(pubsub::PullRequest {
            subscription: subscription_path("r-sub"),
            max_messages: 1,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // The expiring token's stream ends once it expires, with no change to the file.
    while to_expire.read_for(Duration::from_millis(100)) {
        assert!(
            changed.elapsed() < Duration::from_secs(6) + RELOAD_WITHIN,
            "the expired token's stream goes on"
        );
    }
    let ended = to_expire.ended.clone().unwrap().expect_err("the stream ended with an error");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("expired"), "{}", ended.message());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.join().unwrap();
}

/// Names of every page of a list, followed with page size 1, and every page token seen.
struct Listed {
    names: BTreeSet<String>,
    tokens: Vec<String>,
}

impl Listed {
    /// Pages through with `page`, which answers (names, next token) for a token.
    fn follow(mut page: impl FnMut(&str) -> (Vec<String>, String)) -> Listed {
        let (mut names, mut tokens, mut token) = (BTreeSet::new(), Vec::new(), String::new());
        for _ in 0..100 {
            let (shown, next) = page(&token);
            names.extend(shown);
            if next.is_empty() {
                return Listed { names, tokens };
            }
            tokens.push(next.clone());
            token = next;
        }
        panic!("a listing of a few names took 100 pages");
    }

    fn assert_shows_only(&self, expected: &[&str], what: &str) {
        let expected: BTreeSet<String> = expected.iter().map(|name| name.to_string()).collect();
        assert_eq!(self.names, expected, "{what}");
        for token in &self.tokens {
            assert!(!token.contains("hidden"), "{what}: a page token names '{token}'");
        }
    }
}

/// A native list request on a raw connection (the client library asks for pages of 1000).
fn native_list(
    stream: &mut TcpStream,
    command: Command,
    topic: &str,
    token: &str,
) -> Result<(Vec<String>, String), ringpost_wire::Status> {
    let request = wire::ListRequest { topic: topic.to_owned(), page_size: 1, page_token: token.to_owned() };
    stream.write_all(&encode_frame(command.code(), 0, 7, &request)).unwrap();
    let (header, body) = read_frame(stream, REQUEST_TIMEOUT).expect("the list is answered");
    if header.is_error() {
        return Err(decode_error(&body));
    }
    Ok(match command {
        Command::ListTopics => {
            let list = access_body::<wire::TopicList>(&body).unwrap();
            (
                list.topics.iter().map(|topic| topic.name.to_string()).collect(),
                list.next_page_token.to_string(),
            )
        }
        Command::ListSubscriptions => {
            let list = access_body::<wire::SubscriptionList>(&body).unwrap();
            (
                list.subscriptions.iter().map(|item| item.name.to_string()).collect(),
                list.next_page_token.to_string(),
            )
        }
        Command::ListSnapshots => {
            let list = access_body::<wire::SnapshotList>(&body).unwrap();
            (
                list.snapshots.iter().map(|item| item.name.to_string()).collect(),
                list.next_page_token.to_string(),
            )
        }
        other => panic!("{other:?} is not a list"),
    })
}

/// The last segment of a Pub/Sub resource name.
fn short(name: &str) -> String {
    name.rsplit('/').next().unwrap().to_owned()
}

/// With page size 1, a reader allowed to list some names pages through exactly those, and no
/// page token names one it may not list; a reader allowed nothing gets one empty page; a
/// request without a credential is UNAUTHENTICATED; on the native protocol and the gRPC API,
/// for topics, subscriptions (all, and a topic's) and snapshots (all, and a topic's). Before,
/// the token was the last name of the unfiltered page, so every hidden name came out in turn.
#[test]
fn list_pages_never_name_what_their_reader_may_not_list() {
    let files = Files::new("list-tokens");
    let (root, lister, nobody) = (token("root"), token("lister"), token("nobody"));
    let grants = [
        "admin * root",
        "viewer topic:*-seen lister",
        "viewer subscription:*-seen lister",
        "viewer snapshot:*-seen lister",
    ];
    let access = AccessFile::new(&files, &access_text(&[&root, &lister, &nobody], &grants));
    let daemon = daemon_requiring_auth("list-tokens", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let admin = client_with(&daemon, &root);
    // Hidden names sort between and after the seen ones.
    let topics = ["a-seen", "b-hidden", "c-seen", "d-hidden"];
    for topic in topics {
        block_on(admin.create_topic(topic)).unwrap();
    }
    let subscriptions = ["a1-seen", "a2-hidden", "a3-seen", "a4-hidden"];
    for subscription in subscriptions {
        create_subscription(&admin, subscription, "a-seen", 10);
    }
    create_subscription(&admin, "b1-seen", "b-hidden", 10);
    for (snapshot, subscription) in [("s1-seen", "a1-seen"), ("s2-hidden", "a1-seen"), ("s3-seen", "b1-seen")]
    {
        block_on(admin.create_snapshot(snapshot, subscription)).unwrap();
    }
    let seen_topics = ["a-seen", "c-seen"];
    let seen_subscriptions = ["a1-seen", "a3-seen", "b1-seen"];

    // The native protocol.
    let mut stream = authenticated_stream(&daemon.address, &lister.secret);
    let mut list = |command, topic: &str| {
        Listed::follow(|token| native_list(&mut stream, command, topic, token).expect("listed"))
    };
    list(Command::ListTopics, "").assert_shows_only(&seen_topics, "native topics");
    list(Command::ListSubscriptions, "").assert_shows_only(&seen_subscriptions, "native subscriptions");
    list(Command::ListSubscriptions, "a-seen").assert_shows_only(&["a1-seen", "a3-seen"], "native a topic's");
    list(Command::ListSnapshots, "").assert_shows_only(&["s1-seen", "s3-seen"], "native snapshots");
    let mut stream = authenticated_stream(&daemon.address, &nobody.secret);
    for command in [Command::ListTopics, Command::ListSubscriptions, Command::ListSnapshots] {
        assert_eq!(
            native_list(&mut stream, command, "", "").unwrap(),
            (Vec::new(), String::new()),
            "{command:?}"
        );
    }
    let mut anonymous = connect(&daemon.address);
    for command in [Command::ListTopics, Command::ListSubscriptions, Command::ListSnapshots] {
        let refused = native_list(&mut anonymous, command, "", "").expect_err("anonymous lists");
        assert_eq!(refused.code, ErrorCode::Unauthenticated, "{command:?}: {refused}");
    }

    // The gRPC API.
    let grpc = Grpc::connect_with_token(daemon.grpc_address.as_ref().unwrap(), Some(&lister.secret));
    let project = "projects/p".to_owned();
    Listed::follow(|token| {
        let request =
            pubsub::ListTopicsRequest { project: project.clone(), page_size: 1, page_token: token.into() };
        let page = grpc.list_topics(request).unwrap();
        (page.topics.iter().map(|topic| short(&topic.name)).collect(), page.next_page_token)
    })
    .assert_shows_only(&seen_topics, "gRPC topics");
    Listed::follow(|token| {
        let request = pubsub::ListSubscriptionsRequest {
            project: project.clone(),
            page_size: 1,
            page_token: token.into(),
        };
        let page = grpc.list_subscriptions(request).unwrap();
        (page.subscriptions.iter().map(|item| short(&item.name)).collect(), page.next_page_token)
    })
    .assert_shows_only(&seen_subscriptions, "gRPC subscriptions");
    Listed::follow(|token| {
        let request =
            pubsub::ListSnapshotsRequest { project: project.clone(), page_size: 1, page_token: token.into() };
        let page = grpc.list_snapshots(request).unwrap();
        (page.snapshots.iter().map(|item| short(&item.name)).collect(), page.next_page_token)
    })
    .assert_shows_only(&["s1-seen", "s3-seen"], "gRPC snapshots");
    Listed::follow(|token| {
        let request = pubsub::ListTopicSubscriptionsRequest {
            topic: topic_path("a-seen"),
            page_size: 1,
            page_token: token.into(),
        };
        let page = grpc.list_topic_subscriptions(request).unwrap();
        (page.subscriptions.iter().map(|name| short(name)).collect(), page.next_page_token)
    })
    .assert_shows_only(&["a1-seen", "a3-seen"], "gRPC a topic's subscriptions");
    Listed::follow(|token| {
        let request = pubsub::ListTopicSnapshotsRequest {
            topic: topic_path("a-seen"),
            page_size: 1,
            page_token: token.into(),
        };
        let page = grpc.list_topic_snapshots(request).unwrap();
        (page.snapshots.iter().map(|name| short(name)).collect(), page.next_page_token)
    })
    .assert_shows_only(&["s1-seen"], "gRPC a topic's snapshots");
    let grpc = grpc.with_token(Some(&nobody.secret));
    let page = grpc
        .list_topics(pubsub::ListTopicsRequest {
            project: project.clone(),
            page_size: 1,
            ..Default::default()
        })
        .unwrap();
    assert!(page.topics.is_empty() && page.next_page_token.is_empty(), "{page:?}");
    let grpc = grpc.with_token(None);
    let refused = grpc
        .list_topics(pubsub::ListTopicsRequest { project, page_size: 1, ..Default::default() })
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
}

/// DetachSubscription by a caller who may not see the subscription is refused alike whether it
/// exists or not, naming neither it nor its topic's name (before, the lookup came first, and
/// the refusal named the topic of one that exists); a caller allowed to update its topic
/// detaches it, as Pub/Sub allows; and `BEARER` in upper case is the bearer scheme.
#[test]
fn detach_subscription_tells_a_stranger_nothing_and_the_bearer_scheme_is_case_insensitive() {
    let files = Files::new("detach-order");
    let (root, stranger, owner) = (token("root"), token("stranger"), token("owner"));
    let grants = ["admin * root", "viewer topic:other stranger", "editor topic:secret-topic owner"];
    let access = AccessFile::new(&files, &access_text(&[&root, &stranger, &owner], &grants));
    let daemon = daemon_requiring_auth("detach-order", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let admin = client_with(&daemon, &root);
    block_on(admin.create_topic("secret-topic")).unwrap();
    create_subscription(&admin, "existing", "secret-topic", 10);
    let address = daemon.grpc_address.clone().unwrap();

    let grpc = Grpc::connect_with_token(&address, Some(&stranger.secret));
    let detach = |name: &str| {
        grpc.detach_subscription(pubsub::DetachSubscriptionRequest { subscription: subscription_path(name) })
    };
    let (existing, missing) = (detach("existing").unwrap_err(), detach("never-made").unwrap_err());
    assert_eq!(existing.code(), Code::PermissionDenied, "{existing:?}");
    assert_eq!(missing.code(), Code::PermissionDenied, "{missing:?}");
    assert_eq!(
        existing.message().replace("existing", "NAME"),
        missing.message().replace("never-made", "NAME"),
        "the refusals differ"
    );
    assert!(!existing.message().contains("secret-topic"), "{}", existing.message());
    assert_eq!(block_on(admin.get_subscription("existing")).unwrap().topic, "secret-topic");

    // The topic's editor may detach it, and presents its token with the scheme in capitals.
    let grpc = Grpc::connect(&address);
    let mut request = tonic::Request::new(pubsub::DetachSubscriptionRequest {
        subscription: subscription_path("existing"),
    });
    request.metadata_mut().insert("authorization", format!("BEARER {}", owner.secret).parse().unwrap());
    grpc.call(grpc.publisher().detach_subscription(request)).expect("the topic's editor detaches");
    assert_eq!(block_on(admin.get_subscription("existing")).unwrap().topic, "_deleted-topic_", "detached");
}

/// A node presenting another cluster's secret on the cluster port is told that it is not the
/// cluster's secret (before: "not in the daemon's access file", a file the port never reads).
#[test]
fn a_wrong_secret_on_the_cluster_port_is_named_as_the_cluster_secret() {
    let files = Files::new("cluster-secret");
    let secret = files.path("secret");
    std::fs::write(&secret, format!("{}\n", crate::security::random_secret())).unwrap();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let cluster = format!("127.0.0.1:{port}");
    let flags = ["--cluster", cluster.as_str(), "--cluster-secret-file", secret.to_str().unwrap()];
    let daemon = Daemon::start_with("cluster-secret", Vec::new(), crate::security::flags(&flags));
    let mut stream = connect(&cluster);
    stream.write_all(&authenticate_frame(&crate::security::random_secret(), 1)).unwrap();
    let frames = frames_until_closed(&mut stream, REQUEST_TIMEOUT);
    let status = frames.iter().find_map(|(_, status)| status.clone()).expect("a refusal");
    assert_eq!(status.code, ErrorCode::Unauthenticated, "{status}");
    assert!(status.message.contains("not the cluster's secret"), "{status}");
    assert!(!status.message.contains("access file"), "{status}");
    drop(daemon);
}
