//! Topics: created, updated, deleted, listed and looked up.

use super::*;
use crate::ids::{ShardId, TopicId};

impl<S: Storage> Router<S> {
    pub async fn create_topic(&self, request: Topic) -> Result<Topic, ControlError> {
        let name = request.name.as_str();
        validate_name("topic", name)?;
        let retention = topic_retention_seconds(request.message_retention_seconds)?;
        validate_labels(&request.labels)?;
        let _reservation = self.reserve_name(&format!("topic/{name}"))?;
        if self.state.borrow().topics.contains_key(name) {
            return Err(ControlError::AlreadyExists(format!("topic '{name}'")));
        }
        self.check_leads()?;
        let _slot = self.within_limits(CreateKind::Topic)?;
        let replicas = self.replica_count(request.replicas)?;
        let sources = request.sources.max(1);
        // A topic of one source is checked as it always was (its replicas, when placed).
        if sources > 1 {
            self.check_source_count(sources, replicas)?;
        }
        let id = TopicId::new(self.allocate_id().await?);
        let created = if replicas > 1 {
            self.create_replicated_topic(id, &request, retention, replicas).await?
        } else {
            self.create_single_topic(id, &request, retention).await?
        };
        if sources == 1 {
            return Ok(created);
        }
        // Source 0 is the topic as it always was; the others follow, each decided on its own.
        // A failure among them leaves the topic with the sources added so far, which an update
        // to the count asked adds to.
        let record = self.state.borrow().topic_by_id(id).cloned();
        let record =
            record.ok_or_else(|| ControlError::NotFound(format!("topic '{name}' (deleted meanwhile)")))?;
        self.add_sources(&record, sources).await?;
        Ok(self.topic_shown(&record))
    }

    /// A topic of one replica on the forwarder placement chooses.
    async fn create_single_topic(
        &self,
        id: TopicId,
        request: &Topic,
        retention: u64,
    ) -> Result<Topic, ControlError> {
        let name = request.name.as_str();
        // The placed forwarder first; one that cannot take the topic (its node is down, its
        // disk is full) passes it to the next in preference order.
        let mut refusal = ControlError::Unavailable("no forwarder is placed".into());
        let mut attached = None;
        for shard in self.place(name) {
            let attach = ControlRequest::AttachTopic {
                topic_id: id,
                name: name.to_owned(),
                retention_seconds: retention,
                recovering: false,
                source: crate::ids::SourceId::FIRST,
                active: 1,
            };
            match self.call_forwarder(shard, attach).await {
                Ok(_) => {
                    attached = Some(shard);
                    break;
                }
                Err(error) if error.is_unavailable() => refusal = error,
                Err(error) => return Err(error),
            }
        }
        let Some(shard) = attached else { return Err(refusal) };
        let record = TopicRecord {
            id,
            name: name.into(),
            message_retention_seconds: retention,
            shard,
            created_ms: wall_ms(),
            labels: request.labels.clone(),
            replicas: Vec::new(),
            epoch: 0,
        };
        let response = topic_message(&record, 1);
        if let Err(error) = self.propose(CatalogEntry::TopicCreated(record)).await {
            // Undecided, the topic may still be created: it stays attached, its files kept,
            // and the next start removes them if the catalog never names it.
            if !error.is_undecided() {
                let _ = self
                    .call_forwarder(shard, ControlRequest::DetachTopic { topic_id: id, delete_data: true })
                    .await;
            }
            return Err(error);
        }
        Ok(response)
    }

    pub(super) fn topic_record(&self, name: &str) -> Result<TopicRecord, ControlError> {
        validate_name("topic", name)?;
        self.state
            .borrow()
            .topics
            .get(name)
            .map(|topic| TopicRecord::clone(topic))
            .ok_or_else(|| ControlError::NotFound(format!("topic '{name}'")))
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), ControlError> {
        let topic = self.topic_record(name)?;
        // Its later sources, read before the deletion removes them with it.
        let sources: Vec<(TopicId, ShardId)> = self
            .state
            .borrow()
            .sources_of(topic.id)
            .flat_map(|source| source.replica_shards().into_iter().map(|shard| (source.id, shard)))
            .collect();
        let applied = self.propose(CatalogEntry::TopicDeleted { id: topic.id }).await?;
        let units: Vec<(TopicId, ShardId)> = match applied {
            Applied::TopicDeleted(Some(removed)) => {
                removed.replica_shards().into_iter().map(|shard| (topic.id, shard)).chain(sources).collect()
            }
            _ => Vec::new(),
        };
        for (topic_id, shard) in units {
            // The deletion is durable already; if removing the files fails now, the next start
            // removes them (the catalog no longer names the directory).
            if let Err(status) =
                self.call_forwarder(shard, ControlRequest::DetachTopic { topic_id, delete_data: true }).await
            {
                crate::log_warn!("ringpostd: deleting the files of topic '{}': {status}", topic.name);
            }
        }
        Ok(())
    }

    /// UpdateTopic. The new retention is made durable in the catalog first (what the next start
    /// attaches the topic with), then the forwarder that owns the topic applies it.
    pub async fn update_topic(&self, changes: TopicUpdate) -> Result<Topic, ControlError> {
        let _update = self.update_permit().await?;
        let mut topic = self.topic_record(&changes.name)?;
        if let Some(sources) = changes.sources {
            self.set_source_count(&topic, sources).await?;
            // A count asked for is fixed: the topic's sources no longer follow its load.
            if changes.sources_auto.is_none() && self.state.borrow().source_policies.contains_key(&topic.id) {
                self.propose(CatalogEntry::SourcePolicySet { topic_id: topic.id, bounds: None }).await?;
            }
        }
        if let Some(bounds) = changes.sources_auto {
            self.follow_sources(&topic, bounds).await?;
        }
        if let Some(retention) = changes.message_retention_seconds {
            topic.message_retention_seconds = retention;
        }
        if let Some(labels) = changes.labels {
            validate_labels(&labels)?;
            topic.labels = labels;
        }
        let retention_seconds = topic.message_retention_seconds;
        self.propose(CatalogEntry::TopicUpdated {
            id: topic.id,
            message_retention_seconds: retention_seconds,
            labels: topic.labels.clone(),
        })
        .await?;
        // A deletion that committed while the update waited for the disk wins.
        if self.state.borrow().topic_by_id(topic.id).is_none() {
            return Err(ControlError::NotFound(format!(
                "topic '{}' (deleted during the update)",
                topic.name
            )));
        }
        for unit in self.units_of(topic.id) {
            let update = SettingsUpdate::Topic { retention_seconds };
            self.call_forwarder(unit.shard, ControlRequest::UpdateSettings { topic_id: unit.id, update })
                .await
                .map_err(|status| not_applied("topic", &topic.name, status))?;
        }
        Ok(self.topic_shown(&topic))
    }

    /// Sets topic `topic`'s active sources to `sources`: fewer retires the highest
    /// (`retire_sources`); more adds sources, refused while some retire; the count it has
    /// serves its subscriptions on every source again (`serve_subscriptions_on_sources`). The
    /// caller holds the update gate.
    pub(super) async fn set_source_count(
        &self,
        topic: &TopicRecord,
        sources: u32,
    ) -> Result<(), ControlError> {
        let (have, active) = {
            let state = self.state.borrow();
            (state.source_count(topic.id) as u32, state.active_sources(topic.id))
        };
        if sources < active {
            self.retire_sources(topic, sources).await?;
        } else if sources > active && have > active {
            // A new source takes the next number, past the retiring ones, which the key map
            // (sources below the active count) would skip.
            return Err(ControlError::failed_precondition(format!(
                "topic '{}' has {} sources retiring: the count rises again once they are deleted",
                topic.name,
                have - active
            )));
        } else if sources > have {
            self.check_source_count(sources, topic.replica_count())?;
            self.add_sources(topic, sources).await?;
        } else {
            self.serve_subscriptions_on_sources(topic).await?;
        }
        Ok(())
    }

    /// Serves each of topic `topic`'s subscriptions on each of its sources after the first
    /// again (an attach of one served already is answered at once): what an update asking for
    /// the count the topic has does, so that one sent again after a source was added but not
    /// given every subscription (`NotApplied`: its forwarder unreachable then) applies it, as
    /// its error says. Before, it changed nothing, and the subscription got none of that
    /// source's messages until its next start (the cluster simulation with topics of several
    /// sources, seed 169).
    async fn serve_subscriptions_on_sources(&self, topic: &TopicRecord) -> Result<(), ControlError> {
        let subscriptions: Vec<SubscriptionRecord> =
            self.state.borrow().subscriptions_served_by(topic.id).cloned().collect();
        for unit in self.units_of(topic.id).iter().skip(1) {
            for subscription in &subscriptions {
                self.call_forwarder(unit.shard, sources::attach_subscription(subscription, unit))
                    .await
                    .map_err(|status| not_applied("subscription", &subscription.name, status))?;
            }
        }
        Ok(())
    }

    /// One page of the topics `visible` shows (by name), from after the page token. What the
    /// caller may not see is left out before the page is cut, so the next page's token is the
    /// last name it was shown and never names what it may not see.
    pub fn list_topics(&self, request: &ListRequest, visible: impl Fn(&str) -> bool) -> Page<Topic> {
        let state = self.state.borrow();
        let topics = state
            .topics
            .range::<str, _>((
                std::ops::Bound::Excluded(request.page_token.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .filter(|(name, _)| visible(name))
            .map(|(_, topic)| topic_message(topic, state.source_count(topic.id)));
        page(topics, request.page_size, |topic| &topic.name)
    }

    pub fn get_topic(&self, name: &str) -> Result<Topic, ControlError> {
        Ok(self.topic_shown(&self.topic_record(name)?))
    }

    /// The forwarders serving a topic, most preferred first. `local`: the address the client
    /// reached the router at.
    pub fn lookup_topic(
        &self,
        name: &str,
        local: Option<SocketAddr>,
        client: Option<&super::restrictions::RouteClient>,
    ) -> Result<Vec<ForwarderAddress>, ControlError> {
        let topic = self.topic_record(name)?;
        self.lookup(&topic.name, topic.id, local, client)
    }
}

/// A topic as clients see it, with its number of `sources` (its sources' leaders are
/// `Router::topic_shown`'s).
pub(super) fn topic_message(topic: &TopicRecord, sources: usize) -> Topic {
    Topic {
        name: topic.name.to_string(),
        message_retention_seconds: topic.message_retention_seconds,
        labels: topic.labels.clone(),
        replicas: topic.replica_count() as u32,
        sources: sources as u32,
        source_leaders: Vec::new(),
        source_policy: None,
    }
}
