//! What delivery needs of a subscription's topic, as traits, so that the subscription code
//! knows neither the log nor the storage under it: the messages (held in the batches they are
//! read into), and the journal where what subscribers did is made durable.

use crate::ids::Offset;
use crate::log::record::RecordView;
use crate::log::{LogError, StoredRecord};
use crate::subscription::journal_entry::JournalEntry;
use crate::sync::Notified;

/// A batch of messages held in memory as read, which a response may send from in place.
pub trait SourceBatch: AsRef<[u8]> + 'static {
    fn base_offset(&self) -> Offset;
    fn end_offset(&self) -> Offset;
    /// The records of the batch within `wanted`, read in place.
    fn records_in(&self, wanted: std::ops::Range<Offset>) -> Result<Vec<RecordView<'_>>, LogError>;
}

/// A topic's messages, as a subscription reads them.
#[allow(async_fn_in_trait)]
pub trait MessageSource {
    type Batch: SourceBatch;
    /// The topic's name, for messages to people.
    fn name(&self) -> &str;
    /// The offset the next durable message will have.
    fn end_offset(&self) -> Offset;
    /// Resolves at the next durable commit.
    fn committed(&self) -> Notified;
    /// The batches holding `offsets` (sorted), as far as `bytes_max` of records takes them,
    /// and how many of the offsets they cover.
    async fn hold_offsets(
        &self,
        offsets: &[Offset],
        bytes_max: usize,
    ) -> Result<(Vec<Self::Batch>, usize), LogError>;
    /// Copies of the records at `offsets` (sorted).
    async fn read_offsets(&self, offsets: &[Offset]) -> Result<Vec<StoredRecord>, LogError>;
    /// Whether messages may be delivered now: always, but on a replicated topic's leader that
    /// is not sure it still leads (its lease, `replication::source::Leader::may_serve`); then
    /// when to look again.
    fn may_deliver(&self, _now: std::time::Instant) -> Result<(), std::time::Instant> {
        Ok(())
    }
}

/// Where a topic's subscriptions record what their subscribers did.
#[allow(async_fn_in_trait)]
pub trait AckJournal {
    /// Makes `entry` durable.
    async fn record(&self, entry: &JournalEntry) -> Result<(), LogError>;
    /// Waits until every entry recorded so far is as durable as `record` makes one. A new
    /// leader of a replicated topic replays entries its predecessor wrote that no quorum may
    /// hold yet (they commit with its own epoch's first entry); an acknowledgement they already
    /// cover is confirmed only once they do.
    async fn settle(&self) -> Result<(), LogError>;
}
