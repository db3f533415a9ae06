//! Read-ahead for readers that go through a log in order: a subscription draining a backlog.
//!
//! A pull takes up to 1,000 messages, but group commit writes batches of up to 4 MiB, several
//! thousand 1 KiB messages. Without a cache every pull would read its whole batch from disk
//! again (and validate it again) to keep a third of it. So a log keeps the last few extents it
//! read — runs of whole batches, validated, read in one I/O — and as soon as a reader enters the
//! newest of them it reads the next one in the background, so the disk works while the reader's
//! messages cross the network. This module is the bookkeeping; `Log` does the reading.

use crate::sync::{Notified, Notify};
use std::collections::VecDeque;
use std::ops::Deref;
use std::rc::Rc;

/// Most bytes one extent reads (it always holds at least one whole batch, which may be larger):
/// a couple of group commits, large enough that the disk streams, small enough that an extent
/// is read in a few milliseconds.
pub const READ_AHEAD_BYTES: usize = 8 << 20;
/// Extents a log keeps: the one a reader is in, the one read ahead of it, and one for a second
/// reader a little behind.
pub const READ_AHEAD_EXTENTS_MAX: usize = 3;

/// Whole, validated batches of one segment, read in one I/O.
pub struct Extent<R> {
    pub segment_base: u64,
    /// Byte position of its first batch in the segment file.
    pub position: u64,
    /// Offsets of the records it holds: `base_offset..end_offset`.
    pub base_offset: u64,
    pub end_offset: u64,
    pub bytes: Rc<R>,
}

impl<R: Deref<Target = [u8]>> Extent<R> {
    fn byte_count(&self) -> usize {
        self.bytes.len()
    }
}

pub enum Lookup<R> {
    /// The batch is at `bytes[start..]`. `newest`: it lies in the newest extent, so it is time
    /// to read the next one.
    Hit {
        bytes: Rc<R>,
        start: usize,
        newest: bool,
    },
    /// A read in flight will bring it: wait, then look again.
    Pending(Notified),
    Miss,
}

pub struct ReadAhead<R> {
    extents: VecDeque<Extent<R>>,
    /// Offsets of the extent being read in the background.
    pending: Option<(u64, u64)>,
    arrived: Notify,
    /// A reader found something here since the last idle sweep.
    used: bool,
}

impl<R: Deref<Target = [u8]>> Default for ReadAhead<R> {
    fn default() -> Self {
        ReadAhead { extents: VecDeque::new(), pending: None, arrived: Notify::new(), used: false }
    }
}

impl<R: Deref<Target = [u8]>> ReadAhead<R> {
    /// Where the batch starting at `position` of segment `segment_base`, holding `offset`, is.
    pub fn lookup(&mut self, segment_base: u64, position: u64, offset: u64) -> Lookup<R> {
        let newest = self.extents.len().saturating_sub(1);
        for (index, extent) in self.extents.iter().enumerate() {
            if extent.segment_base == segment_base
                && (extent.base_offset..extent.end_offset).contains(&offset)
                && position >= extent.position
            {
                let start = (position - extent.position) as usize;
                if start < extent.byte_count() {
                    self.used = true;
                    return Lookup::Hit { bytes: extent.bytes.clone(), start, newest: index == newest };
                }
            }
        }
        match self.pending {
            Some((base, end)) if (base..end).contains(&offset) => Lookup::Pending(self.arrived.notified()),
            _ => Lookup::Miss,
        }
    }

    /// The offset the next extent would start at, unless one is being read already.
    pub fn next_to_read(&self) -> Option<u64> {
        match self.pending {
            Some(_) => None,
            None => self.extents.back().map(|extent| extent.end_offset),
        }
    }

    pub fn is_reading(&self) -> bool {
        self.pending.is_some()
    }

    pub fn start_reading(&mut self, base_offset: u64, end_offset: u64) {
        self.pending = Some((base_offset, end_offset));
    }

    /// The background read ended, with an extent or without (an error, or nothing to read):
    /// readers waiting for it look again, and read for themselves if it is not there.
    pub fn finish_reading(&mut self) {
        self.pending = None;
        self.arrived.notify_all();
    }

    /// Keeps an extent; returns the bytes of the extents it pushed out.
    pub fn insert(&mut self, extent: Extent<R>) -> usize {
        let mut dropped = 0;
        self.extents.retain(|old| {
            // Two readers raced for the same batches: keep one copy.
            let overlaps = old.segment_base == extent.segment_base
                && old.base_offset < extent.end_offset
                && extent.base_offset < old.end_offset;
            if overlaps {
                dropped += old.byte_count();
            }
            !overlaps
        });
        self.extents.push_back(extent);
        while self.extents.len() > READ_AHEAD_EXTENTS_MAX {
            dropped += self.extents.pop_front().map_or(0, |old| old.byte_count());
        }
        dropped
    }

    pub fn bytes(&self) -> usize {
        self.extents.iter().map(Extent::byte_count).sum()
    }

    /// Called by the idle sweep: whether no reader came since the last one (then the caller
    /// drops everything). Resets the mark.
    pub fn idle_since_last_sweep(&mut self) -> bool {
        !std::mem::take(&mut self.used) && self.pending.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(
        segment_base: u64,
        position: u64,
        base_offset: u64,
        end_offset: u64,
        len: usize,
    ) -> Extent<Vec<u8>> {
        Extent { segment_base, position, base_offset, end_offset, bytes: Rc::new(vec![0; len]) }
    }

    #[test]
    fn finds_a_batch_inside_an_extent_and_says_when_it_is_the_newest() {
        let mut cache = ReadAhead::default();
        assert_eq!(cache.insert(extent(0, 4096, 100, 200, 8192)), 0);
        assert_eq!(cache.insert(extent(0, 12288, 200, 300, 4096)), 0);
        match cache.lookup(0, 8192, 150) {
            Lookup::Hit { start, newest, .. } => assert_eq!((start, newest), (4096, false)),
            _ => panic!("expected a hit"),
        }
        match cache.lookup(0, 12288, 250) {
            Lookup::Hit { start, newest, .. } => assert_eq!((start, newest), (0, true)),
            _ => panic!("expected a hit"),
        }
        // The same offsets in another segment are another log's history: a miss.
        assert!(matches!(cache.lookup(1 << 20, 8192, 150), Lookup::Miss));
        assert!(matches!(cache.lookup(0, 16384, 300), Lookup::Miss));
        assert_eq!(cache.next_to_read(), Some(300));
    }

    #[test]
    fn a_pending_read_makes_readers_wait_and_then_look_again() {
        let mut cache: ReadAhead<Vec<u8>> = ReadAhead::default();
        cache.start_reading(0, 100);
        assert!(cache.is_reading());
        assert_eq!(cache.next_to_read(), None);
        assert!(matches!(cache.lookup(0, 0, 50), Lookup::Pending(_)));
        assert!(matches!(cache.lookup(0, 0, 100), Lookup::Miss));
        cache.finish_reading();
        assert!(matches!(cache.lookup(0, 0, 50), Lookup::Miss));
    }

    #[test]
    fn keeps_a_bounded_number_of_extents_and_no_overlaps() {
        let mut cache = ReadAhead::default();
        for index in 0..READ_AHEAD_EXTENTS_MAX as u64 {
            assert_eq!(cache.insert(extent(0, index * 4096, index * 10, index * 10 + 10, 4096)), 0);
        }
        assert_eq!(cache.insert(extent(0, 1 << 20, 1000, 1010, 4096)), 4096);
        assert_eq!(cache.bytes(), READ_AHEAD_EXTENTS_MAX * 4096);
        // A second read of batches already held replaces the first.
        assert_eq!(cache.insert(extent(0, 1 << 20, 1000, 1010, 4096)), 4096);
        assert_eq!(cache.bytes(), READ_AHEAD_EXTENTS_MAX * 4096);
    }

    #[test]
    fn an_idle_sweep_sees_whether_anyone_read() {
        let mut cache = ReadAhead::default();
        cache.insert(extent(0, 0, 0, 10, 4096));
        assert!(!matches!(cache.lookup(0, 0, 5), Lookup::Miss));
        assert!(!cache.idle_since_last_sweep());
        assert!(cache.idle_since_last_sweep());
    }
}
