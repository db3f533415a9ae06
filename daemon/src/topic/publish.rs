//! Appending a publish to its topic's log: the messages stay where the protocol received them
//! until their commit is built, and are encoded straight into its buffer.

use super::journal::JournalReserve;
use super::TopicState;
use crate::api::data::{MessageView, PublishBatch};
use crate::log::{record, EncodeRecords, LogError, Records};
use crate::storage::Storage;
use std::ops::Range;
use std::rc::Rc;

/// Bytes a message takes as a record in the log.
pub fn record_bytes(message: &MessageView<'_>) -> usize {
    record::record_bytes(
        message.data.len(),
        message.attributes().map(|(key, value)| (key.len(), value.len())),
        message.ordering_key.len(),
    )
}

/// A publish's messages, checked when they arrived, encoded as records when their commit is
/// built.
struct PublishRecords<B> {
    messages: B,
    publish_time_ms: u64,
    encoded_bytes: usize,
}

impl<B: PublishBatch> EncodeRecords for PublishRecords<B> {
    fn encoded_bytes(&self) -> usize {
        self.encoded_bytes
    }

    fn encode_into(&self, out: &mut [u8]) {
        let mut at = 0;
        self.messages
            .visit(&mut |_, messages| {
                for message in messages {
                    at += record::encode_record_into(
                        &mut out[at..],
                        self.publish_time_ms,
                        message.data,
                        &mut message.attributes(),
                        message.ordering_key,
                    );
                }
            })
            .expect("a publish's messages were read once when it arrived");
        debug_assert_eq!(at, out.len(), "encoded_bytes counts what encode_into writes");
    }

    fn newest_publish_ms(&self) -> u64 {
        self.publish_time_ms
    }
}

impl<S: Storage> TopicState<S> {
    /// Appends `count` checked messages taking `encoded_bytes` in the log; resolves with their
    /// message ids once they are durable.
    pub async fn append_messages(
        self: &Rc<Self>,
        messages: impl PublishBatch,
        count: u32,
        encoded_bytes: usize,
        publish_time_ms: u64,
    ) -> Result<Range<u64>, LogError> {
        crate::fail_stop::count_publish();
        let records = PublishRecords { messages, publish_time_ms, encoded_bytes };
        let (first, count) = self.log.append_records(Records::Deferred(Box::new(records)), count).await?;
        if !matches!(*self.replication.borrow(), super::Replication::Alone) {
            // Boxed: a publish's task on a topic with one replica stays as small as before.
            Box::pin(self.wait_replicated(&self.log, first + count as u64)).await?;
        }
        self.collect_after_roll(publish_time_ms);
        if self.journal_reserve.get() == JournalReserve::Untried && self.journal.opened().is_none() {
            // The topic now holds something to acknowledge: its journal reserves its space, in
            // the background (an allocation and two syncs).
            let topic = self.clone();
            crate::runtime::spawn(async move {
                match topic.reserve_journal_space().await {
                    // A full disk is logged once for its data directory (`log::directories::
                    // note_full`), not once for each of its topics; segment collection tries
                    // again once space may have come back.
                    Ok(()) | Err(LogError::NoSpace(_)) => {}
                    Err(error) => crate::log_warn!(
                        "ringpostd: reserving journal space for topic '{}': {error}",
                        topic.name
                    ),
                }
            })
            .detach();
        }
        // Message ids are unique over the topic: its source in their high bits (source 0's
        // ids are its offsets, as every topic's were). A source's offsets are consecutive, so
        // are its ids.
        let id = |offset: u64| crate::ids::MessageId::new(self.source, crate::ids::Offset::new(offset)).get();
        Ok(id(first.get())..id(first.get()) + count as u64)
    }

    /// After a publish whose commit rolled the topic's log: deletes what no one needs without
    /// waiting for the next sweep, in the background, so that the log's next roll finds a file
    /// to recycle (`LogConfig::recycle`). A topic without subscriptions that publishes a
    /// segment a second keeps overwriting the same two files instead of unlinking one each
    /// second and allocating the next.
    fn collect_after_roll(self: &Rc<Self>, now_ms: u64) {
        if !self.log.take_rolled() {
            return;
        }
        let topic = self.clone();
        crate::runtime::spawn(async move { topic.remove_unneeded_segments(now_ms).await }).detach();
    }
}
