//! Where each topic and subscription is served, as this node's router last said: the one kind
//! of cache of owners, kept by the gRPC gateway (which picks the forwarder shard a call goes to)
//! and by each forwarder shard's relay (which carries a call to another node's forwarder),
//! whichever protocol the call came in.
//!
//! One fact per resource: the forwarder the router names first, as its node, its shard on that
//! node and its address. One way to learn it: the router's lookup (`Routes::owner`, a failed
//! lookup never kept). One bound: `ROUTES_CACHED_MAX`. One rule to forget it: an answer that
//! says the owner is elsewhere or gone (`is_stale`: `NotOwner`, `NotFound`, a failed connection
//! or a deadline), and a deletion on this node (`forget`, `forget_all`).
//!
//! Shards share no lock: each forwarder shard has its own `Routes`, and the gateway one for its
//! tokio threads (a map behind a mutex, held for one look or one insert, never across an await),
//! so that a gRPC call served on this node goes to its shard in one hop. The native publish path
//! never reads it.

use crate::api::{Code, Status};
use crate::ids::{NodeId, ShardId};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

/// Owners one cache remembers (the gateway's, or one shard's relay's); past it the cache is
/// emptied and refilled from the router, one lookup per resource asked for again. Each costs a
/// name and an address (about 100 bytes), so the bound holds a cache near 10 MB, and is above
/// the topics and subscriptions a node serves in the many-topics workload (10,000 of each), so
/// that one does not keep emptying it.
pub const ROUTES_CACHED_MAX: usize = 100_000;

/// What a route is about: where its owner is looked up.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    Topic(String),
    Subscription(String),
}

impl Resource {
    pub fn name(&self) -> &str {
        match self {
            Resource::Topic(name) | Resource::Subscription(name) => name,
        }
    }

    /// "topic" or "subscription", for messages.
    pub fn what(&self) -> &'static str {
        match self {
            Resource::Topic(_) => "topic",
            Resource::Subscription(_) => "subscription",
        }
    }
}

/// The forwarder that serves a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its forwarder shard, and so its node (a node alone is node 1).
    pub shard: ShardId,
    /// Its forwarder's address, where another node carries calls to it.
    pub address: String,
}

impl Owner {
    /// The node it is on.
    pub fn node(&self) -> NodeId {
        self.shard.node()
    }

    /// The owner among a lookup's `forwarders` (the catalog's shard, which packs the node, and
    /// the address), most preferred first: the first, which leads the resource's source.
    /// `Unavailable` when there is none (the resource has no forwarder now; retry).
    pub fn first(
        resource: &Resource,
        forwarders: impl IntoIterator<Item = (ShardId, String)>,
    ) -> Result<Owner, Status> {
        let (shard, address) = forwarders.into_iter().next().ok_or_else(|| {
            Status::unavailable(format!(
                "no forwarder serves {} '{}' now; retry",
                resource.what(),
                resource.name()
            ))
        })?;
        Ok(Owner { shard, address })
    }
}

/// Whether an answer from (or on the way to) a resource's owner means the route may be stale:
/// the owner no longer serves it (`NotOwner`: it moved or its leader was deposed), it is gone
/// from there (`NotFound`: deleted, maybe made again elsewhere), or the owner could not be
/// reached or did not answer in time (`Unavailable`, `DeadlineExceeded`). Forgetting costs one
/// lookup at the next call.
pub fn is_stale(status: &Status) -> bool {
    matches!(status.code, Code::NotOwner | Code::NotFound | Code::Unavailable | Code::DeadlineExceeded)
}

/// The node's cache of owners.
pub struct Routes {
    /// This node's id: an owner on it is served here.
    node: NodeId,
    owners: Mutex<HashMap<Resource, Owner>>,
}

impl Routes {
    pub fn new(node: NodeId) -> Routes {
        Routes { node, owners: Mutex::new(HashMap::new()) }
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Whether `owner` is a forwarder of this node.
    pub fn is_here(&self, owner: &Owner) -> bool {
        owner.node() == self.node
    }

    /// The owner of `resource` as remembered, else as `lookup` learns it through this node's
    /// router (and then remembered). A failed lookup (the resource does not exist, the caller
    /// may not know, the router is unreachable) is not remembered: the next call asks again.
    pub async fn owner<F, Fut>(&self, resource: &Resource, lookup: F) -> Result<Owner, Status>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Owner, Status>>,
    {
        if let Some(owner) = self.cached(resource) {
            return Ok(owner);
        }
        let owner = lookup().await?;
        self.remember(resource, owner.clone());
        Ok(owner)
    }

    /// The owner of `resource` as remembered.
    pub fn cached(&self, resource: &Resource) -> Option<Owner> {
        self.lock().get(resource).cloned()
    }

    fn remember(&self, resource: &Resource, owner: Owner) {
        let mut owners = self.lock();
        if owners.len() >= ROUTES_CACHED_MAX && !owners.contains_key(resource) {
            owners.clear();
        }
        owners.insert(resource.clone(), owner);
        assert!(owners.len() <= ROUTES_CACHED_MAX, "the route cache outgrew ROUTES_CACHED_MAX");
    }

    /// Forgets `resource`'s owner if `status` says it may be stale (`is_stale`); whether it did.
    pub fn forget_if_stale(&self, resource: &Resource, status: &Status) -> bool {
        let stale = is_stale(status);
        if stale {
            self.forget(resource);
        }
        stale
    }

    /// Forgets `resource`'s owner (this node deleted or detached it).
    pub fn forget(&self, resource: &Resource) {
        self.lock().remove(resource);
    }

    /// Forgets every owner: a topic's deletion leaves its subscriptions' routes stale too, and
    /// they are not named where it is deleted.
    pub fn forget_all(&self) {
        self.lock().clear();
    }

    /// How many owners are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The map, held for one look or one change. A panic while it was held (an assertion
    /// above) stops the process, so a poisoned lock is not met.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Resource, Owner>> {
        self.owners.lock().expect("the route cache's lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn topic(name: &str) -> Resource {
        Resource::Topic(name.to_owned())
    }

    fn owner(node: u64, local: u32) -> Owner {
        Owner {
            shard: ShardId::new(NodeId::new(node), local),
            address: format!("10.0.0.{node}:{}", 7000 + local),
        }
    }

    /// Runs `future` to its end on this thread (nothing in it waits on a timer or a socket).
    fn run<T>(future: impl Future<Output = T>) -> T {
        futures_lite::future::block_on(future)
    }

    #[test]
    fn an_owner_is_looked_up_once_and_then_remembered() {
        let routes = Routes::new(NodeId::new(1));
        let lookups = Cell::new(0);
        let lookup = || async {
            lookups.set(lookups.get() + 1);
            Ok(owner(2, 3))
        };
        assert_eq!(run(routes.owner(&topic("orders"), lookup)).unwrap(), owner(2, 3));
        assert_eq!(run(routes.owner(&topic("orders"), lookup)).unwrap(), owner(2, 3));
        assert_eq!(lookups.get(), 1);
        // A subscription of the same name is another resource.
        let subscription = Resource::Subscription("orders".into());
        assert_eq!(routes.cached(&subscription), None);
        assert!(!routes.is_here(&owner(2, 3)) && routes.is_here(&owner(1, 0)));
    }

    #[test]
    fn a_failed_lookup_is_not_remembered() {
        let routes = Routes::new(NodeId::new(1));
        let lookups = Cell::new(0);
        let failing = || async {
            lookups.set(lookups.get() + 1);
            Err(Status::not_found("topic 'orders' does not exist"))
        };
        for _ in 0..2 {
            let refused = run(routes.owner(&topic("orders"), failing)).unwrap_err();
            assert_eq!(refused.code, Code::NotFound);
        }
        assert_eq!((lookups.get(), routes.len()), (2, 0));
        // Once it exists, it is learnt and kept.
        assert_eq!(run(routes.owner(&topic("orders"), || async { Ok(owner(1, 0)) })).unwrap(), owner(1, 0));
        assert_eq!(routes.len(), 1);
    }

    #[test]
    fn the_first_forwarder_of_a_lookup_owns_and_none_is_unavailable() {
        let node_two_shard_five = ShardId::new(NodeId::new(2), 5);
        let node_one_shard_zero = ShardId::new(NodeId::new(1), 0);
        let first = Owner::first(
            &topic("orders"),
            [(node_two_shard_five, "b:7001".to_owned()), (node_one_shard_zero, "a:7000".to_owned())],
        )
        .unwrap();
        assert_eq!(first, Owner { shard: ShardId::new(NodeId::new(2), 5), address: "b:7001".into() });
        let none = Owner::first(&Resource::Subscription("billing".into()), []).unwrap_err();
        assert_eq!(none.code, Code::Unavailable);
        assert!(none.message.contains("subscription 'billing'"), "{none}");
    }

    #[test]
    fn an_answer_that_the_owner_moved_or_is_gone_forgets_it_and_others_do_not() {
        let routes = Routes::new(NodeId::new(1));
        for (code, forgotten) in [
            (Code::NotOwner, true),
            (Code::NotFound, true),
            (Code::Unavailable, true),
            (Code::DeadlineExceeded, true),
            (Code::PermissionDenied, false),
            (Code::InvalidArgument, false),
            (Code::ResourceExhausted, false),
        ] {
            run(routes.owner(&topic("orders"), || async { Ok(owner(2, 0)) })).unwrap();
            let status = Status::new(code, "the answer");
            assert_eq!(routes.forget_if_stale(&topic("orders"), &status), forgotten, "{code:?}");
            assert_eq!(routes.cached(&topic("orders")).is_none(), forgotten, "{code:?}");
        }
    }

    #[test]
    fn a_deletion_forgets_one_resource_or_every_one() {
        let routes = Routes::new(NodeId::new(1));
        for name in ["a", "b"] {
            run(routes.owner(&topic(name), || async { Ok(owner(1, 0)) })).unwrap();
            run(routes.owner(&Resource::Subscription(name.into()), || async { Ok(owner(1, 0)) })).unwrap();
        }
        routes.forget(&Resource::Subscription("a".into()));
        assert_eq!(routes.len(), 3);
        assert!(routes.cached(&topic("a")).is_some());
        routes.forget_all();
        assert!(routes.is_empty());
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let routes = Routes::new(NodeId::new(1));
        for index in 0..ROUTES_CACHED_MAX {
            routes.remember(&topic(&index.to_string()), owner(1, 0));
        }
        assert_eq!(routes.len(), ROUTES_CACHED_MAX);
        // Learning one already remembered again keeps the others.
        routes.remember(&topic("0"), owner(2, 0));
        assert_eq!(routes.len(), ROUTES_CACHED_MAX);
        // One more empties it first, then holds the newcomer.
        routes.remember(&topic("newcomer"), owner(1, 0));
        assert_eq!(routes.len(), 1);
        assert_eq!(routes.cached(&topic("newcomer")), Some(owner(1, 0)));
    }
}
