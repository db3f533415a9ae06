//! What a shard does on its own, on timers: ends expired leases, samples its rates, collects
//! segments and compacts journals, gives back memory once quiet, and files on a full disk.

use super::{Forwarder, Registry, Served};
use crate::storage::Storage;
use crate::subscription::dead_letter;
use crate::topic::journal::JournalReserve;
use std::cell::Cell;
use std::rc::Rc;

impl<S: Storage> Forwarder<S> {
    /// Ends expired leases of every subscription, starts dead-lettering what used up its
    /// attempts, and wakes streams and waiting pulls that can now deliver. Runs every
    /// `LEASE_SWEEP_INTERVAL`; pulls also expire leases themselves, so this only matters for
    /// subscriptions nobody is pulling from right now.
    pub fn sweep_leases(&self) {
        let now = self.environment.clock.now();
        // The same tick samples the counters behind the rates in the stats.
        self.activity.rate_ticks.borrow_mut().tick(now);
        for topic in self.registry.topics_by_id.borrow().values() {
            topic.published.sample(topic.log.end_offset().get());
            topic.log.release_idle_cache();
        }
        self.trim_memory_once_quiet();
        let served: Vec<Served<S>> = self.registry.subscriptions.borrow().values().cloned().collect();
        for (subscription, topic) in served {
            {
                let mut state = subscription.state.borrow_mut();
                subscription.delivered.sample(state.delivered_total);
                subscription.acked.sample(state.acked_total);
                state.release_if_idle();
            }
            let due = subscription.state.borrow().next_deadline().is_some_and(|deadline| deadline <= now);
            if due {
                subscription.state.borrow_mut().expire(now);
                subscription.changed.notify_all();
            }
            dead_letter::start(&self.environment, &subscription, &topic);
        }
    }

    /// Counts quiet sweeps since the last request and trims malloc's free memory once, after
    /// `QUIET_SWEEPS_BEFORE_TRIM` of them; a request starts the count again.
    pub fn trim_memory_once_quiet(&self) {
        self.activity.trim.sweep(self.activity.requests.get());
    }

    /// Deletes the oldest segments nobody needs any more. A closed segment goes when no
    /// retention keeps it: the topic's `message_retention_duration` (if set) has passed for its
    /// newest message, and for every subscription either its ack floor passed the segment (unless
    /// it retains acknowledged messages) or the subscription's own retention expired. A topic
    /// without subscriptions and without retention keeps nothing: no one can ever receive it.
    pub async fn collect_segments(&self) {
        let now_ms = self.environment.clock.wall_ms();
        for topic in self.registry.topic_list() {
            if let Err(error) = topic.compact_journal(&*self.environment.clock).await {
                crate::log_warn!("ringpostd: compacting the journal of topic '{}': {error}", topic.name);
            }
            topic.remove_unneeded_segments(now_ms).await;
            // After the deletions, which may have given back the space a journal's roll on a
            // full disk took from its reserve. Quiet while the disk stays full: the journal
            // goes on with the room its segment has.
            let wants_reserve = topic.journal.opened().is_some_and(|journal| !journal.has_reserve())
                || (topic.journal_reserve.get() != JournalReserve::Made && !topic.log.is_empty());
            if wants_reserve {
                let _ = topic.reserve_journal_space().await;
            }
        }
    }
}

/// Out of disk space: every topic of the shard gives up the files it holds for later rolls
/// (a spare, a recycled segment: up to a segment each, which the user's data does not
/// need), in the background, so that the publisher's retry finds the space.
/// Once at a time, and only while the shard keeps any: publishers refused by a full disk
/// retry, and each refusal must not walk every topic again.
pub fn release_kept_files<S: Storage>(
    registry: &Registry<S>,
    directories: &crate::log::Directories,
    releasing: &Rc<Cell<bool>>,
) {
    if directories.files_kept() == 0 || releasing.replace(true) {
        return;
    }
    let topics = registry.topic_list();
    let releasing = releasing.clone();
    crate::runtime::spawn(async move {
        for topic in topics {
            topic.log.discard_spares().await;
        }
        releasing.set(false);
    })
    .detach();
}
