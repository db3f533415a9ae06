//! The HTTP client push subscriptions are delivered with, on a tokio thread of its own.
//!
//! Why there and not on the shards: a push is network I/O with TLS, connection pooling and
//! HTTP/2, which hyper-util's pooled client does well on tokio and which glommio has no client
//! for; the shards' cores stay with the logs and the native protocol, as the gRPC API and the
//! monitoring endpoint leave them (`net/http` runs the same way). The shards reach the thread
//! only through a bounded `tokio::sync` channel (which needs no executor on the sending side)
//! and hear back on a oneshot per request. Measured with `ringpost-bench push` (benches/README.md,
//! the thirty-third session): this thread takes the largest share of a push's CPU, more than the
//! shard's part, which on the shard would come out of the core that serves the topic.
//!
//! The client keeps connections alive between pushes (a pool per endpoint), speaks HTTP/2
//! where an HTTPS endpoint offers it by ALPN, verifies HTTPS against the system's roots or
//! `--push-ca-file`, and sends at most `PUSH_CONNECTIONS_PER_ENDPOINT_MAX` requests to one
//! endpoint at a time (with HTTP/1.1, as many connections).

use super::{PushOutcome, PushRequest, Pusher, TokenSigner};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Requests in flight to one endpoint (its scheme, host and port) at once, all shards
/// together: with HTTP/1.1 each is a connection, and a receiver should not be opened more
/// connections by one daemon than a web server's usual per-client allowance.
pub const PUSH_CONNECTIONS_PER_ENDPOINT_MAX: usize = 64;
/// Pushes waiting to enter the client's thread: a shard whose push finds it full waits (the
/// push's own timeout still applies), so a stalled thread holds no more than this.
pub const PUSH_REQUESTS_QUEUED_MAX: usize = 4_096;
/// Bytes of a response's body the client reads (and drops) so that its connection can be used
/// again; a longer body closes the connection instead.
pub const PUSH_RESPONSE_BYTES_MAX: usize = 64 << 10;
/// How long the client waits for the rest of a response's body once its status is known.
pub const PUSH_RESPONSE_BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle connection to an endpoint is kept for the next push.
pub const PUSH_CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Endpoints whose request counts the client keeps at once: each is dropped as soon as no
/// request to it is in flight, so this bounds only a flood of distinct endpoints, past which
/// a request waits for none (it is still bounded by its shard's window).
pub const PUSH_ENDPOINTS_TRACKED_MAX: usize = 10_000;

/// What the push client counted, for a scrape: pushes by how they ended, and how long they
/// took. The client's thread counts (it is not a shard: shards count their own), and the
/// monitoring endpoint reads a copy, as it reads the gRPC API's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushFigures {
    /// By class: `1xx` to `5xx` (the status's hundreds), `connection_error` and `timeout`.
    pub requests: Vec<(&'static str, u64)>,
    /// From the request's arrival on the client's thread to its outcome.
    pub latency: crate::metrics::histogram::DurationHistogram,
}

/// The classes `PushFigures::requests` counts, in order.
pub const PUSH_OUTCOME_CLASSES: [&str; 7] =
    ["1xx", "2xx", "3xx", "4xx", "5xx", "connection_error", "timeout"];

static FIGURES: std::sync::LazyLock<Mutex<PushFigures>> = std::sync::LazyLock::new(|| {
    Mutex::new(PushFigures {
        requests: PUSH_OUTCOME_CLASSES.iter().map(|class| (*class, 0)).collect(),
        ..Default::default()
    })
});

/// `outcome`'s place in `PUSH_OUTCOME_CLASSES`.
pub fn outcome_class(outcome: &PushOutcome) -> usize {
    match outcome {
        PushOutcome::Status(status) => (*status as usize / 100).clamp(1, 5) - 1,
        PushOutcome::ConnectionError(_) => 5,
        PushOutcome::Timeout => 6,
    }
}

fn record(outcome: &PushOutcome, took: Duration) {
    let mut figures = FIGURES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    figures.requests[outcome_class(outcome)].1 += 1;
    figures.latency.record(took);
}

/// A copy of what the push client counted since the process started.
pub fn snapshot() -> PushFigures {
    FIGURES.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

struct Job {
    request: PushRequest,
    reply: oneshot::Sender<PushOutcome>,
}

/// The client's thread, running; dropping every `PushSender` (the shards' ends) ends it.
pub struct PushClient {
    sender: mpsc::Sender<Job>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A shard's end of the client: `Send`, cloned once per shard, a `Pusher` there.
#[derive(Clone)]
pub struct PushSender {
    sender: mpsc::Sender<Job>,
}

impl PushClient {
    /// Starts the client's thread; `tls` verifies HTTPS endpoints, `signer` makes the tokens
    /// of pushes with `oidc_token` (without one, such a push fails and says why).
    pub fn start(
        tls: rustls::ClientConfig,
        signer: Option<Arc<dyn TokenSigner>>,
    ) -> std::io::Result<PushClient> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let (sender, receiver) = mpsc::channel(PUSH_REQUESTS_QUEUED_MAX);
        let thread = std::thread::Builder::new().name("ringpost-push".to_owned()).spawn(move || {
            runtime.block_on(serve(receiver, tls, signer));
        })?;
        Ok(PushClient { sender, thread: Some(thread) })
    }

    pub fn sender(&self) -> PushSender {
        PushSender { sender: self.sender.clone() }
    }

    /// Waits for the thread to end, once every shard's end is gone (the shards stopped).
    pub fn stop(mut self) {
        drop(self.sender);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Pusher for PushSender {
    async fn push(&self, request: PushRequest) -> PushOutcome {
        let (reply, answer) = oneshot::channel();
        if self.sender.send(Job { request, reply }).await.is_err() {
            return PushOutcome::ConnectionError("the push client stopped".into());
        }
        answer.await.unwrap_or_else(|_| PushOutcome::ConnectionError("the push client stopped".into()))
    }
}

type HttpsClient =
    Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>>;

/// Requests in flight per endpoint, as semaphores dropped when idle.
#[derive(Default)]
struct Endpoints {
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Endpoints {
    fn slots(&self, endpoint: &str) -> Option<Arc<Semaphore>> {
        let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(semaphore) = slots.get(endpoint) {
            return Some(semaphore.clone());
        }
        if slots.len() >= PUSH_ENDPOINTS_TRACKED_MAX {
            return None;
        }
        let semaphore = Arc::new(Semaphore::new(PUSH_CONNECTIONS_PER_ENDPOINT_MAX));
        slots.insert(endpoint.to_owned(), semaphore.clone());
        Some(semaphore)
    }

    /// Forgets `endpoint`'s count if nothing else holds it.
    fn release(&self, endpoint: &str, semaphore: Arc<Semaphore>) {
        let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The map's and this one: nobody else waits or sends.
        if Arc::strong_count(&semaphore) == 2 {
            slots.remove(endpoint);
        }
    }
}

async fn serve(
    mut jobs: mpsc::Receiver<Job>,
    tls: rustls::ClientConfig,
    signer: Option<Arc<dyn TokenSigner>>,
) {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build();
    let client: HttpsClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(PUSH_CONNECTION_IDLE_TIMEOUT)
        .pool_max_idle_per_host(PUSH_CONNECTIONS_PER_ENDPOINT_MAX)
        .build(connector);
    let endpoints = Arc::new(Endpoints::default());
    while let Some(job) = jobs.recv().await {
        let (client, endpoints, signer) = (client.clone(), endpoints.clone(), signer.clone());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let outcome = send(&client, &endpoints, signer.as_deref(), job.request).await;
            record(&outcome, started.elapsed());
            let _ = job.reply.send(outcome);
        });
    }
}

/// The endpoint's key for its request count: its scheme and authority.
fn endpoint_key(uri: &http::Uri) -> String {
    format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map_or("", |authority| authority.as_str())
    )
}

async fn send(
    client: &HttpsClient,
    endpoints: &Endpoints,
    signer: Option<&dyn TokenSigner>,
    request: PushRequest,
) -> PushOutcome {
    let uri: http::Uri = match request.endpoint.parse() {
        Ok(uri) => uri,
        Err(error) => {
            return PushOutcome::ConnectionError(format!("endpoint '{}': {error}", request.endpoint))
        }
    };
    let mut builder =
        http::Request::post(uri.clone()).header(http::header::CONTENT_TYPE, request.body.content_type);
    for (name, value) in &request.body.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if let Some(token) = &request.oidc_token {
        let Some(signer) = signer else {
            return PushOutcome::ConnectionError("no key to sign the push's OIDC token with".into());
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        match signer.sign(token, &request.endpoint, now.as_secs()) {
            Ok(jwt) => builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {jwt}")),
            Err(error) => return PushOutcome::ConnectionError(format!("signing the OIDC token: {error}")),
        }
    }
    let http_request = match builder.body(Full::new(Bytes::from(request.body.body))) {
        Ok(http_request) => http_request,
        Err(error) => return PushOutcome::ConnectionError(format!("building the request: {error}")),
    };
    let key = endpoint_key(&uri);
    let slots = endpoints.slots(&key);
    // The timeout covers the wait for a slot, the connection and the answer's head: an
    // endpoint that has not answered by the ack deadline has not acknowledged.
    let answered = tokio::time::timeout(request.timeout, async {
        let _permit = match &slots {
            Some(semaphore) => Some(semaphore.clone().acquire_owned().await.expect("never closed")),
            None => None,
        };
        let response = client.request(http_request).await?;
        let status = response.status().as_u16();
        // The body is read (up to a bound, for a while) before the slot is given back, so
        // that the connection returns to the pool for the next push instead of being closed.
        let body = Limited::new(response.into_body(), PUSH_RESPONSE_BYTES_MAX);
        let _ = tokio::time::timeout(PUSH_RESPONSE_BODY_TIMEOUT, body.collect()).await;
        Ok::<u16, hyper_util::client::legacy::Error>(status)
    })
    .await;
    if let Some(semaphore) = slots {
        endpoints.release(&key, semaphore);
    }
    match answered {
        Err(_) => PushOutcome::Timeout,
        Ok(Ok(status)) => PushOutcome::Status(status),
        Ok(Err(error)) => PushOutcome::ConnectionError(describe(&error)),
    }
}

/// A client error with its causes, for the operator ("connection refused" is a cause).
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::OidcToken;
    use crate::push::PushBody;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc as std_mpsc;

    /// A request as the test receiver read it.
    #[derive(Debug)]
    struct Seen {
        head: Vec<String>,
        body: Vec<u8>,
        connection: usize,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<&str> {
            self.head.iter().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.eq_ignore_ascii_case(name).then(|| value.trim())
            })
        }
    }

    /// Serves HTTP/1.1 on one connection: answers each request with the next of `statuses`
    /// (after `delay`), keeping the connection open.
    fn serve_connection(
        stream: impl Read + Write,
        connection: usize,
        statuses: &std::sync::Mutex<std::vec::IntoIter<u16>>,
        delay: Duration,
        seen: &std_mpsc::Sender<Seen>,
    ) {
        let mut reader = BufReader::new(stream);
        loop {
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let line = line.trim_end().to_owned();
                if line.is_empty() {
                    break;
                }
                head.push(line);
            }
            let length: usize = head
                .iter()
                .find_map(|line| {
                    line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                })
                .map_or(0, |value| value.parse().unwrap());
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let _ = seen.send(Seen { head, body, connection });
            std::thread::sleep(delay);
            let status = statuses.lock().unwrap().next().unwrap_or(200);
            let answer = format!("HTTP/1.1 {status} Whatever\r\ncontent-length: 2\r\n\r\nok");
            if reader.get_mut().write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    }

    /// A receiver on a free port answering `statuses` in order; returns its port and what it saw.
    fn receiver(statuses: Vec<u16>, delay: Duration) -> (u16, std_mpsc::Receiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (seen, seen_receiver) = std_mpsc::channel();
        let statuses = Arc::new(std::sync::Mutex::new(statuses.into_iter()));
        std::thread::spawn(move || {
            for (connection, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { return };
                let (statuses, seen) = (statuses.clone(), seen.clone());
                std::thread::spawn(move || serve_connection(stream, connection, &statuses, delay, &seen));
            }
        });
        (port, seen_receiver)
    }

    fn request(endpoint: String, timeout: Duration) -> PushRequest {
        PushRequest {
            endpoint,
            body: PushBody {
                content_type: "application/json",
                headers: vec![("x-goog-pubsub-message-id".into(), "7".into())],
                body: b"{\"message\":{}}".to_vec(),
            },
            timeout,
            oidc_token: None,
        }
    }

    fn client(signer: Option<Arc<dyn TokenSigner>>) -> PushClient {
        PushClient::start(crate::net::tls::push_client_config(None).unwrap(), signer).unwrap()
    }

    #[test]
    fn statuses_are_answered_on_one_kept_alive_connection() {
        let (port, seen) = receiver(vec![200, 500, 204, 400], Duration::ZERO);
        let client = client(None);
        let pusher = client.sender();
        let endpoint = format!("http://127.0.0.1:{port}/push?token=1");
        let outcomes: Vec<PushOutcome> = (0..4)
            .map(|_| {
                futures_lite::future::block_on(
                    pusher.push(request(endpoint.clone(), Duration::from_secs(10))),
                )
            })
            .collect();
        assert_eq!(
            outcomes,
            [
                PushOutcome::Status(200),
                PushOutcome::Status(500),
                PushOutcome::Status(204),
                PushOutcome::Status(400)
            ]
        );
        let seen: Vec<Seen> = seen.try_iter().collect();
        assert_eq!(seen.len(), 4);
        for request in &seen {
            assert_eq!(request.head[0], "POST /push?token=1 HTTP/1.1");
            assert_eq!(request.header("content-type"), Some("application/json"));
            assert_eq!(request.header("x-goog-pubsub-message-id"), Some("7"));
            assert_eq!(request.header("authorization"), None);
            assert_eq!(request.body, b"{\"message\":{}}");
        }
        // Kept alive: connections are reused. (Not exactly one: the pool takes a connection
        // back just after its answer, which a push sent at once may beat.)
        let mut connections: Vec<usize> = seen.iter().map(|request| request.connection).collect();
        connections.dedup();
        assert!(connections.len() <= 2, "{connections:?}");
        assert!(outcomes[0].acknowledges() && !outcomes[1].acknowledges() && outcomes[2].acknowledges());
    }

    #[test]
    fn outcomes_are_counted_by_class() {
        let classes: Vec<&str> = [
            PushOutcome::Status(102),
            PushOutcome::Status(204),
            PushOutcome::Status(301),
            PushOutcome::Status(429),
            PushOutcome::Status(503),
            PushOutcome::ConnectionError(String::new()),
            PushOutcome::Timeout,
        ]
        .iter()
        .map(|outcome| PUSH_OUTCOME_CLASSES[outcome_class(outcome)])
        .collect();
        assert_eq!(classes, PUSH_OUTCOME_CLASSES);
        let before = snapshot();
        record(&PushOutcome::Status(500), Duration::from_millis(3));
        let after = snapshot();
        assert!(after.requests[4].1 > before.requests[4].1);
        assert!(after.latency.count() > before.latency.count());
    }

    #[test]
    fn a_refused_connection_and_a_silent_receiver_are_not_acknowledgements() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let client = client(None);
        let pusher = client.sender();
        let refused = futures_lite::future::block_on(
            pusher.push(request(format!("http://127.0.0.1:{port}/"), Duration::from_secs(10))),
        );
        match &refused {
            PushOutcome::ConnectionError(reason) => assert!(reason.contains("refused"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let (port, _seen) = receiver(vec![200], Duration::from_secs(5));
        let started = std::time::Instant::now();
        let silent = futures_lite::future::block_on(
            pusher.push(request(format!("http://127.0.0.1:{port}/"), Duration::from_millis(300))),
        );
        assert_eq!(silent, PushOutcome::Timeout);
        assert!(started.elapsed() < Duration::from_secs(4), "timed out at its deadline, not the answer");
        let bad =
            futures_lite::future::block_on(pusher.push(request("not a url".into(), Duration::from_secs(1))));
        assert!(matches!(bad, PushOutcome::ConnectionError(_)), "{bad:?}");
    }

    struct TestSigner;

    impl TokenSigner for TestSigner {
        fn sign(&self, token: &OidcToken, endpoint: &str, _issued_at_seconds: u64) -> Result<String, String> {
            let audience = if token.audience.is_empty() { endpoint } else { &token.audience };
            Ok(format!("jwt-for-{}-at-{audience}", token.service_account_email))
        }
    }

    #[test]
    fn a_push_with_an_oidc_token_carries_the_signers_jwt() {
        let (port, seen) = receiver(vec![200], Duration::ZERO);
        let endpoint = format!("http://127.0.0.1:{port}/");
        let mut with_token = request(endpoint.clone(), Duration::from_secs(10));
        with_token.oidc_token =
            Some(OidcToken { service_account_email: "pusher@p".into(), audience: String::new() });
        let client = client(Some(Arc::new(TestSigner)));
        let outcome = futures_lite::future::block_on(client.sender().push(with_token.clone()));
        assert_eq!(outcome, PushOutcome::Status(200));
        let seen = seen.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            seen.header("authorization"),
            Some(format!("Bearer jwt-for-pusher@p-at-{endpoint}").as_str())
        );
        // Without a signer the push is not sent, and says why.
        let unsigned = client_without_signer_push(with_token);
        assert!(
            matches!(&unsigned, PushOutcome::ConnectionError(reason) if reason.contains("sign")),
            "{unsigned:?}"
        );
    }

    fn client_without_signer_push(request: PushRequest) -> PushOutcome {
        let client = client(None);
        futures_lite::future::block_on(client.sender().push(request))
    }

    /// A test CA's certificate (PEM) and a server's TLS configuration with a certificate for
    /// localhost and 127.0.0.1 it signed.
    fn test_ca_and_server() -> (String, rustls::ServerConfig) {
        let mut ca_params = rcgen::CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let server_params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![server.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
            )
            .unwrap();
        (ca.pem(), config)
    }

    /// Writes `pem` to a file of its own for `--push-ca-file`; returns its directory and path.
    fn ca_file(label: &str, pem: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let directory = std::env::temp_dir().join(format!("ringpost-push-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let file = directory.join("ca.pem");
        std::fs::write(&file, pem).unwrap();
        (directory, file)
    }

    #[test]
    fn https_endpoints_are_verified_against_the_ca_given() {
        // A CA, and a certificate for 127.0.0.1 and localhost it signed.
        let (ca_pem, config) = test_ca_and_server();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (seen, seen_receiver) = std_mpsc::channel();
        std::thread::spawn(move || {
            let statuses = std::sync::Mutex::new(vec![204, 204, 204].into_iter());
            for (connection, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { return };
                let tls = rustls::ServerConnection::new(config.clone()).unwrap();
                serve_connection(
                    rustls::StreamOwned::new(tls, stream),
                    connection,
                    &statuses,
                    Duration::ZERO,
                    &seen,
                );
            }
        });
        let (directory, ca_file) = ca_file("ca", &ca_pem);
        let endpoint = format!("https://localhost:{port}/secure");
        // Against the system's roots, the test CA's certificate is refused.
        let untrusted = futures_lite::future::block_on(
            client(None).sender().push(request(endpoint.clone(), Duration::from_secs(10))),
        );
        assert!(matches!(untrusted, PushOutcome::ConnectionError(_)), "{untrusted:?}");
        // Against the test CA, it is trusted.
        let trusted =
            PushClient::start(crate::net::tls::push_client_config(Some(&ca_file)).unwrap(), None).unwrap();
        let outcome =
            futures_lite::future::block_on(trusted.sender().push(request(endpoint, Duration::from_secs(10))));
        assert_eq!(outcome, PushOutcome::Status(204));
        let seen = seen_receiver.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(seen.head[0], "POST /secure HTTP/1.1");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    /// Each request an HTTPS receiver took: the number of the connection it came on, and its
    /// HTTP version.
    type Versions = Arc<Mutex<Vec<(usize, http::Version)>>>;

    /// An HTTPS receiver offering `h2` and `http/1.1` by ALPN, as hyper serves either: it
    /// answers 204 and records, for each request, the connection it came on and its version.
    fn h2_receiver(config: rustls::ServerConfig) -> (u16, Versions) {
        let mut config = config;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                for connection in 0.. {
                    let Ok((stream, _)) = listener.accept().await else { return };
                    let (acceptor, recorded) = (acceptor.clone(), recorded.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(stream).await else { return };
                        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                        let service = hyper::service::service_fn(
                            move |request: http::Request<hyper::body::Incoming>| {
                                recorded.lock().unwrap().push((connection, request.version()));
                                let mut response = http::Response::new(Full::new(Bytes::new()));
                                *response.status_mut() = http::StatusCode::NO_CONTENT;
                                async move { Ok::<_, std::convert::Infallible>(response) }
                            },
                        );
                        let io = hyper_util::rt::TokioIo::new(tls);
                        if h2 {
                            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(io, service)
                                .await;
                        } else {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service)
                                .await;
                        }
                    });
                }
            });
        });
        (port, seen)
    }

    /// An endpoint offering HTTP/2 gets it: every push arrives over HTTP/2, and pushes sent at
    /// once share the one connection (over HTTP/1.1 each would take a connection of its own).
    #[test]
    fn pushes_arrive_over_http2_on_one_connection_where_the_endpoint_offers_it() {
        let (ca_pem, config) = test_ca_and_server();
        let (port, seen) = h2_receiver(config);
        let (directory, ca_file) = ca_file("h2", &ca_pem);
        let client =
            PushClient::start(crate::net::tls::push_client_config(Some(&ca_file)).unwrap(), None).unwrap();
        let pusher = client.sender();
        let endpoint = format!("https://localhost:{port}/h2");
        let first =
            futures_lite::future::block_on(pusher.push(request(endpoint.clone(), Duration::from_secs(10))));
        assert_eq!(first, PushOutcome::Status(204));
        // Eight at once, on the connection the first one opened.
        let outcomes: Vec<PushOutcome> = std::thread::scope(|scope| {
            let pushes: Vec<_> = (0..8)
                .map(|_| {
                    let (pusher, endpoint) = (pusher.clone(), endpoint.clone());
                    scope.spawn(move || {
                        futures_lite::future::block_on(
                            pusher.push(request(endpoint, Duration::from_secs(10))),
                        )
                    })
                })
                .collect();
            pushes.into_iter().map(|push| push.join().unwrap()).collect()
        });
        assert!(outcomes.iter().all(|outcome| *outcome == PushOutcome::Status(204)), "{outcomes:?}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 9, "{seen:?}");
        assert!(seen.iter().all(|(_, version)| *version == http::Version::HTTP_2), "{seen:?}");
        let mut connections: Vec<usize> = seen.iter().map(|(connection, _)| *connection).collect();
        connections.dedup();
        assert_eq!(connections.len(), 1, "one connection carried them all: {seen:?}");
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
