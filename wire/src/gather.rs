//! Frames whose large byte runs stay where they already are.
//!
//! A pull response is mostly message data that the server holds in buffers it read from its log.
//! Encoding it into one contiguous frame copies every byte once more before the socket copies it
//! again. [`encode_gathered`] instead serializes with a writer that, for each run of at least
//! [`GATHER_RUN_BYTES_MIN`] bytes lying inside one of the given source buffers, records where it
//! lies instead of copying it; everything else (the header, the archived fields, relative
//! pointers, padding, short strings) goes into the frame's own buffer. The result is written to
//! the socket with one vectored write. The bytes on the wire are exactly those of the contiguous
//! encoding, so clients see no difference.
//!
//! The writer finds a run's source by address: it compares the run's start and end with each
//! source's, so it never makes a reference it cannot prove lies inside a source, and the frame
//! takes the sources' owners with it (`GatheredBody::holding` checks they are the very buffers
//! encoded from) so that the runs stay valid until the frame is written.

use crate::frame::{FrameBuffer, FrameHeader};
use crate::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use rkyv::api::high::HighSerializer;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::ser::{Positional, Writer};
use rkyv::Serialize;
use std::ops::Range;

/// Runs shorter than this are copied into the frame's own buffer: below it, another entry in the
/// vectored write costs about as much as the copy it saves.
pub const GATHER_RUN_BYTES_MIN: usize = 512;

/// One run of a gathered frame, in wire order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Bytes of the frame's own buffer.
    Own(Range<usize>),
    /// Bytes of source `source`.
    Borrowed { source: usize, range: Range<usize> },
}

/// The rkyv writer behind [`encode_gathered`].
pub struct GatherWriter<'s> {
    own: FrameBuffer,
    own_run_start: usize,
    pieces: Vec<Piece>,
    position: usize,
    sources: &'s [&'s [u8]],
}

impl GatherWriter<'_> {
    fn close_own_run(&mut self) {
        if self.own.len() > self.own_run_start {
            self.pieces.push(Piece::Own(self.own_run_start..self.own.len()));
            self.own_run_start = self.own.len();
        }
    }

    /// The source that `bytes` lies inside, and where in it.
    fn locate(&self, bytes: &[u8]) -> Option<(usize, usize)> {
        let start = bytes.as_ptr() as usize;
        let end = start + bytes.len();
        self.sources.iter().enumerate().find_map(|(index, source)| {
            let source_start = source.as_ptr() as usize;
            (start >= source_start && end <= source_start + source.len())
                .then(|| (index, start - source_start))
        })
    }
}

impl Positional for GatherWriter<'_> {
    fn pos(&self) -> usize {
        self.position
    }
}

impl<E> Writer<E> for GatherWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        match (bytes.len() >= GATHER_RUN_BYTES_MIN).then(|| self.locate(bytes)).flatten() {
            Some((source, start)) => {
                self.close_own_run();
                self.pieces.push(Piece::Borrowed { source, range: start..start + bytes.len() });
            }
            None => self.own.extend_from_slice(bytes),
        }
        self.position += bytes.len();
        Ok(())
    }
}

/// A type that can be the body of a gathered frame.
pub trait GatheredBodyType<'s>:
    for<'a> Serialize<HighSerializer<GatherWriter<'s>, ArenaHandle<'a>, rancor::Error>>
{
}
impl<'s, T> GatheredBodyType<'s> for T where
    T: for<'a> Serialize<HighSerializer<GatherWriter<'s>, ArenaHandle<'a>, rancor::Error>>
{
}

/// An encoded frame that refers to its sources but does not hold them yet.
#[derive(Debug)]
pub struct GatheredBody {
    own: FrameBuffer,
    pieces: Vec<Piece>,
    length: usize,
    /// Start and length of each source, to check that the owners given later are these.
    sources: Vec<(usize, usize)>,
}

/// Encodes a frame as [`encode_frame_sized`](crate::frame::encode_frame_sized) does, leaving
/// each run of `GATHER_RUN_BYTES_MIN` bytes or more that lies inside one of `sources` where it is.
/// `own_capacity` is the room to reserve for the rest (header, fields, short strings), and
/// `runs_expected` about how many runs will be left in place.
pub fn encode_gathered<'s, T: GatheredBodyType<'s>>(
    command: u16,
    flags: u16,
    request_id: u64,
    body: &T,
    sources: &'s [&'s [u8]],
    own_capacity: usize,
    runs_expected: usize,
) -> GatheredBody {
    let mut own = FrameBuffer::with_capacity(
        own_capacity.clamp(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + FRAME_BODY_BYTES_MAX),
    );
    own.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    // A run left in place usually sits between two of the frame's own: room for that many.
    let pieces = Vec::with_capacity(2 * runs_expected + 1);
    let writer = GatherWriter { own, own_run_start: 0, pieces, position: FRAME_HEADER_BYTES, sources };
    let mut writer = rkyv::api::high::to_bytes_in::<_, rancor::Error>(body, writer)
        .expect("serializing into memory cannot fail");
    writer.close_own_run();
    let body_length = writer.position - FRAME_HEADER_BYTES;
    assert!(body_length <= FRAME_BODY_BYTES_MAX, "frame body of {body_length} bytes exceeds the limit");
    let header = FrameHeader { body_length: body_length as u32, command, flags, request_id };
    writer.own[..FRAME_HEADER_BYTES].copy_from_slice(&header.encode());
    GatheredBody {
        own: writer.own,
        pieces: writer.pieces,
        length: writer.position,
        sources: sources.iter().map(|source| (source.as_ptr() as usize, source.len())).collect(),
    }
}

impl GatheredBody {
    /// The frame, holding the owners of the buffers it was encoded from, in the same order.
    ///
    /// # Panics
    /// If an owner's bytes are not the very buffer given to `encode_gathered` in its place:
    /// the frame would send other bytes than it encoded.
    pub fn holding<S: AsRef<[u8]>>(self, owners: Vec<S>) -> GatheredFrame<S> {
        assert_eq!(owners.len(), self.sources.len(), "a gathered frame needs one owner per source");
        for (owner, &(start, length)) in owners.iter().zip(&self.sources) {
            let bytes = owner.as_ref();
            assert!(
                bytes.as_ptr() as usize == start && bytes.len() == length,
                "a gathered frame's owner does not hold the bytes it was encoded from"
            );
        }
        GatheredFrame { own: self.own, pieces: self.pieces, length: self.length, owners }
    }
}

/// A frame in pieces: its own buffer's runs and runs of the buffers it holds.
pub struct GatheredFrame<S> {
    own: FrameBuffer,
    pieces: Vec<Piece>,
    length: usize,
    owners: Vec<S>,
}

impl<S: AsRef<[u8]>> GatheredFrame<S> {
    /// Bytes on the wire, header included.
    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Runs of the frame not taken from its sources.
    pub fn own_bytes(&self) -> usize {
        self.own.len()
    }

    /// Its runs, in wire order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.pieces.iter().map(|piece| match piece {
            Piece::Own(range) => &self.own[range.clone()],
            Piece::Borrowed { source, range } => &self.owners[*source].as_ref()[range.clone()],
        })
    }

    /// The frame in one buffer (tests, and callers that need it whole).
    pub fn to_contiguous(&self) -> FrameBuffer {
        let mut buffer = FrameBuffer::with_capacity(self.length);
        for slice in self.slices() {
            buffer.extend_from_slice(slice);
        }
        buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::borrowed::{AttributeRef, BytesRef, PullResponseRef, ReceivedMessageRef, StrRef};
    use crate::frame::encode_frame_sized;
    use proptest::prelude::*;

    fn response<'a>(datas: &[&'a [u8]], keys: &[&'a str]) -> PullResponseRef<'a> {
        PullResponseRef {
            received_messages: datas
                .iter()
                .zip(keys.iter().cycle())
                .enumerate()
                .map(|(index, (data, key))| ReceivedMessageRef {
                    ack_id: StrRef("ack-id"),
                    message_id: index as u64,
                    publish_time_ms: 1_700_000_000_000 + index as u64,
                    data: BytesRef(data),
                    attributes: vec![AttributeRef { key: StrRef("k"), value: StrRef(key) }],
                    ordering_key: StrRef(key),
                    delivery_attempt: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn large_runs_inside_a_source_are_not_copied() {
        let source: Vec<u8> = (0..8192u32).map(|value| value as u8).collect();
        let other = vec![7u8; 4096];
        let datas = [&source[100..1124], &source[2000..2010], &other[..], &source[4096..8192]];
        let body = response(&datas, &["key"]);
        let sources = [&source[..]];
        let gathered = encode_gathered(9, 1, 42, &body, &sources, 64, 2).holding(vec![&source[..]]);
        let contiguous = encode_frame_sized(9, 1, 42, &body, 64);
        assert_eq!(&gathered.to_contiguous()[..], &contiguous[..]);
        assert_eq!(gathered.len(), contiguous.len());
        // Two runs came from the source; the short one and the foreign one were copied.
        assert!(gathered.own_bytes() <= contiguous.len() - 1024 - 4096);
        assert!(gathered.own_bytes() >= 4096 + 10);
    }

    #[test]
    #[should_panic(expected = "does not hold the bytes")]
    fn an_owner_of_other_bytes_is_refused() {
        let source = vec![1u8; 2048];
        let copy = source.clone();
        let body = response(&[&source[..]], &["key"]);
        let sources = [&source[..]];
        let _ = encode_gathered(9, 1, 42, &body, &sources, 64, 2).holding(vec![copy]);
    }

    proptest! {
        /// Whatever the messages and wherever their bytes lie, the gathered frame's bytes are the
        /// contiguous encoding's.
        #[test]
        fn gathered_bytes_equal_the_contiguous_encoding(
            source_bytes in proptest::collection::vec(any::<u8>(), 0..6000),
            spans in proptest::collection::vec((0usize..6000, 0usize..2000), 0..12),
            keys in proptest::collection::vec("[a-z]{0,700}", 1..3),
        ) {
            let second: Vec<u8> = source_bytes.iter().rev().copied().collect();
            let datas: Vec<&[u8]> = spans
                .iter()
                .enumerate()
                .map(|(index, &(start, length))| {
                    let source = if index % 2 == 0 { &source_bytes } else { &second };
                    let start = start.min(source.len());
                    let end = (start + length).min(source.len());
                    &source[start..end]
                })
                .collect();
            let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let body = response(&datas, &key_refs);
            let sources = [&source_bytes[..], &second[..]];
            let gathered =
                encode_gathered(3, 1, 7, &body, &sources, 0, 0).holding(vec![&source_bytes[..], &second[..]]);
            let contiguous = encode_frame_sized(3, 1, 7, &body, 0);
            prop_assert_eq!(&gathered.to_contiguous()[..], &contiguous[..]);
            prop_assert_eq!(gathered.slices().map(<[u8]>::len).sum::<usize>(), contiguous.len());
        }
    }
}
