//! Draining a node (`ringpost cluster drain NODE`), so that it can be stopped, upgraded and
//! started again with no client error. The catalog records the node as draining
//! (`CatalogEntry::NodeDraining`, so a restart keeps it drained), and from then on:
//!
//! 1. every router leaves its forwarders out of every lookup list (`handed_out`) but as the
//!    leader of what it still leads, which stays first: a native publish goes to its topic's
//!    leader and is not relayed, so a list without it would fail publishers until the
//!    leadership moved (seconds), and for good for a topic of one replica. Clients that hold an
//!    older list still reach the node, and are relayed or answered `NotOwner` there;
//! 2. placement puts its forwarders last (`draining_last`): a new topic's leader is elsewhere,
//!    and a replica lands there only when the count asked for needs every node;
//! 3. the catalog's leader moves each replicated topic's leadership off it (`drain_pass`): an
//!    election that excludes the draining replica, as a replica move's first step does, then
//!    hands its own lead of the catalog to another voter if the node leads it;
//! 4. elections prefer, among equally up-to-date replicas, one on a node that is not draining
//!    (`elections::prefer_placed`), so that a later election does not bring the lead back.
//!
//! A topic of one replica cannot move without its data: like a Kafka partition with one
//! replica, it stays, served through the other nodes' relays while the node runs, and is
//! named in the drain's status (`drain_status`) so the operator knows the node is not empty
//! (move it by recreating it, or accept its pause while the node restarts). The node's follower
//! replicas stay too: the other replicas are a quorum without them. Undraining changes only the
//! record: leaderships stay where the drain moved them (nothing balances leaders back).
//!
//! A topic's publish sources after the first (`SourceRecord`) are units of their own, elected
//! as topics are (`CatalogState::unit_by_id`): a replicated source's leadership moves as a
//! topic's does, and a source of one replica stays and is named (`topic#n`).

use super::elections::{self, ELECTIONS_IN_FLIGHT_MAX, SOURCE_FAILURE_TIMEOUT};
use super::{ControlError, Router};
use crate::api::cluster::{NodeDrain, DRAIN_TOPICS_NAMED_MAX};
use crate::catalog::placement::source_key;
use crate::catalog::{CatalogEntry, CatalogState};
use crate::ids::{NodeId, ShardId, TopicId};
use crate::storage::Storage;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

/// How often the catalog's leader looks for leaderships to move off draining nodes: each
/// pass starts the elections it finds (at most `ELECTIONS_IN_FLIGHT_MAX` with the others), so
/// a pass that found some waits this long before it looks again.
pub const DRAIN_PASS_INTERVAL: Duration = Duration::from_secs(1);

/// The forwarders handed out to a client, in the order given, those of draining nodes left out
/// but `owner`, the resource's leader, while it leads there; never an empty list.
pub fn handed_out(order: Vec<ShardId>, owner: ShardId, draining: &BTreeSet<NodeId>) -> Vec<ShardId> {
    if draining.is_empty() || order.iter().all(|shard| draining.contains(&shard.node())) {
        return order;
    }
    order.into_iter().filter(|shard| *shard == owner || !draining.contains(&shard.node())).collect()
}

/// Placement's order of preference with the forwarders of draining nodes moved to the end,
/// each part in its order: a draining node is placed on only when no other will do.
pub fn draining_last(order: Vec<ShardId>, draining: &BTreeSet<NodeId>) -> Vec<ShardId> {
    let (kept, last): (Vec<ShardId>, Vec<ShardId>) =
        order.into_iter().partition(|shard| !draining.contains(&shard.node()));
    kept.into_iter().chain(last).collect()
}

/// The replicated units (topics and their later sources) whose leader is on a draining node
/// and that have a replica on a node that is not (the election's candidates), with that
/// leader.
pub fn leaderships_to_move(state: &CatalogState) -> Vec<(TopicId, ShardId)> {
    let topics = state.topics.values().map(|topic| (topic.id, topic.shard, &topic.replicas));
    let sources = state.sources.values().map(|source| (source.id, source.shard, &source.replicas));
    topics
        .chain(sources)
        .filter(|(_, leader, replicas)| replicas.len() > 1 && state.draining.contains(&leader.node()))
        .filter(|(_, _, replicas)| replicas.iter().any(|replica| !state.draining.contains(&replica.node())))
        .map(|(id, leader, _)| (id, leader))
        .collect()
}

/// What each draining node still holds, in node order, as `state` says; `catalog_leader` is
/// the node leading the catalog, if known.
pub fn drain_status(state: &CatalogState, catalog_leader: Option<NodeId>) -> Vec<NodeDrain> {
    state
        .draining
        .iter()
        .map(|node_id| {
            let mut drain = NodeDrain {
                node_id: *node_id,
                leads_catalog: catalog_leader == Some(*node_id),
                ..NodeDrain::default()
            };
            // Each unit led there: a topic's own log by its name, a later source as `topic#n`.
            let topics = state
                .topics
                .values()
                .map(|topic| (topic.shard, topic.replicas.len(), topic.name.to_string()));
            let sources = state.sources.values().filter_map(|source| {
                let topic = state.topic_by_id(source.topic_id)?;
                Some((source.shard, source.replicas.len(), source_key(&topic.name, source.source.get())))
            });
            for (_, replicas, name) in
                topics.chain(sources).filter(|(leader, _, _)| leader.node() == *node_id)
            {
                if replicas > 1 {
                    drain.leaderships += 1;
                } else {
                    drain.single_replica_count += 1;
                    if drain.single_replica_topics.len() < DRAIN_TOPICS_NAMED_MAX {
                        drain.single_replica_topics.push(name);
                    }
                }
            }
            drain
        })
        .collect()
}

/// Refuses a drain of a node the catalog has not registered, and one that would leave every
/// registered node draining (clients would have no forwarder to be handed, and leaderships
/// nowhere to go). An undrain of a node not draining is answered as done.
pub fn check_drain(state: &CatalogState, node_id: NodeId, draining: bool) -> Result<(), ControlError> {
    if !state.nodes.contains_key(&node_id) {
        return Err(ControlError::not_found(format!(
            "node {node_id} is not a registered member of the cluster"
        )));
    }
    if draining && state.nodes.keys().all(|node| *node == node_id || state.draining.contains(node)) {
        return Err(ControlError::failed_precondition(format!(
            "node {node_id} is the last node not draining: undrain another first"
        )));
    }
    Ok(())
}

/// The voter the catalog's lead goes to from a leader that drains or leaves (`leaving`): the
/// first of `voters` (the furthest in the log first, `Catalog::voters_by_progress`) heard
/// lately (`heard`) that is not leaving.
pub fn catalog_successor(voters: &[NodeId], heard: &[NodeId], leaving: &BTreeSet<NodeId>) -> Option<NodeId> {
    voters.iter().copied().find(|voter| heard.contains(voter) && !leaving.contains(voter))
}

impl<S: Storage> Router<S> {
    /// Records node `node_id` as draining (or no longer), on the catalog's leader; the leader's
    /// timers then move its leaderships (`drain_pass`).
    pub async fn drain_node(&self, node_id: NodeId, draining: bool) -> Result<(), ControlError> {
        self.check_leads()?;
        let checked = check_drain(&self.state.borrow(), node_id, draining);
        checked?;
        if self.state.borrow().draining.contains(&node_id) == draining {
            return Ok(());
        }
        self.propose(CatalogEntry::NodeDraining { node_id, draining }).await?;
        let what = if draining { "draining" } else { "no longer draining" };
        crate::log_info!("ringpostd: node {node_id} is {what}");
        Ok(())
    }

    /// What each draining node still holds, from this node's applied catalog.
    pub fn drain_status(&self) -> Vec<NodeDrain> {
        drain_status(&self.state.borrow(), self.catalog.leader())
    }

    /// On the catalog's leader, at most once per `DRAIN_PASS_INTERVAL`: starts an election
    /// excluding the draining replica for each topic led on a draining node; once none is
    /// left and this node drains, hands the catalog's lead to another voter.
    pub(super) fn drain_pass(self: &Rc<Self>) {
        if !self.catalog.leads() {
            return;
        }
        let now = crate::runtime::now();
        if self.drain_passed.get().is_some_and(|at| now - at < DRAIN_PASS_INTERVAL) {
            return;
        }
        self.drain_passed.set(Some(now));
        let (moves, draining) = {
            let state = self.state.borrow();
            if state.draining.is_empty() {
                return;
            }
            (leaderships_to_move(&state), state.draining.clone())
        };
        if moves.is_empty() && draining.contains(&self.node_id()) {
            self.hand_catalog_lead_over(&draining);
        }
        for (topic_id, leader) in moves {
            if self.replicas.elections.in_flight() >= ELECTIONS_IN_FLIGHT_MAX {
                break;
            }
            if !self.replicas.elections.begin(topic_id) {
                continue;
            }
            let router = self.clone();
            crate::runtime::spawn(async move {
                router.move_leadership(topic_id, leader).await;
                router.replicas.elections.end(topic_id);
            })
            .detach();
        }
    }

    /// Elects a leader of `topic_id` other than `leader`, if it still leads.
    async fn move_leadership(&self, topic_id: TopicId, leader: ShardId) {
        let name = match self.state.borrow().unit_by_id(topic_id) {
            Some(unit) if unit.shard == leader => self.state.borrow().unit_shown(topic_id),
            _ => return,
        };
        match elections::elect(self, topic_id, Some(leader)).await {
            Ok(()) => crate::log_info!("ringpostd: {name}: leadership moved off draining {leader}"),
            Err(error) => crate::log_warn!(
                "ringpostd: {name}: moving its leadership off draining {leader}: {error}; tried again in {} s",
                DRAIN_PASS_INTERVAL.as_secs()
            ),
        }
    }

    fn hand_catalog_lead_over(self: &Rc<Self>, draining: &BTreeSet<NodeId>) {
        let heard = self.catalog.voters_heard_within(SOURCE_FAILURE_TIMEOUT).unwrap_or_default();
        let voters = self.catalog.voters_by_progress();
        let Some(successor) = catalog_successor(&voters, &heard, draining) else {
            crate::log_warn!(
                "ringpostd: this node drains and leads the catalog, and no other voter can take the lead"
            );
            return;
        };
        let router = self.clone();
        crate::runtime::spawn(async move {
            match router.catalog.transfer_leadership(successor).await {
                Ok(()) => crate::log_info!(
                    "ringpostd: this node drains: asked node {successor} to lead the catalog"
                ),
                Err(error) => crate::log_warn!(
                    "ringpostd: this node drains: handing the catalog's lead to node {successor}: {error}"
                ),
            }
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{NodeRecord, TopicRecord};

    fn shard(node: u64, local: u32) -> ShardId {
        ShardId::new(NodeId::new(node), local)
    }

    fn nodes(ids: &[u64]) -> BTreeSet<NodeId> {
        ids.iter().copied().map(NodeId::new).collect()
    }

    fn topic(id: u64, name: &str, replicas: &[ShardId]) -> TopicRecord {
        TopicRecord {
            id: TopicId::new(id),
            name: name.into(),
            message_retention_seconds: 0,
            shard: replicas[0],
            created_ms: 0,
            labels: Default::default(),
            replicas: if replicas.len() > 1 { replicas.to_vec() } else { Vec::new() },
            epoch: u64::from(replicas.len() > 1),
        }
    }

    fn cluster(draining: &[u64]) -> CatalogState {
        let mut state = CatalogState::default();
        for id in 1..=3 {
            let mut node = NodeRecord::admitted(NodeId::new(id), format!("10.0.0.{id}:7460"));
            node.forwarders = vec![format!("10.0.0.{id}:7451"), format!("10.0.0.{id}:7452")];
            state.apply(CatalogEntry::NodeRegistered(node));
        }
        for id in draining {
            state.apply(CatalogEntry::NodeDraining { node_id: NodeId::new(*id), draining: true });
        }
        state
    }

    /// A lookup list leaves out the draining node's forwarders but the leader while it leads
    /// there, and keeps the rest's order; a list with nothing else is handed out whole rather
    /// than empty.
    #[test]
    fn hand_outs_leave_draining_nodes_out_but_their_leader_and_never_empty_a_list() {
        let order = vec![shard(2, 0), shard(1, 1), shard(2, 1), shard(3, 0)];
        assert_eq!(handed_out(order.clone(), shard(2, 0), &nodes(&[])), order);
        assert_eq!(
            handed_out(order.clone(), shard(2, 0), &nodes(&[2])),
            vec![shard(2, 0), shard(1, 1), shard(3, 0)]
        );
        let moved = vec![shard(1, 1), shard(2, 0), shard(2, 1), shard(3, 0)];
        assert_eq!(handed_out(moved, shard(1, 1), &nodes(&[2])), vec![shard(1, 1), shard(3, 0)]);
        assert_eq!(handed_out(vec![shard(2, 0)], shard(2, 0), &nodes(&[2])), vec![shard(2, 0)]);
        assert_eq!(
            draining_last(order, &nodes(&[2])),
            vec![shard(1, 1), shard(3, 0), shard(2, 0), shard(2, 1)]
        );
    }

    /// The leaderships that move are the replicated topics led on a draining node with a
    /// replica elsewhere; a topic of one replica stays and is named, and the status counts
    /// what is left and whether the node leads the catalog.
    #[test]
    fn replicated_leaderships_move_and_single_replica_topics_are_named() {
        let mut state = cluster(&[2]);
        let topics = [
            topic(10, "led-on-two", &[shard(2, 0), shard(1, 0), shard(3, 1)]),
            topic(11, "led-on-one", &[shard(1, 1), shard(2, 1), shard(3, 0)]),
            topic(12, "single-on-two", &[shard(2, 1)]),
            topic(13, "single-on-three", &[shard(3, 1)]),
        ];
        for topic in topics {
            state.apply(CatalogEntry::TopicCreated(topic));
        }
        assert_eq!(leaderships_to_move(&state), vec![(TopicId::new(10), shard(2, 0))]);
        let status = drain_status(&state, Some(NodeId::new(2)));
        assert_eq!(status.len(), 1);
        let drain = &status[0];
        assert_eq!((drain.node_id, drain.leaderships, drain.leads_catalog), (NodeId::new(2), 1, true));
        assert_eq!(
            (drain.single_replica_count, drain.single_replica_topics.clone()),
            (1, vec!["single-on-two".into()])
        );
        assert!(!drain.is_empty());
        // Once elected elsewhere and the topic of one replica deleted, it is empty.
        state.apply(CatalogEntry::TopicLeaderElected { id: TopicId::new(10), epoch: 2, leader: shard(1, 0) });
        state.apply(CatalogEntry::TopicDeleted { id: TopicId::new(12) });
        assert!(leaderships_to_move(&state).is_empty());
        assert!(drain_status(&state, Some(NodeId::new(1)))[0].is_empty());
        // A topic whose every replica drains has nowhere to go.
        let mut state = cluster(&[2, 3]);
        state.apply(CatalogEntry::TopicCreated(topic(10, "t", &[shard(2, 0), shard(3, 0)])));
        assert!(leaderships_to_move(&state).is_empty());
    }

    /// A replicated source led on a draining node moves as a topic does, by its unit id; a
    /// source of one replica stays and is named `topic#n`.
    #[test]
    fn a_sources_leadership_moves_and_a_single_replica_source_is_named() {
        let mut state = cluster(&[2]);
        state.apply(CatalogEntry::TopicCreated(topic(10, "hot", &[shard(1, 0), shard(2, 0), shard(3, 0)])));
        let source = |id: u64, number: u32, replicas: &[ShardId]| crate::catalog::SourceRecord {
            id: TopicId::new(id),
            topic_id: TopicId::new(10),
            source: crate::ids::SourceId::new(number).unwrap(),
            shard: replicas[0],
            created_ms: 0,
            replicas: if replicas.len() > 1 { replicas.to_vec() } else { Vec::new() },
            epoch: u64::from(replicas.len() > 1),
            retiring: false,
        };
        state.apply(CatalogEntry::SourceAdded(source(11, 1, &[shard(2, 1), shard(1, 1), shard(3, 1)])));
        state.apply(CatalogEntry::TopicCreated(topic(20, "cold", &[shard(1, 0)])));
        let single =
            crate::catalog::SourceRecord { topic_id: TopicId::new(20), ..source(21, 1, &[shard(2, 1)]) };
        state.apply(CatalogEntry::SourceAdded(single));
        assert_eq!(leaderships_to_move(&state), vec![(TopicId::new(11), shard(2, 1))]);
        let drain = &drain_status(&state, None)[0];
        assert_eq!((drain.leaderships, drain.single_replica_count), (1, 1));
        assert_eq!(drain.single_replica_topics, vec!["cold#1".to_owned()]);
        state.apply(CatalogEntry::TopicLeaderElected { id: TopicId::new(11), epoch: 2, leader: shard(3, 1) });
        assert!(leaderships_to_move(&state).is_empty());
        assert_eq!(drain_status(&state, None)[0].leaderships, 0);
    }

    /// A drain names a registered node and keeps one node undrained; the catalog's lead goes
    /// to a voter heard that is not draining.
    #[test]
    fn a_drain_keeps_one_node_undrained_and_the_catalog_lead_goes_to_one() {
        let state = cluster(&[2]);
        assert!(check_drain(&state, NodeId::new(1), true).is_ok());
        assert_eq!(check_drain(&state, NodeId::new(9), true).unwrap_err().code(), crate::api::Code::NotFound);
        let state = cluster(&[2, 3]);
        let refused = check_drain(&state, NodeId::new(1), true).unwrap_err();
        assert!(refused.to_string().contains("last node not draining"), "{refused}");
        assert!(check_drain(&state, NodeId::new(1), false).is_ok());
        assert!(check_drain(&state, NodeId::new(2), true).is_ok(), "draining again is no change");
        let voters = [NodeId::new(1), NodeId::new(2), NodeId::new(3)];
        let heard = [NodeId::new(1), NodeId::new(3)];
        assert_eq!(catalog_successor(&voters, &heard, &nodes(&[1])), Some(NodeId::new(3)));
        assert_eq!(catalog_successor(&voters, &heard, &nodes(&[1, 3])), None);
    }
}
