//! Test harness: runs the real `ringpostd` binary on free ports in its own temporary data
//! directory, runs the `ringpost` CLI against it, and checks histories of publishes and
//! deliveries with Jepsen's total-queue semantics (`checker`).

pub mod checker;
pub mod cluster;
pub mod grpc;
pub mod load;
pub mod loopfs;
pub mod netns;
pub mod push_receiver;
pub mod scrape;

use ringpost_client::{block_on, Client, Subscription};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a daemon may take to start serving before a test gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

fn target_directory() -> PathBuf {
    // The test binary lives in target/<profile>/deps/; the binaries it runs in target/<profile>/.
    let executable = std::env::current_exe().expect("current_exe");
    executable.parent().and_then(Path::parent).expect("target directory").to_path_buf()
}

/// The path of a workspace binary, built once per test process (a no-op when up to date) so a
/// test never runs a stale daemon.
pub fn binary(name: &str) -> PathBuf {
    static BUILD: Once = Once::new();
    let directory = target_directory();
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut command = Command::new(cargo);
        // `cargo test` gives this process its package's variables (CARGO_PKG_NAME, ...); build
        // scripts that watch them (ring's) would see them changed and rebuild everything twice.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_PRIMARY_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
            {
                command.env_remove(name.as_ref());
            }
        }
        command.args(["build", "--quiet", "-p", "ringpost-daemon", "-p", "ringpost-tools", "--bins"]);
        if directory.file_name().is_some_and(|profile| profile == "release") {
            command.arg("--release");
        }
        let status = command.status().expect("running cargo build for the binaries");
        assert!(status.success(), "building ringpostd and ringpost failed");
    });
    let path = directory.join(name);
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

/// A fresh directory on the real filesystem (not tmpfs), so O_DIRECT is what production sees.
pub fn temporary_directory(label: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let path = PathBuf::from("/var/tmp/ringpost-tests").join(format!(
        "{label}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&path).expect("creating a temporary directory");
    path
}

/// A `ringpostd` process serving on free ports from its own data directory.
pub struct Daemon {
    pub directory: PathBuf,
    pub address: String,
    child: Option<Child>,
    log_path: PathBuf,
    starts: u32,
    /// Data directories (default: one, `<directory>/data`).
    pub data_dirs: Vec<PathBuf>,
    /// Further flags for every start.
    pub extra_args: Vec<String>,
    /// Environment variables of every start, beside the test's own.
    pub env: Vec<(String, String)>,
    /// Where the gRPC API serves (`--grpc-listen`), when the test asked for it with
    /// `--grpc-listen 127.0.0.1:0`: the port first picked is kept across restarts, so that
    /// a client reconnects to the same address.
    pub grpc_address: Option<String>,
    /// Where the monitoring endpoint serves (`--http-listen`), when the test asked for it
    /// with `--http-listen 127.0.0.1:0`; kept across restarts as `grpc_address` is.
    pub http_address: Option<String>,
    /// Where the REST API serves (`--rest-listen`), when the test asked for it with
    /// `--rest-listen 127.0.0.1:0`; kept across restarts as `grpc_address` is.
    pub rest_address: Option<String>,
    /// `--listen`: `127.0.0.1:0` (free ports, other ones at each start) unless the test chose
    /// a port (`Daemon::prepare` and `listen_on`), which the router and its forwarders then keep
    /// across restarts.
    listen: String,
    /// The daemon's open-file limit (soft and hard), when the test sets one: below what the
    /// daemon asks for, it closes the journals beyond a quarter of it between commits.
    pub open_files_max: Option<u64>,
    /// The `ringpostd` it runs: this build's, unless a test sets another (a previous release's,
    /// to check that this build's clients still work with it).
    pub program: PathBuf,
}

impl Daemon {
    pub fn start(label: &str) -> Daemon {
        Daemon::start_with(label, Vec::new(), Vec::new())
    }

    /// Starts with the given data directories (empty: one inside the test's directory) and
    /// extra flags.
    pub fn start_with(label: &str, data_dirs: Vec<PathBuf>, extra_args: Vec<String>) -> Daemon {
        let mut daemon = Daemon::prepare(label, data_dirs, extra_args);
        daemon.spawn();
        daemon
    }

    /// A daemon in a directory of its own, not started yet: `launch` starts it without waiting
    /// (for daemons that become ready only together, like a cluster's nodes), `spawn` (as
    /// `start_with` does) starts it and waits until it serves.
    pub fn prepare(label: &str, data_dirs: Vec<PathBuf>, extra_args: Vec<String>) -> Daemon {
        let directory = temporary_directory(label);
        let data_dirs = if data_dirs.is_empty() { vec![directory.join("data")] } else { data_dirs };
        Daemon {
            log_path: directory.join("ringpostd.log"),
            directory,
            address: String::new(),
            child: None,
            starts: 0,
            data_dirs,
            extra_args,
            env: Vec::new(),
            grpc_address: None,
            http_address: None,
            rest_address: None,
            listen: "127.0.0.1:0".to_owned(),
            open_files_max: None,
            program: binary("ringpostd"),
        }
    }

    /// Serves the router on `address` (`--listen`) from the next start on; forwarder shard i
    /// listens on its port + 1 + i.
    pub fn listen_on(&mut self, address: &str) {
        self.listen = address.to_owned();
    }

    /// Starts the daemon and waits until it serves (at most `START_TIMEOUT`).
    pub fn spawn(&mut self) {
        self.launch();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.poll_ready() {
                Ok(true) => return,
                Ok(false) => {}
                Err(status) => panic!("ringpostd exited with {status} while starting; log:\n{}", self.log()),
            }
            assert!(
                Instant::now() < deadline,
                "ringpostd did not start in {START_TIMEOUT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the daemon's process and returns at once; `poll_ready` says when it serves.
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "the daemon runs already");
        let ready = self.directory.join("ready");
        let _ = std::fs::remove_file(&ready);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).unwrap();
        let mut command = Command::new(&self.program);
        for data_dir in &self.data_dirs {
            command.arg("--data-dir").arg(data_dir);
        }
        // Two forwarder shards unless the test chose its own count.
        if !self.extra_args.iter().any(|arg| arg == "--shards") {
            command.arg("--shards").arg("2");
        }
        // No gRPC API unless the test asks for it: tests run beside each other, and its
        // default port is one fixed port. Once started on a free port, it keeps that port.
        let mut args = self.extra_args.clone();
        match args.iter().position(|arg| arg == "--grpc-listen") {
            None => args.extend(["--grpc-listen".to_owned(), "off".to_owned()]),
            Some(index) => {
                if let Some(address) = &self.grpc_address {
                    args[index + 1] = address.clone();
                }
            }
        }
        // No monitoring endpoint either, for the same reason, unless asked for.
        match args.iter().position(|arg| arg == "--http-listen") {
            None => args.extend(["--http-listen".to_owned(), "off".to_owned()]),
            Some(index) => {
                if let Some(address) = &self.http_address {
                    args[index + 1] = address.clone();
                }
            }
        }
        if let (Some(index), Some(address)) =
            (args.iter().position(|arg| arg == "--rest-listen"), &self.rest_address)
        {
            args[index + 1] = address.clone();
        }
        if let Some(limit) = self.open_files_max {
            limit_open_files(&mut command, limit);
        }
        let child = command
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .args(&args)
            .arg("--listen")
            .arg(&self.listen)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting ringpostd");
        self.child = Some(child);
        self.starts += 1;
    }

    /// Whether the daemon started by `launch` serves yet (its ready file is written; `address`
    /// is then set), or `Err` with its exit status if it exited.
    pub fn poll_ready(&mut self) -> Result<bool, std::process::ExitStatus> {
        if let Ok(contents) = std::fs::read_to_string(self.directory.join("ready")) {
            let mut lines = contents.lines();
            self.address = lines.next().unwrap_or_default().trim().to_owned();
            for line in lines {
                if let Some(grpc) = line.strip_prefix("grpc ") {
                    self.grpc_address = Some(grpc.trim().to_owned());
                }
                if let Some(http) = line.strip_prefix("http ") {
                    self.http_address = Some(http.trim().to_owned());
                }
                if let Some(rest) = line.strip_prefix("rest ") {
                    self.rest_address = Some(rest.trim().to_owned());
                }
            }
            return Ok(true);
        }
        let child = self.child.as_mut().expect("the daemon was launched");
        match child.try_wait().unwrap() {
            Some(status) => {
                self.child = None;
                Err(status)
            }
            None => Ok(false),
        }
    }

    /// The running daemon's process id (to stop and continue it, say).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
    }

    /// A field of the daemon's /proc status in KiB (`VmRSS`, `VmHWM`).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid().expect("the daemon runs")))
                .unwrap();
        let line = status.lines().find(|line| line.starts_with(field)).expect("the field is in /proc");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("the daemon runs");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    }

    /// Waits up to `limit` for the daemon to exit by itself; its status, or `None` if it still
    /// runs (it is left running). `restart` starts it again.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            let child = self.child.as_mut().expect("the daemon runs");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, then start again on the same data (the address changes, unless `listen_on` set
    /// it).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn client(&self) -> Client {
        block_on(Client::connect(&self.address)).expect("connecting to ringpostd")
    }

    /// Runs the `ringpost` CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_with_input(args, None)
    }

    pub fn cli_with_input(&self, args: &[&str], input: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new(binary("ringpost"))
            .arg("--server")
            .arg(&self.address)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ringpost");
        let mut stdin = child.stdin.take().unwrap();
        if let Some(input) = input {
            stdin.write_all(input.as_bytes()).unwrap();
        }
        drop(stdin);
        child.wait_with_output().unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn starts(&self) -> u32 {
        self.starts
    }
}

/// Linux's capability to raise resource limits past the hard limit.
const CAP_SYS_RESOURCE: nix::libc::c_ulong = 24;

/// Runs `command` with an open-file limit of `limit`, which it cannot raise: the daemon raises
/// its own limit as far as it may, and a root with CAP_SYS_RESOURCE may go past any hard
/// limit, so the capability is dropped from the child's bounding set (root's capabilities
/// after exec are that set; dropping it needs CAP_SETPCAP, and without that the child lacked
/// CAP_SYS_RESOURCE anyway, unless inherited).
fn limit_open_files(command: &mut Command, limit: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure makes two system calls and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            nix::libc::prctl(nix::libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0);
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, limit, limit)
                .map_err(std::io::Error::from)
        });
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.directory);
        } else {
            eprintln!("kept {} for inspection; daemon log:\n{}", self.directory.display(), self.log());
        }
    }
}

/// A field of one of the CLI's one-line JSON objects (a string's value unquoted).
pub fn json_field<'a>(line: &'a str, name: &str) -> &'a str {
    let key = format!("\"{name}\":");
    let start = line.find(&key).unwrap_or_else(|| panic!("no {name} in {line}")) + key.len();
    let rest = &line[start..];
    match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"').unwrap()],
        None => &rest[..rest.find([',', '}']).unwrap()],
    }
}

/// Standard output of a CLI run that must succeed.
pub fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "ringpost failed with {}: {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Standard error of a CLI run that must fail.
pub fn failed(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "ringpost succeeded but should have failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// Creates `topic` and a plain pull `subscription` on it with an ack deadline of
/// `ack_deadline_seconds`.
pub fn create_topic_and_subscription(
    client: &Client,
    topic: &str,
    subscription: &str,
    ack_deadline_seconds: u32,
) {
    block_on(client.create_topic(topic)).unwrap();
    create_subscription(client, subscription, topic, ack_deadline_seconds);
}

/// Creates a plain pull `subscription` on an existing `topic`.
pub fn create_subscription(client: &Client, subscription: &str, topic: &str, ack_deadline_seconds: u32) {
    block_on(client.create_subscription(Subscription {
        name: subscription.into(),
        topic: topic.into(),
        ack_deadline_seconds,
        ..Default::default()
    }))
    .unwrap();
}

/// `bytes` bytes (at least 8) whose every one depends on `sequence`, so a delivered payload
/// proves itself intact.
pub fn payload(sequence: u64, bytes: usize) -> Vec<u8> {
    let mut data = sequence.to_le_bytes().to_vec();
    data.extend((8..bytes as u64).map(|i| (sequence.wrapping_mul(131).wrapping_add(i) % 251) as u8));
    data
}

/// Pulls until the subscription has nothing more (acknowledging each pull if `acknowledge`);
/// returns each delivered id with its payload.
pub fn drain(client: &Client, subscription: &str, acknowledge: bool) -> HashMap<u64, Vec<u8>> {
    let mut delivered: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut empty_pulls = 0;
    while empty_pulls < 2 {
        let batch = block_on(client.pull(subscription, 1000, 500)).unwrap();
        if batch.is_empty() {
            empty_pulls += 1;
            continue;
        }
        empty_pulls = 0;
        let ack_ids: Vec<String> = batch.iter().map(|message| message.ack_id.clone()).collect();
        for message in batch {
            if let Some(earlier) = delivered.insert(message.message_id, message.data.clone()) {
                assert_eq!(
                    earlier, message.data,
                    "message {} redelivered with other bytes",
                    message.message_id
                );
            }
        }
        if acknowledge {
            let refused = block_on(client.acknowledge(subscription, ack_ids)).unwrap();
            assert!(refused.is_empty(), "acknowledgements refused: {:?}", &refused[..refused.len().min(3)]);
        }
    }
    delivered
}

/// A small deterministic generator for test randomness; tests print their seed.
pub struct Random(u64);

impl Random {
    pub fn from_time() -> Random {
        let seed = std::env::var("RINGPOST_TEST_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
        eprintln!("random seed {seed} (set RINGPOST_TEST_SEED to replay)");
        Random(seed)
    }
    /// A generator of its own for a thread of a test whose `from_time` generator chose `seed`.
    pub fn from_seed(seed: u64) -> Random {
        Random(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `[low, high)`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low)
    }
}

/// Runs `future` to completion unless `limit` passes first (`None`): a wait in a test that
/// must end whether or not the daemon answers.
pub fn within<F: std::future::Future>(limit: Duration, future: F) -> Option<F::Output> {
    use std::future::Future;
    let mut future = std::pin::pin!(future);
    let mut timeout = std::pin::pin!(ringpost_client::timer::sleep(limit));
    block_on(std::future::poll_fn(|context| {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(context) {
            return std::task::Poll::Ready(Some(output));
        }
        timeout.as_mut().poll(context).map(|_| None)
    }))
}

/// libfaketime's multi-threaded library, installed by `tests/clocks/setup.sh` when missing.
pub fn libfaketime() -> PathBuf {
    let find = || {
        std::fs::read_dir("/usr/lib").ok().and_then(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path().join("faketime/libfaketimeMT.so.1"))
                .find(|path| path.exists())
        })
    };
    if let Some(found) = find() {
        return found;
    }
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("clocks/setup.sh");
    let output = Command::new("bash").arg(&setup).output().expect("running tests/clocks/setup.sh");
    assert!(
        output.status.success(),
        "tests/clocks/setup.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    find().expect("tests/clocks/setup.sh left libfaketime missing")
}
