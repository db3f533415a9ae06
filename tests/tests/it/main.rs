//! Integration tests against the real `ringpostd` binary. One test binary, one module per area.

mod auth;
mod bad_input;
mod client_api;
mod connections;
mod crash;
mod damage;
mod deadlines;
mod disks;
mod full_disk;
mod grpc_admin;
mod grpc_delivery;
mod io_memory;
mod liveness;
mod permissions;
mod pool;
mod pull_memory;
mod python_client;
mod quickstart;
mod readme;
mod security;
mod semantics;
mod shutdown;
mod streaming;
mod subscriptions;
mod test_ca;
mod tls;
