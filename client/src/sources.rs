//! Routes to each of a topic's publish sources. A topic's messages live in one or more sources,
//! each a log on its own forwarder: the router's `LookupSources` lists every source with its
//! forwarders, and how many are *active* (take publishes). A publish goes to one active source
//! (an ordering key's, by the key map; an unordered request's in turn); a subscriber reads from
//! every source; an acknowledgement goes to the source its ack id names.
//!
//! A daemon from before sources answers `LookupSources` with `Unimplemented`: the client then
//! asks the plain lookup, whose list is source 0's, the only source such a daemon has.

use crate::retry;
use crate::{Client, Error, Resource, Result};
use ringpost_wire::messages::{LookupResponse, LookupSourcesRequest, LookupSourcesResponse, NameRequest};
use ringpost_wire::{Command, ErrorCode, Status};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a topic's sources are trusted before they are looked up again, so that a source
/// added to a topic is found by its publishers (who then spread over it) and subscribers (who
/// open a stream on it) within this long, with no lookup per request.
pub const SOURCES_REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// Which source a data-plane request goes to, decided at each attempt from the sources known
/// then (a `NotOwner` answer looks them up again, and the next attempt decides anew).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// This source (an acknowledgement of its ack ids, a pull from it, its stream).
    Source(u32),
    /// The source of this ordering key under the active count (the key map).
    Key(&'a str),
    /// The active sources in turn (an unordered publish).
    Spread,
}

/// The cached routes of one topic or subscription: each source's forwarders in the order they
/// are tried, and whether they are to be looked up again before use (`Client::forget`, or older
/// than `SOURCES_REFRESH_INTERVAL`; they are then used only when the router cannot be reached).
pub(crate) struct Routes {
    sources: Vec<Route>,
    active: u32,
    stale: bool,
    looked_up: Instant,
}

/// One source's forwarders in the order they are tried, and how many of them have failed since
/// the lookup (`Client::pass_over`).
struct Route {
    addresses: Vec<String>,
    passed: usize,
}

impl Routes {
    fn trusted(&self) -> bool {
        !self.stale && self.looked_up.elapsed() < SOURCES_REFRESH_INTERVAL
    }

    /// The source `target` names now, and its forwarders; `None` for a source not listed.
    fn pick(&self, target: Target<'_>, turn: &std::sync::atomic::AtomicUsize) -> Option<(u32, &[String])> {
        let source = match target {
            Target::Source(source) => source,
            Target::Key(key) => ringpost_model::sources::source_of_key(key.as_bytes(), self.active),
            Target::Spread if self.active <= 1 => 0,
            Target::Spread => (turn.fetch_add(1, Ordering::Relaxed) % self.active as usize) as u32,
        };
        let route = self.sources.get(source as usize)?;
        Some((source, &route.addresses))
    }
}

/// The source an ack id names: `v1.<subscription>.<source>.<offset>.<generation>` in hex; an
/// ack id of the version before (no `v1.`), or one this client cannot read, is source 0's (the
/// daemon refuses what is not an ack id).
pub(crate) fn source_of_ack_id(ack_id: &str) -> u32 {
    let Some(rest) = ack_id.strip_prefix("v1.") else { return 0 };
    let mut fields = rest.split('.');
    fields.next();
    fields.next().and_then(|source| u32::from_str_radix(source, 16).ok()).unwrap_or(0)
}

impl Client {
    /// The forwarders of the source of `name` that `target` names, in order, and its number:
    /// from the cached routes, or the router's answer. Routes no longer trusted (`forget`,
    /// `pass_over`, `SOURCES_REFRESH_INTERVAL`) are looked up again, but still used when the
    /// router cannot be reached: the router may be on the node that failed, and once connected a
    /// client should not need it.
    pub(crate) async fn route(
        &self,
        resource: Resource,
        name: &str,
        target: Target<'_>,
    ) -> Result<(u32, Vec<String>)> {
        let stale = {
            let routes = self.routes.lock().unwrap();
            match routes.get(&(resource, name.to_owned())) {
                Some(routes) if routes.trusted() => {
                    if let Some((source, addresses)) = routes.pick(target, &self.spread_turn) {
                        return Ok((source, addresses.to_vec()));
                    }
                    None
                }
                Some(routes) => routes
                    .pick(target, &self.spread_turn)
                    .map(|(source, addresses)| (source, addresses.to_vec())),
                None => None,
            }
        };
        let looked_up = match self.look_up_sources(resource, name).await {
            Ok(routes) => routes,
            Err(error) => match stale {
                Some(route) if retry::is_connection_failure(&error) => return Ok(route),
                _ => return Err(error),
            },
        };
        let mut routes = self.routes.lock().unwrap();
        let routes = routes.entry((resource, name.to_owned())).insert_entry(looked_up).into_mut();
        let unknown = || {
            Error::Status(Status::new(
                ErrorCode::NotFound,
                format!("'{name}' has no source {target:?} (it has {})", routes.sources.len()),
            ))
        };
        let (source, addresses) = routes.pick(target, &self.spread_turn).ok_or_else(unknown)?;
        Ok((source, addresses.to_vec()))
    }

    /// How many sources `name`'s topic has (retiring ones included) and how many are active,
    /// looked up if not known or no longer trusted.
    pub(crate) async fn source_count(&self, resource: Resource, name: &str) -> Result<(u32, u32)> {
        self.route(resource, name, Target::Source(0)).await?;
        let routes = self.routes.lock().unwrap();
        let routes = routes.get(&(resource, name.to_owned())).expect("looked up just now");
        Ok((routes.sources.len() as u32, routes.active))
    }

    /// Every source's forwarders, from `LookupSources`, or from the plain lookup (source 0
    /// alone) when the daemon answers it `Unimplemented` (it is from before sources; the client
    /// then asks only the plain lookup from then on).
    async fn look_up_sources(&self, resource: Resource, name: &str) -> Result<Routes> {
        let route = |addresses: Vec<String>| Route { addresses, passed: 0 };
        let empty = || Error::Status(Status::unavailable(format!("no forwarder serves '{name}'")));
        if !self.sources_unimplemented.load(Ordering::Relaxed) {
            let request = LookupSourcesRequest {
                name: name.to_owned(),
                subscription: resource == Resource::Subscription,
            };
            match self.control::<_, LookupSourcesResponse>(Command::LookupSources, &request).await {
                Ok(answer) => {
                    let mut sources = Vec::with_capacity(answer.sources.len());
                    for (index, source) in answer.sources.into_iter().enumerate() {
                        if source.number as usize != index || source.forwarders.is_empty() {
                            return Err(empty());
                        }
                        sources.push(route(
                            source.forwarders.into_iter().map(|forwarder| forwarder.address).collect(),
                        ));
                    }
                    if sources.is_empty() || answer.active == 0 || answer.active as usize > sources.len() {
                        return Err(empty());
                    }
                    return Ok(Routes {
                        sources,
                        active: answer.active,
                        stale: false,
                        looked_up: Instant::now(),
                    });
                }
                Err(error) if error.code() == ErrorCode::Unimplemented => {
                    self.sources_unimplemented.store(true, Ordering::Relaxed);
                }
                Err(error) => return Err(error),
            }
        }
        let command = match resource {
            Resource::Topic => Command::LookupTopic,
            Resource::Subscription => Command::LookupSubscription,
        };
        let answer: LookupResponse = self.control(command, &NameRequest { name: name.to_owned() }).await?;
        let addresses: Vec<String> =
            answer.forwarders.into_iter().map(|forwarder| forwarder.address).collect();
        if addresses.is_empty() {
            return Err(empty());
        }
        Ok(Routes { sources: vec![route(addresses)], active: 1, stale: false, looked_up: Instant::now() })
    }

    /// Marks `name`'s routes as no longer trusted: the next request looks them up again, and
    /// uses them only if the router cannot be reached (see `route`).
    pub(crate) fn forget(&self, resource: Resource, name: &str) {
        if let Some(routes) = self.routes.lock().unwrap().get_mut(&(resource, name.to_owned())) {
            routes.stale = true;
        }
    }

    /// Forgets `name`'s routes altogether (it was deleted).
    pub(crate) fn drop_route(&self, resource: Resource, name: &str) {
        self.routes.lock().unwrap().remove(&(resource, name.to_owned()));
    }

    /// After a connection to `address`, the first of source `source`'s route, failed. A
    /// subscription's route then tries its next forwarder first, with no new lookup: in a
    /// cluster any node's forwarder serves a subscriber, carrying its requests to the source's
    /// leader, so a subscriber carries on through another node while the router it knows may be
    /// the node that failed. Once every forwarder of the route has failed, and for a topic at
    /// once, the routes are looked up again (and kept, in their new order, for when the router
    /// cannot be reached either).
    pub(crate) fn pass_over(&self, resource: Resource, name: &str, source: u32, address: &str) {
        let mut routes = self.routes.lock().unwrap();
        let Some(routes) = routes.get_mut(&(resource, name.to_owned())) else { return };
        let Some(route) = routes.sources.get_mut(source as usize) else { return };
        if route.addresses.first().map(String::as_str) != Some(address) {
            // Another request already passed it over.
            return;
        }
        route.passed += 1;
        route.addresses.rotate_left(1);
        if resource == Resource::Topic || route.passed >= route.addresses.len() {
            routes.stale = true;
            route.passed = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_id_names_its_source_and_one_from_before_is_source_0s() {
        assert_eq!(source_of_ack_id("v1.1f.0.2a.1"), 0);
        assert_eq!(source_of_ack_id("v1.1f.1.2a.1"), 1);
        assert_eq!(source_of_ack_id("v1.1f.7ff.2a.1"), 0x7ff);
        assert_eq!(source_of_ack_id("1f.2a.1"), 0, "version 0 names no source: its topic's own log");
        assert_eq!(source_of_ack_id("v1.1f"), 0);
        assert_eq!(source_of_ack_id("v1.1f.zz.2a.1"), 0);
    }

    #[test]
    fn an_ordered_request_goes_to_its_keys_source_and_unordered_ones_take_turns() {
        let routes = Routes {
            sources: (0..3)
                .map(|number| Route { addresses: vec![format!("f{number}")], passed: 0 })
                .collect(),
            active: 2,
            stale: false,
            looked_up: Instant::now(),
        };
        let turn = std::sync::atomic::AtomicUsize::new(0);
        let spread: Vec<u32> = (0..4).map(|_| routes.pick(Target::Spread, &turn).unwrap().0).collect();
        assert_eq!(spread, [0, 1, 0, 1], "the retiring source 2 takes no publishes");
        for key in ["a", "b", "order-17"] {
            let expected = ringpost_model::sources::source_of_key(key.as_bytes(), 2);
            assert_eq!(routes.pick(Target::Key(key), &turn).unwrap().0, expected);
        }
        assert_eq!(routes.pick(Target::Source(2), &turn).unwrap(), (2, &["f2".to_owned()][..]));
        assert!(routes.pick(Target::Source(3), &turn).is_none());
    }
}
