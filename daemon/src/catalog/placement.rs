//! Topic-to-forwarder placement: consistent hashing with bounded loads (Mirrokni, Thorup,
//! Zadimoghaddam). Forwarders sit on a hash ring as virtual nodes; a topic walks clockwise from
//! its hash to the first forwarder whose load is below `ceil(c * (m + 1) / n)`, where m topics
//! are already placed on n forwarders and c is the balance factor. No forwarder ever holds more
//! than that, and a topic moves only when its forwarder is full or gone.

use std::hash::Hash;

/// The balance factor `c`: 1.25 is the value buraksezer/consistent and liblb use. Smaller is
/// more even and moves more topics when membership changes.
pub const BALANCE_FACTOR_DEFAULT: f64 = 1.25;
/// Virtual nodes per forwarder on the ring.
pub const VIRTUAL_NODES_PER_FORWARDER: usize = 64;

pub struct Placement {
    ring: Vec<(u64, u32)>,
    loads: Vec<u64>,
    balance_factor: f64,
    hasher: ahash::RandomState,
}

impl Placement {
    pub fn new(forwarders: u32, balance_factor: f64) -> Placement {
        assert!(forwarders > 0, "placement needs at least one forwarder");
        assert!(balance_factor > 1.0, "the balance factor must be above 1");
        // Fixed seeds: placement must be the same after a restart.
        let hasher = ahash::RandomState::with_seeds(0x5249_4e47, 0x504f_5354, 0x7261_6e67, 0x706f_7374);
        let mut ring = Vec::with_capacity(forwarders as usize * VIRTUAL_NODES_PER_FORWARDER);
        for forwarder in 0..forwarders {
            for node in 0..VIRTUAL_NODES_PER_FORWARDER {
                ring.push((hash_of(&hasher, &(forwarder, node)), forwarder));
            }
        }
        ring.sort_unstable();
        Placement { ring, loads: vec![0; forwarders as usize], balance_factor, hasher }
    }

    /// The most topics one forwarder may hold once one more is placed.
    pub fn capacity(&self) -> u64 {
        let placed: u64 = self.loads.iter().sum();
        ((self.balance_factor * (placed + 1) as f64) / self.loads.len() as f64).ceil() as u64
    }

    /// Chooses a forwarder for a new key and counts it there.
    pub fn place(&mut self, key: &str) -> u32 {
        let capacity = self.capacity();
        let start = self.ring_index(key);
        for step in 0..self.ring.len() {
            let forwarder = self.ring[(start + step) % self.ring.len()].1;
            if self.loads[forwarder as usize] < capacity {
                self.loads[forwarder as usize] += 1;
                return forwarder;
            }
        }
        unreachable!("n * ceil(c * (m + 1) / n) > m, so some forwarder has room")
    }

    /// Counts a key that is already placed (recovery) on `forwarder`.
    pub fn assign(&mut self, forwarder: u32) {
        self.loads[forwarder as usize] += 1;
    }

    pub fn release(&mut self, forwarder: u32) {
        self.loads[forwarder as usize] = self.loads[forwarder as usize].saturating_sub(1);
    }

    pub fn loads(&self) -> &[u64] {
        &self.loads
    }

    /// The forwarders to offer a client for `key`, most preferred first: its owner, then the
    /// others in ring order from the key's hash.
    pub fn preference(&self, key: &str, owner: u32) -> Vec<u32> {
        let mut order = vec![owner];
        let start = self.ring_index(key);
        for step in 0..self.ring.len() {
            let forwarder = self.ring[(start + step) % self.ring.len()].1;
            if !order.contains(&forwarder) {
                order.push(forwarder);
            }
            if order.len() == self.loads.len() {
                break;
            }
        }
        order
    }

    fn ring_index(&self, key: &str) -> usize {
        let hash = hash_of(&self.hasher, &key);
        self.ring.partition_point(|(point, _)| *point < hash) % self.ring.len()
    }
}

fn hash_of<T: Hash>(state: &ahash::RandomState, value: &T) -> u64 {
    state.hash_one(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_stay_within_the_bound() {
        // Consistent hashing with bounded loads: m = 1000 topics on n = 8 shards with c = 1.25
        // bounds every shard at C = ceil(1.25 * 1000 / 8) = 157.
        let mut placement = Placement::new(8, 1.25);
        for key in 0..1000 {
            placement.place(&format!("topic-{key}"));
        }
        assert_eq!(placement.loads().iter().sum::<u64>(), 1000);
        assert!(placement.loads().iter().all(|load| *load <= 157), "{:?}", placement.loads());
    }

    #[test]
    fn placement_is_deterministic_and_preference_lists_everyone() {
        let mut first = Placement::new(4, 1.25);
        let mut second = Placement::new(4, 1.25);
        for key in 0..100 {
            let name = format!("t{key}");
            assert_eq!(first.place(&name), second.place(&name));
        }
        let order = first.preference("orders", 2);
        assert_eq!(order[0], 2);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3]);
    }

    #[test]
    fn one_forwarder_takes_everything() {
        let mut placement = Placement::new(1, 1.25);
        for key in 0..10 {
            assert_eq!(placement.place(&key.to_string()), 0);
        }
    }
}
