//! `google.pubsub.v1.Publisher`: topics and publishing, on the router (admin) and on the
//! topic's forwarder (publish).
//!
//! Every method parses its names first (a bad one is refused before anything else), then runs
//! through the door (`crate::dispatch`), which checks the caller's permission before the
//! operation has any effect, as for the native protocol; a publish runs on its forwarder.

use super::convert;
use super::credentials::Presented;
use super::gateway::{is_stale_route, Gateway, Resource, Serving};
use super::names::{self, Kind};
use super::remote;
use crate::api::control::ListRequest;
use crate::api::data::{Attributes, DataError, DataPlane, MessageView, PublishBatch};
use crate::api::{Code, Status as DomainStatus};
use crate::dispatch::{Operation, Outcome};
use ringpost_proto::pubsub;
use ringpost_wire::frame::decode_body;
use ringpost_wire::messages::PublishResponse;
use ringpost_wire::Command as WireCommand;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// The Publisher service over the gateway.
pub struct PublisherService {
    pub gateway: Arc<Gateway>,
}

// --- Shared by the administration handlers (this file, `subscriptions`, `snapshots`) -------

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
pub(super) struct OwnedAttributes(Vec<(String, String)>);

impl Attributes for OwnedAttributes {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> (&str, &str) {
        let (key, value) = &self.0[index];
        (key, value)
    }
}

pub(super) struct OwnedMessage {
    data: prost::bytes::Bytes,
    attributes: OwnedAttributes,
    pub(super) ordering_key: String,
}

/// A gRPC publish's messages, owned, so that they cross to the forwarder shard; the data stays
/// in the buffers tonic decoded it into. The data plane checks them (`check_publish`: sizes,
/// counts, attributes, ordering keys) with the native protocol's rules and wording.
pub(super) struct OwnedPublish {
    pub(super) topic: String,
    pub(super) messages: Vec<OwnedMessage>,
}

impl OwnedPublish {
    pub(super) fn new(topic: String, messages: Vec<pubsub::PubsubMessage>) -> OwnedPublish {
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
    ) -> Result<(), DataError> {
        let mut messages = self.messages.iter().map(|message| MessageView {
            data: &message.data,
            attributes: &message.attributes,
            ordering_key: &message.ordering_key,
        });
        visit(&self.topic, &mut messages);
        Ok(())
    }

    /// The gateway checked it (`check_schema`) before it crossed to the shard.
    fn checked_against_schema(&self) -> bool {
        true
    }
}

/// Forwarders a publish tries: the one the gateway remembers, then, if it no longer serves the
/// topic, the one the router names now. A topic that moves again within that is rare enough
/// that the client's retry of `UNAVAILABLE` covers it.
const PUBLISH_ATTEMPTS_MAX: usize = 2;

/// What a publish on a forwarder came to: the message ids, or the batch back when the shard
/// no longer serves the topic (the route was stale), to be sent again where it moved.
type Published = Result<Range<u64>, OwnedPublish>;

/// Publishes on the forwarder serving the topic, on this node or carried to another
/// (`remote`); after a stale route, once more through the router.
async fn publish(
    gateway: &Gateway,
    presented: Presented,
    request: pubsub::PublishRequest,
) -> Result<Vec<String>, Status> {
    let parsed = names::parse("topic", Kind::Topic, &request.topic)?;
    let (project, topic) = (parsed.project, parsed.name);
    let mut request = request;
    // Every message is checked against the topic's schema before any is appended, so that a
    // refused publish stores nothing of its request.
    if let Some(validator) = gateway.topic_schema(&presented, &topic).await? {
        check_schema(&validator, &project, &mut request.messages)?;
    }
    let resource = Resource::Topic(topic.clone());
    let kind = crate::dispatch::Kind::Publish;
    if let Some(gathered) = gateway.gathered(&presented, &resource, kind).await? {
        let batch = OwnedPublish::new(topic, request.messages);
        return super::sources::publish(gateway, &presented, batch, gathered).await;
    }
    let mut batch = OwnedPublish::new(topic.clone(), request.messages);
    for _attempt in 0..PUBLISH_ATTEMPTS_MAX {
        let shard = match gateway.topic_forwarder(&presented, &topic, crate::dispatch::Kind::Publish).await? {
            Serving::Here(shard) => shard,
            Serving::Elsewhere(shard) => {
                // Checked here with the data plane's rules and wording too, so that what is
                // carried is bounded by them (the serving node checks again).
                batch.check()?;
                let body = remote::native_body(WireCommand::Publish, &batch.native())?;
                let carried = resource.clone();
                match remote::carry(shard, &presented, carried, WireCommand::Publish, body, Duration::ZERO)
                    .await
                {
                    Ok(Some(answer)) => {
                        let response = decode_body::<PublishResponse>(&answer).map_err(DomainStatus::from)?;
                        return Ok(response.message_ids.iter().map(u64::to_string).collect());
                    }
                    // Served here now: the route was stale.
                    Ok(None) => gateway.forget(&resource),
                    Err(status) => {
                        gateway.forget_if_stale(&resource, &status);
                        if !is_stale_route(&status) {
                            return Err(status.into());
                        }
                    }
                }
                continue;
            }
        };
        let (presented, name) = (presented.clone(), topic.clone());
        let published: Published = shard
            .try_call(move |shard| async move {
                presented.check(&shard.access, crate::dispatch::Kind::Publish, &name)?;
                // Nothing awaits between this lookup and the publish's own, so the answer holds.
                match shard.forwarder.topic(&name) {
                    Err(error) if error.is_not_owner() => return Ok(Err(batch)),
                    Err(error) => return Err(error.into()),
                    Ok(_) => {}
                }
                Ok(shard.forwarder.publish(batch).await.map(Ok)?)
            })
            .await?;
        match published {
            Ok(ids) => return Ok(ids.map(|id| id.to_string()).collect()),
            Err(returned) => {
                gateway.forget(&resource);
                batch = returned;
            }
        }
    }
    Err(Status::unavailable(format!("topic '{topic}' moved while it was published to; retry")))
}

/// Checks each message against the topic's schema (`validator`), and adds the attributes
/// Pub/Sub adds to each that matches; refused, INVALID_ARGUMENT as Pub/Sub words it, at the
/// first that matches no revision.
fn check_schema(
    validator: &crate::schema::TopicValidator,
    project: &str,
    messages: &mut [pubsub::PubsubMessage],
) -> Result<(), Status> {
    let schema_name = match validator.settings.schema.as_str() {
        crate::catalog::schemas::DELETED_SCHEMA => crate::catalog::schemas::DELETED_SCHEMA.to_owned(),
        schema => names::format(project, Kind::Schema, schema),
    };
    let mut matched = Vec::with_capacity(messages.len());
    for message in messages.iter() {
        matched.push(validator.check(&message.data).map_err(Status::invalid_argument)?.to_owned());
    }
    for (message, revision_id) in messages.iter_mut().zip(matched) {
        message.attributes.extend(validator.attributes(&schema_name, &revision_id));
    }
    Ok(())
}

impl OwnedPublish {
    /// Pub/Sub's rules for a publish (`api::data::check_publish`).
    pub(super) fn check(&self) -> Result<(), DomainStatus> {
        let mut checked = Ok(0);
        self.visit(&mut |topic, messages| {
            checked = crate::api::data::check_publish(topic, messages, |_| 0);
        })?;
        Ok(checked.map(|_| ())?)
    }

    /// The batch as a native publish, for the node that serves its topic.
    pub(super) fn native(&self) -> ringpost_wire::messages::PublishRequest {
        use ringpost_wire::messages::{Attribute, PubsubMessage};
        ringpost_wire::messages::PublishRequest {
            topic: self.topic.clone(),
            messages: self
                .messages
                .iter()
                .map(|message| PubsubMessage {
                    data: message.data.to_vec(),
                    attributes: message
                        .attributes
                        .0
                        .iter()
                        .map(|(key, value)| Attribute { key: key.clone(), value: value.clone() })
                        .collect(),
                    ordering_key: message.ordering_key.clone(),
                })
                .collect(),
        }
    }
}

// --- Topics' administration ----------------------------------------------------------------

/// ListTopicSubscriptions: the subscription names of one page of the topic's.
async fn list_topic_subscriptions(
    gateway: &Gateway,
    presented: Presented,
    request: pubsub::ListTopicSubscriptionsRequest,
) -> Result<pubsub::ListTopicSubscriptionsResponse, Status> {
    let topic = names::parse("topic", Kind::Topic, &request.topic)?;
    let list = list_request(topic.name.clone(), request.page_size, request.page_token)?;
    let page = gateway
        .execute(&presented, Operation::ListTopicSubscriptions(list))
        .await
        .and_then(Outcome::into_subscriptions)
        .map_err(|status| pubsub_wording(status, &topic.name))?;
    Ok(pubsub::ListTopicSubscriptionsResponse {
        subscriptions: page
            .items
            .iter()
            .map(|item| names::format(&topic.project, Kind::Subscription, &item.subscription.name))
            .collect(),
        next_page_token: page.next_page_token,
    })
}

/// ListTopicSnapshots: the snapshot names of one page of the topic's.
async fn list_topic_snapshots(
    gateway: &Gateway,
    presented: Presented,
    request: pubsub::ListTopicSnapshotsRequest,
) -> Result<pubsub::ListTopicSnapshotsResponse, Status> {
    let topic = names::parse("topic", Kind::Topic, &request.topic)?;
    let list = list_request(topic.name.clone(), request.page_size, request.page_token)?;
    let page = gateway
        .execute(&presented, Operation::ListTopicSnapshots(list))
        .await
        .and_then(Outcome::into_snapshots)
        .map_err(|status| pubsub_wording(status, &topic.name))?;
    Ok(pubsub::ListTopicSnapshotsResponse {
        snapshots: page
            .items
            .iter()
            .map(|item| names::format(&topic.project, Kind::Snapshot, &item.name))
            .collect(),
        next_page_token: page.next_page_token,
    })
}

#[tonic::async_trait]
impl pubsub::publisher_server::Publisher for PublisherService {
    async fn create_topic(&self, request: Request<pubsub::Topic>) -> Result<Response<pubsub::Topic>, Status> {
        let presented = Presented::of(&request);
        let (name, topic) = convert::topic_in(request.get_ref())?;
        let settings = convert::schema_settings_in(request.get_ref().schema_settings.as_ref())?;
        if let Some(settings) = &settings {
            super::schemas::check_topic_schema(&self.gateway, &presented, settings).await?;
        }
        let created = self
            .gateway
            .execute(&presented, Operation::CreateTopic(topic))
            .await
            .and_then(Outcome::into_topic)
            .map_err(|status| pubsub_wording(status, &name.name))?;
        let mut shown = convert::topic_out(&name.project, created);
        // What this node remembered of a topic of the name before (deleted through another node).
        self.gateway.forget_schemas();
        // Its own entry, after the topic's: a topic without a schema is written as before.
        if settings.is_some() {
            let set = super::schemas::set_topic_schema(&self.gateway, &presented, &name.name, settings).await;
            if let Err(refused) = set {
                // A refusal creates nothing: the topic goes again (its schema was deleted or
                // changed since the check above).
                let delete = Operation::DeleteTopic { name: name.name.clone() };
                let _ = self.gateway.execute(&presented, delete).await;
                return Err(refused);
            }
            super::schemas::show_topic_schemas(
                &self.gateway,
                &name.project,
                std::slice::from_mut(&mut shown),
            )
            .await?;
        }
        Ok(Response::new(shown))
    }

    async fn update_topic(
        &self,
        request: Request<pubsub::UpdateTopicRequest>,
    ) -> Result<Response<pubsub::Topic>, Status> {
        let presented = Presented::of(&request);
        let (name, update) = convert::topic_update_in(request.get_ref())?;
        let masked = request.get_ref().update_mask.as_ref();
        if masked.is_some_and(|mask| mask.paths.iter().any(|path| path == "schema_settings")) {
            let given = request.get_ref().topic.as_ref().and_then(|topic| topic.schema_settings.as_ref());
            let settings = convert::schema_settings_in(given)?;
            super::schemas::set_topic_schema(&self.gateway, &presented, &name.name, settings).await.map_err(
                |status| match status.code() {
                    tonic::Code::NotFound if status.message().contains("topic") => {
                        Status::not_found(format!("Resource not found (resource={}).", name.name))
                    }
                    _ => status,
                },
            )?;
        }
        let updated = self
            .gateway
            .execute(&presented, Operation::UpdateTopic(update))
            .await
            .and_then(Outcome::into_topic)
            .map_err(|status| pubsub_wording(status, &name.name))?;
        let mut shown = convert::topic_out(&name.project, updated);
        super::schemas::show_topic_schemas(&self.gateway, &name.project, std::slice::from_mut(&mut shown))
            .await?;
        Ok(Response::new(shown))
    }

    async fn publish(
        &self,
        request: Request<pubsub::PublishRequest>,
    ) -> Result<Response<pubsub::PublishResponse>, Status> {
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
        let found = self
            .gateway
            .execute(&presented, Operation::GetTopic { name: name.name.clone() })
            .await
            .and_then(Outcome::into_topic)
            .map_err(|status| pubsub_wording(status, &name.name))?;
        let mut shown = convert::topic_out(&name.project, found);
        super::schemas::show_topic_schemas(&self.gateway, &name.project, std::slice::from_mut(&mut shown))
            .await?;
        Ok(Response::new(shown))
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
            .execute(&presented, Operation::ListTopics(list))
            .await
            .and_then(Outcome::into_topics)?;
        let mut topics: Vec<pubsub::Topic> =
            page.items.into_iter().map(|topic| convert::topic_out(&project, topic)).collect();
        super::schemas::show_topic_schemas(&self.gateway, &project, &mut topics).await?;
        Ok(Response::new(pubsub::ListTopicsResponse { topics, next_page_token: page.next_page_token }))
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
            .execute(&presented, Operation::DeleteTopic { name: topic.clone() })
            .await
            .and_then(Outcome::into_done)
            .map_err(|status| pubsub_wording(status, &topic))?;
        // The topic's route is stale, and so are its subscriptions', which are not named here.
        self.gateway.forget_all();
        Ok(Response::new(()))
    }

    async fn detach_subscription(
        &self,
        request: Request<pubsub::DetachSubscriptionRequest>,
    ) -> Result<Response<pubsub::DetachSubscriptionResponse>, Status> {
        let presented = Presented::of(&request);
        let name = names::parse("subscription", Kind::Subscription, &request.get_ref().subscription)?.name;
        self.gateway
            .execute(&presented, Operation::DetachSubscription { name: name.clone() })
            .await
            .and_then(Outcome::into_done)
            .map_err(|status| pubsub_wording(status, &name))?;
        self.gateway.forget(&Resource::Subscription(name));
        Ok(Response::new(pubsub::DetachSubscriptionResponse {}))
    }
}
