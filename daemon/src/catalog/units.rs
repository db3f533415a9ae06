//! The catalog's replicated units as the elections, replica moves, drains and reconciliation
//! see them: a topic's own log, or one of its later sources (`SourceRecord`), each with its own
//! id, replicas, epoch and leader. Those steps read a unit through a `TopicRecord` of its
//! placement (`unit_by_id`), so that one code path elects, moves and promotes both; the unit's
//! topic and source number (`unit_of`) say what it attaches and serves.

use super::entry::{SourceRecord, TopicRecord};
use super::state::CatalogState;
use crate::ids::{ShardId, SourceId, TopicId};

impl CatalogState {
    /// Unit `id` as a topic record: a topic's own, or, for one of its later sources, its
    /// topic's name, retention and labels with the source's id, leader, replicas and epoch.
    pub fn unit_by_id(&self, id: TopicId) -> Option<TopicRecord> {
        if let Some(topic) = self.topic_by_id(id) {
            return Some(topic.clone());
        }
        let (topic_id, number) = self.source_units.get(&id)?;
        let source = self.sources.get(&(*topic_id, *number))?;
        Some(source_view(self.topic_by_id(*topic_id)?, source))
    }

    /// The topic and source number of unit `id`: a topic's own id is its source 0.
    pub fn unit_of(&self, id: TopicId) -> (TopicId, SourceId) {
        self.source_units.get(&id).copied().unwrap_or((id, SourceId::FIRST))
    }

    /// Unit `id`'s source number and the active count it is told (`count_for_source`): what a
    /// replica's attach says, so that a follower knows the count before it is ever promoted.
    pub fn unit_source_and_active(&self, id: TopicId) -> (SourceId, u32) {
        let (topic_id, source) = self.unit_of(id);
        (source, self.count_for_source(topic_id, source.get()))
    }

    /// Every unit of more than one replica, as `unit_by_id` shows it: the topics in name order,
    /// each topic's later sources after them.
    pub fn replicated_units(&self) -> Vec<TopicRecord> {
        let topics = self
            .topics
            .values()
            .filter(|topic| topic.replica_count() > 1)
            .map(|topic| TopicRecord::clone(topic));
        let sources = self.sources.values().filter(|source| source.replicas.len() > 1).filter_map(|source| {
            let topic = self.topic_by_id(source.topic_id)?;
            Some(source_view(topic, source))
        });
        topics.chain(sources).collect()
    }

    /// The nodes leading a unit of unit `id`'s topic other than `id` itself: where an election
    /// of `id` would rather not put its lead, all else equal (`elections::prefer_placed`).
    pub fn nodes_leading_other_units(&self, id: TopicId) -> std::collections::BTreeSet<crate::ids::NodeId> {
        let (topic_id, number) = self.unit_of(id);
        let Some(topic) = self.topic_by_id(topic_id) else { return Default::default() };
        let first = (number != SourceId::FIRST).then_some(topic.shard);
        let later =
            self.sources_of(topic_id).filter(|source| source.source != number).map(|source| source.shard);
        first.into_iter().chain(later).map(|shard| shard.node()).collect()
    }

    /// The forwarder shards holding a replica of a unit of unit `id`'s topic other than `id`
    /// itself: where none of `id`'s replicas may go (a shard serves one source of a topic).
    pub fn shards_of_other_units(&self, id: TopicId) -> Vec<ShardId> {
        let (topic_id, number) = self.unit_of(id);
        let Some(topic) = self.topic_by_id(topic_id) else { return Vec::new() };
        let mut shards = if number == SourceId::FIRST { Vec::new() } else { topic.replica_shards() };
        shards.extend(
            self.sources_of(topic_id)
                .filter(|source| source.source != number)
                .flat_map(SourceRecord::replica_shards),
        );
        shards
    }
}

/// Source `source` of `topic` as a topic record of its placement.
fn source_view(topic: &TopicRecord, source: &SourceRecord) -> TopicRecord {
    TopicRecord {
        id: source.id,
        shard: source.shard,
        created_ms: source.created_ms,
        replicas: source.replicas.clone(),
        epoch: source.epoch,
        ..topic.clone()
    }
}

impl CatalogState {
    /// Unit `id` as an operator reads it in a log line: its topic, and its source's number
    /// when it is not the topic's own log.
    pub fn unit_shown(&self, id: TopicId) -> String {
        let (topic_id, number) = self.unit_of(id);
        let name =
            self.topic_names.get(&topic_id).map_or_else(|| format!("{topic_id:x}"), |name| name.to_string());
        if number == SourceId::FIRST {
            format!("topic '{name}'")
        } else {
            format!("topic '{name}' source {}", number.get())
        }
    }
}
