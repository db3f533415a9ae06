//! The cluster port: how one node's router reaches another's. The catalog's raft messages (and
//! the read index a starting node waits on) cross it as `PeerMessage` frames of the native
//! protocol, their bytes in the catalog's own encoding (`catalog::peer`).
//!
//! `PeerNetwork` is openraft's network: one connection per target and raft stream, opened on
//! first use, one request at a time on it (openraft sends a stream's requests one after the
//! other), dropped on any failure and opened again by the next request. `PeerHandler` answers
//! on the cluster port with the node's own raft.

use crate::api::Status;
use crate::catalog::peer as codec;
use crate::catalog::raft::{CatalogMachine, CatalogRaft, Snapshot, Vote};
use crate::protocol::native::server::{fail, respond, Handler, Responder, Response};
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
use ringpost_wire::messages::PeerMessage;
use ringpost_wire::Command;
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

/// Every voter's cluster address, by node id.
#[derive(Clone, Debug)]
pub struct PeerAddresses(pub Rc<BTreeMap<u64, SocketAddr>>);

/// openraft's network over the cluster ports.
pub struct PeerNetwork {
    pub addresses: PeerAddresses,
}

impl RaftNetworkFactory<CatalogRaft> for PeerNetwork {
    type Network = PeerClient;
    async fn new_client(&mut self, target: u64, _node: &openraft::EmptyNode) -> PeerClient {
        PeerClient::new(self.addresses.0.get(&target).copied(), target)
    }
}

/// One connection to one peer, opened when first needed.
pub struct PeerClient {
    address: Option<SocketAddr>,
    target: u64,
    connection: Option<TcpStream>,
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
    pub fn new(address: Option<SocketAddr>, target: u64) -> PeerClient {
        PeerClient { address, target, connection: None, next_request: 1 }
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
        let address = self.address.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("node {} has no cluster address", self.target))
        })?;
        if self.connection.is_none() {
            let stream = within(PEER_CONNECT_TIMEOUT, async {
                TcpStream::connect(address).await.map_err(|error| io::Error::other(error.to_string()))
            })
            .await?;
            stream.set_nodelay(true).map_err(|error| io::Error::other(error.to_string()))?;
            self.connection = Some(stream);
        }
        let request_id = self.next_request;
        self.next_request += 1;
        let frame = ringpost_wire::encode_frame(command.code(), 0, request_id, &PeerMessage { bytes });
        let stream = self.connection.as_mut().expect("connected above");
        stream.write_all(frame.as_ref()).await?;
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
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await?;
        if header.flags & FLAG_ERROR != 0 {
            let status = decode_error(&body);
            return Err(io::Error::other(format!("node {} refused: {}", self.target, status.message)));
        }
        let message = access_body::<PeerMessage>(&body)
            .map_err(|status| io::Error::new(io::ErrorKind::InvalidData, status.message.to_string()))?;
        Ok(message.bytes.as_slice().to_vec())
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

/// Answers peers on the cluster port with this node's raft.
pub struct PeerHandler<S: Storage> {
    pub raft: Raft<S>,
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
                Ok(codec::encode_append_response(&answer))
            }
            Command::PeerVote => {
                let request = codec::decode_vote(bytes).map_err(invalid)?;
                let answer = self.raft.vote(request).await.map_err(|error| stopped(&error))?;
                Ok(codec::encode_vote_response(&answer))
            }
            Command::PeerSnapshot => {
                let (vote, snapshot) = codec::decode_snapshot(bytes).map_err(invalid)?;
                let answer =
                    self.raft.install_full_snapshot(vote, snapshot).await.map_err(|error| stopped(&error))?;
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
            _ => Err(Status::invalid_argument(format!("{command:?} is not served on the cluster port"))),
        }
    }
}

impl<S: Storage> Handler for PeerHandler<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, _responder: &Responder) -> Response {
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
