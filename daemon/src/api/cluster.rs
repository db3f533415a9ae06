//! What the cluster status operation reports: the catalog's raft group as the answering node
//! sees it. The catalog computes it from openraft's metrics (`Catalog::cluster_status`); a
//! protocol encodes it.

/// The catalog's raft group, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterStatus {
    /// The node that answered.
    pub node_id: u64,
    /// The catalog's leader as this node knows it; `None` during an election.
    pub catalog_leader: Option<u64>,
    pub term: u64,
    /// The last catalog index in this node's log, and the last it applied (`None`: none yet).
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    /// Every member of the catalog's group, voters and learners, in id order.
    pub nodes: Vec<NodeStatus>,
    /// Replicated topics as the answering node's applied catalog places them, in name order,
    /// at most `CLUSTER_STATUS_TOPICS_MAX`; how many more there are.
    pub topics: Vec<TopicPlacement>,
    pub topics_omitted: u64,
}

/// Most replicated topics one cluster status lists: the answer stays one modest frame
/// however many topics a cluster holds (`ringpost stats` on each node shows the rest).
pub const CLUSTER_STATUS_TOPICS_MAX: usize = 1000;

/// Where a replicated topic's replicas are, as the catalog decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicPlacement {
    pub name: String,
    /// The node whose replica leads, and the epoch it leads.
    pub leader_node: u64,
    pub epoch: u64,
    /// Every node holding a replica, the leader among them, in the catalog's order.
    pub replica_nodes: Vec<u64>,
}

/// One member of the catalog's group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStatus {
    pub node_id: u64,
    pub cluster_address: String,
    /// Where its router serves clients (empty until it registered).
    pub router_address: String,
    /// A voter, or else a learner.
    pub voter: bool,
    /// "leader", "follower", "candidate", "learner", or "unknown" when only the leader could tell.
    pub role: String,
    /// The leader's view: the highest catalog index this node is known to hold (None when unknown).
    pub matched_index: Option<u64>,
}
