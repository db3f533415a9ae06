//! The catalog's openraft group with three voters, each with its own SimDisk, on one seeded
//! executor over a simulated network that delays every message and can cut a node off: the
//! first step of the cluster's control plane (docs/REPLICATION.md). Writes go to whichever
//! node leads; the leader is cut off mid-run and another takes over; after healing, every
//! voter has applied the same catalog, holding every write that was acknowledged.

use super::raft::{CatalogMachine, CatalogRaft, Snapshot, Vote};
use super::store::{RaftLog, SnapshotLog};
use super::tests::topic as topic_on;
use super::*;
use crate::log::tests::directories;
use crate::runtime::sim;
use crate::sim_node_tests::catalog_log_config;
use crate::storage::sim::{CrashMode, SimDisk};
use openraft::error::{RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const VOTERS: [u64; 3] = [1, 2, 3];
/// Writes before the leader is cut off, and after.
const WRITES_EACH_HALF: u64 = 6;
/// One way of a message: up to this much, drawn by the seed.
const DELAY_MAX_US: u64 = 5_000;
/// How long a writer waits before trying again when no leader takes its write.
const RETRY_WAIT: Duration = Duration::from_millis(200);
/// Bounds every wait of the test in virtual time: several election timeouts (0.9-1.8 s).
const SETTLE_WITHIN: Duration = Duration::from_secs(120);

type Raft = openraft::Raft<CatalogRaft, CatalogMachine<SimDisk>>;

/// The simulated network: every voter's raft by id, the nodes cut off, and the seed's delays.
#[derive(Default)]
struct Network {
    rafts: BTreeMap<u64, Raft>,
    isolated: BTreeSet<u64>,
    rng: Option<sim::Rng>,
    /// Each message is lost with this chance, in parts per million.
    loss_ppm: u32,
}

#[derive(Clone)]
struct SimNetwork {
    network: Rc<RefCell<Network>>,
    from: u64,
    to: u64,
}

impl SimNetwork {
    /// Whether this message is lost: a node at either end is cut off, or the seed drops it.
    fn cut(&self) -> bool {
        let mut network = self.network.borrow_mut();
        let loss = network.loss_ppm;
        let dropped = network.rng.as_mut().expect("seeded").chance(loss);
        dropped || network.isolated.contains(&self.from) || network.isolated.contains(&self.to)
    }

    async fn one_way(&self) {
        let delay = self.network.borrow_mut().rng.as_mut().expect("seeded").below(DELAY_MAX_US);
        crate::runtime::sleep(Duration::from_micros(delay)).await;
    }

    /// The target's raft once the request crossed, or why it did not.
    async fn reach(&self) -> Result<Raft, Unreachable<CatalogRaft>> {
        self.one_way().await;
        if self.cut() {
            return Err(unreachable("cut off"));
        }
        self.network.borrow().rafts.get(&self.to).cloned().ok_or_else(|| unreachable("not started"))
    }

    /// The answer, once it crossed back (lost if a cut came meanwhile).
    async fn answer<T>(&self, answer: T) -> Result<T, Unreachable<CatalogRaft>> {
        self.one_way().await;
        if self.cut() {
            return Err(unreachable("cut off"));
        }
        Ok(answer)
    }
}

fn unreachable(why: &str) -> Unreachable<CatalogRaft> {
    Unreachable::new(&std::io::Error::other(why.to_owned()))
}

struct Factory {
    network: Rc<RefCell<Network>>,
    from: u64,
}

impl RaftNetworkFactory<CatalogRaft> for Factory {
    type Network = SimNetwork;
    async fn new_client(&mut self, target: u64, _node: &openraft::EmptyNode) -> SimNetwork {
        SimNetwork { network: self.network.clone(), from: self.from, to: target }
    }
}

impl RaftNetworkV2<CatalogRaft> for SimNetwork {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<CatalogRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        let raft = self.reach().await.map_err(RPCError::Unreachable)?;
        let answer =
            raft.append_entries(request).await.map_err(|_| RPCError::Unreachable(unreachable("stopped")))?;
        self.answer(answer).await.map_err(RPCError::Unreachable)
    }

    async fn vote(
        &mut self,
        request: VoteRequest<CatalogRaft>,
        _option: RPCOption,
    ) -> Result<VoteResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        let raft = self.reach().await.map_err(RPCError::Unreachable)?;
        let answer = raft.vote(request).await.map_err(|_| RPCError::Unreachable(unreachable("stopped")))?;
        self.answer(answer).await.map_err(RPCError::Unreachable)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<CatalogRaft>, StreamingError<CatalogRaft>> {
        let raft = self.reach().await.map_err(StreamingError::Unreachable)?;
        let answer = raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|_| StreamingError::Unreachable(unreachable("stopped")))?;
        self.answer(answer).await.map_err(StreamingError::Unreachable)
    }
}

fn topic(id: u64) -> CatalogEntry {
    topic_on(id, 0)
}

/// Starts (or restarts) voter `id` on its disk.
async fn voter(id: u64, disk: &SimDisk, network: &Rc<RefCell<Network>>) -> (Raft, CatalogMachine<SimDisk>) {
    let dirs = directories(1);
    let raft_log = RaftLog::open(disk.clone(), dirs.clone(), catalog_log_config()).await.unwrap();
    let snapshots = Rc::new(SnapshotLog::open(disk.clone(), dirs, catalog_log_config()).await.unwrap());
    let machine = CatalogMachine::new(CatalogState::default(), snapshots);
    let factory = Factory { network: network.clone(), from: id };
    let raft = Raft::new(
        id,
        raft_config_for(&Voters { this_node: id, ids: VOTERS.to_vec(), joining: false }),
        factory,
        raft_log,
        machine.clone(),
    )
    .await
    .unwrap();
    network.borrow_mut().rafts.insert(id, raft.clone());
    (raft, machine)
}

/// Writes `entry` through whichever voter leads (not `avoid`), retrying until one takes it.
async fn write(rafts: &BTreeMap<u64, Raft>, avoid: Option<u64>, entry: CatalogEntry) {
    let started = crate::runtime::now();
    loop {
        assert!(crate::runtime::now() - started < SETTLE_WITHIN, "no leader took a write");
        for (id, raft) in rafts {
            if Some(*id) == avoid {
                continue;
            }
            if raft.client_write(entry.clone()).await.is_ok() {
                return;
            }
        }
        crate::runtime::sleep(RETRY_WAIT).await;
    }
}

async fn leader_of(rafts: &BTreeMap<u64, Raft>, among: impl Fn(u64) -> bool) -> u64 {
    let started = crate::runtime::now();
    loop {
        assert!(crate::runtime::now() - started < SETTLE_WITHIN, "no leader was elected");
        // As the voters in `among` see it: a leader cut off may still believe it leads.
        for (id, raft) in rafts {
            if !among(*id) {
                continue;
            }
            if let Some(leader) = raft.current_leader().await.filter(|leader| among(*leader)) {
                return leader;
            }
        }
        crate::runtime::sleep(RETRY_WAIT).await;
    }
}

#[test]
fn three_voters_elect_fail_over_and_apply_the_same_catalog() {
    sim::for_each_seed("three_voters_elect_fail_over_and_apply_the_same_catalog", 8, |seed| {
        sim::run(seed, async move {
            let network =
                Rc::new(RefCell::new(Network { rng: Some(sim::Rng::new(seed)), ..Default::default() }));
            let mut rafts = BTreeMap::new();
            let mut machines = Vec::new();
            for id in VOTERS {
                let (raft, machine) = voter(id, &SimDisk::new(), &network).await;
                rafts.insert(id, raft);
                machines.push(machine);
            }
            rafts[&1].initialize(BTreeSet::from(VOTERS)).await.unwrap();
            for id in 1..=WRITES_EACH_HALF {
                write(&rafts, None, topic(id)).await;
            }
            let first = leader_of(&rafts, |_| true).await;
            network.borrow_mut().isolated.insert(first);
            // The other two elect one of them and take writes without the old leader.
            let second = leader_of(&rafts, |id| id != first).await;
            assert_ne!(first, second);
            for id in WRITES_EACH_HALF + 1..=2 * WRITES_EACH_HALF {
                write(&rafts, Some(first), topic(id)).await;
            }
            // Cut off, the old leader applied none of them: they need a quorum it is not in.
            let cut_off = machines[(first - 1) as usize].state.borrow().topics.len();
            assert!(cut_off <= WRITES_EACH_HALF as usize, "the cut-off voter applied {cut_off} topics");
            network.borrow_mut().isolated.clear();
            // Every voter applies every acknowledged write, the one cut off included.
            let started = crate::runtime::now();
            loop {
                let counts: Vec<usize> =
                    machines.iter().map(|machine| machine.state.borrow().topics.len()).collect();
                if counts.iter().all(|&count| count == 2 * WRITES_EACH_HALF as usize) {
                    break;
                }
                assert!(
                    crate::runtime::now() - started < SETTLE_WITHIN,
                    "the voters did not converge: {counts:?}"
                );
                crate::runtime::sleep(RETRY_WAIT).await;
            }
            let state = machines[0].state.borrow().clone();
            for machine in &machines[1..] {
                assert_eq!(*machine.state.borrow(), state, "two voters applied different catalogs");
            }
            for raft in rafts.values() {
                raft.shutdown().await.unwrap();
            }
        })
    });
}

/// How long one write may wait for its answer: a leader cut off without knowing it never
/// answers, and the write is then unknown (it may still commit), as a client's timeout.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Steps of the nemesis run.
const NEMESIS_STEPS: usize = 60;

/// One write through any voter, within `WRITE_TIMEOUT` for each: whether one acknowledged it.
async fn try_write(rafts: &BTreeMap<u64, Raft>, entry: &CatalogEntry) -> bool {
    for raft in rafts.values() {
        let write = async { raft.client_write(entry.clone()).await.is_ok() };
        let timeout = async {
            crate::runtime::sleep(WRITE_TIMEOUT).await;
            false
        };
        if futures_lite::future::or(write, timeout).await {
            return true;
        }
    }
    false
}

/// Writes, cut-offs, lost messages and crashes of one voter at a time (its unsynced writes
/// dropped, kept or torn) with restarts, at the seed's choice; then everything healed and
/// restarted: every voter applies the same catalog, and it holds every acknowledged write.
#[test]
fn voters_under_cut_offs_losses_and_crashes_keep_every_acknowledged_write() {
    sim::for_each_seed("voters_under_cut_offs_losses_and_crashes_keep_every_acknowledged_write", 8, |seed| {
        sim::run(seed, async move {
            let mut rng = sim::Rng::new(seed ^ 0x5EED);
            let network =
                Rc::new(RefCell::new(Network { rng: Some(sim::Rng::new(seed)), ..Default::default() }));
            let disks: BTreeMap<u64, SimDisk> = VOTERS.iter().map(|&id| (id, SimDisk::new())).collect();
            let mut rafts = BTreeMap::new();
            let mut machines = BTreeMap::new();
            for id in VOTERS {
                let (raft, machine) = voter(id, &disks[&id], &network).await;
                rafts.insert(id, raft);
                machines.insert(id, machine);
            }
            rafts[&1].initialize(BTreeSet::from(VOTERS)).await.unwrap();
            let mut acknowledged = BTreeSet::new();
            let mut next_id = 1;
            for _ in 0..NEMESIS_STEPS {
                // Time for elections and replication between the steps (half a second on average).
                crate::runtime::sleep(Duration::from_millis(rng.below(1000))).await;
                match rng.below(10) {
                    0..=5 => {
                        let id = next_id;
                        next_id += 1;
                        if try_write(&rafts, &topic(id)).await {
                            acknowledged.insert(format!("topic-{id}"));
                        }
                    }
                    // One voter at most is cut off or down at a time: the fault budget.
                    6 => {
                        let mut network = network.borrow_mut();
                        network.isolated.clear();
                        network.isolated.insert(VOTERS[rng.below(3) as usize]);
                    }
                    7 => {
                        let mut network = network.borrow_mut();
                        network.isolated.clear();
                        network.loss_ppm = [0, 20_000, 100_000][rng.below(3) as usize];
                    }
                    _ => {
                        network.borrow_mut().isolated.clear();
                        let id = VOTERS[rng.below(3) as usize];
                        let raft = rafts.remove(&id).unwrap();
                        network.borrow_mut().rafts.remove(&id);
                        raft.shutdown().await.unwrap();
                        drop(raft);
                        let mode = match rng.below(3) {
                            0 => CrashMode::DropUnsynced,
                            1 => CrashMode::KeepUnsynced,
                            _ => CrashMode::TearLastWrite { sectors: 1 },
                        };
                        disks[&id].crash(mode);
                        let (raft, machine) = voter(id, &disks[&id], &network).await;
                        rafts.insert(id, raft);
                        machines.insert(id, machine);
                    }
                }
            }
            {
                let mut network = network.borrow_mut();
                network.isolated.clear();
                network.loss_ppm = 0;
            }
            // A last write makes the leader commit (and the others learn) everything before it.
            let last = next_id;
            write(&rafts, None, topic(last)).await;
            acknowledged.insert(format!("topic-{last}"));
            let started = crate::runtime::now();
            loop {
                let states: Vec<CatalogState> =
                    machines.values().map(|machine| machine.state.borrow().clone()).collect();
                if states.windows(2).all(|pair| pair[0] == pair[1])
                    && states[0].topics.contains_key(format!("topic-{last}").as_str())
                {
                    let missing: Vec<&String> = acknowledged
                        .iter()
                        .filter(|name| !states[0].topics.contains_key(name.as_str()))
                        .collect();
                    assert!(missing.is_empty(), "acknowledged writes lost: {missing:?}");
                    break;
                }
                assert!(crate::runtime::now() - started < SETTLE_WITHIN, "the voters did not converge");
                crate::runtime::sleep(RETRY_WAIT).await;
            }
            assert!(acknowledged.len() > 1, "no write was acknowledged under the faults");
            println!("seed {seed}: {} of {} writes acknowledged", acknowledged.len(), next_id);
            for raft in rafts.values() {
                raft.shutdown().await.unwrap();
            }
        })
    });
}
