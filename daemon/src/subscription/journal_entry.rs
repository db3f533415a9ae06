//! Entries of a topic's subscription journal: the durable record of which subscriptions exist
//! on the topic, where each starts (its sync point), and what each acknowledged. The journal is
//! a `Log` of its own beside the topic's messages, group-committed the same way: an ack is
//! confirmed to the subscriber only after its entry is durable.

use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::{Offset, SnapshotId, SubscriptionId, TopicId};

/// Most runs a decoder reserves room for up front: the count comes from the entry itself, and a
/// damaged count must not become a huge allocation before the truncated input is noticed.
const RUNS_PREALLOCATED_MAX: usize = 1 << 16;

const KIND_SUBSCRIPTION_CREATED: u8 = 1;
const KIND_SUBSCRIPTION_DELETED: u8 = 2;
const KIND_ACKED: u8 = 3;
const KIND_SEEK: u8 = 4;
const KIND_SNAPSHOT_TAKEN: u8 = 5;
const KIND_SNAPSHOT_DROPPED: u8 = 6;
const KIND_DEADLINE_EXTENDED: u8 = 7;
const KIND_LEADER_EPOCH: u8 = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalEntry {
    /// The subscription receives every message at or after `start_offset`.
    SubscriptionCreated {
        subscription_id: SubscriptionId,
        start_offset: Offset,
    },
    SubscriptionDeleted {
        subscription_id: SubscriptionId,
    },
    /// Acknowledged offsets as runs `(first, count)`.
    Acked {
        subscription_id: SubscriptionId,
        runs: Vec<(Offset, u32)>,
    },
    /// Everything below `offset` counts as acknowledged, nothing from it on (a seek).
    Seek {
        subscription_id: SubscriptionId,
        offset: Offset,
    },
    /// A snapshot of a subscription's acknowledgements: everything below `floor`, and `runs`.
    SnapshotTaken {
        snapshot_id: SnapshotId,
        floor: Offset,
        runs: Vec<(Offset, u32)>,
        expire_time_ms: u64,
    },
    SnapshotDropped {
        snapshot_id: SnapshotId,
    },
    /// Leases extended until a wall-clock time (milliseconds since the Unix epoch), so a
    /// restart does not redeliver messages a subscriber was promised more time for.
    DeadlineExtended {
        subscription_id: SubscriptionId,
        runs: Vec<(Offset, u32)>,
        until_ms: u64,
    },
    /// A replicated topic's new leader began its epoch here: it changes no subscription; its
    /// commit commits every entry before it (docs/REPLICATION.md).
    LeaderEpoch {
        epoch: u64,
    },
}

/// A topic's messages log has the topic's id for its log id (inside every checksum, so a batch
/// of one topic's log never validates as another's).
pub fn messages_log_id(topic_id: TopicId) -> u64 {
    topic_id.get()
}

/// Log ids of journals differ from their topic's, so a journal batch can never validate as a
/// message batch (the id is inside every checksum).
pub fn journal_log_id(topic_id: TopicId) -> u64 {
    messages_log_id(topic_id) ^ 0x4a4f_5552_4e41_4c00
}

impl JournalEntry {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            JournalEntry::SubscriptionCreated { subscription_id, start_offset } => {
                Encoder::new(KIND_SUBSCRIPTION_CREATED)
                    .u64(subscription_id.get())
                    .u64(start_offset.get())
                    .0
                    .clone()
            }
            JournalEntry::SubscriptionDeleted { subscription_id } => {
                Encoder::new(KIND_SUBSCRIPTION_DELETED).u64(subscription_id.get()).0.clone()
            }
            JournalEntry::Seek { subscription_id, offset } => {
                Encoder::new(KIND_SEEK).u64(subscription_id.get()).u64(offset.get()).0.clone()
            }
            JournalEntry::SnapshotTaken { snapshot_id, floor, runs, expire_time_ms } => {
                let mut encoder = Encoder::new(KIND_SNAPSHOT_TAKEN);
                encoder.u64(snapshot_id.get()).u64(floor.get()).u64(*expire_time_ms).u32(runs.len() as u32);
                for (first, count) in runs {
                    encoder.u64(first.get()).u32(*count);
                }
                encoder.0
            }
            JournalEntry::SnapshotDropped { snapshot_id } => {
                Encoder::new(KIND_SNAPSHOT_DROPPED).u64(snapshot_id.get()).0.clone()
            }
            JournalEntry::DeadlineExtended { subscription_id, runs, until_ms } => {
                let mut encoder = Encoder::new(KIND_DEADLINE_EXTENDED);
                encoder.u64(subscription_id.get()).u64(*until_ms).u32(runs.len() as u32);
                for (first, count) in runs {
                    encoder.u64(first.get()).u32(*count);
                }
                encoder.0
            }
            JournalEntry::LeaderEpoch { epoch } => Encoder::new(KIND_LEADER_EPOCH).u64(*epoch).0.clone(),
            JournalEntry::Acked { subscription_id, runs } => {
                let mut encoder = Encoder::new(KIND_ACKED);
                encoder.u64(subscription_id.get()).u32(runs.len() as u32);
                for (first, count) in runs {
                    encoder.u64(first.get()).u32(*count);
                }
                encoder.0
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> DecodeResult<JournalEntry> {
        let mut decoder = Decoder::new(bytes);
        let entry = match decoder.u8()? {
            KIND_SUBSCRIPTION_CREATED => JournalEntry::SubscriptionCreated {
                subscription_id: SubscriptionId::new(decoder.u64()?),
                start_offset: Offset::new(decoder.u64()?),
            },
            KIND_SUBSCRIPTION_DELETED => {
                JournalEntry::SubscriptionDeleted { subscription_id: SubscriptionId::new(decoder.u64()?) }
            }
            KIND_ACKED => {
                let subscription_id = SubscriptionId::new(decoder.u64()?);
                let count = decoder.u32()? as usize;
                let mut runs = Vec::with_capacity(count.min(RUNS_PREALLOCATED_MAX));
                for _ in 0..count {
                    runs.push((Offset::new(decoder.u64()?), decoder.u32()?));
                }
                JournalEntry::Acked { subscription_id, runs }
            }
            KIND_SEEK => JournalEntry::Seek {
                subscription_id: SubscriptionId::new(decoder.u64()?),
                offset: Offset::new(decoder.u64()?),
            },
            KIND_SNAPSHOT_TAKEN => {
                let (snapshot_id, floor, expire_time_ms) =
                    (SnapshotId::new(decoder.u64()?), Offset::new(decoder.u64()?), decoder.u64()?);
                let count = decoder.u32()? as usize;
                let mut runs = Vec::with_capacity(count.min(RUNS_PREALLOCATED_MAX));
                for _ in 0..count {
                    runs.push((Offset::new(decoder.u64()?), decoder.u32()?));
                }
                JournalEntry::SnapshotTaken { snapshot_id, floor, runs, expire_time_ms }
            }
            KIND_SNAPSHOT_DROPPED => {
                JournalEntry::SnapshotDropped { snapshot_id: SnapshotId::new(decoder.u64()?) }
            }
            KIND_DEADLINE_EXTENDED => {
                let (subscription_id, until_ms) = (SubscriptionId::new(decoder.u64()?), decoder.u64()?);
                let count = decoder.u32()? as usize;
                let mut runs = Vec::with_capacity(count.min(RUNS_PREALLOCATED_MAX));
                for _ in 0..count {
                    runs.push((Offset::new(decoder.u64()?), decoder.u32()?));
                }
                JournalEntry::DeadlineExtended { subscription_id, runs, until_ms }
            }
            KIND_LEADER_EPOCH => JournalEntry::LeaderEpoch { epoch: decoder.u64()? },
            _ => return Err("unknown journal entry kind"),
        };
        if !decoder.is_empty() {
            return Err("trailing bytes in journal entry");
        }
        Ok(entry)
    }
}

/// Groups sorted offsets into runs.
pub fn runs_of(sorted_offsets: &[Offset]) -> Vec<(Offset, u32)> {
    let mut runs: Vec<(Offset, u32)> = Vec::new();
    for offset in sorted_offsets {
        match runs.last_mut() {
            Some((first, count)) if *first + *count as u64 == *offset => *count += 1,
            Some((first, count)) if *first + (*count as u64) > *offset => {}
            _ => runs.push((*offset, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        for entry in [
            JournalEntry::SubscriptionCreated {
                subscription_id: SubscriptionId::new(9),
                start_offset: Offset::new(1 << 40),
            },
            JournalEntry::SubscriptionDeleted { subscription_id: SubscriptionId::new(9) },
            JournalEntry::Acked { subscription_id: SubscriptionId::new(9), runs: runs(&[(1, 3), (10, 1)]) },
            JournalEntry::Seek { subscription_id: SubscriptionId::new(9), offset: Offset::new(77) },
            JournalEntry::SnapshotTaken {
                snapshot_id: SnapshotId::new(3),
                floor: Offset::new(10),
                runs: runs(&[(12, 2)]),
                expire_time_ms: 99,
            },
            JournalEntry::SnapshotDropped { snapshot_id: SnapshotId::new(3) },
            JournalEntry::DeadlineExtended {
                subscription_id: SubscriptionId::new(9),
                runs: runs(&[(4, 1)]),
                until_ms: 1234,
            },
            JournalEntry::LeaderEpoch { epoch: 4 },
        ] {
            assert_eq!(JournalEntry::decode(&entry.encode()), Ok(entry.clone()));
            let bytes = entry.encode();
            for cut in 0..bytes.len() {
                assert!(JournalEntry::decode(&bytes[..cut]).is_err());
            }
        }
    }

    fn runs(runs: &[(u64, u32)]) -> Vec<(Offset, u32)> {
        runs.iter().map(|(first, count)| (Offset::new(*first), *count)).collect()
    }

    fn offsets(offsets: &[u64]) -> Vec<Offset> {
        offsets.iter().copied().map(Offset::new).collect()
    }

    #[test]
    fn runs_group_consecutive_offsets() {
        assert_eq!(runs_of(&offsets(&[1, 2, 3, 7, 9, 10])), runs(&[(1, 3), (7, 1), (9, 2)]));
        assert_eq!(runs_of(&offsets(&[4, 4, 5])), runs(&[(4, 2)]));
    }
}
