//! Snapshots and seek, through the door, which checks the caller's permission before any
//! effect.

use super::convert;
use super::credentials::Presented;
use super::gateway::Gateway;
use super::names::{self, Kind};
use super::publisher::{list_request, pubsub_wording};
use crate::api::control::SeekTarget;
use crate::api::Status as DomainStatus;
use crate::dispatch::{Operation, Outcome};
use ringpost_proto::pubsub;
use tonic::{Request, Response, Status};

pub async fn get(
    gateway: &Gateway,
    request: Request<pubsub::GetSnapshotRequest>,
) -> Result<Response<pubsub::Snapshot>, Status> {
    let presented = Presented::of(&request);
    let name = names::parse("snapshot", Kind::Snapshot, &request.get_ref().snapshot)?;
    let found = gateway
        .execute(&presented, Operation::GetSnapshot { name: name.name.clone() })
        .await
        .and_then(Outcome::into_snapshot)
        .map_err(|status| pubsub_wording(status, &name.name))?;
    Ok(Response::new(convert::snapshot_out(&name.project, found)))
}

pub async fn list(
    gateway: &Gateway,
    request: Request<pubsub::ListSnapshotsRequest>,
) -> Result<Response<pubsub::ListSnapshotsResponse>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let project = names::parse_project("project", &request.project)?;
    let list = list_request(String::new(), request.page_size, request.page_token)?;
    let page = gateway
        .execute(&presented, Operation::ListSnapshots(list))
        .await
        .and_then(Outcome::into_snapshots)?;
    Ok(Response::new(pubsub::ListSnapshotsResponse {
        snapshots: page.items.into_iter().map(|snapshot| convert::snapshot_out(&project, snapshot)).collect(),
        next_page_token: page.next_page_token,
    }))
}

pub async fn create(
    gateway: &Gateway,
    request: Request<pubsub::CreateSnapshotRequest>,
) -> Result<Response<pubsub::Snapshot>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let name = names::parse("name", Kind::Snapshot, &request.name)?;
    let subscription = names::parse("subscription", Kind::Subscription, &request.subscription)?.name;
    if !request.tags.is_empty() {
        return Err(convert::unsupported("tags").into());
    }
    let labels = convert::labels_in(&request.labels);
    let created = gateway
        .execute(&presented, Operation::CreateSnapshot { name: name.name.clone(), subscription, labels })
        .await
        .and_then(Outcome::into_snapshot)
        .map_err(|status| {
            // A missing resource is the subscription (the router's message names it); an
            // existing one can only be the snapshot.
            if status.code == crate::api::Code::AlreadyExists {
                pubsub_wording(status, &name.name)
            } else {
                status
            }
        })?;
    Ok(Response::new(convert::snapshot_out(&name.project, created)))
}

/// UpdateSnapshot: its labels.
pub async fn update(
    gateway: &Gateway,
    request: Request<pubsub::UpdateSnapshotRequest>,
) -> Result<Response<pubsub::Snapshot>, Status> {
    let presented = Presented::of(&request);
    let (name, labels) = convert::snapshot_update_in(request.get_ref())?;
    let updated = gateway
        .execute(&presented, Operation::UpdateSnapshot { name: name.name.clone(), labels })
        .await
        .and_then(Outcome::into_snapshot)
        .map_err(|status| pubsub_wording(status, &name.name))?;
    Ok(Response::new(convert::snapshot_out(&name.project, updated)))
}

pub async fn delete(
    gateway: &Gateway,
    request: Request<pubsub::DeleteSnapshotRequest>,
) -> Result<Response<()>, Status> {
    let presented = Presented::of(&request);
    let snapshot = names::parse("snapshot", Kind::Snapshot, &request.get_ref().snapshot)?.name;
    gateway
        .execute(&presented, Operation::DeleteSnapshot { name: snapshot.clone() })
        .await
        .and_then(Outcome::into_done)
        .map_err(|status| pubsub_wording(status, &snapshot))?;
    Ok(Response::new(()))
}

/// A Seek's target, checked: a time, or a snapshot by Ringpost's name.
fn seek_target(target: Option<pubsub::seek_request::Target>) -> Result<SeekTarget, DomainStatus> {
    match target {
        None => Err(DomainStatus::invalid_argument("a seek needs a target: time or snapshot")),
        Some(pubsub::seek_request::Target::Time(time)) => {
            Ok(SeekTarget::Time { time_ms: convert::timestamp_ms("time", &time)? })
        }
        Some(pubsub::seek_request::Target::Snapshot(snapshot)) => {
            Ok(SeekTarget::Snapshot { name: names::parse("snapshot", Kind::Snapshot, &snapshot)?.name })
        }
    }
}

pub async fn seek(
    gateway: &Gateway,
    request: Request<pubsub::SeekRequest>,
) -> Result<Response<pubsub::SeekResponse>, Status> {
    let presented = Presented::of(&request);
    let request = request.into_inner();
    let subscription = names::parse("subscription", Kind::Subscription, &request.subscription)?.name;
    let target = seek_target(request.target)?;
    gateway
        .execute(&presented, Operation::Seek { subscription, target })
        .await
        .and_then(Outcome::into_done)?;
    Ok(Response::new(pubsub::SeekResponse {}))
}
