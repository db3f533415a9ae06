//! A replicated source's data path on one replica (docs/REPLICATION.md): the leader sends each
//! follower what its two logs hold durably and commits what a quorum holds; a follower cuts
//! what disagrees with its leader, takes the records, and answers what is durable; a fencing
//! round's promise; and the reads a new leader makes of a journal it lacks. It knows logs,
//! epochs and a `Transport` to the other replicas, not topics or the wire.

use super::feed::{Action, Feed, Outcome, Wake};
use super::protocol::{
    Chunk, FencedLog, HeldSlice, LogAppend, LogTip, RecordBytes, ReplicaAnswer, ReplicaRequest, JOURNAL,
    LOGS, MESSAGES,
};
use super::{divergence, quorum, CommitTracker};
use crate::api::Status;
use crate::ids::{Epoch, Offset, ShardId, TopicId};
use crate::log::{HeldBatch, Log, LogError, Records};
use crate::storage::Storage;
use crate::sync::Notify;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

/// Bytes of records one append to a follower carries of each log, beyond its first batch.
pub const APPEND_BYTES_MAX: usize = 4 << 20;
/// Bytes of records one append carries in all: a journal batch that would pass it with the
/// messages' waits for the next append. Under the frame's limit, with room for the framing.
pub const APPEND_REQUEST_BYTES_MAX: usize = 14 << 20;
/// How long a publish or an acknowledgement durable on its leader waits for a quorum of
/// replicas before it is answered `Unavailable` (it may still commit later).
pub const COMMIT_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long a new leader asked for a subscription's sync point (`wait_epoch_committed`) waits
/// for its first record of its epoch to commit before the create is answered `Unavailable` (the
/// client retries). A healthy quorum commits it within milliseconds of the election; shorter
/// than `COMMIT_WAIT_MAX` because the waiting create holds its name and a creation slot.
pub const SYNC_POINT_WAIT_MAX: Duration = Duration::from_secs(5);
/// The first and the longest pause before a leader tries a follower again after a failure.
pub const RETRY_PAUSE_MIN: Duration = Duration::from_millis(20);
pub const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// How long a follower that waits for nothing to send goes before the leader tells it the
/// commit point and its start again, even when nothing new is durable.
pub const IDLE_APPEND_INTERVAL: Duration = Duration::from_secs(1);
/// Appends a leader has in flight to one follower (while a backlog of
/// `APPEND_PIPELINE_RECORDS_MIN` waits): the next goes while the follower writes the one
/// before. Safe because each carries the stamp of the sync it follows and the follower refuses
/// one sent before its latest sync: else an append of a window dropped by a failure could reach
/// the follower while the sync that followed cuts its log (T9 found a commit point past the
/// durable end so). Four keep a follower's disk busy across a round trip without letting one
/// failure waste more than four appends' reads; a follower that cannot read stamps gets one.
pub const APPENDS_IN_FLIGHT: usize = 4;
/// Records waiting to be sent that make an append go while another is in flight; fewer wait
/// for its answer and go together.
pub const APPEND_PIPELINE_RECORDS_MIN: u64 = 1024;

/// How long a leader's word holds: it delivers messages only while, within this, a quorum of
/// replicas (itself included) answered a request sent to them, so that a leader deposed
/// without knowing it (cut off from the catalog, still reachable by subscribers) stops
/// delivering before its successor starts (`LEASE_WAIT` after its election's fencing round).
/// Otherwise a message whose acknowledgement the new leader confirmed could be delivered
/// again by the old one. Only deliveries wait on it: publishes and acknowledgements need a
/// quorum anyway, and no record's safety depends on any clock.
pub const LEADER_LEASE: Duration = Duration::from_secs(1);
/// How long a new leader waits after its fencing round before it delivers: the old leader's
/// lease, with a quarter more for two clocks' rates.
pub const LEASE_WAIT: Duration = Duration::from_millis(1_250);
/// How soon a delivery that found the lease lapsed looks again (the lease is being renewed).
pub const LEASE_RETRY: Duration = Duration::from_millis(20);

/// Another replica of a source: its forwarder shard (node and shard, as the catalog names it)
/// and the address of that forwarder's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub shard: ShardId,
    pub address: String,
}

pub type AnswerFuture = Pin<Box<dyn Future<Output = Result<ReplicaAnswer, Status>>>>;

/// How a replica reaches the others: the native protocol between forwarders in the daemon, a
/// simulated network in tests.
pub trait Transport {
    fn call(&self, peer: &Peer, request: ReplicaRequest) -> AnswerFuture;
}

/// The records of `batches` from `from` on, as chunks of one epoch each. The first batch may
/// start below `from` (the follower's batches are not the leader's): its records before it
/// are left out. The chunks hold the batches and point into them: nothing is copied here.
pub fn chunks_from<S: Storage>(batches: Vec<HeldBatch<S>>, from: Offset) -> Result<Vec<Chunk>, LogError> {
    let mut chunks: Vec<Chunk> = Vec::new();
    for batch in batches {
        let (base_offset, end_offset) = (batch.base_offset(), batch.end_offset());
        let epoch = batch.epoch();
        if end_offset <= from {
            continue;
        }
        let (first_offset, records) = if base_offset < from {
            (from, sealed_from(&batch, from)?)
        } else {
            (base_offset, batch.sealed_records())
        };
        // Where the records lie in the batch's bytes, which the chunk holds.
        let start = records.as_ptr() as usize - batch.bytes().as_ptr() as usize;
        let end = start + records.len();
        let slice = HeldSlice::new(Rc::new(batch), start, end);
        let record_count = (end_offset - first_offset) as u32;
        match chunks.last_mut() {
            Some(last) if last.epoch == epoch && last.end_offset() == first_offset => {
                last.records.push_held(slice);
                last.record_count += record_count;
            }
            _ => chunks.push(Chunk {
                first_offset,
                epoch,
                record_count,
                records: RecordBytes::Held(vec![slice]),
            }),
        }
    }
    Ok(chunks)
}

/// A batch's sealed records from offset `from` on.
fn sealed_from<S: Storage>(batch: &HeldBatch<S>, from: Offset) -> Result<&[u8], LogError> {
    let records = batch.sealed_records();
    let mut position = 0usize;
    for _ in 0..from - batch.base_offset() {
        let unpadded = records
            .get(position..position + 4)
            .map(|length| u32::from_le_bytes(length.try_into().expect("four bytes")) as usize)
            .ok_or_else(|| {
                LogError::DataLoss(format!("batch at {}: records end early", batch.base_offset()))
            })?;
        position += crate::log::record::align_up(unpadded.max(crate::log::record::RECORD_HEADER_BYTES), 8);
    }
    records
        .get(position..)
        .ok_or_else(|| LogError::DataLoss(format!("batch at {}: records end early", batch.base_offset())))
}

/// Where a log stands, for a follower to find where it parts from it.
pub fn tip<S: Storage>(log: &Log<S>) -> LogTip {
    LogTip { history: log.epoch_history(), end: log.durable_end(), start: log.start_offset() }
}

/// A leader's replication of one source, for one epoch: what each replica holds durably, and
/// the tasks that send each follower its records. Dropped (stopped) when it is deposed.
pub struct Leader {
    pub epoch: Epoch,
    /// This replica's shard.
    pub shard: ShardId,
    pub peers: Vec<Peer>,
    trackers: RefCell<[CommitTracker; LOGS]>,
    /// Each follower's durable ends as it last answered (what retention may not remove yet).
    acknowledged: RefCell<Vec<[Offset; LOGS]>>,
    stopped: Cell<bool>,
    stop: Notify,
    /// A follower promised a newer epoch than this leader's (`wants_election`).
    election_wanted: Cell<bool>,
    /// When each follower was sent the last request it answered (`may_serve`).
    answered_sent: RefCell<Vec<Option<std::time::Instant>>>,
    /// Deliveries start here: its predecessor's lease is over (`LEASE_WAIT`).
    serve_from: std::time::Instant,
    /// Fires when a delivery finds the lease lapsing: the followers are asked again.
    renew: Notify,
}

impl Leader {
    /// The leader of `epoch` among `shard` and `peers`, whose logs held `epoch_starts` records
    /// when it was elected, of which `committed_ends` were known committed.
    pub fn new(
        epoch: Epoch,
        shard: ShardId,
        peers: Vec<Peer>,
        epoch_starts: [Offset; LOGS],
        committed_ends: [Offset; LOGS],
        serve_from: std::time::Instant,
    ) -> Rc<Leader> {
        let replicas: Vec<ShardId> =
            std::iter::once(shard).chain(peers.iter().map(|peer| peer.shard)).collect();
        let followers = peers.len();
        let trackers = [MESSAGES, JOURNAL]
            .map(|log| CommitTracker::new(epoch, &replicas, epoch_starts[log], committed_ends[log]));
        Rc::new(Leader {
            epoch,
            shard,
            acknowledged: RefCell::new(vec![[Offset::ZERO; LOGS]; peers.len()]),
            peers,
            trackers: RefCell::new(trackers),
            stopped: Cell::new(false),
            stop: Notify::new(),
            election_wanted: Cell::new(false),
            answered_sent: RefCell::new(vec![None; followers]),
            serve_from,
            renew: Notify::new(),
        })
    }

    /// Starts sending each follower the records of `logs` (messages, journal).
    pub fn start<S: Storage>(
        self: &Rc<Self>,
        topic_id: TopicId,
        logs: [Log<S>; LOGS],
        transport: Rc<dyn Transport>,
    ) {
        for index in 0..self.peers.len() {
            let (leader, logs, transport) = (self.clone(), logs.clone(), transport.clone());
            crate::runtime::spawn(async move { leader.replicate(topic_id, index, logs, transport).await })
                .detach();
        }
    }

    /// It no longer leads: its tasks end, and whatever waits for a commit is answered.
    pub fn stop(&self) {
        self.stopped.set(true);
        self.stop.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.get()
    }

    /// Whether it may deliver messages at `now`: once its predecessor's lease is over, and
    /// while its own holds (a quorum answered a request sent within `LEADER_LEASE`). If not,
    /// when to look again; a lease that lapses is renewed by asking the followers.
    pub fn may_serve(&self, now: std::time::Instant) -> Result<(), std::time::Instant> {
        if now < self.serve_from {
            return Err(self.serve_from);
        }
        let needed = quorum(self.peers.len() + 1) - 1;
        if needed == 0 {
            return Ok(());
        }
        let mut sent: Vec<std::time::Instant> =
            self.answered_sent.borrow().iter().flatten().copied().collect();
        sent.sort_unstable_by(|a, b| b.cmp(a));
        let lease_end = sent.get(needed - 1).map(|sent| *sent + LEADER_LEASE);
        match lease_end {
            Some(end) if end > now => {
                if end - now < LEADER_LEASE / 2 {
                    self.renew.notify_all();
                }
                Ok(())
            }
            _ => {
                self.renew.notify_all();
                Err(now + LEASE_RETRY)
            }
        }
    }

    /// Each follower as it last answered: its durable end of `log`, and how long ago the last
    /// request it answered was sent (`None`: no answer yet).
    pub fn followers(&self, log: usize, now: std::time::Instant) -> Vec<(&Peer, Offset, Option<Duration>)> {
        let acknowledged = self.acknowledged.borrow();
        let answered = self.answered_sent.borrow();
        self.peers
            .iter()
            .enumerate()
            .map(|(index, peer)| {
                (
                    peer,
                    acknowledged[index][log],
                    answered[index].map(|sent| now.saturating_duration_since(sent)),
                )
            })
            .collect()
    }

    /// Whether both logs hold, on a quorum of this epoch's replicas, everything they held when
    /// it began (`CommitTracker::holds_what_came_before`).
    pub fn holds_what_came_before(&self) -> bool {
        self.trackers.borrow().iter().all(CommitTracker::holds_what_came_before)
    }

    /// The offset below which every follower holds `log` (what its retention may remove).
    pub fn replicated_floor(&self, log: usize) -> Offset {
        self.acknowledged.borrow().iter().map(|ends| ends[log]).min().unwrap_or(Offset::new(u64::MAX))
    }

    /// Moves each log's committed position to what a quorum holds, this replica included.
    pub fn advance<S: Storage>(&self, logs: &[Log<S>; LOGS]) {
        let mut trackers = self.trackers.borrow_mut();
        for (log, tracker) in logs.iter().zip(trackers.iter_mut()) {
            let committed = tracker.durable(self.shard, log.durable_end());
            log.commit_to(committed);
        }
    }

    fn answered<S: Storage>(&self, index: usize, durable_ends: [Offset; LOGS], logs: &[Log<S>; LOGS]) {
        {
            let mut trackers = self.trackers.borrow_mut();
            for (log, tracker) in trackers.iter_mut().enumerate() {
                tracker.durable(self.peers[index].shard, durable_ends[log]);
            }
        }
        self.acknowledged.borrow_mut()[index] = durable_ends;
        self.advance(logs);
    }

    /// Waits until `log` (one of this leader's) has committed everything below `end`: a
    /// quorum of replicas holds it. Fails once this replica is deposed, or after
    /// `COMMIT_WAIT_MAX`: the records are durable here and may still commit, so the caller
    /// cannot say they did.
    pub async fn wait_committed<S: Storage>(&self, log: &Log<S>, end: Offset) -> Result<(), LogError> {
        self.wait_committed_within(log, end, COMMIT_WAIT_MAX).await
    }

    /// Waits until `log` (this leader's `MESSAGES` or `JOURNAL`, `which`) has committed what it
    /// held when this epoch began: a record of this epoch is committed (Raft's rule), so its
    /// committed end covers every record an older leader ever acknowledged. Until then a new
    /// leader's committed end is only what it was last told as a follower, which may lag what
    /// its predecessor acknowledged. Fails as `wait_committed`, after `SYNC_POINT_WAIT_MAX`.
    pub async fn wait_epoch_committed<S: Storage>(&self, which: usize, log: &Log<S>) -> Result<(), LogError> {
        let epoch_start = self.trackers.borrow()[which].epoch_start();
        if epoch_start == Offset::ZERO {
            // The log held nothing when this epoch began: nothing before it to commit.
            return Ok(());
        }
        // The epoch's first record is at `epoch_start`; committed past it, everything is.
        self.wait_committed_within(log, Offset::new(epoch_start.get() + 1), SYNC_POINT_WAIT_MAX).await
    }

    async fn wait_committed_within<S: Storage>(
        &self,
        log: &Log<S>,
        end: Offset,
        wait_max: Duration,
    ) -> Result<(), LogError> {
        let deadline = crate::runtime::now() + wait_max;
        loop {
            let committed = log.committed();
            let stopped = self.stop.notified();
            if log.committed_end() >= end {
                return Ok(());
            }
            if self.stopped.get() {
                return Err(LogError::Deposed { led: Some(self.epoch) });
            }
            let now = crate::runtime::now();
            if now >= deadline {
                return Err(LogError::CommitTimeout {
                    quorum: quorum(self.peers.len() + 1),
                    replicas: self.peers.len() + 1,
                    waited: wait_max,
                });
            }
            let woken = futures_lite::future::or(committed, stopped);
            futures_lite::future::or(woken, crate::runtime::sleep(deadline - now)).await;
        }
    }

    /// Sends follower `index` what it lacks, for as long as this replica leads: the I/O of
    /// the follower's `Feed`, which decides what to send and when (up to `APPENDS_IN_FLIGHT`
    /// appends at once, each from where the one before ends; a failure drops the window and a
    /// new sync finds out what the follower holds).
    async fn replicate<S: Storage>(
        self: Rc<Self>,
        topic_id: TopicId,
        index: usize,
        logs: [Log<S>; LOGS],
        transport: Rc<dyn Transport>,
    ) {
        let peer = self.peers[index].clone();
        let mut feed = Feed::new();
        // The answers of the appends in flight, in the order of the feed's.
        let mut in_flight: VecDeque<Exchange> = VecDeque::new();
        while !self.stopped.get() {
            let durable_ends = [logs[MESSAGES].durable_end(), logs[JOURNAL].durable_end()];
            match feed.on_append(durable_ends) {
                Action::Sync => {
                    // The appends of the dropped window that did not go yet never go; those that
                    // did carry an older stamp than this sync's, which the follower refuses.
                    in_flight.clear();
                    let stamp = feed.next_sync_stamp();
                    let request = ReplicaRequest::Sync {
                        topic_id,
                        leader_epoch: self.epoch,
                        stamp,
                        logs: [tip(&logs[MESSAGES]), tip(&logs[JOURNAL])],
                    };
                    let sent_at = crate::runtime::now();
                    let answer = exchange(self.clone(), transport.clone(), peer.clone(), request).await;
                    let outcome = match answer {
                        Err(status) if stamp != 0 && cannot_read(&status) => feed.on_sync_unreadable(),
                        answer => feed.on_synced(answer.ok().as_ref(), sent_at),
                    };
                    self.follow_outcome(index, outcome, &logs).await;
                    continue;
                }
                Action::Append { .. } => {}
                Action::Wait => {
                    let waiting = [logs[MESSAGES].durable(), logs[JOURNAL].durable()];
                    let (stopped, renew) = (self.stop.notified(), self.renew.notified());
                    let [messages, journal] = waiting;
                    let woken =
                        futures_lite::future::or(futures_lite::future::or(messages, journal), stopped);
                    let front = async {
                        match in_flight.front_mut() {
                            Some(answer) => Some(answer.await),
                            None => std::future::pending().await,
                        }
                    };
                    // What woke it: an answer, records (or a stop), a delivery wanting the lease
                    // renewed, or the idle interval.
                    let woke = futures_lite::future::or(
                        futures_lite::future::or(async { Woke::Answer(front.await.flatten()) }, async {
                            woken.await;
                            Woke::Tick(Wake::Records)
                        }),
                        futures_lite::future::or(
                            async {
                                renew.await;
                                Woke::Tick(Wake::Renew)
                            },
                            async {
                                crate::runtime::sleep(IDLE_APPEND_INTERVAL).await;
                                Woke::Tick(Wake::Idle)
                            },
                        ),
                    )
                    .await;
                    match woke {
                        Woke::Answer(answer) => {
                            // Answered: the feed takes the same one, the oldest, off its window.
                            let _answered = in_flight.pop_front().expect("an answer came");
                            let outcome = feed.on_answer(answer.as_ref());
                            self.follow_outcome(index, outcome, &logs).await;
                            continue;
                        }
                        Woke::Tick(wake) => {
                            let committed_ends =
                                [logs[MESSAGES].committed_end(), logs[JOURNAL].committed_end()];
                            if !feed.on_tick(wake, committed_ends) {
                                continue;
                            }
                        }
                    }
                }
            }
            let parts = match self.parts(&logs, feed.sent_to()).await {
                Ok(parts) => parts,
                Err(error) => {
                    crate::log_warn!(
                        "ringpostd: topic {topic_id:x}: reading records for the replica on {}: {error}",
                        peer.shard
                    );
                    let outcome = feed.on_read_failed();
                    self.follow_outcome(index, outcome, &logs).await;
                    continue;
                }
            };
            let ends = [MESSAGES, JOURNAL].map(|log| parts[log].chunks.last().map(Chunk::end_offset));
            let committed_sent = [parts[MESSAGES].committed_end, parts[JOURNAL].committed_end];
            let request = ReplicaRequest::Append {
                topic_id,
                leader_epoch: self.epoch,
                stamp: feed.stamp(),
                logs: parts,
            };
            feed.on_sent(ends, committed_sent, crate::runtime::now());
            // A task of its own, so that the request goes now rather than when it reaches the
            // window's front; dropping the window (a sync) cancels what did not go yet.
            let (leader, transport, peer) = (self.clone(), transport.clone(), peer.clone());
            in_flight.push_back(Box::pin(crate::runtime::spawn(async move {
                exchange(leader, transport, peer, request).await.ok()
            })));
        }
    }

    /// Performs what an answer (or a failure) means for follower `index`: what it holds counts
    /// towards the commit point and the lease; a failure pauses before the sync that follows.
    async fn follow_outcome<S: Storage>(&self, index: usize, outcome: Outcome, logs: &[Log<S>; LOGS]) {
        match outcome {
            Outcome::Holds { ends, sent_at } => {
                self.answered_sent.borrow_mut()[index] = Some(sent_at);
                self.answered(index, ends, logs);
            }
            Outcome::Retry { pause } => self.pause(pause).await,
            Outcome::Ignored => {}
        }
    }

    /// An append's parts: each log's durable records from the follower's next offsets `at`,
    /// the journal's only as far as the request has room for (`APPEND_REQUEST_BYTES_MAX`).
    async fn parts<S: Storage>(
        &self,
        logs: &[Log<S>; LOGS],
        at: [Offset; LOGS],
    ) -> Result<[LogAppend; LOGS], LogError> {
        let messages = part(&logs[MESSAGES], at[MESSAGES], usize::MAX).await?;
        let taken: usize = messages.chunks.iter().map(|chunk| chunk.records.len()).sum();
        let journal =
            part(&logs[JOURNAL], at[JOURNAL], APPEND_REQUEST_BYTES_MAX.saturating_sub(taken)).await?;
        Ok([messages, journal])
    }

    /// Whether a follower refused this leader for a newer epoch's promise, no election having
    /// followed that this leader knows of.
    pub fn wants_election(&self) -> bool {
        self.election_wanted.get()
    }

    /// Sleeps `pause`, or until deposed.
    async fn pause(&self, pause: Duration) {
        let stopped = self.stop.notified();
        if !self.stopped.get() {
            futures_lite::future::or(stopped, crate::runtime::sleep(pause)).await;
        }
    }
}

/// One log's part of an append: its durable records from `from` on, up to `APPEND_BYTES_MAX`
/// beyond the first batch, none when that batch alone is larger than `room`.
async fn part<S: Storage>(log: &Log<S>, from: Offset, room: usize) -> Result<LogAppend, LogError> {
    let start_offset = log.start_offset();
    let committed_end = log.committed_end();
    if from < start_offset {
        return Err(LogError::Refused(format!(
            "the follower needs offset {from}, and the log starts at {start_offset}: it was removed"
        )));
    }
    let batches = log.hold_durable_from(from, APPEND_BYTES_MAX.min(room)).await?;
    if batches.first().is_some_and(|first| first.records_bytes() > room) {
        return Ok(LogAppend { chunks: Vec::new(), committed_end, start_offset });
    }
    Ok(LogAppend { chunks: chunks_from(batches, from)?, committed_end, start_offset })
}

/// What woke a leader's loop for one follower.
enum Woke {
    Answer(Option<ReplicaAnswer>),
    Tick(Wake),
}

/// An append in flight: its answer, None on any failure.
type Exchange = Pin<Box<dyn Future<Output = Option<ReplicaAnswer>>>>;

/// Whether a follower refused a request as one it cannot read: a node of the version before
/// stamps answers a stamped form so (its decoder's words for a tag it does not know).
fn cannot_read(status: &Status) -> bool {
    status.code == crate::api::Code::InvalidArgument && status.message.contains("unknown replica request")
}

/// Sends `request` to `peer` unless `leader` is deposed meanwhile. A follower that answers
/// `Deposed` makes the leader ask for an election (`wants_election`).
async fn exchange(
    leader: Rc<Leader>,
    transport: Rc<dyn Transport>,
    peer: Peer,
    request: ReplicaRequest,
) -> Result<ReplicaAnswer, Status> {
    let stopped = leader.stop.notified();
    let call = transport.call(&peer, request);
    let answer = futures_lite::future::or(call, async {
        stopped.await;
        Err(Status::unavailable("the leader stopped leading"))
    })
    .await;
    match answer {
        Ok(ReplicaAnswer::Deposed { promised_epoch }) => {
            // A fencing round of a newer epoch reached this follower, and no election followed
            // (or this leader has not heard of it): whoever runs elections is told, since this
            // follower takes nothing from it now.
            if !leader.election_wanted.replace(true) {
                crate::log_info!(
                    "ringpostd: the replica on {} promised epoch {promised_epoch}; the leader of epoch {} asks \
                     for an election",
                    peer.shard, leader.epoch
                );
            }
            Ok(ReplicaAnswer::Deposed { promised_epoch })
        }
        answer => answer,
    }
}

/// A follower's part of a sync with the leader of `leader_epoch`: the promise never to take an
/// older leader's records, then each log cut where it parts from the leader's. Returns each
/// log's next offset. A cut below what this replica counted as committed would lose a
/// committed record: refused (it cannot happen while the protocol holds; it is asserted).
pub async fn follow<S: Storage>(
    logs: &[Log<S>; LOGS],
    leader_epoch: Epoch,
    tips: &[LogTip; LOGS],
) -> Result<[Offset; LOGS], LogError> {
    let mut next = [Offset::ZERO; LOGS];
    for (index, (log, tip)) in logs.iter().zip(tips).enumerate() {
        if log.promised_epoch() < leader_epoch {
            log.promise_epoch(leader_epoch).await?;
        } else if log.promised_epoch() > leader_epoch {
            return Err(LogError::Refused(format!(
                "a sync from the leader of epoch {leader_epoch}: this replica promised epoch {}",
                log.promised_epoch()
            )));
        }
        // Records of the leader's own epoch came from it, and agree with its log: a sync that
        // arrives late (a copy the network held back) and names an older tip of the leader
        // must not cut them, or records the leader counts as held here would be gone.
        let end = log.durable_end();
        let cut = if log.last_epoch() == leader_epoch {
            end
        } else {
            divergence(&log.epoch_history(), end, &tip.history, tip.end)
        };
        // A log holds nothing below its start, and parts from the leader no lower: what was
        // removed there was committed (a replica that a move added, started where its leader's
        // log did, has no history to tell it so, and was refused every sync after its first).
        let cut = cut.max(log.start_offset());
        if cut < log.next_offset() {
            if cut < log.committed_end() {
                return Err(LogError::Refused(format!(
                    "the leader of epoch {leader_epoch} parts from this replica at offset {cut}, below its \
                     committed end {}: refused, or a committed record would be lost",
                    log.committed_end()
                )));
            }
            log.truncate_after(cut).await?;
        }
        // A replica that has never held a record (a new one, from a replica move) starts where
        // the leader's log does: what retention removed there is nowhere to copy from.
        if tip.start > log.next_offset() && log.is_empty() {
            log.start_at(tip.start).await?;
        }
        next[index] = log.next_offset();
    }
    Ok(next)
}

/// A follower takes its leader's records (`log_ids` are the ids their checksums cover): each
/// log's chunks are checked, then queued in order and awaited, both logs at once; then what the
/// leader counts as committed is committed here too, as far as it is durable, and segments below
/// the leader's start are let go. Returns each log's durable end.
///
/// `still_latest` says whether the sync this append follows is still the follower's latest
/// (`SyncStamp`): asked before the records are queued (in the same poll, so no sync begins in
/// between) and again once they are written, before the commit point is taken. A sync that
/// began meanwhile may be cutting the log below these records, and a commit point moved past its
/// cut would stand on records it removes (committed past durable).
pub async fn take<S: Storage>(
    logs: &[Log<S>; LOGS],
    log_ids: [u64; LOGS],
    leader_epoch: Epoch,
    parts: [LogAppend; LOGS],
    still_latest: &dyn Fn() -> bool,
) -> Result<[Offset; LOGS], LogError> {
    let newer_sync = || {
        LogError::Refused(format!(
            "the leader of epoch {leader_epoch} synced this replica again after it sent these records"
        ))
    };
    if !still_latest() {
        return Err(newer_sync());
    }
    let bounds: Vec<(Offset, Offset)> =
        parts.iter().map(|part| (part.committed_end, part.start_offset)).collect();
    let [messages, journal] = parts;
    let taken = crate::sync::join_all(vec![
        take_one(&logs[MESSAGES], log_ids[MESSAGES], leader_epoch, messages.chunks),
        take_one(&logs[JOURNAL], log_ids[JOURNAL], leader_epoch, journal.chunks),
    ])
    .await;
    for result in taken {
        result?;
    }
    // Fenced by a newer epoch while its records were written (a fencing round, or this
    // replica's own promotion): the deposed leader's commit point is not taken. A promotion may
    // be cutting this log where it parts from another replica, waiting only for these writes,
    // and a commit point moved past its cut would stand on records it removes.
    if logs.iter().any(|log| log.promised_epoch() > leader_epoch) {
        return Err(LogError::Refused(format!(
            "the leader of epoch {leader_epoch} was fenced while its records were written"
        )));
    }
    if !still_latest() {
        return Err(newer_sync());
    }
    for (log, (committed_end, start_offset)) in logs.iter().zip(bounds) {
        log.commit_to(committed_end.min(log.durable_end()));
        if start_offset > log.start_offset() {
            let log = log.clone();
            crate::runtime::spawn(async move {
                if let Err(error) = log.remove_before(start_offset).await {
                    crate::log_warn!("ringpostd: removing segments a leader removed: {error}");
                }
            })
            .detach();
        }
    }
    Ok([logs[MESSAGES].durable_end(), logs[JOURNAL].durable_end()])
}

/// One log's part of `take`: its chunks, checked to follow the log's next offset and to be
/// whole, sealed records of that log, then queued in order and awaited.
async fn take_one<S: Storage>(
    log: &Log<S>,
    log_id: u64,
    leader_epoch: Epoch,
    chunks: Vec<Chunk>,
) -> Result<(), LogError> {
    let mut expected = log.next_offset();
    for chunk in &chunks {
        if chunk.first_offset != expected {
            return Err(LogError::Refused(format!(
                "a chunk at offset {}: the log's next offset is {expected}",
                chunk.first_offset
            )));
        }
        crate::log::record::check_sealed_records(
            &chunk.records.contiguous(),
            log_id,
            chunk.first_offset.get(),
            chunk.record_count,
        )
        .map_err(|error| LogError::Refused(format!("records from another replica: {error}")))?;
        expected = chunk.end_offset();
    }
    let appends = chunks
        .into_iter()
        .map(|chunk| {
            log.append_records_from_leader(
                leader_epoch,
                chunk.first_offset,
                chunk.epoch,
                Records::Deferred(Box::new(chunk.records)),
                chunk.record_count,
            )
        })
        .collect();
    for result in crate::sync::join_all(appends).await {
        result?;
    }
    Ok(())
}

/// A replica's part of a fencing round: from now on it takes nothing from a leader older than
/// `epoch`; it says what each log holds.
pub async fn fence<S: Storage>(logs: &[Log<S>; LOGS], epoch: Epoch) -> Result<[FencedLog; LOGS], LogError> {
    let mut answers: [FencedLog; LOGS] = Default::default();
    for (log, answer) in logs.iter().zip(answers.iter_mut()) {
        let (last_epoch, durable_end) = log.promise_epoch(epoch).await?;
        *answer = FencedLog { last_epoch, durable_end, history: log.epoch_history() };
    }
    Ok(answers)
}

/// Durable records of `log` from `from` on, about `bytes_max` of them (a new leader reads a
/// journal it lacks from the replica that holds the most).
pub async fn read<S: Storage>(
    log: &Log<S>,
    from: Offset,
    bytes_max: usize,
) -> Result<(Vec<Chunk>, Offset), LogError> {
    if from < log.start_offset() {
        return Err(LogError::Refused(format!(
            "offset {from} is below the log's start {}",
            log.start_offset()
        )));
    }
    let batches = log.hold_durable_from(from, bytes_max).await?;
    Ok((chunks_from(batches, from)?, log.durable_end()))
}

/// A new leader's journal, made to hold every committed entry before it leads: the replica of
/// `answers` (a quorum's, its own among them as `own`) whose journal is the most up to date
/// holds them all; if that is another, the journal is cut where it parts from that one's and
/// the rest is read from it.
pub async fn adopt_journal<S: Storage>(
    journal: &Log<S>,
    topic_id: TopicId,
    epoch: Epoch,
    answers: &[(Peer, FencedLog)],
    transport: &dyn Transport,
) -> Result<(), Status> {
    let own = (journal.last_epoch(), journal.durable_end());
    let Some((donor, best)) = answers
        .iter()
        .filter(|(_, answer)| (answer.last_epoch, answer.durable_end) > own)
        .max_by_key(|(_, answer)| (answer.last_epoch, answer.durable_end))
    else {
        return Ok(());
    };
    let cut = divergence(&journal.epoch_history(), journal.durable_end(), &best.history, best.durable_end);
    if cut < journal.next_offset() {
        journal.truncate_after(cut).await.map_err(Status::from)?;
    }
    while journal.next_offset() < best.durable_end {
        let request = ReplicaRequest::Read {
            topic_id,
            log: JOURNAL as u8,
            from: journal.next_offset(),
            bytes_max: APPEND_BYTES_MAX as u32,
        };
        let chunks = match transport.call(donor, request).await? {
            ReplicaAnswer::Read { chunks, .. } => chunks,
            other => return Err(Status::internal(format!("a read of a journal answered {other:?}"))),
        };
        if chunks.is_empty() {
            return Err(Status::unavailable(format!(
                "the replica on {} had no journal records past {}",
                donor.shard,
                journal.next_offset()
            )));
        }
        let log_id = crate::subscription::journal_entry::journal_log_id(topic_id);
        take_one(journal, log_id, epoch, chunks).await.map_err(Status::from)?;
    }
    Ok(())
}
