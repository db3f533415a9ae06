//! Dead letters: messages that used up their delivery attempts are published to the
//! subscription's dead-letter topic, wherever it is served, through an internal publisher,
//! and only once durable there acknowledged on the subscription, durably too. A failure is
//! tried again after `DEAD_LETTER_RETRY`; until then the messages stay leased to no one.

use super::journal_entry::{runs_of, JournalEntry};
use super::source::{AckJournal, MessageSource};
use super::{Environment, SubscriptionEntry};
use crate::api::data::{Attributes, DataError, MessageView, PublishBatch};
use crate::api::limits::PUBLISH_BATCH_MESSAGES_MAX;
use crate::api::Status;
use crate::ids::Offset;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

/// Pause before dead-letter publishes that failed are tried again.
pub const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);
/// Messages of one dead-letter publish: half a publish's limit leaves room for the attributes
/// a dead letter gains.
pub const DEAD_LETTER_BATCH_MESSAGES_MAX: usize = PUBLISH_BATCH_MESSAGES_MAX / 2;
/// Attributes a dead-lettered message carries, named as Pub/Sub names them.
pub const DEAD_LETTER_SOURCE_SUBSCRIPTION: &str = "CloudPubSubDeadLetterSourceSubscription";
pub const DEAD_LETTER_SOURCE_DELIVERY_COUNT: &str = "CloudPubSubDeadLetterSourceDeliveryCount";
pub const DEAD_LETTER_SOURCE_MESSAGE_ID: &str = "CloudPubSubDeadLetterSourceMessageId";
pub const DEAD_LETTER_SOURCE_PUBLISH_TIME: &str = "CloudPubSubDeadLetterSourceTopicPublishTime";

/// A message on its way to a dead-letter topic: owned, as it may cross to another shard.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub data: Vec<u8>,
    pub attributes: Vec<(String, String)>,
    pub ordering_key: String,
}

/// A future of one shard.
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Publishes to a topic on whichever forwarder shard serves it.
pub trait Publisher {
    /// Resolves once `messages` are durable in `topic`.
    fn publish(&self, topic: Box<str>, messages: Vec<DeadLetter>) -> LocalFuture<'_, Result<(), Status>>;
}

/// Dead letters to one topic, as a publish.
pub struct DeadLetters {
    pub topic: Box<str>,
    pub messages: Vec<DeadLetter>,
}

impl Attributes for Vec<(String, String)> {
    fn count(&self) -> usize {
        self.len()
    }
    fn get(&self, index: usize) -> (&str, &str) {
        let (key, value) = &self[index];
        (key, value)
    }
}

impl PublishBatch for DeadLetters {
    fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = MessageView<'_>>),
    ) -> Result<(), DataError> {
        let mut messages = self.messages.iter().map(|message| MessageView {
            data: &message.data,
            attributes: &message.attributes,
            ordering_key: &message.ordering_key,
        });
        visit(&self.topic, &mut messages);
        Ok(())
    }

    /// Dead letters are forwarded as they were published, whatever the dead-letter topic's
    /// schema: refused, they would be retried forever.
    fn checked_against_schema(&self) -> bool {
        true
    }
}

/// Starts publishing the subscription's exhausted messages, as its own task, one at a time per
/// subscription.
pub fn start<T: MessageSource + AckJournal + 'static>(
    environment: &Environment,
    subscription: &Rc<SubscriptionEntry>,
    topic: &Rc<T>,
) {
    if !subscription.dead_letter_topic.is_some() || subscription.dead_lettering.get() {
        return;
    }
    let offsets = subscription.state.borrow_mut().take_dead_letters();
    if offsets.is_empty() {
        return;
    }
    subscription.dead_lettering.set(true);
    let publisher = environment.dead_letters.clone();
    let (subscription, topic) = (subscription.clone(), topic.clone());
    crate::runtime::spawn(async move {
        let result = dead_letter(&*publisher, &subscription, &*topic, &offsets).await;
        if let Err(error) = result {
            crate::log_warn!(
                "ringpostd: dead-lettering {} messages of subscription '{}' to '{}' failed, will retry: {error}",
                offsets.len(),
                subscription.name,
                subscription.dead_letter_topic.get().as_deref().unwrap_or_default()
            );
            crate::runtime::sleep(DEAD_LETTER_RETRY).await;
            let mut state = subscription.state.borrow_mut();
            for offset in offsets {
                state.return_dead_letter(offset);
            }
        }
        subscription.dead_lettering.set(false);
        subscription.changed.notify_all();
    })
    .detach();
}

async fn dead_letter<T: MessageSource + AckJournal>(
    publisher: &dyn Publisher,
    subscription: &SubscriptionEntry,
    topic: &T,
    offsets: &[Offset],
) -> Result<(), String> {
    // Read once: an update may change or remove the policy while the publish is under way.
    let Some(dead_letter_topic) = subscription.dead_letter_topic.get() else {
        return Err("the subscription no longer has a dead-letter policy".into());
    };
    let records = topic.read_offsets(offsets).await.map_err(|e| e.to_string())?;
    let mut messages: Vec<DeadLetter> = {
        let state = subscription.state.borrow();
        records
            .iter()
            .map(|record| {
                let mut attributes = record.attributes.clone();
                attributes.extend([
                    (DEAD_LETTER_SOURCE_SUBSCRIPTION.to_owned(), subscription.name.to_string()),
                    (DEAD_LETTER_SOURCE_DELIVERY_COUNT.to_owned(), state.attempts(record.offset).to_string()),
                    (DEAD_LETTER_SOURCE_MESSAGE_ID.to_owned(), record.offset.to_string()),
                    (DEAD_LETTER_SOURCE_PUBLISH_TIME.to_owned(), record.publish_time_ms.to_string()),
                ]);
                DeadLetter {
                    data: record.data.clone(),
                    attributes,
                    ordering_key: record.ordering_key.clone(),
                }
            })
            .collect()
    };
    while !messages.is_empty() {
        let rest = messages.split_off(messages.len().min(DEAD_LETTER_BATCH_MESSAGES_MAX));
        publisher
            .publish(Box::from(&*dead_letter_topic), messages)
            .await
            .map_err(|status| status.to_string())?;
        messages = rest;
    }
    // Published durably to the dead-letter topic: now acknowledge on the source, durably too.
    let mut done: Vec<Offset> = records.iter().map(|record| record.offset).collect();
    done.sort_unstable();
    let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&done) };
    topic.record(&entry).await.map_err(|e| e.to_string())?;
    let mut state = subscription.state.borrow_mut();
    state.dead_lettered_total += done.len() as u64;
    for offset in done {
        state.apply_ack(offset);
    }
    Ok(())
}
