//! `google.pubsub.v1.Publisher`: topics and publishing, on the router (admin) and on the
//! topic's forwarder (publish).
//!
//! Every method parses its names first (a bad one is refused before anything else), then runs
//! on the shard that serves it, where the caller's permission is checked before the operation
//! has any effect, with the native protocol's permission for the same operation.

use super::convert;
use super::credentials::Presented;
use super::gateway::{is_stale_route, Gateway};
use super::names::{self, Kind};
use crate::api::control::ListRequest;
use crate::api::data::{Attributes, DataPlane, MessageView, PublishBatch};
use crate::api::{Code, Status as DomainStatus};
use crate::auth::{Access, Permission, Session};
use ringpost_proto::pubsub;
use std::ops::Range;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The Publisher service over the gateway.
pub struct PublisherService {
    pub gateway: Arc<Gateway>,
}

// --- Shared by the administration handlers (this file, `subscriptions`, `snapshots`) -------

/// The session a listing is filtered for. A caller without a credential, where anonymous may
/// do nothing, is refused as `Unauthenticated` rather than shown an empty page, as the native
/// protocol refuses such a connection before any request.
pub(super) fn list_session(presented: &Presented, access: &Access) -> Result<Session, DomainStatus> {
    let session = presented.session(access)?;
    if presented.token.is_none() && presented.certificate.is_none() && !access.anonymous_may_act() {
        return Err(DomainStatus::new(
            Code::Unauthenticated,
            "this request carries no credential (a token or a client certificate), and anonymous may not list",
        ));
    }
    Ok(session)
}

/// A listing's page, as the router pages: `page_size` 0 for the default, the token the last
/// page answered.
pub(super) fn list_request(
    topic: String,
    page_size: i32,
    page_token: String,
) -> Result<ListRequest, DomainStatus> {
    Ok(ListRequest { topic, page_size: convert::unsigned("page_size", page_size)?, page_token })
}

/// Pub/Sub's wording for a missing or existing resource (clients key on the code; people read
/// the text), for answers about the one resource a request names.
pub(super) fn pubsub_wording(status: DomainStatus, resource: &str) -> DomainStatus {
    match status.code {
        Code::NotFound => DomainStatus::not_found(format!("Resource not found (resource={resource}).")),
        Code::AlreadyExists => DomainStatus::already_exists(format!(
            "Resource already exists in the project (resource={resource})."
        )),
        _ => status,
    }
}

// --- Publish -------------------------------------------------------------------------------

/// A message's attributes, moved out of the request's map into the order the log keeps them
/// (by key, so that the same attributes are stored the same way whatever the map's order).
struct OwnedAttributes(Vec<(String, String)>);

impl Attributes for OwnedAttributes {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> (&str, &str) {
        let (key, value) = &self.0[index];
        (key, value)
    }
}

struct OwnedMessage {
    data: prost::bytes::Bytes,
    attributes: OwnedAttributes,
    ordering_key: String,
}

/// A gRPC publish's messages, owned, so that they cross to the forwarder shard; the data stays
/// in the buffers tonic decoded it into. The data plane checks them (`check_publish`: sizes,
/// counts, attributes, ordering keys) with the native protocol's rules and wording.
struct OwnedPublish {
    topic: String,
    messages: Vec<OwnedMessage>,
}

impl OwnedPublish {
    fn new(topic: String, messages: Vec<pubsub::PubsubMessage>) -> OwnedPublish {
        let messages = messages
            .into_iter()
            .map(|message| {
                let mut attributes: Vec<(String, String)> = message.attributes.into_iter().collect();
                attributes.sort_unstable();
                OwnedMessage {
                    data: message.data,
                    attributes: OwnedAttributes(attributes),
                    ordering_key: message.ordering_key,
                }
            })
            .collect();
        OwnedPublish { topic, messages }
    }
}

impl PublishBatch for OwnedPublish {
    fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = MessageView<'_>>),
    ) -> Result<(), DomainStatus> {
        let mut messages = self.messages.iter().map(|message| MessageView {
            data: &message.data,
            attributes: &message.attributes,
            ordering_key: &message.ordering_key,
        });
        visit(&self.topic, &mut messages);
        Ok(())
    }
}

/// Forwarders a publish tries: the one the gateway remembers, then, if it no longer serves the
/// topic, the one the router names now. A topic that moves again within that is rare enough
/// that the client's retry of `UNAVAILABLE` covers it.
const PUBLISH_ATTEMPTS_MAX: usize = 2;

/// What a publish on a forwarder came to: the message ids, or the batch back when the shard
/// no longer serves the topic (the route was stale), to be sent again where it moved.
type Published = Result<Range<u64>, OwnedPublish>;

/// Publishes on the forwarder serving the topic; after a stale route, once more through the
/// router.
async fn publish(
    gateway: &Gateway,
    presented: Presented,
    request: pubsub::PublishRequest,
) -> Result<Vec<String>, Status> {
    let topic = names::parse("topic", Kind::Topic, &request.topic)?.name;
    let mut batch = OwnedPublish::new(topic.clone(), request.messages);
    for _attempt in 0..PUBLISH_ATTEMPTS_MAX {
        let shard = gateway.topic_forwarder(&presented, &topic, Permission::TopicsPublish).await?;
        let (presented, name) = (presented.clone(), topic.clone());
        let published: Published = shard
            .try_call(move |shard| async move {
                presented.check(&shard.access, Permission::TopicsPublish, &name)?;
                // Nothing awaits between this lookup and the publish's own, so the answer holds.
                match shard.forwarder.topic(&name) {
                    Err(status) if is_stale_route(&status) => return Ok(Err(batch)),
                    Err(status) => return Err(status),
                    Ok(_) => {}
                }
                shard.forwarder.publish(batch).await.map(Ok)
            })
            .await?;
        match published {
            Ok(ids) => return Ok(ids.map(|id| id.to_string()).collect()),
            Err(returned) => {
                gateway.forget_topic(&topic);
                batch = returned;
            }
        }
    }
    Err(Status::unavailable(format!("topic '{topic}' moved while it was published to; retry")))
}

// --- Topics' administration ----------------------------------------------------------------

/// ListTopicSubscriptions, on the router: the subscription names of one page.
async fn list_topic_subscriptions(
    gateway: &Gateway,
    presented: Presented,
    request: pubsub::ListTopicSubscriptionsRequest,
) -> Result<pubsub::ListTopicSubscriptionsResponse, Status> {
    let topic = names::parse("topic", Kind::Topic, &request.topic)?;
    let list = list_request(topic.name.clone(), request.page_size, request.page_token)?;
    let name = topic.name.clone();
    let page = gateway
        .router
        .try_call(move |shard| async move {
            let session = presented.check(&shard.access, Permission::TopicsGet, &name)?;
            shard.router.get_topic(&name).map_err(|status| pubsub_wording(status, &name))?;
            Ok(shard.router.list_subscriptions(&list, |item| {
                shard.access.allows(&session, Permission::SubscriptionsList, item)
            }))
        })
        .await?;
    Ok(pubsub::ListTopicSubscriptionsResponse {
        subscriptions: page
            .items
            .iter()
            .map(|item| names::format(&topic.project, Kind::Subscription, &item.name))
            .collect(),
        next_page_token: page.next_page_token,
    })
}

/// ListTopicSnapshots, on the router: the snapshot names of one page of the topic's.
async fn list_topic_snapshots(
    gateway: &Gateway,
    presented: Presented,
    request: pubsub::ListTopicSnapshotsRequest,
) -> Result<pubsub::ListTopicSnapshotsResponse, Status> {
    let topic = names::parse("topic", Kind::Topic, &request.topic)?;
    let list = list_request(topic.name.clone(), request.page_size, request.page_token)?;
    let name = topic.name.clone();
    let page = gateway
        .router
        .try_call(move |shard| async move {
            let session = presented.check(&shard.access, Permission::TopicsGet, &name)?;
            shard.router.get_topic(&name).map_err(|status| pubsub_wording(status, &name))?;
            Ok(shard
                .router
                .list_snapshots(&list, |item| shard.access.allows(&session, Permission::SnapshotsList, item)))
        })
        .await?;
    Ok(pubsub::ListTopicSnapshotsResponse {
        snapshots: page
            .items
            .iter()
            .map(|item| names::format(&topic.project, Kind::Snapshot, &item.name))
            .collect(),
        next_page_token: page.next_page_token,
    })
}

/// DetachSubscription. Pub/Sub asks `pubsub.topics.detachSubscription` on the subscription's
/// topic, which is `TopicsUpdate` here. The request names only the subscription, so its topic
/// must be looked up before that check; the answer must then say nothing the caller may not
/// see. A caller allowed to update the topic of an existing subscription detaches it. Any
/// other caller is first checked for `SubscriptionsGet` on the subscription, so that one who
/// may not see it gets the same refusal whether it exists or not, and on whichever topic; one
/// who may see it (and could read its topic with GetSubscription) is told it does not exist, or
/// refused on its topic.
async fn detach_subscription(
    gateway: &Gateway,
    presented: Presented,
    subscription: String,
) -> Result<(), Status> {
    let name = names::parse("subscription", Kind::Subscription, &subscription)?.name;
    let detached = name.clone();
    gateway
        .router
        .try_call(move |shard| async move {
            let session = presented.session(&shard.access)?;
            let found = shard.router.get_subscription(&name);
            let allowed = found
                .as_ref()
                .is_ok_and(|found| shard.access.allows(&session, Permission::TopicsUpdate, &found.topic));
            if !allowed {
                shard.access.check(&session, Permission::SubscriptionsGet, &name)?;
                let topic = found.map_err(|status| pubsub_wording(status, &name))?.topic;
                shard.access.check(&session, Permission::TopicsUpdate, &topic)?;
            }
            shard.router.detach_subscription(&name).await
        })
        .await?;
    gateway.forget_subscription(&detached);
    Ok(())
}

#[tonic::async_trait]
impl pubsub::publisher_server::Publisher for PublisherService {
    async fn create_topic(&self, request: Request<pubsub::Topic>) -> Result<Response<pubsub::Topic>, Status> {
        let presented = Presented::of(&request);
        let (name, topic) = convert::topic_in(request.get_ref())?;
        let created = self
            .gateway
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, Permission::TopicsCreate, &topic.name)?;
                let name = topic.name.clone();
                shard.router.create_topic(topic).await.map_err(|status| pubsub_wording(status, &name))
            })
            .await?;
        Ok(Response::new(convert::topic_out(&name.project, created)))
    }

    async fn update_topic(
        &self,
        request: Request<pubsub::UpdateTopicRequest>,
    ) -> Result<Response<pubsub::Topic>, Status> {
        let presented = Presented::of(&request);
        let (name, update) = convert::topic_update_in(request.get_ref())?;
        let updated = self
            .gateway
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, Permission::TopicsUpdate, &update.name)?;
                let name = update.name.clone();
                shard.router.update_topic(update).await.map_err(|status| pubsub_wording(status, &name))
            })
            .await?;
        Ok(Response::new(convert::topic_out(&name.project, updated)))
    }

    async fn publish(
        &self,
        request: Request<pubsub::PublishRequest>,
    ) -> Result<Response<pubsub::PublishResponse>, Status> {
        let request = match super::carry::publish(&self.gateway, request).await {
            Ok(carried) => return carried,
            Err(request) => request,
        };
        let presented = Presented::of(&request);
        let message_ids = publish(&self.gateway, presented, request.into_inner()).await?;
        Ok(Response::new(pubsub::PublishResponse { message_ids }))
    }

    async fn get_topic(
        &self,
        request: Request<pubsub::GetTopicRequest>,
    ) -> Result<Response<pubsub::Topic>, Status> {
        let presented = Presented::of(&request);
        let name = names::parse("topic", Kind::Topic, &request.get_ref().topic)?;
        let topic = name.name.clone();
        let found = self
            .gateway
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, Permission::TopicsGet, &topic)?;
                shard.router.get_topic(&topic).map_err(|status| pubsub_wording(status, &topic))
            })
            .await?;
        Ok(Response::new(convert::topic_out(&name.project, found)))
    }

    async fn list_topics(
        &self,
        request: Request<pubsub::ListTopicsRequest>,
    ) -> Result<Response<pubsub::ListTopicsResponse>, Status> {
        let presented = Presented::of(&request);
        let request = request.into_inner();
        let project = names::parse_project("project", &request.project)?;
        let list = list_request(String::new(), request.page_size, request.page_token)?;
        let page = self
            .gateway
            .router
            .try_call(move |shard| async move {
                let session = list_session(&presented, &shard.access)?;
                let page = shard
                    .router
                    .list_topics(&list, |item| shard.access.allows(&session, Permission::TopicsList, item));
                Ok(page)
            })
            .await?;
        Ok(Response::new(pubsub::ListTopicsResponse {
            topics: page.items.into_iter().map(|topic| convert::topic_out(&project, topic)).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn list_topic_subscriptions(
        &self,
        request: Request<pubsub::ListTopicSubscriptionsRequest>,
    ) -> Result<Response<pubsub::ListTopicSubscriptionsResponse>, Status> {
        let presented = Presented::of(&request);
        Ok(Response::new(list_topic_subscriptions(&self.gateway, presented, request.into_inner()).await?))
    }

    async fn list_topic_snapshots(
        &self,
        request: Request<pubsub::ListTopicSnapshotsRequest>,
    ) -> Result<Response<pubsub::ListTopicSnapshotsResponse>, Status> {
        let presented = Presented::of(&request);
        Ok(Response::new(list_topic_snapshots(&self.gateway, presented, request.into_inner()).await?))
    }

    async fn delete_topic(
        &self,
        request: Request<pubsub::DeleteTopicRequest>,
    ) -> Result<Response<()>, Status> {
        let presented = Presented::of(&request);
        let topic = names::parse("topic", Kind::Topic, &request.get_ref().topic)?.name;
        self.gateway
            .router
            .try_call(move |shard| async move {
                presented.check(&shard.access, Permission::TopicsDelete, &topic)?;
                shard.router.delete_topic(&topic).await.map_err(|status| pubsub_wording(status, &topic))
            })
            .await?;
        // The topic's route is stale, and so are its subscriptions', which are not named here.
        self.gateway.forget_all();
        Ok(Response::new(()))
    }

    async fn detach_subscription(
        &self,
        request: Request<pubsub::DetachSubscriptionRequest>,
    ) -> Result<Response<pubsub::DetachSubscriptionResponse>, Status> {
        let presented = Presented::of(&request);
        detach_subscription(&self.gateway, presented, request.into_inner().subscription).await?;
        Ok(Response::new(pubsub::DetachSubscriptionResponse {}))
    }
}
