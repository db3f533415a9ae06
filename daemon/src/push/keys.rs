//! The other nodes' push signing keys, as this node learns them to serve at `/oauth2/v3/certs`.
//!
//! Each node signs its push tokens with a key of its own, and a subscription is pushed by
//! whichever node leads its topic (after a failover, another), so every node serves every
//! node's key: a receiver verifying against any one node's JWK Set then accepts them all. The
//! keys travel outside the catalog, so that no catalog entry changes its bytes: when its JWK Set
//! is asked for, the router shard asks each other registered node for its key on the cluster
//! port (`Command::PeerPushKey`), at most once per `PUSH_KEY_ASK_INTERVAL` for a key it holds.
//! A node that does not answer (gone, or of a version that refuses the request) gives no key,
//! and is asked again only after `PUSH_KEY_RETRY_INTERVAL`, so that JWK Set requests do not each
//! wait for it and open it a connection;
//! one heard before keeps its key served for `PUSH_KEY_KEPT_AFTER_HEARD`, as long as its last
//! tokens live, so tokens a dead node signed still verify through the others. Deciding what to
//! ask and what to serve does no I/O (`PushKeys`); the asking is `net::http`'s.

use super::token::TOKEN_LIFETIME_SECONDS;
use crate::codec::{Decoder, Encoder};
use crate::ids::NodeId;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a node's key is served after the node last answered for it: a token's lifetime,
/// so that every token a node signed before it went away still verifies.
pub const PUSH_KEY_KEPT_AFTER_HEARD: Duration = Duration::from_secs(TOKEN_LIFETIME_SECONDS);
/// How long a key heard is served without asking its node again: a node's key changes only
/// if its data directories are replaced, and a JWK Set fetched often must not cost a round
/// to every node each time.
pub const PUSH_KEY_ASK_INTERVAL: Duration = Duration::from_secs(60);
/// How long a node that gave no key (silent, unreachable, or of a version that refuses the
/// request) is not asked again: short, since a node that comes back may be pushing soon, and
/// long enough that a flood of JWK Set requests costs it one request, not one each.
pub const PUSH_KEY_RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// How long the router shard waits for a node's key: well within `net::http::SCRAPE_TIMEOUT`
/// (twice, since an idle connection found closed is tried again once), so a node that does not
/// answer leaves the JWK Set without its key rather than unanswered.
pub const PUSH_KEY_ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How many other nodes' keys are kept: a cluster's voters and as many learners; past it, the
/// key heard longest ago goes.
pub const PUSH_KEYS_KNOWN_MAX: usize = crate::node::CLUSTER_VOTERS_MAX * 2;
/// The longest `kid`, `n` or `e` a node's answer may hold: `n` of a 4096-bit key is 683
/// base64url characters (`SIGNING_KEY_BITS` is 2048: 342).
pub const PUSH_KEY_FIELD_BYTES_MAX: usize = 1024;

const _: () = assert!(PUSH_KEY_ASK_TIMEOUT.as_millis() * 2 < crate::net::http::SCRAPE_TIMEOUT.as_millis());

/// A node's push signing key as its JWK has it (RFC 7517, RFC 7518: base64url without padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushKey {
    /// The JWK's `kid`: the key's RFC 7638 thumbprint, which the tokens' headers name.
    pub key_id: String,
    /// `n`, the public modulus.
    pub modulus: String,
    /// `e`, the public exponent.
    pub exponent: String,
}

/// A key learnt from another node, and when that node last answered with it.
#[derive(Debug, Clone)]
struct Known {
    key: PushKey,
    heard: Instant,
}

/// The other nodes' keys this node serves, at most `PUSH_KEYS_KNOWN_MAX`, and when the nodes
/// that gave none were last asked (as many, at most).
#[derive(Debug, Default)]
pub struct PushKeys {
    known: BTreeMap<NodeId, Known>,
    unanswered: BTreeMap<NodeId, Instant>,
}

impl PushKeys {
    /// Which of `nodes` (the registered ones but this) to ask for their key at `now`: those
    /// whose key is not held, or was heard `PUSH_KEY_ASK_INTERVAL` ago or longer, unless they
    /// gave none when last asked, less than `PUSH_KEY_RETRY_INTERVAL` ago.
    pub fn to_ask(&self, nodes: impl IntoIterator<Item = NodeId>, now: Instant) -> Vec<NodeId> {
        let since = |at: Instant| now.saturating_duration_since(at);
        nodes
            .into_iter()
            .filter(|node| {
                self.known.get(node).is_none_or(|known| since(known.heard) >= PUSH_KEY_ASK_INTERVAL)
                    && self.unanswered.get(node).is_none_or(|asked| since(*asked) >= PUSH_KEY_RETRY_INTERVAL)
            })
            .collect()
    }

    /// Node `node`, asked at `now`, gave no key. Past `PUSH_KEYS_KNOWN_MAX` such nodes, the one
    /// asked longest ago is forgotten (and so asked again at the next request).
    pub fn unanswered(&mut self, node: NodeId, now: Instant) {
        self.unanswered.insert(node, now);
        while self.unanswered.len() > PUSH_KEYS_KNOWN_MAX {
            let oldest = self.unanswered.iter().min_by_key(|(_, asked)| **asked).map(|(node, _)| *node);
            self.unanswered.remove(&oldest.expect("more than none"));
        }
        debug_assert!(self.unanswered.len() <= PUSH_KEYS_KNOWN_MAX);
    }

    /// Node `node` answered with `key` at `now`. Past `PUSH_KEYS_KNOWN_MAX`, the key of the node
    /// heard longest ago is forgotten.
    pub fn learn(&mut self, node: NodeId, key: PushKey, now: Instant) {
        self.unanswered.remove(&node);
        self.known.insert(node, Known { key, heard: now });
        while self.known.len() > PUSH_KEYS_KNOWN_MAX {
            let oldest = self.known.iter().min_by_key(|(_, known)| known.heard).map(|(node, _)| *node);
            self.known.remove(&oldest.expect("more than none"));
        }
        debug_assert!(self.known.len() <= PUSH_KEYS_KNOWN_MAX);
    }

    /// The keys to serve at `now`, by node: those heard less than `PUSH_KEY_KEPT_AFTER_HEARD`
    /// ago (the others are forgotten).
    pub fn serving(&mut self, now: Instant) -> Vec<PushKey> {
        self.known.retain(|_, known| now.saturating_duration_since(known.heard) < PUSH_KEY_KEPT_AFTER_HEARD);
        self.known.values().map(|known| known.key.clone()).collect()
    }
}

/// A node's answer to `Command::PeerPushKey`: its key's `kid`, `n` and `e`.
pub fn encode_push_key(key: &PushKey) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    encoder.str(&key.key_id).str(&key.modulus).str(&key.exponent);
    encoder.0
}

/// `encode_push_key`'s bytes; each field base64url, not empty and within
/// `PUSH_KEY_FIELD_BYTES_MAX`, since the JWK Set serves them as they are and a receiver's
/// library refuses a whole set it cannot read.
pub fn decode_push_key(bytes: &[u8]) -> Result<PushKey, &'static str> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let key = PushKey { key_id: decoder.str()?, modulus: decoder.str()?, exponent: decoder.str()? };
    if !decoder.is_empty() {
        return Err("trailing bytes");
    }
    let base64url = |text: &str| {
        !text.is_empty()
            && text.len() <= PUSH_KEY_FIELD_BYTES_MAX
            && text.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_".contains(&byte))
    };
    if ![&key.key_id, &key.modulus, &key.exponent].into_iter().all(|part| base64url(part)) {
        return Err("a push key whose kid, n or e is not base64url within PUSH_KEY_FIELD_BYTES_MAX");
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u64) -> PushKey {
        PushKey { key_id: format!("kid-{id}"), modulus: "0vx7agoebGc".into(), exponent: "AQAB".into() }
    }

    /// A key learnt is served and not asked for again until `PUSH_KEY_ASK_INTERVAL` passed; it
    /// stays served (its node silent, gone or refusing) until `PUSH_KEY_KEPT_AFTER_HEARD` after
    /// its node last answered, then is forgotten; an answer again keeps it longer.
    #[test]
    fn a_key_learnt_is_served_until_a_tokens_lifetime_after_its_node_was_last_heard() {
        let start = Instant::now();
        let mut keys = PushKeys::default();
        let nodes = [NodeId::new(2), NodeId::new(3)];
        assert_eq!(keys.to_ask(nodes, start), nodes);
        assert_eq!(keys.serving(start), []);
        keys.learn(NodeId::new(2), key(2), start);
        assert_eq!(keys.to_ask(nodes, start), [NodeId::new(3)]);
        assert_eq!(keys.serving(start), [key(2)]);
        let asked_again = start + PUSH_KEY_ASK_INTERVAL;
        assert_eq!(keys.to_ask(nodes, asked_again - Duration::from_millis(1)), [NodeId::new(3)]);
        assert_eq!(keys.to_ask(nodes, asked_again), nodes);
        keys.learn(NodeId::new(3), key(3), asked_again);
        // Node 2 no longer answers: its key is served for a token's lifetime after its last answer.
        let expired = start + PUSH_KEY_KEPT_AFTER_HEARD;
        assert_eq!(keys.serving(expired - Duration::from_millis(1)), [key(2), key(3)]);
        assert_eq!(keys.serving(expired), [key(3)]);
        assert_eq!(keys.to_ask(nodes, expired), nodes);
        // Node 3 answered again later: its key lives on from then.
        keys.learn(NodeId::new(3), key(3), expired);
        assert_eq!(keys.serving(asked_again + PUSH_KEY_KEPT_AFTER_HEARD), [key(3)]);
        assert_eq!(keys.serving(expired + PUSH_KEY_KEPT_AFTER_HEARD), []);
    }

    /// A node that gave no key is not asked again before `PUSH_KEY_RETRY_INTERVAL`, whatever
    /// asks meanwhile; one that answers then is asked as one whose key is held; the nodes
    /// remembered as silent are bounded.
    #[test]
    fn a_node_that_gave_no_key_is_asked_again_only_after_the_retry_interval() {
        let start = Instant::now();
        let mut keys = PushKeys::default();
        let nodes = [NodeId::new(2), NodeId::new(3)];
        keys.unanswered(NodeId::new(3), start);
        keys.learn(NodeId::new(2), key(2), start);
        assert_eq!(keys.to_ask(nodes, start), []);
        let retry = start + PUSH_KEY_RETRY_INTERVAL;
        assert_eq!(keys.to_ask(nodes, retry - Duration::from_millis(1)), []);
        assert_eq!(keys.to_ask(nodes, retry), [NodeId::new(3)]);
        keys.learn(NodeId::new(3), key(3), retry);
        assert_eq!(keys.to_ask(nodes, retry + PUSH_KEY_RETRY_INTERVAL), []);
        assert_eq!(keys.serving(retry), [key(2), key(3)]);
        for id in 10..10 + PUSH_KEYS_KNOWN_MAX as u64 + 3 {
            keys.unanswered(NodeId::new(id), start + Duration::from_secs(id));
        }
        assert_eq!(keys.unanswered.len(), PUSH_KEYS_KNOWN_MAX);
        assert_eq!(keys.to_ask([NodeId::new(10)], start + Duration::from_secs(20)), [NodeId::new(10)]);
    }

    /// Past `PUSH_KEYS_KNOWN_MAX` nodes, the key heard longest ago goes first.
    #[test]
    fn the_keys_kept_are_bounded_and_the_one_heard_longest_ago_goes_first() {
        let start = Instant::now();
        let mut keys = PushKeys::default();
        let count = PUSH_KEYS_KNOWN_MAX as u64 + 3;
        // Node 1 is heard last though learnt first.
        for id in 2..=count {
            keys.learn(NodeId::new(id), key(id), start + Duration::from_secs(id));
        }
        keys.learn(NodeId::new(1), key(1), start + Duration::from_secs(count + 1));
        let served = keys.serving(start + Duration::from_secs(count));
        assert_eq!(served.len(), PUSH_KEYS_KNOWN_MAX);
        let expected: Vec<PushKey> = [1].into_iter().chain(5..=count).map(key).collect();
        assert_eq!(served, expected);
    }

    /// The answer decodes to the key; a cut, trailing bytes, or a field that is empty, not
    /// base64url or too long is refused.
    #[test]
    fn a_push_key_answer_decodes_to_the_key_and_anything_else_is_refused() {
        let encoded = encode_push_key(&key(2));
        assert_eq!(decode_push_key(&encoded), Ok(key(2)));
        for cut in 0..encoded.len() {
            assert!(decode_push_key(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
        }
        let mut trailing = encoded.clone();
        trailing.push(0);
        assert!(decode_push_key(&trailing).is_err());
        let long = "A".repeat(PUSH_KEY_FIELD_BYTES_MAX + 1);
        for bad in [
            PushKey { key_id: String::new(), ..key(2) },
            PushKey { modulus: "not \"base64\"".into(), ..key(2) },
            PushKey { exponent: "AQ+B".into(), ..key(2) },
            PushKey { modulus: long, ..key(2) },
        ] {
            assert!(decode_push_key(&encode_push_key(&bad)).is_err(), "{bad:?}");
        }
    }
}
