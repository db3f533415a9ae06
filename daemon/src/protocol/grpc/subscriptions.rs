//! Subscriptions' administration: create, get, update, list, delete.

use super::gateway::Gateway;
use ringpost_proto::pubsub;
use tonic::{Request, Response, Status};

pub async fn create(
    gateway: &Gateway,
    request: Request<pubsub::Subscription>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("create: not built yet"))
}

pub async fn get(
    gateway: &Gateway,
    request: Request<pubsub::GetSubscriptionRequest>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("get: not built yet"))
}

pub async fn update(
    gateway: &Gateway,
    request: Request<pubsub::UpdateSubscriptionRequest>,
) -> Result<Response<pubsub::Subscription>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("update: not built yet"))
}

pub async fn list(
    gateway: &Gateway,
    request: Request<pubsub::ListSubscriptionsRequest>,
) -> Result<Response<pubsub::ListSubscriptionsResponse>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("list: not built yet"))
}

pub async fn delete(
    gateway: &Gateway,
    request: Request<pubsub::DeleteSubscriptionRequest>,
) -> Result<Response<()>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("delete: not built yet"))
}
