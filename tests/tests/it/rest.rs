//! Google Cloud Pub/Sub's REST API against the real daemon, over plain HTTP/1.1 as curl speaks
//! it: every kind of call a client makes (create, publish with data in base64, attributes and
//! an ordering key, pull, modifyAckDeadline, acknowledge, get, list, patch, seek, delete), the
//! JSON of the answers, Google's error body with the gRPC API's codes, and its tokens.

use crate::security::{access_text, daemon_requiring_auth, token, AccessFile, Files};
use ringpost_tests::Daemon;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::Duration;

/// A daemon with its gRPC and REST APIs on free ports.
fn rest_daemon(label: &str, more: &[&str]) -> Daemon {
    let mut flags = vec!["--grpc-listen", "127.0.0.1:0", "--rest-listen", "127.0.0.1:0"];
    flags.extend(more);
    Daemon::start_with(label, Vec::new(), flags.iter().map(|flag| (*flag).to_owned()).collect())
}

/// One HTTP/1.1 request on a connection of its own: the status and the body, as JSON.
pub(crate) fn call(
    address: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    let (status, body) = call_raw(address, method, path, body.map(str::as_bytes), token);
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|error| panic!("{method} {path}: {error}: {}", String::from_utf8_lossy(&body)));
    (status, json)
}

fn call_raw(
    address: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    token: Option<&str>,
) -> (u16, Vec<u8>) {
    let body = body.unwrap_or_default();
    send(address, method, path, body, body.len(), token)
}

/// A request whose Content-Length says `length`, with `body` (which may be shorter); the
/// status and the body of the answer.
fn send(
    address: &str,
    method: &str,
    path: &str,
    body: &[u8],
    length: usize,
    token: Option<&str>,
) -> (u16, Vec<u8>) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let split = answer.windows(4).position(|window| window == b"\r\n\r\n").expect("an HTTP answer");
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status line");
    (status, answer[split + 4..].to_vec())
}

/// The answer's JSON, checked to be a 200.
fn ok(answer: (u16, Value), what: &str) -> Value {
    assert_eq!(answer.0, 200, "{what}: {}", answer.1);
    answer.1
}

/// Google's error body, checked to carry `http` and `status`; its message.
fn refused(answer: (u16, Value), http: u16, status: &str, what: &str) -> String {
    assert_eq!(answer.0, http, "{what}: {}", answer.1);
    let error = &answer.1["error"];
    assert_eq!(error["code"], json!(http), "{what}: {}", answer.1);
    assert_eq!(error["status"], json!(status), "{what}: {}", answer.1);
    error["message"].as_str().expect("a message").to_owned()
}

const TOPIC: &str = "/v1/projects/p/topics/orders";
const SUBSCRIPTION: &str = "/v1/projects/p/subscriptions/orders-reader";

#[test]
fn the_rest_api_serves_topics_subscriptions_and_delivery() {
    let daemon = rest_daemon("rest-api", &[]);
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    let created = ok(call(&rest, "PUT", TOPIC, Some("{}"), None), "create the topic");
    assert_eq!(created["name"], json!("projects/p/topics/orders"));
    let subscription =
        json!({"topic": "projects/p/topics/orders", "ackDeadlineSeconds": 10, "retainAckedMessages": true});
    let created = ok(
        call(&rest, "PUT", SUBSCRIPTION, Some(&subscription.to_string()), None),
        "create the subscription",
    );
    assert_eq!(created["ackDeadlineSeconds"], json!(10));

    let publish = json!({"messages": [{"data": "aGVsbG8=", "attributes": {"region": "eu"}, "orderingKey": "customer-7"}]});
    let published =
        ok(call(&rest, "POST", &format!("{TOPIC}:publish"), Some(&publish.to_string()), None), "publish");
    assert_eq!(published["messageIds"].as_array().map(Vec::len), Some(1), "{published}");

    // Pulled, let go at once (a deadline of 0), pulled again, then acknowledged.
    let pull = |what: &str| {
        let pulled = ok(
            call(&rest, "POST", &format!("{SUBSCRIPTION}:pull"), Some(r#"{"maxMessages": 10}"#), None),
            what,
        );
        pulled["receivedMessages"].as_array().cloned().unwrap_or_default()
    };
    let received = pull("the first pull");
    assert_eq!(received.len(), 1, "{received:?}");
    let message = &received[0]["message"];
    assert_eq!(message["data"], json!("aGVsbG8="));
    assert_eq!(message["attributes"], json!({"region": "eu"}));
    assert_eq!(message["orderingKey"], json!("customer-7"));
    assert_eq!(message["messageId"], published["messageIds"][0]);
    assert!(message["publishTime"].as_str().is_some_and(|time| time.ends_with('Z')), "{message}");
    let ack_ids = json!({"ackIds": [received[0]["ackId"]], "ackDeadlineSeconds": 0});
    let modified =
        call(&rest, "POST", &format!("{SUBSCRIPTION}:modifyAckDeadline"), Some(&ack_ids.to_string()), None);
    assert_eq!(ok(modified, "modifyAckDeadline"), json!({}));
    let again = pull("the pull after the deadline was let go");
    assert_eq!(again.len(), 1, "{again:?}");
    let ack = json!({"ackIds": [again[0]["ackId"]]});
    let acknowledged =
        call(&rest, "POST", &format!("{SUBSCRIPTION}:acknowledge"), Some(&ack.to_string()), None);
    assert_eq!(ok(acknowledged, "acknowledge"), json!({}));
    assert!(pull("the pull after the acknowledgement").is_empty());
    // A seek back in time delivers the acknowledged message again (it was retained).
    let seek = call(
        &rest,
        "POST",
        &format!("{SUBSCRIPTION}:seek"),
        Some(r#"{"time": "1970-01-01T00:00:00Z"}"#),
        None,
    );
    assert_eq!(ok(seek, "seek"), json!({}));
    assert_eq!(pull("the pull after the seek").len(), 1);

    // Read, listed with a query, updated with a mask.
    assert_eq!(
        ok(call(&rest, "GET", TOPIC, None, None), "get the topic")["name"],
        json!("projects/p/topics/orders")
    );
    let listed = ok(call(&rest, "GET", "/v1/projects/p/topics?pageSize=10", None, None), "list topics");
    assert_eq!(listed["topics"][0]["name"], json!("projects/p/topics/orders"), "{listed}");
    let listed = ok(
        call(&rest, "GET", "/v1/projects/p/topics/orders/subscriptions", None, None),
        "list its subscriptions",
    );
    assert_eq!(listed["subscriptions"], json!(["projects/p/subscriptions/orders-reader"]));
    let patch = json!({"subscription": {"ackDeadlineSeconds": 30}, "updateMask": "ackDeadlineSeconds"});
    let patched =
        ok(call(&rest, "PATCH", SUBSCRIPTION, Some(&patch.to_string()), None), "patch the subscription");
    assert_eq!(patched["ackDeadlineSeconds"], json!(30), "{patched}");
    assert_eq!(
        ok(call(&rest, "GET", SUBSCRIPTION, None, None), "get the subscription")["ackDeadlineSeconds"],
        json!(30)
    );

    // Errors: Google's body, with the gRPC API's codes mapped to HTTP's.
    let said = refused(
        call(&rest, "GET", "/v1/projects/p/topics/missing", None, None),
        404,
        "NOT_FOUND",
        "a missing topic",
    );
    assert!(!said.is_empty());
    refused(call(&rest, "PUT", TOPIC, Some("{}"), None), 409, "ALREADY_EXISTS", "a topic made twice");
    let said = refused(
        call(&rest, "POST", &format!("{TOPIC}:publish"), Some("{\"messages\": ["), None),
        400,
        "INVALID_ARGUMENT",
        "malformed JSON",
    );
    assert!(said.contains("Invalid JSON payload"), "{said}");
    refused(
        call(
            &rest,
            "POST",
            &format!("{TOPIC}:publish"),
            Some(r#"{"messages": [{"data": "not base64!"}]}"#),
            None,
        ),
        400,
        "INVALID_ARGUMENT",
        "data not in base64",
    );
    refused(call(&rest, "GET", "/v1/no/such/thing", None, None), 404, "NOT_FOUND", "an unknown path");

    assert_eq!(ok(call(&rest, "DELETE", SUBSCRIPTION, None, None), "delete the subscription"), json!({}));
    assert_eq!(ok(call(&rest, "DELETE", TOPIC, None, None), "delete the topic"), json!({}));
    refused(call(&rest, "GET", TOPIC, None, None), 404, "NOT_FOUND", "a deleted topic");
}

/// A request's body is bounded in size and in time: one said to be too long is refused before
/// it is read, and a client that stalls mid-body is answered and its connection closed.
#[test]
fn the_rest_api_bounds_a_requests_body() {
    use ringpost_daemon::protocol::rest::{REST_BODY_READ_TIMEOUT, REST_REQUEST_BYTES_MAX};
    let daemon = rest_daemon("rest-bounds", &[]);
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    ok(call(&rest, "PUT", TOPIC, Some("{}"), None), "create the topic");
    let publish = format!("{TOPIC}:publish");
    let (status, body) = send(&rest, "POST", &publish, b"", REST_REQUEST_BYTES_MAX + 1, None);
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("REST_REQUEST_BYTES_MAX"), "{body}");
    // A kept-alive connection is told how long it may wait for its next request.
    let mut stream = std::net::TcpStream::connect(&rest).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.write_all(format!("GET {TOPIC} HTTP/1.1\r\nHost: {rest}\r\n\r\n").as_bytes()).unwrap();
    let mut head = [0u8; 512];
    let read = stream.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..read]).to_ascii_lowercase();
    assert!(head.contains("keep-alive: timeout=9"), "{head}");
    let started = std::time::Instant::now();
    let (status, body) = send(&rest, "POST", &publish, b"{\"messages\": [", 100, None);
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&body));
    assert!(started.elapsed() >= REST_BODY_READ_TIMEOUT, "{:?}", started.elapsed());
}

#[test]
fn the_rest_api_asks_for_the_grpc_apis_tokens() {
    let files = Files::new("rest-auth");
    let root = token("root");
    let access = AccessFile::new(&files, &access_text(&[&root], &["admin * root"]));
    let daemon = daemon_requiring_auth(
        "rest-auth",
        &access,
        &["--grpc-listen", "127.0.0.1:0", "--rest-listen", "127.0.0.1:0"],
    );
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    refused(call(&rest, "PUT", TOPIC, Some("{}"), None), 401, "UNAUTHENTICATED", "a create without a token");
    refused(
        call(&rest, "PUT", TOPIC, Some("{}"), Some("rpt_wrong")),
        401,
        "UNAUTHENTICATED",
        "a create with a wrong token",
    );
    ok(call(&rest, "PUT", TOPIC, Some("{}"), Some(&root.secret)), "a create with the admin's token");
    refused(
        call(&rest, "GET", "/v1/projects/p/topics", None, None),
        401,
        "UNAUTHENTICATED",
        "a listing without a token",
    );
    let listed =
        ok(call(&rest, "GET", "/v1/projects/p/topics", None, Some(&root.secret)), "a listing with a token");
    assert_eq!(listed["topics"][0]["name"], json!("projects/p/topics/orders"));
}

/// curl over TLS to the REST API: its status and its answer's JSON.
fn curl_tls(
    ca: &std::path::Path,
    client: Option<&crate::test_ca::Pair>,
    method: &str,
    url: &str,
    body: &str,
) -> (u16, Value) {
    let mut command = std::process::Command::new("curl");
    command.args(["-s", "--max-time", "20", "-X", method, "--cacert"]).arg(ca);
    if let Some(client) = client {
        command.arg("--cert").arg(&client.certificate).arg("--key").arg(&client.key);
    }
    if !body.is_empty() {
        command.args(["-d", body]);
    }
    let output = command.args(["-w", "\n%{http_code}", url]).output().expect("running curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (json, status) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl {url}: {text:?}"));
    let json = serde_json::from_str(json).unwrap_or_else(|error| panic!("curl {url}: {error}: {text:?}"));
    (status.parse().unwrap_or_else(|_| panic!("curl {url}: {text:?}")), json)
}

/// With --tls-cert and --tls-key the REST API serves TLS from the gRPC API's files, and a
/// client certificate the --tls-client-ca signed is a principal, as over gRPC.
#[test]
fn the_rest_api_serves_tls_and_client_certificates_are_principals() {
    use crate::test_ca::TestCa;
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: curl is not installed");
        return;
    }
    let files = Files::new("rest-tls");
    let server_ca = TestCa::new(&files.directory, "server-ca");
    let client_ca = TestCa::new(&files.directory, "client-ca");
    let root = token("root");
    let access =
        AccessFile::new(&files, &access_text(&[&root], &["admin * root", "publisher topic:secure billing"]));
    let server = server_ca.server();
    let (certificate, key, client_ca_file) = (
        server.certificate.display().to_string(),
        server.key.display().to_string(),
        client_ca.file.display().to_string(),
    );
    let flags = [
        "--tls-cert",
        &certificate,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &client_ca_file,
        "--grpc-listen",
        "127.0.0.1:0",
        "--rest-listen",
        "127.0.0.1:0",
    ];
    let daemon = daemon_requiring_auth("rest-tls", &access, &flags);
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    let ca = &server_ca.file;
    let topic = format!("https://{rest}/v1/projects/p/topics/secure");
    let (status, created) = curl_tls(ca, None, "PUT", &format!("{topic}?access_token=ignored"), "");
    assert_eq!(status, 401, "no token, no certificate: {created}");
    let mut admin = std::process::Command::new("curl");
    admin
        .args(["-sf", "-X", "PUT", "--cacert"])
        .arg(ca)
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", root.secret));
    assert!(admin.arg(&topic).output().unwrap().status.success(), "the admin creates the topic over TLS");
    let billing = client_ca.client("billing", None);
    let publish = r#"{"messages": [{"data": "YmlsbA=="}]}"#;
    let (status, published) = curl_tls(ca, Some(&billing), "POST", &format!("{topic}:publish"), publish);
    assert_eq!(status, 200, "billing may publish: {published}");
    let (status, read) = curl_tls(ca, Some(&billing), "GET", &topic, "");
    assert_eq!(
        (status, &read["error"]["status"]),
        (403, &json!("PERMISSION_DENIED")),
        "billing may not read: {read}"
    );
}

/// `ringpost-bench --rest` publishes through the REST interface: every message it reports
/// acknowledged is there to pull, as the bench sent it (1 KiB of data, base64 on the wire).
#[test]
fn the_load_generator_publishes_through_the_rest_api() {
    let daemon = rest_daemon("rest-bench", &[]);
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    ok(call(&rest, "PUT", "/v1/projects/p/topics/benched", Some("{}"), None), "create the topic");
    let subscription = json!({"topic": "projects/p/topics/benched"});
    ok(
        call(
            &rest,
            "PUT",
            "/v1/projects/p/subscriptions/benched-reader",
            Some(&subscription.to_string()),
            None,
        ),
        "create the subscription",
    );
    let report = tempfile_path("rest-bench.json");
    let output = std::process::Command::new(ringpost_tests::binary("ringpost-bench"))
        .args([
            "--server",
            &daemon.address,
            "--rest",
            "--rest-server",
            &rest,
            "publish",
            "--topic",
            "benched",
        ])
        .args(["--messages", "3000", "--batch", "100", "--publishers", "2", "--inflight", "3"])
        .args(["--json", report.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let figures: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    std::fs::remove_file(&report).unwrap();
    assert_eq!(figures["errors"], json!(0), "{figures}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("through the REST interface"));

    // Counted by the subscription: every acknowledged message is there, none twice.
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 3000 {
        let pulled = ok(
            call(
                &rest,
                "POST",
                "/v1/projects/p/subscriptions/benched-reader:pull",
                Some(r#"{"maxMessages": 1000}"#),
                None,
            ),
            "pull",
        );
        let received = pulled["receivedMessages"].as_array().cloned().unwrap_or_default();
        assert!(!received.is_empty(), "{} of 3000 pulled, then nothing", seen.len());
        let mut ack_ids = Vec::new();
        for received in received {
            let data = received["message"]["data"].as_str().expect("data").to_owned();
            assert_eq!(data.len(), 1368, "1 KiB of data in base64");
            assert!(seen.insert(received["message"]["messageId"].as_str().unwrap().to_owned()));
            ack_ids.push(received["ackId"].clone());
        }
        let ack = json!({"ackIds": ack_ids});
        ok(
            call(
                &rest,
                "POST",
                "/v1/projects/p/subscriptions/benched-reader:acknowledge",
                Some(&ack.to_string()),
                None,
            ),
            "acknowledge",
        );
    }
    assert_eq!(seen.len(), 3000);
}

fn tempfile_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{}-{name}", std::process::id()))
}
