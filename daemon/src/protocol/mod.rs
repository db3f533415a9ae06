//! The protocols the daemon speaks; each maps its own encoding onto the domain.

pub mod native;
