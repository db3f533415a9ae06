//! The data plane a forwarder shard serves (`api::data::DataPlane`): each operation finds its
//! topic or subscription here and runs in `topic` or `subscription`.

use super::Forwarder;
use crate::api::data::{
    check_ack_deadline_change, check_ack_id_count, check_publish, DataError, DataPlane, Delivery,
    InvalidAckId, PublishBatch, PullSettings, StreamPeer, StreamSettings,
};
use crate::log::{HeldBatch, LogError};
use crate::storage::Storage;
use crate::subscription::pull::Stream;
use crate::subscription::{acknowledge, pull};
use crate::topic::publish::record_bytes;
use crate::topic::rate::Admission;
use crate::topic::TopicState;
use std::ops::Range;
use std::rc::Rc;

impl<S: Storage> DataPlane for Forwarder<S> {
    type Batch = HeldBatch<S>;
    type Stream<'a> = Stream<'a, TopicState<S>>;

    async fn publish(&self, messages: impl PublishBatch) -> Result<Range<u64>, DataError> {
        let started = crate::runtime::now();
        // The refusal of an empty request is made only when there is one: not a string
        // allocated on every publish.
        let mut checked = None;
        messages.visit(&mut |topic, views| {
            let count = views.len() as u32;
            checked = Some(
                check_publish(topic, views, record_bytes)
                    .and_then(|encoded_bytes| Ok((self.topic(topic)?, count, encoded_bytes))),
            );
        })?;
        let (topic, count, encoded_bytes) = checked
            .unwrap_or_else(|| Err(DataError::InvalidArgument("publish request has no messages".into())))?;
        // A topic without a schema pays this one check. One with a schema has every message
        // checked before any is appended (`topic::schema`), and the checked batch, Pub/Sub's
        // attributes added, is published as any other: they count within the request's limits
        // and in its records' size, as when gRPC's gateway adds them.
        if !messages.checked_against_schema() {
            let schema = topic.schema.borrow().clone();
            if let Some(schema) = schema {
                // Boxed: a publish's task on a topic without a schema stays as small as before.
                return Box::pin(self.publish(schema.check(messages)?)).await;
            }
        }
        self.within_publish_rate(&topic, count, encoded_bytes).await?;
        // After the last wait: the key check and the offsets' assignment (the append's first
        // step) happen in one step of the shard, which a change of the topic's source set
        // relies on (`topic::sources`).
        topic.check_key_owner(&messages)?;
        let publish_time_ms = self.environment.clock.wall_ms();
        let ids = topic.append_messages(messages, count, encoded_bytes, publish_time_ms).await.map_err(
            |error| {
                if matches!(error, LogError::NoSpace(_)) {
                    self.release_kept_files();
                }
                DataError::from(error)
            },
        )?;
        crate::metrics::latency::record_publish(started);
        topic.published_messages_total.set(topic.published_messages_total.get() + count as u64);
        topic.published_bytes_total.set(topic.published_bytes_total.get() + encoded_bytes as u64);
        Ok(ids)
    }

    async fn pull(
        &self,
        subscription: &str,
        settings: PullSettings,
    ) -> Result<Option<Delivery<HeldBatch<S>>>, DataError> {
        let (subscription, topic) = self.subscription(subscription)?;
        Ok(pull::pull(&self.environment, &subscription, &topic, settings, &pull::NeverGone).await?)
    }

    async fn pull_for_peer(
        &self,
        subscription: &str,
        settings: PullSettings,
        peer: &impl StreamPeer,
    ) -> Result<Option<Delivery<HeldBatch<S>>>, DataError> {
        let (subscription, topic) = self.subscription(subscription)?;
        Ok(pull::pull(&self.environment, &subscription, &topic, settings, peer).await?)
    }

    async fn open_stream(
        &self,
        subscription: &str,
        settings: StreamSettings,
    ) -> Result<Self::Stream<'_>, DataError> {
        let (subscription, topic) = self.subscription(subscription)?;
        Ok(Stream::open(&self.environment, subscription, topic, settings))
    }

    async fn acknowledge<'a>(
        &self,
        subscription: &str,
        ack_ids: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<Vec<InvalidAckId>, DataError> {
        check_ack_id_count(ack_ids.len())?;
        let (subscription, topic) = self.subscription(subscription)?;
        Ok(acknowledge::acknowledge(&self.environment, &subscription, &*topic, ack_ids).await?)
    }

    async fn modify_ack_deadline<'a>(
        &self,
        subscription: &str,
        ack_ids: impl ExactSizeIterator<Item = &'a str> + Clone,
        seconds: u32,
    ) -> Result<Vec<InvalidAckId>, DataError> {
        check_ack_id_count(ack_ids.len())?;
        check_ack_deadline_change(seconds)?;
        let (subscription, topic): (_, Rc<TopicState<S>>) = self.subscription(subscription)?;
        Ok(acknowledge::modify_ack_deadline(&self.environment, &subscription, &topic, ack_ids, seconds)
            .await?)
    }
}

impl<S: Storage> Forwarder<S> {
    /// The topic's publish rate (`topic::rate`), the one place a publish is slowed or refused
    /// for it: within the rate it goes on at once; over it, it is held on the shard (its bytes
    /// counted) for at most `PUBLISH_HOLD_MAX`, or refused with the delay to retry after.
    async fn within_publish_rate(
        &self,
        topic: &TopicState<S>,
        count: u32,
        bytes: usize,
    ) -> Result<(), DataError> {
        let shard = &self.store.publish_rate;
        if !shard.is_limited() {
            return Ok(());
        }
        let now = self.environment.clock.now();
        let active = topic.sources.get().active;
        match shard.admit(&topic.publish_rate, active, count as u64, bytes as u64, now) {
            Admission::Now => Ok(()),
            Admission::Held(wait) => {
                let _held = shard.hold(bytes);
                crate::runtime::sleep(wait).await;
                Ok(())
            }
            Admission::Refused { retry_after, limit } => Err(DataError::Throttled {
                topic: topic.name.as_ref().into(),
                limit: limit_flag(limit),
                retry_after,
            }),
        }
    }
}

/// The flag that sets a publish limit, as a refusal names it.
fn limit_flag(limit: &str) -> &'static str {
    match limit {
        "PUBLISH_MESSAGES_PER_SECOND" => "--publish-messages-per-second-topic-max",
        "PUBLISH_BYTES_PER_SECOND" => "--publish-kib-per-second-topic-max",
        _ => "PUBLISH_HELD_BYTES_SHARD_MAX, publishes held back on the shard",
    }
}
