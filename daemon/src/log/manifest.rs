//! The manifest: which segments a log has, kept in two slot files per copy (`manifest-0`,
//! `manifest-1`). Sequence n is written to slot n % 2, so a torn manifest write leaves the
//! previous one intact in the other slot; recovery takes the newest valid one across all
//! copies. It lets recovery tell a lost segment file (a directory entry that never became
//! durable, a deleted file) from a log that never had it.
//!
//! ```text
//! 0 magic "RPM1"  4 total_bytes u32  8 sequence u64  16 log_id u64  24 segment_count u32
//! 28 reserved u32  32 (base_offset u64, capacity_bytes u64) per segment ...  then crc32c u32
//! ```
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
        let total = HEADER_BYTES + 16 * self.segments.len() + 4;
        let mut bytes = vec![0u8; align_up(total, BLOCK_BYTES)];
        bytes[0..4].copy_from_slice(&MANIFEST_MAGIC.to_le_bytes());
        bytes[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        bytes[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        bytes[16..24].copy_from_slice(&log_id.to_le_bytes());
        bytes[24..28].copy_from_slice(&(self.segments.len() as u32).to_le_bytes());
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
        if HEADER_BYTES + 16 * count + 4 != total {
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
        Some(Manifest { sequence: u64::from_le_bytes(bytes[8..16].try_into().unwrap()), segments })
    }

    /// Bytes to read to see a whole manifest of this many segments.
    pub fn bytes_for(segments: usize) -> usize {
        align_up(HEADER_BYTES + 16 * segments + 4, BLOCK_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let listed = |base_offset, capacity, recycled| Listed { base_offset, capacity, recycled };
        let manifest =
            Manifest { sequence: 7, segments: vec![listed(0, 1 << 20, false), listed(1000, 2 << 20, true)] };
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
        };
        assert_eq!(Manifest::decode(&big.encode(1), 1), Some(big));
    }
}
