//! Publisher threads, shared by every workload: each with its own `Client` and so its own TCP
//! connections, keeps K publish requests of B messages in flight and records each request's
//! publish-ack latency, i.e. the time until the daemon says the batch is durable.
//!
//! Closed loop (the default) sends a request as soon as a slot is free, which measures peak
//! throughput. Open loop (`rate_per_sec`) sends requests at fixed intervals and measures each
//! latency from the request's *scheduled* send time: when the server (or this generator) falls
//! behind, the wait a real producer would have had counts in the latency instead of silently
//! thinning the load ("coordinated omission").
//!
//! With subscribers (`PublisherContext::track`), every payload starts with its publish start
//! time (the scheduled time, in open loop) so a subscriber can measure delivery latency, and the
//! publisher keeps the ids the server acknowledged, per topic, so that every delivery can be
//! checked against them and every acknowledged message that never arrived counted as lost.

use super::gate::StartGate;
use super::ids::IdSet;
use super::inflight::InflightSet;
use super::latency::{micros_between, new_histogram, stamp_ns};
use super::live::LiveStats;
use super::Failure;
use hdrhistogram::Histogram;
use ringpost_client::{block_on, Message};
use ringpost_wire::limits::{MESSAGE_BYTES_MAX, PUBLISH_BATCH_MESSAGES_MAX, PUBLISH_REQUEST_BYTES_MAX};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The daemon's default router address.
pub const SERVER_DEFAULT: &str = "127.0.0.1:7450";
pub const MESSAGES_DEFAULT: u64 = 200_000;
pub const SIZE_BYTES_DEFAULT: usize = 1024;
pub const PUBLISHERS_DEFAULT: usize = 4;
pub const BATCH_DEFAULT: usize = 100;
pub const INFLIGHT_DEFAULT: usize = 8;

pub const PUBLISHERS_MAX: usize = 256;
/// The protocol's own limit on messages per publish request.
pub const BATCH_MAX: usize = PUBLISH_BATCH_MESSAGES_MAX;
/// Well below the client's 4096 pending requests per connection, so the generator never
/// measures the client refusing work instead of the server.
pub const INFLIGHT_MAX: usize = 1024;
const _: () = assert!(INFLIGHT_MAX <= ringpost_client::connection::REQUESTS_PENDING_PER_CONNECTION_MAX);

/// The longest open-loop schedule accepted, about a year.
pub const RUN_SECONDS_MAX: f64 = 3.2e7;

/// Failed publish requests, over all publishers, after which every publisher stops sending: a
/// server that refuses everything would otherwise keep the run going for as long as the client
/// retries each request (several seconds each), and the figures are void anyway.
pub const FAILED_REQUESTS_BEFORE_ABORT: u64 = 64;

/// Bytes at the front of a tracked payload that hold its publish start time.
pub const STAMP_BYTES: usize = 8;

/// What the daemon promises when it answers a publish; printed with the results so that a
/// figure is never read as a page-cache number.
pub const DURABILITY: &str = "acknowledged once durable: O_DSYNC write or fdatasync (group commit)";

#[derive(Debug, Clone, PartialEq)]
pub struct PublishOptions {
    /// The router's address.
    pub server: String,
    /// An existing topic to publish to; without it a fresh topic is created and deleted after.
    pub topic: Option<String>,
    pub messages: u64,
    pub size_bytes: usize,
    pub publishers: usize,
    /// Messages per publish request.
    pub batch: usize,
    /// Requests in flight per publisher.
    pub inflight: usize,
    /// Open-loop offered load in messages per second over all publishers; `None` is closed loop.
    pub rate_per_sec: Option<f64>,
    /// Pin each publisher and subscriber thread to one core, round robin.
    pub pin: bool,
}

impl Default for PublishOptions {
    fn default() -> PublishOptions {
        PublishOptions {
            server: SERVER_DEFAULT.to_owned(),
            topic: None,
            messages: MESSAGES_DEFAULT,
            size_bytes: SIZE_BYTES_DEFAULT,
            publishers: PUBLISHERS_DEFAULT,
            batch: BATCH_DEFAULT,
            inflight: INFLIGHT_DEFAULT,
            rate_per_sec: None,
            pin: false,
        }
    }
}

impl PublishOptions {
    pub fn validate(&self) -> Result<(), Failure> {
        let within = |name: &str, value: usize, min: usize, max: usize| {
            if value < min || value > max {
                return Err(Failure::usage(format!(
                    "InvalidArgument: --{name} is {value}; it must be {min} to {max}"
                )));
            }
            Ok(())
        };
        if self.messages == 0 {
            return Err(Failure::usage("InvalidArgument: --messages must be at least 1"));
        }
        within("size", self.size_bytes, 1, MESSAGE_BYTES_MAX)?;
        within("publishers", self.publishers, 1, PUBLISHERS_MAX)?;
        within("batch", self.batch, 1, BATCH_MAX)?;
        within("inflight", self.inflight, 1, INFLIGHT_MAX)?;
        // The server counts payload bytes against the request limit; refuse here what it
        // would refuse on every request.
        if self.batch.saturating_mul(self.size_bytes) > PUBLISH_REQUEST_BYTES_MAX {
            return Err(Failure::usage(format!(
                "InvalidArgument: --batch {} of --size {} is {} bytes per request; the limit is {PUBLISH_REQUEST_BYTES_MAX}",
                self.batch,
                self.size_bytes,
                self.batch * self.size_bytes
            )));
        }
        if let Some(rate) = self.rate_per_sec {
            // The whole schedule must be expressible as a Duration, or computing a due time
            // would panic mid-run.
            let planned_seconds = self.messages as f64 / rate;
            if !(rate.is_finite() && rate > 0.0 && planned_seconds <= RUN_SECONDS_MAX) {
                return Err(Failure::usage(format!(
                    "InvalidArgument: --rate is {rate}; it must be above 0 and the run at most {RUN_SECONDS_MAX} s long"
                )));
            }
        }
        Ok(())
    }

    /// The messages publisher `publisher` sends: an even share, the remainder to the first ones.
    pub fn messages_for(&self, publisher: usize) -> u64 {
        let publishers = self.publishers as u64;
        self.messages / publishers + u64::from((publisher as u64) < self.messages % publishers)
    }
}

/// The fixed send times of one publisher under an open-loop rate.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub start: Instant,
    pub interval: Duration,
}

impl Schedule {
    /// Publishers interleave their requests evenly, so the offered load is smooth overall and
    /// not P requests at once every interval.
    pub fn new(options: &PublishOptions, rate_per_sec: f64, publisher: usize, start: Instant) -> Schedule {
        let requests_per_sec = rate_per_sec / options.batch as f64;
        let interval = Duration::from_secs_f64(options.publishers as f64 / requests_per_sec);
        let offset = interval.mul_f64(publisher as f64 / options.publishers as f64);
        Schedule { start: start + offset, interval }
    }

    pub fn due(&self, request: u64) -> Instant {
        self.start + self.interval.mul_f64(request as f64)
    }
}

/// The topic of a publisher's `request`-th request: publishers take turns over the topics, so
/// every topic gets an even share of requests and no two publishers march in step.
pub fn topic_of_request(publisher: usize, publishers: usize, request: u64, topics: usize) -> usize {
    ((request as u128 * publishers as u128 + publisher as u128) % topics as u128) as usize
}

/// The payload every message starts from: `size_bytes` of a readable filler pattern.
pub fn payload_template(size_bytes: usize) -> Vec<u8> {
    const FILLER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..size_bytes).map(|index| FILLER[index % FILLER.len()]).collect()
}

/// A deterministic payload: the template with the publisher and its sequence number written
/// over the front, so that a consumer can check loss and order by reading the data. Sizes
/// shorter than that header keep its beginning only.
pub fn payload(template: &[u8], publisher: usize, sequence: u64) -> Vec<u8> {
    let mut data = template.to_vec();
    write_payload_header(&mut data, publisher, sequence);
    data
}

/// A payload that starts with its publish start time ([`STAMP_BYTES`], little endian, see
/// [`stamp_ns`]) followed by the header of [`payload`]. `template` must hold the stamp.
pub fn stamped_payload(template: &[u8], publisher: usize, sequence: u64, stamp: u64) -> Vec<u8> {
    let mut data = template.to_vec();
    data[..STAMP_BYTES].copy_from_slice(&stamp.to_le_bytes());
    write_payload_header(&mut data[STAMP_BYTES..], publisher, sequence);
    data
}

/// Writes `p{publisher:03} s{sequence:010} ` over the front of `data`, cut at its end. By hand,
/// not with `write!`: the load generator builds every message, and formatting took 40% of the
/// publisher threads' time in W1 (perf), CPU that the daemon on the same 2 cores then lacked.
fn write_payload_header(data: &mut [u8], publisher: usize, sequence: u64) {
    // "p", 20 digits at most, " s", 20 digits at most, " ".
    let mut header = [0u8; 44];
    let mut length = 0;
    for (prefix, value, width) in [(&b"p"[..], publisher as u64, 3), (&b" s"[..], sequence, 10)] {
        header[length..length + prefix.len()].copy_from_slice(prefix);
        length += prefix.len();
        length += write_padded_decimal(&mut header[length..], value, width);
    }
    header[length] = b' ';
    length += 1;
    let take = length.min(data.len());
    data[..take].copy_from_slice(&header[..take]);
}

/// Writes `value` in decimal at the front of `out`, with leading zeros to at least `width`
/// digits (at most 20, which any u64 fits in); returns the digits written.
fn write_padded_decimal(out: &mut [u8], value: u64, width: usize) -> usize {
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let start = at.min(digits.len() - width.min(digits.len()));
    let count = digits.len() - start;
    out[..count].copy_from_slice(&digits[start..]);
    count
}

/// The publish start time written by [`stamped_payload`], if the payload is long enough.
pub fn read_stamp(data: &[u8]) -> Option<u64> {
    let bytes: [u8; STAMP_BYTES] = data.get(..STAMP_BYTES)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Pins the calling thread to core `index` modulo the cores there are; the error is a warning
/// for the report, since an unpinned run is still a run.
pub fn pin_thread(index: usize) -> Result<(), String> {
    let cores = affinity::get_core_num().max(1);
    let core = index % cores;
    affinity::set_thread_affinity([core])
        .map_err(|error| format!("could not pin a thread to core {core}: {error}"))
}

/// What every publisher thread shares.
pub struct PublisherContext<'a> {
    pub options: &'a PublishOptions,
    /// Requests go to these topics in turn (see [`topic_of_request`]).
    pub topics: &'a [String],
    /// The payload template, at least [`STAMP_BYTES`] long when `track` is set.
    pub template: &'a [u8],
    /// Stamp payloads with their publish start time and keep the acknowledged ids.
    pub track: bool,
    pub stop: &'a AtomicBool,
    /// Set once [`FAILED_REQUESTS_BEFORE_ABORT`] requests failed; publishers stop as on `stop`.
    pub abort: &'a AtomicBool,
    /// Failed requests over all publishers.
    pub failed_requests: &'a AtomicU64,
    /// Set by a thread that could not connect, so the others stand down after the barrier.
    pub setup_failed: &'a AtomicBool,
    /// Publishers (and subscribers) start together, once each has connected.
    pub start: &'a StartGate,
    /// One per publisher.
    pub live: &'a [LiveStats],
    /// Messages acknowledged per topic, added to as acknowledgements arrive; subscribers read
    /// it once every publisher is done to know how many deliveries to wait for.
    pub acknowledged_per_topic: &'a [AtomicU64],
    pub warnings: &'a Mutex<Vec<String>>,
}

/// What one publisher thread hands back when it is done.
pub struct PublisherOutcome {
    pub latency_us: Histogram<u64>,
    pub requests: u64,
    pub started: Instant,
    pub finished: Instant,
    pub send_lag_us_max: u64,
    pub first_error: Option<String>,
    /// Per topic, the ids acknowledged to this publisher (empty unless tracking).
    pub acknowledged_ids: Vec<IdSet>,
}

/// One finished request.
struct Completion {
    result: ringpost_client::Result<Vec<u64>>,
    /// When it was sent (closed loop) or scheduled to be sent (open loop).
    sent: Instant,
    messages: usize,
    topic: usize,
}

/// What one publisher has measured so far.
struct Tally {
    latency_us: Histogram<u64>,
    requests_settled: u64,
    first_error: Option<String>,
    acknowledged_ids: Vec<IdSet>,
}

impl Tally {
    /// Records finished requests; returns whether there were any.
    fn settle(
        &mut self,
        finished: &mut Vec<Completion>,
        context: &PublisherContext,
        stats: &LiveStats,
    ) -> bool {
        if finished.is_empty() {
            return false;
        }
        let now = Instant::now();
        let mut interval_latency_us = stats.interval_latency_us.lock().unwrap();
        for completion in finished.drain(..) {
            self.requests_settled += 1;
            let messages = completion.messages as u64;
            let failure = match completion.result {
                Ok(ids) if ids.len() == completion.messages => {
                    let latency = micros_between(completion.sent, now);
                    self.latency_us.saturating_record(latency);
                    interval_latency_us.saturating_record(latency);
                    if context.track {
                        let acknowledged = &mut self.acknowledged_ids[completion.topic];
                        for id in ids {
                            acknowledged.insert(id);
                        }
                        context.acknowledged_per_topic[completion.topic]
                            .fetch_add(messages, Ordering::Relaxed);
                    }
                    stats.messages.fetch_add(messages, Ordering::Relaxed);
                    continue;
                }
                Ok(ids) => format!("the server returned {} message ids for {messages} messages", ids.len()),
                Err(error) => Failure::from(error).message,
            };
            self.first_error.get_or_insert(failure);
            stats.messages_failed.fetch_add(messages, Ordering::Relaxed);
            if context.failed_requests.fetch_add(1, Ordering::Relaxed) + 1 >= FAILED_REQUESTS_BEFORE_ABORT {
                context.abort.store(true, Ordering::Relaxed);
            }
        }
        true
    }
}

/// Runs publisher `publisher` to the end of its share (or until `stop`). `Ok(None)` means it
/// stood down because another thread could not connect.
pub fn publisher_run(
    publisher: usize,
    context: &PublisherContext,
) -> Result<Option<PublisherOutcome>, Failure> {
    let options = context.options;
    if options.rate_per_sec.is_some() {
        // An open-loop publisher sleeps until each request is due, and Linux lets a sleeping
        // thread's timer fire up to its slack late: 50 us by default, which every request's
        // latency would count, since it runs from the scheduled time. Measured here with
        // 200 us sleeps: oversleep p50 77 us with the default slack, 27 us with 1 ns.
        if let Err(error) = nix::sys::prctl::set_timerslack(1) {
            context.warnings.lock().unwrap().push(format!("could not lower the timer slack: {error}"));
        }
    }
    if options.pin {
        if let Err(warning) = pin_thread(publisher) {
            context.warnings.lock().unwrap().push(warning);
        }
    }
    let connected = block_on(super::Publisher::connect(&options.server));
    if connected.is_err() {
        context.setup_failed.store(true, Ordering::Release);
    }
    context.start.arrive_and_wait();
    let client = connected?;
    if context.setup_failed.load(Ordering::Acquire) {
        return Ok(None);
    }
    let stats = &context.live[publisher];
    let count = options.messages_for(publisher);
    let started = Instant::now();
    let schedule = options.rate_per_sec.map(|rate| Schedule::new(options, rate, publisher, started));
    let topics = context.topics.len();
    let mut tally = Tally {
        latency_us: new_histogram(),
        requests_settled: 0,
        first_error: None,
        acknowledged_ids: if context.track { vec![IdSet::new(); topics] } else { Vec::new() },
    };
    let mut in_flight: InflightSet<'_, Completion> = InflightSet::new(options.inflight);
    let mut finished: Vec<Completion> = Vec::with_capacity(options.inflight);
    let mut sequence = 0u64;
    let mut requests = 0u64;
    let mut send_lag_us_max = 0u64;
    loop {
        // The first request goes alone: it looks up the topic's forwarder and connects to it,
        // and K requests racing through that would make K lookups and K connections.
        let slots_allowed = if tally.requests_settled > 0 { options.inflight } else { 1 };
        let stopped = context.stop.load(Ordering::Relaxed) || context.abort.load(Ordering::Relaxed);
        while !stopped && sequence < count && in_flight.len() < slots_allowed {
            let due = schedule.map(|schedule| schedule.due(requests));
            let now = Instant::now();
            if due.is_some_and(|due| due > now) {
                break;
            }
            // A message's publish starts before its batch is built (closed loop), or at the
            // request's due time (open loop), whatever delayed the send since.
            let publish_start = due.unwrap_or(now);
            let size = (count - sequence).min(options.batch as u64) as usize;
            let stamp = stamp_ns(publish_start);
            let batch: Vec<Message> = (0..size as u64)
                .map(|index| {
                    let data = if context.track {
                        stamped_payload(context.template, publisher, sequence + index, stamp)
                    } else {
                        payload(context.template, publisher, sequence + index)
                    };
                    Message::new(data)
                })
                .collect();
            // Closed loop: publish-ack latency starts once the batch is built, just before it is
            // written. Open loop: at the due time.
            let sent = match due {
                Some(due) => {
                    send_lag_us_max = send_lag_us_max.max(micros_between(due, now));
                    due
                }
                None => Instant::now(),
            };
            let topic_index = topic_of_request(publisher, options.publishers, requests, topics);
            sequence += size as u64;
            requests += 1;
            let client = &client;
            let topic = context.topics[topic_index].as_str();
            let request = async move {
                let result = client.publish(topic, batch).await;
                Completion { result, sent, messages: size, topic: topic_index }
            };
            if let Some(completion) = in_flight.start(request) {
                finished.push(completion);
            }
        }
        // Requests that failed in their first poll freed their slots at once: refill first.
        if tally.settle(&mut finished, context, stats) {
            continue;
        }
        let sending = !stopped && sequence < count;
        if in_flight.is_empty() && !sending {
            break;
        }
        // Sleep until a response arrives, or until the next open-loop request is due if a slot
        // is free for it.
        let deadline = match &schedule {
            Some(schedule) if sending && in_flight.len() < slots_allowed => Some(schedule.due(requests)),
            _ => None,
        };
        in_flight.wait(deadline);
        in_flight.poll_woken(&mut finished);
        // Settled before the next batches are built, so building them does not count in these
        // requests' latency.
        tally.settle(&mut finished, context, stats);
    }
    Ok(Some(PublisherOutcome {
        latency_us: tally.latency_us,
        requests,
        started,
        finished: Instant::now(),
        send_lag_us_max,
        first_error: tally.first_error,
        acknowledged_ids: tally.acknowledged_ids,
    }))
}

/// A topic name no other run uses.
pub fn fresh_topic_name() -> String {
    format!("bench-{}", super::embedded::unique_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> PublishOptions {
        PublishOptions::default()
    }

    #[test]
    fn payloads_are_deterministic_and_sized() {
        let template = payload_template(64);
        let data = payload(&template, 3, 42);
        assert_eq!(data.len(), 64);
        assert!(data.starts_with(b"p003 s0000000042 "));
        assert_eq!(data, payload(&template, 3, 42));
        assert_ne!(data, payload(&template, 3, 43));
        assert_eq!(payload(&payload_template(4), 1, 1), b"p001");
        assert_eq!(payload(&payload_template(1), 1, 1).len(), 1);
    }

    #[test]
    fn payload_headers_read_as_their_format_would() {
        for (publisher, sequence) in
            [(0, 0), (3, 42), (999, 9_999_999_999), (1000, 10_000_000_000), (7, u64::MAX)]
        {
            let expected = format!("p{publisher:03} s{sequence:010} ");
            let template = payload_template(64);
            let data = payload(&template, publisher, sequence);
            assert_eq!(&data[..expected.len()], expected.as_bytes());
            assert_eq!(&data[expected.len()..], &template[expected.len()..], "the rest is the template");
            for cut in [0, 1, 5, expected.len() - 1] {
                let short = payload(&payload_template(cut), publisher, sequence);
                assert_eq!(short, &expected.as_bytes()[..cut], "cut to {cut} bytes");
            }
        }
    }

    #[test]
    fn stamped_payloads_carry_their_start_time() {
        let template = payload_template(64);
        let data = stamped_payload(&template, 3, 42, 123_456_789);
        assert_eq!(data.len(), 64);
        assert_eq!(read_stamp(&data), Some(123_456_789));
        assert!(data[STAMP_BYTES..].starts_with(b"p003 s0000000042 "));
        assert_eq!(stamped_payload(&payload_template(STAMP_BYTES), 1, 1, 7).len(), STAMP_BYTES);
        assert_eq!(read_stamp(b"short"), None);
    }

    #[test]
    fn requests_spread_evenly_over_topics() {
        let mut per_topic = [0u32; 10];
        for publisher in 0..4 {
            for request in 0..25 {
                per_topic[topic_of_request(publisher, 4, request, 10)] += 1;
            }
        }
        assert_eq!(per_topic, [10; 10]);
        assert_eq!(topic_of_request(3, 4, u64::MAX, 1), 0);
    }

    #[test]
    fn messages_are_shared_out_exactly() {
        let mut options = options();
        options.messages = 10;
        options.publishers = 4;
        let shares: Vec<u64> = (0..4).map(|publisher| options.messages_for(publisher)).collect();
        assert_eq!(shares, vec![3, 3, 2, 2]);
    }

    #[test]
    fn validation_refuses_impossible_runs() {
        assert!(options().validate().is_ok());
        let refused = |change: fn(&mut PublishOptions)| {
            let mut options = options();
            change(&mut options);
            options.validate().unwrap_err().exit_code
        };
        assert_eq!(refused(|o| o.batch = 0), super::super::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.batch = BATCH_MAX + 1), super::super::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.inflight = 0), super::super::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.messages = 0), super::super::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.size_bytes = 0), super::super::EXIT_CODE_USAGE);
        assert_eq!(
            refused(|o| {
                o.batch = 1000;
                o.size_bytes = 1 << 20;
            }),
            super::super::EXIT_CODE_USAGE
        );
        assert_eq!(refused(|o| o.rate_per_sec = Some(0.0)), super::super::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.rate_per_sec = Some(1e-300)), super::super::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.rate_per_sec = Some(f64::NAN)), super::super::EXIT_CODE_USAGE);
    }

    #[test]
    fn open_loop_schedule_interleaves_publishers() {
        let mut options = options();
        options.rate_per_sec = Some(10_000.0);
        // 10,000 msg/s in batches of 100 is 100 requests/s overall, 25/s per publisher.
        let start = Instant::now();
        let first = Schedule::new(&options, 10_000.0, 0, start);
        let second = Schedule::new(&options, 10_000.0, 1, start);
        assert_eq!(first.interval, Duration::from_millis(40));
        assert_eq!(first.due(0), start);
        assert_eq!(second.due(0) - start, Duration::from_millis(10));
        assert_eq!(first.due(25) - start, Duration::from_secs(1));
    }
}
