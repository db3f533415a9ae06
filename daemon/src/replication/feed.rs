//! What a leader sends one follower and when, decided without I/O: `Feed` is driven by the
//! events of `Leader::replicate` (what the logs hold, an answer, a wake-up) and returns what
//! to do (sync, append from where, wait, pause); `replicate` performs it (the requests, the
//! reads, the sleeps) and counts what the follower holds (`CommitTracker`).
//!
//! Contract: an append starts where the one before it ends (`sent_to`), at most
//! `APPENDS_IN_FLIGHT` are in flight (one to a follower that cannot read stamps), answers are
//! taken in the order the appends were sent, and any failure (a refused or missing answer, one
//! of another kind, a read that failed) drops the window: the next step is a sync, which finds
//! out what the follower holds. Each sync has a stamp greater than the one before, and every
//! append carries its sync's: the follower refuses one sent before its latest sync, so an
//! append of a dropped window cannot reach it while a later sync cuts its log.

use super::protocol::{ReplicaAnswer, LOGS, MESSAGES};
use super::source::{APPENDS_IN_FLIGHT, APPEND_PIPELINE_RECORDS_MIN, RETRY_PAUSE_MAX, RETRY_PAUSE_MIN};
use crate::ids::Offset;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The decisions about one follower of a leader.
#[derive(Debug)]
pub struct Feed {
    /// The follower's logs agree with this leader's as far as `sent_to` said at the last sync.
    synced: bool,
    /// Where the next append starts in each log: past what is in flight.
    sent_to: [Offset; LOGS],
    /// The appends in flight, oldest first: what each told of the commit point, and when it
    /// was sent.
    in_flight: VecDeque<Sent>,
    /// The commit point the follower was last told, by an append it answered.
    told: [Offset; LOGS],
    /// The pause before the next try after a failure: doubled by each, up to `RETRY_PAUSE_MAX`.
    pause: Duration,
    /// The stamp of the last sync sent (0: none yet); the appends after it carry it.
    stamp: u64,
    /// Whether the follower reads stamped syncs and appends. A follower of the version before
    /// stamps refuses them as unknown: it is then sent the unstamped forms, one append at a
    /// time, as that version's leaders did.
    stamped: bool,
}

/// An append in flight.
#[derive(Debug, Clone, Copy)]
struct Sent {
    committed: [Offset; LOGS],
    at: Instant,
}

/// What to do next for the follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Drop the appends in flight and ask what the follower holds.
    Sync,
    /// Send each log's durable records from these offsets.
    Append { from: [Offset; LOGS] },
    /// Wait for the oldest answer, new records, a renewal of the lease or the idle interval.
    Wait,
}

/// What ended a wait other than an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Records became durable, or the leader stopped.
    Records,
    /// A delivery wants the lease renewed: the followers are asked again.
    Renew,
    /// `IDLE_APPEND_INTERVAL` passed: the commit point is told if the follower lacks it.
    Idle,
}

/// What an answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The follower holds its logs durably to these ends, agreeing with this leader, as of the
    /// request sent at `sent_at`: they count towards the commit point and the lease.
    Holds { ends: [Offset; LOGS], sent_at: Instant },
    /// A failure: pause this long (or until the leader stops), then sync.
    Retry { pause: Duration },
    /// No append was in flight to answer (a late or duplicated answer): nothing changes.
    Ignored,
}

impl Default for Feed {
    fn default() -> Feed {
        Feed::new()
    }
}

impl Feed {
    /// A follower not yet synced.
    pub fn new() -> Feed {
        Feed {
            synced: false,
            sent_to: [Offset::ZERO; LOGS],
            in_flight: VecDeque::new(),
            told: [Offset::ZERO; LOGS],
            pause: RETRY_PAUSE_MIN,
            stamp: 0,
            stamped: true,
        }
    }

    /// The stamp of a sync sent now: one more than the last (0, unstamped, to a follower that
    /// cannot read stamps).
    pub fn next_sync_stamp(&mut self) -> u64 {
        if !self.stamped {
            return 0;
        }
        self.stamp += 1;
        self.stamp
    }

    /// The stamp an append sent now carries: its sync's.
    pub fn stamp(&self) -> u64 {
        if self.stamped {
            self.stamp
        } else {
            0
        }
    }

    /// Appends this follower may have in flight.
    pub fn window(&self) -> usize {
        if self.stamped {
            APPENDS_IN_FLIGHT
        } else {
            1
        }
    }

    /// The appends in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The next step, given each log's durable end. Records past what was sent go at once
    /// while the window has room: small appends wait for the one in flight (the follower then
    /// writes them as one); a backlog of `APPEND_PIPELINE_RECORDS_MIN` goes while others are in
    /// flight.
    pub fn on_append(&mut self, durable_ends: [Offset; LOGS]) -> Action {
        if !self.synced {
            self.in_flight.clear();
            return Action::Sync;
        }
        let pending: u64 = (0..LOGS).map(|log| durable_ends[log].saturating_sub(self.sent_to[log])).sum();
        let room = self.in_flight.is_empty()
            || (pending >= APPEND_PIPELINE_RECORDS_MIN && self.in_flight.len() < self.window());
        if pending > 0 && room {
            Action::Append { from: self.sent_to }
        } else {
            Action::Wait
        }
    }

    /// A wait ended without an answer. The commit point and the start ride along with records;
    /// alone, they are told only once the source is idle (a follower needs them only to let go
    /// of segments), so an idle topic costs nothing, or when a delivery wants the lease.
    /// Returns whether to send an append now (from `sent_to`, possibly empty); if not, the
    /// next step is `on_append`'s.
    pub fn on_tick(&mut self, wake: Wake, committed_ends: [Offset; LOGS]) -> bool {
        match wake {
            Wake::Records => false,
            Wake::Renew => self.in_flight.is_empty(),
            Wake::Idle => {
                let untold = (MESSAGES..LOGS).any(|log| committed_ends[log] > self.told[log]);
                self.in_flight.is_empty() && untold
            }
        }
    }

    /// Where an append sent now starts.
    pub fn sent_to(&self) -> [Offset; LOGS] {
        self.sent_to
    }

    /// An append was sent at `at`, telling the commit point `committed`: each log's records end
    /// at `ends` (`None`: none of that log).
    pub fn on_sent(&mut self, ends: [Option<Offset>; LOGS], committed: [Offset; LOGS], at: Instant) {
        debug_assert!(self.synced, "an append before a sync");
        for (log, end) in ends.iter().enumerate() {
            if let Some(end) = end {
                self.sent_to[log] = *end;
            }
        }
        self.in_flight.push_back(Sent { committed, at });
    }

    /// The answer to a sync sent at `sent_at` (`None`: none came).
    pub fn on_synced(&mut self, answer: Option<&ReplicaAnswer>, sent_at: Instant) -> Outcome {
        match answer {
            Some(ReplicaAnswer::Synced { next_offsets }) => {
                // Cut to agree with this leader, durable there: it counts.
                self.sent_to = *next_offsets;
                self.synced = true;
                self.pause = RETRY_PAUSE_MIN;
                Outcome::Holds { ends: *next_offsets, sent_at }
            }
            Some(ReplicaAnswer::Stale { synced_stamp }) => self.stale(*synced_stamp),
            _ => self.failed(),
        }
    }

    /// A stamped sync was refused as a request the follower cannot read (a node of the version
    /// before stamps): from now on it is sent the unstamped forms, one append at a time.
    pub fn on_sync_unreadable(&mut self) -> Outcome {
        self.stamped = false;
        self.failed()
    }

    /// The answer to the oldest append in flight (`None`: none came).
    pub fn on_answer(&mut self, answer: Option<&ReplicaAnswer>) -> Outcome {
        let Some(sent) = self.in_flight.pop_front() else { return Outcome::Ignored };
        match answer {
            Some(ReplicaAnswer::Appended { durable_ends }) => {
                self.told = sent.committed;
                self.pause = RETRY_PAUSE_MIN;
                Outcome::Holds { ends: *durable_ends, sent_at: sent.at }
            }
            // Not taken: it counts for nothing, and a sync finds out what the follower holds.
            Some(ReplicaAnswer::Stale { synced_stamp }) => self.stale(*synced_stamp),
            _ => self.failed(),
        }
    }

    /// Reading the records of an append failed.
    pub fn on_read_failed(&mut self) -> Outcome {
        self.failed()
    }

    /// The follower began a sync stamped `synced_stamp` after the request it refused: only this
    /// leader stamps its syncs in this epoch, so it sent none later than its own last; the next
    /// sync is stamped past it all the same, or the follower would refuse it too.
    fn stale(&mut self, synced_stamp: u64) -> Outcome {
        self.stamp = self.stamp.max(synced_stamp);
        self.failed()
    }

    fn failed(&mut self) -> Outcome {
        self.synced = false;
        let pause = self.pause;
        self.pause = (pause * 2).min(RETRY_PAUSE_MAX);
        Outcome::Retry { pause }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ends: [u64; LOGS]) -> [Offset; LOGS] {
        ends.map(Offset::new)
    }

    fn some_at(ends: [Option<u64>; LOGS]) -> [Option<Offset>; LOGS] {
        ends.map(|end| end.map(Offset::new))
    }

    fn synced(next_offsets: [u64; LOGS]) -> (Feed, Instant) {
        let next_offsets = at(next_offsets);
        let mut feed = Feed::new();
        let now = Instant::now();
        assert_eq!(feed.on_append(at([0, 0])), Action::Sync);
        let answer = ReplicaAnswer::Synced { next_offsets };
        assert_eq!(feed.on_synced(Some(&answer), now), Outcome::Holds { ends: next_offsets, sent_at: now });
        (feed, now)
    }

    #[test]
    fn a_follower_is_synced_first_then_sent_what_it_lacks_one_append_at_a_time() {
        let mut feed = Feed::new();
        assert_eq!(feed.on_append(at([10, 3])), Action::Sync, "nothing is sent before a sync");
        let now = Instant::now();
        let answer = ReplicaAnswer::Synced { next_offsets: at([4, 3]) };
        assert_eq!(feed.on_synced(Some(&answer), now), Outcome::Holds { ends: at([4, 3]), sent_at: now });
        assert_eq!(feed.on_append(at([10, 3])), Action::Append { from: at([4, 3]) });
        feed.on_sent(some_at([Some(10), None]), at([4, 3]), now);
        assert_eq!(feed.on_append(at([12, 5])), Action::Wait, "small appends wait for the one in flight");
        let appended = ReplicaAnswer::Appended { durable_ends: at([10, 3]) };
        assert_eq!(feed.on_answer(Some(&appended)), Outcome::Holds { ends: at([10, 3]), sent_at: now });
        assert_eq!(
            feed.on_append(at([12, 5])),
            Action::Append { from: at([10, 3]) },
            "from where the last ended"
        );
    }

    #[test]
    fn a_backlog_keeps_several_appends_in_flight_and_their_answers_are_taken_in_order() {
        let (mut feed, now) = synced([7, 2]);
        assert_eq!(feed.on_append(at([7, 2])), Action::Wait, "nothing pending");
        // A backlog of APPEND_PIPELINE_RECORDS_MIN records or more goes while others are in
        // flight, each from where the one before ends, up to the window.
        let step = APPEND_PIPELINE_RECORDS_MIN;
        let backlog = 7 + step * (APPENDS_IN_FLIGHT as u64 + 2);
        for sent in 0..APPENDS_IN_FLIGHT as u64 {
            let from = 7 + step * sent;
            assert_eq!(feed.on_append(at([backlog, 2])), Action::Append { from: at([from, 2]) });
            feed.on_sent(some_at([Some(from + step), None]), at([7, 2]), now);
        }
        const { assert!(APPENDS_IN_FLIGHT > 1, "a window wider than one") };
        assert_eq!(feed.in_flight(), APPENDS_IN_FLIGHT);
        assert_eq!(feed.on_append(at([backlog, 2])), Action::Wait, "the window is full");
        // Answers come in the order sent: each counts what its append made durable.
        for answered in 1..=APPENDS_IN_FLIGHT as u64 {
            let appended = ReplicaAnswer::Appended { durable_ends: at([7 + step * answered, 2]) };
            assert_eq!(
                feed.on_answer(Some(&appended)),
                Outcome::Holds { ends: at([7 + step * answered, 2]), sent_at: now }
            );
        }
        assert_eq!(feed.in_flight(), 0);
        let next = 7 + step * APPENDS_IN_FLIGHT as u64;
        assert_eq!(feed.on_append(at([backlog, 2])), Action::Append { from: at([next, 2]) });
    }

    #[test]
    fn syncs_are_stamped_in_order_and_a_refused_append_counts_for_nothing() {
        let mut feed = Feed::new();
        assert_eq!(feed.on_append(at([9, 0])), Action::Sync);
        assert_eq!(feed.next_sync_stamp(), 1);
        let now = Instant::now();
        let answer = ReplicaAnswer::Synced { next_offsets: at([0, 0]) };
        assert!(matches!(feed.on_synced(Some(&answer), now), Outcome::Holds { .. }));
        assert_eq!(feed.stamp(), 1, "appends carry their sync's stamp");
        feed.on_sent(some_at([Some(5), None]), at([0, 0]), now);
        feed.on_sent(some_at([Some(9), None]), at([0, 0]), now);
        // The follower began a later sync (stamp 3, say a copy this leader no longer awaits):
        // the refused append is not durable there, and the window goes.
        let stale = ReplicaAnswer::Stale { synced_stamp: 3 };
        assert!(matches!(feed.on_answer(Some(&stale)), Outcome::Retry { .. }));
        assert_eq!(feed.on_append(at([9, 0])), Action::Sync);
        assert_eq!(feed.in_flight(), 0);
        assert_eq!(feed.next_sync_stamp(), 4, "past the follower's latest");
        // A sync refused as stale is stamped past it the next time too.
        assert!(matches!(
            feed.on_synced(Some(&ReplicaAnswer::Stale { synced_stamp: 7 }), now),
            Outcome::Retry { .. }
        ));
        assert_eq!(feed.next_sync_stamp(), 8);
    }

    #[test]
    fn a_follower_that_cannot_read_stamps_gets_the_unstamped_forms_one_append_at_a_time() {
        let mut feed = Feed::new();
        assert_eq!(feed.on_append(at([0, 0])), Action::Sync);
        assert_eq!(feed.next_sync_stamp(), 1);
        assert!(matches!(feed.on_sync_unreadable(), Outcome::Retry { .. }));
        assert_eq!(feed.on_append(at([0, 0])), Action::Sync);
        assert_eq!(feed.next_sync_stamp(), 0, "unstamped");
        let now = Instant::now();
        let answer = ReplicaAnswer::Synced { next_offsets: at([0, 0]) };
        assert!(matches!(feed.on_synced(Some(&answer), now), Outcome::Holds { .. }));
        assert_eq!((feed.stamp(), feed.window()), (0, 1));
        let backlog = APPEND_PIPELINE_RECORDS_MIN * 8;
        assert_eq!(feed.on_append(at([backlog, 0])), Action::Append { from: at([0, 0]) });
        feed.on_sent(some_at([Some(APPEND_PIPELINE_RECORDS_MIN), None]), at([0, 0]), now);
        assert_eq!(feed.on_append(at([backlog, 0])), Action::Wait, "one in flight");
    }

    #[test]
    fn a_late_or_duplicated_answer_changes_nothing() {
        let (mut feed, now) = synced([5, 5]);
        feed.on_sent(some_at([Some(9), Some(6)]), at([5, 5]), now);
        let appended = ReplicaAnswer::Appended { durable_ends: at([9, 6]) };
        assert!(matches!(feed.on_answer(Some(&appended)), Outcome::Holds { .. }));
        assert_eq!(feed.on_answer(Some(&appended)), Outcome::Ignored, "the same answer again");
        let older = ReplicaAnswer::Appended { durable_ends: at([2, 2]) };
        assert_eq!(feed.on_answer(Some(&older)), Outcome::Ignored, "an answer with nothing in flight");
        assert_eq!(
            feed.on_append(at([12, 6])),
            Action::Append { from: at([9, 6]) },
            "still synced, sent_to kept"
        );
    }

    #[test]
    fn a_failure_drops_the_window_and_resyncs_with_pauses_doubling_to_the_longest() {
        let (mut feed, now) = synced([5, 5]);
        feed.on_sent(some_at([Some(9), None]), at([5, 5]), now);
        // A follower that promised a newer epoch answers Deposed: the exchange fails.
        let deposed = ReplicaAnswer::Deposed { promised_epoch: crate::ids::Epoch::new(9) };
        assert_eq!(feed.on_answer(Some(&deposed)), Outcome::Retry { pause: RETRY_PAUSE_MIN });
        assert_eq!(feed.on_append(at([9, 5])), Action::Sync, "what the follower holds is unknown again");
        assert_eq!(feed.in_flight(), 0);
        let mut pauses = vec![];
        for _ in 0..10 {
            match feed.on_synced(None, now) {
                Outcome::Retry { pause } => pauses.push(pause),
                outcome => panic!("{outcome:?}"),
            }
        }
        assert_eq!(pauses[0], RETRY_PAUSE_MIN * 2);
        assert!(pauses.windows(2).all(|pair| pair[1] == (pair[0] * 2).min(RETRY_PAUSE_MAX)));
        assert_eq!(*pauses.last().unwrap(), RETRY_PAUSE_MAX);
        // The follower was cut back meanwhile: sending resumes from where it says it is.
        let answer = ReplicaAnswer::Synced { next_offsets: at([3, 5]) };
        assert!(
            matches!(feed.on_synced(Some(&answer), now), Outcome::Holds { ends, .. } if ends == at([3, 5]))
        );
        assert_eq!(feed.on_append(at([9, 5])), Action::Append { from: at([3, 5]) });
        feed.on_sent(some_at([Some(9), None]), at([5, 5]), now);
        assert!(
            matches!(feed.on_answer(None), Outcome::Retry { pause } if pause == RETRY_PAUSE_MIN),
            "a success reset the pause"
        );
    }

    #[test]
    fn an_answer_of_another_kind_or_a_failed_read_resyncs() {
        let (mut feed, now) = synced([1, 1]);
        feed.on_sent(some_at([Some(4), None]), at([1, 1]), now);
        let synced_answer = ReplicaAnswer::Synced { next_offsets: at([4, 1]) };
        assert!(matches!(feed.on_answer(Some(&synced_answer)), Outcome::Retry { .. }));
        assert_eq!(feed.on_append(at([4, 1])), Action::Sync);
        let (mut feed, _) = synced([1, 1]);
        assert!(matches!(feed.on_read_failed(), Outcome::Retry { .. }));
        assert_eq!(feed.on_append(at([4, 1])), Action::Sync);
    }

    #[test]
    fn the_commit_point_alone_is_told_when_idle_and_the_lease_renewed_when_nothing_is_in_flight() {
        let (mut feed, now) = synced([5, 5]);
        assert!(!feed.on_tick(Wake::Idle, at([0, 0])), "nothing committed past what it was told");
        assert!(feed.on_tick(Wake::Idle, at([5, 0])), "committed past what it was told (nothing yet)");
        feed.on_sent(some_at([None, None]), at([5, 5]), now);
        assert!(!feed.on_tick(Wake::Idle, at([6, 5])), "one in flight: it waits for the answer");
        assert!(!feed.on_tick(Wake::Renew, at([6, 5])), "the one in flight answers for the lease");
        let appended = ReplicaAnswer::Appended { durable_ends: at([5, 5]) };
        assert!(matches!(feed.on_answer(Some(&appended)), Outcome::Holds { .. }));
        assert!(!feed.on_tick(Wake::Idle, at([5, 5])), "told already");
        assert!(feed.on_tick(Wake::Idle, at([5, 6])), "the journal committed past what it was told");
        assert!(feed.on_tick(Wake::Renew, at([5, 5])));
        assert!(!feed.on_tick(Wake::Records, at([9, 9])), "records go through on_append");
    }
}
