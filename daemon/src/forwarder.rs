//! A forwarder shard: owns topics (their message logs and subscription journals) and serves
//! publish, pull, acknowledge and modify-ack-deadline for them, on its own port. Control
//! requests from the router arrive on a channel. Nothing here is shared with other shards.

use crate::catalog::SubscriptionSettings;
use crate::clock::Clock;
use crate::control::{ControlOk, ControlRequest, SettingsUpdate};
use crate::journal::{journal_log_id, runs_of, JournalEntry};
use crate::log::{
    make_reserve, record, Directories, EncodeRecords, Log, LogConfig, LogError, Records, RecoveryReport,
    TailCacheBudget,
};
use crate::net::{fail, gathering_has_room, respond, Handler, Held, Responder, Response};
use crate::rate::{RateTicks, RateWindow};
use crate::storage::Storage;
use crate::subscription::{AckId, IdHasher, SubscriptionState};
use crate::sync::Notify;
use ringpost_wire::borrowed::{AttributeRef, BytesRef, PullResponseRef, ReceivedMessageRef, StrRef};
use ringpost_wire::frame::{access_body, FrameBuffer, FrameHeader};
use ringpost_wire::gather::{encode_gathered, GATHER_RUN_BYTES_MIN};
use ringpost_wire::limits::*;
use ringpost_wire::messages::*;
use ringpost_wire::{Command, ErrorCode, Status};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

/// Bytes of messages one pull response may carry; the frame limit leaves room for the
/// envelope of the largest single message.
pub const PULL_RESPONSE_BYTES_MAX: usize = 12 * 1024 * 1024;
const _: () = assert!(PULL_RESPONSE_BYTES_MAX + 2 * 1024 * 1024 <= FRAME_BODY_BYTES_MAX);
const _: () = assert!(MESSAGE_BYTES_MAX <= PULL_RESPONSE_BYTES_MAX);
/// How long an idle stream sleeps before it looks again on its own, a safety net only: commits,
/// acks, nacks, lease and backoff expiries (its own timer and the shard's sweep) and the
/// subscription's deletion wake it. At 1 s, 10,000 idle streams cost their shard 3.5% of a
/// core (49-55 against 14-15 ticks of daemon CPU in 10 s at 10 msg/s, with 30 s).
const STREAM_IDLE_CHECK: Duration = Duration::from_secs(30);
/// The shortest sleep of a pull or stream waiting for a deadline. Each takes back expired
/// leases before it reads the next deadline, so that deadline is in the future; were it ever
/// not, a sleep of zero would return at once without yielding and the loop would hold the
/// shard's core for good, with every topic the shard serves. Far below the second that ack
/// deadlines are counted in.
pub const DEADLINE_SLEEP_MIN: Duration = Duration::from_millis(1);
/// How often a deletion or a journal's first entry looks again whether the journal's reserve
/// is still being made (`TopicState::reserve_settled`).
const RESERVE_SETTLE_PAUSE: Duration = Duration::from_millis(5);
/// Pause before dead-letter publishes that failed are tried again.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);
/// Attributes a dead-lettered message carries, named as Pub/Sub names them.
pub const DEAD_LETTER_SOURCE_SUBSCRIPTION: &str = "CloudPubSubDeadLetterSourceSubscription";
pub const DEAD_LETTER_SOURCE_DELIVERY_COUNT: &str = "CloudPubSubDeadLetterSourceDeliveryCount";
pub const DEAD_LETTER_SOURCE_MESSAGE_ID: &str = "CloudPubSubDeadLetterSourceMessageId";
pub const DEAD_LETTER_SOURCE_PUBLISH_TIME: &str = "CloudPubSubDeadLetterSourceTopicPublishTime";

/// Largest journal segment: small, so compaction frees space in fine steps.
pub const JOURNAL_SEGMENT_BYTES_MAX: u64 = 4 << 20;
/// Journal bytes written since the last checkpoint that trigger the next one.
pub const JOURNAL_CHECKPOINT_BYTES: u64 = 8 << 20;

/// How often expired leases are collected when nobody pulls.
pub const LEASE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes of recently written batches all topics of one shard keep in memory for readers
/// together (each at most `LogConfig::tail_cache_bytes_max`).
pub const TAIL_CACHE_SHARD_BYTES_MAX: usize = 64 << 20;
/// Sweeps without a request after which a shard that was busy hands the heap memory it freed
/// back to the kernel: malloc keeps what a burst freed (buffers, caches, deleted topics), and
/// without a trim the process would stay at its peak resident for good. After the tail caches
/// went idle (`TAIL_CACHE_IDLE_SWEEPS`), so those are returned too.
pub const QUIET_SWEEPS_BEFORE_TRIM: u32 = crate::log::TAIL_CACHE_IDLE_SWEEPS as u32 + 2;
/// How often segments every subscription has acknowledged are deleted.
pub const SEGMENT_COLLECTION_INTERVAL: Duration = Duration::from_secs(5);

/// A timer for a loop that waits until `deadline`: never shorter than `DEADLINE_SLEEP_MIN`, so
/// the loop yields the shard even when its deadline has passed.
async fn sleep_until(now: std::time::Instant, deadline: std::time::Instant) {
    crate::runtime::sleep(deadline.saturating_duration_since(now).max(DEADLINE_SLEEP_MIN)).await
}

pub fn log_error_status(error: LogError) -> Status {
    match error {
        LogError::Fenced(why) => {
            Status::unavailable(format!("the topic's storage failed and is fenced: {why}"))
        }
        LogError::NoSpace(why) => {
            Status::resource_exhausted(format!("out of disk space or open files: {why}"))
        }
        LogError::Overloaded => {
            Status::resource_exhausted("too many publishes are waiting for the disk; retry with backoff")
        }
        LogError::DataLoss(why) => Status::new(ErrorCode::DataLoss, why),
        LogError::Corrupt(why) => Status::new(ErrorCode::DataLoss, why),
        LogError::Io(why) => Status::unavailable(why),
    }
}

pub struct TopicState<S: Storage> {
    pub id: u64,
    /// Shared with the key of the shard's map of topics by name.
    pub name: Rc<str>,
    pub log: Log<S>,
    pub journal: LazyJournal<S>,
    pub subscriptions: RefCell<Vec<Rc<SubscriptionEntry>>>,
    /// Topic message retention; 0 when not set. A cell: an update changes it in place.
    retention_seconds: Cell<u64>,
    published: RefCell<RateWindow>,
    /// Whether the journal's reserve segment was made while the journal was closed (an open
    /// journal's log keeps track of its own): see `reserve_journal_space`.
    journal_reserve: Cell<JournalReserve>,
    /// Fires when a reserve stops being made (`JournalReserve::Making` ends).
    reserve_done: Notify,
    /// Deleted: its journal must not open (or be made) again while its files go.
    deleted: Cell<bool>,
}

/// Where a topic whose journal is closed stands with its journal's reserve segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JournalReserve {
    /// Not tried since the topic was attached: its next publish tries.
    Untried,
    /// Being made in the journal's folder: the journal must not open (its recovery removes a
    /// reserve half made, under the file being made), nor the folder go, until it is done
    /// (`TopicState::reserve_settled`).
    Making,
    /// Being made, or made (the journal adopts it when it opens).
    Made,
    /// The disk had no room: segment collection tries again, once it may have freed some.
    Failed,
}

/// A topic's subscription journal, opened on first use. A subscription's sync point lives in the
/// catalog, so the journal holds only what subscribers did (acknowledgements, seeks, deadline
/// extensions, snapshots): a topic whose subscriptions never acknowledged anything has none, and
/// keeps no open log for it (about 400 bytes and a file descriptor per idle topic).
pub struct LazyJournal<S: Storage> {
    log: RefCell<JournalSlot<S>>,
    /// The shard's journal configuration chosen at attach (files kept open or not).
    config: Rc<LogConfig>,
    /// Shared by the shard's topics: fires when any journal finishes opening, so appends that
    /// found this one opening look again (one opener per journal, never two logs on one folder).
    opened: Notify,
}

enum JournalSlot<S: Storage> {
    Closed,
    Opening,
    Open(Box<OpenJournal<S>>),
}

/// An open journal and the state kept beside it, which only a topic with a journal has.
struct OpenJournal<S: Storage> {
    log: Log<S>,
    /// Subscription states rebuilt from the journal, waiting for the router to attach them.
    recovered: HashMap<u64, Vec<JournalEntry>, IdHasher>,
    /// Live snapshots of this topic's subscriptions: (floor, acknowledged runs, expiry).
    snapshots: HashMap<u64, SnapshotState, IdHasher>,
    /// Where the journal's last two checkpoints start (older first); see `compact_journal`.
    checkpoints: VecDeque<u64>,
}

impl<S: Storage> OpenJournal<S> {
    fn new(log: Log<S>) -> Box<OpenJournal<S>> {
        Box::new(OpenJournal {
            log,
            recovered: HashMap::default(),
            snapshots: HashMap::default(),
            checkpoints: VecDeque::new(),
        })
    }
}

impl<S: Storage> LazyJournal<S> {
    /// The journal's log, opened (and created on disk) if it is not yet. Opening an empty
    /// folder does not wait on the disk today, but should it ever, appends that arrive meanwhile
    /// wait for the one opener instead of opening a second log on the same files.
    /// It goes beside the topic's message log, `messages`, on the same storage.
    async fn log(&self, messages: &Log<S>, topic_id: u64) -> Result<Log<S>, LogError> {
        loop {
            // Registered before looking, so an opener finishing in between is not missed.
            let opened = self.opened.notified();
            match &*self.log.borrow() {
                JournalSlot::Open(open) => return Ok(open.log.clone()),
                JournalSlot::Opening => {}
                JournalSlot::Closed => break,
            }
            opened.await;
        }
        *self.log.borrow_mut() = JournalSlot::Opening;
        let result = Log::open(
            messages.storage().clone(),
            messages.directories().clone(),
            &journal_folder(topic_id),
            journal_log_id(topic_id),
            self.config.clone(),
        )
        .await;
        *self.log.borrow_mut() = match &result {
            Ok((log, _)) => JournalSlot::Open(OpenJournal::new(log.clone())),
            Err(_) => JournalSlot::Closed,
        };
        self.opened.notify_all();
        result.map(|(log, _)| log)
    }

    /// The journal's log if it is open (nothing to read or compact otherwise).
    pub fn opened(&self) -> Option<Log<S>> {
        self.with_open(|open| open.log.clone())
    }

    /// Runs `f` on the open journal's state; `None` if the journal is not open (then there is
    /// nothing recovered, no snapshot and no checkpoint).
    fn with_open<R>(&self, f: impl FnOnce(&mut OpenJournal<S>) -> R) -> Option<R> {
        match &mut *self.log.borrow_mut() {
            JournalSlot::Open(open) => Some(f(open)),
            _ => None,
        }
    }
}

impl<S: Storage> TopicState<S> {
    /// Makes sure the journal holds its reserve segment (`LogConfig::reserve`), so that
    /// acknowledgements can be recorded once the disk is full. Acknowledging is how a user frees
    /// disk space (segment collection then deletes what every subscription acknowledged): were
    /// an acknowledgement refused on a full disk because the journal needs a segment, nothing
    /// could ever be freed but by deleting a topic. A journal is opened only at its first entry
    /// (`LazyJournal`), so a closed one gets its reserve in its folder, which it adopts when it
    /// opens; an open one makes it again after a roll on a full disk took it. Made once the
    /// topic holds messages: a topic nobody published to has nothing to acknowledge, and
    /// 10,000 idle topics keep no reserve.
    pub async fn reserve_journal_space(&self) -> Result<(), LogError> {
        if self.deleted.get() {
            return Ok(());
        }
        if let Some(journal) = self.journal.opened() {
            return journal.retake_reserve().await;
        }
        if self.journal_reserve.get() == JournalReserve::Made
            || !matches!(*self.journal.log.borrow(), JournalSlot::Closed)
        {
            return Ok(());
        }
        // Set before the wait: a second caller meanwhile does not make it twice, and the
        // journal does not open under it.
        self.journal_reserve.set(JournalReserve::Making);
        let made = make_reserve(
            self.log.storage(),
            self.log.directories(),
            &journal_folder(self.id),
            self.journal.config.segment_bytes_initial,
        )
        .await;
        self.journal_reserve.set(if made.is_ok() { JournalReserve::Made } else { JournalReserve::Failed });
        self.reserve_done.notify_all();
        made
    }

    /// Waits while the journal's reserve is being made in its folder. Opening the journal
    /// meanwhile would remove the file being made as a leftover, and deleting the topic would
    /// remove its folder; either fails the open underneath (glommio's DMA open then panics on
    /// the vanished path).
    pub async fn reserve_settled(&self) {
        loop {
            let done = self.reserve_done.notified();
            let making = self.journal_reserve.get() == JournalReserve::Making
                || self.journal.opened().is_some_and(|journal| journal.is_reserving());
            if !making {
                return;
            }
            // An open journal's own reserve sets no notifier: look again shortly.
            futures_lite::future::or(done, crate::runtime::sleep(RESERVE_SETTLE_PAUSE)).await;
        }
    }

    /// Makes one journal entry durable, opening the journal first if it is not yet.
    pub async fn append_journal(&self, entry: &JournalEntry) -> Result<(), LogError> {
        let bytes = entry.encode();
        let mut records = Vec::with_capacity(bytes.len() + record::RECORD_HEADER_BYTES + 8);
        record::encode_record_unsealed(&mut records, 0, &bytes, &mut std::iter::empty(), "");
        if self.journal.opened().is_none() {
            self.reserve_settled().await;
        }
        if self.deleted.get() {
            return Err(LogError::Fenced("the topic was deleted".into()));
        }
        let journal = self.journal.log(&self.log, self.id).await?;
        journal.append(records, 1).await.map(|_| ())
    }
}

struct SnapshotState {
    floor: u64,
    runs: Vec<(u64, u32)>,
    expire_time_ms: u64,
}

pub struct SubscriptionEntry {
    pub id: u64,
    /// Shared with the key of the shard's map of subscriptions by name.
    pub name: Rc<str>,
    pub topic_id: u64,
    // The three settings the forwarder reads after attaching, not the whole
    // `SubscriptionSettings` (88 bytes, over 10,000 idle subscriptions): the deadline and the
    // delivery policy went into `state`, the filter into `filter`, and the router keeps them all.
    // Cells, so that an update changes them in place (`update_settings`).
    /// Where exhausted messages go; `None` without a dead-letter policy.
    dead_letter_topic: RefCell<Option<Box<str>>>,
    /// How long the subscription keeps messages, and whether acknowledged ones too.
    message_retention_seconds: Cell<u64>,
    retain_acked_messages: Cell<bool>,
    pub state: RefCell<SubscriptionState>,
    /// The subscription's filter; `None` delivers everything.
    /// Boxed: most subscriptions have none, and an idle one should not carry its room.
    filter: Option<Box<crate::filter::Filter>>,
    /// Fires when leases end (ack, nack, stream closed), so streams waiting for flow-control
    /// room or for redeliveries look again.
    changed: Notify,
    /// A dead-letter task is running for this subscription.
    dead_lettering: Cell<bool>,
    /// Deleted (or its topic was): the pulls and streams still holding it end with NotFound.
    detached: Cell<bool>,
    /// Wall-clock time of the last pull or acknowledgement, for the expiration policy.
    last_activity_ms: Cell<u64>,
    delivered: RefCell<RateWindow>,
    acked: RefCell<RateWindow>,
}

impl SubscriptionEntry {
    /// Marks the subscription deleted and wakes whatever waits on it, so that its open pulls
    /// and streams end with NotFound, as Pub/Sub ends them, instead of waiting forever on a
    /// subscription nothing will deliver to again.
    fn detach(&self) {
        self.detached.set(true);
        self.changed.notify_all();
    }

    /// The error a pull or stream on a deleted subscription ends with.
    fn deleted(&self) -> Status {
        Status::not_found(format!("subscription '{}' was deleted", self.name))
    }
}

type DeadLetterClient = Rc<RefCell<Option<std::sync::Arc<ringpost_client::Client>>>>;

/// A subscription this forwarder serves, with its topic.
type Served<S> = (Rc<SubscriptionEntry>, Rc<TopicState<S>>);

pub struct Forwarder<S: Storage> {
    pub shard: u32,
    /// The router's address, for publishing to dead-letter topics on whichever forwarder
    /// owns them (set once the daemon serves).
    router_address: RefCell<Option<String>>,
    /// One connection to the router for dead-letter publishes, opened on first use.
    dead_letter_client: DeadLetterClient,
    next_stream: Cell<u64>,
    storage: S,
    directories: Rc<Directories>,
    /// The message logs' configuration, and the journals' (with their files kept open between
    /// commits, and closed), each shared by every topic of the shard.
    log_config: Rc<LogConfig>,
    journal_configs: [Rc<LogConfig>; 2],
    clock: Rc<dyn Clock>,
    topics: RefCell<HashMap<Rc<str>, Rc<TopicState<S>>>>,
    /// Fires when a topic's journal finishes opening (see `LazyJournal`).
    journal_opened: Notify,
    topics_by_id: RefCell<HashMap<u64, Rc<TopicState<S>>>>,
    subscriptions: RefCell<HashMap<Rc<str>, Served<S>>>,
    /// Topics on this shard whose journals keep their files open between commits; the journals
    /// of topics attached beyond it close them after each commit (and reopen on the next),
    /// which costs an open per acknowledgement commit but keeps 10,000 topics within a
    /// 20,000-descriptor limit. Set from the open-file limit by the daemon.
    journals_open_max: Cell<usize>,
    /// Topics whose attach is in progress: at start-up several are attached at once, and each
    /// counts toward `journals_open_max` from its start, so the budget holds however they
    /// interleave.
    topics_attaching: Cell<usize>,
    /// When the rate windows of this shard's topics and subscriptions were sampled.
    rate_ticks: RefCell<RateTicks>,
    /// Requests handled (from clients and from the router, but for stats), and their count at
    /// the last sweep.
    requests: Cell<u64>,
    requests_at_sweep: Cell<u64>,
    /// Sweeps in a row without a request since the shard was last busy; None once trimmed.
    quiet_sweeps: Cell<Option<u32>>,
    /// A release of the shard's kept files is running (`release_kept_files`).
    releasing_kept_files: Rc<Cell<bool>>,
    /// Quarantine topics whose logs cannot be recovered at start (`Config::quarantine_damaged`).
    quarantine_damaged: Cell<bool>,
    quarantined: RefCell<Quarantined>,
    /// Given when the daemon stops (SIGTERM): streams end with `Unavailable`, which clients
    /// retry on, and waiting pulls answer with what they have.
    stop: crate::sync::Stop,
}

/// Topics left unserved at start because their logs could not be recovered, and their
/// subscriptions: requests naming them are answered with `DataLoss` and the reason, and their
/// files are left as they are until the topic is deleted.
#[derive(Default)]
struct Quarantined {
    /// By id: the topic's name and why it is quarantined.
    topics: HashMap<u64, (Rc<str>, Rc<str>), IdHasher>,
    topic_names: HashMap<Rc<str>, Rc<str>>,
    /// By name: the subscription's topic id and the topic's reason.
    subscriptions: HashMap<Rc<str>, (u64, Rc<str>)>,
}

fn quarantined_status(kind: &str, name: &str, why: &str) -> Status {
    Status::new(
        ErrorCode::DataLoss,
        format!(
            "{kind} '{name}' is quarantined: {why}. It is not served until repaired or deleted; nothing was deleted"
        ),
    )
}

/// A topic's folder inside each data directory.
pub fn topic_folder(topic_id: u64) -> PathBuf {
    PathBuf::from("topics").join(format!("{topic_id:016x}"))
}

/// Where a topic's subscription journal lives, inside each data directory.
fn journal_folder(topic_id: u64) -> PathBuf {
    topic_folder(topic_id).join("journal")
}

fn not_owner(kind: &str, name: &str) -> Status {
    Status::new(
        ErrorCode::NotOwner,
        format!("this forwarder does not serve {kind} '{name}'; ask the router again"),
    )
}

/// A publish's messages, still in the request's frame (validated when it arrived), encoded as
/// records when their commit is built.
struct PublishRecords {
    body: FrameBuffer,
    publish_time_ms: u64,
    encoded_bytes: usize,
}

impl EncodeRecords for PublishRecords {
    fn encoded_bytes(&self) -> usize {
        self.encoded_bytes
    }

    fn encode_into(&self, out: &mut [u8]) {
        // The frame is owned here and was validated before it was staged, so this cannot fail.
        let request = access_body::<PublishRequest>(&self.body).expect("a staged publish was validated");
        let mut at = 0;
        for message in request.messages.iter() {
            let mut attributes = message.attributes.iter().map(|a| (a.key.as_str(), a.value.as_str()));
            at += record::encode_record_into(
                &mut out[at..],
                self.publish_time_ms,
                message.data.as_slice(),
                &mut attributes,
                message.ordering_key.as_str(),
            );
        }
        debug_assert_eq!(at, out.len(), "encoded_bytes counts what encode_into writes");
    }

    fn newest_publish_ms(&self) -> u64 {
        self.publish_time_ms
    }
}

impl<S: Storage> Forwarder<S> {
    pub fn new(
        shard: u32,
        storage: S,
        directories: Rc<Directories>,
        mut log_config: LogConfig,
        clock: Rc<dyn Clock>,
    ) -> Forwarder<S> {
        if log_config.tail_cache_budget.is_none() {
            log_config.tail_cache_budget = Some(TailCacheBudget::new(TAIL_CACHE_SHARD_BYTES_MAX));
        }
        Forwarder {
            shard,
            router_address: RefCell::default(),
            dead_letter_client: Rc::default(),
            next_stream: Cell::new(1),
            storage,
            directories,
            journal_configs: [true, false].map(|keep_files_open| {
                Rc::new(LogConfig {
                    segment_bytes_initial: 256 * 1024,
                    segment_bytes_max: JOURNAL_SEGMENT_BYTES_MAX.min(log_config.segment_bytes_max),
                    // The journal is read only at recovery: keeping its last commits in memory
                    // would cost every idle topic a few KiB for nothing.
                    tail_cache_bytes_max: 0,
                    keep_files_open,
                    // Read once, at recovery; extents kept after it would hold the shard's
                    // cache budget for good.
                    read_ahead: false,
                    // Small segments, deleted by compaction only: not worth a kept file.
                    recycle: false,
                    // Acknowledgements must be recorded on a full disk: see
                    // `TopicState::reserve_journal_space`.
                    reserve: true,
                    ..log_config.clone()
                })
            }),
            log_config: Rc::new(log_config),
            clock,
            topics: RefCell::default(),
            journal_opened: Notify::new(),
            topics_by_id: RefCell::default(),
            subscriptions: RefCell::default(),
            journals_open_max: Cell::new(usize::MAX),
            topics_attaching: Cell::new(0),
            rate_ticks: RefCell::default(),
            requests: Cell::new(0),
            requests_at_sweep: Cell::new(0),
            quiet_sweeps: Cell::new(None),
            releasing_kept_files: Rc::default(),
            quarantine_damaged: Cell::new(false),
            quarantined: RefCell::default(),
            stop: crate::sync::Stop::default(),
        }
    }

    /// The order that stops this shard: `net::serve` stops accepting and reading on it, and
    /// the forwarder's streams and waiting pulls end (`wake_for_stop`).
    pub fn stop_handle(&self) -> crate::sync::Stop {
        self.stop.clone()
    }

    /// Once the stop order is given, wakes every pull waiting on a subscription, so that it
    /// answers at once instead of at the end of its wait. Streams wake as their connections
    /// stop being read.
    pub async fn wake_for_stop(&self) {
        self.stop.given().await;
        for (subscription, _) in self.subscriptions.borrow().values() {
            subscription.changed.notify_all();
        }
    }

    pub fn set_journals_open_max(&self, journals: usize) {
        self.journals_open_max.set(journals);
    }

    pub fn set_quarantine_damaged(&self, quarantine: bool) {
        self.quarantine_damaged.set(quarantine);
    }

    pub async fn control(&self, request: ControlRequest) -> Result<ControlOk, Status> {
        // Creating and deleting topics allocates like any burst; reading the stats does not
        // count, or watching a quiet daemon would keep it from trimming.
        if !matches!(request, ControlRequest::Stats) {
            self.requests.set(self.requests.get() + 1);
        }
        match request {
            ControlRequest::AttachTopic { topic_id, name, retention_seconds, recovering } => {
                self.attach_topic(topic_id, name, retention_seconds, recovering).await
            }
            ControlRequest::DurableEnd { topic_id } => self.durable_end(topic_id),
            ControlRequest::Stats => Ok(ControlOk::Stats(self.shard_stats(), self.topic_stats().await)),
            ControlRequest::UpdateSettings { topic_id, update } => self.update_settings(topic_id, update),
            ControlRequest::Seek { subscription_id, topic_id, time_ms, snapshot_id } => {
                let (topic, entry) = self.attached(topic_id, subscription_id)?;
                let (offset, runs) = match snapshot_id {
                    Some(snapshot_id) => topic
                        .journal
                        .with_open(|open| {
                            open.snapshots
                                .get(&snapshot_id)
                                .map(|snapshot| (snapshot.floor, snapshot.runs.clone()))
                        })
                        .flatten()
                        .ok_or_else(|| Status::not_found("the snapshot is not stored with its topic"))?,
                    None => (topic.log.offset_at_time(time_ms).await.map_err(log_error_status)?, Vec::new()),
                };
                let mut offset = offset.max(topic.log.start_offset());
                if snapshot_id.is_none() && topic.retention_seconds.get() == 0 {
                    // A subscription holds only what was published after its creation; only a
                    // topic's own retention keeps older messages to seek back to, as in Pub/Sub.
                    // Without it, older messages may still be on disk (another subscription
                    // has not acknowledged them) but are not this subscription's to replay.
                    offset = offset.max(entry.state.borrow().start_offset);
                }
                topic
                    .append_journal(&JournalEntry::Seek { subscription_id, offset })
                    .await
                    .map_err(log_error_status)?;
                if !runs.is_empty() {
                    topic
                        .append_journal(&JournalEntry::Acked { subscription_id, runs: runs.clone() })
                        .await
                        .map_err(log_error_status)?;
                }
                let mut state = entry.state.borrow_mut();
                state.seek(offset);
                for (first, count) in runs {
                    for acked in first..first + count as u64 {
                        state.restore_ack(acked);
                    }
                }
                drop(state);
                entry.changed.notify_all();
                Ok(ControlOk::Done)
            }
            ControlRequest::TakeSnapshot { topic_id, subscription_id, snapshot_id, expire_time_ms } => {
                let (topic, entry) = self.attached(topic_id, subscription_id)?;
                let (floor, runs) = entry.state.borrow().acknowledged_runs();
                let taken =
                    JournalEntry::SnapshotTaken { snapshot_id, floor, runs: runs.clone(), expire_time_ms };
                topic.append_journal(&taken).await.map_err(log_error_status)?;
                // The append opened the journal.
                topic.journal.with_open(|open| {
                    open.snapshots.insert(snapshot_id, SnapshotState { floor, runs, expire_time_ms })
                });
                Ok(ControlOk::Done)
            }
            ControlRequest::DropSnapshot { topic_id, snapshot_id } => {
                let topic = self.topics_by_id.borrow().get(&topic_id).cloned();
                if let Some(topic) = topic {
                    let dropped =
                        topic.journal.with_open(|open| open.snapshots.remove(&snapshot_id).is_some());
                    if dropped == Some(true) {
                        topic
                            .append_journal(&JournalEntry::SnapshotDropped { snapshot_id })
                            .await
                            .map_err(log_error_status)?;
                    }
                }
                Ok(ControlOk::Done)
            }
            ControlRequest::ResyncDirectory { index } => {
                if index >= self.directories.count() {
                    return Err(Status::invalid_argument(format!(
                        "there is no data directory {index}; there are {}",
                        self.directories.count()
                    )));
                }
                self.directories.unfence(index);
                let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
                let (mut logs, mut batches) = (0, 0);
                for topic in topics {
                    for log in std::iter::once(topic.log.clone()).chain(topic.journal.opened()) {
                        if log.is_stale(index) {
                            batches += log.resync_copy(index).await.map_err(log_error_status)?;
                            logs += 1;
                        }
                    }
                }
                Ok(ControlOk::Resynced { logs, batches })
            }
            ControlRequest::DetachTopic { topic_id, delete_data } => {
                let quarantined = {
                    let mut quarantined = self.quarantined.borrow_mut();
                    quarantined.subscriptions.retain(|_, (owner, _)| *owner != topic_id);
                    let removed = quarantined.topics.remove(&topic_id);
                    if let Some((name, _)) = &removed {
                        quarantined.topic_names.remove(name);
                    }
                    removed
                };
                if let (Some((name, _)), true) = (quarantined, delete_data) {
                    // Deleting is the operator's way out for a damaged topic: its folders go.
                    for copy in 0..self.directories.count() {
                        let folder = self.directories.path(copy).join(topic_folder(topic_id));
                        if self.storage.exists(&folder) {
                            if let Err(error) = self.storage.remove_dir_all(&folder) {
                                eprintln!(
                                    "ringpostd: removing {} of topic '{name}': {error}",
                                    folder.display()
                                );
                            }
                        }
                    }
                }
                let topic = self.topics_by_id.borrow_mut().remove(&topic_id);
                if let Some(topic) = topic {
                    self.topics.borrow_mut().remove(&topic.name);
                    self.subscriptions.borrow_mut().retain(|_, (entry, owner)| {
                        if owner.id == topic_id {
                            entry.detach();
                        }
                        owner.id != topic_id
                    });
                    if delete_data {
                        self.delete_topic_files(topic);
                    }
                }
                Ok(ControlOk::Done)
            }
            ControlRequest::AttachSubscription {
                subscription_id,
                name,
                topic_id,
                settings,
                create,
                start_offset,
            } => {
                self.attach_subscription(subscription_id, name, topic_id, settings, create, start_offset)
                    .await
            }
            ControlRequest::DetachSubscription { subscription_id, name, topic_id } => {
                self.quarantined.borrow_mut().subscriptions.remove(name.as_str());
                if let Some((entry, _)) = self.subscriptions.borrow_mut().remove(name.as_str()) {
                    entry.detach();
                }
                let topic = self.topics_by_id.borrow().get(&topic_id).cloned();
                // Nothing to journal: replay applies only entries of subscriptions the router
                // attaches, and the next checkpoint drops this one's.
                if let Some(topic) = topic {
                    topic.subscriptions.borrow_mut().retain(|entry| entry.id != subscription_id);
                }
                Ok(ControlOk::Done)
            }
        }
    }

    /// Removes a detached topic's files, in the background: its closed segments first, through
    /// the log, which shrinks each in steps (a deleted topic of many gigabytes, unlinked at
    /// once, would have the device trim all of it while every other topic's syncs wait), then
    /// its folders. The deletion is durable in the catalog already: a crash midway leaves a
    /// folder the catalog no longer names, which the router removes at the next start.
    fn delete_topic_files(&self, topic: Rc<TopicState<S>>) {
        let (storage, directories) = (self.storage.clone(), self.directories.clone());
        topic.deleted.set(true);
        crate::runtime::spawn(async move {
            // Publishes and acknowledgements still in flight finish first: a commit meeting a
            // vanished file would fence the data directory for every topic of the shard.
            topic.log.close_for_removal().await;
            topic.reserve_settled().await;
            if let Some(journal) = topic.journal.opened() {
                journal.close_for_removal().await;
                journal.discard_spares().await;
            }
            topic.log.discard_spares().await;
            let closed = topic.log.closed_segments().len();
            if let Err(error) = topic.log.remove_oldest(closed).await {
                eprintln!("ringpostd: deleting the segments of topic '{}': {error}", topic.name);
            }
            for copy in 0..directories.count() {
                let folder = directories.path(copy).join(topic_folder(topic.id));
                if storage.exists(&folder) {
                    if let Err(error) = storage.remove_dir_all(&folder) {
                        eprintln!("ringpostd: removing {}: {error}", folder.display());
                    }
                }
            }
        })
        .detach();
    }

    async fn attach_topic(
        &self,
        topic_id: u64,
        name: String,
        retention_seconds: u64,
        recovering: bool,
    ) -> Result<ControlOk, Status> {
        if self.topics_by_id.borrow().contains_key(&topic_id) {
            return Ok(ControlOk::Done);
        }
        // Counted at attach: topics deleted later do not hand their place to later ones.
        let keep_files_open =
            self.topics_by_id.borrow().len() + self.topics_attaching.get() < self.journals_open_max.get();
        self.topics_attaching.set(self.topics_attaching.get() + 1);
        let result =
            self.open_topic(topic_id, name.clone(), retention_seconds, keep_files_open, recovering).await;
        self.topics_attaching.set(self.topics_attaching.get() - 1);
        match result {
            Err(status)
                if recovering && status.code == ErrorCode::DataLoss && self.quarantine_damaged.get() =>
            {
                eprintln!(
                    "ringpostd: ERROR: topic '{name}' is quarantined: {}; it and its subscriptions answer DataLoss, \
                     its files are left as they are (deleting the topic removes them)",
                    status.message
                );
                let (name, why): (Rc<str>, Rc<str>) = (name.into(), status.message.into());
                let mut quarantined = self.quarantined.borrow_mut();
                quarantined.topic_names.insert(name.clone(), why.clone());
                quarantined.topics.insert(topic_id, (name, why));
                Ok(ControlOk::Done)
            }
            result => result,
        }
    }

    async fn open_topic(
        &self,
        topic_id: u64,
        name: String,
        retention_seconds: u64,
        keep_files_open: bool,
        recovering: bool,
    ) -> Result<ControlOk, Status> {
        let relative = topic_folder(topic_id);
        // Both folders of the topic in every data directory, in one go: their parents are then
        // synced once each (three syncs a topic when each log made its own).
        let folders: Vec<std::path::PathBuf> = (0..self.directories.count())
            .flat_map(|copy| {
                let directory = self.directories.path(copy);
                [directory.join(relative.join("messages")), directory.join(journal_folder(topic_id))]
            })
            .collect();
        if recovering {
            // Their metadata is read from disk while the shard goes on (the checks below and
            // the logs' listings then find it cached): read on the shard's own thread, one
            // topic's after another's, they were 15% of a cold start's samples.
            self.storage.prefetch_dirs(&folders).await;
        } else {
            self.check_room_for_a_topic(&name)?;
        }
        let opened =
            self.open_topic_logs(topic_id, &name, retention_seconds, keep_files_open, &folders).await;
        if opened.is_err() && !recovering {
            // The router records nothing of a topic whose attach failed: what was made of it
            // goes, or it would stay behind until the next start.
            for copy in 0..self.directories.count() {
                let folder = self.directories.path(copy).join(&relative);
                if self.storage.exists(&folder) {
                    let _ = self.storage.remove_dir_all(&folder);
                }
            }
        }
        opened
    }

    /// Refuses a new topic where fewer than ⌈M/2⌉ data directories have room for its first
    /// segment and its journal's reserve: on a full disk a topic could be made (folders take
    /// only a few blocks) but could take no publish, so the user learns it at the create, with
    /// `ResourceExhausted`, as a publish would tell it.
    fn check_room_for_a_topic(&self, name: &str) -> Result<(), Status> {
        let needed_bytes =
            self.log_config.segment_bytes_initial + self.journal_configs[0].segment_bytes_initial;
        let free: Vec<(usize, u64)> = (0..self.directories.count())
            .filter(|copy| !self.directories.is_fenced(*copy))
            .map(|copy| (copy, self.storage.free_bytes(self.directories.path(copy)).unwrap_or(u64::MAX)))
            .collect();
        if free.iter().filter(|(_, bytes)| *bytes >= needed_bytes).count() >= self.directories.quorum() {
            return Ok(());
        }
        let (copy, bytes) = free.iter().copied().min_by_key(|(_, bytes)| *bytes).unwrap_or((0, 0));
        Err(Status::resource_exhausted(format!(
            "no disk space for topic '{name}': data directory {} has {bytes} bytes available, and a topic \
             needs {needed_bytes} (its first segment and its journal's reserve); acknowledge messages or \
             delete topics to free space",
            self.directories.path(copy).display()
        )))
    }

    /// The rest of `open_topic`: the folders, both logs, and what the journal recovered.
    async fn open_topic_logs(
        &self,
        topic_id: u64,
        name: &str,
        retention_seconds: u64,
        keep_files_open: bool,
        folders: &[PathBuf],
    ) -> Result<ControlOk, Status> {
        let relative = topic_folder(topic_id);
        // Out of space, quota or descriptors says nothing about the data: `ResourceExhausted`,
        // to retry once the resource is back. Anything else failing here is `DataLoss`.
        let failed = |what: String, error: LogError| match error {
            LogError::NoSpace(why) => {
                Status::resource_exhausted(format!("{what}: out of disk space or open files: {why}"))
            }
            error => Status::new(ErrorCode::DataLoss, format!("{what}: {error}")),
        };
        self.storage.create_dirs_durable(folders).await.map_err(|error| {
            let what = format!("topic '{name}': making its folders");
            if crate::log::is_no_space(&error) {
                failed(what, LogError::NoSpace(error.to_string()))
            } else {
                failed(what, LogError::Io(error.to_string()))
            }
        })?;
        let (log, report) = Log::open(
            self.storage.clone(),
            self.directories.clone(),
            &relative.join("messages"),
            topic_id,
            self.log_config.clone(),
        )
        .await
        .map_err(|error| failed(format!("topic '{name}'"), error))?;
        report_recovery(name, "messages", &report);
        let journal_config = self.journal_configs[usize::from(!keep_files_open)].clone();
        let (journal, report) = Log::open(
            self.storage.clone(),
            self.directories.clone(),
            &journal_folder(topic_id),
            journal_log_id(topic_id),
            journal_config.clone(),
        )
        .await
        .map_err(|error| failed(format!("topic '{name}' journal"), error))?;
        report_recovery(name, "journal", &report);
        // Each subscription's acknowledgements and seeks, in order, applied when the router
        // attaches it with the sync point the catalog recorded.
        let mut recovered: HashMap<u64, Vec<JournalEntry>, IdHasher> = HashMap::default();
        let mut snapshots: HashMap<u64, SnapshotState, IdHasher> = HashMap::default();
        for stored in journal.read_all(0).await.map_err(log_error_status)? {
            let entry = JournalEntry::decode(&stored.data).map_err(|why| {
                Status::new(
                    ErrorCode::DataLoss,
                    format!("topic '{name}' journal entry {}: {why}", stored.offset),
                )
            })?;
            match entry {
                // The sync point lives in the catalog; checkpoints restate it for reference.
                JournalEntry::SubscriptionCreated { .. } => {}
                JournalEntry::SubscriptionDeleted { subscription_id } => {
                    recovered.remove(&subscription_id);
                }
                JournalEntry::Seek { subscription_id, .. }
                | JournalEntry::Acked { subscription_id, .. }
                | JournalEntry::DeadlineExtended { subscription_id, .. } => {
                    recovered.entry(subscription_id).or_default().push(entry);
                }
                JournalEntry::SnapshotTaken { snapshot_id, floor, runs, expire_time_ms } => {
                    snapshots.insert(snapshot_id, SnapshotState { floor, runs, expire_time_ms });
                }
                JournalEntry::SnapshotDropped { snapshot_id } => {
                    snapshots.remove(&snapshot_id);
                }
            }
        }
        // An empty journal is opened again when a subscriber first acknowledges something.
        let slot = if journal.is_empty() {
            JournalSlot::Closed
        } else {
            let mut open = OpenJournal::new(journal);
            open.recovered = recovered;
            open.snapshots = snapshots;
            JournalSlot::Open(open)
        };
        let journal = LazyJournal {
            log: RefCell::new(slot),
            config: journal_config,
            opened: self.journal_opened.clone(),
        };
        let name: Rc<str> = name.into();
        let topic = Rc::new(TopicState {
            id: topic_id,
            name: name.clone(),
            log,
            journal,
            subscriptions: RefCell::default(),
            retention_seconds: Cell::new(retention_seconds),
            published: RefCell::default(),
            journal_reserve: Cell::new(JournalReserve::Untried),
            reserve_done: Notify::new(),
            deleted: Cell::new(false),
        });
        self.topics.borrow_mut().insert(name, topic.clone());
        self.topics_by_id.borrow_mut().insert(topic_id, topic);
        Ok(ControlOk::Done)
    }

    /// A topic's durable end offset: a new subscription's sync point. Every publish
    /// acknowledged after the router answers the create has an offset at or above it, because
    /// offsets are assigned at commit.
    fn durable_end(&self, topic_id: u64) -> Result<ControlOk, Status> {
        if let Some((topic_name, why)) = self.quarantined.borrow().topics.get(&topic_id) {
            return Err(quarantined_status("topic", topic_name, why));
        }
        let topic = self.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
            Status::internal(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
        })?;
        Ok(ControlOk::SubscriptionStart(topic.log.end_offset()))
    }

    async fn attach_subscription(
        &self,
        subscription_id: u64,
        name: String,
        topic_id: u64,
        settings: SubscriptionSettings,
        create: bool,
        start_offset: u64,
    ) -> Result<ControlOk, Status> {
        let quarantined = self.quarantined.borrow().topics.get(&topic_id).cloned();
        if let Some((topic_name, why)) = quarantined {
            if create {
                return Err(quarantined_status("topic", &topic_name, &why));
            }
            self.quarantined.borrow_mut().subscriptions.insert(name.into(), (topic_id, why));
            return Ok(ControlOk::Done);
        }
        let topic = self.topics_by_id.borrow().get(&topic_id).cloned().ok_or_else(|| {
            Status::internal(format!("topic {topic_id:x} is not attached to shard {}", self.shard))
        })?;
        let ack_deadline = Duration::from_secs(settings.ack_deadline_seconds as u64);
        let mut state = if create {
            // The sync point: every publish acknowledged after the router answers the create
            // has an offset at or above the durable end now, because offsets are assigned at
            // commit. The router records it in the catalog before it answers, so an idle topic
            // needs no journal (and no open journal file) for its subscriptions.
            SubscriptionState::new(subscription_id, topic.log.end_offset(), ack_deadline)
        } else {
            let mut state = SubscriptionState::new(subscription_id, start_offset, ack_deadline);
            let mut extended: HashMap<u64, u64> = HashMap::new();
            let recovered = topic.journal.with_open(|open| open.recovered.remove(&subscription_id));
            for entry in recovered.flatten().unwrap_or_default() {
                match entry {
                    JournalEntry::Seek { offset, .. } => {
                        state.seek(offset);
                        extended.clear();
                    }
                    JournalEntry::Acked { runs, .. } => {
                        for (first, count) in runs {
                            for offset in first..first + count as u64 {
                                state.restore_ack(offset);
                            }
                        }
                    }
                    JournalEntry::DeadlineExtended { runs, until_ms, .. } => {
                        for (first, count) in runs {
                            for offset in first..first + count as u64 {
                                extended.insert(offset, until_ms);
                            }
                        }
                    }
                    _ => {}
                }
            }
            // Leases extended before the restart run on: the wall clock is the only clock
            // that spans a restart, so the remaining time is measured on it, once.
            let (now, wall_ms) = (self.clock.now(), self.clock.wall_ms());
            for (offset, until_ms) in extended {
                if until_ms > wall_ms {
                    state.restore_lease(offset, now + Duration::from_millis(until_ms - wall_ms));
                }
            }
            state
        };
        state.ack_deadline = ack_deadline;
        state.policy = delivery_policy(&settings);
        state.forget_before(topic.log.start_offset());
        let start = state.start_offset;
        let filter = if settings.filter.is_empty() {
            None
        } else {
            Some(Box::new(crate::filter::Filter::parse(&settings.filter).map_err(|error| {
                Status::invalid_argument(format!("filter of subscription '{name}': {error}"))
            })?))
        };
        let name: Rc<str> = name.into();
        let entry = Rc::new(SubscriptionEntry {
            id: subscription_id,
            name: name.clone(),
            topic_id,
            dead_letter_topic: RefCell::new(dead_letter_topic(&settings)),
            message_retention_seconds: Cell::new(settings.message_retention_seconds),
            retain_acked_messages: Cell::new(settings.retain_acked_messages),
            state: RefCell::new(state),
            filter,
            changed: Notify::new(),
            dead_lettering: Cell::new(false),
            detached: Cell::new(false),
            last_activity_ms: Cell::new(self.clock.wall_ms()),
            delivered: RefCell::default(),
            acked: RefCell::default(),
        });
        topic.subscriptions.borrow_mut().push(entry.clone());
        self.subscriptions.borrow_mut().insert(name, (entry, topic));
        Ok(ControlOk::SubscriptionStart(start))
    }

    /// A topic and one of its subscriptions, both attached here.
    fn attached(
        &self,
        topic_id: u64,
        subscription_id: u64,
    ) -> Result<(Rc<TopicState<S>>, Rc<SubscriptionEntry>), Status> {
        let topic = self.topics_by_id.borrow().get(&topic_id).cloned();
        let topic = topic.ok_or_else(|| match self.quarantined.borrow().topics.get(&topic_id) {
            Some((name, why)) => quarantined_status("topic", name, why),
            None => Status::internal(format!("topic {topic_id:x} is not attached")),
        })?;
        let entry = topic.subscriptions.borrow().iter().find(|entry| entry.id == subscription_id).cloned();
        let entry = entry.ok_or_else(|| Status::internal("the subscription is not attached"))?;
        Ok((topic, entry))
    }

    fn topic(&self, name: &str) -> Result<Rc<TopicState<S>>, Status> {
        self.topics.borrow().get(name).cloned().ok_or_else(|| {
            match self.quarantined.borrow().topic_names.get(name) {
                Some(why) => quarantined_status("topic", name, why),
                None => not_owner("topic", name),
            }
        })
    }

    fn subscription(&self, name: &str) -> Result<Served<S>, Status> {
        self.subscriptions.borrow().get(name).cloned().ok_or_else(|| {
            match self.quarantined.borrow().subscriptions.get(name) {
                Some((_, why)) => quarantined_status("subscription", name, why),
                None => not_owner("subscription", name),
            }
        })
    }

    async fn publish(&self, body: FrameBuffer) -> Result<PublishResponse, Status> {
        let request = access_body::<PublishRequest>(&body)?;
        ringpost_wire::validate::validate_publish(request)?;
        let started = crate::runtime::now();
        let topic = self.topic(request.topic.as_str())?;
        let encoded_bytes = request
            .messages
            .iter()
            .map(|message| {
                record::record_bytes(
                    message.data.len(),
                    message.attributes.iter().map(|a| (a.key.len(), a.value.len())),
                    message.ordering_key.len(),
                )
            })
            .sum();
        let count = request.messages.len() as u32;
        // The messages stay in the request's frame until their commit is built, and are encoded
        // straight into its buffer.
        let records = PublishRecords { body, publish_time_ms: self.clock.wall_ms(), encoded_bytes };
        let (first, count) =
            topic.log.append_records(Records::Deferred(Box::new(records)), count).await.map_err(|error| {
                if matches!(error, LogError::NoSpace(_)) {
                    self.release_kept_files();
                }
                log_error_status(error)
            })?;
        crate::latency::record_publish(started);
        self.collect_after_roll(&topic);
        if topic.journal_reserve.get() == JournalReserve::Untried && topic.journal.opened().is_none() {
            // The topic now holds something to acknowledge: its journal reserves its space, in
            // the background (an allocation and two syncs).
            let topic = topic.clone();
            crate::runtime::spawn(async move {
                if let Err(error) = topic.reserve_journal_space().await {
                    eprintln!("ringpostd: reserving journal space for topic '{}': {error}", topic.name);
                }
            })
            .detach();
        }
        Ok(PublishResponse { message_ids: (first..first + count as u64).collect() })
    }

    async fn pull(&self, header: &FrameHeader, body: &[u8]) -> Result<Response, Status> {
        let request = access_body::<PullRequest>(body)?;
        let max_messages = request.max_messages.to_native();
        if max_messages == 0 || max_messages > PULL_MESSAGES_MAX {
            return Err(Status::invalid_argument(format!(
                "max_messages is {max_messages}; it must be 1 to {PULL_MESSAGES_MAX} (PULL_MESSAGES_MAX)"
            )));
        }
        let wait_ms = request.wait_ms.to_native();
        if wait_ms > PULL_WAIT_MS_MAX {
            return Err(Status::invalid_argument(format!(
                "wait_ms is {wait_ms}; the limit is {PULL_WAIT_MS_MAX} (PULL_WAIT_MS_MAX)"
            )));
        }
        let (subscription, topic) = self.subscription(request.subscription.as_str())?;
        subscription.last_activity_ms.set(self.clock.wall_ms());
        let give_up_at = self.clock.now() + Duration::from_millis(wait_ms as u64);
        let lease = subscription.state.borrow().ack_deadline;
        loop {
            if subscription.detached.get() {
                return Err(subscription.deleted());
            }
            if self.stop.is_given() {
                // Stopping: answer with nothing rather than hold the caller until its wait ends.
                return Ok(respond(header, &PullResponse::default()).into());
            }
            let committed = topic.log.committed();
            let changed = subscription.changed.notified();
            let now = self.clock.now();
            // The response's bytes come out of the shard's budget for pulls and streams first
            // (`STREAM_RESERVED_BYTES_SHARD_MAX`): a thousand pulls of large messages at once
            // would otherwise each hold a full response. Without room, nothing is leased and
            // the pull waits (expired leases are still taken back, and its wait still ends).
            let reservation = crate::net::StreamReservation::try_new(PULL_RESPONSE_BYTES_MAX);
            let waiting_for_budget = reservation.is_none();
            let deliveries = match reservation {
                Some(_) => subscription.state.borrow_mut().pull_for(
                    now,
                    max_messages as usize,
                    topic.log.end_offset(),
                    0,
                    lease,
                ),
                None => {
                    subscription.state.borrow_mut().expire(now);
                    Vec::new()
                }
            };
            self.start_dead_lettering(&subscription, &topic);
            if let (false, Some(mut reservation)) = (deliveries.is_empty(), reservation) {
                if let Some(frame) =
                    self.read_deliveries(&subscription, &topic, deliveries, None, header, 0).await?
                {
                    reservation.fit_to(frame.wire_bytes());
                    return Ok(Response::Reserved(Box::new(frame), reservation));
                }
                // Everything read was filtered out or held behind its ordering key: look again.
                continue;
            }

            if now >= give_up_at {
                return Ok(respond(header, &PullResponse::default()).into());
            }
            // Wait for a commit, a lease or backoff to end, an ack, or the caller's deadline.
            // `pull_for` took back expired leases, so the next deadline is after `now`.
            let mut wake_at = give_up_at;
            if let Some(deadline) = subscription.state.borrow().next_deadline() {
                wake_at = wake_at.min(deadline);
            }
            let sleep = sleep_until(now, wake_at);
            let budget_freed = async {
                match waiting_for_budget {
                    true => crate::net::StreamReservation::freed().await,
                    false => std::future::pending().await,
                }
            };
            // A stop wakes it through `changed` (`wake_for_stop`).
            let wake = futures_lite::future::or(committed, changed);
            futures_lite::future::or(futures_lite::future::or(wake, sleep), budget_freed).await;
        }
    }

    /// A streaming pull: pushes batches while the stream's flow-control window has room, until
    /// the connection goes away; then its outstanding messages are delivered again at once.
    async fn streaming_pull(
        &self,
        header: &FrameHeader,
        body: &[u8],
        responder: &Responder,
    ) -> Result<Response, Status> {
        let request = access_body::<StreamingPullRequest>(body)?;
        let (subscription, topic) = self.subscription(request.subscription.as_str())?;
        let lease = match request.stream_ack_deadline_seconds.to_native() {
            0 => subscription.state.borrow().ack_deadline,
            seconds => {
                Duration::from_secs(ringpost_wire::validate::effective_ack_deadline_seconds(seconds)? as u64)
            }
        };
        let max_messages = match request.max_outstanding_messages.to_native() {
            0 => u64::MAX,
            limit => limit,
        };
        let max_bytes = match request.max_outstanding_bytes.to_native() {
            0 => u64::MAX,
            limit => limit,
        };
        let stream = self.next_stream.get();
        self.next_stream.set(stream + 1);
        subscription.last_activity_ms.set(self.clock.wall_ms());
        // An empty first batch tells the client the stream is taken (a refusal is an error).
        let accepted = ringpost_wire::encode_frame(
            header.command,
            ringpost_wire::frame::FLAG_RESPONSE | ringpost_wire::frame::FLAG_MORE,
            header.request_id,
            &PullResponse::default(),
        );
        if !responder.send_more(accepted, None).await {
            return Ok(respond(header, &PullResponse::default()).into());
        }
        loop {
            if self.stop.is_given() {
                // Checked before the peer: a stopping shard also stops reading the connection,
                // which looks like the peer going, and the client must see a status it retries
                // on rather than a stream that ended as if it had asked.
                subscription.state.borrow_mut().close_stream(stream);
                subscription.changed.notify_all();
                return Err(Status::unavailable(
                    "ringpostd is stopping; open the stream again (its messages are delivered again)",
                ));
            }
            if responder.is_gone() {
                break;
            }
            if subscription.detached.get() {
                subscription.state.borrow_mut().close_stream(stream);
                return Err(subscription.deleted());
            }
            let committed = topic.log.committed();
            let changed = subscription.changed.notified();
            let now = self.clock.now();
            // Expired leases are taken back first, whether this stream has room or not: they
            // free room here (an expired lease leaves its stream's window), they go to other
            // streams and pulls (woken below), and they move the next deadline past `now`.
            // A full stream that skipped this slept zero on a deadline in the past and spun,
            // holding the shard's core with every topic it serves.
            let (load, expired) = {
                let mut state = subscription.state.borrow_mut();
                let expired = state.expire(now);
                (state.stream_load(stream), expired)
            };
            if expired > 0 {
                subscription.changed.notify_all();
            }
            let room = max_messages.saturating_sub(load.messages).min(PULL_MESSAGES_MAX as u64) as usize;
            let bytes_room = max_bytes.saturating_sub(load.bytes);
            // The next frame's bytes come out of the shard's budget for streams before anything
            // is leased or read; without room there, the stream waits with its messages in the
            // log (leases still expire above).
            let (mut reservation, mut waiting_for_budget) = (None, false);
            let deliveries = if room > 0 && bytes_room > 0 {
                let want = bytes_room.min(PULL_RESPONSE_BYTES_MAX as u64) as usize;
                // Twice: while a response is built, the batches read and the frame copied from
                // them are both held; once it is built, only the frame.
                reservation = crate::net::StreamReservation::try_new(2 * want);
                match reservation {
                    Some(_) => subscription.state.borrow_mut().pull_for(
                        now,
                        room,
                        topic.log.end_offset(),
                        stream,
                        lease,
                    ),
                    None => {
                        waiting_for_budget = true;
                        Vec::new()
                    }
                }
            } else {
                Vec::new()
            };
            self.start_dead_lettering(&subscription, &topic);
            if let (false, Some(mut reservation)) = (deliveries.is_empty(), reservation.take()) {
                // The first message always fits an empty window, so one larger than the window
                // cannot stall the stream forever.
                let budget = if load.messages == 0 { bytes_room.max(1) } else { bytes_room };
                let budget = budget.min((reservation.bytes() / 2).max(1) as u64);
                let more = ringpost_wire::frame::FLAG_MORE;
                let frame = match self
                    .read_deliveries(&subscription, &topic, deliveries, Some(budget), header, more)
                    .await
                {
                    Ok(frame) => frame,
                    Err(status) => {
                        subscription.state.borrow_mut().close_stream(stream);
                        return Err(status);
                    }
                };
                if let Some(frame) = frame {
                    reservation.fit_to(frame.wire_bytes());
                    // A stop while it waited for room is seen at the top of the loop.
                    if !responder.send_more(frame, Some(reservation)).await && !self.stop.is_given() {
                        break;
                    }
                }
                continue;
            }
            let mut wake_at = now + STREAM_IDLE_CHECK;
            if let Some(deadline) = subscription.state.borrow().next_deadline() {
                wake_at = wake_at.min(deadline);
            }
            let sleep = sleep_until(now, wake_at);
            let wake = futures_lite::future::or(futures_lite::future::or(committed, changed), sleep);
            // A stop ends the connection's reading, which wakes this through `gone`; the stop
            // is checked first above. (Waiting on the stop order itself would register every
            // idle stream with one shard-wide notifier.)
            let ended = responder.gone();
            let budget_freed = async {
                match waiting_for_budget {
                    true => crate::net::StreamReservation::freed().await,
                    false => std::future::pending().await,
                }
            };
            futures_lite::future::or(futures_lite::future::or(wake, ended), budget_freed).await;
        }
        subscription.state.borrow_mut().close_stream(stream);
        subscription.changed.notify_all();
        Ok(respond(header, &PullResponse::default()).into())
    }

    /// Turns leased offsets into a response frame: reads them (every byte checksummed),
    /// acknowledges those the filter rejects, holds back those whose ordering key is busy, and
    /// stops at the response size limit or the stream's byte budget, giving back what does not
    /// fit. The frame is gathered (`encode_gathered`): each message's data stays in the batch
    /// it was read into, which the frame holds until the socket takes it, so the data is copied
    /// only by the kernel; no allocation per message. None when no message is left to send.
    async fn read_deliveries(
        &self,
        subscription: &SubscriptionEntry,
        topic: &TopicState<S>,
        mut deliveries: Vec<crate::subscription::Delivery>,
        bytes_budget: Option<u64>,
        header: &FrameHeader,
        more: u16,
    ) -> Result<Option<Response>, Status> {
        deliveries.sort_by_key(|delivery| delivery.offset);
        let byte_limit = bytes_budget.unwrap_or(u64::MAX).min(PULL_RESPONSE_BYTES_MAX as u64) as usize;
        let offsets: Vec<u64> = deliveries.iter().map(|delivery| delivery.offset).collect();
        let give_back = |deliveries: Vec<crate::subscription::Delivery>, error: LogError| {
            let mut state = subscription.state.borrow_mut();
            for delivery in deliveries {
                state.release(delivery);
            }
            log_error_status(error)
        };
        // Only as many batches as the response can carry are read: a thousand leased messages
        // of 1 MB each were all read, and held, for a response of twelve.
        let (batches, covered) = match topic.log.hold_offsets(&offsets, byte_limit).await {
            Ok(held) => held,
            Err(error) => return Err(give_back(deliveries, error)),
        };
        let unread = deliveries.split_off(covered);
        if !unread.is_empty() {
            let mut state = subscription.state.borrow_mut();
            for delivery in unread {
                state.release(delivery);
            }
        }
        let offsets = &offsets[..covered];
        // Only the span the deliveries cover is parsed; the walk below skips the records inside
        // it that are not delivered (acknowledged already, or leased elsewhere).
        let wanted = crate::log::span(offsets);
        let mut records = Vec::with_capacity(offsets.len());
        for batch in &batches {
            match batch.records_in(wanted.clone()) {
                Ok(views) => records.extend(views),
                Err(error) => return Err(give_back(deliveries, error)),
            }
        }
        // Both are in offset order: walk them together.
        let mut records = records.into_iter().peekable();
        let mut chosen = Vec::with_capacity(deliveries.len());
        // Every ack id of the response in one string; each message takes its span.
        let mut ack_ids = String::with_capacity(deliveries.len() * 24);
        let mut filtered_out = Vec::new();
        let mut bytes = 0usize;
        {
            let mut state = subscription.state.borrow_mut();
            for delivery in deliveries {
                while records.next_if(|record| record.offset < delivery.offset).is_some() {}
                let Some(record) = records.next_if(|record| record.offset == delivery.offset) else {
                    // Below the log's start: removed by retention. Nothing to deliver.
                    state.apply_ack(delivery.offset);
                    continue;
                };
                if let Some(filter) = &subscription.filter {
                    if !filter.matches(record.attributes()) {
                        filtered_out.push(delivery.offset);
                        continue;
                    }
                }
                let size = record.data.len()
                    + record.ordering_key.len()
                    + record.attributes().map(|(k, v)| k.len() + v.len() + 16).sum::<usize>();
                if !chosen.is_empty() && bytes + size > byte_limit {
                    state.release(delivery);
                    continue;
                }
                if !state.admit(delivery, record.ordering_key) {
                    continue;
                }
                bytes += size;
                state.account(delivery.offset, size as u64);
                let ack_id = AckId {
                    subscription_id: subscription.id,
                    offset: delivery.offset,
                    generation: delivery.generation,
                };
                let start = ack_ids.len();
                ack_id.encode_into(&mut ack_ids);
                chosen.push((record, start..ack_ids.len(), delivery.attempt));
            }
        }
        // The frame holds only the batches it sends from: the others (their messages did not
        // fit, were filtered out or wait behind their ordering key) go now.
        let sends_from: Vec<bool> = batches
            .iter()
            .map(|batch| {
                let (first, end) = (batch.base_offset(), batch.end_offset());
                let at = chosen.partition_point(|(record, _, _)| record.offset < first);
                chosen.get(at).is_some_and(|(record, _, _)| record.offset < end)
            })
            .collect();
        let sources: Vec<&[u8]> = batches
            .iter()
            .zip(&sends_from)
            .filter(|(_, sends)| **sends)
            .map(|(batch, _)| batch.bytes())
            .collect();
        // Batches read in one extent share its buffer, and their slices end where it ends:
        // each buffer counts once, by its first (longest) slice.
        let mut buffer_ends = Vec::with_capacity(sources.len());
        let charges: Vec<usize> = sources
            .iter()
            .map(|source| {
                let end = source.as_ptr() as usize + source.len();
                if buffer_ends.contains(&end) {
                    return 0;
                }
                buffer_ends.push(end);
                source.len()
            })
            .collect();
        let held_bytes: usize = charges.iter().sum();
        let encoded = (!chosen.is_empty()).then(|| {
            let response = PullResponseRef {
                received_messages: chosen
                    .iter()
                    .map(|(record, ack_id, attempt)| ReceivedMessageRef {
                        ack_id: StrRef(&ack_ids[ack_id.clone()]),
                        message_id: record.offset,
                        publish_time_ms: record.publish_time_ms,
                        data: BytesRef(record.data),
                        attributes: record
                            .attributes()
                            .map(|(key, value)| AttributeRef { key: StrRef(key), value: StrRef(value) })
                            .collect(),
                        ordering_key: StrRef(record.ordering_key),
                        delivery_attempt: *attempt,
                    })
                    .collect(),
            };
            let flags = ringpost_wire::frame::FLAG_RESPONSE | more;
            let estimate = FRAME_HEADER_BYTES + response.encoded_bytes_estimate();
            // What is not data, and data too short to be left in place, is copied.
            let (gathered_runs, gathered_bytes) = response
                .received_messages
                .iter()
                .map(|message| message.data.0.len())
                .filter(|&length| length >= GATHER_RUN_BYTES_MIN)
                .fold((0, 0), |(runs, bytes), length| (runs + 1, bytes + length));
            if gathered_bytes > 0 && gathering_has_room(held_bytes) {
                let body = encode_gathered(
                    header.command,
                    flags,
                    header.request_id,
                    &response,
                    &sources,
                    estimate - gathered_bytes,
                    gathered_runs,
                );
                Encoded::Gathered(body)
            } else {
                Encoded::Whole(ringpost_wire::encode_frame_sized(
                    header.command,
                    flags,
                    header.request_id,
                    &response,
                    estimate,
                ))
            }
        });
        let frame = encoded.map(|encoded| match encoded {
            Encoded::Gathered(body) => {
                let owners = batches
                    .into_iter()
                    .zip(sends_from)
                    .filter_map(|(batch, sends)| sends.then_some(batch))
                    .zip(charges)
                    .map(|(batch, charge)| Held::new(Box::new(batch), charge))
                    .collect();
                Response::Gathered(body.holding(owners))
            }
            Encoded::Whole(frame) => Response::Frame(frame),
        });
        if !filtered_out.is_empty() {
            // Messages the filter rejects are acknowledged, durably, as Pub/Sub does.
            let entry =
                JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&filtered_out) };
            match topic.append_journal(&entry).await {
                Ok(()) => {
                    let mut state = subscription.state.borrow_mut();
                    for offset in filtered_out {
                        state.apply_ack(offset);
                    }
                }
                Err(error) => eprintln!("ringpostd: acknowledging filtered-out messages: {error}"),
            }
            subscription.changed.notify_all();
        }
        Ok(frame)
    }

    /// Publishes the subscription's exhausted messages to its dead-letter topic (through the
    /// router, to whichever forwarder owns it), then acknowledges them here. Runs as its own
    /// task, one at a time per subscription.
    fn start_dead_lettering(&self, subscription: &Rc<SubscriptionEntry>, topic: &Rc<TopicState<S>>) {
        if subscription.dead_letter_topic.borrow().is_none() || subscription.dead_lettering.get() {
            return;
        }
        let offsets = subscription.state.borrow_mut().take_dead_letters();
        if offsets.is_empty() {
            return;
        }
        subscription.dead_lettering.set(true);
        let address = self.router_address.borrow().clone();
        let cache = self.dead_letter_client.clone();
        let (subscription, topic) = (subscription.clone(), topic.clone());
        crate::runtime::spawn(async move {
            let result = dead_letter(address, cache, &subscription, &topic, &offsets).await;
            if let Err(error) = result {
                eprintln!(
                    "ringpostd: dead-lettering {} messages of subscription '{}' to '{}' failed, will retry: {error}",
                    offsets.len(),
                    subscription.name,
                    subscription.dead_letter_topic.borrow().as_deref().unwrap_or_default()
                );
                crate::runtime::sleep(DEAD_LETTER_RETRY).await;
                let mut state = subscription.state.borrow_mut();
                for offset in offsets {
                    state.return_dead_letter(offset);
                }
            }
            subscription.dead_lettering.set(false);
            subscription.changed.notify_all();
        })
        .detach();
    }

    /// Tells the forwarder where the router listens, once it does.
    pub fn set_router_address(&self, address: String) {
        *self.router_address.borrow_mut() = Some(address);
    }

    async fn acknowledge(&self, body: &[u8]) -> Result<AckResponse, Status> {
        let request = access_body::<AcknowledgeRequest>(body)?;
        check_ack_id_count(request.ack_ids.len())?;
        let (subscription, topic) = self.subscription(request.subscription.as_str())?;
        subscription.last_activity_ms.set(self.clock.wall_ms());
        let mut response = AckResponse::default();
        let mut offsets = Vec::new();
        {
            let mut state = subscription.state.borrow_mut();
            for ack_id in request.ack_ids.iter() {
                match state.check_ack(ack_id.as_str()) {
                    Ok(Some(offset)) => {
                        state.leave_window(offset);
                        offsets.push(offset);
                    }
                    Ok(None) => {}
                    Err(refusal) => response.invalid_ack_ids.push(InvalidAckId {
                        ack_id: ack_id.as_str().chars().take(ACK_ID_BYTES_MAX).collect(),
                        reason: refusal.reason().to_owned(),
                    }),
                }
            }
        }
        if offsets.is_empty() {
            return Ok(response);
        }
        // The stream may send more while the acknowledgements become durable.
        subscription.changed.notify_all();
        offsets.sort_unstable();
        offsets.dedup();
        // Durable first: an acknowledgement confirmed to the subscriber never comes back.
        let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&offsets) };
        topic.append_journal(&entry).await.map_err(|error| {
            // The journal's reserve is gone too: the files kept for later rolls go, so that the
            // retry finds room.
            if matches!(error, LogError::NoSpace(_)) {
                self.release_kept_files();
            }
            log_error_status(error)
        })?;
        let mut state = subscription.state.borrow_mut();
        for offset in offsets {
            state.apply_ack(offset);
        }
        drop(state);
        subscription.changed.notify_all();
        Ok(response)
    }

    async fn modify_ack_deadline(&self, body: &[u8]) -> Result<AckResponse, Status> {
        let request = access_body::<ModifyAckDeadlineRequest>(body)?;
        check_ack_id_count(request.ack_ids.len())?;
        let seconds = request.ack_deadline_seconds.to_native();
        if seconds > MODIFY_ACK_DEADLINE_SECONDS_MAX {
            return Err(Status::invalid_argument(format!(
                "ack deadline of {seconds} s is outside 0 to {MODIFY_ACK_DEADLINE_SECONDS_MAX} s (MODIFY_ACK_DEADLINE_SECONDS_MAX)"
            )));
        }
        let (subscription, topic) = self.subscription(request.subscription.as_str())?;
        if seconds > 0 {
            // An extension confirmed to the subscriber survives a restart: journal it first.
            let mut offsets: Vec<u64> = {
                let state = subscription.state.borrow();
                request
                    .ack_ids
                    .iter()
                    .filter_map(|ack_id| state.check_ack(ack_id.as_str()).ok().flatten())
                    .collect()
            };
            if !offsets.is_empty() {
                offsets.sort_unstable();
                offsets.dedup();
                let until_ms = self.clock.wall_ms() + seconds as u64 * 1000;
                let entry = JournalEntry::DeadlineExtended {
                    subscription_id: subscription.id,
                    runs: runs_of(&offsets),
                    until_ms,
                };
                topic.append_journal(&entry).await.map_err(log_error_status)?;
            }
        }
        let now = self.clock.now();
        let mut response = AckResponse::default();
        {
            let mut state = subscription.state.borrow_mut();
            for ack_id in request.ack_ids.iter() {
                if let Err(refusal) = state.modify_deadline(ack_id.as_str(), seconds, now) {
                    response.invalid_ack_ids.push(InvalidAckId {
                        ack_id: ack_id.as_str().chars().take(ACK_ID_BYTES_MAX).collect(),
                        reason: refusal.reason().to_owned(),
                    });
                }
            }
        }
        self.start_dead_lettering(&subscription, &topic);
        subscription.changed.notify_all();
        Ok(response)
    }

    /// Ends expired leases of every subscription, starts dead-lettering what used up its
    /// attempts, and wakes streams and waiting pulls that can now deliver. Runs every
    /// `LEASE_SWEEP_INTERVAL`; pulls also expire leases themselves, so this only matters for
    /// subscriptions nobody is pulling from right now.
    pub fn sweep_leases(&self) {
        let now = self.clock.now();
        // The same tick samples the counters behind the rates in the stats.
        self.rate_ticks.borrow_mut().tick(now);
        for topic in self.topics_by_id.borrow().values() {
            topic.published.borrow_mut().sample(topic.log.end_offset());
            topic.log.release_idle_cache();
        }
        self.trim_memory_once_quiet();
        let served: Vec<Served<S>> = self.subscriptions.borrow().values().cloned().collect();
        for (subscription, topic) in served {
            {
                let mut state = subscription.state.borrow_mut();
                subscription.delivered.borrow_mut().sample(state.delivered_total);
                subscription.acked.borrow_mut().sample(state.acked_total);
                state.release_if_idle();
            }
            let due = subscription.state.borrow().next_deadline().is_some_and(|deadline| deadline <= now);
            if due {
                subscription.state.borrow_mut().expire(now);
                subscription.changed.notify_all();
            }
            self.start_dead_lettering(&subscription, &topic);
        }
    }

    /// Counts quiet sweeps since the last request and trims malloc's free memory once, after
    /// `QUIET_SWEEPS_BEFORE_TRIM` of them; a request starts the count again.
    fn trim_memory_once_quiet(&self) {
        let requests = self.requests.get();
        if requests != self.requests_at_sweep.replace(requests) {
            self.quiet_sweeps.set(Some(0));
            return;
        }
        if let Some(quiet) = self.quiet_sweeps.get() {
            if quiet + 1 >= QUIET_SWEEPS_BEFORE_TRIM {
                crate::process::release_free_memory();
                self.quiet_sweeps.set(None);
            } else {
                self.quiet_sweeps.set(Some(quiet + 1));
            }
        }
    }

    /// Deletes the oldest segments nobody needs any more. A closed segment goes when no
    /// retention keeps it: the topic's `message_retention_duration` (if set) has passed for its
    /// newest message, and for every subscription either its ack floor passed the segment (unless
    /// it retains acknowledged messages) or the subscription's own retention expired. A topic
    /// without subscriptions and without retention keeps nothing: no one can ever receive it.
    pub async fn collect_segments(&self) {
        let now_ms = self.clock.wall_ms();
        let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
        for topic in topics {
            if let Err(error) = self.compact_journal(&topic).await {
                eprintln!("ringpostd: compacting the journal of topic '{}': {error}", topic.name);
            }
            Self::remove_unneeded_segments(&topic, now_ms).await;
            // After the deletions, which may have given back the space a journal's roll on a
            // full disk took from its reserve. Quiet while the disk stays full: the journal
            // goes on with the room its segment has.
            let wants_reserve = topic.journal.opened().is_some_and(|journal| !journal.has_reserve())
                || (topic.journal_reserve.get() != JournalReserve::Made && !topic.log.is_empty());
            if wants_reserve {
                let _ = topic.reserve_journal_space().await;
            }
        }
    }

    /// After a publish whose commit rolled the topic's log: deletes what no one needs without
    /// waiting for the next sweep, in the background, so that the log's next roll finds a file
    /// to recycle (`LogConfig::recycle`). A topic without subscriptions that publishes a
    /// segment a second keeps overwriting the same two files instead of unlinking one each
    /// second and allocating the next.
    fn collect_after_roll(&self, topic: &Rc<TopicState<S>>) {
        if !topic.log.take_rolled() {
            return;
        }
        let (topic, now_ms) = (topic.clone(), self.clock.wall_ms());
        crate::runtime::spawn(async move { Self::remove_unneeded_segments(&topic, now_ms).await }).detach();
    }

    /// Out of disk space: every topic of the shard gives up the files it holds for later rolls
    /// (a spare, a recycled segment: up to a segment each, which the user's data does not
    /// need), in the background, so that the publisher's retry finds the space.
    /// Once at a time, and only while the shard keeps any: publishers refused by a full disk
    /// retry, and each refusal must not walk every topic again.
    fn release_kept_files(&self) {
        if crate::log::files_kept_on_this_shard() == 0 || self.releasing_kept_files.replace(true) {
            return;
        }
        let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
        let releasing = self.releasing_kept_files.clone();
        crate::runtime::spawn(async move {
            for topic in topics {
                topic.log.discard_spares().await;
            }
            releasing.set(false);
        })
        .detach();
    }

    /// Deletes the oldest segments nobody needs any more (see `collect_segments`).
    async fn remove_unneeded_segments(topic: &TopicState<S>, now_ms: u64) {
        let deletable = {
            let subscriptions = topic.subscriptions.borrow();
            let expired = |newest_ms: u64, seconds: u64| {
                newest_ms.saturating_add(seconds.saturating_mul(1000)) <= now_ms
            };
            topic
                .log
                .closed_segments()
                .iter()
                .take_while(|segment| {
                    let topic_keeps = topic.retention_seconds.get() > 0
                        && !expired(segment.newest_publish_ms, topic.retention_seconds.get());
                    // A live snapshot keeps everything it may seek back to.
                    let snapshot_keeps = topic.journal.with_open(|open| {
                        open.snapshots.values().any(|snapshot| {
                            snapshot.expire_time_ms > now_ms && segment.end_offset > snapshot.floor
                        })
                    });
                    !topic_keeps
                        && snapshot_keeps != Some(true)
                        && subscriptions.iter().all(|entry| {
                            let gone =
                                expired(segment.newest_publish_ms, entry.message_retention_seconds.get());
                            let acked = entry.state.borrow().ack_floor() >= segment.end_offset;
                            gone || (acked && !entry.retain_acked_messages.get())
                        })
                })
                .count()
        };
        if deletable == 0 {
            return;
        }
        match topic.log.remove_oldest(deletable).await {
            Ok(_) => {
                let start = topic.log.start_offset();
                for entry in topic.subscriptions.borrow().iter() {
                    entry.state.borrow_mut().forget_before(start);
                }
            }
            Err(error) => {
                eprintln!("ringpostd: deleting old segments of topic '{}': {error}", topic.name)
            }
        }
    }

    /// Keeps a topic's journal bounded. Once `JOURNAL_CHECKPOINT_BYTES` were written since the
    /// last checkpoint, the state of every subscription and snapshot is restated in one batch
    /// (atomic: a batch commits whole or not at all). Checkpoints only add: a restated creation of
    /// an existing subscription is ignored on replay, and acknowledgements are restated as runs.
    /// Segments are then deleted below the *previous* checkpoint, never the one just written, so
    /// an acknowledgement whose entry was committed but not yet applied when this checkpoint was
    /// captured is still in the journal (and in the next checkpoint).
    async fn compact_journal(&self, topic: &TopicState<S>) -> Result<(), LogError> {
        let Some((journal, last_checkpoint)) =
            topic.journal.with_open(|open| (open.log.clone(), open.checkpoints.back().copied()))
        else {
            return Ok(());
        };
        let since = last_checkpoint.unwrap_or(journal.start_offset());
        let written: u64 = journal
            .closed_segments()
            .iter()
            .filter(|segment| segment.end_offset > since)
            .map(|segment| segment.end_offset - segment.base_offset.max(since))
            .sum::<u64>();
        // Entries, not bytes, are what the segment list gives cheaply; a journal entry averages
        // well under a block, so count each as one block to stay conservative.
        if written * record::BLOCK_BYTES as u64 <= JOURNAL_CHECKPOINT_BYTES
            || journal.closed_segments().len() < 2
        {
            return Ok(());
        }
        let mut entries = Vec::new();
        for entry in topic.subscriptions.borrow().iter() {
            let state = entry.state.borrow();
            entries.push(JournalEntry::SubscriptionCreated {
                subscription_id: entry.id,
                start_offset: state.start_offset,
            });
            let (floor, mut runs) = state.acknowledged_runs();
            if floor > state.start_offset {
                let below = floor - state.start_offset;
                let mut first = state.start_offset;
                let mut remaining = below;
                // Runs count in u32; a long floor is restated in pieces.
                while remaining > 0 {
                    let count = remaining.min(u32::MAX as u64) as u32;
                    runs.insert(0, (first, count));
                    first += count as u64;
                    remaining -= count as u64;
                }
                runs.sort_unstable();
            }
            if !runs.is_empty() {
                entries.push(JournalEntry::Acked { subscription_id: entry.id, runs });
            }
            // Leases restated at their wall-clock end, so extensions outlive the compaction.
            let (now, wall_ms) = (self.clock.now(), self.clock.wall_ms());
            let mut by_end: HashMap<u64, Vec<u64>> = HashMap::new();
            for (offset, deadline) in state.leases() {
                let until_ms = wall_ms + deadline.saturating_duration_since(now).as_millis() as u64;
                by_end.entry(until_ms / 1000 * 1000 + 999).or_default().push(offset);
            }
            for (until_ms, mut offsets) in by_end {
                offsets.sort_unstable();
                entries.push(JournalEntry::DeadlineExtended {
                    subscription_id: entry.id,
                    runs: runs_of(&offsets),
                    until_ms,
                });
            }
        }
        topic.journal.with_open(|open| {
            for (snapshot_id, snapshot) in open.snapshots.iter() {
                entries.push(JournalEntry::SnapshotTaken {
                    snapshot_id: *snapshot_id,
                    floor: snapshot.floor,
                    runs: snapshot.runs.clone(),
                    expire_time_ms: snapshot.expire_time_ms,
                });
            }
        });
        let mut records = Vec::new();
        for entry in &entries {
            record::encode_record_unsealed(&mut records, 0, &entry.encode(), &mut std::iter::empty(), "");
        }
        let (first, _) = journal.append(records, entries.len() as u32).await?;
        let previous = topic.journal.with_open(|open| {
            let checkpoints = &mut open.checkpoints;
            checkpoints.push_back(first);
            if checkpoints.len() > 2 {
                checkpoints.pop_front();
            }
            (checkpoints.len() == 2).then(|| checkpoints[0])
        });
        if let Some(previous) = previous.flatten() {
            journal.remove_before(previous).await?;
        }
        Ok(())
    }

    fn shard_stats(&self) -> ShardStats {
        let (publish_latency, commit_latency) = crate::latency::shard_summaries();
        ShardStats {
            publish_latency,
            commit_latency,
            shard: self.shard,
            topics: self.topics_by_id.borrow().len() as u32,
            directories: directory_status(&self.directories),
            repairs: self.directories.repairs(),
            quarantined: self
                .quarantined
                .borrow()
                .topics
                .values()
                .map(|(name, why)| QuarantinedTopic { name: name.to_string(), reason: why.to_string() })
                .collect(),
        }
    }

    async fn topic_stats(&self) -> Vec<TopicStats> {
        let now_ms = self.clock.wall_ms();
        let topics: Vec<Rc<TopicState<S>>> = self.topics_by_id.borrow().values().cloned().collect();
        let mut out = Vec::with_capacity(topics.len());
        for topic in topics {
            let end = topic.log.end_offset();
            let entries: Vec<Rc<SubscriptionEntry>> = topic.subscriptions.borrow().clone();
            let mut subscriptions = Vec::with_capacity(entries.len());
            for entry in entries {
                let (floor, backlog, outstanding, delivered_total, expired_total) = {
                    let state = entry.state.borrow();
                    (
                        state.ack_floor(),
                        state.backlog(end),
                        state.outstanding(),
                        state.delivered_total,
                        state.expired_total,
                    )
                };
                let oldest_unacked_age_ms = if floor < end {
                    match topic.log.read(floor, 1, usize::MAX).await {
                        Ok(records) => {
                            records.first().map(|r| now_ms.saturating_sub(r.publish_time_ms)).unwrap_or(0)
                        }
                        Err(_) => 0,
                    }
                } else {
                    0
                };
                let idle_ms = if entry.state.borrow().stream_count() > 0 {
                    0
                } else {
                    now_ms.saturating_sub(entry.last_activity_ms.get())
                };
                subscriptions.push(SubscriptionStats {
                    idle_ms,
                    delivered_per_second: entry.delivered.borrow().per_second(&self.rate_ticks.borrow()),
                    acked_per_second: entry.acked.borrow().per_second(&self.rate_ticks.borrow()),
                    name: entry.name.to_string(),
                    backlog_messages: backlog,
                    outstanding_messages: outstanding as u64,
                    delivered_total,
                    expired_total,
                    oldest_unacked_age_ms,
                });
            }
            out.push(TopicStats {
                name: topic.name.to_string(),
                shard: self.shard,
                first_offset: topic.log.start_offset(),
                end_offset: end,
                disk_bytes: topic.log.disk_bytes(),
                published_per_second: topic.published.borrow().per_second(&self.rate_ticks.borrow()),
                subscriptions,
            });
        }
        out
    }

    /// Applies an update the router made durable in the catalog: a topic's retention, or a
    /// subscription's ack deadline (for leases granted from now on: open streams keep the lease
    /// they were opened with), delivery policy (retry backoff, dead letters) and retention. The
    /// filter and message ordering cannot change.
    fn update_settings(&self, topic_id: u64, update: SettingsUpdate) -> Result<ControlOk, Status> {
        if self.quarantined.borrow().topics.contains_key(&topic_id) {
            // Not served; the catalog holds the new settings for when it is again.
            return Ok(ControlOk::Done);
        }
        match update {
            SettingsUpdate::Topic { retention_seconds } => {
                let topic = self.topics_by_id.borrow().get(&topic_id).cloned();
                let topic =
                    topic.ok_or_else(|| Status::internal(format!("topic {topic_id:x} is not attached")))?;
                // Segments are kept or deleted by the new value from the next collection on.
                topic.retention_seconds.set(retention_seconds);
            }
            SettingsUpdate::Subscription { subscription_id, settings } => {
                let (_, entry) = self.attached(topic_id, subscription_id)?;
                {
                    let mut state = entry.state.borrow_mut();
                    state.ack_deadline = Duration::from_secs(settings.ack_deadline_seconds as u64);
                    state.set_policy(delivery_policy(&settings));
                }
                *entry.dead_letter_topic.borrow_mut() = dead_letter_topic(&settings);
                entry.message_retention_seconds.set(settings.message_retention_seconds);
                entry.retain_acked_messages.set(settings.retain_acked_messages);
                // Messages the new policy no longer sends to the dead-letter topic are
                // deliverable again: the pulls and streams waiting on the subscription look.
                entry.changed.notify_all();
            }
        }
        Ok(ControlOk::Done)
    }
}

/// A pull response as `read_deliveries` encoded it.
enum Encoded {
    /// Its data left in the batches read, which the frame will hold.
    Gathered(ringpost_wire::gather::GatheredBody),
    /// Copied whole into its own buffer.
    Whole(FrameBuffer),
}

/// The dead-letter topic a subscription's settings name; `None` without a policy.
fn dead_letter_topic(settings: &SubscriptionSettings) -> Option<Box<str>> {
    (!settings.dead_letter_topic.is_empty()).then(|| settings.dead_letter_topic.as_str().into())
}

/// The delivery policy a subscription's settings ask for.
fn delivery_policy(settings: &SubscriptionSettings) -> crate::subscription::DeliveryPolicy {
    let backoff = (settings.minimum_backoff_seconds > 0 || settings.maximum_backoff_seconds > 0).then(|| {
        (
            settings.minimum_backoff_seconds,
            settings.maximum_backoff_seconds.max(settings.minimum_backoff_seconds),
        )
    });
    crate::subscription::DeliveryPolicy {
        retry_backoff_seconds: backoff,
        max_delivery_attempts: (!settings.dead_letter_topic.is_empty())
            .then_some(settings.max_delivery_attempts.max(1)),
        ordered: settings.enable_message_ordering,
    }
}

async fn dead_letter<S: Storage>(
    address: Option<String>,
    cache: DeadLetterClient,
    subscription: &SubscriptionEntry,
    topic: &TopicState<S>,
    offsets: &[u64],
) -> Result<(), String> {
    let Some(address) = address else { return Err("the router address is not known yet".into()) };
    // Read once: an update may change or remove the policy while the publish is under way.
    let Some(dead_letter_topic) = subscription.dead_letter_topic.borrow().clone() else {
        return Err("the subscription no longer has a dead-letter policy".into());
    };
    let cached = cache.borrow().clone();
    let client = match cached {
        Some(client) => client,
        None => {
            let client = std::sync::Arc::new(
                ringpost_client::Client::connect(&address).await.map_err(|e| e.to_string())?,
            );
            *cache.borrow_mut() = Some(client.clone());
            client
        }
    };
    let records = topic.log.read_offsets(offsets).await.map_err(|e| e.to_string())?;
    let attempts: Vec<u32> = {
        let state = subscription.state.borrow();
        records.iter().map(|record| state.attempts(record.offset)).collect()
    };
    let messages: Vec<ringpost_client::Message> = records
        .iter()
        .zip(attempts)
        .map(|(record, attempts)| {
            let mut message =
                ringpost_client::Message::new(record.data.clone()).ordering_key(record.ordering_key.clone());
            for (key, value) in &record.attributes {
                message = message.attribute(key.clone(), value.clone());
            }
            message
                .attribute(DEAD_LETTER_SOURCE_SUBSCRIPTION, subscription.name.to_string())
                .attribute(DEAD_LETTER_SOURCE_DELIVERY_COUNT, attempts.to_string())
                .attribute(DEAD_LETTER_SOURCE_MESSAGE_ID, record.offset.to_string())
                .attribute(DEAD_LETTER_SOURCE_PUBLISH_TIME, record.publish_time_ms.to_string())
        })
        .collect();
    for chunk in messages.chunks(PUBLISH_BATCH_MESSAGES_MAX / 2) {
        if let Err(error) = client.publish(&dead_letter_topic, chunk.to_vec()).await {
            // A broken connection is opened afresh next time.
            cache.borrow_mut().take();
            return Err(error.to_string());
        }
    }
    // Published durably to the dead-letter topic: now acknowledge on the source, durably too.
    let mut done: Vec<u64> = records.iter().map(|record| record.offset).collect();
    done.sort_unstable();
    let entry = JournalEntry::Acked { subscription_id: subscription.id, runs: runs_of(&done) };
    topic.append_journal(&entry).await.map_err(|e| e.to_string())?;
    let mut state = subscription.state.borrow_mut();
    for offset in done {
        state.apply_ack(offset);
    }
    Ok(())
}

pub fn directory_status(directories: &Directories) -> Vec<DirectoryStatus> {
    directories
        .status()
        .into_iter()
        .map(|(path, fenced)| DirectoryStatus {
            path: path.display().to_string(),
            fenced: fenced.unwrap_or_default(),
        })
        .collect()
}

fn check_ack_id_count(count: usize) -> Result<(), Status> {
    if count == 0 || count > ACK_IDS_PER_REQUEST_MAX {
        return Err(Status::invalid_argument(format!(
            "{count} ack ids; a request carries 1 to {ACK_IDS_PER_REQUEST_MAX} (ACK_IDS_PER_REQUEST_MAX)"
        )));
    }
    Ok(())
}

fn report_recovery(topic: &str, what: &str, report: &RecoveryReport) {
    if let Some((path, position)) = &report.torn_at {
        eprintln!(
            "ringpostd: recovery of topic '{topic}' {what}: cut a torn tail at byte {position} of {} ({} bytes discarded; \
             they were never acknowledged)",
            path.display(),
            report.torn_bytes_discarded
        );
    }
    if report.batches_repaired > 0 {
        eprintln!(
            "ringpostd: recovery of topic '{topic}' {what}: repaired {} batch copies from healthy data directories",
            report.batches_repaired
        );
    }
    if report.empty_segments_removed > 0 {
        eprintln!(
            "ringpostd: recovery of topic '{topic}' {what}: removed {} empty segment(s) created before a crash",
            report.empty_segments_removed
        );
    }
    if report.buffered_io_warning {
        eprintln!("ringpostd: WARNING: topic '{topic}' {what}: O_DIRECT is not in effect on this filesystem");
    }
}

impl<S: Storage> Handler for Forwarder<S> {
    async fn handle(&self, header: FrameHeader, body: FrameBuffer, responder: &Responder) -> Response {
        self.requests.set(self.requests.get() + 1);
        // Every request runs as a task as large as this future, which is as large as its
        // largest arm: the pull and acknowledgement paths' futures are 1.9-2.7 KiB, a publish's
        // 136 bytes. Those are boxed, so that a publish's task is a small allocation rather than
        // a 3 KiB one.
        let result = match Command::from_u16(header.command) {
            Some(Command::StreamingPull) => Box::pin(self.streaming_pull(&header, &body, responder)).await,
            Some(Command::Hello) => Ok(crate::router::hello_response(&header).into()),
            Some(Command::Publish) => {
                self.publish(body).await.map(|response| respond(&header, &response).into())
            }
            Some(Command::Pull) => Box::pin(self.pull(&header, &body)).await,
            Some(Command::Acknowledge) => {
                Box::pin(self.acknowledge(&body)).await.map(|response| respond(&header, &response).into())
            }
            Some(Command::ModifyAckDeadline) => Box::pin(self.modify_ack_deadline(&body))
                .await
                .map(|response| respond(&header, &response).into()),
            Some(command) => Err(Status::failed_precondition(format!(
                "{command:?} is a control-plane command: send it to the router's address, not a forwarder's"
            ))),
            None => Err(Status::new(ErrorCode::Unimplemented, format!("unknown command {}", header.command))),
        };
        result.unwrap_or_else(|status| fail(&header, &status).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::storage::sim::SimDisk;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn run<F: std::future::Future<Output = ()> + 'static>(future: F) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).make().unwrap().run(future);
    }

    fn forwarder(clock: &ManualClock) -> Forwarder<SimDisk> {
        let config = LogConfig {
            segment_bytes_initial: 64 * 1024,
            segment_bytes_max: 64 * 1024,
            ..LogConfig::default()
        };
        Forwarder::new(
            0,
            SimDisk::new(),
            Directories::new(vec!["/d0".into()]),
            config,
            Rc::new(clock.clone()),
        )
    }

    /// Every request runs as a task the size of `handle`'s future, allocated per request: a
    /// publish's must not pay for the pull and acknowledgement paths' larger futures (the
    /// handler's was 2,776 bytes before they were boxed).
    #[test]
    fn a_request_task_stays_small() {
        let forwarder = forwarder(&ManualClock::default());
        let responder = crate::net::Responder::unconnected();
        let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &PublishRequest::default());
        let header = FrameHeader::decode(&frame).unwrap();
        let body = FrameBuffer::with_capacity(0);
        let handling = forwarder.handle(header, body, &responder);
        let bytes = std::mem::size_of_val(&handling);
        assert!(bytes <= 512, "handle's future is {bytes} bytes");
    }

    /// A publish's messages are encoded into the commit's buffer only when it is built: the log
    /// then holds what was published, attributes and ordering keys included, at any length, in
    /// a commit shared with other publishes.
    #[test]
    fn published_messages_are_stored_as_sent() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = Rc::new(forwarder(&clock));
            let topic = topic(&forwarder, 0).await;
            let message = |i: usize| PubsubMessage {
                data: vec![i as u8; 1 + i * 37 % 200],
                attributes: (0..i % 4)
                    .map(|a| Attribute { key: format!("k{a}"), value: "v".repeat(a * 3 + i % 5) })
                    .collect(),
                ordering_key: if i.is_multiple_of(3) { format!("key-{i}") } else { String::new() },
            };
            // Three publishes at once, so that they can share commits.
            let publishes = (0..3).map(|request| {
                let forwarder = forwarder.clone();
                let messages: Vec<PubsubMessage> = (request * 20..request * 20 + 20).map(message).collect();
                let frame = ringpost_wire::encode_frame(
                    Command::Publish.code(),
                    0,
                    1,
                    &PublishRequest { topic: "retained".into(), messages },
                );
                let mut body = FrameBuffer::new();
                body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
                async move { forwarder.publish(body).await.unwrap().message_ids }
            });
            let ids: Vec<Vec<u64>> = crate::sync::join_all(publishes.collect()).await;
            let stored = topic.log.read(0, 100, usize::MAX).await.unwrap();
            assert_eq!(stored.len(), 60);
            for (request, ids) in ids.iter().enumerate() {
                for (index, id) in ids.iter().enumerate() {
                    let sent = message(request * 20 + index);
                    let record = &stored[*id as usize];
                    assert_eq!(record.data, sent.data);
                    assert_eq!(record.ordering_key, sent.ordering_key);
                    let attributes: Vec<(String, String)> =
                        sent.attributes.into_iter().map(|a| (a.key, a.value)).collect();
                    assert_eq!(record.attributes, attributes);
                }
            }
        });
    }

    async fn topic(forwarder: &Forwarder<SimDisk>, retention_seconds: u64) -> Rc<TopicState<SimDisk>> {
        forwarder
            .control(ControlRequest::AttachTopic {
                topic_id: 7,
                name: "retained".into(),
                retention_seconds,
                recovering: false,
            })
            .await
            .unwrap();
        forwarder.topic("retained").unwrap()
    }

    async fn subscribe(forwarder: &Forwarder<SimDisk>, retain_acked_messages: bool) -> Rc<SubscriptionEntry> {
        attach_subscription(forwarder, retain_acked_messages, true).await
    }

    /// Attaches "reader" to topic 7, created now or recovered (`create` false) from the journal.
    /// The topic is empty when the subscription is created, so its start offset is 0.
    async fn attach_subscription(
        forwarder: &Forwarder<SimDisk>,
        retain_acked_messages: bool,
        create: bool,
    ) -> Rc<SubscriptionEntry> {
        let settings = SubscriptionSettings {
            ack_deadline_seconds: 10,
            message_retention_seconds: 7 * 24 * 3600,
            retain_acked_messages,
            ..Default::default()
        };
        forwarder
            .control(ControlRequest::AttachSubscription {
                subscription_id: 9,
                name: "reader".into(),
                topic_id: 7,
                settings,
                create,
                start_offset: 0,
            })
            .await
            .unwrap();
        forwarder.subscription("reader").unwrap().0
    }

    async fn publish(forwarder: &Forwarder<SimDisk>, count: usize) {
        for _ in 0..count {
            publish_one(forwarder, "retained").await.unwrap();
        }
    }

    /// Publishes one message of 1,000 bytes to `topic`.
    async fn publish_one(forwarder: &Forwarder<SimDisk>, topic: &str) -> Result<PublishResponse, Status> {
        let request = PublishRequest {
            topic: topic.into(),
            messages: vec![PubsubMessage { data: vec![1u8; 1000], ..Default::default() }],
        };
        let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request);
        let mut body = FrameBuffer::new();
        body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
        forwarder.publish(body).await
    }

    fn ack_everything(entry: &SubscriptionEntry, end: u64) {
        let mut state = entry.state.borrow_mut();
        for offset in state.ack_floor()..end {
            state.apply_ack(offset);
        }
    }

    async fn pull(forwarder: &Forwarder<SimDisk>, max_messages: u32) -> Vec<ReceivedMessage> {
        let request = PullRequest { subscription: "reader".into(), max_messages, wait_ms: 0 };
        let frame = ringpost_wire::encode_frame(Command::Pull.code(), 0, 1, &request);
        let header = FrameHeader::decode(&frame[..FRAME_HEADER_BYTES]).unwrap();
        let response = forwarder.pull(&header, &frame[FRAME_HEADER_BYTES..]).await.unwrap().into_contiguous();
        ringpost_wire::decode_body::<PullResponse>(&response[FRAME_HEADER_BYTES..]).unwrap().received_messages
    }

    async fn acknowledge_one_by_one(forwarder: &Forwarder<SimDisk>, messages: &[ReceivedMessage]) {
        for message in messages {
            let request =
                AcknowledgeRequest { subscription: "reader".into(), ack_ids: vec![message.ack_id.clone()] };
            let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
            let response = forwarder.acknowledge(&frame[FRAME_HEADER_BYTES..]).await.unwrap();
            assert!(response.invalid_ack_ids.is_empty());
        }
    }

    /// Acknowledging one message per request writes a journal block each time; checkpoints keep
    /// the journal bounded, and a restart from the compacted journal brings nothing back.
    #[test]
    fn the_journal_stays_bounded_and_compaction_loses_no_acknowledgement() {
        journal_stays_bounded_and_recovers(usize::MAX);
    }

    /// The same with the journal closing its files after every commit, as the journals beyond
    /// the open-file budget do: appends, compaction and recovery all go through reopened files.
    #[test]
    fn a_journal_that_closes_its_files_loses_no_acknowledgement() {
        journal_stays_bounded_and_recovers(0);
    }

    /// A deleted topic's files go in the background, and they do go.
    #[test]
    fn a_deleted_topics_files_are_removed() {
        run(async move {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let retained = topic(&forwarder, 0).await;
            subscribe(&forwarder, false).await;
            publish(&forwarder, 300).await;
            assert!(retained.log.closed_segments().len() >= 2);
            let folder = PathBuf::from("/d0").join(topic_folder(7));
            assert!(forwarder.storage.exists(&folder));
            forwarder.control(ControlRequest::DetachTopic { topic_id: 7, delete_data: true }).await.unwrap();
            assert!(forwarder.topic("retained").is_err() && forwarder.subscription("reader").is_err());
            for _ in 0..100 {
                if !forwarder.storage.exists(&folder) {
                    break;
                }
                crate::runtime::sleep(Duration::from_millis(10)).await;
            }
            assert!(!forwarder.storage.exists(&folder), "the topic's folder is gone");
        });
    }

    /// A new topic's two folders are made with one sync of each new name's parent, no file,
    /// and they survive a power cut, as do the messages published into them.
    #[test]
    fn a_new_topics_folders_are_durable_and_synced_once_each() {
        run(async move {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let disk = forwarder.storage.clone();
            topic(&forwarder, 0).await;
            // On this empty disk: / (for d0/), /d0, /d0/topics and /d0/topics/7 (for messages/
            // and journal/), one each, where a folder at a time synced /d0/topics/7 twice.
            assert_eq!(disk.directory_sync_count(), 4);
            let folder = PathBuf::from("/d0").join(topic_folder(7));
            for log in ["messages", "journal"] {
                assert_eq!(disk.list_dir(&folder.join(log)).unwrap(), Vec::<String>::new());
            }
            publish(&forwarder, 3).await;
            drop(forwarder);
            disk.crash(crate::storage::sim::CrashMode::DropUnsynced);
            let restarted = Forwarder::new(
                0,
                disk.clone(),
                Directories::new(vec!["/d0".into()]),
                LogConfig {
                    segment_bytes_initial: 64 * 1024,
                    segment_bytes_max: 64 * 1024,
                    ..LogConfig::default()
                },
                Rc::new(clock.clone()),
            );
            assert_eq!(topic(&restarted, 0).await.log.end_offset(), 3);
        });
    }

    /// An idle topic keeps no journal; the first acknowledgements open it, and a restart finds
    /// every one of them.
    #[test]
    fn the_journal_opens_at_the_first_acknowledgements_and_keeps_them() {
        run(async move {
            let clock = ManualClock::default();
            let disk = SimDisk::new();
            let directories = Directories::new(vec!["/d0".into()]);
            let config = LogConfig::default();
            let forwarder =
                Forwarder::new(0, disk.clone(), directories.clone(), config.clone(), Rc::new(clock.clone()));
            let retained = topic(&forwarder, 0).await;
            subscribe(&forwarder, false).await;
            publish(&forwarder, 20).await;
            let delivered = pull(&forwarder, 100).await;
            assert_eq!(delivered.len(), 20);
            assert!(retained.journal.opened().is_none());
            let acknowledgements = delivered.iter().map(|message| {
                let request = AcknowledgeRequest {
                    subscription: "reader".into(),
                    ack_ids: vec![message.ack_id.clone()],
                };
                let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
                let forwarder = &forwarder;
                async move { forwarder.acknowledge(&frame[FRAME_HEADER_BYTES..]).await.unwrap() }
            });
            let responses = crate::sync::join_all(acknowledgements.collect()).await;
            assert!(responses.iter().all(|response| response.invalid_ack_ids.is_empty()));
            assert_eq!(retained.journal.opened().unwrap().end_offset(), 20, "one journal took all 20");
            drop(retained);
            drop(forwarder);
            let forwarder = Forwarder::new(0, disk, directories, config, Rc::new(clock.clone()));
            topic(&forwarder, 0).await;
            attach_subscription(&forwarder, false, false).await;
            assert!(pull(&forwarder, 100).await.is_empty(), "every acknowledgement survived the restart");
        });
    }

    fn journal_stays_bounded_and_recovers(journals_open_max: usize) {
        run(async move {
            let clock = ManualClock::default();
            let disk = SimDisk::new();
            let directories = Directories::new(vec!["/d0".into()]);
            let config = LogConfig {
                segment_bytes_initial: 64 * 1024,
                segment_bytes_max: 64 * 1024,
                ..LogConfig::default()
            };
            let forwarder =
                Forwarder::new(0, disk.clone(), directories.clone(), config.clone(), Rc::new(clock.clone()));
            forwarder.set_journals_open_max(journals_open_max);
            let retained = topic(&forwarder, 0).await;
            subscribe(&forwarder, false).await;
            assert!(retained.journal.opened().is_none(), "nothing acknowledged yet: no journal");
            let mut journal_peak = 0;
            for _round in 0..12 {
                publish(&forwarder, 500).await;
                let delivered = pull(&forwarder, 1000).await;
                assert_eq!(delivered.len(), 500);
                acknowledge_one_by_one(&forwarder, &delivered).await;
                forwarder.collect_segments().await;
                journal_peak = journal_peak.max(retained.journal.opened().unwrap().disk_bytes());
            }
            let journal = retained.journal.opened().unwrap();
            assert_eq!(journal.keeps_files_open(), journals_open_max > 0);
            // 6,000 acknowledge requests of a 4 KiB block each would be 24 MB of journal.
            assert!(journal_peak < 20 << 20, "journal reached {journal_peak} bytes");
            assert!(journal.start_offset() > 0, "old journal segments were deleted");
            drop(journal);
            publish(&forwarder, 10).await;
            let unacknowledged: Vec<u64> = pull(&forwarder, 100).await.iter().map(|m| m.message_id).collect();
            assert_eq!(unacknowledged.len(), 10);
            drop(retained);
            drop(forwarder);
            // Restart on the same disk: recover the topic and the subscription from the journal.
            let forwarder = Forwarder::new(0, disk, directories, config, Rc::new(clock.clone()));
            forwarder.set_journals_open_max(journals_open_max);
            topic(&forwarder, 0).await;
            attach_subscription(&forwarder, false, false).await;
            let redelivered: Vec<u64> = pull(&forwarder, 1000).await.iter().map(|m| m.message_id).collect();
            assert_eq!(redelivered, unacknowledged, "exactly the unacknowledged messages come back");
        });
    }

    /// At start-up the router attaches many topics at once; each counts toward the budget of
    /// journals that keep their files open from the start of its attach, so the budget holds
    /// however the attaches interleave.
    #[test]
    fn topics_attached_together_keep_to_the_open_journal_budget() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            forwarder.set_journals_open_max(3);
            let attaches = (0..10u64)
                .map(|topic_id| {
                    forwarder.control(ControlRequest::AttachTopic {
                        topic_id,
                        name: format!("topic-{topic_id}"),
                        retention_seconds: 0,
                        recovering: true,
                    })
                })
                .collect();
            for result in crate::sync::join_all(attaches).await {
                result.unwrap();
            }
            let keeping_open = (0..10)
                .filter(|topic_id| {
                    forwarder.topic(&format!("topic-{topic_id}")).unwrap().journal.config.keep_files_open
                })
                .count();
            assert_eq!(keeping_open, 3);
            assert_eq!(forwarder.topics_attaching.get(), 0);
        });
    }

    /// A shard that was busy trims malloc's free memory once, after `QUIET_SWEEPS_BEFORE_TRIM`
    /// sweeps without a request; one that never was busy, or already trimmed, does not again.
    #[test]
    fn trims_once_after_a_quiet_spell() {
        let clock = ManualClock::default();
        let forwarder = forwarder(&clock);
        forwarder.sweep_leases();
        assert_eq!(forwarder.quiet_sweeps.get(), None, "never busy: nothing to trim");
        forwarder.requests.set(forwarder.requests.get() + 1);
        forwarder.sweep_leases();
        assert_eq!(forwarder.quiet_sweeps.get(), Some(0));
        for quiet in 1..QUIET_SWEEPS_BEFORE_TRIM {
            forwarder.sweep_leases();
            assert_eq!(forwarder.quiet_sweeps.get(), Some(quiet));
        }
        forwarder.sweep_leases();
        assert_eq!(forwarder.quiet_sweeps.get(), None, "trimmed, and not again until busy");
        forwarder.requests.set(forwarder.requests.get() + 1);
        forwarder.sweep_leases();
        assert_eq!(forwarder.quiet_sweeps.get(), Some(0), "a request starts the count again");
    }

    /// T11: ack deadlines run on the monotonic clock. A wall-clock jump (an NTP step of an hour,
    /// either way) redelivers nothing early and delays nothing; the deadline itself still works.
    #[test]
    fn a_wall_clock_jump_causes_no_redelivery() {
        for jump_ms in [3_600_000i64, -3_600_000] {
            run(async move {
                let clock = ManualClock::default();
                let forwarder = forwarder(&clock);
                topic(&forwarder, 0).await;
                subscribe(&forwarder, false).await;
                publish(&forwarder, 50).await;
                assert_eq!(pull(&forwarder, 100).await.len(), 50);
                clock.jump_wall_ms(jump_ms);
                assert!(
                    pull(&forwarder, 100).await.is_empty(),
                    "a wall-clock jump of {jump_ms} ms redelivered leases"
                );
                clock.advance(Duration::from_secs(9));
                assert!(pull(&forwarder, 100).await.is_empty(), "redelivered before the 10 s deadline");
                clock.advance(Duration::from_secs(1));
                let again = pull(&forwarder, 100).await;
                assert_eq!(again.len(), 50, "every lease expires at its deadline");
                assert!(again.iter().all(|message| message.delivery_attempt == 2));
            });
        }
    }

    /// A publish refused for want of disk space makes every topic of the shard give up the file
    /// it kept for its next roll, so that the publisher's retry finds the space.
    /// On a full disk acknowledgements are still recorded (the journal's first segment comes
    /// from its reserve), segment collection then deletes what they acknowledged, and the
    /// reserve is made again once there is room.
    #[test]
    fn acknowledgements_are_recorded_on_a_full_disk_and_free_it() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, 0).await;
            subscribe(&forwarder, false).await;
            publish(&forwarder, 100).await;
            // The first publish had the journal's reserve made, in the background.
            crate::runtime::sleep(Duration::from_millis(20)).await;
            let reserve = PathBuf::from("/d0").join(journal_folder(topic.id)).join(crate::log::RESERVE_NAME);
            assert!(forwarder.storage.exists(&reserve), "no journal reserve after the first publish");
            assert!(topic.journal.opened().is_none(), "nothing acknowledged yet: the journal is closed");

            forwarder.storage.set_no_space(true);
            let messages = pull(&forwarder, 1000).await;
            assert_eq!(messages.len(), 100);
            let request = AcknowledgeRequest {
                subscription: "reader".into(),
                ack_ids: messages.iter().map(|message| message.ack_id.clone()).collect(),
            };
            let frame = ringpost_wire::encode_frame(Command::Acknowledge.code(), 0, 1, &request);
            let response = forwarder
                .acknowledge(&frame[FRAME_HEADER_BYTES..])
                .await
                .expect("an acknowledgement on a full disk");
            assert!(response.invalid_ack_ids.is_empty(), "{response:?}");
            assert!(!forwarder.storage.exists(&reserve), "the journal's first segment took the reserve");

            let segments_before = topic.log.closed_segments().len();
            assert!(segments_before > 2, "the test wants several segments");
            forwarder.collect_segments().await;
            assert!(
                topic.log.closed_segments().is_empty(),
                "acknowledged segments stayed on a full disk: {:?}",
                topic.log.closed_segments()
            );
            forwarder.storage.set_no_space(false);
            forwarder.collect_segments().await;
            assert!(forwarder.storage.exists(&reserve), "the reserve was not made again once there was room");
            publish_one(&forwarder, "retained").await.unwrap();
        });
    }

    #[test]
    fn a_full_disk_releases_the_files_kept_for_later_rolls() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let busy = topic(&forwarder, 0).await;
            publish(&forwarder, 300).await;
            crate::runtime::sleep(Duration::from_millis(20)).await;
            assert!(busy.log.keeps_a_recycled_file(), "the busy topic recycles its segments");
            forwarder
                .control(ControlRequest::AttachTopic {
                    topic_id: 8,
                    name: "newcomer".into(),
                    retention_seconds: 0,
                    recovering: false,
                })
                .await
                .unwrap();
            forwarder.storage.set_no_space(true);
            let refused =
                publish_one(&forwarder, "newcomer").await.expect_err("no space for a first segment");
            assert_eq!(refused.code, ErrorCode::ResourceExhausted, "{refused:?}");
            crate::runtime::sleep(Duration::from_millis(20)).await;
            assert!(!busy.log.keeps_a_recycled_file(), "the kept file was given up");
        });
    }

    #[test]
    fn a_topic_without_subscriptions_keeps_nothing_closed() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, 0).await;
            publish(&forwarder, 300).await;
            // Each publish that rolled the log had what came before deleted in the background.
            crate::runtime::sleep(Duration::from_millis(20)).await;
            assert!(topic.log.closed_segments().len() <= 1, "{:?}", topic.log.closed_segments().len());
            assert!(topic.log.start_offset() > 0);
            forwarder.collect_segments().await;
            assert!(topic.log.closed_segments().is_empty());
        });
    }

    #[test]
    fn unacknowledged_messages_stay_until_the_subscription_retention_expires() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, 0).await;
            let entry = subscribe(&forwarder, false).await;
            publish(&forwarder, 300).await;
            forwarder.collect_segments().await;
            assert_eq!(topic.log.start_offset(), 0, "nothing acknowledged, nothing expired: nothing deleted");
            clock.advance(8 * DAY);
            forwarder.collect_segments().await;
            let start = topic.log.start_offset();
            assert!(start > 0, "seven days later the unacknowledged messages expire");
            assert_eq!(entry.state.borrow().ack_floor(), start, "the subscription forgets what was deleted");
            assert_eq!(entry.state.borrow().backlog(topic.log.end_offset()), topic.log.end_offset() - start);
        });
    }

    /// An update applied on the forwarder decides from then on what keeps acknowledged
    /// segments (the topic's retention, the subscription's retain_acked_messages) and what lease
    /// a pull grants.
    #[test]
    fn updated_settings_decide_what_is_kept_and_how_long_a_lease_runs() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, 0).await;
            let entry = subscribe(&forwarder, false).await;
            let update_topic = |retention_seconds| ControlRequest::UpdateSettings {
                topic_id: 7,
                update: SettingsUpdate::Topic { retention_seconds },
            };
            let update_subscription = |ack_deadline_seconds, retain_acked_messages| {
                let settings = SubscriptionSettings {
                    ack_deadline_seconds,
                    message_retention_seconds: 7 * 24 * 3600,
                    retain_acked_messages,
                    ..Default::default()
                };
                ControlRequest::UpdateSettings {
                    topic_id: 7,
                    update: SettingsUpdate::Subscription { subscription_id: 9, settings },
                }
            };
            forwarder.control(update_topic(3600)).await.unwrap();
            forwarder.control(update_subscription(30, true)).await.unwrap();
            publish(&forwarder, 300).await;
            let leased = pull(&forwarder, 1).await;
            clock.advance(Duration::from_secs(20));
            assert!(pull(&forwarder, 1).await.iter().all(|m| m.message_id != leased[0].message_id));
            clock.advance(Duration::from_secs(11));
            let again = pull(&forwarder, 1).await;
            assert_eq!(again[0].message_id, leased[0].message_id, "the lease ran the new 30 s");
            ack_everything(&entry, topic.log.end_offset());
            forwarder.collect_segments().await;
            assert_eq!(topic.log.start_offset(), 0, "the new topic retention keeps acknowledged messages");
            forwarder.control(update_topic(0)).await.unwrap();
            forwarder.collect_segments().await;
            assert_eq!(topic.log.start_offset(), 0, "and so does retain_acked_messages");
            forwarder.control(update_subscription(30, false)).await.unwrap();
            forwarder.collect_segments().await;
            assert!(topic.log.start_offset() > 0, "without either, acknowledged segments go");
        });
    }

    #[test]
    fn acknowledged_segments_go_unless_a_retention_keeps_them() {
        run(async {
            let clock = ManualClock::default();
            let forwarder = forwarder(&clock);
            let topic = topic(&forwarder, 0).await;
            let entry = subscribe(&forwarder, false).await;
            publish(&forwarder, 300).await;
            ack_everything(&entry, topic.log.end_offset());
            forwarder.collect_segments().await;
            assert!(topic.log.closed_segments().is_empty(), "every closed segment was acknowledged");
        });
        for (topic_retention_seconds, retain_acked) in [(3600, false), (0, true)] {
            run(async move {
                let clock = ManualClock::default();
                let forwarder = forwarder(&clock);
                let topic = topic(&forwarder, topic_retention_seconds).await;
                let entry = subscribe(&forwarder, retain_acked).await;
                publish(&forwarder, 300).await;
                ack_everything(&entry, topic.log.end_offset());
                forwarder.collect_segments().await;
                assert_eq!(topic.log.start_offset(), 0, "retention keeps acknowledged messages for seek");
                clock.advance(if retain_acked { 8 * DAY } else { Duration::from_secs(7200) });
                forwarder.collect_segments().await;
                assert!(topic.log.start_offset() > 0, "and lets them go once it expires");
            });
        }
    }
}
