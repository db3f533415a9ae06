//! A forwarder's replicas of replicated topics (docs/REPLICATION.md): attaching one as leader
//! or follower, a promotion after an election and a demotion after a newer one, and the
//! requests other replicas send (`replication::protocol`). A follower is kept apart from the
//! topics the shard serves (`Registry::followers`): it takes records from its leader and serves
//! no client; a leader is served like any topic, its publishes and acknowledgements answered
//! once a quorum of replicas holds them.

use super::Forwarder;
use crate::api::{Code, Status};
use crate::control::ControlOk;
use crate::ids::{Epoch, NodeId, Offset, ShardId, TopicId};
use crate::log::{Log, LogError};
use crate::replication::protocol::{FencedLog, ReplicaAnswer, ReplicaRequest, JOURNAL, LOGS, MESSAGES};
use crate::replication::source::{self, Leader, Peer, Transport};
use crate::replication::{quorum, Admission, SyncStamp};
use crate::storage::Storage;
use crate::subscription::journal_entry::{journal_log_id, messages_log_id, JournalEntry};
use crate::topic::{Replication, TopicState};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a new leader waits for the other replicas' answers to its fencing round before it
/// decides with the quorum it has (or gives up without one).
pub const PROMOTION_FENCE_WAIT: Duration = Duration::from_secs(2);
/// How long a leader demoted by a newer epoch's promise waits for that epoch's leader to sync
/// it before its node asks for an election (`Forwarder::elections_wanted`): an election that
/// fenced it and then failed to commit its leader leaves the topic led by no one, and the
/// catalog's leader that would retry it may have changed meanwhile. A successful election's
/// leader syncs its followers within a round trip, far inside it.
pub const FENCED_LEAD_WAIT: Duration = Duration::from_secs(2);

/// What a forwarder needs to replicate: its node (so its shard's name in the catalog) and how
/// it reaches other replicas. Set once the daemon starts; a node alone replicates nothing.
#[derive(Default)]
pub struct ReplicaContext {
    /// Its node in a cluster; `None` alone, which is node 1.
    pub node_id: Cell<Option<NodeId>>,
    pub transport: RefCell<Option<Rc<dyn Transport>>>,
    /// Topics being promoted here: one promotion at a time per topic.
    promoting: RefCell<std::collections::HashSet<TopicId>>,
    /// Fires when a promotion ends.
    promoted: crate::sync::Notify,
    /// The sync each followed topic began last (`SyncStamp`). In memory only: a replica that
    /// restarts attaches with no synced epoch, so it takes no append before a sync, and that
    /// sync's stamp is newer than every append its leader sent before it.
    latest_syncs: RefCell<std::collections::HashMap<TopicId, SyncStamp>>,
    /// Topics this shard led until a newer epoch's promise demoted it, with when: while no
    /// leader has synced it since, it may be that no election followed (`FENCED_LEAD_WAIT`).
    fenced_leads: RefCell<std::collections::HashMap<TopicId, Instant>>,
}

fn unavailable(why: impl Into<String>) -> Status {
    Status::unavailable(why)
}

impl<S: Storage> Forwarder<S> {
    /// This shard as the catalog names it (node and shard).
    pub fn global_shard(&self) -> ShardId {
        ShardId::new(self.replica_context.node_id.get().unwrap_or(NodeId::new(1)), self.shard)
    }

    fn transport(&self) -> Result<Rc<dyn Transport>, Status> {
        self.replica_context
            .transport
            .borrow()
            .clone()
            .ok_or_else(|| unavailable("this forwarder cannot reach other replicas (it is not in a cluster)"))
    }

    /// The replicas but this one.
    fn peers_of(&self, replicas: &[Peer]) -> Vec<Peer> {
        let own = self.global_shard();
        replicas.iter().filter(|peer| peer.shard != own).cloned().collect()
    }

    /// A topic's two logs, its journal opened if it was not.
    async fn logs_of(&self, topic: &TopicState<S>) -> Result<[Log<S>; LOGS], Status> {
        let journal = topic.journal_log().await.map_err(Status::from)?;
        Ok([topic.log.clone(), journal])
    }

    /// Opens a replicated topic's logs here (recovering them, at start) as a follower, which
    /// takes records from whoever leads until it is promoted. What its directories hold counts
    /// as committed only once a leader says so: a replica that led before a restart cannot
    /// tell what a quorum held, so its node asks for an election instead of leading again.
    pub async fn attach_replica(
        &self,
        topic_id: TopicId,
        name: String,
        retention_seconds: u64,
        recovering: bool,
        (source, active): (crate::ids::SourceId, u32),
    ) -> Result<ControlOk, Status> {
        let attached = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
        let attached = attached.or_else(|| self.registry.followers.borrow().get(&topic_id).cloned());
        if let Some(topic) = attached {
            // Attached already (a retried attach, or reconciling): the count is the catalog's.
            if active != 0 {
                topic.apply_active_sources(active);
            }
            return Ok(ControlOk::Done);
        }
        let mut topic = self.store.open(topic_id, name, retention_seconds, true, recovering).await?;
        topic.source = source;
        // Before it can be promoted: its first publish as leader is checked against the count
        // (0, not said by a router of the version before, leaves it taking every key, as then).
        if active != 0 {
            topic.apply_active_sources(active);
        }
        let topic = Rc::new(topic);
        let logs = self.logs_of(&topic).await?;
        for log in &logs {
            log.forget_commits();
        }
        *topic.replication.borrow_mut() = Replication::Follower { synced_epoch: Epoch::ZERO };
        self.registry.followers.borrow_mut().insert(topic_id, topic);
        Ok(ControlOk::Done)
    }

    /// Makes this replica the leader of `epoch`, which the catalog elected after a fencing
    /// round chose it: it fences the replicas itself too and, if another holds more of the
    /// journal (the round compared messages only), takes what it lacks from it; then it
    /// starts its epoch with a record of its own in each log, whose commit commits everything
    /// before it, and serves the topic. Its subscriptions are attached by the router after.
    pub async fn promote_replica(
        &self,
        topic_id: TopicId,
        epoch: Epoch,
        replicas: Vec<Peer>,
    ) -> Result<ControlOk, Status> {
        if let Some(leader) =
            self.registry.topics_by_id.borrow().get(&topic_id).and_then(|topic| topic.leader())
        {
            if leader.epoch >= epoch {
                return Ok(ControlOk::Done);
            }
        }
        // One promotion of a topic at a time: a second waits for the first, then looks again.
        loop {
            let done = self.replica_context.promoted.notified();
            if self.replica_context.promoting.borrow_mut().insert(topic_id) {
                break;
            }
            done.await;
            if let Some(leader) =
                self.registry.topics_by_id.borrow().get(&topic_id).and_then(|topic| topic.leader())
            {
                if leader.epoch >= epoch {
                    return Ok(ControlOk::Done);
                }
            }
        }
        // The election that fenced this lead, if one did, has come to its promotion: if that
        // fails, this node's router promotes again each pass (`reconcile_replicas`), and
        // asking for another election here would begin a newer epoch that fails this one's
        // promotion in turn, round after round.
        self.replica_context.fenced_leads.borrow_mut().remove(&topic_id);
        let promoted = self.promote_follower(topic_id, epoch, replicas).await;
        self.replica_context.promoting.borrow_mut().remove(&topic_id);
        self.replica_context.promoted.notify_all();
        promoted
    }

    /// `promote_replica`, once no other promotion of the topic runs.
    async fn promote_follower(
        &self,
        topic_id: TopicId,
        epoch: Epoch,
        replicas: Vec<Peer>,
    ) -> Result<ControlOk, Status> {
        self.demote_replica(topic_id, epoch);
        let topic = self.registry.followers.borrow().get(&topic_id).cloned().ok_or_else(|| {
            Status::new(Code::NotFound, format!("topic {topic_id:x} has no replica on shard {}", self.shard))
        })?;
        let logs = self.logs_of(&topic).await?;
        let peers = self.peers_of(&replicas);
        let transport = self.transport()?;
        let answers = self.fence_all(topic_id, epoch, &logs, &peers, &*transport).await?;
        source::adopt_journal(&logs[JOURNAL], topic_id, epoch, &answers, &*transport).await?;
        // Promoted meanwhile by a second request, or deposed by a newer round: not this one's.
        let still_follower = matches!(*topic.replication.borrow(), Replication::Follower { .. })
            && self.registry.followers.borrow().contains_key(&topic_id);
        if !still_follower || logs[MESSAGES].promised_epoch() > epoch {
            return Err(unavailable(format!("topic {topic_id:x}: a newer epoch than {epoch} began")));
        }
        let epoch_starts = [logs[MESSAGES].next_offset(), logs[JOURNAL].next_offset()];
        let committed = [logs[MESSAGES].committed_end(), logs[JOURNAL].committed_end()];
        topic.fence_at_promotion(epoch_starts[MESSAGES].get());
        for log in &logs {
            log.set_epoch(epoch).map_err(Status::from)?;
        }
        // What a subscription attached from here on rebuilds its state from: every entry the
        // journal holds, committed or about to be with this epoch's first.
        topic.replay_journal_again().await?;
        // The first leader of a new topic has no predecessor whose lease could still run.
        let now = self.environment.clock.now();
        let serve_from = if epoch == Epoch::ZERO.next() { now } else { now + source::LEASE_WAIT };
        let shard = self.global_shard();
        let leader = Leader::new(epoch, shard, peers, epoch_starts, committed, serve_from);
        *topic.replication.borrow_mut() = Replication::Leader(leader.clone());
        self.registry.followers.borrow_mut().remove(&topic_id);
        self.registry.topics.borrow_mut().insert(topic.name.clone(), topic.clone());
        self.registry.topics_by_id.borrow_mut().insert(topic_id, topic.clone());
        leader.start(topic_id, logs.clone(), transport);
        let publish_ms = self.environment.clock.wall_ms();
        crate::runtime::spawn(async move { start_epoch(topic, logs, epoch, epoch_starts, publish_ms).await })
            .detach();
        // The catalog's leader logs the election once, naming the topic and this forwarder.
        crate::log_debug!("ringpostd: forwarder {} leads topic {topic_id:x} from epoch {epoch}", self.shard);
        Ok(ControlOk::Done)
    }

    /// A fencing round run by a new leader: its own promise and each peer's, until every peer
    /// answered or `PROMOTION_FENCE_WAIT` passed; fails without a quorum. Returns the peers'
    /// answers.
    async fn fence_all(
        &self,
        topic_id: TopicId,
        epoch: Epoch,
        logs: &[Log<S>; LOGS],
        peers: &[Peer],
        transport: &dyn Transport,
    ) -> Result<Vec<(Peer, FencedLog)>, Status> {
        source::fence(logs, epoch).await.map_err(Status::from)?;
        let answers: Rc<RefCell<Vec<(Peer, FencedLog)>>> = Rc::default();
        let calls: Vec<_> = peers
            .iter()
            .map(|peer| {
                let (answers, peer) = (answers.clone(), peer.clone());
                let call = transport.call(&peer, ReplicaRequest::Fence { topic_id, epoch });
                async move {
                    if let Ok(ReplicaAnswer::Fenced { logs }) = call.await {
                        let [_, journal] = logs;
                        answers.borrow_mut().push((peer, journal));
                    }
                }
            })
            .collect();
        futures_lite::future::or(
            async {
                crate::sync::join_all(calls).await;
            },
            crate::runtime::sleep(PROMOTION_FENCE_WAIT),
        )
        .await;
        let answers = answers.take();
        let needed = quorum(peers.len() + 1);
        if answers.len() + 1 < needed {
            return Err(unavailable(format!(
                "topic {topic_id:x}: {} of {} replicas answered the fencing round of epoch {epoch}; {needed} are needed",
                answers.len() + 1,
                peers.len() + 1
            )));
        }
        Ok(answers)
    }

    /// Stops leading a topic whose newer epoch `epoch` another replica leads (or will): its
    /// subscriptions' pulls and streams end with `Unavailable`, so their clients look again,
    /// whatever waits for a commit fails, and it follows the new leader from its next sync.
    pub fn demote_replica(&self, topic_id: TopicId, epoch: Epoch) -> bool {
        let topic = self.registry.topics_by_id.borrow().get(&topic_id).cloned();
        let Some(topic) = topic else { return false };
        let Some(leader) = topic.leader().filter(|leader| leader.epoch < epoch) else { return false };
        leader.stop();
        self.registry.topics_by_id.borrow_mut().remove(&topic_id);
        self.registry.topics.borrow_mut().remove(&topic.name);
        {
            let mut subscriptions = self.registry.subscriptions.borrow_mut();
            for entry in topic.subscriptions.take().into_vec() {
                subscriptions.remove(&entry.name);
                entry.moved.set(true);
                entry.detach();
            }
        }
        *topic.replication.borrow_mut() = Replication::Follower { synced_epoch: Epoch::ZERO };
        self.registry.followers.borrow_mut().insert(topic_id, topic);
        crate::log_debug!(
            "ringpostd: forwarder {} no longer leads topic {topic_id:x} (epoch {epoch} began)",
            self.shard
        );
        true
    }

    /// A fencing round's question, from the catalog's leader or a new leader: the promise, and
    /// what the messages and the journal hold here.
    pub async fn fence_replica(&self, topic_id: TopicId, epoch: Epoch) -> Result<[FencedLog; LOGS], Status> {
        // Only a fencing round records a fenced lead: a demotion the catalog's leader asks for
        // names another leader, a sync comes from one, and a promotion is the election's end.
        if self.demote_replica(topic_id, epoch) {
            self.replica_context.fenced_leads.borrow_mut().insert(topic_id, crate::runtime::now());
        }
        let topic = self.replica(topic_id)?;
        let logs = self.logs_of(&topic).await?;
        source::fence(&logs, epoch).await.map_err(Status::from)
    }

    /// Topics this shard leads whose followers refused it for a newer epoch's promise, and
    /// those it led until such a promise demoted it that no leader has synced since
    /// `FENCED_LEAD_WAIT`: their node asks for elections (`ControlRequest::ElectionsWanted`)
    /// of those the catalog still names this shard the leader of.
    pub fn elections_wanted(&self) -> Vec<TopicId> {
        let mut wanted: Vec<TopicId> = self
            .registry
            .topics_by_id
            .borrow()
            .values()
            .filter(|topic| topic.leader().is_some_and(|leader| leader.wants_election()))
            .map(|topic| topic.id)
            .collect();
        let followers = self.registry.followers.borrow();
        let unsynced = |topic_id: &TopicId| {
            followers.get(topic_id).is_some_and(|topic| {
                let replication = topic.replication.borrow();
                matches!(*replication, Replication::Follower { synced_epoch } if synced_epoch == Epoch::ZERO)
            })
        };
        let mut fenced_leads = self.replica_context.fenced_leads.borrow_mut();
        // Synced since, led again, or no longer here: nothing to ask.
        fenced_leads.retain(|topic_id, _| unsynced(topic_id));
        let now = crate::runtime::now();
        let waited = fenced_leads.iter().filter(|(_, at)| now.duration_since(**at) >= FENCED_LEAD_WAIT);
        let mut fenced: Vec<TopicId> = waited.map(|(topic_id, _)| *topic_id).collect();
        // In one order whatever the map's hashing, so that a seeded simulation replays exactly.
        fenced.sort_unstable();
        wanted.extend(fenced);
        wanted
    }

    /// Where this shard's replica of `topic_id` stands (`ControlRequest::ReplicaProgress`).
    pub fn replica_progress(&self, topic_id: TopicId) -> Result<crate::control::ReplicaProgress, Status> {
        let topic = self.replica(topic_id)?;
        let journal = topic.journal.opened();
        let journal_ends =
            journal.as_ref().map_or([Offset::ZERO; 2], |log| [log.durable_end(), log.committed_end()]);
        let mut progress = crate::control::ReplicaProgress {
            durable_ends: [topic.log.durable_end().get(), journal_ends[0].get()],
            committed_ends: [topic.log.committed_end().get(), journal_ends[1].get()],
            ..Default::default()
        };
        match &*topic.replication.borrow() {
            Replication::Alone => {}
            Replication::Follower { synced_epoch } => progress.epoch = synced_epoch.get(),
            Replication::Leader(leader) => {
                let now = crate::runtime::now();
                progress.leader = true;
                progress.epoch = leader.epoch.get();
                progress.epoch_committed = leader.holds_what_came_before();
                progress.followers = leader
                    .followers(MESSAGES, now)
                    .into_iter()
                    .zip(leader.followers(JOURNAL, now))
                    .map(|((peer, messages, _), (_, journal, _))| {
                        (peer.shard.global(), [messages.get(), journal.get()])
                    })
                    .collect();
            }
        }
        Ok(progress)
    }

    /// A replica of `topic_id` here, leading or following.
    fn replica(&self, topic_id: TopicId) -> Result<Rc<TopicState<S>>, Status> {
        let following = self.registry.followers.borrow().get(&topic_id).cloned();
        following.or_else(|| self.registry.topics_by_id.borrow().get(&topic_id).cloned()).ok_or_else(|| {
            Status::new(Code::NotFound, format!("topic {topic_id:x} has no replica on shard {}", self.shard))
        })
    }

    /// The sync of `topic_id` this follower began last.
    fn latest_sync(&self, topic_id: TopicId) -> SyncStamp {
        self.replica_context.latest_syncs.borrow().get(&topic_id).copied().unwrap_or_default()
    }

    /// A sync stamped `incoming` begins: it becomes the latest, or is answered `Stale` (sent
    /// before the latest, its copy held back or sent twice) without touching the logs.
    fn begin_sync(&self, topic_id: TopicId, incoming: SyncStamp) -> Option<ReplicaAnswer> {
        let mut latest_syncs = self.replica_context.latest_syncs.borrow_mut();
        if !latest_syncs.contains_key(&topic_id)
            && latest_syncs.len() >= self.registry.followers.borrow().len()
        {
            // Topics no longer followed here (deleted, or led now) are forgotten before the map
            // grows past the topics followed.
            let followers = self.registry.followers.borrow();
            latest_syncs.retain(|topic_id, _| followers.contains_key(topic_id));
        }
        let latest = latest_syncs.entry(topic_id).or_default();
        match latest.on_sync(incoming) {
            Admission::Take => None,
            Admission::Stale | Admission::NotSynced => {
                Some(ReplicaAnswer::Stale { synced_stamp: latest.stamp })
            }
        }
    }

    /// Another replica's request (`replication::protocol`).
    pub async fn replica_request(&self, request: ReplicaRequest) -> Result<ReplicaAnswer, Status> {
        match request {
            ReplicaRequest::Sync { topic_id, leader_epoch, stamp, logs: tips } => {
                self.demote_replica(topic_id, leader_epoch);
                let topic = self.replica(topic_id)?;
                if !matches!(*topic.replication.borrow(), Replication::Follower { .. }) {
                    return Err(Status::failed_precondition(format!(
                        "topic {topic_id:x}: this replica leads an epoch at least {leader_epoch}"
                    )));
                }
                // The latest sync from now on, before anything here waits: an append sent before
                // it that arrives later is refused, and one already taking its records does not
                // take its commit point (`source::take`).
                if let Some(stale) = self.begin_sync(topic_id, SyncStamp { epoch: leader_epoch, stamp }) {
                    return Ok(stale);
                }
                let logs = self.logs_of(&topic).await?;
                let promised_epoch = logs[MESSAGES].promised_epoch();
                if promised_epoch > leader_epoch {
                    return Ok(ReplicaAnswer::Deposed { promised_epoch });
                }
                let next_offsets = source::follow(&logs, leader_epoch, &tips).await.map_err(Status::from)?;
                if let Replication::Follower { synced_epoch } = &mut *topic.replication.borrow_mut() {
                    *synced_epoch = leader_epoch;
                }
                Ok(ReplicaAnswer::Synced { next_offsets })
            }
            ReplicaRequest::Append { topic_id, leader_epoch, stamp, logs: parts } => {
                let topic = self.replica(topic_id)?;
                let sent_after = SyncStamp { epoch: leader_epoch, stamp };
                let latest = self.latest_sync(topic_id);
                let admission = latest.admits_append(sent_after);
                if admission == Admission::Stale {
                    return Ok(ReplicaAnswer::Stale { synced_stamp: latest.stamp });
                }
                let synced = admission == Admission::Take
                    && matches!(
                        *topic.replication.borrow(),
                        Replication::Follower { synced_epoch } if synced_epoch == leader_epoch
                    );
                if !synced {
                    return Err(Status::failed_precondition(format!(
                        "topic {topic_id:x}: records from the leader of epoch {leader_epoch}, which this replica \
                         has not synced with; sync first"
                    )));
                }
                let logs = self.logs_of(&topic).await?;
                let promised_epoch = logs[MESSAGES].promised_epoch();
                if promised_epoch > leader_epoch {
                    return Ok(ReplicaAnswer::Deposed { promised_epoch });
                }
                let log_ids = [messages_log_id(topic_id), journal_log_id(topic_id)];
                let still_latest = || self.latest_sync(topic_id).admits_append(sent_after) == Admission::Take;
                let durable_ends = source::take(&logs, log_ids, leader_epoch, parts, &still_latest)
                    .await
                    .map_err(Status::from)?;
                Ok(ReplicaAnswer::Appended { durable_ends })
            }
            ReplicaRequest::Fence { topic_id, epoch } => {
                Ok(ReplicaAnswer::Fenced { logs: self.fence_replica(topic_id, epoch).await? })
            }
            ReplicaRequest::Read { topic_id, log, from, bytes_max } => {
                let topic = self.replica(topic_id)?;
                let logs = self.logs_of(&topic).await?;
                let bytes_max = (bytes_max as usize).min(source::APPEND_BYTES_MAX);
                let (chunks, durable_end) =
                    source::read(&logs[log as usize], from, bytes_max).await.map_err(Status::from)?;
                Ok(ReplicaAnswer::Read { chunks, durable_end })
            }
        }
    }
}

/// A new leader's first records, one in each log: a message nobody published (no data, no
/// attributes, which no publish may be; subscriptions skip it) and a journal entry that
/// changes nothing. Committing them commits every record before them.
async fn start_epoch<S: Storage>(
    topic: Rc<TopicState<S>>,
    logs: [Log<S>; LOGS],
    epoch: Epoch,
    epoch_starts: [Offset; LOGS],
    publish_ms: u64,
) {
    let mut marker = Vec::new();
    crate::log::record::encode_record_unsealed(&mut marker, publish_ms, &[], &mut std::iter::empty(), "");
    let mut entry = Vec::new();
    let bytes = JournalEntry::LeaderEpoch { epoch: epoch.get() }.encode();
    crate::log::record::encode_record_unsealed(&mut entry, 0, &bytes, &mut std::iter::empty(), "");
    // An empty log needs none: nothing before it to commit (the elected replica holds every
    // committed record, so none was), and a new topic's first message keeps offset 0.
    let appends: Vec<_> = [(MESSAGES, marker), (JOURNAL, entry)]
        .into_iter()
        .filter(|(log, _)| epoch_starts[*log] > Offset::ZERO)
        .map(|(log, records)| logs[log].append(records, 1))
        .collect();
    let results = crate::sync::join_all(appends).await;
    for result in results {
        if let Err(error) = result {
            // Deposed meanwhile (refused), or the log failed: the next leader starts again.
            if !matches!(error, LogError::Refused(_)) {
                crate::log_warn!("ringpostd: topic '{}': starting epoch {epoch}: {error}", topic.name);
            }
        }
    }
}
