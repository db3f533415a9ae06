//! TLS on the native protocol (docs/TESTING.md T17), against the real daemon, the client
//! library and the CLI, with a test CA made by rcgen: the CLI over TLS; plaintext to a TLS
//! port and TLS to a plaintext port both fail clearly, and the daemon serves its TLS clients
//! meanwhile; a wrong CA is refused; client certificates are principals with roles, one from
//! another CA is refused, and a required one is required; the server's certificate is
//! replaced without a restart.

use crate::connections::{connect, hello};
use crate::security::*;
use crate::test_ca::{replace_pair, Pair, TestCa};
use ringpost_client::{block_on, Client, Error, ErrorCode, Message, Security};
use ringpost_tests::{failed, succeeded, within, Daemon};
use ringpost_wire::frame::FrameHeader;
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a refused connection may take to fail: long enough for a loaded machine, short
/// enough to tell a clear failure from a hang.
const FAILS_WITHIN: Duration = Duration::from_secs(10);
/// How long a replaced certificate may take to serve new connections (each shard looks at
/// the files each second).
const CERTIFICATE_RELOAD_WITHIN: Duration = Duration::from_secs(5);

fn tls_flags(server: &Pair) -> Vec<String> {
    flags(&["--tls-cert", &text(&server.certificate), "--tls-key", &text(&server.key)])
}

fn trusting(ca: &TestCa) -> Security {
    Security::default().with_ca_file(&ca.file).unwrap()
}

fn presenting(ca: &TestCa, client: &Pair) -> Security {
    trusting(ca).with_client_certificate(&client.certificate, &client.key).unwrap()
}

/// Connecting with `security` fails, within `FAILS_WITHIN` (at the connection or its first
/// request); the error.
fn fails_clearly(address: &str, security: Security, what: &str) -> Error {
    let started = Instant::now();
    let outcome = within(FAILS_WITHIN, async {
        let client = ringpost_client::Client::connect_with_security(
            address,
            ringpost_client::PoolSettings::default(),
            FAILS_WITHIN,
            security,
        )
        .await?;
        client.list_topics().await
    })
    .unwrap_or_else(|| panic!("{what}: no answer within {FAILS_WITHIN:?}"));
    let error = refused(outcome);
    println!("T17: {what}: failed in {:?}: {error}", started.elapsed());
    error
}

fn mentions_tls(error: &Error) -> bool {
    let said = error.to_string().to_lowercase();
    ["certificate", "tls", "handshake", "issuer"].iter().any(|word| said.contains(word))
}

/// A publisher over `client` until stopped: how many publishes, and the first failure.
struct Steady {
    running: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<usize, Error>>,
}

impl Steady {
    fn start(client: Client, topic: &'static str) -> Steady {
        let running = Arc::new(AtomicBool::new(true));
        let keep = running.clone();
        let thread = std::thread::spawn(move || {
            let mut published = 0;
            while keep.load(Ordering::Relaxed) {
                block_on(client.publish(topic, vec![Message::new("steady")]))?;
                published += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(published)
        });
        Steady { running, thread }
    }

    fn stop(self) -> usize {
        self.running.store(false, Ordering::Relaxed);
        self.thread.join().unwrap().expect("the TLS publisher failed")
    }
}

#[test]
fn tls_serves_the_cli_and_refuses_plaintext_clearly_while_serving() {
    let files = Files::new("tls-basic");
    let ca = TestCa::new(&files.directory, "ca");
    let wrong = TestCa::new(&files.directory, "wrong");
    let daemon = Daemon::start_with("tls-basic", Vec::new(), tls_flags(&ca.server()));
    let ca_file = text(&ca.file);
    let cli = |words: &[&str]| {
        let mut all = vec!["--ca", ca_file.as_str()];
        all.extend_from_slice(words);
        daemon.cli(&all)
    };
    succeeded(&cli(&["topic", "create", "secured"]));
    succeeded(&cli(&["sub", "create", "secured-sub", "--topic", "secured"]));
    succeeded(&cli(&["publish", "secured", "over TLS"]));
    let pulled = succeeded(&cli(&["pull", "secured-sub", "--max", "10", "--ack"]));
    assert!(pulled.contains("over TLS"), "{pulled}");
    // Checked by name instead of address: the certificate names localhost too.
    let client = connect_with(&daemon.address, trusting(&ca).with_server_name("localhost".into()));
    block_on(client.publish("secured", vec![Message::new("by name")])).unwrap();

    // A TLS client publishes throughout what follows.
    let steady = Steady::start(connect_with(&daemon.address, trusting(&ca)), "secured");

    // Plaintext to the TLS port: the client library and the CLI fail, not hang; a raw Hello
    // gets no answer it could read as one, and its connection is closed.
    fails_clearly(&daemon.address, Security::default(), "plaintext client to a TLS port");
    let said = failed(&daemon.cli(&["topic", "list"]));
    assert!(!said.is_empty());
    for address in std::iter::once(daemon.address.clone()).chain(crate::connections::forwarders(&daemon)) {
        let mut stream = connect(&address);
        stream.write_all(&hello(1)).unwrap();
        let received = bytes_until_closed(&mut stream, FAILS_WITHIN);
        let answered = received.len() >= FRAME_HEADER_BYTES
            && FrameHeader::decode(&received[..FRAME_HEADER_BYTES])
                .is_ok_and(|header| header.request_id == 1);
        assert!(!answered, "a plaintext Hello to {address} was answered");
    }
    // A CA that did not sign the server's certificate.
    let error = fails_clearly(&daemon.address, trusting(&wrong), "a client trusting another CA");
    assert!(mentions_tls(&error), "{error}");
    let said = failed(&daemon.cli(&["--ca", &text(&wrong.file), "topic", "list"]));
    assert!(!said.is_empty());
    // A name the certificate does not hold.
    let error = fails_clearly(
        &daemon.address,
        trusting(&ca).with_server_name("elsewhere.example".into()),
        "a server name not in the certificate",
    );
    assert!(mentions_tls(&error), "{error}");

    let published = steady.stop();
    assert!(published > 0);
    println!("T17: {published} TLS publishes beside the refused clients");

    // TLS to a plaintext port fails clearly too.
    let plain = Daemon::start("tls-to-plaintext");
    let error = fails_clearly(&plain.address, trusting(&ca), "a TLS client to a plaintext port");
    assert!(!matches!(error.code(), ErrorCode::Unauthenticated | ErrorCode::PermissionDenied), "{error}");
    let said = failed(&plain.cli(&["--ca", &ca_file, "topic", "list"]));
    assert!(!said.is_empty());
    block_on(plain.client().list_topics()).unwrap();
}

#[test]
fn client_certificates_are_principals_with_roles() {
    let files = Files::new("tls-mtls");
    let server_ca = TestCa::new(&files.directory, "server-ca");
    let client_ca = TestCa::new(&files.directory, "client-ca");
    let other_ca = TestCa::new(&files.directory, "other-ca");
    let root = token("root");
    let access = AccessFile::new(
        &files,
        &access_text(
            &[&root],
            &[
                "admin * root",
                "publisher topic:topic-m billing",
                "publisher topic:topic-n orders.svc",
                "viewer topic:topic-m orders.svc",
                "publisher topic:topic-m ignored-name",
            ],
        ),
    );
    let mut words = tls_flags(&server_ca.server());
    words.extend(flags(&["--tls-client-ca", &text(&client_ca.file)]));
    let daemon =
        daemon_requiring_auth("tls-mtls", &access, &words.iter().map(String::as_str).collect::<Vec<_>>());
    let admin = connect_with(&daemon.address, trusting(&server_ca).with_token(root.secret.clone()));
    block_on(admin.create_topic("topic-m")).unwrap();
    block_on(admin.create_topic("topic-n")).unwrap();

    // The common name is the identity of a certificate without subject alternative names.
    let billing = connect_with(&daemon.address, presenting(&server_ca, &client_ca.client("billing", None)));
    block_on(billing.publish("topic-m", vec![Message::new("by certificate")])).unwrap();
    let said = assert_code(
        block_on(billing.publish("topic-n", vec![Message::new("x")])),
        ErrorCode::PermissionDenied,
        "billing",
    );
    assert!(said.contains("billing"), "{said}");

    // The first DNS name wins over the common name.
    let orders = client_ca.client("ignored-name", Some("orders.svc"));
    let client = connect_with(&daemon.address, presenting(&server_ca, &orders));
    block_on(client.publish("topic-n", vec![Message::new("x")])).unwrap();
    block_on(client.get_topic("topic-m")).unwrap();
    assert_code(
        block_on(client.publish("topic-m", vec![Message::new("x")])),
        ErrorCode::PermissionDenied,
        "orders.svc",
    );

    // The CLI presents one too.
    let orders_cli = daemon.cli(&[
        "--ca",
        &text(&server_ca.file),
        "--cert",
        &text(&orders.certificate),
        "--key",
        &text(&orders.key),
        "publish",
        "topic-n",
        "from the CLI",
    ]);
    succeeded(&orders_cli);

    // A certificate from another CA is refused; without one (optional), a client is anonymous.
    let stranger = other_ca.client("billing", None);
    fails_clearly(&daemon.address, presenting(&server_ca, &stranger), "a certificate from another CA");
    let nobody = connect_with(&daemon.address, trusting(&server_ca));
    assert_code(
        block_on(nobody.publish("topic-m", vec![Message::new("x")])),
        ErrorCode::Unauthenticated,
        "no certificate",
    );
    // And served all along.
    block_on(billing.publish("topic-m", vec![Message::new("still")])).unwrap();
}

#[test]
fn a_required_client_certificate_refuses_clients_without_one() {
    let files = Files::new("tls-mtls-required");
    let server_ca = TestCa::new(&files.directory, "server-ca");
    let client_ca = TestCa::new(&files.directory, "client-ca");
    let root = token("root");
    let access = AccessFile::new(&files, &access_text(&[&root], &["admin * root", "editor * worker"]));
    let mut words = tls_flags(&server_ca.server());
    words.extend(flags(&["--tls-client-ca", &text(&client_ca.file), "--tls-client-cert", "required"]));
    let daemon = daemon_requiring_auth(
        "tls-mtls-required",
        &access,
        &words.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // Not even a valid token gets in without a certificate.
    fails_clearly(
        &daemon.address,
        trusting(&server_ca).with_token(root.secret.clone()),
        "a token without a certificate",
    );
    fails_clearly(&daemon.address, trusting(&server_ca), "no certificate at all");
    let worker = connect_with(&daemon.address, presenting(&server_ca, &client_ca.client("worker", None)));
    block_on(worker.create_topic("made-by-worker")).unwrap();
    block_on(worker.publish("made-by-worker", vec![Message::new("x")])).unwrap();
}

#[test]
fn a_replaced_server_certificate_serves_new_connections_without_a_restart() {
    let files = Files::new("tls-reload");
    let first = TestCa::new(&files.directory, "first");
    let second = TestCa::new(&files.directory, "second");
    let live = Pair { certificate: files.path("live.crt"), key: files.path("live.key") };
    replace_pair(&first.server(), &live);
    let daemon = Daemon::start_with("tls-reload", Vec::new(), tls_flags(&live));
    let held = connect_with(&daemon.address, trusting(&first));
    block_on(held.create_topic("renewed")).unwrap();
    fails_clearly(&daemon.address, trusting(&second), "the second CA before the renewal");

    replace_pair(&second.server(), &live);
    let (client, took) =
        eventually(CERTIFICATE_RELOAD_WITHIN, || try_connect(&daemon.address, trusting(&second)))
            .expect("the renewed certificate is served");
    println!("T17: the renewed certificate served a new connection {took:?} after the files changed");
    block_on(client.publish("renewed", vec![Message::new("after the renewal")])).unwrap();
    // New connections see only the new certificate; the one opened before is still served.
    fails_clearly(&daemon.address, trusting(&first), "the first CA after the renewal");
    block_on(held.get_topic("renewed")).unwrap();
    assert_eq!(daemon.starts(), 1);

    // A broken set (a key that does not match) is refused and the working one kept.
    let broken_key = first.server().key;
    crate::test_ca::write_replacing(&live.key, &std::fs::read(broken_key).unwrap());
    std::thread::sleep(Duration::from_millis(2500));
    let client = connect_with(&daemon.address, trusting(&second));
    block_on(client.get_topic("renewed")).unwrap();
}

/// A connection refused for a connection limit on a TLS port is told why over TLS, so the
/// client library and the CLI show `ResourceExhausted` naming the limit, as in plaintext,
/// instead of a failed handshake.
#[test]
fn a_limit_refusal_on_a_tls_port_is_read_by_name() {
    let files = Files::new("tls-refusal");
    let ca = TestCa::new(&files.directory, "ca");
    let mut more = tls_flags(&ca.server());
    more.extend(flags(&["--connections-per-peer-max", "1"]));
    let daemon = Daemon::start_with("tls-refusal", Vec::new(), more);
    // The one connection this peer may hold to the router's shard.
    let held = connect_with(&daemon.address, trusting(&ca));
    block_on(held.list_topics()).unwrap();
    let error =
        fails_clearly(&daemon.address, trusting(&ca), "a second TLS connection past the per-peer limit");
    assert_eq!(error.code(), ErrorCode::ResourceExhausted, "{error}");
    assert!(error.to_string().contains("connections_per_peer_max"), "{error}");
    let said = failed(&daemon.cli(&["--ca", &text(&ca.file), "topic", "list"]));
    assert!(said.contains("ResourceExhausted") && said.contains("connections_per_peer_max"), "{said}");
    drop(held);
}

/// With TLS on every port, three nodes given the CA of their certificates (`--cluster-ca`)
/// replicate a topic to each other over TLS: a publish is acknowledged by a quorum, the
/// followers hold it, and when the leader's node is SIGKILLed another replica serves it all.
#[test]
fn forwarders_replicate_over_tls_with_the_clusters_ca() {
    let directory = ringpost_tests::temporary_directory("tls-cluster");
    let ca = TestCa::new(&directory, "cluster");
    let mut args = tls_flags(&ca.server());
    args.extend(flags(&["--cluster-ca", &text(&ca.file)]));
    let mut cluster = ringpost_tests::cluster::Cluster::start("tls-replication", 3, args);
    let connect = |address: &str| {
        block_on(Client::connect_with_security(
            address,
            ringpost_client::PoolSettings::default(),
            Duration::from_secs(30),
            trusting(&ca),
        ))
        .expect("connecting over TLS")
    };
    // The nodes formed their catalog over TLS: a cluster port answers no frame in plaintext
    // (a plaintext port answers this Hello, with a response or a refusal).
    for address in &cluster.cluster_addresses {
        let mut stream = crate::connections::connect(address);
        stream.write_all(hello(1).as_ref()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut answer = [0u8; 64];
        let read = std::io::Read::read(&mut stream, &mut answer).unwrap_or(0);
        let framed = read >= FRAME_HEADER_BYTES && FrameHeader::decode(&answer[..FRAME_HEADER_BYTES]).is_ok();
        assert!(!framed, "the cluster port {address} answered a frame in plaintext");
    }
    let client = connect(&cluster.node(1).address);
    let topic = ringpost_client::Topic { name: "over-tls".into(), ..Default::default() };
    let created =
        block_on(client.create_topic_replicated(topic, 3)).expect("a topic of three replicas over TLS");
    assert_eq!(created.name, "over-tls");
    ringpost_tests::create_subscription(&client, "over-tls-sub", "over-tls", 10);
    let first: Vec<Message> = (0..100).map(|i| Message::new(format!("before-{i}"))).collect();
    block_on(client.publish("over-tls", first)).expect("publishing to a topic replicated over TLS");

    // The leader's stats show its followers (those running) holding everything.
    let leader_of = |cluster: &ringpost_tests::cluster::Cluster| -> (u64, ringpost_client::ReplicaStats) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for id in cluster.ids().filter(|id| cluster.is_running(*id)) {
                let Ok(stats) = block_on(connect(&cluster.node(id).address).stats()) else { continue };
                let leading = stats
                    .topics
                    .into_iter()
                    .filter(|topic| topic.name.ends_with("over-tls"))
                    .find_map(|topic| topic.replication.filter(|replica| replica.leader));
                if let Some(replica) = leading {
                    let caught_up =
                        replica.followers.iter().filter(|follower| follower.lag_messages == 0).count();
                    if caught_up + 1 == cluster.ids().filter(|id| cluster.is_running(*id)).count() {
                        return (id, replica);
                    }
                }
            }
            assert!(Instant::now() < deadline, "no leader with its followers caught up:\n{}", cluster.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (leader, replica) = leader_of(&cluster);
    assert_eq!(replica.followers.len(), 2, "{replica:?}");
    assert!(replica.committed_end >= 100, "{replica:?}");

    cluster.node_mut(leader).kill();
    let survivor = cluster.ids().find(|id| *id != leader).unwrap();
    let client = connect(&cluster.node(survivor).address);
    let second: Vec<Message> = (0..100).map(|i| Message::new(format!("after-{i}"))).collect();
    block_on(client.publish("over-tls", second)).expect("publishing after the leader's node died");
    let (new_leader, _) = leader_of(&cluster);
    assert_ne!(new_leader, leader);
    let mut delivered = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered.len() < 200 {
        assert!(Instant::now() < deadline, "{} of 200 delivered:\n{}", delivered.len(), cluster.logs());
        let messages = block_on(client.pull("over-tls-sub", 100, 1000)).unwrap_or_default();
        let ack_ids: Vec<String> = messages.iter().map(|message| message.ack_id.clone()).collect();
        delivered.extend(messages.into_iter().map(|message| String::from_utf8(message.data).unwrap()));
        if !ack_ids.is_empty() {
            let _ = block_on(client.acknowledge("over-tls-sub", ack_ids));
        }
    }
    assert!(delivered.iter().all(|data| data.starts_with("before-") || data.starts_with("after-")));
    let _ = std::fs::remove_dir_all(&directory);
}
