//! What the router tells of this node and its cluster: the catalog's leader and members, how
//! far this node applied it, where it stands, and the stats and figures of its shards.

use super::*;
use crate::ids::NodeId;

impl<S: Storage> Router<S> {
    /// Makes this node's registration (its addresses and shards) part of the catalog, once it
    /// differs from what the catalog holds: proposed here on the leader, asked of the leader
    /// elsewhere.
    pub async fn register(&self, node: NodeRecord) -> Result<(), ControlError> {
        if self.state.borrow().nodes.get(&node.node_id) == Some(&node) {
            return Ok(());
        }
        if self.catalog.leads() {
            // A node removed (or never added) would get topics placed on it while it no longer
            // hears the catalog.
            if !self.catalog.members().contains_key(&node.node_id) {
                return Err(ControlError::failed_precondition(format!(
                    "node {} is not a member of the cluster: add it with `ringpost cluster add-node`",
                    node.node_id
                )));
            }
            return self.propose(CatalogEntry::NodeRegistered(node)).await.map(|_| ());
        }
        let leader =
            self.catalog.leader().ok_or_else(|| ControlError::unavailable("the catalog has no leader"))?;
        let peers = self.peers.as_ref().ok_or_else(|| ControlError::unavailable("this node has no peers"))?;
        Ok(peers.register(leader, node).await?)
    }

    /// Whether this node decides catalog changes (it leads the catalog).
    pub fn leads(&self) -> bool {
        self.catalog.leads()
    }

    /// The node leading the catalog, and its router's address if it registered one.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let leader = self.catalog.leader()?;
        let address = self.state.borrow().nodes.get(&leader).map(|node| node.router_address.clone());
        Some((leader, address.unwrap_or_default()))
    }

    /// The nodes the catalog registered, as this node applied it (the hosts of the cluster's
    /// nodes follow them: `node::router_shard`).
    pub fn registered_nodes(&self) -> std::collections::BTreeMap<NodeId, NodeRecord> {
        self.state.borrow().nodes.clone()
    }

    /// Changes of which node leads the catalog (see `Catalog::role_changes`).
    pub fn leader_changes(&self) -> crate::catalog::RoleChanges {
        self.catalog.role_changes()
    }

    /// Waits until this node applied catalog entry `index` (a change the leader decided for a
    /// client of this node), at most `within`.
    pub async fn wait_applied(&self, index: u64, within: std::time::Duration) -> bool {
        self.catalog.wait_applied(index, within).await
    }

    /// The last catalog entry this node applied.
    pub fn applied_index(&self) -> Option<u64> {
        self.catalog.applied_index()
    }

    /// Whether this node is one of a cluster's.
    pub fn is_clustered(&self) -> bool {
        self.peers.is_some()
    }

    pub async fn stats(&self) -> Result<Stats, ControlError> {
        // Read before the topics are gathered, so the figure does not count this response.
        let mut response = Stats { process: crate::metrics::process::stats(), ..Stats::default() };
        response.shards.push(ShardStats {
            shard: u32::MAX,
            topics: self.state.borrow().topics.len() as u32,
            directories: crate::shard::stats::directory_status(&self.directories),
            repairs: self.directories.repairs(),
            quarantined: Vec::new(),
            // The router publishes nothing and commits only its catalog.
            ..ShardStats::default()
        });
        for forwarder in &self.forwarders {
            if let ControlOk::Stats(shard, topics) = forwarder.call(ControlRequest::Stats).await? {
                response.shards.push(shard);
                response.topics.extend(topics);
            }
        }
        {
            let state = self.state.borrow();
            for topic in &mut response.topics {
                topic.several_sources = state
                    .topics
                    .get(topic.name.as_str())
                    .is_some_and(|record| state.source_count(record.id) > 1);
            }
        }
        // By name, then source: a topic of several sources on this node's shards lists them in order.
        response.topics.sort_by(|a, b| a.name.cmp(&b.name).then(a.source.cmp(&b.source)));
        Ok(response)
    }

    /// Each shard's figures for a scrape: the router's (`u32::MAX`), then each forwarder's, by
    /// its index.
    pub async fn shard_figures(
        &self,
    ) -> Result<Vec<(u32, crate::metrics::shard::ShardFigures)>, ControlError> {
        let mut figures = vec![(u32::MAX, crate::metrics::shard::snapshot())];
        for (index, forwarder) in self.forwarders.iter().enumerate() {
            if let ControlOk::Requests(shard) = forwarder.call(ControlRequest::Requests).await? {
                figures.push((index as u32, shard));
            }
        }
        Ok(figures)
    }

    /// The catalog's raft group as this node alone sees it: no request to another node.
    pub fn catalog_status(&self) -> ClusterStatus {
        self.catalog.cluster_status()
    }

    /// The catalog's raft group as this node sees it.
    /// On a node that does not lead, the leader's view of the members (only the leader knows how
    /// far each is replicated and when it last answered), with this node's own log, applied
    /// index, role and standing; this node's view alone when the leader does not answer, the
    /// leader then shown unreachable and not named as leading.
    pub async fn cluster_status(&self) -> ClusterStatus {
        let local = self.catalog.cluster_status();
        let (Some(peers), Some(leader)) = (&self.peers, local.catalog_leader) else { return local };
        if leader == local.node_id {
            return local;
        }
        let mut status = match peers.cluster_status(leader).await {
            Ok(status) => status,
            Err(error) => {
                let mut local = local;
                local.catalog_leader = None;
                for node in local.nodes.iter_mut().filter(|node| node.node_id == leader) {
                    node.role = "unreachable".to_owned();
                }
                local.note = format!(
                    "node {}'s own view: node {leader}, the catalog's leader it knew, did not answer ({})",
                    local.node_id, error.message
                );
                return local;
            }
        };
        status.node_id = local.node_id;
        status.last_log_index = local.last_log_index;
        status.last_applied_index = local.last_applied_index;
        status.not_serving = local.not_serving;
        for node in &mut status.nodes {
            if let Some(own) =
                local.nodes.iter().find(|own| own.node_id == node.node_id && own.node_id == local.node_id)
            {
                node.role = own.role.clone();
            }
        }
        status
    }

    /// The catalog's leader this node can vouch for (`Catalog::reported_leader`).
    pub fn reported_leader(&self) -> Option<NodeId> {
        self.catalog.reported_leader()
    }

    /// Where this node stands in the catalog's group (`catalog::standing`).
    pub fn standing(&self) -> crate::catalog::standing::Standing {
        self.catalog.standing()
    }

    /// Refuses a client's request on a node that is no longer a member of its cluster (removed
    /// with `cluster remove-node`): its catalog is no longer kept up to date, so what it would
    /// answer, look up or carry to a leader could be stale or land on nodes that no longer
    /// count it.
    pub fn check_member(&self) -> Result<(), ControlError> {
        if self.peers.is_some() && self.catalog.standing() == crate::catalog::standing::Standing::Removed {
            return Err(ControlError::failed_precondition(format!(
                "node {0} was removed from the cluster (`ringpost cluster remove-node {0}`): it serves no requests; \
                 use another node",
                self.node_id()
            )));
        }
        Ok(())
    }

    /// Topics as this node's applied catalog places them, in name order, each followed by its
    /// sources after the first (named `topic#n`, their placement key), at most
    /// `CLUSTER_STATUS_TOPICS_MAX` rows, and how many more there are: a topic of one replica
    /// too, so that where it lives (the node a removal would need to keep) is seen.
    pub fn topic_placements(&self) -> (Vec<crate::api::cluster::TopicPlacement>, u64) {
        use crate::api::cluster::{TopicPlacement, CLUSTER_STATUS_TOPICS_MAX};
        use crate::catalog::placement::source_key;
        let state = self.catalog.state();
        let mut rows = state.topics.values().flat_map(|topic| {
            let own = TopicPlacement {
                name: topic.name.to_string(),
                leader_node: topic.shard.node(),
                epoch: topic.epoch,
                replica_nodes: topic.replica_shards().iter().map(|shard| shard.node()).collect(),
            };
            let sources = state.sources_of(topic.id).map(|source| TopicPlacement {
                name: source_key(&topic.name, source.source.get()),
                leader_node: source.shard.node(),
                epoch: source.epoch,
                replica_nodes: source.replica_shards().iter().map(|shard| shard.node()).collect(),
            });
            std::iter::once(own).chain(sources)
        });
        let placements: Vec<TopicPlacement> = rows.by_ref().take(CLUSTER_STATUS_TOPICS_MAX).collect();
        (placements, rows.count() as u64)
    }
}
