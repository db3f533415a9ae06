//! Which of a topic's publish sources a message with an ordering key goes to: one pure function
//! of the key's bytes and the number of sources the key map counts, shared by the client
//! library, the gRPC gateway and the sources themselves (which refuse an ordered publish whose
//! key maps elsewhere), so that every protocol and every node sends a key to one source.
//!
//! The map is Lamping and Veach's jump consistent hash of the key's 64-bit FNV-1a: with a
//! fixed count a key's source never changes, and when the count goes from n to n + 1 only
//! about 1/(n + 1) of the keys move (all to the new source); from n + 1 to n only the keys of
//! the highest source move. So a topic's sources are added and retired at the top.

/// FNV-1a, 64 bits: a fixed hash of a key's bytes, the same on every machine and version (a
/// key's source must not change with a hasher's seed or a library's upgrade).
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

/// Jump consistent hash (Lamping and Veach, 2014): a bucket in `0..buckets` for `key`.
/// `buckets` 0 is taken as 1.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets.max(1));
    let mut bucket: i64 = -1;
    let mut next: i64 = 0;
    while next < buckets {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        next = (((bucket + 1) as f64) * ((1u64 << 31) as f64 / (((key >> 33) + 1) as f64))) as i64;
    }
    bucket as u32
}

/// The source (`0..sources`) that takes the messages of ordering key `key` when the topic's
/// key map counts `sources` sources.
pub fn source_of_key(key: &[u8], sources: u32) -> u32 {
    jump_consistent_hash(fnv1a_64(key), sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_its_published_test_vectors() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn one_source_takes_every_key_and_zero_is_taken_as_one() {
        for key in [&b""[..], b"a", b"customer-17"] {
            assert_eq!(source_of_key(key, 1), 0);
            assert_eq!(source_of_key(key, 0), 0);
        }
    }

    #[test]
    fn adding_a_source_moves_only_keys_to_it_and_about_one_in_n_plus_one() {
        let keys: Vec<String> = (0..20_000).map(|index| format!("key-{index}")).collect();
        for sources in 1..16u32 {
            let mut moved = 0;
            for key in &keys {
                let before = source_of_key(key.as_bytes(), sources);
                let after = source_of_key(key.as_bytes(), sources + 1);
                assert!(before < sources && after <= sources);
                if before != after {
                    assert_eq!(after, sources, "a key moves only to the added source");
                    moved += 1;
                }
            }
            let expected = keys.len() as f64 / f64::from(sources + 1);
            assert!((moved as f64 - expected).abs() < expected * 0.1, "{moved} moved of {expected}");
        }
    }

    #[test]
    fn keys_spread_evenly_over_the_sources() {
        let mut counts = [0u32; 4];
        for index in 0..40_000 {
            counts[source_of_key(format!("{index}").as_bytes(), 4) as usize] += 1;
        }
        assert!(counts.iter().all(|&count| (9_000..11_000).contains(&count)), "{counts:?}");
    }

    #[test]
    fn a_keys_source_is_fixed_for_all_time() {
        // Pinned: a change here would move every ordered key of every topic on upgrade.
        // The values of an independent implementation of the same two functions.
        let keys = [b"a".as_slice(), b"order-42", b"customer-17"];
        assert_eq!(keys.map(|key| source_of_key(key, 8)), [2, 7, 0]);
        assert_eq!(keys.map(|key| source_of_key(key, 1000)), [163, 111, 34]);
    }
}
