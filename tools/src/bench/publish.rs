//! The publish workload (W1): publisher threads, each with its own `Client` and so its own TCP
//! connections, keep K publish requests of B messages in flight and record each request's
//! publish-ack latency, i.e. the time until the daemon says the batch is durable.
//!
//! Closed loop (the default) sends a request as soon as a slot is free, which measures peak
//! throughput. Open loop (`rate_per_sec`) sends requests at fixed intervals and measures each
//! latency from the request's *scheduled* send time: when the server (or this generator) falls
//! behind, the wait a real producer would have had counts in the latency instead of silently
//! thinning the load ("coordinated omission").

use super::format::{json_number, thousands};
use super::inflight::InflightSet;
use super::Failure;
use crate::json;
use hdrhistogram::Histogram;
use ringpost_client::{block_on, Client, ErrorCode, Message};
use ringpost_wire::limits::{MESSAGE_BYTES_MAX, PUBLISH_BATCH_MESSAGES_MAX, PUBLISH_REQUEST_BYTES_MAX};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

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

/// Latencies above a minute are recorded as a minute; a run like that is broken anyway.
pub const LATENCY_US_MAX: u64 = 60_000_000;
const LATENCY_SIGNIFICANT_FIGURES: u8 = 3;
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// The longest open-loop schedule accepted, about a year.
pub const RUN_SECONDS_MAX: f64 = 3.2e7;

/// What the daemon promises when it answers a publish; printed with the results so that a
/// figure is never read as a page-cache number.
pub const DURABILITY: &str = "acknowledged after fdatasync (group commit)";

/// The quantiles reported, with their names in the table and in the JSON.
const QUANTILES: [(&str, &str, f64); 4] =
    [("p50", "p50", 0.50), ("p90", "p90", 0.90), ("p99", "p99", 0.99), ("p99.9", "p999", 0.999)];

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

/// One progress line's figures, for the interval since the previous line.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub elapsed_seconds: f64,
    pub messages_per_sec: f64,
    pub mb_per_sec: f64,
    /// `None` when no request completed in the interval.
    pub latency_us_p99: Option<u64>,
    /// Messages failed since the start.
    pub messages_failed: u64,
}

impl Progress {
    /// `[  3.0s] 245,112 msg/s  251.0 MB/s  p99 1,234 us  errors 0`
    pub fn line(&self) -> String {
        let p99 = self.latency_us_p99.map(thousands).unwrap_or_else(|| "-".to_owned());
        format!(
            "[{:5.1}s] {} msg/s  {:.1} MB/s  p99 {p99} us  errors {}",
            self.elapsed_seconds,
            thousands(self.messages_per_sec.round() as u64),
            self.mb_per_sec,
            thousands(self.messages_failed)
        )
    }
}

/// The outcome of a publish run.
#[derive(Debug, Clone)]
pub struct PublishReport {
    pub topic: String,
    pub messages_acknowledged: u64,
    pub messages_failed: u64,
    pub requests: u64,
    /// From the first request sent to the last response received.
    pub seconds: f64,
    /// Publish-ack latency per successful request.
    pub latency_us: Histogram<u64>,
    /// Open loop only: how late the generator itself sent a request after its scheduled time,
    /// at worst. Large values mean the generator could not keep up with the rate (the latency
    /// figures still count that wait).
    pub send_lag_us_max: u64,
    pub first_error: Option<String>,
    /// Problems after the measurement, such as a fresh topic that could not be deleted.
    pub warnings: Vec<String>,
}

impl PublishReport {
    /// Messages attempted: acknowledged plus failed.
    pub fn messages(&self) -> u64 {
        self.messages_acknowledged + self.messages_failed
    }

    pub fn messages_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.messages_acknowledged as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Acknowledged payload bytes per second, in decimal megabytes (10^6 bytes).
    pub fn mb_per_sec(&self, size_bytes: usize) -> f64 {
        self.messages_per_sec() * size_bytes as f64 / 1e6
    }

    fn latency_at(&self, quantile: f64) -> u64 {
        if self.latency_us.is_empty() {
            0
        } else {
            self.latency_us.value_at_quantile(quantile)
        }
    }

    /// The results table for stdout.
    pub fn table(&self, options: &PublishOptions) -> String {
        let mut rows: Vec<(String, String)> = vec![
            ("messages".into(), thousands(self.messages())),
            ("requests".into(), thousands(self.requests)),
            ("seconds".into(), format!("{:.3}", self.seconds)),
            ("msgs/s".into(), thousands(self.messages_per_sec().round() as u64)),
            ("MB/s".into(), format!("{:.1}", self.mb_per_sec(options.size_bytes))),
        ];
        for (name, _, quantile) in QUANTILES {
            rows.push((format!("latency {name} us"), thousands(self.latency_at(quantile))));
        }
        rows.push(("latency max us".into(), thousands(self.latency_us.max())));
        if options.rate_per_sec.is_some() {
            rows.push(("send lag max us".into(), thousands(self.send_lag_us_max)));
        }
        rows.push(("errors".into(), thousands(self.messages_failed)));
        let loop_kind = match options.rate_per_sec {
            Some(rate) => format!(
                "open loop at {} msg/s offered; latency counts from each request's scheduled send time",
                thousands(rate.round() as u64)
            ),
            None => "closed loop".to_owned(),
        };
        let mut out = format!(
            "publish to {}: {} messages of {} bytes, {} publishers, batch {}, {} requests in flight each, {loop_kind}\n",
            self.topic,
            thousands(options.messages),
            thousands(options.size_bytes as u64),
            options.publishers,
            options.batch,
            options.inflight,
        );
        let value_width = rows.iter().map(|(_, value)| value.len()).max().unwrap_or(0);
        for (name, value) in rows {
            out.push_str(&format!("  {name:<18}{value:>value_width$}\n"));
        }
        let origin = if options.rate_per_sec.is_some() { "its scheduled send time" } else { "its send" };
        out.push_str(&format!(
            "  publish-ack latency is per request, from {origin} to the durable acknowledgement\n"
        ));
        out.push_str(&format!("  durability: {DURABILITY}\n"));
        out
    }

    /// `{"workload":"publish","messages":N,...,"publish_ack_us":{...},"errors":E}`
    pub fn json(&self, options: &PublishOptions) -> String {
        let mut latency: Vec<(&str, String)> = QUANTILES
            .iter()
            .map(|(_, key, quantile)| (*key, self.latency_at(*quantile).to_string()))
            .collect();
        latency.push(("max", self.latency_us.max().to_string()));
        json::object(&[
            ("workload", json::string("publish")),
            ("messages", self.messages().to_string()),
            ("size", options.size_bytes.to_string()),
            ("publishers", options.publishers.to_string()),
            ("batch", options.batch.to_string()),
            ("inflight", options.inflight.to_string()),
            ("seconds", json_number(self.seconds, 3)),
            ("msgs_per_sec", json_number(self.messages_per_sec(), 1)),
            ("mb_per_sec", json_number(self.mb_per_sec(options.size_bytes), 3)),
            ("publish_ack_us", json::object(&latency)),
            ("errors", self.messages_failed.to_string()),
        ])
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_FIGURES)
        .expect("the latency histogram bounds are valid")
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
    // Writing into a slice stops at its end; a truncated header is fine for tiny sizes.
    let _ = write!(&mut data[..], "p{publisher:03} s{sequence:010} ");
    data
}

/// Per-publisher figures the progress reporter reads while the run goes on.
struct LiveStats {
    messages_acknowledged: AtomicU64,
    messages_failed: AtomicU64,
    /// Latencies since the last progress line; the reporter drains it every interval.
    interval_latency_us: Mutex<Histogram<u64>>,
}

impl LiveStats {
    fn new() -> LiveStats {
        LiveStats {
            messages_acknowledged: AtomicU64::new(0),
            messages_failed: AtomicU64::new(0),
            interval_latency_us: Mutex::new(new_histogram()),
        }
    }
}

/// What one publisher thread hands back when it is done.
struct PublisherOutcome {
    latency_us: Histogram<u64>,
    requests: u64,
    started: Instant,
    finished: Instant,
    send_lag_us_max: u64,
    first_error: Option<String>,
}

/// What every publisher thread shares.
struct Shared<'a> {
    options: &'a PublishOptions,
    topic: &'a str,
    template: &'a [u8],
    stop: &'a AtomicBool,
    /// Set by a publisher that could not connect, so the others stand down after the barrier.
    setup_failed: AtomicBool,
    /// Publishers start together, once each has connected.
    start: Barrier,
    /// Publishers not yet done; the reporter stops when it reaches zero.
    running: AtomicUsize,
    stats: Vec<LiveStats>,
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

/// One finished request.
struct Completion {
    result: ringpost_client::Result<usize>,
    /// When it was sent (closed loop) or scheduled to be sent (open loop).
    sent: Instant,
    messages: usize,
}

/// What one publisher has measured so far.
struct Tally {
    latency_us: Histogram<u64>,
    requests_settled: u64,
    first_error: Option<String>,
}

impl Tally {
    /// Records finished requests; returns whether there were any.
    fn settle(&mut self, finished: &mut Vec<Completion>, stats: &LiveStats) -> bool {
        if finished.is_empty() {
            return false;
        }
        let now = Instant::now();
        let mut interval_latency_us = stats.interval_latency_us.lock().unwrap();
        for completion in finished.drain(..) {
            self.requests_settled += 1;
            let messages = completion.messages as u64;
            let failure = match completion.result {
                Ok(ids) if ids == completion.messages => {
                    let latency = (now - completion.sent).as_micros() as u64;
                    self.latency_us.saturating_record(latency);
                    interval_latency_us.saturating_record(latency);
                    stats.messages_acknowledged.fetch_add(messages, Ordering::Relaxed);
                    continue;
                }
                Ok(ids) => format!("the server returned {ids} message ids for {messages} messages"),
                Err(error) => Failure::from(error).message,
            };
            self.first_error.get_or_insert(failure);
            stats.messages_failed.fetch_add(messages, Ordering::Relaxed);
        }
        true
    }
}

fn publisher_run(publisher: usize, shared: &Shared) -> Result<Option<PublisherOutcome>, Failure> {
    let options = shared.options;
    let connected = block_on(Client::connect(&options.server));
    if connected.is_err() {
        shared.setup_failed.store(true, Ordering::Release);
    }
    shared.start.wait();
    let client = connected?;
    if shared.setup_failed.load(Ordering::Acquire) {
        return Ok(None);
    }
    let stats = &shared.stats[publisher];
    let count = options.messages_for(publisher);
    let started = Instant::now();
    let schedule = options.rate_per_sec.map(|rate| Schedule::new(options, rate, publisher, started));
    let mut tally = Tally { latency_us: new_histogram(), requests_settled: 0, first_error: None };
    let mut in_flight: InflightSet<'_, Completion> = InflightSet::new(options.inflight);
    let mut finished: Vec<Completion> = Vec::with_capacity(options.inflight);
    let mut sequence = 0u64;
    let mut requests = 0u64;
    let mut send_lag_us_max = 0u64;
    loop {
        // The first request goes alone: it looks up the topic's forwarder and connects to it,
        // and K requests racing through that would make K lookups and K connections.
        let slots_allowed = if tally.requests_settled > 0 { options.inflight } else { 1 };
        let stopped = shared.stop.load(Ordering::Relaxed);
        while !stopped && sequence < count && in_flight.len() < slots_allowed {
            let due = schedule.map(|schedule| schedule.due(requests));
            if due.is_some_and(|due| due > Instant::now()) {
                break;
            }
            let size = (count - sequence).min(options.batch as u64) as usize;
            let batch: Vec<Message> = (0..size as u64)
                .map(|index| Message::new(payload(shared.template, publisher, sequence + index)))
                .collect();
            // Closed loop: latency starts once the batch is built, just before it is written.
            // Open loop: at the due time, whatever delayed the send since.
            let now = Instant::now();
            let sent = match due {
                Some(due) => {
                    send_lag_us_max = send_lag_us_max.max((now - due).as_micros() as u64);
                    due
                }
                None => now,
            };
            sequence += size as u64;
            requests += 1;
            let client = &client;
            let topic = shared.topic;
            let request = async move {
                let result = client.publish(topic, batch).await.map(|ids| ids.len());
                Completion { result, sent, messages: size }
            };
            if let Some(completion) = in_flight.start(request) {
                finished.push(completion);
            }
        }
        // Requests that failed in their first poll freed their slots at once: refill first.
        if tally.settle(&mut finished, stats) {
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
        tally.settle(&mut finished, stats);
    }
    Ok(Some(PublisherOutcome {
        latency_us: tally.latency_us,
        requests,
        started,
        finished: Instant::now(),
        send_lag_us_max,
        first_error: tally.first_error,
    }))
}

/// A topic name no other run uses.
pub fn fresh_topic_name() -> String {
    format!("bench-{}", super::embedded::unique_suffix())
}

/// Runs the workload. `stop` ends it early (after the requests in flight finish); `progress`
/// is called once per [`PROGRESS_INTERVAL`].
pub fn run(
    options: &PublishOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PublishReport, Failure> {
    options.validate()?;
    let setup = block_on(Client::connect(&options.server))?;
    let (topic, created) = match &options.topic {
        Some(name) => {
            block_on(setup.get_topic(name)).map_err(|error| match error {
                ringpost_client::Error::Status(status) if status.code == ErrorCode::NotFound => {
                    Failure::runtime(format!(
                        "NotFound: topic '{name}' does not exist; create it, or leave out --topic to publish to a fresh one"
                    ))
                }
                other => Failure::from(other),
            })?;
            (name.clone(), false)
        }
        None => {
            let name = fresh_topic_name();
            block_on(setup.create_topic(&name))?;
            (name, true)
        }
    };
    let template = payload_template(options.size_bytes);
    let shared = Shared {
        options,
        topic: &topic,
        template: &template,
        stop,
        setup_failed: AtomicBool::new(false),
        start: Barrier::new(options.publishers + 1),
        running: AtomicUsize::new(options.publishers),
        stats: (0..options.publishers).map(|_| LiveStats::new()).collect(),
    };
    let reporter = std::thread::current();
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..options.publishers)
            .map(|publisher| {
                let shared = &shared;
                let reporter = reporter.clone();
                std::thread::Builder::new()
                    .name(format!("publisher-{publisher}"))
                    .spawn_scoped(scope, move || {
                        let outcome = publisher_run(publisher, shared);
                        shared.running.fetch_sub(1, Ordering::AcqRel);
                        reporter.unpark();
                        outcome
                    })
                    .expect("spawning a publisher thread")
            })
            .collect();
        shared.start.wait();
        report_progress(&shared, options.size_bytes, progress);
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| Err(Failure::runtime("a publisher thread panicked")))
            })
            .collect::<Vec<_>>()
    });
    let mut report = PublishReport {
        topic: topic.clone(),
        messages_acknowledged: shared
            .stats
            .iter()
            .map(|s| s.messages_acknowledged.load(Ordering::Relaxed))
            .sum(),
        messages_failed: shared.stats.iter().map(|s| s.messages_failed.load(Ordering::Relaxed)).sum(),
        requests: 0,
        seconds: 0.0,
        latency_us: new_histogram(),
        send_lag_us_max: 0,
        first_error: None,
        warnings: Vec::new(),
    };
    let mut first_started: Option<Instant> = None;
    let mut last_finished: Option<Instant> = None;
    let mut failure = None;
    for outcome in outcomes {
        match outcome {
            Ok(Some(outcome)) => {
                report.latency_us.add(&outcome.latency_us).expect("histograms with equal bounds merge");
                report.requests += outcome.requests;
                report.send_lag_us_max = report.send_lag_us_max.max(outcome.send_lag_us_max);
                if report.first_error.is_none() {
                    report.first_error = outcome.first_error;
                }
                first_started = Some(first_started.map_or(outcome.started, |t| t.min(outcome.started)));
                last_finished = Some(last_finished.map_or(outcome.finished, |t| t.max(outcome.finished)));
            }
            Ok(None) => {}
            Err(error) => {
                failure.get_or_insert(error);
            }
        }
    }
    if let (Some(started), Some(finished)) = (first_started, last_finished) {
        report.seconds = (finished - started).as_secs_f64();
    }
    // A fresh topic is ours: delete it so that repeated runs against a long-lived daemon do not
    // pile up stored messages.
    if created {
        if let Err(error) = block_on(setup.delete_topic(&topic)) {
            report.warnings.push(format!("could not delete the benchmark topic {topic}: {error}"));
        }
    }
    match failure {
        Some(failure) => Err(failure),
        None => Ok(report),
    }
}

/// Calls `progress` every interval until every publisher is done.
fn report_progress(shared: &Shared, size_bytes: usize, progress: &mut dyn FnMut(&Progress)) {
    let started = Instant::now();
    let mut last_tick = started;
    let mut next_tick = started + PROGRESS_INTERVAL;
    let mut last_acknowledged = 0u64;
    let mut interval_latency_us = new_histogram();
    while shared.running.load(Ordering::Acquire) > 0 {
        let now = Instant::now();
        if now < next_tick {
            // Publishers unpark this thread when they finish, so the run does not linger.
            std::thread::park_timeout(next_tick - now);
            continue;
        }
        interval_latency_us.reset();
        for stats in &shared.stats {
            let mut latency = stats.interval_latency_us.lock().unwrap();
            interval_latency_us.add(&*latency).expect("histograms with equal bounds merge");
            latency.reset();
        }
        let acknowledged: u64 =
            shared.stats.iter().map(|s| s.messages_acknowledged.load(Ordering::Relaxed)).sum();
        let failed: u64 = shared.stats.iter().map(|s| s.messages_failed.load(Ordering::Relaxed)).sum();
        let seconds = (now - last_tick).as_secs_f64();
        let messages_per_sec = (acknowledged - last_acknowledged) as f64 / seconds;
        progress(&Progress {
            elapsed_seconds: (now - started).as_secs_f64(),
            messages_per_sec,
            mb_per_sec: messages_per_sec * size_bytes as f64 / 1e6,
            latency_us_p99: (!interval_latency_us.is_empty())
                .then(|| interval_latency_us.value_at_quantile(0.99)),
            messages_failed: failed,
        });
        last_tick = now;
        last_acknowledged = acknowledged;
        // After a stall (a suspended process), skip the missed ticks rather than print a burst.
        while next_tick <= now {
            next_tick += PROGRESS_INTERVAL;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> PublishOptions {
        PublishOptions {
            server: "127.0.0.1:7450".into(),
            topic: None,
            messages: MESSAGES_DEFAULT,
            size_bytes: SIZE_BYTES_DEFAULT,
            publishers: PUBLISHERS_DEFAULT,
            batch: BATCH_DEFAULT,
            inflight: INFLIGHT_DEFAULT,
            rate_per_sec: None,
        }
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

    #[test]
    fn progress_line_and_json_shape() {
        let line = Progress {
            elapsed_seconds: 3.0,
            messages_per_sec: 245_112.0,
            mb_per_sec: 251.0,
            latency_us_p99: Some(1234),
            messages_failed: 0,
        }
        .line();
        assert_eq!(line, "[  3.0s] 245,112 msg/s  251.0 MB/s  p99 1,234 us  errors 0");
        let mut latency_us = new_histogram();
        latency_us.record(1000).unwrap();
        let report = PublishReport {
            topic: "bench".into(),
            messages_acknowledged: 200,
            messages_failed: 0,
            requests: 2,
            seconds: 2.0,
            latency_us,
            send_lag_us_max: 0,
            first_error: None,
            warnings: Vec::new(),
        };
        assert_eq!(
            report.json(&options()),
            concat!(
                "{\"workload\":\"publish\",\"messages\":200,\"size\":1024,\"publishers\":4,\"batch\":100,",
                "\"inflight\":8,\"seconds\":2.000,\"msgs_per_sec\":100.0,\"mb_per_sec\":0.102,",
                "\"publish_ack_us\":{\"p50\":1000,\"p90\":1000,\"p99\":1000,\"p999\":1000,\"max\":1000},",
                "\"errors\":0}"
            )
        );
        assert!(report.table(&options()).contains(DURABILITY));
    }
}
