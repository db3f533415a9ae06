//! Attaching topics and subscriptions the router places on this shard.

use super::{quarantined_status, Forwarder};
use crate::api::Status;
use crate::catalog::SubscriptionSettings;
use crate::control::ControlOk;
use crate::ids::{Offset, SourceId, SubscriptionId, TopicId};
use crate::storage::Storage;
use crate::subscription::state::SubscriptionState;
use crate::subscription::{delivery_policy, filter::Filter, recovered_state, SubscriptionEntry};
use std::rc::Rc;
use std::time::Duration;

impl<S: Storage> Forwarder<S> {
    /// Opens unit `topic_id`'s logs and serves it: a topic's own log (`SourceId::FIRST`) or
    /// one of its other publish sources, whose message ids and ack ids name `source`.
    pub async fn attach_topic(
        &self,
        topic_id: TopicId,
        name: String,
        retention_seconds: u64,
        recovering: bool,
        (source, active): (SourceId, u32),
    ) -> Result<ControlOk, Status> {
        if let Some(topic) = self.registry.topics_by_id.borrow().get(&topic_id) {
            // Another unit under the same id: a router that allocated it from a catalog not
            // yet applied to its end (a new catalog leader) attaches before it commits, and on
            // the commit's refusal detaches, deleting the files, which would be that unit's.
            if *topic.name != *name || topic.source != source {
                return Err(Status::already_exists(format!(
                    "unit {topic_id:x} on shard {} is source {} of topic '{}', not source {} of '{name}'",
                    self.shard,
                    topic.source.get(),
                    topic.name,
                    source.get()
                )));
            }
            // Attached already (a retried attach): the count is the catalog's, as a change's.
            topic.apply_active_sources(active);
            return Ok(ControlOk::Done);
        }
        // Counted at attach: topics deleted later do not hand their place to later ones.
        let keep_files_open = self.registry.topics_by_id.borrow().len()
            + self.attach_policy.topics_attaching.get()
            < self.attach_policy.journals_open_max.get();
        self.attach_policy.topics_attaching.set(self.attach_policy.topics_attaching.get() + 1);
        let result =
            self.store.open(topic_id, name.clone(), retention_seconds, keep_files_open, recovering).await;
        self.attach_policy.topics_attaching.set(self.attach_policy.topics_attaching.get() - 1);
        match result {
            Err(error) if recovering && error.is_damage() && self.attach_policy.quarantine_damaged.get() => {
                let why = Status::from(error).message;
                crate::log_error!(
                    "ringpostd: ERROR: topic '{name}' is quarantined: {why}; it and its subscriptions answer DataLoss, \
                     its files are left as they are (deleting the topic removes them)"
                );
                let (name, why): (Rc<str>, Rc<str>) = (name.into(), why.into());
                let mut quarantined = self.registry.quarantined.borrow_mut();
                quarantined.topic_names.insert(name.clone(), why.clone());
                quarantined.topics.insert(topic_id, (name, why));
                Ok(ControlOk::Done)
            }
            Err(error) => Err(error.into()),
            Ok(mut topic) => {
                topic.source = source;
                // Before it is served: its first publish is checked against its topic's count.
                topic.apply_active_sources(active);
                let topic = Rc::new(topic);
                self.registry.topics.borrow_mut().insert(topic.name.clone(), topic.clone());
                self.registry.topics_by_id.borrow_mut().insert(topic_id, topic);
                Ok(ControlOk::Done)
            }
        }
    }

    pub async fn attach_subscription(
        &self,
        subscription_id: u64,
        name: String,
        topic_id: TopicId,
        settings: SubscriptionSettings,
        create: bool,
        start_offset: u64,
    ) -> Result<ControlOk, Status> {
        let quarantined = self.registry.quarantined.borrow().topics.get(&topic_id).cloned();
        if let Some((topic_name, why)) = quarantined {
            if create {
                return Err(quarantined_status("topic", &topic_name, &why));
            }
            self.registry.quarantined.borrow_mut().subscriptions.insert(name.into(), (topic_id, why));
            return Ok(ControlOk::Done);
        }
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
            Status::internal(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
        })?;
        // Attached already (a replicated topic's new leader is given its subscriptions by
        // whichever router gets there first): once is enough.
        let subscription_id = SubscriptionId::new(subscription_id);
        let attached =
            self.registry.subscriptions.borrow().get(name.as_str()).map(|(entry, _)| entry.clone());
        if let Some(entry) = attached.filter(|entry| entry.id == subscription_id && !create) {
            return Ok(ControlOk::SubscriptionStart(entry.state.borrow().start_offset.get()));
        }
        let ack_deadline = Duration::from_secs(settings.ack_deadline_seconds as u64);
        let mut state = if create {
            // The sync point: every publish acknowledged after the router answers the create
            // has an offset at or above the durable end now, because offsets are assigned at
            // commit. The router records it in the catalog before it answers, so an idle topic
            // needs no journal (and no open journal file) for its subscriptions.
            SubscriptionState::new(subscription_id, topic.log.end_offset(), ack_deadline)
        } else {
            let state = SubscriptionState::new(subscription_id, Offset::new(start_offset), ack_deadline);
            let recovered = topic.journal.with_open(|open| open.recovered.remove(&subscription_id));
            let clock = &self.environment.clock;
            recovered_state(state, recovered.flatten().unwrap_or_default(), clock.now(), clock.wall_ms())
        };
        state.source = topic.source;
        // Held by its source's delivery gate from the start, until the catalog's leader says
        // it passed the change (a restart redelivers what it held, to be held again).
        state.set_gate(topic.gate_of(subscription_id.get()));
        state.set_ack_deadline(ack_deadline);
        state.policy = delivery_policy(&settings);
        state.forget_before(topic.log.start_offset());
        state.count_in(topic.outstanding.clone());
        let start = state.start_offset;
        let filter = if settings.filter.is_empty() {
            None
        } else {
            Some(Box::new(Filter::parse(&settings.filter).map_err(|error| {
                Status::invalid_argument(format!("filter of subscription '{name}': {error}"))
            })?))
        };
        let name: Rc<str> = name.into();
        let now_ms = self.environment.clock.wall_ms();
        let entry = Rc::new(SubscriptionEntry::new(name.clone(), topic_id, &settings, state, filter, now_ms));
        topic.subscriptions.borrow_mut().push(entry.clone());
        self.registry.subscriptions.borrow_mut().insert(name, (entry.clone(), topic));
        self.pushing.offer(&entry);
        Ok(ControlOk::SubscriptionStart(start.get()))
    }
}
