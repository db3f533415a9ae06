//! Topics: the publish side. A topic is its message log and the lazily opened journal of what
//! its subscribers did; this module keeps both, appends publishes, and decides which segments
//! no one needs any more.

pub mod error;
pub mod journal;
pub mod message_log;
pub mod open;
pub mod publish;
pub mod rate;
pub mod retention;
pub mod schema;
pub mod sources;
#[cfg(test)]
mod tests;

use crate::ids::{Offset, TopicId};
use crate::log::record::RecordView;
use crate::log::{make_reserve, record, HeldBatch, Log, LogError, StoredRecord};
use crate::metrics::rate::RateWindow;
use crate::storage::Storage;
use crate::subscription::journal_entry::JournalEntry;
use crate::subscription::source::{AckJournal, MessageSource, SourceBatch};
use crate::subscription::SubscriptionEntry;
use crate::sync::{Notified, Notify};
pub use error::TopicError;
use journal::{JournalReserve, JournalSlot, LazyJournal};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

/// How often a deletion or a journal's first entry looks again whether the journal's reserve
/// is still being made (`TopicState::reserve_settled`).
const RESERVE_SETTLE_PAUSE: Duration = Duration::from_millis(5);

pub struct TopicState<S: Storage> {
    /// The unit's id: the topic's own, or one of its other sources' (`catalog::SourceRecord`).
    pub id: TopicId,
    /// Which of its topic's publish sources this log is: what its message ids
    /// (`MessageId::new(source, offset)`) and its subscriptions' ack ids name. Set at attach.
    pub source: crate::ids::SourceId,
    /// Shared with the key of the shard's map of topics by name.
    pub name: Rc<str>,
    /// Made on first use (`message_log`).
    pub log: message_log::MessageLog<S>,
    pub journal: LazyJournal<S>,
    pub subscriptions: RefCell<SubscriptionList>,
    /// Topic message retention; 0 when not set. A cell: an update changes it in place.
    pub retention_seconds: Cell<u64>,
    pub published: RateWindow,
    /// Messages and their bytes (as stored) published since this shard took the topic.
    pub published_messages_total: Cell<u64>,
    pub published_bytes_total: Cell<u64>,
    /// Whether the journal's reserve segment was made while the journal was closed (an open
    /// journal's log keeps track of its own): see `reserve_journal_space`.
    pub journal_reserve: Cell<JournalReserve>,
    /// Fires when a reserve stops being made (`JournalReserve::Making` ends).
    pub reserve_done: Notify,
    /// Deleted: its journal must not open (or be made) again while its files go.
    pub deleted: Cell<bool>,
    /// Its part in the topic's replication across nodes.
    pub replication: RefCell<Replication>,
    /// Messages and bytes its subscribers hold, delivered and not yet acknowledged, within its
    /// shard's (`subscription::outstanding`).
    pub outstanding: Rc<crate::subscription::outstanding::TopicOutstanding>,
    /// Its publish rate's token buckets (`rate`), within its shard's limits.
    pub publish_rate: RefCell<rate::TopicRate>,
    /// Its topic's key map as it last applied it, and the fence of that change (`sources`).
    pub sources: Cell<sources::SourceSet>,
    /// The delivery gate it was last told (`sources::UnitGate`): what its ordered
    /// subscriptions hold, from their attach on, until they pass the change. `None` until one
    /// is told (boxed: most sources are never told one, and an idle topic's memory is bounded).
    pub gate: RefCell<Option<Box<sources::UnitGate>>>,
    /// Its topic's schema, which its publishes are checked against (`schema`), as the router
    /// last pushed it; `None` for a topic without one.
    pub schema: RefCell<Option<Rc<schema::TopicSchemaCheck>>>,
}

/// A topic's subscriptions on this shard. Most topics have one, held here without an
/// allocation of its own: a vector of one took a 32-byte chunk per idle topic.
#[derive(Default)]
pub enum SubscriptionList {
    #[default]
    Empty,
    One(Rc<SubscriptionEntry>),
    Many(Vec<Rc<SubscriptionEntry>>),
}

impl std::ops::Deref for SubscriptionList {
    type Target = [Rc<SubscriptionEntry>];

    fn deref(&self) -> &[Rc<SubscriptionEntry>] {
        match self {
            SubscriptionList::Empty => &[],
            SubscriptionList::One(entry) => std::slice::from_ref(entry),
            SubscriptionList::Many(entries) => entries,
        }
    }
}

impl SubscriptionList {
    pub fn push(&mut self, entry: Rc<SubscriptionEntry>) {
        *self = match std::mem::take(self) {
            SubscriptionList::Empty => SubscriptionList::One(entry),
            SubscriptionList::One(first) => SubscriptionList::Many(vec![first, entry]),
            SubscriptionList::Many(mut entries) => {
                entries.push(entry);
                SubscriptionList::Many(entries)
            }
        };
    }

    pub fn into_vec(self) -> Vec<Rc<SubscriptionEntry>> {
        match self {
            SubscriptionList::Empty => Vec::new(),
            SubscriptionList::One(entry) => vec![entry],
            SubscriptionList::Many(entries) => entries,
        }
    }

    pub fn retain(&mut self, keep: impl FnMut(&Rc<SubscriptionEntry>) -> bool) {
        if matches!(self, SubscriptionList::Empty) {
            return;
        }
        let mut entries = std::mem::take(self).into_vec();
        entries.retain(keep);
        *self = match entries.len() {
            0 => SubscriptionList::Empty,
            1 => SubscriptionList::One(entries.pop().expect("one entry")),
            _ => SubscriptionList::Many(entries),
        };
    }
}

/// A topic's part in its replication across nodes (docs/REPLICATION.md).
pub enum Replication {
    /// Its only replica: a commit on ⌈M/2⌉ of this node's directories commits it.
    Alone,
    /// A follower: it takes records from the leader it last synced with (`synced_epoch`, 0
    /// for none yet) and serves no client.
    Follower { synced_epoch: crate::ids::Epoch },
    /// The leader of an epoch: it serves clients, and commits what a quorum of replicas holds.
    Leader(Rc<crate::replication::source::Leader>),
}

/// A topic's folder inside each data directory.
pub fn topic_folder(topic_id: TopicId) -> PathBuf {
    PathBuf::from("topics").join(format!("{topic_id:016x}"))
}

/// Where a topic's subscription journal lives, inside each data directory.
pub fn journal_folder(topic_id: TopicId) -> PathBuf {
    topic_folder(topic_id).join("journal")
}

impl<S: Storage> TopicState<S> {
    /// Makes sure the journal holds its reserve segment (`LogConfig::reserve`), so that
    /// acknowledgements can be recorded once the disk is full. Acknowledging is how a user frees
    /// disk space (segment collection then deletes what every subscription acknowledged): were
    /// an acknowledgement refused on a full disk because the journal needs a segment, nothing
    /// could ever be freed but by deleting a topic. A journal is opened only at its first entry
    /// (`LazyJournal`), so a closed one gets its reserve in its folder, which it adopts when it
    /// opens; an open one makes it again after a roll on a full disk took it. Made once the
    /// topic holds messages: a topic nobody published to has nothing to acknowledge, and
    /// 10,000 idle topics keep no reserve.
    pub async fn reserve_journal_space(&self) -> Result<(), LogError> {
        if self.deleted.get() {
            return Ok(());
        }
        if let Some(journal) = self.journal.opened() {
            return journal.retake_reserve().await;
        }
        // Made, or being made by another task: two `make_reserve` on one folder would each
        // create and rename the other's `RESERVE_MAKING_NAME` (one of them then opened a file
        // whose name had just gone, and glommio's open panicked on it). The task making it
        // reports its outcome; segment collection asks again if it failed.
        if matches!(self.journal_reserve.get(), JournalReserve::Made | JournalReserve::Making)
            || !matches!(*self.journal.log.borrow(), JournalSlot::Closed)
        {
            return Ok(());
        }
        // Set before the wait: a second caller meanwhile does not make it twice, and the
        // journal does not open under it.
        self.journal_reserve.set(JournalReserve::Making);
        let made = make_reserve(
            self.log.storage(),
            self.log.directories(),
            &journal_folder(self.id),
            self.journal.config.segment_bytes_initial,
        )
        .await;
        self.journal_reserve.set(if made.is_ok() { JournalReserve::Made } else { JournalReserve::Failed });
        self.reserve_done.notify_all();
        made
    }

    /// Waits while the journal's reserve is being made in its folder. Opening the journal
    /// meanwhile would remove the file being made as a leftover, and deleting the topic would
    /// remove its folder; either fails the open underneath (glommio's DMA open then panics on
    /// the vanished path).
    pub async fn reserve_settled(&self) {
        loop {
            let done = self.reserve_done.notified();
            let making = self.journal_reserve.get() == JournalReserve::Making
                || self.journal.opened().is_some_and(|journal| journal.is_reserving());
            if !making {
                return;
            }
            // An open journal's own reserve sets no notifier: look again shortly.
            futures_lite::future::or(done, crate::runtime::sleep(RESERVE_SETTLE_PAUSE)).await;
        }
    }

    /// The journal's log, opened if it is not yet: the one way to open it. It waits while the
    /// journal's reserve is being made in its folder (the journal's recovery would remove the
    /// file being made as a leftover), and a deleted topic's journal is not opened (or made)
    /// again.
    pub async fn journal_log(&self) -> Result<Log<S>, LogError> {
        loop {
            if let Some(journal) = self.journal.opened() {
                return Ok(journal);
            }
            self.reserve_settled().await;
            if self.deleted.get() {
                return Err(LogError::Fenced("the topic was deleted".into()));
            }
            // Another task opening it: wait for it, then look again (its open may have failed,
            // and a reserve may have started meanwhile).
            let opened = self.journal.opened.notified();
            if !matches!(*self.journal.log.borrow(), JournalSlot::Opening) {
                break;
            }
            opened.await;
        }
        // No await between the checks above and the slot turning `Opening` inside `log`: a
        // reserve cannot start in between (`reserve_journal_space` makes one only while the
        // slot is `Closed`).
        self.journal.log(&self.log, self.id).await
    }

    /// Makes one journal entry durable, opening the journal first if it is not yet.
    pub async fn append_journal(&self, entry: &JournalEntry) -> Result<(), LogError> {
        let bytes = entry.encode();
        let mut records = Vec::with_capacity(bytes.len() + record::RECORD_HEADER_BYTES + 8);
        record::encode_record_unsealed(&mut records, 0, &bytes, &mut std::iter::empty(), "");
        if self.deleted.get() {
            return Err(LogError::Fenced("the topic was deleted".into()));
        }
        let journal = self.journal_log().await?;
        let (first, count) = journal.append(records, 1).await?;
        self.wait_replicated(&journal, first + count as u64).await
    }

    /// The leader of a replicated topic, when this replica leads it.
    pub fn leader(&self) -> Option<Rc<crate::replication::source::Leader>> {
        match &*self.replication.borrow() {
            Replication::Leader(leader) => Some(leader.clone()),
            _ => None,
        }
    }

    /// Waits, on a replicated topic's leader, until a quorum of replicas holds `log` (its
    /// messages or journal) below `end`; at once otherwise.
    pub async fn wait_replicated(&self, log: &Log<S>, end: Offset) -> Result<(), LogError> {
        match self.leader() {
            Some(leader) => leader.wait_committed(log, end).await,
            None if matches!(*self.replication.borrow(), Replication::Follower { .. }) => {
                Err(LogError::Deposed { led: None })
            }
            None => Ok(()),
        }
    }

    /// The offset below which every replica holds `log` (`protocol::MESSAGES` or `JOURNAL`):
    /// a leader's retention removes nothing a follower still needs.
    pub fn replicated_floor(&self, log: usize) -> Offset {
        self.leader().map_or(Offset::new(u64::MAX), |leader| leader.replicated_floor(log))
    }
}

impl<S: Storage> SourceBatch for HeldBatch<S> {
    fn base_offset(&self) -> Offset {
        HeldBatch::base_offset(self)
    }
    fn end_offset(&self) -> Offset {
        HeldBatch::end_offset(self)
    }
    fn records_in(&self, wanted: std::ops::Range<Offset>) -> Result<Vec<RecordView<'_>>, LogError> {
        HeldBatch::records_in(self, wanted)
    }
}

impl<S: Storage> MessageSource for TopicState<S> {
    type Batch = HeldBatch<S>;
    fn name(&self) -> &str {
        &self.name
    }
    fn end_offset(&self) -> Offset {
        self.log.end_offset()
    }
    fn committed(&self) -> Notified {
        self.log.committed()
    }
    async fn hold_offsets(
        &self,
        offsets: &[Offset],
        bytes_max: usize,
    ) -> Result<(Vec<HeldBatch<S>>, usize), LogError> {
        self.log.hold_offsets(offsets, bytes_max).await
    }
    async fn read_offsets(&self, offsets: &[Offset]) -> Result<Vec<StoredRecord>, LogError> {
        self.log.read_offsets(offsets).await
    }
    fn may_deliver(&self, now: std::time::Instant) -> Result<(), std::time::Instant> {
        match &*self.replication.borrow() {
            Replication::Alone => Ok(()),
            Replication::Leader(leader) => leader.may_serve(now),
            // Not served; a pull that got here raced a demotion.
            Replication::Follower { .. } => Err(now + crate::replication::source::LEASE_RETRY),
        }
    }
}

impl<S: Storage> AckJournal for TopicState<S> {
    async fn record(&self, entry: &JournalEntry) -> Result<(), LogError> {
        self.append_journal(entry).await
    }

    async fn settle(&self) -> Result<(), LogError> {
        let Some(journal) = self.journal.opened() else { return Ok(()) };
        let end = journal.next_offset();
        self.wait_replicated(&journal, end).await
    }
}
#[cfg(test)]
mod sizes {
    /// What an idle topic and its subscription hold on their forwarder is mostly these two
    /// structs, each in its own allocation (W4's memory figure, benches/README.md). A field
    /// that grows them is a cost over 10,000 idle topics: measure it there before raising the
    /// bound.
    #[test]
    fn an_idle_topic_and_its_subscription_keep_their_size() {
        type S = crate::storage::dma::DmaStorage;
        let topic = std::mem::size_of::<super::TopicState<S>>();
        let subscription = std::mem::size_of::<crate::subscription::SubscriptionEntry>();
        assert!(topic <= 296, "TopicState is {topic} bytes");
        assert!(subscription <= 328, "SubscriptionEntry is {subscription} bytes");
    }
}
