//! The shard's budget for responses being read or waiting for their sockets: a pull or a
//! stream reserves its next response's bytes before it leases or reads anything, and the
//! protocol holds the reservation until the socket took the response.

use crate::api::limits::MESSAGE_BYTES_MAX;
use crate::sync::Notify;
use std::cell::Cell;
use std::rc::Rc;

/// Bytes of messages one pull response may carry; the native protocol asserts that its frame
/// limit leaves room beside them for the envelope of the largest single message.
pub const PULL_RESPONSE_BYTES_MAX: usize = 12 * 1024 * 1024;
const _: () = assert!(MESSAGE_BYTES_MAX <= PULL_RESPONSE_BYTES_MAX);

/// Bytes the streams and pulls of one shard may have reserved for responses they are reading or
/// have queued and not yet written. A stream reserves its next frame's size before it reads its
/// messages and holds it until the socket took the frame (a unary pull the same, for its one
/// response), so subscribers that stall hold at most this much between them (thirty stalled
/// streams of 1 MB messages took 5 GB without it), and the rest wait, their messages staying in
/// the log.
pub const STREAM_RESERVED_BYTES_SHARD_MAX: usize = 128 << 20;
const _: () = assert!(PULL_RESPONSE_BYTES_MAX * 4 <= STREAM_RESERVED_BYTES_SHARD_MAX);

/// One shard's `STREAM_RESERVED_BYTES_SHARD_MAX`, and what its gathered frames hold. Each
/// shard's environment holds its own (`subscription::Environment::stream_budget`, made with its
/// forwarder), so shards that a simulation runs on one thread do not share what the daemon
/// keeps per shard.
pub struct StreamBudget {
    reserved: Cell<usize>,
    room: Notify,
    /// Bytes of read buffers the shard's gathered frames hold until their sockets take them,
    /// which the native protocol bounds (`GATHERED_HELD_BYTES_SHARD_MAX`): counted here, beside
    /// the reservations their responses hold, so that they are per shard as these are.
    gathered: Cell<usize>,
}

impl StreamBudget {
    pub fn new() -> Rc<StreamBudget> {
        Rc::new(StreamBudget { reserved: Cell::new(0), room: Notify::new(), gathered: Cell::new(0) })
    }

    /// Bytes of the budget taken now.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved.get()
    }

    /// Bytes the shard's gathered frames hold now.
    pub fn gathered_bytes(&self) -> usize {
        self.gathered.get()
    }

    /// A gathered frame holds `bytes` more of the shard's read buffers.
    pub fn hold_gathered(&self, bytes: usize) {
        self.gathered.set(self.gathered.get() + bytes);
    }

    /// A gathered frame let go of `bytes` it held.
    pub fn release_gathered(&self, bytes: usize) {
        let held = self.gathered.get();
        assert!(bytes <= held, "released {bytes} gathered bytes of {held} held");
        self.gathered.set(held - bytes);
    }

    /// Reserves `bytes` if they fit the budget (or nothing else is reserved, so that one frame
    /// larger than the budget still goes out); `None` otherwise.
    pub fn try_reserve(self: &Rc<Self>, bytes: usize) -> Option<StreamReservation> {
        let reserved = self.reserved.get();
        if reserved != 0 && reserved.saturating_add(bytes) > STREAM_RESERVED_BYTES_SHARD_MAX {
            return None;
        }
        self.reserved.set(reserved + bytes);
        Some(StreamReservation { budget: self.clone(), bytes })
    }

    /// Resolves the next time reserved bytes are given back.
    pub async fn freed(&self) {
        self.room.notified().await
    }
}

/// A share of a shard's `StreamBudget`, given back when dropped.
pub struct StreamReservation {
    budget: Rc<StreamBudget>,
    bytes: usize,
}

impl StreamReservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The shard's budget the reservation came from.
    pub fn budget(&self) -> &Rc<StreamBudget> {
        &self.budget
    }

    /// Holds what the frame turned out to take: less than reserved, or more by the envelope
    /// of its messages and the one message a window always lets through.
    pub fn fit_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.give_back(self.bytes - bytes);
        } else {
            let reserved = &self.budget.reserved;
            reserved.set(reserved.get() + (bytes - self.bytes));
            self.bytes = bytes;
        }
    }

    fn give_back(&mut self, bytes: usize) {
        self.bytes -= bytes;
        let budget = &self.budget;
        budget.reserved.set(budget.reserved.get() - bytes);
        if budget.room.waiters() > 0 {
            budget.room.notify_all();
        }
    }
}

impl Drop for StreamReservation {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.give_back(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_reservations_share_the_shards_budget_and_give_it_back() {
        let budget = StreamBudget::new();
        assert_eq!(budget.reserved_bytes(), 0);
        // One frame larger than the budget still goes out when nothing else is reserved.
        let mut first = budget.try_reserve(STREAM_RESERVED_BYTES_SHARD_MAX + 1).unwrap();
        assert!(budget.try_reserve(1).is_none(), "over the budget");
        first.fit_to(STREAM_RESERVED_BYTES_SHARD_MAX / 2);
        assert_eq!(budget.reserved_bytes(), STREAM_RESERVED_BYTES_SHARD_MAX / 2);
        let second = budget.try_reserve(STREAM_RESERVED_BYTES_SHARD_MAX / 2).unwrap();
        assert!(budget.try_reserve(1).is_none());
        drop(first);
        assert_eq!(budget.reserved_bytes(), STREAM_RESERVED_BYTES_SHARD_MAX / 2);
        let mut third = budget.try_reserve(1000).unwrap();
        third.fit_to(3000);
        assert_eq!(budget.reserved_bytes(), STREAM_RESERVED_BYTES_SHARD_MAX / 2 + 3000);
        drop((second, third));
        assert_eq!(budget.reserved_bytes(), 0);
    }
}
