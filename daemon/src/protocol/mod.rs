//! The protocols clients speak. Each turns its requests into the typed operations of `api` and
//! their results back into its own responses; nothing below `api` knows any of them. The
//! connections they arrive on are `net`'s.

pub mod native;
// `grpc` (Google Cloud Pub/Sub's API) runs on a tokio runtime of its own and reaches the shards
// through `grpc::bridge`.
pub mod grpc;
// `rest` (Pub/Sub's REST API) transcodes JSON into calls of `grpc`'s services, on its runtime.
pub mod rest;
