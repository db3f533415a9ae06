//! Acknowledgements and deadline changes: each made durable in the subscription's journal
//! before it is applied and confirmed, so that what a subscriber was told survives a restart.

use super::journal_entry::{runs_of, JournalEntry};
use super::source::{AckJournal, MessageSource};
use super::{dead_letter, Environment, SubscriptionEntry};
use crate::api::data::InvalidAckId;
use crate::api::Status;
use crate::log::LogError;
use std::rc::Rc;

/// Acknowledges the leases `ack_ids` name; returns those refused.
pub async fn acknowledge<'a, T: AckJournal>(
    environment: &Environment,
    subscription: &SubscriptionEntry,
    topic: &T,
    ack_ids: impl Iterator<Item = &'a str>,
) -> Result<Vec<InvalidAckId>, Status> {
    subscription.last_activity_ms.set(environment.clock.wall_ms());
    let mut invalid = Vec::new();
    let mut offsets = Vec::new();
    {
        let mut state = subscription.state.borrow_mut();
        for ack_id in ack_ids {
            match state.check_ack(ack_id) {
                Ok(Some(offset)) => {
                    state.leave_window(offset);
                    offsets.push(offset);
                }
                Ok(None) => {}
                Err(refusal) => invalid.push(InvalidAckId::new(ack_id, refusal.reason())),
            }
        }
    }
    if offsets.is_empty() {
        return Ok(invalid);
    }
    // The stream may send more while the acknowledgements become durable.
    subscription.changed.notify_all();
    offsets.sort_unstable();
    offsets.dedup();
    // Durable first: an acknowledgement confirmed to the subscriber never comes back.
    let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&offsets) };
    topic.record(&entry).await.map_err(|error| {
        // The journal's reserve is gone too: the files kept for later rolls go, so that the
        // retry finds room.
        if matches!(error, LogError::NoSpace(_)) {
            (environment.release_space)();
        }
        Status::from(error)
    })?;
    let mut state = subscription.state.borrow_mut();
    for offset in offsets {
        state.apply_ack(offset);
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
) -> Result<Vec<InvalidAckId>, Status> {
    if seconds > 0 {
        // An extension confirmed to the subscriber survives a restart: journal it first.
        let mut offsets: Vec<u64> = {
            let state = subscription.state.borrow();
            ack_ids.clone().filter_map(|ack_id| state.check_ack(ack_id).ok().flatten()).collect()
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
            topic.record(&entry).await?;
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
