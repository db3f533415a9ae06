//! Retiring a topic's highest source (docs/SOURCES.md, "Retiring a source"): the catalog marks
//! it retiring (`CatalogEntry::SourceRetiring`), so the topic's active count falls by one and
//! every unit applies the new count (`ControlRequest::ApplySources`): the retiring source takes
//! no publish and is still delivered from. The catalog's leader then looks, every
//! `SOURCES_PASS_INTERVAL`, at each retiring source's subscriptions: once each one's ack floor
//! there is at its fence (the source's assigned end when it stopped taking publishes), or it
//! has none, the source is deleted (`CatalogEntry::SourceDeleted`) and its log removed.

use super::sources::Unit;
use super::*;
use crate::ids::SourceId;

/// How often the catalog's leader looks whether a retiring source is delivered out, and tells
/// every unit of a topic of several sources its active count again (a unit that missed a
/// change, its node unreachable then, learns it here). A second: a retired source's files
/// wait at most that long after its last acknowledgement, and a topic of several sources costs
/// one small control request per unit a second.
pub const SOURCES_PASS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl<S: Storage> Router<S> {
    /// Retires topic `name`'s highest active source (the load-following loop's way down): it
    /// takes no more publishes, its subscribers receive what it holds, and it is deleted once
    /// every subscription acknowledged that. Refused for a topic of one active source.
    pub async fn retire_source(&self, name: &str) -> Result<(), ControlError> {
        let _update = self.update_permit().await?;
        let topic = self.topic_record(name)?;
        self.retire_highest(&topic).await
    }

    /// Retires topic `topic`'s highest active sources until `count` are active.
    pub(super) async fn retire_sources(&self, topic: &TopicRecord, count: u32) -> Result<(), ControlError> {
        while self.state.borrow().active_sources(topic.id) > count.max(1) {
            self.retire_highest(topic).await?;
        }
        Ok(())
    }

    /// Commits the retirement of topic `topic`'s highest active source, then tells each of its
    /// units the count.
    async fn retire_highest(&self, topic: &TopicRecord) -> Result<(), ControlError> {
        // A replicated source retires as one of one replica: its followers know the count
        // (their attach says it, and their promotion applies the catalog's), and its deletion
        // removes every replica (`delete_retired`).
        self.check_gate_passed(topic)?;
        let active = self.state.borrow().active_sources(topic.id);
        let source =
            SourceId::new(active - 1).filter(|source| *source != SourceId::FIRST).ok_or_else(|| {
                ControlError::failed_precondition(format!(
                    "topic '{}' has one active source: source 0, the topic's own log, never retires",
                    topic.name
                ))
            })?;
        match self.propose(CatalogEntry::SourceRetiring { topic_id: topic.id, source }).await? {
            Applied::Updated(true) => {}
            _ => {
                return Err(ControlError::failed_precondition(format!(
                    "topic '{}': source {} did not retire (the topic or its sources changed meanwhile)",
                    topic.name,
                    source.get()
                )))
            }
        }
        self.apply_active_sources(topic.id)
            .await
            .map_err(|status| not_applied("topic", &topic.name, status))?;
        Ok(())
    }

    /// On every node, its units told their delivery gate again where it changed
    /// (`retell_gates`). On the catalog's leader: each topic of several sources' units told
    /// its active count again, and each retiring source whose every subscription acknowledged
    /// up to its fence deleted. One change at a time with the updates (the update gate).
    pub async fn sources_pass(&self) {
        self.retell_gates().await;
        if !self.catalog.leads() {
            return;
        }
        let Ok(_update) = self.update_permit().await else { return };
        {
            // Only sources the catalog still names (`serve_before_count`).
            let state = self.state.borrow();
            self.sources_served.borrow_mut().retain(|unit_id| state.unit_by_id(*unit_id).is_some());
        }
        for topic_id in self.topics_to_pass() {
            let mut answers = Vec::new();
            // A unit that does not answer stops the topic's pass until the next: the units
            // after it may gain keys it still takes.
            if let Err(error) = self.tell_count(topic_id, &mut answers).await {
                crate::log_warn!(
                    "ringpostd: telling topic {topic_id:x}'s sources their active count: {}",
                    Status::from(error)
                );
            }
            let active = self.state.borrow().active_sources(topic_id);
            for (unit, fence, floors) in &answers {
                if unit.source.get() >= active && self.delivered_out(topic_id, *fence, floors) {
                    self.delete_retired(topic_id, *unit).await;
                }
            }
            let answers: Vec<_> =
                answers.into_iter().map(|(unit, fence, floors)| (unit.source.get(), fence, floors)).collect();
            self.commit_passes(topic_id, &answers).await;
        }
    }

    /// Whether every subscription of topic `topic_id` the catalog serves acknowledged up to
    /// `fence` on a retiring source that answered `floors` (`delivered_out`).
    fn delivered_out(&self, topic_id: TopicId, fence: u64, floors: &[(u64, u64)]) -> bool {
        let state = self.state.borrow();
        let served: Vec<u64> = state.subscriptions_served_by(topic_id).map(|record| record.id).collect();
        delivered_out(&served, fence, floors)
    }

    /// Deletes retiring source `unit` of topic `topic_id`, delivered out: the catalog first,
    /// then every replica's files, its leader's first so that nothing replicates to a follower
    /// once it is gone. A replica whose node does not answer now is removed by that node: its
    /// router detaches the replicas the catalog no longer names (`reconcile_replicas`), and at
    /// its next start removes every folder the catalog does not name, as a deleted topic's.
    /// No election follows: the elections look only at units the catalog names.
    async fn delete_retired(&self, topic_id: TopicId, unit: Unit) {
        let replicas = match self.state.borrow().sources.get(&(topic_id, unit.source)) {
            Some(record) if record.id == unit.id => record.replica_shards(),
            _ => return,
        };
        let entry = CatalogEntry::SourceDeleted { topic_id, source: unit.source, id: unit.id };
        match self.propose(entry).await {
            Ok(Applied::Updated(true)) => {}
            Ok(_) => return,
            Err(error) => {
                crate::log_warn!(
                    "ringpostd: deleting retired source {} of topic {topic_id:x}: {error}",
                    unit.source.get()
                );
                return;
            }
        }
        crate::log_info!("ringpostd: source {} of topic {topic_id:x} retired and deleted", unit.source.get());
        for shard in detach_order(unit.shard, &replicas) {
            let detach = ControlRequest::DetachTopic { topic_id: unit.id, delete_data: true };
            let detached = futures_lite::future::or(self.call_forwarder(shard, detach), async {
                crate::runtime::sleep(super::replicas::REPLICA_ATTACH_WAIT).await;
                Err(ControlError::no_answer("its node did not answer in time"))
            });
            if let Err(error) = detached.await {
                crate::log_warn!(
                    "ringpostd: removing the files of retired source {} of topic {topic_id:x} on {shard}: {}; \
                     its node removes them",
                    unit.source.get(),
                    Status::from(error)
                );
            }
        }
    }
}

/// Whether a retiring source is delivered out: each subscription in `served` (those the
/// catalog serves on every source of the topic) has an ack floor in `floors`, the source's
/// answer, at or above `fence`. One the source does not list is not attached there yet (its
/// leader was just promoted and attaches the subscriptions one by one), so its floor is not
/// known: the source waits rather than lose what that subscription has not acknowledged.
pub(super) fn delivered_out(served: &[u64], fence: u64, floors: &[(u64, u64)]) -> bool {
    let floors: std::collections::HashMap<u64, u64> = floors.iter().copied().collect();
    served.iter().all(|id| floors.get(id).is_some_and(|floor| *floor >= fence))
}

/// The shards a retired source's replicas are removed from, in order: its leader's first (it
/// stops replicating, so no follower waits for an append that will not come), then the others
/// in the catalog's order.
pub(super) fn detach_order(leader: ShardId, replicas: &[ShardId]) -> Vec<ShardId> {
    std::iter::once(leader).chain(replicas.iter().copied().filter(|shard| *shard != leader)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;

    /// A retiring source is deleted once every subscription the catalog serves is listed at or
    /// above its fence; a subscription it does not list yet (a leader just promoted, its
    /// subscriptions not all attached) keeps it, as one below the fence does, and a source
    /// without subscriptions is delivered out.
    #[test]
    fn a_retiring_source_is_delivered_out_when_every_served_subscription_passed_its_fence() {
        assert!(delivered_out(&[], 10, &[]));
        assert!(delivered_out(&[1, 2], 10, &[(2, 10), (1, 12)]));
        assert!(!delivered_out(&[1, 2], 10, &[(1, 12)]), "subscription 2 not attached yet");
        assert!(!delivered_out(&[1, 2], 10, &[]), "a promoted leader before its subscriptions");
        assert!(!delivered_out(&[1, 2], 10, &[(1, 12), (2, 9)]));
        // A subscription deleted meanwhile (no longer served) does not hold it.
        assert!(delivered_out(&[1], 10, &[(1, 10), (3, 0)]));
    }

    /// A retired source's replicas are removed from its leader first, each once.
    #[test]
    fn a_retired_sources_leader_is_removed_first() {
        let shard = |node: u64, local: u32| ShardId::new(NodeId::new(node), local);
        let replicas = [shard(1, 1), shard(2, 1), shard(3, 1)];
        assert_eq!(detach_order(shard(2, 1), &replicas), vec![shard(2, 1), shard(1, 1), shard(3, 1)]);
        assert_eq!(detach_order(shard(1, 0), &[shard(1, 0)]), vec![shard(1, 0)]);
    }
}
