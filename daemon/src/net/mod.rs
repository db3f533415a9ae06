//! The network edge: the connections requests arrive on and the transports between nodes. It
//! holds sockets, TLS, connection limits, deadlines and budgets, and carries bytes; it decides
//! nothing about a request. What a request means, whether it is allowed and what it answers is
//! decided behind it, by `protocol`'s handlers and the door (`dispatch`).

// The native protocol's connection server (glommio, on every shard).
pub mod server;
// TLS for the native protocol, the cluster port and the gRPC API: certificates reloaded when
// replaced, handshakes with a deadline.
pub mod tls;
// Node to node over the cluster port: the door's `NodeTransport` (`peer`), replication's
// transport (`replica`), and a data-plane request carried to the node that serves it (`relay`).
pub mod peer;
pub mod relay;
pub mod replica;
// The gRPC API's serving (tonic on its own tokio runtime): connections, budgets, counting.
pub mod grpc;
// The monitoring endpoint (hyper on a tokio thread of its own).
pub mod http;
