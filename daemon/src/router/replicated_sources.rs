//! A topic's later source of several replicas (docs/REPLICATION.md, docs/SOURCES.md): made as a
//! replicated topic is, by unit id. Each replica opens it empty as a follower, knowing its
//! source number; with a quorum open its `SourceAdded` is decided, its first attached replica
//! leading at epoch 1, and that one is promoted with every subscription of the topic attached
//! from 0 (everything in the source was published after they were created). From then on the
//! elections, replica moves, drains and reconciliation handle it as a topic
//! (`CatalogState::unit_by_id`).

use super::*;
use crate::catalog::SourceRecord;
use crate::replication::quorum;

impl<S: Storage> Router<S> {
    /// Adds `record`, a source of `topic` placed on its replicas (the first its leader), as
    /// above. Refused, or not decided by a quorum, its replicas' files are removed.
    pub(super) async fn add_replicated_source(
        &self,
        topic: &TopicRecord,
        record: SourceRecord,
    ) -> Result<(), ControlError> {
        assert!(
            record.replicas.len() > 1 && record.replicas[0] == record.shard,
            "placed as a replicated unit"
        );
        let id = record.id;
        self.set_creating(id, true);
        let added = self.add_replicated_source_on(topic, record).await;
        self.set_creating(id, false);
        added
    }

    /// `add_replicated_source`, its unit marked as being created.
    async fn add_replicated_source_on(
        &self,
        topic: &TopicRecord,
        mut record: SourceRecord,
    ) -> Result<(), ControlError> {
        let number = record.source.get();
        // The count before it: it takes nothing until every replica applies the new one
        // (`apply_active_sources`), as a source of one replica.
        let active = self.state.borrow().active_sources(topic.id);
        let (attached, refusal) = self
            .attach_new_replicas(
                record.id,
                &topic.name,
                topic.message_retention_seconds,
                (record.source, active),
                &record.replicas,
            )
            .await;
        let detach_all = || async {
            for shard in &attached {
                let detach = ControlRequest::DetachTopic { topic_id: record.id, delete_data: true };
                let _ = self.call_forwarder(*shard, detach).await;
            }
        };
        let count = record.replicas.len();
        if attached.len() < quorum(count) {
            detach_all().await;
            let why = refusal.map(|error| format!(": {}", Status::from(error))).unwrap_or_default();
            return Err(ControlError::unavailable(format!(
                "topic '{}' source {number}: only {} of {count} replicas could be made{why}",
                topic.name,
                attached.len()
            )));
        }
        record.shard =
            *record.replicas.iter().find(|shard| attached.contains(shard)).expect("a quorum attached");
        let refusal = match self.propose(CatalogEntry::SourceAdded(record.clone())).await {
            Ok(Applied::Done) => None,
            Ok(Applied::Refused(why)) => Some(ControlError::failed_precondition(why)),
            Ok(_) => Some(ControlError::NotFound(format!("topic '{}' (deleted meanwhile)", topic.name))),
            Err(error) => Some(error),
        };
        if let Some(error) = refusal {
            // Undecided, the source may still be added: its replicas stay, and reconciling
            // removes them if the catalog never names it.
            if !error.is_undecided() {
                detach_all().await;
            }
            return Err(error);
        }
        // Served once promoted, with the topic's subscriptions; if this fails, the leader's
        // node promotes it on its own (`reconcile_replicas`).
        let Some(unit) = self.state.borrow().unit_by_id(record.id) else {
            return Err(ControlError::NotFound(format!("topic '{}' (deleted meanwhile)", topic.name)));
        };
        if let Err(status) = self.promote(&unit).await {
            crate::log_warn!(
                "ringpostd: topic '{}' source {number}: promoting its first leader: {status}; its node will try again",
                topic.name
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::elections::{self, Elections, Electorate};
    use super::super::replicas::subscriptions_served_on;
    use crate::catalog::{
        Applied, CatalogEntry, CatalogState, SourceRecord, SubscriptionRecord, TopicRecord,
    };
    use crate::control::{ControlOk, ControlRequest};
    use crate::ids::{NodeId, ShardId, SourceId, TopicId};
    use crate::router::ControlError;
    use crate::runtime::sim;
    use std::cell::{Ref, RefCell};
    use std::future::Future;
    use std::time::Duration;

    fn shard(node: u64, local: u32) -> ShardId {
        ShardId::new(NodeId::new(node), local)
    }

    const TOPIC: TopicId = TopicId::new(9);
    const SOURCE: TopicId = TopicId::new(12);

    /// Three nodes of two shards: a topic of three replicas on each node's shard 0, its source
    /// 1 of three on each node's shard 1, led on node 1.
    fn catalog() -> CatalogState {
        let mut state = CatalogState::default();
        state.apply(CatalogEntry::TopicCreated(TopicRecord {
            id: TOPIC,
            name: "hot".into(),
            message_retention_seconds: 60,
            shard: shard(2, 0),
            created_ms: 1,
            labels: Default::default(),
            replicas: vec![shard(2, 0), shard(1, 0), shard(3, 0)],
            epoch: 1,
        }));
        let source = SourceRecord {
            id: SOURCE,
            topic_id: TOPIC,
            source: SourceId::new(1).unwrap(),
            shard: shard(1, 1),
            created_ms: 2,
            replicas: vec![shard(1, 1), shard(2, 1), shard(3, 1)],
            epoch: 1,
            retiring: false,
        };
        assert_eq!(state.apply(CatalogEntry::SourceAdded(source)), Applied::Done);
        state
    }

    /// An electorate whose replicas answer the fencing round with their durable ends, and whose
    /// decisions apply to its catalog at once.
    struct Cluster {
        catalog: RefCell<CatalogState>,
        elections: Elections,
        durable_ends: Vec<(ShardId, u64)>,
        fenced: RefCell<Vec<(ShardId, TopicId, u64)>>,
    }

    impl Electorate for Cluster {
        fn elections(&self) -> &Elections {
            &self.elections
        }

        fn catalog(&self) -> Ref<'_, CatalogState> {
            self.catalog.borrow()
        }

        fn nodes_heard_within(&self, _within: Duration) -> Option<Vec<NodeId>> {
            Some(vec![NodeId::new(2), NodeId::new(3)])
        }

        fn control(
            &self,
            shard: ShardId,
            request: ControlRequest,
        ) -> impl Future<Output = Result<ControlOk, ControlError>> {
            let ControlRequest::FenceReplica { topic_id, epoch } = request else { panic!("{request:?}") };
            self.fenced.borrow_mut().push((shard, topic_id, epoch));
            let end = self.durable_ends.iter().find(|(replica, _)| *replica == shard).map(|(_, end)| *end);
            async move {
                match end {
                    Some(durable_end) => Ok(ControlOk::Fenced { last_epoch: 1, durable_end }),
                    None => Err(ControlError::no_answer("its node is down")),
                }
            }
        }

        fn decide(&self, entry: CatalogEntry) -> impl Future<Output = Result<Applied, ControlError>> {
            let applied = self.catalog.borrow_mut().apply(entry);
            async move { Ok(applied) }
        }
    }

    /// A replicated source whose leader's node is not heard from is a candidate by its unit id;
    /// its election fences its own replicas (not its topic's) at its own next epoch, and the
    /// most up-to-date of those that answered leads it, its topic's leader unchanged.
    #[test]
    fn a_source_whose_leaders_node_is_gone_is_elected_among_its_own_replicas() {
        sim::run(0, async {
            let cluster = Cluster {
                catalog: RefCell::new(catalog()),
                elections: Elections::default(),
                durable_ends: vec![
                    (shard(2, 1), 40),
                    (shard(3, 1), 41),
                    (shard(2, 0), 99),
                    (shard(3, 0), 99),
                ],
                fenced: RefCell::default(),
            };
            let heard = cluster.nodes_heard_within(Duration::ZERO).unwrap();
            let candidates = cluster.elections.candidates(&cluster.catalog(), &heard, crate::runtime::now());
            assert_eq!(candidates, vec![SOURCE], "the topic's leader on node 2 is heard");
            elections::elect(&cluster, SOURCE, None).await.unwrap();
            let mut fenced = cluster.fenced.take();
            fenced.sort();
            assert_eq!(
                fenced,
                vec![(shard(1, 1), SOURCE, 2), (shard(2, 1), SOURCE, 2), (shard(3, 1), SOURCE, 2)]
            );
            let state = cluster.catalog();
            let source = state.unit_by_id(SOURCE).unwrap();
            assert_eq!((source.shard, source.epoch, &*source.name), (shard(3, 1), 2, "hot"));
            assert_eq!(state.unit_of(SOURCE), (TOPIC, SourceId::new(1).unwrap()));
            let topic = state.topic_by_id(TOPIC).unwrap();
            assert_eq!((topic.shard, topic.epoch), (shard(2, 0), 1), "the topic's own log is not elected");
        });
    }

    /// A promoted source's leader serves every subscription of its topic from its sync point on
    /// that source (0 for one created before the source), and its topic's own leader from
    /// theirs on source 0; a detached subscription is served on neither.
    #[test]
    fn a_promoted_source_serves_each_subscription_from_its_sync_point_there() {
        let mut state = catalog();
        let record = |id: u64, name: &str, start_offset: u64, source_starts: Vec<(SourceId, u64)>| {
            SubscriptionRecord {
                id,
                name: name.into(),
                topic_id: TOPIC,
                topic_name: "hot".into(),
                start_offset,
                settings: Default::default(),
                created_ms: 3,
                detached: false,
                source_starts,
            }
        };
        let one = SourceId::new(1).unwrap();
        state.apply(CatalogEntry::SubscriptionCreated(record(20, "before", 5, Vec::new())));
        state.apply(CatalogEntry::SubscriptionCreated(record(21, "after", 7, vec![(one, 11)])));
        state.apply(CatalogEntry::SubscriptionCreated(record(22, "gone", 0, vec![(one, 0)])));
        state.apply(CatalogEntry::SubscriptionDetached { id: 22, name: "gone".into() });
        let served = |unit: TopicId| -> Vec<(String, TopicId, u64)> {
            let unit = state.unit_by_id(unit).unwrap();
            subscriptions_served_on(&state, &unit)
                .into_iter()
                .map(|request| match request {
                    ControlRequest::AttachSubscription { name, topic_id, start_offset, .. } => {
                        (name, topic_id, start_offset)
                    }
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(served(SOURCE), vec![("after".into(), SOURCE, 11), ("before".into(), SOURCE, 0)]);
        assert_eq!(served(TOPIC), vec![("after".into(), TOPIC, 7), ("before".into(), TOPIC, 5)]);
    }
}
