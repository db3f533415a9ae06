//! A seeded simulation of a whole node: the router with its catalog (openraft's log and
//! snapshot on SimDisk) and two forwarder shards on the same SimDisk, all on one deterministic
//! executor, the router reaching its forwarders through local links (`ForwarderLink::local`).
//! The workload follows from the seed: topics and subscriptions created and deleted through
//! the router's methods (what its native handler calls), publishes, pulls, acknowledgements,
//! nacks and waits past the ack deadline through the forwarders' native handlers, after a
//! lookup at the router as a client makes it; crashes that lose, keep or tear unsynced writes;
//! restarts through the daemon's recovery (`Catalog::open`, then `Router::recover`); disk
//! faults within the budget.
//!
//! Checks: an acknowledged create survives every crash with its id and placement; an
//! acknowledged delete stays deleted; no id is handed out twice; a subscription's sync point is
//! exact (a publish begun after the create was acknowledged is delivered; none acknowledged
//! before the create began is); and the queue checker per subscription. Names are never used
//! twice, so that a message names the one topic it was published to.
//!
//! `RINGPOST_SIM_SEEDS=N` runs N seeds; `RINGPOST_SIM_SEED=S` replays seed S exactly.

use crate::api::control::{Subscription, Topic};
use crate::api::Status;
use crate::catalog::placement::BALANCE_FACTOR_DEFAULT;
use crate::catalog::{Catalog, SubscriptionSettings};
use crate::clock::SystemClock;
use crate::ids::{ShardId, TopicId};
use crate::log::{Directories, LogConfig};
use crate::net::server::{Handler, Responder};
use crate::router::{Advertise, ForwarderAddresses, ForwarderLink, Router};
use crate::runtime::{self, sim};
use crate::shard::Forwarder;
use crate::sim_checker::{Checker, Outcome};
use crate::storage::sim::{CrashMode, FaultPlan, SimDisk};
use crate::storage::Storage;
use crate::subscription::budget::STREAM_RESERVED_BYTES_SHARD_MAX;
use ringpost_wire::frame::Body;
use ringpost_wire::frame::{FrameBuffer, FrameHeader};
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::*;
use ringpost_wire::Command;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Seeds a plain `cargo test` runs.
const SEEDS_DEFAULT: u64 = 200;
/// Forwarder shards of the simulated node.
const SHARDS: u32 = 2;
/// Lives of the node per seed: each but the last ends in a crash; the last drains.
const LIVES_MAX: u64 = 4;
/// Creations and deletions per life.
const CONTROL_OPERATIONS_PER_LIFE_MAX: u64 = 6;
/// Publish requests per life, and messages in one.
const PUBLISHES_PER_LIFE_MAX: u64 = 16;
const MESSAGES_PER_PUBLISH_MAX: u64 = 4;
/// Bytes of a message beyond its name.
const MESSAGE_FILL_MAX: u64 = 500;
/// Pulls per life, and messages asked for by one.
const PULLS_PER_LIFE_MAX: u64 = 16;
const PULL_MESSAGES_MAX: u64 = 10;
/// How long a life may last before its crash, in virtual time.
const LIFE_MAX: Duration = Duration::from_millis(40);
/// Every subscription's ack deadline; the subscriber sometimes waits past it.
const ACK_DEADLINE_SECONDS: u32 = 10;
/// How often each forwarder collects acknowledged segments: the daemon's 5 s, shortened to fit
/// lives of milliseconds.
const COLLECTION_INTERVAL: Duration = Duration::from_millis(5);
/// Starts tried before a node that will not recover is a failure (a read failing on one copy
/// fails a recovery; the next start reads another).
const STARTS_MAX: usize = 20;
/// Empty pulls in a row after which the final drain takes a subscription to be empty, and the
/// pulls the drain of one subscription may take.
const DRAIN_EMPTY_PULLS: u32 = 3;
const DRAIN_PULLS_MAX: u32 = 1000;
/// The forwarders' ports, only advertised (nothing listens in a simulation).
const PORT_FIRST: u16 = 7451;

/// What the checker knows of whether a resource exists.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Known {
    Present,
    Absent,
    /// An operation on it failed or was cut short by a crash: the next start tells.
    Unknown,
}

struct TopicModel {
    known: Known,
    /// Its id and shard, once a create was acknowledged or a start found it.
    placed: Option<(TopicId, ShardId)>,
    /// Every message published to it: (when the publish began, when it was acknowledged).
    publishes: BTreeMap<Vec<u8>, (u64, Option<u64>)>,
}

struct SubscriptionModel {
    known: Known,
    topic: String,
    id: Option<u64>,
    /// When its create began, and when it was acknowledged (or found by a start after a crash
    /// cut the create short): the sync point lies between.
    began: u64,
    acknowledged: Option<u64>,
    checker: Checker,
}

/// The simulation's knowledge of the node, and the digest of everything that happened.
struct Model {
    seed: u64,
    disk: SimDisk,
    /// A logical clock: each operation's beginning and end takes the next tick.
    ticks: u64,
    topics: BTreeMap<String, TopicModel>,
    subscriptions: BTreeMap<String, SubscriptionModel>,
    /// Every id seen, with the resource that had it.
    ids: BTreeMap<u64, String>,
    next_name: u64,
    next_message: u64,
    /// Acknowledged publishes the final drains had to find, summed over subscriptions.
    must_deliver: usize,
    trace: std::collections::hash_map::DefaultHasher,
    started: Instant,
}

impl Model {
    fn new(seed: u64, disk: SimDisk) -> Model {
        Model {
            seed,
            disk,
            ticks: 0,
            topics: BTreeMap::new(),
            subscriptions: BTreeMap::new(),
            ids: BTreeMap::new(),
            next_name: 0,
            next_message: 0,
            must_deliver: 0,
            trace: std::collections::hash_map::DefaultHasher::new(),
            started: runtime::now(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.ticks += 1;
        self.ticks
    }

    /// Adds an event, at the virtual time it happened and with the disk operations so far, to
    /// the trace's digest.
    fn record(&mut self, event: &str) {
        (runtime::now() - self.started).as_micros().hash(&mut self.trace);
        self.disk.operation_count().hash(&mut self.trace);
        event.hash(&mut self.trace);
    }

    /// Adds every file's bytes to the trace's digest (at a crash, before it).
    fn record_files(&mut self, directory: &Path) {
        let mut names = self.disk.list_dir(directory).unwrap_or_default();
        names.sort();
        for name in names {
            let path = directory.join(&name);
            name.hash(&mut self.trace);
            match self.disk.file_bytes(&path) {
                // A checksum, which runs fast in a debug build where SipHash over every byte does not.
                Some(bytes) => (bytes.len(), crc32c::crc32c(&bytes)).hash(&mut self.trace),
                None => self.record_files(&path),
            }
        }
    }

    fn fresh_name(&mut self, kind: &str) -> String {
        self.next_name += 1;
        format!("{kind}-{}", self.next_name)
    }

    /// Notes that `resource` has `id`: an id is never handed to two resources.
    fn claim_id(&mut self, id: u64, resource: &str) {
        let seed = self.seed;
        let owner = self.ids.entry(id).or_insert_with(|| resource.to_owned());
        assert_eq!(owner, resource, "seed {seed}: id {id:x} handed out twice");
    }

    fn pick<'a>(rng: &mut sim::Rng, names: impl Iterator<Item = &'a String>) -> Option<String> {
        let names: Vec<&String> = names.collect();
        (!names.is_empty()).then(|| names[rng.below(names.len() as u64) as usize].clone())
    }

    fn present_topic(&self, rng: &mut sim::Rng) -> Option<String> {
        Model::pick(
            rng,
            self.topics.iter().filter(|(_, topic)| topic.known == Known::Present).map(|(name, _)| name),
        )
    }

    fn present_subscription(&self, rng: &mut sim::Rng) -> Option<String> {
        let present =
            self.subscriptions.iter().filter(|(_, subscription)| subscription.known == Known::Present);
        Model::pick(rng, present.map(|(name, _)| name))
    }

    /// Checks a delivery of `data` to `subscription` against what was published to its topic.
    fn delivered(&mut self, subscription: &str, data: &[u8]) {
        let seed = self.seed;
        let model = self.subscriptions.get_mut(subscription).expect("a subscription of the model");
        let publish = self.topics.get(&model.topic).and_then(|topic| topic.publishes.get(data));
        let Some((_, acknowledged)) = publish else {
            panic!(
                "seed {seed}: {subscription} delivered {}, never published to its topic {}",
                label(data),
                model.topic
            );
        };
        assert!(
            acknowledged.is_none_or(|acknowledged| acknowledged > model.began),
            "seed {seed}: {subscription} delivered {}, acknowledged before the subscription's create began",
            label(data)
        );
        model.checker.published.entry(data.to_vec()).or_insert(Outcome::Indeterminate);
        model.checker.delivered(seed, data);
    }
}

/// A message's name: its data up to the filler.
fn label(data: &[u8]) -> String {
    let name = data.iter().rposition(|byte| *byte == b'/').map_or(data, |end| &data[..end]);
    String::from_utf8_lossy(name).into_owned()
}

/// The node of one life: its router and forwarders.
struct Node {
    router: Rc<Router<SimDisk>>,
    forwarders: Vec<Rc<Forwarder<SimDisk>>>,
}

/// A request through a forwarder's handler, as a connection would make it; the response
/// frame, or the error's code and message.
pub(crate) async fn call<T: Body>(
    forwarder: &Forwarder<SimDisk>,
    command: Command,
    request: &T,
) -> Result<FrameBuffer, String> {
    let frame = ringpost_wire::encode_frame(command.code(), 0, 1, request);
    let header = FrameHeader::decode(&frame[..FRAME_HEADER_BYTES]).expect("a frame just encoded");
    let mut body = FrameBuffer::new();
    body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    let response = forwarder.handle(header, body, &Responder::unconnected()).await.into_contiguous();
    let header = FrameHeader::decode(&response[..FRAME_HEADER_BYTES]).expect("a response frame");
    if header.is_error() {
        Err(String::from_utf8_lossy(&response[FRAME_HEADER_BYTES..]).into_owned())
    } else {
        Ok(response)
    }
}

fn outcome<T, E: Clone + Into<Status>>(result: &Result<T, E>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(error) => {
            let status: Status = error.clone().into();
            format!("{:?}: {}", status.code, status.message)
        }
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

/// The daemon's catalog configuration with segments of kilobytes instead of a mebibyte: SimDisk
/// holds every byte of them, and copies each file at each sync.
pub(crate) fn catalog_log_config() -> LogConfig {
    LogConfig {
        segment_bytes_initial: 16 * 1024,
        segment_bytes_max: 64 * 1024,
        group_commit_bytes_max: 16 * 1024,
        ..crate::catalog::legacy::catalog_log_config()
    }
}

pub(crate) fn crash_mode(rng: &mut sim::Rng) -> CrashMode {
    match rng.below(4) {
        0 => CrashMode::DropUnsynced,
        1 => CrashMode::KeepUnsynced,
        2 => CrashMode::TearLastWrite { sectors: rng.below(8) as usize },
        _ => CrashMode::KeepEach { seed: rng.next_u64() },
    }
}

/// Starts the node as the daemon does: opens the catalog, makes the forwarders, and recovers
/// every catalogued topic and subscription onto them.
async fn start(disk: &SimDisk, paths: &[PathBuf], config: &LogConfig, life: u64, seed: u64) -> Node {
    let mut failures = Vec::new();
    for _ in 0..STARTS_MAX {
        let directories = Directories::new(paths.to_vec());
        let opened = Catalog::open_with_log_config(
            disk.clone(),
            directories.clone(),
            SHARDS,
            BALANCE_FACTOR_DEFAULT,
            catalog_log_config(),
        );
        let catalog = match opened.await {
            Ok(catalog) => catalog,
            Err(error) => {
                failures.push(error);
                sim::kill_spawned_tasks();
                continue;
            }
        };
        let forwarders: Vec<Rc<Forwarder<SimDisk>>> = (0..SHARDS)
            .map(|shard| {
                let directories = Directories::new(paths.to_vec());
                Rc::new(Forwarder::new(
                    shard,
                    disk.clone(),
                    directories,
                    config.clone(),
                    Rc::new(SystemClock),
                ))
            })
            .collect();
        let links = forwarders
            .iter()
            .map(|forwarder| {
                let forwarder = forwarder.clone();
                ForwarderLink::local(Box::new(move |request| {
                    let forwarder = forwarder.clone();
                    Box::pin(async move { forwarder.control(request).await })
                }))
            })
            .collect();
        let ports = (0..SHARDS as u16).map(|shard| PORT_FIRST + shard).collect();
        let addresses = ForwarderAddresses::new(ports, Advertise::Host("simulated".into()));
        let router = Rc::new(Router::new(
            disk.clone(),
            directories,
            catalog,
            links,
            addresses,
            BALANCE_FACTOR_DEFAULT,
        ));
        match router.recover().await {
            Ok(()) => return Node { router, forwarders },
            Err(error) => {
                failures.push(error);
                drop(router);
                sim::kill_spawned_tasks();
            }
        }
    }
    panic!("seed {seed}, life {life}: the node does not start after {STARTS_MAX} tries: {failures:?}");
}

/// After a start: every resource the model knows is as it was left, and what an interrupted
/// operation did is learned from the catalog.
fn check_recovered(node: &Node, model: &mut Model, crash: u64) {
    let seed = model.seed;
    let state = node.router.catalog_state();
    let mut claims = Vec::new();
    for (name, topic) in &mut model.topics {
        let found = state.topics.get(name.as_str()).map(|record| (record.id, record.shard));
        match (topic.known, found) {
            (Known::Present, found) => {
                assert_eq!(found, topic.placed, "seed {seed}: topic {name} after a restart (id, shard)")
            }
            (Known::Absent, found) => assert_eq!(found, None, "seed {seed}: deleted topic {name} is back"),
            (Known::Unknown, Some(placed)) => {
                assert!(
                    topic.placed.is_none_or(|before| before == placed),
                    "seed {seed}: topic {name} moved"
                );
                topic.known = Known::Present;
                topic.placed = Some(placed);
                claims.push((placed.0.get(), format!("topic/{name}")));
            }
            (Known::Unknown, None) => topic.known = Known::Absent,
        }
    }
    for (name, subscription) in &mut model.subscriptions {
        let found =
            state.subscriptions.get(name.as_str()).map(|record| (record.id, record.topic_name.to_string()));
        let expected = subscription.id.map(|id| (id, subscription.topic.clone()));
        match (subscription.known, found) {
            (Known::Present, found) => {
                assert_eq!(found, expected, "seed {seed}: subscription {name} after a restart")
            }
            (Known::Absent, found) => {
                assert_eq!(found, None, "seed {seed}: deleted subscription {name} is back")
            }
            (Known::Unknown, Some((id, topic))) => {
                assert_eq!(topic, subscription.topic, "seed {seed}: subscription {name}'s topic");
                assert!(
                    subscription.id.is_none_or(|before| before == id),
                    "seed {seed}: {name}'s id changed"
                );
                subscription.known = Known::Present;
                subscription.id = Some(id);
                subscription.acknowledged.get_or_insert(crash);
                claims.push((id, format!("subscription/{name}")));
            }
            (Known::Unknown, None) => subscription.known = Known::Absent,
        }
    }
    let names = state.topics.len() + state.subscriptions.len();
    drop(state);
    for (id, resource) in claims {
        model.claim_id(id, &resource);
    }
    let known = model.topics.values().filter(|topic| topic.known == Known::Present).count()
        + model.subscriptions.values().filter(|subscription| subscription.known == Known::Present).count();
    assert_eq!(names, known, "seed {seed}: the catalog holds resources never created");
}

/// Creates and deletes topics and subscriptions, one operation at a time, as an operator
/// would; sometimes compacts the catalog (a snapshot, then a purge of its raft log).
async fn control(router: Rc<Router<SimDisk>>, model: Rc<RefCell<Model>>, mut rng: sim::Rng) {
    for _ in 0..rng.below(CONTROL_OPERATIONS_PER_LIFE_MAX + 1) {
        // Creations first while there is little to delete, so that every life has topics and
        // subscriptions to work on.
        let (topics, subscriptions) = {
            let model = model.borrow();
            let present = |known: Known| known == Known::Present;
            (
                model.topics.values().filter(|topic| present(topic.known)).count(),
                model.subscriptions.values().filter(|subscription| present(subscription.known)).count(),
            )
        };
        let choice = match (topics, subscriptions) {
            (0, _) => 0,
            (_, 0) => 3,
            _ => rng.below(6),
        };
        match choice {
            0 | 1 => create_topic(&router, &model).await,
            2 => {
                let Some(name) = model.borrow().present_topic(&mut rng) else { continue };
                model.borrow_mut().topics.get_mut(&name).expect("a topic").known = Known::Unknown;
                let result = router.delete_topic(&name).await;
                let mut model = model.borrow_mut();
                model.record(&format!("delete {name}: {}", outcome(&result)));
                if result.is_ok() {
                    model.topics.get_mut(&name).expect("a topic").known = Known::Absent;
                }
            }
            3 | 4 => {
                let Some(topic) = model.borrow().present_topic(&mut rng) else { continue };
                create_subscription(&router, &model, topic).await;
            }
            _ => {
                let Some(name) = model.borrow().present_subscription(&mut rng) else { continue };
                model.borrow_mut().subscriptions.get_mut(&name).expect("a subscription").known =
                    Known::Unknown;
                let result = router.delete_subscription(&name).await;
                let mut model = model.borrow_mut();
                model.record(&format!("delete {name}: {}", outcome(&result)));
                if result.is_ok() {
                    model.subscriptions.get_mut(&name).expect("a subscription").known = Known::Absent;
                }
            }
        }
        if rng.chance(200_000) {
            let compacted = router.compact_catalog_now().await;
            model.borrow_mut().record(&format!("compact: {compacted:?}"));
        }
        runtime::sleep(Duration::from_micros(rng.below(1_000))).await;
    }
}

async fn create_topic(router: &Router<SimDisk>, model: &RefCell<Model>) {
    let name = model.borrow_mut().fresh_name("topic");
    let topic = TopicModel { known: Known::Unknown, placed: None, publishes: BTreeMap::new() };
    model.borrow_mut().topics.insert(name.clone(), topic);
    let result = router.create_topic(Topic { name: name.clone(), ..Default::default() }).await;
    let placed = router.catalog_state().topics.get(name.as_str()).map(|record| (record.id, record.shard));
    let mut model = model.borrow_mut();
    model.record(&format!("create {name}: {} {placed:?}", outcome(&result)));
    if result.is_ok() {
        let placed = placed
            .unwrap_or_else(|| panic!("seed {}: created topic {name} is not in the catalog", model.seed));
        assert!(
            !model.ids.contains_key(&placed.0.get()),
            "seed {}: {name} was given id {:x} again",
            model.seed,
            placed.0
        );
        model.claim_id(placed.0.get(), &format!("topic/{name}"));
        let topic = model.topics.get_mut(&name).expect("a topic");
        topic.known = Known::Present;
        topic.placed = Some(placed);
    }
}

async fn create_subscription(router: &Router<SimDisk>, model: &RefCell<Model>, topic: String) {
    let name = {
        let mut model = model.borrow_mut();
        let name = model.fresh_name("subscription");
        let began = model.tick();
        let subscription = SubscriptionModel {
            known: Known::Unknown,
            topic: topic.clone(),
            id: None,
            began,
            acknowledged: None,
            checker: Checker::default(),
        };
        model.subscriptions.insert(name.clone(), subscription);
        name
    };
    let request = Subscription {
        name: name.clone(),
        topic: topic.clone(),
        settings: SubscriptionSettings { ack_deadline_seconds: ACK_DEADLINE_SECONDS, ..Default::default() },
        detached: false,
    };
    let result = router.create_subscription(request).await;
    let record =
        router.catalog_state().subscriptions.get(name.as_str()).map(|record| (record.id, record.topic_id));
    let mut model = model.borrow_mut();
    let seed = model.seed;
    model.record(&format!("create {name} on {topic}: {} {record:?}", outcome(&result)));
    if result.is_ok() {
        let (id, topic_id) =
            record.unwrap_or_else(|| panic!("seed {seed}: created {name} is not in the catalog"));
        let topic_placed = model.topics[&topic].placed.map(|(id, _)| id);
        assert_eq!(Some(topic_id), topic_placed, "seed {seed}: {name}'s topic id");
        assert!(!model.ids.contains_key(&id), "seed {seed}: {name} was given id {id:x} again");
        model.claim_id(id, &format!("subscription/{name}"));
        let acknowledged = model.tick();
        let subscription = model.subscriptions.get_mut(&name).expect("a subscription");
        subscription.known = Known::Present;
        subscription.id = Some(id);
        subscription.acknowledged = Some(acknowledged);
    }
}

/// Looks up where a topic or subscription is served, as a client does first.
fn forwarder_of<E>(
    node: &Node,
    lookup: Result<Vec<crate::api::control::ForwarderAddress>, E>,
) -> Option<usize> {
    let shard = lookup.ok()?.first()?.shard.local() as usize;
    debug_assert!(shard < node.forwarders.len());
    Some(shard)
}

async fn publish(node: Rc<Node>, model: Rc<RefCell<Model>>, mut rng: sim::Rng, life: u64) {
    for _ in 0..rng.below(PUBLISHES_PER_LIFE_MAX + 1) {
        runtime::sleep(Duration::from_micros(rng.below(2_000))).await;
        let Some(topic) = model.borrow().present_topic(&mut rng) else { continue };
        let Some(shard) = forwarder_of(&node, node.router.lookup_topic(&topic, None, None)) else { continue };
        let (messages, began) = {
            let mut model = model.borrow_mut();
            let began = model.tick();
            let messages: Vec<PubsubMessage> = (0..rng.between(1..MESSAGES_PER_PUBLISH_MAX + 1))
                .map(|_| {
                    model.next_message += 1;
                    let mut data =
                        format!("{topic}/life-{life}/message-{}/", model.next_message).into_bytes();
                    data.resize(data.len() + rng.below(MESSAGE_FILL_MAX + 1) as usize, b'm');
                    PubsubMessage { data, ..PubsubMessage::default() }
                })
                .collect();
            let publishes = &mut model.topics.get_mut(&topic).expect("a topic").publishes;
            for message in &messages {
                publishes.insert(message.data.clone(), (began, None));
            }
            (messages, began)
        };
        let sent: Vec<Vec<u8>> = messages.iter().map(|message| message.data.clone()).collect();
        let request = PublishRequest { topic: topic.clone(), messages };
        let result = call(&node.forwarders[shard], Command::Publish, &request).await;
        let mut model = model.borrow_mut();
        model.record(&format!("publish {} to {topic} on {shard}: {:?}", sent.len(), result.as_ref().err()));
        if result.is_ok() {
            let acknowledged = model.tick();
            let publishes = &mut model.topics.get_mut(&topic).expect("a topic").publishes;
            for data in sent {
                publishes.insert(data, (began, Some(acknowledged)));
            }
        }
    }
}

/// Pulls `max_messages` from `subscription`, checking each delivery; the messages' ack ids
/// and data.
async fn pull(
    node: &Node,
    model: &RefCell<Model>,
    subscription: &str,
    max_messages: u32,
) -> Option<(usize, Vec<ReceivedMessage>)> {
    let shard = forwarder_of(node, node.router.lookup_subscription(subscription, None, None))?;
    let request = PullRequest { subscription: subscription.into(), max_messages, wait_ms: 0 };
    let response = call(&node.forwarders[shard], Command::Pull, &request).await;
    let received = match &response {
        Ok(response) => {
            ringpost_wire::decode_body::<PullResponse>(&response[FRAME_HEADER_BYTES..])
                .expect("a pull response")
                .received_messages
        }
        Err(_) => Vec::new(),
    };
    let mut model = model.borrow_mut();
    model.record(&format!(
        "pull {subscription} on {shard}: {:?} {}",
        response.as_ref().err(),
        received.len()
    ));
    for message in &received {
        model.record(&label(&message.data));
        model.delivered(subscription, &message.data);
    }
    Some((shard, received))
}

/// Acknowledges, and records as confirmed those the forwarder did not call invalid.
async fn acknowledge(
    node: &Node,
    model: &RefCell<Model>,
    subscription: &str,
    shard: usize,
    acks: Vec<(String, Vec<u8>)>,
) {
    let request = AcknowledgeRequest {
        subscription: subscription.into(),
        ack_ids: acks.iter().map(|(id, _)| id.clone()).collect(),
    };
    let result = call(&node.forwarders[shard], Command::Acknowledge, &request).await;
    let mut model = model.borrow_mut();
    model.record(&format!("acknowledge {} of {subscription}: {:?}", acks.len(), result.as_ref().err()));
    let Ok(response) = result else { return };
    let invalid: HashSet<String> = ringpost_wire::decode_body::<AckResponse>(&response[FRAME_HEADER_BYTES..])
        .expect("an acknowledgement response")
        .invalid_ack_ids
        .into_iter()
        .map(|invalid| invalid.ack_id)
        .collect();
    model.record(&format!("{} invalid", invalid.len()));
    let checker = &mut model.subscriptions.get_mut(subscription).expect("a subscription").checker;
    for (id, data) in acks {
        if !invalid.contains(&id) {
            checker.acknowledged.insert(data);
        }
    }
}

/// Pulls from a random subscription, and acknowledges, nacks or holds each message; sometimes
/// waits past the deadline.
async fn subscribe(node: Rc<Node>, model: Rc<RefCell<Model>>, mut rng: sim::Rng) {
    for _ in 0..rng.below(PULLS_PER_LIFE_MAX + 1) {
        let pause = if rng.chance(100_000) {
            Duration::from_secs(u64::from(ACK_DEADLINE_SECONDS) + 1)
        } else {
            Duration::from_micros(rng.below(3_000))
        };
        runtime::sleep(pause).await;
        let Some(subscription) = model.borrow().present_subscription(&mut rng) else { continue };
        let max_messages = rng.between(1..PULL_MESSAGES_MAX + 1) as u32;
        let Some((shard, received)) = pull(&node, &model, &subscription, max_messages).await else {
            continue;
        };
        let (mut acks, mut nacks) = (Vec::new(), Vec::new());
        for message in received {
            match rng.below(4) {
                0 | 1 => acks.push((message.ack_id, message.data)),
                2 => nacks.push(message.ack_id),
                _ => {}
            }
        }
        if !acks.is_empty() {
            acknowledge(&node, &model, &subscription, shard, acks).await;
        }
        if !nacks.is_empty() {
            let request = ModifyAckDeadlineRequest {
                subscription: subscription.clone(),
                ack_ids: nacks,
                ack_deadline_seconds: 0,
            };
            let result = call(&node.forwarders[shard], Command::ModifyAckDeadline, &request).await;
            model.borrow_mut().record(&format!("nack {subscription}: {:?}", result.err()));
        }
    }
}

/// The last life: pulls and acknowledges everything from every subscription still served,
/// then checks that none lost an acknowledged publish begun after its create was acknowledged.
async fn drain(node: &Node, model: &RefCell<Model>) {
    let seed = model.borrow().seed;
    let served: Vec<String> = model
        .borrow()
        .subscriptions
        .iter()
        .filter(|(_, subscription)| subscription.known == Known::Present)
        .filter(|(_, subscription)| model.borrow().topics[&subscription.topic].known == Known::Present)
        .map(|(name, _)| name.clone())
        .collect();
    for subscription in served {
        let mut empty = 0;
        let mut pulls = 0;
        while empty < DRAIN_EMPTY_PULLS {
            pulls += 1;
            assert!(
                pulls <= DRAIN_PULLS_MAX,
                "seed {seed}: {subscription} did not drain in {DRAIN_PULLS_MAX} pulls"
            );
            let (shard, received) = pull(node, model, &subscription, 100)
                .await
                .unwrap_or_else(|| panic!("seed {seed}: {subscription} is not served after recovery"));
            if received.is_empty() {
                empty += 1;
                runtime::sleep(Duration::from_millis(10)).await;
                continue;
            }
            empty = 0;
            let acks = received.into_iter().map(|message| (message.ack_id, message.data)).collect();
            acknowledge(node, model, &subscription, shard, acks).await;
        }
        let mut model = model.borrow_mut();
        let model = &mut *model;
        let state = model.subscriptions.get_mut(&subscription).expect("a subscription");
        let synced = state.acknowledged.expect("a subscription present is acknowledged");
        for (data, (began, acknowledged)) in &model.topics[&state.topic].publishes {
            if *began > synced && acknowledged.is_some() {
                state.checker.published.insert(data.clone(), Outcome::Acknowledged);
            }
        }
        model.must_deliver +=
            state.checker.published.values().filter(|outcome| **outcome == Outcome::Acknowledged).count();
        let lost: Vec<String> = state.checker.lost().iter().map(|data| label(data.as_bytes())).collect();
        assert!(
            lost.is_empty(),
            "seed {seed}: {subscription} never delivered acknowledged publishes: {lost:?}"
        );
    }
}

fn run_maintenance(forwarder: &Rc<Forwarder<SimDisk>>) {
    let collector = forwarder.clone();
    runtime::spawn(async move {
        loop {
            runtime::sleep(COLLECTION_INTERVAL).await;
            collector.collect_segments().await;
        }
    })
    .detach();
    let sweeper = forwarder.clone();
    runtime::spawn(async move {
        loop {
            runtime::sleep(crate::shard::LEASE_SWEEP_INTERVAL).await;
            sweeper.sweep_leases();
        }
    })
    .detach();
}

/// What one seed did: the digest of its trace, resources created, messages delivered, and
/// deliveries the final drain had to find.
fn simulate_node(seed: u64) -> (u64, usize, usize, usize) {
    let mut rng = sim::Rng::new(seed);
    let copies = [1, 3][rng.below(2) as usize];
    let paths: Vec<PathBuf> = (0..copies).map(|copy| PathBuf::from(format!("/d{copy}"))).collect();
    let disk = SimDisk::new();
    let plan = FaultPlan::draw(&mut rng, &paths);
    disk.set_fault_plan(Some(plan), rng.next_u64());
    let config = log_config(&mut rng);
    let lives = rng.between(2..LIVES_MAX + 1);
    let mut workload = rng.fork();
    sim::run(seed, async move {
        let model = Rc::new(RefCell::new(Model::new(seed, disk.clone())));
        let mut crash = 0;
        for life in 0..lives {
            let node = Rc::new(start(&disk, &paths, &config, life, seed).await);
            check_recovered(&node, &mut model.borrow_mut(), crash);
            model.borrow_mut().record(&format!("life {life} started"));
            if life + 1 == lives {
                drain(&node, &model).await;
                break;
            }
            node.forwarders.iter().for_each(run_maintenance);
            runtime::spawn(control(node.router.clone(), model.clone(), workload.fork())).detach();
            runtime::spawn(publish(node.clone(), model.clone(), workload.fork(), life)).detach();
            runtime::spawn(subscribe(node.clone(), model.clone(), workload.fork())).detach();
            runtime::sleep(Duration::from_micros(workload.below(LIFE_MAX.as_micros() as u64))).await;
            sim::kill_spawned_tasks();
            drop(node);
            let mode = crash_mode(&mut workload);
            let mut model = model.borrow_mut();
            crash = model.tick();
            model.record(&format!("crash {mode:?}"));
            for path in &paths {
                model.record_files(path);
            }
            disk.crash(mode);
        }
        let model = model.borrow();
        let delivered =
            model.subscriptions.values().map(|subscription| subscription.checker.deliveries.len()).sum();
        (model.trace.finish(), model.ids.len(), delivered, model.must_deliver)
    })
}

#[test]
fn a_whole_node_keeps_its_catalog_and_its_queues_through_crashes_and_faults() {
    let totals = RefCell::new((0, 0, 0));
    let started = std::time::Instant::now();
    sim::for_each_seed("a_whole_node_keeps_its_catalog", SEEDS_DEFAULT, |seed| {
        let (_, created, delivered, checked) = simulate_node(seed);
        let mut totals = totals.borrow_mut();
        *totals = (totals.0 + created, totals.1 + delivered, totals.2 + checked);
    });
    let (created, delivered, checked) = totals.into_inner();
    eprintln!(
        "whole-node simulation: {created} resources created, {delivered} messages delivered, \
         {checked} of them required at the final drains, in {:?}",
        started.elapsed()
    );
    assert!(
        created > 0 && delivered > 0,
        "the simulation created or delivered nothing, so it checked nothing"
    );
}

/// Each simulated shard has a response budget of its own, as each of the daemon's shards does
/// (`subscription::Environment::stream_budget`, made with its forwarder): with one shard's
/// budget taken whole, a pull from the other shard still delivers, and one from the full shard
/// delivers nothing (one budget for the thread, as the simulation's shards once shared, starved
/// both).
#[test]
fn each_simulated_shard_has_a_response_budget_of_its_own() {
    let seed = 7;
    let disk = SimDisk::new();
    let paths = vec![PathBuf::from("/d0")];
    let config = log_config(&mut sim::Rng::new(seed));
    sim::run(seed, async move {
        let node = start(&disk, &paths, &config, 0, seed).await;
        // A subscription served by each shard (placement spreads topics over both).
        let mut subscriptions: Vec<Option<String>> = vec![None; SHARDS as usize];
        for index in 0..16 {
            if subscriptions.iter().all(Option::is_some) {
                break;
            }
            let topic = format!("topic-{index}");
            node.router.create_topic(Topic { name: topic.clone(), ..Default::default() }).await.unwrap();
            let shard =
                forwarder_of(&node, node.router.lookup_topic(&topic, None, None)).expect("a placed topic");
            if subscriptions[shard].is_some() {
                continue;
            }
            let subscription = format!("subscription-{index}");
            let request = Subscription {
                name: subscription.clone(),
                topic: topic.clone(),
                settings: SubscriptionSettings {
                    ack_deadline_seconds: ACK_DEADLINE_SECONDS,
                    ..Default::default()
                },
                detached: false,
            };
            node.router.create_subscription(request).await.unwrap();
            let messages =
                (0..SHARDS).map(|_| PubsubMessage { data: b"m".to_vec(), ..Default::default() }).collect();
            call(&node.forwarders[shard], Command::Publish, &PublishRequest { topic, messages })
                .await
                .unwrap();
            subscriptions[shard] = Some(subscription);
        }
        let subscriptions: Vec<String> =
            subscriptions.into_iter().map(|name| name.expect("a subscription on each shard")).collect();
        let pulled = |shard: usize| {
            let request =
                PullRequest { subscription: subscriptions[shard].clone(), max_messages: 1, wait_ms: 0 };
            let forwarder = node.forwarders[shard].clone();
            async move {
                let response = call(&forwarder, Command::Pull, &request).await.unwrap();
                ringpost_wire::decode_body::<PullResponse>(&response[FRAME_HEADER_BYTES..])
                    .expect("a pull response")
                    .received_messages
                    .len()
            }
        };
        for full in 0..SHARDS as usize {
            let budget = &node.forwarders[full].environment.stream_budget;
            let held = budget.try_reserve(STREAM_RESERVED_BYTES_SHARD_MAX).expect("an empty budget");
            for shard in 0..SHARDS as usize {
                let expected = usize::from(shard != full);
                assert_eq!(pulled(shard).await, expected, "shard {shard} with shard {full}'s budget taken");
            }
            drop(held);
        }
    });
}

/// Two runs of a seed on one thread make the same trace: every operation, its outcome and its
/// virtual time. Anything left to chance outside the seed (a map's random order, a generator
/// seeded from the thread) makes them differ.
#[test]
fn a_whole_node_simulation_replays_its_seed_exactly() {
    for seed in [1, 60, 140] {
        assert_eq!(simulate_node(seed), simulate_node(seed), "seed {seed}");
    }
}

/// Seeds run in two processes by `a_whole_node_simulation_replays_in_another_process`: the
/// first sixteen, and the ones that once differed between processes (a map's per-process hash
/// keys, a pause measured on the real clock).
const REPLAYED_SEEDS: [u64; 19] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 32, 60, 140];
/// Set in the child process of that test, which then prints its digests instead of comparing.
const REPLAY_CHILD_VARIABLE: &str = "RINGPOST_SIM_REPLAY_CHILD";

/// A seed makes the same trace in another process: what one process draws once (hash keys,
/// a thread's generator) and what the machine's speed changes (a real clock read) differ there,
/// where two runs on one thread can agree by chance. The test runs itself as a child process
/// and compares the digests it prints with its own.
#[test]
fn a_whole_node_simulation_replays_in_another_process() {
    let digests: Vec<(u64, u64)> = REPLAYED_SEEDS.iter().map(|&seed| (seed, simulate_node(seed).0)).collect();
    if std::env::var_os(REPLAY_CHILD_VARIABLE).is_some() {
        for (seed, digest) in &digests {
            println!("replayed seed {seed} digest {digest:x}");
        }
        return;
    }
    let test = "sim_node_tests::a_whole_node_simulation_replays_in_another_process";
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(REPLAY_CHILD_VARIABLE, "1")
        .env_remove("RINGPOST_SIM_SEED")
        .env_remove("RINGPOST_SIM_SEEDS")
        .output()
        .expect("running the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child process failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let replayed: Vec<(u64, u64)> = stdout
        .lines()
        .filter_map(|line| {
            // The harness may print its "test ... " on the same line as the first digest.
            let (_, rest) = line.split_once("replayed seed ")?;
            let (seed, digest) = rest.split_once(" digest ")?;
            Some((seed.parse().ok()?, u64::from_str_radix(digest.trim(), 16).ok()?))
        })
        .collect();
    assert_eq!(replayed.len(), digests.len(), "the child printed {} digests:\n{stdout}", replayed.len());
    for ((seed, digest), (_, other)) in digests.iter().zip(&replayed) {
        assert_eq!(digest, other, "seed {seed} made another trace in another process");
    }
}
