//! A forwarder shard, as composition: the topics and subscriptions it serves (and those it
//! quarantined), where it keeps them, what its subscriptions share, and how busy it is. Its
//! operations are in the modules beside this one: `data` (the data plane, `api::data`),
//! `control` (the router's requests), `attach`, `maintenance` (sweeps, collection, trimming)
//! and `stats`. Nothing here is shared with other shards.

pub mod attach;
pub mod control;
pub mod data;
pub mod dead_letters;
pub mod maintenance;
pub mod replica;
pub mod stats;
#[cfg(test)]
mod tests;

use crate::api::data::{DataError, ResourceKind};
use crate::api::Status;
use crate::clock::Clock;
use crate::ids::TopicId;
use crate::log::{Directories, LogConfig, TailCacheBudget};
use crate::metrics::rate::RateTicks;
use crate::storage::Storage;
use crate::subscription::state::IdHasher;
use crate::subscription::{Environment, SubscriptionEntry};
use crate::topic::open::TopicStore;
use crate::topic::TopicState;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// How often expired leases are collected when nobody pulls.
pub const LEASE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes of recently written batches all topics of one shard keep in memory for readers
/// together (each at most `LogConfig::tail_cache_bytes_max`).
pub const TAIL_CACHE_SHARD_BYTES_MAX: usize = 64 << 20;
/// How often segments every subscription has acknowledged are deleted.
pub const SEGMENT_COLLECTION_INTERVAL: Duration = Duration::from_secs(5);

/// A subscription this forwarder serves, with its topic.
pub type Served<S> = (Rc<SubscriptionEntry>, Rc<TopicState<S>>);

/// The topics and subscriptions a shard serves, by name and by id, and those it quarantined.
pub struct Registry<S: Storage> {
    pub topics: RefCell<HashMap<Rc<str>, Rc<TopicState<S>>>>,
    pub topics_by_id: RefCell<HashMap<TopicId, Rc<TopicState<S>>, IdHasher>>,
    pub subscriptions: RefCell<HashMap<Rc<str>, Served<S>, crate::runtime::NameHasher>>,
    pub quarantined: RefCell<Quarantined>,
    /// Replicas of replicated topics that follow another replica's lead, by id: not served.
    pub followers: RefCell<HashMap<TopicId, Rc<TopicState<S>>, IdHasher>>,
}

impl<S: Storage> Registry<S> {
    /// The topics served now, for a walk that awaits between them.
    pub fn topic_list(&self) -> Vec<Rc<TopicState<S>>> {
        self.topics_by_id.borrow().values().cloned().collect()
    }
}

/// How the shard attaches topics: how many journals may keep their files open, how many
/// attaches are under way, and whether a damaged topic is quarantined at start.
#[derive(Default)]
pub struct AttachPolicy {
    /// Topics on this shard whose journals keep their files open between commits; the journals
    /// of topics attached beyond it close them after each commit (and reopen on the next),
    /// which costs an open per acknowledgement commit but keeps 10,000 topics within a
    /// 20,000-descriptor limit. Set from the open-file limit by the daemon.
    pub journals_open_max: Cell<usize>,
    /// Topics whose attach is in progress: at start-up several are attached at once, and each
    /// counts toward `journals_open_max` from its start, so the budget holds however they
    /// interleave.
    pub topics_attaching: Cell<usize>,
    /// Quarantine topics whose logs cannot be recovered at start (`Config::quarantine_damaged`).
    pub quarantine_damaged: Cell<bool>,
}

/// How busy the shard is: requests handled (from clients and from the router, but for
/// stats), the sweeps since it was last busy, and the ticks its rates are sampled at.
#[derive(Default)]
pub struct Activity {
    pub requests: Cell<u64>,
    /// Gives the heap's freed memory back once the shard is quiet (`sweep_leases`).
    pub trim: crate::metrics::process::QuietTrim,
    pub rate_ticks: RefCell<RateTicks>,
}

impl Activity {
    pub fn count_request(&self) {
        self.requests.set(self.requests.get() + 1);
    }
}

pub struct Forwarder<S: Storage> {
    pub shard: u32,
    pub store: TopicStore<S>,
    pub registry: Rc<Registry<S>>,
    pub environment: Environment,
    pub attach_policy: AttachPolicy,
    pub activity: Activity,
    /// Where dead letters go: set once the daemon serves (see `dead_letters`).
    pub dead_letters: Rc<dead_letters::ShardPublisher>,
    /// Its node and how it reaches other replicas, in a cluster.
    pub replica_context: replica::ReplicaContext,
    /// Its push subscriptions' tasks (`push::task`).
    pub pushing: crate::push::ShardPushing,
}

/// Topics left unserved at start because their logs could not be recovered, and their
/// subscriptions: requests naming them are answered with `DataLoss` and the reason, and their
/// files are left as they are until the topic is deleted.
#[derive(Default)]
pub struct Quarantined {
    /// By id: the topic's name and why it is quarantined.
    pub topics: HashMap<TopicId, (Rc<str>, Rc<str>), IdHasher>,
    pub topic_names: HashMap<Rc<str>, Rc<str>>,
    /// By name: the subscription's topic id and the topic's reason.
    pub subscriptions: HashMap<Rc<str>, (TopicId, Rc<str>)>,
}

/// A request naming a quarantined topic (or one of its subscriptions).
pub fn quarantined(kind: ResourceKind, name: &str, why: &Rc<str>) -> DataError {
    DataError::Quarantined { kind, name: name.into(), why: why.clone() }
}

/// `quarantined`, for the router's requests, which answer with a `Status`; `kind` is "topic"
/// or "subscription", as those requests name it.
pub fn quarantined_status(kind: &str, name: &str, why: &str) -> Status {
    debug_assert!(kind == "topic" || kind == "subscription", "{kind}");
    let kind = if kind == "topic" { ResourceKind::Topic } else { ResourceKind::Subscription };
    Status::from(quarantined(kind, name, &Rc::from(why)))
}

fn not_owner(kind: ResourceKind, name: &str) -> DataError {
    DataError::NotOwner { kind, name: name.into() }
}

impl<S: Storage> Forwarder<S> {
    pub fn new(
        shard: u32,
        storage: S,
        directories: Rc<Directories>,
        mut log_config: LogConfig,
        clock: Rc<dyn Clock>,
    ) -> Forwarder<S> {
        if log_config.tail_cache_budget.is_none() {
            log_config.tail_cache_budget = Some(TailCacheBudget::new(TAIL_CACHE_SHARD_BYTES_MAX));
        }
        let registry: Rc<Registry<S>> = Rc::new(Registry {
            topics: RefCell::default(),
            topics_by_id: RefCell::default(),
            subscriptions: RefCell::default(),
            quarantined: RefCell::default(),
            followers: RefCell::default(),
        });
        let releasing = Rc::new(Cell::new(false));
        let release_space = {
            let (registry, directories) = (registry.clone(), directories.clone());
            Box::new(move || maintenance::release_kept_files(&registry, &directories, &releasing))
        };
        let dead_letters = Rc::new(dead_letters::ShardPublisher::default());
        let attach_policy = AttachPolicy::default();
        attach_policy.journals_open_max.set(usize::MAX);
        Forwarder {
            shard,
            store: TopicStore::new(storage, directories, log_config),
            registry,
            environment: Environment {
                clock,
                stop: crate::sync::Stop::default(),
                dead_letters: dead_letters.clone(),
                next_stream: Cell::new(1),
                stream_budget: crate::subscription::budget::StreamBudget::new(),
                release_space,
            },
            attach_policy,
            activity: Activity::default(),
            dead_letters,
            replica_context: replica::ReplicaContext::default(),
            pushing: crate::push::ShardPushing::default(),
        }
    }

    /// The order that stops this shard: the native server stops accepting and reading on it,
    /// and the forwarder's streams and waiting pulls end (`wake_for_stop`).
    pub fn stop_handle(&self) -> crate::sync::Stop {
        self.environment.stop.clone()
    }

    /// Once the stop order is given, wakes every pull waiting on a subscription, so that it
    /// answers at once instead of at the end of its wait. Streams wake as their connections
    /// stop being read.
    pub async fn wake_for_stop(&self) {
        self.environment.stop.given().await;
        for (subscription, _) in self.registry.subscriptions.borrow().values() {
            subscription.changed.notify_all();
        }
    }

    pub fn set_journals_open_max(&self, journals: usize) {
        self.attach_policy.journals_open_max.set(journals);
    }

    pub fn set_quarantine_damaged(&self, quarantine: bool) {
        self.attach_policy.quarantine_damaged.set(quarantine);
    }

    /// Out of disk space: see `maintenance::release_kept_files`.
    pub fn release_kept_files(&self) {
        (self.environment.release_space)();
    }

    /// A topic and one of its subscriptions, both attached here.
    pub fn attached(
        &self,
        topic_id: TopicId,
        subscription_id: u64,
    ) -> Result<(Rc<TopicState<S>>, Rc<SubscriptionEntry>), Status> {
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
        let topic = topic.ok_or_else(|| match self.registry.quarantined.borrow().topics.get(&topic_id) {
            Some((name, why)) => quarantined_status("topic", name, why),
            None => Status::internal(format!("topic {topic_id:x} is not attached")),
        })?;
        let entry = topic
            .subscriptions
            .borrow()
            .iter()
            .find(|entry| entry.id == crate::ids::SubscriptionId::new(subscription_id))
            .cloned();
        let entry = entry.ok_or_else(|| Status::internal("the subscription is not attached"))?;
        Ok((topic, entry))
    }

    pub fn topic(&self, name: &str) -> Result<Rc<TopicState<S>>, DataError> {
        self.registry.topics.borrow().get(name).cloned().ok_or_else(|| {
            match self.registry.quarantined.borrow().topic_names.get(name) {
                Some(why) => quarantined(ResourceKind::Topic, name, why),
                None => not_owner(ResourceKind::Topic, name),
            }
        })
    }

    pub fn subscription(&self, name: &str) -> Result<Served<S>, DataError> {
        self.registry.subscriptions.borrow().get(name).cloned().ok_or_else(|| {
            match self.registry.quarantined.borrow().subscriptions.get(name) {
                Some((_, why)) => quarantined(ResourceKind::Subscription, name, why),
                None => not_owner(ResourceKind::Subscription, name),
            }
        })
    }
}
