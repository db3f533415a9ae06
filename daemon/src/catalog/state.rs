//! The catalog in memory, and `apply`, the only way it changes: a deterministic function of the
//! state and one decided entry, so that every replica (and every replay) that applies the same
//! entries in the same order holds the same catalog.

use super::entry::{
    CatalogEntry, NodeRecord, SnapshotRecord, SourceBounds, SourceGate, SourceRecord, SubscriptionRecord,
    TopicRecord,
};
use super::schemas::{SchemaEntry, SchemaRecord, SchemaSettings, DELETED_SCHEMA};
use crate::codec::{DecodeResult, Decoder};
use crate::ids::{NodeId, ShardId, SourceId, TopicId};
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

/// The catalog: what the entries so far add up to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CatalogState {
    /// The last boot of a catalog written before it ran on raft (imported), else 0.
    pub boot_count: u32,
    /// Every id below this is taken; the leader hands out ids from here (see `apply`).
    pub next_id: u64,
    /// Boxed, as the subscriptions below: a record is 112 bytes, and a B-tree's nodes fill
    /// about half.
    pub topics: BTreeMap<Rc<str>, Box<TopicRecord>>,
    pub topic_names: HashMap<TopicId, Rc<str>>,
    /// Boxed: a B-tree fills its nodes about half when names arrive in order, and a record is
    /// 160 bytes; boxed, the empty slots cost 8 bytes each instead (about 130 bytes less per
    /// subscription).
    pub subscriptions: BTreeMap<Rc<str>, Box<SubscriptionRecord>>,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    /// The cluster's nodes as they registered, by id; empty for a single node.
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    /// Registered nodes being drained (`CatalogEntry::NodeDraining`), until undrained or
    /// removed.
    pub draining: BTreeSet<NodeId>,
    /// The routing restrictions (`router::restrictions`), in the order they were added.
    pub routing_rules: Vec<super::routing::RoutingRule>,
    /// Every topic's sources after the first, by topic and source (a topic's in order).
    pub sources: BTreeMap<(TopicId, SourceId), SourceRecord>,
    /// A source's unit id → its topic and number, so that the entries naming a unit by id
    /// (elections, replica moves) find a source as they find a topic.
    pub source_units: HashMap<TopicId, (TopicId, SourceId)>,
    /// The topics whose sources follow their load (`SourcePolicySet`), with their bounds; a
    /// topic not listed keeps the number it has.
    pub source_policies: BTreeMap<TopicId, SourceBounds>,
    /// Each topic's last change of its active count (the delivery gate, docs/SOURCES.md); a
    /// topic not listed never changed it.
    pub source_gates: BTreeMap<TopicId, SourceGate>,
    /// The last change of its topic's active count each subscription passed, by subscription
    /// id; one not listed passed none.
    pub sources_passed: BTreeMap<u64, u64>,
    /// Pub/Sub's schemas, by name.
    pub schemas: BTreeMap<String, SchemaRecord>,
    /// The schema settings of the topics that have one; a topic not listed takes any data.
    pub topic_schemas: BTreeMap<TopicId, SchemaSettings>,
}

/// The fields that place a unit (a topic's own log, or one of its other sources), as the
/// entries that move, re-replicate or elect change them.
struct UnitPlacement<'a> {
    shard: &'a mut ShardId,
    replicas: &'a mut Vec<ShardId>,
    epoch: &'a mut u64,
}

/// What applying an entry did: the answer `client_write` returns to the proposer, and what the
/// router shard acts on (detaching what a deletion removed, say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Done,
    /// The entry changed nothing because the state refuses it: a name taken meanwhile, said
    /// in full (`CatalogError::NameTaken`).
    Refused(String),
    TopicDeleted(Option<TopicRecord>),
    SubscriptionDeleted(Option<Box<SubscriptionRecord>>),
    SnapshotDeleted(Option<SnapshotRecord>),
    /// An update; false when its record was deleted (or replaced) before it applied.
    Updated(bool),
}

impl CatalogState {
    pub fn apply(&mut self, entry: CatalogEntry) -> Applied {
        match entry {
            CatalogEntry::Schema(entry) => self.apply_schema_change(entry),
            CatalogEntry::Boot { count } => {
                // Ids handed out in boot `count` were `count << 32 | sequence`.
                self.boot_count = count;
                self.take_id(((count as u64) + 1) << 32);
                Applied::Done
            }
            CatalogEntry::NextId { next_id } => {
                self.next_id = self.next_id.max(next_id);
                Applied::Done
            }
            CatalogEntry::TopicCreated(topic) => {
                if let Some(existing) =
                    self.topics.get(&topic.name).filter(|existing| existing.id != topic.id)
                {
                    return refused(format!("topic '{}' exists (id {:x})", existing.name, existing.id));
                }
                self.take_id(topic.id.get() + 1);
                self.topic_names.insert(topic.id, topic.name.clone());
                self.topics.insert(topic.name.clone(), Box::new(topic));
                Applied::Done
            }
            CatalogEntry::TopicDeleted { id } => self.delete_topic(id),
            entry @ (CatalogEntry::SourceAdded(_)
            | CatalogEntry::SourceRetiring { .. }
            | CatalogEntry::SourceGate { .. }
            | CatalogEntry::SourcesPassed { .. }
            | CatalogEntry::SourcesApplied { .. }) => self.apply_source_change(entry),
            CatalogEntry::SourceDeleted { topic_id, source, id } => self.delete_source(topic_id, source, id),
            CatalogEntry::TopicPlaced { id, shard } => {
                self.place_topic(id, shard);
                Applied::Done
            }
            CatalogEntry::SubscriptionCreated(record) => self.create_subscription(record),
            CatalogEntry::SubscriptionDeleted { id, name } => {
                self.sources_passed.remove(&id);
                Applied::SubscriptionDeleted(remove_record(&mut self.subscriptions, id, &name, |record| {
                    record.id
                }))
            }
            CatalogEntry::SnapshotCreated(snapshot) => {
                if self.snapshots.get(&snapshot.name).is_some_and(|existing| existing.id != snapshot.id) {
                    return refused(format!("snapshot '{}' exists", snapshot.name));
                }
                self.take_id(snapshot.id.get() + 1);
                self.snapshots.insert(snapshot.name.clone(), snapshot);
                Applied::Done
            }
            CatalogEntry::SnapshotDeleted { id, name } => {
                Applied::SnapshotDeleted(remove_record(&mut self.snapshots, id, &name, |record| record.id))
            }
            // An update of a record deleted since (or of another record under its name) changes
            // nothing: the router checks the record before it proposes, but a deletion may
            // commit in between.
            CatalogEntry::TopicUpdated { id, message_retention_seconds, labels } => {
                let topic = self.topic_names.get(&id).and_then(|name| self.topics.get_mut(name));
                let found = topic.is_some();
                if let Some(topic) = topic {
                    topic.message_retention_seconds = message_retention_seconds;
                    topic.labels = labels;
                }
                Applied::Updated(found)
            }
            CatalogEntry::SnapshotUpdated { id, name, labels } => {
                let snapshot = self.snapshots.get_mut(&name).filter(|snapshot| snapshot.id == id);
                let found = snapshot.is_some();
                if let Some(snapshot) = snapshot {
                    snapshot.labels = labels;
                }
                Applied::Updated(found)
            }
            // Detaching is for good: the record stays, marked, and no later entry clears it.
            CatalogEntry::SubscriptionDetached { id, name } => {
                let record = self.subscriptions.get_mut(name.as_str()).filter(|record| record.id == id);
                let found = record.is_some();
                if let Some(record) = record {
                    record.detached = true;
                }
                Applied::Updated(found)
            }
            CatalogEntry::NodeRegistered(node) => {
                self.nodes.insert(node.node_id, node);
                Applied::Done
            }
            CatalogEntry::TopicReplicasChanged { id, replicas } => {
                Applied::Updated(self.change_replicas(id, replicas))
            }
            CatalogEntry::NodeRemoved { node_id } => {
                self.draining.remove(&node_id);
                Applied::Updated(self.nodes.remove(&node_id).is_some())
            }
            CatalogEntry::RoutingRulesSet { rules } => {
                self.routing_rules = rules;
                Applied::Done
            }
            CatalogEntry::NodeDraining { node_id, draining } => self.set_draining(node_id, draining),
            CatalogEntry::SourcePolicySet { topic_id, bounds } => self.set_source_policy(topic_id, bounds),
            CatalogEntry::TopicLeaderElected { id, epoch, leader } => {
                Applied::Updated(self.elect_leader(id, epoch, leader))
            }
            CatalogEntry::SubscriptionUpdated { id, name, settings } => {
                let record = self.subscriptions.get_mut(name.as_str()).filter(|record| record.id == id);
                let found = record.is_some();
                if let Some(record) = record {
                    record.settings = settings;
                }
                Applied::Updated(found)
            }
        }
    }

    /// Removes topic `id` and its sources: the router reads them before it proposes the
    /// deletion.
    fn delete_topic(&mut self, id: TopicId) -> Applied {
        let removed = self.topic_names.remove(&id).and_then(|name| self.topics.remove(&name));
        let numbers: Vec<SourceId> = self.sources_of(id).map(|source| source.source).collect();
        for number in numbers {
            if let Some(source) = self.sources.remove(&(id, number)) {
                self.source_units.remove(&source.id);
            }
        }
        self.source_policies.remove(&id);
        self.source_gates.remove(&id);
        self.topic_schemas.remove(&id);
        Applied::TopicDeleted(removed.map(|topic| *topic))
    }

    /// A schema's revision committed or deleted, a schema deleted, or a topic's schema
    /// settings set.
    fn apply_schema_change(&mut self, entry: SchemaEntry) -> Applied {
        match entry {
            SchemaEntry::Committed { name, creates: true, revision } => {
                if self.schemas.contains_key(&name) {
                    return refused(format!("schema '{name}' exists"));
                }
                self.schemas.insert(name.clone(), SchemaRecord { name, revisions: vec![revision] });
                Applied::Done
            }
            SchemaEntry::Committed { name, creates: false, revision } => {
                let schema = self.schemas.get_mut(&name);
                let found = schema.is_some_and(|schema| {
                    let fresh =
                        !schema.revisions.iter().any(|listed| listed.revision_id == revision.revision_id);
                    if fresh {
                        schema.revisions.push(revision);
                    }
                    fresh
                });
                Applied::Updated(found)
            }
            SchemaEntry::RevisionDeleted { name, revision_id } => {
                let schema = self.schemas.get_mut(&name).filter(|schema| schema.revisions.len() > 1);
                let found = schema.is_some_and(|schema| {
                    let before = schema.revisions.len();
                    schema.revisions.retain(|revision| revision.revision_id != revision_id);
                    schema.revisions.len() < before
                });
                Applied::Updated(found)
            }
            SchemaEntry::Deleted { name } => {
                let found = self.schemas.remove(&name).is_some();
                for settings in self.topic_schemas.values_mut().filter(|settings| settings.schema == name) {
                    settings.schema = DELETED_SCHEMA.to_owned();
                }
                Applied::Updated(found)
            }
            SchemaEntry::TopicSet { topic_id, settings } => {
                let found = self.topic_names.contains_key(&topic_id);
                match settings {
                    Some(settings) if found => self.topic_schemas.insert(topic_id, settings),
                    _ => self.topic_schemas.remove(&topic_id),
                };
                Applied::Updated(found)
            }
        }
    }

    /// Topic `topic_id`'s sources follow its load within `bounds`, or keep their number
    /// (`None`); nothing for a topic deleted meanwhile.
    fn set_source_policy(&mut self, topic_id: TopicId, bounds: Option<SourceBounds>) -> Applied {
        if !self.topic_names.contains_key(&topic_id) {
            return Applied::Updated(false);
        }
        match bounds {
            Some(bounds) => self.source_policies.insert(topic_id, bounds),
            None => self.source_policies.remove(&topic_id),
        };
        Applied::Updated(true)
    }

    /// Marks node `node_id` draining or not. Only a registered node drains: one removed
    /// meanwhile stays out of the set.
    fn set_draining(&mut self, node_id: NodeId, draining: bool) -> Applied {
        let registered = self.nodes.contains_key(&node_id);
        if registered && draining {
            self.draining.insert(node_id);
        } else {
            self.draining.remove(&node_id);
        }
        Applied::Updated(registered)
    }

    /// Unit `id`'s placement: a topic's own, or one of its other sources'.
    fn unit_mut(&mut self, id: TopicId) -> Option<UnitPlacement<'_>> {
        if let Some(name) = self.topic_names.get(&id) {
            let topic = self.topics.get_mut(name)?;
            return Some(UnitPlacement {
                shard: &mut topic.shard,
                replicas: &mut topic.replicas,
                epoch: &mut topic.epoch,
            });
        }
        let key = self.source_units.get(&id)?;
        let source = self.sources.get_mut(key)?;
        Some(UnitPlacement {
            shard: &mut source.shard,
            replicas: &mut source.replicas,
            epoch: &mut source.epoch,
        })
    }

    /// Unit `id` moves to `shard`: its leader's replica with it.
    fn place_topic(&mut self, id: TopicId, shard: ShardId) {
        if let Some(unit) = self.unit_mut(id) {
            let leader = *unit.shard;
            if let Some(replica) = unit.replicas.iter_mut().find(|replica| **replica == leader) {
                *replica = shard;
            }
            *unit.shard = shard;
        }
    }

    /// Unit `id`'s replicas become `replicas` if it is replicated and they are at least two,
    /// on as many nodes, its leader among them; whether they did.
    fn change_replicas(&mut self, id: TopicId, replicas: Vec<ShardId>) -> bool {
        let nodes: std::collections::BTreeSet<NodeId> = replicas.iter().map(|shard| shard.node()).collect();
        match self.unit_mut(id) {
            Some(unit)
                if unit.replicas.len() > 1
                    && replicas.len() >= 2
                    && nodes.len() == replicas.len()
                    && replicas.contains(unit.shard) =>
            {
                *unit.replicas = replicas;
                true
            }
            _ => false,
        }
    }

    /// Replica `leader` leads unit `id` from `epoch` on; whether it does.
    fn elect_leader(&mut self, id: TopicId, epoch: u64, leader: ShardId) -> bool {
        match self.unit_mut(id) {
            // One leader per epoch: a second election of an epoch, or an older one decided
            // late, changes nothing.
            Some(unit) if epoch > *unit.epoch && unit.replicas.contains(&leader) => {
                *unit.shard = leader;
                *unit.epoch = epoch;
                true
            }
            _ => false,
        }
    }

    /// A topic's source after the first: refused if its topic is gone (a deletion committed
    /// first), if its number or unit id is taken by another, or if one of its shards already
    /// holds a unit of the topic (a shard serves one source of a topic, so that on a shard a
    /// topic's name still names one log).
    fn add_source(&mut self, source: SourceRecord) -> Applied {
        let Some(topic) = self.topic_by_id(source.topic_id) else {
            return Applied::Updated(false);
        };
        let key = (source.topic_id, source.source);
        if self.sources.get(&key).is_some_and(|existing| existing.id != source.id)
            || self.source_units.get(&source.id).is_some_and(|existing| *existing != key)
            || self.topic_names.contains_key(&source.id)
        {
            return refused(format!("source {} of topic '{}' exists", source.source.get(), topic.name));
        }
        let mut taken: Vec<ShardId> = topic.replica_shards();
        taken.extend(
            self.sources_of(source.topic_id)
                .filter(|other| other.source != source.source)
                .flat_map(SourceRecord::replica_shards),
        );
        if let Some(shard) = source.replica_shards().iter().find(|shard| taken.contains(shard)) {
            return refused(format!(
                "{shard} already holds a source of topic '{}': a shard serves one source of a topic",
                topic.name
            ));
        }
        self.take_id(source.id.get() + 1);
        self.source_units.insert(source.id, key);
        self.sources.insert(key, source);
        Applied::Done
    }

    /// The subscriptions topic `topic_id`'s sources serve: its own, but those detached. A scan
    /// of every subscription (no index by topic is kept), bounded by `subscriptions_max`.
    pub fn subscriptions_served_by(
        &self,
        topic_id: TopicId,
    ) -> impl Iterator<Item = &SubscriptionRecord> + '_ {
        self.subscriptions
            .values()
            .map(|record| &**record)
            .filter(move |record| record.topic_id == topic_id && !record.detached)
    }

    /// Topic `topic_id`'s sources after the first, in order.
    pub fn sources_of(&self, topic_id: TopicId) -> impl Iterator<Item = &SourceRecord> + '_ {
        self.sources.range((topic_id, SourceId::FIRST)..=(topic_id, SourceId::LAST)).map(|(_, source)| source)
    }

    /// How many sources topic `topic_id` has: its own and the others.
    pub fn source_count(&self, topic_id: TopicId) -> usize {
        1 + self.sources_of(topic_id).count()
    }

    /// Topic `topic_id`'s active count: the sources taking publishes, which its key map counts
    /// (`ringpost_model::sources::source_of_key`).
    pub fn active_sources(&self, topic_id: TopicId) -> u32 {
        1 + self.sources_of(topic_id).filter(|source| !source.retiring).count() as u32
    }

    /// Topic `topic_id`'s source `source` retires, if it is its highest active source.
    fn retire_source(&mut self, topic_id: TopicId, source: SourceId) -> Applied {
        let highest = self.active_sources(topic_id) - 1;
        match self.sources.get_mut(&(topic_id, source)) {
            Some(record) if source.get() == highest => {
                record.retiring = true;
                Applied::Updated(true)
            }
            _ => Applied::Updated(false),
        }
    }

    /// A change of a topic's active count (a source added or retiring), which opens its next
    /// change at the delivery gate in the same step, or an entry of the gate itself.
    fn apply_source_change(&mut self, entry: CatalogEntry) -> Applied {
        match entry {
            CatalogEntry::SourceAdded(source) => {
                let (topic_id, before) = (source.topic_id, self.active_sources(source.topic_id));
                let applied = self.add_source(source);
                if applied == Applied::Done {
                    self.open_gate(topic_id, before);
                }
                applied
            }
            CatalogEntry::SourceRetiring { topic_id, source } => {
                let before = self.active_sources(topic_id);
                let applied = self.retire_source(topic_id, source);
                if applied == Applied::Updated(true) {
                    self.open_gate(topic_id, before);
                }
                applied
            }
            CatalogEntry::SourceGate { topic_id, gate } => {
                let found = self.topic_names.contains_key(&topic_id);
                if found {
                    self.source_gates.insert(topic_id, gate);
                }
                Applied::Updated(found)
            }
            CatalogEntry::SourcesPassed { id, name, generation } => {
                let found = self.subscriptions.get(name.as_str()).is_some_and(|record| record.id == id);
                if found {
                    let passed = self.sources_passed.entry(id).or_default();
                    *passed = (*passed).max(generation);
                }
                Applied::Updated(found)
            }
            CatalogEntry::SourcesApplied { topic_id, generation } => {
                match self.source_gates.get_mut(&topic_id) {
                    Some(gate) if gate.generation == generation && !gate.applied => {
                        gate.applied = true;
                        Applied::Updated(true)
                    }
                    _ => Applied::Updated(false),
                }
            }
            // `apply` hands it nothing else.
            _ => Applied::Updated(false),
        }
    }

    /// Topic `topic_id`'s active count changed from `before`: its next change opens, and every
    /// ordered subscription's sources hold the keys that moved until it passes it.
    fn open_gate(&mut self, topic_id: TopicId, before: u32) {
        let gate = self.source_gates.entry(topic_id).or_default();
        *gate = SourceGate { generation: gate.generation + 1, before, applied: false };
    }

    /// Topic `topic_id`'s last change of its active count (generation 0: it never changed).
    pub fn source_gate(&self, topic_id: TopicId) -> SourceGate {
        self.source_gates.get(&topic_id).copied().unwrap_or_default()
    }

    /// The active count source `source` of topic `topic_id` is told when it is attached or
    /// promoted: the topic's, unless the source gained keys in the last change and a source
    /// that lost them may not have applied it yet (docs/SOURCES.md, rule 2). Then the count
    /// before, so that it takes none of the moved keys until the catalog leader's pass tells
    /// it, after every losing source.
    pub fn count_for_source(&self, topic_id: TopicId, source: u32) -> u32 {
        let after = self.active_sources(topic_id);
        let gate = self.source_gate(topic_id);
        if !gate.applied && gate.gains(source, after) {
            gate.before
        } else {
            after
        }
    }

    /// Whether subscription `record` passed its topic's last change of its active count: one
    /// without message ordering always has (its sources never hold a message for it).
    pub fn passed_sources(&self, record: &SubscriptionRecord) -> bool {
        !record.settings.enable_message_ordering
            || self.sources_passed.get(&record.id).copied().unwrap_or(0)
                >= self.source_gate(record.topic_id).generation
    }

    /// The subscriptions of topic `topic_id`, served and ordered, that did not pass its last
    /// change yet: a next change waits for them.
    pub fn gated_subscriptions(&self, topic_id: TopicId) -> impl Iterator<Item = &SubscriptionRecord> + '_ {
        self.subscriptions_served_by(topic_id).filter(move |record| !self.passed_sources(record))
    }

    /// Topic `topic_id`'s retiring source `source` is deleted, if it is unit `id`.
    fn delete_source(&mut self, topic_id: TopicId, source: SourceId, id: TopicId) -> Applied {
        let key = (topic_id, source);
        if !self.sources.get(&key).is_some_and(|record| record.retiring && record.id == id) {
            return Applied::Updated(false);
        }
        self.sources.remove(&key);
        self.source_units.remove(&id);
        // A source added later takes the number again, and starts its log at offset 0: a sync
        // point a subscription kept on the deleted one would skip the new one's first messages.
        for subscription in self.subscriptions.values_mut().filter(|record| record.topic_id == topic_id) {
            subscription.source_starts.retain(|(listed, _)| *listed != source);
        }
        Applied::Updated(true)
    }

    fn create_subscription(&mut self, mut record: SubscriptionRecord) -> Applied {
        if self.subscriptions.get(&record.name).is_some_and(|existing| existing.id != record.id) {
            return refused(format!("subscription '{}' exists", record.name));
        }
        self.take_id(record.id + 1);
        // One copy of each name, shared by the maps and records that hold it: the
        // subscription's copy of its topic's name is the topic's own.
        let topic_name = self.topic_names.get(&record.topic_id).filter(|name| **name == record.topic_name);
        if let Some(topic_name) = topic_name {
            record.topic_name = topic_name.clone();
        }
        self.subscriptions.insert(record.name.clone(), Box::new(record));
        Applied::Done
    }

    fn take_id(&mut self, next: u64) {
        self.next_id = self.next_id.max(next);
    }

    pub fn topic_by_id(&self, id: TopicId) -> Option<&TopicRecord> {
        self.topic_names.get(&id).and_then(|name| self.topics.get(name)).map(|topic| &**topic)
    }

    /// Entries that rebuild this state when applied alone, or after any older entries: every
    /// one sets a record to its current value (the id counter, each live topic, subscription
    /// and snapshot). What was deleted is simply absent.
    pub fn checkpoint_entries(&self) -> Vec<CatalogEntry> {
        let mut entries = Vec::with_capacity(2 + self.topics.len() + self.subscriptions.len());
        if self.boot_count > 0 {
            entries.push(CatalogEntry::Boot { count: self.boot_count });
        }
        entries.push(CatalogEntry::NextId { next_id: self.next_id });
        entries.extend(self.nodes.values().cloned().map(CatalogEntry::NodeRegistered));
        // After the registrations, which a draining node needs; none when no node drains, so
        // that a catalog without drains is restated in the bytes every version reads.
        entries.extend(
            self.draining
                .iter()
                .map(|node_id| CatalogEntry::NodeDraining { node_id: *node_id, draining: true }),
        );
        if !self.routing_rules.is_empty() {
            entries.push(CatalogEntry::RoutingRulesSet { rules: self.routing_rules.clone() });
        }
        entries
            .extend(self.topics.values().map(|topic| CatalogEntry::TopicCreated(TopicRecord::clone(topic))));
        // After every topic, which each source needs.
        entries.extend(self.sources.values().cloned().map(CatalogEntry::SourceAdded));
        // Highest first, as they retired; none when no source retires, so that such a catalog
        // is restated in the bytes of the version before.
        entries.extend(
            self.sources.values().rev().filter(|source| source.retiring).map(|source| {
                CatalogEntry::SourceRetiring { topic_id: source.topic_id, source: source.source }
            }),
        );
        // Only the topics that follow their load: a catalog without any is restated in the
        // bytes the version before reads.
        entries.extend(self.source_policies.iter().map(|(topic_id, bounds)| CatalogEntry::SourcePolicySet {
            topic_id: *topic_id,
            bounds: Some(*bounds),
        }));
        // After the sources, whose restated additions and retirements move the gates on: each
        // gate as it stands. None for a topic whose count never changed.
        for (topic_id, gate) in &self.source_gates {
            entries.push(CatalogEntry::SourceGate { topic_id: *topic_id, gate: *gate });
            if gate.applied {
                entries
                    .push(CatalogEntry::SourcesApplied { topic_id: *topic_id, generation: gate.generation });
            }
        }
        // Each schema's revisions, oldest first; then, after the topics, their settings. None
        // of either in a catalog without schemas, which is restated in the bytes of the
        // version before.
        for schema in self.schemas.values() {
            entries.extend(schema.revisions.iter().enumerate().map(|(index, revision)| {
                CatalogEntry::Schema(SchemaEntry::Committed {
                    name: schema.name.clone(),
                    creates: index == 0,
                    revision: revision.clone(),
                })
            }));
        }
        entries.extend(self.topic_schemas.iter().map(|(topic_id, settings)| {
            CatalogEntry::Schema(SchemaEntry::TopicSet {
                topic_id: *topic_id,
                settings: Some(settings.clone()),
            })
        }));
        entries.extend(
            self.subscriptions.values().map(|record| CatalogEntry::SubscriptionCreated((**record).clone())),
        );
        // After the subscriptions they name.
        let names: HashMap<u64, &str> = match self.sources_passed.is_empty() {
            true => HashMap::new(),
            false => self.subscriptions.values().map(|record| (record.id, &*record.name)).collect(),
        };
        entries.extend(self.sources_passed.iter().filter_map(|(id, generation)| {
            Some(CatalogEntry::SourcesPassed {
                id: *id,
                name: names.get(id)?.to_string(),
                generation: *generation,
            })
        }));
        entries.extend(self.snapshots.values().cloned().map(CatalogEntry::SnapshotCreated));
        entries
    }

    /// The state as bytes: its checkpoint entries, each prefixed with its length.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for entry in self.checkpoint_entries() {
            let encoded = entry.encode();
            bytes.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&encoded);
        }
        bytes
    }

    pub fn decode(bytes: &[u8]) -> DecodeResult<CatalogState> {
        let mut state = CatalogState::default();
        let mut decoder = Decoder::new(bytes);
        while !decoder.is_empty() {
            let length = decoder.u32()? as usize;
            let entry = CatalogEntry::decode(decoder.bytes(length)?)?;
            if let Applied::Refused(_) = state.apply(entry) {
                return Err("a checkpoint names a record twice");
            }
        }
        Ok(state)
    }
}

fn refused(message: String) -> Applied {
    Applied::Refused(message)
}

/// Removes record `id` from a map keyed by name: by its name when the deletion carries it (a
/// lookup), else by a scan (deletions written before they carried names; a scan per deletion
/// grows with the square of the records' number).
fn remove_record<K: Ord + Borrow<str> + Clone, V, Id: PartialEq>(
    records: &mut BTreeMap<K, V>,
    id: Id,
    name: &str,
    id_of: impl Fn(&V) -> Id,
) -> Option<V> {
    if name.is_empty() {
        let name = records.iter().find(|(_, record)| id_of(record) == id).map(|(name, _)| name.clone())?;
        records.remove(name.borrow())
    } else if records.get(name).is_some_and(|record| id_of(record) == id) {
        records.remove(name)
    } else {
        None
    }
}
