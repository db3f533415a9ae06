//! Moving a replicated topic's replica off a node (docs/REPLICATION.md, "Moving a replica"):
//! two changes of one replica each, the one leaving taken away first and the new one added
//! after, each decided in the catalog and followed by an election whose leader commits a
//! record of its epoch before the next change. Run by the catalog's leader for a node that
//! leaves the cluster. The steps are generic over `Mover` (an `Electorate` that also chooses
//! where a new replica goes), so that the replication simulation runs them as they are.

use super::elections::{self, Electorate};
use super::ControlError;
use super::Router;
use crate::catalog::placement::source_key;
use crate::catalog::{CatalogEntry, TopicRecord};
use crate::control::{ControlOk, ControlRequest, ReplicaProgress};
use crate::ids::{NodeId, ShardId, TopicId};
use crate::storage::Storage;
use std::time::Duration;

/// How long each step of a move may take: an election and its leader's first commit, or the
/// new replica catching up with its leader.
pub const MOVE_STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a move looks at the leader's progress.
pub(super) const MOVE_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Replica moves one node's removal runs at once.
pub const MOVES_IN_FLIGHT_MAX: usize = 8;

impl<S: Storage> Router<S> {
    /// Moves every replica on node `node_id` (of topics with more than one) to other nodes,
    /// at most `MOVES_IN_FLIGHT_MAX` at once. Fails with the first move that failed; those
    /// done stay done, and running it again moves the rest.
    pub(super) async fn move_replicas_off(&self, node_id: NodeId) -> Result<usize, ControlError> {
        // Every replicated unit: the topics' own logs and their later sources.
        let topics: Vec<TopicId> = self
            .state
            .borrow()
            .replicated_units()
            .iter()
            .filter(|topic| {
                // Those on the node, and those a move cut short left with an even count.
                let on_node = topic.replicas.iter().any(|replica| replica.node() == node_id);
                on_node || topic.replicas.len().is_multiple_of(2)
            })
            .map(|topic| topic.id)
            .collect();
        let count = topics.len();
        crate::sync::try_for_each_concurrent(topics, MOVES_IN_FLIGHT_MAX, |topic_id| async move {
            self.move_replica_off(topic_id, node_id).await
        })
        .await?;
        Ok(count)
    }

    /// Moves topic `topic_id`'s replica on node `node_id` to a node that holds none: elections
    /// of the topic by the catalog's timers wait meanwhile (this runs its own).
    async fn move_replica_off(&self, topic_id: TopicId, node_id: NodeId) -> Result<(), ControlError> {
        // An election the catalog's timers run (its leader's node went away) finishes first.
        let started = crate::runtime::now();
        while !self.replicas.elections.begin(topic_id) {
            if crate::runtime::now() - started >= MOVE_STEP_TIMEOUT {
                return Err(ControlError::unavailable(format!(
                    "topic {topic_id:x} has been in an election for {} s; try again",
                    MOVE_STEP_TIMEOUT.as_secs()
                )));
            }
            crate::runtime::sleep(MOVE_POLL_INTERVAL).await;
        }
        let moved = move_replica(self, topic_id, node_id).await;
        self.replicas.elections.end(topic_id);
        // A topic deleted while its replica moved leaves nothing to move: the removal goes on,
        // rather than refusing the node as not found (the cluster simulation's seed 62).
        if moved.is_err() && self.state.borrow().unit_by_id(topic_id).is_none() {
            return Ok(());
        }
        moved.map_err(|error| {
            let unit = self.state.borrow().unit_shown(topic_id);
            error.within(format!("moving {unit} off node {node_id}"))
        })
    }

    /// The forwarder a new replica of `topic` goes to: on a node that holds none of its
    /// replicas, is not `leaving_node` and answers, first in placement's preference.
    fn new_replica_place(&self, topic: &TopicRecord, leaving_node: NodeId) -> Result<ShardId, ControlError> {
        let holding: Vec<NodeId> = topic.replicas.iter().map(|replica| replica.node()).collect();
        // A shard serves one source of a topic: none holding another of the topic's units.
        let (topic_id, number) = self.state.borrow().unit_of(topic.id);
        let others = self.state.borrow().shards_of_other_units(topic.id);
        let key = if topic_id == topic.id {
            topic.name.clone()
        } else {
            source_key(&topic.name, number.get()).into()
        };
        let heard = self.catalog.voters_heard_within(super::elections::SOURCE_FAILURE_TIMEOUT);
        self.place(&key)
            .into_iter()
            .find(|shard| {
                let node = shard.node();
                node != leaving_node
                    && !holding.contains(&node)
                    && !others.contains(shard)
                    && heard.as_ref().is_none_or(|heard| heard.contains(&node))
            })
            .ok_or_else(|| {
                ControlError::failed_precondition(format!(
                    "no node other than its replicas' and node {leaving_node} has a forwarder to take it"
                ))
            })
    }
}

/// What a move calls beyond what an election does: where a new replica goes. The router is
/// the daemon's `Mover`; the replication simulation's cluster is another, so that the
/// simulation runs these steps, not a copy of them.
pub trait Mover: Electorate {
    /// The forwarder a new replica of `topic` goes to, on a node other than `leaving_node`.
    fn new_replica_place(&self, topic: &TopicRecord, leaving_node: NodeId) -> Result<ShardId, ControlError>;
}

impl<S: Storage> Mover for Router<S> {
    fn new_replica_place(&self, topic: &TopicRecord, leaving_node: NodeId) -> Result<ShardId, ControlError> {
        Router::new_replica_place(self, topic, leaving_node)
    }
}

/// Moves topic `topic_id`'s replica on node `node_id` (if it has one, or gives back the replica
/// a move cut short took away) to a node that holds none. The caller holds the topic's turn
/// (`Elections::begin`).
pub async fn move_replica<M: Mover>(
    mover: &M,
    topic_id: TopicId,
    node_id: NodeId,
) -> Result<(), ControlError> {
    let Some(topic) = topic_by_id(mover, topic_id) else { return Ok(()) };
    let leaving = topic.replicas.iter().copied().find(|replica| replica.node() == node_id);
    // An even count is a move cut short between its steps: it gets its replica back.
    let short = topic.replicas.len().is_multiple_of(2);
    if leaving.is_none() && !short {
        return Ok(());
    }
    // The new replica's place, chosen before anything changes, so that a move with nowhere to
    // go leaves the topic as it was.
    let target = mover.new_replica_place(&topic, node_id)?;
    if short {
        // The change that left an even count may have failed before its election and its
        // leader's commit: then only the leader is known to hold everything acknowledged (the
        // replica taken out held the rest), and a quorum of the set grown by one could be the
        // other replica and the new, empty one. So the set is settled first: an election in
        // it, whose leader commits its epoch on both replicas.
        elections::elect(mover, topic_id, None).await?;
        wait_epoch_committed(mover, topic_id).await?;
    }
    match leaving {
        // Two replicas, one of them leaving: one is added first, so that none is ever alone,
        // then the move goes on as from three.
        Some(_) if topic.replicas.len() <= 2 => {
            add_replica(mover, topic_id, target).await?;
            Box::pin(move_replica(mover, topic_id, node_id)).await
        }
        // 1. The replica leaving goes first, so that nothing waits on a node that may be gone;
        // 2. then the new one.
        Some(leaving) => {
            take_out(mover, topic_id, leaving).await?;
            add_replica(mover, topic_id, target).await
        }
        None => add_replica(mover, topic_id, target).await,
    }
}

/// The unit `topic_id` (a topic's own log or one of its later sources) as a topic record.
fn topic_by_id<M: Mover>(mover: &M, topic_id: TopicId) -> Option<TopicRecord> {
    mover.catalog().unit_by_id(topic_id)
}

fn topic_or_deleted<M: Mover>(mover: &M, topic_id: TopicId) -> Result<TopicRecord, ControlError> {
    topic_by_id(mover, topic_id).ok_or_else(|| ControlError::not_found("the topic was deleted"))
}

/// Takes replica `leaving` out of the topic's set, the lead handed to another replica first if
/// it has it (a set must hold its leader).
async fn take_out<M: Mover>(mover: &M, topic_id: TopicId, leaving: ShardId) -> Result<(), ControlError> {
    if topic_or_deleted(mover, topic_id)?.shard == leaving {
        elections::elect(mover, topic_id, Some(leaving)).await?;
        wait_epoch_committed(mover, topic_id).await?;
    }
    let topic = topic_or_deleted(mover, topic_id)?;
    let kept: Vec<ShardId> = topic.replicas.iter().copied().filter(|replica| *replica != leaving).collect();
    change_replicas(mover, topic_id, kept).await
}

/// Adds a replica on `target` (attached empty first), and waits until it holds what its leader
/// held when it joined.
async fn add_replica<M: Mover>(mover: &M, topic_id: TopicId, target: ShardId) -> Result<(), ControlError> {
    let topic = topic_or_deleted(mover, topic_id)?;
    let (source, active) = mover.catalog().unit_source_and_active(topic_id);
    let attach = ControlRequest::AttachReplica {
        topic_id,
        name: topic.name.to_string(),
        retention_seconds: topic.message_retention_seconds,
        recovering: false,
        source,
        active,
    };
    mover.control(target, attach).await?;
    let mut grown = topic.replicas.clone();
    grown.push(target);
    change_replicas(mover, topic_id, grown).await?;
    wait_caught_up(mover, topic_id, target).await
}

/// One change of the topic's replicas, decided in the catalog, then an election among the new
/// set (its leader syncs the replicas it names), whose leader must commit a record of its epoch
/// before anything changes again.
async fn change_replicas<M: Mover>(
    mover: &M,
    topic_id: TopicId,
    replicas: Vec<ShardId>,
) -> Result<(), ControlError> {
    let applied = mover.decide(CatalogEntry::TopicReplicasChanged { id: topic_id, replicas }).await?;
    if applied != crate::catalog::Applied::Updated(true) {
        return Err(ControlError::ChangedMeanwhile(
            "the topic's leader or replicas changed meanwhile; try again".into(),
        ));
    }
    elections::elect(mover, topic_id, None).await?;
    wait_epoch_committed(mover, topic_id).await
}

/// The topic's leader's progress, as its forwarder reports it.
async fn leader_progress<M: Mover>(mover: &M, topic: &TopicRecord) -> Result<ReplicaProgress, ControlError> {
    match mover.control(topic.shard, ControlRequest::ReplicaProgress { topic_id: topic.id }).await? {
        ControlOk::Progress(progress) => Ok(progress),
        other => Err(ControlError::internal(format!("a replica's progress answered with {other:?}"))),
    }
}

/// Refuses at once when the catalog no longer hears from the node of the topic's leader: the
/// move stops, and the catalog's timers elect another leader as for any topic.
fn check_leader_heard<M: Mover>(mover: &M, topic: &TopicRecord) -> Result<(), ControlError> {
    let node = topic.shard.node();
    let heard = mover.nodes_heard_within(mover.elections().timings().source_failure_timeout);
    if heard.is_some_and(|heard| !heard.contains(&node)) {
        return Err(ControlError::unavailable(format!(
            "the node of its leader, node {node}, does not answer"
        )));
    }
    Ok(())
}

/// Waits until the topic's leader, at the epoch the catalog names, holds on a quorum of its
/// replicas everything its logs held when it was elected (at most the move step timeout).
async fn wait_epoch_committed<M: Mover>(mover: &M, topic_id: TopicId) -> Result<(), ControlError> {
    let timings = mover.elections().timings();
    let started = crate::runtime::now();
    loop {
        let topic = topic_or_deleted(mover, topic_id)?;
        check_leader_heard(mover, &topic)?;
        if let Ok(progress) = leader_progress(mover, &topic).await {
            if progress.leader && progress.epoch == topic.epoch && progress.epoch_committed {
                return Ok(());
            }
        }
        if crate::runtime::now() - started >= timings.move_step_timeout {
            return Err(ControlError::unavailable(format!(
                "its leader of epoch {} did not commit a record of its epoch within {} s",
                topic.epoch,
                timings.move_step_timeout.as_secs()
            )));
        }
        crate::runtime::sleep(timings.move_poll_interval).await;
    }
}

/// Waits until replica `target` holds, durably, everything the topic's leader held durably
/// when this began (at most the move step timeout).
async fn wait_caught_up<M: Mover>(mover: &M, topic_id: TopicId, target: ShardId) -> Result<(), ControlError> {
    let timings = mover.elections().timings();
    let started = crate::runtime::now();
    let mut goal: Option<[u64; 2]> = None;
    loop {
        let topic = topic_or_deleted(mover, topic_id)?;
        check_leader_heard(mover, &topic)?;
        if topic.shard == target {
            // The election after the change chose the new replica: it was as far as any of a
            // quorum (an empty topic's replicas are all equal, and the lowest node wins the
            // tie), and its epoch is committed. A leader is not among its own followers, so
            // waiting to see it there waited the whole step timeout.
            return Ok(());
        }
        if let Ok(progress) = leader_progress(mover, &topic).await {
            if progress.leader && progress.epoch == topic.epoch {
                let goal = *goal.get_or_insert(progress.durable_ends);
                let held = progress
                    .followers
                    .iter()
                    .find(|(shard, _)| *shard == target.global())
                    .map(|(_, ends)| *ends);
                if held.is_some_and(|held| held[0] >= goal[0] && held[1] >= goal[1]) {
                    return Ok(());
                }
            }
        }
        if crate::runtime::now() - started >= timings.move_step_timeout {
            return Err(ControlError::unavailable(format!(
                "the new replica on {} did not catch up with its leader within {} s; it goes on catching up",
                target,
                timings.move_step_timeout.as_secs()
            )));
        }
        crate::runtime::sleep(timings.move_poll_interval).await;
    }
}
