//! Google's Node.js client (@google-cloud/pubsub from npm, pinned in tests/node/package-lock.json)
//! against the real daemon's REST API, with `fallback: 'rest'` and the emulator's settings:
//! tests/node/rest_client.js creates, publishes, pulls, acknowledges, seeks and deletes. It
//! needs the modules tests/node/setup.sh installs (.ci/run runs it); without them this test says
//! so and passes, as a machine without node cannot run it.

use ringpost_tests::Daemon;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the script may take in a debug build beside other tests (a few seconds alone).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn google_node_client_over_rest() {
    let node_tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("node");
    if !node_tests.join("node_modules").join("@google-cloud").join("pubsub").is_dir() {
        eprintln!("skipped: the Node.js client is not installed; run `bash tests/node/setup.sh` (needs node and npm)");
        return;
    }
    let flags = ["--grpc-listen", "127.0.0.1:0", "--rest-listen", "127.0.0.1:0"];
    let daemon =
        Daemon::start_with("node-client", Vec::new(), flags.iter().map(|flag| (*flag).to_owned()).collect());
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    let output_path = daemon.directory.join("node.out");
    let output = std::fs::File::create(&output_path).unwrap();
    let mut child = Command::new("node")
        .arg(node_tests.join("rest_client.js"))
        .current_dir(&node_tests)
        .env("PUBSUB_EMULATOR_HOST", &rest)
        .stdin(Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .spawn()
        .expect("starting node");
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let printed = std::fs::read_to_string(&output_path).unwrap_or_default();
    assert!(
        status.is_some_and(|status| status.success()),
        "tests/node/rest_client.js failed ({status:?}, {SCRIPT_TIMEOUT:?} at most):\n{printed}\ndaemon log:\n{}",
        daemon.log()
    );
    assert!(printed.contains("the Node.js client over REST: ok"), "{printed}");
}
