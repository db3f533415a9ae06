//! The decisions of replicating a source across nodes, without I/O (docs/REPLICATION.md): when
//! a leader's records are committed, and which replica a fencing round makes the next leader.
//! The data path and the catalog's entries will call these; `tests` checks them against a
//! model of the whole protocol (leaders of several epochs acting at once, elections over any
//! majority, followers truncating to their leader) for the two safety properties: no committed
//! record is ever lost, and a deposed leader never commits.

pub mod feed;
pub mod protocol;
pub mod source;
#[cfg(test)]
mod tests;

use crate::ids::{Epoch, Offset, ShardId};

/// Replicas whose answers make a quorum of `replicas`: a majority, ⌊R/2⌋ + 1 (⌈R/2⌉ for the
/// odd R a topic is created with; a replica move passes through an even R for a moment, where
/// ⌈R/2⌉ would let two quorums miss each other).
pub fn quorum(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// A leader's view of its epoch's replication: how far each replica has its log durable at
/// this epoch, and so how far the log is committed. A replica is one shard of one node, so
/// the replicas are counted by `ShardId`.
#[derive(Debug, Clone)]
pub struct CommitTracker {
    epoch: Epoch,
    /// Where this epoch's first record (the new leader's empty batch) is: records before it
    /// commit only once a record of this epoch does (Raft's rule; an older epoch's record held
    /// by a majority may still be overwritten by a leader that never saw it).
    epoch_start: Offset,
    /// Each replica's durable end as it answered at this epoch, the leader's own included.
    durable_ends: Vec<(ShardId, Offset)>,
    replicas: usize,
    committed_end: Offset,
}

impl CommitTracker {
    /// A leader of `epoch` over `replicas` (its own id among them) whose log held `epoch_start`
    /// records when it was elected, of which `committed_end` were known committed.
    pub fn new(
        epoch: Epoch,
        replicas: &[ShardId],
        epoch_start: Offset,
        committed_end: Offset,
    ) -> CommitTracker {
        assert!(!replicas.is_empty(), "a leader is one of its replicas");
        // The log's positions put the commit point at or below its end (`Log::next_offset`).
        assert!(
            committed_end <= epoch_start,
            "committed up to {committed_end}, past the log's end {epoch_start} at the epoch's start"
        );
        CommitTracker {
            epoch,
            epoch_start,
            durable_ends: replicas.iter().map(|&replica| (replica, Offset::ZERO)).collect(),
            replicas: replicas.len(),
            committed_end,
        }
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// `replica` answered that its log agrees with this leader's up to `durable_end` and is
    /// durable there, at this epoch. A replica outside the set, or an older answer, changes
    /// nothing. Returns the committed end, which only grows.
    pub fn durable(&mut self, replica: ShardId, durable_end: Offset) -> Offset {
        if let Some((_, end)) = self.durable_ends.iter_mut().find(|(answered, _)| *answered == replica) {
            *end = (*end).max(durable_end);
        }
        let mut ends: Vec<Offset> = self.durable_ends.iter().map(|(_, end)| *end).collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        let on_a_quorum = ends[quorum(self.replicas) - 1];
        // The commit point only moves forward, and only past this epoch's start (each replica's
        // durable end is the greatest it answered, so what a quorum holds never shrinks).
        if on_a_quorum > self.epoch_start && on_a_quorum > self.committed_end {
            self.committed_end = on_a_quorum;
        }
        self.committed_end
    }

    /// Where this epoch's first record is: the log's end when its leader was elected.
    pub fn epoch_start(&self) -> Offset {
        self.epoch_start
    }

    /// The end of what a quorum holds durably with a record of this epoch among it.
    pub fn committed_end(&self) -> Offset {
        self.committed_end
    }

    /// Whether everything the log held when this epoch began is on a quorum of this epoch's
    /// replicas: a record of this epoch is committed, or the log held nothing. A replica set
    /// changes again only after this (Raft's rule for one change at a time).
    pub fn holds_what_came_before(&self) -> bool {
        self.epoch_start == Offset::ZERO || self.committed_end > self.epoch_start
    }
}

/// The sync of a leader a follower began last: the leader's epoch, and the stamp that leader
/// gave it (its syncs of this follower numbered from 1; 0 for a leader of the version before
/// stamps). An append carries its sync's stamp; one sent before the follower's latest sync of
/// the same epoch could reach it while that sync cuts its log, so it is refused (T9 found a
/// follower whose commit point passed its durable end so, with several appends in flight).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SyncStamp {
    pub epoch: Epoch,
    pub stamp: u64,
}

/// What a follower does with a sync or an append, given its latest sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Take it (a sync: it is the latest from now on).
    Take,
    /// Refuse it as sent before the latest sync of its leader: the logs are not touched.
    Stale,
    /// Refuse it: the follower has not begun its sync (an append of another sync).
    NotSynced,
}

impl SyncStamp {
    /// A sync stamped `incoming` arrives at a follower whose latest is this one. One of a newer
    /// epoch, or unstamped, is taken as before stamps; one of this epoch only if stamped after
    /// the latest (an older copy, held back by the network or sent twice, would cut records the
    /// leader counts as held here). One of an older epoch changes nothing here: the promise of
    /// the newer epoch refuses it (`Deposed`).
    pub fn on_sync(&mut self, incoming: SyncStamp) -> Admission {
        if incoming.epoch < self.epoch {
            return Admission::Take;
        }
        if incoming.epoch == self.epoch && incoming.stamp != 0 && incoming.stamp <= self.stamp {
            return Admission::Stale;
        }
        *self = incoming;
        Admission::Take
    }

    /// An append stamped `incoming`: taken only after the latest sync, the one it follows.
    pub fn admits_append(self, incoming: SyncStamp) -> Admission {
        if incoming == self {
            Admission::Take
        } else if incoming.epoch == self.epoch && incoming.stamp < self.stamp {
            Admission::Stale
        } else {
            Admission::NotSynced
        }
    }
}

/// A replica's answer to a fencing round: it promised to refuse every older epoch, and its log
/// is durable up to `durable_end` with `last_epoch` the epoch of its last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceAnswer {
    pub replica: ShardId,
    pub last_epoch: Epoch,
    pub durable_end: Offset,
}

/// Why a fencing round cannot choose a leader yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoQuorum {
    pub answered: usize,
    pub needed: usize,
}

/// The next leader among `replicas` from the answers of a fencing round: the replica with the
/// greatest (last epoch, durable end), the lower id on a tie, once ⌈R/2⌉ distinct replicas of
/// the set answered. Answers from outside the set do not count.
pub fn choose_leader(replicas: &[ShardId], answers: &[FenceAnswer]) -> Result<FenceAnswer, NoQuorum> {
    let mut counted: Vec<FenceAnswer> = Vec::new();
    for answer in answers {
        if replicas.contains(&answer.replica) && !counted.iter().any(|seen| seen.replica == answer.replica) {
            counted.push(*answer);
        }
    }
    let needed = quorum(replicas.len());
    if counted.len() < needed {
        return Err(NoQuorum { answered: counted.len(), needed });
    }
    Ok(counted
        .into_iter()
        .max_by(|a, b| {
            (a.last_epoch, a.durable_end, std::cmp::Reverse(a.replica)).cmp(&(
                b.last_epoch,
                b.durable_end,
                std::cmp::Reverse(b.replica),
            ))
        })
        .expect("a quorum is at least one answer"))
}

/// Where each epoch begins in a log: `(epoch, first offset)` in increasing order of both, as a
/// replica keeps it beside its log (Kafka's leader-epoch cache). A follower and its leader
/// compare theirs to find where their logs part (KIP-101, with KIP-279's repeat for several
/// epochs apart), without comparing records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochHistory {
    starts: Vec<(Epoch, Offset)>,
}

impl EpochHistory {
    /// The history of a log whose records have these epochs, in order.
    pub fn of_epochs(epochs: impl IntoIterator<Item = u64>) -> EpochHistory {
        let mut history = EpochHistory::default();
        for (offset, epoch) in epochs.into_iter().enumerate() {
            history.appended(Epoch::new(epoch), Offset::new(offset as u64));
        }
        history
    }

    /// Where each epoch begins, `(epoch, first offset)`, in order.
    pub fn starts(&self) -> &[(Epoch, Offset)] {
        &self.starts
    }

    /// A history from its starts, as `starts` gives them; None unless both epochs and offsets
    /// increase (epochs strictly), as a log's do.
    pub fn from_starts(starts: Vec<(Epoch, Offset)>) -> Option<EpochHistory> {
        let ordered = starts.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1);
        ordered.then_some(EpochHistory { starts })
    }

    /// A record of `epoch` was appended at `offset`.
    pub fn appended(&mut self, epoch: Epoch, offset: Offset) {
        match self.starts.last() {
            Some(&(last, _)) if last == epoch => {}
            Some(&(last, start)) => {
                assert!(
                    epoch > last && offset >= start,
                    "epoch {epoch} at {offset} after epoch {last} at {start}"
                );
                self.starts.push((epoch, offset));
            }
            None => self.starts.push((epoch, offset)),
        }
    }

    /// The log was cut to end at `end`: epochs that began at or past it are gone.
    pub fn truncated(&mut self, end: Offset) {
        self.starts.retain(|&(_, start)| start < end);
    }

    /// The epoch of the record before `end` (0 for an empty log).
    pub fn epoch_before(&self, end: Offset) -> Epoch {
        self.starts
            .iter()
            .take_while(|&&(_, start)| start < end)
            .last()
            .map_or(Epoch::ZERO, |&(epoch, _)| epoch)
    }

    /// The leader's answer to a follower whose last epoch is `epoch`: the greatest epoch at or
    /// below it this log has, and where that epoch ends here (the next epoch's start, or
    /// `log_end`). With no such epoch, (0, 0): nothing is known to agree.
    pub fn end_of(&self, epoch: Epoch, log_end: Offset) -> (Epoch, Offset) {
        let index = self.starts.partition_point(|&(started, _)| started <= epoch);
        if index == 0 {
            return (Epoch::ZERO, Offset::ZERO);
        }
        let end = self.starts.get(index).map_or(log_end, |&(_, next_start)| next_start);
        (self.starts[index - 1].0, end)
    }
}

/// Where a follower whose log ends at `follower_end` cuts it before following a leader: the end
/// of the longest prefix both logs hold, found from the epoch histories alone. Each round asks
/// the leader where the follower's last epoch ends in its log; an epoch the leader never had
/// makes the follower step back to the leader's last epoch below it and ask again.
pub fn divergence(
    follower: &EpochHistory,
    follower_end: Offset,
    leader: &EpochHistory,
    leader_end: Offset,
) -> Offset {
    let mut end = follower_end;
    loop {
        let epoch = follower.epoch_before(end);
        if epoch == Epoch::ZERO {
            return Offset::ZERO;
        }
        let (leaders_epoch, leaders_end) = leader.end_of(epoch, leader_end);
        if leaders_epoch == epoch {
            return end.min(leaders_end);
        }
        // The leader never had `epoch`: nothing of it agrees. Step back to where the follower's
        // records of the leader's epoch (if any) end, and ask again about the epoch before.
        let cut = follower
            .starts
            .iter()
            .find(|&&(started, _)| started > leaders_epoch)
            .map_or(end, |&(_, start)| start);
        end = end.min(cut).min(leaders_end);
        if leaders_epoch == Epoch::ZERO {
            return Offset::ZERO;
        }
    }
}
