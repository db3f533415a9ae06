//! Replication between forwarders of different nodes over the native protocol: a source's
//! leader reaches each follower's forwarder port directly, so a publish's path crosses no
//! other core. One connection per shard and follower forwarder carries the requests of every
//! topic they share, pipelined and written together (batched per pair), each a `Replica`
//! frame whose `PeerMessage` body holds `replication::protocol`'s encoding. The connection
//! presents the cluster's secret first (inside TLS when the forwarders' ports take it,
//! `--cluster-ca`); it is dropped on any failure and made again by the next request.

use crate::api::{Code, Status};
use crate::replication::protocol::{ReplicaAnswer, ReplicaRequest};
use crate::replication::source::{AnswerFuture, Peer, Transport};
use crate::sync::{oneshot, Notify, Sender};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use ringpost_wire::frame::{access_body, decode_error, FrameBuffer, FrameHeader, FLAG_ERROR, FLAG_RESPONSE};
use ringpost_wire::limits::{FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use ringpost_wire::messages::{ArchivedPeerMessage, AuthenticateRequest, PeerMessage};
use ringpost_wire::Command;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

/// What a replica request's frame adds to its encoded bytes: the frame's header and the
/// archived `PeerMessage` around them (a relative pointer, a length, alignment).
const PEER_MESSAGE_OVERHEAD_BYTES: usize = FRAME_HEADER_BYTES + 64;
/// Frames queued for a peer that are joined into one write; larger ones are written from their
/// own buffers, whose copy would cost more than the system call it saves.
const JOIN_FRAME_BYTES_MAX: usize = 64 * 1024;

/// How long connecting to another node's forwarder may take.
pub const REPLICA_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a request waits for its answer (a follower's commit included).
pub const REPLICA_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests one connection has waiting for answers; one more waits for room.
pub const REPLICA_REQUESTS_IN_FLIGHT_MAX: usize = 4096;
/// Bytes of requests one connection has queued or in flight; one more waits for room (one
/// larger than it goes alone).
pub const REPLICA_BYTES_IN_FLIGHT_MAX: usize = 64 << 20;

/// A shard's connections to the forwarders it replicates to, by address.
pub struct NativeTransport {
    secret: Option<Rc<str>>,
    /// TLS to the other forwarders, when their ports take it.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    channels: RefCell<HashMap<String, Rc<Channel>>>,
}

impl NativeTransport {
    pub fn new(
        secret: Option<Rc<str>>,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Rc<NativeTransport> {
        Rc::new(NativeTransport { secret, tls, channels: RefCell::default() })
    }

    fn channel(self: &Rc<Self>, address: &str) -> Rc<Channel> {
        if let Some(channel) = self.channels.borrow().get(address).filter(|channel| !channel.broken.get()) {
            return channel.clone();
        }
        let channel = Rc::new(Channel {
            queue: RefCell::default(),
            in_flight_bytes: Cell::new(0),
            waiting: RefCell::default(),
            next_request: Cell::new(2),
            wake_writer: Notify::new(),
            room: Notify::new(),
            broken: Cell::new(false),
        });
        self.channels.borrow_mut().insert(address.to_owned(), channel.clone());
        let (transport, address, opened) = (self.clone(), address.to_owned(), channel.clone());
        crate::runtime::spawn(async move {
            let why = opened.run(&address, transport.secret.clone(), transport.tls.clone()).await;
            opened.fail(&format!("the connection to {address} failed: {why}"));
            let mut channels = transport.channels.borrow_mut();
            if channels.get(&address).is_some_and(|current| Rc::ptr_eq(current, &opened)) {
                channels.remove(&address);
            }
        })
        .detach();
        channel
    }
}

impl NativeTransport {
    /// One request of the native protocol's own (`command`, `body`) to the port at `address`,
    /// on the connection replication uses, its answer decoded as `Resp`.
    pub async fn request<Req: ringpost_wire::frame::Body, Resp>(
        self: &Rc<Self>,
        address: &str,
        command: Command,
        body: &Req,
    ) -> Result<Resp, Status>
    where
        Resp: rkyv::Archive,
        Resp::Archived: rkyv::Portable
            + for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
            + rkyv::Deserialize<Resp, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    {
        let channel = self.channel(address);
        let body = channel
            .call(|request_id| ringpost_wire::encode_frame(command.code(), 0, request_id, body))
            .await?;
        ringpost_wire::frame::decode_body::<Resp>(&body).map_err(Status::from)
    }
}

impl NativeTransport {
    /// Carries a request's body as it is (`command`, `flags`) to the port at `address`, on the
    /// connection replication uses; its answer's body as it came, or the status it failed with.
    /// `wait`: how long the request may be held by design (a pull's), beyond
    /// `REPLICA_REQUEST_TIMEOUT`.
    pub async fn carry(
        self: &Rc<Self>,
        address: &str,
        command: u16,
        flags: u16,
        body: &[u8],
        wait: Duration,
    ) -> Result<FrameBuffer, Status> {
        self.channel(address)
            .call_within(
                |request_id| frame_with_body(command, flags, request_id, body),
                REPLICA_REQUEST_TIMEOUT + wait,
            )
            .await
    }

    /// The cluster's secret, which a connection presents first.
    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    /// TLS to the other nodes' ports, when they take it.
    pub fn tls(&self) -> Option<std::sync::Arc<rustls::ClientConfig>> {
        self.tls.clone()
    }
}

impl Transport for Rc<NativeTransport> {
    fn call(&self, peer: &Peer, request: ReplicaRequest) -> AnswerFuture {
        let channel = self.channel(&peer.address);
        let shard = peer.shard;
        Box::pin(async move {
            // An append is written into its frame from the batches its chunks hold; any other
            // request is small, and encoded first.
            let body = match request {
                ReplicaRequest::Append { .. } => RequestBody::Append(request),
                other => RequestBody::Encoded(PeerMessage { bytes: other.encode() }),
            };
            // Sized for the records it carries, so that they are copied into it once.
            let capacity = body.bytes() + PEER_MESSAGE_OVERHEAD_BYTES;
            let code = Command::Replica.code();
            let encode = move |request_id| match &body {
                RequestBody::Append(request) => {
                    ringpost_wire::encode_frame_sized(code, 0, request_id, &AppendMessage(request), capacity)
                }
                RequestBody::Encoded(message) => {
                    ringpost_wire::encode_frame_sized(code, 0, request_id, message, capacity)
                }
            };
            let answer = channel.call(encode).await.and_then(|body| {
                access_body::<PeerMessage>(&body)
                    .map(|message| message.bytes.as_slice().to_vec())
                    .map_err(Status::from)
            });
            let bytes = answer.map_err(|status| {
                Status::new(status.code, format!("the replica on {shard}: {}", status.message))
            })?;
            ReplicaAnswer::decode(&bytes).map_err(|why| {
                Status::new(
                    Code::Internal,
                    format!("the replica on {shard} answered what did not decode: {why}"),
                )
            })
        })
    }
}

/// Where a request's answer goes: its body, or the status it failed with.
type AnswerSender = Sender<Result<FrameBuffer, Status>>;

/// One connection: frames queued for its writer, and the requests waiting for answers.
struct Channel {
    queue: RefCell<VecDeque<FrameBuffer>>,
    /// Bytes of requests sent or queued whose answers have not come.
    in_flight_bytes: Cell<usize>,
    waiting: RefCell<HashMap<u64, (usize, AnswerSender)>>,
    next_request: Cell<u64>,
    wake_writer: Notify,
    /// Fires when answers leave room for more requests.
    room: Notify,
    broken: Cell<bool>,
}

impl Channel {
    /// Sends the frame `encode` makes for its request id, and waits for the answer's body.
    async fn call(&self, encode: impl FnOnce(u64) -> FrameBuffer) -> Result<FrameBuffer, Status> {
        self.call_within(encode, REPLICA_REQUEST_TIMEOUT).await
    }

    /// `call`, its answer awaited at most `timeout` once sent.
    async fn call_within(
        &self,
        encode: impl FnOnce(u64) -> FrameBuffer,
        timeout: Duration,
    ) -> Result<FrameBuffer, Status> {
        let request_id = self.next_request.get();
        self.next_request.set(request_id + 1);
        let frame = encode(request_id);
        let size = frame.len();
        loop {
            let room = self.room.notified();
            if self.broken.get() {
                return Err(Status::unavailable("the connection failed"));
            }
            let has_room = self.waiting.borrow().len() < REPLICA_REQUESTS_IN_FLIGHT_MAX
                && (self.in_flight_bytes.get() == 0
                    || self.in_flight_bytes.get() + size <= REPLICA_BYTES_IN_FLIGHT_MAX);
            if has_room {
                break;
            }
            futures_lite::future::or(room, crate::runtime::sleep(REPLICA_REQUEST_TIMEOUT)).await;
        }
        let (sender, receiver) = oneshot();
        self.waiting.borrow_mut().insert(request_id, (size, sender));
        self.in_flight_bytes.set(self.in_flight_bytes.get() + size);
        self.queue.borrow_mut().push_back(frame);
        self.wake_writer.notify_all();
        let answer = futures_lite::future::or(receiver, async {
            crate::runtime::sleep(timeout).await;
            None
        })
        .await;
        match answer {
            Some(answer) => answer,
            None => {
                self.forget(request_id);
                Err(Status::new(Code::DeadlineExceeded, format!("no answer within {timeout:?}")))
            }
        }
    }

    fn forget(&self, request_id: u64) -> Option<AnswerSender> {
        let (size, sender) = self.waiting.borrow_mut().remove(&request_id)?;
        self.in_flight_bytes.set(self.in_flight_bytes.get().saturating_sub(size));
        self.room.notify_all();
        Some(sender)
    }

    /// Every request waiting fails with `why`; the channel takes no more.
    fn fail(&self, why: &str) {
        self.broken.set(true);
        let waiting: Vec<_> = self.waiting.borrow_mut().drain().collect();
        for (_, (_, sender)) in waiting {
            sender.send(Err(Status::unavailable(why.to_owned())));
        }
        self.queue.borrow_mut().clear();
        self.in_flight_bytes.set(0);
        self.room.notify_all();
        self.wake_writer.notify_all();
    }

    /// Connects (and makes a TLS session, with `tls`), presents the secret, then writes what
    /// is queued and reads answers until either fails; returns why.
    async fn run(
        &self,
        address: &str,
        secret: Option<Rc<str>>,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> String {
        match connect_peer(address, tls).await {
            Ok(stream) => self.exchange(stream, secret).await,
            Err(why) => format!("connecting: {why}"),
        }
    }

    /// Presents the secret on `stream`, then writes what is queued and reads answers until
    /// either fails; returns why.
    async fn exchange<T: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: T,
        secret: Option<Rc<str>>,
    ) -> String {
        let (mut reader, mut writer) = futures_lite::io::split(stream);
        if let Err(why) = present_secret(&mut writer, secret.as_deref()).await {
            return why;
        }
        let writing = async {
            loop {
                let wake = self.wake_writer.notified();
                if self.broken.get() {
                    return "closed".to_owned();
                }
                let frames: Vec<FrameBuffer> = self.queue.borrow_mut().drain(..).collect();
                if frames.is_empty() {
                    wake.await;
                    continue;
                }
                // Small frames joined into one write; a large one (an append's records) written
                // from its own buffer, not copied once more.
                let small =
                    frames.iter().map(|frame| frame.len()).filter(|bytes| *bytes < JOIN_FRAME_BYTES_MAX);
                let mut joined = Vec::with_capacity(small.sum());
                for frame in &frames {
                    if frame.len() < JOIN_FRAME_BYTES_MAX {
                        joined.extend_from_slice(frame.as_ref());
                        continue;
                    }
                    if !joined.is_empty() {
                        if let Err(error) = writer.write_all(&joined).await {
                            return format!("writing: {error}");
                        }
                        joined.clear();
                    }
                    if let Err(error) = writer.write_all(frame.as_ref()).await {
                        return format!("writing: {error}");
                    }
                }
                if let Err(error) = writer.write_all(&joined).await {
                    return format!("writing: {error}");
                }
                if let Err(error) = writer.flush().await {
                    return format!("writing: {error}");
                }
            }
        };
        let reading = async {
            loop {
                match read_frame(&mut reader).await {
                    Ok((header, body)) => {
                        if header.request_id == 1 && header.command == Command::Authenticate.code() {
                            if header.flags & FLAG_ERROR != 0 {
                                return format!(
                                    "the cluster's secret was refused: {}",
                                    decode_error(&body).message
                                );
                            }
                            continue;
                        }
                        let Some(sender) = self.forget(header.request_id) else { continue };
                        if header.flags & FLAG_ERROR != 0 {
                            sender.send(Err(Status::from(decode_error(&body))));
                            continue;
                        }
                        sender.send(Ok(body));
                    }
                    Err(why) => return why,
                }
            }
        };
        futures_lite::future::or(writing, reading).await
    }
}

/// A connection to another node's port, plain or inside TLS.
pub(crate) trait Duplex: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Duplex for T {}

/// Connects to another node's port at `address` (and makes a TLS session, with `tls`, the
/// peer's certificate verified for its IP address), within `REPLICA_CONNECT_TIMEOUT`.
pub(crate) async fn connect_peer(
    address: &str,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn Duplex>, String> {
    futures_lite::future::or(
        async {
            let stream = TcpStream::connect(address).await.map_err(|error| error.to_string())?;
            let _ = stream.set_nodelay(true);
            let Some(config) = tls else { return Ok(Box::new(stream) as Box<dyn Duplex>) };
            let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|error| format!("{host} is not a name TLS can verify: {error}"))?;
            let session = futures_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map_err(|error| format!("the TLS handshake failed: {error}"))?;
            Ok(Box::new(session) as Box<dyn Duplex>)
        },
        async {
            crate::runtime::sleep(REPLICA_CONNECT_TIMEOUT).await;
            Err("it took longer than REPLICA_CONNECT_TIMEOUT".to_owned())
        },
    )
    .await
}

/// Sends the cluster's secret as an `Authenticate` (request id 1) that nothing waits for: a
/// refusal comes back as an error frame of that id, and the peer closes.
pub(crate) async fn present_secret<W: AsyncWrite + Unpin>(
    writer: &mut W,
    secret: Option<&str>,
) -> Result<(), String> {
    let Some(secret) = secret else { return Ok(()) };
    let request = AuthenticateRequest { token: secret.to_string() };
    let frame = ringpost_wire::encode_frame(Command::Authenticate.code(), 0, 1, &request);
    writer.write_all(frame.as_ref()).await.map_err(|error| format!("authenticating: {error}"))?;
    // A TLS session holds what it was given until flushed.
    writer.flush().await.map_err(|error| format!("authenticating: {error}"))
}

/// A replica request's `PeerMessage` body, before its frame is built.
enum RequestBody {
    Append(ReplicaRequest),
    Encoded(PeerMessage),
}

impl RequestBody {
    /// The bytes of the request's encoding.
    fn bytes(&self) -> usize {
        match self {
            RequestBody::Append(request) => request.append_bytes(),
            RequestBody::Encoded(message) => message.bytes.len(),
        }
    }
}

/// An append as a frame's body: archived exactly as `PeerMessage { bytes: request.encode() }`
/// is (the follower reads a `PeerMessage`), but its bytes are written into the frame in
/// pieces (`ReplicaRequest::write_append`), so that each replicated byte is copied once on
/// the leader, from the batch it holds into the frame, rather than into the encoding and then
/// into the frame.
struct AppendMessage<'a>(&'a ReplicaRequest);

impl rkyv::Archive for AppendMessage<'_> {
    type Archived = ArchivedPeerMessage;
    type Resolver = rkyv::vec::VecResolver;

    fn resolve(&self, resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        rkyv::munge::munge!(let ArchivedPeerMessage { bytes } = out);
        rkyv::vec::ArchivedVec::<u8>::resolve_from_len(self.0.append_bytes(), resolver, bytes);
    }
}

impl<S: rkyv::rancor::Fallible + rkyv::ser::Writer + ?Sized> rkyv::Serialize<S> for AppendMessage<'_> {
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        // Bytes need no alignment: they start where the writer stands, as a `Vec<u8>`'s do.
        let start = serializer.pos();
        let mut written = Ok(());
        self.0.write_append(&mut |piece| {
            if written.is_ok() {
                written = serializer.write(piece);
            }
        });
        written?;
        debug_assert_eq!(serializer.pos() - start, self.0.append_bytes(), "an append's size ahead");
        Ok(rkyv::vec::VecResolver::from_pos(start))
    }
}

/// Reads one response frame's header.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(reader: &mut R) -> Result<FrameHeader, String> {
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    reader.read_exact(&mut header_bytes).await.map_err(|error| format!("reading: {error}"))?;
    let header =
        FrameHeader::decode(&header_bytes).map_err(|error| format!("a bad frame header: {error:?}"))?;
    if header.body_length as usize > FRAME_BODY_BYTES_MAX || header.flags & FLAG_RESPONSE == 0 {
        return Err("the peer answered with a frame that is not a response".to_owned());
    }
    Ok(header)
}

/// Reads the body `header` announced.
pub(crate) async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    header: &FrameHeader,
) -> Result<FrameBuffer, String> {
    let length = header.body_length as usize;
    let mut body = FrameBuffer::with_capacity(length);
    body.resize(length, 0);
    reader.read_exact(&mut body).await.map_err(|error| format!("reading: {error}"))?;
    Ok(body)
}

async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<(FrameHeader, FrameBuffer), String> {
    let header = read_header(reader).await?;
    let body = read_body(reader, &header).await?;
    Ok((header, body))
}

/// A frame of `command` whose body is `body`'s bytes as they are (another frame's body,
/// carried on).
pub(crate) fn frame_with_body(command: u16, flags: u16, request_id: u64, body: &[u8]) -> FrameBuffer {
    let header = FrameHeader { body_length: body.len() as u32, command, flags, request_id };
    let mut frame = FrameBuffer::with_capacity(FRAME_HEADER_BYTES + body.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(body);
    frame
}

/// Dead letters for a topic no shard of this node serves (`shard::dead_letters`): the topic
/// is looked up through this node's router and the letters published on the forwarder that
/// leads it, over the connections replication uses (the cluster's secret presented first).
pub struct RemoteDeadLetters {
    pub transport: Rc<NativeTransport>,
    /// This node's router, where the lookup goes.
    pub router: String,
}

impl crate::shard::dead_letters::RemotePublisher for RemoteDeadLetters {
    fn publish(
        &self,
        topic: Box<str>,
        messages: Vec<crate::subscription::dead_letter::DeadLetter>,
    ) -> crate::subscription::dead_letter::LocalFuture<'_, Result<(), Status>> {
        use ringpost_wire::messages::{
            Attribute, LookupResponse, NameRequest, PublishRequest, PublishResponse, PubsubMessage,
        };
        Box::pin(async move {
            let lookup: LookupResponse = self
                .transport
                .request(&self.router, Command::LookupTopic, &NameRequest { name: topic.to_string() })
                .await?;
            let request = PublishRequest {
                topic: topic.to_string(),
                messages: messages
                    .into_iter()
                    .map(|message| PubsubMessage {
                        data: message.data,
                        attributes: message
                            .attributes
                            .into_iter()
                            .map(|(key, value)| Attribute { key, value })
                            .collect(),
                        ordering_key: message.ordering_key,
                    })
                    .collect(),
            };
            // The list in the router's order: the leader first, the other replicas after it
            // for when the first has just failed.
            let mut last = Status::unavailable(format!("no forwarder serves dead-letter topic '{topic}'"));
            for forwarder in &lookup.forwarders {
                match self
                    .transport
                    .request::<_, PublishResponse>(&forwarder.address, Command::Publish, &request)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(status) if matches!(status.code, Code::NotOwner | Code::Unavailable) => last = status,
                    Err(status) => return Err(status),
                }
            }
            Err(last)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Epoch, Offset, TopicId};
    use crate::replication::protocol::{Chunk, HeldSlice, LogAppend, RecordBytes};

    /// Records held in pieces, as a leader's chunks hold its batches.
    fn held(pieces: &[&[u8]]) -> RecordBytes {
        let holder: Rc<dyn AsRef<[u8]>> = Rc::new(pieces.concat());
        let mut slices = Vec::new();
        let mut start = 0;
        for piece in pieces {
            slices.push(HeldSlice::new(holder.clone(), start, start + piece.len()));
            start += piece.len();
        }
        RecordBytes::Held(slices)
    }

    /// An append written into its frame in pieces is the frame of its encoding, byte for byte,
    /// and decodes to the same request: a follower of any version reads it as before.
    #[test]
    fn an_append_written_in_pieces_is_the_frame_of_its_encoding() {
        let records = (0..3000u32).map(|byte| byte as u8).collect::<Vec<u8>>();
        for stamp in [0, 7] {
            let chunks = vec![
                Chunk {
                    first_offset: Offset::new(4),
                    epoch: Epoch::new(2),
                    record_count: 3,
                    records: held(&[&records[..40], &records[40..1000], &[]]),
                },
                Chunk {
                    first_offset: Offset::new(7),
                    epoch: Epoch::new(3),
                    record_count: 1,
                    records: records[1000..].to_vec().into(),
                },
            ];
            let request = ReplicaRequest::Append {
                topic_id: TopicId::new(5),
                leader_epoch: Epoch::new(3),
                stamp,
                logs: [
                    LogAppend { chunks, committed_end: Offset::new(6), start_offset: Offset::new(1) },
                    LogAppend {
                        chunks: vec![Chunk {
                            first_offset: Offset::new(0),
                            epoch: Epoch::new(1),
                            record_count: 1,
                            records: held(&[&records[7..31]]),
                        }],
                        committed_end: Offset::new(0),
                        start_offset: Offset::new(0),
                    },
                ],
            };
            let encoded = request.encode();
            assert_eq!(encoded.len(), request.append_bytes());
            let code = Command::Replica.code();
            let capacity = encoded.len() + PEER_MESSAGE_OVERHEAD_BYTES;
            let pieces = ringpost_wire::encode_frame_sized(code, 0, 9, &AppendMessage(&request), capacity);
            let whole =
                ringpost_wire::encode_frame_sized(code, 0, 9, &PeerMessage { bytes: encoded }, capacity);
            assert_eq!(pieces.as_slice(), whole.as_slice(), "stamp {stamp}");
            assert!(pieces.capacity() <= capacity, "the frame was sized for its records ahead");
            let message = access_body::<PeerMessage>(&pieces[FRAME_HEADER_BYTES..]).unwrap();
            assert_eq!(ReplicaRequest::decode(message.bytes.as_slice()), Ok(request));
        }
    }
}
