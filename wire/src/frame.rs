//! The frame: a fixed 16-byte little-endian header followed by an rkyv body.
//!
//! ```text
//! 0       4        6      8                16
//! | body_length | command | flags | request_id | body (body_length bytes) ...
//! ```
//!
//! Bodies are decoded in place with `rkyv::access`, which validates every pointer and length
//! before anything is read. Because the header is 16 bytes, a frame read into a 16-byte aligned
//! buffer leaves its body aligned as rkyv requires.

use crate::error::{ErrorCode, Status};
use crate::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Portable, Serialize};

/// The frame answers a request (it carries the request's command code).
pub const FLAG_RESPONSE: u16 = 1 << 0;
/// The body is an `ErrorBody` instead of the command's response type.
pub const FLAG_ERROR: u16 = 1 << 1;
/// A response of a stream (`StreamingPull`) with more to come under the same request id; the
/// stream's last frame has it clear.
pub const FLAG_MORE: u16 = 1 << 2;
/// A request carried by another node's forwarder for a subscriber it serves (a subscribe
/// forwarder's relay): the forwarder receiving it serves it or refuses it, never carries it on,
/// so a request crosses at most one relay however stale the nodes' routes are.
pub const FLAG_RELAYED: u16 = 1 << 3;
/// Flags this version understands; a frame with any other bit set is refused.
pub const FLAGS_KNOWN: u16 = FLAG_RESPONSE | FLAG_ERROR | FLAG_MORE | FLAG_RELAYED;

/// Bytes that frames are built in and read into: 16-byte aligned, as rkyv needs.
pub type FrameBuffer = AlignedVec<16>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_length: u32,
    pub command: u16,
    pub flags: u16,
    pub request_id: u64,
}

/// Why a frame header was refused. Any of these closes the connection: after a bad header the
/// stream can no longer be split into frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame header needs {FRAME_HEADER_BYTES} bytes, got {0}")]
    Truncated(usize),
    #[error("frame body of {0} bytes exceeds the limit of {FRAME_BODY_BYTES_MAX} bytes")]
    BodyTooLarge(u32),
    #[error("frame has unknown flags {0:#06x}")]
    UnknownFlags(u16),
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&self.body_length.to_le_bytes());
        bytes[4..6].copy_from_slice(&self.command.to_le_bytes());
        bytes[6..8].copy_from_slice(&self.flags.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        bytes
    }

    /// Decodes and checks a header. The body length is checked here, before anyone allocates
    /// room for the body.
    pub fn decode(bytes: &[u8]) -> Result<FrameHeader, FrameError> {
        if bytes.len() < FRAME_HEADER_BYTES {
            return Err(FrameError::Truncated(bytes.len()));
        }
        let header = FrameHeader {
            body_length: u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
            command: u16::from_le_bytes(bytes[4..6].try_into().unwrap()),
            flags: u16::from_le_bytes(bytes[6..8].try_into().unwrap()),
            request_id: u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
        };
        if header.body_length as usize > FRAME_BODY_BYTES_MAX {
            return Err(FrameError::BodyTooLarge(header.body_length));
        }
        if header.flags & !FLAGS_KNOWN != 0 {
            return Err(FrameError::UnknownFlags(header.flags));
        }
        Ok(header)
    }

    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    pub fn is_error(&self) -> bool {
        self.flags & FLAG_ERROR != 0
    }
}

/// A type that can be a frame body.
pub trait Body:
    Archive + for<'a> Serialize<HighSerializer<FrameBuffer, ArenaHandle<'a>, rancor::Error>>
{
}
impl<T> Body for T where
    T: Archive + for<'a> Serialize<HighSerializer<FrameBuffer, ArenaHandle<'a>, rancor::Error>>
{
}

/// Builds a whole frame (header and body) in one aligned buffer, ready to write to a socket.
pub fn encode_frame<T: Body>(command: u16, flags: u16, request_id: u64, body: &T) -> FrameBuffer {
    encode_frame_sized(command, flags, request_id, body, 256)
}

/// `encode_frame` into a buffer of `capacity` bytes to start with: a large body (a pull's
/// messages) sized close to its encoding is written once, instead of copied at every doubling
/// of a buffer that started small.
pub fn encode_frame_sized<T: Body>(
    command: u16,
    flags: u16,
    request_id: u64,
    body: &T,
    capacity: usize,
) -> FrameBuffer {
    match encode_frame_within_limit(command, flags, request_id, body, capacity) {
        Ok(buffer) => buffer,
        // What the daemon encodes is bounded by its own limits (a pull response by
        // `PULL_RESPONSE_BYTES_MAX`), so a body past the frame's limit is a bug there.
        Err(status) => panic!("{}", status.message),
    }
}

/// `encode_frame`, refusing a body over `FRAME_BODY_BYTES_MAX` with `InvalidArgument` naming
/// the limit: for a client, whose caller chose the body (a message of 20 MB, say), which is
/// then never sent.
pub fn try_encode_frame<T: Body>(
    command: u16,
    flags: u16,
    request_id: u64,
    body: &T,
) -> Result<FrameBuffer, Status> {
    encode_frame_within_limit(command, flags, request_id, body, 256)
}

fn encode_frame_within_limit<T: Body>(
    command: u16,
    flags: u16,
    request_id: u64,
    body: &T,
    capacity: usize,
) -> Result<FrameBuffer, Status> {
    let mut buffer = FrameBuffer::with_capacity(
        capacity.clamp(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + FRAME_BODY_BYTES_MAX),
    );
    buffer.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    let mut buffer = rkyv::api::high::to_bytes_in::<_, rancor::Error>(body, buffer)
        .expect("serializing into memory cannot fail");
    let body_length = buffer.len() - FRAME_HEADER_BYTES;
    if body_length > FRAME_BODY_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "frame body of {body_length} bytes exceeds the limit of {FRAME_BODY_BYTES_MAX} (FRAME_BODY_BYTES_MAX)"
        )));
    }
    let header = FrameHeader { body_length: body_length as u32, command, flags, request_id };
    buffer[..FRAME_HEADER_BYTES].copy_from_slice(&header.encode());
    Ok(buffer)
}

/// Builds the error reply to a request.
pub fn encode_error(command: u16, request_id: u64, status: &Status) -> FrameBuffer {
    let mut message = status.message.clone();
    if message.len() > crate::limits::ERROR_MESSAGE_BYTES_MAX {
        let mut cut = crate::limits::ERROR_MESSAGE_BYTES_MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let body = crate::messages::ErrorBody { code: status.code as u32, message };
    encode_frame(command, FLAG_RESPONSE | FLAG_ERROR, request_id, &body)
}

/// Validates `bytes` as an archived `T` and returns a view of it, read in place. This is the
/// only way the daemon and client look at bytes that came from a socket.
pub fn access_body<T>(bytes: &[u8]) -> Result<&T::Archived, Status>
where
    T: Archive,
    T::Archived: Portable + for<'a> CheckBytes<HighValidator<'a, rancor::Error>>,
{
    // An empty body (the `Empty` message) may come from a buffer that never allocated, whose
    // pointer is a dangling placeholder; give rkyv an aligned empty slice instead.
    #[repr(align(16))]
    struct Aligned([u8; 16]);
    static EMPTY: Aligned = Aligned([0; 16]);
    let bytes = if bytes.is_empty() { &EMPTY.0[..0] } else { bytes };
    if !(bytes.as_ptr() as usize).is_multiple_of(16) && !bytes.is_empty() {
        return Err(Status::new(ErrorCode::ProtocolError, "frame body is not 16-byte aligned"));
    }
    rkyv::access::<T::Archived, rancor::Error>(bytes)
        .map_err(|error| Status::new(ErrorCode::ProtocolError, format!("malformed frame body: {error}")))
}

/// Validates `bytes` as an archived `T` (`access_body`) and copies it out into an owned `T`,
/// for a reader that keeps what it received (the client's responses).
pub fn decode_body<T>(bytes: &[u8]) -> Result<T, Status>
where
    T: Archive,
    T::Archived: Portable
        + for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let archived = access_body::<T>(bytes)?;
    rkyv::deserialize::<T, rancor::Error>(archived)
        .map_err(|error| Status::new(ErrorCode::ProtocolError, format!("undecodable frame body: {error}")))
}

/// Reads the status out of an error frame's body.
pub fn decode_error(bytes: &[u8]) -> Status {
    match access_body::<crate::messages::ErrorBody>(bytes) {
        Ok(body) => Status {
            code: ErrorCode::from_u32(body.code.to_native()).unwrap_or(ErrorCode::Unknown),
            message: body.message.as_str().to_owned(),
        },
        Err(status) => status,
    }
}

/// A body with at least this many bytes still to come is read straight into its buffer
/// (`FrameSplitter::body_room`); less is read through the caller's chunk, which may bring the
/// next frames in the same read.
pub const DIRECT_BODY_BYTES_MIN: usize = 64 * 1024;
/// A body read straight into its buffer grows to at most this many times the bytes that
/// arrived (more only when the reader says more are already waiting), so a peer that announces
/// a large body and stops costs little more than what it sent; doubling keeps the copies of a
/// body that arrives slowly to one body's length in all.
const DIRECT_ROOM_GROWTH: usize = 2;

/// Splits a byte stream into frames without doing any I/O: feed it bytes as they arrive and
/// take whole frames out. A frame not yet whole holds memory for the bytes that arrived, not for
/// the length its header announces (`held_bytes`, which a server counts against its budget for
/// partial frames); at most one header plus one body of `FRAME_BODY_BYTES_MAX`.
#[derive(Default)]
pub struct FrameSplitter {
    pending: Vec<u8>,
    header: Option<FrameHeader>,
    /// The body being received: `filled` bytes of it, then (after `body_room`) zeros that a
    /// read straight into the buffer fills.
    body: FrameBuffer,
    filled: usize,
}

/// One whole frame: its header and its body in an aligned buffer.
pub struct Frame {
    pub header: FrameHeader,
    pub body: FrameBuffer,
}

impl FrameSplitter {
    pub fn new() -> FrameSplitter {
        FrameSplitter::default()
    }

    /// Appends bytes and returns the frames they complete. A header error poisons the stream.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            match self.header {
                None => {
                    let want = FRAME_HEADER_BYTES - self.pending.len();
                    let take = want.min(bytes.len());
                    self.pending.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.pending.len() == FRAME_HEADER_BYTES {
                        let header = FrameHeader::decode(&self.pending)?;
                        self.pending.clear();
                        // Room for what arrived, not for the announced length: a peer that
                        // sends only a header must not cost a body. A frame that arrived
                        // whole gets its body's exact room, in one allocation.
                        self.body =
                            FrameBuffer::with_capacity((header.body_length as usize).min(bytes.len()));
                        self.header = Some(header);
                    }
                }
                Some(header) => {
                    let want = header.body_length as usize - self.filled;
                    let take = want.min(bytes.len());
                    let end = self.filled + take;
                    if end <= self.body.len() {
                        self.body[self.filled..end].copy_from_slice(&bytes[..take]);
                    } else {
                        self.body.resize(self.filled, 0);
                        self.body.extend_from_slice(&bytes[..take]);
                    }
                    self.filled = end;
                    bytes = &bytes[take..];
                }
            }
            frames.extend(self.take_complete());
        }
        Ok(frames)
    }

    /// The frame, once its body has every byte.
    fn take_complete(&mut self) -> Option<Frame> {
        let header = self.header?;
        if self.filled < header.body_length as usize {
            return None;
        }
        debug_assert_eq!(self.body.len(), self.filled, "a body's room never goes past its end");
        self.header = None;
        self.filled = 0;
        Some(Frame { header, body: std::mem::take(&mut self.body) })
    }

    /// Where the next bytes of a body go when at least `DIRECT_BODY_BYTES_MIN` of it are still
    /// to come: a read straight into this room saves copying the body through a chunk, and
    /// copying it again each time its buffer grows (W1's 1 MiB requests: 17% more messages a
    /// second). Then `body_filled` says how many bytes the read brought. The room is zeroed
    /// memory, at most `DIRECT_ROOM_GROWTH` times the bytes that arrived
    /// (`DIRECT_BODY_BYTES_MIN` at first), and never beyond the body.
    pub fn body_room(&mut self) -> Option<&mut [u8]> {
        self.body_room_for(0)
    }

    /// `body_room`, knowing that `waiting` more bytes are ready to be read (the socket's
    /// `FIONREAD`): a body that arrived whole gets its whole room at once, so it is read with
    /// one allocation and no copy past the bytes its header's read brought.
    pub fn body_room_for(&mut self, waiting: usize) -> Option<&mut [u8]> {
        let size = self.body_room_bytes(waiting)?;
        if size > self.body.len() {
            // A buffer of exactly this size: growing in place would round it up to a power of
            // two, up to twice the body.
            let mut body = FrameBuffer::with_capacity(size);
            body.extend_from_slice(&self.body[..self.filled]);
            body.resize(size, 0);
            self.body = body;
        }
        Some(&mut self.body[self.filled..])
    }

    /// The size the body's buffer has after `body_room_for(waiting)`, or `None` if the next
    /// bytes go through the caller's chunk: what a server checks against its budget for partial
    /// frames before the buffer grows.
    pub fn body_room_bytes(&self, waiting: usize) -> Option<usize> {
        let length = self.header?.body_length as usize;
        if length - self.filled < DIRECT_BODY_BYTES_MIN {
            return None;
        }
        if self.body.len() > self.filled {
            return Some(self.body.len());
        }
        let grown = (self.filled * DIRECT_ROOM_GROWTH).max(self.filled + waiting);
        Some(grown.max(DIRECT_BODY_BYTES_MIN).min(length))
    }

    /// Counts `count` bytes read into the room `body_room` gave; the frame, if they complete it.
    pub fn body_filled(&mut self, count: usize) -> Option<Frame> {
        assert!(self.filled + count <= self.body.len(), "more bytes than the room held");
        self.filled += count;
        self.take_complete()
    }

    /// Bytes held for a frame not yet complete.
    pub fn buffered_bytes(&self) -> usize {
        self.pending.len() + self.filled
    }

    /// Memory this splitter holds for a frame not yet complete: the header's bytes and the
    /// body's buffer, including room not filled yet.
    pub fn held_bytes(&self) -> usize {
        self.pending.capacity() + self.body.capacity()
    }

    /// Room `body_room` gave that no read has filled yet: 0 when the next room grows the body.
    pub fn body_room_unfilled(&self) -> usize {
        if self.header.is_some() {
            self.body.len() - self.filled
        } else {
            0
        }
    }

    /// The header of the frame being received, once it is whole.
    pub fn header(&self) -> Option<FrameHeader> {
        self.header
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(body_length: u32) -> [u8; FRAME_HEADER_BYTES] {
        FrameHeader { body_length, command: 30, flags: 0, request_id: 1 }.encode()
    }

    /// A header that announces the largest body holds no body memory until bytes arrive, and
    /// then only about what arrived.
    #[test]
    fn a_partial_frame_holds_what_arrived_not_what_it_announced() {
        let mut splitter = FrameSplitter::new();
        assert!(splitter.push(&header(FRAME_BODY_BYTES_MAX as u32)).unwrap().is_empty());
        assert!(
            splitter.held_bytes() <= FRAME_HEADER_BYTES,
            "{} bytes for a bare header",
            splitter.held_bytes()
        );
        assert!(splitter.push(&[7u8; 1000]).unwrap().is_empty());
        assert!(splitter.held_bytes() < 4096, "{} bytes for 1000 that arrived", splitter.held_bytes());
        // A slow body's room at most doubles what arrived.
        let room = splitter.body_room_for(0).unwrap().len();
        assert_eq!(room + 1000, DIRECT_BODY_BYTES_MIN);
        let count = room;
        assert!(splitter.body_filled(count).is_none());
        assert_eq!(splitter.body_room_bytes(0), Some(DIRECT_BODY_BYTES_MIN * DIRECT_ROOM_GROWTH));
        assert_eq!(splitter.body_room_unfilled(), 0);
    }

    /// A body whose bytes are already waiting gets its whole room at once: one buffer of its
    /// exact length, the bytes its header's read brought copied once.
    #[test]
    fn a_body_that_arrived_whole_gets_its_room_at_once() {
        let length = 1 << 20;
        let mut splitter = FrameSplitter::new();
        let mut first = header(length as u32).to_vec();
        first.extend_from_slice(&[1u8; 4096]);
        assert!(splitter.push(&first).unwrap().is_empty());
        assert_eq!(splitter.body_room_bytes(length), Some(length));
        let room = splitter.body_room_for(length - 4096).unwrap();
        assert_eq!(room.len(), length - 4096);
        room.fill(2);
        let frame = splitter.body_filled(length - 4096).expect("the frame is whole");
        assert_eq!(frame.body.len(), length);
        assert_eq!(frame.body.capacity(), length, "one buffer of the body's length");
        assert_eq!(splitter.held_bytes(), splitter.pending.capacity());
    }

    /// A frame that arrives whole in one read gets one allocation of its body's length.
    #[test]
    fn a_small_frame_in_one_read_is_one_allocation() {
        let mut splitter = FrameSplitter::new();
        let mut bytes = header(300).to_vec();
        bytes.extend_from_slice(&[3u8; 300]);
        let frames = splitter.push(&bytes).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].body.capacity(), 300);
    }

    /// A body past the frame's limit is refused by name, not encoded (the client's 20 MB
    /// message used to panic here); one at the limit's edge is encoded.
    #[test]
    fn a_body_over_the_limit_is_refused_by_name() {
        use crate::messages::{PublishRequest, PubsubMessage};
        let request = |bytes: usize| PublishRequest {
            topic: "t".into(),
            messages: vec![PubsubMessage { data: vec![1u8; bytes], ..Default::default() }],
        };
        let refused = try_encode_frame(1, 0, 1, &request(20_000_000)).unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidArgument);
        assert!(refused.message.contains("FRAME_BODY_BYTES_MAX"), "{}", refused.message);
        let fits = try_encode_frame(1, 0, 1, &request(FRAME_BODY_BYTES_MAX - 1024)).unwrap();
        assert!(fits.len() <= FRAME_HEADER_BYTES + FRAME_BODY_BYTES_MAX);
    }
}
