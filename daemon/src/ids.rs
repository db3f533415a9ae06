//! Identifiers and positions as distinct types, so that the compiler refuses to add an epoch to
//! an offset, or to take a source for an offset or a shard for a node. Each has only the
//! arithmetic that means something: an offset plus a count is an offset, two offsets'
//! difference is a count, and an epoch has only its successor.
//!
//! The wire and rkyv types keep plain integers; these are made (`new`, `From`) and taken apart
//! (`get`) at the edges, and where a module not yet converted is called.
//!
//! ```
//! use ringpost_daemon::ids::{Epoch, Offset};
//! let start = Offset::new(10);
//! let end = start + 5; // an offset plus a count of records
//! assert_eq!(end - start, 5); // two offsets apart by a count
//! assert_eq!(start.up_to(end).count(), 5);
//! assert_eq!(Epoch::new(1).next(), Epoch::new(2));
//! ```
//!
//! What means nothing does not compile. Two offsets added:
//! ```compile_fail
//! # use ringpost_daemon::ids::Offset;
//! let _ = Offset::new(1) + Offset::new(2);
//! ```
//! An epoch counted with an offset, or on its own:
//! ```compile_fail
//! # use ringpost_daemon::ids::{Epoch, Offset};
//! let _ = Offset::new(1) + Epoch::new(2);
//! ```
//! ```compile_fail
//! # use ringpost_daemon::ids::Epoch;
//! let _ = Epoch::new(1) + 1;
//! ```
//! An offset compared with a bare integer, or one id taken for another:
//! ```compile_fail
//! # use ringpost_daemon::ids::Offset;
//! let _ = Offset::new(1) == 1;
//! ```
//! ```compile_fail
//! # use ringpost_daemon::ids::{NodeId, TopicId};
//! let _: TopicId = NodeId::new(1);
//! ```
//! A topic's id given where a subscription's or a snapshot's is meant (the control messages
//! carry several ids side by side), or computed with:
//! ```compile_fail
//! # use ringpost_daemon::ids::{SubscriptionId, TopicId};
//! fn detach(_subscription: SubscriptionId) {}
//! detach(TopicId::new(1));
//! ```
//! ```compile_fail
//! # use ringpost_daemon::ids::{SnapshotId, TopicId};
//! fn drop_snapshot(_snapshot: SnapshotId) {}
//! drop_snapshot(TopicId::new(1));
//! ```
//! ```compile_fail
//! # use ringpost_daemon::ids::TopicId;
//! let _ = TopicId::new(1) + 1;
//! ```
//! A shard given where its node is meant (a topic's leader compared with the node being
//! removed), or a shard's node compared with a bare number (openraft's, unconverted):
//! ```compile_fail
//! # use ringpost_daemon::ids::{NodeId, ShardId};
//! fn remove_node(_node: NodeId) {}
//! remove_node(ShardId::new(NodeId::new(2), 0));
//! ```
//! ```compile_fail
//! # use ringpost_daemon::ids::{NodeId, ShardId};
//! let leader: u64 = 2;
//! let _ = ShardId::new(NodeId::new(2), 0).node() == leader;
//! ```
//! A local shard's number (its index on its node) where the cluster's shard is meant, or the
//! packed number taken for one without saying so (`ShardId::from_global`):
//! ```compile_fail
//! # use ringpost_daemon::ids::ShardId;
//! fn call_forwarder(_shard: ShardId) {}
//! let local: u32 = 1;
//! call_forwarder(local);
//! ```
//! ```compile_fail
//! # use ringpost_daemon::ids::{NodeId, ShardId};
//! let _: u32 = ShardId::new(NodeId::new(2), 1);
//! ```

use ringpost_model::shards::{global_shard, node_and_shard};
use std::fmt;

/// A position in a log: the offset of a record, or an end (one past the last record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(u64);

impl Offset {
    /// The start of every log.
    pub const ZERO: Offset = Offset(0);

    pub const fn new(offset: u64) -> Offset {
        Offset(offset)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// The offsets from this one up to `end`, not including it (none if `end` is not after
    /// this one): a run of records, as a range of integers would give them.
    pub fn up_to(self, end: Offset) -> impl DoubleEndedIterator<Item = Offset> {
        (self.0..end.0).map(Offset)
    }

    /// The count of records from `earlier` to this offset; 0 if this one is not after it.
    pub const fn saturating_sub(self, earlier: Offset) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// An offset plus a count of records is an offset.
impl std::ops::Add<u64> for Offset {
    type Output = Offset;
    fn add(self, count: u64) -> Offset {
        Offset(self.0 + count)
    }
}

impl std::ops::AddAssign<u64> for Offset {
    fn add_assign(&mut self, count: u64) {
        self.0 += count;
    }
}

/// An offset less a count of records is an offset.
impl std::ops::Sub<u64> for Offset {
    type Output = Offset;
    fn sub(self, count: u64) -> Offset {
        Offset(self.0 - count)
    }
}

/// Two offsets' difference is a count of records.
impl std::ops::Sub for Offset {
    type Output = u64;
    fn sub(self, earlier: Offset) -> u64 {
        self.0 - earlier.0
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(formatter)
    }
}

/// A leader's term over a replicated log. Epoch 0 is "none": the epoch before any leader's,
/// that of an empty log. Epochs are compared and succeed one another; nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(u64);

impl Epoch {
    /// No leader's epoch: an empty log's last epoch.
    pub const ZERO: Epoch = Epoch(0);

    pub const fn new(epoch: u64) -> Epoch {
        Epoch(epoch)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch after this one.
    pub const fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(formatter)
    }
}

/// The identifiers the catalog gives, each its own type: none is ever computed with, only
/// compared, hashed and shown.
macro_rules! catalog_id {
    ($(#[$documentation:meta])* $name:ident) => {
        $(#[$documentation])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(u64);

        impl $name {
            pub const fn new(id: u64) -> $name {
                $name(id)
            }

            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(formatter)
            }
        }

        /// In hex, as the catalog's log lines write ids.
        impl fmt::LowerHex for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, formatter)
            }
        }
    };
}

catalog_id!(
    /// A topic, as the catalog numbers it (names may be reused; ids are not).
    TopicId
);
catalog_id!(
    /// A subscription, as the catalog numbers it: an ack id names it, so one deleted and
    /// recreated under the same name refuses the old one's ack ids.
    SubscriptionId
);
catalog_id!(
    /// A snapshot, as the catalog numbers it.
    SnapshotId
);
catalog_id!(
    /// A node of the cluster, from 1 (a single node is node 1).
    NodeId
);

/// One forwarder shard of the cluster: a node and its local shard. Where the catalog, the
/// wire and the stats carry it as one number, that number packs both (`global`); its layout
/// is `ringpost_model::shards`', never written out at a call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(u32);

impl ShardId {
    /// `node`'s forwarder shard `local`.
    pub fn new(node: NodeId, local: u32) -> ShardId {
        ShardId(global_shard(node.get(), local))
    }

    /// The shard a packed number names (as the catalog and the wire carry it).
    pub const fn from_global(global: u32) -> ShardId {
        ShardId(global)
    }

    /// The number that packs node and local shard.
    pub const fn global(self) -> u32 {
        self.0
    }

    pub fn node(self) -> NodeId {
        NodeId(node_and_shard(self.0).0)
    }

    /// Its number among its node's forwarder shards.
    pub fn local(self) -> u32 {
        node_and_shard(self.0).1
    }
}

/// As an operator reads it: "node 2 forwarder 0", never the packed number.
impl fmt::Display for ShardId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "node {} forwarder {}", self.node(), self.local())
    }
}

/// One of a topic's publish sources (each its own replicated log). Every topic has source 0,
/// which is the log a topic had before topics had several sources: an ack id or message id
/// that names no source means it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SourceId(u32);

impl SourceId {
    /// The source every topic has, and the only one until topics have several.
    pub const FIRST: SourceId = SourceId(0);
    /// The highest source a message id can name.
    pub const LAST: SourceId = SourceId(SOURCES_PER_TOPIC_MAX - 1);

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
    pub fn new(source: SourceId, offset: Offset) -> MessageId {
        let offset = offset.get();
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
    fn offsets_count_and_epochs_succeed() {
        let start = Offset::new(10);
        assert_eq!(start + 5, Offset::new(15));
        assert_eq!(Offset::new(15) - start, 5);
        assert_eq!(Offset::new(15) - 1, Offset::new(14));
        let mut end = start;
        end += 3;
        assert_eq!(end, Offset::new(13));
        assert_eq!(Epoch::ZERO.next(), Epoch::new(1));
        assert!(Epoch::new(2) > Epoch::new(1));
    }

    /// Topic folders and the catalog's entry descriptions format ids in hex, padded: a typed
    /// id formats exactly as its number did, so no folder name changes.
    #[test]
    fn catalog_ids_format_as_their_numbers() {
        assert_eq!(crate::topic::topic_folder(TopicId::new(0xab)).to_str(), Some("topics/00000000000000ab"));
        assert_eq!(format!("{:x}", SnapshotId::new(0x1_0000_0002)), "100000002");
        assert_eq!(TopicId::new(42).to_string(), "42");
    }

    #[test]
    fn a_shard_packs_its_node_and_local_shard() {
        for (node, local) in [(1, 0), (1, 3), (2, 0), (7, 65_535)] {
            let shard = ShardId::new(NodeId::new(node), local);
            assert_eq!((shard.node(), shard.local()), (NodeId::new(node), local));
            assert_eq!(ShardId::from_global(shard.global()), shard);
            assert_eq!(shard.to_string(), ringpost_model::shards::forwarder_name(shard.global()));
        }
        assert_eq!(ShardId::new(NodeId::new(1), 3).global(), 3, "a single node's shards are their numbers");
    }

    #[test]
    fn source_zero_ids_are_offsets() {
        for offset in [0, 1, 1 << MESSAGE_ID_OFFSET_BITS, u64::MAX] {
            assert_eq!(MessageId::new(SourceId::FIRST, Offset::new(offset)).get(), offset);
        }
    }

    #[test]
    fn sources_past_the_maximum_do_not_exist() {
        assert!(SourceId::new(SOURCES_PER_TOPIC_MAX - 1).is_some());
        assert!(SourceId::new(SOURCES_PER_TOPIC_MAX).is_none());
        let last = SourceId::new(SOURCES_PER_TOPIC_MAX - 1).unwrap();
        let id = MessageId::new(last, Offset::new((1 << MESSAGE_ID_OFFSET_BITS) - 1));
        assert!(i64::try_from(id.get()).is_ok(), "every message id fits an i64");
    }

    #[test]
    #[should_panic(expected = "does not fit a message id")]
    fn an_offset_too_large_for_its_source_stops_rather_than_collide() {
        MessageId::new(SourceId::new(1).unwrap(), Offset::new(1 << MESSAGE_ID_OFFSET_BITS));
    }

    proptest::proptest! {
        #[test]
        fn message_ids_of_different_sources_never_meet(
            first in 0..SOURCES_PER_TOPIC_MAX,
            second in 0..SOURCES_PER_TOPIC_MAX,
            first_offset in 0u64..1 << MESSAGE_ID_OFFSET_BITS,
            second_offset in 0u64..1 << MESSAGE_ID_OFFSET_BITS,
        ) {
            let a = MessageId::new(SourceId::new(first).unwrap(), Offset::new(first_offset));
            let b = MessageId::new(SourceId::new(second).unwrap(), Offset::new(second_offset));
            proptest::prop_assert_eq!(a == b, first == second && first_offset == second_offset);
        }
    }
}
