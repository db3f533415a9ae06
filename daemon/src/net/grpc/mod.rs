//! The gRPC API's network edge: what tonic serves connections with (`connections`: limits per
//! address and in all, TLS handshakes and prefaces with a deadline, idle connections closed),
//! the budget of request bytes arriving (`budget`) and the count of calls by method and code
//! (`counting`). The services themselves are `protocol::grpc`'s.

pub mod budget;
pub mod connections;
pub mod counting;
