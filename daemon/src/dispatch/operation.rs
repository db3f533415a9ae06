//! What a client asks of the daemon, whichever protocol it spoke: an `Operation` of one `Kind`,
//! naming its resource. `Kind::permission` is the one table of what each needs; `Operation`
//! adds the few checks on a second resource (a subscription's topic, a seek's snapshot).

use crate::api::control::{
    Labels, ListRequest, PushConfig, SeekTarget, Subscription, SubscriptionUpdate, Topic, TopicUpdate,
};
use crate::auth::Permission;
use crate::catalog::schemas::{SchemaEncoding, SchemaSettings, SchemaType};
use crate::ids::NodeId;

/// Every kind of request the daemon serves, data plane and control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    CreateTopic,
    GetTopic,
    UpdateTopic,
    DeleteTopic,
    ListTopics,
    /// The subscriptions of one topic (Pub/Sub's ListTopicSubscriptions).
    ListTopicSubscriptions,
    /// The snapshots of one topic (Pub/Sub's ListTopicSnapshots).
    ListTopicSnapshots,
    LookupTopic,
    CreateSubscription,
    GetSubscription,
    UpdateSubscription,
    DeleteSubscription,
    DetachSubscription,
    ListSubscriptions,
    LookupSubscription,
    Seek,
    CreateSnapshot,
    GetSnapshot,
    UpdateSnapshot,
    DeleteSnapshot,
    ListSnapshots,
    Stats,
    ClusterStatus,
    ClusterAddNode,
    ClusterRemoveNode,
    ResyncDirectory,
    Publish,
    Pull,
    StreamingPull,
    Acknowledge,
    ModifyAckDeadline,
    /// Pub/Sub's ModifyPushConfig: a subscription's push configuration alone, changed (or
    /// removed, making it pull) as an UpdateSubscription would.
    ModifyPushConfig,
    /// A node drained or undrained (`ringpost cluster drain|undrain`).
    ClusterDrain,
    /// What the draining nodes still hold.
    ClusterDrainStatus,
    /// A routing restriction added or removed (`ringpost cluster restrict add|remove`).
    ClusterRestrict,
    /// The routing restrictions.
    ClusterRestrictions,
    /// Each of a topic's publish sources with its forwarders (native `LookupSources`).
    LookupTopicSources,
    /// Each of a subscription's topic's sources with its forwarders.
    LookupSubscriptionSources,
    /// Pub/Sub's schemas: created with their first revision, revised, rolled back (a new
    /// revision of an older one's definition), a revision deleted, deleted.
    CreateSchema,
    CommitSchema,
    RollbackSchema,
    DeleteSchemaRevision,
    DeleteSchema,
    /// A topic's schema settings set or cleared (with its creation or an update).
    SetTopicSchema,
    /// Pub/Sub's schema reads: one schema, the schemas, one schema's revisions.
    GetSchema,
    ListSchemas,
    ListSchemaRevisions,
    /// A definition checked, or a message checked against a schema (named, or given).
    ValidateSchema,
    ValidateMessage,
}

impl Kind {
    /// Every kind; the tests check the table below against it. A kind's place here is its
    /// number between nodes (`dispatch::codec`), so new kinds go at the end.
    pub const ALL: [Kind; 49] = {
        use Kind::*;
        [
            CreateTopic,
            GetTopic,
            UpdateTopic,
            DeleteTopic,
            ListTopics,
            ListTopicSubscriptions,
            ListTopicSnapshots,
            LookupTopic,
            CreateSubscription,
            GetSubscription,
            UpdateSubscription,
            DeleteSubscription,
            DetachSubscription,
            ListSubscriptions,
            LookupSubscription,
            Seek,
            CreateSnapshot,
            GetSnapshot,
            UpdateSnapshot,
            DeleteSnapshot,
            ListSnapshots,
            Stats,
            ClusterStatus,
            ClusterAddNode,
            ClusterRemoveNode,
            ResyncDirectory,
            Publish,
            Pull,
            StreamingPull,
            Acknowledge,
            ModifyAckDeadline,
            ModifyPushConfig,
            ClusterDrain,
            ClusterDrainStatus,
            ClusterRestrict,
            ClusterRestrictions,
            LookupTopicSources,
            LookupSubscriptionSources,
            CreateSchema,
            CommitSchema,
            RollbackSchema,
            DeleteSchemaRevision,
            DeleteSchema,
            SetTopicSchema,
            GetSchema,
            ListSchemas,
            ListSchemaRevisions,
            ValidateSchema,
            ValidateMessage,
        ]
    };

    /// The permission an operation of this kind needs on the resource it names: the one table
    /// of who may do what, for every protocol. A list's is the permission each item it shows
    /// needs (it shows what its reader may list); a lookup's is what its client means to do
    /// with the resource (`Kind::alternative`: or only look at it). DetachSubscription's is on
    /// the subscription's topic, which only the catalog knows (as Pub/Sub asks
    /// `pubsub.topics.detachSubscription` there). UpdateSnapshot has no permission of its own
    /// in Pub/Sub beyond the snapshot's: Ringpost asks the one that made it. A schema's are
    /// Pub/Sub's `pubsub.schemas.*` on its name (the access file also grants them as before
    /// it had them: `Permission::before_schemas`); deleting a revision asks
    /// `pubsub.schemas.delete`; a check of a definition or a message given in the request asks
    /// `pubsub.schemas.validate` on the empty name.
    pub const fn permission(self) -> Permission {
        use Kind::*;
        match self {
            CreateTopic => Permission::TopicsCreate,
            CreateSchema => Permission::SchemasCreate,
            CommitSchema => Permission::SchemasCommit,
            RollbackSchema => Permission::SchemasRollback,
            DeleteSchemaRevision | DeleteSchema => Permission::SchemasDelete,
            GetSchema => Permission::SchemasGet,
            ListSchemas => Permission::SchemasList,
            ListSchemaRevisions => Permission::SchemasListRevisions,
            ValidateSchema | ValidateMessage => Permission::SchemasValidate,
            GetTopic | ListTopicSubscriptions | ListTopicSnapshots => Permission::TopicsGet,
            UpdateTopic | DetachSubscription | SetTopicSchema => Permission::TopicsUpdate,
            DeleteTopic => Permission::TopicsDelete,
            ListTopics => Permission::TopicsList,
            LookupTopic | LookupTopicSources | Publish => Permission::TopicsPublish,
            CreateSubscription => Permission::SubscriptionsCreate,
            GetSubscription => Permission::SubscriptionsGet,
            UpdateSubscription | ModifyPushConfig => Permission::SubscriptionsUpdate,
            DeleteSubscription => Permission::SubscriptionsDelete,
            ListSubscriptions => Permission::SubscriptionsList,
            LookupSubscription
            | LookupSubscriptionSources
            | Pull
            | StreamingPull
            | Acknowledge
            | ModifyAckDeadline => Permission::SubscriptionsConsume,
            Seek => Permission::SnapshotsSeek,
            CreateSnapshot | UpdateSnapshot => Permission::SnapshotsCreate,
            GetSnapshot => Permission::SnapshotsGet,
            DeleteSnapshot => Permission::SnapshotsDelete,
            ListSnapshots => Permission::SnapshotsList,
            Stats | ClusterStatus | ClusterDrainStatus | ClusterRestrictions => Permission::DaemonStats,
            ClusterAddNode | ClusterRemoveNode | ClusterDrain | ClusterRestrict | ResyncDirectory => {
                Permission::DaemonAdminister
            }
        }
    }

    /// A lookup serves both who use a resource and who only look at it: allowed with this
    /// permission too (a refusal names `permission`, the one a client that looks up means to use).
    /// A topic's schema settings are set by who may update it, or with its creation by who
    /// may create it.
    pub const fn alternative(self) -> Option<Permission> {
        match self {
            Kind::SetTopicSchema => Some(Permission::TopicsCreate),
            Kind::LookupTopic | Kind::LookupTopicSources => Some(Permission::TopicsGet),
            Kind::LookupSubscription | Kind::LookupSubscriptionSources => Some(Permission::SubscriptionsGet),
            _ => None,
        }
    }

    /// Whether it lists the catalog's resources, each shown only to who may list it.
    pub const fn is_list(self) -> bool {
        matches!(self, Kind::ListTopics | Kind::ListSubscriptions | Kind::ListSnapshots | Kind::ListSchemas)
    }

    /// Whether only the catalog's leader decides it: a node that does not lead carries it
    /// there (the one place this is written). Seek is not one: the subscription's journal is
    /// its forwarder's; nor are reads, lookups, publishes and deliveries.
    pub const fn changes_the_catalog(self) -> bool {
        use Kind::*;
        matches!(
            self,
            CreateTopic
                | UpdateTopic
                | DeleteTopic
                | CreateSubscription
                | UpdateSubscription
                | ModifyPushConfig
                | DeleteSubscription
                | DetachSubscription
                | CreateSnapshot
                | UpdateSnapshot
                | DeleteSnapshot
                | ClusterAddNode
                | ClusterRemoveNode
                | ClusterDrain
                | ClusterRestrict
                | CreateSchema
                | CommitSchema
                | RollbackSchema
                | DeleteSchemaRevision
                | DeleteSchema
                | SetTopicSchema
        )
    }

    /// Whether a node removed from its cluster still answers it: only what shows why.
    pub const fn answered_when_removed(self) -> bool {
        matches!(self, Kind::Stats | Kind::ClusterStatus)
    }

    /// Whether a forwarder serves it (the data plane), rather than the router.
    pub const fn is_data_plane(self) -> bool {
        use Kind::*;
        matches!(self, Publish | Pull | StreamingPull | Acknowledge | ModifyAckDeadline)
    }
}

/// The name the daemon's own permissions are checked with.
pub const DAEMON: &str = "";

/// A control-plane request, decoded from whichever protocol carried it. The data plane's
/// requests are checked by their `Kind` and run on their forwarder without being gathered into
/// one of these, so that a publish's messages stay where the protocol received them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    CreateTopic(Topic),
    GetTopic {
        name: String,
    },
    UpdateTopic(TopicUpdate),
    DeleteTopic {
        name: String,
    },
    ListTopics(ListRequest),
    /// `list.topic` names the topic.
    ListTopicSubscriptions(ListRequest),
    /// `list.topic` names the topic.
    ListTopicSnapshots(ListRequest),
    LookupTopic {
        name: String,
    },
    CreateSubscription(Subscription),
    GetSubscription {
        name: String,
    },
    UpdateSubscription(SubscriptionUpdate),
    /// `None`: the subscription pulls from now on.
    ModifyPushConfig {
        name: String,
        push: Option<Box<PushConfig>>,
    },
    DeleteSubscription {
        name: String,
    },
    DetachSubscription {
        name: String,
    },
    ListSubscriptions(ListRequest),
    LookupSubscription {
        name: String,
    },
    LookupTopicSources {
        name: String,
    },
    LookupSubscriptionSources {
        name: String,
    },
    Seek {
        subscription: String,
        target: SeekTarget,
    },
    CreateSnapshot {
        name: String,
        subscription: String,
        labels: Labels,
    },
    GetSnapshot {
        name: String,
    },
    /// `None` leaves the labels as they are.
    UpdateSnapshot {
        name: String,
        labels: Option<Labels>,
    },
    DeleteSnapshot {
        name: String,
    },
    ListSnapshots(ListRequest),
    Stats,
    ClusterStatus,
    ClusterAddNode {
        node_id: NodeId,
        cluster_address: String,
        voter: bool,
    },
    ClusterRemoveNode {
        node_id: NodeId,
    },
    /// Node `node_id` drains (`draining`) or no longer does.
    ClusterDrain {
        node_id: NodeId,
        draining: bool,
    },
    ClusterDrainStatus,
    /// `rule` added (`add`) or removed.
    ClusterRestrict {
        rule: crate::catalog::routing::RoutingRule,
        add: bool,
    },
    ClusterRestrictions,
    ResyncDirectory {
        index: u32,
    },
    /// Schema `name` created (`CreateSchema`) or revised (`CommitSchema`) with `definition`.
    CreateSchema {
        name: String,
        schema_type: SchemaType,
        definition: String,
    },
    CommitSchema {
        name: String,
        schema_type: SchemaType,
        definition: String,
    },
    /// A new revision of schema `name` with its revision `revision_id`'s definition.
    RollbackSchema {
        name: String,
        revision_id: String,
    },
    DeleteSchemaRevision {
        name: String,
        revision_id: String,
    },
    DeleteSchema {
        name: String,
    },
    /// Topic `topic`'s schema settings from now on (`None`: none).
    SetTopicSchema {
        topic: String,
        settings: Option<SchemaSettings>,
    },
    /// Schema `name`, every revision (the protocol shows the one it was asked).
    GetSchema {
        name: String,
    },
    /// `list.topic` is not read.
    ListSchemas(ListRequest),
    /// Schema `name`, every revision (the protocol pages them).
    ListSchemaRevisions {
        name: String,
    },
    ValidateSchema {
        schema_type: SchemaType,
        definition: String,
    },
    /// `message` checked against `schema`'s revision `revision_id` (empty: its newest), or,
    /// when `schema` is empty, against `definition` of `schema_type`.
    ValidateMessage(Box<MessageCheck>),
}

/// What a ValidateMessage checks: a message against a schema named or given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageCheck {
    pub schema: String,
    pub revision_id: String,
    pub schema_type: SchemaType,
    pub definition: String,
    pub encoding: SchemaEncoding,
    pub message: Vec<u8>,
}

impl Operation {
    pub fn kind(&self) -> Kind {
        match self {
            Operation::CreateTopic(_) => Kind::CreateTopic,
            Operation::GetTopic { .. } => Kind::GetTopic,
            Operation::UpdateTopic(_) => Kind::UpdateTopic,
            Operation::DeleteTopic { .. } => Kind::DeleteTopic,
            Operation::ListTopics(_) => Kind::ListTopics,
            Operation::ListTopicSubscriptions(_) => Kind::ListTopicSubscriptions,
            Operation::ListTopicSnapshots(_) => Kind::ListTopicSnapshots,
            Operation::LookupTopic { .. } => Kind::LookupTopic,
            Operation::CreateSubscription(_) => Kind::CreateSubscription,
            Operation::GetSubscription { .. } => Kind::GetSubscription,
            Operation::UpdateSubscription(_) => Kind::UpdateSubscription,
            Operation::ModifyPushConfig { .. } => Kind::ModifyPushConfig,
            Operation::DeleteSubscription { .. } => Kind::DeleteSubscription,
            Operation::DetachSubscription { .. } => Kind::DetachSubscription,
            Operation::ListSubscriptions(_) => Kind::ListSubscriptions,
            Operation::LookupSubscription { .. } => Kind::LookupSubscription,
            Operation::LookupTopicSources { .. } => Kind::LookupTopicSources,
            Operation::LookupSubscriptionSources { .. } => Kind::LookupSubscriptionSources,
            Operation::Seek { .. } => Kind::Seek,
            Operation::CreateSnapshot { .. } => Kind::CreateSnapshot,
            Operation::GetSnapshot { .. } => Kind::GetSnapshot,
            Operation::UpdateSnapshot { .. } => Kind::UpdateSnapshot,
            Operation::DeleteSnapshot { .. } => Kind::DeleteSnapshot,
            Operation::ListSnapshots(_) => Kind::ListSnapshots,
            Operation::Stats => Kind::Stats,
            Operation::ClusterStatus => Kind::ClusterStatus,
            Operation::ClusterAddNode { .. } => Kind::ClusterAddNode,
            Operation::ClusterRemoveNode { .. } => Kind::ClusterRemoveNode,
            Operation::ClusterDrain { .. } => Kind::ClusterDrain,
            Operation::ClusterDrainStatus => Kind::ClusterDrainStatus,
            Operation::ClusterRestrict { .. } => Kind::ClusterRestrict,
            Operation::ClusterRestrictions => Kind::ClusterRestrictions,
            Operation::ResyncDirectory { .. } => Kind::ResyncDirectory,
            Operation::CreateSchema { .. } => Kind::CreateSchema,
            Operation::CommitSchema { .. } => Kind::CommitSchema,
            Operation::RollbackSchema { .. } => Kind::RollbackSchema,
            Operation::DeleteSchemaRevision { .. } => Kind::DeleteSchemaRevision,
            Operation::DeleteSchema { .. } => Kind::DeleteSchema,
            Operation::SetTopicSchema { .. } => Kind::SetTopicSchema,
            Operation::GetSchema { .. } => Kind::GetSchema,
            Operation::ListSchemas(_) => Kind::ListSchemas,
            Operation::ListSchemaRevisions { .. } => Kind::ListSchemaRevisions,
            Operation::ValidateSchema { .. } => Kind::ValidateSchema,
            Operation::ValidateMessage(_) => Kind::ValidateMessage,
        }
    }

    /// The resource its kind's permission is checked on: its name (the daemon's is `DAEMON`;
    /// a list's is empty, its items are checked one by one; a topic's listing names the topic).
    pub fn resource(&self) -> &str {
        match self {
            Operation::CreateTopic(topic) => &topic.name,
            Operation::UpdateTopic(update) => &update.name,
            Operation::CreateSubscription(subscription) => &subscription.name,
            Operation::UpdateSubscription(update) => &update.name,
            Operation::GetTopic { name }
            | Operation::DeleteTopic { name }
            | Operation::LookupTopic { name }
            | Operation::GetSubscription { name }
            | Operation::DeleteSubscription { name }
            | Operation::DetachSubscription { name }
            | Operation::LookupSubscription { name }
            | Operation::LookupTopicSources { name }
            | Operation::LookupSubscriptionSources { name }
            | Operation::ModifyPushConfig { name, .. }
            | Operation::CreateSnapshot { name, .. }
            | Operation::GetSnapshot { name }
            | Operation::UpdateSnapshot { name, .. }
            | Operation::DeleteSnapshot { name }
            | Operation::CreateSchema { name, .. }
            | Operation::CommitSchema { name, .. }
            | Operation::RollbackSchema { name, .. }
            | Operation::DeleteSchemaRevision { name, .. }
            | Operation::DeleteSchema { name }
            | Operation::GetSchema { name }
            | Operation::ListSchemaRevisions { name } => name,
            Operation::SetTopicSchema { topic, .. } => topic,
            Operation::ValidateMessage(check) => &check.schema,
            Operation::ValidateSchema { .. } => "",
            Operation::Seek { subscription, .. } => subscription,
            Operation::ListTopicSubscriptions(list) | Operation::ListTopicSnapshots(list) => &list.topic,
            Operation::ListTopics(_)
            | Operation::ListSubscriptions(_)
            | Operation::ListSnapshots(_)
            | Operation::ListSchemas(_) => "",
            Operation::Stats
            | Operation::ClusterStatus
            | Operation::ClusterAddNode { .. }
            | Operation::ClusterRemoveNode { .. }
            | Operation::ClusterDrain { .. }
            | Operation::ClusterDrainStatus
            | Operation::ClusterRestrict { .. }
            | Operation::ClusterRestrictions
            | Operation::ResyncDirectory { .. } => DAEMON,
        }
    }

    /// What it needs beyond its kind's permission on its resource, each checked after that:
    /// a subscription's topic (to attach to it) and dead-letter topic (whose messages it
    /// publishes there, as Pub/Sub asks of its service agent), a seek's snapshot, and the
    /// subscription a snapshot captures (whose acknowledgements it reads), the schema a topic's
    /// settings name (`pubsub.schemas.attach`, as Pub/Sub asks), and the schema a message is
    /// checked against (which it reads).
    pub fn further_checks(&self) -> Vec<(Permission, &str)> {
        match self {
            Operation::CreateSubscription(subscription) => {
                let mut checks = vec![(Permission::TopicsAttachSubscription, subscription.topic.as_str())];
                dead_letter_check(&mut checks, &subscription.settings.dead_letter_topic);
                checks
            }
            Operation::UpdateSubscription(update) => {
                let mut checks = Vec::new();
                if let Some((topic, _)) = &update.dead_letter_policy {
                    dead_letter_check(&mut checks, topic);
                }
                checks
            }
            Operation::Seek { target: SeekTarget::Snapshot { name }, .. } => {
                vec![(Permission::SnapshotsGet, name.as_str())]
            }
            Operation::CreateSnapshot { subscription, .. } => {
                vec![(Permission::SubscriptionsConsume, subscription.as_str())]
            }
            Operation::SetTopicSchema { settings: Some(settings), .. } => {
                vec![(Permission::SchemasAttach, settings.schema.as_str())]
            }
            Operation::ValidateMessage(check) if !check.schema.is_empty() => {
                vec![(Permission::SchemasGet, check.schema.as_str())]
            }
            _ => Vec::new(),
        }
    }

    pub fn changes_the_catalog(&self) -> bool {
        self.kind().changes_the_catalog()
    }
}

/// A dead-letter topic's check; none when there is none (empty).
fn dead_letter_check<'a>(checks: &mut Vec<(Permission, &'a str)>, topic: &'a str) {
    if !topic.is_empty() {
        checks.push((Permission::TopicsPublish, topic));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ResourceKind;

    #[test]
    fn every_kind_is_listed_once_and_its_permission_is_on_its_resources_kind() {
        let mut seen = std::collections::HashSet::new();
        for kind in Kind::ALL {
            assert!(seen.insert(kind), "{kind:?} listed twice");
            let resource = kind.permission().resource_kind();
            let expected = match kind {
                Kind::CreateTopic
                | Kind::GetTopic
                | Kind::UpdateTopic
                | Kind::DeleteTopic
                | Kind::ListTopics
                | Kind::ListTopicSubscriptions
                | Kind::ListTopicSnapshots
                | Kind::LookupTopic
                | Kind::LookupTopicSources
                | Kind::DetachSubscription
                | Kind::Publish
                | Kind::SetTopicSchema => ResourceKind::Topic,
                Kind::CreateSchema
                | Kind::CommitSchema
                | Kind::RollbackSchema
                | Kind::DeleteSchemaRevision
                | Kind::DeleteSchema
                | Kind::GetSchema
                | Kind::ListSchemas
                | Kind::ListSchemaRevisions
                | Kind::ValidateSchema
                | Kind::ValidateMessage => ResourceKind::Schema,
                Kind::CreateSnapshot
                | Kind::GetSnapshot
                | Kind::UpdateSnapshot
                | Kind::DeleteSnapshot
                | Kind::ListSnapshots => ResourceKind::Snapshot,
                Kind::Stats
                | Kind::ClusterStatus
                | Kind::ClusterAddNode
                | Kind::ClusterRemoveNode
                | Kind::ClusterDrain
                | Kind::ClusterDrainStatus
                | Kind::ClusterRestrict
                | Kind::ClusterRestrictions
                | Kind::ResyncDirectory => ResourceKind::Daemon,
                _ => ResourceKind::Subscription,
            };
            assert_eq!(resource, expected, "{kind:?}");
            if let Some(alternative) = kind.alternative() {
                assert_eq!(alternative.resource_kind(), resource, "{kind:?}");
            }
            assert!(!(kind.is_data_plane() && kind.changes_the_catalog()), "{kind:?}");
        }
    }

    #[test]
    fn the_further_checks_name_the_second_resource() {
        let mut subscription = Subscription { name: "s".into(), topic: "t".into(), ..Default::default() };
        subscription.settings.dead_letter_topic = "dead".into();
        let create = Operation::CreateSubscription(subscription);
        assert_eq!(create.resource(), "s");
        assert_eq!(
            create.further_checks(),
            [(Permission::TopicsAttachSubscription, "t"), (Permission::TopicsPublish, "dead")]
        );
        let seek = Operation::Seek {
            subscription: "s".into(),
            target: SeekTarget::Snapshot { name: "mark".into() },
        };
        assert_eq!(seek.further_checks(), [(Permission::SnapshotsGet, "mark")]);
        let by_time = Operation::Seek { subscription: "s".into(), target: SeekTarget::Time { time_ms: 1 } };
        assert!(by_time.further_checks().is_empty());
        let update = Operation::UpdateSubscription(SubscriptionUpdate {
            name: "s".into(),
            dead_letter_policy: Some((String::new(), 0)),
            ..Default::default()
        });
        assert!(update.further_checks().is_empty(), "removing the dead-letter topic needs nothing more");
        let settings = SchemaSettings {
            schema: "orders".into(),
            encoding: SchemaEncoding::Json,
            first_revision_id: String::new(),
            last_revision_id: String::new(),
        };
        let set = Operation::SetTopicSchema { topic: "t".into(), settings: Some(settings) };
        assert_eq!(
            (set.resource(), set.further_checks()),
            ("t", vec![(Permission::SchemasAttach, "orders")])
        );
        let clear = Operation::SetTopicSchema { topic: "t".into(), settings: None };
        assert!(clear.further_checks().is_empty(), "clearing a topic's schema attaches none");
    }
}
