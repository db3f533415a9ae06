//! Pulls and streaming pulls: leasing what a subscriber may take, within the shard's budget
//! for responses and the stream's flow-control window, and waiting for more (a commit, a lease
//! or backoff ending, an acknowledgement, the caller's deadline) without ever holding the
//! shard's core.

use super::budget::{StreamReservation, PULL_RESPONSE_BYTES_MAX};
use super::source::{AckJournal, MessageSource};
use super::SubscriptionError;
use super::{dead_letter, delivery, Environment, SubscriptionEntry};
use crate::api::data::{DataError, Delivery, DeliveryStream, PullSettings, StreamPeer, StreamSettings};
use crate::api::limits::PULL_MESSAGES_MAX;
use crate::sync::Notified;
use futures_lite::future::or;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long an idle stream sleeps before it looks again on its own, a safety net only: commits,
/// acks, nacks, lease and backoff expiries (its own timer and the shard's sweep) and the
/// subscription's deletion wake it. Long, because each idle stream's timer costs its shard a
/// little CPU at every wake.
const STREAM_IDLE_CHECK: Duration = Duration::from_secs(30);
/// How long a pull waits at least when a replicated topic's leader is not sure it leads: for
/// its lease's renewal, or for a new leader's `LEASE_WAIT` (1.25 s) to pass.
const LEASE_RENEWAL_WAIT: Duration = Duration::from_secs(2);
/// The shortest sleep of a pull or stream waiting for a deadline. Each takes back expired
/// leases before it reads the next deadline, so that deadline is in the future; were it ever
/// not, a sleep of zero would return at once without yielding and the loop would hold the
/// shard's core for good, with every topic the shard serves. Far below the second that ack
/// deadlines are counted in.
pub const DEADLINE_SLEEP_MIN: Duration = Duration::from_millis(1);

/// A timer for a loop that waits until `deadline`: never shorter than `DEADLINE_SLEEP_MIN`, so
/// the loop yields the shard even when its deadline has passed.
async fn sleep_until(now: Instant, deadline: Instant) {
    crate::runtime::sleep(deadline.saturating_duration_since(now).max(DEADLINE_SLEEP_MIN)).await
}

/// Resolves when the shard's response budget has room again, if `waiting`; never otherwise.
async fn budget_freed(environment: &Environment, waiting: bool) {
    match waiting {
        true => environment.stream_budget.freed().await,
        false => std::future::pending().await,
    }
}

/// Resolves when the topic's and shard's outstanding counts have room again, if `waiting`;
/// never otherwise.
async fn room_freed(freed: Option<Notified>, waiting: bool) {
    match (freed, waiting) {
        (Some(freed), true) => freed.await,
        _ => std::future::pending().await,
    }
}

/// Whether a pull or stream that leased nothing waits for the topic's or shard's outstanding
/// limits (`outstanding`): there is something to deliver, and no room. Counted once per pause.
fn paused_by_limits<T: MessageSource>(
    subscription: &SubscriptionEntry,
    topic: &T,
    counted: &mut bool,
) -> bool {
    let state = subscription.state.borrow();
    let paused = state.room().is_full() && state.has_deliverable(topic.end_offset());
    if let (true, false, Some(tally)) = (paused, *counted, state.tally()) {
        let shard = tally.shard();
        shard.paused_total.set(shard.paused_total.get() + 1);
    }
    *counted = paused;
    paused
}

/// A peer that stays: for pulls whose caller cannot tell when its client leaves.
pub struct NeverGone;

impl StreamPeer for NeverGone {
    fn is_gone(&self) -> bool {
        false
    }
    async fn gone(&self) {
        std::future::pending().await
    }
}

/// A unary pull: leases up to `settings.max_messages`, waiting up to `settings.wait` for a
/// first one. `None` when there was none, the shard is stopping, or `peer` went while it
/// waited (it answers with nothing rather than hold the caller, or a connection nobody is at
/// any more, until its wait ends).
pub async fn pull<T: MessageSource + AckJournal + 'static>(
    environment: &Environment,
    subscription: &Rc<SubscriptionEntry>,
    topic: &Rc<T>,
    settings: PullSettings,
    peer: &impl StreamPeer,
) -> Result<Option<Delivery<T::Batch>>, SubscriptionError> {
    let clock = &environment.clock;
    subscription.last_activity_ms.set(clock.wall_ms());
    let started = clock.now();
    let mut give_up_at = started + settings.wait;
    let lease = subscription.state.borrow().ack_deadline();
    let mut paused = false;
    loop {
        if subscription.detached.get() {
            return Err(subscription.deleted());
        }
        if environment.stop.is_given() || peer.is_gone() {
            return Ok(None);
        }
        let committed = topic.committed();
        let changed = subscription.changed.notified();
        let (freed, room) = {
            let state = subscription.state.borrow();
            (state.tally().map(|tally| tally.shard().freed()), state.room())
        };
        let now = clock.now();
        // The response's bytes come out of the shard's budget for pulls and streams first
        // (`STREAM_RESERVED_BYTES_SHARD_MAX`): a thousand pulls of large messages at once
        // would otherwise each hold a full response. Without room, nothing is leased and
        // the pull waits (expired leases are still taken back, and its wait still ends).
        // A replicated topic's leader delivers only while it knows it leads; a pull that
        // finds it unsure waits for the answer (its followers are asked), however short its
        // own wait, or a pull that never waits would find nothing on a quiet topic.
        let unsure_until = topic.may_deliver(now).err();
        if unsure_until.is_some() {
            give_up_at = give_up_at.max(started + LEASE_RENEWAL_WAIT);
        }
        let reservation =
            environment.stream_budget.try_reserve(PULL_RESPONSE_BYTES_MAX).filter(|_| unsure_until.is_none());
        let waiting_for_budget = reservation.is_none() && unsure_until.is_none();
        let leases = match reservation {
            Some(_) => subscription.state.borrow_mut().pull_for(
                now,
                settings.max_messages,
                topic.end_offset(),
                0,
                lease,
            ),
            None => {
                subscription.state.borrow_mut().expire(now);
                Vec::new()
            }
        };
        dead_letter::start(environment, subscription, topic);
        if let (false, Some(reservation)) = (leases.is_empty(), reservation) {
            // Within the topic's and shard's outstanding bytes (the first message always goes).
            let bytes = Some(room.bytes);
            if let Some(delivery) = delivery::read(subscription, &**topic, leases, bytes, reservation).await?
            {
                return Ok(Some(delivery));
            }
            // Everything read was filtered out or held behind its ordering key: look again.
            continue;
        }
        if now >= give_up_at {
            return Ok(None);
        }
        // Beyond the outstanding limits it waits as for messages, until a give-back makes room.
        let waiting_for_room = paused_by_limits(subscription, &**topic, &mut paused);
        // `pull_for` took back expired leases, so the next deadline is after `now`.
        let mut wake_at = give_up_at;
        if let Some(deadline) = subscription.state.borrow().next_deadline() {
            wake_at = wake_at.min(deadline);
        }
        if let Some(retry_at) = unsure_until {
            wake_at = wake_at.min(retry_at);
        }
        // A stop wakes it through `changed` (the shard's `wake_for_stop`).
        let wake = or(or(committed, changed), peer.gone());
        let freed = room_freed(freed, waiting_for_room);
        or(or(wake, sleep_until(now, wake_at)), or(budget_freed(environment, waiting_for_budget), freed))
            .await;
    }
}

/// A streaming pull: delivers while its flow-control window has room, until the peer goes.
/// Dropped, it ends: its outstanding messages are delivered again at once, or, when its
/// settings say the client reconnects (`leases_outlive_stream`), at their deadlines.
pub struct Stream<'a, T> {
    environment: &'a Environment,
    subscription: Rc<SubscriptionEntry>,
    topic: Rc<T>,
    id: u64,
    lease: Duration,
    max_messages: u64,
    max_bytes: u64,
    leases_outlive: bool,
    /// Waiting for the topic's or shard's outstanding limits, counted once (`paused_by_limits`).
    paused: bool,
}

impl<'a, T> Stream<'a, T> {
    pub fn open(
        environment: &'a Environment,
        subscription: Rc<SubscriptionEntry>,
        topic: Rc<T>,
        settings: StreamSettings,
    ) -> Stream<'a, T> {
        let lease = settings.lease.unwrap_or_else(|| subscription.state.borrow().ack_deadline());
        let id = environment.next_stream.get();
        environment.next_stream.set(id + 1);
        subscription.last_activity_ms.set(environment.clock.wall_ms());
        Stream {
            environment,
            subscription,
            topic,
            id,
            lease,
            max_messages: settings.max_outstanding_messages,
            max_bytes: settings.max_outstanding_bytes,
            leases_outlive: settings.leases_outlive_stream,
            paused: false,
        }
    }

    /// Changes the stream's window of outstanding messages, from its next delivery on: a push
    /// subscription's window follows its endpoint (`push::window`), where a client's is fixed.
    pub fn set_max_outstanding_messages(&mut self, messages: u64) {
        self.max_messages = messages.max(1);
    }
}

impl<T> Drop for Stream<'_, T> {
    fn drop(&mut self) {
        let mut state = self.subscription.state.borrow_mut();
        if self.leases_outlive {
            state.detach_stream(self.id);
        } else {
            state.close_stream(self.id);
        }
        drop(state);
        self.subscription.changed.notify_all();
    }
}

impl<T: MessageSource + AckJournal + 'static> DeliveryStream for Stream<'_, T> {
    type Batch = T::Batch;

    fn stopping(&self) -> bool {
        self.environment.stop.is_given()
    }

    async fn next(&mut self, peer: &impl StreamPeer) -> Result<Option<Delivery<T::Batch>>, DataError> {
        let subscription = &self.subscription;
        loop {
            if self.environment.stop.is_given() {
                // Checked before the peer: a stopping shard also stops reading the connection,
                // which looks like the peer going, and the client must see a status it retries
                // on rather than a stream that ended as if it had asked.
                return Err(SubscriptionError::Stopping.into());
            }
            if peer.is_gone() {
                return Ok(None);
            }
            if subscription.detached.get() {
                return Err(subscription.deleted().into());
            }
            let committed = self.topic.committed();
            let changed = subscription.changed.notified();
            let freed = subscription.state.borrow().tally().map(|tally| tally.shard().freed());
            let now = self.environment.clock.now();
            // A replicated topic's leader delivers only while it knows it leads.
            let unsure_until = self.topic.may_deliver(now).err();
            let (leases, reservation, bytes_room, first) = match unsure_until {
                None => self.lease_what_fits(now),
                Some(_) => {
                    if subscription.state.borrow_mut().expire(now) > 0 {
                        subscription.changed.notify_all();
                    }
                    (Vec::new(), None, 0, false)
                }
            };
            let waiting_for_budget = reservation.is_none() && bytes_room > 0;
            dead_letter::start(self.environment, subscription, &self.topic);
            if let (false, Some(reservation)) = (leases.is_empty(), reservation) {
                // The first message always fits an empty window, so one larger than the window
                // cannot stall the stream forever.
                let budget = if first { bytes_room.max(1) } else { bytes_room };
                let budget = budget.min((reservation.bytes() / 2).max(1) as u64);
                match delivery::read(subscription, &*self.topic, leases, Some(budget), reservation).await? {
                    Some(delivery) => {
                        self.paused = false;
                        return Ok(Some(delivery));
                    }
                    None => continue,
                }
            }
            // Beyond the outstanding limits it sends nothing until a give-back makes room.
            let waiting_for_room = paused_by_limits(subscription, &*self.topic, &mut self.paused);
            let mut wake_at = now + STREAM_IDLE_CHECK;
            if let Some(deadline) = subscription.state.borrow().next_deadline() {
                wake_at = wake_at.min(deadline);
            }
            if let Some(retry_at) = unsure_until {
                wake_at = wake_at.min(retry_at);
            }
            let wake = or(or(committed, changed), sleep_until(now, wake_at));
            // A stop ends the connection's reading, which wakes this through `gone`; the stop
            // is checked first above. (Waiting on the stop order itself would register every
            // idle stream with one shard-wide notifier.)
            let freed = room_freed(freed, waiting_for_room);
            or(or(wake, peer.gone()), or(budget_freed(self.environment, waiting_for_budget), freed)).await;
        }
    }
}

impl<T: MessageSource> Stream<'_, T> {
    /// Takes back expired leases, then leases what the window and the shard's response budget
    /// have room for. Returns the leases, their reservation (`None` when the budget had no
    /// room: the stream then waits with its messages in the log), the window's room in bytes
    /// (0 when the window is full) and whether the window was empty.
    fn lease_what_fits(
        &self,
        now: Instant,
    ) -> (Vec<super::state::Delivery>, Option<StreamReservation>, u64, bool) {
        let subscription = &self.subscription;
        // Expired leases are taken back first, whether this stream has room or not: they
        // free room here (an expired lease leaves its stream's window), they go to other
        // streams and pulls (woken below), and they move the next deadline past `now`.
        // A full stream that skipped this slept zero on a deadline in the past and spun,
        // holding the shard's core with every topic it serves.
        let (load, expired, limits_room) = {
            let mut state = subscription.state.borrow_mut();
            let expired = state.expire(now);
            (state.stream_load(self.id), expired, state.room())
        };
        if expired > 0 {
            subscription.changed.notify_all();
        }
        let room = self.max_messages.saturating_sub(load.messages).min(PULL_MESSAGES_MAX as u64) as usize;
        // The topic's and shard's outstanding bytes bound it beside the stream's window (their
        // messages `pull_for` bounds).
        let bytes_room = self.max_bytes.saturating_sub(load.bytes).min(limits_room.bytes);
        if room == 0 || bytes_room == 0 {
            return (Vec::new(), None, 0, load.messages == 0);
        }
        let want = bytes_room.min(PULL_RESPONSE_BYTES_MAX as u64) as usize;
        // Twice: while a response is built, the batches read and the frame copied from them
        // are both held; once it is built, only the frame.
        let Some(reservation) = self.environment.stream_budget.try_reserve(2 * want) else {
            return (Vec::new(), None, bytes_room, load.messages == 0);
        };
        let leases =
            subscription.state.borrow_mut().pull_for(now, room, self.topic.end_offset(), self.id, self.lease);
        (leases, Some(reservation), bytes_room, load.messages == 0)
    }
}
