//! Why a topic's logs could not be opened or its journal replayed, by what the caller does
//! next: free space and retry, or treat the topic as damaged (at start, quarantine it).
//! `api::error` maps them onto the domain's codes.

use crate::log::LogError;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// Too few data directories have room for a new topic's first segment and its journal's
    /// reserve: the create is refused until space is freed.
    #[error(
        "no disk space for topic '{topic}': data directory {} has {available_bytes} bytes available, and a topic \
         needs {needed_bytes} (its first segment and its journal's reserve); acknowledge messages or \
         delete topics to free space",
        .directory.display()
    )]
    NoRoom { topic: String, directory: PathBuf, available_bytes: u64, needed_bytes: u64 },
    /// Out of space, quota or descriptors while opening `what`: it says nothing of the data,
    /// and the open may be retried once the resource is back.
    #[error("{what}: out of disk space or open files: {why}")]
    NoSpace { what: String, why: String },
    /// Opening `what` failed otherwise: its files are taken as damaged (and at start the topic
    /// may be quarantined rather than stop the daemon).
    #[error("{what}: {error}")]
    Damaged { what: String, error: LogError },
    /// An entry of the topic's journal does not decode: the journal is damaged.
    #[error("topic '{topic}' journal entry {offset}: {why}")]
    JournalEntry { topic: String, offset: crate::ids::Offset, why: String },
    /// Reading the journal failed; the log's error says how.
    #[error("{0}")]
    Log(LogError),
}

impl From<LogError> for TopicError {
    fn from(error: LogError) -> TopicError {
        TopicError::Log(error)
    }
}

impl TopicError {
    /// Whether the topic's stored data is damaged (rather than a resource short): what a
    /// start that quarantines damaged topics quarantines.
    pub fn is_damage(&self) -> bool {
        match self {
            TopicError::NoRoom { .. } | TopicError::NoSpace { .. } => false,
            TopicError::Damaged { .. } | TopicError::JournalEntry { .. } => true,
            TopicError::Log(error) => matches!(error, LogError::DataLoss(_) | LogError::Corrupt(_)),
        }
    }
}
