//! A budget on the request bytes the gRPC API holds while requests arrive, as the native
//! protocol has one on its frames not yet whole.
//!
//! tonic gathers each request message whole before it decodes it, up to
//! `GRPC_REQUEST_BYTES_MAX`; over 4,096 connections of 100 calls each, clients that send the
//! start of a large publish and then wait or trickle could make it hold terabytes. So every
//! request body passes through `Metered`, which reads gRPC's own framing (a flag byte and a
//! four-byte length before each message): when a message's length arrives, that many bytes
//! are taken from one budget for the whole API, and given back once the message has arrived
//! whole (tonic then decodes it at once) or the call ends. A message the budget cannot take
//! fails its call with `RESOURCE_EXHAUSTED` at once, which the client libraries retry, and a
//! message that arrives slower than the native protocol's minimum rate fails with
//! `DEADLINE_EXCEEDED`, so a trickle cannot hold its share.

use crate::net::server::{FRAME_BYTES_PER_SECOND_MIN, FRAME_DEADLINE_BASE};
use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::Status;

/// Request bytes the gRPC API holds for messages still arriving, over all its calls: four
/// messages of Pub/Sub's largest (10 MB) at once, or thousands of small ones.
pub const GRPC_REQUEST_BYTES_ARRIVING_MAX: usize = 64 << 20;

/// gRPC's prefix before each message: a compression flag and a big-endian length.
const MESSAGE_PREFIX_BYTES: usize = 5;

/// The tower layer that meters every request body against one budget.
#[derive(Clone)]
pub struct BudgetLayer {
    budget: Arc<Semaphore>,
    bytes_max: usize,
}

impl BudgetLayer {
    pub fn new(bytes_max: usize) -> BudgetLayer {
        BudgetLayer { budget: Arc::new(Semaphore::new(bytes_max)), bytes_max }
    }
}

impl<S> tower_layer::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted { inner, layer: self.clone() }
    }
}

#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    layer: BudgetLayer,
}

impl<S> tower_service::Service<http::Request<Body>> for Budgeted<S>
where
    S: tower_service::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> S::Future {
        let (parts, body) = request.into_parts();
        let metered = Metered::new(body, self.layer.budget.clone(), self.layer.bytes_max);
        self.inner.call(http::Request::from_parts(parts, Body::new(metered)))
    }
}

/// Where the reading of gRPC's framing is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Between messages, or inside a prefix: its bytes so far.
    Prefix { have: usize, bytes: [u8; MESSAGE_PREFIX_BYTES] },
    /// Inside a message: the bytes still to come, and what it took from the budget.
    Message { remaining: u64, reserved: u32 },
}

impl Framing {
    const BETWEEN: Framing = Framing::Prefix { have: 0, bytes: [0; MESSAGE_PREFIX_BYTES] };
}

/// A request body metered against the budget.
pub struct Metered<B> {
    inner: B,
    budget: Arc<Semaphore>,
    bytes_max: usize,
    framing: Framing,
    /// The current message's deadline, from its first byte: armed while one is arriving.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<B> Metered<B> {
    fn new(inner: B, budget: Arc<Semaphore>, bytes_max: usize) -> Metered<B> {
        Metered { inner, budget, bytes_max, framing: Framing::BETWEEN, deadline: None }
    }

    fn release(&mut self) {
        if let Framing::Message { reserved, .. } = self.framing {
            self.budget.add_permits(reserved as usize);
        }
        self.framing = Framing::BETWEEN;
        self.deadline = None;
    }

    /// Follows the framing through `data`: reserves each message's length as its prefix
    /// completes, and gives it back as the message completes.
    fn account(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            match self.framing {
                Framing::Prefix { mut have, mut bytes } => {
                    if have == 0 {
                        self.arm(FRAME_DEADLINE_BASE);
                    }
                    let take = (MESSAGE_PREFIX_BYTES - have).min(data.len());
                    bytes[have..have + take].copy_from_slice(&data[..take]);
                    have += take;
                    data = &data[take..];
                    self.framing = Framing::Prefix { have, bytes };
                    if have == MESSAGE_PREFIX_BYTES {
                        self.begin(u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]))?;
                    }
                }
                Framing::Message { remaining, reserved } => {
                    let take = remaining.min(data.len() as u64);
                    data = &data[take as usize..];
                    self.framing = Framing::Message { remaining: remaining - take, reserved };
                    if remaining == take {
                        self.release();
                    }
                }
            }
        }
        Ok(())
    }

    /// A message of `length` bytes begins: its share of the budget, and its deadline.
    fn begin(&mut self, length: u32) -> Result<(), Status> {
        if length == 0 {
            self.release();
            return Ok(());
        }
        // Larger than the whole budget: tonic refuses it anyway (GRPC_REQUEST_BYTES_MAX is far
        // below); it takes what there is, so that it waits for nobody.
        let reserved = length.min(self.bytes_max as u32);
        match self.budget.try_acquire_many(reserved) {
            Ok(permit) => permit.forget(),
            Err(_) => {
                self.framing = Framing::BETWEEN;
                self.deadline = None;
                return Err(Status::resource_exhausted(format!(
                    "a request message of {length} bytes would pass the {} MiB of requests the gRPC API holds \
                     while they arrive (GRPC_REQUEST_BYTES_ARRIVING_MAX); retry",
                    self.bytes_max >> 20
                )));
            }
        }
        self.framing = Framing::Message { remaining: length as u64, reserved };
        let at_minimum_rate = Duration::from_millis(length as u64 * 1000 / FRAME_BYTES_PER_SECOND_MIN);
        self.arm(FRAME_DEADLINE_BASE + at_minimum_rate);
        Ok(())
    }

    fn arm(&mut self, within: Duration) {
        let at = Instant::now() + within;
        match &mut self.deadline {
            Some(sleep) => sleep.as_mut().reset(at),
            None => self.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }
}

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<B> HttpBody for Metered<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(context) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = this.account(data.chunk()) {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.release();
                Poll::Ready(Some(Err(Status::from_error(error.into()))))
            }
            Poll::Ready(None) => {
                this.release();
                Poll::Ready(None)
            }
            Poll::Pending => {
                // A message begun and not whole by its deadline has arrived too slowly.
                if let Some(deadline) = &mut this.deadline {
                    if deadline.as_mut().poll(context).is_ready() {
                        this.release();
                        return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                            "a request message arrived slower than {} KiB/s (after {} s); the gRPC API closed it",
                            FRAME_BYTES_PER_SECOND_MIN >> 10,
                            FRAME_DEADLINE_BASE.as_secs()
                        )))));
                    }
                }
                Poll::Pending
            }
        }
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

    fn prefix(length: u32) -> Vec<u8> {
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes
    }

    fn metered(budget: &Arc<Semaphore>) -> Metered<Body> {
        Metered::new(Body::empty(), budget.clone(), 1000)
    }

    /// A message's deadline is a tokio timer, which needs a runtime with time to be made in.
    fn with_timers(test: impl FnOnce()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _entered = runtime.enter();
        test();
    }

    #[test]
    fn a_message_holds_its_length_until_it_is_whole_across_chunks() {
        with_timers(a_message_holds_its_length);
    }

    fn a_message_holds_its_length() {
        let budget = Arc::new(Semaphore::new(1000));
        let mut body = metered(&budget);
        let mut first = prefix(600);
        first.extend_from_slice(&[7; 100]);
        body.account(&first[..3]).unwrap();
        assert_eq!(budget.available_permits(), 1000, "nothing taken before the length is known");
        body.account(&first[3..]).unwrap();
        assert_eq!(budget.available_permits(), 400);
        // The rest of the first message and a whole small one in one chunk.
        let mut rest = vec![7u8; 500];
        rest.extend(prefix(10));
        rest.extend_from_slice(&[1; 10]);
        body.account(&rest).unwrap();
        assert_eq!(budget.available_permits(), 1000, "both whole: everything given back");
        assert_eq!(body.framing, Framing::BETWEEN);
    }

    #[test]
    fn a_message_the_budget_cannot_take_is_refused_and_a_dropped_call_gives_back() {
        with_timers(a_message_the_budget_cannot_take);
    }

    fn a_message_the_budget_cannot_take() {
        let budget = Arc::new(Semaphore::new(1000));
        let mut holding = metered(&budget);
        holding.account(&prefix(800)).unwrap();
        let mut refused = metered(&budget);
        let status = refused.account(&prefix(300)).unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("GRPC_REQUEST_BYTES_ARRIVING_MAX"), "{}", status.message());
        assert_eq!(budget.available_permits(), 200, "the refused one took nothing");
        drop(holding);
        assert_eq!(budget.available_permits(), 1000, "a call that ends mid-message gives its share back");
        // Empty messages take nothing.
        refused.account(&prefix(0)).unwrap();
        assert_eq!(budget.available_permits(), 1000);
    }
}
