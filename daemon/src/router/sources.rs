//! A topic's publish sources after the first: how many a topic may ask for, where each is
//! placed, and their records in the catalog. Each is a unit of its own (`SourceRecord`): its
//! own id from the catalog's counter, its own replicas, epoch and leader.
//!
//! Sources are placed, recorded and attached here (`Unit`: what the subscription operations
//! send to each of a topic's sources); every subscription of the topic is served on every
//! source, from its sync point there (`SubscriptionRecord::start_on`).

use super::*;
use crate::api::control::{SourceRoute, SourceRoutes};
use crate::catalog::entry::SHARD_UNPLACED;
use crate::catalog::placement::{place_source, source_key};
use crate::catalog::SourceRecord;
use crate::ids::{SourceId, SOURCES_PER_TOPIC_MAX};

/// One unit serving a topic: its own log (source 0) or one of its later sources, by the unit's
/// id (what a forwarder knows it by) and its leader's shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unit {
    pub id: TopicId,
    pub source: SourceId,
    pub shard: ShardId,
}

/// A unit's answer to `ApplySources`: the unit, its fence and its subscriptions' ack floors.
pub(super) type UnitAnswer = (Unit, u64, Vec<(u64, u64)>);

/// What serves subscription `record` on `unit`, from its sync point there.
pub(super) fn attach_subscription(record: &SubscriptionRecord, unit: &Unit) -> ControlRequest {
    ControlRequest::AttachSubscription {
        subscription_id: record.id,
        name: record.name.to_string(),
        topic_id: unit.id,
        settings: record.settings.clone(),
        create: false,
        start_offset: record.start_on(unit.source),
    }
}

/// Counts every source's leader in `placement`'s loads, as `place` counts every topic's, so that
/// topics and sources spread over the forwarders together.
pub(super) fn count_sources(layout: &Layout, state: &CatalogState, placement: &mut Placement) {
    for source in state.sources.values() {
        if let Some(index) = layout.index_of(source.shard) {
            placement.assign(index);
        }
    }
}

impl<S: Storage> Router<S> {
    /// Refuses a topic's source count that message ids cannot name, or that the cluster's
    /// forwarders cannot hold with `replicas` replicas each, one unit of the topic per shard.
    pub(super) fn check_source_count(&self, count: u32, replicas: usize) -> Result<(), ControlError> {
        if count == 0 || count > SOURCES_PER_TOPIC_MAX {
            return Err(ControlError::invalid_argument(format!(
                "{count} sources: a topic has 1 to {SOURCES_PER_TOPIC_MAX} (SOURCES_PER_TOPIC_MAX)"
            )));
        }
        let shards = self.source_shards();
        if count as usize * replicas > shards {
            return Err(ControlError::failed_precondition(format!(
                "{count} sources of {replicas} replicas need {} forwarder shards, one source of a \
                 topic per shard; the cluster has {shards} to give",
                count as usize * replicas
            )));
        }
        Ok(())
    }

    /// The forwarder shards placement may give a new source: every registered one but those of
    /// nodes being removed.
    pub(super) fn source_shards(&self) -> usize {
        let layout = self.current_layout();
        let draining = self.draining.borrow();
        layout.shards.iter().filter(|shard| !draining.contains(&shard.node())).count()
    }

    /// Adds sources to topic `topic` until it has `count`, each with as many replicas as the
    /// topic's own log, one at a time (each placement counts the ones before it).
    pub(super) async fn add_sources(&self, topic: &TopicRecord, count: u32) -> Result<(), ControlError> {
        let replicas = topic.replica_count();
        let have = self.state.borrow().source_count(topic.id) as u32;
        for number in have..count {
            self.check_gate_passed(topic)?;
            self.add_source(topic, number, replicas).await?;
            self.apply_active_sources(topic.id).await?;
        }
        Ok(())
    }

    /// Tells each of topic `topic_id`'s units its active count as the catalog holds it
    /// (`ControlRequest::ApplySources`), in rule 2's order (`tell_count`); each answers with its
    /// fence and its subscriptions' ack floors, by unit.
    pub(super) async fn apply_active_sources(
        &self,
        topic_id: TopicId,
    ) -> Result<Vec<UnitAnswer>, ControlError> {
        let mut answers = Vec::new();
        self.tell_count(topic_id, &mut answers).await?;
        Ok(answers)
    }

    /// Tells topic `topic_id`'s units its active count, the sources that lost keys in its last
    /// change first, and stops at the first that fails: a source that gained keys takes them
    /// only once no source that lost them takes them any more (docs/SOURCES.md, rule 2). Right
    /// before the first gaining source, the catalog records the change applied
    /// (`SourcesApplied`), so that a gaining source attached or promoted later takes the new
    /// count at once (`CatalogState::count_for_source`). `answers` gets each unit's answer as
    /// it comes, so that a caller that goes on past a failure still has them.
    pub(super) async fn tell_count(
        &self,
        topic_id: TopicId,
        answers: &mut Vec<UnitAnswer>,
    ) -> Result<(), ControlError> {
        let (active, gate) = {
            let state = self.state.borrow();
            (state.active_sources(topic_id), state.source_gate(topic_id))
        };
        let mut units = self.units_of(topic_id);
        units.sort_by_key(|unit| !gate.losing(active).contains(&unit.source.get()));
        let mut applied = gate.applied;
        for unit in units {
            self.serve_before_count(topic_id, &unit).await?;
            if !applied && gate.gains(unit.source.get(), active) {
                let entry = CatalogEntry::SourcesApplied { topic_id, generation: gate.generation };
                self.propose(entry).await?;
                applied = true;
            }
            // The gate first: a unit takes a moved key only once it holds it.
            self.tell_gate(topic_id, &unit).await?;
            let request = ControlRequest::ApplySources { topic_id: unit.id, active };
            match self.call_forwarder(unit.shard, request).await? {
                ControlOk::SourcesApplied { fence, floors } => answers.push((unit, fence, floors)),
                // A replicated source's leader not promoted yet: it keeps the count as a
                // follower, and its promotion begins under the catalog's
                // (`apply_count_to_promoted`).
                ControlOk::Done => {}
                other => {
                    return Err(ControlError::Unavailable(format!(
                        "source {} answered ApplySources with {other:?}",
                        unit.source.get()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Gives later source `unit` of one replica every subscription of topic `topic_id` before
    /// it is first told a count by this router: a count makes it take publishes, and a source
    /// serving no subscription keeps nothing for them (its log is let go as acknowledged by
    /// all). Its add attaches them, but an add answered `NotApplied` (a forwarder unreachable
    /// then) left it without some, and the next pass made it active all the same: the
    /// cluster simulation (topics of several sources, seed 165 with another change) found a
    /// subscription attached to a new source at its log start 16, its first 16 messages gone.
    /// Once per unit and router; a replicated source's subscriptions follow its promotion.
    async fn serve_before_count(&self, topic_id: TopicId, unit: &Unit) -> Result<(), ControlError> {
        if unit.source == SourceId::FIRST || self.sources_served.borrow().contains(&unit.id) {
            return Ok(());
        }
        let subscriptions: Vec<SubscriptionRecord> = {
            let state = self.state.borrow();
            let replicated =
                state.sources_of(topic_id).any(|source| source.id == unit.id && source.replicas.len() > 1);
            if replicated {
                return Ok(());
            }
            state.subscriptions_served_by(topic_id).cloned().collect()
        };
        for subscription in &subscriptions {
            self.call_forwarder(unit.shard, attach_subscription(subscription, unit))
                .await
                .map_err(|status| not_applied("subscription", &subscription.name, status))?;
        }
        self.sources_served.borrow_mut().insert(unit.id);
        Ok(())
    }

    /// Topic `topic_id`'s placed units, source 0 first; none once the topic is deleted.
    pub(super) fn units_of(&self, topic_id: TopicId) -> Vec<Unit> {
        let state = self.state.borrow();
        let Some(topic) = state.topic_by_id(topic_id) else { return Vec::new() };
        let own = Unit { id: topic.id, source: SourceId::FIRST, shard: topic.shard };
        std::iter::once(own)
            .chain(state.sources_of(topic_id).map(|source| Unit {
                id: source.id,
                source: source.source,
                shard: source.shard,
            }))
            .filter(|unit| unit.shard != SHARD_UNPLACED)
            .collect()
    }

    /// Places topic `topic`'s source `number`, attaches it (a source of one replica on its
    /// shard, before the commit, as a topic's creation does; a replicated one on each of its
    /// replicas, `add_replicated_source`) and commits its record; then serves each of the
    /// topic's subscriptions on it, from 0: everything in it was published after they were
    /// created.
    async fn add_source(
        &self,
        topic: &TopicRecord,
        number: u32,
        replicas: usize,
    ) -> Result<(), ControlError> {
        let source = SourceId::new(number).ok_or_else(|| {
            ControlError::invalid_argument(format!("source {number}: past SOURCES_PER_TOPIC_MAX"))
        })?;
        let shards = self.place_new_source(topic, number, replicas)?;
        let record = SourceRecord {
            id: TopicId::new(self.allocate_id().await?),
            topic_id: topic.id,
            source,
            shard: shards[0],
            created_ms: wall_ms(),
            // As a topic's: a source of one replica lists none, and a replicated one starts at
            // epoch 1, the epoch its first leader writes at.
            epoch: if replicas > 1 { 1 } else { 0 },
            replicas: if replicas > 1 { shards } else { Vec::new() },
            retiring: false,
        };
        if replicas > 1 {
            self.add_replicated_source(topic, record).await?;
            // Attached before the catalog named it: its topic's schema follows.
            return self.push_topic_schema(topic.id, false).await;
        }
        let unit = Unit { id: record.id, source, shard: record.shard };
        let attach = ControlRequest::AttachTopic {
            topic_id: unit.id,
            name: topic.name.to_string(),
            retention_seconds: topic.message_retention_seconds,
            recovering: false,
            source,
            // The count before it: it takes nothing until every unit applies the new one
            // (`apply_active_sources`).
            active: self.state.borrow().active_sources(topic.id),
        };
        self.call_forwarder(unit.shard, attach).await?;
        let applied = self.propose(CatalogEntry::SourceAdded(record)).await;
        let refusal = match applied {
            Ok(Applied::Done) => None,
            Ok(Applied::Refused(why)) => Some(ControlError::failed_precondition(why)),
            Ok(_) => Some(ControlError::NotFound(format!("topic '{}' (deleted meanwhile)", topic.name))),
            Err(error) => Some(error),
        };
        if let Some(error) = refusal {
            // Undecided, the source may still be added: it stays attached, and the next start
            // removes its files if the catalog never names it.
            if !error.is_undecided() {
                let detach = ControlRequest::DetachTopic { topic_id: unit.id, delete_data: true };
                let _ = self.call_forwarder(unit.shard, detach).await;
            }
            return Err(error);
        }
        // Attached before the catalog named it: its topic's schema follows, before the
        // active count that lets it take publishes.
        self.push_topic_schema(topic.id, false).await?;
        let subscriptions: Vec<SubscriptionRecord> =
            self.state.borrow().subscriptions_served_by(topic.id).cloned().collect();
        for subscription in subscriptions {
            self.call_forwarder(unit.shard, attach_subscription(&subscription, &unit))
                .await
                .map_err(|status| not_applied("subscription", &subscription.name, status))?;
        }
        Ok(())
    }

    /// Where topic `topic`'s source `number` goes: its leader by consistent hashing with bounded
    /// loads (keyed by the topic and the number), on a shard holding none of the topic's units,
    /// on another node than theirs first; then its followers, each on a node of its own, in the
    /// key's preference order. The leader first.
    fn place_new_source(
        &self,
        topic: &TopicRecord,
        number: u32,
        replicas: usize,
    ) -> Result<Vec<ShardId>, ControlError> {
        let layout = self.current_layout();
        let state = self.state.borrow();
        let draining = self.draining.borrow();
        let mut taken: Vec<ShardId> = topic.replica_shards();
        taken.extend(state.sources_of(topic.id).flat_map(SourceRecord::replica_shards));
        let mut placement = Placement::new(layout.shards.len().max(1) as u32, self.balance_factor);
        for placed in state.topics.values() {
            if let Some(index) = layout.index_of(placed.shard) {
                placement.assign(index);
            }
        }
        count_sources(&layout, &state, &mut placement);
        let shard_of = |index: u32| layout.shards.get(index as usize).copied();
        let shard_taken = |index: u32| {
            shard_of(index).is_none_or(|shard| taken.contains(&shard) || draining.contains(&shard.node()))
        };
        let node_taken = |index: u32| {
            shard_of(index).is_none_or(|shard| taken.iter().any(|unit| unit.node() == shard.node()))
        };
        let key = source_key(&topic.name, number);
        let no_room = || {
            ControlError::failed_precondition(format!(
                "topic '{}': no forwarder shard is left for source {number}: one source of a topic per shard",
                topic.name
            ))
        };
        let leader = place_source(&mut placement, &key, shard_taken, node_taken).ok_or_else(no_room)?;
        let mut chosen = vec![layout.shards[leader as usize]];
        for index in placement.preference(&key, leader) {
            if chosen.len() == replicas {
                break;
            }
            let shard = layout.shards[index as usize];
            if !shard_taken(index) && !chosen.iter().any(|other| other.node() == shard.node()) {
                chosen.push(shard);
            }
        }
        if chosen.len() < replicas {
            return Err(no_room());
        }
        Ok(chosen)
    }

    /// Each of topic `topic`'s sources' leader, source 0 first.
    pub(super) fn source_leaders(&self, topic: &TopicRecord) -> Vec<ShardId> {
        let state = self.state.borrow();
        std::iter::once(topic.shard).chain(state.sources_of(topic.id).map(|source| source.shard)).collect()
    }

    /// At start: attaches each later source of one replica whose leader is on this node,
    /// knowing its number (replicated ones are opened as followers by `recover_replicas`).
    pub(super) async fn recover_sources(&self) -> Result<(), String> {
        let sources: Vec<(SourceRecord, TopicRecord)> = {
            let state = self.state.borrow();
            state
                .sources
                .values()
                .filter(|source| source.replicas.len() <= 1 && source.shard.node() == self.node_id())
                .filter_map(|source| Some((source.clone(), state.topic_by_id(source.topic_id)?.clone())))
                .collect()
        };
        let sources: Vec<&(SourceRecord, TopicRecord)> = sources.iter().collect();
        try_for_each_concurrent(sources, RECOVERY_ATTACHES_IN_FLIGHT_MAX, |(source, topic)| async move {
            let attach = ControlRequest::AttachTopic {
                topic_id: source.id,
                name: topic.name.to_string(),
                retention_seconds: topic.message_retention_seconds,
                recovering: true,
                source: source.source,
                active: self.state.borrow().count_for_source(topic.id, source.source.get()),
            };
            self.call_forwarder(source.shard, attach).await.map(|_| ()).map_err(|error| {
                format!(
                    "recovering source {} of topic '{}': {}",
                    source.source.get(),
                    topic.name,
                    Status::from(error)
                )
            })
        })
        .await?;
        Ok(())
    }

    /// The unit ids of the later sources with a replica on node `node`: their folders are
    /// known at start.
    pub(super) fn sources_on(&self, node: NodeId) -> Vec<TopicId> {
        self.state
            .borrow()
            .sources
            .values()
            .filter(|source| source.replica_shards().iter().any(|shard| shard.node() == node))
            .map(|source| source.id)
            .collect()
    }

    /// Each of topic `topic`'s sources with its forwarders, as `lookup` orders a topic's:
    /// source 0 keyed by the topic's name (the list `lookup_topic` gives), a later one by
    /// `topic#n`, each from its own leader's shard. Every source is listed, retiring ones too,
    /// so that subscribers drain them; `active` counts those taking publishes (the catalog's
    /// active count: a retiring one answers every publish `NotOwner`).
    pub fn lookup_sources(
        &self,
        topic: &TopicRecord,
        local: Option<SocketAddr>,
        client: Option<&super::restrictions::RouteClient>,
    ) -> Result<SourceRoutes, ControlError> {
        let units = self.units_of(topic.id);
        let mut sources = Vec::with_capacity(units.len());
        for unit in &units {
            let key = match unit.source {
                SourceId::FIRST => topic.name.clone(),
                source => source_key(&topic.name, source.get()).into(),
            };
            let forwarders = self.lookup(&key, unit.id, local, client)?;
            sources.push(SourceRoute { source: unit.source, forwarders });
        }
        if sources.is_empty() {
            return Err(ControlError::Unavailable(format!(
                "topic '{}' is not placed on any forwarder",
                topic.name
            )));
        }
        let active = self.state.borrow().active_sources(topic.id).min(sources.len() as u32);
        Ok(SourceRoutes { active, sources })
    }

    /// The leader's shard of unit `id`: a topic's own log, or one of its later sources (whose
    /// ids come from the same counter), so that `lookup` routes to either.
    pub(super) fn unit_shard(&self, id: TopicId) -> Option<ShardId> {
        self.shard_of(id).or_else(|| {
            let state = self.state.borrow();
            let source = state.sources.values().find(|source| source.id == id)?;
            Some(source.shard).filter(|shard| *shard != SHARD_UNPLACED)
        })
    }

    /// `lookup_sources` of a topic by name.
    pub fn lookup_topic_sources(
        &self,
        name: &str,
        local: Option<SocketAddr>,
        client: Option<&super::restrictions::RouteClient>,
    ) -> Result<SourceRoutes, ControlError> {
        let topic = self.topic_record(name)?;
        self.lookup_sources(&topic, local, client)
    }

    /// `lookup_sources` of a subscription's topic, refused as `lookup_subscription` refuses.
    pub fn lookup_subscription_sources(
        &self,
        name: &str,
        local: Option<SocketAddr>,
        client: Option<&super::restrictions::RouteClient>,
    ) -> Result<SourceRoutes, ControlError> {
        let record = self.subscription_record(name)?;
        if record.detached {
            return Err(super::subscriptions::detached(&record.name));
        }
        let Some(topic) = self.state.borrow().topic_by_id(record.topic_id).cloned() else {
            return Err(ControlError::failed_precondition(format!(
                "subscription '{}' is detached: its topic was deleted",
                record.name
            )));
        };
        self.lookup_sources(&topic, local, client)
    }

    /// A topic as clients see it, with its sources and their leaders.
    pub(super) fn topic_shown(&self, topic: &TopicRecord) -> Topic {
        let source_leaders = self.source_leaders(topic);
        let state = self.state.borrow();
        let source_policy = state.source_policies.get(&topic.id).copied();
        Topic { source_leaders, source_policy, ..topic_message(topic, state.source_count(topic.id)) }
    }
}
