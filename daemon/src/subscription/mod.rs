//! Subscriptions: their delivery state, filter and leases.

pub mod filter;
pub mod offset_map;
pub mod state;
