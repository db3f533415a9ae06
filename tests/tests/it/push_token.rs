//! Push authentication on the real daemon: the push tokens' public key as the monitoring
//! endpoint serves it (`/oauth2/v3/certs`) verifies, with PyJWT (pinned in
//! tests/python/requirements.txt, as a receiver written for Google's push tokens would use it),
//! a token signed by the daemon's own signer with the key the daemon made in its data
//! directories. Until push requests are sent, the token comes from `push::token::Signer`, the
//! very signer the daemon hands its push client, over the key file the daemon wrote. The key
//! survives restarts (same `kid`), a copy lost from one data directory is written again, and a
//! damaged key stops the start with the file's name.

use ringpost_daemon::catalog::OidcToken;
use ringpost_daemon::push::token::{Signer, SigningKey, ISSUER_DEFAULT, JWKS_PATH, SIGNING_KEY_FILE};
use ringpost_daemon::push::TokenSigner as _;
use ringpost_tests::scrape::http_get;
use ringpost_tests::{json_field, Daemon};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the virtualenv may take to make (`python_client.rs` says why).
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a start refused for a damaged key may take to exit: it refuses before any shard
/// starts, so this only tells a refusal from a daemon that started anyway.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The receiver's side, as Google's push documentation has it for Python: fetch the signing
/// key by the token's `kid` from the certificates URL, then check signature, audience and
/// issuer. Prints the verified claims as JSON, then how a wrong audience and a forged claim
/// fared.
const VERIFIER: &str = r#"
import base64, json, sys, jwt
url, token, audience, issuer = sys.argv[1:5]
signing_key = jwt.PyJWKClient(url).get_signing_key_from_jwt(token)
claims = jwt.decode(token, signing_key.key, algorithms=["RS256"], audience=audience, issuer=issuer)
print(json.dumps({"kid": signing_key.key_id, "claims": claims}, sort_keys=True))
try:
    jwt.decode(token, signing_key.key, algorithms=["RS256"], audience="https://someone-else.example")
    print("a wrong audience was accepted")
except jwt.InvalidAudienceError:
    print("a wrong audience is refused")
header, body, signature = token.split(".")
forged = dict(claims, email="mallory@example.iam")
body = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
try:
    jwt.decode(".".join([header, body, signature]), signing_key.key, algorithms=["RS256"], audience=audience)
    print("a forged claim was accepted")
except jwt.InvalidSignatureError:
    print("a forged claim is refused")
"#;

/// The Python suite's virtualenv, made (or found up to date) by tests/python/setup.sh.
pub(crate) fn python() -> PathBuf {
    let python_tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let mut setup = Command::new("bash");
    setup.arg(python_tests.join("setup.sh"));
    let started = std::time::Instant::now();
    let output = setup.output().expect("running tests/python/setup.sh");
    assert!(
        output.status.success(),
        "tests/python/setup.sh failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(started.elapsed() < SETUP_TIMEOUT, "tests/python/setup.sh took {:?}", started.elapsed());
    python_tests.join(".venv").join("bin").join("python")
}

fn served_key_id(daemon: &Daemon) -> String {
    let http = daemon.http_address.as_deref().expect("the monitoring endpoint serves");
    let (status, body) = http_get(http, JWKS_PATH);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_field(&body, "kty"), "RSA", "{body}");
    assert_eq!(json_field(&body, "alg"), "RS256", "{body}");
    assert_eq!(json_field(&body, "use"), "sig", "{body}");
    json_field(&body, "kid").to_owned()
}

#[test]
fn a_push_token_verifies_with_pyjwt_against_the_served_keys_and_the_key_outlives_restarts() {
    let mut daemon =
        Daemon::prepare("push-token", Vec::new(), vec!["--http-listen".into(), "127.0.0.1:0".into()]);
    daemon.data_dirs = (0..3).map(|index| daemon.directory.join(format!("disk{index}"))).collect();
    daemon.spawn();
    let kid = served_key_id(&daemon);
    assert!(daemon.log().contains(&format!("made the push signing key (kid {kid})")), "{}", daemon.log());
    let key_files: Vec<PathBuf> =
        daemon.data_dirs.iter().map(|directory| directory.join(SIGNING_KEY_FILE)).collect();
    let key = SigningKey::open(&key_files[1]).expect("the daemon's key file");
    assert_eq!(key.key_id(), kid, "the served key is the one in the data directories");

    let signer = Signer::new(key, ISSUER_DEFAULT.to_owned());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let endpoint = "https://receiver.example/push";
    let oidc = OidcToken { service_account_email: "pusher@example.iam".to_owned(), audience: String::new() };
    let token = signer.sign(&oidc, endpoint, now).expect("signed");
    let url = format!("http://{}{JWKS_PATH}", daemon.http_address.as_deref().unwrap());
    let output = Command::new(python())
        .args(["-c", VERIFIER, &url, &token, endpoint, ISSUER_DEFAULT])
        .output()
        .expect("running the verifier");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "PyJWT refused the token:\n{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines = printed.lines();
    let verified = lines.next().expect("the verified claims");
    let expected = format!(
        r#"{{"claims": {{"aud": "{endpoint}", "azp": "pusher@example.iam", "email": "pusher@example.iam", "email_verified": true, "exp": {}, "iat": {now}, "iss": "{ISSUER_DEFAULT}", "sub": "pusher@example.iam"}}, "kid": "{kid}"}}"#,
        now + 3600
    );
    assert_eq!(verified, expected);
    assert_eq!(lines.collect::<Vec<_>>(), ["a wrong audience is refused", "a forged claim is refused"]);

    // The same key after a restart, and after one data directory lost its copy (rewritten).
    daemon.restart();
    assert_eq!(served_key_id(&daemon), kid, "the same key after a restart");
    daemon.kill();
    std::fs::remove_file(&key_files[0]).unwrap();
    daemon.spawn();
    assert_eq!(served_key_id(&daemon), kid, "the same key with one copy lost");
    assert_eq!(std::fs::read(&key_files[0]).unwrap(), std::fs::read(&key_files[2]).unwrap(), "rewritten");
    assert!(daemon.log().contains("was missing from"), "{}", daemon.log());

    // A damaged copy stops the start, named, and is left for the operator.
    daemon.kill();
    std::fs::write(&key_files[2], b"not a key").unwrap();
    daemon.launch();
    let status = daemon.wait_for_exit(REFUSAL_TIMEOUT).expect("the start is refused");
    assert!(!status.success());
    let log = daemon.log();
    let refusal = log.lines().last().unwrap_or_default();
    assert!(
        refusal.contains("cannot start")
            && refusal.contains(&key_files[2].display().to_string())
            && refusal.contains("damaged"),
        "{log}"
    );
    assert_eq!(std::fs::read(&key_files[2]).unwrap(), b"not a key", "never replaced");
}
