//! Identifiers as distinct types, so that a source is never taken for an offset.
//!
//! The wire and rkyv types keep plain integers; these are made and taken apart at the edges.

/// One of a topic's publish sources (each its own replicated log). Every topic has source 0,
/// which is the log a topic had before topics had several sources: an ack id or message id
/// that names no source means it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SourceId(u32);

impl SourceId {
    /// The source every topic has, and the only one until topics have several.
    pub const FIRST: SourceId = SourceId(0);

    /// A source by number; `None` past `SOURCES_PER_TOPIC_MAX`, which message ids cannot name.
    pub const fn new(number: u32) -> Option<SourceId> {
        if number < SOURCES_PER_TOPIC_MAX {
            Some(SourceId(number))
        } else {
            None
        }
    }

    pub const fn get(self) -> u32 {
        self.0
    }
}

/// Bits of a message id that hold the offset in its source; the bits above hold the source.
/// 2^52 offsets last 79 years at 1.8 M messages a second, a shard's measured peak.
pub const MESSAGE_ID_OFFSET_BITS: u32 = 52;
/// Sources a topic can have: as many as the message id's bits above the offset can name,
/// keeping the top bit clear so that every message id fits an i64 (users store them in
/// signed 64-bit columns, as Google's numeric message ids allow).
pub const SOURCES_PER_TOPIC_MAX: u32 = 1 << (63 - MESSAGE_ID_OFFSET_BITS);

/// A message's id, unique over its topic: its source in the high bits and its offset in that
/// source in the low `MESSAGE_ID_OFFSET_BITS`. Source 0's ids are its offsets, as every message
/// id was before topics had several sources, so no id a user stored changes meaning. It stays
/// one number because the native protocol carries message ids as a u64 (and gRPC as its
/// decimal text, as Google's are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(u64);

impl MessageId {
    /// The id of the message at `offset` in `source`. Source 0 takes any offset (its ids are
    /// its offsets); another source's offsets must stay below 2^`MESSAGE_ID_OFFSET_BITS`, or
    /// its ids would run into the next source's, so a larger one stops the shard rather than
    /// name two messages alike.
    pub fn new(source: SourceId, offset: u64) -> MessageId {
        assert!(
            source == SourceId::FIRST || offset >> MESSAGE_ID_OFFSET_BITS == 0,
            "offset {offset} of source {} does not fit a message id",
            source.0
        );
        MessageId((source.0 as u64) << MESSAGE_ID_OFFSET_BITS | offset)
    }

    pub const fn get(self) -> u64 {
        self.0
    }
}

const _: () = assert!(SOURCES_PER_TOPIC_MAX as u64 - 1 <= u64::MAX >> (MESSAGE_ID_OFFSET_BITS + 1));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_zero_ids_are_offsets() {
        for offset in [0, 1, 1 << MESSAGE_ID_OFFSET_BITS, u64::MAX] {
            assert_eq!(MessageId::new(SourceId::FIRST, offset).get(), offset);
        }
    }

    #[test]
    fn sources_past_the_maximum_do_not_exist() {
        assert!(SourceId::new(SOURCES_PER_TOPIC_MAX - 1).is_some());
        assert!(SourceId::new(SOURCES_PER_TOPIC_MAX).is_none());
        let last = SourceId::new(SOURCES_PER_TOPIC_MAX - 1).unwrap();
        let id = MessageId::new(last, (1 << MESSAGE_ID_OFFSET_BITS) - 1);
        assert!(i64::try_from(id.get()).is_ok(), "every message id fits an i64");
    }

    #[test]
    #[should_panic(expected = "does not fit a message id")]
    fn an_offset_too_large_for_its_source_stops_rather_than_collide() {
        MessageId::new(SourceId::new(1).unwrap(), 1 << MESSAGE_ID_OFFSET_BITS);
    }

    proptest::proptest! {
        #[test]
        fn message_ids_of_different_sources_never_meet(
            first in 0..SOURCES_PER_TOPIC_MAX,
            second in 0..SOURCES_PER_TOPIC_MAX,
            first_offset in 0u64..1 << MESSAGE_ID_OFFSET_BITS,
            second_offset in 0u64..1 << MESSAGE_ID_OFFSET_BITS,
        ) {
            let a = MessageId::new(SourceId::new(first).unwrap(), first_offset);
            let b = MessageId::new(SourceId::new(second).unwrap(), second_offset);
            proptest::prop_assert_eq!(a == b, first == second && first_offset == second_offset);
        }
    }
}
