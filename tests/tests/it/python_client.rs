//! Google's own Python client (google-cloud-pubsub from PyPI, the version pinned in
//! tests/python/requirements.txt) against the real daemon through `PUBSUB_EMULATOR_HOST`, with
//! nothing else changed: the suite in tests/python. This test makes the suite's virtualenv
//! (tests/python/setup.sh, a no-op when it is up to date), so that `cargo test --workspace` on
//! a fresh machine needs no step by hand, and fails with pytest's output when the suite fails.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the virtualenv may take to make: downloading and installing the pinned packages.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the whole suite may take in a debug build beside other tests (it takes about two
/// minutes alone); past this it is killed and the test fails, instead of hanging CI.
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);
const POLL: Duration = Duration::from_millis(100);

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the repository")
        .to_path_buf()
}

/// Runs `command` to its end or until `limit`, and returns whether it succeeded and what it
/// printed (standard output, then standard error).
fn run(mut command: Command, limit: Duration) -> (bool, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("starting {command:?}: {error}"));
    // Both pipes are drained on threads of their own, so that a chatty child never blocks on
    // a full pipe while this thread waits for it to exit.
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let success = wait(&mut child, limit);
    let output =
        format!("{}{}", stdout.join().expect("the stdout reader"), stderr.join().expect("the stderr reader"));
    (success, output)
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Waits for `child`; kills it past `limit` (and reports failure).
fn wait(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            return status.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("killed after {limit:?}");
            return false;
        }
        std::thread::sleep(POLL);
    }
}

#[test]
fn google_python_client_suite() {
    let repository = repository();
    let python_tests = repository.join("tests").join("python");
    let mut setup = Command::new("bash");
    setup.arg(python_tests.join("setup.sh"));
    let (made, output) = run(setup, SETUP_TIMEOUT);
    assert!(made, "tests/python/setup.sh failed:\n{output}");

    let ringpostd = ringpost_tests::binary("ringpostd");
    let mut pytest = Command::new(python_tests.join(".venv").join("bin").join("python"));
    pytest
        .args(["-m", "pytest", "-x", "-q", "tests/python"])
        .current_dir(&repository)
        .env("RINGPOSTD", &ringpostd)
        // The suite points its clients at the daemons it starts; one inherited from the
        // environment must not send them elsewhere first.
        .env_remove("PUBSUB_EMULATOR_HOST");
    let (passed, output) = run(pytest, SUITE_TIMEOUT);
    assert!(passed, "the Python client suite failed (python -m pytest -x -q tests/python):\n{output}");
}
