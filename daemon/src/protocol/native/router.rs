//! The router's side of the native protocol: a frame's command chooses the router's operation,
//! whose answer is encoded as the response frame.

use crate::api::{Code, Status};
use crate::net::{fail, respond, Handler};
use crate::router::{hello_response, Router};
use crate::storage::Storage;
use ringpost_wire::frame::{FrameBuffer, FrameHeader};
use ringpost_wire::Command;
use std::net::SocketAddr;

/// `local`: the address the client reached the router at, for lookups' answers.
async fn dispatch<S: Storage>(
    router: &Router<S>,
    header: &FrameHeader,
    body: &[u8],
    local: Option<SocketAddr>,
) -> Result<FrameBuffer, Status> {
    let Some(command) = Command::from_u16(header.command) else {
        return Err(Status::new(Code::Unimplemented, format!("unknown command {}", header.command)));
    };
    Ok(match command {
        Command::Hello => hello_response(header),
        Command::CreateTopic => respond(header, &router.create_topic(body).await?),
        Command::GetTopic => respond(header, &router.get_topic(body)?),
        Command::ListTopics => respond(header, &router.list_topics(body)?),
        Command::DeleteTopic => respond(header, &router.delete_topic(body).await?),
        Command::LookupTopic => respond(header, &router.lookup_topic(body, local)?),
        Command::UpdateTopic => respond(header, &router.update_topic(body).await?),
        Command::CreateSubscription => respond(header, &router.create_subscription(body).await?),
        Command::GetSubscription => respond(header, &router.get_subscription(body)?),
        Command::ListSubscriptions => respond(header, &router.list_subscriptions(body)?),
        Command::DeleteSubscription => respond(header, &router.delete_subscription(body).await?),
        Command::LookupSubscription => respond(header, &router.lookup_subscription(body, local)?),
        Command::UpdateSubscription => respond(header, &router.update_subscription(body).await?),
        Command::Seek => respond(header, &router.seek(body).await?),
        Command::CreateSnapshot => respond(header, &router.create_snapshot(body).await?),
        Command::ListSnapshots => respond(header, &router.list_snapshots(body)?),
        Command::GetSnapshot => respond(header, &router.get_snapshot(body)?),
        Command::DeleteSnapshot => respond(header, &router.delete_snapshot(body).await?),
        Command::Stats => respond(header, &router.stats().await?),
        Command::ResyncDirectory => respond(header, &router.resync_directory(body).await?),
        Command::Publish
        | Command::Pull
        | Command::Acknowledge
        | Command::ModifyAckDeadline
        | Command::StreamingPull => {
            return Err(Status::new(
                Code::NotOwner,
                "data-plane commands go to a forwarder: look up the topic or subscription first",
            ))
        }
    })
}

impl<S: Storage> Handler for Router<S> {
    async fn handle(
        &self,
        header: FrameHeader,
        body: FrameBuffer,
        responder: &crate::net::Responder,
    ) -> crate::net::Response {
        let local = responder.local_address();
        dispatch(self, &header, &body, local)
            .await
            .unwrap_or_else(|status| fail(&header, &status.into()))
            .into()
    }
}
