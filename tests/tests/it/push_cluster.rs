//! Push subscriptions on three real nodes: every node's monitoring endpoint serves every node's
//! push signing key, so that a receiver verifying tokens against any one node's JWK Set accepts
//! those of whichever node pushes; and the node pushing a subscription (its topic's leader),
//! SIGKILLed while it pushes, is followed by the new leader, which pushes what was not
//! acknowledged: every acknowledged publish reaches the receiver.

use crate::push_token::python;
use ringpost_daemon::catalog::OidcToken;
use ringpost_daemon::push::token::{Signer, SigningKey, ISSUER_DEFAULT, JWKS_PATH, SIGNING_KEY_FILE};
use ringpost_daemon::push::TokenSigner as _;
use ringpost_tests::cluster::Cluster;
use ringpost_tests::scrape::http_get;
use std::process::Command;
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
