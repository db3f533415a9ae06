//! Administrative requests: updates of topics and subscriptions, seek, snapshots, stats,
//! data-directory resync and the cluster's status. All go to the router.

use crate::{Client, Result};
use ringpost_wire::messages::{
    ClusterAddNodeRequest, ClusterDrainRequest, ClusterDrainStatusResponse, ClusterRemoveNodeRequest,
    ClusterRestrictRequest, ClusterRestrictionsResponse, ClusterStatusResponse,
    CreateTopicWithSourcesRequest, Empty, ListRequest, NameRequest, PushConfig, ResyncDirectoryRequest,
    ResyncDirectoryResponse, RoutingRule, SeekRequest, Snapshot, SnapshotList, SnapshotRequest,
    StatsResponse, StatsWithPushResponse, Subscription, SubscriptionWithPush, SubscriptionWithPushProject,
    Topic, TopicSourcePolicyRequest, TopicWithSourcePolicy, TopicWithSources, UpdateSubscriptionRequest,
    UpdateSubscriptionWithPushProjectRequest, UpdateSubscriptionWithPushRequest, UpdateTopicRequest,
    UpdateTopicSourcesRequest,
};
use ringpost_wire::Command;
use std::time::Duration;

/// How long `add_node` waits at least: the daemon gives a new node 30 s to catch up with the
/// catalog before it answers.
pub const ADD_NODE_TIMEOUT: Duration = Duration::from_secs(40);

/// How long `remove_node` waits at least: the daemon moves the node's replicas first.
pub const REMOVE_NODE_TIMEOUT: Duration = Duration::from_secs(600);

/// The changes of a topic update: each field given is set, the others are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicUpdate {
    /// Seconds messages are kept after publish even once acknowledged; 0 removes the retention.
    pub message_retention_seconds: Option<u64>,
}

/// The changes of a subscription update: each field given is set, the others are left as they
/// are. A 0 stands for the default, as at creation. The filter, message ordering and topic
/// cannot change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionUpdate {
    /// For leases granted from now on.
    pub ack_deadline_seconds: Option<u32>,
    pub retain_acked_messages: Option<bool>,
    pub message_retention_seconds: Option<u64>,
    pub expiration_ttl_seconds: Option<u64>,
    /// The dead-letter topic and the delivery attempts before a message goes there; an empty
    /// topic (with 0 attempts) removes the policy.
    pub dead_letter_policy: Option<(String, u32)>,
    /// Minimum and maximum retry backoff in seconds; (0, 0) removes the policy.
    pub retry_policy: Option<(u32, u32)>,
    /// The push configuration; an empty endpoint makes the subscription pull. Given, the
    /// update is sent as UpdateSubscriptionWithPush, which a daemon from before push
    /// subscriptions does not know.
    pub push: Option<PushConfig>,
    /// With `push`: the project its requests name the subscription in. Given, the update is
    /// sent as UpdateSubscriptionWithPushProject, which a daemon from before the project does
    /// not know; not given, the push configuration names `PUSH_PROJECT_DEFAULT`.
    pub push_project: Option<String>,
}

impl SubscriptionUpdate {
    /// The request that makes these changes to subscription `name`: the values, and the update
    /// mask naming the fields given, as Pub/Sub names them.
    pub fn request(&self, name: &str) -> (Subscription, Vec<String>) {
        let mut subscription = Subscription { name: name.to_owned(), ..Default::default() };
        let mut mask = Vec::new();
        if let Some(seconds) = self.ack_deadline_seconds {
            subscription.ack_deadline_seconds = seconds;
            mask.push("ack_deadline_seconds");
        }
        if let Some(retain) = self.retain_acked_messages {
            subscription.retain_acked_messages = retain;
            mask.push("retain_acked_messages");
        }
        if let Some(seconds) = self.message_retention_seconds {
            subscription.message_retention_seconds = seconds;
            mask.push("message_retention_duration");
        }
        if let Some(seconds) = self.expiration_ttl_seconds {
            subscription.expiration_ttl_seconds = seconds;
            mask.push("expiration_policy");
        }
        if let Some((topic, attempts)) = &self.dead_letter_policy {
            subscription.dead_letter_topic = topic.clone();
            subscription.max_delivery_attempts = *attempts;
            mask.push("dead_letter_policy");
        }
        if let Some((minimum, maximum)) = self.retry_policy {
            subscription.minimum_backoff_seconds = minimum;
            subscription.maximum_backoff_seconds = maximum;
            mask.push("retry_policy");
        }
        (subscription, mask.into_iter().map(str::to_owned).collect())
    }
}

impl Client {
    /// Changes a topic's settings (UpdateTopic) and returns the topic as it now is. Nothing
    /// to change is `InvalidArgument`.
    pub async fn update_topic(&self, name: &str, update: TopicUpdate) -> Result<Topic> {
        let mut topic = Topic { name: name.to_owned(), ..Default::default() };
        let mut update_mask = Vec::new();
        if let Some(seconds) = update.message_retention_seconds {
            topic.message_retention_seconds = seconds;
            update_mask.push("message_retention_duration".to_owned());
        }
        self.control(Command::UpdateTopic, &UpdateTopicRequest { topic, update_mask }).await
    }

    /// Creates `topic` with `sources` publish sources (0 or 1: one), each a replicated log of
    /// `replicas` nodes (0: the cluster's default) with its own leader, on a forwarder shard of
    /// its own: a topic has at most as many sources as the cluster has shards to give them.
    pub async fn create_topic_with_sources(
        &self,
        topic: Topic,
        replicas: u32,
        sources: u32,
    ) -> Result<TopicWithSources> {
        let request = CreateTopicWithSourcesRequest { topic, replicas, sources };
        self.control(Command::CreateTopicWithSources, &request).await
    }

    /// A topic with each of its sources' leader, source 0 first. A daemon from before sources
    /// does not know the command (`Unimplemented`): its topic comes then, with no source listed,
    /// which means one.
    pub async fn get_topic_with_sources(&self, name: &str) -> Result<TopicWithSources> {
        let request = NameRequest { name: name.to_owned() };
        match self.control(Command::GetTopicWithSources, &request).await {
            Err(error) if error.code() == crate::ErrorCode::Unimplemented => {
                Ok(TopicWithSources { topic: self.get_topic(name).await?, ..Default::default() })
            }
            answered => answered,
        }
    }

    /// Raises a topic's number of publish sources to `sources` (never lowers it: a source is
    /// not retired yet).
    pub async fn update_topic_sources(&self, name: &str, sources: u32) -> Result<TopicWithSources> {
        let request = UpdateTopicSourcesRequest { name: name.to_owned(), sources };
        self.control(Command::UpdateTopicSources, &request).await
    }

    /// A topic with its sources and whether their number follows its load. A daemon from before
    /// following the load does not know the command (`Unimplemented`): its topic comes then,
    /// its count fixed.
    pub async fn get_topic_source_policy(&self, name: &str) -> Result<TopicWithSourcePolicy> {
        let request =
            TopicSourcePolicyRequest { name: name.to_owned(), change: false, sources_min: 0, sources_max: 0 };
        match self.control(Command::TopicSourcePolicy, &request).await {
            Err(error) if error.code() == crate::ErrorCode::Unimplemented => Ok(TopicWithSourcePolicy {
                topic: self.get_topic_with_sources(name).await?,
                ..Default::default()
            }),
            answered => answered,
        }
    }

    /// Makes a topic's number of publish sources follow its load, from `min` to `max` sources
    /// (`max` 0: as many as the cluster can place, within the daemon's bound), adding sources
    /// up to `min` first. A daemon from before it refuses it (`Unimplemented`).
    pub async fn follow_topic_load(&self, name: &str, min: u32, max: u32) -> Result<TopicWithSourcePolicy> {
        let request = TopicSourcePolicyRequest {
            name: name.to_owned(),
            change: true,
            sources_min: min,
            sources_max: max,
        };
        self.control(Command::TopicSourcePolicy, &request).await
    }

    /// Changes a subscription's settings (UpdateSubscription) and returns the subscription as
    /// it now is. Nothing to change is `InvalidArgument`.
    pub async fn update_subscription(&self, name: &str, update: SubscriptionUpdate) -> Result<Subscription> {
        Ok(self.update_subscription_with_push(name, update).await?.subscription)
    }

    /// `update_subscription`, answered with the subscription's push configuration too. Without
    /// a push change it is an UpdateSubscription, whose answer shows none (and a daemon from
    /// before push subscriptions serves it).
    pub async fn update_subscription_with_push(
        &self,
        name: &str,
        update: SubscriptionUpdate,
    ) -> Result<SubscriptionWithPush> {
        Ok(self.update_subscription_with_push_project(name, update).await?.subscription)
    }

    /// `update_subscription_with_push`, answered with the project the subscription's push
    /// requests name it in too (empty when that is not known: a pull subscription, or an update
    /// without a push change).
    pub async fn update_subscription_with_push_project(
        &self,
        name: &str,
        update: SubscriptionUpdate,
    ) -> Result<SubscriptionWithPushProject> {
        let (subscription, mut update_mask) = update.request(name);
        let Some(push) = update.push else {
            let subscription = self.update_subscription_fields(subscription, update_mask).await?;
            return Ok(SubscriptionWithPushProject {
                subscription: SubscriptionWithPush { subscription, push: PushConfig::default() },
                push_project: String::new(),
            });
        };
        update_mask.push("push_config".to_owned());
        let request = UpdateSubscriptionWithPushRequest {
            subscription: SubscriptionWithPush { subscription, push },
            update_mask,
        };
        match update.push_project {
            None => {
                let subscription: SubscriptionWithPush =
                    self.control(Command::UpdateSubscriptionWithPush, &request).await?;
                let push_project = match subscription.push.endpoint.is_empty() {
                    true => String::new(),
                    false => ringpost_wire::limits::PUSH_PROJECT_DEFAULT.to_owned(),
                };
                Ok(SubscriptionWithPushProject { subscription, push_project })
            }
            Some(push_project) => {
                let request = UpdateSubscriptionWithPushProjectRequest { request, push_project };
                self.control(Command::UpdateSubscriptionWithPushProject, &request).await
            }
        }
    }

    /// UpdateSubscription as Pub/Sub has it: the fields `update_mask` names (Pub/Sub's names:
    /// `ack_deadline_seconds`, `message_retention_duration`, `dead_letter_policy`, ...) take
    /// their values from `subscription`, whose name says which one to change.
    pub async fn update_subscription_fields(
        &self,
        subscription: Subscription,
        update_mask: Vec<String>,
    ) -> Result<Subscription> {
        self.control(Command::UpdateSubscription, &UpdateSubscriptionRequest { subscription, update_mask })
            .await
    }

    /// Per topic and subscription: offsets, backlog, outstanding, delivery counters, oldest
    /// unacknowledged age; per shard: data directories and whether they are fenced.
    /// The version the server reports (its `Hello`).
    pub async fn server_version(&self) -> Result<String> {
        let hello = ringpost_wire::messages::HelloRequest {
            protocol_version: ringpost_wire::limits::PROTOCOL_VERSION,
            client_name: "ringpost-client".into(),
        };
        let response: ringpost_wire::messages::HelloResponse = self.control(Command::Hello, &hello).await?;
        Ok(response.server_version)
    }

    pub async fn stats(&self) -> Result<StatsResponse> {
        self.control(Command::Stats, &Empty {}).await
    }

    /// `stats`, with each push subscription's endpoint, window, outstanding pushes, last error
    /// and pushes by outcome. A daemon from before push subscriptions does not know the command
    /// (`Unimplemented`): its stats come then, with no push subscription.
    pub async fn stats_with_push(&self) -> Result<StatsWithPushResponse> {
        match self.control(Command::StatsWithPush, &Empty {}).await {
            Err(error) if error.code() == crate::ErrorCode::Unimplemented => {
                Ok(StatsWithPushResponse { stats: self.stats().await?, push_subscriptions: Vec::new() })
            }
            answered => answered,
        }
    }

    /// The catalog's raft group as the router that answers sees it: the catalog's leader, the
    /// term, how far its log goes and is applied, and each member (voter or learner, role and,
    /// when the answering node leads, how far it is replicated).
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse> {
        self.control(Command::ClusterStatus, &Empty {}).await
    }

    /// Adds node `node_id`, started with `--join` and reached by the other nodes at
    /// `cluster_address`, to the cluster: a learner of the catalog, then a voter if `voter`.
    /// Answered once it caught up with the catalog (the daemon waits up to 30 s; this waits
    /// `ADD_NODE_TIMEOUT` or the request timeout, the longer). Adding a member again is done
    /// at once, or promotes a learner.
    pub async fn add_node(&self, node_id: u64, cluster_address: &str, voter: bool) -> Result<()> {
        let request = ClusterAddNodeRequest { node_id, cluster_address: cluster_address.to_owned(), voter };
        let timeout = self.request_timeout.max(ADD_NODE_TIMEOUT);
        let _: Empty = self.control_within(Command::ClusterAddNode, &request, timeout).await?;
        Ok(())
    }

    /// Removes node `node_id` from the cluster, once its replicas are moved to other nodes;
    /// refused (`FailedPrecondition`) while a topic of one replica is on it. Waits
    /// `REMOVE_NODE_TIMEOUT` or the request timeout, the longer. Stop the node once it is
    /// removed.
    pub async fn remove_node(&self, node_id: u64) -> Result<()> {
        let request = ClusterRemoveNodeRequest { node_id };
        let timeout = self.request_timeout.max(REMOVE_NODE_TIMEOUT);
        let _: Empty = self.control_within(Command::ClusterRemoveNode, &request, timeout).await?;
        Ok(())
    }

    /// Drains node `node_id` (`draining`), or no longer: once the catalog records it, routers
    /// hand out none of its forwarders and the catalog's leader moves its leaderships away.
    /// Answered once recorded; `drain_status` tells when the node is empty.
    pub async fn drain_node(&self, node_id: u64, draining: bool) -> Result<()> {
        let _: Empty =
            self.control(Command::ClusterDrain, &ClusterDrainRequest { node_id, draining }).await?;
        Ok(())
    }

    /// Adds (`add`) or removes a routing restriction: which clients (a principal, or a source
    /// range `ADDRESS/PREFIX`) may (`allow`) or may not be handed which nodes' forwarders.
    pub async fn restrict_routes(&self, rule: RoutingRule, add: bool) -> Result<()> {
        let _: Empty = self.control(Command::ClusterRestrict, &ClusterRestrictRequest { add, rule }).await?;
        Ok(())
    }

    /// The routing restrictions, in the order they were added.
    pub async fn routing_rules(&self) -> Result<ClusterRestrictionsResponse> {
        self.control(Command::ClusterRestrictions, &Empty {}).await
    }

    /// Every draining node and what it still holds.
    pub async fn drain_status(&self) -> Result<ClusterDrainStatusResponse> {
        self.control(Command::ClusterDrainStatus, &Empty {}).await
    }

    /// Seeks a subscription to a time (milliseconds since the Unix epoch): messages published
    /// before it count as acknowledged, messages from it on as not, including acknowledged ones
    /// still retained (`retain_acked_messages` or a topic retention keeps them for replay).
    pub async fn seek(&self, subscription: &str, time_ms: u64) -> Result<()> {
        let request = SeekRequest { subscription: subscription.to_owned(), time_ms, snapshot: String::new() };
        let _: Empty = self.control(Command::Seek, &request).await?;
        Ok(())
    }

    /// Seeks a subscription to a snapshot of the same topic: exactly the messages unacknowledged
    /// when the snapshot was taken (and those published since) are delivered again.
    pub async fn seek_to_snapshot(&self, subscription: &str, snapshot: &str) -> Result<()> {
        let request =
            SeekRequest { subscription: subscription.to_owned(), time_ms: 0, snapshot: snapshot.to_owned() };
        let _: Empty = self.control(Command::Seek, &request).await?;
        Ok(())
    }

    /// Captures a subscription's acknowledgements as a snapshot, which keeps the messages it
    /// needs for up to 7 days.
    pub async fn create_snapshot(&self, name: &str, subscription: &str) -> Result<Snapshot> {
        let request = SnapshotRequest { name: name.to_owned(), subscription: subscription.to_owned() };
        self.control(Command::CreateSnapshot, &request).await
    }

    /// A snapshot's topic and expiry (`NotFound` if there is no such snapshot).
    pub async fn get_snapshot(&self, name: &str) -> Result<Snapshot> {
        self.control(Command::GetSnapshot, &NameRequest { name: name.to_owned() }).await
    }

    pub async fn delete_snapshot(&self, name: &str) -> Result<()> {
        let _: Empty = self.control(Command::DeleteSnapshot, &NameRequest { name: name.to_owned() }).await?;
        Ok(())
    }

    /// Every snapshot, following pages.
    pub async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        let mut snapshots = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = ListRequest { topic: String::new(), page_size: 1000, page_token };
            let page: SnapshotList = self.control(Command::ListSnapshots, &request).await?;
            snapshots.extend(page.snapshots);
            if page.next_page_token.is_empty() {
                return Ok(snapshots);
            }
            page_token = page.next_page_token;
        }
    }

    /// Brings fenced data directory `index` (0-based, in `--data-dir` order) back: every log's
    /// copy in it is rewritten from healthy copies, then it takes writes again.
    pub async fn resync_directory(&self, index: u32) -> Result<ResyncDirectoryResponse> {
        self.control(Command::ResyncDirectory, &ResyncDirectoryRequest { index }).await
    }
}
