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

    /// Chooses a forwarder for a new key among those `excluded` leaves, walking the ring as
    /// `place` does, and counts it there; `None` when none of them has room below the bound.
    pub fn place_avoiding(&mut self, key: &str, excluded: impl Fn(u32) -> bool) -> Option<u32> {
        let capacity = self.capacity();
        let start = self.ring_index(key);
        let forwarder = (0..self.ring.len())
            .map(|step| self.ring[(start + step) % self.ring.len()].1)
            .find(|forwarder| !excluded(*forwarder) && self.loads[*forwarder as usize] < capacity)?;
        self.loads[forwarder as usize] += 1;
        Some(forwarder)
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

/// Where a topic's source goes: a forwarder holding none of the topic's units (`shard_taken`),
/// on a node holding none of them (`node_taken`) if one such has room below the bound, else on
/// any node; if every forwarder left is at the bound (the exclusions can leave only full ones),
/// the least loaded of them. `None` when every forwarder holds one of the topic's units.
/// `key` names the topic and the source's number (`source_key`).
pub fn place_source(
    placement: &mut Placement,
    key: &str,
    shard_taken: impl Fn(u32) -> bool,
    node_taken: impl Fn(u32) -> bool,
) -> Option<u32> {
    if let Some(forwarder) =
        placement.place_avoiding(key, |forwarder| shard_taken(forwarder) || node_taken(forwarder))
    {
        return Some(forwarder);
    }
    if let Some(forwarder) = placement.place_avoiding(key, &shard_taken) {
        return Some(forwarder);
    }
    let forwarder = (0..placement.loads.len() as u32)
        .filter(|forwarder| !shard_taken(*forwarder))
        .min_by_key(|forwarder| placement.loads[*forwarder as usize])?;
    placement.assign(forwarder);
    Some(forwarder)
}

/// The key a topic's source `number` is placed by: its topic's name and its number, joined by a
/// character no topic name holds (Pub/Sub's names allow letters, digits and `-._~%+`), so that
/// it is never another topic's key.
pub fn source_key(topic: &str, number: u32) -> String {
    format!("{topic}#{number}")
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

    /// Topics of three sources on 8 forwarders of 4 nodes: each topic's units on 3 distinct
    /// forwarders of 3 distinct nodes, and every forwarder within the bound of all the units.
    #[test]
    fn sources_land_on_distinct_shards_and_nodes_within_bounded_loads() {
        let node_of = |forwarder: u32| forwarder / 2;
        let mut placement = Placement::new(8, 1.25);
        for topic in 0..300 {
            let name = format!("projects/p/topics/t{topic}");
            let mut units = vec![placement.place(&name)];
            for number in 1..3 {
                let chosen = place_source(
                    &mut placement,
                    &source_key(&name, number),
                    |forwarder| units.contains(&forwarder),
                    |forwarder| units.iter().any(|unit| node_of(*unit) == node_of(forwarder)),
                )
                .unwrap();
                units.push(chosen);
            }
            let mut nodes: Vec<u32> = units.iter().map(|unit| node_of(*unit)).collect();
            nodes.sort_unstable();
            nodes.dedup();
            assert_eq!(nodes.len(), 3, "topic {topic}'s units {units:?}");
        }
        // 900 units on 8 forwarders at c = 1.25: ceil(1.25 * 900 / 8) = 141.
        assert_eq!(placement.loads().iter().sum::<u64>(), 900);
        assert!(placement.loads().iter().all(|load| *load <= 141), "{:?}", placement.loads());
    }

    /// With the other nodes taken, a source goes to another shard of the same node; with every
    /// shard taken, nowhere.
    #[test]
    fn a_source_falls_back_to_a_shard_of_a_taken_node_and_never_to_a_taken_shard() {
        let mut placement = Placement::new(2, 1.25);
        let first = placement.place("projects/p/topics/hot");
        let second = place_source(
            &mut placement,
            &source_key("projects/p/topics/hot", 1),
            |forwarder| forwarder == first,
            |_| true,
        );
        assert_eq!(second, Some(1 - first));
        let third = place_source(&mut placement, &source_key("projects/p/topics/hot", 2), |_| true, |_| true);
        assert_eq!(third, None);
        assert_eq!(placement.loads(), &[1, 1]);
    }

    #[test]
    fn one_forwarder_takes_everything() {
        let mut placement = Placement::new(1, 1.25);
        for key in 0..10 {
            assert_eq!(placement.place(&key.to_string()), 0);
        }
    }
}
