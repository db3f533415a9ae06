//! The catalog's raft group as this node sees it, from openraft's metrics and this node's
//! standing (`standing`): who leads, the term, how far the log goes and is applied, and each
//! member with its role and, on the leader, how far it is replicated and when it last answered.

use super::standing::{self, Standing};
use super::Catalog;
use crate::api::cluster::{ClusterStatus, NodeStatus};
use crate::ids::NodeId;
use crate::storage::Storage;
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

impl<S: Storage> Catalog<S> {
    /// The catalog's group now, as this node's metrics report it.
    pub fn cluster_status(&self) -> ClusterStatus {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let observed = self.observe();
        let standing = standing::standing(&observed);
        let unreachable = standing::unreachable_members(&observed);
        // openraft's leader keeps each member's last answer, whether or not a majority answers.
        let this_node = NodeId::new(metrics.id);
        let leading = metrics.current_leader == Some(metrics.id);
        let nodes = observed
            .members
            .iter()
            .map(|(&node_id, &voter)| {
                let role = if node_id == this_node {
                    own_role(&standing, metrics.state)
                } else if leading && unreachable.contains(&node_id) {
                    "unreachable"
                } else if Some(node_id.get()) == metrics.current_leader {
                    // Named as leader only while this node hears it.
                    match standing {
                        Standing::Follows { .. } => "leader",
                        Standing::LeaderSilent { .. } => "unreachable",
                        _ => "unknown",
                    }
                } else if !voter {
                    "learner"
                } else if leading {
                    "follower"
                } else {
                    "unknown"
                };
                let matched_index = metrics
                    .replication
                    .as_ref()
                    .and_then(|replication| replication.get(&node_id.get()).cloned().flatten())
                    .map(|matched| matched.index);
                let heard_ms_ago = if !leading {
                    None
                } else if node_id == this_node {
                    Some(0)
                } else {
                    observed
                        .members_heard_ago
                        .get(&node_id)
                        .copied()
                        .flatten()
                        .map(|ago| ago.as_millis() as u64)
                };
                NodeStatus {
                    node_id,
                    cluster_address: self.member_address(node_id),
                    router_address: self
                        .state()
                        .nodes
                        .get(&node_id)
                        .map(|node| node.router_address.clone())
                        .unwrap_or_default(),
                    voter,
                    role: role.to_owned(),
                    matched_index,
                    heard_ms_ago,
                }
            })
            .collect();
        ClusterStatus {
            node_id: this_node,
            catalog_leader: standing.reported_leader(this_node),
            term: metrics.current_term,
            last_log_index: metrics.last_log_index,
            last_applied_index: metrics.last_applied.map(|applied| applied.index),
            nodes,
            not_serving: standing.not_ready(this_node),
            note: if leading { String::new() } else { format!("node {}'s own view", metrics.id) },
            ..ClusterStatus::default()
        }
    }

    /// The address member `node_id` is reached at by its peers.
    fn member_address(&self, node_id: NodeId) -> String {
        self.state().nodes.get(&node_id).map(|node| node.cluster_address.clone()).unwrap_or_default()
    }
}

/// This node's role as it reports it: openraft's, unless its standing says otherwise.
fn own_role(standing: &Standing, state: ServerState) -> &'static str {
    match standing {
        Standing::LeadsWithoutQuorum { .. } => "leader-without-quorum",
        Standing::Removed => "removed",
        Standing::Joining => "joining",
        _ => match state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "unknown",
        },
    }
}
