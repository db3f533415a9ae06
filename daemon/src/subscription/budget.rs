//! The shard's budget for responses being read or waiting for their sockets: a pull or a
//! stream reserves its next response's bytes before it leases or reads anything, and the
//! protocol holds the reservation until the socket took the response.

use crate::api::limits::MESSAGE_BYTES_MAX;
use crate::sync::Notify;
use std::cell::Cell;

/// Bytes of messages one pull response may carry; the native protocol asserts that its frame
/// limit leaves room beside them for the envelope of the largest single message.
pub const PULL_RESPONSE_BYTES_MAX: usize = 12 * 1024 * 1024;
const _: () = assert!(MESSAGE_BYTES_MAX <= PULL_RESPONSE_BYTES_MAX);

thread_local! {
    static STREAM_RESERVED_BYTES: Cell<usize> = const { Cell::new(0) };
    static STREAM_ROOM: Notify = Notify::new();
}

/// Bytes the streams and pulls of one shard may have reserved for responses they are reading or
/// have queued and not yet written. A stream reserves its next frame's size before it reads its
/// messages and holds it until the socket took the frame (a unary pull the same, for its one
/// response), so subscribers that stall hold at most this much between them (thirty stalled
/// streams of 1 MB messages took 5 GB without it), and the rest wait, their messages staying in
/// the log.
pub const STREAM_RESERVED_BYTES_SHARD_MAX: usize = 128 << 20;
const _: () = assert!(PULL_RESPONSE_BYTES_MAX * 4 <= STREAM_RESERVED_BYTES_SHARD_MAX);

/// Bytes of this shard's `STREAM_RESERVED_BYTES_SHARD_MAX` taken now.
pub fn stream_reserved_bytes() -> usize {
    STREAM_RESERVED_BYTES.get()
}

/// A share of `STREAM_RESERVED_BYTES_SHARD_MAX`, given back when dropped.
pub struct StreamReservation {
    bytes: usize,
}

impl StreamReservation {
    /// Reserves `bytes` if they fit the shard's budget (or nothing else is reserved, so that
    /// one frame larger than the budget still goes out); `None` otherwise.
    pub fn try_new(bytes: usize) -> Option<StreamReservation> {
        let reserved = STREAM_RESERVED_BYTES.get();
        if reserved != 0 && reserved.saturating_add(bytes) > STREAM_RESERVED_BYTES_SHARD_MAX {
            return None;
        }
        STREAM_RESERVED_BYTES.set(reserved + bytes);
        Some(StreamReservation { bytes })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds what the frame turned out to take: less than reserved, or more by the envelope
    /// of its messages and the one message a window always lets through.
    pub fn fit_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.give_back(self.bytes - bytes);
        } else {
            STREAM_RESERVED_BYTES.set(STREAM_RESERVED_BYTES.get() + (bytes - self.bytes));
            self.bytes = bytes;
        }
    }

    fn give_back(&mut self, bytes: usize) {
        self.bytes -= bytes;
        STREAM_RESERVED_BYTES.set(STREAM_RESERVED_BYTES.get() - bytes);
        STREAM_ROOM.with(|room| {
            if room.waiters() > 0 {
                room.notify_all();
            }
        });
    }

    /// Resolves the next time reserved bytes are given back.
    pub async fn freed() {
        STREAM_ROOM.with(Notify::notified).await
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
        assert_eq!(stream_reserved_bytes(), 0);
        // One frame larger than the budget still goes out when nothing else is reserved.
        let mut first = StreamReservation::try_new(STREAM_RESERVED_BYTES_SHARD_MAX + 1).unwrap();
        assert!(StreamReservation::try_new(1).is_none(), "over the budget");
        first.fit_to(STREAM_RESERVED_BYTES_SHARD_MAX / 2);
        assert_eq!(stream_reserved_bytes(), STREAM_RESERVED_BYTES_SHARD_MAX / 2);
        let second = StreamReservation::try_new(STREAM_RESERVED_BYTES_SHARD_MAX / 2).unwrap();
        assert!(StreamReservation::try_new(1).is_none());
        drop(first);
        assert_eq!(stream_reserved_bytes(), STREAM_RESERVED_BYTES_SHARD_MAX / 2);
        let mut third = StreamReservation::try_new(1000).unwrap();
        third.fit_to(3000);
        assert_eq!(stream_reserved_bytes(), STREAM_RESERVED_BYTES_SHARD_MAX / 2 + 3000);
        drop((second, third));
        assert_eq!(stream_reserved_bytes(), 0);
    }
}
