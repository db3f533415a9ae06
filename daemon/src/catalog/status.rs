//! The catalog's raft group as this node sees it, from openraft's metrics: who leads, the term,
//! how far the log goes and is applied, and each member with its role and, on the leader, how
//! far it is replicated.

use super::Catalog;
use crate::api::cluster::{ClusterStatus, NodeStatus};
use crate::storage::Storage;
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;
use std::collections::BTreeMap;

impl<S: Storage> Catalog<S> {
    /// The catalog's group now, as this node's metrics report it.
    pub fn cluster_status(&self) -> ClusterStatus {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let members: BTreeMap<u64, bool> = membership
            .voter_ids()
            .map(|id| (id, true))
            .chain(membership.learner_ids().map(|id| (id, false)))
            .collect();
        let leading = metrics.state == ServerState::Leader;
        let nodes = members
            .into_iter()
            .map(|(node_id, voter)| {
                let role = if node_id == metrics.id {
                    role_name(metrics.state)
                } else if Some(node_id) == metrics.current_leader {
                    "leader"
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
                    .and_then(|replication| replication.get(&node_id).cloned().flatten())
                    .map(|matched| matched.index);
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
                }
            })
            .collect();
        ClusterStatus {
            node_id: metrics.id,
            catalog_leader: metrics.current_leader,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index,
            last_applied_index: metrics.last_applied.map(|applied| applied.index),
            nodes,
            ..ClusterStatus::default()
        }
    }

    /// The address member `node_id` is reached at by its peers.
    fn member_address(&self, node_id: u64) -> String {
        self.state().nodes.get(&node_id).map(|node| node.cluster_address.clone()).unwrap_or_default()
    }
}

fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "unknown",
    }
}
