//! A topic's subscription journal: opened at its first entry, checkpointed and compacted so it
//! stays bounded.

use super::{journal_folder, TopicState};
use crate::clock::Clock;
use crate::ids::{Offset, TopicId};
use crate::log::{record, Log, LogConfig, LogError};
use crate::storage::Storage;
use crate::subscription::journal_entry::{journal_log_id, runs_of, JournalEntry};
use crate::subscription::state::IdHasher;
use crate::sync::Notify;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// Largest journal segment: small, so compaction frees space in fine steps.
pub const JOURNAL_SEGMENT_BYTES_MAX: u64 = 4 << 20;
/// Journal bytes written since the last checkpoint that trigger the next one.
pub const JOURNAL_CHECKPOINT_BYTES: u64 = 8 << 20;

/// Where a topic whose journal is closed stands with its journal's reserve segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalReserve {
    /// Not tried since the topic was attached: its next publish tries.
    Untried,
    /// Being made in the journal's folder, by one task: no other may make it meanwhile, the
    /// journal must not open (its recovery removes a reserve half made, under the file being
    /// made), nor the folder go, until it is done (`TopicState::reserve_settled`).
    Making,
    /// Made (the journal adopts it when it opens).
    Made,
    /// The disk had no room: segment collection tries again, once it may have freed some.
    Failed,
}

/// A topic's subscription journal, opened on first use. A subscription's sync point lives in the
/// catalog, so the journal holds only what subscribers did (acknowledgements, seeks, deadline
/// extensions, snapshots): a topic whose subscriptions never acknowledged anything has none, and
/// keeps no open log for it (about 400 bytes and a file descriptor per idle topic).
pub struct LazyJournal<S: Storage> {
    pub log: RefCell<JournalSlot<S>>,
    /// The shard's journal configuration chosen at attach (files kept open or not).
    pub config: Rc<LogConfig>,
    /// Shared by the shard's topics: fires when any journal finishes opening, so appends that
    /// found this one opening look again (one opener per journal, never two logs on one folder).
    pub opened: Notify,
}

pub enum JournalSlot<S: Storage> {
    Closed,
    Opening,
    Open(Box<OpenJournal<S>>),
}

/// An open journal and the state kept beside it, which only a topic with a journal has.
pub struct OpenJournal<S: Storage> {
    pub log: Log<S>,
    /// Subscription states rebuilt from the journal, waiting for the router to attach them.
    pub recovered: HashMap<crate::ids::SubscriptionId, Vec<JournalEntry>, IdHasher>,
    /// Live snapshots of this topic's subscriptions: (floor, acknowledged runs, expiry).
    pub snapshots: HashMap<crate::ids::SnapshotId, SnapshotState, IdHasher>,
    /// Where the journal's last two checkpoints start (older first); see `compact_journal`.
    pub checkpoints: VecDeque<Offset>,
}

impl<S: Storage> OpenJournal<S> {
    pub fn new(log: Log<S>) -> Box<OpenJournal<S>> {
        Box::new(OpenJournal {
            log,
            recovered: HashMap::default(),
            snapshots: HashMap::default(),
            checkpoints: VecDeque::new(),
        })
    }
}

impl<S: Storage> LazyJournal<S> {
    /// The journal's log, opened (and created on disk) if it is not yet: through
    /// `TopicState::journal_log`, which waits for a reserve being made first. Opening an empty
    /// folder does not wait on the disk today, but should it ever, appends that arrive meanwhile
    /// wait for the one opener instead of opening a second log on the same files.
    /// It goes beside the topic's message log, `messages`, on the same storage.
    pub(super) async fn log(
        &self,
        messages: &super::message_log::MessageLog<S>,
        topic_id: TopicId,
    ) -> Result<Log<S>, LogError> {
        loop {
            // Registered before looking, so an opener finishing in between is not missed.
            let opened = self.opened.notified();
            match &*self.log.borrow() {
                JournalSlot::Open(open) => return Ok(open.log.clone()),
                JournalSlot::Opening => {}
                JournalSlot::Closed => break,
            }
            opened.await;
        }
        *self.log.borrow_mut() = JournalSlot::Opening;
        let result = Log::open(
            messages.storage().clone(),
            messages.directories().clone(),
            &journal_folder(topic_id),
            journal_log_id(topic_id),
            self.config.clone(),
        )
        .await;
        *self.log.borrow_mut() = match &result {
            Ok((log, _)) => JournalSlot::Open(OpenJournal::new(log.clone())),
            Err(_) => JournalSlot::Closed,
        };
        self.opened.notify_all();
        result.map(|(log, _)| log)
    }

    /// The journal's log if it is open (nothing to read or compact otherwise).
    pub fn opened(&self) -> Option<Log<S>> {
        self.with_open(|open| open.log.clone())
    }

    /// Runs `f` on the open journal's state; `None` if the journal is not open (then there is
    /// nothing recovered, no snapshot and no checkpoint).
    pub fn with_open<R>(&self, f: impl FnOnce(&mut OpenJournal<S>) -> R) -> Option<R> {
        match &mut *self.log.borrow_mut() {
            JournalSlot::Open(open) => Some(f(open)),
            _ => None,
        }
    }
}

pub struct SnapshotState {
    pub floor: Offset,
    pub runs: Vec<(Offset, u32)>,
    pub expire_time_ms: u64,
}

impl<S: Storage> TopicState<S> {
    /// Keeps a topic's journal bounded. Once `JOURNAL_CHECKPOINT_BYTES` were written since the
    /// last checkpoint, the state of every subscription and snapshot is restated in one batch
    /// (atomic: a batch commits whole or not at all). Checkpoints only add: a restated creation of
    /// an existing subscription is ignored on replay, and acknowledgements are restated as runs.
    /// Segments are then deleted below the *previous* checkpoint, never the one just written, so
    /// an acknowledgement whose entry was committed but not yet applied when this checkpoint was
    /// captured is still in the journal (and in the next checkpoint).
    pub async fn compact_journal(&self, clock: &dyn Clock) -> Result<(), LogError> {
        let Some((journal, last_checkpoint)) =
            self.journal.with_open(|open| (open.log.clone(), open.checkpoints.back().copied()))
        else {
            return Ok(());
        };
        let since = last_checkpoint.unwrap_or(journal.start_offset());
        let written: u64 = journal
            .closed_segments()
            .iter()
            .filter(|segment| segment.end_offset > since)
            .map(|segment| segment.end_offset - segment.base_offset.max(since))
            .sum::<u64>();
        // Entries, not bytes, are what the segment list gives cheaply; a journal entry averages
        // well under a block, so count each as one block to stay conservative.
        if written * record::BLOCK_BYTES as u64 <= JOURNAL_CHECKPOINT_BYTES
            || journal.closed_segments().len() < 2
        {
            return Ok(());
        }
        let mut entries = Vec::new();
        for entry in self.subscriptions.borrow().iter() {
            let state = entry.state.borrow();
            entries.push(JournalEntry::SubscriptionCreated {
                subscription_id: entry.id,
                start_offset: state.start_offset,
            });
            let (floor, mut runs) = state.acknowledged_runs();
            if floor > state.start_offset {
                let below = floor - state.start_offset;
                let mut first = state.start_offset;
                let mut remaining = below;
                // Runs count in u32; a long floor is restated in pieces.
                while remaining > 0 {
                    let count = remaining.min(u32::MAX as u64) as u32;
                    runs.insert(0, (first, count));
                    first += count as u64;
                    remaining -= count as u64;
                }
                runs.sort_unstable();
            }
            if !runs.is_empty() {
                entries.push(JournalEntry::Acked { subscription_id: entry.id, runs });
            }
            // Leases restated at their wall-clock end, so extensions outlive the compaction.
            let (now, wall_ms) = (clock.now(), clock.wall_ms());
            let mut by_end: HashMap<u64, Vec<Offset>, IdHasher> = HashMap::default();
            for (offset, deadline) in state.leases() {
                let until_ms = wall_ms + deadline.saturating_duration_since(now).as_millis() as u64;
                by_end.entry(until_ms / 1000 * 1000 + 999).or_default().push(offset);
            }
            for (until_ms, mut offsets) in by_end {
                offsets.sort_unstable();
                entries.push(JournalEntry::DeadlineExtended {
                    subscription_id: entry.id,
                    runs: runs_of(&offsets),
                    until_ms,
                });
            }
        }
        self.journal.with_open(|open| {
            for (snapshot_id, snapshot) in open.snapshots.iter() {
                entries.push(JournalEntry::SnapshotTaken {
                    snapshot_id: *snapshot_id,
                    floor: snapshot.floor,
                    runs: snapshot.runs.clone(),
                    expire_time_ms: snapshot.expire_time_ms,
                });
            }
        });
        let mut records = Vec::new();
        for entry in &entries {
            record::encode_record_unsealed(&mut records, 0, &entry.encode(), &mut std::iter::empty(), "");
        }
        let (first, _) = journal.append(records, entries.len() as u32).await?;
        let previous = self.journal.with_open(|open| {
            let checkpoints = &mut open.checkpoints;
            checkpoints.push_back(first);
            if checkpoints.len() > 2 {
                checkpoints.pop_front();
            }
            (checkpoints.len() == 2).then(|| checkpoints[0])
        });
        if let Some(previous) = previous.flatten() {
            // A leader keeps what a follower still lacks.
            let replicated = self.replicated_floor(crate::replication::protocol::JOURNAL);
            journal.remove_before(previous.min(replicated)).await?;
        }
        Ok(())
    }
}
