//! How Ringpost numbers a forwarder shard across a cluster: a topic's `shard` (in the catalog,
//! and in the stats a client reads) packs a node and one of its forwarder shards. The daemon
//! places topics by it, and the CLI shows it as a node and a forwarder.

/// A topic's `shard` names a node and one of its forwarder shards: the node's id less one in
/// the high bits, the shard in the low `NODE_SHARD_BITS`. A single node is node 1, so a
/// catalog written before clusters names its shards unchanged.
pub const NODE_SHARD_BITS: u32 = 16;

/// The node and local shard a topic's `shard` names.
pub fn node_and_shard(shard: u32) -> (u64, u32) {
    ((shard >> NODE_SHARD_BITS) as u64 + 1, shard & ((1 << NODE_SHARD_BITS) - 1))
}

/// How a log line or an error names the forwarder a topic's `shard` packs: "node 2 forwarder
/// 0", never the packed number (`0x10000`), which means nothing to an operator.
pub fn forwarder_name(shard: u32) -> String {
    let (node, local) = node_and_shard(shard);
    format!("node {node} forwarder {local}")
}

/// The `shard` naming `node`'s forwarder `local`.
pub fn global_shard(node: u64, local: u32) -> u32 {
    (((node - 1) as u32) << NODE_SHARD_BITS) | local
}
