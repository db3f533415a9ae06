//! Creating and deleting the topics and subscriptions of a run, many at a time.
//!
//! The topics workload needs 10,000 topics and as many subscriptions: one request after the
//! other would spend minutes in round trips and catalog syncs. Several threads, each with its
//! own client and many requests in flight, let the router group its catalog commits instead.

use super::inflight::InflightSet;
use super::Failure;
use ringpost_client::connection::Connection;
use ringpost_client::{block_on, Client, ErrorCode, PushConfig, Subscription};
use ringpost_wire::frame::{access_body, decode_error};
use ringpost_wire::messages::{LookupResponse, NameRequest};
use ringpost_wire::Command;

/// Threads that send control-plane requests, each with its own client (and router connection).
pub const ADMIN_THREADS: usize = 4;
/// Control-plane requests in flight per thread.
pub const ADMIN_REQUESTS_IN_FLIGHT: usize = 32;
/// Lookups in flight on the one router connection that makes them.
pub const LOOKUPS_IN_FLIGHT: usize = 256;

/// One control-plane change.
#[derive(Debug, Clone)]
pub enum Admin {
    /// A topic of this many publish sources (1: one).
    CreateTopic(String, u32),
    CreateSubscription(Subscription),
    /// A subscription the daemon pushes to the configuration's endpoint.
    CreatePushSubscription(Subscription, PushConfig),
    /// Deletions tolerate `NotFound`: cleaning up after a failed run must not fail again.
    DeleteSubscription(String),
    DeleteTopic(String),
}

impl Admin {
    fn describe(&self) -> String {
        match self {
            Admin::CreateTopic(name, _) => format!("creating topic {name}"),
            Admin::CreateSubscription(subscription) | Admin::CreatePushSubscription(subscription, _) => {
                format!("creating subscription {}", subscription.name)
            }
            Admin::DeleteSubscription(name) => format!("deleting subscription {name}"),
            Admin::DeleteTopic(name) => format!("deleting topic {name}"),
        }
    }

    async fn apply(&self, client: &Client) -> ringpost_client::Result<()> {
        let tolerate_missing = |result: ringpost_client::Result<()>| match result {
            Err(error) if error.code() == ErrorCode::NotFound => Ok(()),
            other => other,
        };
        match self {
            Admin::CreateTopic(name, sources) if *sources > 1 => {
                let topic = ringpost_client::Topic { name: name.clone(), ..Default::default() };
                client.create_topic_with_sources(topic, 0, *sources).await.map(|_| ())
            }
            Admin::CreateTopic(name, _) => client.create_topic(name).await.map(|_| ()),
            Admin::CreateSubscription(subscription) => {
                client.create_subscription(subscription.clone()).await.map(|_| ())
            }
            Admin::CreatePushSubscription(subscription, push) => {
                client.create_subscription_with_push(subscription.clone(), push.clone()).await.map(|_| ())
            }
            Admin::DeleteSubscription(name) => tolerate_missing(client.delete_subscription(name).await),
            Admin::DeleteTopic(name) => tolerate_missing(client.delete_topic(name).await),
        }
    }
}

/// Applies `operations` in parallel (in no particular order: pass operations that depend on
/// each other in separate calls). Returns the first failure, after every thread finished.
pub fn apply_all(server: &str, operations: &[Admin]) -> Result<(), Failure> {
    let threads = ADMIN_THREADS.min(operations.len()).max(1);
    let failures: Vec<Option<Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                std::thread::Builder::new().name(format!("admin-{thread}")).spawn_scoped(scope, move || {
                    let mine: Vec<&Admin> = operations.iter().skip(thread).step_by(threads).collect();
                    apply_some(server, &mine).err()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(handle) => {
                    handle.join().unwrap_or_else(|_| Some(Failure::runtime("an admin thread panicked")))
                }
                // The operations of a thread that did not start were not applied: a failure.
                Err(error) => Some(Failure::runtime(format!("starting an admin thread: {error}"))),
            })
            .collect()
    });
    match failures.into_iter().flatten().next() {
        Some(failure) => Err(failure),
        None => Ok(()),
    }
}

fn apply_some(server: &str, operations: &[&Admin]) -> Result<(), Failure> {
    if operations.is_empty() {
        return Ok(());
    }
    let client = block_on(super::connect(server))?;
    let client = &client;
    let mut in_flight: InflightSet<'_, (usize, ringpost_client::Result<()>)> =
        InflightSet::new(ADMIN_REQUESTS_IN_FLIGHT);
    let mut finished = Vec::new();
    let mut next = 0;
    let mut first_failure: Option<Failure> = None;
    while next < operations.len() || !in_flight.is_empty() {
        while next < operations.len() && in_flight.len() < in_flight.capacity() && first_failure.is_none() {
            let index = next;
            let operation = operations[index];
            next += 1;
            finished.extend(in_flight.start(async move { (index, operation.apply(client).await) }));
        }
        if first_failure.is_some() {
            // Stop sending; let what is in flight finish.
            next = operations.len();
        }
        if finished.is_empty() {
            in_flight.wait(None);
            in_flight.poll_woken(&mut finished);
        }
        for (index, result) in finished.drain(..) {
            if let Err(error) = result {
                let failure = Failure::from(error);
                first_failure.get_or_insert(Failure {
                    message: format!("{}: {}", operations[index].describe(), failure.message),
                    exit_code: failure.exit_code,
                });
            }
        }
    }
    match first_failure {
        Some(failure) => Err(failure),
        None => Ok(()),
    }
}

/// The forwarder address that owns each subscription, asked of the router many at a time on
/// one connection.
pub fn lookup_subscriptions(server: &str, names: &[String]) -> Result<Vec<String>, Failure> {
    let router = Connection::connect_with(server, super::security()).map_err(Failure::from)?;
    let mut addresses: Vec<Option<String>> = vec![None; names.len()];
    let mut in_flight: InflightSet<
        '_,
        (usize, ringpost_client::Result<ringpost_client::connection::Response>),
    > = InflightSet::new(LOOKUPS_IN_FLIGHT);
    let mut finished = Vec::new();
    let mut next = 0;
    while next < names.len() || !in_flight.is_empty() {
        while next < names.len() && in_flight.len() < in_flight.capacity() {
            let index = next;
            next += 1;
            let response =
                router.call(Command::LookupSubscription.code(), &NameRequest { name: names[index].clone() });
            finished.extend(in_flight.start(async move { (index, response.await) }));
        }
        if finished.is_empty() {
            in_flight.wait(None);
            in_flight.poll_woken(&mut finished);
        }
        for (index, result) in finished.drain(..) {
            let response = result.map_err(Failure::from)?;
            let failed =
                |message: String| Failure::runtime(format!("looking up {}: {message}", names[index]));
            if response.header.is_error() {
                return Err(failed(decode_error(&response.body).to_string()));
            }
            let lookup =
                access_body::<LookupResponse>(&response.body).map_err(|status| failed(status.to_string()))?;
            let forwarder =
                lookup.forwarders.first().ok_or_else(|| failed("no forwarder serves it".to_owned()))?;
            addresses[index] = Some(forwarder.address.as_str().to_owned());
        }
    }
    Ok(addresses.into_iter().map(|address| address.unwrap_or_default()).collect())
}
