//! Elections of replicated topics' leaders, as the catalog's leader runs them
//! (docs/REPLICATION.md): which topics need one (`coordinate`), and one election (`elect`): every
//! replica is asked to promise the next epoch, and once a quorum has, the most up-to-date of
//! those that answered is proposed as its leader.
//!
//! What they call is behind `Electorate`: the catalog as applied here, which nodes the catalog
//! heard from, a forwarder's answer to a control request (the fencing round) and the catalog's
//! decision. The router is the daemon's `Electorate`; the simulated cluster of
//! `replication_sim_tests.rs` is another, so the simulation runs these functions, not a copy.
//! The decisions themselves take no I/O: `Elections::candidates` (which topics) and `decide`
//! (which replica leads).

use super::replicas::ELECTION_ASK_INTERVAL;
use super::ControlError;
use crate::catalog::{Applied, CatalogEntry, CatalogState, TopicRecord};
use crate::control::{ControlOk, ControlRequest};
use crate::ids::{Epoch, NodeId, Offset, ShardId, TopicId};
use crate::replication::{choose_leader, quorum, FenceAnswer};
use std::cell::{Ref, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A node the catalog's leader has not heard from for this long has its topics' leadership
/// moved to other replicas.
pub const SOURCE_FAILURE_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long an election waits for the replicas' answers to its fencing round.
pub const ELECTION_FENCE_WAIT: Duration = Duration::from_secs(1);
/// Elections the catalog's leader runs at once; the topics beyond wait for the next pass.
pub const ELECTIONS_IN_FLIGHT_MAX: usize = 64;

/// How long the elections wait for what they wait on. The daemon's are the constants above;
/// a simulation whose nemesis acts every few hundred milliseconds shortens them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionTimings {
    /// A topic whose leader's node was not heard from for this long gets an election.
    pub source_failure_timeout: Duration,
    /// How long an election waits for the answers to its fencing round.
    pub fence_wait: Duration,
    /// How long after a failed election the topic's next one is tried.
    pub retry_interval: Duration,
    /// How long each step of a replica move may take (`moves.rs`).
    pub move_step_timeout: Duration,
    /// How often a move looks at the topic's leader's progress.
    pub move_poll_interval: Duration,
}

impl ElectionTimings {
    pub const DAEMON: ElectionTimings = ElectionTimings {
        source_failure_timeout: SOURCE_FAILURE_TIMEOUT,
        fence_wait: ELECTION_FENCE_WAIT,
        retry_interval: ELECTION_ASK_INTERVAL,
        move_step_timeout: super::moves::MOVE_STEP_TIMEOUT,
        move_poll_interval: super::moves::MOVE_POLL_INTERVAL,
    };
}

/// What an election calls on the node that runs it.
pub trait Electorate {
    /// The elections this node runs, and their state.
    fn elections(&self) -> &Elections;
    /// The catalog as this node applied it.
    fn catalog(&self) -> Ref<'_, CatalogState>;
    /// The nodes the catalog heard from within `within`; `None` when this node does not lead
    /// the catalog, or cannot tell yet who is gone (see `Catalog::voters_heard_within`).
    fn nodes_heard_within(&self, within: Duration) -> Option<Vec<NodeId>>;
    /// Sends `request` to the forwarder `shard` (on whichever node) and waits for its answer.
    fn control(
        &self,
        shard: ShardId,
        request: ControlRequest,
    ) -> impl Future<Output = Result<ControlOk, ControlError>>;
    /// Decides `entry` in the catalog and waits until this node applied it.
    fn decide(&self, entry: CatalogEntry) -> impl Future<Output = Result<Applied, ControlError>>;
}

/// The catalog leader's elections: those asked for, those under way (or held by a replica
/// move, which runs its own), and those that failed, tried again after `retry_interval`
/// (some replicas may have promised the epoch, and refuse their old leader until one is
/// decided).
pub struct Elections {
    timings: ElectionTimings,
    wanted: RefCell<HashSet<TopicId>>,
    electing: RefCell<HashSet<TopicId>>,
    retry: RefCell<HashMap<TopicId, Instant>>,
}

impl Default for Elections {
    fn default() -> Elections {
        Elections::new(ElectionTimings::DAEMON)
    }
}

impl Elections {
    pub fn new(timings: ElectionTimings) -> Elections {
        Elections {
            timings,
            wanted: RefCell::default(),
            electing: RefCell::default(),
            retry: RefCell::default(),
        }
    }

    /// How long what these elections (and moves) wait on may take.
    pub fn timings(&self) -> ElectionTimings {
        self.timings
    }

    /// Asks for elections of `topics` at the next `coordinate`.
    pub fn want(&self, topics: impl IntoIterator<Item = TopicId>) {
        self.wanted.borrow_mut().extend(topics);
    }

    /// Takes `topic_id`'s turn: false while an election or a move of it holds it.
    pub fn begin(&self, topic_id: TopicId) -> bool {
        self.electing.borrow_mut().insert(topic_id)
    }

    /// How many topics' turns are taken: elections and moves under way.
    pub fn in_flight(&self) -> usize {
        self.electing.borrow().len()
    }

    /// Gives back `topic_id`'s turn, taken by `begin`.
    pub fn end(&self, topic_id: TopicId) {
        let held = self.electing.borrow_mut().remove(&topic_id);
        assert!(held, "the election of topic {topic_id:x} ended without having begun");
    }

    /// The replicated units (topics and their later sources) that need an election at `now`:
    /// asked for, whose leader is on a node not in `heard`, or whose last election failed long enough ago. Takes the asked
    /// ones off the list.
    pub fn candidates(&self, catalog: &CatalogState, heard: &[NodeId], now: Instant) -> Vec<TopicId> {
        let mut wanted = self.wanted.borrow_mut();
        let retry = self.retry.borrow();
        // Every replicated unit: the topics' own logs, then their later sources.
        let topics = catalog.topics.values().filter(|topic| topic.replica_count() > 1);
        let sources = catalog.sources.values().filter(|source| source.replicas.len() > 1);
        topics
            .map(|topic| (topic.id, topic.shard))
            .chain(sources.map(|source| (source.id, source.shard)))
            .filter(|(id, leader)| {
                let away = !heard.contains(&leader.node());
                let due = retry.get(id).is_some_and(|at| now >= *at);
                wanted.remove(id) || away || due
            })
            .map(|(id, _)| id)
            .collect()
    }

    fn elected(&self, topic_id: TopicId) {
        self.retry.borrow_mut().remove(&topic_id);
    }

    fn failed(&self, topic_id: TopicId, now: Instant) {
        self.retry.borrow_mut().insert(topic_id, now + self.timings.retry_interval);
    }
}

/// On the catalog's leader: starts an election for every replicated topic whose leader is on a
/// node not heard from within `source_failure_timeout`, that a node asked for, or whose last
/// election failed, at most `ELECTIONS_IN_FLIGHT_MAX` at once. Each runs as a task of its own.
pub fn coordinate<E: Electorate + 'static>(electorate: &Rc<E>) {
    let elections = electorate.elections();
    let Some(heard) = electorate.nodes_heard_within(elections.timings.source_failure_timeout) else {
        return;
    };
    let candidates = elections.candidates(&electorate.catalog(), &heard, crate::runtime::now());
    for topic_id in candidates {
        if elections.electing.borrow().len() >= ELECTIONS_IN_FLIGHT_MAX {
            break;
        }
        if !elections.begin(topic_id) {
            continue;
        }
        let electorate = electorate.clone();
        crate::runtime::spawn(async move {
            let elections = electorate.elections();
            match elect(&*electorate, topic_id, None).await {
                Ok(()) => elections.elected(topic_id),
                Err(status) => {
                    let unit = electorate.catalog().unit_shown(topic_id);
                    crate::log_warn!("ringpostd: electing a leader of {unit}: {status}");
                    elections.failed(topic_id, crate::runtime::now());
                }
            }
            elections.end(topic_id);
        })
        .detach();
    }
}

/// One election of topic `topic_id`'s leader: every replica is asked to promise the next
/// epoch; once a quorum has, the most up-to-date of those that answered is decided as its
/// leader. With `excluded` (a replica a move takes away), that replica is fenced but is no
/// candidate, and the others' answers must make a quorum of every replica on their own.
pub async fn elect<E: Electorate>(
    electorate: &E,
    topic_id: TopicId,
    excluded: Option<ShardId>,
) -> Result<(), ControlError> {
    // A topic's own log, or one of its later sources, by its unit id.
    let Some(topic) = electorate.catalog().unit_by_id(topic_id) else { return Ok(()) };
    let epoch = topic.epoch + 1;
    let fence_wait = electorate.elections().timings.fence_wait;
    let fences = topic.replicas.iter().map(|shard| async move {
        let fence = ControlRequest::FenceReplica { topic_id, epoch };
        let answered = futures_lite::future::or(electorate.control(*shard, fence), async {
            crate::runtime::sleep(fence_wait).await;
            Err(ControlError::no_answer("no answer in time"))
        })
        .await;
        match answered {
            Ok(ControlOk::Fenced { last_epoch, durable_end }) => Some(FenceAnswer {
                replica: *shard,
                last_epoch: Epoch::new(last_epoch),
                durable_end: Offset::new(durable_end),
            }),
            _ => None,
        }
    });
    let answers: Vec<FenceAnswer> =
        crate::sync::join_all(fences.collect()).await.into_iter().flatten().collect();
    let chosen = decide(&topic, epoch, &answers, excluded)?;
    let crowded = electorate.catalog().nodes_leading_other_units(topic_id);
    let chosen = prefer_placed(chosen, &answers, excluded, &electorate.catalog().draining, &crowded);
    let leader = chosen.replica;
    electorate.decide(CatalogEntry::TopicLeaderElected { id: topic_id, epoch, leader }).await?;
    crate::log_info!(
        "ringpostd: {}: {} leads from epoch {epoch} (its log ends at {}, epoch {})",
        electorate.catalog().unit_shown(topic_id),
        leader,
        chosen.durable_end,
        chosen.last_epoch
    );
    Ok(())
}

/// Who leads `topic` from `epoch`, from its replicas' `answers` to the fencing round of that
/// epoch: the most up-to-date of a quorum (`choose_leader`), `excluded` being no candidate and
/// its answer not counted. A refusal says how many answered and how many are needed.
pub fn decide(
    topic: &TopicRecord,
    epoch: u64,
    answers: &[FenceAnswer],
    excluded: Option<ShardId>,
) -> Result<FenceAnswer, ControlError> {
    let mut replicas = topic.replicas.clone();
    let mut answers = answers.to_vec();
    if let Some(excluded) = excluded {
        let needed = quorum(replicas.len());
        replicas.retain(|shard| *shard != excluded);
        answers.retain(|answer| answer.replica != excluded);
        let answered: HashSet<ShardId> = answers.iter().map(|answer| answer.replica).collect();
        if answered.len() < needed {
            return Err(ControlError::unavailable(format!(
                "topic '{}': {} of its replicas other than {} answered the fencing round of \
                 epoch {epoch}; {needed} are needed",
                topic.name,
                answered.len(),
                excluded
            )));
        }
    }
    choose_leader(&replicas, &answers).map_err(|short| {
        ControlError::unavailable(format!(
            "topic '{}': {} of its {} replicas answered the fencing round of epoch {epoch}; {} are needed",
            topic.name,
            short.answered,
            replicas.len(),
            short.needed
        ))
    })
}

/// `chosen`, or a replica as up to date as it (the same last epoch and durable end: as good a
/// leader) on a better node: first one that is not draining, so that an election does not give
/// a draining node back the lead its drain moved away; then one leading no other source of the
/// same topic (`crowded`), so that one node's fault does not take every source of a topic at
/// once (without it, ties go to the lowest shard, and a topic's sources' leaders gather on one
/// node after a few elections). Ties between as good nodes go to the lowest replica.
pub fn prefer_placed(
    chosen: FenceAnswer,
    answers: &[FenceAnswer],
    excluded: Option<ShardId>,
    draining: &std::collections::BTreeSet<NodeId>,
    crowded: &std::collections::BTreeSet<NodeId>,
) -> FenceAnswer {
    let rank = |answer: &FenceAnswer| {
        let node = answer.replica.node();
        (draining.contains(&node), crowded.contains(&node))
    };
    if rank(&chosen) == (false, false) {
        return chosen;
    }
    answers
        .iter()
        .filter(|answer| Some(answer.replica) != excluded)
        .filter(|answer| (answer.last_epoch, answer.durable_end) == (chosen.last_epoch, chosen.durable_end))
        .min_by_key(|answer| (rank(answer), answer.replica))
        .filter(|better| rank(better) < rank(&chosen))
        .copied()
        .unwrap_or(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(replicas: &[u32]) -> TopicRecord {
        TopicRecord {
            id: TopicId::new(9),
            name: "replicated".into(),
            message_retention_seconds: 0,
            shard: ShardId::from_global(replicas[0]),
            created_ms: 0,
            labels: Default::default(),
            replicas: replicas.iter().copied().map(ShardId::from_global).collect(),
            epoch: 3,
        }
    }

    fn answer(node: u32, last_epoch: u64, durable_end: u64) -> FenceAnswer {
        FenceAnswer {
            replica: ShardId::from_global(node),
            last_epoch: Epoch::new(last_epoch),
            durable_end: Offset::new(durable_end),
        }
    }

    /// The most up-to-date of a quorum leads; an excluded replica neither leads nor counts.
    #[test]
    fn the_most_up_to_date_of_a_quorum_leads_and_an_excluded_replica_does_not() {
        let topic = topic(&[1, 2, 3]);
        let answers = [answer(1, 3, 10), answer(2, 3, 12)];
        assert_eq!(decide(&topic, 4, &answers, None).unwrap().replica.global(), 2);
        assert_eq!(decide(&topic, 4, &answers[..1], None).unwrap_err().code(), crate::api::Code::Unavailable);
        // Without replica 2, replicas 1 and 3 must both answer: two of three.
        let refused = decide(&topic, 4, &answers, Some(ShardId::from_global(2))).unwrap_err();
        assert!(refused.to_string().contains("1 of its replicas other than"), "{refused}");
        let answers = [answer(1, 3, 10), answer(2, 3, 12), answer(3, 2, 20)];
        assert_eq!(decide(&topic, 4, &answers, Some(ShardId::from_global(2))).unwrap().replica.global(), 1);
    }

    /// Of equally up-to-date replicas, one on a node that is not draining leads; a draining
    /// one still leads when it alone is the most up to date.
    #[test]
    fn an_election_prefers_an_equally_up_to_date_replica_off_a_draining_node() {
        let one = crate::catalog::global_shard(1, 0);
        let two = crate::catalog::global_shard(2, 0);
        let three = crate::catalog::global_shard(3, 0);
        let draining: std::collections::BTreeSet<NodeId> = [NodeId::new(1)].into();
        let answers = [answer(one, 3, 12), answer(two, 3, 12), answer(three, 3, 12)];
        let chosen = decide(&topic(&[one, two, three]), 4, &answers, None).unwrap();
        assert_eq!(chosen.replica.global(), one, "the lowest wins a tie");
        let none = std::collections::BTreeSet::new();
        assert_eq!(prefer_placed(chosen, &answers, None, &draining, &none).replica.global(), two);
        let ahead = [answer(one, 3, 13), answer(two, 3, 12)];
        assert_eq!(prefer_placed(ahead[0], &ahead, None, &draining, &none).replica.global(), one);
        assert_eq!(prefer_placed(answers[1], &answers, None, &draining, &none).replica.global(), two);
    }

    /// Of equally up-to-date replicas, one on a node leading no other source of the topic
    /// leads; not draining comes first, and one ahead still leads wherever it is.
    #[test]
    fn an_election_prefers_a_node_leading_no_other_source_of_the_topic() {
        let one = crate::catalog::global_shard(1, 0);
        let two = crate::catalog::global_shard(2, 0);
        let three = crate::catalog::global_shard(3, 0);
        let none = std::collections::BTreeSet::new();
        let crowded: std::collections::BTreeSet<NodeId> = [NodeId::new(1)].into();
        let answers = [answer(one, 3, 12), answer(two, 3, 12), answer(three, 3, 12)];
        assert_eq!(prefer_placed(answers[0], &answers, None, &none, &crowded).replica.global(), two);
        let draining: std::collections::BTreeSet<NodeId> = [NodeId::new(2)].into();
        assert_eq!(prefer_placed(answers[0], &answers, None, &draining, &crowded).replica.global(), three);
        let both: std::collections::BTreeSet<NodeId> = [NodeId::new(1), NodeId::new(3)].into();
        assert_eq!(prefer_placed(answers[0], &answers, None, &draining, &both).replica.global(), one);
        let ahead = [answer(one, 3, 13), answer(two, 3, 12)];
        assert_eq!(prefer_placed(ahead[0], &ahead, None, &none, &crowded).replica.global(), one);
        assert_eq!(
            prefer_placed(answers[0], &answers, Some(ShardId::from_global(two)), &none, &crowded)
                .replica
                .global(),
            three
        );
    }

    /// Asked-for topics are taken once; a topic whose leader's node was not heard from, or
    /// whose election failed long enough ago, is a candidate; one with a single replica never.
    #[test]
    fn candidates_are_the_asked_the_unheard_and_the_due() {
        let mut catalog = CatalogState::default();
        let mut replicated = topic(&[crate::catalog::global_shard(1, 0), crate::catalog::global_shard(2, 0)]);
        catalog.apply(CatalogEntry::TopicCreated(replicated.clone()));
        replicated.id = TopicId::new(10);
        replicated.name = "single".into();
        replicated.replicas.truncate(1);
        catalog.apply(CatalogEntry::TopicCreated(replicated));
        let elections = Elections::default();
        let (one, two) = (NodeId::new(1), NodeId::new(2));
        let now = Instant::now();
        assert!(elections.candidates(&catalog, &[one, two], now).is_empty());
        assert_eq!(elections.candidates(&catalog, &[two], now), vec![TopicId::new(9)]);
        elections.want([TopicId::new(9), TopicId::new(10)]);
        assert_eq!(elections.candidates(&catalog, &[one, two], now), vec![TopicId::new(9)]);
        assert!(elections.candidates(&catalog, &[one, two], now).is_empty(), "asked once");
        elections.failed(TopicId::new(9), now);
        assert!(elections.candidates(&catalog, &[one, two], now).is_empty());
        assert_eq!(
            elections.candidates(&catalog, &[one, two], now + ELECTION_ASK_INTERVAL),
            vec![TopicId::new(9)]
        );
        elections.elected(TopicId::new(9));
        assert!(elections.candidates(&catalog, &[one, two], now + ELECTION_ASK_INTERVAL).is_empty());
    }
}
