//! What replicas of a source say to each other (docs/REPLICATION.md), as plain values with a
//! binary encoding: a leader syncs a follower (which cuts what disagrees) and sends it the
//! records it holds durably; a fencing round asks a replica to promise an epoch and say what it
//! holds; a new leader reads a journal it lacks from the replica that holds the most. A source
//! is two logs, the topic's messages and its subscriptions' journal, each replicated alone.
//!
//! Between nodes these travel as the body of a `PeerMessage` frame of the native protocol; the
//! bytes come from another node, so decoding refuses anything out of bounds.

use super::EpochHistory;
use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::{Epoch, Offset, TopicId};
use std::rc::Rc;

/// A source's logs: its messages, then its journal.
pub const LOGS: usize = 2;
pub const MESSAGES: usize = 0;
pub const JOURNAL: usize = 1;

/// Most chunks one log's part of an append or a read carries.
pub const CHUNKS_PER_LOG_MAX: usize = 4096;
/// Most epochs an epoch history carries: one per leader a log ever had.
pub const HISTORY_EPOCHS_MAX: usize = 1 << 16;

/// Records of one epoch at consecutive offsets, sealed as the sender's log holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub first_offset: Offset,
    pub epoch: Epoch,
    pub record_count: u32,
    pub records: RecordBytes,
}

/// A chunk's sealed records: bytes of their own (`decode` of a copy), or slices of what holds
/// them: on the leader its held batches (a chunk of one epoch may span several), on a follower
/// the frame they arrived in (`decode_held`). So a replicated byte is copied once on each side:
/// on the leader from the batch it holds into the append's frame
/// (`ReplicaRequest::write_append`), on the follower from the frame into its commit's buffer
/// (this type's `EncodeRecords`). Equal by content, however they are held.
#[derive(Clone)]
pub enum RecordBytes {
    Owned(Vec<u8>),
    Held(Vec<HeldSlice>),
}

/// A slice of bytes something else holds (a leader's held batch, a follower's received frame),
/// kept alive with it.
#[derive(Clone)]
pub struct HeldSlice {
    holder: Rc<dyn AsRef<[u8]>>,
    start: usize,
    end: usize,
}

impl HeldSlice {
    /// `holder`'s bytes from `start` to `end`, which must lie within them.
    pub fn new(holder: Rc<dyn AsRef<[u8]>>, start: usize, end: usize) -> HeldSlice {
        assert!(start <= end && end <= (*holder).as_ref().len(), "a held slice within its holder");
        HeldSlice { holder, start, end }
    }

    fn bytes(&self) -> &[u8] {
        &(*self.holder).as_ref()[self.start..self.end]
    }
}

impl RecordBytes {
    pub fn len(&self) -> usize {
        match self {
            RecordBytes::Owned(bytes) => bytes.len(),
            RecordBytes::Held(slices) => slices.iter().map(|slice| slice.end - slice.start).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes in order, as they lie.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let (owned, held) = match self {
            RecordBytes::Owned(bytes) => (Some(bytes.as_slice()), &[][..]),
            RecordBytes::Held(slices) => (None, slices.as_slice()),
        };
        owned.into_iter().chain(held.iter().map(HeldSlice::bytes))
    }

    /// Appends held bytes after these (the next batch of a chunk's epoch).
    pub fn push_held(&mut self, slice: HeldSlice) {
        match self {
            RecordBytes::Owned(bytes) => bytes.extend_from_slice(slice.bytes()),
            RecordBytes::Held(slices) => slices.push(slice),
        }
    }

    /// The bytes in one buffer: taken as they are if they are their own, else copied.
    fn into_vec(self) -> Vec<u8> {
        match self {
            RecordBytes::Owned(bytes) => bytes,
            held => held.parts().flat_map(|part| part.iter().copied()).collect(),
        }
    }

    /// The bytes in one slice: borrowed when they lie in one piece, else copied.
    pub fn contiguous(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            RecordBytes::Owned(bytes) => std::borrow::Cow::Borrowed(bytes),
            RecordBytes::Held(slices) if slices.len() == 1 => std::borrow::Cow::Borrowed(slices[0].bytes()),
            held => std::borrow::Cow::Owned(held.clone().into_vec()),
        }
    }
}

/// A follower's records are copied from where they arrived straight into its commit's buffer.
impl crate::log::EncodeRecords for RecordBytes {
    fn encoded_bytes(&self) -> usize {
        self.len()
    }

    fn encode_into(&self, out: &mut [u8]) {
        let mut at = 0;
        for part in self.parts() {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        assert_eq!(at, out.len(), "records fill the room measured for them");
    }

    fn newest_publish_ms(&self) -> u64 {
        crate::log::record::newest_publish_ms(&self.contiguous())
    }
}

impl From<Vec<u8>> for RecordBytes {
    fn from(bytes: Vec<u8>) -> RecordBytes {
        RecordBytes::Owned(bytes)
    }
}

impl PartialEq for RecordBytes {
    fn eq(&self, other: &RecordBytes) -> bool {
        self.len() == other.len() && self.parts().flatten().eq(other.parts().flatten())
    }
}

impl Eq for RecordBytes {}

impl std::fmt::Debug for RecordBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordBytes({} bytes)", self.len())
    }
}

impl Chunk {
    pub fn end_offset(&self) -> Offset {
        self.first_offset + self.record_count as u64
    }
}

/// What a leader sends for one log: records from the follower's next offset on, what the
/// leader counts as committed, and where the leader's log now starts (retention).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogAppend {
    pub chunks: Vec<Chunk>,
    pub committed_end: Offset,
    pub start_offset: Offset,
}

/// Where a log stands: the epochs of its durable records, and their end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogTip {
    pub history: EpochHistory,
    pub end: Offset,
    /// Where the leader's log starts (what retention left): a replica that holds nothing, a
    /// new one, starts its log there (`Log::start_at`) instead of at 0.
    pub start: Offset,
}

/// A replica's answer to a fencing round, for one log: the epoch of its last record, its
/// durable end, and its epochs (for a new leader to find where it parts from it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencedLog {
    pub last_epoch: Epoch,
    pub durable_end: Offset,
    pub history: EpochHistory,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaRequest {
    /// The leader of `leader_epoch` to a follower, before it sends records: promise my epoch,
    /// cut what disagrees with my logs, and say where each of yours now ends. `stamp` numbers
    /// this leader's syncs of this follower, from 1 up (0: unstamped, the form of the version
    /// before stamps, which an older follower reads).
    Sync { topic_id: TopicId, leader_epoch: Epoch, stamp: u64, logs: [LogTip; LOGS] },
    /// The leader's records, at the follower's next offsets, sent after the sync `stamp` (0:
    /// unstamped, as `Sync`'s).
    Append { topic_id: TopicId, leader_epoch: Epoch, stamp: u64, logs: [LogAppend; LOGS] },
    /// A fencing round: take no append from a leader older than `epoch`, and say what you hold.
    Fence { topic_id: TopicId, epoch: Epoch },
    /// Durable records of one log from `from` on, at most about `bytes_max` of them.
    Read { topic_id: TopicId, log: u8, from: Offset, bytes_max: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaAnswer {
    /// Each log's next offset once cut to agree with the leader.
    Synced {
        next_offsets: [Offset; LOGS],
    },
    /// Each log's durable end once the records sent are durable.
    Appended {
        durable_ends: [Offset; LOGS],
    },
    Fenced {
        logs: [FencedLog; LOGS],
    },
    Read {
        chunks: Vec<Chunk>,
        durable_end: Offset,
    },
    /// A sync or records from a leader older than this replica promised (a fencing round of
    /// `promised_epoch` reached it): the leader is deposed here, and an election is wanted.
    Deposed {
        promised_epoch: Epoch,
    },
    /// A stamped sync or append of the leader's epoch sent before the latest sync this replica
    /// began with it (`synced_stamp`): refused without touching the logs. Only stamped requests
    /// are answered so.
    Stale {
        synced_stamp: u64,
    },
}

impl ReplicaRequest {
    pub fn topic_id(&self) -> TopicId {
        match self {
            ReplicaRequest::Sync { topic_id, .. }
            | ReplicaRequest::Append { topic_id, .. }
            | ReplicaRequest::Fence { topic_id, .. }
            | ReplicaRequest::Read { topic_id, .. } => *topic_id,
        }
    }
}

const REQUEST_SYNC: u8 = 1;
const REQUEST_APPEND: u8 = 2;
const REQUEST_FENCE: u8 = 3;
const REQUEST_READ: u8 = 4;
/// `Sync` and `Append` with a stamp: tags of their own, which a replica of the version before
/// stamps refuses as unknown rather than misreads.
const REQUEST_SYNC_STAMPED: u8 = 5;
const REQUEST_APPEND_STAMPED: u8 = 6;
const ANSWER_SYNCED: u8 = 1;
const ANSWER_APPENDED: u8 = 2;
const ANSWER_FENCED: u8 = 3;
const ANSWER_READ: u8 = 4;
const ANSWER_DEPOSED: u8 = 5;
const ANSWER_STALE: u8 = 6;

fn get_bytes<'a>(decoder: &mut Decoder<'a>) -> DecodeResult<&'a [u8]> {
    let length = decoder.u32()? as usize;
    decoder.bytes(length)
}

fn put_history(encoder: &mut Encoder, history: &EpochHistory) {
    encoder.u32(history.starts().len() as u32);
    for (epoch, start) in history.starts() {
        encoder.u64(epoch.get()).u64(start.get());
    }
}

fn get_history(decoder: &mut Decoder) -> DecodeResult<EpochHistory> {
    let count = decoder.u32()? as usize;
    if count > HISTORY_EPOCHS_MAX {
        return Err("an epoch history longer than HISTORY_EPOCHS_MAX");
    }
    let mut starts = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        starts.push((Epoch::new(decoder.u64()?), Offset::new(decoder.u64()?)));
    }
    EpochHistory::from_starts(starts).ok_or("an epoch history out of order")
}

fn put_chunks(encoder: &mut Encoder, chunks: &[Chunk]) {
    write_chunks(chunks, &mut |bytes| encoder.0.extend_from_slice(bytes));
}

/// `put_chunks`, written to `out` in pieces: each chunk's records from where they lie.
fn write_chunks(chunks: &[Chunk], out: &mut dyn FnMut(&[u8])) {
    out(&(chunks.len() as u32).to_le_bytes());
    for chunk in chunks {
        out(&chunk.first_offset.get().to_le_bytes());
        out(&chunk.epoch.get().to_le_bytes());
        out(&chunk.record_count.to_le_bytes());
        out(&(chunk.records.len() as u32).to_le_bytes());
        for part in chunk.records.parts() {
            out(part);
        }
    }
}

/// What decoded chunks' records are taken from: their own copies, or slices of the bytes that
/// hold the message (`ReplicaRequest::decode_held`).
type Holder<'h> = Option<&'h Rc<dyn AsRef<[u8]>>>;

fn get_chunks(decoder: &mut Decoder, holder: Holder) -> DecodeResult<Vec<Chunk>> {
    let count = decoder.u32()? as usize;
    if count > CHUNKS_PER_LOG_MAX {
        return Err("more chunks than CHUNKS_PER_LOG_MAX");
    }
    let mut chunks = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let (first_offset, epoch, record_count) = (decoder.u64()?, decoder.u64()?, decoder.u32()?);
        if first_offset.checked_add(record_count.into()).is_none() {
            return Err("a chunk that ends past the last offset");
        }
        let bytes = get_bytes(decoder)?;
        let records = match holder {
            Some(holder) => {
                // The decoder reads within the holder's bytes (`decode_held`).
                let start = bytes.as_ptr() as usize - (**holder).as_ref().as_ptr() as usize;
                RecordBytes::Held(vec![HeldSlice::new(holder.clone(), start, start + bytes.len())])
            }
            None => RecordBytes::Owned(bytes.to_vec()),
        };
        let (first_offset, epoch) = (Offset::new(first_offset), Epoch::new(epoch));
        chunks.push(Chunk { first_offset, epoch, record_count, records });
    }
    Ok(chunks)
}

/// A stamped form's stamp (never 0, which is the unstamped form's), or 0 for an unstamped one.
fn get_stamp(decoder: &mut Decoder, stamped: bool) -> DecodeResult<u64> {
    if !stamped {
        return Ok(0);
    }
    match decoder.u64()? {
        0 => Err("a stamped sync or append with stamp 0"),
        stamp => Ok(stamp),
    }
}

fn finish<T>(decoder: &Decoder, value: T) -> DecodeResult<T> {
    if !decoder.is_empty() {
        return Err("trailing bytes in a replica message");
    }
    Ok(value)
}

impl ReplicaRequest {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ReplicaRequest::Sync { topic_id, leader_epoch, stamp, logs } => {
                let mut encoder = Encoder::new(if *stamp == 0 { REQUEST_SYNC } else { REQUEST_SYNC_STAMPED });
                encoder.u64(topic_id.get()).u64(leader_epoch.get());
                if *stamp != 0 {
                    encoder.u64(*stamp);
                }
                for tip in logs {
                    put_history(&mut encoder, &tip.history);
                    encoder.u64(tip.end.get()).u64(tip.start.get());
                }
                encoder.0
            }
            ReplicaRequest::Append { .. } => {
                let mut bytes = Vec::with_capacity(self.append_bytes());
                self.write_append(&mut |piece| bytes.extend_from_slice(piece));
                bytes
            }
            ReplicaRequest::Fence { topic_id, epoch } => {
                Encoder::new(REQUEST_FENCE).u64(topic_id.get()).u64(epoch.get()).0.clone()
            }
            ReplicaRequest::Read { topic_id, log, from, bytes_max } => Encoder::new(REQUEST_READ)
                .u64(topic_id.get())
                .u8(*log)
                .u64(from.get())
                .u32(*bytes_max)
                .0
                .clone(),
        }
    }

    /// Writes an `Append`'s encoding (what `encode` returns) to `out` in pieces, each chunk's
    /// records from where they lie: into a frame, they are copied once (`net::replica`'s
    /// `AppendMessage`). Writes nothing for another request.
    pub fn write_append(&self, out: &mut dyn FnMut(&[u8])) {
        let ReplicaRequest::Append { topic_id, leader_epoch, stamp, logs } = self else { return };
        out(&[if *stamp == 0 { REQUEST_APPEND } else { REQUEST_APPEND_STAMPED }]);
        out(&topic_id.get().to_le_bytes());
        out(&leader_epoch.get().to_le_bytes());
        if *stamp != 0 {
            out(&stamp.to_le_bytes());
        }
        for log in logs {
            out(&log.committed_end.get().to_le_bytes());
            out(&log.start_offset.get().to_le_bytes());
            write_chunks(&log.chunks, out);
        }
    }

    /// The encoded size of an `Append` (`encode`, `write_append`): its kind, topic and epoch,
    /// then each log's two offsets and chunk count, and each chunk's header and records.
    pub fn append_bytes(&self) -> usize {
        let ReplicaRequest::Append { logs, stamp, .. } = self else { return 0 };
        let chunk = |chunk: &Chunk| 8 + 8 + 4 + 4 + chunk.records.len();
        let stamp_bytes = if *stamp == 0 { 0 } else { 8 };
        1 + 16
            + stamp_bytes
            + logs.iter().map(|log| 16 + 4 + log.chunks.iter().map(chunk).sum::<usize>()).sum::<usize>()
    }

    pub fn decode(bytes: &[u8]) -> DecodeResult<ReplicaRequest> {
        Self::decode_from(bytes, None)
    }

    /// `decode` of `bytes`, which lie within what `holder` holds (the frame a request came in):
    /// an append's chunks hold slices of it instead of copies, and its records are copied once,
    /// into the follower's commit (`Log::append_records_from_leader`).
    pub fn decode_held(holder: &Rc<dyn AsRef<[u8]>>, bytes: &[u8]) -> DecodeResult<ReplicaRequest> {
        let within = (**holder).as_ref().as_ptr_range();
        let range = bytes.as_ptr_range();
        assert!(within.start <= range.start && range.end <= within.end, "the bytes lie within their holder");
        Self::decode_from(bytes, Some(holder))
    }

    fn decode_from(bytes: &[u8], holder: Holder) -> DecodeResult<ReplicaRequest> {
        let mut d = Decoder::new(bytes);
        let request = match d.u8()? {
            tag @ (REQUEST_SYNC | REQUEST_SYNC_STAMPED) => {
                let (topic_id, leader_epoch) = (TopicId::new(d.u64()?), Epoch::new(d.u64()?));
                let stamp = get_stamp(&mut d, tag == REQUEST_SYNC_STAMPED)?;
                let mut tip = || -> DecodeResult<LogTip> {
                    let history = get_history(&mut d)?;
                    Ok(LogTip { history, end: Offset::new(d.u64()?), start: Offset::new(d.u64()?) })
                };
                let logs = [tip()?, tip()?];
                ReplicaRequest::Sync { topic_id, leader_epoch, stamp, logs }
            }
            tag @ (REQUEST_APPEND | REQUEST_APPEND_STAMPED) => {
                let (topic_id, leader_epoch) = (TopicId::new(d.u64()?), Epoch::new(d.u64()?));
                let stamp = get_stamp(&mut d, tag == REQUEST_APPEND_STAMPED)?;
                let mut log = || -> DecodeResult<LogAppend> {
                    let (committed_end, start_offset) = (Offset::new(d.u64()?), Offset::new(d.u64()?));
                    Ok(LogAppend { committed_end, start_offset, chunks: get_chunks(&mut d, holder)? })
                };
                let logs = [log()?, log()?];
                ReplicaRequest::Append { topic_id, leader_epoch, stamp, logs }
            }
            REQUEST_FENCE => {
                ReplicaRequest::Fence { topic_id: TopicId::new(d.u64()?), epoch: Epoch::new(d.u64()?) }
            }
            REQUEST_READ => {
                let (topic_id, log, from, bytes_max) =
                    (TopicId::new(d.u64()?), d.u8()?, Offset::new(d.u64()?), d.u32()?);
                if log as usize >= LOGS {
                    return Err("a read of a log a source does not have");
                }
                ReplicaRequest::Read { topic_id, log, from, bytes_max }
            }
            _ => return Err("unknown replica request"),
        };
        finish(&d, request)
    }
}

impl ReplicaAnswer {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ReplicaAnswer::Synced { next_offsets } => {
                Encoder::new(ANSWER_SYNCED).u64(next_offsets[0].get()).u64(next_offsets[1].get()).0.clone()
            }
            ReplicaAnswer::Appended { durable_ends } => {
                Encoder::new(ANSWER_APPENDED).u64(durable_ends[0].get()).u64(durable_ends[1].get()).0.clone()
            }
            ReplicaAnswer::Fenced { logs } => {
                let mut encoder = Encoder::new(ANSWER_FENCED);
                for log in logs {
                    encoder.u64(log.last_epoch.get()).u64(log.durable_end.get());
                    put_history(&mut encoder, &log.history);
                }
                encoder.0
            }
            ReplicaAnswer::Read { chunks, durable_end } => {
                let mut encoder = Encoder::new(ANSWER_READ);
                encoder.u64(durable_end.get());
                put_chunks(&mut encoder, chunks);
                encoder.0
            }
            ReplicaAnswer::Deposed { promised_epoch } => {
                Encoder::new(ANSWER_DEPOSED).u64(promised_epoch.get()).0.clone()
            }
            ReplicaAnswer::Stale { synced_stamp } => Encoder::new(ANSWER_STALE).u64(*synced_stamp).0.clone(),
        }
    }

    pub fn decode(bytes: &[u8]) -> DecodeResult<ReplicaAnswer> {
        let mut d = Decoder::new(bytes);
        let answer = match d.u8()? {
            ANSWER_SYNCED => {
                ReplicaAnswer::Synced { next_offsets: [Offset::new(d.u64()?), Offset::new(d.u64()?)] }
            }
            ANSWER_APPENDED => {
                ReplicaAnswer::Appended { durable_ends: [Offset::new(d.u64()?), Offset::new(d.u64()?)] }
            }
            ANSWER_FENCED => {
                let mut log = || -> DecodeResult<FencedLog> {
                    let (last_epoch, durable_end) = (Epoch::new(d.u64()?), Offset::new(d.u64()?));
                    Ok(FencedLog { last_epoch, durable_end, history: get_history(&mut d)? })
                };
                let logs = [log()?, log()?];
                ReplicaAnswer::Fenced { logs }
            }
            ANSWER_READ => {
                let durable_end = Offset::new(d.u64()?);
                ReplicaAnswer::Read { durable_end, chunks: get_chunks(&mut d, None)? }
            }
            ANSWER_DEPOSED => ReplicaAnswer::Deposed { promised_epoch: Epoch::new(d.u64()?) },
            ANSWER_STALE => ReplicaAnswer::Stale { synced_stamp: d.u64()? },
            _ => return Err("unknown replica answer"),
        };
        finish(&d, answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(first_offset: u64, epoch: u64) -> Chunk {
        Chunk {
            first_offset: Offset::new(first_offset),
            epoch: Epoch::new(epoch),
            record_count: 2,
            records: vec![7; 24].into(),
        }
    }

    #[test]
    fn every_message_decodes_to_what_was_encoded_and_a_cut_is_refused() {
        let history = EpochHistory::of_epochs([1, 1, 3, 4]);
        let requests = vec![
            ReplicaRequest::Sync {
                topic_id: TopicId::new(9),
                leader_epoch: Epoch::new(4),
                stamp: 0,
                logs: [
                    LogTip { history: history.clone(), end: Offset::new(4), start: Offset::new(2) },
                    LogTip::default(),
                ],
            },
            ReplicaRequest::Append {
                topic_id: TopicId::new(9),
                leader_epoch: Epoch::new(4),
                stamp: 0,
                logs: [
                    LogAppend {
                        chunks: vec![chunk(4, 3), chunk(6, 4)],
                        committed_end: Offset::new(3),
                        start_offset: Offset::new(0),
                    },
                    LogAppend { chunks: vec![], committed_end: Offset::new(0), start_offset: Offset::new(0) },
                ],
            },
            ReplicaRequest::Fence { topic_id: TopicId::new(9), epoch: Epoch::new(5) },
            ReplicaRequest::Read {
                topic_id: TopicId::new(9),
                log: JOURNAL as u8,
                from: Offset::new(3),
                bytes_max: 1 << 20,
            },
        ];
        // The stamped forms of the sync and the append too.
        let stamped: Vec<ReplicaRequest> = requests[..2]
            .iter()
            .cloned()
            .map(|mut request| {
                if let ReplicaRequest::Sync { stamp, .. } | ReplicaRequest::Append { stamp, .. } =
                    &mut request
                {
                    *stamp = u64::MAX - 1;
                }
                request
            })
            .collect();
        for request in requests.into_iter().chain(stamped) {
            let encoded = request.encode();
            if matches!(request, ReplicaRequest::Append { .. }) {
                // Sized exactly, its records are copied into the buffer once.
                assert_eq!(request.append_bytes(), encoded.len(), "an append's size ahead");
                assert_eq!(encoded.capacity(), encoded.len(), "never grown");
            }
            assert_eq!(ReplicaRequest::decode(&encoded), Ok(request.clone()));
            for cut in 0..encoded.len() {
                assert!(ReplicaRequest::decode(&encoded[..cut]).is_err(), "{request:?} cut at {cut}");
            }
        }
        let answers = vec![
            ReplicaAnswer::Synced { next_offsets: [Offset::new(4), Offset::new(0)] },
            ReplicaAnswer::Appended { durable_ends: [Offset::new(8), Offset::new(2)] },
            ReplicaAnswer::Fenced {
                logs: [
                    FencedLog {
                        last_epoch: Epoch::new(4),
                        durable_end: Offset::new(8),
                        history: history.clone(),
                    },
                    FencedLog::default(),
                ],
            },
            ReplicaAnswer::Read { chunks: vec![chunk(0, 1)], durable_end: Offset::new(2) },
            ReplicaAnswer::Deposed { promised_epoch: Epoch::new(7) },
            ReplicaAnswer::Stale { synced_stamp: 5 },
        ];
        for answer in answers {
            let encoded = answer.encode();
            assert_eq!(ReplicaAnswer::decode(&encoded), Ok(answer.clone()));
            for cut in 0..encoded.len() {
                assert!(ReplicaAnswer::decode(&encoded[..cut]).is_err(), "{answer:?} cut at {cut}");
            }
        }
    }

    /// An unstamped sync or append is written byte for byte as before stamps (which a replica of
    /// that version reads); a stamped one has a tag of its own, which that version refuses as
    /// unknown (its decoder's tags ended at `REQUEST_READ`), and a stamp of 0 in it is refused.
    #[test]
    fn unstamped_forms_are_those_of_the_version_before_and_stamped_ones_have_tags_of_their_own() {
        let sync = |stamp| ReplicaRequest::Sync {
            topic_id: TopicId::new(1),
            leader_epoch: Epoch::new(2),
            stamp,
            logs: [LogTip::default(), LogTip::default()],
        };
        let mut before = Encoder::new(REQUEST_SYNC);
        before.u64(1).u64(2);
        for _ in 0..LOGS {
            before.u32(0).u64(0).u64(0);
        }
        assert_eq!(sync(0).encode(), before.0);
        let stamped = sync(3).encode();
        assert_eq!(stamped[0], REQUEST_SYNC_STAMPED);
        assert!(stamped[0] > REQUEST_READ && REQUEST_APPEND_STAMPED > REQUEST_READ);
        let append = ReplicaRequest::Append {
            topic_id: TopicId::new(1),
            leader_epoch: Epoch::new(2),
            stamp: 0,
            logs: [LogAppend::default(), LogAppend::default()],
        };
        let mut before = Encoder::new(REQUEST_APPEND);
        before.u64(1).u64(2);
        for _ in 0..LOGS {
            before.u64(0).u64(0).u32(0);
        }
        assert_eq!(append.encode(), before.0);
        let mut zero = Encoder::new(REQUEST_SYNC_STAMPED);
        zero.u64(1).u64(2).u64(0);
        for _ in 0..LOGS {
            zero.u32(0).u64(0).u64(0);
        }
        assert!(ReplicaRequest::decode(&zero.0).is_err(), "a stamped form with stamp 0");
    }

    /// A request decoded within the frame that holds it keeps its records there: each chunk is
    /// a slice of the frame, equal to what was sent, and nothing of it was copied.
    #[test]
    fn an_append_decoded_in_its_frame_points_into_it() {
        let request = ReplicaRequest::Append {
            topic_id: TopicId::new(9),
            leader_epoch: Epoch::new(4),
            stamp: 3,
            logs: [
                LogAppend {
                    chunks: vec![chunk(4, 3), chunk(6, 4)],
                    committed_end: Offset::new(3),
                    start_offset: Offset::new(0),
                },
                LogAppend {
                    chunks: vec![chunk(0, 4)],
                    committed_end: Offset::new(0),
                    start_offset: Offset::new(0),
                },
            ],
        };
        let mut frame = vec![0u8; 16];
        frame.extend_from_slice(&request.encode());
        let holder: Rc<dyn AsRef<[u8]>> = Rc::new(frame);
        let within = (*holder).as_ref().as_ptr_range();
        let decoded = ReplicaRequest::decode_held(&holder, &(*holder).as_ref()[16..]).unwrap();
        assert_eq!(decoded, request);
        let ReplicaRequest::Append { logs, .. } = decoded else { unreachable!() };
        for chunk in logs.iter().flat_map(|log| &log.chunks) {
            assert!(matches!(chunk.records, RecordBytes::Held(_)), "held, not copied");
            let records = chunk.records.contiguous();
            let range = records.as_ptr_range();
            assert!(within.start <= range.start && range.end <= within.end, "a slice of the frame");
        }
        assert_eq!(Rc::strong_count(&holder), 4, "each chunk holds the frame");
    }

    #[test]
    fn a_history_out_of_order_and_a_third_log_are_refused() {
        let mut encoder = Encoder::new(REQUEST_SYNC);
        encoder.u64(1).u64(2).u32(2).u64(3).u64(0).u64(2).u64(5).u64(9);
        encoder.u32(0).u64(0);
        assert!(ReplicaRequest::decode(&encoder.0).is_err());
        let read = Encoder::new(REQUEST_READ).u64(1).u8(2).u64(0).u32(1).0.clone();
        assert!(ReplicaRequest::decode(&read).is_err());
    }
}
