//! The router's part in replicated topics (docs/REPLICATION.md). Every node's router keeps its
//! own forwarders' replicas as the catalog says (`reconcile`): attached, the elected leader
//! promoted and its subscriptions attached, a deposed leader demoted, a deleted topic's files
//! removed. The catalog's leader also runs the elections (`coordinate`, in `elections.rs`):
//! when a topic's leader is on a node it has not heard from, or a node asks (it restarted while
//! leading), it asks every replica to promise the next epoch and proposes, as leader, the most
//! up-to-date replica of a quorum that answered.

use super::elections::{self, Elections, Electorate};
use super::sources::{attach_subscription, Unit};
use super::ControlError;
use super::{Router, RECOVERY_ATTACHES_IN_FLIGHT_MAX};
use crate::api::control::Topic;
use crate::api::Status;
use crate::catalog::{Applied, CatalogEntry, TopicRecord};
use crate::control::{ControlOk, ControlRequest};
use crate::ids::{NodeId, ShardId, TopicId};
use crate::replication::quorum;
use crate::replication::source::Peer;
use crate::storage::Storage;
use crate::sync::try_for_each_concurrent;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub use super::elections::SOURCE_FAILURE_TIMEOUT;

fn now() -> Instant {
    crate::runtime::now()
}

/// How often each node compares its replicas with the catalog when nothing was applied
/// meanwhile (an applied entry makes it look at once, on its next tick).
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the router looks whether the catalog applied something to act on.
pub const RECONCILE_TICK: Duration = Duration::from_millis(100);
/// How long a creation waits for each replica to be made (the ones that are, of a quorum,
/// suffice; the rest are made when their nodes come back).
pub const REPLICA_ATTACH_WAIT: Duration = Duration::from_secs(2);
/// How often a node asks again for an election of a topic it must not lead at its epoch (and,
/// on the catalog's leader, how long after a failed election the topic's next is tried).
pub const ELECTION_ASK_INTERVAL: Duration = Duration::from_secs(1);
/// Most topics one request for elections names.
pub const ELECTIONS_ASKED_MAX: usize = 4096;
/// The most replicas a topic's creation asks for by default.
pub const REPLICAS_DEFAULT_MAX: usize = 3;

/// What a node's router knows of its own replicas beyond the catalog.
#[derive(Default)]
pub struct LocalReplicas {
    /// Replicas attached to this node's forwarders: (topic, shard).
    attached: RefCell<HashSet<(TopicId, ShardId)>>,
    /// The shard of this node leading each topic, and since which epoch.
    leading: RefCell<HashMap<TopicId, (ShardId, u64)>>,
    /// Topics this node led when it started, at that epoch: it does not lead again at that
    /// epoch (what a quorum held is not known here), and asks for an election instead.
    stale: RefCell<HashMap<TopicId, u64>>,
    /// Promotions under way.
    promoting: RefCell<HashSet<TopicId>>,
    /// Topics this node is creating: attached here, not yet in the catalog.
    creating: RefCell<HashSet<TopicId>>,
    /// On the catalog's leader: the elections it runs.
    pub(super) elections: Elections,
    /// When elections were last asked for, and the applied index at the last full pass.
    asked_at: Cell<Option<Instant>>,
    reconciled: Cell<(Option<u64>, Option<Instant>)>,
}

impl<S: Storage> Router<S> {
    /// How many replicas a new topic gets for `asked` (0: the default, the cluster's nodes,
    /// at most `REPLICAS_DEFAULT_MAX`, odd).
    pub(super) fn replica_count(&self, asked: u32) -> Result<usize, ControlError> {
        if let Some(why) = &self.replication_refused {
            if asked > 1 {
                return Err(ControlError::failed_precondition(format!("{asked} replicas: {why}")));
            }
            return Ok(1);
        }
        let nodes = self.state.borrow().nodes.len().max(self.catalog.voter_count()).max(1);
        if asked == 0 {
            let count = nodes.min(REPLICAS_DEFAULT_MAX);
            return Ok(if count.is_multiple_of(2) { count - 1 } else { count });
        }
        let asked = asked as usize;
        if asked.is_multiple_of(2) {
            return Err(ControlError::invalid_argument(format!(
                "{asked} replicas: a topic's replicas are odd in number (1, 3, 5), so that a majority of them decides"
            )));
        }
        if asked > nodes || asked > crate::catalog::entry::REPLICAS_MAX {
            return Err(ControlError::invalid_argument(format!(
                "{asked} replicas: each is on another node, and the cluster has {nodes}"
            )));
        }
        Ok(asked)
    }

    /// The addresses of a topic's replicas, as their nodes registered them.
    pub(super) fn peers(&self, replicas: &[ShardId]) -> Vec<Peer> {
        let state = self.state.borrow();
        replicas
            .iter()
            .map(|shard| {
                let address = state
                    .nodes
                    .get(&shard.node())
                    .and_then(|record| record.forwarders.get(shard.local() as usize))
                    .cloned()
                    .unwrap_or_default();
                Peer { shard: *shard, address }
            })
            .collect()
    }

    /// Creates a topic on `count` replicas, each on another node: the forwarders first in
    /// placement's order of preference, one per node. Each opens the topic as a follower;
    /// with a quorum of them open the creation is decided, the first of them its leader at
    /// epoch 1, and that one promoted before the create is answered.
    pub(super) async fn create_replicated_topic(
        &self,
        id: TopicId,
        request: &Topic,
        retention: u64,
        count: usize,
    ) -> Result<Topic, ControlError> {
        let name = request.name.as_str();
        let mut replicas: Vec<ShardId> = Vec::new();
        for shard in self.place(name) {
            let node = shard.node();
            if replicas.len() < count && !replicas.iter().any(|chosen| chosen.node() == node) {
                replicas.push(shard);
            }
        }
        if replicas.len() < count {
            return Err(ControlError::failed_precondition(format!(
                "{count} replicas need {count} nodes; {} have registered forwarders",
                replicas.len()
            )));
        }
        self.replicas.creating.borrow_mut().insert(id);
        let created = self.create_on(id, request, retention, count, replicas).await;
        self.replicas.creating.borrow_mut().remove(&id);
        created
    }

    /// `create_replicated_topic` on the replicas chosen.
    async fn create_on(
        &self,
        id: TopicId,
        request: &Topic,
        retention: u64,
        count: usize,
        replicas: Vec<ShardId>,
    ) -> Result<Topic, ControlError> {
        let name = request.name.as_str();
        let (attached, refusal) =
            self.attach_new_replicas(id, name, retention, (crate::ids::SourceId::FIRST, 1), &replicas).await;
        let detach_all = || async {
            for shard in &attached {
                let detach = ControlRequest::DetachTopic { topic_id: id, delete_data: true };
                let _ = self.call_forwarder(*shard, detach).await;
            }
        };
        if attached.len() < quorum(count) {
            detach_all().await;
            // The refusal is said with its code, as a forwarder's answer always was here.
            let why = refusal.map(|error| format!(": {}", Status::from(error))).unwrap_or_default();
            return Err(ControlError::unavailable(format!(
                "topic '{name}': only {} of {count} replicas could be made{why}",
                attached.len()
            )));
        }
        let leader = *replicas.iter().find(|shard| attached.contains(shard)).expect("a quorum attached");
        let record = TopicRecord {
            id,
            name: name.into(),
            message_retention_seconds: retention,
            shard: leader,
            created_ms: super::wall_ms(),
            labels: request.labels.clone(),
            replicas,
            epoch: 1,
        };
        let response = super::topic_message(&record, 1);
        if let Err(error) = self.propose(CatalogEntry::TopicCreated(record.clone())).await {
            if !error.is_undecided() {
                detach_all().await;
            }
            return Err(error);
        }
        // Served once promoted; if this fails, the leader's node promotes it on its own.
        if let Err(status) = self.promote(&record).await {
            crate::log_warn!(
                "ringpostd: topic '{name}': promoting its first leader: {status}; its node will try again"
            );
        }
        Ok(response)
    }

    /// Opens unit `id` (a topic's own log, or its source `source`, its topic's active count
    /// `active`) empty as a follower on each of `replicas` at once, waiting at most
    /// `REPLICA_ATTACH_WAIT` for each: the ones attached, and the last refusal.
    pub(super) async fn attach_new_replicas(
        &self,
        id: TopicId,
        name: &str,
        retention: u64,
        (source, active): (crate::ids::SourceId, u32),
        replicas: &[ShardId],
    ) -> (Vec<ShardId>, Option<ControlError>) {
        let attached: Rc<RefCell<Vec<ShardId>>> = Rc::default();
        let refusal: Rc<RefCell<Option<ControlError>>> = Rc::default();
        let attaches = replicas.iter().map(|shard| {
            let (attached, refusal) = (attached.clone(), refusal.clone());
            let attach = ControlRequest::AttachReplica {
                topic_id: id,
                name: name.to_owned(),
                retention_seconds: retention,
                recovering: false,
                source,
                active,
            };
            async move {
                // A node cut off may hold a connection open and never answer: a quorum is
                // enough, and the create's own deadline must not pass waiting for the rest.
                let answered = futures_lite::future::or(self.call_forwarder(*shard, attach), async {
                    crate::runtime::sleep(REPLICA_ATTACH_WAIT).await;
                    Err(ControlError::no_answer("its node did not answer in time"))
                })
                .await;
                match answered {
                    Ok(_) => attached.borrow_mut().push(*shard),
                    Err(status) => *refusal.borrow_mut() = Some(status),
                }
            }
        });
        crate::sync::join_all(attaches.collect()).await;
        let attached = attached.take();
        // Other nodes' routers learn of theirs from the catalog.
        for shard in attached.iter().filter(|shard| shard.node() == self.node_id()) {
            self.replicas.attached.borrow_mut().insert((id, *shard));
        }
        (attached, refusal.take())
    }

    /// Marks unit `id` as being created here (attached, not yet in the catalog), so that
    /// reconciling does not take its replicas for a deleted unit's; or no longer.
    pub(super) fn set_creating(&self, id: TopicId, creating: bool) {
        let mut units = self.replicas.creating.borrow_mut();
        if creating {
            units.insert(id);
        } else {
            units.remove(&id);
        }
    }

    /// Promotes a unit's elected leader (on whichever node: a topic's own log, or one of its
    /// later sources, as `CatalogState::unit_by_id` shows it) and attaches every subscription
    /// of its topic there, from that subscription's sync point on the source.
    pub(super) async fn promote(&self, topic: &TopicRecord) -> Result<(), ControlError> {
        self.apply_count_to_promoted(topic).await?;
        let request = ControlRequest::PromoteReplica {
            topic_id: topic.id,
            epoch: topic.epoch,
            replicas: self.peers(&topic.replicas),
        };
        self.call_forwarder(topic.shard, request).await?;
        // Again once it leads: a change this node's catalog applied meanwhile.
        self.apply_count_to_promoted(topic).await?;
        // And its topic's delivery gate, before its subscriptions attach: a moved key's
        // messages on it are held from its first delivery on, not from the next pass's.
        let (topic_id, source) = self.state.borrow().unit_of(topic.id);
        let unit = Unit { id: topic.id, source, shard: topic.shard };
        self.tell_gate(topic_id, &unit).await?;
        let subscriptions = subscriptions_served_on(&self.state.borrow(), topic);
        for attach in subscriptions {
            self.call_forwarder(topic.shard, attach).await?;
        }
        if topic.shard.node() == self.node_id() {
            self.replicas.leading.borrow_mut().insert(topic.id, (topic.shard, topic.epoch));
        }
        Ok(())
    }

    /// Tells the replica of unit `topic` about to lead (or just promoted) the active count this
    /// node's catalog gives it (`count_for_source`), when the topic has several sources: so a
    /// retiring source refuses publishes from its new leader's first on, and an active one
    /// checks its keys. Promotion applies the catalog's count, rather than every change being
    /// sent to every follower: this node applied the entry electing this leader, so every
    /// change committed before it; one committed after is sent to the leader the catalog then
    /// names, this replica (a follower keeps it, answering `Done`), and the catalog's leader
    /// repeats it every `SOURCES_PASS_INTERVAL`. Telling followers at each change would cost
    /// a request per follower per change and pass, and still miss one whose node was away.
    ///
    /// Not for a source being added (`creating`): it keeps the count before until
    /// `add_sources` tells every unit the new one, the sources losing keys first, so that no
    /// two sources take a key at once (docs/SOURCES.md, rule 2).
    async fn apply_count_to_promoted(&self, topic: &TopicRecord) -> Result<(), ControlError> {
        let (topic_id, source) = self.state.borrow().unit_of(topic.id);
        let creating = self.replicas.creating.borrow().contains(&topic.id);
        if creating || self.state.borrow().source_count(topic_id) < 2 {
            return Ok(());
        }
        let active = self.state.borrow().count_for_source(topic_id, source.get());
        let request = ControlRequest::ApplySources { topic_id: topic.id, active };
        self.call_forwarder(topic.shard, request).await.map(|_| ())
    }

    /// At start: opens this node's replicas of replicated topics as followers. Those it led
    /// are remembered as stale: it asks for an election rather than lead again at their epoch.
    pub(super) async fn recover_replicas(&self, topics: &[TopicRecord]) -> Result<(), String> {
        let node = self.node_id();
        let mut attaches = Vec::new();
        // The topics' later sources too, each a unit of its own.
        let sources: Vec<TopicRecord> = {
            let state = self.state.borrow();
            state.replicated_units().into_iter().filter(|unit| state.unit_of(unit.id).0 != unit.id).collect()
        };
        for topic in topics.iter().chain(&sources).filter(|topic| topic.replica_count() > 1) {
            for shard in topic.replicas.iter().filter(|shard| shard.node() == node) {
                attaches.push((*shard, topic));
            }
            if topic.shard.node() == node {
                self.replicas.stale.borrow_mut().insert(topic.id, topic.epoch);
            }
        }
        try_for_each_concurrent(attaches, RECOVERY_ATTACHES_IN_FLIGHT_MAX, |(shard, topic)| async move {
            let attach = self.attach_replica_request(topic);
            self.call_forwarder(shard, attach).await.map_err(|error| {
                let unit = self.state.borrow().unit_shown(topic.id);
                format!("recovering a replica of {unit}: {}", Status::from(error))
            })?;
            self.replicas.attached.borrow_mut().insert((topic.id, shard));
            Ok(())
        })
        .await
    }

    /// What opens a replica of unit `topic` (a topic's own log, or one of its later sources,
    /// knowing its number and its topic's active count) from what its folders hold.
    fn attach_replica_request(&self, topic: &TopicRecord) -> ControlRequest {
        let (source, active) = self.state.borrow().unit_source_and_active(topic.id);
        ControlRequest::AttachReplica {
            topic_id: topic.id,
            name: topic.name.to_string(),
            retention_seconds: topic.message_retention_seconds,
            recovering: true,
            source,
            active,
        }
    }

    /// Keeps this node's replicas as the catalog says: called every `RECONCILE_TICK`, it looks
    /// when the catalog applied something since, or `RECONCILE_INTERVAL` passed.
    pub async fn reconcile_replicas(self: &Rc<Self>) {
        let applied = self.catalog.applied_index();
        let now = now();
        let (last_applied, last_pass) = self.replicas.reconciled.get();
        let due = last_pass.is_none_or(|at| now.duration_since(at) >= RECONCILE_INTERVAL);
        if last_applied == applied && !due {
            return;
        }
        self.replicas.reconciled.set((applied, Some(now)));
        let node = self.node_id();
        // Every replicated unit with a replica here: topics' own logs and their later sources.
        let topics: Vec<TopicRecord> = self
            .state
            .borrow()
            .replicated_units()
            .into_iter()
            .filter(|topic| topic.replicas.iter().any(|shard| shard.node() == node))
            .collect();
        let mut stale_leads = Vec::new();
        for topic in &topics {
            for shard in topic.replicas.iter().filter(|shard| shard.node() == node) {
                if !self.replicas.attached.borrow().contains(&(topic.id, *shard)) {
                    let attach = self.attach_replica_request(topic);
                    match self.call_forwarder(*shard, attach).await {
                        Ok(_) => {
                            self.replicas.attached.borrow_mut().insert((topic.id, *shard));
                        }
                        Err(status) => {
                            crate::log_warn!("ringpostd: attaching a replica of '{}': {status}", topic.name)
                        }
                    }
                }
            }
            let leading = self.replicas.leading.borrow().get(&topic.id).copied();
            if let Some((shard, epoch)) = leading.filter(|led| *led != (topic.shard, topic.epoch)) {
                let _ = self
                    .call_forwarder(
                        shard,
                        ControlRequest::DemoteReplica { topic_id: topic.id, epoch: topic.epoch },
                    )
                    .await;
                crate::log_debug!(
                    "ringpostd: topic '{}': epoch {} began elsewhere; {} led epoch {epoch}",
                    topic.name,
                    topic.epoch,
                    shard
                );
                self.replicas.leading.borrow_mut().remove(&topic.id);
            }
            if topic.shard.node() != node || leading == Some((topic.shard, topic.epoch)) {
                continue;
            }
            if self.replicas.stale.borrow().get(&topic.id) == Some(&topic.epoch) {
                stale_leads.push(topic.id);
                continue;
            }
            if !self.replicas.promoting.borrow_mut().insert(topic.id) {
                continue;
            }
            let (router, topic) = (self.clone(), topic.clone());
            crate::runtime::spawn(async move {
                if let Err(status) = router.promote(&topic).await {
                    crate::log_warn!(
                        "ringpostd: topic '{}': leading epoch {}: {status}",
                        topic.name,
                        topic.epoch
                    );
                }
                router.replicas.promoting.borrow_mut().remove(&topic.id);
            })
            .detach();
        }
        // A topic deleted while a replica's node was away, or a replica moved off this node:
        // its files go.
        let creating = self.replicas.creating.borrow().clone();
        let mut gone: Vec<(TopicId, ShardId)> = self
            .replicas
            .attached
            .borrow()
            .iter()
            .filter(|(id, shard)| {
                let listed =
                    self.state.borrow().unit_by_id(*id).is_some_and(|topic| topic.replicas.contains(shard));
                !listed && !creating.contains(id)
            })
            .copied()
            .collect();
        // In one order whatever the set's hashing, so that a seeded simulation replays exactly.
        gone.sort_unstable();
        for (topic_id, shard) in gone {
            let _ =
                self.call_forwarder(shard, ControlRequest::DetachTopic { topic_id, delete_data: true }).await;
            self.replicas.attached.borrow_mut().remove(&(topic_id, shard));
            let mut leading = self.replicas.leading.borrow_mut();
            if leading.get(&topic_id).is_some_and(|(led, _)| *led == shard) {
                leading.remove(&topic_id);
            }
        }
        if due {
            // Leaders whose followers promised a newer epoch that no election followed.
            for local in 0..self.forwarders.len() as u32 {
                let shard = ShardId::new(node, local);
                if let Ok(ControlOk::Topics(topics)) =
                    self.call_forwarder(shard, ControlRequest::ElectionsWanted).await
                {
                    // Only where the catalog still names that shard the leader: a fenced leader
                    // whose election committed another is that leader's to sync.
                    let state = self.state.borrow();
                    let named = |id: &TopicId| state.unit_by_id(*id).is_some_and(|unit| unit.shard == shard);
                    stale_leads.extend(topics.into_iter().filter(named));
                }
            }
        }
        if !stale_leads.is_empty() {
            self.ask_for_elections(stale_leads).await;
        }
    }

    /// Asks the catalog's leader to elect new leaders for `topics` (at most once per
    /// `ELECTION_ASK_INTERVAL`).
    async fn ask_for_elections(&self, mut topics: Vec<TopicId>) {
        let now = now();
        if self.replicas.asked_at.get().is_some_and(|at| now.duration_since(at) < ELECTION_ASK_INTERVAL) {
            return;
        }
        self.replicas.asked_at.set(Some(now));
        topics.truncate(ELECTIONS_ASKED_MAX);
        if let Err(status) = self.want_elections(topics).await {
            crate::log_warn!(
                "ringpostd: asking for elections of the topics this node led before it restarted: {status}"
            );
        }
    }

    /// Elections wanted for `topics`: run here on the catalog's leader, asked of it elsewhere.
    pub async fn want_elections(&self, topics: Vec<TopicId>) -> Result<(), ControlError> {
        if self.catalog.leads() {
            self.replicas.elections.want(topics);
            return Ok(());
        }
        let leader =
            self.catalog.leader().ok_or_else(|| ControlError::unavailable("the catalog has no leader"))?;
        let peers = self.peers.as_ref().ok_or_else(|| ControlError::unavailable("this node has no peers"))?;
        Ok(peers.want_elections(leader, topics).await?)
    }

    /// On the catalog's leader: starts the elections that are due (`elections::coordinate`),
    /// and those that move leaderships off draining nodes (`drain::drain_pass`).
    pub fn coordinate(self: &Rc<Self>) {
        elections::coordinate(self);
        self.drain_pass();
    }
}

/// What a promoted leader of `unit` (a topic's own log, or one of its later sources, as
/// `CatalogState::unit_by_id` shows it) is sent so that it serves every subscription of its
/// topic, each from its sync point on that source (`SubscriptionRecord::start_on`: 0 for a
/// subscription created before the source was).
pub(super) fn subscriptions_served_on(
    state: &crate::catalog::CatalogState,
    unit: &TopicRecord,
) -> Vec<ControlRequest> {
    let (topic_id, source) = state.unit_of(unit.id);
    let served = Unit { id: unit.id, source, shard: unit.shard };
    state.subscriptions_served_by(topic_id).map(|record| attach_subscription(record, &served)).collect()
}

/// The router runs the catalog's elections on its node: it reads the catalog it applied, hears
/// the voters through raft, reaches forwarders through its links and peers, and decides through
/// the catalog, as its leader.
impl<S: Storage> Electorate for Router<S> {
    fn elections(&self) -> &Elections {
        &self.replicas.elections
    }

    fn catalog(&self) -> std::cell::Ref<'_, crate::catalog::CatalogState> {
        self.state.borrow()
    }

    fn nodes_heard_within(&self, within: Duration) -> Option<Vec<NodeId>> {
        self.catalog.voters_heard_within(within)
    }

    fn control(
        &self,
        shard: ShardId,
        request: ControlRequest,
    ) -> impl Future<Output = Result<ControlOk, ControlError>> {
        self.call_forwarder(shard, request)
    }

    fn decide(&self, entry: CatalogEntry) -> impl Future<Output = Result<Applied, ControlError>> {
        self.propose(entry)
    }
}
