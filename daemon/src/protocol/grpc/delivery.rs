//! Delivery: pull, streaming pull, acknowledge and modify ack deadline, on the subscription's forwarder.

use super::gateway::Gateway;
use ringpost_proto::pubsub;
use std::pin::Pin;
use tonic::{Request, Response, Status};

/// What a StreamingPull answers: responses until the stream ends.
pub type ResponseStream =
    Pin<Box<dyn futures_lite::Stream<Item = Result<pubsub::StreamingPullResponse, Status>> + Send + 'static>>;

pub async fn streaming_pull(
    gateway: &Gateway,
    request: Request<tonic::Streaming<pubsub::StreamingPullRequest>>,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> Result<Response<ResponseStream>, Status> {
    let _ = (gateway, request, stopping);
    Err(Status::unimplemented("streaming_pull: not built yet"))
}

pub async fn pull(
    gateway: &Gateway,
    request: Request<pubsub::PullRequest>,
) -> Result<Response<pubsub::PullResponse>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("pull: not built yet"))
}

pub async fn acknowledge(
    gateway: &Gateway,
    request: Request<pubsub::AcknowledgeRequest>,
) -> Result<Response<()>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("acknowledge: not built yet"))
}

pub async fn modify_ack_deadline(
    gateway: &Gateway,
    request: Request<pubsub::ModifyAckDeadlineRequest>,
) -> Result<Response<()>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("modify_ack_deadline: not built yet"))
}
