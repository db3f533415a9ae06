//! Streaming pull: the server pushes batches while the stream's flow-control window has room;
//! acknowledgements go through the ordinary `acknowledge` and free the window.

use crate::connection::StreamReceiver;
use crate::{decode, off_thread, Client, Connection, Error, ReceivedMessage, Resource, Result};
use ringpost_wire::messages::{PullResponse, StreamingPullRequest};
use ringpost_wire::{Command, ErrorCode};

/// Flow control and lease of one streaming pull. Defaults are Pub/Sub's client defaults.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// Most messages delivered and not yet acknowledged on this stream (0: unlimited).
    pub max_outstanding_messages: u64,
    /// Most bytes delivered and not yet acknowledged on this stream (0: unlimited).
    pub max_outstanding_bytes: u64,
    /// Lease of each message on this stream (10 to 600 s; 0: the subscription's ack deadline).
    pub stream_ack_deadline_seconds: u32,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            max_outstanding_messages: 1000,
            max_outstanding_bytes: 100 * 1024 * 1024,
            stream_ack_deadline_seconds: 0,
        }
    }
}

/// Batches of messages from a streaming pull. Dropping it ends the stream; the messages it
/// still had out are delivered again at once (to another stream, or a later one).
pub struct MessageStream {
    receiver: StreamReceiver,
}

impl MessageStream {
    /// The next batch; `None` when the server ended the stream (it does not while the
    /// connection lives), `Some(Err)` when the connection failed.
    pub async fn next(&mut self) -> Option<Result<Vec<ReceivedMessage>>> {
        match self.receiver.next().await? {
            Ok(response) => Some(decode::<PullResponse>(response).map(|batch| batch.received_messages)),
            Err(error) => Some(Err(error)),
        }
    }
}

/// How often opening a stream is retried after the forwarder said it does not own the
/// subscription (it moved; the route is looked up again).
const STREAM_ROUTING_ATTEMPTS_MAX: usize = 3;

impl Client {
    /// Opens a streaming pull on its own connection to the forwarder that owns the
    /// subscription. Opening it (the lookup, the connection, the forwarder's acceptance) has
    /// the client's request timeout; the open stream has no deadline.
    pub async fn streaming_pull(
        &self,
        subscription: &str,
        settings: StreamSettings,
    ) -> Result<MessageStream> {
        let deadline = std::time::Instant::now() + self.request_timeout;
        let opening = self.open_streaming_pull(subscription, settings);
        crate::timer::run_until(deadline, opening).await.unwrap_or_else(|| {
            Err(Error::DeadlineExceeded(format!(
                "opening a streaming pull of '{subscription}' took longer than {:?}",
                self.request_timeout
            )))
        })
    }

    async fn open_streaming_pull(
        &self,
        subscription: &str,
        settings: StreamSettings,
    ) -> Result<MessageStream> {
        let request = StreamingPullRequest {
            subscription: subscription.to_owned(),
            stream_ack_deadline_seconds: settings.stream_ack_deadline_seconds,
            max_outstanding_messages: settings.max_outstanding_messages,
            max_outstanding_bytes: settings.max_outstanding_bytes,
        };
        let mut routings = 1;
        let mut passes = 0;
        loop {
            let route = self.route(Resource::Subscription, subscription).await?;
            let address = route[0].clone();
            let security = self.security.clone();
            let connecting = address.clone();
            // A forwarder that cannot be reached is passed over for the route's next (another
            // node's, which carries the stream to the source's leader), each at most once.
            let failed = |error: Error, passes: &mut usize| {
                if crate::retry::is_connection_failure(&error) && *passes + 1 < route.len() {
                    *passes += 1;
                    self.pass_over(Resource::Subscription, subscription, &address);
                    return None;
                }
                Some(error)
            };
            let connection = match off_thread(move || Connection::connect_with(&connecting, &security)).await
            {
                Ok(connection) => connection,
                Err(error) => match failed(error, &mut passes) {
                    None => continue,
                    Some(error) => return Err(error),
                },
            };
            let receiver = connection.open_stream(Command::StreamingPull.code(), &request)?;
            let mut stream = MessageStream { receiver };
            // The forwarder answers a new stream with an empty batch when it takes it, or with
            // an error (unknown subscription, not the owner) when it does not.
            match stream.next().await {
                Some(Ok(_accepted)) => return Ok(stream),
                Some(Err(Error::Status(status)))
                    if status.code == ErrorCode::NotOwner && routings < STREAM_ROUTING_ATTEMPTS_MAX =>
                {
                    routings += 1;
                    self.forget(Resource::Subscription, subscription);
                }
                Some(Err(error)) => match failed(error, &mut passes) {
                    None => continue,
                    Some(error) => return Err(error),
                },
                None => match failed(Error::Closed(address.clone()), &mut passes) {
                    None => continue,
                    Some(error) => return Err(error),
                },
            }
        }
    }
}
