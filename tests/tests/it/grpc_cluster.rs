//! Google's gRPC API on a cluster of three nodes: catalog changes sent to a node that does not
//! lead the catalog are carried to the leader, and publishes and deliveries for a topic another
//! node serves to that node, with the caller's principal, so that code written for Pub/Sub
//! (which cannot follow a redirect) works against any node, over TLS too.
//!
//! The nodes are started here, not with the harness's `Daemon`: a clustered node is ready only
//! once the catalog has a leader, so all three are spawned before any is waited on.

use crate::grpc_security::over_tls;
use crate::security::{access_text, flags, text, token, AccessFile, Files, Token};
use crate::test_ca::TestCa;
use ringpost_client::{block_on, Client, ErrorCode, Message, PoolSettings, Security};
use ringpost_tests::grpc::{
    project_path, pubsub, schema_path, snapshot_path, subscription_path, topic_path, Grpc,
};
use ringpost_tests::json_field as field;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::Code;

/// How long three nodes may take to elect a leader and start serving.
const CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a call answered `UNAVAILABLE` is retried, as the client libraries retry it (a
/// node may not know the catalog's leader yet, or a topic's node's gRPC address).
const UNAVAILABLE_RETRY_FOR: Duration = Duration::from_secs(10);

/// One `ringpostd` of the cluster.
struct Node {
    id: u64,
    directory: PathBuf,
    child: Option<Child>,
    /// Its router's address, from its ready file.
    address: String,
    /// Its gRPC API's address.
    grpc: String,
}

impl Node {
    fn log(&self) -> String {
        std::fs::read_to_string(self.directory.join("ringpostd.log")).unwrap_or_default()
    }

    /// The `ringpost` CLI against this node, presenting `token`.
    fn cli(&self, token: &Token, args: &[&str]) -> String {
        let output = Command::new(ringpost_tests::binary("ringpost"))
            .args(["--server", &self.address, "--token", &token.secret])
            .args(args)
            .output()
            .expect("running ringpost");
        ringpost_tests::succeeded(&output)
    }

    /// A native client of this node presenting `token`.
    fn client(&self, token: &Token) -> Client {
        let security = Security::default().with_token(token.secret.clone());
        block_on(Client::connect_with_security(
            &self.address,
            PoolSettings::default(),
            Duration::from_secs(10),
            security,
        ))
        .unwrap_or_else(|error| panic!("connecting to node {} at {}: {error}", self.id, self.address))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "kept {} for inspection; node {}'s log:\n{}",
                self.directory.display(),
                self.id,
                self.log()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
    }
}

/// Ports free now (held together while chosen, so none is chosen twice).
fn free_ports(count: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> =
        (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
    held.iter().map(|listener| listener.local_addr().unwrap().port()).collect()
}

/// Attempts at starting the cluster: its ports are chosen free and then bound by the nodes, and
/// a test running beside it may take one in between (a node then exits, saying so).
const CLUSTER_START_ATTEMPTS: u32 = 3;

/// Three nodes on loopback, each with its gRPC API, requiring the tokens of `access`; returns
/// once every one is serving.
fn start_cluster(label: &str, access: &AccessFile) -> Vec<Node> {
    let mut attempt = 1;
    loop {
        match start_cluster_once(label, access) {
            Ok(nodes) => return nodes,
            Err(log) if attempt < CLUSTER_START_ATTEMPTS => {
                eprintln!("a port of the cluster was taken before its node bound it; starting again:\n{log}");
                attempt += 1;
            }
            Err(log) => panic!("{CLUSTER_START_ATTEMPTS} starts found a port taken; the last:\n{log}"),
        }
    }
}

/// `start_cluster`'s one attempt: `Err` with the node's log if a node found a port taken.
fn start_cluster_once(label: &str, access: &AccessFile) -> Result<Vec<Node>, String> {
    let ports = free_ports(6);
    let cluster = ports[..3].iter().map(|port| format!("127.0.0.1:{port}")).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Node> = (1..=3u64)
        .map(|id| {
            let directory = ringpost_tests::temporary_directory(&format!("{label}-{id}"));
            let log = std::fs::File::create(directory.join("ringpostd.log")).unwrap();
            // With auth on, the nodes must share a secret for their cluster ports.
            let secret = directory.join("cluster-secret");
            std::fs::write(&secret, "rpt_the-grpc-cluster-tests-shared-secret-0123456789\n").unwrap();
            let child = Command::new(ringpost_tests::binary("ringpostd"))
                .arg("--cluster-secret-file")
                .arg(&secret)
                .arg("--data-dir")
                .arg(directory.join("data"))
                .args(["--shards", "2", "--listen", "127.0.0.1:0"])
                .args(["--node-id", &id.to_string(), "--cluster", &cluster])
                .args(["--grpc-listen", &format!("127.0.0.1:{}", ports[2 + id as usize])])
                .args(["--http-listen", "off"])
                .args(["--auth", "required", "--access-file"])
                .arg(&access.path)
                .arg("--ready-file")
                .arg(directory.join("ready"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("starting ringpostd");
            Node { id, directory, child: Some(child), address: String::new(), grpc: String::new() }
        })
        .collect();
    let deadline = Instant::now() + CLUSTER_START_TIMEOUT;
    for node in &mut nodes {
        loop {
            if let Ok(contents) = std::fs::read_to_string(node.directory.join("ready")) {
                let mut lines = contents.lines();
                node.address = lines.next().unwrap_or_default().trim().to_owned();
                node.grpc =
                    lines.find_map(|line| line.strip_prefix("grpc ")).expect(&contents).trim().to_owned();
                break;
            }
            if let Some(status) = node.child.as_mut().unwrap().try_wait().unwrap() {
                let log = node.log();
                if log.contains("Address already in use") {
                    return Err(log);
                }
                panic!("node {} exited with {status} while starting; log:\n{log}", node.id);
            }
            assert!(Instant::now() < deadline, "node {} did not start; log:\n{}", node.id, node.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(nodes)
}

fn mask(paths: &[&str]) -> Option<prost_types::FieldMask> {
    Some(prost_types::FieldMask { paths: paths.iter().map(|path| (*path).to_owned()).collect() })
}

/// The node leading the catalog, as `ringpost cluster status` on `node` says.
fn leader(node: &Node, token: &Token) -> u64 {
    let deadline = Instant::now() + CLUSTER_START_TIMEOUT;
    loop {
        let status = node.cli(token, &["cluster", "status"]);
        if let Ok(leader) = field(status.lines().next().expect(&status), "catalog_leader").parse() {
            return leader;
        }
        assert!(Instant::now() < deadline, "no leader: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `call`'s answer, retried while it is `UNAVAILABLE` as the client libraries retry it.
fn retrying<T>(what: &str, call: impl Fn() -> Result<T, tonic::Status>) -> Result<T, tonic::Status> {
    let deadline = Instant::now() + UNAVAILABLE_RETRY_FOR;
    loop {
        match call() {
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                eprintln!("{what}: UNAVAILABLE, retried: {}", status.message());
                std::thread::sleep(Duration::from_millis(200));
            }
            answer => return answer,
        }
    }
}

fn succeeds<T>(what: &str, call: impl Fn() -> Result<T, tonic::Status>) -> T {
    retrying(what, call).unwrap_or_else(|status| panic!("{what}: {status:?}"))
}

/// The node whose forwarders serve `topic`, from each node's stats (a node's lists only the
/// topics on its own forwarders; a replica that follows another serves no client).
fn node_serving(nodes: &[Node], token: &Token, topic: &str) -> u64 {
    let serving: Vec<u64> = nodes
        .iter()
        .filter(|node| {
            let stats = block_on(node.client(token).stats()).expect("stats");
            stats.topics.iter().any(|served| {
                served.name == topic && served.replication.as_ref().is_none_or(|replica| replica.leader)
            })
        })
        .map(|node| node.id)
        .collect();
    assert_eq!(serving.len(), 1, "topic '{topic}' is served by nodes {serving:?}");
    serving[0]
}

#[test]
fn a_follower_carries_catalog_changes_to_the_leader_and_serves_the_rest() {
    let files = Files::new("grpc-cluster");
    let (root, reader) = (token("root"), token("reader"));
    let access =
        AccessFile::new(&files, &access_text(&[&root, &reader], &["admin * root", "viewer * reader"]));
    let nodes = start_cluster("grpc-cluster", &access);
    let leader_id = leader(&nodes[0], &root);
    let followers: Vec<&Node> = nodes.iter().filter(|node| node.id != leader_id).collect();
    let leader = nodes.iter().find(|node| node.id == leader_id).expect("the leader");
    let at_followers: Vec<Grpc> =
        followers.iter().map(|node| Grpc::connect_with_token(&node.grpc, Some(&root.secret))).collect();
    let at_leader = Grpc::connect_with_token(&leader.grpc, Some(&root.secret));
    // Most calls go to the follower of the higher id, which is never node 1 (whose shards'
    // cluster numbers equal their local numbers, which would hide a mix-up of the two); the
    // creates go to both in turn.
    let (follower, grpc) = (followers[1], &at_followers[1]);
    eprintln!("node {leader_id} leads; the gRPC calls go to nodes {} and {}", followers[0].id, follower.id);

    // Topics enough that placement (over the six forwarders of three nodes) puts some on the
    // followers and some elsewhere; each with a subscription.
    let topics: Vec<String> = (0..6).map(|index| format!("orders-{index}")).collect();
    for (index, topic) in topics.iter().enumerate() {
        let grpc = &at_followers[index % 2];
        let created = succeeds("CreateTopic at a follower", || grpc.create_plain_topic(topic));
        assert_eq!(created.name, topic_path(topic));
        let reader_name = format!("{topic}-reader");
        let subscription = succeeds("CreateSubscription at a follower", || {
            grpc.create_plain_subscription(&reader_name, topic)
        });
        assert_eq!(subscription.topic, topic_path(topic));
        // The leader decided it, and the follower applied it before it answered: both see it.
        for (who, at) in [("the leader", &at_leader), ("the follower", grpc)] {
            at.get_topic(pubsub::GetTopicRequest { topic: topic_path(topic) })
                .unwrap_or_else(|status| panic!("topic '{topic}' at {who}: {status:?}"));
            at.get_subscription(pubsub::GetSubscriptionRequest {
                subscription: subscription_path(&reader_name),
            })
            .unwrap_or_else(|status| panic!("subscription '{reader_name}' at {who}: {status:?}"));
        }
    }

    // Every other kind of change, through the follower too, seen at the leader.
    let (first, first_reader) = (&topics[0], format!("{}-reader", topics[0]));
    let labels: std::collections::HashMap<String, String> = [("team".to_owned(), "orders".to_owned())].into();
    succeeds("UpdateTopic at a follower", || {
        grpc.update_topic(pubsub::UpdateTopicRequest {
            topic: Some(pubsub::Topic {
                name: topic_path(first),
                labels: labels.clone(),
                ..Default::default()
            }),
            update_mask: mask(&["labels"]),
        })
    });
    let shown = at_leader.get_topic(pubsub::GetTopicRequest { topic: topic_path(first) }).unwrap();
    assert_eq!(shown.labels, labels);
    succeeds("UpdateSubscription at a follower", || {
        grpc.update_subscription(pubsub::UpdateSubscriptionRequest {
            subscription: Some(pubsub::Subscription {
                name: subscription_path(&first_reader),
                ack_deadline_seconds: 30,
                ..Default::default()
            }),
            update_mask: mask(&["ack_deadline_seconds"]),
        })
    });
    let shown = at_leader
        .get_subscription(pubsub::GetSubscriptionRequest { subscription: subscription_path(&first_reader) })
        .unwrap();
    assert_eq!(shown.ack_deadline_seconds, 30);
    // ModifyPushConfig is a change like the others; back to pull at once, since this
    // subscription is pulled from below.
    let push =
        pubsub::PushConfig { push_endpoint: "https://receiver.example/push".into(), ..Default::default() };
    for (push, endpoint) in [(Some(push), "https://receiver.example/push"), (None, "")] {
        succeeds("ModifyPushConfig at a follower", || {
            grpc.modify_push_config(pubsub::ModifyPushConfigRequest {
                subscription: subscription_path(&first_reader),
                push_config: push.clone(),
            })
        });
        let shown = at_leader
            .get_subscription(pubsub::GetSubscriptionRequest {
                subscription: subscription_path(&first_reader),
            })
            .unwrap();
        assert_eq!(shown.push_config.unwrap_or_default().push_endpoint, endpoint);
    }
    succeeds("CreateSnapshot at a follower", || {
        grpc.create_snapshot(pubsub::CreateSnapshotRequest {
            name: snapshot_path("mark"),
            subscription: subscription_path(&first_reader),
            ..Default::default()
        })
    });
    succeeds("UpdateSnapshot at a follower", || {
        grpc.update_snapshot(pubsub::UpdateSnapshotRequest {
            snapshot: Some(pubsub::Snapshot {
                name: snapshot_path("mark"),
                labels: labels.clone(),
                ..Default::default()
            }),
            update_mask: mask(&["labels"]),
        })
    });
    let shown =
        at_leader.get_snapshot(pubsub::GetSnapshotRequest { snapshot: snapshot_path("mark") }).unwrap();
    assert_eq!((shown.topic, shown.labels), (topic_path(first), labels.clone()));
    succeeds("DeleteSnapshot at a follower", || {
        grpc.delete_snapshot(pubsub::DeleteSnapshotRequest { snapshot: snapshot_path("mark") })
    });
    let status =
        at_leader.get_snapshot(pubsub::GetSnapshotRequest { snapshot: snapshot_path("mark") }).unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    succeeds("CreateSubscription at a follower", || grpc.create_plain_subscription("pager", first));
    succeeds("DetachSubscription at a follower", || {
        grpc.detach_subscription(pubsub::DetachSubscriptionRequest {
            subscription: subscription_path("pager"),
        })
    });
    let shown = at_leader
        .get_subscription(pubsub::GetSubscriptionRequest { subscription: subscription_path("pager") })
        .unwrap();
    assert!(shown.detached, "{shown:?}");
    succeeds("DeleteSubscription at a follower", || {
        grpc.delete_subscription(pubsub::DeleteSubscriptionRequest {
            subscription: subscription_path("pager"),
        })
    });

    // The token crossed with the change: the leader decided who may make it.
    let anonymous = Grpc::connect(&follower.grpc);
    let status = anonymous.create_plain_topic("nobody-may").unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let viewer = Grpc::connect_with_token(&follower.grpc, Some(&reader.secret));
    let status =
        retrying("CreateTopic as a viewer", || viewer.create_plain_topic("viewers-may-not")).unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let status =
        at_leader.get_topic(pubsub::GetTopicRequest { topic: topic_path("viewers-may-not") }).unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let refusal = "denied pubsub.topics.create on topic:viewers-may-not to reader";
    assert!(leader.log().contains(refusal), "the leader refused it:\n{}", leader.log());
    assert!(!follower.log().contains(refusal), "not the follower:\n{}", follower.log());

    // Publish, pull and acknowledge through each follower, whichever node serves the topic: a
    // call for another node's topic is carried to that node over the cluster's connections.
    let placed: Vec<(&String, u64)> =
        topics.iter().map(|topic| (topic, node_serving(&nodes, &root, topic))).collect();
    eprintln!("placement: {placed:?}");
    let (mut served_here, mut served_elsewhere) = (0, 0);
    for node in nodes.iter().filter(|node| node.id != leader_id) {
        let here = Grpc::connect_with_token(&node.grpc, Some(&root.secret));
        for (topic, serving) in &placed {
            if *serving == node.id {
                served_here += 1;
            } else {
                served_elsewhere += 1;
            }
            let data = format!("to {topic} through node {}", node.id);
            let ids = here.publish_data(topic, &[data.as_bytes()]).unwrap_or_else(|status| {
                panic!("publish to '{topic}' (node {serving}) through node {}: {status:?}", node.id)
            });
            assert_eq!(ids.len(), 1);
            let pulled = here
                .pull(pubsub::PullRequest {
                    subscription: subscription_path(&format!("{topic}-reader")),
                    max_messages: 10,
                    ..Default::default()
                })
                .unwrap_or_else(|status| {
                    panic!("pull of '{topic}' (node {serving}) through node {}: {status:?}", node.id)
                });
            let received: Vec<&[u8]> = pulled
                .received_messages
                .iter()
                .map(|message| &message.message.as_ref().unwrap().data[..])
                .collect();
            assert_eq!(received, [data.as_bytes()], "'{topic}' on node {serving} through node {}", node.id);
            let ack_ids = pulled.received_messages.iter().map(|message| message.ack_id.clone()).collect();
            here.acknowledge(pubsub::AcknowledgeRequest {
                subscription: subscription_path(&format!("{topic}-reader")),
                ack_ids,
            })
            .unwrap();
        }
    }
    assert!(served_here > 0 && served_elsewhere > 0, "placement did not spread: {placed:?}");

    // A StreamingPull through a follower for a topic another node serves: carried whole, it
    // delivers, and what it acknowledges is not delivered again.
    let follower_node = nodes.iter().find(|node| node.id != leader_id).unwrap();
    let (topic, serving) = *placed.iter().find(|(_, serving)| *serving != follower_node.id).unwrap();
    let here = Grpc::connect_with_token(&follower_node.grpc, Some(&root.secret));
    here.publish_data(topic, &[b"streamed"]).unwrap();
    let (requests, outgoing) = tokio::sync::mpsc::channel(16);
    requests
        .try_send(pubsub::StreamingPullRequest {
            subscription: subscription_path(&format!("{topic}-reader")),
            stream_ack_deadline_seconds: 60,
            ..Default::default()
        })
        .unwrap();
    let outgoing = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(outgoing);
    let mut subscriber = here.subscriber();
    let mut responses = here
        .block_on(subscriber.streaming_pull(here.request(outgoing)))
        .unwrap_or_else(|status| {
            panic!("a stream of '{topic}' (node {serving}) through node {}: {status:?}", follower_node.id)
        })
        .into_inner();
    let response = here
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), responses.message()).await })
        .expect("a streamed delivery within 20 s")
        .expect("the stream stays open")
        .expect("a response");
    let streamed: Vec<&[u8]> = response
        .received_messages
        .iter()
        .map(|message| &message.message.as_ref().unwrap().data[..])
        .collect();
    assert_eq!(streamed, [&b"streamed"[..]]);
    let ack_ids = response.received_messages.iter().map(|message| message.ack_id.clone()).collect();
    here.block_on(requests.send(pubsub::StreamingPullRequest { ack_ids, ..Default::default() })).unwrap();
    // Half-closed, the stream ends once what was sent on it is done (the ack included).
    drop(requests);
    let ended = here.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(Some(_)) = responses.message().await {}
        })
        .await
    });
    assert!(ended.is_ok(), "the carried stream did not end after its requests did");
    let again =
        retrying("a pull after the streamed ack", || here.pull_now(&format!("{topic}-reader"), 10)).unwrap();
    assert!(again.is_empty(), "an acknowledged streamed message came back: {again:?}");

    schemas_through_a_follower(grpc, &at_leader, &follower.client(&root));

    // Deleted through the follower, gone everywhere.
    for topic in &topics {
        let reader_name = format!("{topic}-reader");
        succeeds("DeleteSubscription at a follower", || {
            grpc.delete_subscription(pubsub::DeleteSubscriptionRequest {
                subscription: subscription_path(&reader_name),
            })
        });
        succeeds("DeleteTopic at a follower", || {
            grpc.delete_topic(pubsub::DeleteTopicRequest { topic: topic_path(topic) })
        });
        for (who, at) in [("the leader", &at_leader), ("the follower", grpc)] {
            let status = at.get_topic(pubsub::GetTopicRequest { topic: topic_path(topic) }).unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "topic '{topic}' at {who}: {status:?}");
        }
    }
    assert!(at_leader.topic_names().unwrap().is_empty());
}

/// A schema created, revised and deleted through a follower (`grpc`), a topic typed by it
/// created there: the leader decided each change, and the follower checks publishes against
/// what it applied; a native publish (`native`, a client of the follower) is checked on the
/// topic's forwarder, wherever it is placed, against the schema the leader pushed it.
fn schemas_through_a_follower(grpc: &Grpc, at_leader: &Grpc, native: &Client) {
    let schema = |definition: &str| pubsub::Schema {
        r#type: pubsub::schema::Type::Avro as i32,
        definition: definition.to_owned(),
        ..Default::default()
    };
    let count = r#"{"type": "record", "name": "Count", "fields": [{"name": "n", "type": "int"}]}"#;
    let counts = r#"{"type": "record", "name": "Count", "fields": [{"name": "n", "type": "int"},
        {"name": "m", "type": ["null", "int"], "default": null}]}"#;
    succeeds("CreateSchema at a follower", || {
        grpc.create_schema(pubsub::CreateSchemaRequest {
            parent: project_path(),
            schema: Some(schema(count)),
            schema_id: "counts".to_owned(),
        })
    });
    let committed = succeeds("CommitSchema at a follower", || {
        grpc.commit_schema(pubsub::CommitSchemaRequest {
            name: schema_path("counts"),
            schema: Some(schema(counts)),
        })
    });
    let revisions = at_leader
        .list_schema_revisions(pubsub::ListSchemaRevisionsRequest {
            name: schema_path("counts"),
            ..Default::default()
        })
        .unwrap();
    let ids: Vec<&str> = revisions.schemas.iter().map(|revision| revision.revision_id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], committed.revision_id, "the newest first, at the leader");

    succeeds("CreateTopic with a schema at a follower", || {
        grpc.create_topic(pubsub::Topic {
            name: topic_path("typed"),
            schema_settings: Some(pubsub::SchemaSettings {
                schema: schema_path("counts"),
                encoding: pubsub::Encoding::Json as i32,
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    let shown = at_leader.get_topic(pubsub::GetTopicRequest { topic: topic_path("typed") }).unwrap();
    assert_eq!(shown.schema_settings.map(|settings| settings.schema), Some(schema_path("counts")));
    let refused = grpc.publish_data("typed", &[b"not json"]).unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    succeeds("a publish that matches", || grpc.publish_data("typed", &[br#"{"n": 3}"#]));
    let refused = block_on(native.publish("typed", vec![Message::new("not json")])).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
    assert!(refused.to_string().contains("Message failed schema validation"), "{refused}");
    block_on(native.publish("typed", vec![Message::new(r#"{"n": 4}"#)]))
        .expect("a native publish that matches");

    succeeds("DeleteTopic at a follower", || {
        grpc.delete_topic(pubsub::DeleteTopicRequest { topic: topic_path("typed") })
    });
    succeeds("DeleteSchema at a follower", || {
        grpc.delete_schema(pubsub::DeleteSchemaRequest { name: schema_path("counts") })
    });
    let gone = at_leader
        .get_schema(pubsub::GetSchemaRequest { name: schema_path("counts"), ..Default::default() })
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}

/// The refusal a node's audit log holds for a topic `principal` may not create.
fn denied_create(topic: &str, principal: &str) -> String {
    format!("denied pubsub.topics.create on topic:{topic} to {principal}")
}

/// With TLS on every port and client certificates as principals, a catalog change reaching a
/// node that does not lead the catalog is carried to the leader with its principal over the
/// cluster port (the client's certificate cannot cross, which once left gRPC refusing it on
/// every follower of a TLS cluster), and decided there with the leader's access file: on every
/// node, a permitted principal creates, reads, lists and deletes, and another is refused, by
/// the leader.
/// A three-node cluster with TLS on every port, mutual TLS on the cluster's, and client
/// certificates as principals: `root` may do anything, `billing` only look.
struct TlsCluster {
    _files: Files,
    ca: TestCa,
    root: crate::test_ca::Pair,
    billing: crate::test_ca::Pair,
    cluster: ringpost_tests::cluster::Cluster,
}

fn tls_cluster(label: &str) -> TlsCluster {
    let files = Files::new(label);
    let ca = TestCa::new(&files.directory, "cluster");
    let server = ca.server();
    let (root, billing) = (ca.client("root", None), ca.client("billing", None));
    let access = AccessFile::new(&files, &access_text(&[], &["admin * root", "viewer * billing"]));
    let secret = files.path("cluster-secret");
    std::fs::write(&secret, "rpt_the-grpc-cluster-tls-tests-shared-secret-0123456789\n").unwrap();
    let args = flags(&[
        "--tls-cert",
        &text(&server.certificate),
        "--tls-key",
        &text(&server.key),
        "--tls-client-ca",
        &text(&ca.file),
        "--cluster-ca",
        &text(&ca.file),
        "--cluster-secret-file",
        &text(&secret),
        "--auth",
        "required",
        "--access-file",
        &text(&access.path),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let cluster = ringpost_tests::cluster::Cluster::start(label, 3, args);
    TlsCluster { _files: files, ca, root, billing, cluster }
}

#[test]
fn over_tls_every_node_decides_catalog_changes_for_the_principal_of_a_client_certificate() {
    let TlsCluster { _files, ca, root, billing, cluster } = tls_cluster("grpc-cluster-tls");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut carried = 0;
    for id in cluster.ids() {
        let address = cluster.node(id).grpc_address.clone().expect("the node serves the gRPC API");
        let connect =
            |pair| over_tls(&runtime, &address, &ca, Some(pair)).expect("a gRPC connection over TLS");
        let (as_root, as_billing) = (connect(&root), connect(&billing));
        let mut publisher = pubsub::publisher_client::PublisherClient::new(as_root.clone());
        let mut subscriber = pubsub::subscriber_client::SubscriberClient::new(as_root);
        let topic = format!("tls-{id}");
        let created = succeeds(&format!("CreateTopic at node {id}"), || {
            let request = pubsub::Topic { name: topic_path(&topic), ..Default::default() };
            runtime.block_on(publisher.clone().create_topic(request)).map(tonic::Response::into_inner)
        });
        assert_eq!(created.name, topic_path(&topic));
        // This node applied the change before it answered: it reads it at once.
        let request = pubsub::GetTopicRequest { topic: topic_path(&topic) };
        runtime
            .block_on(publisher.get_topic(request))
            .unwrap_or_else(|status| panic!("node {id}: {status:?}"));
        let reader = format!("{topic}-reader");
        let request = pubsub::Subscription {
            name: subscription_path(&reader),
            topic: topic_path(&topic),
            ..Default::default()
        };
        runtime
            .block_on(subscriber.create_subscription(request))
            .unwrap_or_else(|status| panic!("{status:?}"));
        let listed = runtime
            .block_on(publisher.list_topics(pubsub::ListTopicsRequest {
                project: ringpost_tests::grpc::project_path(),
                ..Default::default()
            }))
            .unwrap()
            .into_inner();
        assert!(listed.topics.iter().any(|shown| shown.name == topic_path(&topic)), "node {id}: {listed:?}");
        let request = pubsub::DeleteSubscriptionRequest { subscription: subscription_path(&reader) };
        runtime
            .block_on(subscriber.delete_subscription(request))
            .unwrap_or_else(|status| panic!("{status:?}"));

        // Another principal may look, not change: refused, nothing made, and the refusal is
        // the leader's, whichever node the call reached.
        let refused = format!("refused-{id}");
        let status = retrying(&format!("CreateTopic as billing at node {id}"), || {
            let request = pubsub::Topic { name: topic_path(&refused), ..Default::default() };
            let mut publisher = pubsub::publisher_client::PublisherClient::new(as_billing.clone());
            runtime.block_on(publisher.create_topic(request)).map(tonic::Response::into_inner)
        })
        .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        let mut viewer = pubsub::publisher_client::PublisherClient::new(as_billing.clone());
        let shown = runtime.block_on(viewer.get_topic(pubsub::GetTopicRequest { topic: topic_path(&topic) }));
        assert!(shown.is_ok(), "a viewer reads what it may see: {shown:?}");
        let status = runtime
            .block_on(publisher.get_topic(pubsub::GetTopicRequest { topic: topic_path(&refused) }))
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        let logged: Vec<u64> = cluster
            .ids()
            .filter(|node| cluster.node(*node).log().contains(&denied_create(&refused, "billing")))
            .collect();
        assert_eq!(logged.len(), 1, "the refusal of '{refused}' was logged by nodes {logged:?}");
        if logged[0] != id {
            carried += 1;
        }
    }
    // Two of three nodes follow the catalog (one more, had its lead moved meanwhile).
    assert!(carried >= 1, "no change was carried to the catalog's leader:\n{}", cluster.logs());
}

/// Who logged `line` in their audit log: the nodes that decided it.
fn deciders(cluster: &ringpost_tests::cluster::Cluster, line: &str) -> Vec<u64> {
    cluster.ids().filter(|node| cluster.node(*node).log().contains(line)).collect()
}

/// A StreamingPull of `subscription` on `channel` for a client naming itself `client_id` (or
/// none): the sender of its later requests and its responses.
fn open_stream(
    runtime: &tokio::runtime::Runtime,
    channel: &tonic::transport::Channel,
    subscription: &str,
    client_id: &str,
) -> Result<
    (
        tokio::sync::mpsc::Sender<pubsub::StreamingPullRequest>,
        tonic::Streaming<pubsub::StreamingPullResponse>,
    ),
    tonic::Status,
> {
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    let first = pubsub::StreamingPullRequest {
        subscription: subscription_path(subscription),
        stream_ack_deadline_seconds: 600,
        client_id: client_id.to_owned(),
        ..Default::default()
    };
    runtime.block_on(requests.send(first)).unwrap();
    let outgoing = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(outgoing);
    let mut subscriber = pubsub::subscriber_client::SubscriberClient::new(channel.clone());
    let mut responses = runtime.block_on(subscriber.streaming_pull(outgoing))?.into_inner();
    // A refusal may come as the stream's first answer rather than the call's.
    if let Ok(next) = runtime
        .block_on(async { tokio::time::timeout(Duration::from_millis(300), responses.message()).await })
    {
        next?;
    }
    Ok((requests, responses))
}

/// Reads `responses` until a message whose data is `data` arrives (within 30 s); its ack id.
fn read_until(
    runtime: &tokio::runtime::Runtime,
    responses: &mut tonic::Streaming<pubsub::StreamingPullResponse>,
    data: &[u8],
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = runtime
            .block_on(async { tokio::time::timeout(left, responses.message()).await })
            .unwrap_or_else(|_| panic!("{:?} was not delivered within 30 s", String::from_utf8_lossy(data)));
        let response = next.expect("the stream delivers").expect("the stream stays open");
        for received in response.received_messages {
            if received.message.as_ref().unwrap().data == data {
                return received.ack_id;
            }
        }
    }
}

/// Pulls `subscription` on `subscriber` until a message whose data is `data` arrives (within
/// 30 s), acknowledging whatever else arrives but for `held`, which must not arrive; its ack id,
/// not acknowledged.
fn pull_until(
    runtime: &tokio::runtime::Runtime,
    subscriber: &mut pubsub::subscriber_client::SubscriberClient<tonic::transport::Channel>,
    subscription: &str,
    data: &[u8],
    held: Option<&[u8]>,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "{:?} was not pulled within 30 s", String::from_utf8_lossy(data));
        let request = pubsub::PullRequest {
            subscription: subscription_path(subscription),
            max_messages: 10,
            ..Default::default()
        };
        let pulled = runtime.block_on(subscriber.pull(request)).expect("a pull").into_inner();
        let mut found = None;
        let mut others = Vec::new();
        for received in pulled.received_messages {
            let delivered = &received.message.as_ref().unwrap().data;
            assert!(held != Some(&delivered[..]), "a message still leased was delivered again");
            match delivered == data {
                true => found = Some(received.ack_id),
                false => others.push(received.ack_id),
            }
        }
        if !others.is_empty() {
            let request =
                pubsub::AcknowledgeRequest { subscription: subscription_path(subscription), ack_ids: others };
            runtime.block_on(subscriber.acknowledge(request)).expect("an acknowledgement");
        }
        if let Some(ack_id) = found {
            return ack_id;
        }
    }
}

/// With TLS on every port and client certificates as principals, a gRPC publish, pull,
/// acknowledgement, deadline change and streaming pull reaching a node that does not serve the
/// topic is carried to the node that does over the cluster's connections with the caller's
/// principal (its certificate cannot cross; the call was refused there before), and decided
/// there with that node's access file: through every node, the permitted principal publishes
/// and consumes, and another is refused, by the node serving the topic. A client that leaves a
/// carried stream gives back what it held there at once.
#[test]
fn over_tls_every_node_serves_publish_and_delivery_for_the_principal_of_a_client_certificate() {
    let TlsCluster { _files, ca, root, billing, cluster } = tls_cluster("grpc-cluster-tls-data");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let connect = |id: u64, pair| {
        let address = cluster.node(id).grpc_address.clone().expect("the node serves the gRPC API");
        over_tls(&runtime, &address, &ca, Some(pair)).expect("a gRPC connection over TLS")
    };
    let first = cluster.ids().next().unwrap();
    let admin = connect(first, &root);
    let (topic, subscription) = ("tls-data", "tls-data-reader");
    succeeds("CreateTopic", || {
        let request = pubsub::Topic { name: topic_path(topic), ..Default::default() };
        let mut publisher = pubsub::publisher_client::PublisherClient::new(admin.clone());
        runtime.block_on(publisher.create_topic(request)).map(tonic::Response::into_inner)
    });
    succeeds("CreateSubscription", || {
        // A long deadline: a message comes back within the test only when its lease is given back.
        let request = pubsub::Subscription {
            name: subscription_path(subscription),
            topic: topic_path(topic),
            ack_deadline_seconds: 600,
            ..Default::default()
        };
        let mut subscriber = pubsub::subscriber_client::SubscriberClient::new(admin.clone());
        runtime.block_on(subscriber.create_subscription(request)).map(tonic::Response::into_inner)
    });
    let mut carried = Vec::new();
    let mut serving = None;
    for id in cluster.ids() {
        let (as_root, as_billing) = (connect(id, &root), connect(id, &billing));
        let mut publisher = pubsub::publisher_client::PublisherClient::new(as_root.clone());
        let mut subscriber = pubsub::subscriber_client::SubscriberClient::new(as_root.clone());
        // An administration call, answered here.
        let request = pubsub::GetSubscriptionRequest { subscription: subscription_path(subscription) };
        runtime
            .block_on(subscriber.get_subscription(request))
            .unwrap_or_else(|status| panic!("node {id}: {status:?}"));

        // Publish, pull, a deadline change and an acknowledgement.
        let data = format!("pulled through node {id}").into_bytes();
        succeeds(&format!("Publish at node {id}"), || {
            let message = pubsub::PubsubMessage { data: data.clone().into(), ..Default::default() };
            let request = pubsub::PublishRequest { topic: topic_path(topic), messages: vec![message] };
            runtime.block_on(publisher.clone().publish(request)).map(tonic::Response::into_inner)
        });
        let ack_id = pull_until(&runtime, &mut subscriber, subscription, &data, None);
        let request = pubsub::ModifyAckDeadlineRequest {
            subscription: subscription_path(subscription),
            ack_ids: vec![ack_id.clone()],
            ack_deadline_seconds: 300,
        };
        runtime
            .block_on(subscriber.modify_ack_deadline(request))
            .unwrap_or_else(|status| panic!("node {id}: {status:?}"));
        let request = pubsub::AcknowledgeRequest {
            subscription: subscription_path(subscription),
            ack_ids: vec![ack_id],
        };
        runtime
            .block_on(subscriber.acknowledge(request))
            .unwrap_or_else(|status| panic!("node {id}: {status:?}"));

        // A streaming pull, acknowledged on the stream.
        let data = format!("streamed through node {id}").into_bytes();
        let (requests, mut responses) = open_stream(&runtime, &as_root, subscription, "")
            .unwrap_or_else(|status| panic!("node {id}: {status:?}"));
        let message = pubsub::PubsubMessage { data: data.clone().into(), ..Default::default() };
        let request = pubsub::PublishRequest { topic: topic_path(topic), messages: vec![message] };
        runtime.block_on(publisher.publish(request)).unwrap_or_else(|status| panic!("node {id}: {status:?}"));
        let ack_id = read_until(&runtime, &mut responses, &data);
        let acknowledgement = pubsub::StreamingPullRequest { ack_ids: vec![ack_id], ..Default::default() };
        runtime.block_on(requests.send(acknowledgement)).unwrap();
        // The stream ends with its requests; the acknowledgement was applied before.
        drop(requests);
        runtime.block_on(async { while let Ok(Some(_)) = responses.message().await {} });

        // Another principal may look, not publish or consume: refused, by the serving node.
        let mut publisher = pubsub::publisher_client::PublisherClient::new(as_billing.clone());
        let mut subscriber = pubsub::subscriber_client::SubscriberClient::new(as_billing.clone());
        let message = pubsub::PubsubMessage { data: b"refused".to_vec().into(), ..Default::default() };
        let request = pubsub::PublishRequest { topic: topic_path(topic), messages: vec![message] };
        let status = runtime.block_on(publisher.publish(request)).unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "node {id}: {status:?}");
        let request = pubsub::PullRequest {
            subscription: subscription_path(subscription),
            max_messages: 1,
            ..Default::default()
        };
        let status = runtime.block_on(subscriber.pull(request)).unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "node {id}: {status:?}");
        let request = pubsub::AcknowledgeRequest {
            subscription: subscription_path(subscription),
            ack_ids: vec!["1.1.1".into()],
        };
        let status = runtime.block_on(subscriber.acknowledge(request)).unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "node {id}: {status:?}");
        let status = open_stream(&runtime, &as_billing, subscription, "").map(|_| ()).unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "node {id}: {status:?}");
        let line = format!("denied pubsub.topics.publish on topic:{topic} to billing");
        let logged = deciders(&cluster, &line);
        assert_eq!(logged.len(), 1, "the refused publish was logged by nodes {logged:?}");
        assert!(serving.is_none() || serving == Some(logged[0]), "the topic is decided by one node");
        serving = Some(logged[0]);
        if logged[0] != id {
            carried.push(id);
        }
        // Each node logged as many refusals as there were; all of them on the serving node.
        let consume =
            format!("denied pubsub.subscriptions.consume on subscription:{subscription} to billing");
        assert_eq!(
            deciders(&cluster, &consume),
            logged,
            "the refused consumption was decided where it is served"
        );
    }
    // Two of the three nodes do not serve the topic.
    assert_eq!(carried.len(), 2, "calls were not carried to the serving node:\n{}", cluster.logs());

    // A publish over Pub/Sub's limit reaching a node that does not serve its topic is refused
    // by Pub/Sub's rules, and what follows still crosses between the nodes.
    let mut publisher = pubsub::publisher_client::PublisherClient::new(connect(carried[0], &root))
        .max_encoding_message_size(32 << 20);
    let message = pubsub::PubsubMessage { data: vec![7u8; 11 << 20].into(), ..Default::default() };
    let request = pubsub::PublishRequest { topic: topic_path(topic), messages: vec![message] };
    let status = runtime.block_on(publisher.publish(request)).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // A client that leaves a carried stream: the serving node's stream ends with it, and the
    // message it held, on a lease of 600 s, is delivered again at once. A client that names
    // itself (Google's clients do) reconnects holding what it was sent: its leases outlive the
    // stream, and its ack id still acknowledges.
    let (serving, through) = (serving.unwrap(), carried[0]);
    let mut publisher = pubsub::publisher_client::PublisherClient::new(connect(serving, &root));
    let mut stream_one = |data: &[u8], client_id: &str| {
        let (requests, mut responses) =
            open_stream(&runtime, &connect(through, &root), subscription, client_id)
                .expect("a carried stream");
        let message = pubsub::PubsubMessage { data: data.to_vec().into(), ..Default::default() };
        let request = pubsub::PublishRequest { topic: topic_path(topic), messages: vec![message] };
        runtime.block_on(publisher.publish(request)).expect("a publish");
        let ack_id = read_until(&runtime, &mut responses, data);
        drop((requests, responses));
        ack_id
    };
    let (kept, given_back) = (b"held by a named client".to_vec(), b"held by an anonymous client".to_vec());
    let kept_ack_id = stream_one(&kept, "worker-1");
    stream_one(&given_back, "");
    let mut subscriber = pubsub::subscriber_client::SubscriberClient::new(connect(serving, &root));
    let ack_id = pull_until(&runtime, &mut subscriber, subscription, &given_back, Some(&kept));
    let request =
        pubsub::AcknowledgeRequest { subscription: subscription_path(subscription), ack_ids: vec![ack_id] };
    runtime.block_on(subscriber.acknowledge(request)).expect("an acknowledgement");
    let mut through_subscriber = pubsub::subscriber_client::SubscriberClient::new(connect(through, &root));
    let request = pubsub::AcknowledgeRequest {
        subscription: subscription_path(subscription),
        ack_ids: vec![kept_ack_id],
    };
    runtime.block_on(through_subscriber.acknowledge(request)).expect("an acknowledgement");
    #[allow(deprecated)]
    let request = pubsub::PullRequest {
        subscription: subscription_path(subscription),
        max_messages: 10,
        return_immediately: true,
    };
    let left = runtime.block_on(subscriber.pull(request)).expect("a pull").into_inner();
    assert!(left.received_messages.is_empty(), "acknowledged, yet delivered again: {left:?}");
}
