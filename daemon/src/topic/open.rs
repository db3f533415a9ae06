//! Where a shard's topics are kept: the storage and data directories, and the logs'
//! configurations. Opens (recovers or creates) a topic's logs, and removes a deleted topic's
//! files.

use super::journal::{JournalReserve, JournalSlot, LazyJournal, OpenJournal, SnapshotState};
use super::message_log::{MessageLog, MessageLogs};
use super::{journal_folder, topic_folder, TopicError, TopicState};
use crate::ids::{Offset, TopicId};
use crate::log::{Directories, Log, LogConfig, LogError, RecoveryReport};
use crate::storage::Storage;
use crate::subscription::journal_entry::{journal_log_id, messages_log_id, JournalEntry};
use crate::subscription::outstanding::{OutstandingLimits, ShardOutstanding, TopicOutstanding};
use crate::subscription::state::IdHasher;
use crate::sync::Notify;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

/// What a shard opens its topics with: shared by every topic of the shard.
pub struct TopicStore<S: Storage> {
    pub storage: S,
    pub directories: Rc<Directories>,
    /// Where the message logs go, with their configuration; and the journals' configurations
    /// (with their files kept open between commits, and closed). Each shared by every topic of
    /// the shard.
    pub messages: Rc<MessageLogs<S>>,
    pub journal_configs: [Rc<LogConfig>; 2],
    /// Fires when a topic's journal finishes opening (see `LazyJournal`).
    pub journal_opened: Notify,
    /// The shard's count of messages delivered and not yet acknowledged, which each topic's
    /// own count is part of (`subscription::outstanding`).
    pub outstanding: Rc<ShardOutstanding>,
    /// Every topic's publish rate limits, and the publishes the shard holds back
    /// (`topic::rate`).
    pub publish_rate: Rc<super::rate::ShardPublishRate>,
}

impl<S: Storage> TopicStore<S> {
    pub fn new(storage: S, directories: Rc<Directories>, log_config: LogConfig) -> TopicStore<S> {
        let messages = Rc::new(MessageLogs {
            storage: storage.clone(),
            directories: directories.clone(),
            config: Rc::new(log_config.clone()),
        });
        TopicStore {
            storage,
            directories,
            journal_configs: [true, false].map(|keep_files_open| {
                Rc::new(LogConfig {
                    segment_bytes_initial: 256 * 1024,
                    segment_bytes_max: super::journal::JOURNAL_SEGMENT_BYTES_MAX
                        .min(log_config.segment_bytes_max),
                    // The journal is read only at recovery: keeping its last commits in memory
                    // would cost every idle topic a few KiB for nothing.
                    tail_cache_bytes_max: 0,
                    keep_files_open,
                    // Read once, at recovery; extents kept after it would hold the shard's
                    // cache budget for good.
                    read_ahead: false,
                    // Small segments, deleted by compaction only: not worth a kept file.
                    recycle: false,
                    // Acknowledgements must be recorded on a full disk: see
                    // `TopicState::reserve_journal_space`.
                    reserve: true,
                    ..log_config.clone()
                })
            }),
            messages,
            journal_opened: Notify::new(),
            outstanding: ShardOutstanding::new(OutstandingLimits::default()),
            publish_rate: super::rate::ShardPublishRate::new(),
        }
    }

    pub async fn open(
        &self,
        topic_id: TopicId,
        name: String,
        retention_seconds: u64,
        keep_files_open: bool,
        recovering: bool,
    ) -> Result<TopicState<S>, TopicError> {
        let relative = topic_folder(topic_id);
        // Both folders of the topic in every data directory, in one go: their parents are then
        // synced once each (three syncs a topic when each log made its own).
        let folders: Vec<std::path::PathBuf> = (0..self.directories.count())
            .flat_map(|copy| {
                let directory = self.directories.path(copy);
                [directory.join(relative.join("messages")), directory.join(journal_folder(topic_id))]
            })
            .collect();
        if recovering {
            // Their metadata is read from disk while the shard goes on (the checks below and
            // the logs' listings then find it cached): read on the shard's own thread, one
            // topic's after another's, they were 15% of a cold start's samples.
            self.storage.prefetch_dirs(&folders).await;
        } else {
            self.check_room(&name)?;
        }
        let opened = self.open_logs(topic_id, &name, retention_seconds, keep_files_open, &folders).await;
        if opened.is_err() && !recovering {
            // The router records nothing of a topic whose attach failed: what was made of it
            // goes, or it would stay behind until the next start.
            for copy in 0..self.directories.count() {
                let folder = self.directories.path(copy).join(&relative);
                if self.storage.exists(&folder) {
                    let _ = self.storage.remove_dir_all(&folder);
                }
            }
        }
        opened
    }

    /// Refuses a new topic where fewer than ⌈M/2⌉ data directories have room for its first
    /// segment and its journal's reserve: on a full disk a topic could be made (folders take
    /// only a few blocks) but could take no publish, so the user learns it at the create, with
    /// `ResourceExhausted`, as a publish would tell it.
    fn check_room(&self, name: &str) -> Result<(), TopicError> {
        let needed_bytes =
            self.messages.config.segment_bytes_initial + self.journal_configs[0].segment_bytes_initial;
        let free: Vec<(usize, u64)> = (0..self.directories.count())
            .filter(|copy| !self.directories.is_fenced(*copy))
            .map(|copy| (copy, self.storage.free_bytes(self.directories.path(copy)).unwrap_or(u64::MAX)))
            .collect();
        if free.iter().filter(|(_, bytes)| *bytes >= needed_bytes).count() >= self.directories.quorum() {
            return Ok(());
        }
        let (copy, bytes) = free.iter().copied().min_by_key(|(_, bytes)| *bytes).unwrap_or((0, 0));
        Err(TopicError::NoRoom {
            topic: name.to_owned(),
            directory: self.directories.path(copy).to_owned(),
            available_bytes: bytes,
            needed_bytes,
        })
    }

    /// The rest of `open_topic`: the folders, both logs, and what the journal recovered.
    async fn open_logs(
        &self,
        topic_id: TopicId,
        name: &str,
        retention_seconds: u64,
        keep_files_open: bool,
        folders: &[PathBuf],
    ) -> Result<TopicState<S>, TopicError> {
        self.storage.create_dirs_durable(folders).await.map_err(|error| {
            let what = format!("topic '{name}': making its folders");
            if crate::log::is_no_space(&error) {
                failed(what, LogError::NoSpace(error.to_string()))
            } else {
                failed(what, LogError::Io(error.to_string()))
            }
        })?;
        let journal_config = self.journal_configs[usize::from(!keep_files_open)].clone();
        let (log, slot) = self.open_found_logs(topic_id, name, journal_config.clone()).await?;
        let journal = LazyJournal {
            log: RefCell::new(slot),
            config: journal_config,
            opened: self.journal_opened.clone(),
        };
        Ok(TopicState {
            id: topic_id,
            source: crate::ids::SourceId::FIRST,
            name: name.into(),
            log,
            journal,
            subscriptions: RefCell::default(),
            retention_seconds: Cell::new(retention_seconds),
            published: crate::metrics::rate::RateWindow::default(),
            published_messages_total: Cell::new(0),
            published_bytes_total: Cell::new(0),
            journal_reserve: Cell::new(JournalReserve::Untried),
            reserve_done: Notify::new(),
            deleted: Cell::new(false),
            replication: RefCell::new(super::Replication::Alone),
            outstanding: TopicOutstanding::new(&self.outstanding),
            publish_rate: RefCell::default(),
            sources: Cell::default(),
            gate: Default::default(),
            schema: RefCell::default(),
        })
    }

    /// A topic's logs as found on disk (a new topic's folders are empty): a message log of
    /// which nothing is on disk (`Log::is_pristine`; not one that only recorded a promise, say)
    /// is dropped, to be made again on first use (`MessageLog`), and so is an empty journal.
    async fn open_found_logs(
        &self,
        topic_id: TopicId,
        name: &str,
        journal_config: Rc<LogConfig>,
    ) -> Result<(MessageLog<S>, JournalSlot<S>), TopicError> {
        let messages = &self.messages;
        let (log, report) = Log::open(
            self.storage.clone(),
            self.directories.clone(),
            &topic_folder(topic_id).join("messages"),
            messages_log_id(topic_id),
            messages.config.clone(),
        )
        .await
        .map_err(|error| failed(format!("topic '{name}'"), error))?;
        report_recovery(name, "messages", &report);
        let log = if log.is_pristine() && report.copies_fenced.is_empty() {
            MessageLog::empty(messages.clone(), topic_id)
        } else {
            MessageLog::opened(log, messages.clone(), topic_id)
        };
        let (journal, report) = Log::open(
            self.storage.clone(),
            self.directories.clone(),
            &journal_folder(topic_id),
            journal_log_id(topic_id),
            journal_config,
        )
        .await
        .map_err(|error| failed(format!("topic '{name}' journal"), error))?;
        report_recovery(name, "journal", &report);
        let (recovered, snapshots) = replay_journal(&journal, name).await?;
        // An empty journal is opened again when a subscriber first acknowledges something.
        let slot = if journal.is_empty() {
            JournalSlot::Closed
        } else {
            let mut open = OpenJournal::new(journal);
            open.recovered = recovered;
            open.snapshots = snapshots;
            JournalSlot::Open(open)
        };
        Ok((log, slot))
    }

    /// Removes a detached topic's files, in the background: its closed segments first, through
    /// the log, which shrinks each in steps (a deleted topic of many gigabytes, unlinked at
    /// once, would have the device trim all of it while every other topic's syncs wait), then
    /// its folders. The deletion is durable in the catalog already: a crash midway leaves a
    /// folder the catalog no longer names, which the router removes at the next start.
    pub fn delete_files(&self, topic: Rc<TopicState<S>>) {
        let (storage, directories) = (self.storage.clone(), self.directories.clone());
        topic.deleted.set(true);
        crate::runtime::spawn(async move {
            // Publishes and acknowledgements still in flight finish first: a commit meeting a
            // vanished file would fence the data directory for every topic of the shard.
            topic.log.close_for_removal().await;
            topic.reserve_settled().await;
            if let Some(journal) = topic.journal.opened() {
                journal.close_for_removal().await;
                journal.discard_spares().await;
            }
            topic.log.discard_spares().await;
            let closed = topic.log.closed_segments().len();
            if let Err(error) = topic.log.remove_oldest(closed).await {
                crate::log_warn!("ringpostd: deleting the segments of topic '{}': {error}", topic.name);
            }
            for copy in 0..directories.count() {
                let folder = directories.path(copy).join(topic_folder(topic.id));
                if storage.exists(&folder) {
                    if let Err(error) = storage.remove_dir_all(&folder) {
                        crate::log_warn!("ringpostd: removing {}: {error}", folder.display());
                    }
                }
            }
        })
        .detach();
    }
}

impl<S: Storage> TopicState<S> {
    /// Replays the journal again into what subscriptions attached from now on rebuild their
    /// state from (and the topic's snapshots): for a replica that becomes its topic's leader,
    /// whose journal took entries as a follower that no subscription here applied.
    pub async fn replay_journal_again(&self) -> Result<(), TopicError> {
        let Some(journal) = self.journal.opened() else { return Ok(()) };
        let (recovered, snapshots) = replay_journal(&journal, &self.name).await?;
        self.journal.with_open(|open| {
            open.recovered = recovered;
            open.snapshots = snapshots;
        });
        Ok(())
    }
}

/// Each subscription's acknowledgements and seeks, in order, applied when the router attaches
/// it with the sync point the catalog recorded; and the topic's live snapshots.
#[allow(clippy::type_complexity)]
/// Out of space, quota or descriptors says nothing about the data: `ResourceExhausted`, to
/// retry once the resource is back. Anything else failing to open a topic is `DataLoss`.
fn failed(what: String, error: LogError) -> TopicError {
    match error {
        LogError::NoSpace(why) => TopicError::NoSpace { what, why },
        error => TopicError::Damaged { what, error },
    }
}

async fn replay_journal<S: Storage>(
    journal: &Log<S>,
    name: &str,
) -> Result<
    (
        HashMap<crate::ids::SubscriptionId, Vec<JournalEntry>, IdHasher>,
        HashMap<crate::ids::SnapshotId, SnapshotState, IdHasher>,
    ),
    TopicError,
> {
    let mut recovered: HashMap<crate::ids::SubscriptionId, Vec<JournalEntry>, IdHasher> = HashMap::default();
    let mut snapshots: HashMap<crate::ids::SnapshotId, SnapshotState, IdHasher> = HashMap::default();
    for stored in journal.read_all(Offset::ZERO).await? {
        let entry = JournalEntry::decode(&stored.data).map_err(|why| TopicError::JournalEntry {
            topic: name.to_owned(),
            offset: stored.offset,
            why: why.to_string(),
        })?;
        match entry {
            // The sync point lives in the catalog; checkpoints restate it for reference. A
            // leader's epoch changes no subscription.
            JournalEntry::SubscriptionCreated { .. } | JournalEntry::LeaderEpoch { .. } => {}
            JournalEntry::SubscriptionDeleted { subscription_id } => {
                recovered.remove(&subscription_id);
            }
            JournalEntry::Seek { subscription_id, .. }
            | JournalEntry::Acked { subscription_id, .. }
            | JournalEntry::DeadlineExtended { subscription_id, .. } => {
                recovered.entry(subscription_id).or_default().push(entry);
            }
            JournalEntry::SnapshotTaken { snapshot_id, floor, runs, expire_time_ms } => {
                snapshots.insert(snapshot_id, SnapshotState { floor, runs, expire_time_ms });
            }
            JournalEntry::SnapshotDropped { snapshot_id } => {
                snapshots.remove(&snapshot_id);
            }
        }
    }
    Ok((recovered, snapshots))
}

fn report_recovery(topic: &str, what: &str, report: &RecoveryReport) {
    if let Some((path, position)) = &report.torn_at {
        crate::log_info!(
            "ringpostd: recovery of topic '{topic}' {what}: cut a torn tail at byte {position} of {} ({} bytes discarded; \
             they were never acknowledged)",
            path.display(),
            report.torn_bytes_discarded
        );
    }
    if report.batches_repaired > 0 {
        crate::log_info!(
            "ringpostd: recovery of topic '{topic}' {what}: repaired {} batch copies from healthy data directories",
            report.batches_repaired
        );
    }
    if report.empty_segments_removed > 0 {
        crate::log_info!(
            "ringpostd: recovery of topic '{topic}' {what}: removed {} empty segment(s) created before a crash",
            report.empty_segments_removed
        );
    }
}
