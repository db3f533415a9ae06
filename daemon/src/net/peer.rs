//! The cluster port: how one node's router reaches another's. The catalog's raft messages (and
//! the read index a starting node waits on) cross it as `PeerMessage` frames of the native
//! protocol, their bytes in the catalog's own encoding (`catalog::peer`).
//!
//! `PeerNetwork` is openraft's network: one connection per target and raft stream, opened on
//! first use, one request at a time on it (openraft sends a stream's requests one after the
//! other), dropped on any failure and opened again by the next request. `PeerHandler` answers
//! on the cluster port with the node's own raft.

use crate::api::cluster::{ClusterStatus, NodeStatus};
use crate::api::Status;
use crate::auth::{Access, Principal, CLUSTER_PRINCIPAL};
use crate::catalog::peer as codec;
use crate::catalog::raft::{CatalogMachine, CatalogRaft, Snapshot, Vote};
use crate::catalog::{CatalogEntry, NodeRecord};
use crate::codec::{Decoder, Encoder};
use crate::control::{decode_reply, encode_reply, ControlOk, ControlRequest};
use crate::dispatch::{Carried, Door, NodeTransport, Operation};
use crate::ids::{NodeId, ShardId, TopicId};
use crate::net::server::{fail, respond, Handler, Responder, Response, CLUSTER_HOSTS_MAX};
use crate::push::keys::{decode_push_key, encode_push_key, PushKey};
use crate::router::{PeerFuture, Peers, Router};
use crate::storage::Storage;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use ringpost_wire::frame::{access_body, decode_error, FrameBuffer, FrameHeader, FLAG_ERROR, FLAG_RESPONSE};
use ringpost_wire::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use ringpost_wire::messages::{AuthenticateRequest, PeerMessage};
use ringpost_wire::Command;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

/// How long a connection to a peer may take: less than an election timeout, so that a node
/// that is gone costs a candidate no more than one round.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a request waits for its answer when openraft gives no deadline of its own (the
/// read index, snapshots).
pub const PEER_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

type Raft<S> = openraft::Raft<CatalogRaft, CatalogMachine<S>>;

/// Where each member of the cluster is reached: as its registration in the catalog says (a
/// node added since the start is known only there), else as `--cluster` gave it. Looked up
/// at each connection, so a node added or moved is reached at its current address.
#[derive(Clone)]
pub struct PeerAddresses {
    given: Rc<BTreeMap<NodeId, SocketAddr>>,
    catalog: Rc<RefCell<Option<Rc<RefCell<crate::catalog::CatalogState>>>>>,
}

impl PeerAddresses {
    pub fn new(given: BTreeMap<NodeId, SocketAddr>) -> PeerAddresses {
        PeerAddresses { given: Rc::new(given), catalog: Rc::default() }
    }

    /// From now on, addresses come from `state`'s registrations first.
    pub fn learn_from(&self, state: Rc<RefCell<crate::catalog::CatalogState>>) {
        *self.catalog.borrow_mut() = Some(state);
    }

    pub fn get(&self, node: NodeId) -> Option<SocketAddr> {
        let catalog = self.catalog.borrow();
        let registered = catalog.as_ref().and_then(|state| {
            state.borrow().nodes.get(&node).and_then(|record| record.cluster_address.parse().ok())
        });
        registered.or_else(|| self.given.get(&node).copied())
    }
}

/// The hosts of the cluster's nodes: those `--cluster` names (`given`) and those of every node
/// the catalog registered (`nodes`: an `add-node`'s cluster address, then the node's own
/// registration), by their cluster addresses as `--cluster` names them; in order, without
/// repeats or unspecified addresses, at most `CLUSTER_HOSTS_MAX` (`--cluster` first).
pub fn cluster_hosts(
    given: &[std::net::IpAddr],
    nodes: &BTreeMap<NodeId, NodeRecord>,
) -> Vec<std::net::IpAddr> {
    let registered = nodes
        .values()
        .filter_map(|node| node.cluster_address.parse::<SocketAddr>().ok())
        .map(|address| address.ip());
    let mut hosts: Vec<std::net::IpAddr> = Vec::new();
    for host in given.iter().copied().chain(registered) {
        if !host.is_unspecified() && !hosts.contains(&host) && hosts.len() < CLUSTER_HOSTS_MAX {
            hosts.push(host);
        }
    }
    hosts
}

/// openraft's network over the cluster ports.
pub struct PeerNetwork {
    pub addresses: PeerAddresses,
    /// The cluster's secret, presented first on every connection to a peer.
    pub secret: Option<Rc<str>>,
    /// With TLS on the cluster ports: how a peer's certificate is verified (`--cluster-ca`).
    pub tls: PeerTls,
}

/// The client side of TLS on the cluster ports, when they take it.
pub type PeerTls = Option<std::sync::Arc<rustls::ClientConfig>>;

/// A connection to a peer's cluster port: plain, or in a TLS session.
trait PeerIo: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin {}
impl<T: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin> PeerIo for T {}

impl RaftNetworkFactory<CatalogRaft> for PeerNetwork {
    type Network = PeerClient;
    async fn new_client(&mut self, target: u64, _node: &openraft::EmptyNode) -> PeerClient {
        PeerClient::new(self.addresses.clone(), NodeId::new(target), self.secret.clone(), self.tls.clone())
    }
}

/// One connection to one peer, opened when first needed.
pub struct PeerClient {
    addresses: PeerAddresses,
    target: NodeId,
    secret: Option<Rc<str>>,
    tls: PeerTls,
    connection: Option<Box<dyn PeerIo>>,
    next_request: u64,
}

async fn within<T>(
    deadline: Duration,
    future: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    futures_lite::future::or(future, async {
        crate::runtime::sleep(deadline).await;
        Err(io::Error::new(io::ErrorKind::TimedOut, "the peer did not answer in time"))
    })
    .await
}

impl PeerClient {
    pub fn new(
        addresses: PeerAddresses,
        target: NodeId,
        secret: Option<Rc<str>>,
        tls: PeerTls,
    ) -> PeerClient {
        PeerClient { addresses, target, secret, tls, connection: None, next_request: 1 }
    }

    /// Sends `bytes` as `command` and returns the answer's bytes, within `deadline`.
    pub async fn call(
        &mut self,
        command: Command,
        bytes: Vec<u8>,
        deadline: Duration,
    ) -> io::Result<Vec<u8>> {
        let result = within(deadline, self.exchange(command, bytes)).await;
        if result.is_err() {
            // Whatever was half written or half read on it is lost with it.
            self.connection = None;
        }
        result
    }

    async fn exchange(&mut self, command: Command, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        if self.connection.is_none() {
            let address = self.addresses.get(self.target).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("node {} has no cluster address", self.target),
                )
            })?;
            let tls = self.tls.clone();
            let stream = within(PEER_CONNECT_TIMEOUT, async {
                let stream =
                    TcpStream::connect(address).await.map_err(|error| io::Error::other(error.to_string()))?;
                stream.set_nodelay(true).map_err(|error| io::Error::other(error.to_string()))?;
                let Some(config) = tls else { return Ok(Box::new(stream) as Box<dyn PeerIo>) };
                // The peer's certificate must name the address the others reach it at.
                let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
                let session = futures_rustls::TlsConnector::from(config)
                    .connect(name, stream)
                    .await
                    .map_err(|error| {
                        io::Error::new(
                            io::ErrorKind::ConnectionRefused,
                            format!("the TLS handshake failed: {error}"),
                        )
                    })?;
                Ok(Box::new(session) as Box<dyn PeerIo>)
            })
            .await?;
            self.connection = Some(stream);
            if let Some(secret) = self.secret.clone() {
                let request = AuthenticateRequest { token: secret.to_string() };
                self.send_and_receive(Command::Authenticate, &request).await?;
            }
        }
        let body = self.send_and_receive(command, &PeerMessage { bytes }).await?;
        let message = access_body::<PeerMessage>(&body)
            .map_err(|status| io::Error::new(io::ErrorKind::InvalidData, status.message.to_string()))?;
        Ok(message.bytes.as_slice().to_vec())
    }

    /// Sends one request on the open connection and reads its answer's body.
    async fn send_and_receive<T: ringpost_wire::frame::Body>(
        &mut self,
        command: Command,
        body: &T,
    ) -> io::Result<FrameBuffer> {
        let request_id = self.next_request;
        self.next_request += 1;
        let frame = ringpost_wire::encode_frame(command.code(), 0, request_id, body);
        let stream = self.connection.as_mut().expect("connected");
        stream.write_all(frame.as_ref()).await?;
        // A TLS session holds what it was given until flushed.
        stream.flush().await?;
        let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
        stream.read_exact(&mut header_bytes).await?;
        let header = FrameHeader::decode(&header_bytes)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, format!("{error:?}")))?;
        let length = header.body_length as usize;
        if length > FRAME_BODY_BYTES_MAX
            || header.request_id != request_id
            || header.flags & FLAG_RESPONSE == 0
        {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the peer answered out of turn"));
        }
        let mut body = FrameBuffer::with_capacity(length);
        body.resize(length, 0);
        stream.read_exact(&mut body).await?;
        if header.flags & FLAG_ERROR != 0 {
            let status = decode_error(&body);
            return Err(io::Error::other(format!("node {} refused: {}", self.target, status.message)));
        }
        Ok(body)
    }
}

fn unreachable(error: &io::Error) -> Unreachable<CatalogRaft> {
    Unreachable::new(error)
}

fn undecodable(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("the peer's answer did not decode: {why}"))
}

impl RaftNetworkV2<CatalogRaft> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<CatalogRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        let answer = self
            .call(Command::PeerAppendEntries, codec::encode_append(&request), option.hard_ttl())
            .await
            .map_err(|error| RPCError::Unreachable(unreachable(&error)))?;
        codec::decode_append_response(&answer)
            .map_err(|why| RPCError::Unreachable(unreachable(&undecodable(why))))
    }

    async fn vote(
        &mut self,
        request: VoteRequest<CatalogRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        let answer = self
            .call(Command::PeerVote, codec::encode_vote(&request), option.hard_ttl())
            .await
            .map_err(|error| RPCError::Unreachable(unreachable(&error)))?;
        codec::decode_vote_response(&answer)
            .map_err(|why| RPCError::Unreachable(unreachable(&undecodable(why))))
    }

    /// A refusal by the target (its vote changed meanwhile) or a node from before the command
    /// is reported unreachable: the voters then elect a leader once the old one's lease ends.
    async fn transfer_leader(
        &mut self,
        request: openraft::raft::TransferLeaderRequest<CatalogRaft>,
        option: RPCOption,
    ) -> Result<openraft::raft::TransferLeaderResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        self.call(Command::PeerTransferLeader, codec::encode_transfer_leader(&request), option.hard_ttl())
            .await
            .map_err(|error| RPCError::Unreachable(unreachable(&error)))?;
        Ok(Ok(()))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<CatalogRaft>, StreamingError<CatalogRaft>> {
        let answer = self
            .call(Command::PeerSnapshot, codec::encode_snapshot(&vote, &snapshot), PEER_REQUEST_TIMEOUT)
            .await
            .map_err(|error| StreamingError::Unreachable(unreachable(&error)))?;
        codec::decode_snapshot_response(&answer)
            .map_err(|why| StreamingError::Unreachable(unreachable(&undecodable(why))))
    }
}

/// Idle connections kept to each peer for the router's requests (forwarded changes, control
/// requests, registrations); more may be open while requests are in flight.
pub const PEER_IDLE_CONNECTIONS_MAX: usize = 4;

/// The router's requests to other nodes, over their cluster ports: the `Peers` the router
/// is given in a cluster.
pub struct PeerPool {
    addresses: PeerAddresses,
    secret: Option<Rc<str>>,
    tls: PeerTls,
    idle: RefCell<BTreeMap<NodeId, Vec<PeerClient>>>,
}

impl PeerPool {
    pub fn new(addresses: PeerAddresses, secret: Option<Rc<str>>, tls: PeerTls) -> Rc<PeerPool> {
        Rc::new(PeerPool { addresses, secret, tls, idle: RefCell::default() })
    }

    /// Node `node`'s push signing key, within `timeout`: refused by a node from before the
    /// request (as an unknown command), which the caller takes as no key from it.
    pub async fn push_key(&self, node: NodeId, timeout: Duration) -> Result<PushKey, Status> {
        let answer = self.call_within(node, Command::PeerPushKey, Vec::new(), timeout).await?;
        decode_push_key(&answer).map_err(|why| Status::internal(format!("node {node}'s push key: {why}")))
    }

    /// The read index of the catalog's leader, node `leader`.
    pub async fn read_index(&self, leader: NodeId) -> Result<Option<crate::catalog::raft::LogId>, String> {
        let answer = self.call(leader, Command::PeerReadIndex, Vec::new()).await;
        let answer = answer.map_err(|status| status.message.to_string())?;
        codec::decode_read_index(&answer).map_err(str::to_owned)
    }

    /// `bytes` as `command` to node `node`, on an idle connection or a new one.
    pub async fn call(&self, node: NodeId, command: Command, bytes: Vec<u8>) -> Result<Vec<u8>, Status> {
        self.call_within(node, command, bytes, PEER_REQUEST_TIMEOUT).await
    }

    /// `call`, waiting for the answer up to `timeout`.
    pub async fn call_within(
        &self,
        node: NodeId,
        command: Command,
        bytes: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, Status> {
        let idle = self.idle.borrow_mut().get_mut(&node).and_then(Vec::pop);
        let reused = idle.is_some();
        let fresh = || PeerClient::new(self.addresses.clone(), node, self.secret.clone(), self.tls.clone());
        let mut client = idle.unwrap_or_else(fresh);
        let mut answer = client.call(command, bytes.clone(), timeout).await;
        if reused && answer.as_ref().is_err_and(closed_by_peer) {
            // An idle connection to a node that restarted since: the process that held it is
            // gone, so the request was not taken. Once more, on a new connection.
            client = fresh();
            answer = client.call(command, bytes, timeout).await;
        }
        if answer.is_ok() {
            let mut idle = self.idle.borrow_mut();
            let kept = idle.entry(node).or_default();
            if kept.len() < PEER_IDLE_CONNECTIONS_MAX {
                kept.push(client);
            }
        }
        answer.map_err(|error| Status::unavailable(format!("node {node} did not answer: {error}")))
    }
}

/// Whether a request failed because the peer had closed the connection (it went away), as
/// opposed to a refusal, a timeout or an answer that did not decode.
fn closed_by_peer(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

impl Peers for Rc<PeerPool> {
    fn control(&self, shard: ShardId, request: ControlRequest) -> PeerFuture<ControlOk> {
        let pool = self.clone();
        Box::pin(async move {
            // The target's local shard: the node it goes to knows itself.
            let mut bytes = shard.local().to_le_bytes().to_vec();
            bytes.extend_from_slice(&request.encode());
            let node = shard.node();
            let answer = pool.call(node, Command::PeerControl, bytes).await?;
            decode_reply(&answer)
                .map_err(|why| Status::internal(format!("node {node}'s control reply: {why}")))?
        })
    }

    fn register(&self, leader: NodeId, node: NodeRecord) -> PeerFuture<()> {
        let pool = self.clone();
        Box::pin(async move {
            pool.call(leader, Command::PeerRegister, CatalogEntry::NodeRegistered(node).encode())
                .await
                .map(|_| ())
        })
    }

    fn want_elections(&self, leader: NodeId, topics: Vec<TopicId>) -> PeerFuture<()> {
        let pool = self.clone();
        Box::pin(async move {
            pool.call(leader, Command::PeerWantElections, encode_want_elections(&topics)).await.map(|_| ())
        })
    }

    fn expire_subscription(&self, leader: NodeId, name: String) -> PeerFuture<()> {
        let pool = self.clone();
        Box::pin(async move {
            pool.call(leader, Command::PeerExpireSubscription, name.into_bytes()).await.map(|_| ())
        })
    }

    fn cluster_status(&self, leader: NodeId) -> PeerFuture<ClusterStatus> {
        let pool = self.clone();
        Box::pin(async move {
            let answer = pool.call(leader, Command::PeerClusterStatus, Vec::new()).await?;
            decode_cluster_status(&answer)
                .map_err(|why| Status::internal(format!("node {leader}'s cluster status: {why}")))
        })
    }
}

/// The door's way to other nodes: an operation and its principal as a `PeerForward` on the
/// target's cluster port, answered by its door (`PeerHandler`).
impl NodeTransport for Rc<PeerPool> {
    fn carry(
        &self,
        node: NodeId,
        principal: &Principal,
        operation: &Operation,
        timeout: Duration,
    ) -> PeerFuture<Carried> {
        let pool = self.clone();
        let request = crate::dispatch::encode_carried(principal, operation);
        Box::pin(async move {
            let answer = pool.call_within(node, Command::PeerForward, request, timeout).await?;
            crate::dispatch::decode_answer(&answer)
                .map_err(|why| Status::internal(format!("node {node}'s answer did not decode: {why}")))
        })
    }
}

fn put_index(encoder: &mut Encoder, index: Option<u64>) {
    match index {
        Some(index) => encoder.bool(true).u64(index),
        None => encoder.bool(false),
    };
}

fn get_index(decoder: &mut Decoder) -> Result<Option<u64>, &'static str> {
    Ok(if decoder.bool()? { Some(decoder.u64()?) } else { None })
}

/// The topics whose leaders a node asks the catalog's leader to elect again.
pub fn encode_want_elections(topics: &[TopicId]) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    encoder.u32(topics.len() as u32);
    for topic in topics {
        encoder.u64(topic.get());
    }
    encoder.0
}

pub fn decode_want_elections(bytes: &[u8]) -> Result<Vec<TopicId>, &'static str> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let count = decoder.u32()? as usize;
    if count > crate::router::ELECTIONS_ASKED_MAX {
        return Err("more topics than ELECTIONS_ASKED_MAX");
    }
    let topics = (0..count).map(|_| decoder.u64().map(TopicId::new)).collect::<Result<Vec<_>, _>>()?;
    if !decoder.is_empty() {
        return Err("trailing bytes");
    }
    Ok(topics)
}

pub fn encode_cluster_status(status: &ClusterStatus) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    encoder.u64(status.node_id.get());
    put_index(&mut encoder, status.catalog_leader.map(NodeId::get));
    encoder.u64(status.term);
    put_index(&mut encoder, status.last_log_index);
    put_index(&mut encoder, status.last_applied_index);
    encoder.u32(status.nodes.len() as u32);
    for node in &status.nodes {
        encoder
            .u64(node.node_id.get())
            .str(&node.cluster_address)
            .str(&node.router_address)
            .bool(node.voter)
            .str(&node.role);
        put_index(&mut encoder, node.matched_index);
        put_index(&mut encoder, node.heard_ms_ago);
    }
    encoder.0
}

pub fn decode_cluster_status(bytes: &[u8]) -> Result<ClusterStatus, &'static str> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let mut status = ClusterStatus {
        node_id: NodeId::new(decoder.u64()?),
        catalog_leader: get_index(&mut decoder)?.map(NodeId::new),
        term: decoder.u64()?,
        last_log_index: get_index(&mut decoder)?,
        last_applied_index: get_index(&mut decoder)?,
        nodes: Vec::new(),
        // The asking node lists topics from its own applied catalog (`Router::topic_placements`).
        ..ClusterStatus::default()
    };
    let count = decoder.u32()?;
    if count as usize > crate::node::CLUSTER_VOTERS_MAX * 2 {
        return Err("more members than a cluster has");
    }
    for _ in 0..count {
        status.nodes.push(NodeStatus {
            node_id: NodeId::new(decoder.u64()?),
            cluster_address: decoder.str()?,
            router_address: decoder.str()?,
            voter: decoder.bool()?,
            role: decoder.str()?,
            matched_index: get_index(&mut decoder)?,
            heard_ms_ago: get_index(&mut decoder)?,
        });
    }
    if !decoder.is_empty() {
        return Err("trailing bytes");
    }
    Ok(status)
}

/// Answers peers on the cluster port: the catalog's raft at once, the router's requests once
/// the router is up (`set_door`); before, those are `Unavailable` and their senders retry.
pub struct PeerHandler<S: Storage> {
    pub raft: Raft<S>,
    door: RefCell<Option<Rc<Door<S>>>>,
    /// What principals may do here: the router's access file, read by this shard.
    access: Rc<Access>,
    /// Whether a peer must have presented the cluster's secret (`--cluster-secret-file`).
    secret_required: bool,
    /// Noted at each AppendEntries or snapshot a current leader sends: a follower's only sign
    /// that its leader still reaches it.
    leader_contact: Rc<crate::catalog::LeaderContact>,
    /// This node's push signing key, which the other nodes ask for to serve it too.
    push_key: PushKey,
}

impl<S: Storage> PeerHandler<S> {
    pub fn new(
        raft: Raft<S>,
        access: Rc<Access>,
        secret_required: bool,
        leader_contact: Rc<crate::catalog::LeaderContact>,
        push_key: PushKey,
    ) -> Rc<PeerHandler<S>> {
        Rc::new(PeerHandler {
            raft,
            door: RefCell::default(),
            access,
            secret_required,
            leader_contact,
            push_key,
        })
    }

    pub fn set_door(&self, door: Rc<Door<S>>) {
        *self.door.borrow_mut() = Some(door);
    }

    fn door(&self) -> Result<Rc<Door<S>>, Status> {
        self.door.borrow().clone().ok_or_else(|| Status::unavailable("this node's router is still starting"))
    }

    fn router(&self) -> Result<Rc<Router<S>>, Status> {
        Ok(self.door()?.router().clone())
    }
}

fn peer_message(header: &FrameHeader, bytes: Vec<u8>) -> Response {
    Response::Frame(respond(header, &PeerMessage { bytes }))
}

fn refuse(header: &FrameHeader, status: Status) -> Response {
    Response::Frame(fail(header, &status.into()))
}

impl<S: Storage> PeerHandler<S> {
    async fn answer(&self, command: Command, bytes: &[u8]) -> Result<Vec<u8>, Status> {
        let invalid = |why: &str| Status::invalid_argument(format!("the peer message did not decode: {why}"));
        let stopped =
            |error: &dyn std::fmt::Display| Status::unavailable(format!("this node's raft: {error}"));
        match command {
            Command::PeerAppendEntries => {
                let request = codec::decode_append(bytes).map_err(invalid)?;
                let answer = self.raft.append_entries(request).await.map_err(|error| stopped(&error))?;
                // A deposed leader's message (answered with the newer vote) is no contact.
                if !matches!(answer, openraft::raft::AppendEntriesResponse::HigherVote(_)) {
                    self.leader_contact.heard();
                }
                Ok(codec::encode_append_response(&answer))
            }
            Command::PeerVote => {
                let request = codec::decode_vote(bytes).map_err(invalid)?;
                let answer = self.raft.vote(request).await.map_err(|error| stopped(&error))?;
                Ok(codec::encode_vote_response(&answer))
            }
            Command::PeerTransferLeader => {
                let request = codec::decode_transfer_leader(bytes).map_err(invalid)?;
                match self.raft.handle_transfer_leader(request).await.map_err(|error| stopped(&error))? {
                    Ok(()) => Ok(Vec::new()),
                    Err(refused) => Err(Status::failed_precondition(refused.to_string())),
                }
            }
            Command::PeerSnapshot => {
                let (vote, snapshot) = codec::decode_snapshot(bytes).map_err(invalid)?;
                let answer =
                    self.raft.install_full_snapshot(vote, snapshot).await.map_err(|error| stopped(&error))?;
                self.leader_contact.heard();
                Ok(codec::encode_snapshot_response(&answer))
            }
            Command::PeerReadIndex => {
                let read = self
                    .raft
                    .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)
                    .await
                    .map_err(|error| stopped(&error))?;
                Ok(codec::encode_read_index(&Some(*read.log_id())))
            }
            Command::PeerControl => {
                let router = self.router()?;
                let (shard, request) = bytes.split_at_checked(4).ok_or_else(|| invalid("no shard"))?;
                let shard = u32::from_le_bytes(shard.try_into().expect("four bytes"));
                let request = ControlRequest::decode(request).map_err(|why| invalid(&why))?;
                Ok(encode_reply(&router.local_control(shard, request).await))
            }
            Command::PeerRegister => {
                let router = self.router()?;
                let CatalogEntry::NodeRegistered(node) = CatalogEntry::decode(bytes).map_err(invalid)? else {
                    return Err(invalid("not a registration"));
                };
                router.register(node).await?;
                Ok(Vec::new())
            }
            // Answered from the start: the key is the node's from before its router serves.
            Command::PeerPushKey => Ok(encode_push_key(&self.push_key)),
            Command::PeerClusterStatus => Ok(encode_cluster_status(&self.router()?.cluster_status().await)),
            Command::PeerWantElections => {
                let router = self.router()?;
                let topics = decode_want_elections(bytes).map_err(invalid)?;
                router.want_elections(topics).await?;
                Ok(Vec::new())
            }
            Command::PeerExpireSubscription => {
                let router = self.router()?;
                let name = std::str::from_utf8(bytes).map_err(|_| invalid("a name that is not UTF-8"))?;
                router.delete_subscription(name).await?;
                Ok(Vec::new())
            }
            Command::PeerForward => {
                let door = self.door()?;
                let (principal, operation) =
                    crate::dispatch::decode_carried(bytes).map_err(|why| invalid(&why))?;
                // The sending node authenticated the client; this node decides what the
                // principal may do, with its own access file.
                Ok(crate::dispatch::encode_answer(
                    &door.execute_carried(&self.access, principal, operation).await,
                ))
            }
            _ => Err(Status::invalid_argument(format!("{command:?} is not served on the cluster port"))),
        }
    }
}

impl<S: Storage> Handler for PeerHandler<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response {
        if self.secret_required
            && !matches!(&responder.session().principal, Principal::Named(name) if &**name == CLUSTER_PRINCIPAL)
        {
            let status = Status::new(
                crate::api::Code::Unauthenticated,
                "the cluster port answers only nodes that present the cluster's secret",
            );
            return refuse(&header, status);
        }
        let Some(command) = Command::from_u16(header.command) else {
            return refuse(&header, Status::invalid_argument(format!("unknown command {}", header.command)));
        };
        let message = match access_body::<PeerMessage>(&body) {
            Ok(message) => message,
            Err(status) => {
                return Response::Frame(ringpost_wire::encode_error(
                    header.command,
                    header.request_id,
                    &status,
                ))
            }
        };
        match self.answer(command, message.bytes.as_slice()).await {
            Ok(bytes) => peer_message(&header, bytes),
            Err(status) => refuse(&header, status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hosts follow the registrations: a node added at a new address brings its host, one
    /// removed takes its host away unless `--cluster` names it; its other addresses (where
    /// clients reach it) are not hosts of the cluster's nodes.
    #[test]
    fn the_cluster_hosts_follow_the_registrations() {
        let host = |text: &str| -> std::net::IpAddr { text.parse().unwrap() };
        let given = [host("10.0.0.1"), host("10.0.0.2"), host("0.0.0.0")];
        let mut nodes = BTreeMap::new();
        assert_eq!(cluster_hosts(&given, &nodes), [host("10.0.0.1"), host("10.0.0.2")]);
        nodes.insert(NodeId::new(1), NodeRecord::admitted(NodeId::new(1), "10.0.0.1:7460".into()));
        nodes.insert(NodeId::new(4), NodeRecord::admitted(NodeId::new(4), "10.0.0.4:7460".into()));
        assert_eq!(cluster_hosts(&given, &nodes), [host("10.0.0.1"), host("10.0.0.2"), host("10.0.0.4")]);
        let registered = NodeRecord {
            router_address: "192.0.2.4:7450".into(),
            forwarders: vec!["192.0.2.4:7451".into()],
            grpc_address: "192.0.2.4:8085".into(),
            ..NodeRecord::admitted(NodeId::new(4), "[fd00::4]:7460".into())
        };
        nodes.insert(NodeId::new(4), registered);
        assert_eq!(cluster_hosts(&given, &nodes), [host("10.0.0.1"), host("10.0.0.2"), host("fd00::4")]);
        nodes.remove(&NodeId::new(4));
        assert_eq!(cluster_hosts(&given, &nodes), [host("10.0.0.1"), host("10.0.0.2")]);
        let many: BTreeMap<NodeId, NodeRecord> = (0..2000u64)
            .map(|id| {
                (
                    NodeId::new(id),
                    NodeRecord::admitted(NodeId::new(id), format!("10.1.{}.{}:7460", id / 256, id % 256)),
                )
            })
            .collect();
        assert_eq!(cluster_hosts(&given, &many).len(), CLUSTER_HOSTS_MAX);
    }

    #[test]
    fn a_cluster_status_decodes_to_what_was_encoded_and_a_cut_is_refused() {
        let status = ClusterStatus {
            node_id: NodeId::new(2),
            catalog_leader: Some(NodeId::new(3)),
            term: 7,
            last_log_index: Some(40),
            last_applied_index: None,
            nodes: vec![NodeStatus {
                node_id: NodeId::new(1),
                cluster_address: "10.0.0.1:7460".into(),
                router_address: "10.0.0.1:7450".into(),
                voter: true,
                role: "follower".into(),
                matched_index: Some(39),
                heard_ms_ago: Some(250),
            }],
            ..ClusterStatus::default()
        };
        let encoded = encode_cluster_status(&status);
        assert_eq!(decode_cluster_status(&encoded), Ok(status));
        for cut in 0..encoded.len() {
            assert!(decode_cluster_status(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
        }
    }
}
