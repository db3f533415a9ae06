//! `ringpost-model`: Pub/Sub's rules for what may be published and configured, as limits and as
//! pure checks of plain values. They are the model's and not a protocol's, so they live here,
//! shared by the client (which checks a message before sending it) and by every protocol of the
//! daemon, while the wire crate is only the native protocol's codec.
//!
//! - [`limits`]: the model's limits, by name, each with its reason.
//! - [`shards`]: how a topic's shard number packs a node and its forwarder shard.
//! - [`sources`]: which of a topic's publish sources an ordering key goes to.
//! - [`validate`]: the checks of names, messages and settings, and the defaults of settings
//!   left at 0; every refusal is an [`Invalid`].

pub mod limits;
pub mod shards;
pub mod sources;
pub mod validate;

pub use validate::Invalid;
