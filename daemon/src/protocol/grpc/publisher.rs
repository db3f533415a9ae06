//! `google.pubsub.v1.Publisher`: topics and publishing, on the router (admin) and on the
//! topic's forwarder (publish).

use super::gateway::Gateway;
use ringpost_proto::pubsub;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The Publisher service over the gateway.
pub struct PublisherService {
    pub gateway: Arc<Gateway>,
}

#[tonic::async_trait]
impl pubsub::publisher_server::Publisher for PublisherService {
    async fn create_topic(&self, request: Request<pubsub::Topic>) -> Result<Response<pubsub::Topic>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("create_topic: not built yet"))
    }

    async fn update_topic(
        &self,
        request: Request<pubsub::UpdateTopicRequest>,
    ) -> Result<Response<pubsub::Topic>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("update_topic: not built yet"))
    }

    async fn publish(
        &self,
        request: Request<pubsub::PublishRequest>,
    ) -> Result<Response<pubsub::PublishResponse>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("publish: not built yet"))
    }

    async fn get_topic(
        &self,
        request: Request<pubsub::GetTopicRequest>,
    ) -> Result<Response<pubsub::Topic>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("get_topic: not built yet"))
    }

    async fn list_topics(
        &self,
        request: Request<pubsub::ListTopicsRequest>,
    ) -> Result<Response<pubsub::ListTopicsResponse>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("list_topics: not built yet"))
    }

    async fn list_topic_subscriptions(
        &self,
        request: Request<pubsub::ListTopicSubscriptionsRequest>,
    ) -> Result<Response<pubsub::ListTopicSubscriptionsResponse>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("list_topic_subscriptions: not built yet"))
    }

    async fn list_topic_snapshots(
        &self,
        request: Request<pubsub::ListTopicSnapshotsRequest>,
    ) -> Result<Response<pubsub::ListTopicSnapshotsResponse>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("list_topic_snapshots: not built yet"))
    }

    async fn delete_topic(
        &self,
        request: Request<pubsub::DeleteTopicRequest>,
    ) -> Result<Response<()>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("delete_topic: not built yet"))
    }

    async fn detach_subscription(
        &self,
        request: Request<pubsub::DetachSubscriptionRequest>,
    ) -> Result<Response<pubsub::DetachSubscriptionResponse>, Status> {
        let _ = (&self.gateway, request);
        Err(Status::unimplemented("detach_subscription: not built yet"))
    }
}
