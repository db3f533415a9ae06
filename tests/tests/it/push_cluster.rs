//! Push subscriptions on three real nodes: every node's monitoring endpoint serves every node's
//! push signing key, so that a receiver verifying tokens against any one node's JWK Set accepts
//! those of whichever node pushes; and the node pushing a subscription (its topic's leader),
//! SIGKILLed while it pushes (its pushes outstanding, a backlog behind them), is followed by the
//! new leader, which pushes what was not acknowledged: every acknowledged publish reaches the
//! receiver, and none answered 204 before is pushed again. The failover's figures (pushed
//! twice, the gap) are printed.

use crate::push::field;
use crate::push_token::python;
use ringpost_client::{block_on, Message};
use ringpost_daemon::catalog::OidcToken;
use ringpost_daemon::push::token::{Signer, SigningKey, ISSUER_DEFAULT, JWKS_PATH, SIGNING_KEY_FILE};
use ringpost_daemon::push::TokenSigner as _;
use ringpost_tests::cluster::Cluster;
use ringpost_tests::push_receiver::Receiver;
use ringpost_tests::scrape::http_get;
use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the nodes may take to register (each once the catalog has a leader) and the
/// monitoring endpoints to serve every key: far beyond a working cluster's second or two.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Every `kid` in a JWK Set, in order.
fn key_ids(jwks: &str) -> Vec<String> {
    jwks.split("\"kid\":\"").skip(1).map(|rest| rest[..rest.find('"').unwrap()].to_owned()).collect()
}

/// Node `id`'s JWK Set, as its monitoring endpoint serves it.
fn jwks_of(cluster: &Cluster, id: u64) -> String {
    let http = cluster.node(id).http_address.as_deref().expect("the monitoring endpoint serves");
    let (status, body) = http_get(http, JWKS_PATH);
    assert_eq!(status, 200, "{body}");
    body
}

/// PyJWT as a receiver uses it: the key fetched by the token's `kid` from the certificates URL,
/// then the signature, audience and issuer checked. Prints the kid it verified with.
const VERIFIER: &str = r#"
import sys, jwt
url, token, audience, issuer = sys.argv[1:5]
signing_key = jwt.PyJWKClient(url).get_signing_key_from_jwt(token)
jwt.decode(token, signing_key.key, algorithms=["RS256"], audience=audience, issuer=issuer)
print(signing_key.key_id)
"#;

#[test]
fn every_nodes_jwks_serves_every_nodes_key_and_a_token_verifies_against_another_node() {
    let cluster = Cluster::start("push-jwks", 3, vec!["--http-listen".into(), "127.0.0.1:0".into()]);
    // Each node's own key, from the key file in its data directory.
    let keys: Vec<SigningKey> = cluster
        .ids()
        .map(|id| SigningKey::open(&cluster.node(id).data_dirs[0].join(SIGNING_KEY_FILE)).unwrap())
        .collect();
    let mut expected: Vec<String> = keys.iter().map(|key| key.key_id().to_owned()).collect();
    expected.sort();
    expected.dedup();
    assert_eq!(expected.len(), 3, "each node made a key of its own");
    let deadline = Instant::now() + REGISTRATION_TIMEOUT;
    for id in cluster.ids() {
        loop {
            let served = key_ids(&jwks_of(&cluster, id));
            assert_eq!(served[0], keys[(id - 1) as usize].key_id(), "node {id} serves its own key first");
            let mut sorted = served.clone();
            sorted.sort();
            if sorted == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} serves {served:?}, not every node's key {expected:?}{}",
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // A token node 1 signs verifies against node 2's certificates URL, as a receiver pointed at
    // node 2 would check it after node 1 took over the pushing.
    let signer = Signer::new(
        SigningKey::open(&cluster.node(1).data_dirs[0].join(SIGNING_KEY_FILE)).unwrap(),
        ISSUER_DEFAULT.to_owned(),
    );
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let endpoint = "https://receiver.example/push";
    let oidc = OidcToken { service_account_email: "pusher@example.iam".to_owned(), audience: String::new() };
    let token = signer.sign(&oidc, endpoint, now).unwrap();
    let url = format!("http://{}{JWKS_PATH}", cluster.node(2).http_address.as_deref().unwrap());
    let output = Command::new(python())
        .args(["-c", VERIFIER, &url, &token, endpoint, ISSUER_DEFAULT])
        .output()
        .expect("running the verifier");
    assert!(
        output.status.success(),
        "PyJWT refused node 1's token against node 2's keys:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), keys[0].key_id());
}

/// How long the pushing may take to start, and to resume after the leader's death: far beyond
/// a working cluster's failover of a few seconds.
const PUSHING_TIMEOUT: Duration = Duration::from_secs(40);
/// Messages published in each request, and the pause between requests: a steady stream, a few
/// hundred a second.
const PUBLISH_BATCH: usize = 5;
const PUBLISH_PAUSE: Duration = Duration::from_millis(20);
/// Pushes received before the leader is killed, and publishes acknowledged after it, before the
/// publisher stops.
const PUSHED_BEFORE_KILL: usize = 100;
const PUBLISHED_AFTER_KILL: usize = 100;
/// How long the receiver holds its answers before the leader is killed.
const STALL: Duration = Duration::from_secs(1);

/// What the publisher had acknowledged (each message's id, and when), and how many of its
/// requests failed.
#[derive(Default)]
struct Published {
    acknowledged: Vec<(u64, Instant)>,
    failed: usize,
}

/// Publishes a steady stream to `topic` through the router at `address` until `stop`.
fn publish_until(
    address: String,
    topic: &'static str,
    stop: Arc<AtomicBool>,
    published: Arc<Mutex<Published>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let client = block_on(ringpost_client::Client::connect(&address)).unwrap();
        let mut sequence = 0;
        while !stop.load(Ordering::Relaxed) {
            let batch =
                (0..PUBLISH_BATCH).map(|index| Message::new(format!("m{}", sequence + index))).collect();
            sequence += PUBLISH_BATCH;
            match block_on(client.publish(topic, batch)) {
                Ok(ids) => {
                    let now = Instant::now();
                    published.lock().unwrap().acknowledged.extend(ids.into_iter().map(|id| (id, now)));
                }
                Err(_) => published.lock().unwrap().failed += 1,
            }
            std::thread::sleep(PUBLISH_PAUSE);
        }
    })
}

/// Waits up to `within` for `done`, polling.
fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_pushing_leader_sigkilled_its_successor_pushes_every_acknowledged_publish() {
    let mut cluster = Cluster::start("push-failover", 3, Vec::new());
    // The receiver answers 204 at once, but holds its answers while `stalled`: the leader is
    // killed with pushes outstanding and a backlog behind them, as when an endpoint slows.
    let stalled = Arc::new(AtomicBool::new(false));
    let holding = stalled.clone();
    let receiver = Receiver::on_free_port(move |_, _| {
        while holding.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        (Duration::ZERO, 204)
    });
    block_on(cluster.node(1).client().create_topic("pushed")).unwrap();
    let endpoint = receiver.url("/pushed");
    let created = cluster.node(1).cli(&[
        "sub",
        "create",
        "pushed-sub",
        "--topic",
        "pushed",
        "--push-endpoint",
        &endpoint,
        "--ack-deadline",
        "10",
        "--push-project",
        "failover-proj",
    ]);
    ringpost_tests::succeeded(&created);
    let leader = cluster.topic_leader("pushed");
    let through = cluster.ids().find(|id| *id != leader).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(Mutex::new(Published::default()));
    let publisher =
        publish_until(cluster.node(through).address.clone(), "pushed", stop.clone(), published.clone());
    let pushed_ids = |receiver: &Receiver| -> Vec<(u64, Instant)> {
        receiver
            .seen("/pushed")
            .iter()
            .map(|seen| (field(&seen.text(), "messageId").parse().unwrap(), seen.at))
            .collect()
    };
    wait_until(PUSHING_TIMEOUT, "the leader pushes", || receiver.seen("/pushed").len() >= PUSHED_BEFORE_KILL);

    // SIGKILL the node that leads the topic, and so pushes its subscription, while it pushes:
    // its pushes outstanding are never answered, and a backlog waits behind them.
    stalled.store(true, Ordering::Relaxed);
    std::thread::sleep(STALL);
    let killed_at = Instant::now();
    cluster.node_mut(leader).kill();
    stalled.store(false, Ordering::Relaxed);
    let acknowledged_after = |published: &Mutex<Published>| {
        published.lock().unwrap().acknowledged.iter().filter(|(_, at)| *at > killed_at).count()
    };
    wait_until(PUSHING_TIMEOUT, "publishes acknowledged again after the kill", || {
        acknowledged_after(&published) >= PUBLISHED_AFTER_KILL
    });
    stop.store(true, Ordering::Relaxed);
    publisher.join().unwrap();
    let new_leader = cluster.topic_leader("pushed");
    assert_ne!(new_leader, leader);

    // Every acknowledged publish reaches the receiver, at least once.
    let acknowledged: BTreeSet<u64> =
        published.lock().unwrap().acknowledged.iter().map(|(id, _)| *id).collect();
    let deadline = Instant::now() + PUSHING_TIMEOUT;
    let missing: BTreeSet<u64> = loop {
        let pushed: BTreeSet<u64> = pushed_ids(&receiver).into_iter().map(|(id, _)| id).collect();
        let missing: BTreeSet<u64> = acknowledged.difference(&pushed).copied().collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged publishes never pushed after node {leader}'s death (node {new_leader} leads): {:?}{}",
        missing.len(),
        acknowledged.len(),
        missing.iter().take(20).collect::<Vec<_>>(),
        cluster.logs()
    );

    // Every push, the killed leader's and its successor's, names the project the subscription
    // was created in: kept in the catalog, and sent with the subscription to whichever replica
    // leads.
    let names: BTreeSet<String> =
        receiver.seen("/pushed").iter().map(|seen| field(&seen.text(), "subscription").to_owned()).collect();
    assert_eq!(names, BTreeSet::from(["projects/failover-proj/subscriptions/pushed-sub".to_owned()]));

    // The figures: pushed twice, and the gap the failover left in the pushing.
    std::thread::sleep(Duration::from_secs(1));
    let pushes = pushed_ids(&receiver);
    let mut times: HashMap<u64, Vec<Instant>> = HashMap::new();
    for (id, at) in &pushes {
        times.entry(*id).or_default().push(*at);
    }
    let twice = times.values().filter(|times| times.len() > 1).count();
    // Pushes answered before the stall were acknowledged by their 204: pushed once only.
    let stall_began = killed_at - STALL;
    let answered_then_pushed_again = times
        .values()
        .filter(|times| times.len() > 1 && times[0] + Duration::from_secs(1) < stall_began)
        .count();
    let first_after = pushes.iter().map(|(_, at)| *at).filter(|at| *at > killed_at).min().unwrap();
    let failed = published.lock().unwrap().failed;
    eprintln!(
        "push failover: node {leader} killed, node {new_leader} pushes; {} acknowledged publishes ({failed} publish \
         requests failed), {} pushes of {} messages, {twice} pushed twice or more ({answered_then_pushed_again} of them \
         answered 204 over a second before the stall); the first push after the kill came {:?} after it",
        acknowledged.len(),
        pushes.len(),
        times.len(),
        first_after - killed_at,
    );
    assert_eq!(answered_then_pushed_again, 0, "messages acknowledged by a 204 were pushed again");
}
