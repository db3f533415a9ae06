//! Snapshots and seek.

use super::gateway::Gateway;
use ringpost_proto::pubsub;
use tonic::{Request, Response, Status};

pub async fn get(
    gateway: &Gateway,
    request: Request<pubsub::GetSnapshotRequest>,
) -> Result<Response<pubsub::Snapshot>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("get: not built yet"))
}

pub async fn list(
    gateway: &Gateway,
    request: Request<pubsub::ListSnapshotsRequest>,
) -> Result<Response<pubsub::ListSnapshotsResponse>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("list: not built yet"))
}

pub async fn create(
    gateway: &Gateway,
    request: Request<pubsub::CreateSnapshotRequest>,
) -> Result<Response<pubsub::Snapshot>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("create: not built yet"))
}

pub async fn update(
    gateway: &Gateway,
    request: Request<pubsub::UpdateSnapshotRequest>,
) -> Result<Response<pubsub::Snapshot>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("update: not built yet"))
}

pub async fn delete(
    gateway: &Gateway,
    request: Request<pubsub::DeleteSnapshotRequest>,
) -> Result<Response<()>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("delete: not built yet"))
}

pub async fn seek(
    gateway: &Gateway,
    request: Request<pubsub::SeekRequest>,
) -> Result<Response<pubsub::SeekResponse>, Status> {
    let _ = (gateway, request);
    Err(Status::unimplemented("seek: not built yet"))
}
