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
    validate_name, ForwarderAddress, Labels, ListRequest, Page, Resynced, SeekTarget, Snapshot, Subscription,
    SubscriptionUpdate, Topic, TopicUpdate,
};
use crate::api::limits::*;
use crate::api::stats::{ShardStats, Stats};
use crate::api::{Code as ErrorCode, Status};
use crate::catalog::placement::Placement;
use crate::catalog::{
    global_shard, node_and_shard, Applied, Catalog, CatalogEntry, CatalogState, NodeRecord, SnapshotRecord,
    SubscriptionRecord, SubscriptionSettings, TopicRecord, CATALOG_COMPACTION_BYTES_MIN,
};
use crate::control::{ControlEnvelope, ControlOk, ControlReply, ControlRequest, SettingsUpdate};
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

/// What a subscription whose topic was deleted reports as its topic (as Pub/Sub does).
pub const DELETED_TOPIC: &str = "_deleted-topic_";
/// Topics (and then subscriptions) attached at once while the daemon starts, across all
/// forwarder shards. Each attach in progress holds a recovery read buffer per data directory
/// (at most 1 MiB) and the files of the log it reads; well under `CONTROL_CHANNEL_CAPACITY`.
pub const RECOVERY_ATTACHES_IN_FLIGHT_MAX: usize = 32;
/// Snapshots keep their messages for 7 days (Pub/Sub's limit).
pub const SNAPSHOT_LIFETIME_MS: u64 = 7 * 24 * 3600 * 1000;
/// How often idle subscriptions are checked against their expiration policy.
pub const EXPIRATION_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Topics a daemon (or cluster) holds by default (`--topics-max`). Pub/Sub allows 10,000 per
/// project; a daemon holds every project's in one namespace, so twice that, which also leaves
/// room beside the 10,000 topics of the W4 workload. Each topic preallocates at least a 1 MiB
/// segment in every data directory and holds descriptors while its files are open, so 20,000 is
/// some 20 GiB of every data disk before any message.
pub const TOPICS_MAX_DEFAULT: usize = 20_000;
/// Subscriptions of one topic by default (`--subscriptions-per-topic-max`): Pub/Sub's 10,000.
/// Every subscription reads each message its topic takes, on the topic's one core.
pub const SUBSCRIPTIONS_PER_TOPIC_MAX_DEFAULT: usize = 10_000;
/// Subscriptions in all by default (`--subscriptions-max`): ten times Pub/Sub's 10,000 per
/// project, five per topic at the topic limit. Each is a catalog record kept on every node and in
/// every catalog snapshot, and an acknowledgement state and journal on its forwarder.
pub const SUBSCRIPTIONS_MAX_DEFAULT: usize = 100_000;
/// Snapshots in all by default (`--snapshots-max`): Pub/Sub's 5,000. Each keeps its topic's
/// messages from its subscription's acknowledgement point for up to 7 days
/// (`SNAPSHOT_LIFETIME_MS`), so each can pin a week of its topic's log on disk.
pub const SNAPSHOTS_MAX_DEFAULT: usize = 5_000;

/// How many topics, subscriptions and snapshots the catalog may hold: a create beyond one is
/// refused with `ResourceExhausted` naming the limit and its flag. Decided by the catalog's
/// leader with its own limits, so every node of a cluster should be given the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogLimits {
    pub topics_max: usize,
    pub subscriptions_max: usize,
    pub subscriptions_per_topic_max: usize,
    pub snapshots_max: usize,
}

impl Default for CatalogLimits {
    fn default() -> CatalogLimits {
        CatalogLimits {
            topics_max: TOPICS_MAX_DEFAULT,
            subscriptions_max: SUBSCRIPTIONS_MAX_DEFAULT,
            subscriptions_per_topic_max: SUBSCRIPTIONS_PER_TOPIC_MAX_DEFAULT,
            snapshots_max: SNAPSHOTS_MAX_DEFAULT,
        }
    }
}

/// Creates in flight, not yet in the catalog, counted against its limits so that concurrent
/// creates cannot pass one together.
#[derive(Default)]
struct Creating {
    topics: usize,
    subscriptions: usize,
    snapshots: usize,
    /// Subscriptions in flight by their topic's id.
    subscriptions_by_topic: HashMap<u64, usize>,
}

/// One create's place in `Creating`, given back when the create ends (by then a created
/// resource is in the catalog, so for a moment it counts twice: the limits hold).
struct CreatingSlot<'a> {
    creating: &'a RefCell<Creating>,
    kind: CreateKind,
}

#[derive(Clone, Copy)]
enum CreateKind {
    Topic,
    Subscription { topic_id: u64 },
    Snapshot,
}

impl Drop for CreatingSlot<'_> {
    fn drop(&mut self) {
        let mut creating = self.creating.borrow_mut();
        match self.kind {
            CreateKind::Topic => creating.topics -= 1,
            CreateKind::Snapshot => creating.snapshots -= 1,
            CreateKind::Subscription { topic_id } => {
                creating.subscriptions -= 1;
                let on_topic =
                    creating.subscriptions_by_topic.get_mut(&topic_id).expect("counted when taken");
                *on_topic -= 1;
                if *on_topic == 0 {
                    creating.subscriptions_by_topic.remove(&topic_id);
                }
            }
        }
    }
}

/// A create refused by the limit `name` of `limit` `noun`, of which `holder` holds `count`
/// already (those being created included).
fn beyond_limit(holder: &str, count: usize, noun: &str, limit: usize, name: &str) -> Status {
    Status::new(
        ErrorCode::ResourceExhausted,
        format!(
            "{holder} holds {count} {noun} (those being created included), and its limit is {limit} \
             ({name}; ringpostd --{}): delete some, or raise the limit",
            name.replace('_', "-")
        ),
    )
}

fn wall_ms() -> u64 {
    crate::runtime::wall_ms()
}

/// How the router reaches one forwarder. In the daemon, the forwarder runs on its own shard,
/// reached through a bounded shared channel; in a simulation of a whole node, it runs on the
/// router's executor and is called directly, so that one seeded executor runs both.
pub struct ForwarderLink(Link);

/// A forwarder's `control`, called on the router's executor (see `ForwarderLink::local`).
pub type LocalControl = Box<
    dyn Fn(ControlRequest) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<ControlOk, Status>>>>,
>;

enum Link {
    Channel {
        sender: ConnectedSender<ControlEnvelope>,
        waiting: RefCell<HashMap<u64, Sender<Result<ControlOk, Status>>>>,
        next_request: Cell<u64>,
    },
    Local(LocalControl),
}

impl ForwarderLink {
    pub fn new(sender: ConnectedSender<ControlEnvelope>) -> Rc<ForwarderLink> {
        Rc::new(ForwarderLink(Link::Channel {
            sender,
            waiting: RefCell::default(),
            next_request: Cell::new(1),
        }))
    }

    /// A link to a forwarder on this executor: each request is `control(request)`, awaited by
    /// the caller as a reply from another shard would be.
    pub fn local(control: LocalControl) -> Rc<ForwarderLink> {
        Rc::new(ForwarderLink(Link::Local(control)))
    }

    /// Delivers replies to the requests waiting for them; runs for the life of the router. A
    /// local link has no replies to deliver.
    pub async fn receive_replies(self: Rc<Self>, replies: ConnectedReceiver<ControlReply>) {
        let Link::Channel { waiting, .. } = &self.0 else { return };
        while let Some(reply) = replies.recv().await {
            if let Some(waiter) = waiting.borrow_mut().remove(&reply.request_id) {
                waiter.send(reply.result);
            }
        }
    }

    async fn call(&self, request: ControlRequest) -> Result<ControlOk, Status> {
        let (sender, waiting, next_request) = match &self.0 {
            Link::Channel { sender, waiting, next_request } => (sender, waiting, next_request),
            Link::Local(control) => return control(request).await,
        };
        let request_id = next_request.get();
        next_request.set(request_id + 1);
        let (reply, receiver) = oneshot();
        waiting.borrow_mut().insert(request_id, reply);
        if sender.send(ControlEnvelope { request_id, request }).await.is_err() {
            waiting.borrow_mut().remove(&request_id);
            return Err(Status::unavailable("the forwarder shard is gone"));
        }
        receiver.await.unwrap_or_else(|| Err(Status::unavailable("the forwarder shard did not answer")))
    }
}

/// Where the router tells clients the forwarders are.
pub enum Advertise {
    /// At this host (a name or an address), on each forwarder's port.
    Host(String),
    /// At the address the client reached the router at: the daemon listens on every address,
    /// and the one a client could reach is the one it used.
    ConnectionAddress,
}

/// The forwarders' ports and how their addresses are advertised.
pub struct ForwarderAddresses {
    ports: Vec<u16>,
    /// Every forwarder's address, when they do not depend on the client's connection.
    fixed: Option<Vec<String>>,
}

impl ForwarderAddresses {
    pub fn new(ports: Vec<u16>, advertise: Advertise) -> ForwarderAddresses {
        let fixed = match advertise {
            Advertise::Host(host) => {
                Some(ports.iter().map(|port| crate::host_and_port(&host, *port)).collect())
            }
            Advertise::ConnectionAddress => None,
        };
        ForwarderAddresses { ports, fixed }
    }

    /// Shard `shard`'s address for a client that reached the router at `local`.
    fn address(&self, shard: usize, local: Option<SocketAddr>) -> String {
        match (&self.fixed, local) {
            (Some(fixed), _) => fixed[shard].clone(),
            (None, Some(local)) => SocketAddr::new(local.ip(), self.ports[shard]).to_string(),
            // No connection (a handler called directly): the loopback address reaches it here.
            (None, None) => {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), self.ports[shard]).to_string()
            }
        }
    }
}

/// A subscription created with an unknown outcome, and how to serve it if it was decided.
struct Undecided {
    subscription_id: u64,
    shard: u32,
    attach: ControlRequest,
    /// Past this, it is no longer watched; if it commits later, the next start attaches it.
    until: std::time::Instant,
}

/// How long a node waits to apply a change the catalog's leader decided for one of its clients
/// (native or gRPC) before it answers anyway: the answer is the leader's, and a lookup right
/// after may then still miss it.
pub const FORWARDED_APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long an undecided subscription is watched for its creation to commit.
pub const UNDECIDED_WATCH: std::time::Duration = std::time::Duration::from_secs(120);
/// Most undecided subscriptions watched at once; one beyond is left to the next start, which
/// attaches whatever the catalog names.
pub const UNDECIDED_WATCHED_MAX: usize = 1024;
/// How often the undecided subscriptions are looked at.
pub const UNDECIDED_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A future of another node's answer.
pub type PeerFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Status>>>>;

/// How the router reaches the other nodes' routers (their cluster ports). The native protocol
/// implements it; the router knows only what it asks.
pub trait Peers {
    /// Runs `request` on forwarder `shard` of node `node`.
    fn control(&self, node: u64, shard: u32, request: ControlRequest) -> PeerFuture<ControlOk>;
    /// Asks the catalog's leader, node `leader`, to decide this node's registration.
    fn register(&self, leader: u64, node: NodeRecord) -> PeerFuture<()>;
    /// Asks the catalog's leader to elect new leaders for `topics` (their leader's node
    /// restarted and must not lead them at their epoch again).
    fn want_elections(&self, leader: u64, topics: Vec<u64>) -> PeerFuture<()>;
    /// Asks the catalog's leader to delete subscription `name`, idle past its expiration
    /// policy on this node.
    fn expire_subscription(&self, leader: u64, name: String) -> PeerFuture<()>;
    /// The catalog's group as its leader sees it.
    fn cluster_status(&self, leader: u64) -> PeerFuture<crate::api::cluster::ClusterStatus>;
}

/// Every forwarder of the cluster, in the order placement numbers them (by node, then shard),
/// and the consistent-hashing ring over them.
struct Layout {
    /// The nodes it was built from (empty: this node alone).
    nodes: std::collections::BTreeMap<u64, NodeRecord>,
    /// Placement's index → the topic's `shard` (node and local shard).
    shards: Vec<u32>,
    placement: Placement,
}

impl Layout {
    /// This node's forwarders alone, until the catalog lists the cluster's nodes.
    fn single(node: u64, forwarders: u32, balance_factor: f64) -> Layout {
        Layout {
            nodes: Default::default(),
            shards: (0..forwarders).map(|local| global_shard(node, local)).collect(),
            placement: Placement::new(forwarders.max(1), balance_factor),
        }
    }

    fn of(nodes: &std::collections::BTreeMap<u64, NodeRecord>, balance_factor: f64) -> Layout {
        let shards: Vec<u32> = nodes
            .values()
            .flat_map(|node| (0..node.forwarders.len() as u32).map(|local| global_shard(node.node_id, local)))
            .collect();
        let placement = Placement::new(shards.len().max(1) as u32, balance_factor);
        Layout { nodes: nodes.clone(), shards, placement }
    }

    fn index_of(&self, shard: u32) -> Option<u32> {
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
    draining: RefCell<std::collections::BTreeSet<u64>>,
    /// What this node last saw of its cluster, for the log (`watch_cluster`).
    watch: RefCell<watch::ClusterWatch>,
    /// How many topics, subscriptions and snapshots the catalog may hold.
    limits: CatalogLimits,
    /// Creates in flight, counted against `limits`.
    in_flight: RefCell<Creating>,
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
            watch: RefCell::default(),
            limits: CatalogLimits::default(),
            in_flight: RefCell::default(),
        }
    }

    /// Attaches every catalogued topic and subscription to its forwarder, and removes topic
    /// directories the catalog does not name (creations that crashed before their catalog
    /// entry, or deletions that crashed before removing the files).
    pub async fn recover(&self) -> Result<(), String> {
        let topics: Vec<TopicRecord> = {
            let state = self.state.borrow();
            let mut topics: Vec<TopicRecord> = state.topics.values().cloned().collect();
            topics.sort_by_key(|topic| topic.id);
            topics
        };
        let started = crate::runtime::now();
        let (replicated, topics): (Vec<TopicRecord>, Vec<TopicRecord>) =
            topics.into_iter().partition(|topic| topic.replica_count() > 1);
        self.recover_replicas(&replicated).await?;
        let topics = self.place_recovered(topics).await?;
        // Each node attaches the topics placed on its own forwarders.
        let topics: Vec<TopicRecord> =
            topics.into_iter().filter(|topic| node_and_shard(topic.shard).0 == self.node_id()).collect();
        // Attached with several at once, since each attach waits on reads of the topic's logs.
        let attaches: Vec<(u32, &TopicRecord)> = topics.iter().map(|topic| (topic.shard, topic)).collect();
        try_for_each_concurrent(attaches, RECOVERY_ATTACHES_IN_FLIGHT_MAX, |(shard, topic)| async move {
            self.call_forwarder(
                shard,
                ControlRequest::AttachTopic {
                    topic_id: topic.id,
                    name: topic.name.clone(),
                    retention_seconds: topic.message_retention_seconds,
                    recovering: true,
                },
            )
            .await
            .map(|_| ())
            .map_err(|status| {
                let hint = if status.code == ErrorCode::DataLoss {
                    " (with --quarantine-damaged the daemon starts and serves the other topics, \
                         leaving this one and its files as they are)"
                } else {
                    ""
                };
                format!("recovering topic '{}': {status}{hint}", topic.name)
            })
        })
        .await?;
        let subscriptions: Vec<(u32, SubscriptionRecord)> = self
            .state
            .borrow()
            .subscriptions
            .values()
            // A detached subscription is served nowhere, as if its topic were deleted.
            .filter(|record| !record.detached)
            // A replicated topic's subscriptions are attached once its leader is promoted.
            .filter(|record| !replicated.iter().any(|topic| topic.id == record.topic_id))
            .filter_map(|record| {
                let shard = self.shard_of(record.topic_id)?;
                (node_and_shard(shard).0 == self.node_id()).then(|| (shard, (**record).clone()))
            })
            .collect();
        let subscription_count = subscriptions.len();
        try_for_each_concurrent(
            subscriptions,
            RECOVERY_ATTACHES_IN_FLIGHT_MAX,
            |(shard, subscription)| async move {
                self.call_forwarder(
                    shard,
                    ControlRequest::AttachSubscription {
                        subscription_id: subscription.id,
                        name: subscription.name.clone(),
                        topic_id: subscription.topic_id,
                        settings: subscription.settings.clone(),
                        create: false,
                        start_offset: subscription.start_offset,
                    },
                )
                .await
                .map(|_| ())
                .map_err(|status| format!("recovering subscription '{}': {status}", subscription.name))
            },
        )
        .await?;
        if !topics.is_empty() {
            // What an operator waits for before "serving on": with thousands of topics, seconds.
            crate::log_info!(
                "ringpostd: recovered {} topic(s) and {subscription_count} subscription(s) in {:.2} s",
                topics.len(),
                crate::runtime::now().saturating_duration_since(started).as_secs_f64()
            );
        }
        let node = self.node_id();
        let replicas_here = replicated
            .iter()
            .filter(|topic| topic.replicas.iter().any(|shard| node_and_shard(*shard).0 == node));
        let known: HashSet<String> =
            topics.iter().chain(replicas_here).map(|topic| format!("{:016x}", topic.id)).collect();
        for copy in 0..self.directories.count() {
            let topics_directory = self.directories.path(copy).join("topics");
            if let Ok(names) = self.storage.list_dir(&topics_directory) {
                for name in names.into_iter().filter(|name| !known.contains(name)) {
                    crate::log_info!(
                        "ringpostd: removing {}: the catalog does not name this topic (an unfinished create or delete)",
                        topics_directory.join(&name).display()
                    );
                    let _ = self.storage.remove_dir_all(&topics_directory.join(name));
                }
            }
        }
        Ok(())
    }

    /// A topic whose shard is gone (this node restarted with fewer) is placed again, by a
    /// decided entry, on this node: its files are here.
    async fn place_recovered(&self, mut topics: Vec<TopicRecord>) -> Result<Vec<TopicRecord>, String> {
        let shards = self.forwarders.len() as u32;
        let mut placement = Placement::new(shards.max(1), self.balance_factor);
        let this_node = |topic: &TopicRecord| node_and_shard(topic.shard).0 == self.node_id();
        for topic in topics.iter().filter(|topic| this_node(topic)) {
            let (_, local) = node_and_shard(topic.shard);
            if local < shards {
                placement.assign(local);
            }
        }
        for topic in
            topics.iter_mut().filter(|topic| this_node(topic) && node_and_shard(topic.shard).1 >= shards)
        {
            let shard = global_shard(self.node_id(), placement.place(&topic.name));
            if !self.catalog.leads() {
                return Err(format!(
                    "topic '{}' is placed on shard {} of this node, which has {shards}: start it with as \
                     many forwarder shards as before",
                    topic.name,
                    node_and_shard(topic.shard).1
                ));
            }
            self.propose(CatalogEntry::TopicPlaced { id: topic.id, shard })
                .await
                .map_err(|status| format!("placing topic '{}' again: {status}", topic.name))?;
            topic.shard = shard;
        }
        Ok(topics)
    }

    /// This node's id in its cluster (1 alone).
    pub fn node_id(&self) -> u64 {
        self.catalog.node_id()
    }

    /// The forwarder shard a topic is placed on, naming its node.
    fn shard_of(&self, topic_id: u64) -> Option<u32> {
        self.state
            .borrow()
            .topic_by_id(topic_id)
            .map(|topic| topic.shard)
            .filter(|shard| *shard != crate::catalog::entry::SHARD_UNPLACED)
    }

    /// Runs `request` on forwarder `shard`: through its channel on this node, through its
    /// node's cluster port on another.
    async fn call_forwarder(&self, shard: u32, request: ControlRequest) -> Result<ControlOk, Status> {
        let (node, local) = node_and_shard(shard);
        if node == self.node_id() {
            let link = self
                .forwarders
                .get(local as usize)
                .ok_or_else(|| Status::unavailable(format!("this node has no forwarder shard {local}")))?;
            return link.call(request).await;
        }
        let peers = self.peers.as_ref().ok_or_else(|| {
            Status::unavailable(format!("node {node} is not reachable: this node has no peers"))
        })?;
        peers.control(node, local, request).await
    }

    /// Runs a control request from the catalog's leader on one of this node's forwarders.
    pub async fn local_control(&self, local: u32, request: ControlRequest) -> Result<ControlOk, Status> {
        self.call_forwarder(global_shard(self.node_id(), local), request).await
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
    fn place(&self, name: &str) -> Vec<u32> {
        let mut layout = self.current_layout();
        let state = self.state.borrow();
        let mut placement = Placement::new(layout.shards.len().max(1) as u32, self.balance_factor);
        for topic in state.topics.values() {
            if let Some(index) = layout.index_of(topic.shard) {
                placement.assign(index);
            }
        }
        let first = placement.place(name);
        layout.placement = placement;
        let draining = self.draining.borrow();
        layout
            .placement
            .preference(name, first)
            .into_iter()
            .map(|index| layout.shards[index as usize])
            .filter(|shard| !draining.contains(&node_and_shard(*shard).0))
            .collect()
    }

    /// Makes this node's registration (its addresses and shards) part of the catalog, once it
    /// differs from what the catalog holds: proposed here on the leader, asked of the leader
    /// elsewhere.
    pub async fn register(&self, node: NodeRecord) -> Result<(), Status> {
        if self.state.borrow().nodes.get(&node.node_id) == Some(&node) {
            return Ok(());
        }
        if self.catalog.leads() {
            // A node removed (or never added) would get topics placed on it while it no longer
            // hears the catalog.
            if !self.catalog.members().contains_key(&node.node_id) {
                return Err(Status::failed_precondition(format!(
                    "node {} is not a member of the cluster: add it with `ringpost cluster add-node`",
                    node.node_id
                )));
            }
            return self.propose(CatalogEntry::NodeRegistered(node)).await.map(|_| ());
        }
        let leader = self.catalog.leader().ok_or_else(|| Status::unavailable("the catalog has no leader"))?;
        let peers = self.peers.as_ref().ok_or_else(|| Status::unavailable("this node has no peers"))?;
        peers.register(leader, node).await
    }

    /// Whether this node decides catalog changes (it leads the catalog).
    pub fn leads(&self) -> bool {
        self.catalog.leads()
    }

    /// The node leading the catalog, and its router's address if it registered one.
    pub fn leader(&self) -> Option<(u64, String)> {
        let leader = self.catalog.leader()?;
        let address = self.state.borrow().nodes.get(&leader).map(|node| node.router_address.clone());
        Some((leader, address.unwrap_or_default()))
    }

    /// Where node `node` serves its gRPC API, as it registered (empty: none, or unknown).
    pub fn grpc_address(&self, node: u64) -> String {
        self.state.borrow().nodes.get(&node).map(|node| node.grpc_address.clone()).unwrap_or_default()
    }

    /// The nodes the catalog registered, as this node applied it (the hosts of the cluster's
    /// nodes follow them: `node::router_shard`).
    pub fn registered_nodes(&self) -> std::collections::BTreeMap<u64, NodeRecord> {
        self.state.borrow().nodes.clone()
    }

    /// Changes of which node leads the catalog (see `Catalog::role_changes`).
    pub fn leader_changes(&self) -> crate::catalog::RoleChanges {
        self.catalog.role_changes()
    }

    /// Waits until this node applied catalog entry `index` (a change the leader decided for a
    /// client of this node), at most `within`.
    pub async fn wait_applied(&self, index: u64, within: std::time::Duration) -> bool {
        self.catalog.wait_applied(index, within).await
    }

    /// The last catalog entry this node applied.
    pub fn applied_index(&self) -> Option<u64> {
        self.catalog.applied_index()
    }

    /// Whether this node is one of a cluster's.
    pub fn is_clustered(&self) -> bool {
        self.peers.is_some()
    }

    /// New topics get one replica, and asking for more is refused with `why`.
    pub fn refuse_replication(&mut self, why: &str) {
        self.replication_refused = Some(why.to_owned());
    }

    /// Sets how many topics, subscriptions and snapshots the catalog may hold.
    pub fn set_limits(&mut self, limits: CatalogLimits) {
        self.limits = limits;
    }

    /// Takes a place for one create of `kind` within the catalog's limits, or refuses it with
    /// `ResourceExhausted` naming the limit. Called on the catalog's leader, which decides.
    fn within_limits(&self, kind: CreateKind) -> Result<CreatingSlot<'_>, Status> {
        let state = self.state.borrow();
        let mut creating = self.in_flight.borrow_mut();
        let limits = &self.limits;
        match kind {
            CreateKind::Topic => {
                let count = state.topics.len() + creating.topics;
                if count >= limits.topics_max {
                    return Err(beyond_limit(
                        "the catalog",
                        count,
                        "topics",
                        limits.topics_max,
                        "topics_max",
                    ));
                }
                creating.topics += 1;
            }
            CreateKind::Snapshot => {
                let count = state.snapshots.len() + creating.snapshots;
                if count >= limits.snapshots_max {
                    return Err(beyond_limit(
                        "the catalog",
                        count,
                        "snapshots",
                        limits.snapshots_max,
                        "snapshots_max",
                    ));
                }
                creating.snapshots += 1;
            }
            CreateKind::Subscription { topic_id } => {
                let count = state.subscriptions.len() + creating.subscriptions;
                if count >= limits.subscriptions_max {
                    return Err(beyond_limit(
                        "the catalog",
                        count,
                        "subscriptions",
                        limits.subscriptions_max,
                        "subscriptions_max",
                    ));
                }
                // A scan of every subscription: no index by topic is kept, and the scan is
                // bounded by `subscriptions_max`, beside a create's durable catalog write.
                let on_topic = state
                    .subscriptions
                    .values()
                    .filter(|record| record.topic_id == topic_id && !record.detached)
                    .count()
                    + creating.subscriptions_by_topic.get(&topic_id).copied().unwrap_or(0);
                if on_topic >= limits.subscriptions_per_topic_max {
                    let topic = state.topic_names.get(&topic_id).map_or("the topic", String::as_str);
                    return Err(beyond_limit(
                        &format!("topic '{topic}'"),
                        on_topic,
                        "subscriptions",
                        limits.subscriptions_per_topic_max,
                        "subscriptions_per_topic_max",
                    ));
                }
                creating.subscriptions += 1;
                *creating.subscriptions_by_topic.entry(topic_id).or_default() += 1;
            }
        }
        Ok(CreatingSlot { creating: &self.in_flight, kind })
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

    fn allocate_id(&self) -> u64 {
        self.catalog.allocate_id()
    }

    /// Decides a change: commits `entry` through the catalog's raft and applies it.
    async fn propose(&self, entry: CatalogEntry) -> Result<Applied, Status> {
        self.check_leads()?;
        self.catalog.propose(entry).await
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

    /// Compacts the catalog whatever its size (still once its log holds four times the
    /// snapshot), for the simulation, whose catalogs stay far below the daemon's threshold.
    #[cfg(test)]
    pub(crate) async fn compact_catalog_now(&self) -> Result<bool, String> {
        self.catalog.compact(0).await
    }

    fn reserve_name(&self, name: &str) -> Result<NameReservation<'_>, Status> {
        if !self.creating.borrow_mut().insert(name.to_owned()) {
            return Err(Status::new(
                ErrorCode::Aborted,
                format!("'{name}' is being created by another request"),
            ));
        }
        Ok(NameReservation { set: &self.creating, name: name.to_owned() })
    }

    pub async fn create_topic(&self, request: Topic) -> Result<Topic, Status> {
        let name = request.name.as_str();
        validate_name("topic", name)?;
        let retention = topic_retention_seconds(request.message_retention_seconds)?;
        validate_labels(&request.labels)?;
        let _reservation = self.reserve_name(&format!("topic/{name}"))?;
        if self.state.borrow().topics.contains_key(name) {
            return Err(Status::already_exists(format!("topic '{name}'")));
        }
        self.check_leads()?;
        let _slot = self.within_limits(CreateKind::Topic)?;
        let replicas = self.replica_count(request.replicas)?;
        let id = self.allocate_id();
        if replicas > 1 {
            return self.create_replicated_topic(id, &request, retention, replicas).await;
        }
        // The placed forwarder first; one that cannot take the topic (its node is down, its
        // disk is full) passes it to the next in preference order.
        let mut refusal = Status::unavailable("no forwarder is placed");
        let mut attached = None;
        for shard in self.place(name) {
            let attach = ControlRequest::AttachTopic {
                topic_id: id,
                name: name.to_owned(),
                retention_seconds: retention,
                recovering: false,
            };
            match self.call_forwarder(shard, attach).await {
                Ok(_) => {
                    attached = Some(shard);
                    break;
                }
                Err(status) if status.code == ErrorCode::Unavailable => refusal = status,
                Err(status) => return Err(status),
            }
        }
        let Some(shard) = attached else { return Err(refusal) };
        let record = TopicRecord {
            id,
            name: name.to_owned(),
            message_retention_seconds: retention,
            shard,
            created_ms: wall_ms(),
            labels: request.labels.clone(),
            replicas: Vec::new(),
            epoch: 0,
        };
        let response = topic_message(&record);
        if let Err(status) = self.propose(CatalogEntry::TopicCreated(record)).await {
            // Undecided, the topic may still be created: it stays attached, its files kept,
            // and the next start removes them if the catalog never names it.
            if !crate::catalog::is_undecided(&status) {
                let _ = self
                    .call_forwarder(shard, ControlRequest::DetachTopic { topic_id: id, delete_data: true })
                    .await;
            }
            return Err(status);
        }
        Ok(response)
    }

    /// Refuses a change on a node that does not lead the catalog, naming the one that does:
    /// only the leader decides, with ids and placement no other node hands out meanwhile.
    fn check_leads(&self) -> Result<(), Status> {
        if self.catalog.leads() {
            return Ok(());
        }
        Err(match self.leader() {
            Some((leader, address)) => Status::unavailable(format!(
                "node {} does not lead the catalog; node {leader} does (its router is at {address})",
                self.node_id()
            )),
            None => Status::unavailable("the catalog has no leader (too few of its voters are reachable)"),
        })
    }

    fn topic_record(&self, name: &str) -> Result<TopicRecord, Status> {
        validate_name("topic", name)?;
        self.state
            .borrow()
            .topics
            .get(name)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("topic '{name}'")))
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), Status> {
        let topic = self.topic_record(name)?;
        let applied = self.propose(CatalogEntry::TopicDeleted { id: topic.id }).await?;
        let shards = match applied {
            Applied::TopicDeleted(Some(removed)) => removed.replica_shards(),
            _ => Vec::new(),
        };
        for shard in shards {
            // The deletion is durable already; if removing the files fails now, the next start
            // removes them (the catalog no longer names the directory).
            if let Err(status) = self
                .call_forwarder(shard, ControlRequest::DetachTopic { topic_id: topic.id, delete_data: true })
                .await
            {
                crate::log_warn!("ringpostd: deleting the files of topic '{}': {status}", topic.name);
            }
        }
        Ok(())
    }

    fn lookup(
        &self,
        key: &str,
        topic_id: u64,
        local_address: Option<SocketAddr>,
    ) -> Result<Vec<ForwarderAddress>, Status> {
        // Every protocol's route goes through here: a removed node's catalog is stale, and
        // what it would route to no longer counts it.
        self.check_member()?;
        let shard = self
            .shard_of(topic_id)
            .ok_or_else(|| Status::unavailable("the topic is not placed on any forwarder"))?;
        let layout = self.current_layout();
        let owner =
            layout.index_of(shard).ok_or_else(|| Status::unavailable("the topic's forwarder is gone"))?;
        let order = layout.placement.preference(key, owner);
        let this_node = self.node_id();
        Ok(order
            .into_iter()
            .filter_map(|index| {
                let shard = layout.shards[index as usize];
                let (node, local) = node_and_shard(shard);
                let address = if node == this_node {
                    self.forwarder_addresses.address(local as usize, local_address)
                } else {
                    layout.nodes.get(&node)?.forwarders.get(local as usize)?.clone()
                };
                Some(ForwarderAddress { shard, address })
            })
            .collect())
    }

    /// `request`: the settings as asked, 0 or empty asking for a setting's default.
    pub async fn create_subscription(&self, request: Subscription) -> Result<Subscription, Status> {
        let name = request.name.as_str();
        validate_name("subscription", name)?;
        let topic = self.topic_record(request.topic.as_str())?;
        // From here on, the settings as asked.
        let request = &request.settings;
        if request.filter.len() > FILTER_BYTES_MAX {
            return Err(Status::invalid_argument(format!(
                "filter is {} bytes; the limit is {FILTER_BYTES_MAX} (FILTER_BYTES_MAX)",
                request.filter.len()
            )));
        }
        if !request.filter.is_empty() {
            crate::subscription::filter::Filter::parse(&request.filter)
                .map_err(|error| Status::invalid_argument(format!("invalid filter: {error}")))?;
        }
        let dead_letter_topic = request.dead_letter_topic.as_str();
        let max_delivery_attempts =
            effective_max_delivery_attempts(dead_letter_topic, request.max_delivery_attempts)?;
        if !dead_letter_topic.is_empty() {
            check_dead_letter_topic(name, &topic.name, dead_letter_topic)?;
            self.topic_record(dead_letter_topic)?;
        }
        let (minimum_backoff, maximum_backoff) = effective_retry_backoff_seconds(
            request.minimum_backoff_seconds,
            request.maximum_backoff_seconds,
        )?;
        let expiration = effective_expiration_ttl_seconds(request.expiration_ttl_seconds)?;
        validate_labels(&request.labels)?;
        let settings = SubscriptionSettings {
            ack_deadline_seconds: effective_ack_deadline_seconds(request.ack_deadline_seconds)?,
            retain_acked_messages: request.retain_acked_messages,
            message_retention_seconds: effective_retention_seconds(request.message_retention_seconds)?,
            enable_message_ordering: request.enable_message_ordering,
            filter: request.filter.clone(),
            dead_letter_topic: dead_letter_topic.to_owned(),
            max_delivery_attempts,
            minimum_backoff_seconds: minimum_backoff,
            maximum_backoff_seconds: maximum_backoff,
            expiration_ttl_seconds: expiration,
            labels: request.labels.clone(),
            enable_exactly_once_delivery: request.enable_exactly_once_delivery,
        };
        let _reservation = self.reserve_name(&format!("subscription/{name}"))?;
        if self.state.borrow().subscriptions.contains_key(name) {
            return Err(Status::already_exists(format!("subscription '{name}'")));
        }
        let shard = self.shard_of(topic.id).ok_or_else(|| {
            Status::unavailable(format!("topic '{}' is not placed on a forwarder", topic.name))
        })?;
        self.check_leads()?;
        let _slot = self.within_limits(CreateKind::Subscription { topic_id: topic.id })?;
        let id = self.allocate_id();
        let ControlOk::SubscriptionStart(start_offset) =
            self.call_forwarder(shard, ControlRequest::DurableEnd { topic_id: topic.id }).await?
        else {
            return Err(Status::internal("the forwarder did not report the topic's durable end"));
        };
        let record = SubscriptionRecord {
            id,
            name: name.to_owned(),
            topic_id: topic.id,
            topic_name: topic.name.clone(),
            start_offset,
            settings: settings.clone(),
            created_ms: wall_ms(),
            detached: false,
        };
        let response = self.subscription_message(&record);
        let attach = ControlRequest::AttachSubscription {
            subscription_id: id,
            name: name.to_owned(),
            topic_id: topic.id,
            settings,
            create: false,
            start_offset,
        };
        if let Err(status) = self.propose(CatalogEntry::SubscriptionCreated(record)).await {
            if crate::catalog::is_undecided(&status) {
                let until = crate::runtime::now() + UNDECIDED_WATCH;
                let mut undecided = self.undecided.borrow_mut();
                if undecided.len() < UNDECIDED_WATCHED_MAX {
                    undecided.push(Undecided { subscription_id: id, shard, attach, until });
                }
            }
            return Err(status);
        }
        if let Err(status) = self.call_forwarder(shard, attach).await {
            // Not served, so not kept: the deletion is decided like any other.
            let _ = self.propose(CatalogEntry::SubscriptionDeleted { id, name: name.to_owned() }).await;
            return Err(status);
        }
        Ok(response)
    }

    /// A subscription as clients see it: a detached one names no topic, as one whose topic
    /// was deleted, and says it is detached.
    fn subscription_message(&self, record: &SubscriptionRecord) -> Subscription {
        let alive = !record.detached && self.state.borrow().topic_by_id(record.topic_id).is_some();
        Subscription {
            name: record.name.clone(),
            topic: if alive { record.topic_name.clone() } else { DELETED_TOPIC.to_owned() },
            settings: record.settings.clone(),
            detached: record.detached,
        }
    }

    async fn update_permit(&self) -> Result<glommio::sync::Permit<'_>, Status> {
        self.update_gate
            .acquire_permit(1)
            .await
            .map_err(|error| Status::internal(format!("the router is closing: {error}")))
    }

    /// UpdateTopic. The new retention is made durable in the catalog first (what the next start
    /// attaches the topic with), then the forwarder that owns the topic applies it.
    pub async fn update_topic(&self, changes: TopicUpdate) -> Result<Topic, Status> {
        let _update = self.update_permit().await?;
        let mut topic = self.topic_record(&changes.name)?;
        if let Some(retention) = changes.message_retention_seconds {
            topic.message_retention_seconds = retention;
        }
        if let Some(labels) = changes.labels {
            validate_labels(&labels)?;
            topic.labels = labels;
        }
        let retention_seconds = topic.message_retention_seconds;
        self.propose(CatalogEntry::TopicUpdated {
            id: topic.id,
            message_retention_seconds: retention_seconds,
            labels: topic.labels.clone(),
        })
        .await?;
        // A deletion that committed while the update waited for the disk wins.
        if self.state.borrow().topic_by_id(topic.id).is_none() {
            return Err(Status::not_found(format!("topic '{}' (deleted during the update)", topic.name)));
        }
        let shard = self.shard_of(topic.id);
        if let Some(shard) = shard {
            let update = SettingsUpdate::Topic { retention_seconds };
            self.call_forwarder(shard, ControlRequest::UpdateSettings { topic_id: topic.id, update })
                .await
                .map_err(|status| not_applied("topic", &topic.name, status))?;
        }
        Ok(topic_message(&topic))
    }

    /// UpdateSubscription, in the order of `update_topic`. A new dead-letter topic must exist,
    /// as at creation.
    pub async fn update_subscription(&self, changes: SubscriptionUpdate) -> Result<Subscription, Status> {
        let _update = self.update_permit().await?;
        let mut record = self.subscription_record(&changes.name)?;
        let settings = &mut record.settings;
        if let Some(seconds) = changes.ack_deadline_seconds {
            settings.ack_deadline_seconds = seconds;
        }
        if let Some(retain) = changes.retain_acked_messages {
            settings.retain_acked_messages = retain;
        }
        if let Some(seconds) = changes.message_retention_seconds {
            settings.message_retention_seconds = seconds;
        }
        if let Some(seconds) = changes.expiration_ttl_seconds {
            settings.expiration_ttl_seconds = seconds;
        }
        if let Some((dead_letter_topic, attempts)) = changes.dead_letter_policy {
            if !dead_letter_topic.is_empty() {
                check_dead_letter_topic(&record.name, &record.topic_name, &dead_letter_topic)?;
                self.topic_record(&dead_letter_topic)?;
            }
            settings.dead_letter_topic = dead_letter_topic;
            settings.max_delivery_attempts = attempts;
        }
        if let Some((minimum, maximum)) = changes.retry_policy {
            settings.minimum_backoff_seconds = minimum;
            settings.maximum_backoff_seconds = maximum;
        }
        if let Some(labels) = changes.labels {
            validate_labels(&labels)?;
            settings.labels = labels;
        }
        if let Some(exactly_once) = changes.enable_exactly_once_delivery {
            settings.enable_exactly_once_delivery = exactly_once;
        }
        self.propose(CatalogEntry::SubscriptionUpdated {
            id: record.id,
            name: record.name.clone(),
            settings: record.settings.clone(),
        })
        .await?;
        // A deletion that committed while the update waited for the disk wins.
        if self.state.borrow().subscriptions.get(&record.name).is_none_or(|live| live.id != record.id) {
            return Err(Status::not_found(format!(
                "subscription '{}' (deleted during the update)",
                record.name
            )));
        }
        // A subscription whose topic was deleted, or that was detached, is served nowhere: the
        // catalog is all there is.
        let shard = self.shard_of(record.topic_id).filter(|_| !record.detached);
        if let Some(shard) = shard {
            let update = SettingsUpdate::Subscription {
                subscription_id: record.id,
                settings: record.settings.clone(),
            };
            self.call_forwarder(shard, ControlRequest::UpdateSettings { topic_id: record.topic_id, update })
                .await
                .map_err(|status| not_applied("subscription", &record.name, status))?;
        }
        Ok(self.subscription_message(&record))
    }

    fn snapshot_record(&self, name: &str) -> Result<SnapshotRecord, Status> {
        validate_name("snapshot", name)?;
        self.state
            .borrow()
            .snapshots
            .get(name)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("snapshot '{name}'")))
    }

    /// A snapshot named `name` of subscription `subscription`'s acknowledgements.
    pub async fn create_snapshot(
        &self,
        name: &str,
        subscription: &str,
        labels: Labels,
    ) -> Result<Snapshot, Status> {
        validate_name("snapshot", name)?;
        validate_labels(&labels)?;
        let record = self.subscription_record(subscription)?;
        if record.detached {
            return Err(detached(&record.name));
        }
        let _reservation = self.reserve_name(&format!("snapshot/{name}"))?;
        if self.state.borrow().snapshots.contains_key(name) {
            return Err(Status::already_exists(format!("snapshot '{name}'")));
        }
        let Some(topic) = self.state.borrow().topic_by_id(record.topic_id).cloned() else {
            return Err(Status::failed_precondition(format!("subscription '{}' is detached", record.name)));
        };
        let shard = self.shard_of(topic.id).ok_or_else(|| Status::unavailable("topic not placed"))?;
        self.check_leads()?;
        let _slot = self.within_limits(CreateKind::Snapshot)?;
        let id = self.allocate_id();
        let expire_time_ms = wall_ms() + SNAPSHOT_LIFETIME_MS;
        self.call_forwarder(
            shard,
            ControlRequest::TakeSnapshot {
                topic_id: topic.id,
                subscription_id: record.id,
                snapshot_id: id,
                expire_time_ms,
            },
        )
        .await?;
        let snapshot =
            SnapshotRecord { id, name: name.to_owned(), topic_id: topic.id, expire_time_ms, labels };
        let response = Snapshot {
            name: name.to_owned(),
            topic: topic.name,
            expire_time_ms,
            labels: snapshot.labels.clone(),
        };
        self.propose(CatalogEntry::SnapshotCreated(snapshot)).await?;
        Ok(response)
    }

    /// Deletes subscriptions idle for longer than their expiration policy allows.
    pub async fn expire_subscriptions(&self) {
        let Ok(stats) = self.stats().await else { return };
        for topic in &stats.topics {
            for subscription in &topic.subscriptions {
                let record = self
                    .state
                    .borrow()
                    .subscriptions
                    .get(&subscription.name)
                    .map(|record| (**record).clone());
                let Some(record) = record else { continue };
                let ttl_ms = record.settings.expiration_ttl_seconds.saturating_mul(1000);
                if subscription.idle_ms > ttl_ms {
                    crate::log_info!(
                        "ringpostd: subscription '{}' expired after {} s without activity (expiration policy)",
                        record.name,
                        subscription.idle_ms / 1000
                    );
                    if let Err(status) = self.expire_subscription(&record.name).await {
                        crate::log_warn!("ringpostd: expiring subscription '{}': {status}", record.name);
                    }
                }
            }
        }
    }

    /// Attaches each subscription whose undecided creation has committed since; forgets those
    /// watched for `UNDECIDED_WATCH`. Called every `UNDECIDED_CHECK_INTERVAL`.
    pub async fn settle_undecided(&self) {
        let now = crate::runtime::now();
        let settled: Vec<Undecided> = {
            let mut undecided = self.undecided.borrow_mut();
            let state = self.state.borrow();
            let (settled, waiting) = std::mem::take(&mut *undecided).into_iter().partition(|watched| {
                watched.until <= now
                    || state.subscriptions.values().any(|record| record.id == watched.subscription_id)
            });
            *undecided = waiting;
            settled
        };
        for watched in settled {
            let decided =
                self.state.borrow().subscriptions.values().any(|record| record.id == watched.subscription_id);
            if decided {
                if let Err(status) = self.call_forwarder(watched.shard, watched.attach).await {
                    crate::log_warn!(
                        "ringpostd: attaching a subscription whose creation committed late: {status}"
                    );
                }
            }
        }
    }

    /// Deletes a subscription this node found idle past its expiration policy: here on the
    /// catalog's leader, which alone knows only its own forwarders' idleness, else by asking it.
    async fn expire_subscription(&self, name: &str) -> Result<(), Status> {
        if !self.is_clustered() || self.leads() {
            return self.delete_subscription(name).await;
        }
        let (leader, _) = self.leader().ok_or_else(|| Status::unavailable("the catalog has no leader"))?;
        let peers = self.peers.as_ref().ok_or_else(|| Status::unavailable("this node has no peers"))?;
        peers.expire_subscription(leader, name.to_owned()).await
    }

    fn subscription_record(&self, name: &str) -> Result<SubscriptionRecord, Status> {
        validate_name("subscription", name)?;
        self.state
            .borrow()
            .subscriptions
            .get(name)
            .map(|record| (**record).clone())
            .ok_or_else(|| Status::not_found(format!("subscription '{name}'")))
    }

    pub async fn delete_subscription(&self, name: &str) -> Result<(), Status> {
        let record = self.subscription_record(name)?;
        self.propose(CatalogEntry::SubscriptionDeleted { id: record.id, name: record.name.clone() }).await?;
        // A detached subscription's forwarder dropped it already.
        let shard = self.shard_of(record.topic_id).filter(|_| !record.detached);
        if let Some(shard) = shard {
            if let Err(status) = self
                .call_forwarder(
                    shard,
                    ControlRequest::DetachSubscription {
                        subscription_id: record.id,
                        name: record.name.clone(),
                        topic_id: record.topic_id,
                        deleted: true,
                    },
                )
                .await
            {
                crate::log_warn!("ringpostd: detaching subscription '{}': {status}", record.name);
            }
        }
        Ok(())
    }

    /// One page of the topics `visible` shows (by name), from after the page token. What the
    /// caller may not see is left out before the page is cut, so the next page's token is the
    /// last name it was shown and never names what it may not see.
    pub fn list_topics(&self, request: &ListRequest, visible: impl Fn(&str) -> bool) -> Page<Topic> {
        let state = self.state.borrow();
        let topics = state
            .topics
            .range::<str, _>((
                std::ops::Bound::Excluded(request.page_token.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .filter(|(name, _)| visible(name))
            .map(|(_, topic)| topic_message(topic));
        page(topics, request.page_size, |topic| &topic.name)
    }

    /// One page of the subscriptions (of `request.topic`, when given) that `visible` shows, as
    /// `list_topics` pages.
    pub fn list_subscriptions(
        &self,
        request: &ListRequest,
        visible: impl Fn(&str) -> bool,
    ) -> Page<Subscription> {
        let topic_filter = request.topic.as_str();
        let records: Vec<SubscriptionRecord> = {
            let state = self.state.borrow();
            state
                .subscriptions
                .range::<str, _>((
                    std::ops::Bound::Excluded(request.page_token.as_str()),
                    std::ops::Bound::Unbounded,
                ))
                .map(|(_, record)| &**record)
                // A detached subscription is no longer one of its topic's.
                .filter(|record| {
                    topic_filter.is_empty() || (record.topic_name == topic_filter && !record.detached)
                })
                .filter(|record| visible(&record.name))
                .take(page_size(request.page_size) + 1)
                .cloned()
                .collect()
        };
        let subscriptions = records.iter().map(|record| self.subscription_message(record));
        page(subscriptions, request.page_size, |subscription| &subscription.name)
    }

    pub async fn stats(&self) -> Result<Stats, Status> {
        // Read before the topics are gathered, so the figure does not count this response.
        let mut response = Stats { process: crate::metrics::process::stats(), ..Stats::default() };
        response.shards.push(ShardStats {
            shard: u32::MAX,
            topics: self.state.borrow().topics.len() as u32,
            directories: crate::shard::stats::directory_status(&self.directories),
            repairs: self.directories.repairs(),
            quarantined: Vec::new(),
            // The router publishes nothing and commits only its catalog.
            ..ShardStats::default()
        });
        for forwarder in &self.forwarders {
            if let ControlOk::Stats(shard, topics) = forwarder.call(ControlRequest::Stats).await? {
                response.shards.push(shard);
                response.topics.extend(topics);
            }
        }
        response.topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(response)
    }

    /// Each shard's figures for a scrape: the router's (`u32::MAX`), then each forwarder's, by
    /// its index.
    pub async fn shard_figures(&self) -> Result<Vec<(u32, crate::metrics::shard::ShardFigures)>, Status> {
        let mut figures = vec![(u32::MAX, crate::metrics::shard::snapshot())];
        for (index, forwarder) in self.forwarders.iter().enumerate() {
            if let ControlOk::Requests(shard) = forwarder.call(ControlRequest::Requests).await? {
                figures.push((index as u32, shard));
            }
        }
        Ok(figures)
    }

    /// The catalog's raft group as this node alone sees it: no request to another node.
    pub fn catalog_status(&self) -> ClusterStatus {
        self.catalog.cluster_status()
    }

    /// The catalog's raft group as this node sees it.
    /// On a node that does not lead, the leader's view of the members (only the leader knows how
    /// far each is replicated and when it last answered), with this node's own log, applied
    /// index, role and standing; this node's view alone when the leader does not answer, the
    /// leader then shown unreachable and not named as leading.
    pub async fn cluster_status(&self) -> ClusterStatus {
        let local = self.catalog.cluster_status();
        let (Some(peers), Some(leader)) = (&self.peers, local.catalog_leader) else { return local };
        if leader == local.node_id {
            return local;
        }
        let mut status = match peers.cluster_status(leader).await {
            Ok(status) => status,
            Err(error) => {
                let mut local = local;
                local.catalog_leader = None;
                for node in local.nodes.iter_mut().filter(|node| node.node_id == leader) {
                    node.role = "unreachable".to_owned();
                }
                local.note = format!(
                    "node {}'s own view: node {leader}, the catalog's leader it knew, did not answer ({})",
                    local.node_id, error.message
                );
                return local;
            }
        };
        status.node_id = local.node_id;
        status.last_log_index = local.last_log_index;
        status.last_applied_index = local.last_applied_index;
        status.not_serving = local.not_serving;
        for node in &mut status.nodes {
            if let Some(own) =
                local.nodes.iter().find(|own| own.node_id == node.node_id && own.node_id == local.node_id)
            {
                node.role = own.role.clone();
            }
        }
        status
    }

    /// The catalog's leader this node can vouch for (`Catalog::reported_leader`).
    pub fn reported_leader(&self) -> Option<u64> {
        self.catalog.reported_leader()
    }

    /// Where this node stands in the catalog's group (`catalog::standing`).
    pub fn standing(&self) -> crate::catalog::standing::Standing {
        self.catalog.standing()
    }

    /// Refuses a client's request on a node that is no longer a member of its cluster (removed
    /// with `cluster remove-node`): its catalog is no longer kept up to date, so what it would
    /// answer, look up or carry to a leader could be stale or land on nodes that no longer
    /// count it.
    pub fn check_member(&self) -> Result<(), Status> {
        if self.peers.is_some() && self.catalog.standing() == crate::catalog::standing::Standing::Removed {
            return Err(Status::failed_precondition(format!(
                "node {0} was removed from the cluster (`ringpost cluster remove-node {0}`): it serves no requests; \
                 use another node",
                self.node_id()
            )));
        }
        Ok(())
    }

    /// Topics as this node's applied catalog places them, in name order, at most
    /// `CLUSTER_STATUS_TOPICS_MAX` of them, and how many more there are: a topic of one replica
    /// too, so that where it lives (the node a removal would need to keep) is seen.
    pub fn topic_placements(&self) -> (Vec<crate::api::cluster::TopicPlacement>, u64) {
        use crate::api::cluster::{TopicPlacement, CLUSTER_STATUS_TOPICS_MAX};
        use crate::catalog::entry::node_and_shard;
        let state = self.catalog.state();
        let mut topics = state.topics.values();
        let placements: Vec<TopicPlacement> = topics
            .by_ref()
            .take(CLUSTER_STATUS_TOPICS_MAX)
            .map(|topic| TopicPlacement {
                name: topic.name.clone(),
                leader_node: node_and_shard(topic.shard).0,
                epoch: topic.epoch,
                replica_nodes: topic.replica_shards().iter().map(|shard| node_and_shard(*shard).0).collect(),
            })
            .collect();
        (placements, topics.count() as u64)
    }

    /// Trusts data directory `index` again, after rewriting every stale copy in it.
    pub async fn resync_directory(&self, index: usize) -> Result<Resynced, Status> {
        if index >= self.directories.count() {
            return Err(Status::invalid_argument(format!(
                "there is no data directory {index}; there are {} (numbered from 0 in --data-dir order)",
                self.directories.count()
            )));
        }
        let mut resynced = Resynced::default();
        self.directories.unfence(index);
        if self.catalog.is_stale(index) {
            resynced.batches += self.catalog.resync_copy(index).await?;
            resynced.logs += 1;
        }
        for forwarder in &self.forwarders {
            if let ControlOk::Resynced { logs, batches } =
                forwarder.call(ControlRequest::ResyncDirectory { index }).await?
            {
                resynced.logs += logs;
                resynced.batches += batches;
            }
        }
        crate::log_info!(
            "ringpostd: data directory {index} ({}) resynced: {} logs, {} batches copied; it takes writes again",
            self.directories.path(index).display(),
            resynced.logs,
            resynced.batches
        );
        Ok(resynced)
    }

    pub fn get_topic(&self, name: &str) -> Result<Topic, Status> {
        Ok(topic_message(&self.topic_record(name)?))
    }

    /// The forwarders serving a topic, most preferred first. `local`: the address the client
    /// reached the router at.
    pub fn lookup_topic(
        &self,
        name: &str,
        local: Option<SocketAddr>,
    ) -> Result<Vec<ForwarderAddress>, Status> {
        let topic = self.topic_record(name)?;
        self.lookup(&topic.name, topic.id, local)
    }

    pub fn get_subscription(&self, name: &str) -> Result<Subscription, Status> {
        let record = self.subscription_record(name)?;
        Ok(self.subscription_message(&record))
    }

    /// The forwarders serving a subscription (its topic's), most preferred first.
    pub fn lookup_subscription(
        &self,
        name: &str,
        local: Option<SocketAddr>,
    ) -> Result<Vec<ForwarderAddress>, Status> {
        let record = self.subscription_record(name)?;
        if record.detached {
            return Err(detached(&record.name));
        }
        let Some(topic) = self.state.borrow().topic_by_id(record.topic_id).cloned() else {
            return Err(Status::failed_precondition(format!(
                "subscription '{}' is detached: its topic was deleted",
                record.name
            )));
        };
        self.lookup(&topic.name, topic.id, local)
    }

    /// Seek: a data-plane operation on the subscription's journal, which its topic's forwarder
    /// keeps; the catalog only names the subscription and the snapshot.
    pub async fn seek(&self, subscription: &str, target: SeekTarget) -> Result<(), Status> {
        let record = self.subscription_record(subscription)?;
        if record.detached {
            return Err(detached(&record.name));
        }
        let shard = self.shard_of(record.topic_id).ok_or_else(|| {
            Status::failed_precondition(format!(
                "subscription '{}' is detached: its topic was deleted",
                record.name
            ))
        })?;
        let (time_ms, snapshot_id) = match target {
            SeekTarget::Time { time_ms } => (time_ms, None),
            SeekTarget::Snapshot { name } => {
                let snapshot = self.snapshot_record(&name)?;
                if snapshot.topic_id != record.topic_id {
                    return Err(Status::failed_precondition(format!(
                        "snapshot '{}' is of another topic than subscription '{}'",
                        snapshot.name, record.name
                    )));
                }
                if snapshot.expire_time_ms <= wall_ms() {
                    return Err(Status::failed_precondition(format!(
                        "snapshot '{}' has expired",
                        snapshot.name
                    )));
                }
                (0, Some(snapshot.id))
            }
        };
        self.call_forwarder(
            shard,
            ControlRequest::Seek {
                subscription_id: record.id,
                topic_id: record.topic_id,
                time_ms,
                snapshot_id,
            },
        )
        .await?;
        Ok(())
    }

    /// One page of the snapshots (of `request.topic`, when given) that `visible` shows, as
    /// `list_topics` pages.
    pub fn list_snapshots(&self, request: &ListRequest, visible: impl Fn(&str) -> bool) -> Page<Snapshot> {
        let state = self.state.borrow();
        let topic_filter = request.topic.as_str();
        let snapshots = state
            .snapshots
            .range::<str, _>((
                std::ops::Bound::Excluded(request.page_token.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .filter(|(name, _)| visible(name))
            .map(|(_, snapshot)| snapshot_message(&state, snapshot))
            .filter(|snapshot| topic_filter.is_empty() || snapshot.topic == topic_filter);
        page(snapshots, request.page_size, |snapshot| &snapshot.name)
    }

    /// UpdateSnapshot: changes a snapshot's labels (`None`: leaves them). Only the catalog
    /// holds them: the forwarder's copy of the snapshot is its acknowledgements.
    pub async fn update_snapshot(&self, name: &str, labels: Option<Labels>) -> Result<Snapshot, Status> {
        let _update = self.update_permit().await?;
        let mut snapshot = self.snapshot_record(name)?;
        if let Some(labels) = labels {
            validate_labels(&labels)?;
            snapshot.labels = labels;
        }
        let entry = CatalogEntry::SnapshotUpdated {
            id: snapshot.id,
            name: snapshot.name.clone(),
            labels: snapshot.labels,
        };
        // A deletion that committed while the update waited for the disk wins.
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(Status::not_found(format!("snapshot '{name}' (deleted during the update)")));
        }
        self.get_snapshot(name)
    }

    /// DetachSubscription: the subscription stays, but leaves its topic as if the topic were
    /// deleted: its forwarder drops its state (its messages and leases), and from then on it
    /// is served nowhere, so pulls and streams answer `FAILED_PRECONDITION` (the forwarder
    /// answers `NotOwner` and the router's lookup says why). Detaching one already detached
    /// changes nothing. Durable first: a restart never attaches it again.
    pub async fn detach_subscription(&self, name: &str) -> Result<(), Status> {
        let _update = self.update_permit().await?;
        let record = self.subscription_record(name)?;
        if record.detached {
            return Ok(());
        }
        let entry = CatalogEntry::SubscriptionDetached { id: record.id, name: record.name.clone() };
        if self.propose(entry).await? == Applied::Updated(false) {
            return Err(Status::not_found(format!("subscription '{name}' (deleted during the detach)")));
        }
        let shard = self.shard_of(record.topic_id);
        if let Some(shard) = shard {
            let request = ControlRequest::DetachSubscription {
                subscription_id: record.id,
                name: record.name.clone(),
                topic_id: record.topic_id,
                deleted: false,
            };
            // Durable already: if the forwarder did not take it, the next start does not
            // attach the subscription.
            if let Err(status) = self.call_forwarder(shard, request).await {
                crate::log_warn!(
                    "ringpostd: detaching subscription '{}' from its topic: {status}",
                    record.name
                );
            }
        }
        Ok(())
    }

    pub fn get_snapshot(&self, name: &str) -> Result<Snapshot, Status> {
        let snapshot = self.snapshot_record(name)?;
        Ok(snapshot_message(&self.state.borrow(), &snapshot))
    }

    pub async fn delete_snapshot(&self, name: &str) -> Result<(), Status> {
        let snapshot = self.snapshot_record(name)?;
        self.propose(CatalogEntry::SnapshotDeleted { id: snapshot.id, name: snapshot.name.clone() }).await?;
        let shard = self.shard_of(snapshot.topic_id);
        if let Some(shard) = shard {
            let _ = self
                .call_forwarder(
                    shard,
                    ControlRequest::DropSnapshot { topic_id: snapshot.topic_id, snapshot_id: snapshot.id },
                )
                .await;
        }
        Ok(())
    }
}

/// A topic as clients see it.
fn topic_message(topic: &TopicRecord) -> Topic {
    Topic {
        name: topic.name.clone(),
        message_retention_seconds: topic.message_retention_seconds,
        labels: topic.labels.clone(),
        replicas: topic.replica_count() as u32,
    }
}

/// A snapshot as clients see it: its topic's name, or `DELETED_TOPIC` once it is deleted.
fn snapshot_message(state: &CatalogState, snapshot: &SnapshotRecord) -> Snapshot {
    Snapshot {
        name: snapshot.name.clone(),
        topic: state.topic_names.get(&snapshot.topic_id).cloned().unwrap_or_else(|| DELETED_TOPIC.into()),
        expire_time_ms: snapshot.expire_time_ms,
        labels: snapshot.labels.clone(),
    }
}

/// A subscription's dead letters go to another topic: to its own, each would come back to it as
/// a new message, to be dead-lettered again after as many attempts, for ever.
fn check_dead_letter_topic(subscription: &str, topic: &str, dead_letter_topic: &str) -> Result<(), Status> {
    if dead_letter_topic == topic {
        return Err(Status::invalid_argument(format!(
            "dead_letter_topic '{dead_letter_topic}' is the topic of subscription '{subscription}'; \
             dead letters must go to another topic"
        )));
    }
    Ok(())
}

/// What operations a detached subscription cannot take answer.
fn detached(name: &str) -> Status {
    Status::failed_precondition(format!("subscription '{name}' is detached"))
}

/// An update the catalog holds but the owning forwarder did not take: the daemon serves it from
/// the next start, and sending the same update again applies it now.
fn not_applied(kind: &str, name: &str, status: Status) -> Status {
    Status::unavailable(format!(
        "the update of {kind} '{name}' is durable, but its forwarder did not apply it ({status}); \
         it applies at the next start, or when the update is sent again"
    ))
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

#[cfg(test)]
mod advertise_tests {
    use super::*;

    #[test]
    fn forwarders_are_advertised_at_the_host_given_or_where_the_client_reached_the_router() {
        let fixed = ForwarderAddresses::new(vec![7451, 7452], Advertise::Host("node-1.example".into()));
        let reached: SocketAddr = "10.1.2.3:7450".parse().unwrap();
        assert_eq!(fixed.address(1, Some(reached)), "node-1.example:7452");
        let literal = ForwarderAddresses::new(vec![7451], Advertise::Host("::1".into()));
        assert_eq!(literal.address(0, None), "[::1]:7451");
        let connection = ForwarderAddresses::new(vec![7451, 7452], Advertise::ConnectionAddress);
        assert_eq!(connection.address(0, Some(reached)), "10.1.2.3:7451");
        let reached_v6: SocketAddr = "[fe80::1]:7450".parse().unwrap();
        assert_eq!(connection.address(1, Some(reached_v6)), "[fe80::1]:7452");
    }
}

pub mod elections;
mod members;
pub mod moves;
mod watch;
pub use members::{NodeRemoval, MEMBERSHIP_CHANGE_TIMEOUT, NODE_ID_MAX};
pub use watch::CLUSTER_WATCH_INTERVAL;
mod replicas;
#[cfg(test)]
mod tests;

pub use replicas::{ELECTIONS_ASKED_MAX, RECONCILE_TICK, SOURCE_FAILURE_TIMEOUT};
