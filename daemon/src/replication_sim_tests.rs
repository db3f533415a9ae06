//! T19 for the replicated data plane (docs/TESTING.md): three nodes, each a real `Forwarder`
//! on a SimDisk of its own (one or three data directories), replicating one topic to each
//! other over a simulated network that delays, reorders, drops and duplicates requests and
//! cuts nodes off, all on one seeded executor. Each node's tasks are a group of the executor,
//! so a crash ends that node's tasks alone before its disk loses, keeps or tears what was not
//! synced; it comes back as the daemon does (its replica attached as a follower, and, if it
//! led, an election asked for). The catalog is a `CatalogState` that never fails, changed only
//! by its `apply`; its leader's elections are the router's own (`router::elections`:
//! `coordinate` and `elect`, over this test's `Electorate`), which hears only the nodes it can
//! reach and reaches no node cut off. Each node's router promoting and demoting its replica is
//! played by the test. Publishers and an acknowledging subscriber go to the leader they know,
//! or to any node. Among the faults, a replica is moved to a spare node by the router's own
//! steps (`router::moves::move_replica`, over this test's `Mover`: taken out, then a new one
//! added, an election after each), the faults going on meanwhile; the replica taken out is
//! shut down. One fault aims at the hand-off of a move: the leader's replica moved away just
//! after one follower came back from being cut off and the other was cut off.
//!
//! Checked as it runs: nothing is delivered that was never published, no message is
//! delivered again after its acknowledgement was confirmed, and the committed records of any
//! two replicas agree where both have them. At the end, once everything healed: every
//! acknowledged publish is delivered, and the three replicas hold one committed log.
//!
//! `RINGPOST_SIM_SEEDS=N` runs N seeds (default 200); `RINGPOST_SIM_SEED=S` replays seed S.

use crate::api::Status;
use crate::catalog::{Applied, CatalogEntry, CatalogState, SubscriptionSettings, TopicRecord};
use crate::clock::SystemClock;
use crate::control::{ControlOk, ControlRequest};
use crate::ids::{NodeId, Offset, ShardId, TopicId};
use crate::log::{Directories, LogConfig};
use crate::replication::protocol::ReplicaRequest;
use crate::replication::source::{AnswerFuture, Peer, Transport};
use crate::router::elections::{self, ElectionTimings, Elections, Electorate};
use crate::router::moves;
use crate::router::ControlError;
use crate::runtime::{self, sim};
use crate::shard::Forwarder;
use crate::sim_checker::{Checker, Outcome};
use crate::sim_node_tests::{call, crash_mode};
use crate::storage::sim::SimDisk;
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::*;
use ringpost_wire::Command;
use std::cell::{Cell, Ref, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

const SEEDS_DEFAULT: u64 = 200;
/// The replicas a topic starts with.
const NODES: usize = 3;
/// Nodes in all: the replicas, and spares a replica move takes one of as the new replica.
const NODES_TOTAL: usize = 5;
/// How long a move waits for a leader's first commit of its epoch before it gives up.
const MOVE_STEP_WAIT: Duration = Duration::from_secs(3);
const TOPIC_ID: TopicId = TopicId::new(1);
const TOPIC: &str = "replicated";
const SUBSCRIPTION_ID: u64 = 2;
const SUBSCRIPTION: &str = "replicated-sub";
/// Faults the nemesis makes before everything heals.
const NEMESIS_STEPS_MAX: u64 = 12;
/// One way of a request or an answer: up to this much, drawn by the seed.
const DELAY_MAX_US: u64 = 3_000;
/// How long a caller waits for an answer through the simulated network.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the catalog's part looks at the replicas.
const COORDINATE_INTERVAL: Duration = Duration::from_millis(50);
/// The elections' timings: a leader's node not heard from for 300 ms is taken for gone (the
/// daemon's 1.5 s is long beside a nemesis that acts every few hundred milliseconds), a fencing
/// round waits as long as any call, and a failed election is tried again at the next look.
const ELECTION_TIMINGS: ElectionTimings = ElectionTimings {
    source_failure_timeout: Duration::from_millis(300),
    fence_wait: CALL_TIMEOUT,
    retry_interval: COORDINATE_INTERVAL,
    move_step_timeout: MOVE_STEP_WAIT,
    move_poll_interval: COORDINATE_INTERVAL,
};
const PUBLISHERS: usize = 2;
const MESSAGES_PER_PUBLISH_MAX: u64 = 3;
const ACK_DEADLINE_SECONDS: u32 = 10;
/// Empty pulls in a row after which the drain takes the subscription for empty.
const DRAIN_EMPTY_PULLS: u32 = 5;

/// One node: its disk, its forwarder while it runs, and the executor group of its tasks.
struct Node {
    disk: SimDisk,
    forwarder: Option<Rc<Forwarder<SimDisk>>>,
    group: u64,
    lives: u64,
    /// The epoch it led at when it last crashed: it asks for an election instead.
    stale: Option<u64>,
    /// The epoch its router last promoted it for.
    promoted: Option<u64>,
}

/// The simulated network and nodes, shared by every transport.
struct World {
    seed: u64,
    nodes: RefCell<Vec<Node>>,
    paths: Vec<PathBuf>,
    config: LogConfig,
    rng: RefCell<sim::Rng>,
    /// Nodes cut off from every other (and from the catalog), but reachable by clients.
    isolated: RefCell<BTreeSet<usize>>,
    drop_ppm: u32,
    duplicate_ppm: u32,
    /// The catalog: the topic's record (its replicas, leader and epoch), changed only by
    /// `CatalogState::apply` of what the elections and moves decide.
    catalog: RefCell<CatalogState>,
    /// The catalog leader's elections, the router's own.
    elections: Elections,
    /// When the catalog last heard from each node (a heartbeat answered), as its leader's raft
    /// notes it.
    heard: RefCell<Vec<Option<Instant>>>,
    checker: RefCell<Checker>,
    next_message: Cell<u64>,
    /// The nemesis is done and everything healed.
    healed: Cell<bool>,
    /// Nodes running without a replica, that a move may add.
    spares: RefCell<Vec<usize>>,
    /// A replica move runs (one at a time); it holds the topic's elections meanwhile.
    moving: Cell<bool>,
    /// Acknowledgements whose answer never came (ack id, payload), at most
    /// `UNANSWERED_ACKS_MAX`: a subscriber sends them again later, maybe to another leader,
    /// as a client library retries.
    unanswered_acks: RefCell<Vec<(String, Vec<u8>)>>,
}

const UNANSWERED_ACKS_MAX: usize = 64;

/// Prints what the simulation does when `RINGPOST_SIM_TRACE` is set, to follow a failing seed.
fn trace(what: impl FnOnce() -> String) {
    if std::env::var_os("RINGPOST_SIM_TRACE").is_some() {
        eprintln!("{:>12?} {}", runtime::wall_ms() % 1_000_000, what());
    }
}

fn shard_of(node: usize) -> ShardId {
    ShardId::new(NodeId::new(node as u64 + 1), 0)
}

fn node_of(shard: ShardId) -> usize {
    shard.node().get() as usize - 1
}

fn peers(members: &[usize]) -> Vec<Peer> {
    members.iter().map(|node| Peer { shard: shard_of(*node), address: format!("node-{node}") }).collect()
}

impl World {
    fn chance(&self, parts_per_million: u32) -> bool {
        self.rng.borrow_mut().chance(parts_per_million)
    }

    async fn one_way(&self) {
        let delay = self.rng.borrow_mut().below(DELAY_MAX_US);
        runtime::sleep(Duration::from_micros(delay)).await;
    }

    fn cut(&self, from: Option<usize>, to: usize) -> bool {
        let isolated = self.isolated.borrow();
        isolated.contains(&to)
            || from.is_some_and(|from| isolated.contains(&from))
            || self.chance(self.drop_ppm)
    }

    /// The running forwarder of `node` and its group, if it runs.
    fn running(&self, node: usize) -> Option<(Rc<Forwarder<SimDisk>>, u64)> {
        let nodes = self.nodes.borrow();
        nodes[node].forwarder.clone().map(|forwarder| (forwarder, nodes[node].group))
    }

    /// Runs `work` on `node` as one of its tasks (its own spawns are that node's too), if it
    /// runs; None if it is down, the answer did not come within `CALL_TIMEOUT`, or the node
    /// died meanwhile.
    async fn on_node<T: 'static, F: std::future::Future<Output = T> + 'static>(
        &self,
        node: usize,
        work: impl FnOnce(Rc<Forwarder<SimDisk>>) -> F,
    ) -> Option<T> {
        let (forwarder, group) = self.running(node)?;
        let task = sim::spawn_in_group(group, work(forwarder));
        futures_lite::future::or(async { Some(task.await) }, async {
            runtime::sleep(CALL_TIMEOUT).await;
            None
        })
        .await
    }

    /// Whether the catalog's side reaches `node`.
    fn reachable(&self, node: usize) -> bool {
        self.nodes.borrow()[node].forwarder.is_some() && !self.isolated.borrow().contains(&node)
    }

    /// The topic as the catalog holds it.
    fn topic(&self) -> TopicRecord {
        self.catalog.borrow().topic_by_id(TOPIC_ID).cloned().expect("the topic is never deleted")
    }

    /// The catalog's replicas of the topic, in order (changed by moves, one at a time).
    fn members(&self) -> Vec<usize> {
        self.topic().replicas.iter().map(|shard| node_of(*shard)).collect()
    }

    /// The topic's leader and epoch, as the catalog decided them.
    fn leader(&self) -> usize {
        node_of(self.topic().shard)
    }

    fn epoch(&self) -> u64 {
        self.topic().epoch
    }

    /// The catalog's leader hears every node it reaches (their heartbeats' answers).
    fn hear(&self) {
        let now = runtime::now();
        let mut heard = self.heard.borrow_mut();
        for (node, at) in heard.iter_mut().enumerate() {
            if self.reachable(node) {
                *at = Some(now);
            }
        }
    }

    fn random_member(&self) -> usize {
        let members = self.members();
        members[self.rng.borrow_mut().below(members.len() as u64) as usize]
    }
}

/// The catalog's leader as the router's elections see it: a catalog that always decides, the
/// nodes it heard from, and forwarders reached only when they run and are not cut off.
impl Electorate for World {
    fn elections(&self) -> &Elections {
        &self.elections
    }

    fn catalog(&self) -> Ref<'_, CatalogState> {
        self.catalog.borrow()
    }

    fn nodes_heard_within(&self, within: Duration) -> Option<Vec<NodeId>> {
        let now = runtime::now();
        let heard = self.heard.borrow();
        let recent = |at: &Option<Instant>| at.is_some_and(|at| now - at <= within);
        Some(
            (0..NODES_TOTAL)
                .filter(|node| recent(&heard[*node]))
                .map(|node| NodeId::new(node as u64 + 1))
                .collect(),
        )
    }

    async fn control(&self, shard: ShardId, request: ControlRequest) -> Result<ControlOk, ControlError> {
        let node = node_of(shard);
        let unreachable = || ControlError::unavailable(format!("node {node} is not reachable"));
        if !self.reachable(node) {
            return Err(unreachable());
        }
        Ok(self
            .on_node(node, move |forwarder| async move { forwarder.control(request).await })
            .await
            .unwrap_or_else(|| Err(unreachable().into()))?)
    }

    async fn decide(&self, entry: CatalogEntry) -> Result<Applied, ControlError> {
        let decided = format!("{entry:?}");
        let applied = self.catalog.borrow_mut().apply(entry);
        trace(|| format!("catalog: {decided}: {applied:?}"));
        Ok(applied)
    }
}

/// The new replica of a move goes to a spare node (each taken once).
impl moves::Mover for World {
    fn new_replica_place(
        &self,
        _topic: &TopicRecord,
        _leaving_node: NodeId,
    ) -> Result<ShardId, ControlError> {
        let spare = self.spares.borrow_mut().pop();
        spare.map(shard_of).ok_or_else(|| ControlError::failed_precondition("no spare node is left"))
    }
}

/// A node's way to the others: requests cross the simulated network, run on the target as
/// its task, and their answers cross back. It holds its world weakly: the world holds the
/// node's forwarder, which holds this, and a strong reference would keep every seed's world
/// (its disks' contents among it) alive after its run.
struct SimTransport {
    world: Weak<World>,
    from: usize,
}

impl Transport for SimTransport {
    fn call(&self, peer: &Peer, request: ReplicaRequest) -> AnswerFuture {
        let (world, from, to) = (self.world.upgrade(), self.from, node_of(peer.shard));
        Box::pin(async move {
            let unreachable = || crate::api::Status::unavailable(format!("node {to} is not reachable"));
            // The world outlives every call made while it runs (the run holds it).
            let world = world.ok_or_else(unreachable)?;
            world.one_way().await;
            if world.cut(Some(from), to) {
                return Err(unreachable());
            }
            if world.chance(world.duplicate_ppm) {
                // The same request again, later: its answer goes nowhere.
                let (again, twice) = (world.clone(), request.clone());
                runtime::spawn(async move {
                    again.one_way().await;
                    again
                        .on_node(to, move |forwarder| async move { forwarder.replica_request(twice).await })
                        .await;
                })
                .detach();
            }
            let answer = world
                .on_node(to, move |forwarder| async move { forwarder.replica_request(request).await })
                .await
                .ok_or_else(unreachable)?;
            world.one_way().await;
            if world.cut(Some(to), from) {
                return Err(unreachable());
            }
            answer
        })
    }
}

fn log_config(rng: &mut sim::Rng) -> LogConfig {
    LogConfig {
        segment_bytes_initial: 32 * 1024,
        segment_bytes_max: 64 * 1024,
        group_commit_bytes_max: [8 * 1024, 32 * 1024][rng.below(2) as usize],
        prewrite: false,
        recycle: false,
        ..LogConfig::default()
    }
}

/// Starts (or restarts) `node`: a forwarder on its disk, its replica attached as a follower.
async fn start(world: &Rc<World>, node: usize, recovering: bool) {
    let group = {
        let mut nodes = world.nodes.borrow_mut();
        nodes[node].lives += 1;
        nodes[node].group = (node as u64 + 1) * 1_000 + nodes[node].lives;
        nodes[node].group
    };
    let disk = world.nodes.borrow()[node].disk.clone();
    let forwarder = Rc::new(Forwarder::new(
        0,
        disk,
        Directories::new(world.paths.clone()),
        world.config.clone(),
        Rc::new(SystemClock),
    ));
    forwarder.replica_context.node_id.set(Some(NodeId::new(node as u64 + 1)));
    *forwarder.replica_context.transport.borrow_mut() =
        Some(Rc::new(SimTransport { world: Rc::downgrade(world), from: node }));
    let attach = ControlRequest::AttachReplica {
        topic_id: TOPIC_ID,
        name: TOPIC.to_owned(),
        retention_seconds: 0,
        recovering,
        source: crate::ids::SourceId::FIRST,
        active: 1,
    };
    // A spare holds no replica until a move adds it.
    if world.members().contains(&node) {
        let starting = forwarder.clone();
        let attached = sim::spawn_in_group(group, async move { starting.control(attach).await }).await;
        attached
            .unwrap_or_else(|status| panic!("seed {}: node {node} could not attach: {status}", world.seed));
    }
    let collector = forwarder.clone();
    sim::spawn_in_group(group, async move {
        loop {
            runtime::sleep(Duration::from_millis(20)).await;
            collector.collect_segments().await;
            collector.sweep_leases();
        }
    })
    .detach();
    let mut nodes = world.nodes.borrow_mut();
    nodes[node].forwarder = Some(forwarder);
    nodes[node].promoted = None;
}

/// A crash of `node`: its tasks end, its disk loses what was not synced (or keeps some, or
/// tears the last write). If it led, it asks for an election once back.
fn crash(world: &World, node: usize) {
    let (group, disk) = {
        let nodes = world.nodes.borrow();
        (nodes[node].group, nodes[node].disk.clone())
    };
    sim::kill_group(group);
    let mode = crash_mode(&mut world.rng.borrow_mut());
    disk.crash(mode);
    let mut nodes = world.nodes.borrow_mut();
    nodes[node].forwarder = None;
    if world.leader() == node {
        nodes[node].stale = Some(world.epoch());
    }
}

/// The catalog's part: its leader hears the nodes it reaches and runs the router's
/// `coordinate`, which elects a leader for the topic when its leader's node was not heard from
/// for a while, when its last election failed, or when the leader's node asks: its router asks
/// for a topic it led before it crashed (`recover_replicas`), or whose followers refused it for
/// a newer epoch's promise (`ElectionsWanted`). Then each node's router promotes or demotes its
/// replica as the decided epoch says.
async fn coordinate(world: Rc<World>) {
    loop {
        runtime::sleep(COORDINATE_INTERVAL).await;
        world.hear();
        let (leader, epoch) = (world.leader(), world.epoch());
        if world.reachable(leader) {
            let stale = world.nodes.borrow()[leader].stale == Some(epoch);
            let refused =
                world.running(leader).is_some_and(|(forwarder, _)| !forwarder.elections_wanted().is_empty());
            if stale || refused {
                world.elections.want([TOPIC_ID]);
            }
        }
        elections::coordinate(&world);
        reconcile(&world).await;
    }
}

/// Each reachable node as the decided epoch says: the leader promoted (and given the
/// subscription), any other leading an older epoch demoted.
async fn reconcile(world: &Rc<World>) {
    let (epoch, leader) = (world.epoch(), world.leader());
    let members = world.members();
    for node in members.iter().copied().filter(|node| world.reachable(*node)) {
        if node == leader {
            let (promoted, stale) = {
                let nodes = world.nodes.borrow();
                (nodes[node].promoted, nodes[node].stale)
            };
            if promoted == Some(epoch) || stale == Some(epoch) {
                continue;
            }
            let promote =
                ControlRequest::PromoteReplica { topic_id: TOPIC_ID, epoch, replicas: peers(&members) };
            let promoted = world
                .on_node(node, move |forwarder| async move {
                    forwarder.control(promote).await?;
                    // The defaults the router applies: a week's retention, not none.
                    let settings = SubscriptionSettings {
                        ack_deadline_seconds: ACK_DEADLINE_SECONDS,
                        message_retention_seconds: 7 * 24 * 3600,
                        expiration_ttl_seconds: 31 * 24 * 3600,
                        ..SubscriptionSettings::default()
                    };
                    forwarder
                        .control(ControlRequest::AttachSubscription {
                            subscription_id: SUBSCRIPTION_ID,
                            name: SUBSCRIPTION.to_owned(),
                            topic_id: TOPIC_ID,
                            settings,
                            create: false,
                            start_offset: 0,
                        })
                        .await
                })
                .await;
            trace(|| format!("node {node} promoted for epoch {epoch}: {promoted:?}"));
            if let Some(Ok(_)) = promoted {
                world.nodes.borrow_mut()[node].promoted = Some(epoch);
            }
        } else {
            let demote = ControlRequest::DemoteReplica { topic_id: TOPIC_ID, epoch };
            world.on_node(node, move |forwarder| async move { forwarder.control(demote).await }).await;
        }
    }
    // A replica taken out of the set leads nothing any more (its node is shut down soon).
    for node in (0..NODES_TOTAL).filter(|node| !members.contains(node) && world.reachable(*node)) {
        let demote = ControlRequest::DemoteReplica { topic_id: TOPIC_ID, epoch };
        world.on_node(node, move |forwarder| async move { forwarder.control(demote).await }).await;
    }
}

/// A node a client sends to: the leader it was told of, mostly.
fn target(world: &World) -> usize {
    let mut rng = world.rng.borrow_mut();
    if rng.chance(100_000) {
        rng.below(NODES_TOTAL as u64) as usize
    } else {
        world.leader()
    }
}

async fn publisher(world: Rc<World>, publisher: usize) {
    while !world.healed.get() {
        let pause = world.rng.borrow_mut().below(3_000);
        runtime::sleep(Duration::from_micros(pause)).await;
        let node = target(&world);
        let count = 1 + world.rng.borrow_mut().below(MESSAGES_PER_PUBLISH_MAX);
        let messages: Vec<PubsubMessage> = (0..count)
            .map(|_| {
                let number = world.next_message.get();
                world.next_message.set(number + 1);
                PubsubMessage {
                    data: format!("p{publisher}/m{number}/").into_bytes(),
                    ..PubsubMessage::default()
                }
            })
            .collect();
        let sent: Vec<Vec<u8>> = messages.iter().map(|message| message.data.clone()).collect();
        for data in &sent {
            world.checker.borrow_mut().published.insert(data.clone(), Outcome::Indeterminate);
        }
        let request = PublishRequest { topic: TOPIC.to_owned(), messages };
        let answered = world
            .on_node(node, move |forwarder| async move { call(&forwarder, Command::Publish, &request).await })
            .await;
        trace(|| {
            let ids = answered.as_ref().and_then(|answer| answer.as_ref().ok()).map(|response| {
                ringpost_wire::decode_body::<PublishResponse>(&response[FRAME_HEADER_BYTES..])
                    .map(|ids| ids.message_ids)
            });
            let names: Vec<String> =
                sent.iter().map(|data| String::from_utf8_lossy(data).into_owned()).collect();
            format!(
                "publish {names:?} to node {node}: {ids:?} {:?}",
                answered.as_ref().map(|answer| answer.as_ref().err())
            )
        });
        if let Some(Ok(_)) = answered {
            let mut checker = world.checker.borrow_mut();
            for data in sent {
                checker.published.insert(data, Outcome::Acknowledged);
            }
        }
    }
}

/// One pull from `node` and an acknowledgement of most of what came; how many came.
async fn pull_once(world: &Rc<World>, node: usize, acknowledge_all: bool) -> usize {
    let request = PullRequest { subscription: SUBSCRIPTION.into(), max_messages: 20, wait_ms: 0 };
    let answered = world
        .on_node(node, move |forwarder| async move { call(&forwarder, Command::Pull, &request).await })
        .await;
    let Some(Ok(response)) = answered else { return 0 };
    let received = ringpost_wire::decode_body::<PullResponse>(&response[FRAME_HEADER_BYTES..])
        .expect("a pull response")
        .received_messages;
    trace(|| {
        format!(
            "pull from node {node}: {:?}",
            received.iter().map(|message| message.message_id).collect::<Vec<_>>()
        )
    });
    let mut acks = Vec::new();
    // Now and then, first the acknowledgements that were never answered.
    if world.chance(300_000) {
        acks.extend(world.unanswered_acks.borrow_mut().drain(..));
    }
    {
        let mut checker = world.checker.borrow_mut();
        for message in &received {
            checker.delivered(world.seed, &message.data);
            if acknowledge_all || !world.chance(100_000) {
                acks.push((message.ack_id.clone(), message.data.clone()));
            }
        }
    }
    if acks.is_empty() {
        return received.len();
    }
    let request = AcknowledgeRequest {
        subscription: SUBSCRIPTION.into(),
        ack_ids: acks.iter().map(|(id, _)| id.clone()).collect(),
    };
    let answered = world
        .on_node(node, move |forwarder| async move { call(&forwarder, Command::Acknowledge, &request).await })
        .await;
    trace(|| {
        format!(
            "acknowledge on node {node}: {:?} {:?}",
            acks.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
            answered.as_ref().map(|answer| answer.as_ref().err())
        )
    });
    let Some(Ok(response)) = answered else {
        let mut unanswered = world.unanswered_acks.borrow_mut();
        let room = UNANSWERED_ACKS_MAX.saturating_sub(unanswered.len());
        unanswered.extend(acks.into_iter().take(room));
        return received.len();
    };
    {
        let invalid: HashSet<String> =
            ringpost_wire::decode_body::<AckResponse>(&response[FRAME_HEADER_BYTES..])
                .expect("an acknowledgement response")
                .invalid_ack_ids
                .into_iter()
                .map(|invalid| invalid.ack_id)
                .collect();
        let mut checker = world.checker.borrow_mut();
        for (id, data) in acks {
            if !invalid.contains(&id) {
                checker.acknowledged.insert(data);
            }
        }
    }
    received.len()
}

async fn subscriber(world: Rc<World>) {
    while !world.healed.get() {
        let pause = world.rng.borrow_mut().below(5_000);
        runtime::sleep(Duration::from_micros(pause)).await;
        let node = target(&world);
        pull_once(&world, node, false).await;
    }
}

/// Every committed record of `node`'s messages, by offset; with `durable`, every durable one.
async fn records(world: &Rc<World>, node: usize, durable: bool) -> Option<BTreeMap<u64, Vec<u8>>> {
    world
        .on_node(node, |forwarder| async move {
            let topic = forwarder
                .registry
                .followers
                .borrow()
                .get(&TOPIC_ID)
                .cloned()
                .or_else(|| forwarder.registry.topics_by_id.borrow().get(&TOPIC_ID).cloned())?;
            let records = if durable {
                topic.log.read_all(Offset::ZERO).await.ok()?
            } else {
                topic.log.read(Offset::ZERO, usize::MAX, usize::MAX).await.ok()?
            };
            Some(records.into_iter().map(|record| (record.offset.get(), record.data)).collect())
        })
        .await
        .flatten()
}

/// The committed records of every running replica agree at every offset two of them hold.
async fn check_prefixes(world: &Rc<World>) {
    let mut logs: Vec<(usize, BTreeMap<u64, Vec<u8>>)> = Vec::new();
    for node in 0..NODES_TOTAL {
        if let Some(records) = records(world, node, false).await {
            logs.push((node, records));
        }
    }
    for (index, (node, records)) in logs.iter().enumerate() {
        for (other, other_records) in &logs[index + 1..] {
            for (offset, data) in records {
                if let Some(other_data) = other_records.get(offset) {
                    assert_eq!(
                        data, other_data,
                        "seed {}: nodes {node} and {other} committed different records at offset {offset}",
                        world.seed
                    );
                }
            }
        }
    }
}

async fn nemesis(world: Rc<World>) {
    let steps = 1 + world.rng.borrow_mut().below(NEMESIS_STEPS_MAX);
    for _ in 0..steps {
        let pause = 20 + world.rng.borrow_mut().below(400);
        runtime::sleep(Duration::from_millis(pause)).await;
        check_prefixes(&world).await;
        let choice = world.rng.borrow_mut().below(8);
        let leader = world.leader();
        let random = world.random_member();
        trace(|| format!("nemesis {choice}: leader {leader}, node {random}"));
        match choice {
            // The leader cut off, then healed.
            0 => {
                world.isolated.borrow_mut().insert(leader);
            }
            // A minority (one node) cut off.
            1 => {
                world.isolated.borrow_mut().insert(random);
            }
            2 => world.isolated.borrow_mut().clear(),
            // One node crashes and comes back.
            3 => {
                if world.running(random).is_some() {
                    crash(&world, random);
                    let down = world.rng.borrow_mut().below(300);
                    runtime::sleep(Duration::from_millis(down)).await;
                    start(&world, random, true).await;
                }
            }
            // A majority crashes at once and comes back.
            4 => {
                let spared = random;
                let crashed: Vec<usize> = world
                    .members()
                    .into_iter()
                    .filter(|node| *node != spared && world.running(*node).is_some())
                    .collect();
                for node in &crashed {
                    crash(&world, *node);
                }
                let down = world.rng.borrow_mut().below(300);
                runtime::sleep(Duration::from_millis(down)).await;
                for node in crashed {
                    start(&world, node, true).await;
                }
            }
            // A replica moved to a spare node, while the faults go on.
            5 => {
                if !world.moving.get() && !world.spares.borrow().is_empty() {
                    world.moving.set(true);
                    runtime::spawn(move_replica(world.clone(), random)).detach();
                }
            }
            // The leader's replica moved away while a follower lags: one follower cut off
            // while publishes go on, then back as the other is cut off, and the move begins.
            // The hand-off's election hears the leaving leader and the lagging follower only:
            // their two answers must not make its quorum (the leaving one is no candidate, and
            // the lagging one lacks what the leader and the other acknowledged).
            7 => {
                let followers: Vec<usize> =
                    world.members().into_iter().filter(|node| *node != leader).collect();
                if followers.len() == 2 && !world.moving.get() && !world.spares.borrow().is_empty() {
                    let first = world.rng.borrow_mut().below(2) as usize;
                    let (lagging, other) = (followers[first], followers[1 - first]);
                    world.isolated.borrow_mut().insert(lagging);
                    let lag = 50 + world.rng.borrow_mut().below(200);
                    runtime::sleep(Duration::from_millis(lag)).await;
                    world.isolated.borrow_mut().remove(&lagging);
                    world.isolated.borrow_mut().insert(other);
                    world.moving.set(true);
                    runtime::spawn(move_replica(world.clone(), leader)).detach();
                }
            }
            // A node's wall clock stepped (T11): nothing that is safe may change.
            _ => {
                let offset = world.rng.borrow_mut().below(7_200_000) as i64 - 3_600_000;
                let group = world.nodes.borrow()[random].group;
                sim::set_wall_offset_ms(group, offset);
            }
        }
    }
    world.isolated.borrow_mut().clear();
}

/// A replica move, run by the router's own steps (`moves::move_replica`): `leaving` handed the
/// lead away if it has it, taken out of the set, then a spare added; each change followed by
/// an election whose leader commits a record of its epoch before the next. A step that fails
/// ends the move where it is (the catalog's timers elect again, and the next move settles what
/// it left); the replica taken out is shut down, as a node that left the cluster is.
async fn move_replica(world: Rc<World>, leaving: usize) {
    // The topic's turn, once an election the catalog's timers run ends (`move_replica_off`).
    while !world.elections.begin(TOPIC_ID) {
        runtime::sleep(COORDINATE_INTERVAL).await;
    }
    let done = moves::move_replica(&*world, TOPIC_ID, NodeId::new(leaving as u64 + 1)).await;
    world.elections.end(TOPIC_ID);
    trace(|| format!("move off node {leaving}: {done:?}, replicas now {:?}", world.members()));
    if !world.members().contains(&leaving) && world.running(leaving).is_some() {
        crash(&world, leaving);
    }
    if done.is_err() {
        // The move is run again (an operator's removal is): its first step is an election.
        world.elections.want([TOPIC_ID]);
    }
    world.moving.set(false);
}

fn simulate(seed: u64) {
    let mut rng = sim::Rng::new(seed);
    let copies = [1, 3][rng.below(2) as usize];
    let paths: Vec<PathBuf> = (0..copies).map(|copy| PathBuf::from(format!("/d{copy}"))).collect();
    let config = log_config(&mut rng);
    let drop_ppm = [0, 20_000, 100_000][rng.below(3) as usize];
    let duplicate_ppm = [0, 50_000][rng.below(2) as usize];
    let world_rng = rng.fork();
    let leader = rng.below(NODES as u64) as usize;
    let mut catalog = CatalogState::default();
    catalog.apply(CatalogEntry::TopicCreated(TopicRecord {
        id: TOPIC_ID,
        name: TOPIC.into(),
        message_retention_seconds: 0,
        shard: shard_of(leader),
        created_ms: sim::EPOCH_MS,
        labels: Default::default(),
        replicas: (0..NODES).map(shard_of).collect(),
        epoch: 1,
    }));
    let world = Rc::new(World {
        seed,
        nodes: RefCell::new(
            (0..NODES_TOTAL)
                .map(|_| Node {
                    disk: SimDisk::new(),
                    forwarder: None,
                    group: 0,
                    lives: 0,
                    stale: None,
                    promoted: None,
                })
                .collect(),
        ),
        paths,
        config,
        rng: RefCell::new(world_rng),
        isolated: RefCell::default(),
        drop_ppm,
        duplicate_ppm,
        catalog: RefCell::new(catalog),
        elections: Elections::new(ELECTION_TIMINGS),
        heard: RefCell::new(vec![None; NODES_TOTAL]),
        spares: RefCell::new((NODES..NODES_TOTAL).collect()),
        moving: Cell::new(false),
        checker: RefCell::default(),
        next_message: Cell::new(0),
        healed: Cell::new(false),
        unanswered_acks: RefCell::default(),
    });
    let world_left = Rc::downgrade(&world);
    let disks: Vec<_> = world.nodes.borrow().iter().map(|node| node.disk.downgrade()).collect();
    sim::run(seed, async move {
        for node in 0..NODES_TOTAL {
            start(&world, node, false).await;
        }
        runtime::spawn(coordinate(world.clone())).detach();
        let clients: Vec<_> = (0..PUBLISHERS)
            .map(|publisher_number| runtime::spawn(publisher(world.clone(), publisher_number)))
            .chain(std::iter::once(runtime::spawn(subscriber(world.clone()))))
            .collect();
        nemesis(world.clone()).await;
        while world.moving.get() {
            runtime::sleep(COORDINATE_INTERVAL).await;
        }
        world.healed.set(true);
        for client in clients {
            client.await;
        }
        // Everything healed: wait until the leader serves, then drain, taking redeliveries
        // past the ack deadline too.
        let mut empty = 0;
        let mut pulls = 0;
        while empty < DRAIN_EMPTY_PULLS {
            pulls += 1;
            assert!(pulls < 20_000, "seed {seed}: the drain never ended");
            let came = pull_once(&world, world.leader(), true).await;
            if came == 0 {
                empty += 1;
                runtime::sleep(Duration::from_secs(u64::from(ACK_DEADLINE_SECONDS) + 1)).await;
            } else {
                empty = 0;
            }
        }
        let lost = world.checker.borrow().lost();
        if !lost.is_empty() {
            for node in 0..NODES_TOTAL {
                let held = records(&world, node, true).await.unwrap_or_default();
                let found: Vec<(u64, String)> = held
                    .iter()
                    .filter(|(_, data)| lost.contains(&String::from_utf8_lossy(data).into_owned()))
                    .map(|(offset, data)| (*offset, String::from_utf8_lossy(data).into_owned()))
                    .collect();
                eprintln!("seed {seed}: node {node} holds the lost ones at {found:?}");
                let state = world
                    .on_node(node, |forwarder| async move {
                        let served = forwarder.registry.subscriptions.borrow().get(SUBSCRIPTION).cloned()?;
                        let state = served.0.state.borrow();
                        Some((
                            state.ack_floor(),
                            state.outstanding(),
                            served.1.log.start_offset(),
                            served.1.log.committed_end(),
                        ))
                    })
                    .await;
                eprintln!("seed {seed}: node {node} subscription (ack floor, outstanding, log start, committed) {state:?}");
            }
        }
        assert!(lost.is_empty(), "seed {seed}: acknowledged publishes lost: {lost:?}");
        // The followers learn the last commit point once the leader is idle.
        runtime::sleep(Duration::from_secs(3)).await;
        check_prefixes(&world).await;
        // Quiet and healed, the replicas hold one log.
        let members = world.members();
        let mut logs = Vec::new();
        for node in &members {
            logs.push(records(&world, *node, true).await.expect("every replica runs at the end"));
        }
        // Retention removes segments on each replica apart: from the latest start on.
        let start = logs.iter().filter_map(|log| log.keys().next().copied()).max().unwrap_or(0);
        let kept: Vec<BTreeMap<u64, Vec<u8>>> =
            logs.into_iter().map(|mut log| log.split_off(&start)).collect();
        for node in 1..members.len() {
            let differs =
                kept[node].iter().zip(kept[0].iter()).find(|((offset, data), (other_offset, other_data))| {
                    offset != other_offset || data != other_data
                });
            assert!(
                kept[node].len() == kept[0].len() && differs.is_none(),
                "seed {seed}: node {}'s log differs from node {}'s from offset {start}: {} against {} records, \
                 first difference {differs:?}",
                members[node],
                members[0],
                kept[node].len(),
                kept[0].len()
            );
        }
    });
    // What a seed built is freed once its run ends, or a run of many seeds grows by each one's
    // disks: nothing keeps the world alive, and nothing of a forwarder (crashed or running at
    // the end) that holds a disk's files is kept by a cycle of its own.
    assert!(world_left.upgrade().is_none(), "seed {seed}: the world outlived its run");
    for (node, disk) in disks.iter().enumerate() {
        assert!(!disk.is_held(), "seed {seed}: node {node}'s disk outlived its run");
    }
}

#[test]
fn three_replicas_keep_every_acknowledged_publish_through_partitions_crashes_and_lost_messages() {
    sim::for_each_seed(
        "three_replicas_keep_every_acknowledged_publish_through_partitions_crashes_and_lost_messages",
        SEEDS_DEFAULT,
        simulate,
    );
}

/// A leader's way to its one follower, which the test cuts: cut, every request fails as an
/// unreachable node's does, so that a publish waits for a quorum that does not come.
struct Link {
    follower: Rc<Forwarder<SimDisk>>,
    cut: Rc<Cell<bool>>,
}

impl Transport for Link {
    fn call(&self, _peer: &Peer, request: ReplicaRequest) -> AnswerFuture {
        let (follower, cut) = (self.follower.clone(), self.cut.clone());
        Box::pin(async move {
            runtime::sleep(Duration::from_micros(DELAY_MAX_US)).await;
            if cut.get() {
                return Err(Status::unavailable("the follower is cut off"));
            }
            follower.replica_request(request).await
        })
    }
}

/// Deposes `old_leader` and elects `new_leader` at epoch 2 over a link to the old one, which
/// it returns cut: the new leader's epoch cannot commit until the link is healed.
async fn fail_over(
    old_leader: &Rc<Forwarder<SimDisk>>,
    new_leader: &Rc<Forwarder<SimDisk>>,
) -> Rc<Cell<bool>> {
    old_leader
        .control(ControlRequest::DemoteReplica { topic_id: TOPIC_ID, epoch: 2 })
        .await
        .expect("demoted");
    let cut = Rc::new(Cell::new(false));
    *new_leader.replica_context.transport.borrow_mut() =
        Some(Rc::new(Link { follower: old_leader.clone(), cut: cut.clone() }));
    let promote = ControlRequest::PromoteReplica { topic_id: TOPIC_ID, epoch: 2, replicas: peers(&[1, 0]) };
    new_leader.control(promote).await.expect("promoted with its old leader's answer");
    cut.set(true);
    cut
}

/// Two replicas of the topic on two nodes, node 0 promoted to lead epoch 1 over a link the
/// test can cut; the leader's forwarder, the link's switch and the follower's forwarder.
async fn two_replicas() -> (Rc<Forwarder<SimDisk>>, Rc<Cell<bool>>, Rc<Forwarder<SimDisk>>) {
    two_replicas_of((crate::ids::SourceId::FIRST, 1)).await
}

/// `two_replicas`, of source `source` of a topic whose active count is `active`.
async fn two_replicas_of(
    (source, active): (crate::ids::SourceId, u32),
) -> (Rc<Forwarder<SimDisk>>, Rc<Cell<bool>>, Rc<Forwarder<SimDisk>>) {
    let mut forwarders = Vec::new();
    for node in 0..2 {
        let forwarder = Rc::new(Forwarder::new(
            0,
            SimDisk::new(),
            Directories::new(vec![PathBuf::from("/d0")]),
            LogConfig::default(),
            Rc::new(SystemClock),
        ));
        forwarder.replica_context.node_id.set(Some(NodeId::new(node as u64 + 1)));
        let attach = ControlRequest::AttachReplica {
            topic_id: TOPIC_ID,
            name: TOPIC.to_owned(),
            retention_seconds: 0,
            recovering: false,
            source,
            active,
        };
        forwarder.control(attach).await.expect("a replica attaches");
        forwarders.push(forwarder);
    }
    let (leader, follower) = (forwarders[0].clone(), forwarders[1].clone());
    let cut = Rc::new(Cell::new(false));
    *leader.replica_context.transport.borrow_mut() =
        Some(Rc::new(Link { follower: follower.clone(), cut: cut.clone() }));
    let promote = ControlRequest::PromoteReplica { topic_id: TOPIC_ID, epoch: 1, replicas: peers(&[0, 1]) };
    leader.control(promote).await.expect("the leader is promoted with its follower's answer");
    (leader, cut, follower)
}

/// A publish through the leader's native handler, answered with its wire status.
async fn publish_to(forwarder: &Forwarder<SimDisk>, text: &str) -> Result<(), ringpost_wire::Status> {
    let request = PublishRequest {
        topic: TOPIC.to_owned(),
        messages: vec![PubsubMessage { data: text.as_bytes().to_vec(), ..PubsubMessage::default() }],
    };
    let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request);
    let header =
        ringpost_wire::FrameHeader::decode(&frame[..FRAME_HEADER_BYTES]).expect("a frame just encoded");
    let mut body = ringpost_wire::FrameBuffer::new();
    body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    let responder = crate::net::server::Responder::unconnected();
    let response =
        crate::net::server::Handler::handle(forwarder, header, body, &responder).await.into_contiguous();
    let header =
        ringpost_wire::FrameHeader::decode(&response[..FRAME_HEADER_BYTES]).expect("a response frame");
    if header.is_error() {
        Err(ringpost_wire::frame::decode_error(&response[FRAME_HEADER_BYTES..]))
    } else {
        Ok(())
    }
}

/// A replicated source's follower knows its topic's active count: told the source retires
/// (answering `Done`, never a fence of its own), once promoted it refuses every publish from its
/// first, and its fence is its log's end as its epoch began, above every message its leader
/// before took.
#[test]
fn a_promoted_replica_of_a_retiring_source_refuses_publishes_and_fences_above_what_it_holds() {
    use ringpost_wire::ErrorCode;
    sim::run(3, async {
        let source = crate::ids::SourceId::new(1).unwrap();
        let (leader, _cut, follower) = two_replicas_of((source, 2)).await;
        for text in ["a", "b", "c"] {
            publish_to(&leader, text).await.expect("an active source takes an unordered publish");
        }
        let retire = || ControlRequest::ApplySources { topic_id: TOPIC_ID, active: 1 };
        assert_eq!(follower.control(retire()).await, Ok(ControlOk::Done), "a follower keeps the count");
        let cut = fail_over(&leader, &follower).await;
        cut.set(false);
        runtime::sleep(crate::replication::source::LEASE_WAIT + Duration::from_millis(100)).await;
        let refused = publish_to(&follower, "late").await.expect_err("a retiring source takes nothing");
        assert_eq!(refused.code, ErrorCode::NotOwner, "{refused:?}");
        let end = follower.registry.topics_by_id.borrow()[&TOPIC_ID].log.next_offset().get();
        let Ok(ControlOk::SourcesApplied { fence, .. }) = follower.control(retire()).await else {
            panic!("the promoted replica answers its fence")
        };
        assert!(fence >= 3, "fence {fence} below the 3 messages its leader before took");
        assert!(fence <= end, "fence {fence} above its log's end {end}");
    });
}

/// A publish waiting for its quorum when its leader is deposed is answered `NotOwner` on the
/// native protocol (go elsewhere: the client asks the router for the new leader), and says so;
/// one whose quorum does not confirm within `COMMIT_WAIT_MAX` is answered `Unavailable`
/// (retry here), while the replica still leads.
#[test]
fn a_publish_whose_leader_is_deposed_is_not_owner_and_one_whose_quorum_is_slow_is_unavailable() {
    use ringpost_wire::ErrorCode;
    sim::run(1, async {
        let (leader, cut, _follower) = two_replicas().await;
        publish_to(&leader, "before").await.expect("a publish with its quorum is acknowledged");

        cut.set(true);
        let waiting = leader.clone();
        let publish = runtime::spawn(async move { publish_to(&waiting, "deposed").await });
        runtime::sleep(Duration::from_millis(100)).await;
        leader
            .control(ControlRequest::DemoteReplica { topic_id: TOPIC_ID, epoch: 2 })
            .await
            .expect("demoted");
        let refused = publish.await.expect_err("the deposed leader cannot say the write is kept");
        assert_eq!(refused.code, ErrorCode::NotOwner, "{refused:?}");
        assert!(refused.message.contains("stopped leading the topic at epoch 1"), "{refused:?}");
        let refused = publish_to(&leader, "after").await.expect_err("a follower serves no client");
        assert_eq!(refused.code, ErrorCode::NotOwner, "{refused:?}");
    });
    sim::run(2, async {
        let (leader, cut, _follower) = two_replicas().await;
        cut.set(true);
        let started = runtime::now();
        let refused = publish_to(&leader, "slow").await.expect_err("no quorum confirms it");
        assert_eq!(refused.code, ErrorCode::Unavailable, "{refused:?}");
        assert!(refused.message.contains("fewer than 2 of 2 replicas confirmed"), "{refused:?}");
        assert!(runtime::now() - started >= crate::replication::source::COMMIT_WAIT_MAX);
        cut.set(false);
        publish_to(&leader, "healed").await.expect("the same leader takes the retry");
    });
}

/// A leader demoted by a newer epoch's promise (an election's fencing round) that no leader of
/// that epoch syncs asks for an election once `FENCED_LEAD_WAIT` passed: the election that
/// fenced it may have failed to commit its leader, and the catalog's leader that would retry it
/// may have changed meanwhile (the cluster simulation found a topic so led by no one, every
/// replica a follower, until the end). Synced by the next epoch's leader, it asks nothing.
#[test]
fn a_leader_fenced_by_an_election_that_never_committed_asks_for_another() {
    use crate::shard::replica::FENCED_LEAD_WAIT;
    sim::run(4, async {
        let (leader, _cut, follower) = two_replicas().await;
        assert!(leader.elections_wanted().is_empty(), "a leader its followers take asks nothing");
        // Demoted by the catalog's leader, which names another: nothing to ask.
        follower
            .control(ControlRequest::DemoteReplica { topic_id: TOPIC_ID, epoch: 2 })
            .await
            .expect("a follower demoted stays one");
        // The fencing round of an election of epoch 2, as the catalog's leader runs it.
        leader.control(ControlRequest::FenceReplica { topic_id: TOPIC_ID, epoch: 2 }).await.expect("fenced");
        assert!(leader.elections_wanted().is_empty(), "the election that fenced it has its time");
        runtime::sleep(FENCED_LEAD_WAIT).await;
        assert_eq!(leader.elections_wanted(), vec![TOPIC_ID], "no leader synced it since");
        // The next election's leader, over a link that stays up, syncs it.
        *follower.replica_context.transport.borrow_mut() =
            Some(Rc::new(Link { follower: leader.clone(), cut: Rc::new(Cell::new(false)) }));
        let promote =
            ControlRequest::PromoteReplica { topic_id: TOPIC_ID, epoch: 2, replicas: peers(&[1, 0]) };
        follower.control(promote).await.expect("promoted");
        runtime::sleep(Duration::from_millis(100)).await;
        assert!(leader.elections_wanted().is_empty(), "synced by the leader of epoch 2");
    });
    // Fenced, then elected itself: a promotion that fails (its follower cut off) is retried by
    // its node's router, and asking for an election meanwhile would begin an epoch that fails
    // the promotion in turn (the simulation found elections so repeated without end).
    sim::run(5, async {
        let (leader, cut, _follower) = two_replicas().await;
        leader.control(ControlRequest::FenceReplica { topic_id: TOPIC_ID, epoch: 2 }).await.expect("fenced");
        cut.set(true);
        let promote =
            ControlRequest::PromoteReplica { topic_id: TOPIC_ID, epoch: 2, replicas: peers(&[0, 1]) };
        leader.control(promote).await.expect_err("no quorum answers its fencing round");
        runtime::sleep(FENCED_LEAD_WAIT * 2).await;
        assert!(leader.elections_wanted().is_empty(), "its promotion is retried, not a new election");
    });
}

/// A subscription's sync point on a new leader (`ControlRequest::DurableEnd`) covers every
/// publish its predecessor acknowledged: before its first record of its epoch commits, a new
/// leader's commit point is only what it was told as a follower, which lags what the old leader
/// acknowledged, so the answer waits for that commit. Without a quorum it is `Unavailable`
/// after `SYNC_POINT_WAIT_MAX` (the create is retried), never early.
#[test]
fn a_new_leader_answers_a_sync_point_only_once_its_epoch_commits() {
    use crate::replication::source::SYNC_POINT_WAIT_MAX;
    sim::run(3, async {
        let (old_leader, _, new_leader) = two_replicas().await;
        for index in 0..3 {
            publish_to(&old_leader, &format!("acknowledged {index}")).await.expect("acknowledged");
        }
        let acknowledged_end = old_leader.replica_progress(TOPIC_ID).expect("a replica").committed_ends[0];
        let told = new_leader.replica_progress(TOPIC_ID).expect("a replica");
        assert!(
            told.committed_ends[0] < acknowledged_end && told.durable_ends[0] >= acknowledged_end,
            "the follower holds every acknowledged record ({acknowledged_end}) but was told less \
             committed: {told:?}"
        );

        // The old leader is deposed and its follower elected, which it then cannot reach.
        let cut = fail_over(&old_leader, &new_leader).await;

        let (asking, answered) = (new_leader.clone(), Rc::new(Cell::new(false)));
        let answered_there = answered.clone();
        let durable_end = runtime::spawn(async move {
            let answer = asking.control(ControlRequest::DurableEnd { topic_id: TOPIC_ID }).await;
            answered_there.set(true);
            answer
        });
        runtime::sleep(Duration::from_millis(500)).await;
        assert!(!answered.get(), "a sync point answered before the new epoch committed");
        cut.set(false);
        let Ok(ControlOk::SubscriptionStart(start)) = durable_end.await else {
            panic!("the sync point is answered once the epoch commits");
        };
        assert!(
            start >= acknowledged_end,
            "a subscription would start at {start}, before records acknowledged up to {acknowledged_end}"
        );

        cut.set(true);
        let started = runtime::now();
        let status = new_leader
            .control(ControlRequest::DurableEnd { topic_id: TOPIC_ID })
            .await
            .expect("its epoch committed: answered at once, quorum or not");
        assert!(matches!(status, ControlOk::SubscriptionStart(end) if end == start));
        assert_eq!(runtime::now(), started, "an epoch once committed is not waited for again");
    });
    sim::run(4, async {
        let (old_leader, _, new_leader) = two_replicas().await;
        publish_to(&old_leader, "acknowledged").await.expect("acknowledged");
        // The link stays cut: the new epoch cannot commit.
        fail_over(&old_leader, &new_leader).await;
        let started = runtime::now();
        let refused = new_leader
            .control(ControlRequest::DurableEnd { topic_id: TOPIC_ID })
            .await
            .expect_err("no quorum commits the new epoch");
        assert_eq!(refused.code, crate::api::Code::Unavailable, "{refused:?}");
        assert!(runtime::now() - started >= SYNC_POINT_WAIT_MAX);
    });
}

/// A follower (node 3) attached alone, which the test sends requests by hand as a leader of
/// epoch 2 would, and the records of `count` messages its leader of epoch 1 holds, as one
/// append's chunks.
async fn follower_and_records(
    count: usize,
) -> (Rc<Forwarder<SimDisk>>, Vec<crate::replication::protocol::Chunk>) {
    let (leader, _cut, _follower) = two_replicas().await;
    for index in 0..count {
        publish_to(&leader, &format!("message {index}")).await.expect("acknowledged");
    }
    let log = leader.registry.topics_by_id.borrow()[&TOPIC_ID].log.clone();
    let (chunks, _) = crate::replication::source::read(&log, Offset::ZERO, 1 << 20).await.expect("read");
    let follower = Rc::new(Forwarder::new(
        0,
        SimDisk::new(),
        Directories::new(vec![PathBuf::from("/d0")]),
        LogConfig::default(),
        Rc::new(SystemClock),
    ));
    follower.replica_context.node_id.set(Some(NodeId::new(3)));
    let attach = ControlRequest::AttachReplica {
        topic_id: TOPIC_ID,
        name: TOPIC.to_owned(),
        retention_seconds: 0,
        recovering: false,
        source: crate::ids::SourceId::FIRST,
        active: 1,
    };
    follower.control(attach).await.expect("a replica attaches");
    (follower, chunks)
}

/// The race T9 found with several appends in flight: an append sent before the leader synced
/// its follower again reaches the follower while, or after, that sync cuts its log. Stamped,
/// the one still writing does not take its commit point (which would stand past the cut: a
/// commit point beyond the durable end), and the one arriving later is refused without
/// touching the log (it would be taken at the offset the cut left, as if sent after it).
#[test]
fn an_append_sent_before_a_resync_neither_commits_past_its_cut_nor_lands_after_it() {
    use crate::ids::Epoch;
    use crate::replication::protocol::{LogAppend, LogTip, ReplicaAnswer};
    sim::run(5, async {
        let (follower, chunks) = follower_and_records(3).await;
        let end = chunks.last().expect("records").end_offset();
        let sync = |stamp| ReplicaRequest::Sync {
            topic_id: TOPIC_ID,
            leader_epoch: Epoch::new(2),
            stamp,
            logs: [LogTip::default(), LogTip::default()],
        };
        let append = |stamp| ReplicaRequest::Append {
            topic_id: TOPIC_ID,
            leader_epoch: Epoch::new(2),
            stamp,
            logs: [
                LogAppend { chunks: chunks.clone(), committed_end: end, start_offset: Offset::ZERO },
                LogAppend::default(),
            ],
        };
        let synced = follower.replica_request(sync(1)).await;
        assert_eq!(synced, Ok(ReplicaAnswer::Synced { next_offsets: [Offset::ZERO; 2] }));

        // The append's records are written when the second sync begins, its commit point not
        // yet taken; that sync's leader holds none of them (its tip is empty), so the follower
        // cuts them.
        let writing = follower.clone();
        let first = append(1);
        let written = runtime::spawn(async move { writing.replica_request(first).await });
        runtime::yield_now().await;
        let progress = follower.replica_progress(TOPIC_ID).expect("a replica");
        assert_eq!(
            (progress.durable_ends[0], progress.committed_ends[0]),
            (end.get(), 0),
            "the append's records are durable, its commit point not yet taken"
        );
        let synced = follower.replica_request(sync(2)).await;
        assert_eq!(synced, Ok(ReplicaAnswer::Synced { next_offsets: [Offset::ZERO; 2] }), "cut back to 0");
        let written = written.await;
        assert!(written.is_err(), "the append written across the sync is not answered as held: {written:?}");
        let progress = follower.replica_progress(TOPIC_ID).expect("a replica");
        assert_eq!((progress.durable_ends[0], progress.committed_ends[0]), (0, 0), "{progress:?}");

        // The same append arriving only now, after the sync: refused, the log untouched.
        let late = follower.replica_request(append(1)).await;
        assert_eq!(late, Ok(ReplicaAnswer::Stale { synced_stamp: 2 }));
        let progress = follower.replica_progress(TOPIC_ID).expect("a replica");
        assert_eq!((progress.durable_ends[0], progress.committed_ends[0]), (0, 0), "{progress:?}");
        // One sent after the sync is taken, and so is its commit point.
        let taken = follower.replica_request(append(2)).await;
        assert_eq!(taken, Ok(ReplicaAnswer::Appended { durable_ends: [end, Offset::ZERO] }));
        let progress = follower.replica_progress(TOPIC_ID).expect("a replica");
        assert_eq!((progress.durable_ends[0], progress.committed_ends[0]), (end.get(), end.get()));
        // A copy of the older sync, held back by the network, cuts nothing now.
        assert_eq!(follower.replica_request(sync(1)).await, Ok(ReplicaAnswer::Stale { synced_stamp: 2 }));
    });
}
