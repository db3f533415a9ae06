//! Subscriptions' administration: create, get, update, modify push config, list, delete, through
//! the door, which checks the caller's permission before any effect.

use super::convert;
use super::credentials::Presented;
use super::gateway::Gateway;
use super::names::{self, Kind};
use super::publisher::{list_request, pubsub_wording};
use crate::dispatch::{Operation, Outcome, SubscriptionShown};
use ringpost_proto::pubsub;
use tonic::{Request, Response, Status};

fn shown_out(project: &str, shown: SubscriptionShown) -> pubsub::Subscription {
    convert::subscription_out(project, shown.subscription, shown.topic_retention_seconds)
}

pub async fn create(
    gateway: &Gateway,
    request: Request<pubsub::Subscription>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let presented = Presented::of(&request);
    let (name, subscription) = convert::subscription_in(request.get_ref())?;
    let created = gateway
        .execute(&presented, Operation::CreateSubscription(subscription))
        .await
        .and_then(Outcome::into_subscription)
        .map_err(|status| {
            // A missing resource may be the topic or the dead-letter topic: the router's
            // message says which; an existing one can only be the subscription.
            if status.code == crate::api::Code::AlreadyExists {
                pubsub_wording(status, &name.name)
            } else {
                status
            }
        })?;
    Ok(Response::new(shown_out(&name.project, created)))
}

pub async fn get(
    gateway: &Gateway,
    request: Request<pubsub::GetSubscriptionRequest>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let presented = Presented::of(&request);
    let name = names::parse("subscription", Kind::Subscription, &request.get_ref().subscription)?;
    let found = gateway
        .execute(&presented, Operation::GetSubscription { name: name.name.clone() })
        .await
        .and_then(Outcome::into_subscription)
        .map_err(|status| pubsub_wording(status, &name.name))?;
    Ok(Response::new(shown_out(&name.project, found)))
}

pub async fn update(
    gateway: &Gateway,
    request: Request<pubsub::UpdateSubscriptionRequest>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let presented = Presented::of(&request);
    let (name, update) = convert::subscription_update_in(request.get_ref())?;
    let updated = gateway
        .execute(&presented, Operation::UpdateSubscription(update))
        .await
        .and_then(Outcome::into_subscription)?;
    Ok(Response::new(shown_out(&name.project, updated)))
}

/// ModifyPushConfig: an update of the push configuration alone, through the door like an
/// UpdateSubscription (and with its permission); an empty `push_config` makes the
/// subscription pull.
pub async fn modify_push_config(
    gateway: &Gateway,
    request: Request<pubsub::ModifyPushConfigRequest>,
) -> Result<Response<()>, Status> {
    let presented = Presented::of(&request);
    let request = request.get_ref();
    let names::Name { project, name } =
        names::parse("subscription", Kind::Subscription, &request.subscription)?;
    let push = convert::push_config_in(request.push_config.as_ref(), &project);
    gateway
        .execute(&presented, Operation::ModifyPushConfig { name: name.clone(), push })
        .await
        .and_then(Outcome::into_done)
        .map_err(|status| pubsub_wording(status, &name))?;
    Ok(Response::new(()))
}

pub async fn list(
    gateway: &Gateway,
    request: Request<pubsub::ListSubscriptionsRequest>,
) -> Result<Response<pubsub::ListSubscriptionsResponse>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let project = names::parse_project("project", &request.project)?;
    let list = list_request(String::new(), request.page_size, request.page_token)?;
    let page = gateway
        .execute(&presented, Operation::ListSubscriptions(list))
        .await
        .and_then(Outcome::into_subscriptions)?;
    Ok(Response::new(pubsub::ListSubscriptionsResponse {
        subscriptions: page.items.into_iter().map(|shown| shown_out(&project, shown)).collect(),
        next_page_token: page.next_page_token,
    }))
}

pub async fn delete(
    gateway: &Gateway,
    request: Request<pubsub::DeleteSubscriptionRequest>,
) -> Result<Response<()>, Status> {
    let presented = Presented::of(&request);
    let subscription =
        names::parse("subscription", Kind::Subscription, &request.get_ref().subscription)?.name;
    gateway
        .execute(&presented, Operation::DeleteSubscription { name: subscription.clone() })
        .await
        .and_then(Outcome::into_done)
        .map_err(|status| pubsub_wording(status, &subscription))?;
    gateway.forget(&crate::dispatch::routes::Resource::Subscription(subscription));
    Ok(Response::new(()))
}
