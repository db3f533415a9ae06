//! One door for every request. A protocol decodes a request into an `Operation` and the
//! session it came with, calls `Door::execute`, and encodes the `Outcome`; it decides nothing
//! else. The door decides, once for every protocol:
//!
//! 1. who may: the permission each kind needs (`Kind::permission`, the one table), checked
//!    with the shard's `Access` where the operation runs, audited there;
//! 2. where it runs: here, or, for an operation that changes the catalog on a node that does
//!    not lead it (`Kind::changes_the_catalog`, the one place that says so), at the leader;
//! 3. how it gets there: carried whole with its principal (`NodeTransport`, the cluster port
//!    in the daemon), decided and checked there with the leader's access file, and answered
//!    once this node applied it (`FORWARDED_APPLY_WAIT`), so the client's next read here sees
//!    what it changed. A carried operation is never carried again.
//!
//! The data plane's operations (`Kind::Publish`, pulls, acknowledgements) are checked with the
//! same table (`check`), on the forwarder shard that serves them: for a request another node
//! carried there (`net::relay`), for the principal that node vouches for
//! (`vouched_for`), with the serving node's access file.

mod codec;
mod operation;
mod outcome;
pub mod routes;
mod transport;

pub use codec::{decode_answer, decode_carried, encode_answer, encode_carried};
pub use operation::{Kind, MessageCheck, Operation, DAEMON};
pub use outcome::{Outcome, SubscriptionShown};
pub use transport::{Carried, NodeTransport};

use crate::api::control::SubscriptionUpdate;
use crate::api::{Code, Status};
use crate::auth::{Access, Credential, Permission, Principal, Session};
use crate::ids::NodeId;
use crate::router::{NodeRemoval, Router, FORWARDED_APPLY_WAIT, MEMBERSHIP_CHANGE_TIMEOUT};
use crate::storage::Storage;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

/// How long a carried operation waits for the leader's answer (a node's addition and removal
/// wait longer: `MEMBERSHIP_CHANGE_TIMEOUT`). Within a client's usual deadline.
pub const CARRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Who asks, as the shard that answers sees it.
pub struct Caller<'a> {
    pub session: &'a Session,
    /// The rules of the shard the operation reached.
    pub access: &'a Access,
    /// The address the client reached this node at (a lookup answers with it when the
    /// router listens on every address).
    pub local_address: Option<SocketAddr>,
    /// The address the client connected from, if known: routing restrictions match on it.
    pub peer_address: Option<std::net::IpAddr>,
    /// Another node carried it here: it runs here, whatever this node's view of the leader.
    pub carried: bool,
}

impl<'a> Caller<'a> {
    pub fn new(session: &'a Session, access: &'a Access) -> Caller<'a> {
        Caller { session, access, local_address: None, peer_address: None, carried: false }
    }

    /// Refused unless the session holds `permission` on `name` (logged for audit).
    fn check(&self, permission: Permission, name: &str) -> Result<(), Status> {
        self.access.check(self.session, permission, name)
    }

    fn allows(&self, permission: Permission, name: &str) -> bool {
        self.access.allows(self.session, permission, name)
    }

    /// Who asks, as routing restrictions see it.
    fn route_client(&self) -> crate::router::restrictions::RouteClient {
        crate::router::restrictions::RouteClient {
            principal: self.session.principal.to_string(),
            from: self.peer_address,
        }
    }
}

/// Whether `session` may run a data-plane operation of `kind` on `name` (a topic to publish
/// to, a subscription to consume); a refusal is the request's answer, logged for audit.
#[inline]
pub fn check(access: &Access, session: &Session, kind: Kind, name: &str) -> Result<(), Status> {
    debug_assert!(kind.is_data_plane(), "{kind:?} is checked by the door's execute");
    access.check(session, kind.permission(), name)
}

/// `check` without the audit line: whether it would pass.
#[inline]
pub fn allows(access: &Access, session: &Session, kind: Kind, name: &str) -> bool {
    access.allows(session, kind.permission(), name)
}

/// The session of a principal another node vouches for: that node authenticated it (by a
/// token or a certificate), so it counts as presenting a credential; what it may do is decided
/// here.
pub fn vouched_for(principal: Principal) -> Session {
    let credential = match principal {
        Principal::Anonymous => Credential::None,
        Principal::Named(_) => Credential::Certificate,
    };
    Session { principal, credential }
}

/// The door of one node's router shard: its router, and how it reaches the other nodes (none
/// for a node alone).
pub struct Door<S: Storage> {
    router: Rc<Router<S>>,
    nodes: Option<Rc<dyn NodeTransport>>,
}

impl<S: Storage> Door<S> {
    pub fn new(router: Rc<Router<S>>, nodes: Option<Rc<dyn NodeTransport>>) -> Door<S> {
        Door { router, nodes }
    }

    pub fn router(&self) -> &Rc<Router<S>> {
        &self.router
    }

    /// Runs `operation` for `caller`: checks who may, here or at the catalog's leader, and
    /// answers with its outcome.
    pub async fn execute(&self, caller: &Caller<'_>, operation: Operation) -> Result<Outcome, Status> {
        let kind = operation.kind();
        debug_assert!(!kind.is_data_plane());
        if !kind.answered_when_removed() {
            self.router.check_member()?;
        }
        if kind.changes_the_catalog() && !caller.carried && self.nodes.is_some() && !self.router.leads() {
            let (leader, _) = self.router.leader().ok_or_else(|| {
                Status::unavailable(
                    "the catalog has no leader (too few of its voters are reachable); try again",
                )
            })?;
            return self.carry(leader, caller.session, operation).await;
        }
        self.authorize(caller, &operation)?;
        self.run(caller, operation).await
    }

    /// Carries `operation` to node `node` with the session's principal, and answers with that
    /// node's outcome once this node applied the change it made.
    async fn carry(&self, node: NodeId, session: &Session, operation: Operation) -> Result<Outcome, Status> {
        let nodes = self.nodes.as_ref().ok_or_else(|| Status::unavailable("this node has no peers"))?;
        let timeout = match operation.kind() {
            Kind::ClusterAddNode | Kind::ClusterRemoveNode => MEMBERSHIP_CHANGE_TIMEOUT,
            _ => CARRY_TIMEOUT,
        };
        let carried = nodes.carry(node, &session.principal, &operation, timeout).await?;
        if let (Ok(_), Some(index)) = (&carried.outcome, carried.applied) {
            self.router.wait_applied(index, FORWARDED_APPLY_WAIT).await;
        }
        carried.outcome
    }

    /// Whether the caller may: its kind's permission on its resource, then the further checks,
    /// each before anything happens, so a refused create creates nothing. A list needs a
    /// credential where anonymous may do nothing (then each item shows only if the caller may
    /// list it); a lookup is allowed to who may only look at the resource too.
    /// DetachSubscription is decided as it runs (`detach`).
    fn authorize(&self, caller: &Caller<'_>, operation: &Operation) -> Result<(), Status> {
        let kind = operation.kind();
        if kind.is_list() {
            if caller.session.credential == Credential::None && !caller.access.anonymous_may_act() {
                return Err(Status::new(
                    Code::Unauthenticated,
                    "this request carries no credential (a token or a client certificate), and anonymous may not list",
                ));
            }
            return Ok(());
        }
        if kind == Kind::DetachSubscription {
            return Ok(());
        }
        let name = operation.resource();
        match kind.alternative() {
            Some(alternative) if caller.allows(alternative, name) => {}
            _ => caller.check(kind.permission(), name)?,
        }
        for (permission, name) in operation.further_checks() {
            caller.check(permission, name)?;
        }
        Ok(())
    }

    async fn run(&self, caller: &Caller<'_>, operation: Operation) -> Result<Outcome, Status> {
        let router = &self.router;
        let shown = |permission: Permission| move |name: &str| caller.allows(permission, name);
        Ok(match operation {
            Operation::CreateTopic(topic) => Outcome::Topic(router.create_topic(topic).await?),
            Operation::GetTopic { name } => Outcome::Topic(router.get_topic(&name)?),
            Operation::UpdateTopic(update) => Outcome::Topic(router.update_topic(update).await?),
            Operation::DeleteTopic { name } => {
                router.delete_topic(&name).await?;
                Outcome::Done
            }
            Operation::ListTopics(list) => {
                Outcome::Topics(router.list_topics(&list, shown(Kind::ListTopics.permission())))
            }
            Operation::ListTopicSubscriptions(list) => {
                router.get_topic(&list.topic)?;
                let page = router.list_subscriptions(&list, shown(Kind::ListSubscriptions.permission()));
                Outcome::Subscriptions(self.shown_page(page))
            }
            Operation::ListTopicSnapshots(list) => {
                router.get_topic(&list.topic)?;
                Outcome::Snapshots(router.list_snapshots(&list, shown(Kind::ListSnapshots.permission())))
            }
            lookup @ (Operation::LookupTopic { .. }
            | Operation::LookupSubscription { .. }
            | Operation::LookupTopicSources { .. }
            | Operation::LookupSubscriptionSources { .. }) => self.lookup(caller, lookup)?,
            Operation::CreateSubscription(subscription) => {
                Outcome::Subscription(self.shown(router.create_subscription(subscription).await?))
            }
            Operation::GetSubscription { name } => {
                Outcome::Subscription(self.shown(router.get_subscription(&name)?))
            }
            Operation::UpdateSubscription(update) => {
                Outcome::Subscription(self.shown(router.update_subscription(update).await?))
            }
            Operation::ModifyPushConfig { name, push } => {
                // An update of the push configuration alone, decided and carried to the
                // subscription's forwarder as any other.
                let update = SubscriptionUpdate { name, push: Some(push), ..Default::default() };
                router.update_subscription(update).await?;
                Outcome::Done
            }
            Operation::DeleteSubscription { name } => {
                router.delete_subscription(&name).await?;
                Outcome::Done
            }
            Operation::DetachSubscription { name } => {
                self.detach(caller, &name).await?;
                Outcome::Done
            }
            Operation::ListSubscriptions(list) => {
                let page = router.list_subscriptions(&list, shown(Kind::ListSubscriptions.permission()));
                Outcome::Subscriptions(self.shown_page(page))
            }
            Operation::Seek { subscription, target } => {
                router.seek(&subscription, target).await?;
                Outcome::Done
            }
            Operation::CreateSnapshot { name, subscription, labels } => {
                Outcome::Snapshot(router.create_snapshot(&name, &subscription, labels).await?)
            }
            Operation::GetSnapshot { name } => Outcome::Snapshot(router.get_snapshot(&name)?),
            Operation::UpdateSnapshot { name, labels } => {
                Outcome::Snapshot(router.update_snapshot(&name, labels).await?)
            }
            Operation::DeleteSnapshot { name } => {
                router.delete_snapshot(&name).await?;
                Outcome::Done
            }
            Operation::ListSnapshots(list) => {
                Outcome::Snapshots(router.list_snapshots(&list, shown(Kind::ListSnapshots.permission())))
            }
            Operation::Stats => Outcome::Stats(Box::new(router.stats().await?)),
            Operation::ClusterStatus => {
                let mut status = router.cluster_status().await;
                (status.topics, status.topics_omitted) = router.topic_placements();
                Outcome::ClusterStatus(Box::new(status))
            }
            Operation::ClusterAddNode { node_id, cluster_address, voter } => {
                router.add_node(node_id, &cluster_address, voter).await?;
                Outcome::Done
            }
            Operation::ClusterRemoveNode { node_id } => match router.remove_node(node_id).await? {
                NodeRemoval::Removed => Outcome::Done,
                // This node led the catalog and handed the lead over: its successor decides.
                NodeRemoval::HandedOver(successor) => {
                    return self
                        .carry(successor, caller.session, Operation::ClusterRemoveNode { node_id })
                        .await
                }
            },
            Operation::ClusterDrain { node_id, draining } => {
                router.drain_node(node_id, draining).await?;
                Outcome::Done
            }
            Operation::ClusterDrainStatus => Outcome::Drains(router.drain_status()),
            Operation::ClusterRestrict { rule, add } => {
                router.restrict_routes(rule, add).await?;
                Outcome::Done
            }
            Operation::ClusterRestrictions => Outcome::RoutingRules(router.routing_rules()),
            Operation::ResyncDirectory { index } => {
                Outcome::Resynced(router.resync_directory(index as usize).await?)
            }
            schema @ (Operation::CreateSchema { .. }
            | Operation::CommitSchema { .. }
            | Operation::RollbackSchema { .. }
            | Operation::DeleteSchemaRevision { .. }
            | Operation::DeleteSchema { .. }
            | Operation::SetTopicSchema { .. }) => self.run_schema(schema).await?,
            read @ (Operation::GetSchema { .. }
            | Operation::ListSchemas(_)
            | Operation::ListSchemaRevisions { .. }
            | Operation::ValidateSchema { .. }
            | Operation::ValidateMessage(_)) => self.read_schema(caller, read)?,
        })
    }

    /// A schema read, or a check of a definition or a message (compiled here, on the router
    /// shard, as a schema's change is).
    fn read_schema(&self, caller: &Caller<'_>, operation: Operation) -> Result<Outcome, Status> {
        let router = &self.router;
        Ok(match operation {
            Operation::GetSchema { name } | Operation::ListSchemaRevisions { name } => {
                Outcome::Schema(router.schema(&name)?)
            }
            Operation::ListSchemas(list) => {
                let shown = |name: &str| caller.allows(Kind::ListSchemas.permission(), name);
                Outcome::Schemas(router.list_schemas(list.page_size, &list.page_token, shown))
            }
            Operation::ValidateSchema { schema_type, definition } => {
                crate::schema::Compiled::new(schema_type, &definition).map_err(Status::invalid_argument)?;
                Outcome::Done
            }
            Operation::ValidateMessage(check) => {
                self.validate_message(*check)?;
                Outcome::Done
            }
            other => return Err(Status::internal(format!("{:?} is not a schema's read", other.kind()))),
        })
    }

    /// A message checked against the revision of a schema it names (its newest when it names
    /// none), or against the definition it gives.
    fn validate_message(&self, check: MessageCheck) -> Result<(), Status> {
        let (schema_type, definition) = match check.schema.is_empty() {
            true => (check.schema_type, check.definition),
            false => {
                let schema = self.router.schema(&check.schema)?;
                let revision = match check.revision_id.is_empty() {
                    true => schema.latest(),
                    false => schema
                        .revisions
                        .iter()
                        .find(|revision| revision.revision_id == check.revision_id)
                        .ok_or_else(|| {
                            Status::new(
                                Code::NotFound,
                                format!(
                                    "Resource not found (resource={}@{}).",
                                    check.schema, check.revision_id
                                ),
                            )
                        })?,
                };
                (revision.schema_type, revision.definition.clone())
            }
        };
        let compiled =
            crate::schema::Compiled::new(schema_type, &definition).map_err(Status::invalid_argument)?;
        compiled
            .check(check.encoding, &check.message)
            .map_err(|why| Status::invalid_argument(format!("Invalid data in message: {why}")))
    }

    /// A schema's change, or a topic's schema settings. Each answers Done: the caller reads the
    /// schema from its own node, which applied the change before the answer (`carry`).
    async fn run_schema(&self, operation: Operation) -> Result<Outcome, Status> {
        let router = &self.router;
        match operation {
            Operation::CreateSchema { name, schema_type, definition } => {
                router.create_schema(&name, schema_type, &definition).await?;
            }
            Operation::CommitSchema { name, schema_type, definition } => {
                router.commit_schema(&name, schema_type, &definition).await?;
            }
            Operation::RollbackSchema { name, revision_id } => {
                router.rollback_schema(&name, &revision_id).await?;
            }
            Operation::DeleteSchemaRevision { name, revision_id } => {
                router.delete_schema_revision(&name, &revision_id).await?;
            }
            Operation::DeleteSchema { name } => router.delete_schema(&name).await?,
            Operation::SetTopicSchema { topic, settings } => {
                router.set_topic_schema(&topic, settings).await?
            }
            other => return Err(Status::internal(format!("{:?} is not a schema's change", other.kind()))),
        }
        Ok(Outcome::Done)
    }

    /// A lookup: the forwarders a client is handed for a topic or a subscription (or for each
    /// of its topic's sources), within the caller's routing restrictions.
    fn lookup(&self, caller: &Caller<'_>, operation: Operation) -> Result<Outcome, Status> {
        let (router, local, client) = (&self.router, caller.local_address, Some(caller.route_client()));
        let client = client.as_ref();
        Ok(match operation {
            Operation::LookupTopic { name } => {
                Outcome::Forwarders(router.lookup_topic(&name, local, client)?)
            }
            Operation::LookupSubscription { name } => {
                Outcome::Forwarders(router.lookup_subscription(&name, local, client)?)
            }
            Operation::LookupTopicSources { name } => {
                Outcome::Sources(router.lookup_topic_sources(&name, local, client)?)
            }
            Operation::LookupSubscriptionSources { name } => {
                Outcome::Sources(router.lookup_subscription_sources(&name, local, client)?)
            }
            other => unreachable!("not a lookup: {:?}", other.kind()),
        })
    }

    /// DetachSubscription. The request names only the subscription, so its topic, where the
    /// permission is checked (`Kind::permission`), must be looked up first; the answer must
    /// then say nothing the caller may not see. A caller allowed to update the topic of an
    /// existing subscription detaches it. Any other caller is first checked for
    /// `SubscriptionsGet` on the subscription, so that one who may not see it gets the same
    /// refusal whether it exists or not, and on whichever topic; one who may see it (and could
    /// read its topic) is told it does not exist, or refused on its topic.
    async fn detach(&self, caller: &Caller<'_>, name: &str) -> Result<(), Status> {
        let found = self.router.get_subscription(name);
        let permission = Kind::DetachSubscription.permission();
        let allowed = found.as_ref().is_ok_and(|found| caller.allows(permission, &found.topic));
        if !allowed {
            caller.check(Kind::GetSubscription.permission(), name)?;
            caller.check(permission, &found?.topic)?;
        }
        Ok(self.router.detach_subscription(name).await?)
    }

    /// A subscription with its topic's retention.
    fn shown(&self, subscription: crate::api::control::Subscription) -> SubscriptionShown {
        let topic_retention_seconds =
            self.router.get_topic(&subscription.topic).map_or(0, |topic| topic.message_retention_seconds);
        SubscriptionShown { subscription, topic_retention_seconds }
    }

    fn shown_page(
        &self,
        page: crate::api::control::Page<crate::api::control::Subscription>,
    ) -> crate::api::control::Page<SubscriptionShown> {
        crate::api::control::Page {
            items: page.items.into_iter().map(|subscription| self.shown(subscription)).collect(),
            next_page_token: page.next_page_token,
        }
    }

    /// Answers an operation another node carried here for `principal`, with the catalog index
    /// this node had applied once it ran (the carrying node waits to apply as far).
    pub async fn execute_carried(
        &self,
        access: &Access,
        principal: Principal,
        operation: Operation,
    ) -> Carried {
        let session = vouched_for(principal);
        let caller =
            Caller { session: &session, access, local_address: None, peer_address: None, carried: true };
        let outcome = self.execute(&caller, operation).await;
        Carried { applied: self.router.applied_index(), outcome }
    }
}

#[cfg(test)]
pub(crate) mod tests;
