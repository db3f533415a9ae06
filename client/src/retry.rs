//! Retries of data-plane requests: which failures are worth another attempt, and exponential
//! backoff with jitter between attempts, with Google Cloud Pub/Sub's client settings.
//!
//! Pub/Sub's generated clients retry publish with an initial delay of 100 ms multiplied by 4 per
//! attempt, and pull and acknowledge with the same initial delay multiplied by 1.3, both capped
//! at 60 s. Like gax, each wait is drawn uniformly from `(0, ceiling]` ("full jitter"), so many
//! clients that failed together do not come back together.

use crate::Error;
use ringpost_wire::ErrorCode;
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

pub const RETRY_DELAY_INITIAL: Duration = Duration::from_millis(100);
pub const RETRY_DELAY_MULTIPLIER_PUBLISH: f64 = 4.0;
/// For pull, acknowledge and modify-ack-deadline.
pub const RETRY_DELAY_MULTIPLIER: f64 = 1.3;
pub const RETRY_DELAY_MAX: Duration = Duration::from_secs(60);
/// Attempts in all, the first included, unless `RETRY_FOR_MIN` has not passed yet.
pub const RETRY_ATTEMPTS_MAX: usize = 5;
/// How long retries go on whatever their count: a cluster replaces a lost topic leader within
/// 10 s, and five attempts with full jitter may all fall within its first second. (Google's
/// clients bound retries by time alone.)
pub const RETRY_FOR_MIN: Duration = Duration::from_secs(10);

const _: () = assert!(RETRY_DELAY_INITIAL.as_nanos() <= RETRY_DELAY_MAX.as_nanos());
const _: () = assert!(RETRY_ATTEMPTS_MAX >= 1);

/// How a kind of request is retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrySettings {
    pub delay_initial: Duration,
    pub delay_multiplier: f64,
    pub delay_max: Duration,
    /// Attempts in all, the first included: no more once `retry_for_min` has passed.
    pub attempts_max: usize,
    /// Since the first attempt: until then a retryable failure is retried whatever the count
    /// (within the request's deadline).
    pub retry_for_min: Duration,
}

impl RetrySettings {
    pub const PUBLISH: RetrySettings = RetrySettings {
        delay_initial: RETRY_DELAY_INITIAL,
        delay_multiplier: RETRY_DELAY_MULTIPLIER_PUBLISH,
        delay_max: RETRY_DELAY_MAX,
        attempts_max: RETRY_ATTEMPTS_MAX,
        retry_for_min: RETRY_FOR_MIN,
    };
    pub const SUBSCRIBE: RetrySettings = RetrySettings {
        delay_initial: RETRY_DELAY_INITIAL,
        delay_multiplier: RETRY_DELAY_MULTIPLIER,
        delay_max: RETRY_DELAY_MAX,
        attempts_max: RETRY_ATTEMPTS_MAX,
        retry_for_min: RETRY_FOR_MIN,
    };
    /// One attempt: every failure is returned at once.
    pub const NONE: RetrySettings =
        RetrySettings { attempts_max: 1, retry_for_min: Duration::ZERO, ..RetrySettings::PUBLISH };
}

/// Whether a failed attempt is worth another: the connection failed (the request may or may not
/// have been served; publish is at-least-once), or the server said `Unavailable` or
/// `ResourceExhausted`. Everything else (`NotFound`, `InvalidArgument`, `Unauthenticated`,
/// `PermissionDenied`, ...) would fail again.
/// The client's own full queue is refused before this is asked: retrying it would only hide
/// the backpressure.
pub fn is_retryable(error: &Error) -> bool {
    match error {
        Error::Connect { .. } | Error::Io(_) | Error::Closed(_) => true,
        Error::Status(status) => matches!(status.code, ErrorCode::Unavailable | ErrorCode::ResourceExhausted),
        // The request's whole deadline has passed: no attempt is left to make. A certificate
        // that did not verify would not verify again.
        Error::Protocol(_) | Error::DeadlineExceeded(_) | Error::Tls(_) => false,
    }
}

/// Whether the failure was the connection's, so the route is looked up again before retrying.
pub fn is_connection_failure(error: &Error) -> bool {
    matches!(error, Error::Connect { .. } | Error::Io(_) | Error::Closed(_))
}

/// Whether the route should be looked up again before retrying: the connection failed, or the
/// forwarder no longer serves what was asked (`NotOwner`) or could not (`Unavailable`: a
/// replicated topic's leader that was deposed or cannot reach its replicas).
pub fn needs_new_route(error: &Error) -> bool {
    is_connection_failure(error)
        || matches!(error, Error::Status(status) if matches!(status.code, ErrorCode::NotOwner | ErrorCode::Unavailable))
}

/// The waits between the attempts of one request.
#[derive(Debug, Clone)]
pub struct Backoff {
    settings: RetrySettings,
    ceiling: Duration,
}

impl Backoff {
    pub fn new(settings: RetrySettings) -> Backoff {
        Backoff { settings, ceiling: settings.delay_initial.min(settings.delay_max) }
    }

    /// The wait before the next attempt: uniform in `(0, ceiling]`; the ceiling then grows by
    /// the multiplier up to `delay_max`.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling_ns = self.ceiling.as_nanos().clamp(1, u64::MAX as u128) as u64;
        let delay = Duration::from_nanos(1 + random_below(ceiling_ns));
        self.ceiling = self.ceiling.mul_f64(self.settings.delay_multiplier).min(self.settings.delay_max);
        delay
    }
}

/// A uniform number in `0..bound` (0 when `bound` is 0), from a per-thread xorshift generator
/// seeded by the standard library's random hasher keys: jitter needs spread, not secrecy.
pub(crate) fn random_below(bound: u64) -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(RandomState::new().build_hasher().finish() | 1);
    }
    if bound == 0 {
        return 0;
    }
    let next = STATE.with(|state| {
        // xorshift64*
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    });
    // Multiply-shift maps the 64 random bits onto 0..bound without a modulo bias worth naming.
    ((next as u128 * bound as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringpost_wire::Status;

    #[test]
    fn publish_backoff_grows_by_four_up_to_the_cap() {
        let mut backoff = Backoff::new(RetrySettings::PUBLISH);
        let mut ceiling = RETRY_DELAY_INITIAL;
        for _ in 0..12 {
            let delay = backoff.next_delay();
            assert!(delay > Duration::ZERO && delay <= ceiling, "{delay:?} above {ceiling:?}");
            ceiling = ceiling.mul_f64(4.0).min(RETRY_DELAY_MAX);
        }
        assert_eq!(backoff.ceiling, RETRY_DELAY_MAX);
    }

    #[test]
    fn subscribe_backoff_grows_by_one_point_three() {
        let mut backoff = Backoff::new(RetrySettings::SUBSCRIBE);
        backoff.next_delay();
        assert_eq!(backoff.ceiling, Duration::from_millis(130));
        backoff.next_delay();
        assert_eq!(backoff.ceiling, Duration::from_millis(169));
    }

    #[test]
    fn jitter_spreads_over_the_whole_range() {
        let draws: Vec<u64> = (0..2000).map(|_| random_below(1000)).collect();
        assert!(draws.iter().all(|&draw| draw < 1000));
        let low = draws.iter().filter(|&&draw| draw < 500).count();
        assert!((800..1200).contains(&low), "{low} of 2000 below the middle");
        assert_eq!(random_below(0), 0);
        assert_eq!(random_below(1), 0);
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let io = || Error::Io(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        assert!(is_retryable(&io()) && is_connection_failure(&io()));
        assert!(is_retryable(&Error::Closed("127.0.0.1:1".into())));
        assert!(is_retryable(&Error::Status(Status::unavailable("down"))));
        let exhausted = Error::Status(Status::resource_exhausted("full"));
        assert!(is_retryable(&exhausted) && !is_connection_failure(&exhausted));
        assert!(!is_retryable(&Error::Status(Status::invalid_argument("bad"))));
        assert!(!is_retryable(&Error::Status(Status::new(ErrorCode::NotFound, "gone"))));
        assert!(!is_retryable(&Error::Protocol("garbage".into())));
    }
}
