//! Publish and delivery calls for a topic or subscription another node of the cluster serves,
//! carried to that node's gRPC API: this API reaches only its own node's forwarder shards
//! (through their job channels), and Google's client libraries know one endpoint, not the
//! forwarder lists the native protocol's clients follow. The request goes on unchanged, its
//! metadata too (the serving node checks the caller's `authorization` itself), marked with
//! `FORWARDED_FROM` so that it is never carried again: a carried call the serving node no
//! longer serves is answered there (`NotOwner`, then the client retries), not passed around.
//! Plaintext only: over TLS the serving node would not see the client's certificate.

use super::credentials::Presented;
use super::gateway::{Gateway, Resource};
use super::names::{self, Kind};
use crate::auth::Permission;
use futures_lite::StreamExt;
use ringpost_proto::pubsub;
use ringpost_proto::pubsub::publisher_client::PublisherClient;
use ringpost_proto::pubsub::subscriber_client::SubscriberClient;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// The request header that marks a call carried here by another node (its id): answered here,
/// never carried again.
pub const FORWARDED_FROM: &str = "ringpost-forwarded-from";

/// How long connecting to another node's gRPC API may take before the call is answered
/// `UNAVAILABLE` (the client retries, by then perhaps toward another node).
pub const GRPC_CARRY_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Other nodes' gRPC addresses whose channels the gateway keeps (`Gateway::channel`); past it
/// the cache is emptied (a cluster has at most `CLUSTER_VOTERS_MAX` nodes, so only addresses
/// that changed fill it).
pub const GRPC_CARRY_CHANNELS_MAX: usize = 16;

/// Whether another node carried this call here.
pub fn was_carried<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED_FROM)
}

/// `request` marked as carried by this node.
fn marked<T>(mut request: Request<T>, gateway: &Gateway) -> Request<T> {
    let node = gateway.cluster_node.unwrap_or_default().to_string();
    if let Ok(value) = node.parse() {
        request.metadata_mut().insert(FORWARDED_FROM, value);
    }
    request
}

/// The channel to the node serving `resource`, when it is another node and this call may be
/// carried (it was not carried here already).
async fn serving_node<T>(
    gateway: &Gateway,
    request: &Request<T>,
    resource: Resource,
    permission: Permission,
) -> Result<Option<Channel>, Status> {
    if was_carried(request) || !gateway.carries() {
        return Ok(None);
    }
    Ok(gateway.elsewhere(&Presented::of(request), resource, permission).await?)
}

fn subscription(name: &str) -> Result<Resource, Status> {
    Ok(Resource::Subscription(names::parse("subscription", Kind::Subscription, name)?.name))
}

/// A carried call's failure makes the route be looked up again next time.
fn forgetting<R>(gateway: &Gateway, resource: &Resource, result: Result<R, Status>) -> Result<R, Status> {
    if result.is_err() {
        gateway.forget_elsewhere(resource);
    }
    result
}

/// Publish, carried when another node serves the topic; `Err(request)` back to run it here.
pub async fn publish(
    gateway: &Gateway,
    request: Request<pubsub::PublishRequest>,
) -> Result<Result<Response<pubsub::PublishResponse>, Status>, Request<pubsub::PublishRequest>> {
    let resource = match names::parse("topic", Kind::Topic, &request.get_ref().topic) {
        Ok(name) => Resource::Topic(name.name),
        Err(_) => return Err(request),
    };
    match serving_node(gateway, &request, resource.clone(), Permission::TopicsPublish).await {
        Ok(Some(channel)) => {
            let answer = PublisherClient::new(channel).publish(marked(request, gateway)).await;
            Ok(forgetting(gateway, &resource, answer))
        }
        Ok(None) => Err(request),
        Err(status) => Ok(Err(status)),
    }
}

/// Pull, Acknowledge and ModifyAckDeadline, carried when another node serves the
/// subscription: `send` makes the call on a client of that node.
pub async fn unary<T, R, F, Fut>(
    gateway: &Gateway,
    request: Request<T>,
    name: impl Fn(&T) -> &str,
    send: F,
) -> Result<Result<Response<R>, Status>, Request<T>>
where
    F: FnOnce(SubscriberClient<Channel>, Request<T>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<R>, Status>>,
{
    let Ok(resource) = subscription(name(request.get_ref())) else { return Err(request) };
    match serving_node(gateway, &request, resource.clone(), Permission::SubscriptionsConsume).await {
        Ok(Some(channel)) => {
            let answer = send(SubscriberClient::new(channel), marked(request, gateway)).await;
            Ok(forgetting(gateway, &resource, answer))
        }
        Ok(None) => Err(request),
        Err(status) => Ok(Err(status)),
    }
}

/// A StreamingPull whose first request names a subscription another node serves: the stream
/// is carried there whole, its first request first, and that node's responses are this one's.
pub async fn streaming_pull(
    gateway: &Gateway,
    metadata: &tonic::metadata::MetadataMap,
    first: &pubsub::StreamingPullRequest,
    rest: &mut Option<Streaming<pubsub::StreamingPullRequest>>,
) -> Result<Option<super::streaming::ResponseStream>, Status> {
    let mut probe = Request::new(());
    *probe.metadata_mut() = metadata.clone();
    let resource = subscription(&first.subscription)?;
    let Some(channel) =
        serving_node(gateway, &probe, resource.clone(), Permission::SubscriptionsConsume).await?
    else {
        return Ok(None);
    };
    let requests = rest.take().expect("the stream's requests, once");
    let outbound = futures_lite::stream::once(first.clone()).chain(requests.filter_map(Result::ok));
    let mut carried = Request::new(outbound);
    *carried.metadata_mut() = metadata.clone();
    let carried = marked(carried, gateway);
    let answer = SubscriberClient::new(channel).streaming_pull(carried).await;
    let responses = forgetting(gateway, &resource, answer)?.into_inner();
    Ok(Some(Box::pin(responses)))
}
