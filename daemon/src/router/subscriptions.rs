//! Subscriptions: created (and watched while their creation is undecided), updated, expired,
//! deleted, detached, sought, listed and looked up.

use super::sources::attach_subscription;
use super::*;

/// What a subscription whose topic was deleted reports as its topic (as Pub/Sub does).
pub const DELETED_TOPIC: &str = "_deleted-topic_";

/// How often idle subscriptions are checked against their expiration policy.
pub const EXPIRATION_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// A subscription created with an unknown outcome, and how to serve it if it was decided.
pub(super) struct Undecided {
    subscription_id: u64,
    /// Each of its topic's sources' shard and what serves the subscription there.
    attaches: Vec<(ShardId, ControlRequest)>,
    /// Past this, it is no longer watched; if it commits later, the next start attaches it.
    until: std::time::Instant,
}

/// How long an undecided subscription is watched for its creation to commit.
pub const UNDECIDED_WATCH: std::time::Duration = std::time::Duration::from_secs(120);

/// Most undecided subscriptions watched at once; one beyond is left to the next start, which
/// attaches whatever the catalog names.
pub const UNDECIDED_WATCHED_MAX: usize = 1024;

/// How often the undecided subscriptions are looked at.
pub const UNDECIDED_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl<S: Storage> Router<S> {
    /// `request`: the settings as asked, 0 or empty asking for a setting's default.
    pub async fn create_subscription(&self, request: Subscription) -> Result<Subscription, ControlError> {
        let name = request.name.as_str();
        validate_name("subscription", name)?;
        let topic = self.topic_record(request.topic.as_str())?;
        // From here on, the settings as asked.
        let request = &request.settings;
        if request.filter.len() > FILTER_BYTES_MAX {
            return Err(ControlError::invalid_argument(format!(
                "filter is {} bytes; the limit is {FILTER_BYTES_MAX} (FILTER_BYTES_MAX)",
                request.filter.len()
            )));
        }
        if !request.filter.is_empty() {
            crate::subscription::filter::Filter::parse(&request.filter)
                .map_err(|error| ControlError::invalid_argument(format!("invalid filter: {error}")))?;
        }
        let dead_letter_topic = request.dead_letter_topic.as_str();
        let max_delivery_attempts =
            effective_max_delivery_attempts(dead_letter_topic, request.max_delivery_attempts)?;
        if !dead_letter_topic.is_empty() {
            check_dead_letter_topic(name, &topic.name, dead_letter_topic)?;
            self.topic_record(dead_letter_topic)?;
        }
        let (minimum_backoff, maximum_backoff) = effective_retry_backoff_seconds(
            request.minimum_backoff_seconds,
            request.maximum_backoff_seconds,
        )?;
        let expiration = effective_expiration_ttl_seconds(request.expiration_ttl_seconds)?;
        validate_labels(&request.labels)?;
        if let Some(push) = &request.push {
            validate_push_config(push)?;
        }
        validate_push_delivery(request.push.is_some(), request.enable_exactly_once_delivery)?;
        let settings = SubscriptionSettings {
            ack_deadline_seconds: effective_ack_deadline_seconds(request.ack_deadline_seconds)?,
            retain_acked_messages: request.retain_acked_messages,
            message_retention_seconds: effective_retention_seconds(request.message_retention_seconds)?,
            enable_message_ordering: request.enable_message_ordering,
            filter: request.filter.clone(),
            dead_letter_topic: dead_letter_topic.to_owned(),
            max_delivery_attempts,
            minimum_backoff_seconds: minimum_backoff,
            maximum_backoff_seconds: maximum_backoff,
            expiration_ttl_seconds: expiration,
            labels: request.labels.clone(),
            enable_exactly_once_delivery: request.enable_exactly_once_delivery,
            push: request.push.clone(),
        };
        let _reservation = self.reserve_name(&format!("subscription/{name}"))?;
        if self.state.borrow().subscriptions.contains_key(name) {
            return Err(ControlError::already_exists(format!("subscription '{name}'")));
        }
        let units = self.units_of(topic.id);
        if units.first().is_none_or(|unit| unit.id != topic.id) {
            return Err(ControlError::unavailable(format!(
                "topic '{}' is not placed on a forwarder",
                topic.name
            )));
        }
        self.check_leads()?;
        let _slot = self.within_limits(CreateKind::Subscription { topic_id: topic.id })?;
        let id = self.allocate_id().await?;
        // The sync point on each source: its durable end now. Source 0's is the record's
        // `start_offset`, as before sources; the others' are kept beside it only when the
        // topic has several, so a subscription of a topic of one is written as it always was.
        let mut starts = Vec::with_capacity(units.len());
        for unit in &units {
            let ControlOk::SubscriptionStart(start) =
                self.call_forwarder(unit.shard, ControlRequest::DurableEnd { topic_id: unit.id }).await?
            else {
                return Err(ControlError::internal("the forwarder did not report the topic's durable end"));
            };
            starts.push((unit.source, start));
        }
        let record = SubscriptionRecord {
            id,
            name: name.into(),
            topic_id: topic.id,
            topic_name: topic.name.clone(),
            start_offset: starts[0].1,
            settings,
            created_ms: wall_ms(),
            detached: false,
            source_starts: starts[1..].to_vec(),
        };
        let response = self.subscription_message(&record);
        let attaches: Vec<(ShardId, ControlRequest)> =
            units.iter().map(|unit| (unit.shard, attach_subscription(&record, unit))).collect();
        if let Err(error) = self.propose(CatalogEntry::SubscriptionCreated(record.clone())).await {
            if error.is_undecided() {
                let until = crate::runtime::now() + UNDECIDED_WATCH;
                let mut undecided = self.undecided.borrow_mut();
                if undecided.len() < UNDECIDED_WATCHED_MAX {
                    undecided.push(Undecided { subscription_id: id, attaches, until });
                }
            }
            return Err(error);
        }
        self.attach_created(&record).await?;
        Ok(response)
    }

    /// Serves subscription `record`, whose creation the catalog applied, on each of its topic's
    /// units as the catalog holds them now; if one refuses, deletes it again. The units are
    /// read after the creation applied, not before it: a source whose `SourceAdded` committed
    /// between attached only the subscriptions committed when it did (`add_source`), so not
    /// this one, which then never got its messages until that source's next start (the
    /// cluster simulation's seed 92 with topics of several sources). Read now, such a source
    /// is among them and serves it from 0 (it has no sync point there), as one added after.
    async fn attach_created(&self, record: &SubscriptionRecord) -> Result<(), ControlError> {
        let units = self.units_of(record.topic_id);
        for (index, unit) in units.iter().enumerate() {
            if let Err(status) = self.call_forwarder(unit.shard, attach_subscription(record, unit)).await {
                // Not served, so not kept: the deletion is decided like any other, and the
                // sources that took it drop it.
                let (id, name) = (record.id, record.name.clone());
                let _ = self.propose(CatalogEntry::SubscriptionDeleted { id, name: name.to_string() }).await;
                for unit in &units[..index] {
                    let detach = ControlRequest::DetachSubscription {
                        subscription_id: id,
                        name: name.to_string(),
                        topic_id: unit.id,
                        deleted: true,
                    };
                    let _ = self.call_forwarder(unit.shard, detach).await;
                }
                return Err(status);
            }
        }
        Ok(())
    }

    /// A subscription as clients see it: a detached one names no topic, as one whose topic
    /// was deleted, and says it is detached.
    pub(super) fn subscription_message(&self, record: &SubscriptionRecord) -> Subscription {
        let alive = !record.detached && self.state.borrow().topic_by_id(record.topic_id).is_some();
        Subscription {
            name: record.name.to_string(),
            topic: if alive { record.topic_name.to_string() } else { DELETED_TOPIC.to_owned() },
            settings: record.settings.clone(),
            detached: record.detached,
        }
    }

    /// UpdateSubscription, in the order of `update_topic`. A new dead-letter topic must exist,
    /// as at creation.
    pub async fn update_subscription(
        &self,
        changes: SubscriptionUpdate,
    ) -> Result<Subscription, ControlError> {
        let _update = self.update_permit().await?;
        let mut record = self.subscription_record(&changes.name)?;
        let settings = &mut record.settings;
        if let Some(seconds) = changes.ack_deadline_seconds {
            settings.ack_deadline_seconds = seconds;
        }
        if let Some(retain) = changes.retain_acked_messages {
            settings.retain_acked_messages = retain;
        }
        if let Some(seconds) = changes.message_retention_seconds {
            settings.message_retention_seconds = seconds;
        }
        if let Some(seconds) = changes.expiration_ttl_seconds {
            settings.expiration_ttl_seconds = seconds;
        }
        if let Some((dead_letter_topic, attempts)) = changes.dead_letter_policy {
            if !dead_letter_topic.is_empty() {
                check_dead_letter_topic(&record.name, &record.topic_name, &dead_letter_topic)?;
                self.topic_record(&dead_letter_topic)?;
            }
            settings.dead_letter_topic = dead_letter_topic;
            settings.max_delivery_attempts = attempts;
        }
        if let Some((minimum, maximum)) = changes.retry_policy {
            settings.minimum_backoff_seconds = minimum;
            settings.maximum_backoff_seconds = maximum;
        }
        if let Some(labels) = changes.labels {
            validate_labels(&labels)?;
            settings.labels = labels;
        }
        if let Some(exactly_once) = changes.enable_exactly_once_delivery {
            settings.enable_exactly_once_delivery = exactly_once;
        }
        if let Some(push) = changes.push {
            if let Some(push) = &push {
                validate_push_config(push)?;
            }
            settings.push = push;
        }
        // Checked on the settings the update makes, so that it holds whichever of the two the
        // subscription had first.
        validate_push_delivery(settings.push.is_some(), settings.enable_exactly_once_delivery)?;
        self.propose(CatalogEntry::SubscriptionUpdated {
            id: record.id,
            name: record.name.to_string(),
            settings: record.settings.clone(),
        })
        .await?;
        // A deletion that committed while the update waited for the disk wins.
        if self.state.borrow().subscriptions.get(&record.name).is_none_or(|live| live.id != record.id) {
            return Err(ControlError::not_found(format!(
                "subscription '{}' (deleted during the update)",
                record.name
            )));
        }
        // A subscription whose topic was deleted, or that was detached, is served nowhere: the
        // catalog is all there is. Else each of its topic's sources serves it.
        let units = if record.detached { Vec::new() } else { self.units_of(record.topic_id) };
        for unit in units {
            let update = SettingsUpdate::Subscription {
                subscription_id: record.id,
                settings: record.settings.clone(),
            };
            self.call_forwarder(unit.shard, ControlRequest::UpdateSettings { topic_id: unit.id, update })
                .await
                .map_err(|status| not_applied("subscription", &record.name, status))?;
        }
        Ok(self.subscription_message(&record))
    }

    /// Deletes subscriptions idle for longer than their expiration policy allows.
    pub async fn expire_subscriptions(&self) {
        let Ok(stats) = self.stats().await else { return };
        for (name, idle_ms) in idle_everywhere(&stats) {
            let record =
                self.state.borrow().subscriptions.get(name.as_str()).map(|record| (**record).clone());
            let Some(record) = record else { continue };
            let ttl_ms = record.settings.expiration_ttl_seconds.saturating_mul(1000);
            if idle_ms > ttl_ms {
                crate::log_info!(
                    "ringpostd: subscription '{}' expired after {} s without activity (expiration policy)",
                    record.name,
                    idle_ms / 1000
                );
                if let Err(status) = self.expire_subscription(&record.name).await {
                    crate::log_warn!("ringpostd: expiring subscription '{}': {status}", record.name);
                }
            }
        }
    }

    /// Attaches each subscription whose undecided creation has committed since; forgets those
    /// watched for `UNDECIDED_WATCH`. Called every `UNDECIDED_CHECK_INTERVAL`.
    pub async fn settle_undecided(&self) {
        let now = crate::runtime::now();
        let settled: Vec<Undecided> = {
            let mut undecided = self.undecided.borrow_mut();
            let state = self.state.borrow();
            let (settled, waiting) = std::mem::take(&mut *undecided).into_iter().partition(|watched| {
                watched.until <= now
                    || state.subscriptions.values().any(|record| record.id == watched.subscription_id)
            });
            *undecided = waiting;
            settled
        };
        for watched in settled {
            let decided =
                self.state.borrow().subscriptions.values().any(|record| record.id == watched.subscription_id);
            if !decided {
                continue;
            }
            for (shard, attach) in watched.attaches {
                if let Err(status) = self.call_forwarder(shard, attach).await {
                    crate::log_warn!(
                        "ringpostd: attaching a subscription whose creation committed late: {status}"
                    );
                }
            }
        }
    }

    /// Deletes a subscription this node found idle past its expiration policy: here on the
    /// catalog's leader, which alone knows only its own forwarders' idleness, else by asking it.
    pub(super) async fn expire_subscription(&self, name: &str) -> Result<(), ControlError> {
        if !self.is_clustered() || self.leads() {
            return self.delete_subscription(name).await;
        }
        let (leader, _) =
            self.leader().ok_or_else(|| ControlError::unavailable("the catalog has no leader"))?;
        let peers = self.peers.as_ref().ok_or_else(|| ControlError::unavailable("this node has no peers"))?;
        Ok(peers.expire_subscription(leader, name.to_owned()).await?)
    }

    pub(super) fn subscription_record(&self, name: &str) -> Result<SubscriptionRecord, ControlError> {
        validate_name("subscription", name)?;
        self.state
            .borrow()
            .subscriptions
            .get(name)
            .map(|record| (**record).clone())
            .ok_or_else(|| ControlError::not_found(format!("subscription '{name}'")))
    }

    pub async fn delete_subscription(&self, name: &str) -> Result<(), ControlError> {
        let record = self.subscription_record(name)?;
        self.propose(CatalogEntry::SubscriptionDeleted { id: record.id, name: record.name.to_string() })
            .await?;
        // A detached subscription's forwarders dropped it already.
        let units = if record.detached { Vec::new() } else { self.units_of(record.topic_id) };
        for unit in units {
            if let Err(status) = self
                .call_forwarder(
                    unit.shard,
                    ControlRequest::DetachSubscription {
                        subscription_id: record.id,
                        name: record.name.to_string(),
                        topic_id: unit.id,
                        deleted: true,
                    },
                )
                .await
            {
                crate::log_warn!("ringpostd: detaching subscription '{}': {status}", record.name);
            }
        }
        Ok(())
    }

    /// One page of the subscriptions (of `request.topic`, when given) that `visible` shows, as
    /// `list_topics` pages.
    pub fn list_subscriptions(
        &self,
        request: &ListRequest,
        visible: impl Fn(&str) -> bool,
    ) -> Page<Subscription> {
        let topic_filter = request.topic.as_str();
        let records: Vec<SubscriptionRecord> = {
            let state = self.state.borrow();
            state
                .subscriptions
                .range::<str, _>((
                    std::ops::Bound::Excluded(request.page_token.as_str()),
                    std::ops::Bound::Unbounded,
                ))
                .map(|(_, record)| &**record)
                // A detached subscription is no longer one of its topic's.
                .filter(|record| {
                    topic_filter.is_empty() || (*record.topic_name == *topic_filter && !record.detached)
                })
                .filter(|record| visible(&record.name))
                .take(page_size(request.page_size) + 1)
                .cloned()
                .collect()
        };
        let subscriptions = records.iter().map(|record| self.subscription_message(record));
        page(subscriptions, request.page_size, |subscription| &subscription.name)
    }

    pub fn get_subscription(&self, name: &str) -> Result<Subscription, ControlError> {
        let record = self.subscription_record(name)?;
        Ok(self.subscription_message(&record))
    }

    /// The forwarders serving a subscription (its topic's), most preferred first.
    pub fn lookup_subscription(
        &self,
        name: &str,
        local: Option<SocketAddr>,
        client: Option<&super::restrictions::RouteClient>,
    ) -> Result<Vec<ForwarderAddress>, ControlError> {
        let record = self.subscription_record(name)?;
        if record.detached {
            return Err(detached(&record.name));
        }
        let Some(topic) = self.state.borrow().topic_by_id(record.topic_id).cloned() else {
            return Err(ControlError::failed_precondition(format!(
                "subscription '{}' is detached: its topic was deleted",
                record.name
            )));
        };
        self.lookup(&topic.name, topic.id, local, client)
    }

    /// Seek: a data-plane operation on the subscription's journal, which its topic's forwarder
    /// keeps; the catalog only names the subscription and the snapshot.
    pub async fn seek(&self, subscription: &str, target: SeekTarget) -> Result<(), ControlError> {
        let record = self.subscription_record(subscription)?;
        if record.detached {
            return Err(detached(&record.name));
        }
        let units = self.units_of(record.topic_id);
        if units.is_empty() {
            return Err(ControlError::failed_precondition(format!(
                "subscription '{}' is detached: its topic was deleted",
                record.name
            )));
        }
        let snapshot = match target {
            SeekTarget::Time { time_ms } => {
                // Each source to that time: each finds its own first message published at or
                // after it.
                for unit in units {
                    let seek = ControlRequest::Seek {
                        subscription_id: record.id,
                        topic_id: unit.id,
                        time_ms,
                        snapshot_id: None,
                    };
                    self.call_forwarder(unit.shard, seek).await?;
                }
                return Ok(());
            }
            SeekTarget::Snapshot { name } => self.snapshot_record(&name)?,
        };
        if snapshot.topic_id != record.topic_id {
            return Err(ControlError::failed_precondition(format!(
                "snapshot '{}' is of another topic than subscription '{}'",
                snapshot.name, record.name
            )));
        }
        if snapshot.expire_time_ms <= wall_ms() {
            return Err(ControlError::failed_precondition(format!(
                "snapshot '{}' has expired",
                snapshot.name
            )));
        }
        // Each source to its own copy of the snapshot's acknowledgements. A source added after
        // the snapshot (its id, from the catalog's one counter, is the higher) has none, and
        // every message on it was published after the snapshot was taken, so none of them is
        // acknowledged in the snapshot: it is sought to the snapshot's time, which replays them
        // all.
        for unit in units {
            let added_later = unit.id.get() > snapshot.id.get();
            let seek = ControlRequest::Seek {
                subscription_id: record.id,
                topic_id: unit.id,
                time_ms: if added_later { super::snapshots::snapshot_taken_ms(&snapshot) } else { 0 },
                snapshot_id: (!added_later).then_some(snapshot.id),
            };
            self.call_forwarder(unit.shard, seek).await?;
        }
        Ok(())
    }

    /// DetachSubscription: the subscription stays, but leaves its topic as if the topic were
    /// deleted: its forwarder drops its state (its messages and leases), and from then on it
    /// is served nowhere, so pulls and streams answer `FAILED_PRECONDITION` (the forwarder
    /// answers `NotOwner` and the router's lookup says why). Detaching one already detached
    /// changes nothing. Durable first: a restart never attaches it again.
    pub async fn detach_subscription(&self, name: &str) -> Result<(), ControlError> {
        let _update = self.update_permit().await?;
        let record = self.subscription_record(name)?;
        if record.detached {
            return Ok(());
        }
        let entry = CatalogEntry::SubscriptionDetached { id: record.id, name: record.name.to_string() };
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(ControlError::not_found(format!(
                "subscription '{name}' (deleted during the detach)"
            )));
        }
        for unit in self.units_of(record.topic_id) {
            let request = ControlRequest::DetachSubscription {
                subscription_id: record.id,
                name: record.name.to_string(),
                topic_id: unit.id,
                deleted: false,
            };
            // Durable already: if the forwarder did not take it, the next start does not
            // attach the subscription.
            if let Err(status) = self.call_forwarder(unit.shard, request).await {
                crate::log_warn!(
                    "ringpostd: detaching subscription '{}' from its topic: {status}",
                    record.name
                );
            }
        }
        Ok(())
    }
}

/// A subscription's dead letters go to another topic: to its own, each would come back to it as
/// a new message, to be dead-lettered again after as many attempts, for ever.
pub(super) fn check_dead_letter_topic(
    subscription: &str,
    topic: &str,
    dead_letter_topic: &str,
) -> Result<(), ControlError> {
    if dead_letter_topic == topic {
        return Err(ControlError::invalid_argument(format!(
            "dead_letter_topic '{dead_letter_topic}' is the topic of subscription '{subscription}'; \
             dead letters must go to another topic"
        )));
    }
    Ok(())
}

/// How long each subscription has been idle on every unit serving it: the least of its idle
/// times over its topic's sources, since a subscriber active on one source is not idle.
pub(super) fn idle_everywhere(stats: &Stats) -> std::collections::BTreeMap<String, u64> {
    let mut idle: std::collections::BTreeMap<String, u64> = Default::default();
    for subscription in stats.topics.iter().flat_map(|topic| &topic.subscriptions) {
        idle.entry(subscription.name.clone())
            .and_modify(|least| *least = (*least).min(subscription.idle_ms))
            .or_insert(subscription.idle_ms);
    }
    idle
}

/// What operations a detached subscription cannot take answer.
pub(super) fn detached(name: &str) -> ControlError {
    ControlError::failed_precondition(format!("subscription '{name}' is detached"))
}
