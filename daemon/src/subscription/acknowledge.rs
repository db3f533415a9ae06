//! Acknowledgements and deadline changes: each made durable in the subscription's journal
//! before it is applied and confirmed, so that what a subscriber was told survives a restart.

use super::journal_entry::{runs_of, JournalEntry};
use super::source::{AckJournal, MessageSource};
use super::SubscriptionError;
use super::{dead_letter, Environment, SubscriptionEntry};
use crate::api::data::InvalidAckId;
use crate::ids::Offset;
use crate::log::LogError;
use std::rc::Rc;

/// Why an acknowledgement or extension accepted was not honoured this time.
pub const NOT_DURABLE: &str = "the change could not be made durable; sending it again may succeed";

/// Acknowledges the leases `ack_ids` name; returns those refused. With exactly-once delivery a
/// journal that fails is a refusal of each id, transient, rather than an error of the request:
/// the subscriber learns per id what holds.
pub async fn acknowledge<'a, T: AckJournal>(
    environment: &Environment,
    subscription: &SubscriptionEntry,
    topic: &T,
    ack_ids: impl Iterator<Item = &'a str>,
) -> Result<Vec<InvalidAckId>, SubscriptionError> {
    subscription.last_activity_ms.set(environment.clock.wall_ms());
    let now = environment.clock.now();
    let mut invalid = Vec::new();
    let mut accepted: Vec<(Offset, &'a str)> = Vec::new();
    let mut already_acknowledged = false;
    let exactly_once = {
        let mut state = subscription.state.borrow_mut();
        for ack_id in ack_ids {
            match state.check_ack(ack_id, now) {
                Ok(Some(offset)) => {
                    state.leave_window(offset);
                    if state.policy.exactly_once {
                        state.pin(offset);
                    }
                    accepted.push((offset, ack_id));
                }
                Ok(None) => already_acknowledged = true,
                Err(refusal) => invalid.push(InvalidAckId::new(ack_id, refusal.reason())),
            }
        }
        state.policy.exactly_once
    };
    if accepted.is_empty() {
        // Acknowledged by an entry that may not be committed yet (a new leader's replay): the
        // subscriber is told so only once it is, as it would be had this request written it.
        // An entry written below commits no later than the ones before it.
        if already_acknowledged {
            topic.settle().await?;
        }
        return Ok(invalid);
    }
    // The stream may send more while the acknowledgements become durable.
    subscription.changed.notify_all();
    let mut offsets: Vec<Offset> = accepted.iter().map(|(offset, _)| *offset).collect();
    offsets.sort_unstable();
    offsets.dedup();
    // Durable first: an acknowledgement confirmed to the subscriber never comes back.
    let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&offsets) };
    let written = topic.record(&entry).await;
    let mut state = subscription.state.borrow_mut();
    match written {
        // Applying ends each lease, pinned or not.
        Ok(()) => offsets.into_iter().for_each(|offset| state.apply_ack(offset)),
        Err(error) => {
            // The journal's reserve is gone too: the files kept for later rolls go, so that
            // the retry finds room.
            if matches!(error, LogError::NoSpace(_)) {
                (environment.release_space)();
            }
            if !exactly_once {
                return Err(SubscriptionError::from(error));
            }
            // One pin per id accepted, so one unpin each. An offset another request made
            // durable meanwhile is acknowledged all the same.
            for (offset, ack_id) in accepted {
                state.unpin(offset);
                if !state.is_acknowledged(offset) {
                    invalid.push(InvalidAckId::transient(ack_id, NOT_DURABLE));
                }
            }
        }
    }
    drop(state);
    subscription.changed.notify_all();
    Ok(invalid)
}

/// Extends the leases `ack_ids` name by `seconds` from now, or with 0 gives them back at once;
/// returns those refused.
pub async fn modify_ack_deadline<'a, T: MessageSource + AckJournal + 'static>(
    environment: &Environment,
    subscription: &Rc<SubscriptionEntry>,
    topic: &Rc<T>,
    ack_ids: impl Iterator<Item = &'a str> + Clone,
    seconds: u32,
) -> Result<Vec<InvalidAckId>, SubscriptionError> {
    if seconds > 0 {
        // An extension confirmed to the subscriber survives a restart: journal it first.
        let (mut offsets, exactly_once) = {
            let state = subscription.state.borrow();
            let now = environment.clock.now();
            let offsets: Vec<Offset> =
                ack_ids.clone().filter_map(|ack_id| state.check_ack(ack_id, now).ok().flatten()).collect();
            (offsets, state.policy.exactly_once)
        };
        if !offsets.is_empty() {
            offsets.sort_unstable();
            offsets.dedup();
            let until_ms = environment.clock.wall_ms() + seconds as u64 * 1000;
            let entry = JournalEntry::DeadlineExtended {
                subscription_id: subscription.id,
                runs: runs_of(&offsets),
                until_ms,
            };
            match topic.record(&entry).await {
                Ok(()) => {}
                // With exactly-once delivery each id learns whether its extension may hold
                // when sent again.
                Err(_) if exactly_once => {
                    let state = subscription.state.borrow();
                    let now = environment.clock.now();
                    let refusals = ack_ids.filter_map(|ack_id| match state.check_ack(ack_id, now) {
                        Err(refusal) => Some(InvalidAckId::new(ack_id, refusal.reason())),
                        Ok(Some(_)) => Some(InvalidAckId::transient(ack_id, NOT_DURABLE)),
                        Ok(None) => None,
                    });
                    return Ok(refusals.collect());
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    let now = environment.clock.now();
    let mut invalid = Vec::new();
    {
        let mut state = subscription.state.borrow_mut();
        for ack_id in ack_ids {
            if let Err(refusal) = state.modify_deadline(ack_id, seconds, now) {
                invalid.push(InvalidAckId::new(ack_id, refusal.reason()));
            }
        }
    }
    dead_letter::start(environment, subscription, topic);
    subscription.changed.notify_all();
    Ok(invalid)
}
