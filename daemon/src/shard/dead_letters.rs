//! The shard's dead-letter publisher (`subscription::dead_letter::Publisher`): a dead-letter
//! topic may be served by this shard or by any other, so the publish is tried here first, then
//! on each other forwarder shard in turn, through a bounded shared channel to each, until the
//! shard serving the topic takes it; the others answer `NotOwner`. Dead letters are rare and
//! come in batches, so asking each shard is cheaper than keeping a copy of the placement here.
//! A publish is answered once durable in the dead-letter topic, as a client's is.

use super::Forwarder;
use crate::api::data::{DataError, DataPlane};
use crate::api::{Code, Status};
use crate::storage::Storage;
use crate::subscription::dead_letter::{DeadLetter, DeadLetters, LocalFuture, Publisher};
use crate::sync::{oneshot, Sender};
use glommio::channels::shared_channel::{ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};

/// Bound of each shard-to-shard dead-letter channel: a full one makes the publisher wait.
pub const DEAD_LETTER_CHANNEL_CAPACITY: usize = 16;

/// Dead letters sent to another shard to publish.
pub struct PeerPublish {
    pub request_id: u64,
    pub topic: Box<str>,
    pub messages: Vec<DeadLetter>,
}

/// The other shard's answer.
pub struct PeerReply {
    pub request_id: u64,
    pub result: Result<(), Status>,
}

/// One shard's ends of the dead-letter channels to and from every other forwarder shard: the
/// publishes it sends and their replies, the publishes it serves and its replies to them.
#[derive(Default)]
pub struct PeerChannels {
    pub publishes_out: Vec<SharedSender<PeerPublish>>,
    pub replies_in: Vec<SharedReceiver<PeerReply>>,
    pub publishes_in: Vec<SharedReceiver<PeerPublish>>,
    pub replies_out: Vec<SharedSender<PeerReply>>,
}

/// The channels between `shards` forwarder shards, each shard's ends at its index.
pub fn peer_channels(shards: usize) -> Vec<PeerChannels> {
    let mut channels: Vec<PeerChannels> = (0..shards).map(|_| PeerChannels::default()).collect();
    for from in 0..shards {
        for to in (0..shards).filter(|to| *to != from) {
            let (publish_sender, publish_receiver) =
                glommio::channels::shared_channel::new_bounded::<PeerPublish>(DEAD_LETTER_CHANNEL_CAPACITY);
            let (reply_sender, reply_receiver) =
                glommio::channels::shared_channel::new_bounded::<PeerReply>(DEAD_LETTER_CHANNEL_CAPACITY);
            channels[from].publishes_out.push(publish_sender);
            channels[from].replies_in.push(reply_receiver);
            channels[to].publishes_in.push(publish_receiver);
            channels[to].replies_out.push(reply_sender);
        }
    }
    channels
}

/// A publish this shard can make on its own topics.
pub trait LocalPublisher {
    fn publish_here(&self, dead_letters: DeadLetters) -> LocalFuture<'_, Result<(), DataError>>;
}

impl<S: Storage> LocalPublisher for Forwarder<S> {
    fn publish_here(&self, dead_letters: DeadLetters) -> LocalFuture<'_, Result<(), DataError>> {
        Box::pin(async move { self.publish(dead_letters).await.map(|_| ()) })
    }
}

/// This shard's link to another: publishes go out, replies come back by request id.
#[derive(Default)]
struct PeerLink {
    sender: RefCell<Option<Rc<ConnectedSender<PeerPublish>>>>,
    pending: RefCell<HashMap<u64, Sender<Result<(), Status>>>>,
    next_request: Cell<u64>,
}

impl PeerLink {
    async fn publish(&self, topic: Box<str>, messages: Vec<DeadLetter>) -> Result<(), Status> {
        let sender = self.sender.borrow().clone();
        let Some(sender) = sender else {
            return Err(Status::unavailable("the channel to another forwarder shard is not connected yet"));
        };
        let request_id = self.next_request.get();
        self.next_request.set(request_id + 1);
        let (reply, replied) = oneshot();
        self.pending.borrow_mut().insert(request_id, reply);
        if sender.send(PeerPublish { request_id, topic, messages }).await.is_err() {
            self.pending.borrow_mut().remove(&request_id);
            return Err(Status::unavailable("another forwarder shard stopped"));
        }
        replied.await.unwrap_or_else(|| Err(Status::unavailable("another forwarder shard stopped")))
    }

    async fn receive_replies(&self, replies: ConnectedReceiver<PeerReply>) {
        while let Some(reply) = replies.recv().await {
            if let Some(waiting) = self.pending.borrow_mut().remove(&reply.request_id) {
                waiting.send(reply.result);
            }
        }
        // The other shard is gone: whoever waits is answered `Unavailable` as its slot drops.
        self.pending.borrow_mut().clear();
    }
}

/// Where dead letters go whose topic no shard of this node serves: in a cluster, the node
/// that leads it (the network's part, `net::replica::RemoteDeadLetters`).
pub trait RemotePublisher {
    fn publish(&self, topic: Box<str>, messages: Vec<DeadLetter>) -> LocalFuture<'_, Result<(), Status>>;
}

/// Publishes dead letters on whichever forwarder shard serves their topic, of this node or,
/// in a cluster, of another.
#[derive(Default)]
pub struct ShardPublisher {
    local: RefCell<Option<Weak<dyn LocalPublisher>>>,
    peers: RefCell<Vec<Rc<PeerLink>>>,
    remote: RefCell<Option<Rc<dyn RemotePublisher>>>,
}

impl ShardPublisher {
    /// Dead letters no shard here takes go to `remote` (a node of a cluster).
    pub fn set_remote(&self, remote: Rc<dyn RemotePublisher>) {
        *self.remote.borrow_mut() = Some(remote);
    }

    /// Connects this shard's ends of the dead-letter channels, each in its own task (a
    /// connection waits for the other shard's end), and serves the publishes other shards send
    /// here on `local`.
    pub fn connect<S: Storage>(&self, local: &Rc<Forwarder<S>>, channels: PeerChannels) {
        let weak: Weak<Forwarder<S>> = Rc::downgrade(local);
        *self.local.borrow_mut() = Some(weak);
        for (publishes, replies) in channels.publishes_out.into_iter().zip(channels.replies_in) {
            let link = Rc::new(PeerLink::default());
            self.peers.borrow_mut().push(link.clone());
            crate::runtime::spawn(async move {
                *link.sender.borrow_mut() = Some(Rc::new(publishes.connect().await));
                link.receive_replies(replies.connect().await).await;
            })
            .detach();
        }
        for (publishes, replies) in channels.publishes_in.into_iter().zip(channels.replies_out) {
            let local = local.clone();
            crate::runtime::spawn(async move {
                let publishes = publishes.connect().await;
                let replies = Rc::new(replies.connect().await);
                while let Some(request) = publishes.recv().await {
                    let (local, replies) = (local.clone(), replies.clone());
                    crate::runtime::spawn(async move {
                        let dead_letters = DeadLetters { topic: request.topic, messages: request.messages };
                        // Mapped here: the reply crosses to another shard's thread, which a
                        // `Status` can and a `DataError` (holding this shard's `Rc`s) cannot.
                        let result = local.publish_here(dead_letters).await.map_err(Status::from);
                        let _ = replies.send(PeerReply { request_id: request.request_id, result }).await;
                    })
                    .detach();
                }
            })
            .detach();
        }
    }
}

impl Publisher for ShardPublisher {
    fn publish(&self, topic: Box<str>, messages: Vec<DeadLetter>) -> LocalFuture<'_, Result<(), Status>> {
        Box::pin(async move {
            let local = self.local.borrow().as_ref().and_then(Weak::upgrade);
            let Some(local) = local else {
                return Err(Status::unavailable("the shard's dead-letter publisher is not connected yet"));
            };
            let here = DeadLetters { topic: topic.clone(), messages: messages.clone() };
            match local.publish_here(here).await {
                Err(error) if error.is_not_owner() => {}
                result => return result.map_err(Status::from),
            }
            let peers: Vec<Rc<PeerLink>> = self.peers.borrow().clone();
            for peer in peers {
                match peer.publish(topic.clone(), messages.clone()).await {
                    Err(status) if status.code == Code::NotOwner => {}
                    result => return result,
                }
            }
            let remote = self.remote.borrow().clone();
            match remote {
                Some(remote) => remote.publish(topic, messages).await,
                None => {
                    Err(Status::not_found(format!("no forwarder shard serves dead-letter topic '{topic}'")))
                }
            }
        })
    }
}
