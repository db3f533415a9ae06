//! What the cluster status operation reports: the catalog's raft group as the answering node
//! sees it. The catalog computes it from openraft's metrics (`Catalog::cluster_status`); a
//! protocol encodes it.

use crate::ids::NodeId;

/// The catalog's raft group, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterStatus {
    /// The node that answered.
    pub node_id: NodeId,
    /// The catalog's leader as this node can vouch for it: `None` during an election, on a
    /// leader that has not heard from a majority of its voters within
    /// `LEADER_CONTACT_LOST_AFTER`, and on a node that has not heard from its leader as long.
    pub catalog_leader: Option<NodeId>,
    pub term: u64,
    /// The last catalog index in this node's log, and the last it applied (`None`: none yet).
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    /// Every member of the catalog's group, voters and learners, in id order.
    pub nodes: Vec<NodeStatus>,
    /// Replicated topics as the answering node's applied catalog places them, in name order,
    /// each followed by its sources after the first as `topic#n`, at most
    /// `CLUSTER_STATUS_TOPICS_MAX` rows; how many more there are.
    pub topics: Vec<TopicPlacement>,
    pub topics_omitted: u64,
    /// Why the answering node does not serve as a member of the cluster, if it does not: it
    /// lost contact with its majority or its leader, has no leader, waits to be added, or was
    /// removed (`catalog::standing`). What `/readyz` says.
    pub not_serving: Option<String>,
    /// Whose view the members' roles and liveness are, when not the leader's: empty when they
    /// are the leader's.
    pub note: String,
}

/// Most topics one cluster status lists: the answer stays one modest frame however many topics
/// a cluster holds (`ringpost stats` on each node shows the rest).
pub const CLUSTER_STATUS_TOPICS_MAX: usize = 1000;

/// Where a topic's replicas are, as the catalog decided (one for a topic of one replica).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicPlacement {
    pub name: String,
    /// The node whose replica leads, and the epoch it leads.
    pub leader_node: NodeId,
    pub epoch: u64,
    /// Every node holding a replica, the leader among them, in the catalog's order.
    pub replica_nodes: Vec<NodeId>,
}

/// One member of the catalog's group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub cluster_address: String,
    /// Where its router serves clients (empty until it registered).
    pub router_address: String,
    /// A voter, or else a learner.
    pub voter: bool,
    /// "leader", "follower", "candidate", "learner", "unreachable" (the leader has not heard
    /// from it within `MEMBER_UNREACHABLE_AFTER`, or it is the leader this node no longer
    /// hears), "leader-without-quorum" (it leads, heard by no majority within
    /// `LEADER_CONTACT_LOST_AFTER`), "removed", "joining", or "unknown" when only the leader
    /// could tell.
    pub role: String,
    /// The leader's view: the highest catalog index this node is known to hold (None when unknown).
    pub matched_index: Option<u64>,
    /// The leader's view: how long ago this member last answered it, in milliseconds (0 for the
    /// leader itself; None when unknown: never, or not the leader's view).
    pub heard_ms_ago: Option<u64>,
}

/// A draining node (`ringpost cluster drain`) and what it still holds, as the answering node's
/// applied catalog says. It is empty, and can be stopped with no client noticing beyond a
/// reconnection, once it leads no topic and not the catalog: the follower replicas it holds
/// stay (the other replicas are a quorum without it), and a topic of one replica cannot move
/// without its data (named here, so the operator knows the node is not yet empty).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeDrain {
    pub node_id: NodeId,
    /// Replicated topics whose leader is still on the node.
    pub leaderships: u64,
    /// Whether the node still leads the catalog.
    pub leads_catalog: bool,
    /// Topics of one replica on the node, in name order, at most `DRAIN_TOPICS_NAMED_MAX`;
    /// how many there are in all.
    pub single_replica_topics: Vec<String>,
    pub single_replica_count: u64,
}

/// Most topics of one replica a drain's status names: it stays one small frame.
pub const DRAIN_TOPICS_NAMED_MAX: usize = 20;

impl NodeDrain {
    /// Whether the node holds nothing a client needs it for.
    pub fn is_empty(&self) -> bool {
        self.leaderships == 0 && !self.leads_catalog && self.single_replica_count == 0
    }
}
