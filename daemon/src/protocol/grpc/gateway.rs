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
use crate::dispatch::routes::{Owner, Routes};
use crate::dispatch::{Caller, Door, Kind, Operation, Outcome};
use crate::router::Router;
use crate::shard::Forwarder;
use crate::storage::dma::DmaStorage;
use std::rc::Rc;
use std::sync::Arc;

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
}

impl Gateway {
    pub fn new(
        router: ShardCaller<RouterShard>,
        forwarders: Vec<ShardCaller<ForwarderShard>>,
        routes: Arc<Routes>,
    ) -> Gateway {
        Gateway { router, forwarders, routes }
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
        self.routes.forget_if_stale(resource, status);
    }

    /// Forgets who serves `resource`: it is served here no more (after a stale route) or this
    /// node deleted it.
    pub fn forget(&self, resource: &Resource) {
        self.routes.forget(resource);
    }

    /// Forgets every route (a topic's deletion leaves its subscriptions' routes stale too).
    pub fn forget_all(&self) {
        self.routes.forget_all();
    }
}

/// Whether a forwarder's answer means the call went to one that no longer serves its resource,
/// so that it is asked once more through the router (the route was forgotten with it).
pub fn is_stale_route(status: &Status) -> bool {
    status.code == Code::NotOwner
}
