//! The router's catalog: topics, subscriptions and snapshots, as a state machine fed by a log
//! of decided entries. The log is openraft's, with this node as its single voter, stored in
//! Ringpost's own checksummed log (`store`); its snapshot is the catalog checkpoint. Every
//! change is decided once by the leader, with its ids, creation time, placement and sync point
//! inside the entry, and `CatalogState::apply` is the only way the catalog changes.
//!
//! Ids come from a counter in the replicated state (`CatalogState::next_id`): an id in a
//! committed entry is never handed out again, on this node or, later, another.

pub mod entry;
mod error;
pub mod legacy;
pub mod peer;
pub mod placement;
pub mod raft;
pub mod routing;
pub mod rt;
pub mod schemas;
pub mod standing;
pub mod state;
mod status;
pub mod store;
mod units;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod voters_sim_tests;

pub use entry::{
    forwarder_name, global_shard, node_and_shard, CatalogEntry, Labels, NodeRecord, OidcToken, PushConfig,
    PushWrapper, SnapshotRecord, SourceBounds, SourceRecord, SubscriptionRecord, SubscriptionSettings,
    TopicRecord, PUSH_PROJECT_DEFAULT,
};
pub use error::CatalogError;
pub use state::{Applied, CatalogState};

use crate::ids::{NodeId, ShardId};
use crate::log::{Directories, Log};
use crate::storage::Storage;
use openraft::network::RaftNetworkFactory;
use placement::Placement;
use raft::{CatalogMachine, CatalogRaft, LogId, NoPeers, NODE_ID};
use std::cell::{Cell, Ref, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use store::{RaftLog, SnapshotLog};

/// The catalog's raft log is compacted (snapshot, then purge) once its segments take this many
/// bytes (one copy) and `CATALOG_COMPACTION_SNAPSHOT_FACTOR` times what the state's snapshot
/// takes: creating and deleting topics otherwise grows it without bound. The entries not
/// purged are held in memory by where their records are (`store::Held`, about 50 B each).
pub const CATALOG_COMPACTION_BYTES_MIN: u64 = 4 << 20;
/// The newest entries of the catalog's raft log are also held as their records, up to this
/// many bytes, for the reads that follow their append (applying them, sending them to the
/// followers); older ones are read back from the log.
pub const CATALOG_RECENT_ENTRIES_BYTES_MAX: usize = 256 << 10;
/// How many times the state's snapshot the raft log must take before it is compacted: each
/// compaction writes the whole state once, so with 2 the catalog writes at most about 1.5
/// times the bytes of its entries, and holds at most about twice the snapshot in entries.
pub const CATALOG_COMPACTION_SNAPSHOT_FACTOR: u64 = 2;
/// Bound of openraft's request and notification queues.
const CATALOG_QUEUE_CAPACITY: u64 = 1024;
/// How long a proposal waits to be decided before its proposer answers that the outcome is
/// unknown: longer than a failover (about 3 s), shorter than a client's patience.
pub const CATALOG_PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new leader waits to apply its log before it allocates an id (`caught_up`):
/// its first entry of its term commits within a round trip of a majority, far inside it.
pub const CATALOG_CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// How often a new leader looks for its term's first answers from a majority (`quorum_heard`).
const QUORUM_FIRST_ANSWER_POLL: Duration = Duration::from_millis(10);
/// How recently a cluster's leader must have heard from a majority of its voters to take a
/// proposal: two heartbeats, and well inside its lease.
const QUORUM_HEARD_WITHIN: Duration = Duration::from_millis(2 * CLUSTER_HEARTBEAT_INTERVAL_MS);

/// How long the start waits for the catalog to elect itself and apply its log.
const RECOVERY_WAIT: Duration = Duration::from_secs(60);

type Raft<S> = openraft::Raft<CatalogRaft, CatalogMachine<S>>;

pub struct Catalog<S: Storage> {
    raft: Raft<S>,
    machine: CatalogMachine<S>,
    raft_log: RaftLog<S>,
    snapshots: Rc<SnapshotLog<S>>,
    /// The next id this leader hands out: ids of proposals not yet applied are above the
    /// state's counter, so two creates in flight never share one.
    next_id: Cell<u64>,
    /// A catalog from before raft is being imported: stored as a snapshot once ready.
    importing: Cell<bool>,
    this_node: NodeId,
    /// The term this node last saw itself lead in, and since when (`voters_heard_within`).
    led_since: Cell<Option<(u64, rt::ShardInstant)>>,
    /// The term this voter leads and its log's last index when it first allocated an id in
    /// it (`caught_up`).
    leading_from: Cell<Option<(u64, u64)>>,
    /// When the catalog's leader last reached this node (the cluster port notes it).
    leader_contact: Rc<LeaderContact>,
    /// When this voter started.
    opened_at: rt::ShardInstant,
    /// Started with `--join`, and not a member since.
    joining: Cell<bool>,
    /// A member told this node it is no longer in the cluster's membership.
    told_removed: Cell<bool>,
    /// When this node first saw each member in the membership: a member the leader has not
    /// heard from yet counts as heard then, so a node just added is not reported unreachable.
    members_since: RefCell<BTreeMap<NodeId, rt::ShardInstant>>,
}

/// When the catalog's leader last reached this node: an AppendEntries (a heartbeat every
/// `CLUSTER_HEARTBEAT_INTERVAL_MS`) or a snapshot it took, as the cluster port answered it.
/// openraft keeps no such time on a follower, and a learner follows a leader that went silent
/// for ever: this is how a follower tells that it lost its leader (`standing`).
#[derive(Debug, Default)]
pub struct LeaderContact(Cell<Option<rt::ShardInstant>>);

impl LeaderContact {
    /// The leader reached this node now.
    pub fn heard(&self) {
        self.0.set(Some(shard_now()));
    }

    fn ago(&self) -> Option<Duration> {
        self.0.get().map(|at| shard_now() - at)
    }
}

fn shard_now() -> rt::ShardInstant {
    <rt::ShardInstant as openraft_rt::instant::Instant>::now()
}

/// The catalog's voters and which of them this node is.
#[derive(Clone, Debug)]
pub struct Voters {
    pub this_node: u64,
    pub ids: Vec<u64>,
    /// This node joins a running cluster (`--join`): it starts no catalog of its own and waits
    /// until the cluster's leader adds it (`Catalog::add_member`).
    pub joining: bool,
}

impl Voters {
    /// One node alone, as a daemon without `--cluster` runs.
    pub fn single() -> Voters {
        Voters { this_node: NODE_ID, ids: vec![NODE_ID], joining: false }
    }

    /// One voter alone, which elects itself; never a node that joins (it may know no other
    /// member's id, yet it joins a cluster of several).
    pub fn is_single(&self) -> bool {
        self.ids.len() == 1 && !self.joining
    }
}

/// How often a node waiting for the catalog's leader says so.
const CLUSTER_WAIT_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// How long a node waiting for the catalog's leader waits between attempts.
const CLUSTER_WAIT_RETRY: Duration = Duration::from_millis(200);

/// How often a catalog leader would heartbeat its peers; with a single voter it paces only
/// openraft's ticks.
const CATALOG_HEARTBEAT_INTERVAL_MS: u64 = 1000;

/// How often the leader of a cluster's catalog heartbeats its peers: a voter that hears none
/// for the leader's lease and an election timeout (6, then 3 to 6 heartbeats) starts an
/// election, so a lost leader is replaced within about 3 to 4 s, well within 10 s.
const CLUSTER_HEARTBEAT_INTERVAL_MS: u64 = 300;

/// The catalog's raft settings for `voters`: a single voter ticks once a second (it has no one
/// to heartbeat); a cluster's heartbeat is `CLUSTER_HEARTBEAT_INTERVAL_MS`.
pub(crate) fn raft_config_for(voters: &Voters) -> Arc<openraft::Config> {
    let heartbeat =
        if voters.is_single() { CATALOG_HEARTBEAT_INTERVAL_MS } else { CLUSTER_HEARTBEAT_INTERVAL_MS };
    let config = openraft::Config {
        cluster_name: "ringpost-catalog".into(),
        // A single voter elects itself at once at start (`Catalog::open` triggers it); these
        // only matter once there are peers. openraft ticks every 13/64 of a heartbeat interval
        // and each tick reports its metrics: at 100 ms an idle router shard spent about 6% of a
        // core (debug build) on 50 ticks a second; at a second, 5 ticks.
        heartbeat_interval: heartbeat,
        // A follower campaigns only once it has heard from no leader for the leader's lease
        // (openraft takes election_timeout_max) plus its election timeout: 2.7 to 3.6 s for a
        // cluster (at a heartbeat of 1 s, 9 to 12 s: a cluster took 11.5 s to fail over).
        election_timeout_min: 3 * heartbeat,
        election_timeout_max: 6 * heartbeat,
        // The router decides when to snapshot (`Catalog::compact`), by bytes, as before.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        // Bounds of openraft's queues: the router proposes one entry per control-plane request
        // in flight, far fewer than openraft's defaults (65,536) provide for.
        api_channel_size: Some(CATALOG_QUEUE_CAPACITY),
        notification_channel_size: Some(CATALOG_QUEUE_CAPACITY),
        // A cluster's voter that led when it stopped starts as a follower, not as the leader
        // of its old term (openraft's default): restored so, its read index is the first entry
        // of that term or the commit point its log last recorded (`store`: the marker rides
        // with the next append), whichever is later, so it misses entries committed after
        // that, and `ready` let the router recover from a catalog without a topic created and
        // acknowledged just before the stop (the cluster simulation, seed 0). Elected again,
        // its read index is its new term's first entry, after every committed one.
        enable_leader_restore: Some(voters.is_single()),
        ..Default::default()
    };
    Arc::new(config.validate().expect("the catalog's raft configuration is valid"))
}

impl<S: Storage> Catalog<S> {
    /// Opens the catalog: recovers its raft log and newest snapshot, imports a catalog written
    /// before it ran on raft (once), elects this node and applies every committed entry.
    /// `forwarders` and `balance_factor` place the topics of an imported catalog.
    pub async fn open(
        storage: S,
        directories: Rc<Directories>,
        forwarders: u32,
        balance_factor: f64,
    ) -> Result<Catalog<S>, String> {
        Catalog::open_with_log_config(
            storage,
            directories,
            forwarders,
            balance_factor,
            legacy::catalog_log_config(),
        )
        .await
    }

    /// `open`, with the catalog logs' configuration given: the simulation's catalogs take
    /// segments of kilobytes, since SimDisk holds (and copies at each sync) every byte of them.
    pub async fn open_with_log_config(
        storage: S,
        directories: Rc<Directories>,
        forwarders: u32,
        balance_factor: f64,
        config: crate::log::LogConfig,
    ) -> Result<Catalog<S>, String> {
        let voters = Voters::single();
        let catalog = Catalog::open_clustered(
            storage,
            directories,
            forwarders,
            balance_factor,
            config,
            &voters,
            NoPeers,
        )
        .await?;
        catalog.ready(&voters, async |_| Err("a single voter has no peers".to_owned()), &|_| {}).await?;
        Ok(catalog)
    }

    /// Opens this node's voter of a catalog whose voters are `voters`, over `network`, without
    /// waiting for a leader: the cluster port must answer the other voters before one can be
    /// elected. `ready` then waits until the catalog can be acted on.
    pub async fn open_clustered<N>(
        storage: S,
        directories: Rc<Directories>,
        forwarders: u32,
        balance_factor: f64,
        config: crate::log::LogConfig,
        voters: &Voters,
        network: N,
    ) -> Result<Catalog<S>, String>
    where
        N: RaftNetworkFactory<CatalogRaft>,
        N::Network: openraft::network::NetSnapshot<CatalogRaft, SnapshotData = Vec<u8>>,
    {
        let raft_log = RaftLog::open(storage.clone(), directories.clone(), config.clone())
            .await
            .map_err(|error| format!("opening the catalog's raft log: {error}"))?;
        let snapshots = Rc::new(
            SnapshotLog::open(storage.clone(), directories.clone(), config)
                .await
                .map_err(|error| format!("opening the catalog's snapshots: {error}"))?,
        );
        let has_snapshot = snapshots
            .read()
            .await
            .map_err(|error| format!("reading the catalog's snapshot: {error}"))?
            .is_some();
        let imported = if has_snapshot || !voters.is_single() {
            // A cluster starts from an empty catalog: a catalog from before raft belongs to a
            // single node, and is imported by starting that node alone first.
            None
        } else {
            let old = legacy::read(storage.clone(), directories.clone())
                .await
                .map_err(|error| format!("importing the catalog: {error}"))?;
            old.map(|mut state| {
                place_unplaced(&mut state, forwarders, balance_factor);
                state
            })
        };
        let machine = CatalogMachine::new(imported.clone().unwrap_or_default(), snapshots.clone());
        let pristine = raft_log.is_pristine();
        let raft =
            Raft::new(voters.this_node, raft_config_for(voters), network, raft_log.clone(), machine.clone())
                .await
                .map_err(|error| format!("starting the catalog's raft: {error}"))?;
        let catalog = Catalog {
            raft,
            machine,
            raft_log,
            snapshots,
            next_id: Cell::new(0),
            importing: Cell::new(imported.is_some()),
            this_node: NodeId::new(voters.this_node),
            led_since: Cell::new(None),
            leading_from: Cell::new(None),
            leader_contact: Rc::default(),
            opened_at: shard_now(),
            joining: Cell::new(voters.joining),
            told_removed: Cell::new(false),
            members_since: RefCell::default(),
        };
        if pristine && voters.joining {
            // Its first membership comes from the cluster's leader, with the log.
        } else if pristine {
            // Every voter of a new cluster initializes with the same members, which openraft
            // allows: they agree on the first membership entry, and the first election decides.
            let members: BTreeSet<u64> = voters.ids.iter().copied().collect();
            match catalog.raft.initialize(members).await {
                Ok(()) => {}
                Err(openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(
                    _,
                ))) => {}
                Err(error) => return Err(format!("initializing the catalog: {error}")),
            }
        } else if voters.is_single() {
            let _ = catalog.raft.trigger().elect(false).await;
        }
        Ok(catalog)
    }

    /// Waits until the catalog can be acted on: a leader is known, and this voter has applied
    /// every entry committed before it asked (the leader's read index, which `ask_leader`
    /// fetches from another node; on the leader itself, its own). A single voter elects itself
    /// and applies its log within `RECOVERY_WAIT`; a cluster waits as long as it takes a
    /// quorum to come up, saying so every `CLUSTER_WAIT_REPORT_INTERVAL` in the log and at each
    /// attempt to `report` (what a client or `/readyz` is told meanwhile).
    pub async fn ready(
        &self,
        voters: &Voters,
        ask_leader: impl AsyncFn(NodeId) -> Result<Option<LogId>, String>,
        report: &dyn Fn(&str),
    ) -> Result<(), String> {
        if voters.is_single() {
            let wait = self.raft.wait(Some(RECOVERY_WAIT));
            wait.state(openraft::ServerState::Leader, "the catalog elects its single voter")
                .await
                .map_err(|error| format!("electing the catalog's voter: {error}"))?;
            wait.metrics(
                |metrics| metrics.last_applied.map(|applied| applied.index) == metrics.last_log_index,
                "the catalog applies its log",
            )
            .await
            .map_err(|error| format!("applying the catalog's log: {error}"))?;
        } else {
            let started = crate::runtime::now();
            let mut reported = started;
            let read_index = loop {
                let answer = match self.leader() {
                    Some(leader) if leader == self.this_node => self
                        .raft
                        .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)
                        .await
                        .map(|read| Some(*read.log_id()))
                        .map_err(|error| error.to_string()),
                    Some(leader) => ask_leader(leader).await,
                    None if voters.joining => Err(format!(
                        "node {0} is not yet a member of the cluster: it waits to be added (`ringpost cluster \
                         add-node {0} ADDRESS` at a member, ADDRESS its cluster address)",
                        self.this_node
                    )),
                    None => Err("the catalog has no leader yet: it waits for a majority of its voters".to_owned()),
                };
                match answer {
                    Ok(index) => break index,
                    Err(why) => {
                        report(&why);
                        if crate::runtime::now() - reported >= CLUSTER_WAIT_REPORT_INTERVAL {
                            reported = crate::runtime::now();
                            crate::log_warn!(
                                "ringpostd: node {} waits for the catalog's leader ({:.0} s so far): {why}",
                                self.this_node,
                                (reported - started).as_secs_f64()
                            );
                        }
                        crate::runtime::sleep(CLUSTER_WAIT_RETRY).await;
                    }
                }
            };
            let index = read_index.map(|log_id| log_id.index);
            self.raft
                .wait(None)
                .metrics(
                    |metrics| metrics.last_applied.map(|applied| applied.index) >= index,
                    "the catalog applies what its leader committed",
                )
                .await
                .map_err(|error| format!("applying the catalog's log: {error}"))?;
        }
        // From now on each change of the membership is logged as it is applied.
        self.machine.log_members.set(true);
        if self.importing.replace(false) {
            // Once this snapshot is durable the old folder is never read again: a start imports
            // only a catalog that has no snapshot.
            self.machine
                .store_snapshot()
                .await
                .map_err(|error| format!("storing the imported catalog: {error}"))?;
            crate::log_info!(
                "ringpostd: imported the catalog ({} topics); its old folder {}/ is no longer read",
                self.state().topics.len(),
                legacy::LEGACY_FOLDER
            );
        }
        Ok(())
    }

    /// Refuses, before anything is appended, a proposal on a cluster's leader that has not
    /// heard from a majority of voters for `QUORUM_HEARD_WITHIN`: it would wait for a quorum
    /// that is not there. A leader new in its term has had no answers of it yet: it waits for
    /// its first ones rather than refuse, for as long as a leader that had them may go without
    /// (a removed leader hands its `cluster remove-node` to its successor the moment it leads,
    /// and a refusal there failed the removal).
    async fn quorum_heard(&self) -> Result<(), CatalogError> {
        loop {
            let refused = match self.check_quorum_heard() {
                Ok(()) => return Ok(()),
                Err(refused) => refused,
            };
            let metrics = self.raft.metrics().borrow_watched().clone();
            let new_leader = metrics.last_quorum_acked.is_none()
                && self.leading_for(&metrics, shard_now()).is_some_and(|led| led <= QUORUM_HEARD_WITHIN);
            if !new_leader {
                return Err(refused);
            }
            crate::runtime::sleep(QUORUM_FIRST_ANSWER_POLL).await;
        }
    }

    fn check_quorum_heard(&self) -> Result<(), CatalogError> {
        let voters = self.voter_count();
        if voters <= 1 {
            return Ok(());
        }
        let heard: Option<rt::ShardInstant> =
            self.raft.metrics().borrow_watched().last_quorum_acked.map(|acked| *acked);
        let since = heard.map(|acked| <rt::ShardInstant as openraft_rt::instant::Instant>::now() - acked);
        match since {
            Some(since) if since <= QUORUM_HEARD_WITHIN => Ok(()),
            since => Err(CatalogError::QuorumNotHeard { node: self.this_node, voters, since }),
        }
    }

    /// On the catalog's leader, the voters it heard from (a heartbeat or a replication
    /// answered) within `within`, itself included; None on a follower, on a leader that has
    /// led for less than `within` (it cannot tell yet who is gone), and on one that heard from
    /// fewer than a majority: it is more likely the one cut off than they all gone, and what it
    /// would start on their account (fencing rounds) could only depose leaders they reach.
    pub fn voters_heard_within(&self, within: std::time::Duration) -> Option<Vec<NodeId>> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        if metrics.current_leader != Some(self.this_node.get()) {
            return None;
        }
        let now = shard_now();
        if self.leading_for(&metrics, now).is_none_or(|leading_for| leading_for < within) {
            return None;
        }
        let heartbeats = metrics.heartbeat.as_ref()?;
        let mut heard: Vec<NodeId> = heartbeats
            .iter()
            .filter(|(_, at)| at.is_some_and(|at| now - *at <= within))
            .map(|(node, _)| NodeId::new(*node))
            .collect();
        if !heard.contains(&self.this_node) {
            heard.push(self.this_node);
        }
        // Learners are heard too (they may hold replicas), but only voters make the majority.
        let voters: BTreeSet<NodeId> =
            metrics.membership_config.membership().voter_ids().map(NodeId::new).collect();
        if heard.iter().filter(|node| voters.contains(node)).count() < voters.len() / 2 + 1 {
            return None;
        }
        Some(heard)
    }

    /// How long this node has led the catalog in its current term, from the first time it saw
    /// itself lead in it; `None` while it does not lead.
    fn leading_for(
        &self,
        metrics: &openraft::RaftMetrics<CatalogRaft>,
        now: rt::ShardInstant,
    ) -> Option<std::time::Duration> {
        if metrics.current_leader != Some(self.this_node.get()) {
            return None;
        }
        let since = self.led_since.get().filter(|(term, _)| *term == metrics.current_term).map(|(_, at)| at);
        let since = since.unwrap_or_else(|| {
            self.led_since.set(Some((metrics.current_term, now)));
            now
        });
        Some(now - since)
    }

    /// What this node observes of the catalog's group now (`standing`).
    pub fn observe(&self) -> standing::Observed {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let now = shard_now();
        let members = self.members();
        if self.joining.get() && members.contains_key(&self.this_node) {
            self.joining.set(false);
        }
        let since = {
            let mut since = self.members_since.borrow_mut();
            since.retain(|node, _| members.contains_key(node));
            for node in members.keys() {
                since.entry(*node).or_insert(now);
            }
            since.clone()
        };
        let members_heard_ago = metrics
            .heartbeat
            .as_ref()
            .map(|heartbeats| {
                heartbeats
                    .iter()
                    .map(|(node, at)| {
                        let heard =
                            at.as_ref().map(|at| **at).or_else(|| since.get(&NodeId::new(*node)).copied());
                        (NodeId::new(*node), heard.map(|at| now - at))
                    })
                    .collect()
            })
            .unwrap_or_default();
        standing::Observed {
            this_node: self.this_node,
            leader: metrics.current_leader.map(NodeId::new),
            members,
            quorum_acked_ago: metrics.last_quorum_acked.as_ref().map(|acked| now - **acked),
            leading_for: self.leading_for(&metrics, now),
            members_heard_ago,
            leader_heard_ago: self.leader_contact.ago(),
            running_for: now - self.opened_at,
            joining: self.joining.get(),
            told_removed: self.told_removed.get(),
        }
    }

    /// Where this node stands in the catalog's group now.
    pub fn standing(&self) -> standing::Standing {
        standing::standing(&self.observe())
    }

    /// The catalog's leader this node names to others: none while it cannot vouch for one
    /// (a leader cut off from its majority, a follower that no longer hears its leader).
    pub fn reported_leader(&self) -> Option<NodeId> {
        self.standing().reported_leader(self.this_node)
    }

    /// The cluster port's record of the leader's messages to this node.
    pub fn leader_contact(&self) -> Rc<LeaderContact> {
        self.leader_contact.clone()
    }

    /// A member's view of the cluster's membership leaves this node out: it was removed.
    pub fn note_removed(&self) {
        self.told_removed.set(true);
    }

    /// The voter this one knows to lead, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow_watched().current_leader.map(NodeId::new)
    }

    /// Whether this voter leads the catalog: only the leader decides changes.
    pub fn leads(&self) -> bool {
        self.leader() == Some(self.this_node)
    }

    /// How many voters the catalog has now (its latest membership, committed or not).
    pub fn voter_count(&self) -> usize {
        self.raft.metrics().borrow_watched().membership_config.membership().voter_ids().count()
    }

    /// The catalog's members now, voters and learners, each with whether it votes.
    pub fn members(&self) -> BTreeMap<NodeId, bool> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        membership.nodes().map(|(id, _)| (NodeId::new(*id), voters.contains(id))).collect()
    }

    /// On the leader: makes node `node_id` a member, as a learner that the leader brings up to
    /// date, then, if `voter`, a voter. Waits at most `catch_up_within` for it to catch up (it
    /// must be running, started with `--join`); a node already a member is left as it is, or
    /// promoted. Learner first, so that a voter never joins a quorum before it holds the log.
    pub async fn add_member(
        &self,
        node_id: NodeId,
        voter: bool,
        catch_up_within: Duration,
    ) -> Result<(), CatalogError> {
        let members = self.members();
        if !members.contains_key(&node_id) || voter && members.get(&node_id) == Some(&false) {
            let added =
                within(catch_up_within, self.raft.add_learner(node_id.get(), openraft::EmptyNode {}, true))
                    .await
                    .ok_or(CatalogError::NotCaughtUp { node_id, waited: catch_up_within })?;
            added.map_err(|error| membership_refused(node_id, error))?;
        }
        if voter && self.members().get(&node_id) != Some(&true) {
            let change = openraft::ChangeMembers::AddVoterIds(BTreeSet::from([node_id.get()]));
            within(CATALOG_PROPOSE_TIMEOUT, self.raft.change_membership(change, false))
                .await
                .ok_or_else(|| undecided_membership(node_id))?
                .map_err(|error| membership_refused(node_id, error))?;
        }
        Ok(())
    }

    /// On the leader: takes node `node_id` out of the catalog's group, voter or learner. The
    /// leader itself is not removed here: it hands its leadership to another voter first.
    pub async fn remove_member(&self, node_id: NodeId) -> Result<(), CatalogError> {
        let Some(voter) = self.members().get(&node_id).copied() else {
            return Ok(());
        };
        let ids = BTreeSet::from([node_id.get()]);
        let change = if voter {
            openraft::ChangeMembers::RemoveVoters(ids)
        } else {
            openraft::ChangeMembers::RemoveNodes(ids)
        };
        within(CATALOG_PROPOSE_TIMEOUT, self.raft.change_membership(change, false))
            .await
            .ok_or_else(|| undecided_membership(node_id))?
            .map_err(|error| membership_refused(node_id, error))?;
        Ok(())
    }

    /// The catalog's voters, the furthest in this leader's log first (ties by id). openraft
    /// ignores a handover to a voter whose log ends before the leader's, and the leader, which
    /// stopped its heartbeats for it, is replaced only by an election after the timeout: the
    /// lead goes to the one most likely holding it all.
    pub fn voters_by_progress(&self) -> Vec<NodeId> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let matched = |node: u64| {
            if node == self.this_node.get() {
                return metrics.last_log_index;
            }
            let replication = metrics.replication.as_ref()?;
            replication.get(&node)?.as_ref().map(|log_id| log_id.index())
        };
        let mut voters: Vec<(Option<u64>, u64)> =
            metrics.membership_config.membership().voter_ids().map(|node| (matched(node), node)).collect();
        voters.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        voters.into_iter().map(|(_, node)| NodeId::new(node)).collect()
    }

    /// Asks this leader to hand the catalog's leadership to voter `to`.
    pub async fn transfer_leadership(&self, to: NodeId) -> Result<(), CatalogError> {
        self.raft
            .trigger()
            .transfer_leader(to.get())
            .await
            .map_err(|error| CatalogError::TransferRefused(error.to_string()))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.this_node
    }

    /// openraft's handle, for the cluster port that answers the other voters.
    pub fn raft(&self) -> Raft<S> {
        self.raft.clone()
    }

    /// The index of the last entry this voter applied: its state machine's, which its state
    /// holds at once, not openraft's metrics, which learn it later. A leader that answered a
    /// carried change with the metrics' index let the carrying node answer its client before
    /// applying the change there (the cluster simulation, seed 1): the leader's metrics still
    /// named the entry before.
    pub fn applied_index(&self) -> Option<u64> {
        self.machine.applied_index()
    }

    /// Waits until this voter has applied entry `index` (for a write another node's leader
    /// decided, so that this node's next read sees it), at most `within`.
    pub async fn wait_applied(&self, index: u64, within: Duration) -> bool {
        self.raft
            .wait(Some(within))
            .metrics(
                |metrics| metrics.last_applied.map(|applied| applied.index) >= Some(index),
                "the catalog applies a forwarded write",
            )
            .await
            .is_ok()
    }

    /// Changes of this voter's place in the raft group (an election, a new leader, a vote),
    /// as openraft reports them: only when they change, not at each tick.
    pub fn role_changes(&self) -> RoleChanges {
        RoleChanges(self.raft.server_metrics())
    }

    pub fn state(&self) -> Ref<'_, CatalogState> {
        self.machine.state.borrow()
    }

    /// The state itself, shared: the router reads it where it borrows it.
    pub fn shared_state(&self) -> Rc<RefCell<CatalogState>> {
        self.machine.state.clone()
    }

    /// On the catalog's leader: whether it applied its log as it stood when it first asked in
    /// its term, waiting for that at most `within`. A new leader's log may hold entries of
    /// earlier terms that it commits only now, and its state's next id does not count their
    /// ids until it applies them: an id allocated before would be one of theirs (the cluster
    /// simulation, topics of several sources, seed 469, found a source's id handed out again
    /// so). True on a follower, whose proposals are refused anyway.
    pub async fn caught_up(&self, within: Duration) -> bool {
        let metrics = self.raft.metrics().borrow_watched().clone();
        if metrics.current_leader != Some(self.this_node.get()) {
            return true;
        }
        let from = self.leading_from.get().filter(|(term, _)| *term == metrics.current_term);
        let index = match from {
            Some((_, index)) => index,
            None => {
                let index = metrics.last_log_index.unwrap_or(0);
                self.leading_from.set(Some((metrics.current_term, index)));
                index
            }
        };
        self.applied_index() >= Some(index) || index == 0 || self.wait_applied(index, within).await
    }

    /// An id no entry has used, for an entry this leader is about to propose, once it has
    /// `caught_up`.
    pub fn allocate_id(&self) -> u64 {
        let id = self.next_id.get().max(self.state().next_id).max(1);
        self.next_id.set(id + 1);
        id
    }

    /// Decides `entry`: commits it through raft and applies it; the answer is what `apply`
    /// returned.
    ///
    /// A leader that lost its quorum may hold a proposal unanswered until the quorum returns
    /// (and then commit it), so the wait is bounded by `CATALOG_PROPOSE_TIMEOUT`; its refusal,
    /// `CatalogError::Undecided`, means the outcome is unknown (see `is_undecided`).
    pub async fn propose(&self, entry: CatalogEntry) -> Result<Applied, CatalogError> {
        self.quorum_heard().await?;
        let write = async { Some(self.raft.client_write(entry).await) };
        let timeout = async {
            crate::runtime::sleep(CATALOG_PROPOSE_TIMEOUT).await;
            None
        };
        match futures_lite::future::or(write, timeout).await {
            Some(Ok(response)) => match response.data {
                Applied::Refused(taken) => Err(CatalogError::NameTaken(taken)),
                applied => Ok(applied),
            },
            Some(Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(forward),
            ))) => Err(CatalogError::NotLeader { leader: forward.leader_id.map(NodeId::new) }),
            Some(Err(error)) => Err(CatalogError::NotCommitted(error.to_string())),
            None => Err(CatalogError::Undecided { waited: CATALOG_PROPOSE_TIMEOUT }),
        }
    }

    fn logs(&self) -> [&Rc<Log<S>>; 2] {
        [self.raft_log.log(), self.snapshots.log()]
    }

    /// Makes the catalog logs' reserve segments again once a roll on a full disk took them.
    pub async fn retake_reserve(&self) {
        for log in self.logs() {
            let _ = log.retake_reserve().await;
        }
    }

    /// Whether copy `index` of either catalog log is stale (missed writes while fenced).
    pub fn is_stale(&self, index: usize) -> bool {
        self.logs().iter().any(|log| log.is_stale(index))
    }

    /// Rewrites the stale copies in data directory `index`; returns the batches copied.
    pub async fn resync_copy(&self, index: usize) -> Result<u64, CatalogError> {
        let mut copied = 0;
        for log in self.logs() {
            if log.is_stale(index) {
                copied += log.resync_copy(index).await?;
            }
        }
        Ok(copied)
    }

    /// Snapshots the catalog and purges the raft log it covers, once the log has grown past
    /// `bytes_min` (`CATALOG_COMPACTION_BYTES_MIN`) and `CATALOG_COMPACTION_SNAPSHOT_FACTOR`
    /// times the snapshot. Returns whether it did.
    pub async fn compact(&self, bytes_min: u64) -> Result<bool, String> {
        let disk_bytes = self.raft_log.log().disk_bytes();
        if disk_bytes < bytes_min
            || disk_bytes < CATALOG_COMPACTION_SNAPSHOT_FACTOR * self.state().encode().len() as u64
        {
            return Ok(false);
        }
        let applied = self.raft.metrics().borrow_watched().last_applied;
        self.raft.trigger().snapshot().await.map_err(|error| error.to_string())?;
        let wait = self.raft.wait(Some(RECOVERY_WAIT));
        wait.metrics(|metrics| metrics.snapshot >= applied, "the catalog snapshots")
            .await
            .map_err(|error| error.to_string())?;
        if let Some(applied) = applied {
            self.raft.trigger().purge_log(applied.index).await.map_err(|error| error.to_string())?;
            wait.metrics(|metrics| metrics.purged >= Some(applied), "the catalog purges its log")
                .await
                .map_err(|error| error.to_string())?;
        }
        Ok(true)
    }

    /// Bytes the catalog's raft log takes on disk (one copy).
    pub fn disk_bytes(&self) -> u64 {
        self.raft_log.log().disk_bytes()
    }
}

use openraft::async_runtime::WatchReceiver;

/// `future`'s output, or None once `limit` has passed.
async fn within<T>(limit: Duration, future: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(future.await) }, async {
        crate::runtime::sleep(limit).await;
        None
    })
    .await
}

fn membership_refused(
    node_id: NodeId,
    error: openraft::error::RaftError<CatalogRaft, openraft::error::ClientWriteError<CatalogRaft>>,
) -> CatalogError {
    match error {
        openraft::error::RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(forward)) => {
            CatalogError::NotLeader { leader: forward.leader_id.map(NodeId::new) }
        }
        error => CatalogError::MembershipRefused { node_id, why: error.to_string() },
    }
}

fn undecided_membership(node_id: NodeId) -> CatalogError {
    CatalogError::MembershipUndecided { node_id, waited: CATALOG_PROPOSE_TIMEOUT }
}

/// See `Catalog::role_changes`.
pub struct RoleChanges(
    openraft::type_config::alias::WatchReceiverOf<
        CatalogRaft,
        openraft::metrics::RaftServerMetrics<CatalogRaft>,
    >,
);

impl RoleChanges {
    /// Waits for the next change; `false` once the raft has stopped (there will be none).
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

/// Places, once, the topics of a catalog written before placement was in its entries, in id
/// order as the old start did.
fn place_unplaced(state: &mut CatalogState, forwarders: u32, balance_factor: f64) {
    let mut placement = Placement::new(forwarders, balance_factor);
    let mut topics: Vec<&mut TopicRecord> = state.topics.values_mut().map(|topic| &mut **topic).collect();
    topics.sort_by_key(|topic| topic.id);
    for topic in topics {
        // A catalog from before placement is a single node's, whose shards are their numbers.
        if topic.shard == entry::SHARD_UNPLACED {
            topic.shard = ShardId::new(NodeId::new(NODE_ID), placement.place(&topic.name));
        } else {
            placement.assign(topic.shard.global());
        }
    }
}
