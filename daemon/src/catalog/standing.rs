//! Where this node stands in the catalog's raft group, as it reports it: whether it leads, and
//! leads with a majority behind it; whom it follows, and whether it still hears from them;
//! whether it is a member at all. openraft keeps a leader that lost its majority a leader until
//! it hears of a newer term, and a learner that lost its leader following it for ever; what
//! this node says (`/readyz`, `ringpost_catalog_leader_node`, `cluster status`) goes by the
//! contact it has instead. Decided here without I/O from what the catalog observed
//! (`Observed`), and the changes between two observations are the lines the log gets
//! (`changes`).

use crate::ids::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long the catalog's leader may go without answers from a majority of its voters, or a
/// follower without a message from its leader, before it stops saying so. Six of the
/// cluster's heartbeats (300 ms), so that a loaded machine's late ones do not make it flap;
/// below the 2.7 s after which the others campaign (the leader's lease and an election timeout,
/// `raft_config_for`), so that a leader cut off stops claiming the lead before a successor can
/// be elected, and no moment has two nodes claiming it.
pub const LEADER_CONTACT_LOST_AFTER: Duration = Duration::from_millis(2000);

/// How long the catalog's leader may go without an answer from a member before it reports it
/// unreachable: the bound after which the leader takes that node's topics from it
/// (`router::SOURCE_FAILURE_TIMEOUT`), so that what is reported is what the cluster acts on.
pub const MEMBER_UNREACHABLE_AFTER: Duration = Duration::from_millis(1500);

/// What the catalog observed of its group at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub this_node: NodeId,
    /// The leader openraft names: this node when it leads, even cut off from the others.
    pub leader: Option<NodeId>,
    /// The latest membership: each member and whether it votes.
    pub members: BTreeMap<NodeId, bool>,
    /// On the leader: how long ago a majority of voters last answered in its term (`None`:
    /// never).
    pub quorum_acked_ago: Option<Duration>,
    /// On the leader: how long it has led in its term. A new leader has no answers yet; it is
    /// not cut off before it had time to get them.
    pub leading_for: Option<Duration>,
    /// On the leader: how long ago each other member last answered (`None`: never).
    pub members_heard_ago: BTreeMap<NodeId, Option<Duration>>,
    /// Off the leader: how long ago the leader's last message came (`None`: none since start).
    pub leader_heard_ago: Option<Duration>,
    /// How long this node has run its catalog: contact is not missed before it had time to come.
    pub running_for: Duration,
    /// It was started with `--join` and has not been a member since.
    pub joining: bool,
    /// A member found the cluster's membership without this node (`Catalog::note_removed`).
    pub told_removed: bool,
}

/// Where this node stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It leads, heard by a majority of its voters (or it is the only one).
    Leads,
    /// openraft says it leads, but no majority of its voters answered for `silent_for` (`None`:
    /// never): it cannot decide anything, and another may be elected.
    LeadsWithoutQuorum { silent_for: Option<Duration> },
    /// It follows `leader` and hears from it.
    Follows { leader: NodeId },
    /// It last knew `leader` to lead, and has heard nothing from it for `silent_for` (`None`:
    /// since it started).
    LeaderSilent { leader: NodeId, silent_for: Option<Duration> },
    /// No leader is known: an election, or too few voters to hold one.
    NoLeader,
    /// Started with `--join`, it waits to be added.
    Joining,
    /// It was a member and is no longer: removed with `cluster remove-node`.
    Removed,
}

impl Standing {
    /// The leader this node names to others: none while it cannot vouch for one.
    pub fn reported_leader(&self, this_node: NodeId) -> Option<NodeId> {
        match self {
            Standing::Leads => Some(this_node),
            Standing::Follows { leader } => Some(*leader),
            _ => None,
        }
    }

    /// Whether `other` is the same standing, however long a silence lasted: what the log
    /// tells apart.
    pub fn same_as(&self, other: &Standing) -> bool {
        match (self, other) {
            (Standing::Follows { leader: a }, Standing::Follows { leader: b })
            | (Standing::LeaderSilent { leader: a, .. }, Standing::LeaderSilent { leader: b, .. }) => a == b,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }

    /// Whether it serves as a member: it leads or follows a leader it hears.
    pub fn is_serving(&self) -> bool {
        matches!(self, Standing::Leads | Standing::Follows { .. })
    }

    /// Why this node is not ready, if it is not.
    pub fn not_ready(&self, this_node: NodeId) -> Option<String> {
        let seconds = |silent: &Option<Duration>| match silent {
            Some(silent) => format!("for {:.1} s", silent.as_secs_f64()),
            None => "since it started".to_owned(),
        };
        match self {
            Standing::Leads | Standing::Follows { .. } => None,
            Standing::LeadsWithoutQuorum { silent_for } => Some(format!(
                "node {this_node} leads the catalog but has not heard from a majority of its voters {}: it \
                 decides nothing",
                seconds(silent_for)
            )),
            Standing::LeaderSilent { leader, silent_for } => Some(format!(
                "node {this_node} has not heard from the catalog's leader, node {leader}, {}",
                seconds(silent_for)
            )),
            Standing::NoLeader => Some(format!("node {this_node}: the catalog has no leader this node knows")),
            Standing::Joining => Some(format!(
                "node {this_node} is waiting to be added to the cluster (`ringpost cluster add-node {this_node} ADDRESS`)"
            )),
            Standing::Removed => Some(format!("node {this_node} was removed from the cluster")),
        }
    }
}

/// Where `observed` puts this node.
pub fn standing(observed: &Observed) -> Standing {
    let member = observed.members.contains_key(&observed.this_node);
    if observed.joining && !member {
        return Standing::Joining;
    }
    if observed.told_removed || !member && !observed.members.is_empty() {
        return Standing::Removed;
    }
    let voters = observed.members.values().filter(|voter| **voter).count();
    match observed.leader {
        None => Standing::NoLeader,
        Some(leader) if leader == observed.this_node => {
            if voters <= 1 {
                return Standing::Leads;
            }
            match observed.quorum_acked_ago {
                Some(ago) if ago <= LEADER_CONTACT_LOST_AFTER => Standing::Leads,
                _ if observed.running_for <= LEADER_CONTACT_LOST_AFTER => Standing::Leads,
                None if observed.leading_for.is_some_and(|led| led <= LEADER_CONTACT_LOST_AFTER) => {
                    Standing::Leads
                }
                silent_for => Standing::LeadsWithoutQuorum { silent_for },
            }
        }
        Some(leader) => match observed.leader_heard_ago {
            Some(ago) if ago <= LEADER_CONTACT_LOST_AFTER => Standing::Follows { leader },
            _ if observed.running_for <= LEADER_CONTACT_LOST_AFTER => Standing::Follows { leader },
            silent_for => Standing::LeaderSilent { leader, silent_for },
        },
    }
}

/// On the leader, the members it has not heard from within `MEMBER_UNREACHABLE_AFTER`.
pub fn unreachable_members(observed: &Observed) -> BTreeSet<NodeId> {
    if observed.leader != Some(observed.this_node) || observed.running_for <= MEMBER_UNREACHABLE_AFTER {
        return BTreeSet::new();
    }
    observed
        .members
        .keys()
        .filter(|node| **node != observed.this_node)
        .filter(|node| match observed.members_heard_ago.get(node) {
            Some(Some(ago)) => *ago > MEMBER_UNREACHABLE_AFTER,
            _ => true,
        })
        .copied()
        .collect()
}

/// What a node logs about its group: the standing, the leader it names, the members and, on
/// the leader, the members it cannot reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picture {
    pub standing: Standing,
    pub leader: Option<NodeId>,
    pub members: BTreeMap<NodeId, bool>,
    pub unreachable: BTreeSet<NodeId>,
}

impl Picture {
    pub fn of(observed: &Observed) -> Picture {
        let standing = standing(observed);
        Picture {
            leader: standing.reported_leader(observed.this_node),
            standing,
            members: observed.members.clone(),
            unreachable: unreachable_members(observed),
        }
    }
}

/// One line for the log: a loss of contact or of membership is a warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub warning: bool,
    pub line: String,
}

/// The log lines for a change of the membership from `before` to `after` (each member and
/// whether it votes), as every node applies it: so each is logged once on each node, however
/// quickly the next follows.
pub fn member_changes(before: &BTreeMap<NodeId, bool>, after: &BTreeMap<NodeId, bool>) -> Vec<Change> {
    let name = |voter: bool| if voter { "a voter" } else { "a learner" };
    let mut lines = Vec::new();
    for (node, voter) in after {
        let line = match before.get(node) {
            None => format!("node {node} joined the cluster as {}", name(*voter)),
            Some(was) if was != voter => format!("node {node} is now {}", name(*voter)),
            _ => continue,
        };
        lines.push(Change { warning: false, line });
    }
    for node in before.keys().filter(|node| !after.contains_key(node)) {
        lines.push(Change { warning: false, line: format!("node {node} left the cluster") });
    }
    lines
}

/// The log lines for what changed from `before` to `now`, each change once (members aside:
/// `member_changes`).
pub fn changes(this_node: NodeId, before: &Picture, now: &Picture) -> Vec<Change> {
    let mut lines = Vec::new();
    let info = |line: String| Change { warning: false, line };
    let warning = |line: String| Change { warning: true, line };
    if !before.standing.same_as(&now.standing) {
        let line = match (&before.standing, &now.standing) {
            (_, Standing::Removed) => Some(warning(format!(
                "node {this_node} was removed from the cluster: it refuses requests and changes from now on"
            ))),
            (_, Standing::LeadsWithoutQuorum { .. }) => Some(warning(format!(
                "node {this_node} lost contact with a majority of the catalog's voters: it no longer claims the lead \
                 and decides nothing until they answer"
            ))),
            (Standing::LeadsWithoutQuorum { .. }, Standing::Leads) => {
                Some(info(format!("node {this_node} hears from a majority of the catalog's voters again")))
            }
            (_, Standing::LeaderSilent { leader, .. }) => {
                Some(warning(format!("node {this_node} lost contact with the catalog's leader, node {leader}")))
            }
            (Standing::Joining, Standing::Follows { leader }) => Some(info(format!(
                "node {this_node} was added to the cluster; the catalog's leader is node {leader}"
            ))),
            _ => None,
        };
        lines.extend(line);
    }
    if before.leader != now.leader {
        match now.leader {
            Some(leader) => lines.push(info(format!("the catalog's leader is node {leader}"))),
            None if before.leader.is_some() && now.standing != Standing::Removed => {
                lines.push(warning("the catalog has no leader this node can vouch for".to_owned()))
            }
            None => {}
        }
    }
    let leads = now.standing == Standing::Leads;
    let lost = |node: &NodeId| {
        warning(format!(
            "node {node} does not answer the catalog's leader (node {this_node}) for {:.1} s: unreachable",
            MEMBER_UNREACHABLE_AFTER.as_secs_f64()
        ))
    };
    if leads && before.standing == Standing::Leads {
        lines.extend(now.unreachable.difference(&before.unreachable).map(lost));
        for node in before.unreachable.difference(&now.unreachable) {
            if now.members.contains_key(node) {
                lines
                    .push(info(format!("node {node} answers the catalog's leader (node {this_node}) again")));
            }
        }
    } else if leads {
        lines.extend(now.unreachable.iter().map(lost));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn changes(this_node: u64, before: &Picture, now: &Picture) -> Vec<String> {
        super::changes(NodeId::new(this_node), before, now).into_iter().map(|change| change.line).collect()
    }

    /// Each member by number, and whether it votes.
    fn members(members: &[(u64, bool)]) -> BTreeMap<NodeId, bool> {
        members.iter().map(|(node, voter)| (NodeId::new(*node), *voter)).collect()
    }

    /// How long ago the leader heard from each member, by number.
    fn heard(members: &[(u64, Option<Duration>)]) -> BTreeMap<NodeId, Option<Duration>> {
        members.iter().map(|(node, ago)| (NodeId::new(*node), *ago)).collect()
    }

    fn three(this_node: u64, leader: Option<u64>) -> Observed {
        Observed {
            this_node: NodeId::new(this_node),
            leader: leader.map(NodeId::new),
            members: members(&[(1, true), (2, true), (3, true)]),
            running_for: 60 * SECOND,
            ..Observed::default()
        }
    }

    #[test]
    fn a_leader_heard_by_a_majority_leads_and_one_cut_off_stops_claiming_it() {
        let mut observed = three(1, Some(1));
        observed.quorum_acked_ago = Some(SECOND / 2);
        assert_eq!(standing(&observed), Standing::Leads);
        assert_eq!(standing(&observed).reported_leader(NodeId::new(1)), Some(NodeId::new(1)));
        observed.quorum_acked_ago = Some(LEADER_CONTACT_LOST_AFTER + SECOND);
        let lost = standing(&observed);
        assert_eq!(lost, Standing::LeadsWithoutQuorum { silent_for: Some(3 * SECOND) });
        assert_eq!(lost.reported_leader(NodeId::new(1)), None);
        assert!(lost
            .not_ready(NodeId::new(1))
            .unwrap()
            .contains("has not heard from a majority of its voters for 3.0 s"));
        // Never acknowledged at all, once it has run long enough to have been.
        observed.quorum_acked_ago = None;
        assert_eq!(standing(&observed), Standing::LeadsWithoutQuorum { silent_for: None });
        observed.running_for = SECOND;
        assert_eq!(standing(&observed), Standing::Leads);
    }

    /// A leader just elected (a handover, a failover) has no answers of its term yet: it leads
    /// for as long as a leader that had them may go without, and is cut off only after that.
    #[test]
    fn a_new_leader_is_not_cut_off_before_its_first_answers_could_come() {
        let mut observed = three(1, Some(1));
        observed.leading_for = Some(SECOND / 10);
        assert_eq!(standing(&observed), Standing::Leads);
        observed.leading_for = Some(LEADER_CONTACT_LOST_AFTER);
        assert_eq!(standing(&observed), Standing::Leads);
        observed.leading_for = Some(LEADER_CONTACT_LOST_AFTER + SECOND);
        assert_eq!(standing(&observed), Standing::LeadsWithoutQuorum { silent_for: None });
    }

    #[test]
    fn a_single_voter_always_leads() {
        let observed = Observed {
            this_node: NodeId::new(1),
            leader: Some(NodeId::new(1)),
            members: members(&[(1, true)]),
            ..Observed::default()
        };
        assert_eq!(standing(&observed), Standing::Leads);
    }

    #[test]
    fn a_follower_names_its_leader_only_while_it_hears_it() {
        let mut observed = three(2, Some(1));
        observed.leader_heard_ago = Some(SECOND / 3);
        assert_eq!(standing(&observed), Standing::Follows { leader: NodeId::new(1) });
        observed.leader_heard_ago = Some(5 * SECOND);
        let silent = standing(&observed);
        assert_eq!(silent, Standing::LeaderSilent { leader: NodeId::new(1), silent_for: Some(5 * SECOND) });
        assert_eq!(silent.reported_leader(NodeId::new(2)), None);
        assert!(!silent.is_serving());
        observed.leader = None;
        assert_eq!(standing(&observed), Standing::NoLeader);
    }

    #[test]
    fn a_joining_node_waits_and_a_node_out_of_the_membership_was_removed() {
        let mut observed = three(5, Some(1));
        observed.joining = true;
        assert_eq!(standing(&observed), Standing::Joining);
        assert!(standing(&observed).not_ready(NodeId::new(5)).unwrap().contains("waiting to be added"));
        observed.joining = false;
        assert_eq!(standing(&observed), Standing::Removed);
        let mut told = three(2, Some(1));
        told.leader_heard_ago = Some(SECOND / 3);
        told.told_removed = true;
        assert_eq!(standing(&told), Standing::Removed);
        assert_eq!(standing(&told).reported_leader(NodeId::new(2)), None);
    }

    #[test]
    fn the_leader_reports_members_silent_past_the_bound() {
        let mut observed = three(1, Some(1));
        observed.quorum_acked_ago = Some(SECOND / 3);
        observed.members_heard_ago = heard(&[(2, Some(SECOND / 3)), (3, Some(2 * SECOND))]);
        assert_eq!(unreachable_members(&observed), BTreeSet::from([NodeId::new(3)]));
        observed.members_heard_ago.insert(NodeId::new(3), None);
        assert_eq!(unreachable_members(&observed), BTreeSet::from([NodeId::new(3)]));
        assert_eq!(unreachable_members(&three(2, Some(1))), BTreeSet::new(), "only the leader can tell");
    }

    #[test]
    fn each_change_is_one_line_and_nothing_changed_is_none() {
        let mut observed = three(1, Some(1));
        observed.quorum_acked_ago = Some(SECOND / 3);
        observed.members_heard_ago = heard(&[(2, Some(SECOND / 3)), (3, Some(SECOND / 3))]);
        let healthy = Picture::of(&observed);
        assert!(changes(1, &healthy, &healthy).is_empty());
        let mut later = observed.clone();
        later.quorum_acked_ago = Some(5 * SECOND);
        let mut much_later = later.clone();
        much_later.quorum_acked_ago = Some(9 * SECOND);
        assert!(
            changes(1, &Picture::of(&later), &Picture::of(&much_later)).is_empty(),
            "a silence growing is no change"
        );

        observed.members_heard_ago.insert(NodeId::new(3), Some(5 * SECOND));
        let three_lost = Picture::of(&observed);
        assert_eq!(
            changes(1, &healthy, &three_lost),
            vec!["node 3 does not answer the catalog's leader (node 1) for 1.5 s: unreachable".to_owned()]
        );
        assert_eq!(
            changes(1, &three_lost, &healthy),
            vec!["node 3 answers the catalog's leader (node 1) again"]
        );

        observed.quorum_acked_ago = Some(5 * SECOND);
        observed.members_heard_ago.insert(NodeId::new(2), Some(5 * SECOND));
        let alone = Picture::of(&observed);
        let lines = changes(1, &three_lost, &alone);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("lost contact with a majority"));
        assert_eq!(lines[1], "the catalog has no leader this node can vouch for");
        let lines = changes(1, &alone, &healthy);
        assert_eq!(
            lines,
            vec![
                "node 1 hears from a majority of the catalog's voters again".to_owned(),
                "the catalog's leader is node 1".to_owned()
            ]
        );
    }

    #[test]
    fn each_change_of_the_membership_is_one_line() {
        let lines = |before: &[(u64, bool)], after: &[(u64, bool)]| -> Vec<String> {
            member_changes(&members(before), &members(after)).into_iter().map(|change| change.line).collect()
        };
        let three = [(1, true), (2, true), (3, true)];
        assert!(lines(&three, &three).is_empty());
        assert_eq!(
            lines(&three, &[(1, true), (2, true), (3, true), (4, false)]),
            ["node 4 joined the cluster as a learner"]
        );
        assert_eq!(lines(&[(1, true), (4, false)], &[(1, true), (4, true)]), ["node 4 is now a voter"]);
        assert_eq!(
            lines(&[(1, true), (2, true), (4, true)], &[(1, true), (2, true)]),
            ["node 4 left the cluster"]
        );
    }

    #[test]
    fn a_follower_logs_its_leader_changing_and_its_removal() {
        let mut observed = three(2, Some(1));
        observed.leader_heard_ago = Some(SECOND / 3);
        let following = Picture::of(&observed);
        observed.leader_heard_ago = Some(3 * SECOND);
        let silent = Picture::of(&observed);
        assert_eq!(
            changes(2, &following, &silent),
            vec![
                "node 2 lost contact with the catalog's leader, node 1".to_owned(),
                "the catalog has no leader this node can vouch for".to_owned()
            ]
        );
        observed.leader = Some(NodeId::new(3));
        observed.leader_heard_ago = Some(SECOND / 3);
        assert_eq!(changes(2, &silent, &Picture::of(&observed)), vec!["the catalog's leader is node 3"]);
        observed.told_removed = true;
        let removed = Picture::of(&observed);
        let lines = changes(2, &following, &removed);
        assert_eq!(
            lines,
            vec!["node 2 was removed from the cluster: it refuses requests and changes from now on"]
        );
    }
}
