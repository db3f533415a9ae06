//! What the tests of authentication, permissions and TLS (T17) share: a folder of their own
//! for access files and certificates, tokens and their access-file lines, daemons started with
//! security flags (on loopback through the harness, on every address by hand), clients with a
//! `Security`, and raw frames for what the client library would never send.

use crate::connections::{connect, read_frame, statuses_in};
use ringpost_client::{block_on, Client, Error, ErrorCode, PoolSettings, Security};
use ringpost_tests::Daemon;
use ringpost_wire::frame::{decode_error, encode_frame, FrameHeader};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::AuthenticateRequest;
use ringpost_wire::{Command, Status};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

/// The deadline of every request a test client makes: a daemon that stops answering fails the
/// test instead of hanging it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a change of the access file may take to reach every connection: the design says
/// 2 s (each shard looks each second); the issue allows 5.
pub const RELOAD_WITHIN: Duration = Duration::from_secs(5);

/// A folder for one test's access file, certificates and keys; removed when the test passed.
pub struct Files {
    pub directory: PathBuf,
}

impl Files {
    pub fn new(label: &str) -> Files {
        Files { directory: ringpost_tests::temporary_directory(label) }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.directory.join(name)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
    }
}

/// A token, the principal it names, and its line for the access file.
#[derive(Clone, Debug)]
pub struct Token {
    pub principal: String,
    pub secret: String,
    pub line: String,
}

/// Lowercase hex of the SHA-256 of `text`, from coreutils' sha256sum (the tests crate has no
/// hash of its own, and this keeps the digest independent of the daemon's code).
pub fn sha256_hex(text: &str) -> String {
    let mut child = Process::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running sha256sum");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let digest = String::from_utf8(output.stdout).unwrap();
    let digest = digest.split_whitespace().next().unwrap().to_owned();
    assert_eq!(digest.len(), 64);
    digest
}

/// A fresh random token as the daemon's generator makes them: `rpt_` and 64 hex digits.
pub fn random_secret() -> String {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    format!("rpt_{}", bytes.iter().map(|byte| format!("{byte:02x}")).collect::<String>())
}

/// A new token for `principal`, valid until `expires` (RFC 3339) if given.
pub fn token_expiring(principal: &str, expires: Option<&str>) -> Token {
    let secret = random_secret();
    let mut line = format!("token {principal} sha256:{}", sha256_hex(&secret));
    if let Some(expires) = expires {
        line.push_str(&format!(" expires={expires}"));
    }
    Token { principal: principal.to_owned(), secret, line }
}

pub fn token(principal: &str) -> Token {
    token_expiring(principal, None)
}

/// The access file, rewritten as an operator would: a new file renamed over the old one.
pub struct AccessFile {
    pub path: PathBuf,
}

impl AccessFile {
    pub fn new(files: &Files, text: &str) -> AccessFile {
        let access = AccessFile { path: files.path("access") };
        access.replace(text);
        access
    }

    pub fn replace(&self, text: &str) {
        crate::test_ca::write_replacing(&self.path, text.as_bytes());
    }
}

/// An access file's text: the tokens' lines, then the grants.
pub fn access_text(tokens: &[&Token], grants: &[&str]) -> String {
    let mut text = String::from("# written by a test\n");
    for token in tokens {
        text.push_str(&token.line);
        text.push('\n');
    }
    for grant in grants {
        text.push_str("grant ");
        text.push_str(grant);
        text.push('\n');
    }
    text
}

/// Flags given as words.
pub fn flags(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| (*word).to_owned()).collect()
}

/// The daemon on loopback with `--auth required --access-file` and `more` flags.
pub fn daemon_requiring_auth(label: &str, access: &AccessFile, more: &[&str]) -> Daemon {
    let mut words = vec!["--auth".to_owned(), "required".to_owned(), "--access-file".to_owned()];
    words.push(access.path.display().to_string());
    words.extend(flags(more));
    Daemon::start_with(label, Vec::new(), words)
}

/// A client of `address` with `security`, or why not.
pub fn try_connect(address: &str, security: Security) -> Result<Client, Error> {
    block_on(Client::connect_with_security(address, PoolSettings::default(), REQUEST_TIMEOUT, security))
}

pub fn connect_with(address: &str, security: Security) -> Client {
    try_connect(address, security).unwrap_or_else(|error| panic!("connecting to {address}: {error}"))
}

/// A plaintext client of `daemon` presenting `token`.
pub fn client_with(daemon: &Daemon, token: &Token) -> Client {
    connect_with(&daemon.address, Security::default().with_token(token.secret.clone()))
}

/// A plaintext client of `daemon` without any credential.
pub fn anonymous_client(daemon: &Daemon) -> Client {
    connect_with(&daemon.address, Security::default())
}

/// The code a request failed with; panics if it succeeded.
pub fn refused<T: std::fmt::Debug>(result: Result<T, Error>) -> Error {
    match result {
        Ok(value) => panic!("expected a refusal, the request succeeded: {value:?}"),
        Err(error) => error,
    }
}

/// Asserts that `result` failed with `code`; returns the error's text.
pub fn assert_code<T: std::fmt::Debug>(result: Result<T, Error>, code: ErrorCode, what: &str) -> String {
    let error = refused(result);
    assert_eq!(error.code(), code, "{what}: {error}");
    error.to_string()
}

/// Connects with `security` and runs `request`: the outcome of both, for credentials that may be
/// refused at the connection (a failed Authenticate closes it) or at the first request.
pub fn connect_and<T>(
    address: &str,
    security: Security,
    request: impl FnOnce(&Client) -> Result<T, Error>,
) -> Result<T, Error> {
    let client = try_connect(address, security)?;
    request(&client)
}

/// An Authenticate frame presenting `token`.
pub fn authenticate_frame(token: &str, request_id: u64) -> ringpost_wire::FrameBuffer {
    encode_frame(Command::Authenticate.code(), 0, request_id, &AuthenticateRequest { token: token.into() })
}

/// A raw connection to `address` that authenticated with `token`; panics if it was refused.
pub fn authenticated_stream(address: &str, token: &str) -> TcpStream {
    let mut stream = connect(address);
    stream.write_all(&authenticate_frame(token, 1)).unwrap();
    let (header, body) = read_frame(&mut stream, REQUEST_TIMEOUT).expect("the Authenticate is answered");
    assert!(!header.is_error(), "Authenticate refused: {}", decode_error(&body));
    assert_eq!(header.request_id, 1);
    stream
}

/// Every frame `stream` receives until the server closes it (within `limit`): each request id
/// with its error, `None` for an answer that is not one.
pub fn frames_until_closed(stream: &mut TcpStream, limit: Duration) -> Vec<(u64, Option<Status>)> {
    let received = bytes_until_closed(stream, limit);
    let mut frames = Vec::new();
    let mut bytes = &received[..];
    while bytes.len() >= FRAME_HEADER_BYTES {
        let header =
            FrameHeader::decode(&bytes[..FRAME_HEADER_BYTES]).expect("the server sends valid headers");
        let end = FRAME_HEADER_BYTES + header.body_length as usize;
        if bytes.len() < end {
            break;
        }
        let status = header.is_error().then(|| statuses_in(&bytes[..end]).remove(0));
        frames.push((header.request_id, status));
        bytes = &bytes[end..];
    }
    frames
}

/// Every byte `stream` receives until the server closes it, within `limit`.
pub fn bytes_until_closed(stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let until = Instant::now() + limit;
    let mut received = Vec::new();
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    loop {
        let mut buffer = [0u8; 4096];
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => received.extend_from_slice(&buffer[..count]),
            Err(error)
                if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                assert!(Instant::now() < until, "the server did not close the connection within {limit:?}");
            }
            Err(_) => break,
        }
    }
    received
}

/// A `ringpostd` the test starts itself, for a listen address the harness does not give
/// (it always listens on 127.0.0.1). Killed and its folder removed when dropped.
pub struct OwnDaemon {
    child: Child,
    /// The router's address as a client on this machine reaches it.
    pub address: String,
    directory: PathBuf,
    log_path: PathBuf,
}

impl OwnDaemon {
    /// Starts `ringpostd --listen <listen>` with `more` flags; `listen`'s host is replaced by
    /// 127.0.0.1 in `address` (a daemon on 0.0.0.0 is reachable there).
    pub fn start(label: &str, listen: &str, more: &[String]) -> OwnDaemon {
        let directory = ringpost_tests::temporary_directory(label);
        let ready = directory.join("ready");
        let log_path = directory.join("ringpostd.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Process::new(ringpost_tests::binary("ringpostd"))
            .arg("--data-dir")
            .arg(directory.join("data"))
            .args([
                "--shards",
                "2",
                "--grpc-listen",
                "off",
                "--http-listen",
                "off",
                "--listen",
                listen,
                "--ready-file",
            ])
            .arg(&ready)
            .args(more)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting ringpostd");
        let mut daemon = OwnDaemon { child, address: String::new(), directory, log_path };
        let until = Instant::now() + ringpost_tests::START_TIMEOUT;
        loop {
            if let Ok(address) = std::fs::read_to_string(&ready) {
                let port = address.trim().rsplit_once(':').unwrap().1.to_owned();
                daemon.address = format!("127.0.0.1:{port}");
                return daemon;
            }
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("ringpostd exited with {status} while starting; log:\n{}", daemon.log());
            }
            assert!(Instant::now() < until, "ringpostd did not start; log:\n{}", daemon.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for OwnDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.directory);
        } else {
            eprintln!("kept {}; daemon log:\n{}", self.directory.display(), self.log());
        }
    }
}

/// Waits up to `limit` for `attempt` to succeed; how long it took, or the last error.
pub fn eventually<T>(
    limit: Duration,
    mut attempt: impl FnMut() -> Result<T, Error>,
) -> Result<(T, Duration), Error> {
    let started = Instant::now();
    loop {
        match attempt() {
            Ok(value) => return Ok((value, started.elapsed())),
            Err(error) if started.elapsed() >= limit => return Err(error),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The path as a flag's value.
pub fn text(path: &Path) -> String {
    path.display().to_string()
}
