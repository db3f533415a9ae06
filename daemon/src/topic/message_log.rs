//! A topic's message log, made on its first use rather than with the topic: an idle topic
//! (created, never published to) then carries no log state at all. Made, a log's state is about
//! 400 bytes, a fifth of an idle topic's whole cost when a shard holds thousands of them.

use super::topic_folder;
use crate::ids::{Offset, TopicId};
use crate::log::{Directories, Log, LogConfig, SegmentInfo};
use crate::storage::Storage;
use crate::subscription::journal_entry::messages_log_id;
use std::cell::OnceCell;
use std::ops::Deref;
use std::rc::Rc;

/// Where a shard's topics keep their message logs: shared by all of them.
pub struct MessageLogs<S: Storage> {
    pub storage: S,
    pub directories: Rc<Directories>,
    pub config: Rc<LogConfig>,
}

/// A topic's message log, made when first used (`Deref`). The answers an idle topic is asked
/// for often (by its sweeps, stats, attaches and journal) come from here without making it; a
/// streaming pull waiting on the topic makes it (it waits on the log's commit notice).
pub struct MessageLog<S: Storage> {
    log: OnceCell<Log<S>>,
    logs: Rc<MessageLogs<S>>,
    /// The topic (or source) whose log this is.
    id: TopicId,
}

impl<S: Storage> MessageLog<S> {
    /// A log found on disk (or made) by `Log::open`.
    pub fn opened(log: Log<S>, logs: Rc<MessageLogs<S>>, id: TopicId) -> MessageLog<S> {
        MessageLog { log: OnceCell::from(log), logs, id }
    }

    /// The log of topic `id`, of which nothing is on disk (`Log::is_pristine`): made on its
    /// first use.
    pub fn empty(logs: Rc<MessageLogs<S>>, id: TopicId) -> MessageLog<S> {
        MessageLog { log: OnceCell::new(), logs, id }
    }

    /// The log, if it was made.
    pub fn made(&self) -> Option<&Log<S>> {
        self.log.get()
    }

    // What a log not made answers, as `Log` would once made (a test checks each against it).

    pub fn start_offset(&self) -> Offset {
        self.made().map_or(Offset::ZERO, Log::start_offset)
    }

    pub fn end_offset(&self) -> Offset {
        self.made().map_or(Offset::ZERO, Log::end_offset)
    }

    pub fn next_offset(&self) -> Offset {
        self.made().map_or(Offset::ZERO, Log::next_offset)
    }

    pub fn storage(&self) -> &S {
        &self.logs.storage
    }

    pub fn directories(&self) -> &Rc<Directories> {
        &self.logs.directories
    }

    pub fn committed_end(&self) -> Offset {
        self.made().map_or(Offset::ZERO, Log::committed_end)
    }

    pub fn durable_end(&self) -> Offset {
        self.made().map_or(Offset::ZERO, Log::durable_end)
    }

    pub fn is_empty(&self) -> bool {
        self.made().is_none_or(Log::is_empty)
    }

    pub fn closed_segments(&self) -> Vec<SegmentInfo> {
        self.made().map_or_else(Vec::new, Log::closed_segments)
    }

    pub fn disk_bytes(&self) -> u64 {
        self.made().map_or(0, Log::disk_bytes)
    }

    pub fn bytes_from(&self, offset: Offset) -> u64 {
        self.made().map_or(0, |log| log.bytes_from(offset))
    }

    pub fn is_stale(&self, copy: usize) -> bool {
        self.made().is_some_and(|log| log.is_stale(copy))
    }

    pub fn tail_cache_bytes(&self) -> usize {
        self.made().map_or(0, Log::tail_cache_bytes)
    }

    pub fn read_ahead_bytes(&self) -> usize {
        self.made().map_or(0, Log::read_ahead_bytes)
    }

    pub fn release_idle_cache(&self) {
        if let Some(log) = self.made() {
            log.release_idle_cache();
        }
    }

    pub async fn discard_spares(&self) {
        if let Some(log) = self.made() {
            log.discard_spares().await;
        }
    }
}

impl<S: Storage> Deref for MessageLog<S> {
    type Target = Log<S>;

    fn deref(&self) -> &Log<S> {
        self.log.get_or_init(|| {
            let logs = &self.logs;
            Log::new_empty(
                logs.storage.clone(),
                logs.directories.clone(),
                &topic_folder(self.id).join("messages"),
                messages_log_id(self.id),
                logs.config.clone(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::tests::{directories, run};
    use crate::storage::sim::SimDisk;
    use std::path::Path;

    /// A log not made answers what the log made for it answers: nothing reads an idle topic
    /// differently for its log not being there.
    #[test]
    fn a_log_not_made_answers_as_the_empty_log_made_for_it() {
        run(async {
            let logs = Rc::new(MessageLogs {
                storage: SimDisk::new(),
                directories: directories(3),
                config: Rc::new(LogConfig::default()),
            });
            let lazy = MessageLog::empty(logs.clone(), TopicId::new(7));
            let answers = |log: &MessageLog<SimDisk>| {
                (
                    (
                        log.start_offset(),
                        log.end_offset(),
                        log.next_offset(),
                        log.committed_end(),
                        log.durable_end(),
                    ),
                    (
                        log.is_empty(),
                        log.closed_segments().len(),
                        log.disk_bytes(),
                        log.bytes_from(Offset::ZERO),
                    ),
                    (log.is_stale(0), log.tail_cache_bytes(), log.read_ahead_bytes()),
                )
            };
            let before = answers(&lazy);
            lazy.discard_spares().await;
            lazy.release_idle_cache();
            assert!(lazy.made().is_none(), "none of them makes the log");
            let made: &Log<SimDisk> = &lazy;
            assert_eq!(made.end_offset(), Offset::ZERO);
            assert!(lazy.made().is_some());
            assert_eq!(answers(&lazy), before);
            // The same as opening the topic's empty folder.
            let (opened, _) = Log::open(
                logs.storage.clone(),
                logs.directories.clone(),
                &topic_folder(TopicId::new(7)).join("messages"),
                messages_log_id(TopicId::new(7)),
                logs.config.clone(),
            )
            .await
            .unwrap();
            assert!(opened.is_pristine());
            assert_eq!(answers(&MessageLog::opened(opened, logs.clone(), TopicId::new(7))), before);
        });
    }

    /// A log that holds no message but recorded a promise (a replica's part in a fencing round)
    /// is not pristine: made again empty, it would have forgotten the promise.
    #[test]
    fn a_log_that_only_recorded_a_promise_is_not_pristine() {
        run(async {
            let storage = SimDisk::new();
            let directories = directories(3);
            let open = || {
                Log::open(
                    storage.clone(),
                    directories.clone(),
                    Path::new("t/messages"),
                    7,
                    Rc::new(LogConfig::default()),
                )
            };
            let (log, _) = open().await.unwrap();
            assert!(log.is_pristine());
            log.promise_epoch(crate::ids::Epoch::new(3)).await.unwrap();
            drop(log);
            let (reopened, _) = open().await.unwrap();
            assert!(reopened.is_empty(), "it holds no message");
            assert!(!reopened.is_pristine(), "but its manifest holds the promise");
        });
    }
}
