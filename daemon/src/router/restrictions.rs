//! Routing restrictions (`ringpost cluster restrict add|remove|list`): rules in the catalog
//! that keep sets of clients away from sets of nodes' forwarders, to divert traffic from a sick
//! node or site. Every router applies them to every lookup list it hands out (`restrict`).
//!
//! Precedence, for a client (its principal and the address it connected from):
//! 1. only the rules whose selector picks the client count (a principal rule by its name, a
//!    range rule by the address);
//! 2. deny beats allow: a node any counted deny rule names is never handed out;
//! 3. when any counted rule allows, only the nodes the counted allow rules name (together) are
//!    handed out; with none, every node not denied;
//! 4. a client left no forwarder is refused with `FailedPrecondition` naming the rules that
//!    left it none, never given an empty list.
//!
//! A drain (`drain.rs`) then leaves out draining nodes among what is left, unless that is all.
//! gRPC clients are handed no list (their calls are carried to the node that leads the
//! resource), so restrictions shape native lookups only.

use super::{ControlError, Router};
use crate::catalog::routing::{ClientSelector, RoutingRule, ROUTING_PRINCIPAL_BYTES_MAX, ROUTING_RULES_MAX};
use crate::catalog::CatalogEntry;
use crate::ids::{NodeId, ShardId};
use crate::storage::Storage;
use std::net::IpAddr;

/// Who asks for a route, as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteClient {
    /// The principal's name (`anonymous` without a credential).
    pub principal: String,
    /// The address it connected from, if known (a request carried from another node is not).
    pub from: Option<IpAddr>,
}

impl RouteClient {
    fn picked_by(&self, selector: &ClientSelector) -> bool {
        match selector {
            ClientSelector::Principal(name) => *name == self.principal,
            ClientSelector::From(range) => self.from.is_some_and(|from| range.contains(from)),
        }
    }
}

/// `order` with the forwarders `client` may not be handed left out, by the precedence above;
/// refused, naming the rules, when none is left.
pub fn restrict(
    order: Vec<ShardId>,
    rules: &[RoutingRule],
    client: &RouteClient,
) -> Result<Vec<ShardId>, String> {
    let counted: Vec<&RoutingRule> = rules.iter().filter(|rule| client.picked_by(&rule.selector)).collect();
    if counted.is_empty() {
        return Ok(order);
    }
    let denied = |node: NodeId| counted.iter().any(|rule| !rule.allow && rule.nodes.contains(&node));
    let allows = counted.iter().any(|rule| rule.allow);
    let allowed =
        |node: NodeId| !allows || counted.iter().any(|rule| rule.allow && rule.nodes.contains(&node));
    let kept: Vec<ShardId> =
        order.into_iter().filter(|shard| allowed(shard.node()) && !denied(shard.node())).collect();
    if kept.is_empty() {
        let named: Vec<String> = counted.iter().map(|rule| rule.to_string()).collect();
        return Err(format!(
            "routing restrictions leave {} (from {}) no forwarder: {}",
            client.principal,
            client.from.map_or_else(|| "an address not known here".to_owned(), |from| from.to_string()),
            named.join("; ")
        ));
    }
    Ok(kept)
}

/// The rules after adding (`add`) or removing `rule`; refused when a removed rule is not there
/// or when adding would pass `ROUTING_RULES_MAX`. Adding a rule already there changes nothing.
pub fn changed_rules(
    rules: &[RoutingRule],
    rule: RoutingRule,
    add: bool,
) -> Result<Vec<RoutingRule>, ControlError> {
    let mut rules = rules.to_vec();
    let position = rules.iter().position(|held| *held == rule);
    match (add, position) {
        (true, Some(_)) => {}
        (true, None) if rules.len() >= ROUTING_RULES_MAX => {
            return Err(ControlError::failed_precondition(format!(
                "the catalog holds {ROUTING_RULES_MAX} routing rules, the most it takes (ROUTING_RULES_MAX)"
            )))
        }
        (true, None) => rules.push(rule),
        (false, Some(position)) => {
            rules.remove(position);
        }
        (false, None) => {
            return Err(ControlError::not_found(format!(
                "no routing rule '{rule}' (`ringpost cluster restrict list`)"
            )))
        }
    }
    Ok(rules)
}

impl<S: Storage> Router<S> {
    /// Adds or removes a routing rule, on the catalog's leader; one change at a time, so that
    /// two cannot each write the rules over the other's.
    pub async fn restrict_routes(&self, rule: RoutingRule, add: bool) -> Result<(), ControlError> {
        self.check_leads()?;
        if rule.nodes.is_empty() {
            return Err(ControlError::invalid_argument("a routing rule names at least one node"));
        }
        if let ClientSelector::Principal(name) = &rule.selector {
            if name.is_empty() || name.len() > ROUTING_PRINCIPAL_BYTES_MAX {
                return Err(ControlError::invalid_argument(format!(
                    "a routing rule's principal is 1 to {ROUTING_PRINCIPAL_BYTES_MAX} bytes (ROUTING_PRINCIPAL_BYTES_MAX)"
                )));
            }
        }
        let _permit = self.update_permit().await?;
        let unknown: Vec<String> = {
            let state = self.state.borrow();
            rule.nodes
                .iter()
                .filter(|node| !state.nodes.contains_key(node))
                .map(|node| node.to_string())
                .collect()
        };
        if add && !unknown.is_empty() {
            return Err(ControlError::not_found(format!("no registered node {}", unknown.join(", "))));
        }
        let rules = changed_rules(&self.state.borrow().routing_rules, rule, add)?;
        if rules == self.state.borrow().routing_rules {
            return Ok(());
        }
        self.propose(CatalogEntry::RoutingRulesSet { rules }).await?;
        Ok(())
    }

    /// The routing rules, in the order they were added.
    pub fn routing_rules(&self) -> Vec<RoutingRule> {
        self.state.borrow().routing_rules.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::routing::Cidr;

    fn shard(node: u64) -> ShardId {
        ShardId::new(NodeId::new(node), 0)
    }

    fn rule(selector: ClientSelector, allow: bool, nodes: &[u64]) -> RoutingRule {
        RoutingRule { selector, allow, nodes: nodes.iter().copied().map(NodeId::new).collect() }
    }

    fn principal(name: &str) -> ClientSelector {
        ClientSelector::Principal(name.into())
    }

    fn from(range: &str) -> ClientSelector {
        ClientSelector::From(Cidr::parse(range).unwrap())
    }

    fn client(principal: &str, from: &str) -> RouteClient {
        RouteClient { principal: principal.into(), from: Some(from.parse().unwrap()) }
    }

    /// Only the rules picking the client count; deny beats allow; allows together make an
    /// allow-list; the order of what is kept stays the router's.
    #[test]
    fn deny_beats_allow_and_allows_make_one_list_of_the_rules_that_pick_the_client() {
        let order = vec![shard(3), shard(1), shard(2)];
        let rules = vec![
            rule(principal("billing"), false, &[3]),
            rule(from("10.1.0.0/16"), true, &[1, 3]),
            rule(from("10.2.0.0/16"), true, &[2]),
        ];
        let restrict = |client: &RouteClient| restrict(order.clone(), &rules, client);
        assert_eq!(restrict(&client("orders", "192.0.2.1")).unwrap(), order, "no rule picks it");
        assert_eq!(restrict(&client("billing", "192.0.2.1")).unwrap(), vec![shard(1), shard(2)]);
        assert_eq!(restrict(&client("orders", "10.1.4.4")).unwrap(), vec![shard(3), shard(1)]);
        assert_eq!(restrict(&client("billing", "10.1.4.4")).unwrap(), vec![shard(1)], "deny beats allow");
        let unknown = RouteClient { principal: "orders".into(), from: None };
        assert_eq!(restrict(&unknown).unwrap(), order, "a range picks no client of unknown address");
        // Two allow rules picking one client: either's nodes.
        let rules = vec![rule(principal("orders"), true, &[2]), rule(from("10.1.0.0/16"), true, &[3])];
        assert_eq!(
            super::restrict(order.clone(), &rules, &client("orders", "10.1.0.1")).unwrap(),
            vec![shard(3), shard(2)]
        );
    }

    /// A client the rules leave no forwarder is refused, with the rules named, not handed an
    /// empty list.
    #[test]
    fn a_client_left_no_forwarder_is_told_which_rules_did_it() {
        let rules = vec![rule(principal("billing"), true, &[2]), rule(from("10.0.0.0/8"), false, &[2])];
        let refused = restrict(vec![shard(1), shard(2)], &rules, &client("billing", "10.9.9.9")).unwrap_err();
        assert!(refused.contains("leave billing (from 10.9.9.9) no forwarder"), "{refused}");
        assert!(refused.contains("principal billing allow 2; from 10.0.0.0/8 deny 2"), "{refused}");
    }

    /// Adding is idempotent and bounded; removing names a rule that is there.
    #[test]
    fn rules_are_added_once_within_their_bound_and_removed_by_their_whole_statement() {
        let deny = rule(principal("billing"), false, &[3]);
        let rules = changed_rules(&[], deny.clone(), true).unwrap();
        assert_eq!(changed_rules(&rules, deny.clone(), true).unwrap(), rules);
        let other = rule(principal("billing"), false, &[2]);
        assert_eq!(changed_rules(&rules, other, false).unwrap_err().code(), crate::api::Code::NotFound);
        assert!(changed_rules(&rules, deny, false).unwrap().is_empty());
        let full: Vec<RoutingRule> =
            (0..ROUTING_RULES_MAX).map(|index| rule(principal(&format!("p{index}")), true, &[1])).collect();
        let refused = changed_rules(&full, rule(principal("one-more"), true, &[1]), true).unwrap_err();
        assert!(refused.to_string().contains("ROUTING_RULES_MAX"), "{refused}");
    }
}
