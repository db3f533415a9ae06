//! The catalog on openraft: its type configuration, the state machine (the catalog state,
//! changed only by `CatalogState::apply`), and the network of a single voter (there is no one
//! to talk to yet).

use super::entry::CatalogEntry;
use super::state::{Applied, CatalogState};
use super::store::SnapshotLog;
use crate::storage::Storage;
use futures_lite::StreamExt;
use openraft::error::{RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;

openraft::declare_raft_types!(
    /// The catalog's raft: decided catalog entries in, what applying them did out.
    pub CatalogRaft:
        D = CatalogEntry,
        R = Applied,
        Node = openraft::EmptyNode,
        AsyncRuntime = super::rt::ShardRuntime,
);

pub type LogId = openraft::type_config::alias::LogIdOf<CatalogRaft>;
pub type Vote = openraft::type_config::alias::VoteOf<CatalogRaft>;
pub type Entry = openraft::type_config::alias::EntryOf<CatalogRaft>;
pub type Membership = openraft::Membership<u64, openraft::EmptyNode>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<CatalogRaft>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<CatalogRaft>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<CatalogRaft, Vec<u8>>;

/// This node's id in the catalog's raft (a `--node-id` comes with clusters).
pub const NODE_ID: u64 = 1;

/// The state machine: the catalog state, shared with the router shard that reads it.
pub struct CatalogMachine<S: Storage> {
    pub state: Rc<RefCell<CatalogState>>,
    applied: Rc<Cell<Option<LogId>>>,
    membership: Rc<RefCell<StoredMembership>>,
    snapshots: Rc<SnapshotLog<S>>,
    /// Changes of the membership applied from now on are logged (a node added, promoted,
    /// removed): set once the catalog is ready, so a start's replay of old ones is not.
    pub log_members: Rc<Cell<bool>>,
}

impl<S: Storage> Clone for CatalogMachine<S> {
    fn clone(&self) -> Self {
        CatalogMachine {
            state: self.state.clone(),
            applied: self.applied.clone(),
            membership: self.membership.clone(),
            snapshots: self.snapshots.clone(),
            log_members: self.log_members.clone(),
        }
    }
}

/// Each member of `membership`, and whether it votes (in any of a joint change's configs).
fn members_of(membership: &Membership) -> std::collections::BTreeMap<crate::ids::NodeId, bool> {
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    membership.nodes().map(|(id, _)| (crate::ids::NodeId::new(*id), voters.contains(id))).collect()
}

fn io_error(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(error.to_string())
}

impl<S: Storage> CatalogMachine<S> {
    pub fn new(state: CatalogState, snapshots: Rc<SnapshotLog<S>>) -> CatalogMachine<S> {
        CatalogMachine {
            state: Rc::new(RefCell::new(state)),
            applied: Rc::default(),
            membership: Rc::default(),
            snapshots,
            log_members: Rc::default(),
        }
    }

    /// The index of the last entry applied to the state, as soon as it is (openraft's metrics
    /// say so later).
    pub fn applied_index(&self) -> Option<u64> {
        self.applied.get().map(|applied| applied.index)
    }

    /// Encodes the state as of the last applied entry and stores it durably.
    pub async fn store_snapshot(&self) -> io::Result<Snapshot> {
        let meta = SnapshotMeta {
            last_log_id: self.applied.get(),
            last_membership: self.membership.borrow().clone(),
        };
        let data = self.state.borrow().encode();
        self.snapshots.write(&meta, &data).await.map_err(io_error)?;
        Ok(Snapshot { meta, snapshot: data })
    }
}

impl<S: Storage> RaftSnapshotBuilder<CatalogRaft> for CatalogMachine<S> {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        self.store_snapshot().await
    }
}

impl<S: Storage> RaftStateMachine<CatalogRaft> for CatalogMachine<S> {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = CatalogMachine<S>;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.applied.get(), self.membership.borrow().clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures_lite::Stream<Item = Result<EntryResponder<CatalogRaft>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some(next) = entries.next().await {
            let (entry, responder) = next?;
            self.applied.set(Some(entry.log_id));
            let applied = match entry.payload {
                EntryPayload::Blank => Applied::Done,
                EntryPayload::Normal(command) => self.state.borrow_mut().apply(command),
                EntryPayload::Membership(membership) => {
                    if self.log_members.get() {
                        let before = members_of(self.membership.borrow().membership());
                        for change in super::standing::member_changes(&before, &members_of(&membership)) {
                            crate::log_info!("ringpostd: {}", change.line);
                        }
                    }
                    *self.membership.borrow_mut() = StoredMembership::new(Some(entry.log_id), membership);
                    Applied::Done
                }
            };
            if let Some(responder) = responder {
                responder.send(applied);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> CatalogMachine<S> {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Vec<u8>) -> Result<(), io::Error> {
        let state = CatalogState::decode(&snapshot).map_err(io_error)?;
        let stored = self.snapshots.read().await.map_err(io_error)?;
        if stored.is_none_or(|(stored, _)| stored.last_log_id != meta.last_log_id) {
            self.snapshots.write(meta, &snapshot).await.map_err(io_error)?;
        }
        *self.state.borrow_mut() = state;
        self.applied.set(meta.last_log_id);
        *self.membership.borrow_mut() = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let stored = self.snapshots.read().await.map_err(io_error)?;
        Ok(stored.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

/// The network of a single voter: no peer, so no call is ever made; each would fail.
pub struct NoPeers;

fn unreachable() -> Unreachable<CatalogRaft> {
    Unreachable::new(&io::Error::other("this catalog has a single voter and no peers"))
}

impl RaftNetworkFactory<CatalogRaft> for NoPeers {
    type Network = NoPeers;
    async fn new_client(&mut self, _target: u64, _node: &openraft::EmptyNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetworkV2<CatalogRaft> for NoPeers {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        _request: AppendEntriesRequest<CatalogRaft>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn vote(
        &mut self,
        _request: VoteRequest<CatalogRaft>,
        _option: RPCOption,
    ) -> Result<VoteResponse<CatalogRaft>, RPCError<CatalogRaft>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<CatalogRaft>, StreamingError<CatalogRaft>> {
        Err(StreamingError::Unreachable(unreachable()))
    }
}
