//! Routes to each of a topic's publish sources. A topic's messages live in one or more sources,
//! each a log on its own forwarder: the router's `LookupSources` lists every source with its
//! forwarders, and how many are *active* (take publishes). A publish goes to one active source
//! (an ordering key's, by the key map; an unordered request's to the active source with the
//! fewest requests outstanding, ties in turn); a subscriber reads from every source; an
//! acknowledgement goes to the source its ack id names.
//!
//! A daemon from before sources answers `LookupSources` with `Unimplemented`: the client then
//! asks the plain lookup, whose list is source 0's, the only source such a daemon has.

use crate::retry;
use crate::{Client, Error, Resource, Result};
use ringpost_wire::messages::{LookupResponse, LookupSourcesRequest, LookupSourcesResponse, NameRequest};
use ringpost_wire::{Command, ErrorCode, Status};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
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
    /// The active source with the fewest requests outstanding from this client, ties going in
    /// turn (an unordered publish; see `least_outstanding`).
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

/// One source's forwarders in the order they are tried, how many of them have failed since
/// the lookup (`Client::pass_over`), and how many of this client's requests to the source are
/// outstanding.
struct Route {
    addresses: Vec<String>,
    passed: usize,
    /// Requests sent to this source and not yet settled, counted by their `Outstanding`. Shared
    /// with the requests in flight, and carried over to the routes looked up again, so that
    /// every request gives back exactly what it took from the count it took it from.
    outstanding: Arc<AtomicU32>,
}

impl Route {
    fn new(addresses: Vec<String>) -> Route {
        Route { addresses, passed: 0, outstanding: Arc::default() }
    }
}

/// One request counted among its source's outstanding ones from when its source was picked
/// until it is dropped: answered, refused, failed, timed out or abandoned alike, so a request
/// that fails gives its count back. Taking one allocates nothing (the count is the route's).
pub(crate) struct Outstanding(Arc<AtomicU32>);

impl Outstanding {
    fn take(count: &Arc<AtomicU32>) -> Outstanding {
        count.fetch_add(1, Ordering::Relaxed);
        Outstanding(count.clone())
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "a source's outstanding count went below zero");
    }
}

/// The active source (of `active`, at least 1) an unordered request goes to: the one with the
/// fewest requests outstanding, `outstanding(source)`, ties going to the first from `turn` on.
/// A source whose shard answers more slowly holds more requests, so it is sent fewer, instead
/// of an equal share that would hold every publisher's window on it while the others idle;
/// sources equally loaded (a client with one request at a time) take strict turns.
pub(crate) fn least_outstanding(active: u32, turn: usize, outstanding: impl Fn(u32) -> u32) -> u32 {
    let first = (turn % active.max(1) as usize) as u32;
    let (mut best, mut fewest) = (first, outstanding(first));
    for step in 1..active {
        let source = (first + step) % active;
        let count = outstanding(source);
        if count < fewest {
            (best, fewest) = (source, count);
        }
    }
    best
}

impl Routes {
    fn trusted(&self) -> bool {
        !self.stale && self.looked_up.elapsed() < SOURCES_REFRESH_INTERVAL
    }

    /// The source `target` names now, and its route; `None` for a source not listed.
    fn pick(&self, target: Target<'_>, turn: &AtomicUsize) -> Option<(u32, &Route)> {
        let source = match target {
            Target::Source(source) => source,
            Target::Key(key) => ringpost_model::sources::source_of_key(key.as_bytes(), self.active),
            Target::Spread if self.active <= 1 => 0,
            Target::Spread => {
                let turn = turn.fetch_add(1, Ordering::Relaxed);
                least_outstanding(self.active, turn, |source| self.outstanding(source))
            }
        };
        let route = self.sources.get(source as usize)?;
        Some((source, route))
    }

    /// How many of this client's requests to `source` are outstanding.
    fn outstanding(&self, source: u32) -> u32 {
        self.sources.get(source as usize).map_or(0, |route| route.outstanding.load(Ordering::Relaxed))
    }

    /// Takes over the outstanding counts of `before`, the routes these replace: the requests in
    /// flight give back to the counts they took from, which the new routes then go on using.
    fn carry_counts(&mut self, before: &Routes) {
        for (route, old) in self.sources.iter_mut().zip(&before.sources) {
            route.outstanding = old.outstanding.clone();
        }
    }
}

/// The source picked, its forwarders, and the request counted outstanding on it if asked.
type Picked = (u32, Vec<String>, Option<Outstanding>);

/// `Routes::pick`'s answer taken out of the lock, counted outstanding if `counted`.
fn picked((source, route): (u32, &Route), counted: bool) -> Picked {
    let outstanding = counted.then(|| Outstanding::take(&route.outstanding));
    (source, route.addresses.clone(), outstanding)
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
        let (source, addresses, _) = self.route_picked(resource, name, target, false).await?;
        Ok((source, addresses))
    }

    /// `route`, with the request counted among the outstanding ones of the source picked until
    /// the `Outstanding` returned is dropped: what a data-plane request's attempt holds, so
    /// that unordered publishes go where fewest are outstanding.
    pub(crate) async fn route_counted(
        &self,
        resource: Resource,
        name: &str,
        target: Target<'_>,
    ) -> Result<(u32, Vec<String>, Outstanding)> {
        let (source, addresses, outstanding) = self.route_picked(resource, name, target, true).await?;
        Ok((source, addresses, outstanding.expect("counted")))
    }

    /// `route`'s work; the pick and its count are made under the routes' lock, so that requests
    /// sent at once from several threads see each other's counts.
    async fn route_picked(
        &self,
        resource: Resource,
        name: &str,
        target: Target<'_>,
        counted: bool,
    ) -> Result<Picked> {
        let stale = {
            let routes = self.routes.lock().unwrap();
            match routes.get(&(resource, name.to_owned())) {
                Some(routes) if routes.trusted() => {
                    if let Some(pick) = routes.pick(target, &self.spread_turn) {
                        return Ok(picked(pick, counted));
                    }
                    None
                }
                Some(routes) => routes.pick(target, &self.spread_turn).map(|pick| picked(pick, counted)),
                None => None,
            }
        };
        let mut looked_up = match self.look_up_sources(resource, name).await {
            Ok(routes) => routes,
            Err(error) => match stale {
                Some(route) if retry::is_connection_failure(&error) => return Ok(route),
                _ => return Err(error),
            },
        };
        // The stale pick's count, if it took one, is given back here: the new routes pick anew.
        drop(stale);
        let mut routes = self.routes.lock().unwrap();
        let key = (resource, name.to_owned());
        if let Some(before) = routes.get(&key) {
            looked_up.carry_counts(before);
        }
        let routes = routes.entry(key).insert_entry(looked_up).into_mut();
        let unknown = || {
            Error::Status(Status::new(
                ErrorCode::NotFound,
                format!("'{name}' has no source {target:?} (it has {})", routes.sources.len()),
            ))
        };
        let pick = routes.pick(target, &self.spread_turn).ok_or_else(unknown)?;
        Ok(picked(pick, counted))
    }

    /// How many of this client's requests to each of `name`'s sources are outstanding, by
    /// source number (empty if its routes are not known).
    #[cfg(test)]
    pub(crate) fn outstanding(&self, resource: Resource, name: &str) -> Vec<u32> {
        let routes = self.routes.lock().unwrap();
        routes.get(&(resource, name.to_owned())).map_or_else(Vec::new, |routes| {
            (0..routes.sources.len() as u32).map(|source| routes.outstanding(source)).collect()
        })
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
        let route = Route::new;
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

    fn routes(count: u32, active: u32) -> Routes {
        Routes {
            sources: (0..count).map(|number| Route::new(vec![format!("f{number}")])).collect(),
            active,
            stale: false,
            looked_up: Instant::now(),
        }
    }

    #[test]
    fn an_ordered_request_goes_to_its_keys_source_and_unordered_ones_take_turns() {
        let routes = routes(3, 2);
        let turn = AtomicUsize::new(0);
        let spread: Vec<u32> = (0..4).map(|_| routes.pick(Target::Spread, &turn).unwrap().0).collect();
        assert_eq!(spread, [0, 1, 0, 1], "none outstanding: in turn; the retiring source 2 takes none");
        for key in ["a", "b", "order-17"] {
            let expected = ringpost_model::sources::source_of_key(key.as_bytes(), 2);
            assert_eq!(routes.pick(Target::Key(key), &turn).unwrap().0, expected);
        }
        let (source, route) = routes.pick(Target::Source(2), &turn).unwrap();
        assert_eq!((source, &route.addresses[..]), (2, &["f2".to_owned()][..]));
        assert!(routes.pick(Target::Source(3), &turn).is_none());
    }

    /// The pick itself: the fewest outstanding wins wherever the turn starts; among equals the
    /// first from the turn on; one active source is always source 0.
    #[test]
    fn an_unordered_request_goes_to_the_active_source_with_fewest_outstanding_ties_in_turn() {
        let counts = [3u32, 1, 2, 1];
        let pick = |active, turn| least_outstanding(active, turn, |source| counts[source as usize]);
        assert_eq!(pick(3, 0), 1);
        assert_eq!(pick(3, 2), 1, "source 2 has its turn but more outstanding than source 1");
        assert_eq!(pick(4, 0), 1, "a tie between 1 and 3 goes to the first from the turn");
        assert_eq!(pick(4, 2), 3);
        assert_eq!(pick(4, 3), 3);
        assert_eq!(pick(1, 5), 0);
        assert_eq!(pick(2, 0), 1);
        let even = |active, turn| least_outstanding(active, turn, |_| 4);
        assert_eq!((0..6).map(|turn| even(3, turn)).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
    }

    /// Through the routes: a source holding requests is passed over until the other catches up;
    /// a request dropped (answered or failed alike) gives its count back; counts survive the
    /// routes being looked up again, so requests in flight then still give back what they took.
    #[test]
    fn a_source_holding_requests_gets_fewer_and_each_request_gives_its_count_back() {
        let turn = AtomicUsize::new(0);
        let mut routes = routes(2, 2);
        let take = |routes: &Routes| {
            let (source, addresses, outstanding) = picked(routes.pick(Target::Spread, &turn).unwrap(), true);
            assert_eq!(addresses, [format!("f{source}")]);
            (source, outstanding.unwrap())
        };
        let (first, held) = take(&routes);
        assert_eq!(first, 0);
        let mut slow = vec![held];
        // Source 0 never answers: source 1's requests are answered at once, and every request
        // goes to source 1 while source 0 holds one and source 1 none.
        for _ in 0..5 {
            let (source, answered) = take(&routes);
            assert_eq!(source, 1);
            drop(answered);
        }
        let (source, second) = take(&routes);
        assert_eq!(source, 1);
        let (source, third) = take(&routes);
        assert_eq!(source, 1, "equal counts again (1 and 1): the eighth pick's turn is source 1's");
        let (source, fourth) = take(&routes);
        assert_eq!(source, 0, "fewer outstanding (1 against 2), though the turn is source 0's anyway");
        slow.push(fourth);
        let (source, fifth) = take(&routes);
        assert_eq!(source, 1, "equal counts (2 and 2), and the turn is source 1's");
        assert_eq!((routes.outstanding(0), routes.outstanding(1)), (2, 3));
        let mut again = self::routes(2, 2);
        again.carry_counts(&routes);
        routes = again;
        assert_eq!((routes.outstanding(0), routes.outstanding(1)), (2, 3), "carried over");
        let (source, sixth) = take(&routes);
        assert_eq!(source, 0, "the routes looked up again still know source 1 holds more");
        assert_eq!((routes.outstanding(0), routes.outstanding(1)), (3, 3));
        drop((slow, sixth));
        drop((second, third, fifth));
        assert_eq!((routes.outstanding(0), routes.outstanding(1)), (0, 0));
        let (_, addresses, none) = picked(routes.pick(Target::Key("k"), &turn).unwrap(), false);
        assert!(none.is_none() && addresses.len() == 1, "counted only when asked");
    }
}
