//! `google.pubsub.v1.Subscriber`: each method hands its request to the module that serves it:
//! subscriptions' administration (`subscriptions`), snapshots and seek (`snapshots`), and
//! delivery: pull, streaming pull, acknowledge, modify ack deadline (`delivery`).

use super::gateway::Gateway;
use super::{delivery, snapshots, subscriptions};
use ringpost_proto::pubsub;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

/// The Subscriber service over the gateway.
pub struct SubscriberService {
    pub gateway: Arc<Gateway>,
    /// Ends every open StreamingPull with `UNAVAILABLE` when the daemon stops, so that the
    /// clients reconnect (to this daemon once it is back).
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

#[tonic::async_trait]
impl pubsub::subscriber_server::Subscriber for SubscriberService {
    async fn create_subscription(
        &self,
        request: Request<pubsub::Subscription>,
    ) -> Result<Response<pubsub::Subscription>, Status> {
        subscriptions::create(&self.gateway, request).await
    }

    async fn get_subscription(
        &self,
        request: Request<pubsub::GetSubscriptionRequest>,
    ) -> Result<Response<pubsub::Subscription>, Status> {
        subscriptions::get(&self.gateway, request).await
    }

    async fn update_subscription(
        &self,
        request: Request<pubsub::UpdateSubscriptionRequest>,
    ) -> Result<Response<pubsub::Subscription>, Status> {
        subscriptions::update(&self.gateway, request).await
    }

    async fn list_subscriptions(
        &self,
        request: Request<pubsub::ListSubscriptionsRequest>,
    ) -> Result<Response<pubsub::ListSubscriptionsResponse>, Status> {
        subscriptions::list(&self.gateway, request).await
    }

    async fn delete_subscription(
        &self,
        request: Request<pubsub::DeleteSubscriptionRequest>,
    ) -> Result<Response<()>, Status> {
        subscriptions::delete(&self.gateway, request).await
    }

    async fn modify_ack_deadline(
        &self,
        request: Request<pubsub::ModifyAckDeadlineRequest>,
    ) -> Result<Response<()>, Status> {
        delivery::modify_ack_deadline(&self.gateway, request).await
    }

    async fn acknowledge(
        &self,
        request: Request<pubsub::AcknowledgeRequest>,
    ) -> Result<Response<()>, Status> {
        delivery::acknowledge(&self.gateway, request).await
    }

    async fn pull(
        &self,
        request: Request<pubsub::PullRequest>,
    ) -> Result<Response<pubsub::PullResponse>, Status> {
        delivery::pull(&self.gateway, request).await
    }

    type StreamingPullStream = delivery::ResponseStream;

    async fn streaming_pull(
        &self,
        request: Request<Streaming<pubsub::StreamingPullRequest>>,
    ) -> Result<Response<Self::StreamingPullStream>, Status> {
        delivery::streaming_pull(&self.gateway, request, self.stopping.clone()).await
    }

    async fn modify_push_config(
        &self,
        request: Request<pubsub::ModifyPushConfigRequest>,
    ) -> Result<Response<()>, Status> {
        subscriptions::modify_push_config(&self.gateway, request).await
    }

    async fn get_snapshot(
        &self,
        request: Request<pubsub::GetSnapshotRequest>,
    ) -> Result<Response<pubsub::Snapshot>, Status> {
        snapshots::get(&self.gateway, request).await
    }

    async fn list_snapshots(
        &self,
        request: Request<pubsub::ListSnapshotsRequest>,
    ) -> Result<Response<pubsub::ListSnapshotsResponse>, Status> {
        snapshots::list(&self.gateway, request).await
    }

    async fn create_snapshot(
        &self,
        request: Request<pubsub::CreateSnapshotRequest>,
    ) -> Result<Response<pubsub::Snapshot>, Status> {
        snapshots::create(&self.gateway, request).await
    }

    async fn update_snapshot(
        &self,
        request: Request<pubsub::UpdateSnapshotRequest>,
    ) -> Result<Response<pubsub::Snapshot>, Status> {
        snapshots::update(&self.gateway, request).await
    }

    async fn delete_snapshot(
        &self,
        request: Request<pubsub::DeleteSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        snapshots::delete(&self.gateway, request).await
    }

    async fn seek(
        &self,
        request: Request<pubsub::SeekRequest>,
    ) -> Result<Response<pubsub::SeekResponse>, Status> {
        snapshots::seek(&self.gateway, request).await
    }
}
