//! The router's requests to a forwarder shard (`control::ControlRequest`): one arm each, each
//! a method below or in `attach`.

use super::Forwarder;
use crate::api::Status;
use crate::control::{ControlOk, ControlRequest, SettingsUpdate};
use crate::ids::{Epoch, SnapshotId, SubscriptionId, TopicId};
use crate::storage::Storage;
use crate::subscription::journal_entry::JournalEntry;
use crate::topic::journal::SnapshotState;
use crate::topic::{topic_folder, TopicState};
use std::rc::Rc;

impl<S: Storage> Forwarder<S> {
    pub async fn control(&self, request: ControlRequest) -> Result<ControlOk, Status> {
        // Creating and deleting topics allocates like any burst; reading the stats does not
        // count, or watching a quiet daemon would keep it from trimming.
        if !matches!(request, ControlRequest::Stats | ControlRequest::Requests) {
            self.activity.count_request();
        }
        match request {
            ControlRequest::AttachTopic { topic_id, name, retention_seconds, recovering, source, active } => {
                self.attach_topic(topic_id, name, retention_seconds, recovering, (source, active)).await
            }
            ControlRequest::DurableEnd { topic_id } => self.durable_end(topic_id).await,
            ControlRequest::Stats => Ok(ControlOk::Stats(self.shard_stats(), self.topic_stats().await)),
            ControlRequest::Requests => {
                let mut figures = crate::metrics::shard::snapshot();
                figures.flow = self.flow_figures();
                Ok(ControlOk::Requests(figures))
            }
            ControlRequest::UpdateSettings { topic_id, update } => self.update_settings(topic_id, update),
            ControlRequest::Seek { subscription_id, topic_id, time_ms, snapshot_id } => {
                self.seek(topic_id, subscription_id, time_ms, snapshot_id).await
            }
            ControlRequest::TakeSnapshot { topic_id, subscription_id, snapshot_id, expire_time_ms } => {
                self.take_snapshot(topic_id, subscription_id, snapshot_id, expire_time_ms).await
            }
            ControlRequest::DropSnapshot { topic_id, snapshot_id } => {
                self.drop_snapshot(topic_id, snapshot_id).await
            }
            ControlRequest::ResyncDirectory { index } => self.resync_directory(index).await,
            ControlRequest::DetachTopic { topic_id, delete_data } => {
                self.detach_topic(topic_id, delete_data);
                Ok(ControlOk::Done)
            }
            ControlRequest::AttachSubscription {
                subscription_id,
                name,
                topic_id,
                settings,
                create,
                start_offset,
            } => {
                self.attach_subscription(subscription_id, name, topic_id, settings, create, start_offset)
                    .await
            }
            ControlRequest::AttachReplica {
                topic_id,
                name,
                retention_seconds,
                recovering,
                source,
                active,
            } => self.attach_replica(topic_id, name, retention_seconds, recovering, (source, active)).await,
            ControlRequest::PromoteReplica { topic_id, epoch, replicas } => {
                self.promote_replica(topic_id, Epoch::new(epoch), replicas).await
            }
            ControlRequest::DemoteReplica { topic_id, epoch } => {
                self.demote_replica(topic_id, Epoch::new(epoch));
                Ok(ControlOk::Done)
            }
            ControlRequest::ElectionsWanted => Ok(ControlOk::Topics(self.elections_wanted())),
            ControlRequest::ReplicaProgress { topic_id } => {
                Ok(ControlOk::Progress(self.replica_progress(topic_id)?))
            }
            ControlRequest::FenceReplica { topic_id, epoch } => {
                let [messages, _] = self.fence_replica(topic_id, Epoch::new(epoch)).await?;
                Ok(ControlOk::Fenced {
                    last_epoch: messages.last_epoch.get(),
                    durable_end: messages.durable_end.get(),
                })
            }
            ControlRequest::DetachSubscription { subscription_id, name, topic_id, deleted } => {
                self.detach_subscription(subscription_id, &name, topic_id, deleted);
                Ok(ControlOk::Done)
            }
            // The shard's connection server keeps the cluster's hosts, not the forwarder: the
            // shard's start takes this request before it reaches here (`node::forwarder_shard`).
            ControlRequest::ClusterHosts { .. } => Ok(ControlOk::Done),
            ControlRequest::ApplySources { topic_id, active } => {
                // A follower keeps the count for when it is promoted, and answers `Done`: its
                // fence and floors are not the source's (it serves no subscription, and its
                // fence is set anew at promotion), so a router never takes them for the
                // leader's, even when it asks a leader demoted meanwhile.
                if let Some(follower) = self.registry.followers.borrow().get(&topic_id) {
                    follower.apply_active_sources(active);
                    return Ok(ControlOk::Done);
                }
                let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
                    Status::not_found(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
                })?;
                let fence = topic.apply_active_sources(active);
                Ok(ControlOk::SourcesApplied { fence, floors: topic.ack_floors() })
            }
            ControlRequest::SetTopicSchema { topic_id, schema } => {
                self.set_topic_schema(topic_id, schema);
                Ok(ControlOk::Done)
            }
            ControlRequest::GateSources { topic_id, generation, before, after, passed } => {
                let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
                    Status::not_found(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
                })?;
                topic.apply_gate(generation, before, after, passed);
                Ok(ControlOk::Done)
            }
        }
    }

    /// A topic's durable end offset: the sync point the router decides a new subscription with.
    /// Every publish acknowledged after the router answers the create has an offset at or
    /// above it, because offsets are assigned at commit; every publish acknowledged before the
    /// create began is below it, because it is the commit point, and a replicated topic's new
    /// leader answers only once it has committed a record of its epoch (before that its commit
    /// point is what it was told as a follower, which may lag what its predecessor
    /// acknowledged). `Unavailable` if that commit takes longer than `SYNC_POINT_WAIT_MAX`,
    /// `NotOwner` if the leader is deposed meanwhile.
    pub(crate) async fn durable_end(&self, topic_id: TopicId) -> Result<ControlOk, Status> {
        if let Some((topic_name, why)) = self.registry.quarantined.borrow().topics.get(&topic_id) {
            return Err(super::quarantined_status("topic", topic_name, why));
        }
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
            Status::internal(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
        })?;
        if let Some(leader) = topic.leader() {
            leader.wait_epoch_committed(crate::replication::protocol::MESSAGES, &topic.log).await?;
        }
        Ok(ControlOk::SubscriptionStart(topic.log.end_offset().get()))
    }

    /// Moves a subscription's acknowledgements to the first message published at `time_ms`, or
    /// to those a snapshot captured, durably first.
    async fn seek(
        &self,
        topic_id: TopicId,
        subscription_id: u64,
        time_ms: u64,
        snapshot_id: Option<SnapshotId>,
    ) -> Result<ControlOk, Status> {
        let (topic, entry) = self.attached(topic_id, subscription_id)?;
        let (offset, runs) = match snapshot_id {
            Some(snapshot_id) => topic
                .journal
                .with_open(|open| {
                    open.snapshots.get(&snapshot_id).map(|snapshot| (snapshot.floor, snapshot.runs.clone()))
                })
                .flatten()
                .ok_or_else(|| Status::not_found("the snapshot is not stored with its topic"))?,
            None => (topic.log.offset_at_time(time_ms).await?, Vec::new()),
        };
        let mut offset = offset.max(topic.log.start_offset());
        if snapshot_id.is_none() && topic.retention_seconds.get() == 0 {
            // A subscription holds only what was published after its creation; only a
            // topic's own retention keeps older messages to seek back to, as in Pub/Sub.
            // Without it, older messages may still be on disk (another subscription
            // has not acknowledged them) but are not this subscription's to replay.
            offset = offset.max(entry.state.borrow().start_offset);
        }
        let subscription_id = SubscriptionId::new(subscription_id);
        topic.append_journal(&JournalEntry::Seek { subscription_id, offset }).await?;
        if !runs.is_empty() {
            topic.append_journal(&JournalEntry::Acked { subscription_id, runs: runs.clone() }).await?;
        }
        let mut state = entry.state.borrow_mut();
        state.seek(offset);
        for (first, count) in runs {
            for acked in first.up_to(first + count as u64) {
                state.restore_ack(acked);
            }
        }
        drop(state);
        entry.changed.notify_all();
        Ok(ControlOk::Done)
    }

    async fn take_snapshot(
        &self,
        topic_id: TopicId,
        subscription_id: u64,
        snapshot_id: SnapshotId,
        expire_time_ms: u64,
    ) -> Result<ControlOk, Status> {
        let (topic, entry) = self.attached(topic_id, subscription_id)?;
        let (floor, runs) = entry.state.borrow().acknowledged_runs();
        let taken = JournalEntry::SnapshotTaken { snapshot_id, floor, runs: runs.clone(), expire_time_ms };
        topic.append_journal(&taken).await?;
        // The append opened the journal.
        topic.journal.with_open(|open| {
            open.snapshots.insert(snapshot_id, SnapshotState { floor, runs, expire_time_ms })
        });
        Ok(ControlOk::Done)
    }

    async fn drop_snapshot(&self, topic_id: TopicId, snapshot_id: SnapshotId) -> Result<ControlOk, Status> {
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
        if let Some(topic) = topic {
            let dropped = topic.journal.with_open(|open| open.snapshots.remove(&snapshot_id).is_some());
            if dropped == Some(true) {
                topic.append_journal(&JournalEntry::SnapshotDropped { snapshot_id }).await?;
            }
        }
        Ok(ControlOk::Done)
    }

    /// Trusts data directory `index` again, after rewriting every stale copy in it.
    async fn resync_directory(&self, index: usize) -> Result<ControlOk, Status> {
        let directories = &self.store.directories;
        if index >= directories.count() {
            return Err(Status::invalid_argument(format!(
                "there is no data directory {index}; there are {}",
                directories.count()
            )));
        }
        directories.unfence(index);
        let (mut logs, mut batches) = (0, 0);
        for topic in self.registry.topic_list() {
            for log in topic.log.made().cloned().into_iter().chain(topic.journal.opened()) {
                if log.is_stale(index) {
                    batches += log.resync_copy(index).await?;
                    logs += 1;
                }
            }
        }
        Ok(ControlOk::Resynced { logs, batches })
    }

    /// Stops serving a topic and its subscriptions; with `delete_data`, removes its files.
    fn detach_topic(&self, topic_id: TopicId, delete_data: bool) {
        let quarantined = {
            let mut quarantined = self.registry.quarantined.borrow_mut();
            quarantined.subscriptions.retain(|_, (owner, _)| *owner != topic_id);
            let removed = quarantined.topics.remove(&topic_id);
            if let Some((name, _)) = &removed {
                quarantined.topic_names.remove(name);
            }
            removed
        };
        if let (Some((name, _)), true) = (quarantined, delete_data) {
            // Deleting is the operator's way out for a damaged topic: its folders go.
            let (storage, directories) = (&self.store.storage, &self.store.directories);
            for copy in 0..directories.count() {
                let folder = directories.path(copy).join(topic_folder(topic_id));
                if storage.exists(&folder) {
                    if let Err(error) = storage.remove_dir_all(&folder) {
                        crate::log_warn!(
                            "ringpostd: removing {} of topic '{name}': {error}",
                            folder.display()
                        );
                    }
                }
            }
        }
        let following = self.registry.followers.borrow_mut().remove(&topic_id);
        if let Some(topic) = following {
            if delete_data {
                self.store.delete_files(topic);
            }
            return;
        }
        let topic: Option<Rc<TopicState<S>>> = self.registry.topics_by_id.borrow_mut().remove(&topic_id);
        if let Some(leader) = topic.as_ref().and_then(|topic| topic.leader()) {
            leader.stop();
        }
        if let Some(topic) = topic {
            self.registry.topics.borrow_mut().remove(&topic.name);
            // A later source detached (retired and delivered out, or its topic deleted): its
            // subscriptions live on at the topic's other sources, so a pull or stream waiting
            // here ends as moved (`Unavailable`: look the sources up again), never as deleted.
            let later_source = topic.source != crate::ids::SourceId::FIRST;
            self.registry.subscriptions.borrow_mut().retain(|_, (entry, owner)| {
                if owner.id == topic_id {
                    if later_source {
                        entry.moved.set(true);
                    }
                    entry.detach();
                }
                owner.id != topic_id
            });
            if delete_data {
                self.store.delete_files(topic);
            }
        }
    }

    /// Stops serving a subscription that was deleted, or detached from its topic (`deleted`
    /// false); either way its state here goes.
    fn detach_subscription(&self, subscription_id: u64, name: &str, topic_id: TopicId, deleted: bool) {
        self.registry.quarantined.borrow_mut().subscriptions.remove(name);
        let removed = self.registry.subscriptions.borrow_mut().remove(name);
        if let Some((entry, _)) = removed {
            entry.left_topic.set(!deleted);
            entry.detach();
        }
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
        // Nothing to journal: replay applies only entries of subscriptions the router
        // attaches, and the next checkpoint drops this one's.
        if let Some(topic) = topic {
            topic.subscriptions.borrow_mut().retain(|entry| entry.id != SubscriptionId::new(subscription_id));
        }
    }

    /// Checks topic unit `topic_id`'s publishes against `schema` from now on (`topic::schema`),
    /// served or following; compiled unless it is the schema it has. A unit not attached here
    /// (quarantined, or detached meanwhile) has nothing to check: its next attach is followed
    /// by its schema again.
    fn set_topic_schema(&self, topic_id: TopicId, schema: Option<crate::router::schemas::TopicSchema>) {
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
        let Some(topic) = topic.or_else(|| self.registry.followers.borrow().get(&topic_id).cloned()) else {
            return;
        };
        let same = match (&*topic.schema.borrow(), &schema) {
            (Some(held), Some(schema)) => held.source == *schema,
            (None, None) => true,
            _ => false,
        };
        if !same {
            let check = schema.map(|schema| Rc::new(crate::topic::schema::TopicSchemaCheck::new(schema)));
            *topic.schema.borrow_mut() = check;
        }
    }

    /// Applies an update the router made durable in the catalog: a topic's retention, or a
    /// subscription's settings (`SubscriptionEntry::update`).
    fn update_settings(&self, topic_id: TopicId, update: SettingsUpdate) -> Result<ControlOk, Status> {
        if self.registry.quarantined.borrow().topics.contains_key(&topic_id) {
            // Not served; the catalog holds the new settings for when it is again.
            return Ok(ControlOk::Done);
        }
        match update {
            SettingsUpdate::Topic { retention_seconds } => {
                let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
                let topic =
                    topic.ok_or_else(|| Status::internal(format!("topic {topic_id:x} is not attached")))?;
                // Segments are kept or deleted by the new value from the next collection on.
                topic.retention_seconds.set(retention_seconds);
            }
            SettingsUpdate::Subscription { subscription_id, settings } => {
                let (_, entry) = self.attached(topic_id, subscription_id)?;
                entry.update(&settings);
                // Updated to push: a task starts (updated to pull, its task stops by itself).
                self.pushing.offer(&entry);
            }
        }
        Ok(ControlOk::Done)
    }
}
