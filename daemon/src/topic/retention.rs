//! Which of a topic's segments no one needs any more. A closed segment goes when no retention
//! keeps it: the topic's `message_retention_duration` (if set) has passed for its newest
//! message, no live snapshot may seek back into it, and for every subscription either its ack
//! floor passed the segment (unless it retains acknowledged messages) or the subscription's
//! own retention expired. A topic without subscriptions and without retention keeps nothing:
//! no one can ever receive it.

use super::TopicState;
use crate::storage::Storage;

impl<S: Storage> TopicState<S> {
    /// Deletes the oldest segments nobody needs any more.
    pub async fn remove_unneeded_segments(&self, now_ms: u64) {
        let deletable = {
            let subscriptions = self.subscriptions.borrow();
            let expired = |newest_ms: u64, seconds: u64| {
                newest_ms.saturating_add(seconds.saturating_mul(1000)) <= now_ms
            };
            // A leader keeps what a follower still lacks.
            let replicated = self.replicated_floor(crate::replication::protocol::MESSAGES);
            // And every replica what it does not know to be committed: a follower whose commit
            // point its leader has not told yet (after a restart or a demotion it forgets it)
            // keeps its records, which a new leader's sync may yet cut, and its log never
            // starts past its committed end (asserted with the log's positions).
            let committed = self.log.committed_end();
            self.log
                .closed_segments()
                .iter()
                .take_while(|segment| {
                    if segment.end_offset > replicated || segment.end_offset > committed {
                        return false;
                    }
                    let topic_keeps = self.retention_seconds.get() > 0
                        && !expired(segment.newest_publish_ms, self.retention_seconds.get());
                    // A live snapshot keeps everything it may seek back to.
                    let snapshot_keeps = self.journal.with_open(|open| {
                        open.snapshots.values().any(|snapshot| {
                            snapshot.expire_time_ms > now_ms && segment.end_offset > snapshot.floor
                        })
                    });
                    !topic_keeps
                        && snapshot_keeps != Some(true)
                        && subscriptions.iter().all(|entry| {
                            let gone =
                                expired(segment.newest_publish_ms, entry.message_retention_seconds.get());
                            let acked = entry.state.borrow().ack_floor() >= segment.end_offset;
                            gone || (acked && !entry.retain_acked_messages.get())
                        })
                })
                .count()
        };
        if deletable == 0 {
            return;
        }
        match self.log.remove_oldest(deletable).await {
            Ok(_) => {
                let start = self.log.start_offset();
                for entry in self.subscriptions.borrow().iter() {
                    entry.state.borrow_mut().forget_before(start);
                }
            }
            Err(error) => {
                crate::log_warn!("ringpostd: deleting old segments of topic '{}': {error}", self.name)
            }
        }
    }
}
