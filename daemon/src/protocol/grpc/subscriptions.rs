//! Subscriptions' administration: create, get, update, list, delete, on the router shard, with
//! the native protocol's permissions, checked there before any effect.

use super::convert;
use super::credentials::Presented;
use super::gateway::{Gateway, RouterShard};
use super::names::{self, Kind};
use super::publisher::{list_request, list_session, pubsub_wording};
use crate::api::control::Subscription;
use crate::api::Status as DomainStatus;
use crate::auth::Permission;
use ringpost_proto::pubsub;
use tonic::{Request, Response, Status};

/// A subscription with its topic's message retention (0: not set, or the topic is gone),
/// which Pub/Sub shows as `topic_message_retention_duration`.
type WithRetention = (Subscription, u64);

fn with_retention(shard: &RouterShard, subscription: Subscription) -> WithRetention {
    let retention =
        shard.router.get_topic(&subscription.topic).map_or(0, |topic| topic.message_retention_seconds);
    (subscription, retention)
}

/// Whoever sets a dead-letter topic must be able to publish to it (as the native protocol
/// asks): dead-lettered messages are published there. Empty: none.
fn check_dead_letter_topic(
    presented: &Presented,
    shard: &RouterShard,
    topic: &str,
) -> Result<(), DomainStatus> {
    if !topic.is_empty() {
        presented.check(&shard.access, Permission::TopicsPublish, topic)?;
    }
    Ok(())
}

pub async fn create(
    gateway: &Gateway,
    request: Request<pubsub::Subscription>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let presented = Presented::of(&request);
    let (name, subscription) = convert::subscription_in(request.get_ref())?;
    let (created, retention) = gateway
        .router
        .try_call(move |shard| async move {
            presented.check(&shard.access, Permission::SubscriptionsCreate, &subscription.name)?;
            presented.check(&shard.access, Permission::TopicsAttachSubscription, &subscription.topic)?;
            check_dead_letter_topic(&presented, &shard, &subscription.settings.dead_letter_topic)?;
            let name = subscription.name.clone();
            // A missing resource may be the topic or the dead-letter topic: the router's
            // message says which; an existing one can only be the subscription.
            let created = shard.router.create_subscription(subscription).await.map_err(|status| {
                if status.code == crate::api::Code::AlreadyExists {
                    pubsub_wording(status, &name)
                } else {
                    status
                }
            })?;
            Ok(with_retention(&shard, created))
        })
        .await?;
    Ok(Response::new(convert::subscription_out(&name.project, created, retention)))
}

pub async fn get(
    gateway: &Gateway,
    request: Request<pubsub::GetSubscriptionRequest>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let presented = Presented::of(&request);
    let name = names::parse("subscription", Kind::Subscription, &request.get_ref().subscription)?;
    let subscription = name.name.clone();
    let (found, retention) = gateway
        .router
        .try_call(move |shard| async move {
            presented.check(&shard.access, Permission::SubscriptionsGet, &subscription)?;
            let found = shard
                .router
                .get_subscription(&subscription)
                .map_err(|status| pubsub_wording(status, &subscription))?;
            Ok(with_retention(&shard, found))
        })
        .await?;
    Ok(Response::new(convert::subscription_out(&name.project, found, retention)))
}

pub async fn update(
    gateway: &Gateway,
    request: Request<pubsub::UpdateSubscriptionRequest>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let presented = Presented::of(&request);
    let (name, update) = convert::subscription_update_in(request.get_ref())?;
    let (updated, retention) = gateway
        .router
        .try_call(move |shard| async move {
            presented.check(&shard.access, Permission::SubscriptionsUpdate, &update.name)?;
            if let Some((dead_letter_topic, _)) = &update.dead_letter_policy {
                check_dead_letter_topic(&presented, &shard, dead_letter_topic)?;
            }
            let updated = shard.router.update_subscription(update).await?;
            Ok(with_retention(&shard, updated))
        })
        .await?;
    Ok(Response::new(convert::subscription_out(&name.project, updated, retention)))
}

pub async fn list(
    gateway: &Gateway,
    request: Request<pubsub::ListSubscriptionsRequest>,
) -> Result<Response<pubsub::ListSubscriptionsResponse>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let project = names::parse_project("project", &request.project)?;
    let list = list_request(String::new(), request.page_size, request.page_token)?;
    let (items, next_page_token) = gateway
        .router
        .try_call(move |shard| async move {
            let session = list_session(&presented, &shard.access)?;
            let page = shard.router.list_subscriptions(&list, |item| {
                shard.access.allows(&session, Permission::SubscriptionsList, item)
            });
            let items: Vec<WithRetention> =
                page.items.into_iter().map(|subscription| with_retention(&shard, subscription)).collect();
            Ok((items, page.next_page_token))
        })
        .await?;
    Ok(Response::new(pubsub::ListSubscriptionsResponse {
        subscriptions: items
            .into_iter()
            .map(|(subscription, retention)| convert::subscription_out(&project, subscription, retention))
            .collect(),
        next_page_token,
    }))
}

pub async fn delete(
    gateway: &Gateway,
    request: Request<pubsub::DeleteSubscriptionRequest>,
) -> Result<Response<()>, Status> {
    let presented = Presented::of(&request);
    let subscription =
        names::parse("subscription", Kind::Subscription, &request.get_ref().subscription)?.name;
    let deleted = subscription.clone();
    gateway
        .router
        .try_call(move |shard| async move {
            presented.check(&shard.access, Permission::SubscriptionsDelete, &subscription)?;
            shard
                .router
                .delete_subscription(&subscription)
                .await
                .map_err(|status| pubsub_wording(status, &subscription))
        })
        .await?;
    gateway.forget_subscription(&deleted);
    Ok(Response::new(()))
}
