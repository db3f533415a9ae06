//! The router's catalog: topics, subscriptions and snapshots, as a state machine fed by a log
//! of decided entries. The log is openraft's, with this node as its single voter, stored in
//! Ringpost's own checksummed log (`store`); its snapshot is the catalog checkpoint. Every
//! change is decided once by the leader, with its ids, creation time, placement and sync point
//! inside the entry, and `CatalogState::apply` is the only way the catalog changes.
//!
//! Ids come from a counter in the replicated state (`CatalogState::next_id`): an id in a
//! committed entry is never handed out again, on this node or, later, another.

pub mod entry;
pub mod legacy;
pub mod placement;
pub mod raft;
pub mod rt;
pub mod state;
mod status;
pub mod store;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod voters_sim_tests;

pub use entry::{
    CatalogEntry, Labels, SnapshotRecord, SubscriptionRecord, SubscriptionSettings, TopicRecord,
};
pub use state::{Applied, CatalogState};

use crate::api::Status;
use crate::log::{Directories, Log};
use crate::storage::Storage;
use placement::Placement;
use raft::{CatalogMachine, CatalogRaft, NoPeers, NODE_ID};
use std::cell::{Cell, Ref, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use store::{RaftLog, SnapshotLog};

/// The catalog's raft log is compacted (snapshot, then purge) once its segments take this many
/// bytes (one copy) and four times what the state's snapshot takes: creating and deleting
/// topics otherwise grows it without bound.
pub const CATALOG_COMPACTION_BYTES_MIN: u64 = 64 << 20;
/// Bound of openraft's request and notification queues.
const CATALOG_QUEUE_CAPACITY: u64 = 1024;
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
}

/// How often a catalog leader would heartbeat its peers; with a single voter it paces only
/// openraft's ticks.
const CATALOG_HEARTBEAT_INTERVAL_MS: u64 = 1000;

fn raft_config() -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "ringpost-catalog".into(),
        // A single voter elects itself at once at start (`Catalog::open` triggers it); these
        // only matter once there are peers. openraft ticks every 13/64 of a heartbeat interval
        // and each tick reports its metrics: at 100 ms an idle router shard spent about 6% of a
        // core (debug build) on 50 ticks a second; at a second, 5 ticks.
        heartbeat_interval: CATALOG_HEARTBEAT_INTERVAL_MS,
        election_timeout_min: 3 * CATALOG_HEARTBEAT_INTERVAL_MS,
        election_timeout_max: 6 * CATALOG_HEARTBEAT_INTERVAL_MS,
        // The router decides when to snapshot (`Catalog::compact`), by bytes, as before.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        // Bounds of openraft's queues: the router proposes one entry per control-plane request
        // in flight, far fewer than openraft's defaults (65,536) provide for.
        api_channel_size: Some(CATALOG_QUEUE_CAPACITY),
        notification_channel_size: Some(CATALOG_QUEUE_CAPACITY),
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
        let imported = if has_snapshot {
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
        let importing = imported.is_some();
        let machine = CatalogMachine::new(imported.unwrap_or_default(), snapshots.clone());
        let pristine = raft_log.is_pristine();
        let raft = Raft::new(NODE_ID, raft_config(), NoPeers, raft_log.clone(), machine.clone())
            .await
            .map_err(|error| format!("starting the catalog's raft: {error}"))?;
        let catalog = Catalog { raft, machine, raft_log, snapshots, next_id: Cell::new(0) };
        catalog.become_leader(pristine).await?;
        if importing {
            // Once this snapshot is durable the old folder is never read again: a start imports
            // only a catalog that has no snapshot.
            catalog
                .machine
                .store_snapshot()
                .await
                .map_err(|error| format!("storing the imported catalog: {error}"))?;
            eprintln!(
                "ringpostd: imported the catalog ({} topics); its old folder {}/ is no longer read",
                catalog.state().topics.len(),
                legacy::LEGACY_FOLDER
            );
        }
        Ok(catalog)
    }

    async fn become_leader(&self, pristine: bool) -> Result<(), String> {
        if pristine {
            let members: BTreeSet<u64> = [NODE_ID].into();
            self.raft
                .initialize(members)
                .await
                .map_err(|error| format!("initializing the catalog: {error}"))?;
        } else {
            let _ = self.raft.trigger().elect(false).await;
        }
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
        Ok(())
    }

    pub fn state(&self) -> Ref<'_, CatalogState> {
        self.machine.state.borrow()
    }

    /// The state itself, shared: the router reads it where it borrows it.
    pub fn shared_state(&self) -> Rc<RefCell<CatalogState>> {
        self.machine.state.clone()
    }

    /// An id no entry has used, for an entry this leader is about to propose.
    pub fn allocate_id(&self) -> u64 {
        let id = self.next_id.get().max(self.state().next_id).max(1);
        self.next_id.set(id + 1);
        id
    }

    /// Decides `entry`: commits it through raft and applies it; the answer is what `apply`
    /// returned.
    pub async fn propose(&self, entry: CatalogEntry) -> Result<Applied, Status> {
        match self.raft.client_write(entry).await {
            Ok(response) => match response.data {
                Applied::Refused(status) => Err(status),
                applied => Ok(applied),
            },
            Err(error) => Err(Status::unavailable(format!("the catalog did not commit the change: {error}"))),
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
    pub async fn resync_copy(&self, index: usize) -> Result<u64, Status> {
        let mut copied = 0;
        for log in self.logs() {
            if log.is_stale(index) {
                copied += log.resync_copy(index).await.map_err(crate::api::Status::from)?;
            }
        }
        Ok(copied)
    }

    /// Snapshots the catalog and purges the raft log it covers, once the log has grown past
    /// `CATALOG_COMPACTION_BYTES_MIN` and four times the snapshot. Returns whether it did.
    pub async fn compact(&self, bytes_min: u64) -> Result<bool, String> {
        let disk_bytes = self.raft_log.log().disk_bytes();
        if disk_bytes < bytes_min || disk_bytes < 4 * self.state().encode().len() as u64 {
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

/// Places, once, the topics of a catalog written before placement was in its entries, in id
/// order as the old start did.
fn place_unplaced(state: &mut CatalogState, forwarders: u32, balance_factor: f64) {
    let mut placement = Placement::new(forwarders, balance_factor);
    let mut topics: Vec<&mut TopicRecord> = state.topics.values_mut().collect();
    topics.sort_by_key(|topic| topic.id);
    for topic in topics {
        if topic.shard == entry::SHARD_UNPLACED {
            topic.shard = placement.place(&topic.name);
        } else {
            placement.assign(topic.shard);
        }
    }
}
