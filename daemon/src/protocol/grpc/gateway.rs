//! What every gRPC handler shares: the callers of the router shard and of each forwarder
//! shard, and a cache of which forwarder serves which topic and subscription.

use super::bridge::ShardCaller;
use super::credentials::Presented;
use super::forward::LeaderViewReceiver;
use crate::api::{Code, Status};
use crate::auth::{Access, Permission};
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
    pub access: Rc<Access>,
}

/// What a job on a forwarder shard works with.
pub struct ForwarderShard {
    pub forwarder: Rc<Forwarder<DmaStorage>>,
    pub access: Rc<Access>,
}

/// A topic or a subscription, as routes are cached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Resource {
    Topic(String),
    Subscription(String),
}

pub struct Gateway {
    pub router: ShardCaller<RouterShard>,
    pub forwarders: Vec<ShardCaller<ForwarderShard>>,
    /// Whether this node leads the catalog and where the leader's gRPC API is, kept by the
    /// router shard (`forward`).
    pub leader: LeaderViewReceiver,
    routes: Mutex<HashMap<Resource, u32>>,
}

impl Gateway {
    pub fn new(
        router: ShardCaller<RouterShard>,
        forwarders: Vec<ShardCaller<ForwarderShard>>,
        leader: LeaderViewReceiver,
    ) -> Gateway {
        Gateway { router, forwarders, leader, routes: Mutex::new(HashMap::new()) }
    }

    /// The forwarder serving `topic`, for a request that needs `permission` on it (checked by
    /// the router when the route is not cached, so that a caller without it learns nothing,
    /// not even whether the topic exists; the forwarder checks again for its own operation).
    pub async fn topic_forwarder(
        &self,
        presented: &Presented,
        topic: &str,
        permission: Permission,
    ) -> Result<&ShardCaller<ForwarderShard>, Status> {
        let resource = Resource::Topic(topic.to_owned());
        if let Some(shard) = self.cached(&resource) {
            return Ok(shard);
        }
        let (presented, name) = (presented.clone(), topic.to_owned());
        let shard = self
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, permission, &name)?;
                first_shard(shard.router.lookup_topic(&name, None)?)
            })
            .await?;
        Ok(self.remember(resource, shard))
    }

    /// The forwarder serving `subscription` (its topic's), as `topic_forwarder`.
    pub async fn subscription_forwarder(
        &self,
        presented: &Presented,
        subscription: &str,
        permission: Permission,
    ) -> Result<&ShardCaller<ForwarderShard>, Status> {
        let resource = Resource::Subscription(subscription.to_owned());
        if let Some(shard) = self.cached(&resource) {
            return Ok(shard);
        }
        let (presented, name) = (presented.clone(), subscription.to_owned());
        let shard = self
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, permission, &name)?;
                first_shard(shard.router.lookup_subscription(&name, None)?)
            })
            .await?;
        Ok(self.remember(resource, shard))
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

    fn cached(&self, resource: &Resource) -> Option<&ShardCaller<ForwarderShard>> {
        let shard = *self.routes.lock().expect("routes").get(resource)?;
        self.forwarders.get(shard as usize)
    }

    fn remember(&self, resource: Resource, shard: u32) -> &ShardCaller<ForwarderShard> {
        let mut routes = self.routes.lock().expect("routes");
        if routes.len() >= GRPC_ROUTES_CACHED_MAX {
            routes.clear();
        }
        routes.insert(resource, shard);
        &self.forwarders[shard as usize]
    }
}

fn first_shard(addresses: Vec<crate::api::control::ForwarderAddress>) -> Result<u32, Status> {
    addresses
        .first()
        .map(|address| address.shard)
        .ok_or_else(|| Status::unavailable("no forwarder serves this resource; retry"))
}

/// Whether a forwarder's answer means the route was stale, so the caller should forget it and
/// ask once more.
pub fn is_stale_route(status: &Status) -> bool {
    status.code == Code::NotOwner
}
