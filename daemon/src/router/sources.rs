//! A topic's publish sources after the first: how many a topic may ask for, where each is
//! placed, and their records in the catalog. Each is a unit of its own (`SourceRecord`): its
//! own id from the catalog's counter, its own replicas, epoch and leader.
//!
//! Sources are placed and recorded here; forwarders do not host them yet, so a topic's
//! publishes and deliveries are its source 0's alone until they do.

use super::*;
use crate::catalog::placement::{place_source, source_key};
use crate::catalog::SourceRecord;
use crate::ids::{SourceId, SOURCES_PER_TOPIC_MAX};

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
    fn source_shards(&self) -> usize {
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
            self.add_source(topic, number, replicas).await?;
        }
        Ok(())
    }

    /// Places topic `topic`'s source `number` and commits its record.
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
            id: TopicId::new(self.allocate_id()),
            topic_id: topic.id,
            source,
            shard: shards[0],
            created_ms: wall_ms(),
            // As a topic's: a source of one replica lists none, and a replicated one starts at
            // epoch 1, the epoch its first leader writes at.
            epoch: if replicas > 1 { 1 } else { 0 },
            replicas: if replicas > 1 { shards } else { Vec::new() },
        };
        match self.propose(CatalogEntry::SourceAdded(record)).await? {
            Applied::Done => Ok(()),
            Applied::Refused(why) => Err(ControlError::failed_precondition(why)),
            _ => Err(ControlError::NotFound(format!("topic '{}' (deleted meanwhile)", topic.name))),
        }
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

    /// A topic as clients see it, with its sources and their leaders.
    pub(super) fn topic_shown(&self, topic: &TopicRecord) -> Topic {
        let source_leaders = self.source_leaders(topic);
        Topic { source_leaders, ..topic_message(topic, self.state.borrow().source_count(topic.id)) }
    }
}
