//! The protocols clients speak. Each turns its requests into the typed operations of `api` and
//! their results back into its own responses; nothing below `api` knows any of them.

pub mod native;
