//! A map keyed by log offsets that lie close together: a subscription's leases.
//!
//! A stream leases the next offsets in order and its subscriber acknowledges them in about that
//! order, so the live keys form a narrow, moving band. They sit in a ring indexed by offset, so
//! looking one up touches memory next to the previous one. A hash map places each at random:
//! on a fan-out every acknowledgement missed the cache, 15% of the forwarder's time (perf), and
//! a B-tree paid its depth instead on a single busy subscription. The ring spans at most
//! `RING_SPAN_MAX` offsets; a key further behind (a message held for long while thousands of
//! later ones came and went) moves to a small ordered map beside it, so a straggler costs one
//! entry, not a ring as wide as the gap.

use crate::ids::Offset;
use std::collections::{BTreeMap, VecDeque};

/// Widest band of offsets the ring covers: 16,384 slots of a 40-byte lease are 640 KiB.
pub const RING_SPAN_MAX: u64 = 16_384;
/// Slots an empty ring may keep allocated for the next burst; a larger one is freed.
const RING_CAPACITY_KEPT: usize = 1024;

pub struct OffsetMap<V> {
    /// The offset of `ring[0]`.
    base: u64,
    ring: VecDeque<Option<V>>,
    ring_count: u32,
    /// Keys outside the ring's band; made on demand (most subscriptions never need it). Boxed:
    /// 8 bytes instead of 24 in every idle subscription, for one more allocation in the rare
    /// one with stragglers.
    #[allow(clippy::box_collection)]
    far: Option<Box<BTreeMap<u64, V>>>,
}

impl<V> Default for OffsetMap<V> {
    fn default() -> Self {
        OffsetMap { base: 0, ring: VecDeque::new(), ring_count: 0, far: None }
    }
}

impl<V> OffsetMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.ring_count as usize + self.far.as_ref().map_or(0, |far| far.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ring_index(&self, offset: u64) -> Option<usize> {
        let index = offset.checked_sub(self.base)?;
        (index < self.ring.len() as u64).then_some(index as usize)
    }

    pub fn get(&self, offset: Offset) -> Option<&V> {
        let offset = offset.get();
        if let Some(value) = self.ring_index(offset).and_then(|index| self.ring[index].as_ref()) {
            return Some(value);
        }
        self.far.as_ref()?.get(&offset)
    }

    pub fn get_mut(&mut self, offset: Offset) -> Option<&mut V> {
        let offset = offset.get();
        if let Some(index) = self.ring_index(offset) {
            if self.ring[index].is_some() {
                return self.ring[index].as_mut();
            }
        }
        self.far.as_mut()?.get_mut(&offset)
    }

    pub fn contains_key(&self, offset: Offset) -> bool {
        self.get(offset).is_some()
    }

    /// Inserts or replaces; returns the value it replaced.
    pub fn insert(&mut self, offset: Offset, value: V) -> Option<V> {
        let offset = offset.get();
        if let Some(index) = self.ring_index(offset) {
            return match self.ring[index].replace(value) {
                Some(old) => Some(old),
                None => {
                    self.ring_count += 1;
                    self.remove_far(offset)
                }
            };
        }
        if self.ring.is_empty() {
            self.base = offset;
        } else if offset > self.base {
            if offset - self.base >= RING_SPAN_MAX {
                // The band moves on: what falls behind it goes to the far map.
                let new_base = offset + 1 - RING_SPAN_MAX;
                while !self.ring.is_empty() && self.base < new_base {
                    if let Some(old) = self.ring.pop_front().flatten() {
                        self.ring_count -= 1;
                        self.far.get_or_insert_with(Default::default).insert(self.base, old);
                    }
                    self.base += 1;
                }
                self.trim();
                if self.ring.is_empty() {
                    self.base = offset;
                }
            }
            let index = (offset - self.base) as usize;
            if index >= self.ring.len() {
                self.ring.resize_with(index, || None);
                self.ring.push_back(None);
            }
        } else {
            // Below the band: widen it if that stays narrow enough, else keep it aside.
            let widened = self.base - offset + self.ring.len() as u64;
            if widened > RING_SPAN_MAX {
                return self.far.get_or_insert_with(Default::default).insert(offset, value);
            }
            for _ in offset..self.base {
                self.ring.push_front(None);
            }
            self.base = offset;
        }
        if self.ring.is_empty() {
            self.ring.push_back(None);
        }
        let index = (offset - self.base) as usize;
        self.ring[index] = Some(value);
        self.ring_count += 1;
        self.remove_far(offset)
    }

    pub fn remove(&mut self, offset: Offset) -> Option<V> {
        let offset = offset.get();
        if let Some(index) = self.ring_index(offset) {
            if let Some(value) = self.ring[index].take() {
                self.ring_count -= 1;
                self.trim();
                return Some(value);
            }
        }
        self.remove_far(offset)
    }

    fn remove_far(&mut self, offset: u64) -> Option<V> {
        let far = self.far.as_mut()?;
        let value = far.remove(&offset);
        if far.is_empty() {
            self.far = None;
        }
        value
    }

    /// Drops the empty slots at both ends, so the ring spans exactly its live keys.
    fn trim(&mut self) {
        while matches!(self.ring.front(), Some(None)) {
            self.ring.pop_front();
            self.base += 1;
        }
        while matches!(self.ring.back(), Some(None)) {
            self.ring.pop_back();
        }
        if self.ring.is_empty() && self.ring.capacity() > RING_CAPACITY_KEPT {
            self.ring = VecDeque::new();
        }
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Offset, &V)> + '_ {
        let base = self.base;
        let ring = self.ring.iter().enumerate().filter_map(move |(index, slot)| {
            slot.as_ref().map(|value| (Offset::new(base + index as u64), value))
        });
        let far =
            self.far.iter().flat_map(|far| far.iter().map(|(offset, value)| (Offset::new(*offset), value)));
        ring.chain(far)
    }

    pub fn keys(&self) -> impl Iterator<Item = Offset> + '_ {
        self.iter().map(|(offset, _)| offset)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(Offset, &mut V) -> bool) {
        let base = self.base;
        for (index, slot) in self.ring.iter_mut().enumerate() {
            if let Some(value) = slot {
                if !keep(Offset::new(base + index as u64), value) {
                    *slot = None;
                    self.ring_count -= 1;
                }
            }
        }
        self.trim();
        if let Some(far) = &mut self.far {
            far.retain(|offset, value| keep(Offset::new(*offset), value));
            if far.is_empty() {
                self.far = None;
            }
        }
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Operation {
        Insert(u64, u32),
        Remove(u64),
        KeepEven,
    }

    fn operation() -> impl Strategy<Value = Operation> {
        // Offsets mostly in a band, sometimes far apart, so that the far map is exercised.
        let offset = prop_oneof![4 => 0u64..3_000, 1 => 0u64..100_000];
        prop_oneof![
            6 => (offset.clone(), any::<u32>()).prop_map(|(offset, value)| Operation::Insert(offset, value)),
            4 => offset.prop_map(Operation::Remove),
            1 => Just(Operation::KeepEven),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_an_ordered_map(operations in proptest::collection::vec(operation(), 0..400)) {
            let mut map = OffsetMap::new();
            let mut model = BTreeMap::new();
            for operation in operations {
                match operation {
                    Operation::Insert(offset, value) => {
                        prop_assert_eq!(map.insert(Offset::new(offset), value), model.insert(offset, value));
                    }
                    Operation::Remove(offset) => prop_assert_eq!(map.remove(Offset::new(offset)), model.remove(&offset)),
                    Operation::KeepEven => {
                        map.retain(|offset, _| offset.get() % 2 == 0);
                        model.retain(|offset, _| offset % 2 == 0);
                    }
                }
                prop_assert_eq!(map.len(), model.len());
                prop_assert!(map.ring.len() as u64 <= RING_SPAN_MAX);
                let mut entries: Vec<(u64, u32)> = map.iter().map(|(offset, value)| (offset.get(), *value)).collect();
                entries.sort_unstable();
                prop_assert_eq!(entries, model.iter().map(|(o, v)| (*o, *v)).collect::<Vec<_>>());
                for (offset, value) in &model {
                    prop_assert_eq!(map.get(Offset::new(*offset)), Some(value));
                }
            }
        }
    }

    #[test]
    fn a_straggler_costs_one_entry_not_a_ring_as_wide_as_the_gap() {
        let mut map = OffsetMap::new();
        map.insert(Offset::new(0), ());
        for offset in 1..100_000u64 {
            map.insert(Offset::new(offset), ());
            map.remove(Offset::new(offset));
        }
        assert!(map.contains_key(Offset::new(0)));
        assert_eq!(map.len(), 1);
        assert!(map.ring.capacity() <= RING_SPAN_MAX as usize * 2);
        map.remove(Offset::new(0));
        assert!(map.is_empty());
        assert!(map.far.is_none());
    }

    #[test]
    fn an_emptied_ring_gives_back_a_large_allocation() {
        let mut map = OffsetMap::new();
        for offset in 0..10_000u64 {
            map.insert(Offset::new(offset), 0u64);
        }
        for offset in 0..10_000u64 {
            map.remove(Offset::new(offset));
        }
        assert!(map.ring.capacity() <= RING_CAPACITY_KEPT);
    }
}
