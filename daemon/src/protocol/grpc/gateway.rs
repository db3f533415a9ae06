//! What every gRPC handler shares: the callers of the router shard and of each forwarder
//! shard, and a cache of which forwarder serves which topic and subscription.

use super::bridge::ShardCaller;
use super::credentials::Presented;
use crate::api::{Code, Status};
use crate::auth::{Access, Permission};
use crate::dispatch::{Caller, Door, Operation, Outcome};
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

/// A topic or a subscription, as routes are cached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    Topic(String),
    Subscription(String),
}

pub struct Gateway {
    pub router: ShardCaller<RouterShard>,
    pub forwarders: Vec<ShardCaller<ForwarderShard>>,
    /// This node's id in its cluster, when it is one of a cluster's.
    pub cluster_node: Option<u64>,
    routes: Mutex<HashMap<Resource, u32>>,
    /// Topics and subscriptions another node serves, by the gRPC address of that node.
    remote_routes: Mutex<HashMap<Resource, String>>,
    /// One channel per other node's gRPC API, for the calls carried there.
    channels: Mutex<HashMap<String, tonic::transport::Channel>>,
    /// Whether calls are carried to other nodes (off over TLS).
    carrying: std::sync::atomic::AtomicBool,
}

impl Gateway {
    pub fn new(
        router: ShardCaller<RouterShard>,
        forwarders: Vec<ShardCaller<ForwarderShard>>,
        cluster_node: Option<u64>,
    ) -> Gateway {
        Gateway {
            router,
            forwarders,
            cluster_node,
            routes: Mutex::new(HashMap::new()),
            remote_routes: Mutex::new(HashMap::new()),
            channels: Mutex::new(HashMap::new()),
            carrying: std::sync::atomic::AtomicBool::new(true),
        }
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
                router_local_shard(
                    &shard.router,
                    &format!("topic '{name}'"),
                    shard.router.lookup_topic(&name, None)?,
                )
            })
            .await?;
        self.remember(resource, shard)
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
                let forwarders = shard.router.lookup_subscription(&name, None)?;
                router_local_shard(&shard.router, &format!("subscription '{name}'"), forwarders)
            })
            .await?;
        self.remember(resource, shard)
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

    /// Where a publish or delivery call for `resource` goes when another node of the cluster
    /// serves it: a channel to that node's gRPC API (`None`: this node serves it, or the
    /// router says it serves nothing, which the local call then answers). The permission is
    /// checked here first, as for a local route. A node that serves no gRPC API is
    /// `FAILED_PRECONDITION`, naming it.
    pub async fn elsewhere(
        &self,
        presented: &Presented,
        resource: Resource,
        permission: Permission,
    ) -> Result<Option<tonic::transport::Channel>, Status> {
        if self.routes.lock().expect("routes").contains_key(&resource) {
            return Ok(None);
        }
        let cached = self.remote_routes.lock().expect("routes").get(&resource).cloned();
        let address = match cached {
            Some(address) => address,
            None => {
                let (presented, looked_up) = (presented.clone(), resource.clone());
                let owner = self
                    .router
                    .try_call(move |shard| async move {
                        let (name, forwarders) = match &looked_up {
                            Resource::Topic(name) => (name.clone(), shard.router.lookup_topic(name, None)),
                            Resource::Subscription(name) => {
                                (name.clone(), shard.router.lookup_subscription(name, None))
                            }
                        };
                        presented.check(&shard.access, permission, &name)?;
                        let Some(first) =
                            forwarders.ok().and_then(|forwarders| forwarders.into_iter().next())
                        else {
                            return Ok(None);
                        };
                        let (node, _) = crate::catalog::node_and_shard(first.shard);
                        if node == shard.router.node_id() {
                            return Ok(None);
                        }
                        Ok(Some((node, shard.router.grpc_address(node))))
                    })
                    .await?;
                match owner {
                    None => return Ok(None),
                    Some((node, address)) if address.is_empty() => {
                        return Err(Status::failed_precondition(format!(
                            "node {node} serves this resource and serves no gRPC API; use the native \
                             protocol, whose clients reach any node's forwarders"
                        )))
                    }
                    Some((_, address)) => {
                        let mut remote = self.remote_routes.lock().expect("routes");
                        if remote.len() >= GRPC_ROUTES_CACHED_MAX {
                            remote.clear();
                        }
                        remote.insert(resource, address.clone());
                        address
                    }
                }
            }
        };
        Ok(Some(self.channel(&address)?))
    }

    /// Whether calls may be carried to other nodes: in a cluster, in plaintext (`carry`).
    pub fn carries(&self) -> bool {
        self.carrying.load(std::sync::atomic::Ordering::Relaxed) && self.cluster_node.is_some()
    }

    /// Turns carrying off (over TLS, see `carry`).
    pub fn set_carrying(&self, carrying: bool) {
        self.carrying.store(carrying, std::sync::atomic::Ordering::Relaxed);
    }

    /// Forgets where another node serves `resource` (its call failed: the resource may have
    /// moved, or the node gone).
    pub fn forget_elsewhere(&self, resource: &Resource) {
        self.remote_routes.lock().expect("routes").remove(resource);
    }

    /// The channel to another node's gRPC API, made on first use (it connects when first
    /// called, and again after the connection breaks), for calls carried to a topic's node
    /// (`carry`).
    pub fn channel(&self, address: &str) -> Result<tonic::transport::Channel, Status> {
        let mut channels = self.channels.lock().expect("channels");
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|error| Status::unavailable(format!("node gRPC address {address:?}: {error}")))?
            .connect_timeout(super::carry::GRPC_CARRY_CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        if channels.len() >= super::carry::GRPC_CARRY_CHANNELS_MAX {
            channels.clear();
        }
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    fn cached(&self, resource: &Resource) -> Option<&ShardCaller<ForwarderShard>> {
        let shard = *self.routes.lock().expect("routes").get(resource)?;
        self.forwarders.get(shard as usize)
    }

    fn remember(&self, resource: Resource, shard: u32) -> Result<&ShardCaller<ForwarderShard>, Status> {
        let caller = self
            .forwarders
            .get(shard as usize)
            .ok_or_else(|| Status::unavailable(format!("this node has no forwarder shard {shard}; retry")))?;
        let mut routes = self.routes.lock().expect("routes");
        if routes.len() >= GRPC_ROUTES_CACHED_MAX {
            routes.clear();
        }
        routes.insert(resource, shard);
        Ok(caller)
    }
}

/// The local shard of this node's forwarder that serves a resource (`what`), the first of
/// `forwarders`. The lookup names a cluster's shard (node and local shard); this API reaches
/// only this node's shards, through their job channels, so a resource another node serves is
/// refused, naming that node and its gRPC API (`grpc_address_of`), rather than sent to this
/// node's shard of the same number.
fn local_shard(
    this_node: u64,
    grpc_address_of: impl Fn(u64) -> String,
    what: &str,
    forwarders: Vec<crate::api::control::ForwarderAddress>,
) -> Result<u32, Status> {
    let first =
        forwarders.first().ok_or_else(|| Status::unavailable("no forwarder serves this resource; retry"))?;
    let (node, local) = crate::catalog::node_and_shard(first.shard);
    if node == this_node {
        return Ok(local);
    }
    let grpc = grpc_address_of(node);
    let elsewhere = if grpc.is_empty() {
        format!("node {node} serves no gRPC API: use")
    } else {
        format!("call node {node}'s gRPC API at {grpc}, or use")
    };
    Err(Status::failed_precondition(format!(
        "{what} is served by node {node}'s forwarders, and this node's gRPC API reaches only its own; {elsewhere} \
         the native protocol, whose clients reach any node's forwarders"
    )))
}

/// `local_shard` with what the router knows.
fn router_local_shard<S: crate::storage::Storage>(
    router: &Router<S>,
    what: &str,
    forwarders: Vec<crate::api::control::ForwarderAddress>,
) -> Result<u32, Status> {
    local_shard(router.node_id(), |node| router.grpc_address(node), what, forwarders)
}

/// Whether a forwarder's answer means the route was stale, so the caller should forget it and
/// ask once more.
pub fn is_stale_route(status: &Status) -> bool {
    status.code == Code::NotOwner
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::control::ForwarderAddress;
    use crate::catalog::global_shard;

    fn at(shards: &[u32]) -> Vec<ForwarderAddress> {
        shards
            .iter()
            .map(|&shard| ForwarderAddress { shard, address: format!("forwarder {shard}") })
            .collect()
    }

    #[test]
    fn only_this_nodes_forwarders_are_reached_and_another_nodes_are_named() {
        let grpc = |node: u64| if node == 3 { String::new() } else { format!("10.0.0.{node}:8085") };
        // Node 2's second shard is its local shard 1, not the 65,537th of this node.
        assert_eq!(local_shard(2, grpc, "topic 'a'", at(&[global_shard(2, 1), global_shard(1, 0)])), Ok(1));
        assert_eq!(local_shard(1, grpc, "topic 'a'", at(&[global_shard(1, 1)])), Ok(1));
        let refused =
            local_shard(2, grpc, "topic 'a'", at(&[global_shard(1, 0), global_shard(2, 0)])).unwrap_err();
        assert_eq!(refused.code, Code::FailedPrecondition);
        assert!(refused.message.contains("topic 'a' is served by node 1's forwarders"), "{refused}");
        assert!(refused.message.contains("call node 1's gRPC API at 10.0.0.1:8085"), "{refused}");
        let refused = local_shard(1, grpc, "subscription 'b'", at(&[global_shard(3, 1)])).unwrap_err();
        assert!(refused.message.contains("node 3 serves no gRPC API: use the native protocol"), "{refused}");
        assert_eq!(local_shard(1, grpc, "topic 'a'", Vec::new()).unwrap_err().code, Code::Unavailable);
    }
}
