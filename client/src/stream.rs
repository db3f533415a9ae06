//! Streaming pull: the server pushes batches while the stream's flow-control window has room;
//! acknowledgements go through the ordinary `acknowledge` and free the window.
//!
//! A [`MessageStream`] is one stream on one connection: it ends when its connection fails (the
//! forwarder's node died, the daemon restarted). A [`ResumingStream`] opens the stream again
//! after such a failure, as the daemon's relay does for a stream it carries: after the failed
//! forwarder is passed over or the route looked up again, with backoff, for at most the time
//! it was given. Messages leased on the broken stream come back by redelivery (at least once);
//! acknowledgements of their ack ids are still worth sending, and may be refused.

use crate::connection::StreamReceiver;
use crate::retry::{self, Backoff, RetrySettings};
use crate::sources::Target;
use crate::{decode, off_thread, timer, Client, Connection, Error, ReceivedMessage, Resource, Result};
use ringpost_wire::messages::{PullResponse, StreamingPullRequest};
use ringpost_wire::{Command, ErrorCode};
use std::time::{Duration, Instant};

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

/// The longest wait between two attempts to open a broken stream again: a cluster elects a
/// lost topic leader's successor within seconds, and a restarted daemon serves within
/// seconds, so a longer wait would only add to the subscriber's pause.
pub const STREAM_REOPEN_DELAY_MAX: Duration = Duration::from_secs(10);

/// The backoff between attempts to open a broken stream again: Pub/Sub's for pull, capped at
/// `STREAM_REOPEN_DELAY_MAX`.
pub const STREAM_REOPEN_RETRY: RetrySettings =
    RetrySettings { delay_max: STREAM_REOPEN_DELAY_MAX, ..RetrySettings::SUBSCRIBE };

/// Whether a stream that failed with `error` is worth opening again: its connection failed,
/// or the forwarder could not serve it for now (`Unavailable`, `ResourceExhausted`) or no
/// longer serves it (`NotOwner`: a replicated topic's leader is being elected). Anything else
/// (`NotFound`, `PermissionDenied`, ...) would fail again.
pub fn is_worth_reopening(error: &Error) -> bool {
    retry::is_retryable(error) || matches!(error, Error::Status(status) if status.code == ErrorCode::NotOwner)
}

/// What a [`ResumingStream`] has to tell.
#[derive(Debug)]
pub enum StreamEvent {
    /// A batch of messages (never empty).
    Messages(Vec<ReceivedMessage>),
    /// The stream broke with this error; the next `next` opens it again. The messages it had
    /// leased come back by redelivery.
    Broken(Error),
    /// The stream is open again, after this long since it broke.
    Reopened(Duration),
}

/// A streaming pull that opens itself again when it breaks, for at most `reopen_for` after
/// each break (see the module docs). Made by [`Client::resuming_streaming_pull`].
pub struct ResumingStream<'a> {
    client: &'a Client,
    subscription: String,
    settings: StreamSettings,
    /// `None` between a break and the stream opened again.
    stream: Option<MessageStream>,
    reopen_for: Duration,
    /// When the stream broke, and why (the last attempt's failure once attempts were made).
    broken: Option<(Instant, Error)>,
    backoff: Backoff,
    reopened: u64,
}

impl ResumingStream<'_> {
    /// The next event: messages, a break, or the stream open again. `Err` when the stream
    /// failed in a way that opening it again cannot mend (the subscription was deleted, the
    /// credential refused), or could not be opened again within `reopen_for` of its break
    /// (`DeadlineExceeded`, naming the last failure).
    pub async fn next(&mut self) -> Result<StreamEvent> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return self.reopen().await;
            };
            let error = match stream.next().await {
                Some(Ok(batch)) if batch.is_empty() => continue,
                Some(Ok(batch)) => return Ok(StreamEvent::Messages(batch)),
                Some(Err(error)) => error,
                // The server ended the stream (it stops): open another, as after a failure.
                None => Error::Closed(format!("the stream of '{}' (ended by the server)", self.subscription)),
            };
            if !is_worth_reopening(&error) {
                return Err(error);
            }
            self.stream = None;
            self.client.after_stream_failure(&self.subscription, &error);
            self.backoff = Backoff::new(STREAM_REOPEN_RETRY);
            self.broken = Some((Instant::now(), error.duplicate()));
            return Ok(StreamEvent::Broken(error));
        }
    }

    /// How often the stream was opened again.
    pub fn reopened(&self) -> u64 {
        self.reopened
    }

    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Opens the broken stream again, waiting out the backoff before each attempt, until
    /// `reopen_for` has passed since it broke.
    async fn reopen(&mut self) -> Result<StreamEvent> {
        let (broken_at, _) = self.broken.as_ref().expect("a stream is open or broken");
        let broken_at = *broken_at;
        let deadline = broken_at + self.reopen_for;
        loop {
            let delay = self.backoff.next_delay();
            if Instant::now() + delay >= deadline {
                let (_, last) = self.broken.take().expect("a stream is open or broken");
                // Kept broken: a later `next` tries once more, with a new bound.
                self.broken = Some((Instant::now(), last.duplicate()));
                return Err(Error::DeadlineExceeded(format!(
                    "the stream of '{}' broke and was not opened again within {:?} (last attempt: {}: {last})",
                    self.subscription,
                    self.reopen_for,
                    last.code()
                )));
            }
            timer::sleep(delay).await;
            let opening = self.client.streaming_pull(&self.subscription, self.settings.clone());
            let outcome = timer::run_until(deadline, opening).await.unwrap_or_else(|| {
                Err(Error::DeadlineExceeded(format!(
                    "opening the stream of '{}' again took past its bound",
                    self.subscription
                )))
            });
            match outcome {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.broken = None;
                    self.reopened += 1;
                    return Ok(StreamEvent::Reopened(broken_at.elapsed()));
                }
                Err(error) if is_worth_reopening(&error) || matches!(error, Error::DeadlineExceeded(_)) => {
                    self.client.after_stream_failure(&self.subscription, &error);
                    self.broken = Some((broken_at, error));
                }
                Err(error) => return Err(error),
            }
        }
    }
}

impl Client {
    /// Opens a streaming pull that opens itself again when it breaks (see [`ResumingStream`]),
    /// each time within `reopen_for` of the break. Opening it the first time is as
    /// `streaming_pull`: its failure is returned.
    pub async fn resuming_streaming_pull(
        &self,
        subscription: &str,
        settings: StreamSettings,
        reopen_for: Duration,
    ) -> Result<ResumingStream<'_>> {
        let stream = self.streaming_pull(subscription, settings.clone()).await?;
        Ok(ResumingStream {
            client: self,
            subscription: subscription.to_owned(),
            settings,
            stream: Some(stream),
            reopen_for,
            broken: None,
            backoff: Backoff::new(STREAM_REOPEN_RETRY),
            reopened: 0,
        })
    }

    /// After a stream of `subscription` failed with `error`, before it is opened again: a
    /// forwarder that refused it (`NotOwner`, `Unavailable`) is looked up again. A failed
    /// connection was passed over in the route already, as the stream tried to open (or is
    /// found closed as the next one does), so no router is needed while another forwarder of
    /// the route serves.
    pub(crate) fn after_stream_failure(&self, subscription: &str, error: &Error) {
        if retry::needs_new_route(error) && !retry::is_connection_failure(error) {
            self.forget(Resource::Subscription, subscription);
        }
    }

    /// Opens a streaming pull on its own connection to the forwarder that owns the
    /// subscription's source 0 (its topic's own log, the only one of a topic of one source).
    /// Opening it (the lookup, the connection, the forwarder's acceptance) has the client's
    /// request timeout; the open stream has no deadline. A [`crate::Subscriber`] gathers every
    /// source; `streaming_pull_source` opens one on another.
    pub async fn streaming_pull(
        &self,
        subscription: &str,
        settings: StreamSettings,
    ) -> Result<MessageStream> {
        self.streaming_pull_source(subscription, 0, settings).await
    }

    /// `streaming_pull` of the subscription's source `source`.
    pub async fn streaming_pull_source(
        &self,
        subscription: &str,
        source: u32,
        settings: StreamSettings,
    ) -> Result<MessageStream> {
        let deadline = std::time::Instant::now() + self.request_timeout;
        let opening = self.open_streaming_pull(subscription, source, settings);
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
        source: u32,
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
            let (source, route) =
                self.route(Resource::Subscription, subscription, Target::Source(source)).await?;
            let address = route[0].clone();
            let security = self.security.clone();
            let connecting = address.clone();
            // A forwarder that cannot be reached is passed over for the route's next (another
            // node's, which carries the stream to the source's leader), each at most once. The
            // last one is passed over too, but returns the failure: the route is then looked up
            // again by the next attempt (a restarted daemon's forwarder may have moved).
            let failed = |error: Error, passes: &mut usize| {
                if crate::retry::is_connection_failure(&error) {
                    self.pass_over(Resource::Subscription, subscription, source, &address);
                    if *passes + 1 < route.len() {
                        *passes += 1;
                        return None;
                    }
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
