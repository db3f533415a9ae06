//! The router's start: every catalogued topic and subscription attached to its forwarder,
//! topics whose shard is gone placed again, and a data directory trusted again once rewritten.

use super::sources::attach_subscription;
use super::*;
use crate::catalog::placement::source_key;
use crate::catalog::SourceRecord;

/// Why a unit whose shard is gone cannot be placed again on this node: every shard left holds
/// another of its topic's sources.
fn every_shard_taken(shown: &str, shard: ShardId, shards: u32) -> String {
    format!(
        "{shown} is placed on shard {} of this node, which has {shards}, and every shard left holds \
         another of its topic's sources: start it with as many forwarder shards as before",
        shard.local()
    )
}

/// Topics (and then subscriptions) attached at once while the daemon starts, across all
/// forwarder shards. Each attach in progress holds a recovery read buffer per data directory
/// (at most 1 MiB) and the files of the log it reads; well under `CONTROL_CHANNEL_CAPACITY`.
pub const RECOVERY_ATTACHES_IN_FLIGHT_MAX: usize = 32;

impl<S: Storage> Router<S> {
    /// Attaches every catalogued topic and subscription to its forwarder, and removes topic
    /// directories the catalog does not name (creations that crashed before their catalog
    /// entry, or deletions that crashed before removing the files).
    pub async fn recover(&self) -> Result<(), String> {
        let topics: Vec<TopicRecord> = {
            let state = self.state.borrow();
            let mut topics: Vec<TopicRecord> =
                state.topics.values().map(|topic| TopicRecord::clone(topic)).collect();
            topics.sort_by_key(|topic| topic.id);
            topics
        };
        let started = crate::runtime::now();
        let (replicated, topics): (Vec<TopicRecord>, Vec<TopicRecord>) =
            topics.into_iter().partition(|topic| topic.replica_count() > 1);
        self.recover_replicas(&replicated).await?;
        let topics = self.place_recovered(topics).await?;
        // Each node attaches the topics placed on its own forwarders.
        let topics: Vec<TopicRecord> =
            topics.into_iter().filter(|topic| topic.shard.node() == self.node_id()).collect();
        // Attached with several at once, since each attach waits on reads of the topic's logs.
        let attaches: Vec<(ShardId, &TopicRecord)> =
            topics.iter().map(|topic| (topic.shard, topic)).collect();
        try_for_each_concurrent(attaches, RECOVERY_ATTACHES_IN_FLIGHT_MAX, |(shard, topic)| async move {
            let active = self.state.borrow().count_for_source(topic.id, 0);
            self.call_forwarder(
                shard,
                ControlRequest::AttachTopic {
                    topic_id: topic.id,
                    name: topic.name.to_string(),
                    retention_seconds: topic.message_retention_seconds,
                    recovering: true,
                    source: crate::ids::SourceId::FIRST,
                    active,
                },
            )
            .await
            .map(|_| ())
            .map_err(|error| {
                let status = Status::from(error);
                let hint = if status.code == ErrorCode::DataLoss {
                    " (with --quarantine-damaged the daemon starts and serves the other topics, \
                         leaving this one and its files as they are)"
                } else {
                    ""
                };
                format!("recovering topic '{}': {status}{hint}", topic.name)
            })
        })
        .await?;
        // Then each later source placed here, knowing its number (placed again first if its
        // shard is gone).
        self.place_recovered_sources().await?;
        self.recover_sources().await?;
        // Before the subscriptions: what they held at the delivery gate is held again.
        self.recover_gates().await;
        let subscriptions: Vec<(ShardId, ControlRequest)> = self
            .state
            .borrow()
            .subscriptions
            .values()
            // A detached subscription is served nowhere, as if its topic were deleted.
            .filter(|record| !record.detached)
            // A replicated topic's subscriptions are attached once its leader is promoted.
            .filter(|record| !replicated.iter().any(|topic| topic.id == record.topic_id))
            .flat_map(|record| {
                // On each of its topic's sources placed here, from its sync point there.
                self.units_of(record.topic_id)
                    .into_iter()
                    .filter(|unit| unit.shard.node() == self.node_id())
                    .map(|unit| (unit.shard, attach_subscription(record, &unit)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let subscription_count = subscriptions.len();
        try_for_each_concurrent(
            subscriptions,
            RECOVERY_ATTACHES_IN_FLIGHT_MAX,
            |(shard, attach)| async move {
                let ControlRequest::AttachSubscription { name, .. } = &attach else { unreachable!() };
                let name = name.clone();
                self.call_forwarder(shard, attach)
                    .await
                    .map(|_| ())
                    .map_err(|error| format!("recovering subscription '{name}': {}", Status::from(error)))
            },
        )
        .await?;
        if !topics.is_empty() {
            // What an operator waits for before "serving on": with thousands of topics, seconds.
            crate::log_info!(
                "ringpostd: recovered {} topic(s) and {subscription_count} subscription(s) in {:.2} s",
                topics.len(),
                crate::runtime::now().saturating_duration_since(started).as_secs_f64()
            );
        }
        let node = self.node_id();
        let replicas_here =
            replicated.iter().filter(|topic| topic.replicas.iter().any(|shard| shard.node() == node));
        let sources_here = self.sources_on(node);
        let known: HashSet<String> = topics
            .iter()
            .chain(replicas_here)
            .map(|topic| topic.id)
            .chain(sources_here)
            .map(|id| format!("{id:016x}"))
            .collect();
        for copy in 0..self.directories.count() {
            let topics_directory = self.directories.path(copy).join("topics");
            if let Ok(names) = self.storage.list_dir(&topics_directory) {
                for name in names.into_iter().filter(|name| !known.contains(name)) {
                    crate::log_info!(
                        "ringpostd: removing {}: the catalog does not name this topic (an unfinished create or delete)",
                        topics_directory.join(&name).display()
                    );
                    let _ = self.storage.remove_dir_all(&topics_directory.join(name));
                }
            }
        }
        Ok(())
    }

    /// A topic whose shard is gone (this node restarted with fewer) is placed again, by a
    /// decided entry, on this node: its files are here.
    pub(super) async fn place_recovered(
        &self,
        mut topics: Vec<TopicRecord>,
    ) -> Result<Vec<TopicRecord>, String> {
        let shards = self.forwarders.len() as u32;
        let mut placement = Placement::new(shards.max(1), self.balance_factor);
        let this_node = |topic: &TopicRecord| topic.shard.node() == self.node_id();
        for topic in topics.iter().filter(|topic| this_node(topic)) {
            let local = topic.shard.local();
            if local < shards {
                placement.assign(local);
            }
        }
        for topic in topics.iter_mut().filter(|topic| this_node(topic) && topic.shard.local() >= shards) {
            // Never onto a shard holding one of its later sources: a shard serves one of a
            // topic's sources.
            let taken = self.state.borrow().shards_of_other_units(topic.id);
            let local = placement
                .place_avoiding(&topic.name, |local| taken.contains(&ShardId::new(self.node_id(), local)));
            let local = local
                .ok_or_else(|| every_shard_taken(&format!("topic '{}'", topic.name), topic.shard, shards))?;
            let shard = ShardId::new(self.node_id(), local);
            if !self.catalog.leads() {
                return Err(format!(
                    "topic '{}' is placed on shard {} of this node, which has {shards}: start it with as \
                     many forwarder shards as before",
                    topic.name,
                    topic.shard.local()
                ));
            }
            self.propose(CatalogEntry::TopicPlaced { id: topic.id, shard })
                .await
                .map_err(|error| format!("placing topic '{}' again: {}", topic.name, Status::from(error)))?;
            topic.shard = shard;
        }
        Ok(topics)
    }

    /// A later source of one replica whose shard is gone (this node restarted with fewer) is
    /// placed again, as `place_recovered` places a topic, on a shard of this node that holds
    /// none of its topic's units (its files are here).
    pub(super) async fn place_recovered_sources(&self) -> Result<(), String> {
        let shards = self.forwarders.len() as u32;
        let node = self.node_id();
        let (gone, mut placement) = {
            let state = self.state.borrow();
            let mut placement = Placement::new(shards.max(1), self.balance_factor);
            let topics = state.topics.values().map(|topic| topic.shard);
            for shard in topics.chain(state.sources.values().map(|source| source.shard)) {
                if shard.node() == node && shard.local() < shards {
                    placement.assign(shard.local());
                }
            }
            let gone: Vec<(SourceRecord, String)> = state
                .sources
                .values()
                .filter(|source| source.replicas.len() <= 1)
                .filter(|source| source.shard.node() == node && source.shard.local() >= shards)
                .filter_map(|source| {
                    Some((source.clone(), state.topic_by_id(source.topic_id)?.name.to_string()))
                })
                .collect();
            (gone, placement)
        };
        for (source, topic) in gone {
            let number = source.source.get();
            let taken = self.state.borrow().shards_of_other_units(source.id);
            let local = placement.place_avoiding(&source_key(&topic, number), |local| {
                taken.contains(&ShardId::new(node, local))
            });
            let shown = format!("topic '{topic}' source {number}");
            let local = local.ok_or_else(|| every_shard_taken(&shown, source.shard, shards))?;
            if !self.catalog.leads() {
                return Err(format!(
                    "{shown} is placed on shard {} of this node, which has {shards}: start it with as \
                     many forwarder shards as before",
                    source.shard.local()
                ));
            }
            let shard = ShardId::new(node, local);
            self.propose(CatalogEntry::TopicPlaced { id: source.id, shard })
                .await
                .map_err(|error| format!("placing {shown} again: {}", Status::from(error)))?;
            crate::log_info!(
                "ringpostd: {shown}: its shard {} is gone; placed on {shard}",
                source.shard.local()
            );
        }
        Ok(())
    }

    /// Trusts data directory `index` again, after rewriting every stale copy in it.
    pub async fn resync_directory(&self, index: usize) -> Result<Resynced, ControlError> {
        if index >= self.directories.count() {
            return Err(ControlError::invalid_argument(format!(
                "there is no data directory {index}; there are {} (numbered from 0 in --data-dir order)",
                self.directories.count()
            )));
        }
        let mut resynced = Resynced::default();
        self.directories.unfence(index);
        if self.catalog.is_stale(index) {
            resynced.batches += self.catalog.resync_copy(index).await?;
            resynced.logs += 1;
        }
        for forwarder in &self.forwarders {
            if let ControlOk::Resynced { logs, batches } =
                forwarder.call(ControlRequest::ResyncDirectory { index }).await?
            {
                resynced.logs += logs;
                resynced.batches += batches;
            }
        }
        crate::log_info!(
            "ringpostd: data directory {index} ({}) resynced: {} logs, {} batches copied; it takes writes again",
            self.directories.path(index).display(),
            resynced.logs,
            resynced.batches
        );
        Ok(resynced)
    }
}
