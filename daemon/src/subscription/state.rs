//! A subscription's delivery state, without I/O: which offsets are acknowledged, which are
//! leased to a subscriber and until when, which wait for redelivery (after a retry backoff),
//! which go to the dead-letter topic, and, for ordered subscriptions, which ordering keys are
//! busy. The forwarder drives it with the monotonic clock and makes acknowledgements durable
//! (journal) before applying them.
//!
//! Ordering keys: at most one message per key is leased at a time. Later messages of a busy key
//! are held back, in publish order, and the next one is released when the leased one is
//! acknowledged or dead-lettered; a nacked or expired one keeps its key busy and is delivered
//! again first. So a subscriber sees each key in order, a key waiting for a redelivery blocks
//! only itself, and dead-lettering unblocks it.
//!
//! Exactly-once delivery (`DeliveryPolicy::exactly_once`): an ack id is good only for the
//! current lease of its message, and only until that lease's deadline (the lenient acceptance
//! of an expired lease not yet delivered again is off). An acknowledgement accepted for the
//! journal pins its lease (`pin`): the lease cannot expire, be nacked or be given back while
//! the write is in flight, so the message is not delivered again before the acknowledgement is
//! durable (`apply_ack`), nor after; if the write fails, `unpin` lets the lease run out as
//! usual.
//!
//! Invariants:
//! - every offset in `[start_offset, cursor)` is acknowledged, leased, or waiting in
//!   `redeliver` (or below the log's start, deleted by retention);
//! - an offset is leased at most once at a time;
//! - `cursor - floor` never exceeds `unacked_window_max`, which bounds every structure here.

use crate::ids::{Offset, SourceId, SubscriptionId};
use crate::subscription::offset_map::OffsetMap;
use crate::subscription::outstanding::{Room, TopicOutstanding};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Most offsets between the ack floor and the delivery cursor. A subscriber that leaves one
/// message unacknowledged while acking a million after it stops receiving new messages until
/// the old one is acked, redelivered or dead-lettered: memory stays bounded (a bit per offset).
pub const UNACKED_WINDOW_MAX: u64 = 4_000_000;

/// Entries the deadline heap may hold per live lease, plus `DEADLINE_ENTRIES_SLACK`, before it
/// is rebuilt from the leases. Every extension (ModifyAckDeadline) pushes an entry, and the one
/// it replaces leaves only when it reaches the top, up to 600 s later: a subscriber pipelining
/// extensions of 2,500 ids grew a daemon from 104 MiB to 3.99 GB in 60 s. Two: a rebuild
/// (linear in the leases) then comes after at least as many pushes as there are leases, so it
/// costs each push a constant, and the heap stays within twice the leases.
pub const DEADLINE_ENTRIES_PER_LEASE_MAX: usize = 2;
/// Entries the deadline heap may hold beyond `DEADLINE_ENTRIES_PER_LEASE_MAX` per lease, so
/// that a subscription with few leases is not rebuilt every few extensions.
pub const DEADLINE_ENTRIES_SLACK: usize = 1024;

/// Acknowledged offsets: everything below `floor`, plus a bitmap above it.
#[derive(Debug, Clone)]
pub struct AckSet {
    floor: u64,
    base: u64,
    words: VecDeque<u64>,
    above_floor: u64,
}

impl AckSet {
    pub fn new(floor: Offset) -> AckSet {
        let floor = floor.get();
        AckSet { floor, base: floor - floor % 64, words: VecDeque::new(), above_floor: 0 }
    }

    pub fn floor(&self) -> Offset {
        Offset::new(self.floor)
    }

    /// Acknowledged offsets at or above the floor.
    pub fn above_floor(&self) -> u64 {
        self.above_floor
    }

    pub fn contains(&self, offset: Offset) -> bool {
        let offset = offset.get();
        if offset < self.floor {
            return true;
        }
        let index = offset - self.base;
        let word = (index / 64) as usize;
        word < self.words.len() && self.words[word] & (1 << (index % 64)) != 0
    }

    /// Marks an offset; returns false if it was already acknowledged.
    pub fn insert(&mut self, offset: Offset) -> bool {
        if self.contains(offset) {
            return false;
        }
        let offset = offset.get();
        let index = offset - self.base;
        let word = (index / 64) as usize;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (index % 64);
        self.above_floor += 1;
        self.advance();
        true
    }

    /// Everything below `offset` counts as acknowledged (a new start, or retention).
    pub fn raise_floor(&mut self, offset: Offset) {
        let offset = offset.get();
        while self.floor < offset {
            if self.contains(Offset::new(self.floor)) {
                self.above_floor -= 1;
            }
            self.floor += 1;
            self.drop_full_words();
        }
        self.advance();
    }

    fn advance(&mut self) {
        loop {
            let index = self.floor - self.base;
            let word = (index / 64) as usize;
            if word >= self.words.len() {
                break;
            }
            let bits = self.words[word] >> (index % 64);
            let run = bits.trailing_ones() as u64;
            if run == 0 {
                break;
            }
            self.floor += run;
            self.above_floor -= run;
            self.drop_full_words();
        }
    }

    fn drop_full_words(&mut self) {
        while self.floor >= self.base + 64 {
            self.words.pop_front();
            self.base += 64;
        }
    }

    /// Acknowledged offsets above the floor, in order (for snapshots).
    pub fn iter_above_floor(&self) -> impl Iterator<Item = Offset> + '_ {
        (self.floor..self.base + 64 * self.words.len() as u64)
            .map(Offset::new)
            .filter(|offset| self.contains(*offset))
    }
}

/// A delivery handed to a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub offset: Offset,
    /// 1 on first delivery, plus one per nack or expired deadline.
    pub attempt: u32,
    pub generation: u32,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    deadline: Instant,
    generation: u32,
    /// The streaming pull that holds the lease (0: a unary pull), for its flow control.
    stream: u64,
    bytes: u64,
    /// Acknowledgements of this lease being made durable (exactly-once delivery): while any
    /// is, the lease neither expires nor is given back.
    pins: u16,
}

/// Redelivery and dead-letter settings of a subscription.
#[derive(Debug, Clone, Default)]
pub struct DeliveryPolicy {
    /// Exponential backoff between `minimum` and `maximum` seconds before a nacked or expired
    /// message is delivered again; `None` redelivers at once. Seconds, as the settings give
    /// them: two Durations would cost every subscription 24 bytes more.
    pub retry_backoff_seconds: Option<(u32, u32)>,
    /// Deliveries after which a failing message goes to the dead-letter topic.
    pub max_delivery_attempts: Option<u32>,
    pub ordered: bool,
    /// Exactly-once delivery: acknowledgements only of current leases, pinned while they are
    /// made durable (see the module's documentation).
    pub exactly_once: bool,
}

impl DeliveryPolicy {
    /// The wait before delivery number `attempt + 1` after `attempt` failed ones.
    pub fn backoff(&self, attempt: u32) -> Duration {
        match self.retry_backoff_seconds {
            None => Duration::ZERO,
            Some((minimum, maximum)) => {
                let (minimum, maximum) =
                    (Duration::from_secs(minimum as u64), Duration::from_secs(maximum as u64));
                let factor = 1u32 << attempt.saturating_sub(1).min(20);
                minimum.saturating_mul(factor).min(maximum).max(minimum)
            }
        }
    }
}

/// Outstanding messages and bytes of one streaming pull.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamLoad {
    pub messages: u64,
    pub bytes: u64,
}

/// An ack id as the subscriber sees it, in hex after a version marker:
/// `v1.<subscription id>.<source>.<offset>.<generation>`.
///
/// Version 1 names the source, so that topics with several sources need no other format.
/// Ack ids issued before it (version 0) were `<subscription id>.<offset>.<generation>`, which
/// starts with a hex digit and so never with the marker's `v`; a client may hold one across a
/// rolling restart, and it still parses, naming source 0: every topic's log from before is its
/// source 0, so it acknowledges exactly what it did. A later version's marker (`v2.`) is
/// refused as such (`AckRefusal::UnknownVersion`), never read as this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckId {
    pub subscription_id: SubscriptionId,
    pub source: SourceId,
    pub offset: Offset,
    pub generation: u32,
}

/// What starts every ack id this version writes.
const ACK_ID_VERSION_MARKER: &str = "v1.";
/// Bytes of the longest ack id `encode` writes: the marker, then hex numbers of at most 16, 8,
/// 16 and 8 digits with three dots.
const ACK_ID_ENCODED_BYTES_MAX: usize = ACK_ID_VERSION_MARKER.len() + 16 + 1 + 8 + 1 + 16 + 1 + 8;
const _: () = assert!(ACK_ID_ENCODED_BYTES_MAX <= crate::api::limits::ACK_ID_BYTES_MAX);

impl AckId {
    /// The same text as `format!("v1.{:x}.{:x}.{:x}.{:x}", ...)`, which cost a streaming pull
    /// 5% of its time: one is made for every message delivered.
    pub fn encode(&self) -> String {
        let mut text = String::with_capacity(ACK_ID_ENCODED_BYTES_MAX);
        self.encode_into(&mut text);
        text
    }

    /// `encode`, appended to `text` (a pull writes all of its ack ids into one string).
    pub fn encode_into(&self, text: &mut String) {
        text.push_str(ACK_ID_VERSION_MARKER);
        push_hex(text, self.subscription_id.get());
        text.push('.');
        push_hex(text, self.source.get() as u64);
        text.push('.');
        push_hex(text, self.offset.get());
        text.push('.');
        push_hex(text, self.generation as u64);
    }

    /// Reads back what `encode` wrote, or a version 0 ack id (as source 0): hex digits of
    /// either case, leading zeros allowed; anything else is refused. One pass over the bytes:
    /// every acknowledgement parses one, and splitting and `from_str_radix` cost a drain about
    /// 4% of its shard's time.
    pub fn parse(text: &str) -> Result<AckId, AckRefusal> {
        if text.len() > crate::api::limits::ACK_ID_BYTES_MAX {
            return Err(AckRefusal::Malformed);
        }
        let field = |bytes: &mut &[u8], dotted| parse_hex_field(bytes, dotted).ok_or(AckRefusal::Malformed);
        let generation =
            |bytes: &mut &[u8]| u32::try_from(field(bytes, false)?).or(Err(AckRefusal::Malformed));
        if let Some(rest) = text.strip_prefix(ACK_ID_VERSION_MARKER) {
            let mut bytes = rest.as_bytes();
            let subscription_id = SubscriptionId::new(field(&mut bytes, true)?);
            let source = u32::try_from(field(&mut bytes, true)?).ok().and_then(SourceId::new);
            let source = source.ok_or(AckRefusal::Malformed)?;
            let offset = Offset::new(field(&mut bytes, true)?);
            let generation = generation(&mut bytes)?;
            return Ok(AckId { subscription_id, source, offset, generation });
        }
        if let Some(rest) = text.strip_prefix('v') {
            // A version this daemon does not know: a newer daemon's, met in a mixed cluster or
            // after a downgrade. Its fields may mean anything here.
            return Err(match parse_hex_field(&mut rest.as_bytes(), true) {
                Some(_) => AckRefusal::UnknownVersion,
                None => AckRefusal::Malformed,
            });
        }
        let mut bytes = text.as_bytes();
        let subscription_id = SubscriptionId::new(field(&mut bytes, true)?);
        let offset = Offset::new(field(&mut bytes, true)?);
        let generation = generation(&mut bytes)?;
        Ok(AckId { subscription_id, source: SourceId::FIRST, offset, generation })
    }
}

/// Reads one field of hex digits from the front of `bytes`: at least one digit, a value that
/// fits a u64, then a '.' (consumed) if `dotted`, or the end of the text if not.
fn parse_hex_field(bytes: &mut &[u8], dotted: bool) -> Option<u64> {
    let mut value: u64 = 0;
    let mut digits = 0;
    while let Some((&byte, rest)) = bytes.split_first() {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            b'A'..=b'F' => byte - b'A' + 10,
            _ => break,
        };
        if value >> 60 != 0 {
            return None;
        }
        value = value << 4 | digit as u64;
        digits += 1;
        *bytes = rest;
    }
    if digits == 0 {
        return None;
    }
    match (dotted, bytes.split_first()) {
        (true, Some((b'.', rest))) => {
            *bytes = rest;
            Some(value)
        }
        (false, None) => Some(value),
        _ => None,
    }
}

/// Appends `value` in lowercase hexadecimal, without leading zeros. Digit by digit, as ASCII
/// characters: going through `str::from_utf8` to append the digits as one slice cost a drain
/// 1-2% of its shard's time, every delivery writing three of these.
fn push_hex(text: &mut String, value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let significant_bits = (u64::BITS - value.leading_zeros()).max(1);
    let digits = significant_bits.div_ceil(4);
    for digit in (0..digits).rev() {
        text.push(DIGITS[((value >> (digit * 4)) & 15) as usize] as char);
    }
}

/// Why an ack id was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckRefusal {
    Malformed,
    /// An ack id of a format version after this daemon's (a newer daemon issued it).
    UnknownVersion,
    OtherSubscription,
    /// An ack id naming another source than the one this state follows: one the topic does
    /// not have, or one another log (and its own state of the subscription) serves.
    OtherSource,
    NeverDelivered,
    /// The lease expired and the message is now leased to another delivery.
    Expired,
    /// Exactly-once delivery: the lease the ack id names is not current, or its deadline
    /// passed.
    LeaseEnded,
}

impl AckRefusal {
    pub fn reason(&self) -> &'static str {
        match self {
            AckRefusal::Malformed => "malformed ack id",
            AckRefusal::UnknownVersion => {
                "ack id of a later format version than this daemon reads (a newer Ringpost issued it)"
            }
            AckRefusal::OtherSubscription => {
                "ack id belongs to another subscription (or one deleted and recreated)"
            }
            AckRefusal::OtherSource => "unknown ack id: its topic has no such source",
            AckRefusal::NeverDelivered => "unknown ack id: no such message was delivered",
            AckRefusal::Expired => "ack id expired: its deadline passed and the message was delivered again",
            AckRefusal::LeaseEnded => {
                "ack id expired: its lease is not current (exactly-once delivery accepts only a lease before its deadline)"
            }
        }
    }
}

/// Hashes the maps keyed by offsets and ids, which the server assigns, so a fixed-key hasher is
/// safe from flooding and saves each map the 16 bytes of a random state (it adds up over 10,000
/// idle topics and subscriptions). Maps keyed by client text keep a random state.
#[cfg(not(test))]
pub type IdHasher = std::hash::BuildHasherDefault<ahash::AHasher>;
/// In unit tests, keys that are the same in every process, so that a simulation replays.
#[cfg(test)]
pub type IdHasher = crate::runtime::FixedHasher;

/// The delivery gate of an ordered subscription on one source (docs/SOURCES.md, rule 3): the
/// topic's active count changed from `before` to `after`, and the subscription has not passed
/// the change yet, so this source (`source`) holds every message of a key that moved to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyGate {
    pub source: u32,
    pub before: u32,
    pub after: u32,
}

impl KeyGate {
    /// Whether the gate holds a message with ordering key `key`: its key maps to this source
    /// under the count after the change and to another under the count before. At any offset,
    /// not only from the change's fence on: under the count before, this source took no
    /// message of the key, and those it took under an earlier count were acknowledged before
    /// the earlier change was passed (one change at a time), so nothing of the key is held
    /// that the subscriber should have had first, and the fence of the source gaining keys
    /// need not survive a restart.
    pub fn holds(&self, key: &[u8]) -> bool {
        use ringpost_model::sources::source_of_key;
        self.before != self.after
            && self.before > 0
            && self.after > self.source
            && source_of_key(key, self.after) == self.source
            && (self.source >= self.before || source_of_key(key, self.before) != self.source)
    }
}

/// An ordered subscription's keys: the one offset each busy key has out, the messages held
/// back behind it, and the key of each offset that is busy or held.
#[derive(Default)]
struct KeyOrder {
    busy_keys: HashMap<String, Offset, ahash::RandomState>,
    held: HashMap<String, VecDeque<Offset>, ahash::RandomState>,
    key_of: HashMap<Offset, String, IdHasher>,
}

pub struct SubscriptionState {
    pub id: SubscriptionId,
    /// The publish source whose log this state follows: the source its ack ids name, and the
    /// only one whose ack ids it takes. `SourceId::FIRST` until attached to another source.
    pub source: SourceId,
    pub start_offset: Offset,
    acked: AckSet,
    cursor: Offset,
    /// What is out or waiting; `None` while nothing is (see `InFlight`).
    in_flight: Option<Box<InFlight>>,
    next_generation: u32,
    /// The lease a delivery takes, in milliseconds (`ack_deadline`): 4 bytes where a
    /// `Duration` took 16, over 10,000 idle subscriptions.
    ack_deadline_ms: u32,
    pub policy: DeliveryPolicy,
    /// Counters for stats.
    pub delivered_total: u64,
    /// Deliveries after the first of the same message (after a nack or an expired lease).
    pub redelivered_total: u64,
    pub acked_total: u64,
    pub expired_total: u64,
    /// Messages published to the dead-letter topic (and acknowledged here).
    pub dead_lettered_total: u64,
    /// The topic's and shard's count of outstanding messages (`outstanding`), which every
    /// lease is counted in while it lasts; `None` until attached (and in tests that count
    /// nothing).
    tally: Option<Rc<TopicOutstanding>>,
    /// The delivery gate on this source while the subscription has not passed its topic's
    /// last change of the source count; `None` once passed, or if it has no ordering.
    gate: Option<KeyGate>,
}

/// What a subscription has out or waiting: leases and their deadlines, redeliveries, retry
/// backoffs, dead letters, attempt counts, ordering keys and streams. Made on the first
/// delivery and dropped by `release_if_idle` once all of it is done, so an idle subscription
/// carries none of it (about 250 bytes, over 10,000 idle subscriptions).
#[derive(Default)]
struct InFlight {
    leases: OffsetMap<Lease>,
    deadlines: BinaryHeap<Reverse<(Instant, Offset, u32)>>,
    redeliver: BTreeSet<Offset>,
    /// Failed messages waiting out their retry backoff: (eligible at, offset).
    backing_off: BinaryHeap<Reverse<(Instant, Offset)>>,
    /// Messages that used up their delivery attempts, for the forwarder to dead-letter.
    dead_letters: BTreeSet<Offset>,
    attempts: OffsetMap<u32>,
    /// Ordered subscriptions, once a message with an ordering key was delivered.
    keys: Option<Box<KeyOrder>>,
    /// Messages the delivery gate holds (`KeyGate`), unleased and counted against no window,
    /// until the subscription passes its topic's change and they go back to `redeliver`.
    gated: BTreeSet<Offset>,
    streams: HashMap<u64, StreamLoad, IdHasher>,
    /// Where `leases` are counted (the subscription's `tally`): each lease, with its bytes,
    /// from `insert_lease` to `end_lease`, and what is left when this is dropped.
    tally: Option<Rc<TopicOutstanding>>,
}

impl Drop for InFlight {
    /// A subscription deleted, detached or dropped with leases out gives their count back.
    fn drop(&mut self) {
        if let Some(tally) = &self.tally {
            let bytes = self.leases.iter().map(|(_, lease)| lease.bytes).sum();
            tally.give_back(self.leases.len() as u64, bytes);
        }
    }
}

impl InFlight {
    /// Most entries `deadlines` holds (`DEADLINE_ENTRIES_PER_LEASE_MAX`).
    fn deadline_entries_max(&self) -> usize {
        DEADLINE_ENTRIES_PER_LEASE_MAX * self.leases.len() + DEADLINE_ENTRIES_SLACK
    }

    /// Puts a lease's deadline on the heap. An entry it replaces (an earlier deadline of the
    /// same lease) stays until it reaches the top, where `expire` skips it; when such stale
    /// entries pass the bound, the heap is rebuilt with one entry per lease.
    fn push_deadline(&mut self, deadline: Instant, offset: Offset, generation: u32) {
        self.deadlines.push(Reverse((deadline, offset, generation)));
        if self.deadlines.len() > self.deadline_entries_max() {
            self.deadlines = self
                .leases
                .iter()
                .map(|(offset, lease)| Reverse((lease.deadline, offset, lease.generation)))
                .collect();
        }
        assert!(self.deadlines.len() <= self.deadline_entries_max(), "the deadline heap passed its bound");
    }

    /// Nothing leased, waiting or counted, and no stream open: dropping it loses nothing.
    /// (Stale entries of `deadlines` belong to leases that are gone; they are skipped anyway.)
    fn is_idle(&self) -> bool {
        self.leases.is_empty()
            && self.redeliver.is_empty()
            && self.backing_off.is_empty()
            && self.dead_letters.is_empty()
            && self.attempts.is_empty()
            && self.streams.is_empty()
            && self.gated.is_empty()
            && self.keys.as_ref().is_none_or(|keys| {
                keys.busy_keys.is_empty() && keys.held.is_empty() && keys.key_of.is_empty()
            })
    }

    /// Takes a lease, counting it in the topic's and shard's outstanding messages. The only
    /// place a lease is made.
    fn insert_lease(&mut self, offset: Offset, lease: Lease) {
        let bytes = lease.bytes;
        let replaced = self.leases.insert(offset, lease);
        if let Some(tally) = &self.tally {
            if let Some(replaced) = replaced {
                tally.give_back(1, replaced.bytes);
            }
            tally.add(1, bytes);
        }
    }

    /// Ends a lease, giving its stream back the capacity it used, and the topic's and shard's
    /// outstanding counts theirs. The only place a lease ends, but for `drop`.
    fn end_lease(&mut self, offset: Offset) -> Option<Lease> {
        let lease = self.leases.remove(offset)?;
        if let Some(tally) = &self.tally {
            tally.give_back(1, lease.bytes);
        }
        if lease.stream != 0 {
            if let Some(load) = self.streams.get_mut(&lease.stream) {
                load.messages = load.messages.saturating_sub(1);
                load.bytes = load.bytes.saturating_sub(lease.bytes);
            }
        }
        Some(lease)
    }

    /// A delivery failed (nack or expired deadline): back off, dead-letter, or redeliver.
    fn fail(&mut self, policy: &DeliveryPolicy, offset: Offset, now: Instant) {
        let attempts = self.attempts.get(offset).copied().unwrap_or(0);
        if policy.max_delivery_attempts.is_some_and(|max| attempts >= max) {
            self.dead_letters.insert(offset);
            return;
        }
        let backoff = policy.backoff(attempts);
        if backoff.is_zero() {
            self.redeliver.insert(offset);
        } else {
            self.backing_off.push(Reverse((now + backoff, offset)));
        }
    }

    /// An ordered message is done (acked or dead-lettered): its key frees, and the next message
    /// held behind it becomes deliverable.
    fn free_key(&mut self, offset: Offset) {
        let Some(keys) = self.keys.as_deref_mut() else { return };
        let Some(key) = keys.key_of.remove(&offset) else { return };
        if keys.busy_keys.get(&key) == Some(&offset) {
            keys.busy_keys.remove(&key);
            if let Some(queue) = keys.held.get_mut(&key) {
                if let Some(next) = queue.pop_front() {
                    self.redeliver.insert(next);
                }
                if queue.is_empty() {
                    keys.held.remove(&key);
                }
            }
        } else if let Some(queue) = keys.held.get_mut(&key) {
            queue.retain(|held| *held != offset);
            if queue.is_empty() {
                keys.held.remove(&key);
            }
        }
    }

    /// Undoes a delivery that is still leased under its generation; whether it was. A pinned
    /// lease stays: its acknowledgement is being made durable.
    fn release(&mut self, delivery: Delivery) -> bool {
        if self
            .leases
            .get(delivery.offset)
            .is_none_or(|lease| lease.generation != delivery.generation || lease.pins > 0)
        {
            return false;
        }
        self.end_lease(delivery.offset);
        if let Some(attempt) = self.attempts.get_mut(delivery.offset) {
            *attempt = attempt.saturating_sub(1);
        }
        self.redeliver.insert(delivery.offset);
        true
    }
}

impl SubscriptionState {
    /// How long a delivery's lease lasts.
    pub fn ack_deadline(&self) -> Duration {
        Duration::from_millis(self.ack_deadline_ms as u64)
    }

    /// For leases granted from now on.
    pub fn set_ack_deadline(&mut self, ack_deadline: Duration) {
        self.ack_deadline_ms = duration_ms(ack_deadline);
    }

    pub fn new(id: SubscriptionId, start_offset: Offset, ack_deadline: Duration) -> SubscriptionState {
        SubscriptionState {
            id,
            source: SourceId::FIRST,
            start_offset,
            acked: AckSet::new(start_offset),
            cursor: start_offset,
            in_flight: None,
            next_generation: 1,
            ack_deadline_ms: duration_ms(ack_deadline),
            policy: DeliveryPolicy::default(),
            delivered_total: 0,
            redelivered_total: 0,
            acked_total: 0,
            expired_total: 0,
            dead_lettered_total: 0,
            tally: None,
            gate: None,
        }
    }

    /// Sets the delivery gate (`None`: the subscription passed its topic's change); returns
    /// whether messages it held went back to be delivered, so that the caller wakes the pulls
    /// and streams waiting.
    pub fn set_gate(&mut self, gate: Option<KeyGate>) -> bool {
        self.gate = gate;
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return false };
        if in_flight.gated.is_empty() {
            return false;
        }
        // Whatever a new gate still holds is held again at its next delivery, in order.
        let held = std::mem::take(&mut in_flight.gated);
        in_flight.redeliver.extend(held);
        true
    }

    /// How many messages the delivery gate holds.
    pub fn gated(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |in_flight| in_flight.gated.len())
    }

    fn in_flight(&mut self) -> &mut InFlight {
        let tally = &self.tally;
        self.in_flight.get_or_insert_with(|| {
            let mut fresh = Box::<InFlight>::default();
            fresh.tally = tally.clone();
            fresh
        })
    }

    /// Counts the subscription's leases in `tally` (its topic's, on its shard) from now on,
    /// moving there what they hold now (leases restored at recovery).
    pub fn count_in(&mut self, tally: Rc<TopicOutstanding>) {
        if let Some(in_flight) = self.in_flight.as_deref_mut() {
            let bytes = in_flight.leases.iter().map(|(_, lease)| lease.bytes).sum();
            let messages = in_flight.leases.len() as u64;
            if let Some(old) = &in_flight.tally {
                old.give_back(messages, bytes);
            }
            tally.add(messages, bytes);
            in_flight.tally = Some(tally.clone());
        }
        self.tally = Some(tally);
    }

    /// What the topic's and shard's outstanding limits leave room for now.
    pub fn room(&self) -> Room {
        self.tally.as_ref().map_or(Room::UNLIMITED, |tally| tally.room())
    }

    /// The shard's count, for a pull or stream that waits for room.
    pub fn tally(&self) -> Option<&Rc<TopicOutstanding>> {
        self.tally.as_ref()
    }

    /// Whether a pull would find something to lease, room permitting: new messages below
    /// `end_offset`, or messages waiting to be delivered again.
    pub fn has_deliverable(&self, end_offset: Offset) -> bool {
        self.cursor < end_offset
            || self.in_flight.as_ref().is_some_and(|in_flight| !in_flight.redeliver.is_empty())
    }

    /// Drops the in-flight state once nothing in it is left (called on the forwarder's sweep).
    pub fn release_if_idle(&mut self) {
        if self.in_flight.as_ref().is_some_and(|in_flight| in_flight.is_idle()) {
            self.in_flight = None;
        }
    }

    /// Replays a durable acknowledgement (recovery). Nothing is leased during replay.
    pub fn restore_ack(&mut self, offset: Offset) {
        if offset >= self.start_offset {
            self.acked.insert(offset);
            self.cursor = self.acked.floor();
        }
    }

    /// The ack floor: every offset below it is acknowledged.
    pub fn ack_floor(&self) -> Offset {
        self.acked.floor()
    }

    pub fn outstanding(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |in_flight| in_flight.leases.len())
    }

    /// Messages published and not yet acknowledged, given the log's end.
    pub fn backlog(&self, end_offset: Offset) -> u64 {
        end_offset.saturating_sub(self.acked.floor()).saturating_sub(self.acked.above_floor())
    }

    /// Offsets below `offset` are gone from the log (retention): count them acknowledged.
    pub fn forget_before(&mut self, offset: Offset) {
        if offset <= self.acked.floor() {
            return;
        }
        self.acked.raise_floor(offset);
        // The floor may pass `offset` (acknowledgements recovered just above it): the cursor
        // goes with it, or the next pull's `cursor - floor` underflows.
        self.cursor = self.cursor.max(self.acked.floor());
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        let gone: Vec<Offset> = in_flight.leases.keys().filter(|leased| *leased < offset).collect();
        for leased in gone {
            in_flight.end_lease(leased);
        }
        in_flight.redeliver = in_flight.redeliver.split_off(&offset);
        in_flight.dead_letters = in_flight.dead_letters.split_off(&offset);
        in_flight.backing_off.retain(|Reverse((_, waiting))| *waiting >= offset);
        in_flight.attempts.retain(|leased, _| leased >= offset);
        in_flight.gated = in_flight.gated.split_off(&offset);
        if let Some(keys) = &in_flight.keys {
            let forgotten: Vec<Offset> =
                keys.key_of.keys().copied().filter(|keyed| *keyed < offset).collect();
            for keyed in forgotten {
                in_flight.free_key(keyed);
            }
        }
    }

    /// Ordered subscriptions: whether a leased message may go out now given its ordering key.
    /// If its key is busy with an earlier message, the lease is undone (no attempt counted) and
    /// the message waits, in order, behind that one.
    pub fn admit(&mut self, delivery: Delivery, ordering_key: &str) -> bool {
        if !self.policy.ordered || ordering_key.is_empty() {
            return true;
        }
        if self.gate.is_some_and(|gate| gate.holds(ordering_key.as_bytes())) {
            // Held by the delivery gate: unleased (no attempt counted, nothing against the
            // stream's window) until the subscription passes the change.
            self.release(delivery);
            let in_flight = self.in_flight();
            in_flight.redeliver.remove(&delivery.offset);
            in_flight.gated.insert(delivery.offset);
            return false;
        }
        let busy =
            self.in_flight().keys.get_or_insert_with(Box::default).busy_keys.get(ordering_key).copied();
        match busy {
            Some(busy) if busy != delivery.offset => {
                self.release(delivery);
                let in_flight = self.in_flight();
                in_flight.redeliver.remove(&delivery.offset);
                let keys = in_flight.keys.get_or_insert_with(Box::default);
                let queue = keys.held.entry(ordering_key.to_owned()).or_default();
                let at = queue.partition_point(|held| *held < delivery.offset);
                if queue.get(at) != Some(&delivery.offset) {
                    queue.insert(at, delivery.offset);
                }
                keys.key_of.insert(delivery.offset, ordering_key.to_owned());
                false
            }
            _ => {
                let keys = self.in_flight().keys.get_or_insert_with(Box::default);
                keys.busy_keys.insert(ordering_key.to_owned(), delivery.offset);
                keys.key_of.insert(delivery.offset, ordering_key.to_owned());
                true
            }
        }
    }

    /// Records the size of a leased message against its stream's flow control and the
    /// topic's and shard's outstanding bytes.
    pub fn account(&mut self, offset: Offset, bytes: u64) {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        if let Some(lease) = in_flight.leases.get_mut(offset) {
            if let Some(tally) = &in_flight.tally {
                tally.give_back(0, lease.bytes);
                tally.add(0, bytes);
            }
            lease.bytes = bytes;
            if lease.stream != 0 {
                let load = in_flight.streams.entry(lease.stream).or_default();
                load.bytes += bytes;
            }
        }
    }

    /// Streaming pulls open on this subscription.
    pub fn stream_count(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |in_flight| in_flight.streams.len())
    }

    pub fn stream_load(&self, stream: u64) -> StreamLoad {
        let load = self.in_flight.as_ref().and_then(|in_flight| in_flight.streams.get(&stream).copied());
        load.unwrap_or_default()
    }

    /// A stream ended: its leased messages are delivered again at once (their subscriber is
    /// gone), without counting a failed attempt.
    pub fn close_stream(&mut self, stream: u64) {
        let Some(in_flight) = self.in_flight.as_deref() else { return };
        let leased: Vec<Delivery> = in_flight
            .leases
            .iter()
            .filter(|(_, lease)| lease.stream == stream)
            .map(|(offset, lease)| Delivery {
                offset,
                attempt: in_flight.attempts.get(offset).copied().unwrap_or(1),
                generation: lease.generation,
            })
            .collect();
        for delivery in leased {
            self.release(delivery);
        }
        self.in_flight().streams.remove(&stream);
    }

    /// A stream ended whose client reconnects and still holds its messages: their leases leave
    /// the stream and run on to their deadlines, as a unary pull's do. The client extends or
    /// acknowledges them by ack id from its new stream, or they expire and are delivered again.
    pub fn detach_stream(&mut self, stream: u64) {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        in_flight.leases.retain(|_, lease| {
            // Its bytes stay: they count in the topic's and shard's outstanding bytes until
            // the lease ends (a lease of no stream counts in none).
            if lease.stream == stream {
                lease.stream = 0;
            }
            true
        });
        in_flight.streams.remove(&stream);
    }

    /// Takes the messages due for the dead-letter topic. The forwarder publishes each there and
    /// then acknowledges it here.
    pub fn take_dead_letters(&mut self) -> Vec<Offset> {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return Vec::new() };
        std::mem::take(&mut in_flight.dead_letters).into_iter().collect()
    }

    /// The acknowledgements as a floor and runs above it, for a snapshot.
    pub fn acknowledged_runs(&self) -> (Offset, Vec<(Offset, u32)>) {
        let above: Vec<Offset> = self.acked.iter_above_floor().collect();
        (self.acked.floor(), crate::subscription::journal_entry::runs_of(&above))
    }

    /// Restores, at recovery, a lease a subscriber was granted before the restart (a journaled
    /// deadline extension). Its generation is 0, which accepts the ack ids issued before.
    pub fn restore_lease(&mut self, offset: Offset, deadline: Instant) {
        if self.acked.contains(offset) || offset < self.start_offset {
            return;
        }
        let in_flight = self.in_flight();
        in_flight.insert_lease(offset, Lease { deadline, generation: 0, stream: 0, bytes: 0, pins: 0 });
        in_flight.push_deadline(deadline, offset, 0);
        if !in_flight.attempts.contains_key(offset) {
            in_flight.attempts.insert(offset, 1);
        }
    }

    /// Current leases and when they end, for a journal checkpoint.
    pub fn leases(&self) -> impl Iterator<Item = (Offset, Instant)> + '_ {
        self.in_flight
            .iter()
            .flat_map(|in_flight| in_flight.leases.iter().map(|(offset, lease)| (offset, lease.deadline)))
    }

    /// A dead-letter publish failed: the message waits to be dead-lettered again, or, if an
    /// update removed the policy (or raised its attempts) meanwhile, to be delivered again.
    pub fn return_dead_letter(&mut self, offset: Offset) {
        if self.acked.contains(offset) {
            return;
        }
        let exhausted = self.is_exhausted(offset);
        let in_flight = self.in_flight();
        if exhausted {
            in_flight.dead_letters.insert(offset);
        } else {
            in_flight.redeliver.insert(offset);
        }
    }

    /// Whether the policy sends this message to the dead-letter topic at its next failure.
    fn is_exhausted(&self, offset: Offset) -> bool {
        self.policy.max_delivery_attempts.is_some_and(|max| self.attempts(offset) >= max)
    }

    /// Takes a new delivery policy (an UpdateSubscription). Leases, backoffs and attempts run on
    /// under it; messages waiting for the dead-letter topic that the new policy would not send
    /// there (none, or more attempts) are delivered again instead of waiting for good.
    pub fn set_policy(&mut self, policy: DeliveryPolicy) {
        self.policy = policy;
        let waiting: Vec<Offset> = match self.in_flight.as_deref() {
            Some(in_flight) => in_flight.dead_letters.iter().copied().collect(),
            None => return,
        };
        for offset in waiting {
            if !self.is_exhausted(offset) {
                let in_flight = self.in_flight();
                in_flight.dead_letters.remove(&offset);
                in_flight.redeliver.insert(offset);
            }
        }
    }

    /// Delivery attempts made so far for an offset.
    pub fn attempts(&self, offset: Offset) -> u32 {
        self.in_flight.as_ref().and_then(|in_flight| in_flight.attempts.get(offset).copied()).unwrap_or(0)
    }

    /// Seek: everything below `offset` counts as acknowledged and everything from it on as not,
    /// including what was acknowledged before (replay). Leases and queues start over; open
    /// streams stay open.
    pub fn seek(&mut self, offset: Offset) {
        self.start_offset = self.start_offset.min(offset);
        self.acked = AckSet::new(offset);
        self.cursor = offset;
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        let leased: Vec<Offset> = in_flight.leases.keys().collect();
        for leased in leased {
            in_flight.end_lease(leased);
        }
        in_flight.deadlines.clear();
        in_flight.redeliver.clear();
        in_flight.backing_off.clear();
        in_flight.dead_letters.clear();
        in_flight.attempts.clear();
        in_flight.gated.clear();
        in_flight.keys = None;
    }

    /// Moves expired leases to the redelivery queue (or the dead letters) and messages whose
    /// retry backoff ended back to it; returns how many moved. Afterwards every deadline left is
    /// after `now` (asserted): a waiting loop that calls this before it reads `next_deadline`
    /// never sleeps for zero and spins (see `subscription::pull::sleep_until`).
    pub fn expire(&mut self, now: Instant) -> usize {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return 0 };
        let mut moved = 0;
        while let Some(Reverse((deadline, offset, generation))) = in_flight.deadlines.peek().copied() {
            if deadline > now {
                break;
            }
            in_flight.deadlines.pop();
            if let Some(lease) = in_flight.leases.get(offset) {
                // A pinned lease's deadline goes back on the heap when it is unpinned.
                if lease.generation == generation && lease.deadline <= now && lease.pins == 0 {
                    in_flight.end_lease(offset);
                    in_flight.fail(&self.policy, offset, now);
                    self.expired_total += 1;
                    moved += 1;
                }
            }
        }
        while let Some(Reverse((eligible, offset))) = in_flight.backing_off.peek().copied() {
            if eligible > now {
                break;
            }
            in_flight.backing_off.pop();
            if !self.acked.contains(offset) {
                in_flight.redeliver.insert(offset);
                moved += 1;
            }
        }
        // Checked in tests; in production the waiting loops' sleep floor keeps a broken
        // invariant from spinning a shard, and aborting the daemon for it would be worse.
        debug_assert!(
            self.next_deadline().is_none_or(|deadline| deadline > now),
            "a deadline at or before now survived expire: a waiting loop would spin"
        );
        moved
    }

    /// When the earliest lease expires or backoff ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        let in_flight = self.in_flight.as_deref()?;
        let lease = in_flight.deadlines.peek().map(|Reverse((deadline, _, _))| *deadline);
        let backoff = in_flight.backing_off.peek().map(|Reverse((eligible, _))| *eligible);
        match (lease, backoff) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Leases up to `max` messages: redeliveries first (oldest first), then new messages below
    /// `end_offset`.
    pub fn pull(&mut self, now: Instant, max: usize, end_offset: Offset) -> Vec<Delivery> {
        let deadline = self.ack_deadline();
        self.pull_for(now, max, end_offset, 0, deadline)
    }

    /// A pull on behalf of a stream (0: unary) with its own lease duration.
    pub fn pull_for(
        &mut self,
        now: Instant,
        max: usize,
        end_offset: Offset,
        stream: u64,
        lease: Duration,
    ) -> Vec<Delivery> {
        self.expire(now);
        let mut deliveries = Vec::new();
        // The topic's and shard's outstanding limits: beyond them, delivery pauses.
        let room = self.room();
        let max =
            if room.bytes == 0 { 0 } else { max.min(usize::try_from(room.messages).unwrap_or(usize::MAX)) };
        if self.in_flight.is_none() && self.cursor >= end_offset {
            // Nothing out, nothing new: an idle subscription's poll allocates nothing.
            return deliveries;
        }
        // The window (see the module's invariants), in release builds too: two comparisons a
        // pull, where a cursor below the floor would make the window's size wrap and the
        // subscription deliver nothing new again. The daemon is fail-stop (`fail_stop`).
        let floor = self.acked.floor();
        assert!(
            floor <= self.cursor && self.cursor - floor <= UNACKED_WINDOW_MAX,
            "the delivery cursor {} outside the window from the ack floor {floor}",
            self.cursor
        );
        while deliveries.len() < max {
            let in_flight = self.in_flight();
            let Some(offset) = in_flight.redeliver.pop_first() else { break };
            if in_flight.leases.contains_key(offset) || self.acked.contains(offset) {
                continue;
            }
            deliveries.push(self.lease(offset, now, stream, lease));
        }
        while deliveries.len() < max && self.cursor < end_offset {
            if self.cursor - self.acked.floor() >= UNACKED_WINDOW_MAX {
                break;
            }
            let offset = self.cursor;
            self.cursor += 1;
            if self.acked.contains(offset) || self.in_flight().leases.contains_key(offset) {
                continue;
            }
            deliveries.push(self.lease(offset, now, stream, lease));
        }
        deliveries
    }

    fn lease(&mut self, offset: Offset, now: Instant, stream: u64, duration: Duration) -> Delivery {
        // In the window: unacknowledged, so at or above the floor. Checked in debug builds only,
        // as it is on the path of every message delivered.
        debug_assert!(offset >= self.acked.floor(), "a lease of {offset}, below the ack floor");
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        self.delivered_total += 1;
        let deadline = now + duration;
        let in_flight = self.in_flight();
        in_flight.insert_lease(offset, Lease { deadline, generation, stream, bytes: 0, pins: 0 });
        if stream != 0 {
            in_flight.streams.entry(stream).or_default().messages += 1;
        }
        in_flight.push_deadline(deadline, offset, generation);
        let attempt = in_flight.attempts.get(offset).copied().unwrap_or(0) + 1;
        in_flight.attempts.insert(offset, attempt);
        if attempt > 1 {
            self.redelivered_total += 1;
        }
        Delivery { offset, attempt, generation }
    }

    /// Gives back a delivery that never reached the subscriber (its response did not fit).
    pub fn release(&mut self, delivery: Delivery) {
        let attempt = delivery.attempt;
        if self.in_flight.as_deref_mut().is_some_and(|in_flight| in_flight.release(delivery)) {
            self.delivered_total -= 1;
            if attempt > 1 {
                self.redelivered_total -= 1;
            }
        }
    }

    /// Checks an ack id at `now`. `Ok(Some(offset))`: acknowledge it (after making it
    /// durable); `Ok(None)`: already acknowledged, nothing to do.
    pub fn check_ack(&self, text: &str, now: Instant) -> Result<Option<Offset>, AckRefusal> {
        let ack_id = AckId::parse(text)?;
        if ack_id.subscription_id != self.id {
            return Err(AckRefusal::OtherSubscription);
        }
        // A topic's other sources each keep their own state of this subscription: an ack id of
        // theirs names offsets of another log.
        if ack_id.source != self.source {
            return Err(AckRefusal::OtherSource);
        }
        if ack_id.offset < self.start_offset || ack_id.offset >= self.cursor.max(self.acked.floor()) {
            return Err(AckRefusal::NeverDelivered);
        }
        if self.acked.contains(ack_id.offset) {
            return Ok(None);
        }
        let lease = self.in_flight.as_ref().and_then(|in_flight| in_flight.leases.get(ack_id.offset));
        if self.policy.exactly_once {
            // Generation 0, as below, is a lease restored at recovery, which the ack ids from
            // before the restart name. A pinned lease is current even past its deadline: its
            // acknowledgement is in flight, and this is the same one again.
            return match lease {
                Some(lease)
                    if (lease.generation == ack_id.generation || lease.generation == 0)
                        && (lease.deadline > now || lease.pins > 0) =>
                {
                    Ok(Some(ack_id.offset))
                }
                _ => Err(AckRefusal::LeaseEnded),
            };
        }
        match lease {
            // Generation 0 marks a lease restored at recovery: the ack ids from before the
            // restart are still good for it.
            Some(lease) if lease.generation != ack_id.generation && lease.generation != 0 => {
                Err(AckRefusal::Expired)
            }
            // Acknowledging a message whose lease expired but which was not delivered again yet
            // is accepted: it saves a duplicate, and at-least-once is kept either way.
            _ => Ok(Some(ack_id.offset)),
        }
    }

    /// The subscriber acknowledged the message (an ack id `check_ack` accepted): it stops
    /// counting against its stream's flow-control window at once, while the acknowledgement is
    /// made durable. Flow control bounds what the subscriber holds, and it holds this no more;
    /// waiting for the journal's fdatasync as well would leave the stream idle for it. The lease
    /// itself stays until `apply_ack`: if the journal fails, it expires and the message is
    /// delivered again.
    pub fn leave_window(&mut self, offset: Offset) {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        let Some(lease) = in_flight.leases.get_mut(offset) else { return };
        if lease.stream == 0 {
            return;
        }
        if let Some(load) = in_flight.streams.get_mut(&lease.stream) {
            load.messages = load.messages.saturating_sub(1);
            load.bytes = load.bytes.saturating_sub(lease.bytes);
        }
        // Its bytes stay with the lease, which the topic's and shard's outstanding bytes
        // count until `apply_ack` ends it.
        lease.stream = 0;
    }

    /// Exactly-once delivery: an acknowledgement of this lease (one `check_ack` accepted) is
    /// being made durable, so the lease must not end before it is applied or has failed.
    pub fn pin(&mut self, offset: Offset) {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        if let Some(lease) = in_flight.leases.get_mut(offset) {
            lease.pins = lease.pins.saturating_add(1);
        }
    }

    /// The acknowledgement that pinned a lease failed: once no other pins it, the lease runs
    /// to its deadline again (at once, if the deadline passed meanwhile).
    pub fn unpin(&mut self, offset: Offset) {
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        let Some(lease) = in_flight.leases.get_mut(offset) else { return };
        lease.pins = lease.pins.saturating_sub(1);
        if lease.pins == 0 {
            // `expire` dropped the heap entry it found while the lease was pinned.
            let (deadline, generation) = (lease.deadline, lease.generation);
            in_flight.push_deadline(deadline, offset, generation);
        }
    }

    /// Whether an offset is acknowledged (durably).
    pub fn is_acknowledged(&self, offset: Offset) -> bool {
        self.acked.contains(offset)
    }

    /// Applies a durable acknowledgement.
    pub fn apply_ack(&mut self, offset: Offset) {
        if offset < self.start_offset {
            return;
        }
        if self.acked.insert(offset) {
            self.acked_total += 1;
        }
        // Acknowledgements recovered out of order can stand above the cursor; one that raises
        // the floor past the cursor must take the cursor with it, or the next pull's
        // `cursor - floor` underflows and the subscription delivers nothing new again.
        self.cursor = self.cursor.max(self.acked.floor());
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return };
        in_flight.end_lease(offset);
        in_flight.redeliver.remove(&offset);
        in_flight.dead_letters.remove(&offset);
        in_flight.attempts.remove(offset);
        in_flight.free_key(offset);
    }

    /// ModifyAckDeadline for one ack id: 0 is a nack (redeliver now); otherwise the lease runs
    /// until `now + seconds`.
    pub fn modify_deadline(&mut self, text: &str, seconds: u32, now: Instant) -> Result<(), AckRefusal> {
        let Some(offset) = self.check_ack(text, now)? else { return Ok(()) };
        let ack_id = AckId::parse(text)?;
        let Some(in_flight) = self.in_flight.as_deref_mut() else { return Ok(()) };
        match in_flight.leases.get_mut(offset) {
            // Its acknowledgement is being made durable: that wins over a nack or extension.
            Some(lease) if lease.pins > 0 => Ok(()),
            Some(lease) if lease.generation == ack_id.generation || lease.generation == 0 => {
                if seconds == 0 {
                    in_flight.end_lease(offset);
                    in_flight.fail(&self.policy, offset, now);
                } else {
                    lease.deadline = now + Duration::from_secs(seconds as u64);
                    // The lease's own generation, not the ack id's: a lease restored at
                    // recovery has generation 0 and accepts older ack ids, and an entry under
                    // the ack id's generation would never match it, so it would never expire.
                    let (deadline, generation) = (lease.deadline, lease.generation);
                    in_flight.push_deadline(deadline, offset, generation);
                }
                Ok(())
            }
            // The lease already expired: the message waits for redelivery either way.
            _ => Ok(()),
        }
    }
}

/// A lease's length in whole milliseconds, at most `u32::MAX` (49 days; an ack deadline is
/// at most 600 s).
fn duration_ms(duration: Duration) -> u32 {
    duration.as_millis().min(u32::MAX as u128) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    fn ack_id(state: &SubscriptionState, delivery: &Delivery) -> String {
        AckId {
            subscription_id: state.id,
            source: SourceId::FIRST,
            offset: delivery.offset,
            generation: delivery.generation,
        }
        .encode()
    }

    /// The ack id a daemon before version 1 of the format gave the same delivery.
    fn version_0_ack_id(state: &SubscriptionState, delivery: &Delivery) -> String {
        format!("{:x}.{:x}.{:x}", state.id.get(), delivery.offset.get(), delivery.generation)
    }

    fn source(number: u32) -> SourceId {
        SourceId::new(number).unwrap()
    }

    #[test]
    fn ack_ids_are_versioned_lowercase_hex_and_parse_back() {
        for (subscription_id, source, offset, generation) in [
            (0, SourceId::FIRST, 0, 0),
            (1, source(1), 15, 16),
            (0xabc, source(0x7ff), 0x1_0000_0000, 7),
            (u64::MAX, SourceId::FIRST, u64::MAX, u32::MAX),
        ] {
            let ack_id = AckId {
                subscription_id: SubscriptionId::new(subscription_id),
                source,
                offset: Offset::new(offset),
                generation,
            };
            let text = ack_id.encode();
            let number = source.get();
            assert_eq!(text, format!("v1.{subscription_id:x}.{number:x}.{offset:x}.{generation:x}"));
            assert!(text.len() <= ACK_ID_ENCODED_BYTES_MAX);
            assert_eq!(AckId::parse(&text), Ok(ack_id));
        }
    }

    #[test]
    fn ack_set_floor_advances_over_runs() {
        let mut set = AckSet::new(Offset::new(5));
        assert!(set.contains(Offset::new(4)));
        assert!(!set.contains(Offset::new(5)));
        for offset in [7, 6, 8, 200, 5] {
            set.insert(Offset::new(offset));
        }
        assert_eq!(set.floor(), Offset::new(9));
        assert_eq!(set.above_floor(), 1);
        assert!(set.contains(Offset::new(200)));
        assert_eq!(set.iter_above_floor().collect::<Vec<_>>(), vec![Offset::new(200)]);
        set.raise_floor(Offset::new(201));
        assert_eq!(set.floor(), Offset::new(201));
        assert_eq!(set.above_floor(), 0);
    }

    /// What the parser accepted before it was written by hand, for the texts a version 0 ack id
    /// can be (the hand-written one also refuses a leading '+', which no ack id has).
    fn parse_by_splitting(text: &str) -> Option<AckId> {
        let mut parts = text.split('.');
        let subscription_id = u64::from_str_radix(parts.next()?, 16).ok()?;
        let offset = u64::from_str_radix(parts.next()?, 16).ok()?;
        let generation = u32::from_str_radix(parts.next()?, 16).ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(AckId {
            subscription_id: SubscriptionId::new(subscription_id),
            source: SourceId::FIRST,
            offset: Offset::new(offset),
            generation,
        })
    }

    #[test]
    fn malformed_ack_ids_are_refused() {
        for text in [
            "",
            ".",
            "..",
            "1.2",
            "1.2.",
            "1..3",
            ".2.3",
            "1.2.3.",
            "1.2.3.4",
            "1.2.g",
            "1.2.100000000",
            "10000000000000000.2.3",
            "1.2.3 ",
            " 1.2.3",
            "+1.2.3",
            "1.-2.3",
            "v1",
            "v1.",
            "v1.1.2.3",
            "v1.1.0.2.3.",
            "v1.1.0.2.3.4",
            "v1.1..2.3",
            "v1.1.800.2.3",
            "v1.1.100000000.2.3",
            "v1.1.0.2.100000000",
            "V1.1.0.2.3",
            "v.1.0.2.3",
            "vv1.1.0.2.3",
            "x1.1.0.2.3",
        ] {
            assert_eq!(AckId::parse(text), Err(AckRefusal::Malformed), "{text:?}");
        }
        assert_eq!(
            AckId::parse("00000000000000000001.A.ffffffff"),
            Ok(AckId {
                subscription_id: SubscriptionId::new(1),
                source: SourceId::FIRST,
                offset: Offset::new(10),
                generation: u32::MAX
            })
        );
        assert_eq!(
            AckId::parse("v1.00000000000000000001.7FF.A.ffffffff"),
            Ok(AckId {
                subscription_id: SubscriptionId::new(1),
                source: source(0x7ff),
                offset: Offset::new(10),
                generation: u32::MAX
            })
        );
    }

    /// An ack id of a later version is refused as such, whatever its fields, so that a
    /// newer daemon's format is never read as this one's.
    #[test]
    fn later_versions_are_refused_as_unknown() {
        for text in ["v2.1.0.2.3", "v2.", "v10.anything at all", "vff.1.2.3"] {
            assert_eq!(AckId::parse(text), Err(AckRefusal::UnknownVersion), "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn ack_ids_parse_as_splitting_did(
            text in "[0-9a-fA-F.]{0,40}|[0-9a-f]{1,17}\\.[0-9a-f]{1,17}\\.[0-9a-f]{1,9}",
        ) {
            proptest::prop_assert_eq!(AckId::parse(&text).ok(), parse_by_splitting(&text));
        }

        #[test]
        fn ack_ids_encode_and_parse_back(
            subscription_id: u64,
            number in 0..crate::ids::SOURCES_PER_TOPIC_MAX,
            offset: u64,
            generation: u32,
        ) {
            let id = SubscriptionId::new(subscription_id);
            let ack_id = AckId { subscription_id: id, source: source(number), offset: Offset::new(offset), generation };
            let text = ack_id.encode();
            proptest::prop_assert_eq!(
                &text,
                &format!("v1.{subscription_id:x}.{number:x}.{offset:x}.{generation:x}")
            );
            proptest::prop_assert_eq!(AckId::parse(&text), Ok(ack_id));
        }

        /// A version 0 ack id, held by a client across the upgrade, names what the version 1
        /// ack id of the same delivery names: source 0, the same offset and lease.
        #[test]
        fn version_0_ack_ids_parse_as_source_0(subscription_id: u64, offset: u64, generation: u32) {
            let old = format!("{subscription_id:x}.{offset:x}.{generation:X}");
            let id = SubscriptionId::new(subscription_id);
            let new = AckId { subscription_id: id, source: SourceId::FIRST, offset: Offset::new(offset), generation };
            proptest::prop_assert_eq!(AckId::parse(&old), Ok(new));
            proptest::prop_assert_eq!(AckId::parse(&new.encode()), Ok(new));
        }
        #[test]
        fn ack_set_matches_a_model(offsets in proptest::collection::vec(0u64..600, 0..400)) {
            let mut set = AckSet::new(Offset::new(0));
            let mut model = std::collections::BTreeSet::new();
            for offset in offsets {
                proptest::prop_assert_eq!(set.insert(Offset::new(offset)), model.insert(offset));
                let floor = (0..).find(|o| !model.contains(o)).unwrap();
                proptest::prop_assert_eq!(set.floor().get(), floor);
                proptest::prop_assert_eq!(set.above_floor(), model.iter().filter(|o| **o >= floor).count() as u64);
            }
        }
    }

    /// A key that moved to this source (1, from a topic of one source to two) is held by the
    /// delivery gate at any offset, unleased and in no window, while the others and unordered
    /// messages go; once the gate lifts, what it held is delivered in offset order.
    #[test]
    fn the_delivery_gate_holds_moved_keys_until_lifted() {
        use ringpost_model::sources::source_of_key;
        let key_to = |source: u32| {
            (0u32..)
                .map(|n| format!("key-{n}"))
                .find(|key| source_of_key(key.as_bytes(), 2) == source)
                .unwrap()
        };
        let (moved, stayed) = (key_to(1), key_to(0));
        let gate = KeyGate { source: 1, before: 1, after: 2 };
        assert!(gate.holds(moved.as_bytes()) && !gate.holds(stayed.as_bytes()));
        assert!(!KeyGate { source: 0, ..gate }.holds(stayed.as_bytes()), "source 0 gained nothing");
        assert!(!KeyGate { before: 2, ..gate }.holds(moved.as_bytes()), "no change, nothing held");
        // Retiring 2 -> 1: source 0 gains the keys of source 1.
        assert!(KeyGate { source: 0, before: 2, after: 1 }.holds(moved.as_bytes()));
        assert!(!KeyGate { source: 0, before: 2, after: 1 }.holds(stayed.as_bytes()));

        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(3), Offset::new(0), DEADLINE);
        state.policy.ordered = true;
        state.set_gate(Some(gate));
        let stream = 7;
        let keys = [moved.as_str(), stayed.as_str(), "", moved.as_str()];
        let deliveries = state.pull_for(now, 4, Offset::new(4), stream, DEADLINE);
        let admitted: Vec<u64> = deliveries
            .into_iter()
            .filter(|delivery| state.admit(*delivery, keys[delivery.offset.get() as usize]))
            .map(|delivery| delivery.offset.get())
            .collect();
        assert_eq!(admitted, [1, 2]);
        assert_eq!((state.gated(), state.outstanding()), (2, 2), "held ones are not leased");
        assert!(state.pull_for(now, 4, Offset::new(4), stream, DEADLINE).is_empty());
        assert!(state.set_gate(None), "lifting it gives back what it held");
        let again = state.pull_for(now, 4, Offset::new(4), stream, DEADLINE);
        let offsets: Vec<(u64, u32)> =
            again.iter().map(|delivery| (delivery.offset.get(), delivery.attempt)).collect();
        assert_eq!(offsets, [(0, 1), (3, 1)], "in order, no attempt counted while held");
        assert!(state.admit(again[0], &moved));
        assert!(!state.admit(again[1], &moved), "behind its key's first message, as always");
        assert_eq!(state.gated(), 0);
    }

    #[test]
    fn deliver_ack_and_redeliver_after_deadline() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(3), Offset::new(10), DEADLINE);
        let first = state.pull(now, 5, Offset::new(13));
        assert_eq!(first.iter().map(|d| d.offset.get()).collect::<Vec<_>>(), vec![10, 11, 12]);
        assert!(first.iter().all(|d| d.attempt == 1));
        let id = ack_id(&state, &first[0]);
        assert_eq!(state.check_ack(&id, now), Ok(Some(Offset::new(10))));
        state.apply_ack(Offset::new(10));
        assert_eq!(state.check_ack(&id, now), Ok(None), "acking twice is harmless");
        assert!(state.pull(now + Duration::from_secs(9), 5, Offset::new(13)).is_empty());
        let again = state.pull(now + DEADLINE, 5, Offset::new(13));
        assert_eq!(
            again.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(),
            vec![(11, 2), (12, 2)]
        );
        assert_eq!(state.check_ack(&ack_id(&state, &first[1]), now), Err(AckRefusal::Expired));
        assert_eq!(state.ack_floor(), Offset::new(11));
    }

    #[test]
    fn an_acknowledgement_frees_the_window_at_once_and_the_lease_once_durable() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(3), Offset::new(0), DEADLINE);
        let stream = 7;
        let deliveries = state.pull_for(now, 3, Offset::new(3), stream, DEADLINE);
        for delivery in &deliveries {
            state.account(delivery.offset, 100);
        }
        assert_eq!((state.stream_load(stream).messages, state.stream_load(stream).bytes), (3, 300));
        let id = ack_id(&state, &deliveries[0]);
        assert_eq!(state.check_ack(&id, now), Ok(Some(Offset::new(0))));
        state.leave_window(Offset::new(0));
        state.leave_window(Offset::new(0));
        assert_eq!((state.stream_load(stream).messages, state.stream_load(stream).bytes), (2, 200));
        // Until the acknowledgement is durable the lease holds: nothing is delivered again, and
        // a journal that failed would let it expire and be delivered again.
        assert!(state.pull(now, 5, Offset::new(3)).is_empty());
        state.apply_ack(Offset::new(0));
        assert_eq!(state.stream_load(stream).messages, 2, "counted once");
        // A stream that closes gives back only what its subscriber still held.
        let id = ack_id(&state, &deliveries[1]);
        assert_eq!(state.check_ack(&id, now), Ok(Some(Offset::new(1))));
        state.leave_window(Offset::new(1));
        state.close_stream(stream);
        let again = state.pull(now, 5, Offset::new(3));
        assert_eq!(again.iter().map(|d| d.offset.get()).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn nack_redelivers_at_once_and_extension_holds() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        let deliveries = state.pull(now, 2, Offset::new(2));
        state.modify_deadline(&ack_id(&state, &deliveries[0]), 0, now).unwrap();
        state.modify_deadline(&ack_id(&state, &deliveries[1]), 60, now).unwrap();
        let again = state.pull(now, 5, Offset::new(2));
        assert_eq!(again.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(), vec![(0, 2)]);
        // Offset 0's new lease expires after 10 s; offset 1's extension holds for 60 s.
        let before = state.pull(now + Duration::from_secs(59), 5, Offset::new(2));
        assert_eq!(before.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(), vec![(0, 3)]);
        let after = state.pull(now + Duration::from_secs(61), 5, Offset::new(2));
        assert_eq!(after.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(), vec![(1, 2)]);
    }

    /// Issue 47's storm: 1,000 leases, and extensions of 2,500 ids at a time (each lease
    /// extended again and again) with nothing pulled in between. The deadline heap stays within
    /// its bound throughout, and the last extension is the one that counts.
    #[test]
    fn a_storm_of_extensions_keeps_the_deadline_heap_bounded() {
        const LEASES: usize = 1000;
        const IDS_PER_REQUEST: usize = 2500;
        const REQUESTS: usize = 200;
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        let deliveries = state.pull(now, LEASES, Offset::new(LEASES as u64));
        assert_eq!(deliveries.len(), LEASES);
        let ids: Vec<String> = deliveries.iter().map(|delivery| ack_id(&state, delivery)).collect();
        let bound = DEADLINE_ENTRIES_PER_LEASE_MAX * LEASES + DEADLINE_ENTRIES_SLACK;
        let mut largest = 0;
        let mut last = now;
        for request in 0..REQUESTS {
            last = now + Duration::from_millis(request as u64);
            for id in ids.iter().cycle().take(IDS_PER_REQUEST) {
                state.modify_deadline(id, 600, last).unwrap();
                largest = largest.max(state.in_flight.as_ref().unwrap().deadlines.len());
            }
        }
        assert!(largest <= bound, "{largest} heap entries for {LEASES} leases (bound {bound})");
        assert!(
            state.pull(last + Duration::from_secs(599), LEASES, Offset::new(LEASES as u64)).is_empty(),
            "a lease ended before its last extension"
        );
        let again = state.pull(last + Duration::from_secs(600), LEASES, Offset::new(LEASES as u64));
        assert_eq!(again.len(), LEASES, "every lease ends with its last extension");
    }

    /// A full stream's leases expire although it pulls nothing: taking them back frees its
    /// window, and leaves no deadline at or before now (a waiting loop would sleep zero on it).
    #[test]
    fn expiring_frees_a_full_streams_window_and_leaves_only_later_deadlines() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        let leased = state.pull_for(now, 3, Offset::new(3), 7, DEADLINE);
        assert_eq!(leased.len(), 3);
        assert_eq!(state.stream_load(7).messages, 3);
        // One is extended: its old heap entry stays behind until it is popped.
        state.modify_deadline(&ack_id(&state, &leased[0]), 30, now).unwrap();
        let later = now + DEADLINE;
        assert_eq!(state.expire(later), 2);
        assert_eq!(state.stream_load(7).messages, 1, "the expired leases left the stream's window");
        assert!(state.next_deadline().is_some_and(|deadline| deadline > later));
        assert_eq!(state.expire(later), 0, "nothing more to take back at the same instant");
        let again = state.pull_for(later, 3, Offset::new(3), 8, DEADLINE);
        assert_eq!(
            again.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(),
            vec![(1, 2), (2, 2)]
        );
    }

    /// A lease restored at recovery (generation 0) and then extended with an ack id from
    /// before the restart still expires when its extension ends.
    #[test]
    fn a_restored_lease_extended_with_an_old_ack_id_still_expires() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        state.pull(now, 1, Offset::new(1));
        state.restore_lease(Offset::new(0), now + DEADLINE);
        let old = AckId {
            subscription_id: SubscriptionId::new(1),
            source: SourceId::FIRST,
            offset: Offset::new(0),
            generation: 41,
        }
        .encode();
        state.modify_deadline(&old, 20, now).unwrap();
        assert!(state.pull(now + Duration::from_secs(19), 1, Offset::new(1)).is_empty(), "extended");
        let again = state.pull(now + Duration::from_secs(21), 1, Offset::new(1));
        assert_eq!(again.iter().map(|d| d.offset.get()).collect::<Vec<_>>(), vec![0], "the extension ended");
    }

    #[test]
    fn bad_ack_ids_are_refused() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        state.pull(now, 1, Offset::new(1));
        assert_eq!(state.check_ack("zz", now), Err(AckRefusal::Malformed));
        assert_eq!(state.check_ack("2.0.1", now), Err(AckRefusal::OtherSubscription));
        assert_eq!(state.check_ack("1.5.1", now), Err(AckRefusal::NeverDelivered));
        assert_eq!(state.check_ack(&"1".repeat(100), now), Err(AckRefusal::Malformed));
    }

    /// An update that removes the dead-letter policy, or raises its attempts, sends messages
    /// waiting for the dead-letter topic (and ones whose dead-letter publish fails) back to
    /// delivery; one that lowers the attempts dead-letters at the next failure.
    #[test]
    fn a_new_delivery_policy_applies_to_messages_already_out() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        let policy = |max| DeliveryPolicy { max_delivery_attempts: max, ..Default::default() };
        state.set_policy(policy(Some(2)));
        for _ in 0..2 {
            let delivered = state.pull(now, 5, Offset::new(2));
            for delivery in &delivered {
                state.modify_deadline(&ack_id(&state, delivery), 0, now).unwrap();
            }
        }
        state.set_policy(policy(Some(3)));
        let third = state.pull(now, 5, Offset::new(2));
        assert_eq!(
            third.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(),
            vec![(0, 3), (1, 3)]
        );
        for delivery in &third {
            state.modify_deadline(&ack_id(&state, delivery), 0, now).unwrap();
        }
        assert!(state.pull(now, 5, Offset::new(2)).is_empty(), "both wait for the dead-letter topic");
        state.set_policy(policy(None));
        assert_eq!(state.pull(now, 5, Offset::new(2)).len(), 2, "without a policy they are delivered again");
        state.set_policy(policy(Some(4)));
        assert!(state.take_dead_letters().is_empty());
        // Their fourth leases expire: at 4 attempts both go to the dead-letter topic.
        assert!(state.pull(now + DEADLINE * 2, 5, Offset::new(2)).is_empty());
        assert_eq!(state.take_dead_letters(), vec![Offset::new(0), Offset::new(1)]);
        state.set_policy(policy(None));
        state.return_dead_letter(Offset::new(0));
        assert_eq!(
            state
                .pull(now + DEADLINE * 2, 5, Offset::new(2))
                .iter()
                .map(|d| d.offset.get())
                .collect::<Vec<_>>(),
            vec![0]
        );
    }

    #[test]
    fn a_detached_streams_leases_run_to_their_deadlines_and_its_ack_ids_stay_good() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(3), Offset::new(0), DEADLINE);
        let stream = 9;
        let deliveries = state.pull_for(now, 2, Offset::new(2), stream, DEADLINE);
        for delivery in &deliveries {
            state.account(delivery.offset, 100);
        }
        let held = ack_id(&state, &deliveries[0]);
        state.detach_stream(stream);
        assert_eq!(state.stream_count(), 0, "the stream's flow control is gone with it");
        // Nothing is delivered again while the leases run: the reconnected client holds them.
        assert!(state.pull(now, 5, Offset::new(2)).is_empty());
        assert_eq!(state.check_ack(&held, now), Ok(Some(Offset::new(0))), "its ack ids still acknowledge");
        // Past their deadlines they are delivered again, as any expired lease.
        let later = now + DEADLINE;
        let again: Vec<u64> =
            state.pull(later, 5, Offset::new(2)).iter().map(|delivery| delivery.offset.get()).collect();
        assert_eq!(again, vec![0, 1]);
    }

    #[test]
    fn restart_redelivers_everything_unacknowledged() {
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        for offset in [0, 1, 3] {
            state.restore_ack(Offset::new(offset));
        }
        let deliveries = state.pull(crate::runtime::now(), 10, Offset::new(5));
        assert_eq!(deliveries.iter().map(|d| d.offset.get()).collect::<Vec<_>>(), vec![2, 4]);
    }

    #[test]
    fn the_in_flight_state_goes_once_everything_is_done_and_old_ack_ids_stay_refused() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        assert!(state.pull(now, 10, Offset::new(0)).is_empty());
        assert!(state.in_flight.is_none(), "an idle poll allocates nothing");
        let first = state.pull_for(now, 2, Offset::new(2), 5, DEADLINE);
        state.release_if_idle();
        assert!(state.in_flight.is_some(), "leases are out");
        let stale = ack_id(&state, &first[1]);
        state.apply_ack(Offset::new(0));
        state.modify_deadline(&stale, 0, now).unwrap();
        let again = state.pull_for(now, 1, Offset::new(2), 5, DEADLINE);
        assert_eq!(again.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(), vec![(1, 2)]);
        state.apply_ack(Offset::new(1));
        state.release_if_idle();
        assert!(state.in_flight.is_some(), "the stream is still open");
        state.close_stream(5);
        state.release_if_idle();
        assert!(state.in_flight.is_none());
        assert_eq!((state.outstanding(), state.stream_count(), state.next_deadline()), (0, 0, None));
        // Delivered again after a seek: the generations go on, so the first delivery's ack id
        // does not acknowledge the new one.
        state.seek(Offset::new(0));
        let replay = state.pull(now, 2, Offset::new(2));
        assert_eq!(
            replay.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(),
            vec![(0, 1), (1, 1)]
        );
        assert_eq!(state.check_ack(&stale, now), Err(AckRefusal::Expired));
    }

    #[test]
    fn released_deliveries_come_first_without_counting_an_attempt() {
        let now = crate::runtime::now();
        let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        let deliveries = state.pull(now, 3, Offset::new(3));
        state.release(deliveries[2]);
        let next = state.pull(now, 3, Offset::new(3));
        assert_eq!(
            next,
            vec![Delivery { offset: Offset::new(2), attempt: 1, generation: next[0].generation }]
        );
    }

    fn exactly_once(id: u64) -> SubscriptionState {
        let mut state = SubscriptionState::new(SubscriptionId::new(id), Offset::new(0), DEADLINE);
        state.policy.exactly_once = true;
        state
    }

    /// Exactly-once delivery accepts an ack id only for its lease while the lease is current;
    /// without it, an expired lease not delivered again yet is still acknowledged.
    #[test]
    fn exactly_once_accepts_only_current_unexpired_leases() {
        let now = crate::runtime::now();
        let mut lenient = SubscriptionState::new(SubscriptionId::new(4), Offset::new(0), DEADLINE);
        let mut strict = exactly_once(4);
        for state in [&mut lenient, &mut strict] {
            let deliveries = state.pull(now, 2, Offset::new(2));
            let id = ack_id(state, &deliveries[0]);
            assert_eq!(
                state.check_ack(&id, now + DEADLINE - Duration::from_millis(1)),
                Ok(Some(Offset::new(0)))
            );
        }
        let late = now + DEADLINE;
        let id = ack_id(&lenient, &Delivery { offset: Offset::new(0), attempt: 1, generation: 1 });
        assert_eq!(
            lenient.check_ack(&id, late),
            Ok(Some(Offset::new(0))),
            "lenient: expired, not delivered again"
        );
        assert_eq!(strict.check_ack(&id, late), Err(AckRefusal::LeaseEnded));
        assert_eq!(strict.modify_deadline(&id, 30, late), Err(AckRefusal::LeaseEnded));
        // Delivered again: only the new lease's ack id is good.
        let again = strict.pull(late, 2, Offset::new(2));
        assert_eq!(again.iter().map(|d| d.offset.get()).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(strict.check_ack(&id, late), Err(AckRefusal::LeaseEnded));
        let current = ack_id(&strict, &again[0]);
        assert_eq!(strict.check_ack(&current, late), Ok(Some(Offset::new(0))));
        // An extension moves the deadline the check uses.
        strict.modify_deadline(&current, 60, late).unwrap();
        assert_eq!(strict.check_ack(&current, late + Duration::from_secs(59)), Ok(Some(Offset::new(0))));
        assert_eq!(strict.check_ack(&current, late + Duration::from_secs(60)), Err(AckRefusal::LeaseEnded));
        // The refusals of malformed, foreign and undelivered ids are as without it.
        assert_eq!(strict.check_ack("zz", now), Err(AckRefusal::Malformed));
        assert_eq!(strict.check_ack("5.0.1", now), Err(AckRefusal::OtherSubscription));
        assert_eq!(strict.check_ack("4.9.1", now), Err(AckRefusal::NeverDelivered));
    }

    /// An accepted acknowledgement pins its lease until it is applied: past its deadline, nacked
    /// or with its stream closed, the message is not delivered again; once applied, never.
    #[test]
    fn exactly_once_pins_a_lease_while_its_acknowledgement_is_made_durable() {
        let now = crate::runtime::now();
        let mut state = exactly_once(4);
        let stream = 3;
        let deliveries = state.pull_for(now, 2, Offset::new(2), stream, DEADLINE);
        let (first, second) = (ack_id(&state, &deliveries[0]), ack_id(&state, &deliveries[1]));
        for id in [&first, &second] {
            let offset = state.check_ack(id, now).unwrap().unwrap();
            state.leave_window(offset);
            state.pin(offset);
        }
        state.modify_deadline(&first, 0, now).unwrap();
        state.close_stream(stream);
        let late = now + 3 * DEADLINE;
        assert_eq!(state.expire(late), 0, "pinned leases do not expire");
        assert!(state.pull(late, 5, Offset::new(2)).is_empty(), "nothing pinned is delivered again");
        // The same ack id again, while the first write is in flight, is still good.
        assert_eq!(state.check_ack(&first, late), Ok(Some(Offset::new(0))));
        // The first write succeeds; the second fails and lets its lease run out.
        state.apply_ack(Offset::new(0));
        state.unpin(Offset::new(1));
        assert_eq!(state.check_ack(&second, late), Err(AckRefusal::LeaseEnded));
        let again = state.pull(late, 5, Offset::new(2));
        assert_eq!(again.iter().map(|d| (d.offset.get(), d.attempt)).collect::<Vec<_>>(), vec![(1, 2)]);
        assert_eq!(state.check_ack(&first, late), Ok(None), "acknowledged: nothing to do");
        assert!(state.pull(late + 10 * DEADLINE, 5, Offset::new(2)).iter().all(|d| d.offset.get() != 0));
        assert!(state.is_acknowledged(Offset::new(0)));
    }

    /// Two acknowledgements of one lease pin it twice: the failure of one leaves it pinned
    /// for the other.
    #[test]
    fn exactly_once_counts_pins() {
        let now = crate::runtime::now();
        let mut state = exactly_once(4);
        let deliveries = state.pull(now, 1, Offset::new(1));
        let id = ack_id(&state, &deliveries[0]);
        for _ in 0..2 {
            assert_eq!(state.check_ack(&id, now), Ok(Some(Offset::new(0))));
            state.pin(Offset::new(0));
        }
        state.unpin(Offset::new(0));
        let late = now + 2 * DEADLINE;
        assert!(state.pull(late, 1, Offset::new(1)).is_empty(), "still pinned by the other");
        state.unpin(Offset::new(0));
        assert_eq!(
            state.pull(late, 1, Offset::new(1)).len(),
            1,
            "unpinned past its deadline: delivered again"
        );
    }

    /// A lease restored at recovery (a journaled extension) takes the ack ids from before the
    /// restart until its deadline.
    #[test]
    fn exactly_once_honours_a_restored_lease_until_its_deadline() {
        let now = crate::runtime::now();
        let mut state = exactly_once(4);
        state.restore_lease(Offset::new(0), now + DEADLINE);
        state.pull(now, 0, Offset::new(1));
        let before_restart = AckId {
            subscription_id: SubscriptionId::new(4),
            source: SourceId::FIRST,
            offset: Offset::new(0),
            generation: 17,
        }
        .encode();
        state.cursor = Offset::new(1);
        assert_eq!(state.check_ack(&before_restart, now), Ok(Some(Offset::new(0))));
        assert_eq!(state.check_ack(&before_restart, now + DEADLINE), Err(AckRefusal::LeaseEnded));
    }

    /// A delivery cursor below the ack floor stops the pull with the window's assertion (in
    /// every build) rather than a window size that wraps.
    #[test]
    #[should_panic(expected = "outside the window")]
    fn a_cursor_below_the_floor_is_caught() {
        let mut state = SubscriptionState::new(SubscriptionId::new(4), Offset::new(0), DEADLINE);
        state.acked = AckSet::new(Offset::new(5));
        state.pull(crate::runtime::now(), 1, Offset::new(10));
    }

    proptest::proptest! {
        /// Over deliveries, redeliveries, acknowledgements and nacks, each delivery's version 0
        /// ack id (held across the upgrade) gets the answer its version 1 ack id gets, leniently
        /// and with exactly-once delivery; and the same ack id naming another source is never
        /// taken for it.
        #[test]
        fn version_0_ack_ids_get_the_answers_of_version_1(
            exactly_once_delivery: bool,
            steps in proptest::collection::vec((0u8..4, 0usize..8), 1..40),
        ) {
            let start = Instant::now();
            let mut state = SubscriptionState::new(SubscriptionId::new(9), Offset::new(0), DEADLINE);
            state.policy.exactly_once = exactly_once_delivery;
            let mut given = Vec::new();
            let mut now = start;
            for (step, which) in steps {
                match step {
                    0 => given.extend(state.pull(now, 3, Offset::new(16))),
                    1 => now += DEADLINE / 2,
                    2 => if let Some(delivery) = given.get(which) {
                        if let Ok(Some(offset)) = state.check_ack(&ack_id(&state, delivery), now) {
                            state.apply_ack(offset);
                        }
                    },
                    _ => if let Some(delivery) = given.get(which) {
                        let _ = state.modify_deadline(&version_0_ack_id(&state, delivery), 0, now);
                    },
                }
                for delivery in &given {
                    let new = ack_id(&state, delivery);
                    proptest::prop_assert_eq!(
                        state.check_ack(&version_0_ack_id(&state, delivery), now),
                        state.check_ack(&new, now)
                    );
                    let elsewhere = AckId {
                        subscription_id: state.id,
                        source: source(1),
                        offset: delivery.offset,
                        generation: delivery.generation,
                    };
                    proptest::prop_assert_eq!(state.check_ack(&elsewhere.encode(), now), Err(AckRefusal::OtherSource));
                }
            }
        }
    }

    /// What the subscription's leases hold, as the outstanding counts should have it.
    fn leased(state: &SubscriptionState) -> (u64, u64) {
        state.in_flight.as_ref().map_or((0, 0), |in_flight| {
            let bytes = in_flight.leases.iter().map(|(_, lease)| lease.bytes).sum();
            (in_flight.leases.len() as u64, bytes)
        })
    }

    fn counted(
        messages_topic_max: u64,
    ) -> (Rc<crate::subscription::outstanding::ShardOutstanding>, Rc<TopicOutstanding>) {
        use crate::subscription::outstanding::{OutstandingLimits, ShardOutstanding};
        let shard = ShardOutstanding::new(OutstandingLimits {
            messages_shard_max: 1000,
            bytes_shard_max: u64::MAX,
            messages_topic_max,
            bytes_topic_max: u64::MAX,
        });
        let topic = TopicOutstanding::new(&shard);
        (shard, topic)
    }

    #[test]
    fn delivery_pauses_at_the_outstanding_limit_and_resumes_when_leases_end() {
        let now = crate::runtime::now();
        let (shard, topic) = counted(4);
        let mut first = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
        let mut second = SubscriptionState::new(SubscriptionId::new(2), Offset::new(0), DEADLINE);
        first.count_in(topic.clone());
        second.count_in(topic.clone());
        assert_eq!(first.pull(now, 3, Offset::new(10)).len(), 3);
        let given = second.pull(now, 3, Offset::new(10));
        assert_eq!(given.len(), 1, "the topic's fourth message fills its limit");
        assert!(second.room().is_full() && first.pull(now, 3, Offset::new(10)).is_empty());
        second.apply_ack(given[0].offset);
        assert_eq!(first.pull(now, 3, Offset::new(10)).len(), 1);
        // Expiries give their count back too.
        assert_eq!(first.expire(now + DEADLINE), 4);
        assert_eq!(topic.held(), (0, 0));
        assert_eq!(second.pull(now + DEADLINE, 9, Offset::new(10)).len(), 4);
        drop(second);
        assert_eq!(shard.held(), (0, 0), "a dropped subscription gives back what it held");
    }

    proptest::proptest! {
        /// The topic's and shard's counts follow the leases through every way a lease is taken
        /// and ends, and what is left comes back when the subscription goes.
        #[test]
        fn outstanding_counts_follow_the_leases(
            steps in proptest::collection::vec((0u8..11, 0usize..16, 1u64..500), 1..120),
        ) {
            let (shard, topic) = counted(10);
            let mut now = crate::runtime::now();
            let mut state = SubscriptionState::new(SubscriptionId::new(1), Offset::new(0), DEADLINE);
            // A restored lease counted when the subscription is attached.
            state.restore_lease(Offset::new(3), now + DEADLINE);
            state.count_in(topic.clone());
            let mut given: Vec<Delivery> = Vec::new();
            let end = Offset::new(40);
            for (step, which, bytes) in steps {
                let pick = given.get(which % given.len().max(1)).copied();
                match step {
                    0 => given.extend(state.pull(now, 3, end)),
                    1 => given.extend(state.pull_for(now, 4, end, 1 + which as u64 % 2, DEADLINE)),
                    2 => now += DEADLINE / 3,
                    3 => if let Some(delivery) = pick { state.account(delivery.offset, bytes) },
                    4 => if let Some(delivery) = pick {
                        if let Ok(Some(offset)) = state.check_ack(&ack_id(&state, &delivery), now) {
                            state.leave_window(offset);
                            state.apply_ack(offset);
                        }
                    },
                    5 => if let Some(delivery) = pick {
                        let _ = state.modify_deadline(&ack_id(&state, &delivery), 0, now);
                    },
                    6 => if let Some(delivery) = pick { state.release(delivery) },
                    7 => state.close_stream(1 + which as u64 % 2),
                    8 => state.detach_stream(1 + which as u64 % 2),
                    9 => state.forget_before(Offset::new(which as u64)),
                    _ => { state.expire(now); }
                }
                state.release_if_idle();
                proptest::prop_assert_eq!(topic.held(), leased(&state));
                proptest::prop_assert_eq!(shard.held(), leased(&state));
                proptest::prop_assert!(topic.held().0 <= 10);
            }
            drop(state);
            proptest::prop_assert_eq!(shard.held(), (0, 0));
        }
    }
}
