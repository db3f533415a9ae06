//! TLS and authentication on real connections: a server on a glommio executor, clients on
//! a thread of their own with blocking sockets (rustls's client over TLS).

use super::*;
use crate::auth::Mode;
use crate::net::tls::ClientCertificates;
use ringpost_wire::frame::decode_body;
use ringpost_wire::limits::PROTOCOL_VERSION;
use ringpost_wire::messages::HelloRequest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

/// Answers every request with the principal of the session it came in.
struct AnswerPrincipal;

impl Handler for AnswerPrincipal {
    async fn handle(&self, header: FrameHeader, _body: FrameBuffer, responder: &Responder) -> Response {
        let principal = responder.session().principal.to_string();
        respond(&header, &AuthenticateResponse { principal }).into()
    }
}

/// Serves `AnswerPrincipal` on a loopback port under `security`'s settings while `client`
/// runs on a thread of its own, then stops; a panic on the client's thread fails the test.
fn serve_while(
    access: AccessSettings,
    tls: Option<TlsSettings>,
    client: impl FnOnce(SocketAddr) + Send + 'static,
) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async move {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let security = Security::open(&access, tls.as_ref()).unwrap();
        let stop = Stop::default();
        let limits = ConnectionLimits::default();
        let serving =
            crate::runtime::spawn(serve(listener, Rc::new(AnswerPrincipal), stop.clone(), limits, security));
        let client = std::thread::spawn(move || client(address));
        while !client.is_finished() {
            crate::runtime::sleep(Duration::from_millis(5)).await;
        }
        stop.give();
        serving.await;
        if let Err(panic) = client.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

fn send<T: ringpost_wire::frame::Body>(stream: &mut impl Write, command: Command, request_id: u64, body: &T) {
    stream.write_all(&ringpost_wire::encode_frame(command.code(), 0, request_id, body)).unwrap();
}

fn hello(stream: &mut impl Write, request_id: u64) {
    let body = HelloRequest { protocol_version: PROTOCOL_VERSION, client_name: "test".into() };
    send(stream, Command::Hello, request_id, &body);
}

/// The next frame, or `None` once the connection is closed.
fn receive(stream: &mut impl Read) -> Option<(FrameHeader, FrameBuffer)> {
    let mut header = [0u8; ringpost_wire::limits::FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).ok()?;
    let header = FrameHeader::decode(&header).unwrap();
    let mut body = FrameBuffer::with_capacity(header.body_length as usize);
    body.resize(header.body_length as usize, 0);
    stream.read_exact(&mut body).unwrap();
    Some((header, body))
}

/// The principal a request was answered with, or the error it was answered with.
fn answer(stream: &mut impl Read, request_id: u64) -> Result<String, Status> {
    let (header, body) = receive(stream).expect("an answer, not a close");
    assert_eq!(header.request_id, request_id);
    if header.is_error() {
        return Err(ringpost_wire::frame::decode_error(&body));
    }
    Ok(decode_body::<AuthenticateResponse>(&body).unwrap().principal)
}

/// Whether the connection ends with no frame more.
fn closes(stream: &mut impl Read) -> bool {
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    rest.len() < ringpost_wire::limits::FRAME_HEADER_BYTES
}

/// A directory of its own for one test's files.
fn directory(name: &str) -> PathBuf {
    let directory = std::env::temp_dir().join(format!("ringpost-server-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    directory
}

/// A test CA, a server certificate for `localhost` and a client certificate for
/// `alice.example`, as PEM files in `directory`.
fn make_certificates(directory: &std::path::Path, client_certificates: ClientCertificates) -> TlsSettings {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "ringpost test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let write = |name: &str, text: String| std::fs::write(directory.join(name), text).unwrap();
    write("ca.pem", ca.pem());
    for (name, purpose) in [
        ("localhost", ExtendedKeyUsagePurpose::ServerAuth),
        ("alice.example", ExtendedKeyUsagePurpose::ClientAuth),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.extended_key_usages = vec![purpose];
        let certificate = params.signed_by(&key, &ca, &ca_key).unwrap();
        write(&format!("{name}.pem"), certificate.pem());
        write(&format!("{name}.key"), key.serialize_pem());
    }
    TlsSettings {
        certificate: directory.join("localhost.pem"),
        key: directory.join("localhost.key"),
        client_ca: Some(directory.join("ca.pem")),
        client_certificates,
    }
}

/// A TLS connection to `address` trusting the test CA, with alice's certificate or none.
fn connect_tls(
    address: SocketAddr,
    directory: &std::path::Path,
    with_certificate: bool,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(directory.join("ca.pem")).unwrap()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if with_certificate {
        let chain = vec![CertificateDer::from_pem_file(directory.join("alice.example.pem")).unwrap()];
        let key = PrivateKeyDer::from_pem_file(directory.join("alice.example.key")).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    let name = "localhost".try_into().unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let socket = std::net::TcpStream::connect(address).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(connection, socket)
}

/// Over TLS, requests are answered; a verified client certificate is the connection's
/// principal from its first request, and a client without one is anonymous.
#[test]
fn requests_are_answered_over_tls_as_the_certificate_names() {
    let directory = directory("tls");
    let tls = make_certificates(&directory, ClientCertificates::Optional);
    serve_while(AccessSettings::off(), Some(tls), move |address| {
        let mut alice = connect_tls(address, &directory, true);
        hello(&mut alice, 1);
        hello(&mut alice, 2);
        assert_eq!(answer(&mut alice, 1).unwrap(), "alice.example");
        assert_eq!(answer(&mut alice, 2).unwrap(), "alice.example");
        let mut nobody = connect_tls(address, &directory, false);
        hello(&mut nobody, 7);
        assert_eq!(answer(&mut nobody, 7).unwrap(), "anonymous");
        let _ = std::fs::remove_dir_all(&directory);
    });
}

/// Plaintext sent to a TLS port fails the handshake and closes that connection alone;
/// a client without a certificate where one is required is closed too.
#[test]
fn plaintext_to_a_tls_port_closes_while_others_are_served() {
    let directory = directory("plaintext");
    let tls = make_certificates(&directory, ClientCertificates::Required);
    serve_while(AccessSettings::off(), Some(tls), move |address| {
        let mut alice = connect_tls(address, &directory, true);
        hello(&mut alice, 1);
        assert_eq!(answer(&mut alice, 1).unwrap(), "alice.example");
        let mut plaintext = std::net::TcpStream::connect(address).unwrap();
        plaintext.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        hello(&mut plaintext, 1);
        let mut rest = Vec::new();
        let _ = plaintext.read_to_end(&mut rest);
        assert!(FrameHeader::decode(&rest).is_err(), "a plaintext client got a frame from a TLS port");
        let mut nobody = connect_tls(address, &directory, false);
        hello(&mut nobody, 3);
        assert!(receive(&mut nobody).is_none(), "a client without a certificate was served");
        hello(&mut alice, 2);
        assert_eq!(answer(&mut alice, 2).unwrap(), "alice.example");
        let _ = std::fs::remove_dir_all(&directory);
    });
}

/// A refused Authenticate answers its request `Unauthenticated`, closes the connection
/// with an error frame of request id 0, and dispatches nothing pipelined after it.
#[test]
fn a_failed_authenticate_closes_the_connection() {
    serve_while(AccessSettings::off(), None, |address| {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut pipelined = Vec::new();
        send(&mut pipelined, Command::Authenticate, 1, &AuthenticateRequest { token: "rpt_unknown".into() });
        hello(&mut pipelined, 2);
        stream.write_all(&pipelined).unwrap();
        assert_eq!(answer(&mut stream, 1).unwrap_err().code, ErrorCode::Unauthenticated);
        let closing = answer(&mut stream, 0).unwrap_err();
        assert_eq!(closing.code, ErrorCode::Unauthenticated);
        assert!(closing.message.contains("authentication failed"), "{}", closing.message);
        assert!(closes(&mut stream), "the connection answered after a failed Authenticate");
    });
}

/// Under required authentication, a small request before authenticating is read (the
/// permission checks answer it), and a frame announcing a body over
/// `FRAME_BODY_BYTES_UNAUTHENTICATED_MAX` closes the connection before its body is read.
#[test]
fn a_large_frame_before_authentication_closes_under_required_mode() {
    let access = AccessSettings { mode: Mode::Required, file: None };
    serve_while(access, None, |address| {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        hello(&mut stream, 1);
        assert_eq!(answer(&mut stream, 1).unwrap(), "anonymous");
        let header = FrameHeader {
            body_length: FRAME_BODY_BYTES_UNAUTHENTICATED_MAX as u32 + 1,
            command: Command::Publish.code(),
            flags: 0,
            request_id: 2,
        };
        stream.write_all(&header.encode()).unwrap();
        stream.write_all(&[0u8; 1000]).unwrap();
        let closing = answer(&mut stream, 0).unwrap_err();
        assert_eq!(closing.code, ErrorCode::Unauthenticated);
        assert!(
            closing.message.contains("authenticate before sending large requests"),
            "{}",
            closing.message
        );
        assert!(closes(&mut stream));
    });
}

/// The same large frame is read once the mode is off (anonymous may act).
#[test]
fn a_large_frame_is_read_when_anonymous_may_act() {
    serve_while(AccessSettings::off(), None, |address| {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = HelloRequest {
            protocol_version: PROTOCOL_VERSION,
            client_name: "x".repeat(FRAME_BODY_BYTES_UNAUTHENTICATED_MAX * 2),
        };
        send(&mut stream, Command::Hello, 1, &body);
        assert_eq!(answer(&mut stream, 1).unwrap(), "anonymous");
    });
}

/// An access file holding `token` for alice, granting her every role.
fn write_access_file(file: &std::path::Path, token: Option<&str>) {
    let mut text = String::from("grant admin * alice\n");
    if let Some(token) = token {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let hex: String = digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
        text.push_str(&format!("token alice sha256:{hex}\n"));
    }
    std::fs::write(file, text).unwrap();
}

const TOKEN: &str = "rpt_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// Authenticate pipelined with the requests after it: they run as the token's holder.
#[test]
fn requests_pipelined_after_authenticate_run_as_its_principal() {
    let directory = directory("authenticate");
    let file = directory.join("access");
    write_access_file(&file, Some(TOKEN));
    let access = AccessSettings { mode: Mode::Required, file: Some(file) };
    serve_while(access, None, move |address| {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut pipelined = Vec::new();
        hello(&mut pipelined, 1);
        send(&mut pipelined, Command::Authenticate, 2, &AuthenticateRequest { token: TOKEN.into() });
        hello(&mut pipelined, 3);
        stream.write_all(&pipelined).unwrap();
        let mut answers: Vec<(u64, String)> = (0..3)
            .map(|_| {
                let (header, body) = receive(&mut stream).unwrap();
                (header.request_id, decode_body::<AuthenticateResponse>(&body).unwrap().principal)
            })
            .collect();
        answers.sort();
        let expected = [(1, "anonymous"), (2, "alice"), (3, "alice")];
        assert_eq!(answers, expected.map(|(id, name)| (id, name.to_owned())));
        let _ = std::fs::remove_dir_all(&directory);
    });
}

/// A token taken out of the access file closes its connections within two seconds.
#[test]
fn a_revoked_token_closes_its_connection() {
    let directory = directory("revoke");
    let file = directory.join("access");
    write_access_file(&file, Some(TOKEN));
    let access = AccessSettings { mode: Mode::Required, file: Some(file.clone()) };
    serve_while(access, None, move |address| {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        send(&mut stream, Command::Authenticate, 1, &AuthenticateRequest { token: TOKEN.into() });
        assert_eq!(answer(&mut stream, 1).unwrap(), "alice");
        write_access_file(&file, None);
        let revoked = Instant::now();
        let closing = answer(&mut stream, 0).unwrap_err();
        assert!(revoked.elapsed() < 2 * SECURITY_CHECK_INTERVAL + Duration::from_millis(500));
        assert_eq!(closing.code, ErrorCode::Unauthenticated);
        assert!(closes(&mut stream));
        let _ = std::fs::remove_dir_all(&directory);
    });
}

/// Runs written through TLS (gathered into records, large ones alone) arrive whole and in
/// order, through a reader that starts late.
#[test]
fn runs_arrive_whole_and_in_order_over_tls() {
    let directory = directory("runs");
    let settings = make_certificates(&directory, ClientCertificates::Optional);
    let runs: Vec<Vec<u8>> = (0..200u32)
        .map(|index| {
            let length =
                if index % 50 == 7 { COALESCE_BYTES_MAX + 1 } else { (index as usize % 7) * 1001 + 1 };
            (0..length).map(|byte| (byte as u32 ^ index) as u8).collect()
        })
        .collect();
    let expected: Vec<u8> = runs.concat();
    assert!(
        runs.iter().any(|run| run.len() >= COALESCE_BYTES_MAX) && expected.len() > 4 * COALESCE_BYTES_MAX
    );
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(async move {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut stream = connect_tls(address, &directory, false);
            std::thread::sleep(Duration::from_millis(200));
            let mut received = Vec::new();
            let _ = stream.read_to_end(&mut received);
            let _ = std::fs::remove_dir_all(&directory);
            received
        });
        let stream = listener.accept().await.unwrap();
        let socket = stream.as_raw_fd();
        let stream = Tls::open(&settings).unwrap().acceptor().accept(stream).await.unwrap();
        let (_, writer) = futures_lite::io::split(stream);
        let progress = WriteProgress::default();
        let mut writer = Tracked { inner: writer, progress: &progress };
        write_runs(&mut writer, socket, runs.iter().map(Vec::as_slice).collect()).await.unwrap();
        writer.close().await.unwrap();
        drop(writer);
        while !client.is_finished() {
            crate::runtime::sleep(Duration::from_millis(5)).await;
        }
        let received = client.join().unwrap();
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "the bytes arrived changed or out of order");
    });
}

/// Certificates that change are loaded for new connections; an invalid set is refused and
/// the one before kept; files that did not change are not read again.
#[test]
fn changed_certificates_are_reloaded_and_invalid_ones_refused() {
    let directory = directory("reload");
    let settings = make_certificates(&directory, ClientCertificates::Optional);
    let tls = Tls::open(&settings).unwrap();
    assert_eq!(tls.reload_if_changed(), None);
    std::fs::write(&settings.certificate, "not a certificate\n").unwrap();
    let refused = tls.reload_if_changed().unwrap().unwrap_err();
    assert!(refused.contains("localhost.pem"), "{refused}");
    assert_eq!(tls.reload_if_changed(), None, "an invalid set is tried again only once it changes");
    make_certificates(&directory, ClientCertificates::Optional);
    assert_eq!(tls.reload_if_changed(), Some(Ok(())));
    let _ = std::fs::remove_dir_all(&directory);
}
