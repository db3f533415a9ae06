//! Requests of the gRPC API by method and status code, and their durations, counted as the
//! native protocol's are (`metrics::requests`), so that a scrape shows both under the same
//! command names (`publish`, `streaming_pull`) and an alert on errors covers both.
//!
//! A tower layer outside every other: a call's status is gRPC's `grpc-status`, found in the
//! response's headers when a call fails before its first message (a trailers-only response),
//! else in the trailers that end its body. A body dropped before its trailers is a call the
//! client cancelled. The calls run on tonic's threads, not on a shard's, so the table is one
//! for the whole API behind a lock, taken once per call (never per message).

use crate::metrics::requests::{CommandFigures, RequestTable};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::body::Body;

/// The methods counted, by their place here; any other path counts as the last.
const METHODS: [&str; 31] = [
    "CreateTopic",
    "UpdateTopic",
    "Publish",
    "GetTopic",
    "ListTopics",
    "ListTopicSubscriptions",
    "ListTopicSnapshots",
    "DeleteTopic",
    "DetachSubscription",
    "CreateSubscription",
    "GetSubscription",
    "UpdateSubscription",
    "ListSubscriptions",
    "DeleteSubscription",
    "ModifyAckDeadline",
    "Acknowledge",
    "Pull",
    "StreamingPull",
    "ModifyPushConfig",
    "GetSnapshot",
    "ListSnapshots",
    "CreateSnapshot",
    "UpdateSnapshot",
    "DeleteSnapshot",
    "Seek",
    "Check",
    "Watch",
    "SetIamPolicy",
    "GetIamPolicy",
    "TestIamPermissions",
    "Other",
];

/// gRPC's status codes, as the native protocol numbers them too.
const CODE_OK: u16 = 0;
const CODE_CANCELLED: u16 = 1;
const CODE_UNKNOWN: u16 = 2;

static TABLE: LazyLock<Mutex<RequestTable>> = LazyLock::new(|| Mutex::new(RequestTable::new()));

fn method_index(path: &str) -> u16 {
    let method = path.rsplit('/').next().unwrap_or_default();
    let other = METHODS.len() - 1;
    METHODS[..other].iter().position(|name| *name == method).unwrap_or(other) as u16
}

/// Whether a method's calls are streams, whose durations (a subscriber's session) are not
/// request latencies.
fn is_stream(method: u16) -> bool {
    matches!(METHODS[method as usize], "StreamingPull" | "Watch")
}

/// A counted method's name for metrics, as the native protocol names its commands.
pub fn method_name(method: u16) -> String {
    crate::protocol::native::snake_case(METHODS.get(method as usize).copied().unwrap_or("Other"))
}

fn record(method: u16, code: u16, started: Instant) {
    let duration = (!is_stream(method)).then(|| started.elapsed());
    TABLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).record(method, code, duration);
}

/// The API's figures, by method (`method_name`), for a scrape.
pub fn snapshot() -> Vec<CommandFigures> {
    TABLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).snapshot()
}

fn status_of(headers: &http::HeaderMap) -> Option<u16> {
    let value = headers.get("grpc-status")?;
    Some(value.to_str().ok().and_then(|text| text.parse().ok()).unwrap_or(CODE_UNKNOWN))
}

/// The tower layer that counts every call.
#[derive(Clone, Default)]
pub struct CountingLayer;

impl<S> tower_layer::Layer<S> for CountingLayer {
    type Service = Counting<S>;

    fn layer(&self, inner: S) -> Counting<S> {
        Counting { inner }
    }
}

#[derive(Clone)]
pub struct Counting<S> {
    inner: S,
}

type Answered<E> = Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send>>;

impl<S> tower_service::Service<http::Request<Body>> for Counting<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answered<S::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = method_index(request.uri().path());
        let started = Instant::now();
        let answered = self.inner.call(request);
        Box::pin(async move {
            let mut response = match answered.await {
                Ok(response) => response,
                Err(error) => {
                    record(method, CODE_UNKNOWN, started);
                    return Err(error);
                }
            };
            // A request that did not decode answers INTERNAL from tonic's codec; it is the
            // client's fault, and counted as such.
            crate::protocol::grpc::decode_errors::rewrite(response.headers_mut());
            if let Some(code) = status_of(response.headers()) {
                record(method, code, started);
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let counted = Counted { inner: body, method, started, counted: false };
            Ok(http::Response::from_parts(parts, Body::new(counted)))
        })
    }
}

/// A response body that counts its call when its trailers pass, or when it ends or is dropped
/// without them.
struct Counted {
    inner: Body,
    method: u16,
    started: Instant,
    counted: bool,
}

impl Counted {
    fn count(&mut self, code: u16) {
        if !self.counted {
            self.counted = true;
            record(self.method, code, self.started);
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.count(CODE_CANCELLED);
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(context);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    this.count(status_of(trailers).unwrap_or(CODE_OK));
                }
            }
            Poll::Ready(Some(Err(status))) => this.count(status.code() as u16),
            // The end without trailers: tonic always sends them, so nothing said how it went.
            Poll::Ready(None) => this.count(CODE_UNKNOWN),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_named_as_the_native_commands() {
        assert_eq!(method_name(method_index("/google.pubsub.v1.Publisher/Publish")), "publish");
        assert_eq!(method_name(method_index("/google.pubsub.v1.Subscriber/StreamingPull")), "streaming_pull");
        assert_eq!(
            method_name(method_index("/google.pubsub.v1.Subscriber/ModifyAckDeadline")),
            crate::protocol::native::command_name(ringpost_wire::Command::ModifyAckDeadline as u16)
        );
        assert_eq!(method_name(method_index("/x.Y/Unheard")), "other");
        assert!(is_stream(method_index("/google.pubsub.v1.Subscriber/StreamingPull")));
        assert!(!is_stream(method_index("/google.pubsub.v1.Subscriber/Pull")));
    }
}
