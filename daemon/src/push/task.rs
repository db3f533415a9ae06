//! The pushing tasks of one forwarder shard.
//!
//! `serve` runs for the shard's life and starts a task per push subscription when one is
//! attached with a push config or updated to have one (`ShardPushing::offer`). Each task opens a
//! delivery stream through the shard's `DataPlane`, as a client's streaming pull would: the
//! stream leases messages within the task's window, the task sends each as one request and
//! acknowledges it on a success status, or gives it back with `modify_ack_deadline(.., 0)` on
//! anything else, so that the subscription's retry backoff, attempt count and dead-lettering
//! apply as they do to a pull subscriber's nack. An ordering key's next message is leased only
//! once the one before it was acknowledged (the subscription's state holds it back), so keys
//! keep their order with one message in flight each.
//!
//! A task stops, and its stream's leases are given back at once, when its subscription is
//! updated to pull, deleted, detached, moved to another leader (all of which detach it or
//! clear its push config, and notify its `changed`), or the shard stops. A push outstanding
//! then still acknowledges on success: the message was delivered.

use super::body::{push_body, PushedMessage};
use super::client::{outcome_class, PUSH_OUTCOME_CLASSES};
use super::window::{Answer, Window};
use super::{PushOutcome, PushRequest, Pusher};
use crate::api::data::{DataPlane, DeliveryStream, StreamPeer, StreamSettings};
use crate::shard::Forwarder;
use crate::storage::Storage;
use crate::subscription::SubscriptionEntry;
use crate::sync::{Notify, Stop};
use futures_lite::future::or;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Bytes of push bodies a shard holds in flight, all its push subscriptions together: a slow
/// receiver holds its window's bodies until it answers, and a shard of many push
/// subscriptions must not hold them all without bound. A subscription leases more only while
/// the shard is below it, so the shard holds at most this plus one delivery per subscription
/// (each at most `PUSH_SUBSCRIPTION_BYTES_MAX`, or one message larger than that).
pub const PUSH_BODY_BYTES_SHARD_MAX: usize = 64 << 20;
/// Bytes of messages one push subscription has leased and not yet had answered: its share,
/// whatever its window, so that one subscription of large messages cannot take the shard's
/// whole budget for bodies.
pub const PUSH_SUBSCRIPTION_BYTES_MAX: u64 = 16 << 20;
/// How long past its timeout the shard waits for the HTTP client's answer to a push before
/// it counts the push as timed out itself: the client times its requests out, and this only
/// keeps a wedged client from holding a window slot for good.
pub const PUSH_ANSWER_GRACE: Duration = Duration::from_secs(5);
/// Subscriptions waiting to be looked at by the shard's `serve`: each attach or update of a
/// push subscription offers one, and `serve` takes them all at its next turn. Beyond it an
/// offer is dropped and the subscriptions are walked instead (`ShardPushing::walk_all`).
pub const PUSH_OFFERS_QUEUED_MAX: usize = 1_024;

/// What a shard's pushing shares: subscriptions offered for a task, the bytes of bodies in
/// flight, and whether `serve` runs (a shard without an HTTP client pushes nothing).
#[derive(Default)]
pub struct ShardPushing {
    offered: RefCell<Vec<Rc<SubscriptionEntry>>>,
    /// Offers were dropped at `PUSH_OFFERS_QUEUED_MAX`: the next turn walks every subscription.
    walk_all: Cell<bool>,
    wake: Notify,
    serving: Cell<bool>,
    body_bytes: Cell<usize>,
    /// Fires when bodies in flight end.
    body_freed: Notify,
    /// The flight of each subscription a task pushes, by name, for stats and metrics.
    flights: RefCell<HashMap<Rc<str>, Rc<Flight>>>,
}

impl ShardPushing {
    /// A subscription was attached or updated: if it pushes and no task pushes it, one starts.
    pub fn offer(&self, entry: &Rc<SubscriptionEntry>) {
        if !self.serving.get() || !entry.push.is_some() || entry.pushing.get() {
            return;
        }
        let mut offered = self.offered.borrow_mut();
        if offered.len() < PUSH_OFFERS_QUEUED_MAX {
            offered.push(entry.clone());
        } else {
            self.walk_all.set(true);
        }
        drop(offered);
        self.wake.notify_all();
    }

    /// The flight of the subscription's task, while one pushes it.
    pub fn flight(&self, subscription: &str) -> Option<Rc<Flight>> {
        self.flights.borrow().get(subscription).cloned()
    }

    /// Every flight, by subscription, while their tasks push.
    pub fn flights(&self) -> Vec<(Rc<str>, Rc<Flight>)> {
        self.flights.borrow().iter().map(|(name, flight)| (name.clone(), flight.clone())).collect()
    }

    /// Bytes of push bodies the shard holds in flight.
    pub fn body_bytes(&self) -> usize {
        self.body_bytes.get()
    }

    fn charge(&self, bytes: usize) {
        self.body_bytes.set(self.body_bytes.get() + bytes);
    }

    fn release(&self, bytes: usize) {
        debug_assert!(self.body_bytes.get() >= bytes);
        self.body_bytes.set(self.body_bytes.get().saturating_sub(bytes));
        self.body_freed.notify_all();
    }

    /// Waits until the shard's bodies in flight are below `PUSH_BODY_BYTES_SHARD_MAX`.
    async fn room(&self, peer: &PushPeer<'_>) {
        loop {
            let freed = self.body_freed.notified();
            if self.body_bytes.get() < PUSH_BODY_BYTES_SHARD_MAX || peer.is_gone() {
                return;
            }
            or(freed, peer.gone()).await;
        }
    }
}

/// Runs the shard's push tasks until it stops: one per push subscription it serves.
pub async fn serve<S: Storage, P: Pusher>(forwarder: Rc<Forwarder<S>>, pusher: Rc<P>) {
    let pushing = &forwarder.pushing;
    pushing.serving.set(true);
    pushing.walk_all.set(true);
    let stop = forwarder.environment.stop.clone();
    loop {
        let woken = pushing.wake.notified();
        let mut offered = std::mem::take(&mut *pushing.offered.borrow_mut());
        if pushing.walk_all.replace(false) {
            let subscriptions = forwarder.registry.subscriptions.borrow();
            offered.extend(subscriptions.values().map(|(entry, _)| entry.clone()));
        }
        for entry in offered {
            if !entry.push.is_some() || entry.detached.get() || entry.pushing.get() {
                continue;
            }
            entry.pushing.set(true);
            // No borrow is held here: the task runs to its first wait before `spawn` returns.
            crate::runtime::spawn(push_subscription(forwarder.clone(), entry, pusher.clone())).detach();
        }
        if stop.is_given() {
            return;
        }
        or(woken, stop.given()).await;
    }
}

/// The end of a push task's stream, as the stream sees it: gone once the subscription no longer
/// pushes (updated to pull, deleted, detached, moved) or the shard stops.
struct PushPeer<'a> {
    entry: &'a SubscriptionEntry,
    stop: &'a Stop,
}

impl StreamPeer for PushPeer<'_> {
    fn is_gone(&self) -> bool {
        !self.entry.push.is_some() || self.entry.detached.get() || self.stop.is_given()
    }

    async fn gone(&self) {
        loop {
            // Registered before looking: an update between the look and the wait wakes it.
            let changed = self.entry.changed.notified();
            if self.is_gone() {
                return;
            }
            or(changed, self.stop.given()).await;
        }
    }
}

/// One push subscription's flight: its window, its pushes outstanding and what they hold, and
/// how its pushes ended (for `ringpost stats` and `/metrics`).
#[derive(Default)]
pub struct Flight {
    pub window: RefCell<Window>,
    pub outstanding: Cell<u32>,
    /// Fires when a push is answered.
    pub answered: Notify,
    /// How the last push that did not acknowledge ended, and when (`runtime::now`). Kept after
    /// the pushes that succeed since: an operator looking into an endpoint that failed for a
    /// while wants its reason after it recovered, and `failures_in_a_row` says whether it
    /// still fails.
    pub last_error: RefCell<Option<String>>,
    pub last_error_at: Cell<Option<Instant>>,
    /// Pushes that did not acknowledge since the last one that did.
    pub failures_in_a_row: Cell<u64>,
    /// Pushes answered, by outcome, in the order of `client::PUSH_OUTCOME_CLASSES`: counted
    /// here, where the outcome comes back to the shard, so they are the subscription's own.
    pub requests_by_class: Cell<[u64; PUSH_OUTCOME_CLASSES.len()]>,
}

impl Flight {
    /// Counts how a push ended.
    fn count(&self, outcome: &PushOutcome) {
        let mut requests = self.requests_by_class.get();
        requests[outcome_class(outcome)] += 1;
        self.requests_by_class.set(requests);
        if outcome.acknowledges() {
            self.failures_in_a_row.set(0);
        } else {
            *self.last_error.borrow_mut() = Some(describe(outcome));
            self.last_error_at.set(Some(crate::runtime::now()));
            self.failures_in_a_row.set(self.failures_in_a_row.get() + 1);
        }
    }
}

async fn push_subscription<S: Storage, P: Pusher>(
    forwarder: Rc<Forwarder<S>>,
    entry: Rc<SubscriptionEntry>,
    pusher: Rc<P>,
) {
    let flight = Rc::new(Flight::default());
    forwarder.pushing.flights.borrow_mut().insert(entry.name.clone(), flight.clone());
    push_until_gone(&forwarder, &entry, &pusher, &flight).await;
    let mut flights = forwarder.pushing.flights.borrow_mut();
    if flights.get(&entry.name).is_some_and(|running| Rc::ptr_eq(running, &flight)) {
        flights.remove(&entry.name);
    }
    drop(flights);
    entry.pushing.set(false);
    // Updated to pull and back to push before this task saw the first: push again.
    forwarder.pushing.offer(&entry);
}

async fn push_until_gone<S: Storage, P: Pusher>(
    forwarder: &Rc<Forwarder<S>>,
    entry: &Rc<SubscriptionEntry>,
    pusher: &Rc<P>,
    flight: &Rc<Flight>,
) {
    let peer = PushPeer { entry, stop: &forwarder.environment.stop };
    // The stream must be this entry's: a subscription deleted and made again under its name is
    // another entry, with its own task.
    match forwarder.subscription(&entry.name) {
        Ok((served, _)) if Rc::ptr_eq(&served, entry) => {}
        _ => return,
    }
    let settings = StreamSettings {
        lease: None,
        max_outstanding_messages: flight.window.borrow().size() as u64,
        max_outstanding_bytes: PUSH_SUBSCRIPTION_BYTES_MAX,
        leases_outlive_stream: false,
    };
    let Ok(mut stream) = forwarder.open_stream(&entry.name, settings).await else { return };
    // The stream's leases run for the ack deadline it was opened with; a push's timeout is the
    // same, so an unanswered push is given back no later than its lease would end.
    let timeout = entry.state.borrow().ack_deadline();
    loop {
        loop {
            let answered = flight.answered.notified();
            if peer.is_gone() {
                return;
            }
            if flight.outstanding.get() < flight.window.borrow().size() {
                break;
            }
            or(answered, peer.gone()).await;
        }
        forwarder.pushing.room(&peer).await;
        // An endpoint failing at the window's floor: wait before trying it again.
        let pause = flight.window.borrow().pause();
        if !pause.is_zero() {
            or(crate::runtime::sleep(pause), peer.gone()).await;
            if peer.is_gone() {
                return;
            }
        }
        stream.set_max_outstanding_messages(flight.window.borrow().size() as u64);
        let delivery = match stream.next(&peer).await {
            Ok(Some(delivery)) => delivery,
            // Gone, deleted, moved or stopping: the stream's leases go back as it drops.
            Ok(None) | Err(_) => return,
        };
        let Some(config) = entry.push.get() else { return };
        let counts_attempts = entry.dead_letter_topic.is_some();
        for message in &delivery.messages {
            let view = delivery.view(message);
            let body = push_body(
                &config,
                &entry.name,
                PushedMessage {
                    message_id: view.message_id,
                    publish_time_ms: view.publish_time_ms,
                    data: view.data,
                    ordering_key: view.ordering_key,
                    attributes: view.attributes,
                    delivery_attempt: counts_attempts.then_some(view.delivery_attempt),
                },
            );
            let bytes = body.body.len();
            forwarder.pushing.charge(bytes);
            flight.outstanding.set(flight.outstanding.get() + 1);
            let request = PushRequest {
                endpoint: config.endpoint.clone(),
                body,
                timeout,
                oidc_token: config.oidc_token.clone(),
            };
            let push = push_one(
                forwarder.clone(),
                entry.name.clone(),
                pusher.clone(),
                flight.clone(),
                request,
                view.ack_id.to_owned(),
                bytes,
            );
            crate::runtime::spawn(push).detach();
        }
        // The delivery's batches and its share of the response budget go now: the bodies are
        // copies.
        drop(delivery);
    }
}

/// Sends one push and acknowledges or gives back its message by the answer.
async fn push_one<S: Storage, P: Pusher>(
    forwarder: Rc<Forwarder<S>>,
    subscription: Rc<str>,
    pusher: Rc<P>,
    flight: Rc<Flight>,
    request: PushRequest,
    ack_id: String,
    bytes: usize,
) {
    let started = crate::runtime::now();
    let timeout = request.timeout;
    let outcome = or(pusher.push(request), async {
        crate::runtime::sleep(timeout + PUSH_ANSWER_GRACE).await;
        PushOutcome::Timeout
    })
    .await;
    let elapsed = crate::runtime::now().saturating_duration_since(started);
    let answer = match outcome.acknowledges() {
        // An answer after half the deadline is a receiver near its limit: the window shrinks
        // before answers turn into timeouts.
        true if elapsed * 2 > timeout => Answer::Slow,
        true => Answer::Success,
        false => Answer::Failure,
    };
    // Refusals of the ack id (the subscription deleted or re-made meanwhile, the lease taken
    // back) leave nothing to do: the message is delivered again or no longer wanted.
    let ack_ids = std::iter::once(ack_id.as_str());
    flight.count(&outcome);
    if answer == Answer::Failure {
        let _ = forwarder.modify_ack_deadline(&subscription, ack_ids, 0).await;
    } else {
        let _ = forwarder.acknowledge(&subscription, ack_ids).await;
    }
    flight.window.borrow_mut().on_answer(answer);
    flight.outstanding.set(flight.outstanding.get() - 1);
    forwarder.pushing.release(bytes);
    flight.answered.notify_all();
}

/// An outcome that did not acknowledge, for the operator.
fn describe(outcome: &PushOutcome) -> String {
    match outcome {
        PushOutcome::Status(status) => format!("HTTP status {status}"),
        PushOutcome::ConnectionError(reason) => format!("connection error: {reason}"),
        PushOutcome::Timeout => "no answer within the ack deadline".to_owned(),
    }
}
