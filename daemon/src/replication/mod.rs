//! The decisions of replicating a source across nodes, without I/O (docs/REPLICATION.md): when
//! a leader's records are committed, and which replica a fencing round makes the next leader.
//! The data path and the catalog's entries will call these; `tests` checks them against a
//! model of the whole protocol (leaders of several epochs acting at once, elections over any
//! majority, followers truncating to their leader) for the two safety properties: no committed
//! record is ever lost, and a deposed leader never commits.

#[cfg(test)]
mod tests;

/// A node of the cluster.
pub type NodeId = u64;

/// Replicas whose answers make a quorum of `replicas`: ⌈R/2⌉, a majority of an odd R.
pub fn quorum(replicas: usize) -> usize {
    replicas.div_ceil(2)
}

/// A leader's view of its epoch's replication: how far each replica has its log durable at
/// this epoch, and so how far the log is committed.
#[derive(Debug, Clone)]
pub struct CommitTracker {
    epoch: u64,
    /// Where this epoch's first record (the new leader's empty batch) is: records before it
    /// commit only once a record of this epoch does (Raft's rule; an older epoch's record held
    /// by a majority may still be overwritten by a leader that never saw it).
    epoch_start: u64,
    /// Each replica's durable end as it answered at this epoch, the leader's own included.
    durable_ends: Vec<(NodeId, u64)>,
    replicas: usize,
    committed_end: u64,
}

impl CommitTracker {
    /// A leader of `epoch` over `replicas` (its own id among them) whose log held `epoch_start`
    /// records when it was elected, of which `committed_end` were known committed.
    pub fn new(epoch: u64, replicas: &[NodeId], epoch_start: u64, committed_end: u64) -> CommitTracker {
        assert!(replicas.len() % 2 == 1, "{} replicas: R is odd", replicas.len());
        CommitTracker {
            epoch,
            epoch_start,
            durable_ends: replicas.iter().map(|&node| (node, 0)).collect(),
            replicas: replicas.len(),
            committed_end,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// `node` answered that its log agrees with this leader's up to `durable_end` and is durable
    /// there, at this epoch. A replica outside the set, or an older answer, changes nothing.
    /// Returns the committed end, which only grows.
    pub fn durable(&mut self, node: NodeId, durable_end: u64) -> u64 {
        if let Some((_, end)) = self.durable_ends.iter_mut().find(|(replica, _)| *replica == node) {
            *end = (*end).max(durable_end);
        }
        let mut ends: Vec<u64> = self.durable_ends.iter().map(|(_, end)| *end).collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        let on_a_quorum = ends[quorum(self.replicas) - 1];
        if on_a_quorum > self.epoch_start {
            self.committed_end = self.committed_end.max(on_a_quorum);
        }
        self.committed_end
    }

    /// The end of what a quorum holds durably with a record of this epoch among it.
    pub fn committed_end(&self) -> u64 {
        self.committed_end
    }
}

/// A replica's answer to a fencing round: it promised to refuse every older epoch, and its log
/// is durable up to `durable_end` with `last_epoch` the epoch of its last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceAnswer {
    pub node: NodeId,
    pub last_epoch: u64,
    pub durable_end: u64,
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
pub fn choose_leader(replicas: &[NodeId], answers: &[FenceAnswer]) -> Result<FenceAnswer, NoQuorum> {
    let mut counted: Vec<FenceAnswer> = Vec::new();
    for answer in answers {
        if replicas.contains(&answer.node) && !counted.iter().any(|seen| seen.node == answer.node) {
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
            (a.last_epoch, a.durable_end, std::cmp::Reverse(a.node)).cmp(&(
                b.last_epoch,
                b.durable_end,
                std::cmp::Reverse(b.node),
            ))
        })
        .expect("a quorum is at least one answer"))
}
