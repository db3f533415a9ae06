//! Sets of message ids, to check every delivery against the publishes that were acknowledged.
//!
//! A message id is the message's offset in its topic's log: dense, from 0 up. A bitmap is then
//! the cheapest exact set: a million ids take 125 KiB, and a membership test is one load.

/// Ids above this are refused rather than grown into: a bitmap that large means the ids are not
/// the dense offsets this set is made for (2^32 ids is 512 MiB of bitmap).
pub const ID_MAX: u64 = (1 << 32) - 1;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdSet {
    words: Vec<u64>,
    len: u64,
}

impl IdSet {
    pub fn new() -> IdSet {
        IdSet::default()
    }

    /// Adds `id`; returns whether it was new. Ids above [`ID_MAX`] are not stored and count as
    /// new, so a server that hands out sparse ids shows up as lost messages rather than as a
    /// generator that ran out of memory.
    pub fn insert(&mut self, id: u64) -> bool {
        if id > ID_MAX {
            return true;
        }
        let (word, bit) = ((id / 64) as usize, id % 64);
        if word >= self.words.len() {
            self.words.resize((word + 1).next_power_of_two(), 0);
        }
        let mask = 1u64 << bit;
        let new = self.words[word] & mask == 0;
        self.words[word] |= mask;
        self.len += u64::from(new);
        new
    }

    pub fn contains(&self, id: u64) -> bool {
        let word = (id / 64) as usize;
        word < self.words.len() && self.words[word] & (1u64 << (id % 64)) != 0
    }

    /// Ids in the set.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds every id of `other`.
    pub fn union_with(&mut self, other: &IdSet) {
        if other.words.len() > self.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (word, &bits) in self.words.iter_mut().zip(&other.words) {
            *word |= bits;
        }
        self.len = self.words.iter().map(|word| u64::from(word.count_ones())).sum();
    }

    /// Ids in `self` that are not in `other`.
    pub fn count_missing_from(&self, other: &IdSet) -> u64 {
        self.words
            .iter()
            .enumerate()
            .map(|(index, &bits)| {
                let theirs = other.words.get(index).copied().unwrap_or(0);
                u64::from((bits & !theirs).count_ones())
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_counts_new_ids_once() {
        let mut set = IdSet::new();
        assert!(set.insert(0));
        assert!(set.insert(64));
        assert!(set.insert(1_000_000));
        assert!(!set.insert(64));
        assert_eq!(set.len(), 3);
        assert!(set.contains(1_000_000));
        assert!(!set.contains(1));
        assert!(!set.contains(u64::MAX));
        assert!(set.insert(u64::MAX), "an id beyond the bitmap is never remembered");
        assert_eq!(set.len(), 3);
    }

    #[test]
    fn union_and_difference() {
        let mut acknowledged = IdSet::new();
        let mut delivered = IdSet::new();
        for id in 0..1000 {
            acknowledged.insert(id);
            if id % 10 != 3 {
                delivered.insert(id);
            }
        }
        delivered.insert(5000);
        assert_eq!(acknowledged.count_missing_from(&delivered), 100);
        assert_eq!(delivered.count_missing_from(&acknowledged), 1);
        let mut merged = IdSet::new();
        merged.union_with(&delivered);
        merged.union_with(&acknowledged);
        assert_eq!(merged.len(), 1001);
    }
}
