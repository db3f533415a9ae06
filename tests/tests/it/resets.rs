//! Connections whose peer is gone give back everything they held (T15). A client that crashes,
//! or is killed, resets its connections while requests it pipelined are running, queued or
//! being written; the daemon must then release the connection's slot, its descriptor, its
//! requests' permits and their share of the shard's response budget, end its waiting pulls and
//! streams, and still stop cleanly on SIGTERM. Every kind of request is pipelined before the
//! reset, on the router's port and a forwarder's, with authentication off and with a token;
//! the same for gRPC calls cut mid-way. Sizes are for CI: `RINGPOST_RESET_CONNECTIONS` raises
//! the connections per port (the figure is 200).

use crate::connections::{connect, forwarders, raise_open_files};
use crate::security::{access_text, authenticate_frame, token, AccessFile, Files};
use ringpost_client::{block_on, Client, Message, StreamSettings};
use ringpost_tests::grpc::{pubsub, subscription_path, topic_path, Grpc};
use ringpost_tests::scrape::{http_get, Scrape};
use ringpost_tests::{create_subscription, Daemon};
use ringpost_wire::frame::encode_frame;
use ringpost_wire::messages::{
    AcknowledgeRequest, Empty, ModifyAckDeadlineRequest, NameRequest, PublishRequest, PubsubMessage,
    PullRequest, StreamingPullRequest,
};
use ringpost_wire::Command;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long the daemon may take to release what reset connections held. Far below the waits
/// the pipelined requests asked for (`QUIET_PULL_WAIT_MS`), so a pull that holds its connection
/// until its wait ends fails the test; far above what a working daemon needs (milliseconds).
const RELEASE_WITHIN: Duration = Duration::from_secs(10);
/// The wait of the unary pulls pipelined on a subscription with nothing to deliver: the
/// protocol's largest.
const QUIET_PULL_WAIT_MS: u32 = 60_000;
/// How long SIGTERM may take to stop the daemon (its own bound on a stop is 10 s).
const EXIT_WITHIN: Duration = Duration::from_secs(20);
/// Descriptors the daemon may open or close meanwhile for reasons of its own (a log segment).
const DESCRIPTOR_SLACK: usize = 4;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Closes `stream` with a reset rather than a FIN (SO_LINGER 0), as the kernel does for a
/// process that dies with bytes unread.
pub(crate) fn reset(stream: TcpStream) {
    let linger = nix::libc::linger { l_onoff: 1, l_linger: 0 };
    nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &linger).unwrap();
    drop(stream);
}

/// Descriptors the daemon has open.
fn descriptors(daemon: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", daemon.pid().unwrap())).unwrap().count()
}

/// The daemon's figures from its monitoring endpoint.
fn scrape(daemon: &Daemon) -> Scrape {
    let (status, body) = http_get(daemon.http_address.as_ref().expect("--http-listen"), "/metrics");
    assert_eq!(status, 200, "{body}");
    Scrape::parse(&body)
}

/// Connections of `protocol` open, over every shard (`ringpost_connections`).
pub(crate) fn connections(daemon: &Daemon, protocol: &str) -> f64 {
    scrape(daemon)
        .samples
        .iter()
        .filter(|sample| sample.name == "ringpost_connections")
        .filter(|sample| sample.labels.get("protocol").map(String::as_str) == Some(protocol))
        .map(|sample| sample.value)
        .sum()
}

/// Waits up to `RELEASE_WITHIN` for the daemon to hold no connection of `protocol` and at most
/// `descriptors_before` (plus slack) descriptors; panics naming what stayed.
fn released(daemon: &Daemon, protocol: &str, descriptors_before: usize, what: &str) {
    let until = Instant::now() + RELEASE_WITHIN;
    loop {
        let open = connections(daemon, protocol);
        let held = descriptors(daemon);
        if open == 0.0 && held <= descriptors_before + DESCRIPTOR_SLACK {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: {RELEASE_WITHIN:?} after the resets the daemon still counts {open} {protocol} connections \
             and holds {held} descriptors ({descriptors_before} before)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The daemon once no native connection is open: its descriptors then.
fn quiet_descriptors(daemon: &Daemon) -> usize {
    let until = Instant::now() + RELEASE_WITHIN;
    while connections(daemon, "native") != 0.0 {
        assert!(Instant::now() < until, "the setup's connections did not close");
        std::thread::sleep(Duration::from_millis(50));
    }
    descriptors(daemon)
}

fn frame<T: ringpost_wire::frame::Body>(command: Command, request_id: u64, body: &T) -> Vec<u8> {
    encode_frame(command.code(), 0, request_id, body).to_vec()
}

/// Every control-plane request a client pipelines to the router before it crashes: lookups
/// by the hundred, then stats, then more lookups (the reproduction).
fn router_requests(token: Option<&str>) -> Vec<u8> {
    let mut bytes = token.map(|token| authenticate_frame(token, 1).to_vec()).unwrap_or_default();
    let mut request_id = 2;
    let mut next = || {
        request_id += 1;
        request_id
    };
    let get = NameRequest { name: "resets".into() };
    for _ in 0..300 {
        bytes.extend(frame(Command::GetTopic, next(), &get));
    }
    bytes.extend(frame(Command::Stats, next(), &Empty {}));
    for _ in 0..300 {
        bytes.extend(frame(Command::GetTopic, next(), &get));
    }
    bytes
}

/// Every data-plane request a client pipelines to a forwarder before it crashes: publishes,
/// a pull that waits on a subscription with nothing to deliver, a streaming pull on a backlog,
/// acknowledgements and deadline changes, a pull that gets messages, more publishes.
fn forwarder_requests(token: Option<&str>) -> Vec<u8> {
    let mut bytes = token.map(|token| authenticate_frame(token, 1).to_vec()).unwrap_or_default();
    let mut request_id = 2;
    let mut next = || {
        request_id += 1;
        request_id
    };
    let publish = PublishRequest {
        topic: "resets".into(),
        messages: vec![PubsubMessage { data: vec![7; 1000], ..Default::default() }],
    };
    for _ in 0..100 {
        bytes.extend(frame(Command::Publish, next(), &publish));
    }
    let quiet =
        PullRequest { subscription: "resets-quiet".into(), max_messages: 10, wait_ms: QUIET_PULL_WAIT_MS };
    bytes.extend(frame(Command::Pull, next(), &quiet));
    let stream = StreamingPullRequest {
        subscription: "resets-backlog".into(),
        stream_ack_deadline_seconds: 10,
        max_outstanding_messages: 0,
        max_outstanding_bytes: 0,
    };
    bytes.extend(frame(Command::StreamingPull, next(), &stream));
    let ack_ids = vec!["1-2-3".to_owned(), "not an ack id".to_owned()];
    let acknowledge = AcknowledgeRequest { subscription: "resets-backlog".into(), ack_ids: ack_ids.clone() };
    bytes.extend(frame(Command::Acknowledge, next(), &acknowledge));
    let modify =
        ModifyAckDeadlineRequest { subscription: "resets-backlog".into(), ack_ids, ack_deadline_seconds: 60 };
    bytes.extend(frame(Command::ModifyAckDeadline, next(), &modify));
    let pull = PullRequest { subscription: "resets-backlog".into(), max_messages: 100, wait_ms: 0 };
    for _ in 0..20 {
        bytes.extend(frame(Command::Pull, next(), &pull));
    }
    bytes.extend(frame(Command::Pull, next(), &quiet));
    for _ in 0..100 {
        bytes.extend(frame(Command::Publish, next(), &publish));
    }
    bytes
}

/// `count` connections to `address`, each sending `requests` and reset at once after, some
/// before anything is answered, some while answers are written.
fn reset_after(address: &str, requests: &[u8], count: usize) {
    let streams: Vec<TcpStream> = (0..count)
        .map(|index| {
            let mut stream = connect(address);
            stream.write_all(requests).unwrap();
            if index % 2 == 1 {
                // Let the daemon start answering before the reset: writes then fail mid-way.
                std::thread::sleep(Duration::from_millis(5));
            }
            stream
        })
        .collect();
    streams.into_iter().for_each(reset);
}

/// A daemon of one forwarder shard (so that every topic shares the connections' shard) with
/// its monitoring endpoint; `more` adds flags.
fn start(label: &str, more: Vec<String>) -> Daemon {
    let mut flags = vec!["--shards", "1", "--http-listen", "127.0.0.1:0"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    flags.extend(more);
    Daemon::start_with(label, Vec::new(), flags)
}

/// Messages of the backlog the pipelined streams and pulls lease.
const BACKLOG_MESSAGES: usize = 200;

/// The topics and subscriptions the pipelined requests name, and a backlog.
fn prepare(client: &Client) {
    block_on(client.create_topic("resets")).unwrap();
    block_on(client.create_topic("resets-silent")).unwrap();
    create_subscription(client, "resets-backlog", "resets", 10);
    create_subscription(client, "resets-quiet", "resets-silent", 10);
    create_subscription(client, "resets-after", "resets", 10);
    let messages: Vec<Message> =
        (0..BACKLOG_MESSAGES).map(|index| Message::new(format!("backlog {index}"))).collect();
    block_on(client.publish("resets", messages)).unwrap();
}

/// After the resets: a new client is served, a stream with a window of 20 MB on
/// `resets-after` (a subscription of `resets` that nothing pulled) gets its messages (the
/// shard's response budget is whole), and SIGTERM stops the daemon cleanly.
fn still_whole(mut daemon: Daemon, client: Client) {
    block_on(client.publish("resets", vec![Message::new("after the resets")])).unwrap();
    let settings = StreamSettings { max_outstanding_bytes: 20 << 20, ..StreamSettings::default() };
    let mut stream = block_on(client.streaming_pull("resets-after", settings)).unwrap();
    let delivered = ringpost_tests::within(RELEASE_WITHIN, stream.next())
        .expect("a stream with a large window got nothing: the shard's response budget is held");
    assert!(!delivered.unwrap().unwrap().is_empty());
    drop(stream);
    drop(client);
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_for_exit(EXIT_WITHIN).expect("ringpostd stopped after SIGTERM");
    let log = daemon.log();
    assert!(status.success(), "ringpostd exited with {status}; log:\n{log}");
    assert!(!log.contains("stopping by force"), "{log}");
}

/// A client of `daemon`, presenting `token` if there is one.
fn client_for(daemon: &Daemon, token: Option<&str>) -> Client {
    let security = ringpost_client::Security::default();
    let security = match token {
        Some(token) => security.with_token(token.to_owned()),
        None => security,
    };
    crate::security::connect_with(&daemon.address, security)
}

/// Reset connections on the router's port and a forwarder's, pipelining every kind of request.
fn resets_release_everything(label: &str, token: Option<&str>, more: Vec<String>) {
    raise_open_files();
    let daemon = start(label, more);
    let client = client_for(&daemon, token);
    prepare(&client);
    drop(client);
    let before = quiet_descriptors(&daemon);
    let count = env_count("RINGPOST_RESET_CONNECTIONS", 40);
    let forwarder = forwarders(&daemon)[0].clone();
    let started = Instant::now();
    reset_after(&daemon.address, &router_requests(token), count);
    reset_after(&forwarder, &forwarder_requests(token), count);
    released(&daemon, "native", before, label);
    println!(
        "{label}: {count} connections reset on each port, everything released {:?} after the first",
        started.elapsed()
    );
    let client = client_for(&daemon, token);
    still_whole(daemon, client);
}

#[test]
fn native_connections_reset_mid_request_release_everything() {
    resets_release_everything("resets", None, Vec::new());
}

#[test]
fn native_connections_reset_mid_request_release_everything_under_required_auth() {
    let files = Files::new("resets-auth");
    let root = token("root");
    let access = AccessFile::new(&files, &access_text(&[&root], &["admin * root"]));
    let more = ["--auth", "required", "--access-file"].into_iter().map(String::from);
    let more = more.chain(std::iter::once(access.path.display().to_string())).collect();
    resets_release_everything("resets-auth", Some(&root.secret), more);
}

/// Bytes of each message of the budget test.
const LARGE_MESSAGE_BYTES: usize = 100_000;
/// Messages of the budget test's backlog: more than one pull response takes
/// (`PULL_RESPONSE_BYTES_MAX`, 12 MiB), so that a pull of them fills the socket.
const LARGE_MESSAGES: usize = 130;
/// Pulls of the budget test waiting for messages when their connection is reset, each on a
/// subscription of its own: the one publish after the reset (`LATER_MESSAGES`) gives each a
/// response of 9 MB, 117 MB of the shard's budget for responses (128 MiB) in all.
const WAITING_PULLS: usize = 13;
/// Messages of `LARGE_MESSAGE_BYTES` in the one publish after the reset (9 MB, under the
/// publish's 10 MB).
const LATER_MESSAGES: usize = 90;

/// Publishes `count` messages of `LARGE_MESSAGE_BYTES` to `topic`, `batch` a request.
fn publish_large(client: &Client, topic: &str, count: usize, batch: usize) {
    for first in (0..count).step_by(batch) {
        let messages = (first..count.min(first + batch))
            .map(|index| Message::new(vec![index as u8; LARGE_MESSAGE_BYTES]));
        block_on(client.publish(topic, messages.collect())).unwrap();
    }
}

/// A connection whose writer is stuck behind a large response nobody reads, with pulls waiting
/// for messages behind it, reset; then messages come for those pulls. Whatever the pulls would
/// answer must not keep the shard's budget for responses (`STREAM_RESERVED_BYTES_SHARD_MAX`): a
/// stream with a window of 20 MB is served on that shard afterwards. (The reproduction:
/// pipelined unread pulls of 100 kB messages, held, then closed.)
#[test]
fn reset_connections_give_the_response_budget_back() {
    raise_open_files();
    let daemon = start("resets-budget", Vec::new());
    let client = daemon.client();
    block_on(client.create_topic("resets")).unwrap();
    block_on(client.create_topic("resets-later")).unwrap();
    create_subscription(&client, "resets-backlog", "resets", 60);
    create_subscription(&client, "resets-after", "resets", 60);
    for index in 0..WAITING_PULLS {
        create_subscription(&client, &format!("resets-later-{index}"), "resets-later", 60);
    }
    publish_large(&client, "resets", LARGE_MESSAGES, 10);
    drop(client);
    let before = quiet_descriptors(&daemon);
    let forwarder = forwarders(&daemon)[0].clone();
    let mut stream = connect(&forwarder);
    let backlog = PullRequest { subscription: "resets-backlog".into(), max_messages: 1000, wait_ms: 0 };
    let mut requests = frame(Command::Pull, 1, &backlog);
    for index in 0..WAITING_PULLS {
        let subscription = format!("resets-later-{index}");
        let pull = PullRequest { subscription, max_messages: 1000, wait_ms: QUIET_PULL_WAIT_MS };
        requests.extend(frame(Command::Pull, index as u64 + 2, &pull));
    }
    stream.write_all(&requests).unwrap();
    // Held unread while the first pull's response fills the socket, then reset.
    std::thread::sleep(Duration::from_millis(500));
    reset(stream);
    let client = daemon.client();
    publish_large(&client, "resets-later", LATER_MESSAGES, LATER_MESSAGES);
    block_on(client.publish("resets", vec![Message::new("after the resets")])).unwrap();
    let settings = StreamSettings { max_outstanding_bytes: 20 << 20, ..StreamSettings::default() };
    let mut stream = block_on(client.streaming_pull("resets-after", settings)).unwrap();
    let delivered = ringpost_tests::within(RELEASE_WITHIN, stream.next())
        .expect("a stream with a window of 20 MB got nothing: the shard's response budget is held");
    assert!(!delivered.unwrap().unwrap().is_empty());
    drop(stream);
    drop(client);
    released(&daemon, "native", before, "pulls behind an unread response");
    let client = daemon.client();
    still_whole(daemon, client);
}

/// A gRPC request message on the wire: uncompressed, its length, its protobuf.
pub(crate) fn grpc_message(message: &impl prost::Message) -> bytes::Bytes {
    let encoded = message.encode_to_vec();
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&encoded);
    bytes.into()
}

/// What one cut gRPC connection holds open when it is reset: its calls' response futures and
/// request bodies, and a second descriptor of its socket to reset it by.
struct CutConnection {
    socket: TcpStream,
    _calls: Vec<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)>,
}

/// A raw HTTP/2 connection to the gRPC API with calls of every kind under way: a StreamingPull
/// on a backlog, a unary Pull waiting on a subscription with nothing to deliver, a Publish,
/// an Acknowledge and a ModifyAckDeadline, and (if `partial_publish`) a Publish whose 10 MB
/// message has only begun to arrive. None of their answers is read.
async fn grpc_calls_under_way(address: &str, partial_publish: bool) -> CutConnection {
    let socket = TcpStream::connect(address).unwrap();
    let kept = socket.try_clone().unwrap();
    socket.set_nonblocking(true).unwrap();
    let socket = tokio::net::TcpStream::from_std(socket).unwrap();
    let (client, connection) = h2::client::handshake(socket).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut calls = Vec::new();
    let mut call = |method: &str, message: Option<bytes::Bytes>, end: bool| {
        let request = http::Request::post(format!("http://{address}/google.pubsub.v1.{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        if let Some(message) = message {
            body.send_data(message, end).unwrap();
        }
        calls.push((response, body));
    };
    let stream = pubsub::StreamingPullRequest {
        subscription: subscription_path("resets-backlog"),
        stream_ack_deadline_seconds: 10,
        ..Default::default()
    };
    call("Subscriber/StreamingPull", Some(grpc_message(&stream)), false);
    #[allow(deprecated)]
    let quiet = pubsub::PullRequest {
        subscription: subscription_path("resets-quiet"),
        max_messages: 10,
        return_immediately: false,
    };
    call("Subscriber/Pull", Some(grpc_message(&quiet)), true);
    let publish = pubsub::PublishRequest {
        topic: topic_path("resets"),
        messages: vec![pubsub::PubsubMessage { data: vec![7; 1000].into(), ..Default::default() }],
    };
    call("Publisher/Publish", Some(grpc_message(&publish)), true);
    let ack_ids = vec!["not an ack id".to_owned()];
    let acknowledge = pubsub::AcknowledgeRequest {
        subscription: subscription_path("resets-backlog"),
        ack_ids: ack_ids.clone(),
    };
    call("Subscriber/Acknowledge", Some(grpc_message(&acknowledge)), true);
    let modify = pubsub::ModifyAckDeadlineRequest {
        subscription: subscription_path("resets-backlog"),
        ack_ids,
        ack_deadline_seconds: 60,
    };
    call("Subscriber/ModifyAckDeadline", Some(grpc_message(&modify)), true);
    if partial_publish {
        let mut start = vec![0u8];
        start.extend_from_slice(&PARTIAL_PUBLISH_BYTES.to_be_bytes());
        start.extend_from_slice(&[0u8; 1024]);
        call("Publisher/Publish", Some(start.into()), false);
    }
    CutConnection { socket: kept, _calls: calls }
}

/// The announced length of the gRPC publishes cut while they arrive: six of them fill most of
/// the gRPC API's budget for requests arriving (64 MiB), so that a 9 MB publish after them
/// is refused if the budget is not given back.
const PARTIAL_PUBLISH_BYTES: u32 = 10_000_000;
const PARTIAL_PUBLISHES: usize = 6;

/// A subscription's messages delivered and not acknowledged
/// (`ringpost_subscription_outstanding_messages`).
fn outstanding(daemon: &Daemon, subscription: &str) -> f64 {
    scrape(daemon)
        .value("ringpost_subscription_outstanding_messages", &[("subscription", subscription)])
        .unwrap_or(0.0)
}

/// A subscription's open streams (`ringpost_subscription_open_streams`).
fn open_streams(daemon: &Daemon, subscription: &str) -> f64 {
    scrape(daemon)
        .value("ringpost_subscription_open_streams", &[("subscription", subscription)])
        .unwrap_or(0.0)
}

/// gRPC connections reset with calls of every kind under way give back their connections, the
/// shard's jobs (each stream is one until it ends) and the budget for requests arriving; then
/// a large publish goes through, a stream is served, and SIGTERM stops the daemon cleanly.
#[test]
fn grpc_connections_reset_mid_call_release_everything() {
    raise_open_files();
    let daemon = start("resets-grpc", vec!["--grpc-listen".into(), "127.0.0.1:0".into()]);
    let client = daemon.client();
    prepare(&client);
    drop(client);
    let address = daemon.grpc_address.clone().expect("the gRPC API serves");
    let count = env_count("RINGPOST_RESET_CONNECTIONS", 40).max(PARTIAL_PUBLISHES);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let cut: Vec<CutConnection> = (0..count)
        .map(|index| runtime.block_on(grpc_calls_under_way(&address, index < PARTIAL_PUBLISHES)))
        .collect();
    // The streams leased the whole backlog before the resets (each stream is one of its
    // shard's jobs for as long as it is open).
    let until = Instant::now() + RELEASE_WITHIN;
    while outstanding(&daemon, "resets-backlog") < BACKLOG_MESSAGES as f64 {
        assert!(
            Instant::now() < until,
            "the streams leased {} of the backlog's {BACKLOG_MESSAGES} messages",
            outstanding(&daemon, "resets-backlog")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    for connection in &cut {
        let linger = nix::libc::linger { l_onoff: 1, l_linger: 0 };
        nix::sys::socket::setsockopt(&connection.socket, nix::sys::socket::sockopt::Linger, &linger).unwrap();
    }
    // The runtime's end drops every connection's socket (reset, lingering 0) and its calls.
    drop(cut);
    runtime.shutdown_background();
    let until = Instant::now() + RELEASE_WITHIN;
    loop {
        let (open, streams) = (connections(&daemon, "grpc"), open_streams(&daemon, "resets-backlog"));
        let leased = outstanding(&daemon, "resets-backlog");
        if open == 0.0 && streams == 0.0 && leased == 0.0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{RELEASE_WITHIN:?} after the resets the gRPC API still counts {open} connections, {streams} streams \
             holding {leased} messages"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("gRPC: {count} connections reset, everything released {:?} after", started.elapsed());
    let grpc = Grpc::connect(&address);
    let large = pubsub::PubsubMessage { data: vec![1; 9_000_000].into(), ..Default::default() };
    grpc.publish(pubsub::PublishRequest { topic: topic_path("resets"), messages: vec![large] })
        .expect("a 9 MB publish once the cut publishes are gone");
    drop(grpc);
    let client = daemon.client();
    still_whole(daemon, client);
}

/// The write-stall deadline of the tests of peers that never read.
const WRITE_STALL_DEADLINE: Duration = Duration::from_secs(3);

/// A connection to `address` whose receive buffer is as small as the kernel allows, so that a
/// peer that never reads leaves nearly all of its answers with the daemon.
fn connect_never_reading(address: &str) -> TcpStream {
    use nix::libc;
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(address) = address.parse().unwrap() else { panic!("IPv4 only") };
    let remote = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: address.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*address.ip()).to_be() },
        sin_zero: [0; 8],
    };
    let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor made here, with values that live across them.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(socket >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(socket);
        let buffer: libc::c_int = 4096;
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let set = libc::setsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&buffer as *const libc::c_int).cast(),
            size,
        );
        assert_eq!(set, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
        let connected = libc::connect(socket, (&remote as *const libc::sockaddr_in).cast(), length);
        assert_eq!(connected, 0, "connect {address}: {}", std::io::Error::last_os_error());
        stream
    }
}

/// Whether the daemon reset `stream` (what it had sent before is read and dropped first),
/// within `limit`.
fn reset_by_the_daemon(stream: &mut TcpStream, limit: Duration) -> bool {
    use std::io::Read;
    let until = Instant::now() + limit;
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buffer = vec![0u8; 1 << 20];
    while Instant::now() < until {
        match stream.read(&mut buffer) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(error)
                if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(error) => panic!("reading the never-reading connection: {error}"),
        }
    }
    false
}

/// Reads the answers of `count` pipelined requests, slowly for `slow_for` (`chunk` bytes each
/// `pause`), then at full speed; returns their headers. Panics on an error answer or a close.
fn read_slowly(
    stream: &mut TcpStream,
    count: usize,
    slow_for: Duration,
    chunk: usize,
    pause: Duration,
) -> usize {
    use ringpost_wire::frame::FrameHeader;
    use ringpost_wire::limits::FRAME_HEADER_BYTES;
    use std::io::Read;
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    let mut bytes = 0;
    let mut read_exactly = |stream: &mut TcpStream, length: usize| -> Vec<u8> {
        let mut body = vec![0u8; length];
        let mut filled = 0;
        while filled < length {
            let slow = started.elapsed() < slow_for;
            let end = if slow { length.min(filled + chunk) } else { length };
            stream.read_exact(&mut body[filled..end]).expect("a slow reader's connection was cut");
            filled = end;
            if slow {
                std::thread::sleep(pause);
            }
        }
        bytes += length;
        body
    };
    for _ in 0..count {
        let header = read_exactly(stream, FRAME_HEADER_BYTES);
        let header = FrameHeader::decode(&header).unwrap();
        let body = read_exactly(stream, header.body_length as usize);
        assert!(
            !header.is_error(),
            "a slow reader was answered {}",
            ringpost_wire::frame::decode_error(&body)
        );
    }
    bytes
}

/// A peer that is alive but never reads (issue 47's pipelined unread pulls, held rather than
/// reset) is cut at the write-stall deadline (`--write-stall-deadline-seconds`): its connection
/// is reset and released (the connection gauge, the daemon's descriptors), the shard's budget for
/// responses its pulls held comes back (a stream with a window of 20 MB is served), and SIGTERM
/// exits 0. A reader that is slow but takes bytes the whole time is never cut, past several
/// deadlines.
#[test]
fn a_peer_that_never_reads_is_cut_at_the_write_stall_deadline() {
    raise_open_files();
    let stall = WRITE_STALL_DEADLINE.as_secs().to_string();
    let daemon = start("stall", vec!["--write-stall-deadline-seconds".into(), stall]);
    let client = daemon.client();
    block_on(client.create_topic("resets")).unwrap();
    block_on(client.create_topic("resets-later")).unwrap();
    create_subscription(&client, "resets-backlog", "resets", 60);
    create_subscription(&client, "resets-slow", "resets", 60);
    create_subscription(&client, "resets-after", "resets", 60);
    for index in 0..WAITING_PULLS {
        create_subscription(&client, &format!("resets-later-{index}"), "resets-later", 60);
    }
    publish_large(&client, "resets", LARGE_MESSAGES, 10);
    drop(client);
    let before = quiet_descriptors(&daemon);
    let forwarder = forwarders(&daemon)[0].clone();

    // A slow reader: two pulls of about 12 MB each, read 128 KiB each half second for three
    // deadlines, then at full speed. Both answers arrive whole.
    let mut slow = connect(&forwarder);
    let pull = PullRequest { subscription: "resets-slow".into(), max_messages: 1000, wait_ms: 0 };
    let mut requests = frame(Command::Pull, 1, &pull);
    requests.extend(frame(Command::Pull, 2, &pull));
    slow.write_all(&requests).unwrap();
    let slow_for = WRITE_STALL_DEADLINE * 3;
    let slow_bytes = read_slowly(&mut slow, 2, slow_for, 128 << 10, Duration::from_millis(500));
    drop(slow);

    // A peer that never reads: a pull of the backlog fills its socket, and pulls waiting on
    // other subscriptions then get 9 MB answers each, 117 MB of the shard's budget for responses.
    let mut never = connect_never_reading(&forwarder);
    let backlog = PullRequest { subscription: "resets-backlog".into(), max_messages: 1000, wait_ms: 0 };
    let mut requests = frame(Command::Pull, 1, &backlog);
    for index in 0..WAITING_PULLS {
        let subscription = format!("resets-later-{index}");
        let pull = PullRequest { subscription, max_messages: 1000, wait_ms: QUIET_PULL_WAIT_MS };
        requests.extend(frame(Command::Pull, index as u64 + 2, &pull));
    }
    never.write_all(&requests).unwrap();
    let client = daemon.client();
    publish_large(&client, "resets-later", LATER_MESSAGES, LATER_MESSAGES);
    let published = Instant::now();
    drop(client);
    let until = published + WRITE_STALL_DEADLINE + RELEASE_WITHIN;
    while connections(&daemon, "native") > 0.0 {
        assert!(
            Instant::now() < until,
            "the connection that never reads was kept {:?} after its answers were due",
            published.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let cut_after = published.elapsed();
    assert!(
        reset_by_the_daemon(&mut never, RELEASE_WITHIN),
        "the never-reading peer was not told by a reset"
    );
    released(&daemon, "native", before, "a peer that never reads");
    let log = daemon.log();
    assert!(log.contains("write_stall_deadline"), "the cut is not logged:\n{log}");
    println!(
        "write stall deadline {WRITE_STALL_DEADLINE:?}: a slow reader took {slow_bytes} bytes over {slow_for:?} and \
         more, whole; a peer that never read was reset {cut_after:?} after its answers were due"
    );
    let client = daemon.client();
    still_whole(daemon, client);
}

/// SIGTERM while a peer that never reads holds answers the daemon cannot write: the stop gives
/// them up after `WRITE_STALL_DEADLINE_STOPPING` (2 s) rather than waiting for the write-stall
/// deadline (60 s by default) or stopping by force after 10 s; the daemon exits 0.
#[test]
fn sigterm_with_a_peer_that_never_reads_exits_zero() {
    let mut daemon = start("stall-sigterm", Vec::new());
    let client = daemon.client();
    block_on(client.create_topic("resets")).unwrap();
    create_subscription(&client, "resets-backlog", "resets", 60);
    publish_large(&client, "resets", LARGE_MESSAGES, 10);
    drop(client);
    let forwarder = forwarders(&daemon)[0].clone();
    let mut never = connect_never_reading(&forwarder);
    let backlog = PullRequest { subscription: "resets-backlog".into(), max_messages: 1000, wait_ms: 0 };
    never.write_all(&frame(Command::Pull, 1, &backlog)).unwrap();
    // The pull's answer fills the socket, then SIGTERM.
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_for_exit(EXIT_WITHIN).expect("ringpostd stopped after SIGTERM");
    let took = signalled.elapsed();
    let log = daemon.log();
    assert!(status.success(), "ringpostd exited with {status} after {took:?}; log:\n{log}");
    assert!(!log.contains("stopping by force"), "{log}");
    assert!(log.contains("write_stall_deadline"), "{log}");
    println!("SIGTERM with a peer that never reads: exited 0 after {took:?}");
    drop(never);
}
