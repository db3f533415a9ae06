//! The pieces of `ringpost-bench`, the load generator.
//!
//! - [`workload`]: the canonical workloads W1 to W5 (publish, e2e, fanout, topics, backlog) and
//!   the run that drives them: setup, threads, progress, and the check of every delivery.
//! - [`publish`]: publisher threads with their own clients keep a fixed number of publish
//!   requests in flight (closed loop) or send on a fixed schedule (open loop), and record
//!   publish-ack latency.
//! - [`subscribe`]: subscriber threads hold streaming pulls within a window, acknowledge in
//!   batches, and record delivery latency and every delivered id.
//! - [`receiver`]: the push workload's HTTP receiver, which records each push as a subscriber
//!   records a delivery.
//! - [`setup`]: topics and subscriptions created and deleted many at a time.
//! - [`live`]: the figures threads update as they go, and the progress line made from them.
//! - [`report`]: the results table, the JSON, and [`plot`], the latency percentile plot (SVG).
//! - [`ids`]: sets of message ids, to count lost and duplicate deliveries exactly.
//! - [`latency`]: latency histograms and the clock publish times are stamped with.
//! - [`compare`]: two result files side by side.
//! - [`gate`]: the start line every thread of a run waits at.
//! - [`inflight`]: a small single-thread poller that keeps several futures in flight, because
//!   the client's futures are executor-agnostic and the tools carry no async runtime.
//! - [`embedded`]: a daemon started inside the benchmark process, on a scratch data directory
//!   that is removed at exit.
//! - [`threads`]: CPU time by thread of this process (the embedded daemon's among them).
//! - [`format`]: number formatting and parsing shared by the tables, progress lines and JSON.
//!
//! Architecture Invariant: nothing here writes to stdout; the binary decides what goes to stdout
//! (results) and stderr (progress, warnings), so results stay machine-readable when piped. The
//! one exception on stderr is a scratch directory that cannot be removed, reported from a
//! `Drop` that has no caller to hand the error to.

pub mod compare;
pub mod curve;
pub mod embedded;
pub mod format;
pub mod gate;
pub mod grpc;
pub mod ids;
pub mod inflight;
pub mod latency;
pub mod live;
pub mod plot;
pub mod publish;
pub mod receiver;
pub mod report;
pub mod rest;
pub mod setup;
pub mod subscribe;
pub mod threads;
pub mod workload;

use ringpost_client::{Client, PoolSettings, Security};
use std::sync::OnceLock;

/// The TLS and token of every connection a run opens (the clients', and the raw connections of
/// setup and the streams). Set once, by the binary, before the run; plaintext without a token
/// if never set. One value for the process, like the run's other command-line settings, so
/// that the workloads need not carry it through every thread's options.
static SECURITY: OnceLock<Security> = OnceLock::new();

/// Sets what every connection of the run uses; false if it was set already (the first stays).
pub fn set_security(security: Security) -> bool {
    SECURITY.set(security).is_ok()
}

pub(crate) fn security() -> &'static Security {
    SECURITY.get_or_init(Security::default)
}

/// The gRPC API's address when the run goes through it (`--grpc`); set once, like `SECURITY`.
static GRPC: OnceLock<String> = OnceLock::new();

/// Sends the run's publishes, streams and acknowledgements through the gRPC API at `address`;
/// false if it was set already.
pub fn set_grpc(address: String) -> bool {
    GRPC.set(address).is_ok()
}

pub(crate) fn grpc_address() -> Option<&'static str> {
    GRPC.get().map(String::as_str)
}

/// The REST interface's address when the run publishes through it (`--rest`); set once.
static REST: OnceLock<String> = OnceLock::new();

/// Sends the run's publishes through the REST interface at `address`; false if it was set
/// already.
pub fn set_rest(address: String) -> bool {
    REST.set(address).is_ok()
}

/// What a publisher thread publishes through: the native client, the gRPC API or the REST
/// interface.
pub(crate) enum Publisher {
    Native(Client),
    Grpc(grpc::GrpcClient),
    Rest(rest::RestClient),
}

impl Publisher {
    pub(crate) async fn connect(server: &str) -> ringpost_client::Result<Publisher> {
        if let Some(address) = REST.get() {
            return Ok(Publisher::Rest(rest::RestClient::connect(address, security().token())));
        }
        match grpc_address() {
            Some(address) => grpc::GrpcClient::connect(address, security().token()).map(Publisher::Grpc),
            None => connect(server).await.map(Publisher::Native),
        }
    }

    pub(crate) async fn publish(
        &self,
        topic: &str,
        messages: Vec<ringpost_client::Message>,
    ) -> ringpost_client::Result<Vec<u64>> {
        match self {
            Publisher::Native(client) => client.publish(topic, messages).await,
            Publisher::Grpc(client) => client.publish(topic, messages).await,
            Publisher::Rest(client) => client.publish(topic, messages).await,
        }
    }
}

/// A client of the router at `server`, with the run's security and the client's defaults.
pub(crate) async fn connect(server: &str) -> ringpost_client::Result<Client> {
    let timeout = ringpost_client::REQUEST_TIMEOUT_DEFAULT;
    Client::connect_with_security(server, PoolSettings::default(), timeout, security().clone()).await
}

/// A failure that ends a run: one line for the user and the process exit code it maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub exit_code: u8,
}

/// Exit code of a run that failed at run time (the server refused, the disk failed).
pub const EXIT_CODE_FAILURE: u8 = crate::cli::EXIT_REFUSED;
/// Exit code of a command line that asks for something impossible.
pub const EXIT_CODE_USAGE: u8 = crate::cli::EXIT_USAGE;
/// Exit code when no Ringpost server answered, as in the `ringpost` CLI (see `crate::cli`).
pub const EXIT_CODE_UNAVAILABLE: u8 = crate::cli::EXIT_UNREACHABLE;

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure { message: message.into(), exit_code: EXIT_CODE_USAGE }
    }

    pub fn runtime(message: impl Into<String>) -> Failure {
        Failure { message: message.into(), exit_code: EXIT_CODE_FAILURE }
    }
}

impl From<ringpost_client::Error> for Failure {
    fn from(error: ringpost_client::Error) -> Failure {
        // The same wording and exit codes as the `ringpost` CLI, so scripts can treat both alike.
        Failure { message: crate::cli::error_line(&error), exit_code: crate::cli::exit_code(&error) }
    }
}
