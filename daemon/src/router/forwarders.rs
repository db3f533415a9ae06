//! How the router reaches its forwarders (`ForwarderLink`, a control channel or a local call)
//! and where it tells clients they are (`ForwarderAddresses`).

use super::*;
use crate::ids::{ShardId, TopicId};

/// How the router reaches one forwarder. In the daemon, the forwarder runs on its own shard,
/// reached through a bounded shared channel; in a simulation of a whole node, it runs on the
/// router's executor and is called directly, so that one seeded executor runs both.
pub struct ForwarderLink(Link);

/// A forwarder's `control`, called on the router's executor (see `ForwarderLink::local`).
pub type LocalControl = Box<
    dyn Fn(ControlRequest) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<ControlOk, Status>>>>,
>;

pub(super) enum Link {
    Channel {
        sender: ConnectedSender<ControlEnvelope>,
        waiting: RefCell<HashMap<u64, Sender<Result<ControlOk, Status>>>>,
        next_request: Cell<u64>,
    },
    Local(LocalControl),
}

impl ForwarderLink {
    pub fn new(sender: ConnectedSender<ControlEnvelope>) -> Rc<ForwarderLink> {
        Rc::new(ForwarderLink(Link::Channel {
            sender,
            waiting: RefCell::default(),
            next_request: Cell::new(1),
        }))
    }

    /// A link to a forwarder on this executor: each request is `control(request)`, awaited by
    /// the caller as a reply from another shard would be.
    pub fn local(control: LocalControl) -> Rc<ForwarderLink> {
        Rc::new(ForwarderLink(Link::Local(control)))
    }

    /// Delivers replies to the requests waiting for them; runs for the life of the router. A
    /// local link has no replies to deliver.
    pub async fn receive_replies(self: Rc<Self>, replies: ConnectedReceiver<ControlReply>) {
        let Link::Channel { waiting, .. } = &self.0 else { return };
        while let Some(reply) = replies.recv().await {
            if let Some(waiter) = waiting.borrow_mut().remove(&reply.request_id) {
                waiter.send(reply.result);
            }
        }
    }

    /// The forwarder's answer as its control channel carries it (`ControlReply`), or why it
    /// could not be asked.
    pub(super) async fn call(&self, request: ControlRequest) -> Result<ControlOk, Status> {
        let (sender, waiting, next_request) = match &self.0 {
            Link::Channel { sender, waiting, next_request } => (sender, waiting, next_request),
            Link::Local(control) => return control(request).await,
        };
        let request_id = next_request.get();
        next_request.set(request_id + 1);
        let (reply, receiver) = oneshot();
        waiting.borrow_mut().insert(request_id, reply);
        if sender.send(ControlEnvelope { request_id, request }).await.is_err() {
            waiting.borrow_mut().remove(&request_id);
            return Err(Status::unavailable("the forwarder shard is gone"));
        }
        receiver.await.unwrap_or_else(|| Err(Status::unavailable("the forwarder shard did not answer")))
    }
}

/// Where the router tells clients the forwarders are.
pub enum Advertise {
    /// At this host (a name or an address), on each forwarder's port.
    Host(String),
    /// At the address the client reached the router at: the daemon listens on every address,
    /// and the one a client could reach is the one it used.
    ConnectionAddress,
}

/// The forwarders' ports and how their addresses are advertised.
pub struct ForwarderAddresses {
    ports: Vec<u16>,
    /// Every forwarder's address, when they do not depend on the client's connection.
    fixed: Option<Vec<String>>,
}

impl ForwarderAddresses {
    pub fn new(ports: Vec<u16>, advertise: Advertise) -> ForwarderAddresses {
        let fixed = match advertise {
            Advertise::Host(host) => {
                Some(ports.iter().map(|port| crate::host_and_port(&host, *port)).collect())
            }
            Advertise::ConnectionAddress => None,
        };
        ForwarderAddresses { ports, fixed }
    }

    /// Shard `shard`'s address for a client that reached the router at `local`.
    pub(super) fn address(&self, shard: usize, local: Option<SocketAddr>) -> String {
        match (&self.fixed, local) {
            (Some(fixed), _) => fixed[shard].clone(),
            (None, Some(local)) => SocketAddr::new(local.ip(), self.ports[shard]).to_string(),
            // No connection (a handler called directly): the loopback address reaches it here.
            (None, None) => {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), self.ports[shard]).to_string()
            }
        }
    }
}

impl<S: Storage> Router<S> {
    /// The forwarder shard a unit (a topic, or one of its later sources) is placed on, naming
    /// its node.
    pub(super) fn shard_of(&self, topic_id: TopicId) -> Option<ShardId> {
        let state = self.state.borrow();
        // A unit is a topic's own log or one of its later sources (a topic has few: a scan).
        let source =
            || state.sources.values().find(|source| source.id == topic_id).map(|source| source.shard);
        state
            .topic_by_id(topic_id)
            .map(|topic| topic.shard)
            .or_else(source)
            .filter(|shard| *shard != crate::catalog::entry::SHARD_UNPLACED)
    }

    /// Runs `request` on forwarder `shard`: through its channel on this node, through its
    /// node's cluster port on another.
    /// An attach or a promotion of a unit whose topic has a schema is followed by its schema
    /// (`push_unit_schema`), so that a unit never serves its topic's publishes unchecked, however
    /// it came to be attached (a creation, recovery, placement, a move, a later source, an
    /// election).
    pub(super) async fn call_forwarder(
        &self,
        shard: ShardId,
        request: ControlRequest,
    ) -> Result<ControlOk, ControlError> {
        let attached = match &request {
            ControlRequest::AttachTopic { topic_id, .. }
            | ControlRequest::AttachReplica { topic_id, .. }
            | ControlRequest::PromoteReplica { topic_id, .. } => Some(*topic_id),
            _ => None,
        };
        let ok = self.call_forwarder_only(shard, request).await?;
        if let Some(unit) = attached {
            self.push_unit_schema(shard, unit).await?;
        }
        Ok(ok)
    }

    /// Runs `request` on forwarder `shard`, and nothing else.
    pub(super) async fn call_forwarder_only(
        &self,
        shard: ShardId,
        request: ControlRequest,
    ) -> Result<ControlOk, ControlError> {
        let (node, local) = (shard.node(), shard.local());
        if node == self.node_id() {
            let link = self.forwarders.get(local as usize).ok_or_else(|| {
                ControlError::unavailable(format!("this node has no forwarder shard {local}"))
            })?;
            return Ok(link.call(request).await?);
        }
        let peers = self.peers.as_ref().ok_or_else(|| {
            ControlError::unavailable(format!("node {node} is not reachable: this node has no peers"))
        })?;
        Ok(peers.control(shard, request).await?)
    }

    /// Runs a control request from the catalog's leader on one of this node's forwarders. Its
    /// answer goes back to that node as a `Status` (`net::peer`), so it is one here.
    pub async fn local_control(&self, local: u32, request: ControlRequest) -> Result<ControlOk, Status> {
        // The leader follows its attaches with their schemas itself.
        Ok(self.call_forwarder_only(ShardId::new(self.node_id(), local), request).await?)
    }
}

#[cfg(test)]
mod advertise_tests {
    use super::*;

    #[test]
    fn forwarders_are_advertised_at_the_host_given_or_where_the_client_reached_the_router() {
        let fixed = ForwarderAddresses::new(vec![7451, 7452], Advertise::Host("node-1.example".into()));
        let reached: SocketAddr = "10.1.2.3:7450".parse().unwrap();
        assert_eq!(fixed.address(1, Some(reached)), "node-1.example:7452");
        let literal = ForwarderAddresses::new(vec![7451], Advertise::Host("::1".into()));
        assert_eq!(literal.address(0, None), "[::1]:7451");
        let connection = ForwarderAddresses::new(vec![7451, 7452], Advertise::ConnectionAddress);
        assert_eq!(connection.address(0, Some(reached)), "10.1.2.3:7451");
        let reached_v6: SocketAddr = "[fe80::1]:7450".parse().unwrap();
        assert_eq!(connection.address(1, Some(reached_v6)), "[fe80::1]:7452");
    }
}
