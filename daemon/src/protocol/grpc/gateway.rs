//! What every gRPC handler shares: the callers of the router shard and of each forwarder
//! shard, and the node's cache of who serves which topic and subscription
//! (`dispatch::routes`): one of this node's forwarder shards, which the call goes to, or
//! another node, whose forwarder a shard of this node carries the call to with its `relay`,
//! which reads the same cache.

use super::bridge::ShardCaller;
use super::credentials::Presented;
use crate::api::{Code, Status};
use crate::auth::Access;
pub use crate::dispatch::routes::Resource;
use crate::dispatch::routes::{Owner, Routes, ROUTES_CACHED_MAX};
use crate::dispatch::{Caller, Door, Kind, Operation, Outcome};
use crate::router::Router;
use crate::schema::TopicValidator;
use crate::shard::Forwarder;
use crate::storage::dma::DmaStorage;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a job on the router shard works with.
pub struct RouterShard {
    pub router: Rc<Router<DmaStorage>>,
    pub door: Rc<Door<DmaStorage>>,
    pub access: Rc<Access>,
    /// How it reaches the other nodes, in a cluster.
    pub peers: Option<Rc<crate::net::peer::PeerPool>>,
    /// The other nodes' push keys it learnt, which the monitoring endpoint serves.
    pub push_keys: std::cell::RefCell<crate::push::keys::PushKeys>,
}

/// What a job on a forwarder shard works with.
pub struct ForwarderShard {
    pub forwarder: Rc<Forwarder<DmaStorage>>,
    pub access: Rc<Access>,
}

/// The shard a call on a resource goes to.
pub enum Serving<'a> {
    /// It serves the resource.
    Here(&'a ShardCaller<ForwarderShard>),
    /// Another node serves the resource: this shard carries the call there (`relay`), for the
    /// principal it authenticates the caller as, decided there.
    Elsewhere(&'a ShardCaller<ForwarderShard>),
}

pub struct Gateway {
    pub router: ShardCaller<RouterShard>,
    pub forwarders: Vec<ShardCaller<ForwarderShard>>,
    /// Who serves what: the node's one cache, which its forwarder shards' relays share.
    routes: Arc<Routes>,
    /// Each topic's and subscription's sources, as the router last said (`sources`).
    sources: Mutex<SourcesCache>,
    /// Turns the sources an unordered publish or a pull starts at, so that none is always last.
    turn: AtomicUsize,
    /// Each topic's schema, compiled, as the router last said (`topic_schema`).
    schemas: Mutex<SchemasCache>,
}

/// What the gateway learnt of each topic's schema, and when.
type SchemasCache = HashMap<String, (Instant, Option<Arc<TopicValidator>>)>;

/// How long the gateway trusts what it learnt of a topic's schema before asking the router
/// again: a change of a topic's schema settings made through another node, or a revision
/// committed since, is checked within it (one made through this node at once).
pub const GRPC_SCHEMAS_CACHED_MS: u64 = 5_000;

/// What the gateway learnt of each resource's sources, and when (`Gateway::gathered`).
type SourcesCache = HashMap<Resource, (Instant, Option<Arc<Gathered>>)>;

/// How long the gateway trusts what it learnt of a topic's sources before asking the router
/// again: a source added by `topic update --sources` is published to and gathered from within
/// it. A stale answer costs a retry at worst (a source that no longer serves answers
/// `NotOwner`); a lookup costs one job on the router shard.
pub const GRPC_SOURCES_CACHED_MS: u64 = 5_000;

/// A topic of several sources: what the gateway spreads publishes over and gathers deliveries
/// from, each source where its leader is (`places[n]` is source `n`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    /// How many sources take publishes (the count the key map counts).
    pub active: u32,
    pub places: Vec<Place>,
}

/// Where the gateway sends one source's calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// This node's forwarder shard of this local index leads the source: one hop to it.
    Here(usize),
    /// Another node's forwarder (`owner`) leads the source: this node's shard `carrier` carries
    /// the source's calls there with its relay (`Relay::carry_to`, `Relay::stream_to`),
    /// addressed to that forwarder, which holds the topic's one unit on its shard.
    Elsewhere { owner: Owner, carrier: usize },
}

impl Gathered {
    /// The sources in turn from `start` (modulo their count), each with its number.
    pub fn rotated(&self, start: usize) -> impl Iterator<Item = (u32, &Place)> + '_ {
        let count = self.places.len();
        (0..count).map(move |step| {
            let source = (start + step) % count;
            (source as u32, &self.places[source])
        })
    }
}

impl Gateway {
    pub fn new(
        router: ShardCaller<RouterShard>,
        forwarders: Vec<ShardCaller<ForwarderShard>>,
        routes: Arc<Routes>,
    ) -> Gateway {
        Gateway {
            router,
            forwarders,
            routes,
            sources: Mutex::new(HashMap::new()),
            turn: AtomicUsize::new(0),
            schemas: Mutex::new(HashMap::new()),
        }
    }

    /// The next turn of the gateway's rotation over sources.
    pub fn next_turn(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed)
    }

    /// The sources of `resource` (a topic, or a subscription's topic) when it has several: the
    /// gateway spreads and gathers over them itself, one hop to a source led on this node, one
    /// carried call to one led on another. `None` for a topic of one source, or one with a
    /// source that has no leader now: its calls go as before, to source 0 (on this node or
    /// carried). Remembered for `GRPC_SOURCES_CACHED_MS`; a failed lookup is not remembered,
    /// and is told only to a caller allowed calls of `kind` on the resource, as
    /// `topic_forwarder` does.
    pub async fn gathered(
        &self,
        presented: &Presented,
        resource: &Resource,
        kind: Kind,
    ) -> Result<Option<Arc<Gathered>>, Status> {
        let now = Instant::now();
        if let Some((learnt, gathered)) = self.sources_cache().get(resource) {
            if now.duration_since(*learnt) < Duration::from_millis(GRPC_SOURCES_CACHED_MS) {
                return Ok(gathered.clone());
            }
        }
        let (presented, looked_up) = (presented.clone(), resource.clone());
        let routes = self
            .router
            .try_call(move |shard| async move {
                let routes = match &looked_up {
                    Resource::Topic(name) => shard.router.lookup_topic_sources(name, None, None),
                    Resource::Subscription(name) => {
                        shard.router.lookup_subscription_sources(name, None, None)
                    }
                };
                if routes.is_err() {
                    presented.check(&shard.access, kind, looked_up.name())?;
                }
                Ok(routes?)
            })
            .await?;
        let gathered = self.gathered_of(resource, &routes).map(Arc::new);
        let mut cache = self.sources_cache();
        if cache.len() >= ROUTES_CACHED_MAX && !cache.contains_key(resource) {
            cache.clear();
        }
        cache.insert(resource.clone(), (now, gathered.clone()));
        Ok(gathered)
    }

    /// Where each source of `routes` is served, if there are several and each has a leader. A
    /// source led on another node is carried by one of this node's shards, chosen by the
    /// resource and the source's number, so that carried calls spread over the shards and each
    /// source's stay on one.
    fn gathered_of(&self, resource: &Resource, routes: &crate::router::SourceRoutes) -> Option<Gathered> {
        if routes.sources.len() < 2 || self.forwarders.is_empty() {
            return None;
        }
        let mut places = Vec::with_capacity(routes.sources.len());
        for (number, route) in routes.sources.iter().enumerate() {
            assert_eq!(route.source.get() as usize, number, "a lookup lists sources in order");
            let leader = route.forwarders.first()?;
            let owner = Owner { shard: leader.shard, address: leader.address.clone() };
            let local = owner.shard.local() as usize;
            if self.routes.is_here(&owner) {
                // A shard this node does not run (it started with fewer): no place to serve.
                (local < self.forwarders.len()).then_some(())?;
                places.push(Place::Here(local));
                continue;
            }
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (resource, number).hash(&mut hasher);
            let carrier = (hasher.finish() % self.forwarders.len() as u64) as usize;
            places.push(Place::Elsewhere { owner, carrier });
        }
        Some(Gathered { active: routes.active.clamp(1, places.len() as u32), places })
    }

    /// Topic `topic`'s schema, compiled, if it has one: what a publish's messages are checked
    /// against before any is appended. Remembered for `GRPC_SCHEMAS_CACHED_MS`; asked of the
    /// router (which answers from its catalog, on any node) for who may publish to the topic.
    pub async fn topic_schema(
        &self,
        presented: &Presented,
        topic: &str,
    ) -> Result<Option<Arc<TopicValidator>>, Status> {
        let now = Instant::now();
        if let Some((learnt, validator)) = self.schemas_cache().get(topic) {
            if now.duration_since(*learnt) < Duration::from_millis(GRPC_SCHEMAS_CACHED_MS) {
                return Ok(validator.clone());
            }
        }
        let (presented, name) = (presented.clone(), topic.to_owned());
        let schema = self
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, Kind::Publish, &name)?;
                match shard.router.topic_schema(&name) {
                    // No such topic: the publish's own lookup refuses it, in its own words.
                    Err(error) if error.code() == Code::NotFound => Ok(None),
                    answer => Ok(Some(answer?)),
                }
            })
            .await?;
        let Some(schema) = schema else { return Ok(None) };
        // Compiled here, on the gateway's threads, never on the router shard.
        let validator =
            schema.map(|schema| Arc::new(TopicValidator::new(schema.settings, &schema.revisions)));
        let mut cache = self.schemas_cache();
        if cache.len() >= ROUTES_CACHED_MAX && !cache.contains_key(topic) {
            cache.clear();
        }
        cache.insert(topic.to_owned(), (now, validator.clone()));
        Ok(validator)
    }

    /// Forgets every topic's schema (a schema or a topic's settings changed through this node).
    pub fn forget_schemas(&self) {
        self.schemas_cache().clear();
    }

    fn schemas_cache(&self) -> std::sync::MutexGuard<'_, SchemasCache> {
        self.schemas.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cache of sources, held for one look or one change (never across an await).
    fn sources_cache(&self) -> std::sync::MutexGuard<'_, SourcesCache> {
        self.sources.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a control-plane operation through the router shard's door, for whom `presented`
    /// authenticates there.
    pub async fn execute(&self, presented: &Presented, operation: Operation) -> Result<Outcome, Status> {
        let presented = presented.clone();
        self.router
            .try_call(move |shard| async move {
                let session = presented.session(&shard.access)?;
                shard.door.execute(&Caller::new(&session, &shard.access), operation).await
            })
            .await
    }

    /// The shard serving `topic`, for a call of `kind` on it. When the route is not cached the
    /// router looks it up; a topic this node serves, or none does, is checked here first, so
    /// that a caller without the permission learns nothing, not even whether the topic exists
    /// (the forwarder checks again for its own operation); a topic another node serves is
    /// decided there, with that node's access file, for the principal this node authenticates.
    pub async fn topic_forwarder(
        &self,
        presented: &Presented,
        topic: &str,
        kind: Kind,
    ) -> Result<Serving<'_>, Status> {
        self.serving(presented, Resource::Topic(topic.to_owned()), kind).await
    }

    /// The shard serving `subscription` (its topic's), as `topic_forwarder`.
    pub async fn subscription_forwarder(
        &self,
        presented: &Presented,
        subscription: &str,
        kind: Kind,
    ) -> Result<Serving<'_>, Status> {
        self.serving(presented, Resource::Subscription(subscription.to_owned()), kind).await
    }

    async fn serving(
        &self,
        presented: &Presented,
        resource: Resource,
        kind: Kind,
    ) -> Result<Serving<'_>, Status> {
        let owner = self
            .routes
            .owner(&resource, || {
                let (presented, looked_up) = (presented.clone(), resource.clone());
                self.router.try_call(move |shard| async move {
                    let name = looked_up.name();
                    let forwarders = match &looked_up {
                        Resource::Topic(name) => shard.router.lookup_topic(name, None, None),
                        Resource::Subscription(name) => shard.router.lookup_subscription(name, None, None),
                    };
                    let owner = forwarders.map_err(Status::from).and_then(|forwarders| {
                        let forwarders = forwarders.into_iter().map(|found| (found.shard, found.address));
                        Owner::first(&looked_up, forwarders)
                    });
                    match owner {
                        Ok(owner) if owner.node() != shard.router.node_id() => Ok(owner),
                        owner => {
                            presented.check(&shard.access, kind, name)?;
                            owner
                        }
                    }
                })
            })
            .await?;
        self.shard_of(&resource, &owner)
    }

    /// The shard a call on `resource`, served by `owner`, goes to: the owner, when it is one of
    /// this node's, or, for a resource another node serves, the shard that carries its calls
    /// (chosen by the resource's name, so that carried calls spread over the shards and each
    /// resource's stay on one).
    fn shard_of(&self, resource: &Resource, owner: &Owner) -> Result<Serving<'_>, Status> {
        if self.routes.is_here(owner) {
            let shard = owner.shard.local();
            return self.forwarders.get(shard as usize).map(Serving::Here).ok_or_else(|| {
                Status::unavailable(format!("this node has no forwarder shard {shard}; retry"))
            });
        }
        if self.forwarders.is_empty() {
            return Err(Status::unavailable("this node has no forwarder shard to carry the call; retry"));
        }
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        resource.hash(&mut hasher);
        let shard = (hasher.finish() % self.forwarders.len() as u64) as usize;
        Ok(Serving::Elsewhere(&self.forwarders[shard]))
    }

    /// Forgets who serves `resource` if the answer `status` of a call on it says it may have
    /// changed (`dispatch::routes::is_stale`).
    pub fn forget_if_stale(&self, resource: &Resource, status: &Status) {
        if self.routes.forget_if_stale(resource, status) {
            self.sources_cache().remove(resource);
        }
    }

    /// Forgets who serves `resource`: it is served here no more (after a stale route) or this
    /// node deleted it.
    pub fn forget(&self, resource: &Resource) {
        self.routes.forget(resource);
        self.sources_cache().remove(resource);
    }

    /// Forgets every route (a topic's deletion leaves its subscriptions' routes stale too).
    pub fn forget_all(&self) {
        self.routes.forget_all();
        self.sources_cache().clear();
        // A topic created again under the name must not be checked against the old one's schema.
        self.schemas_cache().clear();
    }
}

/// Whether a forwarder's answer means the call went to one that no longer serves its resource,
/// so that it is asked once more through the router (the route was forgotten with it).
pub fn is_stale_route(status: &Status) -> bool {
    status.code == Code::NotOwner
}
