//! The router's side of the native protocol: a frame's command and body are decoded into the
//! control plane's typed operation (`crate::api::control`), and its answer is encoded as the
//! response frame.

use crate::api::cluster::ClusterStatus;
use crate::api::control::{
    ForwarderAddress, ListRequest, Page, SeekTarget, Snapshot, Subscription, SubscriptionSettings,
    SubscriptionUpdate, Topic, TopicUpdate,
};
use crate::api::{Code, Status};
use crate::auth::{Credential, Permission};
use crate::protocol::native::server::{fail, respond, Handler, Responder, Response};
use crate::router::Router;
use crate::storage::Storage;
use ringpost_wire::frame::{access_body, FrameBuffer, FrameHeader};
use ringpost_wire::limits::{
    FRAME_BODY_BYTES_MAX, MESSAGE_BYTES_MAX, PROTOCOL_VERSION, PUBLISH_BATCH_MESSAGES_MAX,
};
use ringpost_wire::messages as wire;
use ringpost_wire::validate::{validate_subscription_update, validate_topic_update};
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
    })
}

fn topic_message(topic: Topic) -> wire::Topic {
    wire::Topic { name: topic.name, message_retention_seconds: topic.message_retention_seconds }
}

fn subscription_request(body: &[u8]) -> Result<Subscription, Status> {
    let request = access_body::<wire::Subscription>(body)?;
    Ok(Subscription {
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
        },
        detached: false,
    })
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

fn snapshot_message(snapshot: Snapshot) -> wire::Snapshot {
    wire::Snapshot { name: snapshot.name, topic: snapshot.topic, expire_time_ms: snapshot.expire_time_ms }
}

fn lookup_message(forwarders: Vec<ForwarderAddress>) -> wire::LookupResponse {
    wire::LookupResponse {
        forwarders: forwarders
            .into_iter()
            .map(|forwarder| wire::ShardAddress { shard: forwarder.shard, address: forwarder.address })
            .collect(),
    }
}

fn cluster_status_message(status: ClusterStatus) -> wire::ClusterStatusResponse {
    wire::ClusterStatusResponse {
        node_id: status.node_id,
        catalog_leader: status.catalog_leader,
        term: status.term,
        last_log_index: status.last_log_index,
        last_applied_index: status.last_applied_index,
        nodes: status
            .nodes
            .into_iter()
            .map(|node| wire::NodeStatus {
                node_id: node.node_id,
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
                leader_node: topic.leader_node,
                epoch: topic.epoch,
                replica_nodes: topic.replica_nodes,
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
    })
}

fn subscription_update(body: &[u8]) -> Result<SubscriptionUpdate, Status> {
    let request = access_body::<wire::UpdateSubscriptionRequest>(body)?;
    let changes = validate_subscription_update(request)?;
    Ok(SubscriptionUpdate {
        name: request.subscription.name.as_str().to_owned(),
        ack_deadline_seconds: changes.ack_deadline_seconds,
        retain_acked_messages: changes.retain_acked_messages,
        message_retention_seconds: changes.message_retention_seconds,
        expiration_ttl_seconds: changes.expiration_ttl_seconds,
        dead_letter_policy: changes.dead_letter_policy,
        retry_policy: changes.retry_policy,
        labels: None,
        enable_exactly_once_delivery: None,
    })
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

fn subscription_list(page: Page<Subscription>) -> wire::SubscriptionList {
    wire::SubscriptionList {
        subscriptions: page.items.into_iter().map(subscription_message).collect(),
        next_page_token: page.next_page_token,
    }
}

fn snapshot_list(page: Page<Snapshot>) -> wire::SnapshotList {
    wire::SnapshotList {
        snapshots: page.items.into_iter().map(snapshot_message).collect(),
        next_page_token: page.next_page_token,
    }
}

/// Each command's permission is checked as soon as the request names its resource, before
/// anything else happens: a refused create creates nothing, and the refusal is the answer.
/// Lists show only what their reader may list (`allows`, without an audit line per item),
/// left out before the page is cut, so a page token only ever names what its reader was shown;
/// a request without a credential, where anonymous may do nothing, is refused (`list_allowed`).
///
/// Topics' commands; `None` for the others.
async fn dispatch_topics<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    command: Command,
    body: &[u8],
    responder: &Responder,
) -> Result<Option<FrameBuffer>, Status> {
    Ok(Some(match command {
        Command::CreateTopic => {
            let topic = topic_request(body)?;
            responder.check(Permission::TopicsCreate, &topic.name)?;
            respond(header, &topic_message(router.create_topic(topic).await?))
        }
        Command::CreateReplicatedTopic => {
            let request = access_body::<wire::CreateTopicRequest>(body)?;
            let topic = Topic {
                name: request.topic.name.as_str().to_owned(),
                message_retention_seconds: request.topic.message_retention_seconds.to_native(),
                labels: Default::default(),
                replicas: request.replicas.to_native(),
            };
            responder.check(Permission::TopicsCreate, &topic.name)?;
            respond(header, &topic_message(router.create_topic(topic).await?))
        }
        Command::GetTopic => {
            let name = name(body)?;
            responder.check(Permission::TopicsGet, &name)?;
            respond(header, &topic_message(router.get_topic(&name)?))
        }
        Command::ListTopics => {
            list_allowed(responder)?;
            let page = router
                .list_topics(&list_request(body)?, |name| responder.allows(Permission::TopicsList, name));
            respond(header, &topic_list(page))
        }
        Command::DeleteTopic => {
            let name = name(body)?;
            responder.check(Permission::TopicsDelete, &name)?;
            router.delete_topic(&name).await?;
            respond(header, &wire::Empty {})
        }
        Command::LookupTopic => {
            let name = name(body)?;
            check_either(responder, Permission::TopicsPublish, Permission::TopicsGet, &name)?;
            respond(header, &lookup_message(router.lookup_topic(&name, responder.local_address())?))
        }
        Command::UpdateTopic => {
            let update = topic_update(body)?;
            responder.check(Permission::TopicsUpdate, &update.name)?;
            respond(header, &topic_message(router.update_topic(update).await?))
        }
        _ => return Ok(None),
    }))
}

/// Subscriptions' commands; `None` for the others.
async fn dispatch_subscriptions<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    command: Command,
    body: &[u8],
    responder: &Responder,
) -> Result<Option<FrameBuffer>, Status> {
    Ok(Some(match command {
        Command::CreateSubscription => {
            let subscription = subscription_request(body)?;
            responder.check(Permission::SubscriptionsCreate, &subscription.name)?;
            responder.check(Permission::TopicsAttachSubscription, &subscription.topic)?;
            check_dead_letter_topic(responder, &subscription.settings.dead_letter_topic)?;
            respond(header, &subscription_message(router.create_subscription(subscription).await?))
        }
        Command::GetSubscription => {
            let name = name(body)?;
            responder.check(Permission::SubscriptionsGet, &name)?;
            respond(header, &subscription_message(router.get_subscription(&name)?))
        }
        Command::ListSubscriptions => {
            list_allowed(responder)?;
            let page = router.list_subscriptions(&list_request(body)?, |name| {
                responder.allows(Permission::SubscriptionsList, name)
            });
            respond(header, &subscription_list(page))
        }
        Command::DeleteSubscription => {
            let name = name(body)?;
            responder.check(Permission::SubscriptionsDelete, &name)?;
            router.delete_subscription(&name).await?;
            respond(header, &wire::Empty {})
        }
        Command::LookupSubscription => {
            let name = name(body)?;
            check_either(responder, Permission::SubscriptionsConsume, Permission::SubscriptionsGet, &name)?;
            let forwarders = router.lookup_subscription(&name, responder.local_address())?;
            respond(header, &lookup_message(forwarders))
        }
        Command::UpdateSubscription => {
            let update = subscription_update(body)?;
            responder.check(Permission::SubscriptionsUpdate, &update.name)?;
            if let Some((dead_letter_topic, _)) = &update.dead_letter_policy {
                check_dead_letter_topic(responder, dead_letter_topic)?;
            }
            respond(header, &subscription_message(router.update_subscription(update).await?))
        }
        _ => return Ok(None),
    }))
}

/// Snapshots' and the daemon's commands; `None` for the others.
async fn dispatch_snapshots<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    command: Command,
    body: &[u8],
    responder: &Responder,
) -> Result<Option<FrameBuffer>, Status> {
    Ok(Some(match command {
        Command::Seek => {
            let (subscription, target) = seek_request(body)?;
            responder.check(Permission::SnapshotsSeek, &subscription)?;
            if let SeekTarget::Snapshot { name } = &target {
                responder.check(Permission::SnapshotsGet, name)?;
            }
            router.seek(&subscription, target).await?;
            respond(header, &wire::Empty {})
        }
        Command::CreateSnapshot => {
            let request = access_body::<wire::SnapshotRequest>(body)?;
            responder.check(Permission::SnapshotsCreate, request.name.as_str())?;
            responder.check(Permission::SubscriptionsConsume, request.subscription.as_str())?;
            let snapshot = router
                .create_snapshot(request.name.as_str(), request.subscription.as_str(), Default::default())
                .await?;
            respond(header, &snapshot_message(snapshot))
        }
        Command::ListSnapshots => {
            list_allowed(responder)?;
            let page = router.list_snapshots(&list_request(body)?, |name| {
                responder.allows(Permission::SnapshotsList, name)
            });
            respond(header, &snapshot_list(page))
        }
        Command::GetSnapshot => {
            let name = name(body)?;
            responder.check(Permission::SnapshotsGet, &name)?;
            respond(header, &snapshot_message(router.get_snapshot(&name)?))
        }
        Command::DeleteSnapshot => {
            let name = name(body)?;
            responder.check(Permission::SnapshotsDelete, &name)?;
            router.delete_snapshot(&name).await?;
            respond(header, &wire::Empty {})
        }
        Command::Stats => {
            responder.check(Permission::DaemonStats, DAEMON)?;
            respond(header, &wire::StatsResponse::from(router.stats().await?))
        }
        Command::ClusterStatus => {
            responder.check(Permission::DaemonStats, DAEMON)?;
            let mut status = router.cluster_status().await;
            (status.topics, status.topics_omitted) = router.topic_placements();
            respond(header, &cluster_status_message(status))
        }
        Command::ClusterAddNode => {
            responder.check(Permission::DaemonAdminister, DAEMON)?;
            let request = access_body::<wire::ClusterAddNodeRequest>(body)?;
            router
                .add_node(request.node_id.to_native(), request.cluster_address.as_str(), request.voter)
                .await?;
            respond(header, &wire::Empty {})
        }
        Command::ClusterRemoveNode => {
            responder.check(Permission::DaemonAdminister, DAEMON)?;
            let request = access_body::<wire::ClusterRemoveNodeRequest>(body)?;
            match router.remove_node(request.node_id.to_native()).await? {
                crate::router::NodeRemoval::Removed => respond(header, &wire::Empty {}),
                // This node led the catalog and handed the lead over: its successor decides.
                crate::router::NodeRemoval::HandedOver(_) => {
                    return forward(router, header, body, responder).await.map(Some)
                }
            }
        }
        Command::ResyncDirectory => {
            responder.check(Permission::DaemonAdminister, DAEMON)?;
            let index = access_body::<wire::ResyncDirectoryRequest>(body)?.index.to_native() as usize;
            let resynced = router.resync_directory(index).await?;
            respond(
                header,
                &wire::ResyncDirectoryResponse {
                    logs_resynced: resynced.logs,
                    batches_copied: resynced.batches,
                },
            )
        }
        _ => return Ok(None),
    }))
}

/// The name the daemon's own permissions are checked with.
const DAEMON: &str = "";

/// A list from a request without a credential, where anonymous may do nothing, is refused as
/// `Unauthenticated` rather than answered with an empty page, as the gRPC API refuses it.
fn list_allowed(responder: &Responder) -> Result<(), Status> {
    if responder.session().credential == Credential::None && !responder.anonymous_may_act() {
        return Err(Status::new(
            Code::Unauthenticated,
            "this request carries no credential (a token or a client certificate), and anonymous may not list",
        ));
    }
    Ok(())
}

/// A lookup serves both who use a resource and who only look at it: allowed with either
/// permission; a refusal is `needed`'s (the one a client that looks up means to use), logged
/// once.
fn check_either(
    responder: &Responder,
    needed: Permission,
    instead: Permission,
    name: &str,
) -> Result<(), Status> {
    if responder.allows(instead, name) {
        return Ok(());
    }
    responder.check(needed, name).map_err(Status::from)
}

/// A subscription's dead-lettered messages are published to its dead-letter topic, so that
/// whoever sets one needs to be able to publish there (as Pub/Sub asks of its service agent).
/// Empty: no dead-letter topic.
fn check_dead_letter_topic(responder: &Responder, topic: &str) -> Result<(), Status> {
    if topic.is_empty() {
        return Ok(());
    }
    responder.check(Permission::TopicsPublish, topic).map_err(Status::from)
}

/// The commands that change the catalog: only its leader decides them, so another node carries
/// them to it (`forward`).
fn changes_the_catalog(command: Command) -> bool {
    matches!(
        command,
        Command::CreateTopic
            | Command::CreateReplicatedTopic
            | Command::DeleteTopic
            | Command::UpdateTopic
            | Command::CreateSubscription
            | Command::DeleteSubscription
            | Command::UpdateSubscription
            | Command::CreateSnapshot
            | Command::DeleteSnapshot
            | Command::ClusterAddNode
            | Command::ClusterRemoveNode
    )
}

/// Carries a catalog change from a client of this node to the catalog's leader, with the
/// client's principal, and answers with the leader's response once this node applied it.
async fn forward<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<FrameBuffer, Status> {
    let (leader, _) = router.leader().ok_or_else(|| {
        Status::unavailable("the catalog has no leader (too few of its voters are reachable); try again")
    })?;
    let request = crate::protocol::native::peer::encode_forward(&responder.session().principal, header, body);
    // A node's addition waits for it to catch up, its removal for its replicas to move.
    let timeout = match Command::from_u16(header.command) {
        Some(Command::ClusterAddNode | Command::ClusterRemoveNode) => {
            crate::router::MEMBERSHIP_CHANGE_TIMEOUT
        }
        _ => crate::protocol::native::peer::PEER_REQUEST_TIMEOUT,
    };
    let answer = router.forward(leader, request, timeout).await?;
    let (applied, mut frame) = crate::protocol::native::peer::decode_forwarded(&answer)
        .map_err(|why| Status::internal(format!("the leader's answer did not decode: {why}")))?;
    if let Some(index) = applied {
        router.wait_applied(index, crate::router::FORWARDED_APPLY_WAIT).await;
    }
    // The leader answered the id it was given; the client waits for its own.
    let mut response_header = FrameHeader::decode(&frame[..ringpost_wire::limits::FRAME_HEADER_BYTES])
        .map_err(|error| Status::internal(format!("the leader's answer has no frame header: {error:?}")))?;
    response_header.request_id = header.request_id;
    frame[..ringpost_wire::limits::FRAME_HEADER_BYTES].copy_from_slice(&response_header.encode());
    Ok(frame)
}

/// Answers a request: here, or at the catalog's leader when it changes the catalog and this
/// node does not lead.
pub(crate) async fn dispatch<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<FrameBuffer, Status> {
    if let Some(command) = Command::from_u16(header.command) {
        // A node removed from its cluster answers only what shows why.
        if !matches!(command, Command::Hello | Command::Stats | Command::ClusterStatus) {
            router.check_member()?;
        }
        if changes_the_catalog(command) && router.is_clustered() && !router.leads() {
            return forward(router, header, body, responder).await;
        }
    }
    dispatch_here(router, header, body, responder).await
}

pub(crate) async fn dispatch_here<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    body: &[u8],
    responder: &Responder,
) -> Result<FrameBuffer, Status> {
    let Some(command) = Command::from_u16(header.command) else {
        return Err(Status::new(Code::Unimplemented, format!("unknown command {}", header.command)));
    };
    if let Some(response) = dispatch_topics(router, header, command, body, responder).await? {
        return Ok(response);
    }
    if let Some(response) = dispatch_subscriptions(router, header, command, body, responder).await? {
        return Ok(response);
    }
    if let Some(response) = dispatch_snapshots(router, header, command, body, responder).await? {
        return Ok(response);
    }
    match command {
        Command::Hello => Ok(hello_response(header)),
        // The connection's reading loop answers it before any handler sees it.
        Command::Authenticate => {
            Err(Status::internal("an Authenticate request reached the router's handler"))
        }
        // The data-plane commands (the others were answered above).
        _ => Err(Status::new(
            Code::NotOwner,
            "data-plane commands go to a forwarder: look up the topic or subscription first",
        )),
    }
}

impl<S: Storage> Handler for Router<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response {
        dispatch(self, &header, &body, responder)
            .await
            .unwrap_or_else(|status| fail(&header, &status.into()))
            .into()
    }
}

#[cfg(test)]
mod tests;
