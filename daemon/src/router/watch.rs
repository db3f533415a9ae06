//! What a node of a cluster logs of its place in it, and how it finds out it was removed.
//! Every `CLUSTER_WATCH_INTERVAL` the router compares what its catalog observes now with what
//! it observed last (`catalog::standing::changes`) and logs each change once: members added,
//! promoted or removed, the catalog's leader changing, this node losing (and regaining) its
//! majority or its leader, and, on the leader, each member that stops answering and answers
//! again. A node that no longer hears its leader asks the other members whether the cluster
//! still counts it: the leader stops sending to a node it removed, so that node never learns
//! of the removal from raft itself.

use super::Router;
use crate::catalog::standing::{changes, Picture, Standing};
use crate::ids::NodeId;
use crate::storage::Storage;
use std::time::Duration;

/// How often a node looks at its place in the cluster: a change is logged within this of when
/// it is reported (`LEADER_CONTACT_LOST_AFTER`, `MEMBER_UNREACHABLE_AFTER`), at the cost of
/// reading openraft's metrics four times a second.
pub const CLUSTER_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// How often a node that hears no leader asks the members whether it is still one of them.
const REMOVAL_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// What the watch remembers between two looks.
#[derive(Default)]
pub(super) struct ClusterWatch {
    seen: Option<Picture>,
    removal_checked: Option<std::time::Instant>,
    /// A removal check runs (on a task of its own: it asks other nodes, each within
    /// `PEER_REQUEST_TIMEOUT`, and the log must not wait for it).
    removal_checking: bool,
}

impl<S: Storage> Router<S> {
    /// Logs what changed in this node's view of its cluster since the last call; asks the
    /// members whether this node is still one when it hears no leader.
    pub fn watch_cluster(self: &std::rc::Rc<Self>) {
        let observed = self.catalog.observe();
        let picture = Picture::of(&observed);
        let before = self.watch.borrow_mut().seen.replace(picture.clone());
        if let Some(before) = before {
            for change in changes(observed.this_node, &before, &picture) {
                if change.warning {
                    crate::log_warn!("ringpostd: {}", change.line);
                } else {
                    crate::log_info!("ringpostd: {}", change.line);
                }
            }
        }
        if matches!(picture.standing, Standing::LeaderSilent { .. } | Standing::NoLeader) {
            let now = crate::runtime::now();
            let due = {
                let mut watch = self.watch.borrow_mut();
                let due = !watch.removal_checking
                    && watch
                        .removal_checked
                        .is_none_or(|checked| now.duration_since(checked) >= REMOVAL_CHECK_INTERVAL);
                if due {
                    watch.removal_checked = Some(now);
                    watch.removal_checking = true;
                }
                due
            };
            // The borrow ends before the spawn: glommio polls a spawned task at once, and this
            // one, when no member answers, runs to its end (and borrows the watch) in that poll.
            if due {
                let router = self.clone();
                crate::runtime::spawn(async move {
                    router.check_still_member(&observed.members).await;
                    router.watch.borrow_mut().removal_checking = false;
                })
                .detach();
            }
        }
    }

    /// Asks each other member for its view of the cluster; a leader's own answer that leaves
    /// this node out of the membership means it was removed (only a leader's answer counts: a
    /// member that lags could hold a membership from before this node was added).
    async fn check_still_member(&self, members: &std::collections::BTreeMap<NodeId, bool>) {
        let Some(peers) = &self.peers else { return };
        let this_node = self.node_id();
        for member in members.keys().copied().filter(|member| *member != this_node) {
            let Ok(status) = peers.cluster_status(member).await else { continue };
            if status.catalog_leader != Some(status.node_id) {
                continue;
            }
            if !status.nodes.iter().any(|node| node.node_id == this_node) {
                self.catalog.note_removed();
            }
            return;
        }
    }
}
