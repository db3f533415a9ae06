//! The router's part in the cluster's membership: adding a node (a learner of the catalog
//! brought up to date, then, if asked, a voter) and removing one once its replicas are moved
//! (`moves.rs`). Both run on the catalog's leader; other nodes carry the request there.

use super::ControlError;
use super::Router;
use crate::catalog::{CatalogEntry, NodeRecord};
use crate::ids::{NodeId, ShardId};
use crate::storage::Storage;
use std::time::Duration;

/// How long an add waits for the new node to catch up with the catalog's log before it
/// answers; the node stays a learner and catches up later if it takes longer.
pub const NODE_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a node carrying a membership change to the catalog's leader waits for its answer:
/// an addition waits for the node to catch up, a removal for its replicas to move.
pub const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a leader asked to remove itself waits for the voter it hands the lead to.
const LEADER_HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// What a removal did.
#[derive(Debug, PartialEq, Eq)]
pub enum NodeRemoval {
    Removed,
    /// The node to remove led the catalog and handed the lead to node `.0`, which decides the
    /// removal: the request is carried there.
    HandedOver(NodeId),
}

/// Most topics a refused removal names.
const REMOVAL_TOPICS_NAMED_MAX: usize = 5;

/// The largest node id: a topic's shard keeps a node's id less one in its high 16 bits.
pub const NODE_ID_MAX: u64 = 1 << crate::catalog::entry::NODE_SHARD_BITS;

impl<S: Storage> Router<S> {
    /// Adds node `node_id`, reached by the other nodes at `cluster_address` (its cluster
    /// port), to the cluster: a learner of the catalog first, a voter if `voter`. The node
    /// must run with `--join`; it registers its forwarders once it has caught up, and
    /// placement counts them from then on. Adding a member again with the same address is
    /// answered as done (or promotes a learner to voter).
    pub async fn add_node(
        &self,
        node_id: NodeId,
        cluster_address: &str,
        voter: bool,
    ) -> Result<(), ControlError> {
        self.check_leads()?;
        if node_id.get() == 0 || node_id.get() > NODE_ID_MAX {
            return Err(ControlError::invalid_argument(format!(
                "node id {node_id}: give 1 to {NODE_ID_MAX}"
            )));
        }
        let address: std::net::SocketAddr = cluster_address.parse().map_err(|_| {
            ControlError::invalid_argument(format!(
                "'{cluster_address}' is not an address (IP:PORT of its cluster port)"
            ))
        })?;
        let members = self.catalog.members();
        let known = self.state.borrow().nodes.get(&node_id).map(|record| record.cluster_address.clone());
        if members.contains_key(&node_id) {
            if let Some(known) = known.as_ref().filter(|known| known.parse().ok() != Some(address)) {
                return Err(ControlError::already_exists(format!(
                    "node {node_id} is a member already, at {known}: remove it first to add it at another address"
                )));
            }
        }
        let taken = self.state.borrow().nodes.values().find_map(|record| {
            (record.node_id != node_id && record.cluster_address.parse().ok() == Some(address))
                .then_some(record.node_id)
        });
        if let Some(other) = taken {
            return Err(ControlError::already_exists(format!("node {other} is at {address} already")));
        }
        let voters = members.values().filter(|voter| **voter).count();
        if voter && members.get(&node_id) != Some(&true) && voters >= crate::node::CLUSTER_VOTERS_MAX {
            return Err(ControlError::failed_precondition(format!(
                "the catalog has {voters} voters, the most it takes (CLUSTER_VOTERS_MAX); add node {node_id} as a learner"
            )));
        }
        if known.as_deref().and_then(|known| known.parse().ok()) != Some(address) {
            // The leader reaches a member at the address its record gives; so will every later
            // leader, which applies this record before it could lead.
            self.propose(CatalogEntry::NodeRegistered(NodeRecord::admitted(node_id, address.to_string())))
                .await?;
        }
        Ok(self.catalog.add_member(node_id, voter, NODE_CATCH_UP_TIMEOUT).await?)
    }

    /// Removes node `node_id` from the cluster: its replicas moved to other nodes first, then
    /// it leaves the catalog's group and placement. Refused while a topic of one replica is on
    /// it (it has nowhere to be copied from once the node goes): delete those first. The
    /// catalog's leader hands its leadership to another voter rather than remove itself
    /// (`NodeRemoval::HandedOver`), so that the new leader decides.
    pub async fn remove_node(&self, node_id: NodeId) -> Result<NodeRemoval, ControlError> {
        self.check_leads()?;
        let members = self.catalog.members();
        let registered = self.state.borrow().nodes.contains_key(&node_id);
        if !members.contains_key(&node_id) && !registered {
            return Err(ControlError::not_found(format!("node {node_id} is not a member of the cluster")));
        }
        let other_voters: Vec<NodeId> =
            members.iter().filter(|(id, voter)| **voter && **id != node_id).map(|(id, _)| *id).collect();
        if members.get(&node_id) == Some(&true) && other_voters.is_empty() {
            return Err(ControlError::failed_precondition(format!(
                "node {node_id} is the catalog's only voter"
            )));
        }
        if node_id == self.node_id() {
            // Not worth a change of leader if the removal cannot be done.
            self.check_holds_nothing(node_id, true)?;
            let heard = self.catalog.voters_heard_within(super::elections::SOURCE_FAILURE_TIMEOUT);
            let voters = self.catalog.voters_by_progress();
            let to = super::drain::catalog_successor(
                &voters,
                heard.as_deref().unwrap_or(&voters),
                &[node_id].into(),
            )
            .unwrap_or(other_voters[0]);
            self.catalog.transfer_leadership(to).await?;
            let started = crate::runtime::now();
            while crate::runtime::now() - started < LEADER_HANDOVER_WAIT {
                match self.catalog.leader() {
                    Some(leader) if leader != node_id => return Ok(NodeRemoval::HandedOver(leader)),
                    _ => crate::runtime::sleep(Duration::from_millis(50)).await,
                }
            }
            return Err(ControlError::unavailable(format!(
                "node {node_id} leads the catalog and asked node {to} to take the lead, which it has not yet; try again"
            )));
        }
        // A topic of one replica cannot move: named before anything moves, rather than after
        // every replicated topic was moved for nothing.
        self.check_holds_nothing(node_id, true)?;
        self.draining.borrow_mut().insert(node_id);
        let removed = async {
            // A create that chose its forwarder before the node was marked may still place a
            // topic of one replica there: once those are decided, a second look sees it, before
            // anything moves (placement skips the node from now on).
            self.creates_decided().await;
            self.check_holds_nothing(node_id, true)?;
            self.remove_drained(node_id).await
        }
        .await;
        self.draining.borrow_mut().remove(&node_id);
        removed.map(|()| NodeRemoval::Removed)
    }

    /// Waits until no topic's creation is in flight on this leader, at most
    /// `CATALOG_PROPOSE_TIMEOUT` (what one creation's decision may take): creations that keep
    /// coming are not waited for past it, and the check after the removal still names theirs.
    async fn creates_decided(&self) {
        let started = crate::runtime::now();
        while self.creating_topics() > 0
            && crate::runtime::now() - started < crate::catalog::CATALOG_PROPOSE_TIMEOUT
        {
            crate::runtime::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn remove_drained(&self, node_id: NodeId) -> Result<(), ControlError> {
        let moved = self.move_replicas_off(node_id).await?;
        if moved > 0 {
            crate::log_info!("ringpostd: moved {moved} replica(s) off node {node_id}");
        }
        self.check_holds_nothing(node_id, false)?;
        self.catalog.remove_member(node_id).await?;
        self.propose(CatalogEntry::NodeRemoved { node_id }).await?;
        // A create decided before this leader drained the node may have placed a topic there.
        self.check_holds_nothing(node_id, false)
    }

    /// Refuses while a topic or a source is on node `node_id` (with `single_only`, one of one
    /// replica), naming some (a source as `topic#n`).
    fn check_holds_nothing(&self, node_id: NodeId, single_only: bool) -> Result<(), ControlError> {
        let held = units_held(&self.state.borrow(), node_id, single_only);
        if held.is_empty() {
            return Ok(());
        }
        let named: Vec<&str> = held.iter().take(REMOVAL_TOPICS_NAMED_MAX).map(String::as_str).collect();
        Err(ControlError::failed_precondition(format!(
            "node {node_id} holds {} topic(s) ({}{}): a topic of one replica cannot move (delete it first); \
             a replicated one placed there meanwhile moves when the removal runs again",
            held.len(),
            named.join(", "),
            if held.len() > named.len() { ", …" } else { "" }
        )))
    }
}

/// The topics and sources (as `topic#n`) with a replica on node `node_id` (with `single_only`,
/// those of one replica there). A topic's later sources are units of their own, on nodes of
/// their own: a source of one replica there is as stuck as a topic of one.
fn units_held(state: &crate::catalog::CatalogState, node_id: NodeId, single_only: bool) -> Vec<String> {
    let holds = |shard: ShardId, replicas: &[ShardId]| {
        let single = replicas.len() <= 1 && shard.node() == node_id;
        single || !single_only && replicas.iter().any(|replica| replica.node() == node_id)
    };
    let topics = state.topics.values().filter(|topic| holds(topic.shard, &topic.replicas));
    let sources = state.sources.values().filter(|source| holds(source.shard, &source.replicas));
    topics
        .map(|topic| topic.name.to_string())
        .chain(sources.map(|source| {
            let topic = state.topic_names.get(&source.topic_id).map_or("?", |name| &**name);
            crate::catalog::placement::source_key(topic, source.source.get())
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::units_held;
    use crate::catalog::{Applied, CatalogEntry, CatalogState, SourceRecord, TopicRecord};
    use crate::ids::{NodeId, ShardId, SourceId, TopicId};

    fn shard(node: u64, local: u32) -> ShardId {
        ShardId::new(NodeId::new(node), local)
    }

    /// A node holding only a topic's later source of one replica holds something that cannot
    /// move: its removal would leave that source's acknowledged messages nowhere (found by the
    /// cluster simulation with topics of several sources, seed 14, when only topics counted).
    #[test]
    fn a_source_of_one_replica_holds_its_node_as_a_topic_of_one_does() {
        let mut state = CatalogState::default();
        state.apply(CatalogEntry::TopicCreated(TopicRecord {
            id: TopicId::new(9),
            name: "hot".into(),
            message_retention_seconds: 60,
            shard: shard(1, 0),
            created_ms: 1,
            labels: Default::default(),
            replicas: Vec::new(),
            epoch: 0,
        }));
        let source = SourceRecord {
            id: TopicId::new(12),
            topic_id: TopicId::new(9),
            source: SourceId::new(1).unwrap(),
            shard: shard(2, 0),
            created_ms: 2,
            replicas: Vec::new(),
            epoch: 0,
            retiring: false,
        };
        assert_eq!(state.apply(CatalogEntry::SourceAdded(source)), Applied::Done);
        assert_eq!(units_held(&state, NodeId::new(1), true), ["hot"]);
        assert_eq!(units_held(&state, NodeId::new(2), true), ["hot#1"]);
        assert_eq!(units_held(&state, NodeId::new(2), false), ["hot#1"]);
        assert!(units_held(&state, NodeId::new(3), false).is_empty());
    }
}
