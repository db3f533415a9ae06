//! The steps of a node's start that the daemon and the cluster simulation share: a forwarder
//! joining the cluster and its timers, and the router shard's steps once its catalog is ready
//! (the router, its door, the registration, the recovery, the door opened, the timers). The
//! daemon (`router_shard.rs`, `forwarder_shard.rs`) and `cluster_sim_tests.rs` give them only
//! what differs: the storage, the ways to the other nodes, and what opening the door means
//! (a port and a cluster port, or the simulation's table of nodes). So a change of the order
//! here is simulated (whether the seeds catch a wrong one: docs/TESTING.md).

use super::{repeat_every, StartPhase};
use crate::catalog::{Catalog, NodeRecord};
use crate::dispatch::{routes::Routes, Door, NodeTransport};
use crate::ids::NodeId;
use crate::log::Directories;
use crate::replication::source::Transport;
use crate::router::{self, CatalogLimits, ForwarderAddresses, ForwarderLink, Peers, Router};
use crate::{net, shard, storage::Storage};
use std::rc::Rc;
use std::sync::Arc;

/// How a forwarder reaches the other nodes of its cluster: their forwarders' replicas
/// (`replicas`), and their routers and forwarders for what its relay carries (`carrier`),
/// which finds who serves what through this node's router at `router_address`.
pub(crate) struct ForwarderCluster {
    pub node_id: NodeId,
    pub replicas: Rc<dyn Transport>,
    pub carrier: Rc<dyn net::relay::Carrier>,
    pub routes: Arc<Routes>,
    pub router_address: String,
}

/// Connects a forwarder to the other nodes: its sources replicate straight to their
/// forwarders, and subscribers of sources other nodes lead are served here too, their
/// requests and streams carried there by its relay.
pub(crate) fn forwarder_joins_the_cluster<S: Storage>(
    forwarder: &Rc<shard::Forwarder<S>>,
    cluster: ForwarderCluster,
) {
    forwarder.replica_context.node_id.set(Some(cluster.node_id));
    *forwarder.replica_context.transport.borrow_mut() = Some(cluster.replicas);
    net::relay::install(
        forwarder.global_shard(),
        net::relay::Relay::new(
            cluster.carrier,
            cluster.router_address,
            cluster.routes,
            forwarder.stop_handle(),
            forwarder.environment.stream_budget.clone(),
        ),
    );
}

/// A forwarder shard's timers: segments every subscription acknowledged deleted, and
/// expired leases collected when nobody pulls.
pub(crate) fn run_forwarder_timers<S: Storage>(forwarder: &Rc<shard::Forwarder<S>>) {
    let collector = forwarder.clone();
    repeat_every(shard::SEGMENT_COLLECTION_INTERVAL, async move || collector.collect_segments().await);
    let sweeper = forwarder.clone();
    repeat_every(shard::LEASE_SWEEP_INTERVAL, async move || sweeper.sweep_leases());
}

/// What the router is made of besides its catalog: the storage and directories the catalog
/// lives in, this node's forwarders (their control links and the addresses clients are told),
/// and the catalog's limits.
pub(crate) struct RouterParts<S: Storage> {
    pub storage: S,
    pub directories: Rc<Directories>,
    pub links: Vec<Rc<ForwarderLink>>,
    pub addresses: ForwarderAddresses,
    pub balance_factor: f64,
    pub limits: CatalogLimits,
    /// When the catalog's leader adds and retires the sources of topics that follow their load.
    pub follow_thresholds: router::follow::FollowThresholds,
}

/// A clustered node's ways to the other nodes and what it registers with the catalog's leader.
pub(crate) struct Membership {
    /// The other nodes' routers (the cluster port's connections in the daemon).
    pub peers: Rc<dyn Peers>,
    /// How the door carries an operation, with its principal, to the node that decides it.
    pub nodes: Rc<dyn NodeTransport>,
    /// This node's registration: its addresses and its forwarders.
    pub record: NodeRecord,
    /// Why this node's topics get one replica, if its ports would refuse replication.
    pub replication_refused: Option<&'static str>,
}

/// How often a node that could not register with the catalog's leader tries again.
const REGISTER_RETRY: std::time::Duration = std::time::Duration::from_millis(200);
/// How often a node still unregistered says so.
const REGISTER_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// The router shard's start once its catalog is ready, in this order:
/// 1. the router is made over the catalog, with its limits and, in a cluster, the other
///    nodes' routers (`membership`);
/// 2. its door, carrying to the catalog's leader in a cluster;
/// 3. in a cluster, this node registers its forwarders with the catalog's leader, until taken;
/// 4. the router recovers every topic and subscription onto its forwarders;
/// 5. `open` opens the door to clients and to the other nodes: only now, since before the
///    recovery a topic this node serves is not yet attached to its forwarder;
/// 6. the router's timers start.
///
/// Returns the router and its door, for what else the caller serves with them.
pub(crate) async fn serve_router<S: Storage>(
    catalog: Catalog<S>,
    parts: RouterParts<S>,
    membership: Option<Membership>,
    phase: &StartPhase,
    open: impl FnOnce(&Rc<Router<S>>, &Rc<Door<S>>),
) -> Result<(Rc<Router<S>>, Rc<Door<S>>), String> {
    let RouterParts { storage, directories, links, addresses, balance_factor, limits, follow_thresholds } =
        parts;
    let mut router = Router::new(storage, directories, catalog, links, addresses, balance_factor);
    router.set_limits(limits);
    router.set_follow_thresholds(follow_thresholds);
    if let Some(membership) = &membership {
        router.set_peers(membership.peers.clone());
        if let Some(why) = membership.replication_refused {
            router.refuse_replication(why);
        }
    }
    let router = Rc::new(router);
    let nodes = membership.as_ref().map(|membership| membership.nodes.clone());
    let door = Rc::new(Door::new(router.clone(), nodes));
    if let Some(membership) = membership {
        phase.set("registering its forwarders with the catalog's leader");
        register(&router, membership.record).await;
    }
    phase.set("recovering its topics and subscriptions");
    router.recover().await?;
    open(&router, &door);
    run_router_timers(&router);
    Ok((router, door))
}

/// Registers this node with the catalog's leader, trying until it takes the registration.
async fn register<S: Storage>(router: &Router<S>, record: NodeRecord) {
    let started = crate::runtime::now();
    let mut reported = started;
    while let Err(status) = router.register(record.clone()).await {
        if crate::runtime::now() - reported >= REGISTER_REPORT_INTERVAL {
            reported = crate::runtime::now();
            crate::log_warn!("ringpostd: node {} is not registered yet: {status}", record.node_id);
        }
        crate::runtime::sleep(REGISTER_RETRY).await;
    }
}

/// The router shard's timers: replicated topics' replicas and elections (in a cluster),
/// subscription expiry, the catalog's disk reserve, the catalog's compaction, and, on the
/// catalog's leader, following the load of topics whose sources follow it.
fn run_router_timers<S: Storage>(router: &Rc<Router<S>>) {
    if router.is_clustered() {
        // Replicated topics: this node's replicas as the catalog says, and, on the catalog's
        // leader, elections for topics whose leader is gone.
        let replicas = router.clone();
        repeat_every(router::RECONCILE_TICK, async move || {
            replicas.reconcile_replicas().await;
            replicas.coordinate();
        });
        // The log's account of the cluster: members, leaders, contact lost and regained.
        let watcher = router.clone();
        repeat_every(router::CLUSTER_WATCH_INTERVAL, async move || watcher.watch_cluster());
    }
    // A topic's sources: each unit told its topic's active count, retired sources deleted.
    let sources = router.clone();
    repeat_every(router::SOURCES_PASS_INTERVAL, async move || sources.sources_pass().await);
    let follower = router.clone();
    repeat_every(router::follow::SOURCE_FOLLOW_INTERVAL, async move || follower.follow_load().await);
    let settler = router.clone();
    repeat_every(router::UNDECIDED_CHECK_INTERVAL, async move || settler.settle_undecided().await);
    let expirer = router.clone();
    // The router's requests (creates, lookups, the catalog's changes carried here) leave their
    // tasks' and buffers' memory free in this shard's heap; given back once it is quiet, or an
    // idle daemon stays at the peak of its last burst (W4's thousands of creates).
    let trim = crate::metrics::process::QuietTrim::default();
    repeat_every(shard::LEASE_SWEEP_INTERVAL, async move || {
        trim.sweep(crate::metrics::requests::total());
    });
    repeat_every(router::EXPIRATION_CHECK_INTERVAL, async move || {
        expirer.expire_subscriptions().await;
        expirer.retake_catalog_reserve().await;
        match expirer.compact_catalog().await {
            Ok(false) => {}
            Ok(true) => {
                crate::log_info!("ringpostd: compacted the catalog: snapshot taken, raft log purged");
                // The purged entries were held in this shard's heap (`catalog::store`): given
                // back, or an idle daemon keeps them resident.
                crate::metrics::process::release_free_memory();
            }
            Err(error) => crate::log_warn!("ringpostd: compacting the catalog: {error}"),
        }
    });
}
