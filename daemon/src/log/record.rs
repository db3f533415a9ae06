//! The on-disk format of the log: batches of records in fresh 4 KiB-aligned blocks. Pure code:
//! encoding, decoding and checksums, no I/O.
//!
//! A group commit writes exactly one batch, starting on a block boundary and padded with zeros
//! to the next one, so a later write never touches a block that holds an acknowledged record
//! (so that a torn write can only damage unacknowledged bytes).
//!
//! ```text
//! batch header, format 2 (40 bytes)
//!   0 magic u32 "RPB1"   4 version u16 (2)   6 flags u16 (bit 0: written ahead, see below)
//!   8 base_offset u64    16 record_count u32   20 records_bytes u32
//!  24 epoch u64: the leader term the batch was written in (1 or more)
//!  32 header_crc u32: CRC32C of (log_id, segment_base, file_position, bytes 0..32)
//!  36 reserved u32 (zero)
//! batch header, format 1 (32 bytes; read, never written: its batches are of epoch 0)
//!   0..24 as above, with version 1
//!  24 header_crc u32: CRC32C of (log_id, segment_base, file_position, bytes 0..24)
//!  28 reserved u32 (zero)
//! records, each padded to 8 bytes, right after the header
//!   0 record_bytes u32 (unpadded)
//!   4 crc u32: CRC32C of (log_id, bytes 8..record_bytes); covers the record's offset
//!   8 offset u64   16 publish_time_ms u64   24 data_bytes u32
//!  28 attribute_count u16   30 ordering_key_bytes u16
//!  32 ordering key, then per attribute (key_bytes u16, value_bytes u16, key, value), then data
//! ```
//!
//! The header checksum covers where the batch sits (log, segment, file position) and each
//! record checksum covers its offset, so right bytes written to the wrong place fail
//! validation (a misdirected write) instead of being served as someone else's messages.
//!
//! The epoch is per batch, not per record: a replicated log tells by it which leader wrote a
//! batch (a follower's tail of an older epoch is what a new leader may truncate). Format 1 had
//! no room for it covered by the checksum (its spare word follows the checksum), hence the
//! longer header of format 2. Epoch 0 is reserved for the batches of format 1, so a header
//! says its own length by its epoch and the index (`BatchHeader`) needs no version field.
//!
//! `FLAG_WRITTEN_AHEAD` marks a batch whose write was issued while the commit before it was
//! still in flight: if the power fails, it may be on the disk where the one before is not.
//! Recovery then tells that hole (an unacknowledged commit and its unacknowledged successor)
//! from damage in the middle of the log by it. Files written before the flag existed hold
//! only zero flags, which read the same.

use crate::ids::Offset;

pub const BLOCK_BYTES: usize = 4096;
/// The header batches are written with (format 2).
pub const BATCH_HEADER_BYTES: usize = 40;
/// The header of format 1, still read.
pub const BATCH_HEADER_BYTES_EPOCHLESS: usize = 32;
pub const RECORD_HEADER_BYTES: usize = 32;
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"RPB1");
/// The format batches are written in: with an epoch.
pub const FORMAT_VERSION: u16 = 2;
/// The format before epochs, read as epoch 0.
pub const FORMAT_VERSION_EPOCHLESS: u16 = 1;
/// The epoch of every batch of format 1; no batch of format 2 has it.
pub const EPOCH_NONE: u64 = 0;
/// Batch header flag: the batch's write was issued before the one of the batch before it had
/// completed.
pub const FLAG_WRITTEN_AHEAD: u16 = 1;

const _: () = assert!(BLOCK_BYTES.is_multiple_of(512), "blocks must be whole sectors for O_DIRECT");
const _: () = assert!(BATCH_HEADER_BYTES.is_multiple_of(8) && RECORD_HEADER_BYTES.is_multiple_of(8));
const _: () = assert!(BATCH_HEADER_BYTES_EPOCHLESS.is_multiple_of(8));

pub fn align_up(value: usize, alignment: usize) -> usize {
    value.div_ceil(alignment) * alignment
}

/// A message as the log stores it, before it has an offset.
pub struct NewRecord<'a> {
    pub data: &'a [u8],
    pub attributes: &'a [(&'a str, &'a str)],
    pub ordering_key: &'a str,
}

/// Bytes a record takes in a batch, padding included.
pub fn record_bytes(
    data: usize,
    attributes: impl Iterator<Item = (usize, usize)>,
    ordering_key: usize,
) -> usize {
    let attributes: usize = attributes.map(|(key, value)| 4 + key + value).sum();
    align_up(RECORD_HEADER_BYTES + ordering_key + attributes + data, 8)
}

/// Appends a record to `out` with offset and checksum left zero: the offset is only known at
/// commit time, when `seal_records` fills both in.
pub fn encode_record_unsealed(
    out: &mut Vec<u8>,
    publish_time_ms: u64,
    data: &[u8],
    attributes: &mut dyn ExactSizeIterator<Item = (&str, &str)>,
    ordering_key: &str,
) {
    let attributes: Vec<(&str, &str)> = attributes.collect();
    let bytes = record_bytes(
        data.len(),
        attributes.iter().map(|(key, value)| (key.len(), value.len())),
        ordering_key.len(),
    );
    let start = out.len();
    out.resize(start + bytes, 0);
    encode_record_into(&mut out[start..], publish_time_ms, data, &mut attributes.into_iter(), ordering_key);
}

/// Writes a record at the start of `out`, as `encode_record_unsealed` appends it, and returns
/// its length, padding included (`record_bytes`; `out` must be at least that long). For records
/// encoded straight into a commit's buffer.
pub fn encode_record_into(
    out: &mut [u8],
    publish_time_ms: u64,
    data: &[u8],
    attributes: &mut dyn ExactSizeIterator<Item = (&str, &str)>,
    ordering_key: &str,
) -> usize {
    let attribute_count = attributes.len();
    let mut at = RECORD_HEADER_BYTES;
    let mut put = |at: &mut usize, bytes: &[u8]| {
        out[*at..*at + bytes.len()].copy_from_slice(bytes);
        *at += bytes.len();
    };
    put(&mut at, ordering_key.as_bytes());
    for (key, value) in attributes {
        put(&mut at, &(key.len() as u16).to_le_bytes());
        put(&mut at, &(value.len() as u16).to_le_bytes());
        put(&mut at, key.as_bytes());
        put(&mut at, value.as_bytes());
    }
    put(&mut at, data);
    let unpadded = at;
    let padded = align_up(unpadded, 8);
    out[unpadded..padded].fill(0);
    let header = &mut out[..RECORD_HEADER_BYTES];
    header[0..4].copy_from_slice(&(unpadded as u32).to_le_bytes());
    // Checksum and offset: `seal_records` fills them in.
    header[4..16].fill(0);
    header[16..24].copy_from_slice(&publish_time_ms.to_le_bytes());
    header[24..28].copy_from_slice(&(data.len() as u32).to_le_bytes());
    header[28..30].copy_from_slice(&(attribute_count as u16).to_le_bytes());
    header[30..32].copy_from_slice(&(ordering_key.len() as u16).to_le_bytes());
    padded
}

/// Gives each record in `records` its offset (from `base_offset` up) and its checksum. Returns
/// the number of records.
pub fn seal_records(log_id: u64, records: &mut [u8], base_offset: u64) -> u32 {
    let mut position = 0;
    let mut offset = base_offset;
    while position < records.len() {
        let unpadded = u32::from_le_bytes(records[position..position + 4].try_into().unwrap()) as usize;
        records[position + 8..position + 16].copy_from_slice(&offset.to_le_bytes());
        let crc = record_crc(log_id, &records[position + 8..position + unpadded]);
        records[position + 4..position + 8].copy_from_slice(&crc.to_le_bytes());
        position += align_up(unpadded, 8);
        offset += 1;
    }
    (offset - base_offset) as u32
}

/// The newest publish time among unsealed or sealed records laid end to end.
pub fn newest_publish_ms(records: &[u8]) -> u64 {
    let mut newest = 0;
    let mut position = 0;
    while position + RECORD_HEADER_BYTES <= records.len() {
        let unpadded = u32::from_le_bytes(records[position..position + 4].try_into().unwrap()) as usize;
        newest = newest.max(u64::from_le_bytes(records[position + 16..position + 24].try_into().unwrap()));
        position += align_up(unpadded.max(RECORD_HEADER_BYTES), 8);
    }
    newest
}

fn record_crc(log_id: u64, covered: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&log_id.to_le_bytes()), covered)
}

/// The header checksum over (log, segment, position) and the header's first `covered` bytes.
fn header_crc(log_id: u64, segment_base: u64, file_position: u64, header: &[u8], covered: usize) -> u32 {
    let mut place = [0u8; 24];
    place[0..8].copy_from_slice(&log_id.to_le_bytes());
    place[8..16].copy_from_slice(&segment_base.to_le_bytes());
    place[16..24].copy_from_slice(&file_position.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&place), &header[0..covered])
}

/// Bytes a batch with `records_bytes` of records takes on disk.
pub fn batch_disk_bytes(records_bytes: usize) -> usize {
    align_up(BATCH_HEADER_BYTES + records_bytes, BLOCK_BYTES)
}

/// Writes a batch header (format 2) into the first `BATCH_HEADER_BYTES` of `out`; `place` is
/// (log id, segment base, file position), `flags` is `FLAG_WRITTEN_AHEAD` or 0.
pub fn encode_batch_header_flagged(out: &mut [u8], place: (u64, u64, u64), batch: &BatchHeader, flags: u16) {
    assert!(batch.epoch != EPOCH_NONE, "epoch 0 is the epoch of format 1's batches");
    let (log_id, segment_base, file_position) = place;
    out[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&flags.to_le_bytes());
    out[8..16].copy_from_slice(&batch.base_offset.to_le_bytes());
    out[16..20].copy_from_slice(&batch.record_count.to_le_bytes());
    out[20..24].copy_from_slice(&batch.records_bytes.to_le_bytes());
    out[24..32].copy_from_slice(&batch.epoch.to_le_bytes());
    let crc = header_crc(log_id, segment_base, file_position, out, 32);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
    out[36..40].copy_from_slice(&0u32.to_le_bytes());
}

/// Writes a batch header of format 1 (no epoch) into the first `BATCH_HEADER_BYTES_EPOCHLESS`
/// of `out`: what the log wrote before epochs, for the tests that open such data.
#[cfg(test)]
pub fn encode_batch_header_epochless(
    out: &mut [u8],
    log_id: u64,
    segment_base: u64,
    file_position: u64,
    base_offset: u64,
    record_count: u32,
    records_bytes: u32,
) {
    out[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&FORMAT_VERSION_EPOCHLESS.to_le_bytes());
    out[6..8].copy_from_slice(&0u16.to_le_bytes());
    out[8..16].copy_from_slice(&base_offset.to_le_bytes());
    out[16..20].copy_from_slice(&record_count.to_le_bytes());
    out[20..24].copy_from_slice(&records_bytes.to_le_bytes());
    let crc = header_crc(log_id, segment_base, file_position, out, 24);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out[28..32].copy_from_slice(&0u32.to_le_bytes());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: u64,
    pub record_count: u32,
    pub records_bytes: u32,
    /// The leader term the batch was written in; `EPOCH_NONE` for a batch of format 1.
    pub epoch: u64,
}

impl BatchHeader {
    /// Bytes of the header on disk: its records start there.
    pub fn header_bytes(&self) -> usize {
        if self.epoch == EPOCH_NONE {
            BATCH_HEADER_BYTES_EPOCHLESS
        } else {
            BATCH_HEADER_BYTES
        }
    }
    pub fn disk_bytes(&self) -> usize {
        align_up(self.header_bytes() + self.records_bytes as usize, BLOCK_BYTES)
    }
    pub fn end_offset(&self) -> u64 {
        self.base_offset + self.record_count as u64
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Only zeros: the end of what was ever written here.
    #[error("no batch here (zeros)")]
    Empty,
    #[error("batch header is invalid: {0}")]
    BadHeader(&'static str),
    #[error("record {index} of the batch fails validation: {reason}")]
    BadRecord { index: u32, reason: &'static str },
}

/// Checks a batch header found at `file_position` of the segment starting at `segment_base`.
pub fn decode_batch_header(
    bytes: &[u8],
    log_id: u64,
    segment_base: u64,
    file_position: u64,
) -> Result<BatchHeader, BatchError> {
    if bytes.len() < BATCH_HEADER_BYTES_EPOCHLESS {
        return Err(BatchError::BadHeader("truncated"));
    }
    let header = &bytes[..BATCH_HEADER_BYTES_EPOCHLESS.max(bytes.len().min(BATCH_HEADER_BYTES))];
    if header.iter().all(|byte| *byte == 0) {
        return Err(BatchError::Empty);
    }
    if u32::from_le_bytes(header[0..4].try_into().unwrap()) != BATCH_MAGIC {
        return Err(BatchError::BadHeader("bad magic"));
    }
    // The version is checked once the checksum has held: a flipped bit there is damage.
    let version = u16::from_le_bytes(header[4..6].try_into().unwrap());
    let (covered, crc_at) = match version {
        FORMAT_VERSION if header.len() >= BATCH_HEADER_BYTES => (32, 32),
        FORMAT_VERSION => return Err(BatchError::BadHeader("truncated")),
        _ => (24, 24),
    };
    let stored_crc = u32::from_le_bytes(header[crc_at..crc_at + 4].try_into().unwrap());
    if stored_crc != header_crc(log_id, segment_base, file_position, header, covered) {
        return Err(BatchError::BadHeader("checksum mismatch (corrupt or misplaced)"));
    }
    if batch_flags(header) & !FLAG_WRITTEN_AHEAD != 0 || header[crc_at + 4..crc_at + 8] != [0, 0, 0, 0] {
        return Err(BatchError::BadHeader("reserved bytes are not zero"));
    }
    let epoch = match version {
        FORMAT_VERSION => u64::from_le_bytes(header[24..32].try_into().unwrap()),
        FORMAT_VERSION_EPOCHLESS => EPOCH_NONE,
        _ => return Err(BatchError::BadHeader("unknown format version")),
    };
    if version == FORMAT_VERSION && epoch == EPOCH_NONE {
        return Err(BatchError::BadHeader("epoch 0 in a header of format 2"));
    }
    let batch = BatchHeader {
        base_offset: u64::from_le_bytes(header[8..16].try_into().unwrap()),
        record_count: u32::from_le_bytes(header[16..20].try_into().unwrap()),
        records_bytes: u32::from_le_bytes(header[20..24].try_into().unwrap()),
        epoch,
    };
    if batch.record_count == 0
        || (batch.records_bytes as usize) < batch.record_count as usize * RECORD_HEADER_BYTES
    {
        return Err(BatchError::BadHeader("impossible record count or size"));
    }
    Ok(batch)
}

/// The flags of a batch header (its first `BATCH_HEADER_BYTES`), meaningful once
/// `decode_batch_header` accepted it.
pub fn batch_flags(header: &[u8]) -> u16 {
    u16::from_le_bytes(header[6..8].try_into().unwrap())
}

/// One record read in place from a validated batch.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    pub offset: Offset,
    pub publish_time_ms: u64,
    pub ordering_key: &'a str,
    attributes: &'a [u8],
    attribute_count: u16,
    pub data: &'a [u8],
}

impl<'a> RecordView<'a> {
    pub fn attributes(&self) -> AttributeIter<'a> {
        AttributeIter { bytes: self.attributes, remaining: self.attribute_count }
    }
    pub fn attribute_count(&self) -> usize {
        self.attribute_count as usize
    }
}

#[derive(Clone)]
pub struct AttributeIter<'a> {
    bytes: &'a [u8],
    remaining: u16,
}

impl<'a> AttributeIter<'a> {
    /// The `count` attributes encoded in `bytes`, a record's attribute bytes as a validated
    /// batch holds them (for a view kept as positions in its batch and read again later).
    pub fn over(bytes: &'a [u8], count: u16) -> AttributeIter<'a> {
        AttributeIter { bytes, remaining: count }
    }
}

impl<'a> Iterator for AttributeIter<'a> {
    type Item = (&'a str, &'a str);
    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        // The layout was checked when the batch was validated, so these slices are in bounds.
        let key_bytes = u16::from_le_bytes([self.bytes[0], self.bytes[1]]) as usize;
        let value_bytes = u16::from_le_bytes([self.bytes[2], self.bytes[3]]) as usize;
        let key = std::str::from_utf8(&self.bytes[4..4 + key_bytes]).unwrap_or("");
        let value =
            std::str::from_utf8(&self.bytes[4 + key_bytes..4 + key_bytes + value_bytes]).unwrap_or("");
        self.bytes = &self.bytes[4 + key_bytes + value_bytes..];
        self.remaining -= 1;
        Some((key, value))
    }
}

/// Validates every record of a batch whose header already passed `decode_batch_header`, and
/// returns them. `bytes` starts at the batch header. All or nothing: a batch is one group
/// commit, synced together, so one bad record means the batch was never acknowledged whole
/// (a torn write) or has rotted.
pub fn decode_batch<'a>(
    bytes: &'a [u8],
    log_id: u64,
    header: &BatchHeader,
) -> Result<Vec<RecordView<'a>>, BatchError> {
    decode_batch_checked(bytes, log_id, header, true)
}

/// `decode_batch`, optionally without the record checksums: for batches the log itself holds in
/// memory since it wrote them (the tail cache), which never passed through a disk. Every length
/// and offset is still checked, so the parse stays in bounds either way.
pub fn decode_batch_checked<'a>(
    bytes: &'a [u8],
    log_id: u64,
    header: &BatchHeader,
    verify_checksums: bool,
) -> Result<Vec<RecordView<'a>>, BatchError> {
    decode_batch_range(bytes, log_id, header, verify_checksums, 0..u64::MAX)
}

/// `decode_batch_checked` for the records whose offsets are in `wanted` only: the others are
/// stepped over by their lengths (still checked to stay in bounds) and not parsed, and the
/// walk stops after the last wanted one. A reader taking a quarter of a large batch per pull
/// (a subscription's flow-control window) parsed the whole batch four times.
pub fn decode_batch_range<'a>(
    bytes: &'a [u8],
    log_id: u64,
    header: &BatchHeader,
    verify_checksums: bool,
    wanted: std::ops::Range<u64>,
) -> Result<Vec<RecordView<'a>>, BatchError> {
    let end = header.header_bytes() + header.records_bytes as usize;
    if bytes.len() < end {
        return Err(BatchError::BadRecord { index: 0, reason: "batch extends past the bytes read" });
    }
    decode_records(&bytes[header.header_bytes()..end], log_id, header, verify_checksums, wanted)
}

/// `decode_batch_range` on a batch's records alone (`records`, exactly its `records_bytes`):
/// what a batch read from disk and records received from another replica share.
fn decode_records<'a>(
    bytes: &'a [u8],
    log_id: u64,
    header: &BatchHeader,
    verify_checksums: bool,
    wanted: std::ops::Range<u64>,
) -> Result<Vec<RecordView<'a>>, BatchError> {
    let end = bytes.len();
    let first = wanted.start.saturating_sub(header.base_offset).min(header.record_count as u64) as u32;
    let last = wanted.end.saturating_sub(header.base_offset).min(header.record_count as u64) as u32;
    let mut records = Vec::with_capacity(last.saturating_sub(first) as usize);
    let mut position = 0;
    for index in 0..last {
        let bad = |reason| BatchError::BadRecord { index, reason };
        if position + RECORD_HEADER_BYTES > end {
            return Err(bad("record header past the end of the batch"));
        }
        let record = &bytes[position..end];
        let unpadded = u32::from_le_bytes(record[0..4].try_into().unwrap()) as usize;
        if unpadded < RECORD_HEADER_BYTES || unpadded > record.len() {
            return Err(bad("record length out of bounds"));
        }
        if index < first {
            position += align_up(unpadded, 8);
            continue;
        }
        let stored_crc = u32::from_le_bytes(record[4..8].try_into().unwrap());
        if verify_checksums && stored_crc != record_crc(log_id, &record[8..unpadded]) {
            return Err(bad("checksum mismatch"));
        }
        let offset = u64::from_le_bytes(record[8..16].try_into().unwrap());
        if offset != header.base_offset + index as u64 {
            return Err(bad("offset does not follow the batch's base offset"));
        }
        let publish_time_ms = u64::from_le_bytes(record[16..24].try_into().unwrap());
        let data_bytes = u32::from_le_bytes(record[24..28].try_into().unwrap()) as usize;
        let attribute_count = u16::from_le_bytes(record[28..30].try_into().unwrap());
        let ordering_key_bytes = u16::from_le_bytes(record[30..32].try_into().unwrap()) as usize;
        let body = &record[RECORD_HEADER_BYTES..unpadded];
        if ordering_key_bytes + data_bytes > body.len() {
            return Err(bad("field lengths exceed the record"));
        }
        let ordering_key =
            std::str::from_utf8(&body[..ordering_key_bytes]).map_err(|_| bad("ordering key is not UTF-8"))?;
        let attributes_end = body.len() - data_bytes;
        let attributes = &body[ordering_key_bytes..attributes_end];
        let mut cursor = 0;
        for _ in 0..attribute_count {
            if cursor + 4 > attributes.len() {
                return Err(bad("attribute header past the end"));
            }
            let key_bytes = u16::from_le_bytes([attributes[cursor], attributes[cursor + 1]]) as usize;
            let value_bytes = u16::from_le_bytes([attributes[cursor + 2], attributes[cursor + 3]]) as usize;
            let next = cursor + 4 + key_bytes + value_bytes;
            if next > attributes.len() {
                return Err(bad("attribute past the end"));
            }
            if std::str::from_utf8(&attributes[cursor + 4..next]).is_err() {
                return Err(bad("attribute is not UTF-8"));
            }
            cursor = next;
        }
        if cursor != attributes.len() {
            return Err(bad("attribute bytes do not add up"));
        }
        if record[unpadded..align_up(unpadded, 8).min(record.len())].iter().any(|byte| *byte != 0) {
            return Err(bad("padding is not zero"));
        }
        records.push(RecordView {
            offset: Offset::new(offset),
            publish_time_ms,
            ordering_key,
            attributes,
            attribute_count,
            data: &body[attributes_end..],
        });
        position += align_up(unpadded, 8);
    }
    if last == header.record_count && position != end {
        return Err(BatchError::BadRecord {
            index: header.record_count,
            reason: "trailing bytes in the batch",
        });
    }
    Ok(records)
}

/// Checks records sealed elsewhere (another replica's batch, received over the network) before
/// they are appended: `record_count` of them exactly filling `records`, each laid out within
/// bounds, at the offsets from `base_offset` on, passing its checksum for log `log_id`.
pub fn check_sealed_records(
    records: &[u8],
    log_id: u64,
    base_offset: u64,
    record_count: u32,
) -> Result<(), BatchError> {
    let header = BatchHeader { base_offset, record_count, records_bytes: records.len() as u32, epoch: 1 };
    if records.len() > u32::MAX as usize {
        return Err(BatchError::BadRecord { index: 0, reason: "more record bytes than a batch holds" });
    }
    // Read where they lie: a replica's records are checked without a copy.
    decode_records(records, log_id, &header, true, 0..u64::MAX).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestMessage<'a> = (&'a [u8], Vec<(&'a str, &'a str)>, &'a str);

    fn build(log_id: u64, base_offset: u64, messages: &[TestMessage]) -> Vec<u8> {
        let mut records = Vec::new();
        for (data, attributes, key) in messages {
            encode_record_unsealed(&mut records, 1234, data, &mut attributes.iter().copied(), key);
        }
        let count = seal_records(log_id, &mut records, base_offset);
        let mut batch = vec![0u8; batch_disk_bytes(records.len())];
        let header =
            BatchHeader { base_offset, record_count: count, records_bytes: records.len() as u32, epoch: 3 };
        encode_batch_header_flagged(&mut batch, (log_id, 0, 8192), &header, 0);
        batch[BATCH_HEADER_BYTES..BATCH_HEADER_BYTES + records.len()].copy_from_slice(&records);
        batch
    }

    /// The same batch in format 1, as the log wrote it before epochs.
    fn build_epochless(log_id: u64, base_offset: u64, messages: &[TestMessage]) -> Vec<u8> {
        let mut records = Vec::new();
        for (data, attributes, key) in messages {
            encode_record_unsealed(&mut records, 1234, data, &mut attributes.iter().copied(), key);
        }
        let count = seal_records(log_id, &mut records, base_offset);
        let mut batch = vec![0u8; align_up(BATCH_HEADER_BYTES_EPOCHLESS + records.len(), BLOCK_BYTES)];
        encode_batch_header_epochless(&mut batch, log_id, 0, 8192, base_offset, count, records.len() as u32);
        let at = BATCH_HEADER_BYTES_EPOCHLESS;
        batch[at..at + records.len()].copy_from_slice(&records);
        batch
    }

    #[test]
    fn epoch_round_trips_and_format_1_reads_as_epoch_0() {
        let batch = build(7, 100, &[(b"hello", vec![("k", "v")], "key")]);
        let header = decode_batch_header(&batch, 7, 0, 8192).unwrap();
        assert_eq!((header.epoch, header.header_bytes()), (3, BATCH_HEADER_BYTES));
        let old = build_epochless(7, 100, &[(b"hello", vec![("k", "v")], "key")]);
        let old_header = decode_batch_header(&old, 7, 0, 8192).unwrap();
        assert_eq!((old_header.epoch, old_header.header_bytes()), (EPOCH_NONE, BATCH_HEADER_BYTES_EPOCHLESS));
        let records = decode_batch(&old, 7, &old_header).unwrap();
        assert_eq!((records[0].offset.get(), records[0].data), (100, &b"hello"[..]));
        // Every bit of the old header is still covered.
        for byte in 0..BATCH_HEADER_BYTES_EPOCHLESS {
            let mut copy = old.clone();
            copy[byte] ^= 0x04;
            let result = decode_batch_header(&copy, 7, 0, 8192)
                .and_then(|header| decode_batch(&copy, 7, &header).map(|_| ()));
            assert!(result.is_err(), "flip at byte {byte} of a format 1 header went unnoticed");
        }
    }

    #[test]
    fn batch_round_trip() {
        let batch = build(
            7,
            100,
            &[(b"hello", vec![("k", "v"), ("region", "eu")], "key"), (b"", vec![("a", "")], "")],
        );
        assert_eq!(batch.len() % BLOCK_BYTES, 0);
        let header = decode_batch_header(&batch, 7, 0, 8192).unwrap();
        assert_eq!(header.base_offset, 100);
        assert_eq!(header.record_count, 2);
        assert_eq!(header.epoch, 3);
        let records = decode_batch(&batch, 7, &header).unwrap();
        assert_eq!(records[0].offset.get(), 100);
        assert_eq!(records[0].data, b"hello");
        assert_eq!(records[0].ordering_key, "key");
        assert_eq!(records[0].attributes().collect::<Vec<_>>(), vec![("k", "v"), ("region", "eu")]);
        assert_eq!(records[1].offset.get(), 101);
        assert_eq!(records[1].attributes().collect::<Vec<_>>(), vec![("a", "")]);
    }

    #[test]
    fn misplaced_batch_is_refused() {
        let batch = build(7, 100, &[(b"hello", vec![], "")]);
        assert!(decode_batch_header(&batch, 7, 0, 4096).is_err(), "other file position");
        assert!(decode_batch_header(&batch, 8, 0, 8192).is_err(), "other log");
        assert!(decode_batch_header(&batch, 7, 64, 8192).is_err(), "other segment");
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let batch = build(7, 100, &[(b"hello world", vec![("k", "v")], "key")]);
        let used = BATCH_HEADER_BYTES + align_up(RECORD_HEADER_BYTES + 3 + 4 + 2 + 11, 8);
        for byte in 0..used {
            for bit in 0..8 {
                let mut copy = batch.clone();
                copy[byte] ^= 1 << bit;
                let result = decode_batch_header(&copy, 7, 0, 8192)
                    .and_then(|header| decode_batch(&copy, 7, &header).map(|records| records.len()));
                assert!(result.is_err(), "flip at byte {byte} bit {bit} went unnoticed");
            }
        }
    }

    #[test]
    fn zeros_are_empty() {
        assert_eq!(decode_batch_header(&[0u8; 64], 1, 0, 0), Err(BatchError::Empty));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..9000),
            from in 0u64..40,
            to in 0u64..40,
        ) {
            if let Ok(header) = decode_batch_header(&bytes, 1, 0, 0) {
                let _ = decode_batch(&bytes, 1, &header);
                let _ = decode_batch_range(&bytes, 1, &header, true, from..to);
            }
        }

        /// A range decodes exactly the records of the whole decode that fall in it.
        #[test]
        fn a_range_is_the_whole_batch_filtered(
            sizes in proptest::collection::vec(0usize..300, 1..40),
            from in 90u64..150,
            length in 0u64..50,
        ) {
            let payloads: Vec<Vec<u8>> = sizes.iter().map(|size| vec![b'x'; *size]).collect();
            let messages: Vec<TestMessage> =
                payloads.iter().map(|payload| (payload.as_slice(), vec![("k", "v")], "key")).collect();
            let batch = build(7, 100, &messages);
            let header = decode_batch_header(&batch, 7, 0, 8192).unwrap();
            let whole = decode_batch(&batch, 7, &header).unwrap();
            let wanted = from..from + length;
            let expected: Vec<(u64, &[u8])> = whole
                .iter()
                .filter(|record| wanted.contains(&record.offset.get()))
                .map(|record| (record.offset.get(), record.data))
                .collect();
            let ranged = decode_batch_range(&batch, 7, &header, true, wanted).unwrap();
            let got: Vec<(u64, &[u8])> = ranged.iter().map(|record| (record.offset.get(), record.data)).collect();
            proptest::prop_assert_eq!(got, expected);
        }
    }
}
