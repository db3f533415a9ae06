//! The router's side of the native protocol: a frame's command and body are decoded into the
//! door's operation (`crate::dispatch`), which decides who may and where it runs, and its
//! outcome is encoded as the response frame.

use crate::api::cluster::ClusterStatus;
use crate::api::control::{
    ForwarderAddress, ListRequest, OidcToken, Page, PushConfig, PushWrapper, SeekTarget, Snapshot,
    SourceRoutes, Subscription, SubscriptionSettings, SubscriptionUpdate, Topic, TopicUpdate,
};
use crate::api::{Code, Status};
use crate::catalog::routing::{Cidr, ClientSelector, RoutingRule};
use crate::catalog::PUSH_PROJECT_DEFAULT;
use crate::dispatch::{Caller, Door, Operation, Outcome, SubscriptionShown};
use crate::ids::NodeId;
use crate::net::server::{fail, respond, Handler, Responder, Response};
use crate::storage::Storage;
use ringpost_wire::frame::{access_body, FrameBuffer, FrameHeader};
use ringpost_wire::limits::{
    FRAME_BODY_BYTES_MAX, MESSAGE_BYTES_MAX, PROTOCOL_VERSION, PUBLISH_BATCH_MESSAGES_MAX,
};
use ringpost_wire::messages as wire;
use ringpost_wire::validate::{
    validate_subscription_update, validate_subscription_with_push_update, validate_topic_update,
    SubscriptionChanges,
};
use ringpost_wire::Command;

pub fn hello_response(header: &FrameHeader) -> FrameBuffer {
    respond(
        header,
        &wire::HelloResponse {
            protocol_version: PROTOCOL_VERSION,
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            frame_body_bytes_max: FRAME_BODY_BYTES_MAX as u32,
            message_bytes_max: MESSAGE_BYTES_MAX as u32,
            publish_batch_messages_max: PUBLISH_BATCH_MESSAGES_MAX as u32,
        },
    )
}

fn name(body: &[u8]) -> Result<String, Status> {
    Ok(access_body::<wire::NameRequest>(body)?.name.as_str().to_owned())
}

fn list_request(body: &[u8]) -> Result<ListRequest, Status> {
    let request = access_body::<wire::ListRequest>(body)?;
    Ok(ListRequest {
        topic: request.topic.as_str().to_owned(),
        page_size: request.page_size.to_native(),
        page_token: request.page_token.as_str().to_owned(),
    })
}

fn topic_request(body: &[u8]) -> Result<Topic, Status> {
    let request = access_body::<wire::Topic>(body)?;
    Ok(Topic {
        name: request.name.as_str().to_owned(),
        message_retention_seconds: request.message_retention_seconds.to_native(),
        labels: Default::default(),
        replicas: 0,
        sources: 0,
        source_leaders: Vec::new(),
        source_policy: None,
    })
}

fn topic_message(topic: Topic) -> wire::Topic {
    wire::Topic { name: topic.name, message_retention_seconds: topic.message_retention_seconds }
}

/// A topic with its sources' leaders. A topic's creation carried to the catalog's leader is
/// answered without them when it has one source (`dispatch::codec`): the list is then empty,
/// which means one source.
fn topic_with_sources_message(topic: Topic) -> wire::TopicWithSources {
    let replicas = topic.replicas;
    let sources = topic
        .source_leaders
        .iter()
        .enumerate()
        .map(|(number, leader)| wire::TopicSource {
            number: number as u32,
            leader_node: leader.node().get(),
            leader_shard: leader.local(),
        })
        .collect();
    wire::TopicWithSources { topic: topic_message(topic), replicas, sources }
}

/// A topic with its sources and whether their number follows its load.
fn topic_with_source_policy_message(topic: Topic) -> wire::TopicWithSourcePolicy {
    let policy = topic.source_policy;
    wire::TopicWithSourcePolicy {
        topic: topic_with_sources_message(topic),
        auto: policy.is_some(),
        sources_min: policy.map_or(0, |bounds| bounds.min),
        sources_max: policy.map_or(0, |bounds| bounds.max),
    }
}

/// A `TopicSourcePolicy` request: the topic shown, or its sources made to follow its load.
fn topic_source_policy(body: &[u8]) -> Result<Operation, Status> {
    let request = access_body::<wire::TopicSourcePolicyRequest>(body)?;
    let name = request.name.as_str().to_owned();
    if !request.change {
        return Ok(Operation::GetTopic { name });
    }
    let bounds = crate::catalog::SourceBounds {
        min: request.sources_min.to_native(),
        max: request.sources_max.to_native(),
    };
    if bounds.min == 0 || (bounds.max != 0 && bounds.min > bounds.max) {
        return Err(Status::invalid_argument(format!(
            "sources from {} to {}: the least is at least 1 and at most the most (0: the default)",
            bounds.min, bounds.max
        )));
    }
    Ok(Operation::UpdateTopic(TopicUpdate { name, sources_auto: Some(bounds), ..TopicUpdate::default() }))
}

fn subscription_request(body: &[u8]) -> Result<Subscription, Status> {
    Ok(subscription_in(access_body::<wire::Subscription>(body)?))
}

/// A CreateSubscriptionWithPush's subscription, with its push configuration.
fn subscription_with_push_request(body: &[u8]) -> Result<Subscription, Status> {
    let request = access_body::<wire::SubscriptionWithPush>(body)?;
    let mut subscription = subscription_in(&request.subscription);
    subscription.settings.push = push_in(&request.push, "");
    Ok(subscription)
}

/// A CreateSubscriptionWithPushProject's subscription, with its push configuration and its
/// project.
fn subscription_with_push_project_request(body: &[u8]) -> Result<Subscription, Status> {
    let request = access_body::<wire::SubscriptionWithPushProject>(body)?;
    let mut subscription = subscription_in(&request.subscription.subscription);
    subscription.settings.push = push_in(&request.subscription.push, &request.push_project);
    Ok(subscription)
}

fn subscription_in(request: &wire::ArchivedSubscription) -> Subscription {
    Subscription {
        name: request.name.as_str().to_owned(),
        topic: request.topic.as_str().to_owned(),
        settings: SubscriptionSettings {
            ack_deadline_seconds: request.ack_deadline_seconds.to_native(),
            retain_acked_messages: request.retain_acked_messages,
            message_retention_seconds: request.message_retention_seconds.to_native(),
            enable_message_ordering: request.enable_message_ordering,
            filter: request.filter.as_str().to_owned(),
            dead_letter_topic: request.dead_letter_topic.as_str().to_owned(),
            max_delivery_attempts: request.max_delivery_attempts.to_native(),
            minimum_backoff_seconds: request.minimum_backoff_seconds.to_native(),
            maximum_backoff_seconds: request.maximum_backoff_seconds.to_native(),
            expiration_ttl_seconds: request.expiration_ttl_seconds.to_native(),
            // The native protocol carries neither yet; the gRPC API sets them.
            labels: Default::default(),
            enable_exactly_once_delivery: false,
            // Only the commands with push carry it (`push_in`).
            push: None,
        },
        detached: false,
    }
}

/// A push configuration as the domain has it: `None` (pull) without an endpoint; naming the
/// subscription in `project` (empty: the default, as the commands without one have it).
/// Checked by the router, as for every protocol.
fn push_in(push: &wire::ArchivedPushConfig, project: &str) -> Option<Box<PushConfig>> {
    if push.endpoint.is_empty() {
        return None;
    }
    let wrapper = match (push.no_wrapper, push.write_metadata) {
        (false, _) => PushWrapper::Pubsub,
        (true, write_metadata) => PushWrapper::NoWrapper { write_metadata },
    };
    let oidc_token = (!push.service_account_email.is_empty()).then(|| OidcToken {
        service_account_email: push.service_account_email.as_str().to_owned(),
        audience: push.audience.as_str().to_owned(),
    });
    Some(Box::new(PushConfig {
        endpoint: push.endpoint.as_str().to_owned(),
        attributes: push
            .attributes
            .iter()
            .map(|attribute| (attribute.key.as_str().to_owned(), attribute.value.as_str().to_owned()))
            .collect(),
        wrapper,
        oidc_token,
        project: match project {
            "" => PUSH_PROJECT_DEFAULT.to_owned(),
            project => project.to_owned(),
        },
    }))
}

/// A push configuration on the wire: all empty for a pull subscription.
fn push_message(push: Option<&PushConfig>) -> wire::PushConfig {
    let Some(push) = push else { return wire::PushConfig::default() };
    let (no_wrapper, write_metadata) = match push.wrapper {
        PushWrapper::Pubsub => (false, false),
        PushWrapper::NoWrapper { write_metadata } => (true, write_metadata),
    };
    let token = push.oidc_token.clone().unwrap_or_default();
    wire::PushConfig {
        endpoint: push.endpoint.clone(),
        attributes: push
            .attributes
            .iter()
            .map(|(key, value)| wire::Attribute { key: key.clone(), value: value.clone() })
            .collect(),
        no_wrapper,
        write_metadata,
        service_account_email: token.service_account_email,
        audience: token.audience,
    }
}

fn subscription_message(subscription: Subscription) -> wire::Subscription {
    let settings = subscription.settings;
    wire::Subscription {
        name: subscription.name,
        topic: subscription.topic,
        ack_deadline_seconds: settings.ack_deadline_seconds,
        retain_acked_messages: settings.retain_acked_messages,
        message_retention_seconds: settings.message_retention_seconds,
        enable_message_ordering: settings.enable_message_ordering,
        filter: settings.filter,
        dead_letter_topic: settings.dead_letter_topic,
        max_delivery_attempts: settings.max_delivery_attempts,
        minimum_backoff_seconds: settings.minimum_backoff_seconds,
        maximum_backoff_seconds: settings.maximum_backoff_seconds,
        expiration_ttl_seconds: settings.expiration_ttl_seconds,
    }
}

fn subscription_with_push_message(mut subscription: Subscription) -> wire::SubscriptionWithPush {
    let push = push_message(subscription.settings.push.take().as_deref());
    wire::SubscriptionWithPush { subscription: subscription_message(subscription), push }
}

/// A subscription with its push configuration and its project (empty for a pull subscription).
fn subscription_with_push_project_message(subscription: Subscription) -> wire::SubscriptionWithPushProject {
    let push_project =
        subscription.settings.push.as_ref().map(|push| push.project.clone()).unwrap_or_default();
    wire::SubscriptionWithPushProject {
        subscription: subscription_with_push_message(subscription),
        push_project,
    }
}

fn snapshot_message(snapshot: Snapshot) -> wire::Snapshot {
    wire::Snapshot { name: snapshot.name, topic: snapshot.topic, expire_time_ms: snapshot.expire_time_ms }
}

fn lookup_message(forwarders: Vec<ForwarderAddress>) -> wire::LookupResponse {
    wire::LookupResponse {
        forwarders: forwarders
            .into_iter()
            .map(|forwarder| wire::ShardAddress {
                shard: forwarder.shard.global(),
                address: forwarder.address,
            })
            .collect(),
    }
}

fn sources_message(routes: SourceRoutes) -> wire::LookupSourcesResponse {
    wire::LookupSourcesResponse {
        sources: routes
            .sources
            .into_iter()
            .map(|route| wire::SourceRoute {
                number: route.source.get(),
                forwarders: lookup_message(route.forwarders).forwarders,
            })
            .collect(),
        active: routes.active,
    }
}

/// A routing rule as a client sent it: a principal or a range, not both.
fn routing_rule_in(rule: &wire::ArchivedRoutingRule) -> Result<RoutingRule, Status> {
    let selector = match (rule.principal.as_str(), rule.from.as_str()) {
        (principal, "") if !principal.is_empty() => ClientSelector::Principal(principal.to_owned()),
        ("", from) if !from.is_empty() => {
            ClientSelector::From(Cidr::parse(from).map_err(Status::invalid_argument)?)
        }
        _ => {
            return Err(Status::invalid_argument(
                "a routing rule names a principal or a range (--from), one of the two",
            ))
        }
    };
    let nodes = rule.nodes.iter().map(|node| NodeId::new(node.to_native())).collect();
    Ok(RoutingRule { selector, allow: rule.allow, nodes })
}

fn routing_rule_out(rule: &RoutingRule) -> wire::RoutingRule {
    let (principal, from) = match &rule.selector {
        ClientSelector::Principal(name) => (name.clone(), String::new()),
        ClientSelector::From(range) => (String::new(), range.to_string()),
    };
    wire::RoutingRule {
        principal,
        from,
        allow: rule.allow,
        nodes: rule.nodes.iter().map(|node| node.get()).collect(),
    }
}

fn drain_status_message(drains: Vec<crate::api::cluster::NodeDrain>) -> wire::ClusterDrainStatusResponse {
    let nodes = drains
        .into_iter()
        .map(|drain| wire::NodeDrainStatus {
            node_id: drain.node_id.get(),
            leaderships: drain.leaderships,
            leads_catalog: drain.leads_catalog,
            single_replica_topics: drain.single_replica_topics,
            single_replica_count: drain.single_replica_count,
        })
        .collect();
    wire::ClusterDrainStatusResponse { nodes }
}

fn cluster_status_message(status: ClusterStatus) -> wire::ClusterStatusResponse {
    wire::ClusterStatusResponse {
        node_id: status.node_id.get(),
        catalog_leader: status.catalog_leader.map(NodeId::get),
        term: status.term,
        last_log_index: status.last_log_index,
        last_applied_index: status.last_applied_index,
        nodes: status
            .nodes
            .into_iter()
            .map(|node| wire::NodeStatus {
                node_id: node.node_id.get(),
                cluster_address: node.cluster_address,
                router_address: node.router_address,
                voter: node.voter,
                role: node.role,
                matched_index: node.matched_index,
                heard_ms_ago: node.heard_ms_ago,
            })
            .collect(),
        topics: status
            .topics
            .into_iter()
            .map(|topic| wire::TopicPlacement {
                name: topic.name,
                leader_node: topic.leader_node.get(),
                epoch: topic.epoch,
                replica_nodes: topic.replica_nodes.into_iter().map(NodeId::get).collect(),
            })
            .collect(),
        topics_omitted: status.topics_omitted,
        not_serving: status.not_serving,
        note: status.note,
    }
}

fn topic_update(body: &[u8]) -> Result<TopicUpdate, Status> {
    let request = access_body::<wire::UpdateTopicRequest>(body)?;
    let changes = validate_topic_update(request)?;
    Ok(TopicUpdate {
        name: request.topic.name.as_str().to_owned(),
        message_retention_seconds: changes.message_retention_seconds,
        labels: None,
        ..TopicUpdate::default()
    })
}

fn subscription_update(body: &[u8]) -> Result<SubscriptionUpdate, Status> {
    let request = access_body::<wire::UpdateSubscriptionRequest>(body)?;
    let changes = validate_subscription_update(request)?;
    Ok(subscription_changes(request.subscription.name.as_str(), changes, None))
}

fn subscription_with_push_update(body: &[u8]) -> Result<SubscriptionUpdate, Status> {
    let request = access_body::<wire::UpdateSubscriptionWithPushRequest>(body)?;
    with_push_update(request, "")
}

fn subscription_with_push_project_update(body: &[u8]) -> Result<SubscriptionUpdate, Status> {
    let request = access_body::<wire::UpdateSubscriptionWithPushProjectRequest>(body)?;
    with_push_update(&request.request, &request.push_project)
}

/// An UpdateSubscriptionWithPush's changes, its push configuration naming `project`.
fn with_push_update(
    request: &wire::ArchivedUpdateSubscriptionWithPushRequest,
    project: &str,
) -> Result<SubscriptionUpdate, Status> {
    let changes = validate_subscription_with_push_update(request)?;
    let push = changes.push_config.then(|| push_in(&request.subscription.push, project));
    Ok(subscription_changes(request.subscription.subscription.name.as_str(), changes, push))
}

/// An update's checked changes as the domain's; `push`: the push configuration, when the mask
/// names it.
fn subscription_changes(
    name: &str,
    changes: SubscriptionChanges,
    push: Option<Option<Box<PushConfig>>>,
) -> SubscriptionUpdate {
    SubscriptionUpdate {
        name: name.to_owned(),
        ack_deadline_seconds: changes.ack_deadline_seconds,
        retain_acked_messages: changes.retain_acked_messages,
        message_retention_seconds: changes.message_retention_seconds,
        expiration_ttl_seconds: changes.expiration_ttl_seconds,
        dead_letter_policy: changes.dead_letter_policy,
        retry_policy: changes.retry_policy,
        labels: None,
        enable_exactly_once_delivery: None,
        push,
    }
}

fn seek_request(body: &[u8]) -> Result<(String, SeekTarget), Status> {
    let request = access_body::<wire::SeekRequest>(body)?;
    let target = if request.snapshot.is_empty() {
        SeekTarget::Time { time_ms: request.time_ms.to_native() }
    } else {
        SeekTarget::Snapshot { name: request.snapshot.as_str().to_owned() }
    };
    Ok((request.subscription.as_str().to_owned(), target))
}

fn topic_list(page: Page<Topic>) -> wire::TopicList {
    wire::TopicList {
        topics: page.items.into_iter().map(topic_message).collect(),
        next_page_token: page.next_page_token,
    }
}

fn subscription_list(page: Page<SubscriptionShown>) -> wire::SubscriptionList {
    wire::SubscriptionList {
        subscriptions: page.items.into_iter().map(|shown| subscription_message(shown.subscription)).collect(),
        next_page_token: page.next_page_token,
    }
}

fn snapshot_list(page: Page<Snapshot>) -> wire::SnapshotList {
    wire::SnapshotList {
        snapshots: page.items.into_iter().map(snapshot_message).collect(),
        next_page_token: page.next_page_token,
    }
}

/// A request as the door's operation; `None` for what is not one (Hello, the data plane).
fn operation(command: Command, body: &[u8]) -> Result<Option<Operation>, Status> {
    Ok(Some(match command {
        Command::CreateTopic => Operation::CreateTopic(topic_request(body)?),
        Command::CreateReplicatedTopic | Command::CreateTopicWithSources | Command::UpdateTopicSources => {
            topic_with_replicas_or_sources(command, body)?
        }
        Command::TopicSourcePolicy => topic_source_policy(body)?,
        Command::GetTopic | Command::GetTopicWithSources => Operation::GetTopic { name: name(body)? },
        Command::ListTopics => Operation::ListTopics(list_request(body)?),
        Command::DeleteTopic => Operation::DeleteTopic { name: name(body)? },
        Command::LookupTopic => Operation::LookupTopic { name: name(body)? },
        Command::UpdateTopic => Operation::UpdateTopic(topic_update(body)?),
        Command::CreateSubscription => Operation::CreateSubscription(subscription_request(body)?),
        Command::GetSubscription => Operation::GetSubscription { name: name(body)? },
        Command::ListSubscriptions => Operation::ListSubscriptions(list_request(body)?),
        Command::DeleteSubscription => Operation::DeleteSubscription { name: name(body)? },
        Command::LookupSubscription => Operation::LookupSubscription { name: name(body)? },
        Command::LookupSources => {
            let request = access_body::<wire::LookupSourcesRequest>(body)?;
            let name = request.name.as_str().to_owned();
            match request.subscription {
                true => Operation::LookupSubscriptionSources { name },
                false => Operation::LookupTopicSources { name },
            }
        }
        Command::UpdateSubscription => Operation::UpdateSubscription(subscription_update(body)?),
        Command::CreateSubscriptionWithPush => {
            Operation::CreateSubscription(subscription_with_push_request(body)?)
        }
        Command::GetSubscriptionWithPush => Operation::GetSubscription { name: name(body)? },
        Command::UpdateSubscriptionWithPush => {
            Operation::UpdateSubscription(subscription_with_push_update(body)?)
        }
        Command::ModifyPushConfig => {
            let request = access_body::<wire::ModifyPushConfigRequest>(body)?;
            Operation::ModifyPushConfig {
                name: request.subscription.as_str().to_owned(),
                push: push_in(&request.push, ""),
            }
        }
        Command::CreateSubscriptionWithPushProject => {
            Operation::CreateSubscription(subscription_with_push_project_request(body)?)
        }
        Command::GetSubscriptionWithPushProject => Operation::GetSubscription { name: name(body)? },
        Command::UpdateSubscriptionWithPushProject => {
            Operation::UpdateSubscription(subscription_with_push_project_update(body)?)
        }
        Command::ModifyPushConfigWithProject => {
            let request = access_body::<wire::ModifyPushConfigWithProjectRequest>(body)?;
            Operation::ModifyPushConfig {
                name: request.request.subscription.as_str().to_owned(),
                push: push_in(&request.request.push, &request.push_project),
            }
        }
        Command::Seek => {
            let (subscription, target) = seek_request(body)?;
            Operation::Seek { subscription, target }
        }
        Command::CreateSnapshot => {
            let request = access_body::<wire::SnapshotRequest>(body)?;
            Operation::CreateSnapshot {
                name: request.name.as_str().to_owned(),
                subscription: request.subscription.as_str().to_owned(),
                labels: Default::default(),
            }
        }
        Command::ListSnapshots => Operation::ListSnapshots(list_request(body)?),
        Command::GetSnapshot => Operation::GetSnapshot { name: name(body)? },
        Command::DeleteSnapshot => Operation::DeleteSnapshot { name: name(body)? },
        Command::Stats | Command::StatsWithPush => Operation::Stats,
        Command::ClusterStatus => Operation::ClusterStatus,
        Command::ClusterAddNode => {
            let request = access_body::<wire::ClusterAddNodeRequest>(body)?;
            Operation::ClusterAddNode {
                node_id: NodeId::new(request.node_id.to_native()),
                cluster_address: request.cluster_address.as_str().to_owned(),
                voter: request.voter,
            }
        }
        Command::ClusterRemoveNode => Operation::ClusterRemoveNode {
            node_id: NodeId::new(access_body::<wire::ClusterRemoveNodeRequest>(body)?.node_id.to_native()),
        },
        Command::ResyncDirectory => Operation::ResyncDirectory {
            index: access_body::<wire::ResyncDirectoryRequest>(body)?.index.to_native(),
        },
        Command::ClusterDrain => {
            let request = access_body::<wire::ClusterDrainRequest>(body)?;
            Operation::ClusterDrain {
                node_id: NodeId::new(request.node_id.to_native()),
                draining: request.draining,
            }
        }
        Command::ClusterDrainStatus => Operation::ClusterDrainStatus,
        Command::ClusterRestrictions => Operation::ClusterRestrictions,
        Command::ClusterRestrict => {
            let request = access_body::<wire::ClusterRestrictRequest>(body)?;
            Operation::ClusterRestrict { rule: routing_rule_in(&request.rule)?, add: request.add }
        }
        _ => return Ok(None),
    }))
}

/// The topic commands that came with replicas and sources, as the door's operations.
fn topic_with_replicas_or_sources(command: Command, body: &[u8]) -> Result<Operation, Status> {
    Ok(match command {
        Command::CreateReplicatedTopic => {
            let request = access_body::<wire::CreateTopicRequest>(body)?;
            Operation::CreateTopic(Topic {
                name: request.topic.name.as_str().to_owned(),
                message_retention_seconds: request.topic.message_retention_seconds.to_native(),
                labels: Default::default(),
                replicas: request.replicas.to_native(),
                sources: 0,
                source_leaders: Vec::new(),
                source_policy: None,
            })
        }
        Command::CreateTopicWithSources => {
            let request = access_body::<wire::CreateTopicWithSourcesRequest>(body)?;
            Operation::CreateTopic(Topic {
                name: request.topic.name.as_str().to_owned(),
                message_retention_seconds: request.topic.message_retention_seconds.to_native(),
                labels: Default::default(),
                replicas: request.replicas.to_native(),
                sources: request.sources.to_native(),
                source_leaders: Vec::new(),
                source_policy: None,
            })
        }
        Command::UpdateTopicSources => {
            let request = access_body::<wire::UpdateTopicSourcesRequest>(body)?;
            Operation::UpdateTopic(TopicUpdate {
                name: request.name.as_str().to_owned(),
                sources: Some(request.sources.to_native()),
                ..Default::default()
            })
        }
        _ => unreachable!("not a topic command with replicas or sources: {command:?}"),
    })
}

/// An operation's outcome as the response frame of `command`.
fn response(header: &FrameHeader, command: Command, outcome: Outcome) -> Result<FrameBuffer, Status> {
    Ok(match command {
        Command::CreateTopic | Command::CreateReplicatedTopic | Command::GetTopic | Command::UpdateTopic => {
            respond(header, &topic_message(outcome.into_topic()?))
        }
        Command::CreateTopicWithSources | Command::GetTopicWithSources | Command::UpdateTopicSources => {
            respond(header, &topic_with_sources_message(outcome.into_topic()?))
        }
        Command::TopicSourcePolicy => {
            respond(header, &topic_with_source_policy_message(outcome.into_topic()?))
        }
        Command::ListTopics => respond(header, &topic_list(outcome.into_topics()?)),
        Command::LookupTopic | Command::LookupSubscription => {
            respond(header, &lookup_message(outcome.into_forwarders()?))
        }
        Command::LookupSources => respond(header, &sources_message(outcome.into_sources()?)),
        Command::CreateSubscription | Command::GetSubscription | Command::UpdateSubscription => {
            respond(header, &subscription_message(outcome.into_subscription()?.subscription))
        }
        Command::CreateSubscriptionWithPush
        | Command::GetSubscriptionWithPush
        | Command::UpdateSubscriptionWithPush => {
            respond(header, &subscription_with_push_message(outcome.into_subscription()?.subscription))
        }
        Command::CreateSubscriptionWithPushProject
        | Command::GetSubscriptionWithPushProject
        | Command::UpdateSubscriptionWithPushProject => respond(
            header,
            &subscription_with_push_project_message(outcome.into_subscription()?.subscription),
        ),
        Command::ListSubscriptions => respond(header, &subscription_list(outcome.into_subscriptions()?)),
        Command::CreateSnapshot | Command::GetSnapshot => {
            respond(header, &snapshot_message(outcome.into_snapshot()?))
        }
        Command::ListSnapshots => respond(header, &snapshot_list(outcome.into_snapshots()?)),
        Command::Stats => respond(header, &wire::StatsResponse::from(*outcome.into_stats()?)),
        Command::StatsWithPush => respond(header, &wire::StatsWithPushResponse::from(*outcome.into_stats()?)),
        Command::ClusterStatus => respond(header, &cluster_status_message(*outcome.into_cluster_status()?)),
        Command::ClusterDrainStatus => respond(header, &drain_status_message(outcome.into_drains()?)),
        Command::ClusterRestrictions => {
            let rules = outcome.into_routing_rules()?.iter().map(routing_rule_out).collect();
            respond(header, &wire::ClusterRestrictionsResponse { rules })
        }
        Command::ResyncDirectory => {
            let resynced = outcome.into_resynced()?;
            respond(
                header,
                &wire::ResyncDirectoryResponse {
                    logs_resynced: resynced.logs,
                    batches_copied: resynced.batches,
                },
            )
        }
        _ => {
            outcome.into_done()?;
            respond(header, &wire::Empty {})
        }
    })
}

/// Answers a request on the router's port: decoded into the door's operation, run there (who
/// may, and where: here or at the catalog's leader), its outcome encoded.
pub(crate) async fn dispatch<S: Storage>(
    door: &Door<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<FrameBuffer, Status> {
    let Some(command) = Command::from_u16(header.command) else {
        return Err(Status::new(Code::Unimplemented, format!("unknown command {}", header.command)));
    };
    match command {
        Command::Hello => return Ok(hello_response(header)),
        // The connection's reading loop answers it before any handler sees it.
        Command::Authenticate => {
            return Err(Status::internal("an Authenticate request reached the router's handler"))
        }
        _ => {}
    }
    let caller = Caller {
        session: responder.session(),
        access: responder.access(),
        local_address: responder.local_address(),
        peer_address: responder.peer_address(),
        carried: false,
    };
    if schemas::is_schema_command(command) {
        return schemas::dispatch(door, &caller, header, command, body).await;
    }
    let Some(operation) = operation(command, body)? else {
        return Err(Status::new(
            Code::NotOwner,
            "data-plane commands go to a forwarder: look up the topic or subscription first",
        ));
    };
    let outcome = door.execute(&caller, operation).await?;
    response(header, command, outcome)
}

impl<S: Storage> Handler for Door<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response {
        dispatch(self, &header, &body, responder)
            .await
            .unwrap_or_else(|status| fail(&header, &status.into()))
            .into()
    }
}

mod schemas;

#[cfg(test)]
mod tests;
