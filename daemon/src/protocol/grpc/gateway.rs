//! What every gRPC handler shares: the callers of the router shard and of each forwarder
//! shard, and a cache of which of this node's forwarder shards serves which topic and
//! subscription, or that another node does (then a shard of this node carries the call there
//! with its `relay`, which remembers that node: the one cache of remote owners).

use super::bridge::ShardCaller;
use super::credentials::Presented;
use crate::api::{Code, Status};
use crate::auth::Access;
use crate::dispatch::{Caller, Door, Kind, Operation, Outcome};
pub use crate::net::relay::Resource;
use crate::router::Router;
use crate::shard::Forwarder;
use crate::storage::dma::DmaStorage;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Mutex;

/// Routes the gateway remembers; past it the cache is emptied and refilled from the router.
pub const GRPC_ROUTES_CACHED_MAX: usize = 100_000;

/// What a job on the router shard works with.
pub struct RouterShard {
    pub router: Rc<Router<DmaStorage>>,
    pub door: Rc<Door<DmaStorage>>,
    pub access: Rc<Access>,
}

/// What a job on a forwarder shard works with.
pub struct ForwarderShard {
    pub forwarder: Rc<Forwarder<DmaStorage>>,
    pub access: Rc<Access>,
}

/// Where a topic's or a subscription's calls go, as the gateway remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// This node's forwarder shard of this number serves it.
    Here(u32),
    /// Another node does.
    Elsewhere,
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
    /// This node's id in its cluster, when it is one of a cluster's.
    pub cluster_node: Option<u64>,
    routes: Mutex<HashMap<Resource, Route>>,
}

impl Gateway {
    pub fn new(
        router: ShardCaller<RouterShard>,
        forwarders: Vec<ShardCaller<ForwarderShard>>,
        cluster_node: Option<u64>,
    ) -> Gateway {
        Gateway { router, forwarders, cluster_node, routes: Mutex::new(HashMap::new()) }
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
        if let Some(route) = self.routes.lock().expect("routes").get(&resource).copied() {
            return self.shard_of(&resource, route);
        }
        let (presented, looked_up) = (presented.clone(), resource.clone());
        let route = self
            .router
            .try_call(move |shard| async move {
                let (name, forwarders) = match &looked_up {
                    Resource::Topic(name) => (name, shard.router.lookup_topic(name, None)),
                    Resource::Subscription(name) => (name, shard.router.lookup_subscription(name, None)),
                };
                let first = forwarders.as_ref().ok().and_then(|forwarders| forwarders.first());
                if let Some(first) = first {
                    let (node, local) = crate::catalog::node_and_shard(first.shard);
                    if node != shard.router.node_id() {
                        return Ok(Route::Elsewhere);
                    }
                    presented.check(&shard.access, kind, name)?;
                    return Ok(Route::Here(local));
                }
                presented.check(&shard.access, kind, name)?;
                Err(forwarders.err().map_or_else(
                    || Status::unavailable("no forwarder serves this resource; retry"),
                    Status::from,
                ))
            })
            .await?;
        let serving = self.shard_of(&resource, route)?;
        let mut routes = self.routes.lock().expect("routes");
        if routes.len() >= GRPC_ROUTES_CACHED_MAX {
            routes.clear();
        }
        routes.insert(resource, route);
        Ok(serving)
    }

    /// The shard a route names: its own, or, for a resource another node serves, the shard
    /// that carries its calls (chosen by the resource's name, so that carried calls spread
    /// over the shards and each resource's stay on one).
    fn shard_of(&self, resource: &Resource, route: Route) -> Result<Serving<'_>, Status> {
        match route {
            Route::Here(shard) => self.forwarders.get(shard as usize).map(Serving::Here).ok_or_else(|| {
                Status::unavailable(format!("this node has no forwarder shard {shard}; retry"))
            }),
            Route::Elsewhere => {
                if self.forwarders.is_empty() {
                    return Err(Status::unavailable(
                        "this node has no forwarder shard to carry the call; retry",
                    ));
                }
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                resource.hash(&mut hasher);
                let shard = (hasher.finish() % self.forwarders.len() as u64) as usize;
                Ok(Serving::Elsewhere(&self.forwarders[shard]))
            }
        }
    }

    /// Forgets a topic's route: after `NotOwner` (the topic moved, or was deleted and made
    /// again elsewhere), or its deletion.
    pub fn forget_topic(&self, topic: &str) {
        self.routes.lock().expect("routes").remove(&Resource::Topic(topic.to_owned()));
    }

    pub fn forget_subscription(&self, subscription: &str) {
        self.routes.lock().expect("routes").remove(&Resource::Subscription(subscription.to_owned()));
    }

    /// Forgets every route (a topic's deletion leaves its subscriptions' routes stale too).
    pub fn forget_all(&self) {
        self.routes.lock().expect("routes").clear();
    }
}

/// Whether a forwarder's answer means the route was stale, so the caller should forget it and
/// ask once more.
pub fn is_stale_route(status: &Status) -> bool {
    status.code == Code::NotOwner
}
