//! The router shard: the control plane. It holds the catalog (topics and subscriptions, durable),
//! places each topic on a forwarder by consistent hashing with bounded loads, tells clients
//! which forwarders serve a topic or subscription (an ordered list), and drives forwarders
//! through control channels. Clients then talk to forwarders directly, so the publish path never
//! crosses a core, and the router can restart without disturbing traffic.
//!
//! Every change is decided by the catalog's leader (this node) with everything it needs in its
//! entry, committed through the catalog's raft, and applied; the router shard then acts on what
//! applying it did (detaching what a deletion removed). A create prepares its resource on the
//! forwarder first (the topic's folders), so that a full disk refuses it before anything is
//! decided; a crash between the preparation and the commit leaves an orphan that the catalog
//! never names (removed at the next start).

use crate::api::cluster::ClusterStatus;
use crate::api::control::{
    effective_ack_deadline_seconds, effective_expiration_ttl_seconds, effective_max_delivery_attempts,
    effective_retention_seconds, effective_retry_backoff_seconds, topic_retention_seconds, validate_labels,
    validate_name, validate_push_config, validate_push_delivery, ForwarderAddress, Labels, ListRequest, Page,
    Resynced, SeekTarget, Snapshot, Subscription, SubscriptionUpdate, Topic, TopicUpdate,
};
use crate::api::limits::*;
use crate::api::stats::{ShardStats, Stats};
use crate::api::{Code as ErrorCode, Status};
use crate::catalog::placement::Placement;
use crate::catalog::{
    Applied, Catalog, CatalogEntry, CatalogState, NodeRecord, SnapshotRecord, SubscriptionRecord,
    SubscriptionSettings, TopicRecord, CATALOG_COMPACTION_BYTES_MIN,
};
use crate::control::{ControlEnvelope, ControlOk, ControlReply, ControlRequest, SettingsUpdate};
use crate::ids::{NodeId, ShardId, SnapshotId, TopicId};
use crate::log::Directories;
/// The Hello answer is the native protocol's (`protocol::native::router`); named here too for
/// the forwarder's dispatch, which calls it by this name.
pub use crate::protocol::native::router::hello_response;
use crate::storage::Storage;
use crate::sync::{oneshot, try_for_each_concurrent, Sender};
use glommio::channels::shared_channel::{ConnectedReceiver, ConnectedSender};
use glommio::sync::Semaphore;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::rc::Rc;

fn wall_ms() -> u64 {
    crate::runtime::wall_ms()
}

/// How long a node waits to apply a change the catalog's leader decided for one of its clients
/// (native or gRPC) before it answers anyway: the answer is the leader's, and a lookup right
/// after may then still miss it.
pub const FORWARDED_APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A future of another node's answer.
/// The answer is a `Status` as that node's cluster port sent it.
pub type PeerFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Status>>>>;

/// How the router reaches the other nodes' routers (their cluster ports). The native protocol
/// implements it; the router knows only what it asks.
pub trait Peers {
    /// Runs `request` on forwarder `shard` (of another node).
    fn control(&self, shard: ShardId, request: ControlRequest) -> PeerFuture<ControlOk>;
    /// Asks the catalog's leader, node `leader`, to decide this node's registration.
    fn register(&self, leader: NodeId, node: NodeRecord) -> PeerFuture<()>;
    /// Asks the catalog's leader to elect new leaders for `topics` (their leader's node
    /// restarted and must not lead them at their epoch again).
    fn want_elections(&self, leader: NodeId, topics: Vec<TopicId>) -> PeerFuture<()>;
    /// Asks the catalog's leader to delete subscription `name`, idle past its expiration
    /// policy on this node.
    fn expire_subscription(&self, leader: NodeId, name: String) -> PeerFuture<()>;
    /// The catalog's group as its leader sees it.
    fn cluster_status(&self, leader: NodeId) -> PeerFuture<crate::api::cluster::ClusterStatus>;
}

/// Every forwarder of the cluster, in the order placement numbers them (by node, then shard),
/// and the consistent-hashing ring over them.
struct Layout {
    /// The nodes it was built from (empty: this node alone).
    nodes: std::collections::BTreeMap<NodeId, NodeRecord>,
    /// Placement's index → the topic's `shard` (node and local shard).
    shards: Vec<ShardId>,
    placement: Placement,
}

impl Layout {
    /// This node's forwarders alone, until the catalog lists the cluster's nodes.
    fn single(node: NodeId, forwarders: u32, balance_factor: f64) -> Layout {
        Layout {
            nodes: Default::default(),
            shards: (0..forwarders).map(|local| ShardId::new(node, local)).collect(),
            placement: Placement::new(forwarders.max(1), balance_factor),
        }
    }

    fn of(nodes: &std::collections::BTreeMap<NodeId, NodeRecord>, balance_factor: f64) -> Layout {
        let shards: Vec<ShardId> = nodes
            .values()
            .flat_map(|node| (0..node.forwarders.len() as u32).map(|local| ShardId::new(node.node_id, local)))
            .collect();
        let placement = Placement::new(shards.len().max(1) as u32, balance_factor);
        Layout { nodes: nodes.clone(), shards, placement }
    }

    fn index_of(&self, shard: ShardId) -> Option<u32> {
        self.shards.iter().position(|known| *known == shard).map(|index| index as u32)
    }
}

pub struct Router<S: Storage> {
    storage: S,
    directories: Rc<Directories>,
    catalog: Catalog<S>,
    /// The catalog's state, shared with its state machine: read here, changed only by `apply`.
    state: Rc<RefCell<CatalogState>>,
    balance_factor: f64,
    /// Every forwarder of the cluster in placement order, rebuilt when the nodes change.
    layout: RefCell<Layout>,
    /// This node's forwarders, by local shard.
    forwarders: Vec<Rc<ForwarderLink>>,
    /// The other nodes' routers, in a cluster.
    peers: Option<Rc<dyn Peers>>,
    forwarder_addresses: ForwarderAddresses,
    /// Names being created right now, so two concurrent creates cannot both succeed.
    creating: RefCell<HashSet<String>>,
    /// Subscriptions whose creation the catalog did not decide in time (`is_undecided`): if
    /// it commits later, the subscription is attached then (`settle_undecided`).
    undecided: RefCell<Vec<Undecided>>,
    /// This node's replicas of replicated topics, beyond what the catalog says.
    replicas: replicas::LocalReplicas,
    /// Why topics here cannot have more than one replica, if they cannot.
    replication_refused: Option<String>,
    /// One unit: updates run one at a time, each from reading the record to its forwarder's
    /// answer, so that two concurrent updates cannot each write their change over the record
    /// as it was before the other, nor reach the forwarder in another order than the catalog.
    update_gate: Semaphore,
    /// Nodes this leader is removing: placement gives them nothing new meanwhile.
    draining: RefCell<std::collections::BTreeSet<NodeId>>,
    /// Later sources of one replica that this router gave every subscription of their topic
    /// before telling them a count (`Router::tell_count`), by unit id.
    sources_served: RefCell<std::collections::HashSet<TopicId>>,
    /// The delivery gate this router last told each unit on this node (by unit id and shard):
    /// its generation and passed subscriptions (`Router::retell_gates`).
    gates_told: RefCell<std::collections::HashMap<(TopicId, ShardId), gate::Told>>,
    /// When this node, leading the catalog, last looked for leaderships to move off draining
    /// nodes (`drain::drain_pass`).
    drain_passed: Cell<Option<std::time::Instant>>,
    /// What this node last saw of its cluster, for the log (`watch_cluster`).
    watch: RefCell<watch::ClusterWatch>,
    /// How many topics, subscriptions and snapshots the catalog may hold.
    limits: CatalogLimits,
    /// Creates in flight, counted against `limits`.
    in_flight: RefCell<Creating>,
    /// On the catalog's leader, the topics whose sources follow their load (`follow`).
    following: RefCell<follow::Following>,
}

impl<S: Storage> Router<S> {
    pub fn new(
        storage: S,
        directories: Rc<Directories>,
        catalog: Catalog<S>,
        forwarders: Vec<Rc<ForwarderLink>>,
        forwarder_addresses: ForwarderAddresses,
        balance_factor: f64,
    ) -> Router<S> {
        let layout = Layout::single(catalog.node_id(), forwarders.len() as u32, balance_factor);
        Router {
            storage,
            directories,
            state: catalog.shared_state(),
            catalog,
            balance_factor,
            layout: RefCell::new(layout),
            forwarders,
            peers: None,
            forwarder_addresses,
            creating: RefCell::default(),
            undecided: RefCell::default(),
            replicas: replicas::LocalReplicas::default(),
            replication_refused: None,
            update_gate: Semaphore::new(1),
            draining: RefCell::default(),
            sources_served: RefCell::default(),
            gates_told: RefCell::default(),
            drain_passed: Cell::default(),
            watch: RefCell::default(),
            limits: CatalogLimits::default(),
            in_flight: RefCell::default(),
            following: RefCell::default(),
        }
    }

    /// This node's id in its cluster (1 alone).
    pub fn node_id(&self) -> NodeId {
        self.catalog.node_id()
    }

    /// The cluster's forwarders as the catalog now lists them, with every topic counted on
    /// its own, for a placement decision.
    fn current_layout(&self) -> std::cell::RefMut<'_, Layout> {
        let mut layout = self.layout.borrow_mut();
        let state = self.state.borrow();
        if !state.nodes.is_empty() && state.nodes != layout.nodes {
            *layout = Layout::of(&state.nodes, self.balance_factor);
        }
        layout
    }

    /// The placement of a new topic: consistent hashing with bounded loads over every
    /// forwarder of every node, loads counted from the catalog (so a new leader decides as
    /// the old one would have), then the rest in preference order for when the first is down.
    fn place(&self, name: &str) -> Vec<ShardId> {
        let mut layout = self.current_layout();
        let state = self.state.borrow();
        let mut placement = Placement::new(layout.shards.len().max(1) as u32, self.balance_factor);
        for topic in state.topics.values() {
            if let Some(index) = layout.index_of(topic.shard) {
                placement.assign(index);
            }
        }
        count_sources(&layout, &state, &mut placement);
        let first = placement.place(name);
        layout.placement = placement;
        let removing = self.draining.borrow();
        let order = layout
            .placement
            .preference(name, first)
            .into_iter()
            .map(|index| layout.shards[index as usize])
            .filter(|shard| !removing.contains(&shard.node()))
            .collect();
        drain::draining_last(order, &state.draining)
    }

    /// New topics get one replica, and asking for more is refused with `why`.
    pub fn refuse_replication(&mut self, why: &str) {
        self.replication_refused = Some(why.to_owned());
    }

    /// Gives the router the other nodes' routers.
    pub fn set_peers(&mut self, peers: Rc<dyn Peers>) {
        self.peers = Some(peers);
    }

    /// The catalog as applied so far, for the simulation's checks of ids and placement.
    #[cfg(test)]
    pub(crate) fn catalog_state(&self) -> std::cell::Ref<'_, CatalogState> {
        self.state.borrow()
    }

    /// An id for an entry about to be proposed, once this leader applied every entry of the
    /// terms before its own (`Catalog::caught_up`), within `CATALOG_CATCH_UP_WAIT`.
    async fn allocate_id(&self) -> Result<u64, ControlError> {
        if !self.catalog.caught_up(crate::catalog::CATALOG_CATCH_UP_WAIT).await {
            return Err(ControlError::unavailable(
                "the catalog's leader has not applied its log yet (it was just elected); try again",
            ));
        }
        Ok(self.catalog.allocate_id())
    }

    /// Decides a change: commits `entry` through the catalog's raft and applies it.
    async fn propose(&self, entry: CatalogEntry) -> Result<Applied, ControlError> {
        self.check_leads()?;
        Ok(self.catalog.propose(entry).await?)
    }

    /// Makes the catalog's reserve segments again once a roll on a full disk took them
    /// (`LogConfig::reserve`); quiet while the disk stays full. Called once a minute.
    pub async fn retake_catalog_reserve(&self) {
        self.catalog.retake_reserve().await;
    }

    /// Snapshots the catalog and purges its raft log once the log has grown
    /// (`CATALOG_COMPACTION_BYTES_MIN`). Called once a minute; returns whether it did.
    pub async fn compact_catalog(&self) -> Result<bool, String> {
        self.catalog.compact(CATALOG_COMPACTION_BYTES_MIN).await
    }

    /// Compacts the catalog whatever its size (still once its log holds
    /// `CATALOG_COMPACTION_SNAPSHOT_FACTOR` times the snapshot), for the simulation, whose catalogs stay far below the daemon's threshold.
    #[cfg(test)]
    pub(crate) async fn compact_catalog_now(&self) -> Result<bool, String> {
        self.catalog.compact(0).await
    }

    fn reserve_name(&self, name: &str) -> Result<NameReservation<'_>, ControlError> {
        if !self.creating.borrow_mut().insert(name.to_owned()) {
            return Err(ControlError::BeingCreated { name: name.to_owned() });
        }
        Ok(NameReservation { set: &self.creating, name: name.to_owned() })
    }

    /// Refuses a change on a node that does not lead the catalog, naming the one that does:
    /// only the leader decides, with ids and placement no other node hands out meanwhile.
    fn check_leads(&self) -> Result<(), ControlError> {
        if self.catalog.leads() {
            return Ok(());
        }
        Err(ControlError::NotLeader { this_node: self.node_id(), leader: self.leader() })
    }

    fn lookup(
        &self,
        key: &str,
        topic_id: TopicId,
        local_address: Option<SocketAddr>,
        client: Option<&restrictions::RouteClient>,
    ) -> Result<Vec<ForwarderAddress>, ControlError> {
        // Every protocol's route goes through here: a removed node's catalog is stale, and
        // what it would route to no longer counts it.
        self.check_member()?;
        let shard = self
            .unit_shard(topic_id)
            .ok_or_else(|| ControlError::Unavailable("the topic is not placed on any forwarder".into()))?;
        let layout = self.current_layout();
        let owner = layout
            .index_of(shard)
            .ok_or_else(|| ControlError::Unavailable("the topic's forwarder is gone".into()))?;
        let order = layout.placement.preference(key, owner);
        let order = order.into_iter().map(|index| layout.shards[index as usize]).collect();
        // A client's list keeps to its routing restrictions; the gRPC gateway's, which only
        // finds the leader to carry a call to, does not.
        let order = match client {
            Some(client) => restrictions::restrict(order, &self.state.borrow().routing_rules, client)
                .map_err(ControlError::failed_precondition)?,
            None => order,
        };
        // A draining node's forwarders are handed to no one but as the leader (they still
        // answer those who hold an older list).
        let order = drain::handed_out(order, shard, &self.state.borrow().draining);
        let this_node = self.node_id();
        Ok(order
            .into_iter()
            .filter_map(|shard| {
                let (node, local) = (shard.node(), shard.local());
                let address = if node == this_node {
                    self.forwarder_addresses.address(local as usize, local_address)
                } else {
                    layout.nodes.get(&node)?.forwarders.get(local as usize)?.clone()
                };
                Some(ForwarderAddress { shard, address })
            })
            .collect())
    }

    async fn update_permit(&self) -> Result<glommio::sync::Permit<'_>, ControlError> {
        self.update_gate
            .acquire_permit(1)
            .await
            .map_err(|error| ControlError::Internal(format!("the router is closing: {error}")))
    }
}

/// An update the catalog holds but the owning forwarder did not take: the daemon serves it from
/// the next start, and sending the same update again applies it now.
fn not_applied(kind: &'static str, name: &str, why: impl Into<Status>) -> ControlError {
    ControlError::NotApplied { kind, name: name.to_owned(), why: why.into() }
}

/// One page of `items` (in name order, from after the page token): at most the page size, and
/// the token of the next page when more follow.
fn page<T>(items: impl Iterator<Item = T>, requested: u32, name_of: impl Fn(&T) -> &String) -> Page<T> {
    let size = page_size(requested);
    let mut items: Vec<T> = items.take(size + 1).collect();
    let next_page_token = if items.len() > size {
        items.pop();
        items.last().map(|item| name_of(item).clone()).unwrap_or_default()
    } else {
        String::new()
    };
    Page { items, next_page_token }
}

fn page_size(requested: u32) -> usize {
    match requested {
        0 => LIST_PAGE_SIZE_DEFAULT as usize,
        size => size.min(LIST_PAGE_SIZE_MAX) as usize,
    }
}

struct NameReservation<'a> {
    set: &'a RefCell<HashSet<String>>,
    name: String,
}

impl Drop for NameReservation<'_> {
    fn drop(&mut self) {
        self.set.borrow_mut().remove(&self.name);
    }
}

pub mod drain;
pub mod elections;
mod error;
mod members;
pub mod moves;
pub mod restrictions;
mod watch;
pub use members::{NodeRemoval, MEMBERSHIP_CHANGE_TIMEOUT, NODE_ID_MAX};
pub use watch::CLUSTER_WATCH_INTERVAL;
mod replicas;
#[cfg(test)]
mod tests;
pub use replicas::{ELECTIONS_ASKED_MAX, RECONCILE_TICK, SOURCE_FAILURE_TIMEOUT};
pub mod follow;
mod forwarders;
mod gate;
mod limits;
mod recovery;
mod replicated_sources;
mod retire;
pub use retire::SOURCES_PASS_INTERVAL;
pub mod schemas;
mod snapshots;
mod sources;
pub use crate::api::control::{SourceRoute, SourceRoutes};
use sources::count_sources;
mod status;
mod subscriptions;
mod topics;
pub use self::error::ControlError;
pub use self::forwarders::*;
pub use self::limits::*;
pub use self::recovery::*;
pub use self::snapshots::*;
pub use self::subscriptions::*;
use self::topics::*;
