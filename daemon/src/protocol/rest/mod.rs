//! Google Cloud Pub/Sub's REST API (`POST /v1/projects/P/topics/T:publish` and the rest), for
//! `gcloud`, the PHP client, the Node client's `fallback: 'rest'` and curl.
//!
//! Nothing here is written per method. The routes are the protos' `google.api.http`
//! annotations (`routes`); a request's JSON becomes its method's protobuf request by the proto3
//! JSON mapping (`transcode`), which is then called as a gRPC call on the very tower service
//! the gRPC API serves (its counting and budget layers, its services), with the request's
//! `authorization` header and TLS identity. So tokens, roles, limits and metrics are the gRPC
//! API's, on one code path, and a service added to the gRPC API gets its REST routes with it.
//!
//! It runs on the gRPC API's tokio runtime, with its connection bound, its TLS handshakes and
//! its idle deadline (`net::grpc::connections`), over HTTP/1.1. Its connections count in the
//! gRPC API's open connections, and its calls in the gRPC API's requests, by method and code.

pub mod routes;
pub mod transcode;

use crate::net::grpc::connections::{self, Activity, Ending};
use crate::net::tls::TlsFiles;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use routes::RouteTable;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::Connected;

/// A REST request's body: Pub/Sub's 10 MB publish limit in base64 (4/3 of it) with room for
/// the JSON around it. Beyond it the request is refused with INVALID_ARGUMENT before it is
/// decoded; the gRPC API's checks then apply to what it decodes to.
pub const REST_REQUEST_BYTES_MAX: usize = 16 << 20;

/// How long a request's body may take to arrive once its headers have: a client that stalls
/// mid-body is answered 408 and its connection closed, rather than holding it.
pub const REST_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a request's headers may take to arrive (hyper's header read timeout). hyper counts
/// it from when it waits for a request, so it is also how long a kept-alive connection waits
/// for its next one; each answer says so (`Keep-Alive: timeout=`, a second less), so that
/// clients (Node's fetch among them) stop reusing a connection before it is closed under them.
pub const REST_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The gRPC API's services, as the REST API calls them.
pub trait GrpcService:
    tower_service::Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S> GrpcService for S where
    S: tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// Serves the REST API on `listener` until `stopping` turns true, calling `grpc` for each
/// request; TLS with `tls`'s certificates when given, as the gRPC API's.
pub async fn serve<S: GrpcService>(
    listener: tokio::net::TcpListener,
    grpc: S,
    tls: Option<TlsFiles>,
    stopping: tokio::sync::watch::Receiver<bool>,
    idle_deadline: Duration,
) {
    let table = match RouteTable::of_the_protos() {
        Ok(table) => Arc::new(table),
        Err(error) => {
            crate::log_warn!("ringpostd: the REST API is not served: {error}");
            return;
        }
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    // Its own bound of the gRPC API's size: HTTP/1.1 clients open a connection per call in
    // flight, and must not take the gRPC clients' places.
    let connections_max = connections::GRPC_CONNECTIONS_MAX;
    match tls {
        None => {
            let incoming = connections::plain(incoming, connections_max);
            connections::serve_each(incoming, idle_deadline, stopping, move |io, activity, ending| {
                serve_connection(io, activity, ending, table.clone(), grpc.clone())
            })
            .await
        }
        Some(tls) => {
            let incoming = connections::handshaken(incoming, connections_max, tls, stopping.clone());
            connections::serve_each(incoming, idle_deadline, stopping, move |io, activity, ending| {
                serve_connection(io, activity, ending, table.clone(), grpc.clone())
            })
            .await
        }
    }
}

/// Serves one HTTP/1.1 connection until `ending` resolves, then closes it gracefully (after
/// the request it is answering, if any).
async fn serve_connection<IO, S>(
    io: IO,
    activity: Arc<Activity>,
    ending: Ending,
    table: Arc<RouteTable>,
    grpc: S,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    S: GrpcService,
{
    // What tonic would put in each request's extensions: the peer's address and, over TLS,
    // its verified certificates (`credentials::Presented`).
    let connect_info = io.connect_info();
    let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
        let call = activity.begin();
        let (table, grpc, connect_info) = (table.clone(), grpc.clone(), connect_info.clone());
        async move {
            let answer = answer(request, &table, grpc, connect_info).await;
            drop(call);
            Ok::<_, Infallible>(answer)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(REST_HEADER_READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    let ended = futures_lite::future::or(async { Some(connection.as_mut().await) }, async {
        ending.await;
        None
    })
    .await;
    if ended.is_none() {
        connection.as_mut().graceful_shutdown();
        let _ = connection.await;
    }
}

/// The answer to one REST request.
async fn answer<S: GrpcService, C: Clone + Send + Sync + 'static>(
    request: http::Request<hyper::body::Incoming>,
    table: &RouteTable,
    grpc: S,
    connect_info: C,
) -> http::Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let Some((route, bound)) = table.find(&parts.method, parts.uri.path()) else {
        let message = format!("no REST method is {} {}", parts.method, parts.uri.path());
        return error(tonic::Code::NotFound, &message);
    };
    // A body its Content-Length says is too long is refused before a byte of it is read.
    if http_body::Body::size_hint(&body).lower() > REST_REQUEST_BYTES_MAX as u64 {
        return too_long();
    }
    let read =
        tokio::time::timeout(REST_BODY_READ_TIMEOUT, Limited::new(body, REST_REQUEST_BYTES_MAX).collect());
    let body = match read.await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(failure)) if failure.is::<http_body_util::LengthLimitError>() => return too_long(),
        Ok(Err(failure)) => {
            return error(tonic::Code::InvalidArgument, &format!("reading the request's body: {failure}"))
        }
        Err(_) => {
            let mut answer = error(
                tonic::Code::DeadlineExceeded,
                "the request's body did not arrive within REST_BODY_READ_TIMEOUT",
            );
            *answer.status_mut() = http::StatusCode::REQUEST_TIMEOUT;
            answer.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            return answer;
        }
    };
    let encoded = match transcode::request_of(route, &body, &bound, parts.uri.query()) {
        Ok(encoded) => encoded,
        Err(message) => return error(tonic::Code::InvalidArgument, &message),
    };
    match call(grpc, &route.grpc_path, encoded, &parts.headers, connect_info).await {
        Ok(response) => match transcode::response_json(route, &response) {
            Ok(json) => json_response(200, json),
            Err(message) => error(tonic::Code::Internal, &message),
        },
        Err(status) => error(status.code(), status.message()),
    }
}

/// Calls the gRPC method at `path` with the protobuf request `encoded`, as a gRPC client would:
/// the message in its 5-byte frame, the client's `authorization` header, its connection's
/// information; the response's message, or its status.
async fn call<S: GrpcService, C: Clone + Send + Sync + 'static>(
    mut grpc: S,
    path: &str,
    encoded: Vec<u8>,
    headers: &http::HeaderMap,
    connect_info: C,
) -> Result<Bytes, tonic::Status> {
    let length = u32::try_from(encoded.len())
        .map_err(|_| tonic::Status::invalid_argument("the request is too long"))?;
    let mut framed = Vec::with_capacity(encoded.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(&encoded);
    let mut request = http::Request::new(tonic::body::Body::new(Full::new(Bytes::from(framed))));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = path.parse().map_err(|_| tonic::Status::internal("a route's gRPC path"))?;
    *request.version_mut() = http::Version::HTTP_2;
    let forwarded = request.headers_mut();
    forwarded.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    forwarded.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    if let Some(authorization) = headers.get(http::header::AUTHORIZATION) {
        forwarded.insert(http::header::AUTHORIZATION, authorization.clone());
    }
    request.extensions_mut().insert(connect_info);
    std::future::poll_fn(|context| grpc.poll_ready(context)).await.unwrap_or_else(|never| match never {});
    let response = grpc.call(request).await.unwrap_or_else(|never| match never {});
    let (parts, body) = response.into_parts();
    // A call that fails before its message answers with its status in the headers.
    if let Some(status) = tonic::Status::from_header_map(&parts.headers) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    let collected = body.collect().await.map_err(|status| tonic::Status::internal(status.to_string()))?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = tonic::Status::from_header_map(&trailers)
        .unwrap_or_else(|| tonic::Status::internal("the call ended with no grpc-status"));
    if status.code() != tonic::Code::Ok {
        return Err(status);
    }
    let data = collected.to_bytes();
    match data.first() {
        Some(0) if data.len() >= 5 => Ok(data.slice(5..)),
        _ => Err(tonic::Status::internal("the response is not one uncompressed gRPC message")),
    }
}

fn json_response(http_status: u16, json: Vec<u8>) -> http::Response<Full<Bytes>> {
    let mut response = http::Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() =
        http::StatusCode::from_u16(http_status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    let keep_alive = format!("timeout={}", REST_HEADER_READ_TIMEOUT.as_secs().saturating_sub(1));
    if let Ok(keep_alive) = http::HeaderValue::from_str(&keep_alive) {
        response.headers_mut().insert(http::HeaderName::from_static("keep-alive"), keep_alive);
    }
    response
}

fn too_long() -> http::Response<Full<Bytes>> {
    let message =
        format!("the request's body is over REST_REQUEST_BYTES_MAX ({REST_REQUEST_BYTES_MAX} bytes)");
    let mut answer = error(tonic::Code::InvalidArgument, &message);
    // The rest of the body is not read: the connection cannot carry another request.
    answer.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    answer
}

fn error(code: tonic::Code, message: &str) -> http::Response<Full<Bytes>> {
    let (http_status, json) = transcode::error_json(code, message);
    json_response(http_status, json)
}
