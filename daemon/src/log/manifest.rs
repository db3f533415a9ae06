//! The manifest: which segments a log has, kept in two slot files per copy (`manifest-0`,
//! `manifest-1`). Sequence n is written to slot n % 2, so a torn manifest write leaves the
//! previous one intact in the other slot; recovery takes the newest valid one across all
//! copies. It lets recovery tell a lost segment file (a directory entry that never became
//! durable, a deleted file) from a log that never had it.
//!
//! ```text
//! 0 magic "RPM1"  4 total_bytes u32  8 sequence u64  16 log_id u64  24 segment_count u32
//! 28 flags u32 (bit 0: a truncation is in progress)  32 (base_offset u64, capacity_bytes u64)
//! per segment ...  then, with flag bit 0, truncated_end u64  then crc32c u32
//! ```
//!
//! A manifest with `truncated_end` is written before a truncation of the log's tail
//! (`Log::truncate_after`) zeroes anything: recovery then discards every batch at or above
//! that offset, so that a crash in the middle of the zeroing never brings a removed batch back.
//! The truncation writes the next manifest without it once the zeros are durable. Manifests
//! written before the flag existed hold zero flags.
//!
//! Capacities are whole blocks, so bit 0 of `capacity_bytes` is free: set, it says the segment's
//! file is a recycled one (see `Log::remove_oldest`), which may hold an earlier segment's bytes
//! beyond the end of its own batches. Recovery then takes the first position that holds no
//! valid batch as the segment's end, as it takes zeros in a fresh file.

use super::record::{align_up, BLOCK_BYTES};

pub const MANIFEST_MAGIC: u32 = u32::from_le_bytes(*b"RPM1");
pub const MANIFEST_SLOTS: [&str; 2] = ["manifest-0", "manifest-1"];
const HEADER_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub sequence: u64,
    /// Every segment, in order.
    pub segments: Vec<Listed>,
    /// Set while a truncation is in progress: the log ends at this offset, whatever the
    /// segments still hold beyond it.
    pub truncated_end: Option<u64>,
    /// The epoch this log promised (a replica's answer to a fencing round): no append of an
    /// older epoch is taken, across restarts. 0: none.
    pub promised_epoch: u64,
}

/// A segment as the manifest lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Listed {
    pub base_offset: u64,
    pub capacity: u64,
    /// The file was a deleted segment's, renamed: bytes of its earlier life may follow the
    /// segment's own batches.
    pub recycled: bool,
}

/// Bit 0 of an encoded capacity: the segment is recycled.
const RECYCLED_BIT: u64 = 1;
/// Bit 0 of the flags: `truncated_end` follows the segment list.
const FLAG_TRUNCATING: u32 = 1;
/// Bit 1 of the flags: `promised_epoch` follows (after `truncated_end`, if any).
const FLAG_PROMISED: u32 = 2;

impl Manifest {
    /// The slot this manifest is written to.
    pub fn slot(&self) -> &'static str {
        Manifest::slot_for(self.sequence)
    }

    /// The slot the manifest of this sequence number goes to.
    pub fn slot_for(sequence: u64) -> &'static str {
        MANIFEST_SLOTS[(sequence % 2) as usize]
    }

    /// The encoded manifest, padded to whole blocks for direct I/O.
    pub fn encode(&self, log_id: u64) -> Vec<u8> {
        let promised = self.promised_epoch != 0;
        let total = Manifest::encoded_bytes(self.segments.len(), self.truncated_end.is_some(), promised);
        let mut bytes = vec![0u8; align_up(total, BLOCK_BYTES)];
        bytes[0..4].copy_from_slice(&MANIFEST_MAGIC.to_le_bytes());
        bytes[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        bytes[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        bytes[16..24].copy_from_slice(&log_id.to_le_bytes());
        bytes[24..28].copy_from_slice(&(self.segments.len() as u32).to_le_bytes());
        let flags = if self.truncated_end.is_some() { FLAG_TRUNCATING } else { 0 }
            | if promised { FLAG_PROMISED } else { 0 };
        bytes[28..32].copy_from_slice(&flags.to_le_bytes());
        let mut at = HEADER_BYTES + 16 * self.segments.len();
        if let Some(end) = self.truncated_end {
            bytes[at..at + 8].copy_from_slice(&end.to_le_bytes());
            at += 8;
        }
        if promised {
            bytes[at..at + 8].copy_from_slice(&self.promised_epoch.to_le_bytes());
        }
        for (index, listed) in self.segments.iter().enumerate() {
            let at = HEADER_BYTES + 16 * index;
            debug_assert!(listed.capacity.is_multiple_of(BLOCK_BYTES as u64));
            let capacity = listed.capacity | if listed.recycled { RECYCLED_BIT } else { 0 };
            bytes[at..at + 8].copy_from_slice(&listed.base_offset.to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&capacity.to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes[..total - 4]);
        bytes[total - 4..total].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The manifest in `bytes`, if they hold a valid one for this log.
    pub fn decode(bytes: &[u8], log_id: u64) -> Option<Manifest> {
        if bytes.len() < HEADER_BYTES + 4
            || u32::from_le_bytes(bytes[0..4].try_into().unwrap()) != MANIFEST_MAGIC
        {
            return None;
        }
        let total = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
        if total < HEADER_BYTES + 4 || total > bytes.len() {
            return None;
        }
        let crc = u32::from_le_bytes(bytes[total - 4..total].try_into().unwrap());
        if crc != crc32c::crc32c(&bytes[..total - 4]) {
            return None;
        }
        if u64::from_le_bytes(bytes[16..24].try_into().unwrap()) != log_id {
            return None;
        }
        let count = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
        let flags = u32::from_le_bytes(bytes[28..32].try_into().unwrap());
        let (truncating, promised) = (flags & FLAG_TRUNCATING != 0, flags & FLAG_PROMISED != 0);
        if flags & !(FLAG_TRUNCATING | FLAG_PROMISED) != 0
            || Manifest::encoded_bytes(count, truncating, promised) != total
        {
            return None;
        }
        let mut at = HEADER_BYTES + 16 * count;
        let mut word = || {
            let value = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            at += 8;
            value
        };
        let truncated_end = truncating.then(&mut word);
        let promised_epoch = if promised { word() } else { 0 };
        if promised && promised_epoch == 0 {
            return None;
        }
        let segments = (0..count)
            .map(|index| {
                let at = HEADER_BYTES + 16 * index;
                let capacity = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
                Listed {
                    base_offset: u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()),
                    capacity: capacity & !RECYCLED_BIT,
                    recycled: capacity & RECYCLED_BIT != 0,
                }
            })
            .collect();
        Some(Manifest {
            sequence: u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
            segments,
            truncated_end,
            promised_epoch,
        })
    }

    /// Bytes a manifest of this many segments takes, its checksum included.
    fn encoded_bytes(segments: usize, truncating: bool, promised: bool) -> usize {
        HEADER_BYTES + 16 * segments + if truncating { 8 } else { 0 } + if promised { 8 } else { 0 } + 4
    }

    /// Bytes to read to see a whole manifest of this many segments.
    pub fn bytes_for(segments: usize) -> usize {
        align_up(Manifest::encoded_bytes(segments, true, true), BLOCK_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let listed = |base_offset, capacity, recycled| Listed { base_offset, capacity, recycled };
        let manifest = Manifest {
            sequence: 7,
            segments: vec![listed(0, 1 << 20, false), listed(1000, 2 << 20, true)],
            truncated_end: None,
            promised_epoch: 0,
        };
        let bytes = manifest.encode(42);
        assert_eq!(bytes.len(), BLOCK_BYTES);
        assert_eq!(Manifest::decode(&bytes, 42), Some(manifest.clone()));
        assert_eq!(Manifest::decode(&bytes, 43), None, "another log's manifest");
        for byte in 0..HEADER_BYTES + 36 {
            let mut copy = bytes.clone();
            copy[byte] ^= 0x10;
            assert_eq!(Manifest::decode(&copy, 42), None, "flip at {byte}");
        }
        assert_eq!(manifest.slot(), "manifest-1");
        let big = Manifest {
            sequence: 1,
            segments: (0..500).map(|i| listed(i * 10, 1 << 20, i % 3 == 0)).collect(),
            truncated_end: None,
            promised_epoch: 0,
        };
        assert_eq!(Manifest::decode(&big.encode(1), 1), Some(big));
        let truncating = Manifest { truncated_end: Some(1234), ..manifest.clone() };
        let bytes = truncating.encode(42);
        assert_eq!(Manifest::decode(&bytes, 42), Some(truncating));
        for byte in 0..HEADER_BYTES + 44 {
            let mut copy = bytes.clone();
            copy[byte] ^= 0x10;
            assert_eq!(Manifest::decode(&copy, 42), None, "flip at {byte} of a truncating manifest");
        }
        for truncated_end in [None, Some(1234)] {
            let promising = Manifest { truncated_end, promised_epoch: 9, ..manifest.clone() };
            let bytes = promising.encode(42);
            assert_eq!(Manifest::decode(&bytes, 42), Some(promising.clone()));
            let total = HEADER_BYTES + 32 + if truncated_end.is_some() { 8 } else { 0 } + 8 + 4;
            for byte in 0..total {
                let mut copy = bytes.clone();
                copy[byte] ^= 0x10;
                assert_eq!(Manifest::decode(&copy, 42), None, "flip at {byte} of a promising manifest");
            }
        }
    }
}
