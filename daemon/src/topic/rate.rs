//! A topic's publish rate: token buckets of messages and bytes a second, decided without I/O
//! on the shard's clock, and the shard's budget for publishes it holds back.
//!
//! A publish within the rate goes on at once. One over it is first slowed: held on the shard
//! until the buckets cover it, at most `PUBLISH_HOLD_MAX`, its bytes counted against
//! `PUBLISH_HELD_BYTES_SHARD_MAX`. Beyond that it is refused with `ResourceExhausted` and the
//! delay after which a retry would be held no longer than `PUBLISH_HOLD_MAX` (were nobody else
//! publishing), which the client library waits before retrying. A refused publish takes no
//! tokens. So a burst is smoothed to the rate, the memory it holds on the shard is bounded, and
//! a publisher that retries loses nothing.
//!
//! Off by default (`PublishRateLimits::default`, 0 for each): a topic's rate is already bounded
//! by its shard's core and disks, and a limit below that is an operator's choice about how a
//! topic may share a node, not a safety bound.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Longest a publish over its topic's rate is held on the shard before it is refused instead:
/// long enough to smooth a burst without a round trip, short against Pub/Sub's 60 s publish
/// deadline and the client's request timeout. Google's clients do not read the refusal's
/// RetryInfo: they back off with full jitter growing fourfold a try, so each refusal leaves the
/// topic idle for long. Measured with Google's Python publisher (tests/python/test_flow_control.py,
/// 500 messages at 50 a second in requests of 10): a 1 s hold resolved the burst in 24 to 50 s
/// (four runs), this one in 9.0 s, the rate's own time, in four runs of seven (at most 22.9 s).
pub const PUBLISH_HOLD_MAX: Duration = Duration::from_secs(5);
/// Bytes of publishes one shard holds back at once (their requests' messages stay in memory
/// while held); one more is refused at once.
pub const PUBLISH_HELD_BYTES_SHARD_MAX: usize = 64 << 20;
/// How much a bucket holds: a second of its rate, the burst a topic takes at once.
pub const PUBLISH_BURST: Duration = Duration::from_secs(1);
/// The shortest retry delay a refusal names, so that a client never spins on one.
pub const PUBLISH_RETRY_DELAY_MIN: Duration = Duration::from_millis(10);

/// Every topic's publish rate on a node (`--publish-messages-per-second-topic-max`,
/// `--publish-kib-per-second-topic-max`); 0: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishRateLimits {
    pub messages_per_second: u64,
    pub bytes_per_second: u64,
}

impl PublishRateLimits {
    /// One source's share of a topic's limits when `active` sources take its publishes: each an
    /// even part, so that the topic's publishes, which its publishers spread evenly, stay
    /// within the limit in all (never 0, which would mean no limit).
    pub fn per_source(self, active: u32) -> PublishRateLimits {
        let share = |limit: u64| if limit == 0 { 0 } else { (limit / u64::from(active.max(1))).max(1) };
        PublishRateLimits {
            messages_per_second: share(self.messages_per_second),
            bytes_per_second: share(self.bytes_per_second),
        }
    }
}

/// A token bucket: `rate` tokens a second, up to a second's worth. A request larger than the
/// bucket can hold goes when the bucket is full, leaving it in debt, so it is not refused for
/// good; the debt then holds back the requests after it.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_second: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    pub fn new(rate_per_second: u64, now: Instant) -> TokenBucket {
        assert!(rate_per_second > 0, "a bucket of no rate");
        let rate_per_second = rate_per_second as f64;
        TokenBucket { rate_per_second, tokens: rate_per_second * PUBLISH_BURST.as_secs_f64(), updated: now }
    }

    fn capacity(&self) -> f64 {
        self.rate_per_second * PUBLISH_BURST.as_secs_f64()
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_second).min(self.capacity());
        self.updated = self.updated.max(now);
    }

    /// How long until `amount` tokens are there (zero: now).
    pub fn wait_for(&mut self, amount: u64, now: Instant) -> Duration {
        self.refill(now);
        let amount = amount as f64;
        if self.tokens >= amount || self.tokens >= self.capacity() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((amount - self.tokens) / self.rate_per_second)
    }

    /// Takes `amount` tokens (after `wait_for` said when), into debt if need be.
    pub fn take(&mut self, amount: u64, now: Instant) {
        self.refill(now);
        self.tokens -= amount as f64;
    }

    pub fn rate_per_second(&self) -> u64 {
        self.rate_per_second as u64
    }
}

/// What a publish over its topic's rate is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Within the rate: go on.
    Now,
    /// Go on after this wait on the shard (its tokens are taken).
    Held(Duration),
    /// Refused: retry after this delay. `limit` names the bound that refused it.
    Refused { retry_after: Duration, limit: &'static str },
}

/// One topic's buckets, made when a publish first meets a limit and remade when the limits
/// change; boxed, so that a topic never limited carries a pointer rather than their 80 bytes
/// (an idle topic's memory is bounded).
#[derive(Default)]
pub struct TopicRate {
    buckets: Option<Box<TopicBuckets>>,
}

#[derive(Default)]
struct TopicBuckets {
    limits: PublishRateLimits,
    messages: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
}

impl TopicRate {
    /// Decides a publish of `messages` messages of `bytes` bytes at `now` under `limits`,
    /// `held_bytes` being what the shard holds back already. Takes the tokens unless refused.
    pub fn admit(
        &mut self,
        limits: PublishRateLimits,
        messages: u64,
        bytes: u64,
        held_bytes: usize,
        now: Instant,
    ) -> Admission {
        let buckets = self.buckets.get_or_insert_with(Box::default);
        if limits != buckets.limits {
            let bucket = |rate: u64| (rate > 0).then(|| TokenBucket::new(rate, now));
            **buckets = TopicBuckets {
                limits,
                messages: bucket(limits.messages_per_second),
                bytes: bucket(limits.bytes_per_second),
            };
        }
        let messages_wait =
            buckets.messages.as_mut().map_or(Duration::ZERO, |bucket| bucket.wait_for(messages, now));
        let bytes_wait = buckets.bytes.as_mut().map_or(Duration::ZERO, |bucket| bucket.wait_for(bytes, now));
        let wait = messages_wait.max(bytes_wait);
        let limit = if messages_wait >= bytes_wait {
            "PUBLISH_MESSAGES_PER_SECOND"
        } else {
            "PUBLISH_BYTES_PER_SECOND"
        };
        if wait > PUBLISH_HOLD_MAX {
            let retry_after = (wait - PUBLISH_HOLD_MAX).max(PUBLISH_RETRY_DELAY_MIN);
            return Admission::Refused { retry_after, limit };
        }
        if !wait.is_zero() && held_bytes.saturating_add(bytes as usize) > PUBLISH_HELD_BYTES_SHARD_MAX {
            return Admission::Refused {
                retry_after: wait.max(PUBLISH_RETRY_DELAY_MIN),
                limit: "PUBLISH_HELD_BYTES_SHARD_MAX",
            };
        }
        if let Some(bucket) = &mut buckets.messages {
            bucket.take(messages, now);
        }
        if let Some(bucket) = &mut buckets.bytes {
            bucket.take(bytes, now);
        }
        if wait.is_zero() {
            Admission::Now
        } else {
            Admission::Held(wait)
        }
    }
}

/// One shard's publish limits, the bytes of the publishes it holds back, and its counts of
/// publishes slowed and refused (`/metrics`).
#[derive(Default)]
pub struct ShardPublishRate {
    pub limits: Cell<PublishRateLimits>,
    pub held_bytes: Cell<usize>,
    pub slowed_total: Cell<u64>,
    /// By the limit that refused them: the messages' rate, the bytes' rate, the held bytes.
    pub refused_messages_total: Cell<u64>,
    pub refused_bytes_total: Cell<u64>,
    pub refused_held_total: Cell<u64>,
}

/// Bytes of a held publish, counted in its shard's `held_bytes` until dropped.
pub struct HeldPublish {
    shard: Rc<ShardPublishRate>,
    bytes: usize,
}

impl ShardPublishRate {
    pub fn new() -> Rc<ShardPublishRate> {
        Rc::new(ShardPublishRate::default())
    }

    /// Whether any limit is set (else a publish skips the buckets).
    pub fn is_limited(&self) -> bool {
        self.limits.get() != PublishRateLimits::default()
    }

    /// Decides a publish to `topic`, one of `active` sources taking its topic's publishes (its
    /// share of the limits: `PublishRateLimits::per_source`), counting it.
    pub fn admit(
        &self,
        topic: &RefCell<TopicRate>,
        active: u32,
        messages: u64,
        bytes: u64,
        now: Instant,
    ) -> Admission {
        let limits = self.limits.get().per_source(active);
        let admission = topic.borrow_mut().admit(limits, messages, bytes, self.held_bytes.get(), now);
        let counter = match admission {
            Admission::Now => return admission,
            Admission::Held(_) => &self.slowed_total,
            Admission::Refused { limit: "PUBLISH_MESSAGES_PER_SECOND", .. } => &self.refused_messages_total,
            Admission::Refused { limit: "PUBLISH_BYTES_PER_SECOND", .. } => &self.refused_bytes_total,
            Admission::Refused { .. } => &self.refused_held_total,
        };
        counter.set(counter.get() + 1);
        admission
    }

    /// Counts `bytes` held back until the result is dropped.
    pub fn hold(self: &Rc<Self>, bytes: usize) -> HeldPublish {
        self.held_bytes.set(self.held_bytes.get() + bytes);
        HeldPublish { shard: self.clone(), bytes }
    }
}

impl Drop for HeldPublish {
    fn drop(&mut self) {
        let held = self.shard.held_bytes.get();
        assert!(self.bytes <= held, "released {} held publish bytes of {held}", self.bytes);
        self.shard.held_bytes.set(held - self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn limits(messages_per_second: u64) -> PublishRateLimits {
        PublishRateLimits { messages_per_second, bytes_per_second: 0 }
    }

    #[test]
    fn a_burst_is_taken_then_held_then_refused_with_the_delay_that_would_be_held_no_longer() {
        let now = crate::runtime::now();
        let mut rate = TopicRate::default();
        let hold = PUBLISH_HOLD_MAX;
        // A second's worth at once: within the bucket.
        assert_eq!(rate.admit(limits(100), 100, 0, 0, now), Admission::Now);
        // The next 50 wait half a second for their tokens; those after them, up to the hold.
        assert_eq!(rate.admit(limits(100), 50, 0, 0, now), Admission::Held(SECOND / 2));
        let up_to_the_hold = (100.0 * hold.as_secs_f64()) as u64 - 50;
        assert_eq!(rate.admit(limits(100), up_to_the_hold, 0, 0, now), Admission::Held(hold));
        // 2 more would wait 20 ms past the hold: refused, with the 20 ms after which they would
        // be held no longer than it.
        let Admission::Refused { retry_after, limit } = rate.admit(limits(100), 2, 0, 0, now) else {
            panic!("not refused")
        };
        assert_eq!(limit, "PUBLISH_MESSAGES_PER_SECOND");
        assert!((retry_after.as_secs_f64() - 0.02).abs() < 1e-6, "{retry_after:?}");
        // A refusal took nothing: after those 20 ms the same publish is held for the hold.
        let later = now + Duration::from_millis(20);
        let Admission::Held(wait) = rate.admit(limits(100), 2, 0, 0, later) else { panic!("not held") };
        assert!((wait.as_secs_f64() - hold.as_secs_f64()).abs() < 1e-6, "{wait:?}");
        // Idle for long, the bucket holds a second's worth again, no more.
        let idle = now + 10 * hold;
        assert_eq!(rate.admit(limits(100), 100, 0, 0, idle), Admission::Now);
        assert!(matches!(rate.admit(limits(100), 1, 0, 0, idle), Admission::Held(_)));
    }

    /// A topic of several sources splits its limits evenly over the active ones (0 and never
    /// told count as one), and a share is never 0, which would mean no limit.
    #[test]
    fn a_topics_limits_are_split_over_its_active_sources() {
        let topic = PublishRateLimits { messages_per_second: 1000, bytes_per_second: 3 };
        assert_eq!(topic.per_source(0), topic);
        assert_eq!(topic.per_source(1), topic);
        assert_eq!(topic.per_source(2), PublishRateLimits { messages_per_second: 500, bytes_per_second: 1 });
        assert_eq!(topic.per_source(4), PublishRateLimits { messages_per_second: 250, bytes_per_second: 1 });
        assert_eq!(PublishRateLimits::default().per_source(3), PublishRateLimits::default());
        // On the shard: one of two sources takes half a second's worth at once, not all of it.
        let shard = ShardPublishRate::new();
        shard.limits.set(limits(100));
        let (now, rate) = (crate::runtime::now(), RefCell::new(TopicRate::default()));
        assert_eq!(shard.admit(&rate, 2, 50, 0, now), Admission::Now);
        assert!(matches!(shard.admit(&rate, 2, 1, 0, now), Admission::Held(_)));
    }

    #[test]
    fn a_publish_larger_than_the_bucket_goes_when_it_is_full_and_the_debt_holds_back_the_next() {
        let now = crate::runtime::now();
        let mut rate = TopicRate::default();
        let bytes = PublishRateLimits { messages_per_second: 0, bytes_per_second: 1000 };
        // Debt of the hold and a second more, and 1000 wanted: 2 s past the hold, refused until
        // 2 s have passed.
        let hold_seconds = PUBLISH_HOLD_MAX.as_secs();
        assert_eq!(rate.admit(bytes, 1, 1000 * (hold_seconds + 2), 0, now), Admission::Now);
        let Admission::Refused { retry_after, limit } = rate.admit(bytes, 1, 1000, 0, now) else {
            panic!("not refused")
        };
        assert_eq!((retry_after, limit), (2 * SECOND, "PUBLISH_BYTES_PER_SECOND"));
        assert_eq!(rate.admit(bytes, 1, 1000, 0, now + 2 * SECOND), Admission::Held(PUBLISH_HOLD_MAX));
    }

    #[test]
    fn the_held_bytes_bound_refuses_what_would_wait_and_never_what_goes_now() {
        let now = crate::runtime::now();
        let mut rate = TopicRate::default();
        let full = PUBLISH_HELD_BYTES_SHARD_MAX;
        assert_eq!(rate.admit(limits(10), 10, 100, full, now), Admission::Now);
        let Admission::Refused { limit, .. } = rate.admit(limits(10), 1, 100, full, now) else {
            panic!("not refused")
        };
        assert_eq!(limit, "PUBLISH_HELD_BYTES_SHARD_MAX");
        let shard = ShardPublishRate::new();
        let held = shard.hold(300);
        assert_eq!(shard.held_bytes.get(), 300);
        drop(held);
        assert_eq!(shard.held_bytes.get(), 0);
    }

    #[test]
    fn no_limit_admits_everything_and_a_new_limit_starts_full() {
        let now = crate::runtime::now();
        let mut rate = TopicRate::default();
        for _ in 0..1000 {
            assert_eq!(rate.admit(PublishRateLimits::default(), 1000, 1 << 20, 0, now), Admission::Now);
        }
        assert_eq!(rate.admit(limits(5), 5, 0, 0, now), Admission::Now);
        assert!(matches!(rate.admit(limits(5), 5, 0, 0, now), Admission::Held(_)));
        assert_eq!(rate.admit(limits(50), 50, 0, 0, now), Admission::Now, "a changed limit starts full");
    }
}
