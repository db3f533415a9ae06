//! The command table: one code per request kind. A response carries the code of its request
//! with the `RESPONSE` flag set. Codes are stable; a retired code is never reused.

/// Every request a client, forwarder or router can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Command {
    /// `HelloRequest` → `HelloResponse`: protocol version and the server's limits.
    Hello = 1,
    /// `AuthenticateRequest` → `AuthenticateResponse` (every port): present a credential; the
    /// connection then acts as its principal. Served by the connection itself, in order: a
    /// request sent after it, without waiting for its answer, runs as the principal.
    Authenticate = 2,
    /// `Topic` → `Topic` (router).
    CreateTopic = 10,
    /// `NameRequest` → `Topic` (router).
    GetTopic = 11,
    /// `CreateTopicRequest` → `Topic` (router): `CreateTopic` with its replicas' number.
    CreateReplicatedTopic = 16,
    /// `CreateTopicWithSourcesRequest` → `TopicWithSources` (router): `CreateReplicatedTopic`
    /// with its publish sources' number.
    CreateTopicWithSources = 17,
    /// `NameRequest` → `TopicWithSources` (router): `GetTopic` with its sources and their
    /// leaders. A daemon from before sources answers `Unimplemented`; ask `GetTopic` then (a
    /// topic there has one source).
    GetTopicWithSources = 18,
    /// `UpdateTopicSourcesRequest` → `TopicWithSources` (router): raise a topic's sources'
    /// number (never lowered yet).
    UpdateTopicSources = 19,
    /// `TopicSourcePolicyRequest` → `TopicWithSourcePolicy` (router): a topic with its sources
    /// and whether their number follows its load; with `change`, makes it follow the load
    /// within the bounds given (`ringpost topic update --sources auto`), adding sources up to
    /// the least first. A daemon from before it answers `Unimplemented` (its topics' counts are
    /// fixed). Code 121: the codes near 20 were taken before sources.
    TopicSourcePolicy = 121,
    /// `ListRequest` → `TopicList` (router).
    ListTopics = 12,
    /// `NameRequest` → `Empty` (router).
    DeleteTopic = 13,
    /// `NameRequest` → `LookupResponse` (router): which forwarders serve a topic.
    LookupTopic = 14,
    /// `UpdateTopicRequest` → `Topic` (router): change the fields its update mask names.
    UpdateTopic = 15,
    /// `Subscription` → `Subscription` (router).
    CreateSubscription = 20,
    /// `NameRequest` → `Subscription` (router).
    GetSubscription = 21,
    /// `ListRequest` → `SubscriptionList` (router).
    ListSubscriptions = 22,
    /// `NameRequest` → `Empty` (router).
    DeleteSubscription = 23,
    /// `NameRequest` → `LookupResponse` (router): which forwarders serve a subscription.
    LookupSubscription = 24,
    /// `UpdateSubscriptionRequest` → `Subscription` (router): change the fields its update
    /// mask names.
    UpdateSubscription = 25,
    /// `SubscriptionWithPush` → `SubscriptionWithPush` (router): `CreateSubscription` with a
    /// push configuration.
    CreateSubscriptionWithPush = 26,
    /// `NameRequest` → `SubscriptionWithPush` (router): `GetSubscription` with its push
    /// configuration.
    GetSubscriptionWithPush = 27,
    /// `UpdateSubscriptionWithPushRequest` → `SubscriptionWithPush` (router):
    /// `UpdateSubscription`, whose mask may also name `push_config`.
    UpdateSubscriptionWithPush = 28,
    /// `ModifyPushConfigRequest` → `Empty` (router): change a subscription's push
    /// configuration alone; an empty endpoint makes it pull.
    ModifyPushConfig = 29,
    /// `PublishRequest` → `PublishResponse` (forwarder owning the topic).
    Publish = 30,
    /// `PullRequest` → `PullResponse` (forwarder owning the subscription).
    Pull = 40,
    /// `AcknowledgeRequest` → `AckResponse` (forwarder owning the subscription).
    Acknowledge = 41,
    /// `ModifyAckDeadlineRequest` → `AckResponse`; a deadline of 0 is a nack.
    ModifyAckDeadline = 42,
    /// `StreamingPullRequest` → a stream of `PullResponse` frames flagged `FLAG_MORE`, for as
    /// long as the connection stays open (forwarder). Acknowledgements and deadline changes
    /// for its messages are ordinary `Acknowledge` and `ModifyAckDeadline` requests; they free
    /// the stream's flow-control window.
    StreamingPull = 43,
    /// `SeekRequest` → `Empty` (router): move a subscription's acknowledgements to a time or
    /// to a snapshot.
    Seek = 50,
    /// `SnapshotRequest` → `Snapshot` (router): capture a subscription's acknowledgements.
    CreateSnapshot = 51,
    /// `ListRequest` → `SnapshotList` (router).
    ListSnapshots = 52,
    /// `NameRequest` → `Empty` (router).
    DeleteSnapshot = 53,
    /// `NameRequest` → `Snapshot` (router).
    GetSnapshot = 54,
    /// `Empty` → `StatsResponse` (router): topics, subscriptions, shards and data directories.
    Stats = 60,
    /// `Empty` → `StatsWithPushResponse` (router): `Stats`, and each push subscription's
    /// endpoint, window, outstanding pushes, last error and pushes by outcome. A daemon from
    /// before push subscriptions answers `Unimplemented`; ask `Stats` then.
    StatsWithPush = 65,
    /// `ResyncDirectoryRequest` → `ResyncDirectoryResponse` (router): bring a fenced data
    /// directory back by rewriting every log's copy in it from healthy copies.
    ResyncDirectory = 61,
    /// `Empty` → `ClusterStatusResponse` (router): the catalog's raft group as the answering
    /// node sees it: leader, term, log and applied index, and each member.
    ClusterStatus = 62,
    /// `ClusterAddNodeRequest` → `Empty` (router, decided by the catalog's leader): a node
    /// started with `--join` becomes a learner of the catalog, then a voter if asked.
    ClusterAddNode = 63,
    /// `ClusterRemoveNodeRequest` → `Empty` (router, decided by the catalog's leader): a node
    /// that holds no topic leaves the cluster.
    ClusterRemoveNode = 64,
    /// `ClusterDrainRequest` → `Empty` (router, decided by the catalog's leader): a node drains
    /// (its forwarders handed to no one, its leaderships moved) or no longer does. A daemon
    /// from before drains answers `InvalidArgument` (unknown command).
    ClusterDrain = 66,
    /// `Empty` → `ClusterDrainStatusResponse` (router): what each draining node still holds.
    ClusterDrainStatus = 67,
    /// `ClusterRestrictRequest` → `Empty` (router, decided by the catalog's leader): a routing
    /// restriction added or removed.
    ClusterRestrict = 68,
    /// `Empty` → `ClusterRestrictionsResponse` (router): the routing restrictions.
    ClusterRestrictions = 69,
    /// `PeerMessage` → `PeerMessage` (cluster port): the catalog's raft AppendEntries, from its
    /// leader to another voter. The bytes are the catalog's own encoding of the request.
    PeerAppendEntries = 70,
    /// `PeerMessage` → `PeerMessage` (cluster port): the catalog's raft RequestVote.
    PeerVote = 71,
    /// `PeerMessage` → `PeerMessage` (cluster port): a whole catalog snapshot, for a voter too
    /// far behind for the raft log.
    PeerSnapshot = 72,
    /// `PeerMessage` → `PeerMessage` (cluster port): a read index from the catalog's leader, so
    /// that a starting node applies everything committed before it acts on the catalog.
    PeerReadIndex = 73,
    /// `PeerMessage` → `PeerMessage` (cluster port): a control request for one of the
    /// answering node's forwarders, from the catalog's leader.
    PeerControl = 74,
    /// `PeerMessage` → `PeerMessage` (cluster port): a node's registration (its addresses and
    /// forwarder shards), for the catalog's leader to decide.
    PeerRegister = 75,
    /// `PeerMessage` → `PeerMessage` (cluster port): a client's catalog change that reached a
    /// node not leading the catalog, carried to the leader with the client's principal; the
    /// answer is the leader's response frame and the index the change applied at.
    PeerForward = 76,
    /// `PeerMessage` → `PeerMessage` (cluster port): a subscription idle past its expiration
    /// policy on the sending node's forwarder, for the catalog's leader to delete.
    PeerExpireSubscription = 77,
    /// `PeerMessage` → `PeerMessage` (cluster port): the catalog's leader's view of the cluster
    /// (every member's role and replication), for a `ClusterStatus` another node answers.
    PeerClusterStatus = 78,
    /// `PeerMessage` → `PeerMessage` (cluster port): topics whose leader's node restarted, for
    /// the catalog's leader to elect new leaders of.
    PeerWantElections = 79,
    /// `PeerMessage` → `PeerMessage` (a forwarder's port, from another node's forwarder that
    /// presented the cluster's secret): a replicated source's sync, records, fencing round or
    /// read, in the daemon's own encoding.
    Replica = 80,
    /// `CarriedRequest` → the carried command's answer (a forwarder's port, from another node's
    /// forwarder that presented the cluster's secret): a publish, pull, acknowledgement,
    /// deadline change or streaming pull that node's client sent, with the principal that node
    /// authenticated it as; decided here for that principal, with this node's access file.
    Carried = 81,
    /// `SubscriptionWithPushProject` → `SubscriptionWithPushProject` (router):
    /// `CreateSubscriptionWithPush` with the project its push requests name. A daemon from
    /// before the project refuses it as unknown; `CreateSubscriptionWithPush` pushes in the
    /// default project there.
    CreateSubscriptionWithPushProject = 90,
    /// `NameRequest` → `SubscriptionWithPushProject` (router): `GetSubscriptionWithPush` with
    /// the project its push requests name.
    GetSubscriptionWithPushProject = 91,
    /// `UpdateSubscriptionWithPushProjectRequest` → `SubscriptionWithPushProject` (router):
    /// `UpdateSubscriptionWithPush` with the project, read where the mask names `push_config`.
    UpdateSubscriptionWithPushProject = 92,
    /// `ModifyPushConfigWithProjectRequest` → `Empty` (router): `ModifyPushConfig` with the
    /// project its push requests name.
    ModifyPushConfigWithProject = 93,
    /// `PeerMessage` → `PeerMessage` (cluster port): the answering node's push signing key
    /// (`kid`, `n`, `e`), which every node serves in its JWK Set. A node from before the
    /// command refuses it as unknown; the asking node then serves no key of it.
    PeerPushKey = 82,
    /// `PeerMessage` → `PeerMessage` (cluster port): the catalog's raft TransferLeader, from
    /// a leader handing its lead to the answering voter (a draining or leaving node). A node
    /// from before the command refuses it as unknown; the voters then elect a leader once the
    /// old one's lease ends, as without it.
    PeerTransferLeader = 83,
    /// `LookupSourcesRequest` → `LookupSourcesResponse` (router): each of a topic's (or a
    /// subscription's topic's) publish sources with its forwarders, most preferred first, and
    /// how many take publishes. A daemon from before answers `Unimplemented`; ask `LookupTopic`
    /// or `LookupSubscription` then (a topic there has one source). Code 120: 20, which the
    /// sources' work reserved for it, is `CreateSubscription`'s since the start.
    LookupSources = 120,
    /// `SchemaRequest` → `Schema` (router, decided by the catalog's leader): a schema created
    /// with its first revision. Commands 31 to 39 and 44 to 47 are the schemas'; a daemon from
    /// before them refuses them as unknown.
    CreateSchema = 31,
    /// `GetSchemaRequest` → `Schema` (router).
    GetSchema = 32,
    /// `ListSchemasRequest` → `SchemaList` (router).
    ListSchemas = 33,
    /// `ListSchemasRequest` → `SchemaList` (router): one schema's revisions, newest first.
    ListSchemaRevisions = 34,
    /// `SchemaRequest` → `Schema` (router, leader): a new revision.
    CommitSchema = 35,
    /// `SchemaRevisionRequest` → `Schema` (router, leader): a new revision of an older one's
    /// definition.
    RollbackSchema = 36,
    /// `SchemaRevisionRequest` → `Schema` (router, leader): one revision deleted, never the
    /// only one; answers the schema's newest.
    DeleteSchemaRevision = 37,
    /// `NameRequest` → `Empty` (router, leader): a schema deleted; its topics' settings then
    /// name `_deleted-schema_`.
    DeleteSchema = 38,
    /// `SchemaRequest` → `Empty` (router): whether a definition is one of its type.
    ValidateSchema = 39,
    /// `ValidateMessageRequest` → `Empty` (router): whether a message matches a schema.
    ValidateMessage = 44,
    /// `CreateTopicWithSchemaRequest` → `TopicWithSchema` (router): `CreateTopicWithSources`
    /// with schema settings, refused before the topic is made when they name no schema the
    /// caller may attach, or revisions it lacks.
    CreateTopicWithSchema = 45,
    /// `UpdateTopicSchemaRequest` → `TopicWithSchema` (router): a topic's schema settings set
    /// or cleared.
    UpdateTopicSchema = 46,
    /// `NameRequest` → `TopicWithSchema` (router): `GetTopicWithSources` with its schema
    /// settings.
    GetTopicWithSchema = 47,
}

impl Command {
    /// Every command. The tests check this table for duplicate and missing codes.
    pub const ALL: [Command; 75] = [
        Command::Hello,
        Command::Authenticate,
        Command::CreateTopic,
        Command::GetTopic,
        Command::ListTopics,
        Command::DeleteTopic,
        Command::LookupTopic,
        Command::LookupSources,
        Command::UpdateTopic,
        Command::CreateReplicatedTopic,
        Command::CreateTopicWithSources,
        Command::GetTopicWithSources,
        Command::UpdateTopicSources,
        Command::TopicSourcePolicy,
        Command::CreateSubscription,
        Command::GetSubscription,
        Command::ListSubscriptions,
        Command::DeleteSubscription,
        Command::LookupSubscription,
        Command::UpdateSubscription,
        Command::CreateSubscriptionWithPush,
        Command::GetSubscriptionWithPush,
        Command::UpdateSubscriptionWithPush,
        Command::ModifyPushConfig,
        Command::CreateSubscriptionWithPushProject,
        Command::GetSubscriptionWithPushProject,
        Command::UpdateSubscriptionWithPushProject,
        Command::ModifyPushConfigWithProject,
        Command::Publish,
        Command::Pull,
        Command::Acknowledge,
        Command::ModifyAckDeadline,
        Command::StreamingPull,
        Command::Seek,
        Command::CreateSnapshot,
        Command::ListSnapshots,
        Command::DeleteSnapshot,
        Command::GetSnapshot,
        Command::Stats,
        Command::StatsWithPush,
        Command::ResyncDirectory,
        Command::ClusterStatus,
        Command::ClusterAddNode,
        Command::ClusterRemoveNode,
        Command::ClusterDrain,
        Command::ClusterDrainStatus,
        Command::ClusterRestrict,
        Command::ClusterRestrictions,
        Command::PeerAppendEntries,
        Command::PeerVote,
        Command::PeerSnapshot,
        Command::PeerReadIndex,
        Command::PeerControl,
        Command::PeerRegister,
        Command::PeerForward,
        Command::PeerExpireSubscription,
        Command::PeerClusterStatus,
        Command::PeerWantElections,
        Command::PeerPushKey,
        Command::PeerTransferLeader,
        Command::Replica,
        Command::Carried,
        Command::CreateSchema,
        Command::GetSchema,
        Command::ListSchemas,
        Command::ListSchemaRevisions,
        Command::CommitSchema,
        Command::RollbackSchema,
        Command::DeleteSchemaRevision,
        Command::DeleteSchema,
        Command::ValidateSchema,
        Command::ValidateMessage,
        Command::CreateTopicWithSchema,
        Command::UpdateTopicSchema,
        Command::GetTopicWithSchema,
    ];

    pub fn from_u16(code: u16) -> Option<Command> {
        Some(match code {
            1 => Command::Hello,
            2 => Command::Authenticate,
            10 => Command::CreateTopic,
            11 => Command::GetTopic,
            12 => Command::ListTopics,
            13 => Command::DeleteTopic,
            14 => Command::LookupTopic,
            15 => Command::UpdateTopic,
            16 => Command::CreateReplicatedTopic,
            17 => Command::CreateTopicWithSources,
            18 => Command::GetTopicWithSources,
            19 => Command::UpdateTopicSources,
            121 => Command::TopicSourcePolicy,
            20 => Command::CreateSubscription,
            21 => Command::GetSubscription,
            22 => Command::ListSubscriptions,
            23 => Command::DeleteSubscription,
            24 => Command::LookupSubscription,
            25 => Command::UpdateSubscription,
            26 => Command::CreateSubscriptionWithPush,
            27 => Command::GetSubscriptionWithPush,
            28 => Command::UpdateSubscriptionWithPush,
            29 => Command::ModifyPushConfig,
            30 => Command::Publish,
            40 => Command::Pull,
            41 => Command::Acknowledge,
            42 => Command::ModifyAckDeadline,
            43 => Command::StreamingPull,
            50 => Command::Seek,
            51 => Command::CreateSnapshot,
            52 => Command::ListSnapshots,
            53 => Command::DeleteSnapshot,
            54 => Command::GetSnapshot,
            60 => Command::Stats,
            61 => Command::ResyncDirectory,
            62 => Command::ClusterStatus,
            63 => Command::ClusterAddNode,
            64 => Command::ClusterRemoveNode,
            65 => Command::StatsWithPush,
            66 => Command::ClusterDrain,
            67 => Command::ClusterDrainStatus,
            68 => Command::ClusterRestrict,
            69 => Command::ClusterRestrictions,
            70 => Command::PeerAppendEntries,
            71 => Command::PeerVote,
            72 => Command::PeerSnapshot,
            73 => Command::PeerReadIndex,
            74 => Command::PeerControl,
            75 => Command::PeerRegister,
            76 => Command::PeerForward,
            77 => Command::PeerExpireSubscription,
            78 => Command::PeerClusterStatus,
            79 => Command::PeerWantElections,
            80 => Command::Replica,
            81 => Command::Carried,
            82 => Command::PeerPushKey,
            90 => Command::CreateSubscriptionWithPushProject,
            91 => Command::GetSubscriptionWithPushProject,
            92 => Command::UpdateSubscriptionWithPushProject,
            93 => Command::ModifyPushConfigWithProject,
            83 => Command::PeerTransferLeader,
            120 => Command::LookupSources,
            31 => Command::CreateSchema,
            32 => Command::GetSchema,
            33 => Command::ListSchemas,
            34 => Command::ListSchemaRevisions,
            35 => Command::CommitSchema,
            36 => Command::RollbackSchema,
            37 => Command::DeleteSchemaRevision,
            38 => Command::DeleteSchema,
            39 => Command::ValidateSchema,
            44 => Command::ValidateMessage,
            45 => Command::CreateTopicWithSchema,
            46 => Command::UpdateTopicSchema,
            47 => Command::GetTopicWithSchema,
            _ => return None,
        })
    }

    pub fn code(self) -> u16 {
        self as u16
    }

    /// Whether the router shard (control plane) serves this command; the rest are served by
    /// the forwarder that owns the resource.
    pub fn is_control_plane(self) -> bool {
        !matches!(
            self,
            Command::Publish
                | Command::Pull
                | Command::Acknowledge
                | Command::ModifyAckDeadline
                | Command::StreamingPull
        )
    }
}
