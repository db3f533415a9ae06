//! The domain's limits, by name: Pub/Sub's, which are the model's (`ringpost_model::limits`,
//! where each has its reason), shared with the client and with every protocol that carries
//! them, so that there is one table and nothing to keep equal.

pub use ringpost_model::limits::*;
