//! Borrowed twins of the pull response, for the server's delivery path. They archive to the
//! same bytes as [`PullResponse`](crate::messages::PullResponse) — they use its archived types,
//! so the compiler checks the layouts match — but take each message's data, ack id and ordering
//! key from buffers the server already holds: a delivery then costs no allocation and at most one
//! copy (into the frame; none when the frame is gathered, see [`gather`](crate::gather)) instead
//! of two. Clients read the frame as a `PullResponse`, as ever. The publish response has a twin
//! too ([`PublishResponseRange`]), written from the range of ids a publish was given.

use crate::messages::{
    ArchivedAttribute, ArchivedPublishResponse, ArchivedPullResponse, ArchivedReceivedMessage,
};
use rkyv::munge::munge;
use rkyv::rancor::{Fallible, Source};
use rkyv::ser::{Allocator, Writer, WriterExt};
use rkyv::string::{ArchivedString, StringResolver};
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::{Archive, Archived, Place, Serialize, SerializeUnsized};
use std::ops::Range;

/// A `&str` archived as a `String`.
#[derive(Debug, Clone, Copy)]
pub struct StrRef<'a>(pub &'a str);

impl Archive for StrRef<'_> {
    type Archived = ArchivedString;
    type Resolver = StringResolver;

    fn resolve(&self, resolver: StringResolver, out: Place<ArchivedString>) {
        ArchivedString::resolve_from_str(self.0, resolver, out);
    }
}

impl<S: Fallible + ?Sized> Serialize<S> for StrRef<'_>
where
    S::Error: Source,
    str: SerializeUnsized<S>,
{
    fn serialize(&self, serializer: &mut S) -> Result<StringResolver, S::Error> {
        ArchivedString::serialize_from_str(self.0, serializer)
    }
}

/// A `&[u8]` archived as a `Vec<u8>`.
#[derive(Debug, Clone, Copy)]
pub struct BytesRef<'a>(pub &'a [u8]);

impl Archive for BytesRef<'_> {
    type Archived = ArchivedVec<u8>;
    type Resolver = VecResolver;

    fn resolve(&self, resolver: VecResolver, out: Place<ArchivedVec<u8>>) {
        ArchivedVec::resolve_from_slice(self.0, resolver, out);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> Serialize<S> for BytesRef<'_> {
    fn serialize(&self, serializer: &mut S) -> Result<VecResolver, S::Error> {
        ArchivedVec::<u8>::serialize_from_slice(self.0, serializer)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct AttributeRef<'a> {
    pub key: StrRef<'a>,
    pub value: StrRef<'a>,
}

#[derive(Debug, Clone)]
pub struct ReceivedMessageRef<'a> {
    pub ack_id: StrRef<'a>,
    pub message_id: u64,
    pub publish_time_ms: u64,
    pub data: BytesRef<'a>,
    pub attributes: Vec<AttributeRef<'a>>,
    pub ordering_key: StrRef<'a>,
    pub delivery_attempt: u32,
}

#[derive(Debug, Clone, Default)]
pub struct PullResponseRef<'a> {
    pub received_messages: Vec<ReceivedMessageRef<'a>>,
}

// The derive's `#[rkyv(as = ...)]` does not see through the lifetimes here, so the three impls
// are written out as it would write them: serialize every field, then resolve each into its
// place in the archived struct.

impl Archive for AttributeRef<'_> {
    type Archived = ArchivedAttribute;
    type Resolver = (StringResolver, StringResolver);

    fn resolve(&self, (key_resolver, value_resolver): Self::Resolver, out: Place<ArchivedAttribute>) {
        munge!(let ArchivedAttribute { key, value } = out);
        self.key.resolve(key_resolver, key);
        self.value.resolve(value_resolver, value);
    }
}

impl<S: Fallible + ?Sized> Serialize<S> for AttributeRef<'_>
where
    S::Error: Source,
    str: SerializeUnsized<S>,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        Ok((self.key.serialize(serializer)?, self.value.serialize(serializer)?))
    }
}

pub struct ReceivedMessageRefResolver {
    ack_id: StringResolver,
    data: VecResolver,
    attributes: VecResolver,
    ordering_key: StringResolver,
}

impl Archive for ReceivedMessageRef<'_> {
    type Archived = ArchivedReceivedMessage;
    type Resolver = ReceivedMessageRefResolver;

    fn resolve(&self, resolver: Self::Resolver, out: Place<ArchivedReceivedMessage>) {
        munge!(let ArchivedReceivedMessage {
            ack_id, message_id, publish_time_ms, data, attributes, ordering_key, delivery_attempt
        } = out);
        self.ack_id.resolve(resolver.ack_id, ack_id);
        self.message_id.resolve((), message_id);
        self.publish_time_ms.resolve((), publish_time_ms);
        self.data.resolve(resolver.data, data);
        ArchivedVec::resolve_from_slice(self.attributes.as_slice(), resolver.attributes, attributes);
        self.ordering_key.resolve(resolver.ordering_key, ordering_key);
        self.delivery_attempt.resolve((), delivery_attempt);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> Serialize<S> for ReceivedMessageRef<'_>
where
    S::Error: Source,
    str: SerializeUnsized<S>,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        Ok(ReceivedMessageRefResolver {
            ack_id: self.ack_id.serialize(serializer)?,
            data: self.data.serialize(serializer)?,
            attributes: ArchivedVec::<ArchivedAttribute>::serialize_from_slice(
                self.attributes.as_slice(),
                serializer,
            )?,
            ordering_key: self.ordering_key.serialize(serializer)?,
        })
    }
}

impl Archive for PullResponseRef<'_> {
    type Archived = ArchivedPullResponse;
    type Resolver = VecResolver;

    fn resolve(&self, resolver: VecResolver, out: Place<ArchivedPullResponse>) {
        munge!(let ArchivedPullResponse { received_messages } = out);
        ArchivedVec::resolve_from_slice(self.received_messages.as_slice(), resolver, received_messages);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> Serialize<S> for PullResponseRef<'_>
where
    S::Error: Source,
    str: SerializeUnsized<S>,
{
    fn serialize(&self, serializer: &mut S) -> Result<VecResolver, S::Error> {
        ArchivedVec::<ArchivedReceivedMessage>::serialize_from_slice(
            self.received_messages.as_slice(),
            serializer,
        )
    }
}

/// The fixed part of an archived message (its fields, the relative pointers of its strings and
/// vectors) and some alignment, for the estimate; what those point to comes on top.
const MESSAGE_FIXED_BYTES: usize = 80;
const ATTRIBUTE_FIXED_BYTES: usize = 24;

impl PullResponseRef<'_> {
    /// About the bytes of its encoding, a little over rather than under: the capacity to
    /// encode it into (`encode_frame_sized`).
    pub fn encoded_bytes_estimate(&self) -> usize {
        16 + self
            .received_messages
            .iter()
            .map(|message| {
                MESSAGE_FIXED_BYTES
                    + message.ack_id.0.len()
                    + message.data.0.len()
                    + message.ordering_key.0.len()
                    + message
                        .attributes
                        .iter()
                        .map(|attribute| {
                            ATTRIBUTE_FIXED_BYTES + attribute.key.0.len() + attribute.value.0.len()
                        })
                        .sum::<usize>()
            })
            .sum::<usize>()
    }
}

/// A publish's answer written straight from the range of ids its messages were given: the same
/// bytes as a [`PublishResponse`](crate::messages::PublishResponse) of those ids (it uses its
/// archived type), without a vector of them built first. A one-message publish's answer then
/// costs the shard no allocation but its frame's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishResponseRange(pub Range<u64>);

impl PublishResponseRange {
    /// How many ids the answer carries (none for an empty or reversed range).
    pub fn len(&self) -> usize {
        self.0.end.saturating_sub(self.0.start) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Archive for PublishResponseRange {
    type Archived = ArchivedPublishResponse;
    type Resolver = VecResolver;

    fn resolve(&self, resolver: VecResolver, out: Place<ArchivedPublishResponse>) {
        munge!(let ArchivedPublishResponse { message_ids } = out);
        ArchivedVec::<Archived<u64>>::resolve_from_len(self.len(), resolver, message_ids);
    }
}

impl<S: Fallible + Writer + ?Sized> Serialize<S> for PublishResponseRange {
    fn serialize(&self, serializer: &mut S) -> Result<VecResolver, S::Error> {
        // As `ArchivedVec::serialize_from_slice` writes a slice of ids: aligned once, then each
        // id's archived bytes one after the other.
        let position = serializer.align_for::<Archived<u64>>()?;
        for id in self.0.clone() {
            // SAFETY: a `u64`'s resolver is `()`, the one its `serialize` returns; the writer
            // is aligned for an archived `u64` by `align_for` above, and stays so after each
            // one, whose size is a multiple of its alignment.
            unsafe { serializer.resolve_aligned(&id, ())? };
        }
        Ok(VecResolver::from_pos(position))
    }
}
