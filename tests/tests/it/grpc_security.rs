//! The gRPC API guarded as the native protocol is: the same access file (tokens as
//! `authorization: Bearer`), the same TLS files, client certificates as principals; the
//! health service; and the services Ringpost does not implement answering why.

use crate::security::{access_text, daemon_requiring_auth, flags, text, token, AccessFile, Files};
use crate::test_ca::{Pair, TestCa};
use ringpost_client::block_on;
use ringpost_proto::google::iam::v1 as iam;
use ringpost_proto::pubsub;
use ringpost_tests::Daemon;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The gRPC API's address of a daemon started with `--grpc-listen 127.0.0.1:0`.
fn grpc_address(daemon: &Daemon) -> String {
    daemon.grpc_address.clone().expect("the daemon serves the gRPC API")
}

fn with_grpc(mut words: Vec<String>) -> Vec<String> {
    words.extend(flags(&["--grpc-listen", "127.0.0.1:0"]));
    words
}

fn plaintext(runtime: &tokio::runtime::Runtime, address: &str) -> Channel {
    runtime.block_on(Endpoint::from_shared(format!("http://{address}")).unwrap().connect()).unwrap()
}

pub(crate) fn over_tls(
    runtime: &tokio::runtime::Runtime,
    address: &str,
    ca: &TestCa,
    client: Option<&Pair>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&ca.file).unwrap()))
        .domain_name("localhost");
    if let Some(pair) = client {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&pair.certificate).unwrap(),
            std::fs::read(&pair.key).unwrap(),
        ));
    }
    let endpoint = Endpoint::from_shared(format!("https://{address}")).unwrap().tls_config(tls).unwrap();
    runtime.block_on(endpoint.connect())
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

fn get_topic(
    runtime: &tokio::runtime::Runtime,
    channel: &Channel,
    topic: &str,
    token: Option<&str>,
) -> Result<pubsub::Topic, tonic::Status> {
    let mut publisher = pubsub::publisher_client::PublisherClient::new(channel.clone());
    let request = pubsub::GetTopicRequest { topic: format!("projects/p/topics/{topic}") };
    runtime.block_on(publisher.get_topic(with_token(request, token))).map(tonic::Response::into_inner)
}

fn publish(
    runtime: &tokio::runtime::Runtime,
    channel: &Channel,
    topic: &str,
    token: Option<&str>,
) -> Result<pubsub::PublishResponse, tonic::Status> {
    let mut publisher = pubsub::publisher_client::PublisherClient::new(channel.clone());
    let request = pubsub::PublishRequest {
        topic: format!("projects/p/topics/{topic}"),
        messages: vec![pubsub::PubsubMessage { data: b"guarded".to_vec().into(), ..Default::default() }],
    };
    runtime.block_on(publisher.publish(with_token(request, token))).map(tonic::Response::into_inner)
}

#[test]
fn grpc_health_serves_and_the_services_ringpost_lacks_say_why() {
    let daemon = Daemon::start_with("grpc-health", Vec::new(), with_grpc(Vec::new()));
    let runtime = runtime();
    let channel = plaintext(&runtime, &grpc_address(&daemon));
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "google.pubsub.v1.Publisher", "google.pubsub.v1.Subscriber"] {
        let request = tonic_health::pb::HealthCheckRequest { service: service.to_owned() };
        let answer = runtime.block_on(health.check(request)).unwrap().into_inner();
        assert_eq!(answer.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    }

    // Schemas are served (tests/tests/it/schemas.rs): an empty listing here.
    let mut schemas = pubsub::schema_service_client::SchemaServiceClient::new(channel.clone());
    let request = pubsub::ListSchemasRequest { parent: "projects/p".into(), ..Default::default() };
    let listed = runtime.block_on(schemas.list_schemas(request)).unwrap().into_inner();
    assert!(listed.schemas.is_empty());

    let mut policies = iam::iam_policy_client::IamPolicyClient::new(channel.clone());
    let request = iam::GetIamPolicyRequest { resource: "projects/p/topics/t".into(), ..Default::default() };
    let refused = runtime.block_on(policies.get_iam_policy(request)).unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented);
    assert!(refused.message().contains("--access-file"), "{}", refused.message());
}

/// Tokens in `authorization: Bearer`, decided by the same access file as the native protocol:
/// no token is UNAUTHENTICATED, a wrong one too, a token without the role PERMISSION_DENIED,
/// and a denied publish stores nothing.
#[test]
fn grpc_calls_are_authenticated_and_permitted_by_the_access_file() {
    let files = Files::new("grpc-auth");
    let (root, reader) = (token("root"), token("reader"));
    let access =
        AccessFile::new(&files, &access_text(&[&root, &reader], &["admin * root", "viewer * reader"]));
    let daemon = daemon_requiring_auth("grpc-auth", &access, &["--grpc-listen", "127.0.0.1:0"]);
    let admin = crate::security::client_with(&daemon, &root);
    block_on(admin.create_topic("guarded")).unwrap();
    let runtime = runtime();
    let channel = plaintext(&runtime, &grpc_address(&daemon));

    let status = get_topic(&runtime, &channel, "guarded", None).unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = get_topic(&runtime, &channel, "guarded", Some("rpt_not-a-token")).unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(!status.message().contains("rpt_not-a-token"), "a refusal never repeats the token");
    let topic = get_topic(&runtime, &channel, "guarded", Some(&reader.secret)).unwrap();
    assert_eq!(topic.name, "projects/p/topics/guarded");

    let status = publish(&runtime, &channel, "guarded", Some(&reader.secret)).unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("pubsub.topics.publish"), "{}", status.message());
    let stats = block_on(admin.stats()).unwrap();
    let stored = stats.topics.iter().find(|topic| topic.name == "guarded").map(|topic| topic.end_offset);
    assert_eq!(stored, Some(0), "a denied publish appends nothing");

    let published = publish(&runtime, &channel, "guarded", Some(&root.secret)).unwrap();
    assert_eq!(published.message_ids.len(), 1);
}

/// With --tls-cert and --tls-key the gRPC API serves TLS from the same files; a client
/// certificate the --tls-client-ca signed is a principal, as on the native ports.
#[test]
fn grpc_serves_tls_and_client_certificates_are_principals() {
    let files = Files::new("grpc-tls");
    let server_ca = TestCa::new(&files.directory, "server-ca");
    let client_ca = TestCa::new(&files.directory, "client-ca");
    let root = token("root");
    let access =
        AccessFile::new(&files, &access_text(&[&root], &["admin * root", "publisher topic:secure billing"]));
    let server = server_ca.server();
    let words = flags(&[
        "--tls-cert",
        &text(&server.certificate),
        "--tls-key",
        &text(&server.key),
        "--tls-client-ca",
        &text(&client_ca.file),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let daemon =
        daemon_requiring_auth("grpc-tls", &access, &words.iter().map(String::as_str).collect::<Vec<_>>());
    let native = ringpost_client::Security::default().with_ca_file(&server_ca.file).unwrap();
    let admin = crate::security::connect_with(&daemon.address, native.with_token(root.secret.clone()));
    block_on(admin.create_topic("secure")).unwrap();
    let runtime = runtime();
    let address = grpc_address(&daemon);

    // Plaintext to the TLS port fails instead of hanging.
    let plaintext_channel = runtime.block_on(
        Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect_timeout(std::time::Duration::from_secs(5))
            .connect(),
    );
    if let Ok(channel) = plaintext_channel {
        assert!(get_topic(&runtime, &channel, "secure", Some(&root.secret)).is_err());
    }

    let trusted = over_tls(&runtime, &address, &server_ca, None).unwrap();
    assert_eq!(
        get_topic(&runtime, &trusted, "secure", Some(&root.secret)).unwrap().name,
        "projects/p/topics/secure"
    );
    let status = publish(&runtime, &trusted, "secure", None).unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "no token, no certificate: {status:?}");

    let billing = client_ca.client("billing", None);
    let presenting = over_tls(&runtime, &address, &server_ca, Some(&billing)).unwrap();
    publish(&runtime, &presenting, "secure", None).unwrap();
    let status = get_topic(&runtime, &presenting, "secure", None).unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "billing may publish, not read: {status:?}");
}

/// How long a renewed certificate may take to reach new gRPC connections: the API looks at
/// the files for each new connection, so the next one after the renames.
const CERTIFICATE_RELOAD_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The server's certificate renewed (the files renamed over, as an operator or certbot does)
/// serves new gRPC connections without a restart, while connections opened before go on; a
/// broken set (a key that does not match) is refused and the working one kept.
#[test]
fn grpc_a_renewed_certificate_serves_new_connections_without_a_restart() {
    use crate::test_ca::{replace_pair, write_replacing};
    let files = Files::new("grpc-tls-reload");
    let first = TestCa::new(&files.directory, "first");
    let second = TestCa::new(&files.directory, "second");
    let live = Pair { certificate: files.path("live.crt"), key: files.path("live.key") };
    replace_pair(&first.server(), &live);
    let words = with_grpc(flags(&["--tls-cert", &text(&live.certificate), "--tls-key", &text(&live.key)]));
    let daemon = Daemon::start_with("grpc-tls-reload", Vec::new(), words);
    let runtime = runtime();
    let address = grpc_address(&daemon);
    block_on(
        crate::security::connect_with(
            &daemon.address,
            ringpost_client::Security::default().with_ca_file(&first.file).unwrap(),
        )
        .create_topic("renewed"),
    )
    .unwrap();
    let held = over_tls(&runtime, &address, &first, None).expect("the first certificate is served");
    assert!(over_tls(&runtime, &address, &second, None).is_err(), "the second CA before the renewal");

    replace_pair(&second.server(), &live);
    let started = std::time::Instant::now();
    let renewed = loop {
        match over_tls(&runtime, &address, &second, None) {
            Ok(channel) => break channel,
            Err(error) if started.elapsed() > CERTIFICATE_RELOAD_WITHIN => {
                panic!("the renewed certificate was not served within {CERTIFICATE_RELOAD_WITHIN:?}: {error}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    get_topic(&runtime, &renewed, "renewed", None).expect("a call over the renewed certificate");
    assert!(over_tls(&runtime, &address, &first, None).is_err(), "the first CA after the renewal");
    get_topic(&runtime, &held, "renewed", None).expect("the connection opened before goes on");

    write_replacing(&live.key, &std::fs::read(first.server().key).unwrap());
    let still = over_tls(&runtime, &address, &second, None).expect("the working set kept");
    get_topic(&runtime, &still, "renewed", None).unwrap();
    assert_eq!(daemon.starts(), 1);
}

/// A connection that says nothing — no HTTP/2 preface in plaintext, no TLS handshake on a TLS
/// port — is closed after the preface deadline (10 s), so strangers that connect and wait
/// cannot hold the API's connections; a real client beside them is served throughout.
#[test]
fn grpc_a_connection_that_says_nothing_is_closed() {
    use std::io::Read;
    const PREFACE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    // Far past the deadline, so only a daemon that never closes fails the test.
    const CLOSED_WITHIN: std::time::Duration = std::time::Duration::from_secs(40);
    let files = Files::new("grpc-silent");
    let ca = TestCa::new(&files.directory, "ca");
    let server = ca.server();
    let plain = Daemon::start_with("grpc-silent-plain", Vec::new(), with_grpc(Vec::new()));
    let words =
        with_grpc(flags(&["--tls-cert", &text(&server.certificate), "--tls-key", &text(&server.key)]));
    let tls = Daemon::start_with("grpc-silent-tls", Vec::new(), words);
    let runtime = runtime();
    let started = std::time::Instant::now();
    let silent: Vec<std::net::TcpStream> = [&plain, &tls]
        .iter()
        .map(|daemon| {
            let stream = std::net::TcpStream::connect(grpc_address(daemon)).unwrap();
            stream.set_read_timeout(Some(CLOSED_WITHIN)).unwrap();
            stream
        })
        .collect();
    // Served beside them.
    let channel = plaintext(&runtime, &grpc_address(&plain));
    let status = get_topic(&runtime, &channel, "absent", None).unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(over_tls(&runtime, &grpc_address(&tls), &ca, None).is_ok());
    for (mut stream, which) in silent.into_iter().zip(["plaintext", "TLS"]) {
        let mut buffer = [0u8; 256];
        let closed = loop {
            match stream.read(&mut buffer) {
                Ok(0) => break true,
                // The server may send its own SETTINGS first on a plaintext connection.
                Ok(_) => continue,
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(closed, "the silent {which} connection was still open after {CLOSED_WITHIN:?}");
        assert!(
            started.elapsed() >= PREFACE_TIMEOUT - std::time::Duration::from_secs(1),
            "closed before the deadline"
        );
    }
}

/// Request messages still arriving hold at most 64 MiB of the gRPC API's memory over all its
/// calls (`GRPC_REQUEST_BYTES_ARRIVING_MAX`): calls that each announce a 10 MB publish and send
/// only its start are taken until their lengths fill the budget, the next is refused at once
/// with RESOURCE_EXHAUSTED (which the client libraries retry), and those held are ended with
/// DEADLINE_EXCEEDED once they fall behind the minimum rate; then a publish goes through.
#[test]
fn grpc_requests_arriving_hold_a_bounded_budget_and_a_trickle_is_cut() {
    const ANNOUNCED_BYTES: u32 = 10_000_000;
    // Six fit in 64 MiB; the seventh does not.
    const HELD: usize = 6;
    // Past the minimum rate's deadline for 10 MB (5 s and 9.5 s at 1 MiB/s), with room.
    const CUT_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);
    let daemon = Daemon::start_with("grpc-budget", Vec::new(), with_grpc(Vec::new()));
    let address = grpc_address(&daemon);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let channel = plaintext(&runtime, &address);
    let mut publisher = pubsub::publisher_client::PublisherClient::new(channel.clone());
    runtime
        .block_on(
            publisher.create_topic(pubsub::Topic {
                name: "projects/p/topics/budget".into(),
                ..Default::default()
            }),
        )
        .unwrap();

    // Each call on a connection of its own: the start of a message, then nothing.
    let start_call = |address: String| async move {
        let socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        let (client, connection) = h2::client::handshake(socket).await.unwrap();
        tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = http::Request::post(format!("http://{address}/google.pubsub.v1.Publisher/Publish"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        let mut start = vec![0u8];
        start.extend_from_slice(&ANNOUNCED_BYTES.to_be_bytes());
        start.extend_from_slice(&[0u8; 1024]);
        body.send_data(bytes::Bytes::from(start), false).unwrap();
        (client, body, response)
    };
    // The grpc-status of a call's answer: in its headers (a trailers-only answer) or trailers.
    let status_of = |response: h2::client::ResponseFuture| async move {
        let response = response.await.unwrap();
        if let Some(code) = response.headers().get("grpc-status") {
            return code.to_str().unwrap().to_owned();
        }
        let mut body = response.into_body();
        while body.data().await.is_some() {}
        let trailers = body.trailers().await.unwrap().unwrap_or_default();
        trailers.get("grpc-status").map(|code| code.to_str().unwrap().to_owned()).unwrap_or_default()
    };
    // HELD + 1 calls: whichever the daemon reads last finds the budget full and is refused
    // (RESOURCE_EXHAUSTED, at once); the held ones are cut at their deadline (some 15 s).
    let calls: Vec<_> = (0..=HELD).map(|_| runtime.block_on(start_call(address.clone()))).collect();
    let mut keep = Vec::new();
    let mut answers = Vec::new();
    for (client, body, response) in calls {
        keep.push((client, body));
        let status = runtime
            .block_on(async { tokio::time::timeout(CUT_WITHIN, status_of(response)).await })
            .expect("an answer");
        answers.push(status);
    }
    let count = |code: Code| answers.iter().filter(|status| **status == (code as i32).to_string()).count();
    assert_eq!(
        (count(Code::ResourceExhausted), count(Code::DeadlineExceeded)),
        (1, HELD),
        "one call past the budget refused, the held ones cut: {answers:?}"
    );
    runtime
        .block_on(publisher.publish(pubsub::PublishRequest {
            topic: "projects/p/topics/budget".into(),
            messages: vec![pubsub::PubsubMessage { data: vec![1; 1 << 20].into(), ..Default::default() }],
        }))
        .expect("a publish once the budget is free");
}
